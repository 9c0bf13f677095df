/* The hybrid network on one rank: parameters from the family registry, initialisation from
 * the counter-based RNG, and the forward/backward pass of embedding -> pre-norm residual
 * blocks -> final norm -> untied head -> vocab-masked cross-entropy (docs/model.md). The
 * blocks live in train/block_*.c; every computation is a backend op (kernels/ops.h). Under
 * TP the blocks see a model whose widths are the local ones (heads, inner widths / tp), and
 * this file adds the collectives around them (docs/parallel.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "core/mem_cats.h"
#include "train/device.h"
#include "train/net_blocks.h"
#include "train/pipeline.h"
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

/* Initial value of global element gi of family f (core/families.h documents the kinds). */
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

/* The fp32 values of the local slice [local_start, local_start + local_count) of a family,
 * keyed by the global element index, so every layout draws identical values; malloc'd host
 * array of numel floats, NULL (error set) when out of memory. */
static float *initial_values(const mc_net *net, const mc_net_param *p) {
  const mc_family *f = &net->geo.fams.f[p->fam];
  const mc_shard *s = &p->shard;
  uint64_t stream = mc_rng_stream_of(f->name);
  float *host = malloc((size_t)(p->numel ? p->numel : 1) * sizeof(float));
  if (!host) {
    mc_error("out of memory initialising %s", f->name);
    return NULL;
  }
  int64_t shp[3] = {1, 1, 1}, cnt[3] = {1, 1, 1}, st[3] = {0, 0, 0};
  for (int i = 0; i < f->ndim; i++) shp[i] = f->shape[i], cnt[i] = s->local_count[i], st[i] = s->local_start[i];
  /* Each value depends only on its global index (counter-based), so rows are drawn in
   * parallel with the same result. */
#pragma omp parallel for schedule(static) if (p->numel >= (1 << 16))
  for (int64_t a = 0; a < cnt[0]; a++) {
    int64_t e = a * cnt[1] * cnt[2];
    for (int64_t b = 0; b < cnt[1]; b++)
      for (int64_t c = 0; c < cnt[2]; c++) {
        uint64_t gi = (uint64_t)(((st[0] + a) * shp[1] + st[1] + b) * shp[2] + st[2] + c);
        host[e++] = init_value(&net->m, f, net->seed, stream, gi);
      }
  }
  return host;
}

/* Uploads host fp32 values of a param's local slice into its working weights (w, or w16
 * rounded to bf16 on the host, bit for bit as the backends round). */
static int upload_working(mc_net *net, mc_net_param *p, const float *host) {
  mc_backend *be = net->be;
  if (!p->w16) {
    be->from_host(be, p->w, host, (size_t)p->numel * sizeof(float));
    return 0;
  }
  mc_bf16 *h16 = malloc((size_t)(p->numel ? p->numel : 1) * sizeof(mc_bf16));
  if (!h16) return mc_error("out of memory converting %s to bf16", net->geo.fams.f[p->fam].name);
  for (int64_t i = 0; i < p->numel; i++) h16[i] = mc_bf16_from_float(host[i]);
  be->from_host(be, p->w16, h16, (size_t)p->numel * sizeof(mc_bf16));
  free(h16); /* from_host took its copy */
  return be->sync(be); /* a failed upload surfaces here, at set-up */
}

static int init_param(mc_net *net, mc_net_param *p) {
  float *host = initial_values(net, p);
  if (!host) return -1;
  int rc = upload_working(net, p, host);
  free(host);
  return rc;
}

int mc_net_param_initial(mc_net *net, int i, float *dst) {
  if (i < 0 || i >= net->n_params) return mc_error("network: no param %d", i);
  float *host = initial_values(net, &net->params[i]);
  if (!host) return -1;
  net->be->from_host(net->be, dst, host, (size_t)net->params[i].numel * sizeof(float));
  int rc = net->be->sync(net->be);
  free(host);
  return rc;
}

int mc_net_load_param(mc_net *net, int i, const float *host) {
  if (i < 0 || i >= net->n_params) return mc_error("network: no param %d", i);
  return upload_working(net, &net->params[i], host);
}

/* ------------------------------------------------------------------ creation */

static int comm_size(const mc_comm *c) { return c ? c->size : 1; }

static int check_layout(const mc_geometry *geo, int rank, const mc_comm_groups *comm, const mc_backend *be) {
  const mc_layout *l = &geo->layout;
  if (!be) return mc_error("network: no backend given");
  /* The collectives (train/dist_*.c) hand backend buffers to the communicator: MPI takes
   * host memory, so a device backend needs NCCL (comm/comm_nccl.c). */
  if (geo->world > 1 && comm && comm->world && mc_backend_is_host(be) != !strcmp(comm->world->ops->name, "mpi"))
    return mc_error("network: backend %s cannot use the %s communicator (CPU ranks use MPI, GPU ranks NCCL)", be->name,
                    comm->world->ops->name);
  /* pp > 1: each rank builds its stage's layers; train/pipeline.c moves the boundary rows */
  if (l->pp > 1 && comm && comm_size(comm->pp) != l->pp)
    return mc_error("network: the pp communicator has %d members, the layout %d stages", comm_size(comm->pp), l->pp);
  /* ep > 1: train/dist_ep.c; with pp > 1 an E layer keeps one exchange per micro-batch slot in
   * flight (the EP group lies inside one stage and runs its 1F1B schedule in lockstep) */
  if (l->ep > 1 && comm && comm_size(comm->ep) != l->ep)
    return mc_error("network: the ep communicator has %d members, the layout ep=%d", comm_size(comm->ep), l->ep);
  if (rank < 0 || rank >= geo->world) return mc_error("network: rank %d outside world %d", rank, geo->world);
  if (geo->world > 1 && !comm)
    return mc_error("network: a world of %d ranks (tp=%d dp=%d) needs the layout's communicator groups "
                    "(mc_net_create_dist)", geo->world, l->tp, l->dp);
  if (comm && (comm_size(comm->world) != geo->world || comm_size(comm->tp) != l->tp || comm_size(comm->dp) != l->dp))
    return mc_error("network: communicator groups (world %d, tp %d, dp %d) do not match the layout (world %d, tp %d, dp %d)",
                    comm_size(comm->world), comm_size(comm->tp), comm_size(comm->dp), geo->world, l->tp, l->dp);
  for (int i = 0; geo->model.pattern[i]; i++)
    if (!block_ops(geo->model.pattern[i]))
      return mc_error("model.pattern: block '%c' at layer %d has no implementation", geo->model.pattern[i], i);
  return 0;
}

/* Parameter indices of a layer (ZeRO 3 gathers them together). */
static int layer_params(const mc_layer *l, int *idx) {
  int n = 0;
  for (int r = 0; r < MC_ROLE_COUNT; r++)
    if (l->p[r] >= 0) idx[n++] = l->p[r];
  return n;
}

/* ZeRO 3: the zero3.buffers arena, sized by the holdings (core/holdings.h mc_zero3_slots_of)
 * and cut into train/zero3.c's slots (nothing for other ZeRO stages). */
