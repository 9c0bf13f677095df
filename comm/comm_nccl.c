/* NCCL backend of the collective interface (GPU ranks, one process per GPU; comm/comm.h).
 *
 * Every operation runs on one process-wide stream and is waited for before it returns, so
 * the callers' rule stays the MPI one: after the call the buffers hold the result. The wait
 * polls the stream and the communicator's asynchronous error, and gives up after the timeout
 * (the communicator is then aborted), so a stalled or dead peer ends in an error naming the
 * operation and group, never a hang. Host buffers (loss sums, routing counts) are staged
 * through a device scratch buffer; unequal reduce-scatter and all-gather counts (ZeRO chunks
 * differ by a row) run the equal-count NCCL collective over chunks padded to the largest.
 *
 * Stream-ordered mode (mc_comm_nccl_order_with): the stream is the device backend's compute
 * stream, and an operation on device buffers returns once queued, so the host never drains
 * the GPU around a collective (ZeRO 3 makes hundreds a step). Each queued operation records
 * an event; a watchdog thread takes over the timeout and the asynchronous-error check for
 * them, and ends the process naming the operation when one fails or stalls (the calling
 * thread may by then be waiting in the backend's sync, where nothing else would notice).
 * The side queue (comm/comm.h mc_comm_side_begin) is a second stream, of the highest
 * priority, joined to the compute stream by events: a fork event on entry, a ticket event
 * on exit that the compute stream waits for. Each stream has its own staging scratch. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "util/clock.h"
#include "util/error.h"

#ifdef MC_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/rendezvous.h"

int mc_comm_have_nccl(void) { return 1; }

/* Queued operations the watchdog follows, oldest first (a ring; the caller waits for the
 * oldest when it is full). */
#define WATCH_SLOTS 1024
typedef struct {
  cudaEvent_t done;
  double t0;
  mc_comm *c;
  const char *op;
} watch_slot;

