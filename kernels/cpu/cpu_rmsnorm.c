/* RMSNorm over groups of columns: full width (group = d) or per head (the Mamba gated norm).
 * Backward of y = x * rstd * w with rstd = (mean(x^2) + eps)^(-1/2) over the group:
 *   dx = rstd * (dy*w - x * rstd^2 * mean(dy*w*x)),  dw += dy * x * rstd. */
#include <math.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

void mc_cpu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group,
                        float eps, mc_dst y, float *rstd) {
  (void)be;
  int ng = d / group;
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    for (int gi = 0; gi < ng; gi++) {
      const float *xr = x + (int64_t)r * d + (int64_t)gi * group;
      const int64_t yo = (int64_t)r * d + (int64_t)gi * group;
      const float *wr = w + (int64_t)gi * group;
      double ss = 0.0;
      for (int j = 0; j < group; j++) ss += (double)xr[j] * xr[j];
      float rs = (float)(1.0 / sqrt(ss / group + eps));
      rstd[(int64_t)r * ng + gi] = rs;
      for (int j = 0; j < group; j++) mc_dst_set(y, yo + j, xr[j] * rs * wr[j]);
    }
  }
}

void mc_cpu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd,
                        const float *dy, int n, int d, int group, float *dx, float *dw) {
  (void)be;
  int ng = d / group;
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    for (int gi = 0; gi < ng; gi++) {
      int64_t o = (int64_t)r * d + (int64_t)gi * group;
      const float *wr = w + (int64_t)gi * group;
      float rs = rstd[(int64_t)r * ng + gi];
      double dot = 0.0;
      for (int j = 0; j < group; j++) dot += (double)dy[o + j] * wr[j] * x[o + j];
      float c = (float)(dot / group) * rs * rs;
      for (int j = 0; j < group; j++) dx[o + j] += rs * (dy[o + j] * wr[j] - x[o + j] * c);
    }
  }
  /* Weight gradient: columns are independent, rows summed in order. */
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int j = 0; j < d; j++) {
    double s = 0.0;
    int gi = j / group;
    for (int r = 0; r < n; r++)
      s += (double)dy[(int64_t)r * d + j] * x[(int64_t)r * d + j] * rstd[(int64_t)r * ng + gi];
    dw[j] += (float)s;
  }
}
