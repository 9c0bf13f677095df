/* Optimizer groups in checkpoints (format version 3): a run whose 2-D matrices Muon trains
 * (optim.groups = muon:matrices,adamw:all) saves param of every family, exp_avg and
 * exp_avg_sq of the AdamW families and momentum of the Muon ones; it reopens with each
 * family's optimizer and states, reads back equal, and reads as another layout. A save with
 * a state the family's optimizer does not keep, or whose config disagrees with its geometry,
 * is refused; manifests whose optimizers or declarations were edited are refused naming what
 * differs. With "--write-adamw DIR" it writes an AdamW-only sample, with "--check-v2 DIR" it
 * loads one rewritten to format version 2 and with "--read DIR" it reads every shard of a
 * checkpoint (tests/ckpt/test_ckpt_v2.py). */
#include "tests/ckpt/test_ckpt_common.h"

#include "tests/check.h"

#define GROUPS "muon:matrices,adamw:all"

/* Every shard of the checkpoint read whole and compared with the reference. */
static int64_t check_every_shard(mc_ckpt *ck, const mc_geometry *g, uint64_t seed) {
  int64_t bad = 0;
  for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    int f = mc_family_find(&g->fams, s->family);
    if (f < 0) return -1;
    if (s->dtype == MC_ELEM_I64) { /* AdamW's step */
      int64_t v = 0;
      bad += mc_ckpt_read_i64(ck, s->family, s->state, &v) != 0 || v != ref_i64(seed, f, s->state);
      continue;
    }
    float *got = malloc((size_t)s->numel * sizeof(float)), *want = malloc((size_t)s->numel * sizeof(float));
    int rc = mc_ckpt_read(ck, s->family, s->state, s->start, s->count, got);
    ref_box(seed, f, s->state, s->ndim, g->fams.f[f].shape, s->start, s->count, want);
    bad += rc != 0 ? 1 : memcmp(got, want, (size_t)s->numel * sizeof(float)) != 0;
    free(got);
    free(want);
  }
  return bad;
}

static void test_muon_roundtrip(const char *root) {
  static const int lays[][6] = {{1, 1, 1, 1, 0, 0}, {2, 1, 2, 1, 0, 1}, {2, 2, 2, 2, 1, 1}, {2, 1, 2, 2, 1, 3}};
  for (int li = 0; li < (int)(sizeof lays / sizeof lays[0]); li++) {
    const int *l = lays[li];
    char dir[2048];
    pathf(dir, sizeof dir, "%s/muon%d", root, li);
    uint64_t seed = 300 + (uint64_t)li;
    CHECK_OK(save_reference_groups(dir, l[0], l[1], l[2], l[3], l[4], l[5], 4, seed, 0, ALL_STATES, GROUPS));
    mc_config cfg;
    mc_geometry g;
    if (tiny_geometry_groups(l[0], l[1], l[2], l[3], l[4], l[5], GROUPS, &cfg, &g) != 0) {
      CHECK(0, "layout %d: %s", li, mc_errmsg());
      continue;
    }
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (!ck) {
      mc_geometry_free(&g);
      continue;
    }
    CHECK(mc_ckpt_format_version(ck) == MC_CKPT_FORMAT_VERSION && MC_CKPT_FORMAT_VERSION == 6, "format version %d",
          mc_ckpt_format_version(ck));
    for (int s = 0; s < MC_N_STATES; s++) CHECK(mc_ckpt_has_state(ck, (mc_state)s), "state %s not stored", mc_state_name((mc_state)s));
    int n_opt[MC_N_OPTS] = {0};
    int64_t want_numel = 0, stored = 0;
    for (int f = 0; f < g.fams.n; f++) {
      const mc_family *fam = &g.fams.f[f];
      int k = mc_ckpt_find_family(ck, fam->name);
      const mc_ckpt_family *cf = mc_ckpt_family_at(ck, k);
      CHECK(cf && (int)cf->opt == fam->opt, "%s: recorded optimizer %s, geometry %s", fam->name, cf ? mc_opt_name(cf->opt) : "?",
            mc_opt_name(fam->opt));
      n_opt[fam->opt]++;
      for (int s = 0; s < MC_N_STATES; s++) {
        CHECK(mc_ckpt_family_has_state(ck, k, (mc_state)s) == mc_family_has_state(fam, (mc_state)s), "%s/%s: has_state %d",
              fam->name, mc_state_name((mc_state)s), mc_ckpt_family_has_state(ck, k, (mc_state)s));
        want_numel += !mc_family_has_state(fam, (mc_state)s) ? 0 : mc_state_is_scalar((mc_state)s) ? 1 : fam->numel;
      }
    }
    CHECK(n_opt[MC_OPT_ADAMW] > 0 && n_opt[MC_OPT_MUON] > 0, "layout %d: %d AdamW and %d Muon families", li, n_opt[0], n_opt[1]);
    CHECK(!mc_ckpt_family_has_state(ck, -1, MC_STATE_PARAM) && !mc_ckpt_family_has_state(ck, 0, MC_N_STATES),
          "out-of-range family or state reported as stored");
    for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
      const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
      stored += s->numel;
      CHECK(s->opt == (int)mc_ckpt_family_at(ck, s->family_index)->opt, "%s: shard optimizer %d", s->dataset, s->opt);
    }
    CHECK(stored == want_numel, "layout %d: shards hold %" PRId64 " of %" PRId64 " elements", li, stored, want_numel);
    CHECK_OK(mc_ckpt_verify_all(ck));
    CHECK(check_every_shard(ck, &g, seed) == 0, "layout %d: shards read back differ", li);
    CHECK(check_against_layout(ck, &g, seed) == 0, "layout %d read as itself", li);
    /* the reader's geometry: the recorded config's optimizers under another layout */
    mc_config rec;
    CHECK_OK(mc_ckpt_config(ck, &rec));
    CHECK(strcmp(rec.train.optim.groups, GROUPS) == 0, "recorded optim.groups '%s'", rec.train.optim.groups);
    mc_layout other = rec.parallel;
    other.tp = 1, other.pp = 1, other.dp = 2, other.ep = 1, other.sp = 0, other.zero = 1;
    mc_geometry go;
    CHECK_OK(mc_geometry_of_config(&rec, &other, &go));
    CHECK(check_against_layout(ck, &go, seed) == 0, "layout %d read as tp1 pp1 dp2 zero1", li);
    mc_geometry_free(&go);
    /* the states a family's optimizer does not keep are not there to read */
    for (int f = 0; f < g.fams.n; f++) {
      const mc_family *fam = &g.fams.f[f];
      mc_state missing = fam->opt == MC_OPT_MUON ? MC_STATE_EXP_AVG : MC_STATE_MOMENTUM;
      int64_t st[3] = {0, 0, 0}, cn[3] = {1, 1, 1};
      float x;
      CHECK(mc_ckpt_read(ck, fam->name, missing, st, cn, &x) != 0 && strstr(mc_errmsg(), fam->name) &&
                strstr(mc_errmsg(), mc_state_name(missing)) && strstr(mc_errmsg(), mc_opt_name(fam->opt)),
            "reading %s/%s: %s", fam->name, mc_state_name(missing), mc_errmsg());
    }
    mc_ckpt_close(ck);
    mc_geometry_free(&g);
  }
}

