#!/usr/bin/env bash
# Many guests on one host (issue 26 item 4): N programs at once through one
# apir-host against N native programs, for each N, side by side.
#
#   bench/many_guests.sh [options]
#     --backend B      the host's backend and the native programs' (CPU, CUDA; default CPU)
#     --model FILE     the model (default: a generated --size/--type one, cached)
#     --size S --type T   (default tiny f16)
#     --n "1 4 16 64"  the guest counts
#     -p N -n N -t N   llama-bench's prompt, generation and threads per program (32 16 1)
#     --check          CI: assert every guest was admitted and finished, its rows printed and its
#                      greedy tokens equal to native's; no timing verdict
#
# Per N, for native and apir each: the batch's wall time (all N started together, until the
# last ends), aggregate tokens/s (the sum of each program's llama-bench pp and tg t/s), the
# peak RSS of one program (native) against the guest's worker process on the host plus the
# guest program itself (apir), GPU memory per process (nvidia-smi, CUDA only), and the time
# to the first token: N greedy decoders of one token started together, from exec to exit
# (load, prompt, one token: what a user waits for), median and slowest.  Memory is sampled
# every 50 ms (peak RSS, VmHWM): programs that end sooner (the tiny model) show less.
#
# Admission: N guests of one tenant (one uid and cgroup, as here) started together need
# --max-clients-per-tenant and a spawn burst of N, and batches back to back room for the
# previous batch's workers still ending and rates that refill at once; the host is started
# with them (HOST_ARGS adds more).  Guests that are N tenants (containers, uids) are admitted
# with the defaults up to --max-clients (64).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build} DEPS_BIN=${DEPS_BIN:-$ROOT/.deps/bin}
BACKEND=CPU MODEL= SIZE=tiny TYPE=f16 NS="1 4 16 64" P=32 NG=16 T=1 CHECK=0
while [ $# -gt 0 ]; do
  case $1 in
    --backend) BACKEND=$2; shift;; --model) MODEL=$2; shift;; --size) SIZE=$2; shift;; --type) TYPE=$2; shift;;
    --n) NS=$2; shift;; -p) P=$2; shift;; -n) NG=$2; shift;; -t) T=$2; shift;; --check) CHECK=1;;
    *) echo "unknown option $1"; exit 2;;
  esac
  shift
done
if [ -z "$MODEL" ]; then
  mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/apir/models"
  MODEL="${XDG_CACHE_HOME:-$HOME/.cache}/apir/models/llama-$SIZE-$TYPE.gguf"
  [ -f "$MODEL" ] || "$BUILD/apir-gguf-gen" -o "$MODEL" --size "$SIZE" --type "$TYPE" >/dev/null || exit 1
fi
work=$(mktemp -d /tmp/apir-many-XXXXXX)
host_pid= sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  [ -n "$host_pid" ] && kill "$host_pid" 2>/dev/null
  wait 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT
gpu=0; [ "$BACKEND" != CPU ] && command -v nvidia-smi >/dev/null && gpu=1
max_n=0; for n in $NS; do [ "$n" -gt "$max_n" ] && max_n=$n; done
fails=0
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

if [ "$BACKEND" = CPU ]; then native_lb=(-ngl 0 -dev none); native_dev=CPU; else native_lb=(-ngl 99); native_dev=${BACKEND}0; fi
guest_env=(env GGML_BACKEND_PATH="$BUILD/libggml-apir.so" APIR_HOST="unix:$work/host.sock")
[ "$BACKEND" != CPU ] && guest_env+=(CUDA_VISIBLE_DEVICES=)

# sample PIDFILE OUT: every 50 ms, the peak RSS (VmHWM, KiB) of each pid listed (and of
# apir-host's worker children) and, on a GPU, each process's GPU memory
# (MiB); OUT gets "pid max_rss_kib max_gpu_mib" lines when killed.
sample() {
  local pids=$1 out=$2
  declare -A rss gmem
  trap 'for p in "${!rss[@]}"; do echo "$p ${rss[$p]} ${gmem[$p]:-0}"; done >"$out"; exit 0' TERM
  while :; do
    local list
    list=$(cat "$pids" 2>/dev/null)
    [ -n "$host_pid" ] && list="$list $(pgrep -P "$host_pid" 2>/dev/null | tr '\n' ' ')"
    for p in $list; do
      local r
      r=$(awk '/^VmHWM/ { print $2 }' "/proc/$p/status" 2>/dev/null)
      [ -n "$r" ] && [ "${rss[$p]:-0}" -lt "$r" ] && rss[$p]=$r
    done
    if [ "$gpu" = 1 ]; then
      while IFS=', ' read -r p m; do
        [ -n "$p" ] && [ "${gmem[$p]:-0}" -lt "${m%% *}" ] && gmem[$p]=${m%% *}
      done < <(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null)
    fi
    sleep 0.05 & wait $!
  done
}

