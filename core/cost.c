#include "core/cost.h"

#include "core/blocks.h"

double mc_block_fwd_flops(const mc_model *m, char block) {
  const mc_block_kind *k = mc_block_kind_of(block);
  double f = 0.0;
  /* an E block as the model defines it, routed: the plain SwiGLU a training setting may run
   * for one expert skips the router product (2 d per token), which the model FLOPs keep */
  for (int p = 0; k && p < MC_N_PARTS; p++) f += k->part_flops(m, (mc_fwd_part)p, 1);
  return f;
}

double mc_block_bwd_flops(const mc_model *m, char block) {
  const mc_block_kind *k = mc_block_kind_of(block);
  return k ? k->bwd_flops(m) : 0.0;
}

double mc_embed_fwd_flops(const mc_model *m) {
  (void)m;
  return 0.0;
}

double mc_embed_bwd_flops(const mc_model *m) { return m->d_model; }

double mc_head_fwd_flops(const mc_model *m) {
  double vp = mc_vocab_padded(m);
  return 4.0 * m->d_model + 2.0 * m->d_model * vp + 4.0 * vp; /* final norm, head, softmax */
}

double mc_head_bwd_flops(const mc_model *m) {
  double vp = mc_vocab_padded(m);
  return 8.0 * m->d_model + 2.0 * 2.0 * m->d_model * vp + 8.0 * vp;
}

double mc_model_train_flops_per_token(const mc_model *m) {
  double f = mc_head_fwd_flops(m);
  for (const char *p = m->pattern; *p; p++) f += mc_block_fwd_flops(m, *p);
  return 3.0 * f;
}

double mc_model_fwd_bwd_flops_per_token(const mc_model *m) {
  double f = mc_embed_fwd_flops(m) + mc_embed_bwd_flops(m);
  for (const char *p = m->pattern; *p; p++) f += mc_block_fwd_flops(m, *p) + mc_block_bwd_flops(m, *p);
  return f + mc_head_fwd_flops(m) + mc_head_bwd_flops(m);
}

/* ------------------------------------------------------------------ memory estimate */

/* Bytes an element of state costs a rank: working weight and gradient (4 + 4), two moments
 * (8), ZeRO-sharded over a group of `group` ranks. */
static double state_bytes_per_elem(const mc_layout *l, int group) {
  const double g = group > 0 ? group : 1;
  if (l->zero >= 3) return 16.0 / g;
  if (l->zero >= 1) return 8.0 + 8.0 / g;
  return 16.0;
}

static int tp_of(const mc_layout *l) { return l->tp > 0 ? l->tp : 1; }

double mc_block_state_bytes(const mc_model *m, const mc_layout *l, char block) {
  const mc_block_kind *k = mc_block_kind_of(block);
  if (!k) return 0.0;
  const int tp = tp_of(l), ep = l->ep > 0 ? l->ep : 1, dp = l->dp > 0 ? l->dp : 1;
  double bytes = m->d_model * state_bytes_per_elem(l, dp); /* the pre-norm, replicated */
  for (int i = 0; i < k->n_families; i++) {
    const mc_block_family *f = &k->families[i];
    double n = 1;
    for (int d = 0; d < 3 && f->shape[d] != MC_DIM_NONE; d++) n *= (double)mc_dim_of(m, f->shape[d]);
    if (f->place == MC_PLACE_TP) n /= tp;
    if (f->place == MC_PLACE_EP) n /= ep;
    bytes += n * state_bytes_per_elem(l, f->place == MC_PLACE_EP ? tp * dp / ep : dp);
  }
  return bytes;
}

/* Elements of one kept buffer for one sequence, or 0 when it does not exist under the
 * reference settings (fp32: no bf16-only copies; TP/SP conditions from the layout). */
static double buf_elems(const mc_act_buf *b, const mc_block_kind *k, const mc_model *local, int tp, int sp, int T_res) {
  const unsigned w = b->when;
  if ((w & MC_IF_ROUTED) && !k->routes) return 0;
  if ((w & MC_IF_NOT_ROUTED) && k->routes) return 0;
  if ((w & MC_IF_ACT16) || ((w & MC_IF_TP) && tp <= 1) || ((w & MC_IF_SP) && !sp)) return 0;
  double rows = 1;
  if (b->rows == MC_ROWS_TOKENS) rows = local->seq_len;
  else if (b->rows == MC_ROWS_RESIDUAL) rows = T_res;
  const double width = b->width == MC_DIM_VP ? (double)mc_vocab_padded(local) / tp : (double)mc_dim_of(local, b->width);
  return rows * width;
}

double mc_block_act_bytes(const mc_model *m, const mc_layout *l, char block) {
  const mc_block_kind *k = mc_block_kind_of(block);
  if (!k) return 0.0;
  const int tp = tp_of(l), sp = l->sp && tp > 1;
  const mc_model local = mc_model_local(m, tp);
  const int T_res = sp ? m->seq_len / tp : m->seq_len;
  double elems = (2.0 * m->d_model + 1.0) * T_res; /* x_in, u, rstd */
  for (int i = 0; i < k->n_saved; i++) elems += buf_elems(&k->saved[i], k, &local, tp, sp, T_res);
  for (int i = 0; i < k->n_saved_i32; i++) elems += buf_elems(&k->saved_i32[i], k, &local, tp, sp, T_res);
  return 4.0 * elems;
}

double mc_embed_state_bytes(const mc_model *m, const mc_layout *l) {
  return (double)mc_vocab_padded(m) * m->d_model / tp_of(l) * state_bytes_per_elem(l, l->dp);
}

double mc_head_state_bytes(const mc_model *m, const mc_layout *l) {
  return ((double)m->d_model + (double)mc_vocab_padded(m) * m->d_model / tp_of(l)) * state_bytes_per_elem(l, l->dp);
}

double mc_head_act_bytes(const mc_model *m, const mc_layout *l) {
  return 2.0 * 4.0 * m->seq_len * (double)mc_vocab_padded(m) / tp_of(l);
}
