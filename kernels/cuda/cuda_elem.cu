/* Whole-tensor elementwise ops, the copy of a block of rows (one cudaMemcpy2DAsync), the
 * double-precision sum of squares and fused AdamW (one tensor, or many in one launch with copies
 * of the updated weights): the formulas of kernels/cpu/cpu_elem.c, one thread per element
 * (grid-stride). */
#include <cuda_bf16.h>

#include <string.h>

#include "kernels/cuda/cuda_common.h"

__global__ void k_fill(float *x, int64_t n, float v) { MC_CU_FOR(i, n) x[i] = v; }
__global__ void k_scale(float *x, int64_t n, float a) { MC_CU_FOR(i, n) x[i] *= a; }
__global__ void k_axpy(float *y, const float *x, int64_t n, float a) { MC_CU_FOR(i, n) y[i] += a * x[i]; }

static void cu_fill(mc_backend *be, float *x, int64_t n, float value) {
  if (n <= 0) return;
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if (bits == 0) { /* +0.0 (gradient zeroing, most fills): the driver's memset writes wider than k_fill */
    cudaError_t e = cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), mc_cu_stream(be));
    if (e != cudaSuccess) mc_cuda_fail(be, "fill of %lld floats: %s", (long long)n, cudaGetErrorString(e));
    return;
  }
  k_fill<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, n, value);
  mc_cuda_check(be, "fill");
}

static void cu_copy(mc_backend *be, float *dst, const float *src, int64_t n) {
  if (n <= 0) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, mc_cu_stream(be));
  if (e != cudaSuccess) mc_cuda_fail(be, "copy of %lld floats: %s", (long long)n, cudaGetErrorString(e));
}

static void cu_copy_bf16(mc_backend *be, mc_bf16 *dst, const mc_bf16 *src, int64_t n) {
  if (n <= 0) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof(mc_bf16), cudaMemcpyDeviceToDevice, mc_cu_stream(be));
  if (e != cudaSuccess) mc_cuda_fail(be, "copy of %lld bf16 values: %s", (long long)n, cudaGetErrorString(e));
}

static void cu_copy_2d(mc_backend *be, float *dst, int64_t dpitch, const float *src, int64_t spitch, int64_t width,
                       int64_t height) {
  if (width <= 0 || height <= 0) return;
  if (dpitch < width || spitch < width) {
    mc_cuda_fail(be, "copy_2d: pitches %lld and %lld below the width %lld", (long long)dpitch, (long long)spitch,
                 (long long)width);
    return;
  }
  const size_t f = sizeof(float);
  cudaError_t e = cudaMemcpy2DAsync(dst, (size_t)dpitch * f, src, (size_t)spitch * f, (size_t)width * f, (size_t)height,
                                    cudaMemcpyDeviceToDevice, mc_cu_stream(be));
  if (e != cudaSuccess)
    mc_cuda_fail(be, "copy_2d of %lld rows of %lld floats: %s", (long long)height, (long long)width, cudaGetErrorString(e));
}

static void cu_scale(mc_backend *be, float *x, int64_t n, float alpha) {
  if (n <= 0) return;
  k_scale<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, n, alpha);
  mc_cuda_check(be, "scale");
}

static void cu_axpy(mc_backend *be, float *y, const float *x, int64_t n, float alpha) {
  if (n <= 0) return;
  k_axpy<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(y, x, n, alpha);
  mc_cuda_check(be, "axpy");
}

/* ---- sum of squares: fixed grid, per-block double partials, one final block; the order of
 * additions depends only on n, so repeated calls give identical results. */
__device__ double block_sumd(double v) {
  __shared__ double sh[MC_CUDA_THREADS / 32];
  v = mc_d_warp_sumd(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x / 32) ? sh[l] : 0.0;
  if (w == 0) v = mc_d_warp_sumd(v);
  return v;
}

