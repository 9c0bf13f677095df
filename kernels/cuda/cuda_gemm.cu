/* Matrix products through cuBLAS in fp32, or on bf16 tensor cores for the bf16-products
 * instance (mc_backend_cuda_bf16: operands rounded to bf16, fp32 accumulation and output).
 * The interface is row-major; cuBLAS is column-major, and a row-major C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T, so every call swaps the operands (and M with N) and
 * keeps the leading dimensions. gemm_ex / gemm_grouped_ex take operands stored in fp32 or
 * bf16 (mc_operand): the bf16 instance reads stored bf16 as is and rounds only fp32 operands
 * into scratch; the fp32 instance widens bf16 operands into scratch and multiplies in fp32. */
#include <cuda_bf16.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_gemm_lt.h"

/* C = beta * C on an M x N block (K == 0: the product is empty). */
__global__ void k_scale_block(float *C, int M, int N, int ldc, float beta) {
  MC_CU_FOR(i, (int64_t)M * N) {
    float *c = C + (i / N) * ldc + i % N;
    *c = beta == 0.0f ? 0.0f : beta * *c;
  }
}

__global__ void k_zero_block16(__nv_bfloat16 *C, int M, int N, int ldc) {
  MC_CU_FOR(i, (int64_t)M * N) C[(i / N) * ldc + i % N] = __float2bfloat16_rn(0.0f);
}

/* The empty product's result beta * C (a bf16 C has beta 0: zeros). */
static void scale_block(mc_backend *be, mc_dst C, int M, int N, int ldc, float beta) {
  if (C.h) k_zero_block16<<<mc_cu_grid((int64_t)M * N), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((__nv_bfloat16 *)C.h, M, N, ldc);
  else if (beta != 1.0f)
    k_scale_block<<<mc_cu_grid((int64_t)M * N), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(C.f, M, N, ldc, beta);
  mc_cuda_check(be, "gemm (empty product)");
}

static mc_dst dst32(float *C) { return mc_dst{C, NULL}; }

/* Group or batch element at offset off of an output as stored. */
static mc_dst dst_at(mc_dst C, int64_t off) { return mc_dst{C.f ? C.f + off : NULL, C.h ? C.h + off : NULL}; }
static void *dst_ptr(mc_dst C) { return C.h ? (void *)C.h : (void *)C.f; }
static cudaDataType_t dst_type(mc_dst C) { return C.h ? CUDA_R_16BF : CUDA_R_32F; }

/* A bf16 result is written, never accumulated: beta must be 0 (ops.h). 0, or -1 recorded. */
static int check_dst(mc_backend *be, mc_dst C, float beta, const char *op) {
  if (C.h && beta != 0.0f) {
    mc_cuda_fail(be, "%s: a bf16 result C needs beta = 0 (got %g)", op, (double)beta);
    return -1;
  }
  return 0;
}

