/* The memory planner: category totals agree with the ownership function over a grid of
 * layouts, and each category reacts to tp, zero, dtype, recompute, sp and pp as documented
 * in docs/mcplan.md. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/cost.h"
#include "core/recompute.h"
#include "plan/owners.h"
#include "plan/plan.h"
#include "plan/report.h"
#include "plan/units.h"

/* The tiny reference model (docs/design.md section 7) with two of each block. */
static void tiny_model(mc_model *m) {
  memset(m, 0, sizeof *m);
  strcpy(m->pattern, "AEMRAEMR");
  m->n_layers = 8;
  m->vocab_size = 256, m->vocab_pad = 128, m->d_model = 64;
  m->n_heads = 4, m->n_kv_heads = 4, m->head_dim = 16;
  m->n_experts = 4, m->top_k = 2, m->expert_hidden = 128;
  m->mamba_inner = 128, m->mamba_head_dim = 32, m->ssm_state = 16, m->conv_width = 4;
  m->rec_width = 64, m->seq_len = 64;
  m->rope_theta = 10000, m->norm_eps = 1e-5, m->init_std = 0.02;
}

static void base_train(mc_train_cfg *t) {
  memset(t, 0, sizeof *t);
  t->global_batch = 16, t->micro_batch = 2;
  strcpy(t->recompute, "none");
  strcpy(t->dtype, "fp32");
  strcpy(t->device, "cuda");
  strcpy(t->optim.groups, "adamw:all");
}

static mc_layout layout(int tp, int dp, int pp, int ep, int sp, int zero) {
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = tp, l.dp = dp, l.pp = pp, l.ep = ep, l.sp = sp, l.zero = zero;
  l.split = MC_SPLIT_EQUAL;
  return l;
}

/* Builds geometry and plan; returns 0 on success. */
static int make_plan(const mc_model *m, mc_layout l, const mc_train_cfg *t, mc_geometry *g, mc_plan *p) {
  mc_plan_opts o;
  mc_plan_opts_default(&o);
  if (mc_geometry_build(m, &l, t, -1, g) != 0) return -1;
  if (mc_plan_build(g, t, &o, p) != 0) {
    mc_geometry_free(g);
    return -1;
  }
  return 0;
}

static void drop(mc_geometry *g, mc_plan *p) {
  mc_plan_free(p);
  mc_geometry_free(g);
}

/* Sum over primaries of every state = each family's elements times the number of state kinds
 * its optimizer keeps; every rank's category bytes equal an independent sum over its
 * mc_shard_of hyperslabs; each optimizer group's state bytes equal the sum of the holdings
 * (mc_param_hold_of) of its families, and the groups together the optimizer.moments
 * categories. Under AdamW only and with Muon for the matrices. */
static void test_totals_grid(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  t.global_batch = 48;
  int cases = 0, muon_cases = 0;
  static const int zeros[] = {0, 1, 3};
  static const char *const groups[2] = {"adamw:all", "muon:matrices,adamw:all"};
  for (int tp = 1; tp <= 4; tp *= 2)
    for (int dp = 1; dp <= 3; dp++)
      for (int pp = 1; pp <= 2; pp++)
        for (int ep = 1; ep <= 4; ep *= 2)
          for (int zi = 0; zi < 3; zi++)
            for (int bf = 0; bf < 4; bf++) {
              if ((tp * dp) % ep) continue;
              int sp = tp > 1 && ep > 1;
              strcpy(t.dtype, bf & 1 ? "bf16" : "fp32");
              strcpy(t.optim.groups, groups[bf >> 1]);
              mc_geometry g;
              mc_plan p;
              mc_layout l = layout(tp, dp, pp, ep, sp, zeros[zi]);
              if (make_plan(&m, l, &t, &g, &p) != 0) {
                CHECK(0, "tp=%d dp=%d pp=%d ep=%d zero=%d: %s", tp, dp, pp, ep, zeros[zi], mc_errmsg());
                continue;
              }
              cases++;
              int64_t prim = 0, want_prim = 0;
              int n_muon = 0;
              for (int r = 0; r < p.world; r++)
                for (int s = 0; s < MC_N_STATES; s++) prim += p.ranks[r].primary_elems[s];
              for (int fi = 0; fi < g.fams.n; fi++) {
                n_muon += g.fams.f[fi].opt == MC_OPT_MUON;
                for (int s = 0; s < MC_N_STATES; s++)
                  want_prim += !mc_family_has_state(&g.fams.f[fi], (mc_state)s) ? 0
                               : mc_state_is_scalar((mc_state)s)                 ? 1 /* AdamW's step */
                                                                                : g.fams.f[fi].numel;
              }
              muon_cases += n_muon > 0;
              CHECK((bf >> 1) == (n_muon > 0), "groups %s: %d Muon families", t.optim.groups, n_muon);
              CHECK(prim == want_prim, "tp=%d dp=%d pp=%d ep=%d zero=%d %s: primary elements %lld != %lld", tp, dp, pp, ep,
                    zeros[zi], t.optim.groups, (long long)prim, (long long)want_prim);
              CHECK(p.opt_group_fams[MC_OPT_MUON] == n_muon && p.opt_group_fams[MC_OPT_ADAMW] == g.fams.n - n_muon,
                    "families per optimizer %d + %d", p.opt_group_fams[MC_OPT_ADAMW], p.opt_group_fams[MC_OPT_MUON]);
              /* Recount rank 0 and the last rank from mc_shard_of directly. */
              int probe[2] = {0, p.world - 1};
              for (int k = 0; k < 2; k++) {
                int r = probe[k];
                int64_t bytes[3] = {0, 0, 0}, mom = 0, master = 0, group[MC_N_OPTS] = {0}, held[MC_N_OPTS] = {0};
                for (int fi = 0; fi < g.fams.n; fi++) {
                  const mc_family *fa = &g.fams.f[fi];
                  mc_shard s;
                  mc_shard_of(&g, fi, MC_STATE_PARAM, r, &s);
                  if (!s.in_stage) continue;
                  int64_t local = 1;
                  for (int d = 0; d < s.ndim; d++) local *= s.local_count[d];
                  /* each tensor at its footprint in its category's allocation; bf16 matrix
                   * weights are resident in bf16 beside an fp32 master at ZeRO 0/1, while ZeRO
                   * 3 keeps the fp32 shard (its own master) and rounds each gathered slice */
                  const int resident16 = (bf & 1) && mc_role_is_matmul(fa->role) && zeros[zi] != 3;
                  bytes[fa->place] += mc_mem_footprint((zeros[zi] == 3 ? s.numel : local) * (resident16 ? 2 : 4));
                  master += resident16 ? mc_mem_footprint(s.numel * 4) : 0;
                  /* AdamW keeps two moments, Muon one momentum, each shaped like the param state */
                  const mc_state kinds[3] = {MC_STATE_EXP_AVG, MC_STATE_EXP_AVG_SQ, MC_STATE_MOMENTUM};
                  for (int q = 0; q < 3; q++) {
                    if ((fa->opt == MC_OPT_MUON) != (kinds[q] == MC_STATE_MOMENTUM)) continue;
                    mc_shard_of(&g, fi, kinds[q], r, &s);
                    mom += mc_mem_footprint(s.numel * 4);
                    group[fa->opt] += mc_mem_footprint(s.numel * 4);
                  }
                  /* the same from the holdings the planner reads */
                  mc_param_hold h;
                  CHECK_OK(mc_param_hold_of(&g, fi, r, &p.hold, &h));
                  for (int q = 1; q < MC_N_STATES; q++) /* AdamW's step is host memory: in no category */
                    if (mc_family_has_state(fa, (mc_state)q) && mc_state_is_scalar((mc_state)q))
                      CHECK(h.state_bytes[q] == 8 * h.shard.held, "%s step: %lld bytes", fa->name, (long long)h.state_bytes[q]);
                    else if (mc_family_has_state(fa, (mc_state)q)) held[fa->opt] += mc_mem_footprint(h.state_bytes[q]);
                    else CHECK(h.state_bytes[q] == 0, "%s holds %s bytes under %s", fa->name, mc_state_name((mc_state)q),
                               mc_opt_name(fa->opt));
                }
                const mc_plan_rank *pr = &p.ranks[r];
                for (int o = 0; o < MC_N_OPTS; o++)
                  CHECK(pr->opt_group_bytes[o] == group[o] && pr->opt_group_bytes[o] == held[o],
                        "rank %d %s group bytes %lld, hyperslabs %lld, holdings %lld (%s)", r, mc_opt_name(o),
                        (long long)pr->opt_group_bytes[o], (long long)group[o], (long long)held[o], t.optim.groups);
                CHECK(pr->opt_group_bytes[MC_OPT_ADAMW] + pr->opt_group_bytes[MC_OPT_MUON] ==
                          pr->bytes[MC_MEM_MOMENTS_DECAY] + pr->bytes[MC_MEM_MOMENTS_NO_DECAY],
                      "rank %d: the groups' state bytes are the optimizer.moments categories", r);
                CHECK(n_muon == 0 || r != 0 || pr->opt_group_bytes[MC_OPT_MUON] > 0, "rank 0 holds Muon momentum");
                CHECK(pr->bytes[MC_MEM_PARAMS_REPLICATED] == bytes[MC_PLACE_REPLICATED], "replicated params rank %d", r);
                CHECK(pr->bytes[MC_MEM_PARAMS_TP] == bytes[MC_PLACE_TP], "tp params rank %d", r);
                CHECK(pr->bytes[MC_MEM_PARAMS_EP] == bytes[MC_PLACE_EP], "ep params rank %d", r);
                CHECK(pr->bytes[MC_MEM_MOMENTS_DECAY] + pr->bytes[MC_MEM_MOMENTS_NO_DECAY] == mom, "moments rank %d", r);
                CHECK(pr->bytes[MC_MEM_MASTER_DECAY] + pr->bytes[MC_MEM_MASTER_NO_DECAY] == master,
                      "master rank %d (bf16=%d)", r, bf);
                int64_t sum = 0;
                for (int c = 0; c < MC_MEM_COUNT; c++) sum += pr->bytes[c];
                CHECK(sum == pr->total, "total is the sum of the categories");
              }
              drop(&g, &p);
            }
  CHECK(cases >= 200 && muon_cases * 2 == cases, "grid covered %d layouts, %d with Muon", cases, muon_cases);
}

