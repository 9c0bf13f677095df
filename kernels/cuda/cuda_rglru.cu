/* The RG-LRU scan (kernels/ops.h rglru_fwd, rglru_bwd; formulas as in
 * kernels/cpu/cpu_rglru.c), in chunks of RG_CHUNK steps so that (sequence, channel, chunk)
 * triples run in parallel (one thread per (sequence, channel) walking the whole sequence left
 * most of the GPU idle: 8 x 1024 threads at nam-small's micro-batch 8). Both directions are
 * linear recurrences, h_t = a_t h_{t-1} + m_t gx_t forward and, backward, the gradient
 * reaching h_t, g_t = dh_t + a_{t+1} g_{t+1}. Three launches each:
 *   1. every chunk runs its recurrence from a zero carry and keeps (P, E): the product of its
 *      a_t and its outgoing value (h at its last step; a_t g_t at its first step backward);
 *   2. one thread per (sequence, channel) chains the chunks: carry' = P carry + E, giving each
 *      chunk its true incoming carry;
 *   3. every chunk runs its recurrence again from that carry and writes h (forward) or adds
 *      its gradients (backward), as the sequential form does.
 * dlambda is summed per (sequence, chunk), then over those in order: no atomics, the same
 * bits run to run. */
#include <math.h>

#include "kernels/cuda/cuda_common.h"

#define RG_CHUNK 64 /* steps per chunk */
#define RG_U 8      /* the inputs of RG_U steps are loaded together to cover memory latency */

/* k = -8 softplus(lambda): a_t = exp(k r_t), m_t = sqrt(1 - a_t^2) */
struct rg_gate {
  float a, m;
};
static __device__ __forceinline__ rg_gate rg_gate_of(float k, float r) {
  const float l = k * r;
  return rg_gate{expf(l), sqrtf(-expm1f(2.0f * l))};
}

/* The forward recurrence over steps [t0, t1) of the sequence whose row 0 is `base`, channel
 * ch, from h_{t0-1} = hp; writes h when WRITE. Returns h_{t1-1}; *prod = the product of a. */
template <bool WRITE>
static __device__ float rg_fwd_span(const float *gx, const float *r, float k, int64_t base, int c, int ch, int t0,
                                    int t1, float hp, float *h, float *prod) {
  float p = 1.0f;
  for (int tb = t0; tb < t1; tb += RG_U) {
    float rv[RG_U], gv[RG_U];
#pragma unroll
    for (int u = 0; u < RG_U; u++) {
      const int64_t o = (base + min(tb + u, t1 - 1)) * c + ch;
      rv[u] = r[o], gv[u] = gx[o];
    }
#pragma unroll
    for (int u = 0; u < RG_U; u++) {
      if (tb + u >= t1) break;
      const rg_gate q = rg_gate_of(k, rv[u]);
      hp = q.a * hp + q.m * gv[u];
      p *= q.a;
      if (WRITE) h[(base + tb + u) * c + ch] = hp;
    }
  }
  *prod = p;
  return hp;
}

/* The backward recurrence over steps [t0, t1), last step first, from the carry a_{t1} g_{t1}
 * entering at t1 - 1; with APPLY it adds the gradients (dlambda into *dlam). Returns the carry
 * leaving at t0, a_{t0} g_{t0}; *prod = the product of a. */
template <bool APPLY>
static __device__ float rg_bwd_span(const float *gx, const float *r, const float *h, const float *dh, float k, float sg,
                                    int64_t base, int c, int ch, int t0, int t1, float carry, float *dgx, float *dr,
                                    double *dlam, float *prod) {
  float p = 1.0f;
  for (int tb = t1 - 1; tb >= t0; tb -= RG_U) {
    float rv[RG_U], gv[RG_U], dhv[RG_U], hpv[RG_U];
#pragma unroll
    for (int u = 0; u < RG_U; u++) {
      const int t = max(tb - u, t0);
      const int64_t o = (base + t) * c + ch;
      rv[u] = r[o], dhv[u] = dh[o];
      if (APPLY) gv[u] = gx[o], hpv[u] = t > 0 ? h[o - c] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < RG_U; u++) {
      const int t = tb - u;
      if (t < t0) break;
      const rg_gate q = rg_gate_of(k, rv[u]);
      const float g = dhv[u] + carry;
      if (APPLY) {
        const int64_t o = (base + t) * c + ch;
        dgx[o] += g * q.m;
        const float dl = g * (q.a * hpv[u] - gv[u] * q.a * q.a / fmaxf(q.m, 1e-6f));
        dr[o] += k * dl;
        *dlam += (double)dl * (-8.0f) * sg * rv[u];
      }
      carry = g * q.a;
      p *= q.a;
    }
  }
  *prod = p;
  return carry;
}