__global__ void k_to_bf16(const float *x, __nv_bfloat16 *y, int64_t n) {
  MC_CU_FOR(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

/* Elements an operand of `batch` matrices (rows x cols, row stride ld, matrix stride st)
 * spans from its first element to its last. */
static int64_t span(int rows, int cols, int ld, int64_t st, int batch) {
  return (int64_t)(batch - 1) * st + (int64_t)(rows - 1) * ld + cols;
}

/* bf16 views of both operands: an operand stored in bf16 is used in place, an fp32 one is
 * rounded into scratch (same layout). 0, or -1 on failure (recorded). */
static int operands_bf16(mc_backend *be, mc_operand A, int64_t na, mc_operand B, int64_t nb,
                         const __nv_bfloat16 **Ah, const __nv_bfloat16 **Bh, const char *op) {
  int64_t na_pad = A.h ? 0 : (na + 127) / 128 * 128; /* keep B's copy 256-byte aligned */
  size_t elems = (size_t)na_pad + (B.h ? 0 : (size_t)nb);
  __nv_bfloat16 *s = NULL;
  if (elems && !(s = (__nv_bfloat16 *)mc_cuda_scratch(be, elems * sizeof(__nv_bfloat16), op))) return -1;
  if (A.h) {
    *Ah = (const __nv_bfloat16 *)A.h;
  } else {
    k_to_bf16<<<mc_cu_grid(na), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(A.f, s, na);
    *Ah = s;
  }
  if (B.h) {
    *Bh = (const __nv_bfloat16 *)B.h;
  } else {
    k_to_bf16<<<mc_cu_grid(nb), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(B.f, s + na_pad, nb);
    *Bh = s + na_pad;
  }
  mc_cuda_check(be, op);
  return 0;
}

/* The bf16 product of gemm_strided's arguments (batch 1 for gemm). */
static void gemm_bf16(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                      int64_t sa, mc_operand B, int ldb, int64_t sb, float beta, mc_dst C, int ldc, int64_t sc,
                      int batch) {
  const __nv_bfloat16 *Ah, *Bh;
  if (operands_bf16(be, A, span(ta ? K : M, ta ? M : K, lda, sa, batch), B, span(tb ? N : K, tb ? K : N, ldb, sb, batch),
                    &Ah, &Bh, "gemm (bf16)"))
    return;
  cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t st =
      batch == 1 ? cublasGemmEx(mc_cu(be)->blas, opb, opa, N, M, K, &alpha, Bh, CUDA_R_16BF, ldb, Ah, CUDA_R_16BF, lda,
                                &beta, dst_ptr(C), dst_type(C), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                 : cublasGemmStridedBatchedEx(mc_cu(be)->blas, opb, opa, N, M, K, &alpha, Bh, CUDA_R_16BF, ldb, sb, Ah,
                                              CUDA_R_16BF, lda, sa, &beta, dst_ptr(C), dst_type(C), ldc, sc, batch,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm (bf16) M=%d N=%d K=%d batch=%d lda=%d ldb=%d ldc=%d: cuBLAS %s", M, N, K, batch, lda, ldb,
                 ldc, cublasGetStatusString(st));
}

static mc_operand f32(const float *x) { return mc_operand{x, NULL}; }

static void cu_gemm(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_block(be, dst32(C), M, N, ldc, beta);
    return;
  }
  if (mc_cu(be)->bf16_gemm) {
    gemm_bf16(be, ta, tb, M, N, K, alpha, f32(A), lda, 0, f32(B), ldb, 0, beta, dst32(C), ldc, 0, 1);
    return;
  }
  cublasStatus_t st = cublasSgemm(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                  M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm M=%d N=%d K=%d lda=%d ldb=%d ldc=%d: cuBLAS %s", M, N, K, lda, ldb, ldc,
                 cublasGetStatusString(st));
}

static void cu_gemm_strided(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                            int64_t sa, const float *B, int ldb, int64_t sb, float beta, float *C, int ldc, int64_t sc,
                            int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < batch; i++) scale_block(be, dst32(C + i * sc), M, N, ldc, beta);
    return;
  }
  if (mc_cu(be)->bf16_gemm) {
    gemm_bf16(be, ta, tb, M, N, K, alpha, f32(A), lda, sa, f32(B), ldb, sb, beta, dst32(C), ldc, sc, batch);
    return;
  }
  cublasStatus_t st = cublasSgemmStridedBatched(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, sb, A, lda, sa,
                                                &beta, C, ldc, sc, batch);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm_strided M=%d N=%d K=%d batch=%d: cuBLAS %s", M, N, K, batch, cublasGetStatusString(st));
}

/* ---- grouped products: one batched cuBLAS call per chunk of up to GROUP_CHUNK non-empty
 * groups (an MoE layer has one chunk). cuBLAS reads the operand addresses from device
 * arrays; a one-block kernel writes them into scratch from its by-value arguments, so
 * the host needs no pinned staging buffer and nothing waits for the copy. */
#define GROUP_CHUNK 64

