/* MPI backend of the collective interface (CPU ranks). */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/clock.h"
#include "util/error.h"

size_t mc_dtype_size(mc_dtype t) {
  switch (t) {
    case MC_DT_F32: case MC_DT_I32: return 4;
    case MC_DT_F64: case MC_DT_I64: return 8;
    case MC_DT_U8: return 1;
    case MC_DT_BF16: return 2;
  }
  return 0;
}

static MPI_Datatype mpi_type(mc_dtype t) {
  switch (t) {
    case MC_DT_F32: return MPI_FLOAT;
    case MC_DT_F64: return MPI_DOUBLE;
    case MC_DT_I32: return MPI_INT32_T;
    case MC_DT_I64: return MPI_INT64_T;
    case MC_DT_U8: return MPI_UINT8_T;
    case MC_DT_BF16: return MPI_UINT16_T; /* moved as bit patterns, never summed */
  }
  return MPI_BYTE;
}

static MPI_Comm handle(mc_comm *c) { return *(MPI_Comm *)c->impl; }

static int check_mpi(int rc, mc_comm *c, const char *op) {
  if (rc == MPI_SUCCESS) return 0;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return mc_error("MPI %s on the %s group (rank %d of %d) failed: %s", op, c->label, c->rank, c->size, msg);
}

/* Collective timeout (docs/reliability.md): every operation is started non-blocking and
 * waited for with a deadline, so a stalled rank (SIGSTOP, a hung device) ends the job with a
 * message instead of leaving the others spinning for ever. MC_COMM_TIMEOUT_S seconds without
 * completion (default 600; 0 waits for ever) abort the whole job. */
static double timeout_s(void) {
  static double t = -1;
  if (t < 0) {
    const char *e = getenv("MC_COMM_TIMEOUT_S");
    t = e && e[0] ? atof(e) : 600.0;
    if (t < 0) t = 0;
  }
  return t;
}


static int wait_req(int start_rc, MPI_Request *r, mc_comm *c, const char *op) {
  if (start_rc != MPI_SUCCESS) return start_rc;
  double limit = timeout_s(), t0 = limit > 0 ? mc_now_s() : 0;
  for (unsigned long spin = 0;; spin++) {
    int done = 0, rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (spin % 64 == 63) sched_yield(); /* oversubscribed ranks share cores */
    if (limit > 0 && spin % 1024 == 1023 && mc_now_s() - t0 > limit) {
      fprintf(stderr,
              "MPI %s on the %s group (rank %d of %d, world rank %d): no completion after %.0f s "
              "(MC_COMM_TIMEOUT_S): another rank is stalled or gone; aborting the job\n",
              op, c->label, c->rank, c->size, c->world_rank, limit);
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      return MPI_ERR_OTHER;
    }
  }
}

/* MPI counts are int: larger element counts are refused rather than truncated. */
static int fits_int(mc_comm *c, const char *op, int64_t n) {
  if (n < 0 || n > INT_MAX) return mc_error("MPI %s on the %s group: count %lld is outside [0, INT_MAX]", op, c->label, (long long)n);
  return 0;
}

static int to_int_counts(mc_comm *c, const char *op, const int64_t *in, int *out, int *displs) {
  int64_t at = 0;
  for (int i = 0; i < c->size; i++) {
    if (fits_int(c, op, in[i]) || fits_int(c, op, at)) return -1;
    out[i] = (int)in[i];
    if (displs) displs[i] = (int)at;
    at += in[i];
  }
  return fits_int(c, op, at);
}

static int mpi_allreduce(mc_comm *c, void *buf, int64_t count, mc_dtype t) {
  /* Large buffers go in INT_MAX-sized pieces. */
  MPI_Request req;
  char *p = buf;
  while (count > 0) {
    int n = count > INT_MAX ? INT_MAX : (int)count;
    if (check_mpi(wait_req(MPI_Iallreduce(MPI_IN_PLACE, p, n, mpi_type(t), MPI_SUM, handle(c), &req), &req, c, "allreduce"), c, "allreduce")) return -1;
    p += (size_t)n * mc_dtype_size(t);
    count -= n;
  }
  return 0;
}

