/* The reshard planner and streaming engine in memory, over random pairs of layouts of one
 * model: the pieces of every target shard are disjoint and cover it; executing A -> B gives
 * every target shard the right bytes and hash; B -> A gives back A's shards bit-identically;
 * a corrupted source shard is refused naming it; tiny chunks exercise band boundaries. */
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "reshard/execute.h"
#include "reshard/plan.h"
#include "rs_testlib.h"

typedef struct {
  float **src;            /* per plan.src */
  unsigned char (*src_sha)[32];
  float **tgt;            /* per plan.targets */
  unsigned char (*tgt_sha)[32];
  int corrupt_src;        /* index whose recorded hash is wrong, -1 none */
} mem_io;

static void sha(const void *d, size_t n, unsigned char out[32]) {
  unsigned int len;
  EVP_Digest(d, n, out, &len, EVP_sha256(), NULL);
}

/* Callbacks run on worker threads: they count contract breaches; main checks the count. */
static atomic_int not_whole_rows;

static int64_t row_of(const mc_box *s) {
  int64_t r = 1;
  for (int d = 1; d < s->ndim; d++) r *= s->count[d];
  return r;
}

static int m_read(void *ctx, const mc_rs_plan *p, int s, int64_t off, int64_t n, float *buf) {
  mem_io *m = ctx;
  int64_t r = row_of(&p->src[s].slab);
  if (off % r || n % r) atomic_fetch_add(&not_whole_rows, 1);
  memcpy(buf, m->src[s] + off, (size_t)n * 4);
  return 0;
}
static int m_write(void *ctx, const mc_rs_plan *p, int t, int64_t off, int64_t n, const void *buf) {
  mem_io *m = ctx;
  int64_t r = row_of(&p->targets[t].shard.slab);
  if (off % r || n % r) atomic_fetch_add(&not_whole_rows, 1);
  memcpy(m->tgt[t] + off, buf, (size_t)n * 4);
  return 0;
}
static int m_src_done(void *ctx, const mc_rs_plan *p, int s, const unsigned char h[32]) {
  mem_io *m = ctx;
  if (memcmp(h, m->src_sha[s], 32) != 0)
    return mc_error("source shard %d (rank %d) fails its SHA-256 check", s, p->src[s].rank);
  return 0;
}
static int m_tgt_done(void *ctx, const mc_rs_plan *p, int t, const unsigned char h[32]) {
  mem_io *m = ctx;
  (void)p;
  memcpy(m->tgt_sha[t], h, 32);
  return 0;
}

static const mc_rs_io IO = {NULL, m_read, m_write, m_src_done, m_tgt_done};

/* Disjoint pieces covering each target, inside their source shard. */
static void check_plan(const mc_rs_plan *p) {
  int bad = 0;
  for (int t = 0; t < p->n_targets && !bad; t++) {
    const mc_rs_target *tg = &p->targets[t];
    int64_t sum = 0;
    for (int i = 0; i < tg->n_pieces; i++) {
      const mc_rs_piece *a = &p->pieces[tg->first_piece + i];
      sum += mc_box_numel(&a->slab);
      if (!mc_box_contains(&tg->shard.slab, &a->slab) || !mc_box_contains(&p->src[a->src].slab, &a->slab)) bad = 1;
      for (int j = i + 1; j < tg->n_pieces; j++) {
        mc_box x;
        if (mc_box_intersect(&a->slab, &p->pieces[tg->first_piece + j].slab, &x)) bad = 2;
      }
    }
    if (sum != mc_box_numel(&tg->shard.slab)) bad = 3;
    CHECK(!bad, "target %d: pieces wrong (%d)", t, bad);
  }
}

