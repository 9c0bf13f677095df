/* Which backend a run computes on (train.device) and whether its memory is host memory. */
#ifndef MC_TRAIN_DEVICE_H
#define MC_TRAIN_DEVICE_H

#include "kernels/ops.h"

/* The backend for train.device = "cpu" (the reference) or "cuda" (CUDA device `gpu` of the
 * process: its local rank under a multi-process launch, else 0) and train.dtype = "fp32", or
 * "bf16" on "cuda" only: the bf16-products instance (mc_backend_cuda_bf16: matrix products
 * on bf16 tensor cores, everything else fp32). NULL with mc_error naming the key when the
 * device does not exist in this build or on this machine. */
mc_backend *mc_train_backend(const char *device, const char *dtype, int gpu);

/* The stream a device backend queues its work on (a cudaStream_t), NULL for the CPU. */
void *mc_train_backend_stream(mc_backend *be);

/* 1 when the backend's tensors are ordinary host memory (the CPU backend): code may then
 * read them directly, hand them to MPI or to the checkpoint library without staging. */
int mc_backend_is_host(const mc_backend *be);

#endif
