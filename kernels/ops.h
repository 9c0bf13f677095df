/* The backend op interface: every tensor the model touches lives in backend memory and every
 * computation on it goes through one of these function pointers, so a CUDA backend plugs in
 * without touching the model code. The CPU backend (kernels/cpu) is the reference. Each op's
 * CPU and CUDA source files (kernels/cpu/cpu_<family>.c, kernels/cuda/cuda_<family>.cu) are
 * listed in docs/kernels.md.
 *
 * Conventions (docs/design.md section 2 fixes the numbers):
 * - Tensors are fp32 (token ids and routing indices int32), row-major, contiguous unless a
 *   leading dimension is given. Where an argument is an mc_operand (input) or mc_dst
 *   (output) it may instead be stored in bf16 (mc_bf16): the op then computes on the bf16
 *   input widened exactly to fp32, and rounds a bf16 output once from its fp32 value (so the
 *   CPU reference and the CUDA backend store the same bits up to the fp32 arithmetic). Activations are token-major: n = n_seq * T rows, and row r is
 *   position r % T of sequence r / T (positions restart at 0 for every sequence).
 * - Forward ops write their outputs. Backward ops ADD into every gradient they produce (input
 *   gradients and parameter gradients alike), so a tensor used twice simply receives two
 *   contributions; callers zero gradient buffers with fill(). The exceptions: xent_bwd,
 *   which writes (it produces the first gradient of the pass), and any gradient stored in
 *   bf16 (an mc_dst with h set), which is written: it must be the gradient's only
 *   contribution, since sums are kept in fp32.
 * - Ops do not report errors one by one: a backend records the first failure and sync()
 *   returns it (0 or -1 with mc_error set), like a sticky device error. */
#ifndef MC_KERNELS_OPS_H
#define MC_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { MC_ACT_SILU = 0, MC_ACT_GELU = 1, MC_ACT_SIGMOID = 2, MC_ACT_SOFTPLUS = 3 } mc_act;

/* AdamW hyper-parameters of one update. Decoupled decay: w *= 1 - lr*weight_decay, then
 * w -= lr * mhat / (sqrt(vhat) + eps) with mhat = m / (1 - beta1^step), vhat likewise. */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;     /* 1-based, for bias correction */
  float grad_scale; /* gradients are multiplied by this first (global-norm clipping) */
} mc_adamw_args;

/* bf16 bit pattern: the top half of an IEEE fp32 (kernels/bf16.h converts, round to nearest
 * even). */
typedef uint16_t mc_bf16;

/* One tensor of a multi-tensor AdamW update (adamw_multi); the pointers are backend memory. */
typedef struct {
  float *w;            /* fp32 master weights, updated in place */
  const float *g;      /* gradient */
  float *m, *v;        /* moments */
  int64_t n;
  float weight_decay;  /* per tensor (decay group) */
  float *w_copy;       /* optional (NULL): the updated w is also written here (fp32 working weights) */
  mc_bf16 *w_bf16;     /* optional (NULL): the updated w rounded to bf16 is written here */
} mc_adamw_tensor;

/* A matrix-product operand as stored: fp32 (f) or bf16 (h); exactly one is set. */
typedef struct {
  const float *f;
  const mc_bf16 *h;
} mc_operand;

/* An op's output as stored: fp32 (f) or bf16 (h); exactly one is set. A bf16 output holds the
 * op's fp32 result rounded to nearest even (kernels/bf16.h), and is always written, never
 * accumulated into (see the conventions above for gradients). */
typedef struct {
  float *f;
  mc_bf16 *h;
} mc_dst;

typedef struct mc_backend mc_backend;

struct mc_backend {
  const char *name; /* "cpu", "cuda" */
  void *ctx;        /* backend private state */
  /* 1 when the model keeps its matrix weights in bf16 on this backend (train.dtype=bf16: the
   * products read them through gemm_ex / gemm_grouped_ex); 0: fp32 weights. */
  int bf16_weights;
  /* The model part whose ops are being queued ("A fwd", "optimizer", ...; a static string),
   * set by the network and trainer for profilers (MC_CUDA_PROFILE's table by part); NULL when
   * unset. No op reads it. */
  const char *scope;
  /* The optimizer step (1-based) the queued ops belong to, set by the trainer for profilers
   * (MC_CUDA_PROFILE_STEPS); 0 outside the training loop. No op reads it. */
  int64_t step;

