#!/usr/bin/env bash
# llama.cpp's test-backend-ops through APIR0 (host on the CPU backend),
# side by side with the CPU backend itself on the same op list.
# Passes when every case that runs through APIR0 passes and APIR0 passes
# exactly as many cases as the CPU backend does (nothing skipped).
#
# usage: run_backend_ops.sh APIR_BUILD DEPS_BIN "OPS" ["PARAMS"]
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2 OPS=$3 PARAMS=${4:-}
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tbo_lib.sh"
trap apir_host_stop EXIT
apir_host_start --threads 2 || exit 1

args=(test -o "$OPS")
[ -n "$PARAMS" ] && args+=(-p "$PARAMS")
cd "$APIR_DEPS_BIN"
out=$(mktemp -d)
# Backends are loaded beside the executable; ours comes from GGML_BACKEND_PATH.
t0=$SECONDS
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" ./test-backend-ops "${args[@]}" -b APIR0 >"$out/apir.log" 2>&1
rc_apir=$?
t_apir=$SECONDS
./test-backend-ops "${args[@]}" -b CPU >"$out/cpu.log" 2>&1
rc_cpu=$?
t_cpu=$SECONDS

read -r ap at ans <<<"$(tbo_count "$out/apir.log")"
read -r cp ct cns <<<"$(tbo_count "$out/cpu.log")"
echo "test-backend-ops -o $OPS ${PARAMS:+-p $PARAMS}"
echo "  APIR0 (host CPU): $ap/$at passed, $ans not supported (exit $rc_apir, $((t_apir - t0)) s)"
echo "  CPU (native):     $cp/$ct passed, $cns not supported (exit $rc_cpu, $((t_cpu - t_apir)) s)"
# Cases the CPU backend runs but APIR0 reports unsupported:
grep 'not supported \[APIR0\]' "$out/apir.log" | head -5
fail=0
tbo_judge "$rc_apir" "$ap" "$at" "$cp" "$out/apir.log" || fail=1
if ! apir_host_stop; then
  echo "FAIL: apir-host did not exit cleanly"; fail=1
fi
if [ $fail = 0 ]; then rm -rf "$out"; else echo "logs kept in $out"; fi
exit $fail
