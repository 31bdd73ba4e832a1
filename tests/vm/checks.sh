#!/bin/sh
# The checks inside the VM (busybox sh), run by tests/vm/init.  Each prints
# "CHECK <name> PASS|FAIL (<seconds>s)" at the start of a console line, and its
# output indented under it.  The kernel command line's apir.checks=a,b,c picks them.
cd /apir/bin || exit 1
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
  echo "CHECK $name $r ($(awk "BEGIN{printf \"%.1f\", $t1-$t0}")s)"
  tail -n ${TAIL:-25} /tmp/$name.log | sed 's/^/    | /'
}
# greedy MODEL NATIVE_PREFIX N: decode on APIR0, compare with the host's native run
greedy() {
  ./apir-llama-greedy -m /apir/data/$1 -d APIR0 -n $3 -t 2 --dump-logits /tmp/apir.bin >/tmp/apir.out || return 1
  echo "native: $(grep tokens: /apir/data/$2.out)"
  echo "APIR0:  $(grep tokens: /tmp/apir.out)"
  ./apir-llama-greedy --compare /apir/data/$2.bin /tmp/apir.bin --tol 1e-3
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
    bench) check bench ./llama-bench -m /apir/data/model.gguf -dev APIR0 -ngl 99 -p 32 -n 16 -r 1 -t 2;;
    *) echo "CHECK $c FAIL (unknown check)";;
  esac
done