static int64_t rank_bytes(const mc_plan *p, int r, mc_mem_cat c) { return p->ranks[r].bytes[c]; }

static void test_tp_halves(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  mc_geometry g1, g2;
  mc_plan p1, p2;
  CHECK_OK(make_plan(&m, layout(1, 1, 1, 1, 0, 0), &t, &g1, &p1));
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 1, 0, 0), &t, &g2, &p2));
  /* every TP-sharded family at half its elements (each tensor at its footprint) */
  int64_t half = 0, whole = 0;
  for (int f = 0; f < g1.fams.n; f++)
    if (g1.fams.f[f].place == MC_PLACE_TP)
      half += mc_mem_footprint(g1.fams.f[f].numel / 2 * 4), whole += mc_mem_footprint(g1.fams.f[f].numel * 4);
  CHECK(rank_bytes(&p1, 0, MC_MEM_PARAMS_TP) == whole, "tp=1 holds every TP-sharded family whole");
  for (int r = 0; r < 2; r++) {
    CHECK(rank_bytes(&p2, r, MC_MEM_PARAMS_TP) == half, "tp=2 rank %d TP-sharded %lld vs half of each family %lld", r,
          (long long)rank_bytes(&p2, r, MC_MEM_PARAMS_TP), (long long)half);
    CHECK(rank_bytes(&p2, r, MC_MEM_PARAMS_REPLICATED) == rank_bytes(&p1, 0, MC_MEM_PARAMS_REPLICATED),
          "replicated params do not change with tp");
    CHECK(rank_bytes(&p2, r, MC_MEM_PARAMS_EP) == rank_bytes(&p1, 0, MC_MEM_PARAMS_EP),
          "experts are never TP-split");
  }
  drop(&g1, &p1);
  drop(&g2, &p2);
}

static void test_zero_shards_optimizer(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  strcpy(t.dtype, "bf16");
  const int dp = 4;
  mc_geometry g0, g1;
  mc_plan p0, p1;
  CHECK_OK(make_plan(&m, layout(1, dp, 1, 1, 0, 0), &t, &g0, &p0));
  CHECK_OK(make_plan(&m, layout(1, dp, 1, 1, 0, 1), &t, &g1, &p1));
  /* the optimizer states: replicated at zero=0, sharded at zero=1 (their elements tile the
   * replicated copy; bytes are per-tensor footprints, so compared as fewer) */
  const mc_mem_cat opt[4] = {MC_MEM_MASTER_DECAY, MC_MEM_MASTER_NO_DECAY, MC_MEM_MOMENTS_DECAY, MC_MEM_MOMENTS_NO_DECAY};
  for (int k = 0; k < 4; k++)
    for (int r = 0; r < dp; r++) {
      CHECK(rank_bytes(&p0, r, opt[k]) == rank_bytes(&p0, 0, opt[k]), "zero=0 replicates %s", mc_mem_cat_name(opt[k]));
      CHECK(rank_bytes(&p1, r, opt[k]) < rank_bytes(&p0, r, opt[k]) || rank_bytes(&p0, r, opt[k]) == 0, "zero=1 shards %s",
            mc_mem_cat_name(opt[k]));
    }
  for (int st = 0; st < MC_N_STATES; st++) {
    int64_t sum = 0;
    /* AdamW only: every family has param and the two moments, none a momentum; its step (one
     * element) is held whole by every rank holding part of the family, so the sharded ranks'
     * sum exceeds the replicated copy there, while the primaries give one per family */
    const int64_t want = st == MC_STATE_MOMENTUM ? 0 : st == MC_STATE_STEP ? g0.fams.n : p0.model_elems;
    int64_t primaries = 0;
    for (int r = 0; r < dp; r++) sum += p1.ranks[r].state_elems[st], primaries += p1.ranks[r].primary_elems[st];
    CHECK(primaries == want && p0.ranks[0].state_elems[st] == want && (sum == want || (st == MC_STATE_STEP && sum > want)),
          "%s: zero=1 shards hold %lld elements (%lld primary), zero=0 %lld", mc_state_name((mc_state)st), (long long)sum,
          (long long)primaries, (long long)p0.ranks[0].state_elems[st]);
  }
  /* The dp members of zero=1 hold a quarter each here (every row count divides by 4). */
  CHECK(4 * p1.ranks[1].state_elems[MC_STATE_EXP_AVG] == p0.ranks[1].state_elems[MC_STATE_EXP_AVG], "moments / dp");
  for (int r = 0; r < dp; r++) {
    CHECK(rank_bytes(&p1, r, MC_MEM_PARAMS_TP) == rank_bytes(&p0, r, MC_MEM_PARAMS_TP), "zero=1 keeps working params");
    CHECK(rank_bytes(&p1, r, MC_MEM_GRADS) == rank_bytes(&p0, r, MC_MEM_GRADS), "zero=1 keeps full gradients");
  }
  /* zero=3 shards the working params and gradients too, and adds the gather buffers. */
  mc_geometry g3;
  mc_plan p3;
  CHECK_OK(make_plan(&m, layout(1, dp, 1, 1, 0, 3), &t, &g3, &p3));
  int64_t work = 0;
  for (int r = 0; r < dp; r++) work += p3.ranks[r].working_elems;
  CHECK(work == p0.ranks[0].working_elems && work == p0.model_elems, "zero=3 working params tile the full set");
  CHECK(rank_bytes(&p3, 0, MC_MEM_ZERO3_BUFFERS) > 0 && rank_bytes(&p0, 0, MC_MEM_ZERO3_BUFFERS) == 0, "zero3 buffers");
  CHECK(rank_bytes(&p3, 0, MC_MEM_GRADS) < rank_bytes(&p0, 0, MC_MEM_GRADS), "zero=3 shards gradients");
  drop(&g0, &p0);
  drop(&g1, &p1);
  drop(&g3, &p3);
}

