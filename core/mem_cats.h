/* The memory categories of what a rank holds, their stable short names and the category of a
 * parameter's working weights: one vocabulary for the trainer's arenas, the planner and the
 * reports. mc_mem_cat_name (plan/plan.c) returns these names. */
#ifndef MC_CORE_MEM_CATS_H
#define MC_CORE_MEM_CATS_H

#include <stdint.h>

#include "core/families.h"

typedef enum {
  MC_MEM_PARAMS_REPLICATED = 0, /* working params of families replicated over TP */
  MC_MEM_PARAMS_TP,             /* working params of TP-sharded families */
  MC_MEM_PARAMS_EP,             /* working params of EP-sharded (expert) families */
  MC_MEM_GRADS,                 /* fp32 gradient accumulators */
  MC_MEM_MASTER_DECAY,          /* fp32 master weights of bf16 working weights (bf16 mode only), decay group */
  MC_MEM_MASTER_NO_DECAY,       /*   ... no-decay group */
  MC_MEM_MOMENTS_DECAY,         /* optimizer states: AdamW exp_avg + exp_avg_sq, Muon momentum; decay group */
  MC_MEM_MOMENTS_NO_DECAY,      /*   ... no-decay group */
  MC_MEM_OPTIM_SCRATCH,         /* Muon: the whole matrix, its gather buffer, Newton-Schulz workspace */
  MC_MEM_ZERO3_BUFFERS,         /* zero=3: gathered params and full grads of one layer */
  MC_MEM_DIST_STAGING,          /* zero=0/1: packs of the step's gradient reduction and weight gather, in chunks */
  MC_MEM_ACTIVATIONS,           /* kept for backward over the in-flight micro-batches */
  MC_MEM_PIPELINE_BUFFERS,      /* pp > 1: boundary activation / gradient receive buffers */
  MC_MEM_MOE_SCRATCH,           /* routing scratch of one E layer in flight */
  MC_MEM_RUNTIME_RESERVE,       /* context, library workspaces, communicator buffers */
  MC_MEM_ALLOCATOR_OVERHEAD,    /* fragmentation and rounding, a fraction of the above */
  MC_MEM_COUNT
} mc_mem_cat;

static const char *const mc_mem_cat_names[MC_MEM_COUNT] = {
    "params.replicated",       "params.tp",           "params.ep",
    "grads",                   "optimizer.master.decay", "optimizer.master.no_decay",
    "optimizer.moments.decay", "optimizer.moments.no_decay", "optimizer.scratch",
    "zero3.buffers",           "dist.staging",        "activations",         "pipeline.buffers",
    "moe.scratch",             "runtime.reserve",     "allocator.overhead",
};

/* Every tensor of a category lives in that category's one allocation, aligned to
 * MC_MEM_ALIGN bytes; a tensor of `bytes` occupies its footprint there (at least one unit, so
 * that every tensor, even an empty one, has its own address). */
#define MC_MEM_ALIGN 256
static inline int64_t mc_mem_footprint(int64_t bytes) {
  if (bytes < 1) bytes = 1;
  if (bytes > INT64_MAX - MC_MEM_ALIGN) return INT64_MAX / MC_MEM_ALIGN * MC_MEM_ALIGN; /* saturates */
  return (bytes + MC_MEM_ALIGN - 1) / MC_MEM_ALIGN * MC_MEM_ALIGN;
}

static inline const char *mc_mem_cat_label(mc_mem_cat c) {
  return c >= 0 && c < MC_MEM_COUNT ? mc_mem_cat_names[c] : "?";
}

/* Working params go by placement class: TP-sharded, EP-sharded (experts), or replicated. */
static inline mc_mem_cat mc_mem_param_cat(mc_place place) {
  return place == MC_PLACE_TP ? MC_MEM_PARAMS_TP : place == MC_PLACE_EP ? MC_MEM_PARAMS_EP : MC_MEM_PARAMS_REPLICATED;
}

#endif
