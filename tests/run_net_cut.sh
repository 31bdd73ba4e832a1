#!/usr/bin/env bash
# A network cut, not a killed process: the host and the guest in two network
# namespaces joined by a veth pair; once the guest is mid-work, every packet
# crossing the link is dropped (iptables DROP on each side's ingress from the
# veth: no RST, no FIN, no local send error - what a cut cable or a dead
# switch does).  Asserted:
#  - the guest (apir ping looping null calls over tcp:) fails its call and
#    exits within GUEST_BOUND_S of the cut, with an error naming the host's
#    endpoint; it does not hang;
#  - the host frees the cut guest's session (apir stat: no guest left) within
#    HOST_BOUND_S of the cut, and its log says the guest disconnected;
#  - the host lives on and serves a new guest over a working path (its own
#    address, from inside its namespace) and over its Unix socket.
# The bounds come from transport/net.c's apir_net_tune: TCP_USER_TIMEOUT
# 20 s (data sent and never acknowledged; it also ends keepalive once probes
# go unanswered that long), keepalive probes every 3 s after 5 s idle; so a
# silent peer is given up after 20 s, checked at most 3 s late.  Both bounds
# add slack for a loaded 2-core machine: 20 + 3 + 7 = 30 s.
# Skipped (77, the reason printed) without root / CAP_NET_ADMIN, network
# namespaces, veth or iptables.
# usage: run_net_cut.sh APIR_BUILD          (ctest: net_cut)
set -uo pipefail
B=$1
USER_TIMEOUT_S=20 KEEPINTVL_S=3 SLACK_S=7
GUEST_BOUND_S=$((USER_TIMEOUT_S + KEEPINTVL_S + SLACK_S))
HOST_BOUND_S=$((USER_TIMEOUT_S + KEEPINTVL_S + SLACK_S))

T=$(mktemp -d /tmp/apir-netcut-XXXXXX)
NS_H=apir-cut-h-$$ NS_G=apir-cut-g-$$
# veth names: at most 15 characters
VETH_H=acut$$h VETH_G=acut$$g
ADDR_H=10.213.77.1 ADDR_G=10.213.77.2
HOST_PID='' GUEST_PID='' made_h='' made_g=''
fails=0 n=0

