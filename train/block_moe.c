/* E block: mixture of SwiGLU experts.
 *   logits = u router^T (fp32), route: softmax, top-k (ties to the lower index), gates
 *   renormalised over the k choices, per-sequence capacity (DESIGN.md routing contract);
 *   kept assignments are permuted into an expert-sorted buffer, each expert computes
 *   (silu(xp w1[e]^T) * (xp w3[e]^T)) w2[e]^T with grouped products, and the outputs come back
 *   weighted by their gates: x += sum_j gate_j y_j. Dropped assignments add nothing (the
 *   residual passes through). Aux loss per sequence: coef * E * sum_e f_e P_e.
 * The block runs on net->moe_T positions per sequence: whole sequences, or under SP this
 * rank's shard of every sequence, whose f and P are then completed over the TP group.
 * Under mc_act16 the permuted input and the SwiGLU output are kept in bf16 only (they feed
 * nothing but products), and dh1, dh3 are rounded once for their two products each. */
#include <math.h>
#include <stdlib.h>

#include "train/net_blocks.h"
#include "util/error.h"

enum { LOGITS, PROBS, GATE, FR, AUX, XP, H1, H3, A, YP };      /* saved floats */
enum { IDX, SLOT, COUNTS, DROPPED };                           /* saved int32 */
enum { DYP, DA, DH1, DH3, DXP, DGATE, DLOGITS };               /* grads */

/* act16: XP and A hold bf16 (half the floats); their fp32 values exist only while the forward
 * makes them, in the DXP and DA gradient scratch (free during a forward). */
static void moe_sizes(const mc_model *m, int n_seq, int act16, mc_block_sizes *s) {
  int64_t n = (int64_t)n_seq * m->seq_len, E = m->n_experts, k = m->top_k, F = m->expert_hidden, d = m->d_model;
  s->f[LOGITS] = s->f[PROBS] = n * E;
  s->f[GATE] = n * k;
  s->f[FR] = n_seq * E;
  s->f[AUX] = n_seq;
  s->f[XP] = act16 ? (n * k * d + 1) / 2 : n * k * d;
  s->f[YP] = n * k * d;
  s->f[H1] = s->f[H3] = n * k * F;
  s->f[A] = act16 ? (n * k * F + 1) / 2 : n * k * F;
  s->i[IDX] = s->i[SLOT] = n * k;
  s->i[COUNTS] = E;
  s->i[DROPPED] = 1;
  s->g[DYP] = s->g[DXP] = n * k * d;
  s->g[DA] = s->g[DH1] = s->g[DH3] = n * k * F;
  s->g[DGATE] = n * k;
  s->g[DLOGITS] = n * E;
}

/* Where operand data of expert e starts: rows_before(e) * per_row + e * per_expert. */
typedef struct {
  int64_t per_row, per_expert;
} off_rule;

/* One grouped product over the experts; a dimension given as -1 is the expert's row count. */
static int experts_gemm(mc_backend *be, int E, const int32_t *counts, int ta, int tb, int M, int N, int K,
                        mc_operand Am, int lda, off_rule ra, mc_operand Bm, int ldb, off_rule rb, float beta,
                        float *Cm, int ldc, off_rule rc) {
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
  if (Am.h || Bm.h)
    be->gemm_grouped_ex(be, ta, tb, E, dims, dims + E, dims + 2 * E, 1.0f, Am, offs, lda, Bm, offs + E, ldb, beta,
                        Cm, offs + 2 * E, ldc);
  else
    be->gemm_grouped(be, ta, tb, E, dims, dims + E, dims + 2 * E, 1.0f, Am.f, offs, lda, Bm.f, offs + E, ldb, beta,
                     Cm, offs + 2 * E, ldc);
  free(dims), free(offs);
  return 0;
}

static int moe_capacity(const mc_model *m) {
  if (m->capacity_factor <= 0) return 0;
  return (int)ceil((double)m->seq_len * m->top_k / m->n_experts * m->capacity_factor);
}

/* One expert with one choice and no drop possible (dense-a: a dense SwiGLU as one expert):
 * every token goes to expert 0, in row order, with gate exactly 1 (the softmax of a single
 * logit), f = P = 1 for the aux loss, and the router's gradient is exactly 0 (p (1 - p) = 0).
 * The block then runs as the plain SwiGLU on u: the same products on the same operands as the
 * routed computation, so the same values, without routing, permutation or the host round trip
 * of the counts (net->moe_dense = 0 forces the routed path; tests compare the two). */
