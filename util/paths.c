/* Output-path safety: regular-file outputs and disjoint destinations (util/paths.h). */
#define _DEFAULT_SOURCE /* realpath */
#include "util/paths.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

int mc_output_file_ok(const char *path, const char *what) {
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* absent (or a dangling link: the rename replaces the link) */
  if (S_ISREG(st.st_mode)) return 0;
  return mc_error("%s %s exists and is not a regular file (%s); refusing to replace it", what, path, kind_of(st.st_mode));
}

/* out (PATH_MAX) = the absolute, resolved form of path; a missing tail is appended as given. */
static int resolve(const char *path, char *out) {
  if (realpath(path, out)) return 0;
  if (errno != ENOENT) return mc_error("%s: cannot resolve: %s", path, strerror(errno));
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return mc_error("%s: path too long", path);
  size_t n = strlen(buf);
  while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
  char *slash = strrchr(buf, '/');
  const char *base = slash ? slash + 1 : buf;
  char parent[PATH_MAX];
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == buf) snprintf(parent, sizeof parent, "/");
  else snprintf(parent, sizeof parent, "%.*s", (int)(slash - buf), buf);
  if (!strcmp(base, ".") || !strcmp(base, "..")) return mc_error("%s: cannot resolve", path);
  char rp[PATH_MAX];
  if (resolve(parent, rp) != 0) return -1;
  if (snprintf(out, PATH_MAX, "%s%s%s", rp, strcmp(rp, "/") ? "/" : "", base) >= PATH_MAX)
    return mc_error("%s: path too long", path);
  return 0;
}

/* 1 if inner is outer or lies inside it (both resolved). */
static int within(const char *inner, const char *outer) {
  size_t n = strlen(outer);
  if (!strcmp(outer, "/")) return 1;
  return strncmp(inner, outer, n) == 0 && (inner[n] == 0 || inner[n] == '/');
}

int mc_paths_overlap(const char *a, const char *b) {
  char ra[PATH_MAX], rb[PATH_MAX];
  if (resolve(a, ra) != 0 || resolve(b, rb) != 0) return -1;
  return within(ra, rb) || within(rb, ra);
}

int mc_check_disjoint(const char *dst, const char *dst_what, const char *src, const char *src_what) {
  int o = mc_paths_overlap(dst, src);
  if (o < 0) return -1;
  if (o) return mc_error("%s %s is, contains or lies inside %s %s; refusing to overwrite it", dst_what, dst, src_what, src);
  return 0;
}
