#!/usr/bin/env bash
# libFuzzer harnesses of tests/fuzz/ (docs/reliability.md), built with clang in build-fuzz/
# (-DMC_FUZZ=ON: ASan + UBSan + fuzzer instrumentation).
#   scripts/fuzz.sh              replay every committed corpus input, then a fixed number of new
#                                inputs per harness from a fixed seed (what CI runs)
#   scripts/fuzz.sh long [SECS] [HARNESS...]
#                                fuzz each harness for SECS seconds (default 600) from its corpus;
#                                new coverage is merged into tests/fuzz/corpus/<name>/ and any
#                                crash is copied there as a regression input (commit them)
# MC_FUZZ_FORGE=1 with fuzz_rankfile forges the manifest so inputs reach libhdf5 (long runs only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (Debian: apt-get install clang)" >&2; exit 1; }
mkdir -p build-fuzz
CC=clang cmake -S . -B build-fuzz -DMC_DISABLE_CUDA=ON -DMC_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > build-fuzz/build.log
HARNESSES=(config manifest latest rankfile safetensors)
cmake --build build-fuzz -j"$(nproc)" --target bench_reshard $(printf 'fuzz_%s ' "${HARNESSES[@]}") >> build-fuzz/build.log || { tail -50 build-fuzz/build.log; exit 1; }
if [ "${1:-}" != long ]; then
  ctest --test-dir build-fuzz --output-on-failure -R '^fuzz\.' -j"$(nproc)"
  exit
fi
SECS=${2:-600}
shift $(( $# > 1 ? 2 : 1 ))
[ $# -gt 0 ] && HARNESSES=("$@")
export MC_FUZZ_CKPT=$ROOT/build-fuzz/tests/fuzz-ckpt/step
tests/fuzz/make_ckpt.sh "$ROOT/build-fuzz" "$ROOT/build-fuzz/tests/fuzz-ckpt"
status=0
for h in "${HARNESSES[@]}"; do
  new=$ROOT/build-fuzz/fuzz-long/$h
  mkdir -p "$new"
  echo "== fuzz_$h for $SECS s"
  (cd "$new" && "$ROOT/build-fuzz/tests/fuzz_$h" -max_total_time="$SECS" -max_len=65536 -timeout=20 \
      -artifact_prefix="$ROOT/tests/fuzz/corpus/$h/crash-" "$new" "$ROOT/tests/fuzz/corpus/$h") || status=1
  "$ROOT/build-fuzz/tests/fuzz_$h" -merge=1 "$ROOT/tests/fuzz/corpus/$h" "$new" > /dev/null 2>&1 || true
done
exit $status
