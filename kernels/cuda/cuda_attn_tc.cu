/* Causal GQA attention on bf16 tensor cores, for the bf16 instance (mc_backend_cuda_bf16),
 * head_dim 64 or 128; cuda_attn.cu dispatches here and keeps its fp32 kernels for the rest.
 * FlashAttention-2's structure on Hopper's warpgroup products (wgmma, kernels/cuda/cuda_wgmma.h:
 * bf16 operands, fp32 accumulation): each warpgroup of 4 warps owns 64 rows of a tile, its
 * products read their shared operands from shared memory once per warpgroup (mma.sync read
 * them once per warp), and probabilities and score gradients feed the next product from
 * registers. Tiles come in by cp.async in the 128-byte-swizzled "halves" layout the products
 * read (the next tile loads during a tile's products; one barrier per tile).
 * - Forward: a block of FW_WG warpgroups owns 64 FW_WG query rows of one head and walks the
 *   key/value tiles up to its diagonal. Online softmax in fp32 (exp2 with the scale folded
 *   in), probabilities rounded to bf16 for the P V product. An fp32 q is converted while it
 *   is loaded (read once); k and v are read once per query tile, so one pre-pass rounds fp32
 *   ones to bf16 into scratch.
 * - Backward: one pre-pass (one launch) rounds the fp32 ones of q, k, v, dout to bf16 and
 *   computes D = rowsum(out * dout) in fp32; then one kernel owns dk, dv (64 keys of a kv head
 *   per block, walking the query tiles of every head of its group, or of one head when such
 *   blocks would be too few, the group's partial sums then added in order by k_tc_parts) and
 *   one owns dq (64 DQ_WG query rows per block, walking key tiles), both recomputing
 *   p = exp(s - lse) from the saved lse: no atomics, so the result does not depend on timing.
 *   Seven products instead of five (s and dp twice).
 * Operands come stored in fp32 or bf16 (the _ex entry points; the fp32 ones wrap them): bf16
 * ones are read as they are, which skips their share of the rounding pre-passes and gives the
 * bits the fp32 entry points give on the same values. out may be written in bf16.
 * Softmax statistics, lse, D and every output stay fp32; backward ADDS, as the op contract
 * says. Formulas as in kernels/cpu/cpu_attn.c. The kernels need sm_90a (CMakeLists.txt); built
 * for anything else they trap. */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_wgmma.h"

typedef __nv_bfloat16 bf16;

/* Defined in cuda_attn.cu: raises a kernel's dynamic shared-memory limit when above 48 KB. */
int mc_cuda_attn_smem_ok(mc_backend *be, const void *kernel, size_t bytes, const char *op);

#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* ------------------------------------------------------------------ PTX wrappers */
static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bypassing L1; zero-filled when !valid (nothing is read). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* 4 bytes global -> shared (through L1: .cg takes only 16); zero-filled when !valid. */
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* 2^x in one MUFU instruction (ex2.approx: about 2 ulp; 2^-inf = 0). */
static __device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo */
  return *(uint32_t *)&v;
}

/* The two bf16 of a packed pair as floats (exact): .x from the low half. */
static __device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

/* Rows [r0, r0 + rows) of head `head` from a bf16 tensor (row stride `stride` elements) into
 * a halves tile (cuda_wgmma.h), asynchronously; rows at or past T are zero. */
template <int HD>
static __device__ __forceinline__ void tile_async(uint32_t tile, const bf16 *src, int64_t seq_row0, int r0, int rows,
                                                  int T, int64_t stride, int head) {
  constexpr int CH = HD / 8;
  for (int idx = threadIdx.x; idx < rows * CH; idx += blockDim.x) {
    const int r = idx / CH, c = idx % CH, t = r0 + r;
    const bf16 *p = src + (seq_row0 + (t < T ? t : 0)) * stride + (int64_t)head * HD + 8 * c;
    cp_async16(tile + wg_off(rows, r, c), p, t < T);
  }
}

/* The same rows (ROWS from r0, by THREADS threads) from an fp32 tensor rounded to bf16 into a
 * halves tile (generic pointer), synchronously: for tiles read once per block. Up to 8 chunks
 * per thread are loaded before the first is stored, so their latencies overlap. */
template <int HD, int ROWS, int THREADS>
static __device__ __forceinline__ void tile_convert(char *tile, const float *src, int64_t seq_row0, int r0, int T,
                                                    int64_t stride, int head) {
  constexpr int CH = HD / 8, N = ROWS * CH / THREADS, B = N < 8 ? N : 8;
  static_assert(N * THREADS == ROWS * CH && N % B == 0, "tile_convert: chunks must split evenly over the threads");
#pragma unroll
  for (int n0 = 0; n0 < N; n0 += B) {
    float4 a[B], b[B];
#pragma unroll
    for (int u = 0; u < B; u++) {
      const int idx = threadIdx.x + (n0 + u) * THREADS, r = idx / CH, c = idx % CH, t = r0 + r;
      a[u] = b[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < T) {
        const float4 *p = (const float4 *)(src + (seq_row0 + t) * stride + (int64_t)head * HD + 8 * c);
        a[u] = p[0], b[u] = p[1];
      }
    }
#pragma unroll
    for (int u = 0; u < B; u++) {
      const int idx = threadIdx.x + (n0 + u) * THREADS, r = idx / CH, c = idx % CH;
      *(uint4 *)(tile + wg_off(ROWS, r, c)) = make_uint4(pack_bf16(a[u].x, a[u].y), pack_bf16(a[u].z, a[u].w),
                                                         pack_bf16(b[u].x, b[u].y), pack_bf16(b[u].z, b[u].w));
    }
  }
}

/* Blocks are dispatched roughly in index order, and causal tiles differ in length (the
 * last query tile has T / 64 key tiles, the first one). The grids are 1-D with the tile
 * index slowest, so every head's longest tiles start first and the short ones fill in at
 * the end (largest first), instead of each head's long tiles coming in turn. */

