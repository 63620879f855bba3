#!/usr/bin/env bash
# Runs the CUDA op tests (tests/cuda/, binary test_cuda) on a machine with an NVIDIA GPU.
#
#   scripts/cuda-tests.sh [--help] [TEST_BINARY] [gtest flags...]
#
# TEST_BINARY defaults to build/tests/test_cuda (`cmake --build build --target test_cuda`; the
# binary links the CUDA runtime statically and needs only libstdc++ and the NVIDIA driver, so it
# can be built on a machine without a GPU and copied to one). Results also go to
# $OUT/cuda-tests.json when $OUT is set (the GPU machine's output folder), else to
# build/cuda-tests.json. Exit status: the test program's.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bin="build/tests/test_cuda"
if [[ $# -gt 0 && "$1" != -* ]]; then bin="$1"; shift; fi
if [[ ! -x "$bin" ]]; then
  echo "cuda-tests: $bin not found; build it with: cmake --build build --target test_cuda" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
json="${OUT:-build}/cuda-tests.json"
mkdir -p "$(dirname "$json")"
"$bin" --gtest_output="json:$json" "$@"
