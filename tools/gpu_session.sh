#!/usr/bin/env bash
# Issue 18's checks and benchmarks in bounded parts (GPU_PARTS, below), most important first,
# for a session that has the GPU machine for a few minutes (start it with the device tool, keep
# it warm: a fresh machine is not started with under 4 minutes of device time left). Each step has its own
# timeout, so a slow one cannot eat the rest; everything is logged under OUT_DIR and a summary
# printed at the end.
#   1. the CUDA op, train and generate tests against the CPU (stratum_tests 'Cuda*:Backend*'), the
#      linear layers' products by row chunk (bench/row_chunk_gemm.cpp), then GPT-2 small in GPU
#      memory (4096-row chunks, the GPU's default) against PyTorch eager on the same GPU, and again
#      with --row-chunk 1024;
#   2. GPT-2 small, B4 T1024: the whole state, then --gpu-mem-budget 1000M with AdamW on the CPU
#      beside the GPU (auto: Note [host optimizer]) and on the GPU (bench/gpu_tier.sh);
#   3. the ~1.1B Llama (TinyLlama's shape, B1 T2048): the whole state, then 4300M (25% of its
#      training state) both ways and with --row-chunk 1024 (two chunks), and a --trace of the
#      GPU-AdamW run (llama-gpu-adamw.json.gz);
#   4. decoding the 1.1B Llama (bf16) with 25% of its weights on the GPU (bench/gpu_decode.sh).
# Needs build/ configured with the CUDA toolkit present, TOKENS.bin GPT-2 ids, TOKENS32K.bin ids
# below 32000. LIBS_TAR: optional tarball of the shared libraries the binaries need on a machine
# that is not Debian (see tools/gpu_check.sh).
# Usage: bash tools/gpu_session.sh TOKENS.bin TOKENS32K.bin OUT_DIR [LIBS_TAR]
# All of it takes about 13 minutes, more than one device call may run (600 s): GPU_PARTS picks
# parts by name, in this order (default all): tests gemm gpt2 gpt2-tier llama-tier llama-chunk
# llama-trace decode. Roughly: tests 60 s, gemm 10 s, gpt2 (eager, keep at 1024 and 4096 rows)
# 90 s, gpt2-tier 200 s, llama-tier 300 s, llama-chunk 150 s, llama-trace 60 s, decode 150 s.
# Example: GPU_PARTS="tests gemm gpt2 llama-chunk" bash tools/gpu_session.sh ...
set -uo pipefail
cd "$(dirname "$0")/.."
tokens=$1 tokens32k=$2 out=$3 libs=${4:-}
mkdir -p "$out"
source tools/gpu_env.sh
gpu_env_libs "$libs"
start=$(date +%s)
step() { echo "== t+$(( $(date +%s) - start )) s: $*" | tee -a "$out/summary.txt"; }
parts=" ${GPU_PARTS:-tests gemm gpt2 gpt2-tier llama-tier llama-chunk llama-trace decode} "
want() { [[ $parts == *" $1 "* ]]; }
step "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
gpt2_keep() {  # GPT-2 small, B4 T1024, whole state in GPU memory, internals kept; extra flags appended
  timeout 60 build/stratum train --backend cuda --layers 12 --heads 12 --embd 768 --ctx 1024 --vocab 50257 \
    --data "$tokens" --batch 4 --seq 1024 --steps 10 --threads 16 --quiet --activations keep "$@" 2>&1 |
    grep "median step"
}
if want tests; then
  step "cuda tests"
  timeout 200 build/stratum_tests --gtest_filter='Cuda*:Backend*' > "$out/cuda_tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]" "$out/cuda_tests.log" | tee -a "$out/summary.txt"
fi
if want gemm; then
  step "the linear layers' products in row chunks of 1024, 2048, 4096 (bench/row_chunk_gemm.cpp: is a larger chunk worth it on the GPU?)"
  timeout 60 build/row_chunk_gemm --backend cuda --rows 4096 > "$out/row_chunk_gemm.jsonl" 2>&1
  cut -c1-200 "$out/row_chunk_gemm.jsonl" | tee -a "$out/summary.txt"
