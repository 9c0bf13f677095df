/* manifest.json (built by the root after every rank file is durable, from the attributes read
 * back from those files) and the `latest` pointer. Keys: docs/checkpoint.md and
 * schemas/manifest.schema.json. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "core/dtype.h"
#include "core/json_num.h"
#include "util/checked.h"
#include "util/error.h"

#define MC_JSON_INT_MAX 9007199254740992.0 /* 2^53: larger integers do not survive JSON numbers */


/* The element dtypes, as errors list them. */
#define DTYPE_LIST "float32, bfloat16, float16, float8_e4m3, float8_e5m2, int64"
#define FLOAT_DTYPE_LIST "float32, bfloat16, float16, float8_e4m3, float8_e5m2"
/* ---------------------------------------------------------------- building */

static cJSON *int_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

static cJSON *int32_array(const int *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

static void add_u64_string(cJSON *o, const char *key, uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  cJSON_AddStringToObject(o, key, buf);
}

/* Parses mc_config_to_json's output; the model and parallel sections come from there so the
 * key names are the config's own. */
static cJSON *config_json(const mc_config *cfg) {
  char *text = mc_config_to_json(cfg);
  if (!text) {
    mc_error("cannot print the run configuration as JSON");
    return NULL;
  }
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) mc_error("the run configuration printed as invalid JSON");
  return j;
}

char *mc_model_section_json(const mc_model *m) {
  mc_config cfg;
  if (mc_config_default(&cfg) != 0) return NULL;
  cfg.model = *m;
  cJSON *j = config_json(&cfg);
  if (!j) return NULL;
  cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
  char *out = model ? mc_json_print_exact(model, 0) : NULL;
  if (!model) mc_error("the run configuration has no model section");
  cJSON_Delete(j);
  return out;
}

static int check_int64(const char *what, int64_t v) {
  if (v < 0 || (double)v >= MC_JSON_INT_MAX) return mc_error("training state %s=%" PRId64 " is out of range [0, 2^53)", what, v);
  return 0;
}

static cJSON *state_json(const mc_train_state *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)s->step);
  cJSON_AddNumberToObject(o, "tokens_seen", (double)s->tokens_seen);
  cJSON_AddNumberToObject(o, "schedule_step", (double)s->schedule_step);
  cJSON_AddNumberToObject(o, "lr", s->lr);
  cJSON_AddNumberToObject(o, "adam_step", (double)s->adam_step);
  cJSON *opt = cJSON_AddObjectToObject(o, "optimizer");
  cJSON_AddNumberToObject(opt, "lr_max", s->lr_max);
  cJSON_AddNumberToObject(opt, "lr_min", s->lr_min);
  cJSON_AddNumberToObject(opt, "warmup_steps", (double)s->warmup_steps);
  cJSON_AddNumberToObject(opt, "total_steps", (double)s->total_steps);
  cJSON_AddNumberToObject(opt, "beta1", s->beta1);
  cJSON_AddNumberToObject(opt, "beta2", s->beta2);
  cJSON_AddNumberToObject(opt, "adam_eps", s->adam_eps);
  cJSON_AddNumberToObject(opt, "weight_decay", s->weight_decay);
  cJSON_AddNumberToObject(opt, "grad_clip", s->grad_clip);
  add_u64_string(o, "seed", s->seed);
  add_u64_string(o, "rng_counter", s->rng_counter);
  cJSON_AddNumberToObject(o, "data_position", (double)s->data_position);
  return o;
}

static int shard_key_cmp(const void *a, const void *b) {
  const mc_shard_attrs *x = a, *y = b;
  int c = strcmp(x->s.family, y->s.family);
  if (c) return c;
  if (x->s.state != y->s.state) return (int)x->s.state - (int)y->s.state;
  return x->s.rank - y->s.rank;
}

int mc_ckpt_item_state_check(const mc_geometry *g, const mc_ckpt_item *it) {
  const mc_family *f = &g->fams.f[it->family];
  if (mc_family_has_state(f, it->state)) return 0;
  return mc_error("checkpoint item %s/%s of rank %d: family %s is trained by %s, which keeps no %s state", f->name,
                  mc_state_name(it->state), it->rank, f->name, mc_opt_name(f->opt), mc_state_name(it->state));
}

int mc_ckpt_check_optimizers(const mc_geometry *g, const mc_config *cfg) {
  /* The manifest records both; a reader refuses a checkpoint where they disagree, so the
   * writer refuses to make one. */
  mc_family_set fs = {g->fams.n, malloc(sizeof(mc_family) * (size_t)(g->fams.n > 0 ? g->fams.n : 1))};
  if (!fs.f) return mc_error("out of memory checking the optimizer groups");
  memcpy(fs.f, g->fams.f, sizeof(mc_family) * (size_t)g->fams.n);
  int rc = mc_optim_groups_assign(cfg->train.optim.groups, &fs);
  if (rc) mc_error_context("the configuration to record");
  for (int f = 0; f < fs.n && rc == 0; f++)
    if (fs.f[f].opt != g->fams.f[f].opt)
      rc = mc_error("family %s: the geometry's optimizer is %s but the configuration's optim.groups '%s' assigns %s",
                    fs.f[f].name, mc_opt_name(g->fams.f[f].opt), cfg->train.optim.groups, mc_opt_name(fs.f[f].opt));
  free(fs.f);
  return rc;
}

/* Every shard must be exactly a primary hyperslab of mc_shard_of of a state kind its family
 * has, labelled with the family's optimizer, and every primary hyperslab of every saved state
 * of every family that has it must be present once. */
