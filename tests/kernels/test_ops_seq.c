/* Sequence ops of the CPU backend: causal GQA attention, causal depthwise conv, Mamba-2
 * selective scan, RG-LRU scan. Backwards against central differences (tolerance in
 * kcheck.h) on two sequences, so a leak across the sequence boundary shows; forwards
 * against values computed by hand. */
#include <string.h>

#include "kernels/bf16.h"
#include "tests/kernels/kcheck.h"

static mc_backend *be;

/* ------------------------------------------------------------------ attention */
typedef struct {
  float *q, *k, *v, *out, *lse, *R;
  int n_seq, T, H, KV, hd;
} attn_ctx;

static double attn_loss(void *p) {
  attn_ctx *c = p;
  be->attn_fwd(be, (mc_operand){c->q, NULL}, (mc_operand){c->k, NULL}, (mc_operand){c->v, NULL}, c->n_seq, c->T, c->H, c->KV, c->hd, (mc_dst){c->out, NULL}, c->lse);
  return kc_dot(c->out, c->R, (int64_t)c->n_seq * c->T * c->H * c->hd);
}

static void test_attn(void) {
  /* by hand: T = 2, one head, hd = 2; s(1,0) = 0, s(1,1) = ln 3 -> weights 1/4, 3/4 */
  float q[4] = {7, 7, 1, 0}, k[4] = {0, 0, (float)(sqrt(2.0) * log(3.0)), 0};
  float v[4] = {1, 0, 0, 1}, out[4], lse[2];
  be->attn_fwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, 1, 2, 1, 1, 2, (mc_dst){out, NULL}, lse);
  CHECK(out[0] == 1 && out[1] == 0, "row 0 attends only to itself: %g %g", out[0], out[1]);
  CHECK_CLOSE(out[2], 0.25, 1e-6);
  CHECK_CLOSE(out[3], 0.75, 1e-6);
  CHECK_CLOSE(lse[1], log(4.0), 1e-6);

  const int n_seq = 2, T = 5, H = 4, KV = 2, hd = 4, n = n_seq * T;
  attn_ctx c = {kc_rand(n * H * hd, 60, 1), kc_rand(n * KV * hd, 61, 1), kc_rand(n * KV * hd, 62, 1),
                kc_zeros(n * H * hd), kc_zeros(n * H), kc_rand(n * H * hd, 63, 1), n_seq, T, H, KV, hd};
  float *dq = kc_zeros(n * H * hd), *dk = kc_zeros(n * KV * hd), *dv = kc_zeros(n * KV * hd);
  attn_loss(&c);
  be->attn_bwd(be, (mc_operand){c.q, NULL}, (mc_operand){c.k, NULL}, (mc_operand){c.v, NULL}, (mc_operand){c.out, NULL}, c.lse, (mc_operand){c.R, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);
  kc_gradcheck("attn.q", c.q, dq, n * H * hd, attn_loss, &c, 1000);
  kc_gradcheck("attn.k", c.k, dk, n * KV * hd, attn_loss, &c, 1000);
  kc_gradcheck("attn.v", c.v, dv, n * KV * hd, attn_loss, &c, 1000);
  /* causality: changing the last token of sequence 0 leaves its earlier rows unchanged */
  float *before = malloc((size_t)n * H * hd * sizeof(float));
  attn_loss(&c); /* the checks above leave out from a perturbed evaluation */
  memcpy(before, c.out, (size_t)n * H * hd * sizeof(float));
  c.k[(T - 1) * KV * hd] += 1.0f;
  c.v[(T - 1) * KV * hd] += 1.0f;
  attn_loss(&c);
  CHECK(memcmp(before, c.out, (size_t)(T - 1) * H * hd * sizeof(float)) == 0, "future token leaked");
  CHECK(memcmp(before + T * H * hd, c.out + T * H * hd, (size_t)T * H * hd * sizeof(float)) == 0,
        "other sequence changed");
  free(before), free(c.q), free(c.k), free(c.v), free(c.out), free(c.lse), free(c.R);
  free(dq), free(dk), free(dv);
}

