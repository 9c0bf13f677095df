/* Streaming execution of a reshard plan with bounded memory.
 *
 * Each (family, state) tensor is walked in bands of its global row-major order. A band is
 * at most `chunk_bytes`; the source pieces that fall in it are read into the band and the
 * target pieces are cut out of it. Because every shard is a box whose rows are visited in
 * increasing order, each source shard is read exactly once, front to back, and each target
 * shard is written exactly once, front to back: both are hashed on the fly (SHA-256), with no
 * second pass. Tensors run in parallel on `threads` workers (I/O and hashing overlap across
 * workers); peak memory is about threads * 2 * chunk_bytes, whatever the checkpoint's size.
 *
 * Values travel as fp32 (core/dtype.h), int64 counters as their bytes (never converted): the
 * reader widens a source of a narrower dtype
 * exactly, and a target whose dtype is not fp32 is narrowed (round to nearest even) before it
 * is hashed and written. Narrowing a widened value gives back its bytes, so a tensor kept in
 * its dtype is copied byte for byte.
 *
 * Where the bytes come from and go is the caller's (mc_rs_io): HDF5 checkpoints, a
 * safetensors file, memory in tests. */
#ifndef MC_RESHARD_EXECUTE_H
#define MC_RESHARD_EXECUTE_H

#include <stdint.h>

#include "reshard/plan.h"

typedef struct {
  void *ctx;
  /* Reads elements [off, off+n) of source shard s (index into plan->src), counted in the
   * shard's own row-major order. Called with increasing `off` for each shard; off and n are
   * always whole rows of the shard (multiples of the product of its count[1:]). A tensor
   * whose src_dtype is int64 (a counter) is read whole, as its stored bytes (n * 8 bytes at
   * buf), not as fp32. */
  int (*read)(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf);
  /* Writes elements [off, off+n) of target shard t (index into plan->targets); whole rows,
   * increasing `off`, as for read. `data` is them as stored: n little-endian elements of the
   * target tensor's dtype (fp32 unless the caller set another: mc_rs_tensor.dtype). */
  int (*write)(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const void *data);
  /* After the last element of source shard s: the SHA-256 of all its bytes (as stored: the
   * fp32 values read, narrowed to the tensor's src_dtype, which gives back exactly the stored
   * bytes since every stored value widens exactly). Returns -1 with
   * an error naming the shard when it does not match the recorded hash. May be NULL. */
  int (*src_done)(void *ctx, const mc_rs_plan *p, int s, const unsigned char sha[32]);
  /* After the last element of target shard t: the SHA-256 of all its bytes as stored (its
   * dtype). May be NULL. */
  int (*tgt_done)(void *ctx, const mc_rs_plan *p, int t, const unsigned char sha[32]);
} mc_rs_io;

typedef struct {
  int64_t chunk_bytes; /* band size; default 16 MiB */
  int threads;         /* <= 0: mc_rs_default_threads() */
  int progress;        /* 1: a progress bar on stderr (the caller checks for a terminal) */
  const char *label;   /* progress bar label */
} mc_rs_exec_opts;

typedef struct {
  int64_t bytes_read, bytes_written;
  double seconds;
} mc_rs_exec_stats;

/* Online CPUs, clamped to [2, 8]: hashing is the CPU work, and two workers already overlap
 * one's I/O with the other's hashing on a single core. */
int mc_rs_default_threads(void);

/* `g` is the geometry the plan's family indices refer to (either side: they agree).
 * On failure the first error is reported (naming the shard); nothing is left half-done on
 * the caller's side beyond what its callbacks wrote, which the caller discards. */
int mc_rs_execute(const mc_rs_plan *p, const mc_geometry *g, const mc_rs_io *io, const mc_rs_exec_opts *o,
                  mc_rs_exec_stats *st);

#endif
