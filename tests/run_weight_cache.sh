#!/usr/bin/env bash
# The weight cache (apir 0.4, host/data/weight_cache.h) end to end: a generated
# model loaded three times through apir-host --weight-cache with the guest's
# buffers not zero-copy (APIR_ZERO_COPY=0: the weights travel as uploads, as
# over a network): the first load misses and the host keeps every weight it
# hashed; the second, on the same host, and the third, on a new host over
# the same directory, are filled from the cache (hits, no miss).  Every run's
# tokens and logits equal the native CPU's.  Both isolation modes: process
# (workers ask the daemon's cache over their socket) and thread; and, when
# the host has a TCP transport, the same over tcp:127.0.0.1 (where weights
# travel in the stream whatever APIR_ZERO_COPY says).
# usage: run_weight_cache.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2
. "$(dirname "$0")/lib.sh"
trap 'apir_host_stop; rm -rf "$work"' EXIT
work=$(mktemp -d)
"$APIR_BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || exit 1
greedy="$APIR_BUILD/tests/apir-llama-greedy"
"$greedy" -m "$work/model.gguf" -d CPU -n 16 -t 2 --dump-logits "$work/cpu.bin" >"$work/cpu.out" 2>"$work/cpu.err" \
  || { cat "$work/cpu.err"; exit 1; }
echo "CPU:   $(grep tokens: "$work/cpu.out")"

# The tiny model's matrices are 64 KiB to 2 MiB: hash those of 64 KiB and up.
export APIR_ZERO_COPY=0 APIR_HASH_MIN_KB=64

# run NAME: one greedy decode through APIR0, compared with the CPU's; the
# guest's profile (APIR_PROFILE) counts its commands and the bytes it copied.
run() {
  APIR_HOST=${GUEST_HOST:-$APIR_HOST} APIR_PROFILE=1 GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" \
    "$greedy" -m "$work/model.gguf" -d APIR0 -n 16 -t 2 --dump-logits "$work/$1.bin" >"$work/$1.out" 2>"$work/$1.err" \
    || { cat "$work/$1.err"; return 1; }
  echo "$1: $(grep tokens: "$work/$1.out")"
  "$greedy" --compare "$work/cpu.bin" "$work/$1.bin" --tol 1e-3 || return 1
}

# calls NAME CMD: how many CMD the run sent; copied NAME: MiB through the
# data area (uploads and reads).
calls() { awk -v c="$2" '$1 == "apir" && $3 == "APIR0:" && $4 == c { n = $5 } END { print n + 0 }' "$work/$1.err"; }
copied() { awk '$4 == "data" && $5 == "area" { m = $7 } END { print int(m * 10 + 0.5) }' "$work/$1.err"; }  # 0.1 MiB

# wait_line N: until the host log has N weight cache lines (a session's
# line comes when its guest has gone).
wait_line() {
  for _ in $(seq 1 500); do
    [ "$(grep -c ': weight cache: [0-9]* hits' "$APIR_TEST_DIR/host.log")" -ge "$1" ] && return 0
    sleep 0.01
  done
  echo "FAIL: no weight cache line for session $1"; cat "$APIR_TEST_DIR/host.log"; return 1
}

# wait_entries DIR N: until DIR holds N entries (the host writes them from
# a thread of its own after it answered: host/data/weight_cache.h).
wait_entries() {
  for _ in $(seq 1 1000); do
    [ "$(ls -A "$1" | grep -cE '^t-[0-9a-f]{64}$')" -ge "$2" ] && return 0
    sleep 0.01
  done
}

# field N WHAT: the number before WHAT in the N-th session's line.
field() {
  grep -o ': weight cache: .*' "$APIR_TEST_DIR/host.log" | sed -n "$1p" |
    sed -E 's/.*: weight cache: //; s/ \([^)]*\)//' | tr ',' '\n' | grep -E "(^| )$2\$" | grep -o '[0-9]*'
}

