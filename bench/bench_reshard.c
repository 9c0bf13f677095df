/* bench_reshard: reshard throughput on a checkpoint of at least --gib GiB against the raw
 * disk speed measured in the same run and directory.
 *
 *   bench_reshard [--dir D] [--gib 2] [--chunk-mb 16] [--threads N] [--rounds 3] [--keep]
 *   bench_reshard --synth DST [--gib X | --tiny] [--groups G]   (only writes a synthetic
 *       checkpoint; the --tiny one is the embedded default configuration's model and layout,
 *       for tests)
 *
 * --groups G sets optim.groups (default adamw:all): each family stores param and its
 * optimizer's states (AdamW's exp_avg and exp_avg_sq, Muon's momentum).
 *
 * Method: a synthetic checkpoint of a nam-small-like model widened until its states (three
 * per family under AdamW) reach the size is written in layout A (tp2 pp2 dp2 ep2 sp zero1). Raw write: the same
 * number of bytes written in 16 MiB blocks to one file, then fsync. Raw read: that file read
 * back after its pages are dropped from the page cache (posix_fadvise DONTNEED). Reshard:
 * A -> B (tp1 pp4 dp2 ep1 zero3, a different stage split) with A's pages dropped first,
 * including the commit (fsync of every file). Reshard GB/s = checkpoint bytes / wall time
 * (every byte is read once and written once); the target is >= 70% of min(raw read, raw
 * write). A shared disk's speed drifts, so raw measurement and reshard alternate for
 * --rounds rounds and medians are compared. Prints each round, then one JSON line. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/families.h"
#include "core/optim_groups.h"
#include "reshard/reshard.h"
#include "reshard/synth.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define MAX_ROUNDS 9

static double median(const double *v, int n) {
  double s[MAX_ROUNDS];
  for (int i = 0; i < n; i++) s[i] = v[i];
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
      double t = s[j];
      s[j] = s[j - 1];
      s[j - 1] = t;
    }
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The checkpoint's bytes: every family's fp32 states, as many as its optimizer keeps. */
static int64_t model_bytes(const mc_model *m, const char *groups) {
  mc_family_set fs;
  if (mc_families_build(m, 0, &fs) != 0) return -1;
  if (mc_optim_groups_assign(groups, &fs) != 0) {
    mc_families_free(&fs);
    return -1;
  }
  int64_t n = 0;
  for (int i = 0; i < fs.n; i++)
    for (int st = 0; st < MC_N_STATES; st++) n += mc_family_has_state(&fs.f[i], (mc_state)st) ? fs.f[i].numel * 4 : 0;
  mc_families_free(&fs);
  return n;
}

/* nam-small's shape (docs/design.md section 7), widened until the checkpoint reaches `bytes`. */
static int make_config(double gib, const char *groups, mc_config *cfg) {
  if (mc_config_default(cfg) != 0) return -1;
  snprintf(cfg->train.optim.groups, sizeof cfg->train.optim.groups, "%s", groups);
  mc_model *m = &cfg->model;
  snprintf(m->pattern, sizeof m->pattern, "AEMEAEMEAEMR");
  m->n_layers = 12;
  m->vocab_size = 32768;
  m->vocab_pad = 128;
  m->n_heads = 16;
  m->n_kv_heads = 4;
  m->n_experts = 8;
  m->top_k = 2;
  m->mamba_head_dim = 64;
  m->ssm_state = 64;
  m->conv_width = 4;
  int64_t want = (int64_t)(gib * 1024 * 1024 * 1024);
  for (int d = 128;; d += 64) {
    m->d_model = d;
    m->head_dim = d / 16;
    m->expert_hidden = 2 * d;
    m->mamba_inner = 2 * d;
    m->rec_width = d;
    const int64_t have = model_bytes(m, groups);
    if (have < 0) return -1;
    if (have >= want) break;
  }
  cfg->parallel.tp = 2, cfg->parallel.pp = 2, cfg->parallel.dp = 2, cfg->parallel.ep = 2;
  cfg->parallel.sp = 1, cfg->parallel.zero = 1, cfg->parallel.split = MC_SPLIT_EQUAL;
  return 0;
}

