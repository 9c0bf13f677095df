/* MoE and head edge cases of the network: capacity dropping (gradients still match finite
 * differences, and a token whose assignments are all dropped leaves the block unchanged),
 * experts that receive no token, padded vocabulary rows (zero gradient, never win), the
 * layout guard, and the layout-independent initialisation. Tolerance in netcheck.h. */
#include "tests/train/netcheck.h"

static void check_capacity(void) {
  printf("capacity dropping\n");
  mc_model m = nc_model("E");
  m.capacity_factor = 0.5; /* C = ceil(6 * 2 / 4 * 0.5) = 2 per expert per sequence */
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 11);
  if (!net) return;
  const int n_seq = 2, T = m.seq_len, d = m.d_model, k = m.top_k;
  int32_t *tok = nc_tokens(&m, n_seq, 4);
  nc_obj o = {net, tok, n_seq, 1.0 / (n_seq * T), 1.0 / n_seq, 0};
  mc_net_stats st;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, n_seq, o.cw, o.sw, &st));
  /* 12 assignments per sequence, at most 2 * 4 = 8 kept */
  CHECK(st.dropped >= 8, "dropped %lld, want >= 8", (long long)st.dropped);
  /* the residual passes through where every assignment of a token was dropped, and only there */
  mc_layer *L = &net->layers[0];
  int all_dropped = 0;
  for (int r = 0; r < n_seq * T; r++) {
    int kept = 0;
    for (int j = 0; j < k; j++) kept += L->i[1][r * k + j] >= 0;
    float diff = 0;
    for (int c = 0; c < d; c++) diff += fabsf(net->x[r * d + c] - L->x_in[r * d + c]);
    if (!kept) {
      all_dropped++;
      CHECK(diff == 0.0f, "token %d: all assignments dropped but the block changed it by %g", r, diff);
    } else {
      CHECK(diff > 0.0f, "token %d keeps %d assignments but is unchanged", r, kept);
    }
  }
  CHECK(all_dropped > 0, "the test wants a token with every assignment dropped");
  for (int i = 0; i < mc_net_n_params(net); i++) nc_check_param(&o, i, 64);
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* A zero router makes every probability equal: ties go to the lower index, so experts 0 and 1
 * take every token and experts 2 and 3 none. Their weights get exactly zero gradient, and
 * the other families still match finite differences. */
static void check_idle_experts(void) {
  printf("experts without tokens\n");
  mc_model m = nc_model("AE");
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 12);
  if (!net) return;
  int router = nc_param(net, "layers.01.moe.router");
  mc_net_param *rp = mc_net_param_at(net, router);
  net->be->fill(net->be, rp->w, rp->numel, 0.0f);
  int32_t *tok = nc_tokens(&m, 2, 5);
  nc_obj o = {net, tok, 2, 1.0 / 12, 0.5, 0};
  mc_net_stats st;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, 2, o.cw, o.sw, &st));
  const int32_t *cnt = net->layers[1].counts_host;
  CHECK(cnt[0] == 12 && cnt[1] == 12 && cnt[2] == 0 && cnt[3] == 0, "counts %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
  const char *w[3] = {"layers.01.moe.w1", "layers.01.moe.w3", "layers.01.moe.w2"};
  for (int i = 0; i < 3; i++) {
    mc_net_param *p = mc_net_param_at(net, nc_param(net, w[i]));
    int64_t per = p->numel / m.n_experts;
    int nz_idle = 0, nz_busy = 0;
    for (int64_t e = 0; e < p->numel; e++) {
      if (e >= 2 * per) nz_idle += p->g[e] != 0.0f;
      else nz_busy += p->g[e] != 0.0f;
    }
    CHECK(nz_idle == 0, "%s: idle experts have %d nonzero gradients", w[i], nz_idle);
    CHECK(nz_busy > 0, "%s: busy experts have no gradient", w[i]);
  }
  /* the router sits on a tie (finite differences flip it); every other family is checked */
  for (int i = 0; i < mc_net_n_params(net); i++)
    if (i != router) nc_check_param(&o, i, 32);
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* Padded head rows (V..Vp-1) never win and get zero gradient; padded embedding rows are
 * never read. */
static void check_padded_vocab(void) {
  printf("padded vocabulary\n");
  mc_model m = nc_model("R");
  mc_geometry geo;
  mc_net *net = nc_net(&m, &geo, 13);
  if (!net) return;
  const int V = m.vocab_size, Vp = mc_vocab_padded(&m), d = m.d_model;
  CHECK(Vp == 16, "Vp %d", Vp);
  int32_t *tok = nc_tokens(&m, 2, 6);
  mc_net_stats a, b;
  mc_net_zero_grad(net);
  CHECK_OK(mc_net_forward_backward(net, tok, 2, 1.0, 1.0, &a));
  mc_net_param *head = mc_net_param_at(net, nc_param(net, "head.weight"));
  mc_net_param *emb = mc_net_param_at(net, nc_param(net, "embed.weight"));
  int nz = 0;
  for (int64_t e = (int64_t)V * d; e < (int64_t)Vp * d; e++) nz += head->g[e] != 0.0f || emb->g[e] != 0.0f;
  CHECK(nz == 0, "%d nonzero gradients on padded rows", nz);
  /* padded head rows with huge logits change nothing */
  for (int64_t e = (int64_t)V * d; e < (int64_t)Vp * d; e++) head->w[e] = 1e4f;
  CHECK_OK(mc_net_forward(net, tok, 2, &b));
  CHECK(a.ce_sum == b.ce_sum, "padded rows changed the loss: %.9g vs %.9g", a.ce_sum, b.ce_sum);
  /* a token id outside the real vocabulary is an error naming it */
  tok[3] = V;
  CHECK(mc_net_forward(net, tok, 2, &b) != 0 && strstr(mc_errmsg(), "token id 11"), "bad token: %s", mc_errmsg());
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* A multi-rank layout without communicators (tensor parallel, pipeline stages) is refused
 * with a message naming what is missing. */
static void check_layout_guard(void) {
  mc_model m = nc_model("AE");
  mc_layout l = nc_layout(2, 1, 1);
  mc_geometry geo;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &geo));
  mc_net *net = mc_net_create(&geo, 0, 1);
  CHECK(net == NULL && strstr(mc_errmsg(), "(tp=2 dp=1) needs the layout's communicator groups"), "tp=2: %s", mc_errmsg());
  mc_net_free(net);
  mc_geometry_free(&geo);
  l = nc_layout(1, 1, 1);
  l.pp = 2;
  CHECK_OK(mc_geometry_build(&m, &l, NULL, -1, &geo));
  net = mc_net_create(&geo, 0, 1);
  /* pipeline stages run under mpirun (train/pipeline.h): without communicators pp=2 is refused too */
  CHECK(net == NULL && strstr(mc_errmsg(), "needs the layout's communicator groups"), "pp=2: %s", mc_errmsg());
  mc_net_free(net);
  mc_geometry_free(&geo);
}

