#!/usr/bin/env bash
# The GPU benchmark, run on the device machine (one NVIDIA H200) by the
# device tool: builds ggml with CUDA from the carried llama.cpp bundle and
# apir against it, then measures side by side: native CUDA, apir (guest and
# host as separate processes, the guest without CUDA), ggml-rpc.
#
#   bench/h200.sh build        set-up + build (about 5 minutes on 16 cores)
#   bench/h200.sh bench        models + llama-bench ratios + apir-bench + test-backend-ops subset
#   bench/h200.sh quick        1B F16 only, pp512/pp2048/tg128: native, apir, apir without its
#                              host buffer type (APIR_HOST_BUFFER=0); host and guest profiles
#   bench/h200.sh check        tests/test_kept_graph and test_index_checks on CUDA, a CUDA
#                              smoke of the data paths, then 1B F16 pp2048/tg128: native, apir, apir without
#                              queued uploads, and CUDA graphs off on either side;
#                              per-graph host timings of one pp2048 (host log at debug)
#   bench/h200.sh fuzzdev      fuzz_op's nodes on CUDA kernels (apir-fuzz-op-dev, fuzz/dev_driver.c): the kept
#                              corpus, fuzz_op's findings and its constructible seeds, then mutations, for
#                              FUZZDEV_S seconds (default: what is left of the call less 20); findings in $OUT/fuzzdev;
#                              FUZZDEV_CHAIN_S of them (a third by default) in chain mode (-chains: chains
#                              ggml-cuda fuses, sent keyed with use counts), findings in $OUT/fuzzdev-chains
#                              (FUZZ_OP_CHAIN_KINDS=glu,...: only those kinds of chain, docs/TESTING.md);
#                              FUZZDEV_SEED: the same inputs again (the driver has no feedback); each kind's
#                              first input replayed verbose into the log, all of them in $OUT/fuzzdev.tgz
#   bench/h200.sh pp           issue 26 item 3: pp2048 native vs apir vs apir with PP_HOSTB (default
#                              APIR_HOST_STAGE_MB=0, no upload stage), interleaved, 1B F16 and 8B Q4_0;
#                              the hosts' profiles (how long the device idled before each launch); PP_TRACE=1
#                              (default): a host trace and the guest's timeline (APIR_TRACE) of one pp2048 -r 2
#   bench/h200.sh sandbox      the worker sandbox on a CUDA host: --sandbox-log names every syscall it
#                              refuses (test-backend-ops subset + a short llama-bench), then the same
#                              enforcing: counts and tg/pp with the sandbox vs --no-sandbox
#   bench/h200.sh diag         where apir's time goes on the 1B F16 model: native with and without
#                              CUDA fusion, apir with guest and host profiles, per-op host profile,
#                              the guest scheduler's splits, MUL_MAT/FLASH_ATTN_EXT perf APIR0 vs CUDA0
#   bench/h200.sh issue13      issue 13's figures in one call: builds what is missing (set-up, apir, and
#                              also whisper.cpp and llama-server), then `whisper` and `server` below
#                              (ISSUE13_SERVER=0: without llama-server)
#   bench/h200.sh whisper      whisper.cpp, host on CUDA vs native CUDA (bench/whisper_compare.sh); WHISPER_OFF=0
#                              leaves out the apir-off rows, WHISPER_HOSTB=VAR=VAL adds a second host with that
#                              setting (the apir-b rows), WHISPER_GUESTB=VAR=VAL a guest with that setting
#                              on a second plain host (e.g. APIR_GRAPH_DELTA=0), WHISPER_TCP=1 over loopback TCP,
#                              WHISPER_PHASE_S its limit (150 s)
#   bench/h200.sh server       llama-server, 16 concurrent greedy requests on -np 4, through APIR0 vs
#                              natively (bench/server_compare.sh): host on CUDA vs native CUDA (1B F16),
#                              then host on the CPU backend vs native CPU, 8 threads each (1B Q4_0)
#   bench/h200.sh net          issue 17 on one H200: apir over loopback TCP and TLS (NET_TLS=0: not) vs native
#                              CUDA vs ggml-rpc (1B F16, 8B Q4_0, pp2048/tg128 and load), apir-bench over TCP
#                              and TLS (null call, upload/download), a reload of the 8B model against a weight cache;
#                              NET_TCPB=VAR=VAL adds a second TCP host started with that setting (an interleaved A/B;
#                              NET_HOSTB_BIN=PATH: that host is another build's apir-host, e.g. build-old/);
#                              NET_P (pp length, 2048), NET_RPC=0 (no ggml-rpc), NET_PHASE_S (a model's limit, 240 s)
#   bench/h200.sh io           tensor I/O through APIR0 on a CUDA host (issue 16): apir-bench over the Unix
#                              socket, download/native ratio: downloads in pieces that the guest copies out
#                              while the host writes the next (the default), without pieces (APIR_GET_PIECE_KB=0,
#                              the two copies one after the other), each with the guest's copies on one thread
#                              (APIR_COPY_THREADS=1), other piece sizes; a guest profile (MiB copied while the
#                              host wrote); over loopback TCP (the 513 KiB read-back of a token's logits)
#   bench/h200.sh multi        on nvidia-h200-x2 (issue 16): one apir-host --backend CUDA serving both GPUs as
#                              APIR0/APIR1, 8B Q4_0 and 1B F16 -sm layer pp2048/tg128 vs CUDA0/CUDA1, with the
#                              guest's events (llama.cpp's pipeline) and without them (APIR_EVENTS=0); tokens
#   bench/h200.sh netab        apir-bench over TCP and TLS to two hosts, the second with NETAB_ENV (default
#                              APIR_HOST_SEND_PIECE_KB=0), alternated for NETAB_ROUNDS rounds (default 2)
#   bench/h200.sh tcpprof      issue 26 item 1: a token's commands over TCP against the Unix socket (guest profile),
#                              8B tg with downloads in pieces on and off (APIR_HOST_SEND_PIECE_KB=0), interleaved
#                              (TPROF_ROUNDS=0: not); TPROF_TLS=1 over TLS too, with its records' costs each side,
#                              and an A/B of the guest's TLS read thread (APIR_TLS_READ_THREAD) on read-back and tg
#   bench/h200.sh lanes        issue 26 item 1: lanes (APIR_STREAM_LANES) on and off (APIR_HOST_LANES=0), alternated:
#                              apir-bench over TCP and TLS (upload, download, the 513 KiB read-back), then 8B
#                              pp512/tg128 over TCP and TLS (LANES_MIN_KB: the guest's APIR_STREAM_LANE_MIN_KB;
#                              LANES_ROUNDS; LANES_TLS=0)
#   bench/h200.sh many         issue 26 item 4: 1, 4, 16, 64 guests at once through one apir-host --backend CUDA
#                              vs as many native processes (1B Q4_0): wall time, aggregate t/s, memory per
#                              process (host RSS, GPU), time to the first token (bench/many_guests.sh)
#   bench/h200.sh kprof        issue 26 item 3 on the device's side: each kernel's GPU time (ncu) over one llama-bench
#                              prompt natively and through apir (8B Q4_0 pp2048; KPROF_MODELS, KPROF_P)
#   bench/h200.sh fusion       the CUDA rules and the fusion seal on the GPU: index checks, every CUDA finding
#                              replayed on CUDA, test-backend-ops' fusion cases through a CUDA host, 1B F16 tg128
#                              natively and through apir each with and without ggml-cuda's fusion (FUSION_ROUNDS)
#                              (and `faprobe` before those rounds)
#   bench/h200.sh faprobe      flash attention and MUL_MAT at a batch's kernels with an operand off 16 bytes
#                              (tests/probe_layouts.c): natively on CUDA, each case in a process of its own (what
#                              ggml-cuda does: misaligned addresses, wrong results), then through a CUDA host
#                              (flash attention's refused, MUL_MAT's refused or right); also in `fusion`
#   bench/h200.sh net2         on nvidia-h200-x2: two apir-hosts (--device 0, --device 1) over TCP, the 8B
#                              model split by layer across APIR0/APIR1 vs CUDA0/CUDA1: tokens and ratios
# Needs .devcarry/gitRelease.bundle (the pinned llama.cpp, from the npm package); whisper.cpp also
# .devcarry/whisper.cpp-233fe1fc.tar.gz (a copy of ../shared/third_party's, carried: APIR_WHISPER_TARBALL).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export APIR_SKIP_APT=1 APIR_CUDA=1 CUDA_ARCH=90a-real APIR_CACHE=/tmp/apircache
export APIR_BUNDLE=$ROOT/.devcarry/gitRelease.bundle JOBS=$(nproc)
# The device machine builds what the benchmarks need, not the CI's extra programs.
export APIR_SKIP_EXTRAS=1 APIR_SKIP_WHISPER=1
# No registry there: the worker sandbox's libseccomp comes carried (apt-get download).
for deb in "$ROOT"/.devcarry/libseccomp*.deb; do [ -f "$deb" ] && dpkg -x "$deb" /; done
# GnuTLS's headers and pkg-config files (the build needs them; the weight cache links it): the -dev
# packages always, their runtime libraries only where the machine lacks them.
for deb in "$ROOT"/.devcarry/*-dev_*.deb; do
  case $deb in *libseccomp*) ;; *) dpkg -x "$deb" / ;; esac
done
for deb in "$ROOT"/.devcarry/lib*[0-9]_*.deb; do
  lib=$(basename "$deb" | cut -d_ -f1)
  case $lib in libseccomp2) continue;; esac
  dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q installed || dpkg -x "$deb" /
done
# A -dev package's libX.so link names Debian 12's exact soname version; where the machine's own
# runtime library has another, the link dangles and pkg-config's -lX would pick the static archive
# (which then lacks its dependencies): point such links at the library the machine has.
for so in /usr/lib/x86_64-linux-gnu/lib{gnutls,nettle,hogweed,gmp,idn2,p11-kit,tasn1,unistring}.so; do
  [ -L "$so" ] && [ ! -e "$so" ] || continue
  real=$(ls "$so".[0-9]* 2>/dev/null | grep -v '\.a$' | head -1)
  [ -n "$real" ] && ln -sf "$(basename "$real")" "$so"
done
ldconfig 2>/dev/null
export NCCL_NVLS_ENABLE=0
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/h200.log"; }
# Seconds left of one device call (10 minutes; H200_BUDGET_S), for the modes that fit their
# steps into it: phase_timeout MAX prints MAX or what is left less a margin.
left() { echo $(( ${H200_BUDGET_S:-585} - SECONDS )); }
phase_timeout() { local l=$(( $(left) - 15 )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
room() { [ "$(phase_timeout "$1")" -ge 30 ] || { log "skipped: only $(left) s left"; return 1; }; }
# A random-weight model (1b-f16 or 8b-q4_0) in $M, made once.
model() {
  case $1 in
    1b-f16) [ -f $M/$1.gguf ] || build/apir-gguf-gen -o $M/$1.gguf --size 1b --type f16 >/dev/null;;
    8b-q4_0) [ -f $M/$1.gguf ] || build/apir-gguf-gen -o $M/$1.gguf --size 8b --type q4_0 --vocab 128256 >/dev/null;;
  esac
}

case ${1:-all} in
build|all)
  log "setup (ggml + CUDA from the bundle)"
  bash scripts/setup.sh 2>&1 | tee -a "$OUT/h200.log" || { tail -40 "$(ls -d /tmp/apircache/llama-*/ | head -1)"build-*.log >>"$OUT/h200.log"; exit 1; }
  log "apir build"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPIR_VIRGL=OFF >>"$OUT/h200.log" 2>&1 &&
    cmake --build build -j "$JOBS" >>"$OUT/h200.log" 2>&1 || { log "apir build failed"; tail -30 "$OUT/h200.log"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/h200.log"
  build/apir-host --list-devices 2>/dev/null | tee -a "$OUT/h200.log"
  ;;&
bench|all)
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 | tee -a "$OUT/h200.log"
  [ -f $M/8b-q4_0.gguf ] || build/apir-gguf-gen -o $M/8b-q4_0.gguf --size 8b --type q4_0 --vocab 128256 | tee -a "$OUT/h200.log"
  # apir-bench and test-backend-ops against a CUDA host
  build/apir-host --listen unix:/tmp/apir-cuda.sock --backend CUDA --log-level warn >"$OUT/host-cuda.log" 2>&1 &
  hp=$!; sleep 3
  log "apir-bench (host CUDA)"
  build/apir-bench --endpoint unix:/tmp/apir-cuda.sock --frontend build/libggml-apir.so --native CUDA0 --mib 256 2>&1 | grep -v load_backend | tee -a "$OUT/h200.log"
  log "test-backend-ops -b APIR0 (host CUDA) vs the guest's CPU"
  (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-cuda.sock \
     timeout 200 ./test-backend-ops test -b APIR0 -o MUL_MAT,ADD,SOFT_MAX,ROPE,GET_ROWS,CPY,MUL_MAT_ID,SET_ROWS,RMS_NORM \
     >"$OUT/tbo-cuda.log" 2>&1; echo "exit $?" >>"$OUT/tbo-cuda.log")
  grep -E "tests passed|exit" "$OUT/tbo-cuda.log" | tee -a "$OUT/h200.log"
  grep -c "not supported" "$OUT/tbo-cuda.log" | sed 's/^/not supported: /' | tee -a "$OUT/h200.log"
  grep FAIL "$OUT/tbo-cuda.log" | head -5 | tee -a "$OUT/h200.log"
  kill $hp; wait $hp 2>/dev/null
  for m in 1b-f16 8b-q4_0; do
    log "llama-bench $m: native CUDA vs apir vs ggml-rpc (-ngl 99 -fa 1)"
    APIR_GUEST_ENV="CUDA_VISIBLE_DEVICES=" bash bench/llama_bench_compare.sh --model $M/$m.gguf --backend CUDA --fa 1 \
      -p 2048 -n 128 -r ${REPS:-5} --rounds ${ROUNDS:-2} -t 8 2>&1 | tee -a "$OUT/h200.log"
  done
  ;;
