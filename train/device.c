/* train.device -> backend (train/device.h). */
#include "train/device.h"

#include <stdio.h>
#include <string.h>

#include "util/error.h"
#ifdef MC_HAVE_CUDA
#include "kernels/backend_cuda.h"
#endif

int mc_backend_is_host(const mc_backend *be) { return mc_backend_is_cpu(be); }

void *mc_train_backend_stream(mc_backend *be) {
#ifdef MC_HAVE_CUDA
  if (!mc_backend_is_cpu(be)) return mc_cuda_stream_handle(be);
#else
  (void)be;
#endif
  return NULL;
}

mc_backend *mc_train_backend(const char *device, const char *dtype, int gpu) {
  int bf16 = !strcmp(dtype, "bf16");
  if (!bf16 && strcmp(dtype, "fp32") != 0) {
    mc_error("train.dtype=%s is not a compute dtype (fp32 or bf16)", dtype);
    return NULL;
  }
  if (!strcmp(device, "cpu")) {
    return bf16 ? mc_backend_cpu_bf16() : mc_backend_cpu();
  }
  if (strcmp(device, "cuda") != 0) {
    mc_error("train.device=%s is not a device (cpu or cuda)", device);
    return NULL;
  }
#ifdef MC_HAVE_CUDA
  const int n_gpu = mc_cuda_device_count();
  if (n_gpu == 0) {
    mc_error("train.device=cuda but no CUDA device is available: no GPU or no NVIDIA driver was found "
             "(set train.device=cpu)");
    return NULL;
  }
  if (gpu < 0 || gpu >= n_gpu) {
    mc_error("train.device=cuda: this process's local rank %d asks for CUDA device %d, but %d are visible (start at "
             "most one process per GPU on a host)", gpu, gpu, n_gpu);
    return NULL;
  }
  mc_backend *be = bf16 ? mc_backend_cuda_bf16(gpu) : mc_backend_cuda(gpu);
  if (!be) {
    char why[MC_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", mc_errmsg());
    mc_error("train.device=cuda: the CUDA backend on device %d did not start: %s", gpu, why);
  }
  return be;
#else
  (void)gpu;
  mc_error("train.device=cuda but no CUDA device is available: this build has no CUDA backend (nvcc was not "
           "found when it was configured; set train.device=cpu)");
  return NULL;
#endif
}
