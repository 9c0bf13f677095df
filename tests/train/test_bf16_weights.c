/* bf16 working weights (train.dtype=bf16), checked on the CPU: the CPU backend's bf16 instance
 * (mc_backend_cpu_bf16) takes the same network path the bf16 CUDA instance takes (the matrix
 * weights held in bf16 and multiplied through gemm_ex / gemm_grouped_ex, the activations that
 * feed only products kept in bf16), in exact CPU arithmetic, against the fp32 network on the
 * plain CPU backend:
 * - exactly the matrix-weight families (mc_role_is_matmul) are held in bf16, the rest fp32;
 *   A, M and R layers keep only u16, routed E layers an fp32 u;
 * - the bf16 weights are the fp32 initial values rounded (bitwise), and
 *   mc_net_param_initial returns the fp32 values themselves (bitwise), so the optimizer's
 *   master starts from the same values in both dtypes;
 * - losses of a few optimizer steps stay within 1e-2 relative of the fp32 run but differ
 *   from it (the rounding is real), and after each step every bf16 working weight is the
 *   master rounded to bf16 (bitwise: the fused update writes it);
 * - ZeRO 3 keeps no resident bf16 weights and trains to the same losses, bit for bit (its
 *   multi-rank runs: tests/dist, and tests/train/nccl_train.sh bf16 on GPUs). */
#include <string.h>

#include "kernels/bf16.h"
#include "tests/train/netcheck.h"
#include "train/dist.h"


static void check_layout_and_init(mc_net *n32, mc_net *n16) {
  int held16 = 0, held32 = 0;
  for (int i = 0; i < mc_net_n_params(n16); i++) {
    mc_net_param *a = mc_net_param_at(n32, i), *b = mc_net_param_at(n16, i);
    const mc_family *f = &n16->geo.fams.f[b->fam];
    const int matmul = mc_role_is_matmul(f->role);
    CHECK(matmul ? b->w16 && !b->w : b->w && !b->w16, "%s: held in %s", f->name, b->w16 ? "bf16" : "fp32");
    held16 += matmul, held32 += !matmul;
    int64_t bad = 0;
    for (int64_t e = 0; e < b->numel; e++)
      bad += matmul ? b->w16[e] != mc_bf16_from_float(a->w[e]) : memcmp(&b->w[e], &a->w[e], sizeof(float)) != 0;
    CHECK(bad == 0, "%s: %lld initial values differ from the fp32 network's (rounded)", f->name, (long long)bad);
    float *init = malloc((size_t)b->numel * sizeof(float));
    CHECK_OK(mc_net_param_initial(n16, i, init));
    CHECK(memcmp(init, a->w, (size_t)b->numel * sizeof(float)) == 0, "%s: mc_net_param_initial is the fp32 draw",
          f->name);
    free(init);
  }
  CHECK(held16 > 0 && held32 > 0, "both kinds present (%d bf16, %d fp32)", held16, held32);
}

/* Runs `steps` optimizer steps of one micro-batch each; losses out. */
static void train(mc_net *net, const mc_geometry *geo, const int32_t *tok, int steps, double *loss) {
  mc_dist_opt d;
  CHECK_OK(mc_dist_opt_init(&d, net, geo, NULL, 0));
  mc_train_cfg t;
  memset(&t, 0, sizeof t);
  t.lr = 1e-2, t.beta1 = 0.9, t.beta2 = 0.95, t.adam_eps = 1e-8, t.weight_decay = 0.1;
  for (int s = 0; s < steps; s++) {
    mc_net_stats st;
    mc_net_zero_grad(net);
    CHECK_OK(mc_net_forward_backward(net, tok, 2, 1.0 / (2 * net->m.seq_len), 0.5, &st));
    loss[s] = st.ce_sum / (double)st.n_tokens;
    double norm;
    CHECK_OK(mc_dist_sync_grads(&d));
    CHECK_OK(mc_dist_grad_norm(&d, &norm));
    CHECK_OK(mc_dist_update(&d, &t, t.lr, 1.0));
    CHECK_OK(net->be->sync(net->be));
    for (int i = 0; i < mc_net_n_params(net); i++) { /* the working copy follows the master */
      mc_net_param *p = mc_net_param_at(net, i);
      if (p->ws) continue; /* ZeRO 3: the resident shard is the master itself */
      const mc_optim_slot *sl = &d.opt.slots[mc_optim_slot_of(&d.opt, p->fam)];
      int64_t bad = 0;
      for (int64_t e = 0; e < p->numel; e++)
        bad += p->w16 ? p->w16[e] != mc_bf16_from_float(sl->master[e])
                      : memcmp(&p->w[e], &sl->master[e], sizeof(float)) != 0;
      CHECK(bad == 0, "step %d, %s: %lld working weights are not the master%s", s + 1,
            net->geo.fams.f[p->fam].name, (long long)bad, p->w16 ? " rounded to bf16" : "");
    }
  }
  mc_dist_opt_free(&d);
}

