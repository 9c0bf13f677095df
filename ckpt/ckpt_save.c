/* Saving: every process writes the rank files of the shards it is primary for into
 * <dir>/step_<N>.tmp; after a barrier the root reads their attributes back, writes the
 * manifest and commits by rename (docs/checkpoint.md, "Commit protocol"). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "core/dtype.h"
#include "util/error.h"

void mc_ckpt_save_opts_default(mc_ckpt_save_opts *o) {
  memset(o, 0, sizeof *o);
  o->keep = 0;
  o->io_threads = 2;
  o->root = 1;
}

static int solo_barrier(void *user, int ok) {
  (void)user;
  return ok;
}

/* ---------------------------------------------------------------- the shards to write */

typedef struct {
  int n;
  mc_shard_attrs *attrs;
  const void **data;
} write_set;

typedef struct {
  int rank, family, state, index;
} item_key;

static int item_order(const void *a, const void *b) {
  const item_key *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  if (x->family != y->family) return x->family - y->family;
  return x->state - y->state;
}

static void write_set_free(write_set *w) {
  if (w->attrs)
    for (int i = 0; i < w->n; i++) free(w->attrs[i].replica_buf);
  free(w->attrs);
  free(w->data);
  memset(w, 0, sizeof *w);
}

/* The attributes of the shard `sh` (mc_shard_of's answer) of family/state that `rank` writes,
 * all but the replica group and the hash. */
static void fill_attrs(const mc_geometry *g, int family, mc_state state, int rank, const mc_shard *sh, mc_shard_attrs *a) {
  const mc_family *fam = &g->fams.f[family];
  mc_ckpt_shard *s = &a->s;
  snprintf(s->file, sizeof s->file, "rank_%d.h5", rank);
  snprintf(s->dataset, sizeof s->dataset, "/%s/%s", fam->name, mc_state_name(state));
  snprintf(s->family, sizeof s->family, "%s", fam->name);
  s->family_index = family;
  /* a save writes the trainer's states as it holds them: fp32, int64 counters */
  s->dtype = mc_opt_state_dtype(fam->opt, state);
  s->state = state;
  s->ndim = sh->ndim;
  mc_state_shape(fam->ndim, fam->shape, state, a->global_shape);
  for (int d = 0; d < sh->ndim; d++) {
    s->start[d] = sh->start[d];
    s->count[d] = sh->count[d];
  }
  s->numel = sh->numel;
  s->rank = rank;
  s->stage = sh->stage;
  s->opt = fam->opt;
  if (mc_state_is_scalar(state)) snprintf(a->placement_rule, sizeof a->placement_rule, "replicated");
  else mc_placement_rule(g, family, a->placement_rule, sizeof a->placement_rule);
}

/* Keeps the items this process is primary for, ordered by rank, family, state, and fills
 * in every attribute but the hash. */
