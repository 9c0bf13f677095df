/* Muon's math composed from backend ops (gemm, scale, axpy, copy, sumsq, to_bf16): nothing here
 * touches a tensor's memory directly, so CUDA runs it unchanged. */
#include "train/muon.h"

#include <math.h>

#include "core/holdings.h"

/* The quintic's coefficients (Keller Jordan's Muon): chosen to push every singular value in
 * (0, 1] towards 1 as fast as possible, not to converge exactly; after a few steps they lie in
 * about [0.7, 1.2], which is all Muon needs. */
#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

/* Gram matrix A and polynomial B (small x small each), then a copy of X to read from while
 * the product writes X: the holdings' figure, which the trainer's scratch is sized by. */
int64_t mc_muon_work_floats(int rows, int cols) { return mc_muon_ns_work_floats(rows, cols); }

void mc_muon_orthogonalize(mc_backend *be, float *X, int rows, int cols, int steps, float *work) {
  if (rows <= 0 || cols <= 0) return;
  const int wide = rows <= cols;
  const int m = wide ? rows : cols, n = wide ? cols : rows;
  const int64_t mm = (int64_t)m * m, size = (int64_t)m * n;
  float *A = work, *B = work + mm, *Y = work + 2 * mm;
  be->scale(be, X, size, (float)(1.0 / (sqrt(be->sumsq(be, X, size)) + 1e-7)));
  for (int s = 0; s < steps; s++) {
    /* A = X X^T (wide: X is m x n) or X^T X (tall: X is n x m); both m x m */
    if (wide)
      be->gemm(be, 0, 1, m, m, n, 1.0f, X, n, X, n, 0.0f, A, m);
    else
      be->gemm(be, 1, 0, m, m, n, 1.0f, X, m, X, m, 0.0f, A, m);
    be->gemm(be, 0, 0, m, m, m, NS_C, A, m, A, m, 0.0f, B, m);
    be->axpy(be, B, A, mm, NS_B);
    /* a gemm's output must not alias its inputs: the product reads the copy Y and adds a X
     * through beta */
    be->copy(be, Y, X, size);
    if (wide)
      be->gemm(be, 0, 0, m, n, m, 1.0f, B, m, Y, n, NS_A, X, n); /* X = a X + B X */
    else
      be->gemm(be, 0, 0, n, m, m, 1.0f, Y, m, B, m, NS_A, X, m); /* X = a X + X B */
  }
}

double mc_muon_scale(int rows, int cols) { return 0.2 * sqrt((double)(rows > cols ? rows : cols)); }

void mc_muon_direction(mc_backend *be, float *M, const float *g, float *U, int64_t n, float mu, int nesterov,
                       float gs) {
  be->scale(be, M, n, mu);
  be->axpy(be, M, g, n, gs);
  if (nesterov) { /* U = gs g + mu M, built on g so that U may be the gradient buffer itself */
    if (U != g) be->copy(be, U, g, n);
    be->scale(be, U, n, gs);
    be->axpy(be, U, M, n, mu);
  } else if (U != M) {
    be->copy(be, U, M, n);
  }
}

void mc_muon_apply(mc_backend *be, float *W, const float *O, int64_t n, float lr, float wd, float scale,
                   mc_bf16 *w_bf16) {
  be->scale(be, W, n, (float)(1.0 - (double)lr * wd));
  be->axpy(be, W, O, n, (float)(-(double)lr * scale));
  if (w_bf16) be->to_bf16(be, W, w_bf16, n);
}
