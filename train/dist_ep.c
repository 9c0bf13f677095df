/* Expert parallelism on CPU ranks (docs/parallel.md, "Expert parallelism"): the all-to-all
 * dispatch and combine of an E block's routed rows over the EP group.
 *
 * Every rank routes its own tokens over all E experts (the router is replicated); the
 * routing kernel's expert-sorted buffer (experts in order, tokens in row order inside an
 * expert) is already peer-major, because EP rank j owns the contiguous experts
 * [j*El, (j+1)*El), El = E/ep. The plan of one forward (mc_ep_route) records, for each source
 * s of the EP group and local expert e, how many rows s sends to e; the rows arrive
 * source-major and are reordered expert-major (local expert e: its rows from source 0, then
 * from source 1, ...), which is the layout the grouped expert products read. The combine is
 * the exact reverse. The backward moves the output rows' gradient with the dispatch and the
 * input rows' gradient with the combine, over the same plan. */
#include <stdlib.h>
#include <string.h>

#include "train/net_blocks.h"
#include "util/error.h"

/* One E layer's exchange of the last forward and the expert activations it saved for the
 * backward (R rows: what this rank's experts received). */
struct mc_ep_route {
  int ep, El;
  int64_t *send_rows, *send_off; /* [ep] rows of the local expert-sorted buffer for peer j */
  int64_t *recv_rows, *recv_off; /* [ep] rows arriving from source s, source-major offsets */
  int32_t *recv_cnt;             /* [ep * El] rows from source s for local expert e */
  int32_t *counts;               /* [El] rows per local expert (sum over sources) */
  int64_t R, cap;                /* rows received; rows the saved buffers hold */
  float *x, *h1, *h3, *a;        /* saved: received input rows [R, d], h1, h3, SwiGLU [R, F] */
};

/* The rank's EP state: the routes of each (micro-batch slot, layer) and the scratch the
 * backward shares (the layers' backwards run one after another, and under pipeline
 * parallelism one micro-batch's backward at a time). A pipeline stage keeps several
 * micro-batches in flight (train/pipeline.c): each one's forward routes into the routes of
 * its activation slot, so its backward finds its own plan and saved expert rows. */
struct mc_ep_state {
  int n_layers, n_slots;
  struct mc_ep_route **route; /* [n_slots * n_layers] slot-major, NULL: not routed yet */
  int64_t cap_rows;           /* rows the scratch holds */
  float *stage;               /* [max(rows, R), d] source-major staging of the all-to-alls */
  float *rows_a, *rows_b;     /* [R, d] received-row gradients / outputs */
  float *da, *dh1, *dh3;      /* [R, F] */
};

static void route_free(mc_backend *be, struct mc_ep_route *r) {
  if (!r) return;
  free(r->send_rows), free(r->send_off), free(r->recv_rows), free(r->recv_off), free(r->recv_cnt), free(r->counts);
  be->free(be, r->x), be->free(be, r->h1), be->free(be, r->h3), be->free(be, r->a);
  free(r);
}

void mc_ep_free(mc_net_par *par, mc_backend *be) {
  struct mc_ep_state *s = par->ep_state;
  if (!s) return;
  for (int k = 0; k < s->n_slots * s->n_layers; k++) route_free(be, s->route[k]);
  free(s->route);
  float *bufs[] = {s->stage, s->rows_a, s->rows_b, s->da, s->dh1, s->dh3};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
  free(s);
  par->ep_state = NULL;
}

/* (Re)allocates *p to hold n floats when it holds fewer than have (contents dropped). */
static int grow(mc_backend *be, float **p, int64_t n, int64_t have) {
  if (*p && n <= have) return 0;
  be->free(be, *p);
  *p = be->alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(float));
  return *p ? 0 : mc_error("expert parallelism: out of memory for %lld floats", (long long)n);
}

