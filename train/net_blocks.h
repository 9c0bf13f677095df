/* Internals of the network (train/net.c) shared with the block files (train/block_*.c):
 * the network's state (struct mc_net: the single-rank computation; its parallel context,
 * net->par, is train/net_par.h), the per-layer state, the block table and the linear-layer
 * helpers. Every computation goes through the backend op table (kernels/ops.h); nothing here
 * touches tensor memory directly. */
#ifndef MC_TRAIN_NET_BLOCKS_H
#define MC_TRAIN_NET_BLOCKS_H

#include <stdint.h>

#include "core/blocks.h"
#include "core/holdings.h"
#include "kernels/ops.h"
#include "train/arena.h"
#include "train/net.h"
#include "train/net_par.h"

#define MC_LAYER_FBUFS MC_BLOCK_MAX_BUFS /* saved float activations per layer */
#define MC_LAYER_IBUFS 4                 /* saved int32 activations per layer (routing) */
#define MC_NET_GBUFS MC_BLOCK_MAX_BUFS   /* gradient scratch, shared by all layers (backward is sequential) */

/* One layer of the stack: its parameter indices by role and its saved activations. */
typedef struct {
  int layer;                 /* global layer index */
  char kind;                 /* 'A', 'M', 'E', 'R' */
  const mc_block_kind *bk;   /* its row of the block-kind table (core/blocks.h) */
  int p[MC_ROLE_COUNT];      /* index into net->params, -1 where the block has no such role */
  float *x_in, *u, *rstd;    /* residual input, normed input RMSNorm(x_in) * w, its rstd
                                (residual rows: under SP this rank's sequence shard) */
  mc_bf16 *u16;              /* mc_act16, blocks whose u feeds only matrix products (A, M, R,
                                a dense E): the normed input in bf16, written by the norm, and
                                u is NULL; else NULL */
  float *f[MC_LAYER_FBUFS];  /* block activations: bk->saved[i] (core/blocks.h) */
  int32_t *i[MC_LAYER_IBUFS]; /* bk->saved_i32[i] */
  /* Storage of f[i] and of the gradient scratch net->g[i] as this layer's kind uses it, set
   * once when the buffers are placed: bit i set = bf16 (in a buffer sized in floats). */
  unsigned f16, g16;
  /* MoE host-side results of the last forward */
  int32_t *counts_host;      /* [E] rows per expert */
  float *aux_host;           /* [n_seq] E * sum_e f_e P_e */
  int64_t dropped;
} mc_layer;

struct mc_net;

typedef struct {
  char kind;
  /* x += f(u): u = L->u is the normed input [n, d], x the residual stream. x NULL (full
   * recomputation): only the saved buffers are wanted, and the products that make nothing
   * but the output (the output projection, the MoE combine) are skipped. */
  int (*forward)(struct mc_net *net, mc_layer *L, int n_seq, float *x);
  /* du = d(objective)/du given dy = d(objective)/d(block output) [n, d] (du is written: the
   * block's first contribution sets it); adds parameter gradients. seq_weight scales the aux
   * loss (E blocks). */
  int (*backward)(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                  double seq_weight);
  /* Selective recomputation (train.recompute=selective): rebuilds the saved buffers the kind's
   * row does not mark keep_selective from those it does, with the forward's own ops on the
   * same operands (so the same bits); the normed input is already rebuilt and is not read. */
  int (*rebuild)(struct mc_net *net, mc_layer *L, int n_seq);
} mc_block_ops;

extern const mc_block_ops mc_block_attn, mc_block_mamba, mc_block_moe, mc_block_rec;

/* Whether the network's E blocks run as the plain SwiGLU (one expert, one choice, no drop
 * possible; train/block_moe.c). */
int mc_moe_is_dense(const struct mc_net *net);

