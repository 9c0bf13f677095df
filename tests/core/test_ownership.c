/* Property tests of the ownership function over random valid (model, layout) pairs:
 * primaries tile every family and state exactly once, replicas hold identical hyperslabs,
 * the analytic primary/replica answer matches brute force, and stage splits behave; under
 * random optimizer groups each family holds exactly its optimizer's state kinds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/config.h"
#include "core/cost.h"
#include "core/holdings.h"
#include "core/optim_groups.h"
#include "core/ownership.h"
#include "util/rng.h"

static uint64_t ctr = 0;
static long split_beyond0 = 0; /* parts of balanced-v2 split on a dimension after 0 */
static int pick(int n) { return (int)mc_rng_below(42, MC_RNG_STREAM_TEST, ctr++, (uint64_t)n); }

static void random_case(mc_model *m, mc_layout *l) {
  static const int tps[] = {1, 1, 2, 2, 4};
  memset(m, 0, sizeof *m);
  memset(l, 0, sizeof *l);
  l->tp = tps[pick(5)];
  l->dp = 1 + pick(4);
  int n = 1 + pick(10);
  for (int i = 0; i < n; i++) m->pattern[i] = "AMER"[pick(4)];
  m->pattern[n] = 0;
  m->n_layers = n;
  l->pp = 1 + pick(n < 4 ? n : 4);
  m->d_model = 4 + 2 * pick(4);
  m->vocab_size = 5 + pick(60);
  m->vocab_pad = 4 * l->tp * (1 + pick(2));
  m->n_kv_heads = l->tp * (1 + pick(2));
  m->n_heads = m->n_kv_heads * (1 + pick(2));
  m->head_dim = 2 + 2 * pick(2);
  m->mamba_head_dim = 1 + pick(3);
  m->mamba_inner = m->mamba_head_dim * l->tp * (1 + pick(2));
  m->ssm_state = 1 + pick(4);
  m->conv_width = 1 + pick(4);
  m->rec_width = l->tp * (1 + pick(3));
  m->seq_len = 4 * l->tp;
  /* ep divides tp*dp and the expert count */
  int tpdp = l->tp * l->dp, divs[16], nd = 0;
  for (int e = 1; e <= tpdp; e++)
    if (tpdp % e == 0) divs[nd++] = e;
  l->ep = strchr(m->pattern, 'E') ? divs[pick(nd)] : 1;
  m->n_experts = l->ep * (1 + pick(3));
  m->top_k = 1 + pick(m->n_experts);
  m->expert_hidden = 1 + pick(6);
  l->sp = (l->tp > 1 && l->ep > 1) ? 1 : pick(2);
  static const int zeros[] = {0, 1, 3};
  l->zero = zeros[pick(3)];
  l->split = (mc_split_mode)pick(3);
  if (l->split == MC_SPLIT_EXPLICIT) {
    /* pp-1 distinct cut points in [1, n) */
    int cut[MC_MAX_LAYERS] = {0};
    int placed = 0;
    while (placed < l->pp - 1) {
      int c = 1 + pick(n - 1);
      if (!cut[c]) { cut[c] = 1; placed++; }
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (cut[i]) l->split_pattern[k++] = '|';
      l->split_pattern[k++] = m->pattern[i];
    }
    l->split_pattern[k] = 0;
  }
}

static int64_t flat_index(const mc_family *f, const int64_t *idx) {
  int64_t v = 0;
  for (int i = 0; i < f->ndim; i++) v = v * f->shape[i] + idx[i];
  return v;
}

/* Adds `delta` to cover[] for every element of the hyperslab. */
static void mark(const mc_family *f, const mc_shard *s, int *cover) {
  int64_t idx[3] = {0, 0, 0}, c0 = s->count[0], c1 = f->ndim > 1 ? s->count[1] : 1, c2 = f->ndim > 2 ? s->count[2] : 1;
  for (int64_t a = 0; a < c0; a++)
    for (int64_t b = 0; b < c1; b++)
      for (int64_t c = 0; c < c2; c++) {
        idx[0] = s->start[0] + a;
        idx[1] = s->start[1] + b;
        idx[2] = s->start[2] + c;
        cover[flat_index(f, idx)]++;
      }
}

static int same(const mc_shard *a, const mc_shard *b) {
  for (int i = 0; i < a->ndim; i++)
    if (a->start[i] != b->start[i] || a->count[i] != b->count[i]) return 0;
  return a->held && b->held;
}

/* A scalar kind (step) against brute force over every rank: it is held, as [0, 1) of shape
 * [1], by exactly the ranks holding a nonempty param hyperslab of the family; every holder
 * names the same primary, the lowest holder, the only rank whose primary flag is set; the
 * replica count is the number of holders and mc_shard_replicas lists them all. */
