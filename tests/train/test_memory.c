/* Category arenas and the step-1 memory report (train/arena.h, train/memreport.h):
 * - the network's and optimizer's arenas hold exactly their tensors: each arena's size is the
 *   sum of its tensors' footprints, and the tensors' own bytes equal an independent count
 *   (params and grads: mc_shard_of local slices x 4 bytes; master and moments: the state
 *   hyperslabs x 4 (x 2 for the moments); activations: sizes written out by hand from the
 *   block files' equations, which the block-kind table must reproduce);
 * - every tensor lies inside its arena and no two overlap;
 * - the holdings function equals the network's arenas, and mcplan's prediction equals the
 *   arenas' footprints where both describe the same tensors (fp32: params, grads and
 *   moments), for every rank of several layouts;
 * - the activations arena is sized once for the reserved micro-batch and kept by passes that
 *   fit it; the JSON record carries every category. */
#include "core/optim_groups.h"
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "plan/plan.h"
#include "tests/train/netcheck.h"
#include "train/memreport.h"
#include "train/optim.h"

/* A tensor placed in an arena: its address and bytes. */
typedef struct {
  const char *p;
  int64_t bytes;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->p < y->p ? -1 : x->p > y->p;
}

/* The spans lie inside arena a, do not overlap, and add up to its tensor bytes. */
static void check_spans(const mc_arena *a, span *s, int n, const char *what) {
  qsort(s, (size_t)n, sizeof *s, cmp_span);
  int64_t sum = 0;
  for (int i = 0; i < n; i++) {
    sum += s[i].bytes;
    CHECK(s[i].p >= a->base && s[i].p + s[i].bytes <= a->base + a->cap, "%s: tensor %d outside its arena", what, i);
    if (i > 0) CHECK(s[i - 1].p + s[i - 1].bytes <= s[i].p, "%s: tensors %d and %d overlap", what, i - 1, i);
  }
  CHECK(n == a->tensors, "%s: %d tensors found, the arena handed out %lld", what, n, (long long)a->tensors);
  CHECK(sum == a->tensor_bytes, "%s: tensors hold %lld bytes, the arena counts %lld", what, (long long)sum,
        (long long)a->tensor_bytes);
  CHECK(a->used == a->cap, "%s: %lld of %lld bytes used (sizing and placement must agree)", what, (long long)a->used,
        (long long)a->cap);
}

static void add_span(span *s, int *n, const void *p, int64_t bytes) {
  if (p) s[(*n)++] = (span){(const char *)p, bytes};
}

/* Buffer sizes (elements) of one block kind for n tokens of an fp32 network, written out by
 * hand from the block files' equations: the independent count the block-kind table
 * (core/blocks.h), which the trainer allocates from, must reproduce. */
typedef struct {
  int64_t f[MC_LAYER_FBUFS], i[MC_LAYER_IBUFS], g[MC_NET_GBUFS];
} sizes;

static void oracle_sizes(const mc_net *net, char kind, int n_seq, sizes *s) {
  const mc_model *m = &net->m;
  const int64_t n = (int64_t)n_seq * m->seq_len, d = m->d_model;
  memset(s, 0, sizeof *s);
  if (kind == 'A') {
    const int64_t q = (int64_t)m->n_heads * m->head_dim, kv = (int64_t)m->n_kv_heads * m->head_dim;
    s->f[MC_A_Q] = s->f[MC_A_O] = n * q, s->f[MC_A_K] = s->f[MC_A_V] = n * kv, s->f[MC_A_LSE] = n * m->n_heads;
    s->g[MC_A_DO] = s->g[MC_A_DQ] = s->g[MC_A_DQP] = n * q;
    s->g[MC_A_DK] = s->g[MC_A_DV] = s->g[MC_A_DKP] = n * kv;
  } else if (kind == 'M') {
    const int64_t di = m->mamba_inner, hm = m->mamba_inner / m->mamba_head_dim, N = m->ssm_state;
    const int fdi[] = {MC_M_Z, MC_M_XR, MC_M_XC, MC_M_Y, MC_M_GN};
    const int fn[] = {MC_M_BR, MC_M_BC, MC_M_CR, MC_M_CC};
    const int gdi[] = {MC_M_DGN, MC_M_DZ, MC_M_DY, MC_M_DXC, MC_M_DXR};
    const int gn[] = {MC_M_DBC, MC_M_DBR, MC_M_DCC, MC_M_DCR};
    for (int k = 0; k < 5; k++) s->f[fdi[k]] = s->g[gdi[k]] = n * di;
    for (int k = 0; k < 4; k++) s->f[fn[k]] = s->g[gn[k]] = n * N;
    s->f[MC_M_DTP] = s->f[MC_M_DT] = s->f[MC_M_GRSTD] = s->g[MC_M_DDT] = s->g[MC_M_DDTP] = n * hm;
  } else if (kind == 'E') {
    const int64_t E = m->n_experts, k = m->top_k, F = m->expert_hidden;
    s->f[MC_E_LOGITS] = s->f[MC_E_PROBS] = n * E, s->f[MC_E_GATE] = n * k;
    s->f[MC_E_FR] = n_seq * E, s->f[MC_E_AUX] = n_seq;
    s->f[MC_E_XP] = s->f[MC_E_YP] = n * k * d; /* a routed block (the model has several experts) */
    s->f[MC_E_H1] = s->f[MC_E_H3] = s->f[MC_E_A] = n * k * F;
    s->i[MC_E_IDX] = s->i[MC_E_SLOT] = n * k, s->i[MC_E_COUNTS] = E, s->i[MC_E_DROPPED] = 1;
    s->g[MC_E_DYP] = s->g[MC_E_DXP] = n * k * d;
    s->g[MC_E_DA] = s->g[MC_E_DH1] = s->g[MC_E_DH3] = n * k * F;
    s->g[MC_E_DGATE] = n * k, s->g[MC_E_DLOGITS] = n * E;
  } else {
    for (int k = 0; k < MC_R_NSAVED; k++) s->f[k] = n * m->rec_width;
    for (int k = 0; k < MC_R_NGRADS; k++) s->g[k] = n * m->rec_width;
  }
}

