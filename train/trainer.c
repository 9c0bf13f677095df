#define _POSIX_C_SOURCE 200809L /* clock_gettime, mkdir */

#include "train/trainer.h"

#include "core/optim_groups.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cost.h"
#include "train/device.h"
#include "train/dist.h"
#include "train/memreport.h"
#include "train/metrics.h"
#include "train/pipeline.h"
#include "train/optim.h"
#include "train/tfevents.h"
#include "util/dirlock.h"
#include "util/checked.h"
#include "util/clock.h"
#include "util/error.h"

/* v[0], v[1] := their largest values over the world's ranks (a stop signal number, 0 = none;
 * 1 if an asynchronous checkpoint failed on the rank). */
static int agree_max(mc_comm *world, int32_t v[2]) {
  int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)world->size);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)world->size);
  int rc = !all || !counts ? mc_error("out of memory") : 0;
  for (int i = 0; !rc && i < world->size; i++) counts[i] = 2;
  if (!rc) rc = mc_allgather(world, v, all, counts, MC_DT_I32);
  for (int i = 0; !rc && i < world->size; i++)
    for (int k = 0; k < 2; k++) v[k] = all[2 * i + k] > v[k] ? all[2 * i + k] : v[k];
  free(all), free(counts);
  return rc;
}

static int mkdir_p(const char *dir) {
  char p[MC_PATH_MAX];
  snprintf(p, sizeof p, "%s", dir);
  for (char *c = p + 1;; c++) {
    if (*c == '/' || *c == 0) {
      char saved = *c;
      *c = 0;
      if (mkdir(p, 0777) != 0 && errno != EEXIST) return mc_error("cannot create directory %s", p);
      *c = saved;
      if (!saved) break;
    }
  }
  return 0;
}

/* Sums the cross-entropy of sequences [part*n/parts, (part+1)*n/parts) of mc_eval_loss's
 * n evaluation sequences (a data-parallel rank's share of them). */
static int eval_part(mc_net *net, const mc_data *d, int split_all, int64_t n, int micro_batch, int part, int parts,
                     double *ce_out, int64_t *nt_out) {
  int64_t avail = split_all ? d->n_windows : d->n_val;
  if (avail < 1) return mc_error("dataset %s: there is no validation split (data.val_fraction=0)", d->path);
  if (n <= 0 || n > avail) n = avail;
  if (micro_batch < 1) return mc_error("evaluation needs micro_batch >= 1 (got %d)", micro_batch);
  int32_t *buf = malloc(sizeof(int32_t) * (size_t)micro_batch * (size_t)(d->seq_len + 1));
  if (!buf) return mc_error("evaluation: out of memory");
  double ce = 0;
  int64_t nt = 0;
  int rc = 0;
  const int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
  for (int64_t first = lo; first < hi && rc == 0; first += micro_batch) {
    int cnt = (int)(hi - first < micro_batch ? hi - first : micro_batch);
    /* Sequence k is window floor(k * avail / n) of the split: spread over the whole split,
     * not its first part (the head of a corpus is rarely like the rest). */
    for (int i = 0; i < cnt && rc == 0; i++) {
      int64_t k = (first + i) * avail / n;
      int32_t *row = buf + (int64_t)i * (d->seq_len + 1);
      rc = split_all ? mc_data_read_window(d, k, row) : mc_data_read_val(d, k, 1, row);
    }
    mc_net_stats st;
    memset(&st, 0, sizeof st);
    if (rc == 0) rc = mc_net_forward(net, buf, cnt, &st);
    ce += st.ce_sum;
    nt += st.n_tokens;
  }
  free(buf);
  if (rc != 0) return -1;
  *ce_out = ce;
  *nt_out = nt;
  return 0;
}

int mc_eval_loss(mc_net *net, const mc_data *d, int split_all, int64_t n, int micro_batch,
                 double *loss, int64_t *tokens) {
  double ce = 0;
  int64_t nt = 0;
  if (eval_part(net, d, split_all, n, micro_batch, 0, 1, &ce, &nt) != 0) return -1;
  *loss = nt > 0 ? ce / (double)nt : NAN;
  if (tokens) *tokens = nt;
  return 0;
}

int mc_net_load(mc_net *net, const mc_geometry *geo, mc_ckpt *ck) {
  mc_backend *be = mc_net_backend(net);
  for (int i = 0; i < mc_net_n_params(net); i++) {
    mc_net_param *p = mc_net_param_at(net, i);
    const char *name = geo->fams.f[p->fam].name;
    if (!p->w && !p->w16)
      return mc_error("loading %s: the network keeps ZeRO-3 shards (load them with mc_dist_load)", name);
    /* Device backends and bf16 working weights read through a host copy. */
    float *host = mc_backend_is_host(be) && p->w ? p->w : malloc((size_t)(p->numel + 1) * sizeof(float));
    if (!host) return mc_error("loading %s: out of host memory", name);
    int rc = mc_ckpt_read(ck, name, MC_STATE_PARAM, p->shard.local_start, p->shard.local_count, host);
    if (rc == 0 && host != p->w) rc = mc_net_load_param(net, i, host);
    if (host != p->w) free(host);
    if (rc != 0) return mc_error_context("loading %s from %s", name, mc_ckpt_step_dir(ck));
  }
  return 0;
}

/* ---------------------------------------------------------------- one run */

/* One rank's run. Every rank of the layout executes the same sequence of steps; rank 0
 * alone writes metrics and progress, and commits checkpoints (docs/parallel.md). */
