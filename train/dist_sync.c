/* How each parameter's gradient is combined across ranks, and ZeRO 3's per-layer gather of
 * working weights and reduce-scatter of gradients (docs/parallel.md).
 *
 * Per family: a TP-split slice is summed over its data-parallel group only; a family
 * replicated over TP whose gradient is partial there (mc_family.tp_partial_grad) is first
 * summed over TP; experts (never TP-split; ep = 1 here) are reduced over the expert-DP group,
 * which spans TP as well: with SP every TP rank contributes its shard's partial gradient,
 * without SP the TP ranks hold identical copies and only TP rank 0 contributes. */
#include <stdlib.h>
#include <string.h>

#include "train/net_par.h"
#include "util/error.h"

int mc_dist_setup(mc_net_par *par, const mc_geometry *geo, int rank, const mc_net_param *params, int n_params) {
  const mc_layout *l = &geo->layout;
  int *members = malloc(sizeof(int) * (size_t)geo->world);
  if (!members) return mc_error("network: out of memory");
  for (int i = 0; i < n_params; i++) {
    const mc_net_param *p = &params[i];
    mc_dist_param *dp = &par->dist[i];
    const mc_family *f = &geo->fams.f[p->fam];
    int expert = f->place == MC_PLACE_EP, gs;
    dp->group = par->comm ? (expert ? par->comm->edp : par->comm->dp) : NULL;
    dp->tp_sum = !expert && f->tp_partial_grad && par->tp > 1;
    dp->contribute = !expert || par->sp || par->tp_rank == 0;
    gs = expert ? mc_group_edp(l, rank, members) : mc_group_dp(l, rank, members);
    if (dp->group && dp->group->size != gs) {
      free(members);
      return mc_error("network: the %s communicator has %d members, the layout %d", dp->group->label, dp->group->size, gs);
    }
    dp->counts = malloc(sizeof(int64_t) * (size_t)gs);
    if (!dp->counts) {
      free(members);
      return mc_error("network: out of memory");
    }
    for (int j = 0; j < gs; j++) {
      mc_shard sh;
      if (mc_shard_of(geo, p->fam, MC_STATE_PARAM, members[j], &sh)) {
        free(members);
        return -1;
      }
      dp->counts[j] = sh.numel; /* one contiguous run, members in order (mc_zero_part) */
    }
  }
  free(members);
  return 0;
}

void mc_dist_free(mc_net_par *par, int n_params) {
  mc_dist_job_drop(par->set_reduce); /* after a failure: not finished, not wanted */
  par->set_reduce = NULL;
  if (!par->dist) return;
  for (int i = 0; i < n_params; i++) free(par->dist[i].counts), par->dist[i].counts = NULL;
}

static int group_size(const mc_comm *g) { return g ? g->size : 1; }

/* Element offset of member j's rows inside param i's local slice. */
static int64_t member_off(const mc_dist_param *dp, int j) {
  int64_t o = 0;
  for (int k = 0; k < j; k++) o += dp->counts[k];
  return o;
}

/* The collectives below move several parameters at once: the params of idx that share a
 * group are packed into one buffer (member-major where members receive different rows), so
 * a layer or a whole step costs one collective per group instead of one per family. */
typedef struct {
  mc_comm *group;
  int n, *at;      /* positions in idx of the params of this group */
  int64_t *counts; /* elements per member, summed over those params */
  int64_t total;   /* elements of their whole local slices */
} bucket;

static int make_buckets(const mc_net_par *par, const mc_net_param *params, const int *idx, int n, bucket *bk,
                        int *n_bk) {
  *n_bk = 0;
  for (int k = 0; k < n; k++) {
    const mc_dist_param *dp = &par->dist[idx[k]];
    int b = 0;
    while (b < *n_bk && bk[b].group != dp->group) b++;
    if (b == *n_bk) {
      memset(&bk[b], 0, sizeof bk[b]);
      bk[b].group = dp->group;
      bk[b].at = malloc(sizeof(int) * (size_t)n);
      bk[b].counts = calloc((size_t)group_size(dp->group), sizeof(int64_t));
      (*n_bk)++;
      if (!bk[b].at || !bk[b].counts) return mc_error("gradient buckets: out of memory");
    }
    bk[b].at[bk[b].n++] = k;
    bk[b].total += params[idx[k]].numel;
    for (int j = 0; j < group_size(dp->group); j++) bk[b].counts[j] += dp->counts[j];
  }
  return 0;
}

