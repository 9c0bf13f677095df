/* Ownership: the one function that says which slice of which family and state a rank holds
 * and whether it is the primary copy (docs/design.md section 3). Training (and the slices it
 * asks a checkpoint load for), save, reshard, audit and the planner (through core/holdings.h)
 * all call mc_shard_of; nothing else re-derives ownership. */
#ifndef MC_CORE_OWNERSHIP_H
#define MC_CORE_OWNERSHIP_H

#include <stdint.h>

#include "core/config.h"
#include "core/families.h"
#include "core/layout.h"
#include "core/stages.h"

/* The state kinds a checkpoint can hold of a family: its fp32 master weight (param, every
 * family) and the states its optimizer group declares (core/optim_groups.h: AdamW's two
 * moments and step counter, Muon's momentum). The number of a kind is part of the format: it
 * picks the primary replica (step 3 of mc_shard_of), so kinds are only ever appended. */
typedef enum {
  MC_STATE_PARAM = 0,
  MC_STATE_EXP_AVG = 1,
  MC_STATE_EXP_AVG_SQ = 2,
  MC_STATE_MOMENTUM = 3,
  MC_STATE_STEP = 4,
  MC_N_STATES = 5
} mc_state;
const char *mc_state_name(mc_state s);
int mc_state_parse(const char *name); /* -1 if unknown */

/* A kind's shape and placement rules are fixed by the kind (core/optim_groups.h declares them
 * with it), so ownership needs no optimizer to answer them. Two pairs exist:
 *   shape "param", placement "param": the parameter's shape, the parameter's hyperslab on
 *     every rank (param and every moment);
 *   shape "scalar", placement "replicated" (step): one element, stored as shape [1]; held
 *     whole by every rank that holds a nonempty hyperslab of the family's param (so of every
 *     state shaped like it), the lowest of those ranks its primary (mc_shard_of). */
int mc_state_is_scalar(mc_state s);
/* The global shape of state kind s of a family of `ndim` extents fam_shape: the family's shape,
 * or [1] for a scalar kind. Returns the number of dimensions. */
int mc_state_shape(int ndim, const int64_t *fam_shape, mc_state s, int64_t shape[3]);
/* The stride of the primary-replica formula (3*family + state): fixed at the number of kinds
 * format version 2 knew, so that adding kinds moves no existing checkpoint's primaries. */
#define MC_PRIMARY_FAMILY_STRIDE 3

/* Ownership rules (layout.own_rule; docs/ownership.md states each exactly). The value 0 is
 * the rule of every new layout; a checkpoint records its rule by name, never by number.
 * MC_OWN_BALANCED_V2 ("balanced-v2", every new layout and checkpoint): a ZeRO-sharded state is
 *   split on its split dimension k (mc_zero_split_dim): dim 0 when the local slice has at
 *   least g rows, else the first dimension k whose prefix product D0*...*Dk reaches g. With
 *   k = 0 the parts are the balanced rule's below. With k > 0 the m = D0*...*D(k-1) cells
 *   (one index of each dimension before k) get g/m members each (the first g % m cells one
 *   more), in member order, and each cell's members split its extent Dk in balanced parts
 *   (rotation rot mod the cell's member count): every part is a box and one contiguous run
 *   of the row-major local slice, parts consecutive in member order. No dimension reaches g
 *   (fewer elements than members): k = 0. Primaries as under MC_OWN_BALANCED.
 * MC_OWN_BALANCED ("balanced", checkpoints of format version 2 before balanced-v2): split on
 *   dim 0 in balanced parts, q = rows / g each and one more row for the r = rows % g members
 *   at positions rot, rot+1, ..., rot+r-1 (mod g) of the group, where rot is the family's
 *   rotation (mc_zero_rotation); member i holds rows [b(i), b(i+1)), b(i) = i*q + (extra rows
 *   of members < i); the primary of a hyperslab held by n replicas is the replica at position
 *   (3*family + state) % n of their ascending list.
 * MC_OWN_CHUNKED ("chunked", format version 1, docs/design.md section 3): chunk = ceil(rows /
 *   g), member i holds rows [i*chunk, min((i+1)*chunk, rows)); the primary is the lowest
 *   replica. */
typedef enum { MC_OWN_BALANCED_V2 = 0, MC_OWN_BALANCED = 1, MC_OWN_CHUNKED = 2, MC_OWN_N_RULES = 3 } mc_own_rule;
const char *mc_own_rule_name(int rule); /* "balanced-v2", "balanced", "chunked" */
int mc_own_rule_parse(const char *name); /* -1 if unknown */

/* Everything derived once from (model, layout): stage map and family registry. */
typedef struct {
  mc_model model;
  mc_layout layout;  /* layout.own_rule: the ownership rule */
  int world;
  mc_stage_map stages;
  mc_family_set fams;
  int *zero_rot;     /* per family: mc_zero_rotation (owned like fams; freed by mc_geometry_free) */
} mc_geometry;

