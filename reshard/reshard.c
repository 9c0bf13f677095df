#define _POSIX_C_SOURCE 200809L
#include "reshard/reshard.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "ckpt/format.h"
#include "reshard/ckpt_sink.h"
#include "reshard/execute.h"
#include "util/clock.h"
#include "util/dirlock.h"


long mc_rs_peak_rss_kb(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

void mc_rs_consolidated_layout(mc_layout *l) {
  memset(l, 0, sizeof *l);
  l->tp = l->pp = l->dp = l->ep = 1;
  l->split = MC_SPLIT_EQUAL;
}

int mc_rs_check_destination(const char *dst, int force) {
  if (!mc_path_exists(dst)) return 0;
  if (!force) return mc_error("%s already exists; refusing to overwrite it (pass --force to replace it)", dst);
  /* --force replaces a run directory (or an empty one), never anything else. */
  struct stat st;
  if (stat(dst, &st) != 0 || !S_ISDIR(st.st_mode))
    return mc_error("%s exists and is not a directory; refusing to replace it, even with --force", dst);
  char latest[MC_PATH_MAX + 16];
  snprintf(latest, sizeof latest, "%s/latest", dst);
  DIR *d = opendir(dst);
  int empty = 1;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
  if (d) closedir(d);
  if (!empty && !mc_path_exists(latest))
    return mc_error("%s is neither a checkpoint run directory (no latest) nor empty; refusing to replace it, even "
                    "with --force", dst);
  return 0;
}

int mc_rs_prepare(mc_rs_source *src, const mc_layout *target, mc_geometry *dst_g, mc_rs_plan *plan) {
  const mc_geometry *sg = mc_rs_source_geometry(src);
  /* Batch rules are left to the run that resumes (it may change micro_batch). The target keeps
   * the source's model and optimizer groups: a reshard changes the layout only. */
  if (mc_geometry_of_config(mc_rs_source_config(src), target, dst_g) != 0)
    return mc_error_context("target layout refused");
  if (mc_rs_plan_build(sg, dst_g, mc_rs_source_states(src), plan) != 0) {
    mc_geometry_free(dst_g);
    return -1;
  }
  /* Each state keeps its stored dtype unless the caller converts it (mcreshard --state-dtype). */
  mc_rs_source_dtypes(src, plan);
  for (int t = 0; t < plan->n_tensors; t++) plan->tensors[t].dtype = plan->tensors[t].src_dtype;
  return 0;
}

/* ---------------------------------------------------------------- streaming the rank files */

typedef struct {
  int (*read)(void *, const mc_rs_plan *, int, int64_t, int64_t, float *);
  int (*src_done)(void *, const mc_rs_plan *, int, const unsigned char *);
  void *src;
  const mc_geometry *g;
  const mc_rs_plan *plan;
  int64_t step;
  const mc_rs_opts *o;
  mc_rs_exec_stats st;
} stream_ctx;

/* mc_ckpt_save's write_files hook: streams every target rank file into the library's
 * temporary step directory; the library then builds the manifest and commits. */
static int stream_into(void *user, const char *step_dir) {
  stream_ctx *h = user;
  mc_rs_sink *sink = NULL;
  if (mc_rs_sink_create(step_dir, h->g, h->plan, h->step, &sink) != 0) return -1;
  mc_rs_io_ctx ctx = {h->src, sink};
  mc_rs_io io = {&ctx, h->read, mc_rs_sink_write, h->src_done, mc_rs_sink_done};
  mc_rs_exec_opts eo = {h->o->chunk_bytes, h->o->threads, h->o->progress, "reshard"};
  int rc = mc_rs_execute(h->plan, h->g, &io, &eo, &h->st);
  if (rc == 0) rc = mc_rs_sink_finish(sink, h->plan);
  mc_rs_sink_free(sink);
  return rc;
}

static int write_unlocked(int (*read)(void *, const mc_rs_plan *, int, int64_t, int64_t, float *),
                          int (*src_done)(void *, const mc_rs_plan *, int, const unsigned char *), void *src_ctx,
                          const mc_config *cfg, const mc_train_state *st, const mc_geometry *g,
                          const mc_rs_plan *plan, const char *dst_in, const mc_rs_opts *o_in, mc_rs_summary *sum) {
  double t0 = mc_now_s();
  /* "B/" must name B itself, or the temporary directory would land inside it. */
  char dst[MC_PATH_MAX];
  if (snprintf(dst, sizeof dst, "%s", dst_in) >= (int)sizeof dst) return mc_error("destination path too long: %s", dst_in);
  for (size_t n = strlen(dst); n > 1 && dst[n - 1] == '/'; n--) dst[n - 1] = 0;
  mc_rs_opts o = {.chunk_bytes = (int64_t)16 << 20, .threads = 0};
  if (o_in) o = *o_in;
  if (mc_rs_check_destination(dst, o.force) != 0) return -1;
  char tmp_root[MC_PATH_MAX], old[MC_PATH_MAX + 16];
  if (snprintf(tmp_root, sizeof tmp_root, "%s.reshard.tmp", dst) >= (int)sizeof tmp_root)
    return mc_error("destination path too long: %s", dst);
  snprintf(old, sizeof old, "%s.reshard.old", dst);
  /* What an interrupted earlier run left behind. */
  if (mc_rmtree(tmp_root) != 0 || mc_rmtree(old) != 0) return mc_error_context("removing leftovers of an interrupted reshard");

  stream_ctx h = {.read = read, .src_done = src_done, .src = src_ctx, .g = g, .plan = plan, .step = st->step, .o = &o};
  mc_ckpt_save_opts so;
  mc_ckpt_save_opts_default(&so);
  so.write_files = stream_into;
  so.write_files_user = &h;
  int rc = mc_ckpt_save(tmp_root, g, cfg, st, NULL, 0, &so);
  if (rc != 0) {
    char why[MC_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", mc_errmsg());
    mc_rmtree(tmp_root);
    return mc_error("writing %s failed, nothing written: %s", dst, why);
  }
  /* Publish: the finished run directory takes dst's name in one rename. */
  char parent_buf[MC_PATH_MAX];
  snprintf(parent_buf, sizeof parent_buf, "%s", dst);
  const char *parent = dirname(parent_buf);
  int had_old = mc_path_exists(dst);
  if (had_old && rename(dst, old) != 0) {
    int e = errno;
    mc_rmtree(tmp_root);
    return mc_error("%s: cannot move the existing destination aside: %s", dst, strerror(e));
  }
  if (mc_fsync_path(tmp_root, 1) != 0 || rename(tmp_root, dst) != 0) {
    int e = errno;
    if (had_old) rename(old, dst);
    mc_rmtree(tmp_root);
    return mc_error("%s: cannot rename the finished checkpoint into place: %s", dst, strerror(e));
  }
  if (mc_fsync_path(parent, 1) != 0) fprintf(stderr, "warning: %s\n", mc_errmsg());
  if (had_old && mc_rmtree(old) != 0) fprintf(stderr, "warning: could not remove %s: %s\n", old, mc_errmsg());
  if (sum) {
    memset(sum, 0, sizeof *sum);
    sum->bytes_read = h.st.bytes_read;
    sum->bytes_written = h.st.bytes_written;
    sum->copy_seconds = h.st.seconds;
    sum->seconds = mc_now_s() - t0;
    sum->peak_rss_kb = mc_rs_peak_rss_kb();
    sum->n_src_shards = plan->n_src;
    sum->n_dst_shards = plan->n_targets;
    sum->n_dst_files = plan->n_dst_writers;
  }
  return 0;
}

int mc_rs_write_from(int (*read)(void *, const mc_rs_plan *, int, int64_t, int64_t, float *),
                     int (*src_done)(void *, const mc_rs_plan *, int, const unsigned char *), void *src_ctx,
                     const mc_config *cfg, const mc_train_state *st, const mc_geometry *g,
                     const mc_rs_plan *plan, const char *dst_in, const mc_rs_opts *o_in, mc_rs_summary *sum) {
  /* One writer per destination: a second mcreshard to it is turned away naming the first.
   * The lock file lies beside the destination, like its temporary directory. */
  char dst[MC_PATH_MAX], lock[MC_PATH_MAX + 16];
  if (snprintf(dst, sizeof dst, "%s", dst_in) >= (int)sizeof dst) return mc_error("destination path too long: %s", dst_in);
  for (size_t n = strlen(dst); n > 1 && dst[n - 1] == '/'; n--) dst[n - 1] = 0;
  snprintf(lock, sizeof lock, "%s.reshard.lock", dst);
  int fd = mc_dirlock_take(lock, dst);
  if (fd < 0) return mc_error_context("reshard destination");
  int rc = write_unlocked(read, src_done, src_ctx, cfg, st, g, plan, dst_in, o_in, sum);
  mc_dirlock_release(fd, lock, 1);
  return rc;
}

int mc_rs_write(mc_rs_source *src, const mc_geometry *g, const mc_rs_plan *plan, const char *dst,
                const mc_rs_opts *o, mc_rs_summary *sum) {
  if (mc_rs_check_destination(dst, o && o->force) != 0) return -1;
  if (mc_rs_source_bind(src, plan) != 0) return -1;
  mc_train_state st;
  if (mc_ckpt_train_state(mc_rs_source_ckpt(src), &st) != 0) return -1;
  return mc_rs_write_from(mc_rs_source_read, mc_rs_source_done, src, mc_rs_source_config(src), &st, g, plan, dst,
                          o, sum);
}

void mc_rs_summary_print(const mc_rs_summary *s, const char *what) {
  double gib = 1024.0 * 1024.0 * 1024.0;
  /* Throughput counts each checkpoint byte once: it is read once and written once. */
  printf("%s: read %.3f GiB from %d shards, wrote %.3f GiB to %d shards in %d files; %.2f s (streaming %.2f s), "
         "%.3f GB/s, peak RSS %.1f MiB\n",
         what, (double)s->bytes_read / gib, s->n_src_shards, (double)s->bytes_written / gib, s->n_dst_shards,
         s->n_dst_files, s->seconds, s->copy_seconds, s->seconds > 0 ? (double)s->bytes_written / s->seconds / 1e9 : 0.0,
         (double)s->peak_rss_kb / 1024.0);
}
