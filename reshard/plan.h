/* The reshard planner: for every primary shard of the target layout, the pieces of the
 * source layout's primary shards that feed it. Both sides come from mc_shard_of (the one
 * ownership function), so offline resharding and load-time resharding agree. */
#ifndef MC_RESHARD_PLAN_H
#define MC_RESHARD_PLAN_H

#include <stdint.h>

#include "core/box.h"
#include "core/ownership.h"
#include "util/error.h"

/* A primary shard of one side: the rank that writes it and its hyperslab (global coords). */
typedef struct {
  int rank;
  int n_replicas;
  mc_box slab;
} mc_rs_shard;

/* One piece: the part of source shard `src` (index into plan.src) that lands in a target. */
typedef struct {
  int src;
  mc_box slab; /* global coordinates; inside both the source and the target shard */
} mc_rs_piece;

typedef struct {
  int tensor;   /* index into plan.tensors */
  mc_rs_shard shard;
  int first_piece, n_pieces;
} mc_rs_target;

/* One (family, state) pair: its source primaries and target primaries, contiguous. */
typedef struct {
  int fam;
  mc_state state;
  int first_src, n_src;
  int first_tgt, n_tgt;
  /* Element dtypes (mc_elem_dtype, core/dtype.h) of its source and target shards: what the
   * source's bytes are hashed as, and what the target is stored and hashed as. The planner
   * sets both to float32; the caller sets them from the checkpoint (mc_rs_source_dtypes) and
   * any conversion (mcreshard --state-dtype). */
  int src_dtype, dtype;
} mc_rs_tensor;

typedef struct {
  int n_tensors;
  mc_rs_tensor *tensors;
  int n_src;
  mc_rs_shard *src;
  int n_targets;
  mc_rs_target *targets;
  int n_pieces;
  mc_rs_piece *pieces;
  int64_t bytes;          /* fp32 bytes of all primaries (same on both sides: they tile); the
                           * stored bytes are fewer where a side's dtype is narrower */
  int n_src_writers;      /* ranks that own at least one source primary */
  int n_dst_writers;      /* ranks that own at least one target primary */
} mc_rs_plan;

/* Records every difference between two models as a problem ("model change: d_model 64 ->
 * 128; a reshard keeps the model"). Returns the number of problems added. */
int mc_rs_model_diff(const mc_model *src, const mc_model *dst, mc_errlist *errs);

/* The primaries of one (family, state) under a geometry, ascending by rank. Returns the
 * count; `out` needs room for g->world entries. */
int mc_rs_primaries(const mc_geometry *g, int fam, mc_state state, mc_rs_shard *out);

/* Bit mask of the state kinds a plan moves: 1u << MC_STATE_PARAM etc. A mask names kinds,
 * not tensors: a family contributes only the kinds its optimizer declares (core/optim_groups.h),
 * so MC_RS_ALL_STATES moves AdamW families' moments and Muon families' momentum. */
#define MC_RS_ALL_STATES ((1u << MC_N_STATES) - 1u)

/* Builds the plan for the state kinds in `states` that each family has. Fails (naming the
 * tensor) if the models differ, if a family's optimizer differs between the two geometries,
 * or if some target shard is not covered exactly by source pieces. */
int mc_rs_plan_build(const mc_geometry *src, const mc_geometry *dst, unsigned states, mc_rs_plan *out);
void mc_rs_plan_free(mc_rs_plan *p);

#endif
