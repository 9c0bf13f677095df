/* Helpers shared by the row ops' vector paths (cuda_rmsnorm.cu, cuda_rope.cu, cuda_xent.cu):
 * pointer alignment tests and the 4-wide store of an op output as stored (mc_dst), also used by
 * cuda_moe.cu's row kernels. C++ (nvcc)
 * only. */
#ifndef MC_KERNELS_CUDA_VEC_H
#define MC_KERNELS_CUDA_VEC_H

#include "kernels/cuda/cuda_common.h"

static int aligned(const void *p, unsigned bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }
static int dst_aligned(mc_dst y) { return y.h ? aligned(y.h, 8) : aligned(y.f, 16); }

/* y[i..i+3] (i a multiple of 4) as stored: one 16-byte or 8-byte store. */
static __device__ __forceinline__ void st4(mc_dst y, int64_t i, float4 v) {
  if (y.h) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(y.h + i) = u;
  } else {
    *reinterpret_cast<float4 *>(y.f + i) = v;
  }
}

#endif
