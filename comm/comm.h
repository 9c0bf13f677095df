/* The collective interface the trainer uses: one communicator type with a backend vtable, so
 * the MPI backend (CPU ranks, comm/comm_mpi.c) and the NCCL backend (GPU ranks, one process
 * per GPU, comm/comm_nccl.c) are interchangeable. Buffers are host memory for MPI; for NCCL
 * they may be device memory (used in place) or host memory (staged through the device).
 * Every call is complete when it returns (the buffers may be reused) and returns 0, or -1
 * with mc_error naming the operation and group; except on a stream-ordered communicator
 * (mc_comm_ordered): there a call whose buffers are all device memory returns once it is
 * queued on the compute stream, after the work queued there before it and before the work
 * queued after it, so the device sees the result in order and the host does not wait. */
#ifndef MC_COMM_COMM_H
#define MC_COMM_COMM_H

#include <stdint.h>

#include "comm/launch.h"
#include "core/layout.h"
#include "util/clock.h"
#include "util/error.h"

/* MC_DT_BF16 (bf16 bit patterns, kernels/ops.h mc_bf16) is moved (gathers, all-to-all, send,
 * receive, broadcast), never summed: the sums refuse it on every backend. */
typedef enum { MC_DT_F32 = 0, MC_DT_F64 = 1, MC_DT_I32 = 2, MC_DT_I64 = 3, MC_DT_U8 = 4, MC_DT_BF16 = 5 } mc_dtype;
size_t mc_dtype_size(mc_dtype t);

typedef struct mc_comm mc_comm;

typedef struct {
  const char *name; /* "mpi", "nccl" */
  int (*allreduce_sum)(mc_comm *c, void *buf, int64_t count, mc_dtype t);
  /* With n_seg = 1: member i receives the sum over members of send[displ(i) .. displ(i)+counts[i]),
   * where displ(i) = sum of counts[0..i). Counts may differ and may be zero (ZeRO chunks).
   * With n_seg > 1 the member-ordered buffer is n_seg such blocks one after another (block k
   * at k * total) and member i's recv holds its n_seg results one after another (segment k at
   * k * counts[i]): the sequence shards of SP, whose whole sequences interleave the members. */
  int (*reduce_scatter_sum)(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t);
  /* Gathers counts[i] elements from member i into recv in member order; with n_seg > 1, n_seg
   * times: segment k of every member's send (at k * counts[i]) into block k of recv (at k * total). */
  int (*allgather)(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t);
  /* What member i sends member j is n_seg segments in order: segment k has send_counts[j * n_seg + k]
   * elements at send_displs[j * n_seg + k]; what it receives from j lands likewise at
   * recv_counts / recv_displs [j * n_seg + k]. Segment k of what i sends j has the length of
   * segment k of what j receives from i (empty segments move nothing). n_seg = 1 is MPI's
   * alltoallv; more segments scatter the rows where the receiver wants them (the expert-major
   * order of train/dist_ep.c) without a staging copy. send and recv are different buffers
   * (MPI's rule: Open MPI hung on one address even with nothing to send; refused by name). */
  int (*alltoallv)(mc_comm *c, const void *send, int n_seg, const int64_t *send_counts, const int64_t *send_displs,
                   void *recv, const int64_t *recv_counts, const int64_t *recv_displs, mc_dtype t);
  int (*send)(mc_comm *c, const void *buf, int64_t count, mc_dtype t, int peer, int tag);
  int (*recv)(mc_comm *c, void *buf, int64_t count, mc_dtype t, int peer, int tag);
  int (*bcast)(mc_comm *c, void *buf, int64_t count, mc_dtype t, int root);
  int (*barrier)(mc_comm *c);
  /* The communicator of the members that pass the same color, ordered by key (collective
   * over c, as MPI_Comm_split): NULL with mc_error set on failure. */
  mc_comm *(*split)(mc_comm *c, int color, int key, const char *label);
  void (*destroy)(mc_comm *c);
  /* 1 when device-buffer calls only queue (see the top of this file); NULL: never */
  int (*ordered)(const mc_comm *c);
  /* The side queue of a stream-ordered backend (NULL elsewhere; see mc_comm_side_begin). */
  int (*side_begin)(mc_comm *c);
  int (*side_end)(mc_comm *c, int *ticket);
  int (*side_wait)(mc_comm *c, int ticket);
} mc_comm_ops;