/* The state with routes for slots [0, n_slots) (grown on demand; the routes made so far stay). */
static struct mc_ep_state *state_of(mc_net_par *par, int n_layers, int n_slots) {
  if (!par->ep_state) {
    struct mc_ep_state *s = calloc(1, sizeof *s);
    if (!s) {
      mc_error("expert parallelism: out of memory");
      return NULL;
    }
    s->n_layers = n_layers;
    par->ep_state = s;
  }
  struct mc_ep_state *s = par->ep_state;
  if (s->n_layers != n_layers) {
    mc_error("expert parallelism: routes for %d layers asked for %d", s->n_layers, n_layers);
    return NULL;
  }
  if (n_slots > s->n_slots) {
    struct mc_ep_route **r = realloc(s->route, sizeof *r * (size_t)n_slots * (size_t)n_layers);
    if (!r) {
      mc_error("expert parallelism: out of memory");
      return NULL;
    }
    memset(r + (size_t)s->n_slots * n_layers, 0, sizeof *r * (size_t)(n_slots - s->n_slots) * (size_t)n_layers);
    s->route = r, s->n_slots = n_slots;
  }
  return s;
}

struct mc_ep_route *mc_ep_route_of(mc_net_par *par, int n_layers, int layer, int slot) {
  if (slot < 0 || layer < 0 || layer >= n_layers)
    return mc_error("expert parallelism: no route for layer %d of slot %d", layer, slot), NULL;
  struct mc_ep_state *s = state_of(par, n_layers, slot + 1);
  if (!s) return NULL;
  struct mc_ep_route **slotp = &s->route[(size_t)slot * n_layers + layer];
  if (!*slotp) {
    const int ep = par->ep;
    struct mc_ep_route *r = calloc(1, sizeof *r);
    if (!r) return mc_error("expert parallelism: out of memory"), NULL;
    r->ep = ep;
    r->send_rows = calloc((size_t)ep, sizeof(int64_t)), r->send_off = calloc((size_t)ep, sizeof(int64_t));
    r->recv_rows = calloc((size_t)ep, sizeof(int64_t)), r->recv_off = calloc((size_t)ep, sizeof(int64_t));
    if (!r->send_rows || !r->send_off || !r->recv_rows || !r->recv_off) { /* recv_cnt, counts: mc_ep_plan */
      free(r->send_rows), free(r->send_off), free(r->recv_rows), free(r->recv_off), free(r);
      return mc_error("expert parallelism: out of memory"), NULL;
    }
    *slotp = r;
  }
  return *slotp;
}