static long scalar_cases = 0, scalar_partial = 0; /* families whose scalar some stage rank lacks */
static void check_scalar(const mc_geometry *g, int fi, mc_state st, const mc_shard *sh) {
  const mc_family *f = &g->fams.f[fi];
  int holders = 0, lowest = -1, primaries = 0, in_stage = 0;
  for (int r = 0; r < g->world; r++) {
    mc_shard p;
    CHECK_OK(mc_shard_of(g, fi, MC_STATE_PARAM, r, &p));
    const mc_shard *s = &sh[r];
    in_stage += p.in_stage;
    CHECK(s->held == p.held, "%s/%s rank %d: held %d, param held %d", f->name, mc_state_name(st), r, s->held, p.held);
    if (!s->held) {
      CHECK(s->primary_rank == -1 && !s->primary && s->numel == 0, "%s/%s rank %d holds nothing but names a primary", f->name,
            mc_state_name(st), r);
      continue;
    }
    CHECK(s->ndim == 1 && s->start[0] == 0 && s->count[0] == 1 && s->numel == 1 && s->local_count[0] == 1,
          "%s/%s rank %d: not [0, 1) of [1]", f->name, mc_state_name(st), r);
    if (lowest < 0) lowest = r;
    holders++;
    primaries += s->primary;
  }
  scalar_cases++;
  scalar_partial += holders > 0 && holders < in_stage;
  CHECK(holders > 0, "%s/%s: no rank holds it", f->name, mc_state_name(st));
  CHECK(primaries == 1, "%s/%s: %d primaries (tp%d dp%d pp%d ep%d zero%d rule %s)", f->name, mc_state_name(st), primaries,
        g->layout.tp, g->layout.dp, g->layout.pp, g->layout.ep, g->layout.zero, mc_own_rule_name(g->layout.own_rule));
  int *reps = malloc(sizeof(int) * (size_t)g->world);
  for (int r = 0; r < g->world; r++) {
    if (!sh[r].held) continue;
    CHECK(sh[r].primary_rank == lowest && sh[r].primary == (r == lowest), "%s/%s rank %d: primary %d, lowest holder %d", f->name,
          mc_state_name(st), r, sh[r].primary_rank, lowest);
    CHECK(sh[r].n_replicas == holders, "%s/%s rank %d: %d replicas, %d holders (tp%d dp%d ep%d zero%d rule %s)", f->name,
          mc_state_name(st), r, sh[r].n_replicas, holders, g->layout.tp, g->layout.dp, g->layout.ep, g->layout.zero,
          mc_own_rule_name(g->layout.own_rule));
  }
  CHECK(mc_shard_replicas(g, fi, st, lowest, reps) == holders && reps[0] == lowest, "%s/%s: replica list", f->name,
        mc_state_name(st));
  free(reps);
}

