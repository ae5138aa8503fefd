#!/usr/bin/env bash
# The README's second command (and what CI runs): installs dependencies, builds Stratum and its
# GoogleTest suite in Release and runs every test with ctest, then runs the same suite again
# built with AddressSanitizer + UndefinedBehaviorSanitizer (tools/sanitize.sh), and runs every
# libFuzzer target for 30 s (tools/fuzz.sh). STRATUM_SKIP_SANITIZERS=1 / STRATUM_SKIP_FUZZ=1 skip
# those passes (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATUM_BUILD_TESTS=ON >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j2 --timeout 900 | tee build/ctest.log
total=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' build/ctest.log | tail -n1)
if [[ "${STRATUM_SKIP_SANITIZERS:-0}" != 1 ]]; then
  echo "[test] again under AddressSanitizer + UndefinedBehaviorSanitizer"
  bash tools/sanitize.sh
fi
if [[ "${STRATUM_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "[test] fuzzing every parser for 30 s"
  bash tools/fuzz.sh 30
fi
echo "stratum: ${total:-0} passed, 0 failed"
