#!/usr/bin/env bash
# Regenerates tests/golden/bpe_golden.json: installs the npm package gpt-3-encoder (an
# independent JavaScript port of OpenAI's GPT-2 encoder) into a temporary folder and runs
# tools/bpe_golden.js with node, which encodes a fixed list of strings.
# Does not touch anything outside the temporary folder and tests/golden/bpe_golden.json.
# Needs node + npm and the npm registry. Usage: bash tools/make_bpe_golden.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
data="${STRATUM_SHARED_DATA:-$root/../shared/data}"
out="$root/tests/golden/bpe_golden.json"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "[bpe_golden] '$tool' not found: apt-get install nodejs npm" >&2; exit 1; }
done
[[ -f "$data/tinyshakespeare.txt" && -f "$data/encoder.json" && -f "$data/vocab.bpe" ]] ||
  { echo "[bpe_golden] '$data' lacks encoder.json, vocab.bpe or tinyshakespeare.txt: set STRATUM_SHARED_DATA" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npm install --prefix "$tmp" --no-audit --no-fund --silent gpt-3-encoder@1.1.4
NODE_PATH="$tmp/node_modules" node "$here/bpe_golden.js" "$data" "$out"