static int check_shards(const mc_geometry *g, mc_shard_attrs *sh, int n, int *states_out) {
  const int nf = g->fams.n, W = g->world;
  unsigned char *seen = calloc((size_t)nf * MC_N_STATES * (size_t)W, 1);
  if (!seen) return mc_error("out of memory checking %d shards", n);
  int rc = 0;
  for (int s = 0; s < MC_N_STATES; s++) states_out[s] = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const mc_ckpt_shard *s = &sh[i].s;
    int f = s->family_index >= 0 && s->family_index < nf && !strcmp(g->fams.f[s->family_index].name, s->family)
                ? s->family_index
                : mc_family_find(&g->fams, s->family);
    if (f < 0) {
      rc = mc_error("%s: dataset %s names family '%s', which the model does not have", s->file, s->dataset, s->family);
      break;
    }
    const mc_family *fam = &g->fams.f[f];
    if ((int)s->state < 0 || s->state >= MC_N_STATES || !mc_family_has_state(fam, s->state)) {
      rc = mc_error("%s: dataset %s: family %s is trained by %s, which keeps no %s state", s->file, s->dataset,
                    fam->name, mc_opt_name(fam->opt), mc_state_name(s->state));
      break;
    }
    if (s->opt != fam->opt) {
      rc = mc_error("%s: dataset %s: attribute optimizer is '%s' but family %s is trained by %s", s->file, s->dataset,
                    mc_opt_name(s->opt), fam->name, mc_opt_name(fam->opt));
      break;
    }
    mc_shard want;
    if (s->rank < 0 || s->rank >= W || mc_shard_of(g, f, s->state, s->rank, &want) != 0) {
      rc = mc_error("%s: dataset %s: primary_rank %d is not a rank of the layout (world %d)", s->file, s->dataset, s->rank, W);
      break;
    }
    int64_t shape[MC_CKPT_MAX_DIM];
    int same = want.primary && want.ndim == s->ndim && mc_state_shape(fam->ndim, fam->shape, s->state, shape) == s->ndim &&
               want.stage == s->stage;
    for (int k = 0; same && k < s->ndim; k++)
      same = want.start[k] == s->start[k] && want.count[k] == s->count[k] && sh[i].global_shape[k] == shape[k];
    if (!same) {
      rc = mc_error("%s: dataset %s is not the hyperslab that rank %d is primary for under the layout (mc_shard_of)",
                    s->file, s->dataset, s->rank);
      break;
    }
    /* The replica group: as many ranks as mc_shard_of counts, ascending, each holding this
     * hyperslab (and so naming the same primary). O(replicas), not O(world): a 4096-rank
     * manifest has some 450,000 shards. */
    same = want.n_replicas == s->n_replicas;
    for (int k = 0; same && k < s->n_replicas; k++) {
      mc_shard other;
      const int q = s->replicas[k];
      same = q >= 0 && q < W && (k == 0 || q > s->replicas[k - 1]) && mc_shard_of(g, f, s->state, q, &other) == 0 &&
             other.held && other.primary_rank == s->rank;
      for (int d = 0; same && d < s->ndim; d++) same = other.start[d] == s->start[d] && other.count[d] == s->count[d];
    }
    char rule[MC_CKPT_RULE_MAX] = "replicated"; /* a scalar kind's */
    if (!mc_state_is_scalar(s->state)) mc_placement_rule(g, f, rule, sizeof rule);
    if (!same || strcmp(rule, sh[i].placement_rule) != 0) {
      rc = mc_error("%s: dataset %s: replica group or placement rule differs from the layout's", s->file, s->dataset);
      break;
    }
    unsigned char *mark = &seen[((size_t)f * MC_N_STATES + s->state) * (size_t)W + (size_t)s->rank];
    if (*mark) {
      rc = mc_error("%s: dataset %s is stored twice (rank %d)", s->file, s->dataset, s->rank);
      break;
    }
    *mark = 1;
    states_out[s->state] = 1;
  }
  /* Completeness: for every saved state, each primary hyperslab of each family. */
  for (int st = 0; st < MC_N_STATES && rc == 0; st++) {
    if (!states_out[st]) continue;
    for (int f = 0; f < nf && rc == 0; f++)
      for (int r = 0; r < W && rc == 0 && mc_family_has_state(&g->fams.f[f], (mc_state)st); r++) {
        mc_shard want;
        if (mc_shard_of(g, f, (mc_state)st, r, &want) != 0) {
          rc = mc_error_context("checking ownership of %s/%s", g->fams.f[f].name, mc_state_name((mc_state)st));
          break;
        }
        if (want.primary && !seen[((size_t)f * MC_N_STATES + st) * (size_t)W + (size_t)r])
          rc = mc_error("incomplete checkpoint: no rank file holds %s/%s of primary rank %d", g->fams.f[f].name,
                        mc_state_name((mc_state)st), r);
      }
  }
  free(seen);
  return rc;
}

/* The element dtype of each family's param (fam_dt, g->fams.n entries) and of each declared
 * kind per optimizer (decl_dt), from the shards read back: every shard of one family and
 * kind, and every family of one optimizer for a declared kind, must agree (the manifest
 * declares one dtype for each), else an error naming both datasets. Unsaved: float32. Call
 * after check_shards (the family names resolve). */
static int collect_dtypes(const mc_geometry *g, const mc_shard_attrs *sh, int n, int *fam_dt,
                          int decl_dt[MC_N_OPTS][MC_N_STATES]) {
  const char **fam_by = calloc((size_t)(g->fams.n > 0 ? g->fams.n : 1), sizeof *fam_by);
  const char *decl_by[MC_N_OPTS][MC_N_STATES] = {{0}};
  if (!fam_by) return mc_error("out of memory building the manifest");
  for (int f = 0; f < g->fams.n; f++) fam_dt[f] = MC_ELEM_F32;
  for (int k = 0; k < MC_N_OPTS; k++) /* what the optimizer keeps (int64 counters), else float32 */
    for (int st = 0; st < MC_N_STATES; st++) decl_dt[k][st] = mc_opt_state_dtype(k, (mc_state)st) >= 0 ? mc_opt_state_dtype(k, (mc_state)st) : MC_ELEM_F32;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const mc_ckpt_shard *s = &sh[i].s;
    int f = mc_family_find(&g->fams, s->family);
    if (f < 0) continue;
    int *slot = s->state == MC_STATE_PARAM ? &fam_dt[f] : &decl_dt[g->fams.f[f].opt][s->state];
    const char **by = s->state == MC_STATE_PARAM ? &fam_by[f] : &decl_by[g->fams.f[f].opt][s->state];
    if (*by && *slot != s->dtype)
      rc = mc_error("%s: dataset %s is %s but %s is %s: one %s dtype is declared for %s", s->file, s->dataset,
                    mc_elem_dtype_name(s->dtype), *by, mc_elem_dtype_name(*slot), mc_state_name(s->state),
                    s->state == MC_STATE_PARAM ? "each family's param" : "every family of an optimizer");
    *slot = s->dtype;
    if (!*by) *by = s->dataset;
  }
  free(fam_by);
  return rc;
}

