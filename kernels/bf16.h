/* fp32 <-> bf16 on the host, bit for bit what the CUDA backend writes: round to nearest even
 * (the rounding of __float2bfloat16_rn, subnormals kept), and every NaN becomes the
 * canonical quiet NaN 0x7fff (the CUDA kernels write that one too, so the bits agree). */
#ifndef MC_KERNELS_BF16_H
#define MC_KERNELS_BF16_H

#include <stdint.h>
#include <string.h>

#include "kernels/ops.h"

static inline mc_bf16 mc_bf16_from_float(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (mc_bf16)0x7fffu;
  /* adding 0x7fff plus the lowest kept bit rounds to nearest, ties to the even pattern;
   * values that round past the largest finite become inf, as they should */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (mc_bf16)(u >> 16);
}

static inline float mc_bf16_to_float(mc_bf16 h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Element i of an op input as stored, widened to fp32. */
static inline float mc_operand_at(mc_operand x, int64_t i) { return x.h ? mc_bf16_to_float(x.h[i]) : x.f[i]; }

/* Writes v as element i of an op output (rounded when the output is bf16). */
static inline void mc_dst_set(mc_dst y, int64_t i, float v) {
  if (y.h) y.h[i] = mc_bf16_from_float(v);
  else y.f[i] = v;
}

/* A gradient's contribution v to element i: added into fp32, written into bf16 (ops.h). */
static inline void mc_dst_acc(mc_dst y, int64_t i, float v) {
  if (y.h) y.h[i] = mc_bf16_from_float(v);
  else y.f[i] += v;
}

#endif