static int open_zero3_buffers(mc_net *net) {
  if (net->par.zero != 3) return 0;
  mc_zero3_slots slots;
  if (mc_zero3_slots_of(&net->geo, net->rank, &net->hold, &slots)) return -1;
  mc_arena *a = &net->arenas.a[MC_MEM_ZERO3_BUFFERS];
  a->cap = mc_zero3_slots_bytes(&slots);
  return mc_arena_open(a, net->be, MC_MEM_ZERO3_BUFFERS) || mc_zero3_open(&net->par, a, &slots) ? -1 : 0;
}

/* ZeRO 0/1: the dist.staging arena the step's gradient reduction and weight gather are packed
 * through, chunk by chunk (core/holdings.h mc_dist_staging_chunk; nothing where no
 * collective packs). */
static int open_dist_staging(mc_net *net) {
  if (mc_dist_staging_chunk(&net->geo, net->rank, &net->hold, &net->dist_chunk)) return -1;
  mc_arena *a = &net->arenas.a[MC_MEM_DIST_STAGING];
  a->cap = net->dist_chunk ? mc_dist_staging_bytes(&net->geo, net->rank, &net->hold) : 0;
  return a->cap < 0 ? -1 : mc_arena_open(a, net->be, MC_MEM_DIST_STAGING);
}

/* ZeRO 3's gather sets of this stage, numbered in forward order: SET_EMBED the embedding
 * (first stage), the layers by number, n_layers the final norm with the head (last stage).
 * Their params into idx; 0 for a set this stage does not have. */
enum { SET_EMBED = -1 };
static int set_params(const mc_net *net, int set, int *idx) {
  if (set == SET_EMBED) return net->first ? (idx[0] = net->fam_embed, 1) : 0;
  if (set == net->m.n_layers) return net->last ? (idx[0] = net->fam_final_norm, idx[1] = net->fam_head, 2) : 0;
  return set >= net->L0 && set < net->L1 ? layer_params(&net->layers[set], idx) : 0;
}

/* ZeRO 3's gather of a set's working weights before the pass uses them, with the gather of
 * the set the pass takes next (the one after it in a forward, before it in a backward)
 * started meanwhile, and their release (after a backward: the reduce-scatter of their
 * gradients) right after. */
static int acquire(mc_net *net, int set, int for_backward) {
  int idx[MC_ROLE_COUNT], next[MC_ROLE_COUNT];
  const int n = set_params(net, set, idx), n_next = set_params(net, for_backward ? set - 1 : set + 1, next);
  return mc_zero3_acquire(&net->par, net->be, net->params, idx, n, for_backward, next, n_next);
}

/* ... and under ZeRO 0/1 in the step's last backward, the start of the set's gradient
 * reduction (mc_dist_reduce_set). */
static int release(mc_net *net, int set, int after_backward) {
  int idx[MC_ROLE_COUNT];
  const int n = set_params(net, set, idx);
  if (mc_zero3_release(&net->par, net->be, net->params, idx, n, after_backward)) return -1;
  if (!after_backward || !net->reduce_in_bwd || n == 0) return 0;
  return mc_dist_reduce_set(&net->par, net->be, &net->arenas.a[MC_MEM_DIST_STAGING], net->params, idx, n);
}

void mc_net_reduce_in_backward(mc_net *net, int on) {
  net->reduce_in_bwd = on && net->par.zero < 3 && net->dist_chunk > 0;
}

mc_net *mc_net_create(const mc_geometry *geo, int rank, uint64_t seed) {
  return mc_net_create_dist_on(geo, rank, seed, NULL, mc_backend_cpu());
}

mc_net *mc_net_create_on(const mc_geometry *geo, int rank, uint64_t seed, mc_backend *be) {
  return mc_net_create_dist_on(geo, rank, seed, NULL, be);
}

mc_net *mc_net_create_dist(const mc_geometry *geo, int rank, uint64_t seed, const mc_comm_groups *comm) {
  return mc_net_create_dist_on(geo, rank, seed, comm, mc_backend_cpu());
}