static void check_geometry(const mc_geometry *g) {
  int world = g->world;
  mc_shard *sh = malloc(sizeof *sh * (size_t)world);
  int *reps = malloc(sizeof(int) * (size_t)world);
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    int *cover = calloc((size_t)f->numel, sizeof(int));
    for (int st = 0; st < MC_N_STATES; st++) {
      memset(cover, 0, sizeof(int) * (size_t)f->numel);
      for (int r = 0; r < world; r++) CHECK_OK(mc_shard_of(g, fi, (mc_state)st, r, &sh[r]));
      if (mc_state_is_scalar((mc_state)st)) {
        check_scalar(g, fi, (mc_state)st, sh);
        continue;
      }
      for (int r = 0; r < world; r++) {
        mc_shard *s = &sh[r];
        if (!s->in_stage) CHECK(!s->held, "%s rank %d outside stage %d holds data", f->name, r, s->stage);
        if (!s->held) continue;
        /* the state hyperslab lies inside the local slice, which lies inside the family */
        for (int i = 0; i < f->ndim; i++) {
          CHECK(s->start[i] >= s->local_start[i] && s->start[i] + s->count[i] <= s->local_start[i] + s->local_count[i],
                "%s rank %d dim %d: shard outside local slice", f->name, r, i);
          CHECK(s->local_start[i] >= 0 && s->local_start[i] + s->local_count[i] <= f->shape[i], "%s local slice outside", f->name);
        }
        /* brute-force replicas (ascending); the primary is one of them, the same for all of
         * them: the lowest (chunked) or the one at (3*family + state) % n (balanced) */
        int n = 0, in = 0;
        for (int q = 0; q < world; q++)
          if (same(s, &sh[q])) {
            reps[n++] = q;
            in |= q == s->primary_rank;
            CHECK(sh[q].primary_rank == s->primary_rank, "%s/%s: replicas %d and %d name primaries %d and %d", f->name,
                  mc_state_name((mc_state)st), r, q, s->primary_rank, sh[q].primary_rank);
          }
        const int want = n ? reps[g->layout.own_rule == MC_OWN_CHUNKED ? 0 : (3 * fi + st) % n] : -1;
        CHECK(in && want == s->primary_rank, "%s/%s rank %d: primary %d, brute force %d (layout tp%d dp%d pp%d ep%d zero%d rule %s)",
              f->name, mc_state_name((mc_state)st), r, s->primary_rank, want, g->layout.tp, g->layout.dp, g->layout.pp,
              g->layout.ep, g->layout.zero, mc_own_rule_name(g->layout.own_rule));
        CHECK(n == s->n_replicas, "%s rank %d: %d replicas, brute force %d", f->name, r, s->n_replicas, n);
        CHECK(s->primary == (want == r), "%s rank %d primary flag", f->name, r);
        /* a ZeRO member's part is one contiguous run of the local slice that follows those of
         * the members before it (the trainer packs them member-major); under the balanced
         * rules the parts of one cell differ by at most one row of the split dimension */
        if (g->layout.zero > 0) {
          int64_t lo[3], cnt[3], before = 0, off = 0, stride = 1;
          for (int j = 0; j < s->zero_index; j++) {
            mc_zero_part(g->layout.own_rule, f->ndim, s->local_count, s->zero_group, j, mc_zero_rotation(g, fi), lo, cnt);
            int64_t n = 1;
            for (int d = 0; d < f->ndim; d++) n *= cnt[d];
            before += n;
          }
          for (int d = f->ndim - 1; d >= 0; d--) off += (s->start[d] - s->local_start[d]) * stride, stride *= s->local_count[d];
          CHECK(off == before, "%s rank %d: part starts at element %lld, members before hold %lld", f->name, r, (long long)off,
                (long long)before);
          const int k = s->zero_dim;
          split_beyond0 += k > 0;
          CHECK(k == mc_zero_split_dim(g->layout.own_rule, f->ndim, s->local_count, s->zero_group), "%s rank %d split dim", f->name, r);
          for (int d = 0; d < f->ndim; d++)
            CHECK(d < k ? s->count[d] == 1 : d > k ? s->count[d] == s->local_count[d] : 1, "%s rank %d: part not contiguous on dim %d",
                  f->name, r, d);
          if (g->layout.own_rule != MC_OWN_CHUNKED) {
            int64_t m = 1;
            for (int d = 0; d < k; d++) m *= s->local_count[d];
            const int64_t gc = s->zero_group / m + (k > 0 && s->zero_index < s->zero_group % m * (s->zero_group / m + 1));
            CHECK(s->count[k] == s->local_count[k] / gc || s->count[k] == s->local_count[k] / gc + 1,
                  "%s rank %d: %lld of %lld rows of dim %d among %lld members", f->name, r, (long long)s->count[k],
                  (long long)s->local_count[k], k, (long long)gc);
            if (k > 0) CHECK(s->count[k] > 0, "%s rank %d: empty part although dim %d is split", f->name, r, k);
          }
        }
        if (s->primary) mark(f, s, cover);
      }
      int bad = 0;
      for (int64_t e = 0; e < f->numel; e++) bad += cover[e] != 1;
      CHECK(bad == 0, "%s/%s: %d elements not covered exactly once by primaries (tp%d dp%d pp%d ep%d zero%d)", f->name,
            mc_state_name((mc_state)st), bad, g->layout.tp, g->layout.dp, g->layout.pp, g->layout.ep, g->layout.zero);
    }
    /* mc_shard_replicas agrees with the analytic answer (sampled on one rank per family) */
    int r = (int)(ctr++ % (uint64_t)world);
    CHECK_OK(mc_shard_of(g, fi, MC_STATE_PARAM, r, &sh[r])); /* sh holds the last kind's */
    int nr = mc_shard_replicas(g, fi, MC_STATE_PARAM, r, reps);
    CHECK(nr == sh[r].n_replicas || !sh[r].held, "%s replicas list %d vs %d", f->name, nr, sh[r].n_replicas);
    int listed = 0;
    for (int k = 0; k < nr; k++) listed |= reps[k] == sh[r].primary_rank && (k == 0 || reps[k] > reps[k - 1]);
    if (nr > 0) CHECK(listed, "%s replicas list lacks the primary %d", f->name, sh[r].primary_rank);
    free(cover);
  }
  free(sh);
  free(reps);
}

/* Optimizer groups over a geometry: for every family, the state kinds some rank holds bytes
 * of (core/holdings.h, what the trainer allocates and the checkpoint stores) are exactly the
 * kinds its optimizer declares (mc_opt_state_mask), and the primaries of each declared kind
 * tile the family once, byte for byte, while an undeclared kind has no bytes anywhere. */
static void check_groups(const mc_geometry *g) {
  const mc_hold_opts o = {.moe_dense = 1};
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    unsigned held = 0;
    int64_t primary[MC_N_STATES] = {0};
    for (int r = 0; r < g->world; r++) {
      mc_param_hold h;
      CHECK_OK(mc_param_hold_of(g, fi, r, &o, &h));
      if (!h.in_stage) continue;
      int n_decl;
      mc_opt_states(f->opt, &n_decl);
      CHECK(h.n_moments + (f->opt == MC_OPT_ADAMW) == n_decl, "%s: %d optimizer tensors shaped like it, %s declares %d", f->name,
            h.n_moments, mc_opt_name(f->opt), n_decl);
      CHECK(h.n_scalars == (f->opt == MC_OPT_ADAMW && h.shard.held) && (!h.n_scalars || h.scalar_bytes == 8),
            "%s rank %d: %d scalar states of %lld bytes", f->name, r, h.n_scalars, (long long)h.scalar_bytes);
      for (int st = 0; st < MC_N_STATES; st++) {
        if (h.state_bytes[st] > 0) held |= 1u << st;
        if (h.state_primary[st]) primary[st] += h.state_bytes[st];
      }
    }
    CHECK(held == mc_opt_state_mask(f->opt), "%s (%s): kinds held 0x%x, declared 0x%x", f->name, mc_opt_name(f->opt), held,
          mc_opt_state_mask(f->opt));
    for (int st = 0; st < MC_N_STATES; st++) {
      /* scalar kinds: one int64 element, written once */
      const int64_t want = !mc_family_has_state(f, (mc_state)st) ? 0 : mc_state_is_scalar((mc_state)st) ? 8 : f->numel * 4;
      CHECK(primary[st] == want, "%s (%s) %s: primaries hold %lld bytes, want %lld", f->name, mc_opt_name(f->opt),
            mc_state_name((mc_state)st), (long long)primary[st], (long long)want);
    }
  }
}

