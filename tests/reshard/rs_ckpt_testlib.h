/* Checkpoint helpers of the reshard tests: saving a reference checkpoint with the checkpoint
 * library's own writer, reading a whole run back, scratch directories. */
#ifndef MC_TESTS_RESHARD_RS_CKPT_TESTLIB_H
#define MC_TESTS_RESHARD_RS_CKPT_TESTLIB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "core/dtype.h"
#include "core/optim_groups.h"
#include "rs_testlib.h"

static inline void rs_train_state(int64_t step, mc_train_state *st) {
  memset(st, 0, sizeof *st);
  st->step = step;
  st->tokens_seen = step * 1000 + 7;
  st->schedule_step = step + 1;
  st->lr = 1.25e-3;
  st->adam_step = step + 2;
  st->lr_max = 3e-3;
  st->lr_min = 3e-4;
  st->warmup_steps = 30;
  st->total_steps = 600;
  st->beta1 = 0.9;
  st->beta2 = 0.95;
  st->adam_eps = 1e-8;
  st->weight_decay = 0.1;
  st->grad_clip = 1.0;
  st->seed = 18446744073709551557ull;
  st->rng_counter = 9007199254740993ull;
  st->data_position = step * 16 + 3;
}

/* Saves the content value() (rs_save_reference_groups: the reference, rs_value) of geometry g
 * as step `step` in dir, through mc_ckpt_save (the library's writer): every family's param
 * and the states of its optimizer.
 * `groups` is the optim.groups the families' optimizers were assigned from (recorded in the
 * checkpoint's config, so that readers see the same groups). */
static inline int rs_save_values(const char *dir, const mc_geometry *g, const char *groups, int64_t step,
                                 rs_value_fn value) {
  mc_config cfg;
  if (mc_config_default(&cfg) != 0) return -1;
  cfg.model = g->model;
  cfg.parallel = g->layout;
  snprintf(cfg.train.optim.groups, sizeof cfg.train.optim.groups, "%s", groups);
  int cap = g->fams.n * MC_N_STATES * g->world, n = 0;
  mc_ckpt_item *items = calloc((size_t)cap + 1, sizeof *items);
  float **bufs = calloc((size_t)cap + 1, sizeof *bufs);
  int rc = items && bufs ? 0 : -1;
  for (int r = 0; r < g->world && rc == 0; r++)
    for (int f = 0; f < g->fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        mc_shard sh;
        if (!mc_family_has_state(&g->fams.f[f], (mc_state)s)) continue;
        if (mc_shard_of(g, f, (mc_state)s, r, &sh) != 0 || !sh.primary) continue;
        mc_box sl = {sh.ndim, {0}, {0}};
        for (int d = 0; d < sh.ndim; d++) sl.start[d] = sh.start[d], sl.count[d] = sh.count[d];
        bufs[n] = malloc((size_t)sh.numel * 4 + 4);
        if (mc_opt_state_dtype(g->fams.f[f].opt, (mc_state)s) == MC_ELEM_I64) { /* AdamW's step */
          const int64_t v = rs_i64_value(f);
          memcpy(bufs[n], &v, sizeof v);
        } else {
          rs_pack_values(value, f, s, g->fams.f[f].shape, g->fams.f[f].ndim, &sl, bufs[n]);
        }
        items[n] = (mc_ckpt_item){f, (mc_state)s, r, bufs[n]};
        n++;
      }
  mc_train_state st;
  rs_train_state(step, &st);
  if (rc == 0) rc = mc_ckpt_save(dir, g, &cfg, &st, items, n, NULL);
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(items);
  free(bufs);
  return rc;
}

static inline int rs_save_reference_groups(const char *dir, const mc_geometry *g, const char *groups, int64_t step) {
  return rs_save_values(dir, g, groups, step, rs_value);
}

/* The same for a geometry whose families are all AdamW's (mc_geometry_build's default). */
static inline int rs_save_reference(const char *dir, const mc_geometry *g, int64_t step) {
  return rs_save_reference_groups(dir, g, "adamw:all", step);
}

/* Reads every family and state of a checkpoint through the library (hash-verified) and
 * counts elements that differ from the reference content; the states of a family are param
 * and those of its optimizer under the recorded optim.groups. -1 on a read or open error. */
static inline int64_t rs_check_content(const char *path) {
  mc_ckpt *ck;
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  if (mc_ckpt_open(path, &o, &ck) != 0) return -1;
  mc_config cfg;
  mc_geometry g;
  if (mc_ckpt_config(ck, &cfg) != 0 || mc_geometry_of_config(&cfg, NULL, &g) != 0) {
    mc_ckpt_close(ck);
    return -1;
  }
  int64_t bad = 0, n_kinds = 0;
  for (int f = 0; f < mc_ckpt_n_families(ck) && bad >= 0; f++) {
    const mc_ckpt_family *fam = mc_ckpt_family_at(ck, f);
    const int gf = mc_family_find(&g.fams, fam->name);
    int64_t start[3] = {0, 0, 0};
    mc_box all = {fam->ndim, {0, 0, 0}, {0, 0, 0}};
    for (int d = 0; d < fam->ndim; d++) all.count[d] = fam->shape[d];
    float *got = malloc((size_t)fam->numel * 4 + 4), *want = malloc((size_t)fam->numel * 4 + 4);
    if (gf < 0) bad = -1;
    for (int s = 0; s < MC_N_STATES && bad >= 0; s++) {
      /* (a checkpoint of format < 4 stores no step) */
      if (!mc_family_has_state(&g.fams.f[gf], (mc_state)s) || !mc_ckpt_family_has_state(ck, f, (mc_state)s)) continue;
      n_kinds++;
      if (mc_state_is_scalar((mc_state)s)) { /* AdamW's step: its int64, exactly */
        int64_t v = 0;
        if (mc_ckpt_read_i64(ck, fam->name, (mc_state)s, &v) != 0) bad = -1;
        else bad += v != rs_i64_value(f);
        continue;
      }
      if (mc_ckpt_read(ck, fam->name, (mc_state)s, start, fam->shape, got) != 0) {
        bad = -1;
        break;
      }
      rs_pack(f, s, fam->shape, fam->ndim, &all, want);
      for (int64_t i = 0; i < fam->numel; i++) bad += memcmp(&got[i], &want[i], 4) != 0;
    }
    free(got);
    free(want);
  }
  /* a checkpoint of no family reads as clean otherwise */
  if (n_kinds == 0 && bad == 0) bad = -1;
  mc_geometry_free(&g);
  mc_ckpt_close(ck);
  return bad;
}

static inline int rs_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static inline void rs_rm_rf(const char *path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", path);
}

static inline void rs_scratch(const char *name, char *out, size_t cap) {
  const char *base = getenv("MC_BINARY_DIR");
  snprintf(out, cap, "%s/reshard-scratch/%s.%d", base && *base ? base : "/tmp", name, (int)getpid());
  rs_rm_rf(out);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", out);
  if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", out);
}

#endif