/* The process's one device, its streams and their staging scratch. */
static struct {
  int device;
  cudaStream_t stream;  /* where operations queue now: compute, or side inside the side queue */
  cudaStream_t compute; /* stream-ordered mode: the backend's compute stream */
  cudaStream_t side;    /* stream-ordered mode: the side queue's stream */
  int on_side;
  cudaEvent_t fork, tickets[MC_COMM_SIDE_TICKETS];
  int next_ticket;
  char *scratch[2];     /* [on_side] */
  size_t scratch_cap[2];
  double timeout_s;
  mc_rdv *rdv;
  int ordered; /* stream-ordered mode: stream is the compute stream */
  pthread_t watchdog;
  pthread_mutex_t lock;
  watch_slot ring[WATCH_SLOTS];
  int head, count; /* under lock */
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

typedef struct {
  ncclComm_t comm;
  int is_world;
} nccl_impl;

static ncclComm_t handle(mc_comm *c) { return ((nccl_impl *)c->impl)->comm; }

static ncclDataType_t nccl_type(mc_dtype t) {
  switch (t) {
    case MC_DT_F32: return ncclFloat32;
    case MC_DT_F64: return ncclFloat64;
    case MC_DT_I32: return ncclInt32;
    case MC_DT_I64: return ncclInt64;
    case MC_DT_U8: return ncclUint8;
    case MC_DT_BF16: return ncclBfloat16;
  }
  return ncclUint8;
}

static int where(mc_comm *c, const char *op, const char *what, const char *detail) {
  return mc_error("NCCL %s on the %s group (rank %d of %d, world rank %d): %s%s%s", op, c->label, c->rank, c->size,
                  c->world_rank, what, detail ? ": " : "", detail ? detail : "");
}

static int check_nccl(ncclResult_t rc, mc_comm *c, const char *op) {
  if (rc == ncclSuccess || rc == ncclInProgress) return 0;
  const char *last = ncclGetLastError(handle(c));
  return where(c, op, ncclGetErrorString(rc), last && *last ? last : NULL);
}

static int check_cuda(cudaError_t e, mc_comm *c, const char *op) {
  return e == cudaSuccess ? 0 : where(c, op, "CUDA error", cudaGetErrorString(e));
}


static void fail_and_exit(mc_comm *c, const char *op, const char *why, const char *detail);

/* Waits for everything queued on the stream (the operation and its staging copies). On a
 * failure or timeout in stream-ordered mode the process ends as the watchdog ends it
 * (fail_and_exit): the stream may hold earlier operations stuck on the same peer, and
 * ncclCommAbort would wait for them, so the error would never be printed. */
static int wait_done(mc_comm *c, const char *op) {
  const double t0 = mc_now_s();
  for (long spin = 0;; spin++) {
    cudaError_t e = cudaStreamQuery(P.stream);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) return check_cuda(e, c, op);
    ncclResult_t ar = ncclSuccess;
    ncclCommGetAsyncError(handle(c), &ar);
    if (ar != ncclSuccess && ar != ncclInProgress) {
      if (P.ordered) fail_and_exit(c, op, ncclGetErrorString(ar), ncclGetLastError(handle(c)));
      int rc = check_nccl(ar, c, op);
      ncclCommAbort(handle(c));
      ((nccl_impl *)c->impl)->comm = NULL;
      return rc;
    }
    if (P.timeout_s > 0 && mc_now_s() - t0 > P.timeout_s) {
      char why[160];
      snprintf(why, sizeof why, "not complete after %.0f s (MC_COMM_TIMEOUT_S)", P.timeout_s);
      if (P.ordered) fail_and_exit(c, op, why, "a peer rank is stalled or gone");
      ncclCommAbort(handle(c));
      ((nccl_impl *)c->impl)->comm = NULL;
      return where(c, op, why, "a peer rank is stalled or gone");
    }
    if (spin > 2000) { /* a short busy spin first: most operations finish in microseconds */
      struct timespec nap = {0, 50 * 1000};
      nanosleep(&nap, NULL);
    }
  }
}

/* Returns holding P.lock once the watch ring holds fewer than n operations (the watchdog
 * retires them in order as they complete, or ends the process on a stalled one). */
