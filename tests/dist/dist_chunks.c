/* ZeRO 0/1's chunked step collectives (train/dist_sync.c mc_dist_reduce_chunked and
 * mc_dist_gather_chunked, packed through a dist.staging arena) against the same collectives
 * over every parameter at once with backend-allocated packs, under mpirun -np 2: the results
 * are bit for bit the same for chunks of one parameter each, of a few parameters, and of the
 * whole model, for dp2 ZeRO 0 and ZeRO 1 (the dense and the expert groups: two packs per
 * chunk) and tp2 (partial sums over TP first); the arena is the size the holdings give
 * (core/holdings.h mc_dist_staging_bytes), and a chunk that does not fit it is an error, not
 * an overrun. */
#include <mpi.h>

#include "kernels/bf16.h"
#include "tests/dist/distcheck.h"

/* Deterministic per-rank gradients: every rank holds different values in every slice. */
static void fill(mc_net *net, int rank) {
  for (int i = 0; i < mc_net_n_params(net); i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    for (int64_t e = 0; e < p->numel; e++)
      p->g[e] = (float)(mc_rng_uniform(5, (uint64_t)(1000 * i + rank), (uint64_t)e) - 0.5);
  }
}

static int run_case(mc_comm_groups *grp, mc_layout l) {
  const int rank = grp->world->rank;
  mc_model m = dc_model("AEMR");
  mc_geometry g;
  if (mc_geometry_build(&m, &l, NULL, 2, &g)) {
    CHECK(0, "geometry: %s", mc_errmsg());
    return -1;
  }
  mc_net *net = mc_net_create_dist(&g, rank, 7, grp);
  if (!net) {
    CHECK(0, "create: %s", mc_errmsg());
    mc_geometry_free(&g);
    return -1;
  }
  const int n = mc_net_n_params(net);
  int64_t total = 0, chunk0 = 0;
  for (int i = 0; i < n; i++) total += mc_net_param_at(net, i)->numel;
  CHECK_OK(mc_dist_staging_chunk(&g, rank, &net->hold, &chunk0));
  /* a small model: the chunk is the whole stage (every slice is far below MC_DIST_STAGING_CHUNK) */
  CHECK(chunk0 == total && total < MC_DIST_STAGING_CHUNK, "tp=%d dp=%d zero=%d: chunk %lld, the stage's slices %lld",
        l.tp, l.dp, l.zero, (long long)chunk0, (long long)total);
  int *idx = malloc(sizeof(int) * (size_t)n);
  float **g_ = malloc(sizeof(float *) * (size_t)n), **out = malloc(sizeof(float *) * (size_t)n);
  float **ref = malloc(sizeof(float *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    idx[i] = i, g_[i] = p->g, out[i] = p->g + p->z_off;
    ref[i] = malloc(sizeof(float) * (size_t)p->numel);
  }
  /* the reference: one job over everything, packs from the backend */
  fill(net, rank);
  CHECK_OK(mc_dist_reduce_grads(&net->par, net->be, NULL, net->params, idx, n, g_, out, 0));
  for (int i = 0; i < n; i++) memcpy(ref[i], g_[i], sizeof(float) * (size_t)mc_net_param_at(net, i)->numel);
  const int64_t chunks[3] = {1, 100, total};
  for (int c = 0; c < 3; c++) {
    /* an arena as the holdings size it for this chunk (at least the largest slice) */
    int64_t largest = 0;
    for (int i = 0; i < n; i++) largest = mc_net_param_at(net, i)->numel > largest ? mc_net_param_at(net, i)->numel : largest;
    const int64_t ch = chunks[c] > largest ? chunks[c] : largest;
    mc_arena a = {0};
    a.cap = mc_dist_staging_bytes_of(ch);
    CHECK_OK(mc_arena_open(&a, net->be, MC_MEM_DIST_STAGING));
    fill(net, rank);
    CHECK_OK(mc_dist_reduce_chunked(&net->par, net->be, &a, chunks[c], net->params, idx, n, g_, out));
    int same = 1;
    for (int i = 0; i < n; i++) {
      mc_net_param *p = mc_net_param_at(net, i);
      /* ZeRO 1: the rank's part holds the sum (the rest of g is clobbered) */
      const int64_t off = l.zero ? p->z_off : 0, cnt = l.zero ? p->z_numel : p->numel;
      same &= !memcmp(g_[i] + off, ref[i] + off, sizeof(float) * (size_t)cnt);
    }
    CHECK(same, "tp=%d dp=%d zero=%d chunk %lld: the reduced gradients differ from the one-job reduction", l.tp, l.dp,
          l.zero, (long long)chunks[c]);
    if (l.zero == 1) {
      /* the gather of the rows back into whole slices, fp32 and bf16 */
      float **shard = malloc(sizeof(float *) * (size_t)n), **full = malloc(sizeof(float *) * (size_t)n);
      mc_bf16 **full16 = malloc(sizeof(mc_bf16 *) * (size_t)n);
      for (int i = 0; i < n; i++) {
        mc_net_param *p = mc_net_param_at(net, i);
        shard[i] = ref[i] + p->z_off;
        full[i] = malloc(sizeof(float) * (size_t)p->numel), full16[i] = malloc(sizeof(mc_bf16) * (size_t)p->numel);
      }
      CHECK_OK(mc_dist_gather_chunked(&net->par, net->be, &a, chunks[c], net->params, idx, n, shard, (void *const *)full, 0));
      CHECK_OK(mc_dist_gather_chunked(&net->par, net->be, &a, chunks[c], net->params, idx, n, shard, (void *const *)full16, 1));
      /* own rows as given, the other member's rows as it gave them (both ranks end with the
       * same whole slices: rank 0's sent over and compared), bf16 the fp32 slices rounded */
      int whole = 1, rounded = 1, agree = 1;
      for (int i = 0; i < n; i++) {
        mc_net_param *p = mc_net_param_at(net, i);
        whole &= !memcmp(full[i] + p->z_off, shard[i], sizeof(float) * (size_t)p->z_numel);
        for (int64_t e = 0; e < p->numel; e++) rounded &= full16[i][e] == mc_bf16_from_float(full[i][e]);
        float *other = malloc(sizeof(float) * (size_t)p->numel);
        if (rank == 0) memcpy(other, full[i], sizeof(float) * (size_t)p->numel);
        MPI_Bcast(other, (int)p->numel, MPI_FLOAT, 0, MPI_COMM_WORLD);
        agree &= !memcmp(other, full[i], sizeof(float) * (size_t)p->numel);
        free(other), free(full[i]), free(full16[i]);
      }
      CHECK(whole && rounded && agree, "zero=1 chunk %lld: gathered slices (own rows %d, bf16 the rounded fp32 %d, "
            "the same on both ranks %d)", (long long)chunks[c], whole, rounded, agree);
      free(shard), free(full), free(full16);
    }
    mc_arena_close(&a);
  }
  /* an arena smaller than a chunk's packs: an error naming the arena, nothing written past it */
  mc_arena small = {0};
  small.cap = 2 * MC_MEM_ALIGN;
  CHECK_OK(mc_arena_open(&small, net->be, MC_MEM_DIST_STAGING));
  fill(net, rank);
  CHECK(mc_dist_reduce_chunked(&net->par, net->be, &small, total, net->params, idx, n, g_, out) != 0 &&
            strstr(mc_errmsg(), "dist.staging"),
        "a too small staging arena: %s", mc_errmsg());
  mc_arena_close(&small);
  for (int i = 0; i < n; i++) free(ref[i]);
  free(ref), free(idx), free(g_), free(out);
  mc_net_free(net);
  mc_geometry_free(&g);
  return 0;
}

int main(int argc, char **argv) {
  mc_comm *world;
  if (mc_comm_mpi_init(&argc, &argv, &world)) return fprintf(stderr, "%s\n", mc_errmsg()), 1;
  const mc_layout ls[3] = {dc_layout(1, 2, 0, 0), dc_layout(1, 2, 0, 1), dc_layout(2, 1, 0, 0)};
  for (int k = 0; k < 3; k++) {
    mc_comm_groups grp;
    if (mc_comm_make_groups(world, &ls[k], &grp)) {
      CHECK(0, "groups: %s", mc_errmsg());
      continue;
    }
    run_case(&grp, ls[k]);
    mc_comm_free_groups(&grp);
  }
  int fails = mc_check_failures, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  mc_check_failures = total;
  int rc = world->rank == 0 ? mc_check_exit("dist_chunks") : (total ? 1 : 0);
  mc_comm_mpi_finalize();
  world->ops->destroy(world);
  return rc;
}
