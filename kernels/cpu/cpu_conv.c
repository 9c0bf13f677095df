/* Causal depthwise convolution over time followed by SiLU, per sequence:
 * pre_t[ch] = b[ch] + sum_j w[ch, j] x_{t-K+1+j}[ch] (zeros before the sequence start),
 * y_t[ch] = silu(pre_t[ch]). The backward recomputes pre from x. */
#include <stdlib.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

/* pre at row base + t, channel ch (base: the sequence's first row) */
static inline float conv_pre(const float *x, const float *w, const float *b, int64_t base, int t, int c, int K, int ch) {
  float acc = b[ch];
  for (int j = 0; j < K; j++) {
    int tt = t - K + 1 + j;
    if (tt >= 0) acc += w[(int64_t)ch * K + j] * x[(base + tt) * c + ch];
  }
  return acc;
}

/* the gradient of pre at row base + t: dy times silu'(pre) */
static inline float conv_dpre(const float *x, const float *w, const float *b, const float *dy, int64_t base, int t, int c,
                              int K, int ch) {
  return dy[(base + t) * c + ch] * mc_silu_df(conv_pre(x, w, b, base, t, c, K, ch));
}

void mc_cpu_conv_silu_fwd(mc_backend *be, const float *x, const float *w, const float *b, int n_seq, int T, int c, int K,
                          float *y) {
  (void)be;
#pragma omp parallel for if ((int64_t)n_seq * T * c * K > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++)
    for (int s = 0; s < n_seq; s++)
      for (int t = 0; t < T; t++) {
        float pre = conv_pre(x, w, b, (int64_t)s * T, t, c, K, ch);
        y[((int64_t)s * T + t) * c + ch] = mc_siluf(pre);
      }
}

void mc_cpu_conv_silu_bwd(mc_backend *be, const float *x, const float *w, const float *b, const float *dy, int n_seq,
                          int T, int c, int K, mc_dst dx, float *dw, float *db) {
  (void)be;
  /* One task per channel: it alone touches dw[ch, :], db[ch] and column ch of dx. An fp32 dx
   * takes each contribution as it is formed (t ascending); a bf16 dx, written once, is the
   * same sum formed whole per element (the terms in the same order) and then rounded. */
#pragma omp parallel for if ((int64_t)n_seq * T * c * K > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++) {
    double gb = 0.0;
    /* a bf16 dx reads each step's pre-activation gradient K times: formed once per sequence
     * (NULL when out of memory: formed again where read, the same values) */
    float *gs = dx.h ? malloc((size_t)T * sizeof(float)) : NULL;
    for (int s = 0; s < n_seq; s++) {
      const int64_t base = (int64_t)s * T;
      for (int t = 0; t < T; t++) {
        float g = conv_dpre(x, w, b, dy, base, t, c, K, ch);
        if (gs) gs[t] = g;
        gb += g;
        for (int j = 0; j < K; j++) {
          int tt = t - K + 1 + j;
          if (tt < 0) continue;
          int64_t o = (base + tt) * c + ch;
          if (dx.f) dx.f[o] += w[(int64_t)ch * K + j] * g;
          dw[(int64_t)ch * K + j] += g * x[o];
        }
      }
      if (dx.h)
        for (int tt = 0; tt < T; tt++) {
          float acc = 0.0f;
          for (int j = K - 1; j >= 0; j--) {
            int t = tt + K - 1 - j;
            if (t < T) acc += w[(int64_t)ch * K + j] * (gs ? gs[t] : conv_dpre(x, w, b, dy, base, t, c, K, ch));
          }
          dx.h[(base + tt) * c + ch] = mc_bf16_from_float(acc);
        }
    }
    free(gs);
    db[ch] += (float)gb;
  }
}
