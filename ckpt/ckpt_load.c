/* Loading: open a checkpoint (via `latest` or a step directory), check the manifest against
 * the root hash and the format rules, and read any hyperslab assembled from the shards that
 * intersect it, hash-verifying each shard once per open. Nothing on disk is modified. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <unistd.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "core/box.h"
#include "core/dtype.h"
#include "util/error.h"

struct mc_ckpt {
  char step_dir[MC_PATH_MAX];
  char root_hash[65];
  char *manifest_text;
  mc_manifest m;
  mc_ckpt_open_opts opts;
  pthread_mutex_t mu; /* guards fids, fds, file_state and the byte counts */
  pthread_cond_t cv;  /* file_state changed */
  signed char *file_state; /* per manifest file: 0 unchecked, 1 being hashed, 2 verified, -1 failed */
  char **file_err;         /* per manifest file: the message of its failed check (malloc'd) */
  int64_t *fids;      /* per manifest file; -1 until opened */
  int *fds;           /* per manifest file, for raw preads; -1 until opened */
  int64_t *raw_off;   /* per shard: data offset for raw preads, -1 = through HDF5, -2 = unknown */
  unsigned char *checked;  /* per shard: attributes compared with the manifest */
  unsigned char *verified; /* per shard: hash verified */
  int *disk_order;         /* shard indices by (rank file, family, state): the order written */
  int64_t bytes_read, bytes_hashed; /* shard data since open (mc_ckpt_io_bytes) */
  int64_t bytes_checked;            /* rank-file bytes hashed against piece digests (mc_ckpt_checked_bytes) */
  int hash_threads;        /* threads for whole-file hashes (no HDF5 call: not clamped to 1) */
};

typedef struct {
  int rank, family, state, shard;
} order_key;

static int order_cmp(const void *a, const void *b) {
  const order_key *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  if (x->family != y->family) return x->family - y->family;
  return x->state - y->state;
}

void mc_ckpt_open_opts_default(mc_ckpt_open_opts *o) {
  o->verify = 1;
  o->io_threads = 2;
  o->metadata_only = 0;
}

static int is_dir_with(const char *dir, const char *name) {
  char p[MC_PATH_MAX];
  return mc_path_join(p, dir, name) == 0 && mc_path_exists(p);
}

/* Finds the step directory and the root hash to check (empty if none applies). */
static int resolve(const char *path, char *step_dir, char root[65]) {
  root[0] = 0;
  char name[64];
  int64_t step;
  if (is_dir_with(path, "latest")) {
    if (mc_latest_read(path, &step, name, sizeof name, root) != 0) return -1;
    if (mc_path_join(step_dir, path, name) != 0) return -1;
    if (!is_dir_with(step_dir, "manifest.json"))
      return mc_error("%s/latest points at %s, which does not exist or has no manifest.json", path, name);
    return 0;
  }
  if (!is_dir_with(path, "manifest.json"))
    return mc_error("%s: neither a checkpoint directory (no latest) nor a step directory (no manifest.json)", path);
  snprintf(step_dir, MC_PATH_MAX, "%s", path);
  /* A step directory named by its parent's `latest` is still checked against the root hash. */
  char parent[MC_PATH_MAX];
  snprintf(parent, sizeof parent, "%s", path);
  size_t n = strlen(parent);
  while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
  char *slash = strrchr(parent, '/');
  const char *base = slash ? slash + 1 : parent;
  char basecopy[MC_PATH_MAX];
  snprintf(basecopy, sizeof basecopy, "%s", base);
  if (slash) *slash = 0;
  else snprintf(parent, sizeof parent, ".");
  if (slash == parent) snprintf(parent, sizeof parent, "/");
  char sha[65];
  if (is_dir_with(parent, "latest") && mc_latest_read(parent, &step, name, sizeof name, sha) == 0 &&
      strcmp(name, basecopy) == 0)
    memcpy(root, sha, 65);
  mc_error_clear();
  return 0;
}

/* The manifest's hash against `latest` (expect, may be empty) and manifest.sha256. */
static int check_root_hash(const char *step_dir, const char *mpath, const char *actual, const char *expect) {
  char sp[MC_PATH_MAX], side[65] = "";
  char *text = NULL;
  if (mc_path_join(sp, step_dir, "manifest.sha256") == 0 && mc_path_exists(sp) && mc_read_file(sp, &text, NULL) == 0) {
    if (strlen(text) >= 64) {
      memcpy(side, text, 64);
      side[64] = 0;
    }
    free(text);
  }
  mc_error_clear();
  int side_ok = side[0] && strcmp(side, actual) == 0;
  if (expect[0] && strcmp(expect, actual) != 0) {
    if (side_ok)
      return mc_error("%s: wrong root hash in latest: it records %s, but manifest.json hashes to %s as its "
                      "manifest.sha256 confirms (latest was altered or belongs to another checkpoint)",
                      mpath, expect, actual);
    return mc_error("%s: root hash mismatch: manifest.json hashes to %s but latest records %s (the manifest is corrupt)",
                    mpath, actual, expect);
  }
  if (!expect[0] && side[0] && !side_ok)
    return mc_error("%s: root hash mismatch: manifest.json hashes to %s but manifest.sha256 records %s (the manifest is corrupt)",
                    mpath, actual, side);
  return 0;
}

