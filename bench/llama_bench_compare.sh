#!/usr/bin/env bash
# llama-bench natively, through apir and through ggml-rpc, side by side on the
# same generated model, printing the ratios.  Each configuration is run in
# turn, repeatedly interleaved, so machine noise hits all three alike.
#
# usage: bench/llama_bench_compare.sh [options]
#   --build DIR       apir build folder (default build)
#   --deps-bin DIR    llama.cpp tools (default .deps/bin)
#   --model FILE      use this model instead of generating one
#   --size S --type T model to generate (default 1b q4_0), cached in ~/.cache/apir/models
#   --backend B       host backend (default CPU; CUDA on a GPU machine)
#   -p N -n N -r N -t N  llama-bench prompt/gen/repetitions/threads (64 32 3 2)
#   --ngl N --fa 0|1  layers to offload, flash attention (99, 0)
#   --rounds N        interleaved rounds (default 1)
#   --no-rpc          skip ggml-rpc
#   --tcp             also through apir over loopback TCP (tcp:127.0.0.1, the
#                     stream transport: no shared memory, as between machines)
#   --tls             also through apir over loopback TLS 1.3 (tls:127.0.0.1, a
#                     pre-shared key): the tls column, and tls/tcp with --tcp
#   --tcp-b VAR=VAL   also over TCP to a second apir-host started with that
#                     environment (an A/B of a host setting, interleaved with
#                     the rest): the tcpb column, and tcp/tcpb with --tcp; with
#                     --tls the second host serves TLS too: the tlsb column,
#                     and tls/tlsb
#   --host-b-bin PATH the second host is that apir-host binary (another build:
#                     an A/B of a host change), with --tcp-b's setting
#   --unix-b VAR=VAL  also through a second apir-host on its own Unix socket,
#                     started with that environment (an A/B of a host setting
#                     on shared memory): the apirb column, and apir/apirb
#   APIR_GUEST_B_ENV=VAR=VAL (environment): the apirb and tcpb guests' own
#                     settings (an A/B of a guest setting, or of both sides)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build DEPS_BIN=$ROOT/.deps/bin MODEL= SIZE=1b TYPE=q4_0 BACKEND=CPU
P=64 N=32 R=3 T=2 NGL=99 FA=0 ROUNDS=1 RPC=1 TCP=0 TLS=0 TCPB= HOSTB_BIN= UNIXB=
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift;; --deps-bin) DEPS_BIN=$2; shift;; --model) MODEL=$2; shift;;
    --size) SIZE=$2; shift;; --type) TYPE=$2; shift;; --backend) BACKEND=$2; shift;;
    -p) P=$2; shift;; -n) N=$2; shift;; -r) R=$2; shift;; -t) T=$2; shift;;
    --ngl) NGL=$2; shift;; --fa) FA=$2; shift;; --rounds) ROUNDS=$2; shift;; --no-rpc) RPC=0;; --tcp) TCP=1;; --tls) TLS=1;;
    --tcp-b) TCPB=$2; shift;; --host-b-bin) HOSTB_BIN=$2; shift;; --unix-b) UNIXB=$2; shift;;
    *) echo "unknown option $1"; exit 2;;
  esac
  shift
done
if [ -z "$MODEL" ]; then
  mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/apir/models"
  MODEL="${XDG_CACHE_HOME:-$HOME/.cache}/apir/models/llama-$SIZE-$TYPE.gguf"
  [ -f "$MODEL" ] || "$BUILD/apir-gguf-gen" -o "$MODEL" --size "$SIZE" --type "$TYPE"
