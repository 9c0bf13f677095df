/* Builds the per-rank memory plan. Every parameter-derived byte comes from a hyperslab that
 * mc_shard_of returned for that rank: the local slice for working params and gradients, the
 * state hyperslab for master weights and moments (and for everything at zero=3). */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/cost.h"
#include "core/recompute.h"
#include "core/mem_cats.h"
#include "util/checked.h"
#include "util/error.h"

#define GiB ((int64_t)1 << 30)
#define MiB ((int64_t)1 << 20)

static const char *const cat_descs[MC_MEM_COUNT] = {
    "params, replicated over TP",
    "params, TP-sharded",
    "params, EP-sharded (experts)",
    "gradients (fp32)",
    "fp32 master weights, decay",
    "fp32 master weights, no-decay",
    "optimizer states, decay",
    "optimizer states, no-decay",
    "Muon matrix buffers + NS workspace",
    "ZeRO-3 gathered layers (2) + full grads + packs",
    "ZeRO 0/1 reduction and gather packs",
    "activations kept for backward",
    "pipeline receive buffers",
    "MoE routing scratch",
    "runtime reserve",
    "allocator overhead",
};

const char *mc_mem_cat_name(mc_mem_cat c) { return mc_mem_cat_label(c); }
const char *mc_mem_cat_desc(mc_mem_cat c) { return c >= 0 && c < MC_MEM_COUNT ? cat_descs[c] : "?"; }

int64_t mc_plan_default_reserve(const char *device) {
  /* Assumed, not measured: a CUDA context with its kernels, the cuBLAS workspace and NCCL
   * channel buffers come to roughly 1 GiB; a CPU rank's process image, MPI and OpenBLAS
   * buffers to a few hundred MiB. --reserve overrides it. */
  return strcmp(device, "cuda") == 0 ? GiB : 256 * MiB;
}

void mc_plan_opts_default(mc_plan_opts *o) {
  o->device_mem = 80 * GiB;
  o->reserve = -1;
  o->alloc_overhead = 0.05;
  o->margin = 0.10;
}

int64_t mc_plan_optimizer_bytes(const mc_plan_rank *r, int decay) {
  return decay ? r->bytes[MC_MEM_MASTER_DECAY] + r->bytes[MC_MEM_MOMENTS_DECAY]
               : r->bytes[MC_MEM_MASTER_NO_DECAY] + r->bytes[MC_MEM_MOMENTS_NO_DECAY];
}

double mc_plan_stage_step_flops(const mc_geometry *g, const mc_plan *p, int stage) {
  return g->stages.flops[stage] * (double)p->tokens_per_step / (double)(g->layout.dp * g->layout.tp);
}

/* The forward FLOPs per token stage s runs again under the plan's recompute policy. */
static double stage_recompute_per_token(const mc_geometry *g, const mc_plan *p, int stage) {
  mc_act_shape shape;
  mc_act_shape_of(g, stage, &p->hold, p->micro_batch, &shape);
  const int routed = !shape.routed ? 0 : g->layout.ep > 1 ? MC_ROUTED_EXCHANGED : 1;
  return mc_recompute_flops(&g->model, g->model.pattern + g->stages.first[stage], g->stages.count[stage], routed,
                            p->recompute);
}

double mc_plan_stage_hw_step_flops(const mc_geometry *g, const mc_plan *p, int stage) {
  return (g->stages.flops[stage] + stage_recompute_per_token(g, p, stage)) * (double)p->tokens_per_step /
         (double)(g->layout.dp * g->layout.tp);
}

double mc_plan_1f1b(int pp, int m, const double *fwd, const double *bwd, double *idle) {
  if (pp < 1 || m < 1) return 0.0;
  double *end_f = malloc(sizeof(double) * (size_t)pp * (size_t)m), *end_b = malloc(sizeof(double) * (size_t)pp * (size_t)m);
  double *clock = calloc((size_t)pp, sizeof(double));
  int *next = calloc((size_t)pp, sizeof(int));
  if (!end_f || !end_b || !clock || !next) {
    free(end_f), free(end_b), free(clock), free(next);
    return -1.0;
  }
  for (size_t i = 0; i < (size_t)pp * (size_t)m; i++) end_f[i] = end_b[i] = -1.0; /* not run yet */
  /* op k of stage s: warm-up forwards, then forward/backward pairs, then cool-down backwards */
  int left = 2 * pp * m;
  while (left > 0) {
    int moved = 0;
    for (int s = 0; s < pp; s++)
      for (;;) {
        const int k = next[s], w = pp - 1 - s < m ? pp - 1 - s : m;
        if (k >= 2 * m) break;
        int is_f, mb;
        if (k < w) is_f = 1, mb = k;
        else if (k < w + 2 * (m - w)) is_f = (k - w) % 2 == 0, mb = is_f ? w + (k - w) / 2 : (k - w) / 2;
        else is_f = 0, mb = k - m;
        double dep = 0;
        if (is_f && s > 0) {
          dep = end_f[(size_t)(s - 1) * m + mb];
          if (dep < 0) break;
        }
        if (!is_f && s < pp - 1) {
          dep = end_b[(size_t)(s + 1) * m + mb];
          if (dep < 0) break;
        }
        const double start = clock[s] > dep ? clock[s] : dep;
        clock[s] = start + (is_f ? fwd[s] : bwd[s]);
        (is_f ? end_f : end_b)[(size_t)s * m + mb] = clock[s];
        next[s]++, left--, moved = 1;
      }
    if (!moved) break; /* 1F1B cannot deadlock; guard anyway */
  }
  double step = 0, idle_sum = 0;
  for (int s = 0; s < pp; s++) step = clock[s] > step ? clock[s] : step;
  for (int s = 0; s < pp; s++) {
    const double id = step > 0 ? (step - m * (fwd[s] + bwd[s])) / step : 0.0;
    if (idle) idle[s] = id;
    idle_sum += id;
  }
  free(end_f), free(end_b), free(clock), free(next);
  return idle_sum / pp;
}

