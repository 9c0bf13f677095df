/* The mcplan report as one JSON document (same content as the text report; every rank and
 * every distinct shard, however large the world). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/owners.h"
#include "plan/report.h"
#include "util/error.h"

typedef int (*group_fn)(const mc_layout *, int, int *);

static cJSON *int_array(const int *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

static cJSON *i64_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

static cJSON *slab(int ndim, const int64_t *start, const int64_t *count) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "start", i64_array(start, ndim));
  cJSON_AddItemToObject(o, "count", i64_array(count, ndim));
  return o;
}

static cJSON *rank_map(const mc_geometry *g, int *members) {
  static const group_fn fns[5] = {mc_group_tp, mc_group_dp, mc_group_pp, mc_group_ep, mc_group_edp};
  static const char *const names[5] = {"tp", "dp", "pp", "ep", "edp"};
  cJSON *a = cJSON_CreateArray();
  for (int r = 0; r < g->world; r++) {
    mc_coords c;
    mc_layout_coords(&g->layout, r, &c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON_AddNumberToObject(o, "pp", c.pp_rank);
    cJSON_AddNumberToObject(o, "dp", c.dp_rank);
    cJSON_AddNumberToObject(o, "tp", c.tp_rank);
    cJSON_AddNumberToObject(o, "ep_rank", c.ep_rank);
    cJSON_AddNumberToObject(o, "ep_group", c.ep_group);
    cJSON *groups = cJSON_AddObjectToObject(o, "groups");
    for (int k = 0; k < 5; k++) {
      int n = fns[k](&g->layout, r, members);
      cJSON_AddItemToObject(groups, names[k], int_array(members, n));
    }
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

static cJSON *stage_map(const mc_geometry *g, const mc_plan *p) {
  cJSON *a = cJSON_CreateArray();
  for (int s = 0; s < g->stages.pp; s++) {
    char blocks[MC_MAX_LAYERS + 1];
    snprintf(blocks, sizeof blocks, "%.*s", g->stages.count[s], g->model.pattern + g->stages.first[s]);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "stage", s);
    cJSON_AddNumberToObject(o, "first_layer", g->stages.first[s]);
    cJSON_AddNumberToObject(o, "n_layers", g->stages.count[s]);
    cJSON_AddStringToObject(o, "blocks", blocks);
    cJSON_AddBoolToObject(o, "embed", s == 0);
    cJSON_AddBoolToObject(o, "head", s == g->stages.pp - 1);
    cJSON_AddNumberToObject(o, "fwd_flops_per_token", g->stages.cost[s]);
    cJSON_AddNumberToObject(o, "bwd_flops_per_token", g->stages.bwd[s]);
    cJSON_AddNumberToObject(o, "flops_per_token", g->stages.flops[s]);
    cJSON_AddNumberToObject(o, "fwd_flops_per_step_per_device", p->stages[s].fwd_flops);
    cJSON_AddNumberToObject(o, "bwd_flops_per_step_per_device", p->stages[s].bwd_flops);
    cJSON_AddNumberToObject(o, "train_flops_per_step_per_device", p->stages[s].flops);
    cJSON_AddNumberToObject(o, "recompute_flops_per_token", p->stages[s].recompute_flops_per_token);
    cJSON_AddNumberToObject(o, "recompute_flops_per_step_per_device", p->stages[s].recompute_flops);
    cJSON_AddNumberToObject(o, "hardware_flops_per_step_per_device", p->stages[s].hw_flops);
    cJSON_AddNumberToObject(o, "split_memory_estimate", g->stages.mem[s]);
    cJSON_AddNumberToObject(o, "peak_rank", p->stages[s].peak_rank);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)p->stages[s].peak_bytes);
    cJSON_AddNumberToObject(o, "bubble_fraction", p->stages[s].bubble);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

static cJSON *ownership(const mc_geometry *g) {
  cJSON *a = cJSON_CreateArray();
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    mc_own_table t;
    if (mc_own_table_build(g, fi, &t) != 0) {
      cJSON_Delete(a);
      return NULL;
    }
    char rule[128];
    mc_placement_rule(g, fi, rule, sizeof rule);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", f->name);
    cJSON_AddItemToObject(o, "shape", i64_array(f->shape, f->ndim));
    cJSON_AddStringToObject(o, "placement", mc_place_name(f->place));
    cJSON_AddStringToObject(o, "rule", rule);
    cJSON_AddNumberToObject(o, "stage", t.stage);
    cJSON_AddStringToObject(o, "group", f->decay ? "decay" : "no_decay");
    cJSON_AddStringToObject(o, "optimizer", mc_opt_name(f->opt));
    cJSON_AddBoolToObject(o, "moments_match_param", t.moments_match);
    cJSON *shards = cJSON_AddArrayToObject(o, "shards");
    for (int i = 0; i < t.n; i++) {
      const mc_own_group *gr = &t.groups[i];
      cJSON *s = cJSON_CreateObject();
      cJSON_AddItemToObject(s, "ranks", int_array(gr->ranks, gr->n_ranks));
      cJSON_AddNumberToObject(s, "primary", gr->primary_rank);
      cJSON_AddItemToObject(s, "local", slab(gr->ndim, gr->local_start, gr->local_count));
      cJSON_AddItemToObject(s, "state", slab(gr->ndim, gr->start, gr->count));
      cJSON_AddNumberToObject(s, "numel", (double)gr->numel);
      cJSON_AddItemToArray(shards, s);
    }
    mc_own_table_free(&t);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

/* Bytes per layer and micro-batch for each block kind in the model, under every policy, and
 * the network buffers of each stage. */
