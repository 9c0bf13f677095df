/* bf16 products through cuBLASLt with the algorithm cached per shape class (cuda_gemm_lt.cu
 * says why). C++ (nvcc) only. */
#ifndef MC_KERNELS_CUDA_GEMM_LT_H
#define MC_KERNELS_CUDA_GEMM_LT_H

#include "kernels/cuda/cuda_common.h"

/* C = alpha op(A) op(B) + beta C in cuBLAS's column-major convention (the arguments of
 * cublasGemmEx): A and B bf16, fp32 accumulation, C of type ctype (CUDA_R_32F or
 * CUDA_R_16BF), queued on lane `lane` (0: the backend's stream; 1.. only between
 * mc_cuda_lt_fork and mc_cuda_lt_join, below that count; other values mean 0). 0, or -1
 * when the path is off (MC_CUDA_LT=0) or cuBLASLt cannot run it: nothing was queued, the
 * caller runs cublasGemmEx instead (on the backend's stream). */
int mc_cuda_lt_gemm_bf16(mc_backend *be, int lane, cublasOperation_t opa, cublasOperation_t opb, int m, int n,
                         int k, float alpha, const void *A, int lda, const void *B, int ldb, float beta, void *C,
                         cudaDataType_t ctype, int ldc);

/* Opens the side lanes for products that may run side by side: they start after everything
 * queued so far on the backend's stream. Returns the lanes to spread them over (1: only the
 * backend's stream). Every fork is closed by mc_cuda_lt_join with that count, which orders
 * the backend's stream after the lanes' products. */
int mc_cuda_lt_fork(mc_backend *be);
void mc_cuda_lt_join(mc_backend *be, int lanes);

#endif
