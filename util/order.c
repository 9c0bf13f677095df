#include "util/order.h"

#include <stdlib.h>

static int largest_first(const void *a, const void *b) {
  const mc_sized *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return (x->idx > y->idx) - (x->idx < y->idx);
}

void mc_sort_largest_first(mc_sized *items, int n) {
  if (n > 1) qsort(items, (size_t)n, sizeof *items, largest_first);
}
