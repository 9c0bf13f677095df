/* Loading a checkpoint once across a job: the plan (who reads which stored shard, what goes
 * to whom in which round) and its execution over mc_alltoallv (train/load_shared.h). */
#include "train/load_shared.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "util/clock.h"
#include "util/pool.h"
#include "util/error.h"
#include "util/order.h"

#define REQ_WORDS 8 /* a request on the wire: family, state, start[3], count[3] */

void mc_load_opts_default(mc_load_opts *o) {
  o->round_bytes = MC_LOAD_ROUND_BYTES;
  o->copy_bytes = MC_LOAD_COPY_BYTES;
  o->per_rank = 0;
  o->serial = 0;
  o->done = NULL;
  o->done_user = NULL;
}

int mc_load_agree(mc_comm *world, int ok) {
  if (!world || world->size <= 1) return ok ? 0 : -1;
  int32_t bad = ok ? 0 : 1;
  if (mc_allreduce_sum(world, &bad, 1, MC_DT_I32) != 0) return mc_error_context("agreeing on the checkpoint load");
  if (bad == 0) return 0;
  /* Someone failed: every rank learns the lowest failing rank's message (byte 0 flags it). */
  const int W = world->size, cap = MC_ERRMSG_MAX;
  char *mine = calloc((size_t)cap, 1), *all = malloc((size_t)W * (size_t)cap);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)W);
  if (!mine || !all || !counts) {
    free(mine), free(all), free(counts);
    return mc_error("checkpoint load failed on %d rank(s) (out of memory gathering their messages)", (int)bad);
  }
  if (!ok) mine[0] = 1, snprintf(mine + 1, (size_t)cap - 1, "%s", mc_errmsg());
  for (int i = 0; i < W; i++) counts[i] = cap;
  int rc = mc_allgather(world, mine, all, counts, MC_DT_U8);
  int first = -1;
  for (int i = 0; rc == 0 && i < W && first < 0; i++)
    if (all[(size_t)i * cap]) first = i;
  if (first >= 0) mc_error("rank %d failed: %.*s", first, cap - 1, all + (size_t)first * cap + 1);
  else mc_error("checkpoint load failed on %d rank(s) (their messages could not be gathered)", (int)bad);
  free(mine), free(all), free(counts);
  return -1;
}

/* ---------------------------------------------------------------- the plan */

typedef struct {
  int rank;  /* whose request */
  int local; /* its index in that rank's reqs */
  int fam, state;
  mc_box box;
} greq;

typedef struct {
  int req;     /* into plan.g */
  mc_box part; /* the part of the shard the request covers (global coordinates) */
} piece;

typedef struct {
  int shard;                   /* manifest index */
  int64_t bytes;
  int reader;
  int piece0, n_pieces;        /* its pieces: plan.pieces[piece0 .. piece0 + n_pieces) */
  int first_round, last_round; /* rounds of its items: read in the first, freed after the last */
} need;

typedef struct {
  int need, piece; /* into plan.needs, plan.pieces */
  int src, dst;    /* the reader, the requesting rank */
  int round;
  mc_box band;     /* the rows of the piece (dim 0) that move in this item */
} item;

typedef struct {
  int W, me;
  int n_g, n_pieces, n_needs, n_items, n_rounds;
  greq *g;                  /* every rank's requests, rank by rank */
  piece *pieces;            /* grouped by shard in need order; a shard's in request order */
  need *needs;              /* the shards someone needs, in the order they were written */
  item *items;              /* in round order */
  int *round0;              /* round k's items: [round0[k], round0[k + 1]) */
  unsigned char *exchanges; /* per round: some item crosses ranks */
  int64_t needed, per_rank_read;
} plan;

static void plan_free(plan *p) {
  free(p->g), free(p->pieces), free(p->needs), free(p->items), free(p->round0), free(p->exchanges);
  memset(p, 0, sizeof *p);
}

static mc_box shard_box(const mc_ckpt_shard *s) { return mc_box_make(s->ndim, s->start, s->count); }

/* All-gathers the requests (valid on every rank: mc_ckpt_check_request passed). Local
 * failures are agreed on before each collective, so the ranks stay in step. */
