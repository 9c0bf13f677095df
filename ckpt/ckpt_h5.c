/* Rank files: one plain HDF5 file per writing rank, one fp32 dataset per shard
 * ("/<family>/<state>") carrying its ownership and SHA-256 as attributes: contiguous, or
 * (checkpoint.compress = deflate) chunked in whole rows through HDF5's shuffle + deflate. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "core/box.h"
#include "core/dtype.h"
#include "util/fileio.h"
#include "util/error.h"

/* ---------------------------------------------------------------- HDF5 errors */

typedef struct {
  char text[512];
} h5_err_text;

static herr_t h5_err_walk(unsigned n, const H5E_error2_t *e, void *data) {
  h5_err_text *t = data;
  /* The deepest entry (n = 0) says what went wrong at the bottom; keep it. */
  if (n == 0 && e->desc) snprintf(t->text, sizeof t->text, "%s", e->desc);
  return 0;
}

/* The HDF5 library's own reason for the last failure, for our messages. */
static const char *h5_reason(h5_err_text *t) {
  t->text[0] = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_err_walk, t);
  if (!t->text[0]) snprintf(t->text, sizeof t->text, "HDF5 error");
  return t->text;
}

/* A rank file whose H5Fclose failed (a full disk while its metadata is flushed) stays open in
 * the library, which cannot drop it; HDF5's own clean-up at exit then flushes it again and
 * crashes (SIGSEGV inside H5_term_library). Every file MegaC writes is closed explicitly, and
 * a failed one is removed with its temporary directory, so that clean-up has nothing to do:
 * it is turned off before the library is first used (this runs when the program loads). */
#if defined(__GNUC__)
__attribute__((constructor)) static void h5_no_cleanup_at_exit(void) { H5dont_atexit(); }
#endif

/* The error stack is per thread in the thread-safe library: silence it on every entry. */
static void h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* ---------------------------------------------------------------- attribute helpers */

static int attr_write(hid_t obj, const char *name, hid_t ftype, hid_t mtype, int n, const void *v) {
  hsize_t dims[1] = {(hsize_t)n};
  hid_t sp = n < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL);
  hid_t a = sp < 0 ? -1 : H5Acreate2(obj, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
  int rc = (a >= 0 && H5Awrite(a, mtype, v) >= 0) ? 0 : -1;
  if (a >= 0) H5Aclose(a);
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

static int attr_str(hid_t obj, const char *name, const char *value) {
  /* Variable-length UTF-8 strings: h5py returns them as str, h5dump prints them plainly. */
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  int rc = attr_write(obj, name, t, t, -1, &value);
  H5Tclose(t);
  return rc;
}

static int attr_i64s(hid_t obj, const char *name, const int64_t *v, int n) {
  return attr_write(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, n, v);
}

static int attr_i32(hid_t obj, const char *name, int v) {
  return attr_write(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT, -1, &v);
}

static int attr_i32s(hid_t obj, const char *name, const int *v, int n) {
  return attr_write(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT, n, v);
}

/* An open attribute with its type class and number of values; closed by attr_close. */
typedef struct {
  hid_t a, ft;
  H5T_class_t cls;
  hssize_t n;
} attr_h;

static int attr_open(hid_t obj, const char *name, attr_h *h) {
  h->a = H5Aexists(obj, name) > 0 ? H5Aopen(obj, name, H5P_DEFAULT) : -1;
  if (h->a < 0) return -1;
  h->ft = H5Aget_type(h->a);
  hid_t sp = H5Aget_space(h->a);
  h->cls = h->ft >= 0 ? H5Tget_class(h->ft) : H5T_NO_CLASS;
  h->n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  if (sp >= 0) H5Sclose(sp);
  return 0;
}

static void attr_close(attr_h *h) {
  if (h->ft >= 0) H5Tclose(h->ft);
  H5Aclose(h->a);
}

/* Reads a string attribute (variable or fixed length). */
static int attr_read_str(hid_t obj, const char *name, char *buf, size_t cap) {
  attr_h h;
  if (attr_open(obj, name, &h) != 0) return -1;
  int rc = -1;
  if (h.cls == H5T_STRING && h.n == 1) {
    if (H5Tis_variable_str(h.ft) > 0) {
      hid_t mt = H5Tcopy(H5T_C_S1);
      H5Tset_size(mt, H5T_VARIABLE);
      H5Tset_cset(mt, H5Tget_cset(h.ft));
      char *s = NULL;
      if (H5Aread(h.a, mt, &s) >= 0 && s) {
        snprintf(buf, cap, "%s", s);
        rc = strlen(s) < cap ? 0 : -1;
        H5free_memory(s);
      }
      H5Tclose(mt);
    } else if (H5Tget_size(h.ft) + 1 <= cap) {
      memset(buf, 0, cap);
      if (H5Aread(h.a, h.ft, buf) >= 0) rc = 0;
    }
  }
  attr_close(&h);
  return rc;
}

/* Number of values of an attribute (-1 if absent). */
static int attr_len(hid_t obj, const char *name) {
  attr_h h;
  if (attr_open(obj, name, &h) != 0) return -1;
  attr_close(&h);
  return (int)h.n;
}

/* Reads an integer attribute of up to maxn values; *n gets the count (1 for scalars). */
static int attr_read_ints(hid_t obj, const char *name, hid_t mtype, void *out, int maxn, int *n) {
  attr_h h;
  if (attr_open(obj, name, &h) != 0) return -1;
  int rc = -1;
  if (h.cls == H5T_INTEGER && h.n >= 0 && h.n <= maxn && (h.n == 0 || H5Aread(h.a, mtype, out) >= 0)) {
    *n = (int)h.n;
    rc = 0;
  }
  attr_close(&h);
  return rc;
}

/* ---------------------------------------------------------------- element types */

/* A 16-bit little-endian float type: sign bit 15, `ebits` exponent bits above `mbits` mantissa
 * bits, bias 2^(ebits-1)-1, implied leading one (bfloat16: 8 and 7; IEEE half: 5 and 10).
 * HDF5 1.10 has no predefined half type, so both are built from fp32's. */
static hid_t float16_type(int ebits, int mbits) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0) return -1;
  if (H5Tset_fields(t, 15, (size_t)mbits, (size_t)ebits, 0, (size_t)mbits) < 0 || H5Tset_precision(t, 16) < 0 ||
      H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, (size_t)((1 << (ebits - 1)) - 1)) < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

