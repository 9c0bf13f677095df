#define _POSIX_C_SOURCE 200809L
#include "reshard/export.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard/execute.h"
#include "reshard/safetensors.h"

/* ---------------------------------------------------------------- export */

typedef struct {
  mc_st_file f;
  char (*hex)[65]; /* per target */
} st_sink;

static int st_write(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const float *buf) {
  st_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  (void)p;
  return mc_st_pwrite(&s->f, t, off * 4, buf, n * 4);
}

static int st_done(void *ctx, const mc_rs_plan *p, int t, const unsigned char sha[32]) {
  st_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  (void)p;
  mc_rs_hex(sha, s->hex[t]);
  return 0;
}

static int consolidated_geometry(const mc_model *m, mc_geometry *g) {
  mc_layout l;
  mc_rs_consolidated_layout(&l);
  if (mc_geometry_build(m, &l, NULL, -1, g) != 0) return mc_error_context("the world-size-1 layout");
  return 0;
}

int mc_rs_export_safetensors(mc_rs_source *src, const char *path, const mc_rs_opts *o, mc_rs_summary *sum) {
  const mc_geometry *sg = mc_rs_source_geometry(src);
  mc_ckpt *ck = mc_rs_source_ckpt(src);
  if (!mc_ckpt_has_state(ck, MC_STATE_PARAM)) return mc_error("%s: the checkpoint stores no param state", mc_ckpt_step_dir(ck));
  mc_geometry cg;
  if (consolidated_geometry(&sg->model, &cg) != 0) return -1;
  mc_rs_plan plan;
  if (mc_rs_plan_build(sg, &cg, 1u << MC_STATE_PARAM, &plan) != 0) {
    mc_geometry_free(&cg);
    return -1;
  }
  int rc = mc_rs_source_bind(src, &plan);
  st_sink sink;
  memset(&sink, 0, sizeof sink);
  mc_st_tensor *ts = calloc((size_t)plan.n_targets + 1, sizeof *ts);
  sink.hex = calloc((size_t)plan.n_targets + 1, sizeof *sink.hex);
  mc_st_meta meta = {0};
  if (!ts || !sink.hex) rc = mc_error("out of memory");
  char step[32];
  snprintf(step, sizeof step, "%" PRId64, mc_ckpt_step(ck));
  if (rc == 0)
    rc = (mc_st_meta_add(&meta, "format", "megac-weights") || mc_st_meta_add(&meta, "config", mc_ckpt_config_json(ck)) ||
          mc_st_meta_add(&meta, "step", step) || mc_st_meta_add(&meta, "source_root_sha256", mc_ckpt_root_hash(ck)))
             ? -1
             : 0;
  for (int t = 0; t < plan.n_targets && rc == 0; t++) {
    const mc_family *f = &cg.fams.f[plan.tensors[plan.targets[t].tensor].fam];
    snprintf(ts[t].name, sizeof ts[t].name, "%s", f->name);
    ts[t].ndim = f->ndim;
    for (int d = 0; d < f->ndim; d++) ts[t].shape[d] = f->shape[d];
    char key[MC_ST_NAME_MAX];
    snprintf(key, sizeof key, "sha256.%s", f->name);
    /* A placeholder of the final length: the header is rewritten in place once hashed. */
    rc = mc_st_meta_add(&meta, key, "0000000000000000000000000000000000000000000000000000000000000000");
  }
  int created = rc == 0 && mc_st_create(&sink.f, path, ts, plan.n_targets, &meta) == 0;
  if (rc == 0 && !created) rc = -1;
  if (rc == 0) {
    mc_rs_io_ctx ctx = {src, &sink};
    mc_rs_io io = {&ctx, mc_rs_source_read, st_write, mc_rs_source_done, st_done};
    mc_rs_exec_opts eo = {o ? o->chunk_bytes : 0, o ? o->threads : 0, o ? o->progress : 0, "export"};
    mc_rs_exec_stats es;
    rc = mc_rs_execute(&plan, &cg, &io, &eo, &es);
    for (int t = 0; t < plan.n_targets && rc == 0; t++) {
      char key[MC_ST_NAME_MAX];
      snprintf(key, sizeof key, "sha256.%s", ts[t].name);
      for (int k = 0; k < meta.n_meta; k++)
        if (strcmp(meta.meta_key[k], key) == 0) memcpy(meta.meta_val[k], sink.hex[t], 65);
    }
    if (rc == 0) rc = mc_st_update_meta(&sink.f, &meta);
    if (rc == 0) rc = mc_st_commit(&sink.f);
    if (rc == 0 && sum) {
      memset(sum, 0, sizeof *sum);
      sum->bytes_read = es.bytes_read;
      sum->bytes_written = es.bytes_written;
      sum->seconds = sum->copy_seconds = es.seconds;
      sum->peak_rss_kb = mc_rs_peak_rss_kb();
      sum->n_src_shards = plan.n_src;
      sum->n_dst_shards = plan.n_targets;
      sum->n_dst_files = 1;
    }
  }
  if (rc != 0 && created) {
    char keep[MC_ERRMSG_MAX];
    snprintf(keep, sizeof keep, "%s", mc_errmsg());
    mc_st_abort(&sink.f);
    mc_error("export to %s failed, nothing written: %s", path, keep);
  }
  mc_st_meta_free(&meta);
  free(ts);
  free(sink.hex);
  mc_rs_plan_free(&plan);
  mc_geometry_free(&cg);
  return rc;
}

/* ---------------------------------------------------------------- import */

