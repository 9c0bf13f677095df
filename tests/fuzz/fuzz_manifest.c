/* libFuzzer harness: a step directory whose manifest.json is the input, opened by
 * mc_ckpt_open (manifest parser and format rules; its rank files do not exist). */
#include "tests/fuzz/fuzz_util.h"

#include "ckpt/checkpoint.h"
#include "util/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[1100];
  if (fuzz_write(fuzz_dir(), "manifest.json", data, size, path) != 0) return 0;
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(fuzz_dir(), NULL, &ck) == 0) {
    mc_config cfg;
    mc_train_state st;
    mc_ckpt_config(ck, &cfg);
    mc_ckpt_train_state(ck, &st);
    mc_ckpt_close(ck);
  }
  return 0;
}
