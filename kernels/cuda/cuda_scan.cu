/* Ops along time: causal depthwise convolution, the Mamba-2 selective scan and the RG-LRU
 * scan (formulas as in kernels/cpu/cpu_conv.c, cpu_ssm.c, cpu_rglru.c).
 * The selective scan runs one warp per (sequence, head, channel p) with the N states of
 * that channel spread over the lanes (N <= 256), sequential in time; its backward keeps
 * the states at chunk boundaries (chunk ~ sqrt(T) steps) in scratch, recomputes one chunk
 * at a time and runs the adjoint recurrence backwards through it, so scratch grows as
 * sqrt(T) per channel instead of T. Gradients shared by the channels of a block (dB, dC,
 * ddt) are summed over the block's warps in shared memory before one atomic add each. */
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
#define SSM_WARPS 8 /* channels p per block */
#define SSM_NPL 8   /* states per lane: N <= 256 */

__global__ void __launch_bounds__(SSM_WARPS * 32)
    k_ssm_fwd(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D, int T,
              int Hm, int P, int N, float *y) {
  const int s = blockIdx.z, h = blockIdx.y, p = blockIdx.x * SSM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (p >= P) return;
  const int64_t xs = (int64_t)Hm * P;
  const float A = -expf(A_log[h]), Dh = D[h];
  float S[SSM_NPL];
#pragma unroll
  for (int i = 0; i < SSM_NPL; i++) S[i] = 0.0f;
  for (int t = 0; t < T; t++) {
    const int64_t r = (int64_t)s * T + t;
    const float d = dt[r * Hm + h], a = expf(d * A), xp = x[r * xs + (int64_t)h * P + p], u = d * xp;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < SSM_NPL; i++) {
      const int n = lane + 32 * i;
      if (n < N) {
        S[i] = a * S[i] + u * B[r * N + n];
        acc += C[r * N + n] * S[i];
      }
    }
    acc = mc_d_warp_sum(acc);
    if (lane == 0) y[r * xs + (int64_t)h * P + p] = acc + Dh * xp;
  }
}

