/* Row-wise ops: embedding gather/scatter, grouped RMSNorm, RoPE and the vocab-masked
 * cross-entropy. Reductions along a row run in double like the CPU reference. Each op has a
 * vector path (float4 loads and stores, taken when widths are multiples of 4 and buffers
 * aligned) and a scalar one for the rest; no float atomics outside embed_bwd, so the other
 * ops give the same bits run to run. */
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

/* ---- RMSNorm: the scalar path, one warp per (row, group), for shapes or buffers the vector
 * path below does not take */
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

/* The vector path: the block's threads own float4 chunks c = threadIdx.x + k * blockDim.x
 * (k < CPT) of every row the block visits, so w is loaded once per block. A group is either
 * g4 = group / 4 consecutive lanes (a power of two up to 32: a shuffle, no barrier) or, with
 * g4 == 0, the whole row (a block sum). The sums run in double like the CPU's, each in an
 * order fixed by the launch shape. */
#define ROWS_MAX_THREADS 512

/* Every thread gets its group's sum; all lanes of a warp must call it. sh[2][32] is used
 * alternately (par), so one barrier per row keeps the next row's writes off the values
 * still being read. The xor butterfly gives every lane the same bits (addition commutes). */
__device__ __forceinline__ double group_sum(double v, int g4, double (*sh)[32], int par) {
  if (g4) {
    for (int o = 1; o < g4; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  v = mc_d_warp_sumd(v);
  if (threadIdx.x % 32 == 0) sh[par][threadIdx.x / 32] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < (int)(blockDim.x / 32); i++) t += sh[par][i];
  return t;
}

/* group_sum of each of a thread's CPT chunk values, in place; a whole-row group (g4 == 0)
 * first adds the thread's chunks in order, so one block sum serves them all. */
template <int CPT>
__device__ __forceinline__ void group_sums(double (&v)[CPT], int g4, double (*sh)[32], int par) {
  if (!g4) {
    double t = 0.0;
#pragma unroll
    for (int k = 0; k < CPT; k++) t += v[k];
    t = group_sum(t, 0, sh, par);
#pragma unroll
    for (int k = 0; k < CPT; k++) v[k] = t;
  } else {
#pragma unroll
    for (int k = 0; k < CPT; k++) v[k] = group_sum(v[k], g4, sh, par);
  }
}

static __device__ __forceinline__ float4 ld4(const float *p, int c, int C) {
  return c < C ? ((const float4 *)p)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

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

/* y and rstd per row; the next row's x is loaded before this row's reduction, to keep more
 * loads in flight. */
template <int CPT>
__global__ void __launch_bounds__(ROWS_MAX_THREADS)
    k_rmsnorm_fwd4(const float *x, const float *w, int n, int d, int group, int g4, float eps, mc_dst y, float *rstd) {
  __shared__ double sh[2][32];
  const int C = d / 4, ng = d / group;
  float4 wv[CPT], xv[CPT];
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    wv[k] = ld4(w, threadIdx.x + k * blockDim.x, C);
    xv[k] = ld4(x + (int64_t)blockIdx.x * d, threadIdx.x + k * blockDim.x, C);
  }
  int par = 0;
  for (int r = blockIdx.x; r < n; r += gridDim.x, par ^= 1) {
    const int rn = r + gridDim.x;
    float4 xn[CPT];
    double ss[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      if (rn < n) xn[k] = ld4(x + (int64_t)rn * d, threadIdx.x + k * blockDim.x, C);
      const float4 a = xv[k];
      ss[k] = (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w;
    }
    group_sums<CPT>(ss, g4, sh, par);
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < C) {
        const float rs = (float)(1.0 / sqrt(ss[k] / group + eps));
        if ((4 * c) % group == 0) rstd[(int64_t)r * ng + 4 * c / group] = rs;
        const float4 a = xv[k], b = wv[k];
        st4(y, (int64_t)r * d + 4 * c, make_float4(a.x * rs * b.x, a.y * rs * b.y, a.z * rs * b.z, a.w * rs * b.w));
      }
      if (rn < n) xv[k] = xn[k];
    }
  }
}

