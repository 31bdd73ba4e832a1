#!/usr/bin/env bash
# The token path allocates nothing once warmed up (the brief: no per-call heap
# churn on the token path), on both sides of a session: a greedy decode of 24
# tokens through APIR0 with tests/alloc_trace.c preloaded into the guest and
# into the host (daemon and worker), which writes each allocation apir's own
# code asks for (directly or through libc or ggml's base library) with its
# time.  Between the step a third of the way in and the last
# (apir-llama-greedy --window) neither side may have allocated: what llama.cpp
# and the CPU backend's compute allocate is theirs, and natively the same.
# Over tls: GnuTLS allocates for each record it seals or opens, whatever its
# caller does; those are counted and printed, not failed.
# Also checks the trace saw apir's allocations at all (the session's set-up,
# in the guest and in the worker), so that an empty window means something.
# usage: run_token_heap.sh APIR_BUILD DEPS_BIN TRANSPORT...   (unix, tcp, tls)
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2; shift 2
. "$(dirname "$0")/lib.sh"
apir_test_setup token-heap
trap 'apir_host_stop; apir_test_cleanup' EXIT
shim=$APIR_BUILD/tests/libapir-alloc-trace.so
greedy=$APIR_BUILD/tests/apir-llama-greedy
[ -f "$shim" ] || fail "no $shim"
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || fail "apir-gguf-gen"

# Where a traced allocation came from: its frames, apir's resolved (addr2line).
explain() {
  local line=$1 out="" f obj off file
  for f in $(echo "$line" | cut -d' ' -f5-); do
    obj=${f%+0x*} off=${f##*+}
    case $obj in
      apir-host) file=$APIR_BUILD/apir-host;;
      libggml-apir.so*) file=$APIR_BUILD/libggml-apir.so;;
      *) out="$out $f"; continue;;
    esac
    out="$out $(addr2line -f -s -e "$file" "$off" 2>/dev/null | paste -sd@ - | sed 's/@.*:/:/')"
  done
  echo " $(echo "$line" | cut -d' ' -f3-4):$out"
}

status=0
for transport in "$@"; do
  dir=$work/$transport; mkdir -p "$dir"
  case $transport in unix) stream=;; tcp|tls) stream=$transport;; *) fail "unknown transport $transport";; esac
  # No sandbox: the trace writes its own file from the worker (the sandbox's
  # filter and mount namespace would refuse it); the code paths are the same.
  APIR_TEST_STREAM=$stream LD_PRELOAD=$shim APIR_ALLOC_TRACE_DIR=$dir apir_host_start --threads 2 --no-sandbox \
    || fail "$transport: apir-host did not start"
  LD_PRELOAD=$shim APIR_ALLOC_TRACE_DIR=$dir GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
    "$greedy" -m "$work/model.gguf" -d APIR0 -n 24 -t 2 --window "$dir/window" >"$work/$transport-guest.log" 2>&1 \
    || fail "$transport: the decode through APIR0 failed"
  hostlog=$(cat "$APIR_TEST_DIR/host.log")
  apir_host_stop
  grep -q '^tokens:' "$work/$transport-guest.log" || fail "$transport: no tokens"
  from=$(awk '$1 == "from" {print $2}' "$dir/window") to=$(awk '$1 == "to" {print $2}' "$dir/window")
  [ -n "$from" ] && [ -n "$to" ] || fail "$transport: no window written"
  guest_all=$(cat "$dir"/alloc.* 2>/dev/null | grep ' apir ' | grep -c ' libggml-apir.so' || true)
  host_all=$(cat "$dir"/alloc.* 2>/dev/null | grep ' apir ' | grep -c ' apir-host+' || true)
  in_window=$(cat "$dir"/alloc.* 2>/dev/null | awk -v a="$from" -v b="$to" '$1 > a && $1 < b && $2 == "apir"')
  n=$(printf '%s' "$in_window" | grep -c . || true)
  tls_n=$(cat "$dir"/alloc.* 2>/dev/null | awk -v a="$from" -v b="$to" '$1 > a && $1 < b && $2 == "tls"' | wc -l)
  echo "$transport: apir's own allocations: guest $guest_all, host $host_all in all; $n in the 15 warmed-up steps" \
    "(GnuTLS's for its records: $tls_n)"
  if [ "$guest_all" -eq 0 ] || [ "$host_all" -eq 0 ]; then
    echo "FAIL: $transport: the trace saw no allocation of apir's on one side: it does not work here"
    echo "$hostlog" | tail -20
    status=1
  elif [ "$n" -ne 0 ]; then
    echo "FAIL: $transport: apir allocated on the token path once warmed up:"
    # each stack once, with how often it allocated
    printf '%s\n' "$in_window" | cut -d' ' -f2- | sort | uniq -c | sort -rn | head -10 |
      while read -r count line; do echo "  ${count}x$(explain "0 $line")"; done
    status=1
  fi
done
exit $status
