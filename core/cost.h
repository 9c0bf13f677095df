/* Per-block cost model, shared by the weighted stage split and the planner: FLOPs per token
 * (forward and backward) and a per-device memory estimate of a layer, the embedding and the
 * head that depends on the model and the layout only (docs/ownership.md, "Stage split"). */
#ifndef MC_CORE_COST_H
#define MC_CORE_COST_H

#include "core/config.h"

/* Forward FLOPs per token of one block (including its pre-norm), counting a multiply-add as
 * 2 FLOPs, with causal attention at its average context of (T+1)/2 keys. */
double mc_block_fwd_flops(const mc_model *m, char block);
/* Backward FLOPs per token of one block: its kind's bwd_flops (core/blocks.h): 2x the forward
 * products and elementwise terms, 2.5x the attention core. */
double mc_block_bwd_flops(const mc_model *m, char block);
/* The embedding: the lookup's forward is a gather (0 FLOPs); its backward scatter-adds the
 * gradient rows, d FLOPs per token. */
double mc_embed_fwd_flops(const mc_model *m);
double mc_embed_bwd_flops(const mc_model *m);
/* Forward FLOPs per token of the final norm + head + softmax/cross-entropy, and their backward
 * (norm 2x, head product 2x: input and weight gradients, softmax/cross-entropy 2x). */
double mc_head_fwd_flops(const mc_model *m);
double mc_head_bwd_flops(const mc_model *m);
/* Whole-model training FLOPs per token: 3x forward (forward + 2x backward) of the blocks and
 * the head, the MFU numerator (model FLOPs; unchanged by the backward model above). */
double mc_model_train_flops_per_token(const mc_model *m);
/* Forward + backward FLOPs per token of every block, the embedding and the head: what the
 * pipeline stages' costs (mc_stage_map.flops) add up to. Differs from the MFU numerator by the
 * attention backward's recomputed scores and the embedding's gradient scatter. */
double mc_model_fwd_bwd_flops_per_token(const mc_model *m);

/* Memory estimate, bytes per device, from the model and the layout only (no training
 * settings: the stage map must be the same whatever the batch or dtype). Reference settings:
 * fp32 weights, no recomputation, one sequence per micro-batch.
 * State: every parameter of the block (its pre-norm included) at its TP/EP-local size, 16
 * bytes an element (working weight, gradient, two AdamW moments), the moments divided over
 * the ZeRO group (dp; tp*dp/ep for experts) at zero >= 1, all 16 at zero 3. */
double mc_block_state_bytes(const mc_model *m, const mc_layout *l, char block);
/* Activations one layer keeps for its backward, per sequence in flight: the residual input,
 * normed input and 1/rms plus its kind's saved buffers (block-kind table) that exist for that
 * layout, fp32, at the TP-local widths (residual rows T/tp under SP). */
double mc_block_act_bytes(const mc_model *m, const mc_layout *l, char block);
/* The embedding's state (first stage), the final norm + head's state (last stage) and the
 * head's activations held once (the logits and their gradient for one sequence). */
double mc_embed_state_bytes(const mc_model *m, const mc_layout *l);
double mc_head_state_bytes(const mc_model *m, const mc_layout *l);
double mc_head_act_bytes(const mc_model *m, const mc_layout *l);

#endif