/* Drops the cached pages of every file under dir (they are clean after the fsyncs). */
static void drop_cache(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(p, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      drop_cache(p);
      continue;
    }
    int fd = open(p, O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  closedir(d);
}

static int raw_disk(const char *path, int64_t bytes, double *wgbs, double *rgbs) {
  const size_t blk = 16u << 20;
  char *buf = malloc(blk);
  if (!buf) return -1;
  for (size_t i = 0; i < blk; i++) buf[i] = (char)(i * 131 + 7);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return free(buf), -1;
  double t0 = now_s();
  for (int64_t done = 0; done < bytes;) {
    size_t n = (size_t)(bytes - done < (int64_t)blk ? bytes - done : (int64_t)blk);
    ssize_t w = write(fd, buf, n);
    if (w <= 0) return free(buf), close(fd), -1;
    done += w;
  }
  fsync(fd);
  *wgbs = (double)bytes / (now_s() - t0) / 1e9;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  fd = open(path, O_RDONLY);
  t0 = now_s();
  int64_t got = 0;
  for (;;) {
    ssize_t r = read(fd, buf, blk);
    if (r <= 0) break;
    got += r;
  }
  *rgbs = (double)got / (now_s() - t0) / 1e9;
  close(fd);
  unlink(path);
  free(buf);
  return got == bytes ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *dir = "bench-reshard-tmp", *synth = NULL, *groups = "adamw:all";
  double gib = 2.0;
  int keep = 0, tiny = 0, rounds = 3;
  mc_rs_opts o = {.chunk_bytes = 16 << 20, .threads = 0};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--gib") && i + 1 < argc) gib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--chunk-mb") && i + 1 < argc) o.chunk_bytes = (int64_t)atoi(argv[++i]) << 20;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--synth") && i + 1 < argc) synth = argv[++i];
    else if (!strcmp(argv[i], "--keep")) keep = 1;
    else if (!strcmp(argv[i], "--tiny")) tiny = 1;
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--groups") && i + 1 < argc) groups = argv[++i];
    else {
      fprintf(stderr, "usage: bench_reshard [--dir D] [--gib X] [--chunk-mb N] [--threads N] [--rounds N] [--keep] [--groups G] | "
                      "--synth DST [--gib X | --tiny] [--groups G]\n");
      return 2;
    }
  }
  if (rounds < 1 || rounds > MAX_ROUNDS) {
    fprintf(stderr, "bench_reshard: --rounds must be 1..%d\n", MAX_ROUNDS);
    return 2;
  }
  mc_config cfg;
  if (strlen(groups) >= sizeof cfg.train.optim.groups || mc_optim_groups_check(groups) != 0) {
    fprintf(stderr, "bench_reshard: --groups '%.40s': %s\n", groups,
            strlen(groups) >= sizeof cfg.train.optim.groups ? "too long" : mc_errmsg());
    return 2;
  }
  if ((tiny ? mc_config_default(&cfg) : make_config(gib, groups, &cfg)) != 0) {
    fprintf(stderr, "bench_reshard: %s\n", mc_errmsg());
    return 1;
  }
  if (tiny) snprintf(cfg.train.optim.groups, sizeof cfg.train.optim.groups, "%s", groups);
  if (synth) {
    if (mc_rs_synthesize(&cfg, 10, synth, &o, NULL) != 0) {
      fprintf(stderr, "bench_reshard: %s\n", mc_errmsg());
      return 1;
    }
    return 0;
  }
  char a[4096], b[4096], raw[4096];
  mkdir(dir, 0755);
  snprintf(a, sizeof a, "%s/A", dir);
  snprintf(b, sizeof b, "%s/B", dir);
  snprintf(raw, sizeof raw, "%s/raw.bin", dir);
  mc_rs_summary s0, s1;
  o.force = 1;
  if (mc_rs_synthesize(&cfg, 10, a, &o, &s0) != 0) {
    fprintf(stderr, "bench_reshard: %s\n", mc_errmsg());
    return 1;
  }
  int64_t bytes = s0.bytes_written;
  printf("checkpoint: d_model %d, %.3f GiB in %d shards (layout A written in %.2f s)\n", cfg.model.d_model,
         (double)bytes / (1 << 30), s0.n_dst_shards, s0.seconds);
  /* The disk is shared and its speed drifts: raw write/read and the reshard alternate for
   * `rounds` rounds and medians are compared, each round's figures printed. */
  double wg[MAX_ROUNDS], rg[MAX_ROUNDS], rs[MAX_ROUNDS];
  long rss = 0;
  for (int k = 0; k < rounds; k++) {
    if (raw_disk(raw, bytes, &wg[k], &rg[k]) != 0) {
      fprintf(stderr, "bench_reshard: raw disk measurement failed in %s\n", dir);
      return 1;
    }
    drop_cache(a);
    mc_rs_source *src;
    mc_geometry g;
    mc_rs_plan p;
    mc_layout t = cfg.parallel;
    t.tp = 1, t.pp = 4, t.dp = 2, t.ep = 1, t.sp = 0, t.zero = 3;
    if (mc_rs_source_open(a, &src) != 0 || mc_rs_prepare(src, &t, &g, &p) != 0 ||
        mc_rs_write(src, &g, &p, b, &o, &s1) != 0) {
      fprintf(stderr, "bench_reshard: %s\n", mc_errmsg());
      return 1;
    }
    rs[k] = (double)s1.bytes_written / s1.seconds / 1e9;
    rss = s1.peak_rss_kb;
    printf("round %d: raw write %.3f GB/s (fsync included), raw read %.3f GB/s (page cache dropped), ", k, wg[k], rg[k]);
    mc_rs_summary_print(&s1, "reshard");
    mc_rs_plan_free(&p);
    mc_geometry_free(&g);
    mc_rs_source_close(src);
  }
  double mw = median(wg, rounds), mr = median(rg, rounds), ms = median(rs, rounds), floor = mw < mr ? mw : mr;
  printf("{\"bench\": \"reshard\", \"checkpoint_bytes\": %lld, \"rounds\": %d, \"raw_write_gbs_median\": %.3f, "
         "\"raw_read_gbs_median\": %.3f, \"reshard_gbs_median\": %.3f, \"ratio_to_min_raw\": %.3f, \"target\": 0.70, "
         "\"peak_rss_mib\": %.1f, \"chunk_mib\": %lld, \"threads\": %d}\n",
         (long long)bytes, rounds, mw, mr, ms, ms / floor, (double)rss / 1024.0, (long long)(o.chunk_bytes >> 20), o.threads > 0 ? o.threads : mc_rs_default_threads());
  if (!keep) {
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", a, b);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s and %s\n", a, b);
    rmdir(dir);
  }
  return 0;
}