static void free_buckets(bucket *bk, int n_bk) {
  for (int b = 0; b < n_bk; b++) free(bk[b].at), free(bk[b].counts);
}

/* Where a collective's packs live: carved from the caller's arena (ZeRO 3's slots in
 * zero3.buffers, sized for them, so the layer loop allocates nothing; a cudaMalloc/cudaFree
 * pair per collective cost more than the collective; the caller empties the arena), or
 * allocated from the backend and freed when the job finishes (the once-a-step collectives of
 * ZeRO 0 and 1). */
static float *stage_take(mc_backend *be, mc_arena *arena, int64_t n) {
  const int64_t bytes = (n > 0 ? n : 1) * (int64_t)sizeof(float);
  return arena ? mc_arena_take(arena, bytes, arena->cat) : be->alloc(be, (size_t)bytes);
}

/* n elements from src[s] to dst[d] (offsets in elements), fp32 or bf16 (bit patterns). */
static void move(mc_backend *be, int bf16, void *dst, int64_t d, const void *src, int64_t s, int64_t n) {
  if (bf16) be->copy_bf16(be, (mc_bf16 *)dst + d, (const mc_bf16 *)src + s, n);
  else be->copy(be, (float *)dst + d, (const float *)src + s, n);
}

/* Copies between the params' rows and a member-major pack: for member j, for each param, its
 * rows of member j (all rows when whole = 1, i.e. concatenated slices). Elements are fp32, or
 * bf16 with bf16 = 1 (bufs and pack alike). */
static void pack_rows(const mc_net_par *par, mc_backend *be, const mc_net_param *params, const int *idx,
                      const bucket *b, void *const *bufs, void *pack, int bf16, int whole, int to_pack) {
  int64_t pos = 0;
  const int members = whole ? 1 : group_size(b->group);
  for (int j = 0; j < members; j++)
    for (int k = 0; k < b->n; k++) {
      int i = idx[b->at[k]];
      const mc_dist_param *dp = &par->dist[i];
      int64_t off = whole ? 0 : member_off(dp, j), cnt = whole ? params[i].numel : dp->counts[j];
      if (cnt == 0) continue;
      if (to_pack) move(be, bf16, pack, pos, bufs[b->at[k]], off, cnt);
      else move(be, bf16, bufs[b->at[k]], off, pack, pos, cnt);
      pos += cnt;
    }
}

/* This rank's part (n values at src) into dst: written, or added with add = 1. */
static void put_part(mc_backend *be, int add, float *dst, const float *src, int64_t n) {
  if (add) be->axpy(be, dst, src, n, 1.0f);
  else if (dst != src) be->copy(be, dst, src, n);
}

/* This rank's rows shard (n fp32 values) as the gather sends them: copied, or rounded to bf16. */
static void put_rows(mc_backend *be, int bf16, void *dst, int64_t d, const float *shard, int64_t n) {
  if (bf16) be->to_bf16(be, shard, (mc_bf16 *)dst + d, n);
  else be->copy(be, (float *)dst + d, shard, n);
}

/* A gather or gradient reduction between its start (packs written, collectives queued) and
 * its finish (collectives waited for, results put in place). */
struct mc_dist_job {
  const mc_net_par *par;
  mc_backend *be;
  const mc_net_param *params;
  mc_arena *arena;   /* where the packs were carved; NULL: backend allocations, freed by finish */
  int reduce;        /* 1: gradient reduction, 0: gather */
  int bf16;          /* gather: bf16 slices */
  int whole;         /* reduction under ZeRO 0: all-reduced whole slices */
  int add;           /* reduction: added into out */
  int n, *idx;       /* the params */
  void **dst;        /* gather: the slices full[k]; reduction: g[k] (whole) or out[k] */
  int n_bk;
  bucket *bk;
  void **pack, **recv; /* per bucket (NULL where the group has one member) */
  int *ticket;         /* per bucket: the side queue's (-1: none) */
};

