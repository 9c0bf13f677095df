/* Muon's math (train/muon.c) on the CPU backend, and on the CUDA backend where a GPU exists:
 * - Newton-Schulz against a float64 reference (plain C) for square, wide, tall, single-row,
 *   single-column and rank-deficient matrices (exact zero rows or columns), to 1e-5 relative
 *   (max |diff| / max |ref|), and low-rank products to 1e-4 (TOL_LOW_RANK says why); the
 *   reference always iterates on the wide orientation (a tall matrix transposed), so the
 *   tall path's X^T X form is checked against the plain definition;
 * - the property quintic Newton-Schulz gives: every singular value of a full-rank result in
 *   [0.6, 1.3] (eigenvalues of the Gram matrix by Jacobi rotations), a rank-deficient input's
 *   null directions kept null; the same bits on a second run; the scratch not overrun;
 * - a full step (direction with and without Nesterov, orthogonalize, apply with weight decay
 *   and a bf16 copy) against float64, 1e-5 relative;
 * - copy_2d assembling a matrix from tensor-parallel column blocks (the trainer's use) against
 *   the loop of its definition, exactly, and the blocks of the orthogonalized whole. */
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "tests/check.h"
#include "tests/kernels/cudacheck.h"
#include "tests/kernels/kcheck.h"
#include "train/muon.h"
#include "util/error.h"

#define TOL 1e-5
#define STEPS 5

/* ------------------------------------------------------------------ host <-> backend */
static float *up(mc_backend *be, const float *h, int64_t n) {
  float *d = be->alloc(be, (size_t)(n ? n : 1) * sizeof(float));
  if (!d) {
    fprintf(stderr, "backend allocation of %lld floats failed: %s\n", (long long)n, mc_errmsg());
    exit(1);
  }
  be->from_host(be, d, h, (size_t)n * sizeof(float));
  return d;
}

static float *down(mc_backend *be, const float *d, int64_t n) {
  float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
  be->to_host(be, h, d, (size_t)n * sizeof(float));
  CHECK(be->sync(be) == 0, "%s sync: %s", be->name, mc_errmsg());
  return h;
}

/* max |got - ref| / max |ref| */
static double rel_err(const float *got, const double *ref, int64_t n) {
  double d = 0.0, r = 0.0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)got[i] - ref[i]));
    r = fmax(r, fabs(ref[i]));
  }
  return isfinite(d) ? d / fmax(r, 1e-300) : INFINITY;
}

/* ------------------------------------------------------------------ float64 reference */
/* NS on the wide m x n matrix X (m <= n) in double: the formula of train/muon.h verbatim. */
static void ref_ns_wide(double *X, int m, int n, int steps) {
  double s = 0.0;
  for (int64_t i = 0; i < (int64_t)m * n; i++) s += X[i] * X[i];
  const double inv = 1.0 / (sqrt(s) + 1e-7);
  for (int64_t i = 0; i < (int64_t)m * n; i++) X[i] *= inv;
  double *A = malloc((size_t)m * m * sizeof(double)), *B = malloc((size_t)m * m * sizeof(double));
  double *Y = malloc((size_t)m * n * sizeof(double));
  for (int it = 0; it < steps; it++) {
    for (int i = 0; i < m; i++)
      for (int j = 0; j < m; j++) {
        double a = 0.0;
        for (int k = 0; k < n; k++) a += X[i * n + k] * X[j * n + k];
        A[i * m + j] = a;
      }
    for (int i = 0; i < m; i++)
      for (int j = 0; j < m; j++) {
        double aa = 0.0;
        for (int k = 0; k < m; k++) aa += A[i * m + k] * A[k * m + j];
        B[i * m + j] = -4.7750 * A[i * m + j] + 2.0315 * aa;
      }
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double bx = 0.0;
        for (int k = 0; k < m; k++) bx += B[i * m + k] * X[k * n + j];
        Y[i * n + j] = 3.4445 * X[i * n + j] + bx;
      }
    memcpy(X, Y, (size_t)m * n * sizeof(double));
  }
  free(A), free(B), free(Y);
}

/* NS of the rows x cols float matrix x, in double: a tall one through its transpose. */
static double *ref_ns(const float *x, int rows, int cols, int steps) {
  const int tall = rows > cols, m = tall ? cols : rows, n = tall ? rows : cols;
  double *X = malloc((size_t)rows * cols * sizeof(double));
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) X[tall ? j * rows + i : i * cols + j] = x[i * cols + j];
  ref_ns_wide(X, m, n, steps);
  if (!tall) return X;
  double *T = malloc((size_t)rows * cols * sizeof(double));
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) T[i * cols + j] = X[j * rows + i];
  free(X);
  return T;
}

