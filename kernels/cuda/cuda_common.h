/* Shared pieces of the CUDA backend's sources: the private context, the sticky failure
 * record, launch helpers, device math shared with the CPU reference and a deterministic
 * column-sum used by every "add over rows" weight gradient. C++ (nvcc) only. */
#ifndef MC_KERNELS_CUDA_COMMON_H
#define MC_KERNELS_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/backend_env.h"
#include "kernels/ops.h"
#include "util/error.h"
}

typedef struct {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  int failed;         /* a failure was recorded since the last sync */
  char failure[512];  /* the first one */
  void *scratch;      /* op-private temporary memory, grown on demand, stream ordered */
  size_t scratch_bytes;
  double *red;        /* sumsq partial sums (MC_CUDA_RED_BLOCKS + 1 doubles) */
  void *bounce, *bounce_dev; /* MC_CUDA_BOUNCE_BYTES of mapped pinned memory (host, device view): small reads */
  int bf16_gemm;      /* matrix products on bf16 tensor cores (mc_backend_cuda_bf16) */
  void *prof;         /* op profile state (cuda_profile.cu) when MC_CUDA_PROFILE is set */
  struct mc_cuda_lt *lt; /* cuBLASLt handle and algorithm cache (cuda_gemm_lt.cu), made at first use */
  float2 *rope_tab;   /* RoPE (cos, sin) per (position, pair) for rope_T, rope_hd, rope_theta */
  int rope_T, rope_hd;
  double rope_theta;
  /* snapshot copies (cuda_snap.cu): their own stream, made at the first snap_begin */
  cudaStream_t snap_stream;
  cudaEvent_t snap_start, snap_done;
  int snap_ready;     /* stream and events exist */
  int snap_pending;   /* a batch was ended: snap_done is recorded */
} mc_cuda_ctx;

#define MC_CUDA_THREADS 256
#define MC_CUDA_BOUNCE_BYTES ((size_t)64 << 10)
#define MC_CUDA_RED_BLOCKS 1024

static inline mc_cuda_ctx *mc_cu(mc_backend *be) { return (mc_cuda_ctx *)be->ctx; }
static inline cudaStream_t mc_cu_stream(mc_backend *be) { return mc_cu(be)->stream; }

