/* The CUDA backend's multi-tensor ops against the CPU reference:
 * - adamw_multi over 300 tensors (more than one launch's worth; empty ones, 1, 3, chunk
 *   edges 8191/8192/8193, 1025, 1<<20; per-tensor weight decay), 3 steps: weights and moments
 *   BITWISE equal to the CPU backend's adamw tensor by tensor (both sides round every
 *   operation on its own, no FMA contraction) and to the GPU's single-tensor adamw; w_copy
 *   bitwise the updated weights and w_bf16 bitwise mc_bf16_from_float of them, on buffers
 *   poisoned first (NaN, 0xffff) so every element must be written.
 * - w_bf16 of chosen values (ties, subnormals, inf, NaN, the largest float) through an update
 *   with lr = 0, which leaves the weights as they are: the device rounding is the host's.
 * - sumsq_multi against the in-order sum of the CPU sumsq results, 1e-12 relative, repeated
 *   calls identical (fixed order), and bad input reported by sync.
 * Without a CUDA build or a GPU it prints "SKIP: no CUDA device" and passes.
 * `test_cuda_multi --time`: nam-small's 103 parameter tensors (shapes from `mcplan --config
 * configs/nam-small.json`), the optimizer step as it was (sumsq per tensor, each returning to
 * the host; adamw per tensor; a copy per tensor into the working weights) against the fused
 * ops (sumsq_multi; adamw_multi writing the working copy), median ms of several runs. */
#include <string.h>
#include <time.h>

#include "kernels/bf16.h"
#include "tests/kernels/cudacheck.h"
#include "tests/kernels/kcheck.h"
#ifdef MC_HAVE_CUDA
#include "kernels/backend_cuda.h"

static mc_backend *cpu, *gpu;

static void *dalloc(size_t bytes) {
  void *p = gpu->alloc(gpu, bytes ? bytes : 4);
  if (!p) {
    fprintf(stderr, "device allocation of %zu bytes failed: %s\n", bytes, mc_errmsg());
    exit(1);
  }
  return p;
}

static float *up(const float *x, int64_t n) {
  float *d = dalloc((size_t)n * sizeof(float));
  gpu->from_host(gpu, d, x, (size_t)n * sizeof(float));
  return d;
}

static void down(void *host, const void *dev, size_t bytes) {
  gpu->to_host(gpu, host, dev, bytes);
  CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
}

/* Distance in units in the last place between two floats of the same sign (for the report). */
static int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* ------------------------------------------------------------------ adamw_multi */
#define NT 300
static int64_t size_of(int i) {
  static const int64_t cyc[] = {0, 1, 3, 1025, 8191, 8192, 8193, 33, 4097, 0, 257};
  if (i == 17 || i == 250) return 1 << 20;
  return cyc[i % (int)(sizeof cyc / sizeof cyc[0])];
}

