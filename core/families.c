#include "core/families.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blocks.h"
#include "util/error.h"

static const char *const ROLE_NAMES[MC_ROLE_COUNT] = {
    "embed.weight", "final_norm.weight", "head.weight", "norm.weight",
    "attn.wq", "attn.wk", "attn.wv", "attn.wo",
    "ssm.w_z", "ssm.w_x", "ssm.w_dt", "ssm.w_B", "ssm.w_C",
    "ssm.conv_x.weight", "ssm.conv_x.bias", "ssm.conv_B.weight", "ssm.conv_B.bias",
    "ssm.conv_C.weight", "ssm.conv_C.bias", "ssm.dt_bias", "ssm.A_log",
    "ssm.D", "ssm.norm.weight", "ssm.w_out",
    "moe.router", "moe.w1", "moe.w3", "moe.w2",
    "rec.w_x", "rec.w_gate", "rec.w_r", "rec.w_i",
    "rec.b_r", "rec.b_i", "rec.lambda", "rec.w_out",
};

const char *mc_role_name(mc_role r) { return r >= 0 && r < MC_ROLE_COUNT ? ROLE_NAMES[r] : "?"; }

int mc_role_is_matmul(mc_role r) {
  switch (r) {
    case MC_ROLE_HEAD:
    case MC_ROLE_ATTN_WQ: case MC_ROLE_ATTN_WK: case MC_ROLE_ATTN_WV: case MC_ROLE_ATTN_WO:
    case MC_ROLE_SSM_WZ: case MC_ROLE_SSM_WX: case MC_ROLE_SSM_WDT: case MC_ROLE_SSM_WB: case MC_ROLE_SSM_WC:
    case MC_ROLE_SSM_WOUT:
    case MC_ROLE_MOE_W1: case MC_ROLE_MOE_W3: case MC_ROLE_MOE_W2:
    case MC_ROLE_REC_WX: case MC_ROLE_REC_WGATE: case MC_ROLE_REC_WR: case MC_ROLE_REC_WI: case MC_ROLE_REC_WOUT:
      return 1;
    default:
      return 0;
  }
}

const char *mc_place_name(mc_place p) {
  switch (p) {
    case MC_PLACE_REPLICATED: return "replicated";
    case MC_PLACE_TP: return "tp";
    case MC_PLACE_EP: return "ep";
  }
  return "?";
}

typedef struct {
  mc_family_set *set;
  int sp;
} builder;

/* Appends one family. dims are given as up to three sizes (0 ends the list). */
static void add(builder *b, int layer, char block, mc_role role, mc_place place, int split_dim, mc_init init,
                int64_t d0, int64_t d1, int64_t d2) {
  mc_family *f = &b->set->f[b->set->n++];
  memset(f, 0, sizeof *f);
  if (layer >= 0)
    snprintf(f->name, sizeof f->name, "layers.%02d.%s", layer, ROLE_NAMES[role]);
  else
    snprintf(f->name, sizeof f->name, "%s", ROLE_NAMES[role]);
  f->shape[0] = d0;
  f->shape[1] = d1;
  f->shape[2] = d2;
  f->ndim = d2 ? 3 : d1 ? 2 : 1;
  f->numel = d0 * (d1 ? d1 : 1) * (d2 ? d2 : 1);
  f->place = place;
  f->split_dim = place == MC_PLACE_REPLICATED ? -1 : split_dim;
  f->layer = layer;
  f->block = block;
  f->role = role;
  f->init = init;
  f->decay = f->ndim >= 2; /* 2-D and 3-D weights decay; norms, biases and per-head vectors do not */
  switch (role) {
    case MC_ROLE_SSM_WB: case MC_ROLE_SSM_WC:
    case MC_ROLE_SSM_CONVB_W: case MC_ROLE_SSM_CONVB_B:
    case MC_ROLE_SSM_CONVC_W: case MC_ROLE_SSM_CONVC_B:
      f->tp_partial_grad = 1; /* B and C feed every TP rank's heads */
      break;
    case MC_ROLE_NORM: case MC_ROLE_FINAL_NORM: case MC_ROLE_MOE_ROUTER:
      f->tp_partial_grad = b->sp; /* their input is sequence-sharded under SP */
      break;
    default:
      break;
  }
}

int mc_families_build(const mc_model *m, int sp, mc_family_set *out) {
  const int64_t d = m->d_model, vp = mc_vocab_padded(m);
  int cap = 3 + m->n_layers;
  for (int L = 0; L < m->n_layers; L++) {
    const mc_block_kind *k = mc_block_kind_of(m->pattern[L]);
    if (!k) return mc_error("model.pattern: unknown block letter '%c' at position %d", m->pattern[L], L);
    cap += k->n_families;
  }
  out->n = 0;
  out->f = calloc((size_t)cap, sizeof *out->f);
  if (!out->f) return mc_error("out of memory building the family registry");
  builder b = {out, sp};
  const mc_place R = MC_PLACE_REPLICATED, T = MC_PLACE_TP;
  add(&b, -1, 0, MC_ROLE_EMBED, T, 0, MC_INIT_NORMAL, vp, d, 0);
  for (int L = 0; L < m->n_layers; L++) {
    const mc_block_kind *k = mc_block_kind_of(m->pattern[L]);
    add(&b, L, k->letter, MC_ROLE_NORM, R, -1, MC_INIT_ONES, d, 0, 0);
    for (int i = 0; i < k->n_families; i++) {
      const mc_block_family *bf = &k->families[i];
      add(&b, L, k->letter, bf->role, bf->place, bf->split_dim, bf->init, mc_dim_of(m, bf->shape[0]),
          mc_dim_of(m, bf->shape[1]), mc_dim_of(m, bf->shape[2]));
    }
  }
  add(&b, -1, 0, MC_ROLE_FINAL_NORM, R, -1, MC_INIT_ONES, d, 0, 0);
  add(&b, -1, 0, MC_ROLE_HEAD, T, 0, MC_INIT_NORMAL, vp, d, 0);
  return 0;
}

void mc_families_free(mc_family_set *s) {
  free(s->f);
  s->f = NULL;
  s->n = 0;
}

int mc_family_find(const mc_family_set *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->f[i].name, name)) return i;
  return -1;
}
