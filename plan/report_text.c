/* The human-readable mcplan report. */
#include <stdlib.h>
#include <string.h>

#include "core/cost.h"
#include "plan/owners.h"
#include "plan/report.h"
#include "plan/units.h"
#include "util/error.h"

#define LIST_CAP 256

typedef int (*group_fn)(const mc_layout *, int, int *);

static void print_header(FILE *out, const mc_geometry *g, const mc_plan *p) {
  const mc_layout *l = &g->layout;
  fprintf(out, "MegaC plan: pattern %s (%d layers), world %d = tp %d x dp %d x pp %d; ep %d, sp %s, zero %d, split %s\n",
          g->model.pattern, g->model.n_layers, g->world, l->tp, l->dp, l->pp, l->ep, l->sp ? "on" : "off",
          l->zero, mc_split_name(l->split));
  fprintf(out, "dtype %s, recompute %s, micro_batch %d, %d micro-batches per step per DP rank, %lld tokens per step\n",
          p->hold.bf16_weights ? "bf16" : "fp32", mc_recompute_name(p->recompute), p->micro_batch, p->n_micro,
          (long long)p->tokens_per_step);
  fprintf(out, "parameters: %lld elements (replicated %lld, tp-sharded %lld, ep-sharded %lld)\n",
          (long long)p->model_elems, (long long)p->model_elems_by_place[MC_PLACE_REPLICATED],
          (long long)p->model_elems_by_place[MC_PLACE_TP], (long long)p->model_elems_by_place[MC_PLACE_EP]);
  fprintf(out, "optimizer groups:");
  for (int k = 0, n = 0; k < MC_N_OPTS; k++)
    if (p->opt_group_fams[k] > 0) fprintf(out, "%s %s %d families", n++ ? "," : "", mc_opt_name(k), p->opt_group_fams[k]);
  fprintf(out, "\n");
}

static void print_rank_map(FILE *out, const mc_geometry *g, int detail_max) {
  static const group_fn fns[5] = {mc_group_tp, mc_group_dp, mc_group_pp, mc_group_ep, mc_group_edp};
  static const char *const names[5] = {"tp", "dp", "pp", "ep", "edp"};
  int *members = malloc(sizeof(int) * (size_t)g->world);
  if (!members) return;
  fprintf(out, "\n== rank map (rank = tp_rank + tp*(dp_rank + dp*pp_rank)) ==\n");
  fprintf(out, "%6s %4s %4s %4s %7s %8s  groups\n", "rank", "pp", "dp", "tp", "ep_rank", "ep_group");
  int shown = g->world <= detail_max ? g->world : detail_max;
  for (int r = 0; r < g->world; r++) {
    if (r >= shown && r != g->world - 1) continue;
    if (r == g->world - 1 && r >= shown)
      fprintf(out, "   ... %d ranks not shown (--detail %d lists them all)\n", g->world - shown - 1, g->world);
    mc_coords c;
    mc_layout_coords(&g->layout, r, &c);
    fprintf(out, "%6d %4d %4d %4d %7d %8d ", r, c.pp_rank, c.dp_rank, c.tp_rank, c.ep_rank, c.ep_group);
    for (int k = 0; k < 5; k++) {
      char buf[LIST_CAP];
      int n = fns[k](&g->layout, r, members);
      mc_format_ranks(members, n, buf, sizeof buf);
      fprintf(out, " %s={%s}", names[k], buf);
    }
    fprintf(out, "\n");
  }
  free(members);
}

