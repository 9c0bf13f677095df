/* Collectives and layout groups of the MPI backend. Run as one rank (ctest) and as four
 * (mpirun, tests/comm/comm.cmake). Every rank checks exact integer-valued results (bf16: bit
 * patterns). */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "comm/comm.h"

static void fill_layout(mc_layout *l, int tp, int dp, int pp, int ep) {
  memset(l, 0, sizeof *l);
  l->tp = tp; l->dp = dp; l->pp = pp; l->ep = ep; l->sp = 1;
}

static void check_group(mc_comm *c, int (*members_of)(const mc_layout *, int, int *), const mc_layout *l, int world_rank) {
  int members[64];
  int n = members_of(l, world_rank, members);
  CHECK(c->size == n, "%s group size %d, layout says %d", c->label, c->size, n);
  /* gather world ranks of the group's members: must equal the layout's list, in order */
  int64_t counts[64];
  for (int i = 0; i < c->size; i++) counts[i] = 1;
  int32_t mine = world_rank, got[64];
  CHECK_OK(mc_allgather(c, &mine, got, counts, MC_DT_I32));
  for (int i = 0; i < n; i++) CHECK(got[i] == members[i], "%s group member %d is %d, want %d", c->label, i, got[i], members[i]);
}

static void check_collectives(mc_comm *c) {
  int n = c->size, r = c->rank;
  /* allreduce */
  double v[3] = {r, 1.0, (double)r * r};
  CHECK_OK(mc_allreduce_sum(c, v, 3, MC_DT_F64));
  CHECK(v[0] == n * (n - 1) / 2.0 && v[1] == n, "%s allreduce %g %g", c->label, v[0], v[1]);
  /* reduce-scatter with uneven counts (member i gets i+1 elements, member 0 maybe none) */
  int64_t counts[64], total = 0;
  for (int i = 0; i < n; i++) total += counts[i] = (i == 0 && n > 1) ? 0 : i + 1;
  float *send = malloc(sizeof(float) * (size_t)total), recv[80];
  for (int64_t j = 0; j < total; j++) send[j] = (float)(j + r);
  CHECK_OK(mc_reduce_scatter_sum(c, send, recv, counts, MC_DT_F32));
  int64_t at = 0;
  for (int i = 0; i < r; i++) at += counts[i];
  for (int64_t j = 0; j < counts[r]; j++)
    CHECK(recv[j] == (float)(n * (at + j) + n * (n - 1) / 2), "%s reduce_scatter elem %lld", c->label, (long long)j);
  /* allgather with the same uneven counts */
  float mine[80], all[400];
  for (int64_t j = 0; j < counts[r]; j++) mine[j] = (float)(100 * r + j);
  CHECK_OK(mc_allgather(c, mine, all, counts, MC_DT_F32));
  at = 0;
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < counts[i]; j++, at++) CHECK(all[at] == (float)(100 * i + j), "%s allgather", c->label);
  /* bf16 is moved bit for bit (a NaN payload included) and refused by the sums */
  uint16_t m16[80], all16[400];
  for (int64_t j = 0; j < counts[r]; j++) m16[j] = (uint16_t)(j % 3 == 2 ? 0x7fc1 + r : 0x3f80 + 16 * r + j);
  CHECK_OK(mc_allgather(c, m16, all16, counts, MC_DT_BF16));
  at = 0;
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < counts[i]; j++, at++)
      CHECK(all16[at] == (uint16_t)(j % 3 == 2 ? 0x7fc1 + i : 0x3f80 + 16 * i + j), "%s bf16 allgather", c->label);
  CHECK(mc_allreduce_sum(c, m16, 1, MC_DT_BF16) != 0 && strstr(mc_errmsg(), "never summed"), "%s bf16 allreduce: %s",
        c->label, mc_errmsg());
  CHECK(mc_reduce_scatter_sum(c, all16, m16, counts, MC_DT_BF16) != 0 && strstr(mc_errmsg(), "never summed"),
        "%s bf16 reduce_scatter: %s", c->label, mc_errmsg());
  /* alltoallv: member r sends r+1 copies of (10r + dest) to each dest */
  int64_t sc[64], sd[64], rc[64], rd[64];
  int32_t sbuf[512], rbuf[512];
  for (int i = 0, o = 0; i < n; i++) {
    sc[i] = r + 1; sd[i] = o;
    for (int j = 0; j < r + 1; j++) sbuf[o++] = 10 * r + i;
  }
  for (int i = 0, o = 0; i < n; i++) { rc[i] = i + 1; rd[i] = o; o += i + 1; }
  CHECK_OK(mc_alltoallv(c, sbuf, sc, sd, rbuf, rc, rd, MC_DT_I32));
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i + 1; j++) CHECK(rbuf[rd[i] + j] == 10 * i + r, "%s alltoallv from %d", c->label, i);
  /* in 3 segments: segment k of r -> i holds (r + i + k) % 3 values 1000 r + 100 i + 10 k + j,
   * sent from descending offsets, received in segment-major order with a one-element gap after
   * each; the gaps (-7) must stay untouched; empty segments included */
  enum { NS = 3 };
  int64_t ssc[64 * NS], ssd[64 * NS], src[64 * NS], srd[64 * NS];
  int32_t sb[512], rb[512];
  int o = 0;
  for (int i = n - 1; i >= 0; i--)
    for (int k = NS - 1; k >= 0; k--) {
      const int len = (r + i + k) % 3;
      ssc[i * NS + k] = len, ssd[i * NS + k] = o;
      for (int j = 0; j < len; j++) sb[o++] = 1000 * r + 100 * i + 10 * k + j;
    }
  o = 0;
  for (int k = 0; k < NS; k++)
    for (int i = 0; i < n; i++) {
      const int len = (i + r + k) % 3;
      src[i * NS + k] = len, srd[i * NS + k] = o;
      o += len + 1;
    }
  for (int j = 0; j < o; j++) rb[j] = -7;
  CHECK_OK(mc_alltoallv_seg(c, sb, NS, ssc, ssd, rb, src, srd, MC_DT_I32));
  int gaps_ok = 1;
  for (int k = 0; k < NS; k++)
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < src[i * NS + k]; j++)
        CHECK(rb[srd[i * NS + k] + j] == 1000 * i + 100 * r + 10 * k + j, "%s alltoallv segment %d from %d", c->label, k, i);
      gaps_ok = gaps_ok && rb[srd[i * NS + k] + src[i * NS + k]] == -7;
    }
  CHECK(gaps_ok, "%s alltoallv segments wrote between segments", c->label);
  CHECK(mc_alltoallv_seg(c, sb, 0, ssc, ssd, rb, src, srd, MC_DT_I32) != 0 && strstr(mc_errmsg(), "0 segments"),
        "%s alltoallv with 0 segments: %s", c->label, mc_errmsg());
  CHECK(mc_alltoallv(c, sb, ssc, ssd, sb, src, srd, MC_DT_I32) != 0 && strstr(mc_errmsg(), "one buffer"),
        "%s alltoallv with send = receive: %s", c->label, mc_errmsg());
  /* segmented gather and reduce-scatter (the SP layout): member i's segment k is L elements
   * 1000 * i + 10 * k + j; block k of the member-ordered buffer holds segment k of every member */
  {
    enum { SG = 3, L = 2 };
    int64_t eq[64];
    for (int i = 0; i < n; i++) eq[i] = L;
    int32_t seg_mine[SG * L], seg_all[SG * 64 * L];
    float fs_all[SG * 64 * L], fs_mine[SG * L];
    for (int k = 0; k < SG; k++)
      for (int j = 0; j < L; j++) seg_mine[k * L + j] = 1000 * r + 10 * k + j;
    CHECK_OK(mc_allgather_seg(c, seg_mine, SG, seg_all, eq, MC_DT_I32));
    for (int k = 0; k < SG; k++)
      for (int i = 0; i < n; i++)
        for (int j = 0; j < L; j++)
          CHECK(seg_all[(k * n + i) * L + j] == 1000 * i + 10 * k + j, "%s allgather segment %d of %d", c->label, k, i);
    /* every member sends value (block k, member slot i, j) + r: the sum is n * value + n(n-1)/2 */
    for (int k = 0; k < SG; k++)
      for (int i = 0; i < n; i++)
        for (int j = 0; j < L; j++) fs_all[(k * n + i) * L + j] = (float)(100 * k + 10 * i + j + r);
    CHECK_OK(mc_reduce_scatter_sum_seg(c, fs_all, SG, fs_mine, eq, MC_DT_F32));
    for (int k = 0; k < SG; k++)
      for (int j = 0; j < L; j++)
        CHECK(fs_mine[k * L + j] == (float)(n * (100 * k + 10 * r + j) + n * (n - 1) / 2), "%s reduce_scatter segment %d",
              c->label, k);
    CHECK(mc_allgather_seg(c, seg_mine, 0, seg_all, eq, MC_DT_I32) != 0 && strstr(mc_errmsg(), "0 segments"),
          "%s allgather with 0 segments: %s", c->label, mc_errmsg());
  }
  /* broadcast and ring send/recv */
  int64_t b = r == n - 1 ? 4242 : 0;
  CHECK_OK(mc_bcast(c, &b, 1, MC_DT_I64, n - 1));
  CHECK(b == 4242, "%s bcast", c->label);
  if (n > 1) {
    int32_t token = r, in = -1;
    if (r % 2 == 0) {
      CHECK_OK(mc_send(c, &token, 1, MC_DT_I32, (r + 1) % n, 7));
      CHECK_OK(mc_recv(c, &in, 1, MC_DT_I32, (r + n - 1) % n, 7));
    } else {
      CHECK_OK(mc_recv(c, &in, 1, MC_DT_I32, (r + n - 1) % n, 7));
      CHECK_OK(mc_send(c, &token, 1, MC_DT_I32, (r + 1) % n, 7));
    }
    CHECK(in == (r + n - 1) % n, "%s ring got %d", c->label, in);
  }
  CHECK_OK(mc_barrier(c));
  free(send);
}

