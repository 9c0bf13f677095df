#define _POSIX_C_SOURCE 200809L
#include "reshard/hf_llama.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_num.h"
#include "util/error.h"

int mc_hf_llama_check(const mc_model *m, char *why, size_t cap) {
  const int L = m->n_layers;
  if (L < 2 || L % 2) {
    snprintf(why, cap, "pattern %s has %d blocks; a Llama is pairs AE (attention, then a dense MLP)", m->pattern, L);
    return -1;
  }
  for (int i = 0; i < L; i++) {
    char want = i % 2 ? 'E' : 'A';
    if (m->pattern[i] != want) {
      snprintf(why, cap, "pattern %s: block %d is %c where a Llama has %c (a Llama is pairs AE: attention, then a dense MLP)",
               m->pattern, i, m->pattern[i], want);
      return -1;
    }
  }
  if (m->n_experts != 1 || m->top_k != 1) {
    snprintf(why, cap, "E blocks have %d experts, top-%d; a Llama MLP is one dense SwiGLU (n_experts=1, top_k=1)",
             m->n_experts, m->top_k);
    return -1;
  }
  if (!mc_moe_is_plain(m, m->seq_len)) {
    snprintf(why, cap, "capacity_factor %g lets the one expert drop tokens (capacity %d < seq_len %d); a Llama MLP sees every token",
             m->capacity_factor, mc_moe_capacity(m), m->seq_len);
    return -1;
  }
  if (m->head_dim % 2) {
    snprintf(why, cap, "head_dim %d is odd (rotate-half RoPE needs an even head_dim)", m->head_dim);
    return -1;
  }
  return 0;
}

static void set2(mc_hf_map *o, int64_t a, int64_t b) {
  o->ndim = 2, o->shape[0] = a, o->shape[1] = b, o->shape[2] = 0;
  o->keep = a * b;
}

void mc_hf_megac_map(const mc_family *f, mc_hf_map *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", f->name);
  out->ndim = f->ndim;
  for (int d = 0; d < f->ndim; d++) out->shape[d] = f->shape[d];
  out->keep = f->numel;
}

void mc_hf_llama_map(const mc_model *m, const mc_family *f, mc_hf_map *o) {
  memset(o, 0, sizeof *o);
  const int64_t d = m->d_model, V = m->vocab_size;
  const int li = f->layer / 2;
  char pre[48];
  snprintf(pre, sizeof pre, "model.layers.%d.", li);
  const char *leaf = NULL;
  switch (f->role) {
  case MC_ROLE_EMBED: snprintf(o->name, sizeof o->name, "model.embed_tokens.weight"), set2(o, V, d); return;
  case MC_ROLE_HEAD: snprintf(o->name, sizeof o->name, "lm_head.weight"), set2(o, V, d); return;
  case MC_ROLE_FINAL_NORM: snprintf(o->name, sizeof o->name, "model.norm.weight"); break;
  case MC_ROLE_NORM: leaf = f->layer % 2 ? "post_attention_layernorm.weight" : "input_layernorm.weight"; break;
  case MC_ROLE_ATTN_WQ: leaf = "self_attn.q_proj.weight"; break;
  case MC_ROLE_ATTN_WK: leaf = "self_attn.k_proj.weight"; break;
  case MC_ROLE_ATTN_WV: leaf = "self_attn.v_proj.weight"; break;
  case MC_ROLE_ATTN_WO: leaf = "self_attn.o_proj.weight"; break;
  case MC_ROLE_MOE_W1: leaf = "mlp.gate_proj.weight"; break;
  case MC_ROLE_MOE_W3: leaf = "mlp.up_proj.weight"; break;
  case MC_ROLE_MOE_W2: leaf = "mlp.down_proj.weight"; break;
  default: return; /* the router: not exported */
  }
  if (leaf) snprintf(o->name, sizeof o->name, "%s%s", pre, leaf);
  /* expert tensors [1, a, b] drop their expert dimension; the rest keep their shape */
  int skip = f->ndim == 3 ? 1 : 0;
  o->ndim = f->ndim - skip;
  for (int k = 0; k < o->ndim; k++) o->shape[k] = f->shape[k + skip];
  o->keep = f->numel;
}

static void add_num(cJSON *o, const char *k, double v) { cJSON_AddItemToObject(o, k, mc_json_number(v)); }

