#!/usr/bin/env bash
# The runner of a fuzz bundle (scripts/fuzz-bundle.sh copies this file to <bundle>/run.sh).
# Runs the bundle's targets one after the other, each for N executions spread over M
# processes (libFuzzer -fork=M: M jobs at a time, new inputs merged into one corpus), with the
# bundle's own libraries only (LD_LIBRARY_PATH=<bundle>/lib). The output directory receives at
# most four files:
#   summary.csv        target,executions,crashes,seconds,exec_per_s,exit_code (one row each)
#   fuzz.log           every target's libFuzzer output, concatenated (long ones trimmed)
#   artifacts.tar.gz   crash/timeout/oom/leak inputs, only when there are any
#   corpus.tar.gz      the grown corpora, only with --keep-corpus
# Scratch files (the working corpora) live under $TMPDIR and are removed at the end.
# Exit status 1 when any target crashed (its inputs are in artifacts.tar.gz), 2 on bad usage.
set -uo pipefail
here="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"

usage() {
  cat <<'USAGE'
Usage: run.sh [options] [target...]
  -n, --runs N          executions per target (default 10000000)
  -j, --procs M         fuzzing processes at a time (default: the number of cores)
  -o, --out DIR         output directory (default ./fuzz-out)
  -t, --max-time S      stop a target after S seconds even below N executions (default: none)
      --keep-corpus     also write corpus.tar.gz (the grown corpora)
  -l, --list            list the targets and exit
Targets default to all of bin/.
USAGE
}

runs=10000000
procs=$(nproc 2>/dev/null || echo 1)
outdir=./fuzz-out
max_time=""
keep_corpus=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--runs) runs="$2"; shift 2 ;;
    -j|--procs) procs="$2"; shift 2 ;;
    -o|--out) outdir="$2"; shift 2 ;;
    -t|--max-time) max_time="$2"; shift 2 ;;
    --keep-corpus) keep_corpus=1; shift ;;
    -l|--list) for f in "$here"/bin/fuzz_*; do basename "$f" | sed 's/^fuzz_//'; done; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) if [[ "$1" == -* ]]; then echo "run.sh: unknown option $1 (see --help)" >&2; exit 2; fi
       targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$here"/bin/fuzz_*; do targets+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi

export LD_LIBRARY_PATH="$here/lib"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/cedar-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/artifacts" "$work/logs" "$work/corpus"

summary="$outdir/summary.csv"
echo "target,executions,crashes,seconds,exec_per_s,exit_code" >"$summary"
: >"$outdir/fuzz.log"
failed=0
printf '%-14s %12s %8s %9s %10s\n' target executions crashes seconds exec/s
for t in "${targets[@]}"; do
  bin="$here/bin/fuzz_$t"
  [ -x "$bin" ] || { echo "run.sh: no target $t (see --list)" >&2; exit 2; }
  cp -r "$here/corpus/$t" "$work/corpus/$t"
  args=(-seed=0 -max_len=8192 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$work/artifacts/$t-" -runs="$runs")
  [ -f "$here/dict/$t.dict" ] && args+=(-dict="$here/dict/$t.dict")
  if [ -f "$here/options/$t.args" ]; then
    while read -r a; do [ -n "$a" ] && args+=("$a"); done <"$here/options/$t.args"
  fi
  [ -n "$max_time" ] && args+=(-max_total_time="$max_time")
  [ "$procs" -gt 1 ] && args+=(-fork="$procs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  log="$work/logs/$t.log"
  start=$(date +%s.%N)
  rc=0
  (cd "$work" && "$bin" "${args[@]}" "$work/corpus/$t") >"$log" 2>&1 || rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  # Executions: the single process's final stats, else fork mode's last progress line
  # ("#N: cov: ... oom/timeout/crash: a/b/c ...").
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s += $2} END {print s + 0}')
  forked=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
  if [ -n "$forked" ]; then
    execs=$(echo "$forked" | sed -E 's/^#([0-9]+):.*/\1/')
  fi
  [ "$execs" = 0 ] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  execs=${execs:-0}
  crashes=$(ls "$work/artifacts" | grep -c "^$t-" || true)
  if [ -n "$forked" ]; then
    fc=$(echo "$forked" | sed -nE 's/.*oom\/timeout\/crash: ([0-9]+)\/([0-9]+)\/([0-9]+).*/\1 \2 \3/p' | awk '{print $1 + $2 + $3}')
    [ -n "$fc" ] && [ "$fc" -gt "$crashes" ] && crashes=$fc
  fi
  [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN {printf "%.0f", (s > 0 ? e / s : 0)}')
  echo "$t,$execs,$crashes,$secs,$rate,$rc" >>"$summary"
  printf '%-14s %12s %8s %9s %10s\n' "$t" "$execs" "$crashes" "$secs" "$rate"
  [ "$crashes" -gt 0 ] && failed=1
  {
    echo "===== $t: $execs executions, $crashes crashes, $secs s, exit $rc; args: ${args[*]}"
    if [ "$(wc -l <"$log")" -gt 6000 ]; then
      head -n 1000 "$log"
      echo "----- ($(wc -l <"$log") lines, middle trimmed) -----"
      tail -n 5000 "$log"
    else
      cat "$log"
    fi
  } >>"$outdir/fuzz.log"
done

if [ -n "$(ls "$work/artifacts")" ]; then
  tar -C "$work" -czf "$outdir/artifacts.tar.gz" artifacts
fi
if [ "$keep_corpus" = 1 ]; then
  tar -C "$work" -czf "$outdir/corpus.tar.gz" corpus
fi
echo "run.sh: $summary"
exit "$failed"
