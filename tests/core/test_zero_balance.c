/* The balance of the ZeRO rule: on the reference layouts (every configuration in configs/ as written,
 * tp2 x dp8 x pp2 x ep4 on nam-medium, and nam-medium on 4096 ranks: tp2 pp4 dp512 ep8 sp) the
 * largest rank's optimizer bytes (fp32 master copies and both moments, core/holdings.h, as
 * mcplan reports them) are at most 1.05x the mean under the balanced-v2 rule, and never more
 * than under the older rules there. Prints the chunked and balanced rules' figures beside them,
 * and those of stress layouts with few rows per ZeRO group (not bounded: pipeline stages differ
 * in what they hold). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/config.h"
#include "core/holdings.h"

/* largest / mean optimizer bytes per rank over the world; -1 if the layout is invalid. *within:
 * the same within one pipeline stage, the largest over the stages (what the ZeRO rule decides:
 * the stages hold different families). */
static double ratio(const mc_config *cfg, int rule, double *within) {
  mc_layout l = cfg->parallel;
  l.own_rule = rule;
  mc_geometry g;
  if (mc_geometry_build(&cfg->model, &l, &cfg->train, -1, &g) != 0) return -1;
  mc_hold_opts o;
  double total = 0, largest = 0;
  if (mc_hold_opts_of(&g, &cfg->train, &o) != 0) {
    mc_geometry_free(&g);
    return -1;
  }
  double *st_total = calloc((size_t)l.pp, sizeof(double)), *st_largest = calloc((size_t)l.pp, sizeof(double));
  const int per_stage = l.tp * l.dp;
  for (int r = 0; r < g.world; r++) {
    int64_t b[MC_MEM_COUNT];
    CHECK_OK(mc_holdings_of(&g, r, &o, b));
    double opt = (double)(b[MC_MEM_MASTER_DECAY] + b[MC_MEM_MASTER_NO_DECAY] + b[MC_MEM_MOMENTS_DECAY] + b[MC_MEM_MOMENTS_NO_DECAY]);
    total += opt;
    largest = opt > largest ? opt : largest;
    const int s = r / per_stage; /* TP innermost, then DP: a stage's ranks are consecutive */
    st_total[s] += opt;
    st_largest[s] = opt > st_largest[s] ? opt : st_largest[s];
  }
  *within = 1.0;
  for (int s = 0; s < l.pp; s++)
    if (st_total[s] > 0 && st_largest[s] / (st_total[s] / per_stage) > *within) *within = st_largest[s] / (st_total[s] / per_stage);
  free(st_total);
  free(st_largest);
  int world = g.world;
  mc_geometry_free(&g);
  return total > 0 ? largest / (total / world) : 1.0;
}

static void layout(const char *name, const char *const *sets, int bounded) {
  const char *src = getenv("MC_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/%s", src ? src : ".", name);
  mc_config cfg;
  CHECK_OK(mc_config_default(&cfg));
  CHECK_OK(mc_config_apply_file(&cfg, path));
  char what[512];
  int n = snprintf(what, sizeof what, "%s", name);
  for (int i = 0; sets && sets[i]; i++) {
    CHECK_OK(mc_config_set(&cfg, sets[i]));
    n += snprintf(what + n, sizeof what - (size_t)n, " %s", sets[i]);
  }
  double wc, wb, wv;
  double chunked = ratio(&cfg, MC_OWN_CHUNKED, &wc), balanced = ratio(&cfg, MC_OWN_BALANCED, &wb),
         v2 = ratio(&cfg, MC_OWN_BALANCED_V2, &wv);
  CHECK(chunked > 0 && balanced > 0 && v2 > 0, "%s: layout invalid: %s", what, mc_errmsg());
  printf("%s\n  largest/mean optimizer bytes, world (within the fullest stage): chunked %.4f (%.4f), balanced %.4f (%.4f), "
         "balanced-v2 %.4f (%.4f)\n", what, chunked, wc, balanced, wb, v2, wv);
  CHECK(balanced <= chunked + 1e-9, "%s: balanced %.4f worse than chunked %.4f", what, balanced, chunked);
  if (!bounded) return;
  CHECK(wv <= 1.05, "%s: within a stage, the largest rank holds %.4fx the stage's mean optimizer bytes", what, wv);
  if (bounded > 1) CHECK(v2 <= 1.05, "%s: largest rank holds %.4fx the mean optimizer bytes", what, v2);
  CHECK(v2 <= balanced + 1e-9, "%s: balanced-v2 %.4f worse than balanced %.4f", what, v2, balanced);
}

int main(void) {
  static const char *const refs[] = {"default.json", "tiny.json", "dense-a.json", "nam-small.json", "nam-medium.json"};
  for (int i = 0; i < 5; i++) layout(refs[i], NULL, 2);
  static const char *const big[] = {"parallel.tp=2", "parallel.dp=8", "parallel.pp=2", "parallel.ep=4", "parallel.sp=true", NULL};
  layout("nam-medium.json", big, 2);
  static const char *const huge[] = {"parallel.tp=2", "parallel.dp=512", "parallel.pp=4", "parallel.ep=8", "parallel.sp=true",
                                     "train.global_batch=1024", NULL};
  layout("nam-medium.json", huge, 1);
  static const char *const huge_w[] = {"parallel.tp=2", "parallel.dp=512", "parallel.pp=4", "parallel.ep=8", "parallel.sp=true",
                                       "train.global_batch=1024", "parallel.pp_split=weighted", NULL};
  layout("nam-medium.json", huge_w, 0);
  static const char *const small[] = {"parallel.tp=2", "parallel.dp=8", "parallel.pp=2", "parallel.ep=4", "parallel.sp=true",
                                      "parallel.zero=1", "train.global_batch=64", NULL};
  layout("nam-small.json", small, 0);
  layout("tiny.json", small, 0);
  static const char *const dp8[] = {"parallel.dp=8", "parallel.zero=1", "train.global_batch=64", NULL};
  layout("nam-small.json", dp8, 0);
  layout("tiny.json", dp8, 0);
  return mc_check_exit("test_zero_balance");
}
