/* bf16 products through cuBLASLt with the algorithm cached per shape class (cuda_gemm_lt.cu
 * says why). C++ (nvcc) only. */
#ifndef MC_KERNELS_CUDA_GEMM_LT_H
#define MC_KERNELS_CUDA_GEMM_LT_H

#include "kernels/cuda/cuda_common.h"

/* C = alpha op(A) op(B) + beta C in cuBLAS's column-major convention (the arguments of
 * cublasGemmEx): A and B bf16, fp32 accumulation, C of type ctype (CUDA_R_32F or
 * CUDA_R_16BF), queued on the backend's stream. 0, or -1 when the path is off
 * (MC_CUDA_LT=0) or cuBLASLt cannot run it: nothing was queued, the caller runs
 * cublasGemmEx instead. */
int mc_cuda_lt_gemm_bf16(mc_backend *be, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                         float alpha, const void *A, int lda, const void *B, int ldb, float beta, void *C,
                         cudaDataType_t ctype, int ldc);

#endif
