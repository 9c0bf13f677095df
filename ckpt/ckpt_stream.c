/* One-pass verified reading of rank files (format 6): each piece of a file is read once, from
 * the disk, into a per-thread buffer, hashed against its piece digest, and the bytes of the
 * shards it overlaps (at the offsets the manifest records) are copied out of that buffer; the
 * thread that lands a shard's last byte hands it to complete() (which hashes it), so shard
 * hashing overlaps the disk reads of later pieces. Reads block, so the stream runs twice as
 * many threads as it is given: while some wait on the disk, the others hash and copy. (Reads
 * taking turns in file order, with the next piece handed to the kernel's read-ahead, were
 * slower on the device machine's disk: results/bench/ckpt_read_patterns_2026-11-27.txt.) */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "util/fileio.h"
#include "util/error.h"

#define BUF_ALIGN 4096

typedef struct {
  mc_piece_file *files;
  int n_files;
  mc_stream_shard *shards;
  int *order;       /* shard indices by (file, offset) */
  int *file_first;  /* per file: its shards are order[file_first[f] .. file_first[f + 1]) */
  int64_t *job_first; /* per file: its piece 0's job; job_first[n_files]: the number of jobs */
  _Atomic int64_t *landed; /* per shard: bytes copied so far */
  unsigned char *temp;      /* per shard: its bytes go to a temporary buffer */
  mc_stream_complete_fn complete;
  void *user;
  atomic_int failed;  /* a piece failed: later pieces are not read */
  pthread_mutex_t mu; /* guards the buffer list, the temporary shard buffers, files[].err, fds and reads_left */
  int *fds;           /* per file: open from its first piece's read to its last one's (every job runs and
                       * counts itself in reads_left, so none is left open at the end) */
  int64_t *reads_left; /* per file: pieces not yet read (or skipped) */
  void **free_bufs;
  int n_free;
  int64_t buf_bytes;
} stream_ctx;

typedef struct {
  int file;
  int64_t offset;
  int k;
} shard_key;

static int by_file_offset(const void *a, const void *b) {
  const shard_key *x = a, *y = b;
  if (x->file != y->file) return x->file - y->file;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A piece buffer: one of those returned, else a new one (never more than one per thread). */
static void *take_buf(stream_ctx *c) {
  pthread_mutex_lock(&c->mu);
  void *b = c->n_free > 0 ? c->free_bufs[--c->n_free] : NULL;
  pthread_mutex_unlock(&c->mu);
  if (!b && posix_memalign(&b, BUF_ALIGN, (size_t)c->buf_bytes) != 0) b = NULL;
  return b;
}

static void give_buf(stream_ctx *c, void *b) {
  pthread_mutex_lock(&c->mu);
  c->free_bufs[c->n_free++] = b;
  pthread_mutex_unlock(&c->mu);
}

static int read_piece(int fd, unsigned char *buf, int64_t off, int64_t len, const char *path) {
  const int64_t r = mc_pread_full(fd, buf, len, off);
  if (r != len) return mc_error("%s: read error while hashing: %s", path, r < 0 ? strerror(errno) : "unexpected end of file");
  return 0;
}

/* The destination of shard s's bytes: its own, or its temporary buffer (made on first use). */
static unsigned char *shard_dst(stream_ctx *c, int k) {
  mc_stream_shard *s = &c->shards[k];
  if (!c->temp[k]) return s->dst;
  pthread_mutex_lock(&c->mu);
  if (!s->dst) s->dst = malloc((size_t)s->bytes);
  unsigned char *d = s->dst;
  pthread_mutex_unlock(&c->mu);
  return d;
}

/* Copies the part of every shard of file f inside [off, off + len) out of the piece in buf. */
static int land_shards(stream_ctx *c, int f, const unsigned char *buf, int64_t off, int64_t len, const char *path) {
  int lo = c->file_first[f], hi = c->file_first[f + 1];
  /* the first shard ending after off (shards do not overlap: their ends ascend too) */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    const mc_stream_shard *s = &c->shards[c->order[mid]];
    if (s->offset + s->bytes <= off) lo = mid + 1;
    else hi = mid;
  }
  for (int j = lo; j < c->file_first[f + 1]; j++) {
    const int k = c->order[j];
    mc_stream_shard *s = &c->shards[k];
    if (s->offset >= off + len) break;
    const int64_t a = s->offset > off ? s->offset : off;
    const int64_t b = s->offset + s->bytes < off + len ? s->offset + s->bytes : off + len;
    unsigned char *dst = shard_dst(c, k);
    if (!dst) return mc_error("%s: out of memory reading dataset %s", path, s->name);
    memcpy(dst + (a - s->offset), buf + (a - off), (size_t)(b - a));
    if (atomic_fetch_add(&c->landed[k], b - a) + (b - a) < s->bytes) continue;
    /* the last byte: this thread completes it */
    if (c->complete(c->user, k, dst) != 0) s->err = strdup(mc_errmsg());
    if (c->temp[k]) {
      pthread_mutex_lock(&c->mu);
      free(s->dst);
      s->dst = NULL;
      pthread_mutex_unlock(&c->mu);
    }
  }
  return 0;
}

