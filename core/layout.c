#include "core/layout.h"

#include <stdio.h>
#include <string.h>

#include "core/blocks.h"

int mc_layout_world(const mc_layout *l) { return l->tp * l->dp * l->pp; }

int mc_layout_rank_of(const mc_layout *l, int tp_rank, int dp_rank, int pp_rank) {
  return tp_rank + l->tp * (dp_rank + l->dp * pp_rank);
}

void mc_layout_coords(const mc_layout *l, int rank, mc_coords *c) {
  c->rank = rank;
  c->tp_rank = rank % l->tp;
  c->dp_rank = (rank / l->tp) % l->dp;
  c->pp_rank = rank / (l->tp * l->dp);
  c->li = c->tp_rank + l->tp * c->dp_rank;
  int ep = l->ep > 0 ? l->ep : 1;
  c->ep_rank = c->li % ep;
  c->ep_group = c->li / ep;
}

/* Members of a group are the ranks whose coordinates match `rank` on everything the
 * predicate keeps fixed; enumerating the world keeps the order ascending. */
typedef int (*same_group_fn)(const mc_coords *a, const mc_coords *b);
static int same_tp(const mc_coords *a, const mc_coords *b) { return a->dp_rank == b->dp_rank && a->pp_rank == b->pp_rank; }
static int same_dp(const mc_coords *a, const mc_coords *b) { return a->tp_rank == b->tp_rank && a->pp_rank == b->pp_rank; }
static int same_pp(const mc_coords *a, const mc_coords *b) { return a->tp_rank == b->tp_rank && a->dp_rank == b->dp_rank; }
static int same_ep(const mc_coords *a, const mc_coords *b) { return a->pp_rank == b->pp_rank && a->ep_group == b->ep_group; }
static int same_edp(const mc_coords *a, const mc_coords *b) { return a->pp_rank == b->pp_rank && a->ep_rank == b->ep_rank; }

static int group_members(const mc_layout *l, int rank, int *out, same_group_fn same) {
  mc_coords me, c;
  mc_layout_coords(l, rank, &me);
  int n = 0, world = mc_layout_world(l);
  for (int r = 0; r < world; r++) {
    mc_layout_coords(l, r, &c);
    if (same(&me, &c)) out[n++] = r;
  }
  return n;
}

int mc_group_tp(const mc_layout *l, int rank, int *out) { return group_members(l, rank, out, same_tp); }
int mc_group_dp(const mc_layout *l, int rank, int *out) { return group_members(l, rank, out, same_dp); }
int mc_group_pp(const mc_layout *l, int rank, int *out) { return group_members(l, rank, out, same_pp); }
int mc_group_ep(const mc_layout *l, int rank, int *out) { return group_members(l, rank, out, same_ep); }
int mc_group_edp(const mc_layout *l, int rank, int *out) { return group_members(l, rank, out, same_edp); }

static int has_block(const mc_model *m, char b) { return strchr(m->pattern, b) != NULL; }

int mc_model_check(const mc_model *m, mc_errlist *e) {
  int before = e->n;
  int n = (int)strlen(m->pattern);
  if (n == 0) mc_errlist_add(e, "model.pattern is empty");
  if (n != m->n_layers) mc_errlist_add(e, "model.n_layers=%d does not match pattern length %d", m->n_layers, n);
  for (int i = 0; i < n; i++)
    if (!mc_block_kind_of(m->pattern[i]))
      mc_errlist_add(e, "model.pattern: unknown block letter '%c' at position %d (known: A, M, E, R)", m->pattern[i], i);
  if (m->vocab_size < 1) mc_errlist_add(e, "model.vocab_size=%d must be >= 1", m->vocab_size);
  if (m->vocab_pad < 1) mc_errlist_add(e, "model.vocab_pad=%d must be >= 1", m->vocab_pad);
  if (m->d_model < 1) mc_errlist_add(e, "model.d_model=%d must be >= 1", m->d_model);
  if (m->seq_len < 1) mc_errlist_add(e, "model.seq_len=%d must be >= 1", m->seq_len);
  for (const char *k = mc_block_letters(); *k; k++)
    if (has_block(m, *k)) mc_block_kind_of(*k)->check_model(m, e);
  return e->n - before;
}

static void check_divides(mc_errlist *e, const char *what, int v, const char *of, int n) {
  if (v > 0 && n % v) mc_errlist_add(e, "%s=%d does not divide %s=%d", what, v, of, n);
}