static void lock_when_ring_below(int n) {
  for (;;) {
    pthread_mutex_lock(&P.lock);
    if (P.count < n) return;
    pthread_mutex_unlock(&P.lock);
    struct timespec nap = {0, 100 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* The end of an operation just queued: in stream-ordered mode, with every buffer on the
 * device, hand it to the watchdog and return; otherwise wait for it. */
static int finish(mc_comm *c, const char *op, int device_only) {
  if (!P.ordered || !device_only) return wait_done(c, op);
  lock_when_ring_below(WATCH_SLOTS); /* a full ring: the watchdog frees the oldest */
  watch_slot *w = &P.ring[(P.head + P.count) % WATCH_SLOTS];
  cudaError_t e = cudaEventRecord(w->done, P.stream);
  if (e == cudaSuccess) {
    w->t0 = mc_now_s(), w->c = c, w->op = op;
    P.count++;
  }
  pthread_mutex_unlock(&P.lock);
  return check_cuda(e, c, op);
}

static void fail_and_exit(mc_comm *c, const char *op, const char *why, const char *detail) {
  fprintf(stderr, "rank %d: error: NCCL %s on the %s group (rank %d of %d): %s%s%s; ending this process\n",
          c->world_rank, op, c->label, c->rank, c->size, why, detail ? ": " : "", detail ? detail : "");
  fflush(stderr);
  _Exit(1); /* not ncclCommAbort first: it can wait on the stalled operation itself */
}

static void watch_fail(const watch_slot *w, const char *why, const char *detail) { fail_and_exit(w->c, w->op, why, detail); }

/* The watchdog: retires completed operations in order; fails the process on an
 * asynchronous NCCL error or an operation older than the timeout. */
static void *watchdog_main(void *arg) {
  (void)arg;
  cudaSetDevice(P.device);
  for (;;) {
    pthread_mutex_lock(&P.lock);
    int busy = P.count > 0;
    watch_slot w = busy ? P.ring[P.head] : (watch_slot){0};
    pthread_mutex_unlock(&P.lock);
    if (busy) {
      cudaError_t e = cudaEventQuery(w.done);
      if (e == cudaSuccess) {
        pthread_mutex_lock(&P.lock);
        P.head = (P.head + 1) % WATCH_SLOTS, P.count--;
        pthread_mutex_unlock(&P.lock);
        continue;
      }
      if (e != cudaErrorNotReady) watch_fail(&w, "CUDA error", cudaGetErrorString(e));
      ncclResult_t ar = ncclSuccess;
      if (handle(w.c)) ncclCommGetAsyncError(handle(w.c), &ar);
      if (ar != ncclSuccess && ar != ncclInProgress) watch_fail(&w, ncclGetErrorString(ar), ncclGetLastError(handle(w.c)));
      if (P.timeout_s > 0 && mc_now_s() - w.t0 > P.timeout_s) {
        char why[160];
        snprintf(why, sizeof why, "not complete after %.0f s (MC_COMM_TIMEOUT_S)", P.timeout_s);
        watch_fail(&w, why, "a peer rank is stalled or gone");
      }
    }
    struct timespec nap = {0, busy ? 20 * 1000 : 200 * 1000};
    nanosleep(&nap, NULL);
  }
  return NULL;
}

int mc_comm_nccl_order_with(void *cuda_stream) {
  if (!P.stream) return mc_error("stream-ordered NCCL: no NCCL world in this process");
  if (P.ordered) return 0;
  cudaError_t e = cudaStreamSynchronize(P.stream); /* nothing of the module's own stream is left behind */
  for (int i = 0; e == cudaSuccess && i < WATCH_SLOTS; i++)
    e = cudaEventCreateWithFlags(&P.ring[i].done, cudaEventDisableTiming);
  int lo = 0, hi = 0;
  if (e == cudaSuccess) e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
  if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&P.side, cudaStreamNonBlocking, hi);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&P.fork, cudaEventDisableTiming);
  for (int i = 0; e == cudaSuccess && i < MC_COMM_SIDE_TICKETS; i++)
    e = cudaEventCreateWithFlags(&P.tickets[i], cudaEventDisableTiming);
  if (e != cudaSuccess) return mc_error("stream-ordered NCCL: %s", cudaGetErrorString(e));
  P.stream = P.compute = (cudaStream_t)cuda_stream;
  P.ordered = 1;
  if (pthread_create(&P.watchdog, NULL, watchdog_main, NULL) != 0) {
    P.ordered = 0;
    return mc_error("stream-ordered NCCL: cannot start the watchdog thread");
  }
  pthread_detach(P.watchdog);
  return 0;
}

static int nc_ordered(const mc_comm *c) {
  (void)c;
  return P.ordered;
}

static int nc_side_begin(mc_comm *c) {
  const char *op = "side queue";
  if (P.on_side) return where(c, op, "already inside the side queue", NULL);
  if (check_cuda(cudaEventRecord(P.fork, P.compute), c, op) || check_cuda(cudaStreamWaitEvent(P.side, P.fork, 0), c, op))
    return -1;
  P.stream = P.side, P.on_side = 1;
  return 0;
}

static int nc_side_end(mc_comm *c, int *ticket) {
  const char *op = "side queue";
  if (!P.on_side) return where(c, op, "not inside the side queue", NULL);
  P.stream = P.compute, P.on_side = 0;
  const int t = P.next_ticket;
  if (check_cuda(cudaEventRecord(P.tickets[t], P.side), c, op)) return -1;
  P.next_ticket = (t + 1) % MC_COMM_SIDE_TICKETS;
  *ticket = t;
  return 0;
}

static int nc_side_wait(mc_comm *c, int ticket) {
  if (ticket < 0 || ticket >= MC_COMM_SIDE_TICKETS) return where(c, "side queue", "no such ticket", NULL);
  return check_cuda(cudaStreamWaitEvent(P.compute, P.tickets[ticket], 0), c, "side queue");
}

static int alive(mc_comm *c, const char *op) {
  return handle(c) ? 0 : where(c, op, "the communicator was aborted by an earlier failure", NULL);
}

/* Device scratch of the current stream of at least `bytes` (grown, never shrunk; the uses
 * queued before on that stream come first, and cudaFree waits for the device). */
static char *scratch(mc_comm *c, size_t bytes, const char *op) {
  const int s = P.on_side;
  if (bytes <= P.scratch_cap[s]) return P.scratch[s];
  size_t cap = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
  if (P.scratch[s]) cudaFree(P.scratch[s]);
  P.scratch[s] = NULL, P.scratch_cap[s] = 0;
  if (check_cuda(cudaMalloc((void **)&P.scratch[s], cap), c, op)) return NULL;
  P.scratch_cap[s] = cap;
  return P.scratch[s];
}

static int on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* A copy on the stream between any two of host and device memory (unified addressing). */
static int copy(mc_comm *c, void *dst, const void *src, size_t bytes, const char *op) {
  if (bytes == 0 || dst == src) return 0;
  return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, P.stream), c, op);
}

