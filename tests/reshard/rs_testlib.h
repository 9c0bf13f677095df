/* Shared helpers of the reshard tests: a model that admits many layouts, random valid
 * layouts for it, deterministic tensor contents and hyperslab packing. Header-only so each
 * test stays one executable. */
#ifndef MC_TESTS_RESHARD_RS_TESTLIB_H
#define MC_TESTS_RESHARD_RS_TESTLIB_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "core/optim_groups.h"
#include "core/ownership.h"
#include "util/rng.h"

/* Odd sizes on purpose: ZeRO chunks are uneven, some members hold nothing. */
static inline void rs_test_model(mc_model *m, const char *pattern) {
  memset(m, 0, sizeof *m);
  snprintf(m->pattern, sizeof m->pattern, "%s", pattern);
  m->n_layers = (int)strlen(pattern);
  m->vocab_size = 37;
  m->vocab_pad = 8;
  m->d_model = 6;
  m->n_heads = 8;
  m->n_kv_heads = 4;
  m->head_dim = 2;
  m->n_experts = 4;
  m->top_k = 2;
  m->expert_hidden = 5;
  m->mamba_inner = 8;
  m->mamba_head_dim = 2;
  m->ssm_state = 3;
  m->conv_width = 3;
  m->rec_width = 8;
  m->seq_len = 8;
  m->rope_theta = 10000.0;
  m->norm_eps = 1e-5;
  m->init_std = 0.02;
}

static uint64_t rs_test_ctr = 0;
static inline int rs_pick(uint64_t seed, int n) {
  return (int)mc_rng_below(seed, MC_RNG_STREAM_TEST, rs_test_ctr++, (uint64_t)n);
}

/* A random layout valid for m (tries until mc_geometry_build accepts it); every family AdamW's. */
static inline int rs_random_geometry(uint64_t seed, const mc_model *m, int max_world, mc_geometry *g) {
  for (int tries = 0; tries < 10000; tries++) {
    mc_layout l;
    memset(&l, 0, sizeof l);
    static const int tps[] = {1, 2, 4};
    l.tp = tps[rs_pick(seed, 3)];
    l.dp = 1 + rs_pick(seed, 3);
    l.pp = 1 + rs_pick(seed, m->n_layers < 4 ? m->n_layers : 4);
    if (l.tp * l.dp * l.pp > max_world) continue;
    static const int eps[] = {1, 2, 4};
    l.ep = eps[rs_pick(seed, 3)];
    l.sp = (l.tp > 1 && l.ep > 1) ? 1 : rs_pick(seed, 2);
    static const int zeros[] = {0, 1, 3};
    l.zero = zeros[rs_pick(seed, 3)];
    l.split = (mc_split_mode)rs_pick(seed, 3);
    /* An explicit split of one stage has no pipes, which configs cannot express. */
    if (l.split == MC_SPLIT_EXPLICIT && l.pp == 1) l.split = MC_SPLIT_EQUAL;
    if (l.split == MC_SPLIT_EXPLICIT) {
      int cut[MC_MAX_LAYERS] = {0}, placed = 0, n = m->n_layers, k = 0;
      if (l.pp > n) continue;
      while (placed < l.pp - 1) {
        int c = 1 + rs_pick(seed, n - 1);
        if (!cut[c]) cut[c] = 1, placed++;
      }
      for (int i = 0; i < n; i++) {
        if (cut[i]) l.split_pattern[k++] = '|';
        l.split_pattern[k++] = m->pattern[i];
      }
      l.split_pattern[k] = 0;
    }
    if (mc_geometry_build(m, &l, NULL, -1, g) == 0) return 0;
  }
  return -1;
}

/* The same with the families' optimizers assigned from an optim.groups value. */
static inline int rs_random_geometry_groups(uint64_t seed, const mc_model *m, const char *groups, int max_world,
                                            mc_geometry *g) {
  if (rs_random_geometry(seed, m, max_world, g) != 0) return -1;
  if (mc_optim_groups_assign(groups, &g->fams) != 0) {
    mc_geometry_free(g);
    return -1;
  }
  return 0;
}

/* Content of element idx of (family, state): distinct, layout-independent values. */
static inline float rs_value(int fam, int state, int64_t idx) {
  return (float)(fam * 1000003 + state * 7919) + (float)idx * 0.5f;
}

/* The content of an int64 state (AdamW's step) of family fam: distinct per family, beyond 2^53
 * (no double holds it exactly) so that any trip through a float shows. */
static inline int64_t rs_i64_value(int fam) { return ((int64_t)1 << 60) + 1 + 2 * (int64_t)fam; }

/* The content of element idx of (family, state) under some rule (rs_value is the usual one). */
typedef float (*rs_value_fn)(int fam, int state, int64_t idx);

/* Packs the hyperslab `s` of the global tensor (shape) filled by value() into out. */
static inline void rs_pack_values(rs_value_fn value, int fam, int state, const int64_t *shape, int ndim, const mc_box *s,
                                  float *out) {
  int64_t n = 0;
  if (s->ndim < ndim) ndim = s->ndim; /* a scalar kind's box, [0, 1) of shape [1] */
  int64_t c1 = ndim > 1 ? s->count[1] : 1, c2 = ndim > 2 ? s->count[2] : 1;
  int64_t S1 = ndim > 1 ? shape[1] : 1, S2 = ndim > 2 ? shape[2] : 1;
  int64_t o1 = ndim > 1 ? s->start[1] : 0, o2 = ndim > 2 ? s->start[2] : 0;
  for (int64_t i = 0; i < s->count[0]; i++)
    for (int64_t j = 0; j < c1; j++)
      for (int64_t k = 0; k < c2; k++)
        out[n++] = value(fam, state, ((s->start[0] + i) * S1 + o1 + j) * S2 + o2 + k);
}

/* Packs the hyperslab `s` of the global tensor (shape) filled by rs_value into out. */
static inline void rs_pack(int fam, int state, const int64_t *shape, int ndim, const mc_box *s, float *out) {
  rs_pack_values(rs_value, fam, state, shape, ndim, s, out);
}

#endif