/* The HDF5 type the format stores dtype `dt` as (a transient copy), or -1. fp8 is uint8 (the
 * dataset's `float8` attribute names the format). */
static hid_t stored_type(int dt) {
  switch (dt) {
    case MC_ELEM_F32: return H5Tcopy(H5T_IEEE_F32LE);
    case MC_ELEM_BF16: return float16_type(8, 7);
    case MC_ELEM_F16: return float16_type(5, 10);
    case MC_ELEM_F8_E4M3:
    case MC_ELEM_F8_E5M2: return H5Tcopy(H5T_STD_U8LE);
    case MC_ELEM_I64: return H5Tcopy(H5T_STD_I64LE);
    default: return -1;
  }
}

/* 1 if dataset d's type t is how the format stores dtype dt (and, for fp8, its `float8`
 * attribute names that format). */
static int is_stored_type(hid_t d, hid_t t, int dt) {
  hid_t want = stored_type(dt);
  int ok = want >= 0 && H5Tequal(t, want) > 0;
  if (want >= 0) H5Tclose(want);
  if (ok && (dt == MC_ELEM_F8_E4M3 || dt == MC_ELEM_F8_E5M2)) {
    char f8[16];
    ok = !attr_read_str(d, "float8", f8, sizeof f8) && !strcmp(f8, dt == MC_ELEM_F8_E4M3 ? "e4m3" : "e5m2");
  }
  return ok;
}

int64_t mc_h5_stored_type(int64_t file, int dtype) {
  h5_quiet();
  hid_t fid = (hid_t)file;
  if (dtype != MC_ELEM_BF16) return (int64_t)stored_type(dtype);
  /* bfloat16: one committed type per file, "/bfloat16", so a reader sees it named */
  if (H5Lexists(fid, "/bfloat16", H5P_DEFAULT) > 0) return (int64_t)H5Topen2(fid, "/bfloat16", H5P_DEFAULT);
  hid_t t = stored_type(dtype), tcpl = H5Pcreate(H5P_DATATYPE_CREATE);
  H5Pset_obj_track_times(tcpl, 0); /* byte-identical files, as every object of a rank file */
  int ok = t >= 0 && tcpl >= 0 && H5Tcommit2(fid, "bfloat16", t, H5P_DEFAULT, tcpl, H5P_DEFAULT) >= 0;
  if (tcpl >= 0) H5Pclose(tcpl);
  if (!ok && t >= 0) H5Tclose(t);
  return ok ? (int64_t)t : -1;
}

/* ---------------------------------------------------------------- writing */

int mc_h5_write_file_attrs(int64_t file, int64_t step, int rank) {
  hid_t fid = (hid_t)file;
  int64_t hdr[1] = {step};
  if (attr_str(fid, "format", "megac-checkpoint") || attr_i32(fid, "format_version", MC_CKPT_FORMAT_VERSION) ||
      attr_i64s(fid, "step", hdr, -1) || attr_i32(fid, "rank", rank))
    return -1;
  return 0;
}

int mc_h5_write_shard_attrs(int64_t dset, const mc_shard_attrs *a) {
  hid_t d = (hid_t)dset;
  const mc_ckpt_shard *s = &a->s;
  int rc = 0;
  rc |= attr_str(d, "family", s->family);
  rc |= attr_str(d, "state", mc_state_name(s->state));
  if (s->dtype < 0 || s->dtype >= MC_N_ELEM_DTYPES) return -1;
  rc |= attr_str(d, "dtype", mc_elem_dtype_name(s->dtype));
  /* fp8 is stored as uint8: the attribute says which of the two formats the bytes are */
  if (s->dtype == MC_ELEM_F8_E4M3 || s->dtype == MC_ELEM_F8_E5M2)
    rc |= attr_str(d, "float8", s->dtype == MC_ELEM_F8_E4M3 ? "e4m3" : "e5m2");
  rc |= attr_i64s(d, "global_shape", a->global_shape, s->ndim);
  rc |= attr_i64s(d, "start", s->start, s->ndim);
  rc |= attr_i64s(d, "count", s->count, s->ndim);
  rc |= attr_str(d, "placement_rule", a->placement_rule);
  rc |= attr_i32(d, "stage", s->stage);
  rc |= attr_i32s(d, "replica_group", s->replicas, s->n_replicas);
  rc |= attr_i32(d, "primary_rank", s->rank);
  rc |= attr_str(d, "sha256", s->sha256);
  /* format 3: the optimizer whose state this is; an unknown one would be unreadable */
  if (s->opt < 0 || s->opt >= MC_N_OPTS) return -1;
  rc |= attr_str(d, "optimizer", mc_opt_name(s->opt));
  return rc ? -1 : 0;
}

/* Writes a chunked dataset in slabs of whole chunk rows of at most MC_H5_SLAB_BYTES (one
 * chunk row at least). The HDF5 library is one lock: a training loop reading its token
 * batches (train/data.c) waits for whatever H5Dwrite holds it, so an asynchronous save must
 * not hold it for a whole 500 MB tensor at a time. Returns what H5Dwrite returns (< 0: failed). */
#define MC_H5_SLAB_BYTES ((hsize_t)8 << 20)
/* Largest chunk of a compressed shard, written and accepted (4 MiB). */
#define MC_H5_CHUNK_BYTES ((hsize_t)4 << 20)
/* Shards below this stay contiguous under deflate: a chunk index costs more than deflate
 * saves on a few KiB. */
#define MC_H5_DEFLATE_MIN_BYTES ((hsize_t)16 << 10)

/* Chunk extent of a compressed shard: whole rows (an index range of dim 0) of at most
 * MC_H5_CHUNK_BYTES; a row larger than that is cut on the next dimension, and so on. The
 * reader refuses chunks above MC_H5_CHUNK_BYTES (check_storage). */
