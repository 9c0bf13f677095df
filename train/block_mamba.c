/* M block: Mamba-2 style mixer.
 *   z = u wz^T, xr = u wx^T, Br = u wB^T, Cr = u wC^T, dt = softplus(u wdt^T + dt_bias)
 *   xc, Bc, Cc = silu(causal depthwise conv(xr | Br | Cr) + bias)
 *   y = selective scan(xc, dt, A = -exp(A_log), Bc, Cc) + D xc
 *   g = y * silu(z), gn = RMSNorm per head (group hdm) of g times norm.weight, x += gn wout^T
 * Under mc_act16 z and gn (they feed only the gate and products) and dz are kept in bf16; the
 * conv, scan and norm inputs stay fp32. */
#include "train/net_blocks.h"

enum { Z, XR, XCP, XC, BR, BCP, BC, CR, CCP, CC, DTP, DT, Y, G, GN, GRSTD }; /* saved */
enum { DGN, DG, DZ, DY, DXC, DXCP, DXR, DBC, DBCP, DBR, DCC, DCCP, DCR, DDT, DDTP }; /* grads */

static void mamba_sizes(const struct mc_net *net, int n_seq, mc_block_sizes *s) {
  const mc_model *m = &net->m; /* its u16 is the layer's (train/net.c) */
  int64_t n = (int64_t)n_seq * m->seq_len, di = m->mamba_inner, hm = mc_mamba_heads(m), N = m->ssm_state;
  for (int i = Z; i <= XC; i++) s->f[i] = n * di;
  s->f[Z] = mc_a16_floats(net, n * di);
  for (int i = BR; i <= CC; i++) s->f[i] = n * N;
  s->f[DTP] = s->f[DT] = n * hm;
  s->f[Y] = s->f[G] = n * di;
  s->f[GN] = mc_a16_floats(net, n * di);
  s->f[GRSTD] = n * hm;
  for (int i = DGN; i <= DXR; i++) s->g[i] = n * di;
  s->g[DZ] = mc_a16_floats(net, n * di);
  for (int i = DBC; i <= DCR; i++) s->g[i] = n * N;
  s->g[DDT] = s->g[DDTP] = n * hm;
}

static int mamba_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, di = m->mamba_inner, hm = mc_mamba_heads(m);
  const int N = m->ssm_state, K = m->conv_width;
  float **f = L->f;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WZ), n, d, di, 0.0f, mc_a16_dst(net, f[Z]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WX), n, d, di, 0.0f, mc_o32(f[XR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WB), n, d, N, 0.0f, mc_o32(f[BR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WC), n, d, N, 0.0f, mc_o32(f[CR]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WDT), n, d, hm, 0.0f, mc_o32(f[DTP]));
  be->bias_fwd(be, f[DTP], mc_w(net, L, MC_ROLE_SSM_DT_BIAS), n, hm);
  be->act_fwd(be, MC_ACT_SOFTPLUS, f[DTP], f[DT], (int64_t)n * hm);
  be->conv_fwd(be, f[XR], mc_w(net, L, MC_ROLE_SSM_CONVX_W), mc_w(net, L, MC_ROLE_SSM_CONVX_B), n_seq, T, di, K, f[XCP]);
  be->conv_fwd(be, f[BR], mc_w(net, L, MC_ROLE_SSM_CONVB_W), mc_w(net, L, MC_ROLE_SSM_CONVB_B), n_seq, T, N, K, f[BCP]);
  be->conv_fwd(be, f[CR], mc_w(net, L, MC_ROLE_SSM_CONVC_W), mc_w(net, L, MC_ROLE_SSM_CONVC_B), n_seq, T, N, K, f[CCP]);
  be->act_fwd(be, MC_ACT_SILU, f[XCP], f[XC], (int64_t)n * di);
  be->act_fwd(be, MC_ACT_SILU, f[BCP], f[BC], (int64_t)n * N);
  be->act_fwd(be, MC_ACT_SILU, f[CCP], f[CC], (int64_t)n * N);
  be->ssm_fwd(be, f[XC], f[DT], mc_w(net, L, MC_ROLE_SSM_A_LOG), f[BC], f[CC], mc_w(net, L, MC_ROLE_SSM_D), n_seq, T,
              hm, m->mamba_head_dim, N, f[Y]);
  be->glu_fwd(be, MC_ACT_SILU, mc_a16_in(net, f[Z]), mc_f32(f[Y]), mc_o32(f[G]), (int64_t)n * di);
  be->rmsnorm_fwd(be, f[G], mc_w(net, L, MC_ROLE_SSM_NORM), n, di, m->mamba_head_dim, (float)m->norm_eps,
                  mc_a16_dst(net, f[GN]), f[GRSTD]);
  mc_linear_fwd(be, mc_a16_in(net, f[GN]), mc_wm(net, L, MC_ROLE_SSM_WOUT), n, di, d, 1.0f, mc_o32(x));
  return 0;
}

