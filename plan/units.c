#include "plan/units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "util/error.h"

static const struct {
  const char *name;
  double scale;
} units[] = {
    {"", 1.0},           {"b", 1.0},           {"kb", 1e3},          {"mb", 1e6},
    {"gb", 1e9},         {"tb", 1e12},         {"kib", 1024.0},      {"mib", 1048576.0},
    {"gib", 1073741824.0}, {"tib", 1099511627776.0},
};

int mc_parse_bytes(const char *text, int64_t *out) {
  const char *p = text;
  while (isspace((unsigned char)*p)) p++;
  if (!isdigit((unsigned char)*p) && *p != '.')
    return mc_error("'%s' is not a memory size (expected e.g. 80GiB, 512MiB, 1000000)", text);
  errno = 0;
  char *end = NULL;
  double v = strtod(p, &end);
  if (errno != 0 || end == p || !isfinite(v))
    return mc_error("'%s' is not a memory size (expected e.g. 80GiB, 512MiB, 1000000)", text);
  while (isspace((unsigned char)*end)) end++;
  const char *unit = end;
  const char *stop = unit;
  while (isalpha((unsigned char)*stop)) stop++;
  const char *rest = stop;
  while (isspace((unsigned char)*rest)) rest++;
  if (*rest != 0)
    return mc_error("'%s' is not a memory size (trailing '%s')", text, rest);
  size_t ulen = (size_t)(stop - unit);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    size_t n = 0;
    while (units[i].name[n]) n++;
    if (n == ulen && strncasecmp(unit, units[i].name, n) == 0) {
      double bytes = v * units[i].scale;
      if (bytes > 9.0e18) return mc_error("'%s' is too large a memory size", text);
      *out = (int64_t)llround(bytes);
      return 0;
    }
  }
  return mc_error("'%s' has an unknown unit '%.*s' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text,
                  (int)ulen, unit);
}

const char *mc_format_bytes(int64_t bytes, char *buf, int cap) {
  static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (fabs(v) >= 1024.0 && u < 4) v /= 1024.0, u++;
  if (u == 0) snprintf(buf, (size_t)cap, "%lld B", (long long)bytes);
  else snprintf(buf, (size_t)cap, "%.2f %s", v, names[u]);
  return buf;
}