typedef struct {
  const mc_config *cfg;
  mc_trainer_opts *opts;
  mc_geometry geo;
  int have_geo;
  mc_comm_groups groups;
  const mc_comm_groups *comm; /* &groups under mpirun with more than one rank, else NULL */
  int rank, dp_rank;
  mc_data data;
  mc_net *net;
  mc_dist_opt opt;
  int have_opt;
  int32_t *tokens;
  mc_ckpt_saver *saver;
  mc_ckpt_fs_barrier *fsb; /* async saves under mpirun: the ranks meet through the file system */
  mc_metrics metrics;
  mc_tfevents events; /* rank 0: TensorBoard scalars in <checkpoint.dir>/tensorboard */
  char metrics_path[MC_PATH_MAX + 32];
  int64_t start_step, end_step;
  int64_t last_saved;
  int64_t queued_step[2]; /* the last two async saves queued, and how long each paused training */
  double queued_pause[2];
  int lock_fd; /* rank 0: the run directory's job lock (util/dirlock.h), -1 if not held */
} run;

/* The checkpoint can continue this run: same model, the states of every family's optimizer
 * present (but AdamW's step, which a checkpoint of format < 4 lacks: training_state.adam_step
 * stands in, train/dist_opt.c), same seed and batch. */
static int resumable(const mc_config *cfg, const mc_geometry *geo, mc_ckpt *ck, mc_train_state *st) {
  if (mc_ckpt_check_model(ck, &cfg->model) != 0)
    return mc_error_context("checkpoint %s is from a different model", mc_ckpt_step_dir(ck));
  for (int f = 0; f < geo->fams.n; f++)
    for (int k = 0; k < MC_N_STATES; k++)
      if (mc_family_has_state(&geo->fams.f[f], (mc_state)k) && !mc_ckpt_has_state(ck, (mc_state)k) &&
          !(k == MC_STATE_STEP && mc_ckpt_format_version(ck) < 4))
        return mc_error("checkpoint %s holds no %s state, which the %s optimizer of %s keeps; it cannot be resumed",
                        mc_ckpt_step_dir(ck), mc_state_name((mc_state)k), mc_opt_name(geo->fams.f[f].opt),
                        geo->fams.f[f].name);
  if (mc_ckpt_train_state(ck, st) != 0) return -1;
  if (st->seed != cfg->train.seed)
    return mc_error("checkpoint %s was trained with train.seed=%llu but the config says %llu; the data "
                    "order would change (pass the same seed)", mc_ckpt_step_dir(ck),
                    (unsigned long long)st->seed, (unsigned long long)cfg->train.seed);
  int64_t pos, tok;
  if (mc_mul_i64(st->step, cfg->train.global_batch, &pos) || mc_mul_i64(pos, cfg->model.seq_len, &tok) ||
      tok >= ((int64_t)1 << 53))
    return mc_error("checkpoint %s: training_state.step=%lld x train.global_batch=%d x model.seq_len=%d tokens reach "
                    "2^53 (the largest count a checkpoint records)", mc_ckpt_step_dir(ck), (long long)st->step,
                    cfg->train.global_batch, cfg->model.seq_len);
  if (st->data_position != pos)
    return mc_error("checkpoint %s consumed %lld samples in %lld steps, which is not train.global_batch=%d "
                    "per step (pass the run's global batch)", mc_ckpt_step_dir(ck), (long long)st->data_position,
                    (long long)st->step, cfg->train.global_batch);
  return 0;
}

/* checkpoint.io_threads, with 0 resolved: the host's online cores divided among the job's
 * ranks on it, 2 to 16. With one rank on a host, the trainer's async saves wrote at 0.72-0.94
 * GB/s on 2 threads and 1.67-1.96 on 16 (16 cores), 1.23-1.68 on 8 (32 cores), against a
 * 1.34-1.35 GB/s raw direct write, the steps beside them within 1.4-5.9% of steady throughout
 * (docs/checkpoint.md, Threads). */
static int ckpt_io_threads(const mc_config *cfg) {
  if (cfg->checkpoint.io_threads > 0) return cfg->checkpoint.io_threads;
  /* ranks on this host: torchrun and mctrain --nproc-per-node, mpirun, srun ("4(x2)": the
   * first node's count) */
  const char *names[3] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE"};
  long local = 1;
  for (int i = 0; i < 3 && local == 1; i++) {
    const char *v = getenv(names[i]);
    const long n = v ? strtol(v, NULL, 10) : 0;
    if (n > 1) local = n;
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN), n = cores > 0 ? cores / local : 2;
  return n < 2 ? 2 : n > 16 ? 16 : (int)n;
}

