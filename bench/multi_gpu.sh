#!/usr/bin/env bash
# Multi-GPU speed of mctrain (issue 14): one configuration (default configs/nam-small.json,
# bf16) on 1, 2 and 4 GPUs in several layouts, each started by mctrain --nproc-per-node N.
# Per run: tokens/s (median of steps FROM..UNTIL, default 4..10, each step logged; FROM=21
# UNTIL=30 times steady steps, after the routing and cuBLASLt's shape classes settle), MFU against the bf16 matmul
# peak measured in the same invocation (bench/torch_peak.py) times N, scaling efficiency
# (tokens/s over N x the one-GPU tokens/s; data-parallel runs scale the global batch with dp,
# so every replica runs the one-GPU step), and rank 0's communication time per step (the
# trainer's comm_s: with MC_NCCL_BLOCKING=1 calls block, so all of it is exposed; by default
# device-buffer calls only queue on the compute stream and comm_s is their queuing; on pipeline stages it includes the
# bubble). Then periodic async saves from every rank of the largest DP run: the training
# pause each save reports and the step times around it.
# LAYOUTS=medium instead runs configs/nam-medium.json's own layout (dp2 x ep2, ZeRO 1, bf16,
# train.recompute=full as the config says; RECOMPUTE=none|selective overrides it) on 2 GPUs
# and dp4 x ep2 / dp4 x ep4 on 4, scaled against the 2-GPU run per GPU.
# LAYOUTS=zero runs one GPU and dp2 with ZeRO 0, 1 and 3 (the config's dtype: bf16 for nam-small);
# with PEER=1 also the PyTorch peer (bench/torch_hybrid.py, compiled) on one GPU and on 2 under
# torchrun as DDP and as FSDP2, each rank with the one-GPU step, scaled against the peer's
# one-GPU run. MICRO=M sets train.micro_batch on both sides (the peer is host-bound at 2).
# Usage (repository root, on the GPU machine): OUT=DIR MEGAC_BIN=DIR [CONFIG=configs/nam-small.json]
#   [LAYOUTS=small|medium|zero|tp] [SAVES=1] [SPLIT=0] [FROM=4] [UNTIL=10] [MC_COMMIT=SHA] bash bench/multi_gpu.sh
# LAYOUTS=tp runs one GPU and the tensor-parallel rows only: tp2, tp2+sp, tp2+sp x ep2 (2 GPUs),
# tp2 x dp2, tp2+sp x dp2, tp2 x pp2 (4 GPUs).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?}
B=${MEGAC_BIN:?}
LAYOUTS=${LAYOUTS:-small}
case "$LAYOUTS" in small | medium | zero | tp) ;; *) echo "multi_gpu.sh: LAYOUTS=$LAYOUTS: expected small, medium, zero or tp" >&2; exit 2 ;; esac
case "${SPLIT:-0}" in 0 | 1) ;; *) echo "multi_gpu.sh: SPLIT=$SPLIT: expected 0 or 1" >&2; exit 2 ;; esac
if [ "$LAYOUTS" = medium ]; then CONFIG=${CONFIG:-configs/nam-medium.json}; else CONFIG=${CONFIG:-configs/nam-small.json}; fi
EXTRA=()
[ -n "${RECOMPUTE:-}" ] && EXTRA=(--set train.recompute="$RECOMPUTE")
[ -n "${MICRO:-}" ] && EXTRA+=(--set train.micro_batch="$MICRO")
UNTIL=${UNTIL:-10}
FROM=${FROM:-4}
[ "$FROM" -ge 1 ] && [ "$FROM" -le "$UNTIL" ] 2>/dev/null || { echo "multi_gpu.sh: FROM=$FROM must be in 1..UNTIL=$UNTIL" >&2; exit 2; }
NGPU=$(nvidia-smi -L | grep -c '^GPU')
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export NCCL_NVLS_ENABLE=0
{
  echo "# date: $(date -u +%FT%TZ)"
  echo "# commit: ${MC_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# card: /'
  echo "# config: $CONFIG (train.dtype and device as there), steps 1..$UNTIL, median of steps $FROM..$UNTIL"
} | tee -a "$OUT/multi_gpu.txt"
python3 bench/torch_peak.py --json-out "$W/peak.json" > "$W/peak.log" 2>&1 || cat "$W/peak.log"
peak=$(python3 -c "import json; print(json.load(open('$W/peak.json'))['bf16']['tflops'])" 2>/dev/null || echo 0)
# the first "per token" line: model FLOPs (3 x forward), the convention MFU is computed from
flop=$("$B/mcplan" --config "$CONFIG" "${EXTRA[@]}" 2>/dev/null | sed -n 's/^ *per token: *\([0-9.e+]*\).*/\1/p' | head -1)
echo "# bf16 matmul peak $peak TFLOP/s per GPU (bench/torch_peak.py); model FLOP per token $flop (mcplan)" | tee -a "$OUT/multi_gpu.txt"
find . -path ./build\* -prune -o -path ./gpubuild -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) -print |
  sort > "$W/files.txt"