int mc_manifest_build(const mc_geometry *g, const mc_config *cfg_in, const mc_train_state *st,
                      const mc_shard_attrs *shards_in, int n_shards, const mc_file_rec *files, int n_files,
                      char **json_out) {
  *json_out = NULL;
  if (check_int64("step", st->step) || check_int64("tokens_seen", st->tokens_seen) ||
      check_int64("schedule_step", st->schedule_step) || check_int64("adam_step", st->adam_step) ||
      check_int64("data_position", st->data_position) || check_int64("warmup_steps", st->warmup_steps) ||
      check_int64("total_steps", st->total_steps))
    return -1;
  if (mc_ckpt_check_optimizers(g, cfg_in) != 0) return -1;
  mc_shard_attrs *sh = malloc((size_t)(n_shards > 0 ? n_shards : 1) * sizeof *sh);
  if (!sh) return mc_error("out of memory building the manifest");
  memcpy(sh, shards_in, (size_t)n_shards * sizeof *sh);
  qsort(sh, (size_t)n_shards, sizeof *sh, shard_key_cmp);
  int states[MC_N_STATES];
  if (n_shards == 0) {
    free(sh);
    return mc_error("nothing to save: no rank wrote any shard");
  }
  int *fam_dt = malloc((size_t)(g->fams.n > 0 ? g->fams.n : 1) * sizeof *fam_dt);
  int decl_dt[MC_N_OPTS][MC_N_STATES];
  if (!fam_dt || check_shards(g, sh, n_shards, states) != 0 || collect_dtypes(g, sh, n_shards, fam_dt, decl_dt) != 0) {
    if (!fam_dt) mc_error("out of memory building the manifest");
    free(fam_dt);
    free(sh);
    return -1;
  }
  mc_config cfg = *cfg_in;
  cfg.model = g->model;
  cfg.parallel = g->layout;
  cJSON *cj = config_json(&cfg);
  if (!cj) {
    free(fam_dt);
    free(sh);
    return -1;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", "megac-checkpoint");
  cJSON_AddNumberToObject(root, "format_version", MC_CKPT_FORMAT_VERSION);
  cJSON_AddNumberToObject(root, "step", (double)st->step);
  cJSON *model = cJSON_GetObjectItemCaseSensitive(cj, "model");
  cJSON *par = cJSON_GetObjectItemCaseSensitive(cj, "parallel");
  cJSON_AddItemToObject(root, "model", model ? cJSON_Duplicate(model, 1) : cJSON_CreateObject());
  cJSON *lay = par ? cJSON_Duplicate(par, 1) : cJSON_CreateObject();
  cJSON_AddStringToObject(lay, "ownership_rule", mc_own_rule_name(g->layout.own_rule));
  cJSON_AddNumberToObject(lay, "world", g->world);
  cJSON *stages = cJSON_AddArrayToObject(lay, "stages");
  for (int s = 0; s < g->stages.pp; s++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "first_layer", g->stages.first[s]);
    cJSON_AddNumberToObject(o, "n_layers", g->stages.count[s]);
    cJSON_AddItemToArray(stages, o);
  }
  cJSON_AddItemToObject(root, "layout", lay);
  cJSON_AddItemToObject(root, "training_state", state_json(st));
  cJSON_AddItemToObject(root, "config", cj);
  cJSON *sa = cJSON_AddArrayToObject(root, "states");
  for (int s = 0; s < MC_N_STATES; s++)
    if (states[s]) cJSON_AddItemToArray(sa, cJSON_CreateString(mc_state_name((mc_state)s)));
  /* Each optimizer in use with the state kinds it declares, so that a reader knows what every
   * family stores without knowing the optimizer (docs/checkpoint.md, "Optimizer groups and
   * state kinds"). */
  cJSON *ga = cJSON_AddArrayToObject(root, "optimizer_groups");
  for (int k = 0; k < MC_N_OPTS; k++) {
    int used = 0;
    for (int f = 0; f < g->fams.n && !used; f++) used = g->fams.f[f].opt == k;
    if (!used) continue;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", mc_opt_name(k));
    cJSON *ds = cJSON_AddArrayToObject(o, "states");
    int nd;
    const mc_state_decl *d = mc_opt_states(k, &nd);
    for (int i = 0; i < nd; i++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "name", mc_state_name(d[i].state));
      cJSON_AddStringToObject(e, "dtype", mc_elem_dtype_name(decl_dt[k][d[i].state]));
      cJSON_AddStringToObject(e, "shape", d[i].shape);
      cJSON_AddStringToObject(e, "placement", d[i].placement);
      cJSON_AddItemToArray(ds, e);
    }
    cJSON_AddItemToArray(ga, o);
  }
  cJSON *fa = cJSON_AddArrayToObject(root, "families");
  for (int f = 0; f < g->fams.n; f++) {
    const mc_family *fam = &g->fams.f[f];
    cJSON *o = cJSON_CreateObject();
    char rule[MC_CKPT_RULE_MAX];
    mc_placement_rule(g, f, rule, sizeof rule);
    cJSON_AddStringToObject(o, "name", fam->name);
    cJSON_AddItemToObject(o, "shape", int_array(fam->shape, fam->ndim));
    cJSON_AddStringToObject(o, "dtype", mc_elem_dtype_name(fam_dt[f]));
    cJSON_AddStringToObject(o, "placement_rule", rule);
    cJSON_AddStringToObject(o, "place", mc_place_name(fam->place));
    cJSON_AddNumberToObject(o, "split_dim", fam->split_dim);
    cJSON_AddNumberToObject(o, "stage", mc_family_stage(g, f));
    cJSON_AddStringToObject(o, "optimizer_group", fam->decay ? "decay" : "no_decay");
    cJSON_AddStringToObject(o, "optimizer", mc_opt_name(fam->opt));
    cJSON_AddNumberToObject(o, "layer", fam->layer);
    char blk[2] = {fam->block, 0};
    cJSON_AddStringToObject(o, "block", blk);
    cJSON_AddItemToArray(fa, o);
  }
  cJSON *fl = cJSON_AddArrayToObject(root, "files");
  for (int i = 0; i < n_files; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", files[i].name);
    cJSON_AddNumberToObject(o, "rank", files[i].rank);
    cJSON_AddNumberToObject(o, "bytes", (double)files[i].bytes);
    if (files[i].piece_bytes > 0) { /* format 5: the piece digests (none in a metadata-only checkpoint) */
      cJSON_AddNumberToObject(o, "piece_bytes", (double)files[i].piece_bytes);
      cJSON_AddStringToObject(o, "pieces_sha256", files[i].pieces_sha256);
      cJSON *pa = cJSON_AddArrayToObject(o, "pieces");
      for (int64_t k = 0; pa && k < files[i].n_pieces; k++) cJSON_AddItemToArray(pa, cJSON_CreateString(files[i].pieces[k]));
    }
    cJSON_AddItemToArray(fl, o);
  }
  cJSON *sj = cJSON_AddArrayToObject(root, "shards");
  for (int i = 0; i < n_shards; i++) {
    const mc_ckpt_shard *s = &sh[i].s;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "family", s->family);
    cJSON_AddStringToObject(o, "state", mc_state_name(s->state));
    cJSON_AddStringToObject(o, "file", s->file);
    cJSON_AddStringToObject(o, "dataset", s->dataset);
    cJSON_AddNumberToObject(o, "rank", s->rank);
    cJSON_AddNumberToObject(o, "stage", s->stage);
    cJSON_AddItemToObject(o, "start", int_array(s->start, s->ndim));
    cJSON_AddItemToObject(o, "count", int_array(s->count, s->ndim));
    cJSON_AddItemToObject(o, "replica_group", int32_array(s->replicas, s->n_replicas));
    cJSON_AddStringToObject(o, "sha256", s->sha256);
    if (s->offset > 0) cJSON_AddNumberToObject(o, "offset", (double)s->offset);
    cJSON_AddItemToArray(sj, o);
  }
  free(fam_dt);
  free(sh);
  char *text = mc_json_exact_numbers(root) == 0 ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return mc_error("out of memory printing the manifest");
  *json_out = text;
  return 0;
}

/* ---------------------------------------------------------------- parsing and validation */

typedef struct {
  mc_errlist *errs;
  const char *where; /* e.g. "shards[3]" */
} jctx;

static cJSON *req(const cJSON *o, const char *key, const jctx *c) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v) mc_errlist_add(c->errs, "missing key '%s%s%s'", c->where, c->where[0] ? "." : "", key);
  return v;
}

static int get_int(const cJSON *o, const char *key, int64_t lo, int64_t *out, const jctx *c) {
  cJSON *v = req(o, key, c);
  if (!v) return -1;
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || d != floor(d) || d < (double)lo || d >= MC_JSON_INT_MAX) {
    mc_errlist_add(c->errs, "key '%s%s%s' must be an integer >= %" PRId64, c->where, c->where[0] ? "." : "", key, lo);
    return -1;
  }
  *out = (int64_t)d;
  return 0;
}

/* An integer stored in an int (ranks, stages): refused, never truncated, above 2^31-1. */
static int get_int32(const cJSON *o, const char *key, int64_t lo, int *out, const jctx *c) {
  int64_t v;
  if (get_int(o, key, lo, &v, c)) return -1;
  if (v > INT32_MAX) {
    mc_errlist_add(c->errs, "key '%s%s%s' is %" PRId64 ", more than 2^31-1", c->where, c->where[0] ? "." : "", key, v);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int get_num(const cJSON *o, const char *key, double *out, const jctx *c) {
  cJSON *v = req(o, key, c);
  if (!v) return -1;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
    mc_errlist_add(c->errs, "key '%s%s%s' must be a finite number", c->where, c->where[0] ? "." : "", key);
    return -1;
  }
  *out = v->valuedouble;
  return 0;
}

static const char *get_str(const cJSON *o, const char *key, const jctx *c) {
  cJSON *v = req(o, key, c);
  if (!v) return NULL;
  if (!cJSON_IsString(v)) {
    mc_errlist_add(c->errs, "key '%s%s%s' must be a string", c->where, c->where[0] ? "." : "", key);
    return NULL;
  }
  return v->valuestring;
}

static int get_u64str(const cJSON *o, const char *key, uint64_t *out, const jctx *c) {
  const char *s = get_str(o, key, c);
  if (!s) return -1;
  if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 20) {
    mc_errlist_add(c->errs, "key '%s%s%s' must be a decimal string", c->where, c->where[0] ? "." : "", key);
    return -1;
  }
  /* strtoull clamps a value above 2^64-1 to 2^64-1 (ERANGE): refused, not clamped */
  errno = 0;
  unsigned long long u = strtoull(s, NULL, 10);
  if (errno == ERANGE) {
    mc_errlist_add(c->errs, "key '%s%s%s' \"%s\" is above the maximum 18446744073709551615", c->where,
                   c->where[0] ? "." : "", key, s);
    return -1;
  }
  *out = (uint64_t)u;
  return 0;
}

