#!/usr/bin/env bash
# A llama model decoded greedily through APIR0 and on the CPU backend gives
# the same tokens and logits (within tolerance).
# usage: run_llama_compare.sh APIR_BUILD DEPS_BIN [MODEL_ARGS...]
# APIR_EXPECT_COMMAND=NAME: the APIR0 run must also have used that command
# (from the guest's APIR_PROFILE lines), e.g. to show a data path was taken.
# APIR_EXPECT_PROFILE=TEXT: the APIR0 run's profile has a line that begins
# with TEXT (e.g. "lanes: 3,": its payloads went over 3 lanes).
# APIR_EXPECT_TRACE=1: the APIR0 run also writes its timeline (APIR_TRACE):
# a span for every command its profile counts, in start order, each graph
# command inside the scheduler's graph_compute call that sent it.
# APIR_MAX_TRIPS_PER_TOKEN=N: a token costs at most N round trips (every
# command the guest sent, from the profiles of a 24-token and a 12-token run:
# the difference over the 12 tokens between them).
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2; shift 2
. "$(dirname "$0")/lib.sh"
trap 'apir_host_stop; rm -rf "$work"' EXIT
work=$(mktemp -d)
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny "$@" >/dev/null || exit 1
# APIR_HOST_ARGS: more apir-host options (e.g. --isolation thread --insecure-shared-process)
APIR_HOST_LOG=info apir_host_start --threads 2 ${APIR_HOST_ARGS:-} || exit 1
greedy="$APIR_BUILD/tests/apir-llama-greedy"
"$greedy" -m "$work/model.gguf" -d CPU -n 24 -t 2 --dump-logits "$work/cpu.bin" >"$work/cpu.out" 2>"$work/cpu.err" \
  || { cat "$work/cpu.err"; exit 1; }
# The guest's profile when a check below reads it (APIR_PROFILE is 1 or off).
profile=0
[ -n "${APIR_EXPECT_COMMAND:-}${APIR_MAX_TRIPS_PER_TOKEN:-}${APIR_EXPECT_PROFILE:-}${APIR_EXPECT_TRACE:-}" ] && profile=1
trace=
[ "${APIR_EXPECT_TRACE:-}" = 1 ] && trace=$work/trace.txt
APIR_TRACE=$trace APIR_PROFILE=$profile GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
  "$greedy" -m "$work/model.gguf" -d APIR0 -n 24 -t 2 --dump-logits "$work/apir.bin" >"$work/apir.out" 2>"$work/apir.err" \
  || { cat "$work/apir.err"; exit 1; }
echo "CPU:   $(grep tokens: "$work/cpu.out")"
echo "APIR0: $(grep tokens: "$work/apir.out")"
"$greedy" --compare "$work/cpu.bin" "$work/apir.bin" --tol 1e-3 || exit 1
# The comparison means something only if the model really ran remotely.
for _ in $(seq 1 200); do grep -q 'disconnected after' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$APIR_TEST_DIR/host.log" | grep -o '([0-9]*' | tr -d '(' | sort -n | tail -1)
echo "host computed ${graphs:-0} graphs for the APIR0 run"
[ "${graphs:-0}" -ge 24 ] || { echo "FAIL: the host computed too few graphs"; cat "$APIR_TEST_DIR/host.log"; exit 1; }
# APIR_TEST_STREAM=tcp|tls (lib.sh): the guest must really have come over TCP.
if [ -n "${APIR_TEST_STREAM:-}" ]; then
  grep -q 'guest#[0-9]* (127\.0\.0\.1:[0-9]*): worker process\|guest#[0-9]* connected: 127\.0\.0\.1:' "$APIR_TEST_DIR/host.log" \
    || { echo "FAIL: no guest came over TCP"; cat "$APIR_TEST_DIR/host.log"; exit 1; }
  if [ "$APIR_TEST_STREAM" = tls ]; then
    grep -q 'TLS 1.3, key "apir-test"' "$APIR_TEST_DIR/host.log" || { echo "FAIL: no TLS session"; cat "$APIR_TEST_DIR/host.log"; exit 1; }
    # APIR_HOST_TLS_SEND_THREAD=1: the worker's records went through a sender thread.
    if [ "${APIR_HOST_TLS_SEND_THREAD:-}" = 1 ]; then
      grep -q 'records sent by a thread of their own' "$APIR_TEST_DIR/host.log" \
        || { echo "FAIL: no sender thread for the TLS records"; cat "$APIR_TEST_DIR/host.log"; exit 1; }
    fi
  fi
  echo "the APIR0 run came over $APIR_HOST"
fi
# APIR_EXPECT_FILE_BLOB=1|0: the weights must (1) or must not (0) have reached
# the host as the model file itself, mapped on both sides (no copy).
if [ -n "${APIR_EXPECT_FILE_BLOB:-}" ]; then
  shared=$(grep -c 'shared without a copy' "$APIR_TEST_DIR/host.log")
  echo "file ranges shared with the host: $shared"
  if [ "$APIR_EXPECT_FILE_BLOB" = 1 ] && [ "$shared" -lt 1 ]; then
    echo "FAIL: the model file was not shared"; grep -i 'blob' "$APIR_TEST_DIR/host.log"; exit 1
  fi
  if [ "$APIR_EXPECT_FILE_BLOB" = 0 ]; then
    [ "$shared" -eq 0 ] || { echo "FAIL: a file was shared"; exit 1; }
    grep -q 'file blob .* refused' "$APIR_TEST_DIR/host.log" || { echo "FAIL: no file blob was refused"; exit 1; }
  fi