quick)
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  build/apir-host --listen unix:/tmp/apir-quick.sock --backend CUDA --log-level info >$OUT/host-quick.log 2>&1 &
  hp=$!; sleep 2
  lb=(-m $M/1b-f16.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3 -o md)
  guest=(env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-quick.sock)
  log "native";  (cd .deps/bin && ./llama-bench "${lb[@]}" 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
  log "apir";    (cd .deps/bin && "${guest[@]}" APIR_PROFILE=1 ./llama-bench "${lb[@]}" -dev APIR0 2>$OUT/guest-quick.err | grep -E '^\| llama' | tee -a "$OUT/h200.log")
  grep 'apir profile' $OUT/guest-quick.err | sort -k7 -n -r | head -8 | tee -a "$OUT/h200.log"
  log "apir, APIR_HOST_BUFFER=0"
  (cd .deps/bin && "${guest[@]}" APIR_HOST_BUFFER=0 ./llama-bench "${lb[@]}" -dev APIR0 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
  kill $hp; wait $hp 2>/dev/null
  grep -E 'page-lock|profile' $OUT/host-quick.log | sed 's/^apir host: info: //' | tee -a "$OUT/h200.log"
  ;;
check)
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  sock=/tmp/apir-check.sock
  guest=(env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:$sock)
  lb=(-m $M/1b-f16.gguf -ngl 99 -fa 1 -p 2048 -n 128 -r 3 -o md)
  host_up() { env "$@" build/apir-host --listen unix:$sock --backend CUDA --log-level ${HOST_LOG:-info} >>$OUT/host-check.log 2>&1 & hp=$!; sleep 2; }
  host_down() { kill $hp; wait $hp 2>/dev/null; }
  rows() { grep -E '^\| llama' | sed 's/ \+/ /g' | tee -a "$OUT/h200.log"; }
  log "kept graphs on CUDA: a key sent again with another graph computes the new one (no replay)"
  APIR_TEST_BACKEND=CUDA build/tests/test_kept_graph 2>&1 | grep -E 'FAIL|want|passed' | tee -a "$OUT/h200.log"
  log "index checks on CUDA (device memory: the upload mirror, read-backs at splits)"
  APIR_TEST_BACKEND=CUDA build/tests/test_index_checks 2>&1 | grep -E 'FAIL|passed' | tee -a "$OUT/h200.log"
  host_up APIR_HOST_ASYNC_UPLOADS=1
  log "smoke: test-backend-ops -b APIR0 (host CUDA), small uploads + graphs"
  (cd .deps/bin && "${guest[@]}" timeout 60 ./test-backend-ops test -b APIR0 -o GET_ROWS,SET_ROWS,ADD,ROPE 2>&1 | grep -E 'tests passed|FAIL' | head -5 | tee -a "$OUT/h200.log")
  log "native";                   (cd .deps/bin && ./llama-bench "${lb[@]}" 2>/dev/null | rows)
  log "apir (queued uploads)";    (cd .deps/bin && "${guest[@]}" ./llama-bench "${lb[@]}" -dev APIR0 2>/dev/null | rows)
  host_down; host_up APIR_HOST_ASYNC_UPLOADS=0
  log "apir, APIR_HOST_ASYNC_UPLOADS=0"; (cd .deps/bin && "${guest[@]}" ./llama-bench "${lb[@]}" -dev APIR0 2>/dev/null | rows)
  host_down; host_up GGML_CUDA_DISABLE_GRAPHS=1
  log "apir, host GGML_CUDA_DISABLE_GRAPHS=1"; (cd .deps/bin && "${guest[@]}" ./llama-bench "${lb[@]}" -dev APIR0 2>/dev/null | rows)
  host_down
  log "native GGML_CUDA_DISABLE_GRAPHS=1"; (cd .deps/bin && GGML_CUDA_DISABLE_GRAPHS=1 ./llama-bench "${lb[@]}" 2>/dev/null | rows)
  HOST_LOG=debug host_up
  log "one pp2048 through apir, host per-graph timings"
  (cd .deps/bin && "${guest[@]}" ./llama-bench -m $M/1b-f16.gguf -ngl 99 -fa 1 -p 2048 -n 0 -r 2 -o md -dev APIR0 2>/dev/null | rows)
  host_down
  grep -E 'piece|warmup|update' $OUT/host-check.log | sed 's/^apir host: debug: //' | tail -24 | tee -a "$OUT/h200.log"
  ;;
fuzzdev)
  seeds=/tmp/fuzzdev-seeds; mkdir -p $seeds
  FUZZ_OP_SEEDS=$seeds build/apir-fuzz-op-dev >/dev/null 2>&1  # the CPU's host writes them
  S=${FUZZDEV_S:-$(( $(left) - 20 ))}
  CS=${FUZZDEV_CHAIN_S:-$(( S / 3 ))}   # the chain-mode pass's share: fused kernels
  seed=${FUZZDEV_SEED:-$RANDOM}
  log "fuzz_op's device path on CUDA for $(( S - CS )) s ($(ls $seeds | wc -l) seeds), seed $seed"
  FUZZ_BACKEND=CUDA build/apir-fuzz-op-dev -seconds "$(( S - CS ))" -timeout 60 -seed $seed \
    -artifacts "$OUT/fuzzdev" fuzz/findings/cuda fuzz/corpus/fuzz_op fuzz/findings/fuzz_op-*.bin $seeds 2>&1 | tee -a "$OUT/h200.log"
  if [ "$CS" -gt 0 ]; then
    # chain mode: its own inputs per kind of chain, the corpus read as chains
    log "fuzz_op's chain mode on CUDA for $CS s (fused kernels), seed $seed"
    FUZZ_BACKEND=CUDA build/apir-fuzz-op-dev -chains -seconds "$CS" -timeout 60 -seed $seed \
      -artifacts "$OUT/fuzzdev-chains" fuzz/corpus/fuzz_op 2>&1 | tee -a "$OUT/h200.log"
  fi
  # Each kind's first input again, alone and verbose (its nodes into the log), then every input
  # found in one tarball: a device call returns only so many files.
  for f in "$OUT"/fuzzdev/finding-*-1.bin; do
    [ -f "$f" ] && [ "$(left)" -gt 30 ] || break
    rm -rf /tmp/fuzzdev-one
    FUZZ_BACKEND=CUDA FUZZ_VERBOSE=1 timeout 25 build/apir-fuzz-op-dev -runs 1 -timeout 20 -artifacts /tmp/fuzzdev-one "$f" \
      >/dev/null 2>&1
    log "$(basename "$f"): $(grep -o 'FUZZ ORACLE.*' /tmp/fuzzdev-one/child.log | head -1 | cut -c1-200)"
    grep -E '^fuzz_op: (#|->)' /tmp/fuzzdev-one/child.log | cut -c1-240 | tee -a "$OUT/h200.log"
  done
  (cd "$OUT" && ls -d fuzzdev fuzzdev-chains 2>/dev/null | xargs -r tar czf fuzzdev.tgz && rm -rf fuzzdev fuzzdev-chains)
  ;;