static int resume_from(run *r, const char *path) {
  const mc_config *cfg = r->cfg;
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  oo.verify = cfg->checkpoint.verify;
  oo.io_threads = ckpt_io_threads(cfg);
  mc_ckpt *ck = NULL;
  mc_train_state st;
  const double t0 = mc_now_s();
  int rc = mc_ckpt_open(path, &oo, &ck) != 0 ? mc_error_context("cannot resume from %s", path) : resumable(cfg, &r->geo, ck, &st);
  /* The ranks load together (train/load_shared.h): all go on, or all stop with one reason. */
  if (r->comm && mc_load_agree(r->comm->world, rc == 0) != 0) rc = -1;
  /* A device's states are read into the pinned staging (allocated here, timed apart: pinning
   * gigabytes takes a while) and uploaded (in a one-rank job each as soon as it is read). */
  const double t_stage = mc_now_s();
  if (rc == 0 && mc_dist_stage_alloc(&r->opt) != 0) rc = -1;
  const double stage_s = mc_now_s() - t_stage;
  /* This rank's hyperslabs of its optimizer states, whatever layout wrote them. */
  mc_load_stats ls;
  if (rc == 0 && mc_dist_load(&r->opt, ck, NULL, &ls) != 0) rc = -1;
  /* the load ends when the states are in device memory */
  mc_backend *be = mc_net_backend(r->net);
  if (rc == 0 && be->sync(be) != 0) rc = mc_error_context("uploading the loaded state of %s", path);
  const double secs = mc_now_s() - t0;
  if (rc == 0) {
    r->start_step = st.step;
    r->opt.opt.step = st.adam_step;
    if (r->opts->progress) {
      fprintf(r->opts->progress, "mctrain: resumed from %s at step %lld\n", mc_ckpt_step_dir(ck), (long long)st.step);
      fprintf(r->opts->progress,
              "mctrain: loaded %lld bytes from disk once (%d rank%s reading %s own boxes would have read %lld); "
              "%lld bytes hashed, %lld bytes of rank files checked against their piece digests, %d exchange round%s; "
              "%.3f s from open to device memory (%.2f GB/s)",
              (long long)ls.total_read, ls.world, ls.world == 1 ? "" : "s each", ls.world == 1 ? "its" : "their",
              (long long)ls.per_rank_read, (long long)ls.total_hashed, (long long)ls.total_checked, ls.rounds,
              ls.rounds == 1 ? "" : "s", secs,
              secs > 0 ? 1e-9 * (double)ls.total_read / secs : 0.0);
      if (r->opt.stage) fprintf(r->opts->progress, ", %.3f s of it allocating the pinned staging", stage_s);
      fprintf(r->opts->progress, "; rank 0: %.3f s reading", ls.read_s);
      if (ls.rounds > 0) fprintf(r->opts->progress, ", %.3f s checking files, %.3f s exchanging", ls.check_s, ls.exchange_s);
      fputc('\n', r->opts->progress);
    }
  }
  mc_ckpt_close(ck);
  return rc;
}

static void save_opts(const mc_config *cfg, mc_ckpt_save_opts *so) {
  mc_ckpt_save_opts_default(so);
  so->keep = cfg->checkpoint.keep;
  so->io_threads = ckpt_io_threads(cfg);
  so->deflate = strcmp(cfg->checkpoint.compress, "deflate") == 0 ? MC_CKPT_DEFLATE_LEVEL : 0;
}

/* Turns the error of a failed asynchronous save (in mc_errmsg) into one naming the rank that
 * failed first, when the ranks met through the file system. */
static int async_error(run *r) {
  char msg[MC_ERRMSG_MAX];
  int fr = r->fsb ? mc_ckpt_fs_barrier_failure(r->fsb, msg, sizeof msg) : -1;
  if (strstr(mc_errmsg(), "asynchronous checkpoint")) return -1; /* already said */
  if (fr >= 0) return mc_error("asynchronous checkpoint failed on rank %d: %s", fr, msg);
  return mc_error_context("asynchronous checkpoint");
}

static int save(run *r, int64_t step, double lr) {
  const mc_config *cfg = r->cfg;
  mc_train_state st;
  memset(&st, 0, sizeof st);
  st.step = step;
  st.tokens_seen = step * cfg->train.global_batch * cfg->model.seq_len;
  st.schedule_step = step;
  st.lr = lr;
  st.adam_step = r->opt.opt.step;
  st.lr_max = cfg->train.lr, st.lr_min = cfg->train.min_lr;
  st.warmup_steps = cfg->train.warmup_steps, st.total_steps = cfg->train.steps;
  st.beta1 = cfg->train.beta1, st.beta2 = cfg->train.beta2, st.adam_eps = cfg->train.adam_eps;
  st.weight_decay = cfg->train.weight_decay, st.grad_clip = cfg->train.grad_clip;
  st.seed = cfg->train.seed;
  st.rng_counter = 0; /* no sampling or dropout draws yet */
  st.data_position = step * cfg->train.global_batch;
  /* A device's state goes to the host staging, which the previous async save may still be
   * writing from: wait for it first (its failure, if any, is every rank's). */
  if (r->saver && mc_ckpt_saver_wait(r->saver) != 0) return async_error(r);
  mc_ckpt_item *items = malloc(sizeof *items * (size_t)(MC_N_STATES * r->opt.opt.n + 1));
  if (!items) return mc_error("checkpoint: out of memory");
  int n_items = mc_dist_ckpt_items(&r->opt, items);
  int rc;
  if (n_items < 0) {
    rc = -1;
  } else if (r->saver) {
    /* A host backend's items are the live state, which the next step changes: the saver
     * copies them. A device's are snapshot copies still in flight into the pinned staging:
     * the saver's thread waits for them, so training goes on at once. */
    if (mc_backend_is_host(mc_net_backend(r->net))) rc = mc_ckpt_saver_save(r->saver, &r->geo, cfg, &st, items, n_items);
    else rc = mc_ckpt_saver_save_staged(r->saver, &r->geo, cfg, &st, items, n_items, mc_dist_stage_ready, &r->opt);
    if (rc != 0) {
      free(items);
      return async_error(r);
    }
  } else if (mc_dist_stage_ready(&r->opt) != 0) {
    rc = -1;
  } else {
    mc_ckpt_save_opts so;
    save_opts(cfg, &so);
    if (r->comm) { /* every rank writes its primaries; rank 0 commits */
      so.root = r->rank == 0;
      so.barrier = mc_dist_ckpt_barrier;
      so.barrier_user = r->comm->world;
    }
    rc = mc_ckpt_save(cfg->checkpoint.dir, &r->geo, cfg, &st, items, n_items, &so);
  }
  free(items);
  if (rc != 0) return mc_error_context("checkpoint at step %lld", (long long)step);
  r->last_saved = step;
  return 0;
}

static void fmt_duration(double s, char *buf, size_t cap) {
  if (!(s >= 0) || s > 1e7) snprintf(buf, cap, "?");
  else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else snprintf(buf, cap, "%.0fs", s);
}

/* Every rank must see one checkpoint.dir: rank 0 commits a checkpoint once the other ranks'
 * files and markers are there (ckpt/ckpt_async.c), so directories local to each host of a
 * multi-host job cannot work. Rank 0 writes a token there; every rank reads it back. */