int mc_ckpt_open(const char *path, const mc_ckpt_open_opts *opts, mc_ckpt **out) {
  *out = NULL;
  mc_ckpt *ck = calloc(1, sizeof *ck);
  if (!ck) return mc_error("out of memory opening %s", path);
  if (opts) ck->opts = *opts;
  else mc_ckpt_open_opts_default(&ck->opts);
  /* Reader threads call HDF5: one thread unless the library is a thread-safe build. */
  ck->hash_threads = ck->opts.io_threads > 1 ? ck->opts.io_threads : 2;
  if (ck->opts.io_threads < 1 || !mc_h5_threadsafe()) ck->opts.io_threads = 1;
  pthread_mutex_init(&ck->mu, NULL);
  pthread_cond_init(&ck->cv, NULL);
  char expect[65];
  if (resolve(path, ck->step_dir, expect) != 0) goto fail;
  char mpath[MC_PATH_MAX];
  if (mc_path_join(mpath, ck->step_dir, "manifest.json") != 0) goto fail;
  size_t len = 0;
  if (mc_read_file_max(mpath, MC_MANIFEST_MAX, &ck->manifest_text, &len) != 0) goto fail;
  mc_sha256_hex(ck->manifest_text, len, ck->root_hash);
  if (check_root_hash(ck->step_dir, mpath, ck->root_hash, expect) != 0) goto fail;
  if (mc_manifest_parse(ck->manifest_text, mpath, &ck->m) != 0) goto fail;
  int64_t ls;
  char lname[64], lsha[65];
  if (expect[0] && mc_latest_read(path, &ls, lname, sizeof lname, lsha) == 0 && ls != ck->m.step) {
    mc_error("%s: manifest step %" PRId64 " differs from latest's step %" PRId64, mpath, ck->m.step, ls);
    goto fail;
  }
  mc_error_clear();
  for (int i = 0; i < ck->m.n_files && !ck->opts.metadata_only; i++) {
    char fp[MC_PATH_MAX];
    int64_t size = 0;
    if (mc_path_join(fp, ck->step_dir, ck->m.files[i].name) != 0) goto fail;
    if (!mc_path_exists(fp)) {
      mc_error("%s: missing shard file (listed in the manifest)", fp);
      goto fail;
    }
    if (mc_file_size(fp, &size) != 0) goto fail;
    if (size != ck->m.files[i].bytes) {
      mc_error("%s: %" PRId64 " bytes but the manifest records %" PRId64 " (truncated or replaced)", fp, size,
               ck->m.files[i].bytes);
      goto fail;
    }
  }
  int nf = ck->m.n_files > 0 ? ck->m.n_files : 1, ns = ck->m.n_shards > 0 ? ck->m.n_shards : 1;
  ck->fids = malloc((size_t)nf * sizeof *ck->fids);
  ck->fds = malloc((size_t)nf * sizeof *ck->fds);
  ck->raw_off = malloc((size_t)ns * sizeof *ck->raw_off);
  ck->checked = calloc((size_t)ns, 1);
  ck->verified = calloc((size_t)ns, 1);
  ck->file_state = calloc((size_t)nf, 1);
  ck->file_err = calloc((size_t)nf, sizeof *ck->file_err);
  if (!ck->fids || !ck->fds || !ck->raw_off || !ck->checked || !ck->verified || !ck->file_state || !ck->file_err) {
    mc_error("out of memory opening %s", path);
    goto fail;
  }
  for (int i = 0; i < ck->m.n_files; i++) ck->fids[i] = -1, ck->fds[i] = -1;
  for (int i = 0; i < ck->m.n_shards; i++) ck->raw_off[i] = -2;
  /* Reading shards in the order they were written keeps each file's reads sequential. */
  order_key *keys = malloc((size_t)ns * sizeof *keys);
  ck->disk_order = malloc((size_t)ns * sizeof(int));
  if (!keys || !ck->disk_order) {
    free(keys);
    mc_error("out of memory opening %s", path);
    goto fail;
  }
  for (int i = 0; i < ck->m.n_shards; i++)
    keys[i] = (order_key){ck->m.shards[i].rank, ck->m.shards[i].family_index, (int)ck->m.shards[i].state, i};
  qsort(keys, (size_t)ck->m.n_shards, sizeof *keys, order_cmp);
  for (int i = 0; i < ck->m.n_shards; i++) ck->disk_order[i] = keys[i].shard;
  free(keys);
  *out = ck;
  return 0;
fail:
  mc_ckpt_close(ck);
  return -1;
}

void mc_ckpt_close(mc_ckpt *ck) {
  if (!ck) return;
  if (ck->fids)
    for (int i = 0; i < ck->m.n_files; i++) mc_h5_close(ck->fids[i]);
  if (ck->fds)
    for (int i = 0; i < ck->m.n_files; i++)
      if (ck->fds[i] >= 0) close(ck->fds[i]);
  free(ck->fids);
  free(ck->fds);
  free(ck->raw_off);
  free(ck->checked);
  free(ck->verified);
  free(ck->file_state);
  if (ck->file_err)
    for (int i = 0; i < ck->m.n_files; i++) free(ck->file_err[i]);
  free(ck->file_err);
  free(ck->disk_order);
  free(ck->manifest_text);
  mc_manifest_free(&ck->m);
  pthread_mutex_destroy(&ck->mu);
  pthread_cond_destroy(&ck->cv);
  free(ck);
}

/* ---------------------------------------------------------------- accessors */

int64_t mc_ckpt_step(const mc_ckpt *ck) { return ck->m.step; }
const char *mc_ckpt_step_dir(const mc_ckpt *ck) { return ck->step_dir; }
const char *mc_ckpt_root_hash(const mc_ckpt *ck) { return ck->root_hash; }
const char *mc_ckpt_manifest_json(const mc_ckpt *ck) { return ck->manifest_text; }
int mc_ckpt_format_version(const mc_ckpt *ck) { return ck->m.format_version; }
const char *mc_ckpt_config_json(const mc_ckpt *ck) { return ck->m.config_json; }
int mc_ckpt_n_families(const mc_ckpt *ck) { return ck->m.n_fams; }
const mc_ckpt_family *mc_ckpt_family_at(const mc_ckpt *ck, int i) {
  return i >= 0 && i < ck->m.n_fams ? &ck->m.fams[i] : NULL;
}
int mc_ckpt_n_shards(const mc_ckpt *ck) { return ck->m.n_shards; }
const mc_ckpt_shard *mc_ckpt_shard_at(const mc_ckpt *ck, int i) {
  return i >= 0 && i < ck->m.n_shards ? &ck->m.shards[i] : NULL;
}
int mc_ckpt_n_files(const mc_ckpt *ck) { return ck->m.n_files; }
int mc_ckpt_file_at(const mc_ckpt *ck, int i, mc_ckpt_file_info *out) {
  if (i < 0 || i >= ck->m.n_files) return -1;
  const mc_file_rec *f = &ck->m.files[i];
  *out = (mc_ckpt_file_info){f->name, f->rank, f->bytes, f->piece_bytes, f->n_pieces,
                             f->pieces ? f->pieces_sha256 : f->sha256};
  return 0;
}
int mc_ckpt_has_state(const mc_ckpt *ck, mc_state s) {
  return (int)s >= 0 && s < MC_N_STATES && ck->m.has_state[s];
}
int mc_ckpt_family_has_state(const mc_ckpt *ck, int family_index, mc_state s) {
  return family_index >= 0 && family_index < ck->m.n_fams && mc_ckpt_has_state(ck, s) &&
         mc_opt_has_state(ck->m.fams[family_index].opt, s);
}

int mc_ckpt_state_dtype(const mc_ckpt *ck, int family_index, mc_state s) {
  if (!mc_ckpt_family_has_state(ck, family_index, s)) return -1;
  const mc_ckpt_family *f = &ck->m.fams[family_index];
  return s == MC_STATE_PARAM ? f->dtype : ck->m.state_dtype[f->opt][s];
}

int mc_ckpt_find_family(const mc_ckpt *ck, const char *name) {
  for (int i = 0; i < ck->m.n_fams; i++)
    if (strcmp(ck->m.fams[i].name, name) == 0) return i;
  return -1;
}

int mc_ckpt_train_state(const mc_ckpt *ck, mc_train_state *out) {
  *out = ck->m.state;
  return 0;
}

int mc_ckpt_config(const mc_ckpt *ck, mc_config *out) {
  char origin[MC_PATH_MAX + 32];
  snprintf(origin, sizeof origin, "%s/manifest.json (config)", ck->step_dir);
  if (mc_config_default(out) != 0) return -1;
  if (mc_config_apply_json(out, ck->m.config_json, origin) != 0) return -1;
  out->parallel.own_rule = ck->m.own_rule; /* not a config key: the manifest's layout records it */
  return 0;
}

/* Keys that may change between runs without changing any tensor. */
static int training_only_key(const char *k) {
  return !strcmp(k, "init_std") || !strcmp(k, "capacity_factor") || !strcmp(k, "aux_loss_coef") || !strcmp(k, "seq_len");
}

