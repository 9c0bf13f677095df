/* One-pass verified loads (format 6, ckpt/ckpt_stream.c) against the two-pass path of format
 * 5: for random saving layouts, piece sizes and io_threads, the hyperslabs of the saving
 * layout, of another layout and random boxes (several requests per shard) read from a
 * checkpoint and from its copy rewritten as format 5 equal the reference bit for bit; each
 * request's completion callback comes exactly once, with its buffer already complete. A
 * flipped byte in a data piece, in metadata and in the last short piece is reported as that
 * piece; a manifest whose shard offset lies is refused naming the dataset. */
#include "tests/ckpt/test_ckpt_common.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "tests/check.h"

/* ---------------------------------------------------------------- requests and their checks */

typedef struct {
  int n, cap;
  mc_ckpt_request *r;
  float **want;
  atomic_int *calls;     /* done calls per request */
  atomic_int incomplete; /* done calls that found their buffer not yet equal to the reference */
} req_set;

static void add_request(req_set *rs, const mc_geometry *g, uint64_t seed, int f, int s, const int64_t *start,
                        const int64_t *count) {
  if (rs->n == rs->cap) {
    rs->cap = rs->cap ? 2 * rs->cap : 64;
    rs->r = realloc(rs->r, (size_t)rs->cap * sizeof *rs->r);
    rs->want = realloc(rs->want, (size_t)rs->cap * sizeof *rs->want);
  }
  const mc_family *fam = &g->fams.f[f];
  int64_t n = 1;
  mc_ckpt_request *r = &rs->r[rs->n];
  memset(r, 0, sizeof *r);
  r->family = fam->name;
  r->state = (mc_state)s;
  for (int k = 0; k < fam->ndim; k++) r->start[k] = start[k], r->count[k] = count[k], n *= count[k];
  r->out = malloc((size_t)n * sizeof(float));
  memset(r->out, 0xff, (size_t)n * sizeof(float)); /* NaNs: an unfilled element shows */
  rs->want[rs->n] = malloc((size_t)n * sizeof(float));
  ref_box(seed, f, s, fam->ndim, fam->shape, start, count, rs->want[rs->n]);
  rs->n++;
}

static int float_state(mc_ckpt *ck, const mc_family *fam, int s) {
  const int fi = mc_ckpt_find_family(ck, fam->name);
  return mc_ckpt_family_has_state(ck, fi, (mc_state)s) && mc_ckpt_state_dtype(ck, fi, (mc_state)s) != MC_ELEM_I64;
}

/* Every hyperslab every rank of g holds of every float state. */
static void layout_requests(mc_ckpt *ck, const mc_geometry *g, uint64_t seed, req_set *rs) {
  for (int r = 0; r < g->world; r++)
    for (int f = 0; f < g->fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        mc_shard sh;
        if (!float_state(ck, &g->fams.f[f], s) || mc_shard_of(g, f, (mc_state)s, r, &sh) != 0 || !sh.held) continue;
        add_request(rs, g, seed, f, s, sh.start, sh.count);
      }
}

/* Every float tensor whole (so every file is needed in full) plus random boxes. */
static void box_requests(mc_ckpt *ck, const mc_geometry *g, uint64_t seed, uint64_t *ctr, req_set *rs) {
  int64_t zero[3] = {0, 0, 0};
  for (int f = 0; f < g->fams.n; f++)
    for (int s = 0; s < MC_N_STATES; s++)
      if (float_state(ck, &g->fams.f[f], s)) add_request(rs, g, seed, f, s, zero, g->fams.f[f].shape);
  for (int t = 0; t < 60; t++) {
    const int f = (int)mc_rng_below(8, 5, (*ctr)++, (uint64_t)g->fams.n), s = (int)mc_rng_below(8, 5, (*ctr)++, 3);
    if (!float_state(ck, &g->fams.f[f], s)) continue;
    const mc_family *fam = &g->fams.f[f];
    int64_t start[3] = {0}, count[3] = {0};
    for (int k = 0; k < fam->ndim; k++) {
      start[k] = (int64_t)mc_rng_below(8, 5, (*ctr)++, (uint64_t)fam->shape[k]);
      count[k] = 1 + (int64_t)mc_rng_below(8, 5, (*ctr)++, (uint64_t)(fam->shape[k] - start[k]));
    }
    add_request(rs, g, seed, f, s, start, count);
  }
}