static void test_dtype(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  mc_geometry g4, g2;
  mc_plan p4, p2;
  CHECK_OK(make_plan(&m, layout(1, 1, 1, 1, 0, 0), &t, &g4, &p4));
  strcpy(t.dtype, "bf16");
  CHECK_OK(make_plan(&m, layout(1, 1, 1, 1, 0, 0), &t, &g2, &p2));
  /* every tensor at its footprint in its category's allocation */
  int64_t params4 = 0, params2 = 0, matmul = 0, want4 = 0, want2 = 0, master2 = 0, moments = 0, grads = 0;
  for (int c = MC_MEM_PARAMS_REPLICATED; c <= MC_MEM_PARAMS_EP; c++)
    params4 += rank_bytes(&p4, 0, (mc_mem_cat)c), params2 += rank_bytes(&p2, 0, (mc_mem_cat)c);
  for (int f = 0; f < g2.fams.n; f++) {
    const int64_t n = g2.fams.f[f].numel;
    const int mm = mc_role_is_matmul(g2.fams.f[f].role);
    matmul += mm ? n : 0;
    want4 += mc_mem_footprint(4 * n), want2 += mc_mem_footprint((mm ? 2 : 4) * n);
    master2 += mm ? mc_mem_footprint(4 * n) : 0;
    moments += 2 * mc_mem_footprint(4 * n), grads += mc_mem_footprint(4 * n);
  }
  CHECK(matmul > 0 && matmul < p2.model_elems, "the tiny model has matrix weights and other params");
  CHECK(params4 == want4 && params2 == want2, "fp32: 4 bytes per param; bf16: 2 bytes per matrix weight, 4 for the rest");
  CHECK(rank_bytes(&p2, 0, MC_MEM_MASTER_DECAY) + rank_bytes(&p2, 0, MC_MEM_MASTER_NO_DECAY) == master2,
        "bf16 keeps an fp32 master of the bf16 matrix weights");
  CHECK(rank_bytes(&p4, 0, MC_MEM_MASTER_DECAY) + rank_bytes(&p4, 0, MC_MEM_MASTER_NO_DECAY) == 0,
        "fp32 working weights are their own master");
  CHECK(rank_bytes(&p4, 0, MC_MEM_MOMENTS_DECAY) + rank_bytes(&p4, 0, MC_MEM_MOMENTS_NO_DECAY) == moments,
        "two fp32 moments");
  CHECK(rank_bytes(&p2, 0, MC_MEM_GRADS) == grads, "fp32 gradients");
  /* bf16 on one rank: the product tensors in bf16, the rest in fp32 */
  CHECK(p2.hold.act16 && !p4.hold.act16, "bf16 on one rank keeps product activations in bf16");
  mc_act_shape s4, s2;
  mc_act_shape_of(&g4, 0, &p4.hold, p4.micro_batch, &s4);
  mc_act_shape_of(&g2, 0, &p2.hold, p2.micro_batch, &s2);
  int64_t fewer = 0;
  for (int i = 0; m.pattern[i]; i++) {
    const mc_block_kind *k = mc_block_kind_of(m.pattern[i]);
    fewer += mc_act_layer_bytes(k, &s4, p4.recompute) - mc_act_layer_bytes(k, &s2, p2.recompute);
  }
  fewer += mc_act_scratch_bytes(m.pattern, &s4) - mc_act_scratch_bytes(m.pattern, &s2);
  fewer += mc_act_net_bytes(&s4) - mc_act_net_bytes(&s2);
  CHECK(fewer > 0 && rank_bytes(&p4, 0, MC_MEM_ACTIVATIONS) - rank_bytes(&p2, 0, MC_MEM_ACTIVATIONS) == fewer,
        "bf16 activations: %lld fewer bytes, expected %lld",
        (long long)(rank_bytes(&p4, 0, MC_MEM_ACTIVATIONS) - rank_bytes(&p2, 0, MC_MEM_ACTIVATIONS)), (long long)fewer);
  /* a bf16 product tensor of n elements takes ceil(n / 2) floats */
  const mc_act_buf *q = &mc_block_kind_of('A')->saved[MC_A_Q];
  CHECK(mc_act_buf_bytes(q, &s2) == (mc_act_buf_numel(q, &s2) + 1) / 2 * 4 && mc_act_buf_bytes(q, &s4) == mc_act_buf_numel(q, &s4) * 4,
        "q: bf16 %lld bytes, fp32 %lld bytes", (long long)mc_act_buf_bytes(q, &s2), (long long)mc_act_buf_bytes(q, &s4));
  drop(&g4, &p4);
  drop(&g2, &p2);
}

static void test_recompute_order(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  static const char *const pol[3] = {"full", "selective", "none"};
  int64_t act[3][2];
  mc_layout ls[2] = {layout(1, 1, 1, 1, 0, 0), layout(2, 2, 2, 2, 1, 1)};
  for (int li = 0; li < 2; li++)
    for (int k = 0; k < 3; k++) {
      strcpy(t.recompute, pol[k]);
      mc_geometry g;
      mc_plan p;
      CHECK_OK(make_plan(&m, ls[li], &t, &g, &p));
      act[k][li] = rank_bytes(&p, 0, MC_MEM_ACTIVATIONS);
      drop(&g, &p);
    }
  for (int li = 0; li < 2; li++)
    CHECK(act[0][li] < act[1][li] && act[1][li] < act[2][li], "layout %d: full %lld < selective %lld < none %lld", li,
          (long long)act[0][li], (long long)act[1][li], (long long)act[2][li]);
  /* Per block too. */
  mc_geometry g;
  mc_plan p;
  CHECK_OK(make_plan(&m, layout(1, 1, 1, 1, 0, 0), &t, &g, &p));
  mc_act_shape sh;
  mc_act_shape_of(&g, 0, &p.hold, 2, &sh);
  for (const char *b = "AEMR"; *b; b++) {
    const mc_block_kind *k = mc_block_kind_of(*b);
    CHECK(mc_act_layer_bytes(k, &sh, MC_RECOMPUTE_FULL) < mc_act_layer_bytes(k, &sh, MC_RECOMPUTE_SELECTIVE) &&
              mc_act_layer_bytes(k, &sh, MC_RECOMPUTE_SELECTIVE) < mc_act_layer_bytes(k, &sh, MC_RECOMPUTE_NONE),
          "block %c ordering", *b);
  }
  drop(&g, &p);
}

/* Builds the plan of m (one rank, or pp stages) under a recompute policy. */
static int plan_policy_ep(const mc_model *m, int pp, int ep, const char *policy, mc_geometry *g, mc_plan *p) {
  mc_train_cfg t;
  base_train(&t);
  strcpy(t.recompute, policy);
  return make_plan(m, layout(1, ep, pp, ep, 0, 0), &t, g, p);
}

static int plan_policy(const mc_model *m, int pp, const char *policy, mc_geometry *g, mc_plan *p) {
  return plan_policy_ep(m, pp, 1, policy, g, p);
}

/* Recomputation's FLOPs (core/recompute.h) as the plan reports them. A model of one block kind
 * against a count by hand, per token and layer (a multiply-add is 2 FLOPs; an RMSNorm 4 per
 * element; the output part is never rerun: the trainer's full rebuild runs the forward with no
 * output, its selective rebuild redoes only what follows the projections; both redo the norm):
 *   A (d 64, q = 4 heads x 16 = 64, kv = 2 heads x 16 = 32, T 64, average context 32.5):
 *     norm 4 d = 256; q, k, v products 2 d q + 2 x 2 d kv = 8192 + 8192 = 16384; attention core
 *     (scores and values) 2 x 2 q 32.5 = 8320; output product 2 q d = 8192.
 *     selective = 256 + 8320 = 8576, full = 256 + 16384 + 8320 = 24960.
 *   R (d 64, rec_width 64): norm 256; x, gate, r, i products 4 x 2 d dr = 32768; gates and
 *     recurrence 12 dr = 768; output 8192. selective = 256 + 768 = 1024, full = 33792.
 *   E plain (1 expert, top 1, hidden 128: the SwiGLU without routing, so no router product):
 *     norm 256; w1 and w3 2 x 2 d F = 32768; SwiGLU 4 F = 512; w2 2 F d = 16384 makes only the
 *     output. selective = 256 + 512 = 768, full = 256 + 32768 + 512 = 33536.
 *   E routed (4 experts, top 2, hidden 128): router 2 d 4 = 512, per choice w1, w3 and w2
 *     2 x (32768 + 16384) = 98304 (w2 writes the kept expert output, so full reruns it, and
 *     only the combine makes the output); SwiGLU 2 x 512 = 1024.
 *     selective = 256 + 1024 = 1280, full = 256 + 512 + 98304 + 1024 = 100096.
 *   E routed with its rows exchanged over EP (ep 2, dp 2): the SwiGLU output lives in
 *     moe.scratch, kept, so selective = 256; full as routed, 100096.
 * Also: none is 0; 0 < selective < full <= forward for every kind of the tiny model (equal for a
 * routed E block: its output part, the combine, is not counted), and the model FLOPs
 * do not move; hardware = forward + backward + recompute, per token, step and stage; the 1F1B
 * estimate runs each stage's backward with its recompute; the JSON fields. */
