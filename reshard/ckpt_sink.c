#define _GNU_SOURCE /* sync_file_range */
#include "reshard/ckpt_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/format.h"
#include "core/dtype.h"
#include "reshard/ckpt_source.h"

typedef struct {
  int file;       /* index into files */
  int64_t offset; /* byte offset of the dataset's data in the file */
  int done;
  char sha[65];   /* hex SHA-256, once the last row is written */
} sink_target;

typedef struct {
  int rank;
  int fd;         /* the data is written through this descriptor, at the datasets' offsets */
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
static int shard_attrs(hid_t d, const mc_geometry *g, int fam, mc_state st, int dtype, const mc_rs_shard *sh,
                       const char *hex) {
  const mc_family *f = &g->fams.f[fam];
  int *reps = malloc((size_t)g->world * sizeof *reps);
  if (!reps) return mc_error("out of memory");
  mc_shard_attrs a;
  memset(&a, 0, sizeof a);
  snprintf(a.s.family, sizeof a.s.family, "%s", f->name);
  a.s.state = st;
  a.s.dtype = dtype;
  a.s.ndim = mc_state_shape(f->ndim, f->shape, st, a.global_shape);
  for (int i = 0; i < a.s.ndim; i++) {
    a.s.start[i] = sh->slab.start[i];
    a.s.count[i] = sh->slab.count[i];
  }
  a.s.stage = mc_family_stage(g, fam);
  a.s.n_replicas = mc_shard_replicas(g, fam, st, sh->rank, reps);
  a.s.replicas = reps;
  a.s.rank = sh->rank;
  a.s.opt = f->opt; /* the target geometry's optimizer: the source's groups, kept */
  snprintf(a.s.sha256, sizeof a.s.sha256, "%s", hex);
  if (mc_state_is_scalar(st)) snprintf(a.placement_rule, sizeof a.placement_rule, "replicated");
  else mc_placement_rule(g, fam, a.placement_rule, sizeof a.placement_rule);
  int rc = mc_h5_write_shard_attrs((int64_t)d, &a);
  free(reps);
  return rc;
}

/* ---------------------------------------------------------------- files */

/* The HDF5 file access settings of a rank file: as the library's writer, large datasets page
 * aligned and metadata gathered in blocks. */
static hid_t file_access(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  H5Pset_alignment(fapl, 64 * 1024, 4096);
  H5Pset_meta_block_size(fapl, 64 * 1024);
  return fapl;
}

/* Creates rank r's file with its file attributes and every dataset of its target shards
 * (space allocated now, contiguous, so each has a fixed data offset), then closes the HDF5
 * file: an open HDF5 file holds about a megabyte of library memory, so one is open at a time
 * and the memory of a reshard does not grow with the number of rank files. The data is then
 * written with pwrite at the recorded offsets; the attributes are added at the end. */
static int create_file(mc_rs_sink *s, const mc_rs_plan *p, const char *step_dir, int rank, int64_t step) {
  const mc_geometry *g = s->g;
  sink_file *f = &s->files[s->n_files];
  f->rank = rank;
  f->fd = -1;
  snprintf(f->path, sizeof f->path, "%s/rank_%d.h5", step_dir, rank);
  hid_t fapl = file_access();
  /* No object timestamps (as the library's writer): the same target gives byte-identical
   * files, so A -> B -> A reproduces A's rank files when A was written by a reshard. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(fcpl, 0);
  H5Pset_obj_track_times(gcpl, 0);
  hid_t fid = H5Fcreate(f->path, H5F_ACC_EXCL, fcpl, fapl);
  H5Pclose(fapl);
  H5Pclose(fcpl);
  if (fid < 0) {
    H5Pclose(gcpl);
    return mc_error("%s: cannot create HDF5 file", f->path);
  }
  s->file_of_rank[rank] = s->n_files++;
  int rc = mc_h5_write_file_attrs((int64_t)fid, step, rank) ? mc_error("%s: cannot write file attributes", f->path) : 0;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_obj_track_times(dcpl, 0);
  for (int i = 0; i < p->n_targets && rc == 0; i++) {
    const mc_rs_target *tg = &p->targets[i];
    if (tg->shard.rank != rank) continue;
    const mc_rs_tensor *tn = &p->tensors[tg->tensor];
    const mc_family *fam = &g->fams.f[tn->fam];
    char gname[MC_FAMILY_NAME_MAX + 2];
    snprintf(gname, sizeof gname, "/%s", fam->name);
    hid_t gr = H5Lexists(fid, gname, H5P_DEFAULT) > 0 ? H5Gopen2(fid, gname, H5P_DEFAULT)
                                                      : H5Gcreate2(fid, gname, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    if (gr < 0) {
      rc = mc_error("%s: cannot create group %s", f->path, gname);
      break;
    }
    hsize_t dims[3]; /* the shard's box: the state's dimensions (a scalar kind's one) */
    for (int d = 0; d < tg->shard.slab.ndim; d++) dims[d] = (hsize_t)tg->shard.slab.count[d];
    hid_t sp = H5Screate_simple(tg->shard.slab.ndim, dims, NULL);
    hid_t type = (hid_t)mc_h5_stored_type((int64_t)fid, tn->dtype); /* the element dtype as stored */
    hid_t d = type < 0 ? -1 : H5Dcreate2(gr, mc_state_name(tn->state), type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (type >= 0) H5Tclose(type);
    H5Sclose(sp);
    H5Gclose(gr);
    if (d < 0) {
      rc = mc_error("%s: cannot create dataset %s/%s", f->path, gname, mc_state_name(tn->state));
      break;
    }
    const haddr_t a = H5Dget_offset(d);
    s->t[i].file = s->file_of_rank[rank];
    s->t[i].offset = a == HADDR_UNDEF ? -1 : (int64_t)a;
    if (s->t[i].offset < 0 && mc_box_numel(&tg->shard.slab) > 0)
      rc = mc_error("%s: dataset %s/%s has no data offset", f->path, gname, mc_state_name(tn->state));
    if (H5Dclose(d) < 0 && rc == 0) rc = mc_error("%s: cannot close dataset %s/%s", f->path, gname, mc_state_name(tn->state));
  }
  H5Pclose(dcpl);
  H5Pclose(gcpl);
  /* Closing flushes the metadata: a full disk shows up here too. */
  if (H5Fclose(fid) < 0 && rc == 0) rc = mc_error("%s: closing failed (disk full?)", f->path);
  if (rc == 0 && (f->fd = open(f->path, O_WRONLY)) < 0) rc = mc_error("%s: cannot open for writing", f->path);
  return rc;
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
  /* Files and datasets are made up front, rank by rank, by this one thread; workers then
   * only write. */
  int rc = 0;
  for (int i = 0; i < p->n_targets && rc == 0; i++) {
    const int r = p->targets[i].shard.rank;
    if (s->file_of_rank[r] < 0) rc = create_file(s, p, step_dir, r, step);
  }
  if (rc) {
    mc_rs_sink_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

int mc_rs_sink_write(void *ctx, const mc_rs_plan *p, int i, int64_t off, int64_t n, const void *data) {
  mc_rs_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  const sink_file *f = &s->files[s->t[i].file];
  /* little-endian rows of the target's dtype at the dataset's offset (the format's storage:
   * contiguous, unfiltered) */
  const int64_t es = (int64_t)mc_elem_dtype_size(p->tensors[p->targets[i].tensor].dtype);
  const char *b = (const char *)data;
  int64_t left = n * es, at = s->t[i].offset + off * es;
  int rc = 0;
  while (left > 0) {
    ssize_t w = pwrite(f->fd, b, (size_t)left, (off_t)at);
    if (w <= 0) {
      rc = mc_error("%s: writing rows of %s/%s failed (disk full?): %s", f->path,
                    s->g->fams.f[p->tensors[p->targets[i].tensor].fam].name,
                    mc_state_name(p->tensors[p->targets[i].tensor].state), w < 0 ? strerror(errno) : "nothing written");
      break;
    }
    b += w, at += w, left -= w;
  }
  /* Start writing the dirty pages back now, while reading goes on, so that the final fsync
   * does not have the whole checkpoint to flush at once. Advisory: errors surface at fsync. */
  if (rc == 0) sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  long long total = atomic_fetch_add(&s->written, n * es) + n * es;
  if (rc == 0 && s->fault_bytes >= 0 && total >= s->fault_bytes) {
    if (s->fault_crash) _exit(3);
    rc = mc_error("%s: injected failure after %lld bytes (MC_RESHARD_FAULT)", f->path, total);
  }
  return rc;
}

int mc_rs_sink_done(void *ctx, const mc_rs_plan *p, int i, const unsigned char sha[32]) {
  mc_rs_sink *s = ((mc_rs_io_ctx *)ctx)->sink;
  (void)p;
  mc_rs_hex(sha, s->t[i].sha); /* the attributes are written by finish, one file at a time */
  s->t[i].done = 1;
  return 0;
}

/* Adds every target shard's attributes (ownership, SHA-256) to rank file k. */
static int write_attrs(mc_rs_sink *s, const mc_rs_plan *p, int k) {
  sink_file *f = &s->files[k];
  hid_t fapl = file_access();
  hid_t fid = H5Fopen(f->path, H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  if (fid < 0) return mc_error("%s: cannot reopen to write the shard attributes", f->path);
  int rc = 0;
  for (int i = 0; i < p->n_targets && rc == 0; i++) {
    if (s->t[i].file != k) continue;
    const mc_rs_target *tg = &p->targets[i];
    const mc_rs_tensor *tn = &p->tensors[tg->tensor];
    char name[MC_FAMILY_NAME_MAX + 24];
    snprintf(name, sizeof name, "/%s/%s", s->g->fams.f[tn->fam].name, mc_state_name(tn->state));
    hid_t d = H5Dopen2(fid, name, H5P_DEFAULT);
    if (d < 0 || shard_attrs(d, s->g, tn->fam, tn->state, tn->dtype, &tg->shard, s->t[i].sha) != 0)
      rc = mc_error("%s: cannot write the attributes of %s", f->path, name);
    if (d >= 0 && H5Dclose(d) < 0 && rc == 0) rc = mc_error("%s: cannot close %s", f->path, name);
  }
  /* Closing flushes metadata: a full disk shows up here too. */
  if (H5Fclose(fid) < 0 && rc == 0) rc = mc_error("%s: closing failed (disk full?)", f->path);
  return rc;
}

int mc_rs_sink_finish(mc_rs_sink *s, const mc_rs_plan *p) {
  int rc = 0;
  for (int i = 0; i < s->n_t && rc == 0; i++)
    if (!s->t[i].done) rc = mc_error("reshard: target shard %d was not completed", i);
  for (int k = 0; k < s->n_files; k++) {
    sink_file *f = &s->files[k];
    if (f->fd >= 0 && close(f->fd) != 0 && rc == 0) rc = mc_error("%s: closing failed (disk full?)", f->path);
    f->fd = -1;
    if (rc == 0) rc = write_attrs(s, p, k);
    if (rc == 0 && mc_fsync_path(f->path, 0) != 0) rc = -1;
  }
  return rc;
}

void mc_rs_sink_free(mc_rs_sink *s) {
  if (!s) return;
  for (int k = 0; s->files && k < s->n_files; k++)
    if (s->files[k].fd >= 0) close(s->files[k].fd);
  free(s->files);
  free(s->file_of_rank);
  free(s->t);
  free(s);
}
