#include "plan/owners.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "core/optim_groups.h"
#include "util/error.h"

typedef struct {
  int rank;
  mc_shard s;
} entry;

static int cmp_i64(const int64_t *a, const int64_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}

static int same_key(const mc_shard *a, const mc_shard *b) {
  int n = a->ndim;
  return !cmp_i64(a->local_start, b->local_start, n) && !cmp_i64(a->local_count, b->local_count, n) &&
         !cmp_i64(a->start, b->start, n) && !cmp_i64(a->count, b->count, n);
}

static int cmp_entry(const void *pa, const void *pb) {
  const entry *a = pa, *b = pb;
  int n = a->s.ndim, c;
  if ((c = cmp_i64(a->s.local_start, b->s.local_start, n))) return c;
  if ((c = cmp_i64(a->s.local_count, b->s.local_count, n))) return c;
  if ((c = cmp_i64(a->s.start, b->s.start, n))) return c;
  if ((c = cmp_i64(a->s.count, b->s.count, n))) return c;
  return a->rank - b->rank;
}

static int cmp_group(const void *pa, const void *pb) {
  const mc_own_group *a = pa, *b = pb;
  return a->ranks[0] - b->ranks[0];
}

int mc_own_table_build(const mc_geometry *g, int fam, mc_own_table *t) {
  memset(t, 0, sizeof *t);
  t->fam = fam;
  t->stage = mc_family_stage(g, fam);
  t->moments_match = 1;
  const int per_stage = g->layout.tp * g->layout.dp;
  const int base = t->stage * per_stage;
  entry *e = calloc((size_t)per_stage, sizeof *e);
  t->rank_storage = calloc((size_t)per_stage, sizeof(int));
  t->groups = calloc((size_t)per_stage, sizeof(mc_own_group));
  if (!e || !t->rank_storage || !t->groups) {
    free(e), mc_own_table_free(t);
    return mc_error("out of memory building the ownership table of %s", g->fams.f[fam].name);
  }
  int n = 0;
  for (int i = 0; i < per_stage; i++) {
    int rank = base + i;
    mc_shard s, m;
    if (mc_shard_of(g, fam, MC_STATE_PARAM, rank, &s) != 0) {
      free(e), mc_own_table_free(t);
      return -1;
    }
    if (!s.in_stage) continue;
    for (int st = MC_STATE_EXP_AVG; st < MC_N_STATES; st++) {
      /* the kinds shaped like the parameter; a scalar (step) is held wherever param is not empty */
      if (!mc_family_has_state(&g->fams.f[fam], (mc_state)st) || mc_state_is_scalar((mc_state)st)) continue;
      if (mc_shard_of(g, fam, (mc_state)st, rank, &m) != 0) {
        free(e), mc_own_table_free(t);
        return -1;
      }
      if (!same_key(&s, &m)) t->moments_match = 0;
    }
    e[n].rank = rank;
    e[n].s = s;
    n++;
  }
  qsort(e, (size_t)n, sizeof *e, cmp_entry);
  for (int i = 0; i < n; i++) {
    t->rank_storage[i] = e[i].rank;
    if (i > 0 && same_key(&e[i].s, &e[i - 1].s)) {
      t->groups[t->n - 1].n_ranks++;
      continue;
    }
    mc_own_group *gr = &t->groups[t->n++];
    const mc_shard *s = &e[i].s;
    gr->ndim = s->ndim;
    memcpy(gr->local_start, s->local_start, sizeof gr->local_start);
    memcpy(gr->local_count, s->local_count, sizeof gr->local_count);
    memcpy(gr->start, s->start, sizeof gr->start);
    memcpy(gr->count, s->count, sizeof gr->count);
    gr->numel = s->numel;
    gr->primary_rank = s->held ? s->primary_rank : -1;
    gr->ranks = &t->rank_storage[i];
    gr->n_ranks = 1;
  }
  free(e);
  qsort(t->groups, (size_t)t->n, sizeof *t->groups, cmp_group);
  return 0;
}

void mc_own_table_free(mc_own_table *t) {
  free(t->groups);
  free(t->rank_storage);
  t->groups = NULL;
  t->rank_storage = NULL;
  t->n = 0;
}

void mc_format_ranks(const int *ranks, int n, char *buf, int cap) {
  int off = 0;
  buf[0] = 0;
  for (int i = 0; i < n && off < cap - 1;) {
    /* Longest arithmetic run starting at i. */
    int j = i + 1;
    if (j < n) {
      int step = ranks[j] - ranks[i];
      while (j + 1 < n && ranks[j + 1] - ranks[j] == step) j++;
    }
    int len = j - i + 1;
    const char *sep = off ? "," : "";
    if (len >= 3 && ranks[i + 1] - ranks[i] == 1)
      off += snprintf(buf + off, (size_t)(cap - off), "%s%d-%d", sep, ranks[i], ranks[j]);
    else if (len >= 4)
      off += snprintf(buf + off, (size_t)(cap - off), "%s%d,%d,..,%d", sep, ranks[i], ranks[i + 1], ranks[j]);
    else {
      off += snprintf(buf + off, (size_t)(cap - off), "%s%d", sep, ranks[i]);
      j = i;
    }
    i = j + 1;
  }
}

void mc_format_slab(int ndim, const int64_t *start, const int64_t *count, char *buf, int cap) {
  mc_box b = mc_box_make(ndim, start, count);
  mc_box_format(&b, buf, cap);
}
