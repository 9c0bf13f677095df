#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim_groups.h"
#include "train/muon.h"
#include "util/error.h"

/* The field of slot s that holds state kind st (NULL for no such kind). */
static float **state_field(mc_optim_slot *s, mc_state st) {
  switch (st) {
    case MC_STATE_PARAM: return &s->master;
    case MC_STATE_EXP_AVG: return &s->exp_avg;
    case MC_STATE_EXP_AVG_SQ: return &s->exp_avg_sq;
    case MC_STATE_MOMENTUM: return &s->momentum;
    default: return NULL;
  }
}

int mc_optim_init(mc_optim *o, const mc_geometry *geo, int rank) {
  return mc_optim_init_on(o, geo, rank, mc_backend_cpu());
}

int mc_optim_init_on(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be) {
  return mc_optim_init_with(o, geo, rank, be, NULL);
}

/* Each slot's tensors are the family's optimizer holdings (core/holdings.h): the master copy
 * (where the working weights are not fp32 themselves) in the master arena of its weight-decay
 * group, the optimizer's states (AdamW's two moments, Muon's momentum) in the moments arena
 * of its group; Muon's scratch (mc_muon_scratch_of) in optimizer.scratch. */
int mc_optim_init_with(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be, const mc_hold_opts *hold) {
  memset(o, 0, sizeof *o);
  o->be = be;
  o->slots = calloc((size_t)geo->fams.n, sizeof *o->slots);
  mc_param_hold *holds = calloc((size_t)geo->fams.n + 1, sizeof *holds);
  if (!o->slots || !holds) {
    free(holds);
    mc_optim_free(o);
    return mc_error("optimizer: out of memory");
  }
  /* standalone (no network): fp32 working weights elsewhere, so every slot keeps a master */
  mc_hold_opts own = {.moe_dense = 1};
  mc_arena *ar = o->arenas.a;
  for (int f = 0; f < geo->fams.n; f++) {
    mc_param_hold h;
    if (mc_param_hold_of(geo, f, rank, hold ? hold : &own, &h) != 0) {
      free(holds);
      mc_optim_free(o);
      return -1;
    }
    if (!h.in_stage) continue;
    if (!hold) h.has_master = 1, h.master_bytes = h.moment_bytes;
    holds[o->n] = h;
    mc_optim_slot *s = &o->slots[o->n++];
    s->fam = f;
    s->decay = geo->fams.f[f].decay;
    s->opt = geo->fams.f[f].opt;
    s->rows = (int)geo->fams.f[f].shape[0];
    s->cols = geo->fams.f[f].ndim > 1 ? (int)geo->fams.f[f].shape[1] : 1;
    s->shard = h.shard;
    s->numel = h.shard.numel;
    s->offset = h.z_off; /* where the shard starts inside the rank's local (working) slice */
    if (h.has_master) mc_arena_count(&ar[h.master_cat], h.master_bytes);
    for (int k = 0; k < h.n_moments; k++) mc_arena_count(&ar[h.moments_cat], h.moment_bytes);
  }
  mc_muon_scratch ms;
  if (mc_muon_scratch_of(geo, rank, &ms) != 0) {
    free(holds);
    mc_optim_free(o);
    return -1;
  }
  mc_arena *scr = &ar[MC_MEM_OPTIM_SCRATCH];
  if (ms.full_floats) mc_arena_count(scr, ms.full_floats * 4), mc_arena_count(scr, ms.work_floats * 4);
  if (ms.gather_floats) mc_arena_count(scr, ms.gather_floats * 4);
  int rc = 0;
  for (int c = 0; c < MC_MEM_COUNT && rc == 0; c++) rc = mc_arena_open(&ar[c], be, (mc_mem_cat)c);
  for (int i = 0; i < o->n && rc == 0; i++) { /* zero-filled, in the counting order */
    mc_optim_slot *s = &o->slots[i];
    const mc_param_hold *h = &holds[i];
    if (h->has_master) rc = !(s->master = mc_arena_take(&ar[h->master_cat], h->master_bytes, h->master_cat));
    int nd;
    const mc_state_decl *decl = mc_opt_states(s->opt, &nd); /* the optimizer's states: n_moments shaped like it */
    for (int k = 0; k < nd && !rc; k++) /* a scalar kind (step) is the slot's own host field */
      if (!mc_state_is_scalar(decl[k].state))
        rc = !(*state_field(s, decl[k].state) = mc_arena_take(&ar[h->moments_cat], h->moment_bytes, h->moments_cat));
    if (rc) mc_error_context("optimizer, family %s", geo->fams.f[s->fam].name);
  }
  if (!rc && ms.full_floats) {
    rc = !(o->muon_x = mc_arena_take(scr, ms.full_floats * 4, MC_MEM_OPTIM_SCRATCH)) ||
         !(o->muon_w = mc_arena_take(scr, ms.work_floats * 4, MC_MEM_OPTIM_SCRATCH));
    if (!rc && ms.gather_floats) rc = !(o->muon_g = mc_arena_take(scr, ms.gather_floats * 4, MC_MEM_OPTIM_SCRATCH));
    if (rc) mc_error_context("optimizer, Muon scratch");
  }
  free(holds);
  if (rc) {
    mc_optim_free(o);
    return mc_error_context("optimizer");
  }
  return 0;
}

