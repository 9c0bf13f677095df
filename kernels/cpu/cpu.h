/* The CPU reference backend's op implementations (kernels/ops.h documents each op). One
 * source file per op family (docs/kernels.md maps each op to its file); cpu_backend.c
 * assembles them into the backend table. */
#ifndef MC_KERNELS_CPU_H
#define MC_KERNELS_CPU_H

#include <math.h>

#include "kernels/ops.h"

void mc_cpu_fill(mc_backend *be, float *x, int64_t n, float value);
void mc_cpu_copy(mc_backend *be, float *dst, const float *src, int64_t n);
void mc_cpu_copy_bf16(mc_backend *be, mc_bf16 *dst, const mc_bf16 *src, int64_t n);
void mc_cpu_copy_2d(mc_backend *be, float *dst, int64_t dpitch, const float *src, int64_t spitch, int64_t width,
                    int64_t height);
void mc_cpu_scale(mc_backend *be, float *x, int64_t n, float alpha);
void mc_cpu_axpy(mc_backend *be, float *y, const float *x, int64_t n, float alpha);
double mc_cpu_sumsq(mc_backend *be, const float *x, int64_t n);
void mc_cpu_adamw(mc_backend *be, float *w, const float *g, float *m, float *v, int64_t n,
                  const mc_adamw_args *a);
void mc_cpu_adamw_multi(mc_backend *be, const mc_adamw_tensor *t, int count, const mc_adamw_args *a);
double mc_cpu_sumsq_multi(mc_backend *be, const float *const *x, const int64_t *n, int count);

void mc_cpu_gemm(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc);
void mc_cpu_gemm_strided(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, int64_t sa, const float *B, int ldb, int64_t sb,
                         float beta, float *C, int ldc, int64_t sc, int batch);
void mc_cpu_gemm_grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N,
                         const int *K, float alpha, const float *A, const int64_t *a_off, int lda,
                         const float *B, const int64_t *b_off, int ldb, float beta, float *C,
                         const int64_t *c_off, int ldc);
void mc_cpu_gemm_ex(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                    mc_operand B, int ldb, float beta, mc_dst C, int ldc);
void mc_cpu_gemm_grouped_ex(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                            float alpha, mc_operand A, const int64_t *a_off, int lda, mc_operand B,
                            const int64_t *b_off, int ldb, float beta, mc_dst C, const int64_t *c_off, int ldc);
void mc_cpu_to_bf16(mc_backend *be, const float *x, mc_bf16 *y, int64_t n);

void mc_cpu_bias_fwd(mc_backend *be, float *y, const float *b, int n, int c);
void mc_cpu_bias_bwd(mc_backend *be, const float *dy, int n, int c, float *db);
void mc_cpu_act_fwd(mc_backend *be, mc_act act, const float *x, float *y, int64_t n);
void mc_cpu_act_bwd(mc_backend *be, mc_act act, const float *x, const float *dy, float *dx,
                    int64_t n);
void mc_cpu_glu_fwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_dst y, int64_t n);
void mc_cpu_glu_bwd(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_operand dy, mc_dst da, mc_dst db,
                    int64_t n);

void mc_cpu_embed_fwd(mc_backend *be, const int32_t *tok, int n, int d, const float *W, float *y);
void mc_cpu_embed_bwd(mc_backend *be, const int32_t *tok, int n, int d, const float *dy,
                      float *dW);

void mc_cpu_rmsnorm_fwd(mc_backend *be, const float *x, const float *w, int n, int d, int group,
                        float eps, mc_dst y, float *rstd);
void mc_cpu_rmsnorm_bwd(mc_backend *be, const float *x, const float *w, const float *rstd,
                        const float *dy, int n, int d, int group, float *dx, float *dw);
void mc_cpu_gated_rmsnorm_fwd(mc_backend *be, const float *y, mc_operand z, const float *w, int n, int d, int group,
                              float eps, mc_dst out, float *rstd);
void mc_cpu_gated_rmsnorm_bwd(mc_backend *be, const float *y, mc_operand z, const float *w, const float *rstd,
                              const float *dout, int n, int d, int group, float *dy, mc_dst dz, float *dw);

void mc_cpu_rope_fwd(mc_backend *be, mc_dst x, int n, int T, int heads, int hd, double theta);
void mc_cpu_rope_bwd(mc_backend *be, mc_operand dy, mc_dst dx, int n, int T, int heads, int hd, double theta);

