#!/usr/bin/env bash
# Regenerates tests/golden/tokenizer_json/ (llama3_style/tokenizer.json + golden.json): installs
# the npm package tokenizers (Hugging Face's Rust tokenizers library, the one transformers uses,
# with prebuilt Node bindings) into a temporary folder and runs tools/tokenizer_json_golden.js
# with node, which builds the test tokenizers and encodes a fixed list of strings with them.
# Deterministic: rerunning it rewrites the same bytes.
# Does not touch anything outside the temporary folder and tests/golden/tokenizer_json/.
# Needs node + npm and the npm registry. Usage: bash tools/make_tokenizer_json_golden.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
data="${STRATUM_SHARED_DATA:-$root/../shared/data}"
out="$root/tests/golden/tokenizer_json"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "[tokenizer_json_golden] '$tool' not found: apt-get install nodejs npm" >&2; exit 1; }
done
[[ -f "$data/tinyshakespeare.txt" && -f "$data/encoder.json" && -f "$data/vocab.bpe" ]] ||
  { echo "[tokenizer_json_golden] '$data' lacks encoder.json, vocab.bpe or tinyshakespeare.txt: set STRATUM_SHARED_DATA" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npm install --prefix "$tmp" --no-audit --no-fund --silent tokenizers@0.23.2
mkdir -p "$out"
NODE_PATH="$tmp/node_modules" node "$here/tokenizer_json_golden.js" "$data" "$out"
