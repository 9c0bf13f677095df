/* The training metrics log (JSON Lines, one object per logged step) and the loss-curve SVG
 * drawn from it. Losses are written with 17 significant digits so that two runs can be
 * compared exactly (the bit-exact resume test does). */
#ifndef MC_TRAIN_METRICS_H
#define MC_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
  int64_t step;        /* optimizer steps done */
  double loss;         /* mean token cross-entropy of the step's global batch */
  double aux_loss;     /* mean per-sequence aux loss (coefficient included) */
  double lr;
  double grad_norm;    /* before clipping */
  int64_t tokens;      /* tokens consumed so far */
  double tokens_per_s;
  int has_val;
  double val_loss;
  double time;    /* wall clock, Unix seconds */
  int has_comm;   /* a multi-rank run: */
  double comm_s;  /* rank 0's seconds per step inside collectives and pipeline sends/receives */
} mc_metrics_rec;

typedef struct {
  FILE *f;
  char path[1024];
} mc_metrics;

/* Opens the log. keep_through < 0 starts a new log; otherwise the records with
 * step <= keep_through are kept (a resumed run continues the log of the run it resumes). */
int mc_metrics_open(mc_metrics *m, const char *path, int64_t keep_through);
int mc_metrics_write(mc_metrics *m, const mc_metrics_rec *r);
void mc_metrics_close(mc_metrics *m);

/* Draws train loss (and validation loss where logged) against step from a metrics log. */
int mc_metrics_svg(const char *jsonl_path, const char *svg_path, const char *title);

#endif
