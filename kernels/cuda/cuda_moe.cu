/* MoE routing and the token permutation, by the routing contract of kernels/cpu/cpu_moe.c:
 * softmax and top-k per row (one thread per row), then capacity, statistics and slots per
 * (sequence, expert) from each assignment's rank in token order, so the decisions are
 * exactly the CPU's. Permutations are gathers or one-writer scatters (slots are unique): no atomics,
 * one block per row. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_vec.h"
#include "kernels/route_row.h"

__global__ void k_route_rows(const float *logits, int n, int E, int k, float *probs, int32_t *idx, float *gate) {
  MC_CU_FOR(r, n) mc_route_row(logits + r * E, E, k, probs + r * E, idx + r * k, gate + r * k);
}

/* Routing statistics and slots run one block per (sequence, expert); thread t owns a
 * contiguous run of the sequence's tokens. An assignment's rank among the sequence's
 * assignments to e (in token order) decides everything: kept iff capacity == 0 or
 * rank < capacity, and a kept one's slot is the expert's base for the sequence + rank. */
#define ROUTE_THREADS 256

/* Inclusive block scan of one int per thread; returns the exclusive prefix, *total the sum. */
static __device__ int block_scan(int v, int *sh, int *total) {
  const int tid = threadIdx.x;
  sh[tid] = v;
  __syncthreads();
  for (int off = 1; off < ROUTE_THREADS; off <<= 1) {
    int add = tid >= off ? sh[tid - off] : 0;
    __syncthreads();
    sh[tid] += add;
    __syncthreads();
  }
  *total = sh[ROUTE_THREADS - 1];
  int excl = sh[tid] - v;
  __syncthreads();
  return excl;
}

/* This thread's tokens of the sequence: [*t0, *t1). */
static __device__ void route_span(int T, int *t0, int *t1) {
  const int per = (T + ROUTE_THREADS - 1) / ROUTE_THREADS;
  *t0 = min(T, (int)threadIdx.x * per);
  *t1 = min(T, *t0 + per);
}

