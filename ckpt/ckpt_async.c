/* Asynchronous save: the caller is blocked only while the state is copied into host buffers
 * the saver owns (and while a previous save still runs), or not at all for the caller's own
 * staged buffers (mc_ckpt_saver_save_staged); a background thread then does the whole
 * mc_ckpt_save. Its result is kept until a wait, the next save or close reports it. */
#define _GNU_SOURCE /* gettid */
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt_internal.h"
#include "core/dtype.h"
#include "util/clock.h"
#include "util/error.h"

struct mc_ckpt_saver {
  char dir[MC_PATH_MAX];
  mc_ckpt_save_opts opts;
  /* the copy being saved */
  const mc_geometry *g;
  mc_config cfg;
  mc_train_state state;
  mc_ckpt_item *items;
  int n_items, cap_items;
  int (*ready)(void *); /* staged saves: waits until the caller's buffers are filled */
  void *ready_user;
  unsigned char *buf;  /* one host buffer holding every copied shard; kept between saves */
  size_t buf_cap;      /* in bytes */
  /* the background thread */
  pthread_t thread;
  int running;         /* a thread was started and not yet joined */
  int rc;              /* result of the last finished save */
  int fail_only;       /* the thread only takes part in the barrier, failing (see below) */
  char err[MC_ERRMSG_MAX];
  char fail_err[MC_ERRMSG_MAX]; /* why a fail_only save failed (for the barrier's record) */
  pthread_mutex_t mu;
  int finished;        /* the thread has stored its result (under mu) */
  double stall;
  /* saves that succeeded, oldest first, until mc_ckpt_saver_take_done reports them (under
   * mu); the oldest is dropped when a fifth comes unreported */
  int n_done;
  int64_t done_step[4];
  double done_s[4];
};

int mc_ckpt_saver_create(const char *dir, const mc_ckpt_save_opts *opts, mc_ckpt_saver **out) {
  *out = NULL;
  if (!mc_h5_threadsafe())
    return mc_error("async checkpoint saving needs a thread-safe HDF5 build (this libhdf5 is not one); save synchronously");
  mc_ckpt_saver *s = calloc(1, sizeof *s);
  if (!s) return mc_error("out of memory creating a checkpoint saver");
  if (snprintf(s->dir, sizeof s->dir, "%s", dir) >= (int)sizeof s->dir) {
    free(s);
    return mc_error("checkpoint directory path too long: %s", dir);
  }
  if (opts) s->opts = *opts;
  else mc_ckpt_save_opts_default(&s->opts);
  pthread_mutex_init(&s->mu, NULL);
  *out = s;
  return 0;
}

static void mark_finished(mc_ckpt_saver *s) {
  pthread_mutex_lock(&s->mu);
  s->finished = 1;
  pthread_mutex_unlock(&s->mu);
}

static void *save_thread(void *arg) {
  mc_ckpt_saver *s = arg;
  /* The save shares the CPUs with the training loop's host thread, which launches the
   * device's work: it runs (with the hashing threads it starts, which inherit this) at a
   * lower priority, so the loop is not kept waiting for a CPU. Linux's nice is per thread. */
  setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
  if (!s->fail_only && s->ready && s->ready(s->ready_user) != 0) {
    /* The data never arrived: fail this save, on every process (through the barrier). */
    snprintf(s->err, sizeof s->err, "checkpoint step %lld: %s", (long long)s->state.step, mc_errmsg());
    if (s->opts.barrier) s->opts.barrier(s->opts.barrier_user, 0);
    s->rc = -1;
    mark_finished(s);
    return NULL;
  }
  if (s->fail_only) {
    /* This process failed before its save started (the caller has the error); the other
     * processes' saves wait for it in the first barrier, which makes them all fail. */
    mc_error("%s", s->fail_err); /* what a barrier may record of this failure */
    s->opts.barrier(s->opts.barrier_user, 0);
    s->rc = 0;
    mark_finished(s);
    return NULL;
  }
  const double t0 = mc_now_s();
  s->rc = mc_ckpt_save(s->dir, s->g, &s->cfg, &s->state, s->items, s->n_items, &s->opts);
  if (s->rc == 0) {
    pthread_mutex_lock(&s->mu);
    if (s->n_done == 4) {
      memmove(s->done_step, s->done_step + 1, 3 * sizeof s->done_step[0]);
      memmove(s->done_s, s->done_s + 1, 3 * sizeof s->done_s[0]);
      s->n_done = 3;
    }
    s->done_step[s->n_done] = s->state.step, s->done_s[s->n_done] = mc_now_s() - t0;
    s->n_done++;
    pthread_mutex_unlock(&s->mu);
  }
  if (s->rc) {
    /* The message is thread-local: keep it for whoever waits. */
    strncpy(s->err, mc_errmsg(), sizeof s->err - 1);
    s->err[sizeof s->err - 1] = 0;
  }
  mark_finished(s);
  return NULL;
}