static int gather(mc_ckpt *ck, mc_comm *world, const mc_ckpt_request *reqs, int n, plan *p) {
  const int W = p->W;
  int64_t *counts = calloc((size_t)W, sizeof(int64_t)), *ones = malloc(sizeof(int64_t) * (size_t)W);
  int64_t *mine = malloc(sizeof(int64_t) * (size_t)(n * REQ_WORDS + 1)), *all = NULL;
  int ok = counts && ones && mine;
  for (int i = 0; ok && i < n; i++) {
    const int fam = mc_ckpt_find_family(ck, reqs[i].family);
    int64_t *w = mine + (int64_t)i * REQ_WORDS;
    w[0] = fam, w[1] = reqs[i].state;
    for (int k = 0; k < 3; k++) {
      const int in = k < mc_ckpt_family_at(ck, fam)->ndim;
      w[2 + k] = in ? reqs[i].start[k] : 0, w[5 + k] = in ? reqs[i].count[k] : 0;
    }
  }
  if (!ok) mc_error("out of memory gathering the load's requests");
  int rc = mc_load_agree(world, ok);
  int64_t my_total = (int64_t)n * REQ_WORDS, total = my_total;
  if (rc == 0 && W > 1) {
    for (int i = 0; i < W; i++) ones[i] = 1;
    rc = mc_allgather(world, &my_total, counts, ones, MC_DT_I64);
    total = 0;
    for (int i = 0; rc == 0 && i < W; i++) total += counts[i];
  } else if (rc == 0) {
    counts[0] = total;
  }
  if (rc == 0) {
    p->n_g = (int)(total / REQ_WORDS);
    all = malloc(sizeof(int64_t) * (size_t)(total + 1));
    p->g = malloc(sizeof(greq) * (size_t)(p->n_g + 1));
    if (!all || !p->g) mc_error("out of memory gathering the load's requests");
    rc = mc_load_agree(world, all && p->g);
  }
  if (rc == 0 && W > 1) rc = mc_allgather(world, mine, all, counts, MC_DT_I64);
  else if (rc == 0) memcpy(all, mine, sizeof(int64_t) * (size_t)total);
  for (int r = 0, q = 0; rc == 0 && r < W; r++)
    for (int i = 0; i < counts[r] / REQ_WORDS; i++, q++) {
      const int64_t *w = all + (int64_t)q * REQ_WORDS;
      greq *g = &p->g[q];
      g->rank = r, g->local = i, g->fam = (int)w[0], g->state = (int)w[1];
      g->box = mc_box_make(mc_ckpt_family_at(ck, g->fam)->ndim, w + 2, w + 5);
    }
  free(counts), free(ones), free(mine), free(all);
  return rc;
}

/* Shards in the order they were written (rank file, family, state), so that a reader's reads
 * of a file go forward. */
static int disk_cmp(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  for (int k = 0; k < 4; k++)
    if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
  return 0;
}

/* The pieces: every request's intersection with each stored shard (grouped by shard, the
 * shards in disk order, a shard's pieces in request order, so ranks ascending); the needed
 * shards; needed and per_rank_read. */
static int cut_pieces(mc_ckpt *ck, plan *p) {
  const int ns = mc_ckpt_n_shards(ck), nk = mc_ckpt_n_families(ck) * MC_N_STATES;
  int *key0 = calloc((size_t)nk + 1, sizeof(int)), *cur = calloc((size_t)nk + 1, sizeof(int));
  int *by_key = malloc(sizeof(int) * (size_t)(ns + 1)), *n_of = calloc((size_t)ns + 1, sizeof(int));
  int *fill = malloc(sizeof(int) * (size_t)(ns + 1));
  int64_t *ord = malloc(sizeof(int64_t) * 4 * (size_t)(ns + 1));
  int rc = !key0 || !cur || !by_key || !n_of || !fill || !ord ? mc_error("out of memory planning the load") : 0;
  /* the shards of each (family, state): by_key[key0[key] .. key0[key + 1]) */
  for (int s = 0; rc == 0 && s < ns; s++) {
    const mc_ckpt_shard *sh = mc_ckpt_shard_at(ck, s);
    key0[sh->family_index * MC_N_STATES + sh->state + 1]++;
    int64_t *o = ord + 4 * (int64_t)s;
    o[0] = sh->rank, o[1] = sh->family_index, o[2] = sh->state, o[3] = s;
  }
  for (int k = 0; rc == 0 && k < nk; k++) key0[k + 1] += key0[k];
  for (int s = 0; rc == 0 && s < ns; s++) {
    const mc_ckpt_shard *sh = mc_ckpt_shard_at(ck, s);
    const int key = sh->family_index * MC_N_STATES + sh->state;
    by_key[key0[key] + cur[key]++] = s;
  }
  if (rc == 0) qsort(ord, (size_t)ns, 4 * sizeof(int64_t), disk_cmp);
  mc_box part;
  for (int pass = 0; rc == 0 && pass < 2; pass++) {
    /* pass 0 counts each shard's pieces; pass 1 writes them at the shard's cursor */
    if (pass == 1) {
      p->needs = malloc(sizeof(need) * (size_t)(ns + 1));
      p->pieces = malloc(sizeof(piece) * (size_t)(p->n_pieces + 1));
      if (!p->needs || !p->pieces) {
        rc = mc_error("out of memory planning the load");
        break;
      }
      for (int i = 0, p0 = 0; i < ns; i++) {
        const int s = (int)ord[4 * (int64_t)i + 3];
        fill[s] = p0;
        if (!n_of[s]) continue;
        const int64_t bytes = mc_ckpt_shard_at(ck, s)->numel * (int64_t)sizeof(float);
        p->needs[p->n_needs++] = (need){s, bytes, -1, p0, n_of[s], -1, -1};
        p0 += n_of[s];
      }
    }
    for (int q = 0; q < p->n_g; q++) {
      const greq *g = &p->g[q];
      const int key = g->fam * MC_N_STATES + g->state;
      for (int j = key0[key]; j < key0[key + 1]; j++) {
        const int s = by_key[j];
        const mc_box sb = shard_box(mc_ckpt_shard_at(ck, s));
        if (!mc_box_intersect(&g->box, &sb, &part)) continue;
        if (pass == 0) n_of[s]++, p->n_pieces++;
        else p->pieces[fill[s]++] = (piece){q, part};
      }
    }
  }
  const int verify = mc_ckpt_verifies(ck);
  for (int u = 0; rc == 0 && u < p->n_needs; u++) {
    const need *nd = &p->needs[u];
    p->needed += nd->bytes;
    for (int l = nd->piece0; l < nd->piece0 + nd->n_pieces; l++) {
      const int rank = p->g[p->pieces[l].req].rank;
      const int first_of_rank = l == nd->piece0 || rank != p->g[p->pieces[l - 1].req].rank;
      /* verifying, a rank reads a shard it touches whole, once; else only the parts */
      if (verify) p->per_rank_read += first_of_rank ? nd->bytes : 0;
      else p->per_rank_read += mc_box_numel(&p->pieces[l].part) * (int64_t)sizeof(float);
    }
  }
  free(key0), free(cur), free(by_key), free(n_of), free(fill), free(ord);
  return rc;
}

