/* The CUDA backend against the CPU reference, op by op, forward and backward, on random
 * inputs. Gradient buffers start from the same random values on both backends (backward
 * ops add), forward outputs start as NaN on the GPU (every element must be written), and
 * each result is compared by the norm-wise relative error |gpu - cpu| / |cpu| against a
 * tolerance stated per op below. Integer outputs (routing) must match exactly.
 * The bf16-products instance's matrix products are checked against bands of their own
 * (test_bf16). Without a CUDA build or a GPU it prints "SKIP: no CUDA device" and passes.
 * `test_cuda_ops --shapes` also runs and times model-sized shapes (see run_shapes);
 * `test_cuda_ops --grouped` only the expert products at nam-small's shapes (grouped_time). */
#include <string.h>
#include <time.h>

#include "tests/kernels/cudacheck.h"
#include "tests/kernels/kcheck.h"
#ifdef MC_HAVE_CUDA
#include "kernels/backend_cuda.h"
#include "kernels/bf16.h"

/* Tolerances (norm-wise relative error), fp32 on both sides:
 * - TOL_EXACT: the same float operations per element; only FMA contraction and the
 *   device libm (expf, erff, log1pf: <= 2 ulp) differ, a few 1e-8.
 * - TOL_SUM: reductions in double on both sides, summed in another order.
 * - TOL_GEMM: fp32 products, cuBLAS blocks and orders the K sum differently (~sqrt(K) eps).
 * - TOL_ATTN: the online softmax rescales partial sums and the backward sums over keys or
 *   queries in tiles of 32 instead of one running float sum.
 * - TOL_SCAN: long fp32 recurrences (T steps) whose sums run in another order: the GPU's
 *   selective scan is the chunked (SSD) form, products inside chunks of 64 and a state pass
 *   between them (kernels/cuda/cuda_ssm.cu), the CPU's the step-by-step recurrence.
 * - TOL_CPU_FSUM: the CPU reference itself sums over all n rows in float (conv_bwd's dw in
 *   kernels/cpu/cpu_conv.c), an error growing with n (1.1e-6 at n = 4096); the GPU sums in
 *   double, so the difference is the CPU's rounding. */
#define TOL_EXACT 1e-6
#define TOL_CPU_FSUM 1e-5
#define TOL_SUM 1e-6
#define TOL_GEMM 1e-5
#define TOL_ATTN 1e-5
#define TOL_SCAN 1e-5

static mc_backend *cpu, *gpu;

/* ------------------------------------------------------------------ buffers of one case */
#define MAX_PTRS 512
static void *dev_ptrs[MAX_PTRS], *host_ptrs[MAX_PTRS];
static int n_dev, n_host;
static uint64_t stream_no = 5000;

static void *track_host(void *p) {
  if (n_host < MAX_PTRS) host_ptrs[n_host++] = p;
  return p;
}

static void *dalloc(size_t bytes) {
  void *p = gpu->alloc(gpu, bytes);
  if (!p) {
    fprintf(stderr, "device allocation of %zu bytes failed: %s\n", bytes, mc_errmsg());
    exit(1);
  }
  if (n_dev < MAX_PTRS) dev_ptrs[n_dev++] = p;
  return p;
}

static void case_end(void) {
  for (int i = 0; i < n_dev; i++) gpu->free(gpu, dev_ptrs[i]);
  for (int i = 0; i < n_host; i++) free(host_ptrs[i]);
  n_dev = n_host = 0;
}

static float *hrand(int64_t n, float scale) { return track_host(kc_rand(n, stream_no++, scale)); }
static float *hzeros(int64_t n) { return track_host(kc_zeros(n)); }
static float *hcopy(const float *x, int64_t n) {
  float *y = track_host(malloc((size_t)(n ? n : 1) * sizeof(float)));
  memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}
static float *up(const float *h, int64_t n) {
  float *d = dalloc((size_t)(n ? n : 1) * sizeof(float));
  gpu->from_host(gpu, d, h, (size_t)n * sizeof(float));
  return d;
}
static int32_t *upi(const int32_t *h, int64_t n) {
  int32_t *d = dalloc((size_t)(n ? n : 1) * sizeof(int32_t));
  gpu->from_host(gpu, d, h, (size_t)n * sizeof(int32_t));
  return d;
}
/* A device buffer full of NaN: a forward output that must be written everywhere. */
static float *dnan(int64_t n) {
  float *h = track_host(malloc((size_t)(n ? n : 1) * sizeof(float)));
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  return up(h, n);
}
static float *down(const float *d, int64_t n) {
  float *h = track_host(malloc((size_t)(n ? n : 1) * sizeof(float)));
  gpu->to_host(gpu, h, d, (size_t)n * sizeof(float));
  return h;
}
static int32_t *downi(const int32_t *d, int64_t n) {
  int32_t *h = track_host(malloc((size_t)(n ? n : 1) * sizeof(int32_t)));
  gpu->to_host(gpu, h, d, (size_t)n * sizeof(int32_t));
  return h;
}

/* ------------------------------------------------------------------ comparison */
static double worst_ratio = 0.0;

static void cmp(const char *op, const float *g_dev, const float *ref, int64_t n, double tol) {
  const float *g = down(g_dev, n);
  double num = 0.0, den = 0.0, maxabs = 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isfinite(ref[i]) != isfinite(g[i])) bad++;
    if (!isfinite(ref[i]) || !isfinite(g[i])) continue;
    double d = (double)g[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
    if (fabs(d) > maxabs) maxabs = fabs(d);
  }
  double rel = bad ? INFINITY : (den > 0 ? sqrt(num / den) : sqrt(num));
  printf("  %-26s %9lld  rel %.2e  max|d| %.2e  tol %.0e  %s\n", op, (long long)n, rel, maxabs, tol,
         rel <= tol ? "ok" : "FAIL");
  if (rel / tol > worst_ratio) worst_ratio = rel / tol;
  CHECK(rel <= tol, "%s: relative error %.3e above %.0e (%lld non-finite mismatches)", op, rel, tol, (long long)bad);
}

static void cmpi(const char *op, const int32_t *g_dev, const int32_t *ref, int64_t n) {
  const int32_t *g = downi(g_dev, n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += g[i] != ref[i];
  printf("  %-26s %9lld  mismatches %lld  %s\n", op, (long long)n, (long long)bad, bad ? "FAIL" : "ok");
  CHECK(bad == 0, "%s: %lld of %lld integers differ", op, (long long)bad, (long long)n);
}

static void synced(const char *what) {
  CHECK(gpu->sync(gpu) == 0, "%s: gpu sync: %s", what, mc_errmsg());
  CHECK(cpu->sync(cpu) == 0, "%s: cpu sync: %s", what, mc_errmsg());
}

/* ------------------------------------------------------------------ elementwise */
static void test_elementwise(void) {
  const int64_t n = 100003;
  float *x = hrand(n, 2), *y = hrand(n, 1), *dx = hrand(n, 1);
  float *dX = up(x, n), *dY = up(y, n);
  /* fill, copy, scale, axpy, copy_2d */
  float *r = hcopy(y, n);
  cpu->fill(cpu, r, n, 0.25f);
  gpu->fill(gpu, dY, n, 0.25f);
  cmp("fill", dY, r, n, 0.0);
  gpu->copy(gpu, dY, dX, n);
  cmp("copy", dY, x, n, 0.0);
  cpu->copy(cpu, r, x, n);
  cpu->scale(cpu, r, n, -1.5f);
  gpu->scale(gpu, dY, n, -1.5f);
  cmp("scale", dY, r, n, 0.0);
  cpu->axpy(cpu, r, y, n, 0.75f);
  gpu->axpy(gpu, dY, up(y, n), n, 0.75f);
  cmp("axpy", dY, r, n, TOL_EXACT);
  /* copy_2d: a column block of x viewed as 300 rows of pitch 333, into pitch 250; the floats
   * between the rows stay NaN on both sides */
  {
    const int64_t H = 300, SP = 333, W = 217, DP = 250;
    float *ref = track_host(malloc((size_t)(H * DP) * sizeof(float)));
    for (int64_t i = 0; i < H * DP; i++) ref[i] = NAN;
    float *dD = dnan(H * DP);
    cpu->copy_2d(cpu, ref, DP, x + 5, SP, W, H);
    gpu->copy_2d(gpu, dD, DP, dX + 5, SP, W, H);
    cmp("copy_2d", dD, ref, H * DP, 0.0);
  }
  /* activations and gated units */
  static const char *names[4] = {"silu", "gelu", "sigmoid", "softplus"};
  for (int a = 0; a < 4; a++) {
    char what[64];
    float *yc = hzeros(n), *dyg = dnan(n);
    cpu->act_fwd(cpu, (mc_act)a, x, yc, n);
    gpu->act_fwd(gpu, (mc_act)a, dX, dyg, n);
    snprintf(what, sizeof what, "act_fwd %s", names[a]);
    cmp(what, dyg, yc, n, TOL_EXACT);
    float *dxc = hcopy(dx, n), *ddx = up(dx, n);
    cpu->act_bwd(cpu, (mc_act)a, x, y, dxc, n);
    gpu->act_bwd(gpu, (mc_act)a, dX, up(y, n), ddx, n);
    snprintf(what, sizeof what, "act_bwd %s", names[a]);
    cmp(what, ddx, dxc, n, TOL_EXACT);
    cpu->glu_fwd(cpu, (mc_act)a, (mc_operand){x, NULL}, (mc_operand){y, NULL}, (mc_dst){yc, NULL}, n);
    float *dg = dnan(n);
    gpu->glu_fwd(gpu, (mc_act)a, (mc_operand){dX, NULL}, (mc_operand){up(y, n), NULL}, (mc_dst){dg, NULL}, n);
    snprintf(what, sizeof what, "glu_fwd %s", names[a]);
    cmp(what, dg, yc, n, TOL_EXACT);
    float *g = hrand(n, 1), *da = hcopy(dx, n), *db = hcopy(y, n);
    float *dda = up(da, n), *ddb = up(db, n);
    cpu->glu_bwd(cpu, (mc_act)a, (mc_operand){x, NULL}, (mc_operand){y, NULL}, (mc_operand){g, NULL}, (mc_dst){da, NULL}, (mc_dst){db, NULL}, n);
    gpu->glu_bwd(gpu, (mc_act)a, (mc_operand){dX, NULL}, (mc_operand){up(y, n), NULL}, (mc_operand){up(g, n), NULL}, (mc_dst){dda, NULL},
                  (mc_dst){ddb, NULL}, n);
    snprintf(what, sizeof what, "glu_bwd %s da", names[a]);
    cmp(what, dda, da, n, TOL_EXACT);
    snprintf(what, sizeof what, "glu_bwd %s db", names[a]);
    cmp(what, ddb, db, n, TOL_EXACT);
  }
  /* bias over rows of c columns */
  const int rows = 777, c = 129;
  float *yb = hrand((int64_t)rows * c, 1), *b = hrand(c, 1), *dbias = hrand(c, 1);
  float *dyb = up(yb, (int64_t)rows * c), *ddbias = up(dbias, c);
  cpu->bias_fwd(cpu, yb, b, rows, c);
  gpu->bias_fwd(gpu, dyb, up(b, c), rows, c);
  cmp("bias_fwd", dyb, yb, (int64_t)rows * c, TOL_EXACT);
  cpu->bias_bwd(cpu, yb, rows, c, dbias);
  gpu->bias_bwd(gpu, dyb, rows, c, ddbias);
  cmp("bias_bwd", ddbias, dbias, c, TOL_SUM);
  /* sum of squares over more than one reduction block, in double on both sides */
  const int64_t big = 3000017;
  float *s = hrand(big, 1);
  double sc = cpu->sumsq(cpu, s, big), sg = gpu->sumsq(gpu, up(s, big), big);
  double rel = fabs(sg - sc) / sc;
  printf("  %-26s %9lld  rel %.2e  tol 1e-12  %s\n", "sumsq", (long long)big, rel, rel <= 1e-12 ? "ok" : "FAIL");
  CHECK(rel <= 1e-12, "sumsq %.17g vs %.17g", sg, sc);
  /* three AdamW steps */
  float *w = hrand(n, 1), *m = hzeros(n), *v = hzeros(n);
  float *dw = up(w, n), *dm = up(m, n), *dv = up(v, n);
  for (int step = 1; step <= 3; step++) {
    float *g = hrand(n, 1);
    mc_adamw_args aa = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f};
    cpu->adamw(cpu, w, g, m, v, n, &aa);
    gpu->adamw(gpu, dw, up(g, n), dm, dv, n, &aa);
  }
  cmp("adamw w", dw, w, n, TOL_EXACT);
  cmp("adamw m", dm, m, n, TOL_EXACT);
  cmp("adamw v", dv, v, n, TOL_EXACT);
  synced("elementwise");
  case_end();
}

/* ------------------------------------------------------------------ gemm */
/* The expert products both gemm tests use: 3 experts with 30, 0 and 51 rows, d = 40, F = 56;
 * wgrad = 0: Y_e = X_e W_e^T; wgrad = 1: dW_e += dY_e^T X_e (K = rows, 0 for the empty expert,
 * whose dW must stay as it was). X [81, d], W [E, F, d], Y [81, F]. */
enum { EXP_E = 3, EXP_D = 40, EXP_F = 56, EXP_TOTAL = 81 };
static void expert_shapes(int wgrad, int *Ms, int *Ns, int *Ks, int64_t *ao, int64_t *bo, int64_t *co) {
  static const int rows[EXP_E] = {30, 0, 51};
  for (int e = 0, off = 0; e < EXP_E; off += rows[e], e++) {
    int64_t x = (int64_t)off * EXP_D, w = (int64_t)e * EXP_F * EXP_D, y = (int64_t)off * EXP_F;
    if (!wgrad) Ms[e] = rows[e], Ns[e] = EXP_F, Ks[e] = EXP_D, ao[e] = x, bo[e] = w, co[e] = y;
    else Ms[e] = EXP_F, Ns[e] = EXP_D, Ks[e] = rows[e], ao[e] = y, bo[e] = x, co[e] = w;
  }
}

static void test_gemm(void) {
  const int M = 67, N = 45, K = 129;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* padded leading dimensions: the interface's lda/ldb/ldc are row strides as stored */
      int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
      float *A = hrand(na, 1), *B = hrand(nb, 1), *C = hrand(nc, 1);
      float *dC = up(C, nc);
      cpu->gemm(cpu, ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C, ldc);
      gpu->gemm(gpu, ta, tb, M, N, K, 0.7f, up(A, na), lda, up(B, nb), ldb, 0.3f, dC, ldc);
      char what[32];
      snprintf(what, sizeof what, "gemm ta=%d tb=%d", ta, tb);
      cmp(what, dC, C, nc, TOL_GEMM);
    }
  /* strided batch */
  const int batch = 3;
  float *A = hrand((int64_t)batch * M * K, 1), *B = hrand((int64_t)batch * K * N, 1), *C = hrand((int64_t)batch * M * N, 1);
  float *dC = up(C, (int64_t)batch * M * N);
  cpu->gemm_strided(cpu, 0, 1, M, N, K, 1.0f, A, K, (int64_t)M * K, B, K, (int64_t)K * N, 1.0f, C, N, (int64_t)M * N, batch);
  gpu->gemm_strided(gpu, 0, 1, M, N, K, 1.0f, up(A, (int64_t)batch * M * K), K, (int64_t)M * K,
                    up(B, (int64_t)batch * K * N), K, (int64_t)K * N, 1.0f, dC, N, (int64_t)M * N, batch);
  cmp("gemm_strided", dC, C, (int64_t)batch * M * N, TOL_GEMM);
  /* grouped: the expert shapes */
  const int E = EXP_E, d = EXP_D, F = EXP_F, total = EXP_TOTAL;
  float *X = hrand((int64_t)total * d, 1), *W = hrand((int64_t)E * F * d, 1), *Y = hrand((int64_t)total * F, 1);
  float *dX = up(X, (int64_t)total * d), *dW = up(W, (int64_t)E * F * d), *dY = up(Y, (int64_t)total * F);
  int Ms[EXP_E], Ns[EXP_E], Ks[EXP_E];
  int64_t ao[EXP_E], bo[EXP_E], co[EXP_E];
  expert_shapes(0, Ms, Ns, Ks, ao, bo, co);
  cpu->gemm_grouped(cpu, 0, 1, E, Ms, Ns, Ks, 1.0f, X, ao, d, W, bo, d, 0.0f, Y, co, F);
  gpu->gemm_grouped(gpu, 0, 1, E, Ms, Ns, Ks, 1.0f, dX, ao, d, dW, bo, d, 0.0f, dY, co, F);
  cmp("gemm_grouped fwd", dY, Y, (int64_t)total * F, TOL_GEMM);
  float *G = hrand((int64_t)E * F * d, 1), *dG = up(G, (int64_t)E * F * d);
  expert_shapes(1, Ms, Ns, Ks, ao, bo, co);
  cpu->gemm_grouped(cpu, 1, 0, E, Ms, Ns, Ks, 1.0f, Y, ao, F, X, bo, d, 1.0f, G, co, d);
  gpu->gemm_grouped(gpu, 1, 0, E, Ms, Ns, Ks, 1.0f, dY, ao, F, dX, bo, d, 1.0f, dG, co, d);
  cmp("gemm_grouped wgrad", dG, G, (int64_t)E * F * d, TOL_GEMM);
  synced("gemm");
  case_end();
}

