/* AdamW, clipping and the schedule against hand-computed values; optimizer shards against
 * the ownership function under several layouts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim_groups.h"
#include "tests/check.h"
#include "train/optim.h"
#include "util/error.h"

static mc_train_cfg hyper(void) {
  mc_train_cfg t;
  memset(&t, 0, sizeof t);
  t.steps = 110;
  t.warmup_steps = 10;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.beta1 = 0.9;
  t.beta2 = 0.999;
  t.adam_eps = 1e-8;
  t.weight_decay = 0.1;
  t.grad_clip = 1.0;
  return t;
}

static void test_schedule(void) {
  mc_train_cfg t = hyper();
  CHECK_CLOSE(mc_lr_at(&t, 0), 1e-4, 1e-12);   /* warmup: lr * 1/10 */
  CHECK_CLOSE(mc_lr_at(&t, 4), 5e-4, 1e-12);   /* lr * 5/10 */
  CHECK_CLOSE(mc_lr_at(&t, 9), 1e-3, 1e-12);   /* end of warmup: peak */
  CHECK_CLOSE(mc_lr_at(&t, 10), 1e-3, 1e-12);  /* cosine starts at the peak */
  CHECK_CLOSE(mc_lr_at(&t, 60), 5.5e-4, 1e-12); /* half way: (lr + min_lr) / 2 */
  CHECK_CLOSE(mc_lr_at(&t, 35), 1e-4 + 0.45e-3 * (1 + 0.70710678118654752), 1e-12); /* cos(pi/4) */
  CHECK_CLOSE(mc_lr_at(&t, 110), 1e-4, 1e-12);
  CHECK_CLOSE(mc_lr_at(&t, 500), 1e-4, 1e-12);  /* past the end: stays at min_lr */
  t.warmup_steps = 0;
  CHECK_CLOSE(mc_lr_at(&t, 0), 1e-3, 1e-12);
  for (int s = 1; s < 110; s++) CHECK(mc_lr_at(&t, s) <= mc_lr_at(&t, s - 1), "lr rises at step %d", s);
}

static void test_clip(void) {
  CHECK_CLOSE(mc_clip_scale(2.0, 1.0), 1.0 / (2.0 + 1e-6), 1e-12);
  CHECK(mc_clip_scale(0.5, 1.0) == 1.0, "no clipping below the threshold");
  CHECK(mc_clip_scale(100.0, 0.0) == 1.0, "clip <= 0 disables clipping");
}

/* One hand-built slot of three elements, two AdamW steps with the same gradient, through the
 * CPU backend's adamw op (the CUDA one computes the same formulas, tests/kernels/test_cuda_ops.c).
 * Expected values from the update rule on paper (lr 0.01, betas 0.9/0.999, eps 1e-8,
 * wd 0.1): step 1 p = p*0.999 - 0.01*g/(|g|+1e-8) elementwise, step 2 likewise since
 * mhat/sqrt(vhat) = g/|g| again for a constant gradient. */