static int plan_rank(const mc_geometry *g, mc_plan *p, int rank, const mc_stage_hold *sa) {
  mc_plan_rank *r = &p->ranks[rank];
  r->rank = rank;
  mc_layout_coords(&g->layout, rank, &r->c);
  r->stage = r->c.pp_rank;
  if (mc_holdings_of(g, rank, &p->hold, r->bytes)) return mc_error_context("planning rank %d", rank);
  /* element statistics of the ownership (what the rank holds and what it writes) */
  for (int fi = 0; fi < g->fams.n; fi++) {
    mc_param_hold h;
    if (mc_param_hold_of(g, fi, rank, &p->hold, &h)) return mc_error_context("planning rank %d", rank);
    if (!h.in_stage) continue;
    r->working_elems += h.working_numel;
    const mc_family *f = &g->fams.f[fi];
    for (int s = 0; s < MC_N_STATES; s++) {
      if (!mc_family_has_state(f, (mc_state)s)) continue; /* a kind its optimizer does not keep */
      mc_shard sh; /* elements from ownership: the kinds differ in element size */
      if (mc_shard_of(g, fi, (mc_state)s, rank, &sh)) return mc_error_context("planning rank %d", rank);
      const int64_t elems = sh.numel;
      r->state_elems[s] += elems;
      if (h.state_primary[s]) r->primary_elems[s] += elems;
      /* each optimizer state is one tensor at its footprint, as holdings counts the moments */
      if (s != MC_STATE_PARAM && !mc_state_is_scalar((mc_state)s)) /* scalars live on the host (core/holdings.h) */
        r->opt_group_bytes[f->opt] += mc_mem_footprint(h.state_bytes[s]);
    }
  }
  r->act = *sa;
  int64_t allocated = 0;
  /* the categories are bounded (mc_layout_check) and saturate (core/holdings.c); so do their sums */
  for (int c = 0; c < MC_MEM_RUNTIME_RESERVE; c++) allocated = mc_add_sat_i64(allocated, r->bytes[c]);
  r->bytes[MC_MEM_RUNTIME_RESERVE] = p->opts.reserve;
  const double over = (double)allocated * p->opts.alloc_overhead + 0.5;
  r->bytes[MC_MEM_ALLOCATOR_OVERHEAD] = over < 9.2e18 ? (int64_t)over : INT64_MAX;
  r->total = 0;
  for (int c = 0; c < MC_MEM_COUNT; c++) r->total = mc_add_sat_i64(r->total, r->bytes[c]);
  r->headroom = p->opts.device_mem - r->total;
  return 0;
}