/* An array of 1..3 integers (lo bound lo). */
static int get_dims(const cJSON *o, const char *key, int64_t lo, int64_t *out, int *n, const jctx *c) {
  cJSON *v = req(o, key, c);
  if (!v) return -1;
  int m = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  int ok = m >= 1 && m <= MC_CKPT_MAX_DIM;
  for (int i = 0; ok && i < m; i++) {
    cJSON *e = cJSON_GetArrayItem(v, i);
    ok = cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) && e->valuedouble >= (double)lo &&
         e->valuedouble < MC_JSON_INT_MAX;
    if (ok) out[i] = (int64_t)e->valuedouble;
  }
  if (!ok) {
    mc_errlist_add(c->errs, "key '%s%s%s' must be an array of 1 to 3 integers >= %" PRId64, c->where,
                   c->where[0] ? "." : "", key, lo);
    return -1;
  }
  *n = m;
  return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Every file name once: the names sorted, neighbours compared (n log n; a 4096-rank manifest
 * lists 4096 files). */
static void check_unique_files(const mc_manifest *m, mc_errlist *errs) {
  const char **names = malloc(sizeof *names * (size_t)(m->n_files > 0 ? m->n_files : 1));
  if (!names) {
    mc_errlist_add(errs, "files: out of memory");
    return;
  }
  int n = 0;
  for (int i = 0; i < m->n_files; i++)
    if (m->files[i].name[0]) names[n++] = m->files[i].name;
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[i - 1], names[i]) && (i < 2 || strcmp(names[i - 2], names[i])))
      mc_errlist_add(errs, "files: file '%s' listed twice", names[i]);
  free(names);
}

static int is_hex64(const char *s) { return s && strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64; }

static void parse_state(const cJSON *o, mc_train_state *s, mc_errlist *errs) {
  jctx c = {errs, "training_state"};
  get_int(o, "step", 0, &s->step, &c);
  get_int(o, "tokens_seen", 0, &s->tokens_seen, &c);
  get_int(o, "schedule_step", 0, &s->schedule_step, &c);
  get_num(o, "lr", &s->lr, &c);
  get_int(o, "adam_step", 0, &s->adam_step, &c);
  get_u64str(o, "seed", &s->seed, &c);
  get_u64str(o, "rng_counter", &s->rng_counter, &c);
  get_int(o, "data_position", 0, &s->data_position, &c);
  cJSON *opt = req(o, "optimizer", &c);
  if (!cJSON_IsObject(opt)) {
    if (opt) mc_errlist_add(errs, "key 'training_state.optimizer' must be an object");
    return;
  }
  jctx co = {errs, "training_state.optimizer"};
  get_num(opt, "lr_max", &s->lr_max, &co);
  get_num(opt, "lr_min", &s->lr_min, &co);
  get_int(opt, "warmup_steps", 0, &s->warmup_steps, &co);
  get_int(opt, "total_steps", 0, &s->total_steps, &co);
  get_num(opt, "beta1", &s->beta1, &co);
  get_num(opt, "beta2", &s->beta2, &co);
  get_num(opt, "adam_eps", &s->adam_eps, &co);
  get_num(opt, "weight_decay", &s->weight_decay, &co);
  get_num(opt, "grad_clip", &s->grad_clip, &co);
}

static cJSON *req_type(const cJSON *root, const char *key, int want_array, mc_errlist *errs) {
  jctx c = {errs, ""};
  cJSON *v = req(root, key, &c);
  if (v && (want_array ? !cJSON_IsArray(v) : !cJSON_IsObject(v))) {
    mc_errlist_add(errs, "key '%s' must be an %s", key, want_array ? "array" : "object");
    return NULL;
  }
  return v;
}

static void parse_families(const cJSON *fa, mc_manifest *m, mc_errlist *errs) {
  int n = cJSON_GetArraySize(fa);
  m->fams = calloc((size_t)(n > 0 ? n : 1), sizeof *m->fams);
  if (!m->fams) {
    mc_errlist_add(errs, "out of memory");
    return;
  }
  m->n_fams = n;
  for (int i = 0; i < n; i++) {
    const cJSON *o = cJSON_GetArrayItem(fa, i);
    char where[32];
    snprintf(where, sizeof where, "families[%d]", i);
    jctx c = {errs, where};
    mc_ckpt_family *f = &m->fams[i];
    if (!cJSON_IsObject(o)) {
      mc_errlist_add(errs, "%s must be an object", where);
      continue;
    }
    const char *name = get_str(o, "name", &c);
    if (name && strlen(name) < sizeof f->name) snprintf(f->name, sizeof f->name, "%s", name);
    else if (name) mc_errlist_add(errs, "%s.name is too long", where);
    get_dims(o, "shape", 1, f->shape, &f->ndim, &c);
    f->numel = 1;
    for (int k = 0; k < f->ndim; k++)
      if (mc_mul_i64(f->numel, f->shape[k], &f->numel) || f->numel > INT64_MAX / 8) {
        mc_errlist_add(errs, "%s.shape: %s has more elements than a checkpoint can hold", where, f->name);
        f->numel = 0;
        break;
      }
    /* the element dtype its param is stored in (docs/checkpoint.md, "Element dtypes") */
    const char *dt = get_str(o, "dtype", &c);
    f->dtype = dt ? mc_elem_dtype_parse(dt) : MC_ELEM_F32;
    if (f->dtype < 0 || !mc_elem_is_float(f->dtype))
      mc_errlist_add(errs, "%s.dtype '%s' is not a float element dtype this MegaC implements (%s)", where, dt, FLOAT_DTYPE_LIST);
    if (f->dtype < 0 || !mc_elem_is_float(f->dtype)) f->dtype = MC_ELEM_F32;
    const char *rule = get_str(o, "placement_rule", &c);
    if (rule) snprintf(f->placement_rule, sizeof f->placement_rule, "%s", rule);
    get_int32(o, "stage", 0, &f->stage, &c);
    const char *grp = get_str(o, "optimizer_group", &c);
    if (grp && strcmp(grp, "decay") && strcmp(grp, "no_decay"))
      mc_errlist_add(errs, "%s.optimizer_group '%s' is neither decay nor no_decay", where, grp);
    f->decay = grp && strcmp(grp, "decay") == 0;
    f->opt = MC_OPT_ADAMW; /* format < 3 predates optimizer groups: every family is AdamW's */
    if (m->format_version >= 3) {
      const char *opt = get_str(o, "optimizer", &c);
      int k = opt ? mc_opt_parse(opt) : -1;
      if (opt && k < 0) mc_errlist_add(errs, "%s.optimizer '%s' is not an optimizer (adamw, muon)", where, opt);
      if (k >= 0) f->opt = (mc_opt_kind)k;
    }
    for (int j = 0; j < i; j++)
      if (f->name[0] && strcmp(m->fams[j].name, f->name) == 0) mc_errlist_add(errs, "%s: family '%s' listed twice", where, f->name);
  }
}

/* Index of family `name` (-1 if none). *hint: where the last one was found; consecutive
 * shards mostly name the same family or the next one, so a manifest of n shards parses in
 * O(n), not O(n * families). */
static int find_fam(const mc_manifest *m, const char *name, int *hint) {
  for (int d = 0; d < 2; d++)
    if (*hint + d < m->n_fams && strcmp(m->fams[*hint + d].name, name) == 0) return *hint += d;
  for (int i = 0; i < m->n_fams; i++)
    if (strcmp(m->fams[i].name, name) == 0) return *hint = i;
  return -1;
}

/* The index of `name` in m->files, or -1. by_rank[r] (n_rank entries, may be NULL): the index
 * of the file named rank_<r>.h5, or -1, so that the usual names are found in O(1). */
