/* Configuration: one table of keys drives parsing (JSON files and --set), the completeness
 * check of the embedded default, canonical JSON output, the JSON Schema and the key
 * reference in docs/config.md, so that all of them agree by construction. */
#include "core/config.h"
#include "core/json_num.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blocks.h"
#include "mc_default_config.h"
#include "util/error.h"

typedef enum { K_INT, K_FLOAT, K_BOOL, K_STRING, K_ENUM, K_U64, K_PATTERN, K_SPLIT } key_type;

#define XMIN 1 /* the minimum itself is excluded */
#define XMAX 2 /* the maximum itself is excluded */
#define IMAX 2147483647.0
/* Largest integer every double holds exactly: JSON numbers above it cannot carry a seed. */
#define U64_JSON_MAX 9007199254740992.0
#define MAX_FILE_BYTES (16u << 20)

typedef struct {
  const char *section, *key;
  key_type type;
  size_t off, size;
  double min, max;     /* numbers: value range; strings: length range */
  int excl;            /* XMIN | XMAX for open ends of a float range */
  const char *allowed; /* "a|b|c": values of an enum, or the only values an int may take */
  const char *desc;
} cfg_key;

/* _Generic makes a table row fail to compile if the field's C type does not match the key type. */
#define CFG(f) ((mc_config *)0)->f
#define INT_KEY(s, k, f, lo, hi, allowed, d) \
  {s, k, K_INT, _Generic(CFG(f), int: offsetof(mc_config, f)), sizeof(int), lo, hi, 0, allowed, d}
#define FLT_KEY(s, k, f, lo, hi, excl, d) \
  {s, k, K_FLOAT, _Generic(CFG(f), double: offsetof(mc_config, f)), sizeof(double), lo, hi, excl, NULL, d}
#define BOOL_KEY(s, k, f, d) {s, k, K_BOOL, _Generic(CFG(f), int: offsetof(mc_config, f)), sizeof(int), 0, 1, 0, NULL, d}
#define STR_KEY(s, k, f, minlen, d) \
  {s, k, K_STRING, _Generic(CFG(f), char *: offsetof(mc_config, f)), sizeof(CFG(f)), minlen, sizeof(CFG(f)) - 1, 0, NULL, d}
#define ENUM_KEY(s, k, f, allowed, d) \
  {s, k, K_ENUM, _Generic(CFG(f), char *: offsetof(mc_config, f)), sizeof(CFG(f)), 0, 0, 0, allowed, d}

static const char *const k_sections[] = {"model", "parallel", "train", "optim", "data", "checkpoint"};
#define N_SECTIONS 6

/* Sections appear in this order; model comes before parallel so that the stage boundaries of
 * a piped model.pattern are known when parallel.pp_split is read. */
