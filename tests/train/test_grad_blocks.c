/* Gradient check of every parameter family of every block type (A, M, E, R), the embedding,
 * the norms and the head, against central finite differences on a tiny model (tolerance in
 * netcheck.h); plus the aux-loss gradient alone and the gradient accumulation contract. */
#include "tests/train/netcheck.h"

static void check_pattern(const char *pattern, double cf, int n_seq) {
  printf("pattern %s, capacity_factor %g, %d sequences\n", pattern, cf, n_seq);
  mc_model m = nc_model(pattern);
  m.capacity_factor = cf;
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 42);
  CHECK(net != NULL, "network for %s", pattern);
  if (!net) return;
  int32_t *tok = nc_tokens(&m, n_seq, 1);
  /* a global batch of 2*n_seq sequences: the weights of train/net.h */
  nc_obj o = {net, tok, n_seq, 1.0 / (2.0 * n_seq * m.seq_len), 1.0 / (2.0 * n_seq), 0};
  mc_net_stats st;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, n_seq, o.cw, o.sw, &st));
  CHECK(st.n_tokens == (int64_t)n_seq * m.seq_len && st.n_seqs == n_seq, "stats counts");
  if (cf > 0) CHECK(st.dropped > 0, "capacity %g should drop assignments (dropped %lld)", cf, (long long)st.dropped);
  else CHECK(st.dropped == 0, "dropless run dropped %lld", (long long)st.dropped);
  for (int i = 0; i < mc_net_n_params(net); i++) nc_check_param(&o, i, 48);
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* With ce_weight = 0 only the aux loss drives the gradient: the router (and what feeds it)
 * gets a gradient that matches finite differences, the experts get exactly none. */
static void check_aux_only(void) {
  printf("aux loss alone\n");
  mc_model m = nc_model("E");
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 7);
  if (!net) return;
  int32_t *tok = nc_tokens(&m, 2, 2);
  nc_obj o = {net, tok, 2, 0.0, 0.5, 0};
  mc_net_stats st;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, 2, 0.0, 0.5, &st));
  CHECK(st.aux_sum > 0, "aux_sum %g", st.aux_sum);
  int r = nc_param(net, "layers.00.moe.router");
  CHECK(r >= 0, "router family");
  double gs = 0;
  for (int64_t e = 0; r >= 0 && e < mc_net_param_at(net, r)->numel; e++) gs += fabs(mc_net_param_at(net, r)->g[e]);
  CHECK(gs > 1e-4, "router gradient from the aux loss alone: %g", gs);
  nc_check_param(&o, r, 64);
  nc_check_param(&o, nc_param(net, "layers.00.norm.weight"), 64);
  const char *experts[3] = {"layers.00.moe.w1", "layers.00.moe.w2", "layers.00.moe.w3"};
  for (int i = 0; i < 3; i++) {
    mc_net_param *p = mc_net_param_at(net, nc_param(net, experts[i]));
    int nz = 0;
    for (int64_t e = 0; e < p->numel; e++) nz += p->g[e] != 0.0f;
    CHECK(nz == 0, "%s has %d nonzero gradients with ce_weight 0", experts[i], nz);
  }
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* Gradients accumulate across calls; forward alone reports the same statistics. */
static void check_accumulate(void) {
  mc_model m = nc_model("AEMR");
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 3);
  if (!net) return;
  int32_t *tok = nc_tokens(&m, 2, 3);
  mc_net_stats a, b;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, 2, 0.1, 0.5, &a));
  mc_net_param *p = mc_net_param_at(net, 1);
  float g1 = p->g[3];
  CHECK_OK(mc_net_forward_backward(net, tok, 2, 0.1, 0.5, &b));
  CHECK_CLOSE(p->g[3], 2.0 * g1, 1e-6);
  CHECK_OK(mc_net_forward(net, tok, 2, &b));
  CHECK(a.ce_sum == b.ce_sum && a.aux_sum == b.aux_sum, "forward alone: %.9g %.9g vs %.9g %.9g", a.ce_sum,
        a.aux_sum, b.ce_sum, b.aux_sum);
  /* an untrained model predicts roughly uniformly: mean CE near ln(V) */
  CHECK(fabs(a.ce_sum / a.n_tokens - log(11.0)) < 1.5, "mean CE %g vs ln 11", a.ce_sum / a.n_tokens);
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

int main(void) {
  check_pattern("AEMR", 0.0, 2);
  check_pattern("MRAE", 0.0, 1);
  check_aux_only();
  check_accumulate();
  return mc_check_exit("test_grad_blocks");
}
