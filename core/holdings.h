/* What a rank holds: for a layout, a rank and the training settings, every tensor of the
 * training state and of the working set, with its memory category and bytes. This is the one
 * answer to "what does this rank hold, in which memory category, at how many bytes":
 *   - the trainer allocates from it (train/net.c: working weights, gradients, activations;
 *     train/optim.c: master weights and moments);
 *   - the planner reports it (plan/plan.c), so the plan equals the allocation by construction;
 *   - the audit (reshard/audit.c) totals a checkpoint's states per rank and category from it,
 *     and checks that every rank wrote exactly the bytes of the states it is primary for.
 * Parameter-derived tensors come from mc_shard_of (core/ownership.h); activations from the
 * block-kind table (core/blocks.h). Every tensor occupies mc_mem_footprint(bytes) in its
 * category's one allocation (the trainer's arenas). */
#ifndef MC_CORE_HOLDINGS_H
#define MC_CORE_HOLDINGS_H

#include <stdint.h>

#include "core/blocks.h"
#include "core/mem_cats.h"
#include "core/ownership.h"

/* The training settings that change what a rank holds. */
typedef struct {
  int bf16_weights;  /* matrix weights (mc_role_is_matmul) kept in bf16, with an fp32 master copy */
  int act16;         /* MC_STORE_PROD activations kept in bf16: with bf16 weights, under every layout */
  int micro_batch;   /* sequences per micro-batch */
  int n_micro;       /* micro-batches per optimizer step per DP rank */
  mc_recompute recompute;
  int moe_dense;     /* 1: an E block of one expert, one choice and no possible drop runs as the
                        plain SwiGLU (mc_moe_is_plain; the trainer's default); 0: always routed */
} mc_hold_opts;

/* The settings a training configuration implies: train.dtype=bf16 keeps bf16 matrix weights
 * and bf16 product activations. Fails (message naming the key)
 * on an unknown dtype or recompute policy, or a batch that does not divide. */
int mc_hold_opts_of(const mc_geometry *g, const mc_train_cfg *t, mc_hold_opts *o);


/* ------------------------------------------------------------------ parameters */

/* One family's tensors on one rank (nothing when the family's stage is not the rank's). */
typedef struct {
  int fam;
  int in_stage;
  mc_shard shard;          /* mc_shard_of(g, fam, MC_STATE_PARAM, rank) */
  int64_t local_numel;     /* elements of the TP/EP-local slice */
  int64_t z_off, z_numel;  /* this rank's ZeRO part of the local slice: the state hyperslab, one contiguous run of it */
  int compute_bf16;        /* the layers multiply by bf16 weights (train.dtype=bf16, matrix families) */
  int working_bf16;        /* the resident working weights are bf16: compute_bf16 at ZeRO 0/1. ZeRO 3
                              keeps the fp32 shard resident (its own master) and rounds each
                              gathered slice to bf16 in zero3.buffers */
  mc_mem_cat param_cat;    /* params.replicated / params.tp / params.ep, by placement */
  int64_t working_numel;   /* resident working weights: the local slice, or at zero=3 the ZeRO part */
  int64_t working_bytes;
  int64_t grad_bytes;      /* fp32 gradient accumulator of the resident elements (category grads) */
  mc_mem_cat master_cat;   /* optimizer.master.{decay,no_decay} */
  int has_master;          /* an fp32 master copy of the state hyperslab: bf16 resident working
                              weights only (fp32 working weights are their own master) */
  int64_t master_bytes;    /* its bytes (0 with an empty hyperslab: still a tensor) */
  mc_mem_cat moments_cat;  /* optimizer.moments.{decay,no_decay} */
  int n_moments;           /* optimizer state tensors shaped like the parameter besides the master:
                              the ones the family's optimizer declares (core/optim_groups.h:
                              AdamW 2, Muon 1) */
  int64_t moment_bytes;    /* each of them (all fp32, shaped like the state hyperslab) */
  int n_scalars;           /* scalar states the rank holds (AdamW's step; none where it holds
                              nothing of the parameter): host memory of the optimizer, which
                              computes the bias correction from it, so in no device category */
  int64_t scalar_bytes;    /* each of them: one element of its declared dtype (int64: 8) */
  /* The checkpoint's view: for each state kind, the bytes of the hyperslab the rank holds
   * (mc_shard_of, at the kind's declared dtype: fp32, int64 for step; 0 for a kind the
   * family's optimizer does not keep), the category it counts under (param: by placement;
   * optimizer states: by decay group) and whether the rank is its primary, the one that
   * writes it. */
  int64_t state_bytes[MC_N_STATES];
  mc_mem_cat state_cat[MC_N_STATES];
  int state_primary[MC_N_STATES];
} mc_param_hold;

