/* The ZeRO-sharded AdamW step and what surrounds it (train/dist.h). The optimizer itself is
 * train/optim.c: it updates slot buffers at grads[i] + offset; here those point at the
 * network's gradients (ZeRO 0/1: the local slice, offset = the rank's rows; ZeRO 3: the
 * network keeps only the shard, offset 0). */
#include "train/dist.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim_groups.h"
#include "train/device.h"
#include "train/net_blocks.h"
#include "util/error.h"

/* The most TP ranks a Muon matrix is gathered over (counts on the stack). */
#define MC_MAX_TP_GATHER 1024

/* Muon's whole matrix (mc_optim.gather_matrix): the slot's shard of the direction is this
 * rank's ZeRO part of its TP-local slice. All-gathering over the family's ZeRO group (the DP
 * group: Muon families are dense) gives the local slice, member parts in member order, exactly
 * as the updated weights are gathered (mc_dist_gather); all-gathering the local slices over TP
 * gives the matrix, directly for a row split (dim 0) and as TP column blocks for a column
 * split (dim 1), which copy_2d puts in place. Every rank of the group gets the same matrix. */
static int muon_gather(void *user, int slot, float *x, float *g, float **full) {
  mc_dist_opt *d = user;
  mc_net *net = d->net;
  mc_backend *be = net->be;
  const mc_optim_slot *sl = &d->opt.slots[slot];
  const mc_family *f = &d->geo->fams.f[sl->fam];
  const int p = d->param_of_slot[slot];
  const mc_net_param *np = &net->params[p];
  float *local = x, *other = g;
  if (f->place == MC_PLACE_EP) return mc_error("Muon: %s is an expert family", f->name); /* 2-D only: never */
  int over_dp, over_tp;
  mc_muon_gathers(&d->geo->layout, f, &over_dp, &over_tp);
  if (over_dp) { /* ZeRO parts -> the local slice, in g */
    float *shard = x, *whole = g;
    /* ZeRO 1: packed through dist.staging (free during the optimizer step; a chunk holds any
     * one slice); ZeRO 3 has no staging arena: packs from the backend */
    mc_arena *stage = net->dist_chunk ? &net->arenas.a[MC_MEM_DIST_STAGING] : NULL;
    if ((stage ? mc_dist_gather_chunked(&net->par, be, stage, net->dist_chunk, net->params, &p, 1, &shard,
                                        (void *const *)&whole, 0)
               : mc_dist_gather(&net->par, be, NULL, net->params, &p, 1, &shard, &whole)) != 0)
      return -1;
    local = g, other = x;
  }
  if (!over_tp) {
    *full = local;
    return be->sync(be);
  }
  mc_comm *tpc = d->comm->tp;
  const int tp = tpc->size;
  int64_t counts[MC_MAX_TP_GATHER];
  if (tp > MC_MAX_TP_GATHER) return mc_error("Muon: a TP group of %d ranks (at most %d)", tp, MC_MAX_TP_GATHER);
  for (int i = 0; i < tp; i++) counts[i] = np->numel;
  if (be->sync(be) || mc_allgather(tpc, local, other, counts, MC_DT_F32))
    return mc_error_context("Muon: all-gathering %s over the TP group", f->name);
  if (f->split_dim == 0) {
    *full = other;
  } else { /* column blocks [tp][rows][cols/tp] -> [rows][cols] */
    const int64_t c = sl->cols / tp;
    for (int i = 0; i < tp; i++) be->copy_2d(be, local + i * c, sl->cols, other + i * (int64_t)sl->rows * c, c, c, sl->rows);
    *full = local;
  }
  return be->sync(be);
}