/* The (sequence, chunk, channel) of a thread; false past the end. Chunks of one sequence and
 * channel are c apart in the [n_seq][nch][c] scratch arrays. */
struct rg_item {
  int64_t base, at; /* the sequence's first row; the index into the scratch arrays */
  int ch, t0, t1, chunk;
};
static __device__ __forceinline__ bool rg_item_of(int64_t i, int n_seq, int T, int c, rg_item *it) {
  const int nch = (T + RG_CHUNK - 1) / RG_CHUNK;
  if (i >= (int64_t)n_seq * nch * c) return false;
  it->ch = (int)(i % c);
  it->chunk = (int)((i / c) % nch);
  const int64_t s = i / ((int64_t)c * nch);
  it->base = s * T, it->at = i;
  it->t0 = it->chunk * RG_CHUNK, it->t1 = min(T, it->t0 + RG_CHUNK);
  return true;
}

__global__ void k_rg_fwd_sums(const float *gx, const float *r, const float *lambda, int n_seq, int T, int c,
                              float2 *sums) {
  rg_item it;
  if (!rg_item_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, n_seq, T, c, &it)) return;
  float p;
  const float e = rg_fwd_span<false>(gx, r, -8.0f * mc_d_softplus(lambda[it.ch]), it.base, c, it.ch, it.t0, it.t1, 0.0f,
                                     nullptr, &p);
  sums[it.at] = make_float2(p, e);
}

/* carry[chunk] for every chunk of one (sequence, channel): forward, carry[0] = 0 and
 * carry[j + 1] = P_j carry[j] + E_j; backward, carry[last] = 0 and carry[j - 1] = P_j carry[j] + E_j. */
__global__ void k_rg_chain(const float2 *sums, int n_seq, int nch, int c, int backward, float *carry) {
  MC_CU_FOR(i, (int64_t)n_seq * c) {
    const int64_t first = (i / c) * nch * c + i % c;
    float v = 0.0f;
    for (int j = 0; j < nch; j++) {
      const int64_t o = first + (int64_t)(backward ? nch - 1 - j : j) * c;
      carry[o] = v;
      const float2 q = sums[o];
      v = q.x * v + q.y;
    }
  }
}

__global__ void k_rg_fwd_apply(const float *gx, const float *r, const float *lambda, const float *carry, int n_seq,
                               int T, int c, float *h) {
  rg_item it;
  if (!rg_item_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, n_seq, T, c, &it)) return;
  float p;
  rg_fwd_span<true>(gx, r, -8.0f * mc_d_softplus(lambda[it.ch]), it.base, c, it.ch, it.t0, it.t1, carry[it.at], h, &p);
}

__global__ void k_rg_bwd_sums(const float *gx, const float *r, const float *lambda, const float *h, const float *dh,
                              int n_seq, int T, int c, float2 *sums) {
  rg_item it;
  if (!rg_item_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, n_seq, T, c, &it)) return;
  float p;
  const float e = rg_bwd_span<false>(gx, r, h, dh, -8.0f * mc_d_softplus(lambda[it.ch]), 0.0f, it.base, c, it.ch, it.t0,
                                     it.t1, 0.0f, nullptr, nullptr, nullptr, &p);
  sums[it.at] = make_float2(p, e);
}

__global__ void k_rg_bwd_apply(const float *gx, const float *r, const float *lambda, const float *h, const float *dh,
                               const float *carry, int n_seq, int T, int c, float *dgx, float *dr, double *dlam_part) {
  rg_item it;
  if (!rg_item_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, n_seq, T, c, &it)) return;
  double dlam = 0.0;
  float p;
  rg_bwd_span<true>(gx, r, h, dh, -8.0f * mc_d_softplus(lambda[it.ch]), mc_d_sigmoid(lambda[it.ch]), it.base, c, it.ch,
                    it.t0, it.t1, carry[it.at], dgx, dr, &dlam, &p);
  dlam_part[it.at] = dlam;
}

