/* The memory planner: bytes per device by category, for every rank of a layout. What a rank
 * holds comes from the holdings function (core/holdings.h), the one the trainer allocates
 * from, so the plan equals the trainer's allocation for every category it owns; the planner
 * adds the runtime reserve and the allocator overhead it assumes. docs/mcplan.md says how
 * each term is computed. */
#ifndef MC_PLAN_PLAN_H
#define MC_PLAN_PLAN_H

#include <stdint.h>

#include "core/config.h"
#include "core/layout.h"
#include "core/ownership.h"
#include "core/holdings.h"
#include "core/mem_cats.h"
#include "core/optim_groups.h"

/* Stable short name, e.g. "params.tp", "optimizer.moments.decay" (used as JSON keys). */
const char *mc_mem_cat_name(mc_mem_cat c);
/* Human description for the text report. */
const char *mc_mem_cat_desc(mc_mem_cat c);

typedef struct {
  int64_t device_mem;     /* bytes per device the plan is checked against */
  int64_t reserve;        /* runtime reserve bytes; < 0 = default for train.device */
  double alloc_overhead;  /* fraction of allocated bytes lost to the allocator */
  double margin;          /* warn when headroom / device_mem falls below this fraction */
} mc_plan_opts;

void mc_plan_opts_default(mc_plan_opts *o);
/* Default runtime reserve for a device name ("cuda" or "cpu"). */
int64_t mc_plan_default_reserve(const char *device);

typedef struct {
  int rank;
  mc_coords c;
  int stage;
  int64_t bytes[MC_MEM_COUNT];
  int64_t total;              /* sum of bytes[] */
  int64_t headroom;           /* device_mem - total (may be negative) */
  /* Elements, from mc_shard_of. */
  int64_t working_elems;      /* working params resident (local slice, or state shard at zero=3) */
  int64_t state_elems[MC_N_STATES];   /* state hyperslab elements held (0 for a kind no family
                                         of the stage has) */
  int64_t primary_elems[MC_N_STATES]; /* ... of which this rank is the primary (it writes them) */
  /* Per optimizer (mc_opt_kind): the bytes of the optimizer-state tensors (the kinds it declares:
   * AdamW's exp_avg and exp_avg_sq, Muon's momentum) of the families it trains, each at its
   * footprint, from mc_param_hold_of's state_bytes. Summed over the optimizers they are the two
   * optimizer.moments categories. */
  int64_t opt_group_bytes[MC_N_OPTS];
  /* Activation detail of this rank's stage (in flight, per micro-batch, recompute working
   * set, gradient scratch, network buffers, pipeline buffers, MoE dispatch scratch). */
  mc_stage_hold act;
} mc_plan_rank;

/* One pipeline stage: its FLOPs per step on one of its devices (the stage map's FLOPs per
 * token x tokens per step / (dp x tp)), its largest rank, and its idle share under 1F1B. */
typedef struct {
  double fwd_flops, bwd_flops, flops; /* per step per device; flops = fwd + bwd */
  /* Recomputation (train.recompute): the forward FLOPs per token the stage's layers run again
   * before their backward (mc_recompute_flops), and per step per device; hardware FLOPs =
   * flops + recompute_flops, what the stage's devices execute in a step. */
  double recompute_flops_per_token, recompute_flops, hw_flops;
  int peak_rank;                      /* the stage's rank with the largest total */
  int64_t peak_bytes;
  double bubble;                      /* idle / step time, from mc_plan_1f1b */
} mc_plan_stage;

typedef struct {
  mc_plan_opts opts;
  mc_recompute recompute;
  mc_hold_opts hold;          /* the settings the holdings follow (bf16 weights, bf16 product
                                 activations, micro-batch, recompute) */
  int world;
  int micro_batch;
  int n_micro;                /* micro-batches per step per DP rank */
  int64_t tokens_per_step;    /* global_batch * seq_len */
  double flops_per_token;     /* model FLOPs, the MFU numerator: mc_model_train_flops_per_token */
  double flops_per_step;
  /* Hardware FLOPs, what the devices execute: every block's forward and backward as run
   * (mc_model_fwd_bwd_flops_per_token: the attention backward's recomputed scores and the
   * embedding's gradient scatter included) plus the forward recomputed under train.recompute
   * (recompute_flops_per_token, the stages' sum; 0 under none). Unlike model FLOPs they depend
   * on the recompute policy. */
  double recompute_flops_per_token;
  double hw_flops_per_token;
  double hw_flops_per_step;
  int64_t model_elems;        /* total elements over all families */
  int64_t model_elems_by_place[3]; /* ... by mc_place */
  int opt_group_fams[MC_N_OPTS];   /* families each optimizer trains (optim.groups) */
  mc_plan_rank *ranks;        /* world entries */
  int peak_rank;              /* rank with the largest total */
  int n_low_headroom;         /* ranks whose headroom is under the margin (or negative) */
  int n_no_fit;               /* ranks whose total exceeds device_mem */
  int pp;
  mc_plan_stage *stages;      /* pp entries */
  double bubble;              /* idle share of all stages' time in one step under 1F1B */
} mc_plan;

/* Builds the plan for every rank of the geometry. `train` supplies micro_batch,
 * global_batch, recompute, dtype and device. Returns 0 or -1 with a message. */
int mc_plan_build(const mc_geometry *g, const mc_train_cfg *train, const mc_plan_opts *opts,
                  mc_plan *p);
void mc_plan_free(mc_plan *p);

/* Training FLOPs of one step on one device of stage s: the stage's forward + backward FLOPs
 * per token (mc_stage_map.flops, embedding/head included) x tokens per step, divided evenly
 * over its dp*tp ranks. */
double mc_plan_stage_step_flops(const mc_geometry *g, const mc_plan *p, int stage);

/* Hardware FLOPs of one step on one device of stage s: mc_plan_stage_step_flops plus the
 * stage's recomputed forward (mc_plan_stage.recompute_flops). */
double mc_plan_stage_hw_step_flops(const mc_geometry *g, const mc_plan *p, int stage);

/* Simulates one step of the 1F1B schedule (non-interleaved: stage s runs min(pp-1-s, m)
 * forwards, then alternates a forward and a backward, then the remaining backwards) with m
 * micro-batches, stage s taking fwd[s] per forward and bwd[s] per backward of one
 * micro-batch, a forward waiting for the previous stage's forward of that micro-batch and a
 * backward for the next stage's backward (no transfer time). Writes each stage's idle share
 * of the step, (step - m (fwd[s] + bwd[s])) / step, to idle[s] (may be NULL) and returns the
 * share of all stages' time that is idle. Equal stages give (pp-1)/(m+pp-1). */
double mc_plan_1f1b(int pp, int m, const double *fwd, const double *bwd, double *idle);

typedef enum { MC_FIT_OK = 0, MC_FIT_LOW_HEADROOM = 1, MC_FIT_NO = 2 } mc_fit;
/* Whether a rank's plan fits the device with the margin to spare. */
mc_fit mc_plan_fit(const mc_plan *p, const mc_plan_rank *r);

/* Optimizer state (master + moments) of one weight-decay group on one rank, in bytes. */
int64_t mc_plan_optimizer_bytes(const mc_plan_rank *r, int decay);

#endif