static void chunk_dims(int ndim, const hsize_t *dims, hsize_t *chunk) {
  for (int k = 0; k < ndim; k++) chunk[k] = dims[k] > 0 ? dims[k] : 1;
  for (int k = 0; k < ndim; k++) {
    hsize_t inner = sizeof(float);
    for (int j = k + 1; j < ndim; j++) inner *= chunk[j];
    if (inner * chunk[k] <= MC_H5_CHUNK_BYTES) return;
    chunk[k] = inner <= MC_H5_CHUNK_BYTES ? MC_H5_CHUNK_BYTES / inner : 1;
    if (inner <= MC_H5_CHUNK_BYTES) return;
  }
}

/* crow: rows of dim 0 per chunk; slabs hold whole chunks, so no
 * chunk is written twice (HDF5 would read a partly written compressed chunk back). */
static herr_t write_in_slabs(hid_t d, hid_t file_space, int ndim, const hsize_t *dims, const void *data, hid_t mtype,
                             hsize_t crow) {
  const hsize_t esize = H5Tget_size(mtype);
  hsize_t row = esize; /* bytes of one index of dim 0 */
  for (int k = 1; k < ndim; k++) row *= dims[k];
  const hsize_t total = ndim > 0 ? dims[0] : 1;
  if (ndim == 0 || total * row <= MC_H5_SLAB_BYTES)
    return H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  hsize_t per = row >= MC_H5_SLAB_BYTES ? 1 : MC_H5_SLAB_BYTES / row;
  if (crow > 0) per = per < crow ? crow : per / crow * crow;
  hsize_t start[MC_CKPT_MAX_DIM] = {0}, count[MC_CKPT_MAX_DIM];
  for (int k = 0; k < ndim; k++) count[k] = dims[k];
  herr_t rc = 0;
  for (hsize_t r = 0; r < total && rc >= 0; r += per) {
    start[0] = r;
    count[0] = total - r < per ? total - r : per;
    hsize_t n = count[0] * (row / esize);
    hid_t mem = H5Screate_simple(1, &n, NULL);
    rc = mem < 0 ? -1 : H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL);
    if (rc >= 0) rc = H5Dwrite(d, mtype, mem, file_space, H5P_DEFAULT, (const char *)data + r * row);
    if (mem >= 0) H5Sclose(mem);
  }
  H5Sselect_all(file_space);
  return rc;
}

/* File access of a rank file, at creation and when it is reopened for the attributes: large
 * datasets start on 4 KiB boundaries so their pwrite/pread are page aligned; metadata is
 * gathered in 64 KiB blocks so it does not interleave with the data. */
static hid_t rank_file_access(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  H5Pset_alignment(fapl, 64 * 1024, 4096);
  H5Pset_meta_block_size(fapl, 64 * 1024);
  return fapl;
}

/* Creates dataset i of a rank file: contiguous with its space allocated now (offsets[i] gets
 * where its data goes), or chunked through shuffle + deflate (offsets[i] = -1; the data is
 * written by mc_h5_finish_rank_file). */
