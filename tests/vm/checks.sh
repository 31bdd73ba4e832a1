#!/bin/sh
# The checks inside the VM (busybox sh), run by tests/vm/init.  Each prints
# "CHECK <name> PASS|FAIL (<seconds>s)" at the start of a console line, and its
# output indented under it.  The kernel command line's apir.checks=a,b,c picks them.
cd /apir/bin || exit 1
# fd 3: the console, for marks the host side watches (scripts/vm.sh) while a
# check's own output goes to its log
exec 3>&1
mark() { echo "APIR-VM mark $*" >&3; }
export LD_LIBRARY_PATH=/apir/lib:/apir/bin
export APIR_HOST=virtgpu
# QEMU offers the Venus capset, not APIR's own (10): virglrenderer routes Venus
# contexts to APIR when the hypervisor has VIRGL_ROUTE_VENUS_TO_APIR=1.
export APIR_VIRTGPU_CAPSET=${APIR_VIRTGPU_CAPSET:-venus}
export GGML_BACKEND_PATH=/apir/bin/libggml-apir.so
export APIR_LOG_LEVEL=${APIR_LOG_LEVEL:-info}
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^apir\.$1=//p" | tail -1; }
CHECKS=$(arg checks | tr ',' ' ')
OPS=$(arg ops)
OPS_REF=$(arg ops_ref)
now() { cut -d' ' -f1 /proc/uptime; }
check() {
  name=$1; shift
  t0=$(now)
  echo "APIR-VM running $name: $*"
  "$@" >/tmp/$name.log 2>&1 &
  pid=$!
  # A line a minute while it runs: how far it got (TCG is slow).
  ( while sleep 60; do kill -0 $pid 2>/dev/null || exit 0
      echo "APIR-VM   $name: $(wc -l </tmp/$name.log) lines ($(grep -c 'OK' /tmp/$name.log) OK, $(grep -c 'FAIL' /tmp/$name.log) FAIL), last: $(tail -n 1 /tmp/$name.log | cut -c1-120)"
      grep 'FAIL' /tmp/$name.log | head -5 | sed 's/^/APIR-VM     failed: /'; done ) &
  ppid=$!
  if wait $pid; then r=PASS; else r="FAIL (exit $?)"; fi
  kill $ppid 2>/dev/null; wait $ppid 2>/dev/null
  t1=$(now)
  # a check may end its log with "RESULT: counts...": they join the CHECK line
  res=$(grep '^RESULT: ' /tmp/$name.log | tail -n 1 | cut -c9-)
  echo "CHECK $name $r ($(awk "BEGIN{printf \"%.1f\", $t1-$t0}")s)${res:+ $res}"
  tail -n ${TAIL:-25} /tmp/$name.log | sed 's/^/    | /'
}
# greedy MODEL NATIVE_PREFIX N [DEVICE]: decode on APIR0 (or DEVICE), compare with the host's native run
greedy() {
  ./apir-llama-greedy -m /apir/data/$1 -d "${4:-APIR0}" -n $3 -t 2 --dump-logits /tmp/apir.bin >/tmp/apir.out || return 1
  echo "native: $(grep tokens: /apir/data/$2.out)"
  echo "APIR0:  $(grep tokens: /tmp/apir.out)"
  ./apir-llama-greedy --compare /apir/data/$2.bin /tmp/apir.bin --tol 1e-3
}

