/* The hybrid network on one rank: its parameters (the families of the rank's stage, as the
 * TP/EP-local slices given by mc_shard_of), their gradients, and the forward/backward pass
 * over a micro-batch. All tensors live in backend memory; the math is docs/design.md section 2.
 * Under tensor parallelism (and SP) the pass communicates over the layout's TP group; under
 * ZeRO 3 it all-gathers each layer's weights over the (expert-)DP group when it needs them
 * and reduce-scatters the layer's gradients right after its backward (docs/parallel.md). */
#ifndef MC_TRAIN_NET_H
#define MC_TRAIN_NET_H

#include <stdint.h>

#include "core/ownership.h"
#include "comm/comm.h"
#include "kernels/ops.h"
#include "core/mem_cats.h"

typedef struct mc_net mc_net;

/* One family's working tensors on this rank. */
typedef struct {
  int fam;          /* index into geo->fams */
  mc_shard shard;   /* mc_shard_of(geo, fam, MC_STATE_PARAM, rank): local_* is what w holds */
  int64_t numel;    /* elements of the local slice */
  float *w;         /* fp32 working weights in backend memory, local slice, row-major (ZeRO 3: only while a
                       pass uses them, NULL otherwise; NULL when w16 holds them) */
  mc_bf16 *w16;     /* the working weights in bf16 instead of w: matrix weights (mc_role_is_matmul) on a
                       backend with bf16_weights (train.dtype=bf16; ZeRO 3: only while a pass uses
                       them); NULL otherwise */
  float *g;         /* fp32 gradient accumulator, same shape (ZeRO 3: the shard, z_numel) */
  /* This rank's ZeRO part of the local slice: elements [z_off, z_off + z_numel) (the
   * hyperslab mc_shard_of gives, one contiguous run of the slice; the whole slice when
   * zero = 0). */
  int64_t z_off, z_numel;
  float *ws;        /* ZeRO 3: the persistent shard of the working weights; else NULL */
  int compute_bf16; /* the layers read this matrix in bf16 (w16): resident at ZeRO 0/1, rounded into
                       zero3.buffers from the gathered fp32 slice by each ZeRO-3 gather */
} mc_net_param;

typedef struct {
  double ce_sum;     /* sum of token cross-entropies (nats) over the micro-batch */
  int64_t n_tokens;  /* tokens scored */
  double aux_sum;    /* sum over sequences and E layers of aux_loss_coef * E * sum_e f_e P_e */
  int64_t n_seqs;
  int64_t dropped;   /* (token, expert) assignments dropped by capacity */
} mc_net_stats;

/* Creates the network for `rank` of the geometry on the CPU reference backend; parameters
 * initialised from the counter-based RNG keyed by (seed, family name, global element index). */
mc_net *mc_net_create(const mc_geometry *geo, int rank, uint64_t seed);
/* The same on backend `be` (e.g. mc_backend_cuda(0)): parameters, gradients and activations
 * live in its memory. The initial values do not depend on the backend. */
mc_net *mc_net_create_on(const mc_geometry *geo, int rank, uint64_t seed, mc_backend *be);
/* The same for a rank of a parallel layout: `comm` holds the layout's groups (made by
 * mc_comm_make_groups for this layout; it must outlive the network). NULL is allowed only
 * when the world is one rank. Under pp > 1 the network holds its stage's layers
 * (train/pipeline.h runs the stages); under ep > 1 its E layers hold their experts' slice and
 * exchange rows over the ep group (train/dist_ep.c). A world of more than one rank needs a
 * host-memory backend (the CPU). */
mc_net *mc_net_create_dist(const mc_geometry *geo, int rank, uint64_t seed, const mc_comm_groups *comm);
mc_net *mc_net_create_dist_on(const mc_geometry *geo, int rank, uint64_t seed, const mc_comm_groups *comm,
                              mc_backend *be);
