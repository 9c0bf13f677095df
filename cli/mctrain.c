/* mctrain: trains the configured model (with no arguments, the embedded default config).
 *
 *   mctrain [--config FILE] [--set section.key=value]... [--resume latest|DIR] [--until STEP] [--quiet]
 *   mpirun -np N mctrain --set parallel.tp=2 --set parallel.dp=2 ...   (N = tp*dp*pp; CPU: MPI, GPU: NCCL)
 *   mctrain --nproc-per-node N [--nnodes M --node-rank K] --set train.device=cuda ...  (N GPU workers)
 *   torchrun / srun: one mctrain per GPU, ranks from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
 *
 * SIGINT or SIGTERM ends the run after the current step with a checkpoint of it (exit
 * status 128 + signal); see docs/training.md. */
#define _POSIX_C_SOURCE 200809L /* fileno, sigaction */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "ckpt/checkpoint.h"
#include "cli/cli_opts.h"
#include "core/config.h"
#include "comm/comm.h"
#include "comm/launch.h"
#include "plan/plan.h"
#include "train/trainer.h"
#include "util/clock.h"
#include "util/error.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

enum { OPT_RESUME = CLI_LONG, OPT_UNTIL, OPT_QUIET, OPT_FORCE, OPT_VERSION, OPT_PEAK };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"force", no_argument, NULL, OPT_FORCE},
    {"until", required_argument, NULL, OPT_UNTIL},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"version", no_argument, NULL, OPT_VERSION},
    {"peak-tflops", required_argument, NULL, OPT_PEAK},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mctrain [--config FILE] [--set section.key=value]... [--resume latest|DIR] [--force] [--until STEP]\n"
          "               [--peak-tflops X] [--quiet]\n"
          "       mctrain --help | --version\n"
          "  with no arguments trains the embedded default configuration (configs/default.json)\n"
          "  --resume latest   continue the run in checkpoint.dir from its newest checkpoint\n"
          "  --resume DIR      continue from a checkpoint directory (a run directory or a step_N)\n"
          "                    a resume takes the run's configuration from the checkpoint; --config/--set may\n"
          "                    change steps, layout, device, dtype, logging, checkpoints and the data path\n"
          "                    (each change is printed), not the model, nor the schedule, optimizer, global\n"
          "                    batch, seed or validation split unless --force is given\n"
          "  --force           with --resume: allow changes of the schedule, optimizer, batch, seed or split\n"
          "  --until STEP      stop after STEP steps (the schedule still spans train.steps)\n"
          "  --peak-tflops X   one device's peak TFLOP/s for the dtype (e.g. 989 for an H100 SXM in bf16): metrics\n"
          "                    then carry mfu = model_tflops / X (model_tflops, model FLOP/s per device, always)\n"
          "  --quiet           no progress output; off a terminal, progress is one plain line per logged step\n"
          "  --version         print the MegaC version and checkpoint format, then exit\n"
          "  --nproc-per-node N  start N local GPU workers (ranks of one job, one per GPU; needs train.device=cuda)\n"
          "  --nnodes M --node-rank K  with --nproc-per-node: this host is node K of M (MASTER_ADDR/MASTER_PORT: node 0)\n"
          "  parallel layouts: mpirun -np <tp*dp*pp> mctrain --set parallel.tp=2 --set parallel.dp=2 ... (docs/parallel.md);\n"
          "  on GPUs also torchrun/srun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or --nproc-per-node\n");
}

/* Started by mpirun (Open MPI, or a PMI launcher): then every process is one rank. A plain
 * start stays one process without initialising MPI. */
static int under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* ---------------------------------------------------------------- errors under mpirun
 *
 * An error every rank hits (a bad setting, a missing file) is printed once, by rank 0, and an
 * error of some ranks only is printed by each of them, tagged `rank R`. A failing rank does
 * not know whether the others failed, and a collective would hang on ranks still training, so
 * the ranks use point-to-point messages with time limits: a failing rank R > 0 sends its
 * message to rank 0 and waits up to ERR_ACK_S for an acknowledgement; rank 0, when it fails,
 * collects the messages that arrive within ERR_GATHER_S (or until every rank has reported),
 * prints each distinct message once with the ranks that hit it, then acknowledges. A rank
 * that gets no acknowledgement (rank 0 is still training) prints its own message and ends the
 * job (MPI_Abort). When every rank failed, all of them simply exit with their status;
 * otherwise an acknowledged rank waits for rank 0 to end the job, so that rank 0's lines are
 * not cut off. */
