#!/usr/bin/env bash
# Installs the pinned npm packages the MCP tests need into tests/tools_mcp/servers/node_modules
# (gitignored) from the committed package-lock.json: @modelcontextprotocol/server-everything,
# @modelcontextprotocol/server-filesystem, @modelcontextprotocol/conformance and node@22 (the
# conformance suite needs Node >= 22; the system node stays the one that runs the servers).
# Idempotent: a no-op when node_modules already matches the lockfile.
# Usage: scripts/setup-npm.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$here/tests/tools_mcp/servers"
command -v npm >/dev/null 2>&1 || { echo "setup-npm: npm not found; run scripts/setup-deps.sh first" >&2; exit 1; }

stamp="$dir/node_modules/.cedar-lock.sha256"
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && [ -x "$dir/node_modules/.bin/mcp-server-everything" ] \
   && [ -x "$dir/node_modules/.bin/mcp-server-filesystem" ] \
   && [ -x "$dir/node_modules/.bin/node" ]; then
  echo "setup-npm: packages present ($dir/node_modules)"
  exit 0
fi
echo "setup-npm: npm ci in $dir"
(cd "$dir" && npm ci --no-audit --no-fund)
# node@22 fetches its binary in a preinstall script; fail here rather than in the tests.
"$dir/node_modules/.bin/node" --version >/dev/null
echo "$want" > "$stamp"
echo "setup-npm: done"