__global__ void k_sumsq_part(const float *x, int64_t n, double *part) {
  double s = 0.0;
  MC_CU_FOR(i, n) s += (double)x[i] * x[i];
  s = block_sumd(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_final(const double *part, int np, double *out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < np; i += blockDim.x) s += part[i];
  s = block_sumd(s);
  if (threadIdx.x == 0) *out = s;
}

/* Sums the nb partials in c->red (fixed order) and returns the total to the host: the one
 * device sync of a sum of squares. */
static double sum_partials(mc_backend *be, unsigned nb, const char *op) {
  mc_cuda_ctx *c = mc_cu(be);
  k_sum_final<<<1, MC_CUDA_THREADS, 0, c->stream>>>(c->red, (int)nb, c->red + MC_CUDA_RED_BLOCKS);
  mc_cuda_check(be, op);
  double s = NAN;
  const void *b = mc_cuda_small_to_host(be, c->red + MC_CUDA_RED_BLOCKS, sizeof s, op);
  if (b) memcpy(&s, b, sizeof s);
  return s;
}

static double cu_sumsq(mc_backend *be, const float *x, int64_t n) {
  if (n <= 0) return 0.0;
  mc_cuda_ctx *c = mc_cu(be);
  unsigned nb = mc_cu_grid(n);
  if (nb > MC_CUDA_RED_BLOCKS) nb = MC_CUDA_RED_BLOCKS;
  k_sumsq_part<<<nb, MC_CUDA_THREADS, 0, c->stream>>>(x, n, c->red);
  mc_cuda_check(be, "sumsq");
  return sum_partials(be, nb, "sumsq");
}

/* One element of AdamW, the CPU backend's operations in its order, each rounded on its own
 * (the _rn intrinsics are never contracted into FMAs; IEEE division and square root): the
 * results are the CPU's bit for bit, and adamw and adamw_multi share them. */
static __device__ __forceinline__ void adamw_elem(float &w, float &m, float &v, float g, float lr, float b1,
                                                  float b2, float eps, float decay, float bc1, float bc2,
                                                  float gs) {
  float gi = __fmul_rn(g, gs);
  m = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(__fsub_rn(1.0f, b1), gi));
  v = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
  float mhat = __fdiv_rn(m, bc1), vhat = __fdiv_rn(v, bc2);
  w = __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(lr, mhat), __fadd_rn(__fsqrt_rn(vhat), eps)));
}

/* kernels/bf16.h's mc_bf16_from_float: round to nearest even, every NaN to 0x7fff (what the
 * conversion instruction does with a NaN's payload is left out of it). */
