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

static int moe_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k, F = m->expert_hidden;
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
  const int32_t *c = L->counts_host;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  if (experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, f[H1], F, fr) ||
      experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 0.0f, f[H3], F, fr))
    return -1;
  float *a = act16 ? net->g[DA] : f[A];
  be->glu_fwd(be, MC_ACT_SILU, f[H1], f[H3], a, rows * F);
  const mc_operand ao = act16 ? mc_to16(be, a, (mc_bf16 *)f[A], rows * F) : mc_f32(a);
  if (experts_gemm(be, E, c, 0, 1, -1, d, F, ao, F, fr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f, f[YP], d, xr))
    return -1;
  be->moe_unpermute(be, f[YP], iv[SLOT], f[GATE], n, k, d, x);
  return 0;
}

static int moe_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                        double seq_weight) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k, F = m->expert_hidden;
  float **f = L->f, **g = net->g;
  int32_t **iv = L->i;
  const int32_t *c = L->counts_host;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += c[e];
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  be->moe_unpermute_bwd(be, dy, f[YP], iv[SLOT], f[GATE], n, k, d, mc_zeroed(be, g[DYP], rows * d),
                        mc_zeroed(be, g[DGATE], (int64_t)n * k));
  const int act16 = mc_act16(net);
  const mc_operand ao = act16 ? (mc_operand){NULL, (const mc_bf16 *)f[A]} : mc_f32(f[A]);
  const mc_operand xpo = act16 ? (mc_operand){NULL, (const mc_bf16 *)f[XP]} : mc_f32(f[XP]);
  /* w2[e] is [d, F]: dW2[e] += dyp_e^T a_e, da_e = dyp_e w2[e] */
  if (experts_gemm(be, E, c, 1, 0, d, F, -1, mc_f32(g[DYP]), d, xr, ao, F, fr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W2), F, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, F, d, mc_f32(g[DYP]), d, xr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f, g[DA], F, fr))
    return -1;
  be->glu_bwd(be, MC_ACT_SILU, f[H1], f[H3], g[DA], mc_zeroed(be, g[DH1], rows * F), mc_zeroed(be, g[DH3], rows * F),
              rows * F);
  /* act16: dh1 and dh3 each feed two products: rounded once, into DA (consumed above, room
   * for both in bf16) */
  const mc_operand dh1 = act16 ? mc_to16(be, g[DH1], (mc_bf16 *)g[DA], rows * F) : mc_f32(g[DH1]);
  const mc_operand dh3 = act16 ? mc_to16(be, g[DH3], (mc_bf16 *)g[DA] + rows * F, rows * F) : mc_f32(g[DH3]);
  /* w1[e], w3[e] are [F, d]: dW += dh_e^T xp_e, dxp_e = dh1_e w1[e] + dh3_e w3[e] */
  if (experts_gemm(be, E, c, 1, 0, F, d, -1, dh1, F, fr, xpo, d, xr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W1), d, w13) ||
      experts_gemm(be, E, c, 1, 0, F, d, -1, dh3, F, fr, xpo, d, xr, 1.0f, mc_g(net, L, MC_ROLE_MOE_W3), d, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh1, F, fr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, g[DXP], d, xr) ||
      experts_gemm(be, E, c, 0, 0, -1, d, F, dh3, F, fr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 1.0f, g[DXP], d, xr))
    return -1;
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
