/* The ownership table of one family: the ranks of its stage grouped by the hyperslab they
 * hold (from mc_shard_of), so large worlds print one line per distinct shard. */
#ifndef MC_PLAN_OWNERS_H
#define MC_PLAN_OWNERS_H

#include <stdint.h>

#include "core/ownership.h"

typedef struct {
  int ndim;
  int64_t local_start[3], local_count[3]; /* TP/EP-local slice (working params) */
  int64_t start[3], count[3];             /* param-state hyperslab (master / ZeRO shard) */
  int64_t numel;                          /* elements of the state hyperslab */
  int primary_rank;                       /* -1 when the hyperslab is empty */
  int n_ranks;
  int *ranks;                             /* ascending; points into the table's storage */
} mc_own_group;

typedef struct {
  int fam;
  int stage;
  int n;                /* groups */
  mc_own_group *groups; /* ordered by their lowest rank */
  int *rank_storage;
  int moments_match;    /* 1 if the hyperslabs of the optimizer's states (exp_avg and exp_avg_sq,
                           or momentum) equal the param one everywhere */
} mc_own_table;

int mc_own_table_build(const mc_geometry *g, int fam, mc_own_table *t);
void mc_own_table_free(mc_own_table *t);

/* Writes a rank list compactly: "0-7", "0,4,..,28" (arithmetic runs) or "0,3,5". */
void mc_format_ranks(const int *ranks, int n, char *buf, int cap);
/* "[0:32, 0:64]" for a hyperslab (start:start+count per dim): mc_box_format (core/box.h)
 * of these arrays. */
void mc_format_slab(int ndim, const int64_t *start, const int64_t *count, char *buf, int cap);

#endif