mc_net *mc_net_create_dist_on(const mc_geometry *geo, int rank, uint64_t seed, const mc_comm_groups *comm,
                              mc_backend *be) {
  if (check_layout(geo, rank, comm, be)) return NULL;
  mc_param_hold *holds = NULL;
  mc_net *net = calloc(1, sizeof *net);
  if (!net) {
    mc_error("out of memory creating the network");
    return NULL;
  }
  const mc_layout *lay = &geo->layout;
  mc_coords co;
  mc_layout_coords(lay, rank, &co);
  net->be = be;
  net->geo = *geo;
  net->geo.fams.f = malloc((size_t)geo->fams.n * sizeof(mc_family));
  mc_net_par *par = &net->par;
  par->comm = comm;
  par->tp = lay->tp, par->tp_rank = co.tp_rank;
  par->sp = lay->sp && lay->tp > 1;
  par->zero = lay->zero;
  par->ep = lay->ep > 1 ? lay->ep : 1;
  par->T = geo->model.seq_len;
  par->T_res = par->sp ? geo->model.seq_len / lay->tp : geo->model.seq_len;
  /* Per-sequence capacity needs each sequence's order, so under SP an E block with capacity
   * gathers whole sequences; dropless routing works on the shard. */
  par->moe_T = geo->model.capacity_factor > 0 ? geo->model.seq_len : par->T_res;
  par->Vpl = mc_vocab_padded(&geo->model) / lay->tp;
  par->v0 = par->Vpl * co.tp_rank;
  par->Vl = geo->model.vocab_size - par->v0;
  par->Vl = par->Vl < 0 ? 0 : par->Vl > par->Vpl ? par->Vpl : par->Vl;
  net->m = mc_model_local(&geo->model, lay->tp); /* the blocks see this rank's local widths */
  net->rank = rank;
  net->seed = seed;
  net->stage = co.pp_rank;
  net->L0 = geo->stages.first[co.pp_rank];
  net->L1 = net->L0 + geo->stages.count[co.pp_rank];
  net->first = co.pp_rank == 0;
  net->last = co.pp_rank == lay->pp - 1;
  net->hold = (mc_hold_opts){.bf16_weights = be->bf16_weights, .act16 = be->bf16_weights, .moe_dense = 1};
  net->n_layers = geo->model.n_layers;
  net->layers = calloc((size_t)(net->n_layers ? net->n_layers : 1), sizeof(mc_layer));
  net->params = calloc((size_t)geo->fams.n, sizeof(mc_net_param));
  par->dist = calloc((size_t)geo->fams.n, sizeof(mc_dist_param));
  if (!net->geo.fams.f || !net->layers || !net->params || !par->dist) {
    mc_error("out of memory creating the network");
    free(net->geo.fams.f), free(net->layers), free(net->params), free(par->dist), free(net);
    return NULL;
  }
  memcpy(net->geo.fams.f, geo->fams.f, (size_t)geo->fams.n * sizeof(mc_family));
  for (int L = 0; L < net->n_layers; L++) {
    net->layers[L].layer = L;
    net->layers[L].kind = geo->model.pattern[L];
    net->layers[L].bk = mc_block_kind_of(geo->model.pattern[L]);
    for (int r = 0; r < MC_ROLE_COUNT; r++) net->layers[L].p[r] = -1;
  }
  net->fam_embed = net->fam_final_norm = net->fam_head = -1;
  /* Sizing pass: every parameter's working slice (ZeRO 3: its persistent shard) and gradient,
   * as the holdings function gives them (core/holdings.h), counted in its category's arena;
   * then one allocation per category and the same tensors carved out of them in the same order. */
  holds = malloc((size_t)geo->fams.n * sizeof *holds);
  if (!holds) {
    mc_error("out of memory creating the network");
    goto fail;
  }
  for (int fi = 0; fi < geo->fams.n; fi++) {
    mc_param_hold h;
    if (mc_param_hold_of(geo, fi, rank, &net->hold, &h)) goto fail;
    if (!h.in_stage) continue;
    holds[net->n_params] = h;
    mc_net_param *p = &net->params[net->n_params++];
    p->fam = fi;
    p->shard = h.shard;
    p->numel = h.local_numel;
    p->z_off = h.z_off;
    p->z_numel = h.z_numel;
    mc_arena_count(&net->arenas.a[h.param_cat], h.working_bytes);
    mc_arena_count(&net->arenas.a[MC_MEM_GRADS], h.grad_bytes);
  }
  for (int c = 0; c < MC_MEM_COUNT; c++)
    if (mc_arena_open(&net->arenas.a[c], be, (mc_mem_cat)c)) goto fail;
  for (int idx = 0; idx < net->n_params; idx++) {
    mc_net_param *p = &net->params[idx];
    const mc_family *f = &geo->fams.f[p->fam];
    const mc_param_hold *h = &holds[idx];
    p->compute_bf16 = h->compute_bf16;
    if (h->working_bf16) { /* bf16 working weights: the whole local slice (ZeRO 0 or 1) */
      p->w16 = mc_arena_take(&net->arenas.a[h->param_cat], h->working_bytes, h->param_cat);
      if (!p->w16 || !(p->g = mc_arena_take(&net->arenas.a[MC_MEM_GRADS], h->grad_bytes, MC_MEM_GRADS)) || init_param(net, p))
        goto fail;
    } else {
      float *w = mc_arena_take(&net->arenas.a[h->param_cat], h->working_bytes, h->param_cat);
      if (!w || !(p->g = mc_arena_take(&net->arenas.a[MC_MEM_GRADS], h->grad_bytes, MC_MEM_GRADS))) goto fail;
      /* ZeRO 3 initialises the whole local slice in a start-up buffer and keeps its rows. */
      p->w = par->zero == 3 ? be->alloc(be, (size_t)p->numel * sizeof(float)) : w;
      if (!p->w || init_param(net, p)) goto fail;
      if (par->zero == 3) {
        p->ws = w;
        be->copy(be, p->ws, p->w + p->z_off, p->z_numel);
        be->free(be, p->w);
        p->w = NULL;
      }
    }
    if (f->layer >= 0) net->layers[f->layer].p[f->role] = idx;
    else if (f->role == MC_ROLE_EMBED) net->fam_embed = idx;
    else if (f->role == MC_ROLE_FINAL_NORM) net->fam_final_norm = idx;
    else if (f->role == MC_ROLE_HEAD) net->fam_head = idx;
  }
  if ((net->first && net->fam_embed < 0) || (net->last && (net->fam_final_norm < 0 || net->fam_head < 0))) {
    mc_error("network: the family registry lacks embed.weight, final_norm.weight or head.weight");
    goto fail;
  }
  if (mc_dist_setup(par, &net->geo, rank, net->params, net->n_params) || open_zero3_buffers(net) || open_dist_staging(net)) goto fail;
  if (net->be->sync(net->be)) goto fail;
  free(holds);
  return net;
fail:
  mc_error_context("creating the network");
  free(holds);
  mc_net_free(net);
  return NULL;
}

static void free_activations(mc_net *net) {
  /* with pipeline slots the layers hold a copy of one slot's pointers: the slots own them */
  const int nl = net->L1 - net->L0;
  for (int k = 0; net->slots && k < net->n_slots * nl; k++) free(net->slots[k].counts_host), free(net->slots[k].aux_host);
  free(net->slots);
  net->slots = NULL;
  for (int L = 0; L < net->n_layers; L++) {
    mc_layer *l = &net->layers[L];
    for (int i = 0; i < MC_LAYER_FBUFS; i++) l->f[i] = NULL;
    for (int i = 0; i < MC_LAYER_IBUFS; i++) l->i[i] = NULL;
    if (net->n_slots <= 1) free(l->counts_host), free(l->aux_host);
    l->x_in = l->u = l->rstd = NULL;
    l->u16 = NULL;
    l->counts_host = NULL;
    l->aux_host = NULL;
  }
  mc_net_par *par = &net->par;
  float **bufs[] = {&net->x,    &net->hf,  &net->rstd_f, &net->logits, &net->loss,     &net->lse,
                    &net->dx,   &net->du,  &net->y,      &par->ush,    &net->full,     &par->ufull,
                    &net->dlogits, &par->emb_rows, &par->emb_gate};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = NULL;
  for (int i = 0; i < MC_NET_GBUFS; i++) net->g[i] = NULL;
  net->ws = NULL;
  net->ws_bytes = 0;
  net->tok_in = net->tok_tgt = par->emb_tok = par->emb_slot = NULL;
  mc_arena_close(&net->arenas.a[MC_MEM_ACTIVATIONS]);
  mc_ep_free(par); /* the routes point into moe.scratch, sized with the activations */
  mc_arena_close(&net->arenas.a[MC_MEM_MOE_SCRATCH]);
  free(net->loss_host), free(par->lse_host), free(par->tgt_host);
  net->loss_host = par->lse_host = NULL;
  par->tgt_host = NULL;
  net->n_seq_cap = 0;
  net->n_slots = 0;
  net->cur_slot = 0;
}

void mc_net_free(mc_net *net) {
  if (!net) return;
  free_activations(net);
  mc_zero3_close(&net->par);
  mc_arenas_close(&net->arenas);
  mc_dist_free(&net->par, net->n_params);
  free(net->par.dist);
  free(net->params);
  free(net->layers);
  free(net->geo.fams.f);
  free(net);
}

int mc_net_n_params(const mc_net *net) { return net->n_params; }

mc_backend *mc_net_backend(const mc_net *net) { return net->be; }

mc_net_param *mc_net_param_at(mc_net *net, int i) {
  return i >= 0 && i < net->n_params ? &net->params[i] : NULL;
}

