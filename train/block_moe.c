/* E block: mixture of SwiGLU experts.
 *   logits = u router^T (fp32), route: softmax, top-k (ties to the lower index), gates
 *   renormalised over the k choices, per-sequence capacity (docs/design.md routing contract);
 *   kept assignments are permuted into an expert-sorted buffer, each expert computes
 *   (silu(xp w1[e]^T) * (xp w3[e]^T)) w2[e]^T with grouped products, and the outputs come back
 *   weighted by their gates: x += sum_j gate_j y_j. Dropped assignments add nothing (the
 *   residual passes through). Aux loss per sequence: coef * E * sum_e f_e P_e.
 * The block runs on net->par.moe_T positions per sequence: whole sequences, or under SP this
 * rank's shard of every sequence, whose f and P are then completed over the TP group.
 * Under mc_act16 the expert activations are kept in bf16 only: the permuted input (the dense
 * path reads the layer's u16), h1, h3 and the SwiGLU output, and in the backward da, dh1 and
 * dh3 (each written once by the op that makes it, no fp32 copy); the routed path's fp32
 * permuted input exists only while the forward makes it, in the DXP gradient scratch (free
 * during a forward). The buffers are the E row of core/blocks.h. */
#include <math.h>
#include <stdlib.h>

#include "train/net_blocks.h"
#include "util/error.h"

/* Where operand data of expert e starts: rows_before(e) * per_row + e * per_expert. */
typedef struct {
  int64_t per_row, per_expert;
} off_rule;

/* One grouped product over the experts; a dimension given as -1 is the expert's row count. */
static int experts_gemm(mc_backend *be, int E, const int32_t *counts, int ta, int tb, int M, int N, int K,
                        mc_operand Am, int lda, off_rule ra, mc_operand Bm, int ldb, off_rule rb, float beta,
                        mc_dst Cm, int ldc, off_rule rc) {
  int *dims = malloc((size_t)E * 3 * sizeof(int));
  int64_t *offs = malloc((size_t)E * 3 * sizeof(int64_t));
  if (!dims || !offs) {
    free(dims), free(offs);
    return mc_error("MoE: out of memory for %d expert products", E);
  }
  int64_t before = 0;
  for (int e = 0; e < E; e++) {
    dims[e] = M < 0 ? counts[e] : M;
    dims[E + e] = N < 0 ? counts[e] : N;
    dims[2 * E + e] = K < 0 ? counts[e] : K;
    offs[e] = before * ra.per_row + e * ra.per_expert;
    offs[E + e] = before * rb.per_row + e * rb.per_expert;
    offs[2 * E + e] = before * rc.per_row + e * rc.per_expert;
    before += counts[e];
  }
  if (Am.h || Bm.h || Cm.h)
    be->gemm_grouped_ex(be, ta, tb, E, dims, dims + E, dims + 2 * E, 1.0f, Am, offs, lda, Bm, offs + E, ldb, beta,
                        Cm, offs + 2 * E, ldc);
  else
    be->gemm_grouped(be, ta, tb, E, dims, dims + E, dims + 2 * E, 1.0f, Am.f, offs, lda, Bm.f, offs + E, ldb, beta,
                     Cm.f, offs + 2 * E, ldc);
  free(dims), free(offs);
  return 0;
}

/* One expert with one choice and no drop possible (dense-a: a dense SwiGLU as one expert):
 * every token goes to expert 0, in row order, with gate exactly 1 (the softmax of a single
 * logit), f = P = 1 for the aux loss, and the router's gradient is exactly 0 (p (1 - p) = 0).
 * The block then runs as the plain SwiGLU on u: the same products on the same operands as the
 * routed computation, so the same values, without routing, permutation or the host round trip
 * of the counts (net->hold.moe_dense = 0 forces the routed path; tests compare the two). */
int mc_moe_is_dense(const struct mc_net *net) {
  return net->hold.moe_dense && !net->par.sp && mc_moe_is_plain(&net->m, net->par.moe_T);
}

/* The experts on their input rows (expert-sorted, counts c, rows in all): xpo is the input as
 * the products read it; h1, h3 and the SwiGLU output are saved, the block output y = a w2^T
 * goes to out (beta 0). */