/* ------------------------------------------------------------------ rows: embed, norm, rope, xent */
/* bf16 helpers (defined with the bf16 output checks below) */
static void ulp_cmp(mc_backend *be, const char *what, const mc_bf16 *dev, const mc_bf16 *ref, int64_t n, int exact);
static mc_bf16 *dev16(mc_backend *be, const mc_bf16 *h, int64_t n);
static mc_bf16 *host16(const float *x, int64_t n);

static void test_rows(void) {
  /* embedding with repeated tokens */
  const int V = 50, n = 300, d = 24;
  int32_t tok[300];
  for (int r = 0; r < n; r++) tok[r] = (int32_t)mc_rng_below(7, 7, (uint64_t)r, V);
  float *W = hrand((int64_t)V * d, 1), *y = hzeros((int64_t)n * d), *dy = hrand((int64_t)n * d, 1), *dW = hrand((int64_t)V * d, 1);
  int32_t *dtok = upi(tok, n);
  float *dyd = dnan((int64_t)n * d), *dWd = up(dW, (int64_t)V * d);
  cpu->embed_fwd(cpu, tok, n, d, W, y);
  gpu->embed_fwd(gpu, dtok, n, d, up(W, (int64_t)V * d), dyd);
  cmp("embed_fwd", dyd, y, (int64_t)n * d, 0.0);
  cpu->embed_bwd(cpu, tok, n, d, dy, dW);
  gpu->embed_bwd(gpu, dtok, n, d, up(dy, (int64_t)n * d), dWd);
  cmp("embed_bwd", dWd, dW, (int64_t)V * d, TOL_EXACT);
  /* RMSNorm, full width and per head */
  const int rows = 333, width = 192;
  const int groups[2] = {192, 32};
  for (int gi = 0; gi < 2; gi++) {
    int grp = groups[gi], ng = width / grp;
    int64_t nd = (int64_t)rows * width;
    float *x = hrand(nd, 1.5f), *w = hrand(width, 1), *yy = hzeros(nd), *rs = hzeros((int64_t)rows * ng);
    float *g = hrand(nd, 1), *dx = hrand(nd, 1), *dw = hrand(width, 1);
    float *dxd = up(x, nd), *dwd = up(w, width), *yd = dnan(nd), *rsd = dnan((int64_t)rows * ng);
    cpu->rmsnorm_fwd(cpu, x, w, rows, width, grp, 1e-5f, (mc_dst){yy, NULL}, rs);
    gpu->rmsnorm_fwd(gpu, dxd, dwd, rows, width, grp, 1e-5f, (mc_dst){yd, NULL}, rsd);
    char what[48];
    snprintf(what, sizeof what, "rmsnorm_fwd group=%d y", grp);
    cmp(what, yd, yy, nd, TOL_EXACT);
    snprintf(what, sizeof what, "rmsnorm_fwd group=%d rstd", grp);
    cmp(what, rsd, rs, (int64_t)rows * ng, TOL_EXACT);
    float *dxg = up(dx, nd), *dwg = up(dw, width);
    cpu->rmsnorm_bwd(cpu, x, w, rs, g, rows, width, grp, dx, dw);
    gpu->rmsnorm_bwd(gpu, dxd, dwd, rsd, up(g, nd), rows, width, grp, dxg, dwg);
    snprintf(what, sizeof what, "rmsnorm_bwd group=%d dx", grp);
    cmp(what, dxg, dx, nd, TOL_SUM);
    snprintf(what, sizeof what, "rmsnorm_bwd group=%d dw", grp);
    cmp(what, dwg, dw, width, TOL_SUM);
  }
  /* RoPE: 3 sequences of 41 positions, 3 heads of 32 */
  const int T = 41, nr = 3 * 41, heads = 3, hd = 32;
  int64_t ne = (int64_t)nr * heads * hd;
  float *x = hrand(ne, 1), *xd = up(x, ne), *g = hrand(ne, 1), *dx = hrand(ne, 1), *dxd = up(dx, ne);
  cpu->rope_fwd(cpu, (mc_dst){x, NULL}, nr, T, heads, hd, 10000.0);
  gpu->rope_fwd(gpu, (mc_dst){xd, NULL}, nr, T, heads, hd, 10000.0);
  cmp("rope_fwd", xd, x, ne, TOL_EXACT);
  cpu->rope_bwd(cpu, (mc_operand){g, NULL}, (mc_dst){dx, NULL}, nr, T, heads, hd, 10000.0);
  gpu->rope_bwd(gpu, (mc_operand){up(g, ne), NULL}, (mc_dst){dxd, NULL}, nr, T, heads, hd, 10000.0);
  cmp("rope_bwd", dxd, dx, ne, TOL_EXACT);
  /* cross-entropy with a padded vocabulary */
  const int nx = 57, Vr = 1000, Vp = 1024;
  int32_t tgt[57];
  for (int r = 0; r < nx; r++) tgt[r] = (int32_t)mc_rng_below(7, 8, (uint64_t)r, Vr);
  float *lg = hrand((int64_t)nx * Vp, 3), *loss = hzeros(nx), *lse = hzeros(nx), *dl = hzeros((int64_t)nx * Vp);
  float *lgd = up(lg, (int64_t)nx * Vp), *lossd = dnan(nx), *lsed = dnan(nx), *dld = dnan((int64_t)nx * Vp);
  int32_t *tgtd = upi(tgt, nx);
  cpu->xent_fwd(cpu, lg, tgt, nx, Vr, Vp, loss, lse);
  gpu->xent_fwd(gpu, lgd, tgtd, nx, Vr, Vp, lossd, lsed);
  cmp("xent_fwd loss", lossd, loss, nx, TOL_EXACT);
  cmp("xent_fwd lse", lsed, lse, nx, TOL_EXACT);
  cpu->xent_bwd(cpu, lg, tgt, lse, nx, Vr, Vp, 0.01f, (mc_dst){dl, NULL});
  gpu->xent_bwd(gpu, lgd, tgtd, lsed, nx, Vr, Vp, 0.01f, (mc_dst){dld, NULL});
  cmp("xent_bwd", dld, dl, (int64_t)nx * Vp, TOL_EXACT);
  synced("rows");
  case_end();
}

/* the gated RMSNorm (the Mamba output norm): the vector path (width 192, groups of 64 and the
 * whole row) and the per-warp one (width 30, groups of 10), z and dz in fp32 and in bf16 */
static void gated_norm_case(int rows, int width, int grp, int z16) {
  const int ng = width / grp;
  const int64_t nd = (int64_t)rows * width;
  char what[80];
  float *y = hrand(nd, 1.5f), *z = hrand(nd, 1.5f), *w = hrand(width, 1), *out = hzeros(nd);
  float *rs = hzeros((int64_t)rows * ng), *dout = hrand(nd, 1), *dy = hrand(nd, 1), *dw = hrand(width, 1);
  if (z16)
    for (int64_t i = 0; i < nd; i++) z[i] = mc_bf16_to_float(mc_bf16_from_float(z[i]));
  mc_bf16 *zh = host16(z, nd), *zhd = dev16(gpu, zh, nd);
  float *yd = up(y, nd), *zd = up(z, nd), *wd = up(w, width), *outd = dnan(nd), *rsd = dnan((int64_t)rows * ng);
  const mc_operand zc = {z, NULL}, zg = z16 ? (mc_operand){NULL, zhd} : (mc_operand){zd, NULL};
  cpu->gated_rmsnorm_fwd(cpu, y, zc, w, rows, width, grp, 1e-5f, (mc_dst){out, NULL}, rs);
  gpu->gated_rmsnorm_fwd(gpu, yd, zg, wd, rows, width, grp, 1e-5f, (mc_dst){outd, NULL}, rsd);
  snprintf(what, sizeof what, "gated_rmsnorm_fwd %dx%d group=%d%s", rows, width, grp, z16 ? " z bf16" : "");
  cmp(what, outd, out, nd, TOL_EXACT);
  cmp("gated_rmsnorm_fwd rstd", rsd, rs, (int64_t)rows * ng, TOL_EXACT);
  float *dz = hrand(nd, 1), *dyd = up(dy, nd), *dzd = up(dz, nd), *dwd = up(dw, width), *doutd = up(dout, nd);
  mc_bf16 *dzh = calloc((size_t)nd, sizeof(mc_bf16)), *dzhd = dev16(gpu, dzh, nd);
  cpu->gated_rmsnorm_bwd(cpu, y, zc, w, rs, dout, rows, width, grp, dy, z16 ? (mc_dst){NULL, dzh} : (mc_dst){dz, NULL}, dw);
  gpu->gated_rmsnorm_bwd(gpu, yd, zg, wd, rsd, doutd, rows, width, grp, dyd,
                         z16 ? (mc_dst){NULL, dzhd} : (mc_dst){dzd, NULL}, dwd);
  snprintf(what, sizeof what, "gated_rmsnorm_bwd dy group=%d", grp);
  cmp(what, dyd, dy, nd, TOL_SUM);
  if (z16) {
    ulp_cmp(gpu, "gated_rmsnorm_bwd dz (bf16)", dzhd, dzh, nd, 0);
  } else {
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dz group=%d", grp);
    cmp(what, dzd, dz, nd, TOL_SUM);
  }
  snprintf(what, sizeof what, "gated_rmsnorm_bwd dw group=%d", grp);
  cmp(what, dwd, dw, width, TOL_SUM);
  gpu->free(gpu, zhd), gpu->free(gpu, dzhd);
  free(zh), free(dzh);
  synced("gated rmsnorm");
  case_end();
}

static void test_gated_norm(void) {
  gated_norm_case(333, 192, 64, 0);
  gated_norm_case(333, 192, 64, 1);
  gated_norm_case(100, 192, 192, 0);
  gated_norm_case(77, 30, 10, 0);
  gated_norm_case(77, 30, 10, 1);
}

/* ------------------------------------------------------------------ attention */
static void attn_case(int n_seq, int T, int H, int KV, int hd) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *q = hrand(nq, 1), *k = hrand(nk, 1), *v = hrand(nk, 1), *dout = hrand(nq, 1);
  float *out = hzeros(nq), *lse = hzeros(n * H);
  float *dq = hrand(nq, 1), *dk = hrand(nk, 1), *dv = hrand(nk, 1);
  float *qd = up(q, nq), *kd = up(k, nk), *vd = up(v, nk), *outd = dnan(nq), *lsed = dnan(n * H);
  float *dqd = up(dq, nq), *dkd = up(dk, nk), *dvd = up(dv, nk);
  cpu->attn_fwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, n_seq, T, H, KV, hd, (mc_dst){out, NULL}, lse);
  gpu->attn_fwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){outd, NULL}, lsed);
  char what[64];
  snprintf(what, sizeof what, "attn_fwd out T=%d H=%d/%d hd=%d", T, H, KV, hd);
  cmp(what, outd, out, nq, TOL_ATTN);
  snprintf(what, sizeof what, "attn_fwd lse T=%d hd=%d", T, hd);
  cmp(what, lsed, lse, n * H, TOL_ATTN);
  /* both backwards read the CPU's forward results so only the backward is compared */
  float *outc = up(out, nq), *lsec = up(lse, n * H);
  cpu->attn_bwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){out, NULL}, lse, (mc_operand){dout, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);
  gpu->attn_bwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){outc, NULL}, lsec, (mc_operand){up(dout, nq), NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
  snprintf(what, sizeof what, "attn_bwd dq T=%d hd=%d", T, hd);
  cmp(what, dqd, dq, nq, TOL_ATTN);
  snprintf(what, sizeof what, "attn_bwd dk T=%d hd=%d", T, hd);
  cmp(what, dkd, dk, nk, TOL_ATTN);
  snprintf(what, sizeof what, "attn_bwd dv T=%d hd=%d", T, hd);
  cmp(what, dvd, dv, nk, TOL_ATTN);
  synced("attention");
  case_end();
}

/* ------------------------------------------------------------------ conv, ssm, rg-lru */
/* conv + SiLU: widths on each register window (4, 8, 16), sequences shorter and longer than
 * one chunk of 64 steps (the backward's gradient window crosses chunk ends), channel counts
 * below and above one block, and a bf16 dx (written: the CPU's fp32 sum rounded) */
static void conv_case(int n_seq, int T, int c, int K) {
  const int64_t n = (int64_t)n_seq * T * c;
  char what[96];
  float *x = hrand(n, 1), *w = hrand((int64_t)c * K, 1), *b = hrand(c, 1), *y = hzeros(n), *g = hrand(n, 1);
  float *dx = hrand(n, 1), *dw = hrand((int64_t)c * K, 1), *db = hrand(c, 1);
  float *xd = up(x, n), *wd = up(w, (int64_t)c * K), *bd = up(b, c), *gd = up(g, n), *yd = dnan(n);
  float *dxd = up(dx, n), *dwd = up(dw, (int64_t)c * K), *dbd = up(db, c);
  cpu->conv_silu_fwd(cpu, x, w, b, n_seq, T, c, K, y);
  gpu->conv_silu_fwd(gpu, xd, wd, bd, n_seq, T, c, K, yd);
  snprintf(what, sizeof what, "conv_silu_fwd T=%d c=%d K=%d", T, c, K);
  cmp(what, yd, y, n, TOL_EXACT);
  cpu->conv_silu_bwd(cpu, x, w, b, g, n_seq, T, c, K, (mc_dst){dx, NULL}, dw, db);
  gpu->conv_silu_bwd(gpu, xd, wd, bd, gd, n_seq, T, c, K, (mc_dst){dxd, NULL}, dwd, dbd);
  snprintf(what, sizeof what, "conv_silu_bwd dx T=%d c=%d K=%d", T, c, K);
  cmp(what, dxd, dx, n, TOL_EXACT);
  snprintf(what, sizeof what, "conv_silu_bwd dw T=%d c=%d K=%d", T, c, K);
  cmp(what, dwd, dw, (int64_t)c * K, TOL_CPU_FSUM);
  snprintf(what, sizeof what, "conv_silu_bwd db T=%d c=%d K=%d", T, c, K);
  cmp(what, dbd, db, c, TOL_SUM);
  mc_bf16 *h = malloc((size_t)n * sizeof(mc_bf16));
  for (int64_t i = 0; i < n; i++) h[i] = 0x7fc0; /* NaN: every element must be written */
  mc_bf16 *hd = dev16(gpu, h, n);
  cpu->conv_silu_bwd(cpu, x, w, b, g, n_seq, T, c, K, (mc_dst){NULL, h}, dw, db);
  gpu->conv_silu_bwd(gpu, xd, wd, bd, gd, n_seq, T, c, K, (mc_dst){NULL, hd}, dwd, dbd);
  snprintf(what, sizeof what, "conv_silu_bwd bf16 dx T=%d c=%d K=%d", T, c, K);
  ulp_cmp(gpu, what, hd, h, n, 0);
  gpu->free(gpu, hd);
  free(h);
  synced("conv");
  case_end();
}

