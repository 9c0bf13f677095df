/* The library's reads of a checkpoint whose states are stored in narrower element dtypes
 * (core/dtype.h): for random pairs of layouts, AdamW-only and mixed Muon groups, content saved
 * by the library in layout A is resharded by the engine into layout B with each state kind in
 * a dtype of its own (what mcreshard --state-dtype does). B is then read through mc_ckpt_read
 * with and without hash verification, whole families and random boxes (the load-time
 * resharding path of mctrain --resume: whole shards, and parts of shards placed at an offset
 * of the caller's buffer): every value is the exact widening of the stored element, i.e. the
 * conversion of A's value (core/dtype.h); the manifest declares the dtypes
 * (mc_ckpt_state_dtype); B -> A' in float32 again gives the same values. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "core/dtype.h"
#include "reshard/reshard.h"
#include "rs_ckpt_testlib.h"

static char root[2048];

/* Position-dependent content with 12 significant bits and exponents from 2^-16 to 2^15: every
 * narrow dtype rounds some of it, E4M3 saturates and flushes some, and a value read from the
 * wrong place is almost surely noticed. */
static float varied(int fam, int state, int64_t idx) {
  uint64_t h = (uint64_t)(idx + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(fam * 131 + state + 1) * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  float v = ldexpf((float)(1 + (h % 4095)), (int)((h >> 12) % 32) - 27);
  return (h >> 20) & 1 ? -v : v;
}

/* What a reader gets back for value v stored in dtype dt. */
static float stored_as(int dt, float v) {
  unsigned char b[4];
  float w;
  mc_elem_narrow(dt, &v, b, 1);
  mc_elem_widen(dt, b, &w, 1);
  return w;
}

/* Reads box (start, count) of every family and state of the checkpoint at path and counts
 * values that differ (bitwise) from the content stored in dt[state]; *n_read counts reads. */
static int64_t check_reads(const char *path, int verify, const int *dt, uint64_t seed, int *n_read) {
  mc_ckpt *ck;
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  o.verify = verify;
  if (mc_ckpt_open(path, &o, &ck) != 0) return -1;
  int64_t bad = 0;
  for (int f = 0; f < mc_ckpt_n_families(ck) && bad >= 0; f++) {
    const mc_ckpt_family *fam = mc_ckpt_family_at(ck, f);
    float *got = malloc((size_t)fam->numel * 4 + 4), *want = malloc((size_t)fam->numel * 4 + 4);
    for (int s = 0; s < MC_N_STATES && bad >= 0 && got && want; s++) {
      if (!mc_ckpt_family_has_state(ck, f, (mc_state)s)) continue;
      bad += mc_ckpt_state_dtype(ck, f, (mc_state)s) != dt[s];
      if (mc_state_is_scalar((mc_state)s)) { /* AdamW's step: int64, never converted */
        int64_t v = 0;
        if (mc_ckpt_read_i64(ck, fam->name, (mc_state)s, &v) != 0) bad = -1;
        else bad += v != rs_i64_value(f);
        continue;
      }
      for (int k = 0; k < 3 && bad >= 0; k++) {
        /* k = 0: the whole family; then random boxes */
        mc_box b = {fam->ndim, {0, 0, 0}, {0, 0, 0}};
        for (int d = 0; d < fam->ndim; d++) {
          b.count[d] = k == 0 ? fam->shape[d] : 1 + rs_pick(seed, (int)fam->shape[d]);
          b.start[d] = k == 0 ? 0 : rs_pick(seed, (int)(fam->shape[d] - b.count[d] + 1));
        }
        if (mc_ckpt_read(ck, fam->name, (mc_state)s, b.start, b.count, got) != 0) {
          bad = -1;
          break;
        }
        rs_pack_values(varied, f, s, fam->shape, fam->ndim, &b, want);
        for (int64_t i = 0; i < mc_box_numel(&b); i++) {
          float w = stored_as(dt[s], want[i]);
          bad += memcmp(&got[i], &w, 4) != 0;
        }
        (*n_read)++;
      }
    }
    free(got);
    free(want);
  }
  mc_ckpt_close(ck);
  return bad;
}

static void one_case(uint64_t seed, const mc_model *m, const char *groups, int k) {
  mc_geometry ga, gb;
  if (rs_random_geometry_groups(seed, m, groups, 8, &ga) != 0 || rs_random_geometry_groups(seed + 1, m, groups, 8, &gb) != 0) {
    CHECK(0, "layouts: %s", mc_errmsg());
    return;
  }
  char A[2300], B[2300], C[2300];
  snprintf(A, sizeof A, "%s/A%d", root, k);
  snprintf(B, sizeof B, "%s/B%d", root, k);
  snprintf(C, sizeof C, "%s/C%d", root, k);
  CHECK_OK(rs_save_values(A, &ga, groups, 4, varied));
  int dt[MC_N_STATES];
  /* the float formats only: int64 (step) is never converted (core/dtype.h) */
  for (int s = 0; s < MC_N_STATES; s++) dt[s] = mc_state_is_scalar((mc_state)s) ? MC_ELEM_I64 : (int)((seed + (uint64_t)s * 3) % MC_ELEM_I64);
  dt[k % MC_STATE_STEP] = MC_ELEM_BF16; /* some bfloat16 in every case, a committed HDF5 type (a float kind) */
  mc_rs_opts o = {.chunk_bytes = 4096, .threads = 2};
  mc_rs_summary sum;
  mc_rs_source *src = NULL;
  mc_geometry dg;
  mc_rs_plan plan;
  CHECK_OK(mc_rs_source_open(A, &src));
  if (src && mc_rs_prepare(src, &gb.layout, &dg, &plan) == 0) {
    for (int t = 0; t < plan.n_tensors; t++) plan.tensors[t].dtype = dt[plan.tensors[t].state];
    CHECK_OK(mc_rs_write(src, &dg, &plan, B, &o, &sum));
    mc_rs_plan_free(&plan);
    mc_geometry_free(&dg);
  } else {
    CHECK(0, "prepare: %s", mc_errmsg());
  }
  mc_rs_source_close(src);
  int n = 0;
  for (int verify = 0; verify <= 1; verify++) {
    int64_t bad = check_reads(B, verify, dt, seed, &n);
    CHECK(bad == 0, "case %d (%s), verify %d: %lld values differ from the stored conversion (-1: %s)", k, groups, verify,
          (long long)bad, bad < 0 ? mc_errmsg() : "");
  }
  CHECK(n > 0, "case %d: nothing read", k);
  /* back to layout A in float32: the widened values, exactly */
  src = NULL;
  CHECK_OK(mc_rs_source_open(B, &src));
  if (src && mc_rs_prepare(src, &ga.layout, &dg, &plan) == 0) {
    for (int t = 0; t < plan.n_tensors; t++) /* AdamW's step stays int64 */
      if (!mc_state_is_scalar(plan.tensors[t].state)) plan.tensors[t].dtype = MC_ELEM_F32;
    CHECK_OK(mc_rs_write(src, &dg, &plan, C, &o, &sum));
    mc_rs_plan_free(&plan);
    mc_geometry_free(&dg);
  }
  mc_rs_source_close(src);
  /* C holds float32: every tensor equal to B's as B's reads widen it */
  mc_ckpt *cb = NULL, *cc = NULL;
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  int64_t diff = 0;
  if (mc_ckpt_open(B, &oo, &cb) == 0 && mc_ckpt_open(C, &oo, &cc) == 0) {
    for (int f = 0; f < mc_ckpt_n_families(cb) && diff >= 0; f++) {
      const mc_ckpt_family *fam = mc_ckpt_family_at(cb, f);
      float *x = malloc((size_t)fam->numel * 4 + 4), *y = malloc((size_t)fam->numel * 4 + 4);
      int64_t z[3] = {0, 0, 0};
      for (int s = 0; s < MC_N_STATES && x && y; s++) {
        if (!mc_ckpt_family_has_state(cb, f, (mc_state)s)) continue;
        if (mc_state_is_scalar((mc_state)s)) { /* AdamW's step: int64 in both, the same value */
          int64_t vb = 0, vc = 1;
          diff += mc_ckpt_state_dtype(cc, f, (mc_state)s) != MC_ELEM_I64 || mc_ckpt_read_i64(cb, fam->name, (mc_state)s, &vb) ||
                  mc_ckpt_read_i64(cc, fam->name, (mc_state)s, &vc) || vb != vc;
          continue;
        }
        diff += mc_ckpt_state_dtype(cc, f, (mc_state)s) != MC_ELEM_F32;
        if (mc_ckpt_read(cb, fam->name, (mc_state)s, z, fam->shape, x) != 0 ||
            mc_ckpt_read(cc, fam->name, (mc_state)s, z, fam->shape, y) != 0) {
          diff = -1;
          break;
        }
        diff += memcmp(x, y, (size_t)fam->numel * 4) != 0;
      }
      free(x);
      free(y);
    }
  } else {
    diff = -1;
  }
  CHECK(diff == 0, "case %d: widening to float32 in another layout is not exact (%lld; %s)", k, (long long)diff,
        diff < 0 ? mc_errmsg() : "");
  mc_ckpt_close(cb);
  mc_ckpt_close(cc);
  mc_geometry_free(&ga);
  mc_geometry_free(&gb);
}

int main(void) {
  rs_scratch("dtype_read", root, sizeof root);
  mc_model m;
  rs_test_model(&m, "AEMRME");
  for (int k = 0; k < 6; k++)
    one_case(900 + 17 * (uint64_t)k, &m, k % 2 ? "muon:matrices,adamw:all" : "adamw:all", k);
  if (mc_check_failures == 0) rs_rm_rf(root);
  return mc_check_exit("test_reshard_dtype_read");
}
