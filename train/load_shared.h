/* Loading a checkpoint once across a job (docs/parallel.md, "Loading a checkpoint once").
 *
 * Every rank passes the hyperslabs it needs (mc_ckpt_request: family, state, box, host fp32
 * destination). The ranks all-gather these requests and derive, each on its own and alike,
 * one plan from them and the manifest: one reader per stored shard that some rank needs
 * (bytes balanced over the ranks, a rank that needs the shard itself preferred), and rounds
 * of exchange. In each round every reader reads its shards whole through the checkpoint
 * library (which hash-verifies each once), then one mc_alltoallv over the world hands every
 * rank the parts of them its boxes cover; a round's reads run on a thread of their own while
 * the round before is exchanged (unless opts.serial). So each needed stored byte is read and hashed once
 * in the whole job, where every rank reading its own boxes would read a shard once per rank
 * that needs it (ZeRO 0 replicas, load-time resharding).
 *
 * Memory: in one round a rank holds at most round_bytes of exchange buffer (what it sends
 * plus what it receives, in one block kept from round to round at the largest round's size;
 * one dim-0 row of a piece is never split, so a row larger than that goes alone) and at most round_bytes of shards it has read and still serves, except that a
 * shard larger than that is held alone, whole (its SHA-256 covers it whole); with the next
 * round read meanwhile, the shards of two rounds: at most twice that. Buffers of shards
 * served are kept for later rounds' shards of about their size (a fresh large block costs its
 * page faults again) as long as all of a reader's buffers, in use or kept, stay within that
 * twice. The plan itself is on every rank: about 200 bytes per (rank, request, intersecting
 * shard) and per band.
 *
 * Errors: every collective step is preceded by an agreement (mc_load_agree), so a failure on
 * any rank (a request the checkpoint cannot serve, a hash mismatch on a reader, no memory)
 * fails the load on every rank with that rank's message, never a hang.
 *
 * With world NULL or of one rank, or per_rank set, each rank reads its own requests with
 * mc_ckpt_read_many (the load before this one): the bytes placed are the same either way. */
#ifndef MC_TRAIN_LOAD_SHARED_H
#define MC_TRAIN_LOAD_SHARED_H

#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "comm/comm.h"

/* The default bound of a round (see above): 256 MiB. */
#define MC_LOAD_ROUND_BYTES (256LL << 20)

/* The default size of one task of a round's copies (packing, unpacking; spread over the
 * checkpoint's io_threads threads): 4 MiB. */
#define MC_LOAD_COPY_BYTES (4LL << 20)

typedef struct {
  int64_t round_bytes; /* the bound of a round; <= 0: MC_LOAD_ROUND_BYTES (tests pass small ones) */
  int64_t copy_bytes;  /* the size of a copy task (cut by rows); <= 0: MC_LOAD_COPY_BYTES (tests pass small ones) */
  int per_rank;        /* 1: every rank reads its own requests (for comparisons and figures) */
  int serial;          /* 1: each round's reads wait for the exchange before (for comparisons) */
  /* Called exactly once per request i once reqs[i].out holds its final, verified values:
   * where this rank reads its own requests, from the checkpoint's reading threads as each
   * completes, possibly concurrently (mc_ckpt_read_many_notify); after a shared load's
   * rounds, from the calling thread. A load that fails may have called it for some requests
   * (each then complete and digest-checked; a check after the data failed). NULL: none. */
  void (*done)(void *user, int i);
  void *done_user;
} mc_load_opts;
void mc_load_opts_default(mc_load_opts *o);

typedef struct {
  int world;                        /* ranks that took part */
  int64_t read, hashed;             /* shard bytes this rank read from disk and hashed */
  int64_t total_read, total_hashed; /* the same summed over the ranks */
  int64_t checked, total_checked;   /* rank-file bytes this rank, and all, hashed against piece digests */
  int64_t needed;                   /* stored bytes of the shards some rank's boxes touch, each once */
  int64_t per_rank_read;            /* bytes the ranks would read in all, each reading its own
                                     * boxes (mc_ckpt_io_bytes's rule, per rank) */
  int rounds;                       /* exchange rounds (0 when each rank read its own) */
  /* This rank's largest round: exchange buffers (send + receive) and shards it read and
   * still serves or is reading for the next round, in bytes (both 0 without exchange
   * rounds); and the largest needed shard. */
  int64_t peak_exchange, peak_held, largest_shard;
  /* This rank's seconds: the shared check before parsing, its reads (mc_ckpt_read_many, with
   * their own checks where the check is not shared) where the exchange did not hide them (the
   * first round's, and the waits for a round read meanwhile), and the rest of the exchange
   * rounds (copies, agreement, all-to-all). */
  double check_s, read_s, exchange_s;
} mc_load_stats;

/* Fills reqs[i].out on this rank, for i < n; every rank of `world` calls it (collective).
 * Returns 0, or -1 on every rank with the message of the lowest failing rank ("rank R failed:
 * <file>: hash mismatch in dataset /<family>/<state>: ..."); the outputs are then unspecified.
 * opts may be NULL (defaults), stats may be NULL. */
int mc_load_shared(mc_ckpt *ck, mc_comm *world, const mc_ckpt_request *reqs, int n, const mc_load_opts *opts,
                   mc_load_stats *stats);

/* Collective: 0 if every rank passes ok = 1; else -1 on every rank with the message of the
 * lowest rank that passed 0 ("rank R failed: <its mc_errmsg>"). world NULL or of one rank:
 * ok ? 0 : -1, the message untouched. */
int mc_load_agree(mc_comm *world, int ok);

#endif