/* Singular values of the rows x cols matrix x (min(rows, cols) of them, ascending): square
 * roots of the eigenvalues of its smaller Gram matrix, by cyclic Jacobi rotations. */
static void singular_values(const float *x, int rows, int cols, double *sv) {
  const int wide = rows <= cols, m = wide ? rows : cols, n = wide ? cols : rows;
  double *G = calloc((size_t)m * m, sizeof(double));
  for (int i = 0; i < m; i++)
    for (int j = 0; j < m; j++)
      for (int k = 0; k < n; k++)
        G[i * m + j] += wide ? (double)x[i * cols + k] * x[j * cols + k] : (double)x[k * cols + i] * x[k * cols + j];
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0.0;
    for (int p = 0; p < m; p++)
      for (int q = p + 1; q < m; q++) off += G[p * m + q] * G[p * m + q];
    if (off < 1e-30) break;
    for (int p = 0; p < m; p++)
      for (int q = p + 1; q < m; q++) {
        if (fabs(G[p * m + q]) < 1e-300) continue;
        /* the rotation that zeroes G[p][q] (Golub & Van Loan, symmetric Schur) */
        const double th = (G[q * m + q] - G[p * m + p]) / (2.0 * G[p * m + q]);
        const double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
        const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < m; k++) { /* columns p, q */
          const double gp = G[k * m + p], gq = G[k * m + q];
          G[k * m + p] = c * gp - s * gq, G[k * m + q] = s * gp + c * gq;
        }
        for (int k = 0; k < m; k++) { /* rows p, q */
          const double gp = G[p * m + k], gq = G[q * m + k];
          G[p * m + k] = c * gp - s * gq, G[q * m + k] = s * gp + c * gq;
        }
      }
  }
  for (int i = 0; i < m; i++) sv[i] = sqrt(fmax(G[i * m + i], 0.0));
  for (int i = 1; i < m; i++) /* insertion sort: m is small */
    for (int j = i; j > 0 && sv[j] < sv[j - 1]; j--) {
      const double t = sv[j];
      sv[j] = sv[j - 1], sv[j - 1] = t;
    }
  free(G);
}

/* ------------------------------------------------------------------ Newton-Schulz */
/* Tolerance of a numerically low-rank input (a product of rank-r factors, rounded to fp32):
 * its null directions hold the input's rounding, ~1e-8 of the norm, which the float and the
 * float64 iteration both amplify, by up to a = 3.4445 per step (a^5 = 487) where the singular
 * values are tiny; the fp32 arithmetic adds its own rounding there, ~6e-8 relative, which grows
 * the same way: 487 * 6e-8 = 3e-5 at most; 1.6e-5 the largest over 60 seeds of these cases.
 * Exactly zero rows or columns stay exactly zero and keep TOL. */
#define TOL_LOW_RANK 1e-4

typedef struct {
  const char *name;
  int rows, cols;
  int rank;               /* > 0: the product of rows x rank and rank x cols random factors */
  int zero_row, zero_col; /* >= 0: that row or column set to exactly zero */
  int nulls;              /* singular values that must stay ~0 */
  double tol;
} ns_case;

static float *make_matrix(const ns_case *c, uint64_t seed) {
  const int64_t size = (int64_t)c->rows * c->cols;
  float *x = kc_rand(size, seed, 1.0f);
  if (c->rank > 0) {
    float *U = kc_rand((int64_t)c->rows * c->rank, seed + 1, 1.0f);
    float *V = kc_rand((int64_t)c->rank * c->cols, seed + 2, 1.0f);
    for (int i = 0; i < c->rows; i++)
      for (int j = 0; j < c->cols; j++) {
        double s = 0.0;
        for (int k = 0; k < c->rank; k++) s += (double)U[i * c->rank + k] * V[k * c->cols + j];
        x[i * c->cols + j] = (float)s;
      }
    free(U), free(V);
  }
  for (int j = 0; c->zero_row >= 0 && j < c->cols; j++) x[c->zero_row * c->cols + j] = 0.0f;
  for (int i = 0; c->zero_col >= 0 && i < c->rows; i++) x[i * c->cols + c->zero_col] = 0.0f;
  return x;
}