/* Segments (comm.h) one collective after another: the CPU reference path. */

static int mpi_reduce_scatter(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t) {
  MPI_Request req;
  const size_t es = mc_dtype_size(t), block = (size_t)mc_counts_total(counts, c->size) * es, mine = (size_t)counts[c->rank] * es;
  int *rc = malloc(sizeof(int) * (size_t)c->size);
  int err = !rc || to_int_counts(c, "reduce_scatter", counts, rc, NULL);
  for (int k = 0; !err && k < n_seg; k++)
    err = check_mpi(wait_req(MPI_Ireduce_scatter((const char *)send + k * block, (char *)recv + k * mine, rc, mpi_type(t),
                                                 MPI_SUM, handle(c), &req),
                             &req, c, "reduce_scatter"),
                    c, "reduce_scatter");
  free(rc);
  return err ? -1 : 0;
}

static int mpi_allgather(mc_comm *c, const void *send, int n_seg, void *recv, const int64_t *counts, mc_dtype t) {
  MPI_Request req;
  const size_t es = mc_dtype_size(t), block = (size_t)mc_counts_total(counts, c->size) * es, mine = (size_t)counts[c->rank] * es;
  int *rc = malloc(sizeof(int) * 2 * (size_t)c->size);
  int err = !rc || to_int_counts(c, "allgather", counts, rc, rc + c->size);
  for (int k = 0; !err && k < n_seg; k++)
    err = check_mpi(wait_req(MPI_Iallgatherv((const char *)send + k * mine, rc[c->rank], mpi_type(t), (char *)recv + k * block,
                                             rc, rc + c->size, mpi_type(t), handle(c), &req),
                             &req, c, "allgather"),
                    c, "allgather");
  free(rc);
  return err ? -1 : 0;
}

/* Member j's n_seg segments (counts cnt, displacements displ, [j * n_seg + k]) as one indexed
 * datatype of t, for MPI_Ialltoallw. */
static int seg_type(mc_comm *c, mc_dtype t, int n_seg, const int64_t *cnt, const int64_t *displ, int *len, int *at,
                    MPI_Datatype *out) {
  for (int k = 0; k < n_seg; k++) {
    if (fits_int(c, "alltoallv", cnt[k]) || fits_int(c, "alltoallv", displ[k])) return -1;
    len[k] = (int)cnt[k], at[k] = (int)displ[k];
  }
  if (check_mpi(MPI_Type_indexed(n_seg, len, at, mpi_type(t), out), c, "alltoallv")) return -1;
  if (check_mpi(MPI_Type_commit(out), c, "alltoallv")) {
    MPI_Type_free(out);
    return -1;
  }
  return 0;
}

/* One MPI_Ialltoallw whose per-member types pick the member's segments (one segment per
 * member is MPI's alltoallv). */
static int mpi_alltoallv(mc_comm *c, const void *send, int n_seg, const int64_t *sc, const int64_t *sd, void *recv,
                         const int64_t *rc, const int64_t *rd, mc_dtype t) {
  const int n = c->size;
  MPI_Datatype *ty = malloc(sizeof(MPI_Datatype) * 2 * (size_t)n);
  int *v = malloc(sizeof(int) * (2 * (size_t)n + 2 * (size_t)n_seg));
  if (!ty || !v) {
    free(ty), free(v);
    return mc_error("out of memory in alltoallv");
  }
  int made = 0, err = 0;
  for (int j = 0; j < n && !err; j++, made++)
    err = seg_type(c, t, n_seg, sc + (size_t)j * n_seg, sd + (size_t)j * n_seg, v + 2 * n, v + 2 * n + n_seg, &ty[j]);
  for (int j = 0; j < n && !err; j++, made++)
    err = seg_type(c, t, n_seg, rc + (size_t)j * n_seg, rd + (size_t)j * n_seg, v + 2 * n, v + 2 * n + n_seg, &ty[n + j]);
  if (err) made--; /* the failed one was not made */
  for (int j = 0; j < n; j++) v[j] = 1, v[n + j] = 0; /* one of each member's type, at byte 0 */
  if (!err) {
    MPI_Request req;
    err = check_mpi(wait_req(MPI_Ialltoallw(send, v, v + n, ty, recv, v, v + n, ty + n, handle(c), &req), &req, c,
                             "alltoallv"),
                    c, "alltoallv");
  }
  for (int j = 0; j < made; j++) MPI_Type_free(&ty[j]); /* ty[0, n): send types, then the receive types */
  free(ty), free(v);
  return err ? -1 : 0;
}

