/* Writes a small network's parameters, a token batch and the network's forward results to a
 * binary file, for the independent numpy implementation of docs/design.md section 2
 * (reference_model.py) to recompute and compare.
 * usage: model_dump OUT PATTERN CAPACITY_FACTOR SEED
 * Format (little endian): "MCDUMP1\n", int32 length + JSON of the model settings, int32
 * n_params, per parameter: int32 name length, name, int32 ndim, int64 shape[3], float32 data;
 * int32 n_seq, int32 T, int32 tokens[n_seq*(T+1)]; float64 ce_sum, aux_sum; int64 dropped;
 * float32 token losses[n_seq*T]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/net_blocks.h"
#include "util/error.h"
#include "util/rng.h"

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }
static void put_i32(FILE *f, int32_t v) { put(f, &v, 4); }

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: model_dump OUT PATTERN CAPACITY_FACTOR SEED\n");
    return 2;
  }
  mc_model m;
  memset(&m, 0, sizeof m);
  snprintf(m.pattern, sizeof m.pattern, "%s", argv[2]);
  m.n_layers = (int)strlen(m.pattern);
  m.vocab_size = 50, m.vocab_pad = 16, m.d_model = 16;
  m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 8;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 12, m.capacity_factor = atof(argv[3]), m.aux_loss_coef = 0.05;
  m.mamba_inner = 16, m.mamba_head_dim = 8, m.ssm_state = 4, m.conv_width = 4;
  m.rec_width = 12, m.seq_len = 10;
  m.rope_theta = 500.0, m.norm_eps = 1e-5, m.init_std = 0.4;
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = l.pp = l.dp = l.ep = 1;
  mc_geometry geo;
  uint64_t seed = strtoull(argv[4], NULL, 10);
  if (mc_geometry_build(&m, &l, NULL, -1, &geo)) {
    fprintf(stderr, "model_dump: %s\n", mc_errmsg());
    return 1;
  }
  mc_net *net = mc_net_create(&geo, 0, seed);
  if (!net) {
    fprintf(stderr, "model_dump: %s\n", mc_errmsg());
    return 1;
  }
  const int n_seq = 3, T = m.seq_len;
  int32_t *tok = malloc((size_t)n_seq * (T + 1) * sizeof(int32_t));
  for (int i = 0; i < n_seq * (T + 1); i++) tok[i] = (int32_t)mc_rng_below(seed, 77, (uint64_t)i, (uint64_t)m.vocab_size);
  mc_net_stats st;
  if (mc_net_forward(net, tok, n_seq, &st)) {
    fprintf(stderr, "model_dump: %s\n", mc_errmsg());
    return 1;
  }
  FILE *f = fopen(argv[1], "wb");
  if (!f) {
    fprintf(stderr, "model_dump: cannot write %s\n", argv[1]);
    return 1;
  }
  char js[1024];
  int len = snprintf(js, sizeof js,
                     "{\"pattern\":\"%s\",\"V\":%d,\"Vp\":%d,\"d\":%d,\"H\":%d,\"KV\":%d,\"hd\":%d,\"E\":%d,\"k\":%d,"
                     "\"F\":%d,\"cf\":%.17g,\"aux_coef\":%.17g,\"Di\":%d,\"hdm\":%d,\"N\":%d,\"K\":%d,\"Dr\":%d,"
                     "\"T\":%d,\"theta\":%.17g,\"eps\":%.17g}",
                     m.pattern, m.vocab_size, mc_vocab_padded(&m), m.d_model, m.n_heads, m.n_kv_heads, m.head_dim,
                     m.n_experts, m.top_k, m.expert_hidden, m.capacity_factor, m.aux_loss_coef, m.mamba_inner,
                     m.mamba_head_dim, m.ssm_state, m.conv_width, m.rec_width, m.seq_len, m.rope_theta, m.norm_eps);
  put(f, "MCDUMP1\n", 8);
  put_i32(f, len);
  put(f, js, (size_t)len);
  put_i32(f, mc_net_n_params(net));
  for (int i = 0; i < mc_net_n_params(net); i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    const mc_family *fam = &net->geo.fams.f[p->fam];
    put_i32(f, (int32_t)strlen(fam->name));
    put(f, fam->name, strlen(fam->name));
    put_i32(f, fam->ndim);
    put(f, fam->shape, 3 * sizeof(int64_t));
    put(f, p->w, (size_t)p->numel * sizeof(float));
  }
  put_i32(f, n_seq);
  put_i32(f, T);
  put(f, tok, (size_t)n_seq * (T + 1) * sizeof(int32_t));
  put(f, &st.ce_sum, 8);
  put(f, &st.aux_sum, 8);
  put(f, &st.dropped, 8);
  put(f, net->loss_host, (size_t)n_seq * T * sizeof(float));
  int bad = fclose(f) != 0;
  free(tok);
  mc_net_free(net);
  mc_geometry_free(&geo);
  return bad;
}
