/* Tensor (and sequence) parallel network against the single-rank network on the same
 * micro-batch, under mpirun -np 2 (tp = 2): the losses agree and, once mc_dist_sync_grads
 * has summed the partial-gradient surfaces, every rank's gradient slice equals the matching
 * slice of the single-rank gradient. Before that sum the partial surfaces (w_B, w_C, their
 * convs; norms and router under SP) must differ, so a forgotten sum cannot pass. Covers every
 * block kind, MoE capacity dropping with and without SP (under SP an E block with capacity
 * gathers whole sequences), and the refusals (no communicator groups, an ep > 1 layout given
 * groups made for ep = 1). */
#include <mpi.h>

#include "tests/dist/distcheck.h"

/* Gradient agreement: per family, max |g_tp - g_1| <= 1e-4 * max |g_1| + 1e-7 (the two runs
 * sum in different orders; fp32 products of width <= 16). Loss: relative 1e-5. */
#define GTOL 1e-4

static void run_case(mc_comm_groups *grp, const char *pattern, int sp, double capacity) {
  int rank = grp->world->rank;
  mc_model m = dc_model(pattern);
  m.capacity_factor = capacity;
  mc_layout l1 = dc_layout(1, 1, 0, 0), l2 = dc_layout(2, 1, sp, 0);
  mc_geometry g1, g2;
  if (mc_geometry_build(&m, &l1, NULL, -1, &g1) || mc_geometry_build(&m, &l2, NULL, 2, &g2)) {
    CHECK(0, "geometry: %s", mc_errmsg());
    return;
  }
  if (rank == 0) printf("%s sp=%d capacity=%g\n", pattern, sp, capacity);
  mc_net *ref = mc_net_create(&g1, 0, 31), *net = mc_net_create_dist(&g2, rank, 31, grp);
  CHECK(ref && net, "create: %s", mc_errmsg());
  mc_dist_opt d;
  int have_opt = net && mc_dist_opt_init(&d, net, &g2, grp, rank) == 0;
  CHECK(have_opt, "optimizer: %s", mc_errmsg());
  if (!ref || !net || !have_opt) goto out;
  const int n_seq = 3, T = m.seq_len;
  CHECK(net->par.T_res == (sp ? T / 2 : T), "residual rows per sequence %d with sp=%d", net->par.T_res, sp);
  int32_t *tok = malloc(sizeof(int32_t) * n_seq * (T + 1));
  dc_samples(&m, 100, n_seq, tok);
  mc_net_stats s1, s2;
  mc_net_zero_grad(ref), mc_net_zero_grad(net);
  double cw = 1.0 / (n_seq * T), sw = 1.0 / n_seq;
  CHECK_OK(mc_net_forward_backward(ref, tok, n_seq, cw, sw, &s1));
  CHECK_OK(mc_net_forward_backward(net, tok, n_seq, cw, sw, &s2));
  CHECK_CLOSE(s2.ce_sum, s1.ce_sum, 1e-5);
  CHECK_CLOSE(s2.aux_sum, s1.aux_sum, 1e-5);
  CHECK(s2.dropped == s1.dropped, "dropped %lld vs %lld", (long long)s2.dropped, (long long)s1.dropped);
  CHECK(capacity == 0 || s1.dropped > 0, "capacity %g dropped nothing", capacity);
  /* the partial surfaces are partial before the sum */
  int partial_seen = 0, partial_differs = 0;
  for (int i = 0; i < mc_net_n_params(net); i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    const mc_family *f = &g2.fams.f[p->fam];
    if (!f->tp_partial_grad) continue;
    mc_net_param *r = mc_net_param_at(ref, dc_param_of(ref, p->fam));
    double rmax, diff = dc_slice_diff(p->g, &p->shard, p->shard.local_start, p->shard.local_count, r->g, f, &rmax);
    partial_seen++;
    partial_differs += diff > GTOL * rmax + 1e-7;
  }
  CHECK(partial_seen == 0 || partial_differs > 0, "no partial-gradient family differed before the TP sum");
  CHECK_OK(mc_dist_sync_grads(&d));
  double worst = 0.0;
  for (int i = 0; i < mc_net_n_params(net); i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    const mc_family *f = &g2.fams.f[p->fam];
    mc_net_param *r = mc_net_param_at(ref, dc_param_of(ref, p->fam));
    double rmax, dw = dc_slice_diff(p->w, &p->shard, p->shard.local_start, p->shard.local_count, r->w, f, &rmax);
    CHECK(dw == 0.0, "%s: initial weights differ from the single-rank slice by %g", f->name, dw);
    double diff = dc_slice_diff(p->g, &p->shard, p->shard.local_start, p->shard.local_count, r->g, f, &rmax);
    CHECK(diff <= GTOL * rmax + 1e-7, "rank %d %s: gradient differs by %.3g (max %.3g)", rank, f->name, diff, rmax);
    worst = fmax(worst, diff / (GTOL * rmax + 1e-7));
  }
  if (rank == 0) printf("  ce %.6f vs %.6f, aux %.6f vs %.6f, worst gradient err/tol %.3f over %d families\n",
                        s2.ce_sum, s1.ce_sum, s2.aux_sum, s1.aux_sum, worst, mc_net_n_params(net));
  /* forward only (evaluation) agrees too */
  CHECK_OK(mc_net_forward(net, tok, n_seq, &s2));
  CHECK_CLOSE(s2.ce_sum, s1.ce_sum, 1e-5);
  free(tok);
out:
  if (have_opt) mc_dist_opt_free(&d);
  mc_net_free(ref), mc_net_free(net);
  mc_geometry_free(&g1), mc_geometry_free(&g2);
}