/* The activation tensors of a one-rank fp32 network for n_seq sequences, with their sizes
 * counted independently (oracle_sizes and the network-level buffers' shapes). Returns the
 * count. */
static int activation_spans(const mc_net *net, int n_seq, span *s) {
  const mc_model *m = &net->m;
  const int64_t n = (int64_t)n_seq * m->seq_len, d = m->d_model, vp = net->par.Vpl;
  int64_t gmax[MC_NET_GBUFS] = {0};
  int cnt = 0;
  for (int L = 0; L < net->n_layers; L++) {
    const mc_layer *ly = &net->layers[L];
    sizes bs;
    oracle_sizes(net, ly->kind, n_seq, &bs);
    add_span(s, &cnt, ly->x_in, n * d * 4), add_span(s, &cnt, ly->u, n * d * 4), add_span(s, &cnt, ly->rstd, n * 4);
    for (int i = 0; i < MC_LAYER_FBUFS; i++) {
      CHECK((ly->f[i] != NULL) == (bs.f[i] > 0), "layer %d (%c): saved buffer %d %s", L, ly->kind, i,
            ly->f[i] ? "placed, not expected" : "expected, not placed");
      add_span(s, &cnt, ly->f[i], bs.f[i] * 4);
    }
    for (int i = 0; i < MC_LAYER_IBUFS; i++) add_span(s, &cnt, ly->i[i], bs.i[i] * 4);
    for (int i = 0; i < MC_NET_GBUFS; i++) gmax[i] = bs.g[i] > gmax[i] ? bs.g[i] : gmax[i];
  }
  for (int i = 0; i < MC_NET_GBUFS; i++) add_span(s, &cnt, net->g[i], gmax[i] * 4);
  const void *p[] = {net->tok_in, net->tok_tgt, net->x,  net->hf, net->rstd_f, net->logits, net->loss,
                     net->lse,    net->dx,      net->du, net->y,  net->full,   net->dlogits};
  const int64_t el[] = {n, n, n * d, n * d, n, n * vp, n, n, n * d, n * d, n * d, n * d, n * vp};
  for (size_t i = 0; i < sizeof el / sizeof el[0]; i++) add_span(s, &cnt, p[i], el[i] * 4);
  return cnt;
}

static int64_t footprints(const span *s, int n) {
  int64_t t = 0;
  for (int i = 0; i < n; i++) t += mc_mem_footprint(s[i].bytes);
  return t;
}

