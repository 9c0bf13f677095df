/* The launch environment and the local launcher (comm/launch.h). */
#define _POSIX_C_SOURCE 200809L /* setenv, sigaction, kill */

#include "comm/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/error.h"

/* An integer environment variable in [lo, hi]: 1 and *v set; 0 when unset; -1 when malformed. */
static int env_int(const char *name, long lo, long hi, int *v) {
  const char *s = getenv(name);
  if (!s) return 0;
  char *end = NULL;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi)
    return mc_error("%s=%s is not an integer in [%ld, %ld]", name, s, lo, hi);
  *v = (int)x;
  return 1;
}

static int need_int(const char *name, const char *by, long lo, long hi, int *v) {
  int rc = env_int(name, lo, hi, v);
  if (rc == 0) return mc_error("%s is not set (a %s launch sets it)", name, by);
  return rc < 0 ? -1 : 0;
}

static int read_master(mc_launch *o) {
  o->master_addr = getenv("MASTER_ADDR");
  if (!o->master_addr || !*o->master_addr)
    return mc_error("MASTER_ADDR is not set: a %s launch of %d ranks without mpirun meets at MASTER_ADDR:MASTER_PORT "
                    "(rank 0's host and a free TCP port)", o->by, o->size);
  return need_int("MASTER_PORT", o->by, 1, 65535, &o->master_port);
}