fi
# APIR_EXPECT_WEIGHT_COPIES=1: the host must have computed with weight copies
# in its CPU's own layout (host/data/weight_copies.h).
if [ -n "${APIR_EXPECT_WEIGHT_COPIES:-}" ]; then
  for _ in $(seq 1 200); do grep -q 'weight copies kept' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
  grep -q 'weight copies kept' "$APIR_TEST_DIR/host.log" ||
    { echo "FAIL: the host kept no weight copies"; grep -i weight "$APIR_TEST_DIR/host.log"; exit 1; }
  grep -o '[0-9]* weight copies kept.*' "$APIR_TEST_DIR/host.log" | head -1
fi
if [ -n "${APIR_EXPECT_COMMAND:-}" ]; then
  grep -q "apir profile APIR0: $APIR_EXPECT_COMMAND " "$work/apir.err" ||
    { echo "FAIL: the APIR0 run never used $APIR_EXPECT_COMMAND"; grep 'apir profile' "$work/apir.err"; exit 1; }
  echo "the APIR0 run used $APIR_EXPECT_COMMAND"
fi
if [ -n "${APIR_EXPECT_PROFILE:-}" ]; then
  grep -qF "apir profile APIR0: $APIR_EXPECT_PROFILE" "$work/apir.err" ||
    { echo "FAIL: no profile line '$APIR_EXPECT_PROFILE'"; grep 'apir profile' "$work/apir.err"; exit 1; }
  grep -F "apir profile APIR0: $APIR_EXPECT_PROFILE" "$work/apir.err" | head -1
fi
if [ -n "$trace" ]; then
  [ -s "$trace" ] || { echo "FAIL: no trace written"; exit 1; }
  profiled=$(sed -nE 's/.*apir profile APIR0: [A-Z_]+ +([0-9]+) calls.*/\1/p' "$work/apir.err" | awk '{ n += $1 } END { print n + 0 }')
  # Lines: "APIR0 start dur gap what bytes"; commands are the names without parentheses.
  awk -v profiled="$profiled" '
    NR == 1 { if ($0 !~ /^# APIR0: times in us from [0-9]+ ns/) { print "FAIL: no header: " $0; bad = 1 }; next }
    NF != 6 { print "FAIL: malformed line " NR ": " $0; bad = 1; next }
    $2 + 0 < last { print "FAIL: line " NR " starts before the line above it"; bad = 1 }
    { last = $2 + 0 }
    $5 == "(graph_compute)" { gs = $2 + 0; ge = $2 + $3; graphs++; next }
    $5 ~ /^BACKEND_GRAPH/ && gs <= $2 + 0 && $2 + $3 <= ge + 0.1 { inside++ }
    $5 !~ /^\(/ { commands++ }
    END {
      printf "trace: %d commands (the profile counted %d), %d graph_compute calls, %d graph commands inside them\n",
             commands, profiled, graphs, inside
      if (commands != profiled) { print "FAIL: the trace and the profile disagree"; bad = 1 }
      if (graphs < 24 || inside < 24) { print "FAIL: too few graphs in the trace"; bad = 1 }
      exit bad }' "$trace" || { head -20 "$trace"; exit 1; }
  bash "$(dirname "$0")/../bench/trace_gaps.sh" "$trace" 100 | tail -1
fi
if [ -n "${APIR_MAX_TRIPS_PER_TOKEN:-}" ]; then
  APIR_PROFILE=1 GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
    "$greedy" -m "$work/model.gguf" -d APIR0 -n 12 -t 2 >"$work/apir12.out" 2>"$work/apir12.err" \
    || { cat "$work/apir12.err"; exit 1; }
  # "apir profile APIR0: NAME   N calls ..." per command, summed by name.
  calls() { sed -nE 's/.*apir profile APIR0: ([A-Z_]+) +([0-9]+) calls.*/\1 \2/p' "$1"; }
  per=$(join -a1 -e0 -o 0,1.2,2.2 <(calls "$work/apir.err" | sort) <(calls "$work/apir12.err" | sort) |
        awk '$2 != $3 { printf "  %-34s %.2f\n", $1, ($2 - $3) / 12; d += $2 - $3 } END { printf "%.2f\n", d / 12 }')
  echo "round trips a token over ${APIR_TEST_STREAM:-the Unix socket} (24 tokens against 12):"
  echo "$per" | sed '$d'
  trips=$(echo "$per" | tail -1)
  echo "  all commands                       $trips"
  awk -v t="$trips" -v m="$APIR_MAX_TRIPS_PER_TOKEN" 'BEGIN { exit !(t > 0 && t <= m) }' ||
    { echo "FAIL: $trips round trips a token, more than $APIR_MAX_TRIPS_PER_TOKEN (or none counted)"; exit 1; }
fi
