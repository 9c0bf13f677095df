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
 * during a forward). The buffers are the E row of core/blocks.h. Under expert parallelism
 * (net->par.ep > 1) the rank's routed rows run on the EP ranks owning their experts and come
 * back by all-to-all (experts_forward_ep / experts_backward_ep, train/dist_ep.c), in the same
 * storage: under mc_act16 the input rows and the output rows' gradient travel in bf16 and the
 * experts keep h1, h3, the SwiGLU output, da, dh1 and dh3 in bf16, as on one rank. */
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

/* Where the experts keep h1, h3 and the SwiGLU output (saved for the backward) and the
 * gradients da, dh1, dh3 (scratch): the layer's buffers and the network's gradient scratch
 * in their storage, or under EP the rows of what this rank's experts received (train/dist_ep.c,
 * bf16 under mc_act16). */
typedef struct {
  float *h1, *h3, *a, *da, *dh1, *dh3;
  int s16, g16; /* the saved / scratch ones are bf16 */
} expert_bufs;

static expert_bufs layer_bufs(struct mc_net *net, const mc_layer *L) {
  return (expert_bufs){L->f[MC_E_H1], L->f[MC_E_H3], L->f[MC_E_A], net->g[MC_E_DA], net->g[MC_E_DH1], net->g[MC_E_DH3],
                       mc_saved_bf16(L, MC_E_H1), mc_scratch_bf16(L, MC_E_DA)};
}
static mc_dst buf_out(float *p, int b16) { return b16 ? mc_o16(p) : mc_o32(p); }
static mc_operand buf_in(const float *p, int b16) { return b16 ? mc_b16(p) : mc_f32(p); }
/* a gradient output: a bf16 one is written by its op, an fp32 one accumulates into zeroes */
static mc_dst grad_out(mc_backend *be, float *p, int b16, int64_t n) {
  if (b16) return mc_o16(p);
  be->fill(be, p, n, 0.0f);
  return mc_o32(p);
}

/* The experts on their input rows (expert-sorted, counts c, rows in all): xpo is the input as
 * the products read it; h1, h3 and the SwiGLU output are saved in B, the block output
 * y = a w2^T goes to out (beta 0; out NULL: not computed). */
static int experts_forward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows,
                           const expert_bufs *B, mc_operand xpo, float *out) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  if (experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f,
                   buf_out(B->h1, B->s16), F, fr) ||
      experts_gemm(be, E, c, 0, 1, -1, F, d, xpo, d, xr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 0.0f,
                   buf_out(B->h3, B->s16), F, fr))
    return -1;
  be->glu_fwd(be, MC_ACT_SILU, buf_in(B->h1, B->s16), buf_in(B->h3, B->s16), buf_out(B->a, B->s16), rows * F);
  if (!out) return 0;
  return experts_gemm(be, E, c, 0, 1, -1, d, F, buf_in(B->a, B->s16), F, fr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f,
                      mc_o32(out), d, xr);
}

/* Backward of experts_forward from dyp (the output rows' gradient), first part: adds dW2,
 * forms dh1, dh3 and writes the input rows' gradient to dxp (which EP sends back while the
 * second part runs). */
static int experts_backward_dx(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows,
                               const expert_bufs *B, mc_operand dyp, float *dxp) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  /* w2[e] is [d, F]: dW2[e] += dyp_e^T a_e, da_e = dyp_e w2[e] */
  if (experts_gemm(be, E, c, 1, 0, d, F, -1, dyp, d, xr, buf_in(B->a, B->s16), F, fr, 1.0f,
                   mc_o32(mc_g(net, L, MC_ROLE_MOE_W2)), F, w13) ||
      experts_gemm(be, E, c, 0, 0, -1, F, d, dyp, d, xr, mc_wm(net, L, MC_ROLE_MOE_W2), F, w13, 0.0f,
                   buf_out(B->da, B->g16), F, fr))
    return -1;
  be->glu_bwd(be, MC_ACT_SILU, buf_in(B->h1, B->s16), buf_in(B->h3, B->s16), buf_in(B->da, B->g16),
              grad_out(be, B->dh1, B->g16, rows * F), grad_out(be, B->dh3, B->g16, rows * F), rows * F);
  const mc_operand dh1i = buf_in(B->dh1, B->g16), dh3i = buf_in(B->dh3, B->g16);
  /* w1[e], w3[e] are [F, d]: dxp_e = dh1_e w1[e] + dh3_e w3[e] */
  return experts_gemm(be, E, c, 0, 0, -1, d, F, dh1i, F, fr, mc_wm(net, L, MC_ROLE_MOE_W1), d, w13, 0.0f, mc_o32(dxp),
                      d, xr) ||
         experts_gemm(be, E, c, 0, 0, -1, d, F, dh3i, F, fr, mc_wm(net, L, MC_ROLE_MOE_W3), d, w13, 1.0f, mc_o32(dxp),
                      d, xr);
}

