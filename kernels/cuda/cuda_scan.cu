/* Ops along time: causal depthwise convolution, the Mamba-2 selective scan and the RG-LRU
 * scan (formulas as in kernels/cpu/cpu_conv.c, cpu_ssm.c, cpu_rglru.c).
 * The selective scan runs one warp per (sequence, head, channel p) with the N states of
 * that channel spread over the lanes (N <= 256), sequential in time, loading the inputs of
 * several steps ahead of use; its backward keeps
 * the states at chunk boundaries (chunk ~ sqrt(T) steps) in scratch, recomputes one chunk
 * at a time and runs the adjoint recurrence backwards through it, so scratch grows as
 * sqrt(T) per channel instead of T. Gradients shared by the channels of a block (dB, dC,
 * ddt) are summed over the block's 16 warps in shared memory (double-buffered: one barrier
 * per step) before one atomic add each. */
#include <math.h>

#include "kernels/cuda/cuda_common.h"

/* ---- depthwise causal conv */
__global__ void k_conv_fwd(const float *x, const float *w, const float *b, int64_t n, int T, int c, int K, float *y) {
  MC_CU_FOR(i, n * c) {
    const int ch = (int)(i % c);
    const int64_t r = i / c;
    const int t = (int)(r % T);
    float acc = b[ch];
    for (int j = 0; j < K; j++) {
      int back = K - 1 - j;
      if (t - back >= 0) acc += w[(int64_t)ch * K + j] * x[(r - back) * c + ch];
    }
    y[i] = acc;
  }
}

/* dx_t = sum_j w_j dy_{t+K-1-j} within the sequence: a gather, so no atomics. */
__global__ void k_conv_bwd_dx(const float *w, const float *dy, int64_t n, int T, int c, int K, float *dx) {
  MC_CU_FOR(i, n * c) {
    const int ch = (int)(i % c);
    const int64_t r = i / c;
    const int t = (int)(r % T);
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
      int fwd = K - 1 - j;
      if (t + fwd < T) acc += w[(int64_t)ch * K + j] * dy[(r + fwd) * c + ch];
    }
    dx[i] += acc;
  }
}

struct conv_dw {
  const float *x, *dy;
  int T, c, K;
  __device__ double operator()(int r, int col) const {
    int ch = col / K, back = K - 1 - col % K;
    if (r % T < back) return 0.0;
    return (double)dy[(int64_t)r * c + ch] * x[((int64_t)r - back) * c + ch];
  }
};

struct conv_db {
  const float *dy;
  int c;
  __device__ double operator()(int r, int ch) const { return dy[(int64_t)r * c + ch]; }
};

static void cu_conv_fwd(mc_backend *be, const float *x, const float *w, const float *b, int n_seq, int T, int c, int K,
                        float *y) {
  int64_t n = (int64_t)n_seq * T;
  if (n * c <= 0) return;
  k_conv_fwd<<<mc_cu_grid(n * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, w, b, n, T, c, K, y);
  mc_cuda_check(be, "conv_fwd");
}