struct mc_comm {
  const mc_comm_ops *ops;
  const char *label; /* "world", "tp", "dp", "pp", "ep", "edp" */
  int rank;          /* rank inside this communicator */
  int size;
  int world_rank;
  void *impl;
  double busy_s; /* seconds spent inside this communicator's calls (the wrappers below add it) */
};

/* The layout's groups for one rank (each a communicator over the ranks of mc_group_*). */
typedef struct {
  mc_comm *world, *tp, *dp, *pp, *ep, *edp;
} mc_comm_groups;

/* MPI backend. mc_comm_mpi_init calls MPI_Init (once per process); finalize calls
 * MPI_Finalize after destroying every communicator it made. */
int mc_comm_mpi_init(int *argc, char ***argv, mc_comm **world);
void mc_comm_mpi_finalize(void);
/* NCCL backend (comm/comm_nccl.c; built where nccl.h exists). The world of l->rank of l->size
 * processes on CUDA device `device`: rank 0 makes the NCCL unique id and hands it out by
 * broadcast over `mpi_world` when given (under mpirun), else through the TCP rendezvous at
 * MASTER_ADDR:MASTER_PORT (comm/rendezvous.h), which also watches the other processes: a
 * process that ends without finishing ends the whole job (rank 0 names it). Each operation
 * waits at most `timeout_s` seconds (0: no limit; the rendezvous then waits 600 s) (then the communicator is aborted and the call fails
 * naming the operation and group). The rank, size and rendezvous address come from l
 * (comm/launch.h). */
int mc_comm_nccl_init(const mc_launch *l, int device, mc_comm *mpi_world, double timeout_s, mc_comm **world);
/* 1 when this build has the NCCL backend. */
int mc_comm_have_nccl(void);
/* Makes every NCCL communicator of this process stream-ordered on `cuda_stream` (a
 * cudaStream_t: the compute stream of the device backend): operations queue there instead of
 * on the module's own stream, and those on device buffers return without waiting; it also
 * makes the side queue's stream (mc_comm_side_begin). A watchdog
 * thread then holds the timeout instead of the call: an operation not complete after
 * timeout_s (or failed asynchronously) ends the process with status 1 and a message naming
 * the rank, operation and group (the rendezvous watch ends the others); so does a call on host
 * buffers, which still waits, when its wait times out or fails (aborting the communicator
 * could wait forever on earlier operations stuck on the same peer). 0, or -1 with
 * mc_error (no NCCL world, or the watchdog could not start). */
int mc_comm_nccl_order_with(void *cuda_stream);

/* Splits the world into the layout's groups (through the world's split). Fails with a clear
 * error when the world size differs from tp*dp*pp ("world size tp*dp*pp=4 does not equal the
 * 2 ranks launched"). */
int mc_comm_make_groups(mc_comm *world, const mc_layout *l, mc_comm_groups *out);
void mc_comm_free_groups(mc_comm_groups *g);


/* Convenience wrappers that dispatch through the vtable and add the call's time to busy_s:
 * with blocking calls that is the communication the step waits for (pipeline receives
 * include the time the other stage is still computing). */
#define MC_COMM_TIMED(c, call)                      \
  do {                                              \
    const double t0_ = mc_now_s();                  \
    const int rc_ = (call);                         \
    (c)->busy_s += mc_now_s() - t0_;                \
    return rc_;                                     \
  } while (0)
