/* mcreshard: rewrite a checkpoint for a new parallel layout, offline (no GPU, no MPI).
 *
 *   mcreshard SRC DST [--tp N] [--pp N] [--dp N] [--ep N] [--sp 0|1] [--zero 0|1|3]
 *             [--split equal|weighted|'AEME|AEMR'] [--config FILE] [--set parallel.K=V] [--consolidate]
 *             [--dry-run [--summary] [--node-gbps G] [--ranks-per-node R]] [--json] [--force]
 *             [--chunk-mb N] [--threads N] [--no-progress] [--state-dtype STATE=DTYPE[,STATE=DTYPE...]]
 *   mcreshard SRC --export FILE.safetensors|DIR [--dtype fp32|bf16] [--names auto|llama|megac]
 *             [--max-shard-size SIZE] [--dry-run] [--force]
 *   mcreshard --import FILE.safetensors|DIR DST [layout options] [--dry-run] [--force]
 *   mcreshard --version
 *
 * SRC is a run directory (its `latest` is used) or a step directory. Layout values not given
 * keep the source's (for --import: the layout recorded in the file). --dry-run plans from
 * SRC's manifest alone (its rank files are not opened: a metadata-only checkpoint of
 * bench/sim_scale --write-metadata works) and reports the target checkpoint's forecast.
 * docs/reshard.md; export and import: docs/export.md. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_opts.h"
#include "core/dtype.h"
#include "core/layout.h"
#include "reshard/export.h"
#include "reshard/plan_print.h"
#include "reshard/reshard.h"
#include "util/paths.h"

/* --config/--set (and --layout, the same as --config) are here only to name them when their
 * value is missing: main moves them out of argv first, for resolve_layout to apply on the
 * source's config. */
