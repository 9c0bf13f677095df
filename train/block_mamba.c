/* M block: Mamba-2 style mixer.
 *   z = u wz^T, xr = u wx^T, Br = u wB^T, Cr = u wC^T, dt = softplus(u wdt^T + dt_bias)
 *   xc, Bc, Cc = silu(causal depthwise conv(xr | Br | Cr) + bias)  (one op each: conv_silu)
 *   y = selective scan(xc, dt, A = -exp(A_log), Bc, Cc) + D xc
 *   g = y * silu(z), gn = RMSNorm per head (group hdm) of g times norm.weight, x += gn wout^T
 *   (g is never stored: gated_rmsnorm recomputes it from y and z)
 * Under mc_act16 z and gn (they feed only the gate and products) and the gradients of the
 * projections' outputs (dz, dx, dB, dC) are kept in bf16; the conv, scan and norm inputs stay
 * fp32.
 * The buffers are the M row of core/blocks.h. */
#include "train/net_blocks.h"

/* Everything after the projections (and dt's bias): softplus, the convs and their SiLU, the
 * scan and the gated norm, from z, x, B, C and dt_pre (what selective recomputation
 * rebuilds). */
static int mamba_inner(struct mc_net *net, mc_layer *L, int n_seq) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, di = m->mamba_inner, hm = mc_mamba_heads(m);
  const int N = m->ssm_state, K = m->conv_width;
  float **f = L->f;
  be->act_fwd(be, MC_ACT_SOFTPLUS, f[MC_M_DTP], f[MC_M_DT], (int64_t)n * hm);
  be->conv_silu_fwd(be, f[MC_M_XR], mc_w(net, L, MC_ROLE_SSM_CONVX_W), mc_w(net, L, MC_ROLE_SSM_CONVX_B), n_seq, T, di, K, f[MC_M_XC]);
  be->conv_silu_fwd(be, f[MC_M_BR], mc_w(net, L, MC_ROLE_SSM_CONVB_W), mc_w(net, L, MC_ROLE_SSM_CONVB_B), n_seq, T, N, K, f[MC_M_BC]);
  be->conv_silu_fwd(be, f[MC_M_CR], mc_w(net, L, MC_ROLE_SSM_CONVC_W), mc_w(net, L, MC_ROLE_SSM_CONVC_B), n_seq, T, N, K, f[MC_M_CC]);
  be->ssm_fwd(be, f[MC_M_XC], f[MC_M_DT], mc_w(net, L, MC_ROLE_SSM_A_LOG), f[MC_M_BC], f[MC_M_CC], mc_w(net, L, MC_ROLE_SSM_D), n_seq, T,
              hm, m->mamba_head_dim, N, f[MC_M_Y]);
  be->gated_rmsnorm_fwd(be, f[MC_M_Y], mc_saved_in(L, MC_M_Z), mc_w(net, L, MC_ROLE_SSM_NORM), n, di, m->mamba_head_dim,
                        (float)m->norm_eps, mc_saved_out(L, MC_M_GN), f[MC_M_GRSTD]);
  return 0;
}

