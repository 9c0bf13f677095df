/* libFuzzer harness: the rank-file opener. A real checkpoint's step directory (copied from
 * $MC_FUZZ_CKPT, a step directory, at the first input) gets the input as its rank_0.h5, and
 * every shard is read (mc_ckpt_verify_all).
 *   default:          the manifest keeps its record of rank_0.h5, so the whole-file check must
 *                     refuse the input before HDF5 parses it (verify before parsing);
 *   MC_FUZZ_FORGE=1:  the manifest is rewritten with the input's size and SHA-256 each time,
 *                     as a forger would: the input reaches libhdf5 and our attribute and
 *                     storage checks (long runs only: libhdf5's own parser bugs are reachable). */
#include "tests/fuzz/fuzz_util.h"

#include <cjson/cJSON.h>

#include "ckpt/checkpoint.h"
#include "ckpt/format.h"
#include "util/error.h"

static char g_dir[1100];
static cJSON *g_manifest;

static int setup(void) {
  const char *src = getenv("MC_FUZZ_CKPT");
  if (!src) {
    fprintf(stderr, "fuzz_rankfile: set MC_FUZZ_CKPT to a step directory of a small checkpoint\n");
    abort();
  }
  snprintf(g_dir, sizeof g_dir, "%s/step", fuzz_dir());
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && rm -f '%s/manifest.sha256'", g_dir, src, g_dir, g_dir);
  if (system(cmd) != 0) abort();
  char mp[1200];
  snprintf(mp, sizeof mp, "%s/manifest.json", g_dir);
  FILE *f = fopen(mp, "rb");
  if (!f) abort();
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  g_manifest = cJSON_Parse(text);
  if (!g_manifest) abort();
  return 0;
}

static void forge(const uint8_t *data, size_t size) {
  char hex[65];
  mc_sha256_hex(data, size, hex);
  cJSON *files = cJSON_GetObjectItemCaseSensitive(g_manifest, "files"), *e;
  cJSON_ArrayForEach(e, files) {
    cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (!cJSON_IsString(name) || strcmp(name->valuestring, "rank_0.h5") != 0) continue;
    cJSON_ReplaceItemInObjectCaseSensitive(e, "bytes", cJSON_CreateNumber((double)size));
    cJSON_ReplaceItemInObjectCaseSensitive(e, "sha256", cJSON_CreateString(hex));
  }
  char *text = cJSON_Print(g_manifest), path[1100];
  if (text) fuzz_write(g_dir, "manifest.json", text, strlen(text), path);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) setup();
  const char *fg = getenv("MC_FUZZ_FORGE");
  if (fg && fg[0] == '1') forge(data, size);
  char path[1100];
  if (fuzz_write(g_dir, "rank_0.h5", data, size, path) != 0) return 0;
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(g_dir, NULL, &ck) == 0) {
    mc_ckpt_verify_all(ck);
    mc_ckpt_close(ck);
  }
  return 0;
}
