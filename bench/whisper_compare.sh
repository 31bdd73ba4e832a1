#!/usr/bin/env bash
# whisper.cpp through APIR0 vs natively, side by side in one run: load time,
# encode time and the time per decode step (whisper-cli's own timings), and
# the host round trips (APIR_PROFILE), in all and per decode step, and where a step's time differs
# (bench/step_split.c, built as build/libapir-step-split.so: plan, compute, between).  A random-weight tiny
# model (apir-whisper-gen) and samples/jfk.wav, as the CI test uses.  Each round also runs
# APIR0 with apir 0.8's decode-step features off (APIR_GRAPH_INPUTS=0 APIR_ASK_SERIES=0:
# uploads sent one by one, op questions asked one at a time), the "before" of issue 26,
# in the same session: the rows "apir" and "apir-off".
# --host-b VAR=VAL adds a second apir-host started with that environment (an A/B of a host
# setting, e.g. APIR_HOST_IMPORT_MEMO=0): the row "apir-b", interleaved with the rest.
# --guest-b VAR=VAL does the same for a guest setting (e.g. APIR_GRAPH_DELTA=0): the second host
# is a plain one, its guest runs with VAR=VAL.
# --host-b-bin PATH: the second host is that apir-host binary (another build: an A/B of a host
# change), with --host-b's setting if one is given.
# --tcp: the guests reach their hosts over loopback TCP instead of Unix sockets; --link RATE (root,
# with --tcp) shapes the loopback to RATE (tc tbf, e.g. 1gbit, MTU 1500 for the run: every local
# connection of the machine meanwhile) as a link between two machines would be.
# The hosts measured log at info: a line per graph at debug is a pipe write and a wake-up of the
# daemon's log thread each decode step (on 2 vCPUs, on the cores the step runs on).  The step's
# breakdown at the end comes from one more run against a third host at debug; --debug-hosts puts
# hosts A and B at debug too, for the A/B's import medians.
# A guest that did not run on APIR0 (its host unreachable: it falls back to its CPU) stops the run.
#   bench/whisper_compare.sh [--rounds N] [--backend CPU|CUDA] [--threads N] [--no-off] [--host-b VAR=VAL]
#                            [--host-b-bin PATH] [--guest-b VAR=VAL] [--tcp [--link RATE]] [--debug-hosts]
# Needs a build in build/ (or APIR_BUILD=DIR) and scripts/setup.sh's whisper build (.whisper, or
# WHISPER_DIR=DIR).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=3 BACKEND=CPU THREADS=2 OFF=1 HOSTB= HOSTB_BIN= GUESTB= TCP= LINK= HOST_LOG=info
while [ $# -gt 0 ]; do
  case $1 in
  --rounds) ROUNDS=$2; shift 2 ;;
  --backend) BACKEND=$2; shift 2 ;;
  --threads) THREADS=$2; shift 2 ;;
  --no-off) OFF=; shift ;;
  --host-b) HOSTB=$2; shift 2 ;;
  --host-b-bin) HOSTB_BIN=$2; shift 2 ;;
  --guest-b) GUESTB=$2; shift 2 ;;
  --tcp) TCP=1; shift ;;
  --link) LINK=$2; shift 2 ;;
  --debug-hosts) HOST_LOG=debug; shift ;;
  *) echo "usage: $0 [--rounds N] [--backend CPU|CUDA] [--threads N] [--no-off] [--host-b VAR=VAL] [--host-b-bin PATH]" \
          "[--guest-b VAR=VAL] [--tcp [--link RATE]] [--debug-hosts]"
     exit 2 ;;
  esac
done
W=${WHISPER_DIR:-$ROOT/.whisper} B=${APIR_BUILD:-$ROOT/build}
# whisper-cli loads ggml's backends from its own folder, where setup links only
# the CPU's: the native run of another backend needs that backend's library too.
if [ "$BACKEND" != CPU ]; then
  lib=libggml-$(echo "$BACKEND" | tr A-Z a-z).so
  [ -e "$W/bin/$lib" ] || ln -sfn "$ROOT/.deps/bin/$lib" "$W/bin/$lib" || exit 1
