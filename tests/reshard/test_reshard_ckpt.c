/* mcreshard's engine on real checkpoints, for random pairs of layouts (stage split, TP, DP,
 * EP and ZeRO changes): the source is written by the checkpoint library's own writer;
 * A -> B gives a checkpoint the library opens and reads back with the right content and the
 * same content digests (mcaudit); B -> A restores A's shards bit-identically (same
 * hyperslabs, same bytes, same hashes) and the training state. Also: a corrupted source
 * shard is refused naming it; an interrupted reshard (error or crash) leaves no DST; an
 * existing DST needs force; a target breaking a layout rule is refused naming the rule;
 * consolidation to world size 1. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"
#include "reshard/audit.h"
#include "reshard/reshard.h"
#include "rs_ckpt_testlib.h"
#include "rs_roundtrip.h"
#include "tests/ckpt/test_ckpt_common.h"

static char root[2048];

/* Turns a checkpoint this version wrote (format 3) of an AdamW-only model into what format
 * version 2 wrote: manifest format_version 2 without optimizer_groups, families[].optimizer
 * and the config's optim section, rank files' format_version attribute 2 and no `optimizer`
 * attribute on their datasets; without files[].sha256 (the rank files changed; a manifest
 * without whole-file hashes is one readers accept), the manifest's hash in manifest.sha256
 * and latest recomputed. */
static void make_format_v2(const char *dir, int64_t step) {
  char mp[4200], rp[4400];
  size_t n = 0;
  char *text = read_manifest_text(dir, step, mp, &n);
  cJSON *m = text ? cJSON_Parse(text) : NULL;
  cJSON *fams = cJSON_GetObjectItemCaseSensitive(m, "families"), *files = cJSON_GetObjectItemCaseSensitive(m, "files"),
        *shards = cJSON_GetObjectItemCaseSensitive(m, "shards"), *it;
  int ok = m && cJSON_GetObjectItemCaseSensitive(m, "optimizer_groups") && fams && files && shards;
  /* the rank files: version attribute, and each shard's dataset without its optimizer */
  cJSON_ArrayForEach(it, files) {
    snprintf(rp, sizeof rp, "%s/step_%lld/%s", dir, (long long)step, cJSON_GetStringValue(cJSON_GetObjectItem(it, "name")));
    hid_t fid = H5Fopen(rp, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t at = fid >= 0 ? H5Aopen(fid, "format_version", H5P_DEFAULT) : -1;
    int two = 2;
    ok &= at >= 0 && H5Awrite(at, H5T_NATIVE_INT, &two) >= 0;
    if (at >= 0) H5Aclose(at);
    cJSON *sh;
    cJSON_ArrayForEach(sh, shards) {
      if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(sh, "file")), cJSON_GetStringValue(cJSON_GetObjectItem(it, "name"))))
        continue;
      const char *ds = cJSON_GetStringValue(cJSON_GetObjectItem(sh, "dataset"));
      ok &= fid >= 0 && H5Adelete_by_name(fid, ds, "optimizer", H5P_DEFAULT) >= 0;
      /* AdamW's step came with format 4 */
      if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(sh, "state")), "step")) ok &= fid >= 0 && H5Ldelete(fid, ds, H5P_DEFAULT) >= 0;
    }
    if (fid >= 0) H5Fclose(fid);
    struct stat st;
    ok &= stat(rp, &st) == 0;
    cJSON_ReplaceItemInObjectCaseSensitive(it, "bytes", cJSON_CreateNumber((double)st.st_size));
  }
  for (int i = cJSON_GetArraySize(shards) - 1; i >= 0; i--)
    if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, i), "state")), "step"))
      cJSON_DeleteItemFromArray(shards, i);
  cJSON_ArrayForEach(it, shards) cJSON_DeleteItemFromObjectCaseSensitive(it, "offset"); /* a key of format 6 */
  cJSON *states = cJSON_GetObjectItemCaseSensitive(m, "states");
  for (int i = cJSON_GetArraySize(states) - 1; i >= 0; i--)
    if (!strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(states, i)), "step")) cJSON_DeleteItemFromArray(states, i);
  cJSON_DeleteItemFromObjectCaseSensitive(m, "optimizer_groups");
  cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "config"), "optim");
  cJSON_ReplaceItemInObjectCaseSensitive(m, "format_version", cJSON_CreateNumber(2));
  cJSON_ArrayForEach(it, fams) cJSON_DeleteItemFromObjectCaseSensitive(it, "optimizer");
  char *out = m ? cJSON_Print(m) : NULL;
  FILE *mf = out ? fopen(mp, "wb") : NULL;
  ok &= mf && fwrite(out, 1, strlen(out), mf) == strlen(out);
  if (mf) ok &= fclose(mf) == 0;
  ok &= strip_file_hashes(dir, step) == 0 && rehash_manifest(dir, step) == 0;
  CHECK(ok, "%s: not rewritten as format version 2", dir);
  free(out);
  cJSON_Delete(m);
  free(text);
}

