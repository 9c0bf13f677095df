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

/* Before a collective reads what the backend computed, and after it wrote what the backend
 * reads next: a stream-ordered communicator (comm/comm.h) is ordered with the backend's work
 * already, anything else needs the backend's queue finished. */
static int settle(const mc_comm *group, mc_backend *be) { return mc_comm_ordered(group) ? 0 : be->sync(be); }

/* Where a collective's packs live: carved from the caller's arena and given back by rewinding
 * it (ZeRO 3's layer sets: zero3.buffers is sized for them, so the layer loop allocates
 * nothing; a cudaMalloc/cudaFree pair per collective cost more than the collective), or
 * allocated from the backend (the once-a-step collectives of ZeRO 0 and 1). */
typedef struct {
  mc_backend *be;
  mc_arena *arena, mark;
} staging;

static staging stage_begin(mc_backend *be, mc_arena *arena) {
  staging s = {be, arena, {0}};
  if (arena) s.mark = *arena;
  return s;
}

static float *stage_take(staging *s, int64_t n) {
  const int64_t bytes = (n > 0 ? n : 1) * (int64_t)sizeof(float);
  return s->arena ? mc_arena_take(s->arena, bytes, MC_MEM_ZERO3_BUFFERS) : s->be->alloc(s->be, (size_t)bytes);
}

