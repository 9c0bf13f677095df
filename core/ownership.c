#include "core/ownership.h"

#include "core/optim_groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const STATE_NAMES[MC_N_STATES] = {"param", "exp_avg", "exp_avg_sq", "momentum", "step"};

const char *mc_state_name(mc_state s) { return s >= 0 && s < MC_N_STATES ? STATE_NAMES[s] : "?"; }

int mc_state_parse(const char *name) {
  for (int s = 0; s < MC_N_STATES; s++)
    if (!strcmp(name, STATE_NAMES[s])) return s;
  return -1;
}

int mc_state_is_scalar(mc_state s) { return s == MC_STATE_STEP; }

int mc_state_shape(int ndim, const int64_t *fam_shape, mc_state s, int64_t shape[3]) {
  if (mc_state_is_scalar(s)) {
    shape[0] = 1;
    return 1;
  }
  for (int d = 0; d < ndim; d++) shape[d] = fam_shape[d];
  return ndim;
}

static const char *const RULE_NAMES[MC_OWN_N_RULES] = {"balanced-v2", "balanced", "chunked"};

const char *mc_own_rule_name(int rule) { return rule >= 0 && rule < MC_OWN_N_RULES ? RULE_NAMES[rule] : "?"; }

int mc_own_rule_parse(const char *name) {
  for (int r = 0; r < MC_OWN_N_RULES; r++)
    if (!strcmp(name, RULE_NAMES[r])) return r;
  return -1;
}

/* Extents of the TP/EP-local slice of a family and the size of the group it is ZeRO-sharded
 * over: the DP group for dense families, the expert-DP group for experts. */
static void local_dims(const mc_layout *l, const mc_family *f, int64_t *D) {
  for (int d = 0; d < f->ndim; d++) D[d] = f->shape[d];
  if (f->place == MC_PLACE_TP) D[f->split_dim] /= l->tp;
  if (f->place == MC_PLACE_EP) D[0] /= l->ep;
}

static int zero_size(const mc_layout *l, const mc_family *f) {
  return f->place == MC_PLACE_EP ? l->tp * l->dp / l->ep : l->dp;
}

/* Cells of balanced-v2 with split dim k > 0: m cells (the prefix product before k), `size`
 * members dealt q = size / m to each and one more to the first size % m cells, in order.
 * Member `index` is number *j of the *gc members of cell *c, whose first member is *first. */
static void v2_cell(int64_t m, int size, int index, int64_t *c, int *j, int *gc, int *first) {
  const int64_t q = size / m, r = size % m, big = r * (q + 1);
  *c = index < big ? index / (q + 1) : r + (index - big) / q;
  *gc = (int)(q + (*c < r));
  *first = (int)(*c * q + (*c < r ? *c : r));
  *j = index - *first;
}

/* e(f): how far family f advances the deal of extra rows (mc_zero_rotation) */
static int64_t extra_rows(int rule, const mc_family *f, const int64_t *D, int gs) {
  const int k = mc_zero_split_dim(rule, f->ndim, D, gs);
  if (k == 0) return D[0] % gs;
  int64_t m = 1, c;
  for (int d = 0; d < k; d++) m *= D[d];
  int j, gc, first;
  v2_cell(m, gs, 0, &c, &j, &gc, &first);
  return D[k] % gc;
}

