/* bench_expert_gemm: host time and GPU time of one MoE grouped product (one product per expert,
 * each expert's row count set by the routing) by each way cuBLAS offers it.
 *
 *   bench_expert_gemm [--experts E] [--rows R] [--d D] [--h H] [--reps N] [--seed S]
 *                     [--streams S] [--counts FILE] [--backlog K]
 *
 * Products (row-major, C = op(A) op(B), bf16 operands, fp32 accumulation), at an E layer's
 * shapes (defaults: nam-small at micro-batch 8: 8 experts, 32768 routed rows, d 1024, h 2048):
 *   up     C[n_e x h] bf16  = x[n_e x d] w1[e]^T        (h1 and h3 of the forward)
 *   down   C[n_e x d] bf16  = a[n_e x h] w2[e]^T        (y of the forward; da, dx of the backward)
 *   wgrad  C[h x d]   fp32 += dh[n_e x h]^T x[n_e x d]  (dw1, dw3; beta 1)
 * Ways:
 *   lt      one cublasLtMatmul per expert, its algorithm cached per class (M, N, K rounded up to
 *           powers of two) and the class's descriptors resized to each problem: what
 *           kernels/cuda/cuda_gemm_lt.cu does;
 *   lt_same as lt, but every repetition has the same row counts (n_e = R / E): whether varying
 *           shapes cost host time;
 *   lt_streams as lt, the experts' products spread over S streams (--streams, default 4) that
 *           fork from and join back into the main stream by events, each with its own
 *           workspace: the products of small experts run side by side;
 *   gemmex  one cublasGemmEx per expert;
 *   grouped one cublasGemmGroupedBatchedEx per product (operand addresses written to the device
 *           by a one-block kernel from its arguments), where cuBLAS supports the types.
 * Method: each way runs N repetitions, each with its own random row counts (uniform in
 * [R/E/2, 3R/(2E)], rescaled to sum to R); a warm pass, the held pass and the in-order pass
 * each use count sets of their own, so no exact problem repeats (as in training, where the
 * routing sets new counts every micro-batch: cublasGemmEx's own algorithm cache misses).
 * --counts FILE: the count sets are read from FILE instead (lines of E integers, e.g. a
 * trainer's routing), used in turn. Host time: the wall time of issuing the N products
 * while the stream is held behind a spinning kernel, divided by N. GPU time: two events around
 * the N products on that held stream, divided by N (checked: the spin outlasts the issuing;
 * otherwise "host-bound" is printed). In-order: N products issued and synchronised with the
 * stream not held, wall time over N. --backlog K: K empty kernels are queued behind the spin
 * before the held products (whether a deep launch queue slows the host's calls). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_E 64
#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "bench_expert_gemm: %s: %s\n", #x, cudaGetErrorString(e_));               \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

__global__ void k_spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void k_empty(void) {}

__global__ void k_fill(__nv_bfloat16 *p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16((float)(h & 0xffff) / 65536.0f - 0.5f);
  }
}

struct ptrs {
  const void *a[MAX_E], *b[MAX_E];
  void *c[MAX_E];
};
__global__ void k_set_ptrs(ptrs p, int n, const void **a, const void **b, void **c) {
  int i = threadIdx.x;
  if (i < n) a[i] = p.a[i], b[i] = p.b[i], c[i] = p.c[i];
}

/* One product kind in cuBLAS's column-major terms: C^T = op(B)^T op(A)^T, per expert e with
 * row count n: m, n, k of the cuBLAS call and the operand offsets. */
enum kind { UP, DOWN, WGRAD };
static const char *kind_name[] = {"up", "down", "wgrad"};

struct problem {
  cublasOperation_t opa, opb; /* cuBLAS's A is our B */
  int m, n, k, lda, ldb, ldc;
  const __nv_bfloat16 *A, *B;
  void *C;
  cudaDataType_t ctype;
  float beta;
};

static int d_, h_;
static __nv_bfloat16 *X, *W1, *W2, *Act, *Out16;
static float *Out32;