  /* ---- memory */
  /* Zero-filled allocation in backend memory; NULL with mc_error set on failure. */
  void *(*alloc)(mc_backend *be, size_t bytes);
  void (*free)(mc_backend *be, void *p);
  /* Waits for the queued work, then copies. */
  void (*to_host)(mc_backend *be, void *host_dst, const void *src, size_t bytes);
  /* Ordered after the queued work and before the work queued after it; host_src may be
   * reused as soon as the call returns (CUDA copies synchronously: a queued copy from pinned
   * slots was measured and gained nothing, results/gpu/queued_uploads_2026-11-28.txt). */
  void (*from_host)(mc_backend *be, void *dst, const void *host_src, size_t bytes);
  /* Waits for queued work; returns 0, or -1 with the first recorded failure in mc_error. */
  int (*sync)(mc_backend *be);
  /* Zero-filled host memory the backend copies to and from at full speed (page-locked for
   * CUDA, so a snapshot copy into it runs asynchronously; calloc on the CPU). NULL with
   * mc_error set. CUDA page-locks a block of 64 MiB or more on a thread of its own after the
   * call returns (seconds for gigabytes): the memory is usable at once, snap_begin and
   * host_free wait for the lock. */
  void *(*host_alloc)(mc_backend *be, size_t bytes);
  void (*host_free)(mc_backend *be, void *p);
  /* Snapshot copies (checkpoints taken while training goes on). snap_begin marks the point
   * in the queued work whose results the following snap_to_host copies see; the copies run
   * beside later work (CUDA: on a second stream, into host_alloc memory); snap_end closes
   * the batch. snap_fence makes work queued after it wait until the batch has been read
   * (queued: the host does not block), so whatever overwrites the copied tensors is queued
   * after a fence. snap_wait blocks the calling host thread, which may be any thread, until
   * the batch is in host memory: 0, or -1 with mc_error. On the CPU the copies are done at
   * once and fence and wait have nothing to do. One batch at a time: begin waits for none. */
  void (*snap_begin)(mc_backend *be);
  void (*snap_to_host)(mc_backend *be, void *host_dst, const void *src, size_t bytes);
  void (*snap_end)(mc_backend *be);
  void (*snap_fence)(mc_backend *be);
  int (*snap_wait)(mc_backend *be);

  /* ---- elementwise and reductions */
  void (*fill)(mc_backend *be, float *x, int64_t n, float value);
  void (*copy)(mc_backend *be, float *dst, const float *src, int64_t n);
  void (*copy_bf16)(mc_backend *be, mc_bf16 *dst, const mc_bf16 *src, int64_t n); /* bit patterns as they are */
  /* dst[r * dpitch + j] = src[r * spitch + j] for r < height, j < width (pitches in floats,
   * each >= width; the regions must not overlap): a matrix assembled from, or split into,
   * column blocks (Muon orthogonalizes a tensor-parallel weight as one matrix). */
  void (*copy_2d)(mc_backend *be, float *dst, int64_t dpitch, const float *src, int64_t spitch, int64_t width,
                  int64_t height);
  void (*scale)(mc_backend *be, float *x, int64_t n, float alpha);         /* x *= alpha */
  void (*axpy)(mc_backend *be, float *y, const float *x, int64_t n, float alpha); /* y += alpha x */
  /* Sum of squares of x, accumulated in double, returned on the host. */
  double (*sumsq)(mc_backend *be, const float *x, int64_t n);
  /* Fused AdamW over one tensor (w fp32 master weights, m and v its moments). */
  void (*adamw)(mc_backend *be, float *w, const float *g, float *m, float *v, int64_t n,
                const mc_adamw_args *a);
  /* The same update as adamw on each of `count` tensors (a->weight_decay is ignored; each
   * tensor's own is used), bitwise equal to adamw tensor by tensor, plus the optional copies
   * of the updated weights. The descriptors are host memory (read before the call returns).
   * Tensors must not overlap. */
  void (*adamw_multi)(mc_backend *be, const mc_adamw_tensor *t, int count, const mc_adamw_args *a);
  /* Sum over `count` tensors of their sums of squares (x[i] backend memory with n[i]
   * elements; both arrays host memory), accumulated in double, one result to the host. The
   * order of additions depends only on the sizes. */
  double (*sumsq_multi)(mc_backend *be, const float *const *x, const int64_t *n, int count);

