#!/usr/bin/env bash
# The virtgpu path end to end in a few seconds per case: our guest
# (transport/virtgpu.c inside the apir tool and libggml-apir.so) through the
# shim and the rig to libapir-virgl.so.  Several guests at once, both
# capsets, rig variants (no get_shmem_size, a hypervisor that answers 0.1),
# a hypervisor that dies mid-session, configuration errors reported instead
# of aborting, and hostile input to the rig and the shim (rig_abuse).
#
# usage: run_rig_smoke.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$(cd "$1" && pwd) APIR_DEPS_BIN=$(cd "$2" && pwd)
. "$(dirname "$0")/rig_lib.sh"
trap rig_cleanup EXIT
CPU_LIB="$APIR_DEPS_BIN/libggml-cpu.so"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); [ -n "${2:-}" ] && sed 's/^/     /' "$2" | tail -15; }
T=$(mktemp -d /tmp/apir-smoke-XXXXXX)

# 1. ping: handshake, LOADLIBRARY, the 0.2 probe, round trips; both sides at this tree's
# protocol version (protocol/apir_proto.h).
MINOR=$(sed -n 's/^#define APIR_VERSION_MINOR \([0-9]*\).*/\1/p' "$(dirname "$0")/../../protocol/apir_proto.h")
rig_start --ggml-lib "$CPU_LIB" --threads 2 || exit 1
if rig_guest "$APIR_BUILD/apir" ping virtgpu -n 2000 >"$T/ping.log" 2>&1 && grep -q "APIR 0\.$MINOR (guest 0\.$MINOR)" "$T/ping.log"; then
  ok "ping over virtgpu: $(grep 'null call' "$T/ping.log")"
else bad "ping over virtgpu" "$T/ping.log"; fi

# 2. three guests at once: three contexts, three sessions.
pids=()
for i in 1 2 3; do rig_guest "$APIR_BUILD/apir" ping virtgpu -n 20000 >"$T/p$i.log" 2>&1 & pids+=($!); done
wait_ok=1
for j in "${pids[@]}"; do wait "$j" || wait_ok=0; done
if [ $wait_ok = 1 ] && [ "$(cat "$T"/p[123].log | grep -c 'null call')" = 3 ]; then ok "3 concurrent guests"
else bad "3 concurrent guests" "$T/p1.log"; fi

# 3. hostile input to the shim, the rig and the library behind it.
if rig_guest "$APIR_BUILD/rig_abuse" "$RIG_SOCK" >"$T/abuse.log" 2>&1; then ok "rig_abuse: $(tail -1 "$T/abuse.log")"
else bad "rig_abuse" "$T/abuse.log"; fi
if rig_guest "$APIR_BUILD/apir" ping virtgpu -n 100 >"$T/after.log" 2>&1; then ok "rig still serves after abuse"
else bad "rig still serves after abuse" "$T/after.log"; fi
if rig_stop; then ok "rig exits cleanly (deinit of every context)"; else bad "rig exit" "$RIG_DIR/rig.log"; fi
rig_cleanup

# 4. Venus capset, no get_shmem_size (bounds from the mappings), a
#    hypervisor answering 0.1: real ops through test-backend-ops.
rig_start --ggml-lib "$CPU_LIB" --threads 2 --no-shmem-size --host-minor 1 || exit 1
(cd "$APIR_DEPS_BIN" && rig_guest no_leak_check env APIR_VIRTGPU_CAPSET=venus GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
  APIR_HOST=virtgpu ./test-backend-ops test -o SCALE -b APIR0) >"$T/venus.log" 2>&1
if grep -qE '^ +[0-9]+/[0-9]+ tests passed' "$T/venus.log" && grep -q 'Backend APIR0: .*OK' "$T/venus.log"; then
  ok "venus capset + no get_shmem_size + hypervisor 0.1: $(grep -E '^ +[0-9]+/[0-9]+ tests passed' "$T/venus.log" | tail -1 | xargs)"
else bad "venus capset + no get_shmem_size + hypervisor 0.1" "$T/venus.log"; fi
rig_stop || bad "rig exit (variant)" "$RIG_DIR/rig.log"
rig_cleanup

# 5. The hypervisor dies mid-session: the guest reports an error, no hang, no abort.
rig_start --ggml-lib "$CPU_LIB" || exit 1
# (apir ping returns without freeing on a failed call: not what is tested)
rig_guest no_leak_check "$APIR_BUILD/apir" ping virtgpu -n 5000000 >"$T/dies.log" 2>&1 &
gp=$!
sleep 2
kill -KILL "$RIG_PID"; wait "$RIG_PID" 2>/dev/null; RIG_PID=
for _ in $(seq 1 100); do kill -0 "$gp" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$gp" 2>/dev/null; then kill -KILL "$gp"; bad "guest notices a dead hypervisor (hung)" "$T/dies.log"
else
  wait "$gp"; rc=$?
  if [ $rc = 1 ] && grep -q "went away\|failed" "$T/dies.log"; then ok "guest notices a dead hypervisor (exit $rc)"
  else bad "guest notices a dead hypervisor (exit $rc)" "$T/dies.log"; fi
fi
rig_cleanup

# 6. Configuration errors come back as errors, with the reason.
rig_start --ggml-lib /nonexistent/libggml-cpu.so || exit 1
rig_guest "$APIR_BUILD/apir" ping virtgpu >"$T/nolib.log" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "cannot open the ggml backend library" "$T/nolib.log"; then ok "missing ggml library reported (exit $rc)"
else bad "missing ggml library reported (exit $rc)" "$T/nolib.log"; fi
(cd "$APIR_DEPS_BIN" && rig_guest no_leak_check env GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
  APIR_HOST=virtgpu ./test-backend-ops test -o ADD -b APIR0) >"$T/nolib-tbo.log" 2>&1; rc=$?
if [ $rc -lt 128 ] && grep -q "no APIR device" "$T/nolib-tbo.log"; then ok "ggml program goes on without APIR0 (exit $rc)"
else bad "ggml program goes on without APIR0 (exit $rc)" "$T/nolib-tbo.log"; fi
rig_stop
rig_cleanup
rig_start --ggml-lib "$CPU_LIB" --host-lib /nonexistent/libapir-virgl.so || exit 1
rig_guest "$APIR_BUILD/apir" ping virtgpu >"$T/nohost.log" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "cannot open the host library" "$T/nohost.log"; then ok "missing host library reported (exit $rc)"
else bad "missing host library reported (exit $rc)" "$T/nohost.log"; fi
rig_stop
rig_cleanup
env APIR_RIG_SOCKET=/nonexistent.sock LD_PRELOAD="$(rig_preload)" \
  "$APIR_BUILD/apir" ping virtgpu >"$T/norig.log" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "no virtio-gpu render node" "$T/norig.log"; then ok "no device reported (exit $rc)"
else bad "no device reported (exit $rc)" "$T/norig.log"; fi
APIR_VIRTGPU_CAPSET=bogus "$APIR_BUILD/apir" ping virtgpu >"$T/capset.log" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "APIR_VIRTGPU_CAPSET" "$T/capset.log"; then ok "bad capset setting reported"
else bad "bad capset setting reported" "$T/capset.log"; fi

rm -rf "$T"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