static int64_t request_numel(const mc_ckpt *ck, const mc_ckpt_request *r) {
  const mc_ckpt_family *f = mc_ckpt_family_at(ck, mc_ckpt_find_family(ck, r->family));
  int64_t n = 1;
  for (int k = 0; k < f->ndim; k++) n *= r->count[k];
  return n;
}

typedef struct {
  mc_ckpt *ck;
  req_set *rs;
} done_ctx;

/* The completion callback: counts, and checks the buffer is complete right now. */
static void on_done(void *user, int i) {
  done_ctx *d = user;
  if (i < 0 || i >= d->rs->n) {
    atomic_fetch_add(&d->rs->incomplete, 1);
    return;
  }
  atomic_fetch_add(&d->rs->calls[i], 1);
  const size_t bytes = (size_t)request_numel(d->ck, &d->rs->r[i]) * sizeof(float);
  if (memcmp(d->rs->r[i].out, d->rs->want[i], bytes) != 0) atomic_fetch_add(&d->rs->incomplete, 1);
}

/* Reads rs in one mc_ckpt_read_many_notify call and checks values and callbacks; what names
 * the case in messages. */
static void read_and_check(mc_ckpt *ck, req_set *rs, const char *what) {
  rs->calls = calloc((size_t)rs->n + 1, sizeof *rs->calls);
  atomic_init(&rs->incomplete, 0);
  for (int i = 0; i < rs->n; i++) atomic_init(&rs->calls[i], 0);
  done_ctx d = {ck, rs};
  int rc = mc_ckpt_read_many_notify(ck, rs->r, rs->n, on_done, &d);
  CHECK(rc == 0, "%s: read failed: %s", what, mc_errmsg());
  int bad = 0, calls = 0;
  for (int i = 0; i < rs->n; i++) {
    bad += memcmp(rs->r[i].out, rs->want[i], (size_t)request_numel(ck, &rs->r[i]) * sizeof(float)) != 0;
    calls += atomic_load(&rs->calls[i]) != 1;
  }
  CHECK(bad == 0, "%s: %d of %d requests differ from the reference", what, bad, rs->n);
  CHECK(calls == 0, "%s: %d of %d requests not reported exactly once", what, calls, rs->n);
  CHECK(atomic_load(&rs->incomplete) == 0, "%s: %d done calls came before their buffer was complete", what,
        atomic_load(&rs->incomplete));
}

static void free_requests(req_set *rs) {
  for (int i = 0; i < rs->n; i++) free(rs->r[i].out), free(rs->want[i]);
  free(rs->r);
  free(rs->want);
  free(rs->calls);
  memset(rs, 0, sizeof *rs);
}

/* ---------------------------------------------------------------- checkpoints */

/* Rewrites <dir>/step_<step> as format 5 records it: no shard offsets, format_version 5. */
static int downgrade_to_v5(const char *dir, int64_t step) {
  char mp[4200];
  size_t n = 0;
  char *buf = read_manifest_text(dir, step, mp, &n), *p;
  if (!buf) return -1;
  int removed = 0;
  while ((p = strstr(buf, "\"offset\":")) != NULL) { /* the last key of a shard: cut from the comma before it */
    char *from = p, *to = p + 9;
    while (from > buf && from[-1] != ',') from--;
    from = from > buf ? from - 1 : from;
    while (*to == ' ' || *to == '\t') to++;
    while (*to >= '0' && *to <= '9') to++;
    memmove(from, to, strlen(to) + 1);
    removed++;
  }
  FILE *f = removed ? fopen(mp, "wb") : NULL;
  int rc = f && fwrite(buf, 1, strlen(buf), f) == strlen(buf) ? 0 : -1;
  if (f) rc |= fclose(f);
  free(buf);
  if (rc == 0) rc = rehash_manifest(dir, step);
  return rc == 0 ? edit_manifest(dir, step, "\"format_version\":\t6", "\"format_version\":\t5") : -1;
}

static mc_ckpt *open_with(const char *dir, int threads) {
  mc_ckpt_open_opts o;
  mc_ckpt_open_opts_default(&o);
  o.io_threads = threads;
  mc_ckpt *ck = NULL;
  CHECK_OK(mc_ckpt_open(dir, &o, &ck));
  return ck;
}