static void test_conv(void) {
  conv_case(3, 37, 70, 4);
  conv_case(2, 150, 33, 4);
  conv_case(2, 130, 200, 1);
  conv_case(1, 129, 16, 6);
  conv_case(2, 70, 9, 13);
}

static void ssm_case(int n_seq, int T, int Hm, int P, int N) {
  const int64_t n = (int64_t)n_seq * T, nx = n * Hm * P;
  float *x = hrand(nx, 1), *B = hrand(n * N, 1), *C = hrand(n * N, 1), *D = hrand(Hm, 1), *A_log = hrand(Hm, 0.5f);
  float *dt = hrand(n * Hm, 1);
  for (int64_t i = 0; i < n * Hm; i++) dt[i] = 0.01f + 0.1f * fabsf(dt[i]); /* softplus'd: positive, small */
  float *y = hzeros(nx), *g = hrand(nx, 1);
  float *dx = hrand(nx, 1), *ddt = hrand(n * Hm, 1), *dA = hrand(Hm, 1), *dB = hrand(n * N, 1), *dC = hrand(n * N, 1),
        *dD = hrand(Hm, 1);
  float *xd = up(x, nx), *dtd = up(dt, n * Hm), *Ad = up(A_log, Hm), *Bd = up(B, n * N), *Cd = up(C, n * N),
        *Dd = up(D, Hm), *yd = dnan(nx);
  float *dxd = up(dx, nx), *ddtd = up(ddt, n * Hm), *dAd = up(dA, Hm), *dBd = up(dB, n * N), *dCd = up(dC, n * N),
        *dDd = up(dD, Hm);
  cpu->ssm_fwd(cpu, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  gpu->ssm_fwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, n_seq, T, Hm, P, N, yd);
  char what[64];
  snprintf(what, sizeof what, "ssm_fwd T=%d H=%d P=%d N=%d", T, Hm, P, N);
  cmp(what, yd, y, nx, TOL_SCAN);
  cpu->ssm_bwd(cpu, x, dt, A_log, B, C, D, g, n_seq, T, Hm, P, N, dx, ddt, dA, dB, dC, dD);
  gpu->ssm_bwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, up(g, nx), n_seq, T, Hm, P, N, dxd, ddtd, dAd, dBd, dCd, dDd);
  cmp("ssm_bwd dx", dxd, dx, nx, TOL_SCAN);
  cmp("ssm_bwd ddt", ddtd, ddt, n * Hm, TOL_SCAN);
  cmp("ssm_bwd dA_log", dAd, dA, Hm, TOL_SCAN);
  cmp("ssm_bwd dB", dBd, dB, n * N, TOL_SCAN);
  cmp("ssm_bwd dC", dCd, dC, n * N, TOL_SCAN);
  cmp("ssm_bwd dD", dDd, dD, Hm, TOL_SCAN);
  synced("ssm");
  case_end();
}

/* T = 45: one chunk of the GPU's scan; T = 200: four (64 steps each), the carries chained */
static void rglru_case(int n_seq, int T, int c) {
  const int64_t n = (int64_t)n_seq * T * c;
  float *gx = hrand(n, 1), *r = hrand(n, 1), *lam = hrand(c, 1), *h = hzeros(n), *dh = hrand(n, 1);
  for (int64_t i = 0; i < n; i++) r[i] = 1.0f / (1.0f + expf(-r[i])); /* a gate in (0, 1) */
  float *dgx = hrand(n, 1), *dr = hrand(n, 1), *dl = hrand(c, 1);
  float *gxd = up(gx, n), *rd = up(r, n), *ld = up(lam, c), *hd = dnan(n);
  float *dgxd = up(dgx, n), *drd = up(dr, n), *dld = up(dl, c);
  cpu->rglru_fwd(cpu, gx, r, lam, n_seq, T, c, h);
  gpu->rglru_fwd(gpu, gxd, rd, ld, n_seq, T, c, hd);
  char what[64];
  snprintf(what, sizeof what, "rglru_fwd T=%d", T);
  cmp(what, hd, h, n, TOL_SCAN);
  cpu->rglru_bwd(cpu, gx, r, lam, h, dh, n_seq, T, c, dgx, dr, dl);
  gpu->rglru_bwd(gpu, gxd, rd, ld, up(h, n), up(dh, n), n_seq, T, c, dgxd, drd, dld);
  snprintf(what, sizeof what, "rglru_bwd dgx T=%d", T);
  cmp(what, dgxd, dgx, n, TOL_SCAN);
  snprintf(what, sizeof what, "rglru_bwd dr T=%d", T);
  cmp(what, drd, dr, n, TOL_SCAN);
  snprintf(what, sizeof what, "rglru_bwd dlambda T=%d", T);
  cmp(what, dld, dl, c, TOL_SCAN);
  synced("rglru");
  case_end();
}

static void test_rglru(void) {
  rglru_case(3, 45, 77);
  rglru_case(2, 200, 33);
}

/* ------------------------------------------------------------------ MoE */
/* d = 33: the per-column kernels; d = 64: the 16-byte ones */
static void moe_case(int capacity, int d) {
  const int n_seq = 3, T = 40, E = 6, k = 2, n = n_seq * T;
  float *logits = hrand((int64_t)n * E, 1.5f), *probs = hzeros((int64_t)n * E), *gate = hzeros((int64_t)n * k);
  float *f = hzeros((int64_t)n_seq * E), *pbar = hzeros((int64_t)n_seq * E), *aux = hzeros(n_seq);
  int32_t idx[240], slot[240], counts[6], dropped = -1;
  float *lgd = up(logits, (int64_t)n * E), *probsd = dnan((int64_t)n * E), *gated = dnan((int64_t)n * k);
  float *fd = dnan((int64_t)n_seq * E), *pbard = dnan((int64_t)n_seq * E), *auxd = dnan(n_seq);
  int32_t *idxd = dalloc(sizeof idx), *slotd = dalloc(sizeof slot), *countsd = dalloc(sizeof counts),
          *droppedd = dalloc(sizeof(int32_t));
  cpu->moe_route(cpu, logits, n_seq, T, E, k, capacity, probs, idx, gate, slot, counts, f, pbar, aux, &dropped);
  gpu->moe_route(gpu, lgd, n_seq, T, E, k, capacity, probsd, idxd, gated, slotd, countsd, fd, pbard, auxd, droppedd);
  char what[64];
  snprintf(what, sizeof what, "moe_route cap=%d probs", capacity);
  cmp(what, probsd, probs, (int64_t)n * E, TOL_EXACT);
  cmp("moe_route gate", gated, gate, (int64_t)n * k, TOL_EXACT);
  cmp("moe_route f", fd, f, (int64_t)n_seq * E, 0.0);
  cmp("moe_route pbar", pbard, pbar, (int64_t)n_seq * E, TOL_EXACT);
  cmp("moe_route aux", auxd, aux, n_seq, TOL_EXACT);
  cmpi("moe_route idx", idxd, idx, (int64_t)n * k);
  cmpi("moe_route slot", slotd, slot, (int64_t)n * k);
  cmpi("moe_route counts", countsd, counts, E);
  cmpi("moe_route dropped", droppedd, &dropped, 1);
  if (capacity > 0) CHECK(dropped > 0, "capacity %d should drop assignments in this case", capacity);
  /* the backward of routing, then the permutations on the CPU's routing */
  float *dgate = hrand((int64_t)n * k, 1), *dlog = hrand((int64_t)n * E, 1), *dlogd = up(dlog, (int64_t)n * E);
  cpu->moe_route_bwd(cpu, probs, idx, gate, dgate, f, n_seq, T, E, k, 0.3f, dlog);
  gpu->moe_route_bwd(gpu, up(probs, (int64_t)n * E), upi(idx, (int64_t)n * k), up(gate, (int64_t)n * k),
                     up(dgate, (int64_t)n * k), up(f, (int64_t)n_seq * E), n_seq, T, E, k, 0.3f, dlogd);
  cmp("moe_route_bwd", dlogd, dlog, (int64_t)n * E, TOL_EXACT);
  int rows = 0;
  for (int e = 0; e < E; e++) rows += counts[e];
  int32_t *slotc = upi(slot, (int64_t)n * k);
  float *gatec = up(gate, (int64_t)n * k);
  float *x = hrand((int64_t)n * d, 1), *xp = hzeros((int64_t)rows * d), *xpd = dnan((int64_t)rows * d);
  float *xd = up(x, (int64_t)n * d);
  cpu->moe_permute(cpu, x, slot, n, k, d, (mc_dst){xp, NULL});
  gpu->moe_permute(gpu, xd, slotc, n, k, d, (mc_dst){xpd, NULL});
  snprintf(what, sizeof what, "moe_permute d=%d", d);
  cmp(what, xpd, xp, (int64_t)rows * d, 0.0);
  mc_bf16 *xp16 = host16(xp, (int64_t)rows * d), *xp16d = dev16(gpu, xp16, (int64_t)rows * d);
  gpu->fill(gpu, (float *)xp16d, (int64_t)rows * d / 2, NAN); /* every element must be written */
  gpu->moe_permute(gpu, xd, slotc, n, k, d, (mc_dst){NULL, xp16d});
  ulp_cmp(gpu, "moe_permute into bf16", xp16d, xp16, (int64_t)rows * d, 1);
  float *dxp = hrand((int64_t)rows * d, 1), *dx = hrand((int64_t)n * d, 1), *dxd = up(dx, (int64_t)n * d);
  cpu->moe_permute_bwd(cpu, dxp, slot, n, k, d, dx);
  gpu->moe_permute_bwd(gpu, up(dxp, (int64_t)rows * d), slotc, n, k, d, dxd);
  cmp("moe_permute_bwd", dxd, dx, (int64_t)n * d, TOL_EXACT);
  float *yp = hrand((int64_t)rows * d, 1), *y = hrand((int64_t)n * d, 1), *yd = up(y, (int64_t)n * d);
  float *ypd = up(yp, (int64_t)rows * d);
  cpu->moe_unpermute(cpu, yp, slot, gate, n, k, d, y);
  gpu->moe_unpermute(gpu, ypd, slotc, gatec, n, k, d, yd);
  cmp("moe_unpermute", yd, y, (int64_t)n * d, TOL_EXACT);
  float *dy = hrand((int64_t)n * d, 1), *dyp = hrand((int64_t)rows * d, 1), *dg = hrand((int64_t)n * k, 1);
  float *dypd = up(dyp, (int64_t)rows * d), *dgd = up(dg, (int64_t)n * k);
  float *dyd = up(dy, (int64_t)n * d);
  cpu->moe_unpermute_bwd(cpu, dy, yp, slot, gate, n, k, d, (mc_dst){dyp, NULL}, dg);
  gpu->moe_unpermute_bwd(gpu, dyd, ypd, slotc, gatec, n, k, d, (mc_dst){dypd, NULL}, dgd);
  cmp("moe_unpermute_bwd dyp", dypd, dyp, (int64_t)rows * d, TOL_EXACT);
  cmp("moe_unpermute_bwd dgate", dgd, dg, (int64_t)n * k, TOL_SUM);
  mc_bf16 *dyp16 = calloc((size_t)rows * d, sizeof(mc_bf16)), *dyp16d = dev16(gpu, dyp16, (int64_t)rows * d);
  gpu->fill(gpu, (float *)dyp16d, (int64_t)rows * d / 2, NAN);
  cpu->moe_unpermute_bwd(cpu, dy, yp, slot, gate, n, k, d, (mc_dst){NULL, dyp16}, dg);
  gpu->moe_unpermute_bwd(gpu, dyd, ypd, slotc, gatec, n, k, d, (mc_dst){NULL, dyp16d}, dgd);
  ulp_cmp(gpu, "moe_unpermute_bwd into bf16", dyp16d, dyp16, (int64_t)rows * d, 0);
  cmp("moe_unpermute_bwd dgate (second)", dgd, dg, (int64_t)n * k, TOL_SUM);
  gpu->free(gpu, xp16d), gpu->free(gpu, dyp16d);
  free(xp16), free(dyp16);
  synced("moe");
  case_end();
}

/* ------------------------------------------------------------------ failures */
static void test_failures(void) {
  mc_error_clear();
  void *p = gpu->alloc(gpu, (size_t)1 << 50);
  CHECK(p == NULL && strstr(mc_errmsg(), "cannot allocate"), "a 1 PiB allocation: %p, '%s'", p, mc_errmsg());
  CHECK(gpu->sync(gpu) == 0, "a failed allocation is not sticky: %s", mc_errmsg());
  /* an unsupported head size is recorded and reported once by sync */
  float *q = dalloc(300 * sizeof(float)), *o = dalloc(300 * sizeof(float)), *l = dalloc(sizeof(float));
  gpu->attn_fwd(gpu, (mc_operand){q, NULL}, (mc_operand){q, NULL}, (mc_operand){q, NULL}, 1, 1, 1, 1, 300, (mc_dst){o, NULL}, l);
  CHECK(gpu->sync(gpu) == -1 && strstr(mc_errmsg(), "attn_fwd"), "attn head_dim 300: '%s'", mc_errmsg());
  printf("  reported: %s\n", mc_errmsg());
  CHECK(gpu->sync(gpu) == 0, "the failure was reported once: %s", mc_errmsg());
  int nd = mc_cuda_device_count();
  CHECK(mc_backend_cuda(nd) == NULL && strstr(mc_errmsg(), "does not exist"), "device %d: '%s'", nd, mc_errmsg());
  CHECK(mc_backend_cuda(0) == gpu, "one instance per device");
  case_end();
}

/* ------------------------------------------------------------------ model-sized shapes (--shapes)
 * The layer shapes of configs/nam-small.json and dense-a.json (micro-batch 2 x 2048 tokens):
 * each op compared with the CPU once, then timed on the GPU (median of 5 runs after one
 * warm-up, host clock around a sync). Not part of ctest's run: the CPU reference takes tens
 * of seconds at these sizes. */

/* ------------------------------------------------------------------ bf16 products
 * The bf16-products instance (mc_backend_cuda_bf16) against the CPU in fp32, gemm in every
 * transpose with padded leading dimensions, gemm_strided and gemm_grouped (an empty group,
 * K = 0 for its weight gradient):
 * - operands exactly representable in bf16 (multiples of 1/4 up to 2 in magnitude, so every
 *   product and partial sum is exact in fp32): the result must equal the CPU's (norm-wise
 *   relative error <= 1e-6), which checks the layouts and the operand copies;
 * - random normal operands: the error must lie in (1e-5, 1e-2]: above what fp32 products
 *   give (so the products really ran in bf16) and within the bf16 band of issue 7. */
static mc_backend *g16; /* mc_backend_cuda_bf16(0) */

/* Random operand: normal, or (exact) a multiple of 1/4 in [-2, 2]. */
static float *b16_operand(int64_t n, int exact) {
  float *x = kc_rand(n, stream_no++, 1.0f);
  if (exact)
    for (int64_t i = 0; i < n; i++) {
      float v = roundf(x[i] * 4.0f) / 4.0f;
      x[i] = v > 2.0f ? 2.0f : v < -2.0f ? -2.0f : v;
    }
  return x;
}

static float *b16_up(const float *h, int64_t n) {
  float *d = g16->alloc(g16, (size_t)(n ? n : 1) * sizeof(float));
  if (d) g16->from_host(g16, d, h, (size_t)n * sizeof(float));
  return d;
}

/* Norm-wise relative error of the device result against the CPU's, checked against the
 * band of the operand kind; frees the device buffer. */
