/* Causal GQA attention, flash style in fp32: no T x T matrix exists anywhere. Scores are
 * made 32 at a time, one key per lane, against a key/value tile in shared memory; each
 * warp keeps its query rows' running max, normaliser and output in registers (online
 * softmax; MC = ceil(head_dim / 32) <= 8 output columns per lane, a template parameter so
 * no lane works on masked columns). The probabilities of a tile go through a per-warp
 * shared buffer and are read back four at a time; with head_dim a multiple of 4 the dot
 * products read 16 bytes at a time. The backward recomputes every probability from the
 * saved lse in two kernels, one owning dq (parallel over query tiles) and one owning dk, dv
 * (parallel over key tiles), so no gradient needs atomics. Formulas as in
 * kernels/cpu/cpu_attn.c.
 * The bf16 instance (mc_backend_cuda_bf16) runs head_dim 64 and 128 on tensor cores instead
 * (cuda_attn_tc.cu: q, k, v, p, dout and ds rounded to bf16; fp32 accumulation, softmax
 * statistics and outputs) when every tensor is 16-byte aligned; every other case, and the
 * fp32 instance always, runs the fp32 kernels below. */
#include "kernels/cuda/cuda_common.h"

/* cuda_attn_tc.cu */
void mc_cuda_attn_tc_fwd(mc_backend *be, const float *q, const float *k, const float *v, int n_seq, int T, int H,
                         int KV, int hd, float *out, float *lse);
void mc_cuda_attn_tc_bwd(mc_backend *be, const float *q, const float *k, const float *v, const float *out,
                         const float *lse, const float *dout, int n_seq, int T, int H, int KV, int hd, float *dq,
                         float *dk, float *dv);
/* The same on operands stored in fp32 or bf16 (bf16 ones are read as they are, not rounded
 * again); out in either storage (bf16: the fp32 result rounded to nearest even); dq, dk, dv
 * fp32, added into. C linkage, for callers in C. */
extern "C" void mc_cuda_attn_tc_fwd_ex(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T,
                                       int H, int KV, int hd, mc_dst out, float *lse);
extern "C" void mc_cuda_attn_tc_bwd_ex(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out,
                                       const float *lse, mc_operand dout, int n_seq, int T, int H, int KV, int hd,
                                       float *dq, float *dk, float *dv);

#define ATT_WARPS 4
#define ATT_MAXHD 256  /* head_dim <= 32 * 8 */
#define ATT_RPW 4      /* query rows per warp in the forward and dq kernels */
#define ATT_FQ (ATT_WARPS * ATT_RPW) /* query rows per block */
#define ATT_KT 32      /* keys per tile: one per lane */
#define ATT_KPW 4      /* keys per warp in the dk/dv kernel */
#define ATT_BK (ATT_WARPS * ATT_KPW) /* keys per block there */
#define ATT_QT 32      /* queries per tile there: one per lane */

/* Loads rows [r0, r0 + rows) of head `head` (row stride `stride`) into a tile with row pitch
 * `ld`; rows past T are zero. 16 bytes at a time when head_dim, ld and the source allow. */
static __device__ void load_tile(float *dst, int ld, const float *src, int64_t seq_row0, int r0, int rows, int T,
                                 int64_t stride, int head, int hd) {
  if (hd % 4 == 0 && ld % 4 == 0 && ((uintptr_t)src & 15) == 0) {
    const int nv = hd / 4;
    for (int idx = threadIdx.x; idx < rows * nv; idx += blockDim.x) {
      const int i = idx / nv, c = 4 * (idx - i * nv), t = r0 + i;
      float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < T) val = *(const float4 *)(src + (seq_row0 + t) * stride + (int64_t)head * hd + c);
      *(float4 *)(dst + i * ld + c) = val;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
    int i = idx / hd, c = idx % hd, t = r0 + i;
    dst[i * ld + c] = t < T ? src[(seq_row0 + t) * stride + (int64_t)head * hd + c] : 0.0f;
  }
}

/* acc[r] += A_r . b over hd columns, for R rows A_r (pitch lda, the same for every lane)
 * and this lane's row b. vec: hd, lda and both bases are multiples of 4 floats. */
