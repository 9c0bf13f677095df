/* Shared by the checkpoint tests: a reference global state (every element a function of
 * seed, family, state and global index), the shards each rank of a layout holds of it,
 * and small file-system helpers. */
#ifndef MC_TESTS_CKPT_COMMON_H
#define MC_TESTS_CKPT_COMMON_H

#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/optim_groups.h"
#include "core/ownership.h"
#include "util/error.h"
#include "util/rng.h"

/* snprintf for paths (vsnprintf: truncation is impossible at the sizes the tests use). */
static inline void pathf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

/* The reference value of element `idx` (row-major global index) of (family, state). */
static inline float ref_value(uint64_t seed, int fam, int state, int64_t idx) {
  uint32_t w[4];
  mc_philox(seed, 1000 + (uint64_t)fam * 4 + (uint64_t)state, (uint64_t)idx, w);
  return (float)((double)w[0] / 4294967296.0 - 0.5);
}

/* The reference value of an int64 state (AdamW's step) of family `fam`: all 64 bits random,
 * so values beyond 2^53 (no exact double) and negative ones occur. */
static inline int64_t ref_i64(uint64_t seed, int fam, int state) {
  uint32_t w[4];
  mc_philox(seed, 1000 + (uint64_t)fam * 4 + (uint64_t)state, 0, w);
  return (int64_t)(((uint64_t)w[1] << 32) | w[0]);
}

/* Fills `out` with the box (start, count) of the reference tensor of shape `shape`. */
static inline void ref_box(uint64_t seed, int fam, int state, int ndim, const int64_t *shape, const int64_t *start,
                           const int64_t *count, float *out) {
  int64_t s[3] = {1, 1, 1}, st[3] = {0, 0, 0}, c[3] = {1, 1, 1};
  for (int k = 0; k < ndim; k++) {
    s[3 - ndim + k] = shape[k];
    st[3 - ndim + k] = start[k];
    c[3 - ndim + k] = count[k];
  }
  int64_t o = 0;
  for (int64_t i = 0; i < c[0]; i++)
    for (int64_t j = 0; j < c[1]; j++)
      for (int64_t k = 0; k < c[2]; k++)
        out[o++] = ref_value(seed, fam, state, ((st[0] + i) * s[1] + (st[1] + j)) * s[2] + (st[2] + k));
}

/* The tiny default model under layout (tp,pp,dp,ep,sp,zero); groups: the optim.groups value
 * that assigns the families' optimizers (NULL: the default, adamw:all). */
static inline int tiny_geometry_groups(int tp, int pp, int dp, int ep, int sp, int zero, const char *groups, mc_config *cfg,
                                       mc_geometry *g) {
  if (mc_config_default(cfg) != 0) return -1;
  if (groups) snprintf(cfg->train.optim.groups, sizeof cfg->train.optim.groups, "%s", groups);
  mc_layout l = cfg->parallel;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.ep = ep;
  l.sp = sp;
  l.zero = zero;
  l.split = MC_SPLIT_EQUAL;
  cfg->parallel = l;
  cfg->train.beta2 = 0.3 + 0.6; /* 0.8999999999999999: 15 digits would print 0.9 */
  /* without the training settings, whose batch rules not every test layout meets */
  if (mc_geometry_build(&cfg->model, &l, NULL, -1, g) != 0) return -1;
  if (mc_optim_groups_assign(cfg->train.optim.groups, &g->fams) != 0) {
    mc_geometry_free(g);
    return -1;
  }
  return 0;
}

static inline int tiny_geometry(int tp, int pp, int dp, int ep, int sp, int zero, mc_config *cfg, mc_geometry *g) {
  return tiny_geometry_groups(tp, pp, dp, ep, sp, zero, NULL, cfg, g);
}

/* A layout of the tiny model: tensor, pipeline, data, expert parallel degrees, sequence
 * parallel, ZeRO stage. */
typedef struct {
  int tp, pp, dp, ep, sp, zero;
} lay;

static inline int geom(const lay *l, mc_config *cfg, mc_geometry *g) {
  return tiny_geometry(l->tp, l->pp, l->dp, l->ep, l->sp, l->zero, cfg, g);
}

