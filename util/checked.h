/* Checked integer arithmetic for sizes computed from input (configs, manifests, token files):
 * docs/reliability.md, issue 17 item 9. The checked forms return 0 and store the result, or
 * -1 on overflow (and store nothing); the caller refuses the input, naming the key. The
 * saturating forms stop at INT64_MAX (at INT64_MIN below), for sums of sizes that validation
 * has already bounded: an allocation of INT64_MAX bytes fails cleanly where a wrapped size
 * would have been small. */
#ifndef MC_UTIL_CHECKED_H
#define MC_UTIL_CHECKED_H

#include <stdint.h>

static inline int mc_mul_i64(int64_t a, int64_t b, int64_t *out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return -1;
  *out = r;
  return 0;
}

static inline int mc_add_i64(int64_t a, int64_t b, int64_t *out) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return -1;
  *out = r;
  return 0;
}

/* a * b * c, checked at each step. */
static inline int mc_mul3_i64(int64_t a, int64_t b, int64_t c, int64_t *out) {
  int64_t r;
  if (mc_mul_i64(a, b, &r) || mc_mul_i64(r, c, &r)) return -1;
  *out = r;
  return 0;
}

static inline int64_t mc_mul_sat_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
  return r;
}

static inline int64_t mc_add_sat_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return a < 0 ? INT64_MIN : INT64_MAX;
  return r;
}

#endif