struct mc_net {
  mc_backend *be;
  /* ---- precision (core/holdings.h): what this rank keeps in bf16 */
  /* bf16 matrix weights on a backend with bf16_weights, bf16 product activations (act16) with
   * them under every layout (mc_hold_opts.act16); moe_dense 1 (default): an E block of one expert and one choice that
   * cannot drop runs as the plain SwiGLU (train/block_moe.c), 0: always routed. */
  mc_hold_opts hold;
  int64_t dist_chunk; /* ZeRO 0/1: elements per chunk of the step's reduction and gather, packed
                         in the dist.staging arena (core/holdings.h mc_dist_staging_chunk; 0: none) */
  int reduce_in_bwd;   /* ZeRO 0/1: each set's gradients reduced as its backward ends
                          (mc_net_reduce_in_backward) */
  unsigned nb16;       /* bit MC_NB_x set: network buffer x is bf16, as placed under hold */
  uint64_t seed;       /* of the parameter initialisation (mc_net_param_initial redraws it) */
  /* One allocation per category: working params by placement class, gradients and (once
   * mc_net_reserve or the first pass sized them) activations; the tensors below and the
   * staging rows of par point into them; ZeRO 3's gathered layers in zero3.buffers, ZeRO
   * 0/1's reduction and gather packs in dist.staging. The NCCL backend's own staging of host
   * buffers and uneven counts is not in them. */
  mc_arenas arenas;
  mc_geometry geo;     /* private copy (families owned) */
  int rank;
  mc_model m;          /* the model with this rank's local widths (heads, inner widths / tp) */
  int n_params;
  mc_net_param *params;
  int n_layers;
  mc_layer *layers;
  int fam_embed, fam_final_norm, fam_head; /* param indices */
  int n_seq_cap;       /* activations are allocated for this many sequences */
  /* ---- recomputation (train.recompute, net->hold.recompute): the buffers the policy does not
   * keep (core/holdings.h mc_act_buf_kept) of every layer and slot are placed in one working
   * set, ws, shared by the layers: a layer's forward writes them there, and its backward
   * first rebuilds them (train/net.c layer_recompute). ws_poison (environment
   * MC_RECOMPUTE_POISON=1, for tests): ws is filled with NaN before each rebuild, so a buffer
   * the rebuild misses cannot pass for a kept one. */
  float *ws;
  int64_t ws_bytes;
  int ws_poison;
  /* ---- pipeline stage (train/pipeline.h): layers [L0, L1) of the global stack are this
   * rank's (all of them at pp = 1); first / last: the stage holds the embedding / the final
   * norm, head and loss. Under 1F1B a stage keeps the layer activations of n_slots
   * micro-batches at once: slots[k * (L1 - L0) + i] holds layer L0 + i's buffers of slot k
   * (n_slots > 1 only; net->layers then holds the slot in use, cur_slot). */
  int stage, L0, L1, first, last;
  int n_slots, cur_slot;
  mc_layer *slots;
  int32_t *tok_in, *tok_tgt;  /* [n] backend copies of inputs and targets */
  float *x;            /* [nl, d] residual stream (nl = n, or this rank's shard under SP) */
  float *hf, *rstd_f;  /* final norm output [n, d] (gathered under SP) and rstd [nl] */
  float *logits;       /* [n, Vpl] this rank's vocabulary columns */
  float *loss, *lse;   /* [n] */
  float *dx;           /* [nl, d] running residual gradient */
  float *du;           /* [n, d] gradient of a block's input (whole rows for a split block) */
  float *y;            /* [n, d] a block's partial output under TP (forward); under mc_act16
                          the bf16 copy of a block's output gradient (mc_dy_in, backward) */
  int dy_in_y;         /* set around a block's backward when its output gradient is already
                          in y as bf16 (SP gathered it so): mc_dy_in reads it there */
  /* A split block's backward under TP (train/net.c, mc_in_projs_bwd): its input gradient's sum
   * over the group is started on the side queue once the input products have formed it
   * (du_sum: wanted, started, ticket), and under SP the gather of its whole normed input runs
   * on the side queue from the block's start (u_side: pending, ticket, where it lands), the
   * layer's u and u16 being NULL until the weight products wait for it. */
  struct { int wanted, started, ticket, n_seq; } du_sum;
  struct { int pending, ticket; float *u; mc_bf16 *u16; } u_side;
  float *full;         /* [n, d] whole rows: the final norm output's gradient; under TP also
                          gathered or to-be-scattered rows */
  float *dlogits;      /* [n, Vpl] */
  float *g[MC_NET_GBUFS];
  float *loss_host;    /* [n] */
  mc_net_par par;      /* the parallel layout and its staging (train/net_par.h) */
};

