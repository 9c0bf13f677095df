/* The checkpoint format: rank files and the primitives that read and write them
 * (docs/checkpoint.md, "Rank files"; "Public headers" lists what each header offers).
 *
 * ckpt/checkpoint.h is the library (save, open, read a hyperslab). This header is for
 * programs that write or read rank files themselves, shard by shard, exactly as the
 * library does: the streaming resharder (reshard/), the auditor, tests and benchmarks.
 * Everything here links with the checkpoint library (mc_ckpt); nothing else in ckpt/ is
 * public (ckpt/ckpt_internal.h is private to the .c files of ckpt/).
 *
 * Conventions, unless a declaration says otherwise:
 * - HDF5 ids are passed as int64_t (an hid_t widened), so HDF5's headers stay out of here;
 *   an id is only valid in the process that opened it.
 * - Functions returning int give 0 on success or -1 with a message set by mc_error
 *   (util/error.h, per thread) that names the file and, where there is one, the dataset.
 * - Paths are at most MC_PATH_MAX bytes; nothing here keeps a pointer passed to it. */
#ifndef MC_CKPT_FORMAT_H
#define MC_CKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/checkpoint.h"

/* ---------------------------------------------------------------- shard hash */

/* hex = lowercase hex SHA-256 of len bytes at data, NUL-terminated (65 bytes). This is the
 * `sha256` of a shard when data is its stored bytes: its elements in its dtype (float32,
 * bfloat16, ...: core/dtype.h), row-major, little-endian. Cannot fail. */
void mc_sha256_hex(const void *data, size_t len, char hex[65]);

/* ---------------------------------------------------------------- writing rank files */

/* The attribute values of one shard dataset: the shard record plus what only the rank file
 * carries. Writers fill it and pass it to mc_h5_write_shard_attrs; the library's save path
 * also fills it when it reads a rank file back. */
typedef struct {
  mc_ckpt_shard s;                        /* family, state, ndim, start, count, stage, rank,
                                           * replicas (n_replicas of them), sha256 */
  int64_t global_shape[MC_CKPT_MAX_DIM];  /* the family's shape (ndim values) */
  char placement_rule[MC_CKPT_RULE_MAX];  /* e.g. "tp(dim=0) x zero_balanced(dim=0)" */
  int *replica_buf; /* library use: owns s.replicas while the library scans a file; writers
                     * leave it NULL and keep s.replicas owned by themselves */
} mc_shard_attrs;

/* Writes the attributes of one shard dataset (`dset`, an open HDF5 dataset id) exactly as
 * the library's rank files carry them: family, state, dtype, global_shape, start, count,
 * placement_rule, stage, replica_group, primary_rank, sha256, optimizer (docs/checkpoint.md,
 * the attribute table; optimizer = mc_opt_name(s.opt), so s.opt must be an mc_opt_kind: the
 * family's optimizer). Reads `a` only (s.replicas must point at s.n_replicas ranks). For
 * writers that create and fill datasets themselves. Returns 0, or -1 WITHOUT a message: the
 * caller names the file and dataset. An attribute that already exists makes it fail. */
int mc_h5_write_shard_attrs(int64_t dset, const mc_shard_attrs *a);

/* The HDF5 type to create a dataset of element dtype `dtype` (mc_elem_dtype) with in the open
 * rank file `file` (docs/checkpoint.md, "Element dtypes"): IEEE fp32 little-endian; for
 * bfloat16 the file's committed type "/bfloat16" (committed by the first call for the file:
 * a 16-bit float, sign bit 15, 8 exponent bits at bit 7, 7 mantissa bits, bias 127); for
 * float16 an IEEE half (HDF5 1.10 has none predefined); for the fp8 formats uint8, and the
 * dataset's `float8` attribute (written by mc_h5_write_shard_attrs from s.dtype) names the
 * format. Returns a type id to close with H5Tclose, or -1 WITHOUT a message. */
int64_t mc_h5_stored_type(int64_t file, int dtype);

/* Writes a rank file's own attributes to an open HDF5 file id: format = "megac-checkpoint",
 * format_version = MC_CKPT_FORMAT_VERSION, step, rank. Returns 0, or -1 WITHOUT a message
 * (the caller names the file). */
int mc_h5_write_file_attrs(int64_t file, int64_t step, int rank);

/* ---------------------------------------------------------------- reading rank files */

/* Opens a rank file read-only; *fid receives its HDF5 id, to be closed with mc_h5_close.
 * Error: "<path>: unreadable shard file (truncated or not HDF5): <HDF5's reason>". */
