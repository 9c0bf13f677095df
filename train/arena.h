/* One backend allocation per memory category (core/mem_cats.h's mc_mem_cat), with the tensors
 * of that category carved out of it. An arena is sized before it is allocated: every tensor
 * that will live in it is first counted with mc_arena_count, then mc_arena_open makes the one
 * be->alloc of the counted size, and mc_arena_take hands out the same sequence of tensors.
 * Each tensor starts MC_MEM_ALIGN bytes apart from the arena's start (cudaMalloc's base
 * alignment, so on CUDA every tensor is so aligned), and the arena's size is the sum of its
 * tensors' bytes each rounded up to that boundary. */
#ifndef MC_TRAIN_ARENA_H
#define MC_TRAIN_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "core/mem_cats.h"

typedef struct {
  mc_backend *be;
  char *base;           /* the one allocation; NULL until opened (or when nothing was counted) */
  int64_t cap;          /* bytes counted = bytes allocated */
  int64_t used;         /* bytes handed out (a multiple of MC_MEM_ALIGN) */
  int64_t tensor_bytes; /* sum of the tensors' own sizes, without the alignment padding */
  int64_t tensors;      /* tensors handed out */
  mc_mem_cat cat;       /* its category (set by mc_arena_open; for messages) */
} mc_arena;

/* The arenas of a rank, one per category (unused categories stay empty). */
typedef struct {
  mc_arena a[MC_MEM_COUNT];
} mc_arenas;

/* Sizing pass: one more tensor of `bytes`. */
void mc_arena_count(mc_arena *a, int64_t bytes);
/* Allocates the counted bytes from be (zero-filled, like be->alloc). 0 or -1 with mc_error
 * naming the category. */
int mc_arena_open(mc_arena *a, mc_backend *be, mc_mem_cat cat);
/* The next tensor of `bytes`; NULL with mc_error when it does not fit what was counted (the
 * sizing pass and the carving pass disagree: a bug, reported instead of overrunning). */
void *mc_arena_take(mc_arena *a, int64_t bytes, mc_mem_cat cat);
/* Empties the arena for reuse: the next take starts at its beginning again (every tensor
 * handed out before is given up). */
void mc_arena_restart(mc_arena *a);
/* Gives the allocation back and empties the arena. */
void mc_arena_close(mc_arena *a);

/* Adds each arena's allocated bytes to bytes[cat] (the measured figure of the memory report). */
void mc_arenas_add_bytes(const mc_arenas *as, int64_t bytes[MC_MEM_COUNT]);
void mc_arenas_close(mc_arenas *as);

#endif
