/* Matrix products through cuBLAS in fp32, or on bf16 tensor cores for the bf16-products
 * instance (mc_backend_cuda_bf16: operands rounded to bf16, fp32 accumulation and output).
 * The interface is row-major; cuBLAS is column-major, and a row-major C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T, so every call swaps the operands (and M with N) and
 * keeps the leading dimensions. */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.h"

/* C = beta * C on an M x N block (K == 0: the product is empty). */
__global__ void k_scale_block(float *C, int M, int N, int ldc, float beta) {
  MC_CU_FOR(i, (int64_t)M * N) {
    float *c = C + (i / N) * ldc + i % N;
    *c = beta == 0.0f ? 0.0f : beta * *c;
  }
}

static void scale_block(mc_backend *be, float *C, int M, int N, int ldc, float beta) {
  if (beta == 1.0f) return;
  k_scale_block<<<mc_cu_grid((int64_t)M * N), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(C, M, N, ldc, beta);
  mc_cuda_check(be, "gemm (empty product)");
}

__global__ void k_to_bf16(const float *x, __nv_bfloat16 *y, int64_t n) {
  MC_CU_FOR(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

/* Elements an operand of `batch` matrices (rows x cols, row stride ld, matrix stride st)
 * spans from its first element to its last. */
static int64_t span(int rows, int cols, int ld, int64_t st, int batch) {
  return (int64_t)(batch - 1) * st + (int64_t)(rows - 1) * ld + cols;
}

/* bf16 copies of both operands in scratch, same layout; NULL on failure (recorded). */
static __nv_bfloat16 *operands_bf16(mc_backend *be, const float *A, int64_t na, const float *B, int64_t nb,
                                    __nv_bfloat16 **Bh, const char *op) {
  int64_t na_pad = (na + 127) / 128 * 128; /* keep B's copy 256-byte aligned */
  __nv_bfloat16 *Ah = (__nv_bfloat16 *)mc_cuda_scratch(be, (size_t)(na_pad + nb) * sizeof(__nv_bfloat16), op);
  if (!Ah) return NULL;
  *Bh = Ah + na_pad;
  k_to_bf16<<<mc_cu_grid(na), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(A, Ah, na);
  k_to_bf16<<<mc_cu_grid(nb), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(B, *Bh, nb);
  mc_cuda_check(be, op);
  return Ah;
}

/* The bf16 product of gemm_strided's arguments (batch 1 for gemm). */
static void gemm_bf16(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      int64_t sa, const float *B, int ldb, int64_t sb, float beta, float *C, int ldc, int64_t sc,
                      int batch) {
  __nv_bfloat16 *Bh;
  __nv_bfloat16 *Ah = operands_bf16(be, A, span(ta ? K : M, ta ? M : K, lda, sa, batch), B,
                                    span(tb ? N : K, tb ? K : N, ldb, sb, batch), &Bh, "gemm (bf16)");
  if (!Ah) return;
  cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t st =
      batch == 1 ? cublasGemmEx(mc_cu(be)->blas, opb, opa, N, M, K, &alpha, Bh, CUDA_R_16BF, ldb, Ah, CUDA_R_16BF, lda,
                                &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                 : cublasGemmStridedBatchedEx(mc_cu(be)->blas, opb, opa, N, M, K, &alpha, Bh, CUDA_R_16BF, ldb, sb, Ah,
                                              CUDA_R_16BF, lda, sa, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm (bf16) M=%d N=%d K=%d batch=%d lda=%d ldb=%d ldc=%d: cuBLAS %s", M, N, K, batch, lda, ldb,
                 ldc, cublasGetStatusString(st));
}

static void cu_gemm(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_block(be, C, M, N, ldc, beta);
    return;
  }
  if (mc_cu(be)->bf16_gemm) {
    gemm_bf16(be, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
    return;
  }
  cublasStatus_t st = cublasSgemm(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                  M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm M=%d N=%d K=%d lda=%d ldb=%d ldc=%d: cuBLAS %s", M, N, K, lda, ldb, ldc,
                 cublasGetStatusString(st));
}

static void cu_gemm_strided(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                            int64_t sa, const float *B, int ldb, int64_t sb, float beta, float *C, int ldc, int64_t sc,
                            int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < batch; i++) scale_block(be, C + i * sc, M, N, ldc, beta);
    return;
  }
  if (mc_cu(be)->bf16_gemm) {
    gemm_bf16(be, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
    return;
  }
  cublasStatus_t st = cublasSgemmStridedBatched(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, sb, A, lda, sa,
                                                &beta, C, ldc, sc, batch);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm_strided M=%d N=%d K=%d batch=%d: cuBLAS %s", M, N, K, batch, cublasGetStatusString(st));
}

/* One cuBLAS call per non-empty group: fp32 expert products are large enough per expert
 * that launch cost is minor; a batched bf16 path is future work (docs/cuda.md). */
static void cu_gemm_grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                            float alpha, const float *A, const int64_t *a_off, int lda, const float *B,
                            const int64_t *b_off, int ldb, float beta, float *C, const int64_t *c_off, int ldc) {
  for (int g = 0; g < groups; g++)
    cu_gemm(be, ta, tb, M[g], N[g], K[g], alpha, A + a_off[g], lda, B + b_off[g], ldb, beta, C + c_off[g], ldc);
}

void mc_cuda_install_gemm(mc_backend *be) {
  be->gemm = cu_gemm;
  be->gemm_strided = cu_gemm_strided;
  be->gemm_grouped = cu_gemm_grouped;
}