int mc_param_hold_of(const mc_geometry *g, int fam, int rank, const mc_hold_opts *o, mc_param_hold *out);

/* ------------------------------------------------------------------ activations */

/* A micro-batch as one rank of a stage sees it. */
typedef struct {
  mc_model local;   /* the model the rank computes with (mc_model_local) */
  int tp, sp;       /* sp: sequence parallelism in effect (sp and tp > 1) */
  int ep;           /* expert-parallel group size */
  int n_seq;        /* sequences of the micro-batch */
  int T_res;        /* positions per sequence in the residual stream: T, or T / tp under SP */
  int act16;
  int routed;       /* the stage's E blocks route (not the plain SwiGLU) */
  int first, last;  /* the stage holds the embedding / the head */
} mc_act_shape;

void mc_act_shape_of(const mc_geometry *g, int stage, const mc_hold_opts *o, int n_seq, mc_act_shape *s);

/* Whether a buffer exists under the shape (its `when` conditions) in a layer of kind k (NULL:
 * a network buffer), its elements and its bytes (bf16 storage rounds up to whole floats, as
 * the trainer sizes buffers in floats). */
int mc_act_buf_exists(const mc_act_buf *b, const mc_act_shape *s, const mc_block_kind *k);
int64_t mc_act_buf_numel(const mc_act_buf *b, const mc_act_shape *s);
int mc_act_buf_bf16(const mc_act_buf *b, const mc_act_shape *s);
int64_t mc_act_buf_bytes(const mc_act_buf *b, const mc_act_shape *s);

/* Per-layer buffers of every kind: the residual input, the normed input, its 1/rms. */
enum { MC_L_X_IN, MC_L_U16, MC_L_U, MC_L_RSTD, MC_L_NBUFS };
extern const mc_act_buf mc_layer_bufs[MC_L_NBUFS];
/* Buffers of the network around the layers (the residual stream, embedding, head and loss,
 * the TP/SP staging rows), held once whatever the depth. */
enum {
  MC_NB_TOK_IN, MC_NB_TOK_TGT, MC_NB_X, MC_NB_HF, MC_NB_RSTD_F, MC_NB_LOGITS, MC_NB_LOSS, MC_NB_LSE, MC_NB_DX, MC_NB_DU,
  MC_NB_Y, MC_NB_FULL, MC_NB_DLOGITS, MC_NB_USH, MC_NB_UFULL, MC_NB_EMB_TOK, MC_NB_EMB_SLOT, MC_NB_EMB_ROWS,
  MC_NB_EMB_GATE, MC_NB_COUNT
};
extern const mc_act_buf mc_net_bufs[MC_NB_COUNT];

/* Whether a per-layer buffer (mc_layer_bufs) or a kind's saved buffer is kept for the backward
 * under recompute policy r: none keeps every one; selective keeps x_in, rstd and the saved
 * buffers marked keep_selective (the products' outputs); full keeps x_in only. A buffer not
 * kept lives in the recompute working set, shared by the layers: the layer's forward writes
 * it and the backward rebuilds it from the kept ones just before the layer's backward
 * (train/net.c). This is the one definition the trainer places and the planner counts. */
int mc_act_buf_kept(const mc_act_buf *b, mc_recompute r);
/* Footprint bytes one layer of `kind` keeps for backward under a recompute policy (the per-layer
 * buffers and the kind's saved buffers that mc_act_buf_kept keeps). */