/* Per (sequence, expert): assignments seen, kept, dropped; f and the mean probability. */
__global__ void __launch_bounds__(ROUTE_THREADS)
    k_route_seq(const float *probs, const int32_t *idx, int T, int E, int k, int capacity, float *f, int32_t *keep,
                int32_t *drop, double *pbar, float *pbar_out) {
  __shared__ int shi[ROUTE_THREADS];
  __shared__ double shd[ROUTE_THREADS];
  const int s = blockIdx.x / E, e = blockIdx.x % E;
  int t0, t1, cnt = 0;
  route_span(T, &t0, &t1);
  double P = 0.0;
  for (int t = t0; t < t1; t++) {
    const int64_t r = (int64_t)s * T + t;
    P += probs[r * E + e];
    for (int j = 0; j < k; j++) cnt += idx[r * k + j] == e;
  }
  int seen;
  block_scan(cnt, shi, &seen);
  shd[threadIdx.x] = P;
  __syncthreads();
  for (int half = ROUTE_THREADS / 2; half > 0; half >>= 1) { /* fixed tree: deterministic */
    if ((int)threadIdx.x < half) shd[threadIdx.x] += shd[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int kept = capacity > 0 && seen > capacity ? capacity : seen;
    f[blockIdx.x] = (float)((double)seen / ((double)k * T));
    pbar[blockIdx.x] = shd[0] / T;
    if (pbar_out) pbar_out[blockIdx.x] = (float)(shd[0] / T);
    keep[blockIdx.x] = kept;
    drop[blockIdx.x] = seen - kept;
  }
}

/* counts, expert offsets, per-(sequence, expert) slot bases, aux and dropped: one block. */
__global__ void k_route_totals(const int32_t *keep, const int32_t *drop, const float *f, const double *pbar, int n_seq,
                               int E, int32_t *counts, int32_t *base, float *aux, int32_t *dropped) {
  extern __shared__ int32_t off[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int s = 0; s < n_seq; s++) c += keep[(int64_t)s * E + e];
    counts[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int o = 0;
    for (int e = 0; e < E; e++) off[e] = o, o += counts[e];
    int64_t nd = 0;
    for (int64_t i = 0; i < (int64_t)n_seq * E; i++) nd += drop[i];
    *dropped = (int32_t)nd;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int b = off[e];
    for (int s = 0; s < n_seq; s++) {
      base[(int64_t)s * E + e] = b;
      b += keep[(int64_t)s * E + e];
    }
  }
  for (int s = threadIdx.x; s < n_seq; s += blockDim.x) {
    double a = 0.0;
    for (int e = 0; e < E; e++) a += f[(int64_t)s * E + e] * pbar[(int64_t)s * E + e];
    aux[s] = (float)(E * a);
  }
}

__global__ void __launch_bounds__(ROUTE_THREADS)
    k_route_slots(const int32_t *idx, const int32_t *base, int T, int E, int k, int capacity, int32_t *slot) {
  __shared__ int shi[ROUTE_THREADS];
  const int s = blockIdx.x / E, e = blockIdx.x % E;
  int t0, t1, cnt = 0, total;
  route_span(T, &t0, &t1);
  for (int t = t0; t < t1; t++)
    for (int j = 0; j < k; j++) cnt += idx[((int64_t)s * T + t) * k + j] == e;
  int rank = block_scan(cnt, shi, &total);
  const int b = base[blockIdx.x];
  for (int t = t0; t < t1; t++)
    for (int j = 0; j < k; j++) {
      const int64_t a = ((int64_t)s * T + t) * k + j;
      if (idx[a] != e) continue;
      slot[a] = capacity > 0 && rank >= capacity ? -1 : b + rank;
      rank++;
    }
}

static void cu_moe_route(mc_backend *be, const float *logits, int n_seq, int T, int E, int k, int capacity,
                         float *probs, int32_t *idx, float *gate, int32_t *slot, int32_t *counts, float *f, float *pbar_out,
                         float *aux, int32_t *dropped) {
  const int n = n_seq * T;
  if (n <= 0 || E <= 0) return;
  if (k <= 0 || k > E) {
    mc_cuda_fail(be, "moe_route: top_k %d outside 1..%d experts", k, E);
    return;
  }
  const int64_t se = (int64_t)n_seq * E;
  const size_t ibytes = ((size_t)3 * se * sizeof(int32_t) + 7) / 8 * 8;
  char *scr = (char *)mc_cuda_scratch(be, ibytes + (size_t)se * sizeof(double), "moe_route");
  if (!scr) return;
  int32_t *keep = (int32_t *)scr, *drop = keep + se, *base = drop + se;
  double *pbar = (double *)(scr + ibytes);
  cudaStream_t st = mc_cu_stream(be);
  k_route_rows<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, st>>>(logits, n, E, k, probs, idx, gate);
  if (se > 0x7fffffff) {
    mc_cuda_fail(be, "moe_route: %lld (sequence, expert) pairs exceed one launch", (long long)se);
    return;
  }
  k_route_seq<<<(unsigned)se, ROUTE_THREADS, 0, st>>>(probs, idx, T, E, k, capacity, f, keep, drop, pbar, pbar_out);
  k_route_totals<<<1, MC_CUDA_THREADS, (size_t)E * sizeof(int32_t), st>>>(keep, drop, f, pbar, n_seq, E, counts, base,
                                                                          aux, dropped);
  k_route_slots<<<(unsigned)se, ROUTE_THREADS, 0, st>>>(idx, base, T, E, k, capacity, slot);
  mc_cuda_check(be, "moe_route");
}

/* dp_e = aux_scale E f_e / T plus, for a chosen e, (dgate_j - G) / s; the CPU's float/double
 * mix is kept so both backends round alike. */
static __device__ float route_dp(int e, const int32_t *ir, const float *dgr, const float *fr, int E, int T, int k,
                                 float aux_scale, double s, double G) {
  float dp = aux_scale * E * fr[e] / T;
  for (int j = 0; j < k; j++)
    if (ir[j] == e) dp += (float)((dgr[j] - G) / s);
  return dp;
}

__global__ void k_route_bwd(const float *probs, const int32_t *idx, const float *gate, const float *dgate,
                            const float *f, int n, int T, int E, int k, float aux_scale, float *dlogits) {
  MC_CU_FOR(r, n) {
    const float *pr = probs + r * E, *fr = f + (r / T) * E, *dgr = dgate + r * k;
    const int32_t *ir = idx + r * k;
    double s = 0.0, G = 0.0;
    for (int j = 0; j < k; j++) {
      s += pr[ir[j]];
      G += (double)dgr[j] * gate[r * k + j];
    }
    double pd = 0.0;
    for (int e = 0; e < E; e++) pd += (double)pr[e] * route_dp(e, ir, dgr, fr, E, T, k, aux_scale, s, G);
    for (int e = 0; e < E; e++)
      dlogits[r * E + e] += pr[e] * (route_dp(e, ir, dgr, fr, E, T, k, aux_scale, s, G) - (float)pd);
  }
}

static void cu_moe_route_bwd(mc_backend *be, const float *probs, const int32_t *idx, const float *gate,
                             const float *dgate, const float *f, int n_seq, int T, int E, int k, float aux_scale,
                             float *dlogits) {
  const int n = n_seq * T;
  if (n <= 0 || E <= 0) return;
  k_route_bwd<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(probs, idx, gate, dgate, f, n, T, E, k,
                                                                       aux_scale, dlogits);
  mc_cuda_check(be, "moe_route_bwd");
}

/* ---- the permutations: one block of PERM_THREADS per row (an assignment, or a token for the
 * gathers), its columns W at a time (W = 4: 16-byte loads, where d and the pointers allow). */
#define PERM_THREADS 128

/* W consecutive floats of a row as one access */
template <int W> struct fvec {
  float v[W];
};
template <int W> static __device__ __forceinline__ fvec<W> ld_row(const float *p) {
  fvec<W> r;
  if constexpr (W == 4) {
    const float4 q = *(const float4 *)p;
    r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
  } else {
    for (int u = 0; u < W; u++) r.v[u] = p[u];
  }
  return r;
}
template <int W> static __device__ __forceinline__ void st_row(float *p, const fvec<W> &r) {
  if constexpr (W == 4) *(float4 *)p = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  else
    for (int u = 0; u < W; u++) p[u] = r.v[u];
}
/* stored into dst at element i as stored (cuda_vec.h st4: one 16- or 8-byte store) */
template <int W> static __device__ __forceinline__ void st_dst(mc_dst dst, int64_t i, const fvec<W> &r) {
  if constexpr (W == 4) st4(dst, i, make_float4(r.v[0], r.v[1], r.v[2], r.v[3]));
  else
    for (int u = 0; u < W; u++) mc_d_st(dst, i + u, r.v[u]);
}

#define PERM_ROWS(row, rows) for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)
#define PERM_COLS(c, d) for (int c = threadIdx.x * W; c < (d); c += PERM_THREADS * W)

template <int W>
__global__ void __launch_bounds__(PERM_THREADS) k_permute(const float *x, const int32_t *slot, int n, int k, int d, mc_dst xp) {
  PERM_ROWS(rj, (int64_t)n * k) {
    const int sl = slot[rj];
    if (sl < 0) continue;
    PERM_COLS(c, d) st_dst<W>(xp, (int64_t)sl * d + c, ld_row<W>(x + (rj / k) * d + c));
  }
}

/* per token: y[r, :] += sum over kept j of gate[r, j] * rows[slot[r, j], :] (gate NULL: 1, the
 * permutation's backward; 1 * v is v exactly), the assignments added in order as on the CPU */
template <int W>
__global__ void __launch_bounds__(PERM_THREADS) k_gather(const float *rows, const int32_t *slot, const float *gate, int n, int k, int d, float *y) {
  PERM_ROWS(r, n) {
    PERM_COLS(c, d) {
      fvec<W> acc = ld_row<W>(y + r * d + c);
      for (int j = 0; j < k; j++) {
        const int sl = slot[r * k + j];
        if (sl < 0) continue;
        const float g = gate ? gate[r * k + j] : 1.0f;
        const fvec<W> v = ld_row<W>(rows + (int64_t)sl * d + c);
#pragma unroll
        for (int u = 0; u < W; u++) acc.v[u] += g * v.v[u];
      }
      st_row<W>(y + r * d + c, acc);
    }
  }
}

/* per assignment: dyp[slot, :] += gate * dy[r, :] (bf16: written) and dgate += dy[r, :] .
 * yp[slot, :], the dot in double, reduced in a fixed order (lanes, then warps in order) */
template <int W>
__global__ void __launch_bounds__(PERM_THREADS) k_unpermute_bwd(const float *dy, const float *yp, const int32_t *slot, const float *gate, int n, int k, int d,
                                mc_dst dyp, float *dgate) {
  __shared__ double part[PERM_THREADS / 32];
  PERM_ROWS(rj, (int64_t)n * k) {
    const int sl = slot[rj];
    if (sl < 0) continue;
    const float g = gate[rj];
    const float *a = dy + (rj / k) * d, *b = yp + (int64_t)sl * d;
    double s = 0.0;
    PERM_COLS(c, d) {
      const fvec<W> av = ld_row<W>(a + c), bv = ld_row<W>(b + c);
      fvec<W> o;
      if (!dyp.h) o = ld_row<W>(dyp.f + (int64_t)sl * d + c);
#pragma unroll
      for (int u = 0; u < W; u++) {
        o.v[u] = dyp.h ? g * av.v[u] : o.v[u] + g * av.v[u];
        s += (double)av.v[u] * bv.v[u];
      }
      st_dst<W>(dyp, (int64_t)sl * d + c, o);
    }
    s = mc_d_warp_sumd(s);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < PERM_THREADS / 32; w++) t += part[w];
      dgate[rj] += (float)t;
    }
    __syncthreads();
  }
}

