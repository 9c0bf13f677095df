/* The parallel context of one rank's network (net->par): how the layout splits the model's
 * sequences, vocabulary and gradients over the ranks, the communicator groups, and the
 * staging buffers the collectives move rows through. The network (train/net_blocks.h) is the
 * single-rank computation; everything that only exists because other ranks hold the rest
 * lives here, and the functions below take it with what else they touch. Without TP (tp = 1)
 * the TP/SP functions do nothing or are not called; without ZeRO 3 the zero3 ones do nothing. */
#ifndef MC_TRAIN_NET_PAR_H
#define MC_TRAIN_NET_PAR_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/holdings.h"
#include "kernels/ops.h"
#include "train/arena.h"
#include "train/net.h"

/* How one parameter's gradient is combined across ranks and where its ZeRO part lives
 * (train/dist_sync.c). */
typedef struct {
  mc_comm *group;   /* the ZeRO/data-parallel group of the family: dp, or edp for experts */
  int64_t *counts;  /* elements of the local slice held by each member of group */
  int tp_sum;       /* the gradient is partial over TP (mc_family.tp_partial_grad) */
  int contribute;   /* 0: an identical copy is contributed by TP rank 0 (experts without SP) */
  float *g_acc;     /* ZeRO 3: the gradient shard while a backward uses a whole-slice buffer */
  int reduced;      /* ZeRO 0/1: reduced in this step's last backward (mc_dist_reduce_set) */
} mc_dist_param;

typedef struct {
  const mc_comm_groups *comm; /* NULL: one rank */
  int tp, tp_rank, sp, zero;
  int ep;              /* expert-parallel group size (train/dist_ep.c); 1: every expert local */
  int T;               /* positions per sequence (the model's seq_len) */
  int T_res;           /* positions per sequence in the residual stream: T, or T/tp under SP */
  int moe_T;           /* positions per sequence an E block routes: T_res, or T when SP with
                          capacity makes it gather whole sequences (train/net.c) */
  int v0, Vl, Vpl;     /* vocab rows [v0, v0 + Vpl) of embed/head are local, Vl of them real */
  mc_dist_param *dist; /* [n_params], parallel to the network's params */
  /* Staging rows in the activations arena (placed with the network's buffers, NULL where the
   * layout needs none: core/holdings.h mc_net_bufs). */
  float *ush;          /* [nl, d] a sequence shard (SP) */
  float *ufull;        /* [n, d] SP: a layer's normed input gathered for its block */
  int32_t *emb_tok, *emb_slot; /* vocab-parallel embedding: local ids of in-range tokens, */
  float *emb_rows, *emb_gate; /* their rows, unit gates; slot = row or -1 */
  int emb_cnt;
  /* Host side of the vocab-parallel cross-entropy (TP only): the global log-normaliser and
   * the targets of the last forward. */
  float *lse_host;     /* [n] */
  int32_t *tgt_host;   /* [n] */
  struct mc_ep_state *ep_state; /* ep > 1: the E layers' exchange plans and saved expert rows,
                                   one set per pipeline micro-batch slot, in the moe.scratch
                                   arena (train/dist_ep.c, mc_ep_reserve) */
  int64_t ep_peak_rows; /* the most rows one exchange of this rank sent or received so far */
  struct mc_zero3 *zero3; /* ZeRO 3's slots and jobs in flight (train/zero3.c); NULL below ZeRO 3 */
  struct mc_dist_job *set_reduce; /* ZeRO 0/1: the reduction of the set released last, in flight */
  int64_t n_set_reduce;           /* mc_dist_reduce_set calls so far (a count for tests) */
} mc_net_par;

/* Before a collective reads what the backend computed, and after it wrote what the backend
 * reads next: a stream-ordered communicator (comm/comm.h) is ordered with the backend's work
 * already, anything else needs the backend's queue finished. */
static inline int mc_dist_settle(const mc_comm *group, mc_backend *be) {
  return mc_comm_ordered(group) ? 0 : be->sync(be);
}

