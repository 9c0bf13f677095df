/* Distributed checkpoints (docs/design.md section 5; format in docs/checkpoint.md).
 *
 * <dir>/step_<N>/rank_<R>.h5 holds one HDF5 dataset "/<family>/<state>" per shard that rank R
 * is the primary of, each carrying its ownership and SHA-256 as attributes;
 * <dir>/step_<N>/manifest.json indexes everything; <dir>/latest names the newest committed
 * step and the SHA-256 of its manifest (the root hash).
 *
 * Ownership always comes from mc_shard_of (core/ownership.h). The library links neither MPI
 * nor CUDA: one process may write the files of several ranks, or several processes may each
 * write their own rank file, synchronised by a barrier callback the caller supplies. */
#ifndef MC_CKPT_CHECKPOINT_H
#define MC_CKPT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/optim_groups.h"
#include "core/ownership.h"

/* Version 6 records, for each shard stored contiguous and uncompressed, the byte offset of its
 * data in its rank file (shards[].offset), so that a verified load streams each file once:
 * every piece is hashed and its shards' bytes are copied out in the same pass, and HDF5's
 * offsets are compared with the recorded ones once the file is verified. Version 5 replaces each rank file's whole-file SHA-256 (files[].sha256) with the SHA-256 of
 * its consecutive pieces (files[].piece_bytes, pieces, pieces_sha256), so that a file is
 * hashed and verified on several threads; nothing else changes. Version 4 adds AdamW's per-family step counter (state kind step: int64, shape [1], replicated
 * over the family's holders, core/optim_groups.h); a version 3 AdamW group declares no step,
 * and a run resuming from it takes every family's step from training_state.adam_step.
 * Version 3 records the optimizer groups (manifest optimizer_groups, each family's optimizer,
 * each dataset's `optimizer` attribute): a family stores param plus the state kinds its
 * optimizer declares (core/optim_groups.h). Versions 1 and 2 predate them: every family is
 * AdamW's and they are read as before. Version 2 records the ownership rule (manifest
 * layout.ownership_rule: "balanced-v2" for what this version writes, "balanced" for earlier
 * version 2 checkpoints); version 1 checkpoints were written under MC_OWN_CHUNKED
 * (core/ownership.h) and are read as such. A reader refuses a newer version, naming both. */
#define MC_CKPT_FORMAT_VERSION 6
#define MC_CKPT_MAX_DIM 3
#define MC_CKPT_RULE_MAX 64

/* ---------------------------------------------------------------- training state */

/* Everything besides tensors that a run needs to continue exactly (docs/design.md section 4).
 * Nothing in it depends on the rank grid. */
typedef struct {
  int64_t step;          /* optimizer steps completed */
  int64_t tokens_seen;
  int64_t schedule_step; /* position in the learning-rate schedule */
  double lr;             /* learning rate in effect at schedule_step */
  int64_t adam_step;     /* AdamW bias-correction step count */
  /* optimizer and schedule hyperparameters in force when saved */
  double lr_max, lr_min;
  int64_t warmup_steps, total_steps;
  double beta1, beta2, adam_eps, weight_decay, grad_clip;
  /* randomness is counter-based: a seed plus the next unused counter of each stream */
  uint64_t seed;
  uint64_t rng_counter;   /* next unused counter of the sampling/dropout streams */
  int64_t data_position;  /* index of the next sample of the data stream */
} mc_train_state;

/* ---------------------------------------------------------------- save */

/* One shard to save: the hyperslab `rank` holds of (family, state), exactly
 * mc_shard_of(g, family, state, rank).numel elements, row-major over its count, of the dtype
 * the family's optimizer keeps the kind in (mc_opt_state_dtype: fp32 values, or one int64 for
 * AdamW's step), stored as such.
 * Items whose rank is not the primary of that hyperslab (or holds nothing) are skipped. An
 * item of a state kind the family's optimizer does not keep (mc_family_has_state: momentum
 * of an AdamW family, exp_avg of a Muon one) is refused, naming family, state and optimizer. */
typedef struct {
  int family;        /* index into g->fams */
  mc_state state;
  int rank;
  const void *data; /* host memory */
} mc_ckpt_item;

/* Collective AND over every process taking part in the save: each passes ok (1 = this
 * process has succeeded so far) and gets 1 only if every process passed 1. A save calls it
 * at three points (after preparing, after the rank files are durable, after the commit),
 * also after a local failure; when it returns 0 the save stops there, on every process
 * alike. With an async save it is called from the background thread. */
