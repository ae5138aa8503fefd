#!/usr/bin/env bash
# Issue 17's benchmark: GPT-2 small, 16 x 256 tokens per step, as one process with --grad-accum 4,
# as 2 ranks x 2 micro-batches and as 4 ranks x 1 on this one machine (the ranks share its cores,
# so this measures the data-parallel overhead, not a speed-up): median step, rank 0's time blocked
# on messages per step (what the compute did not hide) and bytes it sent per step, and the params
# hash of each (they must be equal).
# Usage: bash bench/data_parallel.sh TOKENS.bin [STEPS]   (from the repository root, after a build)
# MPIRUN_FLAGS: extra mpirun flags, e.g. "--mca btl_vader_single_copy_mechanism none" (no CMA).
set -euo pipefail
data=${1:?usage: bench/data_parallel.sh TOKENS.bin [STEPS]}
steps=${2:-3}
bin=$(pwd)/build/stratum
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model="--layers 12 --heads 12 --embd 768 --ctx 1024 --vocab 50257 --seq 256 --batch 4 --grad-accum 4 --data $data --steps $steps --quiet"
run() {  # name ranks threads
  local name=$1 ranks=$2 threads=$3 launcher=""
  if ((ranks > 0)); then launcher="mpirun --oversubscribe ${MPIRUN_FLAGS:-} -np $ranks"; fi
  $launcher "$bin" train $model --threads "$threads" --log "$out/$name.jsonl" 2>"$out/$name.err"
  /usr/bin/python3 - "$out/$name.jsonl" "$out/$name.err" "$name" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:] or [json.loads(l) for l in open(sys.argv[1])]
step = statistics.median(r["step_ms"] for r in rows)
wait = statistics.median(r.get("comm_wait_ms", 0.0) for r in rows)
sent = statistics.median(r.get("sent_bytes", 0) for r in rows)
h = re.findall(r"params hash ([0-9a-f]{16})", open(sys.argv[2]).read())
print(f"{sys.argv[3]:<28} step {step:9.0f} ms   rank 0 blocked {wait:7.0f} ms ({100*wait/step:4.1f}%)   "
      f"rank 0 sent {sent/2**20:7.1f} MiB/step   hash {h[-1] if h else '?'}")
PY
}
echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run "1 process, 4 micro-batches" 0 "$cores"
run "1 process, 1 thread" 0 1  # the ranks' arithmetic (OpenBLAS's split depends on its threads): their hash
run "2 ranks x 2 micro-batches" 2 $(( cores / 2 > 0 ? cores / 2 : 1 ))
run "4 ranks x 1 micro-batch" 4 1
