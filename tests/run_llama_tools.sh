#!/usr/bin/env bash
# llama.cpp's own programs, unmodified, natively on the CPU backend and through
# APIR0 (a real apir-host on the CPU backend, the guest's defaults): each must
# succeed both ways with the same output -- generated text and token ids,
# perplexity, sampled tokens, test verdicts.
# usage: run_llama_tools.sh APIR_BUILD DEPS_BIN TOOL
#   TOOL: server batched parallel perplexity embedding save_load_state
#         state_restore_fragmented thread_safety backend_sampler opt
# The model: apir-gguf-gen's tiny llama (random weights) with the tokenizer of
# the pinned llama.cpp's vocab-only models/ggml-vocab-llama-spm.gguf, so that
# programs taking text run.  Greedy or seeded sampling, fixed threads.
# Natively the programs see only the CPU; through APIR0 they get
# GGML_BACKEND_PATH=libggml-apir.so and -dev APIR0 -ngl 99 (all layers remote).
set -uo pipefail
APIR_BUILD=$(cd "$1" && pwd) APIR_DEPS_BIN=$(cd "$2" && pwd) TOOL=$3
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
work=$(mktemp -d)
cd "$work" || exit 1   # test-save-load-state writes dump_state.bin into its folder
server_pids=()
cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  apir_host_stop
  rm -rf "$work"
}
trap cleanup EXIT
bin=$APIR_DEPS_BIN
for p in llama-server test-opt; do
  [ -x "$bin/$p" ] || { echo "SKIP: no $bin/$p (scripts/setup.sh builds llama.cpp's extra programs)"; exit 77; }
done
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$bin/../build/CMakeCache.txt")
model="$work/model.gguf"
"$APIR_BUILD/apir-gguf-gen" -o "$model" --size tiny --vocab-from "$src/models/ggml-vocab-llama-spm.gguf" >/dev/null ||
  exit 1
