/* The TCP rendezvous of processes started without mpirun (torchrun, Slurm, mctrain
 * --nproc-per-node): rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank connects
 * and receives a blob from rank 0 (the NCCL unique id). The connections then stay open as a
 * liveness watch: a process that ends without mc_rdv_finish (an error, a crash, a kill) closes
 * its socket, rank 0 sees it, prints one line naming that rank and ends every process of the
 * job (exit status 1), so a failed rank never leaves the others waiting in a collective. */
#ifndef MC_COMM_RENDEZVOUS_H
#define MC_COMM_RENDEZVOUS_H

#include <stddef.h>

typedef struct mc_rdv mc_rdv;

/* Connects `size` processes (rank 0 waits up to timeout_s for the others, the others retry
 * their connection as long). Rank 0 sends blob[0..len) to every rank; the others receive it
 * into blob. 0 and *out set; -1 with mc_error naming the address, port and rank. */
int mc_rdv_start(int rank, int size, const char *addr, int port, double timeout_s, void *blob, size_t len,
                 mc_rdv **out);

/* This process finished normally: tells rank 0 (or, on rank 0, every rank) and stops
 * watching. Frees r. */
void mc_rdv_finish(mc_rdv *r);

#endif