static void b16_cmp(const char *what, int exact, float *dC, const float *C, int64_t n) {
  float *g = malloc((size_t)n * sizeof(float));
  g16->to_host(g16, g, dC, (size_t)n * sizeof(float));
  CHECK(g16->sync(g16) == 0, "%s: %s", what, mc_errmsg());
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) num += ((double)g[i] - C[i]) * ((double)g[i] - C[i]), den += (double)C[i] * C[i];
  double e = sqrt(num / (den > 0 ? den : 1));
  printf("  bf16 %-34s %s  rel err %.2e\n", what, exact ? "exact operands " : "normal operands", e);
  if (exact) CHECK(e <= 1e-6, "%s with bf16-exact operands: rel err %.3e > 1e-6", what, e);
  else CHECK(e > 1e-5 && e <= 1e-2, "%s with normal operands: rel err %.3e outside (1e-5, 1e-2]", what, e);
  free(g);
  g16->free(g16, dC);
}

static void b16_gemm(int exact) {
  const int M = 67, N = 45, K = 129;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
      float *A = b16_operand(na, exact), *B = b16_operand(nb, exact), *C = b16_operand(nc, exact);
      float *dA = b16_up(A, na), *dB = b16_up(B, nb), *dC = b16_up(C, nc);
      cpu->gemm(cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, ldc);
      g16->gemm(g16, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, ldc);
      char what[40];
      snprintf(what, sizeof what, "gemm ta=%d tb=%d", ta, tb);
      b16_cmp(what, exact, dC, C, nc);
      g16->free(g16, dA), g16->free(g16, dB);
      free(A), free(B), free(C);
    }
  const int batch = 3;
  int64_t na = (int64_t)batch * M * K, nb = (int64_t)batch * K * N, nc = (int64_t)batch * M * N;
  float *A = b16_operand(na, exact), *B = b16_operand(nb, exact), *C = b16_operand(nc, exact);
  float *dA = b16_up(A, na), *dB = b16_up(B, nb), *dC = b16_up(C, nc);
  cpu->gemm_strided(cpu, 0, 1, M, N, K, 1.0f, A, K, (int64_t)M * K, B, K, (int64_t)K * N, 1.0f, C, N, (int64_t)M * N, batch);
  g16->gemm_strided(g16, 0, 1, M, N, K, 1.0f, dA, K, (int64_t)M * K, dB, K, (int64_t)K * N, 1.0f, dC, N, (int64_t)M * N, batch);
  b16_cmp("gemm_strided batch 3", exact, dC, C, nc);
  g16->free(g16, dA), g16->free(g16, dB);
  free(A), free(B), free(C);

  /* the expert shapes */
  const int E = EXP_E, d = EXP_D, F = EXP_F, total = EXP_TOTAL;
  float *X = b16_operand((int64_t)total * d, exact), *W = b16_operand((int64_t)E * F * d, exact), *Y = b16_operand((int64_t)total * F, exact);
  float *dX = b16_up(X, (int64_t)total * d), *dW = b16_up(W, (int64_t)E * F * d), *dY = b16_up(Y, (int64_t)total * F);
  int Ms[EXP_E], Ns[EXP_E], Ks[EXP_E];
  int64_t ao[EXP_E], bo[EXP_E], co[EXP_E];
  expert_shapes(0, Ms, Ns, Ks, ao, bo, co);
  cpu->gemm_grouped(cpu, 0, 1, E, Ms, Ns, Ks, 1.0f, X, ao, d, W, bo, d, 0.0f, Y, co, F);
  g16->gemm_grouped(g16, 0, 1, E, Ms, Ns, Ks, 1.0f, dX, ao, d, dW, bo, d, 0.0f, dY, co, F);
  /* keep the forward's output for the weight gradient: compare a copy */
  float *dYc = g16->alloc(g16, (size_t)total * F * sizeof(float));
  g16->copy(g16, dYc, dY, (int64_t)total * F);
  b16_cmp("gemm_grouped fwd (an empty group)", exact, dYc, Y, (int64_t)total * F);
  float *G = b16_operand((int64_t)E * F * d, exact), *dG = b16_up(G, (int64_t)E * F * d);
  expert_shapes(1, Ms, Ns, Ks, ao, bo, co);
  if (exact) {
    /* the forward's output on both sides is then the same exact fp32 values, but no longer
     * bf16-exact: give the weight gradient exact operands of its own */
    float *Y2 = b16_operand((int64_t)total * F, 1);
    memcpy(Y, Y2, (size_t)total * F * sizeof(float));
    g16->from_host(g16, dY, Y2, (size_t)total * F * sizeof(float));
    free(Y2);
  }
  cpu->gemm_grouped(cpu, 1, 0, E, Ms, Ns, Ks, 1.0f, Y, ao, F, X, bo, d, 1.0f, G, co, d);
  g16->gemm_grouped(g16, 1, 0, E, Ms, Ns, Ks, 1.0f, dY, ao, F, dX, bo, d, 1.0f, dG, co, d);
  b16_cmp("gemm_grouped wgrad (K = 0 group)", exact, dG, G, (int64_t)E * F * d);
  g16->free(g16, dX), g16->free(g16, dW), g16->free(g16, dY);
  free(X), free(W), free(Y), free(G);
}

/* Larger K: the error stays in the band where fp32 products would give ~1e-6. */
static void b16_long_k(void) {
  const int M = 256, N = 192, K = 4096;
  float *A = b16_operand((int64_t)M * K, 0), *B = b16_operand((int64_t)N * K, 0), *C = kc_zeros((int64_t)M * N);
  float *dA = b16_up(A, (int64_t)M * K), *dB = b16_up(B, (int64_t)N * K), *dC = b16_up(C, (int64_t)M * N);
  cpu->gemm(cpu, 0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
  g16->gemm(g16, 0, 1, M, N, K, 1.0f, dA, K, dB, K, 0.0f, dC, N);
  b16_cmp("gemm 256x192x4096 (x W^T)", 0, dC, C, (int64_t)M * N);
  g16->free(g16, dA), g16->free(g16, dB);
  free(A), free(B), free(C);
}

/* A product's device result against the CPU's: the bf16 instance within b16_cmp's bands, the
 * fp32 one within TOL_GEMM; frees the device buffer. */
static void product_cmp(mc_backend *be, const char *what, int exact, float *dC, const float *C, int64_t n) {
  if (be == g16) {
    b16_cmp(what, exact, dC, C, n);
    return;
  }
  cmp(what, dC, C, n, TOL_GEMM);
  be->free(be, dC);
}

/* ------------------------------------------------------------------ ragged grouped products
 * gemm_grouped with 70 groups (more than the backend batches in one cuBLAS call), and with
 * one group (the backend's plain-product path), of ragged shapes, M, N and K from 0 to ~30 with some of each 0, in every transpose, padded leading
 * dimensions, alpha 0.5, beta 0.25, against the CPU. fp32 (`gpu`): within TOL_GEMM; bf16
 * products (`g16`): the bands of b16_cmp. */
enum { RAG_G = 70 };

static void ragged_grouped(mc_backend *be, int ta, int tb, int exact, int ng) {
  int Ms[RAG_G], Ns[RAG_G], Ks[RAG_G];
  int64_t ao[RAG_G], bo[RAG_G], co[RAG_G];
  int lda = 0, ldb = 0, ldc = 0;
  for (int g = 0; g < ng; g++) {
    Ms[g] = g % 11 == 3 ? 0 : 1 + (int)mc_rng_below(11, 1, (uint64_t)g, 24);
    Ns[g] = g % 17 == 7 ? 0 : 1 + (int)mc_rng_below(11, 2, (uint64_t)g, 20);
    Ks[g] = g % 13 == 5 ? 0 : 1 + (int)mc_rng_below(11, 3, (uint64_t)g, 33);
    int ac = ta ? Ms[g] : Ks[g], bc = tb ? Ks[g] : Ns[g];
    lda = ac > lda ? ac : lda, ldb = bc > ldb ? bc : ldb, ldc = Ns[g] > ldc ? Ns[g] : ldc;
  }
  lda += 3, ldb += 5, ldc += 2;
  int64_t na = 0, nb = 0, nc = 0;
  for (int g = 0; g < ng; g++) {
    ao[g] = na * lda, bo[g] = nb * ldb, co[g] = nc * ldc;
    na += ta ? Ks[g] : Ms[g], nb += tb ? Ns[g] : Ks[g], nc += Ms[g];
  }
  na *= lda, nb *= ldb, nc *= ldc;
  float *A = b16_operand(na, exact), *B = b16_operand(nb, exact), *C = b16_operand(nc, exact);
  float *dA = be->alloc(be, (size_t)na * 4), *dB = be->alloc(be, (size_t)nb * 4), *dC = be->alloc(be, (size_t)nc * 4);
  be->from_host(be, dA, A, (size_t)na * 4), be->from_host(be, dB, B, (size_t)nb * 4), be->from_host(be, dC, C, (size_t)nc * 4);
  cpu->gemm_grouped(cpu, ta, tb, ng, Ms, Ns, Ks, 0.5f, A, ao, lda, B, bo, ldb, 0.25f, C, co, ldc);
  be->gemm_grouped(be, ta, tb, ng, Ms, Ns, Ks, 0.5f, dA, ao, lda, dB, bo, ldb, 0.25f, dC, co, ldc);
  char what[48];
  snprintf(what, sizeof what, "gemm_grouped %d ragged ta=%d tb=%d", ng, ta, tb);
  product_cmp(be, what, exact, dC, C, nc);
  be->free(be, dA), be->free(be, dB);
  free(A), free(B), free(C);
}

static void test_ragged_grouped(mc_backend *be) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      for (int ng = 1; ng <= RAG_G; ng += RAG_G - 1) {
        if (be == g16) {
          ragged_grouped(be, ta, tb, 1, ng);
          ragged_grouped(be, ta, tb, 0, ng);
        } else {
          ragged_grouped(be, ta, tb, 0, ng);
        }
      }
    }
  CHECK(be->sync(be) == 0, "ragged grouped: %s", mc_errmsg());
}

/* ------------------------------------------------------------------ bf16-stored weights
 * gemm_ex / gemm_grouped_ex (B stored in bf16; A too in a second pass) on both instances
 * against the CPU's fp32 product on the widened operands: the bf16 instance within b16_cmp's
 * bands (exact: only the fp32 A is rounded there, bf16 operands are read as stored), the fp32
 * instance within TOL_GEMM; one group and three (one empty). to_bf16 must
 * give kernels/bf16.h's bits, NaN, infinities, ties and subnormals included. */
static mc_bf16 *b16_weight(float *W, int64_t n, mc_backend *be) {
  mc_bf16 *h = malloc((size_t)n * sizeof(mc_bf16));
  for (int64_t i = 0; i < n; i++) h[i] = mc_bf16_from_float(W[i]), W[i] = mc_bf16_to_float(h[i]);
  mc_bf16 *d = be->alloc(be, (size_t)n * sizeof(mc_bf16));
  be->from_host(be, d, h, (size_t)n * sizeof(mc_bf16));
  free(h);
  return d;
}

static void b16_weights(mc_backend *be, int exact) {
  const int M = 67, N = 45, K = 129;
  char what[64];
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
      float *A = b16_operand(na, exact), *B = b16_operand(nb, exact), *C = b16_operand(nc, exact);
      mc_bf16 *dB = b16_weight(B, nb, be);
      float *dA = be->alloc(be, (size_t)na * 4), *dC = be->alloc(be, (size_t)nc * 4);
      be->from_host(be, dA, A, (size_t)na * 4), be->from_host(be, dC, C, (size_t)nc * 4);
      cpu->gemm(cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, ldc);
      be->gemm_ex(be, ta, tb, M, N, K, 0.5f, (mc_operand){dA, NULL}, lda, (mc_operand){NULL, dB}, ldb, 0.25f, (mc_dst){dC, NULL}, ldc);
      snprintf(what, sizeof what, "gemm_ex B16 ta=%d tb=%d", ta, tb);
      product_cmp(be, what, exact, dC, C, nc);
      /* A stored in bf16 as well (A rounded on the host; the CPU multiplies the widened values) */
      float *C2 = b16_operand(nc, exact);
      mc_bf16 *dA16 = b16_weight(A, na, be);
      float *dC2 = be->alloc(be, (size_t)nc * 4);
      be->from_host(be, dC2, C2, (size_t)nc * 4);
      cpu->gemm(cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C2, ldc);
      be->gemm_ex(be, ta, tb, M, N, K, 0.5f, (mc_operand){NULL, dA16}, lda, (mc_operand){NULL, dB}, ldb, 0.25f, (mc_dst){dC2, NULL}, ldc);
      snprintf(what, sizeof what, "gemm_ex A16 B16 ta=%d tb=%d", ta, tb);
      if (be == g16) { /* both operands exact in bf16: only the accumulation order differs */
        float *g = malloc((size_t)nc * sizeof(float));
        g16->to_host(g16, g, dC2, (size_t)nc * sizeof(float));
        CHECK(g16->sync(g16) == 0, "%s: %s", what, mc_errmsg());
        double num = 0, den = 0;
        for (int64_t i = 0; i < nc; i++) num += ((double)g[i] - C2[i]) * ((double)g[i] - C2[i]), den += (double)C2[i] * C2[i];
        const double e = sqrt(num / (den > 0 ? den : 1));
        printf("  bf16 %-34s rel err %.2e\n", what, e);
        CHECK(e <= 1e-5, "%s: rel err %.3e > 1e-5 with both operands stored in bf16", what, e);
        free(g);
        g16->free(g16, dC2);
      } else {
        cmp(what, dC2, C2, nc, TOL_GEMM);
        be->free(be, dC2);
      }
      be->free(be, dA16);
      free(C2);
      be->free(be, dA), be->free(be, dB);
      free(A), free(B), free(C);
    }
  const int d = EXP_D, F = EXP_F, total = EXP_TOTAL;
  for (int E = 1; E <= EXP_E; E += EXP_E - 1) {
    float *X = b16_operand((int64_t)total * d, exact), *W = b16_operand((int64_t)E * F * d, exact);
    float *Y = b16_operand((int64_t)total * F, exact);
    mc_bf16 *dW = b16_weight(W, (int64_t)E * F * d, be);
    float *dX = be->alloc(be, (size_t)total * d * 4), *dY = be->alloc(be, (size_t)total * F * 4);
    be->from_host(be, dX, X, (size_t)total * d * 4), be->from_host(be, dY, Y, (size_t)total * F * 4);
    int Ms[EXP_E], Ns[EXP_E], Ks[EXP_E];
    int64_t ao[EXP_E], bo[EXP_E], co[EXP_E];
    expert_shapes(0, Ms, Ns, Ks, ao, bo, co);
    cpu->gemm_grouped(cpu, 0, 1, E, Ms, Ns, Ks, 1.0f, X, ao, d, W, bo, d, 0.5f, Y, co, F);
    be->gemm_grouped_ex(be, 0, 1, E, Ms, Ns, Ks, 1.0f, (mc_operand){dX, NULL}, ao, d, (mc_operand){NULL, dW}, bo, d, 0.5f,
                        (mc_dst){dY, NULL}, co, F);
    snprintf(what, sizeof what, "gemm_grouped_ex %d group%s", E, E > 1 ? "s" : "");
    product_cmp(be, what, exact, dY, Y, (int64_t)total * F);
    be->free(be, dX), be->free(be, dW);
    free(X), free(W), free(Y);
  }
  CHECK(be->sync(be) == 0, "bf16-stored weights: %s", mc_errmsg());
}

/* Expert-sized groups (the bf16 instance multiplies them one cuBLAS call each, without
 * padding): rows {300, 0, 257}, d 200, F 256, forward with fp32 and with bf16-stored weights,
 * and the weight-gradient form (K = the ragged row count), alpha 0.5, beta 0.25. */