/* ---------------------------------------------------------------- the property test */

static void test_random_layouts(const char *root) {
  static const int threads[] = {1, 3, 8};
  static const int64_t pieces[] = {4096, 8192, 65536, 0};
  uint64_t ctr = 0;
  for (int it = 0; it < 6; it++) {
    const lay a = random_layout_of(8, &ctr), b = random_layout_of(8, &ctr);
    const uint64_t seed = 500 + (uint64_t)it;
    g_ref_piece_bytes = pieces[it % 4];
    char v6[2400], v5[2400], cmd[5000], what[256];
    pathf(v6, sizeof v6, "%s/rand%d", root, it);
    pathf(v5, sizeof v5, "%s/rand%d_v5", root, it);
    CHECK_OK(save_reference(v6, a.tp, a.pp, a.dp, a.ep, a.sp, a.zero, 9, seed, 0));
    pathf(cmd, sizeof cmd, "cp -r '%s' '%s'", v6, v5);
    CHECK(system(cmd) == 0 && downgrade_to_v5(v5, 9) == 0, "%s: not rewritten as format 5", v5);
    mc_config cfg;
    mc_geometry ga, gb;
    if (geom(&a, &cfg, &ga) != 0) continue;
    if (geom(&b, &cfg, &gb) != 0) {
      mc_geometry_free(&ga);
      continue;
    }
    for (int v = 0; v < 2; v++) {
      const int th = threads[(it + v) % 3];
      for (int kind = 0; kind < 3; kind++) {
        mc_ckpt *ck = open_with(v ? v5 : v6, th);
        if (!ck) continue;
        CHECK(mc_ckpt_format_version(ck) == (v ? 5 : 6), "%s: format %d", v ? v5 : v6, mc_ckpt_format_version(ck));
        req_set rs = {0};
        if (kind == 0) layout_requests(ck, &ga, seed, &rs);
        else if (kind == 1) layout_requests(ck, &gb, seed, &rs);
        else box_requests(ck, &ga, seed, &ctr, &rs);
        pathf(what, sizeof what, "format %d, saved tp%d pp%d dp%d ep%d sp%d z%d, pieces %lld, %s, %d threads", v ? 5 : 6,
              a.tp, a.pp, a.dp, a.ep, a.sp, a.zero, (long long)g_ref_piece_bytes,
              kind == 0 ? "saving layout" : kind == 1 ? "another layout" : "boxes", th);
        read_and_check(ck, &rs, what);
        /* a second read on the same handle: nothing is streamed again, values the same */
        for (int i = 0; i < rs.n; i++) memset(rs.r[i].out, 0xff, (size_t)request_numel(ck, &rs.r[i]) * sizeof(float));
        free(rs.calls);
        read_and_check(ck, &rs, what);
        free_requests(&rs);
        mc_ckpt_close(ck);
      }
    }
    mc_geometry_free(&ga);
    mc_geometry_free(&gb);
  }
  g_ref_piece_bytes = 0;
}

/* ---------------------------------------------------------------- corruption */

/* Loads every hyperslab of layout g (tp2 dp2) in one call; returns its result. */
static int load_layout(const char *dir, const mc_geometry *g, uint64_t seed) {
  mc_ckpt *ck = open_with(dir, 3);
  if (!ck) return -1;
  req_set rs = {0};
  layout_requests(ck, g, seed, &rs);
  int rc = mc_ckpt_read_many(ck, rs.r, rs.n);
  free_requests(&rs);
  mc_ckpt_close(ck);
  return rc;
}

static void flip_byte(const char *path, int64_t pos) {
  int fd = open(path, O_RDWR);
  unsigned char c = 0;
  CHECK(fd >= 0 && pread(fd, &c, 1, pos) == 1, "%s: cannot read byte %lld", path, (long long)pos);
  c ^= 0x20;
  CHECK(fd >= 0 && pwrite(fd, &c, 1, pos) == 1, "%s: cannot write byte %lld", path, (long long)pos);
  if (fd >= 0) close(fd);
}

/* Flips byte pos of file `name`, expects the load to name piece pos / piece of that file, and
 * flips it back. */