fi
work=$(mktemp -d)
hpb= hpd=
unshape() { [ -z "$LINK" ] || { tc qdisc del dev lo root 2>/dev/null; ip link set lo mtu "$lo_mtu"; }; }
trap 'kill $hp $hpb $hpd 2>/dev/null; wait $hp $hpb $hpd 2>/dev/null; unshape; rm -rf "$work"' EXIT
# Where host A (h), host B (hb) and the breakdown's host (hd) listen and their guests connect.
port=$((20000 + RANDOM % 20000))
ep() { local off=0
       [ "$1" = hb.sock ] && off=1
       [ "$1" = hd.sock ] && off=2
       if [ -n "$TCP" ]; then echo "tcp:127.0.0.1:$((port + off))"; else echo "unix:$work/$1"; fi; }
# A host's listeners: its Unix socket always (a host serves one, /run/apir/host.sock by default,
# which a second host could not take), and its TCP port with --tcp.
listen() { echo --listen "unix:$work/$1"; [ -z "$TCP" ] || echo --listen "$(ep "$1")"; }
if [ -n "$LINK" ]; then
  [ -n "$TCP" ] || { echo "--link needs --tcp"; exit 2; }
  lo_mtu=$(cat /sys/class/net/lo/mtu)
  # tbf needs a burst of at least a packet: a 1500-byte MTU keeps packets, and so bursts, small.
  ip link set lo mtu 1500 && tc qdisc add dev lo root tbf rate "$LINK" burst 4kb latency 50ms ||
    { echo "cannot shape the loopback (root, tc)"; exit 1; }
fi
"$B/apir-whisper-gen" -i "$W/share/for-tests-ggml-tiny.bin" -o "$work/m.bin" --seed 1 --text-ctx 72 >/dev/null || exit 1
"$B/apir-host" $(listen h.sock) --backend "$BACKEND" --threads "$THREADS" --log-level "$HOST_LOG" >"$work/host.log" 2>&1 &
hp=$!
# debug: a line per graph (import, checks + compute), for the breakdown below; idle until then.
"$B/apir-host" $(listen hd.sock) --backend "$BACKEND" --threads "$THREADS" --log-level debug >"$work/hostd.log" 2>&1 &
hpd=$!
# The B side's setting, for the A/B lines below.
AB=
for part in ${HOSTB:+"host $HOSTB"} ${HOSTB_BIN:+"host $HOSTB_BIN"} ${GUESTB:+"guest $GUESTB"}; do AB=${AB:+$AB, }$part; done
if [ -n "$AB" ]; then
  env ${HOSTB:+"$HOSTB"} "${HOSTB_BIN:-$B/apir-host}" $(listen hb.sock) --backend "$BACKEND" --threads "$THREADS" --log-level "$HOST_LOG" \
    >"$work/hostb.log" 2>&1 &
  hpb=$!
