/* The Mamba-2 selective scan (kernels/ops.h ssm_fwd, ssm_bwd; formulas as in
 * kernels/cpu/cpu_ssm.c) in chunked, state-space-duality form. fp32 data; the 64 x 64 tile
 * products run on tensor cores, fp32 accumulation. On the fp32 instance in split TF32 (each
 * operand as a TF32 value plus its TF32 rest, three mma products per tile step: about fp32
 * accuracy); on the bf16 instance, whose matrix products take bf16 operands, in plain TF32
 * (one mma product per tile step, operands rounded to 10 mantissa bits, still 3 more than
 * bf16): the kernels are templated on SPLIT.
 *
 * Time is cut into chunks of SSD_L = 64 steps. Within a chunk, with a_t = dt_t A and
 * cum_i = a_0 + ... + a_i (summed in double, so that the differences cum_i - cum_j lose
 * nothing to cancellation; all are <= 0, so every decay exp(cum_i - cum_j) is <= 1):
 *   y_i  = e^{cum_i} C_i S_in^T + sum_{j<=i} (C_i . B_j) e^{cum_i - cum_j} dt_j x_j + D x_i
 *   S_out = e^{cum_last} S_in + sum_j e^{cum_last - cum_j} dt_j x_j B_j^T
 * (S is P x N per head). Three launches: the chunk-local end states, a pass over chunks
 * that turns them into the state entering each chunk (kept in scratch, T/64 * P * N floats
 * per head), and the outputs, as products of 64-row tiles staged through shared memory.
 *
 * The backward recomputes the entering states the same way, runs the adjoint over chunks
 * backwards (dS entering chunk c = e^{cum_last} dS leaving it + sum_i e^{cum_i} dy_i C_i^T)
 * and then takes each chunk's exact gradient. With K_ij = e^{cum_i - cum_j} (dy_i . x_j)
 * for j <= i and G_ij = C_i . B_j:
 *   dx_j = dt_j sum_i G_ij e^{cum_i - cum_j} dy_i + e^{cum_last - cum_j} dt_j dS_out B_j + D dy_j
 *   dC_i = sum_j K_ij dt_j B_j + e^{cum_i} dy_i^T S_in,  dB_j = sum_i K_ij dt_j C_i
 *          + e^{cum_last - cum_j} dt_j x_j^T dS_out
 *   ddt_j = sum_i K_ij G_ij + e^{cum_last - cum_j} x_j . (dS_out B_j) + A da_j
 * where da_k, the gradient of a_k, gathers every exponent a_k appears in: the pairs
 * j < k <= i of the intra-chunk term, e^{cum_i} for i >= k, e^{cum_last - cum_j} for j < k
 * and e^{cum_last} (the carried state). These are direct sums, not differences of
 * cumulative sums. dA_log = A sum dt_k da_k since A = -exp(A_log).
 * No atomics: dx and ddt rows belong to one block; dB and dC (one group shared by the
 * heads) are written per head and summed over heads in order; dA_log and dD per chunk,
 * summed over sequences and chunks in order. */
#include <math.h>

#include "kernels/cuda/cuda_common.h"

#define SSD_L 64       /* chunk length, also the rows and columns of every tile */
#define SSD_THREADS 256 /* 8 warps; warp w owns rows 16 (w % 4) .. + 16, columns 32 (w / 4) .. + 32 */
#define SSD_KT 32      /* contraction steps staged per round */
#define SSD_MS 68      /* stride of the L x L matrices: row-wise fragment reads hit distinct banks */
/* Blocks per multiprocessor the register allocation must allow */
#ifndef SSD_MINB_FWD
#define SSD_MINB_FWD 3
#endif
#ifndef SSD_MINB_STATES
#define SSD_MINB_STATES 3
#endif
#ifndef SSD_MINB_BWD
#define SSD_MINB_BWD 2
#endif

/* An operand of a tile product, element (i, k) for i < ni, k < nk (zero outside):
 *   ssd_cols  p[i + k ld] sci[i] sck[k], global memory, i contiguous: staged k-major;
 *   ssd_rows  p[i ld + k] sci[i] sck[k], global memory, k contiguous: staged i-major;
 *   ssd_smat  p[i ld + k] (trans: p[i + k ld]), a matrix already in shared memory: its
 *             fragments are read from it directly, not staged (scales pre-applied).
 * The kind is fixed where the operand is named, so that after inlining each product's
 * index arithmetic is resolved at compile time. Staged operands go through registers in
 * quads of 4 elements along the contiguous index (one float4 load where the row start is
 * 16-byte aligned, else 4 scalar loads). */
enum { SSD_COLS, SSD_ROWS, SSD_SMAT };
struct ssd_opd {
  const float *p;
  int ld; /* 64 ld < 2^31 (ssd_args_ok), so offsets inside a chunk fit an int */
  int kind;
  bool trans, vec; /* vec: p and ld allow float4 loads */
  int ni, nk;
  const float *sci, *sck;
};