static const cfg_key k_keys[] = {
    {"model", "pattern", K_PATTERN, offsetof(mc_config, model.pattern), sizeof(CFG(model.pattern)), 1, MC_MAX_LAYERS, 0,
     "AMER",
     "Block letters in depth order: A attention, M Mamba-2 mixer, E mixture-of-experts FFN, R gated linear "
     "recurrence. '|' between letters marks pipeline-stage boundaries and selects the explicit stage split."},
    INT_KEY("model", "vocab_size", model.vocab_size, 1, 16777216, NULL, "Vocabulary size V."),
    INT_KEY("model", "vocab_pad", model.vocab_pad, 1, 65536, NULL,
            "Vp = V rounded up to a multiple of this; embedding and head have Vp rows."),
    INT_KEY("model", "d_model", model.d_model, 1, 65536, NULL, "Model width d."),
    INT_KEY("model", "n_heads", model.n_heads, 1, 1024, NULL, "Query heads H of attention blocks."),
    INT_KEY("model", "n_kv_heads", model.n_kv_heads, 1, 1024, NULL, "Key/value heads KV (grouped-query attention)."),
    INT_KEY("model", "head_dim", model.head_dim, 1, 1024, NULL, "Attention head dimension hd."),
    INT_KEY("model", "n_experts", model.n_experts, 1, 4096, NULL, "Experts E of each MoE block."),
    INT_KEY("model", "top_k", model.top_k, 1, 64, NULL, "Experts k each token is routed to."),
    INT_KEY("model", "expert_hidden", model.expert_hidden, 1, 1048576, NULL, "Hidden width F of each SwiGLU expert."),
    FLT_KEY("model", "capacity_factor", model.capacity_factor, 0, 1000, 0,
            "Per-sequence expert capacity factor cf: capacity = ceil(T*k/E*cf); 0 = dropless."),
    FLT_KEY("model", "aux_loss_coef", model.aux_loss_coef, 0, 100, 0, "Weight of the MoE load-balancing loss."),
    INT_KEY("model", "mamba_inner", model.mamba_inner, 1, 1048576, NULL, "Mamba inner width Di."),
    INT_KEY("model", "mamba_head_dim", model.mamba_head_dim, 1, 65536, NULL,
            "Mamba head dimension hdm; Mamba heads Hm = Di/hdm."),
    INT_KEY("model", "ssm_state", model.ssm_state, 1, 65536, NULL, "SSM state size N."),
    INT_KEY("model", "conv_width", model.conv_width, 1, 1024, NULL, "Width K of the causal depthwise convolution."),
    INT_KEY("model", "rec_width", model.rec_width, 1, 1048576, NULL, "Recurrence width Dr of R blocks."),
    INT_KEY("model", "seq_len", model.seq_len, 1, 16777216, NULL, "Sequence length T (tokens per window)."),
    FLT_KEY("model", "rope_theta", model.rope_theta, 0, 1e12, XMIN, "RoPE base theta."),
    FLT_KEY("model", "norm_eps", model.norm_eps, 0, 1, XMIN, "RMSNorm epsilon."),
    FLT_KEY("model", "init_std", model.init_std, 0, 10, 0, "Standard deviation of the normal initialisation."),

    INT_KEY("parallel", "tp", parallel.tp, 1, 1024, NULL, "Tensor-parallel degree."),
    INT_KEY("parallel", "pp", parallel.pp, 1, MC_MAX_STAGES, NULL, "Pipeline-parallel degree (number of stages)."),
    INT_KEY("parallel", "dp", parallel.dp, 1, 65536, NULL, "Data-parallel degree; world = tp*dp*pp."),
    INT_KEY("parallel", "ep", parallel.ep, 1, 4096, NULL,
            "Expert-parallel degree, formed inside each stage from its tp*dp ranks."),
    BOOL_KEY("parallel", "sp", parallel.sp, "Sequence parallelism (required when tp > 1 and ep > 1)."),
    INT_KEY("parallel", "zero", parallel.zero, 0, 3, "0|1|3",
            "ZeRO stage over the (expert-)data-parallel group: 0 replicated, 1 master weights and moments "
            "sharded, 3 working parameters sharded too."),
    {"parallel", "pp_split", K_SPLIT, offsetof(mc_config, parallel), sizeof(mc_layout), 0, 0, 0, "equal|weighted|explicit",
     "Stage split: equal (layer counts), weighted (per-block cost model), explicit (the '|' of model.pattern), "
     "or a pattern with '|' such as AEME|AEMR."},

    INT_KEY("train", "steps", train.steps, 0, IMAX, NULL, "Optimizer steps to run."),
    INT_KEY("train", "global_batch", train.global_batch, 1, 16777216, NULL, "Sequences per optimizer step."),
    INT_KEY("train", "micro_batch", train.micro_batch, 1, 16777216, NULL,
            "Sequences per micro-batch per data-parallel rank."),
    FLT_KEY("train", "lr", train.lr, 0, 10, 0, "Peak learning rate, reached at the end of the warmup."),
    FLT_KEY("train", "min_lr", train.min_lr, 0, 10, 0, "Learning rate at the end of the cosine decay."),
    INT_KEY("train", "warmup_steps", train.warmup_steps, 0, IMAX, NULL, "Steps of linear warmup."),
    FLT_KEY("train", "beta1", train.beta1, 0, 1, XMAX, "AdamW first-moment decay."),
    FLT_KEY("train", "beta2", train.beta2, 0, 1, XMAX, "AdamW second-moment decay."),
    FLT_KEY("train", "adam_eps", train.adam_eps, 0, 1, XMIN, "AdamW epsilon."),
    FLT_KEY("train", "weight_decay", train.weight_decay, 0, 10, 0,
            "Decoupled weight decay, applied to 2-D and 3-D weights only."),
    FLT_KEY("train", "grad_clip", train.grad_clip, 0, 1e9, 0, "Global gradient-norm clipping threshold; 0 = no clipping."),
    {"train", "seed", K_U64, _Generic(CFG(train.seed), uint64_t: offsetof(mc_config, train.seed)), sizeof(uint64_t), 0,
     18446744073709551615.0, 0, NULL,
     "Seed of all counter-based randomness (initialisation, data order). Above 2^53 write it as a decimal string."},
    ENUM_KEY("train", "recompute", train.recompute, "none|selective|full", "Activation recomputation policy: none keeps every activation a layer's backward reads; selective keeps each layer's input, its norm's 1/rms and the products' outputs and recomputes the rest (norm, activations, convs, scan, attention core) just before the layer's backward; full keeps each layer's input only and re-runs the layer's forward there. Losses and gradients are those of none bit for bit on the CPU; mcplan counts exactly what each keeps (docs/training.md, Recomputation)."),
    ENUM_KEY("train", "dtype", train.dtype, "fp32|bf16",
             "Compute dtype; master weights and optimizer moments stay fp32."),
    ENUM_KEY("train", "device", train.device, "cpu|cuda", "Where the trainer computes."),
    INT_KEY("train", "log_every", train.log_every, 1, IMAX, NULL, "Log metrics every N steps."),
    INT_KEY("train", "eval_every", train.eval_every, 0, IMAX, NULL, "Evaluate on held-out windows every N steps; 0 = never."),
    INT_KEY("train", "eval_batches", train.eval_batches, 0, 1000000, NULL, "Batches per evaluation."),
    STR_KEY("train", "metrics", train.metrics, 0, "Metrics log path; empty = metrics.jsonl inside checkpoint.dir."),

    STR_KEY("optim", "groups", train.optim.groups, 1,
            "Which optimizer trains each family: comma-separated OPTIMIZER:SELECTOR rules, first match wins, every "
            "family must match one. Optimizers: adamw, muon (2-D families only). Selectors: matrices (2-D "
            "matrix-product weights but the embedding, head and router), experts (3-D), vectors (1-D), embed, head, "
            "router, all, or a glob on the family name. Example: muon:matrices,adamw:all (docs/training.md, "
            "Optimizer groups)."),
    FLT_KEY("optim", "muon_momentum", train.optim.muon_momentum, 0, 1, XMAX, "Muon momentum mu: M = mu*M + g."),
    BOOL_KEY("optim", "muon_nesterov", train.optim.muon_nesterov,
             "Muon orthogonalises the Nesterov direction g + mu*M (else M)."),
    INT_KEY("optim", "muon_ns_steps", train.optim.muon_ns_steps, 1, 100, NULL,
            "Newton-Schulz iterations of Muon's orthogonalisation (quintic, coefficients 3.4445, -4.7750, 2.0315)."),

    STR_KEY("data", "path", data.path, 0, "HDF5 token dataset made by mcdata."),
    FLT_KEY("data", "val_fraction", data.val_fraction, 0, 1, XMAX, "Share of windows held out for evaluation."),

    STR_KEY("checkpoint", "dir", checkpoint.dir, 1, "Run directory: checkpoint N goes to step_N/ inside it, and the file latest names the newest."),
    INT_KEY("checkpoint", "every", checkpoint.every, 0, IMAX, NULL, "Save every N steps; 0 = only at the end."),
    INT_KEY("checkpoint", "keep", checkpoint.keep, 0, 1000000, NULL, "Keep the last K committed checkpoints; 0 = all."),
    BOOL_KEY("checkpoint", "async_save", checkpoint.async_save, "Write checkpoints in the background while training continues."),
    BOOL_KEY("checkpoint", "verify", checkpoint.verify, "Hash-verify every read."),
    INT_KEY("checkpoint", "io_threads", checkpoint.io_threads, 0, 256, NULL,
            "Threads for hashing and I/O, per rank; 0 = the host's online cores divided among the job's ranks on it "
            "(LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or SLURM_STEP_TASKS_PER_NODE), at least 2 and at most 16 "
            "(docs/checkpoint.md, Threads)."),
    ENUM_KEY("checkpoint", "compress", checkpoint.compress, "none|deflate",
             "Rank-file datasets: none stores them contiguous; deflate stores them in chunks of whole rows through "
             "HDF5's shuffle and deflate (zlib level 1) filters. Hashes stay over the raw fp32 bytes; readers accept "
             "either (docs/checkpoint.md, Compression, has the measured ratios)."),
};
#define N_KEYS ((int)(sizeof k_keys / sizeof k_keys[0]))

