/* Token dataset reader, windowing, train/validation split and the sample order. */
#define _POSIX_C_SOURCE 200809L

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/check.h"
#include "train/data.h"
#include "util/error.h"

/* Writes /tokens = values (as type `t`, in chunks of `chunk` tokens through deflate when
 * chunk > 0) with attribute vocab_size (if vocab > 0). */
static void write_tokens_as(const char *path, const uint32_t *values, hsize_t n, hid_t t, int64_t vocab, hsize_t chunk) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t sp = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunk > 0) H5Pset_chunk(dcpl, 1, &chunk), H5Pset_deflate(dcpl, 1);
  hid_t d = H5Dcreate2(f, "/tokens", t, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  if (vocab > 0) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "vocab_size", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &vocab);
    H5Aclose(a);
    /* As mcdata writes it: a variable-length UTF-8 string. */
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    H5Tset_cset(st, H5T_CSET_UTF8);
    const char *name = "bytes";
    a = H5Acreate2(d, "tokenizer", st, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, &name);
    H5Aclose(a), H5Tclose(st), H5Sclose(as);
  }
  H5Dclose(d), H5Sclose(sp), H5Fclose(f);
}

static void write_tokens(const char *path, const uint32_t *values, hsize_t n, hid_t t, int64_t vocab) {
  write_tokens_as(path, values, n, t, vocab, 0);
}

/* The same tokens stored five ways read back the same windows: contiguous little-endian uint16
 * and uint32 (read with pread outside HDF5), big-endian uint16, and chunked + deflate uint16
 * and uint32 (read through HDF5). */
static void test_storage_forms(const char *dir) {
  enum { N = 4099, T = 64 };
  uint32_t *v = malloc(sizeof *v * N);
  for (int i = 0; i < N; i++) v[i] = (uint32_t)((i * 2654435761u) % 65521u);
  const struct {
    hid_t t;
    hsize_t chunk;
    int raw;
  } forms[] = {{H5T_STD_U16LE, 0, 1}, {H5T_STD_U32LE, 0, 1}, {H5T_STD_U16BE, 0, 0}, {H5T_STD_U16LE, 1000, 0},
               {H5T_STD_U32LE, 333, 0}};
  int32_t win[T + 1];
  for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
    char p[600];
    snprintf(p, sizeof p, "%s/form%zu.h5", dir, k);
    write_tokens_as(p, v, N, forms[k].t, 65536, forms[k].chunk);
    mc_data d;
    CHECK_OK(mc_data_open(&d, p, T, 0));
    CHECK((d.fd >= 0) == forms[k].raw, "form %zu: read %s, expected %s", k, d.fd >= 0 ? "with pread" : "through HDF5",
          forms[k].raw ? "with pread" : "through HDF5");
    int bad = 0;
    for (int64_t w = 0; w < d.n_windows; w++) {
      CHECK_OK(mc_data_read_window(&d, w, win));
      for (int i = 0; i <= T; i++) bad += win[i] != (int32_t)v[w * T + i];
    }
    CHECK(bad == 0, "form %zu: %d tokens differ from the written ones", k, bad);
    mc_data_close(&d);
  }
  free(v);
}

