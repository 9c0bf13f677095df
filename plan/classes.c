/* Groups ranks whose memory plans are identical (same stage, same bytes per category and per
 * optimizer group). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/owners.h"
#include "plan/report.h"
#include "plan/units.h"
#include "util/error.h"

static const mc_plan *sort_plan; /* qsort has no context argument in C11 */

static int cmp_rank(const void *pa, const void *pb) {
  const mc_plan_rank *a = &sort_plan->ranks[*(const int *)pa], *b = &sort_plan->ranks[*(const int *)pb];
  if (a->stage != b->stage) return a->stage - b->stage;
  for (int c = 0; c < MC_MEM_COUNT; c++)
    if (a->bytes[c] != b->bytes[c]) return a->bytes[c] < b->bytes[c] ? -1 : 1;
  for (int k = 0; k < MC_N_OPTS; k++)
    if (a->opt_group_bytes[k] != b->opt_group_bytes[k]) return a->opt_group_bytes[k] < b->opt_group_bytes[k] ? -1 : 1;
  return a->rank - b->rank;
}

static int same_plan(const mc_plan_rank *a, const mc_plan_rank *b) {
  return a->stage == b->stage && memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0 &&
         memcmp(a->opt_group_bytes, b->opt_group_bytes, sizeof a->opt_group_bytes) == 0;
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

int mc_plan_class_warning(const mc_plan *p, const mc_rank_class *cl, char *buf, int cap) {
  const mc_plan_rank *r = &p->ranks[cl->ranks[0]];
  mc_fit fit = mc_plan_fit(p, r);
  if (fit == MC_FIT_OK) return 0;
  char list[256], b1[32], b2[32], b3[32];
  mc_format_ranks(cl->ranks, cl->n_ranks, list, sizeof list);
  if (fit == MC_FIT_NO)
    snprintf(buf, (size_t)cap, "ranks {%s} do not fit: they need %s but the device has %s (short by %s)", list,
             mc_format_bytes(r->total, b1, sizeof b1), mc_format_bytes(p->opts.device_mem, b2, sizeof b2),
             mc_format_bytes(-r->headroom, b3, sizeof b3));
  else
    snprintf(buf, (size_t)cap, "ranks {%s}: headroom %s is %.1f%% of %s, under the %.0f%% margin", list,
             mc_format_bytes(r->headroom, b1, sizeof b1), 100.0 * (double)r->headroom / (double)p->opts.device_mem,
             mc_format_bytes(p->opts.device_mem, b2, sizeof b2), 100.0 * p->opts.margin);
  return 1;
}