/* ------------------------------------------------------------------ small helpers */

static void add_num(cJSON *obj, const char *name, double v) { cJSON_AddItemToObject(obj, name, mc_json_number(v)); }

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  memset(dst, 0, cap); /* whole buffer, so configs compare equal byte for byte */
  memcpy(dst, src, n < cap ? n : cap - 1);
}

static int token_in(const char *list, const char *tok) {
  size_t n = strlen(tok);
  for (const char *p = list; p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, tok, n)) return 1;
    p = bar ? bar + 1 : NULL;
  }
  return 0;
}

/* "a|b|c" -> "a, b, c" (quoted when `quote`). */
static void list_text(const char *list, int quote, char *buf, size_t cap) {
  size_t off = 0;
  buf[0] = 0;
  for (const char *p = list; p && off < cap;) {
    const char *bar = strchr(p, '|');
    int len = bar ? (int)(bar - p) : (int)strlen(p);
    off += (size_t)snprintf(buf + off, cap - off, "%s%s%.*s%s", off ? ", " : "", quote ? "\"" : "", len, p,
                            quote ? "\"" : "");
    p = bar ? bar + 1 : NULL;
  }
}

static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63) return 99;
  int d[64][64];
  for (int i = 0; i <= la; i++) d[i][0] = i;
  for (int j = 0; j <= lb; j++) d[0][j] = j;
  for (int i = 1; i <= la; i++)
    for (int j = 1; j <= lb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

static int find_section(const char *name) {
  for (int s = 0; s < N_SECTIONS; s++)
    if (!strcmp(k_sections[s], name)) return s;
  return -1;
}

static int find_key(const char *section, const char *key) {
  for (int i = 0; i < N_KEYS; i++)
    if (!strcmp(k_keys[i].section, section) && !strcmp(k_keys[i].key, key)) return i;
  return -1;
}

/* " (did you mean \"x\"?)" for a near miss, else "". */
static void suggest(const char *section, const char *name, char *buf, size_t cap) {
  const char *best = NULL;
  int bd = 3;
  for (int i = 0; i < (section ? N_KEYS : N_SECTIONS); i++) {
    const char *cand = section ? k_keys[i].key : k_sections[i];
    if (section && strcmp(k_keys[i].section, section)) continue;
    int dist = edit_distance(name, cand);
    if (dist < bd) bd = dist, best = cand;
  }
  buf[0] = 0;
  if (best) snprintf(buf, cap, " (did you mean \"%s\"?)", best);
}

static const char *json_kind(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v) ? "true" : "false";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "an invalid value";
}

static const char *expected_kind(key_type t) {
  switch (t) {
    case K_INT: return "an integer";
    case K_FLOAT: return "a number";
    case K_BOOL: return "true or false";
    case K_U64: return "a non-negative integer or a decimal string";
    default: return "a string";
  }
}

/* ------------------------------------------------------------------ applying values */

typedef struct {
  mc_config *cfg;
  const char *origin;
  mc_errlist *errs;
  int piped_pattern; /* this document's model.pattern carried stage boundaries */
  int split_given;   /* this document set parallel.pp_split */
} apply_ctx;

static void key_err(apply_ctx *c, const cfg_key *k, const char *fmt, ...) MC_PRINTF(3, 4);
static void key_err(apply_ctx *c, const cfg_key *k, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  mc_errlist_add(c->errs, "%s: %s.%s: %s", c->origin, k->section, k->key, what);
}

static void range_text(const cfg_key *k, char *buf, size_t cap) {
  char lo[32], hi[32];
  mc_json_number_text(k->min, lo, sizeof lo);
  mc_json_number_text(k->max, hi, sizeof hi);
  snprintf(buf, cap, "%s%s, %s%s", k->excl & XMIN ? "(" : "[", lo, hi, k->excl & XMAX ? ")" : "]");
}

static int in_range(const cfg_key *k, double v) {
  if (k->excl & XMIN ? v <= k->min : v < k->min) return 0;
  if (k->excl & XMAX ? v >= k->max : v > k->max) return 0;
  return 1;
}

static void printable_char(char ch, char *buf, size_t cap) {
  if (isprint((unsigned char)ch)) snprintf(buf, cap, "'%c'", ch);
  else snprintf(buf, cap, "byte 0x%02x", (unsigned char)ch);
}

/* Syntax of a block pattern, optionally with '|' stage boundaries: every problem is recorded.
 * Positions are 0-based offsets into the text as written. Returns the number of problems. */
static int check_pattern(apply_ctx *c, const cfg_key *k, const char *text) {
  int before = c->errs->n, letters = 0;
  size_t n = strlen(text);
  if (n == 0) key_err(c, k, "is empty (needs at least one block letter)");
  for (size_t i = 0; i < n; i++) {
    char ch[16];
    if (text[i] == '|') {
      if (i == 0 || i + 1 == n || text[i + 1] == '|')
        key_err(c, k, "'|' at position %zu leaves an empty stage in \"%s\"", i, text);
      continue;
    }
    letters++;
    if (!strchr(mc_block_letters(), text[i])) {
      printable_char(text[i], ch, sizeof ch);
      key_err(c, k, "unknown block letter %s at position %zu (known: A, M, E, R)", ch, i);
    }
  }
  if (letters > MC_MAX_LAYERS) key_err(c, k, "has %d layers, more than the maximum %d", letters, MC_MAX_LAYERS);
  return c->errs->n - before;
}

static void apply_pattern(apply_ctx *c, const cfg_key *k, const char *text) {
  if (check_pattern(c, k, text)) return;
  mc_model *m = &c->cfg->model;
  char flat[MC_MAX_LAYERS + 1];
  int n = 0;
  for (const char *p = text; *p; p++)
    if (*p != '|') flat[n++] = *p;
  flat[n] = 0;
  copy_str(m->pattern, sizeof m->pattern, flat);
  m->n_layers = n;
  if (strchr(text, '|')) {
    mc_layout *l = &c->cfg->parallel;
    l->split = MC_SPLIT_EXPLICIT;
    copy_str(l->split_pattern, sizeof l->split_pattern, text);
    c->piped_pattern = 1;
  }
}