/* Piece k of file f, bytes [off, off + len), into a buffer. The file's descriptor is shared by
 * its pieces' reads (preads at their offsets), opened by the first and closed after the last. */
static int read_piece_of(stream_ctx *c, int f, int64_t k, int64_t off, int64_t len, unsigned char **buf) {
  mc_piece_file *pf = &c->files[f];
  pthread_mutex_lock(&c->mu);
  int rc = c->fds[f] >= 0 ? 0 : mc_piece_open(pf->path, pf->bytes, 1, &c->fds[f]);
  const int fd = c->fds[f];
  pthread_mutex_unlock(&c->mu);
  if (rc == 0 && !(*buf = take_buf(c))) rc = mc_error("%s: out of memory reading piece %" PRId64, pf->path, k);
  if (rc == 0) rc = read_piece(fd, *buf, off, len, pf->path);
  return rc;
}

/* Piece k of file f is read (or skipped): the last one closes the file's descriptor. */
static void piece_read_done(stream_ctx *c, int f) {
  pthread_mutex_lock(&c->mu);
  if (--c->reads_left[f] == 0 && c->fds[f] >= 0) {
    close(c->fds[f]);
    c->fds[f] = -1;
  }
  pthread_mutex_unlock(&c->mu);
}

static int piece_job(void *vctx, int j) {
  stream_ctx *c = vctx;
  int f = 0;
  while (c->job_first[f + 1] <= j) f++;
  mc_piece_file *pf = &c->files[f];
  const int64_t k = j - c->job_first[f], off = k * pf->piece_bytes;
  const int64_t len = pf->bytes - off < pf->piece_bytes ? pf->bytes - off : pf->piece_bytes;
  unsigned char *buf = NULL;
  /* 1. Read, 2. check the piece, 3. copy out the shard bytes it holds. */
  const int skip = atomic_load(&c->failed); /* the failing piece reports */
  int rc = skip ? 0 : read_piece_of(c, f, k, off, len, &buf);
  piece_read_done(c, f);
  char hex[65];
  if (rc == 0 && !skip) {
    mc_sha256_hex(buf, (size_t)len, hex);
    if (strcmp(hex, pf->pieces[k]) != 0) rc = mc_piece_mismatch(pf, k, hex);
  }
  if (rc == 0 && !skip) rc = land_shards(c, f, buf, off, len, pf->path);
  if (buf) give_buf(c, buf);
  if (rc != 0) {
    mc_piece_note_error(&c->mu, pf, k);
    atomic_store(&c->failed, 1);
  }
  return rc;
}

