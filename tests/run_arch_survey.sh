#!/usr/bin/env bash
# Architecture survey: llama.cpp's test-llama-archs builds a small random model
# of each architecture (dense and, where it has one, MoE), computes the logits
# of 128 tokens on the CPU backend, then on every device, and compares (NMSE
# and a save/load roundtrip).  Here the devices are the CPU and APIR0 (a real
# apir-host on the CPU backend), so the APIR0 rows must equal the CPU exactly:
# NMSE 0 (or what the CPU device gets against the CPU reference, when that is
# not 0: nan for qwen3tts), and the roundtrip as on the CPU (OK; SKIP where
# llama.cpp cannot save that architecture).
# usage: run_arch_survey.sh APIR_BUILD DEPS_BIN [--table FILE] ARCH... | all
#   all: every architecture the pinned llama.cpp names (src/llama-arch.cpp).
#   --table FILE: also write the markdown table there.
# Prints one row per architecture and configuration:
#   arch | config | native | APIR0 | NMSE | roundtrip | equal
# native/APIR0: OK, FAIL (NMSE above the test's 1e-4), SKIP (the test skips the
# architecture), ERROR (the program stopped on that row with an error) or CRASH
# (a signal or the timeout); the exit status and last line it printed follow.  Exit 1 when an architecture
# that runs natively is not equal through APIR0.
# test-llama-archs never loads ggml's backends itself (GGML_BACKEND_DL build):
# tests/libapir-preload-backends.so does it before main().
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2; shift 2
table=""
if [ "${1:-}" = --table ]; then table=$2; shift 2; fi
. "$(dirname "$0")/lib.sh"
archs_bin="$APIR_DEPS_BIN/test-llama-archs"
preload="$APIR_BUILD/tests/libapir-preload-backends.so"
[ -x "$archs_bin" ] || { echo "SKIP: no $archs_bin (scripts/setup.sh builds it)"; exit 77; }
if [ "$*" = all ]; then
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$APIR_DEPS_BIN/../build/CMakeCache.txt")
  set -- $(grep -o '{ *LLM_ARCH_[A-Z0-9_]*, *"[^"]*" *}' "$src/src/llama-arch.cpp" | grep -v 'UNKNOWN' |
    sed 's/.*"\(.*\)".*/\1/')
fi
work=$(mktemp -d)
trap 'apir_host_stop; rm -rf "$work"' EXIT
SEED=${APIR_SURVEY_SEED:-1}
TIMEOUT=${APIR_SURVEY_TIMEOUT:-300}

# One host for the whole survey; started again if an architecture killed it.
ensure_host() {
  if [ -n "${APIR_HOST_PID:-}" ] && kill -0 "$APIR_HOST_PID" 2>/dev/null; then return 0; fi
  [ -n "${APIR_HOST_PID:-}" ] && { echo "note: the host died (log tail below); restarting it"; tail -3 "$APIR_TEST_DIR/host.log"; apir_host_stop; }
  apir_host_start --threads 2
}

strip() { sed 's/\x1b\[[0-9;]*m//g'; }

# Rows of one run -> "config device status nmse roundtrip" (device: cpu, apir, meta).
parse_rows() { # arch stdout status-of-an-unfinished-row
  strip <"$2" | awk -F'|' -v arch="$1" -v died="$3" '
    $2 ~ "^ *" arch "$" {
      dev = ($3 ~ / via /) ? "apir" : ($3 ~ /^ *Meta$/) ? "meta" : "cpu"
      cfg = $4; gsub(/ /, "", cfg)
      res = $5; rt = $6; gsub(/^ +| +$/, "", res); gsub(/ /, "", rt)
      if (res == "") res = died
      split(res, r, " "); nmse = r[2]; gsub(/[()]/, "", nmse)
      printf "%s %s %s %s %s\n", cfg, dev, r[1], (nmse == "" ? "-" : nmse), (rt == "" ? "-" : rt)
    }'
}

status=0
n_equal=0 n_differ=0 n_native_fail=0 n_skip=0
header="| arch | config | native | APIR0 | NMSE | roundtrip | equal |"
rows=()
printf '%s\n|---|---|---|---|---|---|---|\n' "$header"
for arch in "$@"; do
  ensure_host || exit 1
  out="$work/$arch.out" err="$work/$arch.err"
  timeout "$TIMEOUT" env LD_PRELOAD="$preload" GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
    "$archs_bin" -a "$arch" -s "$SEED" >"$out" 2>"$err"
  rc=$?
  died=ERROR; [ "$rc" -ge 124 ] && [ "$rc" -lt 160 ] && died=CRASH   # the timeout, or a signal
  parse_rows "$arch" "$out" "$died" >"$work/rows"
  last=$(grep -v '^load_backend' "$err" | tail -1 | cut -c1-120)
  # No row at all: the test left the architecture out before trying it
  # (gemma4, eagle3...: "SKIP"), or died first.
  if [ ! -s "$work/rows" ]; then
    st=$died; [ "$rc" = 0 ] && st=SKIP
    printf -- '- cpu %s - -\n- apir %s - -\n' "$st" "$st" >"$work/rows"
  fi
  for cfg in $(awk '{print $1}' "$work/rows" | uniq); do
    read -r _ _ cpu_st cpu_nmse cpu_rt < <(awk -v c="$cfg" '$1 == c && $2 == "cpu"' "$work/rows")
    read -r _ _ apir_st apir_nmse apir_rt < <(awk -v c="$cfg" '$1 == c && $2 == "apir"' "$work/rows")
    cpu_st=${cpu_st:-$died} apir_st=${apir_st:-$died} apir_nmse=${apir_nmse:--} apir_rt=${apir_rt:--}
    if [ "$cpu_st" = SKIP ]; then
      equal=skip; n_skip=$((n_skip + 1))
    elif [ "$cpu_st" != OK ]; then
      equal="native fails"; n_native_fail=$((n_native_fail + 1))
    elif [ "$apir_st" = OK ] && [ "$apir_nmse" = 0.00e+00 ] && [ "$apir_rt" = "${cpu_rt:-}" ]; then
      equal=yes; n_equal=$((n_equal + 1))
    elif [ "$apir_st" = OK ] && [ "$apir_nmse" = "${cpu_nmse:-}" ] && [ "$apir_rt" = "${cpu_rt:-}" ]; then
      # the CPU against itself is not 0 either (qwen3tts: nan): as natively
      equal="as native"; n_equal=$((n_equal + 1))
    else
      equal=NO; n_differ=$((n_differ + 1)); status=1
    fi
    note=""
    [ "$rc" = 0 ] || note=" (exit $rc: ${last//|//})"
    row="| $arch | $cfg | $cpu_st | $apir_st$note | $apir_nmse | $apir_rt | $equal |"
    rows+=("$row")
    echo "$row"
  done
done
summary="$n_equal equal, $n_differ not equal, $n_native_fail failing natively, $n_skip skipped by test-llama-archs (seed $SEED)"
echo "$summary"
if [ -n "$table" ]; then
  { echo "$header"; echo "|---|---|---|---|---|---|---|"; printf '%s\n' "${rows[@]}"; echo; echo "$summary"; } >"$table"
fi
exit $status