static int64_t max_count(const int64_t *counts, int n, int *equal) {
  int64_t m = 0;
  *equal = 1;
  for (int i = 0; i < n; i++) m = counts[i] > m ? counts[i] : m;
  for (int i = 0; i < n; i++) *equal &= counts[i] == m;
  return m;
}

/* ------------------------------------------------------------------ operations */

static int nc_allreduce(mc_comm *c, void *buf, int64_t count, mc_dtype t) {
  const char *op = "allreduce";
  if (count <= 0) return 0;
  if (alive(c, op)) return -1;
  const size_t bytes = (size_t)count * mc_dtype_size(t);
  char *d = on_device(buf) ? buf : scratch(c, bytes, op);
  if (!d || copy(c, d, buf, bytes, op)) return -1;
  if (check_nccl(ncclAllReduce(d, d, (size_t)count, nccl_type(t), ncclSum, handle(c), P.stream), c, op)) return -1;
  if (copy(c, buf, d, bytes, op)) return -1;
  return finish(c, op, d == buf);
}

/* Segments (comm.h): on device buffers with equal counts, NCCL's collectives on each segment
 * in one group (one launch; each segment's block already in member order, so no copy);
 * otherwise segment by segment through the staging scratch (uneven counts, host memory). */

static int nc_reduce_scatter(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t) {
  const char *op = "reduce_scatter";
  if (alive(c, op)) return -1;
  int equal = 0;
  const int64_t m = max_count(counts, c->size, &equal);
  if (m == 0) return 0;
  const size_t es = mc_dtype_size(t), mine = (size_t)counts[c->rank] * es, block = (size_t)mc_counts_total(counts, c->size) * es;
  if (equal && on_device(send) && on_device(recv)) {
    int err = check_nccl(ncclGroupStart(), c, op);
    for (int k = 0; !err && k < n_seg; k++)
      err = check_nccl(ncclReduceScatter((const char *)send + k * block, (char *)recv + k * mine, (size_t)m, nccl_type(t),
                                         ncclSum, handle(c), P.stream),
                       c, op);
    if (check_nccl(ncclGroupEnd(), c, op)) err = -1;
    return err ? -1 : finish(c, op, 1);
  }
  char *in = scratch(c, (size_t)m * es * ((size_t)c->size + 1), op), *out = in ? in + (size_t)m * es * c->size : NULL;
  if (!in) return -1;
  for (int k = 0; k < n_seg; k++) {
    size_t at = k * block;
    for (int i = 0; i < c->size; i++) {
      if (copy(c, in + (size_t)i * m * es, (const char *)send + at, (size_t)counts[i] * es, op)) return -1;
      at += (size_t)counts[i] * es;
    }
    if (check_nccl(ncclReduceScatter(in, out, (size_t)m, nccl_type(t), ncclSum, handle(c), P.stream), c, op)) return -1;
    if (copy(c, (char *)recv + k * mine, out, mine, op)) return -1;
  }
  return finish(c, op, on_device(send) && on_device(recv));
}

