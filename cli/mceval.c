/* mceval: the loss of a checkpoint on a token file.
 *
 *   mceval CKPT --data FILE [--batches N] [--split val|all] [--device cpu|cuda] [--no-verify] [--json]
 *          [--config F] [--set k=v] [--dump-logits FILE.npy]
 *
 * CKPT is a run directory (its latest checkpoint) or a step_N directory, written under any
 * layout: every family is read whole through the checkpoint library's hyperslab reads and
 * evaluated on one process. The windows, split and micro-batching are the run's recorded
 * config (model.seq_len, data.val_fraction, train.micro_batch), so on the run's dataset
 * `--split val` (the default) with N = train.eval_batches prints the trainer's val_loss
 * for that step, digit for digit when computed on the run's device (--device cpu, the
 * default, or --device cuda). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_opts.h"
#include "ckpt/checkpoint.h"
#include "core/json_num.h"
#include "train/data.h"
#include "train/device.h"
#include "train/net.h"
#include "train/net_blocks.h" /* --dump-logits reads the network's logits buffer */
#include "train/trainer.h"
#include "util/error.h"

/* --config/--set are here only to name them when their value is missing (main moves them
 * out of argv first, for eval to apply on the checkpoint's config). */
enum { OPT_DATA = CLI_LONG, OPT_BATCHES, OPT_SPLIT, OPT_DEVICE, OPT_NO_VERIFY, OPT_JSON, OPT_VERSION, OPT_CONFIG, OPT_SET, OPT_DUMP_LOGITS };
static const struct option LONG_OPTS[] = {
    {"help", no_argument, NULL, 'h'},
    {"data", required_argument, NULL, OPT_DATA},
    {"batches", required_argument, NULL, OPT_BATCHES},
    {"split", required_argument, NULL, OPT_SPLIT},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"no-verify", no_argument, NULL, OPT_NO_VERIFY},
    {"json", no_argument, NULL, OPT_JSON},
    {"version", no_argument, NULL, OPT_VERSION},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"set", required_argument, NULL, OPT_SET},
    {"dump-logits", required_argument, NULL, OPT_DUMP_LOGITS},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mceval CKPT --data FILE [--batches N] [--split val|all] [--device cpu|cuda] [--no-verify]\n"
          "              [--json] [--config FILE] [--set section.key=value] [--dump-logits FILE.npy]\n"
          "       mceval --help | --version\n"
          "  CKPT         a run directory (its latest checkpoint) or a step_N directory\n"
          "  --data       HDF5 token dataset made by mcdata\n"
          "  --batches    global batches of windows to score (default train.eval_batches; 0 = all)\n"
          "  --split      val: the held-out windows (default); all: every window of the file\n"
          "  --device     where to compute: cpu (default) or cuda\n"
          "  --no-verify  read the shards without checking their SHA-256\n"
          "  --json       print the result as one JSON document (loss, perplexity, tokens, ...)\n"
          "  --version    print the MegaC version and checkpoint format, then exit\n"
          "  --config/--set  overlay the checkpoint's recorded config (windows, split, micro-batch,\n"
          "             eval_batches; data.path is the default of --data); the model must not change\n"
          "  --dump-logits FILE.npy  the logits of the first micro-batch scored: float32 [n_seq, seq_len,\n"
          "             vocab_size] (padded vocabulary columns left out), and its input tokens, int32\n"
          "             [n_seq, seq_len], in FILE minus .npy plus .tokens.npy (docs/export.md)\n");
}