/* dx per row as k_rmsnorm_bwd_dx, and the weight gradient's column sums of dy * x * rstd over
 * the block's rows into part[blockIdx.x][d] (summed in order by k_sum_parts). The next row's
 * x and dy are loaded before this row's reduction, to keep more loads in flight. */
template <int CPT>
__global__ void __launch_bounds__(ROWS_MAX_THREADS)
    k_rmsnorm_bwd4(const float *x, const float *w, const float *rstd, const float *dy, int n, int d, int group, int g4,
                   float *dx, double *part) {
  __shared__ double sh[2][32];
  const int C = d / 4, ng = d / group;
  float4 wv[CPT], xv[CPT], gv[CPT];
  double pv[CPT][4];
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    wv[k] = ld4(w, c, C);
    pv[k][0] = pv[k][1] = pv[k][2] = pv[k][3] = 0.0;
    if (blockIdx.x < n) {
      xv[k] = ld4(x + (int64_t)blockIdx.x * d, c, C);
      gv[k] = ld4(dy + (int64_t)blockIdx.x * d, c, C);
    }
  }
  int par = 0;
  for (int r = blockIdx.x; r < n; r += gridDim.x, par ^= 1) {
    const int rn = r + gridDim.x;
    float4 dxv[CPT], xn[CPT], gn[CPT];
    float rs[CPT];
    double dot[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      dxv[k] = ld4(dx + (int64_t)r * d, c, C);
      rs[k] = c < C ? rstd[(int64_t)r * ng + 4 * c / group] : 0.0f;
      if (rn < n) {
        xn[k] = ld4(x + (int64_t)rn * d, c, C);
        gn[k] = ld4(dy + (int64_t)rn * d, c, C);
      }
      const float4 a = xv[k], g = gv[k], b = wv[k];
      dot[k] = (double)g.x * b.x * a.x + (double)g.y * b.y * a.y + (double)g.z * b.z * a.z + (double)g.w * b.w * a.w;
    }
    group_sums<CPT>(dot, g4, sh, par);
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < C) {
        const float s = rs[k], cc = (float)(dot[k] / group) * s * s;
        const float4 a = xv[k], g = gv[k], b = wv[k];
        float4 o = dxv[k];
        o.x += s * (g.x * b.x - a.x * cc);
        o.y += s * (g.y * b.y - a.y * cc);
        o.z += s * (g.z * b.z - a.z * cc);
        o.w += s * (g.w * b.w - a.w * cc);
        reinterpret_cast<float4 *>(dx + (int64_t)r * d)[c] = o;
        pv[k][0] += (double)g.x * a.x * s;
        pv[k][1] += (double)g.y * a.y * s;
        pv[k][2] += (double)g.z * a.z * s;
        pv[k][3] += (double)g.w * a.w * s;
      }
      if (rn < n) xv[k] = xn[k], gv[k] = gn[k];
    }
  }
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < C) {
      double2 *pp = reinterpret_cast<double2 *>(part + (int64_t)blockIdx.x * d + 4 * c);
      pp[0] = make_double2(pv[k][0], pv[k][1]);
      pp[1] = make_double2(pv[k][2], pv[k][3]);
    }
  }
}

/* out[col] += the sum over p < parts of part[p][col]: SUM_STRIPES stripes of parts per column,
 * then the stripes in order (a fixed order for a given parts). */