/* Working weight / gradient of a layer's role (mc_w: an fp32 weight, not a matrix weight that
 * may be stored in bf16; those go through mc_wm). */
static inline float *mc_w(struct mc_net *net, const mc_layer *L, mc_role r) { return net->params[L->p[r]].w; }
static inline float *mc_g(struct mc_net *net, const mc_layer *L, mc_role r) { return net->params[L->p[r]].g; }

/* Zeroes a gradient buffer and returns it (backward ops accumulate). */
static inline float *mc_zeroed(mc_backend *be, float *p, int64_t n) {
  be->fill(be, p, n, 0.0f);
  return p;
}

/* Matrix-product operands as stored (kernels/ops.h mc_operand): fp32, or bf16 (the matrix
 * weights, and activations kept in bf16 for the products, under train.dtype=bf16). */
static inline mc_operand mc_param_mat(const mc_net_param *p) { return (mc_operand){p->w, p->w16}; }
static inline mc_operand mc_wm(struct mc_net *net, const mc_layer *L, mc_role r) { return mc_param_mat(&net->params[L->p[r]]); }
static inline mc_operand mc_f32(const float *x) { return (mc_operand){x, NULL}; }
static inline mc_operand mc_b16(const void *x) { return (mc_operand){NULL, (const mc_bf16 *)x}; }
/* Op outputs as stored (kernels/ops.h mc_dst): fp32, or bf16 in a buffer sized in floats. */
static inline mc_dst mc_o32(float *x) { return (mc_dst){x, NULL}; }
static inline mc_dst mc_o16(void *x) { return (mc_dst){NULL, (mc_bf16 *)x}; }
/* Whether the activations and gradients that feed only products, gated units, RoPE or
 * attention are kept in bf16 (docs/cuda.md): bf16 working weights (the products round their
 * inputs anyway), under every layout (core/holdings.h mc_hold_opts.act16). Set once at creation (net->hold). */
static inline int mc_act16(const struct mc_net *net) { return net->hold.act16; }
/* A layer's saved buffer i and the gradient scratch i as that layer uses them, in the storage
 * set when they were placed (L->f16, L->g16): as an op input, as an op output, and as a
 * gradient output (a bf16 one is written by its op, an fp32 one accumulates into the buffer
 * zeroed here). */
static inline int mc_saved_bf16(const mc_layer *L, int i) { return (L->f16 >> i) & 1u; }
static inline int mc_scratch_bf16(const mc_layer *L, int i) { return (L->g16 >> i) & 1u; }
static inline mc_operand mc_saved_in(const mc_layer *L, int i) {
  return mc_saved_bf16(L, i) ? mc_b16(L->f[i]) : mc_f32(L->f[i]);
}
static inline mc_dst mc_saved_out(const mc_layer *L, int i) { return mc_saved_bf16(L, i) ? mc_o16(L->f[i]) : mc_o32(L->f[i]); }
static inline mc_operand mc_scratch_in(const struct mc_net *net, const mc_layer *L, int i) {
  return mc_scratch_bf16(L, i) ? mc_b16(net->g[i]) : mc_f32(net->g[i]);
}
static inline mc_dst mc_scratch_out(const struct mc_net *net, const mc_layer *L, int i) {
  return mc_scratch_bf16(L, i) ? mc_o16(net->g[i]) : mc_o32(net->g[i]);
}
static inline mc_dst mc_scratch_grad(const struct mc_net *net, const mc_layer *L, int i, int64_t n) {
  if (mc_scratch_bf16(L, i)) return mc_o16(net->g[i]);
  net->be->fill(net->be, net->g[i], n, 0.0f);
  return mc_o32(net->g[i]);
}
/* A network buffer (core/holdings.h mc_net_bufs) as an op input or output, in its storage. */
static inline mc_operand mc_netbuf_in(const struct mc_net *net, int nb, const float *buf) {
  return (net->nb16 >> nb) & 1u ? mc_b16(buf) : mc_f32(buf);
}
static inline mc_dst mc_netbuf_out(const struct mc_net *net, int nb, float *buf) {
  return (net->nb16 >> nb) & 1u ? mc_o16(buf) : mc_o32(buf);
}
/* Rounds x (n elements) into the bf16 buffer h and returns it as a product operand. */
static inline mc_operand mc_to16(mc_backend *be, const float *x, mc_bf16 *h, int64_t n) {
  be->to_bf16(be, x, h, n);
  return (mc_operand){NULL, h};
}
/* A layer's normed input as its products read it (u16 where kept, else u). */
static inline mc_operand mc_uin(const mc_layer *L) { return L->u16 ? (mc_operand){NULL, L->u16} : mc_f32(L->u); }

