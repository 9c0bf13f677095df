#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char tl_msg[MC_ERRMSG_MAX];

int mc_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
  va_end(ap);
  return -1;
}

int mc_error_context(const char *fmt, ...) {
  char prev[MC_ERRMSG_MAX];
  char ctx[1024];
  va_list ap;
  memcpy(prev, tl_msg, sizeof prev);
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  snprintf(tl_msg, sizeof tl_msg, "%s: %s", ctx, prev);
  return -1;
}

const char *mc_errmsg(void) { return tl_msg[0] ? tl_msg : "unknown error"; }

void mc_error_clear(void) { tl_msg[0] = 0; }

void mc_errlist_init(mc_errlist *l) { l->n = 0; }

void mc_errlist_add(mc_errlist *l, const char *fmt, ...) {
  if (l->n < MC_ERRLIST_MAX) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->msg[l->n], sizeof l->msg[l->n], fmt, ap);
    va_end(ap);
  }
  l->n++;
}

int mc_errlist_raise(const mc_errlist *l, const char *header) {
  if (l->n == 0) return 0;
  size_t off = 0;
  off += (size_t)snprintf(tl_msg, sizeof tl_msg, "%s (%d problem%s)", header, l->n, l->n == 1 ? "" : "s");
  int shown = l->n < MC_ERRLIST_MAX ? l->n : MC_ERRLIST_MAX;
  for (int i = 0; i < shown && off < sizeof tl_msg; i++)
    off += (size_t)snprintf(tl_msg + off, sizeof tl_msg - off, "\n  - %s", l->msg[i]);
  return -1;
}

int mc_errlist_has(const mc_errlist *l, const char *needle) {
  int shown = l->n < MC_ERRLIST_MAX ? l->n : MC_ERRLIST_MAX;
  for (int i = 0; i < shown; i++)
    if (strstr(l->msg[i], needle)) return 1;
  return 0;
}