typedef int (*mc_ckpt_barrier_fn)(void *user, int ok);

typedef struct {
  int keep;              /* keep the last K committed checkpoints (0 = all) */
  int io_threads;        /* threads writing and hashing the data (>= 1) */
  int deflate;           /* 0: contiguous datasets; 1-9: chunked, shuffle + deflate at this level */
  int64_t piece_bytes;   /* bytes per piece of the rank files' piece digests (0: MC_CKPT_PIECE_BYTES);
                          * a multiple of 4 KiB from 4 KiB to 1 GiB */
  int root;              /* this process writes the manifest and commits (rank 0's process) */
  mc_ckpt_barrier_fn barrier; /* NULL: this process is the only one writing */
  void *barrier_user;
  /* Optional, for writers that stream shards instead of passing items (mcreshard): called
   * in this process after its items are written, with the temporary step directory where
   * its rank files must go (rank_<R>.h5, attributes as mc_h5_write_shard_attrs writes them).
   * Returns 0, or -1 with mc_error set, which aborts the save like any write failure. */
  int (*write_files)(void *user, const char *tmp_step_dir);
  void *write_files_user;
} mc_ckpt_save_opts;

/* The piece size a save records by default (docs/checkpoint.md, "manifest.json"). */
#define MC_CKPT_PIECE_BYTES ((int64_t)64 << 20)

/* The zlib level of checkpoint.compress = deflate. */
#define MC_CKPT_DEFLATE_LEVEL 1

/* keep = 0, io_threads = 2, deflate = 0, root = 1, no barrier. */
void mc_ckpt_save_opts_default(mc_ckpt_save_opts *o);

/* Saves step state->step into dir (created if missing). `cfg` is recorded whole in the
 * manifest, with its model and parallel sections taken from g; its optim.groups must assign
 * every family of g the optimizer g has (mc_family.opt), else the save is refused naming the
 * first family that differs (a reader checks the recorded families against it). On return 0 the checkpoint
 * is committed and `latest` names it. On failure (any process, any step, a full disk
 * included) the previous checkpoint and `latest` are untouched, the temporary directory is
 * removed and -1 is returned with a message naming the file and step that failed.
 * Refuses to overwrite the step `latest` names; another existing step_<N> (left by a crash
 * after its rename, or by an abandoned branch of the run) is replaced. */
int mc_ckpt_save(const char *dir, const mc_geometry *g, const mc_config *cfg,
                 const mc_train_state *state, const mc_ckpt_item *items, int n_items,
                 const mc_ckpt_save_opts *opts);

/* A checkpoint of geometry g without data, for planning at scales no machine here can save
 * (bench/sim_scale --write-metadata, then mcreshard --dry-run): <dir>/step_<N>/manifest.json
 * and manifest.sha256 exactly as a save of every state kind would write them (every primary
 * shard of param and of its optimizer's states for every family, its hyperslab, replica group
 * and placement rule; the rank files a
 * save would write, their `bytes` being their shards' fp32 bytes), and <dir>/latest; but no
 * rank file, and every shard's sha256 is 64 zeros (no data was hashed). It opens only with
 * mc_ckpt_open_opts.metadata_only; anything that reads data (a load, mcreshard without
 * --dry-run, mcaudit) is refused naming the first missing rank file. Same directory rules as
 * mc_ckpt_save (one process, no barrier). */
int mc_ckpt_write_metadata_only(const char *dir, const mc_geometry *g, const mc_config *cfg,
                                const mc_train_state *state);

/* Asynchronous saving: mc_ckpt_saver_save copies the items into host buffers owned by the
 * saver and returns; a background thread then writes, hashes and commits. The next save,
 * mc_ckpt_saver_wait and mc_ckpt_saver_close wait for the one in flight and return its
 * result: an error is always reported by one of them, never lost. */
/* The geometry passed to a save must stay valid until that save has been waited for. */
typedef struct mc_ckpt_saver mc_ckpt_saver;
int mc_ckpt_saver_create(const char *dir, const mc_ckpt_save_opts *opts, mc_ckpt_saver **out);
/* Returns -1 without starting if the previous save failed (its error is the message), or
 * if this one fails before it can start (bad item, no memory); with a barrier, a thread then
 * still takes part in the first barrier, failing, so the other processes' saves fail rather
 * than wait for ever. */