static int listed_file(const mc_manifest *m, const char *name, const int *by_rank, int n_rank) {
  int r = -1, used = 0;
  if (by_rank && sscanf(name, "rank_%d.h5%n", &r, &used) == 1 && used == (int)strlen(name) && r >= 0 && r < n_rank)
    return by_rank[r];
  for (int k = 0; k < m->n_files; k++)
    if (strcmp(m->files[k].name, name) == 0) return k;
  return -1;
}

/* Format 6: the optional offset of a shard's data (absent for chunked or compressed data), an
 * integer >= 1 whose data range [offset, offset + stored bytes) lies inside its file (fi). */
static void parse_offset(const cJSON *o, const mc_manifest *m, int fi, mc_ckpt_shard *s, const char *where,
                         mc_errlist *errs) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "offset");
  if (!v) return;
  if (m->format_version < 6) {
    mc_errlist_add(errs, "%s.offset is a key of format version 6, not of version %d", where, m->format_version);
    return;
  }
  jctx c = {errs, where};
  int64_t off = 0;
  if (get_int(o, "offset", 1, &off, &c) != 0) return;
  const int64_t bytes = s->numel * (int64_t)mc_elem_dtype_size(s->dtype);
  if (fi >= 0 && (off > m->files[fi].bytes || m->files[fi].bytes - off < bytes))
    mc_errlist_add(errs, "%s.offset %" PRId64 ": its %" PRId64 " bytes of data end past the end of %s (%" PRId64 " bytes)",
                   where, off, bytes, m->files[fi].name, m->files[fi].bytes);
  else s->offset = off;
}

static void parse_shards(const cJSON *sa, mc_manifest *m, mc_errlist *errs) {
  /* arrays are walked through their links: cJSON_GetArrayItem(a, i) walks i links itself */
  int n = cJSON_GetArraySize(sa), fam_hint = 0, n_rank = 0;
  for (int k = 0; k < m->n_files; k++) n_rank = m->files[k].rank >= n_rank ? m->files[k].rank + 1 : n_rank;
  int *by_rank = malloc((size_t)(n_rank > 0 ? n_rank : 1) * sizeof *by_rank);
  for (int r = 0; by_rank && r < n_rank; r++) by_rank[r] = -1;
  for (int k = 0; by_rank && k < m->n_files; k++) {
    char want[40];
    snprintf(want, sizeof want, "rank_%d.h5", m->files[k].rank);
    if (m->files[k].rank >= 0 && !strcmp(want, m->files[k].name)) by_rank[m->files[k].rank] = k;
  }
  size_t total_reps = 0;
  for (const cJSON *o = sa->child; o; o = o->next) {
    cJSON *rg = cJSON_GetObjectItemCaseSensitive(o, "replica_group");
    if (cJSON_IsArray(rg)) total_reps += (size_t)cJSON_GetArraySize(rg);
  }
  m->shards = calloc((size_t)(n > 0 ? n : 1), sizeof *m->shards);
  m->replica_pool = calloc(total_reps + 1, sizeof(int));
  if (!m->shards || !m->replica_pool) {
    mc_errlist_add(errs, "out of memory");
    free(by_rank);
    return;
  }
  m->n_shards = n;
  size_t used = 0;
  const cJSON *o = sa->child;
  for (int i = 0; i < n; i++, o = o->next) {
    char where[32];
    snprintf(where, sizeof where, "shards[%d]", i);
    jctx c = {errs, where};
    mc_ckpt_shard *s = &m->shards[i];
    s->family_index = -1;
    s->opt = -1; /* format < 3: the datasets carry no optimizer attribute */
    if (!cJSON_IsObject(o)) {
      mc_errlist_add(errs, "%s must be an object", where);
      continue;
    }
    const char *fam = get_str(o, "family", &c), *state = get_str(o, "state", &c);
    const char *file = get_str(o, "file", &c), *ds = get_str(o, "dataset", &c), *sha = get_str(o, "sha256", &c);
    get_int32(o, "rank", 0, &s->rank, &c);
    get_int32(o, "stage", 0, &s->stage, &c);
    int nd1 = 0, nd2 = 0;
    int okdims = get_dims(o, "start", 0, s->start, &nd1, &c) == 0;
    okdims &= get_dims(o, "count", 1, s->count, &nd2, &c) == 0;
    if (fam) snprintf(s->family, sizeof s->family, "%s", fam);
    if (file) {
      if (strlen(file) >= sizeof s->file || strchr(file, '/') || strcmp(file, "..") == 0)
        mc_errlist_add(errs, "%s.file '%s' is not a plain file name", where, file);
      else snprintf(s->file, sizeof s->file, "%s", file);
    }
    if (ds) snprintf(s->dataset, sizeof s->dataset, "%s", ds);
    if (sha && !is_hex64(sha)) mc_errlist_add(errs, "%s.sha256 is not 64 lowercase hex digits", where);
    else if (sha) snprintf(s->sha256, sizeof s->sha256, "%s", sha);
    int st = state ? mc_state_parse(state) : -1;
    if (state && st < 0) mc_errlist_add(errs, "%s.state '%s' is not a state kind", where, state);
    if (st >= 0) s->state = (mc_state)st;
    if (st >= 0 && !m->has_state[st]) mc_errlist_add(errs, "%s.state '%s' is not listed in 'states'", where, state);
    if (fam) {
      s->family_index = find_fam(m, fam, &fam_hint);
      if (s->family_index < 0) mc_errlist_add(errs, "%s.family '%s' is not listed in 'families'", where, fam);
    }
    if (s->family_index >= 0) {
      const mc_ckpt_family *f = &m->fams[s->family_index];
      if (m->format_version >= 3) s->opt = f->opt;
      /* the dtype its family declares for this kind: param's own, or its optimizer group's */
      if (st >= 0) s->dtype = st == MC_STATE_PARAM ? f->dtype : m->state_dtype[f->opt][st];
      if (st >= 0 && !mc_opt_has_state(f->opt, (mc_state)st))
        mc_errlist_add(errs, "%s: family %s is trained by %s, which keeps no %s state", where, f->name, mc_opt_name(f->opt),
                       state);
    }
    if (okdims && nd1 != nd2) mc_errlist_add(errs, "%s: start and count differ in length", where);
    if (okdims && nd1 == nd2 && s->family_index >= 0) {
      const mc_ckpt_family *f = &m->fams[s->family_index];
      s->ndim = nd1;
      s->numel = 1;
      /* count <= the family's extent (checked below), whose product is bounded: no overflow
       * once the extents pass; an oversized count is reported below, not multiplied. */
      for (int k = 0; k < nd1; k++)
        if (mc_mul_i64(s->numel, s->count[k], &s->numel) || s->numel > INT64_MAX / 8) {
          mc_errlist_add(errs, "%s.count: more elements than a checkpoint can hold", where);
          s->numel = 0;
          break;
        }
      int64_t shape[MC_CKPT_MAX_DIM]; /* the state's: the family's, or [1] for a scalar kind */
      const int snd = mc_state_shape(f->ndim, f->shape, s->state, shape);
      if (snd != nd1) mc_errlist_add(errs, "%s: %d dimensions, %s/%s has %d", where, nd1, f->name, mc_state_name(s->state), snd);
      else
        for (int k = 0; k < nd1; k++)
          if (s->start[k] + s->count[k] > shape[k])
            mc_errlist_add(errs, "%s: dimension %d [%" PRId64 ", %" PRId64 ") exceeds %s/%s's extent %" PRId64, where, k,
                           s->start[k], s->start[k] + s->count[k], f->name, mc_state_name(s->state), shape[k]);
    }
    if (fam && state && ds) {
      char expect[sizeof s->dataset + 8];
      snprintf(expect, sizeof expect, "/%s/%s", fam, state);
      if (strcmp(expect, ds) != 0) mc_errlist_add(errs, "%s.dataset '%s' should be '%s'", where, ds, expect);
    }
    const int fi = file ? listed_file(m, file, by_rank, n_rank) : -1;
    if (file && fi < 0) mc_errlist_add(errs, "%s.file '%s' is not listed in 'files'", where, file);
    parse_offset(o, m, fi, s, where, errs);
    cJSON *rg = req(o, "replica_group", &c);
    int nr = cJSON_IsArray(rg) ? cJSON_GetArraySize(rg) : -1;
    if (nr < 1) {
      if (rg) mc_errlist_add(errs, "%s.replica_group must be a non-empty array of ranks", where);
    } else {
      s->replicas = m->replica_pool + used;
      s->n_replicas = nr;
      const cJSON *e = rg->child;
      for (int k = 0; k < nr; k++, e = e->next) {
        /* a rank: an integer in [0, 2^31), never a fraction or a large value cut to an int */
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble) || e->valuedouble > INT32_MAX)
          mc_errlist_add(errs, "%s.replica_group[%d] is not a rank (an integer in [0, 2^31))", where, k);
        else m->replica_pool[used + (size_t)k] = (int)e->valuedouble;
      }
      /* format 1 (chunked): the primary is the lowest replica; format 2: one of them */
      int in = 0;
      for (int k = 0; k < nr; k++) in |= m->replica_pool[used + (size_t)k] == s->rank;
      if (m->format_version < 2 && m->replica_pool[used] != s->rank)
        mc_errlist_add(errs, "%s: replica_group does not start with the primary rank", where);
      else if (!in)
        mc_errlist_add(errs, "%s: replica_group does not contain the primary rank", where);
      used += (size_t)nr;
    }
  }
  free(by_rank);
}

