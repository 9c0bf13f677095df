/* Matrix products through CBLAS (row-major, OpenBLAS). */
#include <cblas.h>

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
