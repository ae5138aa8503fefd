#!/usr/bin/env bash
# Checks that Hugging Face transformers and PEFT load what Stratum saves and compute what Stratum
# computes: trains a tiny GPT-2, a tiny Llama, a tiny Mistral, a tiny Qwen2, a tiny Qwen3 and a tiny Phi-3 (its q, k, v
# and gate, up fused; LoRA on the fused qkv_proj and gate_up_proj) (full training and LoRA, a few steps
# each, on the CPU), merges one adapter, decodes greedily with `stratum generate` (with --adapter unmerged for
# the adapters) and records each run's final validation loss (--log) on one fixed batch, then
# tools/hf_load_check.py loads every directory with AutoModelForCausalLM.from_pretrained /
# PeftModel.from_pretrained, computes the loss of the same batch (and of the merged model) and
# requires Stratum's to 1e-4, and decodes the prompt greedily, requiring Stratum's tokens.
# Needs python3 with torch, transformers and peft (the project's GPU machine has them; Debian's
# python3-torch alone is not enough), so it is not part of the test suite.
# Usage: bash tools/hf_load_check.sh STRATUM_BINARY TOKENS.bin WORK_DIR [PYTHON]
set -euo pipefail
stratum=$1 tokens=$2 work=$3 python=${4:-python3}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
ckpt() { echo "$1/$(cat "$1/latest")"; }  # the newest checkpoint under a --save root
# One validation batch: B*T+1 tokens from the middle of the corpus (inputs [0, B*T), targets +1).
val="$work/val.bin" val32k="$work/val32k.bin"
"$python" - "$tokens" "$val" "$val32k" <<'PY'
import sys, array
a = array.array("H"); a.frombytes(open(sys.argv[1], "rb").read())
v = a[100000:100000 + 4 * 32 + 1]
open(sys.argv[2], "wb").write(v.tobytes())
open(sys.argv[3], "wb").write(array.array("H", (t % 32000 for t in v)).tobytes())
PY
run=(--eval-every 6 --eval-batches 1 --batch 4 --seq 32 --steps 6 --lr 3e-3 --threads 4 --quiet)
on_gpt2=(--data "$tokens" --val-data "$val" "${run[@]}")
on_llama=(--data "$work/tok32k.bin" --val-data "$val32k" "${run[@]}")
gpt2=(--arch gpt2 --layers 2 --heads 4 --embd 64 --ctx 64 --vocab 50257)
llama=(--arch llama --layers 2 --heads 4 --kv-heads 2 --embd 64 --inner 160 --ctx 64 --vocab 32000 --untied)
mistral=(--arch mistral --layers 2 --heads 4 --kv-heads 2 --embd 64 --inner 160 --ctx 64 --vocab 32000 --untied)
qwen2=(--arch qwen2 --layers 2 --heads 4 --kv-heads 2 --embd 64 --inner 160 --ctx 64 --vocab 32000)
qwen3=(--arch qwen3 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --embd 64 --inner 160 --ctx 64 --vocab 32000)
phi3=(--arch phi3 --layers 2 --heads 4 --kv-heads 2 --embd 64 --inner 160 --ctx 64 --vocab 32000 --untied)
"$python" - "$tokens" "$work/tok32k.bin" <<'PY'
import sys, array
a = array.array("H"); a.frombytes(open(sys.argv[1], "rb").read())
open(sys.argv[2], "wb").write(array.array("H", (t % 32000 for t in a)).tobytes())
PY
"$stratum" train "${on_gpt2[@]}" "${gpt2[@]}" --save "$work/gpt2" --log "$work/gpt2.jsonl"
"$stratum" train "${on_llama[@]}" "${llama[@]}" --save "$work/llama" --log "$work/llama.jsonl"
"$stratum" train "${on_gpt2[@]}" --model "$(ckpt "$work/gpt2")" --lora-r 4 --lora-alpha 8 \
  --lora-targets c_attn,attn.c_proj,c_fc,mlp.c_proj --save "$work/gpt2_lora" --log "$work/gpt2_lora.jsonl"
