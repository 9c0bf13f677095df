/* mcreshard and mcaudit on a checkpoint with mixed optimizer groups (optim.groups
 * "muon:matrices,adamw:all": Muon's momentum for the 2-D projection matrices, AdamW's two
 * moments for the rest): for random pairs of layouts (TP, PP, DP, ZeRO, EP and stage-split
 * changes), A -> B -> A gives A's shards back byte for byte; B reads back the reference
 * content of every state kind each family has; the audit passes on both and its per-state
 * content digests (momentum included) agree between the layouts and equal the SHA-256 of the
 * reference tensors, while a kind a family's optimizer does not keep has neither shards nor a
 * digest. Also: a target geometry whose optimizer groups differ is refused naming the family,
 * and an export/import round trip keeps the groups (param digests kept, optimizer states zero). */
#define _POSIX_C_SOURCE 200809L
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/optim_groups.h"
#include "reshard/audit.h"
#include "reshard/export.h"
#include "reshard/reshard.h"
#include "rs_ckpt_testlib.h"
#include "rs_roundtrip.h"

static const char *const GROUPS = "muon:matrices,adamw:all";
static char root[2048];

/* SHA-256 hex of a family's state as a row-major fp32 tensor: of the reference content
 * (rs_value), or of zeros; AdamW's step as its 8 int64 bytes (rs_i64_value, or 0). */
static void reference_digest(const mc_family *f, int fam, int state, int zeros, char hex[65]) {
  if (mc_state_is_scalar((mc_state)state)) {
    const int64_t v = zeros ? 0 : rs_i64_value(fam);
    unsigned char h[32];
    unsigned int hl;
    EVP_Digest(&v, sizeof v, h, &hl, EVP_sha256(), NULL);
    mc_rs_hex(h, hex);
    return;
  }
  mc_box all = {f->ndim, {0, 0, 0}, {0, 0, 0}};
  for (int d = 0; d < f->ndim; d++) all.count[d] = f->shape[d];
  float *v = calloc((size_t)f->numel + 1, sizeof *v);
  if (!v) {
    hex[0] = 0;
    return;
  }
  if (!zeros) rs_pack(fam, state, f->shape, f->ndim, &all, v);
  unsigned char h[32];
  unsigned int hl;
  EVP_Digest(v, (size_t)f->numel * 4, h, &hl, EVP_sha256(), NULL);
  mc_rs_hex(h, hex);
  free(v);
}

/* The audit's digests of g's checkpoint: a digest for exactly the kinds each family has, equal
 * to the reference tensor's (zeros for the optimizer states when `zero_optim`); returns how
 * many momentum digests it checked. */
static int check_digests(const char *path, const mc_geometry *g, char (*d)[MC_N_STATES][65], int zero_optim) {
  int n_momentum = 0, wrong = 0;
  for (int f = 0; d && f < g->fams.n; f++)
    for (int s = 0; s < MC_N_STATES; s++) {
      const mc_family *fa = &g->fams.f[f];
      if (!mc_family_has_state(fa, (mc_state)s)) {
        CHECK(d[f][s][0] == 0, "%s: %s/%s has a digest though %s keeps no %s", path, fa->name, mc_state_name((mc_state)s),
              mc_opt_name(fa->opt), mc_state_name((mc_state)s));
        continue;
      }
      char want[65];
      reference_digest(fa, f, s, zero_optim && s != MC_STATE_PARAM, want);
      wrong += strcmp(d[f][s], want) != 0;
      n_momentum += s == MC_STATE_MOMENTUM;
    }
  CHECK(d && wrong == 0, "%s: %d digests differ from the reference tensors'", path, wrong);
  return n_momentum;
}

/* What the A -> B -> A case adds for mixed groups: B records the groups, holds no shard of a
 * kind its family lacks and some momentum, and its digests are the reference tensors'. */
