/* Checkpoint I/O benchmark: save and load of a synthetic state (>= 2 GiB by default) next to
 * the raw sequential write and read speed of the same disk, measured in the same run, and
 * the training stall of an async save. Not a timed test; see docs/bench-ckpt.md.
 *
 *   bench_ckpt --dir DIR [--gib 2] [--tp 2] [--dp 2] [--zero 1] [--threads 2] [--rounds 3] [--pause 0]
 *              [--alternate N] [--keep-files]
 *   bench_ckpt --dir DIR --compress-from CKPT [--threads 2] [--rounds 3]
 *
 * --compress-from: the state of an existing checkpoint (e.g. a trained run's), saved one state
 * kind at a time with checkpoint.compress none and deflate (zlib levels 1 and 6): bytes of
 * the rank files, ratio (raw fp32 bytes / rank-file bytes), save time (mc_ckpt_save) and verified load time (open + read every shard after
 * dropping the files' pages), median of the rounds; loads are compared with the state.
 *
 * Method: raw write = write() of 64 MiB blocks then fsync, timed to the end of the fsync;
 * raw read = read() of 64 MiB blocks after posix_fadvise(DONTNEED) has dropped the file's
 * (clean) pages; checkpoint save = mc_ckpt_save wall time (hashing, HDF5 writes, fsyncs,
 * manifest, commit); load = mc_ckpt_open + reading every stored shard (hash-verified) after
 * the same DONTNEED on every rank file. The page-cache residency left after each drop is
 * measured with mincore() and printed, so a drop that did not work is visible. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/format.h"
#include "core/dtype.h"
#include "core/families.h"
#include "core/optim_groups.h"
#include "util/error.h"

/* Paths here are short; vsnprintf keeps -Wformat-truncation out of it. */
static void pathf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

/* CPU seconds (user + system) of every thread of the process so far. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill_random(float *p, int64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (float)((double)(x >> 11) * (1.0 / 9007199254740992.0) - 0.5);
  }
}

/* Drops a file's clean pages from the page cache; returns the fraction still resident. */
static double drop_cache(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  fstat(fd, &st);
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  double frac = 0;
  if (st.st_size > 0) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = ((size_t)st.st_size + pg - 1) / pg, in = 0;
      unsigned char *v = malloc(np);
      if (v && mincore(m, (size_t)st.st_size, v) == 0)
        for (size_t i = 0; i < np; i++) in += v[i] & 1;
      frac = (double)in / (double)np;
      free(v);
      munmap(m, (size_t)st.st_size);
    }
  }
  close(fd);
  return frac;
}

/* Drops every regular file of a directory; returns the largest residency left. */
static double drop_dir(const char *dir) {
  DIR *d = opendir(dir);
  double worst = 0;
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[4200];
    pathf(p, sizeof p, "%s/%s", dir, e->d_name);
    double f = drop_cache(p);
    if (f > worst) worst = f;
  }
  closedir(d);
  return worst;
}

static int raw_write(const char *path, int64_t bytes, const char *block, size_t bs, double *secs) {
  double t0 = now_s();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return mc_error("%s: %s", path, strerror(errno));
  int64_t left = bytes;
  while (left > 0) {
    size_t n = left < (int64_t)bs ? (size_t)left : bs;
    ssize_t w = write(fd, block, n);
    if (w <= 0) {
      close(fd);
      return mc_error("%s: write: %s", path, strerror(errno));
    }
    left -= w;
  }
  if (fsync(fd) != 0) {
    close(fd);
    return mc_error("%s: fsync: %s", path, strerror(errno));
  }
  close(fd);
  *secs = now_s() - t0;
  return 0;
}

static int raw_read(const char *path, char *block, size_t bs, double *secs, int64_t *got) {
  double t0 = now_s();
  int fd = open(path, O_RDONLY);
  if (fd < 0) return mc_error("%s: %s", path, strerror(errno));
  *got = 0;
  for (;;) {
    ssize_t r = read(fd, block, bs);
    if (r < 0) {
      close(fd);
      return mc_error("%s: read: %s", path, strerror(errno));
    }
    if (r == 0) break;
    *got += r;
  }
  close(fd);
  *secs = now_s() - t0;
  return 0;
}