/* gemm on operands and result as stored (gemm for all fp32, else gemm_ex). */
static inline void mc_gemm_m(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                             mc_operand B, int ldb, float beta, mc_dst C, int ldc) {
  if (A.h || B.h || C.h) be->gemm_ex(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else be->gemm(be, ta, tb, M, N, K, alpha, A.f, lda, B.f, ldb, beta, C.f, ldc);
}

/* y[n, out] = u[n, in] W[out, in]^T + beta * y (a bf16 y: beta 0) */
static inline void mc_linear_fwd(mc_backend *be, mc_operand u, mc_operand W, int n, int in, int out, float beta,
                                 mc_dst y) {
  mc_gemm_m(be, 0, 1, n, out, in, 1.0f, u, in, W, in, beta, y, out);
}

/* dW[out, in] += dy^T u */
static inline void mc_linear_bwd_w(mc_backend *be, mc_operand u, mc_operand dy, int n, int in, int out, float *dW) {
  mc_gemm_m(be, 1, 0, out, in, n, 1.0f, dy, out, u, in, 1.0f, mc_o32(dW), in);
}
/* du[n, in] = dy W + du_beta * du, du as stored (du_beta 0 for the first contribution to du,
 * 1 to add; a bf16 du takes 0) */
static inline void mc_linear_bwd_x(mc_backend *be, mc_operand W, mc_operand dy, int n, int in, int out, mc_dst du,
                                   float du_beta) {
  mc_gemm_m(be, 0, 0, n, in, out, 1.0f, dy, out, W, in, du_beta, du, in);
}
/* Both: dW[out, in] += dy^T u;  du[n, in] = dy W + du_beta * du. */
static inline void mc_linear_bwd(mc_backend *be, mc_operand u, mc_operand W, mc_operand dy, int n, int in, int out,
                                 mc_dst du, float du_beta, float *dW) {
  mc_linear_bwd_w(be, u, dy, n, in, out, dW);
  mc_linear_bwd_x(be, W, dy, n, in, out, du, du_beta);
}

/* One input projection of a column-parallel block (A, M, R): p = u W^T [n, out] from the
 * block's normed input u [n, d]; dp its output gradient, as the block formed it. */
typedef struct {
  mc_operand W, dp;
  int out;
  float *dW;
} mc_in_proj;
/* The backward of a block's input projections, in list order: du = sum_i dp_i W_i (fp32),
 * then dW_i += dp_i^T u. The input gradient is finished first so that under TP its sum over
 * the group runs on the side queue beside the weight products, and under SP those products
 * are the only readers of the whole input u, gathered on the side queue meanwhile
 * (train/net.c). The values are those of mc_linear_bwd on each projection in turn. */
int mc_in_projs_bwd(struct mc_net *net, mc_layer *L, const mc_in_proj *p, int k, int n, float *du);

/* A block's output gradient as its products read it: under mc_act16 rounded once into the
 * free net->y (used as the TP partial output only) for blocks that multiply it twice. */
static inline mc_operand mc_dy_in(struct mc_net *net, const float *dy, int64_t n) {
  if (net->dy_in_y) return (mc_operand){NULL, (mc_bf16 *)net->y};
  return mc_act16(net) ? mc_to16(net->be, dy, (mc_bf16 *)net->y, n) : mc_f32(dy);
}

#endif