static void apply_split(apply_ctx *c, const cfg_key *k, const char *text) {
  mc_layout *l = &c->cfg->parallel;
  int named = token_in(k->allowed, text);
  if (!named) {
    if (!strchr(text, '|')) {
      char opts[128];
      list_text(k->allowed, 1, opts, sizeof opts);
      key_err(c, k, "\"%s\" is not one of %s or a pattern with '|' stage boundaries", text, opts);
      return;
    }
    if (check_pattern(c, k, text)) return;
  } else if (c->piped_pattern && strcmp(text, "explicit")) {
    key_err(c, k, "\"%s\" contradicts the '|' stage boundaries in model.pattern of the same document", text);
    return;
  }
  mc_layout tmp = *l;
  if (mc_layout_parse_split(&tmp, text)) {
    mc_errlist_add(c->errs, "%s: %s", c->origin, mc_errmsg());
    return;
  }
  /* The boundaries only mean something for an explicit split; clearing them otherwise keeps
   * the configuration canonical (to_json and back gives the same bytes). */
  char keep[sizeof tmp.split_pattern];
  copy_str(keep, sizeof keep, tmp.split != MC_SPLIT_EXPLICIT ? "" : tmp.split_pattern);
  copy_str(tmp.split_pattern, sizeof tmp.split_pattern, keep); /* zero the tail too */
  *l = tmp;
  c->split_given = 1;
}

static void apply_u64(apply_ctx *c, const cfg_key *k, const cJSON *v, uint64_t *dst) {
  if (cJSON_IsNumber(v)) {
    double d = v->valuedouble;
    char num[40];
    mc_json_number_text(d, num, sizeof num);
    if (!isfinite(d) || d != floor(d) || d < 0) key_err(c, k, "%s is not a non-negative integer", num);
    else if (d > U64_JSON_MAX)
      key_err(c, k, "%s is above 2^53, which a JSON number cannot carry exactly; write it as a decimal string", num);
    else *dst = (uint64_t)d;
    return;
  }
  if (!cJSON_IsString(v)) {
    key_err(c, k, "expected %s, got %s", expected_kind(k->type), json_kind(v));
    return;
  }
  const char *s = v->valuestring;
  size_t n = strlen(s), i = 0;
  while (i < n && isdigit((unsigned char)s[i])) i++;
  if (n == 0 || i != n) {
    key_err(c, k, "\"%s\" is not a non-negative decimal integer", s);
    return;
  }
  errno = 0;
  unsigned long long u = strtoull(s, NULL, 10);
  if (errno == ERANGE || n > 20) key_err(c, k, "\"%s\" is above the maximum 18446744073709551615", s);
  else *dst = (uint64_t)u;
}

static void apply_value(apply_ctx *c, const cfg_key *k, const cJSON *v) {
  char *base = (char *)c->cfg + k->off;
  char num[40], range[96], opts[128];
  switch (k->type) {
    case K_INT:
    case K_FLOAT: {
      if (!cJSON_IsNumber(v)) {
        key_err(c, k, "expected %s, got %s", expected_kind(k->type), json_kind(v));
        return;
      }
      double d = v->valuedouble;
      if (d == 0) d = 0; /* -0 reads as 0 */
      mc_json_number_text(d, num, sizeof num);
      if (!isfinite(d)) {
        key_err(c, k, "%s is not a finite number", num);
        return;
      }
      if (k->type == K_INT && d != floor(d)) {
        key_err(c, k, "%s is not an integer", num);
        return;
      }
      if (k->allowed) {
        if (!token_in(k->allowed, num)) {
          list_text(k->allowed, 0, opts, sizeof opts);
          key_err(c, k, "%s is not one of %s", num, opts);
          return;
        }
      } else if (!in_range(k, d)) {
        range_text(k, range, sizeof range);
        key_err(c, k, "%s is out of range %s", num, range);
        return;
      }
      if (k->type == K_INT) *(int *)base = (int)d;
      else *(double *)base = d;
      return;
    }
    case K_BOOL:
      if (!cJSON_IsBool(v)) {
        key_err(c, k, "expected %s, got %s", expected_kind(k->type), json_kind(v));
        return;
      }
      *(int *)base = cJSON_IsTrue(v) ? 1 : 0;
      return;
    case K_U64: apply_u64(c, k, v, (uint64_t *)base); return;
    default: break;
  }
  if (!cJSON_IsString(v)) {
        key_err(c, k, "expected %s, got %s", expected_kind(k->type), json_kind(v));
        return;
      }
  const char *s = v->valuestring;
  size_t n = strlen(s);
  switch (k->type) {
    case K_STRING:
      if (n < (size_t)k->min) key_err(c, k, "must not be empty");
      else if (n > (size_t)k->max) key_err(c, k, "is %zu characters long, more than the maximum %d", n, (int)k->max);
      else copy_str(base, k->size, s);
      return;
    case K_ENUM:
      if (!token_in(k->allowed, s)) {
        list_text(k->allowed, 1, opts, sizeof opts);
        key_err(c, k, "\"%s\" is not one of %s", s, opts);
      } else copy_str(base, k->size, s);
      return;
    case K_PATTERN: apply_pattern(c, k, s); return;
    case K_SPLIT: apply_split(c, k, s); return;
    default: return;
  }
}

/* ------------------------------------------------------------------ documents */

/* "line L, column C" of a byte offset. */
static void where_in(const char *text, size_t off, char *buf, size_t cap) {
  int line = 1, col = 1;
  for (size_t i = 0; i < off && text[i]; i++) {
    if (text[i] == '\n') line++, col = 1;
    else col++;
  }
  snprintf(buf, cap, "line %d, column %d", line, col);
}

static int raise_list(const mc_errlist *errs, const char *origin) {
  if (errs->n == 1) return mc_error("%s", errs->msg[0]);
  char header[MC_PATH_MAX + 64];
  snprintf(header, sizeof header, "%s: invalid configuration", origin);
  return mc_errlist_raise(errs, header);
}

/* Overlays one JSON document on cfg; all-or-nothing. `seen` (N_KEYS flags, may be NULL)
 * records which keys the document set. */
