/* Expert parallelism (docs/parallel.md, "Expert parallelism"): the all-to-all dispatch and
 * combine of an E block's routed rows over the EP group, on CPU ranks (MPI) and GPUs (NCCL).
 *
 * Every rank routes its own tokens over all E experts (the router is replicated); the
 * routing kernel's expert-sorted buffer (experts in order, tokens in row order inside an
 * expert) is already peer-major, because EP rank j owns the contiguous experts
 * [j*El, (j+1)*El), El = E/ep. The plan of one forward (mc_ep_route) records, for each source
 * s of the EP group and local expert e, how many rows s sends to e; the all-to-all moves them
 * in El segments per peer, one per expert, and each lands where the grouped expert products
 * read it: expert-major (local expert e: its rows from source 0, then from source 1, ...),
 * with no staging copy. The combine is the exact reverse. The backward moves the output rows'
 * gradient with the dispatch and the input rows' gradient with the combine, over the same
 * plan. Under mc_act16 the rows the expert products read (the input rows, the output rows'
 * gradient) travel and are kept in bf16, so the experts compute exactly what they compute on
 * one rank (train/block_moe.c); the products' fp32 outputs travel in fp32. */
#include <stdlib.h>
#include <string.h>

#include "train/net_blocks.h"
#include "util/error.h"

/* One E layer's exchange of the last forward and the expert activations it saved for the
 * backward (R rows: what this rank's experts received). */
struct mc_ep_route {
  int ep, El, layer;
  /* [ep * El] segments: (j, e) of the dispatch, send_cnt rows of peer j's expert e at send_at
   * in the local expert-sorted buffer; (s, e) received, recv_cnt rows from source s for local
   * expert e at recv_at in the expert-major buffer */
  int32_t *send_cnt, *recv_cnt; /* one block: send_cnt, then recv_cnt */
  int64_t *send_at, *recv_at;   /* one block: send_at, then recv_at */
  int32_t *counts;               /* [El] rows per local expert (sum over sources) */
  int64_t R, cap;                /* rows received; rows the saved buffers hold */
  float *x, *h1, *h3, *a;        /* saved, in moe.scratch: received input rows [cap, d], h1, h3, SwiGLU [cap, F]
                                    (bf16 where the state's b16) */
};

/* The rank's EP state: the routes of each (micro-batch slot, E layer of the stage) and the
 * scratch the backward shares (the layers' backwards run one after another, and under
 * pipeline parallelism one micro-batch's backward at a time). A pipeline stage keeps several
 * micro-batches in flight (train/pipeline.c): each one's forward routes into the routes of
 * its activation slot, so its backward finds its own plan and saved expert rows. Every
 * buffer lives in the moe.scratch arena, sized by the holdings (core/holdings.c) for the most
 * rows the routing rule allows, so an exchange never allocates. */
struct mc_ep_state {
  int n_layers, n_slots;
  int b16;                    /* mc_act16: the rows the products read, and their saved forms, are bf16 */
  struct mc_ep_route **route; /* [n_slots * n_layers] slot-major, NULL: not an E layer of the stage */
  int64_t cap_rows;           /* rows every buffer holds (mc_stage_hold.moe_assignments) */
  int64_t balanced;           /* rows an exchange receives under balanced routing (for reports) */
  float *rows_a;              /* [cap, d] the local input rows, then the received output-row gradients (b16) */
  float *rows_b;              /* [cap, d] fp32 expert outputs, then input-row gradients */
  float *da, *dh1, *dh3;      /* [cap, F] (b16) */
};

static void route_free(struct mc_ep_route *r) {
  if (!r) return;
  free(r->send_cnt), free(r->send_at), free(r->counts);
  free(r);
}

void mc_ep_free(mc_net_par *par) {
  struct mc_ep_state *s = par->ep_state;
  if (!s) return;
  for (int k = 0; k < s->n_slots * s->n_layers; k++) route_free(s->route[k]);
  free(s->route);
  free(s);
  par->ep_state = NULL;
}

static struct mc_ep_route *route_new(int ep, int layer) {
  struct mc_ep_route *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->ep = ep, r->layer = layer; /* the tables: mc_ep_plan, once E is known */
  return r;
}

/* One buffer of n elements of es bytes in the moe.scratch arena: counted (count = 1) or carved. */
static float *place(mc_arena *a, int count, int64_t n, int64_t es, int *ok) {
  if (count) {
    mc_arena_count(a, n * es);
    return NULL;
  }
  float *p = mc_arena_take(a, n * es, MC_MEM_MOE_SCRATCH);
  *ok = *ok && p;
  return p;
}

/* Counts (count = 1) or carves every EP buffer, in the order the holdings count them: per
 * slot and E layer the saved rows (shared = 1, full recomputation: one set for all, each
 * layer's forward rebuilds its rows just before its backward), then the shared scratch. */
