/* The RG-LRU scan (kernels/ops.h rglru_fwd, rglru_bwd; formulas as in
 * kernels/cpu/cpu_rglru.c). One thread per (sequence, channel), sequential in time; its
 * dlambda is summed per sequence, then over sequences in order. */
#include <math.h>

#include "kernels/cuda/cuda_common.h"

/* ---- RG-LRU: one thread per (sequence, channel), sequential in time; the inputs of
 * RG_U steps are loaded together to cover memory latency. */
#define RG_U 8

__global__ void k_rglru_fwd(const float *gx, const float *r, const float *lambda, int n_seq, int T, int c, float *h) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int ch = (int)(i % c);
    const int64_t s = i / c;
    const float k = -8.0f * mc_d_softplus(lambda[ch]);
    float hp = 0.0f;
    for (int t0 = 0; t0 < T; t0 += RG_U) {
      float rv[RG_U], gv[RG_U];
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int64_t o = (s * T + min(t0 + u, T - 1)) * c + ch;
        rv[u] = r[o], gv[u] = gx[o];
      }
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        if (t0 + u >= T) break;
        const float l = k * rv[u], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        hp = a * hp + m * gv[u];
        h[(s * T + t0 + u) * c + ch] = hp;
      }
    }
  }
}

__global__ void k_rglru_bwd(const float *gx, const float *r, const float *lambda, const float *h, const float *dh,
                            int n_seq, int T, int c, float *dgx, float *dr, double *dlam_part) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int ch = (int)(i % c);
    const int64_t s = i / c;
    const float sp = mc_d_softplus(lambda[ch]), k = -8.0f * sp, sg = mc_d_sigmoid(lambda[ch]);
    double dlam = 0.0;
    float carry = 0.0f;
    for (int tb = T - 1; tb >= 0; tb -= RG_U) {
      float rv[RG_U], gv[RG_U], dhv[RG_U], hpv[RG_U];
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int t = max(tb - u, 0);
        const int64_t o = (s * T + t) * c + ch;
        rv[u] = r[o], gv[u] = gx[o], dhv[u] = dh[o];
        hpv[u] = t > 0 ? h[o - c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < RG_U; u++) {
        const int t = tb - u;
        if (t < 0) break;
        const int64_t o = (s * T + t) * c + ch;
        const float l = k * rv[u], a = expf(l), m = sqrtf(-expm1f(2.0f * l));
        const float g = dhv[u] + carry;
        dgx[o] += g * m;
        const float dl = g * (a * hpv[u] - gv[u] * a * a / fmaxf(m, 1e-6f));
        dr[o] += k * dl;
        dlam += (double)dl * (-8.0f) * sg * rv[u];
        carry = g * a;
      }
    }
    dlam_part[i] = dlam;
  }
}

/* dlambda[ch] += sum over sequences in order (deterministic) */
__global__ void k_rglru_dlambda(const double *part, int n_seq, int c, float *dlambda) {
  MC_CU_FOR(ch, c) {
    double s = 0.0;
    for (int q = 0; q < n_seq; q++) s += part[(int64_t)q * c + ch];
    dlambda[ch] += (float)s;
  }
}

static void cu_rglru_fwd(mc_backend *be, const float *gx, const float *r, const float *lambda, int n_seq, int T, int c,
                         float *h) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  k_rglru_fwd<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(gx, r, lambda, n_seq, T, c, h);
  mc_cuda_check(be, "rglru_fwd");
}

static void cu_rglru_bwd(mc_backend *be, const float *gx, const float *r, const float *lambda, const float *h,
                         const float *dh, int n_seq, int T, int c, float *dgx, float *dr, float *dlambda) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  double *part = (double *)mc_cuda_scratch(be, (size_t)n_seq * c * sizeof(double), "rglru_bwd");
  if (!part) return;
  k_rglru_bwd<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(gx, r, lambda, h, dh, n_seq, T,
                                                                                        c, dgx, dr, part);
  k_rglru_dlambda<<<mc_cu_grid(c), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(part, n_seq, c, dlambda);
  mc_cuda_check(be, "rglru_bwd");
}

void mc_cuda_install_rglru(mc_backend *be) {
  be->rglru_fwd = cu_rglru_fwd;
  be->rglru_bwd = cu_rglru_bwd;
}