static void test_recompute_flops(void) {
  static const char *const pol[3] = {"none", "selective", "full"};
  static const struct {
    const char *pattern;
    int n_experts, top_k, routed; /* routed: the E blocks route (-1: no E block) */
    int ep;
    double selective, full;
  } one_kind[] = {
      {"AAAA", 4, 2, -1, 1, 8576, 24960}, {"RR", 4, 2, -1, 1, 1024, 33792},   {"EE", 1, 1, 0, 1, 768, 33536},
      {"EE", 4, 2, 1, 1, 1280, 100096},   {"EE", 4, 2, 1, 2, 256, 100096},
  };
  for (size_t c = 0; c < sizeof one_kind / sizeof one_kind[0]; c++) {
    mc_model m;
    tiny_model(&m);
    m.n_kv_heads = 2;
    strcpy(m.pattern, one_kind[c].pattern);
    m.n_layers = (int)strlen(m.pattern);
    m.n_experts = one_kind[c].n_experts, m.top_k = one_kind[c].top_k;
    for (int k = 0; k < 3; k++) {
      mc_geometry g;
      mc_plan p;
      CHECK_OK(plan_policy_ep(&m, 1, one_kind[c].ep, pol[k], &g, &p));
      if (!p.ranks) continue;
      mc_act_shape sh;
      mc_act_shape_of(&g, 0, &p.hold, p.micro_batch, &sh);
      CHECK(one_kind[c].routed < 0 || sh.routed == one_kind[c].routed, "%s routed %d", m.pattern, sh.routed);
      const double want = m.n_layers * (k == 0 ? 0.0 : k == 1 ? one_kind[c].selective : one_kind[c].full);
      CHECK(p.recompute_flops_per_token == want, "%s %s: recompute %.17g per token, by hand %.17g", m.pattern, pol[k],
            p.recompute_flops_per_token, want);
      drop(&g, &p);
    }
  }

  /* the tiny model, every kind: the order of the policies, per kind and in the plan */
  mc_model m;
  tiny_model(&m);
  for (const char *b = "AEMR"; *b; b++)
    for (int routed = 0; routed < 2; routed++) {
      const double sel = mc_block_recompute_flops(&m, *b, routed, MC_RECOMPUTE_SELECTIVE),
                   full = mc_block_recompute_flops(&m, *b, routed, MC_RECOMPUTE_FULL);
      CHECK(mc_block_recompute_flops(&m, *b, routed, MC_RECOMPUTE_NONE) == 0.0, "%c none", *b);
      CHECK(sel > 0 && full > sel && full <= mc_block_fwd_flops(&m, *b), "%c (routed %d): selective %g, full %g, forward %g",
            *b, routed, sel, full, mc_block_fwd_flops(&m, *b));
    }
  /* rows exchanged over EP: an E layer's selective rebuild is the norm alone (its SwiGLU rows
   * live in moe.scratch, kept); full is unchanged; other kinds do not route */
  {
    const mc_block_kind *ek = mc_block_kind_of('E');
    const double sel1 = mc_block_recompute_flops(&m, 'E', 1, MC_RECOMPUTE_SELECTIVE),
                 sel2 = mc_block_recompute_flops(&m, 'E', MC_ROUTED_EXCHANGED, MC_RECOMPUTE_SELECTIVE);
    CHECK(sel2 == ek->part_flops(&m, MC_PART_NORM, 1), "E exchanged, selective: %g, the norm alone %g", sel2,
          ek->part_flops(&m, MC_PART_NORM, 1));
    CHECK(sel1 - sel2 == ek->part_flops(&m, MC_PART_INNER, 1), "E exchanged, selective: %g less than routed %g", sel2, sel1);
    CHECK(mc_block_recompute_flops(&m, 'E', MC_ROUTED_EXCHANGED, MC_RECOMPUTE_FULL) ==
              mc_block_recompute_flops(&m, 'E', 1, MC_RECOMPUTE_FULL),
          "E exchanged, full");
    for (const char *b = "AMR"; *b; b++)
      CHECK(mc_block_recompute_flops(&m, *b, MC_ROUTED_EXCHANGED, MC_RECOMPUTE_SELECTIVE) ==
                mc_block_recompute_flops(&m, *b, 1, MC_RECOMPUTE_SELECTIVE),
            "%c exchanged", *b);
  }
  double rf[3] = {0}, model[3] = {0};
  for (int k = 0; k < 3; k++) {
    mc_geometry g;
    mc_plan p;
    CHECK_OK(plan_policy(&m, 2, pol[k], &g, &p));
    if (!p.ranks) continue;
    rf[k] = p.recompute_flops_per_token, model[k] = p.flops_per_token;
    CHECK_CLOSE(p.hw_flops_per_token, mc_model_fwd_bwd_flops_per_token(&m) + p.recompute_flops_per_token, 1e-12);
    CHECK_CLOSE(p.hw_flops_per_step, p.hw_flops_per_token * 16 * 64, 1e-12);
    double sum = 0, bwd[2];
    for (int s = 0; s < 2; s++) {
      const mc_plan_stage *st = &p.stages[s];
      sum += st->recompute_flops_per_token;
      CHECK_CLOSE(st->recompute_flops, st->recompute_flops_per_token * 16 * 64, 1e-12);
      CHECK_CLOSE(st->hw_flops, st->flops + st->recompute_flops, 1e-12);
      CHECK_CLOSE(mc_plan_stage_hw_step_flops(&g, &p, s), st->hw_flops, 1e-12);
      bwd[s] = g.stages.bwd[s] + st->recompute_flops_per_token;
    }
    CHECK_CLOSE(sum, p.recompute_flops_per_token, 1e-12);
    CHECK_CLOSE(p.bubble, mc_plan_1f1b(2, p.n_micro, g.stages.cost, bwd, NULL), 1e-12);
    if (k == 2) { /* the JSON fields, under full where they are not 0 */
      cJSON *doc = mc_plan_to_json(&g, &p);
      cJSON *fl = doc ? cJSON_GetObjectItem(doc, "flops") : NULL;
      static const char *const keys[] = {"recompute_per_token", "hardware_per_token", "hardware_per_step"};
      const double vals[] = {p.recompute_flops_per_token, p.hw_flops_per_token, p.hw_flops_per_step};
      for (int i = 0; i < 3; i++) {
        cJSON *v = fl ? cJSON_GetObjectItem(fl, keys[i]) : NULL;
        CHECK(v && v->valuedouble == vals[i], "flops.%s", keys[i]);
      }
      cJSON *pol_name = fl ? cJSON_GetObjectItem(fl, "recompute") : NULL;
      CHECK(pol_name && cJSON_IsString(pol_name) && !strcmp(pol_name->valuestring, "full"), "flops.recompute");
      cJSON *st1 = doc ? cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "stage_map"), 1) : NULL;
      static const char *const skeys[] = {"recompute_flops_per_token", "recompute_flops_per_step_per_device",
                                          "hardware_flops_per_step_per_device"};
      const double svals[] = {p.stages[1].recompute_flops_per_token, p.stages[1].recompute_flops, p.stages[1].hw_flops};
      for (int i = 0; i < 3; i++) {
        cJSON *v = st1 ? cJSON_GetObjectItem(st1, skeys[i]) : NULL;
        CHECK(v && v->valuedouble == svals[i] && svals[i] > 0, "stage_map[1].%s", skeys[i]);
      }
      cJSON_Delete(doc);
    }
    drop(&g, &p);
  }
  CHECK(rf[0] == 0 && rf[1] > 0 && rf[2] > rf[1], "plan recompute: none %g, selective %g, full %g", rf[0], rf[1], rf[2]);
  CHECK(model[0] == model[1] && model[1] == model[2], "model FLOPs do not depend on the policy");
}

static int64_t fp(int64_t bytes) { return mc_mem_footprint(bytes); }

/* The per-layer, scratch and network bytes written out by hand for the tiny model at tp = 2
 * (fp32, three sequences of 64 tokens): what the trainer's block files keep; SP divides the
 * residual rows; the MoE dispatch scratch exists under ep > 1 only. */