enum {
  OPT_TP = CLI_LONG, OPT_PP, OPT_DP, OPT_EP, OPT_SP, OPT_ZERO, OPT_SPLIT, OPT_CONFIG, OPT_SET, OPT_EXPORT, OPT_IMPORT,
  OPT_CHUNK_MB, OPT_THREADS, OPT_CONSOLIDATE, OPT_DRY_RUN, OPT_JSON, OPT_FORCE, OPT_NO_PROGRESS, OPT_SUMMARY,
  OPT_NODE_GBPS, OPT_RANKS_PER_NODE, OPT_DTYPE, OPT_NAMES, OPT_MAX_SHARD, OPT_VERSION, OPT_STATE_DTYPE
};
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"tp", required_argument, NULL, OPT_TP},
    {"pp", required_argument, NULL, OPT_PP},
    {"dp", required_argument, NULL, OPT_DP},
    {"ep", required_argument, NULL, OPT_EP},
    {"sp", required_argument, NULL, OPT_SP},
    {"zero", required_argument, NULL, OPT_ZERO},
    {"split", required_argument, NULL, OPT_SPLIT},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"set", required_argument, NULL, OPT_SET},
    {"layout", required_argument, NULL, OPT_CONFIG},
    {"export", required_argument, NULL, OPT_EXPORT},
    {"import", required_argument, NULL, OPT_IMPORT},
    {"chunk-mb", required_argument, NULL, OPT_CHUNK_MB},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"consolidate", no_argument, NULL, OPT_CONSOLIDATE},
    {"dry-run", no_argument, NULL, OPT_DRY_RUN},
    {"json", no_argument, NULL, OPT_JSON},
    {"force", no_argument, NULL, OPT_FORCE},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"node-gbps", required_argument, NULL, OPT_NODE_GBPS},
    {"ranks-per-node", required_argument, NULL, OPT_RANKS_PER_NODE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"names", required_argument, NULL, OPT_NAMES},
    {"max-shard-size", required_argument, NULL, OPT_MAX_SHARD},
    {"version", no_argument, NULL, OPT_VERSION},
    {"state-dtype", required_argument, NULL, OPT_STATE_DTYPE},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mcreshard SRC DST [layout options] [--dry-run [--json] [--summary] [--node-gbps G] [--ranks-per-node R]]\n"
          "                 [--force] [--chunk-mb N] [--threads N] [--no-progress]\n"
          "                 [--state-dtype STATE=DTYPE[,STATE=DTYPE...]]\n"
          "       mcreshard SRC --export FILE.safetensors|DIR [--dtype fp32|bf16] [--names auto|llama|megac]\n"
          "                 [--max-shard-size SIZE] [--dry-run] [--force]\n"
          "       mcreshard --import FILE.safetensors|DIR DST [layout options] [--dry-run] [--force]\n"
          "       mcreshard --version\n"
          "layout options (anything not given keeps the source's value):\n"
          "  --tp N --pp N --dp N --ep N --sp 0|1 --zero 0|1|3\n"
          "  --split equal|weighted|'AEME|AEMR'   pipeline stage split (pipes in the pattern)\n"
          "  --config FILE    a config (JSON); its \"parallel\" section gives the target layout and a\n"
          "                   \"model\" section must match the source (--layout FILE is the same)\n"
          "  --set parallel.KEY=VALUE   one layout key (config syntax), applied in order with --config\n"
          "  (--config/--set are applied first, then the flags above; other sections are not used)\n"
          "  --consolidate    world size 1 (tp=pp=dp=ep=1, zero 0)\n"
          "SRC: a run directory (uses latest) or a step directory. DST: a new run directory.\n"
          "--state-dtype STATE=DTYPE[,...]: store those state kinds (param, exp_avg, exp_avg_sq, momentum) in DTYPE\n"
          "  (float32, bfloat16, float16, float8_e4m3, float8_e5m2; narrowing rounds to nearest even, E4M3\n"
          "  saturates at +-448); the kinds not named keep the source's dtype. May be given more than once.\n"
          "--dry-run: plan from SRC's manifest alone (rank files are not opened) and print every target\n"
          "  shard's pieces and a forecast of the target checkpoint (shards, rank files, manifest size,\n"
          "  writer balance, save time); --summary: the totals and the forecast only; --node-gbps G\n"
          "  (default 2) and --ranks-per-node R (default 8): the write bandwidth of one node of R ranks\n"
          "  the forecast assumes. These three and --json need --dry-run.\n"
          "--export: the weights in safetensors (docs/export.md). A path ending in .safetensors is one file;\n"
          "  any other path a Hugging Face model directory: model-0000i-of-0000N.safetensors shards,\n"
          "  model.safetensors.index.json and config.json. --dtype fp32 (default, the master weights\n"
          "  exactly) or bf16 (round to nearest even); --names auto (default: Llama names and a\n"
          "  LlamaForCausalLM config.json for a dense AEAE... model, MegaC names otherwise), llama\n"
          "  (refused, naming the difference, when the model is not a Llama) or megac;\n"
          "  --max-shard-size SIZE (directory; default 5GB; units B, KB, MB, GB, KiB, MiB, GiB).\n"
          "--import: a file or model directory (MegaC or Llama names, F32/BF16/F16 tensors) into a new\n"
          "  run directory DST: AdamW moments zero, step 0.\n"
          "--dry-run with --export/--import: check everything and print what would be written; writes nothing.\n"
          "--force: replace an existing DST or export path.\n"
          "--no-progress: no progress bar (it is drawn on stderr only when stderr is a terminal).\n");
}

typedef struct {
  int tp, pp, dp, ep, sp, zero; /* -1: keep */
  const char *split;
  int consolidate;
  /* --config FILE / --layout FILE / --set k=v, in command-line order (argv form for
   * mc_config_overlay_args; cfg_argv[0] is the program name). */
  int cfg_argc;
  char **cfg_argv;
} layout_args;

/* --node-gbps: a positive number of GB/s. */
static int parse_gbps(const cli_parser *p, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(p->arg, &end);
  if (errno != 0 || end == p->arg || *end != 0 || !(v > 0.0 && v < 1e9))
    return mc_error("%s %s is not a positive bandwidth in GB/s", p->opt, p->arg);
  *out = v;
  return 0;
}

