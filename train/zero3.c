/* ZeRO 3's working weights, one gather set at a time, with the next set's gather and the last
 * set's gradient reduce-scatter on the side queue while the current set computes
 * (train/net_par.h; docs/parallel.md).
 *
 * zero3.buffers is cut into slots (core/holdings.h mc_zero3_slots, each sized for the largest
 * set): two weight slots used in turn (the acquired set's slices and gathers' packs; the next
 * set's, gathered meanwhile), one gradient slot (the acquired set's whole-slice gradients in
 * a backward) and one reduction slot (the packs of the reduce-scatter in flight). Why the
 * slots can be reused without waiting on the host: every write into a slot is queued after
 * the compute-stream work that last read it (a side-queue collective starts after the work
 * queued before it), and every read of a collective's result waits for its ticket. */
#include <stdlib.h>
#include <string.h>

#include "train/net_par.h"
#include "util/error.h"

typedef struct {
  mc_arena a;                      /* a view of zero3.buffers */
  int n, idx[MC_ROLE_COUNT];       /* the set held here (n = 0: none) */
  void *w[MC_ROLE_COUNT];          /* its slices: fp32 w, or bf16 w16 for compute_bf16 */
  mc_dist_job *g32, *g16;          /* its gathers until acquired (fp32 and bf16 weights) */
} weight_slot;

struct mc_zero3 {
  weight_slot w[2];
  int cur;              /* the weight slot of the acquired set */
  mc_arena grads;       /* view: the whole-slice gradients of the acquired set */
  mc_arena reduce;      /* view: the packs of `pending` */
  mc_dist_job *pending; /* the last released set's gradient reduce-scatter */
};

static mc_arena view(mc_arena *bufs, int64_t *at, int64_t bytes) {
  mc_arena v = {bufs->be, bufs->base + *at, bytes, 0, 0, 0, bufs->cat};
  *at += bytes;
  return v;
}

int mc_zero3_open(mc_net_par *par, mc_arena *bufs, const mc_zero3_slots *slots) {
  if (par->zero != 3) return 0;
  struct mc_zero3 *z = calloc(1, sizeof *z);
  if (!z) return mc_error("ZeRO 3: out of memory");
  if (mc_zero3_slots_bytes(slots) > bufs->cap) {
    free(z);
    return mc_error("ZeRO 3: the zero3.buffers arena holds %lld bytes, its slots need %lld", (long long)bufs->cap,
                    (long long)mc_zero3_slots_bytes(slots));
  }
  int64_t at = 0;
  z->w[0].a = view(bufs, &at, slots->weights);
  z->w[1].a = view(bufs, &at, slots->weights);
  z->grads = view(bufs, &at, slots->grads);
  z->reduce = view(bufs, &at, slots->reduce);
  bufs->used = at; /* carved: the arena itself hands out nothing more */
  par->zero3 = z;
  return 0;
}

/* Waits for a slot's gathers (their slices then hold the set's weights). */
static int finish_gathers(weight_slot *s) {
  int rc = mc_dist_job_finish(s->g32);
  rc = mc_dist_job_finish(s->g16) || rc;
  s->g32 = s->g16 = NULL;
  return rc;
}

void mc_zero3_close(mc_net_par *par) {
  struct mc_zero3 *z = par->zero3;
  if (!z) return;
  /* after a failure, jobs not finished: their results are not wanted (the packs are the
   * arena's, freed with it) */
  for (int k = 0; k < 2; k++) mc_dist_job_drop(z->w[k].g32), mc_dist_job_drop(z->w[k].g16);
  mc_dist_job_drop(z->pending);
  free(z);
  par->zero3 = NULL;
}

/* Carves slot s's slices for params idx and starts their gathers (on the side queue with
 * side = 1): fp32 weights, and bf16 ones gathered in bf16 (each rank rounds its fp32 master
 * rows; the same values as rounding the gathered fp32 slice, as ZeRO 0/1 round their master). */
