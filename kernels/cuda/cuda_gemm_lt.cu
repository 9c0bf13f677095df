/* bf16 products through cuBLASLt with the algorithm chosen once per shape class.
 *
 * Why: the expert products of an MoE layer have a row count per expert that changes every
 * micro-batch (the routing decides it). cublasGemmEx caches its algorithm choice per exact
 * problem, so nearly every expert product is a cache miss and pays cuBLAS's heuristic query
 * on the host, which at these sizes can take longer than the product runs on the GPU. Here
 * the choice is cached per class: the transposes, the leading dimensions, the output type,
 * the operands' address alignment and each of M, N, K rounded up to a power of two. A cached
 * algorithm that cuBLASLt refuses for the exact problem is replaced by a fresh query for it.
 * The product is the same cuBLAS computation (bf16 operands, fp32 accumulation, fp32 or bf16
 * output, alpha and beta); only which kernel runs it may differ from cublasGemmEx's choice.
 * MC_CUDA_LT=0 turns the path off (every call then returns -1: the caller's cublasGemmEx).
 *
 * Lanes: the products of one grouped call (an MoE layer's experts) may run side by side on
 * LT_LANES streams, lane 0 being the backend's stream: the routing leaves some experts a few
 * rows, whose products alone fill a fraction of the GPU. mc_cuda_lt_fork makes the side
 * lanes wait for the backend's stream, mc_cuda_lt_join makes it wait for them. Each lane has
 * its own part of the workspace, and a class's algorithm does not depend on the lane, so the
 * results are the same bits on any lane. MC_CUDA_LT_LANES (1 to LT_LANES, read once) sets how
 * many are used (1: every product on the backend's stream; for measuring). */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_gemm_lt.h"

#define LT_SLOTS 512              /* shape classes remembered (then the oldest is replaced) */
#define LT_WORKSPACE (32u << 20)  /* bytes of workspace for split-K algorithms, over all lanes */
#define LT_LANES 4                /* the most lanes; kernels/backend_env.c bounds MC_CUDA_LT_LANES by it */
#define LT_LANE_WS (LT_WORKSPACE / LT_LANES)
#define LT_KEY 12

/* The descriptors of one problem (column-major, cuBLAS's convention). */
typedef struct {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
} lt_problem;

/* One shape class: its algorithm and its descriptors, whose rows and columns are set to each
 * problem's before it runs (creating descriptors per call cost host time too). */
typedef struct {
  int key[LT_KEY];
  cublasLtMatmulAlgo_t algo;
  lt_problem p;
} lt_slot;

struct mc_cuda_lt {
  cublasLtHandle_t handle;
  void *workspace;                      /* LT_LANES parts of LT_LANE_WS bytes */
  int lanes;                            /* lanes in use (MC_CUDA_LT_LANES) */
  cudaStream_t side[LT_LANES];          /* lanes 1.. (side[0] unused: lane 0 is the backend's) */
  cudaEvent_t fork, join[LT_LANES];
  lt_slot slot[LT_SLOTS];
  int n, next; /* slots in use; the one replaced next when full */
};

static int lt_enabled(void) {
  static int on = -1;
  if (on < 0) on = mc_backend_env(MC_ENV_CUDA_LT) != 0.0;
  return on;
}

/* The smallest power of two >= v (v >= 1). */
static int pow2_at_least(int v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

/* Largest power of two (<= 256) dividing the address: what the algorithm may assume. */
static int alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int al = 256;
  while (al > 1 && (a & (uintptr_t)(al - 1))) al >>= 1;
  return al;
}

/* MC_CUDA_LT_LANES: 1 to LT_LANES, refused otherwise (kernels/backend_env.c) */
static int lanes_wanted(void) {
  const int v = (int)mc_backend_env(MC_ENV_CUDA_LT_LANES);
  return v < 1 ? 1 : v > LT_LANES ? LT_LANES : v;
}

/* The side lanes' streams and events; on failure every product runs on lane 0. */
static void lanes_make(mc_cuda_lt *s) {
  s->lanes = lanes_wanted();
  if (s->lanes > 1 && cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming) != cudaSuccess) s->lanes = 1;
  for (int i = 1; i < s->lanes; i++)
    if (cudaStreamCreateWithFlags(&s->side[i], cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&s->join[i], cudaEventDisableTiming) != cudaSuccess) {
      s->lanes = i; /* the lanes made so far */
      break;
    }
  cudaGetLastError();
}

static mc_cuda_lt *lt_state(mc_backend *be) {
  mc_cuda_ctx *c = mc_cu(be);
  if (c->lt) return c->lt;
  mc_cuda_lt *s = (mc_cuda_lt *)calloc(1, sizeof *s);
  if (!s) return NULL;
  if (cublasLtCreate(&s->handle) != CUBLAS_STATUS_SUCCESS) {
    free(s);
    return NULL;
  }
  if (cudaMalloc(&s->workspace, LT_WORKSPACE) != cudaSuccess) {
    cudaGetLastError();
    cublasLtDestroy(s->handle);
    free(s);
    return NULL;
  }
  lanes_make(s);
  c->lt = s;
  return s;
}

int mc_cuda_lt_fork(mc_backend *be) {
  mc_cuda_lt *s = lt_enabled() ? lt_state(be) : NULL;
  if (!s || s->lanes < 2) return 1;
  if (cudaEventRecord(s->fork, mc_cu_stream(be)) != cudaSuccess) return cudaGetLastError(), 1;
  for (int i = 1; i < s->lanes; i++)
    if (cudaStreamWaitEvent(s->side[i], s->fork, 0) != cudaSuccess) return cudaGetLastError(), 1;
  return s->lanes;
}