static int create_dataset(hid_t fid, hid_t gcpl, const char *path, const mc_ckpt_shard *s, int deflate, int64_t *offset) {
  h5_err_text et;
  char gname[MC_FAMILY_NAME_MAX + 2];
  snprintf(gname, sizeof gname, "/%s", s->family);
  hid_t g = H5Lexists(fid, gname, H5P_DEFAULT) > 0 ? H5Gopen2(fid, gname, H5P_DEFAULT)
                                                  : H5Gcreate2(fid, gname, H5P_DEFAULT, gcpl, H5P_DEFAULT);
  if (g < 0) return mc_error("%s: cannot create group %s: %s", path, gname, h5_reason(&et));
  hsize_t dims[MC_CKPT_MAX_DIM], chunk[MC_CKPT_MAX_DIM];
  for (int k = 0; k < s->ndim; k++) dims[k] = (hsize_t)s->count[k];
  hid_t sp = H5Screate_simple(s->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const int chunked = deflate > 0 && (hsize_t)s->numel * mc_elem_dtype_size(s->dtype) >= MC_H5_DEFLATE_MIN_BYTES;
  if (chunked) {
    /* Chunked in whole rows, shuffle (bytes of equal significance together) then deflate:
     * the one pipeline readers accept besides contiguous data (check_storage). */
    chunk_dims(s->ndim, dims, chunk);
    H5Pset_chunk(dcpl, s->ndim, chunk);
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, (unsigned)deflate);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_INCR);
  } else {
    /* Contiguous, allocated now: its offset is fixed before any data is written, so the
     * data goes out with pwrite outside the HDF5 library (ckpt_pwrite.c). */
    H5Pset_layout(dcpl, H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  }
  /* Never fill: every byte of the data is written once, by us. */
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_obj_track_times(dcpl, 0);
  /* a save writes fp32 states and int64 counters (s->dtype) */
  hid_t d = H5Dcreate2(g, mc_state_name(s->state), s->dtype == MC_ELEM_I64 ? H5T_STD_I64LE : H5T_IEEE_F32LE, sp,
                       H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Gclose(g);
  if (d < 0) return mc_error("%s: cannot create dataset %s: %s", path, s->dataset, h5_reason(&et));
  const haddr_t at = chunked ? HADDR_UNDEF : H5Dget_offset(d);
  *offset = at == HADDR_UNDEF ? -1 : (int64_t)at;
  int rc = 0;
  if (!chunked && s->numel > 0 && *offset < 0) rc = mc_error("%s: dataset %s has no data offset", path, s->dataset);
  if (H5Dclose(d) < 0 && rc == 0) rc = mc_error("%s: cannot close dataset %s: %s", path, s->dataset, h5_reason(&et));
  return rc;
}

int mc_h5_create_rank_file(const char *path, int64_t step, int rank, const mc_shard_attrs *attrs, int n, int deflate,
                           int64_t *offsets) {
  h5_quiet();
  h5_err_text et;
  hid_t fapl = rank_file_access();
  /* No object timestamps: the same state always gives byte-identical files. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  H5Pset_obj_track_times(fcpl, 0);
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(gcpl, 0);
  hid_t fid = H5Fcreate(path, H5F_ACC_EXCL, fcpl, fapl);
  if (fid < 0) mc_error("%s: cannot create HDF5 file: %s", path, h5_reason(&et));
  H5Pclose(fapl);
  H5Pclose(fcpl);
  if (fid < 0) {
    H5Pclose(gcpl);
    return -1;
  }
  int rc = 0;
  if (mc_h5_write_file_attrs((int64_t)fid, step, rank))
    rc = mc_error("%s: cannot write file attributes: %s", path, h5_reason(&et));
  for (int i = 0; i < n && rc == 0; i++) rc = create_dataset(fid, gcpl, path, &attrs[i].s, deflate, &offsets[i]);
  H5Pclose(gcpl);
  /* Closing flushes metadata and sets the file's size to cover every dataset: a full disk
   * shows up here too. */
  if (H5Fclose(fid) < 0 && rc == 0) rc = mc_error("%s: closing failed: %s", path, h5_reason(&et));
  return rc;
}

/* Writes the data of chunked dataset d (through the filters) and checks the layout. */
static int write_chunked(hid_t d, const char *path, const mc_ckpt_shard *s, const void *data) {
  h5_err_text et;
  hid_t dcpl = H5Dget_create_plist(d), sp = H5Dget_space(d);
  hsize_t dims[MC_CKPT_MAX_DIM], chunk[MC_CKPT_MAX_DIM];
  int ok = dcpl >= 0 && sp >= 0 && H5Sget_simple_extent_dims(sp, dims, NULL) == s->ndim &&
           H5Pget_chunk(dcpl, s->ndim, chunk) == s->ndim;
  int rc = 0;
  if (!ok) rc = mc_error("%s: dataset %s: cannot read its chunk extent: %s", path, s->dataset, h5_reason(&et));
  else if (write_in_slabs(d, sp, s->ndim, dims, data, s->dtype == MC_ELEM_I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT,
                          chunk[0]) < 0)
    rc = mc_error("%s: writing dataset %s failed: %s", path, s->dataset, h5_reason(&et));
  if (sp >= 0) H5Sclose(sp);
  if (dcpl >= 0) H5Pclose(dcpl);
  return rc;
}

int mc_h5_finish_rank_file(const char *path, const mc_shard_attrs *attrs, const void *const *data, int n) {
  h5_quiet();
  h5_err_text et;
  hid_t fapl = rank_file_access();
  hid_t fid = H5Fopen(path, H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  if (fid < 0) return mc_error("%s: cannot reopen to write the shard attributes: %s", path, h5_reason(&et));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const mc_ckpt_shard *s = &attrs[i].s;
    hid_t d = H5Dopen2(fid, s->dataset, H5P_DEFAULT);
    hid_t dcpl = d >= 0 ? H5Dget_create_plist(d) : -1;
    if (d < 0 || dcpl < 0) rc = mc_error("%s: cannot reopen dataset %s: %s", path, s->dataset, h5_reason(&et));
    else if (H5Pget_layout(dcpl) == H5D_CHUNKED) rc = write_chunked(d, path, s, data[i]);
    if (rc == 0 && mc_h5_write_shard_attrs((int64_t)d, &attrs[i]) != 0)
      rc = mc_error("%s: cannot write attributes of %s: %s", path, s->dataset, h5_reason(&et));
    if (dcpl >= 0) H5Pclose(dcpl);
    if (d >= 0) H5Dclose(d);
  }
  /* Closing flushes metadata: a full disk shows up here too. */
  if (H5Fclose(fid) < 0 && rc == 0) rc = mc_error("%s: closing failed: %s", path, h5_reason(&et));
  /* Writeback starts now; the caller fsyncs once every file is written, so the disk
   * flushes this file while the next one is being finished. */
  if (rc == 0) mc_start_writeback(path);
  return rc;
}

/* ---------------------------------------------------------------- scanning */

typedef struct {
  char (*names)[MC_FAMILY_NAME_MAX + 16];
  int n, cap;
  int bad;
} name_list;

static herr_t collect_state(hid_t g, const char *name, const H5L_info_t *info, void *data) {
  (void)g;
  (void)info;
  name_list *l = data;
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 64;
    void *nn = realloc(l->names, (size_t)nc * sizeof *l->names);
    if (!nn) return -1;
    l->names = nn;
    l->cap = nc;
  }
  /* The caller prefixes the family; here only the state name is stored. */
  if (strlen(name) >= sizeof l->names[0]) {
    l->bad = 1;
    return 0;
  }
  snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
  return 0;
}

static int64_t contiguous_offset(hid_t fid, hid_t d, int f32_only);

