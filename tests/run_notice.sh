#!/usr/bin/env bash
# Guest errors reach the user even when the program silences ggml's logger
# (issue 28 item 1): llama-bench replaces ggml's log callback with one that
# drops every line, so apir's log lines are lost there; the notice of the
# cause that failed the program's call must still appear on stderr, once,
# with its remedy.
#   1. a quota refusal: apir-host --max-alloc-mib 1, the model's buffers refused;
#   2. the host killed while llama-bench generates.
# usage: run_notice.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d)
trap 'apir_host_stop; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- llama-bench stderr:"; tail -20 "$work/err"; exit 1; }
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || exit 1
bench() { # extra llama-bench args...
  GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" timeout 120 "$APIR_DEPS_BIN/llama-bench" \
    -m "$work/model.gguf" -ngl 99 -dev APIR0 -t 1 -r 1 "$@" >"$work/out" 2>"$work/err"
}

# 1. quota
apir_host_start --max-alloc-mib 1 || exit 1
bench -p 0 -n 4 && fail "llama-bench succeeded although every model buffer was refused"
grep -q '^apir: the APIR host refused .*limit' "$work/err" || fail "no notice of the quota refusal on stderr"
grep -q '^apir: use less' "$work/err" || fail "the quota notice has no remedy"
n=$(grep -c '^apir: the APIR host refused' "$work/err")
[ "$n" = 1 ] || fail "the quota notice was said $n times (once per cause)"
echo "ok: quota refusal told on stderr with llama-bench's logger off"
apir_host_stop

# 2. host killed mid-run
apir_host_start || exit 1
bench -p 0 -n 100000 &
pid=$!
for _ in $(seq 1 200); do grep -q 'llama-bench\|^|' "$work/out" 2>/dev/null && break; sleep 0.05; done
sleep 1
kill -9 "$APIR_HOST_PID"; wait "$APIR_HOST_PID" 2>/dev/null; APIR_HOST_PID=
wait $pid && fail "llama-bench succeeded although its host was killed"
grep -q '^apir: the APIR host at .* is gone' "$work/err" || fail "no notice that the host is gone on stderr"
grep -q "^apir: the host's log says why" "$work/err" || fail "the host-gone notice has no remedy"
echo "ok: host loss told on stderr with llama-bench's logger off"
rm -rf "$APIR_TEST_DIR"
echo "ok: both notices"
