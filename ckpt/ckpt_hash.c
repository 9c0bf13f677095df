/* SHA-256 through OpenSSL EVP, and the small thread pool that hashes (and, in a save, writes)
 * different shards on different threads. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
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

int mc_sha256_file(const char *path, int64_t *bytes, char hex[65]) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mc_error("%s: not a regular file", path);
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
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
  int64_t total = 0;
  int err = 0;
  for (;;) {
    ssize_t r = read(fd, buf, cap);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      err = errno;
      break;
    }
    if (r == 0) break;
    EVP_DigestUpdate(c, buf, (size_t)r);
    total += r;
  }
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_DigestFinal_ex(c, md, &mdlen);
  EVP_MD_CTX_free(c);
  free(buf);
  close(fd);
  if (err) return mc_error("%s: read error while hashing: %s", path, strerror(err));
  hex_of(md, hex);
  *bytes = total;
  return 0;
}

struct mc_pool {
  int n_jobs, n_threads;
  mc_job_fn fn;
  void *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int next;       /* next job to hand out */
  int cancelled;
  signed char *state; /* 0 pending/running, 1 ok, -1 failed, -2 never ran (cancelled) */
  char **msg;         /* error message of each failed job */
  pthread_t *threads;
};

static void *pool_worker(void *arg) {
  mc_pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    if (p->cancelled || p->next >= p->n_jobs) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    int j = p->next++;
    pthread_mutex_unlock(&p->mu);
    mc_error_clear();
    int rc = p->fn(p->ctx, j);
    char *m = rc ? strdup(mc_errmsg()) : NULL;
    pthread_mutex_lock(&p->mu);
    p->state[j] = rc ? -1 : 1;
    p->msg[j] = m;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

mc_pool *mc_pool_start(int n_jobs, int threads, mc_job_fn fn, void *ctx) {
  mc_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  if (threads < 1) threads = 1;
  if (threads > n_jobs) threads = n_jobs > 0 ? n_jobs : 1;
  p->n_jobs = n_jobs;
  p->fn = fn;
  p->ctx = ctx;
  p->state = calloc((size_t)(n_jobs > 0 ? n_jobs : 1), 1);
  p->msg = calloc((size_t)(n_jobs > 0 ? n_jobs : 1), sizeof(char *));
  p->threads = calloc((size_t)threads, sizeof(pthread_t));
  if (!p->state || !p->msg || !p->threads) {
    free(p->state);
    free(p->msg);
    free(p->threads);
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (int t = 0; t < threads && n_jobs > 0; t++) {
    if (pthread_create(&p->threads[t], NULL, pool_worker, p) != 0) break;
    p->n_threads++;
  }
  return p;
}

int mc_pool_wait_job(mc_pool *p, int j) {
  pthread_mutex_lock(&p->mu);
  while (p->state[j] == 0 && !(p->cancelled && j >= p->next)) {
    if (p->n_threads == 0) {
      pthread_mutex_unlock(&p->mu);
      return mc_error("could not start any hashing thread");
    }
    pthread_cond_wait(&p->cv, &p->mu);
  }
  int st = p->state[j];
  pthread_mutex_unlock(&p->mu);
  if (st == 1) return 0;
  if (st == -1) return mc_error("%s", p->msg[j]);
  return mc_error("job %d was cancelled", j);
}

void mc_pool_cancel(mc_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->cancelled = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

int mc_pool_finish(mc_pool *p) {
  for (int t = 0; t < p->n_threads; t++) pthread_join(p->threads[t], NULL);
  int rc = 0;
  if (p->n_threads == 0 && p->n_jobs > 0) rc = mc_error("could not start any worker thread");
  for (int j = 0; j < p->n_jobs && rc == 0; j++)
    if (p->state[j] == -1) rc = mc_error("%s", p->msg[j]);
  for (int j = 0; j < p->n_jobs; j++) free(p->msg[j]);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->state);
  free(p->msg);
  free(p->threads);
  free(p);
  return rc;
}

int mc_parallel(int n_jobs, int threads, mc_job_fn fn, void *ctx) {
  mc_pool *p = mc_pool_start(n_jobs, threads, fn, ctx);
  if (!p) return mc_error("out of memory starting %d worker threads", threads);
  return mc_pool_finish(p);
}
