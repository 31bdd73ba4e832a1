#!/usr/bin/env bash
# Several hosts in one program: APIR_HOST lists two apir-host daemons (CPU
# backend; one serving guests in threads, the other in sandboxed worker
# processes), and the program sees their devices as APIR0 and APIR1.
#  (a) apir info and the program itself see APIR0 on the first host, APIR1
#      on the second;
#  (b) a greedy decode with the layers split across APIR0 and APIR1 gives
#      the native CPU's tokens and logits, and both hosts computed graphs;
#  (c) a list with an unreachable endpoint: the reachable host's device is
#      APIR0, the unreachable one is named in a warning, the decode works;
#      none reachable: no APIR device, the program runs on its CPU;
#  (d) list items that cannot be used (empty, too long, listed twice, over
#      the 16-host bound) are named in warnings and left out;
#  (e) the same split with both hosts reached over TCP (tcp:127.0.0.1, the
#      stream transport: what several machines would use), and one over TCP
#      with the other over its Unix socket.
# usage: run_multi_host.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2
work=$(mktemp -d /tmp/apir-multi-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# start_host NAME [apir-host options...]: a host on unix:$work/NAME.sock and
# on a loopback TCP port, said in its log ("serving tcp:127.0.0.1:PORT")
start_host() {
  local name=$1; shift
  "$APIR_BUILD/apir-host" --listen "unix:$work/$name.sock" --listen tcp:127.0.0.1:0 --backend CPU --threads 2 \
    --log-level info "$@" >"$work/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 500); do
    [ -S "$work/$name.sock" ] && grep -q 'serving tcp:' "$work/$name.log" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  echo "apir-host $name did not start:"; cat "$work/$name.log"
  exit 1
}
start_host a --isolation thread --insecure-shared-process
start_host b --isolation process
A="unix:$work/a.sock" B="unix:$work/b.sock" NONE="unix:$work/nobody-here.sock"
TA=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$work/a.log" | head -1 | cut -d' ' -f2)
TB=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$work/b.log" | head -1 | cut -d' ' -f2)
greedy="$APIR_BUILD/tests/apir-llama-greedy"
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || exit 1

# guest_devices FILE_PREFIX APIR_HOST: the program's device list (stdout, stderr)
guest_devices() {
  GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$2" timeout 60 "$greedy" --list-devices \
    >"$work/$1.out" 2>"$work/$1.err"
}

echo "== (a) two hosts: APIR0 on the first, APIR1 on the second"
"$APIR_BUILD/apir" info "$A,$B" >"$work/info.out" 2>"$work/info.err" || fail "apir info A,B failed: $(cat "$work/info.err")"
cat "$work/info.out" | grep -E '^(host|device)'
# the first host's device 0 is APIR0, the second host's device 0 is APIR1
awk -v a="host $A:" -v b="host $B:" '
  index($0, a) == 1 { h = "a" } index($0, b) == 1 { h = "b" }
  /^device 0: .*, APIR0$/ { if (h == "a") ok0 = 1 }
  /^device 0: .*, APIR1$/ { if (h == "b") ok1 = 1 }
  END { exit !(ok0 && ok1) }' "$work/info.out" || fail "apir info does not give APIR0 on $A and APIR1 on $B"
"$APIR_BUILD/apir" ping -n 10 "$A,$B" >"$work/ping.out" 2>&1 || fail "apir ping A,B failed: $(cat "$work/ping.out")"
[ "$(grep -c '^connected to unix:' "$work/ping.out")" = 2 ] || fail "apir ping did not reach both hosts: $(cat "$work/ping.out")"
guest_devices ab "$A,$B" || fail "the program could not list its devices: $(cat "$work/ab.err")"
grep APIR "$work/ab.out"
grep -Eq "^ *APIR0 .* via $A\$" "$work/ab.out" || fail "APIR0 is not the first host's device"
grep -Eq "^ *APIR1 .* via $B \\(host device 0\\)\$" "$work/ab.out" || fail "APIR1 is not the second host's device 0"
[ "$(grep -c '^ *APIR[0-9]' "$work/ab.out")" = 2 ] || fail "not exactly 2 APIR devices"
if grep -q 'apir guest: warn' "$work/ab.err"; then fail "warnings with two good hosts: $(cat "$work/ab.err")"; fi

echo "== (b) the layers split across the two hosts: the native CPU's tokens"
"$greedy" -m "$work/model.gguf" -d CPU -n 24 -t 2 --dump-logits "$work/cpu.bin" >"$work/cpu.out" 2>"$work/cpu.err" \
  || { cat "$work/cpu.err"; exit 1; }
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$A,$B" timeout 120 \
  "$greedy" -m "$work/model.gguf" -d APIR0,APIR1 -n 24 -t 2 --dump-logits "$work/split.bin" -v \
  >"$work/split.out" 2>"$work/split.err" || { tail -20 "$work/split.err"; fail "the split decode failed"; }
echo "CPU:         $(grep tokens: "$work/cpu.out")"
echo "APIR0,APIR1: $(grep tokens: "$work/split.out")"
"$greedy" --compare "$work/cpu.bin" "$work/split.bin" --tol 1e-3 || fail "the split decode differs from the CPU's"
# llama.cpp's own account of the split: layers on each device
grep -E 'offloaded|layer .* assigned to device|APIR[01] model buffer size' "$work/split.err" | head -6
for h in a b; do
  for _ in $(seq 1 300); do grep -q 'disconnected after' "$work/$h.log" && break; sleep 0.01; done
  graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$work/$h.log" | grep -o '([0-9]*' | tr -d '(' |
    sort -n | tail -1)
  echo "host $h computed ${graphs:-0} graphs"
  [ "${graphs:-0}" -ge 24 ] || fail "host $h computed too few graphs: the model was not split across both"
