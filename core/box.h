/* Hyperslabs (start, count) of a global tensor of up to 3 dimensions, and their
 * intersections: the arithmetic the reshard planner and the audit tiling check share. */
#ifndef MC_RESHARD_SLAB_H
#define MC_RESHARD_SLAB_H

#include <stdint.h>

typedef struct {
  int ndim;
  int64_t start[3], count[3];
} mc_slab;

int64_t mc_slab_numel(const mc_slab *s);
/* Writes the intersection of a and b to out (same ndim); returns its element count (0: none). */
int64_t mc_slab_intersect(const mc_slab *a, const mc_slab *b, mc_slab *out);
/* 1 if `inner` lies entirely inside `outer`. */
int mc_slab_contains(const mc_slab *outer, const mc_slab *inner);
/* "[0:128, 64:128]" style text (half-open ranges). */
void mc_slab_format(const mc_slab *s, char *buf, int cap);

#endif