static void test_adamw_multi(void) {
  static float *hw[NT], *hm[NT], *hv[NT], *hg[NT];             /* CPU reference states */
  static float *dw[NT], *dm[NT], *dv[NT], *dg[NT], *dc[NT];    /* GPU, multi */
  static float *sw[NT], *sm[NT], *sv[NT];                      /* GPU, single-tensor adamw */
  static mc_bf16 *db[NT];
  mc_adamw_tensor t[NT];
  int64_t total = 0;
  for (int i = 0; i < NT; i++) {
    int64_t n = size_of(i);
    total += n;
    hw[i] = kc_rand(n, 1000 + i, 1.0f), hg[i] = kc_rand(n, 2000 + i, 0.1f);
    hm[i] = kc_rand(n, 3000 + i, 0.01f), hv[i] = kc_rand(n, 4000 + i, 0.01f);
    for (int64_t j = 0; j < n; j++) hv[i][j] *= hv[i][j];
    dw[i] = up(hw[i], n), dm[i] = up(hm[i], n), dv[i] = up(hv[i], n), dg[i] = up(hg[i], n);
    sw[i] = up(hw[i], n), sm[i] = up(hm[i], n), sv[i] = up(hv[i], n);
    dc[i] = dalloc((size_t)n * sizeof(float));
    db[i] = dalloc((size_t)n * sizeof(mc_bf16));
    gpu->fill(gpu, dc[i], n, NAN);
    float *poison = malloc((size_t)(n + 1) * sizeof(mc_bf16));
    memset(poison, 0xff, (size_t)n * sizeof(mc_bf16));
    gpu->from_host(gpu, db[i], poison, (size_t)n * sizeof(mc_bf16));
    free(poison);
    /* copies on most tensors, bf16 on most, both on some, neither on a few */
    t[i] = (mc_adamw_tensor){dw[i], dg[i], dm[i], dv[i], n, (i % 2) ? 0.1f : 0.0f, (i % 4 != 3) ? dc[i] : NULL,
                             (i % 5 != 2) ? db[i] : NULL};
  }
  for (int64_t step = 1; step <= 3; step++) {
    mc_adamw_args a = {3e-3f, 0.9f, 0.95f, 1e-8f, 777.0f /* ignored */, step, 0.7f};
    gpu->adamw_multi(gpu, t, NT, &a);
    for (int i = 0; i < NT; i++) {
      mc_adamw_args ai = a;
      ai.weight_decay = t[i].weight_decay;
      cpu->adamw(cpu, hw[i], hg[i], hm[i], hv[i], size_of(i), &ai);
      gpu->adamw(gpu, sw[i], dg[i], sm[i], sv[i], size_of(i), &ai);
    }
  }
  CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
  int64_t diff_cpu = 0, diff_single = 0, bad_copy = 0, bad_bf16 = 0, max_ulp = 0, moved = 0;
  for (int i = 0; i < NT; i++) {
    int64_t n = size_of(i);
    float *g3[3], *s3[3], *c = malloc((size_t)(n + 1) * sizeof(float));
    mc_bf16 *b = malloc((size_t)(n + 1) * sizeof(mc_bf16));
    float *dev3[3] = {dw[i], dm[i], dv[i]}, *sdev3[3] = {sw[i], sm[i], sv[i]}, *h3[3] = {hw[i], hm[i], hv[i]};
    for (int k = 0; k < 3; k++) {
      g3[k] = malloc((size_t)(n + 1) * sizeof(float)), s3[k] = malloc((size_t)(n + 1) * sizeof(float));
      down(g3[k], dev3[k], (size_t)n * sizeof(float));
      down(s3[k], sdev3[k], (size_t)n * sizeof(float));
      for (int64_t j = 0; j < n; j++) {
        diff_cpu += memcmp(&g3[k][j], &h3[k][j], 4) != 0;
        diff_single += memcmp(&g3[k][j], &s3[k][j], 4) != 0;
        int64_t u = ulps(g3[k][j], h3[k][j]);
        if (u > max_ulp) max_ulp = u;
      }
    }
    float *w0 = kc_rand(n, 1000 + i, 1.0f);
    for (int64_t j = 0; j < n; j++) moved += g3[0][j] != w0[j];
    free(w0);
    if (t[i].w_copy) {
      down(c, dc[i], (size_t)n * sizeof(float));
      for (int64_t j = 0; j < n; j++) bad_copy += memcmp(&c[j], &g3[0][j], 4) != 0;
    }
    if (t[i].w_bf16) {
      down(b, db[i], (size_t)n * sizeof(mc_bf16));
      for (int64_t j = 0; j < n; j++) bad_bf16 += b[j] != mc_bf16_from_float(g3[0][j]);
    }
    for (int k = 0; k < 3; k++) free(g3[k]), free(s3[k]);
    free(c), free(b);
  }
  /* a weight whose update is under half its ulp (mhat near 0, no decay) keeps its value: a
   * handful of the 2.9M (5 seen); most must move, or the equalities above prove nothing */
  CHECK(moved >= total - total / 10000, "%lld of %lld weights did not move", (long long)(total - moved),
        (long long)total);
  CHECK(diff_cpu == 0, "adamw_multi vs CPU adamw: %lld of %lld values differ (max %lld ulp)", (long long)diff_cpu,
        (long long)(3 * total), (long long)max_ulp);
  CHECK(diff_single == 0, "adamw_multi vs GPU adamw: %lld values differ", (long long)diff_single);
  CHECK(bad_copy == 0, "w_copy: %lld elements are not the updated weights", (long long)bad_copy);
  CHECK(bad_bf16 == 0, "w_bf16: %lld elements differ from mc_bf16_from_float", (long long)bad_bf16);
  printf("  adamw_multi  %d tensors, %lld elements, 3 steps: vs CPU adamw %lld differing (max %lld ulp), "
         "vs GPU adamw %lld, w_copy %lld, w_bf16 %lld  %s\n",
         NT, (long long)total, (long long)diff_cpu, (long long)max_ulp, (long long)diff_single, (long long)bad_copy,
         (long long)bad_bf16, diff_cpu + diff_single + bad_copy + bad_bf16 == 0 ? "ok" : "FAIL");

  /* sumsq_multi over the same 300 gradients (several launches, empty tensors) */
  const float *xs[NT];
  int64_t ns[NT];
  double ref = 0.0;
  for (int i = 0; i < NT; i++) xs[i] = dg[i], ns[i] = size_of(i), ref += cpu->sumsq(cpu, hg[i], ns[i]);
  double s1 = gpu->sumsq_multi(gpu, xs, ns, NT), s2 = gpu->sumsq_multi(gpu, xs, ns, NT);
  double rel = fabs(s1 - ref) / ref;
  CHECK(rel <= 1e-12, "sumsq_multi %.17g vs CPU %.17g (rel %.2e)", s1, ref, rel);
  CHECK(s1 == s2, "sumsq_multi not repeatable: %.17g then %.17g", s1, s2);
  /* one tensor of 1<<20: a single launch, every block one chunk */
  double one = gpu->sumsq_multi(gpu, &xs[17], &ns[17], 1), one_ref = cpu->sumsq(cpu, hg[17], ns[17]);
  CHECK(fabs(one - one_ref) <= 1e-12 * one_ref, "sumsq_multi of one tensor %.17g vs %.17g", one, one_ref);
  CHECK(gpu->sumsq_multi(gpu, xs, ns, 0) == 0.0 && gpu->sumsq_multi(gpu, xs, ns, 1) == 0.0, "empty sumsq_multi");
  CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
  printf("  sumsq_multi  %d tensors: rel %.2e vs CPU (tol 1e-12), repeat identical %s\n", NT, rel,
         rel <= 1e-12 && s1 == s2 ? "ok" : "FAIL");

  gpu->adamw_multi(gpu, t, -3, &(mc_adamw_args){0});
  CHECK(gpu->sync(gpu) != 0, "adamw_multi with count -3 was accepted");
  gpu->sumsq_multi(gpu, xs, (int64_t[]){-1}, 1);
  CHECK(gpu->sync(gpu) != 0, "sumsq_multi with a negative size was accepted");

  for (int i = 0; i < NT; i++) {
    free(hw[i]), free(hm[i]), free(hv[i]), free(hg[i]);
    float *d[] = {dw[i], dm[i], dv[i], dg[i], dc[i], sw[i], sm[i], sv[i]};
    for (int k = 0; k < 8; k++) gpu->free(gpu, d[k]);
    gpu->free(gpu, db[i]);
  }
}

