/* Builds the per-rank memory plan. Every parameter-derived byte comes from a hyperslab that
 * mc_shard_of returned for that rank: the local slice for working params and gradients, the
 * state hyperslab for master weights and moments (and for everything at zero=3). */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/cost.h"
#include "core/mem_cats.h"
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
    "AdamW moments, decay",
    "AdamW moments, no-decay",
    "ZeRO-3 gathered layer + full grads",
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
  return 3.0 * g->stages.cost[stage] * (double)p->tokens_per_step / (double)(g->layout.dp * g->layout.tp);
}

/* Activation-side terms, identical for every rank of a stage. */
typedef struct {
  int inflight;
  int64_t per_micro, transient, working, activations, pipe;
  mc_moe_scratch moe;
} stage_act;

static void stage_activations(const mc_geometry *g, const mc_plan *p, int s, stage_act *out) {
  const mc_model *m = &g->model;
  const mc_layout *l = &g->layout;
  mc_act_shape sh;
  mc_act_shape_of(m, l, p->micro_batch, p->act_bytes, &sh);
  sh.pbytes = p->prod_bytes;
  memset(out, 0, sizeof *out);
  int64_t worst_recompute = 0; /* a recomputed layer's full working set exists one at a time */
  int has_moe = 0;
  for (int i = 0; i < g->stages.count[s]; i++) {
    char b = m->pattern[g->stages.first[s] + i];
    int64_t kept = mc_act_block_bytes(m, &sh, b, p->recompute);
    int64_t all = mc_act_block_bytes(m, &sh, b, MC_RECOMPUTE_NONE);
    out->per_micro += kept;
    if (all - kept > worst_recompute) worst_recompute = all - kept;
    if (b == 'E') has_moe = 1;
  }
  if (s == 0) out->per_micro += mc_act_embed_bytes(&sh);
  if (s == l->pp - 1) {
    int64_t kept = mc_act_head_bytes(m, &sh, p->recompute);
    int64_t all = mc_act_head_bytes(m, &sh, MC_RECOMPUTE_NONE);
    out->per_micro += kept;
    if (all - kept > worst_recompute) worst_recompute = all - kept;
  }
  out->transient = worst_recompute;
  out->inflight = l->pp - s < p->n_micro ? l->pp - s : p->n_micro;
  char kinds[MC_MAX_LAYERS + 1];
  int nk = 0;
  for (int i = 0; i < g->stages.count[s]; i++) kinds[nk++] = m->pattern[g->stages.first[s] + i];
  kinds[nk] = 0;
  out->working = mc_act_working_bytes(m, l, &sh, kinds, s == l->pp - 1);
  out->activations = out->inflight * out->per_micro + out->transient + out->working;
  /* 1F1B: one buffer for the incoming activation and one for the incoming gradient. */
  if (l->pp > 1) out->pipe = 2 * sh.tokens_seq * m->d_model * p->act_bytes;
  if (has_moe) mc_act_moe_scratch(m, l, &sh, &out->moe);
}

/* Index of the "layer" a family is gathered with under zero=3: its layer, or the embedding
 * (slot 0) and the final norm + head (slot n_layers + 1) on their own. */
static int gather_slot(const mc_geometry *g, const mc_family *f) {
  if (f->layer >= 0) return f->layer + 1;
  return f->role == MC_ROLE_EMBED ? 0 : g->model.n_layers + 1;
}

