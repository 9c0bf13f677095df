/* A block: causal grouped-query attention with RoPE (rotate-half) on q and k.
 *   q = u wq^T, k = u wk^T, v = u wv^T (RoPE on q, k), o = attn(q, k, v), x += o wo^T.
 * Under mc_act16 q, k, v and o are kept in bf16 only (the products write them so and RoPE
 * rotates them in place), and so are dout and the rotated-back dq, dk and the dv that feed
 * the products; the attention's own gradients dq, dk, dv are fp32 sums. */
#include "train/net_blocks.h"

enum { Q, K, V, O, LSE };           /* saved activations */
enum { DO, DQ, DK, DV, DQP, DKP, DV16 };  /* gradient scratch */

static void attn_sizes(const struct mc_net *net, int n_seq, mc_block_sizes *s) {
  const mc_model *m = &net->m;
  const int act16 = mc_act16(net);
  int64_t n = (int64_t)n_seq * m->seq_len, q = (int64_t)m->n_heads * m->head_dim;
  int64_t kv = (int64_t)m->n_kv_heads * m->head_dim;
  const int64_t hq = mc_a16_floats(net, n * q), hkv = mc_a16_floats(net, n * kv);
  s->f[Q] = s->f[O] = hq;
  s->f[K] = s->f[V] = hkv;
  s->f[LSE] = n * m->n_heads;
  s->g[DQ] = n * q;
  s->g[DK] = s->g[DV] = n * kv;
  s->g[DO] = s->g[DQP] = hq;
  s->g[DKP] = hkv;
  if (act16) s->g[DV16] = hkv;
}

static int attn_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  float **f = L->f;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WQ), n, d, H * hd, 0.0f, mc_a16_dst(net, f[Q]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WK), n, d, KV * hd, 0.0f, mc_a16_dst(net, f[K]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WV), n, d, KV * hd, 0.0f, mc_a16_dst(net, f[V]));
  be->rope_fwd(be, mc_a16_dst(net, f[Q]), n, T, H, hd, m->rope_theta);
  be->rope_fwd(be, mc_a16_dst(net, f[K]), n, T, KV, hd, m->rope_theta);
  be->attn_fwd(be, mc_a16_in(net, f[Q]), mc_a16_in(net, f[K]), mc_a16_in(net, f[V]), n_seq, T, H, KV, hd, mc_a16_dst(net, f[O]), f[LSE]);
  mc_linear_fwd(be, mc_a16_in(net, f[O]), mc_wm(net, L, MC_ROLE_ATTN_WO), n, H * hd, d, 1.0f, mc_o32(x));
  return 0;
}

static int attn_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                         double seq_weight) {
  (void)seq_weight;
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  float **f = L->f, **g = net->g;
  const int act16 = mc_act16(net);
  const int64_t nq = (int64_t)n * H * hd, nkv = (int64_t)n * KV * hd;
  /* dout = dy wo: written by the product (bf16 under act16: it feeds only the attention) */
  mc_linear_bwd(be, mc_a16_in(net, f[O]), mc_wm(net, L, MC_ROLE_ATTN_WO), mc_dy_in(net, dy, (int64_t)n * d), n, H * hd,
                d, mc_a16_dst(net, g[DO]), 0.0f, mc_g(net, L, MC_ROLE_ATTN_WO));
  be->attn_bwd(be, mc_a16_in(net, f[Q]), mc_a16_in(net, f[K]), mc_a16_in(net, f[V]), mc_a16_in(net, f[O]), f[LSE], mc_a16_in(net, g[DO]), n_seq,
               T, H, KV, hd, mc_zeroed(be, g[DQ], nq), mc_zeroed(be, g[DK], nkv), mc_zeroed(be, g[DV], nkv));
  be->rope_bwd(be, mc_f32(g[DQ]), mc_a16_grad(net, g[DQP], nq), n, T, H, hd, m->rope_theta);
  be->rope_bwd(be, mc_f32(g[DK]), mc_a16_grad(net, g[DKP], nkv), n, T, KV, hd, m->rope_theta);
  const mc_operand dv = act16 ? mc_to16(be, g[DV], (mc_bf16 *)g[DV16], nkv) : mc_f32(g[DV]);
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WQ), mc_a16_in(net, g[DQP]), n, d, H * hd, mc_o32(du), 0.0f,
                mc_g(net, L, MC_ROLE_ATTN_WQ));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WK), mc_a16_in(net, g[DKP]), n, d, KV * hd, mc_o32(du), 1.0f,
                mc_g(net, L, MC_ROLE_ATTN_WK));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WV), dv, n, d, KV * hd, mc_o32(du), 1.0f,
                mc_g(net, L, MC_ROLE_ATTN_WV));
  return 0;
}

const mc_block_ops mc_block_attn = {'A', attn_sizes, attn_forward, attn_backward};
