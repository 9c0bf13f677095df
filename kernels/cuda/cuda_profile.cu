/* Op-level GPU time profile of the CUDA backend, on when the environment variable
 * MC_CUDA_PROFILE names a file (or "-" for stderr). Every op of the table is wrapped: a CUDA
 * event is recorded on the backend's stream before and after the op's launches, so an op's
 * time is the GPU time of its own kernels and copies (a cuBLAS call included), not the host's.
 * Events are read back at each sync() (and when the pool fills); at exit the totals per op
 * are written: milliseconds, calls, share of the profiled time, and the span from the first
 * to the last event, whose excess over the sum is time the GPU waited for the host; that idle
 * time is also booked to the op that ended it (the gap from the previous op's end to this
 * op's start: where the GPU waits, e.g. after a sync, while the host prepares the next op).
 * A wrapper is made per table member from the member's own type (a template), so adding an
 * op to kernels/ops.h needs one line in wrap_all(). Each op's time is also booked to the
 * model part the network was in when it was queued (mc_backend.scope: "A fwd", "optimizer",
 * ...), written as a second table: GPU time per part with its largest ops. The host time of
 * each op's call (queueing its launches, cuBLAS's heuristics) is measured too: an op whose
 * host time reaches its GPU time keeps the GPU waiting. MC_CUDA_PROFILE_STEPS=A:B counts only
 * the ops of training steps A to B (mc_backend.step, set by the trainer), e.g. the steady
 * steps after the first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <type_traits>

#include "kernels/cuda/cuda_common.h"

#define PROF_MAX_OPS 64
#define PROF_POOL 4096 /* event pairs in flight between two read-backs */
#define PROF_MAX_SCOPES 32

struct prof_state {
  mc_backend orig;  /* the table before wrapping */
  const char *names[PROF_MAX_OPS];
  int n_names;
  cudaEvent_t start[PROF_POOL], end[PROF_POOL];
  int op_of[PROF_POOL], scope_of[PROF_POOL];
  int pending;
  double ms[PROF_MAX_OPS], host_ms[PROF_MAX_OPS], idle_ms[PROF_MAX_OPS];
  cudaEvent_t prev_end; /* the end of the last op read back, for the idle time before the next */
  int have_prev;
  int64_t calls[PROF_MAX_OPS];
  int64_t step_from, step_to; /* MC_CUDA_PROFILE_STEPS (0, 0: every op) */
  const char *scopes[PROF_MAX_SCOPES]; /* scope 0: none set */
  int n_scopes;
  double scope_ms[PROF_MAX_SCOPES][PROF_MAX_OPS];
  int64_t scope_calls[PROF_MAX_SCOPES];
  cudaEvent_t first, last; /* span of the whole profile */
  int have_first;
  FILE *out;
  int bf16; /* the bf16 instance */
};

static prof_state *prof_of(mc_backend *be) { return (prof_state *)mc_cu(be)->prof; }

/* Reads back every pending pair (waits for the last one). */
static void flush(prof_state *p) {
  if (!p->pending) return;
  cudaEventSynchronize(p->end[p->pending - 1]);
  for (int i = 0; i < p->pending; i++) {
    float ms = 0.0f, gap = 0.0f;
    if (cudaEventElapsedTime(&ms, p->start[i], p->end[i]) == cudaSuccess) {
      p->ms[p->op_of[i]] += ms;
      p->scope_ms[p->scope_of[i]][p->op_of[i]] += ms;
    }
    const cudaEvent_t before = i ? p->end[i - 1] : p->prev_end;
    if ((i || p->have_prev) && cudaEventElapsedTime(&gap, before, p->start[i]) == cudaSuccess && gap > 0.0f)
      p->idle_ms[p->op_of[i]] += gap;
    p->calls[p->op_of[i]]++;
    p->scope_calls[p->scope_of[i]]++;
  }
  cudaGetLastError();
  /* keep the last end for the next read-back's first gap (the handles swap; both are idle) */
  const cudaEvent_t t = p->prev_end;
  p->prev_end = p->end[p->pending - 1], p->end[p->pending - 1] = t;
  p->have_prev = 1;
  p->pending = 0;
}

/* The row of the scope now set on the backend (labels are static strings: compared by
 * content, since the same label may live at several addresses); the last row collects
 * labels beyond the table's size. */
static int scope_row(mc_backend *be, prof_state *p) {
  if (!p->n_scopes) p->scopes[0] = "(none)", p->n_scopes = 1;
  if (!be->scope) return 0;
  for (int i = 1; i < p->n_scopes; i++)
    if (p->scopes[i] == be->scope || !strcmp(p->scopes[i], be->scope)) return i;
  if (p->n_scopes == PROF_MAX_SCOPES) return PROF_MAX_SCOPES - 1;
  if (p->n_scopes == PROF_MAX_SCOPES - 1) p->scopes[p->n_scopes] = "(other)";
  else p->scopes[p->n_scopes] = be->scope;
  return p->n_scopes++;
}

