/* Command-line parsing shared by the programs in cli/: getopt_long over one `struct option`
 * table per program (its usage text sits next to the table), with the messages and checks
 * every program gives the same way.
 *
 * Header-only (static inline): CMake makes an executable of every .c file in cli/.
 *
 * The standard --config FILE / --set section.key=value options are not parsed here: core/
 * config.h (mc_config_from_args, mc_config_overlay_args, mc_config_take_args) moves them out
 * of argv before the program parses the rest.
 *
 * Semantics, the same in every program:
 *   - options and positional arguments mix in any order and positionals come back in order
 *     (getopt_long's "-" mode: argv is never permuted); after "--" everything is positional;
 *   - "--name VALUE" and "--name=VALUE" are the same; a long name must be spelled in full
 *     (getopt_long's unique-prefix abbreviations are refused as unknown);
 *   - an unknown option, a missing value or a value given to an option that takes none is
 *     refused with a message naming it (CLI_BAD with mc_error set); getopt prints nothing. */
#ifndef MC_CLI_OPTS_H
#define MC_CLI_OPTS_H

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* What cli_next returns besides an option's val and -1 (the end). Options without a short
 * form take vals from CLI_LONG up. */
enum { CLI_ARG = 1, CLI_BAD = '?', CLI_LONG = 256 };

typedef struct {
  int argc;
  char **argv;
  const struct option *longs;
  char shorts[64];   /* "-:" + the program's short options */
  const char *arg;   /* after cli_next: the option's value, or the positional argument */
  char opt[64];      /* after cli_next: the option as messages name it, "--until" or "-o" */
  int rest;          /* once getopt_long has ended: the next argument after "--" (it is not
                        called again: a finished scan may rewind optind) */
} cli_parser;

/* shorts: getopt's short options ("ho:"); longs: the table, ended by a zero entry. */
static inline void cli_init(cli_parser *p, int argc, char **argv, const char *shorts, const struct option *longs) {
  p->argc = argc;
  p->argv = argv;
  p->longs = longs;
  snprintf(p->shorts, sizeof p->shorts, "-:%s", shorts);
  p->arg = NULL;
  p->opt[0] = 0;
  p->rest = 0;
  opterr = 0; /* the messages are ours */
  optind = 0; /* a fresh scan */
}

/* The table entry called exactly NAME (len bytes), or NULL. */
static inline const struct option *cli_long_named(const struct option *longs, const char *name, size_t len) {
  for (const struct option *o = longs; o->name; o++)
    if (strlen(o->name) == len && !strncmp(o->name, name, len)) return o;
  return NULL;
}

/* The next argument: an option's val (value in p->arg, name in p->opt), CLI_ARG (a positional
 * argument in p->arg), -1 at the end, or CLI_BAD with mc_error naming the offending option. */
static inline int cli_next(cli_parser *p) {
  p->arg = NULL;
  p->opt[0] = 0;
  if (p->rest > 0) {
    if (p->rest >= p->argc) return -1;
    p->arg = p->argv[p->rest++];
    return CLI_ARG;
  }
  const int at = optind > 0 ? optind : 1; /* a long option is always the whole of argv[at] */
  int idx = -1;
  const int c = getopt_long(p->argc, p->argv, p->shorts, p->longs, &idx);
  if (c == -1) { /* the end, or "--": what follows is positional */
    p->rest = optind > 0 ? optind : p->argc;
    return cli_next(p);
  }
  if (c == 1) {
    p->arg = optarg;
    return CLI_ARG;
  }
  const char *tok = at < p->argc ? p->argv[at] : "";
  if (tok[0] == '-' && tok[1] == '-') {
    const size_t len = strcspn(tok + 2, "=");
    const struct option *o = cli_long_named(p->longs, tok + 2, len);
    if (!o) { /* unknown, or an abbreviation getopt_long would have taken */
      mc_error("unknown argument '%s'", tok);
      return CLI_BAD;
    }
    if (c == ':' || c == '?') {
      mc_error(c == ':' ? "--%s needs a value" : "--%s takes no value", o->name);
      return CLI_BAD;
    }
    snprintf(p->opt, sizeof p->opt, "--%s", o->name);
  } else {
    if (c == ':' || c == '?') {
      if (c == ':') mc_error("-%c needs a value", optopt);
      else mc_error("unknown argument '-%c'", optopt);
      return CLI_BAD;
    }
    snprintf(p->opt, sizeof p->opt, "-%c", c);
  }
  p->arg = optarg;
  return c;
}

/* Keeps the positional argument p->arg in the next of max slots (max 0: the program takes
 * none): 0, or -1 with mc_error naming it when all are taken. */
static inline int cli_positional(const cli_parser *p, const char **slots, int max, int *n) {
  if (*n >= max) return mc_error("unexpected argument '%s'", p->arg);
  slots[(*n)++] = p->arg;
  return 0;
}

/* Prints "PROG: <the error message>" and the usage on stderr; returns 2, the exit status of
 * every program's bad command line. */
static inline int cli_bad_usage(const char *prog, void (*usage)(FILE *)) {
  fprintf(stderr, "%s: %s\n", prog, mc_errmsg());
  if (usage) usage(stderr);
  return 2;
}

/* TEXT (an option's value) as a decimal integer in [lo, hi]: 0, or -1 with the message
 * "OPT TEXT is not WHAT" (e.g. WHAT = "a positive step count"). */
static inline int cli_int(const char *opt, const char *text, int64_t lo, int64_t hi, const char *what, int64_t *out) {
  char *end = NULL;
  errno = 0;
  const long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != 0 || v < lo || v > hi) return mc_error("%s %s is not %s", opt, text, what);
  *out = v;
  return 0;
}

/* cli_int for an int. */
static inline int cli_int32(const char *opt, const char *text, int lo, int hi, const char *what, int *out) {
  int64_t v = 0;
  if (cli_int(opt, text, lo, hi, what, &v) != 0) return -1;
  *out = (int)v;
  return 0;
}

/* What every program's --version prints: "PROG (MegaC VERSION, checkpoint format F)".
 * MC_VERSION comes from CMake's project version; format is MC_CKPT_FORMAT_VERSION where the
 * program reads checkpoints, 0 where it does not (the clause is then left out). */
#ifndef MC_VERSION
#error "MC_VERSION is defined by CMakeLists.txt (project VERSION)"
#endif
static inline int cli_version(const char *prog, int format) {
  if (format > 0) printf("%s (MegaC %s, checkpoint format %d)\n", prog, MC_VERSION, format);
  else printf("%s (MegaC %s)\n", prog, MC_VERSION);
  return 0;
}

#endif
