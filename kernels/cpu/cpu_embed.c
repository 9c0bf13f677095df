/* Embedding gather and its scatter-add backward. */
#include <string.h>

#include "kernels/cpu/cpu.h"

void mc_cpu_embed_fwd(mc_backend *be, const int32_t *tok, int n, int d, const float *W, float *y) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) memcpy(y + (int64_t)r * d, W + (int64_t)tok[r] * d, (size_t)d * sizeof(float));
}

void mc_cpu_embed_bwd(mc_backend *be, const int32_t *tok, int n, int d, const float *dy,
                      float *dW) {
  (void)be;
  /* Rows may repeat: parallelise over columns so no two threads touch one element, and add
   * in row order so the result does not depend on the thread count. */
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int j = 0; j < d; j++)
    for (int r = 0; r < n; r++) dW[(int64_t)tok[r] * d + j] += dy[(int64_t)r * d + j];
}