static void cu_conv_bwd(mc_backend *be, const float *x, const float *w, const float *dy, int n_seq, int T, int c, int K,
                        float *dx, float *dw, float *db) {
  int64_t n = (int64_t)n_seq * T;
  if (n * c <= 0) return;
  k_conv_bwd_dx<<<mc_cu_grid(n * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(w, dy, n, T, c, K, dx);
  mc_cuda_check(be, "conv_bwd");
  mc_cuda_colsum(be, conv_dw{x, dy, T, c, K}, (int)n, c * K, dw, "conv_bwd (weight)");
  mc_cuda_colsum(be, conv_db{dy, c}, (int)n, c, db, "conv_bwd (bias)");
}

/* ---- Mamba-2 selective scan */
#define SSM_WARPS 8  /* channels p per block */
#define SSM_MAXN 256 /* states: NPL = ceil(N / 32) <= 8 per lane, a template parameter */
#define SSM_BWARPS 16 /* channels per block in the backward: fewer atomic adds of dB, dC, ddt */

/* Steps whose inputs are loaded ahead of use: each step's arithmetic is short, so the loads of
 * U steps are issued together to cover memory latency (fewer for wide states: registers). */
template <int NPL>
struct ssm_u {
  static constexpr int U = NPL <= 2 ? 8 : NPL == 4 ? 4 : 2; /* forward passes */
  static constexpr int RU = NPL <= 2 ? 4 : NPL == 4 ? 2 : 1; /* the backward's reverse pass */
};

/* The inputs of step t (clamped into the sequence, so every load is in bounds). */
template <int NPL>
static __device__ __forceinline__ void ssm_load(int64_t r, int Hm, int h, int64_t xs, int64_t xo, int N, int lane,
                                                const float *dt, const float *x, const float *B, const float *C,
                                                float &d, float &xp, float (&Bv)[NPL], float (&Cv)[NPL]) {
  d = dt[r * Hm + h];
  xp = x[r * xs + xo];
#pragma unroll
  for (int i = 0; i < NPL; i++) {
    const int n = lane + 32 * i;
    Bv[i] = n < N ? B[r * N + n] : 0.0f;
    Cv[i] = n < N ? C[r * N + n] : 0.0f;
  }
}

template <int NPL>
__global__ void __launch_bounds__(SSM_WARPS * 32)
    k_ssm_fwd(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D, int T,
              int Hm, int P, int N, float *y) {
  constexpr int U = ssm_u<NPL>::U;
  const int s = blockIdx.z, h = blockIdx.y, p = blockIdx.x * SSM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (p >= P) return;
  const int64_t xs = (int64_t)Hm * P, xo = (int64_t)h * P + p, row0 = (int64_t)s * T;
  const float A = -expf(A_log[h]), Dh = D[h];
  float S[NPL];
#pragma unroll
  for (int i = 0; i < NPL; i++) S[i] = 0.0f;
  for (int t0 = 0; t0 < T; t0 += U) {
    float dv[U], xv[U], Bv[U][NPL], Cv[U][NPL];
#pragma unroll
    for (int u = 0; u < U; u++)
      ssm_load<NPL>(row0 + min(t0 + u, T - 1), Hm, h, xs, xo, N, lane, dt, x, B, C, dv[u], xv[u], Bv[u], Cv[u]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (t0 + u >= T) break; /* warp-uniform */
      const float a = expf(dv[u] * A), uu = dv[u] * xv[u];
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < NPL; i++) {
        S[i] = a * S[i] + uu * Bv[u][i];
        acc += Cv[u][i] * S[i];
      }
      acc = mc_d_warp_sum(acc);
      if (lane == 0) y[(row0 + t0 + u) * xs + xo] = acc + Dh * xv[u];
    }
  }
}

/* Advances S through steps [t0, t1), storing S before step t where t % CH == 0 into ck (pass 1)
 * or after every step into buf (chunk replay). */
template <int NPL>
static __device__ __forceinline__ void ssm_advance(float (&S)[NPL], int t0, int t1, int T, int64_t row0, int Hm, int h,
                                                   int64_t xs, int64_t xo, int N, int lane, float A, const float *dt,
                                                   const float *x, const float *B, int CH, float *ck, float *buf) {
  constexpr int U = ssm_u<NPL>::U;
  for (int tb = t0; tb < t1; tb += U) {
    float dv[U], xv[U], Bv[U][NPL], Cv[U][NPL];
#pragma unroll
    for (int u = 0; u < U; u++)
      ssm_load<NPL>(row0 + min(tb + u, T - 1), Hm, h, xs, xo, N, lane, dt, x, B, B, dv[u], xv[u], Bv[u], Cv[u]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int t = tb + u;
      if (t >= t1) break;
      if (ck && t % CH == 0)
#pragma unroll
        for (int i = 0; i < NPL; i++)
          if (lane + 32 * i < N) ck[(int64_t)(t / CH) * N + lane + 32 * i] = S[i];
      const float a = expf(dv[u] * A), uu = dv[u] * xv[u];
#pragma unroll
      for (int i = 0; i < NPL; i++) {
        S[i] = a * S[i] + uu * Bv[u][i];
        if (buf && lane + 32 * i < N) buf[(int64_t)(t - t0) * N + lane + 32 * i] = S[i];
      }
    }
  }
}