pp)
  # issue 26 item 3: pp through the Unix socket against native, and an A/B
  # of a host setting (PP_HOSTB, default APIR_HOST_STAGE_MB=0: larger uploads
  # wait for the graph in flight, as before the stage), interleaved
  # (bench/llama_bench_compare.sh --unix-b).  The host's profile lines say
  # how long the device waited for the host: "device: waited for X ms, then
  # idle Y ms before N launches".  PP_MODELS (1b-f16 8b-q4_0), PP_P (2048),
  # PP_N (0; 128 adds tg128), PP_ROUNDS (2), PP_REPS (5).
  M=/tmp/models; mkdir -p $M
  for m in ${PP_MODELS:-1b-f16 8b-q4_0}; do
    room 60 || break
    model $m
    log "pp $m: native vs apir (apirb: ${PP_HOSTB:-APIR_HOST_STAGE_MB=0})"
    APIR_GUEST_ENV="CUDA_VISIBLE_DEVICES=" timeout -k 5 "$(phase_timeout 300)" bash bench/llama_bench_compare.sh \
      --model $M/$m.gguf --backend CUDA --fa 1 -p ${PP_P:-2048} -n ${PP_N:-0} -r ${PP_REPS:-5} --rounds ${PP_ROUNDS:-2} -t 8 \
      --no-rpc --unix-b "${PP_HOSTB:-APIR_HOST_STAGE_MB=0}" 2>&1 | tee -a "$OUT/h200.log"
  done
  # PP_TRACE=1: one pp2048 -r 2 (PP_TRACE_MODEL, 8b-q4_0) with the host at
  # debug (which commands waited for the device, how long it idled before
  # each launch) and the guest's timeline (APIR_TRACE): what the guest did
  # in the device's idle time, e.g. between two prompts (bench/trace_gaps.sh).
  if [ "${PP_TRACE:-1}" = 1 ] && room 40; then
    tm=${PP_TRACE_MODEL:-8b-q4_0}; model $tm
    log "pp trace: $tm pp2048 -r 2, host at debug, guest timeline"
    build/apir-host --listen unix:/tmp/apir-pptrace.sock --backend CUDA --log-level debug >$OUT/host-pptrace.log 2>&1 & hp=$!; sleep 2
    rm -f $OUT/guest-pptrace.txt
    (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-pptrace.sock \
       APIR_TRACE=$OUT/guest-pptrace.txt timeout 90 ./llama-bench -m $M/$tm.gguf -ngl 99 -fa 1 -p 2048 -n 0 -r 2 -o md -dev APIR0 2>/dev/null | grep -E '^\| llama')
    kill $hp; wait $hp 2>/dev/null
    grep -oE '[A-Z_]+ waited [0-9.]+ us for the device' $OUT/host-pptrace.log |
      awk '{ n[$1]++; t[$1] += $3 } END { for (c in n) printf "  %-30s waited %3d times, %9.1f us in all\n", c, n[c], t[c] }' | tee -a "$OUT/h200.log"
    grep -oE '(launch|waited [0-9.]+ us|device idle [0-9.]+ us before)' $OUT/host-pptrace.log | tail -40 | tr '\n' ' ' | fold -w 160 | tee -a "$OUT/h200.log"; echo
    [ -f $OUT/guest-pptrace.txt ] && bash bench/trace_gaps.sh $OUT/guest-pptrace.txt 300 | tail -80 | tee -a "$OUT/h200.log"
  fi
  ;;
