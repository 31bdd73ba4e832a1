# Shared by the shell tests: start and stop a private apir-host.
# Needs APIR_BUILD (the build folder) and APIR_DEPS_BIN (.deps/bin).

apir_host_start() {
  APIR_TEST_DIR=$(mktemp -d /tmp/apir-test-XXXXXX)
  APIR_HOST="unix:$APIR_TEST_DIR/host.sock"
  export APIR_HOST
  "$APIR_BUILD/apir-host" --listen "$APIR_HOST" --log-level "${APIR_HOST_LOG:-warn}" "$@" \
    >"$APIR_TEST_DIR/host.log" 2>&1 &
  APIR_HOST_PID=$!
  for _ in $(seq 1 500); do
    [ -S "$APIR_TEST_DIR/host.sock" ] && return 0
    kill -0 "$APIR_HOST_PID" 2>/dev/null || break
    sleep 0.01
  done
  echo "apir-host did not start:"; cat "$APIR_TEST_DIR/host.log"
  return 1
}

apir_host_stop() {
  [ -n "${APIR_HOST_PID:-}" ] || return 0
  kill "$APIR_HOST_PID" 2>/dev/null
  wait "$APIR_HOST_PID" 2>/dev/null
  local rc=$?
  APIR_HOST_PID=
  rm -rf "$APIR_TEST_DIR"
  return $rc
}
