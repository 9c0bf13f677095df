/* Matrix products through CBLAS (row-major, OpenBLAS), and their bf16-weight forms. */
#include <cblas.h>
#include <stdlib.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

/* OpenBLAS threads every product above a tiny size; for the small products of small models
 * the thread hand-off costs more than the product (several times more when other processes
 * hold the cores), so products below MC_CPU_PAR_MIN * 4 (16M) multiply-adds run on one thread.
 * Only the calling thread issues products, so switching the global setting is safe. */
static int blas_threads_default = -1, blas_threads_now = -1;

static void blas_threads_for(int64_t work) {
  if (blas_threads_default < 0) blas_threads_default = blas_threads_now = openblas_get_num_threads();
  int want = work < (int64_t)MC_CPU_PAR_MIN * 4 ? 1 : blas_threads_default;
  if (want != blas_threads_now) {
    openblas_set_num_threads(want);
    blas_threads_now = want;
  }
}

static void scale_block(float *C, int M, int N, int ldc, float beta) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) C[(int64_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(int64_t)i * ldc + j];
}

void mc_cpu_gemm(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  (void)be;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* CBLAS rejects K = 0 leading dimensions; the product is empty */
    if (beta != 1.0f) scale_block(C, M, N, ldc, beta);
    return;
  }
  blas_threads_for((int64_t)M * N * K);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void mc_cpu_gemm_strided(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, int64_t sa, const float *B, int ldb, int64_t sb,
                         float beta, float *C, int ldc, int64_t sc, int batch) {
  for (int i = 0; i < batch; i++)
    mc_cpu_gemm(be, ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
}

void mc_cpu_gemm_grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N,
                         const int *K, float alpha, const float *A, const int64_t *a_off, int lda,
                         const float *B, const int64_t *b_off, int ldb, float beta, float *C,
                         const int64_t *c_off, int ldc) {
  for (int g = 0; g < groups; g++)
    mc_cpu_gemm(be, ta, tb, M[g], N[g], K[g], alpha, A + a_off[g], lda, B + b_off[g], ldb, beta,
                C + c_off[g], ldc);
}

/* ---- bf16-stored B: widened (exactly) into a temporary fp32 copy of the elements the
 * product reads, then the fp32 product; so the result is gemm's on the widened weight. */

/* fp32 copy of n elements of B16; NULL (failure recorded) when out of memory. */
static float *widen(const mc_bf16 *B16, int64_t n, const char *op) {
  float *B = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!B) {
    mc_cpu_fail(op);
    return NULL;
  }
#pragma omp parallel for schedule(static) if (n >= MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) B[i] = mc_bf16_to_float(B16[i]);
  return B;
}

void mc_cpu_gemm_bw(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const mc_bf16 *B16, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    mc_cpu_gemm(be, ta, tb, M, N, K, alpha, A, lda, NULL, ldb, beta, C, ldc);
    return;
  }
  const int64_t rows = tb ? N : K, cols = tb ? K : N;
  float *B = widen(B16, (rows - 1) * ldb + cols, "gemm_bw: out of memory widening the bf16 operand");
  if (!B) return;
  mc_cpu_gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  free(B);
}

void mc_cpu_gemm_grouped_bw(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                            float alpha, const float *A, const int64_t *a_off, int lda, const mc_bf16 *B16,
                            const int64_t *b_off, int ldb, float beta, float *C, const int64_t *c_off, int ldc) {
  int64_t span = 0; /* elements from B16 to the end of the last group's operand */
  for (int g = 0; g < groups; g++) {
    if (M[g] <= 0 || N[g] <= 0 || K[g] <= 0) continue;
    const int64_t rows = tb ? N[g] : K[g], cols = tb ? K[g] : N[g], end = b_off[g] + (rows - 1) * ldb + cols;
    span = end > span ? end : span;
  }
  float *B = widen(B16, span, "gemm_grouped_bw: out of memory widening the bf16 operand");
  if (!B) return;
  mc_cpu_gemm_grouped(be, ta, tb, groups, M, N, K, alpha, A, a_off, lda, B, b_off, ldb, beta, C, c_off, ldc);
  free(B);
}

void mc_cpu_to_bf16(mc_backend *be, const float *x, mc_bf16 *y, int64_t n) {
  (void)be;
#pragma omp parallel for schedule(static) if (n >= MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] = mc_bf16_from_float(x[i]);
}