/* ---- tensor / sequence parallel pieces (train/dist_tp.c); each returns 0 or -1. The
 * collectives first finish the backend's queued work on their buffers. */
/* Sum over the TP group, in place (nothing when tp = 1). */
int mc_tp_allreduce(const mc_net_par *par, mc_backend *be, float *buf, int64_t count);
/* SP: the TP members' sequence shards [n_seq * T/tp, d] -> the token-major rows [n_seq * T, d],
 * fp32, or bf16 where b16 (a layer's u16, the final norm's bf16 output under mc_act16). */
int mc_sp_gather(const mc_net_par *par, mc_backend *be, const void *shard, void *full, int n_seq, int d, int b16);
/* SP: sums full rows [n_seq * T, d] over TP and keeps this rank's sequence shard. */
int mc_sp_reduce_scatter(const mc_net_par *par, mc_backend *be, const float *full, float *shard, int n_seq, int d);
/* SP, no communication: this rank's shard rows of full rows (take), or full rows that are
 * zero outside this rank's shard (place). */
void mc_sp_take(const mc_net_par *par, mc_backend *be, const float *full, float *shard, int n_seq, int d);
void mc_sp_place(const mc_net_par *par, mc_backend *be, const float *shard, float *full, int n_seq, int d);
/* Vocab-parallel embedding of n tokens (host ids) with this rank's rows of the embedding
 * (embed_w): rows [n, d] gets the rows of the local tokens and zero elsewhere (the caller's
 * sum over TP completes them); backward from the full-row gradient into embed_g. */
int mc_vp_embed_fwd(mc_net_par *par, mc_backend *be, const float *embed_w, const int32_t *tok_host, int n, int d,
                    float *rows);
int mc_vp_embed_bwd(const mc_net_par *par, mc_backend *be, const float *dfull, int n, int d, float *embed_g);
/* Vocab-parallel cross-entropy over the local logits [n, Vpl] (backend memory): loss_host[r]
 * and the global log-normaliser, left in lse_dev [n] for the backward, which writes dlogits
 * = scale * (softmax - onehot), zero on padding (bf16 under mc_act16: it feeds only the
 * head's products). tgt_dev [n] and loss_dev [n] are backend
 * scratch (the network's target and loss rows). */
int mc_vp_xent_fwd(mc_net_par *par, mc_backend *be, const float *logits, const int32_t *tgt_host, int n,
                   int32_t *tgt_dev, float *loss_dev, float *lse_dev, float *loss_host);
int mc_vp_xent_bwd(const mc_net_par *par, mc_backend *be, const float *logits, int n, float scale, int32_t *tgt_dev,
                   const float *lse_dev, mc_dst dlogits);
/* MoE under SP: replaces the shard's routing fractions fr [n_seq, E] with the sequence's (TP
 * mean: every shard has T/tp positions) on the device, sums pbar [n_seq, E] (the shard's mean
 * probabilities, moe_route's) over TP in place, and sets aux_host [n_seq] = E sum_e f_e P_e
 * with P the TP mean of pbar. */
int mc_sp_moe_aux(const mc_net_par *par, mc_backend *be, int E, float *fr, float *pbar, int n_seq, float *aux_host);

/* ---- expert parallelism (train/dist_ep.c), ep > 1. mc_ep_reserve places every EP buffer
 * in the moe.scratch arena for micro-batches of n_seq sequences and n_slots activation slots,
 * sized by the holdings (core/holdings.h mc_stage_hold: the most rows the routing rule lets
 * one exchange move); mc_ep_free drops the routes (the arena owns the buffers). An E layer's
 * exchange of one forward: mc_ep_plan exchanges the per-expert row counts of the rank's
 * expert-sorted buffer (counts [E], peer-major since EP rank j owns experts
 * [j*E/ep, (j+1)*E/ep)) over the ep group, and fails naming the layer if the rows exceed the
 * reserved bound (a bug in the bound); mc_ep_dispatch sends the local expert-sorted rows
 * (width d, bf16 where b16 = 1, else fp32) to their owners, where they land expert-major in em
 * (the rows of local expert e from source 0, 1, ...); mc_ep_combine is its reverse. Under mc_act16 the rows the expert products
 * read go as bf16: the input rows and the output rows' gradient; the saved input, h1, h3 and
 * SwiGLU output and the backward's da, dh1, dh3 are bf16, as on one rank; the products'
 * fp32 outputs (expert outputs, input-row gradients) come back in fp32. */