/* Second part: dW1[e] += dh1_e^T xp_e, dW3[e] += dh3_e^T xp_e. */
static int experts_backward_dw13(struct mc_net *net, mc_layer *L, int E, const int32_t *c, const expert_bufs *B,
                                 mc_operand xpo) {
  mc_backend *be = net->be;
  const int d = net->m.d_model, F = net->m.expert_hidden;
  const off_rule xr = {d, 0}, fr = {F, 0}, w13 = {0, (int64_t)F * d};
  return experts_gemm(be, E, c, 1, 0, F, d, -1, buf_in(B->dh1, B->g16), F, fr, xpo, d, xr, 1.0f,
                      mc_o32(mc_g(net, L, MC_ROLE_MOE_W1)), d, w13) ||
         experts_gemm(be, E, c, 1, 0, F, d, -1, buf_in(B->dh3, B->g16), F, fr, xpo, d, xr, 1.0f,
                      mc_o32(mc_g(net, L, MC_ROLE_MOE_W3)), d, w13);
}

static int experts_backward(struct mc_net *net, mc_layer *L, int E, const int32_t *c, int64_t rows,
                            const expert_bufs *B, mc_operand xpo, mc_operand dyp, float *dxp) {
  return experts_backward_dx(net, L, E, c, rows, B, dyp, dxp) || experts_backward_dw13(net, L, E, c, B, xpo) ? -1 : 0;
}

/* The plain path: all n rows go to the one expert, the input is the layer's u (u16 under
 * mc_act16: train/net.c keeps it for a dense E block). */
static int moe_forward_dense(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  const int n = n_seq * net->par.moe_T;
  L->counts_host[0] = n, L->dropped = 0;
  for (int s = 0; s < n_seq; s++) L->aux_host[s] = 1.0f; /* E sum_e f_e P_e = 1 */
  /* x += y as the routed path's unpermute adds 1 * y: the product into scratch, then added */
  float *y = x ? net->g[MC_E_DYP] : NULL; /* x NULL (recomputation): no output product */
  const expert_bufs B = layer_bufs(net, L);
  if (experts_forward(net, L, 1, L->counts_host, n, &B, mc_uin(L), y)) return -1;
  if (x) net->be->axpy(net->be, x, y, (int64_t)n * net->m.d_model, 1.0f);
  return 0;
}

static int moe_backward_dense(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du) {
  const int n = n_seq * net->par.moe_T;
  /* dyp = 1 * dy = dy. The routed path's permute_bwd adds dxp into the zeroed du and the
   * router adds exact zeros, so du = dxp: the input gradient's products write du itself. */
  const expert_bufs B = layer_bufs(net, L);
  return experts_backward(net, L, 1, L->counts_host, n, &B, mc_uin(L), mc_dy_in(net, dy, (int64_t)n * net->m.d_model), du);
}

/* The activation slot whose micro-batch runs now (train/pipeline.c swaps slots into
 * net->layers): its E layers' EP routes are the ones this pass uses. */
static int ep_slot(const struct mc_net *net) { return net->n_slots > 1 ? net->cur_slot : 0; }

/* Expert parallelism (train/dist_ep.c): the rank's expert-sorted rows go to the EP ranks
 * owning their experts, this rank's E/ep experts run on what arrived (the received input,
 * h1, h3 and the SwiGLU output are saved with the layer's exchange plan, bf16 under
 * mc_act16, in the moe.scratch arena sized for the most rows routing can send there), and
 * their fp32 outputs come back into the layer's expert-output rows, in this rank's
 * expert-sorted order. */
