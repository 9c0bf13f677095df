/* Model weights to and from safetensors (reshard/safetensors.h), streamed through the
 * reshard engine with bounded memory.
 *
 * Export writes the `param` state of every family as one global tensor named after the
 * family (e.g. "layers.01.attn.wq"), F32, row-major, plus __metadata__: "format"
 * ("megac-weights"), "config" (the run configuration, JSON), "step", "source_root_sha256",
 * and "sha256.<family>" (hex of each tensor's bytes, filled in after the data is written).
 *
 * Import builds a new run directory from such a file in any valid layout: param from the
 * file (each tensor hash-verified against its sha256.<family> entry when present), AdamW
 * moments zero, training state at step 0 (a fresh start from the weights), committed
 * atomically exactly like mcreshard's output. */
#ifndef MC_RESHARD_EXPORT_H
#define MC_RESHARD_EXPORT_H

#include "reshard/reshard.h"

int mc_rs_export_safetensors(mc_rs_source *src, const char *path, const mc_rs_opts *o, mc_rs_summary *sum);

/* `target` may be NULL: the layout recorded in the file's config is used. Fields of
 * `overrides` set to non-negative values replace the file's layout fields (see mcreshard). */
int mc_rs_import_safetensors(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o,
                             mc_rs_summary *sum);

/* Reads the config recorded in an exported file (defaults overlaid with it). */
int mc_rs_safetensors_config(const char *path, mc_config *cfg);

#endif
