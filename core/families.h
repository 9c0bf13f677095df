/* The family registry: every logical, global tensor of a model (unfused), with its global
 * shape, placement rule, optimizer group and initialisation rule (docs/design.md section 2). */
#ifndef MC_CORE_FAMILIES_H
#define MC_CORE_FAMILIES_H

#include <stdint.h>

#include "core/config.h"

typedef enum { MC_PLACE_REPLICATED = 0, MC_PLACE_TP = 1, MC_PLACE_EP = 2 } mc_place;

/* What a family is inside its block; the model code looks tensors up by (layer, role). */
typedef enum {
  MC_ROLE_EMBED, MC_ROLE_FINAL_NORM, MC_ROLE_HEAD, MC_ROLE_NORM,
  MC_ROLE_ATTN_WQ, MC_ROLE_ATTN_WK, MC_ROLE_ATTN_WV, MC_ROLE_ATTN_WO,
  MC_ROLE_SSM_WZ, MC_ROLE_SSM_WX, MC_ROLE_SSM_WDT, MC_ROLE_SSM_WB, MC_ROLE_SSM_WC,
  MC_ROLE_SSM_CONVX_W, MC_ROLE_SSM_CONVX_B, MC_ROLE_SSM_CONVB_W, MC_ROLE_SSM_CONVB_B,
  MC_ROLE_SSM_CONVC_W, MC_ROLE_SSM_CONVC_B, MC_ROLE_SSM_DT_BIAS, MC_ROLE_SSM_A_LOG,
  MC_ROLE_SSM_D, MC_ROLE_SSM_NORM, MC_ROLE_SSM_WOUT,
  MC_ROLE_MOE_ROUTER, MC_ROLE_MOE_W1, MC_ROLE_MOE_W3, MC_ROLE_MOE_W2,
  MC_ROLE_REC_WX, MC_ROLE_REC_WGATE, MC_ROLE_REC_WR, MC_ROLE_REC_WI,
  MC_ROLE_REC_BR, MC_ROLE_REC_BI, MC_ROLE_REC_LAMBDA, MC_ROLE_REC_WOUT,
  MC_ROLE_COUNT
} mc_role;

/* How the initial value is drawn (counter-based RNG keyed by seed, family, element index). */
typedef enum {
  MC_INIT_NORMAL,     /* N(0, init_std^2) */
  MC_INIT_NORMAL_OUT, /* N(0, (init_std/sqrt(2*n_layers))^2): projections into the residual */
  MC_INIT_ONES,
  MC_INIT_ZEROS,
  MC_INIT_A_LOG,      /* log(1 + h % 16) for head h (A in [-16, -1]) */
  MC_INIT_DT_BIAS,    /* softplus^-1 of dt log-uniform in [1e-3, 1e-1] */
  MC_INIT_REC_LAMBDA, /* so that a = exp(-8 softplus(lambda)) lies in [0.9, 0.999] */
  MC_INIT_CONV,       /* N(0, 1/K) for a depthwise conv of width K = shape[1] */
  MC_INIT_COUNT
} mc_init;

#define MC_FAMILY_NAME_MAX 64

typedef struct {
  char name[MC_FAMILY_NAME_MAX]; /* e.g. "layers.07.attn.wk" (global layer index, 2+ digits) */
  int ndim;
  int64_t shape[3];
  int64_t numel;
  mc_place place;
  int split_dim;       /* TP: 0 or 1; EP: 0; replicated: -1 */
  int layer;           /* global layer index; -1 for embed, final norm and head */
  char block;          /* 'A', 'M', 'E', 'R', or 0 outside the layers */
  mc_role role;
  mc_init init;
  int decay;           /* 1 = weight-decay group (2-D and 3-D weights) */
  int tp_partial_grad; /* replicated over TP but receives a partial gradient per TP rank */
  int opt;             /* optimizer (mc_opt_kind, core/optim_groups.h): MC_OPT_ADAMW unless
                          optim.groups says otherwise (mc_optim_groups_assign) */
} mc_family;

typedef struct {
  int n;
  mc_family *f;
} mc_family_set;

/* Enumerates every family of the model in a fixed order: embed.weight, then layer by layer
 * (norm, then the block's families), then final_norm.weight, head.weight. `sp` says whether
 * sequence parallelism is on (it makes norms and the router partial-gradient surfaces). */
int mc_families_build(const mc_model *m, int sp, mc_family_set *out);
void mc_families_free(mc_family_set *s);
int mc_family_find(const mc_family_set *s, const char *name); /* index or -1 */
const char *mc_role_name(mc_role r);
/* 1 for a weight the model uses only as the weight operand of matrix products (projections,
 * expert matrices, the head; not the router, whose logits stay fp32). Under train.dtype=bf16
 * the trainer keeps these working weights in bf16 (their master copy stays fp32) and mcplan
 * counts them so. */
int mc_role_is_matmul(mc_role r);
const char *mc_place_name(mc_place p);

#endif