int64_t mc_act_layer_bytes(const mc_block_kind *k, const mc_act_shape *s, mc_recompute r);
/* Footprint bytes of the buffers it does not keep (0 under none): its part of the working set. */
int64_t mc_act_layer_dropped_bytes(const mc_block_kind *k, const mc_act_shape *s, mc_recompute r);
/* Footprint bytes of the gradient scratch the layers of `kinds` (block letters) share: buffer
 * index i holds the largest buffer i of any of the kinds. */
int64_t mc_act_scratch_bytes(const char *kinds, const mc_act_shape *s);
/* Footprint bytes of the network buffers (mc_net_bufs) present under the shape. */
int64_t mc_act_net_bytes(const mc_act_shape *s);

/* Activation-side holdings of one stage. */
typedef struct {
  int inflight;          /* micro-batches in flight under 1F1B: min(pp - stage, n_micro) */
  int64_t per_micro;     /* the stage's layers, per micro-batch in flight */
  int64_t transient;     /* recompute working set: the largest mc_act_layer_dropped_bytes of the stage's layers
                            (0 without recompute) */
  int64_t scratch;       /* gradient scratch shared by the layers */
  int64_t network;       /* network buffers */
  int64_t activations;   /* inflight * per_micro + transient + scratch + network */
  int64_t pipeline;      /* pp > 1: receive buffers of one boundary activation and gradient */
  /* Expert parallelism (ep > 1; all 0 at ep = 1, where routing lives in the E layers' saved
   * buffers), as train/dist_ep.c keeps it in the moe.scratch arena: R = the most (token,
   * choice) rows the routing rule lets this rank's experts receive per micro-batch (dropless:
   * ep x tokens x min(top_k, E/ep); a capacity factor bounds it further), so no routing overruns
   * it; per E layer the received input rows [R, d] and the expert activations h1, h3, SwiGLU
   * [R, F], kept for the backward (for each micro-batch in flight); once, the local input and
   * received gradient rows [R, d], the returned rows [R, d] (fp32) and the backward's da, dh1,
   * dh3 [R, F] (the all-to-alls move rows straight between these, no staging). The rows the expert products read are bf16
   * under act16 (es = 2), else fp32 (es = 4). Every tensor at its footprint. */
  int64_t moe_assignments; /* R, the bound the buffers are sized for */
  int64_t moe_balanced;    /* rows received under balanced routing, tokens x top_k (x cf): for reports */
  int64_t moe_layers;      /* in-flight micro-batches x E layers of the stage x (fp(R d es) + 3 fp(R F es)); under
                              full recomputation one set (fp(R d es) + 3 fp(R F es)), shared by them all */
  int64_t moe_exchange;    /* fp(R d 4) + fp(R d es) + 3 fp(R F es) */
  int64_t moe_scratch;     /* moe_layers + moe_exchange */
} mc_stage_hold;

int mc_stage_hold_of(const mc_geometry *g, int stage, const mc_hold_opts *o, mc_stage_hold *out);

/* ------------------------------------------------------------------ totals */

/* Bytes per memory category of everything the rank holds (parameters, gradients, optimizer
 * states, ZeRO-3 gather buffers, activations, pipeline buffers, MoE scratch); the runtime
 * reserve and allocator overhead are left 0 (the planner's assumptions, not holdings). */
int mc_holdings_of(const mc_geometry *g, int rank, const mc_hold_opts *o, int64_t bytes[MC_MEM_COUNT]);

/* Muon's scratch on one rank (category optimizer.scratch; train/optim.c carves it), three
 * tensors sized for the largest Muon family of the rank's stage: the whole matrix X
 * [rows x cols], the gather buffer G of the same size (only when the layout splits some Muon
 * family of the stage: ZeRO over dp > 1, or a TP family under tp > 1) and the Newton-Schulz
 * workspace (mc_muon_ns_work_floats). All 0 where the stage has no Muon family. */
