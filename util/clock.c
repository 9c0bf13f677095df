#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "util/clock.h"

#include <time.h>

double mc_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