int mc_ckpt_check_model(const mc_ckpt *ck, const mc_model *m) {
  char *run_text = mc_model_section_json(m);
  if (!run_text) return -1;
  cJSON *run = cJSON_Parse(run_text), *saved = cJSON_Parse(ck->m.model_json);
  free(run_text);
  int rc = 0;
  if (!run || !saved) rc = mc_error("cannot compare models: unparsable model section");
  const cJSON *e;
  for (int pass = 0; pass < 2 && rc == 0; pass++) {
    /* pass 0: keys of the checkpoint; pass 1: keys only the run has */
    const cJSON *a = pass == 0 ? saved : run, *b = pass == 0 ? run : saved;
    cJSON_ArrayForEach(e, a) {
      if (training_only_key(e->string)) continue;
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(b, e->string);
      if (o && cJSON_Compare(e, o, 1)) continue;
      char *x = cJSON_PrintUnformatted(pass == 0 ? e : o), *y = cJSON_PrintUnformatted(pass == 0 ? o : e);
      rc = mc_error("model mismatch: model.%s is %s in the checkpoint (%s) but %s in this run", e->string,
                    x ? x : "absent", ck->step_dir, y ? y : "absent");
      free(x);
      free(y);
      break;
    }
  }
  cJSON_Delete(run);
  cJSON_Delete(saved);
  return rc;
}

int mc_ckpt_check_families(const mc_ckpt *ck, const mc_family_set *fams) {
  if (fams->n != ck->m.n_fams)
    return mc_error("%s: the recorded model has %d tensor families but the manifest lists %d", ck->step_dir, fams->n,
                    ck->m.n_fams);
  int64_t need = 0, have = 0;
  for (int i = 0; i < fams->n; i++) {
    const mc_family *f = &fams->f[i];
    int k = mc_ckpt_find_family(ck, f->name);
    const mc_ckpt_family *c = k >= 0 ? &ck->m.fams[k] : NULL;
    int same = c && c->ndim == f->ndim;
    for (int d = 0; same && d < f->ndim; d++) same = c->shape[d] == f->shape[d];
    if (!same)
      return mc_error("%s: family %s of the recorded model is %s the manifest's families", ck->step_dir, f->name,
                      c ? "shaped differently from" : "missing from");
    if (f->numel > INT64_MAX / 4 - need) return mc_error("%s: the recorded model is too large", ck->step_dir);
    need += f->numel * (int64_t)mc_elem_dtype_size(c->dtype); /* param, as stored */
  }
  for (int i = 0; i < ck->m.n_files; i++) have += ck->m.files[i].bytes;
  if (need > have)
    return mc_error("%s: the recorded model needs %" PRId64 " bytes of parameters but the rank files hold %" PRId64,
                    ck->step_dir, need, have);
  return 0;
}

/* ---------------------------------------------------------------- reading */

static int file_index(const mc_ckpt *ck, const char *name) {
  for (int i = 0; i < ck->m.n_files; i++)
    if (strcmp(ck->m.files[i].name, name) == 0) return i;
  return -1;
}

/* Rank file f, found at path, as mc_pieces_verify checks it: its pieces (format 5 and later),
 * or its whole-file hash as the one piece (format <= 4). */
static void piece_file_of(const mc_file_rec *f, const char *path, mc_piece_file *p) {
  p->path = path;
  p->bytes = f->bytes;
  if (f->pieces) {
    p->piece_bytes = f->piece_bytes;
    p->n_pieces = f->n_pieces;
    p->pieces = f->pieces;
  } else {
    p->piece_bytes = f->bytes > 0 ? f->bytes : 1;
    p->n_pieces = 1;
    p->pieces = (char(*)[65])f->sha256;
    p->whole = 1;
  }
}

/* Counts the bytes of p that a verify pass covered (all of them, or pieces [lo, hi)). A pass
 * stopped by a failure counts as if whole: the figure is for loads that succeed. */
static void count_checked(mc_ckpt *ck, const mc_piece_file *p) {
  int64_t b = p->bytes;
  if (p->hi > 0) {
    const int64_t end = p->hi * p->piece_bytes < p->bytes ? p->hi * p->piece_bytes : p->bytes;
    b = end - p->lo * p->piece_bytes;
  }
  pthread_mutex_lock(&ck->mu);
  ck->bytes_checked += b;
  pthread_mutex_unlock(&ck->mu);
}

/* Verify before parsing: checks rank files fis[0..n) against the manifest's records (size and
 * piece digests, format 5; size and whole-file SHA-256, format <= 4), once per open. The
 * files no other thread is checking are claimed and hashed here, the pieces of all of them
 * spread over hash_threads threads; files another thread claimed are waited for (a thread
 * hashes all it claimed before it waits, so two callers never wait on each other). Returns
 * the message of the first failing file in fis order. */
static int check_files(mc_ckpt *ck, const int *fis, int n) {
  mc_piece_file *pf = calloc((size_t)(n > 0 ? n : 1), sizeof *pf);
  int *claimed = malloc((size_t)(n > 0 ? n : 1) * sizeof *claimed);
  char(*paths)[MC_PATH_MAX] = malloc((size_t)(n > 0 ? n : 1) * MC_PATH_MAX);
  if (!pf || !claimed || !paths) {
    free(pf);
    free(claimed);
    free(paths);
    return mc_error("%s: out of memory checking %d rank files", ck->step_dir, n);
  }
  int np = 0, rc = 0;
  for (int k = 0; k < n && rc == 0; k++) rc = mc_path_join(paths[k], ck->step_dir, ck->m.files[fis[k]].name);
  if (rc != 0) {
    free(pf);
    free(claimed);
    free(paths);
    return -1;
  }
  pthread_mutex_lock(&ck->mu);
  for (int k = 0; k < n; k++) {
    const mc_file_rec *f = &ck->m.files[fis[k]];
    /* a file entry without digests (a manifest older than whole-file hashes): size checked at open */
    if (ck->file_state[fis[k]] != 0 || (!f->sha256[0] && !f->pieces)) continue;
    ck->file_state[fis[k]] = 1;
    claimed[np] = fis[k];
    piece_file_of(f, paths[k], &pf[np++]);
  }
  pthread_mutex_unlock(&ck->mu);
  /* each failing file's message in pf[i].err; a failure of none (no thread could start)
   * fails them all */
  int vrc = np > 0 ? mc_pieces_verify(pf, np, ck->hash_threads) : 0, named = 0;
  for (int i = 0; i < np; i++) count_checked(ck, &pf[i]);
  for (int i = 0; i < np; i++) named |= pf[i].err != NULL;
  for (int i = 0; i < np && vrc != 0 && !named; i++) pf[i].err = strdup(mc_errmsg());
  pthread_mutex_lock(&ck->mu);
  for (int i = 0; i < np; i++) {
    ck->file_err[claimed[i]] = pf[i].err;
    ck->file_state[claimed[i]] = pf[i].err || (vrc != 0 && !named) ? -1 : 2;
  }
  pthread_cond_broadcast(&ck->cv);
  for (int k = 0; k < n; k++) {
    while (ck->file_state[fis[k]] == 1) pthread_cond_wait(&ck->cv, &ck->mu);
    if (ck->file_state[fis[k]] == -1 && rc == 0)
      rc = mc_error("%s", ck->file_err[fis[k]] ? ck->file_err[fis[k]] : "rank file failed its check before parsing");
  }
  pthread_mutex_unlock(&ck->mu);
  free(pf);
  free(claimed);
  free(paths);
  return rc;
}

