/* One-pass verified reading of rank files (format 6): each piece of a file is read once, from
 * the disk, in reads of `read_bytes` (a divisor of the piece size) into a per-thread buffer;
 * each read is added to its piece's SHA-256 and the bytes of the shards it overlaps (at the
 * offsets the manifest records) are copied out of it at once, and each shard's own SHA-256 is
 * advanced over its bytes in order as they land, by whichever thread lands the next bytes in
 * order. So hashing runs under the reads of later pieces, and when the disk delivers the last
 * byte, what is left is one read's worth of hashing and copying, not a piece's and a shard's.
 * A piece's digest is compared when its last read is hashed; a shard is complete (complete()
 * called with its hash) when its last byte is hashed. Reads block, so the stream runs twice as
 * many threads as it is given: while some wait on the disk, the others hash and copy. (Reads
 * taking turns in file order, with the next piece handed to the kernel's read-ahead, were
 * slower on the device machine's disk: results/bench/ckpt_read_patterns_2026-11-27.txt; so
 * were O_DIRECT reads, 45-62% of the raw read against 80-92% buffered:
 * results/bench/ckpt_stream_reads_2026-11-28.txt.) */
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
  pthread_mutex_t mu;
  int64_t hashed; /* bytes hashed, from the first on */
  int hashing;    /* a thread is advancing the hash */
  int done;       /* every byte hashed: complete() called or being called */
  mc_sha256 *h;
  int64_t cell0;  /* the read (file offset / read size) of its first byte */
  int64_t base;   /* its reads' flags: landed[base .. base + n) */
} shard_hash;

typedef struct {
  mc_piece_file *files;
  int n_files;
  mc_stream_shard *shards;
  int n_shards;
  int64_t *read_bytes; /* per file: its pieces are read this many bytes at a time (a divisor) */
  int64_t buf_bytes;   /* the largest */
  int *order;       /* shard indices by (file, offset) */
  int *file_first;  /* per file: its shards are order[file_first[f] .. file_first[f + 1]) */
  int64_t *job_first; /* per file: its piece 0's job; job_first[n_files]: the number of jobs */
  shard_hash *sh;
  unsigned char *landed; /* per shard and read it overlaps: its bytes of that read are in (under sh[].mu) */
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

/* The largest multiple of BUF_ALIGN that divides the piece size and is at most at_most (pieces
 * are multiples of MC_PIECE_BYTES_MIN = BUF_ALIGN; any other is read whole): reads stay
 * page-aligned, and no read spans two pieces. */
static int64_t read_size(int64_t piece_bytes, int64_t at_most) {
  if (piece_bytes % BUF_ALIGN != 0) return piece_bytes;
  const int64_t m = piece_bytes / BUF_ALIGN;
  int64_t d = at_most / BUF_ALIGN < m ? at_most / BUF_ALIGN : m;
  if (d < 1) d = 1;
  while (m % d != 0) d--;
  return d * BUF_ALIGN;
}

/* A read buffer: one of those returned, else a new one (never more than one per thread). */
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

/* Bytes [off, off + len) of file f into buf. */
static int read_range(stream_ctx *c, int f, unsigned char *buf, int64_t off, int64_t len) {
  const int64_t r = mc_pread_full(c->fds[f], buf, len, off);
  if (r != len)
    return mc_error("%s: read error while hashing: %s", c->files[f].path, r < 0 ? strerror(errno) : "unexpected end of file");
  return 0;
}

/* The destination of shard k's bytes: its own, or its temporary buffer (made on first use). */
static unsigned char *shard_dst(stream_ctx *c, int k) {
  mc_stream_shard *s = &c->shards[k];
  if (!c->temp[k]) return s->dst;
  pthread_mutex_lock(&c->mu);
  if (!s->dst) s->dst = malloc((size_t)s->bytes);
  unsigned char *d = s->dst;
  pthread_mutex_unlock(&c->mu);
  return d;
}

/* Shard k's bytes of read `cell` have landed (in dst): marks them, and unless another thread is
 * already at it, advances the shard's hash over every byte landed in order; the thread that
 * hashes the last byte completes the shard. */
static void advance_hash(stream_ctx *c, int k, int64_t cell, unsigned char *dst) {
  mc_stream_shard *s = &c->shards[k];
  shard_hash *st = &c->sh[k];
  const int64_t R = c->read_bytes[s->file];
  pthread_mutex_lock(&st->mu);
  c->landed[st->base + cell - st->cell0] = 1;
  if (st->hashing) {
    pthread_mutex_unlock(&st->mu);
    return;
  }
  st->hashing = 1;
  while (st->hashed < s->bytes && c->landed[st->base + (s->offset + st->hashed) / R - st->cell0]) {
    const int64_t from = st->hashed, next = ((s->offset + from) / R + 1) * R - s->offset;
    const int64_t to = next < s->bytes ? next : s->bytes;
    pthread_mutex_unlock(&st->mu); /* others mark their reads meanwhile; this thread sees them below */
    if (!st->h) st->h = mc_sha256_begin();
    if (st->h) mc_sha256_update(st->h, dst + from, (size_t)(to - from));
    pthread_mutex_lock(&st->mu);
    st->hashed = to;
  }
  st->hashing = 0;
  const int finish = st->hashed == s->bytes && !st->done;
  if (finish) st->done = 1;
  pthread_mutex_unlock(&st->mu);
  if (!finish) return;
  char hex[65];
  if (!st->h) {
    s->err = strdup("out of memory hashing a dataset");
  } else {
    mc_sha256_end(st->h, hex);
    st->h = NULL;
    if (c->complete(c->user, k, dst, hex) != 0) s->err = strdup(mc_errmsg());
  }
  if (c->temp[k]) {
    pthread_mutex_lock(&c->mu);
    free(s->dst);
    s->dst = NULL;
    pthread_mutex_unlock(&c->mu);
  }
}

/* Copies the part of every shard of file f inside read `cell` ([off, off + len)) out of buf. */
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
    advance_hash(c, k, off / c->read_bytes[f], dst);
  }
  return 0;
}