static void expect_piece_error(const char *dir, const mc_geometry *g, const char *name, int64_t pos, int64_t piece,
                               int64_t n_pieces, const char *what) {
  char path[4400], needle[128];
  pathf(path, sizeof path, "%s/step_9/%s", dir, name);
  flip_byte(path, pos);
  const int rc = load_layout(dir, g, 21);
  pathf(needle, sizeof needle, "hash mismatch in piece %lld of %lld", (long long)(pos / piece), (long long)n_pieces);
  CHECK(rc != 0 && strstr(mc_errmsg(), needle) && strstr(mc_errmsg(), name), "%s (byte %lld): expected '%s' in: %s",
        what, (long long)pos, needle, rc ? mc_errmsg() : "it loaded");
  flip_byte(path, pos);
  CHECK(load_layout(dir, g, 21) == 0, "%s: the restored checkpoint does not load: %s", what, mc_errmsg());
}

/* 1 if byte pos of the file lies in the data of a shard the manifest places in it. */
static int in_data(mc_ckpt *ck, const char *name, int64_t pos) {
  for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (!strcmp(s->file, name) && s->offset > 0 && pos >= s->offset && pos < s->offset + s->numel * 4) return 1;
  }
  return 0;
}

static void test_corrupt_pieces(const char *root) {
  char dir[2400];
  pathf(dir, sizeof dir, "%s/corrupt", root);
  g_ref_piece_bytes = 4096;
  CHECK_OK(save_reference(dir, 2, 1, 2, 1, 0, 1, 9, 21, 0));
  g_ref_piece_bytes = 0;
  mc_config cfg;
  mc_geometry g;
  if (tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g) != 0) return;
  CHECK(load_layout(dir, &g, 21) == 0, "the intact checkpoint does not load: %s", mc_errmsg());
  mc_ckpt *ck = open_with(dir, 2);
  if (!ck) {
    mc_geometry_free(&g);
    return;
  }
  mc_ckpt_file_info fi;
  int short_tail = -1;
  CHECK(mc_ckpt_file_at(ck, 0, &fi) == 0 && fi.piece_bytes == 4096 && fi.n_pieces > 3, "rank file 0: %lld pieces",
        (long long)fi.n_pieces);
  /* a data piece: the middle of the largest shard of file 0 */
  const mc_ckpt_shard *big = NULL;
  for (int i = 0; i < mc_ckpt_n_shards(ck); i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (!strcmp(s->file, fi.name) && s->offset > 0 && (!big || s->numel > big->numel)) big = s;
  }
  CHECK(big != NULL, "%s: no shard with an offset", fi.name);
  if (big) expect_piece_error(dir, &g, fi.name, big->offset + big->numel * 2, 4096, fi.n_pieces, "flipped data byte");
  /* metadata: the first byte past a third of the file that no shard's data holds */
  int64_t meta = fi.bytes / 3;
  while (meta < fi.bytes && in_data(ck, fi.name, meta)) meta++;
  CHECK(meta < fi.bytes, "%s: no metadata byte after a third", fi.name);
  if (meta < fi.bytes) expect_piece_error(dir, &g, fi.name, meta, 4096, fi.n_pieces, "flipped metadata byte");
  /* the last piece of a file whose size is not a multiple of the piece size */
  for (int k = 0; k < mc_ckpt_n_files(ck) && short_tail < 0; k++)
    if (mc_ckpt_file_at(ck, k, &fi) == 0 && fi.bytes % 4096 != 0) short_tail = k;
  CHECK(short_tail >= 0, "every rank file is a multiple of 4096 bytes: no short last piece");
  if (short_tail >= 0) expect_piece_error(dir, &g, fi.name, fi.bytes - 1, 4096, fi.n_pieces, "flipped byte in the last piece");
  mc_ckpt_close(ck);
  mc_geometry_free(&g);
}

/* ---------------------------------------------------------------- lying offsets */

/* The `"offset":\t<off>` text of a shard entry (the entry's last key). */
static void offset_text(char *buf, size_t cap, int64_t off) { pathf(buf, cap, "\"offset\":\t%lld\n", (long long)off); }

