/* Row-wise ops: embedding gather/scatter, grouped RMSNorm, RoPE and the vocab-masked
 * cross-entropy. Reductions along a row run in double like the CPU reference; one warp (or
 * one block for the long vocabulary rows) per row. */
#include "kernels/cuda/cuda_common.h"

/* ---- embedding */
__global__ void k_embed_fwd(const int32_t *tok, int n, int d, const float *W, float *y) {
  MC_CU_FOR(i, (int64_t)n * d) y[i] = W[(int64_t)tok[i / d] * d + i % d];
}

/* Rows may repeat, so the scatter adds atomically (the order of the additions varies). */
__global__ void k_embed_bwd(const int32_t *tok, int n, int d, const float *dy, float *dW) {
  MC_CU_FOR(i, (int64_t)n * d) atomicAdd(&dW[(int64_t)tok[i / d] * d + i % d], dy[i]);
}

static void cu_embed_fwd(mc_backend *be, const int32_t *tok, int n, int d, const float *W, float *y) {
  if ((int64_t)n * d <= 0) return;
  k_embed_fwd<<<mc_cu_grid((int64_t)n * d), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(tok, n, d, W, y);
  mc_cuda_check(be, "embed_fwd");
}

static void cu_embed_bwd(mc_backend *be, const int32_t *tok, int n, int d, const float *dy, float *dW) {
  if ((int64_t)n * d <= 0) return;
  k_embed_bwd<<<mc_cu_grid((int64_t)n * d), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(tok, n, d, dy, dW);
  mc_cuda_check(be, "embed_bwd");
}

/* ---- RMSNorm: one warp per (row, group) */
#define WARPS_PER_BLOCK (MC_CUDA_THREADS / 32)

static unsigned warp_grid(int64_t items) {
  int64_t b = (items + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
  return (unsigned)(b < 1 ? 1 : b > (1 << 20) ? (1 << 20) : b);
}

#define MC_WARP_FOR(it, items)                                                                        \
  for (int64_t it = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; it < (int64_t)(items); \
       it += (int64_t)gridDim.x * WARPS_PER_BLOCK)

__global__ void k_rmsnorm_fwd(const float *x, const float *w, int n, int d, int group, float eps, mc_dst y,
                              float *rstd) {
  const int ng = d / group, lane = threadIdx.x % 32;
  MC_WARP_FOR(it, (int64_t)n * ng) {
    int gi = (int)(it % ng);
    const float *xr = x + it * group; /* rows are d = ng * group wide, so (r, gi) starts at it*group */
    double ss = 0.0;
    for (int j = lane; j < group; j += 32) ss += (double)xr[j] * xr[j];
    ss = mc_d_warp_sumd(ss);
    float rs = (float)(1.0 / sqrt(ss / group + eps));
    if (lane == 0) rstd[it] = rs;
    const float *wr = w + (int64_t)gi * group;
    for (int j = lane; j < group; j += 32) mc_d_st(y, it * group + j, xr[j] * rs * wr[j]);
  }
}

__global__ void k_rmsnorm_bwd_dx(const float *x, const float *w, const float *rstd, const float *dy, int n, int d,
                                 int group, float *dx) {
  const int ng = d / group, lane = threadIdx.x % 32;
  MC_WARP_FOR(it, (int64_t)n * ng) {
    int64_t o = it * group;
    const float *wr = w + (int64_t)(it % ng) * group;
    float rs = rstd[it];
    double dot = 0.0;
    for (int j = lane; j < group; j += 32) dot += (double)dy[o + j] * wr[j] * x[o + j];
    dot = mc_d_warp_sumd(dot);
    float c = (float)(dot / group) * rs * rs;
    for (int j = lane; j < group; j += 32) dx[o + j] += rs * (dy[o + j] * wr[j] - x[o + j] * c);
  }
}

struct rms_dw {
  const float *dy, *x, *rstd;
  int d, group, ng;
  __device__ double operator()(int r, int j) const {
    int64_t o = (int64_t)r * d + j;
    return (double)dy[o] * x[o] * rstd[(int64_t)r * ng + j / group];
  }
};

static void cu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group, float eps,
                           mc_dst y, float *rstd) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "rmsnorm_fwd: width %d is not a multiple of the group %d", d, group);
    return;
  }
  k_rmsnorm_fwd<<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, w, n, d, group, eps,
                                                                                              y, rstd);
  mc_cuda_check(be, "rmsnorm_fwd");
}