/* One reader per needed shard, largest shards first: the least-loaded rank among those that
 * need it (its own part then moves no further), unless another rank would still be below
 * that rank's load after taking the shard. Ties go to the lower rank. */
static int assign_readers(plan *p) {
  int64_t *load = calloc((size_t)p->W, sizeof *load);
  mc_sized *o = malloc(sizeof *o * (size_t)(p->n_needs + 1));
  if (!load || !o) {
    free(load), free(o);
    return mc_error("out of memory planning the load");
  }
  for (int u = 0; u < p->n_needs; u++) o[u] = (mc_sized){p->needs[u].bytes, u};
  mc_sort_largest_first(o, p->n_needs);
  for (int i = 0; i < p->n_needs; i++) {
    need *nd = &p->needs[o[i].idx];
    int cand = -1, alt = 0;
    for (int l = nd->piece0; l < nd->piece0 + nd->n_pieces; l++) {
      const int r = p->g[p->pieces[l].req].rank;
      if (cand < 0 || load[r] < load[cand]) cand = r;
    }
    for (int r = 1; r < p->W; r++)
      if (load[r] < load[alt]) alt = r;
    nd->reader = load[cand] > load[alt] + nd->bytes ? alt : cand;
    load[nd->reader] += nd->bytes;
  }
  free(load), free(o);
  return 0;
}

static int push_item(plan *p, int *cap, item it) {
  if (p->n_items == *cap) {
    const int nc = *cap ? 2 * *cap : 256;
    item *grown = realloc(p->items, sizeof(item) * (size_t)nc);
    if (!grown) return mc_error("out of memory planning the load");
    p->items = grown, *cap = nc;
  }
  p->items[p->n_items++] = it;
  p->needs[it.need].first_round = p->needs[it.need].first_round < 0 ? it.round : p->needs[it.need].first_round;
  p->needs[it.need].last_round = it.round;
  return 0;
}

/* Cuts the transfers into rounds (train/load_shared.h: per rank and round at most B bytes of
 * exchange buffers and B bytes of shards held, an oversized shard or row alone), the shards
 * in disk order, a piece split by dim-0 rows where a round fills up. */