static int build_write_set(const mc_geometry *g, const mc_ckpt_item *items, int n_items, write_set *w) {
  memset(w, 0, sizeof *w);
  item_key *order = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *order);
  w->attrs = calloc((size_t)(n_items > 0 ? n_items : 1), sizeof *w->attrs);
  w->data = calloc((size_t)(n_items > 0 ? n_items : 1), sizeof *w->data);
  if (!order || !w->attrs || !w->data) {
    free(order);
    write_set_free(w);
    return mc_error("out of memory preparing %d checkpoint items", n_items);
  }
  for (int i = 0; i < n_items; i++) {
    const mc_ckpt_item *it = &items[i];
    if (it->family < 0 || it->family >= g->fams.n)
      return free(order), write_set_free(w), mc_error("checkpoint item %d: family index %d out of range [0, %d)", i, it->family, g->fams.n);
    if ((int)it->state < 0 || it->state >= MC_N_STATES)
      return free(order), write_set_free(w), mc_error("checkpoint item %d (%s): unknown state kind %d", i, g->fams.f[it->family].name, (int)it->state);
    if (it->rank < 0 || it->rank >= g->world)
      return free(order), write_set_free(w), mc_error("checkpoint item %d (%s): rank %d outside world %d", i, g->fams.f[it->family].name, it->rank, g->world);
    if (mc_ckpt_item_state_check(g, it) != 0) return free(order), write_set_free(w), -1;
    order[i] = (item_key){it->rank, it->family, (int)it->state, i};
  }
  qsort(order, (size_t)n_items, sizeof *order, item_order);
  int rc = 0;
  for (int k = 0; k < n_items && rc == 0; k++) {
    const mc_ckpt_item *it = &items[order[k].index];
    const mc_family *fam = &g->fams.f[it->family];
    if (k > 0) {
      const mc_ckpt_item *prev = &items[order[k - 1].index];
      if (prev->rank == it->rank && prev->family == it->family && prev->state == it->state) {
        rc = mc_error("checkpoint items: %s/%s of rank %d given twice", fam->name, mc_state_name(it->state), it->rank);
        break;
      }
    }
    mc_shard sh;
    if (mc_shard_of(g, it->family, it->state, it->rank, &sh) != 0) {
      rc = mc_error_context("checkpoint item %s/%s of rank %d", fam->name, mc_state_name(it->state), it->rank);
      break;
    }
    if (!sh.held || !sh.primary) continue; /* replicas are written once, by the primary */
    if (!it->data) {
      rc = mc_error("checkpoint item %s/%s of rank %d has no data", fam->name, mc_state_name(it->state), it->rank);
      break;
    }
    mc_shard_attrs *a = &w->attrs[w->n];
    mc_ckpt_shard *s = &a->s;
    fill_attrs(g, it->family, it->state, it->rank, &sh, a);
    a->replica_buf = malloc((size_t)g->world * sizeof(int));
    if (!a->replica_buf) {
      rc = mc_error("out of memory");
      break;
    }
    s->n_replicas = mc_shard_replicas(g, it->family, it->state, it->rank, a->replica_buf);
    s->replicas = a->replica_buf;
    w->data[w->n] = it->data;
    w->n++;
  }
  free(order);
  if (rc) write_set_free(w);
  return rc;
}

/* Writes one rank file per rank of the write set into tmp (ckpt_pwrite.c), then makes each
 * durable. */
static int write_rank_files(const char *tmp, int64_t step, write_set *w, int threads, int deflate) {
  if (deflate < 0 || deflate > 9) return mc_error("checkpoint deflate level %d: expected 0 (none) to 9", deflate);
  if (mc_write_rank_files(tmp, step, w->attrs, w->data, w->n, threads, deflate) != 0) return -1;
  /* Every file is written; now wait until each is durable. */
  for (int b = 0; b < w->n;) {
    int e = b;
    while (e < w->n && w->attrs[e].s.rank == w->attrs[b].s.rank) e++;
    char path[MC_PATH_MAX];
    if (mc_path_join(path, tmp, w->attrs[b].s.file) != 0) return -1;
    if (mc_ckpt_fault("fsync_file") || mc_fsync_path(path, 0)) return mc_error_context("%s: rank file not durable", path);
    b = e;
  }
  return 0;
}

/* ---------------------------------------------------------------- directory housekeeping */

static int parse_step_name(const char *name, const char *suffix, int64_t *step) {
  if (strncmp(name, "step_", 5) != 0) return 0;
  const char *p = name + 5;
  size_t nd = strspn(p, "0123456789");
  if (nd == 0 || nd > 18 || strcmp(p + nd, suffix) != 0) return 0;
  *step = strtoll(p, NULL, 10);
  return 1;
}

/* Removes what an interrupted save or prune left behind: step_*.tmp, step_*.trash, latest.tmp.
 * Only the root calls it, before any process starts writing. */