struct mc_ep_route;
int mc_ep_reserve(mc_net *net, int n_seq, int n_slots);
void mc_ep_free(mc_net_par *par);
/* The route of layer `layer` for the micro-batch in activation slot `slot` (net->cur_slot under
 * pipeline slots, else 0): each micro-batch in flight keeps its own, the scratch is shared. */
struct mc_ep_route *mc_ep_route_of(mc_net_par *par, int n_layers, int layer, int slot);
int mc_ep_plan(mc_net_par *par, struct mc_ep_route *r, const int32_t *counts, int E);
int64_t mc_ep_rows(const struct mc_ep_route *r);          /* rows received (R) */
const int32_t *mc_ep_counts(const struct mc_ep_route *r); /* [E/ep] rows per local expert */
/* The layer's saved rows: 0 the received input [R, d], 1 h1, 2 h3, 3 the SwiGLU output [R, F]
 * (bf16 under mc_act16). */
float *mc_ep_saved(struct mc_ep_route *r, int which);
/* The shared scratch (NULL outputs are not wanted): a (bf16 under mc_act16) and b (fp32)
 * [rows, d], da, dh1, dh3 [rows, F] (bf16 under mc_act16), rows the reserved bound. */
int mc_ep_scratch(mc_net_par *par, float **a, float **b, float **da, float **dh1, float **dh3);
int mc_ep_dispatch(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *local, float *em,
                   int d, int b16, const char *what);
int mc_ep_combine(const mc_net_par *par, mc_backend *be, const struct mc_ep_route *r, const float *em, float *local,
                  int d, int b16, const char *what);

/* ---- gradient combination and ZeRO (train/dist_sync.c), over the network's params. The
 * collectives move rows through packs: carved from `stage` (ZeRO 3's slots of zero3.buffers,
 * sized for them by core/holdings.h mc_zero3_slots_of; the caller empties the arena) or, with
 * stage NULL, allocated from the backend for the call. */
/* Fills par->dist[0..n_params) (par->dist allocated by the caller) from the layout. */
int mc_dist_setup(mc_net_par *par, const mc_geometry *geo, int rank, const mc_net_param *params, int n_params);
void mc_dist_free(mc_net_par *par, int n_params);
/* Combines the local-slice gradients g[k] of params idx[k] over the ranks holding pieces of
 * them: zero 0 leaves the sums in g[k]; otherwise this rank's ZeRO part of each sum goes to
 * out[k] (z_numel elements; g[k] is clobbered; out[k] may be g[k] + z_off), written, or
 * added to what out[k] holds with add = 1 (ZeRO 3's accumulators). */
int mc_dist_reduce_grads(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *g, float *const *out, int add);
/* Puts each member's rows shard[k] (z_numel elements, this rank's) of params idx[k] into
 * the whole local slices full[k], over the params' groups (shard[k] may be full[k] + z_off). */
int mc_dist_gather(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                   int n, float *const *shard, float *const *full);
/* The two above in two halves (and a gather into bf16 slices full[k] with bf16 = 1: each
 * rank rounds its fp32 rows to bf16 and the bf16 rows are gathered, half the bytes of an
 * fp32 gather, the values of the gathered fp32 slice rounded): _start writes the packs on
 * the backend and queues the collectives (on the side queue with side = 1, comm/comm.h, so
 * they run while the backend
 * computes what is queued next; their inputs must not change until then), and
 * mc_dist_job_finish waits for them (on the compute stream) and puts the results in place
 * (g or out; the slices full, bf16 ones with bf16 = 1), then frees the job (NULL: nothing).
 * Until the finish the results' destinations must not be read, and the packs stay carved. */