static int experts_forward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows, mc_operand xpo,
                           float *out) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  if (experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f,
                   mc_saved_out(L, MC_E_H1), F, fr) ||
      experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 0.0f,
                   mc_saved_out(L, MC_E_H3), F, fr))
    return -1;
  be->glu_fwd(be, MC_ACT_SILU, mc_saved_in(L, MC_E_H1), mc_saved_in(L, MC_E_H3), mc_saved_out(L, MC_E_A), rows * F);
  return experts_gemm(be, E, c, 0, 1, -1, d, F, mc_saved_in(L, MC_E_A), F, fr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f,
                      mc_o32(out), d, xr);
}

/* Backward of experts_forward from dyp (the output rows' gradient): adds the expert weights'
 * gradients and writes the input rows' gradient to dxp. */
static int experts_backward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows, mc_operand xpo,
                            mc_operand dyp, float *dxp) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  /* w2[e] is [d, F]: dW2[e] += dyp_e^T a_e, da_e = dyp_e w2[e] */
  if (experts_gemm(be, E, c, 1, 0, d, F, -1, dyp, d, xr, mc_saved_in(L, MC_E_A), F, fr, 1.0f,
                   mc_o32(mc_g(net, L, MC_ROLE_MOE_W2)), F, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, F, d, dyp, d, xr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f,
                   mc_scratch_out(net, L, MC_E_DA), F, fr))
    return -1;
  be->glu_bwd(be, MC_ACT_SILU, mc_saved_in(L, MC_E_H1), mc_saved_in(L, MC_E_H3), mc_scratch_in(net, L, MC_E_DA),
              mc_scratch_grad(net, L, MC_E_DH1, rows * F), mc_scratch_grad(net, L, MC_E_DH3, rows * F), rows * F);
  const mc_operand dh1i = mc_scratch_in(net, L, MC_E_DH1), dh3i = mc_scratch_in(net, L, MC_E_DH3);
  /* w1[e], w3[e] are [F, d]: dW += dh_e^T xp_e, dxp_e = dh1_e w1[e] + dh3_e w3[e] */
  if (experts_gemm(be, E, c, 1, 0, F, d, -1, dh1i, F, fr, xpo, d, xr, 1.0f, mc_o32(mc_g(net, L, MC_ROLE_MOE_W1)), d,
                   w13) ||
      experts_gemm(be, E, c, 1, 0, F, d, -1, dh3i, F, fr, xpo, d, xr, 1.0f, mc_o32(mc_g(net, L, MC_ROLE_MOE_W3)), d,
                   w13) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh1i, F, fr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, mc_o32(dxp), d,
                   xr) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh3i, F, fr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 1.0f, mc_o32(dxp), d,
                   xr))
    return -1;
  return 0;
}

/* The plain path: all n rows go to the one expert, the input is the layer's u (u16 under
 * mc_act16: train/net.c keeps it for a dense E block). */
static int moe_forward_dense(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  const int n = n_seq * net->par.moe_T;
  L->counts_host[0] = n, L->dropped = 0;
  for (int s = 0; s < n_seq; s++) L->aux_host[s] = 1.0f; /* E sum_e f_e P_e = 1 */
  /* x += y as the routed path's unpermute adds 1 * y: the product into scratch, then added */
  float *y = net->g[MC_E_DYP];
  if (experts_forward(net, L, 1, L->counts_host, n, mc_uin(L), y)) return -1;
  net->be->axpy(net->be, x, y, (int64_t)n * net->m.d_model, 1.0f);
  return 0;
}

static int moe_backward_dense(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du) {
  const int n = n_seq * net->par.moe_T;
  /* dyp = 1 * dy = dy. The routed path's permute_bwd adds dxp into the zeroed du and the
   * router adds exact zeros, so du = dxp: the input gradient's products write du itself. */
  return experts_backward(net, L, 1, L->counts_host, n, mc_uin(L), mc_dy_in(net, dy, (int64_t)n * net->m.d_model), du);
}