/* A random valid layout of at most 8 ranks, drawn from random stream `key` at *ctr onwards. */
static inline lay random_layout_of(uint64_t key, uint64_t *ctr) {
  for (;;) {
    static const int tps[] = {1, 2}, pps[] = {1, 2, 4}, dps[] = {1, 2, 3, 4}, eps[] = {1, 2, 4}, zs[] = {0, 1, 3};
    lay l = {tps[mc_rng_below(key, 9, (*ctr)++, 2)], pps[mc_rng_below(key, 9, (*ctr)++, 3)],
             dps[mc_rng_below(key, 9, (*ctr)++, 4)], eps[mc_rng_below(key, 9, (*ctr)++, 3)],
             (int)mc_rng_below(key, 9, (*ctr)++, 2), zs[mc_rng_below(key, 9, (*ctr)++, 3)]};
    if (l.tp * l.pp * l.dp > 8) continue;
    mc_config cfg;
    mc_geometry g;
    if (geom(&l, &cfg, &g) != 0) continue;
    mc_geometry_free(&g);
    return l;
  }
}

/* Every state kind: with make_items, each family's own (param and its optimizer's). */
#define ALL_STATES ((1 << MC_N_STATES) - 1)

/* Every shard held by the ranks in [r0, r1) (primaries and replicas) for the states whose
 * bit is set in state_mask and that the family has (mc_family_has_state), filled from the
 * reference. */
typedef struct {
  int n;
  mc_ckpt_item *items;
  void **bufs;
} item_set;

static inline int make_items(const mc_geometry *g, uint64_t seed, int state_mask, int r0, int r1, item_set *set) {
  int cap = g->fams.n * MC_N_STATES * (r1 - r0);
  set->n = 0;
  set->items = calloc((size_t)cap + 1, sizeof *set->items);
  set->bufs = calloc((size_t)cap + 1, sizeof *set->bufs);
  if (!set->items || !set->bufs) return -1;
  for (int r = r0; r < r1; r++)
    for (int f = 0; f < g->fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        if (!(state_mask & (1 << s)) || !mc_family_has_state(&g->fams.f[f], (mc_state)s)) continue;
        mc_shard sh;
        if (mc_shard_of(g, f, (mc_state)s, r, &sh) != 0) return -1;
        if (!sh.held) continue;
        void *b;
        if (mc_opt_state_dtype(g->fams.f[f].opt, (mc_state)s) == MC_ELEM_I64) { /* a counter: one int64 */
          int64_t v = ref_i64(seed, f, s);
          if (!(b = malloc(sizeof v))) return -1;
          memcpy(b, &v, sizeof v);
        } else {
          if (!(b = malloc((size_t)sh.numel * sizeof(float)))) return -1;
          ref_box(seed, f, s, sh.ndim, g->fams.f[f].shape, sh.start, sh.count, b);
        }
        set->bufs[set->n] = b;
        set->items[set->n] = (mc_ckpt_item){f, (mc_state)s, r, b};
        set->n++;
      }
  return 0;
}

static inline void free_items(item_set *set) {
  for (int i = 0; i < set->n; i++) free(set->bufs[i]);
  free(set->items);
  free(set->bufs);
  memset(set, 0, sizeof *set);
}

static inline void make_state(int64_t step, mc_train_state *st) {
  memset(st, 0, sizeof *st);
  st->step = step;
  st->tokens_seen = step * 16 * 64;
  st->schedule_step = step;
  st->lr = 1e-3 + 1e-6 * (double)step;
  st->adam_step = step;
  st->lr_max = 3e-3;
  st->lr_min = 3e-4;
  st->warmup_steps = 30;
  st->total_steps = 600;
  st->beta1 = 0.9;
  st->beta2 = 0.95;
  st->adam_eps = 1e-8;
  st->weight_decay = 0.1 + 0.2; /* 0.30000000000000004: 15 digits would print 0.3 */
  st->grad_clip = 1.0;
  st->seed = 18446744073709551557ull; /* > 2^53: must survive the manifest exactly */
  st->rng_counter = 9007199254740993ull + (uint64_t)step;
  st->data_position = step * 16;
}

/* The piece size of the rank files' digests that save_reference* records (0: the library's
 * default, MC_CKPT_PIECE_BYTES). */
static int64_t g_ref_piece_bytes;

/* Saves step `step` of the reference state (the states in state_mask that each family has)
 * under layout (tp,pp,dp,ep,sp,zero) with the optimizers of optim.groups `groups` (NULL: the
 * default), pieces of g_ref_piece_bytes. */