void mc_cuda_lt_join(mc_backend *be, int lanes) {
  mc_cuda_lt *s = mc_cu(be)->lt;
  for (int i = 1; s && i < lanes; i++) {
    if (cudaEventRecord(s->join[i], s->side[i]) == cudaSuccess &&
        cudaStreamWaitEvent(mc_cu_stream(be), s->join[i], 0) == cudaSuccess)
      continue;
    /* the backend's stream could not be ordered after this lane: wait for it here */
    cudaGetLastError();
    cudaStreamSynchronize(s->side[i]);
  }
}

static void problem_free(lt_problem *p) {
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c) cublasLtMatrixLayoutDestroy(p->c);
}

static int problem_make(lt_problem *p, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, int lda,
                        int ldb, cudaDataType_t ctype, int ldc) {
  memset(p, 0, sizeof *p);
  const int ok =
      cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, opa == CUBLAS_OP_N ? m : k, opa == CUBLAS_OP_N ? k : m, lda) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k, ldb) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->c, ctype, m, n, ldc) == CUBLAS_STATUS_SUCCESS;
  if (!ok) problem_free(p);
  return ok ? 0 : -1;
}

/* Sets the layouts of a class's descriptors to the problem's rows and columns. 0 or -1. */
static int problem_resize(lt_problem *p, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k) {
  const uint64_t ar = (uint64_t)(opa == CUBLAS_OP_N ? m : k), ac = (uint64_t)(opa == CUBLAS_OP_N ? k : m);
  const uint64_t br = (uint64_t)(opb == CUBLAS_OP_N ? k : n), bc = (uint64_t)(opb == CUBLAS_OP_N ? n : k);
  const uint64_t cr = (uint64_t)m, cc = (uint64_t)n;
  const struct {
    cublasLtMatrixLayout_t l;
    uint64_t rows, cols;
  } set[3] = {{p->a, ar, ac}, {p->b, br, bc}, {p->c, cr, cc}};
  for (int i = 0; i < 3; i++)
    if (cublasLtMatrixLayoutSetAttribute(set[i].l, CUBLASLT_MATRIX_LAYOUT_ROWS, &set[i].rows, sizeof set[i].rows) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(set[i].l, CUBLASLT_MATRIX_LAYOUT_COLS, &set[i].cols, sizeof set[i].cols) !=
            CUBLAS_STATUS_SUCCESS)
      return -1;
  return 0;
}

/* cuBLASLt's first choice for the problem at these alignments. 0, or -1 when it has none. */
static int query(mc_cuda_lt *s, const lt_problem *p, const int al[3], cublasLtMatmulAlgo_t *algo) {
  cublasLtMatmulPreference_t pref;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return -1;
  size_t ws = LT_LANE_WS;
  uint32_t a = (uint32_t)al[0], b = (uint32_t)al[1], c = (uint32_t)al[2];
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a, sizeof a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b, sizeof b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c, sizeof c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c, sizeof c);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s->handle, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found < 1) return -1;
  *algo = res.algo;
  return 0;
}

int mc_cuda_lt_gemm_bf16(mc_backend *be, int lane, cublasOperation_t opa, cublasOperation_t opb, int m, int n,
                         int k, float alpha, const void *A, int lda, const void *B, int ldb, float beta, void *C,
                         cudaDataType_t ctype, int ldc) {
  if (!lt_enabled()) return -1;
  mc_cuda_lt *s = lt_state(be);
  if (!s) return -1;
  const int al[3] = {alignment(A), alignment(B), alignment(C)};
  const int key[LT_KEY] = {(int)opa, (int)opb, pow2_at_least(m), pow2_at_least(n), pow2_at_least(k), lda, ldb, ldc,
                           (int)ctype, al[0], al[1], al[2]};
  lt_slot *hit = NULL;
  for (int i = 0; i < s->n && !hit; i++)
    if (!memcmp(s->slot[i].key, key, sizeof key)) hit = &s->slot[i];
  if (hit) {
    if (problem_resize(&hit->p, opa, opb, m, n, k)) return -1;
  } else { /* a new class: its descriptors and cuBLASLt's choice for this problem */
    lt_problem p;
    cublasLtMatmulAlgo_t algo;
    if (problem_make(&p, opa, opb, m, n, k, lda, ldb, ctype, ldc)) return -1;
    if (query(s, &p, al, &algo)) {
      problem_free(&p);
      return -1;
    }
    const int full = s->n == LT_SLOTS;
    hit = &s->slot[full ? s->next : s->n++];
    if (full) { /* the oldest class goes */
      problem_free(&hit->p);
      s->next = (s->next + 1) % LT_SLOTS;
    }
    memcpy(hit->key, key, sizeof key);
    hit->algo = algo, hit->p = p;
  }
  if (lane < 0 || lane >= s->lanes) lane = 0;
  cudaStream_t st = lane ? s->side[lane] : mc_cu_stream(be);
  void *ws = (char *)s->workspace + (size_t)lane * LT_LANE_WS;
  for (int attempt = 0; attempt < 2; attempt++) {
    if (attempt == 1 && query(s, &hit->p, al, &hit->algo)) return -1; /* the cached choice refused this problem */
    if (cublasLtMatmul(s->handle, hit->p.op, &alpha, A, hit->p.a, B, hit->p.b, &beta, C, hit->p.c, C, hit->p.c,
                       &hit->algo, ws, LT_LANE_WS, st) == CUBLAS_STATUS_SUCCESS)
      return 0;
  }
  return -1;
}
