/* Snapshot copies (kernels/ops.h snap_*): a checkpoint's device-to-host copies of the optimizer
 * state, run beside training.
 *
 * Why a pump thread: a copy engine serves its queue in order, so one multi-gigabyte copy
 * queued at once holds back every small device-to-host copy the training loop makes after it
 * (an expert layer's counts, the loss) until the whole snapshot is through, and the step
 * stalls that long (dense-a on an H100: a 6.44 GB snapshot took a step from 218 to 323 ms).
 * So snap_to_host only records the copy; a thread issues the batch in chunks of
 * MC_SNAP_CHUNK_KB KiB (default 2048), at most MC_SNAP_IN_FLIGHT (default 4, at most 16)
 * queued at a time, and a small copy of the training loop waits behind that many chunks at
 * most. MC_SNAP_CHUNK_KB=0 queues each tensor whole, all at once, as before (for
 * comparisons).
 *
 * Order: snap_begin records an event on the compute stream that the snapshot stream waits
 * for, so the copies see exactly the work queued before it. snap_fence waits (host side)
 * until the pump has queued the whole batch and its end event, then puts that event in front
 * of later compute work. snap_wait blocks until the batch is in host memory. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"

#define MC_SNAP_MAX_IN_FLIGHT 16

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} snap_copy;

struct mc_cuda_snap {
  int device;
  size_t chunk;  /* bytes per queued copy; 0: each tensor whole */
  int in_flight; /* chunks queued at most at a time */
  cudaStream_t stream;
  cudaEvent_t start, done, ring[MC_SNAP_MAX_IN_FLIGHT];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  snap_copy *list; /* the batch: appended by the training thread between begin and end */
  int n, cap;
  int handed;  /* snap_end gave the batch to the pump, which has not finished it */
  int queued;  /* the pump queued every copy of the batch and recorded `done` */
  int pending; /* a batch was ended (fence and wait have something to wait for) */
  int failed;  /* the pump failed; `failure` says how (reported by fence and wait) */
  char failure[256];
};

static void pump_fail(mc_cuda_snap *s, const char *what, cudaError_t e) {
  pthread_mutex_lock(&s->mu);
  if (!s->failed) snprintf(s->failure, sizeof s->failure, "snapshot copy: %s: %s", what, cudaGetErrorString(e));
  s->failed = 1;
  pthread_mutex_unlock(&s->mu);
}

/* Queues one batch in chunks, keeping at most s->in_flight of them queued. */
static void pump_batch(mc_cuda_snap *s, const snap_copy *list, int n) {
  cudaError_t e = cudaSuccess;
  int64_t k = 0; /* chunks queued so far */
  for (int i = 0; i < n && e == cudaSuccess; i++) {
    size_t step = s->chunk ? s->chunk : list[i].bytes;
    for (size_t off = 0; off < list[i].bytes && e == cudaSuccess; off += step, k++) {
      cudaEvent_t slot = s->ring[k % s->in_flight];
      if (s->chunk && k >= s->in_flight && (e = cudaEventSynchronize(slot)) != cudaSuccess) break;
      size_t len = list[i].bytes - off < step ? list[i].bytes - off : step;
      e = cudaMemcpyAsync((char *)list[i].dst + off, (const char *)list[i].src + off, len, cudaMemcpyDeviceToHost,
                          s->stream);
      if (e == cudaSuccess && s->chunk) e = cudaEventRecord(slot, s->stream);
    }
  }
  if (e == cudaSuccess) e = cudaEventRecord(s->done, s->stream);
  if (e != cudaSuccess) pump_fail(s, "queueing the copies", e);
}

static void *pump_main(void *arg) {
  mc_cuda_snap *s = (mc_cuda_snap *)arg;
  cudaError_t e = cudaSetDevice(s->device); /* a new thread starts on device 0 */
  if (e != cudaSuccess) pump_fail(s, "cudaSetDevice", e);
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->handed) pthread_cond_wait(&s->cv, &s->mu);
    const snap_copy *list = s->list;
    const int n = s->n, ok = !s->failed;
    pthread_mutex_unlock(&s->mu);
    if (ok) pump_batch(s, list, n);
    pthread_mutex_lock(&s->mu);
    s->queued = 1; /* also after a failure: fence and wait must not block forever */
    s->handed = 0;
    pthread_cond_broadcast(&s->cv);
  }
  return NULL;
}

/* A non-negative integer environment setting up to max; fallback when unset or not one. */
static long env_setting(const char *name, long fallback, long max) {
  const char *v = getenv(name);
  char *end = NULL;
  long x = v && *v ? strtol(v, &end, 10) : fallback;
  return v && *v && (*end || x < 0 || x > max) ? fallback : x;
}