static int apply_doc(mc_config *cfg, const char *json, const char *origin, unsigned char *seen) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
  if (!root) {
    char where[64];
    size_t off = end ? (size_t)(end - json) : 0;
    where_in(json, off, where, sizeof where);
    if (end && !*end) return mc_error("%s: not valid JSON: unexpected end of input at %s", origin, where);
    char near[24] = "";
    for (int i = 0; end && i < 20 && end[i] && end[i] != '\n' && end[i] != '\r'; i++) near[i] = end[i];
    if (!near[0]) return mc_error("%s: not valid JSON at %s (end of the line)", origin, where);
    return mc_error("%s: not valid JSON at %s, near \"%s\"", origin, where, near);
  }
  mc_errlist errs;
  mc_errlist_init(&errs);
  mc_config work = *cfg;
  apply_ctx c = {&work, origin, &errs, 0, 0};
  const cJSON *sec_item[N_SECTIONS] = {0};
  char hint[96];
  if (!cJSON_IsObject(root)) {
    mc_errlist_add(&errs, "%s: the top level must be an object with sections model, parallel, train, data, checkpoint; got %s",
                   origin, json_kind(root));
  } else {
    for (const cJSON *s = root->child; s; s = s->next) {
      int si = find_section(s->string);
      if (si < 0) {
        suggest(NULL, s->string, hint, sizeof hint);
        mc_errlist_add(&errs, "%s: unknown section \"%s\"%s (known: model, parallel, train, data, checkpoint)", origin,
                       s->string, hint);
      } else if (sec_item[si]) {
        mc_errlist_add(&errs, "%s: section \"%s\" appears twice", origin, s->string);
      } else if (!cJSON_IsObject(s)) {
        mc_errlist_add(&errs, "%s: section \"%s\" must be an object, got %s", origin, s->string, json_kind(s));
      } else {
        sec_item[si] = s;
      }
    }
  }
  for (int si = 0; si < N_SECTIONS; si++) {
    if (!sec_item[si]) continue;
    unsigned char given[N_KEYS] = {0};
    for (const cJSON *v = sec_item[si]->child; v; v = v->next) {
      int ki = find_key(k_sections[si], v->string);
      if (ki < 0) {
        suggest(k_sections[si], v->string, hint, sizeof hint);
        mc_errlist_add(&errs, "%s: %s.%s: unknown key%s", origin, k_sections[si], v->string, hint);
        continue;
      }
      if (given[ki]++) {
        mc_errlist_add(&errs, "%s: %s.%s: given twice", origin, k_sections[si], v->string);
        continue;
      }
      apply_value(&c, &k_keys[ki], v);
      if (seen) seen[ki] = 1;
    }
  }
  cJSON_Delete(root);
  if (errs.n) return raise_list(&errs, origin);
  *cfg = work;
  return 0;
}

int mc_config_default(mc_config *cfg) {
  mc_config work;
  memset(&work, 0, sizeof work);
  unsigned char seen[N_KEYS] = {0};
  const char *origin = "embedded default configuration (configs/default.json)";
  if (apply_doc(&work, mc_default_config_json, origin, seen)) return -1;
  /* Every key takes its default from the one embedded file, never from C code. */
  mc_errlist errs;
  mc_errlist_init(&errs);
  for (int i = 0; i < N_KEYS; i++)
    if (!seen[i]) mc_errlist_add(&errs, "%s: %s.%s: missing (every key needs a default)", origin, k_keys[i].section, k_keys[i].key);
  if (errs.n) return raise_list(&errs, origin);
  *cfg = work;
  return 0;
}

int mc_config_apply_json(mc_config *cfg, const char *json, const char *origin) {
  return apply_doc(cfg, json, origin ? origin : "(json)", NULL);
}

int mc_config_apply_file(mc_config *cfg, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return mc_error("%s: cannot open config file: %s", path, strerror(errno));
  char *buf = malloc(MAX_FILE_BYTES + 1);
  if (!buf) {
    fclose(f);
    return mc_error("%s: out of memory reading config file", path);
  }
  size_t n = fread(buf, 1, MAX_FILE_BYTES + 1, f);
  int bad = ferror(f);
  fclose(f);
  int rc;
  if (bad) rc = mc_error("%s: cannot read config file", path);
  else if (n > MAX_FILE_BYTES) rc = mc_error("%s: config file is larger than %u bytes", path, MAX_FILE_BYTES);
  else {
    buf[n] = 0;
    if (strlen(buf) != n) rc = mc_error("%s: config file contains a NUL byte at offset %zu", path, strlen(buf));
    else rc = apply_doc(cfg, buf, path, NULL);
  }
  free(buf);
  return rc;
}

/* --set text -> a JSON value of the key's type, so --set and files share apply_value. */
static cJSON *set_value(const cfg_key *k, const char *text) {
  char *end = NULL;
  switch (k->type) {
    case K_INT: {
      const char *p = text + (*text == '-' || *text == '+');
      if (!*p) break;
      while (isdigit((unsigned char)*p)) p++;
      if (*p) break;
      return cJSON_CreateNumber(strtod(text, NULL));
    }
    case K_FLOAT: {
      errno = 0;
      double d = strtod(text, &end);
      if (end == text || *end || !isfinite(d)) break;
      return cJSON_CreateNumber(d);
    }
    case K_BOOL:
      if (!strcmp(text, "true") || !strcmp(text, "1")) return cJSON_CreateTrue();
      if (!strcmp(text, "false") || !strcmp(text, "0")) return cJSON_CreateFalse();
      break;
    default: return cJSON_CreateString(text);
  }
  mc_error("--set: %s.%s: \"%s\" is not %s", k->section, k->key, text, expected_kind(k->type));
  return NULL;
}

int mc_config_set(mc_config *cfg, const char *assignment) {
  const char *eq = strchr(assignment, '=');
  const char *dot = eq ? memchr(assignment, '.', (size_t)(eq - assignment)) : NULL;
  if (!eq || !dot || dot == assignment)
    return mc_error("--set: \"%s\" is not of the form section.key=value", assignment);
  char section[64], key[64], hint[96];
  int sl = (int)(dot - assignment), kl = (int)(eq - dot - 1);
  if (sl >= (int)sizeof section || kl >= (int)sizeof key || kl == 0)
    return mc_error("--set: \"%s\" is not of the form section.key=value", assignment);
  snprintf(section, sizeof section, "%.*s", sl, assignment);
  snprintf(key, sizeof key, "%.*s", kl, dot + 1);
  if (find_section(section) < 0) {
    suggest(NULL, section, hint, sizeof hint);
    return mc_error("--set: unknown section \"%s\"%s (known: model, parallel, train, data, checkpoint)", section, hint);
  }
  int ki = find_key(section, key);
  if (ki < 0) {
    suggest(section, key, hint, sizeof hint);
    return mc_error("--set: %s.%s: unknown key%s", section, key, hint);
  }
  cJSON *v = set_value(&k_keys[ki], eq + 1);
  if (!v) return -1;
  mc_errlist errs;
  mc_errlist_init(&errs);
  mc_config work = *cfg;
  apply_ctx c = {&work, "--set", &errs, 0, 0};
  apply_value(&c, &k_keys[ki], v);
  cJSON_Delete(v);
  if (errs.n) return raise_list(&errs, "--set");
  *cfg = work;
  return 0;
}