# ---- interop with the reference implementation (docs/INTEROP.md) ----
# The reference guest library, when scripts/vm.sh packed it (/apir/ref/MISSING says why not).
REF_GUEST=/apir/ref/libggml-virtgpu.so
REF_DEV="[virtgpu] CPU"
skip_no_ref() { # name: "CHECK name SKIP (reason)" and true when the reference is missing
  [ -f $REF_GUEST ] && return 1
  echo "CHECK $1 SKIP ($(cat /apir/ref/MISSING 2>/dev/null || echo 'no reference guest library in the image'))"
}
# step NAME CMD...: one step of a multi-step check: "step NAME ok|FAIL", counted
step() {
  sname=$1; shift
  echo "== step $sname: $*"
  if "$@"; then echo "step $sname ok"; st_ok=$((st_ok + 1)); else echo "step $sname FAIL (exit $?)"; st_bad=$((st_bad + 1)); fi
}
steps_end() { echo "RESULT: $st_ok/$((st_ok + st_bad)) steps passed"; [ $st_bad = 0 ]; }
tbo_counts() { # log: "passed/total, N not supported"
  l=$(grep -E '^ +[0-9]+/[0-9]+ tests passed' "$1" | tail -n 1 | sed 's/^ *//')
  echo "${l:-no test line}, $(grep -c 'not supported' "$1") not supported"
}
# test-backend-ops on DEVICE (with the environment given), "RESULT: counts"
tbo() { # DEVICE OPS [VAR=VALUE...]
  dev=$1 ops=$2; shift 2
  env "$@" ./test-backend-ops test -b "$dev" -o "$ops" >/tmp/tbo.out 2>&1; r=$?
  cat /tmp/tbo.out
  echo "RESULT: $(tbo_counts /tmp/tbo.out) (-o $ops)"
  [ $r = 0 ] && grep -qE '^ +[0-9]+/[0-9]+ tests passed' /tmp/tbo.out
}
greedy_as_gpu() { ( export LD_PRELOAD=/apir/lib/libapir-vm-devtype.so; greedy "$@" ); }
# (a) the reference guest inside the VM -> our libapir-virgl.so
interop_ref_guest() {
  st_ok=0 st_bad=0
  export GGML_BACKEND_PATH=$REF_GUEST
  step devinfo ./apir-vm-devinfo -n 50 "$REF_DEV"
  # it reports the CPU host device as CPU-type: llama.cpp would not offload to it
  # (docs/INTEROP.md); the preload says GPU, as our guest does
  step greedy greedy_as_gpu model.gguf native 24 "$REF_DEV"
  step bench env LD_PRELOAD=/apir/lib/libapir-vm-devtype.so ./llama-bench -m /apir/data/model.gguf -dev "$REF_DEV" -ngl 99 -p 32 -n 16 -r 1 -t 2
  step apir_capset sh -c 'GGML_REMOTING_USE_APIR_CAPSET=1 timeout 60 ./apir-vm-devinfo -n 1 "[virtgpu] CPU" >/tmp/rc10.out 2>&1; r=$?
                          tail -n 5 /tmp/rc10.out; echo "(exit $r: expected to fail, QEMU offers no capset 10)"; [ $r != 0 ] && [ $r != 124 ]'
  steps_end
}
# (b) our guest inside the VM -> the reference libggml-virtgpu-backend.so (a boot of its own)
interop_ref_host() {
  st_ok=0 st_bad=0
  step ping ./apir ping virtgpu -n 200
  step info ./apir info virtgpu
  step interop_ref ./interop_ref 1
  step devinfo ./apir-vm-devinfo -n 50 APIR0
  # our guest asks supports_op only in apir 0.2 (difference 1): it says "no" to
  # every op, and llama.cpp's scheduler aborts on the KV cache it placed in APIR0
  # ("cannot run the operation (SET_ROWS)"); this step expects exactly that
  step greedy_aborts sh -c './apir-llama-greedy -m /apir/data/model.gguf -d APIR0 -n 4 -t 2 >/tmp/g.out 2>&1; r=$?
      grep -m1 "cannot run the operation" /tmp/g.out; echo "(exit $r)"; [ $r != 0 ] && grep -q "cannot run the operation" /tmp/g.out'
  steps_end
}
# ---- faults ----
# the guest program killed (SIGKILL) mid-graph: a long llama-bench on a model
# whose pp512 graph keeps the host busy; the host side (scripts/vm.sh's
# watcher) sees the context's render worker go; then a new program works
kill_midgraph() {
  st_ok=0 st_bad=0
  [ -f /tmp/kill.gguf ] || ./apir-gguf-gen -o /tmp/kill.gguf --layers 2 --embd 1024 --ff 4096 --heads 8 --kv-heads 4 \
                              --vocab 4096 --type q4_0 >/dev/null || return 1
  ./llama-bench -m /tmp/kill.gguf -dev APIR0 -ngl 99 -p 512 -n 0 -r 1000 -t 2 >/tmp/km.out 2>&1 &
  bp=$!
  sleep ${KILL_AFTER:-25}
  if kill -0 $bp 2>/dev/null; then
    # the host side snapshots its render workers at this mark; then the kill
    mark "kill_midgraph before-kill pid $bp"
    sleep 2
    kill -9 $bp; mark "kill_midgraph killed"; wait $bp; echo "killed llama-bench (pid $bp) with SIGKILL after ${KILL_AFTER:-25}s; its output:"
    sed 's/^/    /' /tmp/km.out | tail -n 8; st_ok=$((st_ok + 1))
  else
    wait $bp; echo "llama-bench ended before the kill (exit $?):"; tail -n 20 /tmp/km.out; st_bad=$((st_bad + 1))
  fi
  sleep 3
  mark "kill_midgraph after-kill"
  step ping_after ./apir ping virtgpu -n 100
  step greedy_after greedy model.gguf native 24
  mark "kill_midgraph done"
  steps_end
}
churn() {
  ./apir ping virtgpu -n 20000 >/tmp/cping.out 2>&1 & cp=$!
  mark "churn start"
  n=0; i=0
  while [ $i -lt ${CHURN:-100} ]; do i=$((i + 1)); ./apir ping virtgpu -n 1 >/dev/null 2>&1 && n=$((n + 1)); [ $((i % 25)) = 0 ] && mark "churn $i"; done
  wait $cp; r=$?
  grep 'null call' /tmp/cping.out
  echo "RESULT: $n/$i short-lived guests answered, the long one exit $r"
  [ $n = $i ] && [ $r = 0 ]
}
# a hostile program through the real driver while a normal guest runs; then
# normal guests still work
hostile() { # [alone]: without the concurrent guest
  st_ok=0 st_bad=0
  if [ "${1:-}" != alone ]; then ./apir ping virtgpu -n 20000 >/tmp/hping.out 2>&1 & hp=$!; fi
  mark "hostile start"
  step hostile env APIR_VM_ECHO_FD=3 timeout 300 ./apir-vm-hostile /dev/dri/renderD128 ${HOSTILE_ROUNDS:-200} ${HOSTILE_BIG_MIB:-1}
  mark "hostile end"
  [ "${1:-}" = alone ] || step concurrent_ping sh -c "wait_pid() { while kill -0 \$1 2>/dev/null; do sleep 0.2; done; }; wait_pid $hp; cat /tmp/hping.out; grep -q 'null call' /tmp/hping.out"
  step ping_after ./apir ping virtgpu -n 100
  step greedy_after greedy model.gguf native 24
  steps_end
}