/* Sorts the shards by file and offset and refuses two of one file that overlap. */
static int plan_shards(stream_ctx *c, int n_shards) {
  shard_key *keys = malloc((size_t)(n_shards > 0 ? n_shards : 1) * sizeof *keys);
  if (!keys) return mc_error("out of memory planning the read of %d datasets", n_shards);
  for (int k = 0; k < n_shards; k++) keys[k] = (shard_key){c->shards[k].file, c->shards[k].offset, k};
  qsort(keys, (size_t)n_shards, sizeof *keys, by_file_offset);
  for (int j = 0; j < n_shards; j++) c->order[j] = keys[j].k;
  free(keys);
  for (int f = 0, j = 0; f <= c->n_files; f++) {
    while (j < n_shards && c->shards[c->order[j]].file < f) j++;
    c->file_first[f] = j;
  }
  for (int j = 1; j < n_shards; j++) {
    const mc_stream_shard *a = &c->shards[c->order[j - 1]], *b = &c->shards[c->order[j]];
    if (a->file == b->file && a->offset + a->bytes > b->offset)
      return mc_error("%s: the manifest places datasets %s and %s at overlapping bytes (offsets %" PRId64 " and %" PRId64 ")",
                      c->files[a->file].path, a->name, b->name, a->offset, b->offset);
  }
  return 0;
}

int mc_stream_files(mc_piece_file *files, int n_files, mc_stream_shard *shards, int n_shards, int threads,
                    mc_stream_complete_fn complete, void *user) {
  threads = 2 * (threads < 1 ? 1 : threads); /* reads block: see the top of the file */
  stream_ctx c = {.files = files, .n_files = n_files, .shards = shards, .complete = complete,
                  .user = user, .mu = PTHREAD_MUTEX_INITIALIZER};
  atomic_init(&c.failed, 0);
  const size_t ns = (size_t)(n_shards > 0 ? n_shards : 1), nf = (size_t)n_files + 1;
  c.order = malloc(ns * sizeof *c.order);
  c.file_first = malloc(nf * sizeof *c.file_first);
  c.job_first = malloc(nf * sizeof *c.job_first);
  c.landed = malloc(ns * sizeof *c.landed);
  c.temp = malloc(ns);
  c.free_bufs = malloc((size_t)threads * sizeof *c.free_bufs);
  c.fds = malloc(nf * sizeof *c.fds);
  c.reads_left = malloc(nf * sizeof *c.reads_left);
  int rc = 0;
  for (int f = 0; c.fds && c.reads_left && f < n_files; f++) c.fds[f] = -1, c.reads_left[f] = files[f].n_pieces;
  if (!c.order || !c.file_first || !c.job_first || !c.landed || !c.temp || !c.free_bufs || !c.fds || !c.reads_left)
    rc = mc_error("out of memory planning the read of %d rank files", n_files);
  if (rc == 0) c.job_first[0] = 0;
  for (int f = 0; rc == 0 && f < n_files; f++) {
    files[f].err = NULL;
    files[f].err_piece = -1;
    c.job_first[f + 1] = c.job_first[f] + files[f].n_pieces;
    const int64_t piece = files[f].bytes < files[f].piece_bytes ? files[f].bytes : files[f].piece_bytes;
    if (piece > c.buf_bytes) c.buf_bytes = piece;
  }
  for (int k = 0; rc == 0 && k < n_shards; k++) {
    atomic_init(&c.landed[k], 0);
    c.temp[k] = shards[k].dst == NULL;
    shards[k].err = NULL;
  }
  if (rc == 0) rc = plan_shards(&c, n_shards);
  if (rc == 0 && c.job_first[n_files] > INT_MAX)
    rc = mc_error("%s and others: %" PRId64 " pieces to read, more than this MegaC can", files[0].path, c.job_first[n_files]);
  if (rc == 0) rc = mc_parallel((int)c.job_first[n_files], threads, piece_job, &c);
  for (int i = 0; i < c.n_free; i++) free(c.free_bufs[i]);
  for (int k = 0; k < n_shards && c.temp; k++) /* temporaries of shards a failure left incomplete */
    if (c.temp[k]) {
      free(shards[k].dst);
      shards[k].dst = NULL;
    }
  free(c.order);
  free(c.file_first);
  free(c.job_first);
  free(c.landed);
  free(c.temp);
  free(c.free_bufs);
  free(c.fds);
  free(c.reads_left);
  pthread_mutex_destroy(&c.mu);
  return rc;
}