/* An item of a state the family's optimizer does not keep is refused, synchronously and
 * asynchronously, before anything is written. */
static void test_refused_items(const char *root) {
  mc_config cfg;
  mc_geometry g;
  CHECK_OK(tiny_geometry_groups(2, 1, 2, 1, 0, 1, GROUPS, &cfg, &g));
  int adamw = -1, muon = -1;
  for (int f = 0; f < g.fams.n; f++) {
    if (g.fams.f[f].opt == MC_OPT_ADAMW && adamw < 0) adamw = f;
    if (g.fams.f[f].opt == MC_OPT_MUON && muon < 0) muon = f;
  }
  CHECK(adamw >= 0 && muon >= 0, "no AdamW or no Muon family");
  if (adamw < 0 || muon < 0) {
    mc_geometry_free(&g);
    return;
  }
  struct {
    int fam;
    mc_state st;
    const char *opt;
  } bad[] = {{adamw, MC_STATE_MOMENTUM, "adamw"}, {muon, MC_STATE_EXP_AVG, "muon"}, {muon, MC_STATE_EXP_AVG_SQ, "muon"}};
  for (int i = 0; i < 3; i++) {
    char dir[2048];
    pathf(dir, sizeof dir, "%s/refused%d", root, i);
    item_set set;
    CHECK_OK(make_items(&g, 5, ALL_STATES, 0, g.world, &set));
    mc_shard sh;
    mc_shard_of(&g, bad[i].fam, MC_STATE_PARAM, 0, &sh);
    float *extra = calloc((size_t)(sh.numel > 0 ? sh.numel : 1), sizeof(float));
    set.items = realloc(set.items, (size_t)(set.n + 1) * sizeof *set.items);
    set.items[set.n] = (mc_ckpt_item){bad[i].fam, bad[i].st, 0, extra};
    mc_train_state st;
    make_state(1, &st);
    const char *name = g.fams.f[bad[i].fam].name, *state = mc_state_name(bad[i].st);
    int rc = mc_ckpt_save(dir, &g, &cfg, &st, set.items, set.n + 1, NULL);
    CHECK(rc != 0 && strstr(mc_errmsg(), name) && strstr(mc_errmsg(), state) && strstr(mc_errmsg(), bad[i].opt),
          "save with %s/%s: %s", name, state, rc ? mc_errmsg() : "accepted");
    CHECK(!path_exists(dir, "latest") && !path_exists(dir, "step_1"), "a refused save left a checkpoint");
    mc_ckpt_saver *sv = NULL;
    CHECK_OK(mc_ckpt_saver_create(dir, NULL, &sv));
    rc = sv ? mc_ckpt_saver_save(sv, &g, &cfg, &st, set.items, set.n + 1) : -1;
    CHECK(rc != 0 && strstr(mc_errmsg(), name) && strstr(mc_errmsg(), state) && strstr(mc_errmsg(), bad[i].opt),
          "async save with %s/%s: %s", name, state, rc ? mc_errmsg() : "accepted");
    if (sv) mc_ckpt_saver_close(sv);
    CHECK(!path_exists(dir, "latest"), "a refused async save left a checkpoint");
    free(extra);
    free_items(&set);
  }
  /* a config whose optim.groups disagrees with the geometry's optimizers: refused, since a
   * reader would refuse the checkpoint */
  char dir[2048];
  pathf(dir, sizeof dir, "%s/refused_cfg", root);
  mc_config plain;
  mc_geometry ga;
  CHECK_OK(tiny_geometry(2, 1, 2, 1, 0, 1, &plain, &ga));
  item_set set;
  CHECK_OK(make_items(&ga, 5, ALL_STATES, 0, ga.world, &set));
  mc_train_state st;
  make_state(1, &st);
  int rc = mc_ckpt_save(dir, &ga, &cfg, &st, set.items, set.n, NULL);
  CHECK(rc != 0 && strstr(mc_errmsg(), "optim.groups") && strstr(mc_errmsg(), g.fams.f[muon].name),
        "save of an AdamW geometry under " GROUPS ": %s", rc ? mc_errmsg() : "accepted");
  CHECK(!path_exists(dir, "latest"), "the refused save left a checkpoint");
  free_items(&set);
  mc_geometry_free(&ga);
  mc_geometry_free(&g);
}

