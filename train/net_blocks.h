/* Internals of the network (train/net.c) shared with the block files (train/block_*.c):
 * the per-layer state, the block table and the linear-layer helpers. Every computation goes
 * through the backend op table (kernels/ops.h); nothing here touches tensor memory directly. */
#ifndef MC_TRAIN_NET_BLOCKS_H
#define MC_TRAIN_NET_BLOCKS_H

#include <stdint.h>

#include "kernels/ops.h"
#include "train/net.h"

#define MC_LAYER_FBUFS 24 /* saved float activations per layer */
#define MC_LAYER_IBUFS 4  /* saved int32 activations per layer (routing) */
#define MC_NET_GBUFS 24   /* gradient scratch, shared by all layers (backward is sequential) */

/* One layer of the stack: its parameter indices by role and its saved activations. */
typedef struct {
  int layer;                 /* global layer index */
  char kind;                 /* 'A', 'M', 'E', 'R' */
  int p[MC_ROLE_COUNT];      /* index into net->params, -1 where the block has no such role */
  float *x_in, *u, *rstd;    /* residual input, normed input RMSNorm(x_in) * w, its rstd */
  float *f[MC_LAYER_FBUFS];  /* block activations (meaning fixed by each block file) */
  int32_t *i[MC_LAYER_IBUFS];
  /* MoE host-side results of the last forward */
  int32_t *counts_host;      /* [E] rows per expert */
  float *aux_host;           /* [n_seq] E * sum_e f_e P_e */
  int64_t dropped;
} mc_layer;

/* Buffer sizes (elements) of a block for n tokens; unused entries stay 0. */
typedef struct {
  int64_t f[MC_LAYER_FBUFS], i[MC_LAYER_IBUFS], g[MC_NET_GBUFS];
} mc_block_sizes;

struct mc_net;

typedef struct {
  char kind;
  void (*sizes)(const mc_model *m, int n_seq, mc_block_sizes *s);
  /* x += f(u): u = L->u is the normed input [n, d], x the residual stream. */
  int (*forward)(struct mc_net *net, mc_layer *L, int n_seq, float *x);
  /* du += d(objective)/du given dy = d(objective)/d(block output) [n, d]; adds parameter
   * gradients. seq_weight scales the aux loss (E blocks). */
  int (*backward)(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                  double seq_weight);
} mc_block_ops;

extern const mc_block_ops mc_block_attn, mc_block_mamba, mc_block_moe, mc_block_rec;

struct mc_net {
  mc_backend *be;
  mc_geometry geo;     /* private copy (families owned) */
  int rank;
  mc_model m;
  int n_params;
  mc_net_param *params;
  int n_layers;
  mc_layer *layers;
  int fam_embed, fam_final_norm, fam_head; /* param indices */
  int n_seq_cap;       /* activations are allocated for this many sequences */
  int32_t *tok_in, *tok_tgt;  /* [n] backend copies of inputs and targets */
  float *x;            /* [n, d] residual stream */
  float *hf, *rstd_f;  /* final norm output and rstd */
  float *logits;       /* [n, Vp] */
  float *loss, *lse;   /* [n] */
  float *dx;           /* [n, d] running residual gradient */
  float *du;           /* [n, d] gradient of a layer's normed input */
  float *g[MC_NET_GBUFS];
  float *loss_host;    /* [n] */
};

/* Working weight / gradient of a layer's role. */
static inline float *mc_w(struct mc_net *net, const mc_layer *L, mc_role r) { return net->params[L->p[r]].w; }
static inline float *mc_g(struct mc_net *net, const mc_layer *L, mc_role r) { return net->params[L->p[r]].g; }

/* Zeroes a gradient buffer and returns it (backward ops accumulate). */
static inline float *mc_zeroed(mc_backend *be, float *p, int64_t n) {
  be->fill(be, p, n, 0.0f);
  return p;
}

/* y[n, out] = u[n, in] W[out, in]^T + beta * y */
static inline void mc_linear_fwd(mc_backend *be, const float *u, const float *W, int n, int in,
                                 int out, float beta, float *y) {
  be->gemm(be, 0, 1, n, out, in, 1.0f, u, in, W, in, beta, y, out);
}

/* dW[out, in] += dy^T u;  du[n, in] += dy W (skipped when du is NULL). */
static inline void mc_linear_bwd(mc_backend *be, const float *u, const float *W, const float *dy,
                                 int n, int in, int out, float *du, float *dW) {
  be->gemm(be, 1, 0, out, in, n, 1.0f, dy, out, u, in, 1.0f, dW, in);
  if (du) be->gemm(be, 0, 0, n, in, out, 1.0f, dy, out, W, in, 1.0f, du, in);
}

#endif
