#!/usr/bin/env bash
# The soak (issue 24 item 8): honest guests beside hostile ones on one CPU
# host for a long while, with workers killed at random; then what the daemon
# holds is compared with what it held before.
#
#   scripts/soak.sh [--minutes M] [--honest N] [--hostile H] [--kill-every S]
#     defaults: 60 minutes, 16 honest, 4 hostile, a worker killed every ~30 s
#   BUILD (default build), DEPS_BIN (default .deps/bin), WHISPER (default .whisper)
#
# Honest guests loop over real programs through APIR0, each run compared with
# the same program on the CPU backend, run once at the start:
#   greedy   apir-llama-greedy, 8 tokens        tokens equal
#   bench    llama-bench -p 16 -n 8             it runs and prints its rows
#   whisper  whisper-cli on jfk.wav (if built)  transcript equal
#   server   llama-server, one completion       text equal (if built)
# Hostile guests run apir-soak-hostile (tests/soak_hostile.c: hang-ups,
# garbage hellos, silent connections, random commands, memory hogs, guests
# killed mid-session).  A killer SIGKILLs a random worker process now and
# then: the guest it served may fail (its host is gone), but never with a
# wrong answer.
#
# Verdict (exit 1 on any): the daemon alive and answering at the end; every
# honest run either equal to native or failed (its program exited non-zero:
# a killed worker, a timeout) - and failures no more than
# the workers killed (each kill fails at most the runs of one guest, counted
# once); with all guests gone: no worker left, no guest, buffer or blob in
# the daemon's accounting (apir stat --json), its open descriptors back to
# what they were after warm-up, and its RSS grown by less than 16 MiB.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build} DEPS_BIN=${DEPS_BIN:-$ROOT/.deps/bin} WHISPER=${WHISPER:-$ROOT/.whisper}
MINUTES=60 HONEST=16 HOSTILE=4 KILL_EVERY=30
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) MINUTES=$2; shift;; --honest) HONEST=$2; shift;; --hostile) HOSTILE=$2; shift;;
    --kill-every) KILL_EVERY=$2; shift;;
    *) echo "unknown option $1"; exit 2;;
  esac
  shift