/* One edit of a fresh Muon checkpoint's manifest (the first `from` becomes `to`, rehashed)
 * and what the refusal must say. */
typedef struct {
  const char *what;
  int state_mask;
  const char *from, *to;
  const char *n1, *n2; /* n2 may be NULL */
} manifest_edit;

static const manifest_edit edits[] = {
    /* Params only: a family's optimizer can change without its states disagreeing, so the
     * recorded config is what refuses it. The first Muon family is the first recorded so. */
    {"family optimizer edited", 1 << MC_STATE_PARAM, "\"optimizer\":\t\"muon\"", "\"optimizer\":\t\"adamw\"",
     "optimizer adamw but the recorded config's optim.groups", "assigns muon"},
    /* the recorded config edited instead: every Muon family disagrees with it */
    {"config optim.groups edited", ALL_STATES, "\"groups\":\t\"" GROUPS "\"", "\"groups\":\t\"adamw:all\"",
     "optimizer muon but the recorded config's optim.groups 'adamw:all'", "assigns adamw"},
    /* with every state stored, a Muon family relabelled AdamW has a momentum it cannot keep */
    {"family optimizer vs its states", ALL_STATES, "\"optimizer\":\t\"muon\"", "\"optimizer\":\t\"adamw\"",
     "trained by adamw, which keeps no momentum state", NULL},
    /* declarations this MegaC does not implement, each named by group, state and field */
    {"float64 state", ALL_STATES, "\"dtype\":\t\"float32\"", "\"dtype\":\t\"float64\"",
     "dtype 'float64' is not an element dtype this MegaC implements", "float32, bfloat16, float16"},
    {"shape rule", ALL_STATES, "\"shape\":\t\"param\"", "\"shape\":\t\"rows\"",
     "optimizer_groups[0] (adamw): state exp_avg: shape 'rows' is not that kind's rule (param)", NULL},
    {"placement rule", ALL_STATES, "\"placement\":\t\"param\"", "\"placement\":\t\"replicated\"",
     "state exp_avg: placement 'replicated' is not that kind's rule (param)", NULL},
    /* int64 is for counters only: a float state declared int64 would be misread */
    {"int64 float state", ALL_STATES, "\"dtype\":\t\"float32\"", "\"dtype\":\t\"int64\"",
     "state exp_avg: dtype 'int64' is not a float format (float32, bfloat16, float16, float8_e4m3, float8_e5m2)", NULL},
    {"other declared states", ALL_STATES, "\"name\":\t\"momentum\"", "\"name\":\t\"exp_avg\"",
     "(muon) declares the states [exp_avg] but muon keeps [momentum]", NULL},
    {"unknown optimizer", ALL_STATES, "\"name\":\t\"muon\"", "\"name\":\t\"lion\"",
     "'lion' is not an optimizer this MegaC implements", NULL},
    {"no optimizer_groups", ALL_STATES, "\"optimizer_groups\":", "\"optimizer_groupz\":", "missing key 'optimizer_groups'", NULL},
    {"family without optimizer", ALL_STATES, "\"optimizer\":\t\"muon\"", "\"optimizr\":\t\"muon\"",
     "missing key 'families[", ".optimizer'"},
};

