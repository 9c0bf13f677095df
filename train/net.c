/* The hybrid network on one rank: parameters from the family registry, initialisation from
 * the counter-based RNG, and the forward/backward pass of embedding -> pre-norm residual
 * blocks -> final norm -> untied head -> vocab-masked cross-entropy (docs/model.md). The
 * blocks live in train/block_*.c; every computation is a backend op (kernels/ops.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/net_blocks.h"
#include "util/error.h"
#include "util/rng.h"

static const mc_block_ops *block_ops(char kind) {
  switch (kind) {
  case 'A': return &mc_block_attn;
  case 'M': return &mc_block_mamba;
  case 'E': return &mc_block_moe;
  case 'R': return &mc_block_rec;
  }
  return NULL;
}

/* ------------------------------------------------------------------ initialisation */

/* Initial value of global element gi of family f (ckpt/families.h documents the kinds). */
static float init_value(const mc_model *m, const mc_family *f, uint64_t seed, uint64_t stream,
                        uint64_t gi) {
  switch (f->init) {
  case MC_INIT_NORMAL: return (float)(m->init_std * mc_rng_normal(seed, stream, gi));
  case MC_INIT_NORMAL_OUT:
    return (float)(m->init_std / sqrt(2.0 * m->n_layers) * mc_rng_normal(seed, stream, gi));
  case MC_INIT_ONES: return 1.0f;
  case MC_INIT_ZEROS: return 0.0f;
  case MC_INIT_A_LOG: return (float)log(1.0 + (double)(gi % 16));
  case MC_INIT_DT_BIAS: { /* dt log-uniform in [1e-3, 1e-1], bias = softplus^-1(dt) */
    double u = mc_rng_uniform(seed, stream, gi);
    double dt = exp(log(1e-3) + u * (log(1e-1) - log(1e-3)));
    return (float)log(expm1(dt));
  }
  case MC_INIT_REC_LAMBDA: { /* a = exp(-8 softplus(lambda)) uniform in [0.9, 0.999] */
    double a = 0.9 + 0.099 * mc_rng_uniform(seed, stream, gi);
    return (float)log(expm1(-log(a) / 8.0));
  }
  case MC_INIT_CONV: return (float)(mc_rng_normal(seed, stream, gi) / sqrt((double)f->shape[1]));
  default: break;
  }
  return 0.0f;
}

/* Fills the local slice [local_start, local_start + local_count) of a family, keyed by the
 * global element index, so every layout draws identical values. */
static int init_param(mc_net *net, mc_net_param *p, uint64_t seed) {
  const mc_family *f = &net->geo.fams.f[p->fam];
  const mc_shard *s = &p->shard;
  uint64_t stream = mc_rng_stream_of(f->name);
  float *host = malloc((size_t)(p->numel ? p->numel : 1) * sizeof(float));
  if (!host) return mc_error("out of memory initialising %s", f->name);
  int64_t shp[3] = {1, 1, 1}, cnt[3] = {1, 1, 1}, st[3] = {0, 0, 0};
  for (int i = 0; i < f->ndim; i++) shp[i] = f->shape[i], cnt[i] = s->local_count[i], st[i] = s->local_start[i];
  int64_t e = 0;
  for (int64_t a = 0; a < cnt[0]; a++)
    for (int64_t b = 0; b < cnt[1]; b++)
      for (int64_t c = 0; c < cnt[2]; c++) {
        uint64_t gi = (uint64_t)(((st[0] + a) * shp[1] + st[1] + b) * shp[2] + st[2] + c);
        host[e++] = init_value(&net->m, f, seed, stream, gi);
      }
  net->be->from_host(net->be, p->w, host, (size_t)p->numel * sizeof(float));
  free(host);
  return 0;
}

/* ------------------------------------------------------------------ creation */

static int check_layout(const mc_geometry *geo, int rank) {
  const mc_layout *l = &geo->layout;
  if (l->tp != 1) return mc_error("not supported yet by the network: tp=%d (tensor parallelism)", l->tp);
  if (l->pp != 1) return mc_error("not supported yet by the network: pp=%d (pipeline stages)", l->pp);
  if (l->ep != 1) return mc_error("not supported yet by the network: ep=%d (expert parallelism)", l->ep);
  if (rank < 0 || rank >= geo->world) return mc_error("network: rank %d outside world %d", rank, geo->world);
  for (int i = 0; geo->model.pattern[i]; i++)
    if (!block_ops(geo->model.pattern[i]))
      return mc_error("model.pattern: block '%c' at layer %d has no implementation", geo->model.pattern[i], i);
  return 0;
}

