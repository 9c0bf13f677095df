/* The causal depthwise convolution over time (kernels/ops.h conv_fwd, conv_bwd; formulas as
 * in kernels/cpu/cpu_conv.c): one thread per output element, the backward's dx a gather (no
 * atomics) and dw, db deterministic column sums. */
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

void mc_cuda_install_conv(mc_backend *be) {
  be->conv_fwd = cu_conv_fwd;
  be->conv_bwd = cu_conv_bwd;
}