/* rotations of families [0, n) into rot (dealing each kind's extra rows round robin) */
static void rotations(const mc_geometry *g, int n, int *rot) {
  int64_t dealt[2] = {0, 0}; /* dense, experts */
  for (int f = 0; f < n; f++) {
    const mc_family *fam = &g->fams.f[f];
    const int kind = fam->place == MC_PLACE_EP, gs = zero_size(&g->layout, fam);
    int64_t D[3] = {1, 1, 1}; /* ndim <= 3; set for the compiler too */
    local_dims(&g->layout, fam, D);
    rot[f] = (int)(dealt[kind] % gs);
    dealt[kind] = (dealt[kind] + extra_rows(g->layout.own_rule, fam, D, gs)) % gs;
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

int mc_zero_split_dim(int rule, int ndim, const int64_t *local, int size) {
  if (rule != MC_OWN_BALANCED_V2 || ndim < 2 || local[0] >= size) return 0;
  int64_t prefix = local[0];
  for (int k = 1; k < ndim; k++) {
    prefix *= local[k];
    if (prefix >= size) return k;
  }
  return 0; /* fewer elements than members: dim 0, as the balanced rule */
}

int mc_zero_part(int rule, int ndim, const int64_t *local, int size, int index, int rot, int64_t *lo, int64_t *cnt) {
  for (int d = 0; d < ndim; d++) lo[d] = 0, cnt[d] = local[d];
  const int k = mc_zero_split_dim(rule, ndim, local, size);
  int64_t a, b;
  if (k == 0) {
    mc_zero_rows(rule, local[0], size, index, rot, &a, &b);
    lo[0] = a, cnt[0] = b - a;
    return 0;
  }
  /* balanced-v2, k > 0: the member's cell (one index of each dimension before k, row-major),
   * then its balanced part of Dk among the cell's members */
  int64_t m = 1, c;
  for (int d = 0; d < k; d++) m *= local[d];
  int j, gc, first;
  v2_cell(m, size, index, &c, &j, &gc, &first);
  for (int d = k - 1; d >= 0; d--) lo[d] = c % local[d], cnt[d] = 1, c /= local[d];
  mc_zero_rows(MC_OWN_BALANCED, local[k], gc, j, rot % gc, &a, &b);
  lo[k] = a, cnt[k] = b - a;
  return k;
}

int mc_geometry_build(const mc_model *m, const mc_layout *l, const mc_train_cfg *train, int launched_world,
                      mc_geometry *g) {
  memset(g, 0, sizeof *g);
  mc_errlist errs;
  mc_errlist_init(&errs);
  mc_model_check(m, &errs);
  if (errs.n == 0) mc_layout_check(m, l, train, launched_world, &errs);
  if (l->own_rule < 0 || l->own_rule >= MC_OWN_N_RULES)
    mc_errlist_add(&errs, "ownership rule %d unknown (0 balanced-v2, 1 balanced, 2 chunked)", l->own_rule);
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
  /* an empty value (a zeroed mc_train_cfg; the config key needs at least one rule) is the default */
  if (train && train->optim.groups[0] && mc_optim_groups_assign(train->optim.groups, &g->fams) != 0) {
    mc_families_free(&g->fams);
    return -1;
  }
  g->zero_rot = malloc(sizeof(int) * (size_t)(g->fams.n > 0 ? g->fams.n : 1));
  if (!g->zero_rot) {
    mc_families_free(&g->fams);
    return mc_error("out of memory building the geometry");
  }
  rotations(g, g->fams.n, g->zero_rot);
  return 0;
}

int mc_geometry_of_config(const mc_config *cfg, const mc_layout *layout, mc_geometry *g) {
  if (mc_geometry_build(&cfg->model, layout ? layout : &cfg->parallel, NULL, -1, g) != 0) return -1;
  if (mc_optim_groups_assign(cfg->train.optim.groups, &g->fams) != 0) {
    mc_geometry_free(g);
    return -1;
  }
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

/* The members of a ZeRO group of `gs` whose part of a local slice D (mc_zero_part) is not
 * empty: *count of them, the lowest *lowest. Only dim-0 splits leave members empty: chunked
 * gives rows to the first ceil(rows / chunk), balanced with fewer rows than members to
 * members rot, ..., rot+rows-1 (mod gs). (tests/core/test_ownership.c checks this
 * against mc_zero_part.) */
static void zero_nonempty(int rule, int ndim, const int64_t *D, int gs, int rot, int *count, int *lowest) {
  const int64_t rows = D[0];
  *count = gs, *lowest = 0;
  if (rule == MC_OWN_CHUNKED) { /* chunk = ceil(rows / gs): ceil(rows / chunk) members */
    const int64_t chunk = (rows + gs - 1) / gs;
    *count = (int)(rows > 0 ? (rows + chunk - 1) / chunk : 0);
    return;
  }
  if (mc_zero_split_dim(rule, ndim, D, gs) > 0 || rows >= gs) return;
  *count = (int)rows;
  *lowest = rot + rows > gs ? 0 : rot;
}

/* Step 2 of mc_shard_of for a scalar kind: out holds the rank's param hyperslab; the scalar
 * is held where that is not empty, by every such rank of the stage. */
static int scalar_shard(const mc_geometry *g, const mc_family *f, int fam, int rank, const mc_coords *c, mc_shard *out) {
  const mc_layout *l = &g->layout;
  out->ndim = 1;
  memset(out->local_start, 0, sizeof out->local_start), memset(out->start, 0, sizeof out->start);
  memset(out->local_count, 0, sizeof out->local_count), memset(out->count, 0, sizeof out->count);
  out->local_count[0] = 1;
  out->zero_group = 1, out->zero_index = 0, out->zero_dim = 0;
  if (!out->held) {
    out->numel = 0;
    return 0;
  }
  out->count[0] = 1, out->numel = 1;
  /* holders: every rank of the stage whose ZeRO member index is a nonempty member; the
   * members are dp_rank (dense, tp ranks each) or li / ep (experts, ep ranks each) */
  const int per = f->place == MC_PLACE_EP ? l->ep : l->tp, gs = zero_size(l, f);
  int members = gs, lowest = 0;
  if (l->zero > 0) {
    int64_t D[3] = {1, 1, 1}; /* ndim <= 3; set for the compiler too */
    local_dims(l, f, D);
    zero_nonempty(l->own_rule, f->ndim, D, gs, mc_zero_rotation(g, fam), &members, &lowest);
  }
  out->n_replicas = members * per;
  out->primary_rank = l->tp * l->dp * c->pp_rank + per * lowest;
  out->primary = out->primary_rank == rank;
  return 0;
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
  out->ndim = mc_state_is_scalar(state) ? 1 : f->ndim; /* a scalar kind: shape [1] */
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

  /* 2. The stored state: the local slice, split over the ZeRO group when zero >= 1
   * (mc_zero_part under the layout's rule: dim 0, or under balanced-v2 the split dimension
   * and the member's cell). Every state kind follows the same rule (master weights and both
   * moments); the state only picks the primary (step 3). */
  memcpy(out->start, out->local_start, sizeof out->start);
  memcpy(out->count, out->local_count, sizeof out->count);
  int gsize, gindex;
  zero_group(g, f, &c, &gsize, &gindex);
  if (l->zero > 0) {
    int64_t lo[3], cnt[3];
    out->zero_dim = mc_zero_part(l->own_rule, f->ndim, out->local_count, gsize, gindex, mc_zero_rotation(g, fam), lo, cnt);
    for (int i = 0; i < f->ndim; i++) out->start[i] = out->local_start[i] + lo[i], out->count[i] = cnt[i];
    out->zero_group = gsize;
    out->zero_index = gindex;
  }
  out->numel = 1;
  for (int i = 0; i < f->ndim; i++) out->numel *= out->count[i];
  out->held = out->numel > 0;
  if (mc_state_is_scalar(state)) return scalar_shard(g, f, fam, rank, &c, out);
  if (!out->held) return 0;

  /* 3. Replicas: ranks of the stage whose hyperslab is the same. Which coordinates the
   * hyperslab depends on follows from steps 1-2 (a nonempty part of one member differs from
   * every other member's); the replicas vary the others, listed ascending below as
   * base + step * k, k = 0..n-1. The primary is the one at position 0 (chunked) or
   * (3*fam + state) % n (balanced, balanced-v2). (tests/core/test_ownership.c checks this against brute
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
  int pos = l->own_rule == MC_OWN_CHUNKED ? 0 : (int)(((int64_t)MC_PRIMARY_FAMILY_STRIDE * fam + state) % out->n_replicas);
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
  if (g->layout.zero <= 0 || n < 0 || n >= cap) return;
  const int rule = g->layout.own_rule;
  if (rule == MC_OWN_CHUNKED) {
    snprintf(buf + n, (size_t)(cap - n), " x zero(dim=0)");
  } else if (rule == MC_OWN_BALANCED) {
    snprintf(buf + n, (size_t)(cap - n), " x zero_balanced(dim=0)");
  } else {
    int64_t D[3] = {1, 1, 1}; /* ndim <= 3; set for the compiler too */
    local_dims(&g->layout, f, D);
    snprintf(buf + n, (size_t)(cap - n), " x zero_balanced_v2(dim=%d)", mc_zero_split_dim(rule, f->ndim, D, zero_size(&g->layout, f)));
  }
}