diag)
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  D=$OUT/diag; mkdir -p $D
  lb=(-m $M/1b-f16.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o csv)
  brief() { awk -F, 'NR > 1 { gsub(/"/, ""); print ($0 ~ /,512,0,/ ? "pp512" : "tg128"), $(NF-1) }' ; }
  log "native (fusion on)";  (cd .deps/bin && ./llama-bench "${lb[@]}" 2>/dev/null | brief | tee -a "$OUT/h200.log")
  log "native GGML_CUDA_DISABLE_FUSION=1"
  (cd .deps/bin && GGML_CUDA_DISABLE_FUSION=1 ./llama-bench "${lb[@]}" 2>/dev/null | brief | tee -a "$OUT/h200.log")
  for prof in 0 1; do
    APIR_HOST_OP_PROFILE=$prof build/apir-host --listen unix:/tmp/apir-diag.sock --backend CUDA --log-level info >$D/host-$prof.log 2>&1 &
    hp=$!; sleep 2
    if [ $prof = 0 ]; then
      log "apir (guest APIR_PROFILE=1)"
      (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-diag.sock \
        APIR_PROFILE=1 ./llama-bench "${lb[@]}" -dev APIR0 2>$D/guest-prof.err | brief | tee -a "$OUT/h200.log")
      grep 'apir profile' $D/guest-prof.err | sort -k7 -n -r | head -12 | tee -a "$OUT/h200.log"
      log "guest scheduler splits, pp512"
      (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-diag.sock \
        GGML_SCHED_DEBUG=1 ./llama-bench -m $M/1b-f16.gguf -ngl 99 -fa 1 -p 512 -n 0 -r 1 -dev APIR0 >$D/sched.out 2>$D/sched.err)
      grep -c '## SPLIT' $D/sched.err | sed 's/^/split lines: /' | tee -a "$OUT/h200.log"
      grep '## SPLIT' $D/sched.err | sort | uniq -c | sort -rn | head -8 | tee -a "$OUT/h200.log"
    else
      log "apir, host per-op profile (each node alone, synchronized), pp512 r1 + tg32"
      (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-diag.sock \
        ./llama-bench -m $M/1b-f16.gguf -ngl 99 -fa 1 -p 512 -n 32 -r 1 -dev APIR0 >/dev/null 2>&1)
    fi
    kill $hp; wait $hp 2>/dev/null
    grep 'profile' $D/host-$prof.log | sed 's/^apir host: info: //' | tee -a "$OUT/h200.log"
  done
  build/apir-host --listen unix:/tmp/apir-diag.sock --backend CUDA --log-level warn >$D/host-perf.log 2>&1 &
  hp=$!; sleep 2
  for op in "MUL_MAT|type_a=f16,type_b=f32,m=4096,n=512" "FLASH_ATTN_EXT|hsk=128,hsv=128,nh=32"; do
    o=${op%%|*} p=${op#*|}
    for b in CUDA0 APIR0; do
      log "test-backend-ops perf -o $o -p $p -b $b"
      (cd .deps/bin && GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-diag.sock \
        timeout 60 ./test-backend-ops perf -o $o -p "$p" -b $b 2>&1 | grep -E 'us/run|GFLOPS|TFLOPS' | head -6 | tee -a "$OUT/h200.log")
    done
  done
  kill $hp; wait $hp 2>/dev/null
  ;;
sandbox)
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  guest=(env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-sb.sock)
  tbo_ops=MUL_MAT,SOFT_MAX,ROPE,GET_ROWS,CPY,SET_ROWS,RMS_NORM,MUL_MAT_ID
  run_sandbox_case() { # name, with_tbo (0/1), host options...
    local name=$1 tbo=$2; shift 2
    build/apir-host --listen unix:/tmp/apir-sb.sock --backend CUDA --log-level info "$@" >"$OUT/host-$name.log" 2>&1 &
    local hp=$!; sleep 3
    log "sandbox $name ($*): llama-bench 1B F16 -p 512 -n 64"
    (cd .deps/bin && "${guest[@]}" timeout 90 ./llama-bench -m $M/1b-f16.gguf -ngl 99 -fa 1 -p 512 -n 64 -r 2 -dev APIR0 2>&1 | grep -E '^\| llama|error|failed' | tee -a "$OUT/h200.log")
    if [ "$tbo" = 1 ]; then
      log "sandbox $name: test-backend-ops -b APIR0 -o $tbo_ops"
      (cd .deps/bin && "${guest[@]}" timeout 150 ./test-backend-ops test -b APIR0 -o $tbo_ops >"$OUT/tbo-$name.log" 2>&1; echo "exit $?" >>"$OUT/tbo-$name.log")
      grep -E "tests passed|exit" "$OUT/tbo-$name.log" | tail -3 | tee -a "$OUT/h200.log"
    fi
    kill $hp; wait $hp 2>/dev/null
    grep -o 'refused syscall [a-z0-9_?]* ([0-9]*)' "$OUT/host-$name.log" | sort | uniq -c | sort -rn | tee -a "$OUT/h200.log"
    grep -iE 'sandbox:|died|error' "$OUT/host-$name.log" | sort | uniq -c | head -8 | tee -a "$OUT/h200.log"
  }
  # Log rounds: each names what it refused; the next allows it, until none is left.
  allow=""
  for round in 1 2 3; do
    run_sandbox_case log$round 0 --sandbox-log ${allow:+--sandbox-allow "$allow"}
    found=$(grep -o 'refused syscall [a-z0-9_]* (' "$OUT/host-log$round.log" | awk '{print $3}' | sort -u | paste -sd, -)
    log "round $round refused: ${found:-none}"
    [ -n "$found" ] || break
    allow=$(echo "$allow,$found" | tr , '\n' | grep -v '^$' | sort -u | paste -sd, -)
  done
  log "allowed beyond the GPU set: ${allow:-none}"
  run_sandbox_case enforce 1 ${allow:+--sandbox-allow "$allow"}
  run_sandbox_case none 0 --no-sandbox
  ;;
issue13)
  # Build what is missing: the pinned ggml with CUDA (setup's main stage), then at once
  # whisper.cpp (setup's whisper stage), llama-server (the main build folder reconfigured with
  # LLAMA_BUILD_SERVER=ON, that one target: setup's extras build ten more) and apir.
  export APIR_WHISPER_TARBALL=${APIR_WHISPER_TARBALL:-$ROOT/.devcarry/whisper.cpp-233fe1fc.tar.gz}
  if [ ! -e .deps/stamp ]; then
    log "setup (ggml + CUDA from the bundle)"
    bash scripts/setup.sh >>"$OUT/h200.log" 2>&1 || { log "setup failed"; tail -40 "$(ls -d /tmp/apircache/llama-*/ | head -1)"build-*.log >>"$OUT/h200.log"; exit 1; }
  fi
  log "whisper.cpp, llama-server and apir, built side by side"
  : >"$OUT/setup-whisper.log"
  APIR_SKIP_WHISPER=0 bash scripts/setup.sh >"$OUT/setup-whisper.log" 2>&1 & wp=$!
  # setup copies ggml's private headers first: the apir build starts once that is done.
  for _ in $(seq 1 300); do grep -q 'build present' "$OUT/setup-whisper.log" && break; kill -0 $wp 2>/dev/null || break; sleep 0.1; done
  (
    [ -x .deps/bin/llama-server ] || [ "${ISSUE13_SERVER:-1}" = 0 ] && exit 0
    # The folder's own path, not through the .deps link: another path rebuilds all of ggml.
    b=$(readlink -f .deps)/build
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$b/CMakeCache.txt")
    cmake -S "$src" -B "$b" -DLLAMA_BUILD_SERVER=ON >/dev/null &&
      cmake --build "$b" -j "$JOBS" --target llama-server &&
      cp -af "$b/bin/llama-server" .deps/bin/ && cp -an "$b/bin/"lib*.so* .deps/bin/
  ) >"$OUT/server-build.log" 2>&1 & sbp=$!
  t0=$SECONDS
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPIR_VIRGL=OFF >>"$OUT/h200.log" 2>&1 &&
    cmake --build build -j "$JOBS" >>"$OUT/h200.log" 2>&1 || { log "apir build failed"; tail -30 "$OUT/h200.log"; exit 1; }
  log "apir built in $((SECONDS - t0)) s"
  wait $wp || { log "whisper.cpp build failed"; tail -20 "$OUT/setup-whisper.log" | tee -a "$OUT/h200.log"; }
  wait $sbp || { log "llama-server build failed"; tail -20 "$OUT/server-build.log" | tee -a "$OUT/h200.log"; }
  log "builds done after $((SECONDS - t0)) s; $(left) s left"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/h200.log"
  ;;&
issue13|whisper)
  # whisper.cpp: random-weight tiny model, jfk.wav; host apir-host on CUDA, guest without CUDA.
  if [ -x .whisper/bin/whisper-cli ] && room 150; then
    log "whisper.cpp through APIR0 (host CUDA) vs native CUDA"
    timeout -k 5 "$(phase_timeout "${WHISPER_PHASE_S:-150}")" bash bench/whisper_compare.sh --backend CUDA --threads 4 \
      --rounds "${ROUNDS:-3}" $([ "${WHISPER_OFF:-1}" = 0 ] && echo --no-off) \
      $([ -n "${WHISPER_HOSTB:-}" ] && echo --host-b "$WHISPER_HOSTB") \
      $([ -n "${WHISPER_GUESTB:-}" ] && echo --guest-b "$WHISPER_GUESTB") $([ "${WHISPER_TCP:-0}" = 1 ] && echo --tcp) \
      2>&1 | tee -a "$OUT/h200.log"
  elif [ ! -x .whisper/bin/whisper-cli ]; then
    log "no .whisper/bin/whisper-cli: whisper.cpp skipped"
  fi
  ;;&
