/* mcaudit: what a checkpoint holds, who owns it, and whether it is intact.
 *
 *   mcaudit CKPT [--verify] [--json] [--map FILE.svg|FILE.html] [--no-progress]
 *                [--config FILE] [--set section.key=value]
 *
 * CKPT is a run directory (its `latest` is used) or a step directory. Prints the layout,
 * the stage map, and per family: global shape, placement rule, stage, optimizer, shards and
 * owners, and per state kind the family has (param and its optimizer's: exp_avg and
 * exp_avg_sq, or momentum) its stored element dtype and a layout-independent content digest
 * (over the stored bytes); totals per rank and per memory
 * category. Checks: primaries tile every family, shards are the owners' hyperslabs, HDF5
 * attributes agree with the manifest, and with --verify every SHA-256. Any failed check:
 * exit status 1 and the list of problems. With --config/--set the checkpoint's model,
 * optimizer groups and layout must also be the configuration's. docs/audit.md. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_opts.h"
#include "core/dtype.h"
#include "core/optim_groups.h"
#include "plan/plan.h"
#include "reshard/audit.h"
#include "reshard/ownmap.h"
#include "reshard/plan_print.h"

enum { OPT_VERIFY = CLI_LONG, OPT_JSON, OPT_MAP, OPT_NO_PROGRESS, OPT_VERSION };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"json", no_argument, NULL, OPT_JSON},
    {"map", required_argument, NULL, OPT_MAP},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f, "usage: mcaudit CKPT [--verify] [--json] [--map FILE.svg|FILE.html] [--no-progress]\n"
             "               [--config FILE] [--set section.key=value]\n"
             "       mcaudit --help | --version\n"
             "  CKPT: a run directory (uses latest) or a step directory\n"
             "  --verify        recompute every shard's SHA-256 and compare it with the manifest\n"
             "  --json          print the report as one JSON document\n"
             "  --map FILE      draw the ownership map (ranks x families) as FILE.svg or FILE.html\n"
             "  --no-progress   no progress bar while the shards are read (none off a terminal anyway)\n"
             "  --version       print the MegaC version and checkpoint format, then exit\n"
             "  --config/--set: also check that the checkpoint's model, optimizer groups and layout are\n"
             "                  the ones this configuration describes (defaults, then files and\n"
             "                  assignments in order)\n");
}

/* The optimizer of every family under the configuration's optim.groups against the
 * checkpoint's (a resume keeps them): one problem naming the first family that differs and
 * how many do. Families are compared, not the text, so equivalent rules agree. */
static void check_groups_against_config(const mc_geometry *g, const mc_config *want, mc_errlist *problems) {
  mc_family_set fs;
  if (mc_families_build(&g->model, g->layout.sp, &fs) != 0) {
    mc_errlist_add(problems, "checkpoint vs --config: %s", mc_errmsg());
    return;
  }
  if (mc_optim_groups_assign(want->train.optim.groups, &fs) != 0) {
    mc_errlist_add(problems, "checkpoint vs --config: %s", mc_errmsg());
  } else {
    int first = -1, n = 0;
    for (int f = 0; f < fs.n && f < g->fams.n; f++)
      if (fs.f[f].opt != g->fams.f[f].opt) {
        if (first < 0) first = f;
        n++;
      }
    if (n)
      mc_errlist_add(problems, "checkpoint vs --config: family %s is trained by %s in the checkpoint, by %s under the "
                     "config's optim.groups '%s' (%d famil%s differ)",
                     g->fams.f[first].name, mc_opt_name(g->fams.f[first].opt), mc_opt_name(fs.f[first].opt),
                     want->train.optim.groups, n, n == 1 ? "y" : "ies");
  }
  mc_families_free(&fs);
}

/* The checkpoint against a run configuration: the model (every key the library compares),
 * the optimizer groups and the layout (degrees, ZeRO, SP and the resulting stage map). */
