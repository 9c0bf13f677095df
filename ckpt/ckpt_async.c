/* Asynchronous save: the caller is blocked only while the state is copied into host buffers
 * the saver owns (and while a previous save still runs); a background thread then does the
 * whole mc_ckpt_save. Its result is kept until a wait, the next save or close reports it. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt_internal.h"
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
  float *buf;          /* one host buffer holding every copied shard; kept between saves */
  size_t buf_cap;      /* in floats */
  /* the background thread */
  pthread_t thread;
  int running;         /* a thread was started and not yet joined */
  int rc;              /* result of the last finished save */
  int fail_only;       /* the thread only takes part in the barrier, failing (see below) */
  char err[MC_ERRMSG_MAX];
  double stall;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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
  *out = s;
  return 0;
}

static void *save_thread(void *arg) {
  mc_ckpt_saver *s = arg;
  if (s->fail_only) {
    /* This process failed before its save started (the caller has the error); the other
     * processes' saves wait for it in the first barrier, which makes them all fail. */
    s->opts.barrier(s->opts.barrier_user, 0);
    s->rc = 0;
    return NULL;
  }
  s->rc = mc_ckpt_save(s->dir, s->g, &s->cfg, &s->state, s->items, s->n_items, &s->opts);
  if (s->rc) {
    /* The message is thread-local: keep it for whoever waits. */
    strncpy(s->err, mc_errmsg(), sizeof s->err - 1);
    s->err[sizeof s->err - 1] = 0;
  }
  return NULL;
}

int mc_ckpt_saver_wait(mc_ckpt_saver *s) {
  if (s->running) {
    pthread_join(s->thread, NULL);
    s->running = 0;
  }
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
  const int64_t *numel;
} copy_ctx;

static int copy_job(void *ctx, int j) {
  copy_ctx *c = ctx;
  memcpy((float *)c->dst[j].data, c->src[j].data, (size_t)c->numel[j] * sizeof(float));
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
    numel[keep] = sh.numel;
    total += (size_t)sh.numel;
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
    s->buf = malloc(total * sizeof(float));
    s->buf_cap = s->buf ? total : 0;
    if (!s->buf) {
      free(numel);
      return mc_error("out of memory: async checkpoint needs %zu bytes of host buffer", total * sizeof(float));
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
    off += (size_t)sh.numel;
    k++;
  }
  copy_ctx cc = {src, s->items, numel};
  int rc = mc_parallel(keep, s->opts.io_threads > 0 ? s->opts.io_threads : 1, copy_job, &cc);
  free(src);
  free(numel);
  s->n_items = keep;
  return rc;
}

int mc_ckpt_saver_save(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg, const mc_train_state *state,
                       const mc_ckpt_item *items, int n_items) {
  double t0 = now_s();
  /* A failed previous save failed on every process (its barriers saw to that), so every
   * process returns here alike. */
  if (mc_ckpt_saver_wait(s) != 0) {
    s->stall = now_s() - t0;
    return -1;
  }
  s->rc = 0;
  s->err[0] = 0;
  if (stage_copy(s, g, items, n_items) != 0) {
    /* With other processes saving too, they must learn of this failure, or their saves would
     * wait in the barrier for ever: a thread takes part in it, failing. */
    if (s->opts.barrier) {
      s->fail_only = 1;
      if (pthread_create(&s->thread, NULL, save_thread, s) == 0) s->running = 1;
    }
    s->stall = now_s() - t0;
    return -1;
  }
  s->fail_only = 0;
  s->g = g;
  s->cfg = *cfg;
  s->state = *state;
  if (pthread_create(&s->thread, NULL, save_thread, s) != 0) return mc_error("cannot start the checkpoint thread");
  s->running = 1;
  s->stall = now_s() - t0;
  return 0;
}

double mc_ckpt_saver_last_stall(const mc_ckpt_saver *s) { return s->stall; }

int mc_ckpt_saver_close(mc_ckpt_saver *s) {
  if (!s) return 0;
  int rc = mc_ckpt_saver_wait(s);
  free(s->items);
  free(s->buf);
  free(s);
  return rc;
}
