/* The memory planner: predicted bytes per device by category, for every rank of a layout.
 * Parameter, gradient and optimizer categories are sums over the hyperslabs mc_shard_of
 * gives (never re-derived); activations follow plan/activations.h. The trainer can report
 * measured memory next to these categories, and mcaudit can reuse them. docs/mcplan.md says
 * how each term is computed. */
#ifndef MC_PLAN_PLAN_H
#define MC_PLAN_PLAN_H

#include <stdint.h>

#include "core/config.h"
#include "core/layout.h"
#include "core/ownership.h"
#include "core/mem_cats.h"
#include "plan/activations.h"


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
  int64_t state_elems[MC_N_STATES];   /* state hyperslab elements held */
  int64_t primary_elems[MC_N_STATES]; /* ... of which this rank is the primary (it writes them) */
  /* Activation detail of this rank's stage. */
  int inflight;               /* micro-batches in flight under 1F1B: min(pp - stage, n_micro) */
  int64_t act_per_micro;      /* bytes kept per micro-batch (layers + embed/head) */
  int64_t act_transient;      /* recompute working set of one layer, one micro-batch */
  int64_t act_working;        /* the backward's gradient scratch and residual working rows */
  mc_moe_scratch moe;         /* routing scratch detail (zeros if the stage has no E layer) */
} mc_plan_rank;

typedef struct {
  mc_plan_opts opts;
  mc_recompute recompute;
  int act_bytes;              /* bytes per activation element: 4 (the trainer keeps fp32 activations in both dtypes) */
  int matmul_bytes;           /* bytes per working element of a matrix weight (mc_role_is_matmul): 2 under bf16,
                                 else 4; other params are fp32 */
  int bf16;                   /* 1 when train.dtype is bf16 (separate fp32 master copy) */
  int prod_bytes;             /* mc_act_shape.pbytes: 2 under bf16 on one rank without TP (what the
                                 trainer keeps in bf16, train/net_blocks.h mc_act16), else 4 */
  int world;
  int micro_batch;
  int n_micro;                /* micro-batches per step per DP rank */
  int64_t tokens_per_step;    /* global_batch * seq_len */
  double flops_per_token;     /* mc_model_train_flops_per_token */
  double flops_per_step;
  int64_t model_elems;        /* total elements over all families */
  int64_t model_elems_by_place[3]; /* ... by mc_place */
  mc_plan_rank *ranks;        /* world entries */
  int peak_rank;              /* rank with the largest total */
  int n_low_headroom;         /* ranks whose headroom is under the margin (or negative) */
  int n_no_fit;               /* ranks whose total exceeds device_mem */
} mc_plan;

/* Builds the plan for every rank of the geometry. `train` supplies micro_batch,
 * global_batch, recompute, dtype and device. Returns 0 or -1 with a message. */
int mc_plan_build(const mc_geometry *g, const mc_train_cfg *train, const mc_plan_opts *opts,
                  mc_plan *p);
void mc_plan_free(mc_plan *p);

/* Model training FLOPs of one step on one device of stage s: 3 x the stage's forward cost
 * per token (mc_stage_map) x tokens per step, divided evenly over its dp*tp ranks. */
double mc_plan_stage_step_flops(const mc_geometry *g, const mc_plan *p, int stage);

typedef enum { MC_FIT_OK = 0, MC_FIT_LOW_HEADROOM = 1, MC_FIT_NO = 2 } mc_fit;
/* Whether a rank's plan fits the device with the margin to spare. */
mc_fit mc_plan_fit(const mc_plan *p, const mc_plan_rank *r);

/* Optimizer state (master + moments) of one group on one rank, in bytes. */
int64_t mc_plan_optimizer_bytes(const mc_plan_rank *r, int decay);

#endif
