/* Rank arithmetic and layout validation (docs/design.md section 3).
 * world = tp*dp*pp; rank = tp_rank + tp*(dp_rank + dp*pp_rank) (TP innermost). */
#ifndef MC_CORE_LAYOUT_H
#define MC_CORE_LAYOUT_H

#include <stdint.h>

#include "core/config.h"
#include "util/error.h"

/* Bounds on the sizes a configuration implies (mc_model_check, mc_layout_check; issue 17
 * item 9): ranks in a layout, parameters of a model, elements of one activation buffer. Far
 * above any machine, and low enough that every sum of sizes made of them fits in int64. */
#define MC_MAX_WORLD (1 << 20)
#define MC_MAX_PARAMS ((int64_t)1 << 56)
#define MC_MAX_BUF_ELEMS ((int64_t)1 << 42)

typedef struct {
  int rank;
  int tp_rank, dp_rank, pp_rank;
  int li;        /* index inside the stage: tp_rank + tp*dp_rank */
  int ep_rank;   /* li % ep: owns experts [ep_rank*E/ep, (ep_rank+1)*E/ep) */
  int ep_group;  /* li / ep: also this rank's index in its expert-data-parallel group */
} mc_coords;

int mc_layout_world(const mc_layout *l);
void mc_layout_coords(const mc_layout *l, int rank, mc_coords *c);
int mc_layout_rank_of(const mc_layout *l, int tp_rank, int dp_rank, int pp_rank);

/* Group membership, as lists of ranks in ascending order. Each returns the group size and
 * writes the members to `out` (capacity at least world). */
int mc_group_tp(const mc_layout *l, int rank, int *out);   /* same dp, pp */
int mc_group_dp(const mc_layout *l, int rank, int *out);   /* same tp, pp */
int mc_group_pp(const mc_layout *l, int rank, int *out);   /* same tp, dp */
int mc_group_ep(const mc_layout *l, int rank, int *out);   /* same stage, same li/ep */
int mc_group_edp(const mc_layout *l, int rank, int *out);  /* same stage, same ep_rank */

/* Checks every layout rule against the model and the training batch, recording each
 * broken rule with its numbers (e.g. "tp=3 does not divide n_kv_heads=4").
 * `train` may be NULL (skips batch rules); launched_world < 0 skips the world-size rule.
 * Returns the number of problems added. */
int mc_layout_check(const mc_model *m, const mc_layout *l, const mc_train_cfg *train,
                    int launched_world, mc_errlist *errs);
/* Model-only rules (block letters, dimension consistency). Returns problems added. */
int mc_model_check(const mc_model *m, mc_errlist *errs);


#endif
