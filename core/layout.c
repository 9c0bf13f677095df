#include "core/layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/blocks.h"
#include "core/holdings.h"
#include "util/checked.h"

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

/* ------------------------------------------------------------------ sizes (issue 17 item 9)
 * Every size the trainer and mcplan compute from a configuration is a product of these keys;
 * each is bounded alone by its range (core/config.c), and the products are bounded here with
 * checked arithmetic, so that no size computed later overflows int64: a parameter count of at
 * most MC_MAX_PARAMS elements (its bytes, times the optimizer's copies, summed), an activation
 * or expert-exchange buffer of at most MC_MAX_BUF_ELEMS elements (summed over buffers, layers
 * and micro-batches in flight). */

/* The configuration keys a width is made of, for messages. */
static const char *dim_keys(mc_dim d) {
  switch (d) {
    case MC_DIM_D: return "model.d_model";
    case MC_DIM_VP: return "model.vocab_size (padded to model.vocab_pad)";
    case MC_DIM_Q: return "model.n_heads*model.head_dim";
    case MC_DIM_KV: return "model.n_kv_heads*model.head_dim";
    case MC_DIM_H: return "model.n_heads";
    case MC_DIM_KVH: return "model.n_kv_heads";
    case MC_DIM_DI: return "model.mamba_inner";
    case MC_DIM_HM: return "model.mamba_inner/model.mamba_head_dim";
    case MC_DIM_N: return "model.ssm_state";
    case MC_DIM_CONV: return "model.conv_width";
    case MC_DIM_E: return "model.n_experts";
    case MC_DIM_K: return "model.top_k";
    case MC_DIM_F: return "model.expert_hidden";
    case MC_DIM_KD: return "model.top_k*model.d_model";
    case MC_DIM_KF: return "model.top_k*model.expert_hidden";
    case MC_DIM_DR: return "model.rec_width";
    default: return "1";
  }
}

static void check_model_sizes(const mc_model *m, mc_errlist *e) {
  /* the capacity is an int (mc_moe_capacity): ceil(T*k/E*cf) */
  if (has_block(m, 'E') && m->capacity_factor > 0 && m->n_experts > 0 &&
      ceil((double)m->seq_len * m->top_k / m->n_experts * m->capacity_factor) > 2147483647.0)
    mc_errlist_add(e, "model.capacity_factor=%g: capacity ceil(model.seq_len*model.top_k/model.n_experts*cf) is above 2^31-1",
                   m->capacity_factor);
  /* the parameter count: embedding and head (Vp x d), the norms, every layer's families */
  int64_t total = 0, fam = 0;
  const int64_t d = m->d_model, vp = mc_vocab_padded(m);
  if (mc_mul_i64(vp, d, &fam) || mc_mul_i64(fam, 2, &fam) || mc_add_i64(total, fam, &total) || total > MC_MAX_PARAMS) {
    mc_errlist_add(e, "model.vocab_size=%d (padded %lld) x model.d_model=%d: embedding and head exceed 2^56 parameters",
                   m->vocab_size, (long long)vp, m->d_model);
    return;
  }
  for (int L = 0; L < m->n_layers; L++) {
    const mc_block_kind *k = mc_block_kind_of(m->pattern[L]);
    if (!k) continue;
    for (int i = -1; i < k->n_families; i++) {
      const mc_dim *sh = i < 0 ? (const mc_dim[3]){MC_DIM_D, MC_DIM_NONE, MC_DIM_NONE} : k->families[i].shape;
      int ok = 1;
      fam = 1;
      for (int j = 0; j < 3 && sh[j] != MC_DIM_NONE && ok; j++) ok = mc_mul_i64(fam, mc_dim_of(m, sh[j]), &fam) == 0;
      if (!ok || mc_add_i64(total, fam, &total) || total > MC_MAX_PARAMS) {
        char shape[200];
        int off = 0;
        for (int j = 0; j < 3 && sh[j] != MC_DIM_NONE; j++)
          off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%s=%lld", j ? " x " : "", dim_keys(sh[j]),
                          (long long)mc_dim_of(m, sh[j]));
        mc_errlist_add(e, "model: more than 2^56 parameters by layer %d (%c): a tensor of %.180s", L, m->pattern[L], shape);
        return;
      }
    }
  }
}

/* One activation buffer of rows x width elements, rows for a micro-batch of n_seq sequences. */
static int check_buf(const mc_model *m, const mc_act_buf *b, int n_seq, const char *where, mc_errlist *e) {
  int64_t rows = 1, n;
  const char *rk = "1";
  if (b->rows == MC_ROWS_TOKENS || b->rows == MC_ROWS_RESIDUAL) rows = (int64_t)n_seq * m->seq_len, rk = "train.micro_batch x model.seq_len";
  else if (b->rows == MC_ROWS_SEQS) rows = n_seq, rk = "train.micro_batch";
  if (mc_mul_i64(rows, mc_dim_of(m, b->width), &n) == 0 && n <= MC_MAX_BUF_ELEMS) return 0;
  mc_errlist_add(e, "train.micro_batch=%d, model.seq_len=%d: %s buffer %s (%s rows of %s=%lld) exceeds 2^42 elements",
                 n_seq, m->seq_len, where, b->name, rk, dim_keys(b->width), (long long)mc_dim_of(m, b->width));
  return -1;
}

