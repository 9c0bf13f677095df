/* The CUDA backend: device selection, memory, the sticky failure record, scratch memory and
 * the op table (each op family's source file, cuda_<family>.cu, installs its ops; the map is
 * docs/kernels.md). Everything is queued on one stream; to_host and from_host return only when
 * the copy is complete, like the CPU backend. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/backend_cuda.h"
#include "kernels/cuda/cuda_common.h"

void mc_cuda_fail(mc_backend *be, const char *fmt, ...) {
  mc_cuda_ctx *c = mc_cu(be);
  if (c->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->failure, sizeof c->failure, fmt, ap);
  va_end(ap);
  c->failed = 1;
}

void mc_cuda_check(mc_backend *be, const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) mc_cuda_fail(be, "%s: %s", op, cudaGetErrorString(e));
}

void *mc_cuda_scratch(mc_backend *be, size_t bytes, const char *op) {
  mc_cuda_ctx *c = mc_cu(be);
  if (bytes <= c->scratch_bytes) return c->scratch;
  /* cudaFree waits for queued work, so no earlier op still reads the old buffer. */
  if (c->scratch) cudaFree(c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
  size_t want = bytes + bytes / 4;
  if (cudaMalloc(&c->scratch, want) != cudaSuccess) {
    cudaGetLastError();
    c->scratch = NULL;
    mc_cuda_fail(be, "%s: out of device memory for %zu bytes of scratch", op, bytes);
    return NULL;
  }
  c->scratch_bytes = want;
  return c->scratch;
}

__global__ void mc_k_colsum_finish(const double *part, int parts, int cols, float *out) {
  MC_CU_FOR(j, cols) {
    double t = 0.0;
    for (int p = 0; p < parts; p++) t += part[(int64_t)p * cols + j];
    out[j] += (float)t;
  }
}

static void *cu_alloc(mc_backend *be, size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* allocation failures are not sticky; clear it */
    mc_error("cuda backend: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, mc_cu_stream(be));
  if (e != cudaSuccess) {
    cudaFree(p);
    mc_error("cuda backend: cannot zero %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cu_free(mc_backend *be, void *p) {
  if (!p) return;
  cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) mc_cuda_fail(be, "free: %s", cudaGetErrorString(e));
}

static void cu_copy_sync(mc_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                         const char *op) {
  if (!bytes) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, mc_cu_stream(be));
  if (e == cudaSuccess) e = cudaStreamSynchronize(mc_cu_stream(be));
  if (e != cudaSuccess) mc_cuda_fail(be, "%s of %zu bytes: %s", op, bytes, cudaGetErrorString(e));
}

__global__ void k_copy_bytes(unsigned char *dst, const unsigned char *src, size_t n) {
  MC_CU_FOR(i, (int64_t)n) dst[i] = src[i];
}

void *mc_cuda_small_to_host(mc_backend *be, const void *src, size_t bytes, const char *op) {
  mc_cuda_ctx *c = mc_cu(be);
  const unsigned blocks = (unsigned)((bytes + MC_CUDA_THREADS - 1) / MC_CUDA_THREADS);
  k_copy_bytes<<<blocks < 64 ? blocks : 64, MC_CUDA_THREADS, 0, c->stream>>>((unsigned char *)c->bounce_dev,
                                                                              (const unsigned char *)src, bytes);
  mc_cuda_check(be, op);
  cudaError_t e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    mc_cuda_fail(be, "%s of %zu bytes: %s", op, bytes, cudaGetErrorString(e));
    return NULL;
  }
  return c->bounce;
}

/* Small results (an expert layer's counts, a loss) come back through the bounce buffer, not a
 * copy engine: an engine serves its queue in order, and a checkpoint's snapshot copy queued
 * on it (cuda_snap.cu) would hold every such read of the training loop behind gigabytes. */
static void cu_to_host(mc_backend *be, void *host_dst, const void *src, size_t bytes) {
  if (!bytes) return;
  if (bytes > MC_CUDA_BOUNCE_BYTES) {
    cu_copy_sync(be, host_dst, src, bytes, cudaMemcpyDeviceToHost, "to_host");
    return;
  }
  const void *b = mc_cuda_small_to_host(be, src, bytes, "to_host");
  if (b) memcpy(host_dst, b, bytes);
}

static void cu_from_host(mc_backend *be, void *dst, const void *host_src, size_t bytes) {
  cu_copy_sync(be, dst, host_src, bytes, cudaMemcpyHostToDevice, "from_host");
}