/* Per (family, state the family has): stored elements must add up to the state's size (the
 * family's, 1 for a scalar kind).
 * Together with the read-time coverage check this catches missing shards. */
static void check_coverage(mc_manifest *m, mc_errlist *errs) {
  int64_t *sum = calloc((size_t)(m->n_fams > 0 ? m->n_fams : 1) * MC_N_STATES, sizeof(int64_t));
  if (!sum) return;
  for (int i = 0; i < m->n_shards; i++)
    if (m->shards[i].family_index >= 0) sum[m->shards[i].family_index * MC_N_STATES + m->shards[i].state] += m->shards[i].numel;
  for (int f = 0; f < m->n_fams; f++)
    for (int s = 0; s < MC_N_STATES; s++)
      if (m->has_state[s] && mc_opt_has_state(m->fams[f].opt, (mc_state)s) &&
          sum[f * MC_N_STATES + s] != (mc_state_is_scalar((mc_state)s) ? 1 : m->fams[f].numel))
        mc_errlist_add(errs, "family %s state %s: shards hold %" PRId64 " of %" PRId64 " elements", m->fams[f].name,
                       mc_state_name((mc_state)s), sum[f * MC_N_STATES + s],
                       mc_state_is_scalar((mc_state)s) ? (int64_t)1 : m->fams[f].numel);
  free(sum);
}

/* "a, b" for the declared (non-param) kinds of mask. */
static void kind_list(unsigned mask, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int s = 1; s < MC_N_STATES; s++)
    if (mask >> s & 1u) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", mc_state_name((mc_state)s));
  if (!buf[0]) snprintf(buf, cap, "none");
}

/* One declared state of optimizer_groups[gi]: a known kind other than param, an element dtype
 * this MegaC implements (*dtype), and only the shape rule and placement rule it implements.
 * Returns its kind or -1. */
static int parse_decl(const cJSON *e, const char *gwhere, const char *gname, int j, int *dtype, mc_errlist *errs) {
  char where[64];
  snprintf(where, sizeof where, "%s.states[%d]", gwhere, j);
  jctx c = {errs, where};
  if (!cJSON_IsObject(e)) {
    mc_errlist_add(errs, "%s must be an object", where);
    return -1;
  }
  const char *name = get_str(e, "name", &c);
  int st = name ? mc_state_parse(name) : -1;
  if (name && (st < 0 || st == MC_STATE_PARAM))
    mc_errlist_add(errs, "%s (%s): '%s' is not a state kind an optimizer can declare", gwhere, gname, name);
  const char *dt = get_str(e, "dtype", &c);
  *dtype = dt ? mc_elem_dtype_parse(dt) : MC_ELEM_F32;
  if (*dtype < 0)
    mc_errlist_add(errs, "%s (%s): state %s: dtype '%s' is not an element dtype this MegaC implements (%s)", gwhere,
                   gname, name ? name : "?", dt, DTYPE_LIST);
  if (*dtype < 0) *dtype = MC_ELEM_F32;
  /* the kind fixes its rules and whether it is a counter (int64) or a float state */
  const int scalar = st > 0 && mc_state_is_scalar((mc_state)st);
  if (st > 0 && scalar != (*dtype == MC_ELEM_I64))
    mc_errlist_add(errs, "%s (%s): state %s: dtype '%s' is not %s", gwhere, gname, name, dt ? dt : "float32",
                   scalar ? "int64 (a counter is stored as int64)" : "a float format (" FLOAT_DTYPE_LIST ")");
  static const char *const fields[2] = {"shape", "placement"};
  const char *const implemented[2] = {scalar ? "scalar" : "param", scalar ? "replicated" : "param"};
  for (int k = 0; k < 2; k++) {
    const char *v = get_str(e, fields[k], &c);
    if (v && st > 0 && strcmp(v, implemented[k]) != 0)
      mc_errlist_add(errs, "%s (%s): state %s: %s '%s' is not that kind's rule (%s)", gwhere, gname, name ? name : "?",
                     fields[k], v, implemented[k]);
  }
  return st > 0 ? st : -1;
}

/* optimizer_groups (format 3): each optimizer once, known, declaring exactly the state kinds
 * this MegaC's optimizer of that name keeps (core/optim_groups.h). listed[k] = 1 for each. */
static void parse_groups(const cJSON *ga, int *listed, mc_manifest *m, mc_errlist *errs) {
  int i = 0;
  for (const cJSON *o = ga->child; o; o = o->next, i++) {
    char where[32];
    snprintf(where, sizeof where, "optimizer_groups[%d]", i);
    jctx c = {errs, where};
    if (!cJSON_IsObject(o)) {
      mc_errlist_add(errs, "%s must be an object", where);
      continue;
    }
    const char *name = get_str(o, "name", &c);
    int k = name ? mc_opt_parse(name) : -1;
    if (name && k < 0) mc_errlist_add(errs, "%s.name '%s' is not an optimizer this MegaC implements (adamw, muon)", where, name);
    if (k >= 0 && listed[k]) mc_errlist_add(errs, "%s: optimizer %s listed twice", where, name);
    if (k >= 0) listed[k] = 1;
    cJSON *sa = req(o, "states", &c);
    if (sa && !cJSON_IsArray(sa)) mc_errlist_add(errs, "key '%s.states' must be an array", where);
    if (!cJSON_IsArray(sa)) continue;
    unsigned mask = 1u << MC_STATE_PARAM;
    int j = 0;
    for (const cJSON *e = sa->child; e; e = e->next, j++) {
      int dt = MC_ELEM_F32;
      int st = parse_decl(e, where, name ? name : "?", j, &dt, errs);
      if (st > 0 && k >= 0) m->state_dtype[k][st] = dt;
      if (st > 0 && (mask >> st & 1u)) mc_errlist_add(errs, "%s (%s): state %s declared twice", where, name, mc_state_name((mc_state)st));
      if (st > 0) mask |= 1u << st;
    }
    /* format 3 predates AdamW's step (format 4) */
    const unsigned keeps = k < 0 ? 0 : mc_opt_state_mask(k) & (m->format_version < 4 ? ~(1u << MC_STATE_STEP) : ~0u);
    if (k >= 0 && mask != keeps) {
      char got[96], want[96];
      kind_list(mask, got, sizeof got);
      kind_list(keeps, want, sizeof want);
      mc_errlist_add(errs, "%s (%s) declares the states [%s] but %s keeps [%s]", where, name, got, name, want);
    }
  }
}

