/* Error reporting: functions return 0 on success and -1 on failure after setting a
 * thread-local message that names the file, key, tensor or rule involved. */
#ifndef MC_UTIL_ERROR_H
#define MC_UTIL_ERROR_H

#include <stddef.h>

#define MC_ERRMSG_MAX 4096

#if defined(__GNUC__)
#define MC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MC_PRINTF(a, b)
#endif

/* Set the calling thread's error message (replaces any previous one). Always returns -1. */
int mc_error(const char *fmt, ...) MC_PRINTF(1, 2);
/* Prefix the current message with more context: "ctx: previous message". Returns -1. */
int mc_error_context(const char *fmt, ...) MC_PRINTF(1, 2);
const char *mc_errmsg(void);
void mc_error_clear(void);

/* A list of problems, for validators that report every broken rule, not only the first. */
#define MC_ERRLIST_MAX 64
typedef struct {
  int n;        /* problems recorded (may exceed MC_ERRLIST_MAX; extra ones are counted only) */
  char msg[MC_ERRLIST_MAX][256];
} mc_errlist;

void mc_errlist_init(mc_errlist *l);
void mc_errlist_add(mc_errlist *l, const char *fmt, ...) MC_PRINTF(2, 3);
/* Copies the list into the thread's error message, one problem per line. Returns -1 if
 * the list is non-empty, else 0. */
int mc_errlist_raise(const mc_errlist *l, const char *header);
/* 1 if some recorded message contains `needle` (tests use it). */
int mc_errlist_has(const mc_errlist *l, const char *needle);

#endif