/* Assigns a random optim.groups value to g's families (AdamW only, Muon for the matrices or
 * for a glob of 2-D families); a glob that also matches 1-D families is refused naming the
 * rule and a family, and leaves every family as it was. Returns 1 if some family is Muon's. */
static int random_groups(mc_geometry *g) {
  static const char *const groups[] = {"adamw:all", "muon:matrices,adamw:all",
                                       "muon:layers.0*.attn.w*,muon:layers.*.rec.w_*,adamw:all"};
  int *before = malloc(sizeof(int) * (size_t)g->fams.n);
  for (int fi = 0; fi < g->fams.n; fi++) before[fi] = g->fams.f[fi].opt;
  /* layers.00.norm.weight is 1-D and every model has a layer 0 */
  CHECK(mc_optim_groups_assign("muon:layers.0*,adamw:all", &g->fams) != 0 && strstr(mc_errmsg(), "rule muon:layers.0*") &&
            strstr(mc_errmsg(), "layers.00.norm.weight") && strstr(mc_errmsg(), "Muon takes 2-D"),
        "a Muon glob over 1-D families: %s", mc_errmsg());
  int unchanged = 1;
  for (int fi = 0; fi < g->fams.n; fi++) unchanged &= g->fams.f[fi].opt == before[fi];
  CHECK(unchanged, "a refused optim.groups changed some family's optimizer");
  free(before);
  const char *pick_groups = groups[pick(3)];
  CHECK_OK(mc_optim_groups_assign(pick_groups, &g->fams));
  int muon = 0;
  for (int fi = 0; fi < g->fams.n; fi++) {
    const mc_family *f = &g->fams.f[fi];
    muon += f->opt == MC_OPT_MUON;
    CHECK(f->opt != MC_OPT_MUON || f->ndim == 2, "%s is %d-D and Muon's", f->name, f->ndim);
  }
  return muon > 0;
}

static void test_random_layouts(void) {
  int valid = 0, tries = 0, zero_seen[4] = {0}, split_seen[3] = {0}, ep_multi = 0, with_muon = 0;
  while (valid < 600 && tries < 20000) {
    tries++;
    mc_model m;
    mc_layout l;
    random_case(&m, &l);
    mc_geometry g;
    if (mc_geometry_build(&m, &l, NULL, -1, &g)) continue;
    valid++;
    zero_seen[l.zero]++;
    split_seen[l.split]++;
    ep_multi += l.ep > 1;
    check_geometry(&g);
    with_muon += random_groups(&g);
    check_groups(&g);
    mc_geometry_free(&g);
    /* the same layout under the older rules (checkpoints of format version 2 before
     * balanced-v2, and of format version 1) */
    for (int rule = MC_OWN_BALANCED; rule <= MC_OWN_CHUNKED; rule++) {
      l.own_rule = rule;
      CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
      check_geometry(&g);
      mc_geometry_free(&g);
    }
  }
  CHECK(valid == 600, "only %d valid random cases in %d tries", valid, tries);
  CHECK(zero_seen[0] && zero_seen[1] && zero_seen[3], "zero modes covered");
  CHECK(split_seen[0] && split_seen[1] && split_seen[2], "split modes covered");
  CHECK(ep_multi > 20, "ep > 1 covered (%d)", ep_multi);
  CHECK(split_beyond0 > 1000, "balanced-v2 splits after dim 0 covered (%ld parts)", split_beyond0);
  CHECK(scalar_partial > 100, "scalar kinds of families some ranks of their stage hold nothing of covered (%ld of %ld)",
        scalar_partial, scalar_cases);
  CHECK(with_muon > 100 && with_muon < valid - 100, "mixed optimizer groups covered (%d of %d with Muon)", with_muon, valid);
  printf("ownership property: %d valid layouts (%d tries), %d with ep>1, %d with Muon groups, each under the three rules; "
         "%ld parts split after dim 0; %ld scalar-kind cases, %ld with ranks of the stage that do not hold it\n",
         valid, tries, ep_multi, with_muon, split_beyond0, scalar_cases, scalar_partial);
}

/* mc_zero_rows against its definition, for every group size, rotation and row count up to a
 * bound: consecutive ranges tiling [0, rows); chunked: ceil(rows / g) parts; balanced: the r =
 * rows % g members rot..rot+r-1 (mod g) hold one more row than the others. */