static int schedule(plan *p, int64_t B) {
  int64_t *xchg = calloc((size_t)p->W, sizeof(int64_t)), *held = calloc((size_t)p->W, sizeof(int64_t));
  int rc = !xchg || !held ? mc_error("out of memory planning the load") : 0, cap = 0, round = 0;
  const size_t wb = sizeof(int64_t) * (size_t)p->W;
  for (int u = 0; rc == 0 && u < p->n_needs; u++) {
    const need *nd = &p->needs[u];
    const int a = nd->reader;
    if (held[a] > 0 && held[a] + nd->bytes > B) round++, memset(xchg, 0, wb), memset(held, 0, wb);
    held[a] += nd->bytes;
    for (int l = nd->piece0; rc == 0 && l < nd->piece0 + nd->n_pieces; l++) {
      const mc_box *part = &p->pieces[l].part;
      const int b = p->g[p->pieces[l].req].rank;
      const int64_t rows = part->ndim ? part->count[0] : 1;
      const int64_t row_bytes = mc_box_numel(part) / rows * (int64_t)sizeof(float);
      if (b == a) { /* the reader's own part: copied in place, no exchange */
        rc = push_item(p, &cap, (item){u, l, a, b, round, *part});
        continue;
      }
      for (int64_t r0 = 0; rc == 0 && r0 < rows;) {
        const int64_t used = xchg[a] > xchg[b] ? xchg[a] : xchg[b];
        int64_t fit = B > used ? (B - used) / row_bytes : 0;
        if (fit == 0 && used > 0) { /* next round; the shard stays in memory into it */
          round++, memset(xchg, 0, wb), memset(held, 0, wb);
          held[a] = nd->bytes;
          continue;
        }
        if (fit < 1) fit = 1; /* one row larger than B goes alone */
        const int64_t k = fit < rows - r0 ? fit : rows - r0;
        item it = {u, l, a, b, round, *part};
        if (part->ndim) it.band.start[0] += r0, it.band.count[0] = k;
        rc = push_item(p, &cap, it);
        xchg[a] += k * row_bytes, xchg[b] += k * row_bytes;
        r0 += k;
      }
    }
  }
  p->n_rounds = p->n_items ? round + 1 : 0;
  p->round0 = calloc((size_t)p->n_rounds + 2, sizeof(int));
  p->exchanges = calloc((size_t)p->n_rounds + 1, 1);
  if (rc == 0 && (!p->round0 || !p->exchanges)) rc = mc_error("out of memory planning the load");
  for (int i = 0; rc == 0 && i < p->n_items; i++) {
    p->round0[p->items[i].round + 1]++;
    p->exchanges[p->items[i].round] |= p->items[i].src != p->items[i].dst;
  }
  for (int k = 0; rc == 0 && k < p->n_rounds; k++) p->round0[k + 1] += p->round0[k];
  free(xchg), free(held);
  return rc;
}

/* ---------------------------------------------------------------- execution */

/* The shards a reader holds: buf[u] per need, its request's destination or a buffer of its
 * own of cap[u] bytes (0: not its own). Buffers of shards served are kept for reuse: a fresh
 * block of this size is mapped anew and costs its page faults and zeroing again every round,
 * a kept one does not. One is kept only while all of them, in use or kept, stay within
 * `limit` (twice the round bound: train/load_shared.h), and reused only for a shard of at
 * least three quarters its size. The reads (on the read-ahead thread) take buffers and the
 * exchange gives them back: the pool is under mu; buf and cap entries are each one thread's. */
typedef struct {
  float **buf;
  int64_t *cap;
  pthread_mutex_t mu;
  float **kept;
  int64_t *kept_cap;
  int n_kept;
  int64_t in_use, kept_bytes, limit;
} served;

static int served_open(served *sv, const plan *p, int64_t round_bytes) {
  memset(sv, 0, sizeof *sv);
  const size_t n = (size_t)p->n_needs + 1;
  sv->buf = calloc(n, sizeof *sv->buf), sv->cap = calloc(n, sizeof *sv->cap);
  sv->kept = calloc(n, sizeof *sv->kept), sv->kept_cap = calloc(n, sizeof *sv->kept_cap);
  int64_t bound = round_bytes;
  for (int u = 0; u < p->n_needs; u++)
    if (p->needs[u].reader == p->me && p->needs[u].bytes > bound) bound = p->needs[u].bytes;
  sv->limit = 2 * bound;
  pthread_mutex_init(&sv->mu, NULL);
  return sv->buf && sv->cap && sv->kept && sv->kept_cap ? 0 : mc_error("out of memory in the load's exchange");
}

/* A buffer of its own for need u's shard of `bytes`: a kept one that fits, else a new one. */
static float *served_take(served *sv, int u, int64_t bytes) {
  pthread_mutex_lock(&sv->mu);
  int best = -1;
  for (int i = 0; i < sv->n_kept; i++)
    if (sv->kept_cap[i] >= bytes && sv->kept_cap[i] - sv->kept_cap[i] / 4 <= bytes &&
        (best < 0 || sv->kept_cap[i] < sv->kept_cap[best]))
      best = i;
  float *b = NULL;
  int64_t cap = bytes;
  if (best >= 0) {
    b = sv->kept[best], cap = sv->kept_cap[best];
    sv->kept_bytes -= cap, sv->n_kept--;
    sv->kept[best] = sv->kept[sv->n_kept], sv->kept_cap[best] = sv->kept_cap[sv->n_kept];
  }
  pthread_mutex_unlock(&sv->mu);
  if (!b && !(b = malloc((size_t)(bytes > 0 ? bytes : 1)))) return NULL;
  pthread_mutex_lock(&sv->mu);
  sv->in_use += cap;
  pthread_mutex_unlock(&sv->mu);
  sv->buf[u] = b, sv->cap[u] = cap;
  return b;
}