static int experts_forward_ep(struct mc_net *net, mc_layer *L, int n) {
  mc_backend *be = net->be;
  mc_net_par *par = &net->par;
  const int d = net->m.d_model, E = net->m.n_experts, k = net->m.top_k;
  struct mc_ep_route *r = mc_ep_route_of(par, net->n_layers, L->layer, ep_slot(net));
  float *xl, *yr;
  if (!r || mc_ep_plan(par, r, L->counts_host, E)) return -1;
  const int64_t R = mc_ep_rows(r);
  if (mc_ep_scratch(par, &xl, &yr, NULL, NULL, NULL)) return -1;
  const int b16 = mc_act16(net);
  be->moe_permute(be, L->u, L->i[MC_E_SLOT], n, k, d, buf_out(xl, b16));
  if (mc_ep_dispatch(par, be, r, xl, mc_ep_saved(r, 0), d, b16, "dispatching the routed rows")) return -1;
  const expert_bufs B = {mc_ep_saved(r, 1), mc_ep_saved(r, 2), mc_ep_saved(r, 3), NULL, NULL, NULL, b16, b16};
  if (experts_forward(net, L, E / par->ep, mc_ep_counts(r), R, &B, buf_in(mc_ep_saved(r, 0), b16), yr)) return -1;
  return mc_ep_combine(par, be, r, yr, L->f[MC_E_YP], d, 0, "returning the expert outputs");
}

/* Its backward from the expert-output rows' gradient (dyp, this rank's expert-sorted order,
 * bf16 under mc_act16): dispatched like the input, the experts' backward on the received
 * rows, the input rows' gradient returned into net->g[MC_E_DXP] (after dyp was sent: dyp may
 * live there). The return travels on the side queue (comm/comm.h) while dW1 and dW3 are
 * formed, and the compute stream waits for it before anything reads DXP. */
static int experts_backward_ep(struct mc_net *net, mc_layer *L, const float *dyp) {
  mc_backend *be = net->be;
  mc_net_par *par = &net->par;
  const int d = net->m.d_model, E = net->m.n_experts;
  struct mc_ep_route *r = mc_ep_route_of(par, net->n_layers, L->layer, ep_slot(net));
  if (!r) return -1;
  const int64_t R = mc_ep_rows(r);
  float *dyr, *dxr;
  const int b16 = mc_act16(net);
  expert_bufs B = {mc_ep_saved(r, 1), mc_ep_saved(r, 2), mc_ep_saved(r, 3), NULL, NULL, NULL, b16, b16};
  const int El = E / par->ep;
  if (mc_ep_scratch(par, &dyr, &dxr, &B.da, &B.dh1, &B.dh3) ||
      mc_ep_dispatch(par, be, r, dyp, dyr, d, b16, "dispatching the expert-output gradients") ||
      experts_backward_dx(net, L, El, mc_ep_counts(r), R, &B, buf_in(dyr, b16), dxr))
    return -1;
  mc_comm *g = par->comm->ep;
  int ticket = -1;
  if (mc_comm_side_begin(g)) return -1;
  int rc = mc_ep_combine(par, be, r, dxr, net->g[MC_E_DXP], d, 0, "returning the input-row gradients");
  if (mc_comm_side_end(g, &ticket) || rc) return -1;
  rc = experts_backward_dw13(net, L, El, mc_ep_counts(r), &B, buf_in(mc_ep_saved(r, 0), b16));
  return mc_comm_side_wait(g, ticket) || rc ? -1 : 0;
}

