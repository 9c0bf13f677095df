/* Peak memory of a reshard stays bounded as the checkpoint grows: the same reshard of a
 * checkpoint 4x larger must not need more than a few MiB more (ru_maxrss of a fresh child
 * process per measurement), and stays far below the checkpoint's size. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"
#include "reshard/reshard.h"
#include "reshard/synth.h"
#include "rs_ckpt_testlib.h"

static void model_of_width(mc_config *cfg, int d) {
  mc_config_default(cfg);
  mc_model *m = &cfg->model;
  m->d_model = d;
  m->n_heads = 4;
  m->n_kv_heads = 2;
  m->head_dim = d / 4;
  m->expert_hidden = 2 * d;
  m->mamba_inner = 2 * d;
  m->rec_width = d;
}

/* In a child: the reshard A -> B, reporting peak RSS (KiB) and bytes read through a pipe. */
static int measure(const char *a, const char *b, long *rss_kb, int64_t *bytes) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    long out[2] = {-1, 0};
    mc_rs_source *s;
    if (mc_rs_source_open(a, &s) == 0) {
      mc_layout t = mc_rs_source_geometry(s)->layout;
      t.tp = 2, t.dp = 1, t.pp = 2, t.zero = 0;
      mc_geometry g;
      mc_rs_plan p;
      mc_rs_summary sum;
      mc_rs_opts o = {.chunk_bytes = 1 << 20, .threads = 2};
      if (mc_rs_prepare(s, &t, &g, &p) == 0 && mc_rs_write(s, &g, &p, b, &o, &sum) == 0) {
        out[0] = mc_rs_peak_rss_kb();
        out[1] = (long)sum.bytes_read;
      } else {
        fprintf(stderr, "child: %s\n", mc_errmsg());
      }
    }
    if (write(fd[1], out, sizeof out) != (ssize_t)sizeof out) _exit(2);
    _exit(0);
  }
  close(fd[1]);
  long in[2] = {-1, 0};
  ssize_t r = read(fd[0], in, sizeof in);
  close(fd[0]);
  int status;
  waitpid(pid, &status, 0);
  *rss_kb = in[0];
  *bytes = in[1];
  return r == (ssize_t)sizeof in && in[0] > 0 ? 0 : -1;
}

int main(void) {
  char root[2048];
  rs_scratch("memory", root, sizeof root);
  long rss[2];
  int64_t bytes[2];
  const int widths[2] = {256, 512};
  for (int i = 0; i < 2; i++) {
    mc_config cfg;
    model_of_width(&cfg, widths[i]);
    cfg.parallel.tp = 1, cfg.parallel.dp = 2, cfg.parallel.pp = 1, cfg.parallel.zero = 1;
    char a[2300], b[2300];
    snprintf(a, sizeof a, "%s/A%d", root, i);
    snprintf(b, sizeof b, "%s/B%d", root, i);
    mc_rs_opts o = {.chunk_bytes = 1 << 20, .threads = 2};
    CHECK_OK(mc_rs_synthesize(&cfg, 3, a, &o, NULL));
    CHECK_OK(measure(a, b, &rss[i], &bytes[i]));
    printf("  d_model %d: checkpoint %.1f MiB, reshard peak RSS %.1f MiB\n", widths[i], (double)bytes[i] / 1048576.0,
           (double)rss[i] / 1024.0);
  }
  CHECK(bytes[1] > 3 * bytes[0], "the larger checkpoint is not much larger (%lld vs %lld)", (long long)bytes[1],
        (long long)bytes[0]);
  /* Buffers are 2 threads x 2 x 1 MiB; allow 8 MiB of drift for library caches. */
  CHECK(rss[1] - rss[0] < 8 * 1024, "peak RSS grew by %.1f MiB when the checkpoint grew by %.1f MiB",
        (double)(rss[1] - rss[0]) / 1024.0, (double)(bytes[1] - bytes[0]) / 1048576.0);
  CHECK((int64_t)rss[1] * 1024 < bytes[1] / 2, "peak RSS %.1f MiB is not far below the checkpoint's %.1f MiB",
        (double)rss[1] / 1024.0, (double)bytes[1] / 1048576.0);
  if (mc_check_failures == 0) rs_rm_rf(root);
  return mc_check_exit("test_reshard_memory");
}