void mc_net_zero_grad(mc_net *net) {
  for (int i = 0; i < net->n_params; i++) {
    mc_net_param *p = &net->params[i];
    net->be->fill(net->be, p->g, net->par.zero == 3 ? p->z_numel : p->numel, 0.0f);
  }
}

/* ------------------------------------------------------------------ activations */

/* One buffer of the activations arena: counted (count = 1, NULL returned) or carved. */
static void *place_buf(mc_arena *a, int count, const mc_act_buf *b, const mc_act_shape *s, int *ok) {
  const int64_t bytes = mc_act_buf_bytes(b, s);
  /* mc_layout_check bounds every buffer of a validated config; the sizes saturate beyond */
  if (bytes > MC_MAX_BUF_ELEMS * 4) {
    if (*ok) mc_error("activation buffer %s of %d sequences of %d tokens: more than 2^44 bytes", b->name, s->n_seq, s->T_res);
    *ok = 0;
    return NULL;
  }
  if (count) {
    mc_arena_count(a, bytes);
    return NULL;
  }
  void *p = mc_arena_take(a, bytes, MC_MEM_ACTIVATIONS);
  *ok = *ok && p != NULL;
  return p;
}

/* A buffer of a layer: its own place in the arena when the recompute policy keeps it (core/
 * holdings.h mc_act_buf_kept), else the next place in the working set net->ws, which every
 * layer's dropped buffers share (*ws_off: the layer's dropped bytes so far, footprints). */
static void *place_layer_buf(mc_net *net, mc_arena *a, int count, const mc_act_buf *b, const mc_act_shape *s,
                             int64_t *ws_off, int *ok) {
  if (mc_act_buf_kept(b, net->hold.recompute)) return place_buf(a, count, b, s, ok);
  const int64_t at = *ws_off;
  *ws_off += mc_mem_footprint(mc_act_buf_bytes(b, s));
  if (count) return NULL;
  *ok = *ok && net->ws && *ws_off <= net->ws_bytes;
  return *ok ? (char *)net->ws + at : NULL;
}

/* Places the activations and gradient scratch for micro-batches of n_seq sequences in the
 * activations arena: counts them (count = 1) or carves them (count = 0), in the same order.
 * What exists, its size and its storage are the block-kind table's and the holdings
 * function's (core/blocks.h, core/holdings.h), so mcplan counts exactly these buffers. Under
 * recomputation the buffers the policy drops share one working set, as large as the largest
 * layer's dropped buffers (mc_stage_hold's transient); the count pass sizes it. */
static int place_activations(mc_net *net, int n_seq, int n_slots, int count) {
  mc_arena *a = &net->arenas.a[MC_MEM_ACTIVATIONS];
  mc_act_shape s;
  mc_act_shape_of(&net->geo, net->stage, &net->hold, n_seq, &s); /* the rank's stage */
  int64_t gmax[MC_NET_GBUFS] = {0};
  int ok = 1;
  const int nl = net->L1 - net->L0;
  if (count) {
    net->ws_bytes = 0;
  } else if (net->ws_bytes > 0) {
    ok = (net->ws = mc_arena_take(a, net->ws_bytes, MC_MEM_ACTIVATIONS)) != NULL;
  }
  /* pipeline slots: the stage's layer buffers once per micro-batch in flight (core/holdings.h
   * mc_stage_hold_of's inflight sets) */
  if (!count && n_slots > 1 && ok) ok = (net->slots = calloc((size_t)(n_slots * nl), sizeof(mc_layer))) != NULL;
  for (int slot = 0; slot < n_slots && ok; slot++)
  for (int L = net->L0; L < net->L1; L++) {
    mc_layer *l = &net->layers[L];
    const mc_block_kind *k = l->bk;
    int64_t ws_off = 0;
    l->f16 = l->g16 = 0;
    for (int j = 0; j < MC_L_NBUFS; j++) {
      const mc_act_buf *b = &mc_layer_bufs[j];
      if (!mc_act_buf_exists(b, &s, k)) continue;
      void *p = place_layer_buf(net, a, count, b, &s, &ws_off, &ok);
      if (j == MC_L_X_IN) l->x_in = p;
      else if (j == MC_L_RSTD) l->rstd = p;
      else if (mc_act_buf_bf16(b, &s)) l->u16 = p; /* the norm writes it in bf16, there is no fp32 u */
      else l->u = p; /* under SP the shard; blocks that need whole sequences re-gather it */
    }
    for (int i = 0; i < k->n_saved; i++)
      if (mc_act_buf_exists(&k->saved[i], &s, k)) {
        l->f[i] = place_layer_buf(net, a, count, &k->saved[i], &s, &ws_off, &ok);
        l->f16 |= (unsigned)mc_act_buf_bf16(&k->saved[i], &s) << i;
      }
    for (int i = 0; i < k->n_saved_i32; i++)
      if (mc_act_buf_exists(&k->saved_i32[i], &s, k)) l->i[i] = place_layer_buf(net, a, count, &k->saved_i32[i], &s, &ws_off, &ok);
    if (count && ws_off > net->ws_bytes) net->ws_bytes = ws_off;
    for (int i = 0; i < k->n_grads; i++)
      if (mc_act_buf_exists(&k->grads[i], &s, k)) {
        const int64_t b = mc_act_buf_bytes(&k->grads[i], &s);
        gmax[i] = b > gmax[i] ? b : gmax[i];
        l->g16 |= (unsigned)mc_act_buf_bf16(&k->grads[i], &s) << i;
      }
    if (k->routes && !count) {
      l->counts_host = calloc((size_t)net->m.n_experts, sizeof(int32_t));
      l->aux_host = calloc((size_t)n_seq, sizeof(float));
      ok = ok && l->counts_host && l->aux_host;
    }
    if (!count && n_slots > 1) net->slots[slot * nl + L - net->L0] = *l;
  }
  if (count && net->ws_bytes > 0) mc_arena_count(a, net->ws_bytes); /* a multiple of MC_MEM_ALIGN: its own footprint */
  if (!count) net->n_slots = n_slots, net->cur_slot = n_slots - 1; /* the layers hold the last slot */
  /* gradient scratch i: the largest buffer i of any kind (the backward is sequential) */
  for (int i = 0; i < MC_NET_GBUFS; i++) {
    if (!gmax[i]) continue;
    if (count) mc_arena_count(a, gmax[i]);
    else ok = ok && (net->g[i] = mc_arena_take(a, gmax[i], MC_MEM_ACTIVATIONS)) != NULL;
  }
  net->nb16 = 0;
  void *nb[MC_NB_COUNT] = {0};
  for (int j = 0; j < MC_NB_COUNT; j++)
    if (mc_act_buf_exists(&mc_net_bufs[j], &s, NULL)) {
      nb[j] = place_buf(a, count, &mc_net_bufs[j], &s, &ok);
      net->nb16 |= (unsigned)mc_act_buf_bf16(&mc_net_bufs[j], &s) << j;
    }
  if (count || !ok) return ok ? 0 : -1;
  net->tok_in = nb[MC_NB_TOK_IN], net->tok_tgt = nb[MC_NB_TOK_TGT];
  net->x = nb[MC_NB_X], net->hf = nb[MC_NB_HF], net->rstd_f = nb[MC_NB_RSTD_F];
  net->logits = nb[MC_NB_LOGITS], net->loss = nb[MC_NB_LOSS], net->lse = nb[MC_NB_LSE];
  net->dx = nb[MC_NB_DX], net->du = nb[MC_NB_DU], net->y = nb[MC_NB_Y], net->full = nb[MC_NB_FULL];
  net->dlogits = nb[MC_NB_DLOGITS];
  mc_net_par *par = &net->par;
  par->ush = nb[MC_NB_USH], par->ufull = nb[MC_NB_UFULL];
  par->emb_tok = nb[MC_NB_EMB_TOK], par->emb_slot = nb[MC_NB_EMB_SLOT];
  par->emb_rows = nb[MC_NB_EMB_ROWS], par->emb_gate = nb[MC_NB_EMB_GATE];
  /* host-side staging (not backend memory) */
  const int64_t n = (int64_t)n_seq * net->m.seq_len;
  if (par->tp > 1) {
    ok = ok && (par->lse_host = malloc((size_t)n * sizeof(float))) != NULL;
    ok = ok && (par->tgt_host = malloc((size_t)n * sizeof(int32_t))) != NULL;
  }
  ok = ok && (net->loss_host = malloc((size_t)n * sizeof(float))) != NULL;
  return ok ? 0 : mc_error("out of host memory for the loss staging buffers");
}

