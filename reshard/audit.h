/* mcaudit's checks over a committed checkpoint:
 *  - the manifest opens (root hash, format) and names a valid model and layout;
 *  - for every family and every state kind it has (param and the kinds its optimizer group
 *    declares: AdamW's exp_avg, exp_avg_sq; Muon's momentum), the stored primaries tile the
 *    global shape exactly (in bounds, no overlap, no gap), from the manifest alone, and no
 *    shard stores a kind the family's optimizer does not keep;
 *  - every stored shard is the primary hyperslab mc_shard_of gives its rank;
 *  - every dataset's HDF5 attributes agree with the manifest;
 *  - with verify, every shard's SHA-256 over its stored bytes (all bad shards are listed, not
 *    only the first);
 *  - a layout-independent content digest per family and state: SHA-256 of the global tensor
 *    in row-major order, as stored (its element dtype), streamed through the reshard engine
 *    (bounded memory);
 *  - bytes held per rank, per state and per memory category, from the holdings function
 *    (core/holdings.h), and every rank's stored bytes equal to those of the states it is
 *    primary for;
 *  - the balance of the ownership rule: each rank's optimizer-state bytes (every audited
 *    state it holds: the fp32 master/param and its optimizer's states) and the largest over the mean,
 *    and the same for the bytes each rank wrote. */
#ifndef MC_RESHARD_AUDIT_H
#define MC_RESHARD_AUDIT_H

#include <stdint.h>

#include "core/box.h"
#include "core/mem_cats.h"
#include "reshard/ckpt_source.h"

/* The memory categories a checkpoint's states count under (core/holdings.h state_cat): params
 * by placement, optimizer states (moments, momentum) by weight-decay group; fp32 checkpoints
 * store the master weights as param. mcaudit prints them under the planner's names. */
#define MC_AUDIT_N_CATS 5
extern const mc_mem_cat mc_audit_cats[MC_AUDIT_N_CATS];

typedef struct {
  mc_errlist problems;
  int world, n_fams;
  unsigned states;
  char (*digest)[MC_N_STATES][65]; /* per family; "" where not computed or not a kind the family has */
  int64_t *held;                   /* [world][MC_N_STATES]: bytes each rank holds (replicas too) */
  int64_t *stored;                 /* [world]: bytes of the primaries each rank wrote, as stored */
  int64_t *stored_fp32;            /* [world]: the same at the dtype the trainer keeps each state in
                                    * (fp32, int64 for step), which the holdings must equal */
  int64_t *cat;                    /* [world][MC_MEM_COUNT]: held bytes by category (holdings) */
  int64_t *optimizer;              /* [world]: optimizer-state bytes held (the audited states summed) */
  double optimizer_balance;        /* largest / mean of optimizer[] (1 when nothing is held) */
  int optimizer_largest_rank;      /* the (lowest) rank holding the largest */
  double stored_balance;           /* largest / mean of stored[] */
  int64_t bytes_read;
  int verified;                    /* every shard hash checked */
  int digests;                     /* digests computed */
} mc_audit;

/* Tiling check of one family/state's shards against its global shape. Adds problems
 * naming `what` and the ranks involved; returns the number added. */
int mc_audit_tiling(const char *what, int ndim, const int64_t *shape, const mc_box *slabs, const int *ranks, int n,
                    mc_errlist *errs);

/* Runs every check on an open source. Returns 0 when it could run (problems may still be
 * listed in out->problems), -1 when it could not. */
int mc_audit_run(mc_rs_source *src, int verify, int progress, mc_audit *out);
void mc_audit_free(mc_audit *a);

#endif
