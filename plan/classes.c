/* Groups ranks whose memory plans are identical (same stage and same bytes per category). */
#include <stdlib.h>
#include <string.h>

#include "plan/report.h"
#include "util/error.h"

static const mc_plan *sort_plan; /* qsort has no context argument in C11 */

static int cmp_rank(const void *pa, const void *pb) {
  const mc_plan_rank *a = &sort_plan->ranks[*(const int *)pa], *b = &sort_plan->ranks[*(const int *)pb];
  if (a->stage != b->stage) return a->stage - b->stage;
  for (int c = 0; c < MC_MEM_COUNT; c++)
    if (a->bytes[c] != b->bytes[c]) return a->bytes[c] < b->bytes[c] ? -1 : 1;
  return a->rank - b->rank;
}

static int same_plan(const mc_plan_rank *a, const mc_plan_rank *b) {
  return a->stage == b->stage && memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

static int cmp_class(const void *pa, const void *pb) {
  const mc_rank_class *a = pa, *b = pb;
  return a->ranks[0] - b->ranks[0];
}

int mc_plan_classes(const mc_plan *p, mc_rank_classes *out) {
  memset(out, 0, sizeof *out);
  out->storage = malloc(sizeof(int) * (size_t)p->world);
  out->c = calloc((size_t)p->world, sizeof *out->c);
  if (!out->storage || !out->c) {
    mc_plan_classes_free(out);
    return mc_error("out of memory grouping %d ranks", p->world);
  }
  for (int r = 0; r < p->world; r++) out->storage[r] = r;
  sort_plan = p;
  qsort(out->storage, (size_t)p->world, sizeof(int), cmp_rank);
  for (int i = 0; i < p->world; i++) {
    if (i > 0 && same_plan(&p->ranks[out->storage[i]], &p->ranks[out->storage[i - 1]])) {
      out->c[out->n - 1].n_ranks++;
      continue;
    }
    out->c[out->n].ranks = &out->storage[i];
    out->c[out->n].n_ranks = 1;
    out->n++;
  }
  qsort(out->c, (size_t)out->n, sizeof *out->c, cmp_class);
  return 0;
}

void mc_plan_classes_free(mc_rank_classes *c) {
  free(c->c);
  free(c->storage);
  memset(c, 0, sizeof *c);
}
