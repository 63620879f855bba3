#!/usr/bin/env bash
# Installs every system package cedar needs to build, test and run, from Debian's apt.
# Idempotent: a no-op (no apt call at all) when everything is already present.
# Usage: scripts/setup-deps.sh [--with-python] [--with-browser]
set -euo pipefail
case "${1:-}" in
  -h|--help) printf '%s\n' "usage: scripts/setup-deps.sh [--with-python] [--with-browser]" "Installs the Debian packages cedar needs to build, test and run (apt; a no-op when present).
  --with-python   PyTorch, NumPy, Matplotlib (the reference model, trainer and their tests)
  --with-browser  Chromium (the dashboard browser test)"; exit 0 ;;
esac

pkgs=(build-essential cmake pkg-config git ca-certificates
      libcaf-dev libcurl4-openssl-dev libsimdjson-dev libsqlite3-dev libcpp-httplib-dev
      libgtest-dev libgmock-dev libopenblas-dev libzstd-dev libxxhash-dev libcli11-dev
      nlohmann-json3-dev libpcre2-dev sqlite3 python3 clang libclang-rt-14-dev)
# Node.js (for the MCP test servers and the dashboard's npm assets): use the machine's if any.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
for a in "$@"; do
  case "$a" in
    --with-python) pkgs+=(python3-torch python3-numpy python3-matplotlib) ;;
    --with-browser) pkgs+=(chromium chromium-driver) ;;
    *) echo "setup-deps: unknown option '$a' (expected --with-python or --with-browser)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "setup-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
