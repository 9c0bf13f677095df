/* Tensor-core attention (kernels/cuda/cuda_attn_tc.cu) of the bf16 instance
 * (mc_backend_cuda_bf16) against the CPU reference, forward and backward, on random inputs.
 * - Errors are norm-wise relative: |gpu - cpu| / |cpu| for out and lse; for dq, dk, dv, which
 *   start from the same random values on both sides (the backward adds), the error of the
 *   added part: |gpu - cpu| / |cpu - start|. (At T = 1 dq and dk are zero in exact arithmetic,
 *   so there the full norm |cpu| is the reference instead.) Forward outputs start as NaN.
 * - Band: q, k, v, p, dout and ds are rounded to bf16 (relative 2^-9 each), sums in fp32,
 *   so errors of a few 1e-3 are expected; the check is 1e-2 (issue 7's bf16 band). It also
 *   asserts out's error is above 1e-5, i.e. the bf16 kernels really ran.
 * - The backward runs twice on the same inputs and must give identical bits (no atomics).
 * - head_dim 32 on the bf16 instance must run the fp32 kernel: within 1e-5 of the CPU and
 *   bit-identical to the fp32 instance.
 * - At n_seq 5, T 2048, H 8, KV 4, hd 64 (too large for the CPU) the bf16 instance is
 *   compared with the fp32 instance instead: there dk/dv blocks walk every query head of
 *   their group in turn, while the small cases take one query head per block.
 * `test_cuda_attn_tc --time` also times forward and backward at nam-small and dense-a shapes
 * on both instances (CUDA events on the backend's stream, 3 warm-up runs, median of 15) and
 * compares the bf16 results with the fp32 instance's there; `--profile` runs only one
 * forward and backward at those shapes on the bf16 instance (for a kernel profiler). Without a CUDA build or a GPU it
 * prints "SKIP: no CUDA device" and passes. */
#include <string.h>

#include "tests/kernels/cudacheck.h"
#include "tests/kernels/kcheck.h"
#ifdef MC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/backend_cuda.h"


#define BAND 1e-2
#define TOL_FP32 1e-5

static mc_backend *cpu, *g32, *g16;
static uint64_t stream_no = 7000;

static float *dev_up(mc_backend *be, const float *h, int64_t n) {
  float *d = be->alloc(be, (size_t)n * sizeof(float));
  if (!d) {
    fprintf(stderr, "device allocation of %lld floats failed: %s\n", (long long)n, mc_errmsg());
    exit(1);
  }
  be->from_host(be, d, h, (size_t)n * sizeof(float));
  return d;
}
static float *dev_nan(mc_backend *be, int64_t n) {
  float *h = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  float *d = dev_up(be, h, n);
  free(h);
  return d;
}
static float *dev_down(mc_backend *be, const float *d, int64_t n) {
  float *h = malloc((size_t)n * sizeof(float));
  be->to_host(be, h, d, (size_t)n * sizeof(float));
  return h;
}

/* |g - c| / |c - start| (start NULL: / |c|); non-finite g where c is finite gives INFINITY. */
static double rel_err(const float *g, const float *c, const float *start, int64_t n) {
  double num = 0.0, den = 0.0, full = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(g[i])) return INFINITY;
    const double d = (double)g[i] - c[i], r = start ? (double)c[i] - start[i] : c[i];
    num += d * d, den += r * r, full += (double)c[i] * c[i];
  }
  if (start && den < 1e-4 * full) den = full; /* the added part is (about) zero: T = 1 */
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double worst = 0.0;

static void report(const char *what, double e, double tol) {
  printf("  %-44s rel %.2e  tol %.0e  %s\n", what, e, tol, e <= tol ? "ok" : "FAIL");
  if (e > worst && tol == BAND) worst = e;
  CHECK(e <= tol, "%s: relative error %.3e above %.0e", what, e, tol);
}

/* One case on backend `be` (g16 or g32): forward and backward against the CPU; tol is the
 * band. Returns the device results of the backward through *bits (dq, dk, dv concatenated,
 * malloc'd) when bits is not NULL. */
