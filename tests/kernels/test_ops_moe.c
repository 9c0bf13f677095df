/* MoE ops of the CPU backend: routing (softmax, top-k ties to the lower index, renormalised
 * gates, per-sequence capacity, aux statistics), its backward against central differences,
 * and the permutation to and from the expert-sorted buffer (tolerance in kcheck.h). */
#include <string.h>

#include "kernels/bf16.h"
#include "tests/kernels/kcheck.h"

static mc_backend *be;

typedef struct {
  int n_seq, T, E, k, cap;
  float *logits, *probs, *gate, *f, *pbar, *aux, *Rg;
  int32_t *idx, *slot, *counts, dropped;
  float aux_scale;
} route_ctx;

static void route(route_ctx *c) {
  be->moe_route(be, c->logits, c->n_seq, c->T, c->E, c->k, c->cap, c->probs, c->idx, c->gate,
                c->slot, c->counts, c->f, c->pbar, c->aux, &c->dropped);
}

static route_ctx route_new(int n_seq, int T, int E, int k, int cap) {
  int n = n_seq * T;
  route_ctx c = {n_seq, T, E, k, cap, kc_zeros(n * E), kc_zeros(n * E), kc_zeros(n * k), kc_zeros(n_seq * E),
                 kc_zeros(n_seq * E), kc_zeros(n_seq), kc_rand(n * k, 100, 1), malloc(n * k * 4), malloc(n * k * 4), malloc(E * 4), 0, 0.7f};
  return c;
}

static void route_free(route_ctx *c) {
  free(c->logits), free(c->probs), free(c->gate), free(c->f), free(c->pbar), free(c->aux), free(c->Rg);
  free(c->idx), free(c->slot), free(c->counts);
}

/* L = sum(Rg * gate) + aux_scale * sum(aux): exercises both gradient paths of route_bwd. */
static double route_loss(void *p) {
  route_ctx *c = p;
  route(c);
  double a = 0.0;
  for (int s = 0; s < c->n_seq; s++) a += c->aux[s];
  return kc_dot(c->gate, c->Rg, (int64_t)c->n_seq * c->T * c->k) + c->aux_scale * a;
}

static void test_route(void) {
  /* ties: equal logits pick experts 0 and 1; (1, 3, 3, 2) picks 1 then 2, gates 1/2 each */
  route_ctx c = route_new(1, 2, 4, 2, 0);
  float lg[8] = {0, 0, 0, 0, 1, 3, 3, 2};
  memcpy(c.logits, lg, sizeof lg);
  route(&c);
  CHECK(c.idx[0] == 0 && c.idx[1] == 1, "tie order %d %d", c.idx[0], c.idx[1]);
  CHECK(c.idx[2] == 1 && c.idx[3] == 2, "tie order %d %d", c.idx[2], c.idx[3]);
  CHECK_CLOSE(c.gate[0], 0.5, 1e-6);
  CHECK_CLOSE(c.gate[3], 0.5, 1e-6);
  CHECK_CLOSE(c.probs[0], 0.25, 1e-6);
  /* rows: expert 0 {t0}, expert 1 {t0, t1}, expert 2 {t1} -> slots 0 | 1 2 | 3 */
  CHECK(c.slot[0] == 0 && c.slot[1] == 1 && c.slot[2] == 2 && c.slot[3] == 3, "slots %d %d %d %d",
        c.slot[0], c.slot[1], c.slot[2], c.slot[3]);
  CHECK(c.counts[0] == 1 && c.counts[1] == 2 && c.counts[2] == 1 && c.counts[3] == 0, "counts");
  /* f = (1, 2, 1, 0) / 4; P = mean probs; aux = E * sum f P */
  double P[4];
  for (int e = 0; e < 4; e++) P[e] = (c.probs[e] + c.probs[4 + e]) / 2;
  CHECK_CLOSE(c.aux[0], 4 * (0.25 * P[0] + 0.5 * P[1] + 0.25 * P[2]), 1e-6);
  for (int e = 0; e < 4; e++) CHECK_CLOSE(c.pbar[e], P[e], 1e-7);
  route_free(&c);

  /* capacity: 2 sequences of 4 tokens, E = 2, k = 1, every token prefers expert 0 except the
   * last token of sequence 1; capacity 2 drops tokens 2 and 3 of sequence 0 and token 2 of
   * sequence 1, counting afresh per sequence. Expert 1 gets one token. */
  c = route_new(2, 4, 2, 1, 2);
  for (int r = 0; r < 8; r++) {
    c.logits[r * 2] = r == 7 ? 0.0f : 1.0f;
    c.logits[r * 2 + 1] = r == 7 ? 1.0f : 0.0f;
  }
  route(&c);
  int32_t want[8] = {0, 1, -1, -1, 2, 3, -1, 4};
  for (int r = 0; r < 8; r++) CHECK(c.slot[r] == want[r], "capacity slot[%d] = %d, want %d", r, c.slot[r], want[r]);
  CHECK(c.dropped == 3, "dropped %d", c.dropped);
  CHECK(c.counts[0] == 4 && c.counts[1] == 1, "counts %d %d", c.counts[0], c.counts[1]);
  CHECK(c.f[0] == 1.0f && c.f[1] == 0.0f, "f counts assignments before dropping: %g %g", c.f[0], c.f[1]);
  CHECK(c.f[2] == 0.75f && c.f[3] == 0.25f, "f seq 1 %g %g", c.f[2], c.f[3]);
  route_free(&c);

  /* backward: gates through the renormalisation and the aux term, with drops */
  c = route_new(2, 5, 4, 2, 2);
  for (int r = 0; r < 10; r++)
    for (int e = 0; e < 4; e++)
      c.logits[r * 4 + e] = 0.4f * (float)((r * 7 + e * 3) % 4) + 0.05f * (float)mc_rng_normal(1, 7, r * 4 + e);
  route(&c);
  CHECK(c.dropped > 0, "the gradient case should drop something (dropped %d)", c.dropped);
  float *dlog = kc_zeros(40);
  be->moe_route_bwd(be, c.probs, c.idx, c.gate, c.Rg, c.f, 2, 5, 4, 2, c.aux_scale, dlog);
  kc_gradcheck("route.logits", c.logits, dlog, 40, route_loss, &c, 1000);
  free(dlog);
  route_free(&c);
}