/* ------------------------------------------------------------------ bf16 rounding on the device */
static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_bf16_values(void) {
  static const uint32_t bits[] = {
      0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf818000u, 0xbf808000u,
      0x3fffffffu, 0x7f7fffffu, 0x7f7f7fffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
      0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0x00000000u, 0x00000001u, 0x00008000u, 0x00018000u,
      0x0000c000u, 0x007fffffu, 0x80010000u, 0x80018000u, 0x00800000u, 0x00808000u, 0x4049fdb0u};
  enum { NB = sizeof bits / sizeof bits[0], N = NB + 4096 };
  float *w = malloc(N * sizeof(float));
  for (int i = 0; i < NB; i++) w[i] = from_bits(bits[i]);
  /* and 4096 random patterns with a tie or near-tie below the kept half */
  for (int i = NB; i < N; i++) {
    uint32_t hi = (uint32_t)(mc_rng_below(7, 1, (uint64_t)i, 0x7f80u)) ^ (i & 1 ? 0x8000u : 0u);
    uint32_t lo = (uint32_t[]){0x8000u, 0x7fffu, 0x8001u, 0x0000u}[i % 4];
    w[i] = from_bits(hi << 16 | lo);
  }
  float *g = kc_rand(N, 77, 0.1f), *m = kc_rand(N, 78, 0.01f), *v = kc_rand(N, 79, 0.01f);
  for (int i = 0; i < N; i++) v[i] *= v[i];
  float *dw = up(w, N), *dg = up(g, N), *dm = up(m, N), *dv = up(v, N);
  mc_bf16 *db = dalloc(N * sizeof(mc_bf16));
  mc_adamw_tensor t = {dw, dg, dm, dv, N, 0.1f, NULL, db};
  mc_adamw_args a = {0.0f /* lr 0: w * 1 - 0 */, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
  gpu->adamw_multi(gpu, &t, 1, &a);
  float *wo = malloc(N * sizeof(float));
  mc_bf16 *b = malloc(N * sizeof(mc_bf16));
  down(wo, dw, N * sizeof(float));
  down(b, db, N * sizeof(mc_bf16));
  int bad = 0, kept = 0;
  for (int i = 0; i < N; i++) {
    kept += memcmp(&wo[i], &w[i], 4) == 0 || (isnan(wo[i]) && isnan(w[i])) || (wo[i] == 0 && w[i] == 0);
    if (b[i] != mc_bf16_from_float(wo[i])) {
      if (bad++ < 5) fprintf(stderr, "  bf16 of 0x%08x: device 0x%04x, host 0x%04x\n", bits[i < NB ? i : 0], b[i],
                             mc_bf16_from_float(wo[i]));
    }
  }
  CHECK(kept == N, "lr 0 changed %d weights", N - kept);
  CHECK(bad == 0, "%d bf16 values differ from mc_bf16_from_float", bad);
  printf("  w_bf16       %d chosen values + 4096 near-ties: device == host rounding %s\n", NB, bad ? "FAIL" : "ok");
  gpu->free(gpu, dw), gpu->free(gpu, dg), gpu->free(gpu, dm), gpu->free(gpu, dv), gpu->free(gpu, db);
  free(w), free(g), free(m), free(v), free(wo), free(b);
}

/* ------------------------------------------------------------------ --time: nam-small's tensors */
/* Element counts of nam-small's 103 parameter tensors in family order, from `mcplan --config
 * configs/nam-small.json` (world 1: every tensor whole); 351,336,608 elements. */
static const int64_t nam_small[] = {
    33554432, 1024, 1048576, 262144, 262144, 1048576, 1024, 8192, 16777216, 16777216, 16777216, 1024,
    2097152, 2097152, 32768, 65536, 65536, 8192, 2048, 256, 64, 256, 64, 32, 32, 32, 2048, 2097152,
    1024, 8192, 16777216, 16777216, 16777216, 1024, 1048576, 262144, 262144, 1048576, 1024, 8192,
    16777216, 16777216, 16777216, 1024, 2097152, 2097152, 32768, 65536, 65536, 8192, 2048, 256, 64,
    256, 64, 32, 32, 32, 2048, 2097152, 1024, 8192, 16777216, 16777216, 16777216, 1024, 1048576,
    262144, 262144, 1048576, 1024, 8192, 16777216, 16777216, 16777216, 1024, 2097152, 2097152, 32768,
    65536, 65536, 8192, 2048, 256, 64, 256, 64, 32, 32, 32, 2048, 2097152, 1024, 1048576, 1048576,
    1048576, 1048576, 1024, 1024, 1024, 1048576, 1024, 33554432};
#define NS ((int)(sizeof nam_small / sizeof nam_small[0]))

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Fills n floats from a 1M random block (values, not zeros; `sq` squares them). */
static void fill_rand(float *d, int64_t n, uint64_t stream, float scale, int sq) {
  enum { B = 1 << 20 };
  float *h = kc_rand(B, stream, scale);
  if (sq)
    for (int i = 0; i < B; i++) h[i] *= h[i];
  for (int64_t o = 0; o < n; o += B) gpu->from_host(gpu, d + o, h, (size_t)(n - o < B ? n - o : B) * sizeof(float));
  CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
  free(h);
}

enum { V_OLD, V_NEW, V_ADAMW_LOOP, V_ADAMW_MULTI, V_SUMSQ_LOOP, V_SUMSQ_MULTI, V_MULTI_BF16, V_COPY, V_COUNT };
static const char *v_name[V_COUNT] = {
    "before: sumsq x103 (103 syncs) + adamw x103 + copy x103",
    "after: sumsq_multi (1 sync) + adamw_multi with w_copy",
    "adamw x103 alone",
    "adamw_multi alone (no copies)",
    "sumsq x103 (103 syncs)",
    "sumsq_multi (1 sync)",
    "adamw_multi with w_bf16 (bf16 copy) instead of w_copy",
    "one device copy of all 351M floats (the bandwidth ceiling)",
};

static void run_time(void) {
  int64_t total = 0, off[NS];
  for (int i = 0; i < NS; i++) off[i] = total, total += nam_small[i];
  printf("\n--time: nam-small, %d tensors, %lld elements (%.2f GB per fp32 array)\n", NS, (long long)total,
         total * 4e-9);
  float *w = dalloc(total * 4), *g = dalloc(total * 4), *m = dalloc(total * 4), *v = dalloc(total * 4);
  float *wc = dalloc(total * 4);
  mc_bf16 *wb = dalloc(total * 2);
  fill_rand(w, total, 11, 0.02f, 0), fill_rand(g, total, 12, 1e-3f, 0);
  fill_rand(m, total, 13, 1e-4f, 0), fill_rand(v, total, 14, 1e-4f, 1);
  mc_adamw_tensor t[NS], tb[NS];
  const float *xs[NS];
  int64_t ns[NS];
  for (int i = 0; i < NS; i++) {
    int64_t o = off[i];
    float wd = nam_small[i] >= 8192 ? 0.1f : 0.0f;
    t[i] = (mc_adamw_tensor){w + o, g + o, m + o, v + o, nam_small[i], wd, wc + o, NULL};
    tb[i] = (mc_adamw_tensor){w + o, g + o, m + o, v + o, nam_small[i], wd, NULL, wb + o};
    xs[i] = g + o, ns[i] = nam_small[i];
  }
  enum { REPS = 15, WARM = 3 };
  /* every variant timed twice, in two rounds over the list: the spread between rounds is
   * the noise to judge differences by */
  double med[2][V_COUNT], lo[V_COUNT], hi[V_COUNT], sink = 0;
  int64_t step = 1;
  for (int pass = 0; pass < 2; pass++) {
    for (int var = 0; var < V_COUNT; var++) {
      double ms[REPS];
      for (int r = -WARM; r < REPS; r++) {
        mc_adamw_args a = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step++, 0.9f};
        CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
        double t0 = now_ms();
        if (var == V_OLD || var == V_SUMSQ_LOOP)
          for (int i = 0; i < NS; i++) sink += gpu->sumsq(gpu, xs[i], ns[i]);
        if (var == V_NEW || var == V_SUMSQ_MULTI) sink += gpu->sumsq_multi(gpu, xs, ns, NS);
        if (var == V_OLD || var == V_ADAMW_LOOP)
          for (int i = 0; i < NS; i++) {
            a.weight_decay = t[i].weight_decay;
            gpu->adamw(gpu, t[i].w, t[i].g, t[i].m, t[i].v, t[i].n, &a);
          }
        if (var == V_OLD)
          for (int i = 0; i < NS; i++) gpu->copy(gpu, t[i].w_copy, t[i].w, t[i].n);
        if (var == V_NEW) gpu->adamw_multi(gpu, t, NS, &a);
        if (var == V_ADAMW_MULTI) {
          mc_adamw_tensor bare[NS];
          for (int i = 0; i < NS; i++) bare[i] = t[i], bare[i].w_copy = NULL;
          gpu->adamw_multi(gpu, bare, NS, &a);
        }
        if (var == V_MULTI_BF16) gpu->adamw_multi(gpu, tb, NS, &a);
        if (var == V_COPY) gpu->copy(gpu, wc, w, total);
        CHECK(gpu->sync(gpu) == 0, "sync: %s", mc_errmsg());
        if (r >= 0) ms[r] = now_ms() - t0;
      }
      qsort(ms, REPS, sizeof ms[0], cmp_d);
      med[pass][var] = ms[REPS / 2];
      if (pass == 0 || ms[0] < lo[var]) lo[var] = ms[0];
      if (pass == 0 || ms[REPS - 1] > hi[var]) hi[var] = ms[REPS - 1];
    }
  }
  CHECK(isfinite(sink), "the gradient sums are not finite");
  /* bytes each variant must move at least: adamw reads w g m v and writes w m v (28 B per
   * element), a separate copy 8 B, a fused fp32 copy 4 B, a fused bf16 copy 2 B, sumsq 4 B */
  const double bytes[V_COUNT] = {40, 36, 28, 28, 4, 4, 30, 8};
  printf("%-58s %8s %8s %8s %8s %7s\n", "variant (median of 15 after 3 warm-ups, host clock, synced)", "ms run1",
         "ms run2", "min", "max", "GB/s");
  for (int var = 0; var < V_COUNT; var++)
    printf("%-58s %8.3f %8.3f %8.3f %8.3f %7.0f\n", v_name[var], med[0][var], med[1][var], lo[var], hi[var],
           bytes[var] * total / (med[1][var] * 1e6));
  printf("optimizer step at nam-small: %.3f / %.3f ms before, %.3f / %.3f ms after (%.2fx)\n", med[0][V_OLD],
         med[1][V_OLD], med[0][V_NEW], med[1][V_NEW], (med[0][V_OLD] + med[1][V_OLD]) / (med[0][V_NEW] + med[1][V_NEW]));
  gpu->free(gpu, w), gpu->free(gpu, g), gpu->free(gpu, m), gpu->free(gpu, v), gpu->free(gpu, wc), gpu->free(gpu, wb);
}
#endif

int main(int argc, char **argv) {
  if (!kc_cuda_usable()) return 0;
#ifndef MC_HAVE_CUDA
  (void)argc, (void)argv;
  return 0;
#else
  cpu = mc_backend_cpu();
  gpu = mc_backend_cuda(0);
  CHECK(gpu != NULL, "a device exists but the backend failed: %s", mc_errmsg());
  if (!gpu) return mc_check_exit("test_cuda_multi");
  test_adamw_multi();
  test_bf16_values();
  if (argc > 1 && strcmp(argv[1], "--time") == 0) run_time();
  return mc_check_exit("test_cuda_multi");
#endif
}