static int mpi_send(mc_comm *c, const void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  MPI_Request req;
  if (fits_int(c, "send", count)) return -1;
  return check_mpi(wait_req(MPI_Isend(buf, (int)count, mpi_type(t), peer, tag, handle(c), &req), &req, c, "send"), c, "send");
}

static int mpi_recv(mc_comm *c, void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  MPI_Request req;
  if (fits_int(c, "recv", count)) return -1;
  return check_mpi(wait_req(MPI_Irecv(buf, (int)count, mpi_type(t), peer, tag, handle(c), &req), &req, c, "recv"), c, "recv");
}

static int mpi_bcast(mc_comm *c, void *buf, int64_t count, mc_dtype t, int root) {
  MPI_Request req;
  if (fits_int(c, "bcast", count)) return -1;
  return check_mpi(wait_req(MPI_Ibcast(buf, (int)count, mpi_type(t), root, handle(c), &req), &req, c, "bcast"), c, "bcast");
}

static int mpi_barrier(mc_comm *c) {
  MPI_Request req;
  return check_mpi(wait_req(MPI_Ibarrier(handle(c), &req), &req, c, "barrier"), c, "barrier");
}

static mc_comm *wrap(MPI_Comm h, const char *label, int world_rank);

static mc_comm *mpi_split(mc_comm *c, int color, int key, const char *label) {
  MPI_Comm h;
  if (check_mpi(MPI_Comm_split(handle(c), color, key, &h), c, "comm_split")) return NULL;
  MPI_Comm_set_errhandler(h, MPI_ERRORS_RETURN);
  mc_comm *out = wrap(h, label, c->world_rank);
  if (!out) MPI_Comm_free(&h);
  return out;
}

static void mpi_destroy(mc_comm *c) {
  if (!c) return;
  MPI_Comm *h = c->impl;
  if (h && *h != MPI_COMM_WORLD) MPI_Comm_free(h);
  free(h);
  free(c);
}

static const mc_comm_ops MPI_OPS = {
    "mpi", mpi_allreduce, mpi_reduce_scatter, mpi_allgather, mpi_alltoallv,
    mpi_send, mpi_recv, mpi_bcast, mpi_barrier, mpi_split, mpi_destroy, NULL, NULL, NULL, NULL,
};

static mc_comm *wrap(MPI_Comm h, const char *label, int world_rank) {
  mc_comm *c = calloc(1, sizeof *c);
  MPI_Comm *hp = malloc(sizeof *hp);
  if (!c || !hp) {
    free(c);
    free(hp);
    mc_error("out of memory creating the %s communicator", label);
    return NULL;
  }
  *hp = h;
  c->ops = &MPI_OPS;
  c->label = label;
  c->impl = hp;
  c->world_rank = world_rank;
  MPI_Comm_rank(h, &c->rank);
  MPI_Comm_size(h, &c->size);
  return c;
}

int mc_comm_mpi_init(int *argc, char ***argv, mc_comm **world) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(argc, argv) != MPI_SUCCESS) return mc_error("MPI_Init failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  *world = wrap(MPI_COMM_WORLD, "world", r);
  return *world ? 0 : -1;
}

void mc_comm_mpi_finalize(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

