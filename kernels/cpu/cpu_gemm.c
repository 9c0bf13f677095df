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

/* ---- operands stored in bf16: each widened (exactly) into a temporary fp32 copy of the
 * elements the product reads, then the fp32 product; so the result is gemm's on the widened
 * values. */


/* ---- bf16 results (beta 0 only): the fp32 product goes into a temporary spanning C's
 * elements, then each result block is rounded into C. */

/* Where the fp32 product is written: C.f, or a malloc'd temporary of n elements (*owned set)
 * for a bf16 C; NULL (failure recorded) for a bf16 C with beta != 0 or out of memory. */
static float *result_buf(mc_dst C, float beta, int64_t n, float **owned, const char *op) {
  *owned = NULL;
  if (!C.h) return C.f;
  if (beta != 0.0f) {
    mc_cpu_fail(op); /* the caller's message names the beta rule */
    return NULL;
  }
  float *t = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!t) mc_cpu_fail("gemm (bf16 result): out of memory for the fp32 product");
  return *owned = t;
}

/* Rounds the M x N block at off (row stride ld) of the fp32 product t into h. */
static void narrow_block(const float *t, mc_bf16 *h, int64_t off, int M, int N, int ld) {
#pragma omp parallel for schedule(static) if ((int64_t)M * N >= MC_CPU_PAR_MIN)
  for (int r = 0; r < M; r++)
    for (int c = 0; c < N; c++) h[off + (int64_t)r * ld + c] = mc_bf16_from_float(t[off + (int64_t)r * ld + c]);
}

static int64_t span(int rows, int cols, int ld) { return rows > 0 && cols > 0 ? (int64_t)(rows - 1) * ld + cols : 0; }

void mc_cpu_gemm_ex(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                    mc_operand B, int ldb, float beta, mc_dst C, int ldc) {
  if (M <= 0 || N <= 0) return;
  float *oc;
  float *Cf = result_buf(C, beta, span(M, N, ldc), &oc, "gemm_ex: a bf16 result C needs beta = 0");
  if (!Cf) return;
  if (K <= 0) {
    mc_cpu_gemm(be, ta, tb, M, N, K, alpha, NULL, lda, NULL, ldb, beta, Cf, ldc);
  } else {
    float *oa, *ob;
    const float *Af = mc_cpu_widen(A, span(ta ? K : M, ta ? M : K, lda), &oa, "gemm_ex: out of memory widening A");
    const float *Bf = mc_cpu_widen(B, span(tb ? N : K, tb ? K : N, ldb), &ob, "gemm_ex: out of memory widening B");
    if (Af && Bf) mc_cpu_gemm(be, ta, tb, M, N, K, alpha, Af, lda, Bf, ldb, beta, Cf, ldc);
    free(oa), free(ob);
  }
  if (oc) narrow_block(oc, C.h, 0, M, N, ldc);
  free(oc);
}

void mc_cpu_gemm_grouped_ex(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                            float alpha, mc_operand A, const int64_t *a_off, int lda, mc_operand B,
                            const int64_t *b_off, int ldb, float beta, mc_dst C, const int64_t *c_off, int ldc) {
  int64_t na = 0, nb = 0, nc = 0; /* elements from each base to the end of its last group's block */
  for (int g = 0; g < groups; g++) {
    if (M[g] <= 0 || N[g] <= 0) continue;
    const int64_t ec = c_off[g] + span(M[g], N[g], ldc);
    nc = ec > nc ? ec : nc;
    if (K[g] <= 0) continue;
    const int64_t ea = a_off[g] + span(ta ? K[g] : M[g], ta ? M[g] : K[g], lda);
    const int64_t eb = b_off[g] + span(tb ? N[g] : K[g], tb ? K[g] : N[g], ldb);
    na = ea > na ? ea : na, nb = eb > nb ? eb : nb;
  }
  float *oa, *ob, *oc;
  float *Cf = result_buf(C, beta, nc, &oc, "gemm_grouped_ex: a bf16 result C needs beta = 0");
  if (!Cf) return;
  const float *Af = mc_cpu_widen(A, na, &oa, "gemm_grouped_ex: out of memory widening A");
  const float *Bf = mc_cpu_widen(B, nb, &ob, "gemm_grouped_ex: out of memory widening B");
  if (Af && Bf) {
    mc_cpu_gemm_grouped(be, ta, tb, groups, M, N, K, alpha, Af, a_off, lda, Bf, b_off, ldb, beta, Cf, c_off, ldc);
    for (int g = 0; oc && g < groups; g++)
      if (M[g] > 0 && N[g] > 0) narrow_block(oc, C.h, c_off[g], M[g], N[g], ldc);
  }
  free(oa), free(ob), free(oc);
}

void mc_cpu_to_bf16(mc_backend *be, const float *x, mc_bf16 *y, int64_t n) {
  (void)be;
#pragma omp parallel for schedule(static) if (n >= MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] = mc_bf16_from_float(x[i]);
}