fi
work=$(mktemp -d)
host_pid= rpc_pid= hostb_pid= unixb_pid=
cleanup() { [ -n "$host_pid" ] && kill "$host_pid" 2>/dev/null; [ -n "$rpc_pid" ] && kill "$rpc_pid" 2>/dev/null
            [ -n "$hostb_pid" ] && kill "$hostb_pid" 2>/dev/null; [ -n "$unixb_pid" ] && kill "$unixb_pid" 2>/dev/null
            wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

stream=()
[ "$TCP" = 1 ] && stream=(--listen tcp:127.0.0.1:0)
if [ "$TLS" = 1 ]; then
  # A random 32-byte key for this run (IDENTITY:HEXKEY, README's TLS section).
  (umask 077; echo "bench:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$work/psk")
  stream+=(--listen tls:127.0.0.1:0 --tls-psk-file "$work/psk")
fi
"$BUILD/apir-host" --listen "unix:$work/apir.sock" "${stream[@]}" --backend "$BACKEND" --threads "$T" --log-level info \
  >"$work/host.log" 2>&1 &
host_pid=$!
if [ -n "$TCPB" ]; then
  tlsb=(); [ "$TLS" = 1 ] && tlsb=(--listen tls:127.0.0.1:0 --tls-psk-file "$work/psk")
  env "$TCPB" "${HOSTB_BIN:-$BUILD/apir-host}" --listen "unix:$work/tcpb.sock" --listen tcp:127.0.0.1:0 "${tlsb[@]}" --backend "$BACKEND" --threads "$T" --log-level info \
    >"$work/hostb.log" 2>&1 &
  hostb_pid=$!
fi
if [ -n "$UNIXB" ]; then
  env "$UNIXB" "$BUILD/apir-host" --listen "unix:$work/apirb.sock" --backend "$BACKEND" --threads "$T" --log-level info \
    >"$work/unixb.log" 2>&1 &
  unixb_pid=$!
fi
if [ "$RPC" = 1 ]; then
  port=$(( 20000 + RANDOM % 20000 ))
  (cd "$DEPS_BIN" && exec ./ggml-rpc-server -H 127.0.0.1 -p "$port" -t "$T" -d "$( [ "$BACKEND" = CPU ] && echo CPU || echo "${BACKEND}0")" >"$work/rpc.log" 2>&1) &
  rpc_pid=$!
fi
for _ in $(seq 1 300); do [ -S "$work/apir.sock" ] && { [ -z "$UNIXB" ] || [ -S "$work/apirb.sock" ]; } && break; sleep 0.02; done
sleep 0.5
tcp_ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$work/host.log" | head -1 | cut -d' ' -f2 || true)
[ "$TCP" = 1 ] && [ -z "$tcp_ep" ] && { echo "apir-host did not listen on TCP:"; cat "$work/host.log"; exit 1; }
tls_ep=$(grep -o 'serving tls:127\.0\.0\.1:[0-9]*' "$work/host.log" | head -1 | cut -d' ' -f2 || true)
[ "$TLS" = 1 ] && [ -z "$tls_ep" ] && { echo "apir-host did not listen on TLS:"; cat "$work/host.log"; exit 1; }
tcpb_ep=
if [ -n "$TCPB" ]; then
  for _ in $(seq 1 100); do grep -q 'serving tcp:' "$work/hostb.log" && break; sleep 0.05; done
  tcpb_ep=$(grep -o 'serving tcp:127\.0\.0\.1:[0-9]*' "$work/hostb.log" | head -1 | cut -d' ' -f2 || true)
  [ -z "$tcpb_ep" ] && { echo "the second apir-host ($TCPB) did not listen on TCP:"; cat "$work/hostb.log"; exit 1; }
  tlsb_ep=$(grep -o 'serving tls:127\.0\.0\.1:[0-9]*' "$work/hostb.log" | head -1 | cut -d' ' -f2 || true)
  [ "$TLS" = 1 ] && [ -z "$tlsb_ep" ] && { echo "the second apir-host ($TCPB) did not listen on TLS:"; cat "$work/hostb.log"; exit 1; }
fi

common=(-m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" -fa "$FA" -o csv)
run() { # name, extra args...; appends "name test ts" lines
  local name=$1; shift
  (cd "$DEPS_BIN" && "$@") 2>>"$work/$name.err" | awk -v name="$name" '
    # the header is bare; data fields are quoted and may hold commas
    # (backends "CUDA,APIR")
    NR == 1 { n = split($0, f, ","); for (i = 1; i <= n; i++) col[f[i]] = i; next }
    { line = $0; sub(/^"/, "", line); sub(/"$/, "", line); n = split(line, f, /","/) }
    { test = (f[col["n_prompt"]] > 0) ? "pp" f[col["n_prompt"]] : "tg" f[col["n_gen"]];
      print name, test, f[col["avg_ts"]] }' >>"$work/results"
}
if [ "$BACKEND" = CPU ]; then native=(-ngl 0 -dev none); else native=(-ngl "$NGL"); fi
for round in $(seq 1 "$ROUNDS"); do
  run native ./llama-bench "${common[@]}" "${native[@]}"
  # APIR_GUEST_ENV: e.g. CUDA_VISIBLE_DEVICES= so the guest sees no GPU itself
  run apir env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$work/apir.sock" \
    ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ -n "$UNIXB" ] && run apirb env ${APIR_GUEST_ENV:-} ${APIR_GUEST_B_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$work/apirb.sock" \
    ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ "$TCP" = 1 ] && run tcp env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="$tcp_ep" \
    ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ -n "$TCPB" ] && run tcpb env ${APIR_GUEST_ENV:-} ${APIR_GUEST_B_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="$tcpb_ep" \
    ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ "$TLS" = 1 ] && run tls env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="$tls_ep" \
    APIR_TLS_PSK_FILE="$work/psk" ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ "$TLS" = 1 ] && [ -n "$TCPB" ] && run tlsb env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" \
    APIR_HOST="$tlsb_ep" APIR_TLS_PSK_FILE="$work/psk" ./llama-bench "${common[@]}" -ngl "$NGL" -dev APIR0
  [ "$RPC" = 1 ] && run rpc env ${APIR_GUEST_ENV:-} ./llama-bench "${common[@]}" -ngl "$NGL" -rpc "127.0.0.1:$port" -dev RPC0