"$B/mcdata" -o "$W/corpus.h5" $(cat "$W/files.txt") > "$W/mcdata.log" 2>&1 || { cat "$W/mcdata.log"; exit 1; }
gb=$(python3 -c "import json; print(json.load(open('$CONFIG'))['train']['global_batch'])")

base=0 # tokens/s per GPU of the first run: the scaling reference
printf '%-28s %4s %12s %7s %8s %10s %s\n' layout gpus tokens/s MFU scaling comm_s/step step_s | tee -a "$OUT/multi_gpu.txt"
# train DIR LOG N DP ARGS...: one mctrain job of N workers, global batch = the config's x DP
train() {
  local dir=$1 log=$2 n=$3 dp=$4; shift 4
  timeout 300 "$B/mctrain" --nproc-per-node "$n" --config "$CONFIG" --set data.path="$W/corpus.h5" \
    --set checkpoint.dir="$dir" --set checkpoint.every=0 --set train.log_every=1 --set train.eval_every=0 \
    --set train.global_batch=$((gb * dp)) --set parallel.dp="$dp" --until "$UNTIL" "${EXTRA[@]}" "$@" > "$log" 2>&1
}
# run NAME N DP ARGS...: the timed run; with SPLIT=1 then a second run profiled on steps
# FROM..UNTIL (MC_CUDA_PROFILE, one file per worker), each rank's step split into GPU time in
# ops and the rest (exposed communication, pipeline bubble, host waits: bench/step_split.py)
run() {
  local name=$1 n=$2 dp=$3; shift 3
  [ "$n" -le "$NGPU" ] || { echo "$name: skipped ($n GPUs, $NGPU here)" | tee -a "$OUT/multi_gpu.txt"; return; }
  local dir="$W/$name"
  train "$dir" "$OUT/run_$name.log" "$n" "$dp" "$@" \
    || { echo "$name: FAILED ($(tail -1 "$OUT/run_$name.log"))" | tee -a "$OUT/multi_gpu.txt"; return; }
  if [ "${SPLIT:-0}" = 1 ]; then
    if MC_CUDA_PROFILE="$W/prof_${name}_%p.txt" MC_CUDA_PROFILE_STEPS="$FROM:$UNTIL" \
      train "$W/${name}_prof" "$OUT/run_${name}_prof.log" "$n" "$dp" "$@"; then
      python3 bench/step_split.py "$name" "$W"/prof_"$name"_*.txt | tee -a "$OUT/multi_gpu.txt"
    else
      echo "$name: profiled run FAILED ($(tail -1 "$OUT/run_${name}_prof.log"))" | tee -a "$OUT/multi_gpu.txt"
    fi
  fi
  python3 - "$dir/metrics.jsonl" "$name" "$n" "$peak" "$flop" "$base" "$UNTIL" "$FROM" <<'PY' | tee -a "$OUT/multi_gpu.txt"
import json, statistics, sys
path, name, n, peak, flop, base, until = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5] or 0), float(sys.argv[6]), int(sys.argv[7])
first = int(sys.argv[8])
recs = [json.loads(l) for l in open(path) if '"step"' in l]
st = [r for r in recs if first <= r["step"] <= until]
tps = statistics.median(r["tokens_per_s"] for r in st)
comm = statistics.median(r.get("comm_s", 0.0) for r in st)
tok_step = recs[-1]["tokens"] / recs[-1]["step"]
mfu = tps * flop / (n * peak * 1e12) if peak > 0 else 0
scal = tps / (n * base) if base > 0 else 1.0  # base: tokens/s per GPU of the first run
print(f"{name:<28} {n:>4} {tps:>12.0f} {100*mfu:>6.1f}% {100*scal:>7.1f}% {comm:>10.4f} {tok_step/tps:.4f}")
PY
  if [ "$base" = 0 ]; then
    base=$(python3 -c "import json,statistics; r=[json.loads(l) for l in open('$dir/metrics.jsonl') if '\"step\"' in l]; print(statistics.median(x['tokens_per_s'] for x in r if $FROM <= x['step'] <= $UNTIL) / $n)")
  fi
}
if [ "$LAYOUTS" = medium ]; then
  gb=$((gb / 2)) # the config's global batch is for its dp=2
  run dp2_ep2_zero1 2 2 --set parallel.ep=2 --set parallel.zero=1
  run dp4_ep2_zero1 4 4 --set parallel.ep=2 --set parallel.zero=1
  run dp4_ep4_zero1 4 4 --set parallel.ep=4 --set parallel.zero=1
  exit 0