static void job_free(mc_dist_job *j) {
  if (!j) return;
  for (int b = 0; !j->arena && j->pack && b < j->n_bk; b++) j->be->free(j->be, j->pack[b]), j->be->free(j->be, j->recv[b]);
  free_buckets(j->bk, j->n_bk);
  free(j->bk), free(j->pack), free(j->recv), free(j->ticket), free(j->idx), free(j->dst);
  free(j);
}

static mc_dist_job *job_new(const mc_net_par *par, mc_backend *be, mc_arena *arena, const mc_net_param *params,
                            const int *idx, int n, void *const *dst) {
  mc_dist_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->par = par, j->be = be, j->params = params, j->arena = arena, j->n = n;
  j->idx = malloc(sizeof(int) * (size_t)n), j->dst = malloc(sizeof(void *) * (size_t)n);
  j->bk = calloc((size_t)n, sizeof *j->bk);
  j->pack = calloc((size_t)n, sizeof(void *)), j->recv = calloc((size_t)n, sizeof(void *));
  j->ticket = malloc(sizeof(int) * (size_t)n);
  if (!j->idx || !j->dst || !j->bk || !j->pack || !j->recv || !j->ticket || make_buckets(par, params, idx, n, j->bk, &j->n_bk)) {
    job_free(j);
    return NULL;
  }
  memcpy(j->idx, idx, sizeof(int) * (size_t)n);
  memcpy(j->dst, dst, sizeof(void *) * (size_t)n);
  for (int b = 0; b < n; b++) j->ticket[b] = -1;
  return j;
}

/* Queues one bucket's collective, on the side queue with side = 1 (comm/comm.h). */
static int queue(mc_dist_job *j, int b, int side, int (*call)(mc_dist_job *, int)) {
  mc_comm *g = j->bk[b].group;
  if (mc_dist_settle(g, j->be)) return -1;
  if (!side) return call(j, b);
  if (mc_comm_side_begin(g)) return -1;
  const int rc = call(j, b);
  return mc_comm_side_end(g, &j->ticket[b]) || rc ? -1 : 0;
}

static int call_reduce(mc_dist_job *j, int b) {
  const bucket *B = &j->bk[b];
  return j->whole ? mc_allreduce_sum(B->group, j->pack[b], B->total, MC_DT_F32)
                  : mc_reduce_scatter_sum(B->group, j->pack[b], j->recv[b], B->counts, MC_DT_F32);
}

static int call_gather(mc_dist_job *j, int b) {
  const bucket *B = &j->bk[b];
  return mc_allgather(B->group, j->recv[b], j->pack[b], B->counts, j->bf16 ? MC_DT_BF16 : MC_DT_F32);
}