static int remove_leftovers(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return mc_error("%s: cannot list: %s", dir, strerror(errno));
  struct dirent *e;
  int rc = 0;
  int64_t s;
  while ((e = readdir(d)) != NULL) {
    if (parse_step_name(e->d_name, ".tmp", &s) || parse_step_name(e->d_name, ".trash", &s) ||
        strcmp(e->d_name, "latest.tmp") == 0) {
      char p[MC_PATH_MAX];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      if (mc_rmtree(p) != 0) rc = -1;
    }
  }
  closedir(d);
  return rc;
}

static int prepare(const char *dir, int64_t step, const char *tmp, const char *final) {
  if (mc_mkdir_p(dir) != 0) return -1;
  if (remove_leftovers(dir) != 0) return mc_error_context("%s: removing leftovers of an interrupted save", dir);
  if (mc_path_exists(final)) {
    /* Only the step `latest` names is protected; any other step_<N> was never committed
     * (a crash after its rename) or belongs to an abandoned branch of the run. */
    int64_t ls;
    char lp[64], sha[65];
    mc_error_clear();
    if (mc_latest_read(dir, &ls, lp, sizeof lp, sha) == 0 && ls == step)
      return mc_error("%s: step %" PRId64 " is the latest committed checkpoint; refusing to overwrite it", final, step);
    char trash[MC_PATH_MAX];
    snprintf(trash, sizeof trash, "%s/step_%" PRId64 ".trash", dir, step);
    if (rename(final, trash) != 0) return mc_error("%s: cannot replace uncommitted step: %s", final, strerror(errno));
    if (mc_rmtree(trash) != 0) return -1;
  }
  if (mc_ckpt_fault("prepare")) return mc_error_context("%s: creating", tmp);
  if (mc_mkdir_p(tmp) != 0) return -1;
  return 0;
}

/* ---------------------------------------------------------------- commit (root only) */

typedef struct {
  mc_shard_attrs *shards;
  int n_shards;
  mc_file_rec *files;
  int n_files;
} readback;

static void readback_free(readback *r) {
  mc_shard_attrs_free(r->shards, r->n_shards);
  for (int i = 0; i < r->n_files; i++) free(r->files[i].pieces);
  free(r->files);
  memset(r, 0, sizeof *r);
}

/* The piece digests of every rank file in tmp (format 5), the pieces of all files spread over
 * `threads` threads: the root reads back every rank's file, and a file hashed whole on one
 * thread cost its size at one core's SHA-256 speed. */
static int hash_files(const char *tmp, int threads, int64_t piece_bytes, readback *r) {
  mc_piece_file *pf = calloc((size_t)r->n_files, sizeof *pf);
  char(*paths)[MC_PATH_MAX] = malloc((size_t)r->n_files * MC_PATH_MAX);
  int rc = pf && paths ? 0 : mc_error("out of memory");
  for (int i = 0; i < r->n_files && rc == 0; i++) {
    rc = mc_path_join(paths[i], tmp, r->files[i].name);
    pf[i].path = paths[i];
    pf[i].piece_bytes = piece_bytes;
  }
  if (rc == 0) rc = mc_pieces_hash(pf, r->n_files, threads);
  for (int i = 0; i < r->n_files && rc == 0; i++) {
    mc_file_rec *f = &r->files[i];
    f->bytes = pf[i].bytes;
    f->piece_bytes = piece_bytes;
    f->n_pieces = pf[i].n_pieces;
    f->pieces = pf[i].pieces;
    mc_pieces_root((const char(*)[65])f->pieces, f->n_pieces, f->pieces_sha256);
  }
  free(pf);
  free(paths);
  return rc;
}

