#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/<name>_fuzz.cpp) with Clang + ASan + UBSan in build-fuzz/
# and runs each for SECONDS on a copy of its seed corpus fuzz/corpus/<name>/ (the checked-in
# corpus never grows). Prints per target: execs run, exec/s, and whether it crashed; a crashing
# input is written to build-fuzz/crashes/<name>/ and the full log to build-fuzz/logs/<name>.log.
# Targets run side by side, one per core. Exits non-zero if any target crashed or failed to
# start. Does not minimize crashes or merge corpora. Needs clang (with libFuzzer) and the GPT-2
# tokenizer files for bpe_encode ($STRATUM_SHARED_DATA, default ../shared/data next to the
# repository).
# Usage: bash tools/fuzz.sh [SECONDS_PER_TARGET (default 30)] [target...]
#   e.g. bash tools/fuzz.sh 60 safetensors hf_config   (target = fuzz/<target>_fuzz.cpp)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

seconds=30
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
targets=()
for t in "$@"; do targets+=("${t%_fuzz}"); done
if ((${#targets[@]} == 0)); then
  for src in fuzz/*_fuzz.cpp; do
    name="$(basename "$src" .cpp)"
    targets+=("${name%_fuzz}")
  done
fi
for t in "${targets[@]}"; do
  if [[ ! -f fuzz/${t}_fuzz.cpp ]]; then
    echo "[fuzz] unknown target '$t' (no fuzz/${t}_fuzz.cpp)" >&2
    exit 2
  fi
done
if ! command -v clang++ >/dev/null; then
  echo "[fuzz] clang++ not found: apt-get install clang" >&2
  exit 2
fi

build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATUM_FUZZ=ON -DSTRATUM_BUILD_TESTS=OFF -DSTRATUM_CUDA=OFF >/dev/null
cmake --build "$build" --target "${targets[@]/%/_fuzz}"

export STRATUM_SHARED_DATA="${STRATUM_SHARED_DATA:-$root/../shared/data}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
# Targets write each input to a temporary file: keep those on tmpfs when there is one, in a
# folder of this run's own (a crashed target leaves its file behind).
tmp_base="${TMPDIR:-/tmp}"
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then tmp_base=/dev/shm; fi
TMPDIR="$(mktemp -d "$tmp_base/stratum-fuzz.XXXXXX")"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Targets run side by side, as many at once as the machine has cores (each is one thread; set
# STRATUM_FUZZ_JOBS to change it): every target still fuzzes for SECONDS of its own. Each writes
# its result line to $build/results/<target>; they are printed in the targets' order at the end.
jobs="${STRATUM_FUZZ_JOBS:-$(nproc)}"
results="$build/results"
rm -rf "$results"
mkdir -p "$results"
fuzz_one() {
  local t=$1
  local work="$build/work/$t" crashes="$build/crashes/$t" log="$build/logs/$t.log"
  rm -rf "$work"
  mkdir -p "$work" "$crashes" "$(dirname "$log")"
  cp fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  local rc=0
  "$build/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$work" >"$log" 2>&1 || rc=$?
  local artifact execs rate status result reason
  artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
  # Final stats when the run ended normally; otherwise the last "#N ... exec/s: X" status line.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [[ -z $execs ]]; then
    status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$status")
    rate=$(sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p' <<<"$status")
  fi
  if ((rc == 0)); then
    result="no crash"
  elif [[ -n $artifact ]]; then
    reason=$(grep -m1 -E 'runtime error|ERROR: |^\[fuzz\.|terminate called' "$log" || true)
    result="CRASH: $artifact (see $log): ${reason:0:160}"
    touch "$results/$t.failed"
  else
    result="FAILED: exit $rc, no crash file (see $log)"
    touch "$results/$t.failed"
  fi
  printf '%-12s %10s %9s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result" >"$results/$t"
}
running=0
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || true  # a target's outcome is in its result file
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
failed=0
printf '%-12s %10s %9s  %s\n' target execs exec/s result
for t in "${targets[@]}"; do
  if [[ -f $results/$t ]]; then cat "$results/$t"; else printf '%-12s  FAILED: no result (see %s)\n' "$t" "$build/logs/$t.log"; failed=1; fi
  if [[ -f $results/$t.failed ]]; then failed=1; fi
done
exit "$failed"
