/* Cross-entropy over the real vocabulary: padded columns [V, Vp) of the head are excluded
 * (they count as -inf logits), so they never win and get zero gradient. */
#include <math.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

void mc_cpu_xent_fwd(mc_backend *be, const float *logits, const int32_t *target, int n, int V,
                     int Vp, float *loss, float *lse) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * V > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *lr = logits + (int64_t)r * Vp;
    float m = -INFINITY;
    for (int c = 0; c < V; c++) m = lr[c] > m ? lr[c] : m;
    double s = 0.0;
    for (int c = 0; c < V; c++) s += exp((double)lr[c] - m);
    double l = m + log(s);
    lse[r] = (float)l;
    loss[r] = (float)(l - lr[target[r]]);
  }
}

void mc_cpu_xent_bwd(mc_backend *be, const float *logits, const int32_t *target, const float *lse,
                     int n, int V, int Vp, float scale, mc_dst dlogits) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * V > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *lr = logits + (int64_t)r * Vp;
    const int64_t o = (int64_t)r * Vp;
    for (int c = 0; c < V; c++) {
      const float p = scale * expf(lr[c] - lse[r]);
      mc_dst_set(dlogits, o + c, c == target[r] ? p - scale : p);
    }
    for (int c = V; c < Vp; c++) mc_dst_set(dlogits, o + c, 0.0f);
  }
}