done

echo "== (b2) a prompt of 7 micro-batches pipelined across the two hosts: the native CPU's tokens"
# Every APIR device offers async compute and events (guest-side events,
# frontend_device.c), so llama.cpp keeps several copies of each split's
# inputs and runs the micro-batches as a pipeline over APIR0 and APIR1.
ids=$(seq -s, 1 200)
"$greedy" -m "$work/model.gguf" -d CPU -n 8 -t 2 -u 32 --prompt-ids "$ids" --dump-logits "$work/cpu-pp.bin" \
  >/dev/null 2>"$work/cpu-pp.err" || { cat "$work/cpu-pp.err"; exit 1; }
for ev in 1 0; do
  GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$A,$B" APIR_EVENTS=$ev timeout 120 \
    "$greedy" -m "$work/model.gguf" -d APIR0,APIR1 -n 8 -t 2 -u 32 --prompt-ids "$ids" --dump-logits "$work/pp$ev.bin" -v \
    >"$work/pp$ev.out" 2>"$work/pp$ev.err" || { tail -20 "$work/pp$ev.err"; fail "the pipelined decode failed (APIR_EVENTS=$ev)"; }
  "$greedy" --compare "$work/cpu-pp.bin" "$work/pp$ev.bin" --tol 1e-3 ||
    fail "the pipelined decode differs from the CPU's (APIR_EVENTS=$ev)"
done
grep -q 'pipeline parallelism enabled' "$work/pp1.err" && echo "APIR_EVENTS=1: llama.cpp pipelines" ||
  fail "llama.cpp did not enable its pipeline over APIR0,APIR1"
grep -q 'pipeline parallelism enabled' "$work/pp0.err" && fail "APIR_EVENTS=0 still offered events" ||
  echo "APIR_EVENTS=0: no pipeline"

echo "== (c) an unreachable host in the list: named, and the others go on"
guest_devices na "$NONE,$A" || fail "the program could not list its devices: $(cat "$work/na.err")"
grep APIR "$work/na.out"
grep -Eq "^ *APIR0 .* via $A\$" "$work/na.out" || fail "the reachable host's device is not APIR0"
[ "$(grep -c '^ *APIR[0-9]' "$work/na.out")" = 1 ] || fail "not exactly 1 APIR device"
grep "apir guest: warn" "$work/na.err"
grep -q "APIR_HOST: host 1 of 2 ($NONE) left out: .*nobody-here.sock" "$work/na.err" ||
  fail "no warning naming the unreachable host"
"$greedy" -m "$work/model.gguf" -d CPU -n 8 -t 2 --dump-logits "$work/cpu8.bin" >/dev/null 2>&1 || exit 1
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$A,$NONE" timeout 60 \
  "$greedy" -m "$work/model.gguf" -d APIR0 -n 8 -t 2 --dump-logits "$work/one.bin" >"$work/one.out" 2>"$work/one.err" ||
  { tail -5 "$work/one.err"; fail "the decode on the reachable host failed"; }