/* dlambda[ch] += sum over (sequence, chunk) parts in order (deterministic) */
__global__ void k_rglru_dlambda(const double *part, int parts, int c, float *dlambda) {
  MC_CU_FOR(ch, c) {
    double s = 0.0;
    for (int q = 0; q < parts; q++) s += part[(int64_t)q * c + ch];
    dlambda[ch] += (float)s;
  }
}

/* The launch of the per-chunk kernels and the scratch of both directions: sums and carries
 * (and, backward, the dlambda parts) per (sequence, chunk, channel). NULL (failure recorded)
 * when it cannot be had. */
static void *rg_scratch(mc_backend *be, int n_seq, int T, int c, int dlam, int64_t *items, const char *op) {
  *items = (int64_t)n_seq * ((T + RG_CHUNK - 1) / RG_CHUNK) * c;
  if ((*items + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS > INT32_MAX) {
    mc_cuda_fail(be, "%s: %d sequences x %d steps x %d channels exceed one launch", op, n_seq, T, c);
    return NULL;
  }
  const size_t bytes = (size_t)*items * (sizeof(float2) + sizeof(float) + (dlam ? sizeof(double) : 0));
  return mc_cuda_scratch(be, bytes, op);
}

static void cu_rglru_fwd(mc_backend *be, const float *gx, const float *r, const float *lambda, int n_seq, int T, int c,
                         float *h) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  int64_t items;
  char *s = (char *)rg_scratch(be, n_seq, T, c, 0, &items, "rglru_fwd");
  if (!s) return;
  float2 *sums = (float2 *)s;
  float *carry = (float *)(s + items * sizeof(float2));
  const unsigned blocks = (unsigned)((items + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS);
  cudaStream_t st = mc_cu_stream(be);
  k_rg_fwd_sums<<<blocks, MC_CUDA_THREADS, 0, st>>>(gx, r, lambda, n_seq, T, c, sums);
  k_rg_chain<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, st>>>(sums, n_seq, (T + RG_CHUNK - 1) / RG_CHUNK, c, 0,
                                                                        carry);
  k_rg_fwd_apply<<<blocks, MC_CUDA_THREADS, 0, st>>>(gx, r, lambda, carry, n_seq, T, c, h);
  mc_cuda_check(be, "rglru_fwd");
}

static void cu_rglru_bwd(mc_backend *be, const float *gx, const float *r, const float *lambda, const float *h,
                         const float *dh, int n_seq, int T, int c, float *dgx, float *dr, float *dlambda) {
  if ((int64_t)n_seq * c <= 0 || T <= 0) return;
  int64_t items;
  char *s = (char *)rg_scratch(be, n_seq, T, c, 1, &items, "rglru_bwd");
  if (!s) return;
  double *part = (double *)s; /* first: 8-byte aligned */
  float2 *sums = (float2 *)(s + items * sizeof(double));
  float *carry = (float *)(s + items * (sizeof(double) + sizeof(float2)));
  const unsigned blocks = (unsigned)((items + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS);
  cudaStream_t st = mc_cu_stream(be);
  k_rg_bwd_sums<<<blocks, MC_CUDA_THREADS, 0, st>>>(gx, r, lambda, h, dh, n_seq, T, c, sums);
  k_rg_chain<<<mc_cu_grid((int64_t)n_seq * c), MC_CUDA_THREADS, 0, st>>>(sums, n_seq, (T + RG_CHUNK - 1) / RG_CHUNK, c, 1,
                                                                        carry);
  k_rg_bwd_apply<<<blocks, MC_CUDA_THREADS, 0, st>>>(gx, r, lambda, h, dh, carry, n_seq, T, c, dgx, dr, part);
  k_rglru_dlambda<<<mc_cu_grid(c), MC_CUDA_THREADS, 0, st>>>(part, (int)(items / c), c, dlambda);
  mc_cuda_check(be, "rglru_bwd");
}

void mc_cuda_install_rglru(mc_backend *be) {
  be->rglru_fwd = cu_rglru_fwd;
  be->rglru_bwd = cu_rglru_bwd;
}
