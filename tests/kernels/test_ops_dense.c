/* Dense ops of the CPU backend: gemm (plain, strided, grouped), bias, activations, gated
 * units, embedding, RMSNorm, RoPE, cross-entropy, sum of squares, AdamW, copy_2d, copy_bf16. Each
 * backward is checked against central differences (tolerance in kcheck.h); a few forward
 * values are computed by hand so a forward bug cannot hide behind a matching backward. */
#include <string.h>

#include "kernels/bf16.h"
#include "tests/kernels/kcheck.h"

static mc_backend *be;

/* ------------------------------------------------------------------ gemm */
static void naive_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0.0;
      for (int p = 0; p < K; p++)
        s += (double)(ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      C[i * ldc + j] = (float)(alpha * s + beta * C[i * ldc + j]);
    }
}

static void test_gemm(void) {
  const int M = 5, N = 4, K = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      float *A = kc_rand(M * K, 1, 1), *B = kc_rand(K * N, 2, 1);
      float *C = kc_rand(M * N, 3, 1), *R = malloc(M * N * sizeof(float));
      memcpy(R, C, M * N * sizeof(float));
      int lda = ta ? M : K, ldb = tb ? K : N;
      be->gemm(be, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, N);
      naive_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, R, N);
      for (int i = 0; i < M * N; i++) CHECK_CLOSE(C[i], R[i], 1e-5);
      free(A), free(B), free(C), free(R);
    }
  /* 2x2 by hand: [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50] */
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
  be->gemm(be, 0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  CHECK(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50, "2x2 product %g %g %g %g", c[0], c[1], c[2], c[3]);

  /* grouped: three experts with 2, 0 and 3 rows; X[m,d] W[e]^T -> Y[m,F]; and the weight
   * gradient form dW[e] = dY_e^T X_e whose K is the row count (0 for the empty group). */
  const int d = 3, F = 2, E = 3, rows[3] = {2, 0, 3};
  float *X = kc_rand(5 * d, 4, 1), *W = kc_rand(E * F * d, 5, 1), *Y = kc_zeros(5 * F);
  float *Yr = kc_zeros(5 * F);
  int Ms[3], Ns[3], Ks[3];
  int64_t ao[3], bo[3], co[3];
  for (int e = 0, off = 0; e < E; off += rows[e], e++) {
    Ms[e] = rows[e], Ns[e] = F, Ks[e] = d;
    ao[e] = (int64_t)off * d, bo[e] = (int64_t)e * F * d, co[e] = (int64_t)off * F;
    naive_gemm(0, 1, rows[e], F, d, 1.0f, X + ao[e], d, W + bo[e], d, 0.0f, Yr + co[e], F);
  }
  be->gemm_grouped(be, 0, 1, E, Ms, Ns, Ks, 1.0f, X, ao, d, W, bo, d, 0.0f, Y, co, F);
  for (int i = 0; i < 5 * F; i++) CHECK_CLOSE(Y[i], Yr[i], 1e-5);
  float *dW = kc_rand(E * F * d, 6, 1), *dWr = malloc(E * F * d * sizeof(float));
  memcpy(dWr, dW, E * F * d * sizeof(float));
  for (int e = 0; e < E; e++) {
    Ms[e] = F, Ns[e] = d, Ks[e] = rows[e];
    int64_t t = ao[e];
    ao[e] = co[e], co[e] = bo[e], bo[e] = t; /* A = dY rows, B = X rows, C = dW[e] */
    naive_gemm(1, 0, F, d, rows[e], 1.0f, Y + ao[e], F, X + bo[e], d, 1.0f, dWr + co[e], d);
  }
  be->gemm_grouped(be, 1, 0, E, Ms, Ns, Ks, 1.0f, Y, ao, F, X, bo, d, 1.0f, dW, co, d);
  for (int i = 0; i < E * F * d; i++) CHECK_CLOSE(dW[i], dWr[i], 1e-5);
  /* the empty expert's gradient is untouched */
  float *d0 = kc_rand(E * F * d, 6, 1);
  for (int i = F * d; i < 2 * F * d; i++) CHECK(dW[i] == d0[i], "empty group changed dW[%d]", i);
  /* strided batch equals the loop of single products */
  float *Cs = kc_zeros(3 * M * N), *A3 = kc_rand(3 * M * K, 7, 1), *B3 = kc_rand(3 * K * N, 8, 1);
  be->gemm_strided(be, 0, 0, M, N, K, 1.0f, A3, K, M * K, B3, N, K * N, 0.0f, Cs, N, M * N, 3);
  for (int i = 0; i < 3; i++) {
    float ref[20] = {0};
    naive_gemm(0, 0, M, N, K, 1.0f, A3 + i * M * K, K, B3 + i * K * N, N, 0.0f, ref, N);
    for (int j = 0; j < M * N; j++) CHECK_CLOSE(Cs[i * M * N + j], ref[j], 1e-5);
  }
  free(X), free(W), free(Y), free(Yr), free(dW), free(dWr), free(d0), free(Cs), free(A3), free(B3);
}

/* gemm_ex / gemm_grouped_ex with a bf16 B, a bf16 A, or both: bitwise the fp32 products on
 * the operands widened from bf16; to_bf16: bitwise kernels/bf16.h's rounding. */