static void check_against_config(mc_rs_source *src, const mc_config *want, mc_errlist *problems) {
  const mc_geometry *g = mc_rs_source_geometry(src);
  if (mc_ckpt_check_model(mc_rs_source_ckpt(src), &want->model) != 0)
    mc_errlist_add(problems, "checkpoint vs --config: %s", mc_errmsg());
  else check_groups_against_config(g, want, problems);
  const mc_layout *h = &g->layout, *w = &want->parallel;
  const char *keys[] = {"tp", "pp", "dp", "ep", "sp", "zero"};
  const int have[] = {h->tp, h->pp, h->dp, h->ep, h->sp, h->zero}, wanted[] = {w->tp, w->pp, w->dp, w->ep, w->sp, w->zero};
  int same = 1;
  for (int i = 0; i < 6; i++)
    if (have[i] != wanted[i]) {
      mc_errlist_add(problems, "checkpoint vs --config: parallel.%s is %d in the checkpoint, %d in the config", keys[i], have[i],
                     wanted[i]);
      same = 0;
    }
  if (!same) return;
  mc_stage_map sm;
  if (mc_stage_map_build(&want->model, w, &sm) != 0) {
    mc_errlist_add(problems, "checkpoint vs --config: %s", mc_errmsg());
    return;
  }
  for (int s = 0; s < sm.pp; s++)
    if (sm.first[s] != g->stages.first[s] || sm.count[s] != g->stages.count[s]) {
      mc_errlist_add(problems, "checkpoint vs --config: stage %d holds layers %d-%d in the checkpoint, %d-%d under the config's %s split",
                     s, g->stages.first[s], g->stages.first[s] + g->stages.count[s] - 1, sm.first[s], sm.first[s] + sm.count[s] - 1,
                     mc_split_name(w->split));
      return;
    }
}

static void slab_of(const mc_ckpt_shard *s, char *buf, int cap) {
  const mc_box b = mc_box_make(s->ndim, s->start, s->count);
  mc_box_format(&b, buf, cap);
}

static void shape_of(const mc_family *f, char *buf, int cap) {
  int off = snprintf(buf, (size_t)cap, "[");
  for (int d = 0; d < f->ndim; d++) off += snprintf(buf + off, (size_t)(cap - off), "%s%lld", d ? ", " : "", (long long)f->shape[d]);
  snprintf(buf + off, (size_t)(cap - off), "]");
}

static void print_text(mc_rs_source *src, const mc_audit *a, const int *idx) {
  mc_ckpt *ck = mc_rs_source_ckpt(src);
  const mc_geometry *g = mc_rs_source_geometry(src);
  char lay[600], buf[256];
  mc_rs_layout_format(&g->layout, lay, sizeof lay);
  printf("checkpoint %s  step %lld  manifest sha256 %s\n", mc_ckpt_step_dir(ck), (long long)mc_ckpt_step(ck),
         mc_ckpt_root_hash(ck));
  printf("model: pattern %s, %d families\nlayout: %s (world %d)\nstages:\n", g->model.pattern, g->fams.n, lay, g->world);
  for (int s = 0; s < g->stages.pp; s++) {
    int a0 = g->stages.first[s], n = g->stages.count[s];
    printf("  stage %d: layers %d-%d (%.*s)%s%s, %.3g MFLOP/token forward\n", s, a0, a0 + n - 1, n, g->model.pattern + a0,
           s == 0 ? " + embed" : "", s == g->stages.pp - 1 ? " + final norm, head" : "", g->stages.cost[s] / 1e6);
  }
  printf("families:\n");
  for (int f = 0; f < g->fams.n; f++) {
    const mc_family *fam = &g->fams.f[f];
    char rule[64];
    mc_placement_rule(g, f, rule, sizeof rule);
    shape_of(fam, buf, sizeof buf);
    printf("  %-28s %-16s %-28s stage %d  %s\n", fam->name, buf, rule, mc_family_stage(g, f), mc_opt_name(fam->opt));
    for (int st = 0; st < MC_N_STATES; st++) {
      if (!(a->states & (1u << st)) || !mc_family_has_state(fam, (mc_state)st)) continue;
      /* the element dtype it is stored in (docs/checkpoint.md, "Element dtypes") */
      int fk = mc_ckpt_find_family(ck, fam->name);
      printf("    %-10s %-11s", mc_state_name((mc_state)st), mc_elem_dtype_name(mc_ckpt_state_dtype(ck, fk, (mc_state)st)));
      for (int r = 0; r < g->world; r++) {
        int k = idx[((size_t)f * MC_N_STATES + (size_t)st) * (size_t)g->world + (size_t)r];
        if (k < 0) continue;
        const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
        slab_of(s, buf, sizeof buf);
        printf(" r%d%s", s->rank, buf);
        if (s->n_replicas > 1) {
          printf("{");
          for (int k = 0; k < s->n_replicas; k++) printf("%s%d", k ? "," : "", s->replicas[k]);
          printf("}");
        }
      }
      if (a->digests) printf("  digest %.16s", a->digest[f][st]);
      printf("\n");
    }
  }
  mc_ckpt_file_info fi;
  printf("files (format %d):\n", mc_ckpt_format_version(ck));
  for (int i = 0; mc_ckpt_file_at(ck, i, &fi) == 0; i++) {
    printf("  %-12s rank %-5d %14lld bytes", fi.name, fi.rank, (long long)fi.bytes);
    if (fi.piece_bytes > 0)
      printf("  %lld pieces of %lld  pieces_sha256 %s\n", (long long)fi.n_pieces, (long long)fi.piece_bytes, fi.digest);
    else
      printf("  sha256 %s\n", fi.digest[0] ? fi.digest : "(none: size checked only)");
  }
  printf("totals per rank (bytes held, replicas included; stored = written by this rank):\n  %-5s", "rank");
  for (int st = 0; st < MC_N_STATES; st++)
    if (a->states & (1u << st)) printf(" %12s", mc_state_name((mc_state)st));
  printf(" %12s %12s |", "optimizer", "stored");
  for (int c = 0; c < MC_AUDIT_N_CATS; c++) printf(" %s", mc_mem_cat_name(mc_audit_cats[c]));
  printf("\n");
  for (int r = 0; r < a->world; r++) {
    printf("  %-5d", r);
    for (int st = 0; st < MC_N_STATES; st++)
      if (a->states & (1u << st)) printf(" %12lld", (long long)a->held[r * MC_N_STATES + st]);
    printf(" %12lld %12lld |", (long long)a->optimizer[r], (long long)a->stored[r]);
    for (int c = 0; c < MC_AUDIT_N_CATS; c++) printf(" %lld", (long long)a->cat[r * MC_MEM_COUNT + mc_audit_cats[c]]);
    printf("\n");
  }
  printf("balance (%s ownership rule): optimizer state largest/mean %.4f (rank %d), stored largest/mean %.4f\n",
         mc_own_rule_name(g->layout.own_rule), a->optimizer_balance, a->optimizer_largest_rank, a->stored_balance);
  printf("checks: each file's digests before it is parsed, tiling, ownership (mc_shard_of), HDF5 attributes vs manifest%s%s\n",
         a->verified ? ", SHA-256 of every shard" : " (hashes not verified: pass --verify)",
         a->digests ? ", content digests" : "");
}

