#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int mc_optim_init(mc_optim *o, const mc_geometry *geo, int rank) {
  return mc_optim_init_on(o, geo, rank, mc_backend_cpu());
}

int mc_optim_init_on(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be) {
  return mc_optim_init_with(o, geo, rank, be, NULL);
}

/* Each slot's tensors are the family's optimizer holdings (core/holdings.h): the master copy
 * (where the working weights are not fp32 themselves) in the master arena of its weight-decay
 * group, both moments in the moments arena of its group. */
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
    s->shard = h.shard;
    s->numel = h.shard.numel;
    s->offset = h.z_off; /* where the shard starts inside the rank's local (working) slice */
    if (h.has_master) mc_arena_count(&ar[h.master_cat], h.master_bytes);
    mc_arena_count(&ar[h.moments_cat], h.moment_bytes);
    mc_arena_count(&ar[h.moments_cat], h.moment_bytes);
  }
  int rc = 0;
  for (int c = 0; c < MC_MEM_COUNT && rc == 0; c++) rc = mc_arena_open(&ar[c], be, (mc_mem_cat)c);
  for (int i = 0; i < o->n && rc == 0; i++) { /* zero-filled, in the counting order */
    mc_optim_slot *s = &o->slots[i];
    const mc_param_hold *h = &holds[i];
    if (h->has_master) rc = !(s->master = mc_arena_take(&ar[h->master_cat], h->master_bytes, h->master_cat));
    if (!rc) rc = !(s->exp_avg = mc_arena_take(&ar[h->moments_cat], h->moment_bytes, h->moments_cat));
    if (!rc) rc = !(s->exp_avg_sq = mc_arena_take(&ar[h->moments_cat], h->moment_bytes, h->moments_cat));
    if (rc) mc_error_context("optimizer, family %s", geo->fams.f[s->fam].name);
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

void mc_optim_step(mc_optim *o, const mc_train_cfg *t, double lr, double grad_scale,
                   float *const *grads) {
  o->step++;
  /* a checkpoint's snapshot copy of the state may still be reading it (kernels/ops.h) */
  o->be->snap_fence(o->be);
  mc_adamw_args a = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->adam_eps, 0.0f, o->step, (float)grad_scale};
  /* Tensors update independently, so batching the list changes no result; the CUDA backend
   * launches once per 128 tensors anyway. */
  enum { BATCH = 128 };
  mc_adamw_tensor upd[BATCH];
  int k = 0;
  for (int i = 0; i <= o->n; i++) {
    if (k == BATCH || (i == o->n && k > 0)) {
      o->be->adamw_multi(o->be, upd, k, &a);
      k = 0;
    }
    if (i == o->n) break;
    mc_optim_slot *s = &o->slots[i];
    if (s->numel == 0) continue;
    upd[k++] = (mc_adamw_tensor){.w = s->master,
                                 .g = grads[i] + s->offset,
                                 .m = s->exp_avg,
                                 .v = s->exp_avg_sq,
                                 .n = s->numel,
                                 .weight_decay = s->decay ? (float)t->weight_decay : 0.0f,
                                 .w_bf16 = s->w_bf16};
  }
}