static void test_zero_rows(void) {
  int cases = 0;
  for (int gs = 1; gs <= 12; gs++)
    for (int64_t rows = 0; rows <= 40; rows++)
      for (int rot = 0; rot < gs; rot++)
        for (int rule = 0; rule < MC_OWN_N_RULES; rule++) {
          int64_t at = 0, chunk = (rows + gs - 1) / gs;
          for (int i = 0; i < gs; i++) {
            int64_t lo, hi;
            mc_zero_rows(rule, rows, gs, i, rot, &lo, &hi);
            CHECK(lo == at && hi >= lo, "rule %d rows %lld g %d rot %d member %d: [%lld, %lld) after %lld", rule, (long long)rows,
                  gs, rot, i, (long long)lo, (long long)hi, (long long)at);
            at = hi;
            int64_t want = rule == MC_OWN_CHUNKED ? (chunk * (i + 1) < rows ? chunk * (i + 1) : rows) - (chunk * i < rows ? chunk * i : rows)
                                                  : rows / gs + (((i - rot) % gs + gs) % gs < rows % gs);
            CHECK(hi - lo == want, "rule %d rows %lld g %d rot %d member %d holds %lld rows, want %lld", rule, (long long)rows, gs,
                  rot, i, (long long)(hi - lo), (long long)want);
          }
          CHECK(at == rows, "rule %d rows %lld g %d: parts end at %lld", rule, (long long)rows, gs, (long long)at);
          cases++;
        }
  printf("zero rows: %d cases\n", cases);
}

/* mc_zero_part by brute force over every local shape of up to 3 dims with extents up to 5,
 * group size up to 12 and every rotation, under each rule: the parts, in member order, are
 * boxes whose elements are consecutive in the row-major slice and follow each other, tiling
 * it; the split dimension is 0 unless balanced-v2 finds a first prefix D0*...*Dk >= g with
 * D0 < g; with k > 0 no part is empty and the parts of one cell (same indices before k)
 * differ by at most one row; with k = 0 balanced-v2's parts are the balanced rule's. */
static void test_zero_part(void) {
  int cases = 0;
  for (int nd = 1; nd <= 3; nd++)
    for (int code = 0; code < 125; code++) {
      int64_t D[3] = {1 + code % 5, 1 + code / 5 % 5, 1 + code / 25 % 5}, numel = 1;
      if ((nd < 2 && code >= 5) || (nd < 3 && code >= 25)) continue;
      for (int d = 0; d < nd; d++) numel *= D[d];
      for (int gs = 1; gs <= 12; gs++)
        for (int rot = 0; rot < gs; rot++)
          for (int rule = 0; rule < MC_OWN_N_RULES; rule++) {
            int want_k = 0;
            int64_t prefix = D[0];
            for (int k = 1; rule == MC_OWN_BALANCED_V2 && D[0] < gs && k < nd && !want_k; k++)
              if ((prefix *= D[k]) >= gs) want_k = k;
            CHECK(mc_zero_split_dim(rule, nd, D, gs) == want_k, "rule %d split dim", rule);
            int64_t at = 0, most[125], least[125];
            for (int c = 0; c < 125; c++) most[c] = -1, least[c] = INT64_MAX;
            for (int i = 0; i < gs; i++) {
              int64_t lo[3], cnt[3], n = 1;
              int k = mc_zero_part(rule, nd, D, gs, i, rot, lo, cnt);
              CHECK(k == want_k, "rule %d member %d: split dim %d, want %d", rule, i, k, want_k);
              for (int d = 0; d < nd; d++) {
                CHECK(lo[d] >= 0 && cnt[d] >= 0 && lo[d] + cnt[d] <= D[d], "rule %d member %d: box outside on dim %d", rule, i, d);
                n *= cnt[d];
              }
              /* the flat index of every element of the box, in row-major box order: consecutive from `at` */
              int64_t e = 0, bad = 0;
              for (int64_t a = 0; a < (nd > 0 ? cnt[0] : 1); a++)
                for (int64_t b = 0; b < (nd > 1 ? cnt[1] : 1); b++)
                  for (int64_t c = 0; c < (nd > 2 ? cnt[2] : 1); c++, e++) {
                    int64_t idx[3] = {lo[0] + a, nd > 1 ? lo[1] + b : 0, nd > 2 ? lo[2] + c : 0}, flat = 0;
                    for (int d = 0; d < nd; d++) flat = flat * D[d] + idx[d];
                    bad += flat != at + e;
                  }
              CHECK(bad == 0 && e == n, "rule %d shape %lldx%lldx%lld g %d member %d: part not the run after %lld", rule,
                    (long long)D[0], (long long)D[1], (long long)D[2], gs, i, (long long)at);
              at += n;
              if (k > 0) {
                int64_t cell = 0;
                for (int d = 0; d < k; d++) cell = cell * D[d] + lo[d];
                CHECK(cnt[k] > 0, "rule %d g %d member %d: empty although dim %d is split", rule, gs, i, k);
                most[cell] = cnt[k] > most[cell] ? cnt[k] : most[cell];
                least[cell] = cnt[k] < least[cell] ? cnt[k] : least[cell];
              } else if (rule == MC_OWN_BALANCED_V2) {
                int64_t l0, h0;
                mc_zero_rows(MC_OWN_BALANCED, D[0], gs, i, rot, &l0, &h0);
                CHECK(lo[0] == l0 && cnt[0] == h0 - l0, "balanced-v2 on dim 0 differs from balanced");
              }
            }
            CHECK(at == numel, "rule %d g %d: parts end at %lld of %lld", rule, gs, (long long)at, (long long)numel);
            for (int c = 0; c < 125; c++)
              if (most[c] >= 0) CHECK(most[c] - least[c] <= 1, "rule %d g %d cell %d: parts of %lld and %lld rows", rule, gs, c,
                                      (long long)least[c], (long long)most[c]);
            cases++;
          }
    }
  printf("zero parts: %d cases\n", cases);
}

