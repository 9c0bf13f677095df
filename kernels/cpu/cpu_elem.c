/* Whole-tensor elementwise ops, the copy of a block of rows (copy_2d), the sum of squares (one
 * tensor or many) and AdamW (one tensor or many, with the optional copies of the updated
 * weights). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"

void mc_cpu_fill(mc_backend *be, float *x, int64_t n, float value) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

void mc_cpu_copy(mc_backend *be, float *dst, const float *src, int64_t n) {
  (void)be;
  const size_t bytes = (size_t)n * sizeof(float);
  if (bytes) memcpy(dst, src, bytes);
}

void mc_cpu_copy_bf16(mc_backend *be, mc_bf16 *dst, const mc_bf16 *src, int64_t n) {
  (void)be;
  const size_t bytes = (size_t)n * sizeof(mc_bf16);
  if (bytes) memcpy(dst, src, bytes);
}

void mc_cpu_copy_2d(mc_backend *be, float *dst, int64_t dpitch, const float *src, int64_t spitch, int64_t width,
                    int64_t height) {
  (void)be;
  if (width <= 0 || height <= 0) return;
  /* the CUDA op (cudaMemcpy2D) rejects a pitch below the width; so does the reference */
  if (dpitch < width || spitch < width) {
    mc_cpu_fail("copy_2d: a pitch is below the width");
    return;
  }
#pragma omp parallel for if (width * height > MC_CPU_PAR_MIN)
  for (int64_t r = 0; r < height; r++) memcpy(dst + r * dpitch, src + r * spitch, (size_t)width * sizeof(float));
}

void mc_cpu_scale(mc_backend *be, float *x, int64_t n, float alpha) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) x[i] *= alpha;
}

void mc_cpu_axpy(mc_backend *be, float *y, const float *x, int64_t n, float alpha) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

double mc_cpu_sumsq(mc_backend *be, const float *x, int64_t n) {
  (void)be;
  double s = 0.0;
  /* A fixed split independent of the thread count keeps the result reproducible. */
  enum { CHUNK = 1 << 16 };
  int64_t nchunks = (n + CHUNK - 1) / CHUNK;
  if (nchunks <= 1) {
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
  }
  double *part = malloc((size_t)nchunks * sizeof(double));
  if (!part) {
    mc_cpu_fail("sumsq: out of memory for partial sums");
    return NAN;
  }
#pragma omp parallel for
  for (int64_t c = 0; c < nchunks; c++) {
    double p = 0.0;
    int64_t end = (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n;
    for (int64_t i = c * CHUNK; i < end; i++) p += (double)x[i] * x[i];
    part[c] = p;
  }
  for (int64_t c = 0; c < nchunks; c++) s += part[c];
  free(part);
  return s;
}

/* One tensor's update; adamw and adamw_multi both run this loop, so their results agree bit
 * for bit. */
static void adamw_tensor(float *w, const float *g, float *m, float *v, int64_t n, const mc_adamw_args *a,
                         float weight_decay, float *w_copy, mc_bf16 *w_bf16) {
  const float b1 = a->beta1, b2 = a->beta2;
  const float bc1 = (float)(1.0 - pow(a->beta1, (double)a->step));
  const float bc2 = (float)(1.0 - pow(a->beta2, (double)a->step));
  const float decay = 1.0f - a->lr * weight_decay;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * a->grad_scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] / bc1, vhat = v[i] / bc2;
    w[i] = w[i] * decay - a->lr * mhat / (sqrtf(vhat) + a->eps);
    if (w_copy) w_copy[i] = w[i];
    if (w_bf16) w_bf16[i] = mc_bf16_from_float(w[i]);
  }
}

void mc_cpu_adamw(mc_backend *be, float *w, const float *g, float *m, float *v, int64_t n,
                  const mc_adamw_args *a) {
  (void)be;
  adamw_tensor(w, g, m, v, n, a, a->weight_decay, NULL, NULL);
}

void mc_cpu_adamw_multi(mc_backend *be, const mc_adamw_tensor *t, int count, const mc_adamw_args *a) {
  (void)be;
  if (count < 0 || (count > 0 && !t)) {
    mc_cpu_fail("adamw_multi: bad tensor list (negative count or no descriptors)");
    return;
  }
  for (int i = 0; i < count; i++)
    if (t[i].n < 0) {
      mc_cpu_fail("adamw_multi: a tensor has a negative size");
      return;
    }
  for (int i = 0; i < count; i++)
    adamw_tensor(t[i].w, t[i].g, t[i].m, t[i].v, t[i].n, a, t[i].weight_decay, t[i].w_copy, t[i].w_bf16);
}

/* Tensor by tensor, in order: exactly the sum of the single-tensor results. */
double mc_cpu_sumsq_multi(mc_backend *be, const float *const *x, const int64_t *n, int count) {
  if (count < 0 || (count > 0 && (!x || !n))) {
    mc_cpu_fail("sumsq_multi: bad tensor list (negative count or no arrays)");
    return NAN;
  }
  double s = 0.0;
  for (int i = 0; i < count; i++) s += mc_cpu_sumsq(be, x[i], n[i]);
  return s;
}