/* --dump-logits: one .npy file (format 1.0: magic, header dict padded to 64 bytes, raw data). */
static int write_npy(const char *path, const char *descr, const int64_t *shape, int ndim, const void *data, size_t bytes) {
  char hdr[256], shp[128] = "";
  int n = 0;
  for (int i = 0; i < ndim; i++) n += snprintf(shp + n, sizeof shp - (size_t)n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }", descr, shp,
                    ndim == 1 ? "," : "");
  int total = 10 + hl + 1, pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f) return mc_error("--dump-logits: cannot create %s", path);
  unsigned short hlen = (unsigned short)(hl + pad + 1);
  int ok = fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && fputc(hlen & 0xff, f) != EOF && fputc(hlen >> 8, f) != EOF &&
           fwrite(hdr, 1, (size_t)hl, f) == (size_t)hl;
  for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF && fwrite(data, 1, bytes, f) == bytes;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : mc_error("--dump-logits: cannot write %s", path);
}

/* The logits of the first micro-batch mc_eval_loss scores (the same windows: sequence k of n
 * is window floor(k * avail / n) of the split), real vocabulary columns only. */
static int dump_logits(mc_net *net, const mc_data *d, int split_all, int64_t n, int micro_batch, const char *path) {
  const int T = d->seq_len, V = net->m.vocab_size, Vp = net->par.Vpl;
  int64_t avail = split_all ? d->n_windows : d->n_val;
  if (avail < 1) return mc_error("--dump-logits: the split has no window");
  if (n <= 0 || n > avail) n = avail;
  int cnt = (int)(n < micro_batch ? n : micro_batch);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)cnt * (size_t)(T + 1));
  int32_t *in = malloc(sizeof(int32_t) * (size_t)cnt * (size_t)T);
  float *lg = malloc(sizeof(float) * (size_t)cnt * (size_t)T * (size_t)Vp);
  int rc = tok && in && lg ? 0 : mc_error("--dump-logits: out of memory");
  for (int i = 0; i < cnt && rc == 0; i++) {
    int64_t k = (int64_t)i * avail / n;
    rc = split_all ? mc_data_read_window(d, k, tok + (int64_t)i * (T + 1)) : mc_data_read_val(d, k, 1, tok + (int64_t)i * (T + 1));
  }
  mc_net_stats st;
  if (rc == 0) rc = mc_net_forward(net, tok, cnt, &st);
  if (rc == 0) {
    net->be->to_host(net->be, lg, net->logits, sizeof(float) * (size_t)cnt * (size_t)T * (size_t)Vp);
    for (int64_t r = 0; r < (int64_t)cnt * T; r++) memmove(lg + r * V, lg + r * Vp, sizeof(float) * (size_t)V);
    for (int i = 0; i < cnt; i++) memcpy(in + (int64_t)i * T, tok + (int64_t)i * (T + 1), sizeof(int32_t) * (size_t)T);
    int64_t shape[3] = {cnt, T, V};
    char tpath[MC_PATH_MAX + 32];
    size_t pl = strlen(path);
    snprintf(tpath, sizeof tpath, "%.*s.tokens.npy", (int)(pl > 4 && !strcmp(path + pl - 4, ".npy") ? pl - 4 : pl), path);
    rc = write_npy(path, "<f4", shape, 3, lg, sizeof(float) * (size_t)cnt * (size_t)T * (size_t)V);
    if (rc == 0) rc = write_npy(tpath, "<i4", shape, 2, in, sizeof(int32_t) * (size_t)cnt * (size_t)T);
    if (rc == 0) fprintf(stderr, "mceval: logits [%d, %d, %d] -> %s, tokens -> %s\n", cnt, T, V, path, tpath);
  }
  free(tok), free(in), free(lg);
  return rc;
}

/* --json: one JSON document on stdout, its numbers as the shortest text that reads back as
 * the same double (core/json_num.h: cJSON alone prints 15 digits when that is within about
 * an ulp, so the loss would not equal the trainer's val_loss bit for bit). */
