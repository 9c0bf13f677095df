/* The data of a save's rank files, written outside the HDF5 library: HDF5 allocates every
 * contiguous dataset up front (mc_h5_create_rank_file), then a pool of threads writes each
 * shard's bytes at its offset with pwrite and hashes them as it goes. HDF5 is one global lock,
 * so its H5Dwrite let one thread write at a time; pwrite lets every I/O thread write at once.
 * Chunked (compressed) shards are hashed here and written through HDF5 when the file is
 * finished (mc_h5_finish_rank_file). */
#define _GNU_SOURCE /* sync_file_range, fallocate */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "core/dtype.h"
#include "util/error.h"

/* Bytes written then hashed at a time: few system calls, and the hash reads what was just
 * copied into the page cache while it is still in the CPU cache. */
#define PIECE_BYTES ((int64_t)4 << 20)

typedef struct {
  mc_shard_attrs *attrs;
  const void *const *data;
  const int64_t *offsets; /* per shard: where its data goes, -1: not written here */
  const int *file_of;     /* per shard: its file */
  const int *first;       /* per file: its first shard; first[n_files] = n */
  const int *fd;          /* per file */
  char (*paths)[MC_PATH_MAX];
  const int *order;       /* job -> shard */
} pw_ctx;

static int pwrite_all(int fd, const char *p, int64_t len, int64_t at, const char *path, const char *dataset) {
  while (len > 0) {
    ssize_t w = pwrite(fd, p, (size_t)len, (off_t)at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return mc_error("%s: writing dataset %s failed: %s", path, dataset, w < 0 ? strerror(errno) : "nothing written");
    p += w, at += w, len -= w;
  }
  return 0;
}

/* Job j: writes (when it has an offset) and hashes one shard. */
static int shard_job(void *vctx, int j) {
  const pw_ctx *c = vctx;
  const int i = c->order[j], f = c->file_of[i];
  mc_ckpt_shard *s = &c->attrs[i].s;
  const char *path = c->paths[f];
  const char *p = (const char *)c->data[i];
  const int64_t bytes = s->numel * (int64_t)mc_elem_dtype_size(s->dtype), at = c->offsets[i];
  mc_sha256 *h = mc_sha256_begin();
  if (!h) return mc_error("%s: out of memory hashing dataset %s", path, s->dataset);
  int rc = 0;
  for (int64_t done = 0; done < bytes && rc == 0; done += PIECE_BYTES) {
    const int64_t len = bytes - done < PIECE_BYTES ? bytes - done : PIECE_BYTES;
    if (at >= 0) {
      rc = pwrite_all(c->fd[f], p + done, len, at + done, path, s->dataset);
      /* Start the disk on these pages now rather than at the fsync (best effort). */
      if (rc == 0) sync_file_range(c->fd[f], (off_t)(at + done), (off_t)len, SYNC_FILE_RANGE_WRITE);
    }
    if (rc == 0) mc_sha256_update(h, p + done, (size_t)len);
  }
  mc_sha256_end(h, s->sha256);
  if (rc == 0 && i == c->first[f] && mc_ckpt_fault("write_data"))
    rc = mc_error_context("%s: writing dataset %s", path, s->dataset);
  return rc;
}

/* HDF5 leaves the allocated data of a new file as a hole. Threads writing shards at once into
 * a hole get its blocks in the order their writes reach the disk: the file ends up in 8 MiB
 * extents scattered over its region, and a later sequential read of it jumps back and forth
 * (about 20% slower than a file written in order, on the device machine's virtio disk). The
 * blocks are reserved here, in file order, before any data is written. Best effort: a file
 * system without fallocate (EOPNOTSUPP) is written as before; glibc's posix_fallocate is not
 * used, since it would emulate that by writing every block twice. */
static void reserve_blocks(int fd) {
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > 0) (void)fallocate(fd, 0, 0, st.st_size);
}

typedef struct {
  int file;
  int64_t bytes;
  int shard;
} job_key;

/* Files in order; within a file, the largest shards first, so that no big shard starts last
 * and leaves the other threads idle. */
