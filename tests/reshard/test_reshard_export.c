/* Safetensors export and import, and the audit's tiling check:
 *  - the dtype conversions (every IEEE half, bf16 ties, NaN, overflow), a BF16 file, sizes;
 *  - the safetensors writer/reader round-trip (header, metadata, offsets, data) and its
 *    refusal of malformed files;
 *  - export of a checkpoint's weights gives one global tensor per family with the right
 *    values and hashes; import into another layout gives a checkpoint whose param content
 *    digests equal the source's, moments zero, step 0; a tampered tensor is refused;
 *  - mc_audit_tiling reports gaps, overlaps and out-of-bounds shards. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "core/dtype.h"
#include "reshard/audit.h"
#include "reshard/export.h"
#include "reshard/safetensors.h"
#include "rs_ckpt_testlib.h"

static char root[2048];

static void test_format(void) {
  char p[2300];
  snprintf(p, sizeof p, "%s/fmt.safetensors", root);
  mc_st_tensor t[2] = {{"a", 2, {3, 2, 0}, "F32", 0, 0, 0}, {"b.c", 1, {5, 0, 0}, "", 0, 0, 0}}; /* "": F32 */
  mc_st_meta meta = {0};
  mc_st_meta_add(&meta, "k", "v\"quoted\"");
  mc_st_file f;
  CHECK_OK(mc_st_create(&f, p, t, 2, &meta));
  float a[6] = {1, 2, 3, 4, 5, 6}, b[5] = {-1, -2, -3, -4, -5};
  CHECK_OK(mc_st_pwrite(&f, 1, 0, b, sizeof b));
  CHECK_OK(mc_st_pwrite(&f, 0, 8, a + 2, 16));
  CHECK_OK(mc_st_pwrite(&f, 0, 0, a, 8));
  CHECK(mc_st_pwrite(&f, 0, 20, a, 8) != 0, "write past a tensor accepted");
  CHECK(access(p, F_OK) != 0, "file visible before commit");
  CHECK_OK(mc_st_commit(&f));
  mc_st_meta_free(&meta);
  mc_st_file r;
  CHECK_OK(mc_st_open(&r, p));
  CHECK(r.n == 2 && (r.data_start % 8) == 0, "%d tensors, data at %lld", r.n, (long long)r.data_start);
  int ia = mc_st_find(&r, "a"), ib = mc_st_find(&r, "b.c");
  CHECK(ia >= 0 && ib >= 0 && r.t[ia].ndim == 2 && r.t[ia].shape[0] == 3 && r.t[ia].shape[1] == 2, "shapes");
  float got[6];
  CHECK_OK(mc_st_pread(&r, ia, 0, got, 24));
  CHECK(memcmp(got, a, 24) == 0, "data of a");
  CHECK_OK(mc_st_pread(&r, ib, 4, got, 8));
  CHECK(got[0] == -2 && got[1] == -3, "data of b.c");
  const char *v = mc_st_meta_get(&r.meta, "k");
  CHECK(v && strcmp(v, "v\"quoted\"") == 0, "metadata");
  mc_st_close(&r);
  /* Malformed: header length past the end, a dtype not read (I64). */
  int fd = open(p, O_WRONLY);
  unsigned char big[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
  CHECK(pwrite(fd, big, 8, 0) == 8, "write");
  close(fd);
  CHECK(mc_st_open(&r, p) != 0 && strstr(mc_errmsg(), "header length"), "bad length: %s", mc_errmsg());
  FILE *w = fopen(p, "wb");
  const char *h = "{\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
  unsigned long long hl = strlen(h);
  fwrite(&hl, 8, 1, w);
  fputs(h, w);
  fputs("zzzzzzzz", w);
  fclose(w);
  CHECK(mc_st_open(&r, p) != 0 && strstr(mc_errmsg(), "I64"), "bad dtype: %s", mc_errmsg());
}

static int run_audit(const char *path, mc_audit *a, mc_rs_source **s) {
  if (mc_rs_source_open(path, s) != 0) return -1;
  return mc_audit_run(*s, 1, 0, a);
}