/* Collects the attributes and piece digests of every rank file in tmp (written by any process). */
static int read_back(const char *tmp, int threads, int64_t piece_bytes, readback *r) {
  memset(r, 0, sizeof *r);
  if (mc_ckpt_fault("read_back")) return mc_error_context("%s: reading rank files back", tmp);
  DIR *d = opendir(tmp);
  if (!d) return mc_error("%s: cannot list: %s", tmp, strerror(errno));
  struct dirent *e;
  int rc = 0, cap = 0;
  while ((e = readdir(d)) != NULL && rc == 0) {
    int rank = -1, used = 0;
    if (sscanf(e->d_name, "rank_%d.h5%n", &rank, &used) != 1 || used != (int)strlen(e->d_name) || rank < 0) continue;
    if (r->n_files == cap) {
      cap = cap ? 2 * cap : 16;
      mc_file_rec *nf = realloc(r->files, (size_t)cap * sizeof *nf);
      if (!nf) {
        rc = mc_error("out of memory");
        break;
      }
      r->files = nf;
    }
    mc_file_rec *f = &r->files[r->n_files++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", e->d_name);
    f->rank = rank;
  }
  closedir(d);
  if (rc == 0 && r->n_files > 0) rc = hash_files(tmp, threads, piece_bytes, r);
  for (int fi = 0; fi < r->n_files && rc == 0; fi++) {
    const mc_file_rec *f = &r->files[fi];
    char path[MC_PATH_MAX];
    mc_shard_attrs *sa = NULL;
    int ns = 0;
    if (mc_path_join(path, tmp, f->name) != 0 || mc_h5_scan_rank_file(path, f->name, &sa, &ns) != 0) {
      rc = -1;
      break;
    }
    mc_shard_attrs *all = realloc(r->shards, (size_t)(r->n_shards + ns + 1) * sizeof *all);
    if (!all) {
      mc_shard_attrs_free(sa, ns);
      rc = mc_error("out of memory");
      break;
    }
    r->shards = all;
    memcpy(r->shards + r->n_shards, sa, (size_t)ns * sizeof *sa);
    r->n_shards += ns;
    free(sa); /* the replica buffers moved into r->shards */
    for (int i = r->n_shards - ns; i < r->n_shards; i++)
      if (r->shards[i].s.rank != f->rank)
        rc = mc_error("%s: dataset %s has primary_rank %d but lies in the file of rank %d", path, r->shards[i].s.dataset,
                      r->shards[i].s.rank, f->rank);
  }
  if (rc) readback_free(r);
  return rc;
}

/* Builds the manifest of the shards and files in rb, writes it into tmp, renames tmp to final
 * and points `latest` at it. */
static int publish(const char *dir, const char *tmp, const char *final, const mc_geometry *g, const mc_config *cfg,
                   const mc_train_state *st, const readback *rb) {
  char *json = NULL;
  int rc = mc_manifest_build(g, cfg, st, rb->shards, rb->n_shards, rb->files, rb->n_files, &json);
  if (rc) return mc_error_context("checkpoint step %" PRId64, st->step);
  char path[MC_PATH_MAX], sha[65];
  if (mc_path_join(path, tmp, "manifest.json") != 0) return -1;
  size_t len = strlen(json);
  mc_sha256_hex(json, len, sha);
  rc = mc_write_file_durable(path, json, len, "write_manifest", "fsync_manifest");
  free(json);
  /* A second record of the root hash inside the step directory (sha256sum format) tells a
   * corrupt manifest apart from a wrong `latest`, and checks step directories opened alone. */
  char sumline[128];
  snprintf(sumline, sizeof sumline, "%s  manifest.json\n", sha);
  if (rc == 0 && mc_path_join(path, tmp, "manifest.sha256") == 0)
    rc = mc_write_file_durable(path, sumline, strlen(sumline), NULL, NULL);
  if (rc) return -1;
  if (mc_ckpt_fault("fsync_tmpdir") || mc_fsync_path(tmp, 1)) return mc_error_context("%s: directory not durable", tmp);
  if (mc_ckpt_fault("rename_dir")) return mc_error_context("%s: rename to %s failed", tmp, final);
  if (rename(tmp, final) != 0) return mc_error("%s: rename to %s failed: %s", tmp, final, strerror(errno));
  if (mc_ckpt_fault("fsync_parent") || mc_fsync_path(dir, 1)) return mc_error_context("%s: directory not durable", dir);
  char *latest = mc_latest_text(st->step, sha);
  char ltmp[MC_PATH_MAX], lpath[MC_PATH_MAX];
  snprintf(ltmp, sizeof ltmp, "%s/latest.tmp", dir);
  snprintf(lpath, sizeof lpath, "%s/latest", dir);
  rc = latest ? mc_write_file_durable(ltmp, latest, strlen(latest), "write_latest", "fsync_latest")
              : mc_error("out of memory writing latest");
  free(latest);
  if (rc) return -1;
  if (mc_ckpt_fault("rename_latest")) return mc_error_context("%s: rename to %s failed", ltmp, lpath);
  if (rename(ltmp, lpath) != 0) return mc_error("%s: rename to %s failed: %s", ltmp, lpath, strerror(errno));
  return 0;
}

static int commit(const char *dir, const char *tmp, const char *final, const mc_geometry *g, const mc_config *cfg,
                  const mc_train_state *st, int threads, int64_t piece_bytes) {
  readback rb;
  if (read_back(tmp, threads, piece_bytes, &rb) != 0) return -1;
  int rc = publish(dir, tmp, final, g, cfg, st, &rb);
  readback_free(&rb);
  return rc;
}

/* Undoes a failed commit: neither the temporary nor the renamed directory stays. */
static void discard(const char *dir, const char *tmp, const char *final, int renamed_ok) {
  char ltmp[MC_PATH_MAX];
  snprintf(ltmp, sizeof ltmp, "%s/latest.tmp", dir);
  char keep[MC_ERRMSG_MAX];
  snprintf(keep, sizeof keep, "%s", mc_errmsg());
  mc_rmtree(tmp);
  mc_rmtree(ltmp);
  if (renamed_ok) mc_rmtree(final);
  mc_error("%s", keep);
}

/* Keeps the newest `keep` committed steps, never the one `latest` names. Renames to .trash
 * first so a half-deleted directory never looks like a checkpoint. */
static int prune(const char *dir, int keep, int64_t latest_step) {
  if (keep <= 0) return 0;
  DIR *d = opendir(dir);
  if (!d) return mc_error("%s: cannot list: %s", dir, strerror(errno));
  int64_t *steps = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t s;
    if (!parse_step_name(e->d_name, "", &s)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *ns = realloc(steps, (size_t)cap * sizeof *ns);
      if (!ns) break;
      steps = ns;
    }
    steps[n++] = s;
  }
  closedir(d);
  /* ascending */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
      int64_t t = steps[j];
      steps[j] = steps[j - 1];
      steps[j - 1] = t;
    }
  int rc = 0, left = n;
  for (int i = 0; i < n && left > keep; i++) {
    if (steps[i] == latest_step) continue;
    char p[MC_PATH_MAX], t[MC_PATH_MAX];
    snprintf(p, sizeof p, "%s/step_%" PRId64, dir, steps[i]);
    snprintf(t, sizeof t, "%s/step_%" PRId64 ".trash", dir, steps[i]);
    if (rename(p, t) != 0 || mc_rmtree(t) != 0) rc = mc_error("%s: cannot remove old checkpoint: %s", p, strerror(errno));
    left--;
  }
  free(steps);
  return rc;
}

