/* The planner's recompute FLOPs (core/recompute.h) against the products the trainer actually
 * issues in a recompute. A copy of the CPU backend counts the FLOPs of every product it runs
 * (gemm, gemm_ex, gemm_strided: 2 M N K each; the grouped ones summed over their groups, so the
 * experts' rows as routed) and of the attention core (attn_fwd: the score and value products
 * of every query with its T(T+1)/2 causal keys, 2 x 2 hd per pair and head). One micro-batch's
 * forward and backward under a policy minus the same under none is the recompute's.
 *
 * What the planner predicts for it, per layer and token: the parts mc_recompute_reruns says the
 * policy reruns, counting their products only. In the block table the projections and output
 * parts are products, the norm is elementwise, and the parts after the projections are
 * elementwise except the attention core; so the products a layer recomputes are its
 * projections' part when rerun, plus the attention's inner part when rerun. The elementwise ops
 * are not counted here (their FLOPs are the cost model's convention, not something an op
 * reports); that the norm and the inner parts run again is train.test_recompute's bitwise
 * check.
 *
 * Cases: AEMR with routed experts (dropless: every token takes top_k experts, so the grouped
 * products' rows are tokens x top_k) and RMAE with the plain SwiGLU E block (no router), both
 * under selective and full, with fp32 and with bf16 weights (the _ex products); the counted recompute must equal the prediction exactly and be
 * nonzero. */
#include <stdio.h>
#include <stdlib.h>

#include "core/recompute.h"
#include "tests/train/netcheck.h"

static mc_backend counting_cpu, counting_bf16; /* fp32 weights; bf16 weights (gemm_ex, gemm_grouped_ex) */
static double counted; /* FLOPs of the products issued through counting_cpu since the last reset */