/* The pump, its stream and events, made at the first snap_begin; NULL with the failure
 * recorded when they cannot be. Never freed, as the backend itself. */
static mc_cuda_snap *snap_state(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  if (c->snap) return c->snap;
  mc_cuda_snap *s = (mc_cuda_snap *)calloc(1, sizeof *s);
  if (!s) {
    mc_cuda_fail(be, "snap_begin: out of host memory");
    return NULL;
  }
  s->device = c->device;
  s->chunk = (size_t)env_setting("MC_SNAP_CHUNK_KB", 0, 1L << 30) << 10;
  s->in_flight = (int)env_setting("MC_SNAP_IN_FLIGHT", 4, MC_SNAP_MAX_IN_FLIGHT);
  if (s->in_flight < 1) s->in_flight = 1;
  cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->start, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming | cudaEventBlockingSync);
  for (int k = 0; k < s->in_flight && e == cudaSuccess; k++)
    e = cudaEventCreateWithFlags(&s->ring[k], cudaEventDisableTiming | cudaEventBlockingSync);
  if (e != cudaSuccess) {
    mc_cuda_fail(be, "snap_begin: cannot create the snapshot stream: %s", cudaGetErrorString(e));
    free(s); /* the stream and events leak: creating them failed anyway */
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, pump_main, s) != 0) {
    mc_cuda_fail(be, "snap_begin: cannot start the snapshot copy thread");
    free(s);
    return NULL;
  }
  pthread_detach(s->thread);
  c->snap = s;
  return s;
}

static void cu_snap_begin(mc_backend *be) {
  mc_cuda_snap *s = snap_state(be);
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  while (s->handed) pthread_cond_wait(&s->cv, &s->mu); /* one batch at a time */
  s->n = 0;
  pthread_mutex_unlock(&s->mu);
  cudaError_t e = cudaEventRecord(s->start, mc_cu_stream(be));
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, s->start, 0);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_begin: %s", cudaGetErrorString(e));
}

static void cu_snap_to_host(mc_backend *be, void *host_dst, const void *src, size_t bytes) {
  mc_cuda_snap *s = mc_cu(be)->snap;
  if (!bytes || !s) return; /* no state: snap_begin recorded the failure */
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 256;
    snap_copy *l = (snap_copy *)realloc(s->list, sizeof *l * (size_t)cap);
    if (!l) {
      mc_cuda_fail(be, "snap_to_host: out of host memory");
      return;
    }
    s->list = l, s->cap = cap;
  }
  s->list[s->n++] = (snap_copy){host_dst, src, bytes};
}

static void cu_snap_end(mc_backend *be) {
  mc_cuda_snap *s = mc_cu(be)->snap;
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->queued = 0;
  s->handed = 1;
  s->pending = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Waits until the pump has queued the batch; returns its failure flag (message in s). */
static int wait_queued(mc_cuda_snap *s) {
  pthread_mutex_lock(&s->mu);
  while (s->handed || !s->queued) pthread_cond_wait(&s->cv, &s->mu);
  int failed = s->failed;
  pthread_mutex_unlock(&s->mu);
  return failed;
}

static void cu_snap_fence(mc_backend *be) {
  mc_cuda_snap *s = mc_cu(be)->snap;
  if (!s || !s->pending) return;
  if (wait_queued(s)) {
    mc_cuda_fail(be, "%s", s->failure);
    return;
  }
  cudaError_t e = cudaStreamWaitEvent(mc_cu_stream(be), s->done, 0);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_fence: %s", cudaGetErrorString(e));
}

/* Called from the checkpoint thread: it neither reads nor writes the backend's failure
 * record (the training thread owns it); the error goes to this thread's mc_error. */
static int cu_snap_wait(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  mc_cuda_snap *s = c->snap;
  if (!s || !s->pending) return 0;
  if (wait_queued(s)) return mc_error("cuda backend (device %d): %s", c->device, s->failure);
  cudaError_t e = cudaSetDevice(c->device); /* a new thread starts on device 0 */
  if (e == cudaSuccess) e = cudaEventSynchronize(s->done);
  if (e != cudaSuccess)
    return mc_error("cuda backend (device %d): snapshot copy to the host failed: %s", c->device, cudaGetErrorString(e));
  return 0;
}

void mc_cuda_install_snap(mc_backend *be) {
  be->snap_begin = cu_snap_begin;
  be->snap_to_host = cu_snap_to_host;
  be->snap_end = cu_snap_end;
  be->snap_fence = cu_snap_fence;
  be->snap_wait = cu_snap_wait;
}