typedef struct {
  int64_t full_floats, gather_floats, work_floats;
  int64_t bytes; /* the three footprints (0 without Muon) */
} mc_muon_scratch;
int mc_muon_scratch_of(const mc_geometry *g, int rank, mc_muon_scratch *out);
/* Where the trainer gathers a Muon family's update direction into the whole matrix, from the
 * layout alone (every rank of a group must agree: the gathers are collective): over the ZeRO
 * group when zero > 0 and dp > 1 (Muon families are dense: the DP group), over TP when the
 * family is TP-split and tp > 1. train/dist_opt.c gathers so; mc_muon_scratch_of holds the
 * gather buffer exactly where either is true. */
void mc_muon_gathers(const mc_layout *l, const mc_family *f, int *over_dp, int *over_tp);
/* Floats of Newton-Schulz workspace for a rows x cols matrix: the Gram matrix A and
 * B = b A + c A A (s x s each, s the smaller side) and the product B X (rows x cols). */
int64_t mc_muon_ns_work_floats(int64_t rows, int64_t cols);

/* ZeRO 3's zero3.buffers (train/zero3.c), in slots each sized for the largest gather set (the
 * embedding, one layer, or the final norm with the head) of this rank: two weight slots (a
 * set's whole local slices of working weights, bf16 for bf16 weights, else fp32, and its
 * gathers' packs: the set in use, and the next one gathered meanwhile on the side queue), one
 * gradient slot (the whole-slice fp32 gradients of the set in a backward) and one reduction
 * slot (the packs of a set's gradient reduce-scatter, in flight while the next set computes;
 * its reduced rows are added into the accumulators from there). Zero everywhere below ZeRO 3. */
typedef struct {
  int64_t weights, grads, reduce; /* bytes of one slot of each kind */
} mc_zero3_slots;
int mc_zero3_slots_of(const mc_geometry *g, int rank, const mc_hold_opts *o, mc_zero3_slots *out);
/* Bytes of the slots together: 2 weight slots, the gradient slot, the reduction slot. */
static inline int64_t mc_zero3_slots_bytes(const mc_zero3_slots *z) { return 2 * z->weights + z->grads + z->reduce; }
/* ZeRO 0 and 1: the once-a-step gradient reduction and (ZeRO 1) weight gather of every
 * parameter go in chunks of whole parameters of at most `chunk` local-slice elements,
 * packed through the dist.staging allocation (train/dist_sync.c): chunk = the larger of
 * MC_DIST_STAGING_CHUNK and the largest local slice of the rank's stage, but no more than
 * the stage's local slices together, or 0 where nothing is packed (ZeRO 3, or every group of
 * one member and no partial sums over TP). Bytes: 2 x chunk x 4 rounded up to MC_MEM_ALIGN,
 * plus 4 alignment units (0 with no chunk). */
#define MC_DIST_STAGING_CHUNK ((int64_t)16 << 20) /* elements: 64 MiB of fp32 */
int mc_dist_staging_chunk(const mc_geometry *g, int rank, const mc_hold_opts *o, int64_t *chunk);
/* A chunk's packs: per group (dp, expert-DP) the slices member-major and this rank's rows, at
 * most 2 x chunk floats (their footprint) with 4 alignment paddings (the partial sums over TP
 * go first, through one pack of at most chunk floats given back before them). */
static inline int64_t mc_dist_staging_bytes_of(int64_t chunk) {
  return chunk ? mc_mem_footprint(2 * chunk * 4) + 4 * MC_MEM_ALIGN : 0;
}
/* The dist.staging allocation: the larger of a chunk's packs and the packs of the largest
 * gather set's gradient reduction (the step's last backward reduces each layer's gradients
 * as the layer's backward ends, one set at a time: train/net.h mc_net_reduce_in_backward);
 * 0 with no chunk. */
int64_t mc_dist_staging_bytes(const mc_geometry *g, int rank, const mc_hold_opts *o);
/* Bytes of the zero3.buffers allocation: 2 weight slots, the gradient slot, the reduction slot. */
int64_t mc_zero3_buffer_bytes(const mc_geometry *g, int rank, const mc_hold_opts *o);

#endif
