#!/usr/bin/env bash
# Configures and builds cedar (Release) into build/. Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
case "${1:-}" in
  -h|--help) printf '%s\n' "usage: scripts/build.sh [extra cmake args]" "Configures and builds cedar (Release) into build/."; exit 0 ;;
esac
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs"