fi
# peer NAME N DIST: the PyTorch peer on N GPUs (DIST none, ddp or fsdp), a row of the same table
pbase=0
peer() {
  local name=$1 n=$2 kind=$3
  [ "$n" -le "$NGPU" ] || { echo "$name: skipped ($n GPUs, $NGPU here)" | tee -a "$OUT/multi_gpu.txt"; return; }
  local launch=(python3) dtype
  [ "$n" -gt 1 ] && launch=(torchrun --standalone --nproc-per-node "$n")
  dtype=$(python3 -c "import json; print(json.load(open('$CONFIG'))['train'].get('dtype', 'fp32'))")
  timeout 400 "${launch[@]}" bench/torch_hybrid.py --config "$CONFIG" --dtype "$dtype" --mode compile --dist "$kind" \
    ${MICRO:+--micro-batch "$MICRO"} --flops-per-token "$flop" --peak-tflops "$peak" --json-out "$W/$name.json" \
    > "$OUT/run_$name.log" 2>&1 || { echo "$name: FAILED ($(tail -1 "$OUT/run_$name.log"))" | tee -a "$OUT/multi_gpu.txt"; return; }
  python3 - "$W/$name.json" "$name" "$n" "$pbase" <<'PY' | tee -a "$OUT/multi_gpu.txt"
import json, sys
r, name, n, base = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
scal = r["tokens_per_s"] / (n * base) if base > 0 else 1.0
print(f"{name:<28} {n:>4} {r['tokens_per_s']:>12.0f} {100 * r.get('mfu', 0):>6.1f}% {100 * scal:>7.1f}% {'-':>10} {r['step_s_median']:.4f}")
PY
  [ "$pbase" = 0 ] && pbase=$(python3 -c "import json; print(json.load(open('$W/$name.json'))['tokens_per_s'])")
}
if [ "$LAYOUTS" = tp ]; then # tensor parallelism alone and with SP, EP, DP and PP
  run 1gpu 1 1
  run tp2 2 1 --set parallel.tp=2
  run tp2_sp 2 1 --set parallel.tp=2 --set parallel.sp=true
  run tp2_sp_ep2 2 1 --set parallel.tp=2 --set parallel.sp=true --set parallel.ep=2
  run tp2_dp2 4 2 --set parallel.tp=2
  run tp2_sp_dp2 4 2 --set parallel.tp=2 --set parallel.sp=true
  run tp2_pp2 4 1 --set parallel.tp=2 --set parallel.pp=2 --set parallel.pp_split=weighted
  exit 0
fi
if [ "$LAYOUTS" = zero ]; then # bf16 ZeRO stages on 2 GPUs: what sharding costs
  run 1gpu 1 1
  for z in 0 1 3; do run dp2_zero$z 2 2 --set parallel.zero=$z; done
  if [ "${PEER:-0}" = 1 ]; then
    peer peer_1gpu 1 none
    peer peer_ddp2 2 ddp
    peer peer_fsdp2 2 fsdp
  fi
  exit 0
fi
run 1gpu 1 1
run dp2 2 2
run tp2 2 1 --set parallel.tp=2
run pp2 2 1 --set parallel.pp=2 --set parallel.pp_split=weighted
run pp2_gb4x 2 1 --set parallel.pp=2 --set parallel.pp_split=weighted --set train.global_batch=$((gb * 4)) # 4x the micro-batches: a smaller 1F1B bubble
run dp2_ep2 2 2 --set parallel.ep=2
run dp4 4 4
run tp2_dp2 4 2 --set parallel.tp=2
run pp2_dp2 4 2 --set parallel.pp=2 --set parallel.pp_split=weighted
run dp4_ep4 4 4 --set parallel.ep=4
run dp4_ep2 4 4 --set parallel.ep=2
run tp2_pp2 4 1 --set parallel.tp=2 --set parallel.pp=2 --set parallel.pp_split=weighted
[ "${SAVES:-1}" = 1 ] || exit 0
# periodic async saves from every rank at once
n=$((NGPU >= 4 ? 4 : 2))
dir="$W/saves"
timeout 300 "$B/mctrain" --nproc-per-node $n --config "$CONFIG" --set data.path="$W/corpus.h5" --set checkpoint.dir="$dir" \
  --set checkpoint.every=3 --set checkpoint.keep=2 --set train.log_every=1 --set train.eval_every=0 \
  --set train.global_batch=$((gb * n)) --set parallel.dp=$n --until 12 > "$OUT/run_saves.log" 2>&1 || echo "saves run FAILED"
{
  echo "== periodic async saves, dp$n on $n GPUs, checkpoint.every=3 (every rank writes its primaries)"
  grep -E "queued|paused|checkpoint" "$OUT/run_saves.log" | head -10
  python3 -c "
import json
for l in open('$dir/metrics.jsonl'):
    if '\"step\"' in l:
        r = json.loads(l); print('step %2d  %8.0f tokens/s  comm_s %.4f' % (r['step'], r['tokens_per_s'], r.get('comm_s', 0)))"
  du -sh "$dir"/step_* 2>/dev/null | tail -1
} | tee -a "$OUT/multi_gpu.txt"