static void test_gemm_ex(void) {
  const int M = 7, N = 5, K = 6;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, brows = tb ? N : K;
      float *A = kc_rand((ta ? K : M) * lda, 11, 1), *Bf = kc_rand(brows * ldb, 12, 1);
      mc_bf16 *B16 = malloc(brows * ldb * sizeof(mc_bf16));
      be->to_bf16(be, Bf, B16, brows * ldb);
      for (int i = 0; i < brows * ldb; i++) {
        CHECK(B16[i] == mc_bf16_from_float(Bf[i]), "to_bf16 element %d", i);
        Bf[i] = mc_bf16_to_float(B16[i]);
      }
      float *C = kc_rand(M * N, 13, 1), *R = malloc(M * N * sizeof(float));
      memcpy(R, C, M * N * sizeof(float));
      be->gemm_ex(be, ta, tb, M, N, K, 0.5f, (mc_operand){A, NULL}, lda, (mc_operand){NULL, B16}, ldb, 0.75f, (mc_dst){C, NULL}, N);
      be->gemm(be, ta, tb, M, N, K, 0.5f, A, lda, Bf, ldb, 0.75f, R, N);
      CHECK(memcmp(C, R, M * N * sizeof(float)) == 0, "gemm_ex bf16 B ta=%d tb=%d equals gemm on the widened B", ta, tb);
      /* A in bf16 too, then A alone */
      const int64_t na = (int64_t)(ta ? K : M) * lda;
      mc_bf16 *A16 = malloc((size_t)na * sizeof(mc_bf16));
      float *Aw = malloc((size_t)na * sizeof(float));
      be->to_bf16(be, A, A16, na);
      for (int64_t i = 0; i < na; i++) Aw[i] = mc_bf16_to_float(A16[i]);
      memcpy(C, R, M * N * sizeof(float));
      be->gemm_ex(be, ta, tb, M, N, K, 0.5f, (mc_operand){NULL, A16}, lda, (mc_operand){NULL, B16}, ldb, 0.75f, (mc_dst){C, NULL}, N);
      be->gemm(be, ta, tb, M, N, K, 0.5f, Aw, lda, Bf, ldb, 0.75f, R, N);
      CHECK(memcmp(C, R, M * N * sizeof(float)) == 0, "gemm_ex bf16 A and B ta=%d tb=%d", ta, tb);
      be->gemm_ex(be, ta, tb, M, N, K, 0.5f, (mc_operand){NULL, A16}, lda, (mc_operand){Bf, NULL}, ldb, 0.75f, (mc_dst){C, NULL}, N);
      be->gemm(be, ta, tb, M, N, K, 0.5f, Aw, lda, Bf, ldb, 0.75f, R, N);
      CHECK(memcmp(C, R, M * N * sizeof(float)) == 0, "gemm_ex bf16 A ta=%d tb=%d", ta, tb);
      free(A16), free(Aw);
      /* grouped: 3 groups of rows (2, 0, 3) against weights [3][N][K] (tb = 1 form) */
      const int rows[3] = {2, 0, 3};
      float *X = kc_rand(5 * K, 14, 1), *W = kc_rand(3 * N * K, 15, 1), *Y = kc_rand(5 * N, 16, 1);
      float *Yr = malloc(5 * N * sizeof(float));
      mc_bf16 *W16 = malloc(3 * N * K * sizeof(mc_bf16));
      be->to_bf16(be, W, W16, 3 * N * K);
      for (int i = 0; i < 3 * N * K; i++) W[i] = mc_bf16_to_float(W16[i]);
      memcpy(Yr, Y, 5 * N * sizeof(float));
      int Ms[3], Ns[3], Ks[3];
      int64_t ao[3], bo[3], co[3];
      for (int e = 0, off = 0; e < 3; off += rows[e], e++)
        Ms[e] = rows[e], Ns[e] = N, Ks[e] = K, ao[e] = (int64_t)off * K, bo[e] = (int64_t)e * N * K,
        co[e] = (int64_t)off * N;
      be->gemm_grouped_ex(be, 0, 1, 3, Ms, Ns, Ks, 1.0f, (mc_operand){X, NULL}, ao, K, (mc_operand){NULL, W16}, bo, K,
                          0.5f, (mc_dst){Y, NULL}, co, N);
      be->gemm_grouped(be, 0, 1, 3, Ms, Ns, Ks, 1.0f, X, ao, K, W, bo, K, 0.5f, Yr, co, N);
      CHECK(memcmp(Y, Yr, 5 * N * sizeof(float)) == 0, "gemm_grouped_ex equals gemm_grouped on the widened weights");
      free(A), free(Bf), free(B16), free(C), free(R), free(X), free(W), free(Y), free(Yr), free(W16);
    }
  CHECK(be->sync(be) == 0, "bf16-weight products: %s", mc_errmsg());
}

/* Outputs stored in bf16 (mc_dst with h set): gemm_ex, gemm_grouped_ex, glu_fwd/bwd,
 * rmsnorm_fwd and xent_bwd write exactly the fp32 result rounded (kernels/bf16.h), bf16
 * gradients are written (not added), and a bf16 product result with beta != 0 is refused. */
static int rounded_equal(const mc_bf16 *h, const float *f, int64_t n, int64_t ld, int64_t cols) {
  for (int64_t i = 0; i < n; i++)
    if (i % ld < cols && h[i] != mc_bf16_from_float(f[i])) return 0;
  return 1;
}

