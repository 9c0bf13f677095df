/* The backends' environment knobs: one table, parsed and refused here (kernels/backend_env.h). */
#include "kernels/backend_env.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/error.h"

typedef struct {
  const char *name;
  double lo, hi, dflt; /* accepted range (hi = INFINITY: unbounded) and default */
  int whole;           /* a whole number */
  const char *what;
} knob;

static const knob k_knobs[MC_ENV_COUNT] = {
    [MC_ENV_CUDA_LT] = {"MC_CUDA_LT", 0, 1, 1, 1, "0 runs the bf16 products on cublasGemmEx instead of cuBLASLt"},
    [MC_ENV_CUDA_LT_LANES] = {"MC_CUDA_LT_LANES", 1, 4, 4, 1, "streams the grouped expert products spread over"},
    [MC_ENV_CUDA_GROUP_EACH_MACS] = {"MC_CUDA_GROUP_EACH_MACS", 0, INFINITY, 4194304, 0,
                                     "mean multiply-adds per group from which a grouped product runs group by group"},
};

/* The knob's value from the environment: 1 parsed into *v, 0 unset or empty, -1 invalid. */
static int parse(const knob *k, double *v) {
  const char *e = getenv(k->name);
  if (!e || !*e) return 0;
  char *end = NULL;
  const double x = strtod(e, &end);
  if (!end || *end || end == e || !(x >= k->lo && x <= k->hi) || (k->whole && x != floor(x))) return -1;
  *v = x;
  return 1;
}

int mc_backend_env_check(void) {
  const char *steps = getenv("MC_CUDA_PROFILE_STEPS");
  long long a, b;
  if (steps && *steps && mc_env_step_range("MC_CUDA_PROFILE_STEPS", steps, &a, &b)) return -1;
  for (int i = 0; i < MC_ENV_COUNT; i++) {
    const knob *k = &k_knobs[i];
    double v;
    if (parse(k, &v) >= 0) continue;
    if (isinf(k->hi))
      return mc_error("environment variable %s=%s: expected a number >= %g (%s)", k->name, getenv(k->name), k->lo,
                      k->what);
    return mc_error("environment variable %s=%s: expected a whole number from %g to %g (%s)", k->name, getenv(k->name),
                    k->lo, k->hi, k->what);
  }
  return 0;
}

double mc_backend_env(mc_env_knob i) {
  if (i < 0 || i >= MC_ENV_COUNT) return 0;
  double v = k_knobs[i].dflt;
  return parse(&k_knobs[i], &v) > 0 ? v : k_knobs[i].dflt;
}

int mc_env_step_range(const char *name, const char *text, long long *a, long long *b) {
  char tail = 0;
  if (!text || sscanf(text, "%lld:%lld%c", a, b, &tail) != 2 || *a < 1 || *b < *a)
    return mc_error("environment variable %s=%s: expected A:B with 1 <= A <= B", name, text ? text : "");
  return 0;
}