static void print_stage_map(FILE *out, const mc_geometry *g, const mc_plan *p) {
  const int pp = g->stages.pp;
  fprintf(out, "\n== stage map (split %s; FLOP/tok = per token, embed/head included; recomp = the forward its layers "
               "run again under train.recompute=%s; per device = one step on one of the stage's dp*tp ranks; memory = the "
               "stage's largest rank; bubble = idle share of the step under 1F1B, %d micro-batches) ==\n",
          mc_split_name(g->layout.split), mc_recompute_name(p->recompute), p->n_micro);
  fprintf(out, "%6s %9s  %-24s %12s %12s %15s %14s %12s %8s\n", "stage", "layers", "blocks", "fwd FLOP/tok",
          "f+b FLOP/tok", "recomp FLOP/tok", "f+b FLOP/dev", "memory", "bubble");
  for (int s = 0; s < pp; s++) {
    char range[32], blocks[MC_MAX_LAYERS + 8], mem[32];
    int f = g->stages.first[s], n = g->stages.count[s];
    snprintf(range, sizeof range, "%d-%d", f, f + n - 1);
    snprintf(blocks, sizeof blocks, "%s%.*s%s", s == 0 ? "embed " : "", n, g->model.pattern + f, s == pp - 1 ? " head" : "");
    fprintf(out, "%6d %9s  %-24s %12.4g %12.4g %15.4g %14.4g %12s %7.1f%%\n", s, range, blocks, g->stages.cost[s],
            g->stages.flops[s], p->stages[s].recompute_flops_per_token, p->stages[s].flops,
            mc_format_bytes(p->stages[s].peak_bytes, mem, sizeof mem),
            100.0 * p->stages[s].bubble);
  }
  if (pp > 1)
    fprintf(out, "1F1B bubble: %.1f%% of all stages' time (equal stages: (pp-1)/(m+pp-1) = %.1f%%)\n", 100.0 * p->bubble,
            100.0 * (pp - 1) / (p->n_micro + pp - 1));
}

static int print_ownership(FILE *out, const mc_geometry *g, int detail_max) {
  fprintf(out, "\n== ownership (mc_shard_of; local = working slice, state = the hyperslab of param and of the "
               "optimizer's states) ==\n");
  const int per_rank = g->world <= detail_max;
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    char rule[128], shape[64] = "[", list[LIST_CAP], ls[96], ss[96];
    mc_placement_rule(g, fi, rule, sizeof rule);
    for (int k = 0; k < f->ndim; k++)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", k ? ", " : "", (long long)f->shape[k]);
    strncat(shape, "]", sizeof shape - strlen(shape) - 1);
    mc_own_table t;
    if (mc_own_table_build(g, fi, &t) != 0) return -1;
    fprintf(out, "%s %s  %s  stage %d  %s  %s%s\n", f->name, shape, rule, t.stage, f->decay ? "decay" : "no-decay",
            mc_opt_name(f->opt), t.moments_match ? "" : "  (optimizer-state hyperslabs differ from the param state!)");
    int shown = 0;
    for (int i = 0; i < t.n; i++) {
      const mc_own_group *gr = &t.groups[i];
      mc_format_slab(gr->ndim, gr->local_start, gr->local_count, ls, sizeof ls);
      if (gr->numel > 0) mc_format_slab(gr->ndim, gr->start, gr->count, ss, sizeof ss);
      else snprintf(ss, sizeof ss, "(none)");
      if (per_rank) {
        for (int j = 0; j < gr->n_ranks; j++)
          fprintf(out, "    r%-5d local %-24s state %-24s %s\n", gr->ranks[j], ls, ss,
                  gr->numel == 0 ? "" : gr->ranks[j] == gr->primary_rank ? "primary" : "replica");
        continue;
      }
      if (shown++ >= detail_max) continue;
      mc_format_ranks(gr->ranks, gr->n_ranks, list, sizeof list);
      fprintf(out, "    ranks {%s}  local %s  state %s", list, ls, ss);
      if (gr->numel > 0) fprintf(out, "  primary r%d, %d cop%s\n", gr->primary_rank, gr->n_ranks, gr->n_ranks == 1 ? "y" : "ies");
      else fprintf(out, "\n");
    }
    if (!per_rank && t.n > detail_max) fprintf(out, "    ... %d more distinct shards\n", t.n - detail_max);
    mc_own_table_free(&t);
  }
  return 0;
}

