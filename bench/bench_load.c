/* bench_load: a checkpoint loaded by the ranks of a layout, rank by rank against once across
 * the job (train/load_shared.h), under mpirun.
 *
 *   mpirun -np N bench_load CKPT [--tp T] [--dp D] [--pp P] [--zero Z] [--round-bytes B] [--serial 0|1]
 *
 * Every rank requests its hyperslab of every state of every family (mc_shard_of; the kinds the
 * family's optimizer keeps under the checkpoint's optim.groups) under the
 * layout (default: tp 1, dp N, pp 1, zero 0), as mc_dist_load does. Each mode opens its own
 * handle (so each reads and hashes for itself) and is timed from a barrier to the slowest
 * rank. Prints per mode: seconds, bytes read and hashed over all ranks, rounds (and rank 0's
 * seconds checking, reading where not hidden, and exchanging); and whether the two loads
 * placed the same bytes. --serial 1: the shared load reads each round after the exchange of
 * the one before, instead of during it (mc_load_opts.serial). The files stay in the page cache between the modes
 * (nothing here drops it): on a cold or remote file system reading once saves more. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/optim_groups.h"
#include "train/load_shared.h"
#include "util/error.h"

typedef struct {
  int n;
  mc_ckpt_request *r;
} request_set;

/* This rank's hyperslab of every state of every family (buffers owned by the set). */
static int make_requests(const mc_geometry *g, int rank, request_set *rs) {
  rs->n = 0;
  rs->r = calloc((size_t)g->fams.n * MC_N_STATES + 1, sizeof *rs->r);
  if (!rs->r) return mc_error("out of memory");
  for (int f = 0; f < g->fams.n; f++)
    for (int k = 0; k < MC_N_STATES; k++) {
      mc_shard sh;
      if (!mc_family_has_state(&g->fams.f[f], (mc_state)k)) continue; /* not a kind its optimizer keeps */
      /* AdamW's per-family step is one int64 (mc_ckpt_read_i64), not a hyperslab of floats */
      if (!mc_elem_is_float(mc_opt_state_dtype(g->fams.f[f].opt, (mc_state)k))) continue;
      if (mc_shard_of(g, f, (mc_state)k, rank, &sh) != 0) return -1;
      if (!sh.held) continue;
      mc_ckpt_request *r = &rs->r[rs->n++];
      r->family = g->fams.f[f].name, r->state = (mc_state)k;
      memcpy(r->start, sh.start, sizeof r->start);
      memcpy(r->count, sh.count, sizeof r->count);
      if (!(r->out = malloc(sizeof(float) * (size_t)sh.numel))) return mc_error("out of memory");
      /* touched now, outside the timing, as a trainer's destinations are (allocated once) */
      memset(r->out, 0, sizeof(float) * (size_t)sh.numel);
    }
  return 0;
}

static int timed_load(const char *path, mc_comm *world, request_set *rs, const mc_load_opts *o, mc_load_stats *st,
                      double *secs) {
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(path, NULL, &ck) != 0) return -1;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int rc = mc_load_shared(ck, world, rs->r, rs->n, o, st);
  double dt = MPI_Wtime() - t0;
  MPI_Allreduce(&dt, secs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  mc_ckpt_close(ck);
  return rc;
}

int main(int argc, char **argv) {
  mc_comm *world = NULL;
  if (mc_comm_mpi_init(&argc, &argv, &world) != 0) return fprintf(stderr, "bench_load: %s\n", mc_errmsg()), 1;
  const int rank = world->rank;
  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -np N bench_load CKPT [--tp T] [--dp D] [--pp P] [--zero Z] [--round-bytes B]\n");
    mc_comm_mpi_finalize();
    return 2;
  }
  const char *path = argv[1];
  int tp = 1, dp = world->size, pp = 1, zero = 0;
  mc_load_opts shared;
  mc_load_opts_default(&shared);
  for (int a = 2; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--tp")) tp = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--dp")) dp = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--pp")) pp = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--zero")) zero = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--round-bytes")) shared.round_bytes = atoll(argv[a + 1]);
    else if (!strcmp(argv[a], "--serial")) shared.serial = atoi(argv[a + 1]);
  }
  mc_ckpt *ck = NULL;
  mc_config cfg;
  mc_geometry g;
  int rc = mc_ckpt_open(path, NULL, &ck) || mc_ckpt_config(ck, &cfg);
  mc_ckpt_close(ck);
  if (rc == 0) {
    cfg.parallel.tp = tp, cfg.parallel.dp = dp, cfg.parallel.pp = pp, cfg.parallel.zero = zero;
    cfg.parallel.ep = 1, cfg.parallel.sp = 0, cfg.parallel.split = MC_SPLIT_EQUAL;
    rc = mc_geometry_build(&cfg.model, &cfg.parallel, NULL, world->size, &g);
    /* the checkpoint's optimizer groups: which state kinds each family has */
    if (rc == 0 && mc_optim_groups_assign(cfg.train.optim.groups, &g.fams) != 0) {
      mc_geometry_free(&g);
      rc = -1;
    }
  }
  request_set a = {0, NULL}, b = {0, NULL};
  if (rc == 0) rc = make_requests(&g, rank, &a) || make_requests(&g, rank, &b);
  mc_load_opts per_rank = shared;
  per_rank.per_rank = 1;
  mc_load_stats sa, sb;
  double ta = 0, tb = 0;
  if (rc == 0) rc = timed_load(path, world, &a, &per_rank, &sa, &ta) || timed_load(path, world, &b, &shared, &sb, &tb);
  int same = 1;
  for (int i = 0; rc == 0 && i < a.n; i++) {
    int64_t n = 1;
    for (int d = 0; d < 3; d++) n *= a.r[i].count[d] ? a.r[i].count[d] : 1;
    same &= memcmp(a.r[i].out, b.r[i].out, sizeof(float) * (size_t)n) == 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rc != 0) fprintf(stderr, "bench_load: rank %d: %s\n", rank, mc_errmsg());
  else if (rank == 0)
    printf("layout tp=%d dp=%d pp=%d zero=%d on %d ranks, checkpoint %s (%lld stored bytes needed)\n"
           "rank by rank: %.3f s, read %lld bytes, hashed %lld\n"
           "once:         %.3f s, read %lld bytes, hashed %lld, %d rounds of at most %lld bytes (%s; rank 0: "
           "%.3f s checking, %.3f s reading not hidden, %.3f s exchanging)\n"
           "placed bytes identical: %s\n",
           tp, dp, pp, zero, world->size, path, (long long)sb.needed, ta, (long long)sa.total_read,
           (long long)sa.total_hashed, tb, (long long)sb.total_read, (long long)sb.total_hashed, sb.rounds,
           (long long)shared.round_bytes, shared.serial ? "serial rounds" : "next round read during each exchange",
           sb.check_s, sb.read_s, sb.exchange_s, same ? "yes" : "NO");
  for (int i = 0; i < a.n; i++) free(a.r[i].out);
  for (int i = 0; i < b.n; i++) free(b.r[i].out);
  free(a.r), free(b.r);
  mc_comm_mpi_finalize();
  return rc != 0 || !same;
}
