/* Category arenas (train/arena.h). */
#include "train/arena.h"

#include <string.h>

#include "core/mem_cats.h"
#include "util/error.h"

static const char *cat_label(mc_mem_cat c) { return mc_mem_cat_label(c); }

void mc_arena_count(mc_arena *a, int64_t bytes) {
  const int64_t f = mc_mem_footprint(bytes); /* saturating: an impossible size fails to allocate */
  a->cap = a->cap > INT64_MAX - f ? INT64_MAX : a->cap + f;
}

int mc_arena_open(mc_arena *a, mc_backend *be, mc_mem_cat cat) {
  a->be = be, a->cat = cat;
  a->used = a->tensor_bytes = a->tensors = 0;
  if (a->cap == 0) return 0;
  a->base = be->alloc(be, (size_t)a->cap);
  if (!a->base)
    return mc_error("out of %s memory for the %s arena (%lld bytes)", be->name, cat_label(cat), (long long)a->cap);
  return 0;
}

void *mc_arena_take(mc_arena *a, int64_t bytes, mc_mem_cat cat) {
  int64_t fp = mc_mem_footprint(bytes);
  if (!a->base || a->used + fp > a->cap) {
    mc_error("the %s arena holds %lld bytes, %lld in use: no room for %lld more (sizing and placement disagree)",
             cat_label(cat), (long long)a->cap, (long long)a->used, (long long)fp);
    return NULL;
  }
  void *p = a->base + a->used;
  a->used += fp;
  a->tensor_bytes += bytes;
  a->tensors++;
  return p;
}

void mc_arena_restart(mc_arena *a) { a->used = a->tensor_bytes = a->tensors = 0; }

void mc_arena_close(mc_arena *a) {
  if (a->base) a->be->free(a->be, a->base);
  memset(a, 0, sizeof *a);
}

void mc_arenas_add_bytes(const mc_arenas *as, int64_t bytes[MC_MEM_COUNT]) {
  for (int c = 0; c < MC_MEM_COUNT; c++) bytes[c] += as->a[c].cap;
}

void mc_arenas_close(mc_arenas *as) {
  for (int c = 0; c < MC_MEM_COUNT; c++) mc_arena_close(&as->a[c]);
}
