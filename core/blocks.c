/* The block-kind table (core/blocks.h). Each row reads as its block: families in registry
 * order, rules, forward and backward FLOPs, and the buffers its train/block_*.c file uses. */
#include "core/blocks.h"

#include <string.h>

int64_t mc_dim_of(const mc_model *m, mc_dim d) {
  switch (d) {
    case MC_DIM_NONE: return 0;
    case MC_DIM_ONE: return 1;
    case MC_DIM_D: return m->d_model;
    case MC_DIM_VP: return mc_vocab_padded(m);
    case MC_DIM_Q: return (int64_t)m->n_heads * m->head_dim;
    case MC_DIM_KV: return (int64_t)m->n_kv_heads * m->head_dim;
    case MC_DIM_H: return m->n_heads;
    case MC_DIM_KVH: return m->n_kv_heads;
    case MC_DIM_DI: return m->mamba_inner;
    case MC_DIM_HM: return mc_mamba_heads(m);
    case MC_DIM_N: return m->ssm_state;
    case MC_DIM_CONV: return m->conv_width;
    case MC_DIM_E: return m->n_experts;
    case MC_DIM_K: return m->top_k;
    case MC_DIM_F: return m->expert_hidden;
    case MC_DIM_KD: return (int64_t)m->top_k * m->d_model;
    case MC_DIM_KF: return (int64_t)m->top_k * m->expert_hidden;
    case MC_DIM_DR: return m->rec_width;
  }
  return 0;
}

mc_model mc_model_local(const mc_model *g, int tp) {
  mc_model m = *g;
  m.n_heads /= tp, m.n_kv_heads /= tp;
  m.mamba_inner /= tp;
  m.rec_width /= tp;
  return m;
}

/* Shorthands for the rows below. */
#define R_ MC_PLACE_REPLICATED
#define T_ MC_PLACE_TP
#define X_ MC_PLACE_EP
#define FAM(role, place, dim, init, a, b, c) {MC_ROLE_##role, place, dim, MC_INIT_##init, {MC_DIM_##a, MC_DIM_##b, MC_DIM_##c}}
#define BUF(name, rows, width, store, when, keep) {name, MC_ROWS_##rows, MC_DIM_##width, MC_STORE_##store, MC_IF_##when, keep}
#define TOK(name, width, store, keep) BUF(name, TOKENS, width, store, ALWAYS, keep)

/* ------------------------------------------------------------------ A: attention */

static const mc_block_family attn_fams[] = {
    FAM(ATTN_WQ, T_, 0, NORMAL, Q, D, NONE),
    FAM(ATTN_WK, T_, 0, NORMAL, KV, D, NONE),
    FAM(ATTN_WV, T_, 0, NORMAL, KV, D, NONE),
    FAM(ATTN_WO, T_, 1, NORMAL_OUT, D, Q, NONE),
};
/* q, k, v after RoPE and the output o (bf16 under act16: the products write them so and RoPE
 * rotates them in place), the log-sum-exp per head */
static const mc_act_buf attn_saved[MC_A_NSAVED] = {
    [MC_A_Q] = TOK("q", Q, PROD, 1),  [MC_A_K] = TOK("k", KV, PROD, 1), [MC_A_V] = TOK("v", KV, PROD, 1),
    [MC_A_O] = TOK("o", Q, PROD, 0),  [MC_A_LSE] = TOK("lse", H, F32, 0),
};
/* the attention's own gradients are fp32 sums; dout, the rotated-back dq, dk and a bf16 copy of
 * dv feed the products */
static const mc_act_buf attn_grads[MC_A_NGRADS] = {
    [MC_A_DO] = TOK("dout", Q, PROD, 0),  [MC_A_DQ] = TOK("dq", Q, F32, 0),      [MC_A_DK] = TOK("dk", KV, F32, 0),
    [MC_A_DV] = TOK("dv", KV, F32, 0),    [MC_A_DQP] = TOK("dq_rot", Q, PROD, 0), [MC_A_DKP] = TOK("dk_rot", KV, PROD, 0),
    [MC_A_DV16] = BUF("dv16", TOKENS, KV, PROD, ACT16, 0),
};

static void attn_check(const mc_model *m, mc_errlist *e) {
  if (m->n_heads < 1 || m->n_kv_heads < 1 || m->head_dim < 2)
    mc_errlist_add(e, "attention needs n_heads>=1, n_kv_heads>=1, head_dim>=2 (got %d, %d, %d)", m->n_heads, m->n_kv_heads, m->head_dim);
  else if (m->n_heads % m->n_kv_heads)
    mc_errlist_add(e, "n_kv_heads=%d does not divide n_heads=%d (GQA)", m->n_kv_heads, m->n_heads);
  if (m->head_dim % 2) mc_errlist_add(e, "head_dim=%d must be even (RoPE rotates pairs)", m->head_dim);
}