template <int NPL>
__global__ void __launch_bounds__(SSM_BWARPS * 32)
    k_ssm_bwd(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D,
              const float *dy, int s0, int T, int Hm, int P, int N, int CH, int nch, float *dx, float *ddt, float *dB,
              float *dC, double *dAD, float *scratch) {
  /* per-step partial sums of the block's warps, double-buffered by step parity so that one
   * barrier per step suffices: a buffer is rewritten two steps later, after the next barrier */
  extern __shared__ double ssm_smem[];
  double *redT = ssm_smem;                                   /* [2][SSM_BWARPS] */
  float *redB = (float *)(redT + 2 * SSM_BWARPS);            /* [2][SSM_BWARPS][32 * NPL] */
  float *redC = redB + 2 * SSM_BWARPS * 32 * NPL;            /* [2][SSM_BWARPS][32 * NPL] */
  int parity = 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = s0 + blockIdx.z, h = blockIdx.y, p = blockIdx.x * SSM_BWARPS + warp;
  const bool active = p < P;
  const int64_t xs = (int64_t)Hm * P, xo = (int64_t)h * P + (active ? p : 0), row0 = (int64_t)s * T;
  const int64_t wid = (((int64_t)blockIdx.z * Hm + h) * gridDim.x + blockIdx.x) * SSM_BWARPS + warp;
  float *ck = scratch + wid * (int64_t)(nch + CH) * N; /* state before each chunk */
  float *buf = ck + (int64_t)nch * N;                   /* states inside the current chunk */
  const float A = -expf(A_log[h]), Dh = D[h];
  float S[NPL], dS[NPL];
#pragma unroll
  for (int i = 0; i < NPL; i++) S[i] = dS[i] = 0.0f;
  /* pass 1: chunk-boundary states */
  if (active) ssm_advance<NPL>(S, 0, T, T, row0, Hm, h, xs, xo, N, lane, A, dt, x, B, CH, ck, NULL);
  double dAh = 0.0, dDh = 0.0;
  for (int c = nch - 1; c >= 0; c--) {
    const int t0 = c * CH, t1 = min(T, t0 + CH);
    if (active) { /* recompute the chunk's states */
#pragma unroll
      for (int i = 0; i < NPL; i++) S[i] = lane + 32 * i < N ? ck[(int64_t)c * N + lane + 32 * i] : 0.0f;
      ssm_advance<NPL>(S, t0, t1, T, row0, Hm, h, xs, xo, N, lane, A, dt, x, B, CH, NULL, buf);
    }
    for (int tb = t1 - 1; tb >= t0; tb -= ssm_u<NPL>::RU) {
      /* the inputs of steps tb, tb-1, ..., loaded together */
      constexpr int U = ssm_u<NPL>::RU;
      float dv[U], xv[U], gv[U], Bv[U][NPL], Cv[U][NPL], Sv[U][NPL], Spv[U][NPL];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int t = max(tb - u, t0);
        const int64_t r = row0 + t;
        ssm_load<NPL>(r, Hm, h, xs, xo, N, lane, dt, x, B, C, dv[u], xv[u], Bv[u], Cv[u]);
        gv[u] = dy[r * xs + xo];
        const float *St = buf + (int64_t)(t - t0) * N, *Sp = t > t0 ? St - N : ck + (int64_t)c * N;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
          const int n = lane + 32 * i;
          Sv[u][i] = n < N ? St[n] : 0.0f;
          Spv[u][i] = n < N ? Sp[n] : 0.0f; /* at t == 0 the chunk-0 checkpoint is the zero state */
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int t = tb - u;
        if (t < t0) break; /* block-uniform */
        const int64_t r = row0 + t;
        const float d = dv[u], a = expf(d * A), g = gv[u], xp = xv[u];
        float gxp = 0.0f;
        double ddt_in = 0.0, dprev = 0.0;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
          const float v = dS[i] + g * Cv[u][i];
          dS[i] = v;
          const int o = (parity * SSM_BWARPS + warp) * 32 * NPL + lane + 32 * i;
          redC[o] = active ? g * Sv[u][i] : 0.0f;
          redB[o] = active ? d * v * xp : 0.0f;
          gxp += v * Bv[u][i];
          ddt_in += (double)v * xp * Bv[u][i];
          dprev += (double)v * Spv[u][i];
        }
        const float gx = mc_d_warp_sum(gxp);
        ddt_in = mc_d_warp_sumd(ddt_in);
        dprev = mc_d_warp_sumd(dprev);
        if (lane == 0) {
          if (active) {
            dx[r * xs + xo] += Dh * g + d * gx;
            dDh += (double)g * xp;
            dAh += dprev * d * a;
          }
          redT[parity * SSM_BWARPS + warp] = active ? ddt_in + dprev * A * a : 0.0;
        }
        __syncthreads();
        for (int n = threadIdx.x; n < N; n += blockDim.x) {
          float sb = 0.0f, sc = 0.0f;
          for (int w = 0; w < SSM_BWARPS; w++) {
            const int o = (parity * SSM_BWARPS + w) * 32 * NPL + n;
            sb += redB[o], sc += redC[o];
          }
          atomicAdd(&dB[r * N + n], sb);
          atomicAdd(&dC[r * N + n], sc);
        }
        if (threadIdx.x == 0) {
          double st = 0.0;
          for (int w = 0; w < SSM_BWARPS; w++) st += redT[parity * SSM_BWARPS + w];
          atomicAdd(&ddt[r * Hm + h], (float)st);
        }
        parity ^= 1;
#pragma unroll
        for (int i = 0; i < NPL; i++) dS[i] *= a;
      }
    }
  }
  if (active && lane == 0) {
    atomicAdd(&dAD[2 * h], dAh * A);
    atomicAdd(&dAD[2 * h + 1], dDh);
  }
}