/* ---------------------------------------------------------------- save */

int mc_ckpt_save(const char *dir, const mc_geometry *g, const mc_config *cfg, const mc_train_state *state,
                 const mc_ckpt_item *items, int n_items, const mc_ckpt_save_opts *opts_in) {
  mc_ckpt_save_opts opts;
  if (opts_in) opts = *opts_in;
  else mc_ckpt_save_opts_default(&opts);
  mc_ckpt_barrier_fn barrier = opts.barrier ? opts.barrier : solo_barrier;
  int root = opts.barrier ? opts.root : 1;
  const uint32_t one = 1;
  char tmp[MC_PATH_MAX], final[MC_PATH_MAX];
  int bad = 0;
  if (!dir || !g || !cfg || !state || (n_items > 0 && !items)) bad = mc_error("mc_ckpt_save: missing argument");
  else if (*(const unsigned char *)&one != 1) bad = mc_error("checkpoints are written on little-endian hosts only");
  else if (state->step < 0) bad = mc_error("mc_ckpt_save: step %" PRId64 " is negative", state->step);
  else if (snprintf(tmp, sizeof tmp, "%s/step_%" PRId64 ".tmp", dir, state->step) >= (int)sizeof tmp ||
           snprintf(final, sizeof final, "%s/step_%" PRId64, dir, state->step) >= (int)sizeof final)
    bad = mc_error("checkpoint directory path too long: %s", dir);
  else if (opts.piece_bytes != 0 && !mc_piece_bytes_check(opts.piece_bytes))
    bad = mc_error("mc_ckpt_save: piece_bytes %" PRId64 " is not a multiple of 4096 from 4096 to %" PRId64,
                   opts.piece_bytes, (int64_t)MC_PIECE_BYTES_MAX);
  if (bad) {
    /* The other processes wait in the first barrier: fail it for everyone. */
    char keep[MC_ERRMSG_MAX];
    snprintf(keep, sizeof keep, "%s", mc_errmsg());
    barrier(opts.barrier_user, 0);
    return mc_error("%s", keep);
  }

  /* 1. validate locally; the root prepares the temporary directory */
  write_set w;
  int ok = build_write_set(g, items, n_items, &w) == 0;
  char err[MC_ERRMSG_MAX] = "";
  int prepared = 0;
  if (ok && root) {
    ok = prepare(dir, state->step, tmp, final) == 0;
    prepared = ok;
  }
  if (!ok) snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): %s", state->step, mc_errmsg());
  if (!barrier(opts.barrier_user, ok)) {
    if (ok) snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): save aborted because another process failed", state->step);
    if (prepared) mc_rmtree(tmp);
    write_set_free(&w);
    return mc_error("%s", err);
  }

  /* 2. every process writes and fsyncs its rank files */
  const int threads = opts.io_threads > 0 ? opts.io_threads : 1; /* writing, hashing, the commit's read-back */
  const int64_t piece_bytes = opts.piece_bytes ? opts.piece_bytes : MC_CKPT_PIECE_BYTES;
  ok = write_rank_files(tmp, state->step, &w, threads, opts.deflate) == 0;
  if (ok && opts.write_files) ok = opts.write_files(opts.write_files_user, tmp) == 0;
  if (!ok) snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): %s", state->step, mc_errmsg());
  write_set_free(&w);
  if (!barrier(opts.barrier_user, ok)) {
    if (ok) snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): save aborted because another process failed", state->step);
    if (root) mc_rmtree(tmp);
    return mc_error("%s", err);
  }

  /* 3. the root builds the manifest from what is on disk and commits */
  ok = 1;
  if (root && commit(dir, tmp, final, g, cfg, state, threads, piece_bytes) != 0) {
    ok = 0;
    discard(dir, tmp, final, mc_path_exists(final));
    snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): %s", state->step,
             mc_errmsg());
  }
  if (!barrier(opts.barrier_user, ok)) {
    if (ok && root)
      snprintf(err, sizeof err, "checkpoint step %" PRId64 " committed, but the barrier after the commit failed", state->step);
    else if (ok)
      snprintf(err, sizeof err, "checkpoint step %" PRId64 " not committed (previous checkpoint kept): the root process failed", state->step);
    return mc_error("%s", err);
  }
  if (root) {
    /* After the commit: a failure here leaves a valid newest checkpoint, so it only warns. */
    if (mc_fsync_path(dir, 1) != 0 || prune(dir, opts.keep, state->step) != 0)
      fprintf(stderr, "warning: checkpoint step %" PRId64 " committed, but: %s\n", state->step, mc_errmsg());
  }
  return 0;
}