static int moe_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  if (mc_moe_is_dense(net)) return moe_forward_dense(net, L, n_seq, x);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = net->par.moe_T, n = n_seq * T, d = m->d_model, E = m->n_experts, k = m->top_k;
  float **f = L->f;
  int32_t **iv = L->i;
  mc_linear_fwd(be, mc_f32(L->u), mc_wm(net, L, MC_ROLE_MOE_ROUTER), n, d, E, 0.0f, mc_o32(f[MC_E_LOGITS]));
  /* under SP on shards the statistics are completed over TP: the shard's mean probabilities
   * go to the router-logit gradient scratch, free in the forward ([n, E] >= [n_seq, E]) */
  const int sp_stats = net->par.moe_T != m->seq_len;
  float *pbar = sp_stats ? net->g[MC_E_DLOGITS] : NULL;
  be->moe_route(be, f[MC_E_LOGITS], n_seq, T, E, k, mc_moe_capacity(m), f[MC_E_PROBS], iv[MC_E_IDX], f[MC_E_GATE], iv[MC_E_SLOT], iv[MC_E_COUNTS],
                f[MC_E_FR], pbar, f[MC_E_AUX], iv[MC_E_DROPPED]);
  if (sp_stats && mc_sp_moe_aux(&net->par, be, E, f[MC_E_FR], pbar, n_seq, L->aux_host)) return -1;
  int32_t dropped = 0;
  be->to_host(be, L->counts_host, iv[MC_E_COUNTS], (size_t)E * sizeof(int32_t));
  if (!sp_stats) be->to_host(be, L->aux_host, f[MC_E_AUX], (size_t)n_seq * sizeof(float));
  be->to_host(be, &dropped, iv[MC_E_DROPPED], sizeof(int32_t));
  L->dropped = dropped;
  int64_t rows = 0;
  for (int e = 0; e < E; e++) rows += L->counts_host[e];
  if (net->par.ep > 1) {
    if (experts_forward_ep(net, L, n)) return -1;
    if (x) be->moe_unpermute(be, f[MC_E_YP], iv[MC_E_SLOT], f[MC_E_GATE], n, k, d, x);
    return 0;
  }
  be->moe_permute(be, L->u, iv[MC_E_SLOT], n, k, d, mc_saved_out(L, MC_E_XP));
  const mc_operand xpo = mc_saved_in(L, MC_E_XP);
  const expert_bufs B = layer_bufs(net, L);
  if (experts_forward(net, L, E, L->counts_host, rows, &B, xpo, f[MC_E_YP])) return -1;
  if (x) be->moe_unpermute(be, f[MC_E_YP], iv[MC_E_SLOT], f[MC_E_GATE], n, k, d, x);
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
  /* act16: dyp feeds only the two products (under EP: the dispatch to them), so it is written
   * in bf16 into DXP (read by those products, or sent, before the input-row gradient is
   * written into DXP); else the fp32 rows of DYP */
  const int dyp16 = mc_act16(net);
  be->moe_unpermute_bwd(be, dy, f[MC_E_YP], iv[MC_E_SLOT], f[MC_E_GATE], n, k, d,
                        dyp16 ? mc_o16(g[MC_E_DXP]) : mc_o32(mc_zeroed(be, g[MC_E_DYP], rows * d)),
                        mc_zeroed(be, g[MC_E_DGATE], (int64_t)n * k));
  if (net->par.ep > 1) {
    if (experts_backward_ep(net, L, dyp16 ? g[MC_E_DXP] : g[MC_E_DYP])) return -1;
  } else {
    const mc_operand dyp = dyp16 ? mc_b16(g[MC_E_DXP]) : mc_f32(g[MC_E_DYP]);
    const expert_bufs B = layer_bufs(net, L);
    if (experts_backward(net, L, E, c, rows, &B, mc_saved_in(L, MC_E_XP), dyp, g[MC_E_DXP])) return -1;
  }
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

/* Selective recomputation: the SwiGLU output from the kept h1 and h3, over the rows the
 * forward computed (every token on the plain path, the routed rows otherwise). Under ep > 1
 * the experts' rows, SwiGLU output included, live with the layer's exchange plan in
 * moe.scratch and are kept. */
static int moe_rebuild(struct mc_net *net, mc_layer *L, int n_seq) {
  const int dense = mc_moe_is_dense(net);
  if (!dense && net->par.ep > 1) return 0;
  int64_t rows = (int64_t)n_seq * net->par.moe_T;
  if (!dense) {
    rows = 0;
    for (int e = 0; e < net->m.n_experts; e++) rows += L->counts_host[e];
  }
  const expert_bufs B = layer_bufs(net, L);
  net->be->glu_fwd(net->be, MC_ACT_SILU, buf_in(B.h1, B.s16), buf_in(B.h3, B.s16), buf_out(B.a, B.s16),
                   rows * net->m.expert_hidden);
  return 0;
}

const mc_block_ops mc_block_moe = {'E', moe_forward, moe_backward, moe_rebuild};
