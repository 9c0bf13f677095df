/* A block: causal grouped-query attention with RoPE (rotate-half) on q and k.
 *   q = u wq^T, k = u wk^T, v = u wv^T (RoPE on q, k), o = attn(q, k, v), x += o wo^T. */
#include "train/net_blocks.h"

enum { Q, K, V, O, LSE };           /* saved activations */
enum { DO, DQ, DK, DV, DQP, DKP };  /* gradient scratch */

static void attn_sizes(const mc_model *m, int n_seq, int act16, mc_block_sizes *s) {
  (void)act16; /* its u16 is the layer's (train/net.c) */
  int64_t n = (int64_t)n_seq * m->seq_len, q = (int64_t)m->n_heads * m->head_dim;
  int64_t kv = (int64_t)m->n_kv_heads * m->head_dim;
  s->f[Q] = s->f[O] = n * q;
  s->f[K] = s->f[V] = n * kv;
  s->f[LSE] = n * m->n_heads;
  s->g[DO] = s->g[DQ] = s->g[DQP] = n * q;
  s->g[DK] = s->g[DV] = s->g[DKP] = n * kv;
}

static int attn_forward(struct mc_net *net, mc_layer *L, int n_seq, float *x) {
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WQ), n, d, H * hd, 0.0f, mc_o32(L->f[Q]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WK), n, d, KV * hd, 0.0f, mc_o32(L->f[K]));
  mc_linear_fwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WV), n, d, KV * hd, 0.0f, mc_o32(L->f[V]));
  be->rope_fwd(be, L->f[Q], n, T, H, hd, m->rope_theta);
  be->rope_fwd(be, L->f[K], n, T, KV, hd, m->rope_theta);
  be->attn_fwd(be, L->f[Q], L->f[K], L->f[V], n_seq, T, H, KV, hd, L->f[O], L->f[LSE]);
  mc_linear_fwd(be, mc_f32(L->f[O]), mc_wm(net, L, MC_ROLE_ATTN_WO), n, H * hd, d, 1.0f, mc_o32(x));
  return 0;
}

static int attn_backward(struct mc_net *net, mc_layer *L, int n_seq, const float *dy, float *du,
                         double seq_weight) {
  (void)seq_weight;
  mc_backend *be = net->be;
  const mc_model *m = &net->m;
  const int T = m->seq_len, n = n_seq * T, d = m->d_model, H = m->n_heads, KV = m->n_kv_heads, hd = m->head_dim;
  float **g = net->g;
  const int64_t nq = (int64_t)n * H * hd, nkv = (int64_t)n * KV * hd;
  mc_linear_bwd(be, mc_f32(L->f[O]), mc_wm(net, L, MC_ROLE_ATTN_WO), mc_dy_in(net, dy, (int64_t)n * d), n, H * hd, d, g[DO], 0.0f,
                mc_g(net, L, MC_ROLE_ATTN_WO));
  be->attn_bwd(be, L->f[Q], L->f[K], L->f[V], L->f[O], L->f[LSE], g[DO], n_seq, T, H, KV, hd,
               mc_zeroed(be, g[DQ], nq), mc_zeroed(be, g[DK], nkv), mc_zeroed(be, g[DV], nkv));
  be->rope_bwd(be, g[DQ], mc_zeroed(be, g[DQP], nq), n, T, H, hd, m->rope_theta);
  be->rope_bwd(be, g[DK], mc_zeroed(be, g[DKP], nkv), n, T, KV, hd, m->rope_theta);
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WQ), mc_f32(g[DQP]), n, d, H * hd, du, 0.0f, mc_g(net, L, MC_ROLE_ATTN_WQ));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WK), mc_f32(g[DKP]), n, d, KV * hd, du, 1.0f, mc_g(net, L, MC_ROLE_ATTN_WK));
  mc_linear_bwd(be, mc_uin(L), mc_wm(net, L, MC_ROLE_ATTN_WV), mc_f32(g[DV]), n, d, KV * hd, du, 1.0f, mc_g(net, L, MC_ROLE_ATTN_WV));
  return 0;
}

const mc_block_ops mc_block_attn = {'A', attn_sizes, attn_forward, attn_backward};