fi
# Each host listening before any guest runs (a guest that finds none computes on its own CPU).
listening() { local e; e=$(ep "$1")
              case $e in unix:*) [ -S "${e#unix:}" ] ;; *) [ -n "$(ss -Hltn "sport = :${e##*:}")" ] ;; esac; }
for _ in $(seq 1 300); do
  listening h.sock && listening hd.sock && { [ -z "$AB" ] || listening hb.sock; } && break
  sleep 0.05
done
args=(-m "$work/m.bin" -f "$W/share/jfk.wav" -t "$THREADS" -bs 1 -bo 1 -nf -nt -l en)
native=(); [ "$BACKEND" = CPU ] && native=(-ng)
# One whisper-cli run through APIR0: guest SOCKET ERRFILE [VAR=VAL...] (the profile on).
# Each run of the table's rounds also times its scheduler calls from inside (bench/step_split.c:
# plan, compute, between), appended to $work/ERRFILE's base name.split; split=() leaves it out.
split() { [ -e "$B/libapir-step-split.so" ] &&
          echo LD_PRELOAD="$B/libapir-step-split.so" APIR_STEP_SPLIT_FILE="$work/${1%.err}.split" APIR_STEP_SPLIT_ALL=1; }
guest() {
  local sock=$1 err=$2; shift 2
  env CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH="$B/libggml-apir.so" APIR_HOST="$(ep "$sock")" APIR_PROFILE=1 $(split "$err") "$@" \
    "$W/bin/whisper-cli" "${args[@]}" -dev 0 >/dev/null 2>"$work/$err"
}
t() { grep -m1 "$1 time" "$2" | sed -E 's/.*= *([0-9.]+) ms.*\( *([0-9.]+) ms per run\).*/\2/; s/.*= *([0-9.]+) ms.*/\1/'; }
dev() { grep -o 'using [A-Za-z0-9]* backend' "$1" | head -1 | awk '{print $2}' | grep . || echo CPU; }
# A guest that cannot reach its host falls back to its own CPU: its figures would be native's.
on_apir() { case $(dev "$1") in APIR*) ;; *) echo "error: $2 did not run on APIR0 (its host unreachable?):"; grep -i -m5 "apir\|error" "$1"; exit 1 ;; esac; }
# A run's row name: n native, a apir, b apir-b, o apir-off.
label() { case $1 in n) echo native ;; a) echo apir ;; b) echo apir-b ;; o) echo apir-off ;; esac; }
printf '%-8s %10s %10s %14s\n' run load_ms encode_ms decode_ms/step
for r in $(seq 1 "$ROUNDS"); do
  env $(split n.err) "$W/bin/whisper-cli" "${args[@]}" "${native[@]}" >/dev/null 2>"$work/n.err"
  guest h.sock a.err
  runs=(n a)
  if [ -n "$AB" ]; then
    guest hb.sock b.err ${GUESTB:+"$GUESTB"}
    runs+=(b)
  fi
  if [ -n "$OFF" ]; then
    guest h.sock o.err APIR_GRAPH_INPUTS=0 APIR_ASK_SERIES=0
    runs+=(o)
  fi
  for s in "${runs[@]}"; do [ "$s" = n ] || on_apir "$work/$s.err" "run $s of round $r"; done
  for s in "${runs[@]}"; do
    name=$(label "$s")
    printf '%-8s %10s %10s %14s\n' "$name" "$(t load "$work/$s.err")" "$(t encode "$work/$s.err")" "$(t decode "$work/$s.err")"
  done | tee -a "$work/rows"
done
awk '$1=="native"{nl+=$2;ne+=$3;nd+=$4;n++} $1=="apir"{al+=$2;ae+=$3;ad+=$4} $1=="apir-off"{od+=$4;o++}
     END{printf "apir/native (means of %d rounds): load %.2fx  encode %.2fx  decode step %.2fx\n", n, al/nl, ae/nl*nl/ne, ad/nd
         if (o) printf "apir-off/native (0.8 decode-step features off): decode step %.2fx\n", od/nd}' "$work/rows"
# The ratio of medians too: one slow native round (a busy machine) moves a mean a lot.
# The median of the numbers on stdin, one a line.
mid() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2 }'; }
med() { awk -v k="$1" '$1 == k { print $4 }' "$work/rows" | mid; }
awk -v n="$(med native)" -v a="$(med apir)" -v o="$(med apir-off)" 'BEGIN { if (n > 0) {
  printf "decode step, medians: native %.3f ms, apir %.3f ms (%.3fx)", n, a, a / n
  if (o != "") printf ", apir-off %.3f ms (%.3fx)", o, o / n
  printf "\n" } }'