static mc_bf16 *rounded(const float *x, int64_t n) {
  mc_bf16 *h = malloc((size_t)n * sizeof(mc_bf16));
  for (int64_t i = 0; i < n; i++) h[i] = mc_bf16_from_float(x[i]);
  return h;
}

static float *widened(const mc_bf16 *h, int64_t n) {
  float *f = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) f[i] = mc_bf16_to_float(h[i]);
  return f;
}

static void test_bf16_outputs(void) {
  const int M = 6, N = 5, K = 7, ldc = N + 3;
  float *A = kc_rand(M * K, 40, 1), *B = kc_rand(K * N, 41, 1), *R = kc_zeros(M * ldc);
  mc_bf16 *C16 = calloc(M * ldc, sizeof(mc_bf16)), *B16 = rounded(B, K * N);
  float *Bw = widened(B16, K * N);
  be->gemm_ex(be, 0, 0, M, N, K, 0.5f, (mc_operand){A, NULL}, K, (mc_operand){NULL, B16}, N, 0.0f,
              (mc_dst){NULL, C16}, ldc);
  be->gemm(be, 0, 0, M, N, K, 0.5f, A, K, Bw, N, 0.0f, R, ldc);
  CHECK(rounded_equal(C16, R, M * ldc, ldc, N), "gemm_ex bf16 C is the fp32 product rounded");
  int untouched = 1;
  for (int i = 0; i < M * ldc; i++) untouched &= i % ldc < N || C16[i] == 0;
  CHECK(untouched, "gemm_ex bf16 C: columns past N (within ldc) untouched");
  CHECK(be->sync(be) == 0, "bf16 products: %s", mc_errmsg());
  be->gemm_ex(be, 0, 0, M, N, K, 1.0f, (mc_operand){A, NULL}, K, (mc_operand){B, NULL}, N, 1.0f,
              (mc_dst){NULL, C16}, ldc);
  CHECK(be->sync(be) != 0 && strstr(mc_errmsg(), "beta"), "gemm_ex bf16 C with beta 1 refused (%s)", mc_errmsg());
  /* grouped: rows (3, 0, 3) of A against three K x N blocks of B-like weights (tb = 0) */
  float *W = kc_rand(3 * K * N, 42, 1), *Rg = kc_zeros(M * ldc);
  mc_bf16 *G16 = calloc(M * ldc, sizeof(mc_bf16));
  int Ms[3] = {3, 0, 3}, Ns[3] = {N, N, N}, Ks[3] = {K, K, K};
  int64_t ao[3] = {0, 3 * K, 3 * K}, bo[3] = {0, K * N, 2 * K * N}, co[3] = {0, 3 * ldc, 3 * ldc};
  be->gemm_grouped_ex(be, 0, 0, 3, Ms, Ns, Ks, 1.0f, (mc_operand){A, NULL}, ao, K, (mc_operand){W, NULL}, bo, N, 0.0f,
                      (mc_dst){NULL, G16}, co, ldc);
  be->gemm_grouped(be, 0, 0, 3, Ms, Ns, Ks, 1.0f, A, ao, K, W, bo, N, 0.0f, Rg, co, ldc);
  CHECK(rounded_equal(G16, Rg, M * ldc, ldc, N), "gemm_grouped_ex bf16 C is the fp32 grouped product rounded");
  CHECK(be->sync(be) == 0, "bf16 grouped products: %s", mc_errmsg());

  /* glu: bf16 inputs and outputs against the fp32 op on the widened inputs */
  const int64_t n = 300;
  for (int act = 0; act < 4; act++) {
    float *a = kc_rand(n, 43, 2), *b = kc_rand(n, 44, 1), *dy = kc_rand(n, 45, 1);
    mc_bf16 *a16 = rounded(a, n), *b16 = rounded(b, n), *dy16 = rounded(dy, n);
    float *aw = widened(a16, n), *bw = widened(b16, n), *dyw = widened(dy16, n);
    float *y = kc_zeros(n), *da = kc_rand(n, 46, 1), *db = kc_rand(n, 47, 1);
    mc_bf16 *y16 = calloc(n, sizeof(mc_bf16)), *da16 = rounded(da, n), *db16 = rounded(db, n);
    be->glu_fwd(be, (mc_act)act, (mc_operand){NULL, a16}, (mc_operand){NULL, b16}, (mc_dst){NULL, y16}, n);
    be->glu_fwd(be, (mc_act)act, (mc_operand){aw, NULL}, (mc_operand){bw, NULL}, (mc_dst){y, NULL}, n);
    CHECK(rounded_equal(y16, y, n, n, n), "glu_fwd act %d: bf16 y is the fp32 y rounded", act);
    memset(da, 0, n * sizeof(float)), memset(db, 0, n * sizeof(float));
    be->glu_bwd(be, (mc_act)act, (mc_operand){NULL, a16}, (mc_operand){NULL, b16}, (mc_operand){NULL, dy16},
                (mc_dst){NULL, da16}, (mc_dst){NULL, db16}, n);
    be->glu_bwd(be, (mc_act)act, (mc_operand){aw, NULL}, (mc_operand){bw, NULL}, (mc_operand){dyw, NULL},
                (mc_dst){da, NULL}, (mc_dst){db, NULL}, n);
    CHECK(rounded_equal(da16, da, n, n, n) && rounded_equal(db16, db, n, n, n),
          "glu_bwd act %d: bf16 da, db are written as the fp32 gradients rounded", act);
    free(a), free(b), free(dy), free(a16), free(b16), free(dy16), free(aw), free(bw), free(dyw);
    free(y), free(da), free(db), free(y16), free(da16), free(db16);
  }

  /* rmsnorm_fwd into bf16 (per-head groups), xent_bwd into bf16 */
  float *x = kc_rand(4 * 8, 48, 1), *w = kc_rand(8, 49, 1), *yn = kc_zeros(32), *rs = kc_zeros(8), *rs16 = kc_zeros(8);
  mc_bf16 *yn16 = calloc(32, sizeof(mc_bf16));
  be->rmsnorm_fwd(be, x, w, 4, 8, 4, 1e-5f, (mc_dst){yn, NULL}, rs);
  be->rmsnorm_fwd(be, x, w, 4, 8, 4, 1e-5f, (mc_dst){NULL, yn16}, rs16);
  CHECK(rounded_equal(yn16, yn, 32, 32, 32) && memcmp(rs, rs16, 8 * sizeof(float)) == 0,
        "rmsnorm_fwd bf16 y is the fp32 y rounded, the same rstd");
  float *lg = kc_rand(3 * 8, 50, 2), *loss = kc_zeros(3), *lse = kc_zeros(3), *dl = kc_zeros(24);
  mc_bf16 *dl16 = calloc(24, sizeof(mc_bf16));
  int32_t tgt[3] = {0, 5, 2};
  be->xent_fwd(be, lg, tgt, 3, 6, 8, loss, lse);
  be->xent_bwd(be, lg, tgt, lse, 3, 6, 8, 0.25f, (mc_dst){dl, NULL});
  be->xent_bwd(be, lg, tgt, lse, 3, 6, 8, 0.25f, (mc_dst){NULL, dl16});
  CHECK(rounded_equal(dl16, dl, 24, 24, 24), "xent_bwd bf16 dlogits is the fp32 one rounded");
  CHECK(be->sync(be) == 0, "bf16 outputs: %s", mc_errmsg());
  free(A), free(B), free(R), free(C16), free(B16), free(Bw), free(W), free(Rg), free(G16);
  free(x), free(w), free(yn), free(rs), free(rs16), free(yn16), free(lg), free(loss), free(lse), free(dl), free(dl16);
}