cleanup() {
  [ -n "$GUEST_PID" ] && kill -KILL "$GUEST_PID" 2>/dev/null
  [ -n "$HOST_PID" ] && kill "$HOST_PID" 2>/dev/null
  [ -n "$GUEST_PID" ] && wait "$GUEST_PID" 2>/dev/null
  [ -n "$HOST_PID" ] && wait "$HOST_PID" 2>/dev/null
  # deleting a namespace deletes its end of the veth (and so both ends) and
  # its iptables rules
  [ -n "$made_g" ] && ip netns del "$NS_G" 2>/dev/null
  [ -n "$made_h" ] && ip netns del "$NS_H" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() { echo "SKIP: $*"; exit 77; }
check() { # what, then a command that must succeed
  local what=$1; shift
  n=$((n + 1))
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# nsenter, not ip netns exec: that also enters a new mount namespace, and the
# host refuses control connections from another mount namespace (apir stat)
in_h() { nsenter --net="/run/netns/$NS_H" "$@"; }
in_g() { nsenter --net="/run/netns/$NS_G" "$@"; }
# the number of guests the host serves now (apir stat over its Unix socket,
# which no namespace cuts), or empty when the host does not answer
guests_now() {
  "$B/apir" stat "unix:$T/h.sock" 2>/dev/null | sed -n 's/^guests: \([0-9]*\) now.*/\1/p'
}

# true once guests_now says $1 within $2 ms
guests_become() {
  local end=$(($(now_ms) + $2))
  while [ "$(now_ms)" -lt "$end" ]; do [ "$(guests_now)" = "$1" ] && return 0; sleep 0.05; done
  false
}

# true once no process names the host's socket (its workers included), 2 s at most
no_host_left() {
  for _ in $(seq 1 40); do pgrep -f -- "$T/h.sock" >/dev/null || return 0; sleep 0.05; done
  false
}

# ---- the two namespaces and the link ----
[ "$(id -u)" = 0 ] || skip "not root: network namespaces need CAP_NET_ADMIN"
command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v iptables >/dev/null || skip "no iptables: nothing here can drop the link's packets silently"
ip netns add "$NS_H" 2>"$T/err" || skip "ip netns add failed (no CAP_NET_ADMIN or no netns support): $(cat "$T/err")"
made_h=1
ip netns add "$NS_G" 2>"$T/err" || skip "ip netns add failed: $(cat "$T/err")"
made_g=1
in_h ip link add "$VETH_H" type veth peer name "$VETH_G" 2>"$T/err" || skip "no veth pair: $(cat "$T/err")"
in_h ip link set "$VETH_G" netns "$NS_G" 2>"$T/err" || skip "cannot move a veth end: $(cat "$T/err")"
if ! { in_h ip link set lo up && in_g ip link set lo up &&
  in_h ip addr add "$ADDR_H/30" dev "$VETH_H" && in_g ip addr add "$ADDR_G/30" dev "$VETH_G" &&
  in_h ip link set "$VETH_H" up && in_g ip link set "$VETH_G" up; }; then
  skip "cannot configure the veth pair"
fi
# the link carries packets: a connection to a closed port of the host's side
# is refused (its RST came back), not timed out
in_g timeout 5 bash -c "exec 3<>/dev/tcp/$ADDR_H/9" 2>"$T/err"
grep -q 'Connection refused' "$T/err" || skip "the veth link does not carry packets: $(cat "$T/err")"
# iptables must work inside a namespace, tried now (a rule that drops nothing)
in_h iptables -A INPUT -i "$VETH_H" -p udp --dport 9 -j DROP 2>"$T/err" ||
  skip "iptables does not work in a network namespace: $(cat "$T/err")"

# ---- the host, in its namespace, on the link's address with a token ----
# (--isolation process, the default: the cut guest's session is a worker)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token"
chmod 600 "$T/token"
# nsenter itself, not in_h: a function run with & is a subshell, and $! would
# be that shell, not the host (killing it would leave the host running)
nsenter --net="/run/netns/$NS_H" "$B/apir-host" --listen "unix:$T/h.sock" --listen "tcp:$ADDR_H:0" \
  --token-file "$T/token" --threads 1 --log-level info >"$T/host.log" 2>&1 &
HOST_PID=$!
EP=
for _ in $(seq 1 1000); do
  EP=$(grep -o "serving tcp:$ADDR_H:[0-9]*" "$T/host.log" | head -1 | cut -d' ' -f2)
  [ -n "$EP" ] && [ -S "$T/h.sock" ] && break
  kill -0 "$HOST_PID" 2>/dev/null || break
  sleep 0.01
done
if [ -z "$EP" ]; then echo "FAIL apir-host did not start:"; cat "$T/host.log"; exit 1; fi
echo "host: $EP (in $NS_H), guest at $ADDR_G (in $NS_G)"

# ---- the guest: null calls in a loop, far more than it can make here ----
nsenter --net="/run/netns/$NS_G" env APIR_TOKEN_FILE="$T/token" APIR_LOG_LEVEL=warn \
  "$B/apir" ping -n 10000000 "$EP" >"$T/guest.out" 2>"$T/guest.err" &
GUEST_PID=$!
guests_become 1 20000
sleep 1  # calls under way
guest_calling() { kill -0 "$GUEST_PID" 2>/dev/null && grep -q "connected: $ADDR_G:" "$T/host.log" && [ "$(guests_now)" = 1 ]; }
if ! guest_calling; then echo "FAIL the guest is not calling over the link"; cat "$T/host.log" "$T/guest.err"; exit 1; fi
check "the guest is connected and calling over the link" guest_calling

# ---- the cut: each side stops receiving anything over the link ----
if ! { in_h iptables -I INPUT -i "$VETH_H" -j DROP && in_g iptables -I INPUT -i "$VETH_G" -j DROP; }; then
  echo "FAIL cannot cut the link"; exit 1
fi
t_cut=$(now_ms)
echo "link cut; waiting up to $GUEST_BOUND_S s for the guest, $HOST_BOUND_S s for the host's session"

guest_ms='' host_ms=''
deadline=$((t_cut + (GUEST_BOUND_S > HOST_BOUND_S ? GUEST_BOUND_S : HOST_BOUND_S) * 1000 + 5000))
while [ "$(now_ms)" -lt "$deadline" ] && { [ -z "$guest_ms" ] || [ -z "$host_ms" ]; }; do
  if [ -z "$guest_ms" ] && ! kill -0 "$GUEST_PID" 2>/dev/null; then guest_ms=$(($(now_ms) - t_cut)); fi
  if [ -z "$host_ms" ] && [ "$(guests_now)" = 0 ]; then host_ms=$(($(now_ms) - t_cut)); fi
  sleep 0.1
done
guest_rc=
if [ -n "$guest_ms" ]; then wait "$GUEST_PID"; guest_rc=$?; GUEST_PID=; fi
echo "figure: network cut (silent drop): the guest exited ${guest_ms:-(not)} ms after the cut (bound ${GUEST_BOUND_S} s), status ${guest_rc:-none}"
echo "figure: network cut (silent drop): the host freed the session ${host_ms:-(not)} ms after the cut (bound ${HOST_BOUND_S} s)"
check "the guest exited within $GUEST_BOUND_S s of the cut" test -n "$guest_ms" -a "${guest_ms:-0}" -lt $((GUEST_BOUND_S * 1000))
# apir ping's status 1: a call failed (not a crash, not a signal)
check "  with a failure status (1)" test "${guest_rc:-x}" = 1
check "  its stderr names the host's endpoint" grep -q -- "host at $EP" "$T/guest.err"
check "  and says its call failed" grep -q -- "call [0-9]* failed" "$T/guest.err"
check "the host freed the cut guest's session within $HOST_BOUND_S s" test -n "$host_ms" -a "${host_ms:-0}" -lt $((HOST_BOUND_S * 1000))
# (the worker may log "connection lost" first, or the daemon may see the
# socket's error first and end it quietly: either way the session's end)
check "  its log says the cut guest disconnected" grep -q -- "($ADDR_G:[0-9]*): disconnected after" "$T/host.log"
check "the host is still running" kill -0 "$HOST_PID"

# ---- the host serves on: over its own address (a working path) and Unix ----
check "a new guest is served over tcp: from the host's namespace" \
  in_h env APIR_TOKEN_FILE="$T/token" "$B/apir" ping -n 100 "$EP"
check "and over the host's Unix socket" "$B/apir" ping -n 100 "unix:$T/h.sock"
check "  and those guests' sessions are freed as they leave" guests_become 0 5000
# and it stops cleanly, its workers with it
kill -TERM "$HOST_PID"
wait "$HOST_PID"
host_rc=$?
HOST_PID=
check "the host exits 0 on SIGTERM" test "$host_rc" = 0
check "  and leaves no process behind" no_host_left

if [ "$fails" != 0 ]; then
  echo "--- guest stderr"; cat "$T/guest.err"
  echo "--- host log"; cat "$T/host.log"
fi
echo "net_cut: $((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]