int mc_h5_scan_rank_file(const char *path, const char *file_name, mc_shard_attrs **out, int *n_out) {
  h5_quiet();
  h5_err_text et;
  *out = NULL;
  *n_out = 0;
  hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) return mc_error("%s: cannot open HDF5 file: %s", path, h5_reason(&et));
  name_list fams = {0};
  hsize_t idx = 0;
  int rc = 0;
  if (H5Literate(fid, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_state, &fams) < 0 || fams.bad)
    rc = mc_error("%s: cannot list its groups: %s", path, h5_reason(&et));
  mc_shard_attrs *recs = NULL;
  int n = 0, cap = 0;
  for (int f = 0; f < fams.n && rc == 0; f++) {
    /* the committed bfloat16 type of a file with bfloat16 datasets (mc_h5_stored_type) */
    H5O_info_t oi;
    if (!strcmp(fams.names[f], "bfloat16") && H5Oget_info_by_name(fid, "bfloat16", &oi, H5P_DEFAULT) >= 0 &&
        oi.type == H5O_TYPE_NAMED_DATATYPE)
      continue;
    hid_t g = H5Gopen2(fid, fams.names[f], H5P_DEFAULT);
    if (g < 0) {
      rc = mc_error("%s: /%s is not a group of shard datasets", path, fams.names[f]);
      break;
    }
    name_list states = {0};
    idx = 0;
    if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_state, &states) < 0 || states.bad)
      rc = mc_error("%s: cannot list group /%s", path, fams.names[f]);
    for (int k = 0; k < states.n && rc == 0; k++) {
      if (n == cap) {
        cap = cap ? 2 * cap : 64;
        mc_shard_attrs *nr = realloc(recs, (size_t)cap * sizeof *recs);
        if (!nr) {
          rc = mc_error("out of memory scanning %s", path);
          break;
        }
        recs = nr;
      }
      mc_shard_attrs *r = &recs[n];
      memset(r, 0, sizeof *r);
      n++;
      mc_ckpt_shard *s = &r->s;
      snprintf(s->file, sizeof s->file, "%s", file_name);
      snprintf(s->dataset, sizeof s->dataset, "/%s/%s", fams.names[f], states.names[k]);
      hid_t d = H5Dopen2(g, states.names[k], H5P_DEFAULT);
      if (d < 0) {
        rc = mc_error("%s: cannot open dataset %s: %s", path, s->dataset, h5_reason(&et));
        break;
      }
      char state[32], dtype[32];
      int na = 0, nb = 0, nc = 0, ns = 0, one = 0;
      const char *bad = NULL;
      int nrep = attr_len(d, "replica_group");
      int *replicas = malloc((size_t)(nrep > 0 ? nrep : 1) * sizeof(int));
      if (!replicas) {
        H5Dclose(d);
        rc = mc_error("out of memory scanning %s", path);
        break;
      }
      if (attr_read_str(d, "family", s->family, sizeof s->family)) bad = "family";
      else if (attr_read_str(d, "state", state, sizeof state) || mc_state_parse(state) < 0) bad = "state";
      else if (attr_read_str(d, "dtype", dtype, sizeof dtype) || (s->dtype = mc_elem_dtype_parse(dtype)) < 0) bad = "dtype";
      else if (attr_read_ints(d, "global_shape", H5T_NATIVE_INT64, r->global_shape, MC_CKPT_MAX_DIM, &na) || na < 1) bad = "global_shape";
      else if (attr_read_ints(d, "start", H5T_NATIVE_INT64, s->start, MC_CKPT_MAX_DIM, &nb) || nb != na) bad = "start";
      else if (attr_read_ints(d, "count", H5T_NATIVE_INT64, s->count, MC_CKPT_MAX_DIM, &nc) || nc != na) bad = "count";
      else if (attr_read_str(d, "placement_rule", r->placement_rule, sizeof r->placement_rule)) bad = "placement_rule";
      else if (attr_read_ints(d, "stage", H5T_NATIVE_INT, &s->stage, 1, &one) || one != 1) bad = "stage";
      else if (attr_read_ints(d, "primary_rank", H5T_NATIVE_INT, &s->rank, 1, &one) || one != 1) bad = "primary_rank";
      else if (attr_read_ints(d, "replica_group", H5T_NATIVE_INT, replicas, nrep, &ns) || ns < 1) bad = "replica_group";
      else if (attr_read_str(d, "sha256", s->sha256, sizeof s->sha256) || strlen(s->sha256) != 64) bad = "sha256";
      else if (attr_read_str(d, "optimizer", dtype, sizeof dtype) || (s->opt = mc_opt_parse(dtype)) < 0) bad = "optimizer";
      if (bad) {
        rc = mc_error("%s: dataset %s has a missing or malformed attribute '%s'", path, s->dataset, bad);
      } else {
        s->state = (mc_state)mc_state_parse(state);
        s->ndim = na;
        s->numel = 1;
        for (int j = 0; j < na; j++) s->numel *= s->count[j];
        s->n_replicas = ns;
        const int64_t at = contiguous_offset(fid, d, 0); /* the manifest's shards[].offset */
        s->offset = at > 0 ? at : 0;
        r->replica_buf = replicas;
        replicas = NULL;
        s->replicas = r->replica_buf;
        char expect[sizeof s->dataset + sizeof state + 2];
        snprintf(expect, sizeof expect, "/%s/%s", s->family, state);
        if (rc == 0 && strcmp(expect, s->dataset) != 0)
          rc = mc_error("%s: dataset %s says it holds %s", path, s->dataset, expect);
      }
      free(replicas);
      H5Dclose(d);
    }
    free(states.names);
    H5Gclose(g);
  }
  free(fams.names);
  H5Fclose(fid);
  if (rc) {
    mc_shard_attrs_free(recs, n);
    return rc;
  }
  *out = recs;
  *n_out = n;
  return 0;
}

void mc_shard_attrs_free(mc_shard_attrs *a, int n) {
  if (!a) return;
  for (int i = 0; i < n; i++) free(a[i].replica_buf);
  free(a);
}

/* ---------------------------------------------------------------- reading */

int mc_h5_threadsafe(void) {
  hbool_t ts = 0;
  return H5is_library_threadsafe(&ts) >= 0 && ts;
}

int mc_h5_open_read(const char *path, int64_t *fid_out) {
  h5_quiet();
  h5_err_text et;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (fid < 0) mc_error("%s: unreadable shard file (truncated or not HDF5): %s", path, h5_reason(&et));
  H5Pclose(fapl);
  if (fid < 0) return -1;
  *fid_out = (int64_t)fid;
  return 0;
}

void mc_h5_close(int64_t fid) {
  if (fid >= 0) H5Fclose((hid_t)fid);
}

static hid_t open_dataset(hid_t fid, const char *file_name, const mc_ckpt_shard *s) {
  char gname[MC_FAMILY_NAME_MAX + 2];
  snprintf(gname, sizeof gname, "/%s", s->family);
  if (H5Lexists(fid, gname, H5P_DEFAULT) <= 0 || H5Lexists(fid, s->dataset, H5P_DEFAULT) <= 0) {
    mc_error("%s: dataset %s is missing", file_name, s->dataset);
    return -1;
  }
  hid_t d = H5Dopen2(fid, s->dataset, H5P_DEFAULT);
  if (d < 0) {
    h5_err_text et;
    mc_error("%s: cannot open dataset %s: %s", file_name, s->dataset, h5_reason(&et));
  }
  return d;
}

/* The file's real size on disk (HDF5's own H5Fget_filesize also counts the end of
 * allocation its superblock claims). -1 if unknown. */
static int64_t real_file_size(hid_t fid) {
  char name[4096];
  ssize_t n = H5Fget_name(fid, name, sizeof name);
  struct stat st;
  if (n <= 0 || (size_t)n >= sizeof name || stat(name, &st) != 0) return -1;
  return (int64_t)st.st_size;
}

/* 1 if the dataset's filter pipeline is exactly shuffle then deflate (what the writer's
 * checkpoint.compress = deflate sets), 0 otherwise; names the filters found into `names`. */
