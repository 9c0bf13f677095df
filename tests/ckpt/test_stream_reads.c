/* mc_stream_files (ckpt/ckpt_stream.c) on its own, over random cases: 1-3 files of random sizes
 * (most not a multiple of 4 KiB), random piece sizes and read sizes (a read size that does not
 * divide the piece is rounded down to one that does), random shards with gaps between them,
 * each landed in its own buffer or a temporary one; half the cases with the files' pages
 * dropped from the page cache first, so the reads go to the disk. Every shard is completed exactly once with its exact
 * bytes and their SHA-256, files are reported verified once each in order, and a flipped byte
 * fails the stream naming its piece, with no file reported verified from that one on. */
#include "tests/ckpt/test_ckpt_common.h"

#include <fcntl.h>
#include <stdatomic.h>

#include "ckpt/ckpt_internal.h"
#include "tests/check.h"

#define MAX_FILES 3
#define MAX_SHARDS 4096

/* splitmix64: the test's own cases, not model randomness */
static uint64_t next_u64(uint64_t *st) {
  uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct {
  unsigned char *bytes[MAX_FILES]; /* each file's content as written */
  mc_stream_shard *ss;
  atomic_int calls[MAX_SHARDS];
  atomic_int wrong; /* completions whose data or hash was not the shard's */
  int corrupt_file; /* -1: none; else completions of that file's shards are not compared */
  int files_done[MAX_FILES + 1];
  int n_done;
  int order_ok;
} stream_case;

static int on_complete(void *user, int k, const void *data, const char hex[65]) {
  stream_case *c = user;
  const mc_stream_shard *s = &c->ss[k];
  atomic_fetch_add(&c->calls[k], 1);
  char want[65];
  mc_sha256_hex(data, (size_t)s->bytes, want);
  int ok = strcmp(want, hex) == 0; /* the hash given is of the bytes given */
  if (s->file != c->corrupt_file) ok = ok && memcmp(data, c->bytes[s->file] + s->offset, (size_t)s->bytes) == 0;
  if (!ok) atomic_fetch_add(&c->wrong, 1);
  return 0;
}

static void on_file(void *user, int f) {
  stream_case *c = user;
  if (c->n_done > 0 && c->files_done[c->n_done - 1] >= f) c->order_ok = 0;
  c->files_done[c->n_done++] = f;
}

static void write_file(const char *path, const unsigned char *b, int64_t n, int drop) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0, "cannot create %s", path);
  if (fd < 0) return;
  CHECK(write(fd, b, (size_t)n) == (ssize_t)n, "short write to %s", path);
  fsync(fd);
  if (drop) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* the reads then come from the disk */
  close(fd);
}

