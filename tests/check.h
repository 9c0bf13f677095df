/* Minimal test harness: CHECK records a failure and continues; main returns mc_check_exit(). */
#ifndef MC_TESTS_CHECK_H
#define MC_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>

static int mc_check_failures = 0;
static int mc_check_count = 0;

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    mc_check_count++;                                                         \
    if (!(cond)) {                                                            \
      mc_check_failures++;                                                    \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
    }                                                                         \
  } while (0)

#define CHECK_OK(expr)                                                                 \
  do {                                                                                 \
    int rc_ = (expr);                                                                  \
    CHECK(rc_ == 0, "%s returned %d: %s", #expr, rc_, mc_errmsg());                    \
  } while (0)

#define CHECK_CLOSE(a, b, rtol)                                                         \
  do {                                                                                  \
    double a_ = (a), b_ = (b);                                                          \
    CHECK(fabs(a_ - b_) <= (rtol) * fmax(1e-30, fmax(fabs(a_), fabs(b_))),              \
          "%s=%.9g vs %s=%.9g (rtol %g)", #a, a_, #b, b_, (double)(rtol));              \
  } while (0)

static inline int mc_check_exit(const char *name) {
  printf("%s: %d checks, %d failed\n", name, mc_check_count, mc_check_failures);
  return mc_check_failures ? 1 : 0;
}

#endif