/* Executes p, with sources filled from the global content (or given), into fresh targets. */
static float **run(const mc_rs_plan *p, const mc_geometry *g, float **src_in, int64_t chunk, int threads,
                   int corrupt, unsigned char (**tgt_sha_out)[32], int *rc_out) {
  mem_io m;
  m.src = malloc((size_t)p->n_src * sizeof *m.src);
  m.src_sha = malloc((size_t)p->n_src * 32);
  for (int s = 0; s < p->n_src; s++) {
    const mc_rs_shard *sh = &p->src[s];
    int64_t n = mc_box_numel(&sh->slab);
    m.src[s] = malloc((size_t)n * 4 + 4);
    if (src_in) memcpy(m.src[s], src_in[s], (size_t)n * 4);
    else {
      int ti = 0;
      while (!(s >= p->tensors[ti].first_src && s < p->tensors[ti].first_src + p->tensors[ti].n_src)) ti++;
      const mc_family *f = &g->fams.f[p->tensors[ti].fam];
      rs_pack(p->tensors[ti].fam, p->tensors[ti].state, f->shape, f->ndim, &sh->slab, m.src[s]);
    }
    sha(m.src[s], (size_t)n * 4, m.src_sha[s]);
    if (s == corrupt) ((unsigned char *)m.src[s])[n * 2] ^= 1; /* one bit flips after the hash was recorded */
  }
  m.tgt = malloc((size_t)p->n_targets * sizeof *m.tgt);
  m.tgt_sha = calloc((size_t)p->n_targets, 32);
  for (int t = 0; t < p->n_targets; t++) m.tgt[t] = calloc((size_t)mc_box_numel(&p->targets[t].shard.slab) + 1, 4);
  mc_rs_io io = IO;
  io.ctx = &m;
  mc_rs_exec_opts o = {.chunk_bytes = chunk, .threads = threads};
  mc_rs_exec_stats st;
  *rc_out = mc_rs_execute(p, g, &io, &o, &st);
  if (*rc_out == 0) {
    CHECK(st.bytes_read == p->bytes && st.bytes_written == p->bytes, "bytes %lld/%lld of %lld",
          (long long)st.bytes_read, (long long)st.bytes_written, (long long)p->bytes);
  }
  for (int s = 0; s < p->n_src; s++) free(m.src[s]);
  free(m.src);
  free(m.src_sha);
  *tgt_sha_out = m.tgt_sha;
  return m.tgt;
}

static void free_bufs(float **b, int n) {
  for (int i = 0; i < n; i++) free(b[i]);
  free(b);
}

