/* The CPU backend table, its memory functions, the sticky failure record and the bf16 widening
 * of op inputs; the ops are in one source file per op family (docs/kernels.md). Backend memory
 * is host memory, so copies are memcpy and nothing is ever queued. */
#include <math.h>
#include <pthread.h>
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

static void *cpu_host_alloc(mc_backend *be, size_t bytes) {
  (void)be;
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) mc_error("cpu backend: cannot allocate %zu bytes of host memory", bytes);
  return p;
}

static void cpu_host_free(mc_backend *be, void *p) {
  (void)be;
  free(p);
}

/* Snapshots: ops run when called, so a copy made now already sees every earlier op's result
 * and nothing later can overwrite what it read. */
static void cpu_snap_nothing(mc_backend *be) { (void)be; }
static int cpu_snap_wait(mc_backend *be) {
  (void)be;
  return 0;
}

static mc_backend cpu_backend = {
    .name = "cpu",
    .ctx = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_memcpy,
    .from_host = cpu_memcpy,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .snap_begin = cpu_snap_nothing,
    .snap_to_host = cpu_memcpy,
    .snap_end = cpu_snap_nothing,
    .snap_fence = cpu_snap_nothing,
    .snap_wait = cpu_snap_wait,
    .fill = mc_cpu_fill,
    .copy = mc_cpu_copy,
    .copy_bf16 = mc_cpu_copy_bf16,
    .copy_2d = mc_cpu_copy_2d,
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
    .gated_rmsnorm_fwd = mc_cpu_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = mc_cpu_gated_rmsnorm_bwd,
    .rope_fwd = mc_cpu_rope_fwd,
    .rope_bwd = mc_cpu_rope_bwd,
    .attn_fwd = mc_cpu_attn_fwd,
    .attn_bwd = mc_cpu_attn_bwd,
    .conv_silu_fwd = mc_cpu_conv_silu_fwd,
    .conv_silu_bwd = mc_cpu_conv_silu_bwd,
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

/* The same table with bf16_weights set: the network then stores what the CUDA bf16 instance
 * stores in bf16, and every op widens bf16 inputs exactly (the CPU ops take both storage
 * forms). Products of fp32 operands are not rounded first, as the CUDA instance's are. */
static mc_backend cpu_bf16_backend;
static pthread_once_t cpu_bf16_once = PTHREAD_ONCE_INIT;
static void cpu_bf16_init(void) {
  cpu_bf16_backend = cpu_backend;
  cpu_bf16_backend.name = "cpu-bf16";
  cpu_bf16_backend.bf16_weights = 1;
}
mc_backend *mc_backend_cpu_bf16(void) {
  pthread_once(&cpu_bf16_once, cpu_bf16_init);
  return &cpu_bf16_backend;
}

int mc_backend_is_cpu(const mc_backend *be) { return be == &cpu_backend || be == &cpu_bf16_backend; }
