#include "core/cost.h"

#include "core/blocks.h"

double mc_block_fwd_flops(const mc_model *m, char block) {
  const mc_block_kind *k = mc_block_kind_of(block);
  return k ? k->fwd_flops(m) : 0.0;
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