/* Initial values are a function of (seed, family name, global element index) only. */
static void check_init(void) {
  mc_model m = nc_model("MR");
  mc_geometry geo;
  mc_net *a = nc_net(&m, &geo, 77), *b = mc_net_create(&geo, 0, 77), *c = mc_net_create(&geo, 0, 78);
  if (!a || !b || !c) return;
  int same = 1, differ = 0;
  for (int i = 0; i < mc_net_n_params(a); i++) {
    mc_net_param *pa = mc_net_param_at(a, i), *pb = mc_net_param_at(b, i), *pc = mc_net_param_at(c, i);
    same &= memcmp(pa->w, pb->w, (size_t)pa->numel * sizeof(float)) == 0;
    differ += memcmp(pa->w, pc->w, (size_t)pa->numel * sizeof(float)) != 0;
  }
  CHECK(same, "same seed, different weights");
  CHECK(differ > 0, "seed does not matter");
  mc_net_param *wq = mc_net_param_at(a, nc_param(a, "layers.00.ssm.w_x"));
  /* element (row 3, col 5) of [Di, d] is global index 3*d + 5 */
  double want = m.init_std * mc_rng_normal(77, mc_rng_stream_of("layers.00.ssm.w_x"), 3 * 8 + 5);
  CHECK_CLOSE(wq->w[3 * 8 + 5], want, 1e-6);
  mc_net_param *out = mc_net_param_at(a, nc_param(a, "layers.01.rec.w_out"));
  want = m.init_std / sqrt(4.0) * mc_rng_normal(77, mc_rng_stream_of("layers.01.rec.w_out"), 7);
  CHECK_CLOSE(out->w[7], want, 1e-6);
  mc_net_param *al = mc_net_param_at(a, nc_param(a, "layers.00.ssm.A_log"));
  CHECK(al->w[0] == 0.0f && fabs(al->w[1] - log(2.0)) < 1e-7, "A_log %g %g", al->w[0], al->w[1]);
  mc_net_param *dtb = mc_net_param_at(a, nc_param(a, "layers.00.ssm.dt_bias"));
  for (int h = 0; h < 2; h++) {
    double dt = log1p(exp(dtb->w[h]));
    CHECK(dt >= 0.999e-3 && dt <= 1.001e-1, "dt %g outside [1e-3, 1e-1]", dt);
  }
  mc_net_param *lam = mc_net_param_at(a, nc_param(a, "layers.01.rec.lambda"));
  for (int i = 0; i < 6; i++) {
    double av = exp(-8.0 * log1p(exp(lam->w[i])));
    CHECK(av >= 0.8999 && av <= 0.9991, "a %g outside [0.9, 0.999]", av);
  }
  mc_net_param *cw = mc_net_param_at(a, nc_param(a, "layers.00.ssm.conv_x.weight"));
  CHECK_CLOSE(cw->w[4], mc_rng_normal(77, mc_rng_stream_of("layers.00.ssm.conv_x.weight"), 4) / sqrt(3.0), 1e-6);
  mc_net_free(a), mc_net_free(b), mc_net_free(c);
  mc_geometry_free(&geo);
}

int main(void) {
  check_capacity();
  check_idle_experts();
  check_padded_vocab();
  check_layout_guard();
  check_init();
  return mc_check_exit("test_grad_moe");
}