static char *json_report(mc_rs_source *src, const mc_audit *a, const int *idx) {
  mc_ckpt *ck = mc_rs_source_ckpt(src);
  const mc_geometry *g = mc_rs_source_geometry(src);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "checkpoint", mc_ckpt_step_dir(ck));
  cJSON_AddNumberToObject(root, "step", (double)mc_ckpt_step(ck));
  cJSON_AddStringToObject(root, "manifest_sha256", mc_ckpt_root_hash(ck));
  cJSON_AddNumberToObject(root, "format_version", mc_ckpt_format_version(ck));
  cJSON *files = cJSON_AddArrayToObject(root, "files");
  mc_ckpt_file_info fi;
  for (int i = 0; mc_ckpt_file_at(ck, i, &fi) == 0; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", fi.name);
    cJSON_AddNumberToObject(o, "rank", fi.rank);
    cJSON_AddNumberToObject(o, "bytes", (double)fi.bytes);
    if (fi.piece_bytes > 0) {
      cJSON_AddNumberToObject(o, "piece_bytes", (double)fi.piece_bytes);
      cJSON_AddNumberToObject(o, "n_pieces", (double)fi.n_pieces);
      cJSON_AddStringToObject(o, "pieces_sha256", fi.digest);
    } else if (fi.digest[0]) {
      cJSON_AddStringToObject(o, "sha256", fi.digest);
    }
    cJSON_AddItemToArray(files, o);
  }
  cJSON_AddItemToObject(root, "layout", mc_rs_layout_json(g));
  cJSON *stages = cJSON_AddArrayToObject(root, "stages");
  for (int s = 0; s < g->stages.pp; s++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "first_layer", g->stages.first[s]);
    cJSON_AddNumberToObject(o, "n_layers", g->stages.count[s]);
    cJSON_AddNumberToObject(o, "fwd_flops_per_token", g->stages.cost[s]);
    cJSON_AddItemToArray(stages, o);
  }
  cJSON *fams = cJSON_AddArrayToObject(root, "families");
  for (int f = 0; f < g->fams.n; f++) {
    const mc_family *fam = &g->fams.f[f];
    cJSON *o = cJSON_CreateObject();
    char rule[64];
    mc_placement_rule(g, f, rule, sizeof rule);
    cJSON_AddStringToObject(o, "name", fam->name);
    double shp[3];
    for (int d = 0; d < fam->ndim; d++) shp[d] = (double)fam->shape[d];
    cJSON_AddItemToObject(o, "shape", cJSON_CreateDoubleArray(shp, fam->ndim));
    cJSON_AddStringToObject(o, "placement_rule", rule);
    cJSON_AddNumberToObject(o, "stage", mc_family_stage(g, f));
    cJSON_AddStringToObject(o, "optimizer", mc_opt_name(fam->opt));
    cJSON *dig = cJSON_AddObjectToObject(o, "digest_sha256");
    cJSON *dts = cJSON_AddObjectToObject(o, "dtype"); /* each state kind's stored element dtype */
    for (int st = 0, fk = mc_ckpt_find_family(ck, fam->name); st < MC_N_STATES; st++)
      if ((a->states & (1u << st)) && mc_family_has_state(fam, (mc_state)st))
        cJSON_AddStringToObject(dts, mc_state_name((mc_state)st), mc_elem_dtype_name(mc_ckpt_state_dtype(ck, fk, (mc_state)st)));
    cJSON *shards = cJSON_AddArrayToObject(o, "shards");
    for (int st = 0; st < MC_N_STATES; st++)
      if ((a->states & (1u << st)) && mc_family_has_state(fam, (mc_state)st) && a->digests)
        cJSON_AddStringToObject(dig, mc_state_name((mc_state)st), a->digest[f][st]);
    for (int i = 0; i < MC_N_STATES * g->world; i++) {
      int k = idx[(size_t)f * MC_N_STATES * (size_t)g->world + (size_t)i];
      if (k < 0) continue;
      const mc_ckpt_shard *s = mc_ckpt_shard_at(ck, k);
      cJSON *so = cJSON_CreateObject();
      cJSON_AddStringToObject(so, "state", mc_state_name(s->state));
      cJSON_AddNumberToObject(so, "rank", s->rank);
      double st0[3], ct0[3];
      for (int d = 0; d < s->ndim; d++) st0[d] = (double)s->start[d], ct0[d] = (double)s->count[d];
      cJSON_AddItemToObject(so, "start", cJSON_CreateDoubleArray(st0, s->ndim));
      cJSON_AddItemToObject(so, "count", cJSON_CreateDoubleArray(ct0, s->ndim));
      cJSON_AddItemToObject(so, "replicas", cJSON_CreateIntArray(s->replicas, s->n_replicas));
      cJSON_AddStringToObject(so, "file", s->file);
      cJSON_AddItemToArray(shards, so);
    }
    cJSON_AddItemToArray(fams, o);
  }
  cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
  for (int r = 0; r < a->world; r++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON *held = cJSON_AddObjectToObject(o, "held_bytes");
    for (int st = 0; st < MC_N_STATES; st++)
      if (a->states & (1u << st)) cJSON_AddNumberToObject(held, mc_state_name((mc_state)st), (double)a->held[r * MC_N_STATES + st]);
    cJSON_AddNumberToObject(o, "optimizer_bytes", (double)a->optimizer[r]);
    cJSON_AddNumberToObject(o, "stored_bytes", (double)a->stored[r]);
    cJSON *cats = cJSON_AddObjectToObject(o, "categories");
    for (int c = 0; c < MC_AUDIT_N_CATS; c++)
      cJSON_AddNumberToObject(cats, mc_mem_cat_name(mc_audit_cats[c]), (double)a->cat[r * MC_MEM_COUNT + mc_audit_cats[c]]);
    cJSON_AddItemToArray(ranks, o);
  }
  cJSON *bal = cJSON_AddObjectToObject(root, "balance");
  cJSON_AddStringToObject(bal, "ownership_rule", mc_own_rule_name(g->layout.own_rule));
  cJSON_AddNumberToObject(bal, "optimizer_largest_over_mean", a->optimizer_balance);
  cJSON_AddNumberToObject(bal, "optimizer_largest_rank", a->optimizer_largest_rank);
  cJSON_AddNumberToObject(bal, "stored_largest_over_mean", a->stored_balance);
  cJSON_AddBoolToObject(root, "verified", a->verified);
  cJSON *pr = cJSON_AddArrayToObject(root, "problems");
  int shown = a->problems.n < MC_ERRLIST_MAX ? a->problems.n : MC_ERRLIST_MAX;
  for (int i = 0; i < shown; i++) cJSON_AddItemToArray(pr, cJSON_CreateString(a->problems.msg[i]));
  cJSON_AddNumberToObject(root, "n_problems", a->problems.n);
  cJSON_AddBoolToObject(root, "ok", a->problems.n == 0);
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  return s;
}