/* Records a failure (the first one since the last sync is kept and reported by sync). */
void mc_cuda_fail(mc_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Checks the last launch; records "<op>: <CUDA error>" on failure. */
void mc_cuda_check(mc_backend *be, const char *op);
/* Temporary device memory of at least `bytes` for the op in progress; NULL (failure
 * recorded) when it cannot be allocated. Valid until the next op that asks for scratch. */
void *mc_cuda_scratch(mc_backend *be, size_t bytes, const char *op);

/* Blocks for a grid-stride loop over n items (capped; the loop covers the rest). */
static inline unsigned mc_cu_grid(int64_t n) {
  int64_t b = (n + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;
  return (unsigned)b;
}

#define MC_CU_FOR(i, n)                                                             \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n); \
       i += (int64_t)gridDim.x * blockDim.x)

/* The table installers, one per op family's source file, cuda_<family>.cu (docs/kernels.md
 * maps every op to its file). */
void mc_cuda_install_snap(mc_backend *be);
void mc_cuda_install_elem(mc_backend *be);
void mc_cuda_install_gemm(mc_backend *be);
void mc_cuda_install_act(mc_backend *be);
void mc_cuda_install_embed(mc_backend *be);
void mc_cuda_install_rmsnorm(mc_backend *be);
void mc_cuda_install_rope(mc_backend *be);
void mc_cuda_install_attn(mc_backend *be);
void mc_cuda_install_conv(mc_backend *be);
void mc_cuda_install_ssm(mc_backend *be);
void mc_cuda_install_rglru(mc_backend *be);
void mc_cuda_install_xent(mc_backend *be);
/* Waits until every large host_alloc block is page-locked (cuda_backend.cu): 0, or -1 with
 * the failure recorded. */
int mc_cuda_pinned_wait(mc_backend *be);
/* Copies bytes <= MC_CUDA_BOUNCE_BYTES of device memory to the host by a kernel writing the
 * bounce buffer (no copy engine: cuda_backend.cu says why), waits for the stream, and returns
 * the bounce buffer (valid until the next call), or NULL with the failure recorded. */
void *mc_cuda_small_to_host(mc_backend *be, const void *src, size_t bytes, const char *op);
/* bf16 <-> fp32 copies on the backend's stream (cuda_gemm.cu): y = x widened exactly, or x
 * rounded to nearest even. */
void mc_cuda_widen(mc_backend *be, const mc_bf16 *x, float *y, int64_t n);
void mc_cuda_round(mc_backend *be, const float *x, mc_bf16 *y, int64_t n);
void mc_cuda_install_moe(mc_backend *be);
/* Wraps every op of the table with GPU timing when MC_CUDA_PROFILE is set (last installer). */
void mc_cuda_install_profile(mc_backend *be);

/* ---- device math: the same formulas as kernels/cpu/cpu.h and cpu_act.c */
static __device__ __forceinline__ float mc_d_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
static __device__ __forceinline__ float mc_d_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
static __device__ __forceinline__ float mc_d_silu(float v) { return v * mc_d_sigmoid(v); }
static __device__ __forceinline__ float mc_d_silu_df(float v) {
  float s = mc_d_sigmoid(v);
  return s * (1.0f + v * (1.0f - s));
}

/* Element i of an op input or output as stored (kernels/ops.h mc_operand, mc_dst): fp32, or
 * bf16 widened on load and rounded to nearest even on store. A gradient output adds into
 * fp32 and is written in bf16 (mc_d_acc; the ops.h conventions). */
static __device__ __forceinline__ float mc_d_ld(mc_operand x, int64_t i) {
  return x.h ? __bfloat162float(((const __nv_bfloat16 *)x.h)[i]) : x.f[i];
}
static __device__ __forceinline__ void mc_d_st(mc_dst y, int64_t i, float v) {
  if (y.h) ((__nv_bfloat16 *)y.h)[i] = __float2bfloat16_rn(v);
  else y.f[i] = v;
}
static __device__ __forceinline__ void mc_d_acc(mc_dst y, int64_t i, float v) {
  if (y.h) ((__nv_bfloat16 *)y.h)[i] = __float2bfloat16_rn(v);
  else y.f[i] += v;
}

static __device__ __forceinline__ float mc_d_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ double mc_d_warp_sumd(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float mc_d_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* ---- column sums: out[col] += sum over rows of f(row, col), accumulated in double in a
 * fixed order (row stripes, then stripes in order), so results do not depend on timing. */
#define MC_COLSUM_STRIPES 8
template <class F>
__global__ void mc_k_colsum_part(F f, int rows, int cols, int rows_per_part, double *part) {
  __shared__ double sh[MC_COLSUM_STRIPES][33];
  int col = blockIdx.x * 32 + threadIdx.x;
  int r0 = blockIdx.y * rows_per_part;
  int r1 = r0 + rows_per_part < rows ? r0 + rows_per_part : rows;
  double s = 0.0;
  if (col < cols)
    for (int r = r0 + threadIdx.y; r < r1; r += MC_COLSUM_STRIPES) s += f(r, col);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double t = 0.0;
    for (int i = 0; i < MC_COLSUM_STRIPES; i++) t += sh[i][threadIdx.x];
    part[(int64_t)blockIdx.y * cols + col] = t;
  }
}

__global__ void mc_k_colsum_finish(const double *part, int parts, int cols, float *out);

template <class F>
void mc_cuda_colsum(mc_backend *be, F f, int rows, int cols, float *out, const char *op) {
  if (rows <= 0 || cols <= 0) return;
  int parts = (rows + 511) / 512;
  if (parts > 128) parts = 128;
  int rpp = (rows + parts - 1) / parts;
  double *part = (double *)mc_cuda_scratch(be, (size_t)parts * cols * sizeof(double), op);
  if (!part) return;
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)parts), block(32, MC_COLSUM_STRIPES);
  mc_k_colsum_part<<<grid, block, 0, mc_cu_stream(be)>>>(f, rows, cols, rpp, part);
  mc_k_colsum_finish<<<mc_cu_grid(cols), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(part, parts, cols, out);
  mc_cuda_check(be, op);
}

#endif