enum { ERR_TAG = 7117, ERR_ACK_TAG = 7118 };
enum { ERR_PRINTED = 0, ERR_WAIT = 1, ERR_ALL = 2 }; /* what report_error leaves to its caller */
static int error_mode = ERR_PRINTED;
#define ERR_GATHER_S 2.0
#define ERR_ACK_S 5.0


static void nap(void) {
  struct timespec d = {0, 5 * 1000 * 1000};
  nanosleep(&d, NULL);
}

/* "1-3, 5" from a sorted list of ranks. */
static void rank_list(const int *r, int n, char *out, size_t cap) {
  size_t off = 0;
  out[0] = 0;
  for (int i = 0; i < n && off < cap; i++) {
    int j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    off += (size_t)snprintf(out + off, cap - off, "%s%d", i ? ", " : "", r[i]);
    if (j > i && off < cap) off += (size_t)snprintf(out + off, cap - off, "-%d", r[j]);
    i = j;
  }
}

/* Prints `msg`, this rank's error, as described above. nl: start with a newline (a progress
 * line may be open on a terminal). Sets error_mode: ERR_PRINTED (this rank printed; a
 * multi-rank job is then ended with MPI_Abort), ERR_WAIT (rank 0 printed it and ends the job)
 * or ERR_ALL (every rank failed and rank 0 printed it: each exits normally). */
static void report_error(mc_comm *mpi_world, const char *msg, int nl) {
  error_mode = ERR_PRINTED;
  const char *lead = nl ? "\n" : "";
  fflush(stdout);
  if (!mpi_world || mpi_world->size <= 1) {
    fprintf(stderr, "%smctrain: %s\n", lead, msg);
    return;
  }
  const int rank = mpi_world->rank, size = mpi_world->size;
  if (rank != 0) {
    MPI_Request send, ack;
    int acked = 0, mode = 0, done = 0;
    MPI_Isend(msg, (int)strlen(msg) + 1, MPI_CHAR, 0, ERR_TAG, MPI_COMM_WORLD, &send);
    MPI_Irecv(&mode, 1, MPI_INT, 0, ERR_ACK_TAG, MPI_COMM_WORLD, &ack);
    for (const double t0 = mc_now_s(); !acked && mc_now_s() - t0 < ERR_ACK_S; nap()) MPI_Test(&ack, &acked, MPI_STATUS_IGNORE);
    if (acked) {
      MPI_Wait(&send, MPI_STATUS_IGNORE); /* rank 0 has received it */
      error_mode = mode;
      return;
    }
    MPI_Cancel(&ack);
    MPI_Test(&send, &done, MPI_STATUS_IGNORE); /* an eager send completes; a pending one dies with the job */
    fprintf(stderr, "%smctrain: rank %d: %s\n", lead, rank, msg);
    return;
  }
  /* rank 0: collect the others' messages */
  char (*got)[MC_ERRMSG_MAX] = calloc((size_t)size, sizeof *got);
  MPI_Request *req = calloc((size_t)size, sizeof *req);
  int *in = calloc((size_t)size, sizeof *in), *ranks = calloc((size_t)size, sizeof *ranks);
  if (!got || !req || !in || !ranks) {
    fprintf(stderr, "%smctrain: rank 0: %s\n", lead, msg);
    free(got), free(req), free(in), free(ranks);
    return;
  }
  snprintf(got[0], sizeof got[0], "%s", msg);
  in[0] = 1;
  int n_in = 1;
  for (int r = 1; r < size; r++) MPI_Irecv(got[r], MC_ERRMSG_MAX, MPI_CHAR, r, ERR_TAG, MPI_COMM_WORLD, &req[r]);
  for (const double t0 = mc_now_s(); n_in < size && mc_now_s() - t0 < ERR_GATHER_S; nap())
    for (int r = 1; r < size; r++)
      if (!in[r]) {
        MPI_Test(&req[r], &in[r], MPI_STATUS_IGNORE);
        n_in += in[r];
      }
  /* each distinct message once, with the ranks that hit it */
  int *shown = calloc((size_t)size, sizeof *shown);
  for (int r = 0; r < size; r++) {
    if (!in[r] || (shown && shown[r])) continue;
    int n = 0;
    for (int q = r; q < size; q++)
      if (in[q] && !strcmp(got[q], got[r])) {
        ranks[n++] = q;
        if (shown) shown[q] = 1;
      }
    char list[256];
    rank_list(ranks, n, list, sizeof list);
    if (n == size) fprintf(stderr, "%smctrain: rank 0: %s (every rank failed alike)\n", lead, got[r]);
    else if (n == 1) fprintf(stderr, "%smctrain: rank %d: %s\n", lead, r, got[r]);
    else fprintf(stderr, "%smctrain: ranks %s: %s\n", lead, list, got[r]);
    lead = "";
  }
  fflush(stderr);
  int mode = n_in == size ? ERR_ALL : ERR_WAIT;
  for (int r = 1; r < size; r++) {
    if (!in[r]) {
      MPI_Cancel(&req[r]);
      continue;
    }
    MPI_Send(&mode, 1, MPI_INT, r, ERR_ACK_TAG, MPI_COMM_WORLD); /* a small message: sent eagerly */
  }
  error_mode = n_in == size ? ERR_ALL : ERR_PRINTED;
  free(shown), free(got), free(req), free(in), free(ranks);
}

