#define _POSIX_C_SOURCE 200809L
#include "reshard/ckpt_source.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/format.h"
#include "core/dtype.h"

typedef struct {
  char name[32];
  int fd;        /* plain descriptor for raw reads of contiguous datasets */
  int64_t fid;   /* HDF5 handle, for attribute checks and non-contiguous datasets (closed after
                    binding when every shard of the file is read raw) */
} src_file;

typedef struct {
  const mc_ckpt_shard *rec; /* manifest record */
  int file;                 /* index into files */
  int64_t raw_offset;       /* byte offset of the data in the file, -1: read through HDF5 */
  int64_t row;              /* elements per row of the shard */
  int64_t shape[MC_CKPT_MAX_DIM]; /* the state's global shape (mc_state_shape) */
} src_shard;

struct mc_rs_source {
  mc_ckpt *ck;
  mc_config cfg;
  mc_geometry g;
  int have_geometry;
  int n_files;
  src_file *files;
  src_shard *shards; /* per plan.src */
};

void mc_rs_hex(const unsigned char sha[32], char hex[65]) {
  static const char d[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) hex[2 * i] = d[sha[i] >> 4], hex[2 * i + 1] = d[sha[i] & 15];
  hex[64] = 0;
}

static int source_open(const char *path, int metadata_only, mc_rs_source **out) {
  *out = NULL;
  mc_rs_source *s = calloc(1, sizeof *s);
  if (!s) return mc_error("out of memory");
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  o.metadata_only = metadata_only;
  if (mc_ckpt_open(path, &o, &s->ck) != 0) {
    free(s);
    return -1;
  }
  /* the recorded optimizer groups decide which state kinds each family has */
  if (mc_ckpt_config(s->ck, &s->cfg) != 0 || mc_geometry_of_config(&s->cfg, NULL, &s->g) != 0) {
    mc_error_context("%s: the recorded model, layout and optimizer groups", mc_ckpt_step_dir(s->ck));
    mc_rs_source_close(s);
    return -1;
  }
  s->have_geometry = 1;
  *out = s;
  return 0;
}

int mc_rs_source_open(const char *path, mc_rs_source **out) { return source_open(path, 0, out); }
int mc_rs_source_open_metadata(const char *path, mc_rs_source **out) { return source_open(path, 1, out); }

void mc_rs_source_close(mc_rs_source *s) {
  if (!s) return;
  for (int i = 0; i < s->n_files; i++) {
    if (s->files[i].fd >= 0) close(s->files[i].fd);
    if (s->files[i].fid >= 0) mc_h5_close(s->files[i].fid);
  }
  free(s->files);
  free(s->shards);
  if (s->have_geometry) mc_geometry_free(&s->g);
  if (s->ck) mc_ckpt_close(s->ck);
  free(s);
}

mc_ckpt *mc_rs_source_ckpt(mc_rs_source *s) { return s->ck; }
const mc_geometry *mc_rs_source_geometry(const mc_rs_source *s) { return &s->g; }
const mc_config *mc_rs_source_config(const mc_rs_source *s) { return &s->cfg; }

unsigned mc_rs_source_states(const mc_rs_source *s) {
  unsigned m = 0;
  for (int st = 0; st < MC_N_STATES; st++)
    if (mc_ckpt_has_state(s->ck, (mc_state)st)) m |= 1u << st;
  return m;
}

/* The index of rank file `name` in s->files, its descriptor open (the HDF5 handle is opened by
 * bind, one file at a time). */