__global__ void k_ssm_params(const double *dAD, int Hm, float *dA_log, float *dD) {
  MC_CU_FOR(h, Hm) {
    dA_log[h] += (float)dAD[2 * h];
    dD[h] += (float)dAD[2 * h + 1];
  }
}

static int ssm_args_ok(mc_backend *be, const char *op, int n_seq, int T, int Hm, int P, int N) {
  if (n_seq <= 0 || T <= 0 || Hm <= 0 || P <= 0) return 0;
  if (N <= 0 || N > SSM_MAXN || n_seq > 65535 || Hm > 65535) {
    mc_cuda_fail(be, "%s: unsupported shape n_seq=%d heads=%d state=%d (state 1..%d)", op, n_seq, Hm, N, SSM_MAXN);
    return 0;
  }
  return 1;
}

template <int NPL>
static void ssm_fwd_npl(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                        const float *C, const float *D, int n_seq, int T, int Hm, int P, int N, float *y) {
  dim3 grid((unsigned)((P + SSM_WARPS - 1) / SSM_WARPS), (unsigned)Hm, (unsigned)n_seq);
  k_ssm_fwd<NPL><<<grid, SSM_WARPS * 32, 0, mc_cu_stream(be)>>>(x, dt, A_log, B, C, D, T, Hm, P, N, y);
}

