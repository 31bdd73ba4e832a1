#!/usr/bin/env bash
# Interop with the reference ("ggml-virtgpu") implementation through the rig
# (docs/INTEROP.md has the findings and the manual commands).
#
#  A. our guest -> the reference host library (libggml-virtgpu-backend.so):
#     the APIR 0.1 subset with a real graph (interop_ref), and what
#     test-backend-ops sees;
#  B. the reference guest (libggml-virtgpu.so) -> our libapir-virgl.so,
#     on the Venus capset (its default) and the APIR capset;
#  C. a reference guest built with USE_ALWAYS_TRUE_SUPPORTS_OP=0, so that it
#     asks DEVICE_SUPPORTS_OP in its inline-tensor format -> ours.
#
# A needs the reference host library: APIR_REF_HOST_LIB, default
# DEPS/ref-virgl/libggml-virtgpu-backend.so (scripts/setup.sh); without it the
# test is skipped (exit 77).  B and C run when APIR_REF_GUEST_LIB /
# APIR_REF_GUEST_SOP_LIB name the guest libraries (built by hand, see
# docs/INTEROP.md).
#
# usage: run_interop.sh APIR_BUILD DEPS_BIN [OPS]
set -uo pipefail
APIR_BUILD=$(cd "$1" && pwd) APIR_DEPS_BIN=$(cd "$2" && pwd) OPS=${3:-ADD,MUL_MAT}
PARAMS=${INTEROP_PARAMS-}
. "$(dirname "$0")/rig_lib.sh"
trap rig_cleanup EXIT
# The reference's code is not ours to leak-check (sanitizer builds).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
CPU_LIB="$APIR_DEPS_BIN/libggml-cpu.so"
REF_HOST=${APIR_REF_HOST_LIB:-$APIR_DEPS_BIN/../ref-virgl/libggml-virtgpu-backend.so}
REF_GUEST=${APIR_REF_GUEST_LIB:-$APIR_DEPS_BIN/../ref-virgl/libggml-virtgpu.so}
REF_GUEST_SOP=${APIR_REF_GUEST_SOP_LIB:-}
if [ ! -f "$REF_HOST" ]; then
  echo "SKIP: no reference host library at $REF_HOST (set APIR_REF_HOST_LIB)"
  exit 77
fi
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); [ -n "${2:-}" ] && grep -vE '^load_backend|^  [A-Z_]+\(.*OK' "$2" | tail -15 | sed 's/^/     /'; }
T=$(mktemp -d /tmp/apir-interop-XXXXXX)
counts() { # passed/total, not supported
  local line; line=$(grep -E '^ +[0-9]+/[0-9]+ tests passed' "$1" | tail -1 | xargs)
  echo "${line:-0/0 tests passed}, $(grep -c 'not supported' "$1") not supported"
}
tbo() { # log backend: test-backend-ops in the rig
  local log=$1 backend=$2; shift 2
  local args=(test -o "$OPS")
  [ -n "$PARAMS" ] && args+=(-p "$PARAMS")
  (cd "$APIR_DEPS_BIN" && rig_guest env "$@" ./test-backend-ops "${args[@]}" -b "$backend") >"$log" 2>&1
}

# ---- A. our guest -> the reference host library ----
rig_start --host-lib "$REF_HOST" --ggml-lib "$CPU_LIB" --threads 2 || exit 1
if rig_guest "$APIR_BUILD/interop_ref" 1 >"$T/a1.log" 2>&1; then
  ok "A: our guest, APIR 0.1 subset + graph, reference host: $(grep -E '^interop:' "$T/a1.log")"
else bad "A: our guest, APIR 0.1 subset + graph, reference host" "$T/a1.log"; fi
tbo "$T/a2.log" APIR0 GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST=virtgpu
rc=$?
# Expected: every case "not supported" (our guest asks supports_op only in
# apir 0.2, which the reference host does not speak); no crash either side.
if [ $rc = 0 ] && kill -0 "$RIG_PID" 2>/dev/null; then ok "A: test-backend-ops -o $OPS on APIR0 via the reference host: $(counts "$T/a2.log")"
else bad "A: test-backend-ops via the reference host (exit $rc)" "$T/a2.log"; fi
rig_stop || bad "A: rig exit" "$RIG_DIR/rig.log"
rig_cleanup

run_ref_guest() { # name lib env...
  local name=$1 lib=$2; shift 2
  rig_start --ggml-lib "$CPU_LIB" --threads 2 || return 1
  tbo "$T/$name.log" "[virtgpu] CPU" GGML_BACKEND_PATH="$lib" "$@"
  local rc=$?
  local c; c=$(counts "$T/$name.log")
  if [ $rc = 0 ] && grep -q 'Backend API Remoting backend: .*OK' "$T/$name.log" && ! grep -q '/0 tests' <<<"$c"; then
    ok "$name: reference guest -> libapir-virgl.so, test-backend-ops -o $OPS: $c"
  else bad "$name: reference guest -> libapir-virgl.so (exit $rc): $c" "$T/$name.log"; fi
  rig_stop || bad "$name: rig exit" "$RIG_DIR/rig.log"
  rig_cleanup
}

# ---- B. the reference guest -> our host library ----
if [ -f "$REF_GUEST" ]; then
  run_ref_guest "B-venus" "$REF_GUEST"
  run_ref_guest "B-apir-capset" "$REF_GUEST" GGML_REMOTING_USE_APIR_CAPSET=1
else echo "(B skipped: no reference guest library at $REF_GUEST)"; fi

# ---- C. its inline-tensor DEVICE_SUPPORTS_OP -> our host library ----
if [ -n "$REF_GUEST_SOP" ] && [ -f "$REF_GUEST_SOP" ]; then
  run_ref_guest "C-supports-op" "$REF_GUEST_SOP"
else echo "(C skipped: APIR_REF_GUEST_SOP_LIB not set)"; fi

rm -rf "$T"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
