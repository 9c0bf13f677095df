/* The save's data path (ckpt/ckpt_pwrite.c): contiguous shards written with pwrite by several
 * threads give the same bytes whatever the number of threads (the format promises
 * byte-identical files for the same state), uncompressed and under deflate, and so does the
 * manifest, whose piece digests (64 KiB pieces here) the commit hashed on those threads; the result
 * reads back verified as the state saved; with --enospc (under the ENOSPC shim) a pwrite of
 * the data that fails fails the save naming the file and dataset, leaving the previous
 * checkpoint as `latest` and nothing of the failed step. A 65536-word vocabulary makes the embedding's shards 8 MiB, so a
 * shard takes several 4 MiB writes. */
#include "tests/ckpt/test_ckpt_common.h"

#include "tests/check.h"

#define SEED 77

static int files_equal(const char *a, const char *b) {
  char cmd[9000];
  pathf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
  return system(cmd) == 0;
}

static int big_geometry(mc_config *cfg, mc_geometry *g) {
  if (mc_config_default(cfg) != 0) return -1;
  cfg->model.vocab_size = 65536;
  mc_layout l = cfg->parallel;
  l.tp = 1, l.pp = 1, l.dp = 2, l.ep = 1, l.sp = 0, l.zero = 1;
  l.split = MC_SPLIT_EQUAL;
  cfg->parallel = l;
  if (mc_geometry_build(&cfg->model, &l, NULL, -1, g) != 0) return -1;
  return mc_optim_groups_assign(cfg->train.optim.groups, &g->fams);
}

static int save_with(const char *dir, const mc_geometry *g, const mc_config *cfg, const item_set *set, int64_t step,
                     int threads, int deflate) {
  mc_train_state st;
  make_state(step, &st);
  mc_ckpt_save_opts o;
  mc_ckpt_save_opts_default(&o);
  o.io_threads = threads;
  o.deflate = deflate;
  o.piece_bytes = 65536; /* files of some hundred pieces: the read-back hashes them on `threads` threads */
  return mc_ckpt_save(dir, g, cfg, &st, set->items, set->n, &o);
}

/* Saves with each thread count in `threads` (under `deflate`) and compares every rank file
 * with the first save's; the last one is opened and checked against the state. */
static void same_bytes(const char *root, const mc_geometry *g, const mc_config *cfg, const item_set *set, int deflate,
                       const int *threads, int n_threads) {
  char first[4096];
  pathf(first, sizeof first, "%s/z%d_t%d", root, deflate, threads[0]);
  for (int t = 0; t < n_threads; t++) {
    char dir[4096];
    pathf(dir, sizeof dir, "%s/z%d_t%d", root, deflate, threads[t]);
    CHECK_OK(save_with(dir, g, cfg, set, 1, threads[t], deflate));
    for (int r = 0; t > 0 && r < g->world; r++) {
      char fa[4200], fb[4200];
      pathf(fa, sizeof fa, "%s/step_1/rank_%d.h5", first, r);
      pathf(fb, sizeof fb, "%s/step_1/rank_%d.h5", dir, r);
      CHECK(files_equal(fa, fb), "deflate %d: rank_%d.h5 written by %d threads differs from %d threads'", deflate, r,
            threads[t], threads[0]);
    }
    if (t > 0) { /* and the manifest: the same piece digests, whatever the threads that hashed them */
      char ma[4200], mb[4200];
      pathf(ma, sizeof ma, "%s/step_1/manifest.json", first);
      pathf(mb, sizeof mb, "%s/step_1/manifest.json", dir);
      CHECK(files_equal(ma, mb), "deflate %d: the manifest of %d threads differs from %d threads'", deflate, threads[t],
            threads[0]);
    }
    if (t < n_threads - 1) continue;
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (!ck) continue;
    CHECK(mc_ckpt_verify_all(ck) == 0, "deflate %d: verify: %s", deflate, mc_errmsg());
    CHECK(check_against_layout(ck, g, SEED) == 0, "deflate %d: the checkpoint holds the state saved", deflate);
    mc_ckpt_close(ck);
  }
}

/* Run under the ENOSPC shim (tests/reliability/enospc_shim.c, armed by ctest for
 * step_2.tmp with a budget of 6 MB): the files' metadata and a first 4 MiB piece fit, the
 * next data pwrite does not. */
static void failing_pwrite(const char *root, const mc_geometry *g, const mc_config *cfg, const item_set *set) {
  const char *match = getenv("MC_ENOSPC_MATCH");
  CHECK(getenv("LD_PRELOAD") && match && !strcmp(match, "step_2.tmp"), "--enospc runs under the shim, matching step_2.tmp");
  char dir[4096];
  pathf(dir, sizeof dir, "%s/enospc", root);
  CHECK_OK(save_with(dir, g, cfg, set, 1, 2, 0));
  int rc = save_with(dir, g, cfg, set, 2, 4, 0);
  const char *m = mc_errmsg();
  if (getenv("MC_TEST_VERBOSE")) printf("full disk -> %s\n", m);
  CHECK(rc != 0 && strstr(m, "step 2 not committed") && strstr(m, "rank_") && strstr(m, "writing dataset /") &&
            strstr(m, "No space left on device"),
        "a failing pwrite is reported naming file and dataset: %s", m);
  CHECK(!path_exists(dir, "step_2") && !path_exists(dir, "step_2.tmp"), "the failed step left files behind");
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) {
    CHECK(mc_ckpt_step(ck) == 1, "latest is step %" PRId64 ", want 1", mc_ckpt_step(ck));
    CHECK(mc_ckpt_verify_all(ck) == 0, "the previous checkpoint verifies: %s", mc_errmsg());
    mc_ckpt_close(ck);
  }
}

int main(int argc, char **argv) {
  const int enospc = argc > 1 && !strcmp(argv[1], "--enospc");
  char root[2048];
  scratch_dir(enospc ? "pwrite_enospc" : "pwrite", root, sizeof root);
  mc_config cfg;
  mc_geometry g;
  CHECK_OK(big_geometry(&cfg, &g));
  item_set set;
  CHECK_OK(make_items(&g, SEED, ALL_STATES, 0, g.world, &set));
  const int plain[] = {1, 3, 8}, packed[] = {1, 4};
  if (enospc) {
    failing_pwrite(root, &g, &cfg, &set);
  } else {
    same_bytes(root, &g, &cfg, &set, 0, plain, 3);
    same_bytes(root, &g, &cfg, &set, 1, packed, 2);
  }
  free_items(&set);
  mc_geometry_free(&g);
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit(enospc ? "test_ckpt_pwrite --enospc" : "test_ckpt_pwrite");
}