/* Attention on bf16-stored q, k, v, out, dout (kernels/ops.h): the same bits as the fp32 op on
 * the widened values, a bf16 out being the fp32 out rounded; the gradients stay fp32 sums. */
static void test_attn_bf16(void) {
  const int n_seq = 2, T = 6, H = 4, KV = 2, hd = 8, n = n_seq * T;
  const int64_t nq = (int64_t)n * H * hd, nk = (int64_t)n * KV * hd;
  float *q = kc_rand(nq, 70, 1), *k = kc_rand(nk, 71, 1), *v = kc_rand(nk, 72, 1), *g = kc_rand(nq, 73, 1);
  mc_bf16 *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *g16 = malloc(nq * 2), *o16 = malloc(nq * 2);
  for (int64_t i = 0; i < nq; i++) q16[i] = mc_bf16_from_float(q[i]), q[i] = mc_bf16_to_float(q16[i]);
  for (int64_t i = 0; i < nq; i++) g16[i] = mc_bf16_from_float(g[i]), g[i] = mc_bf16_to_float(g16[i]);
  for (int64_t i = 0; i < nk; i++) k16[i] = mc_bf16_from_float(k[i]), k[i] = mc_bf16_to_float(k16[i]);
  for (int64_t i = 0; i < nk; i++) v16[i] = mc_bf16_from_float(v[i]), v[i] = mc_bf16_to_float(v16[i]);
  float *out = kc_zeros(nq), *lse = kc_zeros((int64_t)n * H), *lse16 = kc_zeros((int64_t)n * H);
  be->attn_fwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, n_seq, T, H, KV, hd,
               (mc_dst){out, NULL}, lse);
  be->attn_fwd(be, (mc_operand){NULL, q16}, (mc_operand){NULL, k16}, (mc_operand){NULL, v16}, n_seq, T, H, KV, hd,
               (mc_dst){NULL, o16}, lse16);
  int64_t bad = 0;
  for (int64_t i = 0; i < nq; i++) bad += o16[i] != mc_bf16_from_float(out[i]);
  CHECK(bad == 0 && memcmp(lse, lse16, (size_t)n * H * sizeof(float)) == 0,
        "attn_fwd on bf16 storage: %lld outputs differ from the fp32 op's rounded, or lse differs", (long long)bad);
  /* backward from the bf16 out (widened for the fp32 call) */
  for (int64_t i = 0; i < nq; i++) out[i] = mc_bf16_to_float(o16[i]);
  float *dq = kc_zeros(nq), *dk = kc_zeros(nk), *dv = kc_zeros(nk);
  float *dq16 = kc_zeros(nq), *dk16 = kc_zeros(nk), *dv16 = kc_zeros(nk);
  be->attn_bwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){out, NULL}, lse,
               (mc_operand){g, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);
  be->attn_bwd(be, (mc_operand){NULL, q16}, (mc_operand){NULL, k16}, (mc_operand){NULL, v16}, (mc_operand){NULL, o16},
               lse16, (mc_operand){NULL, g16}, n_seq, T, H, KV, hd, dq16, dk16, dv16);
  CHECK(memcmp(dq, dq16, nq * 4) == 0 && memcmp(dk, dk16, nk * 4) == 0 && memcmp(dv, dv16, nk * 4) == 0,
        "attn_bwd on bf16 storage equals the fp32 op on the widened values");
  CHECK(be->sync(be) == 0, "attention on bf16 storage: %s", mc_errmsg());
  free(q), free(k), free(v), free(g), free(q16), free(k16), free(v16), free(g16), free(o16), free(out), free(lse);
  free(lse16), free(dq), free(dk), free(dv), free(dq16), free(dk16), free(dv16);
}

/* ------------------------------------------------------------------ conv + SiLU */
typedef struct {
  float *x, *w, *b, *y, *R;
  int n_seq, T, c, K;
} conv_ctx;