static inline int save_reference_groups(const char *dir, int tp, int pp, int dp, int ep, int sp, int zero, int64_t step,
                                        uint64_t seed, int keep, int state_mask, const char *groups) {
  mc_config cfg;
  mc_geometry g;
  if (tiny_geometry_groups(tp, pp, dp, ep, sp, zero, groups, &cfg, &g) != 0) return -1;
  item_set set;
  int rc = make_items(&g, seed, state_mask, 0, g.world, &set);
  mc_train_state st;
  make_state(step, &st);
  mc_ckpt_save_opts o;
  mc_ckpt_save_opts_default(&o);
  o.keep = keep;
  o.piece_bytes = g_ref_piece_bytes;
  if (rc == 0) rc = mc_ckpt_save(dir, &g, &cfg, &st, set.items, set.n, &o);
  free_items(&set);
  mc_geometry_free(&g);
  return rc;
}

static inline int save_reference_states(const char *dir, int tp, int pp, int dp, int ep, int sp, int zero,
                                        int64_t step, uint64_t seed, int keep, int state_mask) {
  return save_reference_groups(dir, tp, pp, dp, ep, sp, zero, step, seed, keep, state_mask, NULL);
}

static inline int save_reference(const char *dir, int tp, int pp, int dp, int ep, int sp, int zero, int64_t step,
                                 uint64_t seed, int keep) {
  return save_reference_states(dir, tp, pp, dp, ep, sp, zero, step, seed, keep, ALL_STATES);
}

/* Compares every hyperslab that every rank of layout g holds of every state the checkpoint
 * stores of the family with the reference. Returns the number of mismatching elements, or -1
 * on a read error. */
static inline int64_t check_against_layout(mc_ckpt *ck, const mc_geometry *g, uint64_t seed) {
  int64_t bad = 0;
  for (int r = 0; r < g->world; r++)
    for (int f = 0; f < g->fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        if (!mc_ckpt_family_has_state(ck, mc_ckpt_find_family(ck, g->fams.f[f].name), (mc_state)s)) continue;
        mc_shard sh;
        if (mc_shard_of(g, f, (mc_state)s, r, &sh) != 0) return -1;
        if (!sh.held) continue;
        if (mc_ckpt_state_dtype(ck, mc_ckpt_find_family(ck, g->fams.f[f].name), (mc_state)s) == MC_ELEM_I64) {
          int64_t v;
          if (mc_ckpt_read_i64(ck, g->fams.f[f].name, (mc_state)s, &v) != 0) return -1;
          bad += v != ref_i64(seed, f, s);
          continue;
        }
        float *got = malloc((size_t)sh.numel * sizeof(float)), *want = malloc((size_t)sh.numel * sizeof(float));
        if (mc_ckpt_read(ck, g->fams.f[f].name, (mc_state)s, sh.start, sh.count, got) != 0) {
          free(got);
          free(want);
          return -1;
        }
        ref_box(seed, f, s, sh.ndim, g->fams.f[f].shape, sh.start, sh.count, want);
        for (int64_t i = 0; i < sh.numel; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        free(got);
        free(want);
      }
  return bad;
}

static inline int rm_rf(const char *path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  return system(cmd);
}

/* A fresh scratch directory under the build tree (or /tmp). */
static inline void scratch_dir(const char *name, char *out, size_t cap) {
  const char *base = getenv("MC_BINARY_DIR");
  snprintf(out, cap, "%s/ckpt-scratch/%s.%d", base && *base ? base : "/tmp", name, (int)getpid());
  rm_rf(out);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", out);
  if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", out);
}

static inline int path_exists(const char *dir, const char *name) {
  char p[4200];
  struct stat st;
  pathf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

/* Checksum of a directory tree's names, sizes, modification times and contents of small
 * files, to show that an operation changed nothing. */
static inline uint64_t tree_fingerprint(const char *dir) {
  uint64_t h = 1469598103934665603ull;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[4200];
    pathf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(p, &st) != 0) continue;
    uint64_t x = mc_rng_stream_of(e->d_name) ^ (uint64_t)st.st_size * 31 ^ (uint64_t)st.st_mtim.tv_sec * 7 ^
                 (uint64_t)st.st_mtim.tv_nsec;
    if (S_ISDIR(st.st_mode)) x ^= tree_fingerprint(p) * 3;
    h += x * 1099511628211ull; /* order independent */
  }
  closedir(d);
  return h;
}

