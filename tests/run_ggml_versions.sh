#!/usr/bin/env bash
# A program of another ggml than apir's pinned one, with the guest library
# scripts/guest-for.sh built for it, against one apir-host of the pinned ggml.
#
# usage: run_ggml_versions.sh APIR_BUILD SPEC CHECK [EXPECT] [OPS [DECLINED]]
#   SPEC    what scripts/guest-for.sh was given (node-llama-cpp@3.14.0, ...); its
#           tree must be in the cache (else skipped, exit 77: `scripts/guest-for.sh
#           SPEC` builds it, ~10-18 min on 2 cores)
#   CHECK   ops      that tree's test-backend-ops -o OPS through APIR0
#           greedy   a greedy decode (tests/llama_greedy.c built against that tree)
#           whisper  whisper.cpp built against that tree's ggml (scripts/guest-for.sh
#                    --whisper SPEC, else skipped): tests/run_whisper_compare.sh with
#                    this tree's guest library, natively on the tree's CPU backend and
#                    through APIR0
#           mismatch the pinned libggml-apir.so in that tree's program, and that
#                    tree's library in the pinned program: both refuse, no crash
#   EXPECT  (ops, greedy) equal: as the tree's own CPU backend (pass counts,
#           tokens and logits); refused: the host refuses the guest's ggml, the
#           program goes on without APIR0 and both sides say why
#   DECLINED (ops, equal) a regex of the test cases the host may decline (report
#           not supported) though the tree's CPU takes them
set -uo pipefail
APIR_BUILD=$1 SPEC=$2 CHECK=$3 EXPECT=${4:-equal} OPS=${5:-} DECLINED=${6:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
APIR_DEPS_BIN=$ROOT/.deps/bin
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tbo_lib.sh"
work=$(mktemp -d)
trap 'apir_host_stop; rm -rf "$work"' EXIT

# The tree's build from the cache; the guest library rebuilt from these sources.
also=()
[ "$CHECK" = whisper ] && also=(--whisper)
JOBS=${JOBS:-2} "$ROOT/scripts/guest-for.sh" --cached "${also[@]}" "$SPEC" >"$work/guest-for.out" 2>"$work/guest-for.err"
rc=$?
if [ $rc = 3 ]; then
  echo "SKIP: $(tail -1 "$work/guest-for.err")"
  exit 77
fi
[ $rc = 0 ] || { cat "$work/guest-for.err"; echo "FAIL: scripts/guest-for.sh --cached $SPEC: exit $rc"; exit 1; }
eval "$(grep -E '^(GUEST_DIR|GUEST_LIB|WHISPER_DIR)=' "$work/guest-for.out")"
tree_ggml=$(grep -m1 -o 'ggml version: .*' "$GUEST_DIR/configure.log" | cut -d' ' -f3)
echo "$SPEC: $(cut -c1-7 "$GUEST_DIR/stamp") (ggml $tree_ggml), guest library $GUEST_LIB"

# The host's log must say why it refused (both sides log a refusal).
host_refused() {
  for _ in $(seq 1 200); do grep -q 'refused: its .* is ' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
  grep -m1 'refused: its .* is ' "$APIR_TEST_DIR/host.log" ||
    { echo "FAIL: the host's log gives no reason"; cat "$APIR_TEST_DIR/host.log"; return 1; }
}
# A guest of another commit computed: the host's log says the tables agreed.
host_computes_other() {
  grep -m1 'named as ours, computed' "$APIR_TEST_DIR/host.log" ||
    { echo "FAIL: the host's log does not say it compared the guest's tables"; cat "$APIR_TEST_DIR/host.log"; return 1; }
}
guest_refused() { # LOG
  grep -m1 'refuses this program.s ggml' "$1" ||
    { echo "FAIL: the guest does not say the host refused its ggml:"; tail -20 "$1"; return 1; }
}
# The item-2 refusal: a guest library in a program of another ggml registers no
# device, says so and names the remedy, and the program goes on (fail=1 if not).
fail=0
check_refusal() { # WHAT LIB PROGRAM...
  local what=$1 lib=$2; shift 2
  GGML_BACKEND_PATH=$lib "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ $rc -ge 128 ]; then echo "FAIL: $what: killed by signal $((rc - 128))"; fail=1; return; fi
  local said; said=$(grep -m1 'libggml-apir.so was built for ggml' "$work/err")
  [ -n "$said" ] || { echo "FAIL: $what: no refusal said"; tail -5 "$work/err"; fail=1; return; }
  grep -q 'guest-for.sh' "$work/err" || { echo "FAIL: $what: the remedy is not named"; fail=1; }
  grep -q 'APIR0' "$work/out" && { echo "FAIL: $what: APIR0 listed"; fail=1; }
  echo "$what: exit $rc, $said"
}

case $CHECK in
ops)
  APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
  cd "$GUEST_DIR/bin" || exit 1
  GGML_BACKEND_PATH=$GUEST_LIB ./test-backend-ops test -o "$OPS" -b APIR0 >"$work/apir.log" 2>&1
  rc_apir=$?
  if [ "$EXPECT" = refused ]; then
    guest_refused "$work/apir.log" && host_refused || exit 1
    # No device, no crash: test-backend-ops ran its other backends' list and exited.
    grep -q 'Backend [0-9]*/[0-9]*: APIR0' "$work/apir.log" && { echo "FAIL: APIR0 was offered"; exit 1; }
    grep -qE '^[0-9]+/[0-9]+ backends passed' "$work/apir.log" ||
      { echo "FAIL: test-backend-ops did not finish (exit $rc_apir)"; tail -20 "$work/apir.log"; exit 1; }
    echo "refused cleanly: test-backend-ops went on without APIR0 (exit $rc_apir)"
    exit 0
  fi
  # Which cases each side takes, without computing (support mode): the tree's
  # own CPU backend passes every case it takes, so its count is what APIR0
  # must pass, less the cases the host declines (DECLINED: a regex of test
  # names).  A ggml of another commit may give an op parameters the host's
  # ggml does not build (3.22.1: MUL_MAT_ID with ggml_prec_set_src); the
  # host's node check then answers "not supported" and the scheduler keeps the
  # node on the program's CPU: declined, never computed another way.
  GGML_BACKEND_PATH=$GUEST_LIB ./test-backend-ops support -o "$OPS" -b APIR0 >"$work/apir.sup" 2>&1
  ./test-backend-ops support -o "$OPS" -b CPU >"$work/cpu.sup" 2>&1
  cases() { sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -E "^  [A-Z_0-9]+\(.*: $2\$" | sed 's/: [A-Z ]*$//' | sort; }
  cases "$work/cpu.sup" SUPPORTED >"$work/cpu.yes"
  cases "$work/apir.sup" 'NOT SUPPORTED' >"$work/apir.no"
  comm -12 "$work/cpu.yes" "$work/apir.no" >"$work/declined"
  cp=$(wc -l <"$work/cpu.yes")
  nd=$(wc -l <"$work/declined")
  read -r ap at ans <<<"$(tbo_count "$work/apir.log")"
  echo "test-backend-ops of $SPEC -o $OPS"
  echo "  APIR0 (pinned host, CPU): $ap/$at passed, $ans not supported (exit $rc_apir)"
  echo "  CPU ($SPEC's own): takes $cp cases; APIR0 declines $nd of them"
  fail=0
  [ "$cp" -gt 0 ] || { echo "FAIL: no case for the CPU backend"; fail=1; }
  if [ "$nd" -gt 0 ]; then
    sed 's/^ */  declined: /' "$work/declined" | head -8
    if [ -z "$DECLINED" ] || grep -vE "$DECLINED" "$work/declined" >"$work/unexpected"; then
      echo "FAIL: declined cases not expected (${DECLINED:-none expected}):"; head -20 "${work}/unexpected" 2>/dev/null \
        || head -20 "$work/declined"; fail=1
    fi
  fi
  # The two modes count cases differently (3.22.1, the CI list: 5546 run in
  # test mode, 5369 listed as supported), so their counts are not compared:
  # support mode says which cases each side takes (every case the CPU takes,
  # APIR0 takes too unless declined above), test mode that every case APIR0
  # took matched the CPU backend.
  cases "$work/apir.sup" SUPPORTED >"$work/apir.yes"
  missing=$(comm -23 "$work/cpu.yes" "$work/apir.yes" | comm -23 - "$work/declined" | wc -l)
  [ "$missing" = 0 ] || { echo "FAIL: $missing case(s) the CPU backend takes are neither taken by APIR0 nor declined"; fail=1; }
  tbo_judge "$rc_apir" "$ap" "$at" "$ap" "$work/apir.log" || fail=1
  host_computes_other || fail=1
  exit $fail
  ;;
