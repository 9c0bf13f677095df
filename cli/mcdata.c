/* mcdata: text files (or pre-tokenised raw arrays) -> an HDF5 token dataset for mctrain.
 *
 *   mcdata -o OUT.h5 [--dtype bytes|uint16|uint32] [--vocab N] [--tokenizer NAME] [--compress] [--json] FILE...
 *   mcdata --config RUN.json [--set section.key=value] [options] FILE...  (-o defaults to
 *          data.path, --vocab to model.vocab_size)
 *
 * bytes (default): every byte of the files, in order, is one token (vocab 256 unless --vocab
 * says less). uint16/uint32: the files are raw little-endian token arrays; --vocab is required.
 * Output: dataset "/tokens" (uint16 when vocab <= 65536, else uint32) with attributes
 * vocab_size, tokenizer, sources, source_bytes, source_sha256, created_by. The file is written
 * under a temporary name and renamed into place, so a failure never leaves a partial OUT. */
#define _POSIX_C_SOURCE 200809L /* fileno, fstat */

#include <cjson/cJSON.h>
#include <hdf5.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_opts.h"
#include "core/config.h"
#include "util/error.h"
#include "util/paths.h"

#define CHUNK (1 << 20)
#define TOKEN_CHUNK ((hsize_t)65536) /* tokens per HDF5 chunk of a --compress dataset */

enum { OPT_DTYPE = CLI_LONG, OPT_VOCAB, OPT_TOKENIZER, OPT_COMPRESS, OPT_JSON, OPT_VERSION };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"output", required_argument, NULL, 'o'},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"compress", no_argument, NULL, OPT_COMPRESS},
    {"json", no_argument, NULL, OPT_JSON},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mcdata -o OUT.h5 [--dtype bytes|uint16|uint32] [--vocab N] [--tokenizer NAME] [--compress] [--json] FILE...\n"
          "       mcdata --config RUN.json [--set section.key=value] [options] FILE...\n"
          "       mcdata --help | --version\n"
          "  -o, --output OUT.h5  the dataset to write (renamed into place when complete)\n"
          "  --dtype         bytes (default): each byte of the text files is a token (vocab 256 by default);\n"
          "                  uint16/uint32: files are raw little-endian token arrays; --vocab N is required\n"
          "  --vocab N       every token must be below N (recorded as vocab_size)\n"
          "  --tokenizer NAME  recorded as the tokenizer attribute (default bytes or pretokenized)\n"
          "  --compress      store /tokens in chunks of 65536 tokens through shuffle + deflate (zlib level 6)\n"
          "  --json          print the summary as one JSON document\n"
          "  --version       print the MegaC version, then exit\n"
          "  with --config/--set: -o defaults to data.path and --vocab to model.vocab_size\n");
}

typedef struct {
  const char *out;
  int in_bytes;     /* bytes per input token: 1 (text), 2, 4 */
  int64_t vocab;
  const char *tokenizer;
  int n_files;
  char **files;
  int64_t *sizes;   /* bytes per file */
  char (*sha)[65];
  int json;         /* --json: the summary as one JSON document */
  int compress;     /* --compress: chunked, shuffle + deflate */
} job;

static void print_json(const job *j, int64_t total) {
  cJSON *o = cJSON_CreateObject(), *files = o ? cJSON_AddArrayToObject(o, "sources") : NULL;
  if (!files) {
    cJSON_Delete(o);
    return;
  }
  cJSON_AddStringToObject(o, "output", j->out);
  cJSON_AddNumberToObject(o, "tokens", (double)total);
  cJSON_AddNumberToObject(o, "vocab_size", (double)j->vocab);
  cJSON_AddStringToObject(o, "dtype", j->vocab <= 65536 ? "uint16" : "uint32");
  cJSON_AddStringToObject(o, "tokenizer", j->tokenizer);
  for (int i = 0; i < j->n_files; i++) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "path", j->files[i]);
    cJSON_AddNumberToObject(f, "bytes", (double)j->sizes[i]);
    cJSON_AddStringToObject(f, "sha256", j->sha[i]);
    cJSON_AddItemToArray(files, f);
  }
  char *text = cJSON_Print(o);
  if (text) printf("%s\n", text);
  free(text);
  cJSON_Delete(o);
}

static int write_string_attr(hid_t obj, const char *name, const char *value) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, t, &value);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  return e < 0 ? -1 : 0;
}

static int write_strings_attr(hid_t obj, const char *name, const char *const *values, int n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hsize_t dim = (hsize_t)n;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, t, values);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  return e < 0 ? -1 : 0;
}

static int write_int64s_attr(hid_t obj, const char *name, const int64_t *values, int n) {
  hsize_t dim = (hsize_t)n;
  hid_t sp = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dim, NULL);
  hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT64, values);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  return e < 0 ? -1 : 0;
}