void mc_optim_free(mc_optim *o) {
  mc_arenas_close(&o->arenas);
  free(o->slots);
  memset(o, 0, sizeof *o);
}

void mc_optim_mem_bytes(const mc_optim *o, int64_t bytes[MC_MEM_COUNT]) { mc_arenas_add_bytes(&o->arenas, bytes); }

float *mc_optim_state(const mc_optim_slot *s, mc_state st) {
  float **f = state_field((mc_optim_slot *)s, st);
  return f ? *f : NULL;
}

int mc_optim_slot_of(const mc_optim *o, int fam) {
  for (int i = 0; i < o->n; i++)
    if (o->slots[i].fam == fam) return i;
  return -1;
}

double mc_lr_at(const mc_train_cfg *t, int64_t s) {
  if (t->warmup_steps > 0 && s < t->warmup_steps) return t->lr * (double)(s + 1) / t->warmup_steps;
  int64_t span = t->steps - t->warmup_steps;
  double p = span > 0 ? (double)(s - t->warmup_steps) / (double)span : 1.0;
  if (p > 1) p = 1;
  if (p < 0) p = 0;
  return t->min_lr + 0.5 * (t->lr - t->min_lr) * (1.0 + cos(3.14159265358979323846 * p));
}

/* One sumsq_multi over the primary slots: on the CPU exactly the in-order sum of per-slot
 * sums, on a GPU one device sync instead of one per slot. */
double mc_optim_grad_sq(const mc_optim *o, float *const *grads) {
  const float **x = malloc(sizeof *x * (size_t)(o->n + 1));
  int64_t *n = malloc(sizeof *n * (size_t)(o->n + 1));
  double sum = 0;
  int k = 0;
  for (int i = 0; i < o->n; i++) {
    const mc_optim_slot *s = &o->slots[i];
    if (!s->shard.primary || s->numel == 0) continue;
    if (x && n) {
      x[k] = grads[i] + s->offset, n[k++] = s->numel;
    } else { /* no host memory for the lists: slot by slot, the same sum */
      sum += o->be->sumsq(o->be, grads[i] + s->offset, s->numel);
    }
  }
  if (x && n) sum = o->be->sumsq_multi(o->be, x, n, k);
  free(x), free(n);
  return sum;
}