static __device__ __forceinline__ ssd_opd ssd_global(int kind, const float *p, int ld, int ni, int nk,
                                                     const float *sci, const float *sck) {
  ssd_opd o = {p, ld, kind, false, ld % 4 == 0 && ((uintptr_t)p & 15) == 0, ni, nk, sci, sck};
  return o;
}
static __device__ __forceinline__ ssd_opd ssd_cols(const float *p, int ld, int ni, int nk,
                                                   const float *sci = nullptr, const float *sck = nullptr) {
  return ssd_global(SSD_COLS, p, ld, ni, nk, sci, sck);
}
static __device__ __forceinline__ ssd_opd ssd_rows(const float *p, int ld, int ni, int nk,
                                                   const float *sci = nullptr, const float *sck = nullptr) {
  return ssd_global(SSD_ROWS, p, ld, ni, nk, sci, sck);
}
static __device__ __forceinline__ ssd_opd ssd_smat(const float *p, int ld, bool trans, int ni, int nk) {
  ssd_opd o = {p, ld, SSD_SMAT, trans, false, ni, nk, nullptr, nullptr};
  return o;
}

/* A staging buffer is two planes, the hi parts then the lo parts (ssd_split), each k-major
 * rows of SSD_LDK floats (ssd_cols) or i-major rows of SSD_LDI floats (ssd_rows). Both
 * strides put a fragment read's 32 lanes (8 i x 4 k) in distinct banks, and a quad is one
 * 16-byte store per plane. Separate planes let each fragment load straight into the
 * registers the mma reads. */
#define SSD_LDK 72
#define SSD_LDI 36
#define SSD_STAGE (SSD_L * SSD_LDI) /* floats per plane (>= SSD_KT * SSD_LDK) */
#define SSD_QUADS (SSD_L * SSD_KT / 4 / SSD_THREADS) /* quads per thread and operand per round */
static_assert(SSD_L == 64 && SSD_KT == 32 && SSD_THREADS == 256 && SSD_QUADS == 2,
              "the quad and warp tilings assume these");
static_assert(SSD_KT * SSD_LDK <= SSD_STAGE, "staging buffer too small");

/* Quad m of this thread in a round: its first element (i, kk) and, along the contiguous
 * index, 4 elements. ssd_cols: 16 quads cover the 64 i of one kk; ssd_rows: 8 quads cover
 * the 32 kk of one i. */
static __device__ __forceinline__ void ssd_quad(const ssd_opd &o, int m, int &i, int &kk) {
  const int q = threadIdx.x + m * SSD_THREADS;
  if (o.kind == SSD_COLS)
    i = (q % 16) * 4, kk = q / 16;
  else
    i = q / 8, kk = (q % 8) * 4;
}

/* Loads this thread's quads of columns [k0, k0 + SSD_KT) into registers (none for ssd_smat).
 * All loads come before any shared-memory store (ssd_put), so that they are in flight
 * together. */
static __device__ __forceinline__ void ssd_fetch(const ssd_opd &o, int k0, float (&v)[4 * SSD_QUADS]) {
  if (o.kind == SSD_SMAT) return;
#pragma unroll
  for (int m = 0; m < SSD_QUADS; m++) {
    int i, kk;
    ssd_quad(o, m, i, kk);
    const int k = k0 + kk;
    const bool cols = o.kind == SSD_COLS;
    const float *src = cols ? o.p + i + k * o.ld : o.p + i * o.ld + k;
    const int lim = cols ? o.ni - i : o.nk - k; /* elements of the quad inside the operand */
    const bool row_in = cols ? k < o.nk : i < o.ni;
    float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row_in && lim >= 4 && o.vec) {
      q = *(const float4 *)src;
    } else if (row_in) {
      q.x = lim > 0 ? src[0] : 0.0f;
      q.y = lim > 1 ? src[1] : 0.0f;
      q.z = lim > 2 ? src[2] : 0.0f;
      q.w = lim > 3 ? src[3] : 0.0f;
    }
    float e[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (o.sci) e[u] *= o.sci[cols ? i + u : i];
      if (o.sck) e[u] *= o.sck[cols ? k : k + u];
      v[4 * m + u] = e[u];
    }
  }
}

/* v rounded to TF32 (10 mantissa bits; to nearest, ties away from zero, as cvt.rna.tf32.f32
 * for finite v, in two integer operations), as a float */
static __device__ __forceinline__ float ssd_tf32(float v) {
  return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}

/* (hi, lo): v's TF32 rounding and the TF32 rounding of the rest, so that
 * hi hi' + hi lo' + lo hi' carries about 21 bits of each product. */
static __device__ __forceinline__ float2 ssd_split(float v) {
  const float hi = ssd_tf32(v);
  return make_float2(hi, ssd_tf32(v - hi));
}

/* v as a (hi, lo) pair: split (SPLIT), or its TF32 rounding and 0 */
template <bool SPLIT> static __device__ __forceinline__ float2 ssd_pair(float v) {
  return SPLIT ? ssd_split(v) : make_float2(ssd_tf32(v), 0.0f);
}

/* Stores the fetched quads, one 16-byte store per plane and quad (the lo plane only when
 * SPLIT). */
template <bool SPLIT>
static __device__ __forceinline__ void ssd_put(const ssd_opd &o, const float (&v)[4 * SSD_QUADS], float *S) {
  if (o.kind == SSD_SMAT) return;
#pragma unroll
  for (int m = 0; m < SSD_QUADS; m++) {
    int i, kk;
    ssd_quad(o, m, i, kk);
    const float2 e0 = ssd_pair<SPLIT>(v[4 * m]), e1 = ssd_pair<SPLIT>(v[4 * m + 1]);
    const float2 e2 = ssd_pair<SPLIT>(v[4 * m + 2]), e3 = ssd_pair<SPLIT>(v[4 * m + 3]);
    float *d = S + (o.kind == SSD_COLS ? kk * SSD_LDK + i : i * SSD_LDI + kk);
    *(float4 *)d = make_float4(e0.x, e1.x, e2.x, e3.x);
    if (SPLIT) *(float4 *)(d + SSD_STAGE) = make_float4(e0.y, e1.y, e2.y, e3.y);
  }
}

