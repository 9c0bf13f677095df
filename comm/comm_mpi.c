/* MPI backend of the collective interface (CPU ranks). */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/error.h"

size_t mc_dtype_size(mc_dtype t) {
  switch (t) {
    case MC_DT_F32: case MC_DT_I32: return 4;
    case MC_DT_F64: case MC_DT_I64: return 8;
    case MC_DT_U8: return 1;
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
  char *p = buf;
  while (count > 0) {
    int n = count > INT_MAX ? INT_MAX : (int)count;
    if (check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, mpi_type(t), MPI_SUM, handle(c)), c, "allreduce")) return -1;
    p += (size_t)n * mc_dtype_size(t);
    count -= n;
  }
  return 0;
}

static int mpi_reduce_scatter(mc_comm *c, const void *send, void *recv, const int64_t *counts, mc_dtype t) {
  int *rc = malloc(sizeof(int) * (size_t)c->size);
  int err = !rc || to_int_counts(c, "reduce_scatter", counts, rc, NULL);
  if (!err) err = check_mpi(MPI_Reduce_scatter(send, recv, rc, mpi_type(t), MPI_SUM, handle(c)), c, "reduce_scatter");
  free(rc);
  return err ? -1 : 0;
}

static int mpi_allgather(mc_comm *c, const void *send, void *recv, const int64_t *counts, mc_dtype t) {
  int *rc = malloc(sizeof(int) * 2 * (size_t)c->size);
  int err = !rc || to_int_counts(c, "allgather", counts, rc, rc + c->size);
  if (!err)
    err = check_mpi(MPI_Allgatherv(send, rc[c->rank], mpi_type(t), recv, rc, rc + c->size, mpi_type(t), handle(c)), c,
                    "allgather");
  free(rc);
  return err ? -1 : 0;
}

static int mpi_alltoallv(mc_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv, const int64_t *rc,
                         const int64_t *rd, mc_dtype t) {
  int n = c->size, err = 0;
  int *v = malloc(sizeof(int) * 4 * (size_t)n);
  if (!v) return mc_error("out of memory in alltoallv");
  for (int i = 0; i < n && !err; i++)
    err = fits_int(c, "alltoallv", sc[i]) || fits_int(c, "alltoallv", sd[i]) || fits_int(c, "alltoallv", rc[i]) ||
          fits_int(c, "alltoallv", rd[i]);
  for (int i = 0; i < n && !err; i++) {
    v[i] = (int)sc[i];
    v[n + i] = (int)sd[i];
    v[2 * n + i] = (int)rc[i];
    v[3 * n + i] = (int)rd[i];
  }
  if (!err)
    err = check_mpi(MPI_Alltoallv(send, v, v + n, mpi_type(t), recv, v + 2 * n, v + 3 * n, mpi_type(t), handle(c)), c, "alltoallv");
  free(v);
  return err ? -1 : 0;
}

static int mpi_send(mc_comm *c, const void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  if (fits_int(c, "send", count)) return -1;
  return check_mpi(MPI_Send(buf, (int)count, mpi_type(t), peer, tag, handle(c)), c, "send");
}

static int mpi_recv(mc_comm *c, void *buf, int64_t count, mc_dtype t, int peer, int tag) {
  if (fits_int(c, "recv", count)) return -1;
  return check_mpi(MPI_Recv(buf, (int)count, mpi_type(t), peer, tag, handle(c), MPI_STATUS_IGNORE), c, "recv");
}

static int mpi_bcast(mc_comm *c, void *buf, int64_t count, mc_dtype t, int root) {
  if (fits_int(c, "bcast", count)) return -1;
  return check_mpi(MPI_Bcast(buf, (int)count, mpi_type(t), root, handle(c)), c, "bcast");
}

static int mpi_barrier(mc_comm *c) { return check_mpi(MPI_Barrier(handle(c)), c, "barrier"); }

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
    mpi_send, mpi_recv, mpi_bcast, mpi_barrier, mpi_split, mpi_destroy,
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