static void join(mc_ckpt_saver *s) {
  if (s->running) {
    pthread_join(s->thread, NULL);
    s->running = 0;
  }
}

int mc_ckpt_saver_poll(mc_ckpt_saver *s) {
  if (s->running) {
    pthread_mutex_lock(&s->mu);
    int done = s->finished;
    pthread_mutex_unlock(&s->mu);
    if (!done) return 1;
  }
  return mc_ckpt_saver_wait(s);
}

int mc_ckpt_saver_wait(mc_ckpt_saver *s) {
  join(s);
  if (s->rc) {
    int rc = mc_error("async %s", s->err);
    s->rc = 0; /* reported once */
    return rc;
  }
  return 0;
}

typedef struct {
  const mc_ckpt_item *src;
  mc_ckpt_item *dst;
  const int64_t *numel; /* bytes of each */
} copy_ctx;

static int copy_job(void *ctx, int j) {
  copy_ctx *c = ctx;
  memcpy((void *)c->dst[j].data, c->src[j].data, (size_t)c->numel[j]);
  return 0;
}

/* Copies the primary shards among items into the saver's buffer (s->items, s->n_items). */
static int stage_copy(mc_ckpt_saver *s, const mc_geometry *g, const mc_ckpt_item *items, int n_items) {
  /* Only what will be written is copied: the primary hyperslabs. */
  int64_t *numel = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *numel);
  if (!numel) return mc_error("out of memory");
  size_t total = 0;
  int keep = 0;
  for (int i = 0; i < n_items; i++) {
    mc_shard sh;
    numel[i] = 0;
    if (items[i].family < 0 || items[i].family >= g->fams.n || items[i].rank < 0 || items[i].rank >= g->world ||
        (int)items[i].state < 0 || items[i].state >= MC_N_STATES) {
      free(numel);
      return mc_error("checkpoint item %d: family, state or rank out of range", i);
    }
    if (mc_ckpt_item_state_check(g, &items[i]) != 0) {
      free(numel);
      return -1;
    }
    if (mc_shard_of(g, items[i].family, items[i].state, items[i].rank, &sh) != 0) {
      free(numel);
      return -1;
    }
    if (!sh.held || !sh.primary) continue;
    if (!items[i].data) {
      free(numel);
      return mc_error("checkpoint item %s/%s of rank %d has no data", g->fams.f[items[i].family].name,
                      mc_state_name(items[i].state), items[i].rank);
    }
    /* bytes, at the dtype the family keeps the kind in (fp32, int64 counters) */
    numel[keep] = sh.numel * (int64_t)mc_elem_dtype_size(mc_opt_state_dtype(g->fams.f[items[i].family].opt, items[i].state));
    total += (size_t)(numel[keep] + 7) / 8 * 8; /* each copy 8-byte aligned */
    keep++;
  }
  if (keep > s->cap_items) {
    mc_ckpt_item *ni = realloc(s->items, (size_t)keep * sizeof *ni);
    if (!ni) {
      free(numel);
      return mc_error("out of memory");
    }
    s->items = ni;
    s->cap_items = keep;
  }
  if (total > s->buf_cap) {
    free(s->buf);
    s->buf = malloc(total);
    s->buf_cap = s->buf ? total : 0;
    if (!s->buf) {
      free(numel);
      return mc_error("out of memory: async checkpoint needs %zu bytes of host buffer", total);
    }
  }
  mc_ckpt_item *src = malloc((size_t)(keep > 0 ? keep : 1) * sizeof *src);
  if (!src) {
    free(numel);
    return mc_error("out of memory");
  }
  size_t off = 0;
  int k = 0;
  for (int i = 0; i < n_items; i++) {
    mc_shard sh;
    mc_shard_of(g, items[i].family, items[i].state, items[i].rank, &sh);
    if (!sh.held || !sh.primary) continue;
    src[k] = items[i];
    s->items[k] = items[i];
    s->items[k].data = s->buf + off;
    off += (size_t)(numel[k] + 7) / 8 * 8;
    k++;
  }
  copy_ctx cc = {src, s->items, numel};
  int rc = mc_parallel(keep, s->opts.io_threads > 0 ? s->opts.io_threads : 1, copy_job, &cc);
  free(src);
  free(numel);
  s->n_items = keep;
  return rc;
}