greedy)
  "$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || exit 1
  APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
  greedy=$GUEST_DIR/bin/apir-llama-greedy
  "$greedy" -m "$work/model.gguf" -d CPU -n 24 -t 2 --dump-logits "$work/cpu.bin" >"$work/cpu.out" 2>"$work/cpu.err" \
    || { cat "$work/cpu.err"; echo "FAIL: $SPEC's llama.cpp cannot decode the model natively"; exit 1; }
  GGML_BACKEND_PATH=$GUEST_LIB "$greedy" -m "$work/model.gguf" -d APIR0 -n 24 -t 2 --dump-logits "$work/apir.bin" \
    >"$work/apir.out" 2>"$work/apir.err"
  rc=$?
  if [ "$EXPECT" = refused ]; then
    # -d APIR0 with no such device: the usage error (2), never a crash.
    [ $rc = 2 ] || { echo "FAIL: exit $rc, expected 2 (no APIR0)"; tail -20 "$work/apir.err"; exit 1; }
    guest_refused "$work/apir.err" && host_refused || exit 1
    echo "refused cleanly: no APIR0 (exit 2)"
    exit 0
  fi
  [ $rc = 0 ] || { tail -20 "$work/apir.err"; exit 1; }
  echo "CPU ($SPEC): $(grep tokens: "$work/cpu.out")"
  echo "APIR0:       $(grep tokens: "$work/apir.out")"
  "$greedy" --compare "$work/cpu.bin" "$work/apir.bin" --tol 1e-3 || exit 1
  for _ in $(seq 1 200); do grep -q 'disconnected after' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
  graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$APIR_TEST_DIR/host.log" | grep -o '([0-9]*' | tr -d '(' | sort -n | tail -1)
  echo "host computed ${graphs:-0} graphs for the APIR0 run"
  [ "${graphs:-0}" -ge 24 ] || { echo "FAIL: the host computed too few graphs"; cat "$APIR_TEST_DIR/host.log"; exit 1; }
  host_computes_other || exit 1
  ;;
