/* libFuzzer harness: the safetensors reader (header length, JSON, dtypes, shapes, offsets)
 * and the import's metadata (reshard/safetensors.c, reshard/export.c) on an arbitrary file. */
#include "tests/fuzz/fuzz_util.h"

#include "core/config.h"
#include "reshard/export.h"
#include "reshard/safetensors.h"
#include "util/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[1100];
  if (fuzz_write(fuzz_dir(), "in.safetensors", data, size, path) != 0) return 0;
  mc_st_file f;
  if (mc_st_open(&f, path) == 0) {
    float buf[16];
    for (int i = 0; i < f.n; i++) {
      int64_t n = f.t[i].bytes < (int64_t)sizeof buf ? f.t[i].bytes : (int64_t)sizeof buf;
      mc_st_pread(&f, i, 0, buf, n);
    }
    mc_st_close(&f);
  }
  mc_config cfg;
  mc_rs_safetensors_config(path, &cfg);
  return 0;
}
