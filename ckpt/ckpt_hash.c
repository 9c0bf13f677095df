/* SHA-256 through OpenSSL EVP, and the piece hashing of rank files on the worker pool
 * (util/pool.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "util/error.h"

static void hex_of(const unsigned char md[32], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = 0;
}

void mc_sha256_hex(const void *data, size_t len, char hex[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  /* Feed in 64 MiB pieces: EVP takes size_t, this only keeps each call bounded. */
  const unsigned char *p = data;
  while (len > 0) {
    size_t n = len > ((size_t)64 << 20) ? ((size_t)64 << 20) : len;
    EVP_DigestUpdate(c, p, n);
    p += n;
    len -= n;
  }
  EVP_DigestFinal_ex(c, md, &mdlen);
  EVP_MD_CTX_free(c);
  hex_of(md, hex);
}

struct mc_sha256 {
  EVP_MD_CTX *c;
};

mc_sha256 *mc_sha256_begin(void) {
  mc_sha256 *h = malloc(sizeof *h);
  if (h && !(h->c = EVP_MD_CTX_new())) {
    free(h);
    return NULL;
  }
  if (h) EVP_DigestInit_ex(h->c, EVP_sha256(), NULL);
  return h;
}

void mc_sha256_update(mc_sha256 *h, const void *data, size_t len) { EVP_DigestUpdate(h->c, data, len); }

void mc_sha256_end(mc_sha256 *h, char hex[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_DigestFinal_ex(h->c, md, &mdlen);
  EVP_MD_CTX_free(h->c);
  free(h);
  hex_of(md, hex);
}

/* ---------------------------------------------------------------- piece digests */

int64_t mc_piece_count(int64_t bytes, int64_t piece_bytes) {
  if (bytes <= 0 || piece_bytes <= 0) return 0;
  return bytes / piece_bytes + (bytes % piece_bytes != 0);
}

int mc_piece_bytes_check(int64_t piece_bytes) {
  return piece_bytes >= MC_PIECE_BYTES_MIN && piece_bytes <= MC_PIECE_BYTES_MAX && piece_bytes % MC_PIECE_BYTES_MIN == 0;
}

static int unhex(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

void mc_pieces_root(const char (*pieces)[65], int64_t n, char hex[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  for (int64_t k = 0; k < n; k++) {
    unsigned char raw[32];
    for (int i = 0; i < 32; i++) {
      int hi = unhex(pieces[k][2 * i]), lo = unhex(pieces[k][2 * i + 1]);
      raw[i] = (unsigned char)((hi < 0 ? 0 : hi) << 4 | (lo < 0 ? 0 : lo));
    }
    EVP_DigestUpdate(c, raw, sizeof raw);
  }
  EVP_DigestFinal_ex(c, md, &mdlen);
  EVP_MD_CTX_free(c);
  hex_of(md, hex);
}

typedef struct {
  mc_piece_file *f;
  int n;
  int64_t *first; /* first[i]: the job of file i's piece 0; first[n]: the number of jobs */
  int verify;
  pthread_mutex_t mu; /* guards f[].err and f[].err_piece */
} piece_ctx;

int mc_piece_open(const char *path, int64_t size, int verify, int *fd_out) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mc_error("%s: not a regular file", path);
  }
  if ((int64_t)st.st_size != size) {
    close(fd);
    return verify ? mc_error("%s: %" PRId64 " bytes but the manifest records %" PRId64 " (truncated or replaced)", path,
                             (int64_t)st.st_size, size)
                  : mc_error("%s: changed size while being hashed (%" PRId64 " bytes, then %" PRId64 ")", path, size,
                             (int64_t)st.st_size);
  }
  *fd_out = fd;
  return 0;
}

int mc_piece_mismatch(const mc_piece_file *f, int64_t k, const char *hex) {
  const int64_t off = k * f->piece_bytes, len = f->bytes - off < f->piece_bytes ? f->bytes - off : f->piece_bytes;
  if (f->whole)
    return mc_error("%s: whole-file hash mismatch: the file hashes to %s, the manifest records %s (corrupt or replaced; "
                    "it is not parsed)", f->path, hex, f->pieces[k]);
  return mc_error("%s: hash mismatch in piece %" PRId64 " of %" PRId64 " (bytes %" PRId64 " to %" PRId64 "): it hashes "
                  "to %s, the manifest records %s (corrupt or replaced; the file is not parsed)", f->path, k, f->n_pieces,
                  off, off + len, hex, f->pieces[k]);
}

void mc_piece_note_error(pthread_mutex_t *mu, mc_piece_file *f, int64_t k) {
  pthread_mutex_lock(mu);
  if (!f->err || k < f->err_piece) {
    char *m = strdup(mc_errmsg());
    if (m) {
      free(f->err);
      f->err = m;
      f->err_piece = k;
    }
  }
  pthread_mutex_unlock(mu);
}

/* The SHA-256 of bytes [off, off + len) of the regular file `path`, which must be `size`
 * bytes long (read with pread, so several threads hash pieces of one file at once). */
static int hash_range(const char *path, int64_t size, int64_t off, int64_t len, int verify, char hex[65]) {
  int fd = -1;
  if (mc_piece_open(path, size, verify, &fd) != 0) return -1;
  posix_fadvise(fd, off, len, POSIX_FADV_SEQUENTIAL);
  const size_t cap = (size_t)1 << 20;
  unsigned char *buf = malloc(cap);
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  if (!buf || !c) {
    free(buf);
    EVP_MD_CTX_free(c);
    close(fd);
    return mc_error("%s: out of memory hashing", path);
  }
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  int err = 0;
  int64_t done = 0;
  while (done < len) {
    size_t want = len - done < (int64_t)cap ? (size_t)(len - done) : cap;
    ssize_t r = pread(fd, buf, want, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r < 0 ? errno : -1;
      break;
    }
    EVP_DigestUpdate(c, buf, (size_t)r);
    done += r;
  }
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_DigestFinal_ex(c, md, &mdlen);
  EVP_MD_CTX_free(c);
  free(buf);
  close(fd);
  if (err) return mc_error("%s: read error while hashing: %s", path, err > 0 ? strerror(err) : "unexpected end of file");
  hex_of(md, hex);
  return 0;
}

static int piece_job(void *vctx, int j) {
  piece_ctx *c = vctx;
  int lo = 0, hi = c->n - 1; /* the file whose jobs hold j: the last i with first[i] <= j */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (c->first[mid] <= j) lo = mid;
    else hi = mid - 1;
  }
  mc_piece_file *f = &c->f[lo];
  const int64_t k = j - c->first[lo] + (f->hi > 0 ? f->lo : 0);
  if (c->verify) { /* a file that already failed at an earlier piece is not hashed further */
    pthread_mutex_lock(&c->mu);
    int skip = f->err && f->err_piece < k;
    pthread_mutex_unlock(&c->mu);
    if (skip) return mc_error("%s", f->err);
  }
  const int64_t off = k * f->piece_bytes, len = f->bytes - off < f->piece_bytes ? f->bytes - off : f->piece_bytes;
  char hex[65];
  int rc = hash_range(f->path, f->bytes, off, len, c->verify, hex);
  if (rc == 0 && !c->verify) memcpy(f->pieces[k], hex, 65);
  if (rc == 0 && c->verify && strcmp(hex, f->pieces[k]) != 0) rc = mc_piece_mismatch(f, k, hex);
  if (rc != 0 && c->verify) mc_piece_note_error(&c->mu, f, k);
  return rc;
}

