#!/usr/bin/env bash
# apir-host as a service (host/server/service.c, host/server/server.c), one case per run:
#   activation   socket activation with systemd-socket-activate (else
#                tests/service_harness.c's equivalent), READY=1 / STATUS= /
#                STOPPING=1 on a NOTIFY_SOCKET of ours; the socket passed is
#                served, nothing else bound, and left in place at exit
#   socket_mode  the socket file's mode (0660 whatever the umask) and group;
#                as root, a uid in that group connects and one outside it
#                cannot
#   peer_log     guests named by SO_PEERCRED (pid, uid, gid) in the host's
#                lines, a refused guest too; a guest in its own pid namespace
#                (which says "pid 1") when unshare works here; timestamps,
#                and APIR_LOG_TIMESTAMPS=0
#   guest_log    the guest library logs through ggml's logger (ggml_log_set)
#   limit        a guest over its buffer quota logs which kind of limit
# usage: run_service.sh BUILD HARNESS DEPS_BIN CASE
set -uo pipefail
BUILD=$1 HARNESS=$2 DEPS_BIN=$3 CASE=$4
. "$(dirname "$0")/lib.sh"
apir_test_setup svc
uid=$(id -u) gid=$(id -g)
stamp='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z apir '

# start_host LOG SOCKET [ARGS...]: apir-host on SOCKET (env from the caller)
start_host() {
  local log=$1 sock=$2; shift 2
  "$BUILD/apir-host" --listen "unix:$sock" --log-level info "$@" >"$log" 2>&1 &
  host_pid=$!
  pids+=("$host_pid")
  wait_for 20 test -S "$sock" || fail "apir-host did not start"
}
stop_host() {
  kill -TERM "$host_pid"; wait "$host_pid"; local rc=$?
  [ $rc = 0 ] || fail "apir-host exited $rc on SIGTERM"
}
# ping SOCKET: one guest; sets ping_pid (the guest's pid) and ping_rc
ping_host() {
  "$BUILD/apir" ping "unix:$1" -n 3 >>"$work/ping.log" 2>&1 &
  ping_pid=$!
  wait "$ping_pid"; ping_rc=$?
}

case $CASE in
activation)
  "$HARNESS" notify-recv "$work/notify.sock" "$work/notify.log" 60000 &
  notify_pid=$!; pids+=("$notify_pid")
  wait_for 10 test -S "$work/notify.sock" || fail "no notify socket"
  mkdir -p "$work/run"
  sock=$work/run/host.sock
  # --listen names another path: a passed socket is served instead of binding.
  args=(--listen "unix:$work/not-bound.sock" --log-level info)
  # APIR_TEST_OWN_ACTIVATOR=1: the harness even where systemd's tool exists
  if [ "${APIR_TEST_OWN_ACTIVATOR:-0}" != 1 ] && command -v systemd-socket-activate >/dev/null; then
    echo "socket activation by systemd-socket-activate"
    systemd-socket-activate --seqpacket -l "$sock" -E NOTIFY_SOCKET="$work/notify.sock" \
      -E APIR_LOG_LEVEL=info "$BUILD/apir-host" "${args[@]}" >"$work/host.log" 2>&1 &
  else
    echo "socket activation by tests/service_harness.c (systemd-socket-activate not installed, or APIR_TEST_OWN_ACTIVATOR=1)"
    NOTIFY_SOCKET="$work/notify.sock" "$HARNESS" activate "$sock" "$BUILD/apir-host" "${args[@]}" \
      >"$work/host.log" 2>&1 &
  fi
  host_pid=$!; pids+=("$host_pid")   # exec keeps the pid: this is apir-host
  wait_for 10 test -S "$sock" || fail "the activating socket was not bound"
  # systemd-socket-activate starts the host on the first connection: a
  # guest may time out while the host loads its backend; the next is served.
  for _ in 1 2 3 4 5 6 7 8 9 10; do ping_host "$sock"; [ $ping_rc = 0 ] && break; sleep 0.5; done
  [ $ping_rc = 0 ] || fail "no guest was served through the passed socket"
  wait_for 10 grep -q '^READY=1' "$work/notify.log" || fail "no READY=1 on NOTIFY_SOCKET"
  grep -qF "STATUS=serving unix:$sock" "$work/notify.log" || fail "READY=1 without the STATUS line"
  grep -qF "socket activation: serving the socket the service manager passed (unix:$sock)" "$work/host.log" ||
    fail "the host did not say it serves the passed socket"
  [ ! -e "$work/not-bound.sock" ] || fail "the host bound --listen's path although a socket was passed"
  wait_for 5 grep -qF "(pid $ping_pid) connected: pid $ping_pid, uid $uid, gid $gid" "$work/host.log" ||
    fail "no connected line naming pid $ping_pid uid $uid gid $gid"
  # a second guest after the first (the worker of the first did not take the socket)
  ping_host "$sock"; [ $ping_rc = 0 ] || fail "a second guest was not served"
  lines=$(grep -c 'apir host: ' "$work/host.log")
  bad=$(grep 'apir host: ' "$work/host.log" | grep -cvE "$stamp")
  [ "$lines" -gt 0 ] && [ "$bad" = 0 ] || fail "$bad of $lines host lines without a timestamp"
  stop_host
  wait "$notify_pid" || fail "no STOPPING=1 on NOTIFY_SOCKET"
  grep -q '^STOPPING=1' "$work/notify.log" || fail "no STOPPING=1"
  [ -S "$sock" ] || fail "the host removed the socket file its manager owns"
  echo "notifications:"; grep -v '^--$' "$work/notify.log" | sed 's/^/  /'
  echo "ok: socket activation, READY=1, STOPPING=1, peer credentials and timestamps in the log"
  ;;