static int check_shared_dir(const run *r, const char *dir) {
  mc_comm *w = r->comm->world;
  char token[64], seen[64], path[MC_PATH_MAX + 32];
  memset(token, 0, sizeof token), memset(seen, 0, sizeof seen);
  snprintf(path, sizeof path, "%s/.shared_check", dir);
  if (w->rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(token, sizeof token, "%ld.%ld.%ld", (long)getpid(), (long)ts.tv_sec, ts.tv_nsec);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(token, f) >= 0;
    if ((f && fclose(f) != 0) || !ok) return mc_error("cannot write %s: %s", path, strerror(errno));
  }
  /* the broadcast also orders every reader after rank 0's write */
  if (mc_bcast(w, token, (int64_t)sizeof token, MC_DT_U8, 0)) return mc_error_context("checking checkpoint.dir");
  FILE *f = fopen(path, "r");
  if (f) {
    if (!fgets(seen, sizeof seen, f)) seen[0] = 0;
    fclose(f);
  }
  int32_t missing = strcmp(seen, token) != 0;
  if (mc_allreduce_sum(w, &missing, 1, MC_DT_I32)) return mc_error_context("checking checkpoint.dir");
  if (w->rank == 0) remove(path);
  if (missing)
    return mc_error("checkpoint.dir %s is not shared: %d of the %d ranks do not see rank 0's files there (every rank "
                    "must reach one directory, e.g. on a shared file system; directories local to each host are not "
                    "supported)", dir, (int)missing, w->size);
  return 0;
}

static double wall_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The logged record as TensorBoard scalars (the same values as metrics.jsonl). */
static int log_events(run *r, const mc_metrics_rec *rec) {
  const char *tags[8] = {"train/loss", "train/aux_loss", "train/lr", "train/grad_norm", "train/tokens_per_s"};
  double v[8] = {rec->loss, rec->aux_loss, rec->lr, rec->grad_norm, rec->tokens_per_s};
  int n = 5;
  if (rec->has_comm) tags[n] = "train/comm_s", v[n++] = rec->comm_s;
  if (rec->has_val) tags[n] = "val/loss", v[n++] = rec->val_loss;
  if (rec->has_flops) tags[n] = "train/model_tflops", v[n++] = rec->model_tflops;
  if (rec->has_mfu) tags[n] = "train/mfu", v[n++] = rec->mfu;
  return mc_tfevents_scalars(&r->events, rec->step, rec->time, n, tags, v);
}

/* Rank 0: one committed checkpoint in metrics.jsonl/.csv and as TensorBoard scalars
 * checkpoint/training_paused_s and checkpoint/save_s at its step. */
static int log_checkpoint(run *r, int64_t step, double paused, double save_s) {
  if (r->rank != 0 || !r->metrics.f) return 0;
  mc_metrics_ckpt c = {.step = step, .paused_s = paused, .save_s = save_s, .async = r->saver != NULL, .time = wall_s()};
  const char *tags[2] = {"checkpoint/training_paused_s", "checkpoint/save_s"};
  const double v[2] = {paused, save_s};
  if (mc_metrics_checkpoint(&r->metrics, &c) != 0) return -1;
  return mc_tfevents_scalars(&r->events, step, c.time, 2, tags, v);
}

/* Async saves: those committed since the last call (each reported once), with the pause
 * queuing each cost. */
static int log_async_done(run *r) {
  int64_t step;
  double secs;
  while (r->saver && mc_ckpt_saver_take_done(r->saver, &step, &secs)) {
    const double paused = step == r->queued_step[1] ? r->queued_pause[1] : step == r->queued_step[0] ? r->queued_pause[0] : 0.0;
    if (log_checkpoint(r, step, paused, secs) != 0) return -1;
  }
  return 0;
}

static void queued(run *r, int64_t step, double paused) {
  r->queued_step[0] = r->queued_step[1], r->queued_pause[0] = r->queued_pause[1];
  r->queued_step[1] = step, r->queued_pause[1] = paused;
}

