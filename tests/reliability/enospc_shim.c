/* An LD_PRELOAD shim that makes a disk look full (tests/reliability/test_full_disk.py): writes to
 * files whose path contains $MC_ENOSPC_MATCH fail with ENOSPC once $MC_ENOSPC_AFTER bytes have
 * been written to such files (fsync too, after that). Other files are untouched. Built only
 * for the tests; no MegaC code links it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long budget = -2; /* -2: not read yet, -1: off */

static int matches(int fd) {
  if (budget == -2) {
    const char *a = getenv("MC_ENOSPC_AFTER");
    budget = a && getenv("MC_ENOSPC_MATCH") ? atoll(a) : -1;
  }
  if (budget == -1) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strstr(path, getenv("MC_ENOSPC_MATCH")) != NULL;
}

/* 0 if `bytes` may be written, else -1 with errno = ENOSPC. */
static int spend(int fd, size_t bytes) {
  if (!matches(fd)) return 0;
  if ((long long)bytes > budget) {
    budget = 0;
    errno = ENOSPC;
    return -1;
  }
  budget -= (long long)bytes;
  return 0;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef int (*fsync_fn)(int);
/* The next definition of a symbol (libc's), looked up once. dlsym returns void *; the
 * conversion to a function pointer goes through memcpy to stay ISO C. */
#define REAL(name, type)                                 \
  static type real_##name;                               \
  if (!real_##name) {                                    \
    void *sym = dlsym(RTLD_NEXT, #name);                 \
    memcpy(&real_##name, &sym, sizeof sym);              \
  }

ssize_t write(int fd, const void *buf, size_t n) {
  REAL(write, write_fn)
  return spend(fd, n) ? -1 : real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite, pwrite_fn)
  return spend(fd, n) ? -1 : real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite64, pwrite_fn)
  return spend(fd, n) ? -1 : real_pwrite64(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
  REAL(writev, writev_fn)
  size_t n = 0;
  for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
  return spend(fd, n) ? -1 : real_writev(fd, iov, cnt);
}

int fsync(int fd) {
  REAL(fsync, fsync_fn)
  if (matches(fd) && budget == 0) {
    errno = ENOSPC;
    return -1;
  }
  return real_fsync(fd);
}