int mc_ckpt_saver_save(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg,
                       const mc_train_state *state, const mc_ckpt_item *items, int n_items);
/* The same without the copy: items' data are the caller's own host buffers, which the
 * background thread writes from. The caller leaves them unchanged until the save has
 * finished (mc_ckpt_saver_wait, a poll that returns 0 or -1, or close), so it must wait for
 * the previous save before refilling them. ready(ready_user), when given, is called on the
 * background thread before any byte is read: it blocks until the buffers are filled (a
 * device-to-host copy still in flight when this returns) and returns 0, or -1 with mc_error,
 * which fails the save (on every process, through the barrier). */
int mc_ckpt_saver_save_staged(mc_ckpt_saver *s, const mc_geometry *g, const mc_config *cfg,
                              const mc_train_state *state, const mc_ckpt_item *items, int n_items,
                              int (*ready)(void *), void *ready_user);
int mc_ckpt_saver_wait(mc_ckpt_saver *s);
/* Seconds the last mc_ckpt_saver_save kept its caller blocked (wait for the previous save
 * plus the copy). */
double mc_ckpt_saver_last_stall(const mc_ckpt_saver *s);
/* Once per save that has committed, oldest first: 1 with its step and the seconds its
 * background write took (write, hash, fsync, barriers, commit); 0 when none is unreported
 * (up to the last 4 are kept). */
int mc_ckpt_saver_take_done(mc_ckpt_saver *s, int64_t *step, double *seconds);
/* Waits, frees everything, and returns the result of the save in flight (0 if none). */
int mc_ckpt_saver_close(mc_ckpt_saver *s);
/* Without blocking: 1 while a save is in flight, else what mc_ckpt_saver_wait returns (0, or
 * -1 with the error of the save that finished, reported once). */
int mc_ckpt_saver_poll(mc_ckpt_saver *s);

/* A barrier callback for async saves of several processes that goes through the file system
 * instead of a communicator (mctrain under mpirun, whose MPI is initialised single-threaded:
 * the background thread must not call MPI). Every process creates one over the same
 * directory (process 0 empties it: the caller must make sure, e.g. with a barrier on its
 * communicator, that no process uses it before process 0's create has returned). Call k of
 * process r writes the marker <sync_dir>/b<k>.r<r> ("1", or "0 <its error message>") and
 * waits until every process's marker k exists; it returns 1 only if all say 1. A process
 * waiting longer than timeout_s (<= 0: 600 s) for a marker writes <sync_dir>/abort, which
 * fails every later call of every process. Markers are not fsynced: they coordinate, the
 * commit's durability comes from the rank files and manifest being fsynced before the
 * markers that allow the next phase. */
typedef struct mc_ckpt_fs_barrier mc_ckpt_fs_barrier;
int mc_ckpt_fs_barrier_create(const char *sync_dir, int rank, int world, double timeout_s, mc_ckpt_fs_barrier **out);
int mc_ckpt_fs_barrier_fn(void *user, int ok); /* an mc_ckpt_barrier_fn; user = the barrier */
/* After a failed save: the lowest rank that reported a failure in the failing call (or that
 * never arrived), with its message; -1 if that call saw no failure. Any thread. */
int mc_ckpt_fs_barrier_failure(mc_ckpt_fs_barrier *b, char *msg, size_t cap);
/* remove_dir: process 0 removes the directory (call it once every process is done). */
void mc_ckpt_fs_barrier_free(mc_ckpt_fs_barrier *b, int remove_dir);

/* ---------------------------------------------------------------- fault injection (tests) */

/* The steps of the save path, in order, at which a fault can be injected. */
extern const char *const mc_ckpt_fault_points[];
extern const int mc_ckpt_n_fault_points;
/* Arms a fault for the next saves of this process: at `point` the operation fails with
 * ENOSPC (crash = 0) or the process exits at once with status 3, as if killed, without
 * any clean-up (crash = 1). NULL disarms. The environment variable MC_CKPT_FAULT=<point> or
 * <point>:crash arms the same when no fault is set by this function. */
int mc_ckpt_set_fault(const char *point, int crash);

/* ---------------------------------------------------------------- load */