fi
if want gpt2; then
  step "gpt2 small in GPU memory (keep, one 4096-row chunk) against PyTorch eager, then with --row-chunk 1024, same lease"
  gpt2_keep | tee -a "$out/summary.txt"
  timeout 60 python3 bench/pytorch_gpu_train_step.py --batch 4 --seq 1024 --steps 10 --attn eager 2>&1 | tail -1 |
    cut -c1-110 | tee -a "$out/summary.txt"
  gpt2_keep --row-chunk 1024 | sed 's/^/--row-chunk 1024: /' | tee -a "$out/summary.txt"
  gpt2_keep | sed 's/^/again at 4096: /' | tee -a "$out/summary.txt"
fi
if want gpt2-tier; then
  step "gpt2 tier, AdamW placed by the run (auto), then on the GPU"
  timeout 150 bash bench/gpu_tier.sh build/stratum "$tokens" "$out/gpt2" gpt2 1000M 2>&1 | tee -a "$out/summary.txt"
  timeout 100 bash bench/gpu_tier.sh build/stratum "$tokens" "$out/gpt2-gpu" gpt2 1000M -- --adamw-on gpu 2>&1 |
    grep "^1000M" | sed 's/^/adamw on the gpu: /' | tee -a "$out/summary.txt"
fi
if want llama-tier; then
  step "llama 1.1B tier at 25% of its state, auto then on the GPU"
  timeout 300 bash bench/gpu_tier.sh build/stratum "$tokens32k" "$out/llama" llama1b 4300M 2>&1 | tee -a "$out/summary.txt"
  timeout 200 bash bench/gpu_tier.sh build/stratum "$tokens32k" "$out/llama-gpu" llama1b 4300M -- --adamw-on gpu 2>&1 |
    grep "^4300M" | sed 's/^/adamw on the gpu: /' | tee -a "$out/summary.txt"
fi
if want llama-chunk; then
  step "llama 1.1B whole and at 4300M with --row-chunk 1024 (its 2048 rows in two chunks; compare llama-tier's one)"
  timeout 200 bash bench/gpu_tier.sh build/stratum "$tokens32k" "$out/llama-chunk" llama1b 4300M -- --row-chunk 1024 2>&1 |
    grep -E "^(whole|4300M)" | sed 's/^/--row-chunk 1024: /' | tee -a "$out/summary.txt"
fi
if want llama-trace; then
  step "llama 4300M, AdamW on the GPU, traced (where the step waits: Note [host optimizer]'s alternative)"
  timeout 80 build/stratum train --backend cuda --arch llama --layers 22 --heads 32 --kv-heads 4 --embd 2048 --inner 5632 \
    --ctx 2048 --vocab 32000 --untied --batch 1 --seq 2048 --lr 3e-4 --lr-schedule constant --data "$tokens32k" \
    --threads 16 --quiet --steps 3 --gpu-mem-budget 4300M --adamw-on gpu --trace "$out/llama-gpu-adamw.json" 2>&1 |
    grep "median step" | tee -a "$out/summary.txt"
  [[ -f $out/llama-gpu-adamw.json ]] && gzip -f "$out/llama-gpu-adamw.json"
fi
if want decode; then
  step "decoding the 1.1B Llama with 25% of its weights on the GPU"
  model=$(mktemp -d)
  timeout 60 python3 tools/make_random_llama.py --out "$model" --preset 1b --dtype bf16 --threads 16 > /dev/null 2>&1 &&
    timeout 120 bash bench/gpu_decode.sh build/stratum "$model" "$out/decode" 560M 2>&1 | tee -a "$out/summary.txt"
  rm -rf "$model"
fi
find "$out" -name '*.jsonl' -delete  # the per-step logs: the summary has what matters
step done
