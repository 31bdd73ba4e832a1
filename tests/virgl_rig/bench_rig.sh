#!/usr/bin/env bash
# The cost of the virtio-gpu path through the rig: null call p50 (apir ping)
# and llama-bench tg on a tiny generated model, the CPU backend behind
# libapir-virgl.so.  A measurement, not a test (no pass/fail).
#   bench_rig.sh BUILD DEPS_BIN [ROUNDS [HOST_LIB...]]
# With several HOST_LIBs (e.g. a copy of an older libapir-virgl.so), each
# round measures each in turn: a side-by-side comparison on a busy machine.
set -uo pipefail
APIR_BUILD=$(cd "$1" && pwd) APIR_DEPS_BIN=$(cd "$2" && pwd)
ROUNDS=${3:-3}
shift 3 2>/dev/null || shift $#
LIBS=("$@")
[ ${#LIBS[@]} = 0 ] && LIBS=("$APIR_BUILD/libapir-virgl.so")
. "$(dirname "$0")/rig_lib.sh"
trap rig_cleanup EXIT
M=$(mktemp -d /tmp/apir-rigbench-XXXXXX)
"$APIR_BUILD/apir-gguf-gen" -o "$M/model.gguf" --size tiny >/dev/null || exit 1
for r in $(seq 1 "$ROUNDS"); do
  for lib in "${LIBS[@]}"; do
    rig_start --host-lib "$lib" --ggml-lib "$APIR_DEPS_BIN/libggml-cpu.so" --threads 2 || exit 1
    ping=$(rig_guest "$APIR_BUILD/apir" ping virtgpu -n 20000 2>&1 | sed -n 's/.*p50 \([0-9.]*\) us.*/\1/p')
    tg=$( (cd "$APIR_DEPS_BIN" && rig_guest env GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" APIR_HOST=virtgpu \
      ./llama-bench -m "$M/model.gguf" -p 0 -n 64 -r 3 -t 2 -o md 2>/dev/null) | awk -F'|' '/tg64/ {print $(NF-1)}' | xargs)
    echo "round $r $lib: null call p50 ${ping:-?} us, tg64 ${tg:-?} t/s"
    rig_stop
    rig_cleanup
  done
done
rm -rf "$M"
