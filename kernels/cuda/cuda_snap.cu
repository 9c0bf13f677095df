/* Snapshot copies (kernels/ops.h snap_*): a checkpoint's device-to-host copies of the optimizer
 * state, run beside training. The copy stream waits for an event recorded on the compute
 * stream at snap_begin, so the copies see exactly the work queued before it and run beside
 * the work queued after it; snap_fence puts the copies' end event in front of later compute
 * work; snap_wait blocks until the batch is in host memory.
 *
 * Each tensor is one copy, all queued at once. A copy engine serves its queue in order, so
 * the training loop's own small reads would wait behind the whole snapshot if they went
 * through one; they do not (cuda_backend.cu, to_host). Queuing the snapshot in small chunks
 * from a thread instead was measured and dropped: its thousands of API calls slowed a
 * launch-bound step more than it gained (docs/bench-ckpt.md, "Snapshot copies"). */
#include "kernels/cuda/cuda_common.h"

static void cu_snap_begin(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  cudaError_t e = cudaSuccess;
  if (!c->snap_ready) {
    e = cudaStreamCreateWithFlags(&c->snap_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->snap_start, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->snap_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      mc_cuda_fail(be, "snap_begin: cannot create the snapshot stream: %s", cudaGetErrorString(e));
      return;
    }
    c->snap_ready = 1;
  }
  /* copies into memory still being page-locked would not run asynchronously */
  if (mc_cuda_pinned_wait(be) != 0) return;
  e = cudaEventRecord(c->snap_start, c->stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->snap_stream, c->snap_start, 0);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_begin: %s", cudaGetErrorString(e));
}

static void cu_snap_to_host(mc_backend *be, void *host_dst, const void *src, size_t bytes) {
  mc_cuda_ctx *c = mc_cu(be);
  if (!bytes || !c->snap_ready) return; /* not ready: snap_begin recorded the failure */
  cudaError_t e = cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->snap_stream);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_to_host of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

static void cu_snap_end(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  if (!c->snap_ready) return;
  cudaError_t e = cudaEventRecord(c->snap_done, c->snap_stream);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_end: %s", cudaGetErrorString(e));
  else c->snap_pending = 1;
}

static void cu_snap_fence(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  if (!c->snap_pending) return;
  cudaError_t e = cudaStreamWaitEvent(c->stream, c->snap_done, 0);
  if (e != cudaSuccess) mc_cuda_fail(be, "snap_fence: %s", cudaGetErrorString(e));
}

/* Called from the checkpoint thread: it neither reads nor writes the failure record (the
 * training thread owns it); the error goes to this thread's mc_error. */
static int cu_snap_wait(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  if (!c->snap_pending) return 0;
  cudaError_t e = cudaSetDevice(c->device); /* a new thread starts on device 0 */
  if (e == cudaSuccess) e = cudaEventSynchronize(c->snap_done);
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