static int place_all(struct mc_ep_state *s, mc_arena *a, int count, int d, int F, int shared) {
  const int64_t R = s->cap_rows, es = s->b16 ? (int64_t)sizeof(mc_bf16) : (int64_t)sizeof(float), f32 = sizeof(float);
  int ok = 1;
  const struct mc_ep_route *first = NULL;
  for (int k = 0; k < s->n_slots * s->n_layers; k++) {
    struct mc_ep_route *r = s->route[k];
    if (!r) continue;
    r->cap = R;
    if (shared && first) {
      r->x = first->x, r->h1 = first->h1, r->h3 = first->h3, r->a = first->a;
      continue;
    }
    first = r;
    r->x = place(a, count, R * d, es, &ok), r->h1 = place(a, count, R * F, es, &ok);
    r->h3 = place(a, count, R * F, es, &ok), r->a = place(a, count, R * F, es, &ok);
  }
  s->rows_a = place(a, count, R * d, es, &ok);
  s->rows_b = place(a, count, R * d, f32, &ok);
  float **rows_f[] = {&s->da, &s->dh1, &s->dh3};
  for (int i = 0; i < 3; i++) *rows_f[i] = place(a, count, R * F, es, &ok);
  return ok ? 0 : -1;
}

int mc_ep_reserve(mc_net *net, int n_seq, int n_slots) {
  mc_net_par *par = &net->par;
  mc_arena *a = &net->arenas.a[MC_MEM_MOE_SCRATCH];
  if (par->ep <= 1) return 0;
  mc_hold_opts o = net->hold;
  o.micro_batch = n_seq, o.n_micro = n_slots;
  mc_stage_hold h;
  if (mc_stage_hold_of(&net->geo, net->stage, &o, &h)) return -1;
  if (!h.moe_scratch) return 0; /* the stage has no E layer */
  if ((h.inflight > 1 ? h.inflight : 1) != n_slots)
    return mc_error("expert parallelism: %d activation slots, the holdings keep %d micro-batches in flight", n_slots,
                    h.inflight);
  struct mc_ep_state *s = calloc(1, sizeof *s);
  if (!s || !(s->route = calloc((size_t)n_slots * (size_t)net->n_layers, sizeof *s->route))) {
    free(s);
    return mc_error("expert parallelism: out of memory");
  }
  par->ep_state = s;
  s->n_layers = net->n_layers, s->n_slots = n_slots, s->b16 = mc_act16(net);
  s->cap_rows = h.moe_assignments, s->balanced = h.moe_balanced;
  for (int k = 0; k < n_slots; k++)
    for (int L = net->L0; L < net->L1; L++)
      if (net->layers[L].bk->routes && !(s->route[(size_t)k * net->n_layers + L] = route_new(par->ep, L)))
        return mc_error("expert parallelism: out of memory");
  const int d = net->m.d_model, F = net->m.expert_hidden, shared = net->hold.recompute == MC_RECOMPUTE_FULL;
  place_all(s, a, 1, d, F, shared);
  if (a->cap != h.moe_scratch)
    return mc_error("expert parallelism: the moe.scratch arena counts %lld bytes, the holdings %lld (sizing and "
                    "placement disagree)", (long long)a->cap, (long long)h.moe_scratch);
  if (mc_arena_open(a, net->be, MC_MEM_MOE_SCRATCH) || place_all(s, a, 0, d, F, shared))
    return mc_error_context("expert parallelism: %lld routed rows per exchange", (long long)s->cap_rows);
  return 0;
}

void mc_net_moe_rows(const mc_net *net, int64_t *reserved, int64_t *balanced, int64_t *peak) {
  const struct mc_ep_state *s = net->par.ep_state;
  *reserved = s ? s->cap_rows : 0;
  *balanced = s ? s->balanced : 0;
  *peak = net->par.ep_peak_rows;
}

struct mc_ep_route *mc_ep_route_of(mc_net_par *par, int n_layers, int layer, int slot) {
  const struct mc_ep_state *s = par->ep_state;
  struct mc_ep_route *r = s && s->n_layers == n_layers && slot >= 0 && slot < s->n_slots && layer >= 0 && layer < n_layers
                              ? s->route[(size_t)slot * n_layers + layer]
                              : NULL;
  if (!r) mc_error("expert parallelism: no route reserved for layer %d of slot %d", layer, slot);
  return r;
}