whisper)
  # This tree's whisper-cli natively on its own ggml's CPU backend, and through
  # APIR0 computed by the pinned host's CPU backend (their op and type tables
  # agree, and the host's log must say it compared them): equal transcripts,
  # every token id, probability and timestamp.
  [ "$EXPECT" = equal ] || { echo "whisper: only EXPECT=equal is checked"; exit 2; }
  linked=$(ldd "$WHISPER_DIR/bin/whisper-cli" | awk '$1 ~ /^libggml-base/ { print $3 }')
  [ -n "$linked" ] && [ "$(readlink -f "$linked")" = "$(readlink -f "$GUEST_DIR/install/lib/$(basename "$linked")")" ] ||
    { echo "FAIL: whisper-cli does not link $SPEC's ggml"; ldd "$WHISPER_DIR/bin/whisper-cli"; exit 1; }
  APIR_GUEST_LIB=$GUEST_LIB "$ROOT/tests/run_whisper_compare.sh" "$APIR_BUILD" "$WHISPER_DIR" | tee "$work/whisper.out"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  grep -q 'named as ours, computed' "$work/whisper.out" ||
    { echo "FAIL: the host did not compare this guest's ggml with its own"; exit 1; }
  # And the libraries swapped (whisper-cli loads its backends first thing, -h included).
  check_refusal "pinned library in $SPEC's whisper-cli" "$APIR_BUILD/libggml-apir.so" "$WHISPER_DIR/bin/whisper-cli" -h
  if [ -x "$ROOT/.whisper/bin/whisper-cli" ]; then
    check_refusal "$SPEC's library in the pinned whisper-cli" "$GUEST_LIB" "$ROOT/.whisper/bin/whisper-cli" -h
  fi
  exit $fail
  ;;
mismatch)
  # A host runs, so that a library which wrongly accepted would connect: the
  # refusal must come before (the host sees no guest).
  APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
  # The pinned library in this tree's program (its own CPU backend still listed).
  check_refusal "pinned library in $SPEC's program" "$APIR_BUILD/libggml-apir.so" \
    "$GUEST_DIR/bin/apir-llama-greedy" --list-devices
  grep -q 'CPU' "$work/out" || { echo "FAIL: the program lost its CPU backend"; cat "$work/out"; fail=1; }
  # This tree's library in the pinned program.
  check_refusal "$SPEC's library in the pinned program" "$GUEST_LIB" "$APIR_BUILD/tests/apir-llama-greedy" --list-devices
  sleep 0.2
  if grep -q 'connected' "$APIR_TEST_DIR/host.log"; then
    echo "FAIL: a refusing library reached the host"; cat "$APIR_TEST_DIR/host.log"; fail=1
  fi
  exit $fail
  ;;
*) echo "unknown check $CHECK"; exit 2 ;;
esac
