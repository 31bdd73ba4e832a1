#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan/UBSan in build-fuzz/, writes
# the seed corpora, and runs each target for a while.
#
#   fuzz/run.sh [SECONDS_PER_TARGET]        (default 30)
#
# Environment:
#   FUZZ_TARGETS   targets to run (default: all seven)
#   FUZZ_FLAGS     extra libFuzzer flags, e.g. "-fork=2 -ignore_crashes=1"
#                  to go on past the first crash
#   BUILD_DIR      build directory (default: build-fuzz)
#   FUZZ_SKIP_KNOWN=1  the harnesses skip inputs that would hit the known
#                  missing-source crash (fuzz/findings), to look past it
#   FUZZ_OP_STRICT=0   fuzz_op: kernel asserts on accepted nodes are not findings
#                  (they are by default)
#
# Corpora grow in fuzz/corpus-<target>/ (git-ignored); crash, leak, timeout
# and oom inputs land in BUILD_DIR/artifacts/<target>/.  Exit status: 0 when
# no target found anything, 1 otherwise, 2 when the build failed.
set -u -o pipefail

DURATION=${1:-30}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-fuzz}
TARGETS=${FUZZ_TARGETS:-"fuzz_codec fuzz_inline fuzz_graph fuzz_dispatch fuzz_shm_frame fuzz_stream_frame fuzz_op"}
FLAGS=${FUZZ_FLAGS:-}

# The root CMakeLists.txt adds fuzz/ when APIR_FUZZ is on.
mkdir -p "$BUILD"
echo "== configure + build ($BUILD)"
if ! CC=clang cmake -S "$ROOT" -B "$BUILD" -G Ninja -DAPIR_FUZZ=ON -DAPIR_SANITIZE=address,undefined -DAPIR_VIRGL=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$BUILD/configure.log" 2>&1; then
    cat "$BUILD/configure.log"
    exit 2
fi
# shellcheck disable=SC2086
if ! cmake --build "$BUILD" --target make_seeds $TARGETS; then
    exit 2
fi
bin_of() { echo "$BUILD/fuzz/$1"; }

echo "== seeds"
SEEDS=$BUILD/seeds
rm -rf "$SEEDS"
"$(bin_of make_seeds)" "$SEEDS" || exit 2
# fuzz_op finds its own seeds: inputs whose node each op's constructor accepts.
case " $TARGETS " in *" fuzz_op "*)
    FUZZ_OP_SEEDS="$SEEDS/fuzz_op" "$(bin_of fuzz_op)" > "$BUILD/fuzz_op-seeds.log" 2>&1 || exit 2 ;;
esac

# Per target: longest input, and the per-input timeout.  fuzz_shm_frame
# and fuzz_stream_frame wait on server threads and have their own deadlines
# (20 s, 10 s per wait), so libFuzzer's timeout must be longer; their
# clients are freed asynchronously by the server, so the per-input leak
# check is off there (LeakSanitizer still runs at exit).
max_len_of() {
    case $1 in
        fuzz_codec) echo 4096 ;;
        fuzz_inline) echo 8192 ;;
        fuzz_graph) echo 16384 ;;
        fuzz_dispatch) echo 16384 ;;
        fuzz_shm_frame) echo 4096 ;;
        fuzz_stream_frame) echo 8192 ;;
        fuzz_op) echo 1024 ;;
    esac
}
extra_of() {
    case $1 in
        fuzz_shm_frame|fuzz_stream_frame) echo "-timeout=30 -detect_leaks=0" ;;
        fuzz_dispatch) echo "-timeout=10" ;;
        fuzz_op) echo "-timeout=10" ;;
        *) echo "-timeout=5" ;;
    esac
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
# fuzz_op: a ggml abort on a node the host accepted is a finding (a check
# missing before the kernel), not only a fault or a stray write
export FUZZ_OP_STRICT=${FUZZ_OP_STRICT:-1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer || echo /usr/lib/llvm-14/bin/llvm-symbolizer)}

status=0
summary=""
# Regressions first: every input that once found a bug must now pass.
for f in "$ROOT"/fuzz/findings/*.bin; do
    [ -e "$f" ] || continue
    t=$(basename "$f"); t=${t%-*.bin}
    case " $TARGETS " in *" $t "*) ;; *) continue ;; esac
    # shellcheck disable=SC2046
    if ! "$(bin_of "$t")" $(extra_of "$t") "$f" > "$BUILD/replay.log" 2>&1; then
        status=1
        summary+="$t: REGRESSION on $(basename "$f") (log $BUILD/replay.log)"$'\n'
    fi
done
[ $status = 0 ] && summary+="findings replayed: all pass"$'\n'
for t in $TARGETS; do
    bin=$(bin_of "$t")
    corpus=$ROOT/fuzz/corpus-${t#fuzz_}
    art=$BUILD/artifacts/$t
    log=$BUILD/$t.log
    mkdir -p "$corpus" "$art"
    echo "== $t: ${DURATION}s"
    # shellcheck disable=SC2046,SC2086
    "$bin" -max_total_time="$DURATION" -max_len="$(max_len_of "$t")" -rss_limit_mb=2048 \
        -artifact_prefix="$art/" -print_final_stats=1 $(extra_of "$t") $FLAGS \
        "$corpus" "$SEEDS/$t" > "$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    found=$(find "$art" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
    if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
        status=1
        summary+="$t: FINDING (rc $rc, $found artifact(s) in $art, log $log)"$'\n'
        echo "-- $t found something; log tail:"
        grep -E 'ERROR: |FUZZ ORACLE|SUMMARY|Test unit written|==[0-9]+==|#[0-9]+ 0x' "$log" | head -40
    else
        summary+="$t: ok (${execs:-?} execs, ${cov:-cov ?})"$'\n'
    fi
done
echo "== summary"
printf '%s' "$summary"
exit $status
