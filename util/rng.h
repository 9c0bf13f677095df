/* Counter-based randomness (Philox4x32-10, bit-compatible with Random123's philox4x32_10:
 * counter words (index lo, index hi, stream lo, stream hi), key words (seed lo, seed hi);
 * tests/util/test_rng.c checks Random123's known-answer vectors): a value is a pure function
 * of (seed, stream, index), so the model, the data order and any sampling are identical under
 * every layout and every order of evaluation (docs/design.md section 4). */
#ifndef MC_UTIL_RNG_H
#define MC_UTIL_RNG_H

#include <stdint.h>

/* Streams name the purpose; family streams are mc_rng_stream_of(name). */
enum { MC_RNG_STREAM_DATA = 1, MC_RNG_STREAM_DROPOUT = 2, MC_RNG_STREAM_TEST = 3 };

/* Four 32-bit random words for counter `index` of (seed, stream). */
void mc_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);
/* A stable 64-bit stream id from a string, e.g. a family name: FNV-1a's steps and prime with
 * the offset basis 1469598103934665603 (not FNV's 14695981039346656037: a digit was lost, and
 * it is kept because every initial model depends on it), so not standard FNV-1a values. */
uint64_t mc_rng_stream_of(const char *name);
/* Uniform in (0, 1), 53-bit. */
double mc_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on one counter). */
double mc_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform integer in [0, n). */
uint64_t mc_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);

#endif