static void test_adamw(int decay, double grad_scale) {
  mc_optim o;
  memset(&o, 0, sizeof o);
  mc_optim_slot s;
  memset(&s, 0, sizeof s);
  float master[3] = {1, 2, 3}, m[3] = {0}, v[3] = {0};
  float g[3] = {(float)(0.1 / grad_scale), (float)(-0.2 / grad_scale), 0};
  s.numel = 3;
  s.decay = decay;
  s.shard.primary = 1;
  s.master = master, s.exp_avg = m, s.exp_avg_sq = v;
  o.be = mc_backend_cpu();
  o.n = 1;
  o.slots = &s;
  mc_train_cfg t = hyper();
  t.beta2 = 0.999;
  t.weight_decay = 0.1;
  float *grads[1] = {g};
  mc_optim_step(&o, &t, 0.01, grad_scale, grads);
  double shrink = decay ? 0.999 : 1.0;
  CHECK(o.step == 1, "step %lld", (long long)o.step);
  CHECK_CLOSE(m[0], 0.01, 1e-6);
  CHECK_CLOSE(v[1], 4e-5, 2e-5); /* v's tolerance: beta2 reaches the op as a float, 1 - 0.999f = 9.99987e-4 */
  CHECK_CLOSE(master[0], 1 * shrink - 0.01 * 0.1 / (0.1 + 1e-8), 1e-6);
  CHECK_CLOSE(master[1], 2 * shrink + 0.01 * 0.2 / (0.2 + 1e-8), 1e-6);
  CHECK_CLOSE(master[2], 3 * shrink, 1e-7);
  mc_optim_step(&o, &t, 0.01, grad_scale, grads);
  CHECK_CLOSE(m[0], 0.019, 1e-6);
  CHECK_CLOSE(v[0], 1.999e-5, 2e-5);
  if (decay) {
    CHECK_CLOSE(master[0], 0.978011001999, 1e-6);
    CHECK_CLOSE(master[1], 2.015991999, 1e-6);
    CHECK_CLOSE(master[2], 2.994003, 1e-6);
  } else {
    CHECK_CLOSE(master[0], 0.980000002, 1e-6);
    CHECK_CLOSE(master[1], 2.019999999, 1e-6);
    CHECK(master[2] == 3.0f, "a zero gradient without decay leaves the weight alone: %g", master[2]);
  }
  /* The non-primary slot does not count in the norm; the primary one does. */
  CHECK_CLOSE(mc_optim_grad_sq(&o, grads), ((double)g[0] * g[0] + (double)g[1] * g[1]), 1e-12);
  s.shard.primary = 0;
  CHECK(mc_optim_grad_sq(&o, grads) == 0.0, "non-primary shard counted");
}

/* Each AdamW family's bias correction uses its own step (the state kind step): three slots
 * with the same weights and gradient, the middle one resumed at step 9 (its t is 10), the
 * others at 0 (t = 1). One optimizer step advances each by one; the outer two move by the
 * t = 1 update, the middle one by the t = 10 update (mhat = m / (1 - b1^10), vhat = v / (1 -
 * b2^10)), computed here in double. A shared step would give all three the same update. */
static void test_family_steps(void) {
  mc_optim o;
  memset(&o, 0, sizeof o);
  mc_optim_slot s[3];
  memset(s, 0, sizeof s);
  float master[3][2], m[3][2] = {{0}}, v[3][2] = {{0}}, g[2] = {0.1f, -0.2f};
  float *grads[3] = {g, g, g};
  for (int i = 0; i < 3; i++) {
    master[i][0] = 1, master[i][1] = 2;
    s[i].numel = 2, s[i].opt = MC_OPT_ADAMW, s[i].shard.primary = 1;
    s[i].master = master[i], s[i].exp_avg = m[i], s[i].exp_avg_sq = v[i];
  }
  s[1].step = 9;
  o.be = mc_backend_cpu();
  o.n = 3;
  o.slots = s;
  mc_train_cfg t = hyper();
  t.beta2 = 0.999;
  mc_optim_step(&o, &t, 0.01, 1.0, grads);
  CHECK(s[0].step == 1 && s[1].step == 10 && s[2].step == 1, "steps %lld %lld %lld", (long long)s[0].step,
        (long long)s[1].step, (long long)s[2].step);
  const double b1 = (float)t.beta1, b2 = (float)t.beta2; /* as the op receives them */
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 2; k++) {
      const int64_t tt = s[i].step;
      const double mh = (1 - b1) * g[k] / (1 - pow(b1, (double)tt)), vh = (1 - b2) * g[k] * g[k] / (1 - pow(b2, (double)tt));
      const double want = (k ? 2.0 : 1.0) - 0.01 * mh / (sqrt(vh) + 1e-8);
      CHECK(fabs(master[i][k] - want) < 1e-6, "slot %d (t=%lld) element %d: %.9g, want %.9g", i, (long long)tt, k,
            master[i][k], want);
    }
  CHECK(fabs(master[1][0] - master[0][0]) > 1e-3, "t = 10 and t = 1 gave the same update");
}