static void base(mc_model *m, mc_layout *l) {
  memset(m, 0, sizeof *m);
  memset(l, 0, sizeof *l);
  strcpy(m->pattern, "AEMEAEMEAEMR");
  m->n_layers = 12;
  m->vocab_size = 1000; m->vocab_pad = 128; m->d_model = 64;
  m->n_heads = 8; m->n_kv_heads = 4; m->head_dim = 8;
  m->n_experts = 8; m->top_k = 2; m->expert_hidden = 32;
  m->mamba_inner = 128; m->mamba_head_dim = 16; m->ssm_state = 8; m->conv_width = 4;
  m->rec_width = 64; m->seq_len = 64;
  l->tp = l->pp = l->dp = l->ep = 1;
}

/* Each rule is rejected with its own message. */
static void test_validation_messages(void) {
  struct { const char *needle; void (*mut)(mc_model *, mc_layout *, mc_train_cfg *); } cases[16];
  (void)cases;
  mc_model m; mc_layout l; mc_train_cfg t; mc_errlist e;
  memset(&t, 0, sizeof t);
#define EXPECT(needle, body)                                         \
  do {                                                               \
    base(&m, &l);                                                    \
    t.global_batch = 8; t.micro_batch = 2;                           \
    body;                                                            \
    mc_errlist_init(&e);                                             \
    mc_model_check(&m, &e);                                          \
    mc_layout_check(&m, &l, &t, 8, &e);                              \
    CHECK(mc_errlist_has(&e, needle), "expected \"%s\" (%d problems, first: %s)", needle, e.n, e.n ? e.msg[0] : "-"); \
  } while (0)
  EXPECT("tp=3 does not divide n_heads=8", l.tp = 3);
  EXPECT("tp=8 does not divide n_kv_heads=4", l.tp = 8);
  EXPECT("tp=2 does not divide mamba_heads (mamba_inner/mamba_head_dim)=3", (l.tp = 2, m.mamba_inner = 48));
  EXPECT("tp=2 does not divide padded vocab=999", (l.tp = 2, m.vocab_pad = 1, m.vocab_size = 999, m.n_heads = 8));
  EXPECT("tp=2 does not divide rec_width=63", (l.tp = 2, m.rec_width = 63));
  EXPECT("ep=3 does not divide n_experts=8", (l.ep = 3, l.dp = 3));
  EXPECT("ep=4 does not divide tp*dp=2", (l.ep = 4, l.dp = 2));
  EXPECT("tp=2 with ep=2 requires sp", (l.tp = 2, l.ep = 2, l.sp = 0));
  EXPECT("has 1 pipes but pp=3 needs pp-1=2", (l.pp = 3, l.split = MC_SPLIT_EXPLICIT, strcpy(l.split_pattern, "AEMEAE|MEAEMR")));
  EXPECT("does not spell the model pattern", (l.pp = 2, l.split = MC_SPLIT_EXPLICIT, strcpy(l.split_pattern, "AEMEAE|MEAEMA")));
  EXPECT("has an empty stage", (l.pp = 3, l.split = MC_SPLIT_EXPLICIT, strcpy(l.split_pattern, "AEMEAE||MEAEMR")));
  EXPECT("pp=13 leaves an empty stage", l.pp = 13);
  EXPECT("global_batch=8 is not divisible by micro_batch*dp=3*1=3", t.micro_batch = 3);
  EXPECT("does not equal the 8 ranks launched", l.dp = 2);
  EXPECT("unknown block letter 'X' at position 3", strcpy(m.pattern, "AEMXAEMEAEMR"));
  EXPECT("zero=2 is not one of 0, 1, 3", l.zero = 2);
  /* several broken rules are all reported */
  base(&m, &l);
  l.tp = 3; l.ep = 3;
  mc_errlist_init(&e);
  mc_layout_check(&m, &l, NULL, -1, &e);
  CHECK(e.n >= 3, "expected several problems, got %d", e.n);
}

