#!/usr/bin/env bash
# The test command (what CI runs through .ci/run):
#   1. set-up (cached: seconds once ggml is built);
#   2. build with warnings as errors, then every test (ctest): unit tests,
#      end-to-end tests with real processes, llama.cpp's test-backend-ops
#      through APIR0 (shm and virtgpu paths), a llama model through APIR0;
#   3. the same fast tests under ASan + UBSan, the multi-client tests under
#      TSan (sanitizer builds in build-asan/, build-tsan/);
#   4. the fuzz gate (fuzz/run.sh --gate): past findings and the corpus kept
#      in the tree replayed, then each target for a fixed number of
#      executions from a fixed seed (the same verdict on every machine).
# Each stage prints ctest's or the fuzzer's summary; the script fails if any
# stage fails.
#   scripts/test.sh              everything
#   scripts/test.sh -R NAME      only step 2, only the matching tests
#   APIR_TEST_STAGES="build sanitizers fuzz"   choose stages
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
# Other llama.cpp trees for the ggml_version_* tests (a guest of another ggml,
# scripts/guest-for.sh), built once into the cache like .deps: the first time
# ~10 min for node-llama-cpp@3.14.0 and ~15 for 3.22.1 on 2 cores, then nothing.
# Not by default (that first build does not fit CI's time beside the rest);
# without them those tests skip.  whisper:SPEC: that tree and whisper.cpp against
# its ggml (guest-for.sh --whisper; 1-3 min more), for ggml_version_*_whisper.  e.g.
#   APIR_GGML_TREES="node-llama-cpp@3.14.0 whisper:node-llama-cpp@3.22.1" scripts/test.sh
for tree in ${APIR_GGML_TREES:-}; do
  case $tree in
    whisper:*) bash scripts/guest-for.sh --whisper "${tree#whisper:}" >/dev/null || exit 1 ;;
    *) bash scripts/guest-for.sh "$tree" >/dev/null || exit 1 ;;
  esac
done
STAGES=${APIR_TEST_STAGES:-"build sanitizers fuzz"}
[ $# -gt 0 ] && STAGES=build
JOBS=$(nproc)
failed=""
stage() { echo; echo "==== $1 ($(date +%T))"; }

configure_build() { # dir, cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$JOBS" 2>&1 | tail -2
}

# The slow ones run in the plain build only; so do the unmodified llama.cpp and
# whisper.cpp programs (not built with the sanitizers, they cannot load an
# instrumented libggml-apir.so).
SLOW='backend_ops|whisper_|llama_tools_|arch_survey|vm_|guest_notices|many_guests|soak_'

for s in $STAGES; do
  case $s in
  build)
    stage "build (warnings as errors) + all tests"
    t0=$SECONDS
    configure_build build -DAPIR_WERROR=ON || { failed+=" build"; continue; }
    echo "build: $((SECONDS - t0))s"
    (cd build && ctest --output-on-failure --timeout 3000 "$@") || failed+=" tests"
    ;;
  sanitizers)
    stage "ASan + UBSan: the fast tests"
    configure_build build-asan -DAPIR_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug || { failed+=" asan-build"; continue; }
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       ctest --output-on-failure --timeout 600 -E "$SLOW") || failed+=" asan"
    stage "TSan: the multi-client tests"
    configure_build build-tsan -DAPIR_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug -DAPIR_VIRGL=OFF || { failed+=" tsan-build"; continue; }
    (cd build-tsan && APIR_E2E_SKIP_RSS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp" \
       ctest --output-on-failure --timeout 600 -R "e2e|mirror|dispatch|stats|bulk_copy|socket_sender|socket_reader|stream_lanes|tls_session") || failed+=" tsan"
    ;;
  fuzz)
    stage "fuzz gate: findings, the tree's corpus, fixed seeds and run counts"
    # Deterministic: nothing here depends on the machine's speed.  Open-ended
    # fuzzing is fuzz/run.sh --explore, run by hand (README).
    bash fuzz/run.sh --gate || failed+=" fuzz"
    ;;
  esac
done
echo
if [ -n "$failed" ]; then
  echo "test: FAILED stages:$failed"
  exit 1
fi
echo "test: all stages passed ($STAGES)"