static void test_block_formulas(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  t.global_batch = 6, t.micro_batch = 3;
  mc_geometry g;
  mc_plan p;
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 1, 0, 0), &t, &g, &p));
  if (!p.ranks) return;
  mc_act_shape sh;
  mc_act_shape_of(&g, 0, &p.hold, 3, &sh);
  const int64_t tok = 3 * 64, d = 64, dr = 64 / 2, q = 4 * 16 / 2, kv = 4 * 16 / 2, heads = 4 / 2;
  const int64_t x = fp(tok * d * 4), r = fp(tok * 4); /* a row of d, a row of one */
  CHECK(sh.n_seq * sh.local.seq_len == tok && sh.n_seq * sh.T_res == tok && !sh.act16, "shape without sp");
  const mc_block_kind *R = mc_block_kind_of('R'), *A = mc_block_kind_of('A'), *M = mc_block_kind_of('M'),
                      *E = mc_block_kind_of('E');
  CHECK(mc_act_layer_bytes(R, &sh, MC_RECOMPUTE_NONE) == 2 * x + r + 8 * fp(tok * dr * 4), "R none");
  CHECK(mc_act_layer_bytes(R, &sh, MC_RECOMPUTE_SELECTIVE) == x + r + 4 * fp(tok * dr * 4), "R selective");
  CHECK(mc_act_layer_bytes(R, &sh, MC_RECOMPUTE_FULL) == x, "R full");
  CHECK(mc_act_layer_bytes(A, &sh, MC_RECOMPUTE_NONE) == 2 * x + r + 2 * fp(tok * q * 4) + 2 * fp(tok * kv * 4) + fp(tok * heads * 4),
        "A none");
  CHECK(mc_act_layer_bytes(A, &sh, MC_RECOMPUTE_SELECTIVE) == x + r + fp(tok * q * 4) + 2 * fp(tok * kv * 4), "A selective");
  const int64_t di = 128 / 2, hm = 4 / 2, n = 16;
  CHECK(mc_act_layer_bytes(M, &sh, MC_RECOMPUTE_NONE) ==
            2 * x + r + 5 * fp(tok * di * 4) + 4 * fp(tok * n * 4) + 3 * fp(tok * hm * 4),
        "M none");
  CHECK(mc_act_layer_bytes(M, &sh, MC_RECOMPUTE_SELECTIVE) == x + r + 2 * fp(tok * di * 4) + 2 * fp(tok * n * 4) + fp(tok * hm * 4),
        "M selective");
  const int64_t E4 = 4, k = 2, F = 128; /* experts are never TP-split */
  CHECK(mc_act_layer_bytes(E, &sh, MC_RECOMPUTE_NONE) ==
            2 * x + r + 2 * fp(tok * E4 * 4) + fp(tok * k * 4) + fp(3 * E4 * 4) + fp(3 * 4) + 2 * fp(tok * k * d * 4) +
                3 * fp(tok * k * F * 4) + 2 * fp(tok * k * 4) + fp(E4 * 4) + fp(4),
        "E none (routed: 4 experts)");
  /* gradient scratch of A and R: every width is 32, so buffer i is tok x 32 for i < 8 */
  CHECK(mc_act_scratch_bytes("AR", &sh) == 8 * fp(tok * 32 * 4), "scratch of A and R");
  const int64_t vpl = 256 / 2;
  CHECK(mc_act_net_bytes(&sh) == 2 * r + x + x + r + fp(tok * vpl * 4) + 2 * r + 4 * x + fp(tok * vpl * 4) + /* one stage */
                                     2 * r + x + r, /* tp > 1: the embedding lists (shard rows only under sp) */
        "network buffers, tp 2 without sp");
  drop(&g, &p);
  /* SP: the residual rows split over tp */
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 1, 1, 0), &t, &g, &p));
  if (!p.ranks) return;
  mc_act_shape_of(&g, 0, &p.hold, 3, &sh);
  CHECK(sh.n_seq * sh.T_res == tok / 2, "sp splits the sequence over tp");
  CHECK(mc_act_layer_bytes(R, &sh, MC_RECOMPUTE_FULL) == fp(tok / 2 * d * 4), "R full under sp");
  CHECK(p.ranks[0].act.moe_scratch == 0 && p.ranks[0].bytes[MC_MEM_MOE_SCRATCH] == 0, "no dispatch scratch at ep = 1");
  drop(&g, &p);
  /* ep = 2: the dispatch scratch; a capacity factor bounds the assignments */
  m.capacity_factor = 0.5;
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 2, 1, 0), &t, &g, &p));
  if (!p.ranks) return;
  const mc_stage_hold *s = &p.ranks[0].act;
  /* with a capacity factor under SP an E block routes whole gathered sequences: tok x k x cf */
  CHECK(s->moe_assignments == (int64_t)(tok * 2 * 0.5), "assignments with cf=0.5: %lld", (long long)s->moe_assignments);
  /* two E layers (AEMRAEMR): their received rows with the expert activations, and the exchange */
  const int64_t rows_in = s->moe_assignments, ne = 2;
  CHECK(s->moe_layers == ne * rows_in * (64 + 3 * 128) * 4 && s->moe_exchange == rows_in * (2 * 64 + 3 * 128) * 4,
        "EP buffers");
  CHECK(s->moe_scratch == s->moe_layers + s->moe_exchange && s->moe_scratch > 0 &&
            p.ranks[0].bytes[MC_MEM_MOE_SCRATCH] == s->moe_scratch,
        "scratch total");
  drop(&g, &p);
  /* bf16 product tensors (no SP): the rows the expert products read are bf16, the returned
   * rows fp32 (dp 2 x ep 2, no SP: each source routes its 96 tokens, x cf 0.5 per sequence) */
  strcpy(t.dtype, "bf16");
  CHECK_OK(make_plan(&m, layout(1, 2, 1, 2, 0, 0), &t, &g, &p));
  if (!p.ranks) return;
  s = &p.ranks[0].act;
  const int64_t r16 = s->moe_assignments;
  CHECK(r16 > 0 && s->moe_layers == ne * r16 * (64 + 3 * 128) * 2 &&
            s->moe_exchange == r16 * 64 * 4 + r16 * (64 + 3 * 128) * 2,
        "EP buffers under bf16: layers %lld, exchange %lld for %lld rows", (long long)s->moe_layers,
        (long long)s->moe_exchange, (long long)r16);
  drop(&g, &p);
  strcpy(t.dtype, "fp32");
  /* dropless: the buffers hold the most rows routing can send one rank, ep sources x their
   * tokens (the SP shard, 3 x 32) x min(top_k, E/ep) = 2 x 96 x 2, twice the balanced 96 x 2 */
  m.capacity_factor = 0;
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 2, 1, 0), &t, &g, &p));
  if (!p.ranks) return;
  s = &p.ranks[0].act;
  CHECK(s->moe_assignments == 2 * 96 * 2 && s->moe_balanced == 96 * 2, "dropless bound %lld, balanced %lld",
        (long long)s->moe_assignments, (long long)s->moe_balanced);
  drop(&g, &p);
  /* top_k above the experts an owner holds (E = 4, ep = 4: one each): a token sends it one row */
  m.n_experts = 4, m.top_k = 3;
  CHECK_OK(make_plan(&m, layout(2, 2, 1, 4, 1, 0), &t, &g, &p));
  if (!p.ranks) return;
  s = &p.ranks[0].act;
  CHECK(s->moe_assignments == 4 * 96 * 1 && s->moe_balanced == 96 * 3, "bound with top_k > E/ep: %lld",
        (long long)s->moe_assignments);
  drop(&g, &p);
}

static void test_pipeline(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  t.global_batch = 8, t.micro_batch = 2; /* 4 micro-batches */
  mc_geometry g;
  mc_plan p;
  strcpy(m.pattern, "AEMRAEMRAEMR"), m.n_layers = 12;
  CHECK_OK(make_plan(&m, layout(1, 1, 3, 1, 0, 0), &t, &g, &p));
  if (p.ranks) {
    const mc_stage_hold *a0 = &p.ranks[0].act, *a2 = &p.ranks[2].act;
    CHECK(a0->inflight == 3 && p.ranks[1].act.inflight == 2 && a2->inflight == 1, "1F1B in flight %d %d %d",
          a0->inflight, p.ranks[1].act.inflight, a2->inflight);
    CHECK(p.ranks[0].bytes[MC_MEM_ACTIVATIONS] == 3 * a0->per_micro + a0->transient + a0->scratch + a0->network, "stage 0");
    /* the stages hold the same block kinds; the last also holds the final norm, head and loss */
    const int64_t tok = (int64_t)t.micro_batch * m.seq_len, vp = 256;
    CHECK(a2->network - a0->network == fp(tok * m.d_model * 4) + 3 * fp(tok * 4) + 2 * fp(tok * vp * 4),
          "network buffers %lld (stage 0), %lld (last stage)", (long long)a0->network, (long long)a2->network);
    CHECK(p.ranks[1].bytes[MC_MEM_PIPELINE_BUFFERS] > 0, "pp buffers");
    drop(&g, &p);
  }
  t.global_batch = 2; /* one micro-batch: nothing else can be in flight */
  CHECK_OK(make_plan(&m, layout(1, 1, 3, 1, 0, 0), &t, &g, &p));
  if (p.ranks) {
    CHECK(p.ranks[0].act.inflight == 1, "min(pp - s, n_micro) with n_micro=1");
    drop(&g, &p);
  }
  /* Stages without an E layer have no routing scratch (ep > 1). */
  strcpy(m.pattern, "AMRE"), m.n_layers = 4;
  t.global_batch = 8;
  CHECK_OK(make_plan(&m, layout(1, 2, 2, 2, 0, 0), &t, &g, &p));
  if (p.ranks) {
    CHECK(p.ranks[0].bytes[MC_MEM_MOE_SCRATCH] == 0 && p.ranks[2].bytes[MC_MEM_MOE_SCRATCH] > 0, "moe scratch by stage");
    drop(&g, &p);
  }
  /* pp with ep: the saved expert rows are kept per E layer and per micro-batch in flight
   * (stage 0 holds two micro-batches, the last one), the exchange scratch once */
  strcpy(m.pattern, "AEMRAEMR"), m.n_layers = 8;
  CHECK_OK(make_plan(&m, layout(1, 2, 2, 2, 0, 0), &t, &g, &p));
  if (p.ranks) {
    const mc_stage_hold *a0 = &p.ranks[0].act, *a1 = &p.ranks[2].act;
    const int64_t R = a0->moe_assignments;
    CHECK(a0->inflight == 2 && a1->inflight == 1 && R == 2 * 128 * 2 && a1->moe_assignments == R, "pp2 ep2 in flight");
    CHECK(a0->moe_layers == 2 * 1 * R * (64 + 3 * 128) * 4 && a1->moe_layers == 1 * 1 * R * (64 + 3 * 128) * 4 &&
              a0->moe_exchange == a1->moe_exchange && a0->moe_scratch == a0->moe_layers + a0->moe_exchange,
          "EP saved rows per micro-batch in flight: %lld, %lld", (long long)a0->moe_layers, (long long)a1->moe_layers);
    drop(&g, &p);
  }
}

