#!/usr/bin/env bash
# Regenerates tests/golden/tokenizer_json/ (llama3_style/, qwen2_style/, llama2_style/ and
# metaspace_style/tokenizer.json + golden.json): trains the SentencePiece-style test model with
# tools/make_sp_tokenizer_json.py (Debian's python3-sentencepiece), installs the npm package tokenizers (Hugging Face's Rust tokenizers library, the one transformers uses,
# with prebuilt Node bindings) into a temporary folder and runs tools/tokenizer_json_golden.js
# with node, which builds the test tokenizers and encodes a fixed list of strings with them; then
# checks that sentencepiece itself gives the SentencePiece-style tokenizer.json's ids for every text
# without a special token in it.
# Deterministic: rerunning it rewrites the same bytes.
# Does not touch anything outside the temporary folder and tests/golden/tokenizer_json/.
# Needs node + npm, the npm registry and /usr/bin/python3 with sentencepiece. Usage: bash tools/make_tokenizer_json_golden.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
data="${STRATUM_SHARED_DATA:-$root/../shared/data}"
out="$root/tests/golden/tokenizer_json"

/usr/bin/python3 -c 'import sentencepiece' 2>/dev/null ||
  { echo "[tokenizer_json_golden] /usr/bin/python3 lacks sentencepiece: apt-get install python3-sentencepiece" >&2; exit 1; }
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "[tokenizer_json_golden] '$tool' not found: apt-get install nodejs npm" >&2; exit 1; }
done
[[ -f "$data/tinyshakespeare.txt" && -f "$data/encoder.json" && -f "$data/vocab.bpe" ]] ||
  { echo "[tokenizer_json_golden] '$data' lacks encoder.json, vocab.bpe or tinyshakespeare.txt: set STRATUM_SHARED_DATA" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npm install --prefix "$tmp" --no-audit --no-fund --silent tokenizers@0.23.2
mkdir -p "$out" "$tmp/sp"
/usr/bin/python3 "$here/make_sp_tokenizer_json.py" train "$data" "$tmp/sp"
NODE_PATH="$tmp/node_modules" node "$here/tokenizer_json_golden.js" "$data" "$out" "$tmp/sp"
# The cross-check: Hugging Face on the converted tokenizer.json against sentencepiece on its model.
/usr/bin/python3 "$here/make_sp_tokenizer_json.py" encode "$tmp/sp/tokenizer.model" "$tmp/sp/texts.json" > "$tmp/sp/ids.json"
/usr/bin/python3 - "$out/golden.json" "$tmp/sp/ids.json" <<'EOF'
import json, sys
golden = json.load(open(sys.argv[1], encoding="utf-8"))["llama2_style"]
sp_ids = json.load(open(sys.argv[2]))
checked = [(c, ids) for c, ids in zip(golden, sp_ids) if not any(s in c["text"] for s in ("<s>", "</s>", "<unk>"))]
differ = [c["text"] for c, ids in checked if c["ids"] != ids]
if differ:
    sys.exit(f"[tokenizer_json_golden] sentencepiece and Hugging Face disagree on {len(differ)} texts: {differ[:3]}")
print(f"[tokenizer_json_golden] sentencepiece gives Hugging Face's llama2_style ids for all {len(checked)} texts it was asked")
EOF
