#!/bin/bash
# mctrain on the CUDA backend against the CPU reference (tests/train/train.cmake registers it):
#   cuda_train.sh match|bf16
# match:  the default configuration (configs/default.json) on a corpus of the project's
#         sources, train.dtype=fp32, 20 steps with a checkpoint at step 10, four runs:
#           cpu  20 steps on the CPU             gpu  20 steps on the GPU
#           g2c  the GPU's step_10 resumed on the CPU to step 20
#           c2g  the CPU's step_10 resumed on the GPU to step 20
#         Every step's loss and gradient norm must agree with the CPU run within BAND
#         (relative; default 2e-6): gpu steps 1-20, g2c and c2g steps 11-20. mceval of the
#         GPU's step_20 on the GPU and on the CPU agree within BAND as well.
#         Without a CUDA device (or a build without CUDA) it prints "SKIP: no CUDA device"
#         and passes.
# async:  checkpoints of a GPU run taken while it trains on (issue 15: snapshot copies on a
#         second stream, the next optimizer step fenced behind them), for train.dtype fp32
#         and bf16: a run with async saves every 5 steps has the losses and gradient norms
#         of the run without saves, and its step_10 resumed on the GPU continues them
#         (steps 11-20), within BAND (fp32) or BF16_BAND (bf16) relative: not bit for bit,
#         because the CUDA kernels are not run-to-run deterministic (two identical runs
#         differ from step 1, ~1e-10 fp32, ~1e-4 bf16 on an H100; printed for reference);
#         a snapshot racing the optimizer would mix two steps' states (~1e-3 apart); and
#         a save whose writes fail (the
#         LD_PRELOAD shim MC_ENOSPC_SHIM makes step_15's files hit ENOSPC) ends the run with
#         the error, exit non-zero, `latest` still step_10 and verified by mcaudit.
#         Skips like match; the disk-full part is skipped without MC_ENOSPC_SHIM.
# bf16:   the same CPU run against train.dtype=bf16 on the GPU (matrix products on bf16
#         tensor cores, the rest fp32), and the bf16 run's step_10 resumed on the CPU in fp32:
#         every loss within BF16_BAND (relative; default 1e-2) of the CPU run (gradient norms
#         are printed, not checked). Skips like match.
#         (The refusals of train.device=cuda under mpirun and of train.dtype=bf16 on the CPU
#         are in e2e.sh errors.)
# muon:   match with optim.groups=muon:matrices,adamw:all (Muon's Newton-Schulz as cuBLAS
#         products on the GPU, OpenBLAS on the CPU) within MUON_BAND (relative; default 1e-5).
#         Skips like match.
# recompute: train.recompute=selective and full on the GPU against none on the GPU, fp32 and
#         bf16, 10 steps each: every loss and gradient norm within BAND (fp32) or BF16_BAND
#         (bf16) of none's (the line says whether they are bitwise equal), the step-1 report's
#         activations ratio 1.000 (arena = mcplan) and each policy's arena below the previous
#         one's; prints tokens/s of steps 2-10 per run. Skips like match.
set -u
B=${MC_BINARY_DIR:?}
S=${MC_SOURCE_DIR:?}
MODE=${1:?mode}
BAND=${MC_CUDA_LOSS_BAND:-2e-6}
BF16_BAND=${MC_CUDA_BF16_BAND:-1e-2}
MUON_BAND=${MC_CUDA_MUON_BAND:-1e-5}
W=$(mktemp -d /tmp/mc_cuda_train.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail=0
die() { echo "FAIL: $*"; fail=1; }

field() { grep "\"step\": $3," "$1" | sed -n "s/.*\"$2\": \([-0-9.eE+a-z]*\).*/\1/p" | tail -1; }

corpus() {
  find "$S/ckpt" "$S/train" "$S/util" "$S/docs" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.md' \) | sort > files.txt
  "$B/mcdata" -o corpus.h5 $(cat files.txt) > mcdata.log 2>&1 || { cat mcdata.log; echo "FAIL: mcdata"; exit 1; }
}

# compare NAME RUN REF FIRST LAST BAND KEY...: the KEYs (loss, grad_norm) of steps
# FIRST..LAST of run RUN against run REF, within BAND relative; prints every step's loss and
# the worst difference.
compare() {
  local name=$1 run=$2 ref=$3 first=$4 last=$5 band=$6 worst=0
  shift 6
  echo "== $name: $run vs $ref, steps $first-$last, $* within $band relative"
  for s in $(seq "$first" "$last"); do
    for k in "$@"; do
      local x y
      x=$(field "$run/metrics.jsonl" $k $s); y=$(field "$ref/metrics.jsonl" $k $s)
      if [ -z "$x" ] || [ -z "$y" ]; then die "$name step $s: no $k (run '$x', reference '$y')"; continue; fi
      local r
      r=$(awk -v a="$x" -v b="$y" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; printf "%.3e", d / (b > 0 ? b : 1) }')
      [ "$k" = loss ] && printf '  step %2d  loss %s %.9f  %s %.9f  rel diff %s\n' "$s" "$run" "$x" "$ref" "$y" "$r"
      awk -v r="$r" -v b="$band" 'BEGIN { exit !(r <= b) }' || die "$name step $s $k: $run $x, $ref $y, rel diff $r > $band"
      worst=$(awk -v r="$r" -v w="$worst" 'BEGIN { print (r > w ? r : w) }')
    done
  done
  echo "  worst rel diff of $*: $worst"
}

case "$MODE" in
match|bf16|async|recompute|muon)
  # Is there a GPU? The device is checked before the data, so a missing file is reached
  # only when the CUDA backend came up.
  "$B/mctrain" --set train.device=cuda --set data.path=/nonexistent.h5 --set checkpoint.dir=probe > probe.log 2>&1
  if grep -q "no CUDA device is available" probe.log; then
    sed -n 's/^mctrain: /  /p' probe.log
    echo "SKIP: no CUDA device"
    exit 0
  fi
  grep -q "/nonexistent.h5" probe.log || { cat probe.log; die "unexpected answer to train.device=cuda"; exit 1; }
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/card: /'
  corpus
  # The default config as embedded in mctrain; 20 steps of its schedule, a checkpoint at 10.
  C=(--set data.path=corpus.h5 --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=10
     --set checkpoint.keep=0 --set train.dtype=fp32)
  run() { # run NAME DEVICE ARGS...
    local name=$1 dev=$2; shift 2
    local t0=$(date +%s.%N)
    "$B/mctrain" "${C[@]}" --set train.device=$dev --set checkpoint.dir=$name "$@" > $name.log 2>&1 || { cat $name.log; die "run $name on $dev failed"; return; }
    awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$name" -v d="$dev" 'BEGIN { printf "run %s on %s: %.1f s\n", n, d, b - a }'
  }
  if [ "$MODE" = async ]; then
    for dt in fp32 bf16; do
      D=(--set train.dtype=$dt)
      run ${dt}_plain cuda "${D[@]}" --set checkpoint.every=0 --until 20
      run ${dt}_async cuda "${D[@]}" --set checkpoint.every=5 --set checkpoint.async_save=true --until 20
      grep -q "checkpoint step 10 queued" ${dt}_async.log || die "$dt: no async save at step 10"
      grep "checkpoint step" ${dt}_async.log | sed 's/^/  /'
      run ${dt}_resumed cuda --resume ${dt}_async/step_10 --until 20
      band=$BAND; [ $dt = bf16 ] && band=$BF16_BAND
      run ${dt}_plain2 cuda "${D[@]}" --set checkpoint.every=0 --until 20
      compare "$dt: two runs without saves (the GPU's run-to-run difference, for reference)" ${dt}_plain2 ${dt}_plain 1 20 1e30 loss grad_norm
      compare "$dt: async saves every 5 steps against no saves" ${dt}_async ${dt}_plain 1 20 $band loss grad_norm
      compare "$dt: the async step_10 resumed" ${dt}_resumed ${dt}_plain 11 20 $band loss grad_norm
      if [ -n "${MC_ENOSPC_SHIM:-}" ]; then
        LD_PRELOAD=$MC_ENOSPC_SHIM MC_ENOSPC_MATCH=step_15 MC_ENOSPC_AFTER=0 "$B/mctrain" "${C[@]}" "${D[@]}" \
          --set train.device=cuda --set checkpoint.dir=${dt}_full --set checkpoint.every=5 \
          --set checkpoint.async_save=true --until 20 > ${dt}_full.log 2>&1
        rc=$?
        echo "== $dt: step_15's writes fail (ENOSPC): exit $rc; $(grep '^mctrain' ${dt}_full.log | tail -1 | cut -c1-300)"
        [ $rc != 0 ] || die "$dt: a failed async save did not end the run with an error"
        grep -qi "no space\|ENOSPC" ${dt}_full.log || die "$dt: the error does not say the disk is full"
        grep -q '"path":[[:space:]]*"step_10"' ${dt}_full/latest 2>/dev/null || die "$dt: latest is not step_10: $(cat ${dt}_full/latest 2>/dev/null)"
        "$B/mcaudit" ${dt}_full --verify > ${dt}_full_audit.log 2>&1 || { tail -3 ${dt}_full_audit.log; die "$dt: step_10 does not verify"; }
        [ -e ${dt}_full/step_20 ] && die "$dt: the run went on past the failed save"
      else
        echo "(disk-full part skipped: MC_ENOSPC_SHIM not set)"
      fi
    done
    [ $fail = 0 ] && echo "cuda_train $MODE: ok"
    exit $fail
  fi
  if [ "$MODE" = recompute ]; then
    for dt in fp32 bf16; do
      band=$BAND; [ $dt = bf16 ] && band=$BF16_BAND
      prev=
      for pol in none selective full; do
        run $dt-$pol cuda --set train.dtype=$dt --set train.recompute=$pol --set checkpoint.every=0 --until 10
        act=$(grep -E '^  activations ' $dt-$pol.log | tr -s ' ')
        echo "  $dt $pol:$act; tokens/s steps 2-10: $(grep -o '"tokens_per_s": [0-9.]*' $dt-$pol/metrics.jsonl | sed 1d | awk '{ s += $2; n++ } END { if (n) printf "%.0f", s / n }')"
        echo "$act" | grep -q ' 1.000$' || die "$dt $pol: activations not as planned: '$act'"
        a=$(echo "$act" | awk '{ print $2 }')
        [ -z "$prev" ] || [ "$a" -lt "$prev" ] || die "$dt $pol: activations $a not below $prev"
        prev=$a
        if [ $pol != none ]; then
          compare "GPU $dt recompute=$pol against none" $dt-$pol $dt-none 1 10 $band loss grad_norm
          if cmp -s <(grep -o '"loss": [^,]*, "aux_loss": [^,]*' $dt-$pol/metrics.jsonl) \
                    <(grep -o '"loss": [^,]*, "aux_loss": [^,]*' $dt-none/metrics.jsonl); then
            echo "  $dt $pol: losses bitwise equal to none"
          else
            echo "  $dt $pol: losses not bitwise equal to none (within the band)"
          fi
        fi
      done
    done
    [ $fail = 0 ] && echo "cuda_train $MODE: ok"
    exit $fail
  fi
  if [ "$MODE" = bf16 ]; then
    # bf16 products against the fp32 CPU run; the bf16 run's checkpoint resumed on the CPU
    run cpu cpu --until 20
    run bf16 cuda --set train.dtype=bf16 --until 20
    grep -q "backend cuda, dtype bf16" bf16.log || die "the bf16 run does not report dtype bf16"
    run b2c cpu --resume bf16/step_10 --until 20
    compare "GPU bf16-products run against the CPU fp32 run" bf16 cpu 1 20 $BF16_BAND loss
    compare "(gradient norms, reported only)" bf16 cpu 1 20 1e30 grad_norm
    compare "GPU bf16 checkpoint resumed on the CPU in fp32" b2c cpu 11 20 $BF16_BAND loss
    [ $fail = 0 ] && echo "cuda_train $MODE: ok"
    exit $fail
  fi
  if [ "$MODE" = muon ]; then
    C+=(--set optim.groups=muon:matrices,adamw:all)
    BAND=$MUON_BAND
  fi
  run cpu cpu --until 20
  run gpu cuda --until 20
  grep -q "backend cuda" gpu.log || die "the GPU run does not report backend cuda"
  grep -q "backend cpu" cpu.log || die "the CPU run does not report backend cpu"
  [ -d cpu/step_10 ] && [ -d gpu/step_10 ] || { die "step_10 checkpoints missing"; exit 1; }
  run g2c cpu --resume gpu/step_10 --until 20
  run c2g cuda --resume cpu/step_10 --until 20
  grep -q "resumed from .*step_10 at step 10" g2c.log || die "g2c did not resume at step 10"
  grep -q "resumed from .*step_10 at step 10" c2g.log || die "c2g did not resume at step 10"
  compare "GPU run against the CPU run" gpu cpu 1 20 $BAND loss grad_norm
  compare "GPU checkpoint resumed on the CPU" g2c cpu 11 20 $BAND loss grad_norm
  compare "CPU checkpoint resumed on the GPU" c2g cpu 11 20 $BAND loss grad_norm
  # The GPU run's final weights scored on both backends.
  "$B/mceval" gpu --data corpus.h5 --device cpu > ev_cpu.log 2>&1 || { cat ev_cpu.log; die "mceval --device cpu"; }
  "$B/mceval" gpu --data corpus.h5 --device cuda > ev_gpu.log 2>&1 || { cat ev_gpu.log; die "mceval --device cuda"; }
  a=$(sed -n 's/^loss=\([^ ]*\) .*/\1/p' ev_cpu.log); b=$(sed -n 's/^loss=\([^ ]*\) .*/\1/p' ev_gpu.log)
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3e", (a != "" && b != "") ? d / a : 1 }')
  echo "== mceval of gpu/step_20: cpu $a, cuda $b, rel diff $r"
  awk -v r="$r" -v b="$BAND" 'BEGIN { exit !(r <= b) }' || die "mceval cpu $a vs cuda $b: rel diff $r > $BAND"
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
[ $fail = 0 ] && echo "cuda_train $MODE: ok"
exit $fail