static int print_json(double loss, int64_t tokens, int64_t batches, int64_t sequences, int split_all, int64_t step,
                      const char *ckpt_dir, const char *data_path, const char *backend, int verify) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return mc_error("out of memory");
  cJSON_AddNumberToObject(o, "loss", loss);
  cJSON_AddNumberToObject(o, "perplexity", exp(loss));
  cJSON_AddNumberToObject(o, "tokens", (double)tokens);
  cJSON_AddNumberToObject(o, "sequences", (double)sequences);
  cJSON_AddNumberToObject(o, "batches", (double)batches);
  cJSON_AddStringToObject(o, "split", split_all ? "all" : "val");
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddStringToObject(o, "checkpoint", ckpt_dir);
  cJSON_AddStringToObject(o, "data", data_path);
  cJSON_AddStringToObject(o, "backend", backend);
  cJSON_AddBoolToObject(o, "verified", verify);
  char *text = mc_json_print_exact(o, 1);
  cJSON_Delete(o);
  if (!text) return -1;
  printf("%s\n", text);
  free(text);
  return 0;
}

static int eval(const char *ckpt_path, const char *data_path, int64_t batches, int split_all, int verify,
                const char *device, int json, int cfg_argc, char **cfg_argv, const char *dump) {
  mc_backend *be = mc_train_backend(device, "fp32", 0); /* GPU 0; before any reading: a bad device fails fast */
  if (!be) { /* the library's message speaks of train.device: name this program's option */
    char why[MC_ERRMSG_MAX];
    const char *m = mc_errmsg(), *lead = "train.device=cuda but ", *fix = "set train.device=cpu";
    if (!strncmp(m, lead, strlen(lead))) m += strlen(lead);
    const char *at = strstr(m, fix);
    if (at) snprintf(why, sizeof why, "%.*suse --device cpu%s", (int)(at - m), m, at + strlen(fix));
    else snprintf(why, sizeof why, "%s", m);
    return mc_error("--device %s: %s", device, why);
  }
  mc_ckpt_open_opts oo;
  mc_ckpt_open_opts_default(&oo);
  oo.verify = verify;
  mc_ckpt *ck = NULL;
  if (mc_ckpt_open(ckpt_path, &oo, &ck) != 0) return -1;
  mc_config cfg;
  mc_geometry geo;
  int have_geo = 0, rc = mc_ckpt_config(ck, &cfg);
  /* --config/--set overlay the recorded config (e.g. data.val_fraction, train.micro_batch,
   * train.eval_batches, data.path); a changed model key fails the model check below. */
  if (rc == 0 && cfg_argc > 1) rc = mc_config_overlay_args(&cfg, &cfg_argc, cfg_argv, NULL);
  if (rc == 0 && !data_path) data_path = cfg.data.path;
  if (rc == 0) {
    /* Evaluate on one process whatever layout wrote the checkpoint. */
    mc_layout one;
    memset(&one, 0, sizeof one);
    one.tp = one.pp = one.dp = one.ep = 1;
    one.split = MC_SPLIT_EQUAL;
    rc = mc_geometry_build(&cfg.model, &one, NULL, 1, &geo);
    have_geo = rc == 0;
  }
  if (rc == 0) rc = mc_ckpt_check_model(ck, &cfg.model);
  /* The model is sized from the recorded config: check it against the shards before any
   * tensor is allocated. */
  if (rc == 0) rc = mc_ckpt_check_families(ck, &geo.fams);
  mc_net *net = NULL;
  if (rc == 0 && !(net = mc_net_create_on(&geo, 0, cfg.train.seed, be))) rc = -1;
  if (rc == 0) rc = mc_net_load(net, &geo, ck);
  mc_data d;
  memset(&d, 0, sizeof d);
  d.id = d.file = -1;
  if (rc == 0) rc = mc_data_open(&d, data_path, cfg.model.seq_len, split_all ? 0.0 : cfg.data.val_fraction);
  if (rc == 0) rc = mc_data_check_vocab(&d, cfg.model.vocab_size);
  double loss = 0;
  int64_t tokens = 0;
  int64_t n = batches < 0 ? (int64_t)cfg.train.eval_batches * cfg.train.global_batch : batches * cfg.train.global_batch;
  if (rc == 0 && dump) rc = dump_logits(net, &d, split_all, n, cfg.train.micro_batch, dump);
  if (rc == 0) rc = mc_eval_loss(net, &d, split_all, n, cfg.train.micro_batch, &loss, &tokens);
  if (rc == 0 && json)
    rc = print_json(loss, tokens, batches < 0 ? cfg.train.eval_batches : batches, tokens / cfg.model.seq_len, split_all,
                    mc_ckpt_step(ck), mc_ckpt_step_dir(ck), data_path, be->name, verify);
  else if (rc == 0)
    printf("loss=%.17g tokens=%lld split=%s step=%lld checkpoint=%s data=%s\n", loss, (long long)tokens,
           split_all ? "all" : "val", (long long)mc_ckpt_step(ck), mc_ckpt_step_dir(ck), data_path);
  mc_data_close(&d);
  if (net) mc_net_free(net);
  if (have_geo) mc_geometry_free(&geo);
  mc_ckpt_close(ck);
  return rc;
}

