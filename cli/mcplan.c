/* mcplan: prints the rank map, stage map, ownership table, per-device memory geometry and
 * FLOPs of a configuration, without running anything. Exit status: 0 planned (warnings do
 * not change it), 2 bad input (option, config or layout rule), 1 internal failure. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_opts.h"
#include "core/config.h"
#include "core/ownership.h"
#include "plan/plan.h"
#include "plan/report.h"
#include "plan/units.h"
#include "util/error.h"

enum { OPT_DEVICE_MEM = CLI_LONG, OPT_RESERVE, OPT_ALLOC_OVERHEAD, OPT_MARGIN, OPT_DETAIL, OPT_JSON, OPT_VERSION };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"device-mem", required_argument, NULL, OPT_DEVICE_MEM},
    {"reserve", required_argument, NULL, OPT_RESERVE},
    {"alloc-overhead", required_argument, NULL, OPT_ALLOC_OVERHEAD},
    {"margin", required_argument, NULL, OPT_MARGIN},
    {"detail", required_argument, NULL, OPT_DETAIL},
    {"json", no_argument, NULL, OPT_JSON},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *out) {
  fprintf(out,
          "usage: mcplan [--config FILE] [--set section.key=value ...] [--device-mem SIZE]\n"
          "              [--reserve SIZE] [--alloc-overhead PCT] [--margin PCT] [--detail N] [--json]\n"
          "       mcplan --help | --version\n"
          "  --device-mem SIZE     memory per device, e.g. 80GiB, 141GB, 512MiB, 1000000 (default 80GiB)\n"
          "  --reserve SIZE        runtime reserve per device (default 1GiB for cuda, 256MiB for cpu)\n"
          "  --alloc-overhead PCT  allocator overhead, percent of allocated bytes (default 5)\n"
          "  --margin PCT          warn when headroom is under PCT percent of the device (default 10)\n"
          "  --detail N            list every rank for worlds up to N, else group them (default 16)\n"
          "  --json                print the plan as one JSON document\n"
          "  --version             print the MegaC version, then exit\n"
          "Exit status: 0 planned, 2 bad input, 1 internal failure.\n");
}

/* "10", "10%", "2.5" -> fraction. */
static int parse_percent(const char *opt, const char *text, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (end != text && *end == '%') end++;
  if (errno != 0 || end == text || *end != 0 || !(v >= 0.0 && v < 100.0))
    return mc_error("%s: '%s' is not a percentage in [0, 100)", opt, text);
  *out = v / 100.0;
  return 0;
}

typedef struct {
  mc_plan_opts opts;
  int json;
  int detail;
} plan_args;

/* 0; 1 for --help; 2 for --version; -1 with mc_error set. */
static int parse_args(int argc, char **argv, plan_args *o) {
  cli_parser p;
  int npos = 0;
  cli_init(&p, argc, argv, "h", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    switch (c) {
    case 'h':
      return 1;
    case OPT_VERSION:
      return 2;
    case OPT_JSON:
      o->json = 1;
      break;
    case OPT_DEVICE_MEM:
      if (mc_parse_bytes(p.arg, &o->opts.device_mem)) return mc_error_context("--device-mem");
      if (o->opts.device_mem <= 0) return mc_error("--device-mem: '%s' must be positive", p.arg);
      break;
    case OPT_RESERVE:
      if (mc_parse_bytes(p.arg, &o->opts.reserve)) return mc_error_context("--reserve");
      break;
    case OPT_ALLOC_OVERHEAD:
      if (parse_percent(p.opt, p.arg, &o->opts.alloc_overhead)) return -1;
      break;
    case OPT_MARGIN:
      if (parse_percent(p.opt, p.arg, &o->opts.margin)) return -1;
      break;
    case OPT_DETAIL:
      if (cli_int32(p.opt, p.arg, 1, 1000000, "a positive integer", &o->detail)) return -1;
      break;
    case CLI_ARG:
      return cli_positional(&p, NULL, 0, &npos); /* takes none: -1 naming it */
    default:
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--version")) {
      return cli_version("mcplan", 0);
    }
  mc_config cfg;
  if (mc_config_from_args(&cfg, &argc, argv) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    return 2;
  }
  plan_args o = {.json = 0, .detail = 16};
  mc_plan_opts_default(&o.opts);
  const int parsed = parse_args(argc, argv, &o);
  if (parsed == 1) {
    usage(stdout);
    return 0;
  }
  if (parsed == 2) return cli_version("mcplan", 0);
  if (parsed != 0) return cli_bad_usage("mcplan", NULL);
  mc_geometry g;
  if (mc_geometry_build(&cfg.model, &cfg.parallel, &cfg.train, -1, &g) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    return 2;
  }
  mc_plan p;
  if (mc_plan_build(&g, &cfg.train, &o.opts, &p) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    mc_geometry_free(&g);
    return 2;
  }
  int status = 0;
  if (o.json) {
    cJSON *doc = mc_plan_to_json(&g, &p);
    char *text = doc ? cJSON_Print(doc) : NULL;
    if (text) {
      fputs(text, stdout);
      fputc('\n', stdout);
    } else {
      fprintf(stderr, "mcplan: %s\n", doc ? "out of memory printing JSON" : mc_errmsg());
      status = 1;
    }
    free(text);
    cJSON_Delete(doc);
  } else if (mc_plan_print_text(stdout, &g, &p, o.detail) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    status = 1;
  }
  mc_plan_free(&p);
  mc_geometry_free(&g);
  return status;
}
