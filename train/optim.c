#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int mc_optim_init(mc_optim *o, const mc_geometry *geo, int rank) {
  return mc_optim_init_on(o, geo, rank, mc_backend_cpu());
}

int mc_optim_init_on(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be) {
  memset(o, 0, sizeof *o);
  o->be = be;
  o->slots = calloc((size_t)geo->fams.n, sizeof *o->slots);
  if (!o->slots) return mc_error("optimizer: out of memory");
  for (int f = 0; f < geo->fams.n; f++) {
    mc_shard sh;
    if (mc_shard_of(geo, f, MC_STATE_PARAM, rank, &sh) != 0) {
      mc_optim_free(o);
      return -1;
    }
    if (!sh.in_stage) continue;
    mc_optim_slot *s = &o->slots[o->n++];
    s->fam = f;
    s->decay = geo->fams.f[f].decay;
    s->shard = sh;
    s->numel = sh.numel;
    /* Rows of the local slice before the held ones, times the local row size. */
    int64_t row = 1;
    for (int k = 1; k < sh.ndim; k++) row *= sh.local_count[k];
    s->offset = (sh.start[0] - sh.local_start[0]) * row;
    size_t bytes = (size_t)(s->numel > 0 ? s->numel : 1) * sizeof(float);
    s->master = be->alloc(be, bytes); /* zero-filled */
    s->exp_avg = be->alloc(be, bytes);
    s->exp_avg_sq = be->alloc(be, bytes);
    if (!s->master || !s->exp_avg || !s->exp_avg_sq) {
      mc_optim_free(o);
      return mc_error("optimizer: out of %s memory for family %s", be->name, geo->fams.f[f].name);
    }
  }
  return 0;
}

void mc_optim_free(mc_optim *o) {
  if (o->slots) {
    for (int i = 0; i < o->n; i++) {
      o->be->free(o->be, o->slots[i].master);
      o->be->free(o->be, o->slots[i].exp_avg);
      o->be->free(o->be, o->slots[i].exp_avg_sq);
    }
  }
  free(o->slots);
  memset(o, 0, sizeof *o);
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

double mc_optim_grad_sq(const mc_optim *o, float *const *grads) {
  double sum = 0;
  for (int i = 0; i < o->n; i++) {
    const mc_optim_slot *s = &o->slots[i];
    if (!s->shard.primary || s->numel == 0) continue;
    sum += o->be->sumsq(o->be, grads[i] + s->offset, s->numel);
  }
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
  mc_adamw_args a = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->adam_eps, 0.0f, o->step, (float)grad_scale};
  for (int i = 0; i < o->n; i++) {
    mc_optim_slot *s = &o->slots[i];
    if (s->numel == 0) continue;
    a.weight_decay = s->decay ? (float)t->weight_decay : 0.0f;
    o->be->adamw(o->be, s->master, grads[i] + s->offset, s->exp_avg, s->exp_avg_sq, s->numel, &a);
  }
}