void mc_cpu_attn_fwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV,
                     int hd, mc_dst out, float *lse);
void mc_cpu_attn_bwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out, const float *lse,
                     mc_operand dout, int n_seq, int T, int H, int KV, int hd, float *dq, float *dk, float *dv);

void mc_cpu_conv_silu_fwd(mc_backend *be, const float *x, const float *w, const float *b, int n_seq,
                          int T, int c, int K, float *y);
void mc_cpu_conv_silu_bwd(mc_backend *be, const float *x, const float *w, const float *b, const float *dy,
                          int n_seq, int T, int c, int K, mc_dst dx, float *dw, float *db);
void mc_cpu_ssm_fwd(mc_backend *be, const float *x, const float *dt, const float *A_log,
                    const float *B, const float *C, const float *D, int n_seq, int T, int Hm,
                    int P, int N, float *y);
void mc_cpu_ssm_bwd(mc_backend *be, const float *x, const float *dt, const float *A_log,
                    const float *B, const float *C, const float *D, const float *dy, int n_seq,
                    int T, int Hm, int P, int N, float *dx, float *ddt, float *dA_log, float *dB,
                    float *dC, float *dD);

void mc_cpu_rglru_fwd(mc_backend *be, const float *gx, const float *r, const float *lambda,
                      int n_seq, int T, int c, float *h);
void mc_cpu_rglru_bwd(mc_backend *be, const float *gx, const float *r, const float *lambda,
                      const float *h, const float *dh, int n_seq, int T, int c, float *dgx,
                      float *dr, float *dlambda);

void mc_cpu_moe_route(mc_backend *be, const float *logits, int n_seq, int T, int E, int k,
                      int capacity, float *probs, int32_t *idx, float *gate, int32_t *slot,
                      int32_t *counts, float *f, float *pbar, float *aux, int32_t *dropped);
void mc_cpu_moe_route_bwd(mc_backend *be, const float *probs, const int32_t *idx,
                          const float *gate, const float *dgate, const float *f, int n_seq, int T,
                          int E, int k, float aux_scale, float *dlogits);
void mc_cpu_moe_permute(mc_backend *be, const float *x, const int32_t *slot, int n, int k, int d,
                        mc_dst xp);
void mc_cpu_moe_permute_bwd(mc_backend *be, const float *dxp, const int32_t *slot, int n, int k,
                            int d, float *dx);
void mc_cpu_moe_unpermute(mc_backend *be, const float *yp, const int32_t *slot, const float *gate,
                          int n, int k, int d, float *y);
void mc_cpu_moe_unpermute_bwd(mc_backend *be, const float *dy, const float *yp,
                              const int32_t *slot, const float *gate, int n, int k, int d,
                              mc_dst dyp, float *dgate);

void mc_cpu_xent_fwd(mc_backend *be, const float *logits, const int32_t *target, int n, int V,
                     int Vp, float *loss, float *lse);
void mc_cpu_xent_bwd(mc_backend *be, const float *logits, const int32_t *target, const float *lse,
                     int n, int V, int Vp, float scale, mc_dst dlogits);

/* Work (elements or multiply-adds) below which an op runs on the calling thread: a parallel
 * region costs a fork and a barrier, which on small tensors, or on a machine whose cores
 * are busy with other processes, costs more than the work itself. */
#define MC_CPU_PAR_MIN (1 << 22)

/* Records a failure inside an op (any thread); the backend's sync() reports the first one. */
void mc_cpu_fail(const char *what);
/* fp32 view of an op input of n elements: the fp32 one itself, or a malloc'd copy widened from
 * bf16 (*owned set, the caller frees); NULL (failure `op` recorded) when out of memory. */
const float *mc_cpu_widen(mc_operand x, int64_t n, float **owned, const char *op);

/* Scalar activation math shared by the elementwise ops and the scans. */
static inline float mc_sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }
static inline float mc_softplusf(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
static inline float mc_siluf(float v) { return v * mc_sigmoidf(v); }
/* d silu(v) / dv */
static inline float mc_silu_df(float v) {
  float s = mc_sigmoidf(v);
  return s * (1.0f + v * (1.0f - s));
}

#endif