static cJSON *activation_table(const mc_geometry *g, const mc_plan *p) {
  mc_act_shape sh;
  mc_act_shape_of(g, 0, &p->hold, p->micro_batch, &sh);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "tokens", (double)sh.n_seq * sh.local.seq_len);
  cJSON_AddNumberToObject(o, "residual_rows", (double)sh.n_seq * sh.T_res);
  cJSON *blocks = cJSON_AddObjectToObject(o, "per_layer");
  for (const char *k = mc_block_letters(); *k; k++) {
    char name[2] = {*k, 0};
    if (!strchr(g->model.pattern, *k)) continue;
    cJSON *b = cJSON_AddObjectToObject(blocks, name);
    for (int r = 0; r < 3; r++)
      cJSON_AddNumberToObject(b, mc_recompute_name((mc_recompute)r),
                              (double)mc_act_layer_bytes(mc_block_kind_of(*k), &sh, (mc_recompute)r));
  }
  cJSON *net = cJSON_AddArrayToObject(o, "network_per_stage");
  for (int s = 0; s < g->layout.pp; s++) {
    mc_act_shape_of(g, s, &p->hold, p->micro_batch, &sh);
    cJSON_AddItemToArray(net, cJSON_CreateNumber((double)mc_act_net_bytes(&sh)));
  }
  return o;
}

static cJSON *states_object(const int64_t *v) {
  cJSON *o = cJSON_CreateObject();
  for (int s = 0; s < MC_N_STATES; s++) cJSON_AddNumberToObject(o, mc_state_name((mc_state)s), (double)v[s]);
  return o;
}

