#define _POSIX_C_SOURCE 200809L /* pread() */

#include "util/fileio.h"

#include <errno.h>
#include <unistd.h>

int64_t mc_pread_full(int fd, void *buf, int64_t n, int64_t off) {
  int64_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, (size_t)(n - got), (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break; /* end of file */
    got += r;
  }
  return got;
}