/* Gives back what stage_take handed out since stage_begin (a and b: its results, or NULL). */
static void stage_end(staging *s, float *a, float *b) {
  if (s->arena) *s->arena = s->mark;
  else s->be->free(s->be, a), s->be->free(s->be, b);
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

int mc_dist_reduce_grads(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *g, float *const *out, int add) {
  if (n <= 0) return 0;
  /* 1. experts' duplicate copies contribute nothing; partial sums over TP, in one pack */
  int64_t tp_total = 0;
  for (int k = 0; k < n; k++) {
    const mc_dist_param *dp = &par->dist[idx[k]];
    if (!dp->contribute) be->fill(be, g[k], params[idx[k]].numel, 0.0f);
    if (dp->tp_sum) tp_total += params[idx[k]].numel;
  }
  bucket *bk = calloc((size_t)n, sizeof *bk);
  float *pack = NULL, *recv = NULL;
  int n_bk = 0, rc = !bk ? mc_error("gradient reduction: out of memory") : 0;
  if (!rc && tp_total > 0) {
    staging st = stage_begin(be, stage);
    pack = stage_take(&st, tp_total);
    int64_t pos = 0;
    for (int k = 0; pack && k < n; k++)
      if (par->dist[idx[k]].tp_sum) be->copy(be, pack + pos, g[k], params[idx[k]].numel), pos += params[idx[k]].numel;
    rc = !pack || settle(par->comm->tp, be) || mc_allreduce_sum(par->comm->tp, pack, tp_total, MC_DT_F32);
    pos = 0;
    for (int k = 0; !rc && k < n; k++)
      if (par->dist[idx[k]].tp_sum) be->copy(be, g[k], pack + pos, params[idx[k]].numel), pos += params[idx[k]].numel;
    stage_end(&st, pack, NULL), pack = NULL;
    if (rc) rc = mc_error_context("summing partial gradients over TP");
  }
  /* 2. over each data-parallel group: all-reduce (ZeRO 0) or this rank's rows (ZeRO >= 1) */
  if (!rc) rc = make_buckets(par, params, idx, n, bk, &n_bk);
  for (int b = 0; !rc && b < n_bk; b++) {
    bucket *B = &bk[b];
    if (group_size(B->group) <= 1) {
      for (int k = 0; par->zero > 0 && k < B->n; k++) {
        const mc_net_param *p = &params[idx[B->at[k]]];
        put_part(be, add, out[B->at[k]], g[B->at[k]] + p->z_off, p->z_numel);
      }
      continue;
    }
    const int whole = par->zero == 0;
    const int64_t mine = whole ? B->total : B->counts[B->group->rank];
    staging st = stage_begin(be, stage);
    pack = stage_take(&st, B->total);
    recv = whole ? NULL : stage_take(&st, mine);
    if (!pack || (!whole && !recv)) rc = -1;
    if (!rc) pack_rows(par, be, params, idx, B, (void *const *)g, pack, 0, whole, 1);
    if (!rc) rc = settle(B->group, be);
    if (!rc) rc = whole ? mc_allreduce_sum(B->group, pack, B->total, MC_DT_F32)
                        : mc_reduce_scatter_sum(B->group, pack, recv, B->counts, MC_DT_F32);
    if (!rc && whole) {
      pack_rows(par, be, params, idx, B, (void *const *)g, pack, 0, 1, 0);
    } else if (!rc) {
      int64_t pos = 0;
      for (int k = 0; k < B->n; k++) {
        const mc_net_param *p = &params[idx[B->at[k]]];
        if (p->z_numel) put_part(be, add, out[B->at[k]], recv + pos, p->z_numel);
        pos += p->z_numel;
      }
    }
    stage_end(&st, pack, recv);
    pack = recv = NULL;
    if (rc) rc = mc_error_context("%s gradients over the %s group (%d members)", whole ? "all-reducing" : "reduce-scattering",
                                  B->group->label, B->group->size);
  }
  free_buckets(bk, n_bk);
  free(bk);
  return rc ? -1 : settle(par->comm ? par->comm->world : NULL, be);
}

/* This rank's rows shard (n fp32 values) as the gather sends them: copied, or rounded to bf16. */
static void put_rows(mc_backend *be, int bf16, void *dst, int64_t d, const float *shard, int64_t n) {
  if (bf16) be->to_bf16(be, shard, (mc_bf16 *)dst + d, n);
  else be->copy(be, (float *)dst + d, shard, n);
}

/* mc_dist_gather and mc_dist_gather_bf16: full[k] holds fp32, or (bf16 = 1) bf16 elements. */
static int gather(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                  int n, float *const *shard, void *const *full, int bf16) {
  if (n <= 0) return 0;
  bucket *bk = calloc((size_t)n, sizeof *bk);
  int n_bk = 0, rc = !bk ? mc_error("parameter gather: out of memory") : make_buckets(par, params, idx, n, bk, &n_bk);
  for (int b = 0; !rc && b < n_bk; b++) {
    bucket *B = &bk[b];
    if (group_size(B->group) <= 1) {
      for (int k = 0; k < B->n; k++) {
        const mc_net_param *p = &params[idx[B->at[k]]];
        if (bf16 || (float *)full[B->at[k]] + p->z_off != shard[B->at[k]])
          put_rows(be, bf16, full[B->at[k]], p->z_off, shard[B->at[k]], p->z_numel);
      }
      continue;
    }
    /* bf16 packs take half the floats they would in fp32, rounded up */
    const int64_t mine = B->counts[B->group->rank];
    staging st = stage_begin(be, stage);
    float *send = stage_take(&st, bf16 ? (mine + 1) / 2 : mine);
    float *pack = stage_take(&st, bf16 ? (B->total + 1) / 2 : B->total);
    if (!send || !pack) rc = -1;
    int64_t pos = 0;
    for (int k = 0; !rc && k < B->n; k++) {
      const mc_net_param *p = &params[idx[B->at[k]]];
      if (p->z_numel) put_rows(be, bf16, send, pos, shard[B->at[k]], p->z_numel);
      pos += p->z_numel;
    }
    if (!rc) rc = settle(B->group, be) || mc_allgather(B->group, send, pack, B->counts, bf16 ? MC_DT_BF16 : MC_DT_F32);
    if (!rc) pack_rows(par, be, params, idx, B, full, pack, bf16, 0, 0);
    stage_end(&st, send, pack);
    if (rc) rc = mc_error_context("all-gathering parameters over the %s group (%d members)", B->group->label, B->group->size);
  }
  free_buckets(bk, n_bk);
  free(bk);
  return rc ? -1 : settle(par->comm ? par->comm->world : NULL, be);
}

int mc_dist_gather(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                   int n, float *const *shard, float *const *full) {
  return gather(par, be, stage, params, idx, n, shard, (void *const *)full, 0);
}

int mc_dist_gather_bf16(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                        const int *idx, int n, float *const *shard, mc_bf16 *const *full) {
  return gather(par, be, stage, params, idx, n, shard, (void *const *)full, 1);
}

/* Empties the zero3.buffers arena for the next set (its tensors are no longer used). */
static void zero3_restart(mc_arena *a) { a->used = a->tensor_bytes = a->tensors = 0; }

/* ZeRO 3: the working weights exist only between acquire and release; during a backward
 * the gradient buffer is a whole local slice whose reduced shard is added to the rank's
 * accumulator (parked in mc_dist_param.g_acc meanwhile) on release. The slices and the
 * collectives' packs are carved from the zero3.buffers arena. */
int mc_zero3_acquire(mc_net_par *par, mc_backend *be, mc_arena *bufs, mc_net_param *params, const int *idx, int n,
                     int for_backward) {
  if (par->zero != 3) return 0;
  /* fp32 weights [0, n32) and bf16 weights [n16): two gathers, each over the params of one kind */
  float *shard32[MC_ROLE_COUNT] = {0}, *full32[MC_ROLE_COUNT] = {0}, *shard16[MC_ROLE_COUNT] = {0};
  mc_bf16 *full16[MC_ROLE_COUNT] = {0};
  int idx32[MC_ROLE_COUNT], idx16[MC_ROLE_COUNT], n32 = 0, n16 = 0;
  if (n > MC_ROLE_COUNT) return mc_error("ZeRO 3: %d parameters in one gather", n);
  zero3_restart(bufs);
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &params[idx[k]];
    const int64_t bytes = p->numel * (int64_t)sizeof(float);
    /* bf16 weights: each rank rounds its fp32 master shard and the bf16 rows are gathered
     * (half the bytes; the same values as rounding the gathered fp32 slice, as ZeRO 0/1 round
     * their master); the layers see only w16 */
    if (p->compute_bf16) {
      if (!(p->w16 = mc_arena_take(bufs, p->numel * (int64_t)sizeof(mc_bf16), MC_MEM_ZERO3_BUFFERS))) return -1;
      p->w = NULL;
      idx16[n16] = idx[k], shard16[n16] = p->ws, full16[n16++] = p->w16;
    } else {
      if (!(p->w = mc_arena_take(bufs, bytes, MC_MEM_ZERO3_BUFFERS))) return -1;
      idx32[n32] = idx[k], shard32[n32] = p->ws, full32[n32++] = p->w;
    }
    if (for_backward) {
      float *whole = mc_arena_take(bufs, bytes, MC_MEM_ZERO3_BUFFERS);
      if (!whole) return -1;
      be->fill(be, whole, p->numel, 0.0f); /* backward ops accumulate */
      par->dist[idx[k]].g_acc = p->g;
      p->g = whole;
    }
  }
  if (mc_dist_gather(par, be, bufs, params, idx32, n32, shard32, full32) ||
      mc_dist_gather_bf16(par, be, bufs, params, idx16, n16, shard16, full16))
    return mc_error_context("ZeRO 3: gathering layer weights");
  return 0;
}

int mc_zero3_release(mc_net_par *par, mc_backend *be, mc_arena *bufs, mc_net_param *params, const int *idx, int n,
                     int after_backward) {
  if (par->zero != 3) return 0;
  float *g[MC_ROLE_COUNT] = {0}, *acc[MC_ROLE_COUNT] = {0};
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &params[idx[k]];
    p->w = NULL;
    if (p->compute_bf16) p->w16 = NULL;
    g[k] = p->g;
    acc[k] = par->dist[idx[k]].g_acc;
  }
  if (!after_backward) return 0;
  /* the reduced rows are added into the accumulators straight from the collective's pack */
  const int rc = mc_dist_reduce_grads(par, be, bufs, params, idx, n, g, acc, 1);
  for (int k = 0; k < n; k++) params[idx[k]].g = acc[k];
  return rc;
}