static void cu_ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, int n_seq, int T, int Hm, int P, int N, float *y) {
  if (!ssm_args_ok(be, "ssm_fwd", n_seq, T, Hm, P, N)) return;
  if (N <= 32) ssm_fwd_npl<1>(be, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  else if (N <= 64) ssm_fwd_npl<2>(be, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  else if (N <= 128) ssm_fwd_npl<4>(be, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  else ssm_fwd_npl<8>(be, x, dt, A_log, B, C, D, n_seq, T, Hm, P, N, y);
  mc_cuda_check(be, "ssm_fwd");
}

template <int NPL>
static void ssm_bwd_npl(mc_backend *be, dim3 grid, const float *x, const float *dt, const float *A_log, const float *B,
                        const float *C, const float *D, const float *dy, int s0, int T, int Hm, int P, int N, int CH,
                        int nch, float *dx, float *ddt, float *dB, float *dC, double *dAD, float *scratch) {
  const size_t smem = 2 * SSM_BWARPS * sizeof(double) + (size_t)4 * SSM_BWARPS * 32 * NPL * sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute((const void *)k_ssm_bwd<NPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
      cudaGetLastError();
      mc_cuda_fail(be, "ssm_bwd: %zu bytes of shared memory: %s", smem, cudaGetErrorString(e));
      return;
    }
  }
  k_ssm_bwd<NPL><<<grid, SSM_BWARPS * 32, smem, mc_cu_stream(be)>>>(x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch,
                                                                   dx, ddt, dB, dC, dAD, scratch);
}

/* Scratch per launch is bounded: sequences are processed in waves that fit this budget. */
#define SSM_SCRATCH_BUDGET ((size_t)1 << 30)

static void cu_ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, const float *dy, int n_seq, int T, int Hm, int P, int N,
                       float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD) {
  if (!ssm_args_ok(be, "ssm_bwd", n_seq, T, Hm, P, N)) return;
  int CH = (int)ceil(sqrt((double)T));
  int nch = (T + CH - 1) / CH;
  const int pblocks = (P + SSM_BWARPS - 1) / SSM_BWARPS;
  const size_t per_seq = (size_t)Hm * pblocks * SSM_BWARPS * (size_t)(nch + CH) * N * sizeof(float);
  int wave = (int)(SSM_SCRATCH_BUDGET / per_seq);
  if (wave < 1) wave = 1;
  if (wave > n_seq) wave = n_seq;
  const size_t head = ((size_t)2 * Hm * sizeof(double) + 255) / 256 * 256;
  char *scr = (char *)mc_cuda_scratch(be, head + per_seq * wave, "ssm_bwd");
  if (!scr) return;
  double *dAD = (double *)scr;
  float *states = (float *)(scr + head);
  cudaStream_t st = mc_cu_stream(be);
  cudaMemsetAsync(dAD, 0, (size_t)2 * Hm * sizeof(double), st);
  for (int s0 = 0; s0 < n_seq; s0 += wave) {
    int ns = n_seq - s0 < wave ? n_seq - s0 : wave;
    dim3 grid((unsigned)pblocks, (unsigned)Hm, (unsigned)ns);
    if (N <= 32) ssm_bwd_npl<1>(be, grid, x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch, dx, ddt, dB, dC, dAD, states);
    else if (N <= 64) ssm_bwd_npl<2>(be, grid, x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch, dx, ddt, dB, dC, dAD, states);
    else if (N <= 128) ssm_bwd_npl<4>(be, grid, x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch, dx, ddt, dB, dC, dAD, states);
    else ssm_bwd_npl<8>(be, grid, x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch, dx, ddt, dB, dC, dAD, states);
  }
  k_ssm_params<<<mc_cu_grid(Hm), MC_CUDA_THREADS, 0, st>>>(dAD, Hm, dA_log, dD);
  mc_cuda_check(be, "ssm_bwd");
}

/* ---- RG-LRU: one thread per (sequence, channel), sequential in time; the inputs of
 * RG_U steps are loaded together to cover memory latency. */
#define RG_U 8

__global__ void k_rglru_fwd(const float *gx, const float *r, const float *lambda, int n_seq, int T, int c, float *h) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int ch = (int)(i % c);
    const int64_t s = i / c;
    const float k = -8.0f * mc_d_softplus(lambda[ch]);
    float hp = 0.0f;
    for (int t0 = 0; t0 < T; t0 += RG_U) {
      float rv[RG_U], gv[RG_U];
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int64_t o = (s * T + min(t0 + u, T - 1)) * c + ch;
        rv[u] = r[o], gv[u] = gx[o];
      }
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        if (t0 + u >= T) break;
        const float l = k * rv[u], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        hp = a * hp + m * gv[u];
        h[(s * T + t0 + u) * c + ch] = hp;
      }
    }
  }
}

