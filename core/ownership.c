#include "core/ownership.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const STATE_NAMES[MC_N_STATES] = {"param", "exp_avg", "exp_avg_sq"};

const char *mc_state_name(mc_state s) { return s >= 0 && s < MC_N_STATES ? STATE_NAMES[s] : "?"; }

int mc_state_parse(const char *name) {
  for (int s = 0; s < MC_N_STATES; s++)
    if (!strcmp(name, STATE_NAMES[s])) return s;
  return -1;
}

static const char *const RULE_NAMES[MC_OWN_N_RULES] = {"balanced", "chunked"};

const char *mc_own_rule_name(int rule) { return rule >= 0 && rule < MC_OWN_N_RULES ? RULE_NAMES[rule] : "?"; }

int mc_own_rule_parse(const char *name) {
  for (int r = 0; r < MC_OWN_N_RULES; r++)
    if (!strcmp(name, RULE_NAMES[r])) return r;
  return -1;
}

/* Rows of the TP/EP-local slice of a family (its dim 0) and the size of the group it is
 * ZeRO-sharded over: the DP group for dense families, the expert-DP group for experts. */
static int64_t local_rows(const mc_layout *l, const mc_family *f) {
  if (f->place == MC_PLACE_TP && f->split_dim == 0) return f->shape[0] / l->tp;
  if (f->place == MC_PLACE_EP) return f->shape[0] / l->ep;
  return f->shape[0];
}

static int zero_size(const mc_layout *l, const mc_family *f) {
  return f->place == MC_PLACE_EP ? l->tp * l->dp / l->ep : l->dp;
}

/* rotations of families [0, n) into rot (dealing each kind's extra rows round robin) */
static void rotations(const mc_geometry *g, int n, int *rot) {
  int64_t dealt[2] = {0, 0}; /* dense, experts */
  for (int f = 0; f < n; f++) {
    const mc_family *fam = &g->fams.f[f];
    const int kind = fam->place == MC_PLACE_EP, gs = zero_size(&g->layout, fam);
    rot[f] = (int)(dealt[kind] % gs);
    dealt[kind] = (dealt[kind] + local_rows(&g->layout, fam) % gs) % gs;
  }
}

int mc_zero_rotation(const mc_geometry *g, int fam) {
  if (fam < 0 || fam >= g->fams.n) return 0;
  if (g->zero_rot) return g->zero_rot[fam];
  int *rot = malloc(sizeof(int) * (size_t)(fam + 1));
  if (!rot) return -1;
  rotations(g, fam + 1, rot);
  int r = rot[fam];
  free(rot);
  return r;
}

void mc_zero_rows(int rule, int64_t rows, int size, int index, int rot, int64_t *lo, int64_t *hi) {
  if (rule == MC_OWN_CHUNKED) {
    int64_t chunk = (rows + size - 1) / size;
    *lo = chunk * index < rows ? chunk * index : rows;
    *hi = chunk * (index + 1) < rows ? chunk * (index + 1) : rows;
    return;
  }
  /* balanced: q rows each, one more for the r members rot, rot+1, ..., rot+r-1 (mod size) */
  const int64_t q = rows / size, r = rows % size, i = index;
  int64_t before; /* extra rows of the members before i */
  if (rot + r <= size) {
    before = i - rot < 0 ? 0 : (i - rot > r ? r : i - rot);
  } else {
    int64_t wrap = rot + r - size, tail = size - rot;
    before = (i < wrap ? i : wrap) + (i - rot < 0 ? 0 : (i - rot > tail ? tail : i - rot));
  }
  const int extra = ((i - rot) % size + size) % size < r;
  *lo = i * q + before;
  *hi = *lo + q + extra;
}