/* File f's descriptor, opened by the first of its pieces' reads (preads at their offsets). */
static int open_file(stream_ctx *c, int f) {
  pthread_mutex_lock(&c->mu);
  const int rc = c->fds[f] >= 0 ? 0 : mc_piece_open(c->files[f].path, c->files[f].bytes, 1, &c->fds[f]);
  pthread_mutex_unlock(&c->mu);
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
  const int skip = atomic_load(&c->failed); /* the failing piece reports */
  unsigned char *buf = NULL;
  mc_sha256 *h = NULL;
  int rc = skip ? 0 : open_file(c, f);
  if (rc == 0 && !skip && (!(buf = take_buf(c)) || !(h = mc_sha256_begin())))
    rc = mc_error("%s: out of memory reading piece %" PRId64, pf->path, k);
  /* per read: 1. read, 2. add to the piece's hash, 3. land the shard bytes it holds */
  const int64_t R = c->read_bytes[f];
  for (int64_t p = 0; rc == 0 && !skip && p < len; p += R) {
    const int64_t n = len - p < R ? len - p : R;
    rc = read_range(c, f, buf, off + p, n);
    if (rc == 0) mc_sha256_update(h, buf, (size_t)n);
    if (rc == 0) rc = land_shards(c, f, buf, off + p, n, pf->path);
  }
  piece_read_done(c, f);
  char hex[65];
  if (h) mc_sha256_end(h, hex);
  if (rc == 0 && !skip && strcmp(hex, pf->pieces[k]) != 0) rc = mc_piece_mismatch(pf, k, hex);
  if (buf) give_buf(c, buf);
  if (rc != 0) {
    mc_piece_note_error(&c->mu, pf, k);
    atomic_store(&c->failed, 1);
  }
  return rc;
}

/* Sorts the shards by file and offset, refuses two of one file that overlap, and gives each
 * its hash state and landed flags. */
static int plan_shards(stream_ctx *c) {
  const int n_shards = c->n_shards;
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
  int64_t cells = 0;
  for (int k = 0; k < n_shards; k++) {
    const mc_stream_shard *s = &c->shards[k];
    shard_hash *st = &c->sh[k];
    pthread_mutex_init(&st->mu, NULL);
    const int64_t R = c->read_bytes[s->file];
    st->cell0 = s->offset / R;
    st->base = cells;
    cells += (s->offset + (s->bytes > 0 ? s->bytes : 1) - 1) / R - st->cell0 + 1;
  }
  c->landed = calloc((size_t)(cells > 0 ? cells : 1), 1);
  return c->landed ? 0 : mc_error("out of memory planning the read of %d datasets", n_shards);
}