static int start_gathers(mc_net_par *par, mc_backend *be, mc_net_param *params, weight_slot *s, const int *idx, int n,
                         int side) {
  float *shard32[MC_ROLE_COUNT], *shard16[MC_ROLE_COUNT];
  void *full32[MC_ROLE_COUNT], *full16[MC_ROLE_COUNT];
  int idx32[MC_ROLE_COUNT], idx16[MC_ROLE_COUNT], n32 = 0, n16 = 0;
  if (n > MC_ROLE_COUNT) return mc_error("ZeRO 3: %d parameters in one gather", n);
  mc_arena_restart(&s->a);
  s->n = n;
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &params[idx[k]];
    const int bf16 = p->compute_bf16;
    s->idx[k] = idx[k];
    s->w[k] = mc_arena_take(&s->a, p->numel * (int64_t)(bf16 ? sizeof(mc_bf16) : sizeof(float)), MC_MEM_ZERO3_BUFFERS);
    if (!s->w[k]) return s->n = 0, -1;
    if (bf16) idx16[n16] = idx[k], shard16[n16] = p->ws, full16[n16++] = s->w[k];
    else idx32[n32] = idx[k], shard32[n32] = p->ws, full32[n32++] = s->w[k];
  }
  if (mc_dist_gather_start(par, be, &s->a, params, idx32, n32, shard32, full32, 0, side, &s->g32) ||
      mc_dist_gather_start(par, be, &s->a, params, idx16, n16, shard16, full16, 1, side, &s->g16)) {
    s->n = 0;
    return mc_error_context("ZeRO 3: gathering layer weights");
  }
  return 0;
}

static int holds(const weight_slot *s, const int *idx, int n) {
  return s->n == n && n > 0 && !memcmp(s->idx, idx, sizeof(int) * (size_t)n);
}

int mc_zero3_acquire(mc_net_par *par, mc_backend *be, mc_net_param *params, const int *idx, int n, int for_backward,
                     const int *next, int n_next) {
  struct mc_zero3 *z = par->zero3;
  if (!z) return 0;
  /* 1. the set's weights: gathered ahead into the other slot, else gathered now there */
  const int me = 1 - z->cur;
  weight_slot *s = &z->w[me];
  if (!holds(s, idx, n)) {
    if (finish_gathers(s)) return -1; /* a gather ahead of a set not taken (not in pass order) */
    if (start_gathers(par, be, params, s, idx, n, 0)) return -1;
  }
  if (finish_gathers(s)) return mc_error_context("ZeRO 3: gathering layer weights");
  z->cur = me;
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &params[idx[k]];
    if (p->compute_bf16) p->w16 = s->w[k], p->w = NULL;
    else p->w = s->w[k];
  }
  /* 2. in a backward, whole-slice gradients (the ops accumulate into them) */
  if (for_backward) {
    mc_arena_restart(&z->grads);
    for (int k = 0; k < n; k++) {
      mc_net_param *p = &params[idx[k]];
      float *whole = mc_arena_take(&z->grads, p->numel * (int64_t)sizeof(float), MC_MEM_ZERO3_BUFFERS);
      if (!whole) return -1;
      be->fill(be, whole, p->numel, 0.0f);
      par->dist[idx[k]].g_acc = p->g;
      p->g = whole;
    }
  }
  /* 3. the next set's gather, into the slot the previous set used */
  z->w[1 - me].n = 0;
  if (n_next > 0 && start_gathers(par, be, params, &z->w[1 - me], next, n_next, 1)) return -1;
  return 0;
}

int mc_zero3_flush(mc_net_par *par) {
  struct mc_zero3 *z = par->zero3;
  if (!z || !z->pending) return 0;
  const int rc = mc_dist_job_finish(z->pending);
  z->pending = NULL;
  return rc ? mc_error_context("ZeRO 3: reduce-scattering layer gradients") : 0;
}

int mc_zero3_release(mc_net_par *par, mc_backend *be, mc_net_param *params, const int *idx, int n, int after_backward) {
  struct mc_zero3 *z = par->zero3;
  if (!z) return 0;
  float *g[MC_ROLE_COUNT] = {0}, *acc[MC_ROLE_COUNT] = {0};
  for (int k = 0; k < n; k++) {
    mc_net_param *p = &params[idx[k]];
    p->w = NULL;
    if (p->compute_bf16) p->w16 = NULL;
    g[k] = p->g;
    acc[k] = par->dist[idx[k]].g_acc;
  }
  if (!after_backward) return 0;
  for (int k = 0; k < n; k++) params[idx[k]].g = acc[k];
  /* the set before's rows into its accumulators, then this set's reduce-scatter from the
   * reduction slot (its pack is written after the set before's rows were read out of it) */
  if (mc_zero3_flush(par)) return -1;
  mc_arena_restart(&z->reduce);
  if (mc_dist_reduce_start(par, be, &z->reduce, params, idx, n, g, acc, 1, 1, &z->pending))
    return mc_error_context("ZeRO 3: reduce-scattering layer gradients");
  return 0;
}