static int run_main(int argc, char **argv, const mc_launch *launch, mc_comm *mpi_world);
static int run_training(mc_config *cfg, int argc, char **argv, mc_comm *world, int local_rank);

/* The launcher's own options (--nproc-per-node N, --nnodes M, --node-rank K) are taken out of
 * argv before anything else, so the workers it starts see the rest unchanged. 1 when
 * --nproc-per-node was given; -1 on a malformed value (mc_error set). */
static int take_launch_opts(int *argc, char **argv, int v[3]) {
  static const char *names[3] = {"--nproc-per-node", "--nnodes", "--node-rank"};
  v[0] = 0, v[1] = 1, v[2] = 0;
  int seen[3] = {0, 0, 0}, out = 1;
  for (int i = 1; i < *argc; i++) {
    int k = -1;
    const char *val = NULL;
    for (int j = 0; j < 3 && k < 0; j++) {
      size_t n = strlen(names[j]);
      if (!strcmp(argv[i], names[j])) k = j, val = i + 1 < *argc ? argv[++i] : NULL;
      else if (!strncmp(argv[i], names[j], n) && argv[i][n] == '=') k = j, val = argv[i] + n + 1;
    }
    if (k < 0) {
      argv[out++] = argv[i];
      continue;
    }
    int64_t x = 0;
    if (!val || cli_int(names[k], val, k == 2 ? 0 : 1, 4096, k == 2 ? "a node index" : "a positive count", &x) != 0) {
      if (!val) mc_error("%s needs a value", names[k]);
      return -1;
    }
    v[k] = (int)x, seen[k] = 1;
  }
  argv[out] = NULL;
  *argc = out;
  if ((seen[1] || seen[2]) && !seen[0]) return mc_error("--nnodes and --node-rank go with --nproc-per-node N");
  return seen[0];
}

/* The seconds a collective may wait before the job is declared stalled: MC_COMM_TIMEOUT_S, as
 * for the MPI backend (default 600; 0 waits for ever). */
static double comm_timeout(void) {
  const char *s = getenv("MC_COMM_TIMEOUT_S");
  double t = s && *s ? strtod(s, NULL) : 600.0;
  return t > 0 ? t : 0.0;
}

/* mcplan's per-category prediction for rank 0 of this config (what mcplan prints with its
 * default options), for the trainer's step-1 memory report. 0; 1 when the config has no
 * valid geometry (the trainer reports that itself); -1 with mc_error set. */
static int predict_memory(const mc_config *cfg, int world_size, int64_t out[MC_MEM_COUNT]) {
  mc_geometry g;
  if (mc_geometry_build(&cfg->model, &cfg->parallel, &cfg->train, world_size, &g) != 0) return 1;
  mc_plan_opts po;
  mc_plan_opts_default(&po);
  mc_plan p;
  int rc = mc_plan_build(&g, &cfg->train, &po, &p);
  if (rc == 0) {
    memcpy(out, p.ranks[0].bytes, sizeof(int64_t) * MC_MEM_COUNT);
    mc_plan_free(&p);
  }
  mc_geometry_free(&g);
  return rc;
}