typedef struct mc_dist_job mc_dist_job;
int mc_dist_reduce_start(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *g, float *const *out, int add, int side, mc_dist_job **job);
int mc_dist_gather_start(const mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params,
                         const int *idx, int n, float *const *shard, void *const *full, int bf16, int side,
                         mc_dist_job **job);
int mc_dist_job_finish(mc_dist_job *job);
/* Frees a job without finishing it (after a failure: its results are not wanted). */
void mc_dist_job_drop(mc_dist_job *job);
/* ZeRO 0/1's once-a-step reduction (written, as mc_dist_reduce_grads with add = 0) and
 * gather (fp32, or bf16 slices with bf16 = 1) of many params, one chunk of whole params of at
 * most `chunk` local-slice elements after another, each packed through `stage` (emptied per
 * chunk: the dist.staging arena, core/holdings.h mc_dist_staging_chunk). */
int mc_dist_reduce_chunked(const mc_net_par *par, mc_backend *be, mc_arena *stage, int64_t chunk,
                           const mc_net_param *params, const int *idx, int n, float *const *g, float *const *out);
int mc_dist_gather_chunked(const mc_net_par *par, mc_backend *be, mc_arena *stage, int64_t chunk,
                           const mc_net_param *params, const int *idx, int n, float *const *shard, void *const *full,
                           int bf16);

/* ZeRO 0/1 in the step's last backward (mc_net_reduce_in_backward): once a gather set's
 * backward ends its gradients are final on this rank, and their reduction (as
 * mc_dist_reduce_grads with add = 0: g[k] = p->g, out[k] = p->g + z_off) starts on the side
 * queue, to run during the next set's backward. mc_dist_reduce_set first finishes the set
 * before (mc_dist_reduce_flush): both carve `stage` from its start (the dist.staging arena,
 * sized for the largest set by core/holdings.h mc_dist_staging_bytes). Each param it reduces
 * is marked (mc_dist_param.reduced), so that mc_dist_sync_grads reduces only the rest. */
int mc_dist_reduce_set(mc_net_par *par, mc_backend *be, mc_arena *stage, const mc_net_param *params, const int *idx,
                       int n);
int mc_dist_reduce_flush(mc_net_par *par);

/* ---- ZeRO 3's layer-by-layer working weights (train/zero3.c). A pass (a forward or a
 * backward of one micro-batch on this stage) takes its gather sets in order: the embedding,
 * each layer, the final norm with the head (reversed in a backward). mc_zero3_acquire makes
 * the set's working weights (a param with compute_bf16 gets w16, gathered in bf16, and no w)
 * and, in a backward, zeroed whole-slice gradients in place of the accumulators; it then
 * starts gathering the next set `next` (n_next params; 0: none) on the side queue, so that
 * gather runs during this set's compute. mc_zero3_release gives the set up; after a
 * backward it starts the reduce-scatter of the set's gradients on the side queue, whose rows
 * are added into the accumulators (mc_dist_param.g_acc, back in p->g on return) at the next
 * release or at mc_zero3_flush, which ends every pass. The buffers live in slots of
 * zero3.buffers (core/holdings.h mc_zero3_slots). Nothing below ZeRO 3. */
struct mc_zero3;
int mc_zero3_open(mc_net_par *par, mc_arena *bufs, const mc_zero3_slots *slots);
void mc_zero3_close(mc_net_par *par);
int mc_zero3_acquire(mc_net_par *par, mc_backend *be, mc_net_param *params, const int *idx, int n, int for_backward,
                     const int *next, int n_next);
int mc_zero3_release(mc_net_par *par, mc_backend *be, mc_net_param *params, const int *idx, int n, int after_backward);
int mc_zero3_flush(mc_net_par *par);

#endif
