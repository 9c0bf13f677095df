#include "core/stages.h"

#include <float.h>
#include <string.h>

#include "core/cost.h"
#include "core/layout.h"

/* Per-layer prefix sums of the cost model and the per-stage extras (embedding, head). */
typedef struct {
  int n, pp;
  double t[MC_MAX_LAYERS + 1], st[MC_MAX_LAYERS + 1], act[MC_MAX_LAYERS + 1];
  double first_t, last_t, first_mem, last_mem;
} split_costs;

static void costs_of(const mc_model *m, const mc_layout *l, split_costs *c) {
  c->n = m->n_layers, c->pp = l->pp;
  c->t[0] = c->st[0] = c->act[0] = 0;
  for (int i = 0; i < c->n; i++) {
    const char b = m->pattern[i];
    c->t[i + 1] = c->t[i] + mc_block_fwd_flops(m, b) + mc_block_bwd_flops(m, b);
    c->st[i + 1] = c->st[i] + mc_block_state_bytes(m, l, b);
    c->act[i + 1] = c->act[i] + mc_block_act_bytes(m, l, b);
  }
  c->first_t = mc_embed_fwd_flops(m) + mc_embed_bwd_flops(m);
  c->last_t = mc_head_fwd_flops(m) + mc_head_bwd_flops(m);
  c->first_mem = mc_embed_state_bytes(m, l);
  c->last_mem = mc_head_state_bytes(m, l) + mc_head_act_bytes(m, l);
}

/* Stage s holding layers [j, i). */
static double stage_t(const split_costs *c, int s, int j, int i) {
  return c->t[i] - c->t[j] + (s == 0 ? c->first_t : 0) + (s == c->pp - 1 ? c->last_t : 0);
}

static double stage_mem(const split_costs *c, int s, int j, int i) {
  return c->st[i] - c->st[j] + (double)(c->pp - s) * (c->act[i] - c->act[j]) + (s == 0 ? c->first_mem : 0) +
         (s == c->pp - 1 ? c->last_mem : 0);
}

void mc_stage_cost_of(const mc_model *m, const mc_layout *l, int s, int first, int count, double *flops, double *mem) {
  static split_costs c;
  costs_of(m, l, &c);
  *flops = stage_t(&c, s, first, first + count);
  *mem = stage_mem(&c, s, first, first + count);
}

static int within(double v, double cap) { return v <= cap * (1 + 1e-12); }

/* Minimises the largest stage time (by_mem = 0) or memory (by_mem = 1) over contiguous splits
 * of the n layers into pp non-empty stages whose every stage stays within t_cap and m_cap
 * (classic linear partition, O(pp*n^2)); ties go to the earliest boundary. Returns the
 * optimum (DBL_MAX when no split is feasible) and writes the split's first layers. */
static double minmax_split(const split_costs *c, int by_mem, double t_cap, double m_cap, int *first) {
  static double best[MC_MAX_STAGES + 1][MC_MAX_LAYERS + 1];
  static int cut[MC_MAX_STAGES + 1][MC_MAX_LAYERS + 1];
  const int n = c->n, pp = c->pp;
  /* best[s][i]: the smallest largest cost of splitting layers [0, i) into stages 0..s-1 */
  for (int s = 0; s <= pp; s++)
    for (int i = 0; i <= n; i++) best[s][i] = DBL_MAX;
  best[0][0] = 0;
  for (int s = 1; s <= pp; s++)
    for (int i = s; i <= n - (pp - s); i++)
      for (int j = s - 1; j < i; j++) {
        if (best[s - 1][j] == DBL_MAX) continue;
        const double t = stage_t(c, s - 1, j, i), mem = stage_mem(c, s - 1, j, i);
        if (!within(t, t_cap) || !within(mem, m_cap)) continue;
        const double cost = by_mem ? mem : t;
        const double v = best[s - 1][j] > cost ? best[s - 1][j] : cost;
        if (v < best[s][i] * (1 - 1e-12)) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
  if (best[pp][n] == DBL_MAX) return DBL_MAX;
  for (int s = pp, i = n; s >= 1; s--) {
    first[s - 1] = cut[s][i];
    i = cut[s][i];
  }
  return best[pp][n];
}

static void weighted_split(const mc_model *m, const mc_layout *l, int *first) {
  static split_costs c;
  costs_of(m, l, &c);
  const double m_star = minmax_split(&c, 1, DBL_MAX, DBL_MAX, first);
  const double m_cap = (1 + MC_SPLIT_MEM_SLACK) * m_star;
  const double f_star = minmax_split(&c, 0, DBL_MAX, m_cap, first);
  /* the memory-optimal split is feasible, so neither pass above fails; nor does this one */
  minmax_split(&c, 1, f_star, m_cap, first);
}

int mc_stage_map_build(const mc_model *m, const mc_layout *l, mc_stage_map *out) {
  int n = m->n_layers, pp = l->pp;
  memset(out, 0, sizeof *out);
  if (pp < 1 || pp > MC_MAX_STAGES) return mc_error("pp=%d is outside [1, %d]", pp, MC_MAX_STAGES);
  if (pp > n) return mc_error("pp=%d leaves an empty stage: the model has only %d layers", pp, n);
  out->pp = pp;
  if (l->split == MC_SPLIT_EQUAL) {
    for (int s = 0, at = 0; s < pp; s++) {
      out->first[s] = at;
      at += n / pp + (s < n % pp ? 1 : 0);
    }
  } else if (l->split == MC_SPLIT_WEIGHTED) {
    weighted_split(m, l, out->first);
  } else {
    int s = 0, at = 0;
    out->first[0] = 0;
    for (const char *p = l->split_pattern; *p; p++) {
      if (*p == '|') {
        if (++s >= pp) return mc_error("explicit split \"%s\" has more than pp-1=%d pipes", l->split_pattern, pp - 1);
        out->first[s] = at;
      } else {
        if (at >= n || m->pattern[at] != *p)
          return mc_error("explicit split \"%s\" does not spell the model pattern \"%s\"", l->split_pattern, m->pattern);
        at++;
      }
    }
    if (s != pp - 1) return mc_error("explicit split \"%s\" has %d pipes but pp=%d needs %d", l->split_pattern, s, pp, pp - 1);
    if (at != n) return mc_error("explicit split \"%s\" does not spell the model pattern \"%s\"", l->split_pattern, m->pattern);
  }
  static split_costs c;
  costs_of(m, l, &c);
  for (int s = 0; s < pp; s++) {
    int end = s + 1 < pp ? out->first[s + 1] : n;
    out->count[s] = end - out->first[s];
    if (out->count[s] < 1) return mc_error("stage %d of the %s split is empty", s, mc_split_name(l->split));
    out->cost[s] = s == 0 ? mc_embed_fwd_flops(m) : 0;
    out->bwd[s] = s == 0 ? mc_embed_bwd_flops(m) : 0;
    for (int i = out->first[s]; i < end; i++) {
      out->stage_of_layer[i] = s;
      out->cost[s] += mc_block_fwd_flops(m, m->pattern[i]);
      out->bwd[s] += mc_block_bwd_flops(m, m->pattern[i]);
    }
    if (s == pp - 1) out->cost[s] += mc_head_fwd_flops(m), out->bwd[s] += mc_head_bwd_flops(m);
    out->flops[s] = stage_t(&c, s, out->first[s], end);
    out->mem[s] = stage_mem(&c, s, out->first[s], end);
  }
  return 0;
}