int mc_config_take_args(int *argc, char **argv, char **taken) {
  int n = *argc, out = 1, nt = 1;
  taken[0] = argv[0];
  for (int i = 1; i < n; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) { /* everything after "--" belongs to the program */
      while (i < n) argv[out++] = argv[i++];
      break;
    }
    if ((!strcmp(a, "--config") || !strcmp(a, "--set")) && i + 1 < n) {
      taken[nt++] = argv[i++];
      taken[nt++] = argv[i];
    } else if (!strncmp(a, "--config=", 9) || !strncmp(a, "--set=", 6)) {
      taken[nt++] = argv[i];
    } else {
      argv[out++] = argv[i];
    }
  }
  if (out < n) argv[out] = NULL;
  taken[nt] = NULL;
  *argc = out;
  return nt;
}

int mc_config_from_args(mc_config *cfg, int *argc, char **argv) {
  if (mc_config_default(cfg)) return -1;
  return mc_config_overlay_args(cfg, argc, argv, NULL);
}

int mc_config_overlay_args(mc_config *cfg, int *argc, char **argv, int *applied) {
  mc_config work = *cfg;
  int n = *argc, seen = 0;
  const char **sets = malloc(sizeof *sets * (size_t)(n > 0 ? n : 1));
  char *consumed = calloc((size_t)(n > 0 ? n : 1), 1);
  if (!sets || !consumed) {
    free(sets);
    free(consumed);
    return mc_error("out of memory parsing the command line");
  }
  int nsets = 0, rc = 0;
  for (int i = 1; i < n && rc == 0; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) break; /* everything after "--" belongs to the program */
    int is_config = !strcmp(a, "--config");
    if (is_config || !strcmp(a, "--set")) {
      if (i + 1 >= n) {
        rc = mc_error("%s needs an argument (%s)", a, is_config ? "a config file" : "section.key=value");
        break;
      }
      consumed[i] = consumed[i + 1] = 1;
      seen++;
      if (is_config) rc = mc_config_apply_file(&work, argv[i + 1]);
      else sets[nsets++] = argv[i + 1];
      i++;
    } else if (!strncmp(a, "--config=", 9)) {
      consumed[i] = 1;
      seen++;
      rc = a[9] ? mc_config_apply_file(&work, a + 9) : mc_error("--config= needs a file name");
    } else if (!strncmp(a, "--set=", 6)) {
      consumed[i] = 1;
      seen++;
      sets[nsets++] = a + 6;
    }
  }
  for (int i = 0; i < nsets && rc == 0; i++) rc = mc_config_set(&work, sets[i]);
  if (rc == 0) {
    int out = 0;
    for (int i = 0; i < n; i++)
      if (!consumed[i]) argv[out++] = argv[i];
    if (out < n) argv[out] = NULL;
    *argc = out;
    *cfg = work;
    if (applied) *applied = seen;
  }
  free(sets);
  free(consumed);
  return rc;
}

/* ------------------------------------------------------------------ output */

static cJSON *value_json(const mc_config *cfg, const cfg_key *k) {
  const char *base = (const char *)cfg + k->off;
  switch (k->type) {
    case K_INT: return mc_json_number(*(const int *)base);
    case K_FLOAT: return mc_json_number(*(const double *)base);
    case K_BOOL: return cJSON_CreateBool(*(const int *)base != 0);
    case K_STRING:
    case K_ENUM: return cJSON_CreateString(base);
    case K_U64: {
      uint64_t u = *(const uint64_t *)base;
      if (u <= (uint64_t)U64_JSON_MAX) return mc_json_number((double)u);
      char digits[24];
      snprintf(digits, sizeof digits, "%llu", (unsigned long long)u);
      return cJSON_CreateString(digits);
    }
    case K_PATTERN: return cJSON_CreateString(cfg->model.pattern);
    case K_SPLIT: {
      const mc_layout *l = &cfg->parallel;
      if (l->split == MC_SPLIT_EXPLICIT && l->split_pattern[0]) return cJSON_CreateString(l->split_pattern);
      return cJSON_CreateString(mc_split_name(l->split));
    }
  }
  return NULL;
}

static cJSON *config_tree(const mc_config *cfg) {
  cJSON *root = cJSON_CreateObject();
  for (int s = 0; root && s < N_SECTIONS; s++) {
    cJSON *sec = cJSON_AddObjectToObject(root, k_sections[s]);
    for (int i = 0; sec && i < N_KEYS; i++)
      if (!strcmp(k_keys[i].section, k_sections[s])) cJSON_AddItemToObject(sec, k_keys[i].key, value_json(cfg, &k_keys[i]));
  }
  return root;
}

char *mc_config_to_json(const mc_config *cfg) {
  cJSON *root = config_tree(cfg);
  char *out = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!out) mc_error("out of memory writing the configuration as JSON");
  return out;
}

/* ------------------------------------------------------------------ resuming */

/* The keys that define a run's optimisation (schedule, optimizer, batch, data order): a resume
 * keeps the checkpoint's values unless --force names a change. */
static const char *const k_resume_force[] = {
    "train.global_batch", "train.lr",      "train.min_lr",       "train.warmup_steps", "train.beta1",
    "train.beta2",        "train.adam_eps", "train.weight_decay", "train.grad_clip",    "train.seed",
    "data.val_fraction",  "optim.muon_momentum", "optim.muon_nesterov", "optim.muon_ns_steps", NULL};

mc_resume_rule mc_config_resume_rule(const char *section, const char *key) {
  /* the checkpoint's tensors fix the model; its optimizer states fix which optimizer trains what */
  if (!strcmp(section, "model") || (!strcmp(section, "optim") && !strcmp(key, "groups"))) return MC_RESUME_NEVER;
  char name[96];
  snprintf(name, sizeof name, "%s.%s", section, key);
  for (int i = 0; k_resume_force[i]; i++)
    if (!strcmp(k_resume_force[i], name)) return MC_RESUME_FORCE;
  return MC_RESUME_FREE;
}

void mc_config_take_launch(mc_config *run, const mc_config *launch) { run->parallel = launch->parallel; }