static void b16_large_groups(int exact) {
  enum { G = 3, D = 200, FF = 256, TOTAL = 557 };
  const int rows[G] = {300, 0, 257};
  int Ms[G], Ns[G], Ks[G];
  int64_t ao[G], bo[G], co[G];
  float *X = b16_operand((int64_t)TOTAL * D, exact), *W = b16_operand((int64_t)G * FF * D, exact);
  float *Y = b16_operand((int64_t)TOTAL * FF, exact), *G0 = b16_operand((int64_t)G * FF * D, exact);
  mc_bf16 *dW16 = b16_weight(W, (int64_t)G * FF * D, g16); /* W now holds the widened values */
  float *dX = b16_up(X, (int64_t)TOTAL * D), *dW = b16_up(W, (int64_t)G * FF * D);
  for (int form = 0; form < 3; form++) {
    for (int e = 0, off = 0; e < G; off += rows[e], e++) {
      if (form < 2) { /* Y[rows, FF] = X[rows, D] W[e]^T */
        Ms[e] = rows[e], Ns[e] = FF, Ks[e] = D;
        ao[e] = (int64_t)off * D, bo[e] = (int64_t)e * FF * D, co[e] = (int64_t)off * FF;
      } else { /* dW[e][FF, D] += Y_e^T X_e */
        Ms[e] = FF, Ns[e] = D, Ks[e] = rows[e];
        ao[e] = (int64_t)off * FF, bo[e] = (int64_t)off * D, co[e] = (int64_t)e * FF * D;
      }
    }
    const int64_t nc = form < 2 ? (int64_t)TOTAL * FF : (int64_t)G * FF * D;
    float *C = malloc((size_t)nc * sizeof(float));
    memcpy(C, form < 2 ? Y : G0, (size_t)nc * sizeof(float));
    float *dC = b16_up(C, nc);
    if (form < 2) {
      cpu->gemm_grouped(cpu, 0, 1, G, Ms, Ns, Ks, 0.5f, X, ao, D, W, bo, D, 0.25f, C, co, FF);
      if (form == 0) g16->gemm_grouped(g16, 0, 1, G, Ms, Ns, Ks, 0.5f, dX, ao, D, dW, bo, D, 0.25f, dC, co, FF);
      else g16->gemm_grouped_ex(g16, 0, 1, G, Ms, Ns, Ks, 0.5f, (mc_operand){dX, NULL}, ao, D, (mc_operand){NULL, dW16}, bo,
                                D, 0.25f, (mc_dst){dC, NULL}, co, FF);
    } else {
      float *dY = b16_up(Y, (int64_t)TOTAL * FF);
      cpu->gemm_grouped(cpu, 1, 0, G, Ms, Ns, Ks, 0.5f, Y, ao, FF, X, bo, D, 0.25f, C, co, D);
      g16->gemm_grouped(g16, 1, 0, G, Ms, Ns, Ks, 0.5f, dY, ao, FF, dX, bo, D, 0.25f, dC, co, D);
      g16->sync(g16);
      g16->free(g16, dY);
    }
    const char *what[3] = {"gemm_grouped large groups", "gemm_grouped_ex large groups", "gemm_grouped large wgrad"};
    b16_cmp(what[form], exact, dC, C, nc);
    free(C);
  }
  g16->free(g16, dX), g16->free(g16, dW), g16->free(g16, dW16);
  free(X), free(W), free(Y), free(G0);
}

static void test_to_bf16(mc_backend *be) {
  const int64_t n = 4096;
  float *x = kc_rand(n, stream_no++, 3.0f);
  const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -3e-39f, 3.4e38f, -3.39e38f,
                           1.00390625f /* a tie: rounds to even 1.0 */, 1.01171875f /* tie up */};
  memcpy(x, special, sizeof special);
  float *dx = be->alloc(be, (size_t)n * 4);
  mc_bf16 *dy = be->alloc(be, (size_t)n * 2), *y = malloc((size_t)n * 2);
  be->from_host(be, dx, x, (size_t)n * 4);
  be->to_bf16(be, dx, dy, n);
  be->to_host(be, y, dy, (size_t)n * 2);
  CHECK(be->sync(be) == 0, "to_bf16: %s", mc_errmsg());
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += y[i] != mc_bf16_from_float(x[i]);
  printf("  %-26s %9lld  mismatches %lld  %s\n", "to_bf16 (bits)", (long long)n, (long long)bad, bad ? "FAIL" : "ok");
  CHECK(bad == 0, "to_bf16: %lld of %lld bit patterns differ from kernels/bf16.h", (long long)bad, (long long)n);
  /* copy_bf16: the patterns (NaNs, infinities, zeros, denormals among them) moved as they
   * are, an odd count to an odd offset, the values around it untouched */
  mc_bf16 *dz = be->alloc(be, (size_t)(n + 2) * 2), *z = malloc((size_t)(n + 2) * 2);
  be->copy_bf16(be, dz + 1, dy, n - 1);
  be->to_host(be, z, dz, (size_t)(n + 2) * 2);
  CHECK(be->sync(be) == 0, "copy_bf16: %s", mc_errmsg());
  int64_t moved = z[0] != 0 || z[n] != 0 || z[n + 1] != 0;
  for (int64_t i = 0; i < n - 1; i++) moved += z[1 + i] != y[i];
  printf("  %-26s %9lld  mismatches %lld  %s\n", "copy_bf16 (bits)", (long long)(n - 1), (long long)moved, moved ? "FAIL" : "ok");
  CHECK(moved == 0, "copy_bf16: %lld of %lld bit patterns differ", (long long)moved, (long long)(n - 1));
  be->free(be, dx), be->free(be, dy), be->free(be, dz);
  free(x), free(y), free(z);
}

/* ------------------------------------------------------------------ bf16 outputs
 * Ops writing bf16 (mc_dst with h set) against the CPU writing bf16 from the same inputs:
 * both round their fp32 results, so the stored values agree except where the fp32 values
 * differ across a rounding boundary, or (GELU far in its negative tail, where 1 + erf
 * cancels) where the fp32 values themselves differ in relative terms: the widened results
 * must agree norm-wise within 1e-3 (a quarter of one bf16 step). Products on bf16-exact
 * operands have exact fp32 results: equal bit for bit. */
static void ulp_cmp(mc_backend *be, const char *what, const mc_bf16 *dev, const mc_bf16 *ref, int64_t n, int exact) {
  mc_bf16 *g = malloc((size_t)n * sizeof(mc_bf16));
  be->to_host(be, g, dev, (size_t)n * sizeof(mc_bf16));
  CHECK(be->sync(be) == 0, "%s: %s", what, mc_errmsg());
  int64_t differ = 0;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = mc_bf16_to_float(g[i]), b = mc_bf16_to_float(ref[i]);
    differ += g[i] != ref[i];
    num += (a - b) * (a - b), den += b * b;
  }
  const double rel = sqrt(num / (den > 0 ? den : 1));
  const int ok = exact ? differ == 0 : rel <= 1e-3;
  printf("  %-40s %8lld  differ %lld  rel %.2e  %s\n", what, (long long)n, (long long)differ, rel, ok ? "ok" : "FAIL");
  CHECK(ok, "%s: %lld of %lld stored values differ from the CPU's, rel %.3e (%s)", what, (long long)differ,
        (long long)n, rel, exact ? "exact operands: bitwise expected" : "band 1e-3");
  free(g);
}

static mc_bf16 *host16(const float *x, int64_t n) {
  mc_bf16 *h = malloc((size_t)n * sizeof(mc_bf16));
  for (int64_t i = 0; i < n; i++) h[i] = mc_bf16_from_float(x[i]);
  return h;
}

static mc_bf16 *dev16(mc_backend *be, const mc_bf16 *h, int64_t n) {
  mc_bf16 *d = be->alloc(be, (size_t)(n ? n : 1) * sizeof(mc_bf16));
  be->from_host(be, d, h, (size_t)n * sizeof(mc_bf16));
  return d;
}

