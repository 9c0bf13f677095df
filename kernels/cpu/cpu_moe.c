/* MoE routing (docs/design.md section 2, routing contract) and the token permutation to and from
 * the expert-sorted buffer. Routing runs per sequence in token order, so capacity decisions
 * depend only on the sequence, never on the micro-batch or the layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/route_row.h"

void mc_cpu_moe_route(mc_backend *be, const float *logits, int n_seq, int T, int E, int k,
                      int capacity, float *probs, int32_t *idx, float *gate, int32_t *slot,
                      int32_t *counts, float *f, float *pbar, float *aux, int32_t *dropped) {
  (void)be;
  const int n = n_seq * T;
  /* softmax, top-k (strict > keeps the lower index on ties), renormalised gates */
#pragma omp parallel for if ((int64_t)n * E > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    mc_route_row(logits + (int64_t)r * E, E, k, probs + (int64_t)r * E, idx + (int64_t)r * k, gate + (int64_t)r * k);
  /* capacity per sequence, statistics for the aux loss */
  int *seen = malloc((size_t)E * sizeof(int));
  int *fill = malloc((size_t)E * sizeof(int));
  if (!seen || !fill) {
    free(seen);
    free(fill);
    mc_cpu_fail("moe_route: out of memory");
    return;
  }
  int ndrop = 0;
  memset(counts, 0, (size_t)E * sizeof(int32_t));
  for (int s = 0; s < n_seq; s++) {
    memset(seen, 0, (size_t)E * sizeof(int));
    for (int t = 0; t < T; t++) {
      int64_t r = (int64_t)s * T + t;
      for (int j = 0; j < k; j++) {
        int e = idx[r * k + j];
        if (capacity > 0 && seen[e] >= capacity) {
          slot[r * k + j] = -1;
          ndrop++;
        } else {
          slot[r * k + j] = 0; /* kept; the row is assigned below */
          counts[e]++;
        }
        seen[e]++;
      }
    }
    double a = 0.0;
    for (int e = 0; e < E; e++) {
      double P = 0.0;
      for (int t = 0; t < T; t++) P += probs[((int64_t)s * T + t) * E + e];
      P /= T;
      if (pbar) pbar[(int64_t)s * E + e] = (float)P;
      float fe = (float)((double)seen[e] / ((double)k * T));
      f[(int64_t)s * E + e] = fe;
      a += fe * P;
    }
    aux[s] = (float)(E * a);
  }
  /* rows in the expert-sorted buffer: experts in order, tokens in row order inside each */
  int off = 0;
  for (int e = 0; e < E; e++) {
    fill[e] = off;
    off += counts[e];
  }
  for (int64_t i = 0; i < (int64_t)n * k; i++)
    if (slot[i] >= 0) slot[i] = fill[idx[i]]++;
  *dropped = ndrop;
  free(seen);
  free(fill);
}

void mc_cpu_moe_route_bwd(mc_backend *be, const float *probs, const int32_t *idx,
                          const float *gate, const float *dgate, const float *f, int n_seq, int T,
                          int E, int k, float aux_scale, float *dlogits) {
  (void)be;
  const int n = n_seq * T;
#pragma omp parallel if ((int64_t)n * E > MC_CPU_PAR_MIN)
  {
    float *dp = malloc((size_t)E * sizeof(float));
#pragma omp for
    for (int r = 0; r < n; r++) {
      if (!dp) {
        mc_cpu_fail("moe_route_bwd: out of memory");
        continue;
      }
      const float *pr = probs + (int64_t)r * E;
      const float *fr = f + (int64_t)(r / T) * E;
      for (int e = 0; e < E; e++) dp[e] = aux_scale * E * fr[e] / T;
      /* gates g_j = p_j / s over the chosen experts: dp_l += (dg_l - sum_j dg_j g_j) / s */
      double s = 0.0, G = 0.0;
      for (int j = 0; j < k; j++) {
        s += pr[idx[(int64_t)r * k + j]];
        G += (double)dgate[(int64_t)r * k + j] * gate[(int64_t)r * k + j];
      }
      for (int j = 0; j < k; j++)
        dp[idx[(int64_t)r * k + j]] += (float)((dgate[(int64_t)r * k + j] - G) / s);
      double pd = 0.0;
      for (int e = 0; e < E; e++) pd += (double)pr[e] * dp[e];
      for (int e = 0; e < E; e++) dlogits[(int64_t)r * E + e] += pr[e] * (dp[e] - (float)pd);
    }
    free(dp);
  }
}

void mc_cpu_moe_permute(mc_backend *be, const float *x, const int32_t *slot, int n, int k, int d,
                        mc_dst xp) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * k * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int sl = slot[(int64_t)r * k + j];
      if (sl < 0) continue;
      if (xp.f) memcpy(xp.f + (int64_t)sl * d, x + (int64_t)r * d, (size_t)d * sizeof(float));
      else
        for (int c = 0; c < d; c++) xp.h[(int64_t)sl * d + c] = mc_bf16_from_float(x[(int64_t)r * d + c]);
    }
}

void mc_cpu_moe_permute_bwd(mc_backend *be, const float *dxp, const int32_t *slot, int n, int k,
                            int d, float *dx) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * k * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int sl = slot[(int64_t)r * k + j];
      if (sl < 0) continue;
      for (int c = 0; c < d; c++) dx[(int64_t)r * d + c] += dxp[(int64_t)sl * d + c];
    }
}

void mc_cpu_moe_unpermute(mc_backend *be, const float *yp, const int32_t *slot, const float *gate,
                          int n, int k, int d, float *y) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * k * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int sl = slot[(int64_t)r * k + j];
      if (sl < 0) continue;
      float g = gate[(int64_t)r * k + j];
      for (int c = 0; c < d; c++) y[(int64_t)r * d + c] += g * yp[(int64_t)sl * d + c];
    }
}

void mc_cpu_moe_unpermute_bwd(mc_backend *be, const float *dy, const float *yp,
                              const int32_t *slot, const float *gate, int n, int k, int d,
                              mc_dst dyp, float *dgate) {
  (void)be;
#pragma omp parallel for if ((int64_t)n * k * d > MC_CPU_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int sl = slot[(int64_t)r * k + j];
      if (sl < 0) continue;
      float g = gate[(int64_t)r * k + j];
      double dot = 0.0;
      for (int c = 0; c < d; c++) {
        if (dyp.f) dyp.f[(int64_t)sl * d + c] += g * dy[(int64_t)r * d + c];
        else dyp.h[(int64_t)sl * d + c] = mc_bf16_from_float(g * dy[(int64_t)r * d + c]);
        dot += (double)dy[(int64_t)r * d + c] * yp[(int64_t)sl * d + c];
      }
      dgate[(int64_t)r * k + j] += (float)dot;
    }
}
