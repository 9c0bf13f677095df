/* Snapshot copies (kernels/ops.h snap_*), on the CPU backend and, where a GPU is present, on
 * the CUDA one: what checkpoints of a training run going on rely on.
 * - A batch sees exactly the work queued before snap_begin: 64 tensors (sizes 0 to 4 Mi
 *   floats, 1 + 4 Mi + ... in all) are filled with a known value, snapshotted, and then, queued
 *   after snap_fence, refilled with another value by adamw_multi-sized work (fill + axpy
 *   many times, so on a GPU the overwrite would overtake an unfenced copy). After snap_wait
 *   from a second thread the host copies hold the first value, bitwise, and the tensors the
 *   second.
 * - Repeated batches into the same host_alloc buffers (the staging is reused every save).
 * - snap_wait with no batch returns 0; host_alloc memory is zeroed (a block over 64 MiB, which
 *   CUDA page-locks on a thread of its own while the test goes on); a small to_host after a
 *   batch. */
#include <pthread.h>
#include <string.h>

#include <stdlib.h>

#include "kernels/ops.h"
#include "util/error.h"
#include "tests/kernels/cudacheck.h"
#include "tests/check.h"

#define NT 64

static int64_t size_of(int i) { return i == 0 ? 0 : i == 1 ? (1 << 22) : (int64_t)(i * 7919 % 65536) + 1; }

typedef struct {
  mc_backend *be;
  int rc;
  char err[512];
} waiter;

static void *wait_thread(void *arg) {
  waiter *w = arg;
  w->rc = w->be->snap_wait(w->be);
  if (w->rc) snprintf(w->err, sizeof w->err, "%s", mc_errmsg());
  return NULL;
}

static void run(mc_backend *be) {
  printf("backend %s\n", be->name);
  CHECK(be->snap_wait(be) == 0, "%s: snap_wait without a batch: %s", be->name, mc_errmsg());
  float *dev[NT], *host[NT];
  size_t total = 0;
  for (int i = 0; i < NT; i++) total += (size_t)size_of(i);
  /* 64 MiB more than the tensors need: CUDA maps a block this large and page-locks it on a
   * thread of its own (snap_begin waits for it), a different path from small blocks */
  const size_t block_n = total + ((size_t)16 << 20);
  float *block = be->host_alloc(be, block_n * sizeof(float));
  CHECK(block != NULL, "%s: host_alloc of %zu bytes: %s", be->name, block_n * sizeof(float), mc_errmsg());
  if (!block) return;
  size_t nz = 0;
  for (size_t k = 0; k < block_n; k++) nz += block[k] != 0.0f;
  CHECK(nz == 0, "%s: host_alloc memory not zeroed (%zu nonzero)", be->name, nz);
  size_t off = 0;
  for (int i = 0; i < NT; i++) {
    dev[i] = be->alloc(be, (size_t)(size_of(i) + 1) * sizeof(float));
    host[i] = block + off;
    off += (size_t)size_of(i);
  }
  for (int round = 0; round < 3; round++) {
    const float before = 1.5f + (float)round, after = -7.25f - (float)round;
    for (int i = 0; i < NT; i++) be->fill(be, dev[i], size_of(i), before + (float)i);
    be->snap_begin(be);
    for (int i = 0; i < NT; i++) be->snap_to_host(be, host[i], dev[i], (size_t)size_of(i) * sizeof(float));
    be->snap_end(be);
    be->snap_fence(be);
    /* the overwrite: enough queued work that an unfenced copy would read its result */
    for (int i = 0; i < NT; i++) {
      be->fill(be, dev[i], size_of(i), 0.0f);
      for (int rep = 0; rep < 8; rep++) be->axpy(be, dev[i], dev[i], size_of(i), 0.0f);
      be->fill(be, dev[i], size_of(i), after + (float)i);
    }
    waiter w = {be, 0, ""};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, wait_thread, &w) == 0, "pthread_create");
    pthread_join(th, NULL);
    CHECK(w.rc == 0, "%s: snap_wait on another thread: %s", be->name, w.err);
    size_t bad = 0;
    for (int i = 0; i < NT; i++)
      for (int64_t k = 0; k < size_of(i); k++) bad += host[i][k] != before + (float)i;
    CHECK(bad == 0, "%s round %d: %zu snapshot elements are not the value before the fence", be->name, round, bad);
    float *back = malloc((size_t)size_of(1) * sizeof(float));
    be->to_host(be, back, dev[1], (size_t)size_of(1) * sizeof(float));
    CHECK(be->sync(be) == 0, "%s: sync: %s", be->name, mc_errmsg());
    CHECK(back[0] == after + 1.0f && back[size_of(1) - 1] == after + 1.0f, "%s: the overwrite after the fence is missing",
          be->name);
    /* a small read (CUDA: through the bounce buffer, not a copy engine) of a tensor's tail */
    float tail[3] = {0, 0, 0};
    be->to_host(be, tail, dev[2] + size_of(2) - 3, sizeof tail);
    CHECK(tail[0] == after + 2.0f && tail[2] == after + 2.0f, "%s: small to_host read %g %g, not %g", be->name,
          (double)tail[0], (double)tail[2], (double)(after + 2.0f));
    free(back);
  }
  for (int i = 0; i < NT; i++) be->free(be, dev[i]);
  be->host_free(be, block);
}

int main(void) {
  run(mc_backend_cpu());
#ifdef MC_HAVE_CUDA
  if (kc_cuda_usable()) {
    mc_backend *g = mc_backend_cuda(0);
    CHECK(g != NULL, "cuda backend: %s", mc_errmsg());
    if (g) run(g);
  }
#else
  kc_cuda_usable();
#endif
  return mc_check_exit("test_ops_snap");
}