/* ------------------------------------------------------------------ forward */
/* FW_WG warpgroups per block, each owning 64 query rows (16 per warp), walk the key/value
 * tiles of BK keys up to the block's diagonal: s = q k^T by wgmma from shared memory (both
 * K-major), the online softmax on the accumulators, then o += p v with p as register A
 * fragments (rounded to bf16) and the v tile read MN-major. */
#ifndef FW_WG
#define FW_WG 2
#endif
#ifndef FW_BK64
#define FW_BK64 64
#endif
#ifndef FW_BK128
#define FW_BK128 128
#endif
/* k, v tiles in flight: NS buffers each, the tile NS - 1 ahead loaded during a tile's products */
#ifndef FW_NS
#define FW_NS 2
#endif

template <int HD>
static constexpr __host__ __device__ int fw_bk() {
  return HD == 128 ? FW_BK128 : FW_BK64;
}

template <int HD>
static constexpr size_t fwd_smem() {
  return 1024 + (size_t)(64 * FW_WG + 2 * FW_NS * fw_bk<HD>()) * HD * 2; /* slack, q, FW_NS k and FW_NS v tiles */
}

/* q from fp32 (q32, rounded while loaded) or bf16 (qh) storage, by QB; out to fp32 (out) or,
 * where out is NULL, to bf16 (outh, rounded to nearest even). */
template <int HD, bool QB>
__global__ void __launch_bounds__(FW_WG * 128, 1)
    k_fa_fwd(const float *__restrict__ q32, const bf16 *__restrict__ qh, const bf16 *__restrict__ kb,
             const bf16 *__restrict__ vb, int T, int H, int KV, float sl2, float *__restrict__ out,
             bf16 *__restrict__ outh, float *__restrict__ lse) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BQ = 64 * FW_WG, BK = fw_bk<HD>(), NS = FW_NS; /* query rows per block */
  extern __shared__ uint4 smem_fwd[];
  const uint32_t raw = smem_addr(smem_fwd), sQ = (raw + 1023) & ~1023u, sK0 = sQ + BQ * HD * 2;
  constexpr uint32_t KVB = BK * HD * 2; /* bytes of one k or v tile */
  const unsigned per_tile = gridDim.x / (unsigned)((T + BQ - 1) / BQ); /* H n_seq */
  const int hs = (int)(blockIdx.x % per_tile), h = hs % H, s = hs / H, kh = h / (H / KV);
  const int q0 = ((T + BQ - 1) / BQ - 1 - (int)(blockIdx.x / per_tile)) * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3, wg = warp / 4;
  const int64_t qs = (int64_t)H * HD, ks = (int64_t)KV * HD, row0 = (int64_t)s * T;
  const int nkt = (min(q0 + BQ, T) - 1) / BK + 1; /* key tiles up to the block's last row */

  /* k tile kt in buffer kt % NS at sK0 + (kt % NS) KVB, v's NS buffers after k's */
  auto load_kv = [&](int kt) {
    if (kt < nkt) {
      tile_async<HD>(sK0 + (kt % NS) * KVB, kb, row0, kt * BK, BK, T, ks, kh);
      tile_async<HD>(sK0 + (NS + kt % NS) * KVB, vb, row0, kt * BK, BK, T, ks, kh);
    }
    cp_async_commit(); /* one group per tile, empty past the end, so the wait below counts tiles */
  };
  if (QB) tile_async<HD>(sQ, qh, row0, q0, BQ, T, qs, h); /* in tile 0's group */
#pragma unroll
  for (int kt = 0; kt < NS - 1; kt++) load_kv(kt);
  if (!QB) tile_convert<HD, BQ, FW_WG * 128>((char *)smem_fwd + (sQ - raw), q32, row0, q0, T, qs, h); /* read once */
  const int iw = q0 + warp * 16, ig = q0 + wg * 64; /* the warp's and its warpgroup's first rows */

  float o[HD / 2];
#pragma unroll
  for (int j = 0; j < HD / 2; j++) o[j] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* m: running max of the raw scores q.k */

  for (int kt = 0; kt < nkt; kt++) {
    const uint32_t sK = sK0 + (kt % NS) * KVB, sV = sK0 + (NS + kt % NS) * KVB;
    cp_async_wait<NS - 2>(); /* this thread's copies of tile kt (and q) have landed */
    fence_async_smem();
    /* everyone's have, and everyone is done with tile kt - 1, whose buffers the next load takes */
    __syncthreads();
    load_kv(kt + NS - 1);
    const int k0 = kt * BK;
    if (k0 <= ig + 63) { /* warpgroup-uniform: otherwise every key of the tile is in the group's future */
      float sc[BK / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<0>(sc, wg_kmajor(sQ, BQ, kk, 64 * wg), wg_kmajor(sK, BK, kk), kk);
      wgmma_commit();
      wgmma_wait<0>();
      wg_pin(sc);
      if (k0 + BK - 1 > iw) { /* some key of the tile is after some row of the warp */
#pragma unroll
        for (int j = 0; j < BK / 8; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) /* causal; also every key >= T for rows < T */
            if (k0 + 8 * j + 2 * t4 + (e & 1) > iw + g + (e >> 1) * 8) sc[4 * j + e] = -INFINITY;
      }
      float mx[2] = {m[0], m[1]}, ms[2], corr[2];
#pragma unroll
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[4 * j + e]);
#pragma unroll
      for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        /* mx finite: key 0 is in the first tile of every row (a tile wholly in a warp's future
         * leaves m as it was). The scale is positive, so the max of the raw scores is the max
         * of the scaled ones. */
        corr[r] = ex2((m[r] - mx[r]) * sl2);
        m[r] = mx[r];
        ms[r] = mx[r] * sl2;
        l[r] *= corr[r];
      }
      uint32_t pa[BK / 16][4];
#pragma unroll
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float p = ex2(fmaf(sc[4 * j + e], sl2, -ms[e >> 1]));
          sc[4 * j + e] = p;
          l[e >> 1] += p; /* this lane's part; the quad's parts are summed at the end */
        }
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) {
        const float *x = sc + 8 * kq;
        pa[kq][0] = pack_bf16(x[0], x[1]), pa[kq][1] = pack_bf16(x[2], x[3]);
        pa[kq][2] = pack_bf16(x[4], x[5]), pa[kq][3] = pack_bf16(x[6], x[7]);
      }
