#define _POSIX_C_SOURCE 200809L
#include "reshard/execute.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/dtype.h"
#include "util/clock.h"
#include "util/order.h"

/* A shard as the streaming executor sees it: its box in the tensor's "view", the tensor
 * seen as [D0, D1, D2] and streamed in bands of whole view rows (dimension 0). When every
 * shard of the tensor spans full trailing dimensions, the view is flat ([numel, 1, 1]) so
 * that bands can be any size; otherwise 2-D tensors are [rows, 1, cols] and 3-D tensors are
 * themselves. The view box is always 3-D; it is not a box of the global tensor. */
typedef struct {
  mc_box view;            /* ndim 3, in view coordinates (to_view) */
  int alias;              /* target only: the source shard holding exactly its slab, or -1 */
  unsigned char sha[32];  /* source only: its digest, once complete */
} stream_shard;

typedef struct {
  const mc_rs_plan *p;
  const mc_geometry *g;
  const mc_rs_io *io;
  int64_t chunk;
  int *order; /* tensors, largest first */
  atomic_int next;
  atomic_int abort;
  atomic_llong bytes_read, bytes_written;
  atomic_int workers_done;
  pthread_mutex_t err_lock;
  char err[MC_ERRMSG_MAX];
} exec_shared;

int mc_rs_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 2 ? 2 : n > 8 ? 8 : (int)n;
}


static void set_error(exec_shared *x) {
  pthread_mutex_lock(&x->err_lock);
  if (!x->err[0]) snprintf(x->err, sizeof x->err, "%s", mc_errmsg());
  pthread_mutex_unlock(&x->err_lock);
  atomic_store(&x->abort, 1);
}

/* The bytes tensor t moves, read and written, halved (the progress bar's unit, which is a
 * tensor's size when both sides have the same dtype). */
static int64_t tensor_bytes(const mc_rs_plan *p, int t) {
  int64_t b = 0;
  const mc_rs_tensor *tn = &p->tensors[t];
  const int64_t es = (int64_t)(mc_elem_dtype_size(tn->src_dtype) + mc_elem_dtype_size(tn->dtype));
  for (int i = 0; i < tn->n_src; i++) b += mc_box_numel(&p->src[tn->first_src + i].slab) * es / 2;
  return b;
}

/* The global shape of a tensor: its state's (mc_state_shape: the family's, [1] for a scalar
 * kind), with its element count. */
typedef struct {
  int ndim;
  int64_t shape[3], numel;
} tshape;

static tshape tensor_shape(const mc_family *f, mc_state st) {
  tshape t = {0, {1, 1, 1}, 1};
  t.ndim = mc_state_shape(f->ndim, f->shape, st, t.shape);
  for (int d = 0; d < t.ndim; d++) t.numel *= t.shape[d];
  return t;
}

static int full_width(const mc_box *s, const tshape *f) {
  for (int d = 1; d < f->ndim; d++)
    if (s->start[d] != 0 || s->count[d] != f->shape[d]) return 0;
  return 1;
}

/* The view box of global box s (see stream_shard). */
static mc_box to_view(const mc_box *s, const tshape *f, int flat) {
  mc_box v = {3, {0, 0, 0}, {1, 1, 1}};
  if (flat) {
    int64_t rowel = 1;
    for (int d = 1; d < f->ndim; d++) rowel *= f->shape[d];
    v.start[0] = s->start[0] * rowel, v.count[0] = s->count[0] * rowel;
  } else if (f->ndim == 2) {
    v.start[0] = s->start[0], v.count[0] = s->count[0];
    v.start[2] = s->start[1], v.count[2] = s->count[1];
  } else {
    for (int d = 0; d < 3; d++) v.start[d] = s->start[d], v.count[d] = s->count[d];
  }
  return v;
}

/* Copies rows [a, e) of a shard between its packed buffer and the band (rows [r0, ...)). */
static void move_rows(float *band, const int64_t D[3], int64_t r0, const mc_box *b, int64_t a, int64_t e,
                      float *packed, int to_band) {
  int64_t rowel = D[1] * D[2], srow = b->count[1] * b->count[2];
  for (int64_t r = a; r < e; r++)
    for (int64_t i = 0; i < b->count[1]; i++) {
      float *bp = band + (r - r0) * rowel + (b->start[1] + i) * D[2] + b->start[2];
      float *pp = packed + (r - a) * srow + i * b->count[2];
      if (to_band) memcpy(bp, pp, (size_t)b->count[2] * sizeof(float));
      else memcpy(pp, bp, (size_t)b->count[2] * sizeof(float));
    }
}

