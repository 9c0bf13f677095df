/* core/dtype.h brute force: every bit pattern of bfloat16, float16, float8_e4m3 and
 * float8_e5m2 widens to the value its fields say (computed here in double) and narrows back to
 * itself; narrowing is checked against an independent oracle (nearest of all the format's
 * values, ties to the even pattern, the overflow rule of the format) at every midpoint between
 * neighbours, one fp32 ulp either side of it, and at random fp32 bit patterns; saturation,
 * infinities, NaN and the byte order of the array conversions. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "tests/check.h"

typedef struct {
  const char *name;
  int dt, ebits, mbits, ieee;
  uint32_t (*narrow)(float);
  float (*widen)(uint32_t);
} fmt;

static uint32_t n_bf16(float f) { return mc_bf16_of_f32(f); }
static float w_bf16(uint32_t b) { return mc_f32_of_bf16((uint16_t)b); }
static uint32_t n_f16(float f) { return mc_f16_of_f32(f); }
static float w_f16(uint32_t b) { return mc_f32_of_f16((uint16_t)b); }
static uint32_t n_e4m3(float f) { return mc_e4m3_of_f32(f); }
static float w_e4m3(uint32_t b) { return mc_f32_of_e4m3((uint8_t)b); }
static uint32_t n_e5m2(float f) { return mc_e5m2_of_f32(f); }
static float w_e5m2(uint32_t b) { return mc_f32_of_e5m2((uint8_t)b); }

static const fmt FMTS[4] = {
    {"bfloat16", MC_ELEM_BF16, 8, 7, 1, n_bf16, w_bf16},
    {"float16", MC_ELEM_F16, 5, 10, 1, n_f16, w_f16},
    {"float8_e4m3", MC_ELEM_F8_E4M3, 4, 3, 0, n_e4m3, w_e4m3},
    {"float8_e5m2", MC_ELEM_F8_E5M2, 5, 2, 1, n_e5m2, w_e5m2},
};

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The value of pattern b as its fields define it, in double; NaN for NaN patterns. */
static double field_value(const fmt *F, uint32_t b) {
  uint32_t n = (uint32_t)(F->ebits + F->mbits), s = (b >> n) & 1, e = (b >> F->mbits) & ((1u << F->ebits) - 1);
  uint32_t m = b & ((1u << F->mbits) - 1), emax = (1u << F->ebits) - 1;
  int bias = (1 << (F->ebits - 1)) - 1;
  double v;
  if (e == emax && F->ieee) v = m ? NAN : INFINITY;
  else if (e == emax && m == (1u << F->mbits) - 1) v = NAN;
  else if (e == 0) v = ldexp((double)m, 1 - bias - F->mbits);
  else v = ldexp(1.0 + ldexp((double)m, -F->mbits), (int)e - bias);
  return s ? -v : v;
}

/* The non-negative finite patterns in increasing value, and the overflow rule, for the oracle. */
typedef struct {
  uint32_t pat[1 << 15];
  double val[1 << 15];
  int n;
  double beyond; /* ieee: the value the next pattern after the largest would have (ties at the
                  * midpoint go to it: the largest has an odd mantissa), i.e. infinity */
} table;

static void build(const fmt *F, table *t) {
  t->n = 0;
  uint32_t half = 1u << (F->ebits + F->mbits);
  for (uint32_t b = 0; b < half; b++) {
    double v = field_value(F, b);
    if (isfinite(v)) t->pat[t->n] = b, t->val[t->n] = v, t->n++;
  }
  int bias = (1 << (F->ebits - 1)) - 1;
  int emax_normal = F->ieee ? (1 << F->ebits) - 2 : (1 << F->ebits) - 1;
  t->beyond = ldexp(1.0, emax_normal - bias + 1);
}

/* Round-to-nearest-even by search over the table (the values increase with the pattern). */
static uint32_t oracle(const fmt *F, const table *t, float f) {
  uint32_t sign = (bits(f) >> 31) << (F->ebits + F->mbits);
  double x = fabs((double)f);
  const double top = t->val[t->n - 1];
  if (x > top) {
    if (!F->ieee) return sign | t->pat[t->n - 1]; /* E4M3 saturates, infinity included */
    double mid = (top + t->beyond) / 2;
    uint32_t inf = ((1u << F->ebits) - 1) << F->mbits;
    return sign | (x >= mid ? inf : t->pat[t->n - 1]);
  }
  int lo = 0, hi = t->n - 1; /* val[lo] <= x <= val[hi] */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (t->val[mid] <= x) lo = mid;
    else hi = mid;
  }
  double dl = x - t->val[lo], dh = t->val[hi] - x;
  int pick = dl < dh ? lo : dh < dl ? hi : ((t->pat[lo] & 1) ? hi : lo);
  return sign | t->pat[pick];
}