static void test_export_import(void) {
  mc_model m;
  rs_test_model(&m, "AEMR");
  mc_layout la = {0};
  la.tp = 2, la.pp = 2, la.dp = 2, la.ep = 2, la.sp = 1, la.zero = 1;
  mc_geometry ga;
  CHECK_OK(mc_geometry_build(&m, &la, NULL, -1, &ga));
  char A[2300], S[2300], B[2300];
  snprintf(A, sizeof A, "%s/A", root);
  snprintf(S, sizeof S, "%s/A.safetensors", root);
  snprintf(B, sizeof B, "%s/B", root);
  CHECK_OK(rs_save_reference(A, &ga, 9));
  mc_rs_source *src;
  CHECK_OK(mc_rs_source_open(A, &src));
  mc_rs_opts o = {.chunk_bytes = 512, .threads = 2};
  CHECK_OK(mc_rs_export_safetensors(src, S, &o, NULL));
  mc_rs_source_close(src);

  /* One global tensor per family, row-major values, hashes in the metadata. */
  mc_st_file f;
  CHECK_OK(mc_st_open(&f, S));
  CHECK(f.n == ga.fams.n, "%d tensors for %d families", f.n, ga.fams.n);
  int bad = 0;
  for (int i = 0; i < ga.fams.n; i++) {
    const mc_family *fam = &ga.fams.f[i];
    int t = mc_st_find(&f, fam->name);
    if (t < 0) {
      bad++;
      continue;
    }
    float *got = malloc((size_t)fam->numel * 4), *want = malloc((size_t)fam->numel * 4);
    mc_box all = {fam->ndim, {0, 0, 0}, {fam->shape[0], fam->shape[1], fam->shape[2]}};
    rs_pack(i, MC_STATE_PARAM, fam->shape, fam->ndim, &all, want);
    mc_st_pread(&f, t, 0, got, fam->numel * 4);
    unsigned char h[32];
    unsigned int hl;
    char hex[65], key[200];
    EVP_Digest(want, (size_t)fam->numel * 4, h, &hl, EVP_sha256(), NULL);
    mc_rs_hex(h, hex);
    snprintf(key, sizeof key, "sha256.%s", fam->name);
    const char *rec = mc_st_meta_get(&f.meta, key);
    if (memcmp(got, want, (size_t)fam->numel * 4) || !rec || strcmp(rec, hex)) bad++;
    free(got);
    free(want);
  }
  CHECK(bad == 0, "%d exported tensors wrong", bad);
  CHECK(mc_st_meta_get(&f.meta, "config") && mc_st_meta_get(&f.meta, "format"), "metadata config/format");
  mc_st_close(&f);

  /* Import into another layout: same param digests, zero moments, step 0. */
  mc_layout lb = {0};
  lb.tp = 1, lb.pp = 4, lb.dp = 2, lb.ep = 1, lb.zero = 3;
  CHECK_OK(mc_rs_import_safetensors(S, &lb, B, &o, NULL));
  mc_audit aa, ab;
  mc_rs_source *sa = NULL, *sb = NULL;
  CHECK_OK(run_audit(A, &aa, &sa));
  CHECK_OK(run_audit(B, &ab, &sb));
  if (sa && sb) {
    CHECK(aa.problems.n == 0 && ab.problems.n == 0, "audit problems %d / %d", aa.problems.n, ab.problems.n);
    int same = 0, zero_ok = 0;
    for (int i = 0; i < ga.fams.n; i++) {
      same += strcmp(aa.digest[i][MC_STATE_PARAM], ab.digest[i][MC_STATE_PARAM]) == 0;
      float *z = calloc((size_t)ga.fams.f[i].numel, 4);
      unsigned char h[32];
      unsigned int hl;
      char hex[65];
      EVP_Digest(z, (size_t)ga.fams.f[i].numel * 4, h, &hl, EVP_sha256(), NULL);
      mc_rs_hex(h, hex);
      zero_ok += !strcmp(ab.digest[i][MC_STATE_EXP_AVG], hex) && !strcmp(ab.digest[i][MC_STATE_EXP_AVG_SQ], hex);
      free(z);
    }
    CHECK(same == ga.fams.n, "%d of %d param digests survive export/import", same, ga.fams.n);
    CHECK(zero_ok == ga.fams.n, "%d of %d imported moments are zero", zero_ok, ga.fams.n);
    mc_train_state st;
    CHECK_OK(mc_ckpt_train_state(mc_rs_source_ckpt(sb), &st));
    CHECK(st.step == 0 && st.lr_max > 0, "imported state: step %lld", (long long)st.step);
    CHECK(mc_rs_source_geometry(sb)->layout.pp == 4, "imported layout");
    mc_audit_free(&aa);
    mc_audit_free(&ab);
  }
  mc_rs_source_close(sa);
  mc_rs_source_close(sb);

  /* A tampered tensor is refused naming it; nothing is written. */
  CHECK_OK(mc_st_open(&f, S));
  int t = mc_st_find(&f, "layers.01.moe.w2");
  int64_t at = f.data_start + f.t[t].offset + 4;
  mc_st_close(&f);
  int fd = open(S, O_WRONLY);
  float v = 99.0f;
  CHECK(pwrite(fd, &v, 4, at) == 4, "tamper");
  close(fd);
  char C[2300];
  snprintf(C, sizeof C, "%s/C", root);
  CHECK(mc_rs_import_safetensors(S, &lb, C, &o, NULL) != 0 && strstr(mc_errmsg(), "layers.01.moe.w2"),
        "tampered import: %s", mc_errmsg());
  CHECK(!rs_exists(C), "a refused import left %s", C);
  mc_geometry_free(&ga);
}