static void print_activation_table(FILE *out, const mc_geometry *g, const mc_plan *p) {
  static const mc_recompute pols[3] = {MC_RECOMPUTE_NONE, MC_RECOMPUTE_SELECTIVE, MC_RECOMPUTE_FULL};
  mc_act_shape sh;
  mc_act_shape_of(g, 0, &p->hold, p->micro_batch, &sh);
  fprintf(out, "\n== activations per layer and micro-batch (%lld tokens, %lld residual rows per rank; policy in use: %s) ==\n",
          (long long)sh.n_seq * sh.local.seq_len, (long long)sh.n_seq * sh.T_res, mc_recompute_name(p->recompute));
  fprintf(out, "%-8s %14s %14s %14s\n", "block", "none", "selective", "full");
  for (const char *b = mc_block_letters(); *b; b++) {
    if (!strchr(g->model.pattern, *b)) continue;
    char c[3][32];
    for (int k = 0; k < 3; k++) mc_format_bytes(mc_act_layer_bytes(mc_block_kind_of(*b), &sh, pols[k]), c[k], sizeof c[k]);
    fprintf(out, "%-8c %14s %14s %14s\n", *b, c[0], c[1], c[2]);
  }
  fprintf(out, "network buffers, held once per stage (residual stream, embedding, head and loss, staging rows):");
  for (int s = 0; s < g->layout.pp; s++) {
    char c[32];
    mc_act_shape_of(g, s, &p->hold, p->micro_batch, &sh);
    fprintf(out, "%s stage %d %s", s ? "," : "", s, mc_format_bytes(mc_act_net_bytes(&sh), c, sizeof c));
  }
  fprintf(out, "\n");
}

static void print_class(FILE *out, const mc_plan *p, const mc_rank_class *cl) {
  const mc_plan_rank *r = &p->ranks[cl->ranks[0]];
  char list[LIST_CAP], b1[32], b2[32], b3[32], b4[32], b5[32];
  mc_format_ranks(cl->ranks, cl->n_ranks, list, sizeof list);
  double pct = 100.0 * (double)r->headroom / (double)p->opts.device_mem;
  fprintf(out, "ranks {%s} (stage %d): total %s, headroom %s (%.1f%%)\n", list, r->stage,
          mc_format_bytes(r->total, b1, sizeof b1), mc_format_bytes(r->headroom, b2, sizeof b2), pct);
  for (int c = 0; c < MC_MEM_COUNT; c++) {
    fprintf(out, "    %-36s %12s", mc_mem_cat_desc((mc_mem_cat)c), mc_format_bytes(r->bytes[c], b1, sizeof b1));
    if (c == MC_MEM_ACTIVATIONS)
      fprintf(out, "   %d in flight x %s + %s recompute working set + %s gradient scratch + %s network buffers",
              r->act.inflight, mc_format_bytes(r->act.per_micro, b2, sizeof b2),
              mc_format_bytes(r->act.transient, b3, sizeof b3), mc_format_bytes(r->act.scratch, b4, sizeof b4),
              mc_format_bytes(r->act.network, b5, sizeof b5));
    if (c == MC_MEM_MOE_SCRATCH && r->act.moe_scratch > 0)
      fprintf(out, "   %lld rows per exchange (routing bound; %lld balanced): E layers' kept rows %s, exchange buffers %s",
              (long long)r->act.moe_assignments, (long long)r->act.moe_balanced,
              mc_format_bytes(r->act.moe_layers, b2, sizeof b2), mc_format_bytes(r->act.moe_exchange, b3, sizeof b3));
    fprintf(out, "\n");
  }
  fprintf(out, "    %-36s %12s (decay) %s (no-decay)\n", "optimizer state by group",
          mc_format_bytes(mc_plan_optimizer_bytes(r, 1), b1, sizeof b1),
          mc_format_bytes(mc_plan_optimizer_bytes(r, 0), b2, sizeof b2));
  fprintf(out, "    %-36s", "optimizer states by optimizer");
  for (int k = 0, n = 0; k < MC_N_OPTS; k++)
    if (p->opt_group_fams[k] > 0)
      fprintf(out, n++ ? " %s (%s)" : " %12s (%s)", mc_format_bytes(r->opt_group_bytes[k], b1, sizeof b1), mc_opt_name(k));
  fprintf(out, "\n");
}