/* Makes the activations arena (and under EP the moe.scratch arena, train/dist_ep.c) hold
 * micro-batches of up to n_seq sequences (one allocation each; a larger micro-batch later
 * replaces them). */
static int ensure_capacity(mc_net *net, int n_seq, int n_slots) {
  if (n_seq <= net->n_seq_cap && n_slots <= net->n_slots) return 0;
  /* the blocks and kernels count a micro-batch's tokens in an int (mc_layout_check bounds it) */
  if ((int64_t)n_seq * net->m.seq_len > INT32_MAX)
    return mc_error("network: %d sequences of %d tokens are more than 2^31-1 tokens in one micro-batch", n_seq,
                    net->m.seq_len);
  if (strchr(net->m.pattern, 'E') && (int64_t)n_seq * net->m.seq_len * net->m.top_k > INT32_MAX) /* int32 routing slots */
    return mc_error("network: %d sequences of %d tokens with model.top_k=%d are more than 2^31-1 routed rows", n_seq,
                    net->m.seq_len, net->m.top_k);
  if (n_seq < net->n_seq_cap) n_seq = net->n_seq_cap;
  if (n_slots < net->n_slots) n_slots = net->n_slots;
  free_activations(net);
  if (place_activations(net, n_seq, n_slots, 1) ||
      mc_arena_open(&net->arenas.a[MC_MEM_ACTIVATIONS], net->be, MC_MEM_ACTIVATIONS) ||
      place_activations(net, n_seq, n_slots, 0) || mc_ep_reserve(net, n_seq, n_slots)) {
    free_activations(net);
    return mc_error_context("network: the activations of %d sequences of %d tokens", n_seq, net->m.seq_len);
  }
  net->n_seq_cap = n_seq;
  return 0;
}

int mc_net_reserve(mc_net *net, int n_seq) {
  if (n_seq < 1) return mc_error("network: a micro-batch needs at least one sequence (got %d)", n_seq);
  return ensure_capacity(net, n_seq, 1);
}

/* Micro-batches whose activations a stage keeps at once under 1F1B: min(pp - stage, n_micro)
 * (core/holdings.h mc_stage_hold_of's inflight); 1 at pp = 1. */
static int slots_for(const mc_net *net, int n_micro) {
  const int pp = net->geo.layout.pp, want = pp - net->stage;
  return pp <= 1 || n_micro < 1 ? 1 : want < n_micro ? want : n_micro;
}

int mc_net_reserve_micro(mc_net *net, int n_seq, int n_micro) {
  if (n_seq < 1) return mc_error("network: a micro-batch needs at least one sequence (got %d)", n_seq);
  return ensure_capacity(net, n_seq, slots_for(net, n_micro));
}

void mc_net_mem_bytes(const mc_net *net, int64_t bytes[MC_MEM_COUNT]) { mc_arenas_add_bytes(&net->arenas, bytes); }

/* ------------------------------------------------------------------ passes */

/* How a block meets the TP group. Column/row-parallel blocks (A, M, R) take whole sequences
 * and give partial sums; E blocks are never TP-split: without SP every TP rank computes the
 * same MoE on the same tokens, with SP each its shard, or (capacity) every rank the whole
 * gathered sequences, keeping its shard's rows of the output. */
typedef enum { ROWS_LOCAL, ROWS_SPLIT, ROWS_GATHERED } block_rows;

static block_rows rows_of(const mc_net *net, const mc_layer *l) {
  const mc_net_par *par = &net->par;
  if (par->tp <= 1) return ROWS_LOCAL;
  if (!l->bk->routes) return ROWS_SPLIT;
  return par->sp && par->moe_T != par->T_res ? ROWS_GATHERED : ROWS_LOCAL;
}

/* Rows [n_seq * T, d] that are partial over TP, summed: under SP reduce-scattered into the
 * shard par->ush, else all-reduced in place. Returns the summed residual rows, or NULL. With
 * a ticket the sum runs on the side queue (comm/comm.h) and *ticket is what to wait for. */
static float *tp_sum(mc_net *net, float *full, int n_seq, int *ticket) {
  mc_net_par *par = &net->par;
  mc_comm *g = par->comm->tp;
  const int d = net->m.d_model;
  if (ticket && mc_comm_side_begin(g)) return NULL;
  const int rc = par->sp ? mc_sp_reduce_scatter(par, net->be, full, par->ush, n_seq, d)
                         : mc_tp_allreduce(par, net->be, full, (int64_t)n_seq * net->m.seq_len * d);
  if (ticket && (mc_comm_side_end(g, ticket) || rc)) return NULL;
  return rc ? NULL : par->sp ? par->ush : full;
}

/* Runs a block's forward into out (dy NULL; out NULL: the saved buffers only) or its
 * backward from the output gradient dy into net->du (seq_weight scales the aux loss). Under
 * SP the layer keeps only its shard of the normed input; a block that needs whole sequences
 * sees them all-gathered into a shared buffer for the call, before the forward and again
 * for the backward (so only shards are kept per layer). A split block's backward reads them
 * only in its weight products (mc_in_projs_bwd), so there the gather runs on the side queue
 * under the block's earlier work, and the layer's u is NULL until those products wait for it. */