static int mamba_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, di = m->mamba_inner, hm = mc_mamba_heads(m);
  const int N = m->ssm_state;
  float **f = L->f;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WZ), n, d, di, 0.0f, mc_saved_out(L, MC_M_Z));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WX), n, d, di, 0.0f, mc_o32(f[MC_M_XR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WB), n, d, N, 0.0f, mc_o32(f[MC_M_BR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WC), n, d, N, 0.0f, mc_o32(f[MC_M_CR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WDT), n, d, hm, 0.0f, mc_o32(f[MC_M_DTP]));
  be->bias_fwd(be, f[MC_M_DTP], mc_w(net, L, MC_ROLE_SSM_DT_BIAS), n, hm);
  mamba_inner(net, L, n_seq);
  if (x) mc_linear_fwd(be, mc_saved_in(L, MC_M_GN), mc_wm(net, L, MC_ROLE_SSM_WOUT), n, di, d, 1.0f, mc_o32(x));
  return 0;
}

/* conv + SiLU backward for one of the three conv branches: dout (the gradient of the SiLU output)
 * -> (the gradient of the conv's input, scratch buffer dxin, and of the conv's w and b). */
static void conv_silu_bwd(struct mc_net *net, mc_layer *L, int n_seq, int c, const float *xin, const float *dout, int dxin,
                          mc_role w, mc_role b) {
  const int T = net->m.seq_len;
  net->be->conv_silu_bwd(net->be, xin, mc_w(net, L, w), mc_w(net, L, b), dout, n_seq, T, c, net->m.conv_width,
                         mc_scratch_grad(net, L, dxin, (int64_t)n_seq * T * c), mc_g(net, L, w), mc_g(net, L, b));
}

static int mamba_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                          double seq_weight) {
  (void)seq_weight;
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, di = m->mamba_inner, hm = mc_mamba_heads(m);
  const int N = m->ssm_state;
  const int64_t nd = (int64_t)n * di, nn = (int64_t)n * N, nh = (int64_t)n * hm;
  float **f = L->f, **g = net->g;
  mc_linear_bwd(be, mc_saved_in(L, MC_M_GN), mc_wm(net, L, MC_ROLE_SSM_WOUT), mc_dy_in(net, dy, (int64_t)n * d), n, di, d,
                mc_o32(g[MC_M_DGN]), 0.0f, mc_g(net, L, MC_ROLE_SSM_WOUT));
  be->gated_rmsnorm_bwd(be, f[MC_M_Y], mc_saved_in(L, MC_M_Z), mc_w(net, L, MC_ROLE_SSM_NORM), f[MC_M_GRSTD], g[MC_M_DGN], n,
                        di, m->mamba_head_dim, mc_zeroed(be, g[MC_M_DY], nd), mc_scratch_grad(net, L, MC_M_DZ, nd),
                        mc_g(net, L, MC_ROLE_SSM_NORM));
  be->ssm_bwd(be, f[MC_M_XC], f[MC_M_DT], mc_w(net, L, MC_ROLE_SSM_A_LOG), f[MC_M_BC], f[MC_M_CC], mc_w(net, L, MC_ROLE_SSM_D), g[MC_M_DY],
              n_seq, T, hm, m->mamba_head_dim, N, mc_zeroed(be, g[MC_M_DXC], nd), mc_zeroed(be, g[MC_M_DDT], nh),
              mc_g(net, L, MC_ROLE_SSM_A_LOG), mc_zeroed(be, g[MC_M_DBC], nn), mc_zeroed(be, g[MC_M_DCC], nn),
              mc_g(net, L, MC_ROLE_SSM_D));
  be->act_bwd(be, MC_ACT_SOFTPLUS, f[MC_M_DTP], g[MC_M_DDT], mc_zeroed(be, g[MC_M_DDTP], nh), nh);
  be->bias_bwd(be, g[MC_M_DDTP], n, hm, mc_g(net, L, MC_ROLE_SSM_DT_BIAS));
  conv_silu_bwd(net, L, n_seq, di, f[MC_M_XR], g[MC_M_DXC], MC_M_DXR, MC_ROLE_SSM_CONVX_W, MC_ROLE_SSM_CONVX_B);
  conv_silu_bwd(net, L, n_seq, N, f[MC_M_BR], g[MC_M_DBC], MC_M_DBR, MC_ROLE_SSM_CONVB_W, MC_ROLE_SSM_CONVB_B);
  conv_silu_bwd(net, L, n_seq, N, f[MC_M_CR], g[MC_M_DCC], MC_M_DCR, MC_ROLE_SSM_CONVC_W, MC_ROLE_SSM_CONVC_B);
  const mc_in_proj in[] = {
      {mc_wm(net, L, MC_ROLE_SSM_WZ), mc_scratch_in(net, L, MC_M_DZ), di, mc_g(net, L, MC_ROLE_SSM_WZ)},
      {mc_wm(net, L, MC_ROLE_SSM_WX), mc_scratch_in(net, L, MC_M_DXR), di, mc_g(net, L, MC_ROLE_SSM_WX)},
      {mc_wm(net, L, MC_ROLE_SSM_WB), mc_scratch_in(net, L, MC_M_DBR), N, mc_g(net, L, MC_ROLE_SSM_WB)},
      {mc_wm(net, L, MC_ROLE_SSM_WC), mc_scratch_in(net, L, MC_M_DCR), N, mc_g(net, L, MC_ROLE_SSM_WC)},
      {mc_wm(net, L, MC_ROLE_SSM_WDT), mc_f32(g[MC_M_DDTP]), hm, mc_g(net, L, MC_ROLE_SSM_WDT)}};
  return mc_in_projs_bwd(net, L, in, 5, n, du);
}

const mc_block_ops mc_block_mamba = {'M', mamba_forward, mamba_backward, mamba_inner};