int mc_stream_files(mc_piece_file *files, int n_files, mc_stream_shard *shards, int n_shards, int threads,
                    int64_t read_bytes, mc_stream_complete_fn complete, mc_stream_file_fn file_done, void *user) {
  threads = 2 * (threads < 1 ? 1 : threads); /* reads block: see the top of the file */
  stream_ctx c = {.files = files, .n_files = n_files, .shards = shards, .n_shards = n_shards, .complete = complete,
                  .user = user, .mu = PTHREAD_MUTEX_INITIALIZER};
  atomic_init(&c.failed, 0);
  const size_t ns = (size_t)(n_shards > 0 ? n_shards : 1), nf = (size_t)n_files + 1;
  c.order = malloc(ns * sizeof *c.order);
  c.file_first = malloc(nf * sizeof *c.file_first);
  c.job_first = malloc(nf * sizeof *c.job_first);
  c.sh = calloc(ns, sizeof *c.sh);
  c.temp = malloc(ns);
  c.free_bufs = malloc((size_t)threads * sizeof *c.free_bufs);
  c.fds = malloc(nf * sizeof *c.fds);
  c.reads_left = malloc(nf * sizeof *c.reads_left);
  c.read_bytes = malloc(nf * sizeof *c.read_bytes);
  int rc = 0;
  for (int f = 0; c.fds && c.reads_left && f < n_files; f++) c.fds[f] = -1, c.reads_left[f] = files[f].n_pieces;
  if (!c.order || !c.file_first || !c.job_first || !c.sh || !c.temp || !c.free_bufs || !c.fds || !c.reads_left || !c.read_bytes)
    rc = mc_error("out of memory planning the read of %d rank files", n_files);
  if (rc == 0) c.job_first[0] = 0;
  for (int f = 0; rc == 0 && f < n_files; f++) {
    files[f].err = NULL;
    files[f].err_piece = -1;
    c.job_first[f + 1] = c.job_first[f] + files[f].n_pieces;
    c.read_bytes[f] = read_size(files[f].piece_bytes, read_bytes);
    if (c.read_bytes[f] > c.buf_bytes) c.buf_bytes = c.read_bytes[f];
  }
  for (int k = 0; rc == 0 && k < n_shards; k++) {
    c.temp[k] = shards[k].dst == NULL;
    shards[k].err = NULL;
  }
  if (rc == 0) rc = plan_shards(&c);
  if (rc == 0 && c.job_first[n_files] > INT_MAX)
    rc = mc_error("%s and others: %" PRId64 " pieces to read, more than this MegaC can", files[0].path, c.job_first[n_files]);
  if (rc == 0) {
    /* the caller's thread: each file, once all its pieces matched, to file_done, in file order */
    mc_pool *p = mc_pool_start((int)c.job_first[n_files], threads, piece_job, &c);
    if (!p) rc = mc_error("out of memory starting %d reading threads", threads);
    for (int f = 0; p && f < n_files && file_done; f++) {
      int ok = 1;
      for (int64_t j = c.job_first[f]; j < c.job_first[f + 1] && ok; j++) ok = mc_pool_wait_job(p, (int)j) == 0;
      mc_error_clear();
      if (ok && !atomic_load(&c.failed)) file_done(user, f); /* no piece of it skipped */
    }
    if (p) rc = mc_pool_finish(p);
  }
  for (int i = 0; i < c.n_free; i++) free(c.free_bufs[i]);
  for (int k = 0; k < n_shards && c.temp && c.sh; k++) { /* what a failure left incomplete */
    if (c.sh[k].h) mc_sha256_end(c.sh[k].h, (char[65]){0});
    pthread_mutex_destroy(&c.sh[k].mu);
    if (c.temp[k]) {
      free(shards[k].dst);
      shards[k].dst = NULL;
    }
  }
  free(c.order);
  free(c.file_first);
  free(c.job_first);
  free(c.sh);
  free(c.landed);
  free(c.temp);
  free(c.free_bufs);
  free(c.fds);
  free(c.reads_left);
  free(c.read_bytes);
  pthread_mutex_destroy(&c.mu);
  return rc;
}
