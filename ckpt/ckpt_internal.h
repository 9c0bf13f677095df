/* Pieces shared by the checkpoint save and load paths, private to the .c files of ckpt/:
 * not a public interface. What other modules may use of the format is in ckpt/format.h. */
#ifndef MC_CKPT_CKPT_INTERNAL_H
#define MC_CKPT_CKPT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "ckpt/format.h"
#include "util/pool.h"

/* ---------------------------------------------------------------- hashing (ckpt_hash.c) */
/* mc_sha256_hex: ckpt/format.h. */

/* The worker pool (mc_pool_start, mc_parallel): util/pool.h. */

/* SHA-256 fed piece by piece (a shard hashed as it is written); begin returns NULL when out
 * of memory; end frees the state. */
typedef struct mc_sha256 mc_sha256;
mc_sha256 *mc_sha256_begin(void);
void mc_sha256_update(mc_sha256 *h, const void *data, size_t len);
void mc_sha256_end(mc_sha256 *h, char hex[65]);

/* Piece digests of files (format version 5, docs/checkpoint.md "manifest.json"): a file of
 * `bytes` bytes is cut into consecutive pieces of piece_bytes bytes (the last one shorter),
 * each hashed with SHA-256 on its own, so the pieces of one file are hashed on several
 * threads. */
#define MC_PIECE_BYTES_MIN ((int64_t)4096)
#define MC_PIECE_BYTES_MAX ((int64_t)1 << 30)
/* ceil(bytes / piece_bytes); 0 for an empty file. */
int64_t mc_piece_count(int64_t bytes, int64_t piece_bytes);
/* 1 if piece_bytes is a piece size a manifest may record: a multiple of MC_PIECE_BYTES_MIN
 * from MC_PIECE_BYTES_MIN to MC_PIECE_BYTES_MAX. */
int mc_piece_bytes_check(int64_t piece_bytes);
/* files[].pieces_sha256: the SHA-256 of the n digests' 32-byte values, concatenated in order. */
void mc_pieces_root(const char (*pieces)[65], int64_t n, char hex[65]);

/* One file to hash or verify piece by piece. Every file is opened O_NONBLOCK and must be a
 * regular file of `bytes` bytes whenever a piece of it is read. */
typedef struct {
  const char *path;
  int64_t bytes;        /* hash: set to the file's size; verify: the recorded size */
  int64_t piece_bytes;
  int64_t n_pieces;     /* mc_piece_count(bytes, piece_bytes) */
  char (*pieces)[65];   /* hash: malloc'd and filled (the caller frees); verify: the recorded digests */
  int whole;            /* verify: one piece that is the whole file (format <= 4's files[].sha256) */
  char *err;            /* verify: the message of the file's first failing piece (malloc'd), or NULL */
  int64_t err_piece;
  int64_t lo, hi;       /* verify: only pieces [lo, hi) when hi > 0 (a part of the file's check) */
} mc_piece_file;
/* Opens `path` for reading a piece (O_NONBLOCK): it must be a regular file of `size` bytes,
 * else -1 naming it (verify: "... bytes but the manifest records ..."; else "changed size"). */
int mc_piece_open(const char *path, int64_t size, int verify, int *fd);
/* Sets the error of piece k of f hashing to hex instead of f->pieces[k]: "<path>: hash mismatch
 * in piece k of n (bytes a to b): it hashes to X, the manifest records Y ..." (whole: "<path>:
 * whole-file hash mismatch ..."). Returns -1. */
int mc_piece_mismatch(const mc_piece_file *f, int64_t k, const char *hex);
/* Records the current message as f's error if piece k is its first failing one (under mu). */
void mc_piece_note_error(pthread_mutex_t *mu, mc_piece_file *f, int64_t k);
/* Hashes every piece of files[0..n) on `threads` threads, pieces of one file on several at
 * once: sets bytes, n_pieces and pieces. Errors name the file. */
int mc_pieces_hash(mc_piece_file *files, int n, int threads);
/* Hashes every piece of files[0..n) on `threads` threads and compares it with the recorded
 * digest. Each failing file gets `err`: "<path>: hash mismatch in piece k of n (bytes a to b): it hashes to X,
 * the manifest records Y ..." (whole: "<path>: whole-file hash mismatch ..."), or the size
 * mismatch. Returns 0 if every piece matches, else -1 with a failing file's message. */
int mc_pieces_verify(mc_piece_file *files, int n, int threads);

/* ---------------------------------------------------------------- one-pass reading (ckpt_stream.c) */

/* A shard whose data a stream lands: `bytes` stored bytes at `offset` of file `file` (an index
 * into the stream's files), copied to dst, or, when dst is NULL, to a temporary buffer
 * allocated when its first byte lands and freed once complete() has returned. */