/* Matrix products dominate; elementwise work is counted where it scales with a width (norms,
 * scans) so that blocks without big products are not priced at zero. Causal attention at its
 * average context of (T+1)/2 keys.
 * Backward (the bwd_flops of each row): every product costs 2x its forward (the gradient with
 * respect to its input and to its weights, or to both operands), every elementwise term 2x its
 * forward (the gradient with respect to each input of a norm, gate, conv or scan), except the
 * attention core: the fused backward recomputes the scores from the kept log-sum-exp and then
 * forms dV, dP, dQ and dK, 5 products where the forward has 2, so 2.5x. */
static double norm_flops(const mc_model *m) { return 4.0 * m->d_model; }

/* Part p's figure of a block's forward, given each part's. */
static double part_of(mc_fwd_part p, double norm, double proj, double inner, double out) {
  return p == MC_PART_NORM ? norm : p == MC_PART_PROJ ? proj : p == MC_PART_INNER ? inner : out;
}

/* the q, k, v projections and the output projection; the score and value products of the
 * attention core */
static double attn_qkv_flops(const mc_model *m) {
  double d = m->d_model, q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
  return 2.0 * d * q + 2.0 * 2.0 * d * kv;
}

static double attn_out_flops(const mc_model *m) { return 2.0 * m->n_heads * m->head_dim * (double)m->d_model; }

static double attn_core_flops(const mc_model *m) {
  double q = (double)m->n_heads * m->head_dim, ctx = (m->seq_len + 1) / 2.0;
  return 2.0 * 2.0 * q * ctx;
}

/* q, k, v are the projections' outputs (after RoPE, not counted); o and lse the core's */
static double attn_part_flops(const mc_model *m, mc_fwd_part p, int routed) {
  (void)routed;
  return part_of(p, norm_flops(m), attn_qkv_flops(m), attn_core_flops(m), attn_out_flops(m));
}

static double attn_bwd_flops(const mc_model *m) {
  return 2.0 * norm_flops(m) + 2.0 * (attn_qkv_flops(m) + attn_out_flops(m)) + 2.5 * attn_core_flops(m);
}

/* ------------------------------------------------------------------ M: Mamba-2 mixer */

static const mc_block_family mamba_fams[] = {
    FAM(SSM_WZ, T_, 0, NORMAL, DI, D, NONE),          FAM(SSM_WX, T_, 0, NORMAL, DI, D, NONE),
    FAM(SSM_WDT, T_, 0, NORMAL, HM, D, NONE),         FAM(SSM_WB, R_, -1, NORMAL, N, D, NONE),
    FAM(SSM_WC, R_, -1, NORMAL, N, D, NONE),          FAM(SSM_CONVX_W, T_, 0, CONV, DI, CONV, NONE),
    FAM(SSM_CONVX_B, T_, 0, ZEROS, DI, NONE, NONE),   FAM(SSM_CONVB_W, R_, -1, CONV, N, CONV, NONE),
    FAM(SSM_CONVB_B, R_, -1, ZEROS, N, NONE, NONE),   FAM(SSM_CONVC_W, R_, -1, CONV, N, CONV, NONE),
    FAM(SSM_CONVC_B, R_, -1, ZEROS, N, NONE, NONE),   FAM(SSM_DT_BIAS, T_, 0, DT_BIAS, HM, NONE, NONE),
    FAM(SSM_A_LOG, T_, 0, A_LOG, HM, NONE, NONE),     FAM(SSM_D, T_, 0, ONES, HM, NONE, NONE),
    FAM(SSM_NORM, T_, 0, ONES, DI, NONE, NONE),       FAM(SSM_WOUT, T_, 1, NORMAL_OUT, D, DI, NONE),
};
/* z and norm(g) feed only the gate and products (bf16 under act16); the conv, scan and norm
 * inputs stay fp32 (the conv's backward recomputes its pre-activation from x, the gated
 * norm's recomputes g = y silu(z)). Selective recomputation keeps the projections' outputs.
 * The gradients of the projections' outputs (dz, dx, dB, dC) feed only products. */