/* A save that failed before its thread started (the error is in mc_error): with other
 * processes saving too, they must learn of it, or their saves would wait in the barrier for
 * ever, so a thread takes part in it, failing. Returns -1. */
static int fail_start(mc_ckpt_saver *s, int64_t step, double t0) {
  if (s->opts.barrier) {
    s->fail_only = 1;
    snprintf(s->fail_err, sizeof s->fail_err, "checkpoint step %lld: %s", (long long)step, mc_errmsg());
    if (pthread_create(&s->thread, NULL, save_thread, s) == 0) s->running = 1;
  }
  s->stall = mc_now_s() - t0;
  return -1;
}

/* Starts the thread on s->items (filled). */
static int start(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg, const mc_train_state *state,
                 int (*ready)(void *), void *ready_user, double t0) {
  s->fail_only = 0;
  s->ready = ready;
  s->ready_user = ready_user;
  s->g = g;
  s->cfg = *cfg;
  s->state = *state;
  if (pthread_create(&s->thread, NULL, save_thread, s) != 0) return mc_error("cannot start the checkpoint thread");
  s->running = 1;
  s->stall = mc_now_s() - t0;
  return 0;
}

/* Waits for the previous save (its failure is this call's: every process fails alike, its
 * barriers saw to that) and clears the result. */
static int begin(mc_ckpt_saver *s, double t0) {
  if (mc_ckpt_saver_wait(s) != 0) {
    s->stall = mc_now_s() - t0;
    return -1;
  }
  s->rc = 0;
  s->err[0] = 0;
  s->finished = 0;
  return 0;
}

int mc_ckpt_saver_save(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg, const mc_train_state *state,
                       const mc_ckpt_item *items, int n_items) {
  double t0 = mc_now_s();
  if (begin(s, t0) != 0) return -1;
  if (stage_copy(s, g, items, n_items) != 0) return fail_start(s, state->step, t0);
  return start(s, g, cfg, state, NULL, NULL, t0);
}

int mc_ckpt_saver_save_staged(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg,
                              const mc_train_state *state, const mc_ckpt_item *items, int n_items,
                              int (*ready)(void *), void *ready_user) {
  double t0 = mc_now_s();
  if (begin(s, t0) != 0) return -1;
  if (n_items > s->cap_items) {
    mc_ckpt_item *ni = realloc(s->items, (size_t)n_items * sizeof *ni);
    if (!ni) {
      mc_error("out of memory");
      return fail_start(s, state->step, t0);
    }
    s->items = ni;
    s->cap_items = n_items;
  }
  if (n_items > 0) memcpy(s->items, items, (size_t)n_items * sizeof *items);
  s->n_items = n_items;
  return start(s, g, cfg, state, ready, ready_user, t0);
}