/* The problem of expert e with n rows starting at row r0. */
static problem make(kind kd, int e, int n, int64_t r0) {
  problem p;
  if (kd == UP) { /* C[n x h] = X[n x d] W1[e]^T: cuBLAS m = h, n = n, k = d; A = W1 (T), B = X (N) */
    p = {CUBLAS_OP_T, CUBLAS_OP_N, h_, n, d_, d_, d_, h_, W1 + (int64_t)e * h_ * d_, X + r0 * d_, Out16 + r0 * h_,
         CUDA_R_16BF, 0.0f};
  } else if (kd == DOWN) { /* C[n x d] = Act[n x h] W2[e]^T */
    p = {CUBLAS_OP_T, CUBLAS_OP_N, d_, n, h_, h_, h_, d_, W2 + (int64_t)e * d_ * h_, Act + r0 * h_, Out16 + r0 * d_,
         CUDA_R_16BF, 0.0f};
  } else { /* C[h x d] += Act[n x h]^T X[n x d]: cuBLAS m = d, n = h, k = n; A = X (N), B = Act (T) */
    p = {CUBLAS_OP_N, CUBLAS_OP_T, d_, h_, n, d_, h_, d_, X + r0 * d_, Act + r0 * h_, Out32 + (int64_t)e * h_ * d_,
         CUDA_R_32F, 1.0f};
  }
  return p;
}

/* ---- cuBLASLt with the algorithm cached per class, descriptors resized (cuda_gemm_lt.cu) */
struct lt_class {
  int key[4];
  cublasLtMatmulAlgo_t algo;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
};
static cublasLtHandle_t lt;
static void *lt_ws;
static const size_t LT_WS = 32u << 20;
static lt_class lt_cls[256];
static int lt_n;

static int pow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

static void lt_layouts(lt_class *c, const problem &p, int create) {
  uint64_t ar = p.opa == CUBLAS_OP_N ? p.m : p.k, ac = p.opa == CUBLAS_OP_N ? p.k : p.m;
  uint64_t br = p.opb == CUBLAS_OP_N ? p.k : p.n, bc = p.opb == CUBLAS_OP_N ? p.n : p.k;
  uint64_t cr = p.m, cc = p.n;
  if (create) {
    cublasLtMatrixLayoutCreate(&c->a, CUDA_R_16BF, ar, ac, p.lda);
    cublasLtMatrixLayoutCreate(&c->b, CUDA_R_16BF, br, bc, p.ldb);
    cublasLtMatrixLayoutCreate(&c->c, p.ctype, cr, cc, p.ldc);
    return;
  }
  cublasLtMatrixLayoutSetAttribute(c->a, CUBLASLT_MATRIX_LAYOUT_ROWS, &ar, sizeof ar);
  cublasLtMatrixLayoutSetAttribute(c->a, CUBLASLT_MATRIX_LAYOUT_COLS, &ac, sizeof ac);
  cublasLtMatrixLayoutSetAttribute(c->b, CUBLASLT_MATRIX_LAYOUT_ROWS, &br, sizeof br);
  cublasLtMatrixLayoutSetAttribute(c->b, CUBLASLT_MATRIX_LAYOUT_COLS, &bc, sizeof bc);
  cublasLtMatrixLayoutSetAttribute(c->c, CUBLASLT_MATRIX_LAYOUT_ROWS, &cr, sizeof cr);
  cublasLtMatrixLayoutSetAttribute(c->c, CUBLASLT_MATRIX_LAYOUT_COLS, &cc, sizeof cc);
}

static void run_lt(const problem &p, cudaStream_t st, void *ws) {
  int key[4] = {(int)p.ctype, pow2(p.m), pow2(p.n), pow2(p.k)};
  lt_class *c = NULL;
  for (int i = 0; i < lt_n && !c; i++)
    if (!memcmp(lt_cls[i].key, key, sizeof key)) c = &lt_cls[i];
  if (c) {
    lt_layouts(c, p, 0);
  } else {
    c = &lt_cls[lt_n++];
    memcpy(c->key, key, sizeof key);
    cublasLtMatmulDescCreate(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSA, &p.opa, sizeof p.opa);
    cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSB, &p.opb, sizeof p.opb);
    lt_layouts(c, p, 1);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &LT_WS, sizeof LT_WS);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, c->op, c->a, c->b, c->c, c->c, pref, 1, &res, &found) ||
        found < 1) {
      fprintf(stderr, "bench_expert_gemm: no cuBLASLt algorithm\n");
      exit(1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    c->algo = res.algo;
  }
  float one = 1.0f;
  if (cublasLtMatmul(lt, c->op, &one, p.A, c->a, p.B, c->b, &p.beta, p.C, c->c, p.C, c->c, &c->algo, ws, LT_WS,
                     st)) {
    fprintf(stderr, "bench_expert_gemm: cublasLtMatmul refused m %d n %d k %d\n", p.m, p.n, p.k);
    exit(1);
  }
}