/* ------------------------------------------------------------------ activations, glu */
typedef struct {
  mc_act act;
  int glu;
  float *a, *b, *y, *R;
  int64_t n;
} act_ctx;

static double act_loss(void *p) {
  act_ctx *c = p;
  if (c->glu) be->glu_fwd(be, c->act, (mc_operand){c->a, NULL}, (mc_operand){c->b, NULL}, (mc_dst){c->y, NULL}, c->n);
  else be->act_fwd(be, c->act, c->a, c->y, c->n);
  return kc_dot(c->y, c->R, c->n);
}

static void test_act(void) {
  const char *names[4] = {"silu", "gelu", "sigmoid", "softplus"};
  float one[2] = {1.0f, 0.0f}, out[2];
  double want1[4] = {0.7310585786, 0.8413447461, 0.7310585786, 1.3132616875};
  double want0[4] = {0.0, 0.0, 0.5, 0.6931471806};
  for (int a = 0; a < 4; a++) {
    be->act_fwd(be, (mc_act)a, one, out, 2);
    CHECK_CLOSE(out[0], want1[a], 1e-6);
    CHECK(fabs(out[1] - want0[a]) < 1e-7, "%s(0) = %g", names[a], out[1]);
    for (int glu = 0; glu < 2; glu++) {
      const int64_t n = 40;
      act_ctx c = {(mc_act)a, glu, kc_rand(n, 10, 2), kc_rand(n, 11, 1), kc_zeros(n), kc_rand(n, 12, 1), n};
      float *da = kc_zeros(n), *db = kc_zeros(n);
      if (glu)
        be->glu_bwd(be, c.act, (mc_operand){c.a, NULL}, (mc_operand){c.b, NULL}, (mc_operand){c.R, NULL},
                    (mc_dst){da, NULL}, (mc_dst){db, NULL}, n);
      else be->act_bwd(be, c.act, c.a, c.R, da, n);
      char what[32];
      snprintf(what, sizeof what, "%s%s.a", glu ? "glu-" : "", names[a]);
      kc_gradcheck(what, c.a, da, n, act_loss, &c, 1000);
      if (glu) {
        snprintf(what, sizeof what, "glu-%s.b", names[a]);
        kc_gradcheck(what, c.b, db, n, act_loss, &c, 1000);
      }
      free(c.a), free(c.b), free(c.y), free(c.R), free(da), free(db);
    }
  }
  /* bias: forward adds per column, backward sums columns (and accumulates) */
  float y[6] = {0, 0, 0, 1, 1, 1}, b[3] = {1, 2, 3}, db[3] = {10, 0, 0};
  be->bias_fwd(be, y, b, 2, 3);
  CHECK(y[0] == 1 && y[2] == 3 && y[3] == 2 && y[5] == 4, "bias_fwd");
  be->bias_bwd(be, y, 2, 3, db);
  CHECK(db[0] == 13 && db[1] == 5 && db[2] == 7, "bias_bwd %g %g %g", db[0], db[1], db[2]);
}