/* Every family's optimizer listed in optimizer_groups, every listed one used, every stored
 * kind but param kept by some family's optimizer. */
static void check_groups(const mc_manifest *m, const int *listed, mc_errlist *errs) {
  int used[MC_N_OPTS] = {0};
  unsigned kept = 1u << MC_STATE_PARAM;
  for (int f = 0; f < m->n_fams; f++) {
    const mc_ckpt_family *fa = &m->fams[f];
    used[fa->opt] = 1;
    kept |= mc_opt_state_mask(fa->opt);
    if (m->format_version >= 3 && !listed[fa->opt])
      mc_errlist_add(errs, "families[%d] (%s): optimizer %s is not listed in optimizer_groups", f, fa->name, mc_opt_name(fa->opt));
  }
  for (int k = 0; k < MC_N_OPTS && m->format_version >= 3; k++)
    if (listed[k] && !used[k]) mc_errlist_add(errs, "optimizer_groups: %s trains no family", mc_opt_name(k));
  for (int s = 0; s < MC_N_STATES; s++)
    if (m->has_state[s] && !(kept >> s & 1u))
      mc_errlist_add(errs, "states: '%s' is kept by no family's optimizer%s", mc_state_name((mc_state)s),
                     m->format_version < 3 ? " (format version < 3: every family is AdamW's)" : "");
}

/* The recorded families' optimizers against what the recorded config's optim.groups assigns
 * (mc_geometry_of_config, as a reader builds it). A manifest of format < 3 without an optim
 * section is AdamW throughout, as its config's defaults say: nothing to check. */
static void check_config_optimizers(const mc_manifest *m, const cJSON *config, mc_errlist *errs) {
  if (m->format_version < 3 && !cJSON_GetObjectItemCaseSensitive(config, "optim")) return;
  mc_config cfg;
  mc_geometry g;
  if (mc_config_default(&cfg) != 0 || mc_config_apply_json(&cfg, m->config_json, "config") != 0) {
    mc_errlist_add(errs, "the recorded config is invalid: %s", mc_errmsg());
    return;
  }
  cfg.parallel.own_rule = m->own_rule;
  if (mc_geometry_of_config(&cfg, NULL, &g) != 0) {
    mc_errlist_add(errs, "the recorded config gives no model with optimizer groups: %s", mc_errmsg());
    return;
  }
  for (int i = 0; i < m->n_fams; i++) {
    const mc_ckpt_family *f = &m->fams[i];
    int k = i < g.fams.n && !strcmp(g.fams.f[i].name, f->name) ? i : mc_family_find(&g.fams, f->name);
    if (k < 0) continue; /* not the recorded model's: mc_ckpt_check_families says so at load */
    if (g.fams.f[k].opt != (int)f->opt)
      mc_errlist_add(errs, "families[%d] (%s): optimizer %s%s but the recorded config's optim.groups '%s' assigns %s", i,
                     f->name, mc_opt_name(f->opt), m->format_version < 3 ? " (format version < 3)" : "",
                     cfg.train.optim.groups, mc_opt_name(g.fams.f[k].opt));
  }
  mc_geometry_free(&g);
}

/* A file entry's digests, checked before the file is parsed (docs/reliability.md). Format
 * <= 4: the optional whole-file `sha256` (manifests written before it have none and are read
 * with the size check only). Format 5: `piece_bytes`, `pieces` and `pieces_sha256`, all or
 * none (a metadata-only checkpoint has none): a piece size a save may record, exactly
 * ceil(bytes / piece_bytes) digests of 64 lowercase hex digits, and their root. Each
 * problem is named by the entry (`where`) and field. */
static void parse_file_digests(const cJSON *o, int version, const char *where, mc_file_rec *f, mc_errlist *errs) {
  const cJSON *fsha = cJSON_GetObjectItemCaseSensitive(o, "sha256");
  const cJSON *pb = cJSON_GetObjectItemCaseSensitive(o, "piece_bytes");
  const cJSON *pl = cJSON_GetObjectItemCaseSensitive(o, "pieces");
  const cJSON *root = cJSON_GetObjectItemCaseSensitive(o, "pieces_sha256");
  if (version <= 4) {
    if (pb || pl || root)
      mc_errlist_add(errs, "%s.%s is a key of format version 5, not of version %d", where,
                     pb ? "piece_bytes" : pl ? "pieces" : "pieces_sha256", version);
    if (fsha && !(cJSON_IsString(fsha) && is_hex64(fsha->valuestring)))
      mc_errlist_add(errs, "%s.sha256 is not 64 lowercase hex digits", where);
    else if (fsha) snprintf(f->sha256, sizeof f->sha256, "%s", fsha->valuestring);
    return;
  }
  if (fsha) mc_errlist_add(errs, "%s.sha256 is a key of format version 4 and older (version 5 records pieces)", where);
  if (!pb && !pl && !root) return;
  if (!pb || !pl || !root) {
    mc_errlist_add(errs, "%s: piece_bytes, pieces and pieces_sha256 go together, but %s is missing", where,
                   !pb ? "piece_bytes" : !pl ? "pieces" : "pieces_sha256");
    return;
  }
  double v = cJSON_IsNumber(pb) ? pb->valuedouble : -1;
  if (!cJSON_IsNumber(pb) || v != floor(v) || !mc_piece_bytes_check(v >= 0 && v <= (double)MC_PIECE_BYTES_MAX ? (int64_t)v : 0)) {
    mc_errlist_add(errs, "%s.piece_bytes is not a multiple of %" PRId64 " from %" PRId64 " to %" PRId64, where,
                   (int64_t)MC_PIECE_BYTES_MIN, (int64_t)MC_PIECE_BYTES_MIN, (int64_t)MC_PIECE_BYTES_MAX);
    return;
  }
  f->piece_bytes = (int64_t)v;
  if (!cJSON_IsString(root) || !is_hex64(root->valuestring)) {
    mc_errlist_add(errs, "%s.pieces_sha256 is not 64 lowercase hex digits", where);
    return;
  }
  if (!cJSON_IsArray(pl)) {
    mc_errlist_add(errs, "%s.pieces must be an array", where);
    return;
  }
  const int64_t want = mc_piece_count(f->bytes, f->piece_bytes);
  const int n = cJSON_GetArraySize(pl);
  if (n != want) {
    mc_errlist_add(errs, "%s.pieces has %d digests but %" PRId64 " bytes in pieces of %" PRId64 " make %" PRId64, where,
                   n, f->bytes, f->piece_bytes, want);
    return;
  }
  const cJSON *e = pl->child;
  for (int k = 0; k < n; k++, e = e->next) /* every digest first: memory only for a list of them */
    if (!cJSON_IsString(e) || !is_hex64(e->valuestring)) {
      mc_errlist_add(errs, "%s.pieces[%d] is not 64 lowercase hex digits", where, k);
      return;
    }
  if (!(f->pieces = malloc((size_t)(n > 0 ? n : 1) * 65))) {
    mc_errlist_add(errs, "%s.pieces: out of memory", where);
    return;
  }
  e = pl->child;
  for (int k = 0; k < n; k++, e = e->next) memcpy(f->pieces[k], e->valuestring, 65);
  f->n_pieces = n;
  char hex[65];
  mc_pieces_root((const char(*)[65])f->pieces, f->n_pieces, hex);
  if (strcmp(hex, root->valuestring) != 0)
    mc_errlist_add(errs, "%s.pieces_sha256 %s is not the SHA-256 of its pieces (%s)", where, root->valuestring, hex);
  snprintf(f->pieces_sha256, sizeof f->pieces_sha256, "%s", root->valuestring);
}