static const mc_act_buf mamba_saved[MC_M_NSAVED] = {
    [MC_M_Z] = TOK("z", DI, PROD, 1),         [MC_M_XR] = TOK("x", DI, F32, 1),      [MC_M_XC] = TOK("x_conv", DI, F32, 0),
    [MC_M_BR] = TOK("B", N, F32, 1),          [MC_M_BC] = TOK("B_conv", N, F32, 0),  [MC_M_CR] = TOK("C", N, F32, 1),
    [MC_M_CC] = TOK("C_conv", N, F32, 0),     [MC_M_DTP] = TOK("dt_pre", HM, F32, 1), [MC_M_DT] = TOK("dt", HM, F32, 0),
    [MC_M_Y] = TOK("y", DI, F32, 0),          [MC_M_GN] = TOK("norm_g", DI, PROD, 0), [MC_M_GRSTD] = TOK("g_rstd", HM, F32, 0),
};
static const mc_act_buf mamba_grads[MC_M_NGRADS] = {
    [MC_M_DGN] = TOK("d_norm_g", DI, F32, 0), [MC_M_DZ] = TOK("dz", DI, PROD, 0),
    [MC_M_DY] = TOK("dy", DI, F32, 0),        [MC_M_DXC] = TOK("dx_conv", DI, F32, 0), [MC_M_DXR] = TOK("dx", DI, PROD, 0),
    [MC_M_DBC] = TOK("dB_conv", N, F32, 0),   [MC_M_DBR] = TOK("dB", N, PROD, 0),      [MC_M_DCC] = TOK("dC_conv", N, F32, 0),
    [MC_M_DCR] = TOK("dC", N, PROD, 0),       [MC_M_DDT] = TOK("ddt", HM, F32, 0),     [MC_M_DDTP] = TOK("ddt_pre", HM, F32, 0),
};

static void mamba_check(const mc_model *m, mc_errlist *e) {
  if (m->mamba_inner < 1 || m->mamba_head_dim < 1 || m->ssm_state < 1 || m->conv_width < 1)
    mc_errlist_add(e, "Mamba needs mamba_inner, mamba_head_dim, ssm_state, conv_width >= 1 (got %d, %d, %d, %d)",
                   m->mamba_inner, m->mamba_head_dim, m->ssm_state, m->conv_width);
  else if (m->mamba_inner % m->mamba_head_dim)
    mc_errlist_add(e, "mamba_head_dim=%d does not divide mamba_inner=%d", m->mamba_head_dim, m->mamba_inner);
}

/* the z, x, dt, B and C projections and the output projection; the convs, the scan and the
 * gated norm */
static double mamba_in_flops(const mc_model *m) {
  double d = m->d_model, di = m->mamba_inner, n = m->ssm_state, hm = mc_mamba_heads(m);
  return 2.0 * 2.0 * d * di + 2.0 * d * hm + 2.0 * 2.0 * d * n;
}

static double mamba_out_flops(const mc_model *m) { return 2.0 * m->mamba_inner * (double)m->d_model; }

static double mamba_inner_flops(const mc_model *m) {
  double di = m->mamba_inner, n = m->ssm_state, k = m->conv_width;
  return 2.0 * k * (di + 2.0 * n) + 6.0 * di * n + 8.0 * di;
}

static double mamba_part_flops(const mc_model *m, mc_fwd_part p, int routed) {
  (void)routed;
  return part_of(p, norm_flops(m), mamba_in_flops(m), mamba_inner_flops(m), mamba_out_flops(m));
}

static double mamba_bwd_flops(const mc_model *m) {
  return 2.0 * (mamba_in_flops(m) + mamba_out_flops(m)) + 2.0 * (norm_flops(m) + mamba_inner_flops(m));
}

/* ------------------------------------------------------------------ E: mixture of experts */

static const mc_block_family moe_fams[] = {
    FAM(MOE_ROUTER, R_, -1, NORMAL, E, D, NONE),
    FAM(MOE_W1, X_, 0, NORMAL, E, F, D),
    FAM(MOE_W3, X_, 0, NORMAL, E, F, D),
    FAM(MOE_W2, X_, 0, NORMAL_OUT, E, D, F),
};
/* Router logits and probabilities (fp32), gates, routing fractions and aux per sequence; the
 * expert-sorted input and output of a routed block (a plain one reads u and adds its output
 * through gradient scratch); h1, h3 and the SwiGLU output (bf16 under act16). Under expert
 * parallelism the experts' rows (their input, h1, h3, SwiGLU and the gradients da, dh1, dh3)
 * are what the rank's experts received, kept in moe.scratch (train/dist_ep.c), so the layer
 * has none of its own. */