APIR_HOST_LOG=info apir_host_start --threads 2 || exit 1
apir_env=(GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so")
apir_dev=(-dev APIR0 -ngl 99)
PROMPT="The meaning of life is"

# The lines of a failed program's log that say why (ggml prints a backtrace
# through gdb after an assertion: left out).
why() { grep -v '^#\|^\[\|ptrace\|No stack\|not being run\|already traced\|No such file\|^[0-9]*\s' "$1" | tail -${2:-8}; }

# Both runs drain llama.cpp's log at exit (tests/drain_log.c; not from a
# sanitizer build, whose library would need its runtime loaded first).
drain=$APIR_BUILD/tests/libapir-drain-log.so
preload=()
[ -f "$drain" ] && ! ldd "$drain" 2>/dev/null | grep -q 'lib[at]san' && preload=(LD_PRELOAD="$drain")

# run NAME PROGRAM ARGS... -- once natively (NAME.native.*), once through APIR0
# (NAME.apir.*; the APIR0 device options appended unless NO_DEV=1).
run_both() {
  local name=$1 prog=$2; shift 2
  local t0=$SECONDS
  timeout 300 env "${preload[@]}" "$bin/$prog" "$@" >"$work/$name.native.out" 2>"$work/$name.native.err" ||
    { echo "FAIL: $prog natively exited $?"; why "$work/$name.native.err"; return 1; }
  local t1=$SECONDS
  local dev=("${apir_dev[@]}"); [ "${NO_DEV:-0}" = 1 ] && dev=()
  (cd "${APIR_CWD:-$work}" && timeout 300 env "${preload[@]}" "${apir_env[@]}" "$bin/$prog" "$@" "${dev[@]}") >"$work/$name.apir.out" 2>"$work/$name.apir.err" ||
    { echo "FAIL: $prog through APIR0 exited $?"; why "$work/$name.apir.err"; why "$APIR_TEST_DIR/host.log" 3; return 1; }
  echo "$prog: native $((t1 - t0)) s, APIR0 $((SECONDS - t1)) s"
}

# same NAME FILTER: the filtered outputs (FILTER reads NAME.{native,apir}.{out,err}
# as $1 = prefix) must be equal and not empty.  Returns 2, quietly, when one is
# a strict prefix of the other (see run_compare).
same() {
  local name=$1 filter=$2
  "$filter" "$work/$name.native" >"$work/$name.native.cmp"
  "$filter" "$work/$name.apir" >"$work/$name.apir.cmp"
  [ -s "$work/$name.native.cmp" ] || { echo "FAIL: nothing to compare in the native output"; tail "$work/$name.native.err"; return 1; }
  if [ "${CHECK_TRUNCATED:-0}" = 1 ] && truncated "$work/$name.native.cmp" "$work/$name.apir.cmp"; then
    return 2
  fi
  if ! cmp -s "$work/$name.native.cmp" "$work/$name.apir.cmp"; then
    echo "FAIL: outputs differ (native vs APIR0):"
    diff "$work/$name.native.cmp" "$work/$name.apir.cmp" | cut -c1-300 | head -20
    [ -n "${APIR_KEEP:-}" ] && cp -r "$work" "$APIR_KEEP"
    return 1
  fi
  echo "same output natively and through APIR0 ($(wc -l <"$work/$name.native.cmp") lines compared):"
  [ -n "${APIR_KEEP:-}" ] && cp -r "$work" "$APIR_KEEP"
  head -4 "$work/$name.native.cmp" | cut -c1-150
}

# truncated A B: one file is a strict prefix of the other.
truncated() {
  local a=$1 b=$2
  [ "$(stat -c %s "$a")" -gt "$(stat -c %s "$b")" ] && { a=$2 b=$1; }
  [ "$(stat -c %s "$a")" -lt "$(stat -c %s "$b")" ] && cmp -s "$a" <(head -c "$(stat -c %s "$a")" "$b")
}

# run_compare NAME FILTER PROGRAM ARGS...: run_both, then same.  llama.cpp's
# logger writes from a thread that the program never waits for at exit
# (common/log.cpp leaks it on purpose), so on a loaded machine a program's
# last log lines can be lost; run_both drains it at exit (drain_log.c), and
# should one output still be a strict prefix of the other, both runs are
# repeated, at most four times (before the drain, a CI run on 2 busy cores
# lost the native run's last lines five times in a row).
run_compare() {
  local name=$1 filter=$2; shift 2
  local attempt rc
  for attempt in 1 2 3 4 5; do
    run_both "$name" "$@" || return 1
    CHECK_TRUNCATED=$([ $attempt -lt 5 ] && echo 1 || echo 0) same "$name" "$filter"
    rc=$?
    [ $rc = 2 ] || return $rc
    echo "one output lost its last lines (llama.cpp's logger, at exit): running both again"
  done
}

# The comparison means something only if the APIR0 run computed on the host.
host_computed() {
  for _ in $(seq 1 200); do grep -q 'disconnected after' "$APIR_TEST_DIR/host.log" && break; sleep 0.01; done
  local graphs
  graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$APIR_TEST_DIR/host.log" | grep -o '([0-9]*' |
    tr -d '(' | sort -n | tail -1)
  echo "host computed ${graphs:-0} graphs (largest session)"
  [ "${graphs:-0}" -ge "${1:-1}" ] || { echo "FAIL: the host computed too few graphs"; tail "$APIR_TEST_DIR/host.log"; return 1; }
}

f_stdout() { cat "$1.out"; }
f_sorted() { sort "$1.out"; }
f_ppl() { grep -ho '\[[0-9]*\][0-9.]*\|Final estimate: PPL = .*' "$1.out" "$1.err"; }
f_verdicts() { grep -h 'restored state\|saved seq\|processed prompt\|PASS\|FAIL' "$1.err" "$1.out"; }
# test-thread-safety loads one model per GPU-type device, one on the CPU and
# one split by layers (natively 2, through apir 3), 4 contexts each: every
# context must have generated the same text, natively and through APIR0.
f_thread_safety() { grep -h 'Model [0-9]*/[0-9]*, Context' "$1.err" "$1.out" | sed 's/^.*Context [0-9]*\/[0-9]*: //' | sort -u; }

