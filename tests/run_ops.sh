#!/usr/bin/env bash
# apir-host for its operator (issue 28), one case per run:
#   signals   SIGHUP reopens --log-file (logrotate's move) and is logged; without
#             a log file it is ignored, logged; SIGTERM, SIGINT and a fatal error
#             after the socket was bound each leave no socket file behind
#   journal   stderr is the journal (JOURNAL_STREAM names it): every line starts
#             with its sd-daemon priority (<3> <4> <6>), no timestamp; ggml's own
#             lines in our format, said once by the daemon, not again per guest
#   log_env   a bad APIR_LOG_LEVEL, APIR_LOG_TIMESTAMPS, APIR_LOG_FILE or
#             --log-file is refused like a bad option (exit 2, a message)
#   metrics   --metrics-listen on loopback TCP and on a Unix socket: GET /metrics
#             scraped (curl, else bash's /dev/tcp), the text format checked
#             (promtool when installed, and our own checker: TYPE before samples,
#             histograms cumulative with +Inf = _count), guests' process names
#             left out, process_* present; bad requests answered 400/404/405/431
#             and the host goes on; a non-loopback address refused
#   man       the man pages render (man -l) and name every option of the help
#   unit      dist/systemd: systemd-analyze verify and security (each variant under
#             4.4), and the TCP listener of the network drop-in reachable under
#             the unit's own hardening simulated (its network namespace choice by
#             unshare, its RestrictAddressFamilies and SystemCallFilter by
#             tests/unit_seccomp.c); under the unit without it, --listen tcp: is
#             refused at start, pointing to the drop-in
# usage: run_ops.sh BUILD SOURCE CASE [UNIT_SECCOMP]    (77: skipped, the reason said)
set -uo pipefail
BUILD=$1 SRC=$2 CASE=$3 SECCOMP_HELPER=${4:-}
. "$(dirname "$0")/lib.sh"
apir_test_setup ops
skip() { echo "skip: $*"; exit 77; }
unset APIR_LOG_FILE APIR_LOG_TIMESTAMPS JOURNAL_STREAM
export APIR_LOG_LEVEL=info
# start_host LOG SOCKET [ARGS...]: apir-host on SOCKET, stdout and stderr in LOG
start_host() {
  local log=$1 sock=$2; shift 2
  "$BUILD/apir-host" --listen "unix:$sock" "$@" >"$log" 2>&1 &
  host_pid=$!
  pids+=("$host_pid")
  wait_for 20 test -S "$sock" || fail "apir-host did not start"
}
# stop_host SIGNAL: the host ends with status 0 and its socket files go
stop_host() {
  kill "-$1" "$host_pid"; wait "$host_pid"; local rc=$?
  [ $rc = 0 ] || fail "apir-host exited $rc on SIG$1"
}
ping_host() { "$BUILD/apir" ping "unix:$1" -n 3 >>"$work/ping.log" 2>&1; }