int mc_geometry_build(const mc_model *m, const mc_layout *l, const mc_train_cfg *train, int launched_world,
                      mc_geometry *g) {
  memset(g, 0, sizeof *g);
  mc_errlist errs;
  mc_errlist_init(&errs);
  mc_model_check(m, &errs);
  if (errs.n == 0) mc_layout_check(m, l, train, launched_world, &errs);
  if (l->own_rule < 0 || l->own_rule >= MC_OWN_N_RULES)
    mc_errlist_add(&errs, "ownership rule %d unknown (0 balanced, 1 chunked)", l->own_rule);
  if (mc_errlist_raise(&errs, "invalid model or layout")) return -1;
  g->model = *m;
  g->layout = *l;
  /* An explicit split without pipes (one stage) is recorded as "equal": a pattern without
   * '|' is not a split the config reader accepts back. */
  if (l->pp == 1 && l->split == MC_SPLIT_EXPLICIT) {
    g->layout.split = MC_SPLIT_EQUAL;
    g->layout.split_pattern[0] = 0;
  }
  g->world = mc_layout_world(l);
  if (mc_stage_map_build(m, l, &g->stages)) return -1;
  if (mc_families_build(m, l->sp, &g->fams)) return -1;
  g->zero_rot = malloc(sizeof(int) * (size_t)(g->fams.n > 0 ? g->fams.n : 1));
  if (!g->zero_rot) {
    mc_families_free(&g->fams);
    return mc_error("out of memory building the geometry");
  }
  rotations(g, g->fams.n, g->zero_rot);
  return 0;
}

void mc_geometry_free(mc_geometry *g) {
  mc_families_free(&g->fams);
  free(g->zero_rot);
  g->zero_rot = NULL;
}

int mc_family_stage(const mc_geometry *g, int fam) {
  const mc_family *f = &g->fams.f[fam];
  if (f->layer >= 0) return g->stages.stage_of_layer[f->layer];
  return f->role == MC_ROLE_EMBED ? 0 : g->layout.pp - 1;
}

/* The group a state is ZeRO-sharded over: the DP group for dense families (index dp_rank),
 * the expert-DP group for experts (index li / ep). */
static void zero_group(const mc_geometry *g, const mc_family *f, const mc_coords *c, int *size, int *index) {
  const mc_layout *l = &g->layout;
  if (f->place == MC_PLACE_EP) {
    *size = l->tp * l->dp / l->ep;
    *index = c->ep_group;
  } else {
    *size = l->dp;
    *index = c->dp_rank;
  }
}