static void one_case(const char *dir, uint64_t seed, int corrupt) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  const int n_files = 1 + (int)(next_u64(&st) % MAX_FILES), drop = (int)(seed & 1);
  stream_case *c = calloc(1, sizeof *c);
  mc_piece_file pf[MAX_FILES];
  char paths[MAX_FILES][4300];
  c->ss = calloc(MAX_SHARDS, sizeof *c->ss);
  c->order_ok = 1;
  c->corrupt_file = -1;
  memset(pf, 0, sizeof pf);
  int ns = 0;
  for (int f = 0; f < n_files; f++) {
    const int64_t bytes = 1 + (int64_t)(next_u64(&st) % (3 << 20));
    const int64_t piece = 4096 * (1 + (int64_t)(next_u64(&st) % 96));
    c->bytes[f] = malloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) c->bytes[f][i] = (unsigned char)next_u64(&st);
    pathf(paths[f], sizeof paths[f], "%s/f%d.bin", dir, f);
    pf[f] = (mc_piece_file){.path = paths[f], .bytes = bytes, .piece_bytes = piece,
                            .n_pieces = mc_piece_count(bytes, piece)};
    pf[f].pieces = malloc((size_t)pf[f].n_pieces * 65);
    for (int64_t k = 0; k < pf[f].n_pieces; k++) {
      const int64_t off = k * piece, len = bytes - off < piece ? bytes - off : piece;
      mc_sha256_hex(c->bytes[f] + off, (size_t)len, pf[f].pieces[k]);
    }
    /* shards: random lengths and gaps, some in the caller's buffers, some in temporary ones */
    for (int64_t off = (int64_t)(next_u64(&st) % 5000); off < bytes && ns < MAX_SHARDS;) {
      int64_t len = 1 + (int64_t)(next_u64(&st) % (next_u64(&st) % 2 ? 700000 : 9000));
      if (off + len > bytes) len = bytes - off;
      c->ss[ns] = (mc_stream_shard){f, off, len, "d", next_u64(&st) % 2 ? malloc((size_t)len) : NULL, NULL};
      ns++;
      off += len + (int64_t)(next_u64(&st) % 3 == 0 ? next_u64(&st) % 20000 : 0);
    }
  }
  int64_t flip_at = -1;
  if (corrupt) {
    c->corrupt_file = (int)(next_u64(&st) % (uint64_t)n_files);
    flip_at = (int64_t)(next_u64(&st) % (uint64_t)pf[c->corrupt_file].bytes);
  }
  for (int f = 0; f < n_files; f++) {
    if (f == c->corrupt_file) c->bytes[f][flip_at] ^= 0x20; /* on disk only: flipped back below */
    write_file(paths[f], c->bytes[f], pf[f].bytes, drop);
    if (f == c->corrupt_file) c->bytes[f][flip_at] ^= 0x20;
  }
  int64_t read_bytes = next_u64(&st) % 4 == 0 ? 5000 + (int64_t)(next_u64(&st) % 100000)
                                               : 4096 * (1 + (int64_t)(next_u64(&st) % 40));
  const int threads = 1 + (int)(next_u64(&st) % 4);
  mc_error_clear();
  const int rc = mc_stream_files(pf, n_files, c->ss, ns, threads, read_bytes, on_complete, on_file, c);
  char what[160];
  snprintf(what, sizeof what, "case %" PRIu64 " (%d files, %d shards, read %" PRId64 ", %d threads%s%s)", seed, n_files,
           ns, read_bytes, threads, drop ? ", uncached" : "", corrupt ? ", corrupt" : "");
  CHECK(atomic_load(&c->wrong) == 0, "%s: %d completions had the wrong bytes or hash", what, atomic_load(&c->wrong));
  CHECK(c->order_ok, "%s: files reported out of order", what);
  if (!corrupt) {
    CHECK(rc == 0, "%s: %s", what, mc_errmsg());
    CHECK(c->n_done == n_files, "%s: %d of %d files reported verified", what, c->n_done, n_files);
    for (int k = 0; k < ns; k++) {
      CHECK(atomic_load(&c->calls[k]) == 1, "%s: shard %d completed %d times", what, k, atomic_load(&c->calls[k]));
      CHECK(c->ss[k].err == NULL, "%s: shard %d: %s", what, k, c->ss[k].err);
      if (c->ss[k].dst) CHECK(memcmp(c->ss[k].dst, c->bytes[c->ss[k].file] + c->ss[k].offset, (size_t)c->ss[k].bytes) == 0,
                              "%s: shard %d's buffer", what, k);
    }
  } else {
    const int64_t piece = flip_at / pf[c->corrupt_file].piece_bytes;
    char want[64];
    snprintf(want, sizeof want, "piece %" PRId64 " of", piece);
    CHECK(rc != 0, "%s: a flipped byte at %" PRId64 " of file %d went unnoticed", what, flip_at, c->corrupt_file);
    CHECK(pf[c->corrupt_file].err && strstr(pf[c->corrupt_file].err, want) && strstr(mc_errmsg(), want),
          "%s: the error should name %s: file's '%s', returned '%s'", what, want,
          pf[c->corrupt_file].err ? pf[c->corrupt_file].err : "(none)", mc_errmsg());
    for (int i = 0; i < c->n_done; i++)
      CHECK(c->files_done[i] < c->corrupt_file, "%s: file %d reported verified", what, c->files_done[i]);
    for (int k = 0; k < ns; k++)
      CHECK(atomic_load(&c->calls[k]) <= 1, "%s: shard %d completed %d times", what, k, atomic_load(&c->calls[k]));
  }
  for (int f = 0; f < n_files; f++) {
    free(c->bytes[f]);
    free(pf[f].pieces);
    free(pf[f].err);
    unlink(paths[f]);
  }
  for (int k = 0; k < ns; k++) {
    free(c->ss[k].dst);
    free(c->ss[k].err);
  }
  free(c->ss);
  free(c);
}

int main(void) {
  char dir[4096];
  scratch_dir("stream_reads", dir, sizeof dir);
  for (uint64_t seed = 1; seed <= 48; seed++) one_case(dir, seed, seed % 4 == 0);
  rm_rf(dir);
  return mc_check_exit("test_stream_reads");
}
