#include "util/rng.h"

#include <math.h>

void mc_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

uint64_t mc_rng_stream_of(const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 1099511628211ull;
  }
  return h;
}

static double unit53(uint32_t hi, uint32_t lo) {
  uint64_t v = ((uint64_t)hi << 21) ^ (lo >> 11);
  return ((double)(v & ((1ull << 53) - 1)) + 0.5) / 9007199254740992.0;
}

double mc_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  mc_philox(seed, stream, index, w);
  return unit53(w[0], w[1]);
}

double mc_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  mc_philox(seed, stream, index, w);
  double u1 = unit53(w[0], w[1]), u2 = unit53(w[2], w[3]);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t mc_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n) {
  uint32_t w[4];
  mc_philox(seed, stream, index, w);
  uint64_t v = ((uint64_t)w[0] << 32) | w[1];
  /* 128-bit multiply-high: unbiased enough for n << 2^64 and deterministic. */
  return (uint64_t)(((unsigned __int128)v * n) >> 64);
}