#pragma unroll
      for (int j = 0; j < HD / 8; j++) {
        o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
      }
      wgmma_fence();
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) wgmma_rs<1>(o, pa[kq], wg_mnmajor(sV, BK, kq), 1); /* o += p v */
      wgmma_commit();
      wgmma_wait<0>(); /* before the next load overwrites this v tile's buffer */
      wg_pin(o);
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) wg_pin(pa[kq]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int i = iw + g + 8 * r;
    if (i >= T) continue;
    const float inv = 1.0f / lr;
    const int64_t oi = (row0 + i) * qs + (int64_t)h * HD + 2 * t4;
    if (out)
#pragma unroll
      for (int j = 0; j < HD / 8; j++)
        *(float2 *)(out + oi + 8 * j) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    else
#pragma unroll
      for (int j = 0; j < HD / 8; j++)
        *(uint32_t *)(outh + oi + 8 * j) = pack_bf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    if (t4 == 0) lse[(row0 + i) * H + h] = m[r] * sl2 * TC_LN2 + logf(lr);
  }
#else
  __trap(); /* built for sm_90a only (CMakeLists.txt) */
#endif
}

/* ------------------------------------------------------------------ pre-passes */
/* y0 = bf16(x0) (a0 groups of 8 elements), y1 = bf16(x1) (a1 groups) in one launch; 16-byte
 * aligned. */
__global__ void k_tc_pack2(const float *__restrict__ x0, bf16 *__restrict__ y0, int64_t a0,
                           const float *__restrict__ x1, bf16 *__restrict__ y1, int64_t a1) {
  MC_CU_FOR(i, a0 + a1) {
    const bool second = i >= a0;
    const int64_t j = second ? i - a0 : i;
    const float4 *x = (const float4 *)(second ? x1 : x0) + 2 * j;
    const float4 a = x[0], b = x[1];
    ((uint4 *)(second ? y1 : y0))[j] =
        make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
  }
}

/* 4 elements at o of an operand in either storage, as floats (bf16 widened exactly); 8 or 16
 * bytes aligned. */
static __device__ __forceinline__ float4 ld4(mc_operand x, int64_t o) {
  if (x.f) return *(const float4 *)(x.f + o);
  const uint2 u = *(const uint2 *)(x.h + o);
  const float2 a = unpack_bf16(u.x), b = unpack_bf16(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
/* ... and its bf16 copy at y + o, for an fp32 operand only (a bf16 one is read in place). */
static __device__ __forceinline__ void round4(mc_operand x, float4 a, bf16 *y, int64_t o) {
  if (x.f) *(uint2 *)(y + o) = make_uint2(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w));
}

/* The backward's pre-pass in one launch. Items 0 .. nqi - 1 are (row, head) of q: fp32 q and
 * dout rounded to bf16 and D = out . dout in fp32; items nqi .. nqi + nki - 1 are (row, kv
 * head): fp32 k and v rounded (nki 0 when both are bf16). HD / 4 lanes per item, 4 elements
 * of each tensor per lane. */
template <int HD>
__global__ void k_tc_prep(mc_operand q, mc_operand out, mc_operand dout, mc_operand k, mc_operand v, int64_t nqi,
                          int64_t nki, bf16 *__restrict__ qb, bf16 *__restrict__ dob, float *__restrict__ D,
                          bf16 *__restrict__ kb, bf16 *__restrict__ vb) {
  constexpr int L = HD / 4, IPW = 32 / L; /* lanes per item, items per warp */
  const int lane = threadIdx.x % 32, c = 4 * (lane % L);
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t w = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; w * IPW < nqi + nki; w += nw) {
    const int64_t it = w * IPW + lane / L;
    float s = 0.0f;
    if (it < nqi) {
      const int64_t o = it * HD + c;
      const float4 a = ld4(out, o), b = ld4(dout, o);
      s = a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      round4(dout, b, dob, o);
      if (q.f) round4(q, ld4(q, o), qb, o);
    } else if (it < nqi + nki) {
      const int64_t o = (it - nqi) * HD + c;
      if (k.f) round4(k, ld4(k, o), kb, o);
      if (v.f) round4(v, ld4(v, o), vb, o);
    }
    /* the whole warp shuffles (the loop condition is per warp); the sum stays within an item */
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (it < nqi && lane % L == 0) D[it] = s;
  }
}

/* ------------------------------------------------------------------ backward: dq */
/* WG warpgroups per block, each owning 64 query rows (16 per warp), walk the key tiles of BK
 * keys up to the block's diagonal: s = q k^T and dp = dout v^T by wgmma from shared memory
 * (all K-major), ds = p (dp - D), then dq += ds k with ds as register A fragments and the k
 * tile read MN-major. The k and v tiles are shared by the block's warpgroups. */
#ifndef DQ_WG
#define DQ_WG 2
#endif
#ifndef DQ_BK64
#define DQ_BK64 128
#endif
#ifndef DQ_BK128
#define DQ_BK128 64
#endif
#ifndef DQ_NS
#define DQ_NS 2
#endif