static int check_file(mc_ckpt *ck, int fi) { return check_files(ck, &fi, 1); }

int mc_ckpt_check_file(mc_ckpt *ck, const char *file) {
  int fi = file_index(ck, file);
  if (fi < 0) return mc_error("%s/%s: not listed in the manifest", ck->step_dir, file);
  return check_file(ck, fi);
}

/* The pieces of the named files, in the order given, numbered 0..total (a file without any
 * digest has none); part `part` of `parts` is the run [total * part / parts, total * (part
 * + 1) / parts). Each file's share of it is verified here; a failing file is recorded as
 * failed on this handle, as check_files does. */
int mc_ckpt_check_files_part(mc_ckpt *ck, const char *const *files, int n, int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts) return mc_error("%s: no part %d of %d to check", ck->step_dir, part, parts);
  const size_t nn = (size_t)(n > 0 ? n : 1);
  int *fis = malloc(nn * sizeof *fis);
  mc_piece_file *pf = calloc(nn, sizeof *pf);
  char(*paths)[MC_PATH_MAX] = malloc(nn * MC_PATH_MAX);
  int rc = fis && pf && paths ? 0 : mc_error("%s: out of memory checking %d rank files", ck->step_dir, n);
  int64_t total = 0;
  for (int k = 0; rc == 0 && k < n; k++) {
    if ((fis[k] = file_index(ck, files[k])) < 0) rc = mc_error("%s/%s: not listed in the manifest", ck->step_dir, files[k]);
    else rc = mc_path_join(paths[k], ck->step_dir, files[k]);
    const mc_file_rec *f = rc == 0 ? &ck->m.files[fis[k]] : NULL;
    if (f) total += f->pieces ? f->n_pieces : f->sha256[0] ? 1 : 0;
  }
  const int64_t a = total * part / parts, b = total * (part + 1) / parts;
  int np = 0;
  int64_t g = 0; /* the number of file k's piece 0 */
  pthread_mutex_lock(&ck->mu);
  for (int k = 0; rc == 0 && k < n; k++) {
    const mc_file_rec *f = &ck->m.files[fis[k]];
    const int64_t count = f->pieces ? f->n_pieces : f->sha256[0] ? 1 : 0;
    const int64_t lo = (a > g ? a : g) - g, hi = (b < g + count ? b : g + count) - g;
    g += count;
    if (hi <= lo || ck->file_state[fis[k]] == 2) continue; /* none of this part, or all checked already */
    if (ck->file_state[fis[k]] == -1) {
      rc = mc_error("%s", ck->file_err[fis[k]] ? ck->file_err[fis[k]] : "rank file failed its check before parsing");
      break;
    }
    piece_file_of(f, paths[k], &pf[np]);
    pf[np].lo = lo, pf[np].hi = hi;
    fis[np++] = fis[k]; /* np <= k: the entries still to come are not overwritten */
  }
  pthread_mutex_unlock(&ck->mu);
  const int vrc = rc == 0 && np > 0 ? mc_pieces_verify(pf, np, ck->hash_threads) : 0;
  for (int i = 0; i < np; i++) count_checked(ck, &pf[i]);
  pthread_mutex_lock(&ck->mu);
  for (int i = 0; i < np; i++)
    if (pf[i].err) {
      free(ck->file_err[fis[i]]);
      ck->file_err[fis[i]] = pf[i].err;
      ck->file_state[fis[i]] = -1;
    }
  pthread_mutex_unlock(&ck->mu);
  if (rc == 0 && vrc != 0) rc = -1;
  free(fis);
  free(pf);
  free(paths);
  return rc;
}

int mc_ckpt_files_checked(mc_ckpt *ck, const char *const *files, int n) {
  int rc = 0;
  pthread_mutex_lock(&ck->mu);
  for (int k = 0; k < n; k++) {
    const int fi = file_index(ck, files[k]);
    if (fi < 0) rc = mc_error("%s/%s: not listed in the manifest", ck->step_dir, files[k]);
    else if (ck->file_state[fi] == -1 && rc == 0)
      rc = mc_error("%s", ck->file_err[fi] ? ck->file_err[fi] : "rank file failed its check before parsing");
    else if (ck->file_state[fi] == 0) ck->file_state[fi] = 2;
  }
  pthread_mutex_unlock(&ck->mu);
  return rc;
}

int mc_ckpt_check_files(mc_ckpt *ck) {
  int *all = malloc((size_t)(ck->m.n_files > 0 ? ck->m.n_files : 1) * sizeof *all);
  if (!all) return mc_error("out of memory");
  for (int i = 0; i < ck->m.n_files; i++) all[i] = i;
  int rc = check_files(ck, all, ck->m.n_files);
  free(all);
  return rc;
}

static int get_fid(mc_ckpt *ck, const mc_ckpt_shard *s, int64_t *fid, int verify) {
  int fi = file_index(ck, s->file);
  if (fi < 0) return mc_error("%s: not listed in the manifest", s->file);
  /* Verify before parsing: no byte of the file reaches the HDF5 library unverified. */
  if (verify && check_file(ck, fi) != 0) return -1;
  pthread_mutex_lock(&ck->mu);
  int rc = 0;
  if (ck->fids[fi] < 0) {
    char p[MC_PATH_MAX];
    rc = mc_path_join(p, ck->step_dir, s->file);
    if (rc == 0) rc = mc_h5_open_read(p, &ck->fids[fi]);
  }
  *fid = ck->fids[fi];
  pthread_mutex_unlock(&ck->mu);
  return rc;
}

static void count_io(mc_ckpt *ck, int64_t read, int64_t hashed) {
  pthread_mutex_lock(&ck->mu);
  ck->bytes_read += read;
  ck->bytes_hashed += hashed;
  pthread_mutex_unlock(&ck->mu);
}

void mc_ckpt_io_bytes(mc_ckpt *ck, int64_t *read, int64_t *hashed) {
  pthread_mutex_lock(&ck->mu);
  if (read) *read = ck->bytes_read;
  if (hashed) *hashed = ck->bytes_hashed;
  pthread_mutex_unlock(&ck->mu);
}

int64_t mc_ckpt_checked_bytes(mc_ckpt *ck) {
  pthread_mutex_lock(&ck->mu);
  const int64_t b = ck->bytes_checked;
  pthread_mutex_unlock(&ck->mu);
  return b;
}

int mc_ckpt_verifies(const mc_ckpt *ck) { return ck->opts.verify != 0; }
int mc_ckpt_io_threads(const mc_ckpt *ck) { return ck->hash_threads; }

/* Reads shard si whole into buf: contiguous fp32 data with plain preads (outside the HDF5
 * lock, so threads read in parallel), anything else through HDF5. */
