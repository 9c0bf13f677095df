/* Whole reads at an offset: pread until the range is read or the file ends. */
#ifndef MC_UTIL_FILEIO_H
#define MC_UTIL_FILEIO_H

#include <stdint.h>

/* Reads bytes [off, off + n) of fd into buf, retrying short reads and EINTR. Returns the bytes
 * read: n, or fewer when the file ends first; -1 with errno set on a read error. Callers word
 * their own messages (file, dataset). */
int64_t mc_pread_full(int fd, void *buf, int64_t n, int64_t off);

#endif