/* ---- the ways: one product over all experts */
static cublasHandle_t blas;
static void **dptr;

enum way { LT, LT_SAME, LT_STREAMS, GEMMEX, GROUPED, N_WAYS };
static const char *way_name[] = {"lt", "lt_same", "lt_streams", "gemmex", "grouped"};
#define MAX_STREAMS 16
static int n_side = 4;
static cudaStream_t side[MAX_STREAMS];
static cudaEvent_t fork_ev, join_ev[MAX_STREAMS];
static void *side_ws[MAX_STREAMS];

static int product(way w, kind kd, int E, const int *cnt, cudaStream_t st) {
  int64_t r0 = 0;
  if (w == GROUPED) {
    if (kd == WGRAD) return -1; /* cuBLAS's grouped call: A, B, C of one type */
    ptrs pp;
    cublasOperation_t ta[MAX_E], tb[MAX_E];
    int m[MAX_E], n[MAX_E], k[MAX_E], la[MAX_E], lb[MAX_E], lc[MAX_E], gs[MAX_E];
    float al[MAX_E], be[MAX_E];
    for (int e = 0; e < E; e++) {
      problem p = make(kd, e, cnt[e], r0);
      r0 += cnt[e];
      pp.a[e] = p.A, pp.b[e] = p.B, pp.c[e] = p.C;
      ta[e] = p.opa, tb[e] = p.opb, m[e] = p.m, n[e] = p.n, k[e] = p.k, la[e] = p.lda, lb[e] = p.ldb, lc[e] = p.ldc;
      gs[e] = 1, al[e] = 1.0f, be[e] = p.beta;
    }
    const void **da = (const void **)dptr, **db = da + MAX_E;
    void **dc = dptr + 2 * MAX_E;
    k_set_ptrs<<<1, MAX_E, 0, st>>>(pp, E, da, db, dc);
    cublasStatus_t s = cublasGemmGroupedBatchedEx(blas, ta, tb, m, n, k, al, da, CUDA_R_16BF, la, db, CUDA_R_16BF, lb,
                                                  be, dc, CUDA_R_16BF, lc, E, gs, CUBLAS_COMPUTE_32F);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : -1;
  }
  if (w == LT_STREAMS) {
    cudaEventRecord(fork_ev, st);
    for (int i = 0; i < n_side; i++) cudaStreamWaitEvent(side[i], fork_ev, 0);
  }
  for (int e = 0; e < E; e++) {
    problem p = make(kd, e, cnt[e], r0);
    r0 += cnt[e];
    if (w == LT_STREAMS) {
      run_lt(p, side[e % n_side], side_ws[e % n_side]);
    } else if (w == GEMMEX) {
      float one = 1.0f;
      if (cublasGemmEx(blas, p.opa, p.opb, p.m, p.n, p.k, &one, p.A, CUDA_R_16BF, p.lda, p.B, CUDA_R_16BF, p.ldb,
                       &p.beta, p.C, p.ctype, p.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))
        return -1;
    } else {
      run_lt(p, st, lt_ws);
    }
  }
  if (w == LT_STREAMS)
    for (int i = 0; i < n_side; i++) cudaEventRecord(join_ev[i], side[i]), cudaStreamWaitEvent(st, join_ev[i], 0);
  return 0;
}

/* The options, each a flag and its value; an unknown flag, a missing value or one that is not
 * a whole number is refused (exit 2). */
static const char *const k_int_flags[] = {"--experts", "--rows", "--d", "--h", "--reps", "--seed", "--streams",
                                          "--backlog"};
enum { N_INT_FLAGS = sizeof k_int_flags / sizeof k_int_flags[0] };

