/* Pipeline stage assignment for the three split modes (docs/design.md section 3). */
#ifndef MC_CORE_STAGES_H
#define MC_CORE_STAGES_H

#include "core/config.h"
#include "util/error.h"

/* The weighted split's memory bound: the fullest stage may hold at most this fraction more
 * than the fullest stage of the most memory-balanced split (docs/ownership.md). */
#define MC_SPLIT_MEM_SLACK 0.25

typedef struct {
  int pp;
  int first[MC_MAX_STAGES];      /* first global layer of stage s */
  int count[MC_MAX_STAGES];      /* layers in stage s (>= 1) */
  double cost[MC_MAX_STAGES];    /* forward FLOPs per token of stage s (embed/head included) */
  double bwd[MC_MAX_STAGES];     /* backward FLOPs per token of stage s (embed/head included) */
  double flops[MC_MAX_STAGES];   /* cost + bwd: the stage's time in the weighted split */
  double mem[MC_MAX_STAGES];     /* memory estimate, bytes per device (mc_stage_cost_of) */
  int stage_of_layer[MC_MAX_LAYERS];
} mc_stage_map;

/* Builds the stage map. equal: layer counts differ by at most one, earlier stages get the
 * extra layers; explicit: the pipes; weighted (docs/ownership.md, "Stage split"): with
 * F(split) = the largest stage `flops` and M(split) = the largest stage `mem` over contiguous
 * splits into pp non-empty stages,
 *   1. M* = min M(split);
 *   2. F* = min F(split) over the splits with M(split) <= (1 + MC_SPLIT_MEM_SLACK) M*;
 *   3. the split with the smallest M among those with F(split) = F* and the bound of 2;
 * remaining ties to the earliest boundaries (dynamic programming, exact). */
int mc_stage_map_build(const mc_model *m, const mc_layout *l, mc_stage_map *out);

/* The costs of stage s (of l->pp) holding layers [first, first + count): forward + backward
 * FLOPs per token (the embedding on stage 0, the final norm + head + loss on the last) and
 * the memory estimate in bytes per device (core/cost.h): the layers' state, their activations
 * times the micro-batches in flight under 1F1B (pp - s, as when n_micro >= pp), the
 * embedding's state on stage 0, the head's state and logits on the last. */
void mc_stage_cost_of(const mc_model *m, const mc_layout *l, int s, int first, int count, double *flops, double *mem);

#endif