static double conv_loss(void *p) {
  conv_ctx *c = p;
  be->conv_silu_fwd(be, c->x, c->w, c->b, c->n_seq, c->T, c->c, c->K, c->y);
  return kc_dot(c->y, c->R, (int64_t)c->n_seq * c->T * c->c);
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

static void test_conv(void) {
  /* by hand: w = (0.1, 0.2, 0.3), b = 0.05, x = (1, 2, 3); w[K-1] multiplies the current step:
   * pre = (0.35, 0.85, 1.45), then SiLU */
  float x[3] = {1, 2, 3}, w[3] = {0.1f, 0.2f, 0.3f}, b[1] = {0.05f}, y[3];
  be->conv_silu_fwd(be, x, w, b, 1, 3, 1, 3, y);
  CHECK(fabs(y[0] - silu(0.35)) < 1e-6 && fabs(y[1] - silu(0.85)) < 1e-6 && fabs(y[2] - silu(1.45)) < 1e-6,
        "conv %g %g %g", y[0], y[1], y[2]);
  be->conv_silu_fwd(be, x, w, b, 3, 1, 1, 3, y); /* three sequences of one step: no history */
  CHECK(fabs(y[0] - silu(0.35)) < 1e-6 && fabs(y[1] - silu(0.65)) < 1e-6 && fabs(y[2] - silu(0.95)) < 1e-6,
        "conv per sequence %g %g %g", y[0], y[1], y[2]);

  const int n_seq = 2, T = 6, C = 3, K = 4, n = n_seq * T;
  conv_ctx c = {kc_rand(n * C, 70, 1), kc_rand(C * K, 71, 1), kc_rand(C, 72, 1), kc_zeros(n * C),
                kc_rand(n * C, 73, 1), n_seq, T, C, K};
  float *dx = kc_zeros(n * C), *dw = kc_zeros(C * K), *db = kc_zeros(C);
  be->conv_silu_bwd(be, c.x, c.w, c.b, c.R, n_seq, T, C, K, (mc_dst){dx, NULL}, dw, db);
  kc_gradcheck("conv.x", c.x, dx, n * C, conv_loss, &c, 1000);
  kc_gradcheck("conv.w", c.w, dw, C * K, conv_loss, &c, 1000);
  kc_gradcheck("conv.b", c.b, db, C, conv_loss, &c, 1000);
  /* a bf16 dx is written: the fp32 gradient (formed from zero) rounded once */
  mc_bf16 *dx16 = malloc((size_t)n * C * sizeof *dx16);
  float *dw2 = kc_zeros(C * K), *db2 = kc_zeros(C);
  for (int i = 0; i < n * C; i++) dx16[i] = 0x7fc0; /* NaN: every element must be written */
  be->conv_silu_bwd(be, c.x, c.w, c.b, c.R, n_seq, T, C, K, (mc_dst){NULL, dx16}, dw2, db2);
  int same = memcmp(dw, dw2, sizeof(float) * C * K) == 0 && memcmp(db, db2, sizeof(float) * C) == 0;
  for (int i = 0; i < n * C; i++) same &= dx16[i] == mc_bf16_from_float(dx[i]);
  CHECK(same, "conv_silu_bwd into a bf16 dx: dx rounds the fp32 one, dw and db unchanged");
  free(dx16), free(dw2), free(db2);
  free(c.x), free(c.w), free(c.b), free(c.y), free(c.R), free(dx), free(dw), free(db);
}

/* conv + SiLU against a direct double-precision evaluation of its formulas (kernels/ops.h) on
 * 40 random shapes, T below and above K, K = 1 included: y, dx, dw, db within float rounding */
static void test_conv_shapes(void) {
  int bad = 0;
  double worst = 0.0;
  for (int cs = 0; cs < 40; cs++) {
    const int n_seq = 1 + cs % 3, T = 1 + (cs * 7) % 13, c = 1 + (cs * 5) % 9, K = 1 + cs % 5, n = n_seq * T * c;
    float *x = kc_rand(n, 200 + cs, 1), *w = kc_rand(c * K, 300 + cs, 1), *b = kc_rand(c, 400 + cs, 1);
    float *dy = kc_rand(n, 500 + cs, 1), *y = kc_zeros(n), *dx = kc_zeros(n), *dw = kc_zeros(c * K), *db = kc_zeros(c);
    be->conv_silu_fwd(be, x, w, b, n_seq, T, c, K, y);
    be->conv_silu_bwd(be, x, w, b, dy, n_seq, T, c, K, (mc_dst){dx, NULL}, dw, db);
    double *rdx = calloc((size_t)n, sizeof(double)), *rdw = calloc((size_t)(c * K), sizeof(double));
    double *rdb = calloc((size_t)c, sizeof(double));
    for (int s = 0; s < n_seq; s++)
      for (int t = 0; t < T; t++)
        for (int ch = 0; ch < c; ch++) {
          double pre = b[ch];
          for (int j = 0; j < K; j++)
            if (t - K + 1 + j >= 0) pre += (double)w[ch * K + j] * x[((s * T) + t - K + 1 + j) * c + ch];
          const double sg = 1.0 / (1.0 + exp(-pre)), o = (s * T + t) * c + ch;
          const double g = dy[(int64_t)o] * sg * (1.0 + pre * (1.0 - sg));
          double e = fabs(y[(int64_t)o] - pre * sg) / (1.0 + fabs(pre * sg));
          worst = e > worst ? e : worst, bad += e > 1e-5;
          rdb[ch] += g;
          for (int j = 0; j < K; j++) {
            const int tt = t - K + 1 + j;
            if (tt < 0) continue;
            rdx[(s * T + tt) * c + ch] += w[ch * K + j] * g;
            rdw[ch * K + j] += g * x[(s * T + tt) * c + ch];
          }
        }
    for (int i = 0; i < n; i++) bad += fabs(dx[i] - rdx[i]) > 1e-5 * (1.0 + fabs(rdx[i]));
    for (int i = 0; i < c * K; i++) bad += fabs(dw[i] - rdw[i]) > 1e-5 * (1.0 + fabs(rdw[i]));
    for (int i = 0; i < c; i++) bad += fabs(db[i] - rdb[i]) > 1e-5 * (1.0 + fabs(rdb[i]));
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(rdx), free(rdw), free(rdb);
  }
  CHECK(bad == 0, "conv_silu on 40 random shapes: %d values off the double-precision formulas (worst y %.2e)", bad, worst);
}

/* ------------------------------------------------------------------ selective scan */
typedef struct {
  float *x, *dt, *A_log, *B, *C, *D, *y, *R;
  int n_seq, T, Hm, P, N;
} ssm_ctx;

static double ssm_loss(void *p) {
  ssm_ctx *c = p;
  be->ssm_fwd(be, c->x, c->dt, c->A_log, c->B, c->C, c->D, c->n_seq, c->T, c->Hm, c->P, c->N, c->y);
  return kc_dot(c->y, c->R, (int64_t)c->n_seq * c->T * c->Hm * c->P);
}

static void test_ssm(void) {
  /* by hand, 2 tokens, one head/channel/state: A = -1, dt = (0.5, 1), x = (2, 3),
   * B = (1, 2), C = (3, 4), D = 0.5: S0 = 1, y0 = 3 + 1 = 4; S1 = e^-1 + 6, y1 = 4 S1 + 1.5 */
  float x[2] = {2, 3}, dt[2] = {0.5f, 1.0f}, Al[1] = {0}, B[2] = {1, 2}, C[2] = {3, 4}, D[1] = {0.5f}, y[2];
  be->ssm_fwd(be, x, dt, Al, B, C, D, 1, 2, 1, 1, 1, y);
  CHECK_CLOSE(y[0], 4.0, 1e-6);
  CHECK_CLOSE(y[1], 4.0 * (exp(-1.0) + 6.0) + 1.5, 1e-6);

  const int n_seq = 2, T = 5, Hm = 2, P = 3, N = 4, n = n_seq * T;
  ssm_ctx c = {kc_rand(n * Hm * P, 80, 1), kc_rand(n * Hm, 81, 1), kc_rand(Hm, 82, 0.5f), kc_rand(n * N, 83, 1),
               kc_rand(n * N, 84, 1), kc_rand(Hm, 85, 1), kc_zeros(n * Hm * P), kc_rand(n * Hm * P, 86, 1),
               n_seq, T, Hm, P, N};
  for (int i = 0; i < n * Hm; i++) c.dt[i] = log1pf(expf(c.dt[i]));
  float *dx = kc_zeros(n * Hm * P), *ddt = kc_zeros(n * Hm), *dA = kc_zeros(Hm), *dB = kc_zeros(n * N);
  float *dC = kc_zeros(n * N), *dD = kc_zeros(Hm);
  be->ssm_bwd(be, c.x, c.dt, c.A_log, c.B, c.C, c.D, c.R, n_seq, T, Hm, P, N, dx, ddt, dA, dB, dC, dD);
  kc_gradcheck("ssm.x", c.x, dx, n * Hm * P, ssm_loss, &c, 1000);
  kc_gradcheck("ssm.dt", c.dt, ddt, n * Hm, ssm_loss, &c, 1000);
  kc_gradcheck("ssm.A_log", c.A_log, dA, Hm, ssm_loss, &c, 1000);
  kc_gradcheck("ssm.B", c.B, dB, n * N, ssm_loss, &c, 1000);
  kc_gradcheck("ssm.C", c.C, dC, n * N, ssm_loss, &c, 1000);
  kc_gradcheck("ssm.D", c.D, dD, Hm, ssm_loss, &c, 1000);
  free(c.x), free(c.dt), free(c.A_log), free(c.B), free(c.C), free(c.D), free(c.y), free(c.R);
  free(dx), free(ddt), free(dA), free(dB), free(dC), free(dD);
}

/* ------------------------------------------------------------------ RG-LRU */
typedef struct {
  float *gx, *r, *lambda, *h, *R;
  int n_seq, T, c;
} lru_ctx;

static double lru_loss(void *p) {
  lru_ctx *c = p;
  be->rglru_fwd(be, c->gx, c->r, c->lambda, c->n_seq, c->T, c->c, c->h);
  return kc_dot(c->h, c->R, (int64_t)c->n_seq * c->T * c->c);
}

static void test_rglru(void) {
  /* by hand: lambda = 0 (softplus = ln 2), r = (0.5, 1): a0 = 2^-4, a1 = 2^-8;
   * h0 = sqrt(1 - a0^2) gx0, h1 = a1 h0 + sqrt(1 - a1^2) gx1 */
  float gx[2] = {1.0f, 2.0f}, r[2] = {0.5f, 1.0f}, lam[1] = {0}, h[2];
  be->rglru_fwd(be, gx, r, lam, 1, 2, 1, h);
  double h0 = sqrt(1.0 - 1.0 / 256.0), h1 = h0 / 256.0 + 2.0 * sqrt(1.0 - 1.0 / 65536.0);
  CHECK_CLOSE(h[0], h0, 1e-6);
  CHECK_CLOSE(h[1], h1, 1e-6);

  const int n_seq = 2, T = 6, C = 3, n = n_seq * T;
  lru_ctx c = {kc_rand(n * C, 90, 1), kc_rand(n * C, 91, 1), kc_rand(C, 92, 1), kc_zeros(n * C),
               kc_rand(n * C, 93, 1), n_seq, T, C};
  for (int i = 0; i < n * C; i++) c.r[i] = 1.0f / (1.0f + expf(-c.r[i]));
  /* lambda near -2 keeps a = exp(-8 softplus(lambda) r) in the trained range (~0.4-0.99)
   * where the finite-difference step resolves the curvature */
  for (int i = 0; i < C; i++) c.lambda[i] -= 2.0f;
  float *dgx = kc_zeros(n * C), *dr = kc_zeros(n * C), *dl = kc_zeros(C);
  lru_loss(&c);
  be->rglru_bwd(be, c.gx, c.r, c.lambda, c.h, c.R, n_seq, T, C, dgx, dr, dl);
  kc_gradcheck("rglru.gx", c.gx, dgx, n * C, lru_loss, &c, 1000);
  kc_gradcheck("rglru.r", c.r, dr, n * C, lru_loss, &c, 1000);
  kc_gradcheck("rglru.lambda", c.lambda, dl, C, lru_loss, &c, 1000);
  free(c.gx), free(c.r), free(c.lambda), free(c.h), free(c.R), free(dgx), free(dr), free(dl);
}

int main(void) {
  be = mc_backend_cpu();
  test_attn();
  test_attn_bf16();
  test_conv();
  test_conv_shapes();
  test_ssm();
  test_rglru();
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  return mc_check_exit("test_ops_seq");
}