static inline int rehash_manifest(const char *dir, int64_t step);

/* The text of <dir>/step_<step>/manifest.json (up to 4 MiB, NUL-terminated, caller frees) and
 * its path in mp (4200 bytes); NULL if unreadable. */
static inline char *read_manifest_text(const char *dir, int64_t step, char *mp, size_t *n) {
  pathf(mp, 4200, "%s/step_%" PRId64 "/manifest.json", dir, step);
  FILE *f = fopen(mp, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 22);
  *n = buf ? fread(buf, 1, (1 << 22) - 1, f) : 0;
  fclose(f);
  return buf;
}

/* Rewrites <dir>/step_<step>/manifest.json with the first `from` replaced by `to` and records
 * its new hash in manifest.sha256 and latest, so only the manifest's content rules can catch
 * the edit. Returns 0, or -1 when `from` is absent or a file cannot be rewritten. */
static inline int edit_manifest(const char *dir, int64_t step, const char *from, const char *to) {
  char mp[4200];
  size_t n = 0;
  char *buf = read_manifest_text(dir, step, mp, &n);
  FILE *f = NULL;
  char *at = buf ? strstr(buf, from) : NULL, *out = at ? calloc(1, n + strlen(to) + 1) : NULL;
  int rc = out ? 0 : -1;
  if (out) {
    memcpy(out, buf, (size_t)(at - buf));
    strcat(out, to);
    strcat(out, at + strlen(from));
    rc = (f = fopen(mp, "wb")) != NULL && fwrite(out, 1, strlen(out), f) == strlen(out) ? 0 : -1;
    if (f) rc |= fclose(f);
  }
  if (rc == 0) rc = rehash_manifest(dir, step);
  free(buf);
  free(out);
  return rc;
}

/* Records the current hash of <dir>/step_<step>/manifest.json in manifest.sha256 and latest. */
static inline int rehash_manifest(const char *dir, int64_t step) {
  char cmd[9000];
  pathf(cmd, sizeof cmd,
        "cd '%s' && h=$(sha256sum step_%" PRId64 "/manifest.json | cut -c1-64) && "
        "printf '%%s  manifest.json\\n' $h > step_%" PRId64 "/manifest.sha256 && "
        "printf '{\"step\": %" PRId64 ", \"path\": \"step_%" PRId64 "\", \"manifest_sha256\": \"%%s\"}' $h > latest",
        dir, step, step, step, step);
  return system(cmd) == 0 ? 0 : -1;
}

/* Makes <dir>/step_<step> look like a checkpoint written before whole-file hashes: drops
 * each files[] entry's digests (sha256 of format <= 4; piece_bytes, pieces_sha256 and pieces
 * of format 5: the last keys of the entry) from the manifest (rehashed), so the rank files
 * are parsed with their size checked only and the attribute and storage checks behind it can
 * be reached. */
static inline int strip_file_hashes(const char *dir, int64_t step) {
  char mp[4200];
  size_t n = 0;
  char *buf = read_manifest_text(dir, step, mp, &n);
  FILE *f = NULL;
  if (!buf) return -1;
  int removed = 0;
  char *p = buf;
  while ((p = strstr(p, "\"bytes\":")) != NULL) {
    char *q = p + 8;
    while (*q == ' ' || *q == '\t') q++;
    while (*q >= '0' && *q <= '9') q++;
    char *cut = q;
    if (*q == ',') {
      q++;
      while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
      char *end = strchr(q, '}'); /* the entry's end: no digest holds a brace */
      if (end && (strncmp(q, "\"sha256\":", 9) == 0 || strncmp(q, "\"piece_bytes\":", 14) == 0)) {
        while (end > q && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) end--;
        memmove(cut, end, strlen(end) + 1);
        removed++;
      }
    }
    p = cut;
  }
  (void)n;
  int rc = removed > 0 && (f = fopen(mp, "wb")) != NULL && fwrite(buf, 1, strlen(buf), f) == strlen(buf) ? 0 : -1;
  if (f) rc |= fclose(f);
  free(buf);
  return rc == 0 ? rehash_manifest(dir, step) : -1;
}

#endif
