#!/usr/bin/env bash
# The command lines of apir-host, apir and the generators (issue 18, item 4):
# --version, --help for every subcommand, --opt=value and the short options,
# numbers validated, unknown options and malformed endpoints refused (never
# bound as a file), an unauthenticated network listener refused, a missing backend directory, exit statuses, the
# default CPU thread count, and apir run leaving no socket folder behind and
# stopping its host without a worker killed by a signal.
#   tests/run_cli.sh BUILD_DIR VERSION GGML_COMMIT        (ctest: cli)
set -uo pipefail
B=$1 VERSION=$2 COMMIT=$3
T=$(mktemp -d /tmp/apir-cli-XXXXXX)
HOST_PID=
cleanup() {
  [ -n "$HOST_PID" ] && kill "$HOST_PID" 2>/dev/null && wait "$HOST_PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
unset APIR_HOST APIR_BACKEND_DIR GGML_BACKEND_PATH
export APIR_LOG_LEVEL=warn
mkdir -p "$T/tmp" "$T/cwd" "$T/empty"
export TMPDIR=$T/tmp   # apir run's socket folders go here: checked empty below
cd "$T/cwd"
fails=0 n=0

# expect RC CMD...: runs CMD (stdout in $T/out, stderr in $T/err), checks its status.
expect() {
  local want=$1; shift
  n=$((n + 1))
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL: '$*' exited $rc, expected $want"; sed 's/^/  stderr: /' "$T/err" | head -5
    fails=$((fails + 1))
    return 1
  fi
}
# has FILE REGEX [what]: the last command's stdout or stderr matches.
has() {
  grep -Eq -- "$2" "$T/$1" && return 0
  echo "FAIL: ${3:-output}: no /$2/ in $1"; sed 's/^/  | /' "$T/$1" | head -8
  fails=$((fails + 1))
}
hasnt() {
  grep -Eq -- "$2" "$T/$1" || return 0
  echo "FAIL: ${3:-output}: /$2/ in $1"; grep -E -- "$2" "$T/$1" | head -3 | sed 's/^/  | /'
  fails=$((fails + 1))
}

echo "== --version"
for p in apir-host apir apir-gguf-gen apir-whisper-gen; do
  expect 0 "$B/$p" --version && {
    has out "^$p $VERSION\$" "$p --version"
    has out "^protocol: APIR 0\.[0-9]+\$" "$p --version"
    has out "commit $COMMIT" "$p --version"
  }
done

echo "== --help for every program and subcommand"
for cmd in "apir-host --help" "apir-host -h" "apir --help" "apir help" "apir ping --help" "apir info --help" \
           "apir run --help" "apir help ping" "apir help run" "apir ping -h" "apir-gguf-gen --help" "apir-whisper-gen --help"; do
  set -- $cmd
  p=$1; shift
  expect 0 "$B/$p" "$@" && { has out "^usage: " "$cmd"; hasnt err "cannot connect|unknown" "$cmd"; }
done
for cmd in "apir-host --help" "apir --help" "apir ping --help" "apir info --help" "apir run --help"; do
  set -- $cmd; p=$1; shift
  expect 0 "$B/$p" "$@" && has out "exit status" "$cmd documents its exit statuses"
done

echo "== bad command lines: exit 2 (apir run: 125), with a message"
expect 2 "$B/apir"
expect 2 "$B/apir" frob && has err "unknown command 'frob'"
expect 2 "$B/apir" ping -n abc && has err "count: 'abc' is not a number"
expect 2 "$B/apir" ping -n 0
expect 2 "$B/apir" ping --count=12x
expect 2 "$B/apir" ping -n
expect 2 "$B/apir" ping -i 1000001 && has err "interval-us: '1000001' is not a number from 0 to 1000000"
expect 2 "$B/apir" ping --bogus && has err "unknown .*--bogus"
expect 2 "$B/apir" info -n 5
expect 2 "$B/apir" ping unix:/a unix:/b && has err "one endpoint"
expect 2 "$B/apir-host" --threads abc && has err "threads: 'abc' is not a number"
expect 2 "$B/apir-host" -t -1
expect 2 "$B/apir-host" --threads=1.5
expect 2 "$B/apir-host" --max-clients 0
expect 2 "$B/apir-host" --spawn-rate=
expect 2 "$B/apir-host" --handshake-timeout-ms 600001
expect 2 "$B/apir-host" --threads && has err "needs a value"
expect 2 "$B/apir-host" --bogus && has err "unknown .*--bogus"
expect 2 "$B/apir-host" -x
expect 2 "$B/apir-host" stray && has err "unexpected argument 'stray'"
expect 2 "$B/apir-host" --isolation none
# Every guest in one unsandboxed process only when called insecure (issue 24).
expect 2 timeout 10 "$B/apir-host" --listen "unix:$T/thread.sock" --isolation thread &&
  { has err "add --insecure-shared-process"; hasnt err "serving"; }
expect 2 "$B/apir-host" --log-level loud
expect 2 "$B/apir-host" -d CPU0,CPU1
expect 2 "$B/apir-gguf-gen" -o "$T/m.gguf" --layers abc && has err "bad value for --layers"
expect 2 "$B/apir-gguf-gen" --bogus
expect 2 "$B/apir-whisper-gen" --type f64
expect 125 "$B/apir" run -t abc -- true && has err "threads: 'abc' is not a number"
expect 125 "$B/apir" run
expect 125 "$B/apir" run --bogus -- true

echo "== endpoints: malformed and unknown ones refused, never bound as a file"
expect 2 "$B/apir-host" --listen tcp:127.0.0.1 && has err "bad endpoint"
expect 2 "$B/apir-host" --listen=tcp:127.0.0.1:65536 && has err "bad endpoint"
expect 2 "$B/apir-host" --listen tcp:::1:5000 && has err "IPv6 in brackets"
expect 2 "$B/apir-host" --listen vsock:x:5000 && has err "vsock:CID:PORT"
expect 2 "$B/apir-host" -H 0.0.0.0 && has err "not a socket path"
expect 2 "$B/apir-host" -H 127.0.0.1 -p 50052
expect 2 "$B/apir-host" --port 50052 && has err "listen tcp:HOST:PORT"
expect 2 "$B/apir-host" --listen virtgpu && has err "libapir-virgl.so"
expect 2 "$B/apir-host" --listen unix:
expect 2 "$B/apir-host" --listen ftp:x:1 && has err "not a unix: endpoint"
n=$((n + 1))
if [ -n "$(ls -A "$T/cwd")" ]; then echo "FAIL: a refused endpoint left files: $(ls -A "$T/cwd")"; fails=$((fails + 1)); fi
# An address other machines reach, without a token: the host refuses to start.
expect 1 "$B/apir-host" --listen "unix:$T/open.sock" --listen tcp:0.0.0.0:0 --isolation thread --insecure-shared-process \
  && has err "refused without authentication"
expect 2 "$B/apir" ping tcp:127.0.0.1 && has err "bad endpoint"
expect 2 "$B/apir" ping tcp:127.0.0.1:0 && has err "port 0"
expect 1 "$B/apir" ping tcp:127.0.0.1:1 && has err "cannot connect to tcp:127.0.0.1:1"
expect 2 "$B/apir" info --host=foo && has err "unknown endpoint 'foo'"
expect 2 env APIR_HOST=ftp:1.2.3.4:5 "$B/apir" info && has err "from APIR_HOST"
expect 2 "$B/apir" stat tcp:127.0.0.1:5000 && has err "on its own machine"
expect 1 "$B/apir" ping "unix:$T/none.sock" && has err "cannot connect"

echo "== backend directory"
expect 1 "$B/apir-host" --backend-dir /nonexistent --list-devices && has err "/nonexistent"
expect 1 env APIR_BACKEND_DIR=/nonexistent "$B/apir-host" --list-devices && has err "/nonexistent.*APIR_BACKEND_DIR"
expect 1 "$B/apir-host" --backend-dir="$T/empty" --list-devices && has err "no usable ggml backend"
expect 1 "$B/apir-host" --backend-dir /nonexistent --listen "unix:$T/x.sock"
expect 0 "$B/apir-host" --list-devices && { has out "^backend directory: "; has out "device 0: CPU"; }
expect 1 "$B/apir-host" --backend NOPE --listen "unix:$T/x.sock" && has err "backend 'NOPE' not found"
expect 1 "$B/apir-host" -d NOPE0 --listen "unix:$T/x.sock" && has err "no device 'NOPE0'"

echo "== a host with --opt=value and short options; clients with -H and --count="
"$B/apir-host" --listen="unix:$T/h.sock" -t 1 -b CPU -d CPU --log-level=info -c >"$T/host.log" 2>&1 &
HOST_PID=$!
for _ in $(seq 1 500); do [ -S "$T/h.sock" ] && break; sleep 0.01; done
expect 0 "$B/apir" ping --count=50 -H "unix:$T/h.sock" && has out "x 50:"
expect 0 "$B/apir" ping -n 20 --interval-us 500 "unix:$T/h.sock" && has out "x 20, each after a pause:"
expect 0 "$B/apir" info "unix:$T/h.sock" && has out "device 0: CPU"
expect 0 env APIR_HOST="unix:$T/h.sock" "$B/apir" info && has out "device 0: CPU"
expect 0 "$B/apir" run -H "unix:$T/h.sock" -- "$B/apir" info && has out "device 0: CPU"
kill "$HOST_PID"; wait "$HOST_PID"; rc=$?; HOST_PID=
n=$((n + 1))
[ "$rc" = 0 ] || { echo "FAIL: apir-host stopped by SIGTERM exited $rc"; fails=$((fails + 1)); }
cp "$T/host.log" "$T/out"
has out "1 CPU thread\(s\) per guest" "--threads 1 (-t 1)"
has out "cache ignored" "-c"
has out "serving CPU \(1 device" "-d CPU"
hasnt out "died of signal" "the host's log"

echo "== default threads: the cores this process may use"
expect 0 taskset -c 0 "$B/apir-host" --help && has out "threads N .*default 1:" "under taskset -c 0"
"$B/apir-host" --listen "unix:$T/d.sock" --log-level info >"$T/out" 2>&1 &
HOST_PID=$!
for _ in $(seq 1 500); do [ -S "$T/d.sock" ] && break; sleep 0.01; done
kill "$HOST_PID"; wait "$HOST_PID"; HOST_PID=
cores=$(nproc)
has out "[1-9][0-9]* CPU thread\(s\) per guest \(the cores this process may use\)" "default threads"
t=$(sed -n 's/.* \([0-9]*\) CPU thread(s) per guest.*/\1/p' "$T/out" | head -1)
n=$((n + 1))
if [ -z "$t" ] || [ "$t" -gt "$cores" ]; then echo "FAIL: default threads '$t', $cores core(s) allowed"; fails=$((fails + 1)); fi

echo "== apir run: exit statuses, socket folder removed, the host stopped cleanly"
expect 0 "$B/apir" run -- "$B/apir" info && { has out "device 0: CPU"; hasnt err "died of signal|warn"; }
expect 0 "$B/apir" run -t 1 --log-level info -- "$B/apir" ping -n 10 && { has err "1 CPU thread"; hasnt err "died of signal"; }
expect 7 "$B/apir" run -- sh -c 'exit 7'
expect 137 "$B/apir" run -- sh -c 'kill -9 $$'
expect 127 "$B/apir" run -- "$T/no-such-program" && { has err "cannot run .*no such program"; hasnt err "started apir-host"; }
expect 127 "$B/apir" run -- no-such-program-in-path && { has err "not found in PATH"; hasnt err "started apir-host"; }
expect 126 "$B/apir" run -- "$T/empty" && hasnt err "started apir-host"

echo "== apir cdi: the default socket follows XDG_RUNTIME_DIR; --gid gives the socket folder's group"
mkdir -p "$T/xdg/apir"
expect 0 env XDG_RUNTIME_DIR="$T/xdg" "$B/apir" cdi --library "$B/libggml-apir.so" && { has out "\"hostPath\": \"$T/xdg/apir\""; has out '"cdiVersion": "0.3.0"'; hasnt out additionalGids; }
expect 0 env XDG_RUNTIME_DIR="$T/xdg" "$B/apir" cdi --gid --library "$B/libggml-apir.so" && { has out '"cdiVersion": "0.7.0"'; has out "\"additionalGids\": \[$(stat -c %g "$T/xdg/apir")\]"; }
expect 0 "$B/apir" cdi --help && has out "mkdir -p /etc/cdi"

echo "== messages: a stream socket, and a server that answers garbage, at a unix: path"
# systemd-socket-activate listens for us: a stream socket; then a seqpacket
# one whose connections get 10 zero bytes for a hello (kept open a while:
# closing with our hello unread would reset the connection before we read).
systemd-socket-activate -l "$T/stream.sock" true >/dev/null 2>&1 &
sa1=$!
systemd-socket-activate --seqpacket --accept --inetd -l "$T/garbage.sock" sh -c 'head -c 10 /dev/zero; sleep 2' >/dev/null 2>&1 &
sa2=$!
for _ in $(seq 1 300); do [ -S "$T/stream.sock" ] && [ -S "$T/garbage.sock" ] && break; sleep 0.01; done
expect 1 "$B/apir" ping "unix:$T/stream.sock" && { has err "not an apir-host socket"; hasnt err "Protocol wrong type"; }
expect 1 "$B/apir" ping "unix:$T/garbage.sock" && { has err "answered with something else than an apir hello"; hasnt err "no hello"; }
kill $sa1 $sa2 2>/dev/null; wait $sa1 $sa2 2>/dev/null
expect 125 "$B/apir" run -b NOPE -- true && has err "did not start"
expect 125 "$B/apir" run --backend-dir /nonexistent -- true && has err "/nonexistent"
expect 125 "$B/apir" run --host-arg=--bogus -- true
n=$((n + 1))
if [ -n "$(ls -A "$T/tmp")" ]; then echo "FAIL: apir run left: $(ls -A "$T/tmp")"; fails=$((fails + 1)); fi

echo "cli: $n commands checked, $fails failure(s)"
[ "$fails" = 0 ]
