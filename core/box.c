#include "reshard/slab.h"

#include <stdio.h>

int64_t mc_slab_numel(const mc_slab *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->count[d];
  return n;
}

int64_t mc_slab_intersect(const mc_slab *a, const mc_slab *b, mc_slab *out) {
  out->ndim = a->ndim;
  for (int d = 0; d < 3; d++) out->start[d] = out->count[d] = 0;
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++) {
    int64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
    int64_t ea = a->start[d] + a->count[d], eb = b->start[d] + b->count[d];
    int64_t hi = ea < eb ? ea : eb;
    if (hi <= lo) {
      for (int k = 0; k < 3; k++) out->count[k] = 0;
      return 0;
    }
    out->start[d] = lo;
    out->count[d] = hi - lo;
  }
  return mc_slab_numel(out);
}

int mc_slab_contains(const mc_slab *outer, const mc_slab *inner) {
  if (outer->ndim != inner->ndim) return 0;
  for (int d = 0; d < outer->ndim; d++)
    if (inner->start[d] < outer->start[d] ||
        inner->start[d] + inner->count[d] > outer->start[d] + outer->count[d])
      return 0;
  return 1;
}

void mc_slab_format(const mc_slab *s, char *buf, int cap) {
  int off = snprintf(buf, (size_t)cap, "[");
  for (int d = 0; d < s->ndim && off < cap; d++)
    off += snprintf(buf + off, (size_t)(cap - off), "%s%lld:%lld", d ? ", " : "",
                    (long long)s->start[d], (long long)(s->start[d] + s->count[d]));
  if (off < cap) snprintf(buf + off, (size_t)(cap - off), "]");
}
