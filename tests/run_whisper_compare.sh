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
args=(-m "$work/model.bin" -f "$WHISPER_DIR/share/jfk.wav" -t 2 -bs 1 -bo 1 -nf -nt -l en -ojf ${WHISPER_ARGS:-})

transcribe() { # name, more args...; env applies to whisper-cli
  local name=$1; shift
  local t0=$SECONDS
  timeout 300 "$cli" "${args[@]}" -of "$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err" ||
    { echo "FAIL: whisper-cli ($name) exited $?"; tail -20 "$work/$name.err"; return 1; }
  echo "$name: $((SECONDS - t0)) s, $(grep -c '"id":' "$work/$name.json") tokens," \
    "text: $(grep -m1 '"text": "' "$work/$name.json" | sed 's/^[[:space:]]*//' | cut -c1-60)"
}

transcribe cpu -ng || exit 1
APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" transcribe apir -dev 0 || { tail -5 "$APIR_TEST_DIR/host.log"; exit 1; }

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

# Everything but "systeminfo" (it lists the loaded backends' features).
for name in cpu apir; do grep -v '"systeminfo":' "$work/$name.json" >"$work/$name.cmp"; done
if ! cmp -s "$work/cpu.cmp" "$work/apir.cmp"; then
  echo "FAIL: the JSON outputs differ (native CPU vs APIR0):"
  diff "$work/cpu.cmp" "$work/apir.cmp" | head -20
  exit 1
fi
echo "ok: native CPU and APIR0 transcriptions identical ($tokens tokens: ids, probabilities, timestamps)"