double mc_clip_scale(double norm, double clip) {
  if (clip <= 0) return 1.0;
  double c = clip / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/* One Muon slot: the direction on the shard, the whole matrix (gathered where split), its
 * orthogonalisation, and the update of the shard with this rank's hyperslab of the result. */
static int muon_slot(mc_optim *o, mc_optim_slot *s, const mc_train_cfg *t, double lr, double grad_scale, const float *g) {
  mc_backend *be = o->be;
  const int64_t whole = (int64_t)s->rows * s->cols;
  float *x = o->muon_x, *full = x;
  mc_muon_direction(be, s->momentum, g, x, s->numel, (float)t->optim.muon_momentum, t->optim.muon_nesterov,
                    (float)grad_scale);
  /* the gather is collective: called for every Muon slot (it decides from the layout alone) */
  if (o->gather_matrix && o->gather_matrix(o->gather_user, (int)(s - o->slots), x, o->muon_g, &full) != 0) return -1;
  if (!o->gather_matrix && s->numel != whole)
    return mc_error("Muon: %lld of the %lld elements of a matrix on one rank and no gather", (long long)s->numel,
                    (long long)whole);
  mc_muon_orthogonalize(be, full, s->rows, s->cols, t->optim.muon_ns_steps, o->muon_w);
  /* this rank's hyperslab (a box of the matrix, row-major) into the other buffer */
  const float *mine = full;
  if (full != x || s->numel != whole) {
    float *dst = full == x ? o->muon_g : x;
    const mc_shard *h = &s->shard;
    be->copy_2d(be, dst, h->count[1], full + h->start[0] * s->cols + h->start[1], s->cols, h->count[1], h->count[0]);
    mine = dst;
  }
  mc_muon_apply(be, s->master, mine, s->numel, (float)lr, s->decay ? (float)t->weight_decay : 0.0f,
                (float)mc_muon_scale(s->rows, s->cols), s->w_bf16);
  return 0;
}

int mc_optim_step(mc_optim *o, const mc_train_cfg *t, double lr, double grad_scale, float *const *grads) {
  o->step++;
  /* a checkpoint's snapshot copy of the state may still be reading it (kernels/ops.h) */
  o->be->snap_fence(o->be);
  mc_adamw_args a = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->adam_eps, 0.0f, 0, (float)grad_scale};
  /* Tensors update independently, so batching the list changes no result; the CUDA backend
   * launches once per 128 tensors anyway. One call shares one t: a batch ends where the next
   * family's step differs (never, unless a resume gave families different steps). */
  enum { BATCH = 128 };
  mc_adamw_tensor upd[BATCH];
  int k = 0;
  for (int i = 0; i <= o->n; i++) {
    mc_optim_slot *s = i < o->n ? &o->slots[i] : NULL;
    if (s && s->opt == MC_OPT_ADAMW) s->step++; /* every AdamW family takes this step */
    const int take = s && s->numel > 0 && s->opt == MC_OPT_ADAMW;
    if (k > 0 && (k == BATCH || !s || (take && s->step != a.step))) {
      o->be->adamw_multi(o->be, upd, k, &a);
      k = 0;
    }
    if (!s) break;
    if (!take) continue;
    a.step = s->step;
    upd[k++] = (mc_adamw_tensor){.w = s->master,
                                 .g = grads[i] + s->offset,
                                 .m = s->exp_avg,
                                 .v = s->exp_avg_sq,
                                 .n = s->numel,
                                 .weight_decay = s->decay ? (float)t->weight_decay : 0.0f,
                                 .w_bf16 = s->w_bf16};
  }
  /* Muon slots in slot order; every rank of a gather group reaches each of its slots in the
   * same order (a gather is collective, also for a rank whose shard is empty) */
  for (int i = 0; i < o->n; i++) {
    mc_optim_slot *s = &o->slots[i];
    if (s->opt != MC_OPT_MUON) continue;
    if (muon_slot(o, s, t, lr, grad_scale, grads[i] + s->offset) != 0)
      return mc_error_context("Muon step of family #%d", s->fam);
  }
  return 0;
}