template <int R>
static __device__ __forceinline__ void dots(float (&acc)[R], const float *A, int lda, const float *b, int hd, bool vec) {
  if (vec) {
    for (int c = 0; c < hd; c += 4) {
      const float4 bv = *(const float4 *)(b + c);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float4 a = *(const float4 *)(A + r * lda + c);
        acc[r] += a.x * bv.x + a.y * bv.y + a.z * bv.z + a.w * bv.w;
      }
    }
  } else {
    for (int c = 0; c < hd; c++) {
      const float bc = b[c];
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] += A[r * lda + c] * bc;
    }
  }
}

/* o[r][ci] += sum over j < 32 of P[r][j] V[j][c], c = lane + 32 ci: P is the warp's R rows of
 * 32 weights in shared memory (16-byte aligned), V rows have pitch ldv. */
template <int R, int MC>
static __device__ __forceinline__ void accumulate(float (&o)[R][MC], const float *P, const float *V, int ldv, int hd,
                                                  int lane) {
  for (int j = 0; j < 32; j += 4) {
    float4 p[R];
#pragma unroll
    for (int r = 0; r < R; r++) p[r] = *(const float4 *)(P + r * 32 + j);
    const float *v = V + j * ldv;
#pragma unroll
    for (int ci = 0; ci < MC; ci++) {
      const int c = lane + 32 * ci;
      if (c < hd) {
        const float v0 = v[c], v1 = v[ldv + c], v2 = v[2 * ldv + c], v3 = v[3 * ldv + c];
#pragma unroll
        for (int r = 0; r < R; r++) o[r][ci] += p[r].x * v0 + p[r].y * v1 + p[r].z * v2 + p[r].w * v3;
      }
    }
  }
}

/* Row pitch of tiles read one row per lane: 16-byte aligned rows when vectorised (and
 * conflict-free 16-byte reads); an odd pitch otherwise (conflict-free 4-byte reads). */
static __host__ __device__ __forceinline__ int lane_pitch(int hd) { return hd % 4 == 0 ? hd + 4 : hd + 1; }

template <int MC>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attn_fwd(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, float scale, float *out,
               float *lse) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int ldk = lane_pitch(hd);
  const bool vec = hd % 4 == 0;
  float *Ps = sm, *Qs = Ps + ATT_WARPS * ATT_RPW * 32, *Ks = Qs + ATT_FQ * hd, *Vs = Ks + ATT_KT * ldk;
  const int s = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ATT_FQ, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = q0 + warp * ATT_RPW;
  const int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd, row0 = (int64_t)s * T;
  const float *Qw = Qs + warp * ATT_RPW * hd;
  float *Pw = Ps + warp * ATT_RPW * 32;
  load_tile(Qs, hd, q, row0, q0, ATT_FQ, T, qs, h, hd);
  float m[ATT_RPW], l[ATT_RPW], o[ATT_RPW][MC];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int ci = 0; ci < MC; ci++) o[rr][ci] = 0.0f;
  }
  const int qlast = min(q0 + ATT_FQ, T) - 1;
  for (int k0 = 0; k0 <= qlast; k0 += ATT_KT) {
    __syncthreads();
    load_tile(Ks, ldk, k, row0, k0, ATT_KT, T, ks, kh, hd);
    load_tile(Vs, hd, v, row0, k0, ATT_KT, T, ks, kh, hd);
    __syncthreads();
    if (k0 > i0 + ATT_RPW - 1) continue; /* warp-uniform: the whole tile is in this warp's future */
    const int j = k0 + lane;
    float sc[ATT_RPW];
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) sc[rr] = 0.0f;
    dots<ATT_RPW>(sc, Qw, hd, Ks + lane * ldk, hd, vec);
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
      const int i = i0 + rr;
      float p = 0.0f;
      if (i < T && k0 <= i) { /* warp-uniform */
        const bool ok = j <= i;
        const float x = ok ? sc[rr] * scale : -INFINITY;
        const float mnew = fmaxf(m[rr], mc_d_warp_max(x)); /* finite: key k0 <= i is valid */
        p = ok ? expf(x - mnew) : 0.0f;
        const float corr = expf(m[rr] - mnew);
        l[rr] = l[rr] * corr + mc_d_warp_sum(p);
        m[rr] = mnew;
#pragma unroll
        for (int ci = 0; ci < MC; ci++) o[rr][ci] *= corr;
      }
      Pw[rr * 32 + lane] = p;
    }
    __syncwarp();
    accumulate<ATT_RPW, MC>(o, Pw, Vs, hd, hd, lane);
    __syncwarp();
  }
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + rr;
    if (i >= T) continue;
    float *oi = out + (row0 + i) * qs + (int64_t)h * hd;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int ci = 0; ci < MC; ci++) {
      const int c = lane + 32 * ci;
      if (c < hd) oi[c] = o[rr][ci] * inv;
    }
    if (lane == 0) lse[(row0 + i) * H + h] = m[rr] + logf(l[rr]);
  }
}

