/* Activation recomputation (train.recompute; train/net.c layer_recompute, core/holdings.h
 * mc_act_buf_kept):
 * - selective and full give bit for bit the losses, aux sums, drop counts and gradients of
 *   none (memcmp of every gradient), over two accumulating micro-batches, for every block kind:
 *   routed MoE (dropless, and with a capacity that drops), the plain SwiGLU E block, fp32 and a
 *   copy of the CPU backend with bf16 weights (bf16 product activations in the working set);
 *   the working set is filled with NaN before every rebuild (MC_RECOMPUTE_POISON=1), so a
 *   buffer the rebuild misses would show; evaluation (forward only) agrees too;
 * - the policies split each layer's buffers: kept + dropped = none's, for every kind under
 *   TP, SP, bf16 products and the plain E block; under ep > 1 full keeps one set of the E
 *   layers' received rows in moe.scratch, the others one per E layer and micro-batch in flight;
 * - memory, on the embedded default configuration (tiny, AEMR, 8 x 64 tokens): for each policy
 *   the activations arena equals mcplan's activation figure (mc_plan_build), and the bytes a
 *   step actually writes in it (the arena filled with a sentinel first, then the words that
 *   changed counted) are within 5% of that figure; the figures are printed. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "plan/plan.h"
#include "tests/train/netcheck.h"

static mc_backend bf16_cpu;
static const mc_recompute POLICIES[3] = {MC_RECOMPUTE_NONE, MC_RECOMPUTE_SELECTIVE, MC_RECOMPUTE_FULL};

/* Two networks, none and policy r, the same micro-batches: everything bitwise equal. */
static void compare(const char *pattern, int E, int k, double cf, mc_backend *be, mc_recompute r, const char *what) {
  mc_model m = nc_model(pattern);
  m.n_experts = E, m.top_k = k, m.capacity_factor = cf;
  mc_geometry geo;
  mc_layout l = nc_layout(1, 1, 1);
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &geo));
  mc_net *ref = mc_net_create_on(&geo, 0, 7, be), *rc = mc_net_create_on(&geo, 0, 7, be);
  CHECK(ref && rc, "%s: networks: %s", what, mc_errmsg());
  if (!ref || !rc) return;
  CHECK_OK(mc_net_reserve(rc, 3)); /* placed under none, then re-placed by the policy */
  CHECK_OK(mc_net_set_recompute(rc, r));
  CHECK(rc->ws && rc->ws_bytes > 0 && rc->ws_poison, "%s: no poisoned working set under %s", what, mc_recompute_name(r));
  int64_t dropped = 0;
  for (int pass = 0; pass < 2; pass++) { /* the second micro-batch accumulates onto the first's gradients */
    int32_t *tok = nc_tokens(&m, 3, 31 + (uint64_t)pass);
    mc_net_stats a, b;
    CHECK_OK(mc_net_forward_backward(ref, tok, 3, 0.05, 0.3, &a));
    CHECK_OK(mc_net_forward_backward(rc, tok, 3, 0.05, 0.3, &b));
    CHECK(a.ce_sum == b.ce_sum && a.aux_sum == b.aux_sum && a.dropped == b.dropped && a.n_tokens == b.n_tokens,
          "%s pass %d: stats differ (ce %.17g vs %.17g, aux %.17g vs %.17g, dropped %lld vs %lld)", what, pass, a.ce_sum,
          b.ce_sum, a.aux_sum, b.aux_sum, (long long)a.dropped, (long long)b.dropped);
    dropped += a.dropped;
    CHECK_OK(mc_net_forward(ref, tok, 3, &a));
    CHECK_OK(mc_net_forward(rc, tok, 3, &b));
    CHECK(a.ce_sum == b.ce_sum && a.aux_sum == b.aux_sum, "%s pass %d: evaluation differs", what, pass);
    free(tok);
  }
  CHECK(cf <= 0 || cf >= 1.25 || dropped > 0, "%s: capacity %.2f dropped nothing", what, cf);
  int differ = 0;
  for (int i = 0; i < mc_net_n_params(ref); i++) {
    const mc_net_param *p = mc_net_param_at(ref, i), *q = mc_net_param_at(rc, i);
    if (memcmp(p->g, q->g, (size_t)p->numel * sizeof(float)) != 0) {
      differ++;
      CHECK(0, "%s: %s: gradients differ", what, geo.fams.f[p->fam].name);
    }
  }
  printf("  %-40s %-9s: %d of %d gradients differ (%lld assignments dropped)\n", what, mc_recompute_name(r), differ,
         mc_net_n_params(ref), (long long)dropped);
  mc_net_free(ref);
  mc_net_free(rc);
  mc_geometry_free(&geo);
}

