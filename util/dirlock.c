/* Advisory job locks by flock(2) (util/dirlock.h). */
#define _DEFAULT_SOURCE /* flock */
#include "util/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

int mc_dirlock_take(const char *lock_path, const char *what) {
  int fd = open(lock_path, O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return mc_error("%s: cannot create the lock file: %s", lock_path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mc_error("%s: the lock file is not a regular file", lock_path);
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[32] = "";
    ssize_t n = e == EWOULDBLOCK ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    close(fd);
    if (e != EWOULDBLOCK) return mc_error("%s: cannot lock: %s", lock_path, strerror(e));
    long pid = 0;
    if (n > 0) {
      buf[n] = 0;
      sscanf(buf, "%ld", &pid);
    }
    if (pid > 0) return mc_error("%s is in use by pid %ld (lock %s)", what, pid, lock_path);
    return mc_error("%s is in use by another process (lock %s)", what, lock_path);
  }
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
    /* the pid is informative only: the lock itself is held */
  }
  return fd;
}

void mc_dirlock_release(int fd, const char *lock_path, int unlink_file) {
  if (fd < 0) return;
  if (unlink_file && lock_path) unlink(lock_path);
  close(fd);
}
