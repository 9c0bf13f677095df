/* A pool of worker threads over numbered jobs (util/pool.h). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "util/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct mc_pool {
  int n_jobs, n_threads;
  mc_job_fn fn;
  void *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int next;       /* next job to hand out */
  int cancelled;
  signed char *state; /* 0 pending/running, 1 ok, -1 failed, -2 never ran (cancelled) */
  char **msg;         /* error message of each failed job */
  pthread_t *threads;
};

static void *pool_worker(void *arg) {
  mc_pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    if (p->cancelled || p->next >= p->n_jobs) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    int j = p->next++;
    pthread_mutex_unlock(&p->mu);
    mc_error_clear();
    int rc = p->fn(p->ctx, j);
    char *m = rc ? strdup(mc_errmsg()) : NULL;
    pthread_mutex_lock(&p->mu);
    p->state[j] = rc ? -1 : 1;
    p->msg[j] = m;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

mc_pool *mc_pool_start(int n_jobs, int threads, mc_job_fn fn, void *ctx) {
  mc_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  if (threads < 1) threads = 1;
  if (threads > n_jobs) threads = n_jobs > 0 ? n_jobs : 1;
  p->n_jobs = n_jobs;
  p->fn = fn;
  p->ctx = ctx;
  p->state = calloc((size_t)(n_jobs > 0 ? n_jobs : 1), 1);
  p->msg = calloc((size_t)(n_jobs > 0 ? n_jobs : 1), sizeof(char *));
  p->threads = calloc((size_t)threads, sizeof(pthread_t));
  if (!p->state || !p->msg || !p->threads) {
    free(p->state);
    free(p->msg);
    free(p->threads);
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (int t = 0; t < threads && n_jobs > 0; t++) {
    if (pthread_create(&p->threads[t], NULL, pool_worker, p) != 0) break;
    p->n_threads++;
  }
  return p;
}

int mc_pool_wait_job(mc_pool *p, int j) {
  pthread_mutex_lock(&p->mu);
  while (p->state[j] == 0 && !(p->cancelled && j >= p->next)) {
    if (p->n_threads == 0) {
      pthread_mutex_unlock(&p->mu);
      return mc_error("could not start any worker thread");
    }
    pthread_cond_wait(&p->cv, &p->mu);
  }
  int st = p->state[j];
  pthread_mutex_unlock(&p->mu);
  if (st == 1) return 0;
  if (st == -1) return mc_error("%s", p->msg[j]);
  return mc_error("job %d was cancelled", j);
}

void mc_pool_cancel(mc_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->cancelled = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

int mc_pool_finish(mc_pool *p) {
  for (int t = 0; t < p->n_threads; t++) pthread_join(p->threads[t], NULL);
  int rc = 0;
  if (p->n_threads == 0 && p->n_jobs > 0) rc = mc_error("could not start any worker thread");
  for (int j = 0; j < p->n_jobs && rc == 0; j++)
    if (p->state[j] == -1) rc = mc_error("%s", p->msg[j]);
  for (int j = 0; j < p->n_jobs; j++) free(p->msg[j]);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->state);
  free(p->msg);
  free(p->threads);
  free(p);
  return rc;
}

int mc_parallel(int n_jobs, int threads, mc_job_fn fn, void *ctx) {
  mc_pool *p = mc_pool_start(n_jobs, threads, fn, ctx);
  if (!p) return mc_error("out of memory starting %d worker threads", threads);
  return mc_pool_finish(p);
}