/* D[r, h] = dout . out over the head's columns: one warp per (row, head). */
__global__ void k_attn_delta(const float *out, const float *dout, int64_t items, int hd, float *D) {
  const int lane = threadIdx.x % 32;
  for (int64_t it = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; it < items;
       it += (int64_t)gridDim.x * (blockDim.x / 32)) {
    const float *a = out + it * hd, *b = dout + it * hd;
    float s = 0.0f;
    for (int c = lane; c < hd; c += 32) s += a[c] * b[c];
    s = mc_d_warp_sum(s);
    if (lane == 0) D[it] = s;
  }
}

/* dq: the forward's block shape; lane = key. ds = p (dout_i . v_j - D_i) scale. */
template <int MC>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attn_dq(const float *q, const float *k, const float *v, const float *lse, const float *D, const float *dout, int T,
              int H, int KV, int hd, float scale, float *dq) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int ldk = lane_pitch(hd);
  const bool vec = hd % 4 == 0;
  float *Ps = sm, *Qs = Ps + ATT_WARPS * ATT_RPW * 32, *dOs = Qs + ATT_FQ * hd, *Ks = dOs + ATT_FQ * hd,
        *Vs = Ks + ATT_KT * ldk;
  const int s = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ATT_FQ, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = q0 + warp * ATT_RPW;
  const int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd, row0 = (int64_t)s * T;
  const float *Qw = Qs + warp * ATT_RPW * hd, *dOw = dOs + warp * ATT_RPW * hd;
  float *Pw = Ps + warp * ATT_RPW * 32;
  load_tile(Qs, hd, q, row0, q0, ATT_FQ, T, qs, h, hd);
  load_tile(dOs, hd, dout, row0, q0, ATT_FQ, T, qs, h, hd);
  float li[ATT_RPW], Di[ATT_RPW], acc[ATT_RPW][MC];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + rr;
    li[rr] = i < T ? lse[(row0 + i) * H + h] : 0.0f;
    Di[rr] = i < T ? D[(row0 + i) * H + h] : 0.0f;
#pragma unroll
    for (int ci = 0; ci < MC; ci++) acc[rr][ci] = 0.0f;
  }
  const int qlast = min(q0 + ATT_FQ, T) - 1;
  for (int k0 = 0; k0 <= qlast; k0 += ATT_KT) {
    __syncthreads();
    load_tile(Ks, ldk, k, row0, k0, ATT_KT, T, ks, kh, hd);
    load_tile(Vs, ldk, v, row0, k0, ATT_KT, T, ks, kh, hd);
    __syncthreads();
    if (k0 > i0 + ATT_RPW - 1) continue;
    const int j = k0 + lane;
    float sc[ATT_RPW], dp[ATT_RPW];
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) sc[rr] = dp[rr] = 0.0f;
    dots<ATT_RPW>(sc, Qw, hd, Ks + lane * ldk, hd, vec);
    dots<ATT_RPW>(dp, dOw, hd, Vs + lane * ldk, hd, vec);
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
      const int i = i0 + rr;
      const float p = i < T && j <= i ? expf(scale * sc[rr] - li[rr]) : 0.0f;
      Pw[rr * 32 + lane] = p * (dp[rr] - Di[rr]) * scale; /* ds */
    }
    __syncwarp();
    accumulate<ATT_RPW, MC>(acc, Pw, Ks, ldk, hd, lane);
    __syncwarp();
  }
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + rr;
    if (i >= T) continue;
    float *dqi = dq + (row0 + i) * qs + (int64_t)h * hd;
#pragma unroll
    for (int ci = 0; ci < MC; ci++) {
      const int c = lane + 32 * ci;
      if (c < hd) dqi[c] += acc[rr][ci];
    }
  }
}

/* dk, dv: a block owns ATT_BK keys of one kv head and walks every query head of its group
 * and every query tile at or after its keys; lane = query. */