for c in $CHECKS; do
  case $c in
    ping) check ping ./apir ping virtgpu -n 200;;
    info) check info ./apir info virtgpu;;
    backend_ops) TAIL=12 check backend_ops ./test-backend-ops test -b APIR0 -o "${OPS:-ADD,MUL_MAT}";;
    greedy) if [ -x ./apir-llama-greedy ]; then check greedy greedy model.gguf native 24; else echo "CHECK greedy SKIP (no apir-llama-greedy)"; fi;;
    greedy_big) check greedy_big greedy big.gguf big-native 16;;
    # QEMU offers no capset 10: the default (apir) capset must fail, and say so.
    capset10) check capset10 sh -c 'APIR_VIRTGPU_CAPSET=apir ./apir ping virtgpu -n 1 >/tmp/c10.out 2>&1; r=$?; cat /tmp/c10.out
                                    [ $r != 0 ] && grep -q "offers no capset 10" /tmp/c10.out';;
    # three guests at once: three contexts (three render workers on the host)
    concurrent) check concurrent sh -c 'for i in 1 2 3; do ./apir ping virtgpu -n 500 >/tmp/cc$i.out 2>&1 & done; r=0
                                        for i in 1 2 3; do wait %$i || r=1; done; grep -h "null call" /tmp/cc?.out
                                        [ $r = 0 ] && [ $(cat /tmp/cc?.out | grep -c "null call") = 3 ]';;
    interop_ref_guest) skip_no_ref $c || TAIL=80 check $c interop_ref_guest;;
    interop_ref_guest_ops) skip_no_ref $c || check $c tbo "$REF_DEV" "${OPS_REF:-ADD}" GGML_BACKEND_PATH=$REF_GUEST;;
    # the boot that runs these loads the reference host library (scripts/vm.sh)
    interop_ref_host) TAIL=80 check $c interop_ref_host;;
    interop_ref_host_ops) check $c tbo APIR0 "${OPS_REF:-ADD}";;
    backend_ops_counts) check $c tbo APIR0 "${OPS_REF:-ADD}";;
    kill_midgraph) TAIL=60 check $c kill_midgraph;;
    hostile) TAIL=100 check $c hostile;;
    hostile_alone) TAIL=100 check $c hostile alone;;
    # short-lived contexts of random commands: APIR-typed ones naming the reply blob, or random words
    garbage_typed|garbage_untyped) check $c env APIR_VM_ECHO_FD=3 APIR_VM_HOSTILE_ONLY=$c ./apir-vm-hostile /dev/dri/renderD128 ${HOSTILE_ROUNDS:-200};;
    # contexts with a mapped blob made and dropped as fast as the guest can (no command)
    blob_churn) check $c env APIR_VM_ECHO_FD=3 APIR_VM_HOSTILE_ONLY=blobchurn ./apir-vm-hostile /dev/dri/renderD128 ${HOSTILE_ROUNDS:-200};;
    # well-formed guests only: 100 short-lived contexts (apir ping -n 1) while one long one runs
    churn) check $c churn;;
    bench) check bench ./llama-bench -m /apir/data/model.gguf -dev APIR0 -ngl 99 -p 32 -n 16 -r 1 -t 2;;
    *) echo "CHECK $c FAIL (unknown check)";;
  esac
done