static int sha_finish(EVP_MD_CTX *c, unsigned char out[32]) {
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(c, out, &len) != 1 || len != 32) return mc_error("SHA-256 failed");
  return 0;
}

/* The stored bytes of n fp32 values in dtype dt: the values themselves for float32, else
 * narrowed into raw. */
static const void *as_stored(int dt, const float *buf, unsigned char *raw, int64_t n) {
  if (dt == MC_ELEM_F32) return buf;
  mc_elem_narrow(dt, buf, raw, n);
  return raw;
}

/* An int64 tensor (a counter: AdamW's step) has no fp32 values and is never converted: its one
 * element travels as its stored bytes, read from its one source shard (io->read gives an
 * int64 source's stored bytes) and written unchanged to every target, each the same box (a
 * scalar kind's [0, 1)). */
static int run_int64(exec_shared *x, int ti, EVP_MD_CTX **ctx) {
  const mc_rs_plan *p = x->p;
  const mc_rs_tensor *tn = &p->tensors[ti];
  const char *name = x->g->fams.f[tn->fam].name, *st = mc_state_name(tn->state);
  if (tn->src_dtype != tn->dtype)
    return mc_error("%s/%s: int64 is never converted (%s to %s)", name, st, mc_elem_dtype_name(tn->src_dtype),
                    mc_elem_dtype_name(tn->dtype));
  const mc_box *sb = &p->src[tn->first_src].slab;
  if (tn->n_src != 1 || mc_box_numel(sb) != 1) return mc_error("%s/%s: an int64 state moves as one element of one shard", name, st);
  for (int i = 0; i < tn->n_tgt; i++)
    if (!mc_box_equal(&p->targets[tn->first_tgt + i].shard.slab, sb))
      return mc_error("%s/%s: an int64 target shard is not the source's box", name, st);
  union {
    int64_t i;
    float f[2];
  } v;
  unsigned char sha[32];
  if (x->io->read(x->io->ctx, p, tn->first_src, 0, 1, v.f) != 0) return -1;
  atomic_fetch_add(&x->bytes_read, 8);
  if (EVP_DigestInit_ex(ctx[0], EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(ctx[0], &v.i, 8) != 1)
    return mc_error("SHA-256 failed");
  if (sha_finish(ctx[0], sha) != 0) return -1;
  if (x->io->src_done && x->io->src_done(x->io->ctx, p, tn->first_src, sha) != 0) return -1;
  for (int i = 0; i < tn->n_tgt; i++) {
    if (x->io->write(x->io->ctx, p, tn->first_tgt + i, 0, 1, &v.i) != 0) return -1;
    atomic_fetch_add(&x->bytes_written, 8);
    if (x->io->tgt_done && x->io->tgt_done(x->io->ctx, p, tn->first_tgt + i, sha) != 0) return -1;
  }
  return 0;
}

static int run_tensor(exec_shared *x, int ti, float *band, float *tmp, unsigned char *raw, EVP_MD_CTX **ctx,
                      stream_shard *boxes) {
  const mc_rs_plan *p = x->p;
  const mc_rs_tensor *tn = &p->tensors[ti];
  if (tn->src_dtype == MC_ELEM_I64 || tn->dtype == MC_ELEM_I64) return run_int64(x, ti, ctx);
  const tshape ts = tensor_shape(&x->g->fams.f[tn->fam], tn->state), *f = &ts;
  int ns = tn->n_src, nt = tn->n_tgt, flat = 1;
  for (int i = 0; i < ns; i++) flat &= full_width(&p->src[tn->first_src + i].slab, f);
  for (int i = 0; i < nt; i++) flat &= full_width(&p->targets[tn->first_tgt + i].shard.slab, f);
  int64_t D[3];
  if (flat) D[0] = f->numel, D[1] = D[2] = 1;
  else if (f->ndim == 2) D[0] = f->shape[0], D[1] = 1, D[2] = f->shape[1];
  else D[0] = f->shape[0], D[1] = f->shape[1], D[2] = f->shape[2];
  for (int i = 0; i < ns; i++) boxes[i].view = to_view(&p->src[tn->first_src + i].slab, f, flat);
  for (int i = 0; i < nt; i++) boxes[ns + i].view = to_view(&p->targets[tn->first_tgt + i].shard.slab, f, flat);
  /* A target that is exactly one source shard, in the same dtype, gets the same bytes, so the
   * same digest: its hash is the source's, verified, without a second pass of SHA-256. */
  for (int i = 0; i < nt; i++) {
    const mc_box *t = &p->targets[tn->first_tgt + i].shard.slab;
    boxes[ns + i].alias = -1;
    for (int k = 0; k < ns && boxes[ns + i].alias < 0 && tn->src_dtype == tn->dtype; k++)
      if (mc_box_equal(&p->src[tn->first_src + k].slab, t)) boxes[ns + i].alias = k;
  }
  for (int i = 0; i < ns + nt; i++)
    if (EVP_DigestInit_ex(ctx[i], EVP_sha256(), NULL) != 1) return mc_error("SHA-256 init failed");
  int64_t rowel = D[1] * D[2];
  int64_t rows = x->chunk / (rowel * 4);
  if (rows < 1) rows = 1;
  if (flat) {
    /* Bands hold whole rows of the family, so every piece is whole rows of its shard. */
    int64_t frow = f->ndim > 1 ? f->numel / f->shape[0] : 1;
    rows = rows / frow * frow;
    if (rows < frow) rows = frow;
  }
  for (int64_t r0 = 0; r0 < D[0]; r0 += rows) {
    if (atomic_load(&x->abort)) return -2; /* another worker failed */
    int64_t r1 = r0 + rows < D[0] ? r0 + rows : D[0];
    for (int i = 0; i < ns + nt; i++) {
      int is_src = i < ns;
      const mc_box *b = &boxes[i].view;
      int64_t a = r0 > b->start[0] ? r0 : b->start[0], e = r1 < b->start[0] + b->count[0] ? r1 : b->start[0] + b->count[0];
      if (a >= e) continue;
      int64_t srow = b->count[1] * b->count[2], n = (e - a) * srow, off = (a - b->start[0]) * srow;
      int full = b->count[1] == D[1] && b->count[2] == D[2];
      float *buf = full ? band + (a - r0) * rowel : tmp;
      int alias = is_src ? -1 : boxes[i].alias;
      const int dt = is_src ? tn->src_dtype : tn->dtype;
      const int64_t bytes = n * (int64_t)mc_elem_dtype_size(dt);
      const void *stored = NULL;
      if (is_src) {
        if (x->io->read(x->io->ctx, p, tn->first_src + i, off, n, buf) != 0) return -1;
        if (!full) move_rows(band, D, r0, b, a, e, tmp, 1);
        stored = as_stored(dt, buf, raw, n); /* the source's own bytes, for its hash */
        atomic_fetch_add(&x->bytes_read, bytes);
      } else {
        if (!full) move_rows(band, D, r0, b, a, e, tmp, 0);
        stored = as_stored(dt, buf, raw, n);
        if (x->io->write(x->io->ctx, p, tn->first_tgt + i - ns, off, n, stored) != 0) return -1;
        atomic_fetch_add(&x->bytes_written, bytes);
      }
      if (alias < 0 && EVP_DigestUpdate(ctx[i], stored, (size_t)bytes) != 1) return mc_error("SHA-256 update failed");
      if (e == b->start[0] + b->count[0]) {
        /* Sources come before targets in every band, so an alias's source is complete. */
        unsigned char sha[32];
        if (alias >= 0) memcpy(sha, boxes[alias].sha, 32);
        else if (sha_finish(ctx[i], sha) != 0) return -1;
        if (is_src) memcpy(boxes[i].sha, sha, 32);
        if (is_src && x->io->src_done && x->io->src_done(x->io->ctx, p, tn->first_src + i, sha) != 0) return -1;
        if (!is_src && x->io->tgt_done && x->io->tgt_done(x->io->ctx, p, tn->first_tgt + i - ns, sha) != 0)
          return -1;
      }
    }
  }
  return 0;
}

static void *worker(void *arg) {
  exec_shared *x = arg;
  const mc_rs_plan *p = x->p;
  int maxn = 0;
  for (int t = 0; t < p->n_tensors; t++)
    if (p->tensors[t].n_src + p->tensors[t].n_tgt > maxn) maxn = p->tensors[t].n_src + p->tensors[t].n_tgt;
  /* One row beyond the chunk: a band always holds at least one row. */
  int64_t maxrow = 1;
  for (int f = 0; f < x->g->fams.n; f++) {
    const mc_family *fa = &x->g->fams.f[f];
    int64_t r = fa->ndim > 1 ? fa->numel / fa->shape[0] : 1;
    if (r > maxrow) maxrow = r;
  }
  int64_t cap = x->chunk / 4 > maxrow ? x->chunk / 4 : maxrow;
  float *band = malloc((size_t)cap * 4), *tmp = malloc((size_t)cap * 4);
  unsigned char *raw = malloc((size_t)cap * 4); /* a piece narrowed to its dtype */
  EVP_MD_CTX **ctx = calloc((size_t)(maxn ? maxn : 1), sizeof *ctx);
  stream_shard *boxes = malloc((size_t)(maxn ? maxn : 1) * sizeof *boxes);
  int ok = band && tmp && raw && ctx && boxes;
  for (int i = 0; ok && i < maxn; i++) ok = (ctx[i] = EVP_MD_CTX_new()) != NULL;
  if (!ok) {
    mc_error("reshard: out of memory for %lld-byte buffers", (long long)cap * 4);
    set_error(x);
  }
  while (ok && !atomic_load(&x->abort)) {
    int k = atomic_fetch_add(&x->next, 1);
    if (k >= p->n_tensors) break;
    int rc = run_tensor(x, x->order[k], band, tmp, raw, ctx, boxes);
    if (rc == -1) set_error(x);
    if (rc != 0) break;
  }
  for (int i = 0; ctx && i < maxn; i++) EVP_MD_CTX_free(ctx[i]);
  free(ctx);
  free(boxes);
  free(band);
  free(tmp);
  free(raw);
  atomic_fetch_add(&x->workers_done, 1);
  return NULL;
}

static void progress_line(const char *label, int64_t done, int64_t total, double t0) {
  double frac = total > 0 ? (double)done / (double)total : 1.0;
  int w = 30, fill = (int)(frac * w);
  char bar[64];
  for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
  bar[w] = 0;
  double dt = mc_now_s() - t0;
  fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f MiB %6.2f GB/s", label ? label : "reshard", bar, 100.0 * frac,
          (double)done / 1048576.0, dt > 0 ? (double)done / dt / 1e9 : 0.0);
  fflush(stderr);
}