/* Streams every input into the dataset, checking tokens against the vocabulary and hashing. */
static int fill(job *j, hid_t ds) {
  unsigned char *buf = malloc(CHUNK);
  uint32_t *tok = malloc(sizeof(uint32_t) * CHUNK);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!buf || !tok || !md) {
    free(buf), free(tok), EVP_MD_CTX_free(md);
    return mc_error("mcdata: out of memory");
  }
  int rc = 0;
  hsize_t pos = 0;
  for (int i = 0; i < j->n_files && rc == 0; i++) {
    FILE *f = fopen(j->files[i], "rb");
    if (!f) {
      rc = mc_error("mcdata: cannot open input %s", j->files[i]);
      break;
    }
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    int64_t off = 0;
    size_t got;
    /* Chunks are a multiple of 4 bytes, so raw tokens never straddle two reads. */
    while (rc == 0 && (got = fread(buf, 1, CHUNK, f)) > 0) {
      EVP_DigestUpdate(md, buf, got);
      hsize_t n = got / (size_t)j->in_bytes;
      for (hsize_t k = 0; k < n; k++) {
        const unsigned char *p = buf + k * (size_t)j->in_bytes;
        uint32_t v = j->in_bytes == 1 ? p[0]
                     : j->in_bytes == 2 ? (uint32_t)(p[0] | p[1] << 8)
                                        : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if ((int64_t)v >= j->vocab) {
          rc = mc_error("mcdata: %s: token %u at byte offset %lld is not below vocab_size=%lld",
                        j->files[i], v, (long long)(off + (int64_t)(k * (size_t)j->in_bytes)), (long long)j->vocab);
          break;
        }
        tok[k] = v;
      }
      if (rc == 0 && n > 0) {
        hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(1, &n, NULL);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, &pos, NULL, &n, NULL);
        if (H5Dwrite(ds, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, tok) < 0)
          rc = mc_error("mcdata: writing %s failed", j->out);
        H5Sclose(ms), H5Sclose(fs);
        pos += n;
      }
      off += (int64_t)got;
    }
    if (rc == 0 && ferror(f)) rc = mc_error("mcdata: reading %s failed", j->files[i]);
    if (rc == 0 && off != j->sizes[i]) rc = mc_error("mcdata: %s changed size while being read", j->files[i]);
    fclose(f);
    unsigned char h[32];
    unsigned hl = 0;
    EVP_DigestFinal_ex(md, h, &hl);
    for (int k = 0; k < 32; k++) sprintf(j->sha[i] + 2 * k, "%02x", h[k]);
  }
  free(buf), free(tok), EVP_MD_CTX_free(md);
  return rc;
}

static int run(job *j) {
  int64_t total = 0;
  for (int i = 0; i < j->n_files; i++) {
    struct stat st;
    if (stat(j->files[i], &st) != 0) return mc_error("mcdata: input %s does not exist", j->files[i]);
    if (!S_ISREG(st.st_mode)) return mc_error("mcdata: input %s is not a regular file", j->files[i]);
    if (access(j->files[i], R_OK) != 0) return mc_error("mcdata: input %s is not readable", j->files[i]);
    if (st.st_size % j->in_bytes != 0)
      return mc_error("mcdata: %s has %lld bytes, not a whole number of %d-byte tokens", j->files[i],
                      (long long)st.st_size, j->in_bytes);
    j->sizes[i] = st.st_size;
    total += st.st_size / j->in_bytes;
  }
  if (total == 0) return mc_error("mcdata: the inputs hold no tokens");
  /* OUT is written as a temporary file renamed over it: never over a device or FIFO, never
   * over one of the inputs. */
  if (mc_output_file_ok(j->out, "mcdata: output") != 0) return -1;
  for (int i = 0; i < j->n_files; i++)
    if (mc_check_disjoint(j->out, "mcdata: output", j->files[i], "input") != 0) return -1;

  char tmp[2048];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", j->out, (long)getpid());
  hid_t f;
  H5E_BEGIN_TRY { f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT); } H5E_END_TRY;
  if (f < 0) return mc_error("mcdata: cannot create %s", tmp);
  hsize_t dim = (hsize_t)total;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (j->compress && total > 0) {
    /* Chunks of TOKEN_CHUNK tokens: fill() writes CHUNK tokens at a time, a multiple of it, so
     * every chunk is compressed once; a window read (train/data.c) inflates one or two. */
    hsize_t c = dim < TOKEN_CHUNK ? dim : TOKEN_CHUNK;
    H5Pset_chunk(dcpl, 1, &c);
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 6);
  }
  hid_t ds = H5Dcreate2(f, "/tokens", j->vocab <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE, sp,
                        H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  int rc = ds < 0 ? mc_error("mcdata: cannot create /tokens in %s", tmp) : fill(j, ds);
  if (rc == 0) {
    const char **shas = malloc(sizeof(char *) * (size_t)j->n_files);
    for (int i = 0; shas && i < j->n_files; i++) shas[i] = j->sha[i];
    if (!shas || write_int64s_attr(ds, "vocab_size", &j->vocab, 1) || write_string_attr(ds, "tokenizer", j->tokenizer) ||
        write_strings_attr(ds, "sources", (const char *const *)j->files, j->n_files) ||
        write_int64s_attr(ds, "source_bytes", j->sizes, j->n_files) ||
        write_strings_attr(ds, "source_sha256", shas, j->n_files) ||
        write_string_attr(ds, "created_by", "mcdata (MegaC)"))
      rc = mc_error("mcdata: writing attributes of /tokens failed");
    free(shas);
  }
  if (ds >= 0) H5Dclose(ds);
  if (H5Fclose(f) < 0 && rc == 0) rc = mc_error("mcdata: closing %s failed", tmp);
  if (rc == 0 && rename(tmp, j->out) != 0) rc = mc_error("mcdata: cannot rename %s to %s", tmp, j->out);
  if (rc != 0) unlink(tmp);
  else if (j->json)
    print_json(j, total);
  else
    printf("mcdata: wrote %s: %lld tokens (vocab %lld, %s) from %d file(s)\n", j->out, (long long)total,
           (long long)j->vocab, j->tokenizer, j->n_files);
  return rc;
}