static const mc_act_buf moe_saved[MC_E_NSAVED] = {
    [MC_E_LOGITS] = TOK("router_logits", E, F32, 1), [MC_E_PROBS] = TOK("router_probs", E, F32, 1),
    [MC_E_GATE] = TOK("gates", K, F32, 1),           [MC_E_FR] = BUF("route_fractions", SEQS, E, F32, ALWAYS, 1),
    [MC_E_AUX] = BUF("aux", SEQS, ONE, F32, ALWAYS, 1),
    [MC_E_XP] = BUF("dispatched_input", TOKENS, KD, PROD, ROUTED_NO_EP, 1),
    [MC_E_H1] = BUF("h1", TOKENS, KF, PROD, NO_EP, 1), [MC_E_H3] = BUF("h3", TOKENS, KF, PROD, NO_EP, 1),
    [MC_E_A] = BUF("swiglu", TOKENS, KF, PROD, NO_EP, 0),
    [MC_E_YP] = BUF("expert_output", TOKENS, KD, F32, ROUTED, 1),
};
static const mc_act_buf moe_saved_i32[MC_E_NSAVED_I32] = {
    [MC_E_IDX] = TOK("expert_index", K, I32, 1), [MC_E_SLOT] = TOK("slot", K, I32, 1),
    [MC_E_COUNTS] = BUF("counts", ONE, E, I32, ALWAYS, 1), [MC_E_DROPPED] = BUF("dropped", ONE, ONE, I32, ALWAYS, 1),
};
static const mc_act_buf moe_grads[MC_E_NGRADS] = {
    [MC_E_DYP] = TOK("d_expert_output", KD, F32, 0), [MC_E_DA] = BUF("d_swiglu", TOKENS, KF, PROD, NO_EP, 0),
    [MC_E_DH1] = BUF("dh1", TOKENS, KF, PROD, NO_EP, 0), [MC_E_DH3] = BUF("dh3", TOKENS, KF, PROD, NO_EP, 0),
    [MC_E_DXP] = TOK("d_dispatched_input", KD, F32, 0), [MC_E_DGATE] = TOK("d_gates", K, F32, 0),
    [MC_E_DLOGITS] = TOK("d_router_logits", E, F32, 0),
};

static void moe_check(const mc_model *m, mc_errlist *e) {
  if (m->n_experts < 1 || m->expert_hidden < 1)
    mc_errlist_add(e, "MoE needs n_experts>=1 and expert_hidden>=1 (got %d, %d)", m->n_experts, m->expert_hidden);
  if (m->top_k < 1 || m->top_k > m->n_experts) mc_errlist_add(e, "top_k=%d must be in [1, n_experts=%d]", m->top_k, m->n_experts);
}

/* the router, each chosen expert's up (w1, w3) and down (w2) products; the SwiGLU */
static double moe_router_flops(const mc_model *m) { return 2.0 * m->d_model * (double)m->n_experts; }

static double moe_up_flops(const mc_model *m) { return m->top_k * 2.0 * 2.0 * m->d_model * (double)m->expert_hidden; }

static double moe_down_flops(const mc_model *m) { return m->top_k * 2.0 * m->expert_hidden * (double)m->d_model; }

static double moe_swiglu_flops(const mc_model *m) { return m->top_k * 4.0 * m->expert_hidden; }

/* Routed, the router's product makes the logits and the down product writes expert_output
 * (both kept for the backward), and the combine, not counted, makes the output. Plain (one
 * expert, one choice: train/block_moe.c), no router runs and the down product makes the output
 * itself. */
static double moe_part_flops(const mc_model *m, mc_fwd_part p, int routed) {
  return part_of(p, norm_flops(m), moe_up_flops(m) + (routed ? moe_router_flops(m) + moe_down_flops(m) : 0.0),
                 moe_swiglu_flops(m), routed ? 0.0 : moe_down_flops(m));
}

static double moe_bwd_flops(const mc_model *m) {
  return 2.0 * (moe_router_flops(m) + moe_up_flops(m) + moe_down_flops(m)) + 2.0 * (norm_flops(m) + moe_swiglu_flops(m));
}

/* ------------------------------------------------------------------ R: gated linear recurrence */

static const mc_block_family rec_fams[] = {
    FAM(REC_WX, T_, 0, NORMAL, DR, D, NONE),      FAM(REC_WGATE, T_, 0, NORMAL, DR, D, NONE),
    FAM(REC_WR, T_, 0, NORMAL, DR, D, NONE),      FAM(REC_WI, T_, 0, NORMAL, DR, D, NONE),
    FAM(REC_BR, T_, 0, ZEROS, DR, NONE, NONE),    FAM(REC_BI, T_, 0, ZEROS, DR, NONE, NONE),
    FAM(REC_LAMBDA, T_, 0, REC_LAMBDA, DR, NONE, NONE), FAM(REC_WOUT, T_, 1, NORMAL_OUT, D, DR, NONE),
};
/* u w_x^T, u w_gate^T and the gated output feed only gates and products (bf16 under act16);
 * the biased gate inputs and the recurrence stay fp32 */
