/* What a rank holds (core/holdings.h). Parameter tensors follow mc_shard_of; activations follow
 * the block-kind table; every tensor is counted at its footprint in its category. */
#include "core/holdings.h"

#include "core/dtype.h"
#include "core/optim_groups.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/checked.h"
#include "util/error.h"

int mc_hold_opts_of(const mc_geometry *g, const mc_train_cfg *t, mc_hold_opts *o) {
  memset(o, 0, sizeof *o);
  if (!strcmp(t->dtype, "bf16")) o->bf16_weights = 1;
  else if (strcmp(t->dtype, "fp32")) return mc_error("train.dtype: unknown dtype '%s' (fp32, bf16)", t->dtype);
  int rc = mc_recompute_parse(t->recompute);
  if (rc < 0) return mc_error("train.recompute: unknown policy '%s' (none, selective, full)", t->recompute);
  o->recompute = (mc_recompute)rc;
  const mc_layout *l = &g->layout;
  if (t->micro_batch <= 0 || l->dp <= 0 || t->global_batch % ((int64_t)t->micro_batch * l->dp) != 0)
    return mc_error("train.global_batch=%d is not a multiple of train.micro_batch=%d * parallel.dp=%d", t->global_batch,
                    t->micro_batch, l->dp);
  /* every layout: under TP the vocab-parallel dlogits follow the head's storage, under SP the
   * shards of bf16 tensors are gathered in bf16 (train/dist_tp.c) */
  o->act16 = o->bf16_weights;
  o->micro_batch = t->micro_batch;
  o->n_micro = (int)(t->global_batch / ((int64_t)t->micro_batch * l->dp));
  o->moe_dense = 1;
  return 0;
}

/* ------------------------------------------------------------------ parameters */