/* Bytes of the regular files of dir (only those named rank_* when ranks_only). */
static int64_t dir_bytes_of(const char *dir, int ranks_only) {
  DIR *d = opendir(dir);
  int64_t n = 0;
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char p[4200];
    struct stat st;
    pathf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (e->d_name[0] != '.' && (!ranks_only || !strncmp(e->d_name, "rank_", 5)) && stat(p, &st) == 0 &&
        S_ISREG(st.st_mode))
      n += st.st_size;
  }
  closedir(d);
  return n;
}

static int64_t dir_bytes(const char *dir) { return dir_bytes_of(dir, 0); }

/* nam-small widths (docs/design.md section 7) with "AEMR" repeated until the three states of
 * every family reach the requested size. */
static int build_model(double gib, int tp, int dp, int zero, mc_config *cfg, mc_geometry *g) {
  if (mc_config_default(cfg) != 0) return -1;
  mc_model *m = &cfg->model;
  m->vocab_size = 32768;
  m->d_model = 1024;
  m->n_heads = 16;
  m->n_kv_heads = 4;
  m->head_dim = 64;
  m->n_experts = 8;
  m->top_k = 2;
  m->expert_hidden = 2048;
  m->mamba_inner = 2048;
  m->mamba_head_dim = 64;
  m->ssm_state = 64;
  m->rec_width = 1024;
  mc_layout l = cfg->parallel;
  l.tp = tp;
  l.dp = dp;
  l.pp = 1;
  l.ep = 1;
  l.sp = 0;
  l.zero = zero;
  l.split = MC_SPLIT_EQUAL;
  cfg->parallel = l;
  for (int groups = 1; groups < MC_MAX_LAYERS / 4; groups++) {
    m->pattern[0] = 0;
    for (int i = 0; i < groups; i++) strcat(m->pattern, "AEMR");
    m->n_layers = (int)strlen(m->pattern);
    if (mc_geometry_of_config(cfg, NULL, g) != 0) return -1; /* cfg's optim.groups: adamw:all, 3 states */
    int64_t numel = 0;
    for (int f = 0; f < g->fams.n; f++) numel += g->fams.f[f].numel;
    if ((double)numel * 12.0 >= gib * 1073741824.0) return 0;
    mc_geometry_free(g);
  }
  return mc_error("requested size too large");
}

/* Opens the checkpoint and reads every stored shard into pre-faulted buffers (a trainer
 * loads into memory it already uses), timing the open and the reads; counts shards whose
 * values differ from the saved items. */
static int load_all(const char *dir, int threads, int verify, const mc_geometry *g, const mc_ckpt_item *items, int n,
                    double *t_open, double *t_read, int64_t *bad) {
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  oo.io_threads = threads;
  oo.verify = verify;
  double t0 = now_s();
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(dir, &oo, &ck) != 0) return -1;
  *t_open = now_s() - t0;
  int ns = mc_ckpt_n_shards(ck), nr = 0;
  mc_ckpt_request *reqs = calloc((size_t)ns, sizeof *reqs);
  for (int k = 0; k < ns; k++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
    if (!mc_elem_is_float(s->dtype)) continue; /* AdamW's int64 step: read below with mc_ckpt_read_i64 */
    const int i = nr++;
    reqs[i].family = s->family;
    reqs[i].state = s->state;
    memcpy(reqs[i].start, s->start, sizeof s->start);
    memcpy(reqs[i].count, s->count, sizeof s->count);
    reqs[i].out = malloc((size_t)s->numel * 4);
    /* non-zero: malloc + memset(0) may become calloc, which leaves the pages unfaulted */
    if (reqs[i].out) memset(reqs[i].out, 0x7f, (size_t)s->numel * 4);
  }
  t0 = now_s();
  int rc = mc_ckpt_read_many(ck, reqs, nr);
  /* the step counters: one int64 per AdamW family (a few hundred bytes in all) */
  int64_t *steps = calloc((size_t)ns + 1, sizeof *steps);
  for (int k = 0; k < ns && rc == 0; k++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
    if (!mc_elem_is_float(s->dtype)) rc = mc_ckpt_read_i64(ck, s->family, s->state, &steps[k]);
  }
  *t_read = now_s() - t0;
  *bad = 0;
  for (int k = 0, i = 0; k < ns; k++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
    const int is_float = mc_elem_is_float(s->dtype);
    const void *got = is_float ? (const void *)reqs[i].out : (const void *)&steps[k];
    for (int j = 0; j < n && rc == 0; j++)
      if (items[j].rank == s->rank && items[j].state == s->state && !strcmp(g->fams.f[items[j].family].name, s->family))
        *bad += memcmp(items[j].data, got, (size_t)s->numel * (is_float ? 4 : 8)) != 0;
    if (is_float) free(reqs[i++].out);
  }
  free(steps);
  free(reqs);
  mc_ckpt_close(ck);
  return rc;
}