static int read_whole(mc_ckpt *ck, int si, int64_t fid, const char *where, float *buf) {
  const mc_ckpt_shard *s = &ck->m.shards[si];
  int fi = file_index(ck, s->file), fd = -1;
  pthread_mutex_lock(&ck->mu);
  if (ck->raw_off[si] == -2) ck->raw_off[si] = mc_h5_raw_offset(fid, s->dataset);
  if (ck->raw_off[si] >= 0) {
    if (ck->fds[fi] < 0) ck->fds[fi] = open(where, O_RDONLY);
    fd = ck->fds[fi];
  }
  int64_t at = ck->raw_off[si];
  pthread_mutex_unlock(&ck->mu);
  const int64_t bytes = s->numel * (int64_t)sizeof(float);
  int64_t zero[3] = {0, 0, 0};
  int rc = fd >= 0 ? mc_read_raw(fd, at, buf, bytes, where, s->dataset)
                   : mc_h5_read_box(fid, where, s, zero, s->count, buf, s->count, zero);
  if (rc == 0) count_io(ck, bytes, 0);
  return rc;
}

/* Reads shard si whole into buf (fp32) and hashes its stored bytes into hex: read_whole for
 * float32; a narrower dtype is read as stored, hashed, then widened exactly. */
static int read_whole_hashed(mc_ckpt *ck, int si, int64_t fid, const char *where, float *buf, char hex[65]) {
  const mc_ckpt_shard *s = &ck->m.shards[si];
  const int64_t bytes = s->numel * (int64_t)mc_elem_dtype_size(s->dtype);
  if (s->dtype == MC_ELEM_F32) {
    if (read_whole(ck, si, fid, where, buf) != 0) return -1;
    mc_sha256_hex(buf, (size_t)bytes, hex);
  } else {
    void *raw = malloc((size_t)(bytes > 0 ? bytes : 1));
    if (!raw) return mc_error("out of memory reading %s:%s", s->file, s->dataset);
    int rc = mc_h5_read_stored(fid, where, s, raw);
    if (rc == 0) {
      count_io(ck, bytes, 0);
      mc_sha256_hex(raw, (size_t)bytes, hex);
      /* an int64 state is only verified here (mc_ckpt_check_request refuses float reads of it) */
      if (mc_elem_is_float(s->dtype)) mc_elem_widen(s->dtype, raw, buf, s->numel);
    }
    free(raw);
    if (rc != 0) return -1;
  }
  count_io(ck, 0, bytes);
  return 0;
}

/* 0 if hex (the hash of shard s's stored bytes) is the one the manifest records, else -1
 * naming the file (where) and dataset. */
static int check_shard_hash(const char *where, const mc_ckpt_shard *s, const char hex[65]) {
  if (strcmp(hex, s->sha256) == 0) return 0;
  return mc_error("%s: hash mismatch in dataset %s: data hashes to %s, the manifest records %s", where, s->dataset, hex,
                  s->sha256);
}

/* The boxes of a request and of a shard (a request has its family's ndim: the shard's). */
static mc_box request_box(const mc_ckpt_request *r, const mc_ckpt_shard *s) {
  return mc_box_make(s->ndim, r->start, r->count);
}
static mc_box shard_box(const mc_ckpt_shard *s) { return mc_box_make(s->ndim, s->start, s->count); }

static int is_whole(const mc_ckpt_request *r, const mc_ckpt_shard *s) {
  mc_box rb = request_box(r, s), sb = shard_box(s);
  return mc_box_equal(&rb, &sb);
}

/* Intersection of a request with a shard (global coordinates); returns its element count,
 * 0 if empty. */
static int64_t intersect(const mc_ckpt_request *r, const mc_ckpt_shard *s, mc_box *out) {
  mc_box rb = request_box(r, s), sb = shard_box(s);
  return mc_box_intersect(&rb, &sb, out);
}

/* Copies the part of shard s (whole, in buf) that request r wants into r->out. */
static void scatter(const mc_ckpt_request *r, const mc_ckpt_shard *s, const float *buf) {
  mc_box ib, rb = request_box(r, s), sb = shard_box(s);
  if (mc_box_intersect(&rb, &sb, &ib)) mc_box_copy(buf, &sb, r->out, &rb, &ib);
}

/* Reads the part of shard s that request r wants straight into r->out, through HDF5. */
static int read_part(mc_ckpt *ck, int64_t fid, const char *where, const mc_ckpt_request *r, const mc_ckpt_shard *s) {
  mc_box ib, rb = request_box(r, s), sb = shard_box(s);
  if (!mc_box_intersect(&rb, &sb, &ib)) return 0;
  int64_t soff[3], roff[3];
  mc_box_offset(&ib, &sb, soff);
  mc_box_offset(&ib, &rb, roff);
  if (mc_h5_read_box(fid, where, s, soff, ib.count, r->out, r->count, roff) != 0) return -1;
  count_io(ck, mc_box_numel(&ib) * (int64_t)sizeof(float), 0);
  return 0;
}

typedef struct {
  mc_ckpt *ck;
  const mc_ckpt_request *reqs;
  int n_reqs;
  int *shard_of_task;
  int *req_start, *req_list; /* requests of task t: req_list[req_start[t] .. req_start[t+1]) */
  int force_verify;
  /* Completion: done(user, i) once request i's last shard is in; remaining[i] counts the shards
   * still to come (guarded by mu, as the read-ahead state). */
  void (*done)(void *user, int i);
  void *user;
  int *remaining;
  unsigned char *streamed; /* per task: its shard was read by the one-pass stream */
  /* Read-ahead: files in the order tasks first touch them; a file most of whose bytes are
   * needed is handed to the kernel's read-ahead (WILLNEED) when the reader reaches the file
   * before it, so the disk works while the threads hash. */
  pthread_mutex_t mu;
  int n_forder;
  int *forder;             /* file indices, in first-touch order */
  unsigned char *prefetch; /* per position in forder: worth prefetching; 2 = done */
} read_ctx;

static void willneed(const mc_ckpt *ck, int fi) {
  char p[MC_PATH_MAX];
  if (mc_path_join(p, ck->step_dir, ck->m.files[fi].name) != 0) return;
  int fd = open(p, O_RDONLY);
  if (fd < 0) return;
  posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  close(fd);
}

/* Called as task t starts: prefetch its file and the next one in task order. */
static void read_ahead(read_ctx *c, int fi) {
  int pos = -1;
  for (int k = 0; k < c->n_forder; k++)
    if (c->forder[k] == fi) pos = k;
  for (int k = pos; k >= 0 && k <= pos + 1 && k < c->n_forder; k++) {
    pthread_mutex_lock(&c->mu);
    int go = c->prefetch[k] == 1;
    if (go) c->prefetch[k] = 2;
    pthread_mutex_unlock(&c->mu);
    if (go) willneed(c->ck, c->forder[k]);
  }
}

/* Task t's shard is in every request it serves: counts it, and reports the requests it completed. */
static void notify_requests(read_ctx *c, int t) {
  for (int q = c->req_start[t]; q < c->req_start[t + 1]; q++) {
    const int i = c->req_list[q];
    pthread_mutex_lock(&c->mu);
    const int last = --c->remaining[i] == 0;
    pthread_mutex_unlock(&c->mu);
    if (last && c->done) c->done(c->user, i);
  }
}

