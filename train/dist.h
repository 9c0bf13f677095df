/* Data-parallel training around mc_net (docs/parallel.md): gradient synchronisation over the
 * layout's groups, global-norm clipping that counts every element once, the AdamW step on
 * this rank's ZeRO shards (train/optim.h) and the return of updated weights to the working
 * copies; checkpoint items and loading for any layout.
 *
 * One optimizer step on every rank of the layout:
 *   mc_net_zero_grad; for each micro-batch: mc_net_forward_backward (ce_weight = 1/(G*T),
 *   seq_weight = 1/G, G the global batch); mc_dist_sync_grads; mc_dist_grad_norm;
 *   mc_dist_update(lr, mc_clip_scale(norm, clip)).
 * ZeRO 0: gradients all-reduced, every rank updates its whole local slice. ZeRO 1: gradients
 * reduce-scattered, each rank updates its rows (master weights and moments sharded), then the
 * updated rows are all-gathered into the working weights. ZeRO 3: the network already
 * reduce-scattered the gradients per layer; each rank updates its rows and keeps them as its
 * shard of the working weights. */
#ifndef MC_TRAIN_DIST_H
#define MC_TRAIN_DIST_H

#include "ckpt/checkpoint.h"
#include "comm/comm.h"
#include "train/load_shared.h"
#include "train/net.h"
#include "train/optim.h"

typedef struct {
  mc_net *net;
  const mc_geometry *geo;
  const mc_comm_groups *comm; /* NULL for one rank */
  int rank;
  mc_optim opt;               /* slot i's buffers at grads[i] + offset, work[i] + offset */
  float **grads, **work;
  int *param_of_slot;         /* the network parameter of slot i */
  /* Host copies of the states of every slot (MC_N_STATES entries per slot, NULL for a kind
   * the slot's optimizer does not keep), for checkpoints of a
   * backend whose memory is not host memory: pointers into one block of the backend's
   * host_alloc memory (pinned for CUDA), allocated once, at mc_dist_stage_alloc or the first
   * save or load. */
  float **stage;
  void *stage_mem;
} mc_dist_opt;

/* Binds the optimizer slots of `rank` to the network's parameters (on the network's
 * backend). fp32 working weights are their own master copy: a slot's master points at its
 * rows of them and the step updates them in place. bf16 working weights get a separate fp32
 * master, filled from the fp32 initial values (mc_net_param_initial). */
int mc_dist_opt_init(mc_dist_opt *d, mc_net *net, const mc_geometry *geo, const mc_comm_groups *comm, int rank);
void mc_dist_opt_free(mc_dist_opt *d);

/* After the micro-batches of a step: sums partial gradients over TP and reduces over the
 * data-parallel groups (all-reduce for ZeRO 0, this rank's rows for ZeRO 1; nothing left for
 * ZeRO 3). */
int mc_dist_sync_grads(mc_dist_opt *d);
/* Global gradient norm: squares of the elements this rank is primary for, summed over the
 * world (every element exactly once). Call after mc_dist_sync_grads. */
int mc_dist_grad_norm(mc_dist_opt *d, double *norm);
/* AdamW on the rank's shards with the clipping factor, then the working weights. */
int mc_dist_update(mc_dist_opt *d, const mc_train_cfg *t, double lr, double grad_scale);
/* After loading a checkpoint: the bf16 working weights from their masters (rounded), and
 * under ZeRO 1 the all-gather of every member's rows into the whole working slices. */
int mc_dist_publish(mc_dist_opt *d);

/* Sums the statistics of a micro-batch or step over the data-parallel group (TP ranks hold
 * equal statistics already), then the cross-entropy, aux and dropped sums over the pipeline
 * group (each stage holds its own terms: the loss on the last stage, aux where E blocks are),
 * so every rank reports the global figures. */
int mc_dist_stats_sum(const mc_comm_groups *comm, mc_net_stats *st);

/* Checkpoint items of this rank in host memory: master, exp_avg, exp_avg_sq of every slot
 * that this rank is primary for (mc_shard_of; the save writes nothing else). On a host
 * backend they are the states themselves; otherwise snapshot copies into the staging are
 * queued (kernels/ops.h snap_*) and the call returns at once: the copies see the state as of
 * the work queued so far, run beside the work queued next (the next optimizer step waits for
 * them: mc_optim_step fences), and are complete once mc_dist_stage_ready returns. They stay
 * valid until the next call. items needs room for 3 * d->opt.n. Returns the count, or -1
 * with mc_error set. */
int mc_dist_ckpt_items(mc_dist_opt *d, mc_ckpt_item *items);
/* Allocates the host staging of the optimizer state now (nothing for a host backend), so
 * the first checkpoint does not pay for it: 0, or -1 with mc_error. */
int mc_dist_stage_alloc(mc_dist_opt *d);
/* The staged copies of the last mc_dist_ckpt_items are complete (blocks the calling thread,
 * which may be the checkpoint thread): 0, or -1 with mc_error. `user` is the mc_dist_opt. */
int mc_dist_stage_ready(void *user);
/* Reads this rank's shards of the three states from a checkpoint written under any layout
 * and publishes the weights. Collective over the world: the ranks load together
 * (train/load_shared.h: each needed stored byte read and hash-verified once in the job, then
 * handed to the ranks that need it), into the states themselves on the CPU, else into host
 * copies that are uploaded (in a one-rank job each as soon as it is complete, while the rest
 * is read: the reads run on a thread of their own). opts and stats may be NULL. */
int mc_dist_load(mc_dist_opt *d, mc_ckpt *ck, const mc_load_opts *opts, mc_load_stats *stats);
/* A barrier callback for mc_ckpt_save over the world communicator (user = the mc_comm). */
int mc_dist_ckpt_barrier(void *user, int ok);

#endif