case $CASE in
signals)
  sock=$work/a/host.sock
  start_host "$work/stderr.log" "$sock" --log-file "$work/host.log"
  ping_host "$sock" || fail "no guest served"
  wait_for 5 grep -q 'disconnected after' "$work/host.log" || fail "the worker's lines are not in --log-file"
  mv "$work/host.log" "$work/host.log.1"        # what logrotate does
  kill -HUP "$host_pid"
  wait_for 5 test -s "$work/host.log" || fail "SIGHUP did not reopen the log file"
  grep -q "SIGHUP: log file $work/host.log reopened" "$work/host.log" || fail "the reopen is not logged"
  ping_host "$sock" || fail "no guest served after SIGHUP"
  wait_for 5 grep -q 'guest#2.*disconnected after' "$work/host.log" || fail "the second guest's lines are not in the new file"
  grep -q 'guest#2' "$work/host.log.1" && fail "lines went to the moved file after SIGHUP"
  [ -s "$work/stderr.log" ] && fail "lines on stderr with --log-file: $(head -3 "$work/stderr.log")"
  stop_host TERM
  for f in "$sock" "$sock.ctl"; do [ -e "$f" ] && fail "SIGTERM left $f"; done
  echo "ok: SIGHUP reopened --log-file; SIGTERM removed the socket and the control socket"
  # no log file: SIGHUP ignored, logged; SIGINT and its files
  sock=$work/b/host.sock
  start_host "$work/b.log" "$sock" --metrics-listen "unix:$work/b/metrics.sock"
  kill -HUP "$host_pid"
  wait_for 5 grep -q 'SIGHUP ignored' "$work/b.log" || fail "SIGHUP without a log file is not logged"
  ping_host "$sock" || fail "the host did not survive SIGHUP"
  stop_host INT
  for f in "$sock" "$sock.ctl" "$work/b/metrics.sock"; do [ -e "$f" ] && fail "SIGINT left $f"; done
  echo "ok: SIGHUP ignored and logged without a log file; SIGINT removed the three sockets"
  # a fatal error after the socket was bound: the stream listener's port is taken
  sock=$work/c/host.sock
  mkdir -p "$work/c"
  printf 'tok\n' >"$work/token"; chmod 600 "$work/token"
  start_host "$work/holder.log" "$work/holder.sock" --listen tcp:127.0.0.1:0 --token-file "$work/token"
  port=$(sed -n 's/.*serving tcp:127.0.0.1:\([0-9]*\).*/\1/p' "$work/holder.log" | head -1)
  [ -n "$port" ] || fail "no port in the holder's log"
  "$BUILD/apir-host" --listen "unix:$sock" --listen "tcp:127.0.0.1:$port" --token-file "$work/token" >"$work/c.log" 2>&1
  rc=$?
  [ $rc = 1 ] || fail "a listener that cannot bind: exit $rc, not 1"
  grep -qE 'apir host: error: .*127.0.0.1' "$work/c.log" || fail "the fatal error is not a log line: $(cat "$work/c.log")"
  [ -e "$sock" ] && fail "the fatal error left $sock"
  echo "ok: a fatal error after binding: exit 1, an error line, no socket file left"
  ;;

journal)
  sock=$work/j/host.sock
  : >"$work/journal.log"
  export JOURNAL_STREAM=$(stat -c '%d:%i' "$work/journal.log")
  # stderr is that very file: the host takes it for the journal
  "$BUILD/apir-host" --listen "unix:$sock" --max-buffers 0 2>>"$work/journal.log" >/dev/null &
  host_pid=$!; pids+=("$host_pid")
  wait_for 20 test -S "$sock" || fail "apir-host did not start"
  ping_host "$sock" || fail "no guest served"
  ping_host "$sock" || fail "no second guest served"
  wait_for 5 grep -q 'guest#2.*disconnected after' "$work/journal.log" || fail "no line of the second guest"
  stop_host TERM
  unset JOURNAL_STREAM
  bad=$(grep -cvE '^<[3467]>apir [a-z]+: (error|warn|info|debug): ' "$work/journal.log")
  [ "$bad" = 0 ] || fail "$bad line(s) without a priority prefix: $(grep -vE '^<[3467]>apir ' "$work/journal.log" | head -3)"
  grep -qE '^<6>apir host: info: serving ' "$work/journal.log" || fail "no <6> info line"
  grep -qE '^<6>apir host: info: \[guest#1\] guest#1\(pid [0-9]+\) connected' "$work/journal.log" ||
    fail "the worker's line is not relayed with the daemon's priority"
  grep -qE '^<[0-9]>[0-9]{4}-' "$work/journal.log" && fail "timestamps under the journal"
  loads=$(grep -c 'apir ggml: info: load_backend: loaded CPU backend' "$work/journal.log")
  [ "$loads" = 1 ] || fail "ggml's load_backend line said $loads times (not once, by the daemon)"
  echo "lines:"; head -3 "$work/journal.log"; grep -m2 'guest#1' "$work/journal.log"
  # the warn and error priorities
  export JOURNAL_STREAM=$(stat -c '%d:%i' "$work/journal.log")
  "$BUILD/apir-host" --listen "unix:$work/j2.sock" --listen tcp:0.0.0.0:0 --isolation thread --insecure-shared-process \
    2>>"$work/journal.log" >/dev/null
  unset JOURNAL_STREAM
  grep -qE '^<4>apir host: warn: --isolation thread' "$work/journal.log" || fail "no <4> warn line"
  grep -qE '^<3>apir host: error: .*refused without authentication' "$work/journal.log" || fail "no <3> error line"
  echo "ok: <N> priorities under the journal, no timestamps, ggml's lines once"
  ;;