/* The one request that is exactly task t's whole shard, or NULL: then the shard is read
 * straight into its buffer (a load under the saving layout). */
static const mc_ckpt_request *only_whole(const read_ctx *c, int t) {
  if (c->req_start[t + 1] - c->req_start[t] != 1) return NULL;
  const mc_ckpt_request *r = &c->reqs[c->req_list[c->req_start[t]]];
  return is_whole(r, &c->ck->m.shards[c->shard_of_task[t]]) ? r : NULL;
}

static int read_shard(read_ctx *c, int t) {
  mc_ckpt *ck = c->ck;
  int si = c->shard_of_task[t];
  const mc_ckpt_shard *s = &ck->m.shards[si];
  const mc_ckpt_family *f = &ck->m.fams[s->family_index];
  int64_t fid = -1;
  if (c->n_forder) read_ahead(c, file_index(ck, s->file));
  if (get_fid(ck, s, &fid, ck->opts.verify || c->force_verify) != 0) return -1;
  char where[MC_PATH_MAX]; /* the file as messages name it */
  if (mc_path_join(where, ck->step_dir, s->file) != 0) return -1;
  if (!ck->checked[si]) {
    int64_t shape[MC_CKPT_MAX_DIM];
    mc_state_shape(f->ndim, f->shape, s->state, shape);
    if (mc_h5_check_attrs(fid, where, s, shape) != 0) return -1;
    ck->checked[si] = 1;
  }
  if ((ck->opts.verify || c->force_verify) && !ck->verified[si]) {
    /* The whole shard must be hashed. When one request is exactly this shard (a load under
     * the saving layout), it is read straight into the caller's buffer; otherwise into a
     * temporary one, then scattered. */
    const mc_ckpt_request *only = only_whole(c, t);
    float *buf = only ? only->out : malloc((size_t)s->numel * sizeof(float));
    if (!buf) return mc_error("out of memory reading %s:%s", s->file, s->dataset);
    char hex[65];
    if (read_whole_hashed(ck, si, fid, where, buf, hex) != 0) {
      if (!only) free(buf);
      return -1;
    }
    if (check_shard_hash(where, s, hex) != 0) {
      if (!only) free(buf);
      return -1;
    }
    ck->verified[si] = 1;
    if (only) return 0;
    for (int q = c->req_start[t]; q < c->req_start[t + 1]; q++) scatter(&c->reqs[c->req_list[q]], s, buf);
    free(buf);
    return 0;
  }
  for (int q = c->req_start[t]; q < c->req_start[t + 1]; q++) {
    const mc_ckpt_request *r = &c->reqs[c->req_list[q]];
    if (is_whole(r, s)) {
      if (read_whole(ck, si, fid, where, r->out) != 0) return -1;
    } else if (read_part(ck, fid, where, r, s) != 0) {
      return -1;
    }
  }
  return 0;
}

static int read_task(void *arg, int t) {
  read_ctx *c = arg;
  if (c->streamed[t]) return 0;
  if (read_shard(c, t) != 0) return -1;
  notify_requests(c, t);
  return 0;
}

/* Files in first-touch order, and which of them the tasks need at least half of. */
static void plan_read_ahead(const mc_ckpt *ck, read_ctx *c, int n_tasks) {
  int nf = ck->m.n_files;
  int64_t *need = calloc((size_t)(nf > 0 ? nf : 1), sizeof *need);
  c->forder = malloc((size_t)(nf > 0 ? nf : 1) * sizeof(int));
  c->prefetch = calloc((size_t)(nf > 0 ? nf : 1), 1);
  if (!need || !c->forder || !c->prefetch) {
    free(need);
    return; /* read-ahead is only an optimisation */
  }
  for (int t = 0; t < n_tasks; t++) {
    const mc_ckpt_shard *s = &ck->m.shards[c->shard_of_task[t]];
    int fi = file_index(ck, s->file);
    if (fi < 0) continue;
    if (need[fi] == 0) c->forder[c->n_forder++] = fi;
    need[fi] += s->numel * (int64_t)mc_elem_dtype_size(s->dtype);
  }
  for (int k = 0; k < c->n_forder; k++) c->prefetch[k] = 2 * need[c->forder[k]] >= ck->m.files[c->forder[k]].bytes;
  free(need);
}

/* ---------------------------------------------------------------- one-pass verified reads */

/* Format 6 and verification: a file most of whose bytes the reads need is streamed once
 * (ckpt_stream.c), each piece verified against its digest and the float32 shards it holds
 * copied out at their recorded offsets; HDF5 then opens the verified file and must agree with
 * every offset used. Other files, and every other shard, take the path of read_shard. */
typedef struct {
  read_ctx *c;
  int *task_of;         /* per stream shard: its task */
  unsigned char *direct; /* per stream shard: landed in its one request's buffer (no scatter) */
  const mc_stream_shard *ss;
  int n_ss;
  const int *sf;        /* the manifest file of each stream file */
  char *parse_err;      /* the first failure of check_streamed_file (malloc'd) */
} stream_glue;

/* A stream shard complete: its hash checked, its requests filled and reported. */
static int stream_complete(void *user, int k, const void *data, const char hex[65]) {
  stream_glue *g = user;
  read_ctx *c = g->c;
  mc_ckpt *ck = c->ck;
  const int t = g->task_of[k], si = c->shard_of_task[t];
  const mc_ckpt_shard *s = &ck->m.shards[si];
  const int64_t bytes = s->numel * (int64_t)sizeof(float);
  char where[MC_PATH_MAX];
  if (mc_path_join(where, ck->step_dir, s->file) != 0) return -1;
  count_io(ck, bytes, bytes);
  if (check_shard_hash(where, s, hex) != 0) return -1;
  ck->verified[si] = 1;
  for (int q = c->req_start[t]; q < c->req_start[t + 1] && !g->direct[k]; q++) scatter(&c->reqs[c->req_list[q]], s, data);
  notify_requests(c, t);
  return 0;
}

/* Once the stream has verified every piece of stream file `file` (while it goes on with later
 * files): the file is marked verified, HDF5 opens it, and every shard streamed from it must
 * pass the attribute checks and lie where the manifest said (a lying offset is named as such,
 * before the hash failure it also causes). The first failure is kept in g->parse_err. */
static void check_streamed_file(void *user, int file) {
  stream_glue *g = user;
  read_ctx *c = g->c;
  mc_ckpt *ck = c->ck;
  if (g->parse_err) return;
  pthread_mutex_lock(&ck->mu);
  ck->file_state[g->sf[file]] = 2;
  pthread_cond_broadcast(&ck->cv);
  pthread_mutex_unlock(&ck->mu);
  int rc = 0;
  for (int k = 0; k < g->n_ss && rc == 0; k++) {
    if (g->ss[k].file != file) continue;
    const int si = c->shard_of_task[g->task_of[k]];
    const mc_ckpt_shard *s = &ck->m.shards[si];
    const mc_ckpt_family *f = &ck->m.fams[s->family_index];
    char where[MC_PATH_MAX];
    int64_t fid = -1, shape[MC_CKPT_MAX_DIM];
    if (mc_path_join(where, ck->step_dir, s->file) != 0 || get_fid(ck, s, &fid, 1) != 0) {
      rc = -1;
      break;
    }
    mc_state_shape(f->ndim, f->shape, s->state, shape);
    if (!ck->checked[si] && mc_h5_check_attrs(fid, where, s, shape) != 0) {
      rc = -1;
      break;
    }
    ck->checked[si] = 1;
    const int64_t at = mc_h5_data_offset(fid, s->dataset);
    if (at < 0)
      rc = mc_error("%s: dataset %s: HDF5 stores it without one data range (chunked or compressed) but the manifest "
                    "records offset %" PRId64 " (the manifest does not describe this file: refused)", where, s->dataset,
                    s->offset);
    else if (at != s->offset)
      rc = mc_error("%s: dataset %s: HDF5 places its data at byte %" PRId64 " but the manifest records offset %" PRId64
                    " (the manifest does not describe this file: refused)", where, s->dataset, at, s->offset);
  }
  if (rc != 0) g->parse_err = strdup(mc_errmsg());
}

