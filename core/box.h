/* Boxes (hyperslabs): a start and a count per dimension of a global tensor of up to 3
 * dimensions, and their intersections. The one spelling of a box for the checkpoint
 * reader, the reshard planner and executor, the audit tiling check and the planner's
 * tables. Depends on nothing. */
#ifndef MC_CORE_BOX_H
#define MC_CORE_BOX_H

#include <stdint.h>

#define MC_BOX_MAX_DIM 3

/* Dimensions ndim .. 2 are unused (0 in boxes built here). */
typedef struct {
  int ndim;
  int64_t start[MC_BOX_MAX_DIM], count[MC_BOX_MAX_DIM];
} mc_box;

/* The box of ndim (0..3) dimensions with these starts and counts; unused dimensions 0. */
mc_box mc_box_make(int ndim, const int64_t *start, const int64_t *count);
int64_t mc_box_numel(const mc_box *b);
/* Writes the intersection of a and b to out (same ndim); returns its element count (0: none,
 * and then out's counts are all 0). */
int64_t mc_box_intersect(const mc_box *a, const mc_box *b, mc_box *out);
/* 1 if `inner` lies entirely inside `outer`. */
int mc_box_contains(const mc_box *outer, const mc_box *inner);
/* 1 if a and b have the same ndim and the same start and count in each of its dimensions. */
int mc_box_equal(const mc_box *a, const mc_box *b);
/* off[d] = inner->start[d] - outer->start[d] for d < inner->ndim: where `inner` begins
 * inside `outer` (e.g. an intersection relative to one of its operands). */
void mc_box_offset(const mc_box *inner, const mc_box *outer, int64_t *off);
/* Copies the fp32 elements of box `part` from src, a row-major array over src_box, into dst, a
 * row-major array over dst_box; part lies inside both (all boxes in the same global
 * coordinates, of the same ndim). Gathering a shard's piece of a request, and packing or
 * unpacking a piece of it, are all this one copy. */
void mc_box_copy(const float *src, const mc_box *src_box, float *dst, const mc_box *dst_box, const mc_box *part);
/* "[0:128, 64:128]" style text (half-open ranges), truncated to cap bytes. */
void mc_box_format(const mc_box *b, char *buf, int cap);

#endif