static void count_gemm(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  counted += 2.0 * M * N * K;
  mc_backend_cpu()->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void count_gemm_strided(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                               int64_t sa, const float *B, int ldb, int64_t sb, float beta, float *C, int ldc, int64_t sc,
                               int batch) {
  counted += 2.0 * M * N * K * batch;
  mc_backend_cpu()->gemm_strided(be, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}

static double grouped_flops(int groups, const int *M, const int *N, const int *K) {
  double f = 0;
  for (int g = 0; g < groups; g++) f += 2.0 * M[g] * N[g] * K[g];
  return f;
}

static void count_gemm_grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                               float alpha, const float *A, const int64_t *ao, int lda, const float *B, const int64_t *bo,
                               int ldb, float beta, float *C, const int64_t *co, int ldc) {
  counted += grouped_flops(groups, M, N, K);
  mc_backend_cpu()->gemm_grouped(be, ta, tb, groups, M, N, K, alpha, A, ao, lda, B, bo, ldb, beta, C, co, ldc);
}

static void count_gemm_ex(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                          mc_operand B, int ldb, float beta, mc_dst C, int ldc) {
  counted += 2.0 * M * N * K;
  mc_backend_cpu()->gemm_ex(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void count_gemm_grouped_ex(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                                  float alpha, mc_operand A, const int64_t *ao, int lda, mc_operand B, const int64_t *bo,
                                  int ldb, float beta, mc_dst C, const int64_t *co, int ldc) {
  counted += grouped_flops(groups, M, N, K);
  mc_backend_cpu()->gemm_grouped_ex(be, ta, tb, groups, M, N, K, alpha, A, ao, lda, B, bo, ldb, beta, C, co, ldc);
}

static void count_attn_fwd(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV, int hd,
                           mc_dst out, float *lse) {
  counted += (double)n_seq * H * (T * (T + 1) / 2.0) * 2.0 * 2.0 * hd;
  mc_backend_cpu()->attn_fwd(be, q, k, v, n_seq, T, H, KV, hd, out, lse);
}

/* Products the planner says one layer of `block` recomputes per token under r. */
static double predicted_products(const mc_model *m, char block, int routed, mc_recompute r) {
  const mc_block_kind *k = mc_block_kind_of(block);
  const int rt = k->routes && routed;
  double f = mc_recompute_reruns(block, MC_PART_PROJ, routed, r) ? k->part_flops(m, MC_PART_PROJ, rt) : 0.0;
  if (block == 'A' && mc_recompute_reruns(block, MC_PART_INNER, routed, r)) f += k->part_flops(m, MC_PART_INNER, rt);
  return f;
}

/* Counted products of one micro-batch's forward and backward under policy r. */
static double count_step(const mc_geometry *geo, mc_backend *be, const int32_t *tok, int n_seq, mc_recompute r,
                         int *routed) {
  mc_net *net = mc_net_create_on(geo, 0, 7, be);
  CHECK(net != NULL, "network: %s", mc_errmsg());
  if (!net) return 0.0;
  CHECK_OK(mc_net_set_recompute(net, r));
  mc_net_stats st;
  counted = 0.0;
  CHECK_OK(mc_net_forward_backward(net, tok, n_seq, 0.05, 0.3, &st));
  CHECK(st.dropped == 0, "a dropless model dropped %lld assignments", (long long)st.dropped);
  *routed = !mc_moe_is_dense(net);
  const double f = counted;
  mc_net_free(net);
  return f;
}

static void check_case(const char *pattern, int E, int k, mc_backend *be) {
  mc_model m = nc_model(pattern);
  m.n_experts = E, m.top_k = k;
  mc_geometry geo;
  mc_layout l = nc_layout(1, 1, 1);
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &geo));
  const int n_seq = 3;
  int32_t *tok = nc_tokens(&m, n_seq, 5);
  int routed = 0;
  const double base = count_step(&geo, be, tok, n_seq, MC_RECOMPUTE_NONE, &routed);
  for (int r = MC_RECOMPUTE_SELECTIVE; r <= MC_RECOMPUTE_FULL; r++) {
    const double got = count_step(&geo, be, tok, n_seq, (mc_recompute)r, &routed) - base;
    double want = 0.0, whole = 0.0;
    for (const char *b = m.pattern; *b; b++) {
      want += predicted_products(&m, *b, routed, (mc_recompute)r);
      whole += mc_block_recompute_flops(&m, *b, routed, (mc_recompute)r);
    }
    want *= (double)n_seq * m.seq_len, whole *= (double)n_seq * m.seq_len;
    const char *w = be->bf16_weights ? "bf16" : "fp32";
    CHECK(got > 0 && got == want, "%s (E=%d top-%d, %s) %s: the trainer's recompute issued %.17g product FLOPs, the planner says %.17g",
          pattern, E, k, w, mc_recompute_name((mc_recompute)r), got, want);
    printf("  %-5s E=%d top-%d %s %-9s: products recomputed %.0f (planner %.0f), planner's whole recompute %.0f\n", pattern,
           E, k, w, mc_recompute_name((mc_recompute)r), got, want, whole);
  }
  free(tok);
  mc_geometry_free(&geo);
}

int main(void) {
  counting_cpu = *mc_backend_cpu();
  counting_cpu.gemm = count_gemm;
  counting_cpu.gemm_strided = count_gemm_strided;
  counting_cpu.gemm_grouped = count_gemm_grouped;
  counting_cpu.gemm_ex = count_gemm_ex;
  counting_cpu.gemm_grouped_ex = count_gemm_grouped_ex;
  counting_cpu.attn_fwd = count_attn_fwd;
  counting_bf16 = counting_cpu;
  counting_bf16.bf16_weights = 1;
  for (int bf = 0; bf < 2; bf++) {
    check_case("AEMR", 4, 2, bf ? &counting_bf16 : &counting_cpu);
    check_case("RMAE", 1, 1, bf ? &counting_bf16 : &counting_cpu);
  }
  return mc_check_exit("test_recompute_flops");
}
