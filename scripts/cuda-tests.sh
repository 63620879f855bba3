#!/usr/bin/env bash
# Runs the CUDA tests on a machine with an NVIDIA GPU: the op tests (test_cuda: every op against
# a CPU oracle) and the cuda backend end to end (test_cuda_model: decode steps, chunked prefill,
# bounded replay and resume hints against the CPU runner on the shipped model and an FP8/FP4
# random model).
#
# usage: scripts/cuda-tests.sh [--help] [TEST_BINARY...] [-- gtest flags...]
#
# Binaries default to build/tests/test_cuda and build/tests/test_cuda_model (`cmake --build
# build --target test_cuda test_cuda_model`; the CUDA runtime is linked statically, so they can
# be built on a machine without a GPU and copied to one; test_cuda_model also needs the shared
# libraries of cedar_model: OpenBLAS, simdjson, PCRE2). Results go to $OUT/<binary>.json when
# $OUT is set (the GPU machine's output folder), else to build/<binary>.json. Exit status: 0
# when every binary passed.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bins=()
while [[ $# -gt 0 && "$1" != "--" ]]; do bins+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
[[ ${#bins[@]} -eq 0 ]] && bins=(build/tests/test_cuda build/tests/test_cuda_model)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export CEDAR_SOURCE_DIR="${CEDAR_SOURCE_DIR:-$PWD}"  # the shipped model, wherever the checkout is
rc=0
for bin in "${bins[@]}"; do
  if [[ ! -x "$bin" ]]; then
    echo "cuda-tests: $bin not found; build it with: cmake --build build --target $(basename "$bin")" >&2
    rc=2
    continue
  fi
  json="${OUT:-build}/$(basename "$bin").json"
  mkdir -p "$(dirname "$json")"
  "$bin" --gtest_output="json:$json" "$@" || rc=1
done
exit $rc
