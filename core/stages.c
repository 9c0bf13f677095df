#include "core/stages.h"

#include <float.h>
#include <string.h>

#include "core/cost.h"
#include "core/layout.h"

/* Minimises the most expensive stage over contiguous splits of `n` layers into `pp` stages
 * (classic linear partition, O(pp*n^2)); ties go to the earliest boundary so the result is
 * deterministic. first_cost/last_cost are added to stages 0 and pp-1 (embedding, head). */
static void weighted_split(const double *cost, int n, int pp, double first_cost, double last_cost, int *first) {
  static double best[MC_MAX_STAGES + 1][MC_MAX_LAYERS + 1];
  static int cut[MC_MAX_STAGES + 1][MC_MAX_LAYERS + 1];
  double prefix[MC_MAX_LAYERS + 1];
  prefix[0] = 0;
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
  /* best[s][i]: minimal max-cost of splitting layers [0, i) into s stages (s < pp). */
  for (int s = 0; s <= pp; s++)
    for (int i = 0; i <= n; i++) best[s][i] = DBL_MAX;
  best[0][0] = 0;
  for (int s = 1; s <= pp; s++) {
    for (int i = s; i <= n - (pp - s); i++) {
      for (int j = s - 1; j < i; j++) {
        if (best[s - 1][j] == DBL_MAX) continue;
        double c = prefix[i] - prefix[j];
        if (s == 1) c += first_cost;
        if (s == pp) c += last_cost;
        double v = best[s - 1][j] > c ? best[s - 1][j] : c;
        if (v < best[s][i] * (1 - 1e-12)) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
    }
  }
  int i = n;
  for (int s = pp; s >= 1; s--) {
    first[s - 1] = cut[s][i];
    i = cut[s][i];
  }
}

int mc_stage_map_build(const mc_model *m, const mc_layout *l, mc_stage_map *out) {
  int n = m->n_layers, pp = l->pp;
  memset(out, 0, sizeof *out);
  if (pp < 1 || pp > MC_MAX_STAGES) return mc_error("pp=%d is outside [1, %d]", pp, MC_MAX_STAGES);
  if (pp > n) return mc_error("pp=%d leaves an empty stage: the model has only %d layers", pp, n);
  out->pp = pp;
  double cost[MC_MAX_LAYERS];
  for (int i = 0; i < n; i++) cost[i] = mc_block_fwd_flops(m, m->pattern[i]);
  if (l->split == MC_SPLIT_EQUAL) {
    for (int s = 0, at = 0; s < pp; s++) {
      out->first[s] = at;
      at += n / pp + (s < n % pp ? 1 : 0);
    }
  } else if (l->split == MC_SPLIT_WEIGHTED) {
    weighted_split(cost, n, pp, 0.0, mc_head_fwd_flops(m), out->first);
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
  for (int s = 0; s < pp; s++) {
    int end = s + 1 < pp ? out->first[s + 1] : n;
    out->count[s] = end - out->first[s];
    if (out->count[s] < 1) return mc_error("stage %d of the %s split is empty", s, mc_split_name(l->split));
    out->cost[s] = 0;
    for (int i = out->first[s]; i < end; i++) {
      out->stage_of_layer[i] = s;
      out->cost[s] += cost[i];
    }
  }
  out->cost[pp - 1] += mc_head_fwd_flops(m);
  return 0;
}
