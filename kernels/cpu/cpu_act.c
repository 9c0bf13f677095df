/* Bias, pointwise activations and gated units. GELU is the exact erf form. */
#include <math.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

static inline float act_f(mc_act act, float v) {
  switch (act) {
  case MC_ACT_SILU: return mc_siluf(v);
  case MC_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  case MC_ACT_SIGMOID: return mc_sigmoidf(v);
  case MC_ACT_SOFTPLUS: return mc_softplusf(v);
  }
  return v;
}

/* d act(v) / dv */
static inline float act_df(mc_act act, float v) {
  switch (act) {
  case MC_ACT_SILU: return mc_silu_df(v);
  case MC_ACT_GELU:
    return 0.5f * (1.0f + erff(v * 0.70710678118654752f)) +
           v * 0.39894228040143268f * expf(-0.5f * v * v);
  case MC_ACT_SIGMOID: {
    float s = mc_sigmoidf(v);
    return s * (1.0f - s);
  }
  case MC_ACT_SOFTPLUS: return mc_sigmoidf(v);
  }
  return 1.0f;
}

void mc_cpu_bias_fwd(mc_backend *be, float *y, const float *b, int n, int c) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * c > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int j = 0; j < c; j++) y[(int64_t)r * c + j] += b[j];
}

void mc_cpu_bias_bwd(mc_backend *be, const float *dy, int n, int c, float *db) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * c > MC_CPU_PAR_MIN)
  for (int j = 0; j < c; j++) {
    double s = 0.0;
    for (int r = 0; r < n; r++) s += dy[(int64_t)r * c + j];
    db[j] += (float)s;
  }
}

void mc_cpu_act_fwd(mc_backend *be, mc_act act, const float *x, float *y, int64_t n) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] = act_f(act, x[i]);
}

void mc_cpu_act_bwd(mc_backend *be, mc_act act, const float *x, const float *dy, float *dx,
                    int64_t n) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * act_df(act, x[i]);
}

void mc_cpu_glu_fwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_dst y, int64_t n) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) mc_dst_set(y, i, act_f(act, mc_operand_at(a, i)) * mc_operand_at(b, i));
}

void mc_cpu_glu_bwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_operand dy, mc_dst da, mc_dst db,
                    int64_t n) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const float av = mc_operand_at(a, i), g = mc_operand_at(dy, i);
    mc_dst_acc(da, i, g * mc_operand_at(b, i) * act_df(act, av));
    mc_dst_acc(db, i, g * act_f(act, av));
  }
}
