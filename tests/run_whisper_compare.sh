#!/usr/bin/env bash
# whisper.cpp's whisper-cli, unmodified and built against the pinned ggml,
# transcribes samples/jfk.wav with a random-weight whisper model natively on
# the CPU backend and through APIR0 (a real apir-host on the CPU backend, with
# the guest's defaults: zero copy on).  Greedy decoding, fixed threads, no
# temperature fallback, 32 tokens: both runs must write the same full JSON output (every
# token id, probability, timestamp and the text), byte for byte (but for the
# line listing the loaded backends).
# usage: run_whisper_compare.sh APIR_BUILD WHISPER_DIR
#   WHISPER_DIR: scripts/setup.sh's whisper build (.whisper): bin/whisper-cli,
#   share/for-tests-ggml-tiny.bin, share/jfk.wav.  Missing: skipped (exit 77).
# WHISPER_ARGS: more whisper-cli options for both runs (e.g. -d 3000).
# APIR_GUEST_LIB: the guest library (default APIR_BUILD's), e.g. the one
#   scripts/guest-for.sh built for the ggml of a whisper.cpp of another tree
#   (then only the zero-copy run, and no count of round trips).
# With APIR_BUILD's own guest library it also runs through APIR0 without zero
# copy (APIR_ZERO_COPY=0: uploads and downloads cross the connection, as with
# a GPU host), with the same output required, and counts the host round trips
# a decode step costs in both (APIR_PROFILE=1, against runs of a shorter text
# context): without zero copy at most MAX_TRIPS (2: the graph with its small
# uploads, and the download of its result; issue 26), with it at most
# MAX_TRIPS_ZERO_COPY (1: the CPU host's graph is done at its reply and the
# result is read in shared memory).  The decode steps' graphs go
# as deltas (apir 0.9: BACKEND_GRAPH_COMPUTE_DELTA, one a step, none answered
# stale), and a run with every graph whole (APIR_GRAPH_DELTA=0) gives the same
# output; so does a host that keeps no graph (every delta STALE).
set -uo pipefail
APIR_BUILD=$1 WHISPER_DIR=$2
. "$(dirname "$0")/lib.sh"
cli="$WHISPER_DIR/bin/whisper-cli"
if [ ! -x "$cli" ] || [ ! -f "$WHISPER_DIR/share/jfk.wav" ]; then
  echo "SKIP: no whisper.cpp build in $WHISPER_DIR (scripts/setup.sh builds it from ../shared/third_party)"
  exit 77
fi
work=$(mktemp -d)
trap 'apir_host_stop; rm -rf "$work"' EXIT
"$APIR_BUILD/apir-whisper-gen" -i "$WHISPER_DIR/share/for-tests-ggml-tiny.bin" -o "$work/model.bin" --seed 1 \
  --text-ctx 72 || exit 1
# -nt: no timestamp tokens (a random model emits one almost at once, ending the
# segment); the model's text context of 72 bounds the segment to 32 tokens.
model=$work/model.bin
args=(-f "$WHISPER_DIR/share/jfk.wav" -t 2 -bs 1 -bo 1 -nf -nt -l en -ojf ${WHISPER_ARGS:-})

transcribe() { # name, more args...; env applies to whisper-cli
  local name=$1; shift
  local t0=$SECONDS
  timeout 300 "$cli" -m "$model" "${args[@]}" -of "$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err" ||
    { echo "FAIL: whisper-cli ($name) exited $?"; tail -20 "$work/$name.err"; return 1; }
  echo "$name: $((SECONDS - t0)) s, $(grep -c '"id":' "$work/$name.json") tokens," \
    "text: $(grep -m1 '"text": "' "$work/$name.json" | sed 's/^[[:space:]]*//' | cut -c1-60)"
}

transcribe cpu -ng || exit 1
APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
extras=$([ -z "${APIR_GUEST_LIB:-}" ] && echo 1)
export GGML_BACKEND_PATH="${APIR_GUEST_LIB:-$APIR_BUILD/libggml-apir.so}" APIR_PROFILE=1
transcribe apir -dev 0 || { tail -5 "$APIR_TEST_DIR/host.log"; exit 1; }
if [ -n "$extras" ]; then
  APIR_ZERO_COPY=0 transcribe apir_copy -dev 0 || { tail -5 "$APIR_TEST_DIR/host.log"; exit 1; }
  APIR_GRAPH_DELTA=0 transcribe apir_whole -dev 0 || { tail -5 "$APIR_TEST_DIR/host.log"; exit 1; }
  "$APIR_BUILD/apir-whisper-gen" -i "$WHISPER_DIR/share/for-tests-ggml-tiny.bin" -o "$work/model40.bin" --seed 1 \
    --text-ctx 40 >/dev/null || exit 1
  model=$work/model40.bin
  transcribe apir40 -dev 0 >/dev/null || exit 1
  APIR_ZERO_COPY=0 transcribe apir_copy40 -dev 0 >/dev/null || exit 1
fi
unset GGML_BACKEND_PATH APIR_PROFILE

# The comparison means something only if whisper really ran on APIR0 ...
grep -q 'using APIR0 backend' "$work/apir.err" ||
  { echo "FAIL: whisper did not use APIR0"; grep -i 'backend\|APIR' "$work/apir.err" | head; exit 1; }
for _ in $(seq 1 200); do grep -q 'disconnected after' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$APIR_TEST_DIR/host.log" | grep -o '([0-9]*' |
  tr -d '(' | sort -n | tail -1)
