#!/usr/bin/env bash
# apir-fuzz-op-dev (fuzz/dev_driver.c), the runner of fuzz_op's device path
# that a GPU machine uses (bench/h200.sh fuzzdev), checked here on the CPU:
#   - the device path (host-allocated buffers moved by SET/GET_TENSOR, the
#     compute in the child's own process) over the kept corpus and a fixed
#     number of mutations from a fixed seed: no input ends the child, and
#     the host accepts and computes some of them (the path is exercised,
#     not only refused);
#   - chain mode (-chains, FUZZ_OP_CHAINS=1: chains of nodes a backend
#     fuses, sent keyed with their use counts) over its own inputs per kind
#     of chain and fixed mutations: no input ends the child, some chains
#     compute, under the CPU's rules and under the CUDA rules;
#   - the driver's own verdict (-selftest): an input that aborts through
#     ggml and one that never answers each end their child; the run fails
#     (exit 1), names each reason, keeps each input, and a new child takes
#     the next input.
#   - the CUDA findings (fuzz/findings/cuda: nodes ggml-cuda's kernels abort
#     on or, one, write past), replayed on this CPU host with the CUDA rules
#     forced (APIR_TEST_KERNEL_RULES=cuda, host/check/op_device.c): every one
#     refused; without the rules every one computes (the CPU's kernels take
#     them), so it is the rules that refuse them; and the same of the fused
#     chains' findings (fuzz/findings/cuda-chains), read as chains.
# usage: run_fuzz_dev.sh BUILD SOURCE
set -uo pipefail
BUILD=$1 SRC=$2
. "$(dirname "$0")/lib.sh"
apir_test_setup fuzzdev
drv=$BUILD/apir-fuzz-op-dev
[ -x "$drv" ] || fail "no $drv"

FUZZ_OP_DEVICE_PATH=1 "$drv" -runs 6000 -seed 1 -artifacts "$work/a" "$SRC/fuzz/corpus/fuzz_op" >"$work/run.log" 2>&1
rc=$?
[ $rc = 0 ] || fail "device path: exit $rc (a finding: see $work/a)"
accepted=$(sed -n 's/.* \([0-9]*\) accepted and computed.*/\1/p' "$work/run.log")
kept=$(ls "$SRC/fuzz/corpus/fuzz_op" | wc -l)
grep -q "6000 inputs ($kept from the corpus, $((6000 - kept)) mutated)" "$work/run.log" || fail "not the inputs asked for"
[ "${accepted:-0}" -gt 500 ] || fail "device path: only ${accepted:-0} of 6000 inputs computed"
echo "device path: 6000 inputs, $accepted accepted and computed, none ended the child"

for rules in cpu cuda; do
  env $([ $rules = cuda ] && echo APIR_TEST_KERNEL_RULES=cuda) FUZZ_OP_DEVICE_PATH=1 "$drv" -chains -runs 600 -seed 1 \
    -artifacts "$work/ch-$rules" >"$work/chains-$rules.log" 2>&1
  rc=$?
  [ $rc = 0 ] || fail "chain mode ($rules rules): exit $rc (a finding: see $work/ch-$rules)"
  grep -q "600 inputs (160 from the corpus, 440 mutated) .* (chains)" "$work/chains-$rules.log" ||
    fail "chain mode ($rules rules): not the inputs asked for"
  accepted=$(sed -n 's/.* \([0-9]*\) accepted and computed.*/\1/p' "$work/chains-$rules.log")
  [ "${accepted:-0}" -gt 200 ] || fail "chain mode ($rules rules): only ${accepted:-0} of 600 chains computed"
  echo "chain mode, $rules rules: 600 chains, $accepted accepted and computed, none ended the child"
done

printf 'SELFTEST-ABORT' >"$work/abort.bin"
printf 'SELFTEST-HANG' >"$work/hang.bin"
FUZZ_OP_DEVICE_PATH=1 "$drv" -runs 5 -timeout 3 -selftest 1 -artifacts "$work/b" "$work/abort.bin" "$work/hang.bin" \
  "$SRC/fuzz/corpus/fuzz_op" >"$work/self.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "a run with an abort and a hang: exit $rc, want 1"
grep -q "finding 0: died of signal 6: apir-fuzz-op-dev: ggml abort: .*: self-test abort" "$work/self.log" ||
  fail "the abort not named"
grep -q "finding 1: no answer within the timeout (a hang)" "$work/self.log" || fail "the hang not named"
cmp -s "$work/b/finding-00-1.bin" "$work/abort.bin" && cmp -s "$work/b/finding-01-1.bin" "$work/hang.bin" ||
  fail "the inputs not kept"
grep -q "ggml abort: .*self-test abort" "$work/b/finding-00-1.log" || fail "the child's log not kept beside the input"
grep -q "5 inputs .* 2 ended the child (3 children)" "$work/self.log" || fail "not a new child after each"
grep -q "3 refused by the host\|[0-9] accepted and computed" "$work/self.log" || fail "the inputs after them not run"
echo "driver: an abort and a hang are findings, named and kept, and a new child takes the next input"

n=$(ls "$SRC"/fuzz/findings/cuda/*.bin | wc -l)
[ "$n" -gt 0 ] || fail "no CUDA findings"
APIR_TEST_KERNEL_RULES=cuda FUZZ_OP_DEVICE_PATH=1 "$drv" -runs "$n" -artifacts "$work/c" "$SRC/fuzz/findings/cuda" \
  >"$work/cuda.log" 2>&1 || fail "CUDA findings with the CUDA rules: a child ended"
grep -q " $n refused by the host, 0 accepted" "$work/cuda.log" || fail "CUDA findings: not all $n refused with the CUDA rules"
FUZZ_OP_DEVICE_PATH=1 "$drv" -runs "$n" -artifacts "$work/d" "$SRC/fuzz/findings/cuda" >"$work/cpu.log" 2>&1 ||
  fail "CUDA findings on the CPU's rules: a child ended"
grep -q " 0 refused by the host, $n accepted" "$work/cpu.log" || fail "CUDA findings: the CPU's rules alone refuse some"
echo "CUDA findings: all $n refused under the CUDA rules, all $n computed under the CPU's"

# the fused chains' findings (fuzz/findings/cuda-chains), read as chains (FUZZ_OP_CHAINS=1)
n=$(ls "$SRC"/fuzz/findings/cuda-chains/*.bin | wc -l)
[ "$n" -gt 0 ] || fail "no CUDA chain findings"
FUZZ_OP_CHAINS=1 APIR_TEST_KERNEL_RULES=cuda FUZZ_OP_DEVICE_PATH=1 "$drv" -runs "$n" -artifacts "$work/e" \
  "$SRC/fuzz/findings/cuda-chains" >"$work/cuda-chains.log" 2>&1 || fail "CUDA chain findings with the CUDA rules: a child ended"
grep -q " $n refused by the host, 0 accepted" "$work/cuda-chains.log" ||
  fail "CUDA chain findings: not all $n refused with the CUDA rules"
FUZZ_OP_CHAINS=1 FUZZ_OP_DEVICE_PATH=1 "$drv" -runs "$n" -artifacts "$work/f" "$SRC/fuzz/findings/cuda-chains" \
  >"$work/cpu-chains.log" 2>&1 || fail "CUDA chain findings on the CPU's rules: a child ended"
grep -q " 0 refused by the host, $n accepted" "$work/cpu-chains.log" || fail "CUDA chain findings: the CPU's rules alone refuse some"
echo "CUDA chain findings: all $n refused under the CUDA rules, all $n computed under the CPU's"
