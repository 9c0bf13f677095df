/* The start of every GPU test program: whether a CUDA device can run it. Without one (a build
 * without CUDA, or no GPU or driver, as in CI) it prints the SKIP line and the program passes. */
#ifndef MC_TESTS_CUDACHECK_H
#define MC_TESTS_CUDACHECK_H

#include <stdio.h>

#ifdef MC_HAVE_CUDA
#include "kernels/backend_cuda.h"
#endif

static inline int kc_cuda_usable(void) {
#ifdef MC_HAVE_CUDA
  if (mc_cuda_device_count() > 0) return 1;
  printf("SKIP: no CUDA device\n");
#else
  printf("SKIP: no CUDA device (built without CUDA)\n");
#endif
  return 0;
}

#endif