static void attn_case(mc_backend *be, int n_seq, int T, int H, int KV, int hd, double tol, float **bits) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *q = kc_rand(nq, stream_no++, 1), *k = kc_rand(nk, stream_no++, 1), *v = kc_rand(nk, stream_no++, 1);
  float *dout = kc_rand(nq, stream_no++, 1), *dq0 = kc_rand(nq, stream_no++, 1);
  float *dk0 = kc_rand(nk, stream_no++, 1), *dv0 = kc_rand(nk, stream_no++, 1);
  float *out = kc_zeros(nq), *lse = kc_zeros(n * H);
  float *dq = malloc((size_t)nq * sizeof(float)), *dk = malloc((size_t)nk * sizeof(float)),
        *dv = malloc((size_t)nk * sizeof(float));
  memcpy(dq, dq0, (size_t)nq * sizeof(float));
  memcpy(dk, dk0, (size_t)nk * sizeof(float));
  memcpy(dv, dv0, (size_t)nk * sizeof(float));
  cpu->attn_fwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, n_seq, T, H, KV, hd, (mc_dst){out, NULL}, lse);
  cpu->attn_bwd(cpu, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){out, NULL}, lse, (mc_operand){dout, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);

  float *qd = dev_up(be, q, nq), *kd = dev_up(be, k, nk), *vd = dev_up(be, v, nk), *dod = dev_up(be, dout, nq);
  float *outd = dev_nan(be, nq), *lsed = dev_nan(be, n * H);
  be->attn_fwd(be, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){outd, NULL}, lsed);
  /* the backward reads the CPU's forward results, so only the backward is compared */
  float *outc = dev_up(be, out, nq), *lsec = dev_up(be, lse, n * H);
  float *dqd = dev_up(be, dq0, nq), *dkd = dev_up(be, dk0, nk), *dvd = dev_up(be, dv0, nk);
  be->attn_bwd(be, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){outc, NULL}, lsec, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
  CHECK(be->sync(be) == 0, "attention n_seq=%d T=%d hd=%d: %s", n_seq, T, hd, mc_errmsg());
  float *go = dev_down(be, outd, nq), *gl = dev_down(be, lsed, n * H), *gq = dev_down(be, dqd, nq),
        *gk = dev_down(be, dkd, nk), *gv = dev_down(be, dvd, nk);
  char what[96];
  const char *inst = be == g16 ? "bf16" : "fp32";
  double eo = rel_err(go, out, NULL, nq);
  snprintf(what, sizeof what, "%s fwd out n_seq=%d T=%d H=%d/%d hd=%d", inst, n_seq, T, H, KV, hd);
  report(what, eo, tol);
  if (tol == BAND) CHECK(eo > 1e-5, "%s: error %.2e: the bf16 kernels did not run", what, eo);
  snprintf(what, sizeof what, "%s fwd lse", inst);
  report(what, rel_err(gl, lse, NULL, n * H), tol);
  snprintf(what, sizeof what, "%s bwd dq", inst);
  report(what, rel_err(gq, dq, dq0, nq), tol);
  snprintf(what, sizeof what, "%s bwd dk", inst);
  report(what, rel_err(gk, dk, dk0, nk), tol);
  snprintf(what, sizeof what, "%s bwd dv", inst);
  report(what, rel_err(gv, dv, dv0, nk), tol);

  if (bits) {
    *bits = malloc((size_t)(nq + 2 * nk) * sizeof(float));
    memcpy(*bits, gq, (size_t)nq * sizeof(float));
    memcpy(*bits + nq, gk, (size_t)nk * sizeof(float));
    memcpy(*bits + nq + nk, gv, (size_t)nk * sizeof(float));
  }
  if (be == g16 && hd != 32) {
    /* determinism: the same backward again from the same starting gradients */
    be->from_host(be, dqd, dq0, (size_t)nq * sizeof(float));
    be->from_host(be, dkd, dk0, (size_t)nk * sizeof(float));
    be->from_host(be, dvd, dv0, (size_t)nk * sizeof(float));
    be->attn_bwd(be, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){outc, NULL}, lsec, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
    float *rq = dev_down(be, dqd, nq), *rk = dev_down(be, dkd, nk), *rv = dev_down(be, dvd, nk);
    CHECK(memcmp(rq, gq, (size_t)nq * sizeof(float)) == 0 && memcmp(rk, gk, (size_t)nk * sizeof(float)) == 0 &&
              memcmp(rv, gv, (size_t)nk * sizeof(float)) == 0,
          "bf16 backward n_seq=%d T=%d hd=%d: a second run differs", n_seq, T, hd);
    free(rq), free(rk), free(rv);
  }
  CHECK(be->sync(be) == 0, "attention: %s", mc_errmsg());
  float *dptr[] = {qd, kd, vd, dod, outd, lsed, outc, lsec, dqd, dkd, dvd};
  for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) be->free(be, dptr[i]);
  float *hptr[] = {q, k, v, dout, dq0, dk0, dv0, out, lse, dq, dk, dv, go, gl, gq, gk, gv};
  for (size_t i = 0; i < sizeof hptr / sizeof *hptr; i++) free(hptr[i]);
}

