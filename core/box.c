#include "core/box.h"

#include <stdio.h>
#include <string.h>

mc_box mc_box_make(int ndim, const int64_t *start, const int64_t *count) {
  mc_box b = {ndim, {0, 0, 0}, {0, 0, 0}};
  for (int d = 0; d < ndim && d < MC_BOX_MAX_DIM; d++) b.start[d] = start[d], b.count[d] = count[d];
  return b;
}

int64_t mc_box_numel(const mc_box *b) {
  int64_t n = 1;
  for (int d = 0; d < b->ndim; d++) n *= b->count[d];
  return n;
}

int64_t mc_box_intersect(const mc_box *a, const mc_box *b, mc_box *out) {
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
  return mc_box_numel(out);
}

int mc_box_contains(const mc_box *outer, const mc_box *inner) {
  if (outer->ndim != inner->ndim) return 0;
  for (int d = 0; d < outer->ndim; d++)
    if (inner->start[d] < outer->start[d] ||
        inner->start[d] + inner->count[d] > outer->start[d] + outer->count[d])
      return 0;
  return 1;
}

int mc_box_equal(const mc_box *a, const mc_box *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->start[d] != b->start[d] || a->count[d] != b->count[d]) return 0;
  return 1;
}

void mc_box_offset(const mc_box *inner, const mc_box *outer, int64_t *off) {
  for (int d = 0; d < inner->ndim; d++) off[d] = inner->start[d] - outer->start[d];
}

void mc_box_copy(const float *src, const mc_box *src_box, float *dst, const mc_box *dst_box, const mc_box *part) {
  /* right-aligned into 3 dimensions: sd/dd the array extents, so/dof where part starts */
  int64_t sd[3] = {1, 1, 1}, dd[3] = {1, 1, 1}, so[3] = {0, 0, 0}, dof[3] = {0, 0, 0}, c[3] = {1, 1, 1};
  for (int k = 0; k < part->ndim; k++) {
    int j = 3 - part->ndim + k;
    sd[j] = src_box->count[k];
    dd[j] = dst_box->count[k];
    so[j] = part->start[k] - src_box->start[k];
    dof[j] = part->start[k] - dst_box->start[k];
    c[j] = part->count[k];
  }
  for (int64_t i = 0; i < c[0]; i++)
    for (int64_t j = 0; j < c[1]; j++) {
      const float *s = src + ((so[0] + i) * sd[1] + (so[1] + j)) * sd[2] + so[2];
      float *d = dst + ((dof[0] + i) * dd[1] + (dof[1] + j)) * dd[2] + dof[2];
      memcpy(d, s, (size_t)c[2] * sizeof(float));
    }
}

void mc_box_format(const mc_box *b, char *buf, int cap) {
  int off = snprintf(buf, (size_t)cap, "[");
  for (int d = 0; d < b->ndim && off < cap; d++)
    off += snprintf(buf + off, (size_t)(cap - off), "%s%lld:%lld", d ? ", " : "",
                    (long long)b->start[d], (long long)(b->start[d] + b->count[d]));
  if (off < cap) snprintf(buf + off, (size_t)(cap - off), "]");
}