template <int MC>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attn_dkv(const float *q, const float *k, const float *v, const float *lse, const float *D, const float *dout,
               int T, int H, int KV, int hd, float scale, float *dk, float *dv) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int ldq = lane_pitch(hd);
  const bool vec = hd % 4 == 0;
  float *Pp = sm, *Pd = Pp + ATT_WARPS * ATT_KPW * 32, *Qs = Pd + ATT_WARPS * ATT_KPW * 32, *dOs = Qs + ATT_QT * ldq;
  float *Ks = dOs + ATT_QT * ldq, *Vs = Ks + ATT_BK * hd, *Ls = Vs + ATT_BK * hd, *Ds = Ls + ATT_QT;
  const int s = blockIdx.z, kh = blockIdx.y, j0 = blockIdx.x * ATT_BK, grp = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, jw = j0 + warp * ATT_KPW;
  const int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd, row0 = (int64_t)s * T;
  const float *Kw = Ks + warp * ATT_KPW * hd, *Vw = Vs + warp * ATT_KPW * hd;
  float *Ppw = Pp + warp * ATT_KPW * 32, *Pdw = Pd + warp * ATT_KPW * 32;
  load_tile(Ks, hd, k, row0, j0, ATT_BK, T, ks, kh, hd);
  load_tile(Vs, hd, v, row0, j0, ATT_BK, T, ks, kh, hd);
  float gk[ATT_KPW][MC], gv[ATT_KPW][MC];
#pragma unroll
  for (int kk = 0; kk < ATT_KPW; kk++)
#pragma unroll
    for (int ci = 0; ci < MC; ci++) gk[kk][ci] = gv[kk][ci] = 0.0f;
  for (int h = kh * grp; h < (kh + 1) * grp; h++) {
    for (int t0 = (j0 / ATT_QT) * ATT_QT; t0 < T; t0 += ATT_QT) {
      __syncthreads();
      load_tile(Qs, ldq, q, row0, t0, ATT_QT, T, qs, h, hd);
      load_tile(dOs, ldq, dout, row0, t0, ATT_QT, T, qs, h, hd);
      if (threadIdx.x < ATT_QT) {
        const int t = t0 + threadIdx.x;
        Ls[threadIdx.x] = t < T ? lse[(row0 + t) * H + h] : 0.0f;
        Ds[threadIdx.x] = t < T ? D[(row0 + t) * H + h] : 0.0f;
      }
      __syncthreads();
      if (jw >= T) continue; /* warp-uniform: this warp's keys are all past the sequence */
      const int i = t0 + lane;
      float sc[ATT_KPW], dp[ATT_KPW];
#pragma unroll
      for (int kk = 0; kk < ATT_KPW; kk++) sc[kk] = dp[kk] = 0.0f;
      dots<ATT_KPW>(sc, Kw, hd, Qs + lane * ldq, hd, vec);
      dots<ATT_KPW>(dp, Vw, hd, dOs + lane * ldq, hd, vec);
#pragma unroll
      for (int kk = 0; kk < ATT_KPW; kk++) {
        const int j = jw + kk;
        const float p = i < T && j < T && i >= j ? expf(scale * sc[kk] - Ls[lane]) : 0.0f;
        Ppw[kk * 32 + lane] = p;
        Pdw[kk * 32 + lane] = p * (dp[kk] - Ds[lane]) * scale;
      }
      __syncwarp();
      accumulate<ATT_KPW, MC>(gv, Ppw, dOs, ldq, hd, lane);
      accumulate<ATT_KPW, MC>(gk, Pdw, Qs, ldq, hd, lane);
      __syncwarp();
    }
  }
#pragma unroll
  for (int kk = 0; kk < ATT_KPW; kk++) {
    const int j = jw + kk;
    if (j >= T) continue;
    float *dkj = dk + (row0 + j) * ks + (int64_t)kh * hd, *dvj = dv + (row0 + j) * ks + (int64_t)kh * hd;
#pragma unroll
    for (int ci = 0; ci < MC; ci++) {
      const int c = lane + 32 * ci;
      if (c < hd) {
        dkj[c] += gk[kk][ci];
        dvj[c] += gv[kk][ci];
      }
    }
  }
}

static int attn_args_ok(mc_backend *be, const char *op, int n_seq, int T, int H, int KV, int hd) {
  if (n_seq <= 0 || T <= 0 || H <= 0) return 0;
  if (hd <= 0 || hd > ATT_MAXHD || KV <= 0 || H % KV || n_seq > 65535 || H > 65535) {
    mc_cuda_fail(be, "%s: unsupported shape n_seq=%d H=%d KV=%d head_dim=%d (head_dim 1..%d, H a multiple of KV)",
                 op, n_seq, H, KV, hd, ATT_MAXHD);
    return 0;
  }
  return 1;
}