static double median(double *v, int n);

/* --compress-from: see the header. */
static int compress_bench(const char *dir, const char *from, int threads, int rounds) {
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  mc_ckpt *ck = NULL;
  mc_config cfg;
  mc_train_state st;
  mc_geometry g;
  if (mc_ckpt_open(from, &oo, &ck) != 0 || mc_ckpt_config(ck, &cfg) != 0 || mc_ckpt_train_state(ck, &st) != 0 ||
      mc_geometry_of_config(&cfg, NULL, &g) != 0)
    return -1;
  int ns = mc_ckpt_n_shards(ck), n = 0;
  mc_ckpt_item *items = calloc((size_t)ns + 1, sizeof *items);
  int64_t raw[MC_N_STATES] = {0};
  int rc = items ? 0 : mc_error("out of memory");
  for (int i = 0; i < ns && rc == 0; i++) {
    const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, i);
    float *b = malloc((size_t)s->numel * 4);
    int f = mc_family_find(&g.fams, s->family);
    if (!b || f < 0) rc = mc_error("shard %s: %s", s->dataset, b ? "unknown family" : "out of memory");
    else rc = mc_ckpt_read(ck, s->family, s->state, s->start, s->count, b);
    if (b) items[n++] = (mc_ckpt_item){f, s->state, s->rank, b};
    if (rc == 0) raw[s->state] += s->numel * 4;
  }
  mc_ckpt_close(ck);
  printf("bench_ckpt --compress-from %s: model %s, world %d, %d shards, step %lld, %d I/O threads, %d rounds\n", from,
         cfg.model.pattern, g.world, ns, (long long)st.step, threads, rounds);
  printf("%-11s %-10s %10s %10s %6s %8s %9s %8s %9s %s\n", "state", "compress", "raw MB", "file MB", "ratio",
         "save s", "save MB/s", "load s", "load MB/s", "bad");
  static const int levels[] = {0, 1, 6};
  for (int s = 0; s < MC_N_STATES && rc == 0; s++)
    for (int li = 0; li < 3 && rc == 0 && raw[s] > 0; li++) { /* the kinds the checkpoint stores */
      mc_ckpt_item *sel = calloc((size_t)n + 1, sizeof *sel);
      int m = 0;
      for (int i = 0; sel && i < n; i++)
        if ((int)items[i].state == s) sel[m++] = items[i];
      double save[20], load[20];
      int64_t stored = 0, bad = 0;
      char sub[4200];
      pathf(sub, sizeof sub, "%s/%s_%d", dir, mc_state_name((mc_state)s), levels[li]);
      for (int r = 0; r < rounds && rc == 0; r++) {
        char cmd[8600];
        pathf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", sub, sub);
        if (system(cmd) != 0) rc = mc_error("cannot prepare %s", sub);
        mc_ckpt_save_opts so;
        mc_ckpt_save_opts_default(&so);
        so.io_threads = threads;
        so.deflate = levels[li];
        double t0 = now_s();
        if (rc == 0) rc = mc_ckpt_save(sub, &g, &cfg, &st, sel, m, &so);
        save[r] = now_s() - t0;
        char step[4300];
        pathf(step, sizeof step, "%s/step_%lld", sub, (long long)st.step);
        stored = dir_bytes_of(step, 1);
        drop_dir(step);
        double t_open = 0, t_read = 0;
        int64_t b = 0;
        if (rc == 0) rc = load_all(sub, threads, 1, &g, sel, m, &t_open, &t_read, &b);
        load[r] = t_open + t_read;
        bad += b;
      }
      if (rc == 0) {
        const double mb = (double)raw[s] / 1e6, ts = median(save, rounds), tl = median(load, rounds);
        printf("%-11s %-10s %10.2f %10.2f %6.3f %8.3f %9.1f %8.3f %9.1f %lld\n", mc_state_name((mc_state)s),
               levels[li] ? (levels[li] == 1 ? "deflate1" : "deflate6") : "none", mb, (double)stored / 1e6,
               (double)raw[s] / (double)(stored > 0 ? stored : 1), ts, mb / ts, tl, mb / tl, (long long)bad);
      }
      free(sel);
    }
  for (int i = 0; i < n; i++) free((void *)items[i].data);
  free(items);
  mc_geometry_free(&g);
  return rc;
}

