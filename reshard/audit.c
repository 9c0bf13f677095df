#define _POSIX_C_SOURCE 200809L
#include "reshard/audit.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/format.h"
#include "core/dtype.h"
#include "core/holdings.h"
#include "core/optim_groups.h"
#include "reshard/execute.h"
#include "reshard/reshard.h"

int mc_audit_tiling(const char *what, int ndim, const int64_t *shape, const mc_box *s, const int *ranks, int n,
                    mc_errlist *errs) {
  int before = errs->n;
  char b1[128], b2[128];
  int64_t numel = 1, sum = 0;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  for (int i = 0; i < n; i++) {
    mc_box_format(&s[i], b1, sizeof b1);
    int ok = s[i].ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
      ok = s[i].start[d] >= 0 && s[i].count[d] >= 0 && s[i].start[d] + s[i].count[d] <= shape[d];
    if (!ok) {
      mc_errlist_add(errs, "%s: shard of rank %d %s lies outside the global shape", what, ranks[i], b1);
      continue;
    }
    sum += mc_box_numel(&s[i]);
    for (int j = i + 1; j < n; j++) {
      mc_box x;
      if (mc_box_intersect(&s[i], &s[j], &x) > 0) {
        mc_box_format(&s[j], b2, sizeof b2);
        mc_errlist_add(errs, "%s: shards of rank %d %s and rank %d %s overlap", what, ranks[i], b1, ranks[j], b2);
      }
    }
  }
  /* In bounds and disjoint: they tile exactly iff their sizes add up. */
  if (errs->n == before && sum != numel)
    mc_errlist_add(errs, "%s: the primaries cover %lld of %lld elements (a gap)", what, (long long)sum, (long long)numel);
  return errs->n - before;
}

/* ---------------------------------------------------------------- streaming digests */

typedef struct {
  mc_rs_source *src;
  int verify;
  pthread_mutex_t lock;
  mc_errlist *problems;
  char (*hex)[65]; /* per target */
} digest_ctx;

static int null_write(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const void *data) {
  (void)ctx, (void)p, (void)t, (void)off, (void)n, (void)data;
  return 0;
}

static int digest_done(void *ctx, const mc_rs_plan *p, int t, const unsigned char sha[32]) {
  digest_ctx *d = ((mc_rs_io_ctx *)ctx)->sink;
  (void)p;
  mc_rs_hex(sha, d->hex[t]);
  return 0;
}

/* Records a bad hash as a problem and carries on, so every bad shard gets listed. */
static int verify_done(void *ctx, const mc_rs_plan *p, int s, const unsigned char sha[32]) {
  digest_ctx *d = ((mc_rs_io_ctx *)ctx)->sink;
  if (!d->verify) return 0;
  if (mc_rs_source_done(ctx, p, s, sha) != 0) {
    pthread_mutex_lock(&d->lock);
    mc_errlist_add(d->problems, "%s", mc_errmsg());
    pthread_mutex_unlock(&d->lock);
  }
  return 0;
}

static int run_digests(mc_rs_source *src, int verify, int progress, mc_audit *a) {
  const mc_geometry *sg = mc_rs_source_geometry(src);
  mc_layout l;
  mc_rs_consolidated_layout(&l);
  mc_geometry cg; /* with the recorded optimizer groups: the same state kinds per family */
  if (mc_geometry_of_config(mc_rs_source_config(src), &l, &cg) != 0) return mc_error_context("the world-size-1 layout");
  mc_rs_plan plan;
  if (mc_rs_plan_build(sg, &cg, a->states, &plan) != 0) {
    mc_geometry_free(&cg);
    return -1;
  }
  /* The digest is over the stored bytes: each tensor in its own dtype on both sides. */
  mc_rs_source_dtypes(src, &plan);
  for (int t = 0; t < plan.n_tensors; t++) plan.tensors[t].dtype = plan.tensors[t].src_dtype;
  int rc = mc_rs_source_bind(src, &plan);
  digest_ctx d = {src, verify, PTHREAD_MUTEX_INITIALIZER, &a->problems, NULL};
  d.hex = calloc((size_t)plan.n_targets + 1, sizeof *d.hex);
  if (rc == 0 && !d.hex) rc = mc_error("out of memory");
  if (rc == 0) {
    mc_rs_io_ctx ctx = {src, &d};
    mc_rs_io io = {&ctx, mc_rs_source_read, null_write, verify_done, digest_done};
    mc_rs_exec_opts eo = {0, 0, progress, verify ? "verify" : "digest"};
    mc_rs_exec_stats st;
    rc = mc_rs_execute(&plan, &cg, &io, &eo, &st);
    a->bytes_read = st.bytes_read;
    for (int t = 0; t < plan.n_targets && rc == 0; t++) {
      const mc_rs_tensor *tn = &plan.tensors[plan.targets[t].tensor];
      memcpy(a->digest[tn->fam][tn->state], d.hex[t], 65);
    }
  }
  free(d.hex);
  mc_rs_plan_free(&plan);
  mc_geometry_free(&cg);
  return rc;
}