int mc_dist_opt_init(mc_dist_opt *d, mc_net *net, const mc_geometry *geo, const mc_comm_groups *comm, int rank) {
  memset(d, 0, sizeof *d);
  d->net = net, d->geo = geo, d->comm = comm, d->rank = rank;
  /* fp32 working weights are the master copy themselves (the slot's rows of them, updated in
   * place); only bf16 working weights need a separate fp32 master (the network's holdings). */
  if (mc_optim_init_with(&d->opt, geo, rank, net->be, &net->hold)) return -1;
  d->grads = calloc((size_t)d->opt.n + 1, sizeof *d->grads);
  d->work = calloc((size_t)d->opt.n + 1, sizeof *d->work);
  d->param_of_slot = calloc((size_t)d->opt.n + 1, sizeof *d->param_of_slot);
  d->opt.gather_matrix = muon_gather;
  d->opt.gather_user = d;
  if (!d->grads || !d->work || !d->param_of_slot) {
    mc_dist_opt_free(d);
    return mc_error("optimizer: out of memory");
  }
  for (int i = 0; i < net->n_params; i++) {
    mc_net_param *p = &net->params[i];
    int s = mc_optim_slot_of(&d->opt, p->fam);
    mc_optim_slot *sl = s >= 0 ? &d->opt.slots[s] : NULL;
    if (!sl || d->grads[s] || sl->numel != p->z_numel || sl->offset != p->z_off) {
      mc_dist_opt_free(d);
      return mc_error("family %s: the network's ZeRO part and the optimizer shard disagree", geo->fams.f[p->fam].name);
    }
    d->grads[s] = p->g;
    d->param_of_slot[s] = i;
    if (p->w16) {
      /* bf16 working weights with an fp32 master that starts from the fp32 initial draw, not
       * the rounded copy. ZeRO 0: the slot is the whole slice and the step writes it rounded.
       * ZeRO 1: the slot is this rank's rows; gather_working rounds the gathered slice. The
       * draw of the whole slice goes through the (still unused) gradient buffer. */
      const int rows = net->par.zero == 1;
      sl->w_bf16 = rows ? NULL : p->w16;
      int rc = mc_net_param_initial(net, i, rows ? p->g : sl->master);
      if (!rc && rows && sl->numel) net->be->copy(net->be, sl->master, p->g + sl->offset, sl->numel);
      if (rc) {
        mc_dist_opt_free(d);
        return mc_error_context("family %s: initial master weights", geo->fams.f[p->fam].name);
      }
      continue;
    }
    if (net->par.zero == 3) {
      sl->offset = 0; /* the network holds the shard alone */
      d->work[s] = p->ws;
    } else {
      d->work[s] = p->w;
    }
    /* the step updates this rank's rows of the working weights in place */
    sl->master = d->work[s] + sl->offset;
  }
  for (int s = 0; s < d->opt.n; s++)
    if (!d->grads[s]) {
      mc_dist_opt_free(d);
      return mc_error("family %s has no network parameter", geo->fams.f[d->opt.slots[s].fam].name);
    }
  return net->be->sync(net->be);
}

void mc_dist_opt_free(mc_dist_opt *d) {
  if (d->stage_mem) d->net->be->host_free(d->net->be, d->stage_mem);
  free(d->stage);
  free(d->grads), free(d->work), free(d->param_of_slot);
  mc_optim_free(&d->opt);
  memset(d, 0, sizeof *d);
}

/* The network's parameter indices and buffers, in one array each (the collectives of
 * train/dist_sync.c take several parameters at once). */
static int all_params(mc_net *net, int **idx, float ***a, float ***b) {
  *idx = malloc(sizeof(int) * (size_t)(net->n_params + 1));
  *a = malloc(sizeof(float *) * (size_t)(net->n_params + 1));
  *b = malloc(sizeof(float *) * (size_t)(net->n_params + 1));
  if (!*idx || !*a || !*b) {
    free(*idx), free(*a), free(*b);
    return mc_error("optimizer: out of memory");
  }
  for (int i = 0; i < net->n_params; i++) (*idx)[i] = i;
  return 0;
}