static void test_ns_case(mc_backend *be, const ns_case *c, uint64_t seed) {
  const int64_t size = (int64_t)c->rows * c->cols, wf = mc_muon_work_floats(c->rows, c->cols);
  const int m = c->rows < c->cols ? c->rows : c->cols;
  enum { GUARD = 64 };
  float *x = make_matrix(c, seed);
  double *ref = ref_ns(x, c->rows, c->cols, STEPS);
  float *dX = up(be, x, size), *dX2 = up(be, x, size);
  float *work = be->alloc(be, (size_t)(wf + GUARD) * sizeof(float));
  CHECK(work != NULL, "work alloc: %s", mc_errmsg());
  if (!work) return;
  be->fill(be, work + wf, GUARD, 12345.0f); /* past the scratch promised: must stay */
  mc_muon_orthogonalize(be, dX, c->rows, c->cols, STEPS, work);
  mc_muon_orthogonalize(be, dX2, c->rows, c->cols, STEPS, work);
  float *got = down(be, dX, size), *got2 = down(be, dX2, size), *guard = down(be, work + wf, GUARD);
  const double rel = rel_err(got, ref, size);
  CHECK(rel <= c->tol, "%s %s: NS relative error %.3e above %.0e", be->name, c->name, rel, c->tol);
  CHECK(memcmp(got, got2, (size_t)size * sizeof(float)) == 0, "%s %s: a second run gave other bits", be->name,
        c->name);
  int overrun = 0;
  for (int i = 0; i < GUARD; i++) overrun += guard[i] != 12345.0f;
  CHECK(overrun == 0, "%s %s: %d floats written past mc_muon_work_floats", be->name, c->name, overrun);
  /* Singular values. After the normalization they lie in [0, 1], and the quintic
   * p(s) = a s + b s^3 + c s^5 maps [0, 1.21] into itself (its maximum is p(0.554) = 1.202), so
   * every one ends at most 1.21. Small ones grow by about a = 3.44 per step: 5 steps of p take
   * every s in [0.0013, 1] into [0.6, 1.21] (0.005 -> 0.017 -> 0.059 -> 0.20 -> 0.66 -> 1.15).
   * Hence: all <= 1.3; the `nulls` ones ~0; the others >= 0.6 where the input's smallest
   * non-null one is >= 0.005 of its norm (a margin over 0.0013; a random square matrix may
   * have a smaller one, whose image after 5 steps is still on its way up). */
  double *sv = malloc((size_t)m * sizeof(double)), *sv_in = malloc((size_t)m * sizeof(double));
  singular_values(got, c->rows, c->cols, sv);
  singular_values(x, c->rows, c->cols, sv_in);
  const int zeros = c->nulls;
  const double in_low = sv_in[zeros < m ? zeros : 0] / sqrt(kc_dot(x, x, size));
  int bad = 0;
  for (int i = 0; i < m; i++)
    bad += i < zeros ? !(sv[i] < 1e-2) : !(sv[i] <= 1.3 && (in_low < 0.005 || sv[i] >= 0.6));
  CHECK(bad == 0, "%s %s: %d singular values out of place (smallest %.4f, largest %.4f)", be->name, c->name, bad,
        sv[0], sv[m - 1]);
  printf("  %-4s NS %-18s %3dx%-3d  rel %.2e (tol %.0e)  singular values %.4f .. %.4f (%d null; input's smallest "
         "%.3g of its norm: lower bound %s)\n",
         be->name, c->name, c->rows, c->cols, rel, c->tol, sv[zeros < m ? zeros : 0], sv[m - 1], zeros, in_low,
         in_low < 0.005 ? "not checked" : "checked");
  free(sv), free(sv_in), free(x), free(ref), free(got), free(got2), free(guard);
  be->free(be, dX), be->free(be, dX2), be->free(be, work);
}