static void groups_extra(const char *B, const mc_geometry *gb, char (*db)[MC_N_STATES][65]) {
  mc_rs_source *s = NULL;
  CHECK_OK(mc_rs_source_open(B, &s));
  if (s) {
    CHECK(!strcmp(mc_rs_source_config(s)->train.optim.groups, GROUPS), "%s records optim.groups '%s'", B,
          mc_rs_source_config(s)->train.optim.groups);
    mc_ckpt *ck = mc_rs_source_ckpt(s);
    int strays = 0, moms = 0;
    for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
      const mc_ckpt_shard *sh = mc_ckpt_shard_at(ck, i);
      int f = mc_family_find(&gb->fams, sh->family);
      strays += f < 0 || !mc_family_has_state(&gb->fams.f[f], sh->state);
      moms += sh->state == MC_STATE_MOMENTUM;
    }
    CHECK(strays == 0 && moms > 0, "%s: %d shards of kinds their family lacks, %d momentum shards", B, strays, moms);
    mc_rs_source_close(s);
  }
  CHECK(check_digests(B, gb, db, 0) > 0, "%s: no momentum digest checked", B);
}

/* A plan between geometries whose optimizers differ is refused, naming a family: a reshard
 * cannot turn moments into a momentum. */
static void optimizer_change_refused(const mc_model *m) {
  mc_geometry a, b;
  if (rs_random_geometry_groups(77, m, GROUPS, 4, &a) != 0) {
    CHECK(0, "layout: %s", mc_errmsg());
    return;
  }
  CHECK_OK(mc_geometry_build(m, &a.layout, NULL, -1, &b)); /* AdamW only */
  mc_rs_plan p;
  CHECK(mc_rs_plan_build(&a, &b, MC_RS_ALL_STATES, &p) != 0 && strstr(mc_errmsg(), "layers.00.attn.wq is trained by muon") &&
            strstr(mc_errmsg(), "by adamw in the target"),
        "optimizer change: %s", mc_errmsg());
  mc_geometry_free(&a);
  mc_geometry_free(&b);
}

/* Export to safetensors and import into another layout: the import's target has the exported
 * checkpoint's groups (its recorded config travels in the files' metadata), param digests
 * survive, and every optimizer state (moments and momentum) starts at zero. */
static void export_import(const mc_model *m) {
  mc_geometry ga, gb;
  if (rs_random_geometry_groups(91, m, GROUPS, 8, &ga) != 0) {
    CHECK(0, "layout: %s", mc_errmsg());
    return;
  }
  char A[2300], S[2300], B[2300];
  snprintf(A, sizeof A, "%s/X", root);
  snprintf(S, sizeof S, "%s/X.safetensors", root);
  snprintf(B, sizeof B, "%s/X-imported", root);
  CHECK_OK(rs_save_reference_groups(A, &ga, GROUPS, 5));
  mc_rs_source *src = NULL;
  CHECK_OK(mc_rs_source_open(A, &src));
  mc_rs_export_opts eo;
  mc_rs_export_opts_default(&eo);
  eo.names = MC_EXPORT_NAMES_MEGAC;
  FILE *quiet = fopen("/dev/null", "w");
  eo.out = quiet;
  mc_rs_opts o = {.chunk_bytes = 4096, .threads = 2};
  if (src) CHECK_OK(mc_rs_export(src, S, &eo, &o, NULL));
  mc_rs_source_close(src);
  if (quiet) fclose(quiet);
  mc_layout lb = {0};
  lb.tp = 2, lb.pp = 2, lb.dp = 2, lb.ep = 1, lb.zero = 1;
  CHECK_OK(mc_rs_import_safetensors(S, &lb, B, &o, NULL));
  CHECK_OK(mc_geometry_build(m, &lb, NULL, -1, &gb));
  CHECK_OK(mc_optim_groups_assign(GROUPS, &gb.fams));
  int pb = -1, nb = 0;
  char(*db)[MC_N_STATES][65] = rs_audit_digests(B, 1, &pb, &nb);
  CHECK(pb == 0 && nb == gb.fams.n, "audit of the import: %d problems", pb);
  CHECK(check_digests(B, &gb, db, 1) > 0, "the import has no momentum");
  free(db);
  mc_geometry_free(&ga);
  mc_geometry_free(&gb);
}

int main(void) {
  rs_scratch("groups", root, sizeof root);
  mc_model m;
  rs_test_model(&m, "AEMRME");
  for (int k = 0; k < 4; k++) rs_pair_case(700 + 31 * (uint64_t)k, &m, GROUPS, root, k, 20 + k, groups_extra);
  optimizer_change_refused(&m);
  export_import(&m);
  if (mc_check_failures == 0) rs_rm_rf(root);
  return mc_check_exit("test_reshard_groups");
}
