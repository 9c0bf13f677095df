/* mctrain: trains the configured model (with no arguments, the embedded default config).
 *
 *   mctrain [--config FILE] [--set section.key=value]... [--resume latest|DIR] [--until STEP] [--quiet]
 *   mpirun -np N mctrain --set parallel.tp=2 --set parallel.dp=2 ...   (N = tp*dp*pp)
 *
 * SIGINT or SIGTERM ends the run after the current step with a checkpoint of it (exit
 * status 128 + signal); see docs/training.md. */
#define _POSIX_C_SOURCE 200809L /* fileno, sigaction */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "cli/cli_opts.h"
#include "core/config.h"
#include "comm/comm.h"
#include "plan/plan.h"
#include "train/trainer.h"
#include "util/error.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

enum { OPT_RESUME = CLI_LONG, OPT_UNTIL, OPT_QUIET };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"until", required_argument, NULL, OPT_UNTIL},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mctrain [--config FILE] [--set section.key=value]... [--resume latest|DIR] [--until STEP] [--quiet]\n"
          "  with no arguments trains the embedded default configuration (configs/default.json)\n"
          "  --resume latest   continue the run in checkpoint.dir from its newest checkpoint\n"
          "  --resume DIR      continue from a checkpoint directory (a run directory or a step_N)\n"
          "  --until STEP      stop after STEP steps (the schedule still spans train.steps)\n"
          "  --quiet           no progress output\n"
          "  parallel layouts: mpirun -np <tp*dp*pp> mctrain --set parallel.tp=2 --set parallel.dp=2 ... (docs/parallel.md)\n");
}

/* Started by mpirun (Open MPI, or a PMI launcher): then every process is one rank. A plain
 * start stays one process without initialising MPI. */
static int under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static int run_main(int argc, char **argv, mc_comm *world);

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
  mc_comm *world = NULL;
  if (under_mpirun() && mc_comm_mpi_init(&argc, &argv, &world) != 0) {
    fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return 1;
  }
  int rc = run_main(argc, argv, world);
  if (world) {
    /* A failure on some ranks only would leave the others waiting in a collective; the
     * failing rank has printed its error and ends them all. */
    if (world->size > 1 && rc == 1) MPI_Abort(MPI_COMM_WORLD, 1);
    mc_comm_mpi_finalize();
    world->ops->destroy(world); /* frees the wrapper only: MPI_COMM_WORLD is not freed */
  }
  return rc;
}

static int run_main(int argc, char **argv, mc_comm *world) {
  mc_config cfg;
  if (mc_config_from_args(&cfg, &argc, argv) != 0) {
    fprintf(stderr, "mctrain: %s\n", mc_errmsg());
    return 2;
  }
  mc_trainer_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.progress = world && world->rank != 0 ? NULL : stdout; /* rank 0 reports */
  opts.world = world;
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
    case CLI_ARG:
      cli_positional(&p, NULL, 0, &npos); /* takes none: sets the message */
      return cli_bad_usage("mctrain", usage);
    default:
      return cli_bad_usage("mctrain", usage);
    }
  }
  opts.progress_tty = opts.progress && isatty(fileno(opts.progress));
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
    int pr = predict_memory(&cfg, world ? world->size : 1, predicted);
    if (pr == 0) opts.mem_predicted = predicted;
    else if (pr < 0) fprintf(stderr, "mctrain: no memory report: mcplan's prediction failed: %s\n", mc_errmsg());
  }
  if (mc_train(&cfg, &opts) != 0) {
    fflush(stdout);
    if (world && world->size > 1)
      fprintf(stderr, "%smctrain: rank %d: %s\n", opts.progress_tty ? "\n" : "", world->rank, mc_errmsg());
    else
      fprintf(stderr, "%smctrain: %s\n", opts.progress_tty ? "\n" : "", mc_errmsg());
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
