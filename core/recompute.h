/* Recomputation's cost: the forward FLOPs a layer runs again before its backward under a
 * recompute policy (train.recompute). Derived from the two definitions the trainer follows:
 * which buffers the policy drops (mc_act_buf_kept, core/holdings.h) and which part of the
 * block's forward makes each buffer (mc_fwd_part, core/blocks.h). The trainer rebuilds every
 * dropped buffer by rerunning the part that makes it (train/net.c layer_recompute): the norm
 * whenever the normed input is dropped, the parts after the projections under selective, all
 * but the output part under full. Model FLOPs (the MFU numerator) never include this; hardware
 * FLOPs do. */
#ifndef MC_CORE_RECOMPUTE_H
#define MC_CORE_RECOMPUTE_H

#include "core/blocks.h"
#include "core/config.h"

/* The `routed` argument below: 0, the stage's E blocks run the plain SwiGLU; 1, they route
 * tokens (mc_act_shape.routed), which decides which buffers exist; MC_ROUTED_EXCHANGED, they
 * route and exchange their rows over the EP group (ep > 1): the experts' received rows, h1,
 * h3 and SwiGLU output then live in moe.scratch, which every policy but full keeps, so
 * selective does not rebuild the SwiGLU (train/block_moe.c moe_rebuild). */
#define MC_ROUTED_EXCHANGED 2

/* Whether policy r reruns part p of a layer of `block` (1) or not (0). */
int mc_recompute_reruns(char block, mc_fwd_part p, int routed, mc_recompute r);

/* Forward FLOPs per token that one layer of `block` runs again under policy r: the sum of the
 * parts it reruns (0 under none, or for an unknown letter). */
double mc_block_recompute_flops(const mc_model *m, char block, int routed, mc_recompute r);

/* The same summed over n layers given by block letters (a stage's part of the pattern). */
double mc_recompute_flops(const mc_model *m, const char *blocks, int n, int routed, mc_recompute r);

#endif
