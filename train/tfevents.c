/* TensorBoard event files (train/tfevents.h). */
#define _POSIX_C_SOURCE 200809L /* gethostname, mkdir */

#include "train/tfevents.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/crc32c.h"
#include "util/error.h"

/* A growing byte buffer for one record. */
typedef struct {
  unsigned char *b;
  size_t n, cap;
  int bad;
} buf;

static void put(buf *o, const void *p, size_t n) {
  if (o->bad) return;
  if (o->n + n > o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    while (cap < o->n + n) cap *= 2;
    unsigned char *b = realloc(o->b, cap);
    if (!b) {
      o->bad = 1;
      return;
    }
    o->b = b, o->cap = cap;
  }
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void varint(buf *o, uint64_t v) {
  unsigned char c[10];
  int k = 0;
  do {
    c[k] = (unsigned char)(v & 0x7F);
    v >>= 7;
    if (v) c[k] |= 0x80;
    k++;
  } while (v);
  put(o, c, (size_t)k);
}

static void le(buf *o, uint64_t v, int bytes) {
  unsigned char c[8];
  for (int i = 0; i < bytes; i++) c[i] = (unsigned char)(v >> (8 * i));
  put(o, c, (size_t)bytes);
}

/* field `num` of wire type 2 (length-delimited) */
static void bytes_field(buf *o, int num, const void *p, size_t n) {
  varint(o, (uint64_t)num << 3 | 2);
  varint(o, n);
  put(o, p, n);
}

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static int write_record(mc_tfevents *t, const buf *rec) {
  buf h = {0};
  le(&h, rec->n, 8);
  le(&h, masked(mc_crc32c(h.b, 8)), 4);
  int ok = !h.bad && fwrite(h.b, 1, h.n, t->f) == h.n && fwrite(rec->b, 1, rec->n, t->f) == rec->n;
  unsigned char c[4];
  uint32_t crc = masked(mc_crc32c(rec->b, rec->n));
  for (int i = 0; i < 4; i++) c[i] = (unsigned char)(crc >> (8 * i));
  ok = ok && fwrite(c, 1, 4, t->f) == 4 && fflush(t->f) == 0;
  free(h.b);
  return ok ? 0 : mc_error("TensorBoard events %s: write failed: %s", t->path, strerror(errno));
}

/* Event header: wall_time (field 1, fixed64 double) and step (field 2, varint). */
static void event_head(buf *o, double wall, int64_t step) {
  uint64_t bits;
  memcpy(&bits, &wall, 8);
  varint(o, 1 << 3 | 1);
  le(o, bits, 8);
  varint(o, 2 << 3 | 0);
  varint(o, (uint64_t)step);
}

int mc_tfevents_open(mc_tfevents *t, const char *dir) {
  memset(t, 0, sizeof *t);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) return mc_error("TensorBoard events: cannot create %s: %s", dir, strerror(errno));
  char host[64] = "host";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "host");
  host[sizeof host - 1] = 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)ts.tv_sec, host, (long)getpid());
  t->f = fopen(t->path, "wb");
  if (!t->f) return mc_error("TensorBoard events: cannot create %s: %s", t->path, strerror(errno));
  buf e = {0};
  event_head(&e, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, 0);
  static const char version[] = "brain.Event:2";
  bytes_field(&e, 3, version, sizeof version - 1);
  int rc = e.bad ? mc_error("TensorBoard events: out of memory") : write_record(t, &e);
  free(e.b);
  if (rc) mc_tfevents_close(t);
  return rc;
}

int mc_tfevents_scalars(mc_tfevents *t, int64_t step, double wall, int n, const char *const *tags, const double *v) {
  if (!t->f) return 0;
  buf sum = {0}, val = {0}, e = {0};
  for (int i = 0; i < n; i++) {
    val.n = 0;
    bytes_field(&val, 1, tags[i], strlen(tags[i]));
    float f = (float)v[i];
    uint32_t bits;
    memcpy(&bits, &f, 4);
    varint(&val, 2 << 3 | 5);
    le(&val, bits, 4);
    bytes_field(&sum, 1, val.b, val.n);
  }
  event_head(&e, wall, step);
  bytes_field(&e, 5, sum.b, sum.n);
  int rc = sum.bad || val.bad || e.bad ? mc_error("TensorBoard events: out of memory") : write_record(t, &e);
  free(sum.b), free(val.b), free(e.b);
  return rc;
}

void mc_tfevents_close(mc_tfevents *t) {
  if (t->f) fclose(t->f);
  t->f = NULL;
}