/* Dynamic shared memory above 48 KB needs the kernel's limit raised first (also used by
 * cuda_attn_tc.cu). */
int mc_cuda_attn_smem_ok(mc_backend *be, const void *kernel, size_t bytes, const char *op) {
  if (bytes <= 48 * 1024) return 1;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    mc_cuda_fail(be, "%s: %zu bytes of shared memory: %s", op, bytes, cudaGetErrorString(e));
    return 0;
  }
  return 1;
}

/* The tensor-core kernels: bf16 instance, head_dim 64 or 128, and 16-byte aligned tensors
 * (they move rows 16 bytes at a time). */
static int use_tc(mc_backend *be, int hd, const void *a, const void *b, const void *c, const void *d, const void *e,
                  const void *f) {
  const uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e | (uintptr_t)f;
  return mc_cu(be)->bf16_gemm && (hd == 64 || hd == 128) && (any & 15) == 0;
}

template <int MC>
static void attn_fwd_mc(mc_backend *be, const float *q, const float *k, const float *v, int n_seq, int T, int H,
                        int KV, int hd, float *out, float *lse) {
  size_t smem = (size_t)(ATT_WARPS * ATT_RPW * 32 + ATT_FQ * hd + ATT_KT * lane_pitch(hd) + ATT_KT * hd) * sizeof(float);
  if (!mc_cuda_attn_smem_ok(be, (const void *)k_attn_fwd<MC>, smem, "attn_fwd")) return;
  dim3 grid((unsigned)((T + ATT_FQ - 1) / ATT_FQ), (unsigned)H, (unsigned)n_seq);
  k_attn_fwd<MC><<<grid, ATT_WARPS * 32, smem, mc_cu_stream(be)>>>(q, k, v, T, H, KV, hd, 1.0f / sqrtf((float)hd),
                                                                   out, lse);
  mc_cuda_check(be, "attn_fwd");
}

template <int MC>
static void attn_bwd_mc(mc_backend *be, const float *q, const float *k, const float *v, const float *lse,
                        const float *D, const float *dout, int n_seq, int T, int H, int KV, int hd, float *dq,
                        float *dk, float *dv) {
  const float scale = 1.0f / sqrtf((float)hd);
  const int lp = lane_pitch(hd);
  cudaStream_t st = mc_cu_stream(be);
  size_t smem_q = (size_t)(ATT_WARPS * ATT_RPW * 32 + 2 * ATT_FQ * hd + 2 * ATT_KT * lp) * sizeof(float);
  size_t smem_kv = (size_t)(2 * ATT_WARPS * ATT_KPW * 32 + 2 * ATT_QT * lp + 2 * ATT_BK * hd + 2 * ATT_QT) * sizeof(float);
  if (!mc_cuda_attn_smem_ok(be, (const void *)k_attn_dq<MC>, smem_q, "attn_bwd") ||
      !mc_cuda_attn_smem_ok(be, (const void *)k_attn_dkv<MC>, smem_kv, "attn_bwd"))
    return;
  dim3 gq((unsigned)((T + ATT_FQ - 1) / ATT_FQ), (unsigned)H, (unsigned)n_seq);
  k_attn_dq<MC><<<gq, ATT_WARPS * 32, smem_q, st>>>(q, k, v, lse, D, dout, T, H, KV, hd, scale, dq);
  dim3 gk((unsigned)((T + ATT_BK - 1) / ATT_BK), (unsigned)KV, (unsigned)n_seq);
  k_attn_dkv<MC><<<gk, ATT_WARPS * 32, smem_kv, st>>>(q, k, v, lse, D, dout, T, H, KV, hd, scale, dk, dv);
  mc_cuda_check(be, "attn_bwd");
}

static const void *op_ptr(mc_operand x) { return x.h ? (const void *)x.h : (const void *)x.f; }
static const void *dst_ptr(mc_dst x) { return x.h ? (const void *)x.h : (const void *)x.f; }

/* Scratch of the fp32 kernels on bf16-stored tensors: each bf16 input widened, a bf16 output
 * computed in fp32 first, plus `extra` floats (the backward's D), carved from one request. */