done
# Model load time (bench/model_load.c: median of 3 loads after a warm-up),
# natively and through APIR0, interleaved like the rest.
if [ -x "$BUILD/apir-load-bench" ]; then
  if [ "$BACKEND" = CPU ]; then native_dev=CPU; else native_dev=${BACKEND}0; fi
  for round in $(seq 1 "$ROUNDS"); do
    (cd "$DEPS_BIN" && "$BUILD/apir-load-bench" -m "$MODEL" -d "$native_dev" -r 3) 2>>"$work/load.err" >>"$work/load"
    (cd "$DEPS_BIN" && env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$work/apir.sock" \
      "$BUILD/apir-load-bench" -m "$MODEL" -d APIR0 -r 3) 2>>"$work/load.err" >>"$work/load"
    [ "$TCP" = 1 ] && (cd "$DEPS_BIN" && env ${APIR_GUEST_ENV:-} GGML_BACKEND_PATH="$BUILD/libggml-apir.so" \
      APIR_HOST="$tcp_ep" "$BUILD/apir-load-bench" -m "$MODEL" -d APIR0 -r 3) 2>>"$work/load.err" | sed 's/APIR0/TCP/' >>"$work/load"
  done
fi
echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)), host backend $BACKEND"
echo "llama-bench ${common[*]}; $ROUNDS round(s), the configurations interleaved"
[ -n "$UNIXB" ] && echo "apirb: through a second apir-host on its own Unix socket, started with $UNIXB"
[ -n "$TCPB" ] && echo "tcpb$([ "$TLS" = 1 ] && echo ", tlsb"): over TCP$([ "$TLS" = 1 ] && echo " and TLS") to a second apir-host started with $TCPB"
# One table per comparison, with only the columns that were measured.
cols="native apir"
[ -n "$UNIXB" ] && cols="$cols apirb"
[ "$TCP" = 1 ] && cols="$cols tcp"
[ -n "$TCPB" ] && cols="$cols tcpb"
[ "$TLS" = 1 ] && cols="$cols tls"
[ "$TLS" = 1 ] && [ -n "$TCPB" ] && cols="$cols tlsb"
[ "$RPC" = 1 ] && cols="$cols rpc"
echo
echo "throughput (tokens/s, higher is better; ratios against native):"
awk -v cols="$cols" '
  { sum[$1 " " $2] += $3; cnt[$1 " " $2]++; if (!($2 in seen)) { seen[$2] = 1; order[++nt] = $2 } }
  END {
    nc = split(cols, c, " ");
    line = sprintf("  %-8s", "test");
    for (i = 1; i <= nc; i++) line = line sprintf(" %11s", c[i] " t/s");
    for (i = 2; i <= nc; i++) line = line sprintf(" %10s", c[i] "/native");
    if (cols ~ /tcp/ && cols ~ /rpc/) line = line sprintf(" %9s", "tcp/rpc");
    else if (cols ~ /rpc/) line = line sprintf(" %9s", "apir/rpc");
    if (cols ~ /tcp/ && cols ~ /tls/) line = line sprintf(" %9s", "tls/tcp");
    if (cols ~ /tcp / && cols ~ /tcpb/) line = line sprintf(" %9s", "tcp/tcpb");
    if (cols ~ /tlsb/) line = line sprintf(" %9s", "tls/tlsb");
    if (cols ~ /apirb/) line = line sprintf(" %10s", "apir/apirb");
    print line;
    # pp rows first, then tg, each in the order measured
    for (pass = 1; pass <= 2; pass++) for (k = 1; k <= nt; k++) {
      t = order[k]; if ((pass == 1) != (t ~ /^pp/)) continue;
      line = sprintf("  %-8s", t);
      for (i = 1; i <= nc; i++) { key = c[i] " " t; v[i] = cnt[key] ? sum[key] / cnt[key] : 0;
                                  line = line (cnt[key] ? sprintf(" %11.2f", v[i]) : sprintf(" %11s", "-")) }
      for (i = 2; i <= nc; i++) line = line ((v[1] && v[i]) ? sprintf(" %10.3f", v[i] / v[1]) : sprintf(" %10s", "-"));
      for (i = 1; i <= nc; i++) { if (c[i] == "rpc") r = v[i]; if (c[i] == "tcp") tc = v[i]; if (c[i] == "apir") ap = v[i];
                                  if (c[i] == "tls") tl = v[i]; if (c[i] == "tcpb") tb = v[i]; if (c[i] == "tlsb") lb = v[i]
                                  if (c[i] == "apirb") ab = v[i] }
      if (cols ~ /tcp/ && cols ~ /rpc/) line = line ((r && tc) ? sprintf(" %9.3f", tc / r) : sprintf(" %9s", "-"));
      else if (cols ~ /rpc/) line = line ((r && ap) ? sprintf(" %9.3f", ap / r) : sprintf(" %9s", "-"));
      if (cols ~ /tcp/ && cols ~ /tls/) line = line ((tc && tl) ? sprintf(" %9.3f", tl / tc) : sprintf(" %9s", "-"));
      if (cols ~ /tcp / && cols ~ /tcpb/) line = line ((tc && tb) ? sprintf(" %9.3f", tc / tb) : sprintf(" %9s", "-"));
      if (cols ~ /tlsb/) line = line ((tl && lb) ? sprintf(" %9.3f", tl / lb) : sprintf(" %9s", "-"));
      if (cols ~ /apirb/) line = line ((ap && ab) ? sprintf(" %10.3f", ap / ab) : sprintf(" %10s", "-"));
      print line;
    }
  }' "$work/results"