/* ---------------------------------------------------------------- the checks */

static void check_manifest(mc_rs_source *src, mc_audit *a) {
  mc_ckpt *ck = mc_rs_source_ckpt(src);
  const mc_geometry *g = mc_rs_source_geometry(src);
  int ns = mc_ckpt_n_shards(ck);
  mc_box *slabs = malloc((size_t)(ns + 1) * sizeof *slabs);
  int *ranks = malloc((size_t)(ns + 1) * sizeof *ranks);
  int *reps = malloc((size_t)g->world * sizeof *reps);
  if (!slabs || !ranks || !reps) {
    mc_errlist_add(&a->problems, "out of memory auditing %d shards", ns);
    goto out;
  }
  int *idx = NULL;
  if (mc_rs_shard_index(ck, g, &idx) != 0) {
    mc_errlist_add(&a->problems, "%s", mc_errmsg());
    goto out;
  }
  for (int f = 0; f < g->fams.n; f++)
    for (int st = 0; st < MC_N_STATES; st++) {
      if (!(a->states & (1u << st)) || !mc_family_has_state(&g->fams.f[f], (mc_state)st)) continue;
      int n = 0;
      for (int r = 0; r < g->world; r++) {
        int k = idx[((size_t)f * MC_N_STATES + (size_t)st) * (size_t)g->world + (size_t)r];
        if (k < 0) continue;
        const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
        slabs[n] = mc_box_make(s->ndim, s->start, s->count);
        ranks[n++] = s->rank;
      }
      char what[MC_FAMILY_NAME_MAX + 16];
      snprintf(what, sizeof what, "%s/%s", g->fams.f[f].name, mc_state_name((mc_state)st));
      int64_t shape[MC_CKPT_MAX_DIM]; /* the state's: a scalar kind's is [1] */
      const int nd = mc_state_shape(g->fams.f[f].ndim, g->fams.f[f].shape, (mc_state)st, shape);
      mc_audit_tiling(what, nd, shape, slabs, ranks, n, &a->problems);
    }
  free(idx);
  /* Each stored shard is what mc_shard_of says its rank is primary for, and its HDF5
   * attributes say the same as the manifest. */
  int64_t fid = -1;
  char open_file[64] = "";
  /* The files' digests first (pieces, or whole files before format 5), in parallel; a failing
   * file is reported below, once. */
  mc_ckpt_check_files(ck);
  mc_error_clear();
  for (int i = 0; i < ns; i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    int f = mc_family_find(&g->fams, s->family);
    mc_shard want;
    if (f < 0 || s->rank < 0 || s->rank >= g->world || mc_shard_of(g, f, s->state, s->rank, &want) != 0) {
      mc_errlist_add(&a->problems, "%s: dataset %s: family or rank unknown to the layout", s->file, s->dataset);
      continue;
    }
    mc_box want_box = mc_box_make(want.ndim, want.start, want.count), got_box = mc_box_make(s->ndim, s->start, s->count);
    int same = want.primary && want.stage == s->stage && mc_box_equal(&want_box, &got_box);
    int nr = mc_shard_replicas(g, f, s->state, s->rank, reps);
    int same_reps = nr == s->n_replicas;
    for (int k = 0; same_reps && k < nr; k++) same_reps = reps[k] == s->replicas[k];
    if (!mc_family_has_state(&g->fams.f[f], s->state))
      mc_errlist_add(&a->problems, "%s: dataset %s: family %s is trained by %s, which keeps no %s state (optim.groups)",
                     s->file, s->dataset, s->family, mc_opt_name(g->fams.f[f].opt), mc_state_name(s->state));
    else if (!same)
      mc_errlist_add(&a->problems, "%s: dataset %s is not the hyperslab rank %d is primary for (mc_shard_of)", s->file,
                     s->dataset, s->rank);
    else if (!same_reps)
      mc_errlist_add(&a->problems, "%s: dataset %s: replica group differs from the layout's", s->file, s->dataset);
    if (strcmp(open_file, s->file) != 0) {
      if (fid >= 0) mc_h5_close(fid);
      fid = -1;
      char path[MC_PATH_MAX + 40];
      snprintf(path, sizeof path, "%s/%s", mc_ckpt_step_dir(ck), s->file);
      snprintf(open_file, sizeof open_file, "%s", s->file);
      /* Verify before parsing: a file failing its digest check is never opened. */
      if (mc_ckpt_check_file(ck, s->file) != 0) {
        if (!mc_errlist_has(&a->problems, path)) mc_errlist_add(&a->problems, "%s", mc_errmsg()); /* once a file */
      } else if (mc_h5_open_read(path, &fid) != 0) {
        mc_errlist_add(&a->problems, "%s", mc_errmsg());
      }
    }
    int64_t shape[MC_CKPT_MAX_DIM];
    mc_state_shape(g->fams.f[f].ndim, g->fams.f[f].shape, s->state, shape);
    if (fid >= 0 && mc_h5_check_attrs(fid, s->file, s, shape) != 0)
      mc_errlist_add(&a->problems, "%s", mc_errmsg());
    a->stored[s->rank] += s->numel * (int64_t)mc_elem_dtype_size(s->dtype);
    a->stored_fp32[s->rank] += s->numel * (int64_t)mc_elem_dtype_size(mc_opt_state_dtype(g->fams.f[f].opt, s->state));
  }
  if (fid >= 0) mc_h5_close(fid);
out:
  free(slabs);
  free(ranks);
  free(reps);
}