static void cu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd, const float *dy, int n,
                           int d, int group, float *dx, float *dw) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "rmsnorm_bwd: width %d is not a multiple of the group %d", d, group);
    return;
  }
  k_rmsnorm_bwd_dx<<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, w, rstd, dy, n,
                                                                                                 d, group, dx);
  mc_cuda_check(be, "rmsnorm_bwd");
  mc_cuda_colsum(be, rms_dw{dy, x, rstd, d, group, d / group}, n, d, dw, "rmsnorm_bwd (weight)");
}

/* ---- RoPE: one thread per rotated pair; angles in double as in the CPU reference */
/* (cos, sin) of position t's angle for pair i, in double and rounded to float exactly as the
 * CPU reference does per element; one table per (T, head_dim, theta), so the rotation kernel
 * reads two floats instead of evaluating pow, cos and sin in double per element. */
__global__ void k_rope_table(int T, int hd, double theta, float2 *tab) {
  const int half = hd / 2;
  MC_CU_FOR(it, (int64_t)T * half) {
    const int i = (int)(it % half), t = (int)(it / half);
    const double ang = (double)t * pow(theta, -2.0 * i / hd);
    tab[it] = make_float2((float)cos(ang), (float)sin(ang));
  }
}

__global__ void k_rope(const float *in, float *out, int accumulate, int n, int T, int heads, int hd,
                       const float2 *tab, float sign) {
  const int half = hd / 2;
  MC_CU_FOR(it, (int64_t)n * heads * half) {
    int i = (int)(it % half);
    int64_t rh = it / half; /* r * heads + h */
    int r = (int)(rh / heads);
    const float2 cs = tab[(int64_t)(r % T) * half + i];
    float c = cs.x, s = sign * cs.y; /* sign is +-1: exact */
    int64_t o = rh * hd + i;
    float x1 = in[o], x2 = in[o + half];
    float y1 = x1 * c - x2 * s, y2 = x1 * s + x2 * c;
    if (accumulate) {
      out[o] += y1;
      out[o + half] += y2;
    } else {
      out[o] = y1;
      out[o + half] = y2;
    }
  }
}

/* The (cos, sin) table for (T, hd, theta), kept until another shape asks; NULL on failure. */
static const float2 *rope_table(mc_backend *be, int T, int hd, double theta) {
  mc_cuda_ctx *c = mc_cu(be);
  if (c->rope_tab && c->rope_T == T && c->rope_hd == hd && c->rope_theta == theta) return c->rope_tab;
  if (c->rope_tab) {
    cudaStreamSynchronize(c->stream); /* queued rotations may still read the old table */
    cudaFree(c->rope_tab);
    c->rope_tab = NULL;
  }
  const int64_t entries = (int64_t)T * (hd / 2);
  if (cudaMalloc((void **)&c->rope_tab, (size_t)(entries > 0 ? entries : 1) * sizeof(float2)) != cudaSuccess) {
    cudaGetLastError();
    c->rope_tab = NULL;
    mc_cuda_fail(be, "rope: out of device memory for a %d x %d table", T, hd / 2);
    return NULL;
  }
  c->rope_T = T, c->rope_hd = hd, c->rope_theta = theta;
  k_rope_table<<<mc_cu_grid(entries), MC_CUDA_THREADS, 0, c->stream>>>(T, hd, theta, c->rope_tab);
  mc_cuda_check(be, "rope (table)");
  return c->rope_tab;
}

/* RoPE on tensors stored in bf16 (either side): per element through the stored-type loads;
 * bf16 in place rounds the rotated pair, a bf16 gradient is written (ops.h). */
__global__ void k_rope_stored(mc_operand in, mc_dst out, int accumulate, int n, int T, int heads, int hd,
                              const float2 *tab, float sign) {
  const int half = hd / 2;
  MC_CU_FOR(it, (int64_t)n * heads * half) {
    const int i = (int)(it % half);
    const int64_t rh = it / half; /* r * heads + h */
    const float2 cs = tab[(int64_t)((int)(rh / heads) % T) * half + i];
    const float c = cs.x, s = sign * cs.y;
    const int64_t o = rh * hd + i;
    const float x1 = mc_d_ld(in, o), x2 = mc_d_ld(in, o + half);
    const float y1 = x1 * c - x2 * s, y2 = x1 * s + x2 * c;
    if (accumulate) {
      mc_d_acc(out, o, y1);
      mc_d_acc(out, o + half, y2);
    } else {
      mc_d_st(out, o, y1);
      mc_d_st(out, o + half, y2);
    }
  }
}