mc_net *mc_net_create(const mc_geometry *geo, int rank, uint64_t seed) {
  if (check_layout(geo, rank)) return NULL;
  mc_net *net = calloc(1, sizeof *net);
  if (!net) {
    mc_error("out of memory creating the network");
    return NULL;
  }
  net->be = mc_backend_cpu();
  net->geo = *geo;
  net->geo.fams.f = malloc((size_t)geo->fams.n * sizeof(mc_family));
  net->m = geo->model;
  net->rank = rank;
  net->n_layers = geo->model.n_layers;
  net->layers = calloc((size_t)(net->n_layers ? net->n_layers : 1), sizeof(mc_layer));
  net->params = calloc((size_t)geo->fams.n, sizeof(mc_net_param));
  if (!net->geo.fams.f || !net->layers || !net->params) {
    mc_error("out of memory creating the network");
    free(net->geo.fams.f), free(net->layers), free(net->params), free(net);
    return NULL;
  }
  memcpy(net->geo.fams.f, geo->fams.f, (size_t)geo->fams.n * sizeof(mc_family));
  for (int L = 0; L < net->n_layers; L++) {
    net->layers[L].layer = L;
    net->layers[L].kind = geo->model.pattern[L];
    for (int r = 0; r < MC_ROLE_COUNT; r++) net->layers[L].p[r] = -1;
  }
  net->fam_embed = net->fam_final_norm = net->fam_head = -1;
  for (int fi = 0; fi < geo->fams.n; fi++) {
    const mc_family *f = &geo->fams.f[fi];
    mc_shard sh;
    if (mc_shard_of(geo, fi, MC_STATE_PARAM, rank, &sh)) goto fail;
    if (!sh.in_stage) continue;
    mc_net_param *p = &net->params[net->n_params];
    p->fam = fi;
    p->shard = sh;
    p->numel = 1;
    for (int i = 0; i < f->ndim; i++) p->numel *= sh.local_count[i];
    p->w = net->be->alloc(net->be, (size_t)p->numel * sizeof(float));
    p->g = net->be->alloc(net->be, (size_t)p->numel * sizeof(float));
    if (!p->w || !p->g) {
      net->n_params++;
      goto fail;
    }
    if (init_param(net, p, seed)) {
      net->n_params++;
      goto fail;
    }
    if (f->layer >= 0) net->layers[f->layer].p[f->role] = net->n_params;
    else if (f->role == MC_ROLE_EMBED) net->fam_embed = net->n_params;
    else if (f->role == MC_ROLE_FINAL_NORM) net->fam_final_norm = net->n_params;
    else if (f->role == MC_ROLE_HEAD) net->fam_head = net->n_params;
    net->n_params++;
  }
  if (net->fam_embed < 0 || net->fam_final_norm < 0 || net->fam_head < 0) {
    mc_error("network: the family registry lacks embed.weight, final_norm.weight or head.weight");
    goto fail;
  }
  if (net->be->sync(net->be)) goto fail;
  return net;
fail:
  mc_error_context("creating the network");
  mc_net_free(net);
  return NULL;
}

static void free_activations(mc_net *net) {
  mc_backend *be = net->be;
  for (int L = 0; L < net->n_layers; L++) {
    mc_layer *l = &net->layers[L];
    be->free(be, l->x_in), be->free(be, l->u), be->free(be, l->rstd);
    for (int i = 0; i < MC_LAYER_FBUFS; i++) be->free(be, l->f[i]), l->f[i] = NULL;
    for (int i = 0; i < MC_LAYER_IBUFS; i++) be->free(be, l->i[i]), l->i[i] = NULL;
    free(l->counts_host), free(l->aux_host);
    l->x_in = l->u = l->rstd = NULL;
    l->counts_host = NULL;
    l->aux_host = NULL;
  }
  float **bufs[] = {&net->x, &net->hf, &net->rstd_f, &net->logits, &net->loss, &net->lse, &net->dx, &net->du};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, *bufs[i]), *bufs[i] = NULL;
  for (int i = 0; i < MC_NET_GBUFS; i++) be->free(be, net->g[i]), net->g[i] = NULL;
  be->free(be, net->tok_in), be->free(be, net->tok_tgt);
  net->tok_in = net->tok_tgt = NULL;
  free(net->loss_host);
  net->loss_host = NULL;
  net->n_seq_cap = 0;
}