log_env)
  for bad in "APIR_LOG_LEVEL=loud:APIR_LOG_LEVEL=loud" "APIR_LOG_TIMESTAMPS=maybe:APIR_LOG_TIMESTAMPS=maybe" \
             "APIR_LOG_FILE=$work/no/such/dir/x.log:APIR_LOG_FILE=$work/no/such/dir/x.log: No such file"; do
    setting=${bad%%:*} want=${bad#*:}
    env "$setting" "$BUILD/apir-host" --listen "unix:$work/e.sock" >"$work/out.log" 2>&1
    rc=$?
    [ $rc = 2 ] || fail "$setting: exit $rc, not 2"
    grep -qF "apir-host: $want" "$work/out.log" || fail "$setting: no message naming it: $(cat "$work/out.log")"
    [ -e "$work/e.sock" ] && fail "$setting: a socket was bound"
    echo "refused: $(cat "$work/out.log")"
  done
  "$BUILD/apir-host" --listen "unix:$work/e.sock" --log-file "$work/no/dir/h.log" >"$work/out.log" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q 'apir-host: --log-file .*No such file' "$work/out.log" || fail "--log-file in a missing folder: exit $rc, $(cat "$work/out.log")"
  "$BUILD/apir-host" --listen "unix:$work/e.sock" --log-file= >"$work/out.log" 2>&1
  [ $? = 2 ] || fail "an empty --log-file was taken"
  APIR_LOG_TIMESTAMPS=off "$BUILD/apir-host" --help >/dev/null || fail "APIR_LOG_TIMESTAMPS=off refused"
  echo "ok: bad log settings refused with exit 2"
  ;;

metrics)
  # scrape URL [CURL-ARGS...]: the answer's head in $work/head, body in $work/body
  scrape() {
    if command -v curl >/dev/null; then
      curl -sS --max-time 5 -D "$work/head" -o "$work/body" "$@"
    else
      local url=$1 hp port; hp=${url#http://}; hp=${hp%%/*}; port=${hp##*:}
      exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
      printf 'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n' >&3
      cat <&3 >"$work/raw"; exec 3<&-
      sed '/^\r$/q' "$work/raw" >"$work/head"; sed '1,/^\r$/d' "$work/raw" >"$work/body"
    fi
  }
  # raw_request PORT BYTES: the status line of the answer to BYTES
  raw_request() {
    exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
    printf '%b' "$2" >&3
    head -1 <&3 | tr -d '\r'
    exec 3<&-
  }
  check_format() {  # our checker of the text exposition format
    awk '
      /^# HELP / { next }
      /^# TYPE / { type[$3] = $4; next }
      /^#/ { print "bad comment: " $0; bad++; next }
      /^$/ { next }
      {
        if ($0 !~ /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? [-+0-9.eEInfa]+$/) {
          print "bad sample: " $0; bad++; next
        }
        name = $0; sub(/[{ ].*/, "", name); base = name
        if (!(name in type)) { sub(/_(bucket|sum|count)$/, "", base); if (type[base] != "histogram") { print "no TYPE: " name; bad++ } }
        if (name ~ /_bucket$/ && type[base] == "histogram") {
          v = $NF + 0
          if (base == last && v < lastv) { print "buckets not cumulative: " $0; bad++ }
          last = base; lastv = v
          if ($0 ~ /le="\+Inf"/) inf[base] = v
        }
        if (name ~ /_count$/ && type[base] == "histogram") count[base] = $NF + 0
        samples++
      }
      END {
        for (h in count) if (!(h in inf) || inf[h] != count[h]) { print "+Inf bucket != count: " h; bad++ }
        if (!samples) { print "no samples"; bad++ }
        exit bad > 0
      }' "$1"
  }
  printf 'tok\n' >"$work/token"; chmod 600 "$work/token"
  sock=$work/m/host.sock
  start_host "$work/host.log" "$sock" --metrics-listen 127.0.0.1:0 --metrics-file "$work/m.prom"
  url=$(sed -n 's/.*metrics over HTTP: GET \/metrics at \(http:[^ ]*\).*/\1/p' "$work/host.log" | head -1)
  [ -n "$url" ] || fail "the host does not say where its metrics are"
  port=${url##*:}; port=${port%%/*}
  ping_host "$sock" || fail "no guest served"
  # a guest that stays, so that per-guest metrics are there
  "$BUILD/apir" ping "unix:$sock" -n 1 >/dev/null 2>&1
  scrape "$url" || fail "the scrape failed"
  grep -q '^HTTP/1.1 200' "$work/head" || fail "not 200: $(head -1 "$work/head")"
  grep -qi '^Content-Type: text/plain; version=0.0.4' "$work/head" || fail "no Prometheus content type"
  check_format "$work/body" || fail "the document is not the text format"
  if command -v promtool >/dev/null; then promtool check metrics <"$work/body" || fail "promtool refused it"; fi
  for m in apir_host_info apir_guests apir_buffer_bytes apir_commands_total apir_command_duration_seconds_bucket \
           apir_graph_compute_duration_seconds_count process_cpu_seconds_total process_resident_memory_bytes \
           process_open_fds process_start_time_seconds apir_workers_cpu_seconds_total; do
    grep -q "^$m[ {]" "$work/body" || fail "no $m"
  done
  cmds=$(awk '/^apir_command_duration_seconds_count /{print $2}' "$work/body")
  [ "${cmds:-0}" -gt 0 ] || fail "the command histogram counted nothing ($cmds) after a guest's commands"
  grep -q 'comm=' "$work/body" && fail "a guest's process name in the HTTP metrics"
  grep -q 'apir_guest_bytes' "$work/body" && fail "the old name apir_guest_bytes"
  echo "scraped $(grep -vc '^#' "$work/body") samples; $cmds commands in the histogram"
  # bad requests: answered, the host goes on
  [ "$(raw_request "$port" 'POST /metrics HTTP/1.1\r\n\r\n')" = "HTTP/1.1 405 Method Not Allowed" ] || fail "POST not 405"
  [ "$(raw_request "$port" 'GET /secrets HTTP/1.1\r\n\r\n')" = "HTTP/1.1 404 Not Found" ] || fail "/secrets not 404"
  [ "$(raw_request "$port" 'hello\r\n\r\n')" = "HTTP/1.1 400 Bad Request" ] || fail "garbage not 400"
  big=$(head -c 5000 /dev/zero | tr '\0' 'a')
  [ "$(raw_request "$port" "GET /metrics HTTP/1.1\r\nX: $big\r\n\r\n")" = "HTTP/1.1 431 Request Header Fields Too Large" ] ||
    fail "an oversized head not 431"
  # nine silent connections (one more than the limit), then a scrape: the ninth is turned away, the scrape waits its turn
  for i in 1 2 3 4 5 6 7 8 9; do exec {fd}<>"/dev/tcp/127.0.0.1/$port"; eval "silent_$i=$fd"; done
  for i in 1 2 3 4 5 6 7 8 9; do eval "exec {silent_$i}<&-"; done
  scrape "$url" && grep -q '^HTTP/1.1 200' "$work/head" || fail "no scrape after bad and silent clients"
  ping_host "$sock" || fail "guests not served after bad HTTP clients"
  echo "ok: 405, 404, 400, 431 answered; the host goes on"
  stop_host TERM
  # Unix socket
  start_host "$work/unix.log" "$work/u/host.sock" --metrics-listen "unix:$work/u/metrics.sock"
  [ "$(stat -c %a "$work/u/metrics.sock")" = 600 ] || fail "the metrics socket is not 0600"
  if command -v curl >/dev/null; then
    curl -sS --max-time 5 --unix-socket "$work/u/metrics.sock" -o "$work/ubody" http://x/metrics || fail "no scrape over unix:"
    check_format "$work/ubody" || fail "unix: document"
  fi
  stop_host TERM
  [ -e "$work/u/metrics.sock" ] && fail "the metrics socket is left"
  # not loopback: refused
  "$BUILD/apir-host" --listen "unix:$work/n.sock" --metrics-listen 0.0.0.0:0 >"$work/n.log" 2>&1
  [ $? = 1 ] && grep -q 'not a loopback address' "$work/n.log" || fail "a non-loopback metrics address was taken"
  [ -e "$work/n.sock" ] && fail "the refused host left its socket"
  echo "ok: GET /metrics over TCP and unix:, format checked, non-loopback refused"
  ;;

man)
  command -v man >/dev/null || skip "no man (Debian's man-db)"
  for page in apir.1:apir apir-host.8:apir-host apir-gguf-gen.1:apir-gguf-gen; do
    f=$BUILD/man/${page%%:*} prog=${page#*:}
    [ -s "$f" ] || fail "no $f (the build makes it)"
    LANG=C MANWIDTH=200 man -l "$f" >"$work/$prog.txt" 2>"$work/$prog.err" || fail "man -l $f failed"
    [ -s "$work/$prog.err" ] && fail "man -l $f warned: $(head -3 "$work/$prog.err")"
    case $prog in
      apir-host) "$BUILD/apir-host" --help-generic >"$work/help" ;;
      apir) { "$BUILD/apir" --help; for c in ping info run stat ps cdi; do "$BUILD/apir" $c --help; done; } >"$work/help" ;;
      *) "$BUILD/$prog" --help >"$work/help" ;;
    esac
    opts=$(grep -E '^ {1,8}(-|[A-Z]+, -)' "$work/help" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
    n=0
    for o in $opts; do
      n=$((n + 1))
      grep -qF -- "$o" "$work/$prog.txt" || fail "$prog's man page lacks $o"
    done
    [ "$n" -ge 3 ] || fail "only $n options found in $prog --help"
    grep -q '^EXIT STATUS' "$work/$prog.txt" || fail "$prog's man page has no EXIT STATUS"
    echo "$prog: $n options in the man page ($(wc -l <"$work/$prog.txt") lines)"
  done
  # every option of apir-host's table is in its help (the internal ones aside)
  for o in --listen --log-file --metrics-listen --max-clients-per-tenant --weight-cache-max-gib --tls-key --spawn-burst; do
    grep -qF -- "$o" "$work/apir-host.txt" || fail "apir-host(8) lacks $o"
  done
  echo "ok: three man pages render and name every option"
  ;;

unit)
  command -v systemd-analyze >/dev/null || skip "no systemd-analyze"
  # Under the unit's system call filter LeakSanitizer cannot stop the world
  # (it needs ptrace, which the filter refuses, as the unit does): an ASan build
  # of apir-host would abort at its exit for that alone.
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  # The units as installed: ExecStart names this build's apir-host.
  mkdir -p "$work/base" "$work/net"
  for d in base net; do
    sed "s#/usr/local/bin/apir-host#$BUILD/apir-host#" "$SRC/dist/systemd/apir-host.service" >"$work/$d/apir-host.service"
    cp "$SRC/dist/systemd/apir-host.socket" "$work/$d/"
  done
  # the network variant: the unit with its drop-in after it (later settings win, as a drop-in's do)
  sed "s#/usr/local/bin/apir-host#$BUILD/apir-host#" "$SRC/dist/systemd/apir-host.service.d/network.conf" >>"$work/net/apir-host.service"
  for d in base net; do
    (cd "$work/$d" && systemd-analyze verify ./apir-host.service ./apir-host.socket) >"$work/verify-$d.log" 2>&1 ||
      fail "systemd-analyze verify ($d): $(cat "$work/verify-$d.log")"
    [ -s "$work/verify-$d.log" ] && fail "systemd-analyze verify ($d) warned: $(cat "$work/verify-$d.log")"
    score=$(cd "$work/$d" && systemd-analyze security --offline=yes ./apir-host.service 2>/dev/null |
            sed -n 's/.*Overall exposure level for apir-host.service: \([0-9.]*\).*/\1/p')
    [ -n "$score" ] || fail "no score from systemd-analyze security ($d)"
    echo "figure: systemd-analyze security, the $d unit: $score (was 4.4)"
    awk -v s="$score" 'BEGIN { exit !(s < 4.4) }' || fail "the $d unit scores $score, not under 4.4"
  done
  # The hardening simulated: the last PrivateNetwork=, the families and the system calls.
  [ -x "$SECCOMP_HELPER" ] || skip "no unit_seccomp helper"
  setting() { grep -E "^$1=" "$2" | tail -1 | cut -d= -f2-; }
  families() { grep -E '^RestrictAddressFamilies=' "$1" | cut -d= -f2- | tr ' ' '\n' | grep . | paste -sd, -; }
  # @groups expanded by systemd-analyze itself (what systemd would allow)
  syscalls() {
    local want=$(setting SystemCallFilter "$1")
    systemd-analyze syscall-filter 2>/dev/null | awk -v want="$want" '
      /^@/ { g = $1; next }
      /^ +#/ || /^$/ { next }
      { gsub(/^ +/, ""); members[g] = members[g] " " $1 }
      END {
        n = split(want, w, " ")
        for (i = 1; i <= n; i++) stack[++sp] = w[i]
        while (sp > 0) {
          x = stack[sp--]
          if (x in seen) continue
          seen[x] = 1
          if (x ~ /^@/) { m = split(members[x], mm, " "); for (j = 1; j <= m; j++) stack[++sp] = mm[j] }
          else print x
        }
      }' | paste -sd, -
  }
  printf 'tok\n' >"$work/token"; chmod 600 "$work/token"
  for d in base net; do
    unitf=$work/$d/apir-host.service
    wrap=()
    [ "$(setting PrivateNetwork "$unitf")" = yes ] && wrap=(unshare --net)
    fam=$(families "$unitf") calls=$(syscalls "$unitf")
    [ -n "$calls" ] || fail "no system call list for SystemCallFilter=$(setting SystemCallFilter "$unitf")"
    echo "$d: ${wrap[*]:-(host network)}; families $fam; $(echo "$calls" | tr ',' '\n' | wc -l) system calls allowed"
    "${wrap[@]}" "$SECCOMP_HELPER" "$fam" "$calls" "$BUILD/apir-host" --listen "unix:$work/$d.sock" \
      --listen tcp:0.0.0.0:0 --token-file "$work/token" >"$work/$d-host.log" 2>&1 &
    host_pid=$!; pids+=("$host_pid")
    if [ $d = base ]; then
      # AF_UNIX only: the stream listener is refused at start, said, and the
      # unix: socket removed (before the unit had the families, the host
      # served a port nobody could reach: "Connection refused").
      wait "$host_pid"; rc=$?
      [ $rc = 1 ] || fail "base unit: apir-host with --listen tcp: exited $rc, not 1"
      grep -q 'apir host: error: cannot listen on tcp:0.0.0.0:0: .*docs/DEPLOY.md' "$work/$d-host.log" ||
        fail "base unit: the refusal does not point to the network drop-in: $(tail -2 "$work/$d-host.log")"
      [ -e "$work/$d.sock" ] && fail "base unit: the refused host left its socket"
      echo "base unit: $(grep -o 'cannot listen.*' "$work/$d-host.log" | cut -c1-120)..."
      "${wrap[@]}" "$SECCOMP_HELPER" "$fam" "$calls" "$BUILD/apir-host" --listen "unix:$work/$d.sock" \
        >"$work/$d-host.log" 2>&1 &
      host_pid=$!; pids+=("$host_pid")
      wait_for 20 test -S "$work/$d.sock" || fail "base unit: apir-host did not start under the simulated hardening"
      ping_host "$work/$d.sock" || fail "base unit: the unix: guest was not served under the simulated hardening"
      grep -q 'died of signal\|Operation not permitted' "$work/$d-host.log" && fail "base unit: $(grep -m1 'signal\|not permitted' "$work/$d-host.log")"
      echo "base unit: a unix: guest served (worker sandbox inside the unit's filters)"
      stop_host TERM
      continue
    fi
    wait_for 20 test -S "$work/$d.sock" || fail "$d: apir-host did not start under the simulated hardening"
    port=$(sed -n 's/.*serving tcp:0.0.0.0:\([0-9]*\).*/\1/p' "$work/$d-host.log" | head -1)
    [ -n "$port" ] || fail "$d: no tcp port in the log"
    APIR_TOKEN=tok "$BUILD/apir" ping "tcp:127.0.0.1:$port" -n 3 >"$work/$d-ping.log" 2>&1; rc=$?
    ping_host "$work/$d.sock" || fail "$d: the unix: guest was not served under the simulated hardening"
    [ $rc = 0 ] || fail "the network drop-in's TCP listener is not reachable: $(cat "$work/$d-ping.log")"
    echo "network drop-in: a guest over tcp:127.0.0.1:$port served under the unit's hardening"
    stop_host TERM
  done
  echo "ok: units verified, scores under 4.4, the TCP listener reachable with the drop-in"
  ;;

*) echo "unknown case $CASE"; exit 2 ;;
esac
