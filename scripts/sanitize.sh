#!/usr/bin/env bash
# ASan + UBSan build (build-asan/, -DMC_SANITIZE=ON, CPU only) and a run of the test suite
# under it; any sanitizer report fails the test that made it (docs/reliability.md).
#   scripts/sanitize.sh [ctest -R regex]     default: every test of the suite (the GPU tests skip in
#                                            a build without CUDA) but the three that measure memory
#                                            by RSS (reshard.test_reshard_memory, reshard.files_memory,
#                                            train.test_memory: ASan's shadow memory and quarantine
#                                            inflate it); every test's timeout is 5x
#                                            (tests/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI and OpenBLAS keep allocations until exit by design: leaks are checked, not theirs.
# fast_unwind_on_malloc=0: whole stacks, so that the suppressions can match library frames.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:exitcode=99:fast_unwind_on_malloc=0
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
DEFAULT='.'
cmake -S . -B build-asan -DMC_DISABLE_CUDA=ON -DMC_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j"$(nproc)"
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" --timeout 1800 -R "${1:-$DEFAULT}" \
  -E '^(reshard\.test_reshard_memory|reshard\.files_memory|train\.test_memory)$'
