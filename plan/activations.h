/* Activation memory model: what a forward pass keeps for backward, per block type and
 * recompute policy, on one rank for one micro-batch. The per-token formulas are listed in
 * docs/mcplan.md; activations.c is their only implementation. */
#ifndef MC_PLAN_ACTIVATIONS_H
#define MC_PLAN_ACTIVATIONS_H

#include <stdint.h>

#include "core/config.h"

/* One micro-batch as one rank sees it. */
typedef struct {
  int64_t tokens;     /* micro_batch * seq_len (TP-split tensors cover all of them) */
  int64_t tokens_seq; /* tokens / tp under SP, else tokens: tokens of TP-replicated tensors */
  int tp;
  int abytes;         /* bytes per activation element (2 for bf16, 4 for fp32) */
  int pbytes;         /* bytes per element of the activations the trainer keeps in bf16 under
                         train.dtype=bf16 (the normed input of A, M, R and plain E layers; an A
                         layer's q, k, v and attention output; an M layer's z and norm(g); an R
                         layer's u w_x^T, u w_gate^T and gated output; an E layer's dispatched
                         input, h1, h3 and SwiGLU output; the final-norm output): abytes unless the caller sets it (mcplan: 2 where the trainer
                         keeps them in bf16) */
} mc_act_shape;

void mc_act_shape_of(const mc_model *m, const mc_layout *l, int micro_batch, int abytes,
                     mc_act_shape *s);

/* Bytes one layer of block type `block` ('A', 'M', 'E', 'R') keeps for backward. */
int64_t mc_act_block_bytes(const mc_model *m, const mc_act_shape *s, char block, mc_recompute r);
/* First stage: the token ids the embedding backward reads. */
int64_t mc_act_embed_bytes(const mc_act_shape *s);
/* Last stage: final norm, head and loss (fp32 logits, labels). */
int64_t mc_act_head_bytes(const mc_model *m, const mc_act_shape *s, mc_recompute r);

/* Gradient scratch of one block's backward (the trainer shares it between layers). */
int64_t mc_act_bwd_scratch_bytes(const mc_model *m, const mc_act_shape *s, char block);
/* The backward's working set, held once (not per micro-batch in flight): the scratch of the
 * largest block of the stage's kinds (`blocks`, a pattern string) and the residual stream's
 * working rows (x unless the head counts it as the final norm's input, its gradient, a block
 * input's gradient, a block's output, gathered rows, the TP/SP staging rows), the tokens and
 * the per-token loss. */
int64_t mc_act_working_bytes(const mc_model *m, const mc_layout *l, const mc_act_shape *s, const char *blocks,
                             int has_head);

/* MoE routing scratch of one E layer for one micro-batch (freed before the next layer). */
typedef struct {
  int64_t assignments; /* (token, expert) pairs this rank's experts receive, as sized */
  int64_t counts;      /* per-expert counts, per-peer send/receive counts, token->slot index */
  int64_t send;        /* dispatch buffer: this rank's tokens, one row per assignment */
  int64_t recv;        /* receive buffer: rows this rank's experts process */
  int64_t combine;     /* combine buffer: expert outputs on their way back */
  int64_t total;
} mc_moe_scratch;

void mc_act_moe_scratch(const mc_model *m, const mc_layout *l, const mc_act_shape *s,
                        mc_moe_scratch *out);

#endif
