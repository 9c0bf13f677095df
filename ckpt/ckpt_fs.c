/* Durable file operations for the commit protocol, and the fault-injection hook that lets
 * tests fail (or crash) the save at each of its steps. */
#define _GNU_SOURCE /* sync_file_range */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "util/error.h"

/* Every step of the save path, in protocol order (docs/checkpoint.md lists what each does). */
const char *const mc_ckpt_fault_points[] = {
    "prepare",        /* removing stale temporary directories, creating step_<N>.tmp */
    "write_data",     /* writing shard data into a rank file (after the first dataset) */
    "fsync_file",     /* fsync of a rank file */
    "read_back",      /* root reads back the rank files' attributes */
    "write_manifest", /* writing manifest.json */
    "fsync_manifest", /* fsync of manifest.json */
    "fsync_tmpdir",   /* fsync of step_<N>.tmp */
    "rename_dir",     /* rename step_<N>.tmp -> step_<N> */
    "fsync_parent",   /* fsync of the checkpoint directory */
    "write_latest",   /* writing latest.tmp */
    "fsync_latest",   /* fsync of latest.tmp */
    "rename_latest",  /* rename latest.tmp -> latest */
};
const int mc_ckpt_n_fault_points = (int)(sizeof mc_ckpt_fault_points / sizeof mc_ckpt_fault_points[0]);

static char g_fault[64];
static int g_fault_crash;
static int g_fault_set;

int mc_ckpt_set_fault(const char *point, int crash) {
  if (!point) {
    g_fault_set = 0;
    g_fault[0] = 0;
    return 0;
  }
  for (int i = 0; i < mc_ckpt_n_fault_points; i++)
    if (strcmp(point, mc_ckpt_fault_points[i]) == 0) {
      snprintf(g_fault, sizeof g_fault, "%s", point);
      g_fault_crash = crash;
      g_fault_set = 1;
      return 0;
    }
  return mc_error("unknown checkpoint fault point '%s'", point);
}

int mc_ckpt_fault(const char *point) {
  const char *name = NULL;
  int crash = 0;
  char env[80];
  if (g_fault_set) {
    name = g_fault;
    crash = g_fault_crash;
  } else {
    const char *e = getenv("MC_CKPT_FAULT");
    if (!e || !*e) return 0;
    snprintf(env, sizeof env, "%s", e);
    char *colon = strchr(env, ':');
    if (colon) {
      *colon = 0;
      crash = strcmp(colon + 1, "crash") == 0;
    }
    name = env;
  }
  if (strcmp(name, point) != 0) return 0;
  if (crash) _exit(3);
  errno = ENOSPC;
  return mc_error("injected fault at '%s': %s", point, strerror(ENOSPC));
}

int mc_path_join(char *out, const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  if (a + 1 + b + 1 > MC_PATH_MAX) return mc_error("path too long: %s/%s", dir, name);
  memcpy(out, dir, a);
  out[a] = '/';
  memcpy(out + a + 1, name, b + 1);
  return 0;
}

void mc_start_writeback(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  close(fd);
}

int mc_fsync_path(const char *path, int is_dir) {
  int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return mc_error("%s: cannot open for fsync: %s", path, strerror(errno));
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return mc_error("%s: fsync failed: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

int mc_mkdir_p(const char *path) {
  char buf[MC_PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return mc_error("path too long: %s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return mc_error("%s: cannot create directory: %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST)
    return mc_error("%s: cannot create directory: %s", buf, strerror(errno));
  return 0;
}

int mc_rmtree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : mc_error("%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return mc_error("%s: cannot open directory: %s", path, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char sub[MC_PATH_MAX];
      if (mc_path_join(sub, path, e->d_name) != 0) {
        rc = -1;
        continue;
      }
      if (mc_rmtree(sub) != 0) rc = -1;
    }
    closedir(d);
    if (rc) return rc;
    if (rmdir(path) != 0) return mc_error("%s: cannot remove directory: %s", path, strerror(errno));
    return 0;
  }
  if (unlink(path) != 0) return mc_error("%s: cannot remove: %s", path, strerror(errno));
  return 0;
}

int mc_write_file_durable(const char *path, const void *data, size_t len, const char *fault_write,
                          const char *fault_fsync) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return mc_error("%s: cannot create: %s", path, strerror(errno));
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    if (fault_write && mc_ckpt_fault(fault_write)) {
      close(fd);
      return mc_error_context("%s: write failed", path);
    }
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      return mc_error("%s: write failed: %s", path, strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  if (fault_fsync && mc_ckpt_fault(fault_fsync)) {
    close(fd);
    return mc_error_context("%s: fsync failed", path);
  }
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return mc_error("%s: fsync failed: %s", path, strerror(e));
  }
  if (close(fd) != 0) return mc_error("%s: close failed: %s", path, strerror(errno));
  return 0;
}

int mc_read_file_max(const char *path, size_t max, char **data, size_t *len) {
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mc_error("%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return mc_error("%s: not a regular file (a FIFO, device or directory is refused)", path);
  }
  if ((uint64_t)st.st_size > (uint64_t)max) {
    close(fd);
    return mc_error("%s: %lld bytes, more than the %zu MiB this metadata file may have", path, (long long)st.st_size,
                    max >> 20);
  }
  /* The size is a hint only: the file may change while it is read; never read past max. */
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = malloc(cap);
  int err = 0;
  while (buf) {
    if (n + 1 == cap) {
      if (cap > max) {
        err = EFBIG;
        break;
      }
      char *nb = realloc(buf, cap * 2 > max + 1 ? max + 1 : cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      err = errno;
      break;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (!buf) return mc_error("%s: out of memory reading", path);
  if (err) {
    free(buf);
    if (err == EFBIG) return mc_error("%s: grew past the %zu MiB this metadata file may have", path, max >> 20);
    return mc_error("%s: read error: %s", path, strerror(err));
  }
  buf[n] = 0;
  *data = buf;
  if (len) *len = n;
  return 0;
}

int mc_read_file(const char *path, char **data, size_t *len) { return mc_read_file_max(path, MC_METADATA_MAX, data, len); }

int mc_file_size(const char *path, int64_t *size) {
  struct stat st;
  if (stat(path, &st) != 0) return mc_error("%s: %s", path, strerror(errno));
  *size = (int64_t)st.st_size;
  return 0;
}

int mc_path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}