echo "host computed ${graphs:-0} graphs for the APIR0 run"
# ... and decoded enough tokens to compare (an encoder graph + one per token).
tokens=$(grep -c '"id":' "$work/cpu.json")
[ "$tokens" -ge 8 ] || { echo "FAIL: only $tokens tokens decoded natively: nothing to compare"; exit 1; }
[ "${graphs:-0}" -ge 8 ] || { echo "FAIL: the host computed too few graphs"; tail "$APIR_TEST_DIR/host.log"; exit 1; }
# What the host said of the guest's ggml, when another commit than its own.
grep -m1 -o 'guest ggml .*' "$APIR_TEST_DIR/host.log"

# Everything but "systeminfo" (it lists the loaded backends' features).
runs=(apir ${extras:+apir_copy apir_whole})
for name in cpu "${runs[@]}"; do grep -v '"systeminfo":' "$work/$name.json" >"$work/$name.cmp"; done
for name in "${runs[@]}"; do
  if ! cmp -s "$work/cpu.cmp" "$work/$name.cmp"; then
    echo "FAIL: the JSON outputs differ (native CPU vs APIR0, $name):"
    diff "$work/cpu.cmp" "$work/$name.cmp" | head -20
    exit 1
  fi
done
echo "ok: native CPU and APIR0 transcriptions identical ($tokens tokens: ids, probabilities, timestamps): ${runs[*]}"
[ -n "$extras" ] || exit 0

# Round trips a decode step: every command the guest sent (its profile), the
# difference between the two text contexts over the difference in steps.
calls() { sed -n 's/.*apir profile [A-Z0-9]*: \([A-Z_0-9]*\) *\([0-9]*\) calls.*/\1 \2/p' "$1" | sort; }
steps() { grep -o 'decode time = [^/]*/ *[0-9]*' "$1" | grep -o '[0-9]*$'; }
for mode in apir apir_copy; do
  dn=$(( $(steps "$work/$mode.err") - $(steps "$work/${mode}40.err") ))
  [ "$dn" -gt 0 ] || { echo "FAIL: $mode: no more decode steps with the longer context"; exit 1; }
  calls "$work/$mode.err" >"$work/$mode.calls"
  calls "$work/${mode}40.err" >"$work/${mode}40.calls"
  # one line per command whose count differs, then the total a step
  join -a1 -a2 -e0 -o 0,1.2,2.2 "$work/$mode.calls" "$work/${mode}40.calls" |
    awk -v d="$dn" '$2 != $3 { printf "  %-32s %6.2f a step\n", $1, ($2 - $3) / d } { t += $2 - $3 }
                   END { printf "%.2f\n", t / d }' >"$work/$mode.trips"
  per=$(tail -1 "$work/$mode.trips")
  echo "$mode: $per round trips a decode step ($dn more steps with the longer context):"
  sed '$d' "$work/$mode.trips"
  # zero copy on a CPU host: the logits are read in shared memory, and the
  # graph is done at its reply (no SYNCHRONIZE after it): one round trip
  max=${MAX_TRIPS:-2}
  [ $mode = apir ] && max=${MAX_TRIPS_ZERO_COPY:-1}
  awk -v p="$per" -v m="$max" 'BEGIN { exit !(p <= m) }' ||
    { echo "FAIL: $mode: $per round trips a decode step, more than $max"; exit 1; }
done
echo "ok: at most ${MAX_TRIPS_ZERO_COPY:-1} round trip a decode step with zero copy, ${MAX_TRIPS:-2} without"
for mode in apir apir_copy; do
  per=$(awk '$1 == "BACKEND_GRAPH_COMPUTE_DELTA" { print $2 }' "$work/$mode.trips")
  stale=$(sed -n 's/.*graph deltas *[0-9]* sent, \([0-9]*\) answered stale.*/\1/p' "$work/$mode.err")
  awk -v p="${per:-0}" 'BEGIN { exit !(p >= 0.99 && p <= 1.01) }' && [ "${stale:-x}" = 0 ] ||
    { echo "FAIL: $mode: ${per:-no} BACKEND_GRAPH_COMPUTE_DELTA a decode step, ${stale:-?} answered stale"; exit 1; }
done
grep -q 'BACKEND_GRAPH_COMPUTE_DELTA' "$work/apir_whole.err" &&
  { echo "FAIL: APIR_GRAPH_DELTA=0 still sent deltas"; exit 1; }
echo "ok: each decode step's graph went as a delta (none stale); with APIR_GRAPH_DELTA=0 whole, the same output"

# A host that keeps no graph (its import memo off) answers every delta STALE:
# the guest sends those graphs whole, stops trying after 4 in a row, and the
# transcription is the same.
apir_host_stop
APIR_HOST_IMPORT_MEMO=0 apir_host_start --threads 2 || exit 1
model=$work/model.bin
GGML_BACKEND_PATH=$APIR_BUILD/libggml-apir.so APIR_PROFILE=1 transcribe apir_stale -dev 0 ||
  { tail -5 "$APIR_TEST_DIR/host.log"; exit 1; }
grep -v '"systeminfo":' "$work/apir_stale.json" >"$work/apir_stale.cmp"
cmp -s "$work/cpu.cmp" "$work/apir_stale.cmp" ||
  { echo "FAIL: the JSON outputs differ (native CPU vs APIR0 with every delta stale)"; exit 1; }
stale=$(sed -n 's/.*graph deltas *[0-9]* sent, \([0-9]*\) answered stale.*/\1/p' "$work/apir_stale.err")
[ "${stale:-0}" = 4 ] || { echo "FAIL: ${stale:-no} deltas answered stale by a host without its memo (want 4)"; exit 1; }
echo "ok: a host without its import memo: 4 deltas answered stale, then whole graphs, the same output"