/* Need u's shard is served: its own buffer (if any) is kept (within the limit) or freed. */
static void served_give(served *sv, int u) {
  if (sv->cap[u] > 0) {
    pthread_mutex_lock(&sv->mu);
    sv->in_use -= sv->cap[u];
    const int keep = sv->in_use + sv->kept_bytes + sv->cap[u] <= sv->limit;
    if (keep) sv->kept[sv->n_kept] = sv->buf[u], sv->kept_cap[sv->n_kept++] = sv->cap[u], sv->kept_bytes += sv->cap[u];
    pthread_mutex_unlock(&sv->mu);
    if (!keep) free(sv->buf[u]);
  }
  sv->buf[u] = NULL, sv->cap[u] = 0;
}

static void served_close(served *sv, const plan *p) {
  for (int u = 0; sv->cap && u < p->n_needs; u++)
    if (sv->cap[u] > 0) free(sv->buf[u]);
  for (int i = 0; i < sv->n_kept; i++) free(sv->kept[i]);
  pthread_mutex_destroy(&sv->mu);
  free(sv->buf), free(sv->cap), free(sv->kept), free(sv->kept_cap);
  memset(sv, 0, sizeof *sv);
}

/* This rank's reads of round k: the shards it serves whose first items are in round k, whole,
 * in one mc_ckpt_read_many (each hash-verified once, on the handle's I/O threads). A shard
 * that is exactly one of this rank's own requests is read straight into its destination. */
static int read_round(mc_ckpt *ck, const plan *p, const mc_ckpt_request *reqs, int k, served *sv) {
  float **buf = sv->buf;
  mc_ckpt_request *rq = malloc(sizeof *rq * (size_t)(p->n_needs + 1));
  if (!rq) return mc_error("out of memory reading for the load");
  int m = 0, rc = 0;
  for (int u = 0; rc == 0 && u < p->n_needs; u++) {
    const need *nd = &p->needs[u];
    if (nd->reader != p->me || nd->first_round != k) continue;
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, nd->shard);
    const mc_box sb = shard_box(s);
    for (int l = nd->piece0; l < nd->piece0 + nd->n_pieces && !buf[u]; l++) {
      const greq *g = &p->g[p->pieces[l].req];
      if (g->rank == p->me && mc_box_equal(&g->box, &sb)) buf[u] = reqs[g->local].out;
    }
    if (!buf[u] && !served_take(sv, u, (int64_t)sizeof(float) * s->numel))
      rc = mc_error("out of memory for %s of %s", s->dataset, s->file);
    rq[m] = (mc_ckpt_request){s->family, s->state, {0, 0, 0}, {0, 0, 0}, buf[u]};
    memcpy(rq[m].start, s->start, sizeof s->start);
    memcpy(rq[m].count, s->count, sizeof s->count);
    m++;
  }
  if (rc == 0 && m > 0) rc = mc_ckpt_read_many(ck, rq, m);
  free(rq);
  return rc;
}

/* Element counts and displacements per peer of this rank's packed send (send = 1: what it
 * reads for others) or receive buffer of round k; returns the total. */
static int64_t offsets(const plan *p, int k, int send, int64_t *count, int64_t *displ) {
  memset(count, 0, sizeof(int64_t) * (size_t)p->W);
  for (int i = p->round0[k]; i < p->round0[k + 1]; i++) {
    const item *it = &p->items[i];
    if (it->src == it->dst) continue;
    if (send && it->src == p->me) count[it->dst] += mc_box_numel(&it->band);
    if (!send && it->dst == p->me) count[it->src] += mc_box_numel(&it->band);
  }
  int64_t total = 0;
  for (int r = 0; r < p->W; r++) displ[r] = total, total += count[r];
  return total;
}

/* The copies of a round (own parts, packing, unpacking) as tasks of about copy_bytes
 * (mc_load_opts; a band cut by dim-0 rows), spread over the checkpoint's io_threads threads:
 * they ran on one. */
typedef struct {
  const float *src;
  mc_box src_box;
  float *dst;
  mc_box dst_box, band;
} copy_task;

