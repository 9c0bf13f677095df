#!/bin/bash
# TensorBoard scalars (train/tfevents.c) of a short run, read back by tests/train/tfevents_check.py
# (its own TFRecord/protobuf decoder; TensorBoard's reader too where installed) against
# metrics.jsonl, which also carries a wall-clock time in every record; metrics.csv and the loss
# picture metrics.svg against metrics.jsonl (tests/train/metrics_check.py). The run directory's
# name is long, so the picture's title must shrink to fit.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
W=$(mktemp -d /tmp/mc_tfevents.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
find "$S/docs" -maxdepth 1 -name '*.md' | sort > files.txt
"$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; echo "FAIL: mcdata"; exit 1; }
SMALL=(--set model.d_model=32 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=8
       --set model.expert_hidden=32 --set model.mamba_inner=64 --set model.mamba_head_dim=16
       --set model.ssm_state=8 --set model.rec_width=32 --set model.seq_len=16 --set train.global_batch=8
       --set train.micro_batch=2 --set train.warmup_steps=1 --set train.steps=6 --set train.log_every=1
       --set train.eval_every=3 --set checkpoint.every=2 --set data.path=corpus.h5)
RUN=run_directory_with_a_long_name_so_that_the_loss_picture_title_has_to_shrink_to_fit_the_width
"$B/mctrain" "${SMALL[@]}" --set checkpoint.dir=$RUN --peak-tflops 0.5 > run.log 2>&1 || { cat run.log; echo "FAIL: mctrain"; exit 1; }
/usr/bin/python3 "$S/tests/train/tfevents_check.py" $RUN 2 0.5 || { echo "FAIL: the event file"; exit 1; }
MC_SOURCE_DIR=$S /usr/bin/python3 "$S/tests/train/metrics_check.py" $RUN || { echo "FAIL: metrics.csv or metrics.svg"; exit 1; }
# synchronous saves: the same records (paused_s = save_s, the whole save)
SMALL+=(--set checkpoint.dir=run)
"$B/mctrain" "${SMALL[@]}" --set checkpoint.async_save=false > run.log 2>&1 || { cat run.log; echo "FAIL: mctrain"; exit 1; }
/usr/bin/python3 "$S/tests/train/tfevents_check.py" run 2 || { echo "FAIL: the event file"; exit 1; }
grep -q '"async": false' run/metrics.jsonl || { echo "FAIL: no synchronous checkpoint record"; exit 1; }
MC_SOURCE_DIR=$S /usr/bin/python3 "$S/tests/train/metrics_check.py" run || { echo "FAIL: metrics.csv or metrics.svg"; exit 1; }
now=$(date +%s)
t=$(tail -1 run/metrics.jsonl | sed -n 's/.*"time": \([0-9.]*\).*/\1/p')
awk -v t="$t" -v n="$now" 'BEGIN { exit !(t != "" && t > n - 600 && t <= n + 1) }' || { echo "FAIL: metrics time $t, now $now"; exit 1; }
echo "tfevents: ok"