/* Claims the files to stream: format 6, verified reads, piece digests, not yet checked by this
 * handle, and at least half of their bytes needed (plan_read_ahead). sf gets their indices. */
static int claim_stream_files(read_ctx *c, int *sf) {
  mc_ckpt *ck = c->ck;
  int n = 0;
  if (ck->m.format_version < 6) return 0;
  pthread_mutex_lock(&ck->mu);
  for (int k = 0; k < c->n_forder; k++) {
    const int fi = c->forder[k];
    if (c->prefetch[k] != 1 || !ck->m.files[fi].pieces || ck->file_state[fi] != 0) continue;
    ck->file_state[fi] = 1;
    c->prefetch[k] = 2; /* read by the stream: no read-ahead left to do */
    sf[n++] = fi;
  }
  pthread_mutex_unlock(&ck->mu);
  return n;
}

/* Streams the claimed files sf[0..n): fills c->streamed for the tasks it served. */
static int stream_files(read_ctx *c, int n_tasks, const int *sf, int n) {
  mc_ckpt *ck = c->ck;
  const size_t nt = (size_t)(n_tasks > 0 ? n_tasks : 1), nn = (size_t)(n > 0 ? n : 1);
  int *pos_of = malloc((size_t)(ck->m.n_files > 0 ? ck->m.n_files : 1) * sizeof *pos_of);
  mc_piece_file *pf = calloc(nn, sizeof *pf);
  char(*paths)[MC_PATH_MAX] = malloc(nn * MC_PATH_MAX);
  mc_stream_shard *ss = calloc(nt, sizeof *ss);
  stream_glue g = {c, malloc(nt * sizeof(int)), calloc(nt, 1), ss, 0, sf, NULL};
  int rc = 0, ns = 0;
  if (!pos_of || !pf || !paths || !ss || !g.task_of || !g.direct) rc = mc_error("%s: out of memory planning the read", ck->step_dir);
  for (int i = 0; rc == 0 && i < ck->m.n_files; i++) pos_of[i] = -1;
  for (int k = 0; rc == 0 && k < n; k++) {
    const mc_file_rec *f = &ck->m.files[sf[k]];
    pos_of[sf[k]] = k;
    rc = mc_path_join(paths[k], ck->step_dir, f->name);
    pf[k] = (mc_piece_file){.path = paths[k], .bytes = f->bytes, .piece_bytes = f->piece_bytes, .n_pieces = f->n_pieces,
                            .pieces = f->pieces, .err_piece = -1};
  }
  for (int t = 0; rc == 0 && t < n_tasks; t++) {
    const int si = c->shard_of_task[t];
    const mc_ckpt_shard *s = &ck->m.shards[si];
    const int pos = pos_of[file_index(ck, s->file)];
    if (pos < 0 || s->dtype != MC_ELEM_F32 || s->offset <= 0 || ck->verified[si]) continue;
    const mc_ckpt_request *only = only_whole(c, t);
    g.task_of[ns] = t;
    g.direct[ns] = only != NULL;
    ss[ns++] = (mc_stream_shard){pos, s->offset, s->numel * (int64_t)sizeof(float), s->dataset, only ? only->out : NULL, NULL};
    c->streamed[t] = 1;
  }
  g.n_ss = ns;
  const int src = rc == 0 ? mc_stream_files(pf, n, ss, ns, ck->hash_threads, MC_STREAM_READ_BYTES, stream_complete,
                                            check_streamed_file, &g)
                          : -1;
  for (int k = 0; rc == 0 && k < n; k++) count_checked(ck, &pf[k]);
  /* a file is verified when the stream got through all of it; one it did not finish is checked again if asked */
  pthread_mutex_lock(&ck->mu);
  for (int k = 0; k < n; k++) {
    ck->file_err[sf[k]] = pf[k].err;
    ck->file_state[sf[k]] = src == 0 ? 2 : pf[k].err ? -1 : 0;
  }
  pthread_cond_broadcast(&ck->cv);
  pthread_mutex_unlock(&ck->mu);
  if (rc == 0) rc = src;
  if (rc == 0 && g.parse_err) rc = mc_error("%s", g.parse_err);
  for (int k = 0; rc == 0 && k < ns; k++)
    if (ss[k].err) rc = mc_error("%s", ss[k].err);
  free(g.parse_err);
  for (int k = 0; k < ns; k++) free(ss[k].err);
  free(pos_of);
  free(pf);
  free(paths);
  free(ss);
  free(g.task_of);
  free(g.direct);
  return rc;
}

int mc_ckpt_check_request(const mc_ckpt *ck, const mc_ckpt_request *r) {
  int fi = r->family ? mc_ckpt_find_family(ck, r->family) : -1;
  if (fi < 0) return mc_error("%s: no family '%s' in the checkpoint", ck->step_dir, r->family ? r->family : "(null)");
  const mc_ckpt_family *f = &ck->m.fams[fi];
  if (!mc_ckpt_family_has_state(ck, fi, r->state))
    return mc_error("%s: the checkpoint has no '%s' state for %s (trained by %s)", ck->step_dir,
                    (int)r->state >= 0 && r->state < MC_N_STATES ? mc_state_name(r->state) : "?", f->name,
                    mc_opt_name(f->opt));
  if (!mc_elem_is_float(mc_ckpt_state_dtype(ck, fi, r->state)))
    return mc_error("%s/%s is stored as %s, not a float format: read it with mc_ckpt_read_i64", f->name,
                    mc_state_name(r->state), mc_elem_dtype_name(mc_ckpt_state_dtype(ck, fi, r->state)));
  int64_t want = 1;
  for (int k = 0; k < f->ndim; k++) {
    if (r->start[k] < 0 || r->count[k] < 1 || r->start[k] + r->count[k] > f->shape[k])
      return mc_error("%s: requested box dimension %d [%" PRId64 ", %" PRId64 ") is outside [0, %" PRId64 ")", f->name, k,
                      r->start[k], r->start[k] + r->count[k], f->shape[k]);
    want *= r->count[k];
  }
  if (!r->out) return mc_error("%s: no output buffer", f->name);
  int64_t got = 0;
  mc_box part;
  for (int s = 0; s < ck->m.n_shards; s++) {
    const mc_ckpt_shard *sh = &ck->m.shards[s];
    if (sh->family_index == fi && sh->state == r->state) got += intersect(r, sh, &part);
  }
  if (got != want)
    return mc_error("%s/%s: the stored shards cover %" PRId64 " of the %" PRId64 " requested elements", f->name,
                    mc_state_name(r->state), got, want);
  return 0;
}

