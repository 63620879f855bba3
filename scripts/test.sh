#!/usr/bin/env bash
# One command on a fresh Debian machine: install everything the tests need (apt, npm), build,
# and run every test (C++ GoogleTest suites and the Python reference tests) through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh --with-python --with-browser
[ -x scripts/setup-npm.sh ] && scripts/setup-npm.sh
scripts/build.sh
export OMP_NUM_THREADS=2
ctest --test-dir build --output-on-failure -j2 --timeout 900
