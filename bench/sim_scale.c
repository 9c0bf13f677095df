/* sim_scale: planning a job past the machines at hand, from metadata alone (no data written).
 *
 *   sim_scale [--config FILE] [--set k=v]... [--to tp,pp,dp,ep,sp,zero] [--node-gbps G]
 *             [--ranks-per-node R]
 *
 * For the configuration's layout (e.g. nam-medium on 4096 ranks) and a reshard target (--to),
 * times what the offline tools do and reports what a checkpoint of that run would be:
 *   - geometry and ownership: mc_geometry_build for both layouts;
 *   - mcplan's work: mc_plan_build (every rank's holdings);
 *   - mcreshard --dry-run's work: mc_rs_plan_build (the source and target primaries of every
 *     family and state, and the pieces between them);
 *   - the checkpoint: rank files (ranks that are primary for something), shards, bytes, the
 *     writer balance (largest / mean bytes a rank writes, core/holdings.h's state view), the
 *     manifest's size (its shard records as the manifest writes them: family, state, rank,
 *     file, dataset, start/count, replicas, sha256), and the predicted save time when each
 *     node writes its ranks' bytes at --node-gbps (GB/s, default 2) with --ranks-per-node
 *     ranks (default 8): the slowest node's bytes / bandwidth.
 * Prints one text report and one JSON line. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/holdings.h"
#include "core/layout.h"
#include "plan/plan.h"
#include "reshard/plan.h"
#include "util/error.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of one shard record as the manifest prints it (keys and values, formatted), for a
 * shard of `ndim` dims held by `nrep` replicas. */
static int64_t record_bytes(const char *fam, const char *state, int rank, int ndim, const int64_t *start,
                            const int64_t *count, int nrep) {
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "{\"family\": \"%s\", \"state\": \"%s\", \"rank\": %d, \"file\": \"rank_%d.h5\", "
                   "\"dataset\": \"/%s/%s\", \"sha256\": \"%064d\", \"start\": [], \"count\": [], \"replicas\": []},\n",
                   fam, state, rank, rank, fam, state, 0);
  for (int d = 0; d < ndim; d++) n += snprintf(buf, sizeof buf, "%lld, %lld, ", (long long)start[d], (long long)count[d]);
  return n + (int64_t)nrep * 6; /* a replica rank and its separator */
}

int main(int argc, char **argv) {
  double node_gbps = 2.0;
  int per_node = 8, to[6] = {-1, -1, -1, -1, -1, -1};
  mc_config cfg;
  if (mc_config_from_args(&cfg, &argc, argv) != 0) {
    fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--node-gbps") && i + 1 < argc) node_gbps = atof(argv[++i]);
    else if (!strcmp(argv[i], "--ranks-per-node") && i + 1 < argc) per_node = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--to") && i + 1 < argc &&
             sscanf(argv[++i], "%d,%d,%d,%d,%d,%d", &to[0], &to[1], &to[2], &to[3], &to[4], &to[5]) == 6) {
    } else {
      fprintf(stderr, "usage: sim_scale [--config FILE] [--set k=v]... [--to tp,pp,dp,ep,sp,zero] [--node-gbps G] "
                      "[--ranks-per-node R]\n");
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
  if (mc_geometry_build(&cfg.model, &tl, NULL, -1, &h) != 0) {
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
  int64_t *wrote = calloc((size_t)g.world, sizeof *wrote), shards = 0, manifest = 0, total = 0;
  for (int f = 0; f < g.fams.n && wrote; f++)
    for (int r = 0; r < g.world; r++) {
      mc_param_hold ph;
      if (mc_param_hold_of(&g, f, r, &ho, &ph) != 0) {
        fprintf(stderr, "sim_scale: %s\n", mc_errmsg());
        return 1;
      }
      for (int st = 0; ph.in_stage && st < MC_N_STATES; st++) {
        if (!ph.state_primary[st]) continue;
        mc_shard s;
        mc_shard_of(&g, f, (mc_state)st, r, &s);
        wrote[r] += ph.state_bytes[st];
        shards++;
        manifest += record_bytes(g.fams.f[f].name, mc_state_name((mc_state)st), r, s.ndim, s.start, s.count, s.n_replicas);
      }
    }
  if (!wrote) return 1;
  int files = 0, big = 0;
  double slowest = 0;
  for (int r = 0; r < g.world; r++) {
    total += wrote[r];
    files += wrote[r] > 0;
    if (wrote[r] > wrote[big]) big = r;
  }
  for (int n0 = 0; n0 < g.world; n0 += per_node) {
    double b = 0;
    for (int r = n0; r < n0 + per_node && r < g.world; r++) b += (double)wrote[r];
    slowest = b > slowest ? b : slowest;
  }
  double t_ckpt = now_s() - t0;

  t0 = now_s();
  mc_rs_plan rp;
  if (mc_rs_plan_build(&g, &h, MC_RS_ALL_STATES, &rp) != 0) {
    fprintf(stderr, "sim_scale: reshard plan: %s\n", mc_errmsg());
    return 1;
  }
  double t_rs = now_s() - t0;

  const double mean = (double)total / g.world;
  printf("layout tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d: %d ranks; target tp=%d pp=%d dp=%d ep=%d sp=%d zero=%d: %d ranks\n",
         g.layout.tp, g.layout.pp, g.layout.dp, g.layout.ep, g.layout.sp, g.layout.zero, g.world, tl.tp, tl.pp, tl.dp,
         tl.ep, tl.sp, tl.zero, h.world);
  printf("geometries %.2f s, mcplan's plan %.2f s, checkpoint metadata %.2f s, reshard plan (mcreshard --dry-run) %.2f s\n",
         t_geo, t_plan, t_ckpt, t_rs);
  printf("checkpoint: %lld bytes in %lld shards, %d rank files; manifest about %.1f MiB\n", (long long)total,
         (long long)shards, files, (double)manifest / (1 << 20));
  printf("writers: largest rank %d writes %lld bytes, %.3fx the mean %.0f\n", big, (long long)wrote[big],
         mean > 0 ? (double)wrote[big] / mean : 0.0, mean);
  printf("predicted save: %.2f s (slowest node of %d ranks writes %.3g GB at %.2f GB/s)\n",
         slowest / (node_gbps * 1e9), per_node, slowest / 1e9, node_gbps);
  printf("reshard: %d source and %d target shards, %d pieces, %d and %d writers\n", rp.n_src, rp.n_targets, rp.n_pieces,
         rp.n_src_writers, rp.n_dst_writers);
  printf("{\"ranks\": %d, \"target_ranks\": %d, \"t_geometry_s\": %.3f, \"t_mcplan_s\": %.3f, \"t_metadata_s\": %.3f, "
         "\"t_reshard_plan_s\": %.3f, \"bytes\": %lld, \"shards\": %lld, \"files\": %d, \"manifest_bytes\": %lld, "
         "\"writer_largest_over_mean\": %.4f, \"node_gbps\": %.3f, \"ranks_per_node\": %d, \"predicted_save_s\": %.3f, "
         "\"reshard_pieces\": %d}\n",
         g.world, h.world, t_geo, t_plan, t_ckpt, t_rs, (long long)total, (long long)shards, files, (long long)manifest,
         mean > 0 ? (double)wrote[big] / mean : 0.0, node_gbps, per_node, slowest / (node_gbps * 1e9), rp.n_pieces);
  mc_rs_plan_free(&rp);
  mc_plan_free(&plan);
  free(wrote);
  mc_geometry_free(&g);
  mc_geometry_free(&h);
  return 0;
}