char *mc_hf_config_json(const mc_config *cfg, int llama, const char *torch_dtype) {
  const mc_model *m = &cfg->model;
  cJSON *o = cJSON_CreateObject();
  cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(llama ? "LlamaForCausalLM" : "MegaCHybridForCausalLM"));
  cJSON_AddStringToObject(o, "model_type", llama ? "llama" : "megac");
  add_num(o, "hidden_size", m->d_model);
  if (llama) add_num(o, "intermediate_size", m->expert_hidden);
  add_num(o, "num_attention_heads", m->n_heads);
  add_num(o, "num_key_value_heads", m->n_kv_heads);
  add_num(o, "head_dim", m->head_dim);
  add_num(o, "num_hidden_layers", llama ? m->n_layers / 2 : m->n_layers);
  add_num(o, "vocab_size", m->vocab_size);
  add_num(o, "rms_norm_eps", m->norm_eps);
  add_num(o, "rope_theta", m->rope_theta);
  add_num(o, "max_position_embeddings", m->seq_len);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", 0);
  cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
  if (llama) {
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddBoolToObject(o, "attention_bias", 0);
    cJSON_AddBoolToObject(o, "mlp_bias", 0);
    add_num(o, "attention_dropout", 0);
    cJSON_AddNullToObject(o, "rope_scaling");
    add_num(o, "initializer_range", m->init_std);
    add_num(o, "pretraining_tp", 1);
    cJSON_AddBoolToObject(o, "use_cache", 1);
  } else {
    cJSON_AddStringToObject(o, "megac_pattern", m->pattern);
  }
  /* the whole MegaC configuration: import rebuilds the model from it exactly (vocab_pad, ...) */
  char *cj = mc_config_to_json(cfg);
  cJSON *mc = cj ? cJSON_Parse(cj) : NULL;
  free(cj);
  if (mc) cJSON_AddItemToObject(o, "megac", mc);
  char *s = mc ? mc_json_print_exact(o, 1) : NULL;
  cJSON_Delete(o);
  if (!s) mc_error("config.json: out of memory");
  return s;
}

static double num(const cJSON *o, const char *k, double dflt, int *missing) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (cJSON_IsNumber(v)) return v->valuedouble;
  if (!v || cJSON_IsNull(v)) {
    if (dflt != dflt && missing) *missing = 1; /* NaN default: required */
    return dflt;
  }
  if (missing) *missing = 1;
  return dflt;
}

int mc_hf_config_read(const char *json, const char *origin, mc_config *cfg, int *tied) {
  cJSON *o = cJSON_Parse(json);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return mc_error("%s: not a JSON object", origin);
  }
  *tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings"));
  int rc = 0;
  const cJSON *mc = cJSON_GetObjectItemCaseSensitive(o, "megac");
  if (cJSON_IsObject(mc)) {
    char *s = cJSON_PrintUnformatted(mc);
    rc = !s || mc_config_default(cfg) != 0 || mc_config_apply_json(cfg, s, origin) != 0 ? -1 : 0;
    free(s);
    cJSON_Delete(o);
    return rc;
  }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
  if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama") != 0)
    rc = mc_error("%s: model_type %s: only \"llama\" (or a MegaC export, with its \"megac\" object) is understood", origin,
                  cJSON_IsString(mt) ? mt->valuestring : "(missing)");
  else if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
    rc = mc_error("%s: hidden_act %s: MegaC's MLP is SwiGLU with silu", origin, cJSON_IsString(act) ? act->valuestring : "?");
  else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "attention_bias")) ||
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "mlp_bias")))
    rc = mc_error("%s: attention_bias/mlp_bias true: MegaC's projections have no bias", origin);
  else if (rs && !cJSON_IsNull(rs))
    rc = mc_error("%s: rope_scaling is set: MegaC's RoPE is plain (theta only)", origin);
  if (rc) {
    cJSON_Delete(o);
    return rc;
  }
  int missing = 0;
  const double nan = 0.0 / 0.0;
  double d = num(o, "hidden_size", nan, &missing), H = num(o, "num_attention_heads", nan, &missing);
  double L = num(o, "num_hidden_layers", nan, &missing), V = num(o, "vocab_size", nan, &missing);
  double F = num(o, "intermediate_size", nan, &missing);
  double KV = num(o, "num_key_value_heads", H, &missing);
  double hd = num(o, "head_dim", missing ? 0 : d / H, &missing);
  double eps = num(o, "rms_norm_eps", 1e-6, &missing), theta = num(o, "rope_theta", 10000, &missing);
  double T = num(o, "max_position_embeddings", 2048, &missing);
  cJSON_Delete(o);
  if (missing) return mc_error("%s: a LlamaForCausalLM config needs numbers hidden_size, num_attention_heads, "
                               "num_hidden_layers, vocab_size and intermediate_size", origin);
  if (L < 1 || 2 * L > MC_MAX_LAYERS) return mc_error("%s: num_hidden_layers %g: MegaC holds at most %d (2 blocks each)", origin, L, MC_MAX_LAYERS / 2);
  char pattern[MC_MAX_LAYERS + 1];
  for (int i = 0; i < (int)L; i++) pattern[2 * i] = 'A', pattern[2 * i + 1] = 'E';
  pattern[2 * (int)L] = 0;
  char doc[2048], a[32], b[32];
  mc_json_number_text(eps, a, sizeof a);
  mc_json_number_text(theta, b, sizeof b);
  snprintf(doc, sizeof doc,
           "{\"model\": {\"pattern\": \"%s\", \"vocab_size\": %.0f, \"d_model\": %.0f, \"n_heads\": %.0f, "
           "\"n_kv_heads\": %.0f, \"head_dim\": %.0f, \"n_experts\": 1, \"top_k\": 1, \"expert_hidden\": %.0f, "
           "\"capacity_factor\": 0, \"norm_eps\": %s, \"rope_theta\": %s, \"seq_len\": %.0f}}",
           pattern, V, d, H, KV, hd, F, a, b, T);
  if (mc_config_default(cfg) != 0 || mc_config_apply_json(cfg, doc, origin) != 0) return -1;
  return 0;
}
