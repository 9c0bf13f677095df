/* Bias, pointwise activations and gated units (kernels/ops.h bias_fwd .. glu_bwd): the
 * formulas of kernels/cpu/cpu_act.c, one thread per element (grid-stride); the bias gradient is
 * a deterministic column sum. */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.h"

/* ---- bias and activations */
__global__ void k_bias_fwd(float *y, const float *b, int64_t n, int c) { MC_CU_FOR(i, n) y[i] += b[i % c]; }

struct col_of {
  const float *dy;
  int c;
  __device__ double operator()(int r, int j) const { return dy[(int64_t)r * c + j]; }
};

static void cu_bias_fwd(mc_backend *be, float *y, const float *b, int n, int c) {
  int64_t total = (int64_t)n * c;
  if (total <= 0) return;
  k_bias_fwd<<<mc_cu_grid(total), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(y, b, total, c);
  mc_cuda_check(be, "bias_fwd");
}

static void cu_bias_bwd(mc_backend *be, const float *dy, int n, int c, float *db) {
  mc_cuda_colsum(be, col_of{dy, c}, n, c, db, "bias_bwd");
}

static __device__ __forceinline__ float act_f(int act, float v) {
  switch (act) {
  case MC_ACT_SILU: return mc_d_silu(v);
  case MC_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  case MC_ACT_SIGMOID: return mc_d_sigmoid(v);
  case MC_ACT_SOFTPLUS: return mc_d_softplus(v);
  }
  return v;
}

static __device__ __forceinline__ float act_df(int act, float v) {
  switch (act) {
  case MC_ACT_SILU: return mc_d_silu_df(v);
  case MC_ACT_GELU:
    return 0.5f * (1.0f + erff(v * 0.70710678118654752f)) + v * 0.39894228040143268f * expf(-0.5f * v * v);
  case MC_ACT_SIGMOID: {
    float s = mc_d_sigmoid(v);
    return s * (1.0f - s);
  }
  case MC_ACT_SOFTPLUS: return mc_d_sigmoid(v);
  }
  return 1.0f;
}

__global__ void k_act_fwd(int act, const float *x, float *y, int64_t n) { MC_CU_FOR(i, n) y[i] = act_f(act, x[i]); }
__global__ void k_act_bwd(int act, const float *x, const float *dy, float *dx, int64_t n) {
  MC_CU_FOR(i, n) dx[i] += dy[i] * act_df(act, x[i]);
}
/* Gated units on operands as stored. The all-bf16 SiLU form (SwiGLU under train.dtype=bf16,
 * the largest elementwise tensors of a step) moves 8 elements per 16-byte access; every other
 * combination runs the per-element form. */
__global__ void k_glu_fwd(int act, mc_operand a, mc_operand b, mc_dst y, int64_t n) {
  MC_CU_FOR(i, n) mc_d_st(y, i, act_f(act, mc_d_ld(a, i)) * mc_d_ld(b, i));
}
__global__ void k_glu_bwd(int act, mc_operand a, mc_operand b, mc_operand dy, mc_dst da, mc_dst db, int64_t n) {
  MC_CU_FOR(i, n) {
    const float av = mc_d_ld(a, i), g = mc_d_ld(dy, i);
    mc_d_acc(da, i, g * mc_d_ld(b, i) * act_df(act, av));
    mc_d_acc(db, i, g * act_f(act, av));
  }
}

typedef union {
  uint4 u;
  __nv_bfloat162 h[4];
} bf16x8;

__global__ void k_swiglu_fwd16(const uint4 *a, const uint4 *b, uint4 *y, int64_t n8) {
  MC_CU_FOR(i, n8) {
    bf16x8 av, bv, out;
    av.u = a[i], bv.u = b[i];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 fa = __bfloat1622float2(av.h[j]), fb = __bfloat1622float2(bv.h[j]);
      out.h[j] = __floats2bfloat162_rn(act_f(MC_ACT_SILU, fa.x) * fb.x, act_f(MC_ACT_SILU, fa.y) * fb.y);
    }
    y[i] = out.u;
  }
}

__global__ void k_swiglu_bwd16(const uint4 *a, const uint4 *b, const uint4 *dy, uint4 *da, uint4 *db, int64_t n8) {
  MC_CU_FOR(i, n8) {
    bf16x8 av, bv, gv, oa, ob;
    av.u = a[i], bv.u = b[i], gv.u = dy[i];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 fa = __bfloat1622float2(av.h[j]), fb = __bfloat1622float2(bv.h[j]), g = __bfloat1622float2(gv.h[j]);
      oa.h[j] = __floats2bfloat162_rn(g.x * fb.x * act_df(MC_ACT_SILU, fa.x), g.y * fb.y * act_df(MC_ACT_SILU, fa.y));
      ob.h[j] = __floats2bfloat162_rn(g.x * act_f(MC_ACT_SILU, fa.x), g.y * act_f(MC_ACT_SILU, fa.y));
    }
    da[i] = oa.u, db[i] = ob.u;
  }
}

/* Whether the vectorised all-bf16 SiLU form applies: n a multiple of 8 and every tensor
 * 16-byte aligned. */
static bool swiglu16(mc_act act, int64_t n, const void *const *p, int np) {
  if (act != MC_ACT_SILU || n % 8) return false;
  for (int i = 0; i < np; i++)
    if (!p[i] || ((uintptr_t)p[i] & 15)) return false;
  return true;
}

static void cu_act_fwd(mc_backend *be, mc_act act, const float *x, float *y, int64_t n) {
  if (n <= 0) return;
  k_act_fwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, x, y, n);
  mc_cuda_check(be, "act_fwd");
}

static void cu_act_bwd(mc_backend *be, mc_act act, const float *x, const float *dy, float *dx, int64_t n) {
  if (n <= 0) return;
  k_act_bwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, x, dy, dx, n);
  mc_cuda_check(be, "act_bwd");
}

static void cu_glu_fwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_dst y, int64_t n) {
  if (n <= 0) return;
  const void *p[3] = {a.h, b.h, y.h};
  if (swiglu16(act, n, p, 3))
    k_swiglu_fwd16<<<mc_cu_grid(n / 8), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((const uint4 *)a.h, (const uint4 *)b.h,
                                                                               (uint4 *)y.h, n / 8);
  else k_glu_fwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, a, b, y, n);
  mc_cuda_check(be, "glu_fwd");
}

static void cu_glu_bwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_operand dy, mc_dst da, mc_dst db,
                       int64_t n) {
  if (n <= 0) return;
  const void *p[5] = {a.h, b.h, dy.h, da.h, db.h};
  if (swiglu16(act, n, p, 5))
    k_swiglu_bwd16<<<mc_cu_grid(n / 8), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(
        (const uint4 *)a.h, (const uint4 *)b.h, (const uint4 *)dy.h, (uint4 *)da.h, (uint4 *)db.h, n / 8);
  else k_glu_bwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, a, b, dy, da, db, n);
  mc_cuda_check(be, "glu_bwd");
}

void mc_cuda_install_act(mc_backend *be) {
  be->bias_fwd = cu_bias_fwd;
  be->bias_bwd = cu_bias_bwd;
  be->act_fwd = cu_act_fwd;
  be->act_bwd = cu_act_bwd;
  be->glu_fwd = cu_glu_fwd;
  be->glu_bwd = cu_glu_bwd;
}