typedef struct {
  copy_task *t;
  int n, cap;
  int64_t task_bytes;
} copy_list;

/* Adds the copy of `band` (inside both boxes) from src to dst, cut into tasks by dim-0 rows
 * (each task names the same boxes; mc_box_copy finds its rows in them). */
static int add_copy(copy_list *l, const float *src, const mc_box *sb, float *dst, const mc_box *db, const mc_box *band) {
  const int64_t n = mc_box_numel(band), rows = band->count[0];
  const int64_t row = rows > 0 ? n / rows : 0;
  int64_t step = row > 0 ? l->task_bytes / (row * (int64_t)sizeof(float)) : rows;
  if (step < 1) step = 1;
  for (int64_t r = 0; r < rows; r += step) {
    if (l->n == l->cap) {
      const int cap = l->cap ? 2 * l->cap : 64;
      copy_task *t = realloc(l->t, sizeof *t * (size_t)cap);
      if (!t) return mc_error("out of memory planning the load's copies");
      l->t = t, l->cap = cap;
    }
    copy_task *t = &l->t[l->n++];
    *t = (copy_task){src, *sb, dst, *db, *band};
    t->band.start[0] += r;
    t->band.count[0] = rows - r < step ? rows - r : step;
  }
  return 0;
}

static int copy_job(void *arg, int i) {
  const copy_task *t = &((const copy_list *)arg)->t[i];
  mc_box_copy(t->src, &t->src_box, t->dst, &t->dst_box, &t->band);
  return 0;
}

/* Runs the list's copies on up to `threads` worker threads (util/pool.h), then empties it.
 * It cannot fail, so the ranks stay in step: where no worker could start (or the pool had no
 * memory), the copies run on this thread (they are idempotent, so any already done by a
 * worker are simply done again). */
static void run_copies(copy_list *l, int threads) {
  if (mc_parallel(l->n, threads, copy_job, l) != 0) {
    mc_error_clear();
    for (int i = 0; i < l->n; i++) copy_job(l, i);
  }
  l->n = 0;
}

/* The exchange's buffer (a round's send, then its receive part), grown to the largest round
 * and kept: a fresh block is mapped anew and costs its page faults and zeroing every round
 * (15 rounds of about 400 MB for dense-a on 2 ranks). */
typedef struct {
  float *buf;
  int64_t n;
  copy_list copies;
  int threads;
} xbufs;

static float *grow(float **b, int64_t *have, int64_t want) {
  if (want < 1) want = 1; /* a round with nothing to send still has a buffer */
  if (want <= *have) return *b;
  free(*b);
  *b = malloc(sizeof(float) * (size_t)want);
  *have = *b ? want : 0;
  return *b;
}

/* Round k after its reads (read_rc: their result): copy own parts, pack, agree, exchange,
 * unpack, free the shards served. Both sides walk the round's items in the same order, so a
 * peer's items line up. ahead: the next round's shards are being read meanwhile (they count
 * as held). */