template <int HD>
static constexpr __host__ __device__ int dq_bk() {
  return HD == 128 ? DQ_BK128 : DQ_BK64;
}

template <int HD>
static constexpr size_t dq_smem() {
  /* alignment slack, q, dout, then DQ_NS k and DQ_NS v tiles */
  return 1024 + (size_t)(2 * 64 * DQ_WG + 2 * DQ_NS * dq_bk<HD>()) * HD * 2;
}

template <int HD>
__global__ void __launch_bounds__(DQ_WG * 128, 1)
    k_fa_dq(const bf16 *__restrict__ qb, const bf16 *__restrict__ kb, const bf16 *__restrict__ vb,
            const bf16 *__restrict__ dob, const float *__restrict__ lse, const float *__restrict__ D, int T, int H,
            int KV, float scale, float *__restrict__ dq) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BQ = 64 * DQ_WG, BK = dq_bk<HD>(), NS = DQ_NS; /* query rows per block */
  extern __shared__ uint4 smem_dq[];
  constexpr uint32_t TB = BK * HD * 2;
  const uint32_t sQ = (smem_addr(smem_dq) + 1023) & ~1023u, sO = sQ + BQ * HD * 2, sK0 = sO + BQ * HD * 2;
  const unsigned per_tile = gridDim.x / (unsigned)((T + BQ - 1) / BQ); /* H n_seq */
  const int hs = (int)(blockIdx.x % per_tile), h = hs % H, s = hs / H, kh = h / (H / KV);
  const int q0 = ((T + BQ - 1) / BQ - 1 - (int)(blockIdx.x / per_tile)) * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3, wg = warp / 4;
  const int64_t qs = (int64_t)H * HD, ks = (int64_t)KV * HD, row0 = (int64_t)s * T;
  const int nkt = (min(q0 + BQ, T) - 1) / BK + 1;
  const float sl2 = scale * TC_LOG2E;

  auto load_kv = [&](int kt) {
    if (kt < nkt) {
      tile_async<HD>(sK0 + (kt % NS) * TB, kb, row0, kt * BK, BK, T, ks, kh);
      tile_async<HD>(sK0 + (NS + kt % NS) * TB, vb, row0, kt * BK, BK, T, ks, kh);
    }
    cp_async_commit();
  };
  tile_async<HD>(sQ, qb, row0, q0, BQ, T, qs, h); /* in tile 0's group */
  tile_async<HD>(sO, dob, row0, q0, BQ, T, qs, h);
#pragma unroll
  for (int kt = 0; kt < NS - 1; kt++) load_kv(kt);

  const int iw = q0 + warp * 16, ig = q0 + wg * 64; /* the warp's and its warpgroup's first rows */
  float lr[2], dr[2]; /* the lane's rows' lse (log2 units) and D */
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = iw + g + 8 * r;
    lr[r] = i < T ? lse[(row0 + i) * H + h] * TC_LOG2E : INFINITY; /* p = 0 on padding rows */
    dr[r] = i < T ? D[(row0 + i) * H + h] : 0.0f;
  }
  float acc[HD / 2];
#pragma unroll
  for (int j = 0; j < HD / 2; j++) acc[j] = 0.0f;

  for (int kt = 0; kt < nkt; kt++) {
    const uint32_t sK = sK0 + (kt % NS) * TB, sV = sK0 + (NS + kt % NS) * TB;
    cp_async_wait<NS - 2>();
    fence_async_smem();
    __syncthreads(); /* tile kt visible to all; tile kt - 1's buffers free for the next load */
    load_kv(kt + NS - 1);
    const int k0 = kt * BK;
    if (k0 <= ig + 63) { /* warpgroup-uniform: some key of the tile is at or before a row of the group */
      float sc[BK / 2], dp[BK / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<0>(sc, wg_kmajor(sQ, BQ, kk, 64 * wg), wg_kmajor(sK, BK, kk), kk);
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<0>(dp, wg_kmajor(sO, BQ, kk, 64 * wg), wg_kmajor(sV, BK, kk), kk);
      wgmma_commit();
      wgmma_wait<0>();
      wg_pin(sc);
      wg_pin(dp);
      const bool diag = k0 + BK - 1 > iw;
      uint32_t da[BK / 16][4];
#pragma unroll
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int row = iw + g + (e >> 1) * 8, key = k0 + 8 * j + 2 * t4 + (e & 1);
          const float p = diag && key > row ? 0.0f : ex2(fmaf(sc[4 * j + e], sl2, -lr[e >> 1]));
          sc[4 * j + e] = p * (dp[4 * j + e] - dr[e >> 1]); /* ds / scale */
        }
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) {
        const float *x = sc + 8 * kq;
        da[kq][0] = pack_bf16(x[0], x[1]), da[kq][1] = pack_bf16(x[2], x[3]);
        da[kq][2] = pack_bf16(x[4], x[5]), da[kq][3] = pack_bf16(x[6], x[7]);
      }
      wgmma_fence();
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) wgmma_rs<1>(acc, da[kq], wg_mnmajor(sK, BK, kq), 1); /* dq += ds k */
      wgmma_commit();
      wgmma_wait<0>(); /* before the next load overwrites this k tile's buffer */
      wg_pin(acc);
#pragma unroll
      for (int kq = 0; kq < BK / 16; kq++) wg_pin(da[kq]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = iw + g + 8 * r;
    if (i >= T) continue;
    float *di = dq + (row0 + i) * qs + (int64_t)h * HD + 2 * t4;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
      float2 v = *(float2 *)(di + 8 * j);
      v.x += acc[4 * j + 2 * r] * scale, v.y += acc[4 * j + 2 * r + 1] * scale;
      *(float2 *)(di + 8 * j) = v;
    }
  }
#else
  __trap(); /* built for sm_90a only (CMakeLists.txt) */
#endif
}