int mc_param_hold_of(const mc_geometry *g, int fam, int rank, const mc_hold_opts *o, mc_param_hold *out) {
  memset(out, 0, sizeof *out);
  const mc_family *f = &g->fams.f[fam];
  out->fam = fam;
  if (mc_shard_of(g, fam, MC_STATE_PARAM, rank, &out->shard)) return -1;
  if (!(out->in_stage = out->shard.in_stage)) return 0;
  const mc_shard *sh = &out->shard;
  out->local_numel = 1;
  for (int i = 0; i < f->ndim; i++) out->local_numel *= sh->local_count[i];
  /* the state hyperslab is one contiguous run of the row-major local slice under every rule
   * (mc_zero_part): its offset is that of its first element */
  int64_t stride = 1;
  out->z_off = 0;
  for (int i = f->ndim - 1; i >= 0; i--) {
    out->z_off += (sh->start[i] - sh->local_start[i]) * stride;
    stride *= sh->local_count[i];
  }
  out->z_numel = sh->numel;
  out->compute_bf16 = o->bf16_weights && mc_role_is_matmul(f->role);
  out->working_bf16 = out->compute_bf16 && g->layout.zero != 3;
  out->param_cat = mc_mem_param_cat(f->place);
  out->working_numel = g->layout.zero == 3 ? out->z_numel : out->local_numel;
  out->working_bytes = out->working_numel * (out->working_bf16 ? 2 : 4);
  out->grad_bytes = out->working_numel * 4;
  out->master_cat = f->decay ? MC_MEM_MASTER_DECAY : MC_MEM_MASTER_NO_DECAY;
  out->moments_cat = f->decay ? MC_MEM_MOMENTS_DECAY : MC_MEM_MOMENTS_NO_DECAY;
  /* fp32 working weights are the master copy themselves; bf16 ones need an fp32 master */
  out->has_master = out->working_bf16;
  out->master_bytes = out->has_master ? sh->numel * 4 : 0;
  out->moment_bytes = sh->numel * 4;
  int n_decl;
  mc_opt_states(f->opt, &n_decl);
  out->n_moments = n_decl;
  for (int st = 0; st < MC_N_STATES; st++) {
    mc_shard ss;
    if (mc_shard_of(g, fam, (mc_state)st, rank, &ss)) return -1;
    const mc_state_decl *d = mc_opt_state_decl(f->opt, (mc_state)st);
    const int64_t esize = (int64_t)mc_elem_dtype_size(mc_opt_state_dtype(f->opt, (mc_state)st)); /* 0 if not kept */
    out->state_bytes[st] = ss.numel * esize;
    out->state_primary[st] = ss.primary;
    out->state_cat[st] = st == MC_STATE_PARAM ? out->param_cat : out->moments_cat;
    if (d && mc_state_is_scalar((mc_state)st)) {
      out->n_moments--; /* declared, but not shaped like the parameter */
      out->n_scalars += ss.held;
      out->scalar_bytes = esize;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ activations */

void mc_act_shape_of(const mc_geometry *g, int stage, const mc_hold_opts *o, int n_seq, mc_act_shape *s) {
  const mc_layout *l = &g->layout;
  memset(s, 0, sizeof *s);
  s->tp = l->tp > 0 ? l->tp : 1;
  s->local = mc_model_local(&g->model, s->tp);
  s->sp = l->sp && s->tp > 1;
  s->ep = l->ep > 0 ? l->ep : 1;
  s->n_seq = n_seq;
  s->T_res = s->sp ? g->model.seq_len / s->tp : g->model.seq_len;
  s->act16 = o->act16;
  /* an E block runs as the plain SwiGLU when it cannot route anything (train/block_moe.c) */
  s->routed = !(o->moe_dense && !s->sp && mc_moe_is_plain(&s->local, s->local.seq_len));
  s->first = stage == 0;
  s->last = stage == l->pp - 1;
}

/* Whether the buffer's conditions hold in a block that routes (`routes`) or not. */
static int exists_in(const mc_act_buf *b, const mc_act_shape *s, int routes) {
  const unsigned w = b->when;
  const int routed = routes && s->routed;
  return !((w & MC_IF_ROUTED) && !routed) && !((w & MC_IF_NOT_ROUTED) && routed) && !((w & MC_IF_ACT16) && !s->act16) &&
         !((w & MC_IF_TP) && s->tp <= 1) && !((w & MC_IF_SP) && !s->sp) && !((w & MC_IF_FIRST) && !s->first) &&
         !((w & MC_IF_LAST) && !s->last) && !((w & MC_IF_NO_EP) && s->ep > 1);
}

int mc_act_buf_exists(const mc_act_buf *b, const mc_act_shape *s, const mc_block_kind *k) {
  return exists_in(b, s, k && k->routes);
}

int64_t mc_act_buf_numel(const mc_act_buf *b, const mc_act_shape *s) {
  const int64_t T = s->local.seq_len;
  int64_t rows = 1;
  switch (b->rows) {
    case MC_ROWS_TOKENS: rows = (int64_t)s->n_seq * T; break;
    case MC_ROWS_SEQS: rows = s->n_seq; break;
    case MC_ROWS_ONE: rows = 1; break;
    case MC_ROWS_RESIDUAL: rows = (int64_t)s->n_seq * s->T_res; break;
  }
  const int64_t width = b->width == MC_DIM_VP ? mc_vocab_padded(&s->local) / s->tp : mc_dim_of(&s->local, b->width);
  /* bounded by mc_layout_check (MC_MAX_BUF_ELEMS); saturating for a shape it did not see */
  return mc_mul_sat_i64(rows, width);
}

int mc_act_buf_bf16(const mc_act_buf *b, const mc_act_shape *s) { return b->store == MC_STORE_PROD && s->act16; }

int64_t mc_act_buf_bytes(const mc_act_buf *b, const mc_act_shape *s) {
  const int64_t n = mc_act_buf_numel(b, s);
  return mc_act_buf_bf16(b, s) ? mc_mul_sat_i64(n / 2 + n % 2, 4) : mc_mul_sat_i64(n, 4); /* bf16 in whole floats */
}

#define TOK(name, width, store, when, keep) {name, MC_ROWS_TOKENS, MC_DIM_##width, MC_STORE_##store, when, keep}
#define RES(name, width, store, when, keep) {name, MC_ROWS_RESIDUAL, MC_DIM_##width, MC_STORE_##store, when, keep}

/* The residual input, the normed input (bf16 under act16 where it feeds only products: every
 * block but a routing one, which also routes and permutes it), its 1/rms. */
const mc_act_buf mc_layer_bufs[MC_L_NBUFS] = {
    [MC_L_X_IN] = RES("x_in", D, F32, MC_IF_ALWAYS, 1),
    [MC_L_U16] = RES("u", D, PROD, MC_IF_NOT_ROUTED, 0),
    [MC_L_U] = RES("u", D, F32, MC_IF_ROUTED, 0),
    [MC_L_RSTD] = RES("rstd", ONE, F32, MC_IF_ALWAYS, 1),
};

/* Token ids, the residual stream and its gradient, the final norm and head (the logits of the
 * rank's vocabulary slice and their gradient), the block output and input gradient rows, the
 * TP/SP staging rows and the vocab-parallel embedding's gather lists. */
const mc_act_buf mc_net_bufs[MC_NB_COUNT] = {
    [MC_NB_TOK_IN] = TOK("tokens_in", ONE, I32, MC_IF_ALWAYS, 1),
    [MC_NB_TOK_TGT] = TOK("tokens_target", ONE, I32, MC_IF_ALWAYS, 1),
    [MC_NB_X] = RES("x", D, F32, MC_IF_ALWAYS, 1),
    [MC_NB_HF] = TOK("final_norm_out", D, PROD, MC_IF_LAST, 1),
    [MC_NB_RSTD_F] = RES("final_norm_rstd", ONE, F32, MC_IF_LAST, 1),
    [MC_NB_LOGITS] = TOK("logits", VP, F32, MC_IF_LAST, 1),
    [MC_NB_LOSS] = TOK("loss", ONE, F32, MC_IF_LAST, 1),
    [MC_NB_LSE] = TOK("lse", ONE, F32, MC_IF_LAST, 1),
    [MC_NB_DX] = RES("dx", D, F32, MC_IF_ALWAYS, 1),
    [MC_NB_DU] = TOK("du", D, F32, MC_IF_ALWAYS, 1),
    [MC_NB_Y] = TOK("block_out", D, F32, MC_IF_ALWAYS, 1),
    [MC_NB_FULL] = TOK("full_rows", D, F32, MC_IF_ALWAYS, 1),
    [MC_NB_DLOGITS] = TOK("dlogits", VP, PROD, MC_IF_LAST, 1),
    [MC_NB_USH] = RES("shard_rows", D, F32, MC_IF_SP, 1),
    [MC_NB_UFULL] = TOK("gathered_u", D, F32, MC_IF_SP, 1),
    [MC_NB_EMB_TOK] = TOK("emb_tokens", ONE, I32, MC_IF_TP | MC_IF_FIRST, 1),
    [MC_NB_EMB_SLOT] = TOK("emb_slots", ONE, I32, MC_IF_TP | MC_IF_FIRST, 1),
    [MC_NB_EMB_ROWS] = TOK("emb_rows", D, F32, MC_IF_TP | MC_IF_FIRST, 1),
    [MC_NB_EMB_GATE] = TOK("emb_gates", ONE, F32, MC_IF_TP | MC_IF_FIRST, 1),
};

int mc_act_buf_kept(const mc_act_buf *b, mc_recompute r) {
  if (r == MC_RECOMPUTE_NONE) return 1;
  if (r == MC_RECOMPUTE_SELECTIVE) return b->keep_selective;
  return b == &mc_layer_bufs[MC_L_X_IN]; /* full: the layer input only */
}

/* Footprint of the buffers of a list that exist and that policy r keeps (kept = 1) or drops
 * (kept = 0). */
static int64_t list_bytes(const mc_act_buf *b, int n, const mc_act_shape *s, int routes, mc_recompute r, int kept) {
  int64_t sum = 0;
  for (int i = 0; i < n; i++)
    if (exists_in(&b[i], s, routes) && mc_act_buf_kept(&b[i], r) == kept)
      sum = mc_add_sat_i64(sum, mc_mem_footprint(mc_act_buf_bytes(&b[i], s)));
  return sum;
}

static int64_t layer_bytes(const mc_block_kind *k, const mc_act_shape *s, mc_recompute r, int kept) {
  int64_t sum = list_bytes(mc_layer_bufs, MC_L_NBUFS, s, k->routes, r, kept);
  sum = mc_add_sat_i64(sum, list_bytes(k->saved, k->n_saved, s, k->routes, r, kept));
  return mc_add_sat_i64(sum, list_bytes(k->saved_i32, k->n_saved_i32, s, k->routes, r, kept));
}

int64_t mc_act_layer_bytes(const mc_block_kind *k, const mc_act_shape *s, mc_recompute r) { return layer_bytes(k, s, r, 1); }

int64_t mc_act_layer_dropped_bytes(const mc_block_kind *k, const mc_act_shape *s, mc_recompute r) {
  return layer_bytes(k, s, r, 0);
}

int64_t mc_act_scratch_bytes(const char *kinds, const mc_act_shape *s) {
  int64_t most[MC_BLOCK_MAX_BUFS] = {0};
  for (const char *c = kinds; *c; c++) {
    const mc_block_kind *k = mc_block_kind_of(*c);
    if (!k) continue;
    for (int i = 0; i < k->n_grads; i++)
      if (exists_in(&k->grads[i], s, k->routes)) {
        const int64_t b = mc_act_buf_bytes(&k->grads[i], s);
        most[i] = b > most[i] ? b : most[i];
      }
  }
  int64_t sum = 0;
  for (int i = 0; i < MC_BLOCK_MAX_BUFS; i++)
    if (most[i]) sum = mc_add_sat_i64(sum, mc_mem_footprint(most[i]));
  return sum;
}

int64_t mc_act_net_bytes(const mc_act_shape *s) { return list_bytes(mc_net_bufs, MC_NB_COUNT, s, 0, MC_RECOMPUTE_NONE, 1); }

/* Expert parallelism's buffers (mc_stage_hold, train/dist_ep.c), sized for the most rows the
 * routing rule lets one rank's experts receive, so that no routing can overrun them. Each of
 * the ep sources routes n = n_seq x T positions (T: its residual rows, or whole sequences when
 * SP meets a capacity factor); a token's k choices are distinct experts, so it sends at most
 * min(k, El) rows to one owner of El = E/ep experts; with capacity C per sequence and expert,
 * a source sends at most n_seq x El x min(C, T). The balanced figure (every expert equally
 * loaded) is kept for the report. The saved rows are kept per E layer and per micro-batch in
 * flight (pipeline slots), or under full recomputation once (the layers rebuild them in
 * turn); the exchange scratch, which also holds the rank's own routed rows (at most n x k,
 * never more than the bound), is shared. Under act16 the rows the expert products read and
 * their saved forms are bf16 (the input rows and their gradient, h1, h3, SwiGLU, da, dh1,
 * dh3); the returned rows stay fp32. */
static void moe_ep_buffers(const mc_geometry *g, const mc_act_shape *s, int n_moe_layers, int inflight,
                           mc_recompute r, mc_stage_hold *h) {
  const mc_model *m = &g->model;
  const int ep = g->layout.ep, El = m->n_experts / ep, cap = mc_moe_capacity(m);
  const int64_t T = m->capacity_factor > 0 ? m->seq_len : s->T_res, n = (int64_t)s->n_seq * T;
  const int64_t d = m->d_model, F = m->expert_hidden;
  /* products bounded by mc_layout_check (MC_MAX_BUF_ELEMS), sums saturating */
  int64_t per_src = n * (m->top_k < El ? m->top_k : El);
  if (cap > 0) {
    const int64_t capped = (int64_t)s->n_seq * El * (cap < T ? cap : T);
    per_src = capped < per_src ? capped : per_src;
  }
  const int64_t R = ep * per_src;
  const double rf = m->capacity_factor > 0 ? m->capacity_factor : 1.0;
  h->moe_assignments = R;
  h->moe_balanced = (int64_t)ceil((double)n * m->top_k * rf);
  const int64_t es = s->act16 ? 2 : 4; /* the product rows' element size */
  const int64_t rows_d32 = mc_mem_footprint(mc_mul_sat_i64(R, d * 4));
  const int64_t rows_d = mc_mem_footprint(mc_mul_sat_i64(R, d * es)), rows_f = mc_mem_footprint(mc_mul_sat_i64(R, F * es));
  /* full recomputation rebuilds an E layer's received rows with its forward just before its
   * backward, so the layers and micro-batches in flight share one set */
  const int64_t sets = r == MC_RECOMPUTE_FULL ? 1 : (int64_t)inflight * n_moe_layers;
  const int64_t per_layer = mc_add_sat_i64(rows_d, mc_mul_sat_i64(3, rows_f));
  h->moe_layers = mc_mul_sat_i64(sets, per_layer);
  h->moe_exchange = mc_add_sat_i64(mc_add_sat_i64(rows_d32, rows_d), mc_mul_sat_i64(3, rows_f));
  h->moe_scratch = mc_add_sat_i64(h->moe_layers, h->moe_exchange);
}

int mc_stage_hold_of(const mc_geometry *g, int stage, const mc_hold_opts *o, mc_stage_hold *out) {
  memset(out, 0, sizeof *out);
  const mc_layout *l = &g->layout;
  if (stage < 0 || stage >= l->pp) return mc_error("holdings: stage %d outside the %d stages", stage, l->pp);
  mc_act_shape s;
  mc_act_shape_of(g, stage, o, o->micro_batch, &s);
  char kinds[MC_MAX_LAYERS + 1];
  int nk = 0, n_moe = 0;
  for (int i = 0; i < g->stages.count[stage]; i++) {
    const char c = g->model.pattern[g->stages.first[stage] + i];
    const mc_block_kind *k = mc_block_kind_of(c);
    if (!k) return mc_error("holdings: block '%c' has no row in the block-kind table", c);
    kinds[nk++] = c;
    const int64_t dropped = mc_act_layer_dropped_bytes(k, &s, o->recompute);
    out->per_micro = mc_add_sat_i64(out->per_micro, mc_act_layer_bytes(k, &s, o->recompute));
    /* a layer's dropped buffers exist one layer at a time, in the working set the layers share */
    if (dropped > out->transient) out->transient = dropped;
    n_moe += k->routes;
  }
  kinds[nk] = 0;
  out->inflight = l->pp - stage < o->n_micro ? l->pp - stage : o->n_micro;
  out->scratch = mc_act_scratch_bytes(kinds, &s);
  out->network = mc_act_net_bytes(&s);
  out->activations = mc_add_sat_i64(mc_add_sat_i64(mc_mul_sat_i64(out->inflight, out->per_micro), out->transient),
                                    mc_add_sat_i64(out->scratch, out->network));
  /* 1F1B: one buffer for the incoming activation and one for the incoming gradient */
  if (l->pp > 1)
    out->pipeline = mc_mul_sat_i64(2, mc_mem_footprint(mc_mul_sat_i64((int64_t)s.n_seq * s.T_res, (int64_t)g->model.d_model * 4)));
  if (n_moe && l->ep > 1) moe_ep_buffers(g, &s, n_moe, out->inflight > 1 ? out->inflight : 1, o->recompute, out);
  return 0;
}

/* ------------------------------------------------------------------ totals */

/* The gather set a family belongs to under ZeRO 3: its layer, or the embedding (0) and the
 * final norm with the head (n_layers + 1) on their own. */
static int gather_set(const mc_geometry *g, const mc_family *f) {
  if (f->layer >= 0) return f->layer + 1;
  return f->role == MC_ROLE_EMBED ? 0 : g->model.n_layers + 1;
}

/* multi[0], multi[1]: whether this rank's dp and expert-DP groups have several members (a
 * group of one member moves nothing, so packs nothing: train/dist_sync.c). */
static int multi_member_groups(const mc_geometry *g, int rank, int multi[2]) {
  int *members = malloc(sizeof(int) * (size_t)g->world);
  if (!members) return mc_error("holdings: out of memory");
  multi[0] = mc_group_dp(&g->layout, rank, members) > 1;
  multi[1] = mc_group_edp(&g->layout, rank, members) > 1;
  free(members);
  return 0;
}

/* A pack of n floats as the collectives carve it (train/dist_sync.c stage_take: at least one). */
static int64_t pack_bytes(int64_t floats) { return mc_mem_footprint((floats > 0 ? floats : 1) * 4); }

/* The largest gather set of the rank's stage (train/net.c set_params; the ZeRO 3 slots'
 * unit, and the unit of ZeRO 0/1's reduction in the step's last backward): out->weights,
 * grads as ZeRO 3's slots hold them, and out->reduce the packs of the set's gradient
 * reduction (train/dist_sync.c mc_dist_reduce_start: per group of several members the
 * slices, and under ZeRO >= 1 this rank's rows; partial sums over TP first, through one
 * pack given back before them). */
static int largest_set(const mc_geometry *g, int rank, const mc_hold_opts *o, mc_zero3_slots *out) {
  memset(out, 0, sizeof *out);
  /* per set s, group kind gk (0: the dp group; 1: the expert-DP group) and weight kind wk (0:
   * fp32, 1: bf16): params, elements of their local slices and of this rank's shards */
  enum { GK = 2, WK = 2 };
  const int n_sets = g->model.n_layers + 2;
  typedef struct {
    int64_t n[GK][WK], slices[GK][WK], shards[GK][WK], weights, grads, tp_sum;
  } set_t;
  int multi[GK] = {0, 0};
  if (multi_member_groups(g, rank, multi)) return -1;
  set_t *set = calloc((size_t)n_sets, sizeof *set);
  if (!set) return mc_error("holdings: out of memory");
  int rc = 0;
  for (int fi = 0; fi < g->fams.n && rc == 0; fi++) {
    const mc_family *f = &g->fams.f[fi];
    mc_param_hold h;
    if (mc_param_hold_of(g, fi, rank, o, &h)) {
      rc = -1;
      break;
    }
    if (!h.in_stage) continue;
    set_t *t = &set[gather_set(g, f)];
    const int gk = f->place == MC_PLACE_EP, wk = h.compute_bf16;
    /* the gathered working weights (bf16 for bf16 weights: gathered in bf16) and the
     * whole-slice gradient (fp32) */
    t->weights += mc_mem_footprint(h.local_numel * (wk ? 2 : 4));
    t->grads += mc_mem_footprint(h.local_numel * 4);
    t->n[gk][wk]++, t->slices[gk][wk] += h.local_numel, t->shards[gk][wk] += h.z_numel;
    if (!gk && f->tp_partial_grad && g->layout.tp > 1) t->tp_sum += h.local_numel;
  }
  for (int s = 0; rc == 0 && s < n_sets; s++) {
    set_t *t = &set[s];
    /* the gathers' packs (one gather per weight kind, a bucket per group): this rank's rows as
     * sent and the member-major slices, bf16 ones in half the floats, rounded up */
    int64_t gathers = 0, reduce = 0;
    for (int gk = 0; gk < GK; gk++) {
      int64_t n = 0, slices = 0, shards = 0;
      for (int wk = 0; wk < WK; wk++) {
        n += t->n[gk][wk], slices += t->slices[gk][wk], shards += t->shards[gk][wk];
        if (multi[gk] && t->n[gk][wk])
          gathers += pack_bytes(wk ? (t->shards[gk][wk] + 1) / 2 : t->shards[gk][wk]) +
                     pack_bytes(wk ? (t->slices[gk][wk] + 1) / 2 : t->slices[gk][wk]);
      }
      /* the gradients' fp32 reduction, one per group: the slices member-major and (ZeRO >= 1:
       * a reduce-scatter) this rank's reduced rows */
      if (multi[gk] && n) reduce += pack_bytes(slices) + (g->layout.zero > 0 ? pack_bytes(shards) : 0);
    }
    /* the partial sums over TP go first, through a pack given back before the buckets' */
    if (t->tp_sum > 0 && pack_bytes(t->tp_sum) > reduce) reduce = pack_bytes(t->tp_sum);
    if (t->weights + gathers > out->weights) out->weights = t->weights + gathers;
    if (t->grads > out->grads) out->grads = t->grads;
    if (reduce > out->reduce) out->reduce = reduce;
  }
  free(set);
  return rc;
}

int mc_zero3_slots_of(const mc_geometry *g, int rank, const mc_hold_opts *o, mc_zero3_slots *out) {
  memset(out, 0, sizeof *out);
  return g->layout.zero == 3 ? largest_set(g, rank, o, out) : 0;
}

int64_t mc_zero3_buffer_bytes(const mc_geometry *g, int rank, const mc_hold_opts *o) {
  mc_zero3_slots z;
  if (mc_zero3_slots_of(g, rank, o, &z)) return -1;
  return mc_zero3_slots_bytes(&z);
}

int mc_dist_staging_chunk(const mc_geometry *g, int rank, const mc_hold_opts *o, int64_t *chunk) {
  *chunk = 0;
  if (g->layout.zero == 3) return 0; /* its collectives run through zero3.buffers */
  int multi[2] = {0, 0};
  if (multi_member_groups(g, rank, multi)) return -1;
  int64_t largest = 0, total = 0;
  int packs = 0;
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    mc_param_hold h;
    if (mc_param_hold_of(g, fi, rank, o, &h)) return -1;
    if (!h.in_stage) continue;
    /* packed (train/dist_sync.c): a family reduced or gathered over a group of several
     * members, or summed over TP first */
    const int expert = f->place == MC_PLACE_EP;
    packs |= expert ? multi[1] : multi[0] || (f->tp_partial_grad && g->layout.tp > 1);
    if (h.local_numel > largest) largest = h.local_numel;
    total += h.local_numel;
  }
  /* no chunk beyond the whole stage: a small model's chunk is the model */
  const int64_t want = largest > MC_DIST_STAGING_CHUNK ? largest : MC_DIST_STAGING_CHUNK;
  if (packs) *chunk = want < total ? want : total;
  return 0;
}

int64_t mc_dist_staging_bytes(const mc_geometry *g, int rank, const mc_hold_opts *o) {
  int64_t chunk;
  mc_zero3_slots set;
  if (mc_dist_staging_chunk(g, rank, o, &chunk)) return -1;
  if (!chunk) return 0;
  /* the step's last backward reduces one set at a time through the same arena */
  if (largest_set(g, rank, o, &set)) return -1;
  const int64_t chunks = mc_dist_staging_bytes_of(chunk);
  return set.reduce > chunks ? set.reduce : chunks;
}

int64_t mc_muon_ns_work_floats(int64_t rows, int64_t cols) {
  const int64_t s = rows < cols ? rows : cols;
  return 2 * s * s + rows * cols;
}

void mc_muon_gathers(const mc_layout *l, const mc_family *f, int *over_dp, int *over_tp) {
  *over_dp = l->zero > 0 && l->dp > 1;
  *over_tp = f->place == MC_PLACE_TP && l->tp > 1;
}

int mc_muon_scratch_of(const mc_geometry *g, int rank, mc_muon_scratch *out) {
  memset(out, 0, sizeof *out);
  int split = 0;
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    if (f->opt != MC_OPT_MUON) continue;
    mc_shard sh;
    if (mc_shard_of(g, fi, MC_STATE_PARAM, rank, &sh)) return -1;
    if (!sh.in_stage) continue;
    const int64_t w = mc_muon_ns_work_floats(f->shape[0], f->shape[1]);
    if (f->numel > out->full_floats) out->full_floats = f->numel;
    if (w > out->work_floats) out->work_floats = w;
    int over_dp, over_tp;
    mc_muon_gathers(&g->layout, f, &over_dp, &over_tp);
    split |= over_dp || over_tp;
  }
  if (split) out->gather_floats = out->full_floats;
  if (out->full_floats)
    out->bytes = mc_mem_footprint(out->full_floats * 4) + (split ? mc_mem_footprint(out->gather_floats * 4) : 0) +
                 mc_mem_footprint(out->work_floats * 4);
  return 0;
}

int mc_holdings_of(const mc_geometry *g, int rank, const mc_hold_opts *o, int64_t bytes[MC_MEM_COUNT]) {
  memset(bytes, 0, sizeof(int64_t) * MC_MEM_COUNT);
  for (int fi = 0; fi < g->fams.n; fi++) {
    mc_param_hold h;
    if (mc_param_hold_of(g, fi, rank, o, &h))
      return mc_error_context("holdings of rank %d, family %s", rank, g->fams.f[fi].name);
    if (!h.in_stage) continue;
    bytes[h.param_cat] += mc_mem_footprint(h.working_bytes);
    bytes[MC_MEM_GRADS] += mc_mem_footprint(h.grad_bytes);
    if (h.has_master) bytes[h.master_cat] += mc_mem_footprint(h.master_bytes);
    bytes[h.moments_cat] += h.n_moments * mc_mem_footprint(h.moment_bytes);
  }
  mc_muon_scratch ms;
  if (mc_muon_scratch_of(g, rank, &ms)) return -1;
  bytes[MC_MEM_OPTIM_SCRATCH] = ms.bytes;
  const int64_t z3 = mc_zero3_buffer_bytes(g, rank, o);
  if (z3 < 0) return -1;
  bytes[MC_MEM_ZERO3_BUFFERS] = z3;
  const int64_t staging = mc_dist_staging_bytes(g, rank, o);
  if (staging < 0) return -1;
  bytes[MC_MEM_DIST_STAGING] = staging;
  mc_coords c;
  mc_layout_coords(&g->layout, rank, &c);
  mc_stage_hold sh;
  if (mc_stage_hold_of(g, c.pp_rank, o, &sh)) return -1;
  bytes[MC_MEM_ACTIVATIONS] = sh.activations;
  bytes[MC_MEM_PIPELINE_BUFFERS] = sh.pipeline;
  bytes[MC_MEM_MOE_SCRATCH] = sh.moe_scratch;
  return 0;
}
