/* Helpers for the network gradient tests: a tiny model, its geometry, and a central
 * finite-difference check of every parameter family against the analytic gradients.
 * The objective is J = ce_weight * sum(CE) + seq_weight * sum(aux) as in train/net.h. */
#ifndef MC_TESTS_NETCHECK_H
#define MC_TESTS_NETCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "train/net_blocks.h"
#include "util/error.h"
#include "util/rng.h"

/* Agreement criterion, per checked element: |analytic - numeric| <= NC_ATOL + NC_RTOL *
 * max(|analytic|, |numeric|), numeric = (J(w + h) - J(w - h)) / 2h with h = NC_STEP. J sums
 * fp32 per-token losses in double. h = 2e-3 balances truncation error (h = 5e-3 already
 * misses on the embedding by 2x the tolerance) against fp32 rounding; the worst ratio seen
 * over all families is about 0.4. Elements whose +-h evaluation flips a routing decision
 * are skipped (and counted): the loss jumps there. */
#ifndef NC_STEP
#define NC_STEP 2e-3
#endif
#define NC_RTOL 3e-2
#define NC_ATOL 1e-4

/* V = 11 real tokens padded to 16, d = 8, GQA 4 heads on 2 kv heads of 4, 4 experts top-2 of
 * width 6, Mamba 8 inner = 2 heads of 4, state 4, conv 3, recurrence width 6, T = 6. A large
 * init_std makes every path carry a gradient well above the finite-difference noise. */
static inline mc_model nc_model(const char *pattern) {
  mc_model m;
  memset(&m, 0, sizeof m);
  snprintf(m.pattern, sizeof m.pattern, "%s", pattern);
  m.n_layers = (int)strlen(pattern);
  m.vocab_size = 11, m.vocab_pad = 8, m.d_model = 8;
  m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 6, m.capacity_factor = 0.0, m.aux_loss_coef = 0.1;
  m.mamba_inner = 8, m.mamba_head_dim = 4, m.ssm_state = 4, m.conv_width = 3;
  m.rec_width = 6, m.seq_len = 6;
  m.rope_theta = 10000.0, m.norm_eps = 1e-5, m.init_std = 0.5;
  return m;
}

static inline mc_layout nc_layout(int tp, int dp, int ep) {
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = tp, l.pp = 1, l.dp = dp, l.ep = ep;
  l.split = MC_SPLIT_EQUAL;
  return l;
}

/* n_seq sequences of T+1 token ids, keyed by `stream`. */
static inline int32_t *nc_tokens(const mc_model *m, int n_seq, uint64_t stream) {
  int32_t *t = malloc((size_t)n_seq * (m->seq_len + 1) * sizeof(int32_t));
  for (int i = 0; i < n_seq * (m->seq_len + 1); i++) t[i] = (int32_t)mc_rng_below(5, stream, (uint64_t)i, (uint64_t)m->vocab_size);
  return t;
}

typedef struct {
  mc_net *net;
  const int32_t *tok;
  int n_seq;
  double cw, sw;
  uint64_t routing; /* signature of the MoE decisions of the last evaluation */
} nc_obj;

/* FNV-1a over every E layer's chosen experts and buffer rows: routing is piecewise constant,
 * so a difference quotient across a change of decision measures a jump, not a gradient. */
static inline uint64_t nc_routing(mc_net *net, int n_seq) {
  uint64_t h = 1469598103934665603ull;
  const mc_model *m = &net->m;
  int64_t cnt = (int64_t)n_seq * m->seq_len * m->top_k;
  int32_t *buf = malloc((size_t)cnt * sizeof(int32_t));
  for (int L = 0; L < net->n_layers; L++) {
    if (net->layers[L].kind != 'E') continue;
    for (int which = 0; which < 2; which++) {
      net->be->to_host(net->be, buf, net->layers[L].i[which], (size_t)cnt * sizeof(int32_t));
      for (int64_t i = 0; i < cnt; i++) h = (h ^ (uint32_t)buf[i]) * 1099511628211ull;
    }
  }
  free(buf);
  return h;
}

static inline double nc_eval(nc_obj *o) {
  mc_net_stats st;
  if (mc_net_forward(o->net, o->tok, o->n_seq, &st)) {
    fprintf(stderr, "forward failed: %s\n", mc_errmsg());
    return NAN;
  }
  o->routing = nc_routing(o->net, o->n_seq);
  return o->cw * st.ce_sum + o->sw * st.aux_sum;
}

/* Checks up to max_el elements (spread evenly) of parameter i; grads must already hold
 * dJ/dw from one mc_net_forward_backward. Returns the worst error/tolerance ratio. */
static inline double nc_check_param(nc_obj *o, int i, int max_el) {
  mc_net_param *p = mc_net_param_at(o->net, i);
  const char *name = o->net->geo.fams.f[p->fam].name;
  int64_t stride = p->numel <= max_el ? 1 : (p->numel + max_el - 1) / max_el;
  int bad = 0, skipped = 0, checked = 0;
  double worst = 0.0, gmax = 0.0;
  nc_eval(o);
  const uint64_t base = o->routing;
  for (int64_t e = 0; e < p->numel; e += stride) {
    float keep = p->w[e];
    p->w[e] = keep + (float)NC_STEP;
    double jp = nc_eval(o);
    uint64_t rp = o->routing;
    p->w[e] = keep - (float)NC_STEP;
    double jm = nc_eval(o);
    p->w[e] = keep;
    if (rp != base || o->routing != base) { /* a routing decision flipped inside the step */
      skipped++;
      continue;
    }
    checked++;
    double num = (jp - jm) / (2 * NC_STEP), an = p->g[e];
    double err = fabs(an - num), lim = NC_ATOL + NC_RTOL * fmax(fabs(an), fabs(num));
    worst = fmax(worst, err / lim);
    gmax = fmax(gmax, fabs(an));
    if (!(err <= lim)) {
      if (bad < 4) fprintf(stderr, "  %s[%lld]: analytic %.6g numeric %.6g\n", name, (long long)e, an, num);
      bad++;
    }
  }
  CHECK(bad == 0, "%s: %d elements outside tolerance", name, bad);
  CHECK(skipped * 4 <= checked, "%s: %d elements skipped for routing flips, only %d checked", name, skipped, checked);
  printf("  %-26s %5lld elements, %3d checked (%d skipped: routing flip)  max|g| %.3g  worst err/tol %.3f\n", name,
         (long long)p->numel, checked, skipped, gmax, worst);
  return worst;
}

static inline mc_net *nc_net(const mc_model *m, mc_geometry *geo, uint64_t seed) {
  mc_layout l = nc_layout(1, 1, 1);
  if (mc_geometry_build(m, &l, NULL, -1, geo)) {
    fprintf(stderr, "geometry: %s\n", mc_errmsg());
    return NULL;
  }
  mc_net *net = mc_net_create(geo, 0, seed);
  if (!net) fprintf(stderr, "mc_net_create: %s\n", mc_errmsg());
  return net;
}

/* Index of the parameter of family `name`, or -1. */
static inline int nc_param(mc_net *net, const char *name) {
  for (int i = 0; i < mc_net_n_params(net); i++)
    if (!strcmp(net->geo.fams.f[mc_net_param_at(net, i)->fam].name, name)) return i;
  return -1;
}

#endif