static int is_shuffle_deflate(hid_t dcpl, int nfilters, char *names, size_t cap) {
  names[0] = 0;
  int ok = nfilters == 2;
  for (int i = 0; i < nfilters && i < 8; i++) {
    unsigned flags = 0, cd[8];
    size_t ncd = 8;
    char name[64] = "";
    H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof name, name, NULL);
    size_t used = strlen(names);
    snprintf(names + used, cap - used, "%s%s (id %d)", i ? ", " : "", name[0] ? name : "?", (int)id);
    if (!(i == 0 ? id == H5Z_FILTER_SHUFFLE : id == H5Z_FILTER_DEFLATE)) ok = 0;
  }
  return ok;
}

/* A compressed shard's chunks (the storage rule, chunked case): chunk extent of at most
 * MC_H5_CHUNK_BYTES, every chunk allocated (no fill values read), each stored chunk at most
 * its raw size plus deflate's overhead on incompressible data and inside the file, no filter
 * but shuffle and deflate skipped (HDF5 may store a chunk without an optional filter).
 * Inflating a forged chunk is thereby bounded by deflate's largest ratio (about 1032:1) times
 * that size until the hash check. Chunks are looked up by coordinate (a B-tree search each):
 * HDF5 1.10's lookup by index walks the index from the start, quadratic in the chunks. */
static int check_chunk_list(hid_t d, hid_t sp, const hsize_t *dims, const hsize_t *chunk, int nd,
                            const char *file_name, const char *dataset, hsize_t fsize, hsize_t esize) {
  hsize_t cbytes = esize, want = 1;
  int too_big = 0;
  for (int k = 0; k < nd && !too_big; k++) {
    /* bounded factors: cbytes <= 4 MiB and chunk[k] <= 4 MiB before each product */
    too_big = chunk[k] < 1 || chunk[k] > MC_H5_CHUNK_BYTES || (cbytes *= chunk[k]) > MC_H5_CHUNK_BYTES;
    if (!too_big) want *= (dims[k] + chunk[k] - 1) / chunk[k];
  }
  if (too_big)
    return mc_error("%s: dataset %s: chunks above %d bytes: refused", file_name, dataset, (int)MC_H5_CHUNK_BYTES);
  /* deflate may add a few bytes to incompressible data (zlib's compressBound) */
  const hsize_t cmax = cbytes + (cbytes >> 10) + 64;
  hsize_t nchunks = 0;
  if (H5Dget_num_chunks(d, sp, &nchunks) < 0 || nchunks != want)
    return mc_error("%s: dataset %s: %llu of its %llu chunks are stored (reads would return fill values): refused",
                    file_name, dataset, (unsigned long long)nchunks, (unsigned long long)want);
  hsize_t coff[H5S_MAX_RANK] = {0};
  for (hsize_t i = 0; i < nchunks; i++) {
    if (i > 0) /* the next chunk in row-major order */
      for (int k = nd - 1; k >= 0; k--) {
        coff[k] += chunk[k];
        if (coff[k] < dims[k]) break;
        coff[k] = 0;
      }
    hsize_t csize = 0;
    unsigned mask = 0;
    haddr_t at = HADDR_UNDEF;
    if (H5Dget_chunk_info_by_coord(d, coff, &mask, &at, &csize) < 0 || at == HADDR_UNDEF || csize > cmax ||
        (mask & ~3u) != 0 || at > fsize || fsize - at < csize)
      return mc_error("%s: dataset %s: chunk %llu (%llu bytes at offset %lld) is not a chunk of at most %llu bytes "
                      "inside the file (%llu bytes): refused",
                      file_name, dataset, (unsigned long long)i, (unsigned long long)csize,
                      at == HADDR_UNDEF ? -1LL : (long long)at, (unsigned long long)cmax, (unsigned long long)fsize);
  }
  return 0;
}

static int check_chunks(hid_t d, hid_t dcpl, const char *file_name, const char *dataset, hsize_t fsize, hsize_t esize) {
  hid_t sp = H5Dget_space(d);
  hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK];
  int nd = sp >= 0 ? H5Sget_simple_extent_dims(sp, dims, NULL) : -1;
  if (nd < 1 || nd > MC_CKPT_MAX_DIM || H5Pget_chunk(dcpl, nd, chunk) != nd) {
    if (sp >= 0) H5Sclose(sp);
    return mc_error("%s: dataset %s: unreadable chunk extent: refused", file_name, dataset);
  }
  int rc = check_chunk_list(d, sp, dims, chunk, nd, file_name, dataset, fsize, esize);
  H5Sclose(sp);
  return rc;
}

/* The storage rule of the format (docs/reliability.md): a shard's data is in this file (no
 * external storage, no virtual sources), allocated, inside the file, and either contiguous
 * and unfiltered (offset + size inside the file) or chunked through exactly shuffle +
 * deflate (check_chunks). Anything else could make HDF5 read other files, return fill
 * values or run other filters, and is refused before any data is read. The data must be
 * numel elements of `dtype` (numel times its size in bytes). */
