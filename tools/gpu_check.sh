#!/usr/bin/env bash
# What the project checks on a machine with an NVIDIA GPU (CI has none): the CUDA backend's op
# tests against the CPU reference (tests/cuda_*_test.cpp, skipped elsewhere), and
# tools/hf_load_check.sh (transformers + PEFT load what Stratum saves and compute its losses).
# Runs the binaries already in build/ (configure with the CUDA toolkit present: STRATUM_CUDA=AUTO
# builds the backend). LIBS_TAR: an optional tarball of the shared libraries the binaries need,
# for a GPU machine that is not Debian (unpacked into a temporary folder on LD_LIBRARY_PATH).
# Logs go to OUT_DIR (default build/gpu_check).
# Usage: bash tools/gpu_check.sh TOKENS.bin [LIBS_TAR] [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
tokens=$1 libs=${2:-} out=${3:-build/gpu_check}
mkdir -p "$out"
source tools/gpu_env.sh
gpu_env_libs "$libs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
build/stratum version | tee -a "$out/gpu.txt"
status=0
build/stratum_tests --gtest_filter='Cuda*:Backend*' 2>&1 | tee "$out/cuda_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|FAILED TEST|Failure|error" || true
grep -q "^\[  PASSED  \]" "$out/cuda_tests.log" && ! grep -q "FAILED" "$out/cuda_tests.log" || status=1
grep -q "SKIPPED \] Cuda" "$out/cuda_tests.log" && { echo "gpu_check: CUDA tests were skipped (no GPU or no CUDA build)"; status=1; }
bash tools/hf_load_check.sh build/stratum "$tokens" "$out/hf" python3 > "$out/hf_load_check.log" 2>&1 || status=1
tail -8 "$out/hf_load_check.log"
echo "gpu_check: $([[ $status == 0 ]] && echo passed || echo FAILED)"
exit $status
