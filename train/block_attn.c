/* A block: causal grouped-query attention with RoPE (rotate-half) on q and k.
 *   q = u wq^T, k = u wk^T, v = u wv^T (RoPE on q, k), o = attn(q, k, v), x += o wo^T.
 * Under mc_act16 q, k, v and o are kept in bf16 only (the products write them so and RoPE
 * rotates them in place), and so are dout and the rotated-back dq, dk and the dv that feed
 * the products; the attention's own gradients dq, dk, dv are fp32 sums.
 * The buffers are the A row of core/blocks.h. */
#include "train/net_blocks.h"

/* The attention core: o and the log-sum-exp from the rotated q, k and v (what selective
 * recomputation rebuilds). */
static int attn_core(struct mc_net *net, mc_layer *L, int n_seq) {
  const mc_model *m = &net->m;
  net->be->attn_fwd(net->be, mc_saved_in(L, MC_A_Q), mc_saved_in(L, MC_A_K), mc_saved_in(L, MC_A_V), n_seq, m->seq_len,
                    m->n_heads, m->n_kv_heads, m->head_dim, mc_saved_out(L, MC_A_O), L->f[MC_A_LSE]);
  return 0;
}

static int attn_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WQ), n, d, H * hd, 0.0f, mc_saved_out(L, MC_A_Q));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WK), n, d, KV * hd, 0.0f, mc_saved_out(L, MC_A_K));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WV), n, d, KV * hd, 0.0f, mc_saved_out(L, MC_A_V));
  be->rope_fwd(be, mc_saved_out(L, MC_A_Q), n, T, H, hd, m->rope_theta);
  be->rope_fwd(be, mc_saved_out(L, MC_A_K), n, T, KV, hd, m->rope_theta);
  attn_core(net, L, n_seq);
  if (x) mc_linear_fwd(be, mc_saved_in(L, MC_A_O), mc_wm(net, L, MC_ROLE_ATTN_WO), n, H * hd, d, 1.0f, mc_o32(x));
  return 0;
}

static int attn_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                         double seq_weight) {
  (void)seq_weight;
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  float **f = L->f, **g = net->g;
  const int64_t nq = (int64_t)n * H * hd, nkv = (int64_t)n * KV * hd;
  /* dout = dy wo: written by the product (bf16 under act16: it feeds only the attention) */
  mc_linear_bwd(be, mc_saved_in(L, MC_A_O), mc_wm(net, L, MC_ROLE_ATTN_WO), mc_dy_in(net, dy, (int64_t)n * d), n, H * hd,
                d, mc_scratch_out(net, L, MC_A_DO), 0.0f, mc_g(net, L, MC_ROLE_ATTN_WO));
  be->attn_bwd(be, mc_saved_in(L, MC_A_Q), mc_saved_in(L, MC_A_K), mc_saved_in(L, MC_A_V), mc_saved_in(L, MC_A_O), f[MC_A_LSE], mc_scratch_in(net, L, MC_A_DO), n_seq,
               T, H, KV, hd, mc_zeroed(be, g[MC_A_DQ], nq), mc_zeroed(be, g[MC_A_DK], nkv), mc_zeroed(be, g[MC_A_DV], nkv));
  be->rope_bwd(be, mc_f32(g[MC_A_DQ]), mc_scratch_grad(net, L, MC_A_DQP, nq), n, T, H, hd, m->rope_theta);
  be->rope_bwd(be, mc_f32(g[MC_A_DK]), mc_scratch_grad(net, L, MC_A_DKP, nkv), n, T, KV, hd, m->rope_theta);
  const mc_operand dv = mc_scratch_bf16(L, MC_A_DV16) ? mc_to16(be, g[MC_A_DV], (mc_bf16 *)g[MC_A_DV16], nkv) : mc_f32(g[MC_A_DV]);
  const mc_in_proj in[] = {
      {mc_wm(net, L, MC_ROLE_ATTN_WQ), mc_scratch_in(net, L, MC_A_DQP), H * hd, mc_g(net, L, MC_ROLE_ATTN_WQ)},
      {mc_wm(net, L, MC_ROLE_ATTN_WK), mc_scratch_in(net, L, MC_A_DKP), KV * hd, mc_g(net, L, MC_ROLE_ATTN_WK)},
      {mc_wm(net, L, MC_ROLE_ATTN_WV), dv, KV * hd, mc_g(net, L, MC_ROLE_ATTN_WV)}};
  return mc_in_projs_bwd(net, L, in, 3, n, du);
}

const mc_block_ops mc_block_attn = {'A', attn_forward, attn_backward, attn_core};
