/* Per-block cost model, shared by the weighted stage split and the planner. */
#ifndef MC_CORE_COST_H
#define MC_CORE_COST_H

#include "core/config.h"

/* Forward FLOPs per token of one block (including its pre-norm), counting a multiply-add as
 * 2 FLOPs, with causal attention at its average context of (T+1)/2 keys. */
double mc_block_fwd_flops(const mc_model *m, char block);
/* Forward FLOPs per token of the embedding lookup (0) and of the final norm + head. */
double mc_head_fwd_flops(const mc_model *m);
/* Whole-model training FLOPs per token: 3x forward (forward + 2x backward). */
double mc_model_train_flops_per_token(const mc_model *m);

#endif
