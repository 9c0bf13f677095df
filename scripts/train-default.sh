#!/usr/bin/env bash
# The main job: on a Debian 12 machine (root), install what MegaC needs, build it in build/,
# prepare the default corpus data/default_corpus.h5 (fortunes + King James Bible text, bytes)
# if it is missing, and train the embedded default model with `mctrain` (no arguments).
# Results: runs/default/{step_*, latest, metrics.jsonl, metrics.svg}. A previous
# runs/default is kept, renamed to runs/default.prev-<time>.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# The corpus also wants the Bible text (package bible-kjv provides the `bible` reader and
# its data); training works without it, on the fortunes alone.
if ! command -v bible >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bible-kjv \
    || echo "train-default: bible-kjv not installable; the corpus will be the fortunes only"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)" --target mcdata mctrain mceval

if [ ! -f data/default_corpus.h5 ]; then
  mkdir -p data
  # Fortune text files: the cookie files themselves, not their .dat indexes or .u8 copies.
  mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  if command -v bible >/dev/null 2>&1; then
    bible -f "gen1:1-rev22:21" > data/kjv.txt.tmp && mv data/kjv.txt.tmp data/kjv.txt
    files+=(data/kjv.txt)
  fi
  if ((${#files[@]} == 0)); then
    echo "train-default: no corpus text found (is the fortunes package installed?)" >&2
    exit 1
  fi
  build/mcdata -o data/default_corpus.h5 "${files[@]}"
fi

if [ -e runs/default ]; then
  prev="runs/default.prev-$(date +%Y%m%d-%H%M%S)"
  echo "train-default: keeping the previous run as $prev"
  mv runs/default "$prev"
fi
exec build/mctrain