#define SUM_STRIPES 32
__global__ void k_sum_parts(const double *part, int parts, int cols, float *out) {
  __shared__ double sh[SUM_STRIPES][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (col < cols)
    for (int p = threadIdx.y; p < parts; p += SUM_STRIPES) s += part[(int64_t)p * cols + col];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double t = 0.0;
    for (int i = 0; i < SUM_STRIPES; i++) t += sh[i][threadIdx.x];
    out[col] += (float)t;
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

static int aligned(const void *p, unsigned bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }
static int dst_aligned(mc_dst y) { return y.h ? aligned(y.h, 8) : aligned(y.f, 16); }

/* The vector path's shape for (d, group): chunks per thread (0: not taken), block size and
 * g4; the caller still checks alignment. */
typedef struct {
  int cpt, threads, g4;
} rows_shape;

static rows_shape rows_shape_of(int d, int group) {
  rows_shape s = {0, 0, 0};
  if (d % 4 || group % 4) return s;
  const int C = d / 4, g4 = group / 4;
  if (g4 <= 32 && (g4 & (g4 - 1)) == 0) s.g4 = g4;
  else if (group != d) return s;
  s.cpt = 1;
  while (s.cpt <= 4 && (C + s.cpt - 1) / s.cpt > ROWS_MAX_THREADS) s.cpt *= 2;
  if (s.cpt > 4) s.cpt = 0; /* wider rows: registers run out */
  else s.threads = ((C + s.cpt - 1) / s.cpt + 31) / 32 * 32;
  return s;
}

/* Resident blocks of `threads` for kernel k on the whole device. *cache (per kernel, one slot
 * per device below 16) keeps the answer with its block size, (threads << 32) | blocks in one
 * word, the occupancy query costing host time. */
static int device_blocks(mc_backend *be, const void *k, int threads, long long *cache) {
  const int dev = mc_cu(be)->device;
  const long long hit = dev >= 0 && dev < 16 ? cache[dev] : 0;
  if (hit >> 32 == threads) return (int)(hit & 0xffffffff);
  int sms = 0, per = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, threads, 0);
  cudaGetLastError(); /* a failed query only leaves the grid at one block */
  const int b = sms * per > 0 ? sms * per : 1;
  if (dev >= 0 && dev < 16) cache[dev] = (long long)threads << 32 | b;
  return b;
}

/* Both vector kernels run on a persistent grid: as many blocks as fit the device at once
 * (at most one per row). */
template <int CPT>
static void rmsnorm_fwd4(mc_backend *be, rows_shape rs, const float *x, const float *w, int n, int d, int group,
                         float eps, mc_dst y, float *rstd) {
  static long long cache[16];
  int blocks = device_blocks(be, (const void *)k_rmsnorm_fwd4<CPT>, rs.threads, cache);
  if (blocks > n) blocks = n;
  k_rmsnorm_fwd4<CPT><<<blocks, rs.threads, 0, mc_cu_stream(be)>>>(x, w, n, d, group, rs.g4, eps, y, rstd);
}

static void cu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group, float eps,
                           mc_dst y, float *rstd) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "rmsnorm_fwd: width %d is not a multiple of the group %d", d, group);
    return;
  }
  const rows_shape rs = rows_shape_of(d, group);
  if (rs.cpt && aligned(x, 16) && aligned(w, 16) && dst_aligned(y)) {
    switch (rs.cpt) {
      case 1: rmsnorm_fwd4<1>(be, rs, x, w, n, d, group, eps, y, rstd); break;
      case 2: rmsnorm_fwd4<2>(be, rs, x, w, n, d, group, eps, y, rstd); break;
      default: rmsnorm_fwd4<4>(be, rs, x, w, n, d, group, eps, y, rstd); break;
    }
  } else {
    k_rmsnorm_fwd<<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, w, n, d, group,
                                                                                                eps, y, rstd);
  }
  mc_cuda_check(be, "rmsnorm_fwd");
}

