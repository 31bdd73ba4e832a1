#!/usr/bin/env bash
# The test command: set-up (cached), build with warnings as errors, ctest.
#   scripts/test.sh            everything CI runs
#   scripts/test.sh -R NAME    a subset (ctest arguments)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
t0=$(date +%s)
cmake -S . -B build -G Ninja -DAPIR_WERROR=ON >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
cmake --build build -j "$(nproc)" 2>&1 | tail -3
echo "test: build done in $(( $(date +%s) - t0 ))s"
cd build
ctest --output-on-failure --timeout 3000 "$@"