static __device__ __forceinline__ uint16_t bf16_bits(float x) {
  return isnan(x) ? (uint16_t)0x7fffu : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* The bias corrections in double on the host, exactly as the CPU backend does. */
static void adamw_corrections(const mc_adamw_args *a, float *bc1, float *bc2) {
  *bc1 = (float)(1.0 - pow(a->beta1, (double)a->step));
  *bc2 = (float)(1.0 - pow(a->beta2, (double)a->step));
}

__global__ void k_adamw(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                        float eps, float decay, float bc1, float bc2, float gs) {
  MC_CU_FOR(i, n) {
    float wi = w[i], mi = m[i], vi = v[i];
    adamw_elem(wi, mi, vi, g[i], lr, b1, b2, eps, decay, bc1, bc2, gs);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
  }
}

static void cu_adamw(mc_backend *be, float *w, const float *g, float *m, float *v, int64_t n,
                     const mc_adamw_args *a) {
  if (n <= 0) return;
  float bc1, bc2;
  adamw_corrections(a, &bc1, &bc2);
  const float decay = 1.0f - a->lr * a->weight_decay;
  k_adamw<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(w, g, m, v, n, a->lr, a->beta1, a->beta2, a->eps,
                                                                   decay, bc1, bc2, a->grad_scale);
  mc_cuda_check(be, "adamw");
}

/* ---- multi-tensor ops. The tensor list travels in the kernel's parameters (up to MT_MAX
 * tensors per launch, about 9 KB: CUDA 12.1+ passes up to 32 KB), so nothing is copied to
 * device memory and no buffer can be reused under a queued launch. Each tensor is cut into
 * chunks of MT_CHUNK elements; first[t] is the index of tensor t's first chunk, and a chunk
 * finds its tensor by binary search over first (uniform across the block). */
#define MT_MAX 128
#define MT_CHUNK 8192
#define MT_UNROLL 4

/* The last tensor whose first chunk is <= c (empty tensors are never listed). */
static __device__ __forceinline__ int mt_tensor_of(const int64_t *first, int count, int64_t c) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (first[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct mt_adamw_params {
  float *w[MT_MAX];
  const float *g[MT_MAX];
  float *m[MT_MAX], *v[MT_MAX];
  float *wc[MT_MAX];
  uint16_t *wb[MT_MAX];
  int64_t n[MT_MAX];
  float decay[MT_MAX];
  int64_t first[MT_MAX + 1];
  int count;
};

/* One block per chunk. All loads of MT_UNROLL elements are issued before the first use. */
__global__ void k_adamw_multi(const mt_adamw_params p, float lr, float b1, float b2, float eps, float bc1,
                              float bc2, float gs) {
  const int t = mt_tensor_of(p.first, p.count, blockIdx.x);
  const int64_t start = ((int64_t)blockIdx.x - p.first[t]) * MT_CHUNK;
  const int64_t end = start + MT_CHUNK < p.n[t] ? start + MT_CHUNK : p.n[t];
  float *w = p.w[t], *m = p.m[t], *v = p.v[t], *wc = p.wc[t];
  const float *g = p.g[t];
  uint16_t *wb = p.wb[t];
  const float decay = p.decay[t];
  for (int64_t base = start + threadIdx.x; base < end; base += MT_UNROLL * blockDim.x) {
    float wr[MT_UNROLL], gr[MT_UNROLL], mr[MT_UNROLL], vr[MT_UNROLL];
#pragma unroll
    for (int u = 0; u < MT_UNROLL; u++) {
      int64_t i = base + (int64_t)u * blockDim.x;
      if (i < end) wr[u] = w[i], gr[u] = g[i], mr[u] = m[i], vr[u] = v[i];
    }
#pragma unroll
    for (int u = 0; u < MT_UNROLL; u++) {
      int64_t i = base + (int64_t)u * blockDim.x;
      if (i >= end) break;
      adamw_elem(wr[u], mr[u], vr[u], gr[u], lr, b1, b2, eps, decay, bc1, bc2, gs);
      m[i] = mr[u];
      v[i] = vr[u];
      w[i] = wr[u];
      if (wc) wc[i] = wr[u];
      if (wb) wb[i] = bf16_bits(wr[u]);
    }
  }
}

static int64_t mt_chunks(int64_t n) { return (n + MT_CHUNK - 1) / MT_CHUNK; }

static void cu_adamw_multi(mc_backend *be, const mc_adamw_tensor *t, int count, const mc_adamw_args *a) {
  if (count < 0 || (count > 0 && !t)) {
    mc_cuda_fail(be, "adamw_multi: bad tensor list (count %d%s)", count, t ? "" : ", no descriptors");
    return;
  }
  for (int i = 0; i < count; i++)
    if (t[i].n < 0 || mt_chunks(t[i].n) > INT32_MAX) {
      mc_cuda_fail(be, "adamw_multi: tensor %d has a bad size (%lld elements)", i, (long long)t[i].n);
      return;
    }
  float bc1, bc2;
  adamw_corrections(a, &bc1, &bc2);
  mt_adamw_params p;
  p.count = 0;
  int64_t chunks = 0;
  for (int i = 0; i <= count; i++) {
    const int64_t c = i < count ? mt_chunks(t[i].n) : 0;
    /* launch what is listed when the list is full, the grid would overflow, or at the end */
    if (p.count > 0 && (i == count || p.count == MT_MAX || chunks + c > INT32_MAX)) {
      p.first[p.count] = chunks;
      k_adamw_multi<<<(unsigned)chunks, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(p, a->lr, a->beta1, a->beta2, a->eps,
                                                                               bc1, bc2, a->grad_scale);
      mc_cuda_check(be, "adamw_multi");
      p.count = 0;
      chunks = 0;
    }
    if (c == 0) continue;
    const int k = p.count++;
    p.w[k] = t[i].w, p.g[k] = t[i].g, p.m[k] = t[i].m, p.v[k] = t[i].v;
    p.wc[k] = t[i].w_copy, p.wb[k] = t[i].w_bf16;
    p.n[k] = t[i].n;
    p.decay[k] = 1.0f - a->lr * t[i].weight_decay;
    p.first[k] = chunks;
    chunks += c;
  }
}

struct mt_sumsq_params {
  const float *x[MT_MAX];
  int64_t n[MT_MAX];
  int64_t first[MT_MAX + 1];
  int count;
};

/* Block b sums chunks b, b + gridDim.x, ... of this launch's tensors into part[b] (added to
 * what an earlier launch left there when `accumulate`): the grid and the chunking depend
 * only on the sizes, so the order of every addition is fixed. */
__global__ void k_sumsq_multi(const mt_sumsq_params p, double *part, int accumulate) {
  double s = 0.0;
  const int64_t total = p.first[p.count];
  for (int64_t c = blockIdx.x; c < total; c += gridDim.x) {
    const int t = mt_tensor_of(p.first, p.count, c);
    const int64_t start = (c - p.first[t]) * MT_CHUNK;
    const int64_t end = start + MT_CHUNK < p.n[t] ? start + MT_CHUNK : p.n[t];
    const float *x = p.x[t];
    /* MT_UNROLL loads in flight before the adds, which stay in element order */
    for (int64_t base = start + threadIdx.x; base < end; base += MT_UNROLL * blockDim.x) {
      float r[MT_UNROLL];
#pragma unroll
      for (int u = 0; u < MT_UNROLL; u++) {
        int64_t i = base + (int64_t)u * blockDim.x;
        r[u] = i < end ? x[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < MT_UNROLL; u++) s += (double)r[u] * r[u];
    }
  }
  s = block_sumd(s);
  if (threadIdx.x == 0) part[blockIdx.x] = accumulate ? part[blockIdx.x] + s : s;
}

static double cu_sumsq_multi(mc_backend *be, const float *const *x, const int64_t *n, int count) {
  if (count < 0 || (count > 0 && (!x || !n))) {
    mc_cuda_fail(be, "sumsq_multi: bad tensor list (count %d)", count);
    return NAN;
  }
  int64_t total = 0;
  for (int i = 0; i < count; i++) {
    if (n[i] < 0) {
      mc_cuda_fail(be, "sumsq_multi: tensor %d has a negative size", i);
      return NAN;
    }
    total += mt_chunks(n[i]);
  }
  if (total == 0) return 0.0;
  mc_cuda_ctx *c = mc_cu(be);
  /* one grid for every launch, so that each block adds onto its own earlier partial */
  const unsigned nb = total < MC_CUDA_RED_BLOCKS ? (unsigned)total : MC_CUDA_RED_BLOCKS;
  mt_sumsq_params p;
  p.count = 0;
  int64_t chunks = 0;
  int launches = 0;
  for (int i = 0; i <= count; i++) {
    if (p.count > 0 && (i == count || p.count == MT_MAX)) {
      p.first[p.count] = chunks;
      k_sumsq_multi<<<nb, MC_CUDA_THREADS, 0, c->stream>>>(p, c->red, launches++ > 0);
      mc_cuda_check(be, "sumsq_multi");
      p.count = 0;
      chunks = 0;
    }
    if (i == count || n[i] == 0) continue;
    const int k = p.count++;
    p.x[k] = x[i], p.n[k] = n[i], p.first[k] = chunks;
    chunks += mt_chunks(n[i]);
  }
  return sum_partials(be, nb, "sumsq_multi");
}

void mc_cuda_install_elem(mc_backend *be) {
  be->fill = cu_fill;
  be->copy = cu_copy;
  be->copy_bf16 = cu_copy_bf16;
  be->copy_2d = cu_copy_2d;
  be->scale = cu_scale;
  be->axpy = cu_axpy;
  be->sumsq = cu_sumsq;
  be->adamw = cu_adamw;
  be->adamw_multi = cu_adamw_multi;
  be->sumsq_multi = cu_sumsq_multi;
}
