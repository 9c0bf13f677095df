/* Whole-tensor elementwise ops, the double-precision sum of squares, fused AdamW, bias and
 * activations: the formulas of kernels/cpu/cpu_backend.c and cpu_act.c, one thread per
 * element (grid-stride). */
#include "kernels/cuda/cuda_common.h"

__global__ void k_fill(float *x, int64_t n, float v) { MC_CU_FOR(i, n) x[i] = v; }
__global__ void k_scale(float *x, int64_t n, float a) { MC_CU_FOR(i, n) x[i] *= a; }
__global__ void k_axpy(float *y, const float *x, int64_t n, float a) { MC_CU_FOR(i, n) y[i] += a * x[i]; }

static void cu_fill(mc_backend *be, float *x, int64_t n, float value) {
  if (n <= 0) return;
  k_fill<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, n, value);
  mc_cuda_check(be, "fill");
}

static void cu_copy(mc_backend *be, float *dst, const float *src, int64_t n) {
  if (n <= 0) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, mc_cu_stream(be));
  if (e != cudaSuccess) mc_cuda_fail(be, "copy of %lld floats: %s", (long long)n, cudaGetErrorString(e));
}

static void cu_scale(mc_backend *be, float *x, int64_t n, float alpha) {
  if (n <= 0) return;
  k_scale<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, n, alpha);
  mc_cuda_check(be, "scale");
}

static void cu_axpy(mc_backend *be, float *y, const float *x, int64_t n, float alpha) {
  if (n <= 0) return;
  k_axpy<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(y, x, n, alpha);
  mc_cuda_check(be, "axpy");
}

/* ---- sum of squares: fixed grid, per-block double partials, one final block; the order of
 * additions depends only on n, so repeated calls give identical results. */
__device__ double block_sumd(double v) {
  __shared__ double sh[MC_CUDA_THREADS / 32];
  v = mc_d_warp_sumd(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x / 32) ? sh[l] : 0.0;
  if (w == 0) v = mc_d_warp_sumd(v);
  return v;
}

__global__ void k_sumsq_part(const float *x, int64_t n, double *part) {
  double s = 0.0;
  MC_CU_FOR(i, n) s += (double)x[i] * x[i];
  s = block_sumd(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_final(const double *part, int np, double *out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < np; i += blockDim.x) s += part[i];
  s = block_sumd(s);
  if (threadIdx.x == 0) *out = s;
}

static double cu_sumsq(mc_backend *be, const float *x, int64_t n) {
  if (n <= 0) return 0.0;
  mc_cuda_ctx *c = mc_cu(be);
  unsigned nb = mc_cu_grid(n);
  if (nb > MC_CUDA_RED_BLOCKS) nb = MC_CUDA_RED_BLOCKS;
  k_sumsq_part<<<nb, MC_CUDA_THREADS, 0, c->stream>>>(x, n, c->red);
  k_sum_final<<<1, MC_CUDA_THREADS, 0, c->stream>>>(c->red, (int)nb, c->red + MC_CUDA_RED_BLOCKS);
  mc_cuda_check(be, "sumsq");
  double s = NAN;
  cudaError_t e = cudaMemcpyAsync(&s, c->red + MC_CUDA_RED_BLOCKS, sizeof s, cudaMemcpyDeviceToHost, c->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    mc_cuda_fail(be, "sumsq: %s", cudaGetErrorString(e));
    return NAN;
  }
  return s;
}

__global__ void k_adamw(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                        float eps, float decay, float bc1, float bc2, float gs) {
  MC_CU_FOR(i, n) {
    float gi = g[i] * gs;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    w[i] = w[i] * decay - lr * mhat / (sqrtf(vhat) + eps);
  }
}

static void cu_adamw(mc_backend *be, float *w, const float *g, float *m, float *v, int64_t n,
                     const mc_adamw_args *a) {
  if (n <= 0) return;
  /* the bias corrections in double on the host, exactly as the CPU backend does */
  const float bc1 = (float)(1.0 - pow(a->beta1, (double)a->step));
  const float bc2 = (float)(1.0 - pow(a->beta2, (double)a->step));
  const float decay = 1.0f - a->lr * a->weight_decay;
  k_adamw<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(w, g, m, v, n, a->lr, a->beta1, a->beta2, a->eps,
                                                                   decay, bc1, bc2, a->grad_scale);
  mc_cuda_check(be, "adamw");
}

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
  case MC_ACT_SILU: return v * mc_d_sigmoid(v);
  case MC_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  case MC_ACT_SIGMOID: return mc_d_sigmoid(v);
  case MC_ACT_SOFTPLUS: return mc_d_softplus(v);
  }
  return v;
}

static __device__ __forceinline__ float act_df(int act, float v) {
  switch (act) {
  case MC_ACT_SILU: {
    float s = mc_d_sigmoid(v);
    return s * (1.0f + v * (1.0f - s));
  }
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
__global__ void k_glu_fwd(int act, const float *a, const float *b, float *y, int64_t n) {
  MC_CU_FOR(i, n) y[i] = act_f(act, a[i]) * b[i];
}
__global__ void k_glu_bwd(int act, const float *a, const float *b, const float *dy, float *da, float *db, int64_t n) {
  MC_CU_FOR(i, n) {
    da[i] += dy[i] * b[i] * act_df(act, a[i]);
    db[i] += dy[i] * act_f(act, a[i]);
  }
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

static void cu_glu_fwd(mc_backend *be, mc_act act, const float *a, const float *b, float *y, int64_t n) {
  if (n <= 0) return;
  k_glu_fwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, a, b, y, n);
  mc_cuda_check(be, "glu_fwd");
}

static void cu_glu_bwd(mc_backend *be, mc_act act, const float *a, const float *b, const float *dy, float *da,
                       float *db, int64_t n) {
  if (n <= 0) return;
  k_glu_bwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((int)act, a, b, dy, da, db, n);
  mc_cuda_check(be, "glu_bwd");
}

void mc_cuda_install_elem(mc_backend *be) {
  be->fill = cu_fill;
  be->copy = cu_copy;
  be->scale = cu_scale;
  be->axpy = cu_axpy;
  be->sumsq = cu_sumsq;
  be->adamw = cu_adamw;
  be->bias_fwd = cu_bias_fwd;
  be->bias_bwd = cu_bias_bwd;
  be->act_fwd = cu_act_fwd;
  be->act_bwd = cu_act_bwd;
  be->glu_fwd = cu_glu_fwd;
  be->glu_bwd = cu_glu_bwd;
}
