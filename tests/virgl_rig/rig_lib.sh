# Shared by the rig's shell tests: start and stop a private apir-virgl-rig,
# and run a guest command inside it.
# Needs APIR_BUILD (the build folder).

# rig_start [rig options...]: a rig serving build/libapir-virgl.so unless
# --host-lib is among the options.  Sets RIG_DIR, RIG_SOCK, RIG_PID.
rig_start() {
  RIG_DIR=$(mktemp -d /tmp/apir-rig-XXXXXX)
  RIG_SOCK="$RIG_DIR/rig.sock"
  local lib=(--host-lib "$APIR_BUILD/libapir-virgl.so")
  case " $* " in *" --host-lib "*) lib=() ;; esac
  "$APIR_BUILD/apir-virgl-rig" --listen "$RIG_SOCK" "${lib[@]}" "$@" >"$RIG_DIR/rig.log" 2>&1 &
  RIG_PID=$!
  for _ in $(seq 1 500); do
    [ -S "$RIG_SOCK" ] && return 0
    kill -0 "$RIG_PID" 2>/dev/null || break
    sleep 0.01
  done
  echo "apir-virgl-rig did not start:"; cat "$RIG_DIR/rig.log"
  return 1
}

# rig_stop: SIGTERM, then the rig's exit status (0: every context was torn
# down through apir_backend_deinit without a crash).
rig_stop() {
  [ -n "${RIG_PID:-}" ] || return 0
  kill -TERM "$RIG_PID" 2>/dev/null
  wait "$RIG_PID" 2>/dev/null
  local rc=$?
  RIG_PID=
  return $rc
}

rig_cleanup() {
  rig_stop
  [ -n "${RIG_DIR:-}" ] && rm -rf "$RIG_DIR"
  RIG_DIR=
}

# rig_guest CMD...: runs CMD as a VM guest of the running rig.  In a
# sanitizer build the shim needs the ASan runtime, which must come first in
# the preload list.
rig_preload() {
  local shim="$APIR_BUILD/libapir-virgl-shim.so" pre
  pre=$(ldd "$shim" 2>/dev/null | awk '/libasan\.so/ {print $3; exit}')
  echo "${pre:+$pre }$shim"
}

rig_guest() {
  LD_PRELOAD="$(rig_preload)" APIR_RIG_SOCKET="$RIG_SOCK" "$@"
}

# In a sanitizer build: no leak report for a program that is not ours
# (test-backend-ops, the reference's libraries).
no_leak_check() {
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$@"
}