static int setup(run *r) {
  const mc_config *cfg = r->cfg;
  const mc_train_cfg *t = &cfg->train;
  mc_comm *world = r->opts->world;
  int world_size = world ? world->size : 1;
  r->rank = world ? world->rank : 0;
  if (mc_geometry_build(&cfg->model, &cfg->parallel, t, world_size, &r->geo) != 0)
    return world_size == 1 ? mc_error_context("one process (a parallel layout is launched with mpirun -np tp*dp*pp)")
                           : mc_error_context("%d ranks", world_size);
  r->have_geo = 1;
  mc_coords co;
  mc_layout_coords(&cfg->parallel, r->rank, &co);
  r->dp_rank = co.dp_rank;
  if (world && world_size > 1) {
    if (mc_comm_make_groups(world, &cfg->parallel, &r->groups) != 0) return -1;
    r->comm = &r->groups;
  }
  const int recompute = mc_recompute_parse(t->recompute);
  if (recompute < 0) return mc_error("train.recompute: unknown policy '%s' (none, selective, full)", t->recompute);
  mc_backend *be = mc_train_backend(t->device, t->dtype, r->opts->gpu);
  if (!be) return -1;
  /* NCCL queues its collectives on the compute stream (comm/comm.h): no host wait around the
   * device-buffer ones. MC_NCCL_BLOCKING=1 keeps every call blocking (docs/parallel.md). */
  const char *blocking = getenv("MC_NCCL_BLOCKING");
  if (r->comm && !strcmp(world->ops->name, "nccl") && !(blocking && !strcmp(blocking, "1")) &&
      mc_comm_nccl_order_with(mc_train_backend_stream(be)) != 0)
    return -1;
  if (t->steps < 1) return mc_error("train.steps=%d must be at least 1", t->steps);
  if (mc_data_open(&r->data, cfg->data.path, cfg->model.seq_len, cfg->data.val_fraction) != 0) return -1;
  if (mc_data_check_vocab(&r->data, cfg->model.vocab_size) != 0) return -1;
  if (t->eval_every > 0 && r->data.n_val < 1)
    return mc_error("train.eval_every=%d needs a validation split, but data.val_fraction=%g", t->eval_every,
                    cfg->data.val_fraction);
  r->net = mc_net_create_dist_on(&r->geo, r->rank, t->seed, r->comm, be);
  if (!r->net) return mc_error_context("creating the network");
  /* train.recompute: what the layers keep for the backward (docs/training.md, "Recomputation") */
  if (mc_net_set_recompute(r->net, (mc_recompute)recompute) != 0) return -1;
  if (mc_dist_opt_init(&r->opt, r->net, &r->geo, r->comm, r->rank) != 0) return -1;
  r->have_opt = 1;
  /* The activations arena is sized now, for train.micro_batch (evaluation uses the same). */
  /* Under pipeline parallelism a step's micro-batches are read first and go through the
   * stages together (train/pipeline.h), each stage keeping its in-flight micro-batches. */
  const int pipe_micro = cfg->parallel.pp > 1 ? t->global_batch / cfg->parallel.dp / t->micro_batch : 1;
  if (mc_net_reserve_micro(r->net, t->micro_batch, pipe_micro) != 0) return -1;
  r->tokens = malloc(sizeof(int32_t) * (size_t)pipe_micro * (size_t)t->micro_batch * (size_t)(cfg->model.seq_len + 1));
  if (!r->tokens) return mc_error("out of memory");

  /* One job per run directory: a second mctrain on it is turned away naming the first. */
  if (r->rank == 0) {
    char lock[MC_PATH_MAX + 32];
    snprintf(lock, sizeof lock, "%s/.mctrain.lock", cfg->checkpoint.dir);
    if (mkdir_p(cfg->checkpoint.dir) != 0) return -1;
    if ((r->lock_fd = mc_dirlock_take(lock, cfg->checkpoint.dir)) < 0) return mc_error_context("checkpoint.dir");
  }
  if (r->opts->resume) {
    const char *path = strcmp(r->opts->resume, "latest") ? r->opts->resume : cfg->checkpoint.dir;
    if (resume_from(r, path) != 0) return -1;
  } else {
    char latest[MC_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/latest", cfg->checkpoint.dir);
    struct stat sb;
    if (stat(latest, &sb) == 0)
      return mc_error("checkpoint.dir %s already holds a run (%s exists): continue it with --resume latest, or "
                      "choose another directory with --set checkpoint.dir=...", cfg->checkpoint.dir, latest);
  }
  if (mkdir_p(cfg->checkpoint.dir) != 0) return -1;
  if (r->comm && check_shared_dir(r, cfg->checkpoint.dir) != 0) return -1;
  r->last_saved = r->start_step;
  r->end_step = r->opts->until > 0 && r->opts->until < t->steps ? r->opts->until : t->steps;

  if (t->metrics[0]) snprintf(r->metrics_path, sizeof r->metrics_path, "%s", t->metrics);
  else snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", cfg->checkpoint.dir);
  if (r->rank != 0) {
    r->metrics_path[0] = 0; /* rank 0 logs the run */
  } else if (mc_metrics_open(&r->metrics, r->metrics_path, r->opts->resume ? r->start_step : -1) != 0) {
    return -1;
  } else {
    char tb[MC_PATH_MAX + 16];
    snprintf(tb, sizeof tb, "%s/tensorboard", cfg->checkpoint.dir);
    if (mc_tfevents_open(&r->events, tb) != 0) return -1;
  }
  /* The asynchronous saver calls the save barrier from its own thread. MPI is initialised
   * single-threaded (comm/comm_mpi.c), so under mpirun the ranks' save threads meet through
   * the file system (marker files in <checkpoint.dir>/.async_sync) instead of MPI. */
  if (cfg->checkpoint.async_save) {
    mc_ckpt_save_opts so;
    save_opts(cfg, &so);
    if (r->comm) {
      char sync[MC_PATH_MAX + 16];
      snprintf(sync, sizeof sync, "%s/.async_sync", cfg->checkpoint.dir);
      /* MC_CKPT_SYNC_TIMEOUT, else the collective timeout (MC_COMM_TIMEOUT_S), else 600 s: a
       * rank stalled during a save ends the job as one stalled in a collective does */
      const char *tv = getenv("MC_CKPT_SYNC_TIMEOUT"), *cv = getenv("MC_COMM_TIMEOUT_S");
      double timeout = tv && *tv ? atof(tv) : cv && *cv && atof(cv) > 0 ? atof(cv) : 600;
      int ok = mc_ckpt_fs_barrier_create(sync, r->rank, r->comm->world->size, timeout, &r->fsb) == 0;
      char err[MC_ERRMSG_MAX];
      snprintf(err, sizeof err, "%s", ok ? "" : mc_errmsg());
      /* rank 0 has emptied the directory before any rank uses it */
      int32_t flags[2] = {0, ok ? 0 : 1};
      if (agree_max(r->comm->world, flags) != 0) return -1;
      if (!ok) return mc_error("%s", err);
      if (flags[1]) return mc_error("checkpoint sync directory %s: rank 0 could not prepare it", sync);
      so.root = r->rank == 0;
      so.barrier = mc_ckpt_fs_barrier_fn;
      so.barrier_user = r->fsb;
    }
    if (mc_ckpt_saver_create(cfg->checkpoint.dir, &so, &r->saver) != 0) return -1;
  }
  /* the pinned staging of a device's state (every run saves at its end), once, before the
   * first step rather than at the first save: pinning gigabytes takes a while */
  if (mc_dist_stage_alloc(&r->opt) != 0) return -1;
  return 0;
}

/* One optimizer step: every micro-batch of the global batch, then clip and AdamW. */
static int train_step(run *r, int64_t s, mc_metrics_rec *rec) {
  const mc_config *cfg = r->cfg;
  const mc_train_cfg *t = &cfg->train;
  int G = t->global_batch, mb = t->micro_batch, T = cfg->model.seq_len;
  int dp = cfg->parallel.dp;
  mc_backend *be = mc_net_backend(r->net);
  be->step = s + 1;
  be->scope = "zero grads";
  mc_net_zero_grad(r->net);
  mc_net_stats tot;
  memset(&tot, 0, sizeof tot);
  if (cfg->parallel.pp > 1) { /* every micro-batch of the step through the stages (1F1B) */
    const int n_micro = G / dp / mb;
    for (int m = 0; m < n_micro; m++)
      if (mc_data_read_train(&r->data, t->seed, mc_data_first_sample(s, G, dp, r->dp_rank, mb, m), mb,
                             r->tokens + (int64_t)m * mb * (T + 1)) != 0)
        return -1;
    if (mc_net_pipeline_step(r->net, r->tokens, n_micro, mb, 1.0 / ((double)G * T), 1.0 / G, &tot) != 0)
      return mc_error_context("step %lld", (long long)s + 1);
  }
  for (int m = 0; cfg->parallel.pp <= 1 && m < G / dp / mb; m++) {
    int64_t first = mc_data_first_sample(s, G, dp, r->dp_rank, mb, m);
    if (mc_data_read_train(&r->data, t->seed, first, mb, r->tokens) != 0) return -1;
    mc_net_stats st;
    memset(&st, 0, sizeof st);
    /* the last micro-batch's backward starts each layer's gradient reduction (ZeRO 0/1) */
    mc_net_reduce_in_backward(r->net, m == G / dp / mb - 1);
    if (mc_net_forward_backward(r->net, r->tokens, mb, 1.0 / ((double)G * T), 1.0 / G, &st) != 0)
      return mc_error_context("step %lld, micro-batch %d", (long long)s + 1, m);
    tot.ce_sum += st.ce_sum, tot.aux_sum += st.aux_sum;
    tot.n_tokens += st.n_tokens, tot.n_seqs += st.n_seqs;
  }
  mc_net_reduce_in_backward(r->net, 0);
  /* the global batch's loss; gradients summed over TP/DP; the norm over every element once */
  be->scope = "optimizer";
  double norm = 0;
  if (mc_dist_stats_sum(r->comm, &tot) != 0 || mc_dist_sync_grads(&r->opt) != 0 || mc_dist_grad_norm(&r->opt, &norm) != 0)
    return mc_error_context("step %lld", (long long)s + 1);
  double lr = mc_lr_at(t, s);
  rec->step = s + 1;
  rec->loss = tot.n_tokens ? tot.ce_sum / (double)tot.n_tokens : NAN;
  rec->aux_loss = tot.n_seqs ? tot.aux_sum / (double)tot.n_seqs : 0;
  rec->lr = lr;
  rec->grad_norm = norm;
  rec->tokens = (s + 1) * (int64_t)G * T;
  if (!isfinite(rec->loss) || !isfinite(norm))
    return mc_error("step %lld: loss %g, gradient norm %g are not finite (lower train.lr?); nothing was saved "
                    "for this step", (long long)s + 1, rec->loss, norm);
  if (mc_dist_update(&r->opt, t, lr, mc_clip_scale(norm, t->grad_clip)) != 0)
    return mc_error_context("step %lld", (long long)s + 1);
  be->scope = NULL, be->step = 0;
  return 0;
}

/* Bytes per category in the rank's arenas; -1 for categories the trainer keeps no arena of. */
static void measured_bytes(run *r, int64_t bytes[MC_MEM_COUNT]) {
  memset(bytes, 0, sizeof(int64_t) * MC_MEM_COUNT);
  mc_net_mem_bytes(r->net, bytes);
  mc_optim_mem_bytes(&r->opt.opt, bytes);
  static const mc_mem_cat none[] = {MC_MEM_PIPELINE_BUFFERS, MC_MEM_RUNTIME_RESERVE, MC_MEM_ALLOCATOR_OVERHEAD};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) bytes[none[i]] = -1;
  if (r->cfg->parallel.zero != 3) bytes[MC_MEM_ZERO3_BUFFERS] = -1; /* only ZeRO 3 gathers layers */
  if (r->cfg->parallel.ep <= 1) bytes[MC_MEM_MOE_SCRATCH] = -1;     /* only EP exchanges routed rows */
  if (bytes[MC_MEM_DIST_STAGING] == 0) bytes[MC_MEM_DIST_STAGING] = -1; /* nothing packed: no allocation */
}