static void rope_stored(mc_backend *be, mc_operand in, mc_dst out, int accumulate, int n, int T, int heads, int hd,
                        const float2 *tab, float sign) {
  k_rope_stored<<<mc_cu_grid((int64_t)n * heads * (hd / 2)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(
      in, out, accumulate, n, T, heads, hd, tab, sign);
}

static void cu_rope_fwd(mc_backend *be, mc_dst x, int n, int T, int heads, int hd, double theta) {
  int64_t items = (int64_t)n * heads * (hd / 2);
  if (items <= 0) return;
  const float2 *tab = rope_table(be, T, hd, theta);
  if (!tab) return;
  if (x.h) rope_stored(be, mc_operand{NULL, x.h}, x, 0, n, T, heads, hd, tab, 1.0f);
  else k_rope<<<mc_cu_grid(items), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x.f, x.f, 0, n, T, heads, hd, tab, 1.0f);
  mc_cuda_check(be, "rope_fwd");
}

static void cu_rope_bwd(mc_backend *be, mc_operand dy, mc_dst dx, int n, int T, int heads, int hd, double theta) {
  int64_t items = (int64_t)n * heads * (hd / 2);
  if (items <= 0) return;
  const float2 *tab = rope_table(be, T, hd, theta);
  if (!tab) return;
  if (dy.h || dx.h) rope_stored(be, dy, dx, 1, n, T, heads, hd, tab, -1.0f);
  else k_rope<<<mc_cu_grid(items), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(dy.f, dx.f, 1, n, T, heads, hd, tab, -1.0f);
  mc_cuda_check(be, "rope_bwd");
}

/* ---- cross-entropy: one block per row (running max and sum of exponentials in double) */
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

/* One pass over the row: each thread keeps a running max and the sum of exponentials
 * relative to it (rescaled in double when the max grows), then the block combines the pairs;
 * the row is read once instead of twice. */
__global__ void k_xent_fwd(const float *logits, const int32_t *target, int n, int V, int Vp, float *loss, float *lse) {
  __shared__ float shf[MC_CUDA_THREADS / 32];
  __shared__ double shd[MC_CUDA_THREADS / 32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *lr = logits + (int64_t)r * Vp;
    float m = -INFINITY;
    double s = 0.0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float v = lr[c];
      if (v > m) {
        s = m == -INFINITY ? 0.0 : s * exp((double)m - v);
        m = v;
      }
      s += exp((double)v - m);
    }
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

static void cu_xent_fwd(mc_backend *be, const float *logits, const int32_t *target, int n, int V, int Vp, float *loss,
                        float *lse) {
  if (n <= 0) return;
  k_xent_fwd<<<n < 65535 ? n : 65535, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(logits, target, n, V, Vp, loss, lse);
  mc_cuda_check(be, "xent_fwd");
}

static void cu_xent_bwd(mc_backend *be, const float *logits, const int32_t *target, const float *lse, int n, int V,
                        int Vp, float scale, mc_dst dlogits) {
  if ((int64_t)n * Vp <= 0) return;
  const unsigned gx = (unsigned)((Vp + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS < 64 ? (Vp + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS : 64);
  k_xent_bwd<<<dim3(gx, n < 65535 ? n : 65535), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(logits, target, lse, n, V, Vp,
                                                                                         scale, dlogits);
  mc_cuda_check(be, "xent_bwd");
}

void mc_cuda_install_rows(mc_backend *be) {
  be->embed_fwd = cu_embed_fwd;
  be->embed_bwd = cu_embed_bwd;
  be->rmsnorm_fwd = cu_rmsnorm_fwd;
  be->rmsnorm_bwd = cu_rmsnorm_bwd;
  be->rope_fwd = cu_rope_fwd;
  be->rope_bwd = cu_rope_bwd;
  be->xent_fwd = cu_xent_fwd;
  be->xent_bwd = cu_xent_bwd;
}