/* ------------------------------------------------------------------ embedding */
static void test_embed(void) {
  const int V = 5, d = 3, n = 4;
  int32_t tok[4] = {2, 0, 2, 4};
  float *W = kc_rand(V * d, 20, 1), *y = kc_zeros(n * d), *dy = kc_rand(n * d, 21, 1);
  float *dW = kc_zeros(V * d);
  be->embed_fwd(be, tok, n, d, W, y);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < d; j++) CHECK(y[r * d + j] == W[tok[r] * d + j], "gather row %d", r);
  be->embed_bwd(be, tok, n, d, dy, dW);
  for (int j = 0; j < d; j++) {
    CHECK_CLOSE(dW[2 * d + j], dy[0 * d + j] + dy[2 * d + j], 1e-6); /* repeated token adds */
    CHECK(dW[1 * d + j] == 0.0f && dW[3 * d + j] == 0.0f, "unused rows stay zero");
    CHECK(dW[4 * d + j] == dy[3 * d + j], "row 4");
  }
  free(W), free(y), free(dy), free(dW);
}

/* ------------------------------------------------------------------ rmsnorm */
typedef struct {
  float *x, *w, *y, *rstd, *R;
  int n, d, group;
} norm_ctx;

static double norm_loss(void *p) {
  norm_ctx *c = p;
  be->rmsnorm_fwd(be, c->x, c->w, c->n, c->d, c->group, 1e-5f, (mc_dst){c->y, NULL}, c->rstd);
  return kc_dot(c->y, c->R, (int64_t)c->n * c->d);
}

static void test_rmsnorm(void) {
  /* by hand: x = (3, 4), mean square 12.5 -> y = x / sqrt(12.5 + eps) * w */
  float x[2] = {3, 4}, w[2] = {1, 2}, y[2], rs[1];
  be->rmsnorm_fwd(be, x, w, 1, 2, 2, 1e-5f, (mc_dst){y, NULL}, rs);
  CHECK_CLOSE(y[0], 3.0 / sqrt(12.50001), 1e-6);
  CHECK_CLOSE(y[1], 8.0 / sqrt(12.50001), 1e-6);
  for (int group = 8; group >= 4; group -= 4) {
    norm_ctx c = {kc_rand(3 * 8, 30, 1), kc_rand(8, 31, 1), kc_zeros(24), kc_zeros(24), kc_rand(24, 32, 1), 3, 8, group};
    float *dx = kc_zeros(24), *dw = kc_zeros(8);
    norm_loss(&c);
    be->rmsnorm_bwd(be, c.x, c.w, c.rstd, c.R, 3, 8, group, dx, dw);
    kc_gradcheck(group == 8 ? "rmsnorm.x" : "rmsnorm-grp.x", c.x, dx, 24, norm_loss, &c, 1000);
    kc_gradcheck(group == 8 ? "rmsnorm.w" : "rmsnorm-grp.w", c.w, dw, 8, norm_loss, &c, 1000);
    free(c.x), free(c.w), free(c.y), free(c.rstd), free(c.R), free(dx), free(dw);
  }
}

/* ------------------------------------------------------------------ gated rmsnorm */
typedef struct {
  float *y, *z, *w, *out, *rstd, *R;
  int n, d, group;
} gnorm_ctx;

static double gnorm_loss(void *p) {
  gnorm_ctx *c = p;
  be->gated_rmsnorm_fwd(be, c->y, (mc_operand){c->z, NULL}, c->w, c->n, c->d, c->group, 1e-5f, (mc_dst){c->out, NULL},
                        c->rstd);
  return kc_dot(c->out, c->R, (int64_t)c->n * c->d);
}

