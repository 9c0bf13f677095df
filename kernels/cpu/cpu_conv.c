/* Causal depthwise convolution over time, per sequence:
 * y_t[ch] = b[ch] + sum_j w[ch, j] x_{t-K+1+j}[ch], with zeros before the sequence start. */
#include "kernels/cpu/cpu.h"

void mc_cpu_conv_fwd(mc_backend *be, const float *x, const float *w, const float *b, int n_seq,
                     int T, int c, int K, float *y) {
  (void)be;
#pragma omp parallel for if ((int64_t)n_seq * T * c * K > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++) {
    for (int s = 0; s < n_seq; s++) {
      for (int t = 0; t < T; t++) {
        float acc = b[ch];
        for (int j = 0; j < K; j++) {
          int tt = t - K + 1 + j;
          if (tt >= 0) acc += w[(int64_t)ch * K + j] * x[((int64_t)s * T + tt) * c + ch];
        }
        y[((int64_t)s * T + t) * c + ch] = acc;
      }
    }
  }
}

void mc_cpu_conv_bwd(mc_backend *be, const float *x, const float *w, const float *dy, int n_seq,
                     int T, int c, int K, float *dx, float *dw, float *db) {
  (void)be;
  /* One task per channel: it alone touches dw[ch, :], db[ch] and column ch of dx. */
#pragma omp parallel for if ((int64_t)n_seq * T * c * K > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++) {
    double gb = 0.0;
    for (int s = 0; s < n_seq; s++) {
      for (int t = 0; t < T; t++) {
        float g = dy[((int64_t)s * T + t) * c + ch];
        gb += g;
        for (int j = 0; j < K; j++) {
          int tt = t - K + 1 + j;
          if (tt < 0) continue;
          int64_t o = ((int64_t)s * T + tt) * c + ch;
          dx[o] += w[(int64_t)ch * K + j] * g;
          dw[(int64_t)ch * K + j] += g * x[o];
        }
      }
    }
    db[ch] += (float)gb;
  }
}