# ---- llama-server: 4 slots, 16 concurrent greedy requests -------------------
SERVER_REQUESTS=16
server_run() { # name, env...; writes NAME.N.json per request
  local name=$1; shift
  local port=$((20000 + RANDOM % 20000))
  env "$@" "$bin/llama-server" -m "$model" -np 4 -c 2048 -t 2 --host 127.0.0.1 --port "$port" \
    ${SERVER_DEV:-} >"$work/$name.server.log" 2>&1 &
  local pid=$!
  server_pids+=("$pid")
  local ok=0
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && { ok=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "FAIL: llama-server ($name) did not come up"; tail -15 "$work/$name.server.log"; return 1; }
  local t0=$SECONDS cpids=()
  for i in $(seq 1 $SERVER_REQUESTS); do
    curl -sf --max-time 120 "http://127.0.0.1:$port/completion" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"$PROMPT (request $i)\", \"n_predict\": 24, \"temperature\": 0, \"top_k\": 1,
           \"seed\": 1, \"cache_prompt\": false, \"n_probs\": 2, \"return_tokens\": true}" \
      >"$work/$name.$i.json" &
    cpids+=($!)
  done
  local failed=0
  for c in "${cpids[@]}"; do wait "$c" || failed=$((failed + 1)); done
  echo "llama-server ($name): $SERVER_REQUESTS concurrent requests in $((SECONDS - t0)) s, $failed failed"
  kill "$pid"; wait "$pid" 2>/dev/null
  [ $failed = 0 ] || { tail -15 "$work/$name.server.log"; return 1; }
}
f_server() { # prefix: the requests' text, token ids and top-2 probabilities, in request order
  local i
  for i in $(seq 1 $SERVER_REQUESTS); do
    jq -c '{content, tokens, probs: .completion_probabilities}' "$1.$i.json"
  done
}

case $TOOL in
server)
  # Q4_0: the CPU backend's result for a sequence must not depend on which
  # other requests share its batch (timing decides that, natively as through
  # APIR0).  Q4_0 matrix products are integer dot products of q8_0-quantized
  # activations, the same whatever the batch; f16 ones switch kernels and
  # activation precision with the batch size (logprobs then differ ~5e-4).
  "$APIR_BUILD/apir-gguf-gen" -o "$model" --size tiny --type q4_0 \
    --vocab-from "$src/models/ggml-vocab-llama-spm.gguf" >/dev/null || exit 1
  server_run server.native || exit 1
  SERVER_DEV="-dev APIR0 -ngl 99" server_run server.apir "${apir_env[@]}" || { tail -3 "$APIR_TEST_DIR/host.log"; exit 1; }
  same server f_server || exit 1
  host_computed 24 || exit 1
  ;;
batched)
  run_compare batched f_stdout llama-batched -m "$model" -p "$PROMPT" -np 4 -n 24 -t 2 -kvu --seed 1 || exit 1
  host_computed 16 || exit 1
  ;;
parallel)
  # One thread serves the 4 clients: the order in which they finish and
  # report (prompt, response) is the same every run.
  f_parallel() {
    cat "$1.out" "$1.err" | sed 's/\x1b\[[0-9;]*m//g' |
      awk '/^Input:/ { input = $0 } /^Response:/ { print input " => " $0 }'
  }
  run_compare parallel f_parallel llama-parallel -m "$model" -np 4 -ns 8 -n 16 -t 2 -kvu --seed 1 --temp 0 || exit 1
  host_computed 8 || exit 1
  ;;
perplexity)
  # Any text of a few thousand tokens: the project's README.
  run_compare perplexity f_ppl llama-perplexity -m "$model" -f "$here/../README.md" -c 128 -b 128 --chunks 4 -t 2 ||
    exit 1
  host_computed 4 || exit 1
  # Without a file mapping llama.cpp loads through a device's host buffers
  # with async uploads and events, where the device offers them (ours does).
  run_compare perplexity_no_mmap f_ppl llama-perplexity -m "$model" -f "$here/../README.md" -c 128 -b 128 --chunks 4 \
    -t 2 --no-mmap || exit 1
  ;;
embedding)
  run_compare embedding f_stdout llama-embedding -m "$model" -p "$PROMPT" -t 2 --embd-output-format json || exit 1
  host_computed 1 || exit 1
  ;;
save_load_state)
  run_compare save_load_state f_stdout test-save-load-state -m "$model" -p "$PROMPT" -n 16 -t 2 --seed 1 || exit 1
  host_computed 4 || exit 1
  ;;
state_restore_fragmented)
  run_compare state_restore f_verdicts test-state-restore-fragmented -m "$model" -t 2 || exit 1
  host_computed 1 || exit 1
  ;;