static void test_gated_rmsnorm(void) {
  /* against the two ops it replaces: g = silu(z) * y by glu_fwd, then rmsnorm_fwd and its
   * backward, then glu_bwd: the same bits (the same float operations in the same order) */
  const int n = 3, d = 8, group = 4, m = n * d;
  gnorm_ctx c = {kc_rand(m, 40, 1), kc_rand(m, 41, 1), kc_rand(d, 42, 1), kc_zeros(m), kc_zeros(n * 2),
                 kc_rand(m, 43, 1), n, d, group};
  float *g = kc_zeros(m), *ref = kc_zeros(m), *rs2 = kc_zeros(n * 2);
  gnorm_loss(&c);
  be->glu_fwd(be, MC_ACT_SILU, (mc_operand){c.z, NULL}, (mc_operand){c.y, NULL}, (mc_dst){g, NULL}, m);
  be->rmsnorm_fwd(be, g, c.w, n, d, group, 1e-5f, (mc_dst){ref, NULL}, rs2);
  CHECK(memcmp(ref, c.out, sizeof(float) * m) == 0 && memcmp(rs2, c.rstd, sizeof(float) * n * 2) == 0,
        "gated_rmsnorm_fwd equals glu_fwd then rmsnorm_fwd bit for bit");
  float *dy = kc_zeros(m), *dz = kc_zeros(m), *dw = kc_zeros(d);
  float *dg = kc_zeros(m), *dy2 = kc_zeros(m), *dz2 = kc_zeros(m), *dw2 = kc_zeros(d);
  be->gated_rmsnorm_bwd(be, c.y, (mc_operand){c.z, NULL}, c.w, c.rstd, c.R, n, d, group, dy, (mc_dst){dz, NULL}, dw);
  be->rmsnorm_bwd(be, g, c.w, rs2, c.R, n, d, group, dg, dw2);
  be->glu_bwd(be, MC_ACT_SILU, (mc_operand){c.z, NULL}, (mc_operand){c.y, NULL}, (mc_operand){dg, NULL},
              (mc_dst){dz2, NULL}, (mc_dst){dy2, NULL}, m);
  CHECK(memcmp(dy, dy2, sizeof(float) * m) == 0 && memcmp(dz, dz2, sizeof(float) * m) == 0 &&
            memcmp(dw, dw2, sizeof(float) * d) == 0,
        "gated_rmsnorm_bwd equals rmsnorm_bwd then glu_bwd bit for bit");
  kc_gradcheck("gated_rmsnorm.y", c.y, dy, m, gnorm_loss, &c, 1000);
  kc_gradcheck("gated_rmsnorm.z", c.z, dz, m, gnorm_loss, &c, 1000);
  kc_gradcheck("gated_rmsnorm.w", c.w, dw, d, gnorm_loss, &c, 1000);
  /* z and dz in bf16: z widened, dz written (the fp32 one rounded) */
  mc_bf16 z16[24], dz16[24];
  float zw[24], *dyb = kc_zeros(m), *dwb = kc_zeros(d), *dzf = kc_zeros(m), *dyf = kc_zeros(m), *dwf = kc_zeros(d);
  for (int i = 0; i < m; i++) z16[i] = mc_bf16_from_float(c.z[i]), zw[i] = mc_bf16_to_float(z16[i]);
  be->gated_rmsnorm_bwd(be, c.y, (mc_operand){NULL, z16}, c.w, c.rstd, c.R, n, d, group, dyb, (mc_dst){NULL, dz16}, dwb);
  be->gated_rmsnorm_bwd(be, c.y, (mc_operand){zw, NULL}, c.w, c.rstd, c.R, n, d, group, dyf, (mc_dst){dzf, NULL}, dwf);
  int same = memcmp(dyb, dyf, sizeof(float) * m) == 0 && memcmp(dwb, dwf, sizeof(float) * d) == 0;
  for (int i = 0; i < m; i++) same &= dz16[i] == mc_bf16_from_float(dzf[i]);
  CHECK(same, "gated_rmsnorm_bwd on bf16 z and dz: the fp32 op on the widened z, dz rounded");
  free(c.y), free(c.z), free(c.w), free(c.out), free(c.rstd), free(c.R), free(g), free(ref), free(rs2);
  free(dy), free(dz), free(dw), free(dg), free(dy2), free(dz2), free(dw2), free(dyb), free(dwb), free(dzf), free(dyf),
      free(dwf);
}

/* gated_rmsnorm against a direct double-precision evaluation of its formulas on 30 random
 * shapes (one group, several, groups of one column): out, dy, dz, dw within float rounding */
static void test_gated_rmsnorm_shapes(void) {
  int bad = 0;
  for (int cs = 0; cs < 30; cs++) {
    const int group = 1 + cs % 6, ng = 1 + (cs * 7) % 4, d = group * ng, n = 1 + (cs * 5) % 7, m = n * d;
    float *y = kc_rand(m, 600 + cs, 1), *z = kc_rand(m, 700 + cs, 1), *w = kc_rand(d, 800 + cs, 1);
    float *dout = kc_rand(m, 900 + cs, 1), *out = kc_zeros(m), *rs = kc_zeros(n * ng);
    float *dy = kc_zeros(m), *dz = kc_zeros(m), *dw = kc_zeros(d);
    be->gated_rmsnorm_fwd(be, y, (mc_operand){z, NULL}, w, n, d, group, 1e-5f, (mc_dst){out, NULL}, rs);
    be->gated_rmsnorm_bwd(be, y, (mc_operand){z, NULL}, w, rs, dout, n, d, group, dy, (mc_dst){dz, NULL}, dw);
    double *rdw = calloc((size_t)d, sizeof(double));
    for (int r = 0; r < n; r++)
      for (int gi = 0; gi < ng; gi++) {
        const int o = r * d + gi * group;
        double g[6], ss = 0.0, dot = 0.0;
        for (int j = 0; j < group; j++) {
          g[j] = z[o + j] / (1.0 + exp(-(double)z[o + j])) * y[o + j];
          ss += g[j] * g[j];
          dot += (double)dout[o + j] * w[gi * group + j] * g[j];
        }
        const double rstd = 1.0 / sqrt(ss / group + 1e-5);
        for (int j = 0; j < group; j++) {
          const double zj = z[o + j], sg = 1.0 / (1.0 + exp(-zj));
          const double dg = rstd * (dout[o + j] * w[gi * group + j] - g[j] * rstd * rstd * dot / group);
          const double ry = g[j] * rstd * w[gi * group + j], rdy = dg * zj * sg, rdz = dg * y[o + j] * sg * (1.0 + zj * (1.0 - sg));
          bad += fabs(out[o + j] - ry) > 1e-5 * (1.0 + fabs(ry));
          bad += fabs(dy[o + j] - rdy) > 1e-5 * (1.0 + fabs(rdy));
          bad += fabs(dz[o + j] - rdz) > 1e-5 * (1.0 + fabs(rdz));
          rdw[gi * group + j] += dout[o + j] * g[j] * rstd;
        }
      }
    for (int j = 0; j < d; j++) bad += fabs(dw[j] - rdw[j]) > 1e-5 * (1.0 + fabs(rdw[j]));
    free(y), free(z), free(w), free(dout), free(out), free(rs), free(dy), free(dz), free(dw), free(rdw);
  }
  CHECK(bad == 0, "gated_rmsnorm on 30 random shapes: %d values off the double-precision formulas", bad);
}