typedef struct {
  float *at;
} carve;
static const float *widened(mc_backend *be, mc_operand x, int64_t n, carve *c) {
  if (!x.h) return x.f;
  float *w = c->at;
  c->at += (n + 63) / 64 * 64;
  mc_cuda_widen(be, x.h, w, n);
  return w;
}
static int64_t padded(int stored16, int64_t n) { return stored16 ? (n + 63) / 64 * 64 : 0; }

static void cu_attn_fwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV,
                        int hd, mc_dst out, float *lse) {
  if (!attn_args_ok(be, "attn_fwd", n_seq, T, H, KV, hd)) return;
  if (use_tc(be, hd, op_ptr(q), op_ptr(k), op_ptr(v), dst_ptr(out), dst_ptr(out), dst_ptr(out))) {
    mc_cuda_attn_tc_fwd_ex(be, q, k, v, n_seq, T, H, KV, hd, out, lse);
    return;
  }
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  const int64_t need = padded(!!q.h, nq) + padded(!!k.h, nk) + padded(!!v.h, nk) + padded(!!out.h, nq);
  carve c = {NULL};
  if (need && !(c.at = (float *)mc_cuda_scratch(be, (size_t)need * sizeof(float), "attn_fwd"))) return;
  const float *qf = widened(be, q, nq, &c), *kf = widened(be, k, nk, &c), *vf = widened(be, v, nk, &c);
  float *of = out.h ? c.at : out.f;
  if (hd <= 32) attn_fwd_mc<1>(be, qf, kf, vf, n_seq, T, H, KV, hd, of, lse);
  else if (hd <= 64) attn_fwd_mc<2>(be, qf, kf, vf, n_seq, T, H, KV, hd, of, lse);
  else if (hd <= 128) attn_fwd_mc<4>(be, qf, kf, vf, n_seq, T, H, KV, hd, of, lse);
  else attn_fwd_mc<8>(be, qf, kf, vf, n_seq, T, H, KV, hd, of, lse);
  if (out.h) mc_cuda_round(be, of, out.h, nq);
}

static void cu_attn_bwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out, const float *lse,
                        mc_operand dout, int n_seq, int T, int H, int KV, int hd, float *dq, float *dk, float *dv) {
  if (!attn_args_ok(be, "attn_bwd", n_seq, T, H, KV, hd)) return;
  if (use_tc(be, hd, op_ptr(q), op_ptr(k), op_ptr(v), op_ptr(out), op_ptr(dout), dq) &&
      use_tc(be, hd, dk, dv, dq, dq, dq, dq)) {
    mc_cuda_attn_tc_bwd_ex(be, q, k, v, out, lse, dout, n_seq, T, H, KV, hd, dq, dk, dv);
    return;
  }
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd, items = n * H;
  const int64_t need = padded(!!q.h, nq) + padded(!!k.h, nk) + padded(!!v.h, nk) + padded(!!out.h, nq) +
                       padded(!!dout.h, nq) + items;
  carve c = {NULL};
  if (!(c.at = (float *)mc_cuda_scratch(be, (size_t)need * sizeof(float), "attn_bwd"))) return;
  const float *qf = widened(be, q, nq, &c), *kf = widened(be, k, nk, &c), *vf = widened(be, v, nk, &c);
  const float *of = widened(be, out, nq, &c), *df = widened(be, dout, nq, &c);
  float *D = c.at;
  k_attn_delta<<<(unsigned)((items + 7) / 8 < (1 << 20) ? (items + 7) / 8 : (1 << 20)), 256, 0, mc_cu_stream(be)>>>(
      of, df, items, hd, D);
  if (hd <= 32) attn_bwd_mc<1>(be, qf, kf, vf, lse, D, df, n_seq, T, H, KV, hd, dq, dk, dv);
  else if (hd <= 64) attn_bwd_mc<2>(be, qf, kf, vf, lse, D, df, n_seq, T, H, KV, hd, dq, dk, dv);
  else if (hd <= 128) attn_bwd_mc<4>(be, qf, kf, vf, lse, D, df, n_seq, T, H, KV, hd, dq, dk, dv);
  else attn_bwd_mc<8>(be, qf, kf, vf, lse, D, df, n_seq, T, H, KV, hd, dq, dk, dv);
}

void mc_cuda_install_attn(mc_backend *be) {
  be->attn_fwd = cu_attn_fwd;
  be->attn_bwd = cu_attn_bwd;
}
