/* The TCP rendezvous and its liveness watch (comm/rendezvous.h), and the launch environment
 * (comm/launch.h), with forked processes on the loopback: no GPU, no MPI.
 *   - 4 ranks meet, every rank receives rank 0's blob, all finish: every exit status is 0;
 *   - rank 2 exits without finishing: the others (sleeping, as if in a collective) end with
 *     status 1 within seconds, and rank 0 names rank 2;
 *   - rank 0 is killed: the others end with status 1;
 *   - rank 0 given a socket already listening on the port (MC_LAUNCH_LISTEN_FD_ENV, as
 *     mctrain --nproc-per-node hands it on) serves on it: all finish, though the parent keeps
 *     the port taken, so a listen of rank 0's own would fail;
 *   - nobody at MASTER_ADDR:MASTER_PORT: a joining rank fails with a message naming them. */
#define _POSIX_C_SOURCE 200809L

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../check.h"
#include "comm/launch.h"
#include "comm/rendezvous.h"
#include "util/error.h"

enum { N = 4 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* scenario: 0 = all finish, 1 = rank 2 exits early, 2 = rank 0 is killed. The child's exit
 * status: 0 finished, 1 ended by the watch, 5 blob mismatch, 6 rendezvous failed, 7 not
 * ended by the watch within 20 s. */
static void child(int rank, int port, int scenario) {
  char blob[32];
  memset(blob, 0, sizeof blob);
  if (rank == 0) snprintf(blob, sizeof blob, "id-%d", port);
  mc_rdv *r = NULL;
  if (mc_rdv_start(rank, N, "127.0.0.1", port, 20.0, blob, sizeof blob, &r) != 0) {
    fprintf(stderr, "rank %d: %s\n", rank, mc_errmsg());
    _exit(6);
  }
  char want[32];
  memset(want, 0, sizeof want);
  snprintf(want, sizeof want, "id-%d", port);
  if (memcmp(blob, want, sizeof blob) != 0) _exit(5);
  if (scenario == 0) {
    mc_rdv_finish(r);
    _exit(0);
  }
  if (scenario == 1 && rank == 2) _exit(3); /* no finish: a failed rank */
  if (scenario == 2 && rank == 0) raise(SIGKILL);
  sleep(20); /* waiting "in a collective" until the watch ends this process */
  _exit(7);
}

/* A socket listening on a free loopback port (*port). */
static int listening(int *port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16) || getsockname(s, (struct sockaddr *)&a, &n))
    return -1;
  *port = ntohs(a.sin_port);
  return s;
}

/* listener >= 0: rank 0 inherits it (its port is `port`), the parent keeps its copy open. */
static int run_on(int scenario, int status[N], double *secs, int port, int listener) {
  pid_t pid[N];
  fflush(NULL);
  const double t0 = now_s();
  for (int k = 0; k < N; k++) {
    pid[k] = fork();
    if (pid[k] == 0) {
      if (listener >= 0 && k == 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", listener);
        setenv(MC_LAUNCH_LISTEN_FD_ENV, v, 1);
      }
      child(k, port, scenario);
    }
  }
  for (int k = 0; k < N; k++) {
    int st = 0;
    waitpid(pid[k], &st, 0);
    status[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  *secs = now_s() - t0;
  return port;
}

static int run(int scenario, int status[N], double *secs) { return run_on(scenario, status, secs, mc_launch_free_port(), -1); }

int main(void) {
  int st[N];
  double secs = 0;
  run(0, st, &secs);
  for (int k = 0; k < N; k++) CHECK(st[k] == 0, "all finish: rank %d exit %d", k, st[k]);

  run(1, st, &secs);
  CHECK(st[2] == 3, "rank 2 exits 3: %d", st[2]);
  for (int k = 0; k < N; k++)
    if (k != 2) CHECK(st[k] == 1, "rank 2 failed: rank %d should be ended with 1, got %d", k, st[k]);
  CHECK(secs < 10.0, "the job ended %.1f s after rank 2 failed", secs);

  run(2, st, &secs);
  CHECK(st[0] == 128 + SIGKILL, "rank 0 killed: %d", st[0]);
  for (int k = 1; k < N; k++) CHECK(st[k] == 1, "rank 0 killed: rank %d should be ended with 1, got %d", k, st[k]);
  CHECK(secs < 10.0, "the job ended %.1f s after rank 0 was killed", secs);

  int port = -1, ls = listening(&port);
  CHECK(ls >= 0, "a listening loopback socket");
  run_on(0, st, &secs, port, ls);
  for (int k = 0; k < N; k++) CHECK(st[k] == 0, "rank 0 on an inherited listening socket: rank %d exit %d", k, st[k]);
  close(ls);

  /* no rank 0: a joiner gives up after its timeout, naming the address */
  mc_rdv *r = NULL;
  char blob[8];
  CHECK(mc_rdv_start(1, 2, "127.0.0.1", mc_launch_free_port(), 0.5, blob, sizeof blob, &r) != 0 &&
            strstr(mc_errmsg(), "found no rank 0 at 127.0.0.1:") && strstr(mc_errmsg(), "MASTER_ADDR:MASTER_PORT"),
        "no rank 0: %s", mc_errmsg());

  /* the launch environment */
  mc_launch l;
  unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMI_SIZE"), unsetenv("SLURM_STEP_ID"), unsetenv("TORCHELASTIC_RUN_ID");
  unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("LOCAL_RANK");
  CHECK(mc_launch_read(&l) == 0 && l.size == 1 && l.rank == 0, "plain process");
  setenv("WORLD_SIZE", "4", 1), setenv("RANK", "3", 1), setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "node0", 1), setenv("MASTER_PORT", "29500", 1);
  CHECK(mc_launch_read(&l) == 1 && l.size == 4 && l.rank == 3 && l.local_rank == 1 && l.master_port == 29500 &&
            !strcmp(l.master_addr, "node0") && !strcmp(l.by, "RANK/WORLD_SIZE"),
        "torchrun-style variables");
  setenv("TORCHELASTIC_RUN_ID", "x", 1);
  CHECK(mc_launch_read(&l) == 1 && l.master_port == 29501 && !strcmp(l.by, "torchrun"), "torchrun: the next port");
  unsetenv("TORCHELASTIC_RUN_ID");
  setenv("RANK", "4", 1);
  CHECK(mc_launch_read(&l) < 0 && strstr(mc_errmsg(), "RANK=4"), "RANK out of range: %s", mc_errmsg());
  setenv("RANK", "0", 1), setenv("MASTER_PORT", "http", 1);
  CHECK(mc_launch_read(&l) < 0 && strstr(mc_errmsg(), "MASTER_PORT=http"), "bad port: %s", mc_errmsg());
  unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("LOCAL_RANK"), setenv("MASTER_PORT", "29500", 1);
  setenv("SLURM_STEP_ID", "0", 1), setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_LOCALID", "1", 1);
  CHECK(mc_launch_read(&l) == 1 && l.size == 8 && l.rank == 5 && l.local_rank == 1 && !strcmp(l.by, "slurm"), "slurm");
  unsetenv("MASTER_ADDR");
  CHECK(mc_launch_read(&l) < 0 && strstr(mc_errmsg(), "MASTER_ADDR is not set"), "slurm without MASTER_ADDR: %s",
        mc_errmsg());
  printf("%d checks, %d failures\n", mc_check_count, mc_check_failures);
  return mc_check_failures != 0;
}