int mc_rs_execute(const mc_rs_plan *p, const mc_geometry *g, const mc_rs_io *io, const mc_rs_exec_opts *o,
                  mc_rs_exec_stats *st) {
  exec_shared *x = calloc(1, sizeof *x);
  if (!x) return mc_error("reshard: out of memory");
  x->p = p;
  x->g = g;
  x->io = io;
  x->chunk = o && o->chunk_bytes > 0 ? o->chunk_bytes : (int64_t)16 << 20;
  int threads = o && o->threads > 0 ? o->threads : mc_rs_default_threads();
  if (threads > p->n_tensors) threads = p->n_tensors > 0 ? p->n_tensors : 1;
  pthread_mutex_init(&x->err_lock, NULL);
  x->order = malloc((size_t)(p->n_tensors ? p->n_tensors : 1) * sizeof *x->order);
  if (!x->order) {
    free(x);
    return mc_error("reshard: out of memory");
  }
  /* Largest tensors first, so the workers finish together. */
  mc_sized *sz = malloc((size_t)(p->n_tensors ? p->n_tensors : 1) * sizeof *sz);
  if (!sz) {
    free(x->order);
    free(x);
    return mc_error("reshard: out of memory");
  }
  int64_t total = 0;
  for (int i = 0; i < p->n_tensors; i++) sz[i].bytes = tensor_bytes(p, i), sz[i].idx = i, total += sz[i].bytes;
  mc_sort_largest_first(sz, p->n_tensors);
  for (int i = 0; i < p->n_tensors; i++) x->order[i] = sz[i].idx;
  free(sz);
  double t0 = mc_now_s();
  pthread_t *th = malloc((size_t)threads * sizeof *th);
  int started = 0;
  for (; th && started < threads; started++)
    if (pthread_create(&th[started], NULL, worker, x) != 0) break;
  if (started == 0) {
    free(th);
    free(x->order);
    free(x);
    return mc_error("reshard: cannot start worker threads");
  }
  /* Progress in checkpoint bytes: each is read once and written once. */
  while (o && o->progress && atomic_load(&x->workers_done) < started) {
    progress_line(o->label, (atomic_load(&x->bytes_read) + atomic_load(&x->bytes_written)) / 2, total, t0);
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (o && o->progress) {
    progress_line(o->label, (atomic_load(&x->bytes_read) + atomic_load(&x->bytes_written)) / 2, total, t0);
    fputc('\n', stderr);
  }
  int rc = 0;
  if (x->err[0]) rc = mc_error("%s", x->err);
  if (st) {
    st->bytes_read = atomic_load(&x->bytes_read);
    st->bytes_written = atomic_load(&x->bytes_written);
    st->seconds = mc_now_s() - t0;
  }
  pthread_mutex_destroy(&x->err_lock);
  free(th);
  free(x->order);
  free(x);
  return rc;
}
