/* Helpers for the op tests: seeded random tensors and a central finite-difference check.
 * A backward is checked through the scalar L = sum(out * R) for a fixed random R (summed
 * in double): the analytic gradient dL/dx (the backward fed dout = R) is compared with
 * (L(x + h) - L(x - h)) / 2h element by element, in fp32 ops with double accumulation. */
#ifndef MC_TESTS_KCHECK_H
#define MC_TESTS_KCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/ops.h"
#include "tests/check.h"
#include "util/error.h"
#include "util/rng.h"

/* Agreement criterion of every gradient check: for each checked element,
 * |analytic - numeric| <= KC_ATOL + KC_RTOL * max(|analytic|, |numeric|). With step h = 1e-2
 * (1e-3 relative truncation error for smooth ops) and fp32 rounding of O(1) losses
 * (~1e-7 / h = 1e-5), these bounds leave a margin of about 10x. */
#ifndef KC_STEP
#define KC_STEP 1e-2
#endif
#define KC_RTOL 1e-2
#define KC_ATOL 2e-3

static inline float *kc_rand(int64_t n, uint64_t stream, float scale) {
  float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * mc_rng_normal(99, stream, (uint64_t)i));
  return x;
}

static inline float *kc_zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

static inline double kc_dot(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* A forward pass that returns L = sum(out * R) in double. */
typedef double (*kc_loss_fn)(void *ctx);

/* Compares grad (analytic dL/dx, n elements) with central differences of loss on x. Checks
 * every element when n <= max_check, else a spread of max_check of them. Returns the number
 * of failing elements and reports the first few. */
static inline int kc_gradcheck(const char *what, float *x, const float *grad, int64_t n,
                               kc_loss_fn loss, void *ctx, int max_check) {
  int bad = 0;
  int64_t stride = n <= max_check ? 1 : (n + max_check - 1) / max_check;
  double worst = 0.0;
  for (int64_t i = 0; i < n; i += stride) {
    float keep = x[i];
    x[i] = keep + (float)KC_STEP;
    double lp = loss(ctx);
    x[i] = keep - (float)KC_STEP;
    double lm = loss(ctx);
    x[i] = keep;
    double num = (lp - lm) / (2.0 * KC_STEP), an = grad[i];
    double err = fabs(an - num), lim = KC_ATOL + KC_RTOL * fmax(fabs(an), fabs(num));
    if (err / lim > worst) worst = err / lim;
    if (err > lim) {
      if (bad < 5)
        fprintf(stderr, "  %s[%lld]: analytic %.6g numeric %.6g\n", what, (long long)i, an, num);
      bad++;
    }
  }
  CHECK(bad == 0, "%s: %d elements outside tolerance", what, bad);
  printf("  grad %-14s %6lld elements, worst error/tolerance %.3f\n", what, (long long)n, worst);
  return bad;
}

#endif
