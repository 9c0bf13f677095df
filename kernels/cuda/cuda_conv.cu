/* The causal depthwise convolution over time followed by SiLU (kernels/ops.h conv_silu_fwd,
 * conv_silu_bwd; formulas as in kernels/cpu/cpu_conv.c). One thread per channel walks a chunk
 * of CONV_ROWS steps of one sequence, keeping the last K inputs (and, backward, the last K
 * pre-activation gradients) in registers, so each element is read once and written once. The
 * loads of CONV_AHEAD steps are issued together (memory parallelism). The
 * backward recomputes the pre-activation from x, forms dx as a gather (no atomics) and writes
 * per-chunk partial sums of dw and db that a second kernel adds in chunk order (deterministic).
 * Register windows are KM wide (a compile-time bound >= K): weight j sits at window slot
 * KM - K + j, so every register index is a constant and K only guards. */
#include "kernels/cuda/cuda_common.h"

#define CONV_ROWS 64    /* steps per chunk: a thread's serial walk */
#define CONV_THREADS 128
#define CONV_MAX_K 16
#define CONV_AHEAD 4    /* steps whose loads a thread issues before using them */

/* the chunk of a block: sequence s, steps [t0, t1) */
struct conv_chunk {
  int64_t base; /* the sequence's first row */
  int t0, t1;
};
static __device__ __forceinline__ conv_chunk conv_chunk_of(int T) {
  const int cps = (T + CONV_ROWS - 1) / CONV_ROWS, s = blockIdx.x / cps, t0 = (blockIdx.x % cps) * CONV_ROWS;
  return conv_chunk{(int64_t)s * T, t0, min(T, t0 + CONV_ROWS)};
}

/* shifts a window one step and puts v at the newest slot */
template <int KM>
static __device__ __forceinline__ void conv_push(float (&win)[KM], float v) {
#pragma unroll
  for (int i = 0; i < KM - 1; i++) win[i] = win[i + 1];
  win[KM - 1] = v;
}

/* pre = b + sum_j w_j x_{t-K+1+j}: the window's slots from KM - K on, oldest first (the CPU's order) */
template <int KM>
static __device__ __forceinline__ float conv_pre(const float (&wr)[KM], const float (&xw)[KM], int off, float bias) {
  float acc = bias;
#pragma unroll
  for (int i = 0; i < KM; i++)
    if (i >= off) acc = fmaf(wr[i], xw[i], acc);
  return acc;
}

template <int KM>
__global__ void k_conv_silu_fwd(const float *x, const float *w, const float *b, int T, int c, int K, float *y) {
  const int ch = blockIdx.y * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const conv_chunk q = conv_chunk_of(T);
  const int off = KM - K;
  float wr[KM], xw[KM];
#pragma unroll
  for (int i = 0; i < KM; i++) wr[i] = i >= off ? w[(int64_t)ch * K + i - off] : 0.0f, xw[i] = 0.0f;
  const float bias = b[ch];
  for (int t0 = q.t0 - K + 1; t0 < q.t1; t0 += CONV_AHEAD) {
    float xv[CONV_AHEAD];
#pragma unroll
    for (int u = 0; u < CONV_AHEAD; u++) {
      const int t = t0 + u;
      xv[u] = t >= 0 && t < q.t1 ? x[(q.base + t) * c + ch] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < CONV_AHEAD; u++) {
      const int t = t0 + u;
      conv_push(xw, xv[u]);
      if (t >= q.t0 && t < q.t1) {
        const float pre = conv_pre(wr, xw, off, bias);
        y[(q.base + t) * c + ch] = mc_d_silu(pre);
      }
    }
  }
}

/* g_t = dy_t silu'(pre_t) for t in [t0, min(T, t1 + K - 1)) (dx of the chunk's last steps reads
 * the next K - 1 gradients); dx_t = sum_j w_j g_{t+K-1-j}, added in j descending order (the
 * CPU's); dw and db over the chunk's own steps into partw [chunk][c K] and partb [chunk][c]. */
template <int KM>
__global__ void k_conv_silu_bwd(const float *x, const float *w, const float *b, const float *dy, int T, int c, int K,
                                mc_dst dx, double *partw, double *partb) {
  const int ch = blockIdx.y * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const conv_chunk q = conv_chunk_of(T);
  const int off = KM - K, te = min(T, q.t1 + K - 1);
  /* wr[i] = w_{i-off} pairs with the input window; wv[i] = w_{KM-1-i} with the gradient window */
  float wr[KM], wv[KM], xw[KM], gw[KM], dwa[KM];
#pragma unroll
  for (int i = 0; i < KM; i++) {
    wr[i] = i >= off ? w[(int64_t)ch * K + i - off] : 0.0f;
    wv[i] = i >= off ? w[(int64_t)ch * K + KM - 1 - i] : 0.0f;
    xw[i] = gw[i] = dwa[i] = 0.0f;
  }
  const float bias = b[ch];
  float dba = 0.0f;
  for (int t0 = q.t0 - K + 1; t0 < q.t1 + K - 1; t0 += CONV_AHEAD) {
    float xv[CONV_AHEAD], dv[CONV_AHEAD];
#pragma unroll
    for (int u = 0; u < CONV_AHEAD; u++) {
      const int t = t0 + u;
      const int64_t r = (q.base + t) * c + ch;
      xv[u] = t >= 0 && t < te ? x[r] : 0.0f;
      dv[u] = t >= q.t0 && t < te ? dy[r] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < CONV_AHEAD; u++) {
      const int t = t0 + u;
      conv_push(xw, xv[u]);
      float g = 0.0f;
      if (t >= q.t0 && t < te) {
        g = dv[u] * mc_d_silu_df(conv_pre(wr, xw, off, bias));
        if (t < q.t1) {
          dba += g;
#pragma unroll
          for (int i = 0; i < KM; i++)
            if (i >= off) dwa[i] = fmaf(g, xw[i], dwa[i]);
        }
      }
      conv_push(gw, g);
      const int tt = t - K + 1;
      if (tt >= q.t0 && tt < q.t1) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KM; i++)
          if (i >= off) acc = fmaf(wv[i], gw[i], acc);
        mc_d_acc(dx, (q.base + tt) * c + ch, acc);
      }
    }
  }
  const int64_t pw = (int64_t)blockIdx.x * c * K + (int64_t)ch * K - off;
