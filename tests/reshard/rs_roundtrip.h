/* The round trips of the reshard tests: a reshard through the engine (mcreshard's code path),
 * the audit's content digests, the byte-identity check of two checkpoints' shards, and the
 * A -> B -> A case over a random pair of layouts.
 * Header-only, like the other test helpers; CHECK from tests/check.h. */
#ifndef MC_TESTS_RESHARD_RS_ROUNDTRIP_H
#define MC_TESTS_RESHARD_RS_ROUNDTRIP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "rs_ckpt_testlib.h"
#include "ckpt/checkpoint.h"
#include "reshard/audit.h"
#include "reshard/reshard.h"

static inline int rs_reshard(const char *src, const char *dst, const mc_layout *target, int force, int64_t chunk) {
  mc_rs_source *s;
  if (mc_rs_source_open(src, &s) != 0) return -1;
  mc_geometry g;
  mc_rs_plan p;
  int rc = mc_rs_prepare(s, target, &g, &p);
  if (rc == 0) {
    mc_rs_opts o = {.chunk_bytes = chunk, .threads = 2, .force = force};
    rc = mc_rs_write(s, &g, &p, dst, &o, NULL);
    mc_rs_plan_free(&p);
    mc_geometry_free(&g);
  }
  mc_rs_source_close(s);
  return rc;
}

/* Runs the audit; returns its digests (caller frees) or NULL; *problems gets the count. */
static inline char (*rs_audit_digests(const char *path, int verify, int *problems, int *n_fams))[MC_N_STATES][65] {
  mc_rs_source *s;
  *problems = -1;
  if (mc_rs_source_open(path, &s) != 0) return NULL;
  mc_audit a;
  char(*d)[MC_N_STATES][65] = NULL;
  if (mc_audit_run(s, verify, 0, &a) == 0) {
    *problems = a.problems.n;
    for (int i = 0; i < a.problems.n && i < 3; i++) fprintf(stderr, "  audit %s: %s\n", path, a.problems.msg[i]);
    *n_fams = a.n_fams;
    d = malloc((size_t)a.n_fams * sizeof *d);
    memcpy(d, a.digest, (size_t)a.n_fams * sizeof *d);
    mc_audit_free(&a);
  }
  mc_rs_source_close(s);
  return d;
}

/* Same shards (rank, hyperslab, file, dataset, hash) and same stored bytes, same state. */
static inline void rs_check_same_shards(const char *a_path, const char *b_path) {
  mc_ckpt *a, *b;
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  if (mc_ckpt_open(a_path, &o, &a) != 0 || mc_ckpt_open(b_path, &o, &b) != 0) {
    CHECK(0, "open: %s", mc_errmsg());
    return;
  }
  CHECK(mc_ckpt_n_shards(a) == mc_ckpt_n_shards(b), "shard counts %d vs %d", mc_ckpt_n_shards(a), mc_ckpt_n_shards(b));
  int differ = 0;
  for (int i = 0; i < mc_ckpt_n_shards(a); i++) {
    const mc_ckpt_shard *x = mc_ckpt_shard_at(a, i);
    const mc_ckpt_shard *y = NULL;
    for (int k = 0; k < mc_ckpt_n_shards(b) && !y; k++) {
      const mc_ckpt_shard *c = mc_ckpt_shard_at(b, k);
      if (!strcmp(c->family, x->family) && c->state == x->state && c->rank == x->rank) y = c;
    }
    if (!y || strcmp(x->sha256, y->sha256) || strcmp(x->file, y->file) || strcmp(x->dataset, y->dataset) ||
        memcmp(x->start, y->start, sizeof x->start) || memcmp(x->count, y->count, sizeof x->count) ||
        x->n_replicas != y->n_replicas) {
      differ++;
      continue;
    }
    if (x->dtype == MC_ELEM_I64) { /* AdamW's step */
      int64_t va = 0, vb = 1;
      differ += mc_ckpt_read_i64(a, x->family, x->state, &va) || mc_ckpt_read_i64(b, y->family, y->state, &vb) || va != vb;
      continue;
    }
    float *da = malloc((size_t)x->numel * 4), *db = malloc((size_t)y->numel * 4);
    if (mc_ckpt_read(a, x->family, x->state, x->start, x->count, da) || mc_ckpt_read(b, y->family, y->state, y->start, y->count, db) ||
        memcmp(da, db, (size_t)x->numel * 4))
      differ++;
    free(da);
    free(db);
  }
  CHECK(differ == 0, "%d shards of %s differ from %s", differ, b_path, a_path);
  mc_train_state sa, sb;
  CHECK_OK(mc_ckpt_train_state(a, &sa));
  CHECK_OK(mc_ckpt_train_state(b, &sb));
  CHECK(memcmp(&sa, &sb, sizeof sa) == 0, "training state not carried over unchanged");
  mc_ckpt_close(a);
  mc_ckpt_close(b);
}

