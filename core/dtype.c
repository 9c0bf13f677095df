/* Element dtypes and their fp32 conversions (core/dtype.h). Every narrow format is described
 * by its exponent and mantissa widths, so one rounding routine serves them all. */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static const char *const names[MC_N_ELEM_DTYPES] = {"float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "int64"};
static const size_t sizes[MC_N_ELEM_DTYPES] = {4, 2, 2, 1, 1, 8};

const char *mc_elem_dtype_name(int dt) { return dt >= 0 && dt < MC_N_ELEM_DTYPES ? names[dt] : "?"; }

int mc_elem_dtype_parse(const char *name) {
  for (int i = 0; name && i < MC_N_ELEM_DTYPES; i++)
    if (!strcmp(name, names[i])) return i;
  return -1;
}

size_t mc_elem_dtype_size(int dt) { return dt >= 0 && dt < MC_N_ELEM_DTYPES ? sizes[dt] : 0; }

int mc_elem_is_float(int dt) { return dt >= 0 && dt < MC_N_ELEM_DTYPES && dt != MC_ELEM_I64; }

/* A binary floating-point format narrower than fp32: `ebits` exponent bits, `mbits` mantissa
 * bits, bias 2^(ebits-1)-1. ieee: the all-ones exponent is infinity (mantissa 0) or NaN;
 * otherwise (E4M3) it holds normal values except the all-ones pattern, the NaN, and values
 * beyond the largest saturate to it. */
typedef struct {
  int ebits, mbits, ieee;
} narrow_fmt;

static const narrow_fmt BF16 = {8, 7, 1}, F16 = {5, 10, 1}, E4M3 = {4, 3, 0}, E5M2 = {5, 2, 1};

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* x >> shift rounded to nearest, ties to even (shift >= 1). */
static uint64_t shift_rne(uint64_t x, int shift) {
  if (shift >= 63) return 0;
  uint64_t r = x >> shift, rem = x & (((uint64_t)1 << shift) - 1), half = (uint64_t)1 << (shift - 1);
  return r + (rem > half || (rem == half && (r & 1)));
}

static uint32_t narrow(narrow_fmt fm, float f) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  const uint32_t sign = (u >> 31) << (fm.ebits + fm.mbits);
  const uint32_t emax = (1u << fm.ebits) - 1; /* the all-ones exponent field */
  const uint32_t mmask = (1u << fm.mbits) - 1;
  /* ieee: infinity; E4M3: the largest finite value, S.1111.110 */
  const uint32_t top = fm.ieee ? emax << fm.mbits : (emax << fm.mbits) | (mmask - 1);
  const int bias = (1 << (fm.ebits - 1)) - 1, drop = 23 - fm.mbits;
  if (a > 0x7f800000u) { /* NaN: keep the payload's top bits, or set the quiet bit */
    uint32_t m = fm.ieee ? (a & 0x7fffffu) >> drop : mmask;
    return sign | (emax << fm.mbits) | (m ? m : 1u << (fm.mbits - 1));
  }
  if (a == 0x7f800000u) return sign | top; /* infinity, or E4M3's saturation */
  const int e32 = (int)(a >> 23);          /* fp32 exponent field, 0 for subnormals */
  const int te = e32 - 127 + bias;         /* the target's exponent field */
  uint64_t r;
  if (te >= 1) {
    /* normal in the target: rebias, round off `drop` bits; a carry out of the mantissa
     * moves into the exponent, as it should */
    r = shift_rne(((uint64_t)te << 23) | (a & 0x7fffffu), drop);
  } else {
    /* subnormal (or zero) in the target: the significand in units of the target's
     * smallest subnormal, 2^(1-bias-mbits); fp32's own value is sig * 2^(max(e32,1)-150) */
    uint64_t sig = e32 ? (a & 0x7fffffu) | 0x800000u : a;
    int e = e32 ? e32 : 1;
    int shift = (1 - bias - fm.mbits) - (e - 150);
    r = shift >= 25 ? 0 : shift_rne(sig, shift); /* below half the smallest: 0 */
  }
  if (r > top) r = top; /* overflow: infinity (ieee), or saturation at 448 (E4M3) */
  return sign | (uint32_t)r;
}

static float widen(narrow_fmt fm, uint32_t b) {
  const int n = fm.ebits + fm.mbits;
  const uint32_t sign = (b >> n) & 1, e = (b >> fm.mbits) & ((1u << fm.ebits) - 1), m = b & ((1u << fm.mbits) - 1);
  const uint32_t emax = (1u << fm.ebits) - 1;
  const int bias = (1 << (fm.ebits - 1)) - 1;
  if (e == emax && (fm.ieee || m == (1u << fm.mbits) - 1)) /* infinity or NaN, payload kept */
    return float_of((sign << 31) | 0x7f800000u | (m << (23 - fm.mbits)));
  /* every value is m * 2^k (subnormal) or (2^mbits + m) * 2^k: exact in fp32 */
  float v = e ? ldexpf((float)((1u << fm.mbits) | m), (int)e - bias - fm.mbits) : ldexpf((float)m, 1 - bias - fm.mbits);
  return sign ? -v : v;
}

uint16_t mc_bf16_of_f32(float f) { return (uint16_t)narrow(BF16, f); }
/* bfloat16 is the top half of an fp32: widening is a shift (NaN payloads included). */
float mc_f32_of_bf16(uint16_t h) { return float_of((uint32_t)h << 16); }
uint16_t mc_f16_of_f32(float f) { return (uint16_t)narrow(F16, f); }
float mc_f32_of_f16(uint16_t h) { return widen(F16, h); }
uint8_t mc_e4m3_of_f32(float f) { return (uint8_t)narrow(E4M3, f); }
float mc_f32_of_e4m3(uint8_t b) { return widen(E4M3, b); }
uint8_t mc_e5m2_of_f32(float f) { return (uint8_t)narrow(E5M2, f); }
float mc_f32_of_e5m2(uint8_t b) { return widen(E5M2, b); }

void mc_elem_narrow(int dt, const float *src, void *dst, int64_t n) {
  unsigned char *o = dst;
  if (dt == MC_ELEM_F32) {
    memmove(dst, src, (size_t)n * 4);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case MC_ELEM_BF16:
      case MC_ELEM_F16: {
        uint16_t h = dt == MC_ELEM_BF16 ? mc_bf16_of_f32(src[i]) : mc_f16_of_f32(src[i]);
        o[2 * i] = (unsigned char)(h & 0xff); /* little-endian, whatever the host */
        o[2 * i + 1] = (unsigned char)(h >> 8);
        break;
      }
      case MC_ELEM_F8_E4M3: o[i] = mc_e4m3_of_f32(src[i]); break;
      case MC_ELEM_F8_E5M2: o[i] = mc_e5m2_of_f32(src[i]); break;
      default: break;
    }
  }
}

void mc_elem_widen(int dt, const void *src, float *dst, int64_t n) {
  const unsigned char *p = src;
  if (dt == MC_ELEM_F32) {
    memmove(dst, src, (size_t)n * 4);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case MC_ELEM_BF16: dst[i] = mc_f32_of_bf16((uint16_t)(p[2 * i] | p[2 * i + 1] << 8)); break;
      case MC_ELEM_F16: dst[i] = mc_f32_of_f16((uint16_t)(p[2 * i] | p[2 * i + 1] << 8)); break;
      case MC_ELEM_F8_E4M3: dst[i] = mc_f32_of_e4m3(p[i]); break;
      case MC_ELEM_F8_E5M2: dst[i] = mc_f32_of_e5m2(p[i]); break;
      default: break;
    }
  }
}