/* Element (i, k) of the operand as a (hi, lo) pair, for k in the current round
 * [k0, k0 + SSD_KT) (kk = k - k0): from its staging buffer, or read and rounded from its
 * shared matrix. Without SPLIT lo is 0 and never read. */
template <bool SPLIT>
static __device__ __forceinline__ float2 ssd_elem(const ssd_opd &o, const float *S, int i, int k0, int kk) {
  if (o.kind != SSD_SMAT) {
    const float *e = S + (o.kind == SSD_COLS ? kk * SSD_LDK + i : i * SSD_LDI + kk);
    return make_float2(e[0], SPLIT ? e[SSD_STAGE] : 0.0f);
  }
  const int k = k0 + kk;
  const float v = i < o.ni && k < o.nk ? o.p[o.trans ? i + k * o.ld : i * o.ld + k] : 0.0f;
  return ssd_pair<SPLIT>(v);
}

/* d += a b for one 16 x 8 x 8 tile in TF32 (fp32 accumulation) */
static __device__ __forceinline__ void ssd_mma(float (&d)[4], float a0, float a1, float a2, float a3, float b0,
                                               float b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
        "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

/* The tile element (i, j) that acc[r][q] holds: the mma accumulator layout, n-tile r of the
 * warp's 16 x 32 block, fragment entry q (rows g, g + 8; columns 2t, 2t + 1). */
static __device__ __forceinline__ void ssd_ij(int r, int q, int &i, int &j) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  i = (w & 3) * 16 + (lane >> 2) + 8 * (q >> 1);
  j = (w >> 2) * 32 + r * 8 + 2 * (lane & 3) + (q & 1);
}

/* acc += the 64 x 64 tile sum_k a(i, k) b(j, k) over k < a.nk (== b.nk), in the layout of
 * ssd_ij, on tensor cores in split TF32 (SPLIT) or TF32. Staged operands' next columns are
 * fetched while the current ones are multiplied. Starts with a barrier, so shared memory
 * written before the call (matrices, scales) is visible to it. */
template <bool SPLIT>
static __device__ __forceinline__ void ssd_mm(float (&acc)[4][4], const ssd_opd &a, const ssd_opd &b, float *As,
                                              float *Bs) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
  const int m0 = (w & 3) * 16 + g, n0 = (w >> 2) * 32 + g;
  float va[4 * SSD_QUADS], vb[4 * SSD_QUADS];
  __syncthreads();
  ssd_fetch(a, 0, va);
  ssd_fetch(b, 0, vb);
  for (int k0 = 0; k0 < a.nk; k0 += SSD_KT) {
    __syncthreads();
    ssd_put<SPLIT>(a, va, As);
    ssd_put<SPLIT>(b, vb, Bs);
    __syncthreads();
    if (k0 + SSD_KT < a.nk) {
      ssd_fetch(a, k0 + SSD_KT, va);
      ssd_fetch(b, k0 + SSD_KT, vb);
    }
#pragma unroll 1 /* no faster unrolled (0.608-0.612 against 0.615 ms), and fewer registers */
    for (int k8 = 0; k8 < SSD_KT; k8 += 8) {
      const float2 a0 = ssd_elem<SPLIT>(a, As, m0, k0, k8 + t), a1 = ssd_elem<SPLIT>(a, As, m0 + 8, k0, k8 + t);
      const float2 a2 = ssd_elem<SPLIT>(a, As, m0, k0, k8 + t + 4);
      const float2 a3 = ssd_elem<SPLIT>(a, As, m0 + 8, k0, k8 + t + 4);
      float2 b0[4], b1[4];
#pragma unroll
      for (int r = 0; r < 4; r++)
        b0[r] = ssd_elem<SPLIT>(b, Bs, n0 + 8 * r, k0, k8 + t), b1[r] = ssd_elem<SPLIT>(b, Bs, n0 + 8 * r, k0, k8 + t + 4);
      /* the small terms first; the four n-tiles between dependent products */
      if (SPLIT) {
#pragma unroll
        for (int r = 0; r < 4; r++) ssd_mma(acc[r], a0.y, a1.y, a2.y, a3.y, b0[r].x, b1[r].x);
#pragma unroll
        for (int r = 0; r < 4; r++) ssd_mma(acc[r], a0.x, a1.x, a2.x, a3.x, b0[r].y, b1[r].y);
      }
#pragma unroll
      for (int r = 0; r < 4; r++) ssd_mma(acc[r], a0.x, a1.x, a2.x, a3.x, b0[r].x, b1[r].x);
    }
  }
}

/* o[i ld + j] = acc for the thread's outputs with i < rows, j < cols */
static __device__ __forceinline__ void ssd_store(const float (&acc)[4][4], float *o, int64_t ld, int rows, int cols) {
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int i, j;
      ssd_ij(r, q, i, j);
      if (i < rows && j < cols) o[i * ld + j] = acc[r][q];
    }
}

