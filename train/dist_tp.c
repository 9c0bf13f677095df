/* Tensor- and sequence-parallel pieces of the network pass (docs/parallel.md): sums over the
 * TP group, the SP all-gather / reduce-scatter between sequence shards and whole sequences,
 * the vocab-parallel embedding and cross-entropy, and the sequence-wide MoE statistics
 * under SP. Collectives take backend memory (host memory for the MPI backend). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/net_par.h"
#include "util/error.h"

/* Queued backend work must be finished before the host reads what it wrote (the collectives
 * on backend buffers settle instead: mc_dist_settle). */
static int ready(mc_backend *be) { return be->sync(be); }

int mc_tp_allreduce(const mc_net_par *par, mc_backend *be, float *buf, int64_t count) {
  if (par->tp <= 1) return 0;
  if (mc_dist_settle(par->comm->tp, be) || mc_allreduce_sum(par->comm->tp, buf, count, MC_DT_F32)) return mc_error_context("TP all-reduce");
  return 0;
}

/* Row blocks: member q's shard holds, for each sequence s, positions [q*Tl, (q+1)*Tl); the
 * model wants rows s*T + t. So the collectives run per sequence (one segment each,
 * comm.h): sequence s's block of whole rows is its members' shards in member order, and the
 * rows land where the model reads them without a permuting copy. Elements are fp32, or bf16
 * where b16. */
static int64_t *equal_counts(int n, int64_t each) {
  int64_t *c = malloc(sizeof(int64_t) * (size_t)n);
  if (c)
    for (int i = 0; i < n; i++) c[i] = each;
  return c;
}

int mc_sp_gather(const mc_net_par *par, mc_backend *be, const void *shard, void *full, int n_seq, int d, int b16) {
  int64_t *counts = equal_counts(par->tp, (int64_t)par->T_res * d);
  if (!counts) return mc_error("SP all-gather: out of memory");
  int rc = mc_dist_settle(par->comm->tp, be) ||
           mc_allgather_seg(par->comm->tp, shard, n_seq, full, counts, b16 ? MC_DT_BF16 : MC_DT_F32);
  free(counts);
  if (rc) return mc_error_context("SP all-gather of %d sequence shards", par->tp);
  return 0;
}

int mc_sp_reduce_scatter(const mc_net_par *par, mc_backend *be, const float *full, float *shard, int n_seq, int d) {
  int64_t *counts = equal_counts(par->tp, (int64_t)par->T_res * d);
  if (!counts) return mc_error("SP reduce-scatter: out of memory");
  int rc = mc_dist_settle(par->comm->tp, be) || mc_reduce_scatter_sum_seg(par->comm->tp, full, n_seq, shard, counts, MC_DT_F32);
  free(counts);
  if (rc) return mc_error_context("SP reduce-scatter into %d sequence shards", par->tp);
  return 0;
}

static void sp_own_rows(const mc_net_par *par, mc_backend *be, float *full, float *shard, int n_seq, int d,
                        int to_full) {
  const int Tl = par->T_res, T = par->T, q = par->tp_rank;
  const int64_t blk = (int64_t)Tl * d;
  for (int s = 0; s < n_seq; s++) {
    float *fl = full + ((int64_t)s * T + (int64_t)q * Tl) * d, *sh = shard + (int64_t)s * blk;
    if (to_full) be->copy(be, fl, sh, blk);
    else be->copy(be, sh, fl, blk);
  }
}

void mc_sp_take(const mc_net_par *par, mc_backend *be, const float *full, float *shard, int n_seq, int d) {
  sp_own_rows(par, be, (float *)full, shard, n_seq, d, 0);
}

void mc_sp_place(const mc_net_par *par, mc_backend *be, const float *shard, float *full, int n_seq, int d) {
  be->fill(be, full, (int64_t)n_seq * par->T * d, 0.0f);
  sp_own_rows(par, be, full, (float *)shard, n_seq, d, 1);
}