static int nc_allgather(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t) {
  const char *op = "allgather";
  if (alive(c, op)) return -1;
  int equal = 0;
  const int64_t m = max_count(counts, c->size, &equal);
  if (m == 0) return 0;
  const size_t es = mc_dtype_size(t), mine = (size_t)counts[c->rank] * es, block = (size_t)mc_counts_total(counts, c->size) * es;
  if (equal && on_device(send) && on_device(recv)) {
    int err = check_nccl(ncclGroupStart(), c, op);
    for (int k = 0; !err && k < n_seg; k++)
      err = check_nccl(ncclAllGather((const char *)send + k * mine, (char *)recv + k * block, (size_t)m, nccl_type(t),
                                     handle(c), P.stream),
                       c, op);
    if (check_nccl(ncclGroupEnd(), c, op)) err = -1;
    return err ? -1 : finish(c, op, 1);
  }
  char *in = scratch(c, (size_t)m * es * ((size_t)c->size + 1), op), *out = in ? in + (size_t)m * es : NULL;
  if (!in) return -1;
  for (int k = 0; k < n_seg; k++) {
    if (copy(c, in, (const char *)send + k * mine, mine, op)) return -1;
    if (check_nccl(ncclAllGather(in, out, (size_t)m, nccl_type(t), handle(c), P.stream), c, op)) return -1;
    size_t at = k * block;
    for (int i = 0; i < c->size; i++) {
      if (copy(c, (char *)recv + at, out + (size_t)i * m * es, (size_t)counts[i] * es, op)) return -1;
      at += (size_t)counts[i] * es;
    }
  }
  return finish(c, op, on_device(send) && on_device(recv));
}

/* Segments in one group: NCCL matches the sends and receives of a pair of members in the
 * order they are issued, so segment k of i -> j meets segment k of j's receives from i (the
 * empty ones skipped on both sides alike, their lengths being equal). */
static int nc_alltoallv(mc_comm *c, const void *send, int n_seg, const int64_t *sc, const int64_t *sd, void *recv,
                        const int64_t *rc, const int64_t *rd, mc_dtype t) {
  const char *op = "alltoallv";
  if (alive(c, op)) return -1;
  const size_t es = mc_dtype_size(t);
  const int64_t ns = (int64_t)c->size * n_seg;
  int64_t s_end = 0, r_end = 0;
  for (int64_t i = 0; i < ns; i++) {
    if (sc[i] > 0 && sd[i] + sc[i] > s_end) s_end = sd[i] + sc[i];
    if (rc[i] > 0 && rd[i] + rc[i] > r_end) r_end = rd[i] + rc[i];
  }
  const int s_dev = on_device(send), r_dev = on_device(recv);
  char *st = (char *)send, *rt = recv;
  if (!s_dev || !r_dev) {
    char *sc_buf = scratch(c, (size_t)(s_end + r_end) * es + 16, op);
    if (!sc_buf) return -1;
    if (!s_dev) st = sc_buf;
    if (!r_dev) rt = sc_buf + (size_t)s_end * es;
    if (!s_dev && copy(c, st, send, (size_t)s_end * es, op)) return -1;
  }
  int err = check_nccl(ncclGroupStart(), c, op);
  for (int i = 0; !err && i < c->size; i++)
    for (int64_t k = (int64_t)i * n_seg; !err && k < (int64_t)(i + 1) * n_seg; k++) {
      if (sc[k] > 0) err = check_nccl(ncclSend(st + (size_t)sd[k] * es, (size_t)sc[k], nccl_type(t), i, handle(c), P.stream), c, op);
      if (!err && rc[k] > 0)
        err = check_nccl(ncclRecv(rt + (size_t)rd[k] * es, (size_t)rc[k], nccl_type(t), i, handle(c), P.stream), c, op);
    }
  if (check_nccl(ncclGroupEnd(), c, op)) err = -1;
  /* host memory: back segment by segment (what lies between them is the caller's) */
  for (int64_t k = 0; !err && !r_dev && k < ns; k++)
    if (rc[k] > 0 && copy(c, (char *)recv + (size_t)rd[k] * es, rt + (size_t)rd[k] * es, (size_t)rc[k] * es, op)) err = -1;
  return err ? -1 : finish(c, op, s_dev && r_dev);
}