__global__ void k_rglru_bwd(const float *gx, const float *r, const float *lambda, const float *h, const float *dh,
                            int n_seq, int T, int c, float *dgx, float *dr, double *dlam_part) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int ch = (int)(i % c);
    const int64_t s = i / c;
    const float sp = mc_d_softplus(lambda[ch]), k = -8.0f * sp, sg = mc_d_sigmoid(lambda[ch]);
    double dlam = 0.0;
    float carry = 0.0f;
    for (int tb = T - 1; tb >= 0; tb -= RG_U) {
      float rv[RG_U], gv[RG_U], dhv[RG_U], hpv[RG_U];
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int t = max(tb - u, 0);
        const int64_t o = (s * T + t) * c + ch;
        rv[u] = r[o], gv[u] = gx[o], dhv[u] = dh[o];
        hpv[u] = t > 0 ? h[o - c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int t = tb - u;
        if (t < 0) break;
        const int64_t o = (s * T + t) * c + ch;
        const float l = k * rv[u], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        const float g = dhv[u] + carry;
        dgx[o] += g * m;
        const float dl = g * (a * hpv[u] - gv[u] * a * a / fmaxf(m, 1e-6f));
        dr[o] += k * dl;
        dlam += (double)dl * (-8.0f) * sg * rv[u];
        carry = g * a;
      }
    }
    dlam_part[i] = dlam;
  }
}

/* dlambda[ch] += sum over sequences in order (deterministic) */
__global__ void k_rglru_dlambda(const double *part, int n_seq, int c, float *dlambda) {
  MC_CU_FOR(ch, c) {
    double s = 0.0;
    for (int q = 0; q < n_seq; q++) s += part[(int64_t)q * c + ch];
    dlambda[ch] += (float)s;
  }
}

static void cu_rglru_fwd(mc_backend *be, const float *gx, const float *r, const float *lambda, int n_seq, int T, int c,
                         float *h) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  k_rglru_fwd<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(gx, r, lambda, n_seq, T, c, h);
  mc_cuda_check(be, "rglru_fwd");
}

static void cu_rglru_bwd(mc_backend *be, const float *gx, const float *r, const float *lambda, const float *h,
                         const float *dh, int n_seq, int T, int c, float *dgx, float *dr, float *dlambda) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  double *part = (double *)mc_cuda_scratch(be, (size_t)n_seq * c * sizeof(double), "rglru_bwd");
  if (!part) return;
  k_rglru_bwd<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(gx, r, lambda, h, dh, n_seq, T,
                                                                                        c, dgx, dr, part);
  k_rglru_dlambda<<<mc_cu_grid(c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(part, n_seq, c, dlambda);
  mc_cuda_check(be, "rglru_bwd");
}

void mc_cuda_install_scan(mc_backend *be) {
  be->conv_fwd = cu_conv_fwd;
  be->conv_bwd = cu_conv_bwd;
  be->ssm_fwd = cu_ssm_fwd;
  be->ssm_bwd = cu_ssm_bwd;
  be->rglru_fwd = cu_rglru_fwd;
  be->rglru_bwd = cu_rglru_bwd;
}