"$greedy" --compare "$work/cpu8.bin" "$work/one.bin" --tol 1e-3 >/dev/null || fail "the decode on the reachable host differs"
grep -q "APIR_HOST: host 2 of 2 ($NONE) left out" "$work/one.err" || fail "no warning naming the unreachable last host"
expect_rc() { local want=$1; shift; "$@"; local rc=$?; [ "$rc" = "$want" ] || fail "$* exited $rc, not $want"; }
expect_rc 1 "$APIR_BUILD/apir" info "$NONE,$B" >"$work/info2.out" 2>"$work/info2.err"
grep -q '^device 0: .*, APIR0$' "$work/info2.out" || fail "apir info: the reachable host's device is not APIR0"
grep -q 'nobody-here.sock' "$work/info2.err" || fail "apir info does not name the unreachable host"
# none reachable: no APIR device, the program runs on the CPU and says why
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$NONE,unix:$work/nobody-either.sock" timeout 60 \
  "$greedy" -m "$work/model.gguf" -d CPU -n 4 -t 2 >"$work/none.out" 2>"$work/none.err" || fail "the program failed with no host"
grep -q "tokens:" "$work/none.out" || fail "no tokens without a host"
grep -q "no APIR device: none of the 2 hosts in APIR_HOST" "$work/none.err" || fail "no warning that no host was reached"

echo "== (d) list items that cannot be used are named and left out"
long="unix:/$(printf 'x%.0s' $(seq 1 130))"
many="$A,,$long,$A"
for i in $(seq 1 16); do many="$many,unix:$work/n$i.sock"; done
guest_devices bad "$many" || fail "the program could not list its devices: $(cat "$work/bad.err")"
[ "$(grep -c '^ *APIR[0-9]' "$work/bad.out")" = 1 ] && grep -Eq "^ *APIR0 .* via $A\$" "$work/bad.out" ||
  fail "the good endpoint's device is not the only one"
grep -q "APIR_HOST: item 2 is empty: left out" "$work/bad.err" || fail "no warning for the empty item"
grep -q "APIR_HOST: endpoint 3 (unix:/xxx.*) is longer than 127 characters: left out" "$work/bad.err" ||
  fail "no warning for the long endpoint"
grep -q "APIR_HOST: $A is listed twice" "$work/bad.err" || fail "no warning for the endpoint listed twice"
grep -q "APIR_HOST: more than 16 endpoints: the last 1 left out" "$work/bad.err" || fail "no warning for the 17th host"
grep -q "host 16 of 16 (unix:$work/n15.sock) left out" "$work/bad.err" || fail "the 16th host was not tried"
if grep -q "n16.sock" "$work/bad.err"; then fail "the 17th host was tried"; fi
grep -c "apir guest: warn" "$work/bad.err" | sed 's/^/warnings: /'
expect_rc 2 "$APIR_BUILD/apir" stat "$A,$B" 2>"$work/stat.err"
grep -q "is a list: give one endpoint" "$work/stat.err" || fail "apir stat does not refuse a list clearly"

echo "== (e) the split with the hosts reached over TCP ($TA, $TB), and mixed"
for pair in "$TA,$TB" "$TA,$B"; do
  GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST="$pair" timeout 120 \
    "$greedy" -m "$work/model.gguf" -d APIR0,APIR1 -n 24 -t 2 --dump-logits "$work/tcp.bin" \
    >"$work/tcp.out" 2>"$work/tcp.err" || { tail -20 "$work/tcp.err"; fail "the split decode over $pair failed"; }
  echo "APIR0,APIR1 over $pair: $(grep tokens: "$work/tcp.out")"
  "$greedy" --compare "$work/cpu.bin" "$work/tcp.bin" --tol 1e-3 >/dev/null || fail "the split decode over $pair differs"
done
grep -q "guest#[0-9]* (127\.0\.0\.1:[0-9]*): worker process\|guest#[0-9]* connected: 127\.0\.0\.1:" "$work/a.log" "$work/b.log" ||
  fail "no guest came over TCP"

[ "$fails" = 0 ] || { echo "$fails check(s) failed"; echo "--- host a"; tail -20 "$work/a.log"; echo "--- host b"; tail -20 "$work/b.log"; exit 1; }
echo "ok: two hosts in one program"
