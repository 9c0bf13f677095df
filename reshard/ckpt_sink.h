/* The target side of a reshard: rank files written in the checkpoint library's format
 * (docs/checkpoint.md), one dataset per target primary shard, its space allocated when the
 * file is made (of its tensor's element dtype, mc_rs_tensor.dtype: docs/checkpoint.md,
 * "Element dtypes"), filled in streamed row ranges by pwrite at its data offset, and given its
 * attributes (ownership, SHA-256) when the sink finishes. Only one HDF5 file is open at a
 * time, so memory does not grow with the number of rank files.
 *
 * The checkpoint library's own writer takes whole shards from memory; resharding must not
 * hold a shard whole, so this writer streams. It writes the same datasets and attributes.
 *
 * Fault injection for tests: MC_RESHARD_FAULT=fail:<bytes> makes the write that crosses
 * <bytes> fail with an error; crash:<bytes> makes the process exit at once (status 3),
 * as if killed, without any clean-up. */
#ifndef MC_RESHARD_CKPT_SINK_H
#define MC_RESHARD_CKPT_SINK_H

#include "ckpt/checkpoint.h"
#include "reshard/execute.h"

typedef struct mc_rs_sink mc_rs_sink;

/* Creates <step_dir>/rank_<R>.h5 for every rank owning a target primary, and every dataset. */
int mc_rs_sink_create(const char *step_dir, const mc_geometry *dst, const mc_rs_plan *p, int64_t step,
                      mc_rs_sink **out);
/* Executor callbacks; ctx is an mc_rs_io_ctx whose sink is the mc_rs_sink. */
int mc_rs_sink_write(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const void *data);
int mc_rs_sink_done(void *ctx, const mc_rs_plan *p, int t, const unsigned char sha[32]);
/* Adds the shard attributes, closes and fsyncs every file; fails if some target was not
 * completed. `p` is the plan the sink was created for. */
int mc_rs_sink_finish(mc_rs_sink *s, const mc_rs_plan *p);
/* Frees (closing whatever is open); files stay on disk for the caller to remove. */
void mc_rs_sink_free(mc_rs_sink *s);

#endif