static int with_whole_input(mc_net *net, mc_layer *l, int n_seq, block_rows how, const float *dy, double seq_weight,
                            float *out) {
  float *shard = l->u;
  mc_bf16 *shard16 = l->u16; /* under mc_act16 a block whose u feeds only products has it in bf16 */
  if (net->par.sp && how != ROWS_LOCAL) {
    const int side = dy && how == ROWS_SPLIT;
    mc_comm *g = net->par.comm->tp;
    int rc = side && mc_comm_side_begin(g);
    rc = rc || mc_sp_gather(&net->par, net->be, shard16 ? (const void *)shard16 : shard, net->par.ufull, n_seq,
                            net->m.d_model, shard16 != NULL);
    if (side && (mc_comm_side_end(g, &net->u_side.ticket) || rc)) return -1;
    if (rc) return -1;
    if (shard16) l->u16 = (mc_bf16 *)net->par.ufull;
    else l->u = net->par.ufull;
    if (side) {
      net->u_side.pending = 1, net->u_side.u = l->u, net->u_side.u16 = l->u16;
      l->u = NULL, l->u16 = NULL;
    }
  }
  int rc = !dy ? block_ops(l->kind)->forward(net, l, n_seq, out)
               : block_ops(l->kind)->backward(net, l, n_seq, dy, net->du, seq_weight);
  if (!rc && net->u_side.pending) rc = mc_error("layer %c's backward never read its input (mc_in_projs_bwd)", l->kind);
  net->u_side.pending = 0;
  l->u = shard, l->u16 = shard16;
  return rc;
}

int mc_in_projs_bwd(mc_net *net, mc_layer *L, const mc_in_proj *p, int k, int n, float *du) {
  mc_backend *be = net->be;
  const int d = net->m.d_model;
  for (int i = 0; i < k; i++) mc_linear_bwd_x(be, p[i].W, p[i].dp, n, d, p[i].out, mc_o32(du), i ? 1.0f : 0.0f);
  if (net->du_sum.wanted && !net->du_sum.started) {
    if (!tp_sum(net, du, net->du_sum.n_seq, &net->du_sum.ticket)) return -1;
    net->du_sum.started = 1;
  }
  if (net->u_side.pending) {
    if (mc_comm_side_wait(net->par.comm->tp, net->u_side.ticket)) return -1;
    L->u = net->u_side.u, L->u16 = net->u_side.u16, net->u_side.pending = 0;
  }
  for (int i = 0; i < k; i++) mc_linear_bwd_w(be, mc_uin(L), p[i].dp, n, d, p[i].out, p[i].dW);
  return 0;
}

/* The profiler's label (mc_backend.scope) of a block kind's forward or backward. */
static const char *kind_scope(char kind, int backward) {
  static const char *const fwd[] = {"A fwd", "M fwd", "E fwd", "R fwd"}, *const bwd[] = {"A bwd", "M bwd", "E bwd", "R bwd"};
  const char *at = strchr("AMER", kind);
  if (!kind || !at) return backward ? "block bwd" : "block fwd";
  return (backward ? bwd : fwd)[at - "AMER"];
}

/* x += f(u) for one block, with the collectives around it. */
static int block_forward(mc_net *net, mc_layer *l, int n_seq) {
  mc_backend *be = net->be;
  const mc_net_par *par = &net->par;
  const int d = net->m.d_model, n = n_seq * net->m.seq_len, nl = n_seq * par->T_res;
  const block_rows how = rows_of(net, l);
  be->rmsnorm_fwd(be, l->x_in, mc_w(net, l, MC_ROLE_NORM), nl, d, d, (float)net->m.norm_eps,
                  l->u16 ? mc_o16(l->u16) : mc_o32(l->u), l->rstd);
  /* a block on its local rows adds straight into the residual stream; otherwise its output is
   * combined over TP first */
  if (how == ROWS_LOCAL) return block_ops(l->kind)->forward(net, l, n_seq, net->x);
  be->fill(be, net->y, (int64_t)n * d, 0.0f);
  if (with_whole_input(net, l, n_seq, how, NULL, 0.0, net->y)) return -1;
  const float *sum = par->ush;
  if (how == ROWS_GATHERED) mc_sp_take(par, be, net->y, par->ush, n_seq, d);
  else if (!(sum = tp_sum(net, net->y, n_seq, NULL))) return -1; /* a split block's partial outputs */
  be->axpy(be, net->x, sum, (int64_t)nl * d, 1.0f);
  return 0;
}

/* Recomputation (train.recompute): rebuilds the buffers of layer l that the policy did not
 * keep, from the ones it kept, just before the layer's backward (its weights acquired). The
 * norm runs again on the kept input x_in (u; rstd gets the same values). Under full the
 * block's whole forward runs again with the same ops on the same operands, so every buffer
 * gets the same bits: an E block routes again to the same experts (and under ep > 1 exchanges
 * its rows again over the EP group), rewriting its host-side counts and aux terms with the
 * same values, while the aux loss stays counted once (the forward's statistics add it, the
 * backward's gradient is moe_route_bwd's alone). The block's output is not made (forward
 * with x NULL: no output projection or MoE combine), nor the collectives that would combine
 * it over TP (every TP rank skips them alike; the gathers of the input under SP run as in
 * the forward, since the block reads whole rows). Under selective the kind's rebuild redoes
 * its elementwise, conv, scan and attention-core buffers from the kept products' outputs.
 * The working set is shared by every layer and micro-batch slot, so the rebuild is complete:
 * nothing of an earlier layer's forward survives there (MC_RECOMPUTE_POISON checks it). */
static int layer_recompute(mc_net *net, mc_layer *l, int n_seq) {
  const mc_recompute r = net->hold.recompute;
  if (r == MC_RECOMPUTE_NONE) return 0;
  mc_backend *be = net->be;
  const int d = net->m.d_model, nl = n_seq * net->par.T_res;
  if (net->ws_poison && net->ws) be->fill(be, net->ws, net->ws_bytes / (int64_t)sizeof(float), NAN);
  be->rmsnorm_fwd(be, l->x_in, mc_w(net, l, MC_ROLE_NORM), nl, d, d, (float)net->m.norm_eps,
                  l->u16 ? mc_o16(l->u16) : mc_o32(l->u), l->rstd);
  if (r == MC_RECOMPUTE_SELECTIVE) return block_ops(l->kind)->rebuild(net, l, n_seq);
  return with_whole_input(net, l, n_seq, rows_of(net, l), NULL, 0.0, NULL);
}

int mc_net_set_recompute(mc_net *net, mc_recompute r) {
  if (r != MC_RECOMPUTE_NONE && r != MC_RECOMPUTE_SELECTIVE && r != MC_RECOMPUTE_FULL)
    return mc_error("network: unknown recompute policy %d", (int)r);
  const char *poison = getenv("MC_RECOMPUTE_POISON");
  net->ws_poison = poison && !strcmp(poison, "1");
  if (r == net->hold.recompute) return 0;
  const int cap = net->n_seq_cap, slots = net->n_slots;
  net->hold.recompute = r;
  if (cap <= 0) return 0; /* placed by the first reserve or pass */
  free_activations(net);
  return ensure_capacity(net, cap, slots > 1 ? slots : 1);
}