int mc_dist_sync_grads(mc_dist_opt *d) {
  mc_net *net = d->net;
  if (net->par.zero == 3) return 0;
  /* the sets reduced during the last backward (mc_net_reduce_in_backward): the last one's
   * reduction finished here; the params not among them reduced now */
  if (mc_dist_reduce_flush(&net->par)) return -1;
  int *idx, n = 0;
  float **g, **out;
  if (all_params(net, &idx, &g, &out)) return -1;
  for (int i = 0; i < net->n_params; i++) {
    mc_dist_param *dp = &net->par.dist[i];
    if (!dp->reduced) idx[n] = i, g[n] = net->params[i].g, out[n++] = net->params[i].g + net->params[i].z_off;
    dp->reduced = 0;
  }
  int rc = mc_dist_reduce_chunked(&net->par, net->be, &net->arenas.a[MC_MEM_DIST_STAGING], net->dist_chunk,
                                  net->params, idx, n, g, out);
  free(idx), free(g), free(out);
  return rc;
}

int mc_dist_grad_norm(mc_dist_opt *d, double *norm) {
  double sq = mc_optim_grad_sq(&d->opt, d->grads);
  if (d->net->be->sync(d->net->be)) return mc_error_context("the gradient norm");
  if (d->comm && d->comm->world->size > 1 && mc_allreduce_sum(d->comm->world, &sq, 1, MC_DT_F64))
    return mc_error_context("summing the gradient norm over the world");
  *norm = sqrt(sq);
  return 0;
}

/* After the working rows hold the master weights: ZeRO 1 all-gathers the rows of every
 * member, in member order, into each whole local slice; otherwise the rows are all there is.
 * bf16 working weights under ZeRO 1: each rank's fp32 master rows are rounded and gathered
 * in bf16 straight into the working weights (mc_dist_gather_chunked with bf16 = 1: the values of the gathered
 * fp32 slice rounded, as ZeRO 0 rounds its master). */
static int gather_working(mc_dist_opt *d) {
  mc_net *net = d->net;
  mc_backend *be = net->be;
  if (net->par.zero != 1) return be->sync(be);
  int *idx, *idx16 = malloc(sizeof(int) * (size_t)(net->n_params + 1)), n32 = 0, n16 = 0;
  float **shard, **full, **shard16 = malloc(sizeof(float *) * (size_t)(net->n_params + 1));
  mc_bf16 **full16 = malloc(sizeof(mc_bf16 *) * (size_t)(net->n_params + 1));
  int rc = !idx16 || !shard16 || !full16 ? mc_error("optimizer: out of memory") : all_params(net, &idx, &shard, &full);
  if (rc) {
    free(idx16), free(shard16), free(full16);
    return -1;
  }
  for (int i = 0; i < net->n_params; i++) {
    mc_net_param *p = &net->params[i];
    if (p->w16) {
      idx16[n16] = i, full16[n16] = p->w16;
      shard16[n16++] = d->opt.slots[mc_optim_slot_of(&d->opt, p->fam)].master;
    } else {
      idx[n32] = i, full[n32] = p->w, shard[n32++] = p->w + p->z_off;
    }
  }
  mc_arena *stage = &net->arenas.a[MC_MEM_DIST_STAGING];
  rc = mc_dist_gather_chunked(&net->par, be, stage, net->dist_chunk, net->params, idx, n32, shard, (void *const *)full, 0) ||
       mc_dist_gather_chunked(&net->par, be, stage, net->dist_chunk, net->params, idx16, n16, shard16,
                              (void *const *)full16, 1);
  free(idx), free(shard), free(full), free(idx16), free(shard16), free(full16);
  if (!rc) rc = be->sync(be);
  return rc ? mc_error_context("all-gathering the updated weights") : 0;
}

int mc_dist_publish(mc_dist_opt *d) {
  mc_backend *be = d->net->be;
  for (int s = 0; s < d->opt.n; s++) {
    mc_optim_slot *sl = &d->opt.slots[s];
    /* else the master is the working rows, or (bf16, ZeRO 1) gather_working rounds them */
    if (sl->w_bf16) be->to_bf16(be, sl->master, sl->w_bf16, sl->numel);
  }
  return gather_working(d);
}

/* The step updates each slot's master in place: the working rows themselves, or (bf16) it writes them rounded. */
int mc_dist_update(mc_dist_opt *d, const mc_train_cfg *t, double lr, double grad_scale) {
  if (mc_optim_step(&d->opt, t, lr, grad_scale, d->grads) != 0) return -1;
  return gather_working(d);
}