static int moe_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  if (mc_moe_is_dense(net)) return moe_forward_dense(net, L, n_seq, x);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->par.moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k;
  float **f = L->f;
  int32_t **iv = L->i;
  mc_linear_fwd(be, mc_f32(L->u), mc_wm(net, L, MC_ROLE_MOE_ROUTER), n, d, E, 0.0f, mc_o32(f[MC_E_LOGITS]));
  be->moe_route(be, f[MC_E_LOGITS], n_seq, T, E, k, mc_moe_capacity(m), f[MC_E_PROBS], iv[MC_E_IDX], f[MC_E_GATE], iv[MC_E_SLOT], iv[MC_E_COUNTS],
                f[MC_E_FR], f[MC_E_AUX], iv[MC_E_DROPPED]);
  int32_t dropped = 0;
  be->to_host(be, L->counts_host, iv[MC_E_COUNTS], (size_t)E * sizeof(int32_t));
  be->to_host(be, L->aux_host, f[MC_E_AUX], (size_t)n_seq * sizeof(float));
  be->to_host(be, &dropped, iv[MC_E_DROPPED], sizeof(int32_t));
  L->dropped = dropped;
  if (net->par.moe_T != m->seq_len && mc_sp_moe_aux(&net->par, be, E, f[MC_E_PROBS], f[MC_E_FR], n_seq, T, L->aux_host))
    return -1;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += L->counts_host[e];
  const int act16 = mc_saved_bf16(L, MC_E_XP);
  float *xp = act16 ? net->g[MC_E_DXP] : f[MC_E_XP];
  be->moe_permute(be, L->u, iv[MC_E_SLOT], n, k, d, xp);
  const mc_operand xpo = act16 ? mc_to16(be, xp, (mc_bf16 *)f[MC_E_XP], rows * d) : mc_f32(xp);
  if (experts_forward(net, L, E, L->counts_host, rows, xpo, f[MC_E_YP])) return -1;
  be->moe_unpermute(be, f[MC_E_YP], iv[MC_E_SLOT], f[MC_E_GATE], n, k, d, x);
  return 0;
}

static int moe_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                        double seq_weight) {
  if (mc_moe_is_dense(net)) return moe_backward_dense(net, L, n_seq, dy, du);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->par.moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k;
  float **f = L->f, **g = net->g;
  int32_t **iv = L->i;
  const int32_t *c = L->counts_host;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += c[e];
  be->moe_unpermute_bwd(be, dy, f[MC_E_YP], iv[MC_E_SLOT], f[MC_E_GATE], n, k, d, mc_zeroed(be, g[MC_E_DYP], rows * d),
                        mc_zeroed(be, g[MC_E_DGATE], (int64_t)n * k));
  /* act16: dyp feeds two products, rounded once into DXP (read by those two products before
   * the input-gradient products write DXP) */
  const mc_operand dyp = mc_saved_bf16(L, MC_E_XP) ? mc_to16(be, g[MC_E_DYP], (mc_bf16 *)g[MC_E_DXP], rows * d) : mc_f32(g[MC_E_DYP]);
  if (experts_backward(net, L, E, c, rows, mc_saved_in(L, MC_E_XP), dyp, g[MC_E_DXP])) return -1;
  be->moe_permute_bwd(be, g[MC_E_DXP], iv[MC_E_SLOT], n, k, d, mc_zeroed(be, du, (int64_t)n * d));
  /* Under SP on shards f holds the sequence's fractions and P spans tp shards of T positions
   * each, so d(aux)/d(prob) = E f / (tp T): the kernel divides by T, the scale by tp. Under
   * SP on gathered sequences every TP rank adds the aux gradient of every token, so each
   * adds 1/tp of it. */
  be->moe_route_bwd(be, f[MC_E_PROBS], iv[MC_E_IDX], f[MC_E_GATE], g[MC_E_DGATE], f[MC_E_FR], n_seq, T, E, k,
                    (float)(seq_weight * m->aux_loss_coef / (net->par.sp ? net->par.tp : 1)), mc_zeroed(be, g[MC_E_DLOGITS], (int64_t)n * E));
  mc_linear_bwd(be, mc_f32(L->u), mc_wm(net, L, MC_ROLE_MOE_ROUTER), mc_f32(g[MC_E_DLOGITS]), n, d, E, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_MOE_ROUTER));
  return 0;
}

const mc_block_ops mc_block_moe = {'E', moe_forward, moe_backward};