/* The final norm's output as the head's products read it (bf16 under mc_act16). */
static mc_operand hf_in(const mc_net *net) { return mc_netbuf_in(net, MC_NB_HF, net->hf); }

/* The embedding of the n input tokens (host ids in) into the residual stream. Under TP the
 * embedding is vocab-parallel: each rank's rows of its tokens, summed over TP (or
 * reduce-scattered into the residual shard under SP). */
static int embed_forward(mc_net *net, const int32_t *in, int n_seq) {
  mc_backend *be = net->be;
  const mc_net_par *par = &net->par;
  const int n = n_seq * net->m.seq_len, d = net->m.d_model;
  const float *w = net->params[net->fam_embed].w;
  if (par->tp <= 1) {
    be->embed_fwd(be, net->tok_in, n, d, w, net->x);
    return 0;
  }
  float *rows = par->sp ? net->full : net->x;
  if (mc_vp_embed_fwd(&net->par, be, w, in, n, d, rows)) return -1;
  if (par->sp) return mc_sp_reduce_scatter(par, be, rows, net->x, n_seq, d);
  return mc_tp_allreduce(par, be, net->x, (int64_t)n * d);
}

/* The stage's part of the forward pass of a micro-batch: the first stage starts from the
 * embedding, another from the boundary activation already in net->x (train/pipeline.c
 * received it); the last stage ends with the final norm, head and loss. stats: the stage's
 * sums (cross-entropy on the last stage only, the aux losses of its E layers); n_tokens and
 * n_seqs count the micro-batch on every stage. */
int mc_net_stage_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats) {
  const mc_model *m = &net->m;
  mc_net_par *par = &net->par;
  const int T = m->seq_len, d = m->d_model, V = m->vocab_size, Vp = par->Vpl;
  const int n = n_seq * T, nl = n_seq * par->T_res;
  if (n_seq <= 0) return mc_error("network: a micro-batch needs at least one sequence (got %d)", n_seq);
  for (int s = 0; s < n_seq; s++)
    for (int t = 0; t <= T; t++) {
      int32_t v = tokens[(int64_t)s * (T + 1) + t];
      if (v < 0 || v >= V)
        return mc_error("network: token id %d at sequence %d position %d is outside the vocabulary [0, %d)", v, s, t, V);
    }
  if (ensure_capacity(net, n_seq, 1)) return -1;
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

  int rc = 0;
  const int fin = m->n_layers;
  be->scope = "embed fwd";
  if (net->first) {
    rc = acquire(net, SET_EMBED, 0);
    if (!rc) rc = embed_forward(net, in, n_seq);
    if (!rc) rc = release(net, SET_EMBED, 0);
  }
  for (int L = net->L0; L < net->L1 && !rc; L++) {
    mc_layer *l = &net->layers[L];
    be->scope = kind_scope(l->kind, 0);
    be->copy(be, l->x_in, net->x, (int64_t)nl * d);
    if (acquire(net, L, 0) || block_forward(net, l, n_seq) || release(net, L, 0))
      rc = mc_error_context("layer %d (%c)", L, l->kind);
  }
  be->scope = "head fwd";
  if (!rc && net->last) rc = acquire(net, fin, 0);
  if (!rc && net->last) {
    /* under mc_act16 hf feeds only the head's products: kept in bf16 (under SP the shard's
     * rows too, gathered as they are) */
    const mc_dst hf = mc_netbuf_out(net, MC_NB_HF, par->sp ? par->ush : net->hf);
    be->rmsnorm_fwd(be, net->x, net->params[net->fam_final_norm].w, nl, d, d, (float)m->norm_eps, hf, net->rstd_f);
    if (par->sp) rc = mc_sp_gather(par, be, par->ush, net->hf, n_seq, d, hf.h != NULL);
  }
  if (!rc && net->last) {
    mc_linear_fwd(be, hf_in(net), mc_param_mat(&net->params[net->fam_head]), n, d, Vp, 0.0f, mc_o32(net->logits));
    if (par->tp > 1) {
      rc = mc_vp_xent_fwd(par, be, net->logits, in + n, n, net->tok_tgt, net->loss, net->lse, net->loss_host);
    } else {
      be->xent_fwd(be, net->logits, net->tok_tgt, n, V, Vp, net->loss, net->lse);
      be->to_host(be, net->loss_host, net->loss, (size_t)n * sizeof(float));
    }
  }
  if (!rc && net->last) rc = release(net, fin, 0);
  free(in);
  rc = rc || be->sync(be);
  be->scope = NULL;
  if (rc) return -1;

  memset(stats, 0, sizeof *stats);
  for (int r = 0; net->last && r < n; r++) stats->ce_sum += net->loss_host[r];
  stats->n_tokens = n;
  stats->n_seqs = n_seq;
  for (int L = net->L0; L < net->L1; L++) {
    mc_layer *l = &net->layers[L];
    if (!l->bk->routes) continue;
    for (int s = 0; s < n_seq; s++) stats->aux_sum += m->aux_loss_coef * l->aux_host[s];
    stats->dropped += l->dropped;
  }
  return 0;
}

/* One block's backward: dx (the residual gradient) gains the block's contribution through
 * the pre-norm, with the collectives mirroring block_forward. A gathered E block sees the
 * output gradient of its shard's rows only, so its parameter and input gradients are
 * partial over TP like a split block's. */
static int block_backward(mc_net *net, mc_layer *l, int n_seq, double seq_weight) {
  mc_backend *be = net->be;
  const mc_net_par *par = &net->par;
  const int d = net->m.d_model, nl = n_seq * par->T_res;
  const block_rows how = rows_of(net, l);
  const float *dy = net->dx;
  float *du_res = net->du; /* the normed input's gradient, residual rows */
  if (how == ROWS_GATHERED) {
    mc_sp_place(par, be, net->dx, net->full, n_seq, d);
    dy = net->full;
  } else if (how == ROWS_SPLIT && par->sp && mc_act16(net)) {
    /* a split block reads its output gradient only as a product operand (mc_dy_in): the
     * shard rounded to bf16 (in the free ush) and gathered so, half the bytes of fp32 rows
     * and the values one rank rounds */
    be->to_bf16(be, net->dx, (mc_bf16 *)par->ush, (int64_t)nl * d);
    if (mc_sp_gather(par, be, par->ush, net->y, n_seq, d, 1)) return -1;
    net->dy_in_y = 1;
  } else if (how == ROWS_SPLIT && par->sp) {
    if (mc_sp_gather(par, be, net->dx, net->full, n_seq, d, 0)) return -1;
    dy = net->full;
  }
  /* a split block's input gradient is summed over TP on the side queue once formed
   * (mc_in_projs_bwd), beside its weight products */
  net->du_sum.wanted = how == ROWS_SPLIT, net->du_sum.started = 0, net->du_sum.ticket = -1, net->du_sum.n_seq = n_seq;
  const int rc = with_whole_input(net, l, n_seq, how, dy, seq_weight, NULL);
  const int started = net->du_sum.started;
  net->dy_in_y = 0, net->du_sum.wanted = 0, net->du_sum.started = 0;
  if (rc) return -1;
  if (started) {
    if (mc_comm_side_wait(par->comm->tp, net->du_sum.ticket)) return -1;
    du_res = par->sp ? par->ush : net->du;
  } else if (how != ROWS_LOCAL && !(du_res = tp_sum(net, net->du, n_seq, NULL))) {
    return -1;
  }
  be->rmsnorm_bwd(be, l->x_in, mc_w(net, l, MC_ROLE_NORM), l->rstd, du_res, nl, d, d, net->dx, mc_g(net, l, MC_ROLE_NORM));
  return 0;
}

