/* sim_scale: planning a job past the machines at hand, from metadata alone (no data written).
 *
 *   sim_scale [--config FILE] [--set k=v]... [--to tp,pp,dp,ep,sp,zero] [--node-gbps G]
 *             [--ranks-per-node R] [--write-metadata DIR]
 *
 * For the configuration's layout (e.g. nam-medium on 4096 ranks) and a reshard target (--to),
 * times what the offline tools do and reports what a checkpoint of that run would be:
 *   - geometry and ownership: mc_geometry_build and mc_geometry_of_config for the two layouts
 *     (the target keeps the configuration's optimizer groups);
 *   - mcplan's work: mc_plan_build (every rank's holdings);
 *   - mcreshard --dry-run's work: mc_rs_plan_build (the source and target primaries of every
 *     family and state, and the pieces between them);
 *   - the checkpoint: rank files (ranks that are primary for something), shards, bytes, the
 *     writer balance (largest / mean bytes a rank writes, core/holdings.h's state view), the
 *     manifest's size (its shard records as the manifest writes them: family, state, rank,
 *     file, dataset, start/count, replicas, sha256), and the predicted save time when each
 *     node writes its ranks' bytes at --node-gbps (GB/s, default 2) with --ranks-per-node
 *     ranks (default 8): the slowest node's bytes / bandwidth.
 * With --write-metadata DIR it also writes that checkpoint without data into DIR
 * (mc_ckpt_write_metadata_only: manifest.json, manifest.sha256, latest; no rank file), for
 * `mcreshard --dry-run DIR DST ...` to plan from, and reports the real manifest's size.
 * Prints one text report and one JSON line. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/checkpoint.h"
#include "core/holdings.h"
#include "core/layout.h"
#include "core/optim_groups.h"
#include "plan/plan.h"
#include "reshard/plan.h"
#include "reshard/plan_print.h"
#include "util/error.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  double node_gbps = 2.0;
  int per_node = 8, to[6] = {-1, -1, -1, -1, -1, -1};
  const char *write_dir = NULL;
  mc_config cfg;
  if (mc_config_from_args(&cfg, &argc, argv) != 0) {
    fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--node-gbps") && i + 1 < argc) node_gbps = atof(argv[++i]);
    else if (!strcmp(argv[i], "--ranks-per-node") && i + 1 < argc) per_node = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--write-metadata") && i + 1 < argc) write_dir = argv[++i];
    else if (!strcmp(argv[i], "--to") && i + 1 < argc &&
             sscanf(argv[++i], "%d,%d,%d,%d,%d,%d", &to[0], &to[1], &to[2], &to[3], &to[4], &to[5]) == 6) {
    } else {
      fprintf(stderr, "usage: sim_scale [--config FILE] [--set k=v]... [--to tp,pp,dp,ep,sp,zero] [--node-gbps G] "
                      "[--ranks-per-node R] [--write-metadata DIR]\n");
      return 2;
    }
  }
  if (node_gbps <= 0 || per_node < 1) {
    fprintf(stderr, "sim_scale: --node-gbps must be > 0 and --ranks-per-node >= 1\n");
    return 2;
  }
  double t0 = now_s();
  mc_geometry g, h;
  if (mc_geometry_build(&cfg.model, &cfg.parallel, &cfg.train, -1, &g) != 0) {
    fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
    return 1;
  }
  mc_layout tl = cfg.parallel;
  if (to[0] > 0) tl.tp = to[0], tl.pp = to[1], tl.dp = to[2], tl.ep = to[3], tl.sp = to[4], tl.zero = to[5];
  if (mc_geometry_of_config(&cfg, &tl, &h) != 0) { /* a reshard keeps the optimizer groups */
    fprintf(stderr, "sim_scale: target layout: %s\n", mc_errmsg());
    return 1;
  }
  double t_geo = now_s() - t0;

  t0 = now_s();
  mc_plan_opts po;
  mc_plan_opts_default(&po);
  mc_plan plan;
  if (mc_plan_build(&g, &cfg.train, &po, &plan) != 0) {
    fprintf(stderr, "sim_scale: plan: %s\n", mc_errmsg());
    return 1;
  }
  double t_plan = now_s() - t0;

  /* what each rank writes and the manifest's shard records */
  t0 = now_s();
  const mc_hold_opts ho = {.moe_dense = 1};
  int64_t *wrote = calloc((size_t)g.world, sizeof *wrote), shards = 0, manifest = 0;
  for (int f = 0; f < g.fams.n && wrote; f++)
    for (int r = 0; r < g.world; r++) {
      mc_param_hold ph;
      if (mc_param_hold_of(&g, f, r, &ho, &ph) != 0) {
        fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
        return 1;
      }
      for (int st = 0; ph.in_stage && st < MC_N_STATES; st++) {
        if (!ph.state_primary[st] || !mc_family_has_state(&g.fams.f[f], (mc_state)st)) continue;
        mc_shard s;
        mc_shard_of(&g, f, (mc_state)st, r, &s);
        wrote[r] += ph.state_bytes[st];
        shards++;
        manifest += mc_rs_record_bytes(g.fams.f[f].name, mc_state_name((mc_state)st), r, s.ndim, s.start, s.count,
                                       s.n_replicas);
      }
    }
  if (!wrote) return 1;
  mc_rs_forecast fc = {.shards = shards, .manifest_bytes = manifest};
  mc_rs_forecast_finish(wrote, g.world, node_gbps, per_node, &fc);
  double t_ckpt = now_s() - t0;

  double t_write = 0;
  long long written_manifest = -1;
  if (write_dir) {
    t0 = now_s();
    mc_train_state ts;
    memset(&ts, 0, sizeof ts);
    mc_config wc = cfg;
    char mp[4200];
    FILE *mf;
    if (mc_ckpt_write_metadata_only(write_dir, &g, &wc, &ts) != 0) {
      fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
      return 1;
    }
    snprintf(mp, sizeof mp, "%s/step_0/manifest.json", write_dir);
    if ((mf = fopen(mp, "rb")) != NULL && fseek(mf, 0, SEEK_END) == 0) written_manifest = ftell(mf);
    if (mf) fclose(mf);
    t_write = now_s() - t0;
  }

  t0 = now_s();
  mc_rs_plan rp;
  if (mc_rs_plan_build(&g, &h, MC_RS_ALL_STATES, &rp) != 0) {
    fprintf(stderr, "sim_scale: reshard plan: %s\n", mc_errmsg());
    return 1;
  }
  double t_rs = now_s() - t0;

  printf("layout tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d: %d ranks; target tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d: %d ranks\n",
         g.layout.tp, g.layout.pp, g.layout.dp, g.layout.ep, g.layout.sp, g.layout.zero, g.world, tl.tp, tl.pp, tl.dp,
         tl.ep, tl.sp, tl.zero, h.world);
  printf("geometries %.2f s, mcplan's plan %.2f s, checkpoint metadata %.2f s, reshard plan (mcreshard --dry-run) %.2f s\n",
         t_geo, t_plan, t_ckpt, t_rs);
  mc_rs_forecast_print(stdout, &fc, "checkpoint");
  if (write_dir)
    printf("metadata-only checkpoint written to %s in %.2f s: manifest.json %lld bytes (%.1f MiB)\n", write_dir, t_write,
           written_manifest, (double)written_manifest / (1 << 20));
  printf("reshard: %d source and %d target shards, %d pieces, %d and %d writers\n", rp.n_src, rp.n_targets, rp.n_pieces,
         rp.n_src_writers, rp.n_dst_writers);
  printf("{\"ranks\": %d, \"target_ranks\": %d, \"t_geometry_s\": %.3f, \"t_mcplan_s\": %.3f, \"t_metadata_s\": %.3f, "
         "\"t_reshard_plan_s\": %.3f, \"bytes\": %lld, \"shards\": %lld, \"files\": %d, \"manifest_bytes\": %lld, "
         "\"writer_largest_over_mean\": %.4f, \"node_gbps\": %.3f, \"ranks_per_node\": %d, \"predicted_save_s\": %.3f, "
         "\"reshard_pieces\": %d, \"t_write_metadata_s\": %.3f, \"written_manifest_bytes\": %lld}\n",
         g.world, h.world, t_geo, t_plan, t_ckpt, t_rs, (long long)fc.bytes, (long long)fc.shards, fc.files,
         (long long)fc.manifest_bytes, fc.writer_balance, node_gbps, per_node, fc.predicted_save_s, rp.n_pieces, t_write,
         written_manifest);
  mc_rs_plan_free(&rp);
  mc_plan_free(&plan);
  free(wrote);
  mc_geometry_free(&g);
  mc_geometry_free(&h);
  return 0;
}
