/* The CPU backend's multi-tensor ops against its single-tensor ones, bit for bit:
 * adamw_multi over many tensors (empty, 1, 3, 1025, large enough for the threaded path, each
 * with its own weight decay) gives the weights and moments of adamw tensor by tensor, its
 * w_copy equals the updated weights and its w_bf16 their mc_bf16_from_float; sumsq_multi
 * equals the per-tensor sumsq results summed in order. Then mc_bf16_from_float on chosen
 * values: ties both ways, carries into the exponent, overflow to inf, inf, NaN, subnormals. */
#include <string.h>

#include "kernels/bf16.h"
#include "tests/kernels/kcheck.h"

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static float *dup(const float *x, int64_t n) {
  float *y = malloc((size_t)(n ? n : 1) * sizeof(float));
  memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}

#define NT 7
static void test_adamw_multi(void) {
  mc_backend *be = mc_backend_cpu();
  /* 5M > MC_CPU_PAR_MIN: the threaded loop too */
  const int64_t sizes[NT] = {0, 1, 3, 1025, 4096, 0, 5000000};
  float *w[NT], *g[NT], *m[NT], *v[NT], *w1[NT], *m1[NT], *v1[NT], *wc[NT];
  mc_bf16 *wb[NT];
  mc_adamw_tensor t[NT];
  float first[NT];
  for (int i = 0; i < NT; i++) {
    int64_t n = sizes[i];
    w[i] = kc_rand(n, 100 + i, 1.0f), g[i] = kc_rand(n, 200 + i, 0.1f);
    m[i] = kc_rand(n, 300 + i, 0.01f), v[i] = kc_rand(n, 400 + i, 0.01f);
    for (int64_t j = 0; j < n; j++) v[i][j] = v[i][j] * v[i][j]; /* second moments are >= 0 */
    first[i] = n ? w[i][0] : 0.0f;
    w1[i] = dup(w[i], n), m1[i] = dup(m[i], n), v1[i] = dup(v[i], n);
    wc[i] = kc_rand(n, 500 + i, 1.0f); /* overwritten: must not equal the old values */
    wb[i] = calloc((size_t)(n ? n : 1), sizeof(mc_bf16));
    t[i] = (mc_adamw_tensor){w[i], g[i], m[i], v[i], n, (i % 2) ? 0.1f : 0.0f, (i % 3) ? wc[i] : NULL,
                             (i % 3 != 1) ? wb[i] : NULL};
  }
  for (int64_t step = 1; step <= 3; step++) {
    mc_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 12345.0f /* ignored by adamw_multi */, step, 0.5f};
    be->adamw_multi(be, t, NT, &a);
    for (int i = 0; i < NT; i++) {
      mc_adamw_args ai = a;
      ai.weight_decay = t[i].weight_decay;
      be->adamw(be, w1[i], g[i], m1[i], v1[i], sizes[i], &ai);
    }
  }
  CHECK(be->sync(be) == 0, "sync: %s", mc_errmsg());
  for (int i = 0; i < NT; i++) {
    size_t b = (size_t)sizes[i] * sizeof(float);
    CHECK(same_bits(w[i], w1[i], b), "tensor %d (n %lld): w differs from adamw", i, (long long)sizes[i]);
    CHECK(same_bits(m[i], m1[i], b), "tensor %d: m differs from adamw", i);
    CHECK(same_bits(v[i], v1[i], b), "tensor %d: v differs from adamw", i);
    if (t[i].w_copy) CHECK(same_bits(wc[i], w[i], b), "tensor %d: w_copy is not the updated w", i);
    if (t[i].w_bf16) {
      int64_t bad = 0;
      for (int64_t j = 0; j < sizes[i]; j++) bad += wb[i][j] != mc_bf16_from_float(w[i][j]);
      CHECK(bad == 0, "tensor %d: %lld bf16 copies differ from mc_bf16_from_float", i, (long long)bad);
    }
    /* the update moved the weights (so equality above is not two untouched copies) */
    if (sizes[i] > 0) CHECK(w[i][0] != first[i], "tensor %d: w[0] did not change", i);
  }
  printf("  adamw_multi: %d tensors x 3 steps bitwise equal to adamw; copies checked\n", NT);

  /* sumsq_multi: the in-order sum of the single results, exactly (the empty ones included) */
  const float *xs[NT];
  double ref = 0.0;
  for (int i = 0; i < NT; i++) xs[i] = g[i], ref += be->sumsq(be, g[i], sizes[i]);
  double got = be->sumsq_multi(be, xs, sizes, NT);
  CHECK(got == ref && ref > 0, "sumsq_multi %.17g vs per-tensor %.17g", got, ref);
  CHECK(be->sumsq_multi(be, xs, sizes, 0) == 0.0, "sumsq_multi of no tensors");
  printf("  sumsq_multi %.17g == per-tensor sum\n", got);

  /* bad input is reported by sync */
  be->adamw_multi(be, t, -1, &(mc_adamw_args){0});
  CHECK(be->sync(be) != 0, "adamw_multi with count -1 was accepted");
  for (int i = 0; i < NT; i++) free(w[i]), free(g[i]), free(m[i]), free(v[i]), free(w1[i]), free(m1[i]), free(v1[i]), free(wc[i]), free(wb[i]);
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_bf16(void) {
  struct { uint32_t in; uint16_t out; const char *what; } c[] = {
      {0x3f800000u, 0x3f80, "1.0 exact"},
      {0x3f808000u, 0x3f80, "tie, even below: down"},
      {0x3f818000u, 0x3f82, "tie, odd below: up"},
      {0x3f808001u, 0x3f81, "just above the tie: up"},
      {0x3f807fffu, 0x3f80, "just below the tie: down"},
      {0xbf818000u, 0xbf82, "negative tie, odd: away from zero"},
      {0x3fffffffu, 0x4000, "carry into the exponent"},
      {0x7f7fffffu, 0x7f80, "largest float rounds to inf"},
      {0x7f7f7fffu, 0x7f7f, "largest bf16 stays"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7fc00000u, 0x7fff, "quiet NaN: canonical"},
      {0xffc00001u, 0x7fff, "negative NaN with payload: canonical"},
      {0x7f800001u, 0x7fff, "signalling NaN (payload in the dropped bits): canonical"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x00000001u, 0x0000, "smallest subnormal: to +0"},
      {0x00008000u, 0x0000, "subnormal tie, even: down to 0"},
      {0x00018000u, 0x0002, "subnormal tie, odd: up"},
      {0x0000c000u, 0x0001, "subnormal above the tie: up"},
      {0x007fffffu, 0x0080, "largest subnormal: up to the smallest normal"},
      {0x80010000u, 0x8001, "negative subnormal exact"},
  };
  int n = (int)(sizeof c / sizeof c[0]);
  for (int i = 0; i < n; i++) {
    mc_bf16 h = mc_bf16_from_float(from_bits(c[i].in));
    CHECK(h == c[i].out, "%s: 0x%08x -> 0x%04x, want 0x%04x", c[i].what, c[i].in, h, c[i].out);
  }
  /* NaN stays NaN on the way back; finite bf16 round-trips exactly */
  CHECK(isnan(mc_bf16_to_float(mc_bf16_from_float(from_bits(0xffc00001u)))), "NaN round trip");
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    float f = mc_bf16_to_float((mc_bf16)h);
    if (!isnan(f) && mc_bf16_from_float(f) != h) bad++;
  }
  CHECK(bad == 0, "%d non-NaN bf16 values do not round-trip", bad);
  printf("  bf16: %d rounding cases, all 65536 patterns round-trip\n", n);
}

int main(void) {
  test_adamw_multi();
  test_bf16();
  return mc_check_exit("test_ops_multi");
}
