/* libFuzzer harness: a run directory whose `latest` is the input, opened by mc_ckpt_open. */
#include "tests/fuzz/fuzz_util.h"

#include "ckpt/checkpoint.h"
#include "util/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[1100];
  if (fuzz_write(fuzz_dir(), "latest", data, size, path) != 0) return 0;
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(fuzz_dir(), NULL, &ck) == 0) mc_ckpt_close(ck);
  return 0;
}