typedef struct {
  mc_st_file f;
  int *tensor_of_src; /* plan.src index -> file tensor, -1: a moment (zeros) */
  char (*want)[65];   /* recorded hash per plan.src ("" if none) */
} st_source;

static int st_read(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf) {
  st_source *src = ((mc_rs_io_ctx *)ctx)->src;
  (void)p;
  int t = src->tensor_of_src[s];
  if (t < 0) {
    memset(buf, 0, (size_t)n * 4);
    return 0;
  }
  return mc_st_pread(&src->f, t, off * 4, buf, n * 4);
}

static int st_src_done(void *ctx, const mc_rs_plan *p, int s, const unsigned char sha[32]) {
  st_source *src = ((mc_rs_io_ctx *)ctx)->src;
  (void)p;
  if (!src->want[s][0]) return 0;
  char hex[65];
  mc_rs_hex(sha, hex);
  if (strcmp(hex, src->want[s]) != 0)
    return mc_error("%s: tensor %s fails its SHA-256 check (metadata %.16s..., data %.16s...)", src->f.path,
                    src->f.t[src->tensor_of_src[s]].name, src->want[s], hex);
  return 0;
}

int mc_rs_safetensors_config(const char *path, mc_config *cfg) {
  mc_st_file f;
  if (mc_st_open(&f, path) != 0) return -1;
  const char *c = mc_st_meta_get(&f.meta, "config");
  int rc = 0;
  if (!c) rc = mc_error("%s: no __metadata__.config (not exported by mcreshard; the model is unknown)", path);
  else if (mc_config_default(cfg) != 0 || mc_config_apply_json(cfg, c, path) != 0) rc = -1;
  mc_st_close(&f);
  return rc;
}

int mc_rs_import_safetensors(const char *path, const mc_layout *target, const char *dst, const mc_rs_opts *o,
                             mc_rs_summary *sum) {
  if (mc_rs_check_destination(dst, o && o->force) != 0) return -1;
  mc_config cfg;
  if (mc_rs_safetensors_config(path, &cfg) != 0) return -1;
  if (target) cfg.parallel = *target;
  mc_geometry cg, dg;
  if (consolidated_geometry(&cfg.model, &cg) != 0) return -1;
  if (mc_geometry_build(&cfg.model, &cfg.parallel, NULL, -1, &dg) != 0) {
    mc_geometry_free(&cg);
    return mc_error_context("target layout refused");
  }
  mc_rs_plan plan;
  if (mc_rs_plan_build(&cg, &dg, MC_RS_ALL_STATES, &plan) != 0) {
    mc_geometry_free(&cg);
    mc_geometry_free(&dg);
    return -1;
  }
  st_source src;
  memset(&src, 0, sizeof src);
  int rc = mc_st_open(&src.f, path);
  int opened = rc == 0;
  src.tensor_of_src = calloc((size_t)plan.n_src + 1, sizeof *src.tensor_of_src);
  src.want = calloc((size_t)plan.n_src + 1, sizeof *src.want);
  if (rc == 0 && (!src.tensor_of_src || !src.want)) rc = mc_error("out of memory");
  int n_params = 0;
  for (int i = 0; i < plan.n_tensors && rc == 0; i++) {
    const mc_rs_tensor *tn = &plan.tensors[i];
    const mc_family *f = &cg.fams.f[tn->fam];
    int s = tn->first_src; /* world 1: one source shard per tensor, the whole family */
    src.tensor_of_src[s] = -1;
    if (tn->state != MC_STATE_PARAM) continue;
    int t = mc_st_find(&src.f, f->name);
    if (t < 0) {
      rc = mc_error("%s: no tensor %s, which the model has", path, f->name);
      break;
    }
    int same = src.f.t[t].ndim == f->ndim;
    for (int d = 0; same && d < f->ndim; d++) same = src.f.t[t].shape[d] == f->shape[d];
    if (!same) {
      rc = mc_error("%s: tensor %s does not have the family's global shape", path, f->name);
      break;
    }
    src.tensor_of_src[s] = t;
    n_params++;
    char key[MC_ST_NAME_MAX];
    snprintf(key, sizeof key, "sha256.%s", f->name);
    const char *h = mc_st_meta_get(&src.f.meta, key);
    if (h && strlen(h) == 64) memcpy(src.want[s], h, 65);
  }
  if (rc == 0 && n_params != src.f.n)
    rc = mc_error("%s: holds %d tensors but the model has %d families; refusing extra tensors", path, src.f.n, n_params);
  if (rc == 0) {
    mc_train_state st;
    memset(&st, 0, sizeof st);
    /* A fresh start from the weights: step 0, the run's hyperparameters, zero moments. */
    st.lr_max = cfg.train.lr;
    st.lr_min = cfg.train.min_lr;
    st.warmup_steps = cfg.train.warmup_steps;
    st.total_steps = cfg.train.steps;
    st.beta1 = cfg.train.beta1;
    st.beta2 = cfg.train.beta2;
    st.adam_eps = cfg.train.adam_eps;
    st.weight_decay = cfg.train.weight_decay;
    st.grad_clip = cfg.train.grad_clip;
    st.seed = cfg.train.seed;
    rc = mc_rs_write_from(st_read, st_src_done, &src, &cfg, &st, &dg, &plan, dst, o, sum);
  }
  if (opened) mc_st_close(&src.f);
  free(src.tensor_of_src);
  free(src.want);
  mc_rs_plan_free(&plan);
  mc_geometry_free(&cg);
  mc_geometry_free(&dg);
  return rc;
}
