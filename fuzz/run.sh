#!/usr/bin/env bash
# The libFuzzer targets: a deterministic gate, and open-ended exploration.
#
#   fuzz/run.sh --gate               what scripts/test.sh (.ci/run) runs
#   fuzz/run.sh --explore [SECONDS]  look for new findings, SECONDS per target (default 300)
#   fuzz/run.sh SECONDS              the older form of --explore SECONDS (no
#                                    argument: --explore 300)
#
# Both build the targets with clang + ASan/UBSan in BUILD_DIR and write the
# generated seeds there, then replay every input in fuzz/findings (each once
# made a target fail; each must pass now).
#
# --gate: the same verdict for the same tree on every machine.  Per target,
# libFuzzer runs from a fixed seed for a fixed number of executions
# (-seed=$GATE_SEED -runs=N, N from gate_runs_of below), starting from the
# corpus kept in the tree (fuzz/corpus/<target>/, every input of which it
# replays first) and the generated seeds.  No step is time-boxed: per-input
# timeouts are limits for hangs, far above what an input takes.  The gate
# writes nothing into the tree.
#
# --explore: a random seed, SECONDS per target (FUZZ_FLAGS may add e.g.
# "-fork=2 -ignore_crashes=1" to go on past crashes).  It grows the
# git-ignored scratch corpus fuzz/corpus-<target>/ between runs, and then
#   - saves every crash, leak, timeout or oom input it found, minimized
#     (crashes and leaks, at most FUZZ_MINIMIZE_SECONDS each), as the next
#     $FINDINGS/<target>-N.bin (an input already there is not saved twice):
#     describe each in fuzz/findings/README.md and fix it, the gate replays it;
#   - merges the inputs that found new coverage into fuzz/corpus/<target>/
#     (libFuzzer -merge=1), re-minimized when that grows past
#     CORPUS_MAX_FILES files or CORPUS_MAX_KIB KiB, so that the gate starts
#     from there next time.  Review and commit both.
#
# Environment:
#   FUZZ_TARGETS   targets to run (default: all eight)
#   FUZZ_FLAGS     extra libFuzzer flags for the fuzzing runs (explore; the
#                  gate's verdict holds for none)
#   BUILD_DIR      build directory (default: build-fuzz)
#   FUZZ_FINDINGS_DIR  where --explore saves findings (default: fuzz/findings)
#   FUZZ_MINIMIZE_SECONDS  time to minimize each crash input (default 60; 0: keep it as found)
#   FUZZ_SKIP_KNOWN=1  the harnesses skip inputs that would hit the known
#                  missing-source crash (fuzz/findings), to look past it
#   FUZZ_OP_STRICT=0   fuzz_op: kernel asserts on accepted nodes are not findings
#                  (they are by default)
#
# Crash, leak, timeout and oom inputs land in BUILD_DIR/artifacts/<target>/
# first.  Exit status: 0 when every replay passed and no target found
# anything, 1 otherwise, 2 when the build failed.
set -u -o pipefail

MODE=explore
DURATION=300
case "${1:-}" in
    --gate) MODE=gate ;;
    --explore) DURATION=${2:-300} ;;
    '') ;;
    --help|-h) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *[!0-9]*) echo "usage: fuzz/run.sh --gate | --explore [SECONDS] | SECONDS" >&2; exit 2 ;;
    *) DURATION=$1 ;;
esac
case "$DURATION" in ''|*[!0-9]*) echo "fuzz/run.sh: SECONDS must be a number" >&2; exit 2 ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-fuzz}
TARGETS=${FUZZ_TARGETS:-"fuzz_codec fuzz_inline fuzz_graph fuzz_dispatch fuzz_shm_frame fuzz_stream_frame fuzz_op fuzz_text"}
FLAGS=${FUZZ_FLAGS:-}
FINDINGS=${FUZZ_FINDINGS_DIR:-$ROOT/fuzz/findings}
MINIMIZE_SECONDS=${FUZZ_MINIMIZE_SECONDS:-60}
GATE_SEED=1
CORPUS_MAX_FILES=300
CORPUS_MAX_KIB=1024

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
        fuzz_text) echo 4200 ;;
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
# The gate's executions per target (after replaying the corpus): 10-20 s of
# CPU each on the 2-core machine of 2026-12 (the summary prints each
# target's executions and time).  Counts, not seconds: a slower machine
# takes longer, never decides differently.
gate_runs_of() {
    case $1 in
        fuzz_codec) echo 150000 ;;
        fuzz_inline) echo 150000 ;;
        fuzz_graph) echo 300000 ;;
        fuzz_dispatch) echo 8000 ;;
        fuzz_shm_frame) echo 12000 ;;
        fuzz_stream_frame) echo 8000 ;;
        fuzz_op) echo 1000 ;;
        fuzz_text) echo 200000 ;;
    esac
}