static int moe_is_dense(const struct mc_net *net) {
  const mc_model *m = &net->m;
  const int cap = moe_capacity(m);
  return net->moe_dense && m->n_experts == 1 && m->top_k == 1 && !net->sp && (cap == 0 || cap >= net->moe_T);
}

/* The experts on their input rows (expert-sorted, counts c, rows in all): xpo is the input as
 * the products read it; the SwiGLU output goes to f[A] (under mc_act16 in bf16 only, made in
 * the DA scratch), the block output y = a w2^T to out (beta 0). */
static int experts_forward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows, mc_operand xpo,
                           float *out) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  float **f = L->f;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  if (experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, f[H1], F, fr) ||
      experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 0.0f, f[H3], F, fr))
    return -1;
  const int act16 = mc_act16(net);
  float *a = act16 ? net->g[DA] : f[A];
  be->glu_fwd(be, MC_ACT_SILU, f[H1], f[H3], a, rows * F);
  const mc_operand ao = act16 ? mc_to16(be, a, (mc_bf16 *)f[A], rows * F) : mc_f32(a);
  return experts_gemm(be, E, c, 0, 1, -1, d, F, ao, F, fr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f, out, d, xr);
}

/* Backward of experts_forward from dyp (the output rows' gradient): adds the expert weights'
 * gradients and writes the input rows' gradient to g[DXP]. */
static int experts_backward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows, mc_operand xpo,
                            const float *dyp) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  float **f = L->f, **g = net->g;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  const mc_operand ao = mc_act16(net) ? (mc_operand){NULL, (const mc_bf16 *)f[A]} : mc_f32(f[A]);
  /* w2[e] is [d, F]: dW2[e] += dyp_e^T a_e, da_e = dyp_e w2[e] */
  if (experts_gemm(be, E, c, 1, 0, d, F, -1, mc_f32(dyp), d, xr, ao, F, fr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W2), F, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, F, d, mc_f32(dyp), d, xr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f, g[DA], F, fr))
    return -1;
  be->glu_bwd(be, MC_ACT_SILU, f[H1], f[H3], g[DA], mc_zeroed(be, g[DH1], rows * F), mc_zeroed(be, g[DH3], rows * F),
              rows * F);
  /* act16: dh1 and dh3 each feed two products: rounded once, into DA (consumed above, room
   * for both in bf16) */
  const int act16 = mc_act16(net);
  const mc_operand dh1 = act16 ? mc_to16(be, g[DH1], (mc_bf16 *)g[DA], rows * F) : mc_f32(g[DH1]);
  const mc_operand dh3 = act16 ? mc_to16(be, g[DH3], (mc_bf16 *)g[DA] + rows * F, rows * F) : mc_f32(g[DH3]);
  /* w1[e], w3[e] are [F, d]: dW += dh_e^T xp_e, dxp_e = dh1_e w1[e] + dh3_e w3[e] */
  if (experts_gemm(be, E, c, 1, 0, F, d, -1, dh1, F, fr, xpo, d, xr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W1), d, w13) ||
      experts_gemm(be, E, c, 1, 0, F, d, -1, dh3, F, fr, xpo, d, xr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W3), d, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh1, F, fr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, g[DXP], d, xr) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh3, F, fr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 1.0f, g[DXP], d, xr))
    return -1;
  return 0;
}

/* The plain path's input: u itself (under mc_act16 rounded into XP). */
static mc_operand dense_input(struct mc_net *net, mc_layer *L, int64_t n, int made) {
  const int64_t d = net->m.d_model;
  if (!mc_act16(net)) return mc_f32(L->u);
  return made ? (mc_operand){NULL, (const mc_bf16 *)L->f[XP]} : mc_to16(net->be, L->u, (mc_bf16 *)L->f[XP], n * d);
}