static inline int64_t mc_counts_total(const int64_t *counts, int n) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += counts[i];
  return total;
}
static inline int mc_comm_no_bf16_sum(const mc_comm *c, const char *op) {
  return mc_error("%s on the %s group: bf16 is moved, never summed (sums run in fp32)", op, c->label);
}
static inline int mc_allreduce_sum(mc_comm *c, void *buf, int64_t n, mc_dtype t) {
  if (t == MC_DT_BF16) return mc_comm_no_bf16_sum(c, "allreduce");
  MC_COMM_TIMED(c, c->ops->allreduce_sum(c, buf, n, t));
}
static inline int mc_reduce_scatter_sum_seg(mc_comm *c, const void *s, int n_seg, void *r, const int64_t *counts, mc_dtype t) {
  if (t == MC_DT_BF16) return mc_comm_no_bf16_sum(c, "reduce_scatter");
  if (n_seg < 1) return mc_error("reduce_scatter on the %s group: %d segments", c->label, n_seg);
  MC_COMM_TIMED(c, c->ops->reduce_scatter_sum(c, s, n_seg, r, counts, t));
}
static inline int mc_reduce_scatter_sum(mc_comm *c, const void *s, void *r, const int64_t *counts, mc_dtype t) {
  return mc_reduce_scatter_sum_seg(c, s, 1, r, counts, t);
}
static inline int mc_allgather_seg(mc_comm *c, const void *s, int n_seg, void *r, const int64_t *counts, mc_dtype t) {
  if (n_seg < 1) return mc_error("allgather on the %s group: %d segments", c->label, n_seg);
  MC_COMM_TIMED(c, c->ops->allgather(c, s, n_seg, r, counts, t));
}
static inline int mc_allgather(mc_comm *c, const void *s, void *r, const int64_t *counts, mc_dtype t) {
  return mc_allgather_seg(c, s, 1, r, counts, t);
}
static inline int mc_alltoallv_seg(mc_comm *c, const void *s, int n_seg, const int64_t *sc, const int64_t *sd, void *r,
                                   const int64_t *rc, const int64_t *rd, mc_dtype t) {
  if (n_seg < 1) return mc_error("alltoallv on the %s group: %d segments per member", c->label, n_seg);
  if (s && s == r) return mc_error("alltoallv on the %s group: send and receive are one buffer", c->label);
  MC_COMM_TIMED(c, c->ops->alltoallv(c, s, n_seg, sc, sd, r, rc, rd, t));
}
static inline int mc_alltoallv(mc_comm *c, const void *s, const int64_t *sc, const int64_t *sd, void *r, const int64_t *rc,
                               const int64_t *rd, mc_dtype t) {
  return mc_alltoallv_seg(c, s, 1, sc, sd, r, rc, rd, t);
}
static inline int mc_send(mc_comm *c, const void *b, int64_t n, mc_dtype t, int peer, int tag) { MC_COMM_TIMED(c, c->ops->send(c, b, n, t, peer, tag)); }
static inline int mc_recv(mc_comm *c, void *b, int64_t n, mc_dtype t, int peer, int tag) { MC_COMM_TIMED(c, c->ops->recv(c, b, n, t, peer, tag)); }
static inline int mc_bcast(mc_comm *c, void *b, int64_t n, mc_dtype t, int root) { MC_COMM_TIMED(c, c->ops->bcast(c, b, n, t, root)); }
static inline int mc_barrier(mc_comm *c) { MC_COMM_TIMED(c, c->ops->barrier(c)); }

static inline int mc_comm_ordered(const mc_comm *c) { return c && c->ops->ordered && c->ops->ordered(c); }

/* The side queue: communication that runs while the compute stream goes on (ZeRO 3 gathers
 * the next layer's weights and reduce-scatters the last one's gradients during a layer).
 * On a stream-ordered communicator, the device-buffer calls made between mc_comm_side_begin
 * and mc_comm_side_end queue on a second stream of their own: after the compute-stream work
 * queued before begin, and not before the compute-stream work queued after it;
 * mc_comm_side_end hands out a ticket, and after mc_comm_side_wait(ticket) the compute stream's
 * later work waits for those calls. Every ticket must be waited for before the backend's
 * queue is synchronised (its sync covers only the compute stream); a ticket stays valid for
 * the next MC_COMM_SIDE_TICKETS - 1 tickets. Calls on host buffers inside still complete on
 * return. Elsewhere (MPI, blocking NCCL) every call completes on return and the three do
 * nothing. Side calls may use other groups than the compute stream's calls at the same time;
 * both ranks of a group must issue its calls in the same order, side or not. */
#define MC_COMM_SIDE_TICKETS 64
static inline int mc_comm_side_begin(mc_comm *c) {
  return mc_comm_ordered(c) && c->ops->side_begin ? c->ops->side_begin(c) : 0;
}
static inline int mc_comm_side_end(mc_comm *c, int *ticket) {
  *ticket = -1;
  return mc_comm_ordered(c) && c->ops->side_end ? c->ops->side_end(c, ticket) : 0;
}
static inline int mc_comm_side_wait(mc_comm *c, int ticket) {
  return ticket >= 0 && mc_comm_ordered(c) && c->ops->side_wait ? c->ops->side_wait(c, ticket) : 0;
}

/* The busy seconds of the layout's groups together (world, tp, dp, pp, ep, edp). On a
 * stream-ordered communicator a device-buffer call's seconds are its queuing only. */
double mc_comm_groups_busy(const mc_comm_groups *g);

#endif