static void usage(void) {
  fprintf(stderr, "usage: bench_ckpt --dir DIR [--gib G] [--tp N] [--dp N] [--zero 0|1|3] [--threads N] [--rounds R] [--pause S] [--alternate N] [--keep-files]\n"
                  "       bench_ckpt --dir DIR --compress-from CKPT [--threads N] [--rounds R]\n");
}

static int g_keep_files; /* --keep-files: leave the last round's checkpoints for inspection */
static int g_pause;      /* --pause S: idle seconds before each measurement, so the VM's disk
                          * settles after the previous one's writes */

static void settle(void) {
  if (g_pause > 0) sleep((unsigned)g_pause);
}

typedef struct {
  double raw_w, raw_r, save, load, load_unverified, async_bg, stall_first, stall_next;
} round_result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Timed raw write of `bytes` to `raw`; GB/s in *gbs. */
static int raw_write_speed(const char *raw, int64_t bytes, char *block, size_t bs, double *gbs, double *secs) {
  if (raw_write(raw, bytes, block, bs, secs) != 0) return -1;
  *gbs = (double)bytes / *secs / 1e9;
  return 0;
}

/* One round. The disk of a shared VM drifts, so every checkpoint figure is taken between
 * two raw measurements of the same kind and compared with their mean:
 *   raw write (raw1.bin), sync save (step 1), two async saves (steps 2, 3), raw write (raw2.bin)
 *   raw read (raw1.bin), verified load (step 1), unverified load (step 3), raw read (raw2.bin)
 * The page cache is dropped before each read, and each read reads data written in this
 * round and not read before: the VM host's own cache, which a guest cannot drop, then
 * favours no read over another. Files are removed at the end of the round. */