static table TAB;

static void check_format(const fmt *F) {
  build(F, &TAB);
  uint32_t n = 1u << (F->ebits + F->mbits + 1);
  int bad_widen = 0, bad_trip = 0;
  for (uint32_t b = 0; b < n; b++) {
    float w = F->widen(b);
    double v = field_value(F, b);
    if (isnan(v) ? !isnan(w) || (bits(w) >> 31) != (b >> (F->ebits + F->mbits)) : (double)w != v || !signbit(w) != !signbit(v))
      bad_widen++;
    if (F->narrow(w) != b) bad_trip++;
  }
  CHECK(bad_widen == 0, "%s: %d patterns widen to another value than their fields say", F->name, bad_widen);
  CHECK(bad_trip == 0, "%s: %d patterns do not survive widening and narrowing back", F->name, bad_trip);

  /* every midpoint between neighbours (a tie), and one fp32 ulp below and above it */
  int bad_tie = 0, bad_near = 0, ties = 0;
  for (int i = 0; i + 1 < TAB.n; i++) {
    double mid = (TAB.val[i] + TAB.val[i + 1]) / 2;
    float fm = (float)mid;
    if ((double)fm != mid) continue; /* not an fp32 value (none here, but say so) */
    ties++;
    uint32_t even = (TAB.pat[i] & 1) ? TAB.pat[i + 1] : TAB.pat[i];
    if (F->narrow(fm) != even || F->narrow(-fm) != (even | 1u << (F->ebits + F->mbits))) bad_tie++;
    if (F->narrow(nextafterf(fm, 0.0f)) != TAB.pat[i] || F->narrow(nextafterf(fm, INFINITY)) != TAB.pat[i + 1]) bad_near++;
  }
  CHECK(ties == TAB.n - 1, "%s: %d of %d midpoints are fp32 values", F->name, ties, TAB.n - 1);
  CHECK(bad_tie == 0, "%s: %d ties not rounded to the even pattern", F->name, bad_tie);
  CHECK(bad_near == 0, "%s: %d values beside a tie rounded the wrong way", F->name, bad_near);

  /* random fp32 bit patterns (every exponent alike), against the oracle */
  uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)F->dt;
  int bad_rand = 0;
  for (int i = 0; i < 1 << 20; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float f = of_bits((uint32_t)(x >> 16));
    if (isnan(f)) continue;
    if (F->narrow(f) != oracle(F, &TAB, f)) bad_rand++;
  }
  CHECK(bad_rand == 0, "%s: %d random fp32 values narrowed unlike the oracle", F->name, bad_rand);

  /* NaN stays NaN, sign kept */
  uint32_t nan_pos = F->narrow(of_bits(0x7f800001u)), nan_neg = F->narrow(of_bits(0xffc00000u));
  CHECK(isnan(F->widen(nan_pos)) && isnan(F->widen(nan_neg)) && signbit(F->widen(nan_neg)) && !signbit(F->widen(nan_pos)),
        "%s: NaN narrows to %#x and %#x", F->name, nan_pos, nan_neg);
}

