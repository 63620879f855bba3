#!/usr/bin/env bash
# Packs the libFuzzer targets of tests/fuzz/ into one self-contained folder for a machine that
# has no compiler, no network and maybe none of Debian's shared libraries (CAF, simdjson,
# SQLite, curl, OpenBLAS, libstdc++ ...), only a compatible glibc:
#
#   <bundle>/run.sh            runs every target (or those named) for N executions each
#   <bundle>/bin/fuzz_<t>      the targets (clang, ASan + UBSan + libFuzzer), stripped
#   <bundle>/lib/              every shared library they need except glibc's own (ldd)
#   <bundle>/corpus/<t>/       the committed seed corpora
#   <bundle>/dict/<t>.dict     the dictionaries
#   <bundle>/options/<t>.args  extra libFuzzer flags of a target (one per line), if any
#   <bundle>/data/             source-tree files a target reads (fuzz_util.hpp fuzz_data_path)
#   <bundle>/BUILD_INFO        commit, compiler, date; unstripped binaries stay in the build dir
#                              (symbolize a crash's offsets there: llvm-symbolizer -e <bin>)
#
# The bundle is built from <build>/fuzz (scripts/fuzz.sh --build-only builds it first). Run
# `<bundle>/run.sh --help` for the runner's options.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
Usage: scripts/fuzz-bundle.sh [options] [target...]
  -B, --build-dir DIR  fuzz build directory (default build-fuzz)
  -o, --out DIR        bundle folder (default .dev/fuzz-bundle; replaced)
      --no-build       use the binaries already built
      --no-strip       keep symbols (bigger bundle, symbolized crash reports on the device)
  -h, --help           this help
Then: LD_LIBRARY_PATH is set by the bundle's own run.sh; try it with
  cp -r .dev/fuzz-bundle /tmp/fb && /tmp/fb/run.sh --runs 20000 --procs 2 --out /tmp/fb-out
USAGE
}

build_dir=build-fuzz
out=.dev/fuzz-bundle
do_build=1
do_strip=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -B|--build-dir) build_dir="$2"; shift 2 ;;
    -o|--out) out="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-strip) do_strip=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz-bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi
[ "$do_build" = 1 ] && scripts/fuzz.sh --build-only -B "$build_dir" "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/corpus" "$out/dict" "$out/options" "$out/data"

# glibc's own libraries (and the vDSO) stay on the device; everything else travels.
is_glibc() {
  case "$(basename "$1")" in
    ld-linux*|linux-vdso*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libmvec.so*|libBrokenLocale.so*|libnss_*|libthread_db.so*) return 0 ;;
  esac
  return 1
}

for t in "${targets[@]}"; do
  bin="$build_dir/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz-bundle.sh: $bin missing (build it, or drop --no-build)" >&2; exit 2; }
  cp "$bin" "$out/bin/"
  [ "$do_strip" = 1 ] && strip --strip-all "$out/bin/fuzz_$t"
  cp -r "tests/fuzz/corpus/$t" "$out/corpus/$t"
  [ -f "tests/fuzz/$t.dict" ] && cp "tests/fuzz/$t.dict" "$out/dict/"
  [ -f "tests/fuzz/$t.args" ] && cp "tests/fuzz/$t.args" "$out/options/"
  # ldd lists the whole closure; copy the real files under their sonames.
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r soname path; do
    is_glibc "$soname" && continue
    [ -f "$out/lib/$soname" ] || cp -L "$path" "$out/lib/$soname"
  done
done
[ "$do_strip" = 1 ] && strip --strip-unneeded "$out"/lib/*.so* 2>/dev/null || true

# Data files read at run time (fuzz_data_path).
mkdir -p "$out/data/model/weights/cedar-agent-tiny"
cp model/weights/cedar-agent-tiny/tokenizer.json "$out/data/model/weights/cedar-agent-tiny/"

cp tests/fuzz/bundle_run.sh "$out/run.sh"
chmod +x "$out/run.sh"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(clang++ --version | head -1)"
  echo "strip $do_strip; unstripped binaries: $build_dir/fuzz/"
  echo "targets ${targets[*]}"
} >"$out/BUILD_INFO"

echo "fuzz-bundle.sh: $out ($(du -sh "$out" | cut -f1)): ${#targets[@]} targets, $(ls "$out/lib" | wc -l) libraries"
