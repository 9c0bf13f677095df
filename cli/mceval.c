/* mceval: the loss of a checkpoint on a token file.
 *
 *   mceval CKPT --data FILE [--batches N] [--split val|all] [--no-verify] [--config F] [--set k=v]
 *
 * CKPT is a run directory (its latest checkpoint) or a step_N directory, written under any
 * layout: every family is read whole through the checkpoint library's hyperslab reads and
 * evaluated on one process. The windows, split and micro-batching are the run's recorded
 * config (model.seq_len, data.val_fraction, train.micro_batch), so on the run's dataset
 * `--split val` (the default) with N = train.eval_batches prints the trainer's val_loss
 * for that step, digit for digit when computed on the run's device (--device cpu, the
 * default, or --device cuda). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "train/data.h"
#include "train/device.h"
#include "train/net.h"
#include "train/trainer.h"
#include "util/error.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: mceval CKPT --data FILE [--batches N] [--split val|all] [--device cpu|cuda] [--no-verify]\n"
          "              [--config FILE] [--set section.key=value]\n"
          "  CKPT       a run directory (its latest checkpoint) or a step_N directory\n"
          "  --data     HDF5 token dataset made by mcdata\n"
          "  --batches  global batches of windows to score (default train.eval_batches; 0 = all)\n"
          "  --split    val: the held-out windows (default); all: every window of the file\n"
          "  --device   where to compute: cpu (default) or cuda\n"
          "  --config/--set  overlay the checkpoint's recorded config (windows, split, micro-batch,\n"
          "             eval_batches; data.path is the default of --data); the model must not change\n");
}

static int eval(const char *ckpt_path, const char *data_path, int64_t batches, int split_all, int verify,
                const char *device, int cfg_argc, char **cfg_argv) {
  mc_backend *be = mc_train_backend(device, "fp32", 1); /* before any reading: a bad device fails fast */
  if (!be) return -1;
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
  if (rc == 0) rc = mc_eval_loss(net, &d, split_all, n, cfg.train.micro_batch, &loss, &tokens);
  if (rc == 0)
    printf("loss=%.17g tokens=%lld split=%s step=%lld checkpoint=%s data=%s\n", loss, (long long)tokens,
           split_all ? "all" : "val", (long long)mc_ckpt_step(ck), mc_ckpt_step_dir(ck), data_path);
  mc_data_close(&d);
  if (net) mc_net_free(net);
  if (have_geo) mc_geometry_free(&geo);
  mc_ckpt_close(ck);
  return rc;
}

int main(int argc, char **argv) {
  char **cfg_argv = calloc((size_t)argc + 1, sizeof *cfg_argv);
  if (!cfg_argv) return 1;
  int cfg_argc = mc_config_take_args(&argc, argv, cfg_argv);
  const char *ckpt = NULL, *data = NULL;
  int64_t batches = -1;
  int split_all = 0, verify = 1;
  const char *device = "cpu";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--data") && i + 1 < argc) {
      data = argv[++i];
    } else if (!strcmp(a, "--batches") && i + 1 < argc) {
      char *end;
      batches = strtoll(argv[++i], &end, 10);
      if (*end || batches < 0) {
        fprintf(stderr, "mceval: --batches %s is not a non-negative integer\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(a, "--split") && i + 1 < argc) {
      const char *s = argv[++i];
      if (strcmp(s, "val") && strcmp(s, "all")) {
        fprintf(stderr, "mceval: --split %s: expected val or all\n", s);
        return 2;
      }
      split_all = !strcmp(s, "all");
    } else if (!strcmp(a, "--device") && i + 1 < argc) {
      device = argv[++i];
    } else if (!strcmp(a, "--no-verify")) {
      verify = 0;
    } else if (a[0] == '-' || ckpt) {
      fprintf(stderr, "mceval: unexpected argument: %s\n", a);
      usage(stderr);
      return 2;
    } else {
      ckpt = a;
    }
  }
  if (!ckpt || (!data && cfg_argc == 1)) {
    fprintf(stderr, "mceval: %s\n", !ckpt ? "missing the checkpoint directory" : "missing --data FILE");
    usage(stderr);
    return 2;
  }
  int rc = eval(ckpt, data, batches, split_all, verify, device, cfg_argc, cfg_argv);
  free(cfg_argv);
  if (rc != 0) {
    fprintf(stderr, "mceval: %s\n", mc_errmsg());
    return 1;
  }
  return 0;
}