static int job_order(const void *a, const void *b) {
  const job_key *x = a, *y = b;
  if (x->file != y->file) return x->file - y->file;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->shard - y->shard;
}

int mc_write_rank_files(const char *dir, int64_t step, mc_shard_attrs *attrs, const void *const *data, int n,
                        int threads, int deflate) {
  int n_files = 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || attrs[i].s.rank != attrs[i - 1].s.rank) n_files++;
  const size_t nn = (size_t)(n > 0 ? n : 1), nf = (size_t)n_files + 1;
  int64_t *offsets = malloc(nn * sizeof *offsets);
  int *file_of = malloc(nn * sizeof *file_of), *order = malloc(nn * sizeof *order), *job_of = malloc(nn * sizeof *job_of);
  int *first = malloc(nf * sizeof *first), *fd = malloc(nf * sizeof *fd);
  char(*paths)[MC_PATH_MAX] = malloc(nf * sizeof *paths);
  job_key *keys = malloc(nn * sizeof *keys);
  int rc = 0;
  if (!offsets || !file_of || !order || !job_of || !first || !fd || !paths || !keys) {
    rc = mc_error("out of memory preparing the write of %d checkpoint shards", n);
    n_files = 0; /* nothing to close below */
  }
  for (int k = 0, i = 0; rc == 0 && i <= n; i++)
    if (i == n || i == 0 || attrs[i].s.rank != attrs[i - 1].s.rank) fd[k] = -1, first[k++] = i;
  /* 1. every file and dataset, under HDF5, one thread; then a descriptor for the data */
  for (int k = 0; k < n_files && rc == 0; k++) {
    const int b = first[k], e = first[k + 1];
    for (int i = b; i < e; i++) file_of[i] = k, keys[i] = (job_key){k, attrs[i].s.numel * (int64_t)mc_elem_dtype_size(attrs[i].s.dtype), i};
    rc = mc_path_join(paths[k], dir, attrs[b].s.file);
    if (rc == 0) rc = mc_h5_create_rank_file(paths[k], step, attrs[b].s.rank, attrs + b, e - b, deflate, offsets + b);
    if (rc == 0 && (fd[k] = open(paths[k], O_WRONLY | O_CLOEXEC)) < 0)
      rc = mc_error("%s: cannot open for writing: %s", paths[k], strerror(errno));
    if (rc == 0) reserve_blocks(fd[k]);
  }
  /* 2. the data, on the pool; 3. each file finished once all of its shards are written */
  mc_pool *pool = NULL;
  if (rc == 0) {
    qsort(keys, (size_t)n, sizeof *keys, job_order);
    for (int j = 0; j < n; j++) order[j] = keys[j].shard, job_of[keys[j].shard] = j;
    pw_ctx ctx = {attrs, data, offsets, file_of, first, fd, paths, order};
    pool = mc_pool_start(n, threads, shard_job, &ctx);
    if (!pool) rc = mc_error("out of memory starting %d writing threads", threads);
    for (int k = 0; k < n_files && rc == 0; k++) {
      for (int i = first[k]; i < first[k + 1] && rc == 0; i++) rc = mc_pool_wait_job(pool, job_of[i]);
      if (rc == 0 && close(fd[k]) != 0) rc = mc_error("%s: closing failed: %s", paths[k], strerror(errno));
      fd[k] = -1;
      if (rc == 0) rc = mc_h5_finish_rank_file(paths[k], attrs + first[k], data + first[k], first[k + 1] - first[k]);
    }
    if (rc && pool) mc_pool_cancel(pool);
    /* ctx lives in this block: the workers are joined before it ends */
    if (pool && mc_pool_finish(pool) != 0 && rc == 0) rc = -1;
  }
  for (int k = 0; k < n_files; k++)
    if (fd[k] >= 0) close(fd[k]);
  free(offsets);
  free(file_of);
  free(order);
  free(job_of);
  free(first);
  free(fd);
  free(paths);
  free(keys);
  return rc;
}