  /* ---- matrix products: C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T.
   * lda/ldb/ldc are the row strides of the matrices as stored. */
  void (*gemm)(mc_backend *be, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
  /* Same shape for `batch` products, operand i at X + i*stride_X. */
  void (*gemm_strided)(mc_backend *be, int trans_a, int trans_b, int M, int N, int K, float alpha,
                       const float *A, int lda, int64_t stride_a, const float *B, int ldb,
                       int64_t stride_b, float beta, float *C, int ldc, int64_t stride_c,
                       int batch);
  /* Grouped products of different sizes (one per expert): group g multiplies M[g] x K[g] by
   * K[g] x N[g] with operands at A + a_off[g], B + b_off[g], C + c_off[g]. Shape and offset
   * arrays are host memory. Empty groups are fine; K[g] == 0 leaves beta * C. */
  void (*gemm_grouped)(mc_backend *be, int trans_a, int trans_b, int groups, const int *M,
                       const int *N, const int *K, float alpha, const float *A,
                       const int64_t *a_off, int lda, const float *B, const int64_t *b_off,
                       int ldb, float beta, float *C, const int64_t *c_off, int ldc);
  /* gemm and gemm_grouped on operands stored in fp32 or bf16 (mc_operand: the bf16 matrix
   * weights, and activations kept in bf16 under train.dtype=bf16): the same result as on the
   * operands widened (exactly) to fp32. C is fp32, or bf16 (the fp32 result rounded) only with
   * beta == 0. The bf16 CUDA instance feeds stored bf16 straight to its tensor cores and
   * rounds only fp32 operands. */
  void (*gemm_ex)(mc_backend *be, int trans_a, int trans_b, int M, int N, int K, float alpha, mc_operand A,
                  int lda, mc_operand B, int ldb, float beta, mc_dst C, int ldc);
  void (*gemm_grouped_ex)(mc_backend *be, int trans_a, int trans_b, int groups, const int *M, const int *N,
                          const int *K, float alpha, mc_operand A, const int64_t *a_off, int lda, mc_operand B,
                          const int64_t *b_off, int ldb, float beta, mc_dst C, const int64_t *c_off, int ldc);
  /* y = x rounded to bf16 (to nearest even, as kernels/bf16.h). */
  void (*to_bf16)(mc_backend *be, const float *x, mc_bf16 *y, int64_t n);

  /* ---- bias and activations (n elements, or n rows of c columns) */
  void (*bias_fwd)(mc_backend *be, float *y, const float *b, int n, int c); /* y[r,:] += b */
  void (*bias_bwd)(mc_backend *be, const float *dy, int n, int c, float *db); /* db += colsum */
  void (*act_fwd)(mc_backend *be, mc_act act, const float *x, float *y, int64_t n);
  void (*act_bwd)(mc_backend *be, mc_act act, const float *x, const float *dy, float *dx,
                  int64_t n);
  /* Gated unit: y = act(a) * b (SwiGLU with MC_ACT_SILU, the RG-LRU input gate with
   * MC_ACT_SIGMOID and output gate with MC_ACT_GELU). Every tensor may be stored in bf16 (SwiGLU under
   * train.dtype=bf16); da and db are then written (see the conventions). */
  void (*glu_fwd)(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_dst y, int64_t n);
  void (*glu_bwd)(mc_backend *be, mc_act act, mc_operand a, mc_operand b, mc_operand dy, mc_dst da,
                  mc_dst db, int64_t n);

  /* ---- embedding: y[r,:] = W[tok[r],:]; backward scatter-adds rows into dW. */
  void (*embed_fwd)(mc_backend *be, const int32_t *tok, int n, int d, const float *W, float *y);
  void (*embed_bwd)(mc_backend *be, const int32_t *tok, int n, int d, const float *dy, float *dW);

  /* ---- RMSNorm over groups of `group` columns (group == d: full width; group == hdm: the
   * per-head Mamba norm): y = x / sqrt(mean_group(x^2) + eps) * w (y may be bf16: a normed
   * input that only feeds products). rstd[n * d/group] is saved for the backward. */
  void (*rmsnorm_fwd)(mc_backend *be, const float *x, const float *w, int n, int d, int group,
                      float eps, mc_dst y, float *rstd);
  void (*rmsnorm_bwd)(mc_backend *be, const float *x, const float *w, const float *rstd,
                      const float *dy, int n, int d, int group, float *dx, float *dw);

  /* ---- gated RMSNorm (the Mamba output norm): the RMSNorm above of g = y * silu(z), g never
   * stored: out = g / sqrt(mean_group(g^2) + eps) * w, rstd saved. z may be stored in bf16, out
   * too. The backward recomputes g from y and z, adds into dy and dw, and gives dz as stored (a
   * bf16 dz is written). */
  void (*gated_rmsnorm_fwd)(mc_backend *be, const float *y, mc_operand z, const float *w, int n, int d,
                            int group, float eps, mc_dst out, float *rstd);
  void (*gated_rmsnorm_bwd)(mc_backend *be, const float *y, mc_operand z, const float *w,
                            const float *rstd, const float *dout, int n, int d, int group, float *dy,
                            mc_dst dz, float *dw);

  /* ---- RoPE, rotate-half: x is [n, heads*hd]; pair (i, i + hd/2), i < hd/2, at position
   * t = r % T is rotated by t * theta^(-2i/hd). In place, on x as stored (fp32 or bf16); the
   * backward rotates dy back into dx (dx != dy: added into fp32, written into bf16). */
  void (*rope_fwd)(mc_backend *be, mc_dst x, int n, int T, int heads, int hd, double theta);
  void (*rope_bwd)(mc_backend *be, mc_operand dy, mc_dst dx, int n, int T, int heads, int hd, double theta);

  /* ---- causal GQA attention within each sequence: q [n, H*hd], k and v [n, KV*hd],
   * out [n, H*hd]; query head h reads kv head h / (H/KV); scale 1/sqrt(hd). lse [n, H] keeps
   * the softmax log-normaliser so the backward recomputes probabilities (no T x T matrix).
   * q, k, v, out and dout may be stored in bf16 (train.dtype=bf16); lse, dq, dk, dv are fp32. */
  void (*attn_fwd)(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, int n_seq, int T, int H, int KV,
                   int hd, mc_dst out, float *lse);
  void (*attn_bwd)(mc_backend *be, mc_operand q, mc_operand k, mc_operand v, mc_operand out, const float *lse,
                   mc_operand dout, int n_seq, int T, int H, int KV, int hd, float *dq, float *dk, float *dv);

  /* ---- causal depthwise conv over time within each sequence followed by SiLU (the Mamba
   * input convolutions), x [n, c], w [c, K], b [c]:
   * pre_t[ch] = b[ch] + sum_j w[ch, j] * x_{t-K+1+j}[ch] (zeros before the sequence start),
   * y_t[ch] = silu(pre_t[ch]). The backward recomputes pre from x (nothing but x is kept) and
   * adds into dx (as stored: a bf16 dx is written), dw and db; dy is the gradient of y. */
  void (*conv_silu_fwd)(mc_backend *be, const float *x, const float *w, const float *b, int n_seq,
                        int T, int c, int K, float *y);
  void (*conv_silu_bwd)(mc_backend *be, const float *x, const float *w, const float *b,
                        const float *dy, int n_seq, int T, int c, int K, mc_dst dx, float *dw,
                        float *db);

  /* ---- Mamba-2 selective scan, per sequence, head h, channel p, state n (state starts at
   * zero): A = -exp(A_log[h]), S_t = exp(dt_t[h] A) S_{t-1} + dt_t[h] x_t[h,p] B_t[n],
   * y_t[h,p] = sum_n C_t[n] S_t[p,n] + D[h] x_t[h,p].
   * x [n, Hm*P], dt [n, Hm] (already softplus'd), B and C [n, N] (one group), y [n, Hm*P].
   * The backward recomputes the states; it adds into dx, ddt, dB, dC, dA_log, dD. */
  void (*ssm_fwd)(mc_backend *be, const float *x, const float *dt, const float *A_log,
                  const float *B, const float *C, const float *D, int n_seq, int T, int Hm,
                  int P, int N, float *y);
  void (*ssm_bwd)(mc_backend *be, const float *x, const float *dt, const float *A_log,
                  const float *B, const float *C, const float *D, const float *dy, int n_seq,
                  int T, int Hm, int P, int N, float *dx, float *ddt, float *dA_log, float *dB,
                  float *dC, float *dD);

  /* ---- RG-LRU scan, channel-local, per sequence (h starts at zero):
   * a_t = exp(-8 softplus(lambda) r_t), h_t = a_t h_{t-1} + sqrt(1 - a_t^2) gx_t.
   * gx and r are [n, c] (gx = i * (u w_x^T), r the recurrence gate), lambda [c], h [n, c].
   * The backward reads the saved h and adds into dgx, dr, dlambda. */
  void (*rglru_fwd)(mc_backend *be, const float *gx, const float *r, const float *lambda,
                    int n_seq, int T, int c, float *h);
  void (*rglru_bwd)(mc_backend *be, const float *gx, const float *r, const float *lambda,
                    const float *h, const float *dh, int n_seq, int T, int c, float *dgx,
                    float *dr, float *dlambda);

  /* ---- MoE routing, per sequence of T tokens: probs = softmax(logits) (fp32), top-k by
   * probability with ties to the lower expert index, gates renormalised to sum 1 over the k
   * choices. capacity > 0: the assignments to an expert beyond the first `capacity` of the
   * sequence (in sequence order) are dropped (slot = -1, gate kept but unused); 0 = dropless.
   * Outputs (backend memory): probs [n, E], idx [n, k], gate [n, k], slot [n, k] = row of the
   * assignment in the expert-sorted buffer (experts in order, tokens in row order inside an
   * expert), counts [E] rows per expert over the whole micro-batch, f [n_seq, E] = fraction
   * of the sequence's k*T assignments (before dropping) that went to e, pbar [n_seq, E] =
   * P_e, the sequence's mean probability of e (NULL: not written), aux [n_seq] =
   * E * sum_e f_e P_e, dropped [1] = number of dropped assignments. */
  void (*moe_route)(mc_backend *be, const float *logits, int n_seq, int T, int E, int k,
                    int capacity, float *probs, int32_t *idx, float *gate, int32_t *slot,
                    int32_t *counts, float *f, float *pbar, float *aux, int32_t *dropped);
  /* dlogits += softmax backward of (gate gradients through the renormalisation, plus
   * aux_scale * E * f_e / T on every probability of e), aux_scale = d(objective)/d(aux). */
  void (*moe_route_bwd)(mc_backend *be, const float *probs, const int32_t *idx,
                        const float *gate, const float *dgate, const float *f, int n_seq, int T,
                        int E, int k, float aux_scale, float *dlogits);
  /* xp[slot[r,j], :] = x[r, :] for every kept assignment; xp as stored (a bf16 xp holds the
   * rows rounded: the experts' products read them). */
  void (*moe_permute)(mc_backend *be, const float *x, const int32_t *slot, int n, int k, int d,
                      mc_dst xp);
  /* dx[r, :] += sum over kept j of dxp[slot[r,j], :]. */
  void (*moe_permute_bwd)(mc_backend *be, const float *dxp, const int32_t *slot, int n, int k,
                          int d, float *dx);
  /* y[r, :] += sum over kept j of gate[r,j] * yp[slot[r,j], :]. */
  void (*moe_unpermute)(mc_backend *be, const float *yp, const int32_t *slot, const float *gate,
                        int n, int k, int d, float *y);
  /* dyp[slot, :] += gate * dy[r, :] (a bf16 dyp is written: each slot has one assignment);
   * dgate[r,j] += dy[r, :] . yp[slot, :] (kept only). */
  void (*moe_unpermute_bwd)(mc_backend *be, const float *dy, const float *yp,
                            const int32_t *slot, const float *gate, int n, int k, int d,
                            mc_dst dyp, float *dgate);

  /* ---- vocab-masked cross-entropy: logits [n, Vp], columns >= V are padding and count as
   * -inf. loss[r] = logsumexp(logits[r, :V]) - logits[r, target[r]]; lse[r] is saved.
   * xent_bwd WRITES dlogits = scale * (softmax - onehot), zero on padded columns, in fp32 or
   * (feeding only the head's products) bf16. */
  void (*xent_fwd)(mc_backend *be, const float *logits, const int32_t *target, int n, int V,
                   int Vp, float *loss, float *lse);
  void (*xent_bwd)(mc_backend *be, const float *logits, const int32_t *target, const float *lse,
                   int n, int V, int Vp, float scale, mc_dst dlogits);
};

/* The CPU reference backend (CBLAS + OpenMP). A process-wide instance; never freed. */
mc_backend *mc_backend_cpu(void);
/* The CPU reference with bf16_weights set (train.device=cpu train.dtype=bf16): the network
 * keeps in bf16 exactly what it keeps in bf16 on the CUDA bf16 instance, and the ops widen
 * bf16 inputs exactly; unlike the CUDA instance, products of fp32 operands are not rounded
 * to bf16 first and attention computes in fp32. For testing the bf16 storage paths under
 * every layout without a GPU, not for speed. A process-wide instance; never freed. */
mc_backend *mc_backend_cpu_bf16(void);
/* 1 if be is one of the two CPU instances (their memory is host memory). */
int mc_backend_is_cpu(const mc_backend *be);

#endif
