#!/usr/bin/env bash
# Note [sliding KV cache]: generation with Gemma 3 1B's attention (26 layers, each 6th full, the
# others sliding over 512 keys; 4 query heads of 256 on one KV head; narrow MLP and vocabulary so
# the attention and the KV cache dominate), a 4096-token prompt and 1024 greedy tokens. Prints,
# per binary: prompt and decode tokens/s, the KV cache generate reports, the peak RSS, and whether
# the token ids match the first binary's. Give two binaries (e.g. a build of the commit before
# the sliding cache, then build/stratum) to compare them in the same run.
# Usage: bash bench/sliding_kv_cache.sh [BINARY ...]   (default: build/stratum)
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
((${#bins[@]})) || bins=(build/stratum)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
# A random-init model of that shape (one training step saves it), its window set to 512.
/usr/bin/python3 -c "import numpy as np; np.arange(4097, dtype='<u2').__mod__(512).astype('<u2').tofile('$work/tokens.bin')"
"${bins[-1]}" train --arch gemma3 --layers 26 --heads 4 --kv-heads 1 --head-dim 256 --embd 1152 --inner 256 \
  --vocab 512 --ctx 8192 --data "$work/tokens.bin" --batch 1 --seq 32 --steps 1 --save "$work/ckpt" --quiet
model=$(ls -d "$work"/ckpt/step-*)
rm -f "$model/manifest.json" "$model/optimizer.safetensors" "$model/trainer_state.json"  # a plain HF directory
/usr/bin/python3 - "$model/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["sliding_window"] = 512
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
prompt=$(/usr/bin/python3 -c "print(','.join(str((13 * i + i // 7) % 512) for i in range(4096)))")
first=""
for bin in "${bins[@]}"; do
  echo "== $bin"
  /usr/bin/time -f "peak RSS %M KB, %e s" "$bin" generate --model "$model" --prompt-ids "$prompt" --max-tokens 1024 \
    --output-ids --no-stop --threads 2 2>"$work/err" >"$work/ids"
  grep -E "prompt:|KV cache|peak RSS" "$work/err"
  if [[ -z "$first" ]]; then first=$(cat "$work/ids"); elif [[ "$first" == "$(cat "$work/ids")" ]]; then
    echo "token ids: the same as the first binary's"; else echo "token ids: DIFFERENT from the first binary's"; fi
done