/* ------------------------------------------------------------------ rope */
typedef struct {
  float *x, *y, *R;
  int n, T, heads, hd;
} rope_ctx;

static double rope_loss(void *p) {
  rope_ctx *c = p;
  int64_t m = (int64_t)c->n * c->heads * c->hd;
  memcpy(c->y, c->x, m * sizeof(float));
  be->rope_fwd(be, (mc_dst){c->y, NULL}, c->n, c->T, c->heads, c->hd, 100.0);
  return kc_dot(c->y, c->R, m);
}

static void test_rope(void) {
  /* hd = 4, theta = 100, position 1: pair (0,2) rotated by 1 rad, pair (1,3) by 0.1 rad;
   * row 0 is position 0 (unchanged); with T = 2 row 2 is position 0 again. */
  float x[12] = {9, 9, 9, 9, 1, 0, 0, 1, 5, 6, 7, 8};
  be->rope_fwd(be, (mc_dst){x, NULL}, 3, 2, 1, 4, 100.0);
  CHECK(x[0] == 9 && x[3] == 9, "position 0 unchanged");
  CHECK_CLOSE(x[4], cos(1.0), 1e-6);
  CHECK_CLOSE(x[6], sin(1.0), 1e-6);
  CHECK_CLOSE(x[5], -sin(0.1), 1e-5);
  CHECK_CLOSE(x[7], cos(0.1), 1e-6);
  CHECK(x[8] == 5 && x[11] == 8, "positions restart every sequence");
  rope_ctx c = {kc_rand(6 * 2 * 8, 40, 1), kc_zeros(96), kc_rand(96, 41, 1), 6, 3, 2, 8};
  float *dx = kc_zeros(96);
  be->rope_bwd(be, (mc_operand){c.R, NULL}, (mc_dst){dx, NULL}, 6, 3, 2, 8, 100.0);
  /* bf16 storage: in place, the fp32 rotation of the widened values rounded; the backward into
   * a bf16 dx writes the rounded rotation (not added) */
  {
    float wx[96], wd[96];
    mc_bf16 h[96], hd16[96];
    for (int i = 0; i < 96; i++) h[i] = mc_bf16_from_float(c.x[i]), wx[i] = mc_bf16_to_float(h[i]), hd16[i] = 0x3f80;
    be->rope_fwd(be, (mc_dst){wx, NULL}, 6, 3, 2, 8, 100.0);
    be->rope_fwd(be, (mc_dst){NULL, h}, 6, 3, 2, 8, 100.0);
    memset(wd, 0, sizeof wd);
    be->rope_bwd(be, (mc_operand){c.R, NULL}, (mc_dst){wd, NULL}, 6, 3, 2, 8, 100.0);
    be->rope_bwd(be, (mc_operand){c.R, NULL}, (mc_dst){NULL, hd16}, 6, 3, 2, 8, 100.0);
    int bad = 0;
    for (int i = 0; i < 96; i++) bad += h[i] != mc_bf16_from_float(wx[i]) || hd16[i] != mc_bf16_from_float(wd[i]);
    CHECK(bad == 0, "rope on bf16 storage: %d elements differ from the rounded fp32 rotation", bad);
  }
  kc_gradcheck("rope.x", c.x, dx, 96, rope_loss, &c, 1000);
  free(c.x), free(c.y), free(c.R), free(dx);
}

/* ------------------------------------------------------------------ cross-entropy */
typedef struct {
  float *logits, *loss, *lse;
  int32_t *tgt;
  int n, V, Vp;
} xent_ctx;

static double xent_loss(void *p) {
  xent_ctx *c = p;
  be->xent_fwd(be, c->logits, c->tgt, c->n, c->V, c->Vp, c->loss, c->lse);
  double s = 0.0;
  for (int r = 0; r < c->n; r++) s += 0.5 * c->loss[r];
  return s;
}

static void test_xent(void) {
  /* V = 3 real columns, 1 padded column holding a huge logit that must be ignored:
   * loss = log(e^0 + e^1 + e^2) - 1 for target 1. */
  float lg[4] = {0, 1, 2, 1000}, loss[1], lse[1], dl[4];
  int32_t t[1] = {1};
  be->xent_fwd(be, lg, t, 1, 3, 4, loss, lse);
  CHECK_CLOSE(loss[0], log(1 + exp(1.0) + exp(2.0)) - 1.0, 1e-6);
  be->xent_bwd(be, lg, t, lse, 1, 3, 4, 1.0f, (mc_dst){dl, NULL});
  CHECK(dl[3] == 0.0f, "padded column gradient %g", dl[3]);
  CHECK_CLOSE(dl[1], exp(1.0) / (1 + exp(1.0) + exp(2.0)) - 1.0, 1e-6);
  xent_ctx c = {kc_rand(4 * 8, 50, 2), kc_zeros(4), kc_zeros(4), malloc(4 * sizeof(int32_t)), 4, 6, 8};
  for (int r = 0; r < 4; r++) c.tgt[r] = (r * 5) % 6;
  float *d = kc_zeros(32);
  xent_loss(&c);
  be->xent_bwd(be, c.logits, c.tgt, c.lse, 4, 6, 8, 0.5f, (mc_dst){d, NULL});
  kc_gradcheck("xent.logits", c.logits, d, 32, xent_loss, &c, 1000);
  free(c.logits), free(c.loss), free(c.lse), free(c.tgt), free(d);
}

