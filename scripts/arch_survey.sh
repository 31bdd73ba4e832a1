#!/usr/bin/env bash
# The architecture survey: every model architecture llama.cpp's test-llama-archs
# can build a random model for, run natively on the CPU backend and through
# APIR0 (a private apir-host on the CPU backend), with the results compared
# exactly (tests/run_arch_survey.sh says how).  CI runs a subset
# (ctest -R arch_survey_ci); this runs them all, about 10 minutes on 2 cores.
#   scripts/arch_survey.sh [ARCH...]          default: all
#   APIR_BUILD_DIR=build-x scripts/arch_survey.sh   another build folder (default build)
# The table is printed and written to $APIR_SURVEY_TABLE (default
# <build>/arch_survey.md).  Exit 1 when an architecture that runs natively
# differs through APIR0.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${APIR_BUILD_DIR:-build}
bash scripts/setup.sh
cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" -j "$(nproc)" | tail -1
[ $# -gt 0 ] || set -- all
table=${APIR_SURVEY_TABLE:-$ROOT/$BUILD/arch_survey.md}
bash tests/run_arch_survey.sh "$ROOT/$BUILD" "$ROOT/.deps/bin" --table "$table" "$@"