#pragma unroll
  for (int i = 0; i < KM; i++)
    if (i >= off) partw[pw + i] = dwa[i];
  partb[(int64_t)blockIdx.x * c + ch] = dba;
}

/* The launch shape shared by both directions: chunks along x, channel blocks along y; 0 (a
 * failure recorded) for a shape the kernels do not take. */
static int conv_shape(mc_backend *be, const char *op, int n_seq, int T, int c, int K, dim3 *grid, dim3 *block) {
  if ((int64_t)n_seq * T * c <= 0) return 0;
  const int64_t chunks = (int64_t)n_seq * ((T + CONV_ROWS - 1) / CONV_ROWS);
  const int threads = c < CONV_THREADS ? (c + 31) / 32 * 32 : CONV_THREADS;
  const int64_t cblocks = (c + threads - 1) / threads;
  if (K < 1 || K > CONV_MAX_K || chunks > INT32_MAX || cblocks > 65535) {
    mc_cuda_fail(be, "%s: unsupported shape conv_width=%d channels=%d sequences=%d x %d steps (the CUDA backend takes "
                 "conv_width 1 to %d, at most 65535 x %d channels and 2^31 chunks of %d steps)", op, K, c, n_seq, T,
                 CONV_MAX_K, CONV_THREADS, CONV_ROWS);
    return 0;
  }
  *grid = dim3((unsigned)chunks, (unsigned)cblocks);
  *block = dim3((unsigned)threads);
  return 1;
}

static void cu_conv_silu_fwd(mc_backend *be, const float *x, const float *w, const float *b, int n_seq, int T, int c, int K,
                             float *y) {
  dim3 grid, block;
  if (!conv_shape(be, "conv_silu_fwd", n_seq, T, c, K, &grid, &block)) return;
  cudaStream_t st = mc_cu_stream(be);
  if (K <= 4) k_conv_silu_fwd<4><<<grid, block, 0, st>>>(x, w, b, T, c, K, y);
  else if (K <= 8) k_conv_silu_fwd<8><<<grid, block, 0, st>>>(x, w, b, T, c, K, y);
  else k_conv_silu_fwd<CONV_MAX_K><<<grid, block, 0, st>>>(x, w, b, T, c, K, y);
  mc_cuda_check(be, "conv_silu_fwd");
}

static void cu_conv_silu_bwd(mc_backend *be, const float *x, const float *w, const float *b, const float *dy, int n_seq,
                             int T, int c, int K, mc_dst dx, float *dw, float *db) {
  dim3 grid, block;
  if (!conv_shape(be, "conv_silu_bwd", n_seq, T, c, K, &grid, &block)) return;
  const int64_t chunks = grid.x;
  double *partw = (double *)mc_cuda_scratch(be, (size_t)chunks * c * (K + 1) * sizeof(double), "conv_silu_bwd");
  if (!partw) return;
  double *partb = partw + chunks * c * K;
  cudaStream_t st = mc_cu_stream(be);
  if (K <= 4) k_conv_silu_bwd<4><<<grid, block, 0, st>>>(x, w, b, dy, T, c, K, dx, partw, partb);
  else if (K <= 8) k_conv_silu_bwd<8><<<grid, block, 0, st>>>(x, w, b, dy, T, c, K, dx, partw, partb);
  else k_conv_silu_bwd<CONV_MAX_K><<<grid, block, 0, st>>>(x, w, b, dy, T, c, K, dx, partw, partb);
  mc_k_colsum_finish<<<mc_cu_grid((int64_t)c * K), MC_CUDA_THREADS, 0, st>>>(partw, (int)chunks, c * K, dw);
  mc_k_colsum_finish<<<mc_cu_grid(c), MC_CUDA_THREADS, 0, st>>>(partb, (int)chunks, c, db);
  mc_cuda_check(be, "conv_silu_bwd");
}

void mc_cuda_install_conv(mc_backend *be) {
  be->conv_silu_fwd = cu_conv_silu_fwd;
  be->conv_silu_bwd = cu_conv_silu_bwd;
}