static void test_stage_splits(void) {
  mc_model m; mc_layout l; mc_stage_map s;
  base(&m, &l);
  l.pp = 5;
  CHECK_OK(mc_stage_map_build(&m, &l, &s));
  int want[5] = {3, 3, 2, 2, 2};
  for (int i = 0; i < 5; i++) CHECK(s.count[i] == want[i], "equal stage %d has %d layers", i, s.count[i]);
  l.pp = 3; l.split = MC_SPLIT_EXPLICIT;
  strcpy(l.split_pattern, "A|EMEAEMEAE|MR");
  CHECK_OK(mc_stage_map_build(&m, &l, &s));
  CHECK(s.first[1] == 1 && s.count[1] == 9 && s.count[2] == 2, "explicit split: %d %d %d", s.count[0], s.count[1], s.count[2]);
  CHECK(s.stage_of_layer[0] == 0 && s.stage_of_layer[5] == 1 && s.stage_of_layer[11] == 2, "stage_of_layer");
  /* weighted: optimal under its definition (core/stages.h) against brute force over every
   * split, for several pp; the stage FLOPs add up to the model's forward + backward */
  l.split = MC_SPLIT_WEIGHTED;
  for (int pp = 1; pp <= 4; pp++) {
    l.pp = pp;
    CHECK_OK(mc_stage_map_build(&m, &l, &s));
    double F = 0, M = 0, total = 0;
    for (int i = 0; i < pp; i++) {
      F = s.flops[i] > F ? s.flops[i] : F;
      M = s.mem[i] > M ? s.mem[i] : M;
      total += s.flops[i];
      CHECK(s.count[i] >= 1, "weighted stage %d empty", i);
    }
    /* brute force over all cut sets (n = 12): max stage flops and memory of each split */
    const int n = m.n_layers;
    static double bf[1 << 11], bm[1 << 11];
    double m_star = 1e300;
    for (int mask = 0; mask < (1 << (n - 1)); mask++) {
      bf[mask] = bm[mask] = -1;
      if (__builtin_popcount((unsigned)mask) != pp - 1) continue;
      double mf = 0, mm = 0;
      for (int i = 0, st = 0, first = 0; i < n; i++)
        if (i == n - 1 || (mask >> i) & 1) {
          double f, mem;
          mc_stage_cost_of(&m, &l, st++, first, i + 1 - first, &f, &mem);
          mf = f > mf ? f : mf, mm = mem > mm ? mem : mm;
          first = i + 1;
        }
      bf[mask] = mf, bm[mask] = mm;
      m_star = mm < m_star ? mm : m_star;
    }
    const double cap = (1 + MC_SPLIT_MEM_SLACK) * m_star * (1 + 1e-12);
    double f_star = 1e300, m2 = 1e300;
    for (int mask = 0; mask < (1 << (n - 1)); mask++)
      if (bf[mask] >= 0 && bm[mask] <= cap) f_star = bf[mask] < f_star ? bf[mask] : f_star;
    for (int mask = 0; mask < (1 << (n - 1)); mask++)
      if (bf[mask] >= 0 && bm[mask] <= cap && bf[mask] <= f_star * (1 + 1e-12)) m2 = bm[mask] < m2 ? bm[mask] : m2;
    CHECK_CLOSE(F, f_star, 1e-9);
    CHECK_CLOSE(M, m2, 1e-9);
    CHECK_CLOSE(total, mc_model_fwd_bwd_flops_per_token(&m), 1e-12);
  }
  /* embed on the first stage, final norm and head on the last */
  mc_geometry g;
  l.pp = 3; l.split = MC_SPLIT_EQUAL;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  CHECK(mc_family_stage(&g, mc_family_find(&g.fams, "embed.weight")) == 0, "embed stage");
  CHECK(mc_family_stage(&g, mc_family_find(&g.fams, "head.weight")) == 2, "head stage");
  CHECK(mc_family_stage(&g, mc_family_find(&g.fams, "final_norm.weight")) == 2, "final norm stage");
  CHECK(mc_family_stage(&g, mc_family_find(&g.fams, "layers.06.ssm.w_out")) == 1, "layer 6 stage");
  mc_geometry_free(&g);
}

