/* Elapsed-time measurement for progress lines and load statistics. */
#ifndef MC_UTIL_CLOCK_H
#define MC_UTIL_CLOCK_H

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): differences time intervals; the origin
 * means nothing. */
double mc_now_s(void);

#endif