const mc_mem_cat mc_audit_cats[MC_AUDIT_N_CATS] = {MC_MEM_PARAMS_REPLICATED, MC_MEM_PARAMS_TP, MC_MEM_PARAMS_EP,
                                                   MC_MEM_MOMENTS_DECAY, MC_MEM_MOMENTS_NO_DECAY};

/* What each rank holds of the audited states (core/holdings.h), and the check that each rank
 * wrote exactly the states it is primary for. */
static void totals(const mc_geometry *g, mc_audit *a) {
  const mc_hold_opts o = {.moe_dense = 1}; /* the states do not depend on the training settings */
  for (int r = 0; r < g->world; r++) {
    int64_t primary = 0;
    for (int f = 0; f < g->fams.n; f++) {
      mc_param_hold h;
      if (mc_param_hold_of(g, f, r, &o, &h) != 0) {
        mc_errlist_add(&a->problems, "%s", mc_errmsg());
        return;
      }
      if (!h.in_stage) continue;
      for (int st = 0; st < MC_N_STATES; st++) {
        if (!(a->states & (1u << st))) continue;
        a->held[r * MC_N_STATES + st] += h.state_bytes[st];
        a->cat[r * MC_MEM_COUNT + h.state_cat[st]] += h.state_bytes[st];
        if (h.state_primary[st]) primary += h.state_bytes[st];
      }
    }
    if (a->stored_fp32[r] != primary)
      mc_errlist_add(&a->problems, "rank %d wrote %lld bytes of shards (at the trainer's dtypes); under the layout it is primary for %lld (core/holdings.h)",
                     r, (long long)a->stored_fp32[r], (long long)primary);
    for (int st = 0; st < MC_N_STATES; st++) a->optimizer[r] += a->held[r * MC_N_STATES + st];
  }
  /* balance: largest over mean of the optimizer state held and of the bytes written */
  double opt_sum = 0, opt_max = 0, st_sum = 0, st_max = 0;
  for (int r = 0; r < g->world; r++) {
    opt_sum += (double)a->optimizer[r];
    st_sum += (double)a->stored[r];
    if ((double)a->optimizer[r] > opt_max) opt_max = (double)a->optimizer[r], a->optimizer_largest_rank = r;
    if ((double)a->stored[r] > st_max) st_max = (double)a->stored[r];
  }
  a->optimizer_balance = opt_sum > 0 ? opt_max / (opt_sum / g->world) : 1.0;
  a->stored_balance = st_sum > 0 ? st_max / (st_sum / g->world) : 1.0;
}

int mc_audit_run(mc_rs_source *src, int verify, int progress, mc_audit *a) {
  memset(a, 0, sizeof *a);
  mc_errlist_init(&a->problems);
  const mc_geometry *g = mc_rs_source_geometry(src);
  a->world = g->world;
  a->n_fams = g->fams.n;
  a->states = mc_rs_source_states(src);
  a->digest = calloc((size_t)g->fams.n + 1, sizeof *a->digest);
  a->held = calloc((size_t)g->world * MC_N_STATES, sizeof *a->held);
  a->stored = calloc((size_t)g->world, sizeof *a->stored);
  a->stored_fp32 = calloc((size_t)g->world, sizeof *a->stored_fp32);
  a->cat = calloc((size_t)g->world * MC_MEM_COUNT, sizeof *a->cat);
  a->optimizer = calloc((size_t)g->world, sizeof *a->optimizer);
  if (!a->digest || !a->held || !a->stored || !a->stored_fp32 || !a->cat || !a->optimizer) {
    mc_audit_free(a);
    return mc_error("out of memory");
  }
  check_manifest(src, a);
  totals(g, a);
  if (a->problems.n) {
    mc_errlist_add(&a->problems, "content digests%s not computed: the shards do not match the layout",
                   verify ? " and hash verification" : "");
    return 0;
  }
  if (run_digests(src, verify, progress, a) != 0) {
    mc_errlist_add(&a->problems, "%s", mc_errmsg());
    return 0;
  }
  a->digests = 1;
  a->verified = verify;
  return 0;
}

void mc_audit_free(mc_audit *a) {
  free(a->digest);
  free(a->held);
  free(a->stored);
  free(a->stored_fp32);
  free(a->cat);
  free(a->optimizer);
  a->digest = NULL;
  a->held = a->stored = a->stored_fp32 = a->cat = a->optimizer = NULL;
}