int mc_h5_open_read(const char *path, int64_t *fid);
/* Closes a file opened by mc_h5_open_read; a negative id is ignored. */
void mc_h5_close(int64_t fid);

/* Checks dataset s->dataset of an open rank file against the manifest's record `s` and the
 * family's global shape (s->ndim values): every attribute except placement_rule and
 * replica_group must equal the record (optimizer: mc_opt_name(s->opt); not checked when
 * s->opt is -1, a checkpoint of format < 3; dtype: mc_elem_dtype_name(s->dtype)), and the
 * stored array must be of the HDF5 type the format stores s->dtype as (mc_h5_stored_type;
 * fp8: uint8 with the `float8` attribute naming the format), of extent s->count. Reads nothing but attributes and the dataset's type and extent.
 * file_name only names the file in messages. Errors: "<file>: dataset <d> is missing",
 * "<file>: attribute '<name>' of dataset <d> is missing, corrupt or disagrees with the
 * manifest" (the first mismatch), "<file>: dataset <d> is not <dtype> of the recorded count ...",
 * then the storage rule (contiguous and unfiltered, or chunks through exactly shuffle +
 * deflate: docs/reliability.md): "<file>: dataset <d> ...: refused". */
int mc_h5_check_attrs(int64_t fid, const char *file_name, const mc_ckpt_shard *s,
                      const int64_t *global_shape);

/* The byte offset of a dataset's data in its file when it is contiguous, unfiltered fp32
 * little-endian data (float32 only: a dataset of another dtype gives -1) (the shard's hashed bytes, row-major), else -1, also when the dataset
 * cannot be opened (no message is set). Such data can be read with mc_read_raw: plain
 * preads, which do not take the HDF5 library's global lock and so run in parallel. */
int64_t mc_h5_raw_offset(int64_t fid, const char *dataset);

/* The byte offset of a dataset's data in its file when it is contiguous and unfiltered, of any
 * dtype (what a format 6 manifest records as the shard's `offset`), else -1, also when the
 * dataset cannot be opened (no message is set). */
int64_t mc_h5_data_offset(int64_t fid, const char *dataset);

/* pread of `bytes` bytes at offset `at` of fd into dst, retried until complete (EINTR and
 * short reads). file and dataset only name the data in messages. Error: "<file>: reading
 * dataset <d> failed: <strerror, or 'unexpected end of file'>"; dst is then partly written. */
int mc_read_raw(int fd, int64_t at, void *dst, int64_t bytes, const char *file, const char *dataset);

/* Reads the box (off, cnt) of dataset s->dataset (offsets relative to the shard, s->ndim
 * values each) through HDF5 into `out`, a row-major fp32 array of extent out_dims, with the
 * box placed at out_off; the rest of `out` is not touched. A dataset of a narrower dtype
 * (s->dtype) is widened exactly (core/dtype.h). Whole shard: off = 0,
 * cnt = s->count, out_dims = s->count, out_off = 0. The caller owns `out`. Errors name the
 * file and dataset ("... is missing", "reading [a hyperslab of] dataset ... failed: ..."). */
int mc_h5_read_box(int64_t fid, const char *file_name, const mc_ckpt_shard *s,
                   const int64_t *off, const int64_t *cnt, float *out, const int64_t *out_dims,
                   const int64_t *out_off);

/* Reads the whole shard s->dataset as its stored bytes (s->numel elements of s->dtype,
 * little-endian, row-major: what its `sha256` hashes) into dst, after the storage rule. Errors
 * as mc_h5_read_box's. */
int mc_h5_read_stored(int64_t fid, const char *file_name, const mc_ckpt_shard *s, void *dst);

/* ---------------------------------------------------------------- files and directories */

/* The durable-file steps of the commit protocol, for tools that commit a directory of
 * their own (mcreshard writes a new run directory and renames it into place). */

/* 1 if `path` exists (stat succeeds), else 0. Sets no message. */
int mc_path_exists(const char *path);
/* fsyncs a file (is_dir = 0) or a directory (is_dir = 1). Errors: "<path>: cannot open for
 * fsync: ...", "<path>: fsync failed: ...". */
int mc_fsync_path(const char *path, int is_dir);
/* Removes a file or a whole directory tree (like rm -rf; symbolic links are removed, not
 * followed). A missing path is success. On error it goes on removing what it can, then
 * returns -1 with the message of a failure ("<path>: cannot remove ...: ..."). */
int mc_rmtree(const char *path);

#endif