/* Validates model and layout (every broken rule reported) and builds the geometry.
 * `train` may be NULL; launched_world < 0 skips the world-size rule. With `train`, the
 * families' optimizers come from train->optim.groups (core/optim_groups.h); without it every
 * family is AdamW's until the caller assigns them (mc_optim_groups_assign: a reader of a
 * checkpoint assigns the checkpoint's groups). */
int mc_geometry_build(const mc_model *m, const mc_layout *l, const mc_train_cfg *train,
                      int launched_world, mc_geometry *g);
/* The geometry of a recorded configuration (a checkpoint's) under `layout` (NULL: cfg->parallel):
 * model and layout checked as by mc_geometry_build without training settings, the families'
 * optimizers assigned from cfg->train.optim.groups. What a reader of a checkpoint builds. */
int mc_geometry_of_config(const mc_config *cfg, const mc_layout *layout, mc_geometry *g);
void mc_geometry_free(mc_geometry *g);
int mc_family_stage(const mc_geometry *g, int fam);

typedef struct {
  int stage;        /* pipeline stage that owns the family */
  int in_stage;     /* the rank belongs to that stage */
  int ndim;
  /* The TP/EP-local slice the rank computes with (empty if not in_stage). */
  int64_t local_start[3], local_count[3];
  /* The hyperslab of the state the rank holds: the local slice, split over the
   * (expert-)data-parallel group when zero >= 1 (mc_zero_part: on zero_dim). count[0] may be
   * 0 (nothing held). */
  int64_t start[3], count[3];
  int64_t numel;    /* elements held (product of count) */
  int held;         /* numel > 0 */
  int primary;      /* held, and the rank that writes this hyperslab (one of its replicas: the
                       lowest under MC_OWN_CHUNKED, spread over them under the balanced rules) */
  int primary_rank; /* that rank (-1 if not held) */
  int n_replicas;   /* ranks holding this exact hyperslab (0 if not held) */
  int zero_group;   /* size of the group the state is sharded over (1 if not sharded) */
  int zero_index;   /* this rank's index in that group */
  int zero_dim;     /* the dimension the group splits (mc_zero_split_dim; 0 if not sharded) */
} mc_shard;

/* THE ownership function. For a scalar kind (mc_state_is_scalar) the shard is [0, 1) of its
 * [1] shape: ndim 1, local_* and start/count 0 and 1, held by the family's param holders,
 * zero_group 1; n_replicas counts every holder and the primary is the lowest. */
int mc_shard_of(const mc_geometry *g, int fam, mc_state state, int rank, mc_shard *out);

/* The rotation of the balanced rules for family `fam`: which member of the ZeRO group gets
 * the first of the family's extra rows. The extra rows are dealt round robin over the group in
 * registry order, separately for dense families (DP group) and experts (expert-DP group):
 * rot(f) = (sum of e(f') over the earlier families f' of f's kind) % g, where e(f') = rows %
 * g with rows the TP/EP-local slice's dim 0 (under balanced-v2, for a family split on k > 0:
 * Dk % (members of cell 0)). Depends on the layout, not on the rank. */
int mc_zero_rotation(const mc_geometry *g, int fam);

/* Rows [*lo, *hi) of `rows` that member `index` of a ZeRO group of `size` holds under a
 * dim-0 rule (MC_OWN_BALANCED, or MC_OWN_CHUNKED, which ignores rot; MC_OWN_BALANCED_V2 is
 * treated as MC_OWN_BALANCED: its parts when it splits dim 0). Members hold consecutive
 * ranges in member order. */
void mc_zero_rows(int rule, int64_t rows, int size, int index, int rot, int64_t *lo, int64_t *hi);

/* The dimension a ZeRO group of `size` splits a local slice of extents local[0..ndim-1]
 * along under `rule` (0 except under MC_OWN_BALANCED_V2, see above). */
int mc_zero_split_dim(int rule, int ndim, const int64_t *local, int size);

/* The part member `index` of a ZeRO group of `size` holds of a local slice of extents
 * local[0..ndim-1] under `rule` with rotation `rot`: the box lo[d], cnt[d] (relative to the
 * local slice; cnt[0] may be 0: nothing held). Returns the split dimension. Under every rule
 * the part is one contiguous run of the row-major local slice and the parts of members
 * 0, 1, ... follow each other in that order, tiling the slice. */
int mc_zero_part(int rule, int ndim, const int64_t *local, int size, int index, int rot, int64_t *lo, int64_t *cnt);

/* The ranks holding exactly the same hyperslab as `rank` (ascending; the primary is one of them).
 * Returns the count (0 if rank holds nothing). `out` needs room for g->world entries. */
int mc_shard_replicas(const mc_geometry *g, int fam, mc_state state, int rank, int *out);

/* Readable placement rule, e.g. "tp(dim=0) x zero(dim=0)", "replicated", "ep(dim=0)"; the
 * ZeRO part is "zero(dim=0)" under MC_OWN_CHUNKED, "zero_balanced(dim=0)" under
 * MC_OWN_BALANCED, "zero_balanced_v2(dim=K)" under MC_OWN_BALANCED_V2 (K: the split dim). */
void mc_placement_rule(const mc_geometry *g, int fam, char *buf, int cap);

#endif