static void test_edited_manifests(const char *root) {
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    const manifest_edit *e = &edits[i];
    char dir[2048];
    pathf(dir, sizeof dir, "%s/edit%zu", root, i);
    CHECK_OK(save_reference_groups(dir, 2, 1, 2, 1, 0, 1, 5, 9, 0, e->state_mask, GROUPS));
    CHECK(edit_manifest(dir, 5, e->from, e->to) == 0, "%s: replacing '%s' failed", e->what, e->from);
    mc_ckpt *ck = NULL;
    int rc = mc_ckpt_open(dir, NULL, &ck);
    mc_ckpt_close(ck);
    CHECK(rc != 0, "%s: open should fail", e->what);
    CHECK(rc == 0 || strstr(mc_errmsg(), e->n1), "%s: message lacks '%s': %s", e->what, e->n1, mc_errmsg());
    CHECK(rc == 0 || !e->n2 || strstr(mc_errmsg(), e->n2), "%s: message lacks '%s': %s", e->what, e->n2, mc_errmsg());
    if (getenv("MC_TEST_VERBOSE")) printf("%-32s -> %s\n", e->what, mc_errmsg());
  }
}

/* --write-adamw: the AdamW-only sample test_ckpt_v2.py rewrites to format version 2. */
static int write_adamw(const char *dir) {
  if (save_reference(dir, 2, 1, 2, 1, 0, 1, 5, 9, 0) != 0) {
    fprintf(stderr, "writing the AdamW sample failed: %s\n", mc_errmsg());
    return 1;
  }
  return 0;
}

/* --check-v2: that sample as format version 2 loads as AdamW throughout, every shard equal. */
static int check_v2(const char *dir) {
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return mc_check_exit("test_ckpt_optim --check-v2");
  mc_config cfg;
  mc_geometry g;
  CHECK(mc_ckpt_format_version(ck) == 2, "format version %d", mc_ckpt_format_version(ck));
  CHECK_OK(mc_ckpt_config(ck, &cfg));
  CHECK(strcmp(cfg.train.optim.groups, "adamw:all") == 0, "optim.groups of a version 2 checkpoint: '%s'", cfg.train.optim.groups);
  CHECK_OK(mc_geometry_of_config(&cfg, NULL, &g));
  for (int f = 0; f < mc_ckpt_n_families(ck); f++) {
    CHECK(mc_ckpt_family_at(ck, f)->opt == MC_OPT_ADAMW, "%s: optimizer %s", mc_ckpt_family_at(ck, f)->name,
          mc_opt_name(mc_ckpt_family_at(ck, f)->opt));
    CHECK(mc_ckpt_family_has_state(ck, f, MC_STATE_EXP_AVG_SQ) && !mc_ckpt_family_has_state(ck, f, MC_STATE_MOMENTUM),
          "%s: states", mc_ckpt_family_at(ck, f)->name);
  }
  for (int i = 0; i < mc_ckpt_n_shards(ck); i++) CHECK(mc_ckpt_shard_at(ck, i)->opt == -1, "shard %d optimizer", i);
  CHECK_OK(mc_ckpt_verify_all(ck));
  CHECK(check_every_shard(ck, &g, 9) == 0, "version 2 shards read back differ");
  CHECK(check_against_layout(ck, &g, 9) == 0, "version 2 read as its layout");
  mc_geometry_free(&g);
  mc_ckpt_close(ck);
  return mc_check_exit("test_ckpt_optim --check-v2");
}

/* --read: opens DIR and reads every shard (attributes checked against the manifest); prints
 * the error and returns 1 on failure, for test_ckpt_v2.py's forged checkpoints. */
static int read_all(const char *dir) {
  mc_ckpt *ck = NULL;
  int rc = mc_ckpt_open(dir, NULL, &ck);
  if (rc == 0) rc = mc_ckpt_verify_all(ck);
  mc_ckpt_close(ck);
  if (rc) fprintf(stderr, "%s\n", mc_errmsg());
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write-adamw") == 0) return write_adamw(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--check-v2") == 0) return check_v2(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--read") == 0) return read_all(argv[2]);
  char root[2048];
  scratch_dir("optim", root, sizeof root);
  test_muon_roundtrip(root);
  test_refused_items(root);
  test_edited_manifests(root);
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit("test_ckpt_optim");
}
