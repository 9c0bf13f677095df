#!/bin/bash
# End-to-end tests of mcdata, mctrain and mceval: e2e.sh MODE (learn | resume | muon | eval | errors).
# Needs MC_BINARY_DIR and MC_SOURCE_DIR (ctest sets both). Each mode runs in its own temp dir.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
MODE=${1:?mode}
W=$(mktemp -d /tmp/mc_train_e2e.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail=0
die() { echo "FAIL: $*"; fail=1; }

# A small model and run so that every mode takes seconds on 2 cores.
SMALL=(--set model.d_model=32 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.head_dim=16
       --set model.expert_hidden=64 --set model.mamba_inner=64 --set model.mamba_head_dim=32
       --set model.ssm_state=8 --set model.rec_width=32 --set model.seq_len=32
       --set train.global_batch=8 --set train.micro_batch=4 --set train.warmup_steps=3
       --set train.log_every=1 --set train.eval_batches=2 --set checkpoint.keep=0)

# Corpus: the project's own C sources and docs (plain English and code, about 0.5 MB).
corpus() {
  find "$S/ckpt" "$S/train" "$S/util" "$S/docs" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.md' \) | sort > files.txt
  "$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; die "mcdata failed"; exit 1; }
}

# The value of key $2 on the metrics line of step $3 of log $1 (empty if absent).
field() { grep "\"step\": $3," "$1" | sed -n "s/.*\"$2\": \([-0-9.eE+a-z]*\).*/\1/p" | tail -1; }

case "$MODE" in
learn)
  # Loss must fall well below ln(256) = 5.55 within a short run on the fortunes part of the
  # default corpus (package fortunes, installed by scripts/install-deps.sh); validation, SVG
  # and log appear.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort > files.txt
  [ -s files.txt ] || { die "no fortune files in /usr/share/games/fortunes (run scripts/install-deps.sh)"; exit 1; }
  "$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; die "mcdata failed"; exit 1; }
  "$B/mctrain" "${SMALL[@]}" --set data.path=corpus.h5 --set checkpoint.dir=run --set train.steps=150 \
    --set train.lr=1e-2 --set train.min_lr=1e-3 --set train.eval_every=75 --set checkpoint.every=75 > out.log 2>&1 \
    || { cat out.log; die "mctrain failed"; }
  first=$(field run/metrics.jsonl loss 1); val=$(field run/metrics.jsonl val_loss 150)
  last=$(for s in $(seq 141 150); do field run/metrics.jsonl loss $s; done | awk '{ t += $1 } END { if (NR == 10) print t / NR }')
  echo "loss at step 1: $first, mean of steps 141-150: $last, val_loss at 150: $val"
  awk -v a="$first" 'BEGIN { exit !(a > 5.0 && a < 6.0) }' || die "first loss $first is not near ln(256)"
  awk -v a="$last" 'BEGIN { exit !(a != "" && a < 3.0) }' || die "loss $last did not fall well below ln(256)"
  awk -v a="$val" 'BEGIN { exit !(a != "" && a < 3.0) }' || die "val_loss $val did not fall"
  [ "$(grep -c val_loss run/metrics.jsonl)" = 2 ] || die "expected val_loss at steps 75 and 150"
  grep -q '<polyline' run/metrics.svg || die "no loss curve in run/metrics.svg"
  [ -d run/step_75 ] && [ -d run/step_150 ] && [ -f run/latest ] || die "checkpoints step_75, step_150, latest missing"
  grep -q "step 150/150" out.log || die "no progress line for step 150"
  ;;
