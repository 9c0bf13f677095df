#include "core/cost.h"

#include <string.h>

/* Matrix products dominate; elementwise work is counted where it scales with a width
 * (norms, scans) so that blocks without big products are not priced at zero. */
double mc_block_fwd_flops(const mc_model *m, char block) {
  double d = m->d_model;
  double norm = 4.0 * d;
  switch (block) {
    case 'A': {
      double q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
      double ctx = (m->seq_len + 1) / 2.0;
      return norm + 2.0 * d * q + 2.0 * 2.0 * d * kv + 2.0 * q * d + 2.0 * 2.0 * q * ctx;
    }
    case 'M': {
      double di = m->mamba_inner, n = m->ssm_state, hm = mc_mamba_heads(m), k = m->conv_width;
      return norm + 2.0 * 2.0 * d * di + 2.0 * d * hm + 2.0 * 2.0 * d * n + 2.0 * k * (di + 2.0 * n) +
             6.0 * di * n + 2.0 * di * d + 8.0 * di;
    }
    case 'E': {
      double f = m->expert_hidden;
      return norm + 2.0 * d * m->n_experts + m->top_k * (2.0 * 2.0 * d * f + 2.0 * f * d + 4.0 * f);
    }
    case 'R': {
      double dr = m->rec_width;
      return norm + 2.0 * 4.0 * d * dr + 12.0 * dr + 2.0 * dr * d;
    }
  }
  return 0.0;
}

double mc_head_fwd_flops(const mc_model *m) {
  double vp = mc_vocab_padded(m);
  return 4.0 * m->d_model + 2.0 * m->d_model * vp + 4.0 * vp; /* final norm, head, softmax */
}

double mc_model_train_flops_per_token(const mc_model *m) {
  double f = mc_head_fwd_flops(m);
  for (const char *p = m->pattern; *p; p++) f += mc_block_fwd_flops(m, *p);
  return 3.0 * f;
}
