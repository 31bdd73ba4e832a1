#!/usr/bin/env bash
# With the frontend loaded but no host running, a ggml program still runs on
# its CPU backend, and says why APIR has no device.
# usage: run_no_host.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || exit 1
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="unix:$work/nobody-here.sock" \
  timeout 60 "$APIR_BUILD/tests/apir-llama-greedy" -m "$work/model.gguf" -d CPU -n 4 >"$work/out" 2>"$work/err"
rc=$?
grep -h "APIR" "$work/err" | head -3
if [ $rc != 0 ]; then echo "FAIL: the program failed (exit $rc)"; cat "$work/err" | tail -5; exit 1; fi
grep -q "tokens:" "$work/out" || { echo "FAIL: no tokens"; exit 1; }
grep -q "no APIR device: cannot connect to $work/nobody-here.sock" "$work/err" \
  || { echo "FAIL: no clear warning"; exit 1; }
echo "ok: ran on CPU without a host and said why"