static void test_network(void) {
  mc_model m = nc_model("AEMR");
  mc_layout l = nc_layout(1, 1, 1);
  mc_geometry g;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  mc_net *net = mc_net_create(&g, 0, 7);
  CHECK(net != NULL, "network: %s", mc_errmsg());
  if (!net) return;
  /* params by placement class and grads: the local slices mc_shard_of gives, x 4 bytes */
  int64_t want[MC_MEM_COUNT] = {0};
  for (int f = 0; f < g.fams.n; f++) {
    mc_shard sh;
    CHECK_OK(mc_shard_of(&g, f, MC_STATE_PARAM, 0, &sh));
    int64_t local = 1;
    for (int k = 0; k < sh.ndim; k++) local *= sh.local_count[k];
    want[mc_mem_param_cat(g.fams.f[f].place)] += local * 4;
    want[MC_MEM_GRADS] += local * 4;
  }
  span *s = calloc(4096, sizeof *s);
  const mc_mem_cat pcats[] = {MC_MEM_PARAMS_REPLICATED, MC_MEM_PARAMS_TP, MC_MEM_PARAMS_EP, MC_MEM_GRADS};
  for (size_t c = 0; c < sizeof pcats / sizeof pcats[0]; c++) {
    const mc_arena *a = &net->arenas.a[pcats[c]];
    CHECK(a->tensor_bytes == want[pcats[c]], "%s: arena holds %lld tensor bytes, mc_shard_of counts %lld",
          mc_mem_cat_label(pcats[c]), (long long)a->tensor_bytes, (long long)want[pcats[c]]);
    int n = 0;
    for (int i = 0; i < net->n_params; i++) {
      const mc_net_param *p = &net->params[i];
      if (pcats[c] == MC_MEM_GRADS) add_span(s, &n, p->g, p->numel * 4);
      else if (mc_mem_param_cat(g.fams.f[p->fam].place) == pcats[c]) add_span(s, &n, p->w, p->numel * 4);
    }
    check_spans(a, s, n, mc_mem_cat_label(pcats[c]));
  }
  CHECK(want[MC_MEM_PARAMS_EP] > 0 && want[MC_MEM_PARAMS_REPLICATED] > 0, "the model has expert and replicated families");

  /* activations: sized by mc_net_reserve before any pass, kept by passes that fit */
  const mc_arena *act = &net->arenas.a[MC_MEM_ACTIVATIONS];
  CHECK(act->cap == 0, "no activations before a reserve or a pass");
  CHECK_OK(mc_net_reserve(net, 3));
  int n = activation_spans(net, 3, s);
  CHECK(act->cap == footprints(s, n), "activations: arena of %lld bytes, its tensors' footprints %lld",
        (long long)act->cap, (long long)footprints(s, n));
  check_spans(act, s, n, "activations");
  const char *base = act->base;
  int32_t *tok = nc_tokens(&m, 5, 1);
  mc_net_stats st;
  CHECK_OK(mc_net_forward_backward(net, tok, 2, 1e-2, 0.5, &st));
  CHECK_OK(mc_net_forward_backward(net, tok, 3, 1e-2, 0.5, &st));
  CHECK(act->base == base, "a pass that fits the reserved micro-batch keeps the arena");
  /* a larger micro-batch replaces the arena with a larger one */
  CHECK_OK(mc_net_forward_backward(net, tok, 5, 1e-2, 0.2, &st));
  n = activation_spans(net, 5, s);
  CHECK(act->cap == footprints(s, n), "activations for 5 sequences: %lld bytes, expected %lld", (long long)act->cap,
        (long long)footprints(s, n));
  check_spans(act, s, n, "activations (5 sequences)");
  /* the holdings function (what mcplan reports) equals every arena the network keeps */
  mc_hold_opts ho = {.micro_batch = 5, .n_micro = 1, .moe_dense = 1};
  int64_t held[MC_MEM_COUNT], arena[MC_MEM_COUNT] = {0};
  CHECK_OK(mc_holdings_of(&g, 0, &ho, held));
  mc_net_mem_bytes(net, arena);
  const mc_mem_cat owned[] = {MC_MEM_PARAMS_REPLICATED, MC_MEM_PARAMS_TP, MC_MEM_PARAMS_EP,
                              MC_MEM_GRADS, MC_MEM_ZERO3_BUFFERS, MC_MEM_ACTIVATIONS};
  for (size_t c = 0; c < sizeof owned / sizeof owned[0]; c++)
    CHECK(held[owned[c]] == arena[owned[c]], "%s: holdings %lld bytes, the network's arena %lld",
          mc_mem_cat_label(owned[c]), (long long)held[owned[c]], (long long)arena[owned[c]]);
  free(tok);
  free(s);
  mc_net_free(net);
  mc_geometry_free(&g);
}

/* Every rank of a layout: the optimizer's arenas hold the state hyperslabs mc_shard_of gives
 * (master x 4 bytes, moments x 8), and mcplan (fp32) predicts exactly the moments' arena
 * bytes (their footprints); its master prediction is 0 in fp32 (the plan counts no separate master copy when the
 * working weights are fp32, the optimizer keeps one: docs/training.md). */