static cJSON *memory_rank(const mc_plan *p, const mc_plan_rank *r) {
  static const char *const fits[3] = {"ok", "low_headroom", "does_not_fit"};
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "rank", r->rank);
  cJSON_AddNumberToObject(o, "stage", r->stage);
  cJSON *b = cJSON_AddObjectToObject(o, "bytes");
  for (int c = 0; c < MC_MEM_COUNT; c++) cJSON_AddNumberToObject(b, mc_mem_cat_name((mc_mem_cat)c), (double)r->bytes[c]);
  cJSON *opt = cJSON_AddObjectToObject(o, "optimizer");
  cJSON_AddNumberToObject(opt, "decay", (double)mc_plan_optimizer_bytes(r, 1));
  cJSON_AddNumberToObject(opt, "no_decay", (double)mc_plan_optimizer_bytes(r, 0));
  cJSON *og = cJSON_AddObjectToObject(o, "optimizer_groups"); /* the optimizers that train some family */
  for (int k = 0; k < MC_N_OPTS; k++)
    if (p->opt_group_fams[k] > 0) cJSON_AddNumberToObject(og, mc_opt_name(k), (double)r->opt_group_bytes[k]);
  cJSON_AddNumberToObject(o, "total", (double)r->total);
  cJSON_AddNumberToObject(o, "headroom", (double)r->headroom);
  cJSON_AddStringToObject(o, "fit", fits[mc_plan_fit(p, r)]);
  cJSON *act = cJSON_AddObjectToObject(o, "activation_detail");
  cJSON_AddNumberToObject(act, "inflight_micro_batches", r->act.inflight);
  cJSON_AddNumberToObject(act, "per_micro_batch", (double)r->act.per_micro);
  cJSON_AddNumberToObject(act, "recompute_working_set", (double)r->act.transient);
  cJSON_AddNumberToObject(act, "gradient_scratch", (double)r->act.scratch);
  cJSON_AddNumberToObject(act, "network_buffers", (double)r->act.network);
  cJSON *moe = cJSON_AddObjectToObject(o, "moe_detail");
  cJSON_AddNumberToObject(moe, "assignments", (double)r->act.moe_assignments);
  cJSON_AddNumberToObject(moe, "balanced_assignments", (double)r->act.moe_balanced);
  cJSON_AddNumberToObject(moe, "per_layer_kept", (double)r->act.moe_layers);
  cJSON_AddNumberToObject(moe, "exchange", (double)r->act.moe_exchange);
  cJSON *el = cJSON_AddObjectToObject(o, "elements");
  cJSON_AddNumberToObject(el, "working", (double)r->working_elems);
  cJSON_AddItemToObject(el, "held", states_object(r->state_elems));
  cJSON_AddItemToObject(el, "primary", states_object(r->primary_elems));
  return o;
}

static cJSON *memory(const mc_plan *p) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "device_mem", (double)p->opts.device_mem);
  cJSON_AddNumberToObject(o, "runtime_reserve", (double)p->opts.reserve);
  cJSON_AddNumberToObject(o, "allocator_overhead_fraction", p->opts.alloc_overhead);
  cJSON_AddNumberToObject(o, "margin_fraction", p->opts.margin);
  cJSON *cats = cJSON_AddArrayToObject(o, "categories");
  for (int c = 0; c < MC_MEM_COUNT; c++) cJSON_AddItemToArray(cats, cJSON_CreateString(mc_mem_cat_name((mc_mem_cat)c)));
  cJSON_AddNumberToObject(o, "peak_rank", p->peak_rank);
  cJSON_AddNumberToObject(o, "peak_bytes", (double)p->ranks[p->peak_rank].total);
  cJSON_AddBoolToObject(o, "fits", p->n_no_fit == 0);
  cJSON_AddNumberToObject(o, "low_headroom_ranks", p->n_low_headroom);
  cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
  for (int r = 0; r < p->world; r++) cJSON_AddItemToArray(ranks, memory_rank(p, &p->ranks[r]));
  return o;
}

