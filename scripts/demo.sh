#!/usr/bin/env bash
# One command on a fresh Debian machine: install what cedar needs, build it, run the demo.
set -euo pipefail
case "${1:-}" in
  -h|--help) printf '%s\n' "usage: scripts/demo.sh [cedar demo options]" "Installs what cedar needs (apt, npm), builds it and runs cedar demo on the shipped model
(the options go to cedar demo; build/bin/cedar demo --help lists them)."; exit 0 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/setup-npm.sh  # the dashboard's chart library is embedded at build time
scripts/build.sh
exec build/bin/cedar demo "$@"