int mc_layout_check(const mc_model *m, const mc_layout *l, const mc_train_cfg *t, int launched, mc_errlist *e) {
  int before = e->n;
  if (l->tp < 1) mc_errlist_add(e, "tp=%d must be >= 1", l->tp);
  if (l->pp < 1) mc_errlist_add(e, "pp=%d must be >= 1", l->pp);
  if (l->dp < 1) mc_errlist_add(e, "dp=%d must be >= 1", l->dp);
  if (l->ep < 1) mc_errlist_add(e, "ep=%d must be >= 1", l->ep);
  if (l->zero != 0 && l->zero != 1 && l->zero != 3) mc_errlist_add(e, "zero=%d is not one of 0, 1, 3", l->zero);
  if (l->pp > MC_MAX_STAGES) mc_errlist_add(e, "pp=%d exceeds the supported maximum of %d stages", l->pp, MC_MAX_STAGES);
  if (e->n > before) return e->n - before; /* the rules below divide by these */

  for (const char *k = mc_block_letters(); *k; k++) {
    const mc_block_kind *bk = mc_block_kind_of(*k);
    if (!has_block(m, *k)) continue;
    for (int i = 0; i < bk->n_tp_divides; i++)
      check_divides(e, "tp", l->tp, bk->tp_divides_name[i], (int)mc_dim_of(m, bk->tp_divides[i]));
  }
  check_divides(e, "tp", l->tp, "padded vocab", mc_vocab_padded(m));
  int has_ep = 0;
  for (const char *k = mc_block_letters(); *k; k++) {
    const mc_block_kind *bk = mc_block_kind_of(*k);
    if (!has_block(m, *k) || bk->ep_divides == MC_DIM_NONE) continue;
    has_ep = 1;
    check_divides(e, "ep", l->ep, "n_experts", (int)mc_dim_of(m, bk->ep_divides));
  }
  if (l->ep > 1 && !has_ep) mc_errlist_add(e, "ep=%d needs E blocks but the pattern has none", l->ep);
  check_divides(e, "ep", l->ep, "tp*dp", l->tp * l->dp);
  if (l->tp > 1 && l->ep > 1 && !l->sp) mc_errlist_add(e, "tp=%d with ep=%d requires sp (sequence parallelism)", l->tp, l->ep);
  if (l->sp && l->tp > 1) check_divides(e, "tp (sp)", l->tp, "seq_len", m->seq_len);
  if (l->pp > m->n_layers)
    mc_errlist_add(e, "pp=%d leaves an empty stage: the model has only %d layers", l->pp, m->n_layers);
  if (l->split == MC_SPLIT_EXPLICIT) {
    int pipes = 0, letters = 0, run = 0, empty = 0;
    char flat[MC_MAX_LAYERS + 1];
    for (const char *p = l->split_pattern; *p; p++) {
      if (*p == '|') {
        pipes++;
        if (run == 0) empty = 1;
        run = 0;
      } else {
        if (letters < MC_MAX_LAYERS) flat[letters] = *p;
        letters++;
        run++;
      }
    }
    if (run == 0) empty = 1;
    flat[letters < MC_MAX_LAYERS ? letters : MC_MAX_LAYERS] = 0;
    if (pipes != l->pp - 1)
      mc_errlist_add(e, "explicit split \"%s\" has %d pipes but pp=%d needs pp-1=%d", l->split_pattern, pipes, l->pp, l->pp - 1);
    if (empty) mc_errlist_add(e, "explicit split \"%s\" has an empty stage", l->split_pattern);
    if (strcmp(flat, m->pattern))
      mc_errlist_add(e, "explicit split \"%s\" does not spell the model pattern \"%s\"", l->split_pattern, m->pattern);
  }
  if (t) {
    int per_step = t->micro_batch * l->dp;
    if (t->micro_batch < 1) mc_errlist_add(e, "micro_batch=%d must be >= 1", t->micro_batch);
    else if (t->global_batch < 1 || t->global_batch % per_step)
      mc_errlist_add(e, "global_batch=%d is not divisible by micro_batch*dp=%d*%d=%d", t->global_batch, t->micro_batch, l->dp, per_step);
  }
  if (launched >= 0 && launched != mc_layout_world(l))
    mc_errlist_add(e, "world size tp*dp*pp=%d*%d*%d=%d does not equal the %d ranks launched", l->tp, l->dp, l->pp,
                   mc_layout_world(l), launched);
  return e->n - before;
}