typedef struct {
  int file;
  int64_t offset, bytes;
  const char *name; /* names it in messages: its dataset */
  void *dst;
  char *err; /* out: complete()'s message if it failed (malloc'd; the caller frees) */
} mc_stream_shard;
/* The size of a one-pass read: the unit of hashing and copying between the disk's reads, so
 * about what is left to hash when the last byte arrives, and the size of each reading thread's
 * buffer (it was the piece, 64 MiB by default). */
#define MC_STREAM_READ_BYTES ((int64_t)8 << 20)
/* Called once per shard, by the thread that hashed its last byte, with its bytes (dst or the
 * temporary buffer) and their SHA-256 (hex): 0, or -1 with mc_error set, which is kept in
 * shards[k].err and does not stop the stream (the caller decides which error of a file to
 * report first). */
typedef int (*mc_stream_complete_fn)(void *user, int k, const void *data, const char hex[65]);
/* Called on the caller's thread, in file order, for each file every piece of which was read and
 * matched its digest, while the stream goes on with later files (so the file may be parsed). */
typedef void (*mc_stream_file_fn)(void *user, int file);
/* Verify-and-read in one pass: every piece of files[0..n_files) (format 5 piece digests) is
 * read once, `read_bytes` at a time (rounded down to a divisor of the piece size), on 2 x
 * `threads` threads (reads block); each read is added to its piece's hash and the bytes of
 * every shard it overlaps are copied out and added to that shard's hash in order, so a shard
 * completes (complete()) as soon as its last byte is read and hashed. A piece's digest is
 * compared after its last read: the bytes of a piece that then fails may already be in dst.
 * The first failing piece of a file is in its `err` (mc_pieces_verify's message), and reading
 * stops at the first failure. Shards of one file must not overlap (refused naming both).
 * file_done (may be NULL): see its type. Returns 0 if every piece matched, else -1 with the
 * message of a failing piece. */
int mc_stream_files(mc_piece_file *files, int n_files, mc_stream_shard *shards, int n_shards, int threads,
                    int64_t read_bytes, mc_stream_complete_fn complete, mc_stream_file_fn file_done, void *user);

/* ---------------------------------------------------------------- files (ckpt_fs.c) */
/* mc_path_exists, mc_fsync_path, mc_rmtree: ckpt/format.h. */
/* out (MC_PATH_MAX bytes) = dir/name; -1 with an error if it does not fit. */
int mc_path_join(char *out, const char *dir, const char *name);
/* Asks the kernel to start writing a file's dirty pages back, without waiting (best effort). */
void mc_start_writeback(const char *path);
int mc_mkdir_p(const char *path);
/* Writes a whole file and fsyncs it; fault points name the write and the fsync. */
int mc_write_file_durable(const char *path, const void *data, size_t len,
                          const char *fault_write, const char *fault_fsync);
/* Reads a whole file (NUL-terminated); caller frees. Only a regular file is read (a FIFO,
 * device or directory is refused without blocking: it is opened O_NONBLOCK), and one larger
 * than MC_METADATA_MAX bytes is refused unread. */
#define MC_METADATA_MAX ((size_t)16 << 20)
int mc_read_file(const char *path, char **data, size_t *len);
/* The same with another cap (manifest.json: MC_MANIFEST_MAX). */
#define MC_MANIFEST_MAX ((size_t)256 << 20)
int mc_read_file_max(const char *path, size_t max, char **data, size_t *len);
int mc_file_size(const char *path, int64_t *size);

/* Fault injection: 0 if `point` is not armed, else -1 with an ENOSPC error (or the process
 * exits with status 3 for a crash fault). */
int mc_ckpt_fault(const char *point);

/* ---------------------------------------------------------------- rank files (ckpt_h5.c) */

/* mc_shard_attrs, mc_h5_write_shard_attrs, mc_h5_write_file_attrs and the readers
 * (mc_h5_open_read, mc_h5_close, mc_h5_check_attrs, mc_h5_raw_offset, mc_read_raw,
 * mc_h5_read_box): ckpt/format.h. */

/* A rank file is written in three steps, so that its data does not go through the HDF5
 * library (one global lock) and several threads write at once (mc_write_rank_files):
 * 1. mc_h5_create_rank_file creates `path` with its file attributes and every shard's dataset,
 *    closed again. deflate 0: contiguous datasets with their space allocated, offsets[i] = the
 *    file offset of shard i's data (-1 when it has no elements); 1-9: datasets of 16 KiB or
 *    more chunked in whole rows (at most 4 MiB a chunk) through shuffle + deflate at that
 *    level (offsets[i] = -1), smaller ones contiguous.
 * 2. the caller writes each contiguous shard's bytes at its offset (pwrite) and hashes it.
 * 3. mc_h5_finish_rank_file reopens the file, writes the chunked datasets' data through HDF5
 *    and every dataset's attributes (attrs[i].s.sha256 must be final), closes it and starts its
 *    writeback without waiting: the caller fsyncs it. */