typedef struct {
  char name[MC_FAMILY_NAME_MAX];
  int ndim;
  int64_t shape[MC_CKPT_MAX_DIM];
  int64_t numel;
  char placement_rule[MC_CKPT_RULE_MAX]; /* e.g. "tp(dim=0) x zero_balanced(dim=0)" */
  int stage;
  int decay;                             /* weight-decay group (manifest optimizer_group): 1 = decay */
  mc_opt_kind opt;                       /* optimizer (manifest optimizer; format < 3: MC_OPT_ADAMW) */
  int dtype; /* element dtype of its stored param (manifest dtype; mc_elem_dtype, core/dtype.h) */
} mc_ckpt_family;

/* One stored shard: a dataset of one rank file. */
typedef struct {
  char file[32];                            /* e.g. "rank_3.h5", inside the step directory */
  char dataset[MC_FAMILY_NAME_MAX + 16];    /* e.g. "/layers.07.attn.wk/exp_avg" */
  char family[MC_FAMILY_NAME_MAX];
  int family_index;                         /* into the manifest's family list */
  mc_state state;
  int ndim;
  int64_t start[MC_CKPT_MAX_DIM], count[MC_CKPT_MAX_DIM];
  int64_t numel;
  int rank;                                 /* the primary rank that wrote it */
  int stage;
  int n_replicas;
  const int *replicas;                      /* replica group, ascending; contains rank (format 1: replicas[0]) */
  char sha256[65];                          /* hex of the stored bytes: little-endian elements of
                                             * `dtype`, row-major */
  int dtype; /* element dtype of the stored data (mc_elem_dtype, core/dtype.h): its family's
              * declared dtype of this state kind; 0, float32, when zero-filled */
  int opt;  /* the dataset's `optimizer` attribute: its family's optimizer (mc_opt_kind);
             * -1 in a checkpoint of format < 3, whose datasets have no such attribute.
             * Writers set the family's optimizer (0, MC_OPT_ADAMW, when zero-filled). */
  int64_t offset; /* byte offset of its data in `file` (manifest shards[].offset, format 6) when
                   * stored contiguous and unfiltered; 0 when none is recorded (chunked or
                   * compressed data, format < 6): no data starts at byte 0 of an HDF5 file,
                   * its superblock does */
} mc_ckpt_shard;

typedef struct {
  int verify;     /* hash-verify every shard read (default 1; 0 is an explicit opt-out) */
  int io_threads; /* threads for reading and hashing (default 2) */
  int metadata_only; /* open from the manifest alone (default 0): the rank files are not looked
                      * at, not even whether they exist, so a checkpoint written by
                      * mc_ckpt_write_metadata_only opens; reading shard data then fails naming
                      * the rank file. For planning (mcreshard --dry-run), never for loading. */
} mc_ckpt_open_opts;
void mc_ckpt_open_opts_default(mc_ckpt_open_opts *o);

typedef struct mc_ckpt mc_ckpt;

/* Opens a checkpoint directory (follows `latest`) or one step directory. The manifest is
 * checked against the root hash in `latest` (when `latest` names this step), against the
 * format rules (required keys and types, format version, shard bounds and coverage), and
 * every shard file must exist with the size the manifest records (unless
 * opts->metadata_only; error: "<path>: missing shard file (listed in the manifest)"). Nothing
 * on disk changes. */
int mc_ckpt_open(const char *path, const mc_ckpt_open_opts *opts, mc_ckpt **out);
void mc_ckpt_close(mc_ckpt *ck);

int64_t mc_ckpt_step(const mc_ckpt *ck);
const char *mc_ckpt_step_dir(const mc_ckpt *ck);
const char *mc_ckpt_root_hash(const mc_ckpt *ck);      /* sha256 hex of manifest.json */
const char *mc_ckpt_manifest_json(const mc_ckpt *ck);  /* the manifest text */
int mc_ckpt_format_version(const mc_ckpt *ck);
/* The recorded run configuration: defaults overlaid with the manifest's config section. */
int mc_ckpt_config(const mc_ckpt *ck, mc_config *out);
const char *mc_ckpt_config_json(const mc_ckpt *ck);    /* that section, as JSON text */
int mc_ckpt_train_state(const mc_ckpt *ck, mc_train_state *out);
/* 1 if the checkpoint stores this state kind (manifest `states`): then every family whose
 * optimizer declares it (and every family, for param) has it, the others do not. */
