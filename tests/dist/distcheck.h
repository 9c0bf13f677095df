/* Helpers of the distributed tests (run under mpirun): a tiny hybrid model every layout of
 * the tests can split, its geometry for a layout, the communicator groups, and comparisons
 * of a rank's TP-local slices with the single-rank network (the oracle). */
#ifndef MC_TESTS_DISTCHECK_H
#define MC_TESTS_DISTCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "train/dist.h"
#include "train/net_blocks.h"
#include "util/error.h"
#include "util/rng.h"

/* V = 13 padded to 16 (the last TP rank holds 3 padding rows), d = 16, 4 query heads on 2
 * kv heads of 4, 4 experts top-2 of width 8, Mamba 16 inner = 4 heads of 4, state 4, conv 3,
 * recurrence width 8, T = 8: tp = 2 divides every split width and the sequence. */
static inline mc_model dc_model(const char *pattern) {
  mc_model m;
  memset(&m, 0, sizeof m);
  snprintf(m.pattern, sizeof m.pattern, "%s", pattern);
  m.n_layers = (int)strlen(pattern);
  m.vocab_size = 13, m.vocab_pad = 8, m.d_model = 16;
  m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 8, m.capacity_factor = 0.0, m.aux_loss_coef = 0.01;
  m.mamba_inner = 16, m.mamba_head_dim = 4, m.ssm_state = 4, m.conv_width = 3;
  m.rec_width = 8, m.seq_len = 8;
  m.rope_theta = 10000.0, m.norm_eps = 1e-5, m.init_std = 0.2;
  return m;
}

static inline mc_layout dc_layout(int tp, int dp, int sp, int zero) {
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = tp, l.pp = 1, l.dp = dp, l.ep = 1, l.sp = sp, l.zero = zero;
  l.split = MC_SPLIT_EQUAL;
  return l;
}

/* Token rows of global samples [first, first + n), each seq_len + 1 ids, keyed by sample. */
static inline void dc_samples(const mc_model *m, int64_t first, int n, int32_t *out) {
  for (int s = 0; s < n; s++)
    for (int t = 0; t <= m->seq_len; t++)
      out[(int64_t)s * (m->seq_len + 1) + t] =
          (int32_t)mc_rng_below(17, (uint64_t)(first + s), (uint64_t)t, (uint64_t)m->vocab_size);
}

/* Index of family `fam` among a network's parameters, or -1. */
static inline int dc_param_of(mc_net *net, int fam) {
  for (int i = 0; i < mc_net_n_params(net); i++)
    if (mc_net_param_at(net, i)->fam == fam) return i;
  return -1;
}

/* Largest |local - full[slice]| over a TP-local slice of a full tensor (both row-major), and
 * the largest |full[slice]| in *ref_max. */
static inline double dc_slice_diff(const float *local, const mc_shard *sh, const int64_t *start, const int64_t *count,
                                   const float *full, const mc_family *f, double *ref_max) {
  int64_t shp[3] = {1, 1, 1}, cnt[3] = {1, 1, 1}, st[3] = {0, 0, 0};
  (void)sh;
  for (int i = 0; i < f->ndim; i++) shp[i] = f->shape[i], cnt[i] = count[i], st[i] = start[i];
  double worst = 0.0, rmax = 0.0;
  int64_t e = 0;
  for (int64_t a = 0; a < cnt[0]; a++)
    for (int64_t b = 0; b < cnt[1]; b++)
      for (int64_t c = 0; c < cnt[2]; c++) {
        double r = full[((st[0] + a) * shp[1] + st[1] + b) * shp[2] + st[2] + c];
        worst = fmax(worst, fabs((double)local[e++] - r));
        rmax = fmax(rmax, fabs(r));
      }
  *ref_max = rmax;
  return worst;
}

#endif
