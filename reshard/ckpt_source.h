/* The source side of a reshard: a committed checkpoint opened through the checkpoint
 * library, its geometry rebuilt from the manifest, and a reader that streams each source
 * shard front to back for the executor. Before any byte is read, every shard the plan needs
 * is matched to its manifest record (same family, state, rank and hyperslab) and its HDF5
 * attributes are checked against that record. The executor hashes what it reads; src_done
 * compares with the manifest's SHA-256 and names the file and dataset on mismatch. */
#ifndef MC_RESHARD_CKPT_SOURCE_H
#define MC_RESHARD_CKPT_SOURCE_H

#include "ckpt/checkpoint.h"
#include "reshard/execute.h"

typedef struct mc_rs_source mc_rs_source;

/* Opens a run directory (follows latest) or a step directory. */
int mc_rs_source_open(const char *path, mc_rs_source **out);
/* The same from the manifest alone (mc_ckpt_open_opts.metadata_only): the rank files are not
 * looked at, so only planning works (mcreshard --dry-run); mc_rs_source_bind fails naming the
 * first rank file it cannot open. */
int mc_rs_source_open_metadata(const char *path, mc_rs_source **out);
void mc_rs_source_close(mc_rs_source *s);
mc_ckpt *mc_rs_source_ckpt(mc_rs_source *s);
const mc_geometry *mc_rs_source_geometry(const mc_rs_source *s);
const mc_config *mc_rs_source_config(const mc_rs_source *s);
/* The state kinds the checkpoint stores, as an MC_RS_ALL_STATES-style mask (a kind is in it
 * when some family stores it; which families have it is their optimizer's, mc_family_has_state
 * on the geometry, whose optimizers come from the recorded optim.groups). */
unsigned mc_rs_source_states(const mc_rs_source *s);

/* An index of the manifest's shards: idx[(family * MC_N_STATES + state) * world + rank] is
 * the shard's index for mc_ckpt_shard_at, or -1 (families as in g). Caller frees. */
int mc_rs_shard_index(mc_ckpt *ck, const mc_geometry *g, int **idx);

/* Sets every tensor's src_dtype to the element dtype the checkpoint stores it in (the
 * manifest's declaration; core/dtype.h), so the executor hashes the source's bytes as stored.
 * Call after mc_rs_plan_build on this source's geometry; leaves dtype (the target's) alone. */
void mc_rs_source_dtypes(mc_rs_source *s, mc_rs_plan *p);

/* Matches the plan's source shards to the manifest and checks their attributes (and that the
 * plan's src_dtype of each is the stored one). */
int mc_rs_source_bind(mc_rs_source *s, const mc_rs_plan *p);
/* Executor callbacks (read, src_done); ctx is an mc_rs_io_ctx whose src is the mc_rs_source.
 * read gives fp32 values: a shard of a narrower dtype is widened exactly. */
int mc_rs_source_read(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf);
int mc_rs_source_done(void *ctx, const mc_rs_plan *p, int s, const unsigned char sha[32]);

/* The context the executor passes to the callbacks: the source side's state (an
 * mc_rs_source for checkpoints) and the sink's. */
typedef struct {
  void *src;
  void *sink;
} mc_rs_io_ctx;

/* Hex of a SHA-256 digest. */
void mc_rs_hex(const unsigned char sha[32], char hex[65]);

#endif
