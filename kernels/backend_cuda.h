/* The CUDA backend of the op interface (kernels/ops.h), fp32, one device and one stream.
 * Built into mc_kernels only where nvcc exists (MC_HAVE_CUDA); the CUDA runtime is linked
 * statically and looks for the driver only when first called, so a program that never asks
 * for the GPU starts and runs on a machine without one. */
#ifndef MC_KERNELS_BACKEND_CUDA_H
#define MC_KERNELS_BACKEND_CUDA_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices: 0 when there is no GPU or no driver (never an error). */
int mc_cuda_device_count(void);

/* The backend on `device` (one process-wide instance per device, never freed): a stream,
 * a cuBLAS handle in fp32 (no TF32) math, and a scratch buffer grown on demand. NULL with
 * mc_error set when no such device or driver exists or its set-up fails. */
mc_backend *mc_backend_cuda(int device);

/* The same device with the matrix products on bf16 tensor cores: gemm, gemm_strided and
 * gemm_grouped round A and B to bf16 (to nearest even) into scratch memory for each call,
 * gemm_ex and gemm_grouped_ex read operands stored in bf16 as they are and round only fp32
 * ones; fp32 accumulation into an fp32 or bf16 C. Attention (attn_fwd, attn_bwd) at head_dim
 * 64 and 128 runs on bf16 tensor cores too: q, k, v, dout (as stored, or rounded) and the
 * probabilities in bf16, fp32 accumulation, softmax statistics, lse and gradients (other head
 * sizes run the fp32 kernels). Every other op computes in fp32 on its inputs as stored. Its
 * table sets bf16_weights, so a network on it keeps its matrix weights and the activations
 * that feed only products, gates, RoPE or attention in bf16. A separate instance
 * (its own stream and cuBLAS handle; one per device, never freed): memory of one instance
 * may be used by the other only after the first's sync(). */
mc_backend *mc_backend_cuda_bf16(int device);

/* The cudaStream_t an instance queues its work on, as an opaque handle: for programs that time
 * ops with CUDA events (tests/kernels/test_cuda_attn_tc.c). */
void *mc_cuda_stream_handle(mc_backend *be);

#ifdef __cplusplus
}
#endif

#endif