int main(void) {
  mc_model m = nc_model("AEMR");
  mc_geometry geo;
  mc_net *n32 = nc_net(&m, &geo, 7);
  mc_net *n16 = mc_net_create_on(&geo, 0, 7, mc_backend_cpu_bf16());
  CHECK(n32 && n16, "networks: %s", mc_errmsg());
  if (!n32 || !n16) return mc_check_exit("test_bf16_weights");
  check_layout_and_init(n32, n16);

  CHECK_OK(mc_net_reserve(n16, 2));
  CHECK_OK(mc_net_reserve(n32, 2));
  for (int L = 0; L < n16->n_layers; L++) {
    const mc_layer *a = &n16->layers[L], *b = &n32->layers[L];
    const int e = a->kind == 'E'; /* routed (several experts): an fp32 u for the router */
    CHECK(e ? !a->u16 && a->u : a->u16 && !a->u, "layer %d (%c): u16 %s, fp32 u %s", L, a->kind,
          a->u16 ? "kept" : "absent", a->u ? "kept" : "absent");
    CHECK(!b->u16 && b->u, "fp32 layer %d keeps its fp32 u", L);
  }
  enum { STEPS = 4 };
  int32_t *tok = nc_tokens(&m, 2, 3);
  double l32[STEPS], l16[STEPS];
  train(n32, &geo, tok, STEPS, l32);
  train(n16, &geo, tok, STEPS, l16);
  int differ = 0;
  for (int s = 0; s < STEPS; s++) {
    double rel = fabs(l16[s] - l32[s]) / fabs(l32[s]);
    printf("  step %d  loss fp32 %.9f  bf16 weights %.9f  rel diff %.2e\n", s + 1, l32[s], l16[s], rel);
    CHECK(rel <= 1e-2, "step %d: bf16-weight loss %.9f vs fp32 %.9f (rel %.2e > 1e-2)", s + 1, l16[s], l32[s], rel);
    differ += l16[s] != l32[s];
  }
  CHECK(differ > 0, "the bf16-weight losses equal the fp32 ones exactly: no rounding took place");
  mc_net_free(n16);
  mc_net_free(n32);

  /* ZeRO 3 with bf16 weights: the fp32 shard stays resident (the master) and each gather
   * rounds the slice into bf16, so on one rank the losses are those of ZeRO 0 bit for bit */
  mc_layout l = nc_layout(1, 1, 1);
  l.zero = 3;
  mc_geometry gz;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &gz));
  mc_net *nz = mc_net_create_on(&gz, 0, 7, mc_backend_cpu_bf16());
  CHECK(nz != NULL, "zero=3 with bf16 weights: %s", mc_errmsg());
  if (nz) {
    int resident16 = 0;
    for (int i = 0; i < mc_net_n_params(nz); i++) resident16 += mc_net_param_at(nz, i)->w16 != NULL;
    CHECK(resident16 == 0, "zero=3: %d params keep resident bf16 weights", resident16);
    CHECK_OK(mc_net_reserve(nz, 2));
    double lz[STEPS];
    train(nz, &gz, tok, STEPS, lz);
    for (int s = 0; s < STEPS; s++)
      CHECK(lz[s] == l16[s], "step %d: zero=3 bf16 loss %.9f vs zero=0 %.9f", s + 1, lz[s], l16[s]);
    mc_net_free(nz);
  }
  mc_geometry_free(&gz);
  mc_geometry_free(&geo);
  free(tok);
  return mc_check_exit("test_bf16_weights");
}