static void test_optimizer(int tp, int dp, int ep, int zero, const char *groups) {
  mc_model m = nc_model("AEMR");
  mc_layout l = nc_layout(tp, dp, ep);
  l.zero = zero;
  mc_train_cfg t;
  memset(&t, 0, sizeof t);
  t.micro_batch = 1, t.global_batch = dp;
  snprintf(t.recompute, sizeof t.recompute, "none");
  snprintf(t.dtype, sizeof t.dtype, "fp32");
  snprintf(t.device, sizeof t.device, "cpu");
  snprintf(t.optim.groups, sizeof t.optim.groups, "%s", groups);
  mc_geometry g;
  if (mc_geometry_build(&m, &l, &t, -1, &g) != 0) {
    CHECK(0, "geometry tp=%d dp=%d ep=%d zero=%d: %s", tp, dp, ep, zero, mc_errmsg());
    return;
  }
  mc_plan_opts po;
  mc_plan_opts_default(&po);
  mc_plan plan;
  CHECK_OK(mc_plan_build(&g, &t, &po, &plan));
  span *s = calloc(1024, sizeof *s);
  for (int r = 0; r < g.world; r++) {
    mc_optim o;
    CHECK_OK(mc_optim_init(&o, &g, r));
    int64_t want[MC_MEM_COUNT] = {0}, fp[MC_MEM_COUNT] = {0}; /* tensor bytes, their footprints */
    for (int f = 0; f < g.fams.n; f++) {
      mc_shard sh[MC_N_STATES];
      for (int k = 0; k < MC_N_STATES; k++) CHECK_OK(mc_shard_of(&g, f, (mc_state)k, r, &sh[k]));
      if (!sh[0].in_stage) continue;
      int dec = g.fams.f[f].decay;
      want[dec ? MC_MEM_MASTER_DECAY : MC_MEM_MASTER_NO_DECAY] += sh[MC_STATE_PARAM].numel * 4;
      /* the optimizer's states: AdamW's moments or Muon's momentum (AdamW's step is host memory
       * of the slot, in no arena) */
      for (int k = 1; k < MC_N_STATES; k++)
        if (mc_family_has_state(&g.fams.f[f], (mc_state)k) && !mc_state_is_scalar((mc_state)k)) {
          want[dec ? MC_MEM_MOMENTS_DECAY : MC_MEM_MOMENTS_NO_DECAY] += sh[k].numel * 4;
          fp[dec ? MC_MEM_MOMENTS_DECAY : MC_MEM_MOMENTS_NO_DECAY] += mc_mem_footprint(sh[k].numel * 4);
        }
    }
    const mc_mem_cat cats[] = {MC_MEM_MASTER_DECAY, MC_MEM_MASTER_NO_DECAY, MC_MEM_MOMENTS_DECAY,
                               MC_MEM_MOMENTS_NO_DECAY};
    for (size_t c = 0; c < 4; c++) {
      const mc_arena *a = &o.arenas.a[cats[c]];
      CHECK(a->tensor_bytes == want[cats[c]], "tp=%d dp=%d ep=%d zero=%d rank %d %s: %lld tensor bytes, mc_shard_of %lld",
            tp, dp, ep, zero, r, mc_mem_cat_label(cats[c]), (long long)a->tensor_bytes, (long long)want[cats[c]]);
      int n = 0;
      for (int i = 0; i < o.n; i++) {
        const mc_optim_slot *sl = &o.slots[i];
        if ((sl->decay ? MC_MEM_MASTER_DECAY : MC_MEM_MASTER_NO_DECAY) == cats[c]) add_span(s, &n, sl->master, sl->numel * 4);
        if ((sl->decay ? MC_MEM_MOMENTS_DECAY : MC_MEM_MOMENTS_NO_DECAY) == cats[c])
          for (int k = 1; k < MC_N_STATES; k++)
            if (mc_optim_state(sl, (mc_state)k)) add_span(s, &n, mc_optim_state(sl, (mc_state)k), sl->numel * 4);
      }
      check_spans(a, s, n, mc_mem_cat_label(cats[c]));
    }
    const int64_t *pb = plan.ranks[r].bytes;
    CHECK(pb[MC_MEM_MOMENTS_DECAY] == fp[MC_MEM_MOMENTS_DECAY] && pb[MC_MEM_MOMENTS_NO_DECAY] == fp[MC_MEM_MOMENTS_NO_DECAY] &&
              fp[MC_MEM_MOMENTS_DECAY] == o.arenas.a[MC_MEM_MOMENTS_DECAY].cap &&
              fp[MC_MEM_MOMENTS_NO_DECAY] == o.arenas.a[MC_MEM_MOMENTS_NO_DECAY].cap,
          "rank %d: mcplan's moments %lld + %lld, the optimizer's arenas %lld + %lld", r, (long long)pb[MC_MEM_MOMENTS_DECAY],
          (long long)pb[MC_MEM_MOMENTS_NO_DECAY], (long long)o.arenas.a[MC_MEM_MOMENTS_DECAY].cap,
          (long long)o.arenas.a[MC_MEM_MOMENTS_NO_DECAY].cap);
    CHECK(pb[MC_MEM_MASTER_DECAY] == 0 && pb[MC_MEM_MASTER_NO_DECAY] == 0, "fp32: mcplan counts no master copy");
    /* Muon's scratch: the optimizer's arena is mcplan's figure, nonzero exactly with Muon */
    int muon = 0;
    for (int i = 0; i < o.n; i++) muon |= o.slots[i].opt == MC_OPT_MUON;
    CHECK(o.arenas.a[MC_MEM_OPTIM_SCRATCH].cap == pb[MC_MEM_OPTIM_SCRATCH] && (pb[MC_MEM_OPTIM_SCRATCH] > 0) == muon,
          "%s rank %d: optimizer.scratch arena %lld bytes, mcplan %lld (Muon slots: %d)", groups, r,
          (long long)o.arenas.a[MC_MEM_OPTIM_SCRATCH].cap, (long long)pb[MC_MEM_OPTIM_SCRATCH], muon);
    /* working params and grads at fp32: the local slices (ZeRO 3: the persistent shard is what
     * the network keeps in its params arena, the plan counts the shard as working params) */
    int64_t wp = 0, wg = 0; /* footprints: one tensor per family in each category */
    for (int f = 0; f < g.fams.n; f++) {
      mc_shard sh;
      CHECK_OK(mc_shard_of(&g, f, MC_STATE_PARAM, r, &sh));
      if (!sh.in_stage) continue;
      int64_t local = 1;
      for (int k = 0; k < sh.ndim; k++) local *= sh.local_count[k];
      wp += mc_mem_footprint((zero == 3 ? sh.numel : local) * 4);
      wg += mc_mem_footprint((zero == 3 ? sh.numel : local) * 4);
    }
    CHECK(pb[MC_MEM_PARAMS_REPLICATED] + pb[MC_MEM_PARAMS_TP] + pb[MC_MEM_PARAMS_EP] == wp && pb[MC_MEM_GRADS] == wg,
          "rank %d: mcplan's params/grads differ from the local slices", r);
    mc_optim_free(&o);
  }
  free(s);
  mc_plan_free(&plan);
  mc_geometry_free(&g);
}