static void check_refusals(mc_comm_groups *grp) {
  mc_model m = dc_model("AE");
  mc_layout l = dc_layout(2, 1, 1, 0);
  mc_geometry g;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, 2, &g));
  mc_net *net = mc_net_create(&g, grp->world->rank, 1);
  CHECK(!net && strstr(mc_errmsg(), "communicator groups"), "no groups: %s", mc_errmsg());
  mc_net_free(net);
  mc_geometry_free(&g);
  l.ep = 2;
  CHECK(mc_geometry_build(&m, &l, NULL, 2, &g) == 0, "ep=2 geometry: %s", mc_errmsg());
  net = mc_net_create_dist(&g, grp->world->rank, 1, grp);
  CHECK(!net && strstr(mc_errmsg(), "ep communicator") && strstr(mc_errmsg(), "ep=2"), "ep=2 with ep=1 groups: %s",
        mc_errmsg());
  mc_net_free(net);
  mc_geometry_free(&g);
}

int main(int argc, char **argv) {
  mc_comm *world;
  if (mc_comm_mpi_init(&argc, &argv, &world)) return fprintf(stderr, "%s\n", mc_errmsg()), 1;
  mc_layout l = dc_layout(2, 1, 0, 0);
  mc_comm_groups grp;
  if (mc_comm_make_groups(world, &l, &grp)) {
    fprintf(stderr, "%s\n", mc_errmsg());
    mc_comm_mpi_finalize();
    world->ops->destroy(world);
    return 1;
  }
  run_case(&grp, "AMER", 0, 0.0);
  run_case(&grp, "AMER", 1, 0.0);
  run_case(&grp, "EAEM", 0, 0.5);
  run_case(&grp, "EAEM", 1, 0.5);
  check_refusals(&grp);
  int fails = mc_check_failures, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  mc_check_failures = total;
  int rc = grp.world->rank == 0 ? mc_check_exit("dist_tp") : (total ? 1 : 0);
  mc_comm_free_groups(&grp);
  mc_comm_mpi_finalize();
  world->ops->destroy(world); /* the wrapper only: MPI_COMM_WORLD is not freed (as in mctrain) */
  return rc;
}
