#!/usr/bin/env bash
# Crash test for checkpoints (Note [checkpoints]): trains a small model with a checkpoint every
# step, kills it with SIGKILL at random moments (many land in the middle of writing a
# checkpoint), resumes with `stratum train --resume` each time (alternating in RAM and under a
# memory budget with prefetch 1-3), and when a run finally finishes compares its parameter hash
# with an uninterrupted run's. Repeats rounds until KILLS kills have landed and prints how many
# rounds (and resumed runs) ended exact. Exits non-zero if any round was not exact or a resumed
# run failed. The CI-sized version is the test CheckpointCrash.* (10 kills).
# Usage: bash tools/crash_test.sh [KILLS (default 50)] [STEPS per run (default 40)]
set -euo pipefail
cd "$(dirname "$0")/.."
kills_wanted=${1:-50}
steps=${2:-40}
bin=./build/stratum
[[ -x $bin ]] || { echo "[crash] build first: cmake -S . -B build -G Ninja && cmake --build build" >&2; exit 2; }
work=$(mktemp -d /tmp/stratum_crash.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$work/tokens.bin" <<'PY'
import random, struct, sys
random.seed(7)
open(sys.argv[1], "wb").write(struct.pack("<20000H", *[random.randrange(2048) for _ in range(20000)]))
PY
model="--layers 2 --heads 4 --embd 64 --ctx 64 --vocab 2048 --batch 4 --seq 32 --lr 1e-3 --warmup 2 --threads 2"
hash_of() { grep -o 'params hash [0-9a-f]*' "$1" | tail -n1 | cut -d' ' -f3; }

start=$(date +%s%N)
$bin train $model --data "$work/tokens.bin" --steps "$steps" --save "$work/ref" --save-every 1 --quiet 2>"$work/ref.err"
run_ms=$(( ($(date +%s%N) - start) / 1000000 ))
ref=$(hash_of "$work/ref.err")
echo "[crash] uninterrupted run: ${run_ms} ms, params hash $ref"

kills=0 runs=0 rounds=0 exact=0
while (( kills < kills_wanted || rounds == 0 )); do
  root="$work/ck$rounds"
  while :; do
    runs=$((runs + 1))
    # A kill between a checkpoint's rename and its `latest` leaves step-N alone: resume that too.
    if compgen -G "$root/step-*" >/dev/null; then args=(train --resume "$root" --quiet)
    else args=(train $model --data "$work/tokens.bin" --steps "$steps" --save "$root" --save-every 1 --quiet); fi
    if (( runs % 2 == 0 )); then
      mkdir -p "$work/off"
      args+=(--mem-budget 4M --offload-dir "$work/off" --prefetch $((1 + runs % 3)))
    fi
    $bin "${args[@]}" 2>"$work/run.err" &
    pid=$!
    delay_ms=$(( run_ms * (5 + RANDOM % 65) / 100 ))
    if (( kills < kills_wanted )); then
      sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
      if kill -9 "$pid" 2>/dev/null; then
        wait "$pid" 2>/dev/null || true
        kills=$((kills + 1))
        continue
      fi
    fi
    if ! wait "$pid"; then
      echo "[crash] a resumed run failed:" >&2
      cat "$work/run.err" >&2
      exit 1
    fi
    break
  done
  rounds=$((rounds + 1))
  got=$(hash_of "$work/run.err")
  if [[ $got == "$ref" ]]; then exact=$((exact + 1))
  else echo "[crash] round $rounds NOT exact: params hash $got, expected $ref" >&2; fi
  $bin verify "$root" >/dev/null || { echo "[crash] round $rounds: stratum verify $root failed" >&2; exit 1; }
done
echo "[crash] $kills kills, $runs runs, $rounds rounds: $exact of $rounds rounds exact"
(( exact == rounds ))