static void test_windows_and_split(const char *path) {
  enum { N = 1000, T = 8 };
  uint32_t v[N];
  for (int i = 0; i < N; i++) v[i] = (uint32_t)(i % 251);
  write_tokens(path, v, N, H5T_STD_U16LE, 256);
  mc_data d;
  CHECK_OK(mc_data_open(&d, path, T, 0.1));
  CHECK(d.n_tokens == N, "n_tokens %lld", (long long)d.n_tokens);
  CHECK(!strcmp(d.tokenizer, "bytes") && d.vocab_size == 256 && d.elem_bytes == 2, "tokenizer '%s'", d.tokenizer);
  CHECK(d.n_windows == (N - 1) / T, "n_windows %lld", (long long)d.n_windows);  /* 124 */
  CHECK(d.n_val == 12, "n_val %lld (round(124 * 0.1))", (long long)d.n_val);
  CHECK(d.n_train == d.n_windows - 12, "n_train %lld", (long long)d.n_train);
  CHECK_OK(mc_data_check_vocab(&d, 256));
  CHECK(mc_data_check_vocab(&d, 128) != 0 && strstr(mc_errmsg(), "vocab_size=256"), "%s", mc_errmsg());

  /* Window w is tokens [w*T, w*T+T+1): consecutive windows share one token. */
  int32_t win[T + 1];
  CHECK_OK(mc_data_read_window(&d, 5, win));
  for (int i = 0; i <= T; i++) CHECK(win[i] == (5 * T + i) % 251, "window 5 token %d = %d", i, win[i]);
  CHECK(mc_data_read_window(&d, d.n_windows, win) != 0, "window past the end must fail");

  /* Validation and training windows partition the file; both lists ascend. */
  char *seen = calloc((size_t)d.n_windows, 1);
  int64_t prev = -1;
  for (int64_t j = 0; j < d.n_val; j++) {
    int64_t w = mc_data_val_window(&d, j);
    CHECK(w > prev && w < d.n_windows, "val window %lld = %lld", (long long)j, (long long)w);
    seen[w]++;
    prev = w;
  }
  prev = -1;
  for (int64_t k = 0; k < d.n_train; k++) {
    int64_t w = mc_data_train_window(&d, k);
    CHECK(w > prev && w < d.n_windows, "train window %lld = %lld", (long long)k, (long long)w);
    seen[w]++;
    prev = w;
  }
  for (int64_t w = 0; w < d.n_windows; w++) CHECK(seen[w] == 1, "window %lld seen %d times", (long long)w, seen[w]);
  /* Evenly spread: hand-computed for N=124, n_val=12: ceil((j+1)*124/12) - 1. */
  CHECK(mc_data_val_window(&d, 0) == 10, "first val window %lld", (long long)mc_data_val_window(&d, 0));
  CHECK(mc_data_val_window(&d, 11) == 123, "last val window %lld", (long long)mc_data_val_window(&d, 11));

  /* One epoch of the training order visits every training window exactly once, and the
   * next epoch is a different order. */
  memset(seen, 0, (size_t)d.n_windows);
  int same_next_epoch = 1;
  for (int64_t j = 0; j < d.n_train; j++) {
    int64_t w = mc_data_sample_window(&d, 42, j);
    seen[w]++;
    if (w != mc_data_sample_window(&d, 42, j + d.n_train)) same_next_epoch = 0;
  }
  for (int64_t k = 0; k < d.n_train; k++) {
    int64_t w = mc_data_train_window(&d, k);
    CHECK(seen[w] == 1, "epoch visits window %lld %d times", (long long)w, seen[w]);
  }
  CHECK(!same_next_epoch, "epochs 0 and 1 have the same order");
  free(seen);

  /* read_train reads what sample_window names. */
  int32_t rows[3 * (T + 1)];
  CHECK_OK(mc_data_read_train(&d, 42, 7, 3, rows));
  for (int i = 0; i < 3; i++) {
    int64_t w = mc_data_sample_window(&d, 42, 7 + i);
    CHECK(rows[i * (T + 1)] == (int32_t)((w * T) % 251), "row %d starts with %d", i, rows[i * (T + 1)]);
  }
  CHECK_OK(mc_data_read_val(&d, 11, 2, rows)); /* wraps around to val window 0 */
  CHECK(rows[0] == (123 * T) % 251 && rows[T + 1] == (10 * T) % 251, "val rows %d %d", rows[0], rows[T + 1]);
  mc_data_close(&d);

  /* Without a validation share every window trains and validation reads fail. */
  CHECK_OK(mc_data_open(&d, path, T, 0.0));
  CHECK(d.n_val == 0 && d.n_train == d.n_windows, "n_val %lld", (long long)d.n_val);
  CHECK(mc_data_read_val(&d, 0, 1, rows) != 0 && strstr(mc_errmsg(), "no validation split"), "%s", mc_errmsg());
  mc_data_close(&d);
}

static void test_permutation(void) {
  const uint64_t sizes[] = {1, 2, 3, 5, 17, 100, 1000, 4097};
  for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
    uint64_t n = sizes[t];
    char *hit = calloc(n, 1);
    int identity = 1, differs_by_seed = 0;
    for (uint64_t x = 0; x < n; x++) {
      uint64_t y = mc_data_permute(7, 0, x, n);
      CHECK(y < n, "perm(%llu) = %llu out of [0, %llu)", (unsigned long long)x, (unsigned long long)y,
            (unsigned long long)n);
      if (y < n) hit[y]++;
      if (y != x) identity = 0;
      if (y != mc_data_permute(8, 0, x, n)) differs_by_seed = 1;
      CHECK(y == mc_data_permute(7, 0, x, n), "not deterministic");
    }
    for (uint64_t y = 0; y < n; y++) CHECK(hit[y] == 1, "n=%llu: %llu hit %d times", (unsigned long long)n, (unsigned long long)y, hit[y]);
    if (n >= 17) {
      CHECK(!identity, "n=%llu: permutation is the identity", (unsigned long long)n);
      CHECK(differs_by_seed, "n=%llu: seeds 7 and 8 give the same order", (unsigned long long)n);
    }
    free(hit);
  }
}