static int memory_report(run *r) {
  int64_t m[MC_MEM_COUNT];
  measured_bytes(r, m);
  const char *be = mc_net_backend(r->net)->name;
  if (r->opts->progress) {
    mc_mem_report_text(r->opts->progress, r->rank, be, m, r->opts->mem_predicted);
    int64_t reserved, balanced, peak;
    mc_net_moe_rows(r->net, &reserved, &balanced, &peak);
    if (reserved > 0)
      fprintf(r->opts->progress, "  moe.scratch: %lld routed rows per exchange reserved (the routing bound; %lld under "
              "balanced routing), at most %lld used in step 1\n", (long long)reserved, (long long)balanced, (long long)peak);
    fflush(r->opts->progress);
  }
  if (!r->metrics.f) return 0;
  if (mc_mem_report_json(r->metrics.f, r->rank, be, m, r->opts->mem_predicted) != 0) return -1;
  /* TensorBoard: memory/<category> (measured bytes of each arena the trainer keeps) and
   * memory/total at step 1 */
  const char *tags[MC_MEM_COUNT + 1];
  double v[MC_MEM_COUNT + 1], total = 0;
  char names[MC_MEM_COUNT][64];
  int n = 0;
  for (int c = 0; c < MC_MEM_COUNT; c++)
    if (m[c] >= 0) {
      snprintf(names[n], sizeof names[n], "memory/%s", mc_mem_cat_label((mc_mem_cat)c));
      tags[n] = names[n], v[n++] = (double)m[c], total += (double)m[c];
    }
  tags[n] = "memory/total", v[n++] = total;
  return mc_tfevents_scalars(&r->events, 1, wall_s(), n, tags, v);
}