/* Point to point: NCCL has no tags; the pipeline issues each link's calls in the same order
 * on both sides (train/pipeline.c), which is what NCCL's in-order matching needs. */
static int nc_p2p(mc_comm *c, void *buf, int64_t count, mc_dtype t, int peer, int is_send) {
  const char *op = is_send ? "send" : "recv";
  if (count <= 0) return 0;
  if (alive(c, op)) return -1;
  if (peer < 0 || peer >= c->size) return where(c, op, "peer out of range", NULL);
  const size_t bytes = (size_t)count * mc_dtype_size(t);
  char *d = on_device(buf) ? buf : scratch(c, bytes, op);
  if (!d) return -1;
  if (is_send) {
    if (copy(c, d, buf, bytes, op) || check_nccl(ncclSend(d, (size_t)count, nccl_type(t), peer, handle(c), P.stream), c, op))
      return -1;
  } else {
    if (check_nccl(ncclRecv(d, (size_t)count, nccl_type(t), peer, handle(c), P.stream), c, op) || copy(c, buf, d, bytes, op))
      return -1;
  }
  return finish(c, op, d == buf);
}

static int nc_send(mc_comm *c, const void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  (void)tag;
  return nc_p2p(c, (void *)buf, count, t, peer, 1);
}

static int nc_recv(mc_comm *c, void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  (void)tag;
  return nc_p2p(c, buf, count, t, peer, 0);
}

static int nc_bcast(mc_comm *c, void *buf, int64_t count, mc_dtype t, int root) {
  const char *op = "bcast";
  if (count <= 0) return 0;
  if (alive(c, op)) return -1;
  const size_t bytes = (size_t)count * mc_dtype_size(t);
  char *d = on_device(buf) ? buf : scratch(c, bytes, op);
  if (!d || (c->rank == root && copy(c, d, buf, bytes, op))) return -1;
  if (check_nccl(ncclBroadcast(d, d, (size_t)count, nccl_type(t), root, handle(c), P.stream), c, op)) return -1;
  if (c->rank != root && copy(c, buf, d, bytes, op)) return -1;
  return finish(c, op, d == buf);
}

static int nc_barrier(mc_comm *c) {
  int32_t one = 1;
  return nc_allreduce(c, &one, 1, MC_DT_I32);
}

static mc_comm *wrap(ncclComm_t h, const char *label, int world_rank, int is_world);

static mc_comm *nc_split(mc_comm *c, int color, int key, const char *label) {
  if (alive(c, "split")) return NULL;
  ncclComm_t h = NULL;
  if (check_nccl(ncclCommSplit(handle(c), color, key, &h, NULL), c, "split")) return NULL;
  mc_comm *out = wrap(h, label, c->world_rank, 0);
  if (!out) ncclCommDestroy(h);
  return out;
}