static void check_act_sizes(const mc_model *m, const mc_layout *l, const mc_train_cfg *t, mc_errlist *e) {
  const int nb = t->micro_batch;
  /* the blocks and kernels count a micro-batch's tokens (and rows) in an int */
  if ((int64_t)nb * m->seq_len > 2147483647) {
    mc_errlist_add(e, "train.micro_batch=%d x model.seq_len=%d = %lld tokens per micro-batch: more than 2^31-1", nb,
                   m->seq_len, (long long)nb * m->seq_len);
    return;
  }
  /* routing numbers the (token, choice) pairs and the rows an EP rank receives in int32 */
  if (has_block(m, 'E') && (int64_t)nb * m->seq_len * m->top_k > 2147483647) {
    mc_errlist_add(e, "train.micro_batch=%d x model.seq_len=%d x model.top_k=%d = %lld routed rows per micro-batch: more "
                   "than 2^31-1", nb, m->seq_len, m->top_k, (long long)nb * m->seq_len * m->top_k);
    return;
  }
  for (int i = 0; i < MC_NB_COUNT; i++)
    if (check_buf(m, &mc_net_bufs[i], nb, "network", e)) return;
  for (int i = 0; i < MC_L_NBUFS; i++)
    if (check_buf(m, &mc_layer_bufs[i], nb, "layer", e)) return;
  for (const char *c = mc_block_letters(); *c; c++) {
    const mc_block_kind *k = mc_block_kind_of(*c);
    if (!has_block(m, *c)) continue;
    for (int i = 0; i < k->n_saved; i++)
      if (check_buf(m, &k->saved[i], nb, k->name, e)) return;
    for (int i = 0; i < k->n_saved_i32; i++)
      if (check_buf(m, &k->saved_i32[i], nb, k->name, e)) return;
    for (int i = 0; i < k->n_grads; i++)
      if (check_buf(m, &k->grads[i], nb, k->name, e)) return;
  }
  /* expert parallelism's exchange rows (core/holdings.c): ep sources of micro_batch x T
   * positions, each sending up to min(k, E/ep) rows of width max(d, F) */
  if (has_block(m, 'E') && l->ep > 1) {
    const int64_t el = m->n_experts / l->ep, kk = m->top_k < el ? m->top_k : el;
    const int64_t w = m->expert_hidden > m->d_model ? m->expert_hidden : m->d_model;
    int64_t n;
    if (mc_mul3_i64((int64_t)nb * m->seq_len, l->ep, kk, &n) || n > 2147483647 || mc_mul_i64(n, w, &n) ||
        n > MC_MAX_BUF_ELEMS)
      mc_errlist_add(e, "parallel.ep=%d x train.micro_batch=%d x model.seq_len=%d x model.top_k=%d rows of %s=%lld: the "
                     "expert exchange exceeds 2^31-1 rows or 2^42 elements", l->ep, nb, m->seq_len, m->top_k,
                     w == m->expert_hidden ? "model.expert_hidden" : "model.d_model", (long long)w);
  }
  /* the training state a checkpoint records: tokens seen (steps x global batch x T) below 2^53 */
  int64_t tok;
  if (mc_mul3_i64(t->steps, t->global_batch, m->seq_len, &tok) || tok >= ((int64_t)1 << 53))
    mc_errlist_add(e, "train.steps=%d x train.global_batch=%d x model.seq_len=%d tokens reach 2^53 (the largest count "
                   "a checkpoint records)", t->steps, t->global_batch, m->seq_len);
}

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
  if (e->n == before) check_model_sizes(m, e);
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
  if ((int64_t)l->tp * l->dp * l->pp > MC_MAX_WORLD) { /* also keeps every rank number an int */
    mc_errlist_add(e, "world size parallel.tp*parallel.dp*parallel.pp=%d*%d*%d=%lld is more than %d ranks", l->tp, l->dp,
                   l->pp, (long long)l->tp * l->dp * l->pp, MC_MAX_WORLD);
    return e->n - before;
  }

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
    const int64_t per_step = (int64_t)t->micro_batch * l->dp;
    if (t->micro_batch < 1) mc_errlist_add(e, "micro_batch=%d must be >= 1", t->micro_batch);
    else if (t->global_batch < 1 || t->global_batch % per_step)
      mc_errlist_add(e, "global_batch=%d is not divisible by micro_batch*dp=%d*%d=%lld", t->global_batch, t->micro_batch,
                     l->dp, (long long)per_step);
    else
      check_act_sizes(m, l, t, e);
  }
  if (launched >= 0 && launched != mc_layout_world(l))
    mc_errlist_add(e, "world size tp*dp*pp=%d*%d*%d=%d does not equal the %d ranks launched", l->tp, l->dp, l->pp,
                   mc_layout_world(l), launched);
  return e->n - before;
}