/* head_dim 32 on the bf16 instance: the fp32 kernels, bit for bit the fp32 instance's. */
static void fp32_fallback(void) {
  float *a = NULL, *b = NULL;
  const uint64_t s0 = stream_no;
  attn_case(g16, 2, 70, 4, 2, 32, TOL_FP32, &a);
  stream_no = s0; /* the same inputs again */
  attn_case(g32, 2, 70, 4, 2, 32, TOL_FP32, &b);
  const int64_t nall = (int64_t)2 * 70 * (4 + 2 + 2) * 32;
  CHECK(memcmp(a, b, (size_t)nall * sizeof(float)) == 0, "hd=32: the bf16 instance's backward differs from fp32's");
  printf("  hd=32 backward on the bf16 instance bit-identical to the fp32 instance: %s\n",
         memcmp(a, b, (size_t)nall * sizeof(float)) == 0 ? "yes" : "NO");
  free(a), free(b);
}

/* ------------------------------------------------------------------ timing */
static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

#define T_WARM 3
#define T_REPS 15

/* Median ms of `reps` runs of fwd (which = 0) or bwd (which = 1), each between two events
 * recorded on the backend's stream. */
static float time_op(mc_backend *be, int which, const float *q, const float *k, const float *v, const float *out,
                     float *lse, const float *dout, int n_seq, int T, int H, int KV, int hd, float *o, float *dq,
                     float *dk, float *dv) {
  cudaStream_t st = (cudaStream_t)mc_cuda_stream_handle(be);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess, "cudaEventCreate");
  float ms[T_REPS];
  for (int r = 0; r < T_WARM + T_REPS; r++) {
    cudaEventRecord(e0, st);
    if (which == 0) be->attn_fwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, n_seq, T, H, KV, hd, (mc_dst){o, NULL}, lse);
    else be->attn_bwd(be, (mc_operand){q, NULL}, (mc_operand){k, NULL}, (mc_operand){v, NULL}, (mc_operand){out, NULL}, lse, (mc_operand){dout, NULL}, n_seq, T, H, KV, hd, dq, dk, dv);
    cudaEventRecord(e1, st);
    CHECK(cudaEventSynchronize(e1) == cudaSuccess, "cudaEventSynchronize");
    if (r >= T_WARM) cudaEventElapsedTime(&ms[r - T_WARM], e0, e1);
  }
  CHECK(be->sync(be) == 0, "timing: %s", mc_errmsg());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  qsort(ms, T_REPS, sizeof *ms, cmp_f);
  return ms[T_REPS / 2];
}

/* The bf16 instance against the fp32 instance (within 1e-5 of the CPU, test_cuda_ops) at a
 * shape too large for the CPU reference; timed too when `timed`. */
static void big_case(const char *name, int n_seq, int T, int H, int KV, int hd, int timed) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *q = kc_rand(nq, stream_no++, 1), *k = kc_rand(nk, stream_no++, 1), *v = kc_rand(nk, stream_no++, 1);
  float *dout = kc_rand(nq, stream_no++, 1), *z = kc_zeros(nq);
  mc_backend *bes[2] = {g32, g16};
  float *res[2][5]; /* out, lse, dq, dk, dv on the host */
  float tf[2] = {0, 0}, tb[2] = {0, 0};
  for (int b = 0; b < 2; b++) {
    mc_backend *be = bes[b];
    float *qd = dev_up(be, q, nq), *kd = dev_up(be, k, nk), *vd = dev_up(be, v, nk), *dod = dev_up(be, dout, nq);
    float *od = dev_nan(be, nq), *ld = dev_nan(be, n * H);
    float *dqd = dev_up(be, z, nq), *dkd = dev_up(be, z, nk), *dvd = dev_up(be, z, nk);
    /* one forward and one backward from zero gradients for the comparison */
    be->attn_fwd(be, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){od, NULL}, ld);
    be->attn_bwd(be, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){od, NULL}, ld, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
    CHECK(be->sync(be) == 0, "%s: %s", name, mc_errmsg());
    res[b][0] = dev_down(be, od, nq), res[b][1] = dev_down(be, ld, n * H);
    res[b][2] = dev_down(be, dqd, nq), res[b][3] = dev_down(be, dkd, nk), res[b][4] = dev_down(be, dvd, nk);
    if (timed) {
      tf[b] = time_op(be, 0, qd, kd, vd, od, ld, dod, n_seq, T, H, KV, hd, od, dqd, dkd, dvd);
      tb[b] = time_op(be, 1, qd, kd, vd, od, ld, dod, n_seq, T, H, KV, hd, od, dqd, dkd, dvd);
    }
    float *dptr[] = {qd, kd, vd, dod, od, ld, dqd, dkd, dvd};
    for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) be->free(be, dptr[i]);
  }
  static const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  const int64_t sizes[5] = {nq, n * H, nq, nk, nk};
  for (int i = 0; i < 5; i++) {
    char what[96];
    snprintf(what, sizeof what, "%s bf16 vs fp32 instance %s", name, names[i]);
    report(what, rel_err(res[1][i], res[0][i], NULL, sizes[i]), BAND);
    free(res[0][i]), free(res[1][i]);
  }
  if (timed) {
    /* causal: half of the T x T scores; forward 2 products, backward 2.5 times that */
    const double ff = 2.0 * 2.0 * n_seq * H * hd * (double)T * T / 2, fb = 2.5 * ff;
    printf("  time %-24s fwd fp32 %8.3f ms %6.1f TFLOP/s | bf16 tc %8.3f ms %6.1f TFLOP/s | %5.1fx\n", name, tf[0],
           ff / tf[0] * 1e-9, tf[1], ff / tf[1] * 1e-9, tf[0] / tf[1]);
    printf("  time %-24s bwd fp32 %8.3f ms %6.1f TFLOP/s | bf16 tc %8.3f ms %6.1f TFLOP/s | %5.1fx\n", name, tb[0],
           fb / tb[0] * 1e-9, tb[1], fb / tb[1] * 1e-9, tb[0] / tb[1]);
  }
  free(q), free(k), free(v), free(dout), free(z);
}

