#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) and runs each one for a
# number of executions or seconds, starting from its committed seed corpus. Prints one line per
# target: executions, crashes (ASan/UBSan/LeakSanitizer reports, timeouts and failed invariants
# all count), corpus size and seconds. New inputs go to <build>/fuzz/work/<target>/, crash
# inputs to <build>/fuzz/artifacts/; the committed corpus is only read.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
Usage: scripts/fuzz.sh [options] [target...]
  -n, --runs N        executions per target (default 100000)
  -t, --time SECONDS  run each target for SECONDS instead of a number of executions
  -j, --jobs N        parallel fuzzing processes per target (libFuzzer -fork=N; default 1)
  -B, --build-dir DIR build directory (default build-fuzz), configured with clang++,
                      -DCEDAR_FUZZ=ON (ASan + UBSan + libFuzzer), no CUDA, no benchmarks
      --no-build      use the binaries already in the build directory
      --build-only    build the targets and exit (scripts/fuzz-bundle.sh packs them for
                      a machine without a compiler)
  -l, --list          list the targets and exit
  -h, --help          this help
Targets default to all (tests/fuzz/fuzz_<name>.cpp). Exit status 1 if any target crashed.
Examples:
  scripts/fuzz.sh --runs 1000000              # every target, a million executions each
  scripts/fuzz.sh --time 300 dsml tokenizer   # five minutes each for two targets
USAGE
}

runs=100000
seconds=""
jobs=1
build_dir=build-fuzz
do_build=1
build_only=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--runs) runs="$2"; shift 2 ;;
    -t|--time) seconds="$2"; shift 2 ;;
    -j|--jobs) jobs="$2"; shift 2 ;;
    -B|--build-dir) build_dir="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --build-only) build_only=1; shift ;;
    -l|--list) for f in tests/fuzz/fuzz_*.cpp; do basename "$f" .cpp | sed 's/^fuzz_//'; done; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi

if [ "$do_build" = 1 ]; then
  command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCEDAR_FUZZ=ON \
    -DCEDAR_CUDA=OFF -DCEDAR_BUILD_BENCH=OFF >/dev/null
  cmake --build "$build_dir" -j"$(nproc 2>/dev/null || echo 2)" --target "${targets[@]/#/fuzz_}"
fi
[ "$build_only" = 1 ] && exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
printf '%-14s %14s %8s %8s %8s  %s\n' target executions crashes corpus seconds log
failed=0
for t in "${targets[@]}"; do
  bin="$build_dir/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz.sh: $bin missing (build it, or drop --no-build)" >&2; exit 2; }
  work="$build_dir/fuzz/work/$t"
  art="$build_dir/fuzz/artifacts"
  mkdir -p "$work" "$art"
  args=(-seed=0 -max_len=8192 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/$t-")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  if [ -f "tests/fuzz/$t.args" ]; then  # a target's own flags (one per line), e.g. -max_len
    while read -r a; do [ -n "$a" ] && args+=("$a"); done <"tests/fuzz/$t.args"
  fi
  if [ -n "$seconds" ]; then args+=(-max_total_time="$seconds"); else args+=(-runs="$runs"); fi
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=1)
  log="$build_dir/fuzz/$t.log"
  before=$(ls "$art" | grep -c "^$t-" || true)
  start=$(date +%s)
  rc=0
  "$bin" "${args[@]}" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  after=$(ls "$art" | grep -c "^$t-" || true)
  crashes=$(( after - before ))
  [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1
  # Executions: libFuzzer's final stats (one process), else the sum over fork-mode jobs.
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s += $2} END {print s + 0}')
  [ "$execs" = 0 ] && execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  corpus=$(ls "$work" | wc -l)
  printf '%-14s %14s %8s %8s %8s  %s\n' "$t" "${execs:-0}" "$crashes" "$corpus" "$secs" "$log"
  [ "$crashes" -gt 0 ] && failed=1
done
exit "$failed"
