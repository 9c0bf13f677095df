/* The block-kind table: one row per kind of layer (A attention, M Mamba-2 mixer, E mixture of
 * experts, R gated recurrence) giving what every part of the system needs to know about it:
 *   - its families (after the layer's pre-norm), with placement, TP split dimension and
 *     initialisation (core/families.c builds the registry from them);
 *   - its model and TP rules (core/layout.c validates with them);
 *   - its forward and backward FLOPs per token (the cost model of the weighted stage split and
 *     the planner);
 *   - its activation buffers: what a layer keeps for backward and the gradient scratch its
 *     backward uses, each with its rows, width and storage type. The trainer allocates exactly
 *     these (train/net.c), the holdings function counts exactly these (core/holdings.c).
 * Adding a block kind is one row here plus its kernels and its block file in train/.
 * Widths are those of the model a rank computes with: TP-split widths are already divided by
 * tp (mc_model_local). */
#ifndef MC_CORE_BLOCKS_H
#define MC_CORE_BLOCKS_H

#include <stdint.h>

#include "core/config.h"
#include "core/families.h"
#include "util/error.h"

/* A width (or shape dimension) of a model. */
typedef enum {
  MC_DIM_NONE = 0, /* ends a shape */
  MC_DIM_ONE,
  MC_DIM_D,        /* d_model */
  MC_DIM_VP,       /* padded vocabulary (in activation buffers: the rank's slice, Vp / tp) */
  MC_DIM_Q,        /* n_heads * head_dim */
  MC_DIM_KV,       /* n_kv_heads * head_dim */
  MC_DIM_H,        /* n_heads */
  MC_DIM_KVH,      /* n_kv_heads */
  MC_DIM_DI,       /* mamba_inner */
  MC_DIM_HM,       /* Mamba heads, mamba_inner / mamba_head_dim */
  MC_DIM_N,        /* ssm_state */
  MC_DIM_CONV,     /* conv_width */
  MC_DIM_E,        /* n_experts */
  MC_DIM_K,        /* top_k */
  MC_DIM_F,        /* expert_hidden */
  MC_DIM_KD,       /* top_k * d_model: one row per (token, choice) */
  MC_DIM_KF,       /* top_k * expert_hidden */
  MC_DIM_DR,       /* rec_width */
} mc_dim;

int64_t mc_dim_of(const mc_model *m, mc_dim d);

/* The model one TP rank computes with: heads and inner widths divided by tp. */
mc_model mc_model_local(const mc_model *m, int tp);

/* One family of a block, in registry order. */
typedef struct {
  mc_role role;
  mc_place place;
  int split_dim; /* TP: 0 or 1; EP: 0; replicated: -1 */
  mc_init init;
  mc_dim shape[3];
} mc_block_family;

/* The parts of a block's forward, in the order it runs them. Each saved buffer of the kind is
 * made by one part: the products from the normed input (and what routing derives from the
 * router's product) make the buffers marked keep_selective, everything after them (gates,
 * convs, scans, the attention core) the others. The norm makes the layer's normed input and
 * its 1/rms; the output part (the output projection, or the plain SwiGLU's down product) makes
 * only the block's output, which no buffer holds. Recomputation reruns a part exactly when
 * the policy drops a buffer it makes (core/recompute.h). */
typedef enum { MC_PART_NORM, MC_PART_PROJ, MC_PART_INNER, MC_PART_OUT, MC_N_PARTS } mc_fwd_part;

/* Rows of an activation buffer, for a micro-batch of n_seq sequences of T positions. */
typedef enum {
  MC_ROWS_TOKENS, /* n_seq * T */
  MC_ROWS_SEQS,   /* n_seq */
  MC_ROWS_ONE,    /* one row */
  MC_ROWS_RESIDUAL, /* n_seq * T_res: the residual stream's rows (a sequence shard under SP) */
} mc_rows;

/* How a buffer's elements are stored. */
typedef enum {
  MC_STORE_F32,  /* fp32 */
  MC_STORE_PROD, /* a tensor that feeds only products, gated units, RoPE or attention: bf16 when
                    the network keeps such tensors in bf16 (mc_hold_opts.act16), else fp32 */
  MC_STORE_I32,  /* int32 (routing) */
} mc_store;

/* When a buffer exists: every condition of the mask holds (0: always). */
enum {
  MC_IF_ALWAYS = 0,
  MC_IF_ROUTED = 1,     /* in a block that routes tokens (E, unless it runs as the plain SwiGLU) */
  MC_IF_NOT_ROUTED = 2, /* in any other block */
  MC_IF_ACT16 = 4,      /* product tensors are kept in bf16 */
  MC_IF_TP = 8,         /* tp > 1 */
  MC_IF_SP = 16,        /* sequence parallelism (tp > 1) */
  MC_IF_FIRST = 32,     /* the stage holds the embedding */
  MC_IF_LAST = 64,      /* the stage holds the final norm, head and loss */
  MC_IF_NO_EP = 128,    /* ep = 1: under expert parallelism an E block's expert rows live with
                           its exchange plan in moe.scratch (train/dist_ep.c) instead */
  MC_IF_ROUTED_NO_EP = MC_IF_ROUTED | MC_IF_NO_EP,
};

