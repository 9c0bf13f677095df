/* The training loop: data -> network -> clipping -> AdamW -> metrics, validation and
 * checkpoints, with bit-exact resume (docs/training.md). Under mpirun every rank of the
 * layout runs it (tensor/sequence/data parallel, ZeRO 0/1/3; docs/parallel.md): each takes
 * its part of the global batch, and rank 0 alone logs, prints and commits checkpoints. */
#ifndef MC_TRAIN_TRAINER_H
#define MC_TRAIN_TRAINER_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "comm/comm.h"
#include "train/data.h"
#include "train/net.h"

typedef struct {
  const char *resume; /* NULL, "latest" (the run's checkpoint.dir) or a checkpoint directory */
  int64_t until;      /* stop after this many steps (<= 0: train.steps); the schedule still
                         spans train.steps, so stopping and resuming changes nothing */
  FILE *progress;     /* progress lines; NULL = none */
  int progress_tty;   /* rewrite one line with \r instead of printing lines */
  /* When *stop becomes non-zero (a signal handler sets it), the run ends after the step in
   * progress, saves a checkpoint of that step and returns 0 with `stopped` set to 1. */
  volatile sig_atomic_t *stop;
  int stopped;
  int stop_signal; /* when stopped: the value *stop held (the largest over the ranks) */
  /* The world of a multi-process run: MPI (mc_comm_mpi_init) for train.device=cpu, NCCL
   * (mc_comm_nccl_init) for cuda; NULL for one process. Its size must equal tp*dp*pp of
   * cfg->parallel. Pass progress = NULL on ranks other than 0. */
  mc_comm *world;
  int gpu; /* the CUDA device of this process (its local rank) when train.device=cuda */
  /* mcplan's prediction for rank 0 under this config (mc_plan_build's bytes per category),
   * or NULL. When set, rank 0 prints the memory report after step 1 of a run that starts at
   * step 0 (train/memreport.h) to progress and writes it to the metrics log. */
  const int64_t *mem_predicted;
  /* The peak FLOP/s of one device, in TFLOP/s (mctrain --peak-tflops); > 0: every logged
   * record carries mfu = model_tflops / peak_tflops. */
  double peak_tflops;
} mc_trainer_opts;

/* Runs (or continues) the training described by cfg. Returns 0, or -1 with mc_errmsg set. */
int mc_train(const mc_config *cfg, mc_trainer_opts *opts);

/* Mean token cross-entropy of the network over n windows of d evenly spread through the
 * validation split (split_all = 0) or the whole file (split_all = 1): sequence k is window
 * floor(k * size / n) of the split, evaluated in order in micro-batches of micro_batch
 * sequences; n <= 0 or n > size means every window. The trainer's val_loss and mceval both
 * come from here. */
int mc_eval_loss(mc_net *net, const mc_data *d, int split_all, int64_t n, int micro_batch,
                 double *loss, int64_t *tokens);

/* Loads the network's working weights (each parameter's TP/EP-local slice) from the
 * param state of a checkpoint, whatever layout wrote it. */
int mc_net_load(mc_net *net, const mc_geometry *geo, mc_ckpt *ck);

#endif