#define SENTINEL 0x7fa5a5a5u /* a signalling NaN no kernel writes, nor any int32 id of these runs */

/* One step of the default configuration under each policy: the arena, mcplan's figure and the
 * bytes the step wrote. */
static void test_memory(void) {
  mc_config cfg;
  CHECK_OK(mc_config_default(&cfg));
  printf("  default configuration (%s, micro-batch %d x %d tokens), activations per policy:\n", cfg.model.pattern,
         cfg.train.micro_batch, cfg.model.seq_len);
  printf("    %-10s %12s %12s %7s %12s %7s\n", "policy", "mcplan", "arena", "ratio", "written", "ratio");
  int64_t prev = 0;
  for (int pi = 0; pi < 3; pi++) {
    mc_train_cfg t = cfg.train;
    snprintf(t.recompute, sizeof t.recompute, "%s", mc_recompute_name(POLICIES[pi]));
    t.global_batch = t.micro_batch; /* one micro-batch a step */
    mc_geometry g;
    if (mc_geometry_build(&cfg.model, &cfg.parallel, &t, 1, &g)) {
      CHECK(0, "geometry: %s", mc_errmsg());
      return;
    }
    mc_plan_opts po;
    mc_plan_opts_default(&po);
    mc_plan plan;
    CHECK_OK(mc_plan_build(&g, &t, &po, &plan));
    const int64_t planned = plan.ranks[0].bytes[MC_MEM_ACTIVATIONS];
    mc_net *net = mc_net_create(&g, 0, t.seed);
    CHECK(net != NULL, "network: %s", mc_errmsg());
    if (!net) return;
    CHECK_OK(mc_net_set_recompute(net, POLICIES[pi]));
    CHECK_OK(mc_net_reserve(net, t.micro_batch));
    mc_arena *a = &net->arenas.a[MC_MEM_ACTIVATIONS];
    uint32_t *w = (uint32_t *)a->base;
    const int64_t words = a->cap / 4;
    for (int64_t i = 0; i < words; i++) w[i] = SENTINEL;
    int32_t *tok = nc_tokens(&cfg.model, t.micro_batch, 77);
    mc_net_stats st;
    CHECK_OK(mc_net_forward_backward(net, tok, t.micro_batch, 1.0 / (t.micro_batch * cfg.model.seq_len), 1.0 / t.micro_batch, &st));
    int64_t written = 0;
    for (int64_t i = 0; i < words; i++) written += w[i] != SENTINEL;
    written *= 4;
    CHECK(a->cap == planned, "%s: activations arena %lld bytes, mcplan %lld", t.recompute, (long long)a->cap,
          (long long)planned);
    const double ratio = (double)written / (double)planned;
    CHECK(ratio <= 1.0 && ratio >= 0.95, "%s: a step wrote %lld bytes of the %lld mcplan plans (ratio %.3f)", t.recompute,
          (long long)written, (long long)planned, ratio);
    CHECK(pi == 0 || planned < prev, "%s: %lld bytes, not below the previous policy's %lld", t.recompute, (long long)planned,
          (long long)prev);
    printf("    %-10s %12lld %12lld %7.3f %12lld %7.3f   (per micro-batch %lld, working set %lld, scratch %lld, network %lld)\n",
           t.recompute, (long long)planned, (long long)a->cap, (double)a->cap / (double)planned, (long long)written, ratio,
           (long long)plan.ranks[0].act.per_micro, (long long)plan.ranks[0].act.transient,
           (long long)plan.ranks[0].act.scratch, (long long)plan.ranks[0].act.network);
    prev = planned;
    free(tok);
    mc_net_free(net);
    mc_plan_free(&plan);
    mc_geometry_free(&g);
  }
}

/* The one definition (mc_act_buf_kept) splits each layer's buffers: kept + dropped = none's,
 * for every kind and shape of the grid (routed and plain E, bf16 products, TP, SP). */