static void test_wrong_offset(const char *root) {
  char dir[2400], a_txt[64], b_txt[64], tmp_txt[64];
  pathf(dir, sizeof dir, "%s/offset", root);
  CHECK_OK(save_reference(dir, 2, 1, 2, 1, 0, 1, 9, 21, 0));
  mc_config cfg;
  mc_geometry g;
  if (tiny_geometry(2, 1, 2, 1, 0, 1, &cfg, &g) != 0) return;
  mc_ckpt *ck = open_with(dir, 2);
  if (!ck) {
    mc_geometry_free(&g);
    return;
  }
  /* two float shards of one file and one size (a family's param and exp_avg) */
  const mc_ckpt_shard *a = NULL, *b = NULL;
  for (int i = 0; i < mc_ckpt_n_shards(ck) && !b; i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    if (s->offset <= 0 || s->dtype != MC_ELEM_F32 || s->numel < 64) continue;
    if (!a && s->state == MC_STATE_PARAM) a = s;
    else if (a && !strcmp(s->family, a->family) && !strcmp(s->file, a->file) && s->numel == a->numel) b = s;
  }
  CHECK(a && b, "no two shards of one size to swap");
  if (!a || !b) {
    mc_ckpt_close(ck);
    mc_geometry_free(&g);
    return;
  }
  char da[128], db[128];
  const int64_t oa = a->offset, ob = b->offset;
  pathf(da, sizeof da, "%s", a->dataset);
  pathf(db, sizeof db, "%s", b->dataset);
  mc_ckpt_close(ck);
  offset_text(a_txt, sizeof a_txt, oa);
  offset_text(b_txt, sizeof b_txt, ob);
  offset_text(tmp_txt, sizeof tmp_txt, 1);
  /* swapped: each lands whole on the other's bytes; HDF5 disagrees with both */
  CHECK(edit_manifest(dir, 9, a_txt, tmp_txt) == 0 && edit_manifest(dir, 9, b_txt, a_txt) == 0 &&
            edit_manifest(dir, 9, tmp_txt, b_txt) == 0,
        "cannot swap the offsets of %s and %s", da, db);
  int rc = load_layout(dir, &g, 21);
  char both[96];
  pathf(both, sizeof both, "at byte %lld but the manifest records offset %lld", (long long)oa, (long long)ob);
  CHECK(rc != 0 && strstr(mc_errmsg(), da) && strstr(mc_errmsg(), both), "swapped offsets of %s: %s", da,
        rc ? mc_errmsg() : "it loaded");
  /* moved by 4 bytes: onto the next shard's data, refused naming both */
  offset_text(tmp_txt, sizeof tmp_txt, ob + 4);
  CHECK(edit_manifest(dir, 9, b_txt, a_txt) == 0 && edit_manifest(dir, 9, a_txt, tmp_txt) == 0,
        "cannot move the offset of %s", da);
  rc = load_layout(dir, &g, 21);
  CHECK(rc != 0 && strstr(mc_errmsg(), da) && strstr(mc_errmsg(), "overlapping bytes"), "moved offset of %s: %s", da,
        rc ? mc_errmsg() : "it loaded");
  /* past the end of the file: the manifest itself is refused, naming the shard entry */
  char end_txt[64];
  offset_text(end_txt, sizeof end_txt, 999999999);
  CHECK(edit_manifest(dir, 9, tmp_txt, end_txt) == 0, "cannot move the offset of %s", da);
  mc_ckpt *bad = NULL;
  CHECK(mc_ckpt_open(dir, NULL, &bad) != 0 && strstr(mc_errmsg(), ".offset 999999999"), "offset past the end: %s",
        bad ? "opened" : mc_errmsg());
  mc_ckpt_close(bad);
  /* a version 5 manifest has no offsets */
  CHECK(edit_manifest(dir, 9, end_txt, b_txt) == 0 &&
            edit_manifest(dir, 9, "\"format_version\":\t6", "\"format_version\":\t5") == 0,
        "cannot set version 5");
  CHECK(mc_ckpt_open(dir, NULL, &bad) != 0 && strstr(mc_errmsg(), "offset is a key of format version 6"),
        "offset in version 5: %s", bad ? "opened" : mc_errmsg());
  mc_ckpt_close(bad);
  mc_geometry_free(&g);
}

int main(void) {
  char root[2048];
  scratch_dir("stream", root, sizeof root);
  test_random_layouts(root);
  test_corrupt_pieces(root);
  test_wrong_offset(root);
  if (mc_check_failures == 0) rm_rf(root);
  return mc_check_exit("test_ckpt_stream");
}