int mc_config_diff(const mc_config *a, const mc_config *b, mc_config_diff_fn fn, void *user) {
  cJSON *ta = config_tree(a), *tb = config_tree(b);
  int rc = ta && tb ? 0 : mc_error("out of memory comparing configurations");
  for (int i = 0; i < N_KEYS && rc == 0; i++) {
    const cfg_key *k = &k_keys[i];
    char *va = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ta, k->section), k->key));
    char *vb = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tb, k->section), k->key));
    if (!va || !vb) rc = mc_error("out of memory comparing configurations");
    else if (strcmp(va, vb) != 0) fn(k->section, k->key, va, vb, user);
    free(va), free(vb);
  }
  cJSON_Delete(ta), cJSON_Delete(tb);
  return rc;
}

/* ------------------------------------------------------------------ schema and reference */

/* The schema's pattern regex: block letters of the block-kind table, '|' only between them. */
static const char *pattern_re(void) {
  static char re[64];
  snprintf(re, sizeof re, "^[%s](\\|?[%s]){0,%d}$", mc_block_letters(), mc_block_letters(), MC_MAX_LAYERS - 1);
  return re;
}

static cJSON *key_schema(const cfg_key *k, const cJSON *def) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "description", k->desc);
  switch (k->type) {
    case K_INT:
      cJSON_AddStringToObject(p, "type", "integer");
      if (k->allowed) {
        cJSON *e = cJSON_AddArrayToObject(p, "enum");
        for (const char *q = k->allowed; q; q = strchr(q, '|') ? strchr(q, '|') + 1 : NULL)
          cJSON_AddItemToArray(e, mc_json_number(atoi(q)));
      } else {
        add_num(p, "minimum", k->min);
        add_num(p, "maximum", k->max);
      }
      break;
    case K_FLOAT:
      cJSON_AddStringToObject(p, "type", "number");
      add_num(p, k->excl & XMIN ? "exclusiveMinimum" : "minimum", k->min);
      add_num(p, k->excl & XMAX ? "exclusiveMaximum" : "maximum", k->max);
      break;
    case K_BOOL: cJSON_AddStringToObject(p, "type", "boolean"); break;
    case K_STRING:
      cJSON_AddStringToObject(p, "type", "string");
      add_num(p, "minLength", k->min);
      add_num(p, "maxLength", k->max);
      break;
    case K_ENUM: {
      cJSON_AddStringToObject(p, "type", "string");
      cJSON *e = cJSON_AddArrayToObject(p, "enum");
      for (const char *q = k->allowed; q;) {
        const char *bar = strchr(q, '|');
        char tok[32];
        snprintf(tok, sizeof tok, "%.*s", bar ? (int)(bar - q) : (int)strlen(q), q);
        cJSON_AddItemToArray(e, cJSON_CreateString(tok));
        q = bar ? bar + 1 : NULL;
      }
      break;
    }
    case K_U64: {
      cJSON *one = cJSON_AddArrayToObject(p, "oneOf");
      cJSON *num = cJSON_CreateObject(), *str = cJSON_CreateObject();
      cJSON_AddStringToObject(num, "type", "integer");
      add_num(num, "minimum", 0);
      add_num(num, "maximum", U64_JSON_MAX);
      cJSON_AddStringToObject(str, "type", "string");
      cJSON_AddStringToObject(str, "pattern", "^[0-9]{1,20}$");
      cJSON_AddItemToArray(one, num);
      cJSON_AddItemToArray(one, str);
      break;
    }
    case K_PATTERN:
      cJSON_AddStringToObject(p, "type", "string");
      cJSON_AddStringToObject(p, "pattern", pattern_re());
      break;
    case K_SPLIT: {
      cJSON_AddStringToObject(p, "type", "string");
      cJSON *any = cJSON_AddArrayToObject(p, "anyOf");
      cJSON *named = cJSON_CreateObject(), *piped = cJSON_CreateObject();
      cJSON *e = cJSON_AddArrayToObject(named, "enum");
      cJSON_AddItemToArray(e, cJSON_CreateString("equal"));
      cJSON_AddItemToArray(e, cJSON_CreateString("weighted"));
      cJSON_AddItemToArray(e, cJSON_CreateString("explicit"));
      cJSON *all = cJSON_AddArrayToObject(piped, "allOf");
      cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject();
      cJSON_AddStringToObject(a, "pattern", pattern_re());
      cJSON_AddStringToObject(b, "pattern", "\\|");
      cJSON_AddItemToArray(all, a);
      cJSON_AddItemToArray(all, b);
      cJSON_AddItemToArray(any, named);
      cJSON_AddItemToArray(any, piped);
      break;
    }
  }
  if (def) cJSON_AddItemToObject(p, "default", cJSON_Duplicate(def, 1));
  return p;
}

static const char *section_desc(int s) {
  static const char *const d[N_SECTIONS] = {
      "Model shape (docs/design.md section 2); independent of the parallel layout.",
      "Parallel layout (docs/design.md section 3).",
      "Optimizer, schedule, batch, precision and logging.",
      "Training data.",
      "Checkpointing (docs/design.md section 5).",
  };
  return d[s];
}

char *mc_config_schema_json(void) {
  mc_config def;
  if (mc_config_default(&def)) return NULL;
  cJSON *defs = config_tree(&def);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "$schema", "https://json-schema.org/draft/2020-12/schema");
  cJSON_AddStringToObject(root, "title", "MegaC run configuration");
  cJSON_AddStringToObject(root, "description",
                          "Every key is optional: a file is overlaid on the embedded default (configs/default.json). "
                          "Generated from the key table in core/config.c; tests/core/test_config checks this file "
                          "against it.");
  cJSON_AddStringToObject(root, "type", "object");
  cJSON_AddFalseToObject(root, "additionalProperties");
  cJSON *props = cJSON_AddObjectToObject(root, "properties");
  for (int s = 0; s < N_SECTIONS; s++) {
    cJSON *sec = cJSON_AddObjectToObject(props, k_sections[s]);
    cJSON_AddStringToObject(sec, "description", section_desc(s));
    cJSON_AddStringToObject(sec, "type", "object");
    cJSON_AddFalseToObject(sec, "additionalProperties");
    cJSON *kp = cJSON_AddObjectToObject(sec, "properties");
    const cJSON *dsec = cJSON_GetObjectItemCaseSensitive(defs, k_sections[s]);
    for (int i = 0; i < N_KEYS; i++)
      if (!strcmp(k_keys[i].section, k_sections[s]))
        cJSON_AddItemToObject(kp, k_keys[i].key,
                              key_schema(&k_keys[i], cJSON_GetObjectItemCaseSensitive(dsec, k_keys[i].key)));
  }
  char *out = cJSON_Print(root);
  cJSON_Delete(root);
  cJSON_Delete(defs);
  if (!out) mc_error("out of memory writing the configuration schema");
  return out;
}