int main(int argc, char **argv) {
  /* --version answers before any launch or MPI start (it is also in the table, so that
   * run_training accepts it) */
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--version")) return cli_version("mctrain", MC_CKPT_FORMAT_VERSION);
  int lv[3];
  int nproc = take_launch_opts(&argc, argv, lv);
  if (nproc < 0) return cli_bad_usage("mctrain", usage);
  if (nproc > 0) {
    mc_launch env;
    if (mc_launch_read(&env) != 0) {
      fprintf(stderr, "mctrain: --nproc-per-node inside a launch (%s already started this process as rank %d of %d)\n",
              env.by ? env.by : "?", env.rank, env.size);
      return 2;
    }
    int rc = mc_launch_local(lv[0], lv[1], lv[2], argv);
    if (rc == 2) fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return rc;
  }
  mc_launch launch;
  if (mc_launch_read(&launch) < 0) {
    fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return 2;
  }
  mc_comm *world = NULL;
  if (under_mpirun() && mc_comm_mpi_init(&argc, &argv, &world) != 0) {
    fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return 1;
  }
  int rc = run_main(argc, argv, &launch, world);
  if (world) {
    /* A failure on some ranks only would leave the others waiting in a collective; the
     * failing rank has printed its error (report_error) and ends them all. One whose error
     * rank 0 printed waits for rank 0 to end the job. */
    if (world->size > 1 && (rc == 1 || rc == 2) && error_mode == ERR_WAIT)
      for (const double t0 = mc_now_s(); mc_now_s() - t0 < 30;) nap();
    if (world->size > 1 && (rc == 1 || rc == 2) && error_mode != ERR_ALL) MPI_Abort(MPI_COMM_WORLD, rc);
    mc_comm_mpi_finalize();
    world->ops->destroy(world); /* frees the wrapper only: MPI_COMM_WORLD is not freed */
  }
  return rc;
}

/* The run's world: none for one process; MPI's for CPU ranks under mpirun; an NCCL world for
 * GPU ranks (the NCCL id handed out over MPI under mpirun, else by the TCP rendezvous). 0, or
 * 1 with the message printed. */
static int make_world(const mc_config *cfg, const mc_launch *l, mc_comm *mpi_world, mc_comm **world) {
  *world = NULL;
  if (l->size <= 1) return 0;
  if (!strcmp(cfg->train.device, "cuda")) {
    if (mc_comm_nccl_init(l, l->local_rank, mpi_world, comm_timeout(), world) == 0) return 0;
    fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return 1;
  }
  if (mpi_world) {
    *world = mpi_world;
    return 0;
  }
  if (l->rank == 0)
    fprintf(stderr, "mctrain: train.device=%s with %d ranks from %s: CPU ranks run under mpirun (mpirun -np %d mctrain "
                    "...); torchrun, srun and --nproc-per-node start GPU ranks (set train.device=cuda)\n",
            cfg->train.device, l->size, l->by, l->size);
  return 1;
}

/* cfg := the configuration arguments (taken[1..nt)) applied on top of cfg. */
static int overlay(mc_config *cfg, char **taken, int nt) {
  char **copy = malloc(sizeof(char *) * ((size_t)nt + 1));
  if (!copy) return mc_error("out of memory");
  memcpy(copy, taken, sizeof(char *) * ((size_t)nt + 1));
  int n = nt, rc = mc_config_overlay_args(cfg, &n, copy, NULL);
  free(copy);
  return rc;
}

typedef struct {
  int force, refused, model, groups, shown;
  char refused_keys[512];
  FILE *out;
} resume_changes;

