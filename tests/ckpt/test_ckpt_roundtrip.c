/* Round trip: for layouts covering every placement rule and state kind, save the reference
 * state with one process writing every rank's file, then read it back as the hyperslabs of
 * other layouts and as random boxes; the same with several writers (threads standing in for
 * processes) synchronised by the barrier callback, including a failing writer.
 * With "--write DIR" it only writes a sample checkpoint (used by the Python tests). */
#include "tests/ckpt/test_ckpt_common.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include "ckpt/format.h"

#include "tests/check.h"

static const lay fixed[] = {
    {1, 1, 1, 1, 0, 0}, {2, 1, 2, 1, 0, 1}, {1, 2, 2, 2, 0, 1}, {2, 2, 1, 1, 0, 0},
    {2, 1, 2, 2, 1, 3}, {1, 4, 3, 1, 0, 1}, {1, 1, 4, 4, 0, 1}, {2, 2, 2, 2, 1, 1},
};
#define N_FIXED (int)(sizeof fixed / sizeof fixed[0])

static lay random_layout(uint64_t *ctr) { return random_layout_of(7, ctr); }

static void check_boxes(mc_ckpt *ck, const mc_geometry *g, uint64_t seed, uint64_t *ctr) {
  for (int t = 0; t < 40; t++) {
    int f = (int)mc_rng_below(11, 1, (*ctr)++, (uint64_t)g->fams.n);
    int s = (int)mc_rng_below(11, 1, (*ctr)++, 3);
    const mc_family *fam = &g->fams.f[f];
    int64_t start[3] = {0}, count[3] = {0}, n = 1;
    for (int k = 0; k < fam->ndim; k++) {
      start[k] = (int64_t)mc_rng_below(11, 1, (*ctr)++, (uint64_t)fam->shape[k]);
      count[k] = 1 + (int64_t)mc_rng_below(11, 1, (*ctr)++, (uint64_t)(fam->shape[k] - start[k]));
      n *= count[k];
    }
    float *got = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
    CHECK_OK(mc_ckpt_read(ck, fam->name, (mc_state)s, start, count, got));
    ref_box(seed, f, s, fam->ndim, fam->shape, start, count, want);
    CHECK(memcmp(got, want, (size_t)n * sizeof(float)) == 0, "box of %s/%s differs", fam->name, mc_state_name((mc_state)s));
    free(got);
    free(want);
  }
}

/* Every hyperslab every rank of g holds, in one mc_ckpt_read_many call on a fresh handle:
 * shards serving several requests are read and verified once and scattered. */
static void check_read_many(const char *dir, const mc_geometry *g, uint64_t seed) {
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  int cap = g->world * g->fams.n * MC_N_STATES, n = 0;
  mc_ckpt_request *reqs = calloc((size_t)cap, sizeof *reqs);
  int *fam_of = calloc((size_t)cap, sizeof(int));
  for (int r = 0; r < g->world; r++)
    for (int f = 0; f < g->fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        mc_shard sh;
        mc_shard_of(g, f, (mc_state)s, r, &sh);
        if (!sh.held || !mc_family_has_state(&g->fams.f[f], (mc_state)s)) continue;
        if (mc_state_is_scalar((mc_state)s)) continue; /* int64 (step): mc_ckpt_read_i64, in check_against_layout */
        reqs[n].family = g->fams.f[f].name;
        reqs[n].state = (mc_state)s;
        memcpy(reqs[n].start, sh.start, sizeof sh.start);
        memcpy(reqs[n].count, sh.count, sizeof sh.count);
        reqs[n].out = malloc((size_t)sh.numel * sizeof(float));
        fam_of[n++] = f;
      }
  CHECK_OK(mc_ckpt_read_many(ck, reqs, n));
  int64_t bad = 0;
  for (int i = 0; i < n; i++) {
    const mc_family *fam = &g->fams.f[fam_of[i]];
    int64_t numel = 1;
    for (int k = 0; k < fam->ndim; k++) numel *= reqs[i].count[k];
    float *want = malloc((size_t)numel * sizeof(float));
    ref_box(seed, fam_of[i], reqs[i].state, fam->ndim, fam->shape, reqs[i].start, reqs[i].count, want);
    bad += memcmp(want, reqs[i].out, (size_t)numel * sizeof(float)) != 0;
    free(want);
    free(reqs[i].out);
  }
  CHECK(bad == 0, "read_many: %" PRId64 " of %d requests differ", bad, n);
  free(reqs);
  free(fam_of);
  mc_ckpt_close(ck);
}