static int check_storage(hid_t fid, hid_t d, const char *file_name, const char *dataset, int64_t numel, int dtype) {
  const int64_t esize = (int64_t)mc_elem_dtype_size(dtype), bytes = numel * esize;
  hid_t dcpl = H5Dget_create_plist(d);
  if (dcpl < 0) return mc_error("%s: dataset %s: cannot read its storage properties", file_name, dataset);
  H5D_layout_t layout = H5Pget_layout(dcpl);
  int nfilters = H5Pget_nfilters(dcpl);
  int next = H5Pget_external_count(dcpl);
  char names[256] = "";
  int pipeline = layout == H5D_CHUNKED && nfilters > 0 && is_shuffle_deflate(dcpl, nfilters, names, sizeof names);
  const char *why = NULL;
  if (layout == H5D_VIRTUAL) why = "is a virtual dataset (its data would come from other files)";
  else if (next != 0) why = "uses external storage (its data would come from other files)";
  else if (layout == H5D_CHUNKED && nfilters == 0) why = "is chunked without compression (not stored contiguously)";
  else if (layout == H5D_CHUNKED && !pipeline) why = NULL; /* named below, with its filters */
  else if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) why = "is not stored contiguously (compact)";
  else if (layout == H5D_CONTIGUOUS && nfilters != 0) why = "has filters on contiguous data";
  int64_t real = why ? 0 : real_file_size(fid);
  int rc = 0;
  if (why) {
    rc = mc_error("%s: dataset %s %s: refused, the format allows contiguous data inside the file, or chunks "
                  "through shuffle + deflate only", file_name, dataset, why);
  } else if (layout == H5D_CHUNKED && !pipeline) {
    rc = mc_error("%s: dataset %s has filters %s: refused, the format allows contiguous data inside the file, or "
                  "chunks through shuffle + deflate only", file_name, dataset, names);
  } else if (real < 0) {
    rc = mc_error("%s: cannot read its size", file_name);
  } else if (pipeline) {
    rc = check_chunks(d, dcpl, file_name, dataset, (hsize_t)real, (hsize_t)esize);
  } else {
    haddr_t at = H5Dget_offset(d);
    hsize_t size = H5Dget_storage_size(d);
    hsize_t fsize = (hsize_t)real;
    if (at == HADDR_UNDEF || (int64_t)size != bytes || at > fsize || fsize - at < size)
      rc = mc_error("%s: dataset %s: data at offset %lld, %lld bytes, is not %lld bytes inside the file (%lld bytes): refused",
                    file_name, dataset, at == HADDR_UNDEF ? -1LL : (long long)at, (long long)size, (long long)bytes,
                    (long long)fsize);
  }
  H5Pclose(dcpl);
  return rc;
}

int mc_h5_check_attrs(int64_t fid, const char *file_name, const mc_ckpt_shard *s, const int64_t *global_shape) {
  h5_quiet();
  hid_t d = open_dataset((hid_t)fid, file_name, s);
  if (d < 0) return -1;
  char str[128];
  int64_t v[MC_CKPT_MAX_DIM];
  int n = 0, one = 0, iv = 0;
  const char *bad = NULL;
  if (attr_read_str(d, "family", str, sizeof str) || strcmp(str, s->family)) bad = "family";
  else if (attr_read_str(d, "state", str, sizeof str) || strcmp(str, mc_state_name(s->state))) bad = "state";
  else if (attr_read_str(d, "dtype", str, sizeof str) || strcmp(str, mc_elem_dtype_name(s->dtype))) bad = "dtype";
  else if (attr_read_ints(d, "global_shape", H5T_NATIVE_INT64, v, MC_CKPT_MAX_DIM, &n) || n != s->ndim ||
           memcmp(v, global_shape, (size_t)n * sizeof *v))
    bad = "global_shape";
  else if (attr_read_ints(d, "start", H5T_NATIVE_INT64, v, MC_CKPT_MAX_DIM, &n) || n != s->ndim ||
           memcmp(v, s->start, (size_t)n * sizeof *v))
    bad = "start";
  else if (attr_read_ints(d, "count", H5T_NATIVE_INT64, v, MC_CKPT_MAX_DIM, &n) || n != s->ndim ||
           memcmp(v, s->count, (size_t)n * sizeof *v))
    bad = "count";
  else if (attr_read_ints(d, "stage", H5T_NATIVE_INT, &iv, 1, &one) || iv != s->stage) bad = "stage";
  else if (attr_read_ints(d, "primary_rank", H5T_NATIVE_INT, &iv, 1, &one) || iv != s->rank) bad = "primary_rank";
  else if (attr_read_str(d, "sha256", str, sizeof str) || strcmp(str, s->sha256)) bad = "sha256";
  /* format < 3 (opt -1) predates the attribute */
  else if (s->opt >= 0 && (attr_read_str(d, "optimizer", str, sizeof str) || strcmp(str, mc_opt_name(s->opt))))
    bad = "optimizer";
  int rc = 0;
  if (bad) {
    rc = mc_error("%s: attribute '%s' of dataset %s is missing, corrupt or disagrees with the manifest",
                  file_name, bad, s->dataset);
  } else {
    /* The stored array itself must be of the declared dtype with exactly the recorded extent. */
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    hsize_t dims[H5S_MAX_RANK];
    int nd = sp >= 0 ? H5Sget_simple_extent_dims(sp, dims, NULL) : -1;
    int ok = t >= 0 && is_stored_type(d, t, s->dtype) && nd == s->ndim;
    for (int k = 0; ok && k < nd; k++) ok = (int64_t)dims[k] == s->count[k];
    if (!ok)
      rc = mc_error("%s: dataset %s is not %s of the recorded count (its HDF5 type or extent disagrees with the "
                    "declared dtype and count)", file_name, s->dataset, mc_elem_dtype_name(s->dtype));
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (rc == 0) rc = check_storage((hid_t)fid, d, file_name, s->dataset, s->numel, s->dtype);
  }
  H5Dclose(d);
  return rc;
}

/* The offset of an open dataset's data when it is contiguous, unfiltered, not external and
 * lies inside the file; -1 otherwise. f32_only: also -1 unless it is fp32 little-endian. */
static int64_t contiguous_offset(hid_t fid, hid_t d, int f32_only) {
  int64_t off = -1;
  hid_t dcpl = H5Dget_create_plist(d);
  hid_t t = H5Dget_type(d);
  if (dcpl >= 0 && t >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 &&
      H5Pget_external_count(dcpl) == 0 && (!f32_only || H5Tequal(t, H5T_IEEE_F32LE) > 0)) {
    haddr_t a = H5Dget_offset(d);
    hsize_t size = H5Dget_storage_size(d);
    int64_t real = real_file_size(fid);
    if (a != HADDR_UNDEF && real >= 0 && a <= (hsize_t)real && (hsize_t)real - a >= size) off = (int64_t)a;
  }
  if (t >= 0) H5Tclose(t);
  if (dcpl >= 0) H5Pclose(dcpl);
  return off;
}

static int64_t dataset_offset(int64_t fid, const char *dataset, int f32_only) {
  h5_quiet();
  hid_t d = H5Dopen2((hid_t)fid, dataset, H5P_DEFAULT);
  if (d < 0) return -1;
  int64_t off = contiguous_offset((hid_t)fid, d, f32_only);
  H5Dclose(d);
  return off;
}

