#!/usr/bin/env bash
# Kernels' operands placed off 16 bytes, through a CPU host that applies the
# CUDA rules (APIR_TEST_KERNEL_RULES=cuda; tests/probe_layouts.c): no case
# may end a process or compute other than the CPU.  flash_attn: every case
# off 16 bytes refused, every other computed, and the host naming the rule
# (on an H100 the same cases natively were misaligned addresses and wrong
# results: bench/h200.sh faprobe).  mul_mat: each case refused or computed.
#
# usage: run_probe_layouts.sh APIR_BUILD DEPS_BIN flash_attn|mul_mat
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2 OP=$3
. "$(dirname "$0")/lib.sh"
trap apir_host_stop EXIT
APIR_TEST_KERNEL_RULES=cuda apir_host_start --threads 2 || exit 1
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" "$APIR_BUILD/tests/apir-probe-layouts" --op "$OP" \
  --backends "$APIR_DEPS_BIN" --device APIR0 --expect-refused
rc=$?
if [ "$OP" = flash_attn ]; then
  refusals=$(grep -c "flash attention takes" "$APIR_TEST_DIR/host.log")
  echo "host refusals naming the flash-attention rule: $refusals"
  [ "$refusals" -gt 0 ] || { echo "FAIL: the host never named the rule"; rc=1; }
fi
apir_host_stop || { echo "FAIL: apir-host did not exit cleanly"; rc=1; }
exit $rc
