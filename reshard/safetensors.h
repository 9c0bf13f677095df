/* The safetensors file format (what other ecosystems load): an 8-byte little-endian header
 * length, a JSON header mapping each tensor name to {"dtype", "shape", "data_offsets"} plus
 * an optional "__metadata__" object of strings, then the raw little-endian data. Tensors are F32, BF16 or F16 (dtype
 * and esize below; written: F32 or BF16; read: all three). Writes go to "<path>.tmp" and are renamed into
 * place on close, so a failed export leaves no file. */
#ifndef MC_RESHARD_SAFETENSORS_H
#define MC_RESHARD_SAFETENSORS_H

#include <stdint.h>

#define MC_ST_NAME_MAX 128

typedef struct {
  char name[MC_ST_NAME_MAX];
  int ndim;
  int64_t shape[3];
  char dtype[8];  /* "F32" (also when left empty at creation), "BF16", "F16" */
  int esize;      /* bytes per element: 4 or 2 (filled by mc_st_create and mc_st_open) */
  int64_t offset; /* byte offset of the data from the start of the data region */
  int64_t bytes;
} mc_st_tensor;

typedef struct {
  int n_meta;
  char (*meta_key)[MC_ST_NAME_MAX];
  char **meta_val; /* malloc'd strings */
} mc_st_meta;

typedef struct {
  int fd;
  char path[1100], tmp[1100];
  int64_t data_start; /* file offset of the data region */
  int n;
  mc_st_tensor *t;
  mc_st_meta meta;
} mc_st_file;

void mc_st_meta_free(mc_st_meta *m);
int mc_st_meta_add(mc_st_meta *m, const char *key, const char *val);
const char *mc_st_meta_get(const mc_st_meta *m, const char *key); /* NULL if absent */

/* Creates the file: writes the header for `n` tensors laid out in the given order (offsets
 * are filled in) and sizes the data region. Data then goes in with mc_st_pwrite (any order,
 * any thread). `meta` may be NULL. */
int mc_st_create(mc_st_file *f, const char *path, const mc_st_tensor *t, int n, const mc_st_meta *meta);
int mc_st_pwrite(mc_st_file *f, int idx, int64_t byte_off, const void *data, int64_t bytes);
/* Rewrites the header with new metadata values of the same lengths (e.g. hashes filled in
 * once the data is written over placeholders). */
int mc_st_update_meta(mc_st_file *f, const mc_st_meta *meta);
/* fsyncs and renames into place. */
int mc_st_commit(mc_st_file *f);
/* Removes the temporary file of an uncommitted export. */
void mc_st_abort(mc_st_file *f);

/* dtype conversions: core/dtype.h (mc_bf16_of_f32, mc_f32_of_bf16, mc_f32_of_f16). */

/* Element size of a safetensors dtype this library reads ("F32" 4, "BF16" and "F16" 2), or 0. */
int mc_st_dtype_size(const char *dtype);

/* Opens and validates an existing file (header length, JSON, dtype F32/BF16/F16, shapes against
 * data_offsets, offsets inside the file and non-overlapping); errors name the file and tensor. */
int mc_st_open(mc_st_file *f, const char *path);
int mc_st_find(const mc_st_file *f, const char *name); /* index or -1 */
int mc_st_pread(const mc_st_file *f, int idx, int64_t byte_off, void *data, int64_t bytes);
void mc_st_close(mc_st_file *f);

#endif
