/* mcplan: prints the rank map, stage map, ownership table, per-device memory geometry and
 * FLOPs of a configuration, without running anything. Exit status: 0 planned (warnings do
 * not change it), 2 bad input (option, config or layout rule), 1 internal failure. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/ownership.h"
#include "plan/plan.h"
#include "plan/report.h"
#include "plan/units.h"
#include "util/error.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: mcplan [--config FILE] [--set section.key=value ...] [--device-mem SIZE]\n"
          "              [--reserve SIZE] [--alloc-overhead PCT] [--margin PCT] [--detail N] [--json]\n"
          "  --device-mem SIZE     memory per device, e.g. 80GiB, 141GB, 512MiB, 1000000 (default 80GiB)\n"
          "  --reserve SIZE        runtime reserve per device (default 1GiB for cuda, 256MiB for cpu)\n"
          "  --alloc-overhead PCT  allocator overhead, percent of allocated bytes (default 5)\n"
          "  --margin PCT          warn when headroom is under PCT percent of the device (default 10)\n"
          "  --detail N            list every rank for worlds up to N, else group them (default 16)\n"
          "  --json                print the plan as one JSON document\n"
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

static int parse_int(const char *opt, const char *text, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != 0 || v < 1 || v > 1000000)
    return mc_error("%s: '%s' is not a positive integer", opt, text);
  *out = (int)v;
  return 0;
}

/* Accepts "--opt VALUE" and "--opt=VALUE"; returns the value or NULL if argv[*i] is not opt. */
static const char *option_value(int argc, char **argv, int *i, const char *opt, int *missing) {
  size_t n = strlen(opt);
  if (strncmp(argv[*i], opt, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

typedef struct {
  mc_plan_opts opts;
  int json;
  int detail;
} cli_opts;

static int parse_args(int argc, char **argv, cli_opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int missing = 0;
    if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if ((v = option_value(argc, argv, &i, "--device-mem", &missing))) {
      if (mc_parse_bytes(v, &o->opts.device_mem)) return mc_error_context("--device-mem");
      if (o->opts.device_mem <= 0) return mc_error("--device-mem: '%s' must be positive", v);
    } else if ((v = option_value(argc, argv, &i, "--reserve", &missing))) {
      if (mc_parse_bytes(v, &o->opts.reserve)) return mc_error_context("--reserve");
    } else if ((v = option_value(argc, argv, &i, "--alloc-overhead", &missing))) {
      if (parse_percent("--alloc-overhead", v, &o->opts.alloc_overhead)) return -1;
    } else if ((v = option_value(argc, argv, &i, "--margin", &missing))) {
      if (parse_percent("--margin", v, &o->opts.margin)) return -1;
    } else if ((v = option_value(argc, argv, &i, "--detail", &missing))) {
      if (parse_int("--detail", v, &o->detail)) return -1;
    } else if (missing) {
      return mc_error("%s needs a value", a);
    } else {
      return mc_error("unknown argument '%s' (see mcplan --help)", a);
    }
    if (missing) return mc_error("%s needs a value", a);
  }
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
  mc_config cfg;
  if (mc_config_from_args(&cfg, &argc, argv) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    return 2;
  }
  cli_opts o = {.json = 0, .detail = 16};
  mc_plan_opts_default(&o.opts);
  if (parse_args(argc, argv, &o) != 0) {
    fprintf(stderr, "mcplan: %s\n", mc_errmsg());
    return 2;
  }
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