int mc_launch_read(mc_launch *o) {
  memset(o, 0, sizeof *o);
  o->size = 1;
  int r = 0;
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) {
    o->by = "mpirun";
    const int ompi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    if (need_int(ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", "mpirun", 0, INT_MAX, &o->rank) ||
        need_int(ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", "mpirun", 1, INT_MAX, &o->size))
      return -1;
    if (env_int(ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", 0, INT_MAX, &o->local_rank) < 0) return -1;
    return 1;
  }
  if ((r = env_int("WORLD_SIZE", 1, INT_MAX, &o->size)) != 0) {
    if (r < 0) return -1;
    const int torchrun = getenv("TORCHELASTIC_RUN_ID") != NULL;
    o->by = torchrun ? "torchrun" : "RANK/WORLD_SIZE";
    if (need_int("RANK", o->by, 0, o->size - 1, &o->rank)) return -1;
    if (env_int("LOCAL_RANK", 0, INT_MAX, &o->local_rank) < 0) return -1;
    if (o->size > 1 && read_master(o)) return -1;
    /* torchrun's agent keeps its own store on MASTER_PORT: the rendezvous takes the next port */
    if (o->size > 1 && torchrun && o->master_port++ == 65535)
      return mc_error("MASTER_PORT=65535: under torchrun MegaC's rendezvous uses MASTER_PORT + 1");
    return 1;
  }
  if (getenv("SLURM_STEP_ID") && getenv("SLURM_NTASKS")) {
    o->by = "slurm";
    if (need_int("SLURM_NTASKS", "slurm", 1, INT_MAX, &o->size) ||
        need_int("SLURM_PROCID", "slurm", 0, o->size - 1, &o->rank) ||
        env_int("SLURM_LOCALID", 0, INT_MAX, &o->local_rank) < 0)
      return -1;
    return o->size > 1 && read_master(o) ? -1 : 1;
  }
  o->size = 1;
  return 0;
}

/* ------------------------------------------------------------------ local launcher */

static volatile sig_atomic_t g_signal = 0;
static void on_signal(int sig) { g_signal = sig; }

/* A socket listening on a free loopback port (*port), closed on exec unless handed on. */
static int listen_free_port(int *port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, SOMAXCONN) != 0 ||
      getsockname(s, (struct sockaddr *)&a, &n) != 0) {
    close(s);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return s;
}

int mc_launch_free_port(void) {
  int port = -1, s = listen_free_port(&port);
  if (s < 0) return -1;
  close(s);
  return port;
}

static int status_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1; }

int mc_launch_local(int nproc, int nnodes, int node_rank, char **argv) {
  if (nproc < 1 || nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    mc_error("--nproc-per-node %d --nnodes %d --node-rank %d: need N >= 1, M >= 1 and 0 <= K < M", nproc, nnodes,
             node_rank);
    return 2;
  }
  char port[16], addr[256];
  int listener = -1; /* one node: rank 0's rendezvous socket, listening already */
  if (nnodes == 1) {
    int p = -1;
    if ((listener = listen_free_port(&p)) < 0) {
      mc_error("--nproc-per-node: no free local TCP port for the rendezvous: %s", strerror(errno));
      return 2;
    }
    snprintf(port, sizeof port, "%d", p);
    snprintf(addr, sizeof addr, "127.0.0.1");
  } else {
    const char *a = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
    if (!a || !p) {
      mc_error("--nnodes %d: set MASTER_ADDR and MASTER_PORT to node 0's address and a free port on every node", nnodes);
      return 2;
    }
    snprintf(addr, sizeof addr, "%s", a);
    snprintf(port, sizeof port, "%s", p);
  }
  const int world = nproc * nnodes;
  pid_t *pid = calloc((size_t)nproc, sizeof *pid);
  if (!pid) {
    if (listener >= 0) close(listener);
    mc_error("--nproc-per-node: out of memory");
    return 2;
  }
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  fflush(NULL);
  int started = 0, code = 0;
  for (int i = 0; i < nproc; i++) {
    pid_t p = fork();
    if (p == 0) {
      char v[32];
      snprintf(v, sizeof v, "%d", node_rank * nproc + i), setenv("RANK", v, 1);
      snprintf(v, sizeof v, "%d", world), setenv("WORLD_SIZE", v, 1);
      snprintf(v, sizeof v, "%d", i), setenv("LOCAL_RANK", v, 1);
      snprintf(v, sizeof v, "%d", nproc), setenv("LOCAL_WORLD_SIZE", v, 1);
      setenv("MASTER_ADDR", addr, 1), setenv("MASTER_PORT", port, 1);
      if (listener >= 0 && i == 0) { /* rank 0 keeps the listening socket across exec */
        snprintf(v, sizeof v, "%d", listener), setenv(MC_LAUNCH_LISTEN_FD_ENV, v, 1);
        fcntl(listener, F_SETFD, 0);
      }
      sigaction(SIGINT, &old_int, NULL), sigaction(SIGTERM, &old_term, NULL);
      execv("/proc/self/exe", argv);
      fprintf(stderr, "--nproc-per-node: cannot start worker %d: %s\n", i, strerror(errno));
      _exit(127);
    }
    if (p < 0) {
      fprintf(stderr, "--nproc-per-node: fork of worker %d failed: %s\n", i, strerror(errno));
      code = 1;
      break;
    }
    pid[i] = p, started++;
  }
  if (listener >= 0) close(listener); /* rank 0 has its copy */
  if (code) /* end what was started: it would wait for the missing ranks */
    for (int i = 0; i < started; i++) kill(pid[i], SIGKILL);
  int left = started, forwarded = 0;
  double kill_at = -1.0;
  while (left > 0) {
    if (g_signal && !forwarded) { /* pass Ctrl-C / preemption on: workers checkpoint and stop */
      for (int i = 0; i < nproc; i++)
        if (pid[i] > 0) kill(pid[i], g_signal);
      forwarded = 1;
    }
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p < 0 && errno != EINTR) break;
    if (p > 0) {
      for (int i = 0; i < nproc; i++)
        if (pid[i] == p) {
          pid[i] = 0, left--;
          int c = status_code(st);
          if (c != 0 && code == 0) {
            code = c;
            kill_at = mc_now_s() + 30.0; /* the watch ends the others long before */
          }
        }
      continue;
    }
    if (kill_at > 0) {
      if (mc_now_s() > kill_at) {
        for (int i = 0; i < nproc; i++)
          if (pid[i] > 0) kill(pid[i], SIGKILL);
        kill_at = -1.0;
      }
    }
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  sigaction(SIGINT, &old_int, NULL), sigaction(SIGTERM, &old_term, NULL);
  free(pid);
  if (code == 0 && g_signal) code = 128 + g_signal;
  return code;
}