/* conv + SiLU backward for one of the three conv branches: dpre -> (dxin, dw, db). */
static void conv_silu_bwd(struct mc_net *net, mc_layer *L, int n_seq, int c, const float *xin, const float *pre,
                          const float *dout, float *dpre, float *dxin, mc_role w, mc_role b) {
  mc_backend *be = net->be;
  const int T = net->m.seq_len;
  const int64_t cnt = (int64_t)n_seq * T * c;
  be->act_bwd(be, MC_ACT_SILU, pre, dout, mc_zeroed(be, dpre, cnt), cnt);
  be->conv_bwd(be, xin, mc_w(net, L, w), dpre, n_seq, T, c, net->m.conv_width, mc_zeroed(be, dxin, cnt),
               mc_g(net, L, w), mc_g(net, L, b));
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
  mc_linear_bwd(be, mc_a16_in(net, f[GN]), mc_wm(net, L, MC_ROLE_SSM_WOUT), mc_dy_in(net, dy, (int64_t)n * d), n, di, d,
                mc_o32(g[DGN]), 0.0f, mc_g(net, L, MC_ROLE_SSM_WOUT));
  be->rmsnorm_bwd(be, f[G], mc_w(net, L, MC_ROLE_SSM_NORM), f[GRSTD], g[DGN], n, di, m->mamba_head_dim,
                  mc_zeroed(be, g[DG], nd), mc_g(net, L, MC_ROLE_SSM_NORM));
  be->glu_bwd(be, MC_ACT_SILU, mc_a16_in(net, f[Z]), mc_f32(f[Y]), mc_f32(g[DG]), mc_a16_grad(net, g[DZ], nd),
              mc_o32(mc_zeroed(be, g[DY], nd)), nd);
  be->ssm_bwd(be, f[XC], f[DT], mc_w(net, L, MC_ROLE_SSM_A_LOG), f[BC], f[CC], mc_w(net, L, MC_ROLE_SSM_D), g[DY],
              n_seq, T, hm, m->mamba_head_dim, N, mc_zeroed(be, g[DXC], nd), mc_zeroed(be, g[DDT], nh),
              mc_g(net, L, MC_ROLE_SSM_A_LOG), mc_zeroed(be, g[DBC], nn), mc_zeroed(be, g[DCC], nn),
              mc_g(net, L, MC_ROLE_SSM_D));
  be->act_bwd(be, MC_ACT_SOFTPLUS, f[DTP], g[DDT], mc_zeroed(be, g[DDTP], nh), nh);
  be->bias_bwd(be, g[DDTP], n, hm, mc_g(net, L, MC_ROLE_SSM_DT_BIAS));
  conv_silu_bwd(net, L, n_seq, di, f[XR], f[XCP], g[DXC], g[DXCP], g[DXR], MC_ROLE_SSM_CONVX_W, MC_ROLE_SSM_CONVX_B);
  conv_silu_bwd(net, L, n_seq, N, f[BR], f[BCP], g[DBC], g[DBCP], g[DBR], MC_ROLE_SSM_CONVB_W, MC_ROLE_SSM_CONVB_B);
  conv_silu_bwd(net, L, n_seq, N, f[CR], f[CCP], g[DCC], g[DCCP], g[DCR], MC_ROLE_SSM_CONVC_W, MC_ROLE_SSM_CONVC_B);
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WZ), mc_a16_in(net, g[DZ]), n, d, di, mc_o32(du), 0.0f,
                mc_g(net, L, MC_ROLE_SSM_WZ));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WX), mc_f32(g[DXR]), n, d, di, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_SSM_WX));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WB), mc_f32(g[DBR]), n, d, N, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_SSM_WB));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WC), mc_f32(g[DCR]), n, d, N, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_SSM_WC));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_SSM_WDT), mc_f32(g[DDTP]), n, d, hm, mc_o32(du), 1.0f, mc_g(net, L, MC_ROLE_SSM_WDT));
  return 0;
}

const mc_block_ops mc_block_mamba = {'M', mamba_sizes, mamba_forward, mamba_backward};