/* ------------------------------------------------------------------ backward: dk, dv */
/* One warpgroup (4 warps) per block owns 64 keys of a kv head, 16 per warp, and walks query
 * tiles of BQ rows; all four products are wgmma: the transposed scores s^T = k q^T and
 * dp^T = v dout^T with k, v and the query tile from shared memory (both K-major), then
 * dv += p^T dout and dk += ds^T q with p^T, ds^T as register A fragments (the accumulators of
 * the first two, rounded to bf16) and dout, q from the same tiles read MN-major. The query
 * tile's operands are read by the tensor cores once per warpgroup. */
#define DKV_KEYS 64 /* keys per block: one warpgroup */

/* query rows per tile: fewer for head_dim 128, whose dk and dv accumulators take 128 registers */
#ifndef DKV_BQ128
#define DKV_BQ128 64
#endif
#ifndef DKV_BQ64
#define DKV_BQ64 128
#endif
template <int HD>
static constexpr __host__ __device__ int dkv_bq() {
  return HD == 128 ? DKV_BQ128 : DKV_BQ64;
}

#ifndef BK_NS
#define BK_NS 2 /* query tiles (q, dout, lse, D) in flight */
#endif

template <int HD>
static constexpr size_t dkv_smem() {
  /* 1024 bytes of alignment slack (the swizzled tiles start 1024-aligned); k, v, then BK_NS q
   * and BK_NS dout tiles, then BK_NS rows of lse and of D */
  return 1024 + (size_t)(2 * DKV_KEYS + 2 * BK_NS * dkv_bq<HD>()) * HD * 2 + 2 * BK_NS * dkv_bq<HD>() * sizeof(float);
}