# batch KIND N: N llama-bench at once; prints "wall_s agg_ts rss_kib gpu_mib ok"
batch() {
  local kind=$1 n=$2 i
  : >"$work/pids"
  sample "$work/pids" "$work/mem-$kind-$n" & sampler=$!
  local t0; t0=$(date +%s.%N)
  for i in $(seq 1 "$n"); do
    if [ "$kind" = native ]; then
      (cd "$DEPS_BIN" && exec ./llama-bench -m "$MODEL" -p "$P" -n "$NG" -r 1 -t "$T" "${native_lb[@]}" -o csv) \
        >"$work/$kind-$n-$i.csv" 2>"$work/$kind-$n-$i.err" &
    else
      (cd "$DEPS_BIN" && exec "${guest_env[@]}" ./llama-bench -m "$MODEL" -p "$P" -n "$NG" -r 1 -t "$T" -ngl 99 -dev APIR0 -o csv) \
        >"$work/$kind-$n-$i.csv" 2>"$work/$kind-$n-$i.err" &
    fi
    echo $! >>"$work/pids"
  done
  local ok=0
  for p in $(cat "$work/pids"); do wait "$p" && ok=$((ok + 1)); done
  local t1; t1=$(date +%s.%N)
  kill "$sampler"; wait "$sampler" 2>/dev/null; sampler=
  local agg
  agg=$(cat "$work/$kind-$n-"*.csv 2>/dev/null | awk '
        /^build_commit/ { n = split($0, f, ","); for (i = 1; i <= n; i++) if (f[i] == "avg_ts") col = i; next }
        /^"/ && col { line = $0; gsub(/^"|"$/, "", line); split(line, f, /","/); s += f[col] }
        END { printf "%.1f", s }')
  # per-process peak memory: the programs' own (native), or the guests' plus their workers (apir)
  local rss gmem
  rss=$(awk -v pids="$(tr '\n' ' ' <"$work/pids")" 'BEGIN { n = split(pids, a, " "); for (i = 1; i <= n; i++) prog[a[i]] = 1 }
        { if ($1 in prog) p += $2; else w += $2 } END { printf "%.0f %.0f", p, w }' "$work/mem-$kind-$n")
  gmem=$(awk '{ g += $3 } END { printf "%.0f", g }' "$work/mem-$kind-$n")
  echo "$(calc "$t1 - $t0") $agg $rss $gmem $ok"
}

# ttft KIND N: N one-token greedy decodes at once; prints "median_s max_s tokens_equal"
ttft() {
  local kind=$1 n=$2 i dev=$native_dev pre=()
  [ "$kind" = apir ] && { dev=APIR0; pre=("${guest_env[@]}"); }
  rm -f "$work/ttfail-$kind"
  for i in $(seq 1 "$n"); do
    # from DEPS_BIN, as llama-bench runs: ggml finds its backends (CUDA) beside the program or there
    ( cd "$DEPS_BIN" || exit; s=$(date +%s.%N); "${pre[@]}" "$BUILD/tests/apir-llama-greedy" -m "$MODEL" -d "$dev" -n 1 -t "$T" \
        >"$work/tt-$kind-$i.out" 2>"$work/tt-$kind-$i.err"; rc=$?; e=$(date +%s.%N)
      echo "$(calc "$e - $s") $rc" >"$work/tt-$kind-$i.time" ) &
  done
  wait
  local eq=1
  for i in $(seq 1 "$n"); do
    if ! grep -q "tokens:" "$work/tt-$kind-$i.out" 2>/dev/null; then
      eq=0
      [ -s "$work/ttfail-$kind" ] || { echo "$kind greedy $i:"; tail -3 "$work/tt-$kind-$i.err"; } >"$work/ttfail-$kind"
    fi
    # every run's tokens equal native's first run's
    cmp -s "$work/tt-$kind-$i.out" "$work/tt-native-1.out" || eq=0
  done
  sort -n "$work"/tt-"$kind"-*.time | awk '{ t[NR] = $1; bad += ($2 != 0) } END { printf "%.2f %.2f %d", t[int((NR + 1) / 2)], t[NR], bad }'
  echo " $eq"
  rm -f "$work"/tt-"$kind"-*.time
}

"$BUILD/apir-host" --listen "unix:$work/host.sock" --backend "$BACKEND" --threads "$T" --log-level info \
  --max-clients "$(( 2 * max_n > 64 ? 2 * max_n : 64 ))" --max-clients-per-tenant "$(( 2 * max_n ))" \
  --spawn-burst "$max_n" --spawn-rate 1000 --connect-burst "$(( 2 * max_n ))" --connect-rate 1000 ${HOST_ARGS:-} \
  >"$work/host.log" 2>&1 &
host_pid=$!
for _ in $(seq 1 500); do [ -S "$work/host.sock" ] && break; kill -0 "$host_pid" 2>/dev/null || break; sleep 0.02; done
[ -S "$work/host.sock" ] || { echo "apir-host did not start:"; cat "$work/host.log"; exit 1; }

echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)); backend $BACKEND; each program: llama-bench -p $P -n $NG -t $T -r 1"
echo "N: programs at once.  wall: the batch, start to last exit.  agg t/s: sum of every program's pp and tg t/s."
echo "RSS: one program's peak (apir: the guest program + its worker on the host).  ttft: exec to first token."
printf "%4s  %-6s %8s %10s %9s %12s %12s %9s %9s %6s %5s\n" N kind "wall s" "agg t/s" wall/nat "RSS MiB" "GPU MiB" "ttft p50" "ttft max" "ok" "eq"
for n in $NS; do
  read -r nw na nrp nrw ng nok <<<"$(batch native "$n")"
  read -r nt50 ntmax nbad neq <<<"$(ttft native "$n")"
  read -r aw aa arp arw ag aok <<<"$(batch apir "$n")"
  read -r at50 atmax abad aeq <<<"$(ttft apir "$n")"
  printf "%4d  %-6s %8.2f %10.1f %9s %12.1f %12s %9.2f %9.2f %3d/%-3d %5s\n" "$n" native "$nw" "$na" "" \
    "$(calc "$nrp / 1024 / $n")" "$([ "$gpu" = 1 ] && echo $((ng / n)) || echo -)" "$nt50" "$ntmax" "$nok" "$n" "-"
  printf "%4d  %-6s %8.2f %10.1f %9.3f %12s %12s %9.2f %9.2f %3d/%-3d %5s\n" "$n" apir "$aw" "$aa" "$(calc "$aw / $nw")" \
    "$(printf '%.1f+%.1f' "$(calc "$arp / 1024 / $n")" "$(calc "$arw / 1024 / $n")")" \
    "$([ "$gpu" = 1 ] && echo $((ag / n)) || echo -)" "$at50" "$atmax" "$aok" "$n" "$([ "$aeq" = 1 ] && echo yes || echo NO)"
  [ "$nbad" = 0 ] && [ "$neq" = 1 ] || fail "N=$n: native greedy runs failed ($nbad exit status): $(cat "$work/ttfail-native" 2>/dev/null)"
  [ "$aok" = "$n" ] || fail "N=$n: $((n - aok)) guest(s) failed: $(cat "$work"/apir-"$n"-*.err | grep -m2 -iE 'refused|fail|error')"
  [ "$abad" = 0 ] || fail "N=$n: $abad greedy guest(s) failed: $(cat "$work/ttfail-apir" 2>/dev/null)"
  [ "$aeq" = 1 ] || fail "N=$n: greedy tokens differ from native's"
  [ "$nok" = "$n" ] || fail "N=$n: $((n - nok)) native program(s) failed"
  rows=$(cat "$work"/apir-"$n"-*.csv 2>/dev/null | grep -c '^"')
  [ "$rows" -ge $((2 * n)) ] || fail "N=$n: $rows llama-bench rows from $n guests (2 each expected)"
done
refused=$(grep -c "guest refused" "$work/host.log")
echo "host: $(grep -c 'accepted\|connected' "$work/host.log") connection lines, $refused refused"
if [ "$CHECK" = 1 ]; then
  [ "$refused" = 0 ] || fail "the host refused $refused connection(s): $(grep -m2 'guest refused' "$work/host.log")"
  [ "$fails" = 0 ] && echo "many guests: every guest admitted and finished, tokens equal to native's"
fi
[ "$fails" = 0 ]
