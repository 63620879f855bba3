#!/usr/bin/env bash
# Installs the pinned npm packages of every npm folder of the project from its committed
# package-lock.json (`npm ci`; node_modules is gitignored). Folders (NPM_DIRS below):
#   tests/tools_mcp/servers  MCP servers for the tests (server-everything, server-filesystem), the
#                            MCP conformance suite and node@22 (the suite needs Node >= 22; the
#                            system node stays the one that runs the servers).
# Idempotent: a folder whose node_modules matches its lockfile is left alone.
# Usage: scripts/setup-npm.sh
set -euo pipefail
case "${1:-}" in
  -h|--help) printf '%s\n' "usage: scripts/setup-npm.sh" "Installs the pinned npm packages of the project (npm ci per folder; a no-op when current)."; exit 0 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v npm >/dev/null 2>&1 || { echo "setup-npm: npm not found; run scripts/setup-deps.sh first" >&2; exit 1; }

# Each entry: folder (relative to the repo) and the files that must exist after `npm ci`.
NPM_DIRS=(
  "tests/tools_mcp/servers:node_modules/.bin/mcp-server-everything node_modules/.bin/mcp-server-filesystem node_modules/.bin/node"
  "tests/openai:node_modules/openai/package.json"
  "runtime/server/web:node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css"
  "tests/dashboard:node_modules/playwright-core/package.json"
)

for entry in "${NPM_DIRS[@]}"; do
  dir="$here/${entry%%:*}"
  need="${entry#*:}"
  stamp="$dir/node_modules/.cedar-lock.sha256"
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  ok=1
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] || ok=0
  for f in $need; do [ -e "$dir/$f" ] || ok=0; done
  if [ "$ok" = 1 ]; then
    echo "setup-npm: packages present (${entry%%:*})"
    continue
  fi
  echo "setup-npm: npm ci in ${entry%%:*}"
  (cd "$dir" && npm ci --no-audit --no-fund)
  # node@22 fetches its binary in a preinstall script; fail here rather than in the tests.
  if [ -e "$dir/node_modules/.bin/node" ]; then "$dir/node_modules/.bin/node" --version >/dev/null; fi
  echo "$want" > "$stamp"
done
echo "setup-npm: done"
