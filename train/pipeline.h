/* Pipeline parallelism (parallel.pp > 1) on CPU ranks: each rank runs the layers of its stage
 * (core/stages.h) on a micro-batch; the boundary activation (the residual stream x,
 * [n_seq * T_res, d]) goes to the next stage and the boundary gradient (dx) back to the
 * previous one, point to point over the layout's pp group (mc_send / mc_recv, tag 2*mb for
 * activations and 2*mb + 1 for gradients of micro-batch mb). The first stage holds the
 * embedding, the last the final norm, head and loss (docs/design.md section 3; docs/parallel.md
 * "Pipeline parallel"). */
#ifndef MC_TRAIN_PIPELINE_H
#define MC_TRAIN_PIPELINE_H

#include <stdint.h>

#include "train/net.h"

/* One optimizer step's micro-batches under the 1F1B schedule: stage s runs
 * min(pp - s - 1, n_micro) warm-up forwards, then alternates one forward and one backward,
 * then the remaining backwards; it keeps the layer activations of at most min(pp - s, n_micro)
 * micro-batches (the slots mc_net_reserve_micro placed). tokens: n_micro micro-batches of
 * n_seq rows of seq_len + 1 ids, back to back (every rank passes them; the first stage uses
 * the inputs, the last the targets). Adds to the gradients as mc_net_forward_backward does
 * for each micro-batch; stats: this stage's sums over the micro-batches (cross-entropy on
 * the last stage, aux losses of the stage's E layers; tokens and sequences on every stage):
 * mc_dist_stats_sum completes them over the pp group. At pp = 1 it is the plain loop over
 * mc_net_forward_backward. */
int mc_net_pipeline_step(mc_net *net, const int32_t *tokens, int n_micro, int n_seq, double ce_weight,
                         double seq_weight, mc_net_stats *stats);

/* ---- used by train/net.c */
/* One micro-batch through every stage (forward, then backward; no overlap), as
 * mc_net_forward_backward / mc_net_forward do at pp > 1. */
int mc_pipe_forward_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight, double seq_weight,
                             mc_net_stats *stats);
int mc_pipe_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats);
/* The stage's compute (train/net.c): no communication with other stages. A non-first stage's
 * forward reads the boundary activation from the network's residual stream, a non-last
 * stage's backward the boundary gradient from its residual gradient. */
int mc_net_stage_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats);
int mc_net_stage_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight, double seq_weight);
/* Activations for micro-batches of n_seq sequences and the in-flight slots of n_micro. */
int mc_net_ensure_slots(mc_net *net, int n_seq, int n_micro);

#endif
