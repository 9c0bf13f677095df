/* Several MPI processes each write their own rank file into one step directory, the barrier
 * callback being an MPI_Allreduce (logical AND): sync and async saves, read back by every
 * process as its own hyperslabs and as another layout's; one process failing makes every
 * process fail and leaves no trace. Runs under any process count (ctest runs 1 and 4). */
#include "tests/ckpt/test_ckpt_common.h"

#include <mpi.h>

#include "tests/check.h"

static int mpi_and(void *user, int ok) {
  MPI_Comm comm = *(MPI_Comm *)user;
  int in = ok != 0, out = 0;
  if (MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LAND, comm) != MPI_SUCCESS) return 0;
  return out;
}

/* A layout of `world` ranks for the tiny model. */
static int layout_for(int world, mc_config *cfg, mc_geometry *g) {
  switch (world) {
  case 1: return tiny_geometry(1, 1, 1, 1, 0, 0, cfg, g);
  case 2: return tiny_geometry(1, 1, 2, 1, 0, 1, cfg, g);
  case 4: return tiny_geometry(2, 1, 2, 1, 0, 1, cfg, g);
  case 8: return tiny_geometry(2, 2, 2, 2, 1, 1, cfg, g);
  default: return tiny_geometry(1, 1, world, 1, 0, 1, cfg, g);
  }
}

static int save(const char *dir, const mc_geometry *g, const mc_config *cfg, int rank, int64_t step, int async,
                int sabotage, MPI_Comm *comm) {
  item_set set;
  make_items(g, 77, ALL_STATES, rank, rank + 1, &set);
  if (sabotage)
    for (int i = 0; i < set.n; i++) {
      mc_shard sh;
      mc_shard_of(g, set.items[i].family, set.items[i].state, rank, &sh);
      if (sh.primary) {
        set.items[i].data = NULL;
        break;
      }
    }
  mc_train_state st;
  make_state(step, &st);
  mc_ckpt_save_opts o;
  mc_ckpt_save_opts_default(&o);
  o.root = rank == 0;
  o.barrier = mpi_and;
  o.barrier_user = comm;
  o.keep = 2;
  int rc;
  if (async) {
    mc_ckpt_saver *sv = NULL;
    rc = mc_ckpt_saver_create(dir, &o, &sv);
    if (rc == 0) rc = mc_ckpt_saver_save(sv, g, cfg, &st, set.items, set.n);
    int crc = sv ? mc_ckpt_saver_close(sv) : 0;
    if (rc == 0) rc = crc;
  } else {
    rc = mc_ckpt_save(dir, g, cfg, &st, set.items, set.n, &o);
  }
  free_items(&set);
  return rc;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  /* The async saver calls the barrier from its thread while the caller waits: at least
   * MPI_THREAD_SERIALIZED is needed. */
  CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI thread level %d", provided);

  char dir[2048];
  const char *base = getenv("MC_BINARY_DIR");
  pathf(dir, sizeof dir, "%s/ckpt-scratch/mpi_np%d", base && *base ? base : "/tmp", size);
  if (rank == 0) {
    rm_rf(dir);
    char cmd[4200];
    pathf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", dir);
  }
  MPI_Barrier(comm);

  mc_config cfg;
  mc_geometry g, other;
  CHECK_OK(layout_for(size, &cfg, &g));
  mc_config cfg2;
  CHECK_OK(tiny_geometry(1, 2, 1, 1, 0, 0, &cfg2, &other));

  for (int async = 0; async <= 1; async++) {
    int64_t step = 10 + async;
    int rc = save(dir, &g, &cfg, rank, step, async, 0, &comm);
    CHECK(rc == 0, "rank %d: %s save: %s", rank, async ? "async" : "sync", rc ? mc_errmsg() : "");
    MPI_Barrier(comm);
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (ck) {
      CHECK(mc_ckpt_step(ck) == step, "rank %d: latest is step %" PRId64, rank, mc_ckpt_step(ck));
      CHECK(check_against_layout(ck, &other, 77) == 0, "rank %d: content read as another layout", rank);
      /* this process's own hyperslabs */
      int64_t bad = 0;
      for (int f = 0; f < g.fams.n; f++)
        for (int s = 0; s < MC_N_STATES; s++) {
          mc_shard sh;
          mc_shard_of(&g, f, (mc_state)s, rank, &sh);
          if (!sh.held || !mc_family_has_state(&g.fams.f[f], (mc_state)s)) continue;
          if (mc_state_is_scalar((mc_state)s)) continue; /* int64: checked by check_against_layout */
          float *got = malloc((size_t)sh.numel * sizeof(float)), *want = malloc((size_t)sh.numel * sizeof(float));
          CHECK_OK(mc_ckpt_read(ck, g.fams.f[f].name, (mc_state)s, sh.start, sh.count, got));
          ref_box(77, f, s, sh.ndim, g.fams.f[f].shape, sh.start, sh.count, want);
          bad += memcmp(got, want, (size_t)sh.numel * sizeof(float)) != 0;
          free(got);
          free(want);
        }
      CHECK(bad == 0, "rank %d: %" PRId64 " own hyperslabs differ", rank, bad);
      mc_ckpt_close(ck);
    }
    MPI_Barrier(comm);
  }

  /* The last process fails (an item without data): every process fails, nothing is left. */
  for (int async = 0; async <= 1; async++) {
    int rc = save(dir, &g, &cfg, rank, 20 + async, async, rank == size - 1, &comm);
    CHECK(rc != 0, "rank %d: save with a failing process should fail (%s)", rank, async ? "async" : "sync");
    if (rank == size - 1) CHECK(strstr(mc_errmsg(), "no data") != NULL, "failing rank says why: %s", mc_errmsg());
    MPI_Barrier(comm);
    char name[32];
    snprintf(name, sizeof name, "step_%d", 20 + async);
    CHECK(!path_exists(dir, name), "rank %d: %s left behind", rank, name);
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (ck) CHECK(mc_ckpt_step(ck) == 11, "latest still step 11");
    mc_ckpt_close(ck);
    MPI_Barrier(comm);
  }
  mc_geometry_free(&g);
  mc_geometry_free(&other);

  int failed = mc_check_failures, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, comm);
  if (rank == 0 && any == 0) rm_rf(dir);
  char name[64];
  snprintf(name, sizeof name, "test_ckpt_mpi (rank %d of %d)", rank, size);
  int rc = mc_check_exit(name);
  MPI_Finalize();
  return rc;
}
