/* RG-LRU scan, channel-local: a_t = exp(l_t) with l_t = -8 softplus(lambda) r_t,
 * h_t = a_t h_{t-1} + m_t gx_t with m_t = sqrt(1 - a_t^2) = sqrt(-expm1(2 l_t)).
 * Backward with g_t = dh_t + a_{t+1} g_{t+1}: dgx_t += g_t m_t,
 * dl_t = g_t (a_t h_{t-1} - gx_t a_t^2 / m_t), dr_t += -8 softplus(lambda) dl_t,
 * dlambda += -8 sigmoid(lambda) r_t dl_t. m_t is floored at 1e-6 in the 1/m_t factor only. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void mc_cpu_rglru_fwd(mc_backend *be, const float *gx, const float *r, const float *lambda,
                      int n_seq, int T, int c, float *h) {
  (void)be;
#pragma omp parallel for if ((int64_t)n_seq * T * c > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++) {
    float k = -8.0f * mc_softplusf(lambda[ch]);
    for (int s = 0; s < n_seq; s++) {
      float hp = 0.0f;
      for (int t = 0; t < T; t++) {
        int64_t o = ((int64_t)s * T + t) * c + ch;
        float l = k * r[o], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        hp = a * hp + m * gx[o];
        h[o] = hp;
      }
    }
  }
}

void mc_cpu_rglru_bwd(mc_backend *be, const float *gx, const float *r, const float *lambda,
                      const float *h, const float *dh, int n_seq, int T, int c, float *dgx,
                      float *dr, float *dlambda) {
  (void)be;
#pragma omp parallel for if ((int64_t)n_seq * T * c > MC_CPU_PAR_MIN)
  for (int ch = 0; ch < c; ch++) {
    float sp = mc_softplusf(lambda[ch]), k = -8.0f * sp, sg = mc_sigmoidf(lambda[ch]);
    double dlam = 0.0;
    for (int s = 0; s < n_seq; s++) {
      float carry = 0.0f;
      for (int t = T - 1; t >= 0; t--) {
        int64_t o = ((int64_t)s * T + t) * c + ch;
        float l = k * r[o], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        float g = dh[o] + carry;
        float hp = t > 0 ? h[o - c] : 0.0f;
        dgx[o] += g * m;
        float dl = g * (a * hp - gx[o] * a * a / fmaxf(m, 1e-6f));
        dr[o] += k * dl;
        dlam += (double)dl * (-8.0f) * sg * r[o];
        carry = g * a;
      }
    }
    dlambda[ch] += (float)dlam;
  }
}