static void test_units(void) {
  int64_t v = 0;
  CHECK(mc_parse_bytes("80GiB", &v) == 0 && v == 80LL << 30, "80GiB");
  CHECK(mc_parse_bytes("80GB", &v) == 0 && v == 80000000000LL, "80GB");
  CHECK(mc_parse_bytes("512 MiB", &v) == 0 && v == 512LL << 20, "512 MiB");
  CHECK(mc_parse_bytes("1.5gib", &v) == 0 && v == 3LL << 29, "1.5gib");
  CHECK(mc_parse_bytes("1000000", &v) == 0 && v == 1000000, "plain bytes");
  CHECK(mc_parse_bytes("7B", &v) == 0 && v == 7, "7B");
  CHECK(mc_parse_bytes("80XB", &v) != 0 && strstr(mc_errmsg(), "unknown unit"), "bad unit: %s", mc_errmsg());
  CHECK(mc_parse_bytes("GiB", &v) != 0, "no number");
  CHECK(mc_parse_bytes("-1GiB", &v) != 0, "negative");
  CHECK(mc_parse_bytes("", &v) != 0, "empty");
  CHECK(mc_parse_bytes("80GiB x", &v) != 0, "trailing text");
  char buf[32];
  CHECK(!strcmp(mc_format_bytes(3LL << 29, buf, sizeof buf), "1.50 GiB"), "format %s", buf);
  CHECK(!strcmp(mc_format_bytes(700, buf, sizeof buf), "700 B"), "format %s", buf);
  int ranks[] = {0, 1, 2, 3, 8, 12, 16, 20, 30};
  mc_format_ranks(ranks, 9, buf, sizeof buf);
  CHECK(!strcmp(buf, "0-3,8,12,..,20,30"), "ranks %s", buf);
}

static void test_groups_and_json(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  mc_geometry g;
  mc_plan p;
  CHECK_OK(make_plan(&m, layout(2, 2, 2, 2, 1, 1), &t, &g, &p));
  if (!p.ranks) return;
  /* Ownership groups: every stage rank appears once; primaries tile each family. */
  for (int fi = 0; fi < g.fams.n; fi++) {
    mc_own_table ot;
    CHECK_OK(mc_own_table_build(&g, fi, &ot));
    int n = 0;
    int64_t prim = 0;
    for (int i = 0; i < ot.n; i++) {
      n += ot.groups[i].n_ranks;
      if (ot.groups[i].primary_rank >= 0) prim += ot.groups[i].numel;
      int among = ot.groups[i].primary_rank < 0; /* the primary is one of the group (docs/ownership.md) */
      for (int k = 0; k < ot.groups[i].n_ranks; k++) among |= ot.groups[i].primary_rank == ot.groups[i].ranks[k];
      CHECK(among, "primary is one of the replicas");
    }
    CHECK(n == 4 && prim == g.fams.f[fi].numel && ot.moments_match, "%s: %d ranks, primaries %lld of %lld",
          g.fams.f[fi].name, n, (long long)prim, (long long)g.fams.f[fi].numel);
    mc_own_table_free(&ot);
  }
  mc_rank_classes cls;
  CHECK_OK(mc_plan_classes(&p, &cls));
  int covered = 0;
  for (int i = 0; i < cls.n; i++) covered += cls.c[i].n_ranks;
  CHECK(covered == p.world && cls.n >= 2 && cls.n < p.world, "%d classes over %d ranks", cls.n, p.world);
  mc_plan_classes_free(&cls);

  cJSON *doc = mc_plan_to_json(&g, &p);
  CHECK(doc != NULL, "json: %s", mc_errmsg());
  char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
  cJSON *back = text ? cJSON_Parse(text) : NULL;
  CHECK(back != NULL, "JSON reparses");
  if (back) {
    static const char *const keys[] = {"layout",    "model",       "train",  "rank_map", "stage_map",
                                       "ownership", "activations", "memory", "flops"};
    for (int k = 0; k < 9; k++) CHECK(cJSON_GetObjectItem(back, keys[k]) != NULL, "key %s", keys[k]);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(back, "rank_map")) == p.world, "rank_map size");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(back, "ownership")) == g.fams.n, "ownership size");
    cJSON *mem = cJSON_GetObjectItem(back, "memory");
    cJSON *ranks = cJSON_GetObjectItem(mem, "ranks");
    CHECK(cJSON_GetArraySize(ranks) == p.world, "memory.ranks size");
    cJSON *r0 = cJSON_GetArrayItem(ranks, 0);
    cJSON *bytes = cJSON_GetObjectItem(r0, "bytes");
    for (int c = 0; c < MC_MEM_COUNT; c++) {
      cJSON *v = cJSON_GetObjectItem(bytes, mc_mem_cat_name((mc_mem_cat)c));
      CHECK(v && (int64_t)v->valuedouble == p.ranks[0].bytes[c], "bytes.%s", mc_mem_cat_name((mc_mem_cat)c));
    }
    cJSON *fl = cJSON_GetObjectItem(back, "flops");
    CHECK(fl && cJSON_GetObjectItem(fl, "per_token")->valuedouble == mc_model_train_flops_per_token(&m), "flops");
    CHECK(cJSON_GetObjectItem(fl, "per_step")->valuedouble == p.flops_per_token * 16 * 64, "flops per step");
  }
  cJSON_Delete(back);
  free(text);
  cJSON_Delete(doc);
  drop(&g, &p);
}

/* The per-rank report of each optimizer group (JSON optimizer_groups, the text line) under
 * Muon for the matrices and AdamW for the rest: the numbers are the plan's, the groups the
 * configuration's, and a Muon family shows as such in the ownership table. */
static void test_optimizer_groups_report(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  strcpy(t.optim.groups, "muon:matrices,adamw:all");
  mc_geometry g;
  mc_plan p;
  CHECK_OK(make_plan(&m, layout(2, 2, 2, 1, 0, 1), &t, &g, &p));
  if (!p.ranks) return;
  cJSON *doc = mc_plan_to_json(&g, &p);
  cJSON *ranks = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "memory"), "ranks");
  CHECK(cJSON_GetArraySize(ranks) == p.world, "memory.ranks");
  for (int r = 0; r < p.world; r++) {
    cJSON *og = cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, r), "optimizer_groups");
    cJSON *a = cJSON_GetObjectItem(og, "adamw"), *mu = cJSON_GetObjectItem(og, "muon");
    CHECK(a && mu && (int64_t)a->valuedouble == p.ranks[r].opt_group_bytes[MC_OPT_ADAMW] &&
              (int64_t)mu->valuedouble == p.ranks[r].opt_group_bytes[MC_OPT_MUON] && mu->valuedouble > 0,
          "rank %d optimizer_groups", r);
  }
  cJSON *tg = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "train"), "optimizer_groups");
  CHECK(tg && cJSON_GetObjectItem(tg, "muon") && cJSON_GetObjectItem(tg, "muon")->valueint == p.opt_group_fams[MC_OPT_MUON] &&
            p.opt_group_fams[MC_OPT_MUON] > 0,
        "train.optimizer_groups");
  int wq = mc_family_find(&g.fams, "layers.00.attn.wq");
  cJSON *own = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "ownership"), wq);
  CHECK(wq >= 0 && own && !strcmp(cJSON_GetObjectItem(own, "optimizer")->valuestring, "muon"), "wq is Muon's");
  cJSON_Delete(doc);
  /* the text report's line, one entry per optimizer */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK_OK(mc_plan_print_text(f, &g, &p, 16));
  fclose(f);
  CHECK(buf && strstr(buf, "optimizer states by optimizer") && strstr(buf, "(muon)") && strstr(buf, "(adamw)") &&
            strstr(buf, "optimizer groups: adamw "),
        "text report lists both groups");
  free(buf);
  drop(&g, &p);
  /* AdamW only: one group, no Muon key */
  strcpy(t.optim.groups, "adamw:all");
  CHECK_OK(make_plan(&m, layout(2, 2, 2, 1, 0, 1), &t, &g, &p));
  doc = mc_plan_to_json(&g, &p);
  cJSON *og = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "memory"), "ranks"), 0),
                                  "optimizer_groups");
  CHECK(og && cJSON_GetArraySize(og) == 1 && cJSON_GetObjectItem(og, "adamw"), "AdamW only: one group");
  cJSON_Delete(doc);
  drop(&g, &p);
}