thread_safety)
  # llama.cpp's own arguments (tests/CMakeLists.txt) but 64 tokens instead of
  # 128 (CI time), on our model: 4 contexts per model on parallel threads; it
  # places the models on the devices itself.
  NO_DEV=1 run_both thread_safety test-thread-safety -m "$model" -p "$PROMPT" -n 64 -c 256 -ub 32 -np 4 -t 2 \
    -ngl 99 --seed 1 || exit 1
  grep -q 'Model 3/3' "$work/thread_safety.apir.err" || { echo "FAIL: no model on APIR0"; exit 1; }
  same thread_safety f_thread_safety && host_computed 8 || exit 1
  ;;
backend_sampler)
  # test-backend-sampler picks its device itself: "cpu" natively, "gpu" (the
  # first GPU-type device: APIR0) through apir.  Each of its tests runs alone:
  # the ones written for a trained model (logit_bias wants +10 to win the draw)
  # fail natively on random weights and are listed, not compared.
  names=$(grep -o '{ *"[a-z_]*", *test_backend_' "$src/tests/test-backend-sampler.cpp" | grep -o '"[a-z_]*"' | tr -d '"')
  compared=0 native_fails=""
  for t in $names; do
    timeout 120 "$bin/test-backend-sampler" --model "$model" --device cpu --test "$t" \
      >"$work/bs_$t.native.out" 2>"$work/bs_$t.native.err" || { native_fails+=" $t"; continue; }
    timeout 120 env "${apir_env[@]}" "$bin/test-backend-sampler" --model "$model" --device gpu --test "$t" \
      >"$work/bs_$t.apir.out" 2>"$work/bs_$t.apir.err" ||
      { echo "FAIL: test-backend-sampler --test $t through APIR0 exited $?"; why "$work/bs_$t.apir.err"; exit 1; }
    grep -q 'Using device: APIR0' "$work/bs_$t.apir.err" || { echo "FAIL: APIR0 not used"; exit 1; }
    same "bs_$t" f_stdout >/dev/null || { same "bs_$t" f_stdout; exit 1; }
    compared=$((compared + 1))
  done
  echo "test-backend-sampler: $compared tests pass with the same output natively and through APIR0;" \
    "failing natively on this model:${native_fails:- none}"
  [ "$compared" -ge 10 ] || { echo "FAIL: too few tests compared"; exit 1; }
  host_computed 1 || exit 1
  ;;
opt)
  # test-opt runs ggml's optimizer tests on every backend it finds: natively
  # the CPU, through apir also APIR0, which must pass as many as the CPU.
  # ggml's optimizer wants the CPU backend last; GGML_BACKEND_PATH registers
  # a backend after it (ggml-backend.cpp:1861 asserts).  The supported way
  # (README, "Backend order"): install the library where ggml's own loader
  # finds it under a name it loads before the CPU's - libggml-virtgpu-apir.so
  # in the program's folder or the current one.
  mkdir -p "$work/backend-dir"
  ln -sf "$APIR_BUILD/libggml-apir.so" "$work/backend-dir/libggml-virtgpu-apir.so"
  apir_env=(APIR_HOST="$APIR_HOST")
  APIR_CWD="$work/backend-dir" NO_DEV=1 run_both opt test-opt || exit 1
  # the "N/M tests passed" lines of one backend's block, one per optimizer
  opt_block() { sed 's/\x1b\[[0-9;]*m//g' "$1" | awk -v want="$2" '/^Backend [0-9]+\/[0-9]+: / { cur = $3 }
      cur == want && /tests passed/ { sub(/^ */, ""); print }'; }
  opt_block "$work/opt.native.out" CPU >"$work/opt.native.cmp"
  opt_block "$work/opt.apir.out" APIR0 >"$work/opt.apir.cmp"
  echo "native CPU: $(tr '\n' ' ' <"$work/opt.native.cmp")"
  echo "APIR0:      $(tr '\n' ' ' <"$work/opt.apir.cmp")"
  [ -s "$work/opt.apir.cmp" ] || { echo "FAIL: test-opt did not test APIR0"; exit 1; }
  cmp -s "$work/opt.native.cmp" "$work/opt.apir.cmp" || { echo "FAIL: APIR0 passed different tests"; exit 1; }
  host_computed 1 || exit 1
  ;;
*)
  echo "unknown tool $TOOL"; exit 2
  ;;
esac
echo "ok: $TOOL"
