/* Deterministic orders of work items: largest first, so that work dealt out in this order
 * (to threads, to ranks) ends evenly, and every process derives the same order. */
#ifndef MC_UTIL_ORDER_H
#define MC_UTIL_ORDER_H

#include <stdint.h>

/* One item: its size and its index in the caller's list. */
typedef struct {
  int64_t bytes;
  int idx;
} mc_sized;

/* Sorts by bytes descending, equal sizes by idx ascending. */
void mc_sort_largest_first(mc_sized *items, int n);

#endif
