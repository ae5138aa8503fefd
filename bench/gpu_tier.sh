#!/usr/bin/env bash
# Issue 18's device-tier benchmark (needs an NVIDIA GPU and a CUDA build): training with the whole
# state in GPU memory against `--gpu-mem-budget` budgets, same binary, same machine, one run.
# First measures the machine's host<->device copy rate with page-locked buffers (PyTorch, when
# installed), then trains the model with the whole state on the GPU and under each budget; prints
# per run the median step, tokens/s, the ratio to the whole-state run, the copies a step and the
# params hash (the same for every budget: Note [device tier]) and the process's wall time. A
# budget below the minimum prints the minimum and goes on. AdamW runs where the run puts it
# (Note [host optimizer]: on the CPU when the state exceeds the budget); `-- --adamw-on gpu` keeps
# it on the GPU for the comparison.
# Usage: bash bench/gpu_tier.sh STRATUM TOKENS OUT_DIR {gpt2|llama1b} BUDGET... [-- EXTRA TRAIN FLAGS]
#   gpt2: GPT-2 small, B4 T1024, 8 steps; llama1b: TinyLlama's shape (random init), B1 T2048, 5 steps
#   (its tokens must be < 32000). Example: bash bench/gpu_tier.sh build/stratum tok.bin out gpt2 1200M 900M
set -uo pipefail
stratum=$1 tokens=$2 out=$3 model=$4
shift 4
budgets=() extra=()
while [[ $# -gt 0 && $1 != -- ]]; do budgets+=("$1"); shift; done
[[ $# -gt 0 ]] && shift && extra=("$@")
mkdir -p "$out"
case $model in
  gpt2) flags=(--layers 12 --heads 12 --embd 768 --ctx 1024 --vocab 50257 --batch 4 --seq 1024 --steps 8) ;;
  llama1b) flags=(--arch llama --layers 22 --heads 32 --kv-heads 4 --embd 2048 --inner 5632 --ctx 2048 --vocab 32000
                  --untied --batch 1 --seq 2048 --steps 5 --lr 3e-4 --lr-schedule constant) ;;
  *) echo "gpu_tier: unknown model '$model' (gpt2 or llama1b)" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
python3 - <<'PY' 2>/dev/null || echo "copy rate: not measured (no PyTorch with CUDA)"
import torch, time
n = 512 << 20
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
for name, f in (("host->device", lambda: d.copy_(h, non_blocking=True)), ("device->host", lambda: h.copy_(d, non_blocking=True))):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): f()
    torch.cuda.synchronize(); print(f"copy rate {name}: {10 * n / (time.perf_counter() - t) / 1e9:.1f} GB/s (page-locked, 512 MiB)")
PY
base_ms=""
for budget in whole "${budgets[@]}"; do
  log=$out/$model-$budget.jsonl err=$out/$model-$budget.err
  args=(train --backend cuda "${flags[@]}" --data "$tokens" --threads 16 --quiet --log "$log" "${extra[@]}")
  [[ $budget != whole ]] && args+=(--gpu-mem-budget "$budget")
  t0=$(date +%s.%N)
  if ! "$stratum" "${args[@]}" 2> "$err"; then
    echo "$budget: $(grep -m1 -E '^\[|error' "$err" | tail -1)"
    continue
  fi
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  ms=$(sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p' "$err")
  tps=$(sed -n 's/.*final loss [0-9.]*, \([0-9]*\) tokens\/s.*/\1/p' "$err")
  hash=$(sed -n 's/.*params hash \([0-9a-f]*\).*/\1/p' "$err")
  [[ -z $base_ms ]] && base_ms=$ms
  ratio=$(awk -v a="$base_ms" -v b="$ms" 'BEGIN { printf "%.3f", a / b }')
  traffic=$(grep -m1 "tier traffic" "$err" | sed 's/^\[stratum\] //')
  # the last step's copies (steps after the first stream the same)
  last=$(tail -1 "$log" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print("last step: in %.0f MiB, out %.0f MiB, blocked %.1f ms" % (j.get("device_read_bytes",0)/2**20, j.get("device_write_bytes",0)/2**20, j.get("device_copy_ms",0)))' 2>/dev/null)
  echo "$budget: median step $ms ms, $tps tokens/s, x$ratio of the whole state's tokens/s, wall ${wall} s, hash $hash${traffic:+; $traffic}${last:+; $last}"
done
