/* AdamW and Muon on this rank's optimizer shards, global-norm clipping and the learning-rate
 * schedule. Each family's optimizer is its group's (core/optim_groups.h, optim.groups).
 * Master weights and moments live in the memory of the optimizer's backend (device memory for
 * CUDA); the update is the backend's multi-tensor adamw_multi op (every slot in one call) and
 * the norm its sumsq_multi op (one result, one device sync).
 *
 * Per family, the fp32 master weight and the two moments held here are the hyperslab
 * mc_shard_of(geo, fam, state, rank) gives (the whole tensor for world size 1); an AdamW
 * family's step counter t (state kind step, replicated over its holders) is host memory of
 * the slot, advanced by every optimizer step and used for that family's bias correction. The shard is
 * rows of the rank's TP/EP-local slice (ZeRO splits dim 0), so it is one contiguous run of the
 * working tensor. Update (PyTorch AdamW, decoupled decay, step t counted from 1):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p = p (1 - lr wd [family decays]) - (lr / (1-b1^t)) m / (sqrt(v) / sqrt(1-b2^t) + eps).
 * Muon (train/muon.h; 2-D families), with mu = optim.muon_momentum and the same lr and decay:
 *   M = mu M + g;  U = nesterov ? g + mu M : M;  O = NS(U over the whole matrix)
 *   p = p (1 - lr wd [family decays]) - lr 0.2 sqrt(max(rows, cols)) O
 * Newton-Schulz needs the whole matrix while a rank holds a TP part and/or a ZeRO part of it:
 * mc_optim.gather_matrix assembles it (train/dist_opt.c all-gathers over DP, then TP), every
 * rank of the family's group orthogonalises the same matrix and keeps its own hyperslab. */
#ifndef MC_TRAIN_OPTIM_H
#define MC_TRAIN_OPTIM_H

#include <stdint.h>

#include "core/config.h"
#include "core/holdings.h"
#include "core/ownership.h"
#include "kernels/ops.h"
#include "train/arena.h"

typedef struct {
  int fam;          /* index into geo->fams */
  int decay;        /* mc_family.decay */
  int opt;          /* mc_family.opt: MC_OPT_ADAMW or MC_OPT_MUON */
  int rows, cols;   /* the family's global shape (Muon: the matrix) */
  mc_shard shard;   /* mc_shard_of(geo, fam, MC_STATE_PARAM, rank) */
  int64_t offset;   /* where the shard starts inside the rank's local (working) slice */
  int64_t numel;    /* elements held */
  float *master;                /* backend memory */
  float *exp_avg, *exp_avg_sq;  /* AdamW (NULL under Muon) */
  float *momentum;              /* Muon (NULL under AdamW) */
  int64_t step;                 /* AdamW: the steps the family has taken, its t (host memory) */
  /* Optional destination of the updated master weights rounded to bf16 (kernels/bf16.h),
   * written by mc_optim_step in the same pass as the update (backend memory, numel elements,
   * NULL = none, the default): the caller points it at bf16 working weights. */
  mc_bf16 *w_bf16;
} mc_optim_slot;

typedef struct {
  mc_backend *be;       /* whose memory holds the slots and whose ops update them */
  int n;
  mc_optim_slot *slots; /* one per family of the rank's stage, in family order */
  int64_t step;         /* optimizer steps taken (t of the last update) */
  /* One allocation per category: master weights and optimizer states, each by weight-decay
   * group, and Muon's scratch (core/holdings.h mc_muon_scratch_of). A slot whose master is
   * external (mc_optim_init_with) takes no master memory here. */
  mc_arenas arenas;
  float *muon_x, *muon_g, *muon_w; /* Muon scratch: whole matrix, gather buffer, NS workspace */
  /* Muon's whole matrix: on entry x[0..numel) holds slot `slot`'s shard of the update
   * direction; assembles the whole rows x cols matrix (row-major) in x or g (g: room for the
   * largest matrix wherever the layout splits one, else NULL) and points *full at it. Called
   * for every Muon slot in slot order (it may be collective: whether it gathers depends on the
   * layout only). 0, or -1 with mc_error. NULL: one rank, whose Muon shards are whole. */
  int (*gather_matrix)(void *user, int slot, float *x, float *g, float **full);
  void *gather_user;
} mc_optim;

/* Slot s's buffer of state kind st (the master for MC_STATE_PARAM), NULL for a kind its
 * optimizer does not keep and for step (an int64 in the slot, not a float buffer). */
float *mc_optim_state(const mc_optim_slot *s, mc_state st);

/* Slots for every family the rank's stage owns, in backend memory; moments and master zero.
 * mc_optim_init uses the CPU backend. */
int mc_optim_init(mc_optim *o, const mc_geometry *geo, int rank);
int mc_optim_init_on(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be);
/* The same for a network's rank: the slots are the holdings under `hold` (the network's
 * settings, core/holdings.h): a slot whose working weights are fp32 takes no master memory
 * here (master is NULL until the caller points it at those working weights, then the master
 * copy); bf16 working weights get an fp32 master. hold = NULL: every slot has its own master. */
int mc_optim_init_with(mc_optim *o, const mc_geometry *geo, int rank, mc_backend *be, const mc_hold_opts *hold);
void mc_optim_free(mc_optim *o);
/* Adds the bytes of the optimizer's arenas to bytes[c] per memory category c. */
void mc_optim_mem_bytes(const mc_optim *o, int64_t bytes[MC_MEM_COUNT]);
/* Index of the slot of family `fam`, or -1. */
int mc_optim_slot_of(const mc_optim *o, int fam);

/* Learning rate for optimizer step s (0-based): linear warmup lr*(s+1)/warmup over the first
 * warmup_steps steps, then cosine from lr down to min_lr at s = steps. */
double mc_lr_at(const mc_train_cfg *t, int64_t s);

/* Sum of squares of the gradient elements this rank is primary for. grads[i] is the local
 * (working-slice) gradient of slot i, in backend memory. Summed over ranks it counts every
 * element once. Backend failures are reported by o->be->sync(). */
double mc_optim_grad_sq(const mc_optim *o, float *const *grads);
/* Clipping factor for a global gradient norm: min(1, clip / (norm + 1e-6)); 1 if clip <= 0. */
double mc_clip_scale(double norm, double clip);

/* One optimizer step on every slot: AdamW slots in adamw_multi calls, then each Muon slot
 * (weight decay only on decaying families): grads[i] as above, multiplied by grad_scale
 * (clipping). Each slot's updated master weights also go to its w_bf16 where set. Queued on
 * the backend: 0, or -1 when a gather failed (mc_error); backend failures are reported by
 * o->be->sync(). */
int mc_optim_step(mc_optim *o, const mc_train_cfg *t, double lr, double grad_scale, float *const *grads);

#endif