cJSON *mc_plan_to_json(const mc_geometry *g, const mc_plan *p) {
  const mc_layout *l = &g->layout;
  int *members = malloc(sizeof(int) * (size_t)g->world);
  if (!members) {
    mc_error("out of memory writing the plan of %d ranks", g->world);
    return NULL;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON *lay = cJSON_AddObjectToObject(root, "layout");
  cJSON_AddNumberToObject(lay, "world", g->world);
  cJSON_AddNumberToObject(lay, "tp", l->tp);
  cJSON_AddNumberToObject(lay, "dp", l->dp);
  cJSON_AddNumberToObject(lay, "pp", l->pp);
  cJSON_AddNumberToObject(lay, "ep", l->ep);
  cJSON_AddBoolToObject(lay, "sp", l->sp);
  cJSON_AddNumberToObject(lay, "zero", l->zero);
  cJSON_AddStringToObject(lay, "pp_split", mc_split_name(l->split));
  cJSON *mod = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(mod, "pattern", g->model.pattern);
  cJSON_AddNumberToObject(mod, "n_layers", g->model.n_layers);
  cJSON_AddNumberToObject(mod, "n_families", g->fams.n);
  cJSON_AddNumberToObject(mod, "params", (double)p->model_elems);
  cJSON *bp = cJSON_AddObjectToObject(mod, "params_by_placement");
  for (int k = 0; k < 3; k++) cJSON_AddNumberToObject(bp, mc_place_name((mc_place)k), (double)p->model_elems_by_place[k]);
  cJSON *tr = cJSON_AddObjectToObject(root, "train");
  cJSON_AddStringToObject(tr, "dtype", p->hold.bf16_weights ? "bf16" : "fp32");
  cJSON_AddStringToObject(tr, "recompute", mc_recompute_name(p->recompute));
  cJSON_AddNumberToObject(tr, "micro_batch", p->micro_batch);
  cJSON_AddNumberToObject(tr, "micro_batches_per_step", p->n_micro);
  cJSON_AddNumberToObject(tr, "tokens_per_step", (double)p->tokens_per_step);
  cJSON *grp = cJSON_AddObjectToObject(tr, "optimizer_groups"); /* families per optimizer */
  for (int k = 0; k < MC_N_OPTS; k++)
    if (p->opt_group_fams[k] > 0) cJSON_AddNumberToObject(grp, mc_opt_name(k), p->opt_group_fams[k]);
  cJSON_AddItemToObject(root, "rank_map", rank_map(g, members));
  free(members);
  cJSON_AddItemToObject(root, "stage_map", stage_map(g, p));
  cJSON *pipe = cJSON_AddObjectToObject(root, "pipeline");
  cJSON_AddStringToObject(pipe, "schedule", "1F1B");
  cJSON_AddNumberToObject(pipe, "micro_batches", p->n_micro);
  cJSON_AddNumberToObject(pipe, "bubble_fraction", p->bubble);
  cJSON_AddNumberToObject(pipe, "equal_stage_bubble_fraction", (double)(l->pp - 1) / (double)(p->n_micro + l->pp - 1));
  cJSON *own = ownership(g);
  if (!own) {
    cJSON_Delete(root);
    return NULL;
  }
  cJSON_AddItemToObject(root, "ownership", own);
  cJSON_AddItemToObject(root, "activations", activation_table(g, p));
  cJSON_AddItemToObject(root, "memory", memory(p));
  cJSON *warn = cJSON_AddArrayToObject(root, "warnings");
  mc_rank_classes cls;
  if (mc_plan_classes(p, &cls) != 0) {
    cJSON_Delete(root);
    return NULL;
  }
  for (int i = 0; i < cls.n; i++) {
    char msg[512];
    if (mc_plan_class_warning(p, &cls.c[i], msg, sizeof msg)) cJSON_AddItemToArray(warn, cJSON_CreateString(msg));
  }
  mc_plan_classes_free(&cls);
  cJSON *fl = cJSON_AddObjectToObject(root, "flops");
  cJSON_AddNumberToObject(fl, "per_token", p->flops_per_token);
  cJSON_AddNumberToObject(fl, "forward_per_token", p->flops_per_token / 3.0);
  cJSON_AddNumberToObject(fl, "per_step", p->flops_per_step);
  cJSON_AddStringToObject(fl, "recompute", mc_recompute_name(p->recompute));
  cJSON_AddNumberToObject(fl, "recompute_per_token", p->recompute_flops_per_token);
  cJSON_AddNumberToObject(fl, "hardware_per_token", p->hw_flops_per_token);
  cJSON_AddNumberToObject(fl, "hardware_per_step", p->hw_flops_per_step);
  return root;
}