/* ------------------------------------------------------------------ vocab-parallel embedding */

int mc_vp_embed_fwd(mc_net_par *par, mc_backend *be, const float *embed_w, const int32_t *tok_host, int n, int d,
                    float *rows) {
  int32_t *tl = malloc(sizeof(int32_t) * 2 * (size_t)n);
  float *ones = malloc(sizeof(float) * (size_t)n);
  if (!tl || !ones) {
    free(tl), free(ones);
    return mc_error("vocab-parallel embedding: out of memory");
  }
  /* Tokens in [v0, v0 + Vpl) are looked up here, compacted; slot[r] says where row r went. */
  int cnt = 0;
  for (int r = 0; r < n; r++) {
    int32_t v = tok_host[r] - par->v0;
    ones[r] = 1.0f;
    tl[n + r] = -1;
    if (v >= 0 && v < par->Vpl) tl[cnt] = v, tl[n + r] = cnt++;
  }
  par->emb_cnt = cnt;
  be->from_host(be, par->emb_tok, tl, (size_t)(cnt ? cnt : 1) * sizeof(int32_t));
  be->from_host(be, par->emb_slot, tl + n, (size_t)n * sizeof(int32_t));
  be->from_host(be, par->emb_gate, ones, (size_t)n * sizeof(float));
  free(tl), free(ones);
  be->embed_fwd(be, par->emb_tok, cnt, d, embed_w, par->emb_rows);
  /* Rows of other ranks' tokens stay zero; the sum over TP completes every row. */
  be->fill(be, rows, (int64_t)n * d, 0.0f);
  be->moe_unpermute(be, par->emb_rows, par->emb_slot, par->emb_gate, n, 1, d, rows);
  return 0;
}

int mc_vp_embed_bwd(const mc_net_par *par, mc_backend *be, const float *dfull, int n, int d, float *embed_g) {
  be->moe_permute(be, dfull, par->emb_slot, n, 1, d, (mc_dst){par->emb_rows, NULL});
  be->embed_bwd(be, par->emb_tok, par->emb_cnt, d, par->emb_rows, embed_g);
  return 0;
}

/* ------------------------------------------------------------------ vocab-parallel cross-entropy */

/* On the backend: each rank's xent_fwd over its real columns gives its log-sum-exp and (for
 * the rows whose target is local) the target's logit as lse - loss; one all-gather of those
 * 2n values gives every rank the global log-normaliser and loss, and the backward is the
 * backend's xent_bwd against that global lse (the onehot only where the target is local).
 * Only 2n floats per pass cross to the host. */

/* The local column of each row's target, or `none` where another rank holds it. */
static void local_targets(const mc_net_par *par, const int32_t *tgt_host, int n, int32_t none, int32_t *out) {
  for (int r = 0; r < n; r++) {
    int32_t t = tgt_host[r] - par->v0;
    out[r] = t >= 0 && t < par->Vl ? t : none;
  }
}