static __device__ __forceinline__ void ssd_zero(float (&acc)[4][4]) {
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int q = 0; q < 4; q++) acc[r][q] = 0.0f;
}

/* out[j] += scale[j] * (row j of X, columns p0 .. p0 + np, dotted with row j of the tile T
 * held as in ssd_ij), for j < len (scale NULL: 1). A row's 64 columns lie in two warps: each
 * sums its half over the four lanes that share the row, the halves meet in red (2 x SSD_L
 * floats of shared memory) and are added in a fixed order. Every thread must call it. */
static __device__ __forceinline__ void ssd_row_dots(float *out, const float *scale, const float *X, int xs, int p0,
                                                    int len, int np, const float (&T)[4][4], float *red) {
  float part[2] = {0.0f, 0.0f};
  int i = 0, p = 0;
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      ssd_ij(r, q, i, p);
      if (i < len && p < np) part[q >> 1] += X[i * xs + p0 + p] * T[r][q];
    }
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    part[h] += __shfl_xor_sync(0xffffffffu, part[h], 1);
    part[h] += __shfl_xor_sync(0xffffffffu, part[h], 2);
    if ((lane & 3) == 0) red[(w >> 2) * SSD_L + (w & 3) * 16 + (lane >> 2) + 8 * h] = part[h];
  }
  __syncthreads();
  const int j = threadIdx.x;
  if (j < len) out[j] += (scale ? scale[j] : 1.0f) * (red[j] + red[SSD_L + j]);
  __syncthreads();
}

/* Shared memory of a chunk block, in floats: the two staging buffers of (hi, lo) pairs, cum (double), vectors
 * of SSD_L, then SSD_MS-strided L x L matrices. */
#define SSD_OFF_CUM (2 * 2 * SSD_STAGE)
#define SSD_OFF_VEC (SSD_OFF_CUM + 2 * SSD_L)
#define SSD_NVEC 10
#define SSD_OFF_MAT (SSD_OFF_VEC + SSD_NVEC * SSD_L + SSD_THREADS)
static size_t ssd_smem(int mats) { return (size_t)(SSD_OFF_MAT + mats * SSD_L * SSD_MS) * sizeof(float); }

struct ssd_chunk {
  int s, h, c, len;
  int64_t row0, idx; /* first row of the chunk; (sequence, head, chunk) index */
  float A;
  double *cum;
  float *dt, *ec, *ew; /* dt_i, e^{cum_i}, e^{cum_last - cum_i}; zero past len */
};

/* Reads the chunk's dt, scans cum in double (one warp, two steps per lane) and the decays
 * to the chunk's start and end. Ends with a barrier. */
static __device__ ssd_chunk ssd_setup(float *sm, const float *dt, const float *A_log, int c, int T, int Hm, int nch) {
  ssd_chunk k;
  k.c = c, k.h = blockIdx.y, k.s = blockIdx.z;
  k.row0 = (int64_t)k.s * T + (int64_t)c * SSD_L;
  k.len = min(SSD_L, T - c * SSD_L);
  k.idx = ((int64_t)k.s * Hm + k.h) * nch + c;
  k.A = -expf(A_log[k.h]);
  k.cum = (double *)(sm + SSD_OFF_CUM);
  k.dt = sm + SSD_OFF_VEC, k.ec = k.dt + SSD_L, k.ew = k.ec + SSD_L;
  const int tid = threadIdx.x;
  if (tid < SSD_L) k.dt[tid] = tid < k.len ? dt[(k.row0 + tid) * Hm + k.h] : 0.0f;
  __syncthreads();
  if (tid < 32) {
    const double v0 = (double)(k.dt[2 * tid] * k.A), v1 = (double)(k.dt[2 * tid + 1] * k.A);
    double inc = v0 + v1;
    for (int o = 1; o < 32; o <<= 1) {
      const double u = __shfl_up_sync(0xffffffffu, inc, o);
      if (tid >= o) inc += u;
    }
    double ex = __shfl_up_sync(0xffffffffu, inc, 1);
    if (tid == 0) ex = 0.0;
    k.cum[2 * tid] = ex + v0;
    k.cum[2 * tid + 1] = ex + v0 + v1;
  }
  __syncthreads();
  if (tid < SSD_L) {
    const bool in = tid < k.len;
    k.ec[tid] = in ? expf((float)k.cum[tid]) : 0.0f;
    k.ew[tid] = in ? expf((float)(k.cum[k.len - 1] - k.cum[tid])) : 0.0f;
  }
  __syncthreads();
  return k;
}

/* e^{cum_i - cum_j} for j <= i < len, else 0 */
static __device__ __forceinline__ float ssd_decay(const ssd_chunk &k, int i, int j) {
  return j <= i && i < k.len ? expf((float)(k.cum[i] - k.cum[j])) : 0.0f;
}

/* Chunk-local end states out[p][n] = sum_j w_j X_j[p] Bm_j[n] of chunk c = blockIdx.x + c0,
 * with w_j = e^{cum_last - cum_j} dt_j (rev = 0: X = x, Bm = B) or w_j = e^{cum_j}
 * (rev = 1: X = dy, Bm = C, the adjoint's chunk-local part). Also the chunk's total
 * exponent tot = cum_last. */