static void on_change(const char *section, const char *key, const char *was, const char *now, void *user) {
  resume_changes *c = user;
  const mc_resume_rule rule = mc_config_resume_rule(section, key);
  if (rule == MC_RESUME_NEVER || (rule == MC_RESUME_FORCE && !c->force)) {
    c->model += rule == MC_RESUME_NEVER && !strcmp(section, "model");
    c->groups += rule == MC_RESUME_NEVER && strcmp(section, "model") != 0;
    size_t n = strlen(c->refused_keys);
    snprintf(c->refused_keys + n, sizeof c->refused_keys - n, "%s%s.%s %s -> %s", c->refused++ ? ", " : "", section, key,
             was, now);
    return;
  }
  if (c->out) fprintf(c->out, "mctrain: resume changes %s.%s: %s -> %s%s\n", section, key, was, now, rule ? " (--force)" : "");
  c->shown++;
}

/* The configuration of the run: the defaults with the configuration arguments, or, when
 * resuming, the checkpoint's configuration with them, where only what the resume rules allow
 * may change (core/config.h mc_config_resume_rule), and the layout from this launch
 * (mc_config_take_launch); without --set checkpoint.dir a
 * resumed run continues in the run directory that holds the checkpoint. */
static int run_config(mc_config *cfg, char **taken, int nt, const char *resume, int force, FILE *out) {
  if (mc_config_default(cfg) || overlay(cfg, taken, nt)) return -1;
  if (!resume) return 0;
  mc_config probe; /* did the arguments set checkpoint.dir? */
  if (mc_config_default(&probe)) return -1;
  snprintf(probe.checkpoint.dir, sizeof probe.checkpoint.dir, "%s", "\x01");
  if (overlay(&probe, taken, nt)) return -1;
  const int dir_given = strcmp(probe.checkpoint.dir, "\x01") != 0;
  const char *path = strcmp(resume, "latest") ? resume : cfg->checkpoint.dir;
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  oo.metadata_only = 1; /* the configuration only: the trainer opens it again to load */
  mc_ckpt *ck = NULL;
  mc_config was;
  if (mc_ckpt_open(path, &oo, &ck) != 0) return mc_error_context("cannot resume from %s", path);
  int rc = mc_ckpt_config(ck, &was);
  char run_dir[sizeof cfg->checkpoint.dir];
  snprintf(run_dir, sizeof run_dir, "%s", mc_ckpt_step_dir(ck));
  char *slash = strrchr(run_dir, '/');
  if (slash && slash != run_dir) *slash = 0;
  else snprintf(run_dir, sizeof run_dir, ".");
  mc_ckpt_close(ck);
  if (rc != 0) return mc_error_context("reading the configuration of %s", path);
  mc_config now = was;
  if (overlay(&now, taken, nt)) return -1;
  mc_config_take_launch(&now, cfg); /* the layout: this launch's */
  if (!dir_given) snprintf(now.checkpoint.dir, sizeof now.checkpoint.dir, "%s", run_dir);
  resume_changes c = {.force = force, .out = out};
  if (mc_config_diff(&was, &now, on_change, &c) != 0) return -1;
  if (c.model)
    return mc_error("checkpoint %s is from a different model: %s (the checkpoint's tensors fix model.*)", path,
                    c.refused_keys);
  if (c.groups)
    return mc_error("resuming %s would change %s: the checkpoint's optimizer states fix which optimizer trains each "
                    "family (a new run can change optim.groups)", path, c.refused_keys);
  if (c.refused)
    return mc_error("resuming %s would change %s: the schedule, optimizer, global batch, seed and validation split "
                    "are the run's, kept from the checkpoint (pass --force to change them)", path, c.refused_keys);
  *cfg = now;
  return 0;
}

static int run_main(int argc, char **argv, const mc_launch *launch, mc_comm *mpi_world) {
  mc_config cfg;
  char **taken = malloc(sizeof(char *) * ((size_t)argc + 1));
  if (!taken) return 2;
  const int nt = mc_config_take_args(&argc, argv, taken);
  /* --resume and --force decide which configuration the arguments apply to: read them first
   * (run_training parses and checks every option) */
  const char *resume = NULL;
  int force = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--resume") && i + 1 < argc) resume = argv[++i];
    else if (!strncmp(argv[i], "--resume=", 9)) resume = argv[i] + 9;
    else if (!strcmp(argv[i], "--force")) force = 1;
  }
  FILE *out = launch->rank == 0 ? stderr : NULL;
  int crc = run_config(&cfg, taken, nt, resume, force, out);
  free(taken);
  if (crc != 0) {
    char msg[MC_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", mc_errmsg());
    report_error(mpi_world, msg, 0);
    return 2;
  }
  mc_comm *world = NULL;
  if (make_world(&cfg, launch, mpi_world, &world) != 0) return 1;
  int rc = run_training(&cfg, argc, argv, world, launch->local_rank);
  /* A failed rank does not finish the world: its exit ends the job through the watch
   * (comm/rendezvous.h), or mpirun's abort */
  if (world && world != mpi_world && (rc == 0 || rc >= 128)) world->ops->destroy(world);
  return rc;
}