static void test_single_writer(const char *root) {
  char seen_rules[16][MC_CKPT_RULE_MAX];
  int n_rules = 0;
  uint64_t ctr = 0;
  int n_layouts = N_FIXED + 2;
  for (int li = 0; li < n_layouts; li++) {
    lay a = li < N_FIXED ? fixed[li] : random_layout(&ctr);
    lay b = random_layout(&ctr);
    mc_config cfg;
    mc_geometry ga, gb;
    CHECK_OK(geom(&a, &cfg, &ga));
    CHECK_OK(geom(&b, &cfg, &gb));
    for (int f = 0; f < ga.fams.n; f++) {
      char rule[MC_CKPT_RULE_MAX];
      mc_placement_rule(&ga, f, rule, sizeof rule);
      int known = 0;
      for (int i = 0; i < n_rules; i++) known |= strcmp(seen_rules[i], rule) == 0;
      if (!known && n_rules < 16) snprintf(seen_rules[n_rules++], MC_CKPT_RULE_MAX, "%s", rule);
    }
    char dir[2048];
    pathf(dir, sizeof dir, "%s/layout%d", root, li);
    uint64_t seed = 100 + (uint64_t)li;
    CHECK_OK(save_reference(dir, a.tp, a.pp, a.dp, a.ep, a.sp, a.zero, 10 + li, seed, 0));
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
    if (!ck) continue;
    CHECK(mc_ckpt_step(ck) == 10 + li, "step %" PRId64, mc_ckpt_step(ck));
    /* every family is AdamW's: param, both moments and the step stored, no momentum */
    for (int s = 0; s < MC_N_STATES; s++)
      CHECK(mc_ckpt_has_state(ck, (mc_state)s) == (s != MC_STATE_MOMENTUM), "state %s stored: %d", mc_state_name((mc_state)s),
            mc_ckpt_has_state(ck, (mc_state)s));
    /* shards are exactly the primaries, one file per writing rank */
    int64_t stored = 0, total = 0;
    for (int i = 0; i < mc_ckpt_n_shards(ck); i++) stored += mc_ckpt_shard_at(ck, i)->numel;
    for (int f = 0; f < ga.fams.n; f++) total += 3 * ga.fams.f[f].numel + 1; /* + the one step */
    CHECK(stored == total, "layout %d: shards hold %" PRId64 " of %" PRId64, li, stored, total);
    CHECK(check_against_layout(ck, &ga, seed) == 0, "layout %d read as itself", li);
    CHECK(check_against_layout(ck, &gb, seed) == 0, "layout %d (tp%d pp%d dp%d ep%d zero%d) read as tp%d pp%d dp%d ep%d zero%d", li,
          a.tp, a.pp, a.dp, a.ep, a.zero, b.tp, b.pp, b.dp, b.ep, b.zero);
    check_boxes(ck, &ga, seed, &ctr);
    CHECK_OK(mc_ckpt_verify_all(ck));
    check_read_many(dir, &gb, seed);
    mc_config back;
    CHECK_OK(mc_ckpt_config(ck, &back));
    CHECK(back.parallel.tp == a.tp && back.parallel.dp == a.dp && back.parallel.pp == a.pp && back.parallel.zero == a.zero,
          "layout not recorded");
    mc_ckpt_close(ck);
    /* verification opt-out reads the same */
    mc_ckpt_open_opts oo;
    mc_ckpt_open_opts_default(&oo);
    oo.verify = 0;
    oo.io_threads = 1;
    CHECK_OK(mc_ckpt_open(dir, &oo, &ck));
    if (ck) CHECK(check_against_layout(ck, &gb, seed) == 0, "unverified read of layout %d", li);
    mc_ckpt_close(ck);
    mc_geometry_free(&ga);
    mc_geometry_free(&gb);
  }
  const char *want[] = {"replicated", "tp(dim=0)", "tp(dim=1)", "ep(dim=0)", "replicated x zero_balanced_v2(dim=0)",
                        "tp(dim=0) x zero_balanced_v2(dim=0)", "tp(dim=1) x zero_balanced_v2(dim=0)",
                        "ep(dim=0) x zero_balanced_v2(dim=0)"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int known = 0;
    for (int k = 0; k < n_rules; k++) known |= strcmp(seen_rules[k], want[i]) == 0;
    CHECK(known, "placement rule '%s' never exercised", want[i]);
  }
}