# The gate's libFuzzer flags, for a run that repeats input for input: no
# mutations from compared values (-use_cmp=0: they hold heap and stack
# addresses, which differ by run), no rereading of the output directory on
# a timer (-reload=0), and for the targets that drive the host, coverage by
# edges only (-use_counters=0): how many times some host paths run varies
# from run to run on the same input, and any such difference sends
# libFuzzer down another path.  With these, fuzz_codec and fuzz_inline ran
# the same inputs in every pair of runs measured (2026-12), fuzz_graph,
# fuzz_dispatch and fuzz_op in most (some host path's coverage still varies
# now and then; not found yet), the frame targets in none (their inputs go
# through server threads).  Where they drift apart it is after the replays,
# which are the same everywhere (docs/TESTING.md).
gate_flags_of() {
    case $1 in
        fuzz_codec) echo "-use_cmp=0 -reload=0" ;;
        *) echo "-use_cmp=0 -reload=0 -use_counters=0" ;;
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
stat_of() { grep -o "stat::$2: *[0-9]*" "$1" | grep -o '[0-9]*$' | tail -1; }
cov_of() { grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$1" | tail -1; }

# Regressions first: every input that once found a bug must now pass.  All
# of a target's files in one run; on a failure, each file alone, to name it.
echo "== findings"
mkdir -p "$BUILD/replay"
for t in $TARGETS; do
    files=("$ROOT"/fuzz/findings/"$t"-*.bin)
    [ -e "${files[0]}" ] || continue
    log=$BUILD/replay/$t.log
    # shellcheck disable=SC2046
    if "$(bin_of "$t")" $(extra_of "$t") "${files[@]}" > "$log" 2>&1; then
        summary+="$t: ${#files[@]} finding(s) replayed, all pass"$'\n'
        continue
    fi
    status=1
    for f in "${files[@]}"; do
        flog=$BUILD/replay/$(basename "$f" .bin).log
        # shellcheck disable=SC2046
        if ! "$(bin_of "$t")" $(extra_of "$t") "$f" > "$flog" 2>&1; then
            why=$(grep -m1 -E 'FUZZ ORACLE|ERROR: |GGML_ASSERT|SUMMARY' "$flog" | cut -c1-160)
            summary+="$t: REGRESSION on $(basename "$f"): ${why:-see log} (log $flog)"$'\n'
        fi
    done
done

# Counts the tree's corpus of a target: files, KiB.
corpus_size() { find "$1" -type f | wc -l; }
corpus_kib() { du -sk --apparent-size "$1" | cut -f1; }

gate_target() {
    local t=$1 bin work log rc execs secs t0 n_in
    bin=$(bin_of "$t")
    # Inputs by paths the same on every machine (libFuzzer orders the
    # inputs it loads by size, then path): the tree's corpus and the seeds
    # copied under the target's work dir, which is the working directory.
    work=$BUILD/gate/$t
    rm -rf "$work"
    mkdir -p "$work/new" "$work/in" "$work/artifacts"
    [ -d "$ROOT/fuzz/corpus/$t" ] && cp "$ROOT/fuzz/corpus/$t"/* "$work/in/" 2>/dev/null
    for f in "$SEEDS/$t"/*; do [ -e "$f" ] && cp "$f" "$work/in/seed-$(basename "$f")"; done
    log=$BUILD/$t.log
    n_in=$(corpus_size "$work/in")
    echo "== $t: replay $n_in corpus and seed inputs, then -seed=$GATE_SEED and $(gate_runs_of "$t") more executions"
    t0=$SECONDS
    # -runs counts the replay too
    # shellcheck disable=SC2046,SC2086
    (cd "$work" && "$bin" -seed="$GATE_SEED" -runs="$((n_in + $(gate_runs_of "$t")))" $(gate_flags_of "$t") -max_len="$(max_len_of "$t")" \
        -rss_limit_mb=2048 -artifact_prefix=artifacts/ -print_final_stats=1 $(extra_of "$t") new in) > "$log" 2>&1
    rc=$?
    secs=$((SECONDS - t0))
    execs=$(stat_of "$log" number_of_executed_units)
    if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
        status=1
        summary+="$t: FINDING (rc $rc, input in $work/artifacts, log $log)"$'\n'
        echo "-- $t found something; log tail:"
        grep -E 'ERROR: |FUZZ ORACLE|SUMMARY|Test unit written|==[0-9]+==|#[0-9]+ 0x' "$log" | head -40
    else
        summary+="$t: ok ($n_in inputs replayed, ${execs:-?} execs in all, ${secs}s, $(cov_of "$log"))"$'\n'
    fi
}

# The next free number of a target's findings.
next_finding() {
    local t=$1 n=0 f k
    for f in "$FINDINGS/$t"-*.bin "$ROOT/fuzz/findings/$t"-*.bin; do
        [ -e "$f" ] || continue
        k=${f##*-}; k=${k%.bin}
        case $k in ''|*[!0-9]*) continue ;; esac
        [ "$k" -gt "$n" ] && n=$k
    done
    echo $((n + 1))
}

# Saves an artifact as the next finding, minimized where that applies.
save_finding() {
    local t=$1 art=$2 bin min name f
    bin=$(bin_of "$t")
    for f in "$FINDINGS/$t"-*.bin "$ROOT/fuzz/findings/$t"-*.bin; do
        [ -e "$f" ] && cmp -s "$f" "$art" && { echo "   $(basename "$art"): already $(basename "$f")"; return; }
    done
    min=$art
    case $(basename "$art") in crash-*|leak-*)
        if [ "$MINIMIZE_SECONDS" -gt 0 ]; then
            # shellcheck disable=SC2046
            "$bin" $(extra_of "$t") -minimize_crash=1 -max_total_time="$MINIMIZE_SECONDS" \
                -artifact_prefix="$(dirname "$art")/min-" -exact_artifact_path="$art.min" "$art" > "$art.min.log" 2>&1
            [ -s "$art.min" ] && min=$art.min
        fi ;;
    esac
    mkdir -p "$FINDINGS"
    name=$t-$(next_finding "$t").bin
    cp "$min" "$FINDINGS/$name"
    summary+="$t: NEW FINDING $FINDINGS/$name ($(basename "$art"), $(stat -c %s "$min") bytes)"$'\n'
}

# Merges the scratch corpus's new coverage into the tree's, within bounds.
merge_corpus() {
    local t=$1 scratch=$2 bin dst tmp before
    bin=$(bin_of "$t")
    dst=$ROOT/fuzz/corpus/$t
    mkdir -p "$dst"
    before=$(corpus_size "$dst")
    # shellcheck disable=SC2046
    "$bin" -merge=1 -max_len="$(max_len_of "$t")" $(extra_of "$t") "$dst" "$scratch" > "$BUILD/$t.merge.log" 2>&1
    if [ "$(corpus_size "$dst")" -gt "$CORPUS_MAX_FILES" ] || [ "$(corpus_kib "$dst")" -gt "$CORPUS_MAX_KIB" ]; then
        # Over the bounds: the smallest set with the same coverage
        # (libFuzzer prefers short inputs), and if that is still over, the
        # largest inputs go.
        tmp=$BUILD/$t.corpus-min
        rm -rf "$tmp"; mkdir -p "$tmp"
        # shellcheck disable=SC2046
        "$bin" -merge=1 -max_len="$(max_len_of "$t")" $(extra_of "$t") "$tmp" "$dst" >> "$BUILD/$t.merge.log" 2>&1 &&
            [ -n "$(ls -A "$tmp")" ] && rm -rf "$dst" && mv "$tmp" "$dst"
        while [ "$(corpus_size "$dst")" -gt "$CORPUS_MAX_FILES" ] || [ "$(corpus_kib "$dst")" -gt "$CORPUS_MAX_KIB" ]; do
            rm -f "$(find "$dst" -type f -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2-)"
        done
    fi
    summary+="$t: tree corpus $before -> $(corpus_size "$dst") inputs, $(corpus_kib "$dst") KiB"$'\n'
}

explore_target() {
    local t=$1 bin scratch art log rc execs found a
    bin=$(bin_of "$t")
    scratch=$ROOT/fuzz/corpus-${t#fuzz_}
    art=$BUILD/artifacts/$t
    log=$BUILD/$t.log
    rm -rf "$art"
    mkdir -p "$scratch" "$art" "$ROOT/fuzz/corpus/$t"
    echo "== $t: ${DURATION}s"
    # shellcheck disable=SC2046,SC2086
    "$bin" -max_total_time="$DURATION" -max_len="$(max_len_of "$t")" -rss_limit_mb=2048 \
        -artifact_prefix="$art/" -print_final_stats=1 $(extra_of "$t") $FLAGS \
        "$scratch" "$ROOT/fuzz/corpus/$t" "$SEEDS/$t" > "$log" 2>&1
    rc=$?
    execs=$(stat_of "$log" number_of_executed_units)
    found=$(find "$art" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
    if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
        status=1
        summary+="$t: FINDING (rc $rc, $found artifact(s) in $art, log $log, seed $(grep -m1 -o 'Seed: [0-9]*' "$log" | cut -d' ' -f2))"$'\n'
        echo "-- $t found something; log tail:"
        grep -E 'ERROR: |FUZZ ORACLE|SUMMARY|Test unit written|==[0-9]+==|#[0-9]+ 0x' "$log" | head -40
        for a in $(find "$art" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort); do
            save_finding "$t" "$a"
        done
    else
        summary+="$t: ok (${execs:-?} execs, $(cov_of "$log"))"$'\n'
    fi
    merge_corpus "$t" "$scratch"
}

for t in $TARGETS; do
    if [ "$MODE" = gate ]; then gate_target "$t"; else explore_target "$t"; fi
done
echo "== summary ($MODE)"
printf '%s' "$summary"
exit $status