/* An integer option's value in [lo, 2^20]. */
static int parse_int(const cli_parser *p, int lo, int *out) {
  return cli_int32(p->opt, p->arg, lo, 1 << 20, lo ? "an integer in [1, 1048576]" : "an integer in [0, 1048576]", out);
}

/* --state-dtype STATE=DTYPE[,STATE=DTYPE...]: dt[state] = the dtype (others untouched). A
 * state named twice, over one or several flags, is refused. */
static int parse_state_dtypes(const char *arg, int *dt) {
  char buf[256];
  if (snprintf(buf, sizeof buf, "%s", arg) >= (int)sizeof buf) return mc_error("--state-dtype %s: too long", arg);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    if (!eq) return mc_error("--state-dtype %s: '%s' is not STATE=DTYPE", arg, item);
    *eq = 0;
    int s = mc_state_parse(item), d = mc_elem_dtype_parse(eq + 1);
    if (s < 0) return mc_error("--state-dtype %s: '%s' is not a state kind (param, exp_avg, exp_avg_sq, momentum, step)", arg, item);
    if (d < 0)
      return mc_error("--state-dtype %s: '%s' is not an element dtype (float32, bfloat16, float16, float8_e4m3, "
                      "float8_e5m2, int64)", arg, eq + 1);
    /* int64 holds counters, whose values no float format keeps exactly: never converted */
    if (d == MC_ELEM_I64)
      return mc_error("--state-dtype %s: int64 is no conversion target (only int64 counters are int64, and they stay so)", arg);
    if (s == MC_STATE_STEP)
      return mc_error("--state-dtype %s: state step is an int64 counter and stays int64 (no conversion)", arg);
    if (dt[s] >= 0) return mc_error("--state-dtype %s: state %s is given twice", arg, item);
    dt[s] = d;
  }
  return 0;
}

/* Converts the plan's tensors of each kind named by --state-dtype; a kind no family of the
 * source has is refused, naming it and the kinds it has. */
static int apply_state_dtypes(const int *dt, unsigned have, const char *src, mc_rs_plan *plan) {
  for (int s = 0; s < MC_N_STATES; s++) {
    if (dt[s] < 0 || (have >> s & 1u)) continue;
    char kinds[96] = "";
    for (int k = 0; k < MC_N_STATES; k++)
      if (have >> k & 1u) snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", kinds[0] ? ", " : "", mc_state_name((mc_state)k));
    return mc_error("--state-dtype %s=%s: no family of %s has a %s state (it stores %s)", mc_state_name((mc_state)s),
                    mc_elem_dtype_name(dt[s]), src, mc_state_name((mc_state)s), kinds);
  }
  for (int t = 0; t < plan->n_tensors; t++)
    if (dt[plan->tensors[t].state] >= 0) plan->tensors[t].dtype = dt[plan->tensors[t].state];
  return 0;
}

/* Resolves the target layout: source values, then --config/--layout files and --set
 * assignments in order (the model and the optimizer groups must stay the source's), then the
 * layout flags. */