static mc_model tiny(void) {
  mc_model m;
  memset(&m, 0, sizeof m);
  strcpy(m.pattern, "AEMR");
  m.n_layers = 4;
  m.vocab_size = 256, m.vocab_pad = 128, m.d_model = 64;
  m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 16;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 128;
  m.aux_loss_coef = 0.01;
  m.mamba_inner = 128, m.mamba_head_dim = 32, m.ssm_state = 16, m.conv_width = 4;
  m.rec_width = 64, m.seq_len = 64;
  m.rope_theta = 10000, m.norm_eps = 1e-5, m.init_std = 0.02;
  return m;
}

/* Over all ranks of a layout, the primaries' squared gradients add up to every element of
 * every family counted once, and each shard lies inside the rank's local slice. Also
 * checks the decay groups (2-D and 3-D weights only). */
static void test_sharded_norm(int tp, int dp, int pp, int ep, int zero) {
  mc_model m = tiny();
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = tp, l.dp = dp, l.pp = pp, l.ep = ep, l.zero = zero, l.sp = (tp > 1 && ep > 1);
  mc_geometry g;
  if (mc_geometry_build(&m, &l, NULL, -1, &g) != 0) {
    CHECK(0, "geometry tp=%d dp=%d pp=%d ep=%d zero=%d: %s", tp, dp, pp, ep, zero, mc_errmsg());
    return;
  }
  double total = 0, expect = 0;
  for (int f = 0; f < g.fams.n; f++) {
    expect += (double)g.fams.f[f].numel;
    CHECK(g.fams.f[f].decay == (g.fams.f[f].ndim >= 2), "%s decay=%d ndim=%d", g.fams.f[f].name,
          g.fams.f[f].decay, g.fams.f[f].ndim);
  }
  for (int r = 0; r < g.world; r++) {
    mc_optim o;
    CHECK_OK(mc_optim_init(&o, &g, r));
    float **grads = calloc((size_t)o.n + 1, sizeof *grads);
    for (int i = 0; i < o.n; i++) {
      const mc_shard *sh = &o.slots[i].shard;
      int64_t local = 1;
      for (int k = 0; k < sh->ndim; k++) local *= sh->local_count[k];
      CHECK(o.slots[i].offset >= 0 && o.slots[i].offset + o.slots[i].numel <= local,
            "%s rank %d: shard [%lld, +%lld) outside local slice of %lld", g.fams.f[o.slots[i].fam].name, r,
            (long long)o.slots[i].offset, (long long)o.slots[i].numel, (long long)local);
      CHECK(o.slots[i].decay == g.fams.f[o.slots[i].fam].decay, "decay group");
      grads[i] = malloc(sizeof(float) * (size_t)(local > 0 ? local : 1));
      for (int64_t k = 0; k < local; k++) grads[i][k] = 1.0f;
    }
    total += mc_optim_grad_sq(&o, grads);
    for (int i = 0; i < o.n; i++) free(grads[i]);
    free(grads);
    mc_optim_free(&o);
  }
  CHECK(total == expect, "tp=%d dp=%d pp=%d ep=%d zero=%d: primaries cover %.0f of %.0f elements", tp, dp, pp,
        ep, zero, total, expect);
  mc_geometry_free(&g);
}

int main(void) {
  test_schedule();
  test_clip();
  test_adamw(1, 1.0);
  test_adamw(0, 1.0);
  test_adamw(1, 0.25); /* clipping scales the gradient before the moments */
  test_family_steps();
  test_sharded_norm(1, 1, 1, 1, 0);
  test_sharded_norm(2, 1, 1, 1, 0);
  test_sharded_norm(1, 2, 1, 1, 0);
  test_sharded_norm(1, 2, 1, 1, 1);
  test_sharded_norm(2, 2, 2, 1, 1);
  test_sharded_norm(1, 4, 1, 2, 1);
  test_sharded_norm(1, 3, 2, 1, 3);
  return mc_check_exit("test_optim");
}