int mc_ckpt_has_state(const mc_ckpt *ck, mc_state state);
/* 1 if the checkpoint stores state kind `s` of family `family_index` (an index of
 * mc_ckpt_family_at): the kind is stored and is param or declared by the family's optimizer.
 * 0 otherwise, also for an index or kind out of range. */
int mc_ckpt_family_has_state(const mc_ckpt *ck, int family_index, mc_state s);
/* The element dtype (mc_elem_dtype) state kind `s` of family `family_index` is stored in: for
 * param the family's `dtype`, for a declared kind its optimizer group's declared `dtype`
 * (docs/checkpoint.md, "Element dtypes"); -1 if the family does not have that state. Reads
 * widen it to fp32 exactly. */
int mc_ckpt_state_dtype(const mc_ckpt *ck, int family_index, mc_state s);

int mc_ckpt_n_families(const mc_ckpt *ck);
const mc_ckpt_family *mc_ckpt_family_at(const mc_ckpt *ck, int i);
int mc_ckpt_find_family(const mc_ckpt *ck, const char *name); /* index or -1 */
int mc_ckpt_n_shards(const mc_ckpt *ck);
const mc_ckpt_shard *mc_ckpt_shard_at(const mc_ckpt *ck, int i);

/* One rank file the manifest lists, with its digests (docs/checkpoint.md, "File digests"):
 * format 5 piece_bytes, n_pieces and digest = files[].pieces_sha256; format <= 4 piece_bytes
 * 0, n_pieces 0 and digest = files[].sha256; "" where the entry has none. The strings live
 * as long as the handle. */
typedef struct {
  const char *name;
  int rank;
  int64_t bytes;
  int64_t piece_bytes;
  int64_t n_pieces;
  const char *digest;
} mc_ckpt_file_info;
int mc_ckpt_n_files(const mc_ckpt *ck);
/* Fills *out for file i (0 <= i < mc_ckpt_n_files); -1 without a message when i is out of range. */
int mc_ckpt_file_at(const mc_ckpt *ck, int i, mc_ckpt_file_info *out);

/* Compares the checkpoint's model with a run's: every model key except the training-only
 * ones (init_std, capacity_factor, aux_loss_coef, seq_len) must match; the error names the
 * first differing key with both values. */
int mc_ckpt_check_model(const mc_ckpt *ck, const mc_model *m);

/* Before a reader allocates a model from the checkpoint's recorded config: every family of g
 * must be in the checkpoint with the same shape and the same count, and the rank files must
 * hold at least the bytes of the param state those families need (so an edited manifest
 * cannot make a reader reserve more memory than the checkpoint's data). The error names the
 * first family that differs. */
int mc_ckpt_check_families(const mc_ckpt *ck, const mc_family_set *fams);

/* One hyperslab request: `out` receives prod(count) fp32 values, row-major. */
typedef struct {
  const char *family;
  mc_state state;
  int64_t start[MC_CKPT_MAX_DIM], count[MC_CKPT_MAX_DIM];
  float *out;
} mc_ckpt_request;

/* Checks one request as mc_ckpt_read_many does before reading: the family and state exist,
 * the box lies inside the family's shape, out is set, and the stored shards cover the box.
 * For callers that plan reads of their own (train/load_shared.c); reads nothing. */
int mc_ckpt_check_request(const mc_ckpt *ck, const mc_ckpt_request *r);

/* Reads any hyperslab of any family and state, assembled from every shard that intersects
 * it (the load-time resharding primitive). Each shard touched is hash-verified once per
 * open unless verification is off; a shard serving several requests is read once; shards
 * are read and hashed on io_threads threads. One call at a time per handle. On failure the
 * contents of the output buffers are unspecified. */
int mc_ckpt_read(mc_ckpt *ck, const char *family, mc_state state, const int64_t *start,
                 const int64_t *count, float *out);
int mc_ckpt_read_many(mc_ckpt *ck, const mc_ckpt_request *reqs, int n);
/* mc_ckpt_read_many that reports each request as soon as it is complete, so that a caller can
 * use (upload) reqs[i].out while other requests are still being read: done(user, i) is called
 * exactly once for each request i, as soon as reqs[i].out holds its final values (hash-
 * verified, when the handle verifies), from whichever reading thread completed it (never the
 * caller's), possibly at the same time as other done calls: done must be thread-safe and
 * should return quickly. All done calls have returned when this function returns. On failure
 * it returns -1 with the message set and some done calls may not have happened; one that
 * happened still means that request's bytes were complete and matched their shard digests,
 * but the caller must treat the whole read as failed (a check made after the data, such as
 * HDF5's data offsets against the manifest's in a one-pass load, may be what failed).
 * done = NULL is mc_ckpt_read_many. */
