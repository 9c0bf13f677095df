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

typedef enum { MC_STATE_PARAM = 0, MC_STATE_EXP_AVG = 1, MC_STATE_EXP_AVG_SQ = 2, MC_N_STATES = 3 } mc_state;
const char *mc_state_name(mc_state s);
int mc_state_parse(const char *name); /* -1 if unknown */

/* Everything derived once from (model, layout): stage map and family registry. */
typedef struct {
  mc_model model;
  mc_layout layout;
  int world;
  mc_stage_map stages;
  mc_family_set fams;
} mc_geometry;

/* Validates model and layout (every broken rule reported) and builds the geometry.
 * `train` may be NULL; launched_world < 0 skips the world-size rule. */
int mc_geometry_build(const mc_model *m, const mc_layout *l, const mc_train_cfg *train,
                      int launched_world, mc_geometry *g);
void mc_geometry_free(mc_geometry *g);
int mc_family_stage(const mc_geometry *g, int fam);

typedef struct {
  int stage;        /* pipeline stage that owns the family */
  int in_stage;     /* the rank belongs to that stage */
  int ndim;
  /* The TP/EP-local slice the rank computes with (empty if not in_stage). */
  int64_t local_start[3], local_count[3];
  /* The hyperslab of the state the rank holds: the local slice, split on dim 0 over the
   * (expert-)data-parallel group when zero >= 1. count[0] may be 0 (nothing held). */
  int64_t start[3], count[3];
  int64_t numel;    /* elements held (product of count) */
  int held;         /* numel > 0 */
  int primary;      /* held, and the lowest rank among the ranks holding this hyperslab */
  int primary_rank; /* that lowest rank (-1 if not held) */
  int n_replicas;   /* ranks holding this exact hyperslab (0 if not held) */
  int zero_group;   /* size of the group the state is sharded over (1 if not sharded) */
  int zero_index;   /* this rank's index in that group */
} mc_shard;

/* THE ownership function. */
int mc_shard_of(const mc_geometry *g, int fam, mc_state state, int rank, mc_shard *out);

/* The ranks holding exactly the same hyperslab as `rank` (ascending; first is the primary).
 * Returns the count (0 if rank holds nothing). `out` needs room for g->world entries. */
int mc_shard_replicas(const mc_geometry *g, int fam, mc_state state, int rank, int *out);

/* Readable placement rule, e.g. "tp(dim=0) x zero(dim=0)", "replicated", "ep(dim=0)". */
void mc_placement_rule(const mc_geometry *g, int fam, char *buf, int cap);

#endif