static int mcdata_main(int argc, char **argv, job *jp);

int main(int argc, char **argv) {
  job j = {0};
  const int rc = mcdata_main(argc, argv, &j);
  free(j.files), free(j.sizes), free(j.sha); /* every way out of mcdata_main comes back here */
  return rc;
}

static int mcdata_main(int argc, char **argv, job *jp) {
  job j = *jp; /* what it allocates is recorded in *jp at once, for main to free */
  const char *dtype = "bytes";
  j.vocab = -1;
  /* With --config/--set, the run's data.path and model.vocab_size are the defaults of -o and
   * --vocab, so the dataset is made for the model that will train on it. */
  mc_config cfg;
  int from_config = 0;
  if (mc_config_default(&cfg) != 0 || mc_config_overlay_args(&cfg, &argc, argv, &from_config) != 0) {
    fprintf(stderr, "mcdata: %s\n", mc_errmsg());
    return 2;
  }
  j.files = jp->files = malloc(sizeof(char *) * (size_t)(argc > 0 ? argc : 1));
  if (!j.files) return 1;
  cli_parser p;
  cli_init(&p, argc, argv, "ho:", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case 'o':
      j.out = p.arg;
      break;
    case OPT_DTYPE:
      dtype = p.arg;
      break;
    case OPT_VOCAB:
      if (cli_int(p.opt, p.arg, 1, 4294967296LL, "an integer in [1, 2^32]", &j.vocab) != 0) return cli_bad_usage("mcdata", NULL);
      break;
    case OPT_TOKENIZER:
      j.tokenizer = p.arg;
      break;
    case OPT_COMPRESS:
      j.compress = 1;
      break;
    case OPT_JSON:
      j.json = 1;
      break;
    case OPT_VERSION:
      return cli_version("mcdata", 0);
    case CLI_ARG:
      j.files[j.n_files++] = (char *)p.arg;
      break;
    default:
      return cli_bad_usage("mcdata", usage);
    }
  }
  if (from_config) {
    if (!j.out) j.out = cfg.data.path;
    if (j.vocab < 0) j.vocab = cfg.model.vocab_size;
  }
  if (!j.out || j.n_files == 0) {
    fprintf(stderr, "mcdata: %s\n", !j.out ? "missing -o OUT.h5" : "no input files");
    usage(stderr);
    return 2;
  }
  if (!strcmp(dtype, "bytes") || !strcmp(dtype, "text")) {
    j.in_bytes = 1;
    if (j.vocab < 0) j.vocab = 256;
    if (!j.tokenizer) j.tokenizer = "bytes";
  } else if (!strcmp(dtype, "uint16") || !strcmp(dtype, "uint32")) {
    j.in_bytes = dtype[4] == '1' ? 2 : 4;
    if (j.vocab < 0) {
      fprintf(stderr, "mcdata: --dtype %s needs --vocab N (the tokenizer's vocabulary size)\n", dtype);
      return 2;
    }
    if (!j.tokenizer) j.tokenizer = "pretokenized";
  } else {
    fprintf(stderr, "mcdata: --dtype %s: expected bytes, uint16 or uint32\n", dtype);
    return 2;
  }
  j.sizes = jp->sizes = calloc((size_t)j.n_files, sizeof *j.sizes);
  j.sha = jp->sha = calloc((size_t)j.n_files, sizeof *j.sha);
  int rc = (j.sizes && j.sha) ? run(&j) : mc_error("mcdata: out of memory");
  if (rc != 0) fprintf(stderr, "%s\n", mc_errmsg());
  return rc ? 1 : 0;
}
