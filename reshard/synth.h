/* Synthetic checkpoints for benchmarks and tests: a committed checkpoint of any model and
 * layout whose tensors hold a deterministic function of (family, state, element index),
 * written through the streaming sink (bounded memory, any size). */
#ifndef MC_RESHARD_SYNTH_H
#define MC_RESHARD_SYNTH_H

#include "reshard/reshard.h"

/* The value stored at element `idx` (row-major in the global tensor) of (family, state). */
static inline float mc_rs_synth_value(int fam, int state, int64_t idx) {
  uint32_t h = (uint32_t)idx * 2654435761u ^ (uint32_t)(fam * 40503 + state * 9973);
  return (float)(h & 0xffffff) * (1.0f / 16777216.0f) - 0.5f;
}

/* Writes a new run directory `dst` holding step `step` of cfg's model in cfg's layout, every
 * family with the states of its optimizer under cfg's optim.groups. */
int mc_rs_synthesize(const mc_config *cfg, int64_t step, const char *dst, const mc_rs_opts *o, mc_rs_summary *sum);

#endif