static int resolve_layout(const mc_config *src_cfg, const layout_args *a, mc_layout *out) {
  mc_config cfg = *src_cfg;
  if (a->cfg_argc > 1) {
    int n = a->cfg_argc;
    char **copy = malloc(sizeof *copy * (size_t)(n + 1));
    if (!copy) return mc_error("out of memory");
    memcpy(copy, a->cfg_argv, sizeof *copy * (size_t)(n + 1));
    int rc = mc_config_overlay_args(&cfg, &n, copy, NULL);
    free(copy);
    if (rc != 0) return -1;
    mc_errlist e;
    mc_errlist_init(&e);
    if (mc_rs_model_diff(&src_cfg->model, &cfg.model, &e))
      return mc_errlist_raise(&e, "--config/--set would change the model");
    /* the optimizer groups fix which state kinds the checkpoint holds: a reshard keeps them */
    if (strcmp(src_cfg->train.optim.groups, cfg.train.optim.groups) != 0)
      return mc_error("--config/--set would change optim.groups '%s' -> '%s' (a reshard keeps the optimizer groups; "
                      "the target's are the source's)",
                      src_cfg->train.optim.groups, cfg.train.optim.groups);
  }
  mc_layout l = cfg.parallel;
  if (a->consolidate) mc_rs_consolidated_layout(&l);
  if (a->tp >= 0) l.tp = a->tp;
  if (a->pp >= 0) l.pp = a->pp;
  if (a->dp >= 0) l.dp = a->dp;
  if (a->ep >= 0) l.ep = a->ep;
  if (a->sp >= 0) l.sp = a->sp;
  if (a->zero >= 0) l.zero = a->zero;
  if (a->split && mc_layout_parse_split(&l, a->split) != 0) return mc_error_context("--split %s", a->split);
  /* a reshard writes the current format: the target takes the current ownership rule, whatever
   * rule the source was saved under (docs/ownership.md) */
  l.own_rule = MC_OWN_BALANCED_V2;
  *out = l;
  return 0;
}

/* The --config/--set argument list lives until exit, whichever way main returns. */
static char **g_cfg_argv;
static void free_cfg_argv(void) { free(g_cfg_argv); }