issue13|server)
  # llama-server: 16 concurrent greedy requests on 4 slots; CUDA first (short), then the CPU backend.
  if [ -x .deps/bin/llama-server ]; then
    log "llama-server through APIR0 (host CUDA) vs native CUDA, 1B F16"
    room 150 && timeout -k 5 "$(phase_timeout 150)" bash bench/server_compare.sh --backend CUDA --threads 8 --size 1b --type f16 \
      --rounds "${ROUNDS:-3}" --n-predict 128 2>&1 | tee -a "$OUT/h200.log"
    log "llama-server through APIR0 (host CPU, --threads 8) vs native CPU (-t 8), 1B Q4_0; $(left) s left"
    room 240 && timeout -k 5 "$(phase_timeout 240)" bash bench/server_compare.sh --backend CPU --threads 8 --size 1b --type q4_0 \
      --rounds "${ROUNDS:-3}" --n-predict 64 2>&1 | tee -a "$OUT/h200.log"
  else
    log "no .deps/bin/llama-server: llama-server skipped"
  fi
  log "done, $(left) s left"
  ;;
net)
  M=/tmp/models; mkdir -p $M
  # NET_PARTS picks the steps (a device call is 10 minutes; after a build, split them over two calls),
  # and the models made for them (the 8B one takes two minutes).
  parts=" ${NET_PARTS:-bench 1b-f16 8b-q4_0 wcache} "
  [[ $parts == *" 1b-f16 "* ]] && [ ! -f $M/1b-f16.gguf ] && build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  [[ $parts == *" 8b-q4_0 "* || $parts == *" wcache "* ]] && [ ! -f $M/8b-q4_0.gguf ] &&
    build/apir-gguf-gen -o $M/8b-q4_0.gguf --size 8b --type q4_0 --vocab 128256 >/dev/null
  if [[ $parts == *" bench "* ]]; then
  (umask 077; echo "bench:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >/tmp/apir-net.psk)
  build/apir-host --listen unix:/tmp/apir-net.sock --listen tcp:127.0.0.1:0 --listen tls:127.0.0.1:0 \
    --tls-psk-file /tmp/apir-net.psk --backend CUDA --log-level info >"$OUT/host-net.log" 2>&1 &
  hp=$!; sleep 3
  ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-net.log" | head -1 | cut -d' ' -f2)
  tls_ep=$(grep -o 'serving tls:127\.0\.0\.1:[0-9]*' "$OUT/host-net.log" | head -1 | cut -d' ' -f2)
  log "apir-bench over $ep (host CUDA), over $tls_ep, then over the Unix socket"
  build/apir-bench --endpoint "$ep" --frontend build/libggml-apir.so --native CUDA0 --mib 256 2>&1 | grep -v load_backend | tee -a "$OUT/h200.log"
  APIR_TLS_PSK_FILE=/tmp/apir-net.psk build/apir-bench --endpoint "$tls_ep" --frontend build/libggml-apir.so --native CUDA0 \
    --mib 256 2>&1 | grep -v load_backend | tee -a "$OUT/h200.log"
  build/apir-bench --endpoint unix:/tmp/apir-net.sock --frontend build/libggml-apir.so --native CUDA0 --mib 256 2>&1 | grep -v load_backend | tee -a "$OUT/h200.log"
  kill $hp; wait $hp 2>/dev/null
  if [ -n "${NET_TCPB:-}" ]; then
    # The A/B of a host setting (NET_TCPB=VAR=VAL): apir-bench over TCP to a host started with it.
    env "$NET_TCPB" build/apir-host --listen unix:/tmp/apir-netb.sock --listen tcp:127.0.0.1:0 --backend CUDA --log-level info >"$OUT/host-netb.log" 2>&1 &
    hp=$!; sleep 3
    ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-netb.log" | head -1 | cut -d' ' -f2)
    log "apir-bench over $ep, host with $NET_TCPB"
    build/apir-bench --endpoint "$ep" --frontend build/libggml-apir.so --native CUDA0 --mib 256 2>&1 | grep -v load_backend | tee -a "$OUT/h200.log"
    kill $hp; wait $hp 2>/dev/null
  fi
  fi
  for m in 1b-f16 8b-q4_0; do
    [[ $parts == *" $m "* ]] || continue
    log "llama-bench $m: native CUDA vs apir (unix) vs apir over TCP vs ggml-rpc (-ngl 99 -fa 1); $(left) s left"
    room 120 && APIR_GUEST_ENV="CUDA_VISIBLE_DEVICES=" timeout -k 5 "$(phase_timeout "${NET_PHASE_S:-240}")" bash bench/llama_bench_compare.sh \
      --model $M/$m.gguf --backend CUDA --fa 1 -p "${NET_P:-2048}" -n 128 -r ${REPS:-3} --rounds ${ROUNDS:-1} -t 8 --tcp \
      $([ "${NET_TLS:-1}" = 1 ] && echo --tls) $([ -n "${NET_TCPB:-}" ] && echo --tcp-b "$NET_TCPB") \
      $([ -n "${NET_HOSTB_BIN:-}" ] && echo --host-b-bin "$NET_HOSTB_BIN") \
      $([ "${NET_RPC:-1}" = 0 ] && echo --no-rpc) 2>&1 | tee -a "$OUT/h200.log"
  done
  [[ $parts == *" wcache "* ]] || { log "done, $(left) s left"; exit 0; }
  log "8B Q4_0 loaded twice over TCP against a host with --weight-cache (first: misses and stores; then hits); $(left) s left"
  rm -rf /tmp/wcache; mkdir -m 700 /tmp/wcache
  build/apir-host --listen unix:/tmp/apir-wc.sock --listen tcp:127.0.0.1:0 --backend CUDA --weight-cache /tmp/wcache \
    --log-level info >"$OUT/host-wc.log" 2>&1 &
  hp=$!; sleep 3
  ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-wc.log" | head -1 | cut -d' ' -f2)
  for i in 1 2; do
    room 60 && (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=$ep \
      APIR_LOAD_NO_WARMUP=1 timeout "$(phase_timeout 150)" "$ROOT/build/apir-load-bench" -m $M/8b-q4_0.gguf -d APIR0 -r 1) 2>&1 \
      | grep '^load' | sed "s/^/load $i over TCP (weight cache): /" | tee -a "$OUT/h200.log"
  done
  kill $hp; wait $hp 2>/dev/null
  grep -E 'weight cache|hits' "$OUT/host-wc.log" | tail -4 | tee -a "$OUT/h200.log"
  log "done, $(left) s left"
  ;;
io)
  build/apir-host --listen unix:/tmp/apir-io.sock --listen tcp:127.0.0.1:0 --backend CUDA --log-level info \
    >"$OUT/host-io.log" 2>&1 &
  hp=$!; sleep 3
  ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-io.log" | head -1 | cut -d' ' -f2)
  for round in 1 2; do
    for mode in default APIR_GET_PIECE_KB=0 APIR_COPY_THREADS=1 "APIR_GET_PIECE_KB=0 APIR_COPY_THREADS=1" \
                APIR_GET_PIECE_KB=2048 APIR_GET_PIECE_KB=8192; do
      log "apir-bench, Unix socket, $mode (round $round)"
      ( [ "$mode" = default ] || export $mode
        build/apir-bench --endpoint unix:/tmp/apir-io.sock --frontend build/libggml-apir.so --native CUDA0 --mib 256 \
          --calls 20000 2>&1 | grep -E '^tensor' | tee -a "$OUT/h200.log" )
    done
  done
  log "apir-bench, Unix socket, guest profile (downloads: MiB copied while the host wrote)"
  APIR_PROFILE=1 build/apir-bench --endpoint unix:/tmp/apir-io.sock --frontend build/libggml-apir.so --native CUDA0 \
    --mib 256 --calls 1000 2>&1 | grep -E '^tensor (up|down)|data area|GET_TENSOR' | tee -a "$OUT/h200.log"
  log "apir-bench over $ep"
  build/apir-bench --endpoint "$ep" --frontend build/libggml-apir.so --native CUDA0 --mib 256 --calls 20000 2>&1 \
    | grep -E '^(null|tensor)' | tee -a "$OUT/h200.log"
  kill $hp; wait $hp 2>/dev/null
  ;;