static void nc_destroy(mc_comm *c) {
  if (!c) return;
  lock_when_ring_below(1); /* the watchdog may still follow an operation of c (it ends a stalled one) */
  pthread_mutex_unlock(&P.lock);
  nccl_impl *im = c->impl;
  if (im && im->comm) ncclCommDestroy(im->comm);
  if (im && im->is_world) { /* the job is over for this process: tell the watch */
    mc_rdv_finish(P.rdv);
    P.rdv = NULL;
  }
  free(im);
  free(c);
}

static const mc_comm_ops NCCL_OPS = {
    "nccl", nc_allreduce, nc_reduce_scatter, nc_allgather, nc_alltoallv, nc_send,
    nc_recv, nc_bcast, nc_barrier, nc_split, nc_destroy, nc_ordered, nc_side_begin, nc_side_end, nc_side_wait,
};

static mc_comm *wrap(ncclComm_t h, const char *label, int world_rank, int is_world) {
  mc_comm *c = calloc(1, sizeof *c);
  nccl_impl *im = calloc(1, sizeof *im);
  if (!c || !im) {
    free(c), free(im);
    mc_error("out of memory creating the %s communicator", label);
    return NULL;
  }
  im->comm = h, im->is_world = is_world;
  c->ops = &NCCL_OPS, c->label = label, c->impl = im, c->world_rank = world_rank;
  ncclCommUserRank(h, &c->rank);
  ncclCommCount(h, &c->size);
  return c;
}

int mc_comm_nccl_init(const mc_launch *l, int device, mc_comm *mpi_world, double timeout_s, mc_comm **world) {
  *world = NULL;
  if (l->size < 2) return mc_error("NCCL world: %d process; one process needs no communicator", l->size);
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    cudaGetLastError();
    return mc_error("train.device=cuda with %d processes: no CUDA device is available on rank %d (no GPU or no NVIDIA "
                    "driver; set train.device=cpu for CPU ranks under mpirun)", l->size, l->rank);
  }
  if (device >= n_dev)
    return mc_error("train.device=cuda: rank %d has LOCAL_RANK %d but %d CUDA devices are visible (start at most one "
                    "process per GPU on a host)", l->rank, device, n_dev);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&P.stream, cudaStreamNonBlocking);
  if (e != cudaSuccess)
    return mc_error("rank %d: CUDA device %d (LOCAL_RANK %d): %s", l->rank, device, l->local_rank, cudaGetErrorString(e));
  P.device = device;
  P.timeout_s = timeout_s;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (l->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) return mc_error("rank 0: ncclGetUniqueId failed");
  if (mpi_world) {
    if (mc_bcast(mpi_world, &id, (int64_t)sizeof id, MC_DT_U8, 0)) return mc_error_context("handing out the NCCL id");
  } else if (mc_rdv_start(l->rank, l->size, l->master_addr, l->master_port, timeout_s > 0 ? timeout_s : 600.0, &id,
                          sizeof id, &P.rdv)) {
    return -1;
  }
  ncclComm_t h = NULL;
  ncclResult_t rc = ncclCommInitRank(&h, l->size, id, l->rank);
  if (rc != ncclSuccess)
    return mc_error("rank %d: NCCL init of %d ranks failed: %s %s", l->rank, l->size, ncclGetErrorString(rc),
                    ncclGetLastError(NULL));
  *world = wrap(h, "world", l->rank, 1);
  return *world ? 0 : -1;
}

#else /* no NCCL in this build */

int mc_comm_have_nccl(void) { return 0; }

int mc_comm_nccl_order_with(void *cuda_stream) {
  (void)cuda_stream;
  return mc_error("stream-ordered NCCL: this build has no NCCL");
}

int mc_comm_nccl_init(const mc_launch *l, int device, mc_comm *mpi_world, double timeout_s, mc_comm **world) {
  (void)device, (void)mpi_world, (void)timeout_s;
  *world = NULL;
  return mc_error("train.device=cuda with %d processes needs NCCL on rank %d, and this build has none (nccl.h was not "
                  "found when it was configured)", l->size, l->rank);
}

#endif
