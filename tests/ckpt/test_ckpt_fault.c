/* Fault injection at every step of the save path, as an error (ENOSPC; default) or, with
 * --crash, as a crash (the process dies there): each leaves the previous checkpoint and
 * `latest` loadable and, after an error, no trace of the failed step. The error run adds a
 * real write failure: the file-size limit (RLIMIT_FSIZE) makes HDF5's own writes fail
 * mid-file. The two modes are two ctests (tests/ckpt/checkpoint.cmake). */
#include "tests/ckpt/test_ckpt_common.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "tests/check.h"

#define LAYOUT 1, 1, 2, 1, 0, 1 /* dp2, ZeRO-1: two rank files */

static void expect_latest(const char *dir, int64_t step, const char *what) {
  mc_ckpt *ck = NULL;
  int rc = mc_ckpt_open(dir, NULL, &ck);
  CHECK(rc == 0, "%s: latest not loadable: %s", what, mc_errmsg());
  if (!ck) return;
  CHECK(mc_ckpt_step(ck) == step, "%s: latest is step %" PRId64 ", want %" PRId64, what, mc_ckpt_step(ck), step);
  CHECK(mc_ckpt_verify_all(ck) == 0, "%s: latest does not verify: %s", what, mc_errmsg());
  mc_ckpt_close(ck);
}

static void expect_clean(const char *dir, const char *what) {
  CHECK(!path_exists(dir, "step_2"), "%s: step_2 left behind", what);
  CHECK(!path_exists(dir, "step_2.tmp"), "%s: step_2.tmp left behind", what);
  CHECK(!path_exists(dir, "latest.tmp"), "%s: latest.tmp left behind", what);
}

static void fault_as_error(const char *root, const char *point) {
  char dir[4096];
  pathf(dir, sizeof dir, "%s/err_%s", root, point);
  CHECK_OK(save_reference_states(dir, LAYOUT, 1, 3, 0, 1));
  CHECK_OK(mc_ckpt_set_fault(point, 0));
  int rc = save_reference_states(dir, LAYOUT, 2, 3, 0, 1);
  char msg[MC_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", mc_errmsg());
  mc_ckpt_set_fault(NULL, 0);
  char want[128];
  snprintf(want, sizeof want, "injected fault at '%s'", point);
  CHECK(rc != 0, "%s: save should fail", point);
  CHECK(strstr(msg, want) && strstr(msg, "step 2") && strstr(msg, "No space left"), "%s: message: %s", point, msg);
  if (getenv("MC_TEST_VERBOSE")) printf("%-15s -> %s\n", point, msg);
  expect_clean(dir, point);
  expect_latest(dir, 1, point);
  /* the next attempt succeeds */
  CHECK_OK(save_reference_states(dir, LAYOUT, 2, 3, 0, 1));
  expect_latest(dir, 2, point);
}

static void fault_as_crash(const char *root, const char *point) {
  char dir[4096];
  pathf(dir, sizeof dir, "%s/crash_%s", root, point);
  CHECK_OK(save_reference_states(dir, LAYOUT, 1, 3, 0, 1));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    mc_ckpt_set_fault(point, 1);
    save_reference_states(dir, LAYOUT, 2, 3, 0, 1);
    _exit(4); /* the crash did not happen */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 3, "%s: child did not crash at the point (status %d)", point, status);
  expect_latest(dir, 1, point);
  /* a later save cleans up whatever the crash left and commits */
  CHECK_OK(save_reference_states(dir, LAYOUT, 2, 3, 0, 1));
  expect_latest(dir, 2, point);
  CHECK(!path_exists(dir, "step_2.tmp") && !path_exists(dir, "latest.tmp"), "%s: leftovers after recovery", point);
}

static void real_write_failure(const char *root) {
  char dir[4096];
  pathf(dir, sizeof dir, "%s/fsize", root);
  CHECK_OK(save_reference_states(dir, LAYOUT, 1, 3, 0, 1));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit rl = {100000, 100000}; /* a rank file is ~200 kB: the write fails inside HDF5 */
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &rl);
    int rc = save_reference_states(dir, LAYOUT, 2, 3, 0, 1);
    const char *m = mc_errmsg();
    if (getenv("MC_TEST_VERBOSE")) printf("file-size limit -> %s\n", m);
    _exit(rc != 0 && strstr(m, "rank_") && strstr(m, "step 2") ? 0 : 5);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "write beyond RLIMIT_FSIZE not reported (status %d)", status);
  expect_clean(dir, "file-size limit");
  expect_latest(dir, 1, "file-size limit");
}

int main(int argc, char **argv) {
  int crash = argc > 1 && strcmp(argv[1], "--crash") == 0;
  char root[2048];
  scratch_dir(crash ? "crash" : "fault", root, sizeof root);
  CHECK(mc_ckpt_set_fault("no_such_point", 0) != 0, "unknown fault point refused");
  for (int i = 0; i < mc_ckpt_n_fault_points; i++) {
    if (crash) fault_as_crash(root, mc_ckpt_fault_points[i]);
    else fault_as_error(root, mc_ckpt_fault_points[i]);
  }
  if (!crash) {
    real_write_failure(root);
    /* the environment variable arms the same faults */
    char dir[4096];
    pathf(dir, sizeof dir, "%s/env", root);
    CHECK_OK(save_reference_states(dir, LAYOUT, 1, 3, 0, 1));
    setenv("MC_CKPT_FAULT", "read_back", 1);
    int rc = save_reference_states(dir, LAYOUT, 2, 3, 0, 1);
    CHECK(rc != 0 && strstr(mc_errmsg(), "injected fault at 'read_back'"), "MC_CKPT_FAULT: %s", mc_errmsg());
    unsetenv("MC_CKPT_FAULT");
    expect_clean(dir, "MC_CKPT_FAULT");
    expect_latest(dir, 1, "MC_CKPT_FAULT");
  }
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit(crash ? "test_ckpt_fault --crash" : "test_ckpt_fault");
}