/* Only fp32 little-endian, contiguous and unfiltered data is the raw bytes we read as floats. */
int64_t mc_h5_raw_offset(int64_t fid, const char *dataset) { return dataset_offset(fid, dataset, 1); }

int64_t mc_h5_data_offset(int64_t fid, const char *dataset) { return dataset_offset(fid, dataset, 0); }

int mc_read_raw(int fd, int64_t at, void *dst, int64_t bytes, const char *file, const char *dataset) {
  const int64_t r = mc_pread_full(fd, dst, bytes, at);
  if (r != bytes)
    return mc_error("%s: reading dataset %s failed: %s", file, dataset, r < 0 ? strerror(errno) : "unexpected end of file");
  return 0;
}

/* Reads the box (off, cnt) of open dataset d as its stored bytes (little-endian elements of
 * s->dtype, row-major over cnt) into dst: the dataset's own type as the memory type, so HDF5
 * converts nothing. */
static int read_stored_box(hid_t d, const char *file_name, const mc_ckpt_shard *s, const int64_t *off,
                           const int64_t *cnt, void *dst) {
  h5_err_text et;
  hsize_t fo[MC_CKPT_MAX_DIM], fc[MC_CKPT_MAX_DIM];
  for (int k = 0; k < s->ndim; k++) fo[k] = (hsize_t)off[k], fc[k] = (hsize_t)cnt[k];
  hid_t t = H5Dget_type(d), fs = H5Dget_space(d), ms = H5Screate_simple(s->ndim, fc, NULL);
  int rc = 0;
  /* dst holds elements of the declared dtype: a dataset of another type is never read into it */
  if (t >= 0 && !is_stored_type(d, t, s->dtype))
    rc = mc_error("%s: dataset %s is not %s (its HDF5 type disagrees with the declared dtype)", file_name, s->dataset,
                  mc_elem_dtype_name(s->dtype));
  else if (t < 0 || fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, fo, NULL, fc, NULL) < 0 ||
           H5Dread(d, t, ms, fs, H5P_DEFAULT, dst) < 0)
    rc = mc_error("%s: reading dataset %s failed: %s", file_name, s->dataset, h5_reason(&et));
  if (t >= 0) H5Tclose(t);
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  return rc;
}

int mc_h5_read_stored(int64_t fid, const char *file_name, const mc_ckpt_shard *s, void *dst) {
  h5_quiet();
  hid_t d = open_dataset((hid_t)fid, file_name, s);
  if (d < 0) return -1;
  int64_t zero[MC_CKPT_MAX_DIM] = {0};
  int rc = check_storage((hid_t)fid, d, file_name, s->dataset, s->numel, s->dtype);
  if (rc == 0) rc = read_stored_box(d, file_name, s, zero, s->count, dst);
  H5Dclose(d);
  return rc;
}

/* A box of a dataset of a narrower dtype: its stored bytes, widened exactly to fp32, placed
 * at out_off of `out`. */
static int read_box_widening(hid_t d, const char *file_name, const mc_ckpt_shard *s, const int64_t *off,
                             const int64_t *cnt, float *out, const int64_t *out_dims, const int64_t *out_off) {
  int64_t n = 1;
  for (int k = 0; k < s->ndim; k++) n *= cnt[k];
  void *raw = malloc((size_t)(n > 0 ? n : 1) * mc_elem_dtype_size(s->dtype));
  float *wide = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  int rc = raw && wide ? read_stored_box(d, file_name, s, off, cnt, raw)
                       : mc_error("out of memory reading %s:%s", file_name, s->dataset);
  if (rc == 0) {
    mc_elem_widen(s->dtype, raw, wide, n);
    int64_t zero[MC_CKPT_MAX_DIM] = {0};
    mc_box src = mc_box_make(s->ndim, out_off, cnt), dst = mc_box_make(s->ndim, zero, out_dims);
    mc_box_copy(wide, &src, out, &dst, &src);
  }
  free(raw);
  free(wide);
  return rc;
}

int mc_h5_read_box(int64_t fid, const char *file_name, const mc_ckpt_shard *s, const int64_t *off,
                   const int64_t *cnt, float *out, const int64_t *out_dims, const int64_t *out_off) {
  h5_quiet();
  h5_err_text et;
  hid_t d = open_dataset((hid_t)fid, file_name, s);
  if (d < 0) return -1;
  /* Never let H5Dread follow external files or virtual sources, whoever calls. */
  if (check_storage((hid_t)fid, d, file_name, s->dataset, s->numel, s->dtype) != 0) {
    H5Dclose(d);
    return -1;
  }
  if (s->dtype != MC_ELEM_F32) {
    int rc = read_box_widening(d, file_name, s, off, cnt, out, out_dims, out_off);
    H5Dclose(d);
    return rc;
  }
  int whole = 1;
  hsize_t fo[MC_CKPT_MAX_DIM], fc[MC_CKPT_MAX_DIM], md[MC_CKPT_MAX_DIM], mo[MC_CKPT_MAX_DIM];
  for (int k = 0; k < s->ndim; k++) {
    fo[k] = (hsize_t)off[k];
    fc[k] = (hsize_t)cnt[k];
    md[k] = (hsize_t)out_dims[k];
    mo[k] = (hsize_t)out_off[k];
    if (off[k] != 0 || cnt[k] != s->count[k] || out_dims[k] != cnt[k] || out_off[k] != 0) whole = 0;
  }
  int rc = 0;
  if (whole) {
    if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
      rc = mc_error("%s: reading dataset %s failed: %s", file_name, s->dataset, h5_reason(&et));
  } else {
    hid_t fs = H5Dget_space(d);
    hid_t ms = H5Screate_simple(s->ndim, md, NULL);
    if (fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, fo, NULL, fc, NULL) < 0 ||
        H5Sselect_hyperslab(ms, H5S_SELECT_SET, mo, NULL, fc, NULL) < 0 ||
        H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out) < 0)
      rc = mc_error("%s: reading a hyperslab of dataset %s failed: %s", file_name, s->dataset, h5_reason(&et));
    if (fs >= 0) H5Sclose(fs);
    if (ms >= 0) H5Sclose(ms);
  }
  H5Dclose(d);
  return rc;
}
