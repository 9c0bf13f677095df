/* The balance of the ZeRO rule: on the reference layouts (every configuration in configs/ as written, and
 * tp2 x dp8 x pp2 x ep4 on nam-medium) the largest rank's optimizer bytes (fp32 master copies
 * and both moments, core/holdings.h, as mcplan reports them) are at most 1.05x the mean under
 * the balanced rule. Prints the chunked rule's figures beside them, and those of stress layouts
 * with few rows per ZeRO group (not bounded: pipeline stages differ in what they hold). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/config.h"
#include "core/holdings.h"

/* largest / mean optimizer bytes per rank; -1 if the layout is invalid */
static double ratio(const mc_config *cfg, int rule) {
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
  for (int r = 0; r < g.world; r++) {
    int64_t b[MC_MEM_COUNT];
    CHECK_OK(mc_holdings_of(&g, r, &o, b));
    double opt = (double)(b[MC_MEM_MASTER_DECAY] + b[MC_MEM_MASTER_NO_DECAY] + b[MC_MEM_MOMENTS_DECAY] + b[MC_MEM_MOMENTS_NO_DECAY]);
    total += opt;
    largest = opt > largest ? opt : largest;
  }
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
  double chunked = ratio(&cfg, MC_OWN_CHUNKED), balanced = ratio(&cfg, MC_OWN_BALANCED);
  CHECK(chunked > 0 && balanced > 0, "%s: layout invalid: %s", what, mc_errmsg());
  printf("%-100s largest/mean optimizer bytes: chunked %.4f, balanced %.4f\n", what, chunked, balanced);
  if (bounded) CHECK(balanced <= 1.05, "%s: largest rank holds %.4fx the mean optimizer bytes", what, balanced);
  CHECK(balanced <= chunked + 1e-9, "%s: balanced %.4f worse than chunked %.4f", what, balanced, chunked);
}

int main(void) {
  static const char *const refs[] = {"default.json", "tiny.json", "dense-a.json", "nam-small.json", "nam-medium.json"};
  for (int i = 0; i < 5; i++) layout(refs[i], NULL, 1);
  static const char *const big[] = {"parallel.tp=2", "parallel.dp=8", "parallel.pp=2", "parallel.ep=4", "parallel.sp=true", NULL};
  layout("nam-medium.json", big, 1);
  static const char *const small[] = {"parallel.tp=2", "parallel.dp=8", "parallel.pp=2", "parallel.ep=4", "parallel.sp=true",
                                      "parallel.zero=1", "train.global_batch=64", NULL};
  layout("nam-small.json", small, 0);
  layout("tiny.json", small, 0);
  static const char *const dp8[] = {"parallel.dp=8", "parallel.zero=1", "train.global_batch=64", NULL};
  layout("nam-small.json", dp8, 0);
  layout("tiny.json", dp8, 0);
  return mc_check_exit("test_zero_balance");
}
