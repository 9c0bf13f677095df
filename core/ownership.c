#include "core/ownership.h"

#include <stdio.h>
#include <string.h>

static const char *const STATE_NAMES[MC_N_STATES] = {"param", "exp_avg", "exp_avg_sq"};

const char *mc_state_name(mc_state s) { return s >= 0 && s < MC_N_STATES ? STATE_NAMES[s] : "?"; }

int mc_state_parse(const char *name) {
  for (int s = 0; s < MC_N_STATES; s++)
    if (!strcmp(name, STATE_NAMES[s])) return s;
  return -1;
}

int mc_geometry_build(const mc_model *m, const mc_layout *l, const mc_train_cfg *train, int launched_world,
                      mc_geometry *g) {
  memset(g, 0, sizeof *g);
  mc_errlist errs;
  mc_errlist_init(&errs);
  mc_model_check(m, &errs);
  if (errs.n == 0) mc_layout_check(m, l, train, launched_world, &errs);
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
  return 0;
}

void mc_geometry_free(mc_geometry *g) { mc_families_free(&g->fams); }

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

  /* 2. The stored state: the local slice, split on dim 0 over the ZeRO group when zero >= 1.
   * Every state kind follows the same rule (master weights and both moments). */
  (void)state;
  memcpy(out->start, out->local_start, sizeof out->start);
  memcpy(out->count, out->local_count, sizeof out->count);
  int gsize, gindex;
  zero_group(g, f, &c, &gsize, &gindex);
  if (l->zero > 0) {
    int64_t rows = out->local_count[0];
    int64_t chunk = (rows + gsize - 1) / gsize;
    int64_t lo = chunk * gindex < rows ? chunk * gindex : rows;
    int64_t hi = chunk * (gindex + 1) < rows ? chunk * (gindex + 1) : rows;
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
   * hyperslab depends on follows from steps 1-2; the lowest rank varying the others is the
   * primary. (tests/core/test_ownership.c checks this against brute force.) */
  int sharded = l->zero > 0;
  switch (f->place) {
    case MC_PLACE_REPLICATED: /* depends on dp_rank only when sharded */
      out->primary_rank = mc_layout_rank_of(l, 0, sharded ? c.dp_rank : 0, c.pp_rank);
      out->n_replicas = sharded ? l->tp : l->tp * l->dp;
      break;
    case MC_PLACE_TP: /* depends on tp_rank, and on dp_rank when sharded */
      out->primary_rank = mc_layout_rank_of(l, c.tp_rank, sharded ? c.dp_rank : 0, c.pp_rank);
      out->n_replicas = sharded ? 1 : l->dp;
      break;
    case MC_PLACE_EP: { /* depends on ep_rank, and on li / ep when sharded */
      int li = sharded ? c.li : c.ep_rank;
      out->primary_rank = li + l->tp * l->dp * c.pp_rank;
      out->n_replicas = sharded ? 1 : l->tp * l->dp / l->ep;
      break;
    }
  }
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
  if (g->layout.zero > 0 && n >= 0 && n < cap) snprintf(buf + n, (size_t)(cap - n), " x zero(dim=0)");
}