static void test_state_and_model(const char *root) {
  char dir[2048];
  pathf(dir, sizeof dir, "%s/state", root);
  CHECK_OK(save_reference(dir, 2, 1, 2, 1, 0, 1, 77, 5, 0));
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  mc_train_state want, got;
  make_state(77, &want);
  CHECK_OK(mc_ckpt_train_state(ck, &got));
  CHECK(got.step == 77 && got.tokens_seen == want.tokens_seen && got.data_position == want.data_position, "counters");
  CHECK(got.seed == want.seed && got.rng_counter == want.rng_counter, "64-bit seed %" PRIu64 " / counter %" PRIu64, got.seed,
        got.rng_counter);
  CHECK(got.lr == want.lr && got.beta2 == want.beta2 && got.adam_eps == want.adam_eps && got.warmup_steps == 30,
        "optimizer hyperparameters");
  CHECK(got.weight_decay == want.weight_decay, "weight_decay %.17g read back as %.17g", want.weight_decay, got.weight_decay);
  mc_config cfg, saved;
  CHECK_OK(mc_ckpt_config(ck, &saved));
  CHECK(saved.train.beta2 == 0.3 + 0.6, "config train.beta2 read back as %.17g", saved.train.beta2);
  mc_config_default(&cfg);
  CHECK_OK(mc_ckpt_check_model(ck, &cfg.model));
  mc_model m = cfg.model;
  m.init_std = 0.5; /* training-only */
  CHECK_OK(mc_ckpt_check_model(ck, &m));
  m = cfg.model;
  m.d_model = 128;
  CHECK(mc_ckpt_check_model(ck, &m) != 0 && strstr(mc_errmsg(), "model.d_model"), "d_model: %s", mc_errmsg());
  m = cfg.model;
  snprintf(m.pattern, sizeof m.pattern, "AEMA");
  CHECK(mc_ckpt_check_model(ck, &m) != 0 && strstr(mc_errmsg(), "model.pattern"), "pattern: %s", mc_errmsg());
  /* unknown family / state / box are errors, not crashes */
  float x[4];
  int64_t st[3] = {0, 0, 0}, cn[3] = {1, 1, 1};
  CHECK(mc_ckpt_read(ck, "no.such.family", MC_STATE_PARAM, st, cn, x) != 0 && strstr(mc_errmsg(), "no.such.family"), "%s",
        mc_errmsg());
  int64_t big[3] = {100000, 1, 1};
  CHECK(mc_ckpt_read(ck, "embed.weight", MC_STATE_PARAM, st, big, x) != 0 && strstr(mc_errmsg(), "outside"), "%s",
        mc_errmsg());
  mc_ckpt_close(ck);
  /* a step directory opens directly too */
  pathf(dir, sizeof dir, "%s/state/step_77", root);
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  mc_ckpt_close(ck);
}