if [ -s "$work/load" ]; then
  echo
  echo "model load (milliseconds, lower is better; median of 3 loads after a warm-up):"
  awk -v nd="${native_dev:-CPU}" '
    { if ($2 == "APIR0") { a += $3; na++ } else if ($2 == "TCP") { c += $3; nc++ } else if ($2 == nd) { n += $3; nn++ } }
    END { printf "  %-8s %10s %10s %12s\n", "", "native ms", "apir ms", "apir/native";
          if (na && nn) printf "  %-8s %10.1f %10.1f %12.3f\n", "unix", n / nn, a / na, (a / na) / (n / nn);
          if (nc && nn) printf "  %-8s %10.1f %10.1f %12.3f   (over loopback TCP: the weights travel in the stream)\n",
                               "tcp", n / nn, c / nc, (c / nc) / (n / nn) }' "$work/load"
fi
echo
load1=$(cut -d' ' -f1 /proc/loadavg)
echo "conditions: $(nproc) core(s), load average $load1 at the end; native and apir each run with -t $T."
echo "  The ratios hold for an otherwise idle machine. With fewer cores than host threads plus the"
echo "  program's own threads (2 cores here), apir's host and the program compete for them and tg drops"
echo "  (0.8-0.95 on a busy 2-core machine); with a GPU host, or cores to spare, apir matches native."
# The host's own account of each guest, the last guest of each kind only.
echo
echo "apir host's account of the last guest:"
# (the last that computed graphs: llama-bench's, not apir-load-bench's)
last_guest() { { grep -E 'disconnected after' "$1" | tail -1; grep -E 'profile: graphs:' "$1" | tail -1; } | grep -oE 'guest#[0-9]+' | tail -1; }
last=$(last_guest "$work/host.log")
[ -n "$last" ] && grep -E "$last[^0-9].*(disconnected after|profile:)" "$work/host.log" | tail -7 | sed 's/^.*apir host: info: /  /'
if [ -n "$UNIXB" ]; then
  echo "the second host's ($UNIXB):"
  last=$(last_guest "$work/unixb.log")
  [ -n "$last" ] && grep -E "$last[^0-9].*(disconnected after|profile:)" "$work/unixb.log" | tail -7 | sed 's/^.*apir host: info: /  /'
fi
if [ ! -s "$work/results" ] || ! grep -q '^apir' "$work/results"; then
  echo "no apir results; errors:"; tail -5 "$work"/*.err "$work/host.log"; exit 1
fi
