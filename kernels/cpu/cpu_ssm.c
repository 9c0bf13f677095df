/* Mamba-2 selective scan (one B/C group, scalar A per head), sequential over time.
 * The backward recomputes the states of one (sequence, head) into scratch (T*P*N floats,
 * linear in T) and runs the adjoint recurrence backwards:
 *   dS_t = a_{t+1} dS_{t+1} + dy_t (x) C_t,   a_t = exp(dt_t A),
 *   dC_t += dy_t . S_t,  dx_t += D dy_t + dt_t dS_t B_t,  dB_t += dt_t dS_t^T x_t,
 *   ddt_t += sum dS_t (x_t (x) B_t) + A a_t sum dS_t S_{t-1},  dA += dt_t a_t sum dS_t S_{t-1},
 * and dA_log = A dA because A = -exp(A_log). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void mc_cpu_ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log,
                    const float *B, const float *C, const float *D, int n_seq, int T, int Hm,
                    int P, int N, float *y) {
  (void)be;
  const int64_t xs = (int64_t)Hm * P;
#pragma omp parallel if ((int64_t)n_seq * T * xs * N > MC_CPU_PAR_MIN)
  {
    float *S = malloc((size_t)P * N * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; s++) {
      for (int h = 0; h < Hm; h++) {
        if (!S) {
          mc_cpu_fail("ssm_fwd: out of memory for the state");
          continue;
        }
        memset(S, 0, (size_t)P * N * sizeof(float));
        const float A = -expf(A_log[h]);
        for (int t = 0; t < T; t++) {
          int64_t r = (int64_t)s * T + t;
          float d = dt[r * Hm + h], a = expf(d * A);
          const float *xr = x + r * xs + (int64_t)h * P, *Br = B + r * N, *Cr = C + r * N;
          float *yr = y + r * xs + (int64_t)h * P;
          for (int p = 0; p < P; p++) {
            float *Sp = S + (int64_t)p * N, u = d * xr[p], acc = 0.0f;
            for (int n = 0; n < N; n++) {
              Sp[n] = a * Sp[n] + u * Br[n];
              acc += Cr[n] * Sp[n];
            }
            yr[p] = acc + D[h] * xr[p];
          }
        }
      }
    }
    free(S);
  }
}

void mc_cpu_ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log,
                    const float *B, const float *C, const float *D, const float *dy, int n_seq,
                    int T, int Hm, int P, int N, float *dx, float *ddt, float *dA_log, float *dB,
                    float *dC, float *dD) {
  const int64_t xs = (int64_t)Hm * P, PN = (int64_t)P * N;
  /* Per-sequence partial sums of the per-head parameters, reduced in order afterwards. */
  double *part = calloc((size_t)n_seq * Hm * 2, sizeof(double));
  (void)be;
  if (!part) {
    mc_cpu_fail("ssm_bwd: out of memory for partial sums");
    return;
  }
  /* One task per sequence: B and C are shared by the heads, so a task owns dB, dC rows. */
#pragma omp parallel if ((int64_t)n_seq * T * PN * Hm > MC_CPU_PAR_MIN)
  {
    float *Sall = malloc((size_t)T * PN * sizeof(float));
    float *dS = malloc((size_t)PN * sizeof(float));
#pragma omp for schedule(dynamic)
    for (int s = 0; s < n_seq; s++) {
      if (!Sall || !dS) {
        mc_cpu_fail("ssm_bwd: out of memory for the recomputed states");
        continue;
      }
      for (int h = 0; h < Hm; h++) {
        const float A = -expf(A_log[h]);
        /* recompute the states */
        for (int t = 0; t < T; t++) {
          int64_t r = (int64_t)s * T + t;
          float d = dt[r * Hm + h], a = expf(d * A);
          const float *xr = x + r * xs + (int64_t)h * P, *Br = B + r * N;
          const float *Sp = t > 0 ? Sall + (t - 1) * PN : NULL;
          float *St = Sall + t * PN;
          for (int p = 0; p < P; p++)
            for (int n = 0; n < N; n++)
              St[p * N + n] = (Sp ? a * Sp[p * N + n] : 0.0f) + d * xr[p] * Br[n];
        }
        memset(dS, 0, (size_t)PN * sizeof(float));
        double dAh = 0.0, dDh = 0.0;
        for (int t = T - 1; t >= 0; t--) {
          int64_t r = (int64_t)s * T + t;
          float d = dt[r * Hm + h], a = expf(d * A);
          const float *xr = x + r * xs + (int64_t)h * P, *Br = B + r * N, *Cr = C + r * N;
          const float *dyr = dy + r * xs + (int64_t)h * P;
          const float *St = Sall + t * PN, *Sp = t > 0 ? Sall + (t - 1) * PN : NULL;
          float *dxr = dx + r * xs + (int64_t)h * P, *dBr = dB + r * N, *dCr = dC + r * N;
          double ddt_in = 0.0, dprev = 0.0;
          for (int p = 0; p < P; p++) {
            float g = dyr[p], gx = 0.0f;
            dDh += (double)g * xr[p];
            for (int n = 0; n < N; n++) {
              float v = dS[p * N + n] + g * Cr[n];
              dS[p * N + n] = v;
              dCr[n] += g * St[p * N + n];
              gx += v * Br[n];
              dBr[n] += d * v * xr[p];
              ddt_in += (double)v * xr[p] * Br[n];
              if (Sp) dprev += (double)v * Sp[p * N + n];
            }
            dxr[p] += D[h] * g + d * gx;
          }
          ddt[r * Hm + h] += (float)(ddt_in + dprev * A * a);
          dAh += dprev * d * a;
          for (int64_t i = 0; i < PN; i++) dS[i] *= a;
        }
        part[((int64_t)s * Hm + h) * 2] = dAh * A;
        part[((int64_t)s * Hm + h) * 2 + 1] = dDh;
      }
    }
    free(Sall);
    free(dS);
  }
  for (int h = 0; h < Hm; h++) {
    double ga = 0.0, gd = 0.0;
    for (int s = 0; s < n_seq; s++) {
      ga += part[((int64_t)s * Hm + h) * 2];
      gd += part[((int64_t)s * Hm + h) * 2 + 1];
    }
    dA_log[h] += (float)ga;
    dD[h] += (float)gd;
  }
  free(part);
}