template <bool SPLIT>
__global__ void __launch_bounds__(SSD_THREADS, SSD_MINB_STATES)
    k_ssd_states(const float *X, const float *Bm, const float *dt, const float *A_log, int T, int Hm, int P, int N,
                 int nch, int rev, float *out, float *tot) {
  extern __shared__ float4 ssd_sm4[];
  float *sm = (float *)ssd_sm4;
  float *As = sm, *Bs = sm + 2 * SSD_STAGE;
  const ssd_chunk k = ssd_setup(sm, dt, A_log, blockIdx.x + rev, T, Hm, nch);
  float *w = k.ew + SSD_L;
  if (threadIdx.x < SSD_L) w[threadIdx.x] = rev ? k.ec[threadIdx.x] : k.ew[threadIdx.x] * k.dt[threadIdx.x];
  const int64_t xs = (int64_t)Hm * P;
  const float *Xc = X + k.row0 * xs + (int64_t)k.h * P, *Bc = Bm + k.row0 * N;
  float *o = out + k.idx * P * N;
  for (int p0 = 0; p0 < P; p0 += SSD_L)
    for (int n0 = 0; n0 < N; n0 += SSD_L) {
      float acc[4][4];
      ssd_zero(acc);
      ssd_mm<SPLIT>(acc, ssd_cols(Xc + p0, xs, min(SSD_L, P - p0), k.len, nullptr, w),
             ssd_cols(Bc + n0, N, min(SSD_L, N - n0), k.len), As, Bs);
      ssd_store(acc, o + (int64_t)p0 * N + n0, N, P - p0, N - n0);
    }
  if (threadIdx.x == 0) tot[k.idx] = (float)k.cum[SSD_L - 1];
}

/* The pass over chunks, one thread per (sequence, head, state element): buf holds the
 * chunk-local parts and is overwritten with the state entering each chunk (rev = 0), or
 * with the adjoint leaving each chunk (rev = 1, chunks in reverse). */
#define SSD_PASS_G 8 /* chunks whose inputs are loaded together */
__global__ void k_ssd_pass(float *buf, const float *tot, int nch, int64_t PN, int rev) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= PN) return;
  const int64_t sh = (int64_t)blockIdx.z * gridDim.y + blockIdx.y;
  float *b = buf + sh * nch * PN + e;
  const float *tt = tot + sh * nch;
  float S = 0.0f;
  /* the last chunk in pass order has no successor: its part is neither read nor needed */
  for (int m0 = 0; m0 < nch; m0 += SSD_PASS_G) {
    float u[SSD_PASS_G], a[SSD_PASS_G];
#pragma unroll
    for (int g = 0; g < SSD_PASS_G; g++) {
      const int m = m0 + g, c = rev ? nch - 1 - m : m;
      const bool live = m < nch - 1;
      u[g] = live ? b[c * PN] : 0.0f;
      a[g] = live ? tt[c] : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < SSD_PASS_G; g++) {
      const int m = m0 + g, c = rev ? nch - 1 - m : m;
      if (m >= nch) break;
      b[c * PN] = S;
      S = expf(a[g]) * S + u[g];
    }
  }
}

/* y of one chunk: e^{cum_i} C_i S_in^T + ((C B^T) o decay) (dt o x) + D x. */
template <bool SPLIT>
__global__ void __launch_bounds__(SSD_THREADS, SSD_MINB_FWD)
    k_ssd_y(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D,
            const float *states, int T, int Hm, int P, int N, int nch, float *y) {
  extern __shared__ float4 ssd_sm4[];
  float *sm = (float *)ssd_sm4;
  float *As = sm, *Bs = sm + 2 * SSD_STAGE;
  float *sM = sm + SSD_OFF_MAT;
  const ssd_chunk k = ssd_setup(sm, dt, A_log, blockIdx.x, T, Hm, nch);
  const int64_t xs = (int64_t)Hm * P;
  const float *xc = x + k.row0 * xs + (int64_t)k.h * P, *Bc = B + k.row0 * N, *Cc = C + k.row0 * N;
  const float *S0 = states + k.idx * P * N;
  float *yc = y + k.row0 * xs + (int64_t)k.h * P;
  float acc[4][4];
  ssd_zero(acc);
  ssd_mm<SPLIT>(acc, ssd_rows(Cc, N, k.len, N), ssd_rows(Bc, N, k.len, N), As, Bs);
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int i, j;
      ssd_ij(r, q, i, j);
      sM[i * SSD_MS + j] = acc[r][q] * ssd_decay(k, i, j) * k.dt[j];
    }
  const float Dh = D[k.h];
  for (int p0 = 0; p0 < P; p0 += SSD_L) {
    const int np = min(SSD_L, P - p0);
    ssd_zero(acc);
    if (k.c > 0) ssd_mm<SPLIT>(acc, ssd_rows(Cc, N, k.len, N, k.ec), ssd_rows(S0 + (int64_t)p0 * N, N, np, N), As, Bs);
    ssd_mm<SPLIT>(acc, ssd_smat(sM, SSD_MS, false, k.len, k.len), ssd_cols(xc + p0, xs, np, k.len), As, Bs);
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        int i, p;
        ssd_ij(r, q, i, p);
        if (i < k.len && p < np) yc[i * xs + p0 + p] = acc[r][q] + Dh * xc[i * xs + p0 + p];
      }
  }
}

/* The gradient of one chunk (formulas at the top), given the state entering it (S0) and the
 * adjoint leaving it (dSo). dx and ddt are added in place; dB and dC go to this head's
 * partial rows, dA_log and dD to this chunk's partial pair. */