resume)
  # N straight steps == K steps, stop, resume to N: identical losses, digit for digit.
  corpus
  common=("${SMALL[@]}" --set data.path=corpus.h5 --set train.steps=12 --set train.eval_every=6 --set checkpoint.every=4)
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=a --set checkpoint.async_save=false > a.log 2>&1 || { cat a.log; die "straight run failed"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=b --until 6 > b1.log 2>&1 || { cat b1.log; die "first half failed"; }
  [ -d b/step_6 ] || die "--until 6 did not leave b/step_6"
  [ ! -d b/step_8 ] || die "--until 6 ran past step 6"
  # the second half on 5 I/O threads (the values do not depend on them)
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=b --set checkpoint.io_threads=5 --resume latest > b2.log 2>&1 \
    || { cat b2.log; die "resume failed"; }
  grep -q "resumed from .*step_6 at step 6" b2.log || die "resume did not start at step 6"
  # checkpoint.io_threads 0 (the default): the host's cores over its ranks, 2 to 16
  n=$(getconf _NPROCESSORS_ONLN); n=$((n < 2 ? 2 : n > 16 ? 16 : n))
  grep -q "(I/O on $n threads)" a.log || die "default io_threads on $(getconf _NPROCESSORS_ONLN) cores: $(grep -o '(I/O on [0-9]* threads)' a.log), want $n"
  grep -q "(I/O on 5 threads)" b2.log || die "checkpoint.io_threads=5: $(grep -o '(I/O on [0-9]* threads)' b2.log)"
  LOCAL_WORLD_SIZE=100000 "$B/mctrain" "${common[@]}" --set checkpoint.dir=c --until 1 > c.log 2>&1 || { cat c.log; die "run with LOCAL_WORLD_SIZE failed"; }
  grep -q "(I/O on 2 threads)" c.log || die "100000 ranks a host: $(grep -o '(I/O on [0-9]* threads)' c.log), want 2"
  for s in $(seq 1 12); do
    for k in loss aux_loss grad_norm lr; do
      x=$(field a/metrics.jsonl $k $s); y=$(field b/metrics.jsonl $k $s)
      [ -n "$x" ] && [ "$x" = "$y" ] || die "step $s $k: straight $x, resumed $y"
    done
  done
  x=$(field a/metrics.jsonl val_loss 12); y=$(field b/metrics.jsonl val_loss 12)
  [ -n "$x" ] && [ "$x" = "$y" ] || die "val_loss at 12: straight $x, resumed $y"
  [ "$(grep -c '"step": ' b/metrics.jsonl)" = 12 ] || die "resumed log should hold steps 1..12 once"
  # checkpoint records: 4 and 6 (--until) before the resume, 8 and 12 after; metrics.csv
  # (rebuilt from the kept log at the resume, then appended) equals the log
  [ "$(grep -o '"checkpoint": [0-9]*' b/metrics.jsonl | tr '\n' ' ')" = '"checkpoint": 4 "checkpoint": 6 "checkpoint": 8 "checkpoint": 12 ' ] \
    || die "checkpoint records of the resumed log: $(grep -o '"checkpoint": [0-9]*' b/metrics.jsonl | tr '\n' ' ')"
  MC_SOURCE_DIR=$S /usr/bin/python3 "$S/tests/train/metrics_check.py" b > mc.log 2>&1 || { cat mc.log; die "metrics.csv/svg of the resumed run"; }
  echo "12 steps straight and 6 + resume agree exactly (loss at 12: $x)"
  # Resuming again from step 6 into a fresh directory, via the step directory itself.
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=c --resume b/step_6 --until 8 > c.log 2>&1 || { cat c.log; die "resume from DIR failed"; }
  [ "$(field c/metrics.jsonl loss 8)" = "$(field a/metrics.jsonl loss 8)" ] || die "resume from b/step_6 differs at step 8"
  # Format version 3 (before AdamW's per-family step): c's step 8 rewritten without the step
  # datasets resumes from training_state.adam_step, the same run digit for digit.
  /usr/bin/python3 -c "import h5py, json, sys; sys.path.insert(0, '$S/tests/ckpt'); from ckpt_edit import step_dir; \
m = json.load(open(step_dir('c') + '/manifest.json')); s = [x for x in m['shards'] if x['state'] == 'step']; \
assert m['format_version'] == 6 and s; h = h5py.File(step_dir('c') + '/' + s[0]['file']); \
assert h[s[0]['dataset']].dtype == 'int64' and int(h[s[0]['dataset']][0]) == 8, 'step of a family at step 8'" \
    || die "c/step_8 lacks an int64 step of 8"
  cp -r c v3 && /usr/bin/python3 "$S/tests/ckpt/ckpt_edit.py" --to-v3 v3 || die "rewriting c/step_8 as format 3 failed"
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=v3 --resume latest --until 10 > v3.log 2>&1 || { cat v3.log; die "resume from format 3 failed"; }
  for s in 9 10; do
    [ "$(field v3/metrics.jsonl loss $s)" = "$(field a/metrics.jsonl loss $s)" ] || die "resume from format 3 differs at step $s"
  done
  # Format version 4 (whole-file hashes, before piece digests): c's step 8 rewritten with
  # files[].sha256 resumes the same run.
  cp -r c v4 && /usr/bin/python3 "$S/tests/ckpt/ckpt_edit.py" --to-v4 v4 || die "rewriting c/step_8 as format 4 failed"
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=v4 --resume latest --until 10 > v4.log 2>&1 || { cat v4.log; die "resume from format 4 failed"; }
  for s in 9 10; do
    [ "$(field v4/metrics.jsonl loss $s)" = "$(field a/metrics.jsonl loss $s)" ] || die "resume from format 4 differs at step $s"
  done
  # A resume keeps the run's configuration: given only the directory (no schedule on the
  # command line, so the defaults would say another lr and 600 steps) it continues the same
  # schedule into the run directory that holds the checkpoint; a schedule change is refused
  # by name unless --force, and every change is printed.
  "$B/mctrain" --resume b/step_6 --until 8 > d.log 2>&1 || { cat d.log; die "resume with no configuration arguments failed"; }
  for k in loss lr; do
    [ "$(field b/metrics.jsonl $k 8)" = "$(field a/metrics.jsonl $k 8)" ] || die "bare resume: step 8 $k $(field b/metrics.jsonl $k 8), straight $(field a/metrics.jsonl $k 8)"
  done
  grep -q "resume changes" d.log && die "a bare resume reported changes: $(grep 'resume changes' d.log)"
  # resumed at step 6 again: the log and its CSV drop steps 7-12 and checkpoints 8 and 12
  [ "$(grep -c '"checkpoint": ' b/metrics.jsonl)" = 3 ] || die "checkpoint records after the resume from step 6: $(grep -c '"checkpoint": ' b/metrics.jsonl)"
  MC_SOURCE_DIR=$S /usr/bin/python3 "$S/tests/train/metrics_check.py" b > mc.log 2>&1 || { cat mc.log; die "metrics.csv/svg after resuming step 6"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=e --set train.lr=0.01 --resume b/step_6 > e.log 2>&1 \
    && die "a resume changing train.lr succeeded without --force"
  grep -q "would change train.lr .*pass --force" e.log || { cat e.log; die "the refusal does not name train.lr and --force"; }
  [ ! -e e/latest ] || die "a refused resume left a checkpoint"
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=e --set train.lr=0.01 --force --resume b/step_6 --until 7 > e.log 2>&1 \
    || { cat e.log; die "a forced lr change on resume failed"; }
  grep -q "resume changes train.lr: .* -> 0.01 (--force)" e.log || { cat e.log; die "the forced change was not printed"; }
  expect_fail_msg() { if "$@" > f.log 2>&1; then die "should fail: $*"; fi; }
  expect_fail_msg "$B/mctrain" --force "${common[@]}" --set checkpoint.dir=f
  grep -q "\-\-force goes with \-\-resume" f.log || { cat f.log; die "--force without --resume not refused by name"; }
  # SIGTERM (preemption) ends the run after the step in progress with a checkpoint of that
  # step and exit status 143; resuming from it matches an uninterrupted run.
  long=("${SMALL[@]}" --set data.path=corpus.h5 --set train.steps=2000 --set train.eval_every=0 --set checkpoint.every=0)
  "$B/mctrain" "${long[@]}" --set checkpoint.dir=s > s.log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do
    [ "$(grep -c '"step"' s/metrics.jsonl 2>/dev/null)" -ge 3 ] 2>/dev/null && break
    sleep 0.1
  done
  kill -TERM $pid
  wait $pid
  rc=$?
  [ $rc = 143 ] || { cat s.log; die "SIGTERM: exit status $rc, expected 143"; }
  n=$(sed -n 's/.*interrupted at step \([0-9]*\).*/\1/p' s.log)
  [ -n "$n" ] && [ -d "s/step_$n" ] && grep -q "step_$n" s/latest || { cat s.log; die "no checkpoint of the interrupted step"; }
  "$B/mctrain" "${long[@]}" --set checkpoint.dir=s --resume latest --until $((n + 2)) > s2.log 2>&1 || { cat s2.log; die "resume after SIGTERM failed"; }
  "$B/mctrain" "${long[@]}" --set checkpoint.dir=t --until $((n + 2)) > t.log 2>&1 || { cat t.log; die "uninterrupted run failed"; }
  for s in $((n + 1)) $((n + 2)); do
    [ -n "$(field t/metrics.jsonl loss $s)" ] && [ "$(field s/metrics.jsonl loss $s)" = "$(field t/metrics.jsonl loss $s)" ] \
      || die "after SIGTERM at $n, step $s differs from the uninterrupted run"
  done
  echo "SIGTERM at step $n: checkpoint saved, resumed run matches"
  # A checkpoint rewritten for another layout (pp=2, dp=2, ZeRO-1, ep=2) resumes the same run.
  "$B/mcreshard" b/step_6 r --pp 2 --dp 2 --zero 1 --ep 2 --no-progress > r.log 2>&1 || { cat r.log; die "mcreshard failed"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=d --resume r --until 8 > d.log 2>&1 || { cat d.log; die "resume from the resharded checkpoint failed"; }
  for s in 7 8; do
    [ "$(field d/metrics.jsonl loss $s)" = "$(field a/metrics.jsonl loss $s)" ] || die "resume from the pp=2 dp=2 checkpoint differs at step $s"
  done
  ;;
muon)
  # optim.groups=muon:matrices,adamw:all: N straight steps == K steps + resume to N, digit for
  # digit; the checkpoint holds momentum for the Muon families and the AdamW moments for the
  # rest; a resume changing optim.groups is refused by name; resharded to pp2 x dp2 zero 1 x ep2
  # and back, the files are byte-identical to the original, and the resharded one resumes
  # the same run.
  corpus
  common=("${SMALL[@]}" --set data.path=corpus.h5 --set train.steps=12 --set train.eval_every=0 --set checkpoint.every=6
          --set optim.groups=muon:matrices,adamw:all)
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=a --set checkpoint.async_save=false > a.log 2>&1 || { cat a.log; die "straight Muon run failed"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=b --until 6 > b1.log 2>&1 || { cat b1.log; die "first half failed"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=b --resume latest > b2.log 2>&1 || { cat b2.log; die "Muon resume failed"; }
  for s in $(seq 1 12); do
    for k in loss grad_norm; do
      x=$(field a/metrics.jsonl $k $s); y=$(field b/metrics.jsonl $k $s)
      [ -n "$x" ] && [ "$x" = "$y" ] || die "Muon step $s $k: straight $x, resumed $y"
    done
  done
  echo "Muon: 12 steps straight and 6 + resume agree exactly (loss at 12: $(field a/metrics.jsonl loss 12))"
  # a plain AdamW run of the same length: Muon changed the training
  "$B/mctrain" "${SMALL[@]}" --set data.path=corpus.h5 --set train.steps=12 --set train.eval_every=0 \
    --set checkpoint.every=0 --set checkpoint.dir=w > w.log 2>&1 || { cat w.log; die "AdamW run failed"; }
  [ "$(field w/metrics.jsonl loss 12)" != "$(field a/metrics.jsonl loss 12)" ] || die "the Muon run's losses are AdamW's"
  m=$(grep -o '"momentum"' b/step_6/manifest.json | wc -l); v=$(grep -o '"exp_avg_sq"' b/step_6/manifest.json | wc -l)
  [ "$m" -gt 0 ] && [ "$v" -gt 0 ] || die "step_6 should hold momentum and exp_avg_sq shards (momentum $m, exp_avg_sq $v)"
  "$B/mcaudit" b/step_6 --verify > audit.log 2>&1 || { cat audit.log; die "mcaudit of the Muon checkpoint"; }
  grep -q momentum audit.log || { cat audit.log; die "mcaudit does not list the momentum state"; }
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=g --set optim.groups=adamw:all --resume b/step_6 > g.log 2>&1 \
    && die "a resume changing optim.groups succeeded"
  grep -q "would change optim.groups" g.log || { cat g.log; die "the refusal does not name optim.groups"; }
  # A as mcreshard writes it (the trainer's files hold the same datasets in another HDF5 layout:
  # docs/reshard.md), to pp2 x dp2 zero 1 x ep2 and back: the same files byte for byte
  "$B/mcreshard" b/step_6 a1 --no-progress > a1.log 2>&1 || { cat a1.log; die "mcreshard of the Muon checkpoint to its own layout failed"; }
  "$B/mcreshard" a1 r --pp 2 --dp 2 --zero 1 --ep 2 --no-progress > r.log 2>&1 || { cat r.log; die "mcreshard of the Muon checkpoint failed"; }
  "$B/mcreshard" r back --pp 1 --dp 1 --zero 0 --ep 1 --no-progress > back.log 2>&1 || { cat back.log; die "mcreshard back failed"; }
  n=0
  for f in a1/step_6/rank_*.h5; do
    n=$((n + 1))
    cmp -s "$f" "back/step_6/$(basename "$f")" || die "A->B->A: $(basename "$f") differs from A's"
  done
  [ $n -gt 0 ] || die "A has no rank file"
  # and the trainer's own datasets: every shard record (family, state, box, sha256) of A's manifest is the trainer's
  shards() { /usr/bin/python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); [print(s["family"], s["state"], s["start"], s["count"], s["sha256"]) for s in m["shards"]]' "$1" | sort; }
  [ "$(shards b/step_6/manifest.json)" = "$(shards back/step_6/manifest.json)" ] || die "A->B->A: the shards differ from the trainer's checkpoint"
  "$B/mctrain" "${common[@]}" --set checkpoint.dir=d --resume r --until 8 > d.log 2>&1 || { cat d.log; die "resume from the resharded Muon checkpoint failed"; }
  for s in 7 8; do
    [ "$(field d/metrics.jsonl loss $s)" = "$(field a/metrics.jsonl loss $s)" ] || die "Muon: resume from the pp=2 dp=2 checkpoint differs at step $s"
  done
  echo "Muon: resharded A->B->A byte-identical (A as mcreshard writes it; the trainer's shards and hashes equal); the resharded checkpoint resumes the run exactly"
  ;;
eval)
  # mceval prints the trainer's val_loss for the same checkpoint.
  corpus
  "$B/mctrain" "${SMALL[@]}" --set data.path=corpus.h5 --set checkpoint.dir=run --set train.steps=8 \
    --set train.eval_every=4 --set checkpoint.every=4 > out.log 2>&1 || { cat out.log; die "mctrain failed"; }
  for s in 4 8; do
    want=$(field run/metrics.jsonl val_loss $s)
    got=$("$B/mceval" run/step_$s --data corpus.h5 | sed -n 's/^loss=\([^ ]*\).*/\1/p')
    echo "step $s: trainer val_loss $want, mceval $got"
    [ -n "$want" ] && [ "$want" = "$got" ] || die "mceval on step_$s gave $got, trainer logged $want"
  done
  got=$("$B/mceval" run --data corpus.h5 | sed -n 's/.*step=\([0-9]*\).*/\1/p')
  [ "$got" = 8 ] || die "mceval run/ should follow latest to step 8, got $got"
  # Any layout: the same checkpoint rewritten for pp=2, dp=2, ZeRO-1, ep=2 scores the same.
  "$B/mcreshard" run/step_8 r --pp 2 --dp 2 --zero 1 --ep 2 --no-progress > r.log 2>&1 || { cat r.log; die "mcreshard failed"; }
  got=$("$B/mceval" r --data corpus.h5 | sed -n 's/^loss=\([^ ]*\).*/\1/p')
  [ "$got" = "$(field run/metrics.jsonl val_loss 8)" ] || die "mceval of the resharded checkpoint gave $got"
  all=$("$B/mceval" run --data corpus.h5 --split all --batches 1 | sed -n 's/.*tokens=\([0-9]*\).*/\1/p')
  [ "$all" = 256 ] || die "--split all --batches 1 should score 8 windows x 32 tokens, got $all"
  # --config/--set overlay the recorded config: data.path stands in for --data, and
  # train.eval_batches=1 scores one global batch like --batches 1.
  got=$("$B/mceval" run --set data.path=corpus.h5 --set train.eval_batches=1 --split all | sed -n 's/.*tokens=\([0-9]*\).*/\1/p')
  [ "$got" = 256 ] || die "mceval --set data.path/train.eval_batches scored $got tokens, want 256"
  if "$B/mceval" run --set data.path=corpus.h5 --set model.d_model=48 > /dev/null 2> mm.log; then die "mceval accepted a changed model"; fi
  grep -q "model.d_model" mm.log || die "mceval model change not named: $(cat mm.log)"
  # --json: one JSON document with the same loss (exactly), its perplexity, the tokens, split and step.
  "$B/mceval" run/step_8 --data corpus.h5 --json > ev.json || die "mceval --json failed"
  /usr/bin/python3 - "$(field run/metrics.jsonl val_loss 8)" ev.json <<'PY' || die "mceval --json: $(cat ev.json)"
import json, math, sys
want, doc = float(sys.argv[1]), json.load(open(sys.argv[2]))
assert doc["loss"] == want, (doc["loss"], want)
assert abs(doc["perplexity"] - math.exp(want)) <= 1e-12 * math.exp(want), doc["perplexity"]
assert doc["split"] == "val" and doc["step"] == 8 and doc["tokens"] == doc["sequences"] * 32, doc
assert doc["batches"] == 2 and doc["backend"] == "cpu" and doc["verified"] is True, doc
assert doc["checkpoint"].endswith("step_8") and doc["data"] == "corpus.h5", doc
PY
  ;;
errors)
  # Bad input: clear messages naming the file, key or rule, non-zero exit, nothing written.
  corpus
  expect() { # expect "needle" cmd... : non-zero exit and the needle in stderr
    local needle=$1; shift
    if "$@" > err.out 2> err.log; then die "should fail: $*"; return; fi
    grep -q -- "$needle" err.log || { cat err.log; die "message lacks '$needle': $*"; }
  }
  expect "does not exist" "$B/mcdata" -o x.h5 nope.txt
  [ ! -e x.h5 ] || die "mcdata left x.h5 after an error"
  printf 'abc\xff' > hi.txt
  expect "token 255 at byte offset 3 is not below vocab_size=128" "$B/mcdata" -o x.h5 --vocab 128 hi.txt
  [ -z "$(ls x.h5* 2>/dev/null)" ] || die "mcdata left a partial output"
  printf 'abc' > odd.bin
  expect "not a whole number of 2-byte tokens" "$B/mcdata" -o x.h5 --dtype uint16 --vocab 300 odd.bin
  expect "needs --vocab" "$B/mcdata" -o x.h5 --dtype uint16 odd.bin
  # --config/--set: data.path is the output and model.vocab_size the vocabulary
  expect "token 255 at byte offset 3 is not below vocab_size=128" "$B/mcdata" --set data.path=x.h5 \
    --set model.vocab_size=128 hi.txt
  expect "data.bogus: unknown key" "$B/mcdata" --set data.bogus=1 hi.txt
  printf 'abc' > lo.txt
  "$B/mcdata" --set data.path=cfg.h5 --set model.vocab_size=128 lo.txt > /dev/null || die "mcdata --set"
  [ -f cfg.h5 ] || die "mcdata --set data.path did not write cfg.h5"
  T=(--set checkpoint.dir=e --set train.steps=2)
  expect "nope.h5: cannot read" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=nope.h5
  echo "not hdf5" > bad.h5
  expect "not an HDF5 file" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=bad.h5
  head -c 400 /dev/zero > zeros.bin
  "$B/mcdata" -o big.h5 --dtype uint16 --vocab 512 zeros.bin > /dev/null || die "mcdata uint16"
  expect "vocab_size=512 is larger than model.vocab_size=256" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=big.h5
  head -c 20 files.txt > short.txt
  "$B/mcdata" -o short.h5 short.txt > /dev/null || die "mcdata short"
  expect "too few for one window of seq_len+1=33" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=short.h5
  expect "world size" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5 --set parallel.dp=2
  expect "unknown argument" "$B/mctrain" --bogus
  "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5 > ok.log 2>&1 || { cat ok.log; die "2-step run failed"; }
  expect "already holds a run" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5
  expect "different model" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5 --set model.d_model=64 \
    --set train.steps=4 --resume latest
  expect "train.seed" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5 --set train.seed=7 \
    --set train.steps=4 --resume latest
  expect "cannot resume" "$B/mctrain" "${SMALL[@]}" "${T[@]}" --set data.path=corpus.h5 --resume nowhere
  expect "missing --data" "$B/mceval" e
  expect "larger than model.vocab_size" "$B/mceval" e --data big.h5
  # Devices and precision: bf16 on the CPU (its bf16 instance) trains and saves, also under
  # ZeRO 3, and the checkpoint resumes in fp32; a bad device. GPU ranks (NCCL) need a GPU
  # each; the launchers' environment is checked (this machine may have no GPU: the GPU side of
  # the launchers is tests/train/nccl_train.sh).
  "$B/mctrain" "${SMALL[@]}" --set checkpoint.dir=bf --set data.path=corpus.h5 --set train.dtype=bf16 \
    --set parallel.zero=3 --set train.steps=2 > bf.log 2>&1 || { cat bf.log; die "bf16 on the CPU under ZeRO 3 failed"; }
  "$B/mctrain" "${SMALL[@]}" --set data.path=corpus.h5 --set train.steps=3 --set train.dtype=fp32 --resume bf > bf2.log 2>&1 \
    || { cat bf2.log; die "the bf16 checkpoint did not resume in fp32"; }
  grep -q 'resume changes train.dtype: "bf16" -> "fp32"' bf2.log || { cat bf2.log; die "resume did not report the dtype change"; }
  expect "mceval: --device tpu: expected cpu or cuda" "$B/mceval" e --data corpus.h5 --device tpu
  # Without a GPU (or in a build without CUDA) --device cuda fails naming the option.
  if ! "$B/mceval" e --data corpus.h5 --device cuda > err.out 2> err.log; then
    grep -q -- "mceval: --device cuda: no CUDA device is available" err.log || { cat err.log; die "mceval --device cuda: message lacks --device"; }
  fi
  # An unknown recomputation policy is refused, not ignored (selective and full train:
  # tests/train/memreport.sh).
  expect 'train.recompute: "some" is not one of' "$B/mctrain" "${SMALL[@]}" \
    --set checkpoint.dir=rc --set data.path=corpus.h5 --set train.recompute=some
  [ ! -e rc/latest ] || die "a refused recompute policy left a checkpoint"
  expect "CPU ranks run under mpirun" "$B/mctrain" --nproc-per-node 2 "${SMALL[@]}" --set checkpoint.dir=l1 \
    --set data.path=corpus.h5 --set parallel.dp=2
  expect "go with --nproc-per-node" "$B/mctrain" --nnodes 2 "${SMALL[@]}"
  expect "--nproc-per-node" "$B/mctrain" --nproc-per-node 0
  expect "MASTER_ADDR is not set" env WORLD_SIZE=2 RANK=1 "$B/mctrain" "${SMALL[@]}" --set train.device=cuda
  expect "RANK=2 is not an integer in" env WORLD_SIZE=2 RANK=2 "$B/mctrain" "${SMALL[@]}"
  if [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" = 0 ]; then
    expect "train.device=cuda with 2 processes" "$B/mctrain" --nproc-per-node 2 "${SMALL[@]}" --set checkpoint.dir=l2 \
      --set data.path=corpus.h5 --set parallel.dp=2 --set train.device=cuda
    [ ! -e l2/latest ] || die "a refused run left a checkpoint"
  fi
  if [ -n "${MC_MPIRUN:-}" ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" = 0 ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
      expect "train.device=cuda with 2 processes" \
      "$MC_MPIRUN" -np 2 "$B/mctrain" "${SMALL[@]}" --set checkpoint.dir=m --set data.path=corpus.h5 \
      --set parallel.dp=2 --set train.device=cuda
    [ ! -e m/latest ] || die "a refused run left a checkpoint"
  fi
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
[ $fail = 0 ] && echo "e2e $MODE: ok"
exit $fail