static void b16_outputs(mc_backend *be) {
  const char *inst = be == g16 ? "bf16 inst" : "fp32 inst";
  char what[96];
  /* products: bf16-exact operands, one group, eight expert groups (the per-expert path on the
   * bf16 instance) and 70 small ragged groups (its padded batched path) */
  {
    const int M = 67, N = 45, K = 129, ldc = N + 3;
    float *A = b16_operand((int64_t)M * K, 1), *B = b16_operand((int64_t)K * N, 1), *C = calloc((size_t)M * ldc, 4);
    mc_bf16 *ref = calloc((size_t)M * ldc, 2), *dC = dev16(be, ref, (int64_t)M * ldc);
    float *dA = be->alloc(be, (size_t)M * K * 4);
    be->from_host(be, dA, A, (size_t)M * K * 4);
    mc_bf16 *hB = host16(B, (int64_t)K * N), *dB = dev16(be, hB, (int64_t)K * N);
    cpu->gemm(cpu, 0, 0, M, N, K, 0.5f, A, K, B, N, 0.0f, C, ldc);
    for (int64_t i = 0; i < (int64_t)M * ldc; i++) ref[i] = i % ldc < N ? mc_bf16_from_float(C[i]) : 0;
    be->gemm_ex(be, 0, 0, M, N, K, 0.5f, (mc_operand){dA, NULL}, K, (mc_operand){NULL, dB}, N, 0.0f,
                (mc_dst){NULL, dC}, ldc);
    snprintf(what, sizeof what, "%s gemm_ex -> bf16 C (ldc > N)", inst);
    ulp_cmp(be, what, dC, ref, (int64_t)M * ldc, 1);
    be->gemm_ex(be, 0, 0, M, N, K, 0.5f, (mc_operand){dA, NULL}, K, (mc_operand){NULL, dB}, N, 1.0f,
                (mc_dst){NULL, dC}, ldc);
    CHECK(be->sync(be) != 0 && strstr(mc_errmsg(), "beta"), "%s: gemm_ex into bf16 with beta 1 refused (%s)", inst,
          mc_errmsg());
    be->free(be, dA), be->free(be, dB), be->free(be, dC);
    free(A), free(B), free(C), free(ref), free(hB);
  }
  for (int form = 0; form < 2; form++) {
    /* form 0: 4 expert-sized groups (over 4M multiply-adds each); form 1: 70 ragged small
     * groups, some empty */
    const int G = form ? 70 : 4, Kd = form ? 24 : 128, Nf = form ? 20 : 256;
    int *Ms = malloc(G * sizeof(int)), *Ns = malloc(G * sizeof(int)), *Ks = malloc(G * sizeof(int));
    int64_t *ao = malloc(G * 8), *bo = malloc(G * 8), *co = malloc(G * 8), rows = 0;
    for (int g = 0; g < G; g++) {
      Ms[g] = form ? (g * 7) % 13 : 256 + 8 * g, Ns[g] = Nf, Ks[g] = Kd;
      ao[g] = rows * Kd, bo[g] = (int64_t)g * Nf * Kd, co[g] = rows * Nf;
      rows += Ms[g];
    }
    float *X = b16_operand(rows * Kd, 1), *W = b16_operand((int64_t)G * Nf * Kd, 1), *Y = calloc((size_t)rows * Nf, 4);
    mc_bf16 *hW = host16(W, (int64_t)G * Nf * Kd), *dW = dev16(be, hW, (int64_t)G * Nf * Kd);
    float *dX = be->alloc(be, (size_t)rows * Kd * 4);
    be->from_host(be, dX, X, (size_t)rows * Kd * 4);
    mc_bf16 *ref = malloc((size_t)rows * Nf * 2), *dY = be->alloc(be, (size_t)rows * Nf * 2);
    cpu->gemm_grouped(cpu, 0, 1, G, Ms, Ns, Ks, 1.0f, X, ao, Kd, W, bo, Kd, 0.0f, Y, co, Nf);
    for (int64_t i = 0; i < rows * Nf; i++) ref[i] = mc_bf16_from_float(Y[i]);
    be->gemm_grouped_ex(be, 0, 1, G, Ms, Ns, Ks, 1.0f, (mc_operand){dX, NULL}, ao, Kd, (mc_operand){NULL, dW}, bo, Kd,
                        0.0f, (mc_dst){NULL, dY}, co, Nf);
    snprintf(what, sizeof what, "%s gemm_grouped_ex -> bf16 (%d groups)", inst, G);
    ulp_cmp(be, what, dY, ref, rows * Nf, 1);
    be->free(be, dX), be->free(be, dW), be->free(be, dY);
    free(Ms), free(Ns), free(Ks), free(ao), free(bo), free(co), free(X), free(W), free(Y), free(hW), free(ref);
  }
  /* gated units all in bf16: n a multiple of 8 and aligned (the vectorised SiLU form), odd n,
   * and an offset start (the per-element form) */
  static const char *names[4] = {"silu", "gelu", "sigmoid", "softplus"};
  for (int a = 0; a < 4; a++)
    for (int shape = 0; shape < 3; shape++) {
      const int64_t n = shape == 1 ? 40001 : 40000, off = shape == 2 ? 1 : 0;
      float *x = kc_rand(n + off, stream_no++, 2.0f), *y = kc_rand(n + off, stream_no++, 1.0f);
      float *g = kc_rand(n + off, stream_no++, 1.0f);
      mc_bf16 *x16 = host16(x, n + off), *y16 = host16(y, n + off), *g16h = host16(g, n + off);
      mc_bf16 *o16 = calloc((size_t)(n + off), 2), *da16 = calloc((size_t)(n + off), 2), *db16 = calloc((size_t)(n + off), 2);
      mc_bf16 *dx = dev16(be, x16, n + off), *dy = dev16(be, y16, n + off), *dg = dev16(be, g16h, n + off);
      mc_bf16 *dout = dev16(be, o16, n + off), *dda = dev16(be, da16, n + off), *ddb = dev16(be, db16, n + off);
      const mc_operand hx = {NULL, x16 + off}, hy = {NULL, y16 + off}, hg = {NULL, g16h + off};
      cpu->glu_fwd(cpu, (mc_act)a, hx, hy, (mc_dst){NULL, o16 + off}, n);
      be->glu_fwd(be, (mc_act)a, (mc_operand){NULL, dx + off}, (mc_operand){NULL, dy + off}, (mc_dst){NULL, dout + off}, n);
      snprintf(what, sizeof what, "%s glu_fwd %s bf16 n=%lld off=%lld", inst, names[a], (long long)n, (long long)off);
      ulp_cmp(be, what, dout + off, o16 + off, n, 0);
      cpu->glu_bwd(cpu, (mc_act)a, hx, hy, hg, (mc_dst){NULL, da16 + off}, (mc_dst){NULL, db16 + off}, n);
      be->glu_bwd(be, (mc_act)a, (mc_operand){NULL, dx + off}, (mc_operand){NULL, dy + off}, (mc_operand){NULL, dg + off},
                  (mc_dst){NULL, dda + off}, (mc_dst){NULL, ddb + off}, n);
      snprintf(what, sizeof what, "%s glu_bwd %s bf16 da n=%lld", inst, names[a], (long long)n);
      ulp_cmp(be, what, dda + off, da16 + off, n, 0);
      snprintf(what, sizeof what, "%s glu_bwd %s bf16 db n=%lld", inst, names[a], (long long)n);
      ulp_cmp(be, what, ddb + off, db16 + off, n, 0);
      be->free(be, dx), be->free(be, dy), be->free(be, dg), be->free(be, dout), be->free(be, dda), be->free(be, ddb);
      free(x), free(y), free(g), free(x16), free(y16), free(g16h), free(o16), free(da16), free(db16);
    }
  /* rmsnorm and cross-entropy gradient into bf16 */
  {
    const int rows = 300, width = 512;
    float *x = kc_rand((int64_t)rows * width, stream_no++, 1.0f), *w = kc_rand(width, stream_no++, 1.0f);
    float *rs = calloc(rows * 8, 4);
    mc_bf16 *ref = calloc((size_t)rows * width, 2), *dyv = be->alloc(be, (size_t)rows * width * 2);
    float *dxv = be->alloc(be, (size_t)rows * width * 4), *dw = be->alloc(be, width * 4), *drs = be->alloc(be, rows * 8 * 4);
    be->from_host(be, dxv, x, (size_t)rows * width * 4), be->from_host(be, dw, w, width * 4);
    for (int grp = width; grp >= 64; grp /= 8) {
      cpu->rmsnorm_fwd(cpu, x, w, rows, width, grp, 1e-5f, (mc_dst){NULL, ref}, rs);
      be->rmsnorm_fwd(be, dxv, dw, rows, width, grp, 1e-5f, (mc_dst){NULL, dyv}, drs);
      snprintf(what, sizeof what, "%s rmsnorm_fwd -> bf16 group=%d", inst, grp);
      ulp_cmp(be, what, dyv, ref, (int64_t)rows * width, 0);
    }
    be->free(be, dyv), be->free(be, dxv), be->free(be, dw), be->free(be, drs);
    free(x), free(w), free(rs), free(ref);
    const int nx = 64, V = 1000, Vp = 1024;
    float *lg = kc_rand((int64_t)nx * Vp, stream_no++, 3.0f), *loss = calloc(nx, 4), *lse = calloc(nx, 4);
    int32_t tgt[64];
    for (int r = 0; r < nx; r++) tgt[r] = (r * 37) % V;
    cpu->xent_fwd(cpu, lg, tgt, nx, V, Vp, loss, lse);
    mc_bf16 *dref = calloc((size_t)nx * Vp, 2), *ddl = be->alloc(be, (size_t)nx * Vp * 2);
    cpu->xent_bwd(cpu, lg, tgt, lse, nx, V, Vp, 0.5f, (mc_dst){NULL, dref});
    float *dlg = be->alloc(be, (size_t)nx * Vp * 4), *dlse = be->alloc(be, nx * 4);
    int32_t *dtgt = be->alloc(be, nx * 4);
    be->from_host(be, dlg, lg, (size_t)nx * Vp * 4), be->from_host(be, dlse, lse, nx * 4), be->from_host(be, dtgt, tgt, nx * 4);
    be->xent_bwd(be, dlg, dtgt, dlse, nx, V, Vp, 0.5f, (mc_dst){NULL, ddl});
    snprintf(what, sizeof what, "%s xent_bwd -> bf16", inst);
    ulp_cmp(be, what, ddl, dref, (int64_t)nx * Vp, 0);
    be->free(be, ddl), be->free(be, dlg), be->free(be, dlse), be->free(be, dtgt);
    free(lg), free(loss), free(lse), free(dref);
  }
  /* RoPE in place on bf16, and rotated back from fp32 into a written bf16 gradient: head_dim
   * 64 (the vectorised kernel) and 6 (one thread per pair) */
  for (int hd = 64; hd >= 6; hd = hd == 64 ? 6 : 0) {
    const int rows = 130, T = 65, heads = 4;
    const int64_t ne = (int64_t)rows * heads * hd;
    float *x = kc_rand(ne, stream_no++, 1.0f), *g = kc_rand(ne, stream_no++, 1.0f);
    mc_bf16 *x16 = host16(x, ne), *ref = host16(x, ne), *dref = calloc((size_t)ne, 2);
    mc_bf16 *dx16 = dev16(be, x16, ne), *ddx = dev16(be, dref, ne);
    float *dg = be->alloc(be, (size_t)ne * 4);
    be->from_host(be, dg, g, (size_t)ne * 4);
    cpu->rope_fwd(cpu, (mc_dst){NULL, ref}, rows, T, heads, hd, 10000.0);
    be->rope_fwd(be, (mc_dst){NULL, dx16}, rows, T, heads, hd, 10000.0);
    snprintf(what, sizeof what, "%s rope_fwd in place bf16 hd=%d", inst, hd);
    ulp_cmp(be, what, dx16, ref, ne, 0);
    cpu->rope_bwd(cpu, (mc_operand){g, NULL}, (mc_dst){NULL, dref}, rows, T, heads, hd, 10000.0);
    be->rope_bwd(be, (mc_operand){dg, NULL}, (mc_dst){NULL, ddx}, rows, T, heads, hd, 10000.0);
    snprintf(what, sizeof what, "%s rope_bwd -> bf16 hd=%d", inst, hd);
    ulp_cmp(be, what, ddx, dref, ne, 0);
    be->free(be, dx16), be->free(be, ddx), be->free(be, dg);
    free(x), free(g), free(x16), free(ref), free(dref);
  }
  /* attention on bf16-stored q, k, v, out, dout (out written in bf16) against the CPU on the
   * widened values: the fp32 instance's kernels within the fp32 bands, the bf16 instance's
   * tensor-core kernels (p and ds rounded to bf16) within 1e-2 */
  {
    const int n_seq = 2, T = 80, H = 4, KV = 2, hd = 64;
    const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
    float *q = kc_rand(nq, stream_no++, 1.0f), *k = kc_rand(nk, stream_no++, 1.0f), *v = kc_rand(nk, stream_no++, 1.0f);
    float *dout = kc_rand(nq, stream_no++, 1.0f);
    mc_bf16 *q16 = host16(q, nq), *k16 = host16(k, nk), *v16 = host16(v, nk), *do16 = host16(dout, nq);
    mc_bf16 *o16 = calloc((size_t)nq, 2);
    float *lse = calloc((size_t)n * H, 4), *dq = calloc((size_t)nq, 4), *dk = calloc((size_t)nk, 4), *dv = calloc((size_t)nk, 4);
    cpu->attn_fwd(cpu, (mc_operand){NULL, q16}, (mc_operand){NULL, k16}, (mc_operand){NULL, v16}, n_seq, T, H, KV, hd,
                  (mc_dst){NULL, o16}, lse);
    cpu->attn_bwd(cpu, (mc_operand){NULL, q16}, (mc_operand){NULL, k16}, (mc_operand){NULL, v16}, (mc_operand){NULL, o16},
                  lse, (mc_operand){NULL, do16}, n_seq, T, H, KV, hd, dq, dk, dv);
    mc_bf16 *dq16 = dev16(be, q16, nq), *dk16 = dev16(be, k16, nk), *dv16 = dev16(be, v16, nk), *ddo = dev16(be, do16, nq);
    mc_bf16 *dout16 = be->alloc(be, (size_t)nq * 2);
    float *dlse = be->alloc(be, (size_t)n * H * 4), *gq = be->alloc(be, (size_t)nq * 4), *gk = be->alloc(be, (size_t)nk * 4),
          *gv = be->alloc(be, (size_t)nk * 4);
    be->attn_fwd(be, (mc_operand){NULL, dq16}, (mc_operand){NULL, dk16}, (mc_operand){NULL, dv16}, n_seq, T, H, KV, hd,
                 (mc_dst){NULL, dout16}, dlse);
    const int tc = be == g16;
    snprintf(what, sizeof what, "%s attn_fwd bf16 q k v -> bf16 out", inst);
    if (tc) {
      mc_bf16 *g = malloc((size_t)nq * 2);
      be->to_host(be, g, dout16, (size_t)nq * 2);
      CHECK(be->sync(be) == 0, "%s: %s", what, mc_errmsg());
      double num = 0, den = 0;
      for (int64_t i = 0; i < nq; i++) {
        const double a = mc_bf16_to_float(g[i]), b = mc_bf16_to_float(o16[i]);
        num += (a - b) * (a - b), den += b * b;
      }
      const double rel = sqrt(num / den);
      printf("  %-40s %8lld  rel %.2e  %s\n", what, (long long)nq, rel, rel <= 1e-2 ? "ok" : "FAIL");
      CHECK(rel <= 1e-2, "%s: rel %.3e > 1e-2", what, rel);
      free(g);
    } else {
      ulp_cmp(be, what, dout16, o16, nq, 0);
    }
    /* the backward reads the CPU's out (both sides the same bf16 values) */
    be->from_host(be, dout16, o16, (size_t)nq * 2);
    be->from_host(be, dlse, lse, (size_t)n * H * 4);
    be->attn_bwd(be, (mc_operand){NULL, dq16}, (mc_operand){NULL, dk16}, (mc_operand){NULL, dv16},
                 (mc_operand){NULL, dout16}, dlse, (mc_operand){NULL, ddo}, n_seq, T, H, KV, hd, gq, gk, gv);
    CHECK(be->sync(be) == 0, "%s attn_bwd bf16: %s", inst, mc_errmsg()); /* cmp reads through the fp32 instance */
    const double tol = tc ? 1e-2 : TOL_ATTN;
    snprintf(what, sizeof what, "%s attn_bwd bf16 in dq", inst);
    cmp(what, gq, dq, nq, tol);
    snprintf(what, sizeof what, "%s attn_bwd bf16 in dk", inst);
    cmp(what, gk, dk, nk, tol);
    snprintf(what, sizeof what, "%s attn_bwd bf16 in dv", inst);
    cmp(what, gv, dv, nk, tol);
    be->free(be, dq16), be->free(be, dk16), be->free(be, dv16), be->free(be, ddo), be->free(be, dout16);
    be->free(be, dlse), be->free(be, gq), be->free(be, gk), be->free(be, gv);
    free(q), free(k), free(v), free(dout), free(q16), free(k16), free(v16), free(do16), free(o16), free(lse), free(dq),
        free(dk), free(dv);
  }
  CHECK(be->sync(be) == 0, "bf16 outputs: %s", mc_errmsg());
}

static void test_bf16(void) {
  g16 = mc_backend_cuda_bf16(0);
  CHECK(g16 != NULL, "the bf16-products backend failed: %s", mc_errmsg());
  if (!g16) return;
  CHECK(mc_backend_cuda_bf16(0) == g16, "a second mc_backend_cuda_bf16(0) returns the same instance");
  CHECK(g16 != gpu, "the bf16-products instance is not the fp32 one");
  b16_gemm(1);
  b16_gemm(0);
  b16_long_k();
  test_ragged_grouped(g16);
  test_ragged_grouped(gpu);
  b16_large_groups(1);
  b16_large_groups(0);
  b16_weights(g16, 1);
  b16_weights(g16, 0);
  b16_weights(gpu, 0);
  test_to_bf16(gpu);
  test_to_bf16(g16);
  b16_outputs(gpu);
  b16_outputs(g16);
  CHECK(g16->bf16_weights == 1 && gpu->bf16_weights == 0, "only the bf16 instance asks for bf16 weights");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report_time(const char *what, double *ts, int n, double flops) {
  qsort(ts, (size_t)n, sizeof *ts, cmp_dbl);
  double med = ts[n / 2];
  if (flops > 0)
    printf("  time %-32s %9.3f ms  %7.2f TFLOP/s\n", what, 1e3 * med, flops / med * 1e-12);
  else
    printf("  time %-32s %9.3f ms\n", what, 1e3 * med);
}

/* Five samples ts[0..5) of stmt's per-call time, after one warm-up call: each sample times
 * reps back-to-back calls with the host clock around a sync. */
#define TIME_SAMPLES(what, reps, ts, stmt)                               \
  do {                                                                   \
    stmt;                                                                \
    gpu->sync(gpu);                                                      \
    for (int i_ = 0; i_ < 5; i_++) {                                     \
      double t0_ = now_s();                                              \
      for (int k_ = 0; k_ < (reps); k_++) stmt;                          \
      CHECK(gpu->sync(gpu) == 0, "%s: %s", what, mc_errmsg());           \
      (ts)[i_] = (now_s() - t0_) / (reps);                               \
    }                                                                    \
  } while (0)

#define TIME_GPU(what, flops, stmt)                                      \
  do {                                                                   \
    double ts_[5];                                                       \
    TIME_SAMPLES(what, 1, ts_, stmt);                                    \
    report_time(what, ts_, 5, flops);                                    \
  } while (0)

static void shapes_gemm(void) {
  const int M = 4096, N = 2048, K = 1024;
  float *A = hrand((int64_t)M * K, 1), *B = hrand((int64_t)N * K, 1), *C = hzeros((int64_t)M * N);
  float *Ad = up(A, (int64_t)M * K), *Bd = up(B, (int64_t)N * K), *Cd = dnan((int64_t)M * N);
  cpu->gemm(cpu, 0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
  gpu->gemm(gpu, 0, 1, M, N, K, 1.0f, Ad, K, Bd, K, 0.0f, Cd, N);
  cmp("gemm 4096x2048x1024 (NT)", Cd, C, (int64_t)M * N, TOL_GEMM);
  TIME_GPU("gemm 4096x2048x1024 fp32", 2.0 * M * N * K,
           gpu->gemm(gpu, 0, 1, M, N, K, 1.0f, Ad, K, Bd, K, 0.0f, Cd, N));
  case_end();
}

static void shapes_attn(const char *name, int n_seq, int T, int H, int KV, int hd) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *q = hrand(nq, 1), *k = hrand(nk, 1), *v = hrand(nk, 1), *dout = hrand(nq, 1);
  float *out = hzeros(nq), *lse = hzeros(n * H), *dq = hzeros(nq), *dk = hzeros(nk), *dv = hzeros(nk);
  float *qd = up(q, nq), *kd = up(k, nk), *vd = up(v, nk), *dod = up(dout, nq), *outd = dnan(nq), *lsed = dnan(n * H);
  float *dqd = up(dq, nq), *dkd = up(dk, nk), *dvd = up(dv, nk);
  char what[96];
  cpu->attn_fwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, n_seq, T, H, KV, hd, (mc_dst){out, NULL}, lse);
  gpu->attn_fwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){outd, NULL}, lsed);
  snprintf(what, sizeof what, "attn_fwd %s", name);
  cmp(what, outd, out, nq, TOL_ATTN);
  cpu->attn_bwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){out, NULL}, lse, (mc_operand){dout, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);
  gpu->attn_bwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){outd, NULL}, lsed, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
  snprintf(what, sizeof what, "attn_bwd dq %s", name);
  cmp(what, dqd, dq, nq, TOL_ATTN);
  snprintf(what, sizeof what, "attn_bwd dk %s", name);
  cmp(what, dkd, dk, nk, TOL_ATTN);
  snprintf(what, sizeof what, "attn_bwd dv %s", name);
  cmp(what, dvd, dv, nk, TOL_ATTN);
  /* causal: half of the T x T scores; forward 2 products, backward 5 (s, dp, dq, dk, dv) */
  double f2 = 2.0 * n_seq * H * ((double)T * T / 2) * hd;
  snprintf(what, sizeof what, "attn_fwd %s", name);
  TIME_GPU(what, 2 * f2, gpu->attn_fwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){outd, NULL}, lsed));
  snprintf(what, sizeof what, "attn_bwd %s", name);
  TIME_GPU(what, 5 * f2, gpu->attn_bwd(gpu, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){outd, NULL}, lsed, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd));
  case_end();
}

static void shapes_ssm(int n_seq, int T, int Hm, int P, int N) {
  const int64_t n = (int64_t)n_seq * T, nx = n * Hm * P;
  float *x = hrand(nx, 1), *B = hrand(n * N, 0.3f), *C = hrand(n * N, 0.3f), *D = hrand(Hm, 1), *A_log = hrand(Hm, 0.5f);
  float *dt = hrand(n * Hm, 1);
  for (int64_t i = 0; i < n * Hm; i++) dt[i] = 0.001f + 0.05f * fabsf(dt[i]);
  float *y = hzeros(nx), *g = hrand(nx, 1), *dx = hzeros(nx), *ddt = hzeros(n * Hm), *dA = hzeros(Hm),
        *dB = hzeros(n * N), *dC = hzeros(n * N), *dD = hzeros(Hm);
  float *xd = up(x, nx), *dtd = up(dt, n * Hm), *Ad = up(A_log, Hm), *Bd = up(B, n * N), *Cd = up(C, n * N),
        *Dd = up(D, Hm), *yd = dnan(nx), *gd = up(g, nx);
  float *dxd = up(dx, nx), *ddtd = up(ddt, n * Hm), *dAd = up(dA, Hm), *dBd = up(dB, n * N), *dCd = up(dC, n * N),
        *dDd = up(dD, Hm);
  cpu->ssm_fwd(cpu, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  gpu->ssm_fwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, n_seq, T, Hm, P, N, yd);
  cmp("ssm_fwd nam-small", yd, y, nx, TOL_SCAN);
  cpu->ssm_bwd(cpu, x, dt, A_log, B, C, D, g, n_seq, T, Hm, P, N, dx, ddt, dA, dB, dC, dD);
  gpu->ssm_bwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, gd, n_seq, T, Hm, P, N, dxd, ddtd, dAd, dBd, dCd, dDd);
  cmp("ssm_bwd dx nam-small", dxd, dx, nx, TOL_SCAN);
  cmp("ssm_bwd ddt", ddtd, ddt, n * Hm, TOL_SCAN);
  cmp("ssm_bwd dA_log", dAd, dA, Hm, TOL_SCAN);
  cmp("ssm_bwd dB", dBd, dB, n * N, TOL_SCAN);
  cmp("ssm_bwd dC", dCd, dC, n * N, TOL_SCAN);
  cmp("ssm_bwd dD", dDd, dD, Hm, TOL_SCAN);
  TIME_GPU("ssm_fwd nam-small", 0, gpu->ssm_fwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, n_seq, T, Hm, P, N, yd));
  TIME_GPU("ssm_bwd nam-small", 0,
           gpu->ssm_bwd(gpu, xd, dtd, Ad, Bd, Cd, Dd, gd, n_seq, T, Hm, P, N, dxd, ddtd, dAd, dBd, dCd, dDd));
  case_end();
}