int mc_dist_reduce_start(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *g, float *const *out, int add, int side, mc_dist_job **job) {
  *job = NULL;
  if (n <= 0) return 0;
  /* 1. experts' duplicate copies contribute nothing; partial sums over TP, in one pack (in
   * order: the buckets pack what it leaves in g) */
  int64_t tp_total = 0;
  for (int k = 0; k < n; k++) {
    const mc_dist_param *dp = &par->dist[idx[k]];
    if (!dp->contribute) be->fill(be, g[k], params[idx[k]].numel, 0.0f);
    if (dp->tp_sum) tp_total += params[idx[k]].numel;
  }
  if (tp_total > 0) {
    const mc_arena mark = stage ? *stage : (mc_arena){0};
    float *pack = stage_take(be, stage, tp_total);
    int64_t pos = 0;
    for (int k = 0; pack && k < n; k++)
      if (par->dist[idx[k]].tp_sum) be->copy(be, pack + pos, g[k], params[idx[k]].numel), pos += params[idx[k]].numel;
    int rc = !pack || mc_dist_settle(par->comm->tp, be) || mc_allreduce_sum(par->comm->tp, pack, tp_total, MC_DT_F32);
    pos = 0;
    for (int k = 0; !rc && k < n; k++)
      if (par->dist[idx[k]].tp_sum) be->copy(be, g[k], pack + pos, params[idx[k]].numel), pos += params[idx[k]].numel;
    if (stage) *stage = mark; /* the copies back are queued before anything carved later writes */
    else be->free(be, pack);
    if (rc) return mc_error_context("summing partial gradients over TP");
  }
  /* 2. over each data-parallel group: all-reduce (ZeRO 0) or this rank's rows (ZeRO >= 1),
   * queued here; finish puts the results in place */
  mc_dist_job *j = job_new(par, be, stage, params, idx, n, (void *const *)(par->zero == 0 ? g : out));
  if (!j) return mc_error("gradient reduction: out of memory");
  j->reduce = 1, j->whole = par->zero == 0, j->add = add;
  int rc = 0;
  for (int b = 0; !rc && b < j->n_bk; b++) {
    bucket *B = &j->bk[b];
    if (group_size(B->group) <= 1) {
      for (int k = 0; par->zero > 0 && k < B->n; k++) {
        const mc_net_param *p = &params[idx[B->at[k]]];
        put_part(be, add, out[B->at[k]], g[B->at[k]] + p->z_off, p->z_numel);
      }
      continue;
    }
    const int64_t mine = j->whole ? B->total : B->counts[B->group->rank];
    j->pack[b] = stage_take(be, stage, B->total);
    j->recv[b] = j->whole ? NULL : stage_take(be, stage, mine);
    if (!j->pack[b] || (!j->whole && !j->recv[b])) rc = -1;
    if (!rc) pack_rows(par, be, params, idx, B, (void *const *)g, j->pack[b], 0, j->whole, 1);
    if (!rc) rc = queue(j, b, side, call_reduce);
    if (rc) rc = mc_error_context("%s gradients over the %s group (%d members)", j->whole ? "all-reducing" : "reduce-scattering",
                                  B->group->label, B->group->size);
  }
  if (rc) {
    job_free(j);
    return -1;
  }
  *job = j;
  return 0;
}

int mc_dist_gather_start(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *shard, void *const *full, int bf16, int side,
                         mc_dist_job **job) {
  *job = NULL;
  if (n <= 0) return 0;
  mc_dist_job *j = job_new(par, be, stage, params, idx, n, full);
  if (!j) return mc_error("parameter gather: out of memory");
  j->bf16 = bf16;
  int rc = 0;
  for (int b = 0; !rc && b < j->n_bk; b++) {
    bucket *B = &j->bk[b];
    if (group_size(B->group) <= 1) {
      for (int k = 0; k < B->n; k++) {
        const mc_net_param *p = &params[idx[B->at[k]]];
        if (bf16 || (float *)full[B->at[k]] + p->z_off != shard[B->at[k]])
          put_rows(be, bf16, full[B->at[k]], p->z_off, shard[B->at[k]], p->z_numel);
      }
      continue;
    }
    /* recv holds this rank's rows as sent, pack the member-major gathered rows; bf16 packs
     * take half the floats they would in fp32, rounded up */
    const int64_t mine = B->counts[B->group->rank];
    j->recv[b] = stage_take(be, stage, bf16 ? (mine + 1) / 2 : mine);
    j->pack[b] = stage_take(be, stage, bf16 ? (B->total + 1) / 2 : B->total);
    if (!j->recv[b] || !j->pack[b]) rc = -1;
    int64_t pos = 0;
    for (int k = 0; !rc && k < B->n; k++) {
      const mc_net_param *p = &params[idx[B->at[k]]];
      if (p->z_numel) put_rows(be, bf16, j->recv[b], pos, shard[B->at[k]], p->z_numel);
      pos += p->z_numel;
    }
    if (!rc) rc = queue(j, b, side, call_gather);
    if (rc) rc = mc_error_context("all-gathering parameters over the %s group (%d members)", B->group->label, B->group->size);
  }
  if (rc) {
    job_free(j);
    return -1;
  }
  *job = j;
  return 0;
}