int main(int argc, char **argv) {
  mc_comm *world;
  if (mc_comm_mpi_init(&argc, &argv, &world)) {
    fprintf(stderr, "%s\n", mc_errmsg());
    return 1;
  }
  check_collectives(world);
  mc_layout layouts[3];
  int nl = 0;
  if (world->size == 4) {
    fill_layout(&layouts[nl++], 2, 2, 1, 2);
    fill_layout(&layouts[nl++], 1, 2, 2, 2);
    fill_layout(&layouts[nl++], 2, 1, 2, 1);
  } else {
    fill_layout(&layouts[nl++], 1, world->size, 1, 1);
  }
  for (int i = 0; i < nl; i++) {
    mc_comm_groups g;
    CHECK_OK(mc_comm_make_groups(world, &layouts[i], &g));
    check_group(g.tp, mc_group_tp, &layouts[i], world->rank);
    check_group(g.dp, mc_group_dp, &layouts[i], world->rank);
    check_group(g.pp, mc_group_pp, &layouts[i], world->rank);
    check_group(g.ep, mc_group_ep, &layouts[i], world->rank);
    check_group(g.edp, mc_group_edp, &layouts[i], world->rank);
    check_collectives(g.tp);
    check_collectives(g.dp);
    check_collectives(g.edp);
    mc_comm_free_groups(&g);
  }
  /* a layout that does not match the launched ranks is a clear error */
  mc_layout bad;
  fill_layout(&bad, 3, 1, 1, 1);
  mc_comm_groups g;
  CHECK(mc_comm_make_groups(world, &bad, &g) != 0 && strstr(mc_errmsg(), "does not equal the"), "mismatch error: %s", mc_errmsg());
  int fails = mc_check_failures;
  CHECK_OK(mc_allreduce_sum(world, &fails, 1, MC_DT_I32));
  int rc = 0;
  if (world->rank == 0) rc = mc_check_exit("test_comm_mpi");
  world->ops->destroy(world);
  mc_comm_mpi_finalize();
  return rc || fails ? 1 : 0;
}