/* Per stage: FLOPs per step per device, the largest rank, the 1F1B idle share. */
static int plan_stages(const mc_geometry *g, mc_plan *p) {
  const int pp = g->layout.pp;
  p->pp = pp;
  p->stages = calloc((size_t)pp, sizeof *p->stages);
  double *idle = calloc((size_t)pp, sizeof *idle), *bwd_hw = calloc((size_t)pp, sizeof *bwd_hw);
  if (!p->stages || !idle || !bwd_hw) {
    free(idle), free(bwd_hw);
    return mc_error("out of memory planning %d stages", pp);
  }
  const double per_dev = (double)p->tokens_per_step / (double)(g->layout.dp * g->layout.tp);
  for (int s = 0; s < pp; s++) {
    mc_plan_stage *st = &p->stages[s];
    st->fwd_flops = g->stages.cost[s] * per_dev;
    st->bwd_flops = g->stages.bwd[s] * per_dev;
    st->flops = mc_plan_stage_step_flops(g, p, s);
    st->recompute_flops_per_token = stage_recompute_per_token(g, p, s);
    st->recompute_flops = st->recompute_flops_per_token * per_dev;
    st->hw_flops = mc_plan_stage_hw_step_flops(g, p, s);
    st->peak_rank = -1;
    /* the recomputed forward runs just before the layer's backward, on the backward's turn */
    bwd_hw[s] = g->stages.bwd[s] + st->recompute_flops_per_token;
    p->recompute_flops_per_token += st->recompute_flops_per_token;
  }
  p->hw_flops_per_token = mc_model_fwd_bwd_flops_per_token(&g->model) + p->recompute_flops_per_token;
  p->hw_flops_per_step = p->hw_flops_per_token * (double)p->tokens_per_step;
  for (int r = 0; r < g->world; r++) {
    mc_plan_stage *st = &p->stages[p->ranks[r].stage];
    if (st->peak_rank < 0 || p->ranks[r].total > st->peak_bytes) st->peak_rank = r, st->peak_bytes = p->ranks[r].total;
  }
  /* a micro-batch's forward and backward take time in proportion to the FLOPs the stage
   * executes for them: hardware FLOPs, the backward with its recomputed forward */
  p->bubble = mc_plan_1f1b(pp, p->n_micro, g->stages.cost, bwd_hw, idle);
  for (int s = 0; s < pp; s++) p->stages[s].bubble = idle[s];
  free(idle), free(bwd_hw);
  return p->bubble < 0 ? mc_error("out of memory simulating the 1F1B schedule") : 0;
}

int mc_plan_build(const mc_geometry *g, const mc_train_cfg *train, const mc_plan_opts *opts,
                  mc_plan *p) {
  memset(p, 0, sizeof *p);
  p->opts = *opts;
  if (p->opts.reserve < 0) p->opts.reserve = mc_plan_default_reserve(train->device);
  if (p->opts.device_mem <= 0) return mc_error("device memory must be positive (got %lld bytes)", (long long)p->opts.device_mem);
  if (p->opts.alloc_overhead < 0) return mc_error("allocator overhead must be >= 0 (got %g)", p->opts.alloc_overhead);
  if (p->opts.margin < 0 || p->opts.margin >= 1) return mc_error("headroom margin must be in [0, 1) (got %g)", p->opts.margin);
  if (mc_hold_opts_of(g, train, &p->hold)) return -1;
  p->recompute = p->hold.recompute;
  const mc_layout *l = &g->layout;
  p->micro_batch = train->micro_batch;
  p->n_micro = p->hold.n_micro;
  p->world = g->world;
  p->tokens_per_step = (int64_t)train->global_batch * g->model.seq_len;
  p->flops_per_token = mc_model_train_flops_per_token(&g->model);
  p->flops_per_step = p->flops_per_token * (double)p->tokens_per_step;
  for (int fi = 0; fi < g->fams.n; fi++) {
    p->model_elems += g->fams.f[fi].numel;
    p->model_elems_by_place[g->fams.f[fi].place] += g->fams.f[fi].numel;
    if (g->fams.f[fi].opt >= 0 && g->fams.f[fi].opt < MC_N_OPTS) p->opt_group_fams[g->fams.f[fi].opt]++;
  }
  mc_stage_hold *sa = calloc((size_t)l->pp, sizeof *sa);
  p->ranks = calloc((size_t)g->world, sizeof *p->ranks);
  if (!sa || !p->ranks) {
    free(sa), mc_plan_free(p);
    return mc_error("out of memory planning %d ranks", g->world);
  }
  int status = 0;
  for (int s = 0; s < l->pp && status == 0; s++) status = mc_stage_hold_of(g, s, &p->hold, &sa[s]);
  for (int r = 0; r < g->world && status == 0; r++) {
    mc_coords c;
    mc_layout_coords(l, r, &c);
    status = plan_rank(g, p, r, &sa[c.pp_rank]);
  }
  free(sa);
  if (status != 0) {
    mc_plan_free(p);
    return -1;
  }
  if (plan_stages(g, p) != 0) {
    mc_plan_free(p);
    return -1;
  }
  for (int r = 0; r < g->world; r++) {
    if (p->ranks[r].total > p->ranks[p->peak_rank].total) p->peak_rank = r;
    mc_fit fit = mc_plan_fit(p, &p->ranks[r]);
    if (fit != MC_FIT_OK) p->n_low_headroom++;
    if (fit == MC_FIT_NO) p->n_no_fit++;
  }
  return 0;
}

mc_fit mc_plan_fit(const mc_plan *p, const mc_plan_rank *r) {
  if (r->headroom < 0) return MC_FIT_NO;
  if ((double)r->headroom < p->opts.margin * (double)p->opts.device_mem) return MC_FIT_LOW_HEADROOM;
  return MC_FIT_OK;
}

void mc_plan_free(mc_plan *p) {
  free(p->ranks);
  free(p->stages);
  p->ranks = NULL;
  p->stages = NULL;
}
