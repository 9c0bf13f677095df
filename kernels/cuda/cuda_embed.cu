/* Embedding gather and scatter (kernels/ops.h embed_fwd, embed_bwd; formulas as in
 * kernels/cpu/cpu_embed.c): one thread per element. embed_bwd adds with float atomics (rows
 * may repeat), so its order of additions varies run to run. */
#include "kernels/cuda/cuda_common.h"

/* ---- embedding */
__global__ void k_embed_fwd(const int32_t *tok, int n, int d, const float *W, float *y) {
  MC_CU_FOR(i, (int64_t)n * d) y[i] = W[(int64_t)tok[i / d] * d + i % d];
}

/* Rows may repeat, so the scatter adds atomically (the order of the additions varies). */
__global__ void k_embed_bwd(const int32_t *tok, int n, int d, const float *dy, float *dW) {
  MC_CU_FOR(i, (int64_t)n * d) atomicAdd(&dW[(int64_t)tok[i / d] * d + i % d], dy[i]);
}

static void cu_embed_fwd(mc_backend *be, const int32_t *tok, int n, int d, const float *W, float *y) {
  if ((int64_t)n * d <= 0) return;
  k_embed_fwd<<<mc_cu_grid((int64_t)n * d), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(tok, n, d, W, y);
  mc_cuda_check(be, "embed_fwd");
}

static void cu_embed_bwd(mc_backend *be, const int32_t *tok, int n, int d, const float *dy, float *dW) {
  if ((int64_t)n * d <= 0) return;
  k_embed_bwd<<<mc_cu_grid((int64_t)n * d), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(tok, n, d, dy, dW);
  mc_cuda_check(be, "embed_bwd");
}

void mc_cuda_install_embed(mc_backend *be) {
  be->embed_fwd = cu_embed_fwd;
  be->embed_bwd = cu_embed_bwd;
}