static int run_round(int round, const char *dir, const mc_geometry *g, const mc_config *cfg, mc_ckpt_item *items, int n,
                     int64_t stored, int threads, char *block, size_t bs, round_result *res) {
  const double GB = 1e9;
  char raw1[4200], raw2[4200], step_dir[4200], step3[4200], cmd[9000];
  pathf(raw1, sizeof raw1, "%s/raw1.bin", dir);
  pathf(raw2, sizeof raw2, "%s/raw2.bin", dir);
  printf("round %d\n", round);
  double w1, w2, tw1, tw2;
  settle();
  double c0 = cpu_s();
  if (raw_write_speed(raw1, stored, block, bs, &w1, &tw1) != 0) return -1;
  printf("  raw write (64 MiB write() + fsync)             : %7.3f s  %6.3f GB/s  (%.2f CPU s)\n", tw1, w1, cpu_s() - c0);

  mc_ckpt_save_opts so;
  mc_ckpt_save_opts_default(&so);
  so.io_threads = threads;
  mc_train_state st;
  memset(&st, 0, sizeof st);
  st.step = 10 * round + 1;
  settle();
  double t0 = now_s();
  c0 = cpu_s();
  if (mc_ckpt_save(dir, g, cfg, &st, items, n, &so) != 0) return mc_error_context("save");
  double ts = now_s() - t0, cpu_save = cpu_s() - c0;
  pathf(step_dir, sizeof step_dir, "%s/step_%d", dir, 10 * round + 1);
  int64_t on_disk = dir_bytes(step_dir);

  mc_ckpt_saver *sv = NULL;
  if (mc_ckpt_saver_create(dir, &so, &sv) != 0) return -1;
  st.step = 10 * round + 2;
  settle();
  if (mc_ckpt_saver_save(sv, g, cfg, &st, items, n) != 0) return mc_error_context("async save");
  res->stall_first = mc_ckpt_saver_last_stall(sv);
  if (mc_ckpt_saver_wait(sv) != 0) return mc_error_context("async save");
  /* second async save: the host buffer is reused, as in a training run */
  st.step = 10 * round + 3;
  settle();
  if (mc_ckpt_saver_save(sv, g, cfg, &st, items, n) != 0) return mc_error_context("async save");
  t0 = now_s();
  res->stall_next = mc_ckpt_saver_last_stall(sv);
  if (mc_ckpt_saver_close(sv) != 0) return mc_error_context("async save");
  double tb = now_s() - t0 + res->stall_next;

  settle();
  if (raw_write_speed(raw2, stored, block, bs, &w2, &tw2) != 0) return -1;
  res->raw_w = 0.5 * (w1 + w2);
  res->save = (double)stored / ts / GB;
  res->async_bg = tb;
  printf("  checkpoint save (sync)                         : %7.3f s  %6.3f GB/s  (%.2f CPU s)  %4.0f%% of raw write mean "
         "(%.3f GB on disk)\n",
         ts, res->save, cpu_save, 100 * res->save / res->raw_w, (double)on_disk / GB);
  printf("  async save: caller blocked %.3f s (first: host buffer allocated) / %.3f s (next: reused); "
         "call to durable commit %.3f s = %.3f GB/s\n",
         res->stall_first, res->stall_next, tb, (double)stored / tb / GB);
  printf("  raw write again                                : %7.3f s  %6.3f GB/s\n", tw2, w2);

  /* reads, from the first checkpoint of the round */
  double tr1, tr2;
  int64_t got = 0;
  settle();
  double left = drop_cache(raw1);
  c0 = cpu_s();
  if (raw_read(raw1, block, bs, &tr1, &got) != 0) return -1;
  double r1 = (double)got / tr1 / GB;
  printf("  raw read  (64 MiB read(); %3.0f%% left in cache) : %7.3f s  %6.3f GB/s  (%.2f CPU s)\n", 100 * left, tr1, r1,
         cpu_s() - c0);
  settle();
  double t_open = 0, tl = 0, tu = 0, res_ck = drop_dir(step_dir);
  int64_t bad = 0;
  c0 = cpu_s(); /* includes pre-faulting the output buffers (outside the timing) */
  if (load_all(step_dir, threads, 1, g, items, n, &t_open, &tl, &bad) != 0) return mc_error_context("load");
  double cpu_lv = cpu_s() - c0;
  if (bad) return mc_error("%" PRId64 " shards loaded differently from what was saved", bad);
  double tlv = t_open + tl;
  pathf(step3, sizeof step3, "%s/step_%d", dir, 10 * round + 3);
  settle();
  double res_ck2 = drop_dir(step3);
  c0 = cpu_s();
  if (load_all(step3, threads, 0, g, items, n, &t_open, &tu, &bad) != 0) return mc_error_context("unverified load");
  double cpu_lu = cpu_s() - c0;
  double tlu = t_open + tu;
  settle();
  left = drop_cache(raw2);
  if (raw_read(raw2, block, bs, &tr2, &got) != 0) return -1;
  double r2 = (double)got / tr2 / GB;
  unlink(raw1);
  unlink(raw2);
  res->raw_r = 0.5 * (r1 + r2);
  res->load = (double)stored / tlv / GB;
  res->load_unverified = (double)stored / tlu / GB;
  printf("  checkpoint load (verified; %3.0f%% left in cache): %7.3f s  %6.3f GB/s  (%.2f CPU s*)  %4.0f%% of raw read mean\n",
         100 * res_ck, tlv, res->load, cpu_lv, 100 * res->load / res->raw_r);
  printf("  checkpoint load (unverified; %3.0f%% left in cache): %5.3f s  %6.3f GB/s  (%.2f CPU s*)  %4.0f%% of raw read mean\n",
         100 * res_ck2, tlu, res->load_unverified, cpu_lu, 100 * res->load_unverified / res->raw_r);
  printf("  raw read again                                 : %7.3f s  %6.3f GB/s\n", tr2, r2);
  for (int k = 1; k <= 3 && !g_keep_files; k++) {
    pathf(step_dir, sizeof step_dir, "%s/step_%d", dir, 10 * round + k);
    pathf(cmd, sizeof cmd, "rm -rf '%s'", step_dir);
    if (system(cmd) != 0) return mc_error("cannot remove %s", step_dir);
  }
  return 0;
}

/* --alternate N: N times, each from the same state (the previous output deleted, then a
 * pause): raw write, sync save, async save (call to durable commit). Isolates the write path
 * from the drift the rounds suffer from (a write right after another big one is slower). */
