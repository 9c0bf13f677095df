#!/usr/bin/env bash
# Device-side driver of the speed benchmark (issue 7), MegaC and its PyTorch peer in one
# invocation on one GPU: card, matmul peak, the peer's self-check, then MegaC's mctrain on
# {nam-small, dense-a} x {bf16, fp32} (bench/megac_run.py; MEGAC_BIN holds mctrain and mcdata),
# then the peer's {nam-small, dense-a} x {eager, compile} x {fp32, bf16}; each run is its own
# process with a time limit inside BUDGET seconds; ends with one table. FLOPs per token and
# parameter counts come from results/bench/torch_mcplan.txt (mcplan, run on the CPU host).
# Usage (repository root): OUT=DIR MC_COMMIT=SHA BUDGET=600 MEGAC_BIN=DIR [TORCH=0] [CROSSCHECK=NPZ]
#   bash bench/run_bench.sh
# (TORCH=0 skips the peer; CROSSCHECK: a file from torch_hybrid.py --export-megac, see docs/bench-torch.md)
# Writes $OUT/bench.log and $OUT/bench_results.json; committed runs go to results/bench/ as
# bench_<date>.txt and bench_results_<date>.json (results/README.md says what a file records).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/torch_bench_out}
BUDGET=${BUDGET:-500}
RUNS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }

{
  echo "# date: $(date -u +%FT%TZ)"
  echo "# commit: ${MC_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/# card: /'
  python3 -c 'import torch, triton; print("# torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "== matmul peak"
  python3 bench/torch_peak.py --json-out "$RUNS/peak.json" || echo "peak FAILED rc=$?"
  peak=$(python3 -c "import json; print(json.load(open('$RUNS/peak.json'))['bf16']['tflops'])" 2>/dev/null || echo 0)
  echo "== selfcheck"
  [ "${TORCH:-1}" = 0 ] || python3 bench/torch_hybrid.py --selfcheck || echo "selfcheck FAILED rc=$?"
  if [ -n "${CROSSCHECK:-}" ]; then
    echo "== crosscheck against MegaC ($CROSSCHECK)"
    python3 bench/torch_hybrid.py --crosscheck "$CROSSCHECK" || echo "crosscheck FAILED rc=$?"
  fi
  if [ -n "${MEGAC_BIN:-}" ]; then
    echo "== MegaC corpus (mcdata over the repository's sources)"
    find . -path ./build\* -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) -print |
      sort > "$RUNS/files.txt"
    "$MEGAC_BIN/mcdata" --config configs/nam-small.json -o "$RUNS/corpus.h5" $(cat "$RUNS/files.txt") | tail -n 2
    for spec in "nam-small bf16 90" "dense-a bf16 90" "nam-small fp32 90" "dense-a fp32 120"; do
      set -- $spec
      cfg=$1 dtype=$2 cap=$3
      flops=$(awk -v c=$cfg '$1 == c {print $4}' results/bench/torch_mcplan.txt)
      lim=$(left)
      [ "$lim" -gt "$cap" ] && lim=$cap
      if [ "$lim" -lt 20 ]; then echo "== $cfg megac $dtype: SKIPPED (budget spent)"; continue; fi
      echo "== $cfg megac $dtype (limit ${lim}s)"
      timeout "$lim" python3 bench/megac_run.py --bin "$MEGAC_BIN" --config configs/$cfg.json --dtype $dtype \
        --data "$RUNS/corpus.h5" --flops-per-token "$flops" --peak-tflops "$peak" \
        --json-out "$RUNS/$cfg-megac-$dtype.json" 2>&1 | tail -n 40
      rc=${PIPESTATUS[0]}
      [ "$rc" -ne 0 ] && echo "$cfg megac $dtype FAILED rc=$rc"
    done
    rm -f "$RUNS/corpus.h5" "$RUNS/files.txt"
  fi
  for spec in "eager bf16 60" "eager fp32 90" "compile bf16 200" "compile fp32 200"; do
    set -- $spec
    mode=$1 dtype=$2 cap=$3
    for cfg in nam-small dense-a; do
      flops=$(awk -v c=$cfg '$1 == c {print $4}' results/bench/torch_mcplan.txt)
      [ "${TORCH:-1}" = 0 ] && continue
      lim=$(left)
      [ "$lim" -gt "$cap" ] && lim=$cap
      if [ "$lim" -lt 20 ]; then echo "== $cfg $mode $dtype: SKIPPED (budget spent)"; continue; fi
      echo "== $cfg $mode $dtype (limit ${lim}s)"
      timeout "$lim" python3 bench/torch_hybrid.py --config configs/$cfg.json --mode $mode --dtype $dtype \
        --flops-per-token "$flops" --peak-tflops "$peak" --json-out "$RUNS/$cfg-$mode-$dtype.json" 2>&1 |
        grep -v '^\s*$' | tail -n 40
      rc=${PIPESTATUS[0]}
      [ "$rc" -ne 0 ] && echo "$cfg $mode $dtype FAILED rc=$rc"
    done
  done
  echo "== table (elapsed $(($(date +%s) - start)) s)"
  python3 bench/torch_hybrid.py --summarize "$RUNS" --json-out "$OUT/bench_results.json"
} 2>&1 | tee "$OUT/bench.log"
