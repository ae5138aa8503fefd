#!/usr/bin/env bash
# The README's second command (and what CI runs): installs dependencies, builds Stratum and its
# GoogleTest suite in Release, and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATUM_BUILD_TESTS=ON >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j2 --timeout 900