multi)
  M=/tmp/models; mkdir -p $M
  [ -f $M/8b-q4_0.gguf ] || build/apir-gguf-gen -o $M/8b-q4_0.gguf --size 8b --type q4_0 --vocab 128256 >/dev/null
  [ -f $M/1b-f16.gguf ] || build/apir-gguf-gen -o $M/1b-f16.gguf --size 1b --type f16 >/dev/null
  nvidia-smi -L | tee -a "$OUT/h200.log"
  build/apir-host --listen unix:/tmp/apir-multi.sock --backend CUDA --log-level info >"$OUT/host-multi.log" 2>&1 &
  hp=$!
  sleep 3
  guest=(env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-multi.sock)
  log "greedy decode, 8B Q4_0 split by layer, a 600-token prompt in 128-token micro-batches: CUDA0,CUDA1 vs APIR0,APIR1"
  ids=$(seq -s, 1 600)
  build/tests/apir-llama-greedy -m $M/8b-q4_0.gguf -d CUDA0,CUDA1 -n 32 -t 8 -u 128 --prompt-ids "$ids" \
    --dump-logits /tmp/native.bin 2>/dev/null | grep tokens: | tee -a "$OUT/h200.log"
  "${guest[@]}" build/tests/apir-llama-greedy -m $M/8b-q4_0.gguf -d APIR0,APIR1 -n 32 -t 8 -u 128 --prompt-ids "$ids" \
    --dump-logits /tmp/apir.bin -v 2>/tmp/apir-greedy.err | grep tokens: | tee -a "$OUT/h200.log"
  grep -m1 'pipeline parallelism' /tmp/apir-greedy.err | tee -a "$OUT/h200.log"
  build/tests/apir-llama-greedy --compare /tmp/native.bin /tmp/apir.bin --tol 1e-2 2>&1 | tail -3 | tee -a "$OUT/h200.log"
  for model in 8b-q4_0 1b-f16; do
    lb=(-m $M/$model.gguf -ngl 99 -fa 1 -sm layer -p 2048 -n 128 -r ${REPS:-3} -o md)
    log "llama-bench $model -sm layer: native CUDA0/CUDA1, APIR0/APIR1 with events, APIR0/APIR1 without; $(left) s left"
    room 60 && (cd .deps/bin && timeout "$(phase_timeout 120)" ./llama-bench "${lb[@]}" -dev CUDA0/CUDA1 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
    room 60 && (cd .deps/bin && timeout "$(phase_timeout 120)" "${guest[@]}" ./llama-bench "${lb[@]}" -dev APIR0/APIR1 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
    room 60 && (cd .deps/bin && timeout "$(phase_timeout 120)" "${guest[@]}" APIR_EVENTS=0 ./llama-bench "${lb[@]}" -dev APIR0/APIR1 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
  done
  kill $hp; wait 2>/dev/null
  log "done, $(left) s left"
  ;;
net2)
  M=/tmp/models; mkdir -p $M
  [ -f $M/8b-q4_0.gguf ] || build/apir-gguf-gen -o $M/8b-q4_0.gguf --size 8b --type q4_0 --vocab 128256 >/dev/null
  nvidia-smi -L | tee -a "$OUT/h200.log"
  hps=()
  for d in 0 1; do
    build/apir-host --listen unix:/tmp/apir-d$d.sock --listen tcp:127.0.0.1:0 --backend CUDA --device $d --log-level info \
      >"$OUT/host-d$d.log" 2>&1 &
    hps+=($!)
  done
  sleep 4
  e0=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-d0.log" | head -1 | cut -d' ' -f2)
  e1=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-d1.log" | head -1 | cut -d' ' -f2)
  guest=(env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=$e0,$e1)
  log "greedy decode, 8B Q4_0 split by layer: CUDA0,CUDA1 natively vs APIR0,APIR1 (two hosts over TCP)"
  build/tests/apir-llama-greedy -m $M/8b-q4_0.gguf -d CUDA0,CUDA1 -n 32 -t 8 --dump-logits /tmp/native.bin 2>/dev/null | grep tokens: | tee -a "$OUT/h200.log"
  "${guest[@]}" build/tests/apir-llama-greedy -m $M/8b-q4_0.gguf -d APIR0,APIR1 -n 32 -t 8 --dump-logits /tmp/apir.bin 2>/dev/null | grep tokens: | tee -a "$OUT/h200.log"
  build/tests/apir-llama-greedy --compare /tmp/native.bin /tmp/apir.bin --tol 1e-2 2>&1 | tail -3 | tee -a "$OUT/h200.log"
  lb=(-m $M/8b-q4_0.gguf -ngl 99 -fa 1 -sm layer -p 2048 -n 128 -r ${REPS:-3} -o md)
  for round in 1 2; do
    log "llama-bench 8B Q4_0 -sm layer, round $round: native CUDA0/CUDA1, then APIR0/APIR1 over TCP; $(left) s left"
    room 90 && (cd .deps/bin && timeout "$(phase_timeout 150)" ./llama-bench "${lb[@]}" -dev CUDA0/CUDA1 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
    room 90 && (cd .deps/bin && timeout "$(phase_timeout 150)" "${guest[@]}" ./llama-bench "${lb[@]}" -dev APIR0/APIR1 2>/dev/null | grep -E '^\| llama' | tee -a "$OUT/h200.log")
  done
  kill "${hps[@]}"; wait 2>/dev/null
  log "done, $(left) s left"
  ;;
netab)
  # apir-bench over TCP and TLS to two hosts, the second started with NETAB_ENV (default
  # APIR_HOST_SEND_PIECE_KB=0: downloads after the whole copy), alternated for NETAB_ROUNDS rounds.
  (umask 077; echo "bench:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >/tmp/apir-ab.psk)
  # Each its own Unix socket: without one both would claim the default, and the second refuse to start.
  build/apir-host --listen unix:/tmp/apir-ab-a.sock --listen tcp:127.0.0.1:0 --listen tls:127.0.0.1:0 \
    --tls-psk-file /tmp/apir-ab.psk --backend CUDA --log-level info >"$OUT/host-a.log" 2>&1 &
  hpa=$!
  env "${NETAB_ENV:-APIR_HOST_SEND_PIECE_KB=0}" build/apir-host --listen unix:/tmp/apir-ab-b.sock --listen tcp:127.0.0.1:0 \
    --listen tls:127.0.0.1:0 --tls-psk-file /tmp/apir-ab.psk --backend CUDA --log-level info >"$OUT/host-b.log" 2>&1 &
  hpb=$!; sleep 4
  for round in $(seq 1 "${NETAB_ROUNDS:-2}"); do
    for h in a b; do
      for proto in tcp tls; do
        e=$(grep -o "serving $proto:127\.0\.0\.1:[0-9]*" "$OUT/host-$h.log" | head -1 | cut -d' ' -f2)
        [ -n "$e" ] || { log "host $h does not serve $proto: $(tail -1 "$OUT/host-$h.log")"; continue; }
        label="host $h$([ $h = b ] && echo " (${NETAB_ENV:-APIR_HOST_SEND_PIECE_KB=0})"), $proto, round $round"
        room 40 && APIR_TLS_PSK_FILE=/tmp/apir-ab.psk timeout "$(phase_timeout 60)" build/apir-bench --endpoint "$e" \
          --frontend build/libggml-apir.so --native CUDA0 --mib 128 --calls 20000 2>&1 | grep -E '^(null|tensor|WRONG)' \
          | sed "s/^/$label: /" | tee -a "$OUT/h200.log"
      done
    done
  done
  kill $hpa $hpb; wait $hpa $hpb 2>/dev/null
  log "done, $(left) s left"
  ;;
lanes)
  # Issue 26 item 1, lanes (transport/lanes.c): apir-bench over TCP and TLS against a host with
  # lanes and one without (APIR_HOST_LANES=0), alternated LANES_ROUNDS rounds (default 2); then
  # 8B Q4_0 pp512/tg128 over TCP and TLS to both (the tcp/tcpb and tls/tlsb columns; LANES_TLS=0:
  # TCP only), interleaved, the guest splitting payloads from LANES_MIN_KB (its
  # APIR_STREAM_LANE_MIN_KB; unset: the guest's defaults, 1024 over TCP and 256 over TLS, where a
  # token's 513 KB of logits go over lanes).  LANES_NETAB=0 leaves out apir-bench.  After `build`,
  # about 400 s.
  [ "${LANES_NETAB:-1}" = 1 ] && H200_BUDGET_S=$(left) NETAB_ENV=APIR_HOST_LANES=0 NETAB_ROUNDS=${LANES_ROUNDS:-2} bash "$0" netab
  env ${LANES_MIN_KB:+APIR_STREAM_LANE_MIN_KB=$LANES_MIN_KB} H200_BUDGET_S=$(left) NET_PARTS=8b-q4_0 NET_TCPB=APIR_HOST_LANES=0 \
    NET_TLS=${LANES_TLS:-1} NET_RPC=0 NET_P=512 NET_PHASE_S=${LANES_PHASE_S:-300} ROUNDS=${LANES_ROUNDS:-2} REPS=3 \
    bash "$0" net
  log "done, $(left) s left"
  ;;
tcpprof)
  # Where a token's time goes over TCP (issue 26 item 1): 8B Q4_0 tg through the Unix socket and
  # over loopback TCP with the guest's per-command profile (APIR_PROFILE=1: count and mean round
  # trip of each command), then an interleaved A/B of downloads in pieces (APIR_HOST_SEND_PIECE_KB)
  # on the tg rate, TPROF_ROUNDS rounds (default 3).
  M=/tmp/models; mkdir -p $M
  [ -f $M/8b-q4_0.gguf ] || build/apir-gguf-gen -o $M/8b-q4_0.gguf --size 8b --type q4_0 --vocab 128256 >/dev/null
  (umask 077; echo "prof:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >/tmp/apir-prof.psk)
  build/apir-host --listen unix:/tmp/apir-prof.sock --listen tcp:127.0.0.1:0 --listen tls:127.0.0.1:0 \
    --tls-psk-file /tmp/apir-prof.psk --backend CUDA --log-level info >"$OUT/host-prof.log" 2>&1 &
  hp=$!; sleep 3
  ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$OUT/host-prof.log" | head -1 | cut -d' ' -f2)
  tls_ep=$(grep -o 'serving tls:127\.0\.0\.1:[0-9]*' "$OUT/host-prof.log" | head -1 | cut -d' ' -f2)
  # TPROF_TLS=1: over loopback TLS too, with what its records cost each side (the guest's "tls:"
  # profile line, the host's "profile: tls:" log line); then TPROF_TLS_ROUNDS rounds (default 2)
  # of an A/B of the guest's read thread (APIR_TLS_READ_THREAD=1, =0): apir-bench's 513 KiB
  # read-back and downloads, and tg128 over TCP and TLS with and without it, interleaved.
  # TPROF_EPS: the profile legs (default "unix tcp", plus tls with TPROF_TLS=1).
  declare -A epof=([unix]=unix:/tmp/apir-prof.sock [tcp]=$ep [tls]=$tls_ep)
  legs="${TPROF_EPS:-unix tcp}"; [ "${TPROF_TLS:-0}" = 1 ] && [[ " $legs " != *" tls "* ]] && legs="$legs tls"
  tg_apir() {  # tg128 through endpoint $1 with the guest environment in the rest
    local e=$1; shift
    (cd .deps/bin && env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=$e \
      APIR_TLS_PSK_FILE=/tmp/apir-prof.psk "$@" timeout "$(phase_timeout 90)" ./llama-bench \
      -m $M/8b-q4_0.gguf -p 0 -n 128 -r 3 -fa 1 -ngl 99 -dev APIR0 -o md) 2>&1
  }
  for l in $legs; do
    log "8B tg128 through ${epof[$l]}, guest profile"
    room 40 && tg_apir "${epof[$l]}" APIR_PROFILE=1 | grep -vE 'load_backend|^ggml_|^llama_|^$' | tail -23 \
      | tee -a "$OUT/h200.log"
  done
  if [ "${TPROF_TLS:-0}" = 1 ]; then
    for round in $(seq "${TPROF_TLS_ROUNDS:-2}"); do
      for rt in 1 0; do
        log "round $round: apir-bench over $tls_ep, APIR_TLS_READ_THREAD=$rt"
        room 40 && APIR_TLS_READ_THREAD=$rt APIR_TLS_PSK_FILE=/tmp/apir-prof.psk APIR_PROFILE=1 \
          timeout "$(phase_timeout 60)" build/apir-bench --endpoint "$tls_ep" --frontend build/libggml-apir.so \
          --mib 64 --calls 200 2>&1 | grep -E 'tensor|tls:' | tee -a "$OUT/h200.log"
      done
      for leg in tcp tls1 tls0; do
        e=$ep; [ "$leg" != tcp ] && e=$tls_ep
        log "round $round: 8B tg128 $leg"
        room 40 && tg_apir "$e" APIR_TLS_READ_THREAD=${leg#tls} | grep -E '^\|.*tg128' | tee -a "$OUT/h200.log"
      done
    done
  fi
  kill $hp; wait $hp 2>/dev/null
  grep 'profile: tls:' "$OUT/host-prof.log" | tee -a "$OUT/h200.log"
  log "8B tg128, downloads in pieces on (tcp) and off (tcpb), ${TPROF_ROUNDS:-3} rounds; $(left) s left"
  [ "${TPROF_ROUNDS:-3}" != 0 ] && room 120 && APIR_GUEST_ENV="CUDA_VISIBLE_DEVICES=" timeout -k 5 "$(phase_timeout 400)" bash bench/llama_bench_compare.sh \
    --model $M/8b-q4_0.gguf --backend CUDA --fa 1 -p 512 -n 128 -r 3 --rounds "${TPROF_ROUNDS:-3}" -t 8 --tcp --no-rpc \
    --tcp-b APIR_HOST_SEND_PIECE_KB=0 2>&1 | grep -vE '^  \[guest' | tee -a "$OUT/h200.log"
  log "done, $(left) s left"
  ;;
many)
  # Issue 26 item 4: N = 1, 4, 16, 64 llama-bench processes at once through one apir-host
  # --backend CUDA against N native ones (a 1B Q4_0 model: 64 copies fit), with the time to a
  # first token and each process's memory (bench/many_guests.sh).
  M=/tmp/models; mkdir -p $M
  [ -f $M/1b-q4_0.gguf ] || build/apir-gguf-gen -o $M/1b-q4_0.gguf --size 1b --type q4_0 >/dev/null
  log "many guests on one H200 (1B Q4_0, llama-bench -p 256 -n 64 -t 2 each)"
  BUILD=$ROOT/build DEPS_BIN=$ROOT/.deps/bin timeout "$(phase_timeout 540)" bash bench/many_guests.sh --backend CUDA \
    --model $M/1b-q4_0.gguf --n "${MANY_N:-1 4 16 64}" -p 256 -n 64 -t 2 2>&1 | tee -a "$OUT/h200.log"
  log "done, $(left) s left"
  ;;
kprof)
  # Issue 26 item 3, the device's side: every kernel's time on the GPU over one llama-bench
  # prompt (-p KPROF_P, 2048; -r 1 after its warm-up), natively and through apir, from Nsight
  # Compute (one metric, gpu__time_duration; clocks left alone).  ncu runs each kernel alone,
  # so this says whether apir makes the device do more or other work, not how long it idles.
  # The host serves its guest in its own process here (--isolation thread): ncu's injected
  # library talks to its front end over a socket, which a worker's sandbox refuses.  Raw CSVs in
  # $OUT/kprof-*.csv.gz, per-kernel totals in the log; the scheduler's splits (GGML_SCHED_DEBUG) in
  # kprof-*.err.  KPROF_MODELS (8b-q4_0).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] || { log "no ncu on this machine"; exit 1; }
  M=/tmp/models; mkdir -p $M
  ncu_args=(--clock-control none --metrics gpu__time_duration.sum --print-kernel-base function --csv --page raw)
  # The guest's scheduler splits (GGML_SCHED_DEBUG, llama-bench -v) in a stderr file: counts, then each kind.
  splits() {
    echo "  scheduler: $(grep -c '## SPLIT' "$1") split lines, $(grep -c '^## SPLIT #0' "$1") graphs"
    grep -h '^## SPLIT' "$1" | sed 's/: *\([^ ]*\) # \([0-9]*\) inputs.*/: \1, \2 inputs/' | sort | uniq -c | sed 's/^/   /'
  }
  # Columns of --page raw: quoted; the kernel's name and the duration (ns, or us: the units row says).
  kern_sum() {
    awk -F'","' 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /Kernel Name/) k = i; if ($i ~ /gpu__time_duration/) d = i } next }
      NR == 2 { u = $d; next }
      k && d { v = $d; gsub(/[",]/, "", v); if (u ~ /usecond/) v *= 1000; else if (u ~ /msecond/) v *= 1e6;
               n[$k]++; t[$k] += v; all += v; cnt++ }
      END { printf "  %d kernels, %.3f ms on the device\n", cnt, all / 1e6;
            for (x in n) printf "  %10.3f ms %6d  %s\n", t[x] / 1e6, n[x], x }' "$1" | sort -k1,1 -r -g | head -${KPROF_TOP:-18}
  }
  for m in ${KPROF_MODELS:-8b-q4_0}; do
    model $m
    lb=(-m $M/$m.gguf -ngl 99 -fa 1 -p "${KPROF_P:-2048}" -n 0 -r 1 -o md -v)  # -v: the scheduler's debug lines
    room 60 || break
    log "kprof $m native"
    (cd .deps/bin && GGML_SCHED_DEBUG=1 timeout -k 5 "$(phase_timeout 200)" "$NCU" "${ncu_args[@]}" ./llama-bench "${lb[@]}" \
      >$OUT/kprof-$m-native.csv 2>$OUT/kprof-$m-native.err)
    splits $OUT/kprof-$m-native.err | tee -a "$OUT/h200.log"
    grep -E '^\| llama' $OUT/kprof-$m-native.csv | tee -a "$OUT/h200.log"
    grep -v '^\(|\|==\)' $OUT/kprof-$m-native.csv | grep '^"' >$OUT/kprof-$m-native.raw.csv
    kern_sum $OUT/kprof-$m-native.raw.csv | tee -a "$OUT/h200.log"
    room 60 || break
    log "kprof $m apir (host under ncu, --isolation thread)"
    timeout -k 5 "$(phase_timeout 220)" "$NCU" "${ncu_args[@]}" --target-processes all build/apir-host \
      --listen unix:/tmp/apir-kprof.sock --backend CUDA --isolation thread --insecure-shared-process --log-level info \
      >$OUT/kprof-$m-apir.csv 2>$OUT/kprof-$m-apir.err & hp=$!
    for _ in $(seq 1 200); do [ -S /tmp/apir-kprof.sock ] && break; sleep 0.1; done
    (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:/tmp/apir-kprof.sock \
      GGML_SCHED_DEBUG=1 timeout -k 5 "$(phase_timeout 200)" ./llama-bench "${lb[@]}" -dev APIR0 2>$OUT/kprof-$m-guest.err | grep -E '^\| llama' | tee -a "$OUT/h200.log")
    splits $OUT/kprof-$m-guest.err | tee -a "$OUT/h200.log"
    # The host itself, not ncu: ncu prints its results once the process it started exits.
    pkill -TERM -x apir-host; wait $hp 2>/dev/null
    grep '^"' $OUT/kprof-$m-apir.csv >$OUT/kprof-$m-apir.raw.csv
    kern_sum $OUT/kprof-$m-apir.raw.csv | tee -a "$OUT/h200.log"
    gzip -f $OUT/kprof-$m-*.raw.csv; rm -f $OUT/kprof-$m-native.csv $OUT/kprof-$m-apir.csv
  done
  log "done, $(left) s left"
  ;;
fusion)
  # The CUDA rules and the fusion seal on the GPU (2026-12-06's checks, one call): the index checks
  # (with test_fused_chains, the fused ROPE store's own test); every CUDA finding replayed on CUDA
  # (all refused, none ends the child); test-backend-ops' fusion cases through a CUDA host; then
  # 1B F16 tg128 natively and through apir, each with and without ggml-cuda's fusion
  # (GGML_CUDA_DISABLE_FUSION=1; through apir on the host), FUSION_ROUNDS rounds (2): apir's fused
  # rate near native's and above its own unfused one says llama.cpp's fusions still happen.
  M=/tmp/models; mkdir -p $M; model 1b-f16
  sock=/tmp/apir-fusion.sock
  log "index checks on CUDA"
  APIR_TEST_BACKEND=CUDA timeout 120 build/tests/test_index_checks 2>&1 | grep -E 'FAIL|passed|refused a graph' | tee -a "$OUT/h200.log"
  for d in cuda cuda-chains; do
    n=$(ls fuzz/findings/$d/*.bin | wc -l)
    log "fuzz/findings/$d on CUDA ($n inputs)"
    env $([ $d = cuda-chains ] && echo FUZZ_OP_CHAINS=1) FUZZ_BACKEND=CUDA FUZZ_OP_DEVICE_PATH=1 timeout 120 \
      build/apir-fuzz-op-dev -runs "$n" -timeout 30 -artifacts "$OUT/replay-$d" fuzz/findings/$d 2>&1 |
      grep -E 'outcomes|finding [0-9]+:' | tee -a "$OUT/h200.log"
  done
  build/apir-host --listen unix:$sock --backend CUDA --log-level warn >"$OUT/host-fusion.log" 2>&1 & hp=$!; sleep 2
  log "test-backend-ops -b APIR0 (host CUDA): fusion cases"
  (cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:$sock \
     timeout "$(phase_timeout 150)" ./test-backend-ops test -b APIR0 \
     -o ROPE_SET_ROWS,RMS_NORM_MUL_ROPE,NORM_MUL_ADD,RMS_NORM_MUL_ADD,ADD_ADD,ADD_RMS_NORM,SILU_MUL,GELU_MUL,TOPK_MOE,MUL_MAT_VEC_FUSION,MUL_MAT_ID_FUSION,MUL_MAT_ID,ADD_ID \
     2>&1 | grep -E 'tests passed|FAIL' | head -8 | tee -a "$OUT/h200.log")
  kill $hp; wait $hp 2>/dev/null
  grep -c refused "$OUT/host-fusion.log" | sed 's/^/host refusals: /' | tee -a "$OUT/h200.log"
  room 60 && H200_BUDGET_S=$(left) bash "$0" faprobe
  lb=(-m $M/1b-f16.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 4 -o md)
  tg() { grep -E '^\| llama' | awk -F'|' '{print $(NF-1)}'; }
  for r in $(seq 1 "${FUSION_ROUNDS:-2}"); do
    room 60 || break
    log "round $r native: $(cd .deps/bin && ./llama-bench "${lb[@]}" 2>/dev/null | tg)"
    log "round $r native, fusion off: $(cd .deps/bin && GGML_CUDA_DISABLE_FUSION=1 ./llama-bench "${lb[@]}" 2>/dev/null | tg)"
    for f in 0 1; do
      GGML_CUDA_DISABLE_FUSION=$f build/apir-host --listen unix:$sock --backend CUDA --log-level warn >>"$OUT/host-fusion.log" 2>&1 & hp=$!; sleep 2
      log "round $r apir, host fusion off=$f: $(cd .deps/bin && CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so \
        APIR_HOST=unix:$sock ./llama-bench "${lb[@]}" -dev APIR0 2>/dev/null | tg)"
      kill $hp; wait $hp 2>/dev/null
    done
  done
  ;;
faprobe)
  # op_device.c's placement rules against the kernels fuzzing seldom reaches (tests/probe_layouts.c):
  # natively (the cases that end a process or compute wrong are what the rules must refuse), then
  # through a CUDA host (none ends the host's worker; flash attention's all refused).  The native
  # lines in $OUT/probe-OP-native.txt.
  sock=/tmp/apir-faprobe.sock
  for op in flash_attn mul_mat; do
    room 60 || break
    log "$op, operands off 16 bytes, natively on CUDA"
    timeout "$(phase_timeout 200)" build/tests/apir-probe-layouts --op $op --backends .deps/bin >"$OUT/probe-$op-native.txt" 2>/dev/null
    grep -v ': computed' "$OUT/probe-$op-native.txt" | head -40 | tee -a "$OUT/h200.log"
    build/apir-host --listen unix:$sock --backend CUDA --log-level warn >"$OUT/host-probe-$op.log" 2>&1 & hp=$!; sleep 2
    log "$op: the same through a CUDA host"
    CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH=$ROOT/build/libggml-apir.so APIR_HOST=unix:$sock timeout "$(phase_timeout 120)" \
      build/tests/apir-probe-layouts --op $op --backends .deps/bin --device APIR0 --expect-refused 2>/dev/null |
      grep -E '<-|layouts:' | tee -a "$OUT/h200.log"
    kill $hp; wait $hp 2>/dev/null
    grep -c "refused" "$OUT/host-probe-$op.log" | sed 's/^/host refusals: /' | tee -a "$OUT/h200.log"
  done
  ;;
esac