/* mc_ckpt_io_bytes: with verification a shard is read whole and hashed once per open (a
 * second read of it reads, without hashing); without it a part reads only its bytes.
 * mc_ckpt_check_request accepts what a read accepts and refuses what it refuses. */
static void test_io_counts(const char *root) {
  char dir[2048];
  pathf(dir, sizeof dir, "%s/state", root); /* tp2 x dp2 zero 1, from test_state_and_model */
  for (int verify = 1; verify >= 0; verify--) {
    mc_ckpt_open_opts oo;
    mc_ckpt_open_opts_default(&oo);
    oo.verify = verify;
    mc_ckpt *ck = NULL;
    CHECK_OK(mc_ckpt_open(dir, &oo, &ck));
    if (!ck) return;
    CHECK(mc_ckpt_verifies(ck) == verify, "mc_ckpt_verifies %d, opened with verify=%d", mc_ckpt_verifies(ck), verify);
    const mc_ckpt_shard *s = NULL;
    for (int i = 0; i < mc_ckpt_n_shards(ck) && !s; i++)
      if (mc_ckpt_shard_at(ck, i)->ndim == 2 && mc_ckpt_shard_at(ck, i)->count[0] > 1) s = mc_ckpt_shard_at(ck, i);
    CHECK(s != NULL, "no 2-d shard of several rows");
    if (!s) {
      mc_ckpt_close(ck);
      return;
    }
    const int64_t whole = s->numel * 4, row = s->count[1] * 4;
    float *buf = malloc((size_t)whole);
    int64_t one[3] = {1, s->count[1], 1}, rd = -1, hs = -1;
    mc_ckpt_request r = {s->family, s->state, {s->start[0], s->start[1], 0}, {1, s->count[1], 1}, buf};
    CHECK_OK(mc_ckpt_check_request(ck, &r));
    CHECK_OK(mc_ckpt_read(ck, s->family, s->state, r.start, one, buf));
    mc_ckpt_io_bytes(ck, &rd, &hs);
    CHECK(rd == (verify ? whole : row) && hs == (verify ? whole : 0), "verify=%d: one row of %s read %lld, hashed %lld",
          verify, s->dataset, (long long)rd, (long long)hs);
    CHECK_OK(mc_ckpt_read(ck, s->family, s->state, r.start, one, buf));
    mc_ckpt_io_bytes(ck, &rd, &hs);
    CHECK(rd == (verify ? whole : row) + row && hs == (verify ? whole : 0), "verify=%d: again: read %lld, hashed %lld",
          verify, (long long)rd, (long long)hs);
    r.family = "no.such.family";
    CHECK(mc_ckpt_check_request(ck, &r) != 0 && strstr(mc_errmsg(), "no.such.family"), "%s", mc_errmsg());
    r.family = s->family, r.out = NULL;
    CHECK(mc_ckpt_check_request(ck, &r) != 0 && strstr(mc_errmsg(), "no output buffer"), "%s", mc_errmsg());
    free(buf);
    mc_ckpt_close(ck);
  }
}

/* ---------------------------------------------------------------- several writers */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, arrived, acc, result, gen;
} and_barrier;

static int and_barrier_fn(void *u, int ok) {
  and_barrier *b = u;
  pthread_mutex_lock(&b->mu);
  if (b->arrived == 0) b->acc = 1;
  b->acc &= ok != 0;
  if (++b->arrived == b->n) {
    b->result = b->acc;
    b->arrived = 0;
    b->gen++;
    pthread_cond_broadcast(&b->cv);
  } else {
    int gen = b->gen;
    while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
  }
  int r = b->result;
  pthread_mutex_unlock(&b->mu);
  return r;
}

typedef struct {
  const char *dir;
  const mc_geometry *g;
  const mc_config *cfg;
  int rank;
  int64_t step;
  int sabotage; /* this writer passes an item without data */
  int async;    /* save through an mc_ckpt_saver (the barrier then runs on its thread) */
  and_barrier *bar;
  int rc;
  char msg[1024];
} writer;

