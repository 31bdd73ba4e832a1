# Shared by the test-backend-ops drivers (run_backend_ops.sh and the virtgpu
# rig's): reading a log's counts and judging APIR0 against the CPU backend.

# tbo_count LOG: "passed total not-supported" of a test-backend-ops log.
tbo_count() {
  local log=$1
  local line; line=$(grep -E '^ +[0-9]+/[0-9]+ tests passed' "$log" | tail -1)
  local passed=${line%%/*}; passed=${passed// /}
  local total=${line#*/}; total=${total%% *}
  local ns; ns=$(grep -c 'not supported' "$log")
  echo "${passed:-0} ${total:-0} $ns"
}

# tbo_judge RC_APIR PASSED TOTAL CPU_PASSED APIR_LOG: prints why it fails;
# fails when a case failed through APIR0 (or none ran) or APIR0 passed
# another number of cases than the CPU backend (something skipped).
tbo_judge() {
  local rc=$1 ap=$2 at=$3 cp=$4 log=$5 fail=0
  if [ "$rc" != 0 ] || [ "$ap" != "$at" ] || [ "$at" = 0 ]; then
    echo "FAIL: cases failed through APIR0:"; grep -E 'FAIL|error' "$log" | head -20; fail=1
  fi
  if [ "$ap" != "$cp" ]; then
    echo "FAIL: APIR0 passed $ap cases, the CPU backend $cp"; fail=1
  fi
  return $fail
}