int main(void) {
  for (int i = 0; i < 4; i++) check_format(&FMTS[i]);

  /* the vocabulary */
  for (int dt = 0; dt < MC_N_ELEM_DTYPES; dt++)
    CHECK(mc_elem_dtype_parse(mc_elem_dtype_name(dt)) == dt, "name of %d does not parse back", dt);
  CHECK(mc_elem_dtype_parse("bf16") == -1 && mc_elem_dtype_parse("float64") == -1 && mc_elem_dtype_parse(NULL) == -1,
        "unknown names are refused");
  CHECK(mc_elem_dtype_size(MC_ELEM_F32) == 4 && mc_elem_dtype_size(MC_ELEM_BF16) == 2 && mc_elem_dtype_size(MC_ELEM_F16) == 2 &&
            mc_elem_dtype_size(MC_ELEM_F8_E4M3) == 1 && mc_elem_dtype_size(MC_ELEM_F8_E5M2) == 1 && mc_elem_dtype_size(7) == 0,
        "sizes");
  CHECK(mc_elem_dtype_size(MC_ELEM_I64) == 8 && !strcmp(mc_elem_dtype_name(MC_ELEM_I64), "int64") && !mc_elem_is_float(MC_ELEM_I64),
        "int64: 8 bytes, not a float format");
  for (int dt = 0; dt < MC_ELEM_I64; dt++) CHECK(mc_elem_is_float(dt), "%s is a float format", mc_elem_dtype_name(dt));
  CHECK(!mc_elem_is_float(-1) && !mc_elem_is_float(MC_N_ELEM_DTYPES), "out of range is no float format");

  /* saturation and overflow, by value */
  CHECK(mc_e4m3_of_f32(448.0f) == 0x7e && mc_e4m3_of_f32(449.0f) == 0x7e && mc_e4m3_of_f32(1e30f) == 0x7e &&
            mc_e4m3_of_f32(INFINITY) == 0x7e && mc_e4m3_of_f32(-INFINITY) == 0xfe && mc_e4m3_of_f32(-500.0f) == 0xfe,
        "E4M3 saturates at +-448");
  CHECK(mc_f32_of_e4m3(0x7e) == 448.0f && isnan(mc_f32_of_e4m3(0x7f)) && isnan(mc_f32_of_e4m3(0xff)), "E4M3 max and NaN");
  CHECK(mc_e4m3_of_f32(ldexpf(1.0f, -9)) == 0x01 && mc_e4m3_of_f32(ldexpf(1.0f, -10)) == 0x00 &&
            mc_e4m3_of_f32(ldexpf(1.5f, -10)) == 0x01,
        "E4M3 smallest subnormal 2^-9; half of it ties to 0, above half rounds up");
  CHECK(mc_e5m2_of_f32(57344.0f) == 0x7b && mc_e5m2_of_f32(61439.0f) == 0x7b && mc_e5m2_of_f32(61440.0f) == 0x7c &&
            mc_e5m2_of_f32(-1e30f) == 0xfc && mc_e5m2_of_f32(INFINITY) == 0x7c,
        "E5M2: 57344 is the largest, ties from 61440 round to infinity");
  CHECK(mc_f16_of_f32(65504.0f) == 0x7bff && mc_f16_of_f32(65519.0f) == 0x7bff && mc_f16_of_f32(65520.0f) == 0x7c00,
        "float16: 65504 is the largest, 65520 (the tie) rounds to infinity");
  CHECK(mc_f16_of_f32(ldexpf(1.0f, -24)) == 0x0001 && mc_f16_of_f32(ldexpf(1.0f, -25)) == 0x0000 &&
            mc_f16_of_f32(ldexpf(3.0f, -26)) == 0x0001,
        "float16 subnormals");
  CHECK(mc_bf16_of_f32(of_bits(0x3f808000u)) == 0x3f80 && mc_bf16_of_f32(of_bits(0x3f818000u)) == 0x3f82 &&
            mc_bf16_of_f32(of_bits(0x7f7fffffu)) == 0x7f80,
        "bfloat16 ties to even; FLT_MAX overflows to infinity");

  /* arrays: little-endian bytes, and back */
  float v[3] = {1.0f, -2.0f, 0.5f}, w[3] = {0};
  unsigned char b[12];
  mc_elem_narrow(MC_ELEM_BF16, v, b, 3);
  CHECK(b[0] == 0x80 && b[1] == 0x3f && b[2] == 0x00 && b[3] == 0xc0, "bfloat16 bytes little-endian: %02x %02x %02x %02x",
        b[0], b[1], b[2], b[3]);
  mc_elem_widen(MC_ELEM_BF16, b, w, 3);
  CHECK(w[0] == 1.0f && w[1] == -2.0f && w[2] == 0.5f, "bfloat16 array back");
  mc_elem_narrow(MC_ELEM_F16, v, b, 3);
  CHECK(b[0] == 0x00 && b[1] == 0x3c && b[2] == 0x00 && b[3] == 0xc0, "float16 bytes little-endian");
  mc_elem_widen(MC_ELEM_F16, b, w, 3);
  CHECK(w[0] == 1.0f && w[1] == -2.0f && w[2] == 0.5f, "float16 array back");
  mc_elem_narrow(MC_ELEM_F8_E4M3, v, b, 3);
  CHECK(b[0] == 0x38 && b[1] == 0xc0 && b[2] == 0x30, "float8_e4m3 bytes %02x %02x %02x", b[0], b[1], b[2]);
  mc_elem_widen(MC_ELEM_F8_E5M2, (const unsigned char[]){0x3c, 0xc0, 0x38}, w, 3);
  CHECK(w[0] == 1.0f && w[1] == -2.0f && w[2] == 0.5f, "float8_e5m2 array back");
  mc_elem_narrow(MC_ELEM_F32, v, b, 3);
  CHECK(!memcmp(b, v, 12), "float32 is a byte copy");
  return mc_check_exit("test_dtype");
}