"$stratum" train "${on_llama[@]}" --model "$(ckpt "$work/llama")" --lora-r 4 --lora-alpha 8 \
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --save "$work/llama_lora" \
  --log "$work/llama_lora.jsonl"
"$stratum" train "${on_llama[@]}" "${qwen2[@]}" --save "$work/qwen2" --log "$work/qwen2.jsonl"
"$stratum" train "${on_llama[@]}" "${mistral[@]}" --save "$work/mistral" --log "$work/mistral.jsonl"
"$stratum" train "${on_llama[@]}" --model "$(ckpt "$work/qwen2")" --lora-r 4 --lora-alpha 8 \
  --lora-targets q_proj,k_proj,v_proj,o_proj --save "$work/qwen2_lora" --log "$work/qwen2_lora.jsonl"
"$stratum" train "${on_llama[@]}" "${qwen3[@]}" --save "$work/qwen3" --log "$work/qwen3.jsonl"
"$stratum" train "${on_llama[@]}" --model "$(ckpt "$work/qwen3")" --lora-r 4 --lora-alpha 8 \
  --lora-targets q_proj,k_proj,v_proj,o_proj --save "$work/qwen3_lora" --log "$work/qwen3_lora.jsonl"
"$stratum" train "${on_llama[@]}" "${phi3[@]}" --save "$work/phi3" --log "$work/phi3.jsonl"
"$stratum" train "${on_llama[@]}" --model "$(ckpt "$work/phi3")" --lora-r 4 --lora-alpha 8 \
  --save "$work/phi3_lora" --log "$work/phi3_lora.jsonl"
"$stratum" merge --model "$(ckpt "$work/llama")" --adapter "$(ckpt "$work/llama_lora")" --out "$work/llama_merged" \
  --threads 4
prompts="11,22,33,44,55"
gen=(--prompt-ids "$prompts" --temperature 0 --max-tokens 12 --no-stop --output-ids --quiet --threads 4)
val_loss() { "$python" -c 'import json,sys; print([json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1])' "$1"; }
line() {  # NAME MODEL ADAPTER|- VAL_FILE LOSS_LOG
  local adapter=()
  [[ $3 != - ]] && adapter=(--adapter "$3")
  echo "$1 $2 $3 $4 $(val_loss "$5") $("$stratum" generate --model "$2" "${adapter[@]}" "${gen[@]}")"
}
{
  line gpt2 "$(ckpt "$work/gpt2")" - "$val" "$work/gpt2.jsonl"
  line llama "$(ckpt "$work/llama")" - "$val32k" "$work/llama.jsonl"
  line gpt2_lora "$(ckpt "$work/gpt2")" "$(ckpt "$work/gpt2_lora")" "$val" "$work/gpt2_lora.jsonl"
  line llama_lora "$(ckpt "$work/llama")" "$(ckpt "$work/llama_lora")" "$val32k" "$work/llama_lora.jsonl"
  line llama_merged "$work/llama_merged" - "$val32k" "$work/llama_lora.jsonl"
  line qwen2 "$(ckpt "$work/qwen2")" - "$val32k" "$work/qwen2.jsonl"
  line mistral "$(ckpt "$work/mistral")" - "$val32k" "$work/mistral.jsonl"
  line qwen2_lora "$(ckpt "$work/qwen2")" "$(ckpt "$work/qwen2_lora")" "$val32k" "$work/qwen2_lora.jsonl"
  line qwen3 "$(ckpt "$work/qwen3")" - "$val32k" "$work/qwen3.jsonl"
  line qwen3_lora "$(ckpt "$work/qwen3")" "$(ckpt "$work/qwen3_lora")" "$val32k" "$work/qwen3_lora.jsonl"
  line phi3 "$(ckpt "$work/phi3")" - "$val32k" "$work/phi3.jsonl"
  line phi3_lora "$(ckpt "$work/phi3")" "$(ckpt "$work/phi3_lora")" "$val32k" "$work/phi3_lora.jsonl"
} > "$work/expected.txt"
cat "$work/expected.txt"
"$python" "$here/hf_load_check.py" "$work/expected.txt" "$prompts"