int mc_ep_plan(mc_net_par *par, struct mc_ep_route *r, const int32_t *counts, int E) {
  const int ep = r->ep, El = E / ep;
  mc_comm *g = par->comm->ep;
  if (g->size != ep || E % ep) return mc_error("expert parallelism: EP group of %d members for ep=%d, E=%d", g->size, ep, E);
  const size_t ns = (size_t)ep * (size_t)El;
  if (r->El != El) {
    free(r->send_cnt), free(r->send_at), free(r->counts);
    r->send_cnt = malloc(sizeof(int32_t) * 2 * ns);
    r->send_at = malloc(sizeof(int64_t) * 2 * ns);
    r->counts = malloc(sizeof(int32_t) * (size_t)El);
    r->El = 0;
    if (!r->send_cnt || !r->send_at || !r->counts) return mc_error("expert parallelism: out of memory");
    r->recv_cnt = r->send_cnt + ns, r->recv_at = r->send_at + ns;
    r->El = El;
  }
  /* per-expert counts: peer j gets this rank's counts of its experts */
  int64_t *cnt = malloc(sizeof(int64_t) * (size_t)ep * 2);
  if (!cnt) return mc_error("expert parallelism: out of memory");
  int64_t *displ = cnt + ep;
  for (int j = 0; j < ep; j++) cnt[j] = El, displ[j] = (int64_t)j * El;
  if (mc_alltoallv(g, counts, cnt, displ, r->recv_cnt, cnt, displ, MC_DT_I32)) {
    free(cnt);
    return mc_error_context("exchanging the routed row counts over the ep group");
  }
  free(cnt);
  /* sent: the local buffer is expert-sorted, so peer j's expert e follows the experts before
   * it; received: expert-major, expert e's rows from source s after those of the experts
   * before e and of the sources before s */
  int64_t so = 0, ro = 0;
  for (size_t k = 0; k < ns; k++) r->send_cnt[k] = counts[k], r->send_at[k] = so, so += counts[k];
  for (int e = 0; e < El; e++) {
    r->counts[e] = 0;
    for (int s = 0; s < ep; s++) {
      const size_t k = (size_t)s * El + e;
      r->recv_at[k] = ro, ro += r->recv_cnt[k], r->counts[e] += r->recv_cnt[k];
    }
  }
  r->R = ro;
  const int64_t most = ro > so ? ro : so;
  if (most > par->ep_peak_rows) par->ep_peak_rows = most;
  if (most > r->cap)
    return mc_error("expert parallelism: layer %d routes %lld rows and receives %lld, more than the %lld rows of its "
                    "moe.scratch buffers (the routing bound of core/holdings.c: a bug)", r->layer, (long long)so,
                    (long long)ro, (long long)r->cap);
  return 0;
}

int64_t mc_ep_rows(const struct mc_ep_route *r) { return r->R; }
const int32_t *mc_ep_counts(const struct mc_ep_route *r) { return r->counts; }
float *mc_ep_saved(struct mc_ep_route *r, int which) {
  return which == 0 ? r->x : which == 1 ? r->h1 : which == 2 ? r->h3 : r->a;
}

int mc_ep_scratch(mc_net_par *par, float **a, float **b, float **da, float **dh1, float **dh3) {
  struct mc_ep_state *s = par->ep_state;
  if (!s) return mc_error("expert parallelism: no exchange scratch reserved");
  if (a) *a = s->rows_a;
  if (b) *b = s->rows_b;
  if (da) *da = s->da;
  if (dh1) *dh1 = s->dh1;
  if (dh3) *dh3 = s->dh3;
  return 0;
}

/* One all-to-all over the route's segments (rows of d bf16 or fp32 elements): from the
 * segments (sr, sa) of send to those (rr, ra) of recv. */
static int exchange(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *send,
                    const int32_t *sr, const int64_t *sa, float *recv, const int32_t *rr, const int64_t *ra, int d, int b16,
                    const char *what) {
  const size_t ns = (size_t)r->ep * (size_t)r->El;
  int64_t *c = malloc(sizeof(int64_t) * ns * 4);
  if (!c) return mc_error("expert parallelism: out of memory");
  for (size_t k = 0; k < ns; k++)
    c[k] = (int64_t)sr[k] * d, c[ns + k] = sa[k] * d, c[2 * ns + k] = (int64_t)rr[k] * d, c[3 * ns + k] = ra[k] * d;
  int rc = mc_dist_settle(par->comm->ep, be) ||
           mc_alltoallv_seg(par->comm->ep, send, r->El, c, c + ns, recv, c + 2 * ns, c + 3 * ns,
                            b16 ? MC_DT_BF16 : MC_DT_F32);
  free(c);
  return rc ? mc_error_context("%s over the ep group (%d members)", what, r->ep) : 0;
}

int mc_ep_dispatch(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *local, float *em,
                   int d, int b16, const char *what) {
  return exchange(par, be, r, local, r->send_cnt, r->send_at, em, r->recv_cnt, r->recv_at, d, b16, what);
}

int mc_ep_combine(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *em, float *local,
                  int d, int b16, const char *what) {
  return exchange(par, be, r, em, r->recv_cnt, r->recv_at, local, r->send_cnt, r->send_at, d, b16, what);
}
