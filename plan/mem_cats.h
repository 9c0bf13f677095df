/* The memory categories' stable short names and the category of a parameter's working
 * weights, in a header so that code outside the planner library (the trainer's arenas)
 * names and places tensors the same way without linking it. mc_mem_cat_name (plan/plan.c)
 * returns these names. */
#ifndef MC_PLAN_MEM_CATS_H
#define MC_PLAN_MEM_CATS_H

#include "ckpt/families.h"
#include "plan/plan.h"

static const char *const mc_mem_cat_names[MC_MEM_COUNT] = {
    "params.replicated",       "params.tp",           "params.ep",
    "grads",                   "optimizer.master.decay", "optimizer.master.no_decay",
    "optimizer.moments.decay", "optimizer.moments.no_decay",
    "zero3.buffers",           "activations",         "pipeline.buffers",
    "moe.scratch",             "runtime.reserve",     "allocator.overhead",
};

static inline const char *mc_mem_cat_label(mc_mem_cat c) {
  return c >= 0 && c < MC_MEM_COUNT ? mc_mem_cat_names[c] : "?";
}

/* Working params go by placement class: TP-sharded, EP-sharded (experts), or replicated. */
static inline mc_mem_cat mc_mem_param_cat(mc_place place) {
  return place == MC_PLACE_TP ? MC_MEM_PARAMS_TP : place == MC_PLACE_EP ? MC_MEM_PARAMS_EP : MC_MEM_PARAMS_REPLICATED;
}

#endif
