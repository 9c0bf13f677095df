/* The per-token routing math of the MoE router, shared by the CPU and CUDA backends so both
 * follow the routing contract (docs/design.md section 2) with the same code: fp32 softmax of the
 * logits, top-k by probability (strict > keeps the lower expert index on ties), gates
 * renormalised to sum 1 over the k choices. */
#ifndef MC_KERNELS_ROUTE_ROW_H
#define MC_KERNELS_ROUTE_ROW_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MC_HOST_DEVICE __host__ __device__
#else
#define MC_HOST_DEVICE
#endif

/* One token: logits lr[E] -> probabilities pr[E], experts ir[k], gates gr[k]. */
static inline MC_HOST_DEVICE void mc_route_row(const float *lr, int E, int k, float *pr, int32_t *ir, float *gr) {
  float m = -INFINITY;
  for (int e = 0; e < E; e++) m = lr[e] > m ? lr[e] : m;
  double sum = 0.0;
  for (int e = 0; e < E; e++) {
    pr[e] = expf(lr[e] - m);
    sum += pr[e];
  }
  for (int e = 0; e < E; e++) pr[e] = (float)(pr[e] / sum);
  double gs = 0.0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= ir[i] == e;
      if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
    }
    ir[j] = best;
    gs += pr[best];
  }
  for (int j = 0; j < k; j++) gr[j] = (float)(pr[ir[j]] / gs);
}

#endif
