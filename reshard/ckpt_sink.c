#define _GNU_SOURCE /* sync_file_range */
#include "reshard/ckpt_sink.h"

#include <fcntl.h>
#include <hdf5.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/format.h"
#include "reshard/ckpt_source.h"

typedef struct {
  hid_t d;     /* open until the shard is complete */
  int file;    /* index into files */
  int done;
} sink_target;

typedef struct {
  int rank;
  hid_t fid;
  int fd; /* a second descriptor, only to start writeback early */
  char path[MC_PATH_MAX + 40];
} sink_file;

struct mc_rs_sink {
  const mc_geometry *g;
  int n_files;
  sink_file *files;
  int *file_of_rank;
  sink_target *t;
  int n_t;
  int64_t fault_bytes; /* < 0: no fault */
  int fault_crash;
  atomic_llong written;
};

/* ---------------------------------------------------------------- attributes */

/* The shard's attributes, written by the checkpoint library's own writer so the names, types
 * and encodings are those of every rank file. */
static int shard_attrs(hid_t d, const mc_geometry *g, int fam, mc_state st, const mc_rs_shard *sh, const char *hex) {
  const mc_family *f = &g->fams.f[fam];
  int *reps = malloc((size_t)g->world * sizeof *reps);
  if (!reps) return mc_error("out of memory");
  mc_shard_attrs a;
  memset(&a, 0, sizeof a);
  snprintf(a.s.family, sizeof a.s.family, "%s", f->name);
  a.s.state = st;
  a.s.ndim = f->ndim;
  for (int i = 0; i < f->ndim; i++) {
    a.s.start[i] = sh->slab.start[i];
    a.s.count[i] = sh->slab.count[i];
    a.global_shape[i] = f->shape[i];
  }
  a.s.stage = mc_family_stage(g, fam);
  a.s.n_replicas = mc_shard_replicas(g, fam, st, sh->rank, reps);
  a.s.replicas = reps;
  a.s.rank = sh->rank;
  snprintf(a.s.sha256, sizeof a.s.sha256, "%s", hex);
  mc_placement_rule(g, fam, a.placement_rule, sizeof a.placement_rule);
  int rc = mc_h5_write_shard_attrs((int64_t)d, &a);
  free(reps);
  return rc;
}

/* ---------------------------------------------------------------- files */

