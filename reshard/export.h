/* Model weights to and from safetensors (reshard/safetensors.h), streamed through the
 * reshard engine with bounded memory (docs/export.md).
 *
 * Export writes the `param` state of every family, either as one file (a path ending in
 * ".safetensors") or as a Hugging Face model directory: model-0000i-of-0000N.safetensors
 * shards of at most max_shard_bytes, model.safetensors.index.json and config.json. Tensors
 * are F32 (the master weights, byte for byte) or BF16 (round to nearest even from them).
 * Names are Llama's for a dense model (reshard/hf_llama.h), MegaC's family names otherwise.
 * Every file's __metadata__: "format" "pt", "names" ("llama" or "megac"), "config" (the run
 * configuration, JSON), "step", "source_root_sha256" and "sha256.<tensor>" (hex of the
 * tensor's bytes in the file). A file or directory appears under its name only when complete.
 *
 * Import builds a new run directory from such a file or directory (or any Llama model in
 * safetensors with its config.json) in any valid layout: param from the file(s) (F32, BF16
 * or F16, each hash-verified against its sha256.<tensor> entry when present), AdamW moments
 * zero, training state at step 0 (a fresh start from the weights), committed atomically
 * exactly like mcreshard's output. */
#ifndef MC_RESHARD_EXPORT_H
#define MC_RESHARD_EXPORT_H

#include <stdio.h>

#include "reshard/reshard.h"

typedef struct {
  int bf16;                /* 0: F32 (default), 1: BF16 */
  int names;               /* MC_EXPORT_NAMES_* */
  int64_t max_shard_bytes; /* directory export: most tensor bytes per file (<= 0: 5 GB) */
  int dry_run;             /* print what would be written to `out`, write nothing */
  FILE *out;               /* dry-run listing and notes (NULL: stdout) */
} mc_rs_export_opts;

enum { MC_EXPORT_NAMES_AUTO = 0, MC_EXPORT_NAMES_LLAMA = 1, MC_EXPORT_NAMES_MEGAC = 2 };

/* Defaults: F32, names auto (Llama when the model is one), 5 GB shards. */
void mc_rs_export_opts_default(mc_rs_export_opts *e);

/* path ending in ".safetensors": one file; anything else: a model directory. An existing
 * path is refused unless o->force. */
int mc_rs_export(mc_rs_source *src, const char *path, const mc_rs_export_opts *e, const mc_rs_opts *o,
                 mc_rs_summary *sum);

/* mc_rs_export with the defaults. */
int mc_rs_export_safetensors(mc_rs_source *src, const char *path, const mc_rs_opts *o, mc_rs_summary *sum);

/* `path`: one .safetensors file, or a directory holding model.safetensors.index.json (and the
 * shards it names) or model.safetensors, with config.json when the files carry no MegaC
 * config. `target` may be NULL: the layout recorded in the config is used. dry_run: check
 * everything, print the mapping to stdout, write nothing. */
int mc_rs_import(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o, int dry_run,
                 mc_rs_summary *sum);
int mc_rs_import_safetensors(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o,
                             mc_rs_summary *sum);

/* The config of an export (file or directory): the files' "config" metadata, else config.json
 * (a MegaC "megac" object or a LlamaForCausalLM config). */
int mc_rs_safetensors_config(const char *path, mc_config *cfg);

/* "5GB", "500MB", "2GiB", "123" (bytes) -> bytes; KB/MB/GB/TB are powers of 1000, KiB/MiB/
 * GiB/TiB of 1024 (as transformers' max_shard_size). -1 with an error on anything else. */
int64_t mc_rs_parse_size(const char *text);

#endif