__global__ void __launch_bounds__(SSM_WARPS * 32)
    k_ssm_bwd(const float *x, const float *dt, const float *A_log, const float *B, const float *C, const float *D,
              const float *dy, int s0, int T, int Hm, int P, int N, int CH, int nch, float *dx, float *ddt, float *dB,
              float *dC, double *dAD, float *scratch) {
  __shared__ float redB[SSM_WARPS][32 * SSM_NPL], redC[SSM_WARPS][32 * SSM_NPL];
  __shared__ double redT[SSM_WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = s0 + blockIdx.z, h = blockIdx.y, p = blockIdx.x * SSM_WARPS + warp;
  const bool active = p < P;
  const int64_t xs = (int64_t)Hm * P, xo = (int64_t)h * P + p;
  const int64_t wid = (((int64_t)blockIdx.z * Hm + h) * gridDim.x + blockIdx.x) * SSM_WARPS + warp;
  float *ck = scratch + wid * (int64_t)(nch + CH) * N; /* state before each chunk */
  float *buf = ck + (int64_t)nch * N;                   /* states inside the current chunk */
  const float A = -expf(A_log[h]), Dh = D[h];
  float S[SSM_NPL], dS[SSM_NPL];
#pragma unroll
  for (int i = 0; i < SSM_NPL; i++) S[i] = dS[i] = 0.0f;
  /* pass 1: chunk-boundary states */
  if (active)
    for (int t = 0; t < T; t++) {
      if (t % CH == 0)
#pragma unroll
        for (int i = 0; i < SSM_NPL; i++)
          if (lane + 32 * i < N) ck[(int64_t)(t / CH) * N + lane + 32 * i] = S[i];
      const int64_t r = (int64_t)s * T + t;
      const float d = dt[r * Hm + h], a = expf(d * A), u = d * x[r * xs + xo];
#pragma unroll
      for (int i = 0; i < SSM_NPL; i++)
        if (lane + 32 * i < N) S[i] = a * S[i] + u * B[r * N + lane + 32 * i];
    }
  double dAh = 0.0, dDh = 0.0;
  for (int c = nch - 1; c >= 0; c--) {
    const int t0 = c * CH, t1 = min(T, t0 + CH);
    if (active) { /* recompute the chunk's states */
#pragma unroll
      for (int i = 0; i < SSM_NPL; i++)
        if (lane + 32 * i < N) S[i] = ck[(int64_t)c * N + lane + 32 * i];
      for (int t = t0; t < t1; t++) {
        const int64_t r = (int64_t)s * T + t;
        const float d = dt[r * Hm + h], a = expf(d * A), u = d * x[r * xs + xo];
#pragma unroll
        for (int i = 0; i < SSM_NPL; i++) {
          const int n = lane + 32 * i;
          if (n < N) {
            S[i] = a * S[i] + u * B[r * N + n];
            buf[(int64_t)(t - t0) * N + n] = S[i];
          }
        }
      }
    }
    for (int t = t1 - 1; t >= t0; t--) {
      const int64_t r = (int64_t)s * T + t;
      const float d = dt[r * Hm + h], a = expf(d * A);
      float gxp = 0.0f;
      double ddt_in = 0.0, dprev = 0.0;
      if (active) {
        const float g = dy[r * xs + xo], xp = x[r * xs + xo];
        const float *St = buf + (int64_t)(t - t0) * N, *Sp = t > t0 ? St - N : ck + (int64_t)c * N;
#pragma unroll
        for (int i = 0; i < SSM_NPL; i++) {
          const int n = lane + 32 * i;
          float cB = 0.0f, cC = 0.0f;
          if (n < N) {
            const float v = dS[i] + g * C[r * N + n];
            dS[i] = v;
            cC = g * St[n];
            gxp += v * B[r * N + n];
            cB = d * v * xp;
            ddt_in += (double)v * xp * B[r * N + n];
            dprev += (double)v * Sp[n]; /* at t == 0 the chunk-0 checkpoint is the zero state */
          }
          redB[warp][lane + 32 * i] = cB;
          redC[warp][lane + 32 * i] = cC;
        }
        const float gx = mc_d_warp_sum(gxp);
        ddt_in = mc_d_warp_sumd(ddt_in);
        dprev = mc_d_warp_sumd(dprev);
        if (lane == 0) {
          dx[r * xs + xo] += Dh * g + d * gx;
          dDh += (double)g * xp;
          dAh += dprev * d * a;
          redT[warp] = ddt_in + dprev * A * a;
        }
      } else {
#pragma unroll
        for (int i = 0; i < SSM_NPL; i++) redB[warp][lane + 32 * i] = redC[warp][lane + 32 * i] = 0.0f;
        if (lane == 0) redT[warp] = 0.0;
      }
      __syncthreads();
      for (int n = threadIdx.x; n < N; n += blockDim.x) {
        float sb = 0.0f, sc = 0.0f;
        for (int w = 0; w < SSM_WARPS; w++) sb += redB[w][n], sc += redC[w][n];
        atomicAdd(&dB[r * N + n], sb);
        atomicAdd(&dC[r * N + n], sc);
      }
      if (threadIdx.x == 0) {
        double st = 0.0;
        for (int w = 0; w < SSM_WARPS; w++) st += redT[w];
        atomicAdd(&ddt[r * Hm + h], (float)st);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < SSM_NPL; i++) dS[i] *= a;
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
  if (N <= 0 || N > 32 * SSM_NPL || n_seq > 65535 || Hm > 65535) {
    mc_cuda_fail(be, "%s: unsupported shape n_seq=%d heads=%d state=%d (state 1..%d)", op, n_seq, Hm, N, 32 * SSM_NPL);
    return 0;
  }
  return 1;
}

static void cu_ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, int n_seq, int T, int Hm, int P, int N, float *y) {
  if (!ssm_args_ok(be, "ssm_fwd", n_seq, T, Hm, P, N)) return;
  dim3 grid((unsigned)((P + SSM_WARPS - 1) / SSM_WARPS), (unsigned)Hm, (unsigned)n_seq);
  k_ssm_fwd<<<grid, SSM_WARPS * 32, 0, mc_cu_stream(be)>>>(x, dt, A_log, B, C, D, T, Hm, P, N, y);
  mc_cuda_check(be, "ssm_fwd");
}

/* Scratch per launch is bounded: sequences are processed in waves that fit this budget. */
#define SSM_SCRATCH_BUDGET ((size_t)1 << 30)

static void cu_ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log, const float *B,
                       const float *C, const float *D, const float *dy, int n_seq, int T, int Hm, int P, int N,
                       float *dx, float *ddt, float *dA_log, float *dB, float *dC, float *dD) {
  if (!ssm_args_ok(be, "ssm_bwd", n_seq, T, Hm, P, N)) return;
  int CH = (int)ceil(sqrt((double)T));
  int nch = (T + CH - 1) / CH;
  const int pblocks = (P + SSM_WARPS - 1) / SSM_WARPS;
  const size_t per_seq = (size_t)Hm * pblocks * SSM_WARPS * (size_t)(nch + CH) * N * sizeof(float);
  int wave = (int)(SSM_SCRATCH_BUDGET / per_seq);
  if (wave < 1) wave = 1;
  if (wave > n_seq) wave = n_seq;
  const size_t head = ((size_t)2 * Hm * sizeof(double) + 255) / 256 * 256;
  char *scr = (char *)mc_cuda_scratch(be, head + per_seq * wave, "ssm_bwd");
  if (!scr) return;
  double *dAD = (double *)scr;
  cudaStream_t st = mc_cu_stream(be);
  cudaMemsetAsync(dAD, 0, (size_t)2 * Hm * sizeof(double), st);
  for (int s0 = 0; s0 < n_seq; s0 += wave) {
    int ns = n_seq - s0 < wave ? n_seq - s0 : wave;
    dim3 grid((unsigned)pblocks, (unsigned)Hm, (unsigned)ns);
    k_ssm_bwd<<<grid, SSM_WARPS * 32, 0, st>>>(x, dt, A_log, B, C, D, dy, s0, T, Hm, P, N, CH, nch, dx, ddt, dB, dC, dAD,
                                               (float *)(scr + head));
  }
  k_ssm_params<<<mc_cu_grid(Hm), MC_CUDA_THREADS, 0, st>>>(dAD, Hm, dA_log, dD);
  mc_cuda_check(be, "ssm_bwd");
}

/* ---- RG-LRU: one thread per (sequence, channel), sequential in time */
__global__ void k_rglru_fwd(const float *gx, const float *r, const float *lambda, int n_seq, int T, int c, float *h) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int ch = (int)(i % c);
    const int64_t s = i / c;
    const float k = -8.0f * mc_d_softplus(lambda[ch]);
    float hp = 0.0f;
    for (int t = 0; t < T; t++) {
      const int64_t o = (s * T + t) * c + ch;
      const float l = k * r[o], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
      hp = a * hp + m * gx[o];
      h[o] = hp;
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
    for (int t = T - 1; t >= 0; t--) {
      const int64_t o = (s * T + t) * c + ch;
      const float l = k * r[o], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
      const float g = dh[o] + carry;
      const float hp = t > 0 ? h[o - c] : 0.0f;
      dgx[o] += g * m;
      const float dl = g * (a * hp - gx[o] * a * a / fmaxf(m, 1e-6f));
      dr[o] += k * dl;
      dlam += (double)dl * (-8.0f) * sg * r[o];
      carry = g * a;
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
