#!/usr/bin/env bash
# llama.cpp's test-backend-ops on APIR0 reached the way a VM guest reaches it:
# libggml-apir.so -> transport/virtgpu.c (APIR_HOST=virtgpu) -> the shim's
# virtio-gpu driver -> apir-virgl-rig (virglrenderer) -> libapir-virgl.so ->
# the CPU backend.  Side by side with the CPU backend itself on the same op
# list.  Passes when every case that runs through APIR0 passes, APIR0 passes
# exactly as many cases as the CPU backend (nothing skipped), and the rig tears
# the context down cleanly.
#
# usage: run_backend_ops_virgl.sh APIR_BUILD DEPS_BIN "OPS" ["PARAMS"]
# env:   RIG_ARGS  extra rig options (e.g. --no-shmem-size)
#        APIR_VIRTGPU_CAPSET  apir (default) or venus
set -uo pipefail
APIR_BUILD=$(cd "$1" && pwd) APIR_DEPS_BIN=$(cd "$2" && pwd) OPS=${3:?usage: run_backend_ops_virgl.sh APIR_BUILD DEPS_BIN OPS [PARAMS]} PARAMS=${4:-}
. "$(dirname "$0")/rig_lib.sh"
trap rig_cleanup EXIT
# shellcheck disable=SC2086
rig_start --ggml-lib "$APIR_DEPS_BIN/libggml-cpu.so" --threads 2 ${RIG_ARGS:-} || exit 1

args=(test -o "$OPS")
[ -n "$PARAMS" ] && args+=(-p "$PARAMS")
cd "$APIR_DEPS_BIN"
out=$(mktemp -d)
t0=$(date +%s)
rig_guest no_leak_check env GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST=virtgpu APIR_LOG_LEVEL=warn \
  ./test-backend-ops "${args[@]}" -b APIR0 >"$out/apir.log" 2>&1
rc_apir=$?
t1=$(date +%s)
./test-backend-ops "${args[@]}" -b CPU >"$out/cpu.log" 2>&1
rc_cpu=$?

count() { # passed total notsupported
  local log=$1
  local line; line=$(grep -E '^ +[0-9]+/[0-9]+ tests passed' "$log" | tail -1)
  local passed=${line%%/*}; passed=${passed// /}
  local total=${line#*/}; total=${total%% *}
  local ns; ns=$(grep -c 'not supported' "$log")
  echo "${passed:-0} ${total:-0} $ns"
}
read -r ap at ans <<<"$(count "$out/apir.log")"
read -r cp ct cns <<<"$(count "$out/cpu.log")"
echo "test-backend-ops -o $OPS ${PARAMS:+-p $PARAMS} (capset ${APIR_VIRTGPU_CAPSET:-apir}, rig ${RIG_ARGS:-default})"
echo "  APIR0 via virtgpu (rig, libapir-virgl.so, CPU): $ap/$at passed, $ans not supported (exit $rc_apir, $((t1 - t0)) s)"
echo "  CPU (native):                                    $cp/$ct passed, $cns not supported (exit $rc_cpu)"
fail=0
if [ "$rc_apir" != 0 ] || [ "$ap" != "$at" ] || [ "$at" = 0 ]; then
  echo "FAIL: cases failed through APIR0:"; grep -E 'FAIL|error' "$out/apir.log" | head -20; fail=1
fi
if [ "$ap" != "$cp" ]; then
  echo "FAIL: APIR0 passed $ap cases, the CPU backend $cp"; fail=1
fi
if ! rig_stop; then
  echo "FAIL: the rig did not exit cleanly"; fail=1
fi
if grep -qE 'rig: .*(malformed|bad request|dropped|outside)' "$RIG_DIR/rig.log"; then
  echo "FAIL: the rig saw protocol errors:"; grep -E 'rig: ' "$RIG_DIR/rig.log" | head; fail=1
fi
rm -rf "$out"
exit $fail