/* ---------------------------------------------------------------- metadata only */

/* Appends the primary shards of family f, state st (every rank of its stage) to rb, with
 * their replica groups: the ranks whose hyperslab names the same primary (mc_shard_of), one
 * pass over the stage. bytes[r] += the bytes rank r writes. */
static int add_primaries(const mc_geometry *g, int f, mc_state st, readback *rb, int *cap, int64_t *bytes,
                         mc_shard *sh, int *nrep) {
  const int per = g->layout.tp * g->layout.dp, base = per * mc_family_stage(g, f);
  for (int i = 0; i < per; i++) {
    if (mc_shard_of(g, f, st, base + i, &sh[i]) != 0) return -1;
    nrep[i] = 0;
  }
  for (int i = 0; i < per; i++)
    if (sh[i].held) nrep[sh[i].primary_rank - base]++;
  for (int i = 0; i < per; i++) {
    if (!sh[i].held || !sh[i].primary) continue;
    if (rb->n_shards == *cap) {
      int nc = *cap ? 2 * *cap : 1024;
      mc_shard_attrs *na = realloc(rb->shards, (size_t)nc * sizeof *na);
      if (!na) return mc_error("out of memory");
      rb->shards = na, *cap = nc;
    }
    mc_shard_attrs *a = &rb->shards[rb->n_shards];
    memset(a, 0, sizeof *a);
    fill_attrs(g, f, st, base + i, &sh[i], a);
    memset(a->s.sha256, '0', 64); /* no data: 64 zeros, no real digest */
    a->s.sha256[64] = 0;
    if (!(a->replica_buf = malloc((size_t)nrep[i] * sizeof(int)))) return mc_error("out of memory");
    rb->n_shards++;
    for (int k = 0; k < per; k++)
      if (sh[k].held && sh[k].primary_rank == base + i) a->replica_buf[a->s.n_replicas++] = base + k;
    a->s.replicas = a->replica_buf;
    bytes[base + i] += sh[i].numel * (int64_t)mc_elem_dtype_size(a->s.dtype);
  }
  return 0;
}