static int begin(mc_backend *be, prof_state *p, int op) {
  if (p->pending == PROF_POOL) flush(p);
  int k = p->pending++;
  p->op_of[k] = op;
  p->scope_of[k] = scope_row(be, p);
  cudaEventRecord(p->start[k], mc_cu_stream(be));
  if (!p->have_first) cudaEventRecord(p->first, mc_cu_stream(be)), p->have_first = 1;
  return k;
}

static void end(mc_backend *be, prof_state *p, int k) {
  cudaEventRecord(p->end[k], mc_cu_stream(be));
  cudaEventRecord(p->last, mc_cu_stream(be));
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* 1 when the op now queued is inside the profiled steps. */
static int counted(mc_backend *be, const prof_state *p) {
  return !p->step_to || (be->step >= p->step_from && be->step <= p->step_to);
}

template <typename T, T mc_backend::*M, int OP> struct wrap;
template <typename R, typename... A, R (*mc_backend::*M)(mc_backend *, A...), int OP>
struct wrap<R (*)(mc_backend *, A...), M, OP> {
  static R call(mc_backend *be, A... a) {
    prof_state *p = prof_of(be);
    if (!counted(be, p)) return (p->orig.*M)(be, a...);
    const int k = begin(be, p, OP);
    const double t0 = now_ms();
    if constexpr (std::is_void_v<R>) {
      (p->orig.*M)(be, a...);
      p->host_ms[OP] += now_ms() - t0;
      end(be, p, k);
    } else {
      R r = (p->orig.*M)(be, a...);
      p->host_ms[OP] += now_ms() - t0;
      end(be, p, k);
      return r;
    }
  }
};

static int prof_sync(mc_backend *be) {
  prof_state *p = prof_of(be);
  int rc = p->orig.sync(be);
  flush(p);
  return rc;
}

/* Profiles of every wrapped backend, written at exit. */
static prof_state *profiles[8];
static int n_profiles;

static void report(void) {
  for (int b = 0; b < n_profiles; b++) {
    prof_state *p = profiles[b];
    flush(p);
    double total = 0.0;
    for (int i = 0; i < p->n_names; i++) total += p->ms[i];
    float span = 0.0f;
    if (p->have_first) cudaEventElapsedTime(&span, p->first, p->last);
    FILE *f = p->out;
    fprintf(f, "# MegaC CUDA op profile (%s instance): GPU time per op over the whole run\n",
            p->bf16 ? "bf16" : "fp32");
    fprintf(f, "# profiled op time %.3f ms; span first-to-last op %.3f ms (the rest of the span: GPU idle)\n", total,
            span);
    if (p->step_to)
      fprintf(f, "# ops of training steps %lld to %lld only (MC_CUDA_PROFILE_STEPS)\n", (long long)p->step_from,
              (long long)p->step_to);
    const char *rank = getenv("RANK") ? getenv("RANK") : getenv("OMPI_COMM_WORLD_RANK");
    if (rank) fprintf(f, "# process %ld, rank %s (the launcher's RANK or OMPI_COMM_WORLD_RANK)\n", (long)getpid(), rank);
    fprintf(f, "%12s %7s %10s %9s %9s %9s  %s\n", "ms", "%", "calls", "us/call", "host us", "idle us", "op");
    int order[PROF_MAX_OPS];
    for (int i = 0; i < p->n_names; i++) order[i] = i;
    for (int i = 1; i < p->n_names; i++) /* by time, descending */
      for (int j = i; j > 0 && p->ms[order[j]] > p->ms[order[j - 1]]; j--) {
        int t = order[j];
        order[j] = order[j - 1], order[j - 1] = t;
      }
    for (int i = 0; i < p->n_names; i++) {
      int o = order[i];
      if (!p->calls[o]) continue;
      fprintf(f, "%12.3f %6.1f%% %10lld %9.1f %9.1f %9.1f  %s\n", p->ms[o], total > 0 ? 100.0 * p->ms[o] / total : 0.0,
              (long long)p->calls[o], 1e3 * p->ms[o] / (double)p->calls[o], 1e3 * p->host_ms[o] / (double)p->calls[o],
              1e3 * p->idle_ms[o] / (double)p->calls[o], p->names[o]);
    }
    /* by model part: "scope" lines (ms, share, op calls, label) and the part's three largest ops */
    fprintf(f, "# GPU time by model part (mc_backend.scope), with each part's largest ops\n");
    for (int sc = 0; sc < p->n_scopes; sc++) {
      double st = 0.0;
      for (int i = 0; i < p->n_names; i++) st += p->scope_ms[sc][i];
      if (!p->scope_calls[sc]) continue;
      fprintf(f, "scope %12.3f %6.1f%% %10lld  %s  |", st, total > 0 ? 100.0 * st / total : 0.0,
              (long long)p->scope_calls[sc], p->scopes[sc]);
      int used[3] = {-1, -1, -1};
      for (int r = 0; r < 3; r++) {
        int best = -1;
        for (int i = 0; i < p->n_names; i++)
          if (i != used[0] && i != used[1] && p->scope_ms[sc][i] > 0 &&
              (best < 0 || p->scope_ms[sc][i] > p->scope_ms[sc][best]))
            best = i;
        if (best < 0) break;
        used[r] = best;
        fprintf(f, " %s %.3f", p->names[best], p->scope_ms[sc][best]);
      }
      fprintf(f, "\n");
    }
    fflush(f);
    if (f != stderr) fclose(f);
  }
}

/* One wrapped member: op index i (a compile-time constant, its row in the report). */
#define W(i, member)                                                                          \
  do {                                                                                        \
    static_assert((i) < PROF_MAX_OPS, "too many ops to profile");                             \
    if (be->member) be->member = wrap<decltype(mc_backend::member), &mc_backend::member, (i)>::call; \
    p->names[i] = #member;                                                                    \
    if (p->n_names <= (i)) p->n_names = (i) + 1;                                              \
  } while (0)

/* Every op of kernels/ops.h (sync separately: it also reads the events back). */
static void wrap_all(mc_backend *be, prof_state *p) {
  W(0, to_host);
  W(1, from_host);
  W(2, fill);
  W(3, copy);
  W(4, scale);
  W(5, axpy);
  W(6, sumsq);
  W(7, adamw);
  W(8, gemm);
  W(9, gemm_strided);
  W(10, gemm_grouped);
  W(11, bias_fwd);
  W(12, bias_bwd);
  W(13, act_fwd);
  W(14, act_bwd);
  W(15, glu_fwd);
  W(16, glu_bwd);
  W(17, embed_fwd);
  W(18, embed_bwd);
  W(19, rmsnorm_fwd);
  W(20, rmsnorm_bwd);
  W(21, rope_fwd);
  W(22, rope_bwd);
  W(23, attn_fwd);
  W(24, attn_bwd);
  W(25, conv_silu_fwd);
  W(26, conv_silu_bwd);
  W(27, ssm_fwd);
  W(28, ssm_bwd);
  W(29, rglru_fwd);
  W(30, rglru_bwd);
  W(31, moe_route);
  W(32, moe_route_bwd);
  W(33, moe_permute);
  W(34, moe_permute_bwd);
  W(35, moe_unpermute);
  W(36, moe_unpermute_bwd);
  W(37, xent_fwd);
  W(38, xent_bwd);
  W(39, gemm_ex);
  W(40, gemm_grouped_ex);
  W(41, to_bf16);
  W(42, adamw_multi);
  W(43, sumsq_multi);
  W(44, copy_2d);
  W(45, copy_bf16);
  W(46, gated_rmsnorm_fwd);
  W(47, gated_rmsnorm_bwd);
}

void mc_cuda_install_profile(mc_backend *be) {
  const char *path = getenv("MC_CUDA_PROFILE");
  if (!path || !*path || n_profiles == (int)(sizeof profiles / sizeof profiles[0])) return;
  prof_state *p = (prof_state *)calloc(1, sizeof *p);
  if (!p) return;
  /* "%p" in the path becomes the process id: one file per worker of a multi-GPU job */
  char name[4096];
  const char *pp = strstr(path, "%p");
  if (pp && strlen(path) < sizeof name - 24)
    snprintf(name, sizeof name, "%.*s%ld%s", (int)(pp - path), path, (long)getpid(), pp + 2);
  else
    snprintf(name, sizeof name, "%s", path);
  p->out = strcmp(path, "-") ? fopen(name, "w") : stderr;
  if (!p->out) {
    fprintf(stderr, "MC_CUDA_PROFILE=%s: cannot open the file; profiling off\n", path);
    free(p);
    return;
  }
  int made = cudaEventCreate(&p->prev_end) == cudaSuccess;
  for (int i = 0; made && i < PROF_POOL; i++)
    made = cudaEventCreate(&p->start[i]) == cudaSuccess && cudaEventCreate(&p->end[i]) == cudaSuccess;
  if (!made) {
    fprintf(stderr, "MC_CUDA_PROFILE: cudaEventCreate failed; profiling off\n");
    cudaGetLastError();
    free(p);
    return;
  }
  const char *steps = getenv("MC_CUDA_PROFILE_STEPS");
  long long a = 0, b = 0; /* a bad range was refused by the backend's set-up (mc_backend_env_check) */
  if (steps && *steps && mc_env_step_range("MC_CUDA_PROFILE_STEPS", steps, &a, &b) == 0) p->step_from = a, p->step_to = b;
  cudaEventCreate(&p->first);
  cudaEventCreate(&p->last);
  p->orig = *be;
  p->bf16 = mc_cu(be)->bf16_gemm;
  mc_cu(be)->prof = p;
  wrap_all(be, p);
  be->sync = prof_sync;
  if (n_profiles == 0) atexit(report);
  profiles[n_profiles++] = p;
}