static int file_index(mc_rs_source *s, const char *name) {
  int i = 0;
  while (i < s->n_files && strcmp(s->files[i].name, name) != 0) i++;
  if (i == s->n_files) {
    void *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *s->files);
    if (!nf) return mc_error("out of memory");
    s->files = nf;
    src_file *f = &s->files[s->n_files++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->fd = -1;
    f->fid = -1;
  }
  src_file *f = &s->files[i];
  char path[MC_PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/%s", mc_ckpt_step_dir(s->ck), name);
  if (f->fd < 0 && (f->fd = open(path, O_RDONLY)) < 0) return mc_error("%s: cannot open: %s", path, strerror(errno));
  return i;
}

int mc_rs_shard_index(mc_ckpt *ck, const mc_geometry *g, int **out) {
  /* Manifest families map to the geometry's by name (once), shards by (family, state, rank). */
  int nmf = mc_ckpt_n_families(ck), ns = mc_ckpt_n_shards(ck);
  size_t n = (size_t)g->fams.n * MC_N_STATES * (size_t)g->world;
  int *fmap = malloc((size_t)(nmf + 1) * sizeof *fmap), *idx = malloc((n + 1) * sizeof *idx);
  if (!fmap || !idx) {
    free(fmap);
    free(idx);
    return mc_error("out of memory");
  }
  for (int i = 0; i < nmf; i++) fmap[i] = mc_family_find(&g->fams, mc_ckpt_family_at(ck, i)->name);
  for (size_t i = 0; i < n; i++) idx[i] = -1;
  for (int k = 0; k < ns; k++) {
    const mc_ckpt_shard *c = mc_ckpt_shard_at(ck, k);
    int f = c->family_index >= 0 && c->family_index < nmf ? fmap[c->family_index] : -1;
    if (f < 0 || c->rank < 0 || c->rank >= g->world) continue; /* the audit reports these */
    idx[((size_t)f * MC_N_STATES + (size_t)c->state) * (size_t)g->world + (size_t)c->rank] = k;
  }
  free(fmap);
  *out = idx;
  return 0;
}

void mc_rs_source_dtypes(mc_rs_source *s, mc_rs_plan *p) {
  for (int t = 0; t < p->n_tensors; t++) {
    mc_rs_tensor *tn = &p->tensors[t];
    int k = mc_ckpt_find_family(s->ck, s->g.fams.f[tn->fam].name);
    int dt = mc_ckpt_state_dtype(s->ck, k, tn->state);
    tn->src_dtype = dt >= 0 ? dt : MC_ELEM_F32; /* a tensor the checkpoint lacks: bind refuses it */
  }
}

int mc_rs_source_bind(mc_rs_source *s, const mc_rs_plan *p) {
  free(s->shards);
  s->shards = calloc((size_t)(p->n_src ? p->n_src : 1), sizeof *s->shards);
  if (!s->shards) return mc_error("out of memory");
  int *idx;
  if (mc_rs_shard_index(s->ck, &s->g, &idx) != 0) return -1;
  const char *dir = mc_ckpt_step_dir(s->ck);
  int rc = 0;
  for (int t = 0; t < p->n_tensors && rc == 0; t++) {
    const mc_rs_tensor *tn = &p->tensors[t];
    const mc_family *f = &s->g.fams.f[tn->fam];
    for (int i = tn->first_src; i < tn->first_src + tn->n_src && rc == 0; i++) {
      const mc_rs_shard *want = &p->src[i];
      int k = idx[((size_t)tn->fam * MC_N_STATES + (size_t)tn->state) * (size_t)s->g.world + (size_t)want->rank];
      const mc_ckpt_shard *rec = k >= 0 ? mc_ckpt_shard_at(s->ck, k) : NULL;
      if (!rec) {
        rc = mc_error("%s/manifest.json: no shard of %s/%s for primary rank %d", dir, f->name,
                      mc_state_name(tn->state), want->rank);
        break;
      }
      mc_box rec_box = mc_box_make(rec->ndim, rec->start, rec->count);
      if (!mc_box_equal(&rec_box, &want->slab)) {
        rc = mc_error("%s: dataset %s is not the hyperslab that rank %d owns under the recorded layout", rec->file,
                      rec->dataset, rec->rank);
        break;
      }
      int fi = file_index(s, rec->file);
      if (fi < 0) {
        rc = -1;
        break;
      }
      if (rec->dtype != tn->src_dtype) {
        rc = mc_error("%s: dataset %s is %s but the plan reads it as %s (mc_rs_source_dtypes not applied)", rec->file,
                      rec->dataset, mc_elem_dtype_name(rec->dtype), mc_elem_dtype_name(tn->src_dtype));
        break;
      }
      src_shard *sh = &s->shards[i];
      sh->rec = rec;
      sh->file = fi;
      mc_state_shape(f->ndim, f->shape, tn->state, sh->shape);
      sh->row = 1;
      for (int d = 1; d < rec->ndim; d++) sh->row *= rec->count[d];
    }
  }
  free(idx);
  /* Then file by file: the HDF5 attributes and data offsets of its shards. An open HDF5 file
   * costs about a megabyte of library caches, so one is open at a time, and a file's handle is
   * kept only if a shard in it must be read through HDF5: the memory of a reshard does not
   * grow with the number of rank files (raw reads need only the descriptor). */
  /* Whole-file hashes of every rank file first, in parallel (each is read whole anyway). */
  if (rc == 0 && mc_ckpt_check_files(s->ck) != 0) rc = -1;
  for (int fi = 0; fi < s->n_files && rc == 0; fi++) {
    src_file *sf = &s->files[fi];
    char path[MC_PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/%s", dir, sf->name);
    /* Verify before parsing: size and whole-file SHA-256 first (once per open). */
    if (sf->fid < 0 && (mc_ckpt_check_file(s->ck, sf->name) != 0 || mc_h5_open_read(path, &sf->fid) != 0)) {
      rc = -1;
      break;
    }
    int needed = 0;
    for (int i = 0; i < p->n_src && rc == 0; i++) {
      src_shard *sh = &s->shards[i];
      if (sh->file != fi || !sh->rec) continue;
      if (mc_h5_check_attrs(sf->fid, sh->rec->file, sh->rec, sh->shape) != 0) rc = -1;
      sh->raw_offset = mc_h5_raw_offset(sf->fid, sh->rec->dataset);
      needed |= sh->raw_offset < 0;
    }
    if (!needed) {
      mc_h5_close(sf->fid);
      sf->fid = -1;
    }
  }
  return rc;
}

int mc_rs_source_read(void *ctx, const mc_rs_plan *p, int i, int64_t off, int64_t n, float *buf) {
  mc_rs_source *s = (mc_rs_source *)((mc_rs_io_ctx *)ctx)->src;
  (void)p;
  const src_shard *sh = &s->shards[i];
  const src_file *f = &s->files[sh->file];
  if (sh->rec->dtype == MC_ELEM_I64) return mc_h5_read_stored(f->fid, sh->rec->file, sh->rec, buf); /* whole, as stored */
  if (sh->raw_offset >= 0) /* contiguous fp32 little-endian data: plain preads, outside the HDF5 lock */
    return mc_read_raw(f->fd, sh->raw_offset + off * 4, buf, n * 4, sh->rec->file, sh->rec->dataset);
  int64_t o[MC_CKPT_MAX_DIM] = {0}, c[MC_CKPT_MAX_DIM], z[MC_CKPT_MAX_DIM] = {0};
  for (int d = 0; d < sh->rec->ndim; d++) c[d] = sh->rec->count[d];
  o[0] = off / sh->row;
  c[0] = n / sh->row;
  return mc_h5_read_box(f->fid, sh->rec->file, sh->rec, o, c, buf, c, z);
}

int mc_rs_source_done(void *ctx, const mc_rs_plan *p, int i, const unsigned char sha[32]) {
  mc_rs_source *s = (mc_rs_source *)((mc_rs_io_ctx *)ctx)->src;
  (void)p;
  const mc_ckpt_shard *rec = s->shards[i].rec;
  char hex[65];
  mc_rs_hex(sha, hex);
  if (strcmp(hex, rec->sha256) != 0)
    return mc_error("%s/%s: source shard %s (%s/%s of rank %d) fails its SHA-256 check: manifest %.16s..., "
                    "data %.16s...; refusing to reshard a corrupted checkpoint",
                    mc_ckpt_step_dir(s->ck), rec->file, rec->dataset, rec->family, mc_state_name(rec->state),
                    rec->rank, rec->sha256, hex);
  return 0;
}