static int cu_sync(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  cudaError_t e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) mc_cuda_fail(be, "queued work failed: %s", cudaGetErrorString(e));
  if (!c->failed) return 0;
  c->failed = 0;
  return mc_error("cuda backend (device %d): %s", c->device, c->failure);
}

/* Pinned host memory. Page-locking is slow: cudaHostAlloc took 3.4 s and cudaHostRegister
 * 3.9 s for dense-a's 6.44 GB checkpoint staging on the device host (zeroing the pages on
 * eight threads first did not help). So a large block is mapped (the kernel hands out zeroed
 * pages) and returned at once, and a thread of the backend page-locks it while the caller
 * goes on: a resume reads the checkpoint into it meanwhile, a new run trains. Copies to and
 * from it are correct before the lock completes (as from any host memory); snapshot copies,
 * which must be asynchronous, wait for it (mc_cuda_pinned_wait, at snap_begin), and so does
 * host_free. A table keeps each block's size and thread. */
#define MC_PINNED_ASYNC_BYTES ((size_t)64 << 20)
#define MC_PINNED_MAX 64
typedef struct {
  void *p;
  size_t n;
  int device;
  pthread_t thread;
  int locking;       /* the thread may still be running: join it */
  cudaError_t error; /* the thread's result */
} pinned_block;
static pinned_block pinned[MC_PINNED_MAX];
static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;

static void *pin_run(void *arg) {
  pinned_block *b = (pinned_block *)arg;
  cudaError_t e = cudaSetDevice(b->device); /* a new thread starts on device 0 */
  if (e == cudaSuccess) e = cudaHostRegister(b->p, b->n, cudaHostRegisterDefault);
  b->error = e;
  return NULL;
}

/* Joins slot k's thread if it runs (pinned_mu not held: joining takes seconds). */
static cudaError_t pinned_join(int k) {
  pthread_mutex_lock(&pinned_mu);
  const int locking = pinned[k].locking;
  pinned[k].locking = 0;
  pthread_mutex_unlock(&pinned_mu);
  if (locking) pthread_join(pinned[k].thread, NULL);
  return pinned[k].error;
}

int mc_cuda_pinned_wait(mc_backend *be) {
  for (int k = 0; k < MC_PINNED_MAX; k++) {
    pthread_mutex_lock(&pinned_mu);
    const int mine = pinned[k].p && pinned[k].device == mc_cu(be)->device;
    pthread_mutex_unlock(&pinned_mu);
    cudaError_t e = mine ? pinned_join(k) : cudaSuccess;
    if (e != cudaSuccess) {
      mc_cuda_fail(be, "cannot page-lock %zu bytes of host memory: %s", pinned[k].n, cudaGetErrorString(e));
      return -1;
    }
  }
  return 0;
}

static void *pinned_large(mc_backend *be, size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    mc_error("cuda backend (device %d): cannot map %zu bytes of host memory: %s", mc_cu(be)->device, n, strerror(errno));
    return NULL;
  }
  int slot = -1;
  pthread_mutex_lock(&pinned_mu);
  for (int k = 0; slot < 0 && k < MC_PINNED_MAX; k++)
    if (!pinned[k].p) slot = k;
  if (slot >= 0) {
    pinned[slot] = (pinned_block){p, n, mc_cu(be)->device, pthread_t(), 0, cudaSuccess};
    pinned[slot].locking = pthread_create(&pinned[slot].thread, NULL, pin_run, &pinned[slot]) == 0;
    if (!pinned[slot].locking) pinned[slot].p = NULL;
  }
  pthread_mutex_unlock(&pinned_mu);
  if (slot < 0 || !pinned[slot].p) {
    munmap(p, n);
    mc_error("cuda backend (device %d): cannot page-lock %zu bytes of host memory: %s", mc_cu(be)->device, n,
             slot < 0 ? "more than 64 large blocks" : "no thread to do it");
    return NULL;
  }
  return p;
}

