/* RMSNorm over groups of columns: full width (group = d) or per head (the Mamba gated norm).
 * Backward of y = x * rstd * w with rstd = (mean(x^2) + eps)^(-1/2) over the group:
 *   dx = rstd * (dy*w - x * rstd^2 * mean(dy*w*x)),  dw += dy * x * rstd.
 * The gated form normalises x = g = y * silu(z), recomputed where it is read (never stored);
 * its dx is split by the gate: dy += dx * silu(z), dz = dx * y * silu'(z). */
#include <math.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

/* The normalised input at element o: x itself, or (z set) the gate y * silu(z) with x = y. */
static inline float norm_in(const float *x, mc_operand z, int64_t o) {
  if (!z.f && !z.h) return x[o];
  const float zv = mc_operand_at(z, o);
  return mc_siluf(zv) * x[o];
}

static void norm_fwd(const float *x, mc_operand z, const float *w, int n, int d, int group, float eps, mc_dst y,
                     float *rstd) {
  int ng = d / group;
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    for (int gi = 0; gi < ng; gi++) {
      const int64_t o = (int64_t)r * d + (int64_t)gi * group;
      const float *wr = w + (int64_t)gi * group;
      double ss = 0.0;
      for (int j = 0; j < group; j++) {
        const float v = norm_in(x, z, o + j);
        ss += (double)v * v;
      }
      float rs = (float)(1.0 / sqrt(ss / group + eps));
      rstd[(int64_t)r * ng + gi] = rs;
      for (int j = 0; j < group; j++) mc_dst_set(y, o + j, norm_in(x, z, o + j) * rs * wr[j]);
    }
  }
}

/* dx (plain: added into dx; gated: split into dx as dy, added, and dz as stored) and dw */
static void norm_bwd(const float *x, mc_operand z, const float *w, const float *rstd, const float *dy, int n, int d,
                     int group, float *dx, mc_dst dz, float *dw) {
  int ng = d / group;
  const int gated = z.f || z.h;
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++) {
    for (int gi = 0; gi < ng; gi++) {
      int64_t o = (int64_t)r * d + (int64_t)gi * group;
      const float *wr = w + (int64_t)gi * group;
      float rs = rstd[(int64_t)r * ng + gi];
      double dot = 0.0;
      for (int j = 0; j < group; j++) dot += (double)dy[o + j] * wr[j] * norm_in(x, z, o + j);
      float c = (float)(dot / group) * rs * rs;
      for (int j = 0; j < group; j++) {
        const float dg = rs * (dy[o + j] * wr[j] - norm_in(x, z, o + j) * c);
        if (!gated) {
          dx[o + j] += dg;
          continue;
        }
        const float zv = mc_operand_at(z, o + j);
        mc_dst_acc(dz, o + j, dg * x[o + j] * mc_silu_df(zv));
        dx[o + j] += dg * mc_siluf(zv);
      }
    }
  }
  /* Weight gradient: columns are independent, rows summed in order. */
#pragma omp parallel for if ((int64_t)n * d > MC_CPU_PAR_MIN)
  for (int j = 0; j < d; j++) {
    double s = 0.0;
    int gi = j / group;
    for (int r = 0; r < n; r++)
      s += (double)dy[(int64_t)r * d + j] * norm_in(x, z, (int64_t)r * d + j) * rstd[(int64_t)r * ng + gi];
    dw[j] += (float)s;
  }
}

static const mc_operand no_gate = {NULL, NULL};

void mc_cpu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group, float eps, mc_dst y,
                        float *rstd) {
  (void)be;
  norm_fwd(x, no_gate, w, n, d, group, eps, y, rstd);
}

void mc_cpu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd, const float *dy, int n,
                        int d, int group, float *dx, float *dw) {
  (void)be;
  norm_bwd(x, no_gate, w, rstd, dy, n, d, group, dx, (mc_dst){NULL, NULL}, dw);
}

void mc_cpu_gated_rmsnorm_fwd(mc_backend *be, const float *y, mc_operand z, const float *w, int n, int d, int group,
                              float eps, mc_dst out, float *rstd) {
  (void)be;
  norm_fwd(y, z, w, n, d, group, eps, out, rstd);
}

void mc_cpu_gated_rmsnorm_bwd(mc_backend *be, const float *y, mc_operand z, const float *w, const float *rstd,
                              const float *dout, int n, int d, int group, float *dy, mc_dst dz, float *dw) {
  (void)be;
  norm_bwd(y, z, w, rstd, dout, n, d, group, dy, dz, dw);
}