int mc_manifest_parse(const char *json, const char *origin, mc_manifest *m) {
  memset(m, 0, sizeof *m);
  cJSON *root = cJSON_Parse(json);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return mc_error("%s: manifest invalid: not a JSON object", origin);
  }
  mc_errlist errs;
  mc_errlist_init(&errs);
  jctx c = {&errs, ""};
  /* The version decides how to read the rest, so it is checked first and alone. */
  int64_t ver = 0;
  const char *fmt = get_str(root, "format", &c);
  if (fmt && strcmp(fmt, "megac-checkpoint") != 0) mc_errlist_add(&errs, "format '%s' is not megac-checkpoint", fmt);
  if (get_int(root, "format_version", 1, &ver, &c) == 0 && ver > MC_CKPT_FORMAT_VERSION) {
    cJSON_Delete(root);
    return mc_error("%s: checkpoint format version %" PRId64 " is newer than this MegaC supports (%d)", origin, ver,
                    MC_CKPT_FORMAT_VERSION);
  }
  m->format_version = (int)ver;
  get_int(root, "step", 0, &m->step, &c);
  cJSON *model = req_type(root, "model", 0, &errs);
  cJSON *layout = req_type(root, "layout", 0, &errs);
  cJSON *config = req_type(root, "config", 0, &errs);
  cJSON *ts = req_type(root, "training_state", 0, &errs);
  cJSON *states = req_type(root, "states", 1, &errs);
  cJSON *fams = req_type(root, "families", 1, &errs);
  cJSON *files = req_type(root, "files", 1, &errs);
  cJSON *shards = req_type(root, "shards", 1, &errs);
  if (layout) {
    jctx cl = {&errs, "layout"};
    int64_t v;
    if (get_int(layout, "world", 1, &v, &cl) == 0 && v > (1 << 20))
      mc_errlist_add(&errs, "layout.world %" PRId64 " is more than 1048576 ranks", v);
    req(layout, "stages", &cl);
    /* format 1 predates the key: its checkpoints were written under the chunked rule */
    m->own_rule = MC_OWN_CHUNKED;
    if (m->format_version >= 2) {
      const char *rule = get_str(layout, "ownership_rule", &cl);
      int r = rule ? mc_own_rule_parse(rule) : -1;
      if (rule && r < 0) mc_errlist_add(&errs, "layout.ownership_rule '%s' unknown (balanced-v2, balanced, chunked)", rule);
      if (r >= 0) m->own_rule = r;
    }
  }
  if (config) {
    cJSON *cm = cJSON_GetObjectItemCaseSensitive(config, "model");
    if (!cJSON_IsObject(cm)) mc_errlist_add(&errs, "key 'config.model' must be an object");
    else if (model && !cJSON_Compare(cm, model, 1)) mc_errlist_add(&errs, "'model' differs from 'config.model'");
    m->config_json = mc_json_print_exact(config, 0);
  }
  if (model) m->model_json = mc_json_print_exact(model, 0);
  if (ts) {
    parse_state(ts, &m->state, &errs);
    if (m->state.step != m->step) mc_errlist_add(&errs, "training_state.step differs from step");
  }
  if (states) {
    cJSON *e;
    cJSON_ArrayForEach(e, states) {
      int s = cJSON_IsString(e) ? mc_state_parse(e->valuestring) : -1;
      if (s < 0) mc_errlist_add(&errs, "states: entry is not a state kind");
      else m->has_state[s] = 1;
    }
  }
  if (files) {
    int n = cJSON_GetArraySize(files);
    m->files = calloc((size_t)(n > 0 ? n : 1), sizeof *m->files);
    m->n_files = m->files ? n : 0;
    const cJSON *o = files->child;
    for (int i = 0; i < m->n_files; i++, o = o->next) {
      char where[80];
      snprintf(where, sizeof where, "files[%d]", i);
      jctx cf = {&errs, where};
      const char *name = cJSON_IsObject(o) ? get_str(o, "name", &cf) : NULL;
      int64_t bytes = 0;
      int rank = 0;
      if (!cJSON_IsObject(o)) mc_errlist_add(&errs, "%s must be an object", where);
      else {
        get_int(o, "bytes", 0, &bytes, &cf);
        get_int32(o, "rank", 0, &rank, &cf);
      }
      if (name && (strlen(name) >= sizeof m->files[i].name || strchr(name, '/') || !name[0] || !strcmp(name, ".") ||
                   !strcmp(name, "..")))
        mc_errlist_add(&errs, "%s.name '%s' is not a plain file name", where, name);
      else if (name) snprintf(m->files[i].name, sizeof m->files[i].name, "%s", name);
      if (name) snprintf(where, sizeof where, "files[%d] (%.40s)", i, name);
      if (bytes < 0) mc_errlist_add(&errs, "%s.bytes is negative", where);
      m->files[i].bytes = bytes;
      m->files[i].rank = rank;
      if (cJSON_IsObject(o)) parse_file_digests(o, m->format_version, where, &m->files[i], &errs);
    }
    check_unique_files(m, &errs);
  }
  int listed[MC_N_OPTS] = {0};
  if (m->format_version >= 3) {
    cJSON *groups = req_type(root, "optimizer_groups", 1, &errs);
    if (groups) parse_groups(groups, listed, m, &errs);
  }
  if (fams) parse_families(fams, m, &errs);
  if (fams && errs.n == 0) check_groups(m, listed, &errs);
  if (shards && errs.n == 0) parse_shards(shards, m, &errs);
  if (errs.n == 0) check_coverage(m, &errs);
  if (config && errs.n == 0) check_config_optimizers(m, config, &errs);
  cJSON_Delete(root);
  if (errs.n) {
    char header[MC_PATH_MAX + 32];
    snprintf(header, sizeof header, "%s: manifest invalid", origin);
    mc_errlist_raise(&errs, header);
    mc_manifest_free(m);
    return -1;
  }
  return 0;
}

void mc_manifest_free(mc_manifest *m) {
  for (int i = 0; m->files && i < m->n_files; i++) free(m->files[i].pieces);
  free(m->config_json);
  free(m->model_json);
  free(m->fams);
  free(m->shards);
  free(m->replica_pool);
  free(m->files);
  memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- latest */

char *mc_latest_text(int64_t step, const char *sha) {
  cJSON *o = cJSON_CreateObject();
  char path[48];
  snprintf(path, sizeof path, "step_%" PRId64, step);
  cJSON_AddStringToObject(o, "format", "megac-latest");
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddStringToObject(o, "path", path);
  cJSON_AddStringToObject(o, "manifest_sha256", sha);
  char *t = cJSON_Print(o);
  cJSON_Delete(o);
  return t;
}

int mc_latest_read(const char *dir, int64_t *step, char *path, size_t cap, char sha[65]) {
  char lp[MC_PATH_MAX];
  snprintf(lp, sizeof lp, "%s/latest", dir);
  char *text = NULL;
  if (mc_read_file(lp, &text, NULL) != 0) return mc_error_context("no committed checkpoint (cannot read latest)");
  cJSON *o = cJSON_Parse(text);
  free(text);
  cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
  cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "path");
  cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "manifest_sha256");
  char expect[48];
  int ok = cJSON_IsObject(o) && cJSON_IsNumber(st) && st->valuedouble >= 0 && st->valuedouble == floor(st->valuedouble) &&
           st->valuedouble < MC_JSON_INT_MAX && cJSON_IsString(p) && cJSON_IsString(h) && is_hex64(h->valuestring);
  if (ok) {
    snprintf(expect, sizeof expect, "step_%" PRId64, (int64_t)st->valuedouble);
    ok = strcmp(expect, p->valuestring) == 0 && strlen(p->valuestring) < cap;
  }
  if (!ok) {
    cJSON_Delete(o);
    return mc_error("%s: latest is malformed (expected {\"step\": N, \"path\": \"step_N\", \"manifest_sha256\": hex})", lp);
  }
  *step = (int64_t)st->valuedouble;
  snprintf(path, cap, "%s", p->valuestring);
  snprintf(sha, 65, "%s", h->valuestring);
  cJSON_Delete(o);
  return 0;
}