/* W = 4 where d is a multiple of 4 and every row pointer is 16-byte aligned (8 for bf16; an
 * absent one counts as aligned) */
static bool perm_vec(int d, const void *a, const void *b, mc_dst o) {
  return d % 4 == 0 && aligned(a, 16) && aligned(b, 16) && dst_aligned(o);
}
static unsigned perm_grid(int64_t rows) { return (unsigned)(rows < (1 << 20) ? rows : (1 << 20)); }

static void cu_moe_permute(mc_backend *be, const float *x, const int32_t *slot, int n, int k, int d, mc_dst xp) {
  const int64_t rows = (int64_t)n * k;
  if (rows * d <= 0) return;
  cudaStream_t st = mc_cu_stream(be);
  if (perm_vec(d, x, NULL, xp)) k_permute<4><<<perm_grid(rows), PERM_THREADS, 0, st>>>(x, slot, n, k, d, xp);
  else k_permute<1><<<perm_grid(rows), PERM_THREADS, 0, st>>>(x, slot, n, k, d, xp);
  mc_cuda_check(be, "moe_permute");
}

static void gather(mc_backend *be, const float *rows, const int32_t *slot, const float *gate, int n, int k, int d,
                   float *y, const char *op) {
  if ((int64_t)n * d <= 0) return;
  cudaStream_t st = mc_cu_stream(be);
  if (perm_vec(d, rows, y, mc_dst{NULL, NULL})) k_gather<4><<<perm_grid(n), PERM_THREADS, 0, st>>>(rows, slot, gate, n, k, d, y);
  else k_gather<1><<<perm_grid(n), PERM_THREADS, 0, st>>>(rows, slot, gate, n, k, d, y);
  mc_cuda_check(be, op);
}