struct group_ptrs {
  const void *a[GROUP_CHUNK], *b[GROUP_CHUNK];
  void *c[GROUP_CHUNK];
};

__global__ void k_set_ptrs(group_ptrs p, int n, const void **a, const void **b, void **c) {
  int i = threadIdx.x;
  if (i < n) a[i] = p.a[i], b[i] = p.b[i], c[i] = p.c[i];
}

/* Per-group operand of a padded bf16 copy: rows x cols at src (row stride ld). */
template <typename T> struct pad_src {
  const T *src[GROUP_CHUNK];
  int rows[GROUP_CHUNK], cols[GROUP_CHUNK];
};

static __device__ __forceinline__ __nv_bfloat16 as_bf16(float v) { return __float2bfloat16_rn(v); }
static __device__ __forceinline__ __nv_bfloat16 as_bf16(__nv_bfloat16 v) { return v; }

/* dst + g*stride = group g's operand rounded to bf16 in a rows_x x ld_x block, zero outside
 * its rows x cols (zero rows and columns add exact zeros to the products). */
template <typename T>
__global__ void k_pad_bf16(pad_src<T> s, int ld, __nv_bfloat16 *dst, int64_t stride, int rows_x, int ld_x) {
  int g = blockIdx.y;
  const T *src = s.src[g];
  int rows = s.rows[g], cols = s.cols[g];
  __nv_bfloat16 *d = dst + g * stride;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)rows_x * ld_x;
       i += (int64_t)gridDim.x * blockDim.x) {
    int r = (int)(i / ld_x), c = (int)(i % ld_x);
    d[i] = r < rows && c < cols ? as_bf16(src[(int64_t)r * ld + c]) : __float2bfloat16_rn(0.0f);
  }
}

/* Group g's result rows x cols: C = alpha * P + beta * C, P its padded fp32 product
 * (pitch ldp, groups `stride` apart); beta == 0 does not read C, as in cuBLAS. */
template <typename T> struct unpad_dst {
  T *c[GROUP_CHUNK];
  int rows[GROUP_CHUNK], cols[GROUP_CHUNK];
};

static __device__ __forceinline__ float unpad_val(float v, float beta, const float *y) {
  return beta == 0.0f ? v : v + beta * *y;
}
static __device__ __forceinline__ __nv_bfloat16 unpad_val(float v, float, const __nv_bfloat16 *) {
  return __float2bfloat16_rn(v); /* bf16 results have beta 0 */
}

template <typename T>
__global__ void k_unpad(unpad_dst<T> s, int ldc, const float *P, int64_t stride, int ldp, float alpha, float beta) {
  int g = blockIdx.y;
  T *C = s.c[g];
  int rows = s.rows[g], cols = s.cols[g];
  const float *p = P + g * stride;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)rows * cols;
       i += (int64_t)gridDim.x * blockDim.x) {
    int r = (int)(i / cols), c = (int)(i % cols);
    T *y = C + (int64_t)r * ldc + c;
    *y = unpad_val(alpha * p[(int64_t)r * ldp + c], beta, y);
  }
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Blocks along x for a (blocks, groups) launch over `per_group` items each. */
static unsigned group_grid(int64_t per_group) {
  unsigned b = mc_cu_grid(per_group);
  return b > 2048 ? 2048 : b;
}

/* The groups of one call that need a product (M, N, K > 0), as indices. */
struct chunk {
  int n, g[GROUP_CHUNK];
};

