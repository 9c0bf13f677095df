/* The backends' environment knobs (MC_CUDA_*): one table names each variable, what values it
 * takes and what it does. They are for measuring one path against another, not settings of
 * a run, but a value outside the table is refused like a bad config key: the CUDA backend's
 * set-up fails naming the variable (mc_backend_env_check), instead of running on a default.
 * Pure C, so the CPU suite checks the parsing. */
#ifndef MC_KERNELS_BACKEND_ENV_H
#define MC_KERNELS_BACKEND_ENV_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MC_ENV_CUDA_LT,               /* 0 or 1 (default 1): cuBLASLt for the bf16 products */
  MC_ENV_CUDA_LT_LANES,         /* 1..4 (default 4): streams the grouped expert products spread over */
  MC_ENV_CUDA_GROUP_EACH_MACS,  /* >= 0 (default 2^22): mean multiply-adds per group from which a grouped
                                   product runs group by group */
  MC_ENV_COUNT
} mc_env_knob;

/* Every knob's current value is valid (unset or empty: its default), and so is
 * MC_CUDA_PROFILE_STEPS where set: 0, or -1 with mc_error naming the variable, its value and
 * what it accepts. */
int mc_backend_env_check(void);

/* The knob's value (its default when unset or empty; the default too when invalid, which
 * mc_backend_env_check refuses before any backend runs). */
double mc_backend_env(mc_env_knob k);

/* "A:B" with 1 <= A <= B: 0 with the two values, -1 with mc_error naming `name` otherwise
 * (MC_CUDA_PROFILE_STEPS: training steps whose ops the profile counts). */
int mc_env_step_range(const char *name, const char *text, long long *a, long long *b);

#ifdef __cplusplus
}
#endif

#endif