static void print_memory(FILE *out, const mc_plan *p, const mc_rank_classes *cls, int detail_max) {
  char b1[32], b2[32];
  fprintf(out, "\n== memory per device (device %s, runtime reserve %s, allocator overhead %.0f%%, margin %.0f%%) ==\n",
          mc_format_bytes(p->opts.device_mem, b1, sizeof b1), mc_format_bytes(p->opts.reserve, b2, sizeof b2),
          100.0 * p->opts.alloc_overhead, 100.0 * p->opts.margin);
  int peak_class = 0;
  for (int i = 0; i < cls->n; i++)
    for (int j = 0; j < cls->c[i].n_ranks; j++)
      if (cls->c[i].ranks[j] == p->peak_rank) peak_class = i;
  for (int i = 0; i < cls->n; i++)
    if (i < detail_max || i == peak_class) print_class(out, p, &cls->c[i]);
  if (cls->n > detail_max) fprintf(out, "... %d more rank classes not shown (--detail N shows more)\n", cls->n - detail_max);
  fprintf(out, "peak: rank %d, %s\n", p->peak_rank, mc_format_bytes(p->ranks[p->peak_rank].total, b1, sizeof b1));
}

static void print_flops(FILE *out, const mc_geometry *g, const mc_plan *p) {
  fprintf(out, "\n== FLOPs (multiply-add = 2) ==\n");
  fprintf(out, "model FLOPs (3 x forward; MFU is computed from these; recomputation not counted):\n");
  fprintf(out, "  per token:  %.6g  (forward %.6g)\n", p->flops_per_token, p->flops_per_token / 3.0);
  fprintf(out, "  per step:   %.6g  (%lld tokens)\n", p->flops_per_step, (long long)p->tokens_per_step);
  fprintf(out, "hardware FLOPs (forward + backward as run, plus the forward recomputed under train.recompute=%s):\n",
          mc_recompute_name(p->recompute));
  fprintf(out, "  per token:  %.6g  (recomputed forward %.6g)\n", p->hw_flops_per_token, p->recompute_flops_per_token);
  fprintf(out, "  per step:   %.6g\n", p->hw_flops_per_step);
  double worst = 0;
  for (int s = 0; s < g->stages.pp; s++)
    if (mc_plan_stage_hw_step_flops(g, p, s) > worst) worst = mc_plan_stage_hw_step_flops(g, p, s);
  fprintf(out, "  per step per device (busiest stage, split evenly over dp*tp): %.6g\n", worst);
}

static void print_warnings(FILE *out, const mc_plan *p, const mc_rank_classes *cls) {
  char msg[512];
  for (int i = 0; i < cls->n; i++)
    if (mc_plan_class_warning(p, &cls->c[i], msg, sizeof msg)) fprintf(out, "WARNING: %s\n", msg);
}

int mc_plan_print_text(FILE *out, const mc_geometry *g, const mc_plan *p, int detail_max) {
  mc_rank_classes cls;
  if (mc_plan_classes(p, &cls) != 0) return -1;
  print_header(out, g, p);
  print_rank_map(out, g, detail_max);
  print_stage_map(out, g, p);
  if (print_ownership(out, g, detail_max) != 0) {
    mc_plan_classes_free(&cls);
    return -1;
  }
  print_activation_table(out, g, p);
  print_memory(out, p, &cls, detail_max);
  print_flops(out, g, p);
  fprintf(out, "\n");
  print_warnings(out, p, &cls);
  mc_plan_classes_free(&cls);
  return 0;
}
