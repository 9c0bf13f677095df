/* The training metrics log (JSON Lines, one object per logged step), its CSV copy and the
 * loss-curve SVG drawn from it. Losses are written with 17 significant digits so that two
 * runs can be compared exactly (the bit-exact resume test does).
 *
 * The CSV (metrics.csv beside metrics.jsonl; <path>.csv for another name) has one fixed
 * header, MC_METRICS_CSV_COLUMNS, and one row per step record and per checkpoint record of
 * the log, each cell the JSON value's text, empty where the record has no such value; it is
 * rebuilt from the log when the log is opened (so a resumed run's CSV matches its log) and
 * appended to with every record. */
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
  int has_flops;        /* the model's FLOPs are known: */
  double model_tflops;  /* model training FLOP/s per device / 1e12 (mc_model_train_flops_per_token x tokens/s / world) */
  int has_mfu;          /* a peak was given (mctrain --peak-tflops): */
  double mfu;           /* model_tflops / the peak per device */
} mc_metrics_rec;

/* One checkpoint: a record {"checkpoint": step, "paused_s", "save_s", "async", "time"} (no
 * "step" key: step records stay what they were). */
typedef struct {
  int64_t step;
  double paused_s; /* training blocked by the save (async: the copy and any wait for the previous save) */
  double save_s;   /* the whole save, queued to committed (sync: = paused_s) */
  int async;
  double time;     /* wall clock when the save was seen committed, Unix seconds */
} mc_metrics_ckpt;

#define MC_METRICS_CSV_COLUMNS \
  "step,time,loss,aux_loss,val_loss,lr,grad_norm,tokens,tokens_per_s,model_tflops,mfu,comm_s,ckpt_paused_s,ckpt_save_s"

typedef struct {
  FILE *f;
  FILE *csv;
  char path[1024];
  char csv_path[1100];
} mc_metrics;

/* Opens the log. keep_through < 0 starts a new log; otherwise the records with
 * step <= keep_through are kept (a resumed run continues the log of the run it resumes). */
int mc_metrics_open(mc_metrics *m, const char *path, int64_t keep_through);
int mc_metrics_write(mc_metrics *m, const mc_metrics_rec *r);
int mc_metrics_checkpoint(mc_metrics *m, const mc_metrics_ckpt *c);
void mc_metrics_close(mc_metrics *m);

/* The CSV path that goes with a metrics log: X.jsonl -> X.csv, else X + ".csv". */
void mc_metrics_csv_path(const char *jsonl_path, char *out, size_t cap);
/* Writes the CSV of a metrics log (header and every step and checkpoint record) to csv_path,
 * through a temporary file renamed into place. */
int mc_metrics_csv(const char *jsonl_path, const char *csv_path);

/* Draws train loss, validation loss (where logged) and the learning rate (right-hand axis)
 * against step from a metrics log. */
int mc_metrics_svg(const char *jsonl_path, const char *svg_path, const char *title);

#endif
