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
. "$(dirname "$0")/../tbo_lib.sh"
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

read -r ap at ans <<<"$(tbo_count "$out/apir.log")"
read -r cp ct cns <<<"$(tbo_count "$out/cpu.log")"
echo "test-backend-ops -o $OPS ${PARAMS:+-p $PARAMS} (capset ${APIR_VIRTGPU_CAPSET:-apir}, rig ${RIG_ARGS:-default})"
echo "  APIR0 via virtgpu (rig, libapir-virgl.so, CPU): $ap/$at passed, $ans not supported (exit $rc_apir, $((t1 - t0)) s)"
echo "  CPU (native):                                    $cp/$ct passed, $cns not supported (exit $rc_cpu)"
fail=0
tbo_judge "$rc_apir" "$ap" "$at" "$cp" "$out/apir.log" || fail=1
if ! rig_stop; then
  echo "FAIL: the rig did not exit cleanly"; fail=1
fi
if grep -qE 'rig: .*(malformed|bad request|dropped|outside)' "$RIG_DIR/rig.log"; then
  echo "FAIL: the rig saw protocol errors:"; grep -E 'rig: ' "$RIG_DIR/rig.log" | head; fail=1
fi
rm -rf "$out"
exit $fail