static int parse_args(int argc, char **argv, int val[N_INT_FLAGS], const char **counts_file) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_expert_gemm: %s needs a value\n", argv[i]);
      return -1;
    }
    if (!strcmp(argv[i], "--counts")) {
      *counts_file = argv[i + 1];
      continue;
    }
    int f = 0;
    while (f < N_INT_FLAGS && strcmp(argv[i], k_int_flags[f])) f++;
    if (f == N_INT_FLAGS) {
      fprintf(stderr, "bench_expert_gemm: unknown option %s (see the file's header)\n", argv[i]);
      return -1;
    }
    char *end = NULL;
    const long v = strtol(argv[i + 1], &end, 10);
    if (!*argv[i + 1] || *end || v < INT_MIN || v > INT_MAX) {
      fprintf(stderr, "bench_expert_gemm: %s %s: not a whole number\n", argv[i], argv[i + 1]);
      return -1;
    }
    val[f] = (int)v;
  }
  return 0;
}

int main(int argc, char **argv) {
  int val[N_INT_FLAGS] = {8, 32768, 1024, 2048, 40, 1, 4, 0}; /* the defaults, in k_int_flags' order */
  const char *counts_file = NULL;
  if (parse_args(argc, argv, val, &counts_file)) return 2;
  const int E = val[0], R = val[1];
  d_ = val[2], h_ = val[3];
  const int reps = val[4], seed = val[5];
  n_side = val[6];
  const int backlog = val[7];
  if (E < 1 || E > MAX_E || R < 2 * E || d_ < 1 || h_ < 1 || reps < 1 || n_side < 1 || n_side > MAX_STREAMS ||
      backlog < 0) {
    fprintf(stderr,
            "bench_expert_gemm: need 1 <= experts <= %d, rows >= 2 experts, d, h, reps >= 1, 1 <= streams <= %d, "
            "backlog >= 0\n",
            MAX_E, MAX_STREAMS);
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# device %s, %d SMs; experts %d rows %d d %d h %d reps %d seed %d\n", prop.name, prop.multiProcessorCount, E,
         R, d_, h_, reps, seed);
  const int64_t big = (int64_t)R * (d_ > h_ ? d_ : h_);
  CK(cudaMalloc(&X, (size_t)R * d_ * 2));
  CK(cudaMalloc(&Act, (size_t)R * h_ * 2));
  CK(cudaMalloc(&W1, (size_t)E * h_ * d_ * 2));
  CK(cudaMalloc(&W2, (size_t)E * h_ * d_ * 2));
  CK(cudaMalloc(&Out16, (size_t)big * 2));
  CK(cudaMalloc(&Out32, (size_t)E * h_ * d_ * 4));
  CK(cudaMalloc(&dptr, 3 * MAX_E * sizeof(void *)));
  CK(cudaMalloc(&lt_ws, LT_WS));
  k_fill<<<1024, 256>>>(X, (int64_t)R * d_, 1);
  k_fill<<<1024, 256>>>(Act, (int64_t)R * h_, 2);
  k_fill<<<1024, 256>>>(W1, (int64_t)E * h_ * d_, 3);
  k_fill<<<1024, 256>>>(W2, (int64_t)E * h_ * d_, 4);
  CK(cudaMemset(Out32, 0, (size_t)E * h_ * d_ * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasCreate(&blas);
  cublasSetStream(blas, st);
  cublasLtCreate(&lt);

  /* row counts per repetition */
  int *cnt = (int *)malloc((size_t)3 * reps * E * sizeof(int));
  srand((unsigned)seed);
  for (int r = 0; r < 3 * reps; r++) {
    int *c = cnt + (int64_t)r * E, sum = 0;
    for (int e = 0; e < E; e++) c[e] = R / E / 2 + rand() % (R / E + 1), sum += c[e];
    int left = R;
    for (int e = 0; e < E; e++) c[e] = e + 1 < E ? (int)((int64_t)c[e] * R / sum) : left, left -= e + 1 < E ? c[e] : 0;
  }
  if (counts_file) { /* lines of E counts, each set summing to at most R, used in turn */
    FILE *f = fopen(counts_file, "r");
    if (!f) {
      fprintf(stderr, "bench_expert_gemm: cannot open %s\n", counts_file);
      return 2;
    }
    int n = 0, v;
    static int buf[1 << 16];
    while (n < (1 << 16) && fscanf(f, "%d", &v) == 1) buf[n++] = v;
    fclose(f);
    if (n < E || n % E) {
      fprintf(stderr, "bench_expert_gemm: %s: %d numbers, not a multiple of %d experts\n", counts_file, n, E);
      return 2;
    }
    for (int s0 = 0; s0 < n; s0 += E) {
      int64_t sum = 0;
      for (int e = 0; e < E; e++) sum += buf[s0 + e] < 0 ? R + 1 : buf[s0 + e];
      if (sum > R) {
        fprintf(stderr, "bench_expert_gemm: %s: set %d sums to more than %d rows\n", counts_file, s0 / E + 1, R);
        return 2;
      }
    }
    for (int r = 0; r < 3 * reps; r++)
      for (int e = 0; e < E; e++) cnt[(int64_t)r * E + e] = buf[(r * E) % n + e];
    printf("# counts from %s: %d sets, used in turn; the first:", counts_file, n / E);
    for (int e = 0; e < E; e++) printf(" %d", buf[e]);
    printf("\n");
  }
  for (int i = 0; i < n_side; i++) {
    CK(cudaStreamCreateWithFlags(&side[i], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&join_ev[i], cudaEventDisableTiming));
    CK(cudaMalloc(&side_ws[i], LT_WS));
  }
  CK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
  int *same = (int *)malloc((size_t)E * sizeof(int));
  for (int e = 0; e < E; e++) same[e] = R / E + (e < R % E);

  cudaEvent_t spun, t0, t1;
  cudaEventCreate(&spun), cudaEventCreate(&t0), cudaEventCreate(&t1);
  /* clock rate for the spin: about 150 ms */
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  const long long spin = (long long)khz * 150;

  printf("%-6s %-8s %12s %12s %12s %10s\n", "kind", "way", "host_us", "gpu_us", "inorder_us", "gpu_TFLOPs");
  for (int kd = 0; kd < 3; kd++)
    for (int w = 0; w < N_WAYS; w++) {
      /* warm: every count set once (classes, heuristics, lazy module loads) */
      int ok = 1;
      for (int r = 0; r < reps && ok; r++)
        ok = !product((way)w, (kind)kd, E, w == LT_SAME ? same : cnt + (int64_t)r * E, st);
      CK(cudaStreamSynchronize(st));
      if (!ok) {
        printf("%-6s %-8s %12s\n", kind_name[kd], way_name[w], "unsupported");
        continue;
      }
      k_spin<<<1, 1, 0, st>>>(spin);
      for (int i = 0; i < backlog; i++) k_empty<<<1, 32, 0, st>>>();
      cudaEventRecord(spun, st);
      cudaEventRecord(t0, st);
      double h0 = now_us();
      for (int r = 0; r < reps; r++)
        product((way)w, (kind)kd, E, w == LT_SAME ? same : cnt + (int64_t)(reps + r) * E, st);
      double host = (now_us() - h0) / reps;
      const int held = cudaEventQuery(spun) == cudaErrorNotReady;
      cudaEventRecord(t1, st);
      CK(cudaStreamSynchronize(st));
      float ms = 0;
      cudaEventElapsedTime(&ms, t0, t1);
      double gpu = ms * 1e3 / reps;
      h0 = now_us();
      for (int r = 0; r < reps; r++)
        product((way)w, (kind)kd, E, w == LT_SAME ? same : cnt + (int64_t)(2 * reps + r) * E, st);
      CK(cudaStreamSynchronize(st));
      double inorder = (now_us() - h0) / reps;
      double rows = 0; /* mean routed rows of the held pass's sets */
      for (int r = 0; r < reps; r++)
        for (int e = 0; e < E; e++) rows += w == LT_SAME ? same[e] : cnt[(int64_t)(reps + r) * E + e];
      const double flop = 2.0 * rows / reps * d_ * h_;
      printf("%-6s %-8s %12.1f %12.1f %12.1f %10.1f%s\n", kind_name[kd], way_name[w], host, gpu, inorder,
             flop / gpu * 1e-6, held ? "" : "  (host-bound: gpu_us includes waiting)");
    }
  CK(cudaGetLastError());
  return 0;
}