typedef struct {
  const char *name;
  mc_rows rows;
  mc_dim width;
  mc_store store;
  unsigned when;  /* MC_IF_* mask */
  /* Saved buffers: 1 if selective recomputation keeps it (a projection's output the backward
   * cannot cheaply redo), 0 if selective recomputation drops it (redone from the kept ones).
   * Full recomputation keeps none of them. Unused for gradient scratch. */
  int keep_selective;
} mc_act_buf;

#define MC_BLOCK_MAX_BUFS 24

/* Saved activations and gradient scratch, by kind; the train/block_*.c files index L->f,
 * L->i and net->g with these. */
enum { MC_A_Q, MC_A_K, MC_A_V, MC_A_O, MC_A_LSE, MC_A_NSAVED };
enum { MC_A_DO, MC_A_DQ, MC_A_DK, MC_A_DV, MC_A_DQP, MC_A_DKP, MC_A_DV16, MC_A_NGRADS };
enum { MC_M_Z, MC_M_XR, MC_M_XC, MC_M_BR, MC_M_BC, MC_M_CR, MC_M_CC, MC_M_DTP, MC_M_DT, MC_M_Y, MC_M_GN, MC_M_GRSTD,
       MC_M_NSAVED };
enum { MC_M_DGN, MC_M_DZ, MC_M_DY, MC_M_DXC, MC_M_DXR, MC_M_DBC, MC_M_DBR, MC_M_DCC, MC_M_DCR, MC_M_DDT, MC_M_DDTP,
       MC_M_NGRADS };
/* E: floats, then int32 (indexed separately, L->i) */
enum { MC_E_LOGITS, MC_E_PROBS, MC_E_GATE, MC_E_FR, MC_E_AUX, MC_E_XP, MC_E_H1, MC_E_H3, MC_E_A, MC_E_YP, MC_E_NSAVED };
enum { MC_E_IDX, MC_E_SLOT, MC_E_COUNTS, MC_E_DROPPED, MC_E_NSAVED_I32 };
enum { MC_E_DYP, MC_E_DA, MC_E_DH1, MC_E_DH3, MC_E_DXP, MC_E_DGATE, MC_E_DLOGITS, MC_E_NGRADS };
enum { MC_R_XB, MC_R_GP, MC_R_RP, MC_R_R, MC_R_IP, MC_R_GX, MC_R_H, MC_R_O, MC_R_NSAVED };
enum { MC_R_DO, MC_R_DGP, MC_R_DH, MC_R_DGX, MC_R_DR, MC_R_DRP, MC_R_DIP, MC_R_DXB, MC_R_NGRADS };

typedef struct {
  char letter;
  const char *name;
  int routes;      /* routes tokens to experts (its MC_IF_ROUTED buffers may exist) */
  int n_families;
  const mc_block_family *families;
  /* Model rules of the kind (dimensions present and consistent), recorded with their numbers. */
  void (*check_model)(const mc_model *m, mc_errlist *e);
  /* The TP rule: the model widths tp must divide (up to 2, named as in messages), and the
   * width ep must divide (MC_DIM_NONE: the kind has no expert-parallel families). */
  int n_tp_divides;
  const char *tp_divides_name[2];
  mc_dim tp_divides[2];
  mc_dim ep_divides;
  /* Forward FLOPs per token of one part (a multiply-add is 2 FLOPs); the forward is the sum
   * of the parts (routed, mc_block_fwd_flops). routed: the block routes tokens (its
   * MC_IF_ROUTED buffers exist); an E block that does not (the plain SwiGLU) runs no router
   * product, and its down product makes only the output (output part) where a routed one's
   * makes expert_output (projections). */
  double (*part_flops)(const mc_model *m, mc_fwd_part part, int routed);
  /* Backward FLOPs per token: 2x the forward products and elementwise terms, 2.5x the
   * attention core (the fused backward recomputes the scores); core/blocks.c says why. */
  double (*bwd_flops)(const mc_model *m);
  int n_saved;                 /* float buffers kept per layer (L->f) */
  const mc_act_buf *saved;
  int n_saved_i32;             /* int32 buffers kept per layer (L->i) */
  const mc_act_buf *saved_i32;
  int n_grads;                 /* gradient scratch (net->g, shared by the layers) */
  const mc_act_buf *grads;
} mc_block_kind;

/* The row of a block letter, or NULL for an unknown letter. */
const mc_block_kind *mc_block_kind_of(char letter);
/* The known letters, in table order ("AMER"). */
const char *mc_block_letters(void);

#endif