static void cu_moe_permute_bwd(mc_backend *be, const float *dxp, const int32_t *slot, int n, int k, int d, float *dx) {
  gather(be, dxp, slot, NULL, n, k, d, dx, "moe_permute_bwd");
}

static void cu_moe_unpermute(mc_backend *be, const float *yp, const int32_t *slot, const float *gate, int n, int k,
                             int d, float *y) {
  gather(be, yp, slot, gate, n, k, d, y, "moe_unpermute");
}

static void cu_moe_unpermute_bwd(mc_backend *be, const float *dy, const float *yp, const int32_t *slot,
                                 const float *gate, int n, int k, int d, mc_dst dyp, float *dgate) {
  const int64_t rows = (int64_t)n * k;
  if (rows * d <= 0) return;
  cudaStream_t st = mc_cu_stream(be);
  if (perm_vec(d, dy, yp, dyp))
    k_unpermute_bwd<4><<<perm_grid(rows), PERM_THREADS, 0, st>>>(dy, yp, slot, gate, n, k, d, dyp, dgate);
  else k_unpermute_bwd<1><<<perm_grid(rows), PERM_THREADS, 0, st>>>(dy, yp, slot, gate, n, k, d, dyp, dgate);
  mc_cuda_check(be, "moe_unpermute_bwd");
}

void mc_cuda_install_moe(mc_backend *be) {
  be->moe_route = cu_moe_route;
  be->moe_route_bwd = cu_moe_route_bwd;
  be->moe_permute = cu_moe_permute;
  be->moe_permute_bwd = cu_moe_permute_bwd;
  be->moe_unpermute = cu_moe_unpermute;
  be->moe_unpermute_bwd = cu_moe_unpermute_bwd;
}