static void test_split(void) {
  mc_model m = nc_model("AEMR");
  int n = 0;
  for (int tp = 1; tp <= 2; tp++)
    for (int sp = 0; sp <= tp - 1; sp++)
      for (int act16 = 0; act16 <= 1; act16++) /* bf16 products under every layout */
        for (int dense = 0; dense <= 1; dense++) {
          mc_model mm = m;
          if (dense) mm.n_experts = 1, mm.top_k = 1;
          mc_layout l = nc_layout(tp, 1, 1);
          l.sp = sp;
          mc_geometry g;
          if (mc_geometry_build(&mm, &l, NULL, -1, &g)) {
            CHECK(0, "geometry tp=%d sp=%d: %s", tp, sp, mc_errmsg());
            continue;
          }
          mc_hold_opts o = {.bf16_weights = act16, .act16 = act16, .micro_batch = 2, .n_micro = 1, .moe_dense = 1};
          mc_act_shape sh;
          mc_act_shape_of(&g, 0, &o, 2, &sh);
          for (const char *c = mc_block_letters(); *c; c++) {
            const mc_block_kind *k = mc_block_kind_of(*c);
            const int64_t all = mc_act_layer_bytes(k, &sh, MC_RECOMPUTE_NONE);
            CHECK(mc_act_layer_dropped_bytes(k, &sh, MC_RECOMPUTE_NONE) == 0, "%c: none drops something", *c);
            for (int pi = 1; pi < 3; pi++) {
              const int64_t kept = mc_act_layer_bytes(k, &sh, POLICIES[pi]), drop = mc_act_layer_dropped_bytes(k, &sh, POLICIES[pi]);
              CHECK(kept + drop == all && drop > 0, "%c tp=%d sp=%d act16=%d dense=%d %s: kept %lld + dropped %lld != %lld", *c, tp,
                    sp, act16, dense, mc_recompute_name(POLICIES[pi]), (long long)kept, (long long)drop, (long long)all);
              n++;
            }
          }
          mc_geometry_free(&g);
        }
  printf("  kept + dropped = none for %d (kind, shape, policy) cases\n", n);
}

/* Under ep > 1 the E layers' received rows (moe.scratch) are kept per E layer and micro-batch
 * in flight, except under full recomputation: one set, which the layers rebuild in turn. */
static void test_moe_scratch(void) {
  mc_model m = nc_model("AEMEAEMR");
  mc_layout l = nc_layout(1, 2, 2);
  l.pp = 2;
  mc_train_cfg t;
  memset(&t, 0, sizeof t);
  snprintf(t.dtype, sizeof t.dtype, "fp32");
  t.micro_batch = 1, t.global_batch = 8; /* 4 micro-batches per DP rank: 2 in flight on stage 0 */
  mc_geometry g;
  if (mc_geometry_build(&m, &l, &t, -1, &g)) {
    CHECK(0, "geometry: %s", mc_errmsg());
    return;
  }
  int64_t set = 0;
  for (int pi = 0; pi < 3; pi++) {
    snprintf(t.recompute, sizeof t.recompute, "%s", mc_recompute_name(POLICIES[pi]));
    mc_hold_opts o;
    mc_stage_hold h;
    CHECK_OK(mc_hold_opts_of(&g, &t, &o) || mc_stage_hold_of(&g, 0, &o, &h));
    if (pi == 0) set = h.moe_layers / (h.inflight * 2); /* stage 0 (AEME) holds 2 E layers */
    const int64_t want = pi == 2 ? set : set * h.inflight * 2;
    CHECK(h.inflight == 2 && set > 0 && h.moe_layers == want && h.moe_scratch == h.moe_layers + h.moe_exchange,
          "%s: moe.scratch kept rows %lld, expected %lld (one set %lld, %d in flight)", t.recompute, (long long)h.moe_layers,
          (long long)want, (long long)set, h.inflight);
    printf("  pp2 x dp2 x ep2, stage 0 (2 E layers, 2 micro-batches in flight), %-9s: moe.scratch kept rows %lld bytes\n",
           t.recompute, (long long)h.moe_layers);
  }
  mc_geometry_free(&g);
}

int main(void) {
  test_split();
  test_moe_scratch();
  setenv("MC_RECOMPUTE_POISON", "1", 1);
  bf16_cpu = *mc_backend_cpu();
  bf16_cpu.bf16_weights = 1;
  for (int pi = 1; pi < 3; pi++) {
    const mc_recompute r = POLICIES[pi];
    compare("AEMR", 4, 2, 0.0, mc_backend_cpu(), r, "AEMR, E=4 top-2 dropless, fp32");
    compare("AEMRAEMR", 4, 2, 0.5, mc_backend_cpu(), r, "AEMRAEMR, E=4 top-2 capacity 0.5, fp32");
    compare("RMAE", 1, 1, 0.0, mc_backend_cpu(), r, "RMAE, plain SwiGLU E, fp32");
    compare("AEMR", 4, 2, 0.0, &bf16_cpu, r, "AEMR, E=4 top-2, bf16 weights");
    compare("MEAR", 1, 1, 0.0, &bf16_cpu, r, "MEAR, plain SwiGLU E, bf16 weights");
  }
  test_memory();
  return mc_check_exit("test_recompute");
}