static int open_file(mc_rs_sink *s, const char *step_dir, int rank, int64_t step) {
  sink_file *f = &s->files[s->n_files];
  f->rank = rank;
  snprintf(f->path, sizeof f->path, "%s/rank_%d.h5", step_dir, rank);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  /* As the library's writer: large datasets page aligned, metadata gathered in blocks. */
  H5Pset_alignment(fapl, 64 * 1024, 4096);
  H5Pset_meta_block_size(fapl, 64 * 1024);
  f->fid = H5Fcreate(f->path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  f->fd = -1;
  if (f->fid < 0) return mc_error("%s: cannot create HDF5 file", f->path);
  f->fd = open(f->path, O_WRONLY);
  s->file_of_rank[rank] = s->n_files++;
  if (mc_h5_write_file_attrs((int64_t)f->fid, step, rank)) return mc_error("%s: cannot write file attributes", f->path);
  return 0;
}

int mc_rs_sink_create(const char *step_dir, const mc_geometry *g, const mc_rs_plan *p, int64_t step,
                      mc_rs_sink **out) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  *out = NULL;
  mc_rs_sink *s = calloc(1, sizeof *s);
  if (!s) return mc_error("out of memory");
  s->g = g;
  s->fault_bytes = -1;
  const char *fault = getenv("MC_RESHARD_FAULT");
  if (fault && *fault) {
    long long b = -1;
    if (sscanf(fault, "fail:%lld", &b) == 1) s->fault_crash = 0;
    else if (sscanf(fault, "crash:%lld", &b) == 1) s->fault_crash = 1;
    else {
      free(s);
      return mc_error("MC_RESHARD_FAULT=%s: expected fail:<bytes> or crash:<bytes>", fault);
    }
    s->fault_bytes = b;
  }
  s->files = calloc((size_t)g->world, sizeof *s->files);
  s->file_of_rank = malloc((size_t)g->world * sizeof *s->file_of_rank);
  s->n_t = p->n_targets;
  s->t = calloc((size_t)(p->n_targets ? p->n_targets : 1), sizeof *s->t);
  if (!s->files || !s->file_of_rank || !s->t) {
    mc_rs_sink_free(s);
    return mc_error("out of memory");
  }
  for (int r = 0; r < g->world; r++) s->file_of_rank[r] = -1;
  for (int i = 0; i < p->n_targets; i++) s->t[i].d = -1;
  /* Datasets are created up front, in plan order, by this one thread; workers then only write. */
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
  int rc = 0;
  for (int i = 0; i < p->n_targets && rc == 0; i++) {
    const mc_rs_target *tg = &p->targets[i];
    const mc_rs_tensor *tn = &p->tensors[tg->tensor];
    const mc_family *f = &g->fams.f[tn->fam];
    int r = tg->shard.rank;
    if (s->file_of_rank[r] < 0 && open_file(s, step_dir, r, step) != 0) {
      rc = -1;
      break;
    }
    sink_file *sf = &s->files[s->file_of_rank[r]];
    char gname[MC_FAMILY_NAME_MAX + 2];
    snprintf(gname, sizeof gname, "/%s", f->name);
    hid_t gr = H5Lexists(sf->fid, gname, H5P_DEFAULT) > 0
                   ? H5Gopen2(sf->fid, gname, H5P_DEFAULT)
                   : H5Gcreate2(sf->fid, gname, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (gr < 0) {
      rc = mc_error("%s: cannot create group %s", sf->path, gname);
      break;
    }
    hsize_t dims[3];
    for (int d = 0; d < f->ndim; d++) dims[d] = (hsize_t)tg->shard.slab.count[d];
    hid_t sp = H5Screate_simple(f->ndim, dims, NULL);
    s->t[i].d = H5Dcreate2(gr, mc_state_name(tn->state), H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    s->t[i].file = s->file_of_rank[r];
    H5Sclose(sp);
    H5Gclose(gr);
    if (s->t[i].d < 0) rc = mc_error("%s: cannot create dataset %s/%s", sf->path, gname, mc_state_name(tn->state));
  }
  H5Pclose(dcpl);
  if (rc) {
    mc_rs_sink_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

int mc_rs_sink_write(void *ctx, const mc_rs_plan *p, int i, int64_t off, int64_t n, const float *buf) {
  mc_rs_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  const mc_rs_shard *sh = &p->targets[i].shard;
  int nd = sh->slab.ndim;
  int64_t row = 1;
  for (int d = 1; d < nd; d++) row *= sh->slab.count[d];
  hsize_t fo[3] = {0, 0, 0}, fc[3];
  for (int d = 0; d < nd; d++) fc[d] = (hsize_t)sh->slab.count[d];
  fo[0] = (hsize_t)(off / row);
  fc[0] = (hsize_t)(n / row);
  hid_t fs = H5Dget_space(s->t[i].d), ms = H5Screate_simple(nd, fc, NULL);
  int rc = 0;
  if (fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, fo, NULL, fc, NULL) < 0 ||
      H5Dwrite(s->t[i].d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0)
    rc = mc_error("%s: writing rows of %s/%s failed (disk full?)", s->files[s->t[i].file].path,
                  s->g->fams.f[p->tensors[p->targets[i].tensor].fam].name,
                  mc_state_name(p->tensors[p->targets[i].tensor].state));
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  /* Start writing the dirty pages back now, while reading goes on, so that the final fsync
   * does not have the whole checkpoint to flush at once. Advisory: errors surface at fsync. */
  if (rc == 0 && s->files[s->t[i].file].fd >= 0) sync_file_range(s->files[s->t[i].file].fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  long long total = atomic_fetch_add(&s->written, n * 4) + n * 4;
  if (rc == 0 && s->fault_bytes >= 0 && total >= s->fault_bytes) {
    if (s->fault_crash) _exit(3);
    rc = mc_error("%s: injected failure after %lld bytes (MC_RESHARD_FAULT)", s->files[s->t[i].file].path, total);
  }
  return rc;
}

int mc_rs_sink_done(void *ctx, const mc_rs_plan *p, int i, const unsigned char sha[32]) {
  mc_rs_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  const mc_rs_target *tg = &p->targets[i];
  const mc_rs_tensor *tn = &p->tensors[tg->tensor];
  char hex[65];
  mc_rs_hex(sha, hex);
  int rc = shard_attrs(s->t[i].d, s->g, tn->fam, tn->state, &tg->shard, hex);
  if (H5Dclose(s->t[i].d) < 0) rc = -1;
  s->t[i].d = -1;
  if (rc) return mc_error("%s: cannot write the attributes of %s/%s", s->files[s->t[i].file].path,
                          s->g->fams.f[tn->fam].name, mc_state_name(tn->state));
  s->t[i].done = 1;
  return 0;
}

int mc_rs_sink_finish(mc_rs_sink *s) {
  int rc = 0;
  for (int i = 0; i < s->n_t && rc == 0; i++)
    if (!s->t[i].done) rc = mc_error("reshard: target shard %d was not completed", i);
  for (int k = 0; k < s->n_files; k++) {
    sink_file *f = &s->files[k];
    if (f->fid < 0) continue;
    /* Closing flushes metadata: a full disk shows up here too. */
    if (H5Fclose(f->fid) < 0 && rc == 0) rc = mc_error("%s: closing failed (disk full?)", f->path);
    f->fid = -1;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (rc == 0 && mc_fsync_path(f->path, 0) != 0) rc = -1;
  }
  return rc;
}

void mc_rs_sink_free(mc_rs_sink *s) {
  if (!s) return;
  for (int i = 0; s->t && i < s->n_t; i++)
    if (s->t[i].d >= 0) H5Dclose(s->t[i].d);
  for (int k = 0; s->files && k < s->n_files; k++) {
    if (s->files[k].fid >= 0) H5Fclose(s->files[k].fid);
    if (s->files[k].fd >= 0) close(s->files[k].fd);
  }
  free(s->files);
  free(s->file_of_rank);
  free(s->t);
  free(s);
}