static int loop(run *r) {
  const mc_config *cfg = r->cfg;
  const mc_train_cfg *t = &cfg->train;
  FILE *out = r->opts->progress;
  int64_t tok_per_step = (int64_t)t->global_batch * cfg->model.seq_len;
  const double flops_per_token = mc_model_train_flops_per_token(&cfg->model);
  int64_t n_params = 0;
  for (int f = 0; f < r->geo.fams.n; f++) n_params += r->geo.fams.f[f].numel;
  if (out) {
    fprintf(out, "mctrain: model %s d=%d (%lld parameters), data %s (%lld tokens, %lld train + %lld val windows "
                 "of %d), %lld tokens/step, steps %lld..%lld of %d, checkpoints in %s (I/O on %d threads), backend %s, "
                 "dtype %s\n",
            cfg->model.pattern, cfg->model.d_model, (long long)n_params, cfg->data.path,
            (long long)r->data.n_tokens, (long long)r->data.n_train, (long long)r->data.n_val,
            cfg->model.seq_len + 1, (long long)tok_per_step, (long long)r->start_step + 1,
            (long long)r->end_step, t->steps, cfg->checkpoint.dir, ckpt_io_threads(cfg), mc_net_backend(r->net)->name,
            t->dtype);
    fflush(out);
  }
  double t0 = mc_now_s(), t_log = t0, comm_log = r->comm ? mc_comm_groups_busy(r->comm) : 0.0;
  int64_t steps_since_log = 0;
  double lr = mc_lr_at(t, r->start_step > 0 ? r->start_step - 1 : 0);
  for (int64_t s = r->start_step; s < r->end_step; s++) {
    mc_metrics_rec rec;
    memset(&rec, 0, sizeof rec);
    if (train_step(r, s, &rec) != 0) return -1;
    int32_t v[2] = {r->opts->stop ? (int32_t)*r->opts->stop : 0, 0};
    /* A failed background save ends the run here, at the step boundary after it finished. */
    int ck_failed = r->saver && mc_ckpt_saver_poll(r->saver) < 0;
    char ck_err[MC_ERRMSG_MAX] = "";
    if (ck_failed) {
      async_error(r);
      snprintf(ck_err, sizeof ck_err, "%s", mc_errmsg());
    }
    v[1] = ck_failed;
    /* every rank stops after the same step, so a signal seen by some ranks only still ends all;
     * so does a checkpoint failure seen by some ranks only (the others' save threads fail too,
     * at the same barrier, but may not have finished yet) */
    if (r->comm && agree_max(r->comm->world, v) != 0) return -1;
    if (v[1]) {
      if (!ck_failed) { /* collect this rank's failure: its thread has seen the same barrier */
        mc_ckpt_saver_wait(r->saver);
        async_error(r);
        snprintf(ck_err, sizeof ck_err, "%s", mc_errmsg());
      }
      return mc_error("%s", ck_err);
    }
    if (log_async_done(r) != 0) return -1;
    int32_t stop = v[0];
    if (stop && s + 1 < r->end_step) {
      r->opts->stop_signal = stop;
      r->end_step = s + 1; /* interrupted: this step is the last, and it is saved */
      r->opts->stopped = 1;
    }
    lr = rec.lr;
    steps_since_log++;
    int64_t done = s + 1;
    if (t->eval_every > 0 && (done % t->eval_every == 0 || done == t->steps)) {
      /* each data-parallel rank scores its share of the sequences; TP ranks score the same */
      mc_net_stats vs;
      memset(&vs, 0, sizeof vs);
      if (eval_part(r->net, &r->data, 0, (int64_t)t->eval_batches * t->global_batch, t->micro_batch, r->dp_rank,
                    cfg->parallel.dp, &vs.ce_sum, &vs.n_tokens) != 0 ||
          mc_dist_stats_sum(r->comm, &vs) != 0)
        return mc_error_context("validation at step %lld", (long long)done);
      rec.val_loss = vs.n_tokens > 0 ? vs.ce_sum / (double)vs.n_tokens : NAN;
      rec.has_val = 1;
    }
    int log_now = rec.has_val || done == r->end_step || done == 1 || (t->log_every > 0 && done % t->log_every == 0);
    int tty = r->opts->progress_tty;
    if (done == 1 && r->rank == 0 && r->opts->mem_predicted && memory_report(r) != 0) return -1;
    if (log_now || (out && tty)) {
      /* Rate over the steps since the last logged line; a terminal line is redrawn every step. */
      double tn = mc_now_s();
      rec.tokens_per_s = (double)(steps_since_log * tok_per_step) / (tn - t_log > 1e-9 ? tn - t_log : 1e-9);
      const double comm_now = r->comm ? mc_comm_groups_busy(r->comm) : 0.0;
      rec.has_comm = r->comm != NULL;
      rec.comm_s = steps_since_log > 0 ? (comm_now - comm_log) / (double)steps_since_log : 0.0;
      rec.has_flops = flops_per_token > 0;
      rec.model_tflops = flops_per_token * rec.tokens_per_s / (double)r->geo.world / 1e12;
      rec.has_mfu = rec.has_flops && r->opts->peak_tflops > 0;
      rec.mfu = rec.has_mfu ? rec.model_tflops / r->opts->peak_tflops : 0.0;
      rec.time = wall_s();
      if (log_now && r->rank == 0 && (mc_metrics_write(&r->metrics, &rec) != 0 || log_events(r, &rec) != 0)) return -1;
      if (out) {
        char eta[32], val[32] = "";
        fmt_duration((tn - t0) / (double)(done - r->start_step) * (double)(r->end_step - done), eta, sizeof eta);
        if (rec.has_val) snprintf(val, sizeof val, "  val %.4f", rec.val_loss);
        /* On a terminal, logged lines with validation (and the last) stay; others are overwritten. */
        fprintf(out, "%sstep %lld/%d  loss %.4f  aux %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  ETA %s%s%s",
                tty ? "\r" : "", (long long)done, t->steps, rec.loss, rec.aux_loss, val, rec.lr, rec.grad_norm,
                rec.tokens_per_s, eta, tty ? "\033[K" : "", !tty || rec.has_val || done == r->end_step ? "\n" : "");
        fflush(out);
      }
      if (log_now) {
        t_log = tn, comm_log = comm_now;
        steps_since_log = 0;
      }
    }
    if (cfg->checkpoint.every > 0 && done % cfg->checkpoint.every == 0 && done != r->end_step) {
      double ts = mc_now_s();
      if (save(r, done, lr) != 0) return -1;
      const double paused = mc_now_s() - ts;
      if (r->saver) queued(r, done, paused); /* logged once committed */
      else if (log_checkpoint(r, done, paused, paused) != 0) return -1;
      /* Async: the training loop waited only for any save still in flight, and on a host
       * backend for the copy of the state. */
      /* On a terminal (mpirun gives rank 0 one) the line replaces the step line being redrawn. */
      if (out) {
        fprintf(out, "%scheckpoint step %lld %s (training paused %.3f s)%s\n", r->opts->progress_tty ? "\r" : "",
                (long long)done, r->saver ? "queued" : "saved", paused, r->opts->progress_tty ? "\033[K" : "");
        fflush(out);
      }
    }
  }
  if (r->end_step > r->last_saved) {
    double ts = mc_now_s();
    if (save(r, r->end_step, lr) != 0) return -1;
    const double paused = mc_now_s() - ts;
    if (r->saver) queued(r, r->end_step, paused);
    else if (log_checkpoint(r, r->end_step, paused, paused) != 0) return -1;
  }
  if (r->saver && mc_ckpt_saver_wait(r->saver) != 0) return async_error(r);
  if (log_async_done(r) != 0) return -1;
  if (out) {
    char took[32];
    fmt_duration(mc_now_s() - t0, took, sizeof took);
    fprintf(out, "mctrain: %s at step %lld in %s; checkpoint %s/step_%lld, metrics %s\n",
            r->opts->stopped ? "interrupted" : r->end_step == t->steps ? "finished" : "stopped", (long long)r->end_step, took, cfg->checkpoint.dir,
            (long long)r->end_step, r->metrics_path);
  }
  return 0;
}

