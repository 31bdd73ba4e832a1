#!/usr/bin/env bash
# The GPU benchmark, run on the device machine (one NVIDIA H200) by the
# device tool: builds ggml with CUDA from the carried llama.cpp bundle and
# apir against it, then measures side by side: native CUDA, apir (guest and
# host as separate processes, the guest without CUDA), ggml-rpc.
#
#   bench/h200.sh build        set-up + build (about 5 minutes on 16 cores)
#   bench/h200.sh bench        models + llama-bench ratios + apir-bench + test-backend-ops subset
# Needs .devcarry/gitRelease.bundle (the pinned llama.cpp, from the npm package).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export APIR_SKIP_APT=1 APIR_CUDA=1 CUDA_ARCH=90a-real APIR_CACHE=/tmp/apircache
export APIR_BUNDLE=$ROOT/.devcarry/gitRelease.bundle JOBS=$(nproc)
export NCCL_NVLS_ENABLE=0
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/h200.log"; }

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
esac
