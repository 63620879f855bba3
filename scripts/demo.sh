#!/usr/bin/env bash
# One command on a fresh Debian machine: install what cedar needs, build it, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/setup-npm.sh  # the dashboard's chart library is embedded at build time
scripts/build.sh
exec build/bin/cedar demo "$@"