static int moe_forward_dense(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  const int n = n_seq * net->moe_T;
  L->counts_host[0] = n, L->dropped = 0;
  for (int s = 0; s < n_seq; s++) L->aux_host[s] = 1.0f; /* E sum_e f_e P_e = 1 */
  /* x is the block's zeroed output: x = y, as the routed path's unpermute (0 + 1 * y) gives */
  return experts_forward(net, L, 1, L->counts_host, n, dense_input(net, L, n, 0), x);
}

static int moe_backward_dense(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du) {
  const int n = n_seq * net->moe_T;
  /* dyp = 1 * dy = dy; the routed path's permute_bwd adds dxp into du */
  if (experts_backward(net, L, 1, L->counts_host, n, dense_input(net, L, n, 1), dy)) return -1;
  net->be->axpy(net->be, du, net->g[DXP], (int64_t)n * net->m.d_model, 1.0f);
  return 0;
}

static int moe_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  if (moe_is_dense(net)) return moe_forward_dense(net, L, n_seq, x);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k;
  float **f = L->f;
  int32_t **iv = L->i;
  mc_linear_fwd(be, mc_f32(L->u), mc_wm(net, L, MC_ROLE_MOE_ROUTER), n, d, E, 0.0f, f[LOGITS]);
  be->moe_route(be, f[LOGITS], n_seq, T, E, k, moe_capacity(m), f[PROBS], iv[IDX], f[GATE], iv[SLOT], iv[COUNTS],
                f[FR], f[AUX], iv[DROPPED]);
  int32_t dropped = 0;
  be->to_host(be, L->counts_host, iv[COUNTS], (size_t)E * sizeof(int32_t));
  be->to_host(be, L->aux_host, f[AUX], (size_t)n_seq * sizeof(float));
  be->to_host(be, &dropped, iv[DROPPED], sizeof(int32_t));
  L->dropped = dropped;
  if (net->moe_T != m->seq_len && mc_sp_moe_aux(net, L, f[PROBS], f[FR], n_seq, T)) return -1;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += L->counts_host[e];
  const int act16 = mc_act16(net);
  float *xp = act16 ? net->g[DXP] : f[XP];
  be->moe_permute(be, L->u, iv[SLOT], n, k, d, xp);
  const mc_operand xpo = act16 ? mc_to16(be, xp, (mc_bf16 *)f[XP], rows * d) : mc_f32(xp);
  if (experts_forward(net, L, E, L->counts_host, rows, xpo, f[YP])) return -1;
  be->moe_unpermute(be, f[YP], iv[SLOT], f[GATE], n, k, d, x);
  return 0;
}

static int moe_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                        double seq_weight) {
  if (moe_is_dense(net)) return moe_backward_dense(net, L, n_seq, dy, du);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k;
  float **f = L->f, **g = net->g;
  int32_t **iv = L->i;
  const int32_t *c = L->counts_host;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += c[e];
  be->moe_unpermute_bwd(be, dy, f[YP], iv[SLOT], f[GATE], n, k, d, mc_zeroed(be, g[DYP], rows * d),
                        mc_zeroed(be, g[DGATE], (int64_t)n * k));
  const mc_operand xpo = mc_act16(net) ? (mc_operand){NULL, (const mc_bf16 *)f[XP]} : mc_f32(f[XP]);
  if (experts_backward(net, L, E, c, rows, xpo, g[DYP])) return -1;
  be->moe_permute_bwd(be, g[DXP], iv[SLOT], n, k, d, du);
  /* Under SP on shards f holds the sequence's fractions and P spans tp shards of T positions
   * each, so d(aux)/d(prob) = E f / (tp T): the kernel divides by T, the scale by tp. Under
   * SP on gathered sequences every TP rank adds the aux gradient of every token, so each
   * adds 1/tp of it. */
  be->moe_route_bwd(be, f[PROBS], iv[IDX], f[GATE], g[DGATE], f[FR], n_seq, T, E, k,
                    (float)(seq_weight * m->aux_loss_coef / (net->sp ? net->tp : 1)), mc_zeroed(be, g[DLOGITS], (int64_t)n * E));
  mc_linear_bwd(be, mc_f32(L->u), mc_wm(net, L, MC_ROLE_MOE_ROUTER), mc_f32(g[DLOGITS]), n, d, E, du, mc_g(net, L, MC_ROLE_MOE_ROUTER));
  return 0;
}

const mc_block_ops mc_block_moe = {'E', moe_sizes, moe_forward, moe_backward};
