#!/usr/bin/env bash
# Flash attention with an operand placed off 16 bytes, through a CPU host
# that applies the CUDA rules (APIR_TEST_KERNEL_RULES=cuda): every such case
# refused at its compute, every 16-byte one computed as the CPU computes it,
# none ending a process (tests/probe_fa_layouts.c; on an H100 the same cases
# natively were misaligned addresses and wrong results: bench/h200.sh faprobe).
#
# usage: run_fa_layouts.sh APIR_BUILD DEPS_BIN
set -uo pipefail
APIR_BUILD=$1 APIR_DEPS_BIN=$2
. "$(dirname "$0")/lib.sh"
trap apir_host_stop EXIT
APIR_TEST_KERNEL_RULES=cuda apir_host_start --threads 2 || exit 1
GGML_BACKEND_PATH="$APIR_BUILD/libggml-apir.so" "$APIR_BUILD/tests/apir-probe-fa-layouts" --backends "$APIR_DEPS_BIN" \
  --device APIR0 --expect-refused
rc=$?
refusals=$(grep -c "flash attention takes" "$APIR_TEST_DIR/host.log")
echo "host refusals naming the flash-attention rule: $refusals"
[ "$refusals" -gt 0 ] || { echo "FAIL: the host never named the rule"; rc=1; }
apir_host_stop || { echo "FAIL: apir-host did not exit cleanly"; rc=1; }
exit $rc
