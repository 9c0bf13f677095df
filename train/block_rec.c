/* R block: RG-LRU style gated linear recurrence (channel-local).
 *   xb = u wx^T, r = sigmoid(u wr^T + b_r), ip = u wi^T + b_i, gx = sigmoid(ip) * xb,
 *   h = RG-LRU(gx, r, lambda), o = h * gelu(u wgate^T), x += o wout^T
 * Under mc_act16 the tensors that feed only gated units and products are kept in bf16: xb,
 * u wgate^T, o, and their gradients dout, d(u wgate^T), dxb; the rest stays fp32 (biases,
 * the recurrence).
 * The buffers are the R row of core/blocks.h. */
#include "train/net_blocks.h"

/* Everything after the projections (and their biases): the gates, the recurrence and the
 * output gate, from xb, gate_pre, r_pre and i_pre (what selective recomputation rebuilds). */
static int rec_inner(struct mc_net *net, mc_layer *L, int n_seq) {
  mc_backend *be = net->be;
  const int T = net->m.seq_len, dr = net->m.rec_width;
  const int64_t nd = (int64_t)n_seq * T * dr;
  float **f = L->f;
  be->act_fwd(be, MC_ACT_SIGMOID, f[MC_R_RP], f[MC_R_R], nd);
  be->glu_fwd(be, MC_ACT_SIGMOID, mc_f32(f[MC_R_IP]), mc_saved_in(L, MC_R_XB), mc_o32(f[MC_R_GX]), nd);
  be->rglru_fwd(be, f[MC_R_GX], f[MC_R_R], mc_w(net, L, MC_ROLE_REC_LAMBDA), n_seq, T, dr, f[MC_R_H]);
  be->glu_fwd(be, MC_ACT_GELU, mc_saved_in(L, MC_R_GP), mc_f32(f[MC_R_H]), mc_saved_out(L, MC_R_O), nd);
  return 0;
}

static int rec_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, dr = m->rec_width;
  float **f = L->f;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WX), n, d, dr, 0.0f, mc_saved_out(L, MC_R_XB));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WGATE), n, d, dr, 0.0f, mc_saved_out(L, MC_R_GP));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WR), n, d, dr, 0.0f, mc_o32(f[MC_R_RP]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_REC_WI), n, d, dr, 0.0f, mc_o32(f[MC_R_IP]));
  be->bias_fwd(be, f[MC_R_RP], mc_w(net, L, MC_ROLE_REC_BR), n, dr);
  be->bias_fwd(be, f[MC_R_IP], mc_w(net, L, MC_ROLE_REC_BI), n, dr);
  rec_inner(net, L, n_seq);
  if (x) mc_linear_fwd(be, mc_saved_in(L, MC_R_O), mc_wm(net, L, MC_ROLE_REC_WOUT), n, dr, d, 1.0f, mc_o32(x));
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
  mc_linear_bwd(be, mc_saved_in(L, MC_R_O), mc_wm(net, L, MC_ROLE_REC_WOUT), mc_dy_in(net, dy, (int64_t)n * d), n, dr, d,
                mc_scratch_out(net, L, MC_R_DO), 0.0f, mc_g(net, L, MC_ROLE_REC_WOUT));
  be->glu_bwd(be, MC_ACT_GELU, mc_saved_in(L, MC_R_GP), mc_f32(f[MC_R_H]), mc_scratch_in(net, L, MC_R_DO), mc_scratch_grad(net, L, MC_R_DGP, nd),
              mc_o32(mc_zeroed(be, g[MC_R_DH], nd)), nd);
  be->rglru_bwd(be, f[MC_R_GX], f[MC_R_R], mc_w(net, L, MC_ROLE_REC_LAMBDA), f[MC_R_H], g[MC_R_DH], n_seq, T, dr,
                mc_zeroed(be, g[MC_R_DGX], nd), mc_zeroed(be, g[MC_R_DR], nd), mc_g(net, L, MC_ROLE_REC_LAMBDA));
  be->glu_bwd(be, MC_ACT_SIGMOID, mc_f32(f[MC_R_IP]), mc_saved_in(L, MC_R_XB), mc_f32(g[MC_R_DGX]), mc_o32(mc_zeroed(be, g[MC_R_DIP], nd)),
              mc_scratch_grad(net, L, MC_R_DXB, nd), nd);
  be->act_bwd(be, MC_ACT_SIGMOID, f[MC_R_RP], g[MC_R_DR], mc_zeroed(be, g[MC_R_DRP], nd), nd);
  be->bias_bwd(be, g[MC_R_DRP], n, dr, mc_g(net, L, MC_ROLE_REC_BR));
  be->bias_bwd(be, g[MC_R_DIP], n, dr, mc_g(net, L, MC_ROLE_REC_BI));
  const mc_in_proj in[] = {
      {mc_wm(net, L, MC_ROLE_REC_WX), mc_scratch_in(net, L, MC_R_DXB), dr, mc_g(net, L, MC_ROLE_REC_WX)},
      {mc_wm(net, L, MC_ROLE_REC_WGATE), mc_scratch_in(net, L, MC_R_DGP), dr, mc_g(net, L, MC_ROLE_REC_WGATE)},
      {mc_wm(net, L, MC_ROLE_REC_WR), mc_f32(g[MC_R_DRP]), dr, mc_g(net, L, MC_ROLE_REC_WR)},
      {mc_wm(net, L, MC_ROLE_REC_WI), mc_f32(g[MC_R_DIP]), dr, mc_g(net, L, MC_ROLE_REC_WI)}};
  return mc_in_projs_bwd(net, L, in, 4, n, du);
}

const mc_block_ops mc_block_rec = {'R', rec_forward, rec_backward, rec_inner};