int mc_dist_stats_sum(const mc_comm_groups *comm, mc_net_stats *st) {
  if (!comm) return 0;
  if (comm->dp->size > 1) {
    double v[5] = {st->ce_sum, st->aux_sum, (double)st->n_tokens, (double)st->n_seqs, (double)st->dropped};
    if (mc_allreduce_sum(comm->dp, v, 5, MC_DT_F64)) return mc_error_context("summing the loss over DP");
    st->ce_sum = v[0], st->aux_sum = v[1];
    st->n_tokens = (int64_t)v[2], st->n_seqs = (int64_t)v[3], st->dropped = (int64_t)v[4];
  }
  /* pipeline stages: the cross-entropy lives on the last stage, each E layer's aux loss and
   * drops on its stage (every stage takes part, with zeros where it holds none); tokens and
   * sequences are counted on every stage already */
  if (comm->pp && comm->pp->size > 1) {
    double v[3] = {st->ce_sum, st->aux_sum, (double)st->dropped};
    if (mc_allreduce_sum(comm->pp, v, 3, MC_DT_F64)) return mc_error_context("summing the loss over the pipeline stages");
    st->ce_sum = v[0], st->aux_sum = v[1], st->dropped = (int64_t)v[2];
  }
  return 0;
}

/* Host staging buffers for a backend whose memory is not host memory (d->stage stays NULL
 * where none are needed): one host_alloc block (pinned on CUDA, so snapshot copies into it
 * run asynchronously at full speed), a range per state of every slot. */
int mc_dist_stage_alloc(mc_dist_opt *d) {
  mc_backend *be = d->net->be;
  if (mc_backend_is_host(be) || d->stage) return 0;
  size_t total = 0;
  for (int s = 0; s < d->opt.n; s++)
    for (int k = 0; k < MC_N_STATES; k++)
      if (mc_optim_state(&d->opt.slots[s], (mc_state)k)) total += (size_t)d->opt.slots[s].numel;
  total += (size_t)d->opt.n * 2 + 1; /* each slot's step as of the save (two floats' room, 8-byte aligned) */
  float **st = calloc((size_t)(MC_N_STATES * d->opt.n + 1), sizeof *st);
  float *mem = st ? be->host_alloc(be, (total > 0 ? total : 1) * sizeof(float)) : NULL;
  if (!mem) {
    free(st);
    return mc_error_context("checkpoint staging: a host copy of the optimizer state (%zu bytes)", total * sizeof(float));
  }
  size_t off = (uintptr_t)mem % 8 ? 1 : 0; /* the steps first, aligned */
  for (int s = 0; s < d->opt.n; s++, off += 2) st[MC_N_STATES * s + MC_STATE_STEP] = mem + off;
  for (int i = 0; i < MC_N_STATES * d->opt.n; i++) {
    if (!mc_optim_state(&d->opt.slots[i / MC_N_STATES], (mc_state)(i % MC_N_STATES))) continue;
    st[i] = mem + off;
    off += (size_t)d->opt.slots[i / MC_N_STATES].numel;
  }
  d->stage = st;
  d->stage_mem = mem;
  return 0;
}

int mc_dist_ckpt_items(mc_dist_opt *d, mc_ckpt_item *items) {
  mc_backend *be = d->net->be;
  if (mc_dist_stage_alloc(d)) return -1;
  if (d->stage) be->snap_begin(be);
  int n = 0;
  for (int s = 0; s < d->opt.n; s++) {
    mc_optim_slot *sl = &d->opt.slots[s];
    for (int k = 0; k < MC_N_STATES; k++) {
      const void *src = k == MC_STATE_STEP && sl->opt == MC_OPT_ADAMW ? (const void *)&sl->step : mc_optim_state(sl, (mc_state)k);
      if (!src) continue; /* a state the family's optimizer does not keep */
      mc_shard sh;
      if (mc_shard_of(d->geo, sl->fam, (mc_state)k, d->rank, &sh) != 0) return -1;
      if (!sh.held || !sh.primary) continue; /* a replica: its primary writes it */
      if (d->stage && k == MC_STATE_STEP) { /* host memory the next step changes: copied */
        memcpy(d->stage[MC_N_STATES * s + k], &sl->step, sizeof sl->step);
        src = d->stage[MC_N_STATES * s + k];
      } else if (d->stage) {
        be->snap_to_host(be, d->stage[MC_N_STATES * s + k], src, (size_t)sl->numel * sizeof(float));
        src = d->stage[MC_N_STATES * s + k];
      }
      items[n++] = (mc_ckpt_item){sl->fam, (mc_state)k, d->rank, src};
    }
  }
  if (d->stage) be->snap_end(be);
  return n;
}