/* The JSON record names every category, with null where nothing is measured. */
static void test_report_json(void) {
  int64_t m[MC_MEM_COUNT], p[MC_MEM_COUNT];
  for (int c = 0; c < MC_MEM_COUNT; c++) m[c] = c % 3 == 2 ? -1 : 1000 + c, p[c] = 7 * c;
  FILE *f = tmpfile();
  CHECK_OK(mc_mem_report_json(f, 0, "cpu", m, p));
  rewind(f);
  char line[8192] = "";
  CHECK(fgets(line, sizeof line, f) != NULL, "a line");
  fclose(f);
  cJSON *j = cJSON_Parse(line);
  cJSON *cats = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "memory"), "categories");
  CHECK(cJSON_GetArraySize(cats) == MC_MEM_COUNT, "%d categories in %s", cJSON_GetArraySize(cats), line);
  for (int c = 0; c < MC_MEM_COUNT; c++) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(cats, mc_mem_cat_label((mc_mem_cat)c));
    cJSON *me = cJSON_GetObjectItemCaseSensitive(e, "measured"), *pe = cJSON_GetObjectItemCaseSensitive(e, "predicted");
    CHECK(m[c] < 0 ? cJSON_IsNull(me) : cJSON_IsNumber(me) && me->valuedouble == (double)m[c], "measured of %d", c);
    CHECK(cJSON_IsNumber(pe) && pe->valuedouble == (double)p[c], "predicted of %d", c);
  }
  cJSON_Delete(j);
}

int main(void) {
  test_network();
  const char *groups[] = {"adamw:all", "muon:matrices,adamw:all"};
  for (int k = 0; k < 2; k++) {
    test_optimizer(1, 1, 1, 0, groups[k]);
    test_optimizer(2, 2, 1, 1, groups[k]);
    test_optimizer(1, 4, 2, 1, groups[k]);
    test_optimizer(2, 2, 1, 3, groups[k]);
  }
  test_report_json();
  return mc_check_exit("test_memory");
}