static void test_registry(void) {
  mc_model m; mc_layout l; mc_geometry g;
  base(&m, &l);
  l.tp = 2; l.dp = 2; l.zero = 1; l.ep = 2; l.sp = 1;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  int wk = mc_family_find(&g.fams, "layers.04.attn.wk");
  CHECK(wk >= 0, "layers.04.attn.wk exists");
  if (wk >= 0) {
    const mc_family *f = &g.fams.f[wk];
    CHECK(f->shape[0] == 32 && f->shape[1] == 64 && f->place == MC_PLACE_TP && f->split_dim == 0 && f->decay, "wk shape/rule");
    char rule[64];
    mc_placement_rule(&g, wk, rule, sizeof rule);
    CHECK(!strcmp(rule, "tp(dim=0) x zero_balanced_v2(dim=0)"), "rule %s", rule);
  }
  int w2 = mc_family_find(&g.fams, "layers.01.moe.w2");
  CHECK(w2 >= 0 && g.fams.f[w2].shape[0] == 8 && g.fams.f[w2].shape[1] == 64 && g.fams.f[w2].shape[2] == 32, "w2 shape");
  int alog = mc_family_find(&g.fams, "layers.02.ssm.A_log");
  CHECK(alog >= 0 && !g.fams.f[alog].decay && g.fams.f[alog].shape[0] == 8, "A_log no decay, [Hm]");
  int wb = mc_family_find(&g.fams, "layers.02.ssm.w_B");
  CHECK(wb >= 0 && g.fams.f[wb].tp_partial_grad && g.fams.f[wb].place == MC_PLACE_REPLICATED, "w_B partial grad");
  int head = mc_family_find(&g.fams, "head.weight");
  CHECK(head >= 0 && g.fams.f[head].shape[0] == 1024, "head padded to 1024 rows");
  char rule_v2[64];
  /* EP + ZeRO: rank 3 (tp1, dp1): li=3, ep_rank=1 owns experts [4,8); expert-DP group of
   * size 2, index 1 -> rows [6,8) */
  mc_shard s;
  CHECK_OK(mc_shard_of(&g, w2, MC_STATE_EXP_AVG, 3, &s));
  CHECK(s.local_start[0] == 4 && s.local_count[0] == 4 && s.start[0] == 6 && s.count[0] == 2 && s.primary, "ep/zero slab %lld+%lld",
        (long long)s.start[0], (long long)s.count[0]);
  mc_geometry_free(&g);
  /* balanced-v2 with fewer local experts than expert-DP members: tp2 dp8 ep2, 4 experts a
   * rank, groups of 8: w2 [8, 64, 32] is split on dim 1, two members an expert. Rank 13
   * (tp1, dp6): li 13, ep_rank 1 (experts [4, 8)), index 6: expert 7, rows [0, 32) of dim 1. */
  l.dp = 8;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  CHECK_OK(mc_shard_of(&g, w2, MC_STATE_PARAM, 13, &s));
  CHECK(s.zero_dim == 1 && s.start[0] == 7 && s.count[0] == 1 && s.start[1] == 0 && s.count[1] == 32 && s.count[2] == 32,
        "balanced-v2 expert part [%lld+%lld, %lld+%lld, %lld]", (long long)s.start[0], (long long)s.count[0], (long long)s.start[1],
        (long long)s.count[1], (long long)s.count[2]);
  mc_placement_rule(&g, w2, rule_v2, sizeof rule_v2);
  CHECK(!strcmp(rule_v2, "ep(dim=0) x zero_balanced_v2(dim=1)"), "rule %s", rule_v2);
  mc_geometry_free(&g);
  /* the same under the balanced rule (format version 2 before balanced-v2): dim 0, half the
   * members empty */
  l.own_rule = MC_OWN_BALANCED;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  CHECK_OK(mc_shard_of(&g, w2, MC_STATE_PARAM, 13, &s));
  CHECK(s.zero_dim == 0 && s.count[0] == 0, "balanced: index 6 of 8 holds %lld of 4 experts", (long long)s.count[0]);
  mc_placement_rule(&g, wk, rule_v2, sizeof rule_v2);
  CHECK(!strcmp(rule_v2, "tp(dim=0) x zero_balanced(dim=0)"), "balanced rule %s", rule_v2);
  mc_geometry_free(&g);
  l.dp = 2;
  /* the chunked rule (format version 1) names its ZeRO part zero(dim=0) */
  l.own_rule = MC_OWN_CHUNKED;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &g));
  char rule[64];
  mc_placement_rule(&g, wk, rule, sizeof rule);
  CHECK(!strcmp(rule, "tp(dim=0) x zero(dim=0)"), "chunked rule %s", rule);
  CHECK(!strcmp(mc_own_rule_name(MC_OWN_CHUNKED), "chunked") && mc_own_rule_parse("balanced") == MC_OWN_BALANCED &&
            mc_own_rule_parse("balanced-v2") == MC_OWN_BALANCED_V2 && MC_OWN_BALANCED_V2 == 0 && mc_own_rule_parse("lumpy") < 0,
        "rule names (0, every new layout's: balanced-v2)");
  mc_geometry_free(&g);
  l.own_rule = 7;
  CHECK(mc_geometry_build(&m, &l, NULL, -1, &g) != 0 && strstr(mc_errmsg(), "ownership rule 7 unknown"), "bad rule: %s", mc_errmsg());
}

/* A one-stage explicit split survives the trip through the config JSON (manifests do this). */
static void test_single_stage_explicit(void) {
  mc_config cfg;
  CHECK_OK(mc_config_default(&cfg));
  cfg.parallel.split = MC_SPLIT_EXPLICIT;
  snprintf(cfg.parallel.split_pattern, sizeof cfg.parallel.split_pattern, "%s", cfg.model.pattern);
  mc_geometry g;
  CHECK_OK(mc_geometry_build(&cfg.model, &cfg.parallel, NULL, -1, &g));
  CHECK(g.layout.split == MC_SPLIT_EQUAL, "one-stage explicit split recorded as %s", mc_split_name(g.layout.split));
  cfg.parallel = g.layout;
  char *json = mc_config_to_json(&cfg);
  mc_config back;
  CHECK_OK(mc_config_default(&back));
  CHECK_OK(mc_config_apply_json(&back, json, "round trip"));
  free(json);
  mc_geometry_free(&g);
}

int main(void) {
  test_single_stage_explicit();
  test_validation_messages();
  test_stage_splits();
  test_registry();
  test_zero_rows();
  test_zero_part();
  test_random_layouts();
  return mc_check_exit("test_ownership");
}
