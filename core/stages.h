/* Pipeline stage assignment for the three split modes (docs/design.md section 3). */
#ifndef MC_CORE_STAGES_H
#define MC_CORE_STAGES_H

#include "core/config.h"
#include "util/error.h"

typedef struct {
  int pp;
  int first[MC_MAX_STAGES];      /* first global layer of stage s */
  int count[MC_MAX_STAGES];      /* layers in stage s (>= 1) */
  double cost[MC_MAX_STAGES];    /* cost-model FLOPs per token of stage s (embed/head included) */
  int stage_of_layer[MC_MAX_LAYERS];
} mc_stage_map;

/* Builds the stage map. equal: layer counts differ by at most one, earlier stages get the
 * extra layers; weighted: contiguous split minimising the most expensive stage under the
 * cost model (core/cost.h), ties to the earliest boundary; explicit: the pipes. */
int mc_stage_map_build(const mc_model *m, const mc_layout *l, mc_stage_map *out);

#endif