if [ -n "$AB" ]; then
  # The A/B: decode-step medians, and the host's import of the decoder's graphs (the most
  # frequent node count) over every round, host A (its apir and apir-off guests) against B.
  imp() { local n; n=$(sed -n 's/.*: \([0-9]*\) nodes in [0-9]* piece(s).*/\1/p' "$1" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
          sed -n "s/.* imported $n nodes in \([0-9.]*\) us.*/\1/p" "$1" | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%.1f us (%d graphs)", (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2, NR }'; }
  awk -v a="$(med apir)" -v b="$(med apir-b)" -v n="$(med native)" -v e="$AB" 'BEGIN { if (a > 0 && b > 0)
    printf "host A/B: decode step medians apir %.3f ms, apir-b (%s) %.3f ms (%.3fx native); apir/apir-b %.3f\n", a, e, b, b / n, a / b }'
  [ "$HOST_LOG" = debug ] &&
    echo "host A/B: decoder graph import, medians over all rounds: host A $(imp "$work/host.log"), host B $(imp "$work/hostb.log")"
fi
# Where the step's time differs: the medians over the rounds of each run's split (the decoder's
# graphs): plan (ggml's scheduler: split and allocation, apir's cached answers), compute (the
# graph's trip through the backend), between (whisper.cpp's own work between two graphs).
if [ -s "$work/n.split" ]; then
  echo "step split (bench/step_split.c), medians over the rounds, us:  plan  compute  between"
  for s in n a b o; do
    [ -s "$work/$s.split" ] || continue
    name=$(label "$s")
    part() { sed -n "s/^step split: .* $1 \([0-9.-]*\) us.*/\1/p" "$work/$s.split" | mid; }
    printf "  %-56s %8.1f %8.1f %8.1f\n" "$name" "$(part plan)" "$(part compute)" "$(part between)"
  done
  # What whisper.cpp's mean sees and the medians leave out: each decode step's whole cycle (its
  # plan and compute and the program's work after it, to the next graph's plan: on a GPU host
  # apir's compute returns at the launch and the wait falls after it), each run's graphs of the
  # decoder's node count after its first (the prompt's), as a mean and a median per run, and the
  # first three steps' mean (new shapes: questions the guest's cache does not have yet, graphs the
  # host imports whole; natively, CUDA graphs captured); medians over the rounds.
  echo "decode step cycles per run (us; medians over the rounds):             mean  median  first 3"
  for s in n a b o; do
    [ -s "$work/$s.split" ] || continue
    name=$(label "$s")
    runs=$(sed 's/[:,]//g' "$work/$s.split" | awk '
      function flush(  i, j, c, best, k, v, t, sum, first, m) {
        if (!n) return
        for (i = 1; i <= n; i++) c[nodes[i]]++
        best = ""
        for (k in c) if (best == "" || c[k] > c[best]) best = k
        m = 0
        for (i = 1; i < n; i++) if (nodes[i] == best && bt[i + 1] >= 0) v[++m] = pl[i] + co[i] + bt[i + 1]
        sum = 0; first = 0
        for (i = 2; i <= m; i++) { sum += v[i]; if (i <= 4) first += v[i]; w[i - 1] = v[i] }
        for (i = 1; i < m; i++) for (j = i + 1; j < m; j++) if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
        if (m > 4) print sum / (m - 1), (w[int(m / 2)] + w[int((m + 1) / 2)]) / 2, first / 3
        n = 0; split("", c); split("", v); split("", w) }
      $1 == "graph" && $2 == 0 { flush() }
      $1 == "graph" { n++; nodes[n] = $3; pl[n] = $6; co[n] = $9; bt[n] = $12 }
      END { flush() }')
    col() { echo "$runs" | awk -v c="$1" '{ print $c }' | mid; }
    printf "  %-56s %8.1f %8.1f %8.1f\n" "$name" "$(col 1)" "$(col 2)" "$(col 3)"
  done
fi
echo "devices (last round): native $(dev "$work/n.err"), apir $(dev "$work/a.err")"
steps() { grep -o 'decode time = [^/]*/ *[0-9]*' "$1" | grep -o '[0-9]*$'; }
echo "round trips (last APIR0 run, $(steps "$work/a.err") decode steps; APIR_PROFILE):"
grep 'apir profile' "$work/a.err" | sed 's/^/  /'
if [ -n "$OFF" ]; then
  echo "round trips with the 0.8 decode-step features off (last apir-off run):"
  grep 'apir profile' "$work/o.err" | grep -v 'serialization\|data area' | sed 's/^/  /'
fi
# Per decode step: the same run with a shorter decoder context (fewer decode steps,
# the same load and encode), the difference in each command's count divided by the
# difference in steps.
"$B/apir-whisper-gen" -i "$W/share/for-tests-ggml-tiny.bin" -o "$work/m40.bin" --seed 1 --text-ctx 40 >/dev/null || exit 1
args[1]=$work/m40.bin
guest h.sock a40.err
calls() { sed -n 's/.*apir profile [A-Z0-9]*: \([A-Z_]*\) *\([0-9]*\) calls.*/\1 \2/p' "$1"; }
per_step() { # long.err short.err label
  echo "per decode step, $3 (runs of $(steps "$1") and $(steps "$2") decode steps):"
  join -a1 -a2 -e0 -o 0,1.2,2.2 <(calls "$1" | sort) <(calls "$2" | sort) |
    awk -v d=$(( $(steps "$1") - $(steps "$2") )) \
      'd > 0 && $2 != $3 { printf "  %-30s %6.2f\n", $1, ($2 - $3) / d; t += ($2 - $3) / d } END { if (d > 0) printf "  %-30s %6.2f\n", "all commands (round trips)", t }'
}
per_step "$work/a.err" "$work/a40.err" apir
if [ -n "$OFF" ]; then
  guest h.sock o40.err APIR_GRAPH_INPUTS=0 APIR_ASK_SERIES=0
  per_step "$work/o.err" "$work/o40.err" apir-off
fi
# Where a decode step's time goes, from one more APIR0 run against the debug host (its only
# guest, guest#1): the host's lines per graph (the decoder's graphs: those with its node count,
# the most frequent one; medians, as the prompt's graph is among them), the guest's
# serialization (a mean over all its graphs) and questions.
args[1]=$work/m.bin
guest hd.sock d.err
for _ in $(seq 1 100); do grep -q "guest#1(.*disconnected" "$work/hostd.log" && break; sleep 0.02; done
grep "guest#1(" "$work/hostd.log" >"$work/last.log"
host_import() { sed -n "s/.* imported $1 nodes in \([0-9.]*\) us.*/\1/p" "$work/last.log"; }
host_compute() { sed -n "s/.*: $1 nodes in [0-9]* piece(s), \([0-9.]*\) us.*/\1/p" "$work/last.log"; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f", (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2 / 1e3 }'; }
n=$(sed -n 's/.*: \([0-9]*\) nodes in [0-9]* piece(s).*/\1/p' "$work/last.log" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
if [ -n "$n" ]; then
  step=$(t decode "$work/d.err")
  ser=$(sed -n 's/.*graph serialization.* \([0-9.]*\) us each/\1/p' "$work/d.err")
  q=$(sed -n 's/.*DEVICE_SUPPORTS_OP_L .* \([0-9.]*\) us each/\1/p' "$work/d.err")
  # questions a step: the difference of the two runs' counts, as above
  qn=$(join <(calls "$work/a.err" | sort) <(calls "$work/a40.err" | sort) | awk -v d="$(( $(steps "$work/a.err") - $(steps "$work/a40.err") ))" \
    '$1 == "DEVICE_SUPPORTS_OP_L" && d > 0 { print ($2 - $3) / d }')
  awk -v step="$step" -v n="$n" -v g="$(host_compute "$n" | wc -l)" -v ci="$(host_import "$n" | median)" \
      -v cc="$(host_compute "$n" | median)" -v ser="${ser:-0}" -v q="${q:-0}" -v qn="${qn:-0}" 'BEGIN {
    printf "decode step of an APIR0 run against a host at debug: %.3f ms; medians over its %d graphs of %d nodes:\n", step, g, n
    printf "  host: import (decode and checks)      %7.3f ms\n", ci
    printf "  host: index checks and compute        %7.3f ms\n", cc
    printf "  guest: serialization (mean, all)      %7.3f ms\n", ser / 1e3
    printf "  guest: %.0f supports_op question(s)     %7.3f ms (at their mean)\n", qn, qn * q / 1e3
    printf "  the rest (graph build, trips, waits)  %7.3f ms\n", step - ci - cc - ser / 1e3 - qn * q / 1e3 }'
fi