done
W=$(mktemp -d /tmp/apir-soak-XXXXXX)
host_pid= pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "$host_pid" ] && kill "$host_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
say() { echo "[$(date +%T)] $*"; }
MODEL="${XDG_CACHE_HOME:-$HOME/.cache}/apir/models/llama-tiny-f16.gguf"
mkdir -p "$(dirname "$MODEL")"
[ -f "$MODEL" ] || "$BUILD/apir-gguf-gen" -o "$MODEL" --size tiny --type f16 >/dev/null || exit 1
GUEST=(env GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$W/host.sock")

# ---- references: each program once on the CPU backend ----
kinds="greedy bench"
"$BUILD/tests/apir-llama-greedy" -m "$MODEL" -d CPU -n 8 -t 1 2>/dev/null | grep "tokens:" >"$W/ref-greedy" || exit 1
wmodel=
WARGS=()
if [ -x "$WHISPER/bin/whisper-cli" ] && [ -f "$WHISPER/share/jfk.wav" ]; then
  wmodel="$W/whisper-tiny.bin"
  WARGS=(-m "$wmodel" -f "$WHISPER/share/jfk.wav" -t 1 -bs 1 -bo 1 -nf -nt -l en)
  if "$BUILD/apir-whisper-gen" -i "$WHISPER/share/for-tests-ggml-tiny.bin" -o "$wmodel" --seed 1 >/dev/null 2>&1 &&
     "$WHISPER/bin/whisper-cli" "${WARGS[@]}" -ng 2>/dev/null >"$W/ref-whisper" && [ -s "$W/ref-whisper" ]; then
    kinds="$kinds whisper"
  fi
fi
server_port=0
# llama-server tokenizes its prompt: a model with a real vocabulary (the
# pinned llama.cpp's test vocabulary, as tests/run_llama_tools.sh makes it)
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$DEPS_BIN/../build/CMakeCache.txt" 2>/dev/null)
SMODEL="$W/server-model.gguf"
if [ -x "$DEPS_BIN/llama-server" ] && [ -f "$src/models/ggml-vocab-llama-spm.gguf" ] &&
   "$BUILD/apir-gguf-gen" -o "$SMODEL" --size tiny --vocab-from "$src/models/ggml-vocab-llama-spm.gguf" >/dev/null 2>&1; then
  port=$(( 30000 + RANDOM % 5000 ))
  "$DEPS_BIN/llama-server" -m "$SMODEL" --host 127.0.0.1 --port "$port" -t 1 -c 256 -np 1 >"$W/ref-server.log" 2>&1 &
  sp=$!
  for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  if curl -sf "http://127.0.0.1:$port/completion" -d '{"prompt":"The meaning of life is","n_predict":8,"temperature":0,"top_k":1,"seed":1}' \
       2>/dev/null | grep -o '"content":"[^"]*"' >"$W/ref-server"; then
    kinds="$kinds server"
    server_port=$((port + 1))
  fi
  kill "$sp"; wait "$sp" 2>/dev/null
fi
say "references made on the CPU backend: $kinds"

# ---- the host ----
"$BUILD/apir-host" --listen "unix:$W/host.sock" --threads 1 --log-level warn \
  --max-clients 64 --max-clients-per-uid 64 --spawn-burst 64 ${HOST_ARGS:-} >"$W/host.log" 2>&1 &
host_pid=$!
for _ in $(seq 1 500); do [ -S "$W/host.sock" ] && break; sleep 0.02; done
[ -S "$W/host.sock" ] || { echo "FAIL: apir-host did not start"; cat "$W/host.log"; exit 1; }
# warm-up: one of each, then what the daemon holds
"${GUEST[@]}" "$BUILD/tests/apir-llama-greedy" -m "$MODEL" -d APIR0 -n 8 -t 1 >/dev/null 2>&1
sleep 1
fds0=$(ls /proc/$host_pid/fd | wc -l)
rss0=$(awk '/^VmRSS/ { print $2 }' /proc/$host_pid/status)
say "daemon $host_pid after warm-up: $fds0 descriptors, RSS $((rss0 / 1024)) MiB"

END=$(( $(date +%s) + MINUTES * 60 ))
# A run whose program exited 0 with an answer other than native's is kept,
# with its guest's stderr and the daemon's log so far, in KEEP (which the
# clean-up leaves): such a run is a defect to find, not noise.
KEEP=${SOAK_KEEP:-/tmp/apir-soak-bad-$$}
keep_bad() {  # kind id output
  local d="$KEEP/$1-$2-$(date +%s%N)"
  mkdir -p "$d" && printf '%s\n' "$3" >"$d/out" && cp "$W/ref-$1" "$d/ref" 2>/dev/null
  tail -200 "$W/honest-$2.err" >"$d/guest.err" 2>/dev/null; tail -400 "$W/host.log" >"$d/host.log" 2>/dev/null
}
# one honest guest: runs until END, one line per run: "kind ok|bad|failed"
honest() {
  local id=$1 k run=0
  local ks=($kinds)
  while [ "$(date +%s)" -lt "$END" ]; do
    k=${ks[$(( (id + run) % ${#ks[@]} ))]}
    run=$((run + 1))
    case $k in
      greedy)
        out=$("${GUEST[@]}" timeout 120 "$BUILD/tests/apir-llama-greedy" -m "$MODEL" -d APIR0 -n 8 -t 1 2>>"$W/honest-$id.err" | grep "tokens:")
        rc=$?
        if [ $rc != 0 ] || [ -z "$out" ]; then echo "greedy failed"; elif [ "$out" = "$(cat "$W/ref-greedy")" ]; then echo "greedy ok"; else keep_bad greedy "$id" "$out"; echo "greedy bad $out"; fi ;;
      bench)
        if (cd "$DEPS_BIN" && "${GUEST[@]}" timeout 120 ./llama-bench -m "$MODEL" -p 16 -n 8 -r 1 -t 1 -ngl 99 -dev APIR0 -o csv \
              2>>"$W/honest-$id.err" | grep -c '^"' | grep -qx 2); then echo "bench ok"; else echo "bench failed"; fi ;;
      whisper)
        out=$("${GUEST[@]}" timeout 120 "$WHISPER/bin/whisper-cli" "${WARGS[@]}" -dev 0 2>>"$W/honest-$id.err")
        rc=$?
        if [ $rc != 0 ] || [ -z "$out" ]; then echo "whisper failed"; elif [ "$out" = "$(cat "$W/ref-whisper")" ]; then echo "whisper ok"; else keep_bad whisper "$id" "$out"; echo "whisper bad"; fi ;;
      server)
        local port=$((server_port + id))
        "${GUEST[@]}" "$DEPS_BIN/llama-server" -m "$SMODEL" --host 127.0.0.1 --port "$port" -t 1 -c 256 -np 1 -ngl 99 -dev APIR0 \
          >>"$W/honest-$id.err" 2>&1 &
        local sp=$!
        for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
        out=$(curl -sf -m 60 "http://127.0.0.1:$port/completion" -d '{"prompt":"The meaning of life is","n_predict":8,"temperature":0,"top_k":1,"seed":1}' 2>/dev/null |
              grep -o '"content":"[^"]*"')
        kill $sp 2>/dev/null; wait $sp 2>/dev/null
        if [ -z "$out" ]; then echo "server failed"; elif [ "$out" = "$(cat "$W/ref-server")" ]; then echo "server ok"; else echo "server bad"; fi ;;
    esac
  done
}
for i in $(seq 1 "$HONEST"); do honest "$i" >"$W/honest-$i.log" & pids+=($!); done
for i in $(seq 1 "$HOSTILE"); do
  APIR_LOG_LEVEL=error "$BUILD/tests/apir-soak-hostile" "unix:$W/host.sock" "$((MINUTES * 60))" "$i" \
    >"$W/hostile-$i.log" 2>"$W/hostile-$i.err" & pids+=($!)
done
# the killer: a random worker now and then
kills=0
while [ "$(date +%s)" -lt "$END" ]; do
  sleep $(( KILL_EVERY / 2 + RANDOM % (KILL_EVERY + 1) ))
  [ "$(date +%s)" -lt "$END" ] || break
  victims=($(pgrep -P "$host_pid"))
  [ ${#victims[@]} -gt 0 ] || continue
  kill -9 "${victims[$((RANDOM % ${#victims[@]}))]}" 2>/dev/null && kills=$((kills + 1))
  kill -0 "$host_pid" 2>/dev/null || break
done
say "guests' time is up; $kills worker(s) killed; waiting for the guests to finish"
for p in "${pids[@]}"; do wait "$p"; done
pids=()
sleep 3

fail=0
bad() { echo "FAIL: $*"; fail=1; }
kill -0 "$host_pid" 2>/dev/null || bad "the daemon died: $(tail -5 "$W/host.log")"
"$BUILD/apir" ping -n 10 "unix:$W/host.sock" >/dev/null 2>&1 || bad "the daemon does not answer a ping"
cat "$W"/honest-*.log | awk '{ n[$1 " " $2]++ } END { for (k in n) printf "  %-16s %d\n", k, n[k] }' | sort
ok=$(cat "$W"/honest-*.log | grep -c ' ok$'); failed=$(cat "$W"/honest-*.log | grep -c ' failed$')
wrong=$(cat "$W"/honest-*.log | grep -c ' bad')
say "honest runs: $ok equal to native, $failed failed, $wrong wrong"
[ "$wrong" = 0 ] || bad "$wrong honest run(s) exited 0 with an answer other than native's (kept in $KEEP)"
[ "$ok" -gt 0 ] || bad "no honest run succeeded"
# a kill fails the runs of the guest it served, which may be several back to back
# when that guest was a long one; bound them by a generous multiple
[ "$failed" -le $(( kills * 2 + 2 )) ] || bad "$failed honest runs failed with $kills kill(s): $(cat "$W"/honest-*.err | grep -m3 -iE 'apir: |error|fail')"
cat "$W"/hostile-*.log | sed 's/^/  /'
workers=$(pgrep -P "$host_pid" | wc -l)
[ "$workers" = 0 ] || bad "$workers worker(s) left with no guest"
stat=$("$BUILD/apir" stat --json "unix:$W/host.sock" 2>&1)
totals=$(echo "$stat" | tr -d ' \n' | grep -o '"totals":{[^}]*}')
for f in guests buffers blobs; do
  v=$(echo "$totals" | grep -o "\"$f\":[0-9]*" | cut -d: -f2)
  [ "${v:-x}" = 0 ] || bad "the daemon still counts $f: ${v:-?} ($totals)"
done
fds1=$(ls /proc/$host_pid/fd | wc -l)
rss1=$(awk '/^VmRSS/ { print $2 }' /proc/$host_pid/status)
say "daemon at the end: $fds1 descriptors (after warm-up $fds0), RSS $((rss1 / 1024)) MiB (after warm-up $((rss0 / 1024)))"
[ "$fds1" -le "$fds0" ] || bad "the daemon holds $((fds1 - fds0)) more descriptor(s) than after warm-up"
[ $((rss1 - rss0)) -lt 16384 ] || bad "the daemon's RSS grew by $(( (rss1 - rss0) / 1024 )) MiB"
grep -E "died of signal|assert|ABORT" "$W/host.log" | grep -v "killed by signal 9\|signal 9" | head -3 | sed 's/^/  host log: /'
[ "$fail" = 0 ] && say "soak: passed ($MINUTES min, $HONEST honest, $HOSTILE hostile, $kills kills)"
exit $fail
