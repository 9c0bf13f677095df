/* TCP rendezvous and liveness watch (comm/rendezvous.h).
 *
 * Messages after the hand-out, one byte each: 'B' = the sender finished normally; from rank
 * 0 only, 'A' followed by a 4-byte rank = that rank failed, end now. A socket that reaches
 * end-of-file without a 'B' means its process ended without finishing. */
#define _POSIX_C_SOURCE 200809L /* getaddrinfo, nanosleep */

#include "comm/rendezvous.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/launch.h"
#include "util/clock.h"
#include "util/error.h"

struct mc_rdv {
  int rank, size;
  int *fd;        /* rank 0: fd[k] is rank k's socket (fd[0] = -1); others: fd[0] to rank 0 */
  int *finished;  /* rank 0: rank k said 'B' */
  int wake[2];    /* a pipe that stops the watch thread */
  pthread_t watch;
  int watching;
  pthread_mutex_t lock; /* serialises writes to the sockets between the watch and finish */
};


static void nap_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}

/* Reads n bytes, waiting at most until `deadline` (mc_now_s() clock). */
static int read_all(int fd, void *p, size_t n, double deadline) {
  char *c = p;
  while (n > 0) {
    int left = (int)((deadline - mc_now_s()) * 1000.0);
    if (left <= 0) return -1;
    struct pollfd q = {fd, POLLIN, 0};
    int pr = poll(&q, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return -1;
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

static struct addrinfo *resolve(const char *addr, int port, int passive) {
  char svc[16];
  snprintf(svc, sizeof svc, "%d", port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  int rc = getaddrinfo(passive ? NULL : addr, svc, &hints, &res);
  if (rc != 0) {
    mc_error("rendezvous: cannot resolve MASTER_ADDR=%s port %d: %s", addr, port, gai_strerror(rc));
    return NULL;
  }
  return res;
}

/* ------------------------------------------------------------------ the watch */

static void end_job(mc_rdv *r, int failed) {
  if (r->rank == 0) {
    fprintf(stderr, "rank 0: rank %d of %d ended before the job finished (it failed or was killed); ending the job\n",
            failed, r->size);
    unsigned char msg[5] = {'A'};
    int32_t f = failed;
    memcpy(msg + 1, &f, 4);
    pthread_mutex_lock(&r->lock);
    for (int k = 1; k < r->size; k++)
      if (k != failed && r->fd[k] >= 0 && !r->finished[k]) (void)write_all(r->fd[k], msg, sizeof msg);
    pthread_mutex_unlock(&r->lock);
  } else if (failed == 0 && r->rank == 1) {
    fprintf(stderr, "rank 1: rank 0 of %d ended before the job finished (it failed or was killed); ending the job\n",
            r->size);
  }
  fflush(stderr);
  _exit(1);
}

static void *watch_main(void *arg) {
  mc_rdv *r = arg;
  const int n = r->rank == 0 ? r->size : 1;
  struct pollfd *q = calloc((size_t)n + 1, sizeof *q);
  if (!q) return NULL;
  for (;;) {
    int m = 0;
    q[m++] = (struct pollfd){r->wake[0], POLLIN, 0};
    for (int k = 0; k < n; k++) {
      int fd = r->rank == 0 ? r->fd[k] : r->fd[0];
      if (r->rank == 0 && (k == 0 || r->finished[k])) fd = -1;
      q[m++] = (struct pollfd){fd, POLLIN, 0};
    }
    int pr = poll(q, (nfds_t)m, -1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) break;
    if (q[0].revents) break; /* finishing */
    for (int k = 0; k < n; k++) {
      if (!q[k + 1].revents || q[k + 1].fd < 0) continue;
      unsigned char b = 0;
      ssize_t got = recv(q[k + 1].fd, &b, 1, 0);
      if (got < 0 && errno == EINTR) continue;
      if (r->rank == 0) {
        if (got == 1 && b == 'B') r->finished[k] = 1;
        else end_job(r, k);
      } else {
        if (got == 1 && b == 'B') goto done; /* rank 0 finished: nothing left to watch */
        if (got == 1 && b == 'A') {
          int32_t f = -1;
          (void)read_all(r->fd[0], &f, 4, mc_now_s() + 1.0);
          _exit(1); /* rank 0 has named the failed rank */
        }
        end_job(r, 0);
      }
    }
  }
done:
  free(q);
  return NULL;
}

/* ------------------------------------------------------------------ start and finish */

static void rdv_free(mc_rdv *r) {
  if (!r) return;
  for (int k = 0; r->fd && k < (r->rank == 0 ? r->size : 1); k++)
    if (r->fd[k] >= 0) close(r->fd[k]);
  if (r->wake[0] >= 0) close(r->wake[0]), close(r->wake[1]);
  pthread_mutex_destroy(&r->lock);
  free(r->fd), free(r->finished), free(r);
}

/* The socket mctrain --nproc-per-node listens on for rank 0 (comm/launch.h), when this
 * process inherited one on `port`; else -1. */
static int inherited_listener(int port) {
  const char *v = getenv(MC_LAUNCH_LISTEN_FD_ENV);
  if (!v) return -1;
  char *end = NULL;
  long fd = strtol(v, &end, 10);
  unsetenv(MC_LAUNCH_LISTEN_FD_ENV);
  int acc = 0;
  socklen_t n = sizeof acc;
  struct sockaddr_in a;
  socklen_t la = sizeof a;
  if (!end || *end || fd < 0 || fd > INT_MAX || getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &n) != 0 || !acc ||
      getsockname((int)fd, (struct sockaddr *)&a, &la) != 0 || a.sin_family != AF_INET || ntohs(a.sin_port) != port)
    return -1;
  return (int)fd;
}

static int serve(mc_rdv *r, const char *addr, int port, double timeout_s, const void *blob, size_t len) {
  int ls = inherited_listener(port), one = 1, rc = 0;
  if (ls < 0) {
    struct addrinfo *ai = resolve(addr, port, 1);
    if (!ai) return -1;
    ls = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    rc = ls < 0 ? -1 : 0;
    if (!rc) setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!rc && (bind(ls, ai->ai_addr, ai->ai_addrlen) != 0 || listen(ls, r->size) != 0))
      rc = mc_error("rendezvous: rank 0 cannot listen on port %d (MASTER_PORT): %s", port, strerror(errno));
    freeaddrinfo(ai);
    if (ls < 0) return mc_error("rendezvous: socket: %s", strerror(errno));
  }
  const double deadline = mc_now_s() + timeout_s;
  for (int joined = 1; !rc && joined < r->size;) {
    int left = (int)((deadline - mc_now_s()) * 1000.0);
    struct pollfd q = {ls, POLLIN, 0};
    if (left <= 0 || poll(&q, 1, left) <= 0) {
      rc = mc_error("rendezvous: rank 0 waited %.0f s on port %d and %d of the %d ranks joined", timeout_s, port,
                    joined, r->size);
      break;
    }
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    int32_t k = -1;
    if (read_all(fd, &k, 4, deadline) != 0 || k <= 0 || k >= r->size || r->fd[k] >= 0) {
      close(fd); /* not one of ours (or a duplicate rank): ignore it */
      continue;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    r->fd[k] = fd;
    joined++;
  }
  close(ls);
  for (int k = 1; !rc && k < r->size; k++)
    if (write_all(r->fd[k], blob, len) != 0) rc = mc_error("rendezvous: sending the id to rank %d failed", k);
  return rc;
}

/* A connect to a local port nobody listens on yet can connect the socket to itself (TCP
 * simultaneous open, when the kernel picks that very port as the source port); it would then
 * hold rank 0's port, whose listen fails. Such a socket is dropped and the connect retried. */
static int self_connected(int fd) {
  struct sockaddr_storage a, b;
  socklen_t la = sizeof a, lb = sizeof b;
  memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
  if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 || getpeername(fd, (struct sockaddr *)&b, &lb) != 0) return 0;
  return la == lb && memcmp(&a, &b, la) == 0;
}

static int join(mc_rdv *r, const char *addr, int port, double timeout_s, void *blob, size_t len) {
  const double deadline = mc_now_s() + timeout_s;
  int fd = -1;
  while (fd < 0) {
    struct addrinfo *ai = resolve(addr, port, 0);
    if (!ai) return -1;
    fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd >= 0 && (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 || self_connected(fd))) close(fd), fd = -1;
    freeaddrinfo(ai);
    if (fd >= 0) break;
    if (mc_now_s() > deadline)
      return mc_error("rendezvous: rank %d found no rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.0f s", r->rank,
                      addr, port, timeout_s);
    nap_ms(100);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  r->fd[0] = fd;
  int32_t k = r->rank;
  if (write_all(fd, &k, 4) != 0 || read_all(fd, blob, len, deadline) != 0)
    return mc_error("rendezvous: rank %d connected to %s:%d but received no id from rank 0", r->rank, addr, port);
  return 0;
}

int mc_rdv_start(int rank, int size, const char *addr, int port, double timeout_s, void *blob, size_t len,
                 mc_rdv **out) {
  *out = NULL;
  if (size < 2 || rank < 0 || rank >= size) return mc_error("rendezvous: rank %d of %d is not a valid rank", rank, size);
  if (port <= 0 || port > 65535) return mc_error("rendezvous: MASTER_PORT=%d is not a TCP port", port);
  mc_rdv *r = calloc(1, sizeof *r);
  if (!r) return mc_error("rendezvous: out of memory");
  r->rank = rank, r->size = size, r->wake[0] = r->wake[1] = -1;
  pthread_mutex_init(&r->lock, NULL);
  const int n = rank == 0 ? size : 1;
  r->fd = malloc(sizeof(int) * (size_t)n);
  r->finished = calloc((size_t)n, sizeof(int));
  if (!r->fd || !r->finished || pipe(r->wake) != 0) {
    rdv_free(r);
    return mc_error("rendezvous: out of memory or descriptors");
  }
  for (int k = 0; k < n; k++) r->fd[k] = -1;
  int rc = rank == 0 ? serve(r, addr, port, timeout_s, blob, len) : join(r, addr, port, timeout_s, blob, len);
  if (!rc && pthread_create(&r->watch, NULL, watch_main, r) != 0) rc = mc_error("rendezvous: cannot start the watch");
  if (rc) {
    rdv_free(r);
    return -1;
  }
  r->watching = 1;
  *out = r;
  return 0;
}

void mc_rdv_finish(mc_rdv *r) {
  if (!r) return;
  if (r->watching) {
    char b = 1;
    if (write(r->wake[1], &b, 1) == 1) pthread_join(r->watch, NULL);
  }
  const char bye = 'B';
  pthread_mutex_lock(&r->lock);
  for (int k = 0; k < (r->rank == 0 ? r->size : 1); k++)
    if (r->fd[k] >= 0 && !(r->rank == 0 && r->finished[k])) (void)write_all(r->fd[k], &bye, 1);
  pthread_mutex_unlock(&r->lock);
  rdv_free(r);
}