template <bool SPLIT>
__global__ void __launch_bounds__(SSD_THREADS, SSD_MINB_BWD)
    k_ssd_bwd(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D,
              const float *dy, const float *states, const float *dstates, int T, int Hm, int P, int N, int nch,
              float *dx, float *ddt, float *partB, float *partC, double *partAD) {
  extern __shared__ float4 ssd_sm4[];
  float *sm = (float *)ssd_sm4;
  float *As = sm, *Bs = sm + 2 * SSD_STAGE;
  float *sG = sm + SSD_OFF_MAT, *sK = sG + SSD_L * SSD_MS, *sQ = sK + SSD_L * SSD_MS;
  const ssd_chunk k = ssd_setup(sm, dt, A_log, blockIdx.x, T, Hm, nch);
  float *ewdt = k.ew + SSD_L, *sv = ewdt + SSD_L, *sR = sv + SSD_L, *sdir = sR + SSD_L, *sdd = sdir + SSD_L,
        *sda = sdd + SSD_L, *sred = sda + SSD_L;
  const int tid = threadIdx.x;
  if (tid < SSD_L) {
    ewdt[tid] = k.ew[tid] * k.dt[tid];
    sv[tid] = sR[tid] = 0.0f;
  }
  const int64_t xs = (int64_t)Hm * P, PN = (int64_t)P * N, nrows = (int64_t)gridDim.z * T;
  const float *xc = x + k.row0 * xs + (int64_t)k.h * P, *dyc = dy + k.row0 * xs + (int64_t)k.h * P;
  const float *Bc = B + k.row0 * N, *Cc = C + k.row0 * N;
  const float *S0 = states + k.idx * PN, *dSo = dstates + k.idx * PN;
  float *dxc = dx + k.row0 * xs + (int64_t)k.h * P;
  const bool has_in = k.c > 0, has_out = k.c < nch - 1;
  float acc[4][4], db[4][4];

  /* G = C B^T, then K = (dY X^T) o decay (kept as K_ij dt_j), M = G o decay (over G), and K o G */
  ssd_zero(acc);
  ssd_mm<SPLIT>(acc, ssd_rows(Cc, N, k.len, N), ssd_rows(Bc, N, k.len, N), As, Bs);
  ssd_store(acc, sG, SSD_MS, SSD_L, SSD_L);
  ssd_zero(acc);
  ssd_mm<SPLIT>(acc, ssd_rows(dyc, xs, k.len, P), ssd_rows(xc, xs, k.len, P), As, Bs);
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int i, j;
      ssd_ij(r, q, i, j);
      const int o = i * SSD_MS + j;
      const float d = ssd_decay(k, i, j), kk = acc[r][q] * d, g = sG[o];
      sK[o] = kk * k.dt[j]; /* both products with K take it times dt of its column */
      sQ[o] = kk * g;
      sG[o] = g * d;
      if (i == j) sdd[i] = acc[r][q]; /* dy_i . x_i, for dD */
    }
  __syncthreads();
  /* suffix sums down each column of K o G: sQ[k][j] = sum_{i >= k} K_ij G_ij */
  if (tid < SSD_L) {
    float run = 0.0f;
    for (int i = SSD_L - 1; i >= tid; i--) {
      run += sQ[i * SSD_MS + tid];
      sQ[i * SSD_MS + tid] = run;
    }
    sdir[tid] = run;
  }

  const float Dh = D[k.h];
  for (int p0 = 0; p0 < P; p0 += SSD_L) {
    const int np = min(SSD_L, P - p0);
    /* DB = B dS_out^T, its dot with x for ddt and da, then dx */
    ssd_zero(db);
    if (has_out) ssd_mm<SPLIT>(db, ssd_rows(Bc, N, k.len, N), ssd_rows(dSo + (int64_t)p0 * N, N, np, N), As, Bs);
    ssd_row_dots(sv, NULL, xc, xs, p0, k.len, np, db, sred);
    ssd_zero(acc);
    ssd_mm<SPLIT>(acc, ssd_smat(sG, SSD_MS, true, k.len, k.len), ssd_cols(dyc + p0, xs, np, k.len), As, Bs);
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        int j, p;
        ssd_ij(r, q, j, p);
        if (j < k.len && p < np) {
          const int64_t o = j * xs + p0 + p;
          dxc[o] += k.dt[j] * acc[r][q] + ewdt[j] * db[r][q] + Dh * dyc[o];
        }
      }
    /* R_i = e^{cum_i} dy_i . (S_in C_i) */
    if (has_in) {
      ssd_zero(acc);
      ssd_mm<SPLIT>(acc, ssd_rows(Cc, N, k.len, N), ssd_rows(S0 + (int64_t)p0 * N, N, np, N), As, Bs);
      ssd_row_dots(sR, k.ec, dyc, xs, p0, k.len, np, acc, sred);
    }
  }

  float *pC = partC + ((int64_t)k.h * nrows + k.row0) * N, *pB = partB + ((int64_t)k.h * nrows + k.row0) * N;
  for (int n0 = 0; n0 < N; n0 += SSD_L) {
    const int nn = min(SSD_L, N - n0);
    ssd_zero(acc);
    ssd_mm<SPLIT>(acc, ssd_smat(sK, SSD_MS, false, k.len, k.len), ssd_cols(Bc + n0, N, nn, k.len), As, Bs);
    if (has_in) ssd_mm<SPLIT>(acc, ssd_rows(dyc, xs, k.len, P, k.ec), ssd_cols(S0 + n0, N, nn, P), As, Bs);
    ssd_store(acc, pC + n0, N, k.len, nn);
    ssd_zero(acc);
    ssd_mm<SPLIT>(acc, ssd_smat(sK, SSD_MS, true, k.len, k.len), ssd_cols(Cc + n0, N, nn, k.len), As, Bs);
    if (has_out) ssd_mm<SPLIT>(acc, ssd_rows(xc, xs, k.len, P, ewdt), ssd_cols(dSo + n0, N, nn, P), As, Bs);
    ssd_store(acc, pB + n0, N, k.len, nn);
  }

  /* Z = e^{cum_last} <dS_out, S_in>: every a_k of the chunk decays the carried state */
  float z = 0.0f;
  if (has_in && has_out)
    for (int64_t e = tid; e < PN; e += SSD_THREADS) z += dSo[e] * S0[e];
  sred[tid] = z;
  __syncthreads();
  for (int w = SSD_THREADS / 2; w > 0; w >>= 1) {
    if (tid < w) sred[tid] += sred[tid + w];
    __syncthreads();
  }
  const float Z = sred[0] * k.ec[k.len - 1];
  if (tid < SSD_L) {
    const int kq = tid;
    float da = 0.0f;
    if (kq < k.len) {
      da = Z;
      for (int i = kq; i < k.len; i++) da += sR[i];
      for (int j = 0; j < kq; j++) da += ewdt[j] * sv[j] + k.dt[j] * sQ[kq * SSD_MS + j];
      ddt[(k.row0 + kq) * Hm + k.h] += sdir[kq] + k.ew[kq] * sv[kq] + k.A * da;
    }
    sda[kq] = k.dt[kq] * da;
  }
  __syncthreads();
  if (tid == 0) {
    double a = 0.0, d = 0.0;
    for (int i = 0; i < k.len; i++) a += sda[i], d += sdd[i];
    partAD[2 * k.idx] = (double)k.A * a;
    partAD[2 * k.idx + 1] = d;
  }
}