void mc_net_free(mc_net *net) {
  if (!net) return;
  free_activations(net);
  for (int i = 0; i < net->n_params; i++) {
    net->be->free(net->be, net->params[i].w);
    net->be->free(net->be, net->params[i].g);
  }
  free(net->params);
  free(net->layers);
  free(net->geo.fams.f);
  free(net);
}

int mc_net_n_params(const mc_net *net) { return net->n_params; }

mc_net_param *mc_net_param_at(mc_net *net, int i) {
  return i >= 0 && i < net->n_params ? &net->params[i] : NULL;
}

void mc_net_zero_grad(mc_net *net) {
  for (int i = 0; i < net->n_params; i++) net->be->fill(net->be, net->params[i].g, net->params[i].numel, 0.0f);
}

/* ------------------------------------------------------------------ activations */

/* Allocates the activations and gradient scratch for micro-batches of up to n_seq sequences. */
static int ensure_capacity(mc_net *net, int n_seq) {
  if (n_seq <= net->n_seq_cap) return 0;
  free_activations(net);
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int64_t n = (int64_t)n_seq * m->seq_len, d = m->d_model, vp = mc_vocab_padded(m);
  int64_t gmax[MC_NET_GBUFS] = {0};
  int ok = 1;
#define ALLOC(ptr, count) ok = ok && ((ptr) = be->alloc(be, (size_t)(count) * sizeof(*(ptr)))) != NULL
  for (int L = 0; L < net->n_layers; L++) {
    mc_layer *l = &net->layers[L];
    mc_block_sizes s;
    memset(&s, 0, sizeof s);
    block_ops(l->kind)->sizes(m, n_seq, &s);
    ALLOC(l->x_in, n * d);
    ALLOC(l->u, n * d);
    ALLOC(l->rstd, n);
    for (int i = 0; i < MC_LAYER_FBUFS; i++)
      if (s.f[i]) ALLOC(l->f[i], s.f[i]);
    for (int i = 0; i < MC_LAYER_IBUFS; i++)
      if (s.i[i]) ALLOC(l->i[i], s.i[i]);
    for (int i = 0; i < MC_NET_GBUFS; i++) gmax[i] = s.g[i] > gmax[i] ? s.g[i] : gmax[i];
    if (l->kind == 'E') {
      l->counts_host = calloc((size_t)m->n_experts, sizeof(int32_t));
      l->aux_host = calloc((size_t)n_seq, sizeof(float));
      ok = ok && l->counts_host && l->aux_host;
    }
  }
  for (int i = 0; i < MC_NET_GBUFS; i++)
    if (gmax[i]) ALLOC(net->g[i], gmax[i]);
  ALLOC(net->tok_in, n);
  ALLOC(net->tok_tgt, n);
  ALLOC(net->x, n * d);
  ALLOC(net->hf, n * d);
  ALLOC(net->rstd_f, n);
  ALLOC(net->logits, n * vp);
  ALLOC(net->loss, n);
  ALLOC(net->lse, n);
  ALLOC(net->dx, n * d);
  ALLOC(net->du, n * (vp > d ? vp : d)); /* also holds d(logits) */
#undef ALLOC
  net->loss_host = malloc((size_t)n * sizeof(float));
  if (!ok || !net->loss_host) {
    free_activations(net);
    return mc_error("network: out of memory for the activations of %d sequences of %d tokens", n_seq, m->seq_len);
  }
  net->n_seq_cap = n_seq;
  return 0;
}

/* ------------------------------------------------------------------ passes */

