/* An E block of one expert and one choice that cannot drop runs as the plain SwiGLU
 * (train/block_moe.c, net->hold.moe_dense): it must give exactly the routed computation's values.
 * Two networks with the same initialisation, one forced onto the routed path, take the same
 * micro-batches: losses, aux sums, drop counts and every gradient must be equal (==, so a
 * signed zero may differ), with capacity 1.25 and dropless routing, in fp32 and on a copy of
 * the CPU backend with bf16 weights (the bf16 product-input path). A capacity that can drop
 * (0.5) keeps the routed path. */
#include <string.h>

#include "tests/train/netcheck.h"

static mc_backend bf16_cpu;

static void compare(double capacity, mc_backend *be, const char *what) {
  mc_model m = nc_model("AEME");
  m.n_experts = 1, m.top_k = 1, m.capacity_factor = capacity;
  mc_geometry geo;
  mc_layout l = nc_layout(1, 1, 1);
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &geo));
  mc_net *fast = mc_net_create_on(&geo, 0, 11, be), *routed = mc_net_create_on(&geo, 0, 11, be);
  CHECK(fast && routed, "%s: networks: %s", what, mc_errmsg());
  if (!fast || !routed) return;
  routed->hold.moe_dense = 0;
  int32_t *tok = nc_tokens(&m, 3, 21);
  for (int pass = 0; pass < 2; pass++) { /* the second pass accumulates onto the first's gradients */
    mc_net_stats a, b;
    CHECK_OK(mc_net_forward_backward(fast, tok, 3, 0.05, 0.3, &a));
    CHECK_OK(mc_net_forward_backward(routed, tok, 3, 0.05, 0.3, &b));
    CHECK(a.ce_sum == b.ce_sum && a.aux_sum == b.aux_sum && a.dropped == b.dropped && a.n_tokens == b.n_tokens,
          "%s pass %d: stats differ (ce %.17g vs %.17g, aux %.17g vs %.17g, dropped %lld vs %lld)", what, pass,
          a.ce_sum, b.ce_sum, a.aux_sum, b.aux_sum, (long long)a.dropped, (long long)b.dropped);
  }
  /* the plain path really ran: it never writes the router logits (buffer 0 of an E layer) */
  const int dense = capacity != 0.5;
  for (int L = 0; L < fast->n_layers; L++) {
    if (fast->layers[L].kind != 'E') continue;
    int64_t nz_fast = 0, nz_routed = 0;
    for (int64_t r = 0; r < 3 * m.seq_len; r++)
      nz_fast += fast->layers[L].f[0][r] != 0.0f, nz_routed += routed->layers[L].f[0][r] != 0.0f;
    CHECK(nz_routed > 0 && (dense ? nz_fast == 0 : nz_fast == nz_routed),
          "%s layer %d: router logits written %lld times (plain path expected: %d), routed %lld", what, L,
          (long long)nz_fast, dense, (long long)nz_routed);
  }
  int differ = 0;
  for (int i = 0; i < mc_net_n_params(fast); i++) {
    const mc_net_param *p = mc_net_param_at(fast, i), *q = mc_net_param_at(routed, i);
    int64_t bad = 0;
    for (int64_t e = 0; e < p->numel; e++) bad += p->g[e] != q->g[e];
    if (bad) {
      differ++;
      CHECK(0, "%s: %s: %lld gradient elements differ", what, geo.fams.f[p->fam].name, (long long)bad);
    }
  }
  printf("  %-34s capacity %.2f: %d of %d gradients differ\n", what, capacity, differ, mc_net_n_params(fast));
  free(tok);
  mc_net_free(fast);
  mc_net_free(routed);
  mc_geometry_free(&geo);
}

int main(void) {
  bf16_cpu = *mc_backend_cpu();
  bf16_cpu.bf16_weights = 1;
  compare(1.25, mc_backend_cpu(), "fp32");
  compare(0.0, mc_backend_cpu(), "fp32 dropless");
  compare(0.5, mc_backend_cpu(), "fp32 (may drop: routed both)");
  compare(1.25, &bf16_cpu, "bf16 weights");
  return mc_check_exit("test_moe_dense");
}