template <int CPT>
static void rmsnorm_bwd4(mc_backend *be, rows_shape rs, const float *x, const float *w, const float *rstd,
                         const float *dy, int n, int d, int group, float *dx, float *dw) {
  static long long cache[16];
  int blocks = device_blocks(be, (const void *)k_rmsnorm_bwd4<CPT>, rs.threads, cache);
  if (blocks > n) blocks = n;
  double *part = (double *)mc_cuda_scratch(be, (size_t)blocks * d * sizeof(double), "rmsnorm_bwd");
  if (!part) return;
  k_rmsnorm_bwd4<CPT><<<blocks, rs.threads, 0, mc_cu_stream(be)>>>(x, w, rstd, dy, n, d, group, rs.g4, dx, part);
  k_sum_parts<<<(d + 31) / 32, dim3(32, SUM_STRIPES), 0, mc_cu_stream(be)>>>(part, blocks, d, dw);
  mc_cuda_check(be, "rmsnorm_bwd");
}

static void cu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd, const float *dy, int n,
                           int d, int group, float *dx, float *dw) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "rmsnorm_bwd: width %d is not a multiple of the group %d", d, group);
    return;
  }
  const rows_shape rs = rows_shape_of(d, group);
  if (rs.cpt && aligned(x, 16) && aligned(w, 16) && aligned(dy, 16) && aligned(dx, 16)) {
    switch (rs.cpt) {
      case 1: rmsnorm_bwd4<1>(be, rs, x, w, rstd, dy, n, d, group, dx, dw); break;
      case 2: rmsnorm_bwd4<2>(be, rs, x, w, rstd, dy, n, d, group, dx, dw); break;
      default: rmsnorm_bwd4<4>(be, rs, x, w, rstd, dy, n, d, group, dx, dw); break;
    }
    return;
  }
  k_rmsnorm_bwd_dx<<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, w, rstd, dy, n,
                                                                                                 d, group, dx);
  mc_cuda_check(be, "rmsnorm_bwd");
  mc_cuda_colsum(be, rms_dw{dy, x, rstd, d, group, d / group}, n, d, dw, "rmsnorm_bwd (weight)");
}

/* ---- RoPE: angles in double as in the CPU reference (a table of them, below); the scalar
 * path rotates one pair per thread */
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

/* One thread per rotated pair, through the stored-type loads (any alignment and head_dim);
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

/* The vector path (hd % 8 == 0, 16-byte aligned rows): one block per row, each thread four
 * consecutive pairs of one head (two float4 of x, two float4 of the table). */
/* Four consecutive elements as stored, widened; and stored back (bf16: rounded). */
static __device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
static __device__ __forceinline__ float4 ld4(const __nv_bfloat16 *p) {
  const uint2 u = *reinterpret_cast<const uint2 *>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ void st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
static __device__ __forceinline__ void st4(__nv_bfloat16 *p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const unsigned *>(&a), u.y = *reinterpret_cast<const unsigned *>(&b);
  *reinterpret_cast<uint2 *>(p) = u;
}
/* out gains v: added into fp32, written into bf16 (a bf16 gradient's only contribution). */
static __device__ __forceinline__ void acc4(float *p, float4 v) {
  const float4 o = ld4(p);
  st4(p, make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w));
}
static __device__ __forceinline__ void acc4(__nv_bfloat16 *p, float4 v) { st4(p, v); }

