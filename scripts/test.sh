#!/usr/bin/env bash
# One command on a fresh Debian machine: install everything the tests need (apt, npm), build,
# and run every test (C++ GoogleTest suites and the Python reference tests) through ctest.
set -euo pipefail
case "${1:-}" in
  -h|--help) printf '%s\n' "usage: scripts/test.sh" "Installs everything the tests need (apt, npm), builds, and runs every test through ctest,
then the sanitizer stage (ASan + UBSan build, unit tests and fuzz regressions)."; exit 0 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup-deps.sh --with-python --with-browser
[ -x scripts/setup-npm.sh ] && scripts/setup-npm.sh
scripts/build.sh
export OMP_NUM_THREADS=2
ctest --test-dir build --output-on-failure -j2 --timeout 900

# Sanitizer stage (issue #10): a clang build with ASan + UBSan (+ libFuzzer, -O1, no CUDA, no
# benchmarks) of every library, their unit tests and the fuzz targets. ctest runs the unit tests
# once under the sanitizers (UB, and leaks at exit, fail too) and each fuzz target's regression
# run from its committed corpus (tests fuzz_<target>, label fuzz). test_runtime brings the `cedar`
# binary and the examples, which its tests (and openai_client) run as processes: they inherit
# ASAN_OPTIONS, so a leak at the exit of an example or of `cedar serve` fails the test that ran it.
# Not in this stage: the Python reference tests (no cedar code) and the browser test.
# Excluded here (all of them run in the normal build above):
# - store_faults.sigkill_at_random_points_*: its kill window (0-40 ms) is sized for release-speed
#   writers: under ASan few writes land before the kill, so its progress checks (not its
#   durability checks) fail. soak_short_*: the same kill-at-random-moments design, for whole
#   agent turns (and cedar_soak is not built here).
# - asan_slow: runtime tests that are long model generations, 20-45x slower under ASan (seconds
#   release -> ASan on a loaded 2-core machine: EvalEndToEnd.CiSet* 37 -> 815, SixtyFour* 5 -> 97,
#   ReplayVersusExact* 2 -> 88; ShippedModelRecalls*: a 10K-token session); the code they run is run by shorter tests of the
#   same suites (concurrent agents: ServeApi.ConcurrentRequestsAllComplete; bounded replay:
#   Resume.*, Runtime.RestartResumes*; the eval runner: EvalEndToEnd.ResumePolicies*).
asan_slow='Runtime\.SixtyFourConcurrentAgentsShareOneExecutor|Resume\.ReplayVersusExactNext64Tokens'
asan_slow+='|EvalEndToEnd\.CiSetRunsThroughTheRuntimeWithBoundedReplay'
asan_slow+='|EvalEndToEnd\.ShippedModelRecallsAValueEightThousandTokensBack'
CC=clang CXX=clang++ cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DCEDAR_FUZZ=ON \
  -DCEDAR_CUDA=OFF -DCEDAR_BUILD_BENCH=OFF >/dev/null
asan_targets=(test_kernels test_model test_sessions test_tools_mcp mcp_conformance_client test_runtime)
for f in tests/fuzz/fuzz_*.cpp; do asan_targets+=("$(basename "$f" .cpp)"); done
cmake --build build-asan -j"$(nproc 2>/dev/null || echo 2)" --target "${asan_targets[@]}"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j2 --timeout 900 \
  -L '^(kernels|model|sessions|tools_mcp|runtime|fuzz)$' \
  -E "store_faults\.sigkill_at_random_points|soak_short_|${asan_slow}"