/* dB, dC += the per-head partial rows, summed over heads in order */
__global__ void k_ssd_rows(const float *partB, const float *partC, int64_t rowsN, int Hm, float *dB, float *dC) {
  MC_CU_FOR(e, rowsN) {
    float sb = 0.0f, sc = 0.0f;
    for (int h = 0; h < Hm; h++) sb += partB[h * rowsN + e], sc += partC[h * rowsN + e];
    dB[e] += sb;
    dC[e] += sc;
  }
}

/* dA_log, dD += the per-chunk partial pairs of each head, one warp per head: each lane sums
 * a fixed stride of (sequence, chunk) in order, then a fixed shuffle tree (deterministic). */
__global__ void k_ssd_heads(const double *partAD, int n_seq, int Hm, int nch, float *dA_log, float *dD) {
  const int h = blockIdx.x, lane = threadIdx.x;
  double a = 0.0, d = 0.0;
  for (int64_t q = lane; q < (int64_t)n_seq * nch; q += 32) {
    const int64_t idx = ((q / nch) * Hm + h) * nch + q % nch;
    a += partAD[2 * idx], d += partAD[2 * idx + 1];
  }
  a = mc_d_warp_sumd(a);
  d = mc_d_warp_sumd(d);
  if (lane == 0) {
    dA_log[h] += (float)a;
    dD[h] += (float)d;
  }
}

static int ssd_args_ok(mc_backend *be, const char *op, int n_seq, int T, int Hm, int P, int N) {
  if (n_seq <= 0 || T <= 0 || Hm <= 0 || P <= 0) return 0;
  if (N <= 0 || n_seq > 65535 || Hm > 65535) {
    mc_cuda_fail(be, "%s: unsupported shape n_seq=%d heads=%d state=%d (n_seq, heads <= 65535, state >= 1)", op,
                 n_seq, Hm, N);
    return 0;
  }
  /* tile offsets inside a chunk are ints (ssd_opd) */
  if ((int64_t)SSD_L * Hm * P > INT32_MAX || (int64_t)P * N > INT32_MAX || (int64_t)SSD_L * N > INT32_MAX) {
    mc_cuda_fail(be, "%s: unsupported shape heads=%d head_dim=%d state=%d (64 x heads x head_dim and head_dim x state "
                 "must stay below 2^31)", op, Hm, P, N);
    return 0;
  }
  return 1;
}

static size_t ssd_round(size_t b) { return (b + 255) / 256 * 256; }

/* Shared memory over 48 KB must be allowed per kernel before its launch. */
static int ssd_allow(mc_backend *be, const void *kernel, size_t smem, const char *op) {
  if (smem <= 48 * 1024) return 1;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess) return 1;
  cudaGetLastError();
  mc_cuda_fail(be, "%s: %zu bytes of shared memory: %s", op, smem, cudaGetErrorString(e));
  return 0;
}

/* Chunk-local parts of chunks [rev, nch - 1 + rev) and the pass over chunks: buf ends up with
 * the state entering each chunk (rev = 0) or the adjoint leaving it (rev = 1). */