static int exchange_round(mc_ckpt *ck, mc_comm *world, const plan *p, const mc_ckpt_request *reqs, int k, served *sv,
                          xbufs *x, int read_rc, int ahead, int64_t peak[2]) {
  float **buf = sv->buf;
  const int W = p->W;
  int64_t *v = malloc(sizeof(int64_t) * 5 * (size_t)W);
  float *send = NULL, *recv = NULL;
  int rc = read_rc != 0 ? -1 : v ? 0 : mc_error("out of memory in the load's exchange");
  int64_t *sc = v, *sd = v + W, *rcn = v + 2 * W, *rd = v + 3 * W, *cur = v + 4 * W;
  if (rc == 0) {
    const int64_t ns = offsets(p, k, 1, sc, sd), nr = offsets(p, k, 0, rcn, rd);
    /* one element apart: never the same address, which MPI would take for one buffer */
    send = grow(&x->buf, &x->n, ns + nr + 1), recv = send ? send + ns + 1 : NULL;
    int64_t held = 0; /* the shards this rank serves in this round, and those of the next being read */
    for (int u = 0; u < p->n_needs; u++)
      if (p->needs[u].reader == p->me && p->needs[u].first_round <= k + ahead && k <= p->needs[u].last_round)
        held += p->needs[u].bytes;
    const int64_t xb = (ns + nr) * (int64_t)sizeof(float);
    peak[0] = xb > peak[0] ? xb : peak[0], peak[1] = held > peak[1] ? held : peak[1];
    if (!send || !recv)
      rc = mc_error("out of memory for the load's exchange buffers (%lld bytes)", (long long)(4 * (ns + nr)));
  }
  if (rc == 0) memcpy(cur, sd, sizeof(int64_t) * (size_t)W);
  for (int i = p->round0[k]; rc == 0 && i < p->round0[k + 1]; i++) {
    const item *it = &p->items[i];
    if (it->src != p->me) continue;
    const mc_box sb = shard_box(mc_ckpt_shard_at(ck, p->needs[it->need].shard));
    const greq *g = &p->g[p->pieces[it->piece].req];
    if (it->dst != p->me) {
      rc = add_copy(&x->copies, buf[it->need], &sb, send + cur[it->dst], &it->band, &it->band);
      cur[it->dst] += mc_box_numel(&it->band);
    } else if (buf[it->need] != reqs[g->local].out) {
      rc = add_copy(&x->copies, buf[it->need], &sb, reqs[g->local].out, &g->box, &it->band);
    }
  }
  run_copies(&x->copies, x->threads);
  if (mc_load_agree(world, rc == 0) != 0) rc = -1;
  if (rc == 0 && p->exchanges[k]) rc = mc_alltoallv(world, send, sc, sd, recv, rcn, rd, MC_DT_F32);
  if (rc == 0) memcpy(cur, rd, sizeof(int64_t) * (size_t)W);
  for (int i = p->round0[k]; rc == 0 && i < p->round0[k + 1]; i++) {
    const item *it = &p->items[i];
    if (it->dst != p->me || it->src == p->me) continue;
    const greq *g = &p->g[p->pieces[it->piece].req];
    rc = add_copy(&x->copies, recv + cur[it->src], &it->band, reqs[g->local].out, &g->box, &it->band);
    cur[it->src] += mc_box_numel(&it->band);
  }
  run_copies(&x->copies, x->threads);
  for (int u = 0; u < p->n_needs; u++)
    if (p->needs[u].reader == p->me && p->needs[u].last_round == k) served_give(sv, u);
  free(v);
  return rc;
}

/* A round's reads on a thread of their own, while the calling thread exchanges the round
 * before. They touch only the buf and cap entries of the shards first read in that round,
 * which the exchange neither reads nor frees (and the pool, under its lock); the checkpoint
 * handle serialises its own state.
 * The error message is thread-local: it is carried back as text. */
typedef struct {
  mc_ckpt *ck;
  const plan *p;
  const mc_ckpt_request *reqs;
  int k;
  served *sv;
  int rc;
  char err[MC_ERRMSG_MAX];
} ahead_read;

static void *ahead_main(void *arg) {
  ahead_read *a = arg;
  a->rc = read_round(a->ck, a->p, a->reqs, a->k, a->sv);
  if (a->rc != 0) snprintf(a->err, sizeof a->err, "%s", mc_errmsg());
  return NULL;
}

/* peak: the largest exchange buffers (send + receive) and shards held of a round, in bytes;
 * secs: seconds reading (not hidden behind an exchange) and exchanging, added to. Round k + 1
 * is read while round k exchanges unless serial is set (or no thread can be started). */
static int execute(mc_ckpt *ck, mc_comm *world, const plan *p, const mc_ckpt_request *reqs, const mc_load_opts *o,
                   int64_t peak[2], double secs[2]) {
  served sv;
  xbufs x = {.threads = mc_ckpt_io_threads(ck), .copies.task_bytes = o->copy_bytes};
  /* every rank goes through every round's agreement, so a failure anywhere ends all alike */
  int rc = mc_load_agree(world, served_open(&sv, p, o->round_bytes) == 0);
  double t = mc_now_s();
  int read_rc = rc == 0 && p->n_rounds > 0 ? read_round(ck, p, reqs, 0, &sv) : 0;
  secs[0] += mc_now_s() - t;
  for (int k = 0; rc == 0 && k < p->n_rounds; k++) {
    ahead_read a = {ck, p, reqs, k + 1, &sv, 0, {0}};
    pthread_t th;
    const int ahead = !o->serial && read_rc == 0 && k + 1 < p->n_rounds && pthread_create(&th, NULL, ahead_main, &a) == 0;
    t = mc_now_s();
    rc = exchange_round(ck, world, p, reqs, k, &sv, &x, read_rc, ahead, peak);
    secs[1] += mc_now_s() - t;
    t = mc_now_s();
    if (ahead) {
      pthread_join(th, NULL);
      if ((read_rc = a.rc) != 0) mc_error("%s", a.err);
    } else if (k + 1 < p->n_rounds && rc == 0) {
      read_rc = read_round(ck, p, reqs, k + 1, &sv);
    }
    secs[0] += mc_now_s() - t;
  }
  served_close(&sv, p);
  free(x.buf), free(x.copies.t);
  return rc;
}