/* fp32: cublasGemmGroupedBatchedEx, one cuBLAS group per expert (each of its own shape). */
static void grouped_fp32(mc_backend *be, const chunk *ch, int ta, int tb, const int *M, const int *N, const int *K,
                         float alpha, const float *A, const int64_t *a_off, int lda, const float *B,
                         const int64_t *b_off, int ldb, float beta, float *C, const int64_t *c_off, int ldc) {
  int n = ch->n;
  void **dp = (void **)mc_cuda_scratch(be, 3 * GROUP_CHUNK * sizeof(void *), "gemm_grouped");
  if (!dp) return;
  group_ptrs p;
  cublasOperation_t opa[GROUP_CHUNK], opb[GROUP_CHUNK];
  int m[GROUP_CHUNK], nn[GROUP_CHUNK], k[GROUP_CHUNK], la[GROUP_CHUNK], lb[GROUP_CHUNK], lc[GROUP_CHUNK],
      size[GROUP_CHUNK];
  float al[GROUP_CHUNK], bt[GROUP_CHUNK];
  for (int i = 0; i < n; i++) {
    int g = ch->g[i];
    /* column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our B */
    p.a[i] = B + b_off[g], p.b[i] = A + a_off[g], p.c[i] = C + c_off[g];
    opa[i] = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb[i] = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = N[g], nn[i] = M[g], k[i] = K[g], la[i] = ldb, lb[i] = lda, lc[i] = ldc, size[i] = 1;
    al[i] = alpha, bt[i] = beta;
  }
  const void **da = (const void **)dp, **db = da + GROUP_CHUNK;
  void **dc = dp + 2 * GROUP_CHUNK;
  k_set_ptrs<<<1, GROUP_CHUNK, 0, mc_cu_stream(be)>>>(p, n, da, db, dc);
  mc_cuda_check(be, "gemm_grouped (pointers)");
  cublasStatus_t st = cublasGemmGroupedBatchedEx(mc_cu(be)->blas, opa, opb, m, nn, k, al, da, CUDA_R_32F, la, db,
                                                 CUDA_R_32F, lb, bt, dc, CUDA_R_32F, lc, n, size, CUBLAS_COMPUTE_32F);
  if (st != CUBLAS_STATUS_SUCCESS)
    mc_cuda_fail(be, "gemm_grouped: %d groups, first M=%d N=%d K=%d: cuBLAS %s", n, M[ch->g[0]], N[ch->g[0]],
                 K[ch->g[0]], cublasGetStatusString(st));
}

/* bf16, small groups: cuBLAS's grouped call has no bf16-operand, fp32-output form (its bf16
 * form writes bf16), so the chunk becomes one uniform batched product (cublasGemmBatchedEx, bf16
 * operands, fp32 accumulation and output): each group's operands are copied, rounded to
 * bf16, into blocks of the largest M x K and K x N of the chunk, zero-padded. When every
 * group has the largest M and N (only K varies, as in expert weight gradients) and C is
 * 16-byte aligned, the products go straight into C; otherwise into padded fp32 scratch
 * that one more kernel folds into C (C = alpha * P + beta * C). */
/* Launches k_pad_bf16 for one operand from its fp32 or bf16 storage. */
static void pad_operand(mc_backend *be, const chunk *ch, mc_operand X, const int64_t *off, const int *R, const int *Cc,
                        int ld, __nv_bfloat16 *dst, int64_t stride, int rows_x, int ld_x) {
  pad_src<float> pf;
  pad_src<__nv_bfloat16> ph;
  for (int i = 0; i < ch->n; i++) {
    const int g = ch->g[i];
    pf.rows[i] = ph.rows[i] = R[g], pf.cols[i] = ph.cols[i] = Cc[g];
    if (X.h) ph.src[i] = (const __nv_bfloat16 *)X.h + off[g];
    else pf.src[i] = X.f + off[g];
  }
  const dim3 grid(group_grid((int64_t)rows_x * ld_x), ch->n);
  if (X.h) k_pad_bf16<<<grid, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(ph, ld, dst, stride, rows_x, ld_x);
  else k_pad_bf16<<<grid, MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(pf, ld, dst, stride, rows_x, ld_x);
}

