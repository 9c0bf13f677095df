/* The run configuration: one JSON document with sections model, parallel, train, data and
 * checkpoint (schemas/config.schema.json). Every CLI takes --config FILE and repeatable
 * --set section.key=value; with neither it uses the embedded default (configs/default.json). */
#ifndef MC_CORE_CONFIG_H
#define MC_CORE_CONFIG_H

#include <math.h>
#include <stdint.h>

#define MC_MAX_LAYERS 256
#define MC_MAX_STAGES 64
#define MC_PATH_MAX 1024

typedef enum { MC_SPLIT_EQUAL = 0, MC_SPLIT_WEIGHTED = 1, MC_SPLIT_EXPLICIT = 2 } mc_split_mode;

/* Model shape (docs/design.md section 2). Layout-independent. */
typedef struct {
  char pattern[MC_MAX_LAYERS + 1]; /* block letters in depth order, no pipes */
  int n_layers;                    /* strlen(pattern) */
  int vocab_size;                  /* V */
  int vocab_pad;                   /* Vp = V rounded up to a multiple of vocab_pad */
  int d_model;                     /* d */
  int n_heads, n_kv_heads, head_dim;            /* H, KV, hd */
  int n_experts, top_k, expert_hidden;          /* E, k, F */
  double capacity_factor;                       /* 0 = dropless */
  double aux_loss_coef;
  int mamba_inner, mamba_head_dim, ssm_state, conv_width; /* Di, hdm, N, K */
  int rec_width;                                /* Dr */
  int seq_len;                                  /* T */
  double rope_theta, norm_eps, init_std;
} mc_model;

/* Parallel layout (docs/design.md section 3). */
typedef struct {
  int tp, pp, dp, ep;
  int sp;   /* 0/1 */
  int zero; /* 0, 1 or 3 */
  /* Ownership rule (core/ownership.h, docs/ownership.md): MC_OWN_BALANCED_V2 (0, every new
   * layout), MC_OWN_BALANCED (older checkpoints of format version 2) or MC_OWN_CHUNKED
   * (checkpoints of format version 1). Not a configuration key: a
   * checkpoint's manifest records it (layout.ownership_rule) and mc_ckpt_config restores it. */
  int own_rule;
  mc_split_mode split;
  /* With MC_SPLIT_EXPLICIT: the pattern with pipes, e.g. "AEME|AEMR". */
  char split_pattern[2 * MC_MAX_LAYERS + 2];
} mc_layout;

/* Activation recomputation policy (train.recompute). */
typedef enum { MC_RECOMPUTE_NONE = 0, MC_RECOMPUTE_SELECTIVE = 1, MC_RECOMPUTE_FULL = 2 } mc_recompute;

/* "none" | "selective" | "full" -> policy, or -1. */
int mc_recompute_parse(const char *name);
const char *mc_recompute_name(mc_recompute r);

/* Optimizer groups and Muon's settings (section optim; core/optim_groups.h). */
typedef struct {
  char groups[512];     /* optim.groups: "OPT:SELECTOR,..." */
  double muon_momentum; /* mu */
  int muon_nesterov;    /* 0/1 */
  int muon_ns_steps;    /* Newton-Schulz iterations */
} mc_optim_cfg;

typedef struct {
  int steps;
  int global_batch;  /* sequences per optimizer step */
  int micro_batch;   /* sequences per micro-batch per DP rank */
  double lr, min_lr;
  int warmup_steps;
  double beta1, beta2, adam_eps, weight_decay, grad_clip;
  uint64_t seed;
  char recompute[16]; /* "none" | "selective" | "full" */
  char dtype[8];      /* "fp32" | "bf16" */
  char device[8];     /* "cpu" | "cuda" */
  int log_every, eval_every, eval_batches;
  char metrics[MC_PATH_MAX]; /* metrics log path ("" = <checkpoint.dir>/metrics.jsonl) */
  mc_optim_cfg optim;        /* the JSON section optim */
} mc_train_cfg;

typedef struct {
  char path[MC_PATH_MAX]; /* HDF5 token dataset made by mcdata */
  double val_fraction;    /* held-out share of windows */
} mc_data_cfg;

typedef struct {
  char dir[MC_PATH_MAX];
  int every;        /* save every N steps, 0 = only at the end */
  int keep;         /* keep the last K committed checkpoints, 0 = all */
  int async_save;   /* 0/1 */
  int verify;       /* hash-verify reads, 0/1 */
  int io_threads;   /* threads for hashing and I/O */
  char compress[16]; /* rank-file datasets: "none" (contiguous) or "deflate" (shuffle + deflate) */
} mc_ckpt_cfg;