/* Verify before parsing, shared by the job: the pieces of the rank files the plan reads are
 * split into one run per rank, each hashed once in the job; once every run passed, every
 * rank takes those files as checked (its reads then hash only the shards). Alone, each rank
 * would hash every file it reads a part of in full: W times the checkpoint for W ranks. Like
 * the plan itself, this takes the checkpoint directory to be the same files on every rank. */
static int check_shared(mc_ckpt *ck, mc_comm *world, const plan *p) {
  const char **files = malloc(sizeof *files * (size_t)(p->n_needs + 1));
  int n = 0;
  for (int u = 0; files && u < p->n_needs; u++) {
    const char *f = mc_ckpt_shard_at(ck, p->needs[u].shard)->file;
    int seen = n > 0 && strcmp(files[n - 1], f) == 0; /* needs are in disk order: mostly one file after another */
    for (int i = 0; i < n && !seen; i++) seen = strcmp(files[i], f) == 0;
    if (!seen) files[n++] = f;
  }
  int rc = mc_load_agree(world, files && mc_ckpt_check_files_part(ck, files, n, p->me, p->W) == 0);
  if (rc == 0) rc = mc_load_agree(world, mc_ckpt_files_checked(ck, files, n) == 0);
  free(files);
  return rc;
}

/* ---------------------------------------------------------------- the load */

int mc_load_shared(mc_ckpt *ck, mc_comm *world, const mc_ckpt_request *reqs, int n, const mc_load_opts *opts,
                   mc_load_stats *stats) {
  mc_load_opts o;
  if (opts) o = *opts;
  else mc_load_opts_default(&o);
  if (o.round_bytes <= 0) o.round_bytes = MC_LOAD_ROUND_BYTES;
  if (o.copy_bytes <= 0) o.copy_bytes = MC_LOAD_COPY_BYTES;
  plan p;
  memset(&p, 0, sizeof p);
  p.W = world ? world->size : 1;
  p.me = world ? world->rank : 0;
  const int shared = p.W > 1 && !o.per_rank;
  int64_t read0 = 0, hashed0 = 0, io[3] = {0, 0, 0}, peak[2] = {0, 0};
  mc_ckpt_io_bytes(ck, &read0, &hashed0);
  const int64_t checked0 = mc_ckpt_checked_bytes(ck);
  int ok = 1;
  for (int i = 0; ok && i < n; i++) ok = mc_ckpt_check_request(ck, &reqs[i]) == 0;
  int rc = mc_load_agree(world, ok);
  if (rc == 0) rc = gather(ck, world, reqs, n, &p);
  if (rc == 0) {
    /* the same plan on every rank; only running out of memory can make a rank fail here */
    ok = cut_pieces(ck, &p) == 0 && (!shared || (assign_readers(&p) == 0 && schedule(&p, o.round_bytes) == 0));
    rc = mc_load_agree(world, ok);
  }
  double secs[3] = {0, 0, 0}, t0 = mc_now_s(); /* check, reads, exchange */
  if (rc == 0 && shared && mc_ckpt_verifies(ck)) rc = check_shared(ck, world, &p);
  secs[0] = mc_now_s() - t0;
  if (rc == 0 && shared) {
    rc = execute(ck, world, &p, reqs, &o, peak, secs + 1);
    for (int i = 0; rc == 0 && o.done && i < n; i++) o.done(o.done_user, i);
  } else if (rc == 0) {
    t0 = mc_now_s();
    rc = mc_load_agree(world, mc_ckpt_read_many_notify(ck, reqs, n, o.done, o.done_user) == 0);
    secs[1] = mc_now_s() - t0;
  }
  mc_ckpt_io_bytes(ck, &io[0], &io[1]);
  io[0] -= read0, io[1] -= hashed0, io[2] = mc_ckpt_checked_bytes(ck) - checked0;
  if (stats) {
    memset(stats, 0, sizeof *stats);
    stats->world = p.W;
    stats->read = io[0], stats->hashed = io[1], stats->checked = io[2];
    stats->needed = p.needed, stats->per_rank_read = p.per_rank_read;
    stats->rounds = shared ? p.n_rounds : 0;
    stats->peak_exchange = peak[0], stats->peak_held = peak[1];
    stats->check_s = secs[0], stats->read_s = secs[1], stats->exchange_s = secs[2];
    for (int u = 0; u < p.n_needs; u++)
      stats->largest_shard = p.needs[u].bytes > stats->largest_shard ? p.needs[u].bytes : stats->largest_shard;
  }
  if (rc == 0 && p.W > 1 && mc_allreduce_sum(world, io, 3, MC_DT_I64) != 0) rc = mc_error_context("summing the bytes the load read");
  if (stats) stats->total_read = io[0], stats->total_hashed = io[1], stats->total_checked = io[2];
  plan_free(&p);
  return rc;
}