/* Checks a test adds to the A -> B -> A case: B's path, geometry and audit digests. */
typedef void (*rs_pair_extra)(const char *b_path, const mc_geometry *gb, char (*db)[MC_N_STATES][65]);

/* A random pair of layouts (families' optimizers from `groups`) under root/A<k> and root/B<k>:
 * the reference content saved in A (step `step`), A -> B read back with the reference content,
 * B -> A giving A's shards byte for byte, both audits clean (with --verify) and their content
 * digests equal; then `extra` (may be NULL). */
static inline void rs_pair_case(uint64_t seed, const mc_model *m, const char *groups, const char *root, int k, int64_t step,
                                rs_pair_extra extra) {
  mc_geometry ga, gb;
  if (rs_random_geometry_groups(seed, m, groups, 8, &ga) || rs_random_geometry_groups(seed + 1, m, groups, 8, &gb)) {
    CHECK(0, "random layouts: %s", mc_errmsg());
    return;
  }
  char A[2300], B[2300], A2[2300];
  snprintf(A, sizeof A, "%s/A%d", root, k);
  snprintf(B, sizeof B, "%s/B%d", root, k);
  snprintf(A2, sizeof A2, "%s/A%d-back", root, k);
  CHECK_OK(rs_save_reference_groups(A, &ga, groups, step));
  int64_t chunk = 256 * (1 + rs_pick(seed, 64)); /* small bands: many partial pieces */
  CHECK_OK(rs_reshard(A, B, &gb.layout, 0, chunk));
  CHECK(rs_check_content(B) == 0, "content of %s read back through the library differs", B);
  CHECK_OK(rs_reshard(B, A2, &ga.layout, 0, chunk * 3));
  rs_check_same_shards(A, A2);
  int pa, pb, na = 0, nb = 0;
  char(*da)[MC_N_STATES][65] = rs_audit_digests(A, 1, &pa, &na);
  char(*db)[MC_N_STATES][65] = rs_audit_digests(B, 1, &pb, &nb);
  CHECK(pa == 0 && pb == 0, "audit problems: %d in A, %d in B", pa, pb);
  CHECK(da && db && na == nb && memcmp(da, db, (size_t)na * sizeof *da) == 0, "content digests differ between %s and %s", A, B);
  if (extra) extra(B, &gb, db);
  printf("  pair %d (%s): tp%d pp%d dp%d ep%d z%d %s -> tp%d pp%d dp%d ep%d z%d %s -> back\n", k, groups, ga.layout.tp,
         ga.layout.pp, ga.layout.dp, ga.layout.ep, ga.layout.zero, mc_split_name(ga.layout.split), gb.layout.tp,
         gb.layout.pp, gb.layout.dp, gb.layout.ep, gb.layout.zero, mc_split_name(gb.layout.split));
  free(da);
  free(db);
  mc_geometry_free(&ga);
  mc_geometry_free(&gb);
}

#endif
