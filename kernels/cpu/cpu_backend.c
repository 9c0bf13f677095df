/* The CPU backend table, its memory functions and the whole-tensor elementwise ops. Backend
 * memory is host memory, so copies are memcpy and nothing is ever queued. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"
#include "util/error.h"

static void *cpu_alloc(mc_backend *be, size_t bytes) {
  (void)be;
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) mc_error("cpu backend: out of memory allocating %zu bytes", bytes);
  return p;
}

static void cpu_free(mc_backend *be, void *p) {
  (void)be;
  free(p);
}

static void cpu_memcpy(mc_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) memcpy(dst, src, bytes);
}

/* The first failure recorded by an op since the last sync (sticky, like a device error). */
static char cpu_failure[256];
static int cpu_failed;

void mc_cpu_fail(const char *what) {
#pragma omp critical(mc_cpu_fail)
  {
    if (!cpu_failed) {
      snprintf(cpu_failure, sizeof cpu_failure, "%s", what);
      cpu_failed = 1;
    }
  }
}

const float *mc_cpu_widen(mc_operand x, int64_t n, float **owned, const char *op) {
  *owned = NULL;
  if (!x.h) return x.f;
  float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!w) {
    mc_cpu_fail(op);
    return NULL;
  }
#pragma omp parallel for schedule(static) if (n >= MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) w[i] = mc_bf16_to_float(x.h[i]);
  return *owned = w;
}

static int cpu_sync(mc_backend *be) {
  (void)be;
  int failed;
#pragma omp critical(mc_cpu_fail)
  {
    failed = cpu_failed;
    cpu_failed = 0;
  }
  return failed ? mc_error("cpu backend: %s", cpu_failure) : 0;
}

void mc_cpu_fill(mc_backend *be, float *x, int64_t n, float value) {
  (void)be;
#pragma omp parallel for if (n > MC_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

void mc_cpu_copy(mc_backend *be, float *dst, const float *src, int64_t n) {
  cpu_memcpy(be, dst, src, (size_t)n * sizeof(float));
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

static mc_backend cpu_backend = {
    .name = "cpu",
    .ctx = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_memcpy,
    .from_host = cpu_memcpy,
    .sync = cpu_sync,
    .fill = mc_cpu_fill,
    .copy = mc_cpu_copy,
    .scale = mc_cpu_scale,
    .axpy = mc_cpu_axpy,
    .sumsq = mc_cpu_sumsq,
    .adamw = mc_cpu_adamw,
    .adamw_multi = mc_cpu_adamw_multi,
    .sumsq_multi = mc_cpu_sumsq_multi,
    .gemm = mc_cpu_gemm,
    .gemm_strided = mc_cpu_gemm_strided,
    .gemm_grouped = mc_cpu_gemm_grouped,
    .gemm_ex = mc_cpu_gemm_ex,
    .gemm_grouped_ex = mc_cpu_gemm_grouped_ex,
    .to_bf16 = mc_cpu_to_bf16,
    .bias_fwd = mc_cpu_bias_fwd,
    .bias_bwd = mc_cpu_bias_bwd,
    .act_fwd = mc_cpu_act_fwd,
    .act_bwd = mc_cpu_act_bwd,
    .glu_fwd = mc_cpu_glu_fwd,
    .glu_bwd = mc_cpu_glu_bwd,
    .embed_fwd = mc_cpu_embed_fwd,
    .embed_bwd = mc_cpu_embed_bwd,
    .rmsnorm_fwd = mc_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = mc_cpu_rmsnorm_bwd,
    .rope_fwd = mc_cpu_rope_fwd,
    .rope_bwd = mc_cpu_rope_bwd,
    .attn_fwd = mc_cpu_attn_fwd,
    .attn_bwd = mc_cpu_attn_bwd,
    .conv_fwd = mc_cpu_conv_fwd,
    .conv_bwd = mc_cpu_conv_bwd,
    .ssm_fwd = mc_cpu_ssm_fwd,
    .ssm_bwd = mc_cpu_ssm_bwd,
    .rglru_fwd = mc_cpu_rglru_fwd,
    .rglru_bwd = mc_cpu_rglru_bwd,
    .moe_route = mc_cpu_moe_route,
    .moe_route_bwd = mc_cpu_moe_route_bwd,
    .moe_permute = mc_cpu_moe_permute,
    .moe_permute_bwd = mc_cpu_moe_permute_bwd,
    .moe_unpermute = mc_cpu_moe_unpermute,
    .moe_unpermute_bwd = mc_cpu_moe_unpermute_bwd,
    .xent_fwd = mc_cpu_xent_fwd,
    .xent_bwd = mc_cpu_xent_bwd,
};

mc_backend *mc_backend_cpu(void) { return &cpu_backend; }