/* Turns a checkpoint written under the chunked rule into exactly what format version 1 wrote
 * (by way of version 2): manifest format_version 1 without layout.ownership_rule or
 * files[].sha256 (its hashes in manifest.sha256 and latest recomputed), rank files'
 * format_version attribute 1. */
static void make_format_v1(const char *dir, int64_t step) {
  make_format_v2(dir, step);
  /* (version 1 predates whole-file hashes too: make_format_v2 left them out) */
  CHECK(edit_manifest(dir, step, "\"format_version\":\t2", "\"format_version\":\t1") == 0 &&
            edit_manifest(dir, step, "\"ownership_rule\":\t\"chunked\",\n\t\t", "") == 0,
        "manifest of %s lacks version 2 or the chunked rule", dir);
  for (int r = 0; r < 64; r++) {
    char rp[2600];
    snprintf(rp, sizeof rp, "%s/step_%lld/rank_%d.h5", dir, (long long)step, r);
    struct stat before, after;
    if (stat(rp, &before) != 0) continue;
    hid_t fid = H5Fopen(rp, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t at = fid >= 0 ? H5Aopen(fid, "format_version", H5P_DEFAULT) : -1;
    int one = 1;
    CHECK(at >= 0 && H5Awrite(at, H5T_NATIVE_INT, &one) >= 0, "%s: format_version not rewritten", rp);
    if (at >= 0) H5Aclose(at);
    if (fid >= 0) H5Fclose(fid);
    CHECK(stat(rp, &after) == 0 && after.st_size == before.st_size, "%s changed size", rp);
  }
}

/* Every hyperslab every rank of g holds (of the state kinds each family's optimizer keeps),
 * read from the checkpoint at path, equals the reference content (what a run of layout g
 * loads). Returns the mismatching elements. */
static int64_t load_as(const char *path, const mc_geometry *g) {
  mc_ckpt *ck;
  if (mc_ckpt_open(path, NULL, &ck) != 0) return -1;
  int64_t bad = 0;
  for (int r = 0; r < g->world && bad >= 0; r++)
    for (int f = 0; f < g->fams.n && bad >= 0; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        mc_shard sh;
        if (!mc_family_has_state(&g->fams.f[f], (mc_state)s)) continue; /* a kind its optimizer does not keep */
        if (!mc_ckpt_family_has_state(ck, mc_ckpt_find_family(ck, g->fams.f[f].name), (mc_state)s)) continue; /* format < 4: no step */
        if (mc_shard_of(g, f, (mc_state)s, r, &sh) != 0 || !sh.held) continue;
        if (mc_state_is_scalar((mc_state)s)) { /* AdamW's step, read by every holder */
          int64_t v = 0;
          if (mc_ckpt_read_i64(ck, g->fams.f[f].name, (mc_state)s, &v) != 0) bad = -1;
          else bad += v != rs_i64_value(f);
          continue;
        }
        mc_box sl = {sh.ndim, {0}, {0}};
        for (int d = 0; d < sh.ndim; d++) sl.start[d] = sh.start[d], sl.count[d] = sh.count[d];
        float *got = malloc((size_t)sh.numel * 4), *want = malloc((size_t)sh.numel * 4);
        if (mc_ckpt_read(ck, g->fams.f[f].name, (mc_state)s, sh.start, sh.count, got) != 0) bad = -1;
        rs_pack(f, s, g->fams.f[f].shape, g->fams.f[f].ndim, &sl, want);
        for (int64_t i = 0; bad >= 0 && i < sh.numel; i++) bad += memcmp(&got[i], &want[i], 4) != 0;
        free(got);
        free(want);
      }
  mc_ckpt_close(ck);
  return bad;
}

/* A checkpoint written under an older rule, as that version wrote it: format version 1
 * (chunked rule: ceil(rows/g) ZeRO parts, lowest-rank primaries) or format version 2 with
 * layout.ownership_rule "balanced" (dim-0 parts only, rotated extras, spread primaries),
 * validates, loads, audits and reshards under this version, whose runs use balanced-v2; A ->
 * B -> A (both steps under balanced-v2) keeps the content bit for bit, and B -> A -> B gives
 * B's shards back, byte for byte. */
static void old_rule_case(const mc_model *m, int old_rule, int tp, int dp, int pp, int ep, int zero, int k) {
  mc_layout l;
  memset(&l, 0, sizeof l);
  l.tp = tp, l.dp = dp, l.pp = pp, l.ep = ep, l.sp = tp > 1 && ep > 1, l.zero = zero, l.split = MC_SPLIT_EQUAL;
  l.own_rule = old_rule;
  mc_geometry gold, gnew, gb;
  CHECK_OK(mc_geometry_build(m, &l, NULL, -1, &gold));
  l.own_rule = MC_OWN_BALANCED_V2;
  CHECK_OK(mc_geometry_build(m, &l, NULL, -1, &gnew));
  const int want_version = old_rule == MC_OWN_CHUNKED ? 1 : 2;
  char A[2300], B[2300], A2[2300], B2[2300];
  snprintf(A, sizeof A, "%s/old%d", root, k);
  snprintf(B, sizeof B, "%s/old%d-new", root, k);
  snprintf(A2, sizeof A2, "%s/old%d-back", root, k);
  snprintf(B2, sizeof B2, "%s/old%d-again", root, k);
  CHECK_OK(rs_save_reference(A, &gold, 60 + k));
  if (old_rule == MC_OWN_CHUNKED) make_format_v1(A, 60 + k);
  else make_format_v2(A, 60 + k);
  mc_ckpt *ck;
  CHECK_OK(mc_ckpt_open(A, NULL, &ck));
  if (ck) {
    mc_config cfg;
    CHECK(mc_ckpt_format_version(ck) == want_version, "format version %d", mc_ckpt_format_version(ck));
    CHECK_OK(mc_ckpt_config(ck, &cfg));
    CHECK(cfg.parallel.own_rule == old_rule, "a %s checkpoint read as rule %s", mc_own_rule_name(old_rule),
          mc_own_rule_name(cfg.parallel.own_rule));
    if (old_rule == MC_OWN_BALANCED)
      CHECK(strstr(mc_ckpt_manifest_json(ck), "\"ownership_rule\":\t\"balanced\",") != NULL, "manifest records balanced");
    /* the two rules differ on this layout: some stored shard is no primary hyperslab of the new rule */
    int differ = 0;
    for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
      const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
      mc_shard w;
      int f = mc_family_find(&gnew.fams, s->family);
      if (f < 0 || mc_shard_of(&gnew, f, s->state, s->rank, &w) != 0 || !w.primary) {
        differ++;
        continue;
      }
      for (int d = 0; d < s->ndim; d++) differ += w.start[d] != s->start[d] || w.count[d] != s->count[d];
    }
    CHECK(differ > 0, "case %d: the %s and balanced-v2 rules agree on every shard: the case tests nothing", k,
          mc_own_rule_name(old_rule));
    mc_ckpt_close(ck);
  }
  /* loads into a run of the same layout under the new rule, and into other layouts */
  CHECK(load_as(A, &gnew) == 0, "old checkpoint %s loaded under the balanced-v2 rule differs", A);
  CHECK(rs_check_content(A) == 0, "content of %s differs", A);
  int pa = -1, pb = -1, na = 0, nb = 0;
  char(*da)[MC_N_STATES][65] = rs_audit_digests(A, 1, &pa, &na);
  CHECK(pa == 0, "audit of the %s checkpoint: %d problems", mc_own_rule_name(old_rule), pa);
  /* reshards to a new layout: a checkpoint of the current rule that audits clean, same content */
  if (rs_random_geometry(900 + (uint64_t)k, m, 8, &gb) == 0) {
    CHECK(gb.layout.own_rule == MC_OWN_BALANCED_V2, "a new layout uses the balanced-v2 rule");
    CHECK_OK(rs_reshard(A, B, &gb.layout, 0, 4096));
    CHECK(rs_check_content(B) == 0, "content of %s differs", B);
    CHECK(load_as(B, &gb) == 0 && load_as(A, &gb) == 0, "resharded/old checkpoint loaded as tp%d dp%d pp%d ep%d differs",
          gb.layout.tp, gb.layout.dp, gb.layout.pp, gb.layout.ep);
    if (mc_ckpt_open(B, NULL, &ck) == 0) {
      mc_config cb;
      CHECK(mc_ckpt_format_version(ck) == MC_CKPT_FORMAT_VERSION, "resharded version %d", mc_ckpt_format_version(ck));
      CHECK(mc_ckpt_config(ck, &cb) == 0 && cb.parallel.own_rule == MC_OWN_BALANCED_V2, "resharded rule");
      mc_ckpt_close(ck);
    }
    char(*db)[MC_N_STATES][65] = rs_audit_digests(B, 1, &pb, &nb);
    CHECK(pb == 0, "audit of the resharded checkpoint: %d problems", pb);
    CHECK(da && db && na == nb && memcmp(da, db, (size_t)na * sizeof *da) == 0, "digests differ between %s and %s", A, B);
    free(db);
    /* back to A's layout (now under balanced-v2): the same content, loads as the old layout
     * did; and to B's again: B's shards byte for byte */
    CHECK_OK(rs_reshard(B, A2, &gnew.layout, 0, 1024));
    CHECK(load_as(A2, &gnew) == 0 && load_as(A2, &gb) == 0, "%s loaded back differs", A2);
    db = rs_audit_digests(A2, 1, &pb, &nb);
    CHECK(pb == 0 && da && db && na == nb && memcmp(da, db, (size_t)na * sizeof *da) == 0, "digests differ between %s and %s", A, A2);
    free(db);
    CHECK_OK(rs_reshard(A2, B2, &gb.layout, 0, 4096));
    rs_check_same_shards(B, B2);
    printf("  old rule %d: tp%d dp%d pp%d ep%d z%d (format %d, %s) -> tp%d dp%d pp%d ep%d z%d (balanced-v2) -> back -> again ok\n",
           k, tp, dp, pp, ep, zero, want_version, mc_own_rule_name(old_rule), gb.layout.tp, gb.layout.dp, gb.layout.pp,
           gb.layout.ep, gb.layout.zero);
    mc_geometry_free(&gb);
  }
  free(da);
  mc_geometry_free(&gold);
  mc_geometry_free(&gnew);
}

