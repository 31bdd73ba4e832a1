# Shared by the shell tests: start and stop a private apir-host.
# Needs APIR_BUILD (the build folder) and APIR_DEPS_BIN (.deps/bin).

# APIR_TEST_STREAM=tcp|tls: the host also listens on a loopback TCP port the
# kernel picks, and APIR_HOST names it (the guests go over TCP; with tls, over
# TLS 1.3 with a key made here, APIR_TLS_PSK_FILE).
apir_host_start() {
  APIR_TEST_DIR=$(mktemp -d /tmp/apir-test-XXXXXX)
  APIR_HOST="unix:$APIR_TEST_DIR/host.sock"
  local stream=() level=${APIR_HOST_LOG:-warn}
  if [ "${APIR_TEST_STREAM:-}" = tcp ] || [ "${APIR_TEST_STREAM:-}" = tls ]; then
    stream=(--listen "$APIR_TEST_STREAM:127.0.0.1:0")
    if [ "$APIR_TEST_STREAM" = tls ]; then
      # a key for the guest, and the host's key file with it
      echo "apir-test:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$APIR_TEST_DIR/guest.key"
      chmod 600 "$APIR_TEST_DIR/guest.key"
      stream+=(--tls-psk-file "$APIR_TEST_DIR/guest.key")
      APIR_TLS_PSK_FILE=$APIR_TEST_DIR/guest.key
      export APIR_TLS_PSK_FILE
    fi
    [ "$level" = warn ] || [ "$level" = error ] && level=info  # the port is said at info level
  fi
  export APIR_HOST
  "$APIR_BUILD/apir-host" --listen "$APIR_HOST" "${stream[@]}" --log-level "$level" "$@" \
    >"$APIR_TEST_DIR/host.log" 2>&1 &
  APIR_HOST_PID=$!
  for _ in $(seq 1 500); do
    if [ -S "$APIR_TEST_DIR/host.sock" ]; then
      [ ${#stream[@]} = 0 ] && return 0
      local tcp
      tcp=$(grep -o 'serving t[cl][ps]:127\.0\.0\.1:[0-9]*' "$APIR_TEST_DIR/host.log" | head -1 | cut -d' ' -f2)
      if [ -n "$tcp" ]; then APIR_HOST=$tcp; export APIR_HOST; return 0; fi
    fi
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

# A test's work folder ($work) and the processes it started (pids+=...):
# both gone at exit.  fail MESSAGE shows the tail of each $work/*.log.
apir_test_setup() {
  work=$(mktemp -d "/tmp/apir-$1-XXXXXX")
  pids=()
  trap apir_test_cleanup EXIT
}
apir_test_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done; exit 1; }
wait_for() {  # wait_for SECONDS TEST...
  local n=$(( $1 * 20 )); shift
  for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.05; done
  return 1
}
