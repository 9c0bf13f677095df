/* R block: RG-LRU style gated linear recurrence (channel-local).
 *   xb = u wx^T, r = sigmoid(u wr^T + b_r), ip = u wi^T + b_i, gx = sigmoid(ip) * xb,
 *   h = RG-LRU(gx, r, lambda), o = h * gelu(u wgate^T), x += o wout^T
 * Under mc_act16 the tensors that feed only gated units and products are kept in bf16: xb,
 * u wgate^T, o, and their gradients dout, d(u wgate^T), dxb; the rest stays fp32 (biases,
 * the recurrence). */
#include "train/net_blocks.h"

enum { XB, GP, RP, R, IP, GX, H, O };        /* saved */
enum { DO, DGP, DH, DGX, DR, DRP, DIP, DXB }; /* grads */

static void rec_sizes(const struct mc_net *net, int n_seq, mc_block_sizes *s) {
  const mc_model *m = &net->m; /* its u16 is the layer's (train/net.c) */
  int64_t nd = (int64_t)n_seq * m->seq_len * m->rec_width, h = mc_a16_floats(net, nd);
  for (int i = XB; i <= O; i++) s->f[i] = nd;
  s->f[XB] = s->f[GP] = s->f[O] = h;
  for (int i = DO; i <= DXB; i++) s->g[i] = nd;
  s->g[DO] = s->g[DGP] = s->g[DXB] = h;
}

static int rec_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, dr = m->rec_width;
  const int64_t nd = (int64_t)n * dr;
  float **f = L->f;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WX), n, d, dr, 0.0f, mc_a16_dst(net, f[XB]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WGATE), n, d, dr, 0.0f, mc_a16_dst(net, f[GP]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WR), n, d, dr, 0.0f, mc_o32(f[RP]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WI), n, d, dr, 0.0f, mc_o32(f[IP]));
  be->bias_fwd(be, f[RP], mc_w(net, L, MC_ROLE_REC_BR), n, dr);
  be->bias_fwd(be, f[IP], mc_w(net, L, MC_ROLE_REC_BI), n, dr);
  be->act_fwd(be, MC_ACT_SIGMOID, f[RP], f[R], nd);
  be->glu_fwd(be, MC_ACT_SIGMOID, mc_f32(f[IP]), mc_a16_in(net, f[XB]), mc_o32(f[GX]), nd);
  be->rglru_fwd(be, f[GX], f[R], mc_w(net, L, MC_ROLE_REC_LAMBDA), n_seq, T, dr, f[H]);
  be->glu_fwd(be, MC_ACT_GELU, mc_a16_in(net, f[GP]), mc_f32(f[H]), mc_a16_dst(net, f[O]), nd);
  mc_linear_fwd(be, mc_a16_in(net, f[O]), mc_wm(net, L, MC_ROLE_REC_WOUT), n, dr, d, 1.0f, mc_o32(x));
  return 0;
}

static int rec_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                        double seq_weight) {
  (void)seq_weight;
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, dr = m->rec_width;
  const int64_t nd = (int64_t)n * dr;
  float **f = L->f, **g = net->g;
  mc_linear_bwd(be, mc_a16_in(net, f[O]), mc_wm(net, L, MC_ROLE_REC_WOUT), mc_dy_in(net, dy, (int64_t)n * d), n, dr, d,
                mc_a16_dst(net, g[DO]), 0.0f, mc_g(net, L, MC_ROLE_REC_WOUT));
  be->glu_bwd(be, MC_ACT_GELU, mc_a16_in(net, f[GP]), mc_f32(f[H]), mc_a16_in(net, g[DO]), mc_a16_grad(net, g[DGP], nd),
              mc_o32(mc_zeroed(be, g[DH], nd)), nd);
  be->rglru_bwd(be, f[GX], f[R], mc_w(net, L, MC_ROLE_REC_LAMBDA), f[H], g[DH], n_seq, T, dr,
                mc_zeroed(be, g[DGX], nd), mc_zeroed(be, g[DR], nd), mc_g(net, L, MC_ROLE_REC_LAMBDA));
  be->glu_bwd(be, MC_ACT_SIGMOID, mc_f32(f[IP]), mc_a16_in(net, f[XB]), mc_f32(g[DGX]), mc_o32(mc_zeroed(be, g[DIP], nd)),
              mc_a16_grad(net, g[DXB], nd), nd);
  be->act_bwd(be, MC_ACT_SIGMOID, f[RP], g[DR], mc_zeroed(be, g[DRP], nd), nd);
  be->bias_bwd(be, g[DRP], n, dr, mc_g(net, L, MC_ROLE_REC_BR));
  be->bias_bwd(be, g[DIP], n, dr, mc_g(net, L, MC_ROLE_REC_BI));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WX), mc_a16_in(net, g[DXB]), n, d, dr, mc_o32(du), 0.0f,
                mc_g(net, L, MC_ROLE_REC_WX));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WGATE), mc_a16_in(net, g[DGP]), n, d, dr, mc_o32(du), 1.0f,
                mc_g(net, L, MC_ROLE_REC_WGATE));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WR), mc_f32(g[DRP]), n, d, dr, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_REC_WR));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WI), mc_f32(g[DIP]), n, d, dr, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_REC_WI));
  return 0;
}

const mc_block_ops mc_block_rec = {'R', rec_sizes, rec_forward, rec_backward};