static void test_headroom(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  mc_geometry g;
  mc_layout l = layout(1, 1, 1, 1, 0, 0);
  CHECK_OK(mc_geometry_build(&m, &l, &t, -1, &g));
  mc_plan_opts o;
  mc_plan_opts_default(&o);
  mc_plan p;
  CHECK_OK(mc_plan_build(&g, &t, &o, &p));
  int64_t need = p.ranks[0].total;
  CHECK(mc_plan_fit(&p, &p.ranks[0]) == MC_FIT_OK && p.n_low_headroom == 0, "fits 80GiB");
  CHECK(p.ranks[0].bytes[MC_MEM_RUNTIME_RESERVE] == mc_plan_default_reserve("cuda"), "cuda reserve");
  mc_plan_free(&p);
  o.device_mem = need + need / 20; /* 5% headroom < 10% margin */
  CHECK_OK(mc_plan_build(&g, &t, &o, &p));
  CHECK(mc_plan_fit(&p, &p.ranks[0]) == MC_FIT_LOW_HEADROOM && p.n_low_headroom == 1 && p.n_no_fit == 0, "low headroom");
  mc_plan_free(&p);
  o.device_mem = need - 1;
  CHECK_OK(mc_plan_build(&g, &t, &o, &p));
  CHECK(mc_plan_fit(&p, &p.ranks[0]) == MC_FIT_NO && p.n_no_fit == 1, "does not fit");
  mc_plan_free(&p);
  strcpy(t.recompute, "some");
  CHECK(mc_plan_build(&g, &t, &o, &p) != 0 && strstr(mc_errmsg(), "train.recompute"), "bad policy named: %s", mc_errmsg());
  mc_geometry_free(&g);
}

/* ------------------------------------------------------------------ stage split and pipeline */

/* The weighted split's definition (core/stages.h), by brute force over every contiguous split
 * of the pattern into pp stages; returns 1 when the map's largest stage FLOPs and memory are
 * the optimum's, and reports whether the memory bound excluded the fastest split. */
static int weighted_is_optimal(const mc_model *m, const mc_layout *l, const mc_stage_map *s, int *bound_binds) {
  const int n = m->n_layers, pp = l->pp;
  /* stage costs of every (stage, first, count), from the per-layer cost model as
   * mc_stage_cost_of documents it: FLOPs of the layers (+ embedding on 0, + head on the last);
   * memory: the layers' state + (pp - s) x their activations (+ embedding state on 0, + head
   * state and logits on the last) */
  static double tf[MC_MAX_STAGES][16][17], tm[MC_MAX_STAGES][16][17];
  double lf[16], ls[16], la[16];
  for (int i = 0; i < n; i++) {
    lf[i] = mc_block_fwd_flops(m, m->pattern[i]) + mc_block_bwd_flops(m, m->pattern[i]);
    ls[i] = mc_block_state_bytes(m, l, m->pattern[i]);
    la[i] = mc_block_act_bytes(m, l, m->pattern[i]);
  }
  for (int st = 0; st < pp; st++)
    for (int f = 0; f < n; f++)
      for (int c = 1; f + c <= n; c++) {
        double t = 0, sb = 0, a = 0;
        for (int i = f; i < f + c; i++) t += lf[i], sb += ls[i], a += la[i];
        tf[st][f][c] = t + (st == 0 ? mc_embed_fwd_flops(m) + mc_embed_bwd_flops(m) : 0) +
                       (st == pp - 1 ? mc_head_fwd_flops(m) + mc_head_bwd_flops(m) : 0);
        tm[st][f][c] = sb + (pp - st) * a + (st == 0 ? mc_embed_state_bytes(m, l) : 0) +
                       (st == pp - 1 ? mc_head_state_bytes(m, l) + mc_head_act_bytes(m, l) : 0);
      }
  /* the stage map's costs are the model's */
  for (int st = 0; st < pp; st++) {
    const int f = s->first[st], c = s->count[st];
    double cf, cm;
    mc_stage_cost_of(m, l, st, f, c, &cf, &cm);
    if (fabs(cf - tf[st][f][c]) > 1e-9 * cf || fabs(cm - tm[st][f][c]) > 1e-9 * cm || cf != s->flops[st] || cm != s->mem[st])
      return 0;
  }
  double m_star = 1e300, f_free = 1e300;
  static double bf[1 << 15], bm[1 << 15];
  for (int mask = 0; mask < (1 << (n - 1)); mask++) {
    bf[mask] = -1;
    if (__builtin_popcount((unsigned)mask) != pp - 1) continue;
    double mf = 0, mm = 0;
    for (int i = 0, st = 0, first = 0; i < n; i++)
      if (i == n - 1 || (mask >> i) & 1) {
        const int c = i + 1 - first;
        mf = tf[st][first][c] > mf ? tf[st][first][c] : mf;
        mm = tm[st][first][c] > mm ? tm[st][first][c] : mm;
        st++, first = i + 1;
      }
    bf[mask] = mf, bm[mask] = mm;
    m_star = mm < m_star ? mm : m_star;
    f_free = mf < f_free ? mf : f_free;
  }
  const double cap = (1 + MC_SPLIT_MEM_SLACK) * m_star * (1 + 1e-12);
  double f_star = 1e300, m2 = 1e300;
  for (int mask = 0; mask < (1 << (n - 1)); mask++)
    if (bf[mask] >= 0 && bm[mask] <= cap && bf[mask] < f_star) f_star = bf[mask];
  for (int mask = 0; mask < (1 << (n - 1)); mask++)
    if (bf[mask] >= 0 && bm[mask] <= cap && bf[mask] <= f_star * (1 + 1e-12) && bm[mask] < m2) m2 = bm[mask];
  double F = 0, M = 0;
  for (int st = 0; st < pp; st++) {
    F = s->flops[st] > F ? s->flops[st] : F;
    M = s->mem[st] > M ? s->mem[st] : M;
  }
  *bound_binds = f_star > f_free * (1 + 1e-9);
  return fabs(F - f_star) <= 1e-9 * f_star && fabs(M - m2) <= 1e-9 * m2;
}

/* Every pattern of up to 8 layers over AMER, pp 2..4, under two layouts (one where states
 * dominate the memory estimate, one where activations do): the weighted split is optimal
 * under its definition, its stage FLOPs add up to the model's, and its stage map's costs are
 * the cost model's. */
static void test_weighted_exhaustive(void) {
  mc_model m;
  tiny_model(&m);
  mc_layout ls[2] = {layout(1, 1, 2, 1, 0, 0), layout(2, 2, 2, 2, 1, 3)};
  const int seqs[2] = {16, 256};
  int cases = 0, bad = 0, binds = 0;
  for (int li = 0; li < 2; li++) {
    m.seq_len = seqs[li];
    ls[li].split = MC_SPLIT_WEIGHTED;
    for (int n = 2; n <= 8 - li; n++) { /* the second layout up to 7 layers: CPU time */
      int total = 1;
      for (int i = 0; i < n; i++) total *= 4;
      for (int code = 0; code < total; code++) {
        for (int i = 0, c = code; i < n; i++, c /= 4) m.pattern[i] = "AMER"[c % 4];
        m.pattern[n] = 0, m.n_layers = n;
        for (int pp = 2; pp <= 4 && pp <= n; pp++) {
          mc_layout l = ls[li];
          l.pp = pp;
          mc_stage_map s;
          if (mc_stage_map_build(&m, &l, &s) != 0) {
            bad++;
            continue;
          }
          int b = 0;
          cases++;
          if (!weighted_is_optimal(&m, &l, &s, &b)) {
            if (bad++ < 5) CHECK(0, "%s pp=%d layout %d: weighted split not optimal", m.pattern, pp, li);
          }
          binds += b;
          double sum = 0;
          for (int st = 0; st < pp; st++) sum += s.flops[st];
          if (fabs(sum - mc_model_fwd_bwd_flops_per_token(&m)) > 1e-12 * sum && bad++ < 5)
            CHECK(0, "%s pp=%d: stage FLOPs add to %.17g, the model's %.17g", m.pattern, pp, sum,
                  mc_model_fwd_bwd_flops_per_token(&m));
        }
      }
    }
  }
  CHECK(bad == 0 && cases > 200000, "%d cases, %d failed", cases, bad);
  CHECK(binds > 0, "the memory bound changes the split in some cases (%d)", binds);
}