double mc_ckpt_saver_last_stall(const mc_ckpt_saver *s) { return s->stall; }

int mc_ckpt_saver_take_done(mc_ckpt_saver *s, int64_t *step, double *seconds) {
  pthread_mutex_lock(&s->mu);
  const int got = s->n_done > 0;
  if (got) {
    *step = s->done_step[0], *seconds = s->done_s[0];
    s->n_done--;
    memmove(s->done_step, s->done_step + 1, (size_t)s->n_done * sizeof s->done_step[0]);
    memmove(s->done_s, s->done_s + 1, (size_t)s->n_done * sizeof s->done_s[0]);
  }
  pthread_mutex_unlock(&s->mu);
  return got;
}

int mc_ckpt_saver_close(mc_ckpt_saver *s) {
  if (!s) return 0;
  int rc = mc_ckpt_saver_wait(s);
  free(s->items);
  free(s->buf);
  pthread_mutex_destroy(&s->mu);
  free(s);
  return rc;
}

/* ---------------------------------------------------------------- file-system barrier */

/* Call k of process r writes <dir>/b<k>.r<r> (by rename, so it is never seen half written):
 * "1\n", or "0 <message>\n" when r has failed. A process returns from call k once every
 * process's marker k exists: 1 if all say 1. A process that times out writes <dir>/abort,
 * after which every call of every process fails at once (the calls may no longer pair up).
 * Process 0, having seen every marker k, removes the markers of call k-1: each process
 * wrote marker k only after it had finished reading those. */
struct mc_ckpt_fs_barrier {
  char dir[MC_PATH_MAX];
  int rank, world;
  double timeout_s;
  int64_t call;
  int fail_rank;              /* lowest failing rank of the last failed call, -1 if none */
  char fail_msg[MC_ERRMSG_MAX];
  pthread_mutex_t mu;         /* guards fail_rank and fail_msg (read by the main thread) */
};

int mc_ckpt_fs_barrier_create(const char *sync_dir, int rank, int world, double timeout_s, mc_ckpt_fs_barrier **out) {
  *out = NULL;
  if (world < 1 || rank < 0 || rank >= world) return mc_error("file-system barrier: rank %d of %d", rank, world);
  mc_ckpt_fs_barrier *b = calloc(1, sizeof *b);
  if (!b) return mc_error("out of memory");
  if (snprintf(b->dir, sizeof b->dir, "%s", sync_dir) >= (int)sizeof b->dir) {
    free(b);
    return mc_error("checkpoint sync directory path too long: %s", sync_dir);
  }
  b->rank = rank;
  b->world = world;
  b->timeout_s = timeout_s > 0 ? timeout_s : 600;
  b->fail_rank = -1;
  pthread_mutex_init(&b->mu, NULL);
  if (rank == 0 && ((mc_path_exists(sync_dir) && mc_rmtree(sync_dir) != 0) || mc_mkdir_p(sync_dir) != 0)) {
    pthread_mutex_destroy(&b->mu);
    free(b);
    return mc_error_context("checkpoint sync directory %s", sync_dir);
  }
  *out = b;
  return 0;
}

void mc_ckpt_fs_barrier_free(mc_ckpt_fs_barrier *b, int remove_dir) {
  if (!b) return;
  if (remove_dir && b->rank == 0) mc_rmtree(b->dir);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

int mc_ckpt_fs_barrier_failure(mc_ckpt_fs_barrier *b, char *msg, size_t cap) {
  pthread_mutex_lock(&b->mu);
  int r = b->fail_rank;
  if (msg && cap) snprintf(msg, cap, "%s", r >= 0 ? b->fail_msg : "");
  pthread_mutex_unlock(&b->mu);
  return r;
}

static int put_file(const char *path, const char *text) {
  char tmp[MC_PATH_MAX + 80]; /* the longest marker path (MC_PATH_MAX + 64) and ".tmp" */
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return -1;
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    remove(tmp);
    return -1;
  }
  return 0;
}