/* One forward and backward on the bf16 instance only, for a kernel profiler. */
static void profile_shape(int n_seq, int T, int H, int KV, int hd) {
  const int64_t n = (int64_t)n_seq * T, nq = n * H * hd, nk = n * KV * hd;
  float *q = kc_rand(nq, stream_no++, 1), *k = kc_rand(nk, stream_no++, 1), *v = kc_rand(nk, stream_no++, 1);
  float *qd = dev_up(g16, q, nq), *kd = dev_up(g16, k, nk), *vd = dev_up(g16, v, nk), *dod = dev_up(g16, q, nq);
  float *od = dev_nan(g16, nq), *ld = dev_nan(g16, n * H), *dqd = dev_up(g16, q, nq), *dkd = dev_up(g16, k, nk),
        *dvd = dev_up(g16, v, nk);
  g16->attn_fwd(g16, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, n_seq, T, H, KV, hd, (mc_dst){od, NULL}, ld);
  g16->attn_bwd(g16, (mc_operand){qd, NULL}, (mc_operand){kd, NULL}, (mc_operand){vd, NULL}, (mc_operand){od, NULL}, ld, (mc_operand){dod, NULL}, n_seq, T, H, KV, hd, dqd, dkd, dvd);
  CHECK(g16->sync(g16) == 0, "profile: %s", mc_errmsg());
  float *dptr[] = {qd, kd, vd, dod, od, ld, dqd, dkd, dvd};
  for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) g16->free(g16, dptr[i]);
  free(q), free(k), free(v);
}
#endif

int main(int argc, char **argv) {
  if (!kc_cuda_usable()) return 0;
#ifndef MC_HAVE_CUDA
  (void)argc, (void)argv;
  return 0;
#else
  cpu = mc_backend_cpu();
  g32 = mc_backend_cuda(0);
  g16 = mc_backend_cuda_bf16(0);
  CHECK(g32 && g16, "a device exists but a backend failed: %s", mc_errmsg());
  if (!g32 || !g16) return mc_check_exit("test_cuda_attn_tc");
  if (argc > 1 && strcmp(argv[1], "--profile") == 0) {
    profile_shape(2, 2048, 16, 4, 64);
    profile_shape(2, 2048, 16, 16, 128);
    return mc_check_exit("test_cuda_attn_tc");
  }
  static const int Ts[5] = {1, 17, 64, 100, 257}, seqs[2] = {1, 3};
  for (int si = 0; si < 2; si++)
    for (int ti = 0; ti < 5; ti++) {
      attn_case(g16, seqs[si], Ts[ti], 8, 2, 64, BAND, NULL); /* GQA groups of 4 */
      attn_case(g16, seqs[si], Ts[ti], 4, 4, 128, BAND, NULL);
    }
  fp32_fallback();
  /* enough dk/dv blocks (kv heads x 64-key tiles x sequences >= 4 per multiprocessor) that
   * each walks all query heads of its group, instead of one block per query head */
  big_case("GQA n_seq=5 T=2048 H=8/4 hd=64", 5, 2048, 8, 4, 64, 0);
  if (argc > 1 && strcmp(argv[1], "--time") == 0) {
    big_case("nam-small H=16/4 hd=64", 2, 2048, 16, 4, 64, 1);
    big_case("dense-a H=16/16 hd=128", 2, 2048, 16, 16, 128, 1);
  }
  printf("worst bf16 error: %.2e (band %.0e)\n", worst, BAND);
  return mc_check_exit("test_cuda_attn_tc");
#endif
}
