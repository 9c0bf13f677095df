/* MegaC models as Hugging Face sees them (docs/export.md).
 *
 * A dense MegaC model is a Llama when its pattern is `AE` repeated (every E block one expert,
 * top-1, no token ever dropped): MegaC block 2i (A) with its pre-norm is the attention half of
 * Llama decoder layer i, block 2i+1 (E) with its pre-norm the MLP half. The math agrees term
 * by term with transformers' LlamaForCausalLM (checked against the CPU kernels, kernels/cpu):
 *   - RMSNorm x * rsqrt(mean(x^2) + eps) * w (weight w, not 1 + w), eps = model.norm_eps;
 *   - RoPE rotate-half: the pair (i, i + hd/2) at position t rotated by t * theta^(-2i/hd),
 *     which is HF's rotate_half with inv_freq = theta^(-2i/hd), so q/k rows are NOT permuted
 *     (convert_llama_weights_to_hf's permute turns Meta's interleaved pairs into this form);
 *   - attention scale 1/sqrt(head_dim); GQA head h reads kv head h / (H/KV) (repeat_kv);
 *   - MLP (silu(u w1^T) * (u w3^T)) w2^T = down(silu(gate(u)) * up(u)): w1 gate, w3 up, w2 down;
 *   - untied head, no biases; the final RMSNorm then the head.
 * Exported: vocabulary rows [0, V) of the embedding and the head (rows V..Vp-1 are padding
 * MegaC never reads or lets win); the router of a one-expert E block is dropped (the softmax
 * of one logit is 1, so it has no effect); importing sets it to zero and padded rows to zero. */
#ifndef MC_RESHARD_HF_LLAMA_H
#define MC_RESHARD_HF_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/families.h"

/* 0 if m is a Llama as above; else -1 and `why` names the first difference. */
int mc_hf_llama_check(const mc_model *m, char *why, size_t cap);

/* How one family is exported. */
typedef struct {
  char name[128];   /* tensor name; "" = not exported (the one-expert router) */
  int ndim;
  int64_t shape[3]; /* exported shape */
  int64_t keep;     /* elements of the family exported: a row-major prefix (all but padded vocab rows) */
} mc_hf_map;

/* The Llama tensor of family f of model m (m must pass mc_hf_llama_check). */
void mc_hf_llama_map(const mc_model *m, const mc_family *f, mc_hf_map *out);
/* The same under MegaC names: the family itself, whole. */
void mc_hf_megac_map(const mc_family *f, mc_hf_map *out);

/* config.json (malloc'd, formatted): LlamaForCausalLM for a Llama, else the hybrid form
 * (model_type "megac", the MegaC config under "megac"). torch_dtype: "float32" or "bfloat16". */
char *mc_hf_config_json(const mc_config *cfg, int llama, const char *torch_dtype);

/* A config.json read back: the "megac" object when present (the hybrid form, or any MegaC
 * export), else a LlamaForCausalLM config turned into a MegaC model (AE pairs, one expert)
 * on the default config. Refuses what MegaC cannot compute exactly (naming it). *tied is set
 * to tie_word_embeddings. */
int mc_hf_config_read(const char *json, const char *origin, mc_config *cfg, int *tied);

#endif