/* Runs one job per piece of every file on `threads` threads. */
static int run_pieces(mc_piece_file *f, int n, int threads, int verify) {
  if (n <= 0) return 0;
  piece_ctx c = {f, n, malloc((size_t)(n + 1) * sizeof(int64_t)), verify, PTHREAD_MUTEX_INITIALIZER};
  if (!c.first) return mc_error("out of memory");
  c.first[0] = 0;
  for (int i = 0; i < n; i++) c.first[i + 1] = c.first[i] + (f[i].hi > 0 ? f[i].hi - f[i].lo : f[i].n_pieces);
  int rc = c.first[n] > INT_MAX ? mc_error("%s and others: %" PRId64 " pieces to hash, more than this MegaC can",
                                           f[0].path, c.first[n])
                                : mc_parallel((int)c.first[n], threads, piece_job, &c);
  free(c.first);
  return rc;
}

int mc_pieces_hash(mc_piece_file *f, int n, int threads) {
  for (int i = 0; i < n; i++) {
    struct stat st;
    f[i].pieces = NULL;
    f[i].err = NULL;
    if (stat(f[i].path, &st) != 0) return mc_error("%s: cannot stat: %s", f[i].path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return mc_error("%s: not a regular file", f[i].path);
    if (!mc_piece_bytes_check(f[i].piece_bytes))
      return mc_error("%s: piece size %" PRId64 " is not a multiple of %" PRId64 " from %" PRId64 " to %" PRId64,
                      f[i].path, f[i].piece_bytes, (int64_t)MC_PIECE_BYTES_MIN, (int64_t)MC_PIECE_BYTES_MIN,
                      (int64_t)MC_PIECE_BYTES_MAX);
    f[i].bytes = (int64_t)st.st_size;
    f[i].n_pieces = mc_piece_count(f[i].bytes, f[i].piece_bytes);
  }
  for (int i = 0; i < n; i++)
    if (!(f[i].pieces = malloc((size_t)(f[i].n_pieces > 0 ? f[i].n_pieces : 1) * 65))) {
      for (int k = 0; k < i; k++) free(f[k].pieces), f[k].pieces = NULL;
      return mc_error("out of memory for the piece digests of %s", f[i].path);
    }
  int rc = run_pieces(f, n, threads, 0);
  if (rc != 0)
    for (int i = 0; i < n; i++) free(f[i].pieces), f[i].pieces = NULL;
  return rc;
}

int mc_pieces_verify(mc_piece_file *f, int n, int threads) {
  for (int i = 0; i < n; i++) {
    f[i].err = NULL;
    f[i].err_piece = -1;
  }
  return run_pieces(f, n, threads, 1);
}
