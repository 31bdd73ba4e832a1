#!/usr/bin/env bash
# The main job: set up, build, then run a real ggml workload through apir.
# An apir-host serves the CPU backend on a private socket; llama.cpp's
# llama-bench runs a generated llama model through the remote device APIR0,
# natively and through ggml-rpc for comparison; then a greedy decode through
# APIR0 is checked token for token against the CPU backend; last, whisper.cpp's
# whisper-cli transcribes a sample through APIR0 and on the CPU backend.
#   scripts/main.sh [--size tiny|1b|8b] [--type f16|q4_0|q8_0] [bench options]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SIZE=1b TYPE=q4_0
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --size) SIZE=$2; shift;; --type) TYPE=$2; shift;;
    *) args+=("$1");;
  esac
  shift
done
bash scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" | tail -1
echo
echo "== llama-bench: native CPU vs apir (host on the CPU backend) vs ggml-rpc =="
bash bench/llama_bench_compare.sh --size "$SIZE" --type "$TYPE" "${args[@]}"
echo
echo "== greedy decode through APIR0 vs the CPU backend =="
bash tests/run_llama_compare.sh "$ROOT/build" "$ROOT/.deps/bin"
echo
echo "== the same through 'apir run' (any ggml program works the same way) =="
model="${XDG_CACHE_HOME:-$HOME/.cache}/apir/models/llama-$SIZE-$TYPE.gguf"
native_tokens=$(build/tests/apir-llama-greedy -m "$model" -d CPU -n 8 2>/dev/null | grep "tokens:")
run_tokens=$(build/apir run --threads 2 -- build/tests/apir-llama-greedy -m "$model" -d APIR0 -n 8 2>/dev/null | grep "tokens:")
echo "  CPU backend:           $native_tokens"
echo "  apir run, APIR0:       $run_tokens"
if [ -n "$run_tokens" ] && [ "$run_tokens" = "$native_tokens" ]; then
  echo "  equal: yes"
else
  echo "  equal: NO"; exit 1
fi
echo
echo "== whisper.cpp's whisper-cli through APIR0 vs the CPU backend (random-weight tiny model, jfk.wav) =="
bash tests/run_whisper_compare.sh "$ROOT/build" "$ROOT/.whisper"