template <int HD>
__global__ void __launch_bounds__(128, 1)
    k_fa_dkv(const bf16 *__restrict__ qb, const bf16 *__restrict__ kb, const bf16 *__restrict__ vb,
             const bf16 *__restrict__ dob, const float *__restrict__ lse, const float *__restrict__ D, int T, int H,
             int KV, int hps, float scale, float *__restrict__ dk, float *__restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BQ = dkv_bq<HD>(), NS = BK_NS;
  constexpr uint32_t TB = BQ * HD * 2;
  extern __shared__ uint4 smem_dkv[];
  const uint32_t raw = smem_addr(smem_dkv), sK = (raw + 1023) & ~1023u, sV = sK + DKV_KEYS * HD * 2,
                 sQ0 = sV + DKV_KEYS * HD * 2;
  float *Ls = (float *)((char *)smem_dkv + (sQ0 - raw) + 2 * NS * TB), *Ds = Ls + NS * BQ;
  /* the block takes hps of the grp query heads of kv head kh: all of them (dk, dv added in
   * place), or one part of nsplit (its sums written to per-part rows, added by k_tc_parts) */
  const int grp = H / KV, nsplit = grp / hps;
  const unsigned per_tile = gridDim.x / (unsigned)((T + DKV_KEYS - 1) / DKV_KEYS); /* KV nsplit n_seq */
  const int ys = (int)(blockIdx.x % per_tile), by = ys % (KV * nsplit), s = ys / (KV * nsplit);
  const int kh = by / nsplit, part = by % nsplit, j0 = (int)(blockIdx.x / per_tile) * DKV_KEYS, h0 = kh * grp + part * hps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t qs = (int64_t)H * HD, ks = (int64_t)KV * HD, row0 = (int64_t)s * T;
  const float sl2 = scale * TC_LOG2E;
  const int nqt = (T - j0 + BQ - 1) / BQ, n_it = hps * nqt; /* query tiles from j0 on, per head */

  /* stage it's q, dout, lse and D into buffer it % NS, all asynchronously; one commit group
   * per stage, empty past the end. Padding queries get q = dout = 0 and lse = D = 0: p = 1
   * there, but ds = p (0 - 0) = 0 and both products add zero. */
  auto stage = [&](int it) {
    if (it < n_it) {
      const int b = it % NS, h = h0 + it / nqt, t0 = j0 + (it % nqt) * BQ;
      tile_async<HD>(sQ0 + b * TB, qb, row0, t0, BQ, T, qs, h);
      tile_async<HD>(sQ0 + (NS + b) * TB, dob, row0, t0, BQ, T, qs, h);
      for (int x = threadIdx.x; x < BQ; x += blockDim.x) {
        const int t = t0 + x;
        const int64_t o = (row0 + (t < T ? t : 0)) * H + h;
        cp_async4(smem_addr(Ls + b * BQ + x), lse + o, t < T);
        cp_async4(smem_addr(Ds + b * BQ + x), D + o, t < T);
      }
    }
    cp_async_commit();
  };
  tile_async<HD>(sK, kb, row0, j0, DKV_KEYS, T, ks, kh); /* in stage 0's group */
  tile_async<HD>(sV, vb, row0, j0, DKV_KEYS, T, ks, kh);
#pragma unroll
  for (int it = 0; it < NS - 1; it++) stage(it);

  const int jw = j0 + warp * 16; /* this warp's first key; the lane's keys are jw + g, jw + g + 8 */
  float ak[HD / 2], av[HD / 2]; /* dk, dv of the warp's 16 keys: [HD / 8 n-tiles][4] */
#pragma unroll
  for (int j = 0; j < HD / 2; j++) ak[j] = av[j] = 0.0f;

  for (int it = 0; it < n_it; it++) {
    const int b = it % NS, t0 = j0 + (it % nqt) * BQ;
    const uint32_t sQ = sQ0 + b * TB, sO = sQ0 + (NS + b) * TB;
    cp_async_wait<NS - 2>();
    fence_async_smem(); /* this thread's copies of stage it, to the products */
    __syncthreads();    /* stage it visible to all; stage it - 1's buffers free */
    stage(it + NS - 1);
    float sc[BQ / 2], dp[BQ / 2]; /* transposed: rows are keys, columns queries */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<0>(sc, wg_kmajor(sK, DKV_KEYS, kk), wg_kmajor(sQ, BQ, kk), kk);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<0>(dp, wg_kmajor(sV, DKV_KEYS, kk), wg_kmajor(sO, BQ, kk), kk);
    wgmma_commit();
    wgmma_wait<0>();
    wg_pin(sc);
    wg_pin(dp);
    const float *L = Ls + b * BQ, *Dq = Ds + b * BQ;
    const bool diag = t0 < jw + 16; /* some query of the tile is before some key of the warp */
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) {
      const int c = 8 * j + 2 * t4;
      const float2 lq = *(const float2 *)(L + c), dq2 = *(const float2 *)(Dq + c);
      const float lx = lq.x * TC_LOG2E, ly = lq.y * TC_LOG2E; /* lse in log2 units */
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = jw + g + (e >> 1) * 8, qry = t0 + c + (e & 1);
        const float p = diag && qry < key ? 0.0f : ex2(fmaf(sc[4 * j + e], sl2, -((e & 1) ? ly : lx)));
        sc[4 * j + e] = p;
        dp[4 * j + e] = p * (dp[4 * j + e] - ((e & 1) ? dq2.y : dq2.x)); /* ds / scale */
      }
    }
    /* A fragment kq of p^T (ds^T): accumulator n-tiles 2 kq and 2 kq + 1, rounded to bf16 */
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kq = 0; kq < BQ / 16; kq++) {
      const float *x = sc + 8 * kq, *y = dp + 8 * kq;
      pa[kq][0] = pack_bf16(x[0], x[1]), pa[kq][1] = pack_bf16(x[2], x[3]);
      pa[kq][2] = pack_bf16(x[4], x[5]), pa[kq][3] = pack_bf16(x[6], x[7]);
      da[kq][0] = pack_bf16(y[0], y[1]), da[kq][1] = pack_bf16(y[2], y[3]);
      da[kq][2] = pack_bf16(y[4], y[5]), da[kq][3] = pack_bf16(y[6], y[7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BQ / 16; kq++) wgmma_rs<1>(av, pa[kq], wg_mnmajor(sO, BQ, kq), 1); /* dv += p^T dout */
#pragma unroll
    for (int kq = 0; kq < BQ / 16; kq++) wgmma_rs<1>(ak, da[kq], wg_mnmajor(sQ, BQ, kq), 1); /* dk += ds^T q */
    wgmma_commit();
    wgmma_wait<0>(); /* before the next stage overwrites these tiles' buffers */
    wg_pin(av);
    wg_pin(ak);
#pragma unroll
    for (int kq = 0; kq < BQ / 16; kq++) wg_pin(pa[kq]), wg_pin(da[kq]);
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int j = jw + g + 8 * r;
    if (j >= T) continue;
    if (nsplit == 1) {
      float *pk = dk + (row0 + j) * ks + (int64_t)kh * HD + 2 * t4, *pv = dv + (row0 + j) * ks + (int64_t)kh * HD + 2 * t4;
#pragma unroll
      for (int c = 0; c < HD / 8; c++) {
        float2 x = *(float2 *)(pk + 8 * c), y = *(float2 *)(pv + 8 * c);
        x.x += ak[4 * c + 2 * r] * scale, x.y += ak[4 * c + 2 * r + 1] * scale;
        y.x += av[4 * c + 2 * r], y.y += av[4 * c + 2 * r + 1];
        *(float2 *)(pk + 8 * c) = x;
        *(float2 *)(pv + 8 * c) = y;
      }
    } else { /* rows of [n, KV * nsplit, HD] */
      const int64_t o = ((row0 + j) * KV * nsplit + by) * HD + 2 * t4;
#pragma unroll
      for (int c = 0; c < HD / 8; c++) {
        *(float2 *)(dk + o + 8 * c) = make_float2(ak[4 * c + 2 * r] * scale, ak[4 * c + 2 * r + 1] * scale);
        *(float2 *)(dv + o + 8 * c) = make_float2(av[4 * c + 2 * r], av[4 * c + 2 * r + 1]);
      }
    }
  }
#else
  __trap(); /* built for sm_90a only (CMakeLists.txt) */
#endif
}