int mc_shard_of(const mc_geometry *g, int fam, mc_state state, int rank, mc_shard *out) {
  const mc_layout *l = &g->layout;
  if (fam < 0 || fam >= g->fams.n) return mc_error("family index %d out of range [0, %d)", fam, g->fams.n);
  if (rank < 0 || rank >= g->world) return mc_error("rank %d out of range [0, %d)", rank, g->world);
  if (state < 0 || state >= MC_N_STATES) return mc_error("state kind %d unknown", (int)state);
  const mc_family *f = &g->fams.f[fam];
  mc_coords c;
  mc_layout_coords(l, rank, &c);
  memset(out, 0, sizeof *out);
  out->stage = mc_family_stage(g, fam);
  out->ndim = f->ndim;
  out->primary_rank = -1;
  out->zero_group = 1;
  out->in_stage = c.pp_rank == out->stage;
  if (!out->in_stage) return 0;

  /* 1. The TP/EP-local slice the rank computes with. */
  for (int i = 0; i < f->ndim; i++) out->local_count[i] = f->shape[i];
  if (f->place == MC_PLACE_TP) {
    int64_t part = f->shape[f->split_dim] / l->tp;
    out->local_start[f->split_dim] = part * c.tp_rank;
    out->local_count[f->split_dim] = part;
  } else if (f->place == MC_PLACE_EP) {
    int64_t part = f->shape[0] / l->ep;
    out->local_start[0] = part * c.ep_rank;
    out->local_count[0] = part;
  }

  /* 2. The stored state: the local slice, split on dim 0 over the ZeRO group when zero >= 1
   * (mc_zero_rows under the layout's rule). Every state kind follows the same rule (master
   * weights and both moments); the state only picks the primary (step 3). */
  memcpy(out->start, out->local_start, sizeof out->start);
  memcpy(out->count, out->local_count, sizeof out->count);
  int gsize, gindex;
  zero_group(g, f, &c, &gsize, &gindex);
  if (l->zero > 0) {
    int64_t lo, hi;
    mc_zero_rows(l->own_rule, out->local_count[0], gsize, gindex, mc_zero_rotation(g, fam), &lo, &hi);
    out->start[0] = out->local_start[0] + lo;
    out->count[0] = hi - lo;
    out->zero_group = gsize;
    out->zero_index = gindex;
  }
  out->numel = 1;
  for (int i = 0; i < f->ndim; i++) out->numel *= out->count[i];
  out->held = out->numel > 0;
  if (!out->held) return 0;

  /* 3. Replicas: ranks of the stage whose hyperslab is the same. Which coordinates the
   * hyperslab depends on follows from steps 1-2 (a nonempty part of one member differs from
   * every other member's); the replicas vary the others, listed ascending below as
   * base + step * k, k = 0..n-1. The primary is the one at position 0 (chunked) or
   * (3*fam + state) % n (balanced). (tests/core/test_ownership.c checks this against brute
   * force.) */
  int sharded = l->zero > 0, base = 0, step = 1;
  const int stage0 = l->tp * l->dp * c.pp_rank;
  switch (f->place) {
    case MC_PLACE_REPLICATED: /* depends on dp_rank only when sharded: the TP group, or the stage */
      base = sharded ? mc_layout_rank_of(l, 0, c.dp_rank, c.pp_rank) : stage0;
      out->n_replicas = sharded ? l->tp : l->tp * l->dp;
      break;
    case MC_PLACE_TP: /* depends on tp_rank, and on dp_rank when sharded: the DP group, or itself */
      base = sharded ? rank : mc_layout_rank_of(l, c.tp_rank, 0, c.pp_rank);
      step = l->tp;
      out->n_replicas = sharded ? 1 : l->dp;
      break;
    case MC_PLACE_EP: /* depends on ep_rank, and on li / ep when sharded: the expert-DP group, or itself */
      base = sharded ? rank : stage0 + c.ep_rank;
      step = l->ep;
      out->n_replicas = sharded ? 1 : l->tp * l->dp / l->ep;
      break;
  }
  int pos = l->own_rule == MC_OWN_CHUNKED ? 0 : (int)(((int64_t)MC_N_STATES * fam + state) % out->n_replicas);
  out->primary_rank = base + step * pos;
  out->primary = out->primary_rank == rank;
  return 0;
}

static int same_slab(const mc_shard *a, const mc_shard *b) {
  if (!a->held || !b->held || a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->start[i] != b->start[i] || a->count[i] != b->count[i]) return 0;
  return 1;
}

int mc_shard_replicas(const mc_geometry *g, int fam, mc_state state, int rank, int *out) {
  mc_shard me, other;
  if (mc_shard_of(g, fam, state, rank, &me) || !me.held) return 0;
  int n = 0;
  for (int r = 0; r < g->world; r++) {
    if (mc_shard_of(g, fam, state, r, &other)) return 0;
    if (same_slab(&me, &other)) out[n++] = r;
  }
  return n;
}

void mc_placement_rule(const mc_geometry *g, int fam, char *buf, int cap) {
  const mc_family *f = &g->fams.f[fam];
  int n;
  if (f->place == MC_PLACE_REPLICATED)
    n = snprintf(buf, (size_t)cap, "replicated");
  else
    n = snprintf(buf, (size_t)cap, "%s(dim=%d)", mc_place_name(f->place), f->split_dim);
  if (g->layout.zero > 0 && n >= 0 && n < cap)
    snprintf(buf + n, (size_t)(cap - n), g->layout.own_rule == MC_OWN_CHUNKED ? " x zero(dim=0)" : " x zero_balanced(dim=0)");
}