int mc_h5_create_rank_file(const char *path, int64_t step, int rank, const mc_shard_attrs *attrs, int n, int deflate,
                           int64_t *offsets);
int mc_h5_finish_rank_file(const char *path, const mc_shard_attrs *attrs, const void *const *data, int n);
/* Reads back the attributes of every shard dataset in a rank file (in name order).
 * *out is malloc'd; free with mc_shard_attrs_free. */
int mc_h5_scan_rank_file(const char *path, const char *file_name, mc_shard_attrs **out, int *n);
void mc_shard_attrs_free(mc_shard_attrs *a, int n);

/* 1 if the HDF5 library may be called from several threads (a thread-safe build). */
int mc_h5_threadsafe(void);

/* ---------------------------------------------------------------- writing the data (ckpt_pwrite.c) */

/* Writes the rank files of attrs[0..n) (grouped by rank: consecutive shards of one rank make
 * one file, attrs[i].s.file, in dir), data[i] holding shard i's fp32 elements. Contiguous data
 * goes out with pwrite at the offsets HDF5 allocated, on `threads` threads, each shard hashed
 * by the thread that writes it; attrs[i].s.sha256 gets every shard's hash. Files are closed
 * and their writeback started, not fsynced. Errors name the file and dataset. */
int mc_write_rank_files(const char *dir, int64_t step, mc_shard_attrs *attrs, const void *const *data, int n,
                        int threads, int deflate);

/* ---------------------------------------------------------------- manifest (ckpt_manifest.c) */

/* An item (family and state in range) of a state kind its family has (mc_family_has_state),
 * else -1 with "checkpoint item <family>/<state> of rank <r>: family <family> is trained by
 * <optimizer>, which keeps no <state> state". */
int mc_ckpt_item_state_check(const mc_geometry *g, const mc_ckpt_item *it);
/* cfg's optim.groups assigns every family of g the optimizer g has, else -1 naming the first
 * family that differs and both optimizers. */
int mc_ckpt_check_optimizers(const mc_geometry *g, const mc_config *cfg);

typedef struct {
  char name[32];
  int64_t bytes;
  int rank;
  char sha256[65]; /* format <= 4: whole-file SHA-256 (hex); empty when the manifest predates it */
  /* format 5: the piece digests; piece_bytes 0 when the entry has none (a metadata-only
   * checkpoint) */
  int64_t piece_bytes;
  int64_t n_pieces;
  char (*pieces)[65];     /* malloc'd, n_pieces digests */
  char pieces_sha256[65]; /* mc_pieces_root of pieces */
} mc_file_rec;

/* Everything the manifest holds, parsed. */
typedef struct {
  int format_version;
  int own_rule;       /* layout.ownership_rule (MC_OWN_*); format version 1: MC_OWN_CHUNKED */
  int64_t step;
  char *config_json;  /* the config section, printed */
  char *model_json;   /* the model section, printed */
  mc_train_state state;
  int n_fams;
  mc_ckpt_family *fams;
  int n_shards;
  mc_ckpt_shard *shards;
  int *replica_pool;  /* backing store of shards[i].replicas */
  int n_files;
  mc_file_rec *files;
  int has_state[MC_N_STATES]; /* the state kinds stored (`states`) */
  /* optimizer_groups[].states[].dtype: the element dtype (mc_elem_dtype) optimizer k's
   * families store kind s in (0, float32, where undeclared; param: each family's dtype) */
  int state_dtype[MC_N_OPTS][MC_N_STATES];
} mc_manifest;

/* Builds the manifest text from the geometry and the shards read back from the rank files;
 * checks that the shards are exactly the primary hyperslabs mc_shard_of gives (every family
 * of every saved state present once). Caller frees *json. */
int mc_manifest_build(const mc_geometry *g, const mc_config *cfg, const mc_train_state *st,
                      const mc_shard_attrs *shards, int n_shards, const mc_file_rec *files,
                      int n_files, char **json);
/* Parses and validates manifest text (origin names it in errors). */
int mc_manifest_parse(const char *json, const char *origin, mc_manifest *m);
void mc_manifest_free(mc_manifest *m);

/* The model section of a config as printed by mc_config_to_json (caller frees). */
char *mc_model_section_json(const mc_model *m);

/* `latest`: {"step": N, "path": "step_N", "manifest_sha256": hex}. */
int mc_latest_read(const char *dir, int64_t *step, char *path, size_t path_cap, char sha[65]);
char *mc_latest_text(int64_t step, const char *sha);

#endif