/* dk[r, kh, c] += the nsplit parts' sums in order (deterministic); one thread per 4 columns. */
template <int HD>
__global__ void k_tc_parts(const float *__restrict__ part, int64_t rows_kv, int nsplit, float *__restrict__ g) {
  MC_CU_FOR(i, rows_kv * (HD / 4)) {
    const int64_t rk = i / (HD / 4), c = 4 * (i % (HD / 4));
    const float4 *p = (const float4 *)(part + rk * nsplit * HD + c);
    float4 acc = *(float4 *)(g + rk * HD + c);
    for (int x = 0; x < nsplit; x++) {
      const float4 v = p[x * (HD / 4)];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    *(float4 *)(g + rk * HD + c) = acc;
  }
}

/* ------------------------------------------------------------------ host side */
static unsigned grid_cap(int64_t blocks) { return (unsigned)(blocks < (1 << 20) ? (blocks < 1 ? 1 : blocks) : (1 << 20)); }

/* Blocks of a 1-D grid over tiles x heads x sequences; 0 (failure recorded) past 2^31 - 1. */
static unsigned blocks_1d(mc_backend *be, int tiles, int heads, int n_seq, const char *op) {
  const int64_t b = (int64_t)tiles * heads * n_seq;
  if (b > 0x7fffffff) {
    mc_cuda_fail(be, "%s: %lld blocks (tiles %d x heads %d x sequences %d) exceed one grid", op, (long long)b, tiles,
                 heads, n_seq);
    return 0;
  }
  return (unsigned)b;
}

/* bf16 rows for a kernel: the operand's own (bf16 storage) or, for fp32 storage, `copy` (the
 * pre-pass's rounding goes there). */
static const bf16 *bf16_rows(mc_operand x, bf16 *copy) { return x.h ? (const bf16 *)x.h : copy; }

template <int HD>
static void fwd_hd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV,
                   mc_dst out, float *lse) {
  constexpr size_t smem = fwd_smem<HD>();
  const void *kern = q.h ? (const void *)k_fa_fwd<HD, true> : (const void *)k_fa_fwd<HD, false>;
  if (!mc_cuda_attn_smem_ok(be, kern, smem, "attn_fwd (bf16)")) return;
  const unsigned grid = blocks_1d(be, (T + 64 * FW_WG - 1) / (64 * FW_WG), H, n_seq, "attn_fwd (bf16)");
  if (!grid) return;
  /* k, v are read once per query tile: fp32 ones are rounded once into scratch */
  const int64_t nk = (int64_t)n_seq * T * KV * HD, nkf = k.f ? nk : 0, nvf = v.f ? nk : 0;
  bf16 *kb = NULL, *vb = NULL;
  if (nkf + nvf) {
    kb = (bf16 *)mc_cuda_scratch(be, (size_t)(nkf + nvf) * sizeof(bf16), "attn_fwd (bf16)");
    if (!kb) return;
    vb = kb + nkf;
    /* one launch for both; an operand already in bf16 contributes no work */
    k_tc_pack2<<<mc_cu_grid((nkf + nvf) / 8), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(k.f, kb, nkf / 8, v.f, vb,
                                                                                      nvf / 8);
  }
  const float sl2 = TC_LOG2E / sqrtf((float)HD);
  if (q.h)
    k_fa_fwd<HD, true><<<grid, FW_WG * 128, smem, mc_cu_stream(be)>>>(
        NULL, (const bf16 *)q.h, bf16_rows(k, kb), bf16_rows(v, vb), T, H, KV, sl2, out.f, (bf16 *)out.h, lse);
  else
    k_fa_fwd<HD, false><<<grid, FW_WG * 128, smem, mc_cu_stream(be)>>>(
        q.f, NULL, bf16_rows(k, kb), bf16_rows(v, vb), T, H, KV, sl2, out.f, (bf16 *)out.h, lse);
  mc_cuda_check(be, "attn_fwd (bf16)");
}

template <int HD>
static void dq_launch(mc_backend *be, const bf16 *qb, const bf16 *kb, const bf16 *vb, const bf16 *dob,
                      const float *lse, const float *D, int n_seq, int T, int H, int KV, float scale, float *dq) {
  constexpr size_t smem = dq_smem<HD>();
  if (!mc_cuda_attn_smem_ok(be, (const void *)k_fa_dq<HD>, smem, "attn_bwd (bf16)")) return;
  const unsigned grid = blocks_1d(be, (T + 64 * DQ_WG - 1) / (64 * DQ_WG), H, n_seq, "attn_bwd (bf16)");
  if (!grid) return;
  k_fa_dq<HD><<<grid, DQ_WG * 128, smem, mc_cu_stream(be)>>>(qb, kb, vb, dob, lse, D, T, H, KV, scale, dq);
}

template <int HD>
static void bwd_hd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out, const float *lse,
                   mc_operand dout, int n_seq, int T, int H, int KV, float *dq, float *dk, float *dv) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * HD, nk = n * KV * HD;
  /* Each dk/dv block walks its kv head's grp query heads in turn. With fewer than 4 such
   * blocks per multiprocessor (nam-small: 256 on 132), each query head gets its own block
   * instead (more and shorter blocks: the first key tiles are the longest) and the grp
   * partial sums go through scratch. */
  const int grp = H / KV, kblocks = (T + DKV_KEYS - 1) / DKV_KEYS;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, mc_cu(be)->device);
  const int hps = (int64_t)kblocks * KV * n_seq >= 4 * (int64_t)sms ? grp : 1, nsplit = grp / hps;
  const int64_t nparts = nsplit > 1 ? n * H * HD : 0; /* floats of each of dk's and dv's parts */
  const int64_t nD = (n * H + 3) / 4 * 4;              /* D's floats, rounded up to keep 16-byte alignment */
  /* bf16 copies of the fp32 operands only; each size a multiple of 128 bytes (HD >= 64) */
  const int64_t nqf = q.f ? nq : 0, nof = dout.f ? nq : 0, nkf = k.f ? nk : 0, nvf = v.f ? nk : 0;
  char *sc = (char *)mc_cuda_scratch(be, (size_t)(nqf + nof + nkf + nvf) * sizeof(bf16) + (size_t)nD * sizeof(float) +
                                             (size_t)(2 * nparts) * sizeof(float),
                                     "attn_bwd (bf16)");
  if (!sc) return;
  bf16 *qc = (bf16 *)sc, *doc = qc + nqf, *kc = doc + nof, *vc = kc + nkf;
  float *D = (float *)(vc + nvf);
  float *pk = D + nD, *pv = pk + nparts;
  const size_t skv = dkv_smem<HD>();
  if (!mc_cuda_attn_smem_ok(be, (const void *)k_fa_dkv<HD>, skv, "attn_bwd (bf16)")) return;
  cudaStream_t st = mc_cu_stream(be);
  {
    const int64_t nki = k.f || v.f ? n * KV : 0; /* kv items only to round fp32 k or v here */
    const int64_t warps = (n * H + nki + 32 / (HD / 4) - 1) / (32 / (HD / 4)); /* 32 / (HD / 4) items per warp */
    k_tc_prep<HD><<<grid_cap((warps + 7) / 8), 256, 0, st>>>(q, out, dout, k, v, n * H, nki, qc, doc, D, kc, vc);
  }
  const bf16 *qb = bf16_rows(q, qc), *dob = bf16_rows(dout, doc), *kb = bf16_rows(k, kc), *vb = bf16_rows(v, vc);
  const float scale = 1.0f / sqrtf((float)HD);
  const unsigned gk = blocks_1d(be, kblocks, KV * nsplit, n_seq, "attn_bwd (bf16)");
  if (!gk) return;
  float *dk1 = nsplit > 1 ? pk : dk, *dv1 = nsplit > 1 ? pv : dv;
  k_fa_dkv<HD><<<gk, 128, skv, st>>>(qb, kb, vb, dob, lse, D, T, H, KV, hps, scale, dk1, dv1);
  dq_launch<HD>(be, qb, kb, vb, dob, lse, D, n_seq, T, H, KV, scale, dq);
  if (nsplit > 1) {
    k_tc_parts<HD><<<mc_cu_grid(n * KV * (HD / 4)), MC_CUDA_THREADS, 0, st>>>(pk, n * KV, nsplit, dk);
    k_tc_parts<HD><<<mc_cu_grid(n * KV * (HD / 4)), MC_CUDA_THREADS, 0, st>>>(pv, n * KV, nsplit, dv);
  }
  mc_cuda_check(be, "attn_bwd (bf16)");
}

