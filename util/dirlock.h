/* Advisory locks held for a job (docs/reliability.md): one run directory is trained by one
 * mctrain, one reshard destination written by one mcreshard. flock(2) on a lock file; the
 * kernel drops it when the process ends however it ends, so a crash never leaves a stale
 * lock. The file records the holder's pid for the message of the process turned away. */
#ifndef MC_UTIL_DIRLOCK_H
#define MC_UTIL_DIRLOCK_H

/* Takes the lock at lock_path (created if missing, mode 0644) without waiting: returns its
 * descriptor, or -1 with "<what> is in use by pid N (lock <lock_path>)" when another process
 * holds it, or an error naming the file if it cannot be created. */
int mc_dirlock_take(const char *lock_path, const char *what);
/* Releases it (fd < 0: nothing); unlink = 1 also removes the lock file. */
void mc_dirlock_release(int fd, const char *lock_path, int unlink_file);

#endif