static void shapes_misc(void) {
  const int n_seq = 2, T = 2048, n = n_seq * T, d = 1024, c = 2048, K = 4;
  /* RG-LRU over rec_width 1024 */
  {
    const int64_t m = (int64_t)n * d;
    float *gx = hrand(m, 1), *r = hrand(m, 1), *lam = hrand(d, 1), *h = hzeros(m), *dh = hrand(m, 1);
    for (int64_t i = 0; i < m; i++) r[i] = 1.0f / (1.0f + expf(-r[i]));
    float *dgx = hzeros(m), *dr = hzeros(m), *dl = hzeros(d);
    float *gxd = up(gx, m), *rd = up(r, m), *ld = up(lam, d), *hd = dnan(m), *dhd = up(dh, m);
    float *dgxd = up(dgx, m), *drd = up(dr, m), *dld = up(dl, d);
    cpu->rglru_fwd(cpu, gx, r, lam, n_seq, T, d, h);
    gpu->rglru_fwd(gpu, gxd, rd, ld, n_seq, T, d, hd);
    cmp("rglru_fwd nam-small", hd, h, m, TOL_SCAN);
    cpu->rglru_bwd(cpu, gx, r, lam, h, dh, n_seq, T, d, dgx, dr, dl);
    gpu->rglru_bwd(gpu, gxd, rd, ld, hd, dhd, n_seq, T, d, dgxd, drd, dld);
    cmp("rglru_bwd dr nam-small", drd, dr, m, TOL_SCAN);
    cmp("rglru_bwd dlambda", dld, dl, d, TOL_SCAN);
    TIME_GPU("rglru_fwd nam-small", 0, gpu->rglru_fwd(gpu, gxd, rd, ld, n_seq, T, d, hd));
    TIME_GPU("rglru_bwd nam-small", 0, gpu->rglru_bwd(gpu, gxd, rd, ld, hd, dhd, n_seq, T, d, dgxd, drd, dld));
    case_end();
  }
  /* depthwise conv over mamba_inner 2048 */
  {
    const int64_t m = (int64_t)n * c;
    float *x = hrand(m, 1), *w = hrand((int64_t)c * K, 1), *b = hrand(c, 1), *y = hzeros(m), *g = hrand(m, 1);
    float *dx = hzeros(m), *dw = hzeros((int64_t)c * K), *db = hzeros(c);
    float *xd = up(x, m), *wd = up(w, (int64_t)c * K), *bd = up(b, c), *yd = dnan(m), *gd = up(g, m);
    float *dxd = up(dx, m), *dwd = up(dw, (int64_t)c * K), *dbd = up(db, c);
    cpu->conv_silu_fwd(cpu, x, w, b, n_seq, T, c, K, y);
    gpu->conv_silu_fwd(gpu, xd, wd, bd, n_seq, T, c, K, yd);
    cmp("conv_silu_fwd nam-small", yd, y, m, TOL_EXACT);
    cpu->conv_silu_bwd(cpu, x, w, b, g, n_seq, T, c, K, (mc_dst){dx, NULL}, dw, db);
    gpu->conv_silu_bwd(gpu, xd, wd, bd, gd, n_seq, T, c, K, (mc_dst){dxd, NULL}, dwd, dbd);
    cmp("conv_silu_bwd dw nam-small", dwd, dw, (int64_t)c * K, TOL_CPU_FSUM);
    TIME_GPU("conv_silu_fwd nam-small", 0, gpu->conv_silu_fwd(gpu, xd, wd, bd, n_seq, T, c, K, yd));
    TIME_GPU("conv_silu_bwd nam-small", 0,
             gpu->conv_silu_bwd(gpu, xd, wd, bd, gd, n_seq, T, c, K, (mc_dst){dxd, NULL}, dwd, dbd));
    case_end();
  }
  /* RMSNorm full width, and per head over mamba_inner */
  {
    const int64_t m = (int64_t)n * c;
    float *x = hrand(m, 1), *w = hrand(c, 1), *y = hzeros(m), *rs = hzeros((int64_t)n * (c / 64)), *g = hrand(m, 1);
    float *dx = hzeros(m), *dw = hzeros(c);
    float *xd = up(x, m), *wd = up(w, c), *yd = dnan(m), *rsd = dnan((int64_t)n * (c / 64)), *gd = up(g, m);
    float *dxd = up(dx, m), *dwd = up(dw, c);
    cpu->rmsnorm_fwd(cpu, x, w, n, c, 64, 1e-5f, (mc_dst){y, NULL}, rs);
    gpu->rmsnorm_fwd(gpu, xd, wd, n, c, 64, 1e-5f, (mc_dst){yd, NULL}, rsd);
    cmp("rmsnorm_fwd group=64", yd, y, m, TOL_EXACT);
    cpu->rmsnorm_bwd(cpu, x, w, rs, g, n, c, 64, dx, dw);
    gpu->rmsnorm_bwd(gpu, xd, wd, rsd, gd, n, c, 64, dxd, dwd);
    cmp("rmsnorm_bwd dw group=64", dwd, dw, c, TOL_SUM);
    TIME_GPU("rmsnorm_fwd 4096x2048 group=64", 0, gpu->rmsnorm_fwd(gpu, xd, wd, n, c, 64, 1e-5f, (mc_dst){yd, NULL}, rsd));
    TIME_GPU("rmsnorm_bwd 4096x2048 group=64", 0, gpu->rmsnorm_bwd(gpu, xd, wd, rsd, gd, n, c, 64, dxd, dwd));
    mc_bf16 *zh = host16(x, m), *zhd = dev16(gpu, zh, m), *dzhd = dev16(gpu, zh, m);
    TIME_GPU("gated_rmsnorm_fwd 4096x2048 group=64 z bf16", 0,
             gpu->gated_rmsnorm_fwd(gpu, xd, (mc_operand){NULL, zhd}, wd, n, c, 64, 1e-5f, (mc_dst){NULL, (mc_bf16 *)yd}, rsd));
    TIME_GPU("gated_rmsnorm_bwd 4096x2048 group=64 z bf16", 0,
             gpu->gated_rmsnorm_bwd(gpu, xd, (mc_operand){NULL, zhd}, wd, rsd, gd, n, c, 64, dxd, (mc_dst){NULL, dzhd}, dwd));
    gpu->free(gpu, zhd), gpu->free(gpu, dzhd);
    free(zh);
    TIME_GPU("rmsnorm_fwd 4096x2048 full", 0, gpu->rmsnorm_fwd(gpu, xd, wd, n, c, c, 1e-5f, (mc_dst){yd, NULL}, rsd));
    case_end();
  }
  /* cross-entropy over the 32768 vocabulary (1024 rows) */
  {
    const int nx = 1024, V = 32768, Vp = 32768;
    int32_t *tgt = track_host(malloc(nx * sizeof(int32_t)));
    for (int r = 0; r < nx; r++) tgt[r] = (int32_t)mc_rng_below(7, 9, (uint64_t)r, V);
    float *lg = hrand((int64_t)nx * Vp, 3), *loss = hzeros(nx), *lse = hzeros(nx), *dl = hzeros((int64_t)nx * Vp);
    float *lgd = up(lg, (int64_t)nx * Vp), *lossd = dnan(nx), *lsed = dnan(nx), *dld = dnan((int64_t)nx * Vp);
    int32_t *tgtd = upi(tgt, nx);
    cpu->xent_fwd(cpu, lg, tgt, nx, V, Vp, loss, lse);
    gpu->xent_fwd(gpu, lgd, tgtd, nx, V, Vp, lossd, lsed);
    cmp("xent_fwd 1024x32768", lossd, loss, nx, TOL_EXACT);
    cpu->xent_bwd(cpu, lg, tgt, lse, nx, V, Vp, 1e-3f, (mc_dst){dl, NULL});
    gpu->xent_bwd(gpu, lgd, tgtd, lsed, nx, V, Vp, 1e-3f, (mc_dst){dld, NULL});
    cmp("xent_bwd 1024x32768", dld, dl, (int64_t)nx * Vp, TOL_EXACT);
    TIME_GPU("xent_fwd 1024x32768", 0, gpu->xent_fwd(gpu, lgd, tgtd, nx, V, Vp, lossd, lsed));
    TIME_GPU("xent_bwd 1024x32768", 0, gpu->xent_bwd(gpu, lgd, tgtd, lsed, nx, V, Vp, 1e-3f, (mc_dst){dld, NULL}));
    case_end();
  }
  /* MoE routing and permutation, 8 experts, top-2, d_model 1024 */
  {
    const int E = 8, k = 2;
    float *lg = hrand((int64_t)n * E, 1), *probs = hzeros((int64_t)n * E), *gate = hzeros((int64_t)n * k);
    float *f = hzeros((int64_t)n_seq * E), *aux = hzeros(n_seq);
    int32_t *idx = track_host(malloc((size_t)n * k * 4)), *slot = track_host(malloc((size_t)n * k * 4)), counts[8],
            dropped;
    float *lgd = up(lg, (int64_t)n * E), *pd = dnan((int64_t)n * E), *gd = dnan((int64_t)n * k),
          *fd = dnan((int64_t)n_seq * E), *ad = dnan(n_seq);
    int32_t *idxd = dalloc((size_t)n * k * 4), *slotd = dalloc((size_t)n * k * 4), *cd = dalloc(sizeof counts),
            *dd = dalloc(4);
    const int cap = (int)(1.25 * k * T / E);
    cpu->moe_route(cpu, lg, n_seq, T, E, k, cap, probs, idx, gate, slot, counts, f, NULL, aux, &dropped);
    gpu->moe_route(gpu, lgd, n_seq, T, E, k, cap, pd, idxd, gd, slotd, cd, fd, NULL, ad, dd);
    cmpi("moe_route slot nam-small", slotd, slot, (int64_t)n * k);
    cmpi("moe_route counts", cd, counts, E);
    TIME_GPU("moe_route 4096 tokens E=8 k=2", 0,
             gpu->moe_route(gpu, lgd, n_seq, T, E, k, cap, pd, idxd, gd, slotd, cd, fd, NULL, ad, dd));
    int rows = 0;
    for (int e = 0; e < E; e++) rows += counts[e];
    float *x = hrand((int64_t)n * d, 1), *xd = up(x, (int64_t)n * d), *xpd = dnan((int64_t)rows * d);
    TIME_GPU("moe_permute d=1024", 0, gpu->moe_permute(gpu, xd, slotd, n, k, d, (mc_dst){xpd, NULL}));
    TIME_GPU("moe_permute d=1024 into bf16", 0, gpu->moe_permute(gpu, xd, slotd, n, k, d, (mc_dst){NULL, (mc_bf16 *)xpd}));
    float *dgt = dnan((int64_t)n * k), *dypt = dnan((int64_t)rows * d);
    TIME_GPU("moe_unpermute_bwd d=1024", 0,
             gpu->moe_unpermute_bwd(gpu, xd, xpd, slotd, gd, n, k, d, (mc_dst){dypt, NULL}, dgt));
    TIME_GPU("moe_permute_bwd d=1024", 0, gpu->moe_permute_bwd(gpu, xpd, slotd, n, k, d, xd));
    TIME_GPU("moe_unpermute d=1024", 0, gpu->moe_unpermute(gpu, xpd, slotd, gd, n, k, d, xd));
    case_end();
  }
}

/* Per-call time of stmt: the median of 5 samples of 20 back-to-back calls each (host clock
 * around a sync), so the launch and sync gaps of short kernels stay out of the figure; bytes
 * is the least device traffic (inputs read once, outputs written once) for GB/s. */
#define TIME_REPS(what, bytes, stmt)                                                              \
  do {                                                                                            \
    double ts_[5];                                                                                \
    TIME_SAMPLES(what, 20, ts_, stmt);                                                            \
    qsort(ts_, 5, sizeof *ts_, cmp_dbl);                                                          \
    printf("  time %-36s %8.1f us  %6.0f GB/s\n", what, 1e6 * ts_[2], (double)(bytes) / ts_[2] * 1e-9); \
  } while (0)

/* The same op twice on the same inputs must give the same bits (no float atomics). */
static void same_bits(const char *what, const void *a_dev, const void *b_dev, int64_t bytes) {
  void *a = track_host(malloc((size_t)bytes)), *b = track_host(malloc((size_t)bytes));
  gpu->to_host(gpu, a, a_dev, (size_t)bytes);
  gpu->to_host(gpu, b, b_dev, (size_t)bytes);
  CHECK(gpu->sync(gpu) == 0, "%s: %s", what, mc_errmsg());
  const int same = memcmp(a, b, (size_t)bytes) == 0;
  printf("  %-36s run to run %s\n", what, same ? "bitwise equal: ok" : "DIFFERENT: FAIL");
  CHECK(same, "%s: two runs on the same inputs differ", what);
}

/* dense-a's row ops at their exact shapes (4096 tokens, d = 2048, 16 heads of 128, vocabulary
 * 32768): checked against the CPU (the vectorised paths the small cases above may not reach),
 * run twice for bitwise reproducibility, then timed (TIME_REPS). `test_cuda_ops --rows` runs
 * only these. */