/* Appends to a growing buffer; '|' is escaped when `cell` (inside a markdown table cell). */
typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, int cell) {
  for (; *s; s++) {
    if (b->n + 3 >= b->cap) {
      size_t cap = b->cap ? 2 * b->cap : 4096;
      char *q = realloc(b->p, cap);
      if (!q) {
        b->oom = 1;
        return;
      }
      b->p = q, b->cap = cap;
    }
    if (cell && *s == '|') b->p[b->n++] = '\\';
    b->p[b->n++] = *s;
    b->p[b->n] = 0;
  }
}

static void type_and_range(const cfg_key *k, char *type, size_t tcap, char *range, size_t cap) {
  char a[96];
  switch (k->type) {
    case K_INT:
      snprintf(type, tcap, "integer");
      if (k->allowed) list_text(k->allowed, 0, a, sizeof a), snprintf(range, cap, "one of %s", a);
      else range_text(k, range, cap);
      break;
    case K_FLOAT: snprintf(type, tcap, "number"), range_text(k, range, cap); break;
    case K_BOOL: snprintf(type, tcap, "boolean"), snprintf(range, cap, "true, false"); break;
    case K_STRING: snprintf(type, tcap, "string"), snprintf(range, cap, "length %d to %d", (int)k->min, (int)k->max); break;
    case K_ENUM:
      snprintf(type, tcap, "string");
      list_text(k->allowed, 1, a, sizeof a);
      snprintf(range, cap, "one of %s", a);
      break;
    case K_U64:
      snprintf(type, tcap, "uint64");
      snprintf(range, cap, "0 to 2^64-1 (integer up to 2^53, or decimal string)");
      break;
    case K_PATTERN:
      snprintf(type, tcap, "string");
      snprintf(range, cap, "1 to %d letters of A, M, E, R; single '|' between letters", MC_MAX_LAYERS);
      break;
    case K_SPLIT:
      snprintf(type, tcap, "string");
      snprintf(range, cap, "\"equal\", \"weighted\", \"explicit\" or a pattern with '|'");
      break;
  }
}

char *mc_config_reference_markdown(void) {
  mc_config def;
  if (mc_config_default(&def)) return NULL;
  cJSON *defs = config_tree(&def);
  sbuf b = {0};
  for (int s = 0; s < N_SECTIONS; s++) {
    sb_put(&b, s ? "\n### " : "### ", 0);
    sb_put(&b, k_sections[s], 0);
    sb_put(&b, "\n\n| key | type | allowed | default | meaning |\n|---|---|---|---|---|\n", 0);
    const cJSON *dsec = cJSON_GetObjectItemCaseSensitive(defs, k_sections[s]);
    for (int i = 0; i < N_KEYS; i++) {
      const cfg_key *k = &k_keys[i];
      if (strcmp(k->section, k_sections[s])) continue;
      char type[32], range[128];
      type_and_range(k, type, sizeof type, range, sizeof range);
      char *dv = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(dsec, k->key));
      sb_put(&b, "| `", 0);
      sb_put(&b, k->section, 1);
      sb_put(&b, ".", 1);
      sb_put(&b, k->key, 1);
      sb_put(&b, "` | ", 0);
      sb_put(&b, type, 1);
      sb_put(&b, " | ", 0);
      sb_put(&b, range, 1);
      sb_put(&b, " | `", 0);
      sb_put(&b, dv ? dv : "?", 1);
      sb_put(&b, "` | ", 0);
      sb_put(&b, k->desc, 1);
      sb_put(&b, " |\n", 0);
      free(dv);
    }
  }
  cJSON_Delete(defs);
  if (b.oom || !b.p) {
    free(b.p);
    mc_error("out of memory writing the configuration reference");
    return NULL;
  }
  return b.p;
}

/* ------------------------------------------------------------------ pipeline split */

const char *mc_split_name(mc_split_mode s) {
  switch (s) {
    case MC_SPLIT_EQUAL: return "equal";
    case MC_SPLIT_WEIGHTED: return "weighted";
    case MC_SPLIT_EXPLICIT: return "explicit";
  }
  return "?";
}

int mc_layout_parse_split(mc_layout *l, const char *text) {
  if (!strcmp(text, "equal")) { l->split = MC_SPLIT_EQUAL; return 0; }
  if (!strcmp(text, "weighted")) { l->split = MC_SPLIT_WEIGHTED; return 0; }
  if (!strcmp(text, "explicit")) {
    if (!strchr(l->split_pattern, '|'))
      return mc_error("parallel.pp_split: \"explicit\" needs stage boundaries ('|') in model.pattern");
    l->split = MC_SPLIT_EXPLICIT;
    return 0;
  }
  if (!strchr(text, '|'))
    return mc_error("parallel.pp_split: \"%s\" is not equal, weighted, explicit or a pattern with '|' stage boundaries", text);
  if (strlen(text) >= sizeof l->split_pattern)
    return mc_error("parallel.pp_split: pattern \"%.40s...\" is too long", text);
  for (const char *p = text; *p; p++)
    if (*p != '|' && !strchr(mc_block_letters(), *p))
      return mc_error("parallel.pp_split: unknown block letter '%c' in \"%s\"", *p, text);
  l->split = MC_SPLIT_EXPLICIT;
  snprintf(l->split_pattern, sizeof l->split_pattern, "%s", text);
  return 0;
}

/* ------------------------------------------------------------------ recompute policy */

int mc_recompute_parse(const char *name) {
  if (!strcmp(name, "none")) return MC_RECOMPUTE_NONE;
  if (!strcmp(name, "selective")) return MC_RECOMPUTE_SELECTIVE;
  if (!strcmp(name, "full")) return MC_RECOMPUTE_FULL;
  return -1;
}

const char *mc_recompute_name(mc_recompute r) {
  switch (r) {
    case MC_RECOMPUTE_NONE: return "none";
    case MC_RECOMPUTE_SELECTIVE: return "selective";
    case MC_RECOMPUTE_FULL: return "full";
  }
  return "?";
}
