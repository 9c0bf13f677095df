/* Where this process sits in a multi-process job, from the launcher's environment, and the
 * launcher mctrain itself provides (--nproc-per-node). */
#ifndef MC_COMM_LAUNCH_H
#define MC_COMM_LAUNCH_H

typedef struct {
  int rank, size;   /* in the job */
  int local_rank;   /* index of this process on its host: it picks the GPU */
  const char *by;   /* "mpirun", "torchrun" (TORCHELASTIC_RUN_ID set), "RANK/WORLD_SIZE"
                       (set otherwise, e.g. by mctrain --nproc-per-node) or "slurm" (srun) */
  const char *master_addr; /* MASTER_ADDR (not needed under mpirun) */
  int master_port;         /* MASTER_PORT; under torchrun MASTER_PORT + 1, since torchrun's
                              agent holds MASTER_PORT for its own store */
} mc_launch;

/* Reads, in this order: mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, or PMI_RANK/PMI_SIZE),
 * torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and Slurm's SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID inside an srun step (SLURM_STEP_ID set), with MASTER_ADDR and
 * MASTER_PORT. Returns 1 with *out filled when a launcher set them, 0 for a plain process
 * (rank 0 of 1), -1 with mc_error naming the variable that is missing or malformed. */
int mc_launch_read(mc_launch *out);

/* mctrain --nproc-per-node N [--nnodes M --node-rank K]: starts N copies of this program
 * (argv, with the launcher's own options already removed) as ranks K*N .. K*N+N-1 of N*M,
 * with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (one node: 127.0.0.1
 * and a free port, held listening for rank 0: MC_LAUNCH_LISTEN_FD_ENV; several: MASTER_ADDR
 * and MASTER_PORT must be set). SIGINT and SIGTERM
 * are passed on to the workers. When a worker fails, the others are ended (they end
 * themselves through the rendezvous watch; any left after 30 s are killed). Returns the
 * exit status for the launcher: 0 when every worker exited 0, else the first failure's
 * status (128 + signal for a killed worker); 2 for bad arguments (mc_error set). */
int mc_launch_local(int nproc, int nnodes, int node_rank, char **argv);

/* A loopback TCP port that was free a moment ago (the kernel's choice for port 0); -1 if none. */
int mc_launch_free_port(void);

/* One node: the launcher listens on the rendezvous port itself from choosing it until rank 0
 * takes the socket over (inherited, its number in this variable; comm/rendezvous.c), so no
 * other socket of the host can take the port in between. */
#define MC_LAUNCH_LISTEN_FD_ENV "MC_RDV_LISTEN_FD"

#endif