/* ------------------------------------------------------------------ copy_bf16 */
/* Bit patterns copied as they are (a NaN's payload and -0 included), an odd count into an odd
 * offset, nothing past it; a count of 0 writes nothing. */
static void test_copy_bf16(void) {
  enum { N = 7 };
  const mc_bf16 src[N] = {0x3f80, 0x8000, 0x7fc1, 0xff81, 0x0001, 0xc2f7, 0x7f80};
  mc_bf16 dst[N + 2];
  for (int i = 0; i < N + 2; i++) dst[i] = 0x1234;
  be->copy_bf16(be, dst + 1, src, N);
  be->copy_bf16(be, dst, src, 0);
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  int bad = dst[0] != 0x1234 || dst[N + 1] != 0x1234;
  for (int i = 0; i < N; i++) bad += dst[1 + i] != src[i];
  CHECK(bad == 0, "copy_bf16: %d values differ", bad);
}

/* ------------------------------------------------------------------ copy_2d */
/* A column block out of a wider matrix and back into another pitch, against the loop of the
 * definition; elements outside the rows' `width` floats keep their sentinel. */
static void test_copy_2d(void) {
  enum { H = 5, SP = 9, W = 4, DP = 6 };
  float *src = kc_rand(H * SP, 7, 1), dst[H * DP], back[H * SP];
  for (int i = 0; i < H * DP; i++) dst[i] = -99.0f;
  for (int i = 0; i < H * SP; i++) back[i] = -99.0f;
  be->copy_2d(be, dst, DP, src + 2, SP, W, H); /* columns 2..5 */
  int bad = 0;
  for (int r = 0; r < H; r++)
    for (int j = 0; j < DP; j++) bad += dst[r * DP + j] != (j < W ? src[r * SP + 2 + j] : -99.0f);
  be->copy_2d(be, back + 3, SP, dst, DP, W, H); /* into columns 3..6 of a 9-wide matrix */
  for (int r = 0; r < H; r++)
    for (int j = 0; j < SP; j++) bad += back[r * SP + j] != (j >= 3 && j < 3 + W ? src[r * SP + j - 1] : -99.0f);
  CHECK(bad == 0, "copy_2d: %d elements differ from the loop", bad);
  be->copy_2d(be, dst, DP, src, SP, 0, H); /* empty: nothing written */
  be->copy_2d(be, dst, DP, src, SP, W, 0);
  CHECK(dst[0] == src[2], "copy_2d of nothing wrote");
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  be->copy_2d(be, dst, 2, src, SP, W, H); /* dpitch below the width */
  CHECK(be->sync(be) != 0, "copy_2d with a pitch below the width was accepted");
  free(src);
}

/* ------------------------------------------------------------------ reductions, adamw */
static void test_misc(void) {
  const int64_t n = 200000; /* more than one reduction chunk */
  float *x = kc_zeros(n);
  for (int64_t i = 0; i < n; i++) x[i] = (i % 3) - 1.0f; /* -1, 0, 1, ... */
  CHECK(be->sumsq(be, x, n) == (double)((n + 1) / 3 + n / 3), "sumsq %g", be->sumsq(be, x, n));
  be->axpy(be, x, x, n, 1.0f);
  be->scale(be, x, n, 0.25f);
  CHECK(x[0] == -0.5f && x[2] == 0.5f, "axpy/scale");
  be->fill(be, x, n, 3.0f);
  CHECK(x[n - 1] == 3.0f, "fill");
  free(x);
  /* AdamW step 1 by hand: g' = g*s; m = (1-b1) g'; v = (1-b2) g'^2; mhat = g', vhat = g'^2,
   * w = w (1 - lr wd) - lr g' / (|g'| + eps). */
  float w[2] = {1.0f, -2.0f}, g[2] = {0.5f, -4.0f}, m[2] = {0}, v[2] = {0};
  mc_adamw_args a = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                     .step = 1, .grad_scale = 0.5f};
  be->adamw(be, w, g, m, v, 2, &a);
  CHECK_CLOSE(w[0], 1.0 * 0.99 - 0.1 * 0.25 / (0.25 + 1e-8), 1e-6);
  CHECK_CLOSE(w[1], -2.0 * 0.99 + 0.1 * 2.0 / (2.0 + 1e-8), 1e-6);
  CHECK_CLOSE(m[1], 0.1 * -2.0, 1e-6);
  CHECK_CLOSE(v[1], 0.05 * 4.0, 1e-6);
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
}

int main(void) {
  be = mc_backend_cpu();
  test_gemm();
  test_gemm_ex();
  test_bf16_outputs();
  test_act();
  test_embed();
  test_rmsnorm();
  test_gated_rmsnorm();
  test_gated_rmsnorm_shapes();
  test_rope();
  test_xent();
  test_misc();
  test_copy_2d();
  test_copy_bf16();
  return mc_check_exit("test_ops_dense");
}