int mc_ckpt_write_metadata_only(const char *dir, const mc_geometry *g, const mc_config *cfg, const mc_train_state *st) {
  char tmp[MC_PATH_MAX], final[MC_PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s/step_%" PRId64 ".tmp", dir, st->step) >= (int)sizeof tmp ||
      snprintf(final, sizeof final, "%s/step_%" PRId64, dir, st->step) >= (int)sizeof final)
    return mc_error("checkpoint directory path too long: %s", dir);
  if (prepare(dir, st->step, tmp, final) != 0) return -1;
  readback rb = {0};
  int cap = 0, rc = 0, per = g->layout.tp * g->layout.dp;
  int64_t *bytes = calloc((size_t)g->world, sizeof *bytes);
  mc_shard *sh = malloc((size_t)per * sizeof *sh);
  int *nrep = malloc((size_t)per * sizeof *nrep);
  if (!bytes || !sh || !nrep) rc = mc_error("out of memory");
  for (int f = 0; f < g->fams.n && rc == 0; f++)
    for (int s = 0; s < MC_N_STATES && rc == 0; s++)
      if (mc_family_has_state(&g->fams.f[f], (mc_state)s)) rc = add_primaries(g, f, (mc_state)s, &rb, &cap, bytes, sh, nrep);
  /* zeroed: no data, so no piece digests (piece_bytes 0: left out of the manifest) */
  if (rc == 0 && !(rb.files = calloc((size_t)g->world, sizeof *rb.files))) rc = mc_error("out of memory");
  for (int r = 0; r < g->world && rc == 0; r++) {
    if (!bytes[r]) continue;
    mc_file_rec *fr = &rb.files[rb.n_files++];
    snprintf(fr->name, sizeof fr->name, "rank_%d.h5", r);
    fr->rank = r;
    fr->bytes = bytes[r];
  }
  if (rc == 0) rc = publish(dir, tmp, final, g, cfg, st, &rb);
  if (rc) discard(dir, tmp, final, mc_path_exists(final));
  free(bytes);
  free(sh);
  free(nrep);
  readback_free(&rb);
  return rc;
}
