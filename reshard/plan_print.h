/* The reshard plan as text (mcreshard --dry-run) or JSON (--dry-run --json). */
#ifndef MC_RESHARD_PLAN_PRINT_H
#define MC_RESHARD_PLAN_PRINT_H

#include <stdio.h>

#include "reshard/plan.h"

/* "tp=2 pp=2 dp=1 ep=1 sp=0 zero=1 split=AEME|AEMR" */
void mc_rs_layout_format(const mc_layout *l, char *buf, int cap);
/* {"tp", "pp", "dp", "ep", "sp", "zero", "pp_split", "world"} of a geometry (a cJSON *). */
struct cJSON;
struct cJSON *mc_rs_layout_json(const mc_geometry *g);

/* What writing a checkpoint costs, from metadata alone: its shards, rank files (ranks that
 * write something), bytes, the manifest's size (about: its shard records as the manifest
 * prints them), the writer balance (the largest rank's bytes over the mean over every rank of
 * the world) and the predicted save time when each node of `ranks_per_node` consecutive ranks
 * writes at `node_gbps` GB/s: the slowest node's bytes over that bandwidth. */
typedef struct {
  int64_t shards, bytes, manifest_bytes;
  int world, files, largest_rank;
  int64_t largest_bytes, slowest_node_bytes;
  double writer_balance, node_gbps, predicted_save_s;
  int ranks_per_node;
} mc_rs_forecast;

/* Bytes of one shard record as the manifest prints it, for a shard of `ndim` dims held by
 * `nrep` replicas (an estimate within a few bytes: keys, values, separators). */
int64_t mc_rs_record_bytes(const char *family, const char *state, int rank, int ndim, const int64_t *start,
                           const int64_t *count, int nrep);
/* Fills the balance and the predicted save time of f from bytes[r] (what rank r writes, world
 * ranks), node_gbps > 0 and ranks_per_node >= 1; f's shards and manifest_bytes are left. */
void mc_rs_forecast_finish(const int64_t *bytes, int world, double node_gbps, int ranks_per_node, mc_rs_forecast *f);
/* The forecast of the target checkpoint a plan writes (geometry dst). */
int mc_rs_plan_forecast(const mc_rs_plan *p, const mc_geometry *dst, double node_gbps, int ranks_per_node,
                        mc_rs_forecast *f);
/* "target checkpoint: ..." lines (what names the checkpoint). */
void mc_rs_forecast_print(FILE *out, const mc_rs_forecast *f, const char *what);

/* Every target shard and its pieces (targets = 0: left out), then the totals. */
void mc_rs_plan_print(FILE *f, const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst, int targets);
/* "element dtypes: param float32, exp_avg float32 -> bfloat16, ..." (each kind the plan moves,
 * its source dtype and, where it is converted, the target's), only when some is not float32. */
void mc_rs_plan_print_dtypes(FILE *f, const mc_rs_plan *p);
/* Malloc'd JSON text; NULL (with the error set) on failure. targets = 0 leaves the per-target
 * list out (totals only); fc (may be NULL) adds a "forecast" object; "dtypes" gives each kind
 * the plan moves its {"source", "target"} element dtype. */
char *mc_rs_plan_json(const mc_rs_plan *p, const mc_geometry *src, const mc_geometry *dst, int targets,
                      const mc_rs_forecast *fc);

#endif