static int eval_main(int argc, char **argv, int cfg_argc, char **cfg_argv);

int main(int argc, char **argv) {
  char **cfg_argv = calloc((size_t)argc + 1, sizeof *cfg_argv);
  if (!cfg_argv) return 1;
  int cfg_argc = mc_config_take_args(&argc, argv, cfg_argv);
  const int rc = eval_main(argc, argv, cfg_argc, cfg_argv);
  free(cfg_argv); /* every way out of eval_main comes back here */
  return rc;
}

/* The command line without --config/--set (those are cfg_argv), parsed and run. */
static int eval_main(int argc, char **argv, int cfg_argc, char **cfg_argv) {
  const char *ckpt = NULL, *data = NULL;
  int64_t batches = -1;
  int split_all = 0, verify = 1, json = 0;
  const char *device = "cpu", *dump = NULL;
  cli_parser p;
  int npos = 0;
  cli_init(&p, argc, argv, "h", LONG_OPTS);
  for (int c; (c = cli_next(&p)) != -1;) {
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case OPT_DATA:
      data = p.arg;
      break;
    case OPT_BATCHES:
      if (cli_int(p.opt, p.arg, 0, INT64_MAX, "a non-negative integer", &batches) != 0) return cli_bad_usage("mceval", NULL);
      break;
    case OPT_SPLIT:
      if (strcmp(p.arg, "val") && strcmp(p.arg, "all")) {
        fprintf(stderr, "mceval: --split %s: expected val or all\n", p.arg);
        return 2;
      }
      split_all = !strcmp(p.arg, "all");
      break;
    case OPT_DEVICE:
      if (strcmp(p.arg, "cpu") && strcmp(p.arg, "cuda")) {
        fprintf(stderr, "mceval: --device %s: expected cpu or cuda\n", p.arg);
        return 2;
      }
      device = p.arg;
      break;
    case OPT_NO_VERIFY:
      verify = 0;
      break;
    case OPT_JSON:
      json = 1;
      break;
    case OPT_VERSION:
      return cli_version("mceval", MC_CKPT_FORMAT_VERSION);
    case OPT_DUMP_LOGITS:
      dump = p.arg;
      break;
    case CLI_ARG:
      if (cli_positional(&p, &ckpt, 1, &npos) == 0) break;
      return cli_bad_usage("mceval", usage);
    default: /* CLI_BAD (also a --config/--set left in argv: it has no value) */
      return cli_bad_usage("mceval", usage);
    }
  }
  if (!ckpt || (!data && cfg_argc == 1)) {
    fprintf(stderr, "mceval: %s\n", !ckpt ? "missing the checkpoint directory" : "missing --data FILE");
    usage(stderr);
    return 2;
  }
  int rc = eval(ckpt, data, batches, split_all, verify, device, json, cfg_argc, cfg_argv, dump);
  if (rc != 0) {
    fprintf(stderr, "mceval: %s\n", mc_errmsg());
    return 1;
  }
  return 0;
}
