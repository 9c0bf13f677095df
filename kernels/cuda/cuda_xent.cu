/* The vocab-masked cross-entropy (kernels/ops.h xent_fwd, xent_bwd; formulas as in
 * kernels/cpu/cpu_xent.c). The log-sum-exp along a row runs in double like the CPU reference.
 * A vector path (float4 loads, taken when widths are multiples of 4 and buffers aligned) and a
 * scalar one for the rest; no atomics, so results are the same bits run to run. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_vec.h"

/* ---- cross-entropy: one block per row (running max, sum of exponentials in double) */
__device__ float block_maxf(float v, float *sh) {
  v = mc_d_warp_max(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < (int)(blockDim.x / 32); i++) v = fmaxf(v, sh[i]);
  return v;
}

__device__ double block_sumd_rows(double v, double *sh) {
  v = mc_d_warp_sumd(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = 0.0;
  for (int i = 0; i < (int)(blockDim.x / 32); i++) v += sh[i];
  return v;
}

/* Folds one logit into a thread's running (max m, sum s of exp(v - m)): the exponential in
 * fp32 (expf, as xent_bwd), the sum and the rare rescale when the max grows in double. Logits
 * at -inf add nothing, even before a finite one is seen. */
static __device__ __forceinline__ void lse_fold(float v, float &m, double &s) {
  if (v > m) {
    s = m == -INFINITY ? 0.0 : s * exp((double)m - v);
    m = v;
  }
  if (m != -INFINITY) s += (double)expf(v - m);
}

static __device__ __forceinline__ void lse_fold4(float4 v, float &m, double &s) {
  const float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
  if (mx > m) {
    s = m == -INFINITY ? 0.0 : s * exp((double)m - mx);
    m = mx;
  }
  if (m != -INFINITY) {
    s += (double)expf(v.x - m);
    s += (double)expf(v.y - m);
    s += (double)expf(v.z - m);
    s += (double)expf(v.w - m);
  }
}

/* Rows along y, columns along x: no 64-bit division per element. */
__global__ void k_xent_bwd(const float *logits, const int32_t *target, const float *lse, int n, int V, int Vp,
                           float scale, mc_dst dlogits) {
  for (int r = blockIdx.y; r < n; r += gridDim.y) {
    const float *lr = logits + (int64_t)r * Vp;
    const int64_t o = (int64_t)r * Vp;
    const float l = lse[r];
    const int t = target[r];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < Vp; c += gridDim.x * blockDim.x) {
      float g = 0.0f;
      if (c < V) {
        g = scale * expf(lr[c] - l);
        if (c == t) g -= scale;
      }
      mc_d_st(dlogits, o + c, g);
    }
  }
}

/* One pass over the row: each thread keeps a running max and the sum of exponentials
 * relative to it (lse_fold), then the block combines the pairs; the row is read once instead
 * of twice. With vec (Vp % 4 == 0, 16-byte aligned logits) the columns below V / 4 * 4 come
 * in float4s, four in flight per thread, and the rest one by one. */
__global__ void k_xent_fwd(const float *logits, const int32_t *target, int n, int V, int Vp, int vec, float *loss,
                           float *lse) {
  __shared__ float shf[MC_CUDA_THREADS / 32];
  __shared__ double shd[MC_CUDA_THREADS / 32];
  const int V4 = vec ? V / 4 : 0, B = blockDim.x;
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *lr = logits + (int64_t)r * Vp;
    const float4 *l4 = reinterpret_cast<const float4 *>(lr);
    float m = -INFINITY;
    double s = 0.0;
    int c = threadIdx.x;
    for (; c + 3 * B < V4; c += 4 * B) {
      const float4 a = __ldcs(l4 + c), b = __ldcs(l4 + c + B), e = __ldcs(l4 + c + 2 * B), f = __ldcs(l4 + c + 3 * B);
      lse_fold4(a, m, s);
      lse_fold4(b, m, s);
      lse_fold4(e, m, s);
      lse_fold4(f, m, s);
    }
    for (; c < V4; c += B) lse_fold4(__ldcs(l4 + c), m, s);
    for (int j = 4 * V4 + threadIdx.x; j < V; j += B) lse_fold(lr[j], m, s);
    const float mb = block_maxf(m, shf);
    s = m == -INFINITY ? 0.0 : s * exp((double)m - mb);
    s = block_sumd_rows(s, shd);
    if (threadIdx.x == 0) {
      double l = mb + log(s);
      lse[r] = (float)l;
      loss[r] = (float)(l - lr[target[r]]);
    }
  }
}