socket_mode)
  # Options when this apir-host has them (--socket-mode/--socket-group), else
  # the environment (APIR_SOCKET_MODE/APIR_SOCKET_GROUP).
  if "$BUILD/apir-host" --help 2>/dev/null | grep -q -- '--socket-group'; then
    sock_opts() { local a=(); [ -n "${1:-}" ] && a+=(--socket-mode "$1"); [ -n "${2:-}" ] && a+=(--socket-group "$2"); echo "${a[@]}"; }
    how=options
  else
    sock_opts() { :; }
    how=environment
  fi
  run_with() {  # run_with NAME MODE GROUP: a host whose socket is $work/NAME/host.sock
    local name=$1 mode=$2 group=$3
    if [ $how = options ]; then
      # shellcheck disable=SC2046
      start_host "$work/$name.log" "$work/$name/host.sock" $(sock_opts "$mode" "$group")
    else
      APIR_SOCKET_MODE=$mode APIR_SOCKET_GROUP=$group start_host "$work/$name.log" "$work/$name/host.sock"
    fi
  }
  echo "socket mode and group by $how"
  # the default: 0660, whatever the umask; the directory searchable by the group
  saved_umask=$(umask); umask 077
  run_with default "" ""
  umask "$saved_umask"
  got=$(stat -c '%a' "$work/default/host.sock") dir=$(stat -c '%a' "$work/default")
  [ "$got" = 660 ] || fail "default socket mode $got, not 660"
  [ "$dir" = 710 ] || fail "socket directory mode $dir, not 710"
  ping_host "$work/default/host.sock"; [ $ping_rc = 0 ] || fail "no guest served"
  stop_host
  # a mode and a group
  if [ "$uid" = 0 ]; then
    group=$(getent group nogroup >/dev/null && echo nogroup || echo daemon)
  else
    group=$(id -Gn | tr ' ' '\n' | grep -vx "$(id -gn)" | head -1)
    [ -n "$group" ] || group=$(id -gn)
  fi
  run_with grouped 0640 "$group"
  got=$(stat -c '%a %G' "$work/grouped/host.sock") dir=$(stat -c '%a %G' "$work/grouped")
  [ "$got" = "640 $group" ] || fail "socket is '$got', not '640 $group'"
  [ "$dir" = "710 $group" ] || fail "socket directory is '$dir', not '710 $group'"
  stop_host
  # as root: another uid connects through the group, and not without it
  if [ "$uid" = 0 ] && command -v setpriv >/dev/null; then
    chmod 0711 "$work"
    run_with access "" "$group"
    gnum=$(getent group "$group" | cut -d: -f3)
    as_other() { setpriv --reuid 65534 --regid 65533 "$@" "$BUILD/apir" ping "unix:$work/access/host.sock" -n 1; }
    if setpriv --reuid 65534 --regid 65533 --clear-groups test -x "$BUILD/apir"; then
      as_other --groups "$gnum" >"$work/in-group.log" 2>&1 || fail "uid 65534 in group $group was not served"
      as_other --clear-groups >"$work/outside.log" 2>&1 && fail "uid 65534 outside group $group was served"
      grep -q 'ermission denied' "$work/outside.log" || fail "refused for another reason: $(cat "$work/outside.log")"
      echo "uid 65534: served in group $group, 'Permission denied' outside it"
    else
      echo "skipped the other-uid check: $BUILD/apir is not reachable by uid 65534"
    fi
    stop_host
  fi
  echo "ok: socket mode 0660 by default, mode and group applied"
  ;;

