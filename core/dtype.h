/* Element dtypes of stored tensors: the one vocabulary of their names and sizes, and the
 * conversions between each and fp32.
 *
 * Narrowing from fp32 rounds to nearest, ties to even, in every format. Widening to fp32 is
 * exact: every value of every format is an fp32 value. Per format:
 *   float32      4 bytes, IEEE single
 *   bfloat16     2 bytes, the top half of an fp32 (8 exponent bits, 7 mantissa bits); overflow
 *                rounds to infinity
 *   float16      2 bytes, IEEE half (5 exponent bits, 10 mantissa bits, bias 15); overflow rounds
 *                to infinity
 *   float8_e4m3  1 byte, OCP FP8 E4M3 (4 exponent bits, 3 mantissa bits, bias 7): no
 *                infinities, S.1111.111 is NaN, the largest value is 448; a finite value above
 *                it, and an infinity, saturates to +-448
 *   float8_e5m2  1 byte, OCP FP8 E5M2 (5 exponent bits, 2 mantissa bits, bias 15): IEEE-like,
 *                overflow rounds to infinity as round-to-nearest-even says (from 61440 up)
 *   int64        8 bytes, a little-endian two's complement integer (steps, counters): not a
 *                float format. It has no fp32 conversion (most of its values have no exact fp32
 *                value), so mc_elem_narrow and mc_elem_widen do not take it; an int64 state is
 *                int64 from the optimizer to the file and back (mc_elem_is_float says which).
 * A NaN stays a NaN of the same sign, keeping the top bits of its payload that fit (a payload
 * that would become zero becomes the quiet bit), so every bit pattern of every format
 * survives widening and narrowing back unchanged (E4M3 has one NaN per sign).
 *
 * The enum is named mc_elem_dtype (MC_ELEM_*), apart from the comm layer's MC_DT_* buffer
 * types. Depends on nothing. */
#ifndef MC_CORE_DTYPE_H
#define MC_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  MC_ELEM_F32 = 0,
  MC_ELEM_BF16 = 1,
  MC_ELEM_F16 = 2,
  MC_ELEM_F8_E4M3 = 3,
  MC_ELEM_F8_E5M2 = 4,
  MC_ELEM_I64 = 5,
  MC_N_ELEM_DTYPES = 6
} mc_elem_dtype;

/* "float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "int64" ("?" if out of range). */
const char *mc_elem_dtype_name(int dt);
/* The dtype of that name, or -1 if the name is none of them. */
int mc_elem_dtype_parse(const char *name);
/* Bytes per element: 4, 2, 2, 1, 1, 8 (0 if out of range). */
size_t mc_elem_dtype_size(int dt);
/* 1 for the floating-point dtypes (every one but int64), which convert to and from fp32. */
int mc_elem_is_float(int dt);

/* One element (bit patterns as integers). */
uint16_t mc_bf16_of_f32(float f);
float mc_f32_of_bf16(uint16_t h);
uint16_t mc_f16_of_f32(float f);
float mc_f32_of_f16(uint16_t h);
uint8_t mc_e4m3_of_f32(float f);
float mc_f32_of_e4m3(uint8_t b);
uint8_t mc_e5m2_of_f32(float f);
float mc_f32_of_e5m2(uint8_t b);

/* n fp32 values -> n elements of floating-point dtype dt at dst, little-endian (n * mc_elem_dtype_size(dt)
 * bytes): the stored bytes of a shard. float32 is a byte copy. */
void mc_elem_narrow(int dt, const float *src, void *dst, int64_t n);
/* n little-endian elements of floating-point dtype dt at src -> n fp32 values, exactly. float32 is a byte
 * copy. src and dst must not overlap. */
void mc_elem_widen(int dt, const void *src, float *dst, int64_t n);

#endif