template <typename T>
static void unpad(mc_backend *be, const chunk *ch, const int *M, const int *N, T *C, const int64_t *c_off, int ldc,
                  const float *P, int64_t sp, int p_ld, int mx, int nx, float alpha, float beta) {
  unpad_dst<T> u;
  for (int i = 0; i < ch->n; i++) {
    int g = ch->g[i];
    u.c[i] = C + c_off[g], u.rows[i] = M[g], u.cols[i] = N[g];
  }
  k_unpad<<<dim3(group_grid((int64_t)mx * nx), ch->n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(u, ldc, P, sp, p_ld,
                                                                                              alpha, beta);
  mc_cuda_check(be, "gemm_grouped (bf16 result)");
}

static void grouped_bf16(mc_backend *be, const chunk *ch, int ta, int tb, const int *M, const int *N, const int *K,
                         float alpha, mc_operand A, const int64_t *a_off, int lda, mc_operand B, const int64_t *b_off,
                         int ldb, float beta, mc_dst Cd, const int64_t *c_off, int ldc) {
  float *C = Cd.f; /* NULL for a bf16 result: never direct */
  int n = ch->n, mx = 0, nx = 0, kx = 0, direct = !Cd.h && (ldc % 4) == 0;
  for (int i = 0; i < n; i++) {
    int g = ch->g[i];
    mx = M[g] > mx ? M[g] : mx, nx = N[g] > nx ? N[g] : nx, kx = K[g] > kx ? K[g] : kx;
  }
  for (int i = 0; i < n; i++) {
    int g = ch->g[i];
    if (direct && (M[g] != mx || N[g] != nx || ((uintptr_t)(C + c_off[g]) & 15))) direct = 0;
  }
  /* stored shapes of op(A) (mx x kx) and op(B) (kx x nx), row pitches a multiple of 8 */
  int a_rows = ta ? kx : mx, a_ld = (int)round_up(ta ? mx : kx, 8);
  int b_rows = tb ? nx : kx, b_ld = (int)round_up(tb ? kx : nx, 8);
  int p_ld = (int)round_up(nx, 4);
  int64_t sa = round_up((int64_t)a_rows * a_ld, 128), sb = round_up((int64_t)b_rows * b_ld, 128);
  int64_t sp = direct ? 0 : round_up((int64_t)mx * p_ld, 64);
  size_t ptr_bytes = 3 * GROUP_CHUNK * sizeof(void *);
  size_t bytes = ptr_bytes + (size_t)n * ((sa + sb) * sizeof(__nv_bfloat16) + sp * sizeof(float));
  char *s = (char *)mc_cuda_scratch(be, bytes, "gemm_grouped (bf16)");
  if (!s) return;
  void **dp = (void **)s;
  __nv_bfloat16 *ah = (__nv_bfloat16 *)(s + ptr_bytes), *bh = ah + n * sa;
  float *P = (float *)(bh + n * sb);

  group_ptrs p;
  for (int i = 0; i < n; i++) {
    int g = ch->g[i];
    p.a[i] = bh + i * sb, p.b[i] = ah + i * sa, p.c[i] = direct ? C + c_off[g] : P + i * sp;
  }
  cudaStream_t st = mc_cu_stream(be);
  pad_operand(be, ch, A, a_off, ta ? K : M, ta ? M : K, lda, ah, sa, a_rows, a_ld);
  pad_operand(be, ch, B, b_off, tb ? N : K, tb ? K : N, ldb, bh, sb, b_rows, b_ld);
  const void **da = (const void **)dp, **db = da + GROUP_CHUNK;
  void **dc = dp + 2 * GROUP_CHUNK;
  k_set_ptrs<<<1, GROUP_CHUNK, 0, st>>>(p, n, da, db, dc);
  mc_cuda_check(be, "gemm_grouped (bf16 operands)");
  float one = 1.0f, zero = 0.0f;
  cublasStatus_t cs = cublasGemmBatchedEx(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          nx, mx, kx, direct ? &alpha : &one, da, CUDA_R_16BF, b_ld, db, CUDA_R_16BF,
                                          a_ld, direct ? &beta : &zero, dc, CUDA_R_32F, direct ? ldc : p_ld, n,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    mc_cuda_fail(be, "gemm_grouped (bf16): %d groups padded to M=%d N=%d K=%d: cuBLAS %s", n, mx, nx, kx,
                 cublasGetStatusString(cs));
    return;
  }
  if (direct) return;
  if (Cd.h) unpad(be, ch, M, N, (__nv_bfloat16 *)Cd.h, c_off, ldc, P, sp, p_ld, mx, nx, alpha, beta);
  else unpad(be, ch, M, N, C, c_off, ldc, P, sp, p_ld, mx, nx, alpha, beta);
}

/* y = x widened from bf16, for products of bf16-stored operands on the fp32 instance. */
__global__ void k_from_bf16(const __nv_bfloat16 *x, float *y, int64_t n) { MC_CU_FOR(i, n) y[i] = __bfloat162float(x[i]); }

__global__ void k_round_block(const float *t, __nv_bfloat16 *h, int M, int N, int ld) {
  MC_CU_FOR(i, (int64_t)M * N) {
    const int64_t o = (i / N) * ld + i % N;
    h[o] = __float2bfloat16_rn(t[o]);
  }
}

static void cu_gemm_ex(mc_backend *be, int ta, int tb, int M, int N, int K, float alpha, mc_operand A, int lda,
                       mc_operand B, int ldb, float beta, mc_dst C, int ldc) {
  if (M <= 0 || N <= 0 || check_dst(be, C, beta, "gemm_ex")) return;
  if (K <= 0) {
    scale_block(be, C, M, N, ldc, beta);
    return;
  }
  if (mc_cu(be)->bf16_gemm) {
    gemm_bf16(be, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
    return;
  }
  if (!A.h && !B.h && !C.h) {
    cu_gemm(be, ta, tb, M, N, K, alpha, A.f, lda, B.f, ldb, beta, C.f, ldc);
    return;
  }
  /* fp32 instance: the widened bf16 operands (and for a bf16 C the fp32 result) in scratch,
   * the fp32 product, then the result rounded */
  const int64_t na = span(ta ? K : M, ta ? M : K, lda, 0, 1), nb = span(tb ? N : K, tb ? K : N, ldb, 0, 1);
  const int64_t na_pad = A.h ? (na + 63) / 64 * 64 : 0, nb_pad = B.h ? (nb + 63) / 64 * 64 : 0;
  const int64_t nc = C.h ? span(M, N, ldc, 0, 1) : 0;
  float *w = (float *)mc_cuda_scratch(be, (size_t)(na_pad + nb_pad + nc) * sizeof(float), "gemm_ex");
  if (!w) return;
  const float *Af = A.f, *Bf = B.f;
  float *Cf = C.h ? w + na_pad + nb_pad : C.f;
  if (A.h) mc_cuda_widen(be, A.h, w, na), Af = w;
  if (B.h) mc_cuda_widen(be, B.h, w + na_pad, nb), Bf = w + na_pad;
  cublasStatus_t st = cublasSgemm(mc_cu(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                  M, K, &alpha, Bf, ldb, Af, lda, &beta, Cf, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) {
    mc_cuda_fail(be, "gemm_ex M=%d N=%d K=%d: cuBLAS %s", M, N, K, cublasGetStatusString(st));
    return;
  }
  if (C.h) {
    k_round_block<<<mc_cu_grid((int64_t)M * N), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(Cf, (__nv_bfloat16 *)C.h, M, N, ldc);
    mc_cuda_check(be, "gemm_ex (bf16 result)");
  }
}

/* The order to queue a chunk's products in and the lane of each (cuda_gemm_lt.h): the
 * largest first, each to the lane with the least work so far, so that the lanes finish near
 * together (ties: the lower index). */
static void plan_lanes(const chunk *ch, const int *M, const int *N, const int *K, int lanes, int *order, int *lane) {
  double macs[GROUP_CHUNK], load[GROUP_CHUNK] = {0};
  for (int i = 0; i < ch->n; i++) {
    const int g = ch->g[i];
    macs[i] = (double)M[g] * N[g] * K[g], order[i] = i;
  }
  for (int i = 1; i < ch->n; i++) /* insertion sort, stable, largest first */
    for (int j = i; j > 0 && macs[order[j]] > macs[order[j - 1]]; j--) {
      const int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  for (int i = 0; i < ch->n; i++) {
    int best = 0;
    for (int l = 1; l < lanes; l++) best = load[l] < load[best] ? l : best;
    lane[order[i]] = best, load[best] += macs[order[i]];
  }
}

/* bf16, large groups: both operands rounded once over their whole span (a bf16 B is used as
 * stored), then one product per group straight into C with alpha and beta: no padding, no
 * pointer arrays, no fold-back pass. Each product goes through cuBLASLt with its algorithm
 * cached per shape class (cuda_gemm_lt.cu: the row counts change every micro-batch, and
 * cublasGemmEx would choose afresh on the host for each), spread over its lanes, or
 * cublasGemmEx on the backend's stream where that path is off or refuses. */
static void grouped_bf16_each(mc_backend *be, const chunk *ch, int ta, int tb, const int *M, const int *N,
                              const int *K, float alpha, mc_operand A, const int64_t *a_off, int lda, mc_operand B,
                              const int64_t *b_off, int ldb, float beta, mc_dst C, const int64_t *c_off, int ldc) {
  int64_t na = 0, nb = 0;
  for (int i = 0; i < ch->n; i++) {
    const int g = ch->g[i];
    const int64_t ea = a_off[g] + span(ta ? K[g] : M[g], ta ? M[g] : K[g], lda, 0, 1);
    const int64_t eb = b_off[g] + span(tb ? N[g] : K[g], tb ? K[g] : N[g], ldb, 0, 1);
    na = ea > na ? ea : na, nb = eb > nb ? eb : nb;
  }
  const __nv_bfloat16 *Ah, *Bh;
  if (operands_bf16(be, A, na, B, nb, &Ah, &Bh, "gemm_grouped (bf16)")) return;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  int order[GROUP_CHUNK], lane[GROUP_CHUNK];
  const int lanes = mc_cuda_lt_fork(be);
  plan_lanes(ch, M, N, K, lanes, order, lane);
  for (int j = 0; j < ch->n; j++) {
    const int i = order[j], g = ch->g[i];
    void *Cg = dst_ptr(dst_at(C, c_off[g]));
    if (!mc_cuda_lt_gemm_bf16(be, lane[i], opb, opa, N[g], M[g], K[g], alpha, Bh + b_off[g], ldb, Ah + a_off[g], lda,
                              beta, Cg, dst_type(C), ldc))
      continue;
    cublasStatus_t st = cublasGemmEx(mc_cu(be)->blas, opb, opa, N[g], M[g], K[g], &alpha, Bh + b_off[g], CUDA_R_16BF,
                                     ldb, Ah + a_off[g], CUDA_R_16BF, lda, &beta, Cg, dst_type(C), ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      mc_cuda_fail(be, "gemm_grouped (bf16) group %d: M=%d N=%d K=%d: cuBLAS %s", g, M[g], N[g], K[g],
                   cublasGetStatusString(st));
      break;
    }
  }
  mc_cuda_lt_join(be, lanes);
}

/* Mean multiply-adds per group of a chunk from which grouped_bf16_each is used instead of the
 * padded batched call (which wins for many tiny groups): 2^22, or MC_CUDA_GROUP_EACH_MACS
 * (kernels/backend_env.c; read once; for measuring one path against the other). */

static double each_threshold(void) {
  static double t = -1.0;
  if (t < 0.0) t = mc_backend_env(MC_ENV_CUDA_GROUP_EACH_MACS);
  return t;
}

static int large_groups(const chunk *ch, const int *M, const int *N, const int *K) {
  double macs = 0;
  for (int i = 0; i < ch->n; i++) macs += (double)M[ch->g[i]] * N[ch->g[i]] * K[ch->g[i]];
  return macs >= each_threshold() * ch->n;
}

/* gemm_grouped on operands as stored. */
static void grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K, float alpha,
                    mc_operand A, const int64_t *a_off, int lda, mc_operand B, const int64_t *b_off, int ldb,
                    float beta, mc_dst C, const int64_t *c_off, int ldc) {
  if (check_dst(be, C, beta, "gemm_grouped_ex")) return;
  const int bf16 = mc_cu(be)->bf16_gemm, stored16 = A.h || B.h || C.h;
  chunk ch;
  ch.n = 0;
  for (int g = 0; g <= groups; g++) {
    if (g < groups) {
      if (M[g] <= 0 || N[g] <= 0) continue;
      if (K[g] <= 0) { /* the empty product leaves beta * C */
        scale_block(be, dst_at(C, c_off[g]), M[g], N[g], ldc, beta);
        continue;
      }
      ch.g[ch.n++] = g;
    }
    if (ch.n == GROUP_CHUNK || (g == groups && ch.n > 0)) {
      if (ch.n == 1 || (stored16 && !bf16)) {
        /* one product (a dense MLP as one expert), or bf16-stored operands or result on the
         * fp32 instance: plain products, no padded copies or pointer arrays */
        for (int i = 0; i < ch.n; i++) {
          const int g1 = ch.g[i];
          const mc_operand Ag = {A.f ? A.f + a_off[g1] : NULL, A.h ? A.h + a_off[g1] : NULL};
          const mc_operand Bg = {B.f ? B.f + b_off[g1] : NULL, B.h ? B.h + b_off[g1] : NULL};
          cu_gemm_ex(be, ta, tb, M[g1], N[g1], K[g1], alpha, Ag, lda, Bg, ldb, beta, dst_at(C, c_off[g1]), ldc);
        }
      } else if (bf16 && large_groups(&ch, M, N, K)) {
        grouped_bf16_each(be, &ch, ta, tb, M, N, K, alpha, A, a_off, lda, B, b_off, ldb, beta, C, c_off, ldc);
      } else if (bf16) {
        grouped_bf16(be, &ch, ta, tb, M, N, K, alpha, A, a_off, lda, B, b_off, ldb, beta, C, c_off, ldc);
      } else {
        grouped_fp32(be, &ch, ta, tb, M, N, K, alpha, A.f, a_off, lda, B.f, b_off, ldb, beta, C.f, c_off, ldc);
      }
      ch.n = 0;
    }
  }
}

static void cu_gemm_grouped(mc_backend *be, int ta, int tb, int groups, const int *M, const int *N, const int *K,
                            float alpha, const float *A, const int64_t *a_off, int lda, const float *B,
                            const int64_t *b_off, int ldb, float beta, float *C, const int64_t *c_off, int ldc) {
  grouped(be, ta, tb, groups, M, N, K, alpha, f32(A), a_off, lda, f32(B), b_off, ldb, beta, dst32(C), c_off, ldc);
}

void mc_cuda_round(mc_backend *be, const float *x, mc_bf16 *y, int64_t n) {
  if (n <= 0) return;
  k_to_bf16<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>(x, (__nv_bfloat16 *)y, n);
  mc_cuda_check(be, "to_bf16");
}

void mc_cuda_widen(mc_backend *be, const mc_bf16 *x, float *y, int64_t n) {
  if (n <= 0) return;
  k_from_bf16<<<mc_cu_grid(n), MC_CUDA_THREADS, 0, mc_cu_stream(be)>>>((const __nv_bfloat16 *)x, y, n);
  mc_cuda_check(be, "bf16 widening");
}

void mc_cuda_install_gemm(mc_backend *be) {
  be->gemm = cu_gemm;
  be->gemm_strided = cu_gemm_strided;
  be->gemm_grouped = cu_gemm_grouped;
  be->gemm_ex = cu_gemm_ex;
  be->gemm_grouped_ex = grouped;
  be->to_bf16 = mc_cuda_round;
  be->bf16_weights = mc_cu(be)->bf16_gemm; /* the bf16 instance: the model stores bf16 matrix weights */
}