static void shapes_rows(void) {
  const int n = 4096, d = 2048, T = 2048, H = 16, hd = 128, V = 32768;
  const int64_t m = (int64_t)n * d;
  char what[64];
  {
    float *x = hrand(m, 1), *w = hrand(d, 1), *g = hrand(m, 1), *y = hzeros(m), *rs = hzeros((int64_t)n * (d / 64));
    float *dx = hrand(m, 1), *dw = hrand(d, 1);
    float *xd = up(x, m), *wd = up(w, d), *gd = up(g, m), *yd = dnan(m), *rsd = dnan((int64_t)n * (d / 64));
    float *dxd = up(dx, m), *dwd = up(dw, d), *dxd2 = up(dx, m), *dwd2 = up(dw, d);
    mc_bf16 *y16 = dalloc((size_t)m * 2);
    for (int grp = d; grp >= 64; grp /= 32) {
      const int64_t nr = (int64_t)n * (d / grp);
      float *dx0 = hcopy(dx, m), *dw0 = hcopy(dw, d);
      cpu->rmsnorm_fwd(cpu, x, w, n, d, grp, 1e-5f, (mc_dst){y, NULL}, rs);
      gpu->rmsnorm_fwd(gpu, xd, wd, n, d, grp, 1e-5f, (mc_dst){yd, NULL}, rsd);
      snprintf(what, sizeof what, "rmsnorm_fwd %dx%d g=%d y", n, d, grp);
      cmp(what, yd, y, m, TOL_EXACT);
      snprintf(what, sizeof what, "rmsnorm_fwd %dx%d g=%d rstd", n, d, grp);
      cmp(what, rsd, rs, nr, TOL_EXACT);
      cpu->rmsnorm_bwd(cpu, x, w, rs, g, n, d, grp, dx0, dw0);
      gpu->from_host(gpu, dxd, dx, (size_t)m * 4), gpu->from_host(gpu, dwd, dw, (size_t)d * 4);
      gpu->from_host(gpu, dxd2, dx, (size_t)m * 4), gpu->from_host(gpu, dwd2, dw, (size_t)d * 4);
      gpu->rmsnorm_bwd(gpu, xd, wd, rsd, gd, n, d, grp, dxd, dwd);
      gpu->rmsnorm_bwd(gpu, xd, wd, rsd, gd, n, d, grp, dxd2, dwd2);
      snprintf(what, sizeof what, "rmsnorm_bwd %dx%d g=%d dx", n, d, grp);
      cmp(what, dxd, dx0, m, TOL_SUM);
      snprintf(what, sizeof what, "rmsnorm_bwd %dx%d g=%d dw", n, d, grp);
      cmp(what, dwd, dw0, d, TOL_SUM);
      same_bits(what, dwd, dwd2, (int64_t)d * 4);
      snprintf(what, sizeof what, "rmsnorm_bwd %dx%d g=%d dx", n, d, grp);
      same_bits(what, dxd, dxd2, m * 4);
      snprintf(what, sizeof what, "rmsnorm_fwd %dx%d g=%d", n, d, grp);
      TIME_REPS(what, m * 8, gpu->rmsnorm_fwd(gpu, xd, wd, n, d, grp, 1e-5f, (mc_dst){yd, NULL}, rsd));
      snprintf(what, sizeof what, "rmsnorm_fwd %dx%d g=%d bf16", n, d, grp);
      TIME_REPS(what, m * 6, gpu->rmsnorm_fwd(gpu, xd, wd, n, d, grp, 1e-5f, (mc_dst){NULL, y16}, rsd));
      snprintf(what, sizeof what, "rmsnorm_bwd %dx%d g=%d", n, d, grp);
      TIME_REPS(what, m * 16, gpu->rmsnorm_bwd(gpu, xd, wd, rsd, gd, n, d, grp, dxd, dwd));
    }
    /* RoPE over the same buffers as 4096 x 16 heads x 128 */
    float *r0 = hcopy(x, m), *rd0 = hcopy(dx, m);
    cpu->rope_fwd(cpu, (mc_dst){r0, NULL}, n, T, H, hd, 10000.0);
    gpu->from_host(gpu, dxd, x, (size_t)m * 4);
    gpu->rope_fwd(gpu, (mc_dst){dxd, NULL}, n, T, H, hd, 10000.0);
    cmp("rope_fwd 4096x16x128", dxd, r0, m, TOL_EXACT);
    cpu->rope_bwd(cpu, (mc_operand){g, NULL}, (mc_dst){rd0, NULL}, n, T, H, hd, 10000.0);
    gpu->from_host(gpu, dxd2, dx, (size_t)m * 4);
    gpu->rope_bwd(gpu, (mc_operand){gd, NULL}, (mc_dst){dxd2, NULL}, n, T, H, hd, 10000.0);
    cmp("rope_bwd 4096x16x128", dxd2, rd0, m, TOL_EXACT);
    TIME_REPS("rope_fwd 4096x16x128", m * 8, gpu->rope_fwd(gpu, (mc_dst){dxd, NULL}, n, T, H, hd, 10000.0));
    TIME_REPS("rope_bwd 4096x16x128", m * 12, gpu->rope_bwd(gpu, (mc_operand){gd, NULL}, (mc_dst){dxd2, NULL}, n, T, H, hd, 10000.0));
    case_end();
  }
  {
    const int64_t nv = (int64_t)n * V;
    int32_t *tgt = track_host(malloc(n * sizeof(int32_t)));
    for (int r = 0; r < n; r++) tgt[r] = (int32_t)mc_rng_below(7, 10, (uint64_t)r, V);
    float *lg = hrand(nv, 3), *loss = hzeros(n), *lse = hzeros(n), *dl = hzeros(nv);
    float *lgd = up(lg, nv), *lossd = dnan(n), *lsed = dnan(n), *lsed2 = dnan(n), *dld = dnan(nv);
    int32_t *tgtd = upi(tgt, n);
    cpu->xent_fwd(cpu, lg, tgt, n, V, V, loss, lse);
    gpu->xent_fwd(gpu, lgd, tgtd, n, V, V, lossd, lsed);
    gpu->xent_fwd(gpu, lgd, tgtd, n, V, V, lossd, lsed2);
    cmp("xent_fwd 4096x32768 loss", lossd, loss, n, TOL_EXACT);
    cmp("xent_fwd 4096x32768 lse", lsed, lse, n, TOL_EXACT);
    same_bits("xent_fwd 4096x32768 lse", lsed, lsed2, (int64_t)n * 4);
    cpu->xent_bwd(cpu, lg, tgt, lse, n, V, V, 1e-3f, (mc_dst){dl, NULL});
    gpu->xent_bwd(gpu, lgd, tgtd, lsed, n, V, V, 1e-3f, (mc_dst){dld, NULL});
    cmp("xent_bwd 4096x32768", dld, dl, nv, TOL_EXACT);
    mc_bf16 *d16 = (mc_bf16 *)dld;
    TIME_REPS("xent_fwd 4096x32768", nv * 4, gpu->xent_fwd(gpu, lgd, tgtd, n, V, V, lossd, lsed));
    TIME_REPS("xent_bwd 4096x32768", nv * 8, gpu->xent_bwd(gpu, lgd, tgtd, lsed, n, V, V, 1e-3f, (mc_dst){dld, NULL}));
    TIME_REPS("xent_bwd 4096x32768 bf16", nv * 6,
              gpu->xent_bwd(gpu, lgd, tgtd, lsed, n, V, V, 1e-3f, (mc_dst){NULL, d16}));
    case_end();
  }
}

/* Expert products at nam-small's shapes (8 experts, d = 1024, F = 2048, 2 x 2048 tokens with
 * top-2 routing: 8192 assignments, unevenly spread under the capacity of 1280): the forward
 * Y_e = X_e W_e^T, and the backward's dX_e += dY_e W_e and dW_e += dY_e^T X_e. Each checked
 * against the CPU once, then timed (median of 7 after a warm-up, host clock around sync) as
 * one gemm_grouped call and as one gemm call per expert (what gemm_grouped did before it
 * batched), on the fp32 and the bf16-products instances. */
enum { GT_E = 8, GT_D = 1024, GT_F = 2048, GT_ROWS = 8192 };
static const int gt_rows[GT_E] = {1224, 874, 1104, 768, 1055, 1024, 1119, 1024};

static double time_median(mc_backend *be, int grouped, int ta, int tb, const int *Ms, const int *Ns,
                          const int *Ks, const float *A, const int64_t *ao, int lda, const float *B,
                          const int64_t *bo, int ldb, float beta, float *C, const int64_t *co, int ldc) {
  double ts[7];
  for (int rep = -1; rep < 7; rep++) {
    double t0 = now_s();
    if (grouped)
      be->gemm_grouped(be, ta, tb, GT_E, Ms, Ns, Ks, 1.0f, A, ao, lda, B, bo, ldb, beta, C, co, ldc);
    else
      for (int e = 0; e < GT_E; e++)
        be->gemm(be, ta, tb, Ms[e], Ns[e], Ks[e], 1.0f, A + ao[e], lda, B + bo[e], ldb, beta, C + co[e], ldc);
    CHECK(be->sync(be) == 0, "expert products: %s", mc_errmsg());
    if (rep >= 0) ts[rep] = now_s() - t0;
  }
  qsort(ts, 7, sizeof *ts, cmp_dbl);
  return ts[3];
}

static void grouped_time(mc_backend *be, const char *name) {
  const int64_t nx = (int64_t)GT_ROWS * GT_D, nw = (int64_t)GT_E * GT_F * GT_D, ny = (int64_t)GT_ROWS * GT_F;
  float *X = hrand(nx, 1), *W = hrand(nw, 0.03f), *Y = hzeros(ny), *dY = hrand(ny, 1), *dX = hrand(nx, 1), *dW = hrand(nw, 1);
  float *Xd = be->alloc(be, nx * 4), *Wd = be->alloc(be, nw * 4), *Yd = be->alloc(be, ny * 4), *dYd = be->alloc(be, ny * 4),
        *dXd = be->alloc(be, nx * 4), *dWd = be->alloc(be, nw * 4);
  CHECK(Xd && Wd && Yd && dYd && dXd && dWd, "expert products: allocation: %s", mc_errmsg());
  if (!(Xd && Wd && Yd && dYd && dXd && dWd)) return;
  be->from_host(be, Xd, X, nx * 4), be->from_host(be, Wd, W, nw * 4), be->from_host(be, dYd, dY, ny * 4);
  be->from_host(be, dXd, dX, nx * 4), be->from_host(be, dWd, dW, nw * 4);
  int Ms[3][GT_E], Ns[3][GT_E], Ks[3][GT_E];
  int64_t ao[3][GT_E], bo[3][GT_E], co[3][GT_E];
  for (int e = 0, r = 0; e < GT_E; r += gt_rows[e], e++) {
    int64_t w = (int64_t)e * GT_F * GT_D;
    /* forward: Y_e = X_e W_e^T */
    Ms[0][e] = gt_rows[e], Ns[0][e] = GT_F, Ks[0][e] = GT_D, ao[0][e] = (int64_t)r * GT_D, bo[0][e] = w, co[0][e] = (int64_t)r * GT_F;
    /* dX_e += dY_e W_e */
    Ms[1][e] = gt_rows[e], Ns[1][e] = GT_D, Ks[1][e] = GT_F, ao[1][e] = (int64_t)r * GT_F, bo[1][e] = w, co[1][e] = (int64_t)r * GT_D;
    /* dW_e += dY_e^T X_e */
    Ms[2][e] = GT_F, Ns[2][e] = GT_D, Ks[2][e] = gt_rows[e], ao[2][e] = (int64_t)r * GT_F, bo[2][e] = (int64_t)r * GT_D, co[2][e] = w;
  }
  static const char *what[3] = {"fwd  Y = X W^T", "bwd dX += dY W", "bwd dW += dY^T X"};
  const int ta[3] = {0, 0, 1}, tb[3] = {1, 0, 0}, lda[3] = {GT_D, GT_F, GT_F}, ldb[3] = {GT_D, GT_D, GT_D},
            ldc[3] = {GT_F, GT_D, GT_D};
  const float beta[3] = {0.0f, 1.0f, 1.0f};
  const float *Ah[3] = {X, dY, dY}, *Bh[3] = {W, W, X}, *Ad[3] = {Xd, dYd, dYd}, *Bd[3] = {Wd, Wd, Xd};
  float *Ch[3] = {Y, dX, dW}, *Cd[3] = {Yd, dXd, dWd};
  const int64_t nc[3] = {ny, nx, nw};
  const double flops = 2.0 * GT_ROWS * GT_F * GT_D;
  int b16 = be == g16;
  for (int p = 0; p < 3; p++) {
    cpu->gemm_grouped(cpu, ta[p], tb[p], GT_E, Ms[p], Ns[p], Ks[p], 1.0f, Ah[p], ao[p], lda[p], Bh[p], bo[p], ldb[p],
                      beta[p], Ch[p], co[p], ldc[p]);
    be->gemm_grouped(be, ta[p], tb[p], GT_E, Ms[p], Ns[p], Ks[p], 1.0f, Ad[p], ao[p], lda[p], Bd[p], bo[p], ldb[p],
                     beta[p], Cd[p], co[p], ldc[p]);
    float *g = hzeros(nc[p]);
    be->to_host(be, g, Cd[p], (size_t)nc[p] * 4);
    double num = 0, den = 0;
    for (int64_t i = 0; i < nc[p]; i++) num += ((double)g[i] - Ch[p][i]) * ((double)g[i] - Ch[p][i]), den += (double)Ch[p][i] * Ch[p][i];
    double e = sqrt(num / (den > 0 ? den : 1));
    printf("  %s experts %-18s rel err vs CPU %.2e\n", name, what[p], e);
    if (b16) CHECK(e > 1e-5 && e <= 1e-2, "%s %s: rel err %.3e outside (1e-5, 1e-2]", name, what[p], e);
    else CHECK(e <= TOL_GEMM, "%s %s: rel err %.3e above %.0e", name, what[p], e, TOL_GEMM);
    double tg = time_median(be, 1, ta[p], tb[p], Ms[p], Ns[p], Ks[p], Ad[p], ao[p], lda[p], Bd[p], bo[p], ldb[p],
                            beta[p], Cd[p], co[p], ldc[p]);
    double tl = time_median(be, 0, ta[p], tb[p], Ms[p], Ns[p], Ks[p], Ad[p], ao[p], lda[p], Bd[p], bo[p], ldb[p],
                            beta[p], Cd[p], co[p], ldc[p]);
    printf("  time %s experts %-18s grouped %7.3f ms (%6.1f TFLOP/s)  per-expert gemm %7.3f ms (%6.1f TFLOP/s)\n",
           name, what[p], 1e3 * tg, flops / tg * 1e-12, 1e3 * tl, flops / tl * 1e-12);
  }
  be->free(be, Xd), be->free(be, Wd), be->free(be, Yd), be->free(be, dYd), be->free(be, dXd), be->free(be, dWd);
  case_end();
}

static void run_grouped_time(void) {
  printf("expert products at nam-small shapes: 8 experts with %d..%d rows, d = %d, F = %d\n", 768, 1224, GT_D, GT_F);
  grouped_time(gpu, "fp32");
  if (g16) grouped_time(g16, "bf16");
}

static void run_shapes(void) {
  printf("model-sized shapes (nam-small / dense-a layers, 2 x 2048 tokens)\n");
  shapes_gemm();
  shapes_attn("nam-small H=16/4 hd=64", 2, 2048, 16, 4, 64);
  shapes_attn("dense-a H=16/16 hd=128", 2, 2048, 16, 16, 128);
  shapes_ssm(2, 2048, 32, 64, 64);
  shapes_misc();
  shapes_rows();
  run_grouped_time();
}
#endif

int main(int argc, char **argv) {
  if (!kc_cuda_usable()) return 0;
#ifndef MC_HAVE_CUDA
  (void)argc, (void)argv;
  return 0;
#else
  cpu = mc_backend_cpu();
  gpu = mc_backend_cuda(0);
  CHECK(gpu != NULL, "a device exists but the backend failed: %s", mc_errmsg());
  if (!gpu) return mc_check_exit("test_cuda_ops");
  printf("op                          elements  error vs CPU reference\n");
  test_elementwise();
  test_gemm();
  test_rows();
  test_gated_norm();
  attn_case(2, 70, 4, 2, 40);   /* ragged tiles, GQA groups of 2 */
  attn_case(1, 130, 4, 1, 128); /* head_dim 128 (48+ KB of shared memory), MQA */
  attn_case(3, 17, 2, 2, 16);   /* the tiny config's head size */
  attn_case(1, 64, 2, 1, 256);  /* the largest head size supported */
  attn_case(2, 45, 3, 3, 18);   /* head_dim not a multiple of 4: the scalar dot products */
  attn_case(1, 40, 4, 2, 100);  /* 4 columns per lane, partly masked */
  test_conv();
  ssm_case(2, 50, 3, 12, 40); /* P not a multiple of 8, N over one warp, a partial chunk */
  ssm_case(3, 64, 4, 32, 16); /* the default config's shape */
  ssm_case(1, 37, 2, 9, 100); /* 4 states per lane, partly masked */
  ssm_case(2, 21, 1, 8, 256); /* a wide state (more than one tile of the chunked scan) */
  test_rglru();
  moe_case(0, 33);
  moe_case(12, 33);
  moe_case(0, 64);
  moe_case(12, 64);
  test_failures();
  test_bf16();
  if (argc > 1 && strcmp(argv[1], "--shapes") == 0) run_shapes();
  if (argc > 1 && strcmp(argv[1], "--grouped") == 0) run_grouped_time();
  if (argc > 1 && strcmp(argv[1], "--rows") == 0) shapes_rows();
  printf("worst error/tolerance over all ops: %.3f\n", worst_ratio);
  return mc_check_exit("test_cuda_ops");
#endif
}