/* Pipeline first stage: the embedding's token buffers again for the micro-batch whose
 * backward runs now (later micro-batches' forwards have replaced them); under TP the
 * vocab-parallel lookup lists too (its rows land in the free net->full). */
static int restage_tokens(mc_net *net, const int32_t *tokens, int n_seq) {
  mc_backend *be = net->be;
  const int T = net->m.seq_len, n = n_seq * T, d = net->m.d_model;
  int32_t *in = malloc((size_t)n * sizeof(int32_t));
  if (!in) return mc_error("network: out of memory staging tokens");
  for (int s = 0; s < n_seq; s++)
    for (int t = 0; t < T; t++) in[s * T + t] = tokens[(int64_t)s * (T + 1) + t];
  be->from_host(be, net->tok_in, in, (size_t)n * sizeof(int32_t));
  int rc = net->par.tp > 1 ? mc_vp_embed_fwd(&net->par, be, net->params[net->fam_embed].w, in, n, d, net->full) : 0;
  free(in); /* from_host took its copy */
  return rc;
}

/* The last stage's start of the backward: the loss through the head and the final norm
 * into net->dx. */
static int head_backward(mc_net *net, int n_seq, double ce_weight) {
  const mc_model *m = &net->m;
  const mc_net_par *par = &net->par;
  const int T = m->seq_len, d = m->d_model, V = m->vocab_size, Vp = par->Vpl;
  const int n = n_seq * T, nl = n_seq * par->T_res;
  mc_backend *be = net->be;
  if (acquire(net, m->n_layers, 1)) return -1;
  /* under mc_act16 dlogits feeds only the head's two products: written in bf16 */
  const mc_dst dlogits = mc_netbuf_out(net, MC_NB_DLOGITS, net->dlogits);
  if (par->tp > 1) {
    if (mc_vp_xent_bwd(par, be, net->logits, n, (float)ce_weight, net->tok_tgt, net->lse, dlogits)) return -1;
  } else {
    be->xent_bwd(be, net->logits, net->tok_tgt, net->lse, n, V, Vp, (float)ce_weight, dlogits);
  }
  /* d(hf): full rows, partial over TP (the head is vocab-parallel) */
  float *dh = net->full, *dh_res = net->full;
  const mc_operand dlg = mc_netbuf_in(net, MC_NB_DLOGITS, net->dlogits);
  /* the input gradient first: its sum over TP runs on the side queue beside the weight product */
  mc_linear_bwd_x(be, mc_param_mat(&net->params[net->fam_head]), dlg, n, d, Vp, mc_o32(dh), 0.0f);
  int ticket = -1;
  if (par->tp > 1 && !(dh_res = tp_sum(net, dh, n_seq, &ticket))) return -1;
  mc_linear_bwd_w(be, hf_in(net), dlg, n, d, Vp, net->params[net->fam_head].g);
  if (par->tp > 1 && mc_comm_side_wait(par->comm->tp, ticket)) return -1;
  /* final norm: its input is the last residual state, still in net->x */
  be->fill(be, net->dx, (int64_t)nl * d, 0.0f);
  be->rmsnorm_bwd(be, net->x, net->params[net->fam_final_norm].w, net->rstd_f, dh_res, nl, d, d, net->dx,
                  net->params[net->fam_final_norm].g);
  return release(net, m->n_layers, 1);
}

/* The stage's part of the backward of the micro-batch whose forward ran last on these layer
 * buffers: the last stage starts from the loss, another from the boundary gradient already
 * in net->dx; the first stage ends in the embedding. tokens: the micro-batch's (the first
 * stage of a pipeline re-stages them for the embedding, whose token buffers hold the latest
 * forward's). */
int mc_net_stage_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight, double seq_weight) {
  const mc_model *m = &net->m;
  const mc_net_par *par = &net->par;
  const int T = m->seq_len, d = m->d_model;
  const int n = n_seq * T;
  mc_backend *be = net->be;
  be->scope = "head bwd";
  if (net->last && head_backward(net, n_seq, ce_weight)) return -1;
  for (int L = net->L1 - 1; L >= net->L0; L--) {
    mc_layer *l = &net->layers[L];
    be->scope = kind_scope(l->kind, 1);
    if (acquire(net, L, 1) || layer_recompute(net, l, n_seq) || block_backward(net, l, n_seq, seq_weight) ||
        release(net, L, 1))
      return mc_error_context("layer %d (%c) backward", L, l->kind);
  }
  be->scope = "embed bwd";
  /* the pass's last reduce-scatter into the accumulators (ZeRO 3) */
  if (!net->first) return mc_zero3_flush(&net->par) || be->sync(be);
  if (acquire(net, SET_EMBED, 1)) return -1;
  if (net->geo.layout.pp > 1 && tokens && restage_tokens(net, tokens, n_seq)) return -1;
  if (par->tp > 1) {
    const float *dfull = net->dx;
    if (par->sp) {
      if (mc_sp_gather(par, be, net->dx, net->full, n_seq, d, 0)) return -1;
      dfull = net->full;
    }
    if (mc_vp_embed_bwd(par, be, dfull, n, d, net->params[net->fam_embed].g)) return -1;
  } else {
    be->embed_bwd(be, net->tok_in, n, d, net->dx, net->params[net->fam_embed].g);
  }
  if (release(net, SET_EMBED, 1) || mc_zero3_flush(&net->par)) return -1;
  return be->sync(be);
}

int mc_net_forward_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight,
                            double seq_weight, mc_net_stats *stats) {
  if (net->geo.layout.pp > 1) return mc_pipe_forward_backward(net, tokens, n_seq, ce_weight, seq_weight, stats);
  if (mc_net_stage_forward(net, tokens, n_seq, stats)) return -1;
  return mc_net_stage_backward(net, tokens, n_seq, ce_weight, seq_weight);
}

int mc_net_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats) {
  if (net->geo.layout.pp > 1) return mc_pipe_forward(net, tokens, n_seq, stats);
  return mc_net_stage_forward(net, tokens, n_seq, stats);
}

int mc_net_ensure_slots(mc_net *net, int n_seq, int n_micro) {
  if (n_seq <= 0) return mc_error("network: a micro-batch needs at least one sequence (got %d)", n_seq);
  return ensure_capacity(net, n_seq, slots_for(net, n_micro));
}