/* Flips one value of one dataset of a rank file, leaving its recorded hash. */
static int corrupt(const char *step_dir, const char *file, const char *dataset) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", step_dir, file);
  hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = f < 0 ? -1 : H5Dopen2(f, dataset, H5P_DEFAULT);
  if (d < 0) return -1;
  hid_t fs = H5Dget_space(d);
  hsize_t one[3] = {1, 1, 1}, at[3] = {0, 0, 0};
  float v = 12345.0f;
  hid_t ms = H5Screate_simple(1, one, NULL);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, NULL, one, NULL);
  herr_t e = H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, &v);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  H5Fclose(f);
  return e < 0 ? -1 : 0;
}

static void failure_cases(const mc_model *m) {
  mc_geometry ga;
  mc_layout la = {0}, lb = {0};
  la.tp = 2, la.pp = 2, la.dp = 1, la.ep = 1, la.zero = 1;
  CHECK_OK(mc_geometry_build(m, &la, NULL, -1, &ga));
  char A[2300], D[2300], T[2400];
  snprintf(A, sizeof A, "%s/F-src", root);
  snprintf(D, sizeof D, "%s/F-dst", root);
  snprintf(T, sizeof T, "%s.reshard.tmp", D);
  CHECK_OK(rs_save_reference(A, &ga, 7));
  lb.tp = 1, lb.pp = 1, lb.dp = 4, lb.ep = 2, lb.zero = 3;

  /* A target that breaks a layout rule is refused with the rule named. */
  mc_layout bad = lb;
  bad.tp = 3;
  CHECK(rs_reshard(A, D, &bad, 0, 1 << 20) != 0 && strstr(mc_errmsg(), "tp=3 does not divide"),
        "rule violation message: %s", mc_errmsg());
  CHECK(!rs_exists(D), "refused reshard left %s", D);

  /* An injected write failure: error, and neither DST nor the temporary directory stays. */
  setenv("MC_RESHARD_FAULT", "fail:3000", 1);
  CHECK(rs_reshard(A, D, &lb, 0, 1024) != 0 && strstr(mc_errmsg(), "injected failure"), "fault: %s", mc_errmsg());
  unsetenv("MC_RESHARD_FAULT");
  CHECK(!rs_exists(D) && !rs_exists(T), "failed reshard left files behind");

  /* A crash mid-way (the process exits at once, no clean-up): no DST. */
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MC_RESHARD_FAULT", "crash:5000", 1);
    rs_reshard(A, D, &lb, 0, 1024);
    _exit(0); /* not reached when the fault fires */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 3, "crashing child exit status %d", status);
  CHECK(!rs_exists(D), "a crashed reshard left %s", D);
  CHECK(rs_exists(T), "the crash happened before anything was written (test is not testing)");
  /* The next run clears the leftovers and succeeds. */
  CHECK_OK(rs_reshard(A, D, &lb, 0, 1024));
  CHECK(rs_exists(D) && !rs_exists(T), "after a clean run: DST present, leftovers gone");
  CHECK(rs_check_content(D) == 0, "content after recovery");

  /* An existing DST needs force, and force replaces it with a complete checkpoint. */
  mc_layout lc = lb;
  lc.dp = 2;
  CHECK(rs_reshard(A, D, &lc, 0, 1 << 20) != 0 && strstr(mc_errmsg(), "--force"), "existing DST: %s", mc_errmsg());
  CHECK_OK(rs_reshard(A, D, &lc, 1, 1 << 20));
  mc_rs_source *s;
  CHECK_OK(mc_rs_source_open(D, &s));
  if (s) {
    CHECK(mc_rs_source_geometry(s)->layout.dp == 2, "forced reshard did not replace DST");
    mc_rs_source_close(s);
  }

  /* Consolidation to world size 1. */
  char C[2300];
  snprintf(C, sizeof C, "%s/F-one", root);
  mc_layout one;
  mc_rs_consolidated_layout(&one);
  CHECK_OK(rs_reshard(A, C, &one, 0, 1 << 20));
  CHECK(rs_check_content(C) == 0, "consolidated content");
  CHECK(rs_exists(C) && access(C, F_OK) == 0, "consolidated exists");

  /* A corrupted source shard is refused, naming the file and dataset; no DST. */
  char step_dir[2400], E[2300];
  snprintf(step_dir, sizeof step_dir, "%s/step_7", A);
  snprintf(E, sizeof E, "%s/F-from-corrupt", root);
  CHECK_OK(corrupt(step_dir, "rank_1.h5", "/layers.00.attn.wq/exp_avg"));
  /* The piece digests refuse the file before HDF5 parses it, in the reshard and the audit
   * with or without --verify (2 problems: the file, and digests not computed). */
  CHECK(rs_reshard(A, E, &lb, 0, 1 << 20) != 0 && strstr(mc_errmsg(), "rank_1.h5") &&
            strstr(mc_errmsg(), "hash mismatch in piece"),
        "corruption message: %s", mc_errmsg());
  CHECK(!rs_exists(E), "reshard of a corrupted source left %s", E);
  for (int v = 0; v < 2; v++) {
    int pr = 0, nf = 0;
    free(rs_audit_digests(A, v, &pr, &nf));
    CHECK(pr == 2, "audit (verify %d) of the corrupted file: %d problems", v, pr);
  }
  /* Without file digests (an older manifest) the shard hash names the dataset. */
  CHECK(strip_file_hashes(A, 7) == 0, "strip the file hashes of %s", A);
  CHECK(rs_reshard(A, E, &lb, 0, 1 << 20) != 0 && strstr(mc_errmsg(), "rank_1.h5") &&
            strstr(mc_errmsg(), "/layers.00.attn.wq/exp_avg") && strstr(mc_errmsg(), "SHA-256"),
        "corruption message: %s", mc_errmsg());
  CHECK(!rs_exists(E), "reshard of a corrupted source left %s", E);
  /* mcaudit --verify lists it too. */
  int pr = 0, nf = 0;
  char(*d)[MC_N_STATES][65] = rs_audit_digests(A, 1, &pr, &nf);
  CHECK(pr == 1, "audit --verify of the corrupted checkpoint: %d problems", pr);
  free(d);
  d = rs_audit_digests(A, 0, &pr, &nf);
  CHECK(pr == 0, "audit without --verify does not check hashes (%d problems)", pr);
  free(d);
  mc_geometry_free(&ga);
}

int main(void) {
  rs_scratch("ckpt", root, sizeof root);
  mc_model m;
  rs_test_model(&m, "AEMRME");
  for (int k = 0; k < 4; k++) rs_pair_case(500 + 17 * (uint64_t)k, &m, "adamw:all", root, k, 40 + k, NULL);
  old_rule_case(&m, MC_OWN_CHUNKED, 1, 3, 1, 1, 1, 0); /* ZeRO parts differ (rows not a multiple of 3) */
  old_rule_case(&m, MC_OWN_CHUNKED, 2, 2, 1, 2, 0, 1); /* replicas: the primaries differ */
  old_rule_case(&m, MC_OWN_CHUNKED, 2, 2, 2, 4, 1, 2);
  /* format 2 "balanced": one expert a rank in expert-DP groups of 2 (balanced-v2 splits the
   * experts' dim 1), and of 4 with ZeRO 3 */
  old_rule_case(&m, MC_OWN_BALANCED, 2, 4, 1, 4, 1, 3);
  old_rule_case(&m, MC_OWN_BALANCED, 2, 4, 2, 2, 3, 4);
  failure_cases(&m);
  if (mc_check_failures == 0) rs_rm_rf(root);
  return mc_check_exit("test_reshard_ckpt");
}