int mc_dist_stage_ready(void *user) {
  mc_dist_opt *d = user;
  if (!d->stage) return 0;
  mc_backend *be = d->net->be;
  if (be->snap_wait(be)) return mc_error_context("copying the optimizer state to the host for a checkpoint");
  return 0;
}

/* Uploads of a load into device memory while it reads: the checkpoint's reading threads
 * report each complete request (mc_load_opts.done), and the thread that owns the device
 * uploads it from its staging while the rest is still read. */
typedef struct {
  mc_ckpt *ck;
  mc_comm *world;
  const mc_ckpt_request *reqs;
  int n;
  mc_load_opts o;
  mc_load_stats *stats;
  int rc;
  char err[MC_ERRMSG_MAX];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int *ready, n_ready, finished; /* requests complete and not yet uploaded (a stack) */
  void (*done)(void *user, int i); /* the caller's mc_load_opts.done, called as well */
  void *done_user;
} load_uploads;

static void upload_ready(void *user, int i) {
  load_uploads *u = user;
  pthread_mutex_lock(&u->mu);
  u->ready[u->n_ready++] = i;
  pthread_cond_signal(&u->cv);
  pthread_mutex_unlock(&u->mu);
  if (u->done) u->done(u->done_user, i);
}

static void *load_main(void *arg) {
  load_uploads *u = arg;
  u->rc = mc_load_shared(u->ck, u->world, u->reqs, u->n, &u->o, u->stats);
  if (u->rc != 0) snprintf(u->err, sizeof u->err, "%s", mc_errmsg());
  pthread_mutex_lock(&u->mu);
  u->finished = 1;
  pthread_cond_signal(&u->cv);
  pthread_mutex_unlock(&u->mu);
  return NULL;
}

/* mc_load_shared of a one-rank job on a thread of its own, each request uploaded here (to
 * dst[i], from its staging reqs[i].out) as soon as it is complete: the reads, their hashing
 * and the uploads overlap. A load across ranks (its agreements and exchanges are collectives,
 * kept on this thread) runs here and uploads after. */
static int load_and_upload(mc_backend *be, mc_ckpt *ck, mc_comm *world, const mc_ckpt_request *reqs, float *const *dst,
                           const size_t *bytes, int n, const mc_load_opts *opts, mc_load_stats *stats) {
  load_uploads u;
  memset(&u, 0, sizeof u);
  u.ck = ck, u.world = world, u.reqs = reqs, u.n = n, u.stats = stats;
  if (opts) u.o = *opts;
  else mc_load_opts_default(&u.o);
  const int own_reads = !world || world->size <= 1; /* no collective then: it may run on another thread */
  u.ready = malloc(sizeof *u.ready * (size_t)(n + 1));
  if (!u.ready) return mc_error("out of memory");
  u.done = u.o.done, u.done_user = u.o.done_user;
  u.o.done = upload_ready, u.o.done_user = &u;
  pthread_mutex_init(&u.mu, NULL);
  pthread_cond_init(&u.cv, NULL);
  pthread_t th;
  const int threaded = own_reads && pthread_create(&th, NULL, load_main, &u) == 0;
  if (!threaded) load_main(&u);
  for (;;) {
    pthread_mutex_lock(&u.mu);
    while (!u.n_ready && !u.finished) pthread_cond_wait(&u.cv, &u.mu);
    const int i = u.n_ready ? u.ready[--u.n_ready] : -1;
    pthread_mutex_unlock(&u.mu);
    if (i < 0) break;
    be->from_host(be, dst[i], reqs[i].out, bytes[i]);
  }
  if (threaded) pthread_join(th, NULL);
  pthread_mutex_destroy(&u.mu);
  pthread_cond_destroy(&u.cv);
  free(u.ready);
  if (u.rc != 0) return mc_error("%s", u.err);
  return 0;
}

