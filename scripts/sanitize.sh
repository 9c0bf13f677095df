#!/usr/bin/env bash
# ASan + UBSan build (build-asan/, -DMC_SANITIZE=ON, CPU only) and a run of the test suite
# under it; any sanitizer report fails the test that made it (docs/reliability.md).
#   scripts/sanitize.sh [ctest -R regex]     default: the ckpt, core, reshard, reliability, plan and
#                                            comm tests, the CPU kernel tests, the training unit and
#                                            end-to-end tests, and five mpirun tests (TP, EP with a
#                                            capacity, TP+SP+EP+ZeRO-1, PP+EP+ZeRO-3, mctrain's errors;
#                                            all 74 dist tests would take some 8 minutes more); the
#                                            ones that measure memory (RSS) are left out (ASan's shadow
#                                            memory and quarantine inflate it) and every test's timeout
#                                            is 5x (tests/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI and OpenBLAS keep allocations until exit by design: leaks are checked, not theirs.
# fast_unwind_on_malloc=0: whole stacks, so that the suppressions can match library frames.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:exitcode=99:fast_unwind_on_malloc=0
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
DEFAULT='^(ckpt|core|reshard|reliability|plan|comm)\.|^kernels\.(test_ops_|kernel_map|reference_model)'
DEFAULT+='|^train\.(test_|e2e_|tfevents_run)|^dist\.(tp2_net|dp2_ep2_capacity|tp2_dp2_sp_ep2_zero1|pp2_dp2_ep2_zero3|mctrain_errors)$'
cmake -S . -B build-asan -DMC_DISABLE_CUDA=ON -DMC_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j"$(nproc)"
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" --timeout 1800 -R "${1:-$DEFAULT}" \
  -E "memory"