static int run_training(mc_config *cfg, int argc, char **argv, mc_comm *world, int local_rank) {
  mc_trainer_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.progress = world && world->rank != 0 ? NULL : stdout; /* rank 0 reports */
  opts.world = world;
  opts.gpu = world && !strcmp(world->ops->name, "nccl") ? local_rank : 0;
  int force = 0;
  cli_parser p;
  int npos = 0;
  cli_init(&p, argc, argv, "h", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case OPT_RESUME:
      opts.resume = p.arg;
      break;
    case OPT_UNTIL:
      if (cli_int(p.opt, p.arg, 1, INT64_MAX, "a positive step count", &opts.until) != 0) return cli_bad_usage("mctrain", NULL);
      break;
    case OPT_QUIET:
      opts.progress = NULL;
      break;
    case OPT_VERSION:
      return cli_version("mctrain", MC_CKPT_FORMAT_VERSION);
    case OPT_PEAK: {
      char *end = NULL;
      opts.peak_tflops = strtod(p.arg, &end);
      if (end == p.arg || *end || !(opts.peak_tflops > 0 && opts.peak_tflops < 1e9)) {
        mc_error("--peak-tflops %s is not a positive number of TFLOP/s", p.arg);
        return cli_bad_usage("mctrain", NULL);
      }
      break;
    }
    case OPT_FORCE: /* read with --resume before the configuration was built (run_main) */
      force = 1;
      break;
    case CLI_ARG:
      cli_positional(&p, NULL, 0, &npos); /* takes none: sets the message */
      return cli_bad_usage("mctrain", usage);
    default:
      return cli_bad_usage("mctrain", usage);
    }
  }
  if (force && !opts.resume) {
    mc_error("--force goes with --resume (it allows changing the resumed run's schedule)");
    return cli_bad_usage("mctrain", NULL);
  }
  /* \r progress only on a terminal, and never under a launcher: Open MPI gives every rank a
   * pseudo-terminal even when mpirun's output goes to a file, so isatty cannot tell there */
  opts.progress_tty = opts.progress && isatty(fileno(opts.progress)) && !world && !under_mpirun();
  /* SIGINT/SIGTERM (Ctrl-C, preemption): finish the step, checkpoint it, exit 128+signal.
   * The handler resets itself, so a second signal kills at once. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  opts.stop = &stop_signal;
  int64_t predicted[MC_MEM_COUNT];
  if (opts.progress || !world || world->rank == 0) {
    /* Without a prediction the run still trains; the report is left out. */
    int pr = predict_memory(cfg, world ? world->size : 1, predicted);
    if (pr == 0) opts.mem_predicted = predicted;
    else if (pr < 0) fprintf(stderr, "mctrain: no memory report: mcplan's prediction failed: %s\n", mc_errmsg());
  }
  if (mc_train(cfg, &opts) != 0) {
    char msg[MC_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", mc_errmsg());
    if (world && world->size > 1 && strcmp(world->ops->name, "mpi") != 0) { /* GPU ranks: no MPI to agree over */
      fflush(stdout);
      fprintf(stderr, "%smctrain: rank %d: %s\n", opts.progress_tty ? "\n" : "", world->rank, msg);
      return 1;
    }
    report_error(world, msg, opts.progress_tty);
    return 1;
  }
  if (opts.stopped) {
    fflush(stdout);
    /* under mpirun a rank may stop because another rank received the signal */
    if (!world || world->rank == 0)
      fprintf(stderr, "mctrain: stopped by signal %d after saving; continue with --resume latest\n", opts.stop_signal);
    return 128 + opts.stop_signal;
  }
  return 0;
}
