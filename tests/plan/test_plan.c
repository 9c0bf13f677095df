/* The memory planner: category totals agree with the ownership function over a grid of
 * layouts, and each category reacts to tp, zero, dtype, recompute, sp and pp as documented
 * in docs/mcplan.md. */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/cost.h"
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

/* Sum over primaries of every state = the model's elements times the state count; every
 * rank's category bytes equal an independent sum over its mc_shard_of hyperslabs. */
static void test_totals_grid(void) {
  mc_model m;
  tiny_model(&m);
  mc_train_cfg t;
  base_train(&t);
  t.global_batch = 48;
  int cases = 0;
  static const int zeros[] = {0, 1, 3};
  for (int tp = 1; tp <= 4; tp *= 2)
    for (int dp = 1; dp <= 3; dp++)
      for (int pp = 1; pp <= 2; pp++)
        for (int ep = 1; ep <= 4; ep *= 2)
          for (int zi = 0; zi < 3; zi++)
            for (int bf = 0; bf < 2; bf++) {
              if ((tp * dp) % ep) continue;
              int sp = tp > 1 && ep > 1;
              strcpy(t.dtype, bf ? "bf16" : "fp32");
              mc_geometry g;
              mc_plan p;
              mc_layout l = layout(tp, dp, pp, ep, sp, zeros[zi]);
              if (make_plan(&m, l, &t, &g, &p) != 0) {
                CHECK(0, "tp=%d dp=%d pp=%d ep=%d zero=%d: %s", tp, dp, pp, ep, zeros[zi], mc_errmsg());
                continue;
              }
              cases++;
              int64_t prim = 0;
              for (int r = 0; r < p.world; r++)
                for (int s = 0; s < MC_N_STATES; s++) prim += p.ranks[r].primary_elems[s];
              CHECK(prim * 4 == p.model_elems * 4 * MC_N_STATES,
                    "tp=%d dp=%d pp=%d ep=%d zero=%d: primary bytes %lld != %lld", tp, dp, pp, ep, zeros[zi],
                    (long long)(prim * 4), (long long)(p.model_elems * 4 * MC_N_STATES));
              /* Recount rank 0 and the last rank from mc_shard_of directly. */
              int probe[2] = {0, p.world - 1};
              for (int k = 0; k < 2; k++) {
                int r = probe[k];
                int64_t bytes[3] = {0, 0, 0}, mom = 0, master = 0;
                for (int fi = 0; fi < g.fams.n; fi++) {
                  mc_shard s;
                  mc_shard_of(&g, fi, MC_STATE_PARAM, r, &s);
                  if (!s.in_stage) continue;
                  int64_t local = 1;
                  for (int d = 0; d < s.ndim; d++) local *= s.local_count[d];
                  const int wb = bf && mc_role_is_matmul(g.fams.f[fi].role) ? 2 : 4;
                  bytes[g.fams.f[fi].place] += (zeros[zi] == 3 ? s.numel : local) * wb;
                  master += bf && mc_role_is_matmul(g.fams.f[fi].role) ? s.numel * 4 : 0;
                  mc_shard_of(&g, fi, MC_STATE_EXP_AVG, r, &s);
                  mom += s.numel * 4;
                  mc_shard_of(&g, fi, MC_STATE_EXP_AVG_SQ, r, &s);
                  mom += s.numel * 4;
                }
                const mc_plan_rank *pr = &p.ranks[r];
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
  CHECK(cases >= 100, "grid covered %d layouts", cases);
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
  for (int r = 0; r < 2; r++) {
    CHECK(2 * rank_bytes(&p2, r, MC_MEM_PARAMS_TP) == rank_bytes(&p1, 0, MC_MEM_PARAMS_TP),
          "tp=2 rank %d TP-sharded %lld vs tp=1 %lld", r, (long long)rank_bytes(&p2, r, MC_MEM_PARAMS_TP),
          (long long)rank_bytes(&p1, 0, MC_MEM_PARAMS_TP));
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
  const mc_mem_cat opt[4] = {MC_MEM_MASTER_DECAY, MC_MEM_MASTER_NO_DECAY, MC_MEM_MOMENTS_DECAY, MC_MEM_MOMENTS_NO_DECAY};
  for (int k = 0; k < 4; k++) {
    int64_t sum = 0;
    for (int r = 0; r < dp; r++) {
      sum += rank_bytes(&p1, r, opt[k]);
      CHECK(rank_bytes(&p0, r, opt[k]) == rank_bytes(&p0, 0, opt[k]), "zero=0 replicates %s", mc_mem_cat_name(opt[k]));
    }
    CHECK(sum == rank_bytes(&p0, 0, opt[k]), "%s: zero=1 shards sum to %lld, zero=0 holds %lld",
          mc_mem_cat_name(opt[k]), (long long)sum, (long long)rank_bytes(&p0, 0, opt[k]));
  }
  /* The dp members of zero=1 hold a quarter each here (every row count divides by 4). */
  CHECK(4 * rank_bytes(&p1, 1, MC_MEM_MOMENTS_DECAY) == rank_bytes(&p0, 1, MC_MEM_MOMENTS_DECAY), "moments / dp");
  for (int r = 0; r < dp; r++) {
    CHECK(rank_bytes(&p1, r, MC_MEM_PARAMS_TP) == rank_bytes(&p0, r, MC_MEM_PARAMS_TP), "zero=1 keeps working params");
    CHECK(rank_bytes(&p1, r, MC_MEM_GRADS) == rank_bytes(&p0, r, MC_MEM_GRADS), "zero=1 keeps full gradients");
  }
  /* zero=3 shards the working params and gradients too, and adds the gather buffers. */
  mc_geometry g3;
  mc_plan p3;
  CHECK_OK(make_plan(&m, layout(1, dp, 1, 1, 0, 3), &t, &g3, &p3));
  int64_t work = 0;
  for (int r = 0; r < dp; r++) work += rank_bytes(&p3, r, MC_MEM_PARAMS_TP) + rank_bytes(&p3, r, MC_MEM_PARAMS_EP) +
                                      rank_bytes(&p3, r, MC_MEM_PARAMS_REPLICATED);
  CHECK(work == rank_bytes(&p0, 0, MC_MEM_PARAMS_TP) + rank_bytes(&p0, 0, MC_MEM_PARAMS_EP) +
                    rank_bytes(&p0, 0, MC_MEM_PARAMS_REPLICATED),
        "zero=3 working params tile the full set");
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
  int64_t params4 = 0, params2 = 0, matmul = 0;
  for (int c = MC_MEM_PARAMS_REPLICATED; c <= MC_MEM_PARAMS_EP; c++)
    params4 += rank_bytes(&p4, 0, (mc_mem_cat)c), params2 += rank_bytes(&p2, 0, (mc_mem_cat)c);
  for (int f = 0; f < g2.fams.n; f++) matmul += mc_role_is_matmul(g2.fams.f[f].role) ? g2.fams.f[f].numel : 0;
  CHECK(matmul > 0 && matmul < p2.model_elems, "the tiny model has matrix weights and other params");
  CHECK(params4 == 4 * p4.model_elems && params2 == 2 * matmul + 4 * (p2.model_elems - matmul),
        "fp32: 4 bytes per param; bf16: 2 bytes per matrix weight, 4 for the rest");
  CHECK(rank_bytes(&p2, 0, MC_MEM_MASTER_DECAY) + rank_bytes(&p2, 0, MC_MEM_MASTER_NO_DECAY) == 4 * matmul,
        "bf16 keeps an fp32 master of the bf16 matrix weights");
  CHECK(rank_bytes(&p4, 0, MC_MEM_MASTER_DECAY) + rank_bytes(&p4, 0, MC_MEM_MASTER_NO_DECAY) == 0,
        "fp32 working weights are their own master");
  CHECK(rank_bytes(&p4, 0, MC_MEM_MOMENTS_DECAY) + rank_bytes(&p4, 0, MC_MEM_MOMENTS_NO_DECAY) == 8 * p4.model_elems,
        "two fp32 moments");
  CHECK(rank_bytes(&p2, 0, MC_MEM_GRADS) == 4 * p2.model_elems, "fp32 gradients");
  /* bf16 on one rank: the activations the trainer keeps in bf16 at 2 bytes, the rest at 4 */
  mc_act_shape s4, s2;
  mc_act_shape_of(&m, &g2.layout, p2.micro_batch, 4, &s4);
  s2 = s4;
  s2.pbytes = 2;
  int64_t fewer = 0;
  for (int i = 0; m.pattern[i]; i++)
    fewer += mc_act_block_bytes(&m, &s4, m.pattern[i], p4.recompute) - mc_act_block_bytes(&m, &s2, m.pattern[i], p2.recompute);
  fewer += mc_act_head_bytes(&m, &s4, p4.recompute) - mc_act_head_bytes(&m, &s2, p2.recompute); /* final-norm output */
  fewer += mc_act_working_bytes(&m, &g2.layout, &s4, m.pattern, 1) - mc_act_working_bytes(&m, &g2.layout, &s2, m.pattern, 1);
  CHECK(p2.prod_bytes == 2 && p4.prod_bytes == 4 && fewer > 0, "product-only activations at 2 bytes under bf16");
  CHECK(rank_bytes(&p4, 0, MC_MEM_ACTIVATIONS) - rank_bytes(&p2, 0, MC_MEM_ACTIVATIONS) == fewer,
        "bf16 activations: %lld fewer bytes, expected %lld",
        (long long)(rank_bytes(&p4, 0, MC_MEM_ACTIVATIONS) - rank_bytes(&p2, 0, MC_MEM_ACTIVATIONS)), (long long)fewer);
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
  mc_act_shape sh;
  mc_layout l = layout(1, 1, 1, 1, 0, 0);
  mc_act_shape_of(&m, &l, 2, 2, &sh);
  for (const char *b = "AEMR"; *b; b++)
    CHECK(mc_act_block_bytes(&m, &sh, *b, MC_RECOMPUTE_FULL) < mc_act_block_bytes(&m, &sh, *b, MC_RECOMPUTE_SELECTIVE) &&
              mc_act_block_bytes(&m, &sh, *b, MC_RECOMPUTE_SELECTIVE) < mc_act_block_bytes(&m, &sh, *b, MC_RECOMPUTE_NONE),
          "block %c ordering", *b);
}

/* The R block formula of docs/mcplan.md, evaluated by hand; and SP divides the sequence part. */
static void test_block_formulas(void) {
  mc_model m;
  tiny_model(&m);
  mc_act_shape sh;
  mc_layout l = layout(2, 1, 1, 1, 0, 0);
  mc_act_shape_of(&m, &l, 3, 2, &sh);
  const int64_t tok = 3 * 64, d = 64, dr = 64 / 2;
  CHECK(sh.tokens == tok && sh.tokens_seq == tok, "shape without sp");
  CHECK(mc_act_block_bytes(&m, &sh, 'R', MC_RECOMPUTE_NONE) == tok * (2 * d * 2 + 4) + tok * 6 * dr * 2, "R none");
  CHECK(mc_act_block_bytes(&m, &sh, 'R', MC_RECOMPUTE_SELECTIVE) == tok * (d * 2 + 4) + tok * 4 * dr * 2, "R selective");
  CHECK(mc_act_block_bytes(&m, &sh, 'R', MC_RECOMPUTE_FULL) == tok * d * 2, "R full");
  /* backward scratch (fp32 sums; product-input gradients at pbytes = 2 here) and the working
   * set: the largest block's scratch plus the residual rows (tp = 2: staging rows too) */
  CHECK(mc_act_bwd_scratch_bytes(&m, &sh, 'R') == tok * dr * (5 * 4 + 3 * 2), "R scratch");
  const int64_t sq = 4 * 16 / 2, skv = 4 * 16 / 2;
  CHECK(mc_act_bwd_scratch_bytes(&m, &sh, 'A') == tok * (sq + 2 * skv) * 4 + tok * (2 * sq + skv + skv) * 2, "A scratch");
  const int64_t big = mc_act_bwd_scratch_bytes(&m, &sh, 'R') > mc_act_bwd_scratch_bytes(&m, &sh, 'A')
                          ? mc_act_bwd_scratch_bytes(&m, &sh, 'R')
                          : mc_act_bwd_scratch_bytes(&m, &sh, 'A');
  CHECK(mc_act_working_bytes(&m, &l, &sh, "AR", 1) == big + (tok + 3 * tok) * d * 4 + tok * 16 + (tok + 2 * tok) * d * 4,
        "working set, last stage, tp 2 without sp");
  CHECK(mc_act_working_bytes(&m, &l, &sh, "AR", 0) - mc_act_working_bytes(&m, &l, &sh, "AR", 1) == tok * d * 4,
        "a stage without the head also holds x");
  const int64_t q = 4 * 16 / 2, kv = 4 * 16 / 2, heads = 4 / 2;
  CHECK(mc_act_block_bytes(&m, &sh, 'A', MC_RECOMPUTE_NONE) == tok * (2 * d * 2 + 4) + tok * (2 * q + 2 * kv) * 2 + tok * heads * 4,
        "A none");
  CHECK(mc_act_block_bytes(&m, &sh, 'A', MC_RECOMPUTE_SELECTIVE) == tok * (d * 2 + 4) + tok * (q + 2 * kv) * 2, "A selective");
  const int64_t di = 128 / 2, hm = 4 / 2, n = 16;
  CHECK(mc_act_block_bytes(&m, &sh, 'M', MC_RECOMPUTE_NONE) ==
            tok * (2 * d * 2 + 4) + tok * (6 * di + hm + 4 * n) * 2 + tok * hm * 4 + tok * di * n * 4 / 64,
        "M none");
  CHECK(mc_act_block_bytes(&m, &sh, 'M', MC_RECOMPUTE_SELECTIVE) == tok * (d * 2 + 4) + tok * (2 * di + hm + 2 * n) * 2,
        "M selective");
  const int64_t as = tok * 2; /* dropless: top_k assignments per token */
  CHECK(mc_act_block_bytes(&m, &sh, 'E', MC_RECOMPUTE_NONE) ==
            tok * (2 * d * 2 + 4) + tok * 4 * 4 + tok * 2 * 8 + as * (2 * d + 3 * 128) * 2,
        "E none");
  CHECK(mc_act_block_bytes(&m, &sh, 'E', MC_RECOMPUTE_SELECTIVE) ==
            tok * (d * 2 + 4) + tok * 4 * 4 + tok * 2 * 8 + as * (2 * d + 2 * 128) * 2,
        "E selective");
  CHECK(mc_act_head_bytes(&m, &sh, MC_RECOMPUTE_NONE) == tok * (2 * d * 2 + 4) + tok * 4 + tok * 256 / 2 * (4 + 2),
        "head: fp32 logits and their gradient at the activation bytes");
  l.sp = 1;
  mc_act_shape_of(&m, &l, 3, 2, &sh);
  CHECK(sh.tokens_seq == tok / 2, "sp splits the sequence over tp");
  CHECK(mc_act_block_bytes(&m, &sh, 'R', MC_RECOMPUTE_FULL) == tok / 2 * d * 2, "R full under sp");
  /* Expert activations scale with top-k; the capacity factor bounds them. */
  mc_act_shape_of(&m, &l, 3, 2, &sh);
  int64_t e2 = mc_act_block_bytes(&m, &sh, 'E', MC_RECOMPUTE_NONE);
  m.capacity_factor = 0.5;
  int64_t ecf = mc_act_block_bytes(&m, &sh, 'E', MC_RECOMPUTE_NONE);
  CHECK(ecf < e2, "capacity factor 0.5 bounds expert activations (%lld vs %lld)", (long long)ecf, (long long)e2);
  mc_moe_scratch s;
  mc_act_moe_scratch(&m, &l, &sh, &s);
  CHECK(s.assignments == (int64_t)(tok / 2 * 2 * 0.5), "assignments with cf=0.5: %lld", (long long)s.assignments);
  CHECK(s.total == s.counts + s.send + s.recv + s.combine, "scratch total");
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
    CHECK(p.ranks[0].inflight == 3 && p.ranks[1].inflight == 2 && p.ranks[2].inflight == 1, "1F1B in flight %d %d %d",
          p.ranks[0].inflight, p.ranks[1].inflight, p.ranks[2].inflight);
    CHECK(p.ranks[0].bytes[MC_MEM_ACTIVATIONS] ==
              3 * p.ranks[0].act_per_micro + p.ranks[0].act_transient + p.ranks[0].act_working,
          "stage 0");
    /* the stages hold the same block kinds; the first also holds x (the last counts it as
     * the final norm's input) */
    CHECK(p.ranks[2].act_working > 0 &&
              p.ranks[0].act_working - p.ranks[2].act_working == (int64_t)t.micro_batch * m.seq_len * m.d_model * 4,
          "backward working sets %lld (stage 0), %lld (last stage)", (long long)p.ranks[0].act_working,
          (long long)p.ranks[2].act_working);
    CHECK(p.ranks[1].bytes[MC_MEM_PIPELINE_BUFFERS] > 0, "pp buffers");
    drop(&g, &p);
  }
  t.global_batch = 2; /* one micro-batch: nothing else can be in flight */
  CHECK_OK(make_plan(&m, layout(1, 1, 3, 1, 0, 0), &t, &g, &p));
  if (p.ranks) {
    CHECK(p.ranks[0].inflight == 1, "min(pp - s, n_micro) with n_micro=1");
    drop(&g, &p);
  }
  /* Stages without an E layer have no routing scratch. */
  strcpy(m.pattern, "AMRE"), m.n_layers = 4;
  t.global_batch = 8;
  CHECK_OK(make_plan(&m, layout(1, 1, 2, 1, 0, 0), &t, &g, &p));
  if (p.ranks) {
    CHECK(p.ranks[0].bytes[MC_MEM_MOE_SCRATCH] == 0 && p.ranks[1].bytes[MC_MEM_MOE_SCRATCH] > 0, "moe scratch by stage");
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
      CHECK(ot.groups[i].primary_rank < 0 || ot.groups[i].primary_rank == ot.groups[i].ranks[0], "primary is lowest");
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

int main(void) {
  test_totals_grid();
  test_tp_halves();
  test_zero_shards_optimizer();
  test_dtype();
  test_recompute_order();
  test_block_formulas();
  test_pipeline();
  test_units();
  test_groups_and_json();
  test_headroom();
  return mc_check_exit("test_plan");
}
