#!/usr/bin/env bash
# Recomputation benchmark (issue 16): mctrain once per train.recompute policy (none, selective,
# full) on one configuration, a few steps each (bench/megac_run.py), then one table
# (bench/recompute_table.py): tokens/s (median of the steps after the warm-up), the activations
# arena the trainer measured after step 1 (its memory report) against mcplan's activations for
# the same configuration and policy, mcplan's recomputed and hardware FLOPs per token, and the
# peak device memory nvidia-smi saw (the trainer reports none itself).
# GPU run (repository root of a CUDA build; MEGAC_BIN: the folder holding its mctrain, mcplan
# and mcdata; MC_COMMIT: the commit, where the copy has no .git):
#   MEGAC_BIN=build MC_COMMIT=$(git rev-parse --short HEAD) bash bench/recompute.sh results/bench/recompute
# CPU smoke test:
#   DEVICE=cpu DTYPE=fp32 CONFIG=configs/tiny.json STEPS=3 bash bench/recompute.sh /tmp/recompute
# Environment: CONFIG (configs/nam-small.json), DEVICE (cuda), DTYPE (bf16), STEPS (8: steps per
# policy), WARMUP (2, at most STEPS-1: the first steps, left out of the median), MEGAC_BIN
# (build), DATA (an mcdata corpus; default: mcdata over the repository's sources and docs, as
# bench/run_bench.sh makes it). Results go to the folder given as argument, else $OUT, else
# results/bench/recompute: recompute.txt (machine, commit, table), run_<policy>.{json,log},
# mcplan_<policy>.json. One process per run: layouts of one rank.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-results/bench/recompute}}
CONFIG=${CONFIG:-configs/nam-small.json} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bf16}
STEPS=${STEPS:-8} WARMUP=${WARMUP:-2}
[ "$WARMUP" -lt "$STEPS" ] || WARMUP=$((STEPS - 1))
bin=${MEGAC_BIN:-build}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  machine=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)
else
  machine="CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
fi
commit=${MC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${MC_COMMIT:-}" ] && git rev-parse -q HEAD >/dev/null 2>&1 && ! git diff --quiet HEAD; then
  commit="$commit (uncommitted changes)"
fi

data=${DATA:-}
if [ -z "$data" ]; then
  data=$tmp/corpus.h5
  find . -path ./build\* -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) -print | sort >"$tmp/files.txt"
  "$bin/mcdata" --config "$CONFIG" -o "$data" $(cat "$tmp/files.txt") >"$tmp/mcdata.log"
fi

sets=(--set "train.dtype=$DTYPE" --set "train.device=$DEVICE")
for p in none selective full; do
  echo "== $p"
  python3 bench/megac_run.py --bin "$bin" --config "$CONFIG" --dtype "$DTYPE" --device "$DEVICE" --data "$data" \
    --warmup "$WARMUP" --steps $((STEPS - WARMUP)) --set "train.recompute=$p" --json-out "$out/run_$p.json" \
    >"$out/run_$p.log" 2>&1 || { echo "mctrain under $p failed: $out/run_$p.log" >&2; tail -n 20 "$out/run_$p.log" >&2; exit 1; }
  tail -n 1 "$out/run_$p.log"
  "$bin/mcplan" --config "$CONFIG" "${sets[@]}" --set "train.recompute=$p" --json >"$out/mcplan_$p.json"
done

{ echo "# recompute benchmark: $CONFIG, train.device=$DEVICE, train.dtype=$DTYPE, $STEPS steps per policy"
  echo "# $(date -u +%FT%TZ), commit $commit"
  echo "# machine: $machine"
  echo "# command: CONFIG=$CONFIG DEVICE=$DEVICE DTYPE=$DTYPE STEPS=$STEPS WARMUP=$WARMUP MEGAC_BIN=$bin bash bench/recompute.sh $out"
  python3 bench/recompute_table.py "$out" none selective full; } | tee "$out/recompute.txt"