/* ---- permute / unpermute: y = unpermute(permute(x), gate), L = sum(y * R) */
typedef struct {
  float *x, *xp, *gate, *y, *R;
  int32_t *slot;
  int n, k, d, rows;
} perm_ctx;

static double perm_loss(void *p) {
  perm_ctx *c = p;
  be->moe_permute(be, c->x, c->slot, c->n, c->k, c->d, (mc_dst){c->xp, NULL});
  memset(c->y, 0, (size_t)c->n * c->d * sizeof(float));
  be->moe_unpermute(be, c->xp, c->slot, c->gate, c->n, c->k, c->d, c->y);
  return kc_dot(c->y, c->R, (int64_t)c->n * c->d);
}

static void test_permute(void) {
  const int n = 4, k = 2, d = 3;
  int32_t slot[8] = {2, 0, -1, 4, 1, 3, 5, -1}; /* two dropped assignments */
  perm_ctx c = {kc_rand(n * d, 110, 1), kc_zeros(6 * d), kc_rand(n * k, 111, 1), kc_zeros(n * d),
                kc_rand(n * d, 112, 1), slot, n, k, d, 6};
  perm_loss(&c);
  for (int j = 0; j < d; j++) {
    CHECK(c.xp[2 * d + j] == c.x[j] && c.xp[0 * d + j] == c.x[j] && c.xp[4 * d + j] == c.x[d + j], "gather");
    CHECK_CLOSE(c.y[d + j], c.gate[3] * c.x[d + j], 1e-6); /* row 1 keeps only its second choice */
  }
  float *dxp = kc_zeros(6 * d), *dgate = kc_zeros(n * k), *dx = kc_zeros(n * d);
  be->moe_unpermute_bwd(be, c.R, c.xp, slot, c.gate, n, k, d, (mc_dst){dxp, NULL}, dgate);
  be->moe_permute_bwd(be, dxp, slot, n, k, d, dx);
  CHECK(dgate[2] == 0.0f && dgate[7] == 0.0f, "dropped assignments get no gate gradient");
  kc_gradcheck("permute.x", c.x, dx, n * d, perm_loss, &c, 1000);
  kc_gradcheck("unpermute.gate", c.gate, dgate, n * k, perm_loss, &c, 1000);
  /* bf16 outputs: the fp32 values rounded once (a bf16 dyp is written, not added) */
  mc_bf16 xp16[6 * 3], dxp16[6 * 3];
  float *dxp2 = kc_zeros(6 * d), *dgate2 = kc_zeros(n * k);
  be->moe_permute(be, c.x, slot, n, k, d, (mc_dst){NULL, xp16});
  be->moe_unpermute_bwd(be, c.R, c.xp, slot, c.gate, n, k, d, (mc_dst){NULL, dxp16}, dgate2);
  be->moe_unpermute_bwd(be, c.R, c.xp, slot, c.gate, n, k, d, (mc_dst){dxp2, NULL}, dgate2);
  int same = 1;
  for (int i = 0; i < 6 * d; i++)
    same &= xp16[i] == mc_bf16_from_float(c.xp[i]) && dxp16[i] == mc_bf16_from_float(dxp2[i]);
  CHECK(same, "moe_permute and moe_unpermute_bwd into bf16: the fp32 rows rounded");
  free(dxp2), free(dgate2);
  free(c.x), free(c.xp), free(c.gate), free(c.y), free(c.R), free(dxp), free(dgate), free(dx);
}

int main(void) {
  be = mc_backend_cpu();
  test_route();
  test_permute();
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  return mc_check_exit("test_ops_moe");
}
