/* RoPE, rotate-half (kernels/ops.h rope_fwd, rope_bwd; formulas as in kernels/cpu/cpu_rope.c),
 * in place or into a gradient, on tensors stored in fp32 or bf16: a vector path (float4 loads
 * and stores, head_dim a multiple of 8 and rows aligned) and a scalar one for the rest; no
 * atomics. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_vec.h"

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

void mc_cuda_install_rope(mc_backend *be) {
  be->rope_fwd = cu_rope_fwd;
  be->rope_bwd = cu_rope_bwd;
}