static int forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats) {
  const mc_model *m = &net->m;
  const int T = m->seq_len, d = m->d_model, V = m->vocab_size, Vp = mc_vocab_padded(m);
  const int n = n_seq * T;
  if (n_seq <= 0) return mc_error("network: a micro-batch needs at least one sequence (got %d)", n_seq);
  for (int s = 0; s < n_seq; s++)
    for (int t = 0; t <= T; t++) {
      int32_t v = tokens[(int64_t)s * (T + 1) + t];
      if (v < 0 || v >= V)
        return mc_error("network: token id %d at sequence %d position %d is outside the vocabulary [0, %d)", v, s, t, V);
    }
  if (ensure_capacity(net, n_seq)) return -1;
  mc_backend *be = net->be;
  int32_t *in = malloc((size_t)n * 2 * sizeof(int32_t));
  if (!in) return mc_error("network: out of memory staging tokens");
  for (int s = 0; s < n_seq; s++)
    for (int t = 0; t < T; t++) {
      in[s * T + t] = tokens[(int64_t)s * (T + 1) + t];
      in[n + s * T + t] = tokens[(int64_t)s * (T + 1) + t + 1];
    }
  be->from_host(be, net->tok_in, in, (size_t)n * sizeof(int32_t));
  be->from_host(be, net->tok_tgt, in + n, (size_t)n * sizeof(int32_t));
  free(in);

  be->embed_fwd(be, net->tok_in, n, d, net->params[net->fam_embed].w, net->x);
  for (int L = 0; L < net->n_layers; L++) {
    mc_layer *l = &net->layers[L];
    be->copy(be, l->x_in, net->x, (int64_t)n * d);
    be->rmsnorm_fwd(be, l->x_in, mc_w(net, l, MC_ROLE_NORM), n, d, d, (float)m->norm_eps, l->u, l->rstd);
    if (block_ops(l->kind)->forward(net, l, n_seq, net->x)) return mc_error_context("layer %d (%c)", L, l->kind);
  }
  be->rmsnorm_fwd(be, net->x, net->params[net->fam_final_norm].w, n, d, d, (float)m->norm_eps, net->hf, net->rstd_f);
  mc_linear_fwd(be, net->hf, net->params[net->fam_head].w, n, d, Vp, 0.0f, net->logits);
  be->xent_fwd(be, net->logits, net->tok_tgt, n, V, Vp, net->loss, net->lse);
  be->to_host(be, net->loss_host, net->loss, (size_t)n * sizeof(float));
  if (be->sync(be)) return -1;

  memset(stats, 0, sizeof *stats);
  for (int r = 0; r < n; r++) stats->ce_sum += net->loss_host[r];
  stats->n_tokens = n;
  stats->n_seqs = n_seq;
  for (int L = 0; L < net->n_layers; L++) {
    mc_layer *l = &net->layers[L];
    if (l->kind != 'E') continue;
    for (int s = 0; s < n_seq; s++) stats->aux_sum += m->aux_loss_coef * l->aux_host[s];
    stats->dropped += l->dropped;
  }
  return 0;
}

static int backward(mc_net *net, int n_seq, double ce_weight, double seq_weight) {
  const mc_model *m = &net->m;
  const int T = m->seq_len, d = m->d_model, V = m->vocab_size, Vp = mc_vocab_padded(m);
  const int n = n_seq * T;
  mc_backend *be = net->be;
  /* d(logits) -> du (sized for it); d(hf) -> dx, which is free until the residual pass */
  float *dlogits = net->du, *dh = net->dx;
  be->xent_bwd(be, net->logits, net->tok_tgt, net->lse, n, V, Vp, (float)ce_weight, dlogits);
  be->fill(be, dh, (int64_t)n * d, 0.0f);
  mc_linear_bwd(be, net->hf, net->params[net->fam_head].w, dlogits, n, d, Vp, dh,
                net->params[net->fam_head].g);
  /* final norm: its input is the last residual state, still in net->x */
  be->copy(be, net->du, dh, (int64_t)n * d);
  be->fill(be, net->dx, (int64_t)n * d, 0.0f);
  be->rmsnorm_bwd(be, net->x, net->params[net->fam_final_norm].w, net->rstd_f, net->du, n, d, d, net->dx,
                  net->params[net->fam_final_norm].g);
  for (int L = net->n_layers - 1; L >= 0; L--) {
    mc_layer *l = &net->layers[L];
    be->fill(be, net->du, (int64_t)n * d, 0.0f);
    if (block_ops(l->kind)->backward(net, l, n_seq, net->dx, net->du, seq_weight))
      return mc_error_context("layer %d (%c) backward", L, l->kind);
    be->rmsnorm_bwd(be, l->x_in, mc_w(net, l, MC_ROLE_NORM), l->rstd, net->du, n, d, d, net->dx,
                    mc_g(net, l, MC_ROLE_NORM));
  }
  be->embed_bwd(be, net->tok_in, n, d, net->dx, net->params[net->fam_embed].g);
  return be->sync(be);
}

int mc_net_forward_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight,
                            double seq_weight, mc_net_stats *stats) {
  if (forward(net, tokens, n_seq, stats)) return -1;
  return backward(net, n_seq, ce_weight, seq_weight);
}

int mc_net_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats) {
  return forward(net, tokens, n_seq, stats);
}
