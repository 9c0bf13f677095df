/* The backends' environment knobs (kernels/backend_env.h): defaults when unset or empty,
 * values inside the table's range taken, anything else refused naming the variable. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_env.h"
#include "tests/check.h"
#include "util/error.h"

static void refused(const char *name, const char *value) {
  setenv(name, value, 1);
  CHECK(mc_backend_env_check() != 0 && strstr(mc_errmsg(), name) && strstr(mc_errmsg(), value),
        "%s=%s should be refused naming it: %s", name, value, mc_errmsg());
  unsetenv(name);
}

int main(void) {
  const char *names[] = {"MC_CUDA_LT", "MC_CUDA_LT_LANES", "MC_CUDA_GROUP_EACH_MACS", "MC_CUDA_PROFILE_STEPS"};
  for (int i = 0; i < 4; i++) unsetenv(names[i]);
  CHECK_OK(mc_backend_env_check());
  CHECK(mc_backend_env(MC_ENV_CUDA_LT) == 1 && mc_backend_env(MC_ENV_CUDA_LT_LANES) == 4 &&
            mc_backend_env(MC_ENV_CUDA_GROUP_EACH_MACS) == 4194304,
        "defaults");
  setenv("MC_CUDA_LT_LANES", "", 1); /* empty: the default */
  CHECK(mc_backend_env_check() == 0 && mc_backend_env(MC_ENV_CUDA_LT_LANES) == 4, "empty MC_CUDA_LT_LANES");
  setenv("MC_CUDA_LT", "0", 1), setenv("MC_CUDA_LT_LANES", "1", 1), setenv("MC_CUDA_GROUP_EACH_MACS", "0", 1);
  setenv("MC_CUDA_PROFILE_STEPS", "21:25", 1);
  CHECK(mc_backend_env_check() == 0 && mc_backend_env(MC_ENV_CUDA_LT) == 0 && mc_backend_env(MC_ENV_CUDA_LT_LANES) == 1 &&
            mc_backend_env(MC_ENV_CUDA_GROUP_EACH_MACS) == 0,
        "values in range: %s", mc_errmsg());
  long long a = 0, b = 0;
  CHECK(mc_env_step_range("MC_CUDA_PROFILE_STEPS", "21:25", &a, &b) == 0 && a == 21 && b == 25, "step range");
  for (int i = 0; i < 4; i++) unsetenv(names[i]);
  refused("MC_CUDA_LT", "2");
  refused("MC_CUDA_LT", "yes");
  refused("MC_CUDA_LT_LANES", "0");
  refused("MC_CUDA_LT_LANES", "9");
  refused("MC_CUDA_LT_LANES", "2.5");
  refused("MC_CUDA_LT_LANES", "3x");
  refused("MC_CUDA_GROUP_EACH_MACS", "-1");
  refused("MC_CUDA_GROUP_EACH_MACS", "many");
  refused("MC_CUDA_PROFILE_STEPS", "5");
  refused("MC_CUDA_PROFILE_STEPS", "0:3");
  refused("MC_CUDA_PROFILE_STEPS", "7:3");
  refused("MC_CUDA_PROFILE_STEPS", "3:7x");
  /* an invalid value reads as the default (the check refuses it before a backend runs) */
  setenv("MC_CUDA_LT_LANES", "9", 1);
  CHECK(mc_backend_env(MC_ENV_CUDA_LT_LANES) == 4, "an invalid value reads as the default");
  unsetenv("MC_CUDA_LT_LANES");
  return mc_check_exit("test_backend_env");
}
