/* mcreshard's engine: a committed checkpoint rewritten for a new layout into a new run
 * directory, streamed, hash-verified and committed atomically.
 *
 * The target is built inside "<dst>.reshard.tmp" through the checkpoint library's own save
 * and commit protocol (mc_ckpt_save with a barrier hook: the streamed rank files are written
 * where a cooperating process would write its own, then the library reads them back, builds
 * and checks the manifest, renames step_<N>.tmp into place and writes `latest`). The finished
 * run directory is then renamed to <dst>. After a crash at any point, <dst> is either absent
 * or complete; with --force an existing <dst> is replaced only after the new one is done. */
#ifndef MC_RESHARD_RESHARD_H
#define MC_RESHARD_RESHARD_H

#include <stdint.h>

#include "reshard/ckpt_source.h"
#include "reshard/plan.h"

typedef struct {
  int64_t chunk_bytes; /* executor band size (default 16 MiB) */
  int threads;         /* executor workers (<= 0: mc_rs_default_threads()) */
  int progress;        /* progress bar on stderr */
  int force;           /* replace an existing destination */
} mc_rs_opts;

typedef struct {
  int64_t bytes_read, bytes_written;
  double seconds;      /* whole operation, open to commit */
  double copy_seconds; /* the streaming part */
  long peak_rss_kb;    /* getrusage ru_maxrss of the process */
  int n_src_shards, n_dst_shards, n_dst_files;
} mc_rs_summary;

/* "Refuses an existing destination unless force": the check, for callers to run early. */
int mc_rs_check_destination(const char *dst, int force);

/* Builds the target geometry for the source model and optimizer groups (every layout rule
 * checked, all broken ones listed) and the plan for the states the source stores, each target
 * in its source's element dtype (a caller converting a state kind sets its tensors' dtype). */
int mc_rs_prepare(mc_rs_source *src, const mc_layout *target, mc_geometry *dst_g, mc_rs_plan *plan);

/* Streams plan into a new run directory `dst` and commits it. */
int mc_rs_write(mc_rs_source *src, const mc_geometry *dst_g, const mc_rs_plan *plan, const char *dst,
                const mc_rs_opts *o, mc_rs_summary *sum);

/* Any source: `read` and `src_done` (may be NULL) are executor callbacks that receive an
 * mc_rs_io_ctx whose src is `src_ctx`; cfg and state are recorded in the new manifest. */
int mc_rs_write_from(int (*read)(void *, const mc_rs_plan *, int, int64_t, int64_t, float *),
                     int (*src_done)(void *, const mc_rs_plan *, int, const unsigned char *), void *src_ctx,
                     const mc_config *cfg, const mc_train_state *state, const mc_geometry *dst_g,
                     const mc_rs_plan *plan, const char *dst, const mc_rs_opts *o, mc_rs_summary *sum);

/* The world-size-1 layout (tp = pp = dp = ep = 1, zero 0, no sp). */
void mc_rs_consolidated_layout(mc_layout *l);

/* Prints the closing summary ("read 1.2 GiB, wrote 1.2 GiB in 3.1 s, 0.80 GB/s, peak RSS ..."). */
void mc_rs_summary_print(const mc_rs_summary *s, const char *what);
long mc_rs_peak_rss_kb(void);

#endif