static int alternate_writes(int reps, const char *dir, const mc_geometry *g, const mc_config *cfg, mc_ckpt_item *items,
                            int n, int64_t stored, int threads, char *block, size_t bs) {
  double rw[20], sw[20], aw[20];
  char raw[4200], cmd[9000];
  pathf(raw, sizeof raw, "%s/raw1.bin", dir);
  mc_ckpt_save_opts so;
  mc_ckpt_save_opts_default(&so);
  so.io_threads = threads;
  mc_ckpt_saver *sv = NULL;
  if (mc_ckpt_saver_create(dir, &so, &sv) != 0) return -1;
  mc_train_state st;
  memset(&st, 0, sizeof st);
  for (int i = 0; i < reps; i++) {
    double t, c0;
    settle();
    c0 = cpu_s();
    if (raw_write_speed(raw, stored, block, bs, &rw[i], &t) != 0) return -1;
    double c_raw = cpu_s() - c0;
    unlink(raw);
    settle();
    st.step = 1000 + 2 * i;
    c0 = cpu_s();
    double t0 = now_s();
    if (mc_ckpt_save(dir, g, cfg, &st, items, n, &so) != 0) return mc_error_context("save");
    sw[i] = (double)stored / (now_s() - t0) / 1e9;
    double c_save = cpu_s() - c0;
    pathf(cmd, sizeof cmd, "rm -rf '%s'/step_* '%s/latest'", dir, dir);
    if (system(cmd) != 0) return mc_error("cannot clean %s", dir);
    settle();
    st.step = 1001 + 2 * i;
    t0 = now_s();
    if (mc_ckpt_saver_save(sv, g, cfg, &st, items, n) != 0 || mc_ckpt_saver_wait(sv) != 0)
      return mc_error_context("async save");
    aw[i] = (double)stored / (now_s() - t0) / 1e9;
    printf("  pair %d: raw write %.3f GB/s (%.2f CPU s), sync save %.3f GB/s (%.2f CPU s) = %.0f%%, async save (incl. "
           "copy) %.3f GB/s = %.0f%%, stall %.3f s\n",
           i, rw[i], c_raw, sw[i], c_save, 100 * sw[i] / rw[i], aw[i], 100 * aw[i] / rw[i], mc_ckpt_saver_last_stall(sv));
    fflush(stdout);
    pathf(cmd, sizeof cmd, "rm -rf '%s'/step_* '%s/latest'", dir, dir);
    if (system(cmd) != 0) return mc_error("cannot clean %s", dir);
  }
  mc_ckpt_saver_close(sv);
  double rs[20], ra[20];
  for (int i = 0; i < reps; i++) {
    rs[i] = sw[i] / rw[i];
    ra[i] = aw[i] / rw[i];
  }
  printf("median of %d alternations: raw write %.3f GB/s, sync save %.3f GB/s (%.0f%% of raw, median of ratios), async "
         "save %.3f GB/s (%.0f%%)\n",
         reps, median(rw, reps), median(sw, reps), 100 * median(rs, reps), median(aw, reps), 100 * median(ra, reps));
  return 0;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *from = NULL;
  double gib = 2.0;
  int tp = 2, dp = 2, zero = 1, threads = 2, rounds = 3, alternate = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--gib") && i + 1 < argc) gib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dp") && i + 1 < argc) dp = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--zero") && i + 1 < argc) zero = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--keep-files")) g_keep_files = 1;
    else if (!strcmp(argv[i], "--pause") && i + 1 < argc) g_pause = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--alternate") && i + 1 < argc) alternate = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--compress-from") && i + 1 < argc) from = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  if (!dir || gib <= 0 || rounds < 1 || rounds > 20 || alternate < 0 || alternate > 20) {
    usage();
    return 2;
  }
  if (from) {
    if (compress_bench(dir, from, threads, rounds) == 0) return 0;
    fprintf(stderr, "bench_ckpt: %s\n", mc_errmsg());
    return 1;
  }
  mc_config cfg;
  mc_geometry g;
  if (build_model(gib, tp, dp, zero, &cfg, &g) != 0) {
    fprintf(stderr, "bench_ckpt: %s\n", mc_errmsg());
    return 1;
  }
  char cmd[4200];
  pathf(cmd, sizeof cmd, "mkdir -p '%s' && rm -rf '%s'/step_* '%s/latest'", dir, dir, dir);
  if (system(cmd) != 0) return 1;

  /* the state: the primary shard of every rank (replicas are never written, so they would
   * only cost memory here) */
  int cap = g.fams.n * MC_N_STATES * g.world, n = 0;
  mc_ckpt_item *items = calloc((size_t)cap, sizeof *items);
  int64_t stored = 0;
  for (int r = 0; r < g.world; r++)
    for (int f = 0; f < g.fams.n; f++)
      for (int s = 0; s < MC_N_STATES; s++) {
        mc_shard sh;
        if (!mc_family_has_state(&g.fams.f[f], (mc_state)s)) continue; /* only the optimizer's kinds */
        mc_shard_of(&g, f, (mc_state)s, r, &sh);
        if (!sh.primary) continue;
        /* fp32 states; AdamW's step an int64 (8 bytes: its random bits are as good a count) */
        const int64_t esz = mc_elem_dtype_size(mc_opt_state_dtype(g.fams.f[f].opt, (mc_state)s));
        float *b = malloc((size_t)(sh.numel * esz));
        if (!b) {
          fprintf(stderr, "bench_ckpt: out of memory\n");
          return 1;
        }
        fill_random(b, sh.numel * esz / 4, (uint64_t)(n + 1));
        items[n++] = (mc_ckpt_item){f, (mc_state)s, r, b};
        stored += sh.numel * esz;
      }
  printf("bench_ckpt: model %s (nam-small widths), layout tp=%d dp=%d zero=%d (world %d, one process writes all "
         "ranks), %d shards, %.3f GB = %.3f GiB of fp32 state (param, exp_avg, exp_avg_sq), %d I/O threads, %d rounds\n",
         cfg.model.pattern, tp, dp, zero, g.world, n, (double)stored / 1e9, (double)stored / 1073741824.0, threads, rounds);
  printf("directory: %s\n", dir);
  printf("CPU s = user + system seconds of all threads; * includes pre-faulting the load's output buffers\n");

  size_t bs = (size_t)64 << 20;
  char *block = malloc(bs);
  fill_random((float *)block, (int64_t)(bs / 4), 99);
  double th0 = now_s();
  int64_t hashed = 0;
  char hex[65];
  for (int i = 0; i < n && hashed < ((int64_t)1 << 30); i++) {
    mc_shard sh;
    mc_shard_of(&g, items[i].family, items[i].state, items[i].rank, &sh);
    mc_sha256_hex(items[i].data, (size_t)sh.numel * 4, hex);
    hashed += sh.numel * 4;
  }
  printf("sha256 (OpenSSL EVP, one thread): %.3f GB/s\n", (double)hashed / (now_s() - th0) / 1e9);

  if (alternate > 0) {
    int rc = alternate_writes(alternate, dir, &g, &cfg, items, n, stored, threads, block, bs);
    if (rc != 0) fprintf(stderr, "bench_ckpt: %s\n", mc_errmsg());
    return rc ? 1 : 0;
  }
  round_result *res = calloc((size_t)rounds, sizeof *res);
  for (int r = 0; r < rounds; r++) {
    if (run_round(r, dir, &g, &cfg, items, n, stored, threads, block, bs, &res[r]) != 0) {
      fprintf(stderr, "bench_ckpt: round %d: %s\n", r, mc_errmsg());
      return 1;
    }
    fflush(stdout);
  }
  double v[6][20];
  for (int r = 0; r < rounds; r++) {
    v[0][r] = res[r].save / res[r].raw_w;
    v[1][r] = res[r].load / res[r].raw_r;
    v[2][r] = res[r].load_unverified / res[r].raw_r;
    v[3][r] = res[r].stall_next;
    v[4][r] = res[r].async_bg;
    v[5][r] = ((double)stored / res[r].async_bg / 1e9) / res[r].raw_w;
  }
  printf("median over %d rounds: save %.0f%% of raw write, async save (call to commit) %.0f%% of raw write, verified load "
         "%.0f%% of raw read, unverified load %.0f%% of raw read, async stall %.3f s (save in the background %.3f s)\n",
         rounds, 100 * median(v[0], rounds), 100 * median(v[5], rounds), 100 * median(v[1], rounds),
         100 * median(v[2], rounds), median(v[3], rounds), median(v[4], rounds));
  for (int i = 0; i < n; i++) free((void *)items[i].data);
  free(items);
  free(res);
  free(block);
  mc_geometry_free(&g);
  return 0;
}