int main(int argc, char **argv) {
  layout_args la = {-1, -1, -1, -1, -1, -1, NULL, 0, 1, NULL};
  la.cfg_argv = g_cfg_argv = calloc((size_t)argc + 1, sizeof *la.cfg_argv);
  atexit(free_cfg_argv);
  if (!la.cfg_argv) {
    fprintf(stderr, "mcreshard: out of memory\n");
    return 1;
  }
  for (int i = 1; i + 1 < argc; i++) /* --layout FILE is --config FILE */
    if (!strcmp(argv[i], "--layout")) argv[i] = "--config";
  la.cfg_argc = mc_config_take_args(&argc, argv, la.cfg_argv);
  const char *pos[2] = {NULL, NULL}, *export_path = NULL, *import_path = NULL;
  int npos = 0, dry = 0, json = 0, progress = isatty(2), summary = 0, per_node = 8, forecast_flag = 0;
  double node_gbps = 2.0;
  mc_rs_opts o = {.chunk_bytes = (int64_t)16 << 20, .threads = 0};
  mc_rs_export_opts eo;
  mc_rs_export_opts_default(&eo);
  int export_flag = 0, state_dtype[MC_N_STATES], state_dtype_flag = 0;
  for (int s = 0; s < MC_N_STATES; s++) state_dtype[s] = -1;
  cli_parser p;
  cli_init(&p, argc, argv, "h", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    int rc = 0;
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case OPT_TP: rc = parse_int(&p, 1, &la.tp); break;
    case OPT_PP: rc = parse_int(&p, 1, &la.pp); break;
    case OPT_DP: rc = parse_int(&p, 1, &la.dp); break;
    case OPT_EP: rc = parse_int(&p, 1, &la.ep); break;
    case OPT_SP: rc = parse_int(&p, 0, &la.sp); break;
    case OPT_ZERO: rc = parse_int(&p, 0, &la.zero); break;
    case OPT_SPLIT: la.split = p.arg; break;
    case OPT_EXPORT: export_path = p.arg; break;
    case OPT_IMPORT: import_path = p.arg; break;
    case OPT_CHUNK_MB: {
      int mb = 0;
      rc = parse_int(&p, 1, &mb);
      o.chunk_bytes = (int64_t)mb << 20;
      break;
    }
    case OPT_THREADS: rc = parse_int(&p, 1, &o.threads); break;
    case OPT_CONSOLIDATE: la.consolidate = 1; break;
    case OPT_DRY_RUN: dry = 1; break;
    case OPT_JSON: json = 1; break;
    case OPT_FORCE: o.force = 1; break;
    case OPT_NO_PROGRESS: progress = 0; break;
    case OPT_SUMMARY: summary = 1, forecast_flag = 1; break;
    case OPT_NODE_GBPS: rc = parse_gbps(&p, &node_gbps), forecast_flag = 1; break;
    case OPT_RANKS_PER_NODE: rc = parse_int(&p, 1, &per_node), forecast_flag = 1; break;
    case OPT_VERSION: return cli_version("mcreshard", MC_CKPT_FORMAT_VERSION);
    case OPT_STATE_DTYPE: rc = parse_state_dtypes(p.arg, state_dtype), state_dtype_flag = 1; break;
    case OPT_DTYPE:
      export_flag = 1;
      if (strcmp(p.arg, "fp32") && strcmp(p.arg, "bf16")) rc = mc_error("--dtype %s: expected fp32 or bf16", p.arg);
      eo.bf16 = !strcmp(p.arg, "bf16");
      break;
    case OPT_NAMES:
      export_flag = 1;
      if (!strcmp(p.arg, "auto")) eo.names = MC_EXPORT_NAMES_AUTO;
      else if (!strcmp(p.arg, "llama")) eo.names = MC_EXPORT_NAMES_LLAMA;
      else if (!strcmp(p.arg, "megac")) eo.names = MC_EXPORT_NAMES_MEGAC;
      else rc = mc_error("--names %s: expected auto, llama or megac", p.arg);
      break;
    case OPT_MAX_SHARD: {
      export_flag = 1;
      int64_t b = mc_rs_parse_size(p.arg);
      if (b < 0) rc = -1;
      else eo.max_shard_bytes = b;
      break;
    }
    case CLI_ARG:
      if (cli_positional(&p, pos, 2, &npos) == 0) break;
      return cli_bad_usage("mcreshard", usage);
    default: /* CLI_BAD (also a --config/--set left in argv: it has no value) */
      return cli_bad_usage("mcreshard", usage);
    }
    if (rc) return cli_bad_usage("mcreshard", NULL);
  }
  if (la.zero >= 0 && la.zero != 0 && la.zero != 1 && la.zero != 3) {
    fprintf(stderr, "mcreshard: --zero must be 0, 1 or 3, got %d\n", la.zero);
    return 2;
  }
  if (la.sp > 1) {
    fprintf(stderr, "mcreshard: --sp must be 0 or 1\n");
    return 2;
  }
  if ((forecast_flag || json) && !dry) {
    fprintf(stderr, "mcreshard: --json, --summary, --node-gbps and --ranks-per-node describe a --dry-run; without it they mean nothing\n");
    return 2;
  }
  if (export_flag && !export_path) {
    fprintf(stderr, "mcreshard: --dtype, --names and --max-shard-size describe an --export\n");
    return 2;
  }
  if (state_dtype_flag && (export_path || import_path)) {
    fprintf(stderr, "mcreshard: --state-dtype describes a reshard (SRC DST), not --export/--import\n");
    return 2;
  }
  if ((forecast_flag || json) && (export_path || import_path)) {
    fprintf(stderr, "mcreshard: --json, --summary, --node-gbps and --ranks-per-node describe a reshard's dry run, not --export/--import\n");
    return 2;
  }
  eo.dry_run = dry;
  o.progress = progress && !json;

  if (import_path) {
    if (npos != 1 || export_path) {
      usage(stderr);
      return 2;
    }
    mc_config fcfg;
    mc_layout target;
    mc_rs_summary sum;
    if (mc_check_disjoint(pos[0], "destination", import_path, "the imported file") != 0 ||
        mc_rs_safetensors_config(import_path, &fcfg) != 0 || resolve_layout(&fcfg, &la, &target) != 0 ||
        mc_rs_import(import_path, &target, pos[0], &o, dry, &sum) != 0) {
      fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
      return 1;
    }
    if (!dry) mc_rs_summary_print(&sum, "import");
    return 0;
  }
  if (npos != (export_path ? 1 : 2)) {
    usage(stderr);
    return 2;
  }
  /* The output must not be, contain or lie inside the source (run directory or step). */
  const char *out_path = export_path ? export_path : pos[1];
  const char *out_what = export_path ? "--export file" : "destination";
  if (mc_check_disjoint(out_path, out_what, pos[0], "source") != 0) {
    fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
    return 1;
  }
  mc_rs_source *src = NULL;
  /* a dry run plans from the manifest alone; a real run needs (and checks) every rank file */
  if ((dry ? mc_rs_source_open_metadata(pos[0], &src) : mc_rs_source_open(pos[0], &src)) != 0) {
    fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
    return 1;
  }
  if (mc_check_disjoint(out_path, out_what, mc_ckpt_step_dir(mc_rs_source_ckpt(src)), "source step") != 0) {
    fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
    mc_rs_source_close(src);
    return 1;
  }
  int status = 0;
  if (export_path) {
    mc_rs_summary sum;
    if (mc_rs_export(src, export_path, &eo, &o, &sum) != 0) {
      fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
      status = 1;
    } else if (!dry) {
      mc_rs_summary_print(&sum, "export");
    }
    mc_rs_source_close(src);
    return status;
  }
  mc_layout target;
  mc_geometry dg;
  mc_rs_plan plan;
  if (resolve_layout(mc_rs_source_config(src), &la, &target) != 0 ||
      (!dry && mc_rs_check_destination(pos[1], o.force) != 0) || mc_rs_prepare(src, &target, &dg, &plan) != 0) {
    fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
    mc_rs_source_close(src);
    return 1;
  }
  if (apply_state_dtypes(state_dtype, mc_rs_source_states(src), pos[0], &plan) != 0) {
    fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
    mc_rs_plan_free(&plan);
    mc_geometry_free(&dg);
    mc_rs_source_close(src);
    return 1;
  }
  if (dry) {
    mc_rs_forecast fc;
    if (mc_rs_plan_forecast(&plan, &dg, node_gbps, per_node, &fc) != 0) {
      fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
      status = 1;
    } else if (json) {
      char *j = mc_rs_plan_json(&plan, mc_rs_source_geometry(src), &dg, !summary, &fc);
      if (j) printf("%s\n", j);
      else status = 1;
      free(j);
    } else {
      mc_ckpt *ck = mc_rs_source_ckpt(src);
      mc_rs_plan_print(stdout, &plan, mc_rs_source_geometry(src), &dg, !summary);
      mc_rs_plan_print_dtypes(stdout, &plan);
      printf("source checkpoint: %d shards, %d rank files; manifest %zu bytes (%.1f MiB), planned from it alone\n",
             mc_ckpt_n_shards(ck), plan.n_src_writers, strlen(mc_ckpt_manifest_json(ck)),
             (double)strlen(mc_ckpt_manifest_json(ck)) / (1 << 20));
      mc_rs_forecast_print(stdout, &fc, "target checkpoint");
    }
  } else {
    mc_rs_summary sum;
    if (mc_rs_write(src, &dg, &plan, pos[1], &o, &sum) != 0) {
      fprintf(stderr, "mcreshard: %s\n", mc_errmsg());
      status = 1;
    } else {
      char ls[600], ld[600];
      mc_rs_layout_format(&mc_rs_source_geometry(src)->layout, ls, sizeof ls);
      mc_rs_layout_format(&dg.layout, ld, sizeof ld);
      printf("resharded %s (%s) -> %s (%s)\n", pos[0], ls, pos[1], ld);
      mc_rs_plan_print_dtypes(stdout, &plan);
      mc_rs_summary_print(&sum, "reshard");
    }
  }
  mc_rs_plan_free(&plan);
  mc_geometry_free(&dg);
  mc_rs_source_close(src);
  return status;
}