static int plan_rank(const mc_geometry *g, mc_plan *p, int rank, const stage_act *sa,
                     int64_t *slot_elems) {
  mc_plan_rank *r = &p->ranks[rank];
  const int zero3 = g->layout.zero == 3;
  r->rank = rank;
  mc_layout_coords(&g->layout, rank, &r->c);
  r->stage = r->c.pp_rank;
  memset(slot_elems, 0, sizeof(int64_t) * (size_t)(g->model.n_layers + 2));
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    mc_shard sh[MC_N_STATES];
    for (int s = 0; s < MC_N_STATES; s++) {
      if (mc_shard_of(g, fi, (mc_state)s, rank, &sh[s]) != 0)
        return mc_error_context("planning rank %d, family %s, state %s", rank, f->name,
                                mc_state_name((mc_state)s));
    }
    if (!sh[MC_STATE_PARAM].in_stage) continue;
    int64_t local = 1;
    for (int k = 0; k < sh[MC_STATE_PARAM].ndim; k++) local *= sh[MC_STATE_PARAM].local_count[k];
    const int64_t working = zero3 ? sh[MC_STATE_PARAM].numel : local;
    mc_mem_cat pc = mc_mem_param_cat(f->place);
    r->bytes[pc] += working * (mc_role_is_matmul(f->role) ? p->matmul_bytes : 4);
    r->bytes[MC_MEM_GRADS] += working * 4;
    r->working_elems += working;
    /* fp32 working weights are their own master; bf16 ones need an fp32 master copy */
    if (p->bf16 && mc_role_is_matmul(f->role))
      r->bytes[f->decay ? MC_MEM_MASTER_DECAY : MC_MEM_MASTER_NO_DECAY] += sh[MC_STATE_PARAM].numel * 4;
    r->bytes[f->decay ? MC_MEM_MOMENTS_DECAY : MC_MEM_MOMENTS_NO_DECAY] +=
        (sh[MC_STATE_EXP_AVG].numel + sh[MC_STATE_EXP_AVG_SQ].numel) * 4;
    for (int s = 0; s < MC_N_STATES; s++) {
      r->state_elems[s] += sh[s].numel;
      if (sh[s].primary) r->primary_elems[s] += sh[s].numel;
    }
    slot_elems[gather_slot(g, f)] += local;
  }
  if (zero3) {
    int64_t worst = 0;
    for (int i = 0; i < g->model.n_layers + 2; i++)
      if (slot_elems[i] > worst) worst = slot_elems[i];
    /* The gathered working params of one layer plus its full gradient before the
     * reduce-scatter. */
    r->bytes[MC_MEM_ZERO3_BUFFERS] = worst * (p->matmul_bytes + 4); /* the layer's few non-matrix params counted alike */
  }
  r->inflight = sa->inflight;
  r->act_per_micro = sa->per_micro;
  r->act_transient = sa->transient;
  r->act_working = sa->working;
  r->moe = sa->moe;
  r->bytes[MC_MEM_ACTIVATIONS] = sa->activations;
  r->bytes[MC_MEM_PIPELINE_BUFFERS] = sa->pipe;
  r->bytes[MC_MEM_MOE_SCRATCH] = sa->moe.total;
  int64_t allocated = 0;
  for (int c = 0; c < MC_MEM_RUNTIME_RESERVE; c++) allocated += r->bytes[c];
  r->bytes[MC_MEM_RUNTIME_RESERVE] = p->opts.reserve;
  r->bytes[MC_MEM_ALLOCATOR_OVERHEAD] = (int64_t)((double)allocated * p->opts.alloc_overhead + 0.5);
  r->total = 0;
  for (int c = 0; c < MC_MEM_COUNT; c++) r->total += r->bytes[c];
  r->headroom = p->opts.device_mem - r->total;
  return 0;
}

int mc_plan_build(const mc_geometry *g, const mc_train_cfg *train, const mc_plan_opts *opts,
                  mc_plan *p) {
  memset(p, 0, sizeof *p);
  p->opts = *opts;
  if (p->opts.reserve < 0) p->opts.reserve = mc_plan_default_reserve(train->device);
  if (p->opts.device_mem <= 0) return mc_error("device memory must be positive (got %lld bytes)", (long long)p->opts.device_mem);
  if (p->opts.alloc_overhead < 0) return mc_error("allocator overhead must be >= 0 (got %g)", p->opts.alloc_overhead);
  if (p->opts.margin < 0 || p->opts.margin >= 1) return mc_error("headroom margin must be in [0, 1) (got %g)", p->opts.margin);
  int rc = mc_recompute_parse(train->recompute);
  if (rc < 0) return mc_error("train.recompute: unknown policy '%s' (none, selective, full)", train->recompute);
  p->recompute = (mc_recompute)rc;
  if (!strcmp(train->dtype, "bf16")) p->bf16 = 1;
  else if (strcmp(train->dtype, "fp32")) return mc_error("train.dtype: unknown dtype '%s' (fp32, bf16)", train->dtype);
  /* What the trainer does (train/net.c): fp32 activations; bf16 matrix weights under bf16. */
  p->act_bytes = 4;
  p->matmul_bytes = p->bf16 ? 2 : 4;
  p->prod_bytes = p->bf16 && g->layout.tp == 1 ? 2 : 4;
  const mc_layout *l = &g->layout;
  if (train->micro_batch <= 0 || l->dp <= 0 || train->global_batch % (train->micro_batch * l->dp) != 0)
    return mc_error("train.global_batch=%d is not a multiple of train.micro_batch=%d * parallel.dp=%d",
                    train->global_batch, train->micro_batch, l->dp);
  p->micro_batch = train->micro_batch;
  p->n_micro = train->global_batch / (train->micro_batch * l->dp);
  p->world = g->world;
  p->tokens_per_step = (int64_t)train->global_batch * g->model.seq_len;
  p->flops_per_token = mc_model_train_flops_per_token(&g->model);
  p->flops_per_step = p->flops_per_token * (double)p->tokens_per_step;
  for (int fi = 0; fi < g->fams.n; fi++) {
    p->model_elems += g->fams.f[fi].numel;
    p->model_elems_by_place[g->fams.f[fi].place] += g->fams.f[fi].numel;
  }
  stage_act *sa = calloc((size_t)l->pp, sizeof *sa);
  int64_t *slots = calloc((size_t)g->model.n_layers + 2, sizeof *slots);
  p->ranks = calloc((size_t)g->world, sizeof *p->ranks);
  if (!sa || !slots || !p->ranks) {
    free(sa), free(slots), mc_plan_free(p);
    return mc_error("out of memory planning %d ranks", g->world);
  }
  for (int s = 0; s < l->pp; s++) stage_activations(g, p, s, &sa[s]);
  int status = 0;
  for (int r = 0; r < g->world && status == 0; r++) {
    mc_coords c;
    mc_layout_coords(l, r, &c);
    status = plan_rank(g, p, r, &sa[c.pp_rank], slots);
  }
  free(sa), free(slots);
  if (status != 0) {
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
  p->ranks = NULL;
}