/* The pieces (dp_rank, micro) of a step tile [s*G, (s+1)*G) exactly, for every layout. */
static void test_step_partition(void) {
  const int G = 24;
  for (int dp = 1; dp <= 4; dp++) {
    if (G % dp) continue;
    for (int mb = 1; mb <= G / dp; mb++) {
      if ((G / dp) % mb) continue;
      for (int64_t s = 0; s < 3; s++) {
        int hit[24] = {0};
        for (int r = 0; r < dp; r++)
          for (int m = 0; m < G / dp / mb; m++) {
            int64_t first = mc_data_first_sample(s, G, dp, r, mb, m);
            for (int i = 0; i < mb; i++) {
              int64_t j = first + i - s * G;
              CHECK(j >= 0 && j < G, "dp=%d mb=%d sample %lld outside step %lld", dp, mb, (long long)(first + i), (long long)s);
              if (j >= 0 && j < G) hit[j]++;
            }
          }
        for (int j = 0; j < G; j++) CHECK(hit[j] == 1, "dp=%d mb=%d step %lld sample %d hit %d", dp, mb, (long long)s, j, hit[j]);
      }
    }
  }
  CHECK(mc_data_first_sample(2, 24, 2, 1, 4, 1) == 2 * 24 + 12 + 4, "first sample");
}

static void test_errors(const char *dir) {
  char p[512];
  mc_data d;
  snprintf(p, sizeof p, "%s/missing.h5", dir);
  CHECK(mc_data_open(&d, p, 8, 0) != 0 && strstr(mc_errmsg(), "missing.h5") && strstr(mc_errmsg(), "cannot read"), "%s", mc_errmsg());

  snprintf(p, sizeof p, "%s/text.h5", dir);
  FILE *f = fopen(p, "w");
  fputs("not hdf5\n", f);
  fclose(f);
  CHECK(mc_data_open(&d, p, 8, 0) != 0 && strstr(mc_errmsg(), "not an HDF5 file"), "%s", mc_errmsg());

  uint32_t v[40];
  for (int i = 0; i < 40; i++) v[i] = (uint32_t)i;
  snprintf(p, sizeof p, "%s/novocab.h5", dir);
  write_tokens(p, v, 40, H5T_STD_U16LE, 0);
  CHECK(mc_data_open(&d, p, 8, 0) != 0 && strstr(mc_errmsg(), "vocab_size"), "%s", mc_errmsg());

  snprintf(p, sizeof p, "%s/float.h5", dir);
  write_tokens(p, v, 40, H5T_IEEE_F32LE, 256);
  CHECK(mc_data_open(&d, p, 8, 0) != 0 && strstr(mc_errmsg(), "uint16 or uint32"), "%s", mc_errmsg());

  snprintf(p, sizeof p, "%s/short.h5", dir);
  write_tokens(p, v, 8, H5T_STD_U32LE, 256);
  CHECK(mc_data_open(&d, p, 8, 0) != 0 && strstr(mc_errmsg(), "too few for one window"), "%s", mc_errmsg());
  write_tokens(p, v, 9, H5T_STD_U32LE, 256); /* exactly one window: none left for training */
  CHECK(mc_data_open(&d, p, 8, 0.5) != 0 && strstr(mc_errmsg(), "no training window"), "%s", mc_errmsg());
  CHECK_OK(mc_data_open(&d, p, 8, 0));
  mc_data_close(&d);

  snprintf(p, sizeof p, "%s/bigtoken.h5", dir);
  v[20] = 300;
  write_tokens(p, v, 40, H5T_STD_U16LE, 256);
  int32_t win[9];
  CHECK_OK(mc_data_open(&d, p, 8, 0));
  CHECK(mc_data_read_window(&d, 2, win) != 0 && strstr(mc_errmsg(), "token 300 at position 20"), "%s", mc_errmsg());
  mc_data_close(&d);
  CHECK(mc_data_open(&d, p, 8, 1.0) != 0 && strstr(mc_errmsg(), "val_fraction"), "%s", mc_errmsg());
}

int main(void) {
  char dir[] = "/tmp/mc_test_data_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char path[512];
  snprintf(path, sizeof path, "%s/tokens.h5", dir);
  test_windows_and_split(path);
  test_permutation();
  test_step_partition();
  test_errors(dir);
  test_storage_forms(dir);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return mc_check_exit("test_data");
}