static void *writer_main(void *arg) {
  writer *w = arg;
  item_set set;
  make_items(w->g, 42, 7, w->rank, w->rank + 1, &set);
  if (w->sabotage)
    for (int i = 0; i < set.n; i++) {
      mc_shard sh;
      mc_shard_of(w->g, set.items[i].family, set.items[i].state, w->rank, &sh);
      if (sh.primary) {
        set.items[i].data = NULL;
        break;
      }
    }
  mc_train_state st;
  make_state(w->step, &st);
  mc_ckpt_save_opts o;
  mc_ckpt_save_opts_default(&o);
  o.root = w->rank == 0;
  o.barrier = and_barrier_fn;
  o.barrier_user = w->bar;
  o.io_threads = 1;
  if (w->async) {
    mc_ckpt_saver *sv = NULL;
    w->rc = mc_ckpt_saver_create(w->dir, &o, &sv);
    if (w->rc == 0) w->rc = mc_ckpt_saver_save(sv, w->g, w->cfg, &st, set.items, set.n);
    if (w->rc == 0) memset(set.bufs[0], 0, sizeof(float)); /* the copy is what gets saved */
    int crc = sv ? mc_ckpt_saver_close(sv) : 0;
    if (w->rc == 0) w->rc = crc;
  } else {
    w->rc = mc_ckpt_save(w->dir, w->g, w->cfg, &st, set.items, set.n, &o);
  }
  snprintf(w->msg, sizeof w->msg, "%s", w->rc ? mc_errmsg() : "");
  free_items(&set);
  return NULL;
}

static void run_writers(const char *dir, const mc_geometry *g, const mc_config *cfg, int64_t step, int sabotage_rank,
                        int async, writer *ws) {
  and_barrier bar = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, g->world, 0, 1, 0, 0};
  pthread_t th[16];
  for (int r = 0; r < g->world; r++) {
    ws[r] = (writer){dir, g, cfg, r, step, r == sabotage_rank, async, &bar, 0, ""};
    pthread_create(&th[r], NULL, writer_main, &ws[r]);
  }
  for (int r = 0; r < g->world; r++) pthread_join(th[r], NULL);
}

static void test_several_writers(const char *root) {
  mc_config cfg;
  mc_geometry g;
  CHECK_OK(tiny_geometry(2, 2, 2, 1, 0, 1, &cfg, &g));
  char dir[2048];
  pathf(dir, sizeof dir, "%s/multi", root);
  writer ws[16];
  run_writers(dir, &g, &cfg, 3, -1, 0, ws);
  for (int r = 0; r < g.world; r++) CHECK(ws[r].rc == 0, "writer %d: %s", r, ws[r].msg);
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) {
    CHECK(check_against_layout(ck, &g, 42) == 0, "multi-writer checkpoint content");
    mc_ckpt_close(ck);
  }
  for (int r = 0; r < g.world; r++) {
    char name[64];
    pathf(name, sizeof name, "step_3/rank_%d.h5", r);
    mc_shard sh;
    int writes = 0;
    for (int f = 0; f < g.fams.n; f++) {
      mc_shard_of(&g, f, MC_STATE_PARAM, r, &sh);
      writes |= sh.primary;
    }
    CHECK(path_exists(dir, name) == writes, "rank %d file presence %d, writes %d", r, path_exists(dir, name), writes);
  }
  /* one writer fails: every writer returns an error, step 4 never appears */
  run_writers(dir, &g, &cfg, 4, 3, 0, ws);
  for (int r = 0; r < g.world; r++) CHECK(ws[r].rc != 0, "writer %d should fail", r);
  CHECK(strstr(ws[3].msg, "no data") != NULL, "failing writer says why: %s", ws[3].msg);
  CHECK(strstr(ws[0].msg, "another process failed") != NULL, "others say another failed: %s", ws[0].msg);
  CHECK(!path_exists(dir, "step_4") && !path_exists(dir, "step_4.tmp"), "no trace of step 4");
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) CHECK(mc_ckpt_step(ck) == 3, "latest still step 3");
  mc_ckpt_close(ck);
  /* the same with every writer saving asynchronously */
  run_writers(dir, &g, &cfg, 5, -1, 1, ws);
  for (int r = 0; r < g.world; r++) CHECK(ws[r].rc == 0, "async writer %d: %s", r, ws[r].msg);
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (ck) {
    CHECK(mc_ckpt_step(ck) == 5, "async multi-writer step");
    CHECK(check_against_layout(ck, &g, 42) == 0, "async multi-writer checkpoint content");
    mc_ckpt_close(ck);
  }
  run_writers(dir, &g, &cfg, 6, 1, 1, ws);
  for (int r = 0; r < g.world; r++) CHECK(ws[r].rc != 0, "async writer %d should fail", r);
  CHECK(!path_exists(dir, "step_6") && !path_exists(dir, "step_6.tmp"), "no trace of step 6");
  mc_geometry_free(&g);
}