static const mc_act_buf rec_saved[MC_R_NSAVED] = {
    [MC_R_XB] = TOK("x", DR, PROD, 1),     [MC_R_GP] = TOK("gate_pre", DR, PROD, 1), [MC_R_RP] = TOK("r_pre", DR, F32, 1),
    [MC_R_R] = TOK("r", DR, F32, 0),       [MC_R_IP] = TOK("i_pre", DR, F32, 1),     [MC_R_GX] = TOK("gated_x", DR, F32, 0),
    [MC_R_H] = TOK("h", DR, F32, 0),       [MC_R_O] = TOK("out", DR, PROD, 0),
};
static const mc_act_buf rec_grads[MC_R_NGRADS] = {
    [MC_R_DO] = TOK("dout", DR, PROD, 0),  [MC_R_DGP] = TOK("d_gate_pre", DR, PROD, 0), [MC_R_DH] = TOK("dh", DR, F32, 0),
    [MC_R_DGX] = TOK("d_gated_x", DR, F32, 0), [MC_R_DR] = TOK("dr", DR, F32, 0),    [MC_R_DRP] = TOK("dr_pre", DR, F32, 0),
    [MC_R_DIP] = TOK("di_pre", DR, F32, 0), [MC_R_DXB] = TOK("dx", DR, PROD, 0),
};

static void rec_check(const mc_model *m, mc_errlist *e) {
  if (m->rec_width < 1) mc_errlist_add(e, "rec_width=%d must be >= 1", m->rec_width);
}

/* the four input projections and the output projection; the gates and the recurrence */
static double rec_in_flops(const mc_model *m) { return 2.0 * 4.0 * m->d_model * (double)m->rec_width; }

static double rec_out_flops(const mc_model *m) { return 2.0 * m->rec_width * (double)m->d_model; }

static double rec_inner_flops(const mc_model *m) { return 12.0 * m->rec_width; }

static double rec_part_flops(const mc_model *m, mc_fwd_part p, int routed) {
  (void)routed;
  return part_of(p, norm_flops(m), rec_in_flops(m), rec_inner_flops(m), rec_out_flops(m));
}

static double rec_bwd_flops(const mc_model *m) {
  return 2.0 * (rec_in_flops(m) + rec_out_flops(m)) + 2.0 * (norm_flops(m) + rec_inner_flops(m));
}

/* ------------------------------------------------------------------ the table */

#define N_(a) (int)(sizeof(a) / sizeof((a)[0]))

static const mc_block_kind kinds[] = {
    {'A', "attention", 0, N_(attn_fams), attn_fams, attn_check, 2, {"n_heads", "n_kv_heads"}, {MC_DIM_H, MC_DIM_KVH},
     MC_DIM_NONE, attn_part_flops, attn_bwd_flops, MC_A_NSAVED, attn_saved, 0, NULL, MC_A_NGRADS, attn_grads},
    {'M', "mamba", 0, N_(mamba_fams), mamba_fams, mamba_check, 1, {"mamba_heads (mamba_inner/mamba_head_dim)"},
     {MC_DIM_HM}, MC_DIM_NONE, mamba_part_flops, mamba_bwd_flops, MC_M_NSAVED, mamba_saved, 0, NULL, MC_M_NGRADS, mamba_grads},
    {'E', "moe", 1, N_(moe_fams), moe_fams, moe_check, 0, {NULL}, {MC_DIM_NONE}, MC_DIM_E, moe_part_flops, moe_bwd_flops, MC_E_NSAVED,
     moe_saved, MC_E_NSAVED_I32, moe_saved_i32, MC_E_NGRADS, moe_grads},
    {'R', "recurrence", 0, N_(rec_fams), rec_fams, rec_check, 1, {"rec_width"}, {MC_DIM_DR}, MC_DIM_NONE, rec_part_flops, rec_bwd_flops,
     MC_R_NSAVED, rec_saved, 0, NULL, MC_R_NGRADS, rec_grads},
};

const mc_block_kind *mc_block_kind_of(char letter) {
  for (int i = 0; i < N_(kinds); i++)
    if (kinds[i].letter == letter && letter) return &kinds[i];
  return NULL;
}

const char *mc_block_letters(void) { return "AMER"; }