peer_log)
  sock=$work/peer/host.sock
  start_host "$work/host.log" "$sock" --spawn-rate 1 --spawn-burst 1
  # Two guests at once: one token, so one is served and the other refused.
  "$BUILD/apir" ping "unix:$sock" -n 3 >"$work/ping-a.log" 2>&1 & a=$!
  "$BUILD/apir" ping "unix:$sock" -n 3 >"$work/ping-b.log" 2>&1 & b=$!
  wait $a; rc_a=$?; wait $b; rc_b=$?
  if [ $rc_a = 0 ] && [ $rc_b != 0 ]; then first=$a second=$b
  elif [ $rc_b = 0 ] && [ $rc_a != 0 ]; then first=$b second=$a
  else fail "with --spawn-rate 1 --spawn-burst 1, two guests at once: exits $rc_a and $rc_b, not one served and one refused"
  fi
  wait_for 5 grep -qF "(pid $first) connected: pid $first, uid $uid, gid $gid" "$work/host.log" ||
    fail "the worker's line does not name the guest by its credentials"
  grep -qF "guest#1 (pid $first, uid $uid, gid $gid, comm \"apir\"): worker process" "$work/host.log" ||
    fail "the daemon's line does not name the guest by its credentials"
  grep -qF "guest refused (pid $second, uid $uid, gid $gid" "$work/host.log" ||
    fail "the refused guest is not named"
  grep -E "$stamp" "$work/host.log" | grep -qF 'guest refused (' || fail "the refusal has no timestamp"
  # A guest in its own pid namespace says it is pid 1 (as in a container);
  # the host names it by its pid here.
  if unshare --pid --fork true 2>/dev/null; then
    sleep 1.1   # a spawn token
    unshare --pid --fork "$BUILD/apir" ping "unix:$sock" -n 1 >"$work/ns.log" 2>&1 || fail "the namespaced guest failed"
    wait_for 5 grep -qE "guest#[0-9]+\(pid [0-9]+\) connected: pid [0-9]+, uid $uid, gid $gid; says pid 1$" "$work/host.log" ||
      fail "the namespaced guest is not named by its credentials"
    grep -E 'says pid 1$' "$work/host.log" | grep -vq '(pid 1)' || fail "the namespaced guest is named pid 1"
    echo "a guest in its own pid namespace: $(grep -oE 'guest#[0-9]+\(pid [0-9]+\) connected: .*says pid 1$' "$work/host.log")"
  else
    echo "skipped the pid-namespace guest: unshare --pid is not allowed here"
  fi
  stop_host
  # timestamps off
  APIR_LOG_TIMESTAMPS=0 start_host "$work/plain.log" "$work/plain/host.sock"
  stop_host
  grep -q '^apir host: info: ' "$work/plain.log" || fail "APIR_LOG_TIMESTAMPS=0 still stamps lines"
  grep -E "$stamp" "$work/plain.log" && fail "APIR_LOG_TIMESTAMPS=0 still stamps lines"
  echo "log lines:"; grep -E 'connected|refused|worker process' "$work/host.log" | sed 's/^/  /'
  echo "ok: guests named by pid, uid and gid; timestamps, and none with APIR_LOG_TIMESTAMPS=0"
  ;;

guest_log)
  APIR_HOST="unix:$work/nobody-here.sock" APIR_LOG_LEVEL=warn "$HARNESS" ggml-log "$BUILD/libggml-apir.so" \
    >"$work/out.log" 2>"$work/err.log" || fail "the program failed"
  grep -qF "captured: apir guest: warn: no APIR device: cannot connect to $work/nobody-here.sock" "$work/out.log" ||
    fail "ggml's logger did not get the guest's line"
  grep -q 'apir guest' "$work/err.log" && fail "the guest wrote to stderr past ggml's logger"
  grep 'captured: apir' "$work/out.log"
  echo "ok: the guest logs through ggml's logger"
  ;;

limit)
  # One buffer per guest: a model's buffers go over it; the guest's own
  # line says a per-client limit was hit, and which kind.
  "$BUILD/apir-gguf-gen" -o "$work/model.gguf" --size tiny >/dev/null || fail "no model"
  start_host "$work/host.log" "$work/limit/host.sock" --max-buffers 1
  GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$work/limit/host.sock" \
    timeout 120 "$BUILD/tests/apir-llama-greedy" -m "$work/model.gguf" -d APIR0 -n 2 >"$work/llama.log" 2>&1
  stop_host
  grep -m1 'per-client limit' "$work/llama.log" ||
    fail "the guest did not say a limit refused it: $(grep -i 'apir' "$work/llama.log" | head -5)"
  grep -q 'failed on the host (code 4): a per-client limit was hit: buffer quota reached (1 buffers, asking [0-9]* bytes): --max-buffers 1' "$work/llama.log" ||
    fail "the guest's line does not name the buffer quota, its value and its use"
  grep -q 'buffer quota reached' "$work/host.log" || fail "the host's log does not name the quota"
  echo "ok: the guest says which kind of limit refused it"
  ;;

*) echo "unknown case $CASE"; exit 2 ;;
esac