/* The backend the network computes on (its tensors are in this backend's memory). */
mc_backend *mc_net_backend(const mc_net *net);
void mc_net_free(mc_net *net);
int mc_net_n_params(const mc_net *net);
mc_net_param *mc_net_param_at(mc_net *net, int i);
void mc_net_zero_grad(mc_net *net);
/* Writes the fp32 initial values of param i's local slice (numel elements, as mc_net_create
 * drew them) into backend memory dst: the optimizer's master copy of a param whose working
 * weights are bf16 starts from these, not from the rounded working copy. */
int mc_net_param_initial(mc_net *net, int i, float *dst);
/* Sets param i's working weights (w or w16) from host fp32 values of its local slice. */
int mc_net_load_param(mc_net *net, int i, const float *host);

/* The activation recomputation policy (train.recompute; core/holdings.h mc_act_buf_kept says
 * what each keeps): none (the default) keeps every buffer the backward reads; selective and
 * full keep less and rebuild the rest of a layer just before its backward, with the same ops
 * on the same operands, so losses and gradients are bit for bit those of none. Re-places the
 * activations if they were already placed. Returns 0 or -1 with mc_error. */
int mc_net_set_recompute(mc_net *net, mc_recompute r);

/* With on = 1 before the step's last micro-batch (ZeRO 0/1; nothing under ZeRO 3 or where
 * no data-parallel or TP reduction packs): as each layer's backward ends, its gradients are
 * final on this rank and their reduction over the data-parallel groups starts on the side
 * queue (comm/comm.h), running during the next layer's backward; mc_dist_sync_grads
 * (train/dist.h) finishes it and reduces only what is left. The results are those of
 * reducing after the backward (the same sums per element). Off (0) for the other
 * micro-batches, whose gradients are not final. */
void mc_net_reduce_in_backward(mc_net *net, int on);

/* Sizes and allocates the activations for micro-batches of up to n_seq sequences now (the
 * trainer calls it at start-up with train.micro_batch); otherwise the first pass does. */
int mc_net_reserve(mc_net *net, int n_seq);
/* The same for n_micro micro-batches per step: under pipeline parallelism a stage keeps the
 * layer activations of min(pp - stage, n_micro) micro-batches in flight (train/pipeline.h);
 * at pp = 1 it is mc_net_reserve. */
int mc_net_reserve_micro(mc_net *net, int n_seq, int n_micro);
/* Adds the bytes of the network's arenas to bytes[c] per memory category c (core/mem_cats.h's
 * mc_mem_cat): params.* (working weights; ZeRO 3: the persistent shard), grads, activations. */
void mc_net_mem_bytes(const mc_net *net, int64_t bytes[MC_MEM_COUNT]);
/* Expert parallelism (train/dist_ep.c): rows per exchange the moe.scratch arena holds (the
 * routing bound), rows an exchange receives under balanced routing, and the most rows one
 * exchange of this rank has sent or received so far; all 0 at ep = 1 or in a stage without
 * E layers. */
void mc_net_moe_rows(const mc_net *net, int64_t *reserved, int64_t *balanced, int64_t *peak);

/* tokens: n_seq rows of seq_len+1 token ids (inputs are [0, T), targets [1, T]); every rank
 * of a TP group passes the same tokens.
 * Adds to the gradients d/dθ of  ce_weight * sum(CE) + seq_weight * sum_seq(aux)
 * (for a global batch of G sequences: ce_weight = 1/(G*T), seq_weight = 1/G).
 * Fills stats (sums, not means; equal on every rank of a TP group). Under TP the gradients
 * of partial-gradient families are this rank's partial sums until mc_dist_sync_grads
 * (train/dist.h) combines them; under ZeRO 3 they are already reduced into each rank's shard. */
int mc_net_forward_backward(mc_net *net, const int32_t *tokens, int n_seq, double ce_weight,
                            double seq_weight, mc_net_stats *stats);
/* Forward only (evaluation). */
int mc_net_forward(mc_net *net, const int32_t *tokens, int n_seq, mc_net_stats *stats);

#endif