/* A hand-written split against the weighted one: the weighted split is no slower than any
 * split within its memory bound, e.g. nam-small's AEMEAEME|AEMR; forward + backward totals. */
static void test_weighted_vs_explicit(void) {
  mc_model m;
  tiny_model(&m);
  strcpy(m.pattern, "AEMEAEMEAEMR"), m.n_layers = 12;
  m.vocab_size = 32768, m.d_model = 1024, m.n_heads = 16, m.n_kv_heads = 4, m.head_dim = 64;
  m.n_experts = 8, m.top_k = 2, m.expert_hidden = 2048, m.mamba_inner = 2048, m.mamba_head_dim = 64;
  m.ssm_state = 64, m.rec_width = 1024, m.seq_len = 2048;
  static const char *const splits[] = {"AEMEAE|MEAEMR", "AEMEAEME|AEMR", "AEME|AEME|AEMR", "AEM|EAEM|EAEM|R", "AEME|AEMR"};
  for (int k = 0; k < 5; k++) {
    if (k == 4) strcpy(m.pattern, "AEMEAEMR"), m.n_layers = 8;
    mc_layout l = layout(1, 1, 1, 1, 0, 0);
    int pipes = 0;
    for (const char *c = splits[k]; *c; c++) pipes += *c == '|';
    l.pp = pipes + 1;
    mc_stage_map w, e;
    l.split = MC_SPLIT_WEIGHTED;
    CHECK_OK(mc_stage_map_build(&m, &l, &w));
    l.split = MC_SPLIT_EXPLICIT;
    strcpy(l.split_pattern, splits[k]);
    CHECK_OK(mc_stage_map_build(&m, &l, &e));
    double wf = 0, wm = 0, ef = 0, em = 0, m_star = 1e300;
    for (int s = 0; s < l.pp; s++) {
      wf = fmax(wf, w.flops[s]), wm = fmax(wm, w.mem[s]), ef = fmax(ef, e.flops[s]), em = fmax(em, e.mem[s]);
    }
    /* the most memory-balanced split's largest stage, from the bound the split keeps */
    mc_layout lm = l;
    lm.split = MC_SPLIT_WEIGHTED;
    (void)lm;
    m_star = wm / (1 + MC_SPLIT_MEM_SLACK);
    if (em <= (1 + MC_SPLIT_MEM_SLACK) * m_star) CHECK(wf <= ef * (1 + 1e-12), "%s: weighted %.6g vs %.6g", splits[k], wf, ef);
    int b;
    CHECK(weighted_is_optimal(&m, &l, &w, &b), "%s: weighted optimal", splits[k]);
    double sw = 0, se = 0, fw = 0;
    for (int s = 0; s < l.pp; s++) sw += w.flops[s], se += e.flops[s], fw += w.cost[s];
    CHECK_CLOSE(sw, mc_model_fwd_bwd_flops_per_token(&m), 1e-12);
    CHECK_CLOSE(se, mc_model_fwd_bwd_flops_per_token(&m), 1e-12);
    CHECK_CLOSE(3 * fw, mc_model_train_flops_per_token(&m), 1e-12);
    /* backward: 2x the forward but for the attention core (2.5x) and the embedding scatter */
    CHECK(sw > 3 * fw, "the attention backward recomputes its scores");
  }
}

/* 1F1B: equal stages idle (pp-1)/(m+pp-1); a heavier stage idles the others. */
static void test_bubble(void) {
  for (int pp = 1; pp <= 8; pp++)
    for (int mb = 1; mb <= 20; mb++) {
      double f[8], b[8], idle[8];
      for (int s = 0; s < pp; s++) f[s] = 1.0, b[s] = 2.0;
      const double all = mc_plan_1f1b(pp, mb, f, b, idle), want = (double)(pp - 1) / (mb + pp - 1);
      CHECK(fabs(all - want) < 1e-12, "pp=%d m=%d: bubble %.6f, formula %.6f", pp, mb, all, want);
      for (int s = 0; s < pp; s++) CHECK(fabs(idle[s] - want) < 1e-12, "pp=%d m=%d stage %d: %.6f", pp, mb, s, idle[s]);
    }
  double f[4] = {1, 1, 2, 1}, b[4] = {2, 2, 4, 2}, idle[4];
  const double all = mc_plan_1f1b(4, 8, f, b, idle);
  CHECK(all > 3.0 / 11 && idle[2] < idle[0] && idle[2] < idle[3], "heavy stage 2: bubble %.3f, idle %.3f %.3f %.3f %.3f",
        all, idle[0], idle[1], idle[2], idle[3]);
  /* the slowest stage sets the pace: step >= m (f + b) of stage 2, so its idle share is the
   * fill and drain only */
  CHECK(idle[2] > 0 && idle[2] < 0.5, "stage 2 idle %.3f", idle[2]);
  /* the plan's per-stage numbers */
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  t.global_batch = 8, t.micro_batch = 2;
  mc_geometry g;
  mc_plan p;
  mc_layout l = layout(1, 2, 2, 1, 0, 0);
  l.split = MC_SPLIT_WEIGHTED;
  CHECK_OK(make_plan(&m, l, &t, &g, &p));
  if (!p.ranks) return;
  double sum = 0;
  for (int s = 0; s < 2; s++) {
    sum += p.stages[s].flops * 2; /* dp = 2 devices a stage */
    CHECK(p.stages[s].peak_rank >= 0 && p.ranks[p.stages[s].peak_rank].stage == s, "peak rank of stage %d", s);
    for (int r = 0; r < p.world; r++)
      if (p.ranks[r].stage == s) CHECK(p.ranks[r].total <= p.stages[s].peak_bytes, "stage %d peak", s);
  }
  CHECK_CLOSE(sum, mc_model_fwd_bwd_flops_per_token(&m) * 8 * 64, 1e-12);
  CHECK(p.bubble > 0 && p.bubble < 1, "bubble %.3f", p.bubble);
  cJSON *doc = mc_plan_to_json(&g, &p);
  cJSON *pipe = doc ? cJSON_GetObjectItem(doc, "pipeline") : NULL;
  CHECK(pipe && fabs(cJSON_GetObjectItem(pipe, "bubble_fraction")->valuedouble - p.bubble) < 1e-15, "pipeline.bubble_fraction");
  cJSON *st = doc ? cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "stage_map"), 1) : NULL;
  CHECK(st && cJSON_GetObjectItem(st, "peak_bytes")->valuedouble == (double)p.stages[1].peak_bytes &&
            cJSON_GetObjectItem(st, "bubble_fraction")->valuedouble == p.stages[1].bubble,
        "stage_map[1] keys");
  cJSON_Delete(doc);
  drop(&g, &p);
}

/* bf16 product tensors: with bf16 weights under every layout */
static void test_act16_rule(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  mc_geometry g;
  mc_plan p;
  const int lays[][3] = {{1, 0, 1}, {2, 0, 1}, {2, 1, 1}, {1, 0, 2}, {2, 1, 2}}; /* tp, sp, ep */
  for (int bf = 0; bf <= 1; bf++)
    for (int i = 0; i < 5; i++) {
      strcpy(t.dtype, bf ? "bf16" : "fp32");
      CHECK_OK(make_plan(&m, layout(lays[i][0], 2, 1, lays[i][2], lays[i][1], 1), &t, &g, &p));
      if (!p.ranks) return;
      CHECK(p.hold.act16 == bf, "act16 for bf16=%d tp=%d sp=%d ep=%d", bf, lays[i][0], lays[i][1], lays[i][2]);
      drop(&g, &p);
    }
  strcpy(t.dtype, "bf16");
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 1, 0, 0), &t, &g, &p));
  if (!p.ranks) return;
  CHECK(p.hold.act16, "bf16 under tp 2 without sp keeps product activations in bf16");
  drop(&g, &p);
  CHECK_OK(make_plan(&m, layout(2, 1, 1, 1, 1, 0), &t, &g, &p));
  if (!p.ranks) return;
  CHECK(p.hold.act16, "bf16 under sp keeps them in bf16 too");
  drop(&g, &p);
}

int main(void) {
  test_act16_rule();
  test_totals_grid();
  test_tp_halves();
  test_zero_shards_optimizer();
  test_dtype();
  test_recompute_order();
  test_recompute_flops();
  test_block_formulas();
  test_pipeline();
  test_units();
  test_groups_and_json();
  test_optimizer_groups_report();
  test_headroom();
  test_weighted_exhaustive();
  test_weighted_vs_explicit();
  test_bubble();
  return mc_check_exit("test_plan");
}