int mc_ckpt_read_many_notify(mc_ckpt *ck, const mc_ckpt_request *reqs, int n, void (*done)(void *user, int i),
                             void *user);
/* The float reads above refuse an int64 state (a counter has no fp32 value in general). This
 * reads one: the whole of state kind `state` of `family`, which must be int64 of one element
 * (a scalar kind, AdamW's step: one shard, written once), into *out, hash-verified unless
 * verification is off. Errors name the family and state: not stored, not int64. */
int mc_ckpt_read_i64(mc_ckpt *ck, const char *family, mc_state state, int64_t *out);
/* Reads and hash-verifies every shard (in parallel); the error names the first bad one. */
int mc_ckpt_verify_all(mc_ckpt *ck);

/* Shard data read from the step's files and shard data hashed by this handle since it was
 * opened, in bytes (attributes and the manifest are not counted). With verification each
 * shard a read touches is read whole and hashed once per open; without it a request that is
 * not a whole shard reads only its intersection. Either pointer may be NULL. */
void mc_ckpt_io_bytes(mc_ckpt *ck, int64_t *read, int64_t *hashed);
/* Bytes of rank files this handle hashed against their piece (or whole-file) digests since it
 * was opened: the checks before parsing, their parts, and the pieces of one-pass reads. */
int64_t mc_ckpt_checked_bytes(mc_ckpt *ck);
/* 1 if this handle hash-verifies what it reads (mc_ckpt_open_opts.verify). */
int mc_ckpt_verifies(const mc_ckpt *ck);
/* The threads the handle hashes on: io_threads (mc_ckpt_open_opts), at least 2, not clamped
 * for an HDF5 library that is not thread-safe; for a load's other work that makes no HDF5
 * call (train/load_shared.c's copies). */
int mc_ckpt_io_threads(const mc_ckpt *ck);
/* Verify before parsing (docs/reliability.md): checks rank file `file` (a name the manifest
 * lists) against the size and the digests the manifest records: format 5, the SHA-256 of
 * each piece (files[].pieces), the pieces hashed on io_threads threads (at least 2); format
 * <= 4, the whole-file SHA-256 (files[].sha256). Once per open (later calls return the first
 * result at once). Reads of this handle call it before the file reaches the HDF5 library
 * unless verification is off; a program that opens a rank file of the checkpoint itself
 * (mcaudit, mcreshard) must call it first. A file entry with no digest (a manifest written
 * before whole-file hashes) passes: its file is checked by size at open only. Errors:
 * "<path>: hash mismatch in piece k of n (bytes a to b): it hashes to X, the manifest records Y ...",
 * "<path>: whole-file hash mismatch ..." or the size mismatch. */
int mc_ckpt_check_file(mc_ckpt *ck, const char *file);
/* mc_ckpt_check_file for every rank file, the pieces of all files (whole files before
 * format 5) spread over io_threads threads (at least 2: no HDF5 call is made, so a library
 * that is not thread-safe does not limit it). For readers that will read every file (mcaudit,
 * mcreshard); the reads of mc_ckpt_read_many check the files they touch the same way. */
int mc_ckpt_check_files(mc_ckpt *ck);
/* A job's ranks sharing the check before parsing of the rank files they will read, so that
 * each piece is hashed once in the job rather than once per rank: number the pieces of
 * files[0..n) (names the manifest lists, the same list in the same order on every rank; a
 * format <= 4 file is one piece) 0..total; part `part` of `parts` checks the run [total *
 * part / parts, total * (part + 1) / parts) (pieces of files this handle checked already are
 * skipped). Errors as mc_ckpt_check_file's; a failing file stays failed on this handle. */
int mc_ckpt_check_files_part(mc_ckpt *ck, const char *const *files, int n, int part, int parts);
/* Records files[0..n) as checked on this handle, once every part of them passed
 * mc_ckpt_check_files_part somewhere in the job (the caller agrees on that: a collective):
 * reads then parse them without hashing them again. -1 naming a file this handle saw fail. */
int mc_ckpt_files_checked(mc_ckpt *ck, const char *const *files, int n);

#endif