template <bool SPLIT>
static void ssd_carry(mc_backend *be, const float *X, const float *Bm, const float *dt, const float *A_log, int n_seq,
                      int T, int Hm, int P, int N, int nch, int rev, float *buf, float *tot) {
  cudaStream_t st = mc_cu_stream(be);
  const int64_t PN = (int64_t)P * N;
  if (nch > 1)
    k_ssd_states<SPLIT><<<dim3((unsigned)(nch - 1), (unsigned)Hm, (unsigned)n_seq), SSD_THREADS, ssd_smem(0), st>>>(
        X, Bm, dt, A_log, T, Hm, P, N, nch, rev, buf, tot);
  k_ssd_pass<<<dim3((unsigned)((PN + 255) / 256), (unsigned)Hm, (unsigned)n_seq), 256, 0, st>>>(buf, tot, nch, PN,
                                                                                                rev);
}

template <bool SPLIT>
static void ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, int n_seq, int T, int Hm, int P, int N, float *y) {
  if (!ssd_args_ok(be, "ssm_fwd", n_seq, T, Hm, P, N)) return;
  const int nch = (T + SSD_L - 1) / SSD_L;
  const size_t nsc = (size_t)n_seq * Hm * nch;
  const size_t sb = ssd_round(nsc * P * N * sizeof(float));
  char *scr = (char *)mc_cuda_scratch(be, sb + nsc * sizeof(float), "ssm_fwd");
  if (!scr || !ssd_allow(be, (const void *)k_ssd_y<SPLIT>, ssd_smem(1), "ssm_fwd")) return;
  float *states = (float *)scr, *tot = (float *)(scr + sb);
  if (nch > 1) ssd_carry<SPLIT>(be, x, B, dt, A_log, n_seq, T, Hm, P, N, nch, 0, states, tot);
  k_ssd_y<SPLIT><<<dim3((unsigned)nch, (unsigned)Hm, (unsigned)n_seq), SSD_THREADS, ssd_smem(1), mc_cu_stream(be)>>>(
      x, dt, A_log, B, C, D, states, T, Hm, P, N, nch, y);
  mc_cuda_check(be, "ssm_fwd");
}

template <bool SPLIT>
static void ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, const float *dy, int n_seq, int T, int Hm, int P, int N,
                       float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD) {
  if (!ssd_args_ok(be, "ssm_bwd", n_seq, T, Hm, P, N)) return;
  const int nch = (T + SSD_L - 1) / SSD_L;
  const size_t nsc = (size_t)n_seq * Hm * nch, rowsN = (size_t)n_seq * T * N;
  const size_t sb = ssd_round(nsc * P * N * sizeof(float)), tb = ssd_round(nsc * sizeof(float));
  const size_t pb = ssd_round((size_t)Hm * rowsN * sizeof(float)), ab = ssd_round(2 * nsc * sizeof(double));
  char *scr = (char *)mc_cuda_scratch(be, 2 * sb + tb + 2 * pb + ab, "ssm_bwd");
  if (!scr || !ssd_allow(be, (const void *)k_ssd_bwd<SPLIT>, ssd_smem(3), "ssm_bwd")) return;
  float *states = (float *)scr, *dstates = (float *)(scr + sb), *tot = (float *)(scr + 2 * sb);
  float *partB = (float *)(scr + 2 * sb + tb), *partC = (float *)(scr + 2 * sb + tb + pb);
  double *partAD = (double *)(scr + 2 * sb + tb + 2 * pb);
  cudaStream_t st = mc_cu_stream(be);
  if (nch > 1) {
    ssd_carry<SPLIT>(be, x, B, dt, A_log, n_seq, T, Hm, P, N, nch, 0, states, tot);
    ssd_carry<SPLIT>(be, dy, C, dt, A_log, n_seq, T, Hm, P, N, nch, 1, dstates, tot);
  }
  k_ssd_bwd<SPLIT><<<dim3((unsigned)nch, (unsigned)Hm, (unsigned)n_seq), SSD_THREADS, ssd_smem(3), st>>>(
      x, dt, A_log, B, C, D, dy, states, dstates, T, Hm, P, N, nch, dx, ddt, partB, partC, partAD);
  k_ssd_rows<<<mc_cu_grid((int64_t)rowsN), MC_CUDA_THREADS, 0, st>>>(partB, partC, (int64_t)rowsN, Hm, dB, dC);
  k_ssd_heads<<<(unsigned)Hm, 32, 0, st>>>(partAD, n_seq, Hm, nch, dA_log, dD);
  mc_cuda_check(be, "ssm_bwd");
}

/* Split TF32 on the fp32 instance, TF32 on the bf16 one (the header says why). */
static void cu_ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, int n_seq, int T, int Hm, int P, int N, float *y) {
  (mc_cu(be)->bf16_gemm ? ssm_fwd<false> : ssm_fwd<true>)(be, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
}

static void cu_ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, const float *dy, int n_seq, int T, int Hm, int P, int N,
                       float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD) {
  (mc_cu(be)->bf16_gemm ? ssm_bwd<false> : ssm_bwd<true>)(be, x, dt, A_log, B, C, D, dy, n_seq, T, Hm, P, N, dx, ddt,
                                                          dA_log, dB, dC, dD);
}

void mc_cuda_install_ssm(mc_backend *be) {
  be->ssm_fwd = cu_ssm_fwd;
  be->ssm_bwd = cu_ssm_bwd;
}
