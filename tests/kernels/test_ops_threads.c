/* The parallel paths of the CPU ops, on sizes above the serial threshold: results must be
 * bit-identical with 1 and with 3 threads (every output element is computed by one thread
 * in a fixed order), which also catches races between threads. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tests/kernels/kcheck.h"

static mc_backend *be;

/* sizes: 8 sequences of 256 tokens (16 for the channel ops), each op's work above
 * MC_CPU_PAR_MIN = 2^22 */
enum { S = 8, T = 256, NT = S * T, H = 4, KV = 2, HD = 32, C = 1536, HM = 4, P = 64, N = 16, S2 = 16, NT2 = S2 * T };

typedef struct {
  float *out[6];
  int64_t len[6];
} result;

static void run_ops(result *r, int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
  /* attention */
  float *q = kc_rand((int64_t)NT * H * HD, 1, 1), *k = kc_rand((int64_t)NT * KV * HD, 2, 1);
  float *v = kc_rand((int64_t)NT * KV * HD, 3, 1), *dout = kc_rand((int64_t)NT * H * HD, 4, 1);
  float *o = kc_zeros((int64_t)NT * H * HD), *lse = kc_zeros((int64_t)NT * H);
  float *dq = kc_zeros((int64_t)NT * H * HD), *dk = kc_zeros((int64_t)NT * KV * HD), *dv = kc_zeros((int64_t)NT * KV * HD);
  be->attn_fwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, S, T, H, KV, HD, (mc_dst){o, NULL}, lse);
  be->attn_bwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){o, NULL}, lse, (mc_operand){dout, NULL}, S, T, H, KV, HD, dq, dk, dv);
  r->out[0] = o, r->len[0] = (int64_t)NT * H * HD;
  r->out[1] = dk, r->len[1] = (int64_t)NT * KV * HD;
  free(q), free(k), free(v), free(dout), free(lse), free(dq), free(dv);
  /* selective scan */
  float *x = kc_rand((int64_t)NT * HM * P, 5, 1), *dt = kc_rand((int64_t)NT * HM, 6, 0.1f), *al = kc_rand(HM, 7, 0.5f);
  float *B = kc_rand((int64_t)NT * N, 8, 1), *Cm = kc_rand((int64_t)NT * N, 9, 1), *Dv = kc_rand(HM, 10, 1);
  float *dy = kc_rand((int64_t)NT * HM * P, 11, 1), *y = kc_zeros((int64_t)NT * HM * P);
  for (int64_t i = 0; i < (int64_t)NT * HM; i++) dt[i] = fabsf(dt[i]);
  float *dx = kc_zeros((int64_t)NT * HM * P), *ddt = kc_zeros((int64_t)NT * HM), *dal = kc_zeros(HM);
  float *dB = kc_zeros((int64_t)NT * N), *dC = kc_zeros((int64_t)NT * N), *dD = kc_zeros(HM);
  be->ssm_fwd(be, x, dt, al, B, Cm, Dv, S, T, HM, P, N, y);
  be->ssm_bwd(be, x, dt, al, B, Cm, Dv, dy, S, T, HM, P, N, dx, ddt, dal, dB, dC, dD);
  r->out[2] = y, r->len[2] = (int64_t)NT * HM * P;
  r->out[3] = dB, r->len[3] = (int64_t)NT * N;
  free(x), free(dt), free(al), free(B), free(Cm), free(Dv), free(dy), free(dx), free(ddt), free(dal), free(dC), free(dD);
  /* channel ops: conv, rglru, rmsnorm, activations over [NT2, C] */
  float *a = kc_rand((int64_t)NT2 * C, 12, 1), *g = kc_rand((int64_t)NT2 * C, 13, 1), *w = kc_rand((int64_t)C * 4, 14, 1);
  float *b = kc_rand(C, 15, 1), *out = kc_zeros((int64_t)NT2 * C), *da = kc_zeros((int64_t)NT2 * C);
  float *dw = kc_zeros((int64_t)C * 4), *db = kc_zeros(C), *rs = kc_zeros((int64_t)NT2 * C / 64);
  be->conv_silu_fwd(be, a, w, b, S2, T, C, 4, out);
  be->conv_silu_bwd(be, a, w, b, g, S2, T, C, 4, (mc_dst){da, NULL}, dw, db);
  be->act_fwd(be, MC_ACT_SIGMOID, g, g, (int64_t)NT2 * C);
  be->rglru_fwd(be, a, g, b, S2, T, C, out);
  be->rglru_bwd(be, a, g, b, out, a, S2, T, C, da, da, db);
  be->rmsnorm_fwd(be, a, b, NT2, C, 64, 1e-5f, (mc_dst){out, NULL}, rs);
  be->rmsnorm_bwd(be, a, b, rs, g, NT2, C, 64, da, db);
  be->glu_bwd(be, MC_ACT_GELU, (mc_operand){a, NULL}, (mc_operand){g, NULL}, (mc_operand){out, NULL}, (mc_dst){da, NULL},
              (mc_dst){da, NULL}, (int64_t)NT2 * C);
  r->out[4] = da, r->len[4] = (int64_t)NT2 * C;
  r->out[5] = db, r->len[5] = C;
  free(a), free(g), free(w), free(b), free(out), free(dw), free(rs);
}

int main(void) {
  be = mc_backend_cpu();
  result one, many;
  run_ops(&one, 1);
  run_ops(&many, 3);
  const char *names[6] = {"attn out", "attn dk", "ssm y", "ssm dB", "channel ops dx", "channel ops db"};
  for (int i = 0; i < 6; i++) {
    CHECK(memcmp(one.out[i], many.out[i], (size_t)one.len[i] * sizeof(float)) == 0, "%s differs between 1 and 3 threads", names[i]);
    free(one.out[i]), free(many.out[i]);
  }
  /* sum of squares: a fixed chunking, so the same double whatever the thread count */
  float *x = kc_rand(5000000, 20, 1);
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
  double s1 = be->sumsq(be, x, 5000000);
#ifdef _OPENMP
  omp_set_num_threads(3);
#endif
  double s3 = be->sumsq(be, x, 5000000);
  CHECK(s1 == s3, "sumsq %.17g vs %.17g", s1, s3);
  free(x);
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  return mc_check_exit("test_ops_threads");
}
