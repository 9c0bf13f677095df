/* Async save equals sync save (byte-identical files, same root hash) even when the caller
 * overwrites its buffers right after the call returns; a background failure is reported by
 * the next save, by wait or by close, exactly once; keep-last-K prunes the oldest steps.
 * Staged saves (the caller's buffers, filled by the time ready() returns on the saver's
 * thread) equal sync saves; a failing ready() fails the save and keeps the previous one. */
#include "tests/ckpt/test_ckpt_common.h"

#include "tests/check.h"

static int files_equal(const char *a, const char *b) {
  char cmd[9000];
  pathf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
  return system(cmd) == 0;
}

static const char *root_hash_of(const char *dir, char *out) {
  mc_ckpt *ck = NULL;
  out[0] = 0;
  if (mc_ckpt_open(dir, NULL, &ck) == 0) {
    snprintf(out, 65, "%s", mc_ckpt_root_hash(ck));
    mc_ckpt_close(ck);
  }
  return out;
}

static void test_async_equals_sync(const char *root) {
  mc_config cfg;
  mc_geometry g;
  CHECK_OK(tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g));
  char a[4096], b[4096];
  pathf(a, sizeof a, "%s/sync", root);
  pathf(b, sizeof b, "%s/async", root);
  item_set set;
  CHECK_OK(make_items(&g, 21, 7, 0, g.world, &set));
  mc_train_state st;
  make_state(3, &st);
  CHECK_OK(mc_ckpt_save(a, &g, &cfg, &st, set.items, set.n, NULL));

  mc_ckpt_saver *sv = NULL;
  CHECK_OK(mc_ckpt_saver_create(b, NULL, &sv));
  if (!sv) return;
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st, set.items, set.n));
  double stall = mc_ckpt_saver_last_stall(sv);
  /* training goes on and changes the state while the save runs */
  for (int i = 0; i < set.n; i++) {
    mc_shard sh;
    mc_shard_of(&g, set.items[i].family, set.items[i].state, set.items[i].rank, &sh);
    for (int64_t k = 0; k < sh.numel; k++) ((float *)set.bufs[i])[k] = -1.0f;
  }
  CHECK_OK(mc_ckpt_saver_wait(sv));
  CHECK(stall > 0 && stall < 5, "stall %g s", stall);

  char ha[65], hb[65];
  root_hash_of(a, ha);
  root_hash_of(b, hb);
  CHECK(ha[0] && strcmp(ha, hb) == 0, "root hashes differ: %s vs %s", ha, hb);
  for (int r = 0; r < g.world; r++) {
    char fa[4200], fb[4200];
    pathf(fa, sizeof fa, "%s/step_3/rank_%d.h5", a, r);
    pathf(fb, sizeof fb, "%s/step_3/rank_%d.h5", b, r);
    if (path_exists(a, fa + strlen(a) + 1)) CHECK(files_equal(fa, fb), "rank %d file differs", r);
  }
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(b, NULL, &ck));
  if (ck) {
    CHECK(check_against_layout(ck, &g, 21) == 0, "async checkpoint holds the state as of the call");
    mc_ckpt_close(ck);
  }

  /* A failing background save (step 3 is already the latest) is reported by the next save,
   * which then does not start; the one after starts normally. */
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st, set.items, set.n));
  mc_train_state st4;
  make_state(4, &st4);
  int rc = mc_ckpt_saver_save(sv, &g, &cfg, &st4, set.items, set.n);
  CHECK(rc != 0 && strstr(mc_errmsg(), "async") && strstr(mc_errmsg(), "refusing to overwrite"), "next save reports: %s",
        mc_errmsg());
  CHECK(!path_exists(b, "step_4"), "the save after a failure did not start");
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st4, set.items, set.n));
  CHECK_OK(mc_ckpt_saver_wait(sv));
  CHECK_OK(mc_ckpt_saver_wait(sv)); /* nothing in flight, nothing to report */
  CHECK(path_exists(b, "step_4"), "step 4 committed");

  /* ... and by wait, once */
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st4, set.items, set.n));
  CHECK(mc_ckpt_saver_wait(sv) != 0 && strstr(mc_errmsg(), "refusing to overwrite"), "wait reports: %s", mc_errmsg());
  CHECK_OK(mc_ckpt_saver_wait(sv));

  /* ... and by close */
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st4, set.items, set.n));
  CHECK(mc_ckpt_saver_close(sv) != 0 && strstr(mc_errmsg(), "refusing to overwrite"), "close reports: %s", mc_errmsg());

  /* a fault in the background thread (ENOSPC at rename) leaves latest as it was */
  CHECK_OK(mc_ckpt_saver_create(b, NULL, &sv));
  mc_train_state st5;
  make_state(5, &st5);
  CHECK_OK(mc_ckpt_set_fault("rename_dir", 0));
  CHECK_OK(mc_ckpt_saver_save(sv, &g, &cfg, &st5, set.items, set.n));
  CHECK(mc_ckpt_saver_close(sv) != 0 && strstr(mc_errmsg(), "injected fault at 'rename_dir'"), "fault: %s", mc_errmsg());
  mc_ckpt_set_fault(NULL, 0);
  CHECK_OK(mc_ckpt_open(b, NULL, &ck));
  if (ck) CHECK(mc_ckpt_step(ck) == 4, "latest still step 4");
  mc_ckpt_close(ck);
  CHECK(!path_exists(b, "step_5") && !path_exists(b, "step_5.tmp"), "no trace of step 5");
  free_items(&set);
  mc_geometry_free(&g);
}