int main(int argc, char **argv) {
  const char *ckpt = NULL, *map = NULL;
  int verify = 0, json = 0, progress = isatty(2), check_config = 0;
  mc_config want;
  if (mc_config_default(&want) != 0 || mc_config_overlay_args(&want, &argc, argv, &check_config) != 0) {
    fprintf(stderr, "mcaudit: %s\n", mc_errmsg());
    return 2;
  }
  cli_parser p;
  int npos = 0;
  cli_init(&p, argc, argv, "h", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case OPT_VERIFY: verify = 1; break;
    case OPT_JSON: json = 1; break;
    case OPT_MAP: map = p.arg; break;
    case OPT_NO_PROGRESS: progress = 0; break;
    case OPT_VERSION: return cli_version("mcaudit", MC_CKPT_FORMAT_VERSION);
    case CLI_ARG:
      if (cli_positional(&p, &ckpt, 1, &npos) == 0) break;
      return cli_bad_usage("mcaudit", usage);
    default:
      return cli_bad_usage("mcaudit", usage);
    }
  }
  if (!ckpt) {
    usage(stderr);
    return 2;
  }
  mc_rs_source *src = NULL;
  if (mc_rs_source_open(ckpt, &src) != 0) {
    if (json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "checkpoint", ckpt);
      cJSON_AddBoolToObject(o, "ok", 0);
      cJSON *pr = cJSON_AddArrayToObject(o, "problems");
      cJSON_AddItemToArray(pr, cJSON_CreateString(mc_errmsg()));
      char *s = cJSON_Print(o);
      printf("%s\n", s);
      free(s);
      cJSON_Delete(o);
    }
    fprintf(stderr, "mcaudit: 1 problem:\n  - %s\n", mc_errmsg());
    return 1;
  }
  mc_audit a;
  if (mc_audit_run(src, verify, progress && !json, &a) != 0) {
    fprintf(stderr, "mcaudit: %s\n", mc_errmsg());
    mc_rs_source_close(src);
    return 1;
  }
  if (check_config) check_against_config(src, &want, &a.problems);
  int *idx = NULL;
  if (mc_rs_shard_index(mc_rs_source_ckpt(src), mc_rs_source_geometry(src), &idx) != 0) {
    fprintf(stderr, "mcaudit: %s\n", mc_errmsg());
    mc_audit_free(&a);
    mc_rs_source_close(src);
    return 1;
  }
  if (json) {
    char *s = json_report(src, &a, idx);
    printf("%s\n", s ? s : "{}");
    free(s);
  } else {
    print_text(src, &a, idx);
  }
  free(idx);
  int status = a.problems.n ? 1 : 0;
  if (map) {
    char title[MC_PATH_MAX + 32];
    snprintf(title, sizeof title, "ownership of %s", mc_ckpt_step_dir(mc_rs_source_ckpt(src)));
    if (mc_rs_ownership_map(mc_rs_source_geometry(src), map, title) != 0) {
      fprintf(stderr, "mcaudit: %s\n", mc_errmsg());
      status = 1;
    } else if (!json) {
      printf("map written to %s\n", map);
    }
  }
  if (a.problems.n) {
    int shown = a.problems.n < MC_ERRLIST_MAX ? a.problems.n : MC_ERRLIST_MAX;
    fprintf(stderr, "mcaudit: %d problem%s:\n", a.problems.n, a.problems.n == 1 ? "" : "s");
    for (int i = 0; i < shown; i++) fprintf(stderr, "  - %s\n", a.problems.msg[i]);
    if (shown < a.problems.n) fprintf(stderr, "  ... and %d more\n", a.problems.n - shown);
  } else if (!json) {
    printf("ok: no problems found\n");
  }
  mc_audit_free(&a);
  mc_rs_source_close(src);
  return status;
}
