/* libFuzzer harness: the config parser (core/config.c) on arbitrary JSON text. */
#include "tests/fuzz/fuzz_util.h"

#include "core/config.h"
#include "util/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mc_config cfg;
  if (text && mc_config_default(&cfg) == 0) {
    if (mc_config_apply_json(&cfg, text, "fuzz.json") == 0) free(mc_config_to_json(&cfg));
  }
  free(text);
  return 0;
}