/* same: B is A's layout (every target shard is one source shard: digests are reused). */
static int pair_case(uint64_t seed, const mc_model *mdl, int verbose, int same) {
  mc_geometry a, b;
  if (rs_random_geometry(seed, mdl, 24, &a) ||
      (same ? mc_geometry_build(mdl, &a.layout, NULL, -1, &b) : rs_random_geometry(seed, mdl, 24, &b))) {
    CHECK(0, "no valid random layout: %s", mc_errmsg());
    return 0;
  }
  mc_rs_plan ab, ba;
  CHECK_OK(mc_rs_plan_build(&a, &b, MC_RS_ALL_STATES, &ab));
  CHECK_OK(mc_rs_plan_build(&b, &a, MC_RS_ALL_STATES, &ba));
  check_plan(&ab);
  check_plan(&ba);
  int64_t chunk = 4 * (1 + rs_pick(seed, 40));
  int threads = 1 + rs_pick(seed, 3), rc;
  unsigned char(*sha_b)[32], (*sha_a)[32];
  float **tb = run(&ab, &a, NULL, chunk, threads, -1, &sha_b, &rc);
  CHECK(rc == 0, "A->B failed: %s", mc_errmsg());
  /* Every target shard holds the global tensor's hyperslab, and its hash is of those bytes. */
  int wrong = 0;
  for (int t = 0; t < ab.n_targets; t++) {
    const mc_rs_target *tg = &ab.targets[t];
    const mc_rs_tensor *tn = &ab.tensors[tg->tensor];
    const mc_family *f = &a.fams.f[tn->fam];
    int64_t n = mc_box_numel(&tg->shard.slab);
    float *want = malloc((size_t)n * 4 + 4);
    rs_pack(tn->fam, tn->state, f->shape, f->ndim, &tg->shard.slab, want);
    unsigned char h[32];
    sha(want, (size_t)n * 4, h);
    if (memcmp(want, tb[t], (size_t)n * 4) || memcmp(h, sha_b[t], 32)) wrong++;
    free(want);
  }
  CHECK(wrong == 0, "%d target shards wrong after A->B", wrong);
  /* B's targets are, in order, the sources of B -> A (both enumerate primaries by rank). */
  float **ta = run(&ba, &b, tb, 4 * (1 + rs_pick(seed, 40)), threads, -1, &sha_a, &rc);
  CHECK(rc == 0, "B->A failed: %s", mc_errmsg());
  wrong = 0;
  for (int t = 0; t < ba.n_targets; t++) {
    const mc_rs_target *tg = &ba.targets[t];
    const mc_rs_tensor *tn = &ba.tensors[tg->tensor];
    const mc_family *f = &a.fams.f[tn->fam];
    int64_t n = mc_box_numel(&tg->shard.slab);
    float *orig = malloc((size_t)n * 4 + 4);
    rs_pack(tn->fam, tn->state, f->shape, f->ndim, &ab.src[t].slab, orig);
    unsigned char h[32];
    sha(orig, (size_t)n * 4, h);
    if (ab.src[t].rank != tg->shard.rank || memcmp(orig, ta[t], (size_t)n * 4) || memcmp(h, sha_a[t], 32)) wrong++;
    free(orig);
  }
  CHECK(wrong == 0, "%d shards of A not restored bit-identically by A->B->A", wrong);
  if (verbose) {
    char sa[64], sb[64];
    snprintf(sa, sizeof sa, "tp%d pp%d dp%d ep%d z%d", a.layout.tp, a.layout.pp, a.layout.dp, a.layout.ep, a.layout.zero);
    snprintf(sb, sizeof sb, "tp%d pp%d dp%d ep%d z%d", b.layout.tp, b.layout.pp, b.layout.dp, b.layout.ep, b.layout.zero);
    printf("  %s -> %s: %d pieces, chunk %lld\n", sa, sb, ab.n_pieces, (long long)chunk);
  }
  /* A corrupted source shard is refused with its name. */
  if (ab.n_src > 0) {
    int bad = rs_pick(seed, ab.n_src);
    unsigned char(*sh)[32];
    float **tc = run(&ab, &a, NULL, chunk, threads, bad, &sh, &rc);
    char want[64];
    snprintf(want, sizeof want, "source shard %d (rank %d)", bad, ab.src[bad].rank);
    CHECK(rc != 0 && strstr(mc_errmsg(), want), "corruption of %s not reported: %s", want, rc ? mc_errmsg() : "ok");
    free_bufs(tc, ab.n_targets);
    free(sh);
  }
  free_bufs(tb, ab.n_targets);
  free_bufs(ta, ba.n_targets);
  free(sha_a);
  free(sha_b);
  int changes = a.layout.zero != b.layout.zero || a.layout.tp != b.layout.tp || a.layout.pp != b.layout.pp ||
                a.layout.dp != b.layout.dp || a.layout.ep != b.layout.ep;
  mc_rs_plan_free(&ab);
  mc_rs_plan_free(&ba);
  mc_geometry_free(&a);
  mc_geometry_free(&b);
  return changes;
}

static void test_model_change_refused(void) {
  mc_model m1, m2;
  rs_test_model(&m1, "AEMR");
  rs_test_model(&m2, "AEMA");
  m2.d_model = 8;
  mc_geometry a, b;
  CHECK_OK(rs_random_geometry(1, &m1, 1, &a));
  CHECK_OK(rs_random_geometry(1, &m2, 1, &b));
  mc_rs_plan p;
  CHECK(mc_rs_plan_build(&a, &b, MC_RS_ALL_STATES, &p) != 0, "model change accepted");
  CHECK(strstr(mc_errmsg(), "pattern AEMR -> AEMA") && strstr(mc_errmsg(), "d_model 6 -> 8"),
        "model change message: %s", mc_errmsg());
  mc_geometry_free(&a);
  mc_geometry_free(&b);
}

int main(void) {
  static const char *patterns[] = {"AEMR", "AEMEAEMR", "MRAE"};
  int changed = 0, n = 0;
  for (int pi = 0; pi < 3; pi++) {
    mc_model m;
    rs_test_model(&m, patterns[pi]);
    for (int i = 0; i < 40; i++, n++) changed += pair_case(1000 + (uint64_t)n, &m, i < 2, 0);
    for (int i = 0; i < 3; i++) pair_case(5000 + (uint64_t)i + 10 * (uint64_t)pi, &m, 0, 1);
  }
  CHECK(atomic_load(&not_whole_rows) == 0, "%d reads/writes were not whole rows", atomic_load(&not_whole_rows));
  CHECK(changed > n / 2, "only %d of %d pairs change the layout", changed, n);
  test_model_change_refused();
  return mc_check_exit("test_reshard_engine");
}