static void test_ns(mc_backend *be) {
  static const ns_case cases[] = {
      {"square", 16, 16, 0, -1, -1, 0, TOL},
      {"wide", 8, 24, 0, -1, -1, 0, TOL},
      {"tall", 24, 8, 0, -1, -1, 0, TOL},
      {"row", 1, 7, 0, -1, -1, 0, TOL},
      {"column", 7, 1, 0, -1, -1, 0, TOL},
      {"larger", 40, 72, 0, -1, -1, 0, TOL},
      {"zero row", 6, 10, 0, 4, -1, 1, TOL},
      {"zero column, tall", 12, 5, 0, -1, 2, 1, TOL},
      {"rank 3", 6, 10, 3, -1, -1, 3, TOL_LOW_RANK},
      {"rank 2, tall", 12, 5, 2, -1, -1, 3, TOL_LOW_RANK},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_ns_case(be, &cases[i], 100 + 10 * i);
  /* no steps: only the normalization, to unit Frobenius norm */
  float *x = kc_rand(12, 3, 2.0f), *dX = up(be, x, 12), *work = be->alloc(be, 64 * sizeof(float));
  mc_muon_orthogonalize(be, dX, 3, 4, 0, work);
  CHECK_CLOSE(be->sumsq(be, dX, 12), 1.0, 1e-6);
  be->free(be, dX), be->free(be, work), free(x);
}

/* ------------------------------------------------------------------ a whole step */
static void test_step(mc_backend *be, int rows, int cols, int nesterov) {
  const int64_t n = (int64_t)rows * cols;
  const float mu = 0.95f, gs = 0.7f, lr = 0.1f, wd = 0.1f;
  float *w = kc_rand(n, 40, 0.1f), *g = kc_rand(n, 41, 1.0f), *mom = kc_rand(n, 42, 0.5f);
  /* float64: M, U, O, W */
  double *M = malloc((size_t)n * sizeof(double)), *W = malloc((size_t)n * sizeof(double));
  float *U = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    M[i] = (double)mu * mom[i] + (double)gs * g[i];
    U[i] = (float)(nesterov ? (double)gs * g[i] + (double)mu * M[i] : M[i]);
  }
  double *O = ref_ns(U, rows, cols, STEPS);
  const double scale = 0.2 * sqrt(rows > cols ? rows : cols);
  for (int64_t i = 0; i < n; i++) W[i] = w[i] * (1.0 - (double)lr * wd) - (double)lr * scale * O[i];
  /* backend */
  float *dW = up(be, w, n), *dG = up(be, g, n), *dM = up(be, mom, n), *dU = up(be, g, n);
  float *work = be->alloc(be, (size_t)mc_muon_work_floats(rows, cols) * sizeof(float));
  mc_bf16 *dH = be->alloc(be, (size_t)n * sizeof(mc_bf16));
  mc_muon_direction(be, dM, dG, dU, n, mu, nesterov, gs);
  mc_muon_orthogonalize(be, dU, rows, cols, STEPS, work);
  mc_muon_apply(be, dW, dU, n, lr, wd, (float)mc_muon_scale(rows, cols), dH);
  float *gm = down(be, dM, n), *gu = down(be, dU, n), *gw = down(be, dW, n);
  mc_bf16 *gh = malloc((size_t)n * sizeof(mc_bf16));
  be->to_host(be, gh, dH, (size_t)n * sizeof(mc_bf16));
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  double em = rel_err(gm, M, n), eo = rel_err(gu, O, n), ew = rel_err(gw, W, n);
  /* the step moved W by a good fraction of its size, so the comparison sees the update */
  double moved = 0.0, wmax = 0.0;
  for (int64_t i = 0; i < n; i++) moved = fmax(moved, fabs(W[i] - w[i])), wmax = fmax(wmax, fabs(W[i]));
  int bf = 0;
  for (int64_t i = 0; i < n; i++) bf += gh[i] != mc_bf16_from_float(gw[i]);
  CHECK(em <= TOL && eo <= TOL && ew <= TOL, "%s %dx%d nesterov=%d: rel M %.2e O %.2e W %.2e (tol %.0e)", be->name,
        rows, cols, nesterov, em, eo, ew, TOL);
  CHECK(moved > 0.1 * wmax, "%s: the step moved W by only %.3g of %.3g", be->name, moved, wmax);
  CHECK(bf == 0, "%s: %d bf16 weights are not bf16(W)", be->name, bf);
  printf("  %-4s step %2dx%-2d nesterov=%d  rel M %.2e  O %.2e  W %.2e  bf16 == bf16(W)\n", be->name, rows, cols,
         nesterov, em, eo, ew);
  be->free(be, dW), be->free(be, dG), be->free(be, dM), be->free(be, dU), be->free(be, work), be->free(be, dH);
  free(w), free(g), free(mom), free(M), free(W), free(U), free(O), free(gm), free(gu), free(gw), free(gh);
}