static void test_tiling(void) {
  int64_t shape[2] = {10, 4};
  int ranks[3] = {0, 1, 2};
  mc_errlist e;
  mc_box ok[2] = {{2, {0, 0}, {6, 4}}, {2, {6, 0}, {4, 4}}};
  mc_errlist_init(&e);
  CHECK(mc_audit_tiling("f/param", 2, shape, ok, ranks, 2, &e) == 0, "exact tiling flagged: %s", e.n ? e.msg[0] : "");
  mc_box gap[2] = {{2, {0, 0}, {5, 4}}, {2, {6, 0}, {4, 4}}};
  mc_errlist_init(&e);
  CHECK(mc_audit_tiling("f/param", 2, shape, gap, ranks, 2, &e) == 1 && mc_errlist_has(&e, "gap"), "gap not found");
  mc_box ovl[3] = {{2, {0, 0}, {6, 4}}, {2, {5, 0}, {5, 2}}, {2, {5, 2}, {5, 2}}};
  mc_errlist_init(&e);
  CHECK(mc_audit_tiling("f/param", 2, shape, ovl, ranks, 3, &e) == 2 && mc_errlist_has(&e, "rank 0 [0:6, 0:4] and rank 1"),
        "overlap: %d %s", e.n, e.n ? e.msg[0] : "");
  mc_box out[1] = {{2, {8, 0}, {4, 4}}};
  mc_errlist_init(&e);
  CHECK(mc_audit_tiling("f/param", 2, shape, out, ranks, 1, &e) == 1 && mc_errlist_has(&e, "outside"), "bounds");
}

/* A BF16 file written and read back; --max-shard-size units. (The conversions themselves are
 * core's, tested brute force by core.test_dtype.) */
static void test_dtypes(void) {
  char p[2300];
  snprintf(p, sizeof p, "%s/bf16.safetensors", root);
  mc_st_tensor t[1] = {{"w", 1, {3, 0, 0}, "BF16", 0, 0, 0}};
  mc_st_file f;
  CHECK_OK(mc_st_create(&f, p, t, 1, NULL));
  uint16_t v[3] = {mc_bf16_of_f32(1.5f), mc_bf16_of_f32(-2.0f), mc_bf16_of_f32(3.0f)}, r[3] = {0};
  CHECK_OK(mc_st_pwrite(&f, 0, 0, v, 6));
  CHECK_OK(mc_st_commit(&f));
  CHECK_OK(mc_st_open(&f, p));
  CHECK(f.n == 1 && !strcmp(f.t[0].dtype, "BF16") && f.t[0].esize == 2 && f.t[0].bytes == 6, "BF16 header");
  CHECK_OK(mc_st_pread(&f, 0, 0, r, 6));
  CHECK(mc_f32_of_bf16(r[0]) == 1.5f && mc_f32_of_bf16(r[1]) == -2.0f && mc_f32_of_bf16(r[2]) == 3.0f, "BF16 data");
  mc_st_close(&f);

  CHECK(mc_rs_parse_size("5GB") == 5000000000LL && mc_rs_parse_size("2GiB") == 2147483648LL &&
            mc_rs_parse_size("500mb") == 500000000LL && mc_rs_parse_size("123") == 123 &&
            mc_rs_parse_size("1.5KiB") == 1536,
        "sizes");
  CHECK(mc_rs_parse_size("5XB") < 0 && strstr(mc_errmsg(), "unknown unit"), "bad unit: %s", mc_errmsg());
  CHECK(mc_rs_parse_size("-1GB") < 0 && mc_rs_parse_size("GB") < 0, "bad numbers");
}

int main(void) {
  rs_scratch("export", root, sizeof root);
  test_format();
  test_dtypes();
  test_export_import();
  test_tiling();
  if (mc_check_failures == 0) rs_rm_rf(root);
  return mc_check_exit("test_reshard_export");
}