/* ------------------------------------------------------------------ entry points */
/* An operand with exactly one storage set, 16-byte aligned (rows move 16 bytes at a time). */
static int operand_ok(mc_backend *be, const char *op, const char *name, mc_operand x) {
  if (!x.f == !x.h) {
    mc_cuda_fail(be, "%s: operand %s must have exactly one of fp32 (f) and bf16 (h) storage set", op, name);
    return 0;
  }
  if (((uintptr_t)x.f | (uintptr_t)x.h) & 15) {
    mc_cuda_fail(be, "%s: operand %s is not 16-byte aligned", op, name);
    return 0;
  }
  return 1;
}

static int ptr_ok(mc_backend *be, const char *op, const char *name, const void *p, uintptr_t align) {
  if (!p || ((uintptr_t)p & (align - 1))) {
    mc_cuda_fail(be, "%s: %s is %s", op, name, p ? "misaligned" : "NULL");
    return 0;
  }
  return 1;
}

static int shape_ok(mc_backend *be, const char *op, int n_seq, int T, int H, int KV, int hd) {
  if (n_seq < 1 || T < 1 || H < 1 || KV < 1 || H % KV || (hd != 64 && hd != 128)) {
    mc_cuda_fail(be, "%s: unsupported shape n_seq=%d T=%d H=%d KV=%d head_dim=%d (tensor-core attention: head_dim 64 "
                 "or 128, H a multiple of KV, every size >= 1)",
                 op, n_seq, T, H, KV, hd);
    return 0;
  }
  return 1;
}

extern "C" void mc_cuda_attn_tc_fwd_ex(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T,
                                       int H, int KV, int hd, mc_dst out, float *lse) {
  static const char op[] = "attn_fwd (bf16)";
  if (!shape_ok(be, op, n_seq, T, H, KV, hd) || !operand_ok(be, op, "q", q) || !operand_ok(be, op, "k", k) ||
      !operand_ok(be, op, "v", v) || !ptr_ok(be, op, "lse", lse, 4))
    return;
  if (!out.f == !out.h) {
    mc_cuda_fail(be, "%s: out must have exactly one of fp32 (f) and bf16 (h) storage set", op);
    return;
  }
  if (!ptr_ok(be, op, "out", out.f ? (const void *)out.f : (const void *)out.h, 16)) return;
  if (hd == 64) fwd_hd<64>(be, q, k, v, n_seq, T, H, KV, out, lse);
  else fwd_hd<128>(be, q, k, v, n_seq, T, H, KV, out, lse);
}

extern "C" void mc_cuda_attn_tc_bwd_ex(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out,
                                       const float *lse, mc_operand dout, int n_seq, int T, int H, int KV, int hd,
                                       float *dq, float *dk, float *dv) {
  static const char op[] = "attn_bwd (bf16)";
  if (!shape_ok(be, op, n_seq, T, H, KV, hd) || !operand_ok(be, op, "q", q) || !operand_ok(be, op, "k", k) ||
      !operand_ok(be, op, "v", v) || !operand_ok(be, op, "out", out) || !operand_ok(be, op, "dout", dout) ||
      !ptr_ok(be, op, "lse", lse, 4) || !ptr_ok(be, op, "dq", dq, 16) || !ptr_ok(be, op, "dk", dk, 16) ||
      !ptr_ok(be, op, "dv", dv, 16))
    return;
  if (hd == 64) bwd_hd<64>(be, q, k, v, out, lse, dout, n_seq, T, H, KV, dq, dk, dv);
  else bwd_hd<128>(be, q, k, v, out, lse, dout, n_seq, T, H, KV, dq, dk, dv);
}

static mc_operand opf(const float *f) {
  mc_operand x;
  x.f = f, x.h = NULL;
  return x;
}

void mc_cuda_attn_tc_fwd(mc_backend *be, const float *q, const float *k, const float *v, int n_seq, int T, int H,
                         int KV, int hd, float *out, float *lse) {
  mc_dst o;
  o.f = out, o.h = NULL;
  mc_cuda_attn_tc_fwd_ex(be, opf(q), opf(k), opf(v), n_seq, T, H, KV, hd, o, lse);
}

void mc_cuda_attn_tc_bwd(mc_backend *be, const float *q, const float *k, const float *v, const float *out,
                         const float *lse, const float *dout, int n_seq, int T, int H, int KV, int hd, float *dq,
                         float *dk, float *dv) {
  mc_cuda_attn_tc_bwd_ex(be, opf(q), opf(k), opf(v), opf(out), lse, opf(dout), n_seq, T, H, KV, hd, dq, dk, dv);
}