static void test_keep_last(const char *root) {
  char dir[4096];
  pathf(dir, sizeof dir, "%s/keep", root);
  for (int s = 1; s <= 5; s++) CHECK_OK(save_reference_states(dir, 1, 1, 2, 1, 0, 1, s, 4, 2, 1));
  for (int s = 1; s <= 5; s++) {
    char name[32];
    snprintf(name, sizeof name, "step_%d", s);
    CHECK(path_exists(dir, name) == (s >= 4), "keep=2: step_%d present=%d", s, path_exists(dir, name));
  }
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) CHECK(mc_ckpt_step(ck) == 5, "latest is step 5");
  mc_ckpt_close(ck);
  /* an older step saved later (a resumed branch) becomes latest and is never pruned */
  CHECK_OK(save_reference_states(dir, 1, 1, 2, 1, 0, 1, 3, 4, 1, 1));
  CHECK(path_exists(dir, "step_3") && !path_exists(dir, "step_4") && !path_exists(dir, "step_5"),
        "keep=1 keeps only the latest, step 3");
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) CHECK(mc_ckpt_step(ck) == 3, "latest is step 3");
  mc_ckpt_close(ck);
  /* the latest step itself cannot be overwritten */
  CHECK(save_reference_states(dir, 1, 1, 2, 1, 0, 1, 3, 4, 1, 1) != 0 && strstr(mc_errmsg(), "refusing to overwrite"),
        "overwrite latest: %s", mc_errmsg());
  /* keep = 0 keeps everything */
  for (int s = 6; s <= 8; s++) CHECK_OK(save_reference_states(dir, 1, 1, 2, 1, 0, 1, s, 4, 0, 1));
  CHECK(path_exists(dir, "step_3") && path_exists(dir, "step_6") && path_exists(dir, "step_8"), "keep=0 prunes nothing");
}

/* A device copy in flight: the buffers hold garbage until ready() has run. */
typedef struct {
  item_set *set;
  const mc_geometry *g;
  unsigned seed;
  int fail, calls;
} filler;

static int fill_ready(void *user) {
  filler *f = user;
  f->calls++;
  if (f->fail) return mc_error("injected: the copy to the host failed");
  item_set fresh;
  if (make_items(f->g, f->seed, 7, 0, f->g->world, &fresh) != 0) return -1;
  for (int i = 0; i < fresh.n; i++) {
    mc_shard sh;
    mc_shard_of(f->g, fresh.items[i].family, fresh.items[i].state, fresh.items[i].rank, &sh);
    memcpy(f->set->bufs[i], fresh.bufs[i], (size_t)sh.numel * sizeof(float));
  }
  free_items(&fresh);
  return 0;
}

static void test_staged(const char *root) {
  mc_config cfg;
  mc_geometry g;
  CHECK_OK(tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g));
  char a[4096], b[4096];
  pathf(a, sizeof a, "%s/staged_sync", root);
  pathf(b, sizeof b, "%s/staged", root);
  item_set set;
  CHECK_OK(make_items(&g, 33, 7, 0, g.world, &set));
  mc_train_state st;
  make_state(3, &st);
  CHECK_OK(mc_ckpt_save(a, &g, &cfg, &st, set.items, set.n, NULL));
  for (int i = 0; i < set.n; i++) {
    mc_shard sh;
    mc_shard_of(&g, set.items[i].family, set.items[i].state, set.items[i].rank, &sh);
    for (int64_t k = 0; k < sh.numel; k++) ((float *)set.bufs[i])[k] = NAN; /* not yet arrived */
  }
  mc_ckpt_saver *sv = NULL;
  CHECK_OK(mc_ckpt_saver_create(b, NULL, &sv));
  if (!sv) return;
  filler f = {&set, &g, 33, 0, 0};
  CHECK_OK(mc_ckpt_saver_save_staged(sv, &g, &cfg, &st, set.items, set.n, fill_ready, &f));
  CHECK_OK(mc_ckpt_saver_wait(sv));
  CHECK(f.calls == 1, "ready called %d times", f.calls);
  char ha[65], hb[65];
  root_hash_of(a, ha);
  root_hash_of(b, hb);
  CHECK(ha[0] && strcmp(ha, hb) == 0, "staged root hash %s, sync %s", hb, ha);

  /* the copy fails: the save fails (reported by wait) and latest stays at step 3 */
  mc_train_state st4;
  make_state(4, &st4);
  f.fail = 1;
  CHECK_OK(mc_ckpt_saver_save_staged(sv, &g, &cfg, &st4, set.items, set.n, fill_ready, &f));
  CHECK(mc_ckpt_saver_wait(sv) != 0 && strstr(mc_errmsg(), "copy to the host failed") && strstr(mc_errmsg(), "step 4"),
        "wait reports: %s", mc_errmsg());
  CHECK(!path_exists(b, "step_4") && !path_exists(b, "step_4.tmp"), "no trace of step 4");
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(b, NULL, &ck));
  if (ck) CHECK(mc_ckpt_step(ck) == 3, "latest still step 3");
  mc_ckpt_close(ck);
  CHECK_OK(mc_ckpt_saver_close(sv));
  free_items(&set);
  mc_geometry_free(&g);
}

int main(void) {
  char root[2048];
  scratch_dir("async", root, sizeof root);
  test_async_equals_sync(root);
  test_keep_last(root);
  test_staged(root);
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit("test_ckpt_async");
}
