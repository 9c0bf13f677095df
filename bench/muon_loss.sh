#!/usr/bin/env bash
# AdamW alone vs AdamW + Muon (optim.groups=muon:matrices,adamw:all) on the embedded default
# (the tiny model, the default corpus, 600 steps, CPU), same seed and schedule; then the
# training and validation losses of both as one picture (bench/loss_svg.py).
#   bench/muon_loss.sh [OUTDIR]   default results/bench; runs go to runs/muon-loss-*
# Needs build/mctrain and data/default_corpus.h5 (scripts/train-default.sh makes both).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench}
mkdir -p "$out"
for g in adamw muon; do
  groups=adamw:all
  [ "$g" = muon ] && groups=muon:matrices,adamw:all
  rm -rf "runs/muon-loss-$g"
  /usr/bin/time -f "%e s wall" build/mctrain --set optim.groups="$groups" --set checkpoint.dir="runs/muon-loss-$g" \
    --set checkpoint.every=0 --set checkpoint.keep=1 2>&1 | tail -n 3
done
python3 bench/loss_svg.py "$out/muon_loss.svg" "AdamW (adamw:all)=runs/muon-loss-adamw/metrics.jsonl" \
  "AdamW + Muon (muon:matrices,adamw:all)=runs/muon-loss-muon/metrics.jsonl" | tee "$out/muon_loss.txt"
