/* Shared by the libFuzzer harnesses (tests/fuzz/fuzz.cmake, docs/reliability.md): a scratch
 * directory per process and whole-file writes into it. */
#ifndef MC_TESTS_FUZZ_UTIL_H
#define MC_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* $TMPDIR/mcfuzz.<pid> (created once). */
static inline const char *fuzz_dir(void) {
  static char dir[512];
  if (!dir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mcfuzz.%ld", t && t[0] ? t : "/tmp", (long)getpid());
    mkdir(dir, 0755);
  }
  return dir;
}

/* dir/name := data (size bytes); returns the path in out (1100 bytes). */
static inline int fuzz_write(const char *dir, const char *name, const void *data, size_t size, char *out) {
  snprintf(out, 1100, "%s/%s", dir, name);
  FILE *f = fopen(out, "wb");
  if (!f) return -1;
  size_t n = size ? fwrite(data, 1, size, f) : 0;
  return fclose(f) == 0 && n == size ? 0 : -1;
}

/* A NUL-terminated copy of the input (caller frees). */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (s) {
    if (size) memcpy(s, data, size);
    s[size] = 0;
  }
  return s;
}

#endif