static void *cu_host_alloc(mc_backend *be, size_t bytes) {
  if (bytes >= MC_PINNED_ASYNC_BYTES) return pinned_large(be, bytes);
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    mc_error("cuda backend (device %d): cannot allocate %zu bytes of pinned host memory: %s", mc_cu(be)->device,
             bytes, cudaGetErrorString(e));
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

static void cu_host_free(mc_backend *be, void *p) {
  if (!p) return;
  int slot = -1;
  pthread_mutex_lock(&pinned_mu);
  for (int k = 0; k < MC_PINNED_MAX && slot < 0; k++)
    if (pinned[k].p == p) slot = k;
  pthread_mutex_unlock(&pinned_mu);
  cudaError_t e = cudaSuccess;
  if (slot < 0) {
    e = cudaFreeHost(p);
  } else {
    const size_t n = pinned[slot].n;
    if (pinned_join(slot) == cudaSuccess) e = cudaHostUnregister(p);
    munmap(p, n);
    pthread_mutex_lock(&pinned_mu);
    pinned[slot].p = NULL;
    pthread_mutex_unlock(&pinned_mu);
  }
  if (e != cudaSuccess) mc_cuda_fail(be, "host_free: %s", cudaGetErrorString(e));
}

int mc_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define MC_CUDA_MAX_DEVICES 64
static mc_backend *instances[2][MC_CUDA_MAX_DEVICES]; /* [bf16 products][device] */

static mc_backend *create(int device, int bf16_gemm) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    mc_error("cuda backend: no usable CUDA device: %s", cudaGetErrorString(e));
    return NULL;
  }
  if (device < 0 || device >= n || device >= MC_CUDA_MAX_DEVICES) {
    mc_error("cuda backend: device %d does not exist (%d CUDA device%s)", device, n, n == 1 ? "" : "s");
    return NULL;
  }
  if (instances[bf16_gemm][device]) return instances[bf16_gemm][device];
  mc_backend *be = (mc_backend *)calloc(1, sizeof *be);
  mc_cuda_ctx *c = (mc_cuda_ctx *)calloc(1, sizeof *c);
  if (!be || !c) {
    free(be), free(c);
    mc_error("cuda backend: out of host memory");
    return NULL;
  }
  c->device = device;
  c->bf16_gemm = bf16_gemm;
  if (mc_backend_env_check()) { /* a knob of this backend set to what it does not take */
    mc_error_context("cuda backend");
    free(be), free(c);
    return NULL;
  }
  const char *step = "cudaSetDevice";
  e = cudaSetDevice(device);
  if (e == cudaSuccess) step = "cudaStreamCreate", e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    step = "cudaMalloc", e = cudaMalloc((void **)&c->red, (MC_CUDA_RED_BLOCKS + 1) * sizeof(double));
  if (e == cudaSuccess) step = "cudaHostAlloc", e = cudaHostAlloc(&c->bounce, MC_CUDA_BOUNCE_BYTES, cudaHostAllocMapped);
  if (e == cudaSuccess) step = "cudaHostGetDevicePointer", e = cudaHostGetDevicePointer(&c->bounce_dev, c->bounce, 0);
  if (e != cudaSuccess) {
    mc_error("cuda backend: device %d: %s failed: %s", device, step, cudaGetErrorString(e));
    cudaGetLastError();
    free(be), free(c);
    return NULL;
  }
  cublasStatus_t st = cublasCreate(&c->blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(c->blas, c->stream);
  /* fp32 reference mode: plain FFMA products, no TF32 rounding of the operands */
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    mc_error("cuda backend: device %d: cuBLAS set-up failed: %s", device, cublasGetStatusString(st));
    free(be), free(c);
    return NULL;
  }
  be->name = "cuda";
  be->ctx = c;
  be->alloc = cu_alloc;
  be->free = cu_free;
  be->to_host = cu_to_host;
  be->from_host = cu_from_host;
  be->sync = cu_sync;
  be->host_alloc = cu_host_alloc;
  be->host_free = cu_host_free;
  mc_cuda_install_snap(be);
  mc_cuda_install_elem(be);
  mc_cuda_install_gemm(be);
  mc_cuda_install_act(be);
  mc_cuda_install_embed(be);
  mc_cuda_install_rmsnorm(be);
  mc_cuda_install_rope(be);
  mc_cuda_install_attn(be);
  mc_cuda_install_conv(be);
  mc_cuda_install_ssm(be);
  mc_cuda_install_rglru(be);
  mc_cuda_install_moe(be);
  mc_cuda_install_xent(be);
  mc_cuda_install_profile(be); /* after every other installer: it wraps the finished table */
  instances[bf16_gemm][device] = be;
  return be;
}

void *mc_cuda_stream_handle(mc_backend *be) { return (void *)mc_cu_stream(be); }

mc_backend *mc_backend_cuda(int device) { return create(device, 0); }

mc_backend *mc_backend_cuda_bf16(int device) { return create(device, 1); }