int mc_dist_job_finish(mc_dist_job *j) {
  if (!j) return 0;
  int rc = 0;
  for (int b = 0; !rc && b < j->n_bk; b++) {
    const bucket *B = &j->bk[b];
    if (!j->pack[b]) continue; /* a one-member group: done at the start */
    if (mc_comm_side_wait(B->group, j->ticket[b])) {
      rc = mc_error_context("waiting for the %s group's side queue", B->group->label);
      break;
    }
    if (!j->reduce || j->whole) {
      pack_rows(j->par, j->be, j->params, j->idx, B, j->dst, j->pack[b], j->bf16, j->whole, 0);
      continue;
    }
    int64_t pos = 0;
    for (int k = 0; k < B->n; k++) {
      const mc_net_param *p = &j->params[j->idx[B->at[k]]];
      if (p->z_numel) put_part(j->be, j->add, j->dst[B->at[k]], (const float *)j->recv[b] + pos, p->z_numel);
      pos += p->z_numel;
    }
  }
  const mc_net_par *par = j->par;
  mc_backend *be = j->be;
  job_free(j);
  return rc ? -1 : mc_dist_settle(par->comm ? par->comm->world : NULL, be);
}

void mc_dist_job_drop(mc_dist_job *j) { job_free(j); }

/* A gather started and finished at once (no side queue): fp32 slices, or bf16 with bf16 = 1. */
static int gather_now(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                      const int *idx, int n, float *const *shard, void *const *full, int bf16) {
  mc_dist_job *j = NULL;
  return mc_dist_gather_start(par, be, stage, params, idx, n, shard, full, bf16, 0, &j) || mc_dist_job_finish(j);
}

/* The params idx[i0..) of one chunk: whole params while their local slices sum to at most
 * `chunk` elements (at least one param; core/holdings.h sizes the staging for the largest). */
static int chunk_end(const mc_net_param *params, const int *idx, int n, int i0, int64_t chunk) {
  int64_t sum = params[idx[i0]].numel;
  int i = i0 + 1;
  while (i < n && sum + params[idx[i]].numel <= chunk) sum += params[idx[i++]].numel;
  return i;
}

int mc_dist_reduce_chunked(const mc_net_par *par, mc_backend *be, mc_arena *stage, int64_t chunk,
                           const mc_net_param *params, const int *idx, int n, float *const *g, float *const *out) {
  for (int i0 = 0, i1; i0 < n; i0 = i1) {
    i1 = chunk_end(params, idx, n, i0, chunk);
    mc_arena_restart(stage); /* the chunk before is finished: its packs were read out */
    if (mc_dist_reduce_grads(par, be, stage, params, idx + i0, i1 - i0, g + i0, out + i0, 0)) return -1;
  }
  return 0;
}

int mc_dist_gather_chunked(const mc_net_par *par, mc_backend *be, mc_arena *stage, int64_t chunk,
                           const mc_net_param *params, const int *idx, int n, float *const *shard, void *const *full,
                           int bf16) {
  for (int i0 = 0, i1; i0 < n; i0 = i1) {
    i1 = chunk_end(params, idx, n, i0, chunk);
    mc_arena_restart(stage);
    if (gather_now(par, be, stage, params, idx + i0, i1 - i0, shard + i0, full + i0, bf16)) return -1;
  }
  return 0;
}

int mc_dist_reduce_flush(mc_net_par *par) {
  const int rc = mc_dist_job_finish(par->set_reduce);
  par->set_reduce = NULL;
  return rc ? mc_error_context("reducing a layer's gradients") : 0;
}

int mc_dist_reduce_set(mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                       int n) {
  float *g[MC_ROLE_COUNT + 1], *out[MC_ROLE_COUNT + 1];
  if (n > MC_ROLE_COUNT + 1) return mc_error("gradient reduction: %d parameters in one set", n);
  if (mc_dist_reduce_flush(par)) return -1;
  mc_arena_restart(stage); /* the set before's packs were read out */
  par->n_set_reduce++;
  for (int k = 0; k < n; k++) {
    g[k] = params[idx[k]].g, out[k] = g[k] + params[idx[k]].z_off;
    par->dist[idx[k]].reduced = 1;
  }
  if (mc_dist_reduce_start(par, be, stage, params, idx, n, g, out, 0, 1, &par->set_reduce))
    return mc_error_context("reducing a layer's gradients");
  return 0;
}

int mc_dist_reduce_grads(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *g, float *const *out, int add) {
  mc_dist_job *j = NULL;
  return mc_dist_reduce_start(par, be, stage, params, idx, n, g, out, add, 0, &j) || mc_dist_job_finish(j);
}

int mc_dist_gather(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                   int n, float *const *shard, float *const *full) {
  return gather_now(par, be, stage, params, idx, n, shard, (void *const *)full, 0);
}