/* Plans which shards serve which requests, then reads each shard once on the pool. */
static int run_reads(mc_ckpt *ck, const mc_ckpt_request *reqs, int n, int all_shards, void (*done)(void *, int),
                     void *user) {
  int ns = ck->m.n_shards;
  int *touch = calloc((size_t)(ns > 0 ? ns : 1), sizeof(int)); /* requests per shard */
  int *rfam = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));     /* family of each request */
  if (!touch || !rfam) {
    free(touch);
    free(rfam);
    return mc_error("out of memory");
  }
  mc_box part;
  for (int i = 0; i < n; i++) {
    const mc_ckpt_request *r = &reqs[i];
    if (mc_ckpt_check_request(ck, r) != 0) {
      free(touch);
      free(rfam);
      return -1;
    }
    rfam[i] = mc_ckpt_find_family(ck, r->family);
    for (int s = 0; s < ns; s++) {
      const mc_ckpt_shard *sh = &ck->m.shards[s];
      if (sh->family_index == rfam[i] && sh->state == r->state && intersect(r, sh, &part)) touch[s]++;
    }
  }
  int n_tasks = 0, n_links = 0;
  for (int s = 0; s < ns; s++)
    if (touch[s] || all_shards) {
      n_tasks++;
      n_links += touch[s];
    }
  read_ctx c = {.ck = ck, .reqs = reqs, .n_reqs = n, .force_verify = all_shards, .done = done, .user = user,
                .mu = PTHREAD_MUTEX_INITIALIZER};
  c.shard_of_task = malloc((size_t)(n_tasks + 1) * sizeof(int));
  c.req_start = malloc((size_t)(n_tasks + 2) * sizeof(int));
  c.req_list = malloc((size_t)(n_links + 1) * sizeof(int));
  c.remaining = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
  c.streamed = calloc((size_t)(n_tasks + 1), 1);
  int *sf = malloc((size_t)(ck->m.n_files > 0 ? ck->m.n_files : 1) * sizeof *sf);
  int rc = 0;
  if (!c.shard_of_task || !c.req_start || !c.req_list || !c.remaining || !c.streamed || !sf) rc = mc_error("out of memory");
  if (rc == 0) {
    int t = 0, q = 0;
    for (int o = 0; o < ns; o++) {
      int s = ck->disk_order[o];
      if (!touch[s] && !all_shards) continue;
      c.shard_of_task[t] = s;
      c.req_start[t] = q;
      for (int i = 0; i < n && touch[s]; i++) {
        const mc_ckpt_shard *sh = &ck->m.shards[s];
        if (sh->family_index == rfam[i] && sh->state == reqs[i].state &&
            intersect(&reqs[i], sh, &part)) {
          c.req_list[q++] = i;
          c.remaining[i]++;
        }
      }
      t++;
    }
    c.req_start[t] = q;
    plan_read_ahead(ck, &c, n_tasks);
    const int verify = ck->opts.verify || all_shards;
    const int n_sf = verify ? claim_stream_files(&c, sf) : 0;
    if (n_sf > 0) rc = stream_files(&c, n_tasks, sf, n_sf);
    /* Verify before parsing, every other file the reads touch at once: their pieces spread
     * over the hashing threads rather than one file per reading thread. */
    if (rc == 0 && verify && c.n_forder > 0) rc = check_files(ck, c.forder, c.n_forder);
    if (rc == 0) rc = mc_parallel(n_tasks, ck->opts.io_threads, read_task, &c);
  }
  free(c.forder);
  free(c.prefetch);
  free(c.shard_of_task);
  free(c.req_start);
  free(c.req_list);
  free(c.remaining);
  free(c.streamed);
  free(sf);
  free(touch);
  free(rfam);
  return rc;
}

int mc_ckpt_read_many_notify(mc_ckpt *ck, const mc_ckpt_request *reqs, int n, void (*done)(void *user, int i),
                             void *user) {
  return run_reads(ck, reqs, n, 0, done, user);
}

int mc_ckpt_read_many(mc_ckpt *ck, const mc_ckpt_request *reqs, int n) { return run_reads(ck, reqs, n, 0, NULL, NULL); }

int mc_ckpt_read(mc_ckpt *ck, const char *family, mc_state state, const int64_t *start, const int64_t *count,
                 float *out) {
  int fi = mc_ckpt_find_family(ck, family);
  if (fi < 0) return mc_error("%s: no family '%s' in the checkpoint", ck->step_dir, family);
  mc_ckpt_request r;
  memset(&r, 0, sizeof r);
  r.family = family;
  r.state = state;
  for (int k = 0; k < ck->m.fams[fi].ndim; k++) {
    r.start[k] = start[k];
    r.count[k] = count[k];
  }
  r.out = out;
  return run_reads(ck, &r, 1, 0, NULL, NULL);
}

int mc_ckpt_verify_all(mc_ckpt *ck) { return run_reads(ck, NULL, 0, 1, NULL, NULL); }

int mc_ckpt_read_i64(mc_ckpt *ck, const char *family, mc_state state, int64_t *out) {
  int fi = mc_ckpt_find_family(ck, family);
  if (fi < 0) return mc_error("%s: no family '%s' in the checkpoint", ck->step_dir, family);
  const char *sn = (int)state >= 0 && state < MC_N_STATES ? mc_state_name(state) : "?";
  if (!mc_ckpt_family_has_state(ck, fi, state)) return mc_error("%s: the checkpoint has no '%s' state for %s", ck->step_dir, sn, family);
  int si = -1;
  for (int i = 0; i < ck->m.n_shards && si < 0; i++)
    if (ck->m.shards[i].family_index == fi && ck->m.shards[i].state == state) si = i;
  const mc_ckpt_shard *s = si >= 0 ? &ck->m.shards[si] : NULL;
  if (!s || s->dtype != MC_ELEM_I64 || s->numel != 1)
    return mc_error("%s: %s/%s is not one int64 element (%s)", ck->step_dir, family, sn,
                    s ? mc_elem_dtype_name(s->dtype) : "no shard");
  int64_t fid = -1;
  char where[MC_PATH_MAX];
  if (get_fid(ck, s, &fid, ck->opts.verify) != 0 || mc_path_join(where, ck->step_dir, s->file) != 0) return -1;
  int64_t shape[MC_CKPT_MAX_DIM];
  mc_state_shape(ck->m.fams[fi].ndim, ck->m.fams[fi].shape, state, shape);
  if (mc_h5_check_attrs(fid, where, s, shape) != 0 || mc_h5_read_stored(fid, where, s, out) != 0) return -1;
  count_io(ck, 8, 0);
  if (ck->opts.verify) {
    char hex[65];
    mc_sha256_hex(out, 8, hex); /* the stored little-endian bytes (an x86/ARM host's own) */
    count_io(ck, 0, 8);
    if (check_shard_hash(where, s, hex) != 0) return -1;
  }
  return 0;
}