int mc_train(const mc_config *cfg, mc_trainer_opts *opts) {
  run r;
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  r.opts = opts;
  r.data.id = r.data.file = -1;
  r.lock_fd = -1;
  int rc = setup(&r);
  if (rc == 0 && r.start_step >= r.end_step) {
    if (opts->progress)
      fprintf(opts->progress, "mctrain: nothing to do: the checkpoint is at step %lld and the run ends at %lld\n",
              (long long)r.start_step, (long long)r.end_step);
  } else if (rc == 0) {
    rc = loop(&r);
  }
  if (r.saver) {
    /* An error of the save in flight must not be lost, nor hide an earlier one. */
    char first[MC_ERRMSG_MAX];
    snprintf(first, sizeof first, "%s", mc_errmsg());
    if (mc_ckpt_saver_close(r.saver) != 0 && rc == 0) rc = async_error(&r);
    else if (rc != 0) mc_error("%s", first);
  }
  if (r.fsb) {
    /* Every rank's saves are done once all are here; then rank 0 removes the markers. */
    int all_done = rc == 0 && mc_barrier(r.comm->world) == 0;
    mc_ckpt_fs_barrier_free(r.fsb, all_done);
  }
  mc_metrics_close(&r.metrics);
  mc_tfevents_close(&r.events);
  if (rc == 0 && r.metrics_path[0]) {
    char svg[MC_PATH_MAX + 64];
    size_t n = strlen(r.metrics_path);
    if (n > 6 && !strcmp(r.metrics_path + n - 6, ".jsonl")) snprintf(svg, sizeof svg, "%.*s.svg", (int)(n - 6), r.metrics_path);
    else snprintf(svg, sizeof svg, "%s.svg", r.metrics_path);
    char title[MC_PATH_MAX + 64];
    snprintf(title, sizeof title, "MegaC %s: loss (%s)", cfg->model.pattern, cfg->checkpoint.dir);
    rc = mc_metrics_svg(r.metrics_path, svg, title);
    if (rc == 0 && opts->progress) fprintf(opts->progress, "mctrain: loss curve %s\n", svg);
  }
  free(r.tokens);
  if (r.have_opt) mc_dist_opt_free(&r.opt);
  if (r.net) mc_net_free(r.net);
  mc_data_close(&r.data);
  if (r.comm) mc_comm_free_groups(&r.groups);
  if (r.have_geo) mc_geometry_free(&r.geo);
  mc_dirlock_release(r.lock_fd, NULL, 0);
  return rc;
}