int mc_ep_plan(const mc_net_par *par, mc_backend *be, struct mc_ep_route *r, const int32_t *counts, int E, int d, int F) {
  const int ep = r->ep, El = E / ep;
  mc_comm *g = par->comm->ep;
  if (g->size != ep || E % ep) return mc_error("expert parallelism: EP group of %d members for ep=%d, E=%d", g->size, ep, E);
  if (r->El != El) {
    free(r->recv_cnt), free(r->counts);
    r->recv_cnt = malloc(sizeof(int32_t) * (size_t)ep * (size_t)El);
    r->counts = malloc(sizeof(int32_t) * (size_t)El);
    if (!r->recv_cnt || !r->counts) return mc_error("expert parallelism: out of memory");
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
  int64_t so = 0, ro = 0;
  for (int e = 0; e < El; e++) r->counts[e] = 0;
  for (int j = 0; j < ep; j++) {
    int64_t sr = 0, rr = 0;
    for (int e = 0; e < El; e++) sr += counts[j * El + e], rr += r->recv_cnt[j * El + e], r->counts[e] += r->recv_cnt[j * El + e];
    r->send_rows[j] = sr, r->send_off[j] = so, so += sr;
    r->recv_rows[j] = rr, r->recv_off[j] = ro, ro += rr;
  }
  r->R = ro;
  if (r->R > r->cap || !r->x) {
    if (grow(be, &r->x, r->R * d, 0) || grow(be, &r->h1, r->R * F, 0) || grow(be, &r->h3, r->R * F, 0) ||
        grow(be, &r->a, r->R * F, 0))
      return -1;
    r->cap = r->R;
  }
  return 0;
}

int64_t mc_ep_rows(const struct mc_ep_route *r) { return r->R; }
const int32_t *mc_ep_counts(const struct mc_ep_route *r) { return r->counts; }
float *mc_ep_saved(struct mc_ep_route *r, int which) {
  return which == 0 ? r->x : which == 1 ? r->h1 : which == 2 ? r->h3 : r->a;
}

int mc_ep_scratch(mc_net_par *par, mc_backend *be, int64_t rows, int64_t R, int d, int F, float **stage, float **a,
                  float **b, float **da, float **dh1, float **dh3) {
  struct mc_ep_state *s = par->ep_state;
  const int64_t need = rows > R ? rows : R;
  if (need > s->cap_rows || !s->stage) {
    if (grow(be, &s->stage, need * d, 0) || grow(be, &s->rows_a, need * d, 0) || grow(be, &s->rows_b, need * d, 0) ||
        grow(be, &s->da, need * F, 0) || grow(be, &s->dh1, need * F, 0) || grow(be, &s->dh3, need * F, 0))
      return -1;
    s->cap_rows = need;
  }
  if (stage) *stage = s->stage;
  if (a) *a = s->rows_a;
  if (b) *b = s->rows_b;
  if (da) *da = s->da;
  if (dh1) *dh1 = s->dh1;
  if (dh3) *dh3 = s->dh3;
  return 0;
}

/* Copies between the source-major staging and the expert-major rows (to_expert = 1: staging
 * -> expert-major, else back). */
static void reorder(mc_backend *be, const struct mc_ep_route *r, float *stage, float *em, int d, int to_expert) {
  const int ep = r->ep, El = r->El;
  int64_t eo = 0; /* expert-major offset of (e, s) */
  for (int e = 0; e < El; e++)
    for (int s = 0; s < ep; s++) {
      int64_t so = r->recv_off[s];
      for (int e2 = 0; e2 < e; e2++) so += r->recv_cnt[s * El + e2];
      const int64_t n = r->recv_cnt[s * El + e];
      if (n) {
        if (to_expert) be->copy(be, em + eo * d, stage + so * d, n * d);
        else be->copy(be, stage + so * d, em + eo * d, n * d);
      }
      eo += n;
    }
}

static int exchange(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *send, int64_t *sr,
                    int64_t *so, float *recv, int64_t *rr, int64_t *ro, int d, const char *what) {
  const int ep = r->ep;
  int64_t *c = malloc(sizeof(int64_t) * (size_t)ep * 4);
  if (!c) return mc_error("expert parallelism: out of memory");
  for (int j = 0; j < ep; j++)
    c[j] = sr[j] * d, c[ep + j] = so[j] * d, c[2 * ep + j] = rr[j] * d, c[3 * ep + j] = ro[j] * d;
  int rc = be->sync(be) || mc_alltoallv(par->comm->ep, send, c, c + ep, recv, c + 2 * ep, c + 3 * ep, MC_DT_F32);
  free(c);
  return rc ? mc_error_context("%s over the ep group (%d members)", what, ep) : 0;
}

int mc_ep_dispatch(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *local, float *em,
                   int d, float *stage, const char *what) {
  if (exchange(par, be, r, local, r->send_rows, r->send_off, stage, r->recv_rows, r->recv_off, d, what)) return -1;
  reorder(be, r, stage, em, d, 1);
  return 0;
}

int mc_ep_combine(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, float *em, float *local,
                  int d, float *stage, const char *what) {
  reorder(be, r, stage, em, d, 0);
  return exchange(par, be, r, stage, r->recv_rows, r->recv_off, local, r->send_rows, r->send_off, d, what);
}
