/* Grouped RMSNorm (kernels/ops.h rmsnorm_fwd, rmsnorm_bwd, and the gated form
 * gated_rmsnorm_fwd, gated_rmsnorm_bwd; formulas as in kernels/cpu/cpu_rmsnorm.c). Sums along
 * a row run in double like the CPU reference. A vector path (float4 loads and stores, taken
 * when widths are multiples of 4 and buffers aligned) and a scalar one for the rest; no
 * atomics, so results are the same bits run to run. Every kernel takes GATED as a template
 * parameter: the gated form normalises g = y * silu(z) (x = y), recomputed where it is
 * loaded, and splits the input gradient by the gate (dx is dy, added; dz as stored). */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_vec.h"

/* the gate, in the CPU's order: silu(z) * y */
static __device__ __forceinline__ float gate_of(float y, float z) { return mc_d_silu(z) * y; }
/* the normalised input at element o */
template <bool GATED>
static __device__ __forceinline__ float in_at(const float *x, mc_operand z, int64_t o) {
  return GATED ? gate_of(x[o], mc_d_ld(z, o)) : x[o];
}
/* the gated form's input gradient dg split by the gate: dz = dg y silu'(z), dy += dg silu(z) */
static __device__ __forceinline__ float gate_dz(float dg, float y, float z) { return dg * y * mc_d_silu_df(z); }
static __device__ __forceinline__ float gate_dy(float dg, float z) { return dg * mc_d_silu(z); }
static __device__ __forceinline__ void gate_split(float dg, float y, float z, float *dy, mc_dst dz, int64_t o) {
  mc_d_acc(dz, o, gate_dz(dg, y, z));
  dy[o] += gate_dy(dg, z);
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

template <bool GATED>
__global__ void k_rmsnorm_fwd(const float *x, mc_operand z, const float *w, int n, int d, int group, float eps,
                              mc_dst y, float *rstd) {
  const int ng = d / group, lane = threadIdx.x % 32;
  MC_WARP_FOR(it, (int64_t)n * ng) {
    int gi = (int)(it % ng);
    const int64_t o = it * group; /* rows are d = ng * group wide, so (r, gi) starts at it*group */
    double ss = 0.0;
    for (int j = lane; j < group; j += 32) {
      const float v = in_at<GATED>(x, z, o + j);
      ss += (double)v * v;
    }
    ss = mc_d_warp_sumd(ss);
    float rs = (float)(1.0 / sqrt(ss / group + eps));
    if (lane == 0) rstd[it] = rs;
    const float *wr = w + (int64_t)gi * group;
    for (int j = lane; j < group; j += 32) mc_d_st(y, o + j, in_at<GATED>(x, z, o + j) * rs * wr[j]);
  }
}

template <bool GATED>
__global__ void k_rmsnorm_bwd_dx(const float *x, mc_operand z, const float *w, const float *rstd, const float *dy, int n,
                                 int d, int group, float *dx, mc_dst dz) {
  const int ng = d / group, lane = threadIdx.x % 32;
  MC_WARP_FOR(it, (int64_t)n * ng) {
    int64_t o = it * group;
    const float *wr = w + (int64_t)(it % ng) * group;
    float rs = rstd[it];
    double dot = 0.0;
    for (int j = lane; j < group; j += 32) dot += (double)dy[o + j] * wr[j] * in_at<GATED>(x, z, o + j);
    dot = mc_d_warp_sumd(dot);
    float c = (float)(dot / group) * rs * rs;
    for (int j = lane; j < group; j += 32) {
      const float dg = rs * (dy[o + j] * wr[j] - in_at<GATED>(x, z, o + j) * c);
      if (GATED) gate_split(dg, x[o + j], mc_d_ld(z, o + j), dx, dz, o + j);
      else dx[o + j] += dg;
    }
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
/* chunk c of the row at element `row` of z as stored (bf16: one 8-byte load) */
static __device__ __forceinline__ float4 ldz4(mc_operand z, int64_t row, int c, int C) {
  if (c >= C) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (!z.h) return ((const float4 *)(z.f + row))[c];
  const uint2 u = ((const uint2 *)(z.h + row))[c];
  const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
/* the normalised input's chunk from x's (and z's) */
template <bool GATED>
static __device__ __forceinline__ float4 in4(float4 x, float4 z) {
  return GATED ? make_float4(gate_of(x.x, z.x), gate_of(x.y, z.y), gate_of(x.z, z.z), gate_of(x.w, z.w)) : x;
}

/* y and rstd per row; the next row's x is loaded before this row's reduction, to keep more
 * loads in flight. */
template <int CPT, bool GATED>
__global__ void __launch_bounds__(ROWS_MAX_THREADS)
    k_rmsnorm_fwd4(const float *x, mc_operand z, const float *w, int n, int d, int group, int g4, float eps, mc_dst y,
                   float *rstd) {
  __shared__ double sh[2][32];
  const int C = d / 4, ng = d / group;
  float4 wv[CPT], xv[CPT];
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    wv[k] = ld4(w, c, C);
    xv[k] = in4<GATED>(ld4(x + (int64_t)blockIdx.x * d, c, C), GATED ? ldz4(z, (int64_t)blockIdx.x * d, c, C) : float4{});
  }
  int par = 0;
  for (int r = blockIdx.x; r < n; r += gridDim.x, par ^= 1) {
    const int rn = r + gridDim.x;
    float4 xn[CPT];
    double ss[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      if (rn < n) xn[k] = in4<GATED>(ld4(x + (int64_t)rn * d, c, C), GATED ? ldz4(z, (int64_t)rn * d, c, C) : float4{});
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
 * x and dy are loaded before this row's reduction, to keep more loads in flight. GATED: x is
 * y, the normalised input is recomputed from y and z, and dx (dy) and dz get the split. */
template <int CPT, bool GATED>
__global__ void __launch_bounds__(ROWS_MAX_THREADS)
    k_rmsnorm_bwd4(const float *x, mc_operand z, const float *w, const float *rstd, const float *dy, int n, int d,
                   int group, int g4, float *dx, mc_dst dz, double *part) {
  __shared__ double sh[2][32];
  const int C = d / 4, ng = d / group;
  float4 wv[CPT], xv[CPT], zv[CPT], gv[CPT];
  double pv[CPT][4];
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    wv[k] = ld4(w, c, C);
    pv[k][0] = pv[k][1] = pv[k][2] = pv[k][3] = 0.0;
    if (blockIdx.x < n) {
      xv[k] = ld4(x + (int64_t)blockIdx.x * d, c, C);
      if (GATED) zv[k] = ldz4(z, (int64_t)blockIdx.x * d, c, C);
      gv[k] = ld4(dy + (int64_t)blockIdx.x * d, c, C);
    }
  }
  int par = 0;
  for (int r = blockIdx.x; r < n; r += gridDim.x, par ^= 1) {
    const int rn = r + gridDim.x;
    float4 dxv[CPT], xn[CPT], zn[CPT], gn[CPT];
    float rs[CPT];
    double dot[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      dxv[k] = ld4(dx + (int64_t)r * d, c, C);
      rs[k] = c < C ? rstd[(int64_t)r * ng + 4 * c / group] : 0.0f;
      if (rn < n) {
        xn[k] = ld4(x + (int64_t)rn * d, c, C);
        if (GATED) zn[k] = ldz4(z, (int64_t)rn * d, c, C);
        gn[k] = ld4(dy + (int64_t)rn * d, c, C);
      }
      const float4 a = in4<GATED>(xv[k], zv[k]), g = gv[k], b = wv[k];
      dot[k] = (double)g.x * b.x * a.x + (double)g.y * b.y * a.y + (double)g.z * b.z * a.z + (double)g.w * b.w * a.w;
    }
    group_sums<CPT>(dot, g4, sh, par);
#pragma unroll
    for (int k = 0; k < CPT; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < C) {
        const float s = rs[k], cc = (float)(dot[k] / group) * s * s;
        const float4 a = in4<GATED>(xv[k], zv[k]), g = gv[k], b = wv[k];
        const float4 dg = make_float4(s * (g.x * b.x - a.x * cc), s * (g.y * b.y - a.y * cc), s * (g.z * b.z - a.z * cc),
                                      s * (g.w * b.w - a.w * cc));
        float4 o = dxv[k];
        if (GATED) {
          const float4 y = xv[k], zz = zv[k];
          const int64_t e = (int64_t)r * d + 4 * c;
          const float4 dzv = make_float4(gate_dz(dg.x, y.x, zz.x), gate_dz(dg.y, y.y, zz.y), gate_dz(dg.z, y.z, zz.z),
                                         gate_dz(dg.w, y.w, zz.w));
          if (dz.h) {
            st4(dz, e, dzv);
          } else {
            float4 t = reinterpret_cast<const float4 *>(dz.f + (int64_t)r * d)[c];
            t.x += dzv.x, t.y += dzv.y, t.z += dzv.z, t.w += dzv.w;
            reinterpret_cast<float4 *>(dz.f + (int64_t)r * d)[c] = t;
          }
          o.x += gate_dy(dg.x, zz.x), o.y += gate_dy(dg.y, zz.y), o.z += gate_dy(dg.z, zz.z), o.w += gate_dy(dg.w, zz.w);
        } else {
          o.x += dg.x, o.y += dg.y, o.z += dg.z, o.w += dg.w;
        }
        reinterpret_cast<float4 *>(dx + (int64_t)r * d)[c] = o;
        pv[k][0] += (double)g.x * a.x * s;
        pv[k][1] += (double)g.y * a.y * s;
        pv[k][2] += (double)g.z * a.z * s;
        pv[k][3] += (double)g.w * a.w * s;
      }
      if (rn < n) {
        xv[k] = xn[k], gv[k] = gn[k];
        if (GATED) zv[k] = zn[k];
      }
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

template <bool GATED>
struct rms_dw {
  const float *dy, *x;
  mc_operand z;
  const float *rstd;
  int d, group, ng;
  __device__ double operator()(int r, int j) const {
    int64_t o = (int64_t)r * d + j;
    return (double)dy[o] * in_at<GATED>(x, z, o) * rstd[(int64_t)r * ng + j / group];
  }
};

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
template <int CPT, bool GATED>
static void rmsnorm_fwd4(mc_backend *be, rows_shape rs, const float *x, mc_operand z, const float *w, int n, int d,
                         int group, float eps, mc_dst y, float *rstd) {
  static long long cache[16];
  int blocks = device_blocks(be, (const void *)k_rmsnorm_fwd4<CPT, GATED>, rs.threads, cache);
  if (blocks > n) blocks = n;
  k_rmsnorm_fwd4<CPT, GATED><<<blocks, rs.threads, 0, mc_cu_stream(be)>>>(x, z, w, n, d, group, rs.g4, eps, y, rstd);
}

/* z aligned for the vector path (bf16: 8 bytes, fp32: 16), or absent */
static int z_aligned(mc_operand z) { return z.h ? aligned(z.h, 8) : !z.f || aligned(z.f, 16); }

template <bool GATED>
static void norm_fwd(mc_backend *be, const char *op, const float *x, mc_operand z, const float *w, int n, int d,
                     int group, float eps, mc_dst y, float *rstd) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "%s: width %d is not a multiple of the group %d", op, d, group);
    return;
  }
  const rows_shape rs = rows_shape_of(d, group);
  if (rs.cpt && aligned(x, 16) && z_aligned(z) && aligned(w, 16) && dst_aligned(y)) {
    switch (rs.cpt) {
      case 1: rmsnorm_fwd4<1, GATED>(be, rs, x, z, w, n, d, group, eps, y, rstd); break;
      case 2: rmsnorm_fwd4<2, GATED>(be, rs, x, z, w, n, d, group, eps, y, rstd); break;
      default: rmsnorm_fwd4<4, GATED>(be, rs, x, z, w, n, d, group, eps, y, rstd); break;
    }
  } else {
    k_rmsnorm_fwd<GATED><<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(
        x, z, w, n, d, group, eps, y, rstd);
  }
  mc_cuda_check(be, op);
}

template <int CPT, bool GATED>
static void rmsnorm_bwd4(mc_backend *be, const char *op, rows_shape rs, const float *x, mc_operand z, const float *w,
                         const float *rstd, const float *dy, int n, int d, int group, float *dx, mc_dst dz, float *dw) {
  static long long cache[16];
  int blocks = device_blocks(be, (const void *)k_rmsnorm_bwd4<CPT, GATED>, rs.threads, cache);
  if (blocks > n) blocks = n;
  double *part = (double *)mc_cuda_scratch(be, (size_t)blocks * d * sizeof(double), op);
  if (!part) return;
  k_rmsnorm_bwd4<CPT, GATED><<<blocks, rs.threads, 0, mc_cu_stream(be)>>>(x, z, w, rstd, dy, n, d, group, rs.g4, dx,
                                                                          dz, part);
  k_sum_parts<<<(d + 31) / 32, dim3(32, SUM_STRIPES), 0, mc_cu_stream(be)>>>(part, blocks, d, dw);
  mc_cuda_check(be, op);
}

template <bool GATED>
static void norm_bwd(mc_backend *be, const char *op, const float *x, mc_operand z, const float *w, const float *rstd,
                     const float *dy, int n, int d, int group, float *dx, mc_dst dz, float *dw) {
  if (n <= 0 || d <= 0) return;
  if (group <= 0 || d % group) {
    mc_cuda_fail(be, "%s: width %d is not a multiple of the group %d", op, d, group);
    return;
  }
  const rows_shape rs = rows_shape_of(d, group);
  if (rs.cpt && aligned(x, 16) && z_aligned(z) && aligned(w, 16) && aligned(dy, 16) && aligned(dx, 16) &&
      (!GATED || dst_aligned(dz))) {
    switch (rs.cpt) {
      case 1: rmsnorm_bwd4<1, GATED>(be, op, rs, x, z, w, rstd, dy, n, d, group, dx, dz, dw); break;
      case 2: rmsnorm_bwd4<2, GATED>(be, op, rs, x, z, w, rstd, dy, n, d, group, dx, dz, dw); break;
      default: rmsnorm_bwd4<4, GATED>(be, op, rs, x, z, w, rstd, dy, n, d, group, dx, dz, dw); break;
    }
    return;
  }
  k_rmsnorm_bwd_dx<GATED><<<warp_grid((int64_t)n * (d / group)), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(
      x, z, w, rstd, dy, n, d, group, dx, dz);
  mc_cuda_check(be, op);
  mc_cuda_colsum(be, rms_dw<GATED>{dy, x, z, rstd, d, group, d / group}, n, d, dw, op);
}

static const mc_operand no_gate = {NULL, NULL};

static void cu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group, float eps,
                           mc_dst y, float *rstd) {
  norm_fwd<false>(be, "rmsnorm_fwd", x, no_gate, w, n, d, group, eps, y, rstd);
}

static void cu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd, const float *dy, int n,
                           int d, int group, float *dx, float *dw) {
  norm_bwd<false>(be, "rmsnorm_bwd", x, no_gate, w, rstd, dy, n, d, group, dx, mc_dst{NULL, NULL}, dw);
}

static void cu_gated_rmsnorm_fwd(mc_backend *be, const float *y, mc_operand z, const float *w, int n, int d, int group,
                                 float eps, mc_dst out, float *rstd) {
  norm_fwd<true>(be, "gated_rmsnorm_fwd", y, z, w, n, d, group, eps, out, rstd);
}

static void cu_gated_rmsnorm_bwd(mc_backend *be, const float *y, mc_operand z, const float *w, const float *rstd,
                                 const float *dout, int n, int d, int group, float *dy, mc_dst dz, float *dw) {
  norm_bwd<true>(be, "gated_rmsnorm_bwd", y, z, w, rstd, dout, n, d, group, dy, dz, dw);
}

void mc_cuda_install_rmsnorm(mc_backend *be) {
  be->rmsnorm_fwd = cu_rmsnorm_fwd;
  be->rmsnorm_bwd = cu_rmsnorm_bwd;
  be->gated_rmsnorm_fwd = cu_gated_rmsnorm_fwd;
  be->gated_rmsnorm_bwd = cu_gated_rmsnorm_bwd;
}
