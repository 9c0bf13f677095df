#!/bin/bash
# The small checkpoint fuzz_rankfile starts from: make_ckpt.sh BINARY_DIR OUT_DIR synthesizes a
# tiny checkpoint (bench_reshard --synth --tiny) and links its step directory as OUT_DIR/step.
set -euo pipefail
B=$1
O=$2
rm -rf "$O"
mkdir -p "$O"
"$B/bench_reshard" --synth "$O/run" --tiny > "$O/synth.log" 2>&1 || { cat "$O/synth.log"; exit 1; }
step=$(ls -d "$O"/run/step_* | head -1)
ln -s "$step" "$O/step"
test -f "$O/step/manifest.json"