modes="process thread"
case "$("$APIR_BUILD/apir-host" --help)" in *tcp:HOST:PORT*) modes="$modes tcp" ;; esac
for mode in $modes; do
  cache="$work/cache-$mode"
  isolation=$mode extra=() GUEST_HOST=
  [ "$mode" = thread ] && extra=(--insecure-shared-process)
  if [ "$mode" = tcp ]; then
    port=$((20000 + RANDOM % 20000))
    isolation=process extra=(--listen "tcp:127.0.0.1:$port") GUEST_HOST="tcp:127.0.0.1:$port"
  fi
  APIR_HOST_LOG=info apir_host_start --threads 2 --isolation "$isolation" --weight-cache "$cache" "${extra[@]}" || exit 1
  run "$mode-1" || exit 1
  wait_line 1 || exit 1
  wait_entries "$cache" "$(field 1 kept)"
  run "$mode-2" || exit 1
  wait_line 2 || exit 1
  h1=$(field 1 hits) m1=$(field 1 misses) k1=$(field 1 kept)
  h2=$(field 2 hits) m2=$(field 2 misses)
  # Named by the tree digest (apir 0.5: "t-" and its hex), which both sides speak.
  entries=$(ls -A "$cache" | grep -cE '^t-[0-9a-f]{64}$')
  echo "$mode: first load $h1 hits, $m1 misses, $k1 kept ($entries entries); second load $h2 hits, $m2 misses"
  [ "${h1:-1}" -eq 0 ] && [ "${m1:-0}" -gt 0 ] && [ "${k1:-0}" -eq "${m1:-0}" ] ||
    { echo "FAIL: the first load should miss and keep every weight"; grep -i cache "$APIR_TEST_DIR/host.log"; exit 1; }
  [ "$entries" -eq "$k1" ] || { echo "FAIL: $entries entries in $cache, $k1 kept"; exit 1; }
  [ "${h2:-0}" -eq "$m1" ] && [ "${m2:-1}" -eq 0 ] ||
    { echo "FAIL: the second load should hit every weight"; grep -i cache "$APIR_TEST_DIR/host.log"; exit 1; }
  s1=$(calls "$mode-1" BUFFER_SET_TENSOR_HASH) c1=$(calls "$mode-1" BUFFER_CACHE_TENSOR)
  s2=$(calls "$mode-2" BUFFER_SET_TENSOR_HASH) c2=$(calls "$mode-2" BUFFER_CACHE_TENSOR)
  b1=$(copied "$mode-1") b2=$(copied "$mode-2")
  echo "$mode: the guest sent $s1/$s2 hashes, $c1/$c2 keeps; copied $b1/$b2 x 0.1 MiB (first/second load)"
  [ "$s1" -eq "$m1" ] && [ "$c1" -eq "$m1" ] && [ "$s2" -eq "$m1" ] && [ "$c2" -eq 0 ] ||
    { echo "FAIL: the guest's commands do not match the host's counts"; exit 1; }
  # Each weight the second load found is one upload fewer (and, where the
  # data area counts them, its bytes are not copied).
  u1=$(calls "$mode-1" BUFFER_SET_TENSOR) u2=$(calls "$mode-2" BUFFER_SET_TENSOR)
  echo "$mode: uploads $u1/$u2"
  [ $((u1 - u2)) -ge "$m1" ] || { echo "FAIL: the second load uploaded as much"; exit 1; }
  [ "$b1" -eq 0 ] || [ $((b2 * 4)) -lt "$b1" ] || { echo "FAIL: the second load copied too much"; exit 1; }
  perm=$(stat -c %a "$cache")
  [ "$perm" = 700 ] || { echo "FAIL: $cache has mode $perm"; exit 1; }
  apir_host_stop
  # A new host over the same directory: the entries outlive the process.
  APIR_HOST_LOG=info apir_host_start --threads 2 --isolation "$isolation" --weight-cache "$cache" "${extra[@]}" || exit 1
  run "$mode-3" || exit 1
  wait_line 1 || exit 1
  h3=$(field 1 hits) m3=$(field 1 misses)
  echo "$mode: new host: $h3 hits, $m3 misses"
  [ "${h3:-0}" -eq "$m1" ] && [ "${m3:-1}" -eq 0 ] ||
    { echo "FAIL: a new host should find every weight"; grep -i cache "$APIR_TEST_DIR/host.log"; exit 1; }
  apir_host_stop
done

# Against a host without a cache the guest asks once, then stops hashing.
GUEST_HOST=
APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
run nocache || exit 1
asked=$(calls nocache BUFFER_SET_TENSOR_HASH) kept=$(calls nocache BUFFER_CACHE_TENSOR)
echo "no cache: the guest sent $asked hash(es), $kept keeps"
[ "$asked" -eq 1 ] && [ "$kept" -eq 0 ] || { echo "FAIL: the guest should have asked once"; exit 1; }