/* One block per row, four pairs per thread; TI / TO the stored types of in and out. */
template <typename TI, typename TO>
__global__ void k_rope4(const TI *in, TO *out, int accumulate, int n, int T, int heads, int hd, const float2 *tab,
                        float sign) {
  const int half = hd / 2, q = half / 4, per_row = heads * q;
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float4 *tr = reinterpret_cast<const float4 *>(tab + (int64_t)(r % T) * half);
    for (int j = threadIdx.x; j < per_row; j += blockDim.x) {
      const int h = j / q, i4 = j - h * q;
      const int64_t o = ((int64_t)r * heads + h) * hd + 4 * i4;
      const float4 a = ld4(in + o), b = ld4(in + o + half);
      const float4 t01 = tr[2 * i4], t23 = tr[2 * i4 + 1]; /* (c0, s0, c1, s1), (c2, s2, c3, s3) */
      const float c[4] = {t01.x, t01.z, t23.x, t23.z}, sn[4] = {sign * t01.y, sign * t01.w, sign * t23.y, sign * t23.w};
      const float x1[4] = {a.x, a.y, a.z, a.w}, x2[4] = {b.x, b.y, b.z, b.w};
      float y1[4], y2[4];
#pragma unroll
      for (int e = 0; e < 4; e++) y1[e] = x1[e] * c[e] - x2[e] * sn[e], y2[e] = x1[e] * sn[e] + x2[e] * c[e];
      const float4 u = make_float4(y1[0], y1[1], y1[2], y1[3]), v = make_float4(y2[0], y2[1], y2[2], y2[3]);
      if (accumulate) acc4(out + o, u), acc4(out + o + half, v);
      else st4(out + o, u), st4(out + o + half, v);
    }
  }
}

/* Rotates in into out (accumulate: adds) by the table's angles, sign -1 rotating back. */
template <typename TI, typename TO>
static void rope_launch(mc_backend *be, const TI *in, TO *out, int accumulate, int n, int T, int heads, int hd,
                        const float2 *tab, float sign) {
  const int per_row = heads * (hd / 8);
  const int threads = per_row >= 256 ? 256 : (per_row + 31) / 32 * 32;
  k_rope4<<<(unsigned)(n < (1 << 20) ? n : (1 << 20)), threads, 0, mc_cu_stream(be)>>>(in, out, accumulate, n, T, heads,
                                                                                      hd, tab, sign);
}

/* The vectorised form needs hd a multiple of 8 and 16-byte (fp32) or 8-byte (bf16) aligned
 * rows; otherwise one thread per pair through the stored-type loads. */
static void rope_any(mc_backend *be, mc_operand in, mc_dst out, int accumulate, int n, int T, int heads, int hd,
                     const float2 *tab, float sign) {
  const int vec = hd % 8 == 0 && (in.h ? aligned(in.h, 8) : aligned(in.f, 16)) && dst_aligned(out);
  if (!vec)
    k_rope_stored<<<mc_cu_grid((int64_t)n * heads * (hd / 2)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(
        in, out, accumulate, n, T, heads, hd, tab, sign);
  else if (in.h && out.h)
    rope_launch(be, (const __nv_bfloat16 *)in.h, (__nv_bfloat16 *)out.h, accumulate, n, T, heads, hd, tab, sign);
  else if (in.h) rope_launch(be, (const __nv_bfloat16 *)in.h, out.f, accumulate, n, T, heads, hd, tab, sign);
  else if (out.h) rope_launch(be, in.f, (__nv_bfloat16 *)out.h, accumulate, n, T, heads, hd, tab, sign);
  else rope_launch(be, in.f, out.f, accumulate, n, T, heads, hd, tab, sign);
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


static void cu_rope_fwd(mc_backend *be, mc_dst x, int n, int T, int heads, int hd, double theta) {
  int64_t items = (int64_t)n * heads * (hd / 2);
  if (items <= 0) return;
  const float2 *tab = rope_table(be, T, hd, theta);
  if (!tab) return;
  rope_any(be, mc_operand{x.f, x.h}, x, 0, n, T, heads, hd, tab, 1.0f);
  mc_cuda_check(be, "rope_fwd");
}

static void cu_rope_bwd(mc_backend *be, mc_operand dy, mc_dst dx, int n, int T, int heads, int hd, double theta) {
  int64_t items = (int64_t)n * heads * (hd / 2);
  if (items <= 0) return;
  const float2 *tab = rope_table(be, T, hd, theta);
  if (!tab) return;
  rope_any(be, dy, dx, 1, n, T, heads, hd, tab, -1.0f);
  mc_cuda_check(be, "rope_bwd");
}

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