static int write_sample(const char *dir) {
  /* tp x pp x dp = 8 ranks with ep, sp and ZeRO-1: every placement rule in one checkpoint;
   * Muon trains the matrices, AdamW the rest: every state kind in it */
  if (save_reference_groups(dir, 2, 2, 2, 2, 1, 1, 12, 7, 0, ALL_STATES, "muon:matrices,adamw:all") != 0) {
    fprintf(stderr, "writing sample checkpoint failed: %s\n", mc_errmsg());
    return 1;
  }
  return 0;
}

/* Saved fp32 shards are contiguous little-endian datasets, so loads read them with plain
 * preads outside the HDF5 lock: the raw bytes at the dataset's offset are the hashed bytes.
 * (An int64 step, one element, is read through HDF5: mc_ckpt_read_i64.) */
static void test_raw_reads(const char *root) {
  char dir[2048];
  pathf(dir, sizeof dir, "%s/raw", root);
  CHECK_OK(save_reference(dir, 2, 1, 2, 1, 0, 1, 3, 11, 0));
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, NULL, &ck));
  if (!ck) return;
  int checked = 0;
  for (int i = 0; i < mc_ckpt_n_shards(ck); i += 7, checked++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (s->dtype != MC_ELEM_F32) continue;
    char path[4096];
    pathf(path, sizeof path, "%s/%s", mc_ckpt_step_dir(ck), s->file);
    int64_t fid = -1;
    CHECK_OK(mc_h5_open_read(path, &fid));
    int64_t off = mc_h5_raw_offset(fid, s->dataset);
    mc_h5_close(fid);
    CHECK(off > 0, "%s:%s has no raw offset", s->file, s->dataset);
    float *buf = malloc((size_t)s->numel * sizeof(float));
    int fd = open(path, O_RDONLY);
    CHECK_OK(mc_read_raw(fd, off, buf, s->numel * 4, s->file, s->dataset));
    char hex[65];
    mc_sha256_hex(buf, (size_t)s->numel * 4, hex);
    CHECK(strcmp(hex, s->sha256) == 0, "%s:%s raw bytes hash to %s, manifest %s", s->file, s->dataset, hex, s->sha256);
    /* reading past the end is an error naming the file and dataset, not a short read */
    CHECK(mc_read_raw(fd, off + s->numel * 4 + ((int64_t)1 << 40), buf, 4, s->file, s->dataset) != 0 &&
              strstr(mc_errmsg(), s->dataset),
          "read past the end: %s", mc_errmsg());
    close(fd);
    free(buf);
  }
  CHECK(checked > 3, "raw reads checked on %d shards", checked);
  mc_ckpt_close(ck);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_sample(argv[2]);
  char root[2048];
  scratch_dir("roundtrip", root, sizeof root);
  test_single_writer(root);
  test_state_and_model(root);
  test_io_counts(root);
  test_several_writers(root);
  test_raw_reads(root);
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit("test_ckpt_roundtrip");
}
