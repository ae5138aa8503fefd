#!/usr/bin/env bash
# Issue 18's decoding benchmark (needs an NVIDIA GPU and a CUDA build): greedy decoding of a model
# directory with every weight in GPU memory against `--gpu-mem-budget` budgets, same binary, same
# machine, one run. First measures the host->device copy rate with page-locked buffers (PyTorch,
# when installed). Per run prints tokens/s (prompt and decode steps together), the MiB copied in,
# and the copy bound's share: (bytes copied in / the measured copy rate) / the run's time, i.e.
# the run's tokens/s over the tokens/s the copies alone would allow (1.0 = at the copy bound; the
# issue's target is >= 0.8 with 25% of the weights on the GPU). Checks that every budget gives
# the whole run's token ids (exit 1 otherwise).
# Usage: bash bench/gpu_decode.sh STRATUM MODEL_DIR OUT_DIR BUDGET... [-- EXTRA GENERATE FLAGS]
#   A model: /usr/bin/python3 tools/make_random_llama.py --out DIR --preset 1b --dtype bf16
#   Example: bash bench/gpu_decode.sh build/stratum /tmp/l1b out 560M 1100M
set -uo pipefail
stratum=$1 model=$2 out=$3
shift 3
budgets=() extra=()
while [[ $# -gt 0 && $1 != -- ]]; do budgets+=("$1"); shift; done
[[ $# -gt 0 ]] && shift && extra=("$@")
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
rate=$(python3 - <<'PY' 2>/dev/null
import torch, time
n = 512 << 20
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
d.copy_(h, non_blocking=True); torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): d.copy_(h, non_blocking=True)
torch.cuda.synchronize(); print(f"{10 * n / (time.perf_counter() - t) / 1e9:.2f}")
PY
)
echo "copy rate host->device: ${rate:-not measured (no PyTorch with CUDA)} GB/s (page-locked, 512 MiB)"
flags=(generate --backend cuda --model "$model" --prompt-ids 1,2,3 --max-tokens 64 --temperature 0 --no-stop
       --output-ids --threads 16 "${extra[@]}")
status=0 whole_ids=""
for budget in whole "${budgets[@]}"; do
  args=("${flags[@]}")
  [[ $budget != whole ]] && args+=(--gpu-mem-budget "$budget")
  t0=$(date +%s.%N)
  if ! "$stratum" "${args[@]}" > "$out/decode-$budget.ids" 2> "$out/decode-$budget.err"; then
    echo "$budget: $(grep -m1 -E '^\[|error' "$out/decode-$budget.err" | tail -1)"
    continue
  fi
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  line=$(grep -m1 "generated:" "$out/decode-$budget.err")
  tps=$(sed -n 's/.*generated: [0-9]* tokens at \([0-9.]*\) tokens\/s.*/\1/p' <<< "$line")
  secs=$(sed -n 's/.*; \([0-9.]*\) s prompt steps, \([0-9.]*\) s decode steps.*/\1 \2/p' <<< "$line")
  tier=$(grep -m1 "tier: copied in" "$out/decode-$budget.err" | sed 's/^\[stratum\] //')
  in_mib=$(sed -n 's/.*copied in \([0-9.]*\) MiB.*/\1/p' <<< "$tier")
  share=""
  if [[ -n $rate && -n $in_mib && -n $secs ]]; then
    share=$(awk -v m="$in_mib" -v r="$rate" -v s="$secs" 'BEGIN { split(s, t, " "); printf "%.3f", m * 1048576 / (r * 1e9) / (t[1] + t[2]) }')
  fi
  if [[ $budget == whole ]]; then whole_ids=$(cat "$out/decode-$budget.ids")
  elif [[ $(cat "$out/decode-$budget.ids") != "$whole_ids" ]]; then echo "$budget: token ids differ from the whole run's"; status=1
  fi
  echo "$budget: $tps tokens/s (decode steps), wall ${wall} s${tier:+; $tier}${share:+; copy-bound share $share}"
done
exit $status