typedef struct {
  mc_model model;
  mc_layout parallel;
  mc_train_cfg train;
  mc_data_cfg data;
  mc_ckpt_cfg checkpoint;
} mc_config;

/* Fills cfg from the embedded default configuration. */
int mc_config_default(mc_config *cfg);
/* Overlays the keys present in a JSON document on cfg. Unknown keys, wrong types and
 * out-of-range values are errors naming "section.key" and `origin` (a file name). */
int mc_config_apply_json(mc_config *cfg, const char *json, const char *origin);
int mc_config_apply_file(mc_config *cfg, const char *path);
/* Applies one "section.key=value" assignment (value parsed by the key's type). */
int mc_config_set(mc_config *cfg, const char *assignment);
/* Standard CLI handling: defaults, then every --config FILE, then every --set k=v, in
 * order. Consumed arguments are removed from argv; *argc is updated. */
int mc_config_from_args(mc_config *cfg, int *argc, char **argv);
/* The same on top of an existing config (e.g. one recorded in a checkpoint) instead of the
 * defaults. *applied (may be NULL) receives how many --config/--set arguments were given. */
int mc_config_overlay_args(mc_config *cfg, int *argc, char **argv, int *applied);
/* Moves every --config FILE / --set k=v (and = forms) out of argv into `taken` (room for
 * *argc + 1 entries; taken[0] = argv[0]), in order, for tools that apply them later on a
 * config they load first. Returns the number of entries in `taken` (1 when none). A trailing
 * --config/--set without its value stays in argv, for the tool to reject. */
int mc_config_take_args(int *argc, char **argv, char **taken);
/* Parses a split argument: "equal", "weighted", "explicit" (keeps l->split_pattern) or a
 * pattern with pipes ("AEME|AEMR"). */
int mc_layout_parse_split(mc_layout *l, const char *text);
const char *mc_split_name(mc_split_mode s);
/* Canonical JSON of the whole config (malloc'd; caller frees). */
char *mc_config_to_json(const mc_config *cfg);

/* What a resume may change of the checkpoint's configuration (docs/training.md, "Resuming"):
 * model keys never (the checkpoint's tensors fix them); the keys that define the run's
 * optimisation (schedule, optimizer, global batch, seed, validation split) only when the user
 * forces it; everything else (steps, layout, device, dtype, logging, checkpoints, data path). */
typedef enum { MC_RESUME_FREE = 0, MC_RESUME_FORCE = 1, MC_RESUME_NEVER = 2 } mc_resume_rule;
mc_resume_rule mc_config_resume_rule(const char *section, const char *key);
/* The keys a launch decides rather than the run, so a resume takes them from this launch's
 * defaults and arguments, not from the checkpoint: the layout (parallel.*), which must match
 * the processes started. Copies them from launch into run. */
void mc_config_take_launch(mc_config *run, const mc_config *launch);
/* Calls fn for every key whose value differs between a and b, in table order, with both
 * values as JSON text. 0, or -1 with mc_error set. */
typedef void (*mc_config_diff_fn)(const char *section, const char *key, const char *a, const char *b, void *user);
int mc_config_diff(const mc_config *a, const mc_config *b, mc_config_diff_fn fn, void *user);

/* Vp: vocab rounded up to vocab_pad. */
static inline int mc_vocab_padded(const mc_model *m) {
  return m->vocab_pad > 0 ? (m->vocab_size + m->vocab_pad - 1) / m->vocab_pad * m->vocab_pad : m->vocab_size;
}
static inline int mc_mamba_heads(const mc_model *m) {
  return m->mamba_head_dim > 0 ? m->mamba_inner / m->mamba_head_dim : 0;
}
/* Assignments an expert takes per sequence of seq_len positions (docs/design.md routing contract:
 * ceil(T * k / E * capacity_factor)); 0 = dropless. */
static inline int mc_moe_capacity(const mc_model *m) {
  if (m->capacity_factor <= 0) return 0;
  return (int)ceil((double)m->seq_len * m->top_k / m->n_experts * m->capacity_factor);
}
/* Whether an E block routing T positions per sequence is a plain SwiGLU: one expert, one
 * choice, and no assignment can be dropped (the trainer then skips routing; mcplan counts
 * what it keeps). */
static inline int mc_moe_is_plain(const mc_model *m, int T) {
  const int cap = mc_moe_capacity(m);
  return m->n_experts == 1 && m->top_k == 1 && (cap == 0 || cap >= T);
}

/* The JSON Schema (schemas/config.schema.json) and the markdown key reference
 * (docs/config.md), both generated from the key table that drives parsing; tests compare
 * the committed files with them. malloc'd; caller frees; NULL on error. */
char *mc_config_schema_json(void);
char *mc_config_reference_markdown(void);

#endif