static void record_failure(mc_ckpt_fs_barrier *b, int rank, const char *msg) {
  pthread_mutex_lock(&b->mu);
  if (b->fail_rank < 0 || rank < b->fail_rank) {
    b->fail_rank = rank;
    snprintf(b->fail_msg, sizeof b->fail_msg, "%s", msg && *msg ? msg : "(no message)");
  }
  pthread_mutex_unlock(&b->mu);
}

static int abort_seen(mc_ckpt_fs_barrier *b) {
  char p[MC_PATH_MAX + 16];
  snprintf(p, sizeof p, "%s/abort", b->dir);
  if (!mc_path_exists(p)) return 0;
  char *text = NULL;
  size_t len = 0;
  int rank = -1;
  if (mc_read_file(p, &text, &len) == 0 && sscanf(text, "%d", &rank) == 1) {
    const char *m = strchr(text, ' ');
    char *nl = strchr(text, '\n');
    if (nl) *nl = 0;
    record_failure(b, rank, m ? m + 1 : "");
  }
  free(text);
  return 1;
}

int mc_ckpt_fs_barrier_fn(void *user, int ok) {
  mc_ckpt_fs_barrier *b = user;
  int64_t k = b->call++;
  pthread_mutex_lock(&b->mu);
  b->fail_rank = -1;
  pthread_mutex_unlock(&b->mu);
  char path[MC_PATH_MAX + 64];
  char *text = malloc(MC_ERRMSG_MAX + 8);
  if (!text) return 0;
  const char *msg = mc_errmsg();
  if (ok) snprintf(text, MC_ERRMSG_MAX + 8, "1\n");
  else snprintf(text, MC_ERRMSG_MAX + 8, "0 %s\n", msg && *msg ? msg : "(no message)");
  for (char *c = text + 2; !ok && *c && c[1]; c++)
    if (*c == '\n') *c = ' '; /* one line */
  snprintf(path, sizeof path, "%s/b%lld.r%d", b->dir, (long long)k, b->rank);
  if (put_file(path, text) != 0) {
    free(text);
    return 0; /* the others time out on this marker and abort */
  }
  free(text);
  if (!ok) record_failure(b, b->rank, msg);
  int all = ok;
  double t0 = mc_now_s();
  struct timespec nap = {0, 1000000}; /* 1 ms, growing to 20 ms */
  for (int r = 0; r < b->world; r++) {
    snprintf(path, sizeof path, "%s/b%lld.r%d", b->dir, (long long)k, r);
    while (!mc_path_exists(path)) {
      if (abort_seen(b)) return 0;
      if (mc_now_s() - t0 > b->timeout_s) {
        char ab[MC_PATH_MAX + 16], line[512];
        snprintf(ab, sizeof ab, "%s/abort", b->dir);
        snprintf(line, sizeof line, "%d rank %d saw no checkpoint barrier marker from rank %d within %.0f s\n", b->rank,
                 b->rank, r, b->timeout_s);
        put_file(ab, line);
        record_failure(b, r, "no checkpoint barrier marker within the timeout (process dead or stuck?)");
        return 0;
      }
      nanosleep(&nap, NULL);
      if (nap.tv_nsec < 20000000) nap.tv_nsec *= 2;
    }
    char *got = NULL;
    size_t len = 0;
    if (mc_read_file(path, &got, &len) != 0) {
      record_failure(b, r, mc_errmsg());
      all = 0;
      continue;
    }
    if (got[0] != '1') {
      char *nl = strchr(got, '\n');
      if (nl) *nl = 0;
      record_failure(b, r, len > 2 ? got + 2 : "");
      all = 0;
    }
    free(got);
  }
  if (b->rank == 0 && k > 0)
    for (int r = 0; r < b->world; r++) {
      snprintf(path, sizeof path, "%s/b%lld.r%d", b->dir, (long long)(k - 1), r);
      remove(path);
    }
  return all;
}