/* dlogits of four columns j..j+3 of a row with lse l and target t. */
static __device__ __forceinline__ float4 xent_grad4(float4 v, int j, int V, int t, float l, float scale) {
  const float a[4] = {v.x, v.y, v.z, v.w};
  float g[4];
#pragma unroll
  for (int e = 0; e < 4; e++) {
    g[e] = 0.0f;
    if (j + e < V) {
      g[e] = scale * expf(a[e] - l);
      if (j + e == t) g[e] -= scale;
    }
  }
  return make_float4(g[0], g[1], g[2], g[3]);
}

/* The vector path of k_xent_bwd (Vp % 4 == 0, logits 16-byte and dlogits 16- or 8-byte
 * aligned): four columns per thread, two float4 loads in flight. */
__global__ void k_xent_bwd4(const float *logits, const int32_t *target, const float *lse, int n, int V, int Vp,
                            float scale, mc_dst dlogits) {
  const int C = Vp / 4, S = gridDim.x * blockDim.x;
  for (int r = blockIdx.y; r < n; r += gridDim.y) {
    const float4 *l4 = reinterpret_cast<const float4 *>(logits + (int64_t)r * Vp);
    const int64_t o = (int64_t)r * Vp;
    const float l = lse[r];
    const int t = target[r];
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    for (; c + S < C; c += 2 * S) {
      const float4 u = __ldcs(l4 + c), v = __ldcs(l4 + c + S);
      st4(dlogits, o + 4 * c, xent_grad4(u, 4 * c, V, t, l, scale));
      st4(dlogits, o + 4 * (c + S), xent_grad4(v, 4 * (c + S), V, t, l, scale));
    }
    if (c < C) st4(dlogits, o + 4 * c, xent_grad4(__ldcs(l4 + c), 4 * c, V, t, l, scale));
  }
}

static void cu_xent_fwd(mc_backend *be, const float *logits, const int32_t *target, int n, int V, int Vp, float *loss,
                        float *lse) {
  if (n <= 0) return;
  const unsigned grid = (unsigned)(n < 65535 ? n : 65535);
  const int vec = Vp % 4 == 0 && aligned(logits, 16);
  k_xent_fwd<<<grid, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(logits, target, n, V, Vp, vec, loss, lse);
  mc_cuda_check(be, "xent_fwd");
}

static void cu_xent_bwd(mc_backend *be, const float *logits, const int32_t *target, const float *lse, int n, int V,
                        int Vp, float scale, mc_dst dlogits) {
  if ((int64_t)n * Vp <= 0) return;
  const int vec = Vp % 4 == 0 && aligned(logits, 16) && dst_aligned(dlogits);
  const int per = vec ? 2 * MC_CUDA_THREADS : MC_CUDA_THREADS; /* columns (float4s) per block */
  const int cols = vec ? Vp / 4 : Vp, blocks = (cols + per - 1) / per;
  const dim3 grid((unsigned)(blocks < 64 ? blocks : 64), (unsigned)(n < 65535 ? n : 65535));
  if (vec)
    k_xent_bwd4<<<grid, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(logits, target, lse, n, V, Vp, scale, dlogits);
  else
    k_xent_bwd<<<grid, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(logits, target, lse, n, V, Vp, scale, dlogits);
  mc_cuda_check(be, "xent_bwd");
}

void mc_cuda_install_xent(mc_backend *be) {
  be->xent_fwd = cu_xent_fwd;
  be->xent_bwd = cu_xent_bwd;
}