static void test_scalars(void) {
  CHECK(mc_muon_scale(16, 64) == 0.2 * 8.0 && mc_muon_scale(64, 16) == 0.2 * 8.0, "scale %g", mc_muon_scale(16, 64));
  CHECK(mc_muon_work_floats(8, 24) == 2 * 64 + 8 * 24 && mc_muon_work_floats(24, 8) == 2 * 64 + 8 * 24,
        "work floats %lld", (long long)mc_muon_work_floats(8, 24));
  /* without Nesterov the direction may be the momentum itself: M = 0.5 M + 2 g */
  mc_backend *be = mc_backend_cpu();
  float M[3] = {1, 2, 3}, g[3] = {1, -1, 0.5f};
  mc_muon_direction(be, M, g, M, 3, 0.5f, 0, 2.0f);
  CHECK(M[0] == 2.5f && M[1] == -1.0f && M[2] == 2.5f, "M = mu M + gs g in place: %g %g %g", M[0], M[1], M[2]);
  /* with Nesterov the direction may overwrite the gradient: U = gs g + mu M (M as updated) */
  float M2[3] = {1, 2, 3}, g2[3] = {1, -1, 0.5f};
  mc_muon_direction(be, M2, g2, g2, 3, 0.5f, 1, 2.0f);
  CHECK(M2[0] == 2.5f && M2[1] == -1.0f && M2[2] == 2.5f, "M with U = g: %g %g %g", M2[0], M2[1], M2[2]);
  CHECK(g2[0] == 3.25f && g2[1] == -2.5f && g2[2] == 2.25f, "U = gs g + mu M into g: %g %g %g", g2[0], g2[1], g2[2]);
}

/* ------------------------------------------------------------------ TP column blocks */
/* A 10 x 24 weight held as tp = 3 column blocks of 10 x 8 (a tp(1) family): copy_2d gathers
 * them into the whole matrix, the orthogonalization runs on it, copy_2d hands each block back.
 * Blocks and the gathered matrix against the loops of the definition, exactly; the result
 * against NS of the whole. */
static void test_tp_blocks(mc_backend *be) {
  enum { R = 10, C = 24, TP = 3, BC = C / TP };
  float *whole = kc_rand(R * C, 60, 1.0f), *blk[TP], *dB[TP];
  for (int t = 0; t < TP; t++) {
    blk[t] = malloc(R * BC * sizeof(float));
    for (int r = 0; r < R; r++) memcpy(blk[t] + r * BC, whole + r * C + t * BC, BC * sizeof(float));
    dB[t] = up(be, blk[t], R * BC);
  }
  float *dX = be->alloc(be, R * C * sizeof(float)), *work = be->alloc(be, (size_t)mc_muon_work_floats(R, C) * sizeof(float));
  for (int t = 0; t < TP; t++) be->copy_2d(be, dX + t * BC, C, dB[t], BC, BC, R);
  float *gathered = down(be, dX, R * C);
  CHECK(memcmp(gathered, whole, R * C * sizeof(float)) == 0, "%s: copy_2d did not assemble the blocks", be->name);
  mc_muon_orthogonalize(be, dX, R, C, STEPS, work);
  for (int t = 0; t < TP; t++) be->copy_2d(be, dB[t], BC, dX + t * BC, C, BC, R);
  double *ref = ref_ns(whole, R, C, STEPS);
  double err = 0.0, top = 0.0;
  for (int t = 0; t < TP; t++) {
    float *b = down(be, dB[t], R * BC);
    for (int r = 0; r < R; r++)
      for (int j = 0; j < BC; j++) {
        err = fmax(err, fabs((double)b[r * BC + j] - ref[r * C + t * BC + j]));
        top = fmax(top, fabs(ref[r * C + t * BC + j]));
      }
    free(b);
  }
  CHECK(err <= TOL * top, "%s: blocks of the orthogonalized whole, rel %.2e", be->name, err / top);
  printf("  %-4s tp blocks %dx%d as %d x (%dx%d): gathered exactly, rel %.2e\n", be->name, R, C, TP, R, BC, err / top);
  for (int t = 0; t < TP; t++) be->free(be, dB[t]), free(blk[t]);
  be->free(be, dX), be->free(be, work), free(whole), free(gathered), free(ref);
}

static void run_all(mc_backend *be) {
  test_ns(be);
  for (int nesterov = 0; nesterov < 2; nesterov++) {
    test_step(be, 12, 20, nesterov);
    test_step(be, 20, 12, nesterov);
  }
  test_tp_blocks(be);
  CHECK(be->sync(be) == 0, "%s sync: %s", be->name, mc_errmsg());
}

int main(void) {
  test_scalars();
  run_all(mc_backend_cpu());
  printf("cuda:\n");
#ifdef MC_HAVE_CUDA
  if (kc_cuda_usable()) {
    mc_backend *gpu = mc_backend_cuda(0);
    CHECK(gpu != NULL, "cuda backend: %s", mc_errmsg());
    if (gpu) run_all(gpu);
  }
#else
  kc_cuda_usable();
#endif
  return mc_check_exit("test_muon");
}