int mc_dist_load(mc_dist_opt *d, mc_ckpt *ck, const mc_load_opts *opts, mc_load_stats *stats) {
  mc_backend *be = d->net->be;
  if (mc_dist_stage_alloc(d)) return -1;
  /* this rank's hyperslab of each state, into host memory: the states themselves on the CPU,
   * else the staging, uploaded to dst as each is complete */
  const size_t cap = (size_t)(MC_N_STATES * d->opt.n + 1);
  mc_ckpt_request *reqs = malloc(sizeof *reqs * cap);
  float **dst = malloc(sizeof *dst * cap);
  size_t *bytes = malloc(sizeof *bytes * cap);
  if (!reqs || !dst || !bytes) {
    free(reqs), free(dst), free(bytes);
    return mc_error("loading %s: out of memory", mc_ckpt_step_dir(ck));
  }
  int n = 0;
  for (int s = 0; s < d->opt.n; s++) {
    mc_optim_slot *sl = &d->opt.slots[s];
    for (int k = 0; k < MC_N_STATES && sl->numel > 0; k++) {
      float *state = mc_optim_state(sl, (mc_state)k);
      if (!state) continue;
      mc_ckpt_request *r = &reqs[n];
      memset(r, 0, sizeof *r);
      r->family = d->geo->fams.f[sl->fam].name;
      r->state = (mc_state)k;
      memcpy(r->start, sl->shard.start, sizeof r->start);
      memcpy(r->count, sl->shard.count, sizeof r->count);
      r->out = d->stage ? d->stage[MC_N_STATES * s + k] : state;
      dst[n] = state, bytes[n] = (size_t)sl->numel * sizeof(float);
      n++;
    }
  }
  mc_comm *world = d->comm ? d->comm->world : NULL;
  int rc = d->stage ? load_and_upload(be, ck, world, reqs, dst, bytes, n, opts, stats)
                    : mc_load_shared(ck, world, reqs, n, opts, stats);
  free(reqs), free(dst), free(bytes);
  if (rc != 0) return mc_error_context("loading %s", mc_ckpt_step_dir(ck));
  /* AdamW's step: every holder reads its family's one stored value; a checkpoint of format < 4
   * stores none, and every family then continues from the manifest's adam_step */
  mc_train_state ts;
  if (mc_ckpt_train_state(ck, &ts) != 0) return mc_error_context("loading %s", mc_ckpt_step_dir(ck));
  for (int s = 0; s < d->opt.n; s++) {
    mc_optim_slot *sl = &d->opt.slots[s];
    if (sl->opt != MC_OPT_ADAMW) continue;
    const char *name = d->geo->fams.f[sl->fam].name;
    mc_shard sh;
    if (mc_shard_of(d->geo, sl->fam, MC_STATE_STEP, d->rank, &sh) != 0) return -1;
    sl->step = ts.adam_step;
    if (sh.held && mc_ckpt_family_has_state(ck, mc_ckpt_find_family(ck, name), MC_STATE_STEP) &&
        mc_ckpt_read_i64(ck, name, MC_STATE_STEP, &sl->step) != 0)
      return mc_error_context("loading %s", mc_ckpt_step_dir(ck));
  }
  return mc_dist_publish(d);
}

int mc_dist_ckpt_barrier(void *user, int ok) {
  mc_comm *world = user;
  int32_t v = ok ? 0 : 1;
  if (world && world->size > 1 && mc_allreduce_sum(world, &v, 1, MC_DT_I32)) return 0;
  return v == 0;
}