int mc_vp_xent_fwd(mc_net_par *par, mc_backend *be, const float *logits, const int32_t *tgt_host, int n,
                   int32_t *tgt_dev, float *loss_dev, float *lse_dev, float *loss_host) {
  const int tp = par->tp;
  float *mine = malloc(sizeof(float) * 2 * (size_t)n), *all = malloc(sizeof(float) * 2 * (size_t)n * tp);
  int32_t *tl = malloc(sizeof(int32_t) * (size_t)n);
  int64_t *counts = equal_counts(tp, 2 * (int64_t)n);
  if (!mine || !all || !tl || !counts) {
    free(mine), free(all), free(tl), free(counts);
    return mc_error("vocab-parallel cross-entropy: out of memory");
  }
  memcpy(par->tgt_host, tgt_host, sizeof(int32_t) * (size_t)n);
  local_targets(par, tgt_host, n, 0, tl); /* a row with no local target reads column 0, unused */
  be->from_host(be, tgt_dev, tl, sizeof(int32_t) * (size_t)n);
  be->xent_fwd(be, logits, tgt_dev, n, par->Vl, par->Vpl, loss_dev, lse_dev);
  be->to_host(be, mine, lse_dev, sizeof(float) * (size_t)n);
  be->to_host(be, mine + n, loss_dev, sizeof(float) * (size_t)n);
  int rc = ready(be);
  local_targets(par, tgt_host, n, -1, tl);
  for (int r = 0; r < n; r++) mine[n + r] = tl[r] >= 0 ? mine[r] - mine[n + r] : 0.0f; /* the target's logit */
  if (!rc) rc = mc_allgather(par->comm->tp, mine, all, counts, MC_DT_F32);
  for (int r = 0; r < n && !rc; r++) {
    float mx = -INFINITY;
    for (int q = 0; q < tp; q++) mx = all[(int64_t)q * 2 * n + r] > mx ? all[(int64_t)q * 2 * n + r] : mx;
    double s = 0.0, tl_sum = 0.0;
    for (int q = 0; q < tp; q++) {
      float lq = all[(int64_t)q * 2 * n + r];
      if (lq > -INFINITY) s += exp((double)lq - mx);
      tl_sum += all[(int64_t)q * 2 * n + n + r];
    }
    double l = mx + log(s);
    par->lse_host[r] = (float)l;
    loss_host[r] = (float)(l - tl_sum);
  }
  if (!rc) be->from_host(be, lse_dev, par->lse_host, sizeof(float) * (size_t)n);
  free(mine), free(all), free(tl), free(counts);
  return rc ? mc_error_context("vocab-parallel cross-entropy over %d TP ranks", tp) : 0;
}

int mc_vp_xent_bwd(const mc_net_par *par, mc_backend *be, const float *logits, int n, float scale, int32_t *tgt_dev,
                   const float *lse_dev, mc_dst dlogits) {
  int32_t *tl = malloc(sizeof(int32_t) * (size_t)n);
  if (!tl) return mc_error("vocab-parallel cross-entropy: out of memory");
  local_targets(par, par->tgt_host, n, -1, tl); /* -1: no onehot term on this rank */
  be->from_host(be, tgt_dev, tl, sizeof(int32_t) * (size_t)n);
  be->xent_bwd(be, logits, tgt_dev, lse_dev, n, par->Vl, par->Vpl, scale, dlogits);
  free(tl); /* from_host took its copy */
  return 0;
}

/* ------------------------------------------------------------------ MoE statistics under SP */

int mc_sp_moe_aux(const mc_net_par *par, mc_backend *be, int E, float *fr, float *pbar, int n_seq, float *aux_host) {
  const int tp = par->tp;
  const int64_t se = (int64_t)n_seq * E;
  float *fp = malloc(sizeof(float) * 2 * (size_t)se);
  if (!fp) return mc_error("MoE under SP: out of memory");
  int rc = mc_dist_settle(par->comm->tp, be) || mc_allreduce_sum(par->comm->tp, fr, se, MC_DT_F32) ||
           mc_allreduce_sum(par->comm->tp, pbar, se, MC_DT_F32);
  if (!rc) {
    be->scale(be, fr, se, 1.0f / (float)tp); /* the backward reads the sequence's f */
    be->to_host(be, fp, fr, sizeof(float) * (size_t)se);
    be->to_host(be, fp + se, pbar, sizeof(float) * (size_t)se);
    rc = ready(be);
  }
  for (int s = 0; s < n_seq && !rc; s++) {
    double a = 0.0;
    for (int e = 0; e < E; e++) a += (double)fp[(int64_t)s * E + e] * (fp[se + (int64_t)s * E + e] / (float)tp);
    aux_host[s] = (float)(E * a);
  }
  free(fp);
  return rc ? mc_error_context("MoE routing statistics over %d TP ranks", tp) : 0;
}
