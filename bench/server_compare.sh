#!/usr/bin/env bash
# llama-server throughput through APIR0 vs natively, side by side in one run:
# N concurrent greedy completions (default 16) against `-np 4` slots, rounds
# interleaved (native, then apir), one apir-host for the whole run.
#
#   bench/server_compare.sh [--backend CPU|CUDA] [--threads N] [--rounds N]
#                           [--requests N] [--np N] [--n-predict N] [--ctx N]
#                           [--model FILE | --size tiny|1b|8b --type q4_0|f16|...]
#
#   CPU:  native llama-server on the CPU backend (-ngl 0, CUDA hidden), apir-host
#         --backend CPU --threads N; both servers get -t N -tb N.
#   CUDA: native -dev CUDA0 -ngl 99; apir-host --backend CUDA.
#   Through APIR0 the server runs without CUDA (CUDA_VISIBLE_DEVICES=) with
#   GGML_BACKEND_PATH=build/libggml-apir.so and -dev APIR0 -ngl 99.
#
# Model: apir-gguf-gen's random weights (default 1b q4_0) with the tokenizer of
# the pinned llama.cpp's models/ggml-vocab-llama-spm.gguf (as tests/run_llama_tools.sh).
# Each server gets an untimed warm-up wave (np requests, 8 tokens), then the
# timed wave: throughput = generated tokens (ignore_eos: requests x n_predict) /
# wall time from the first request sent to the last answer.  Needs a build in
# build/, .deps/bin/llama-server (scripts/setup.sh's extras, or h200.sh's
# issue13 mode) and python3 (the HTTP client).  The host logs at info
# (APIR_HOST_LOG): its profile of the last server is printed at the end;
# APIR_KEEP=DIR keeps the work folder (server and host logs).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BACKEND=CPU THREADS=8 ROUNDS=2 REQUESTS=16 NP=4 NPRED=64 CTX=4096 MODEL="" SIZE=1b TYPE=q4_0
while [ $# -gt 0 ]; do
  case $1 in
  --backend) BACKEND=$2; shift 2 ;;
  --threads) THREADS=$2; shift 2 ;;
  --rounds) ROUNDS=$2; shift 2 ;;
  --requests) REQUESTS=$2; shift 2 ;;
  --np) NP=$2; shift 2 ;;
  --n-predict) NPRED=$2; shift 2 ;;
  --ctx) CTX=$2; shift 2 ;;
  --model) MODEL=$2; shift 2 ;;
  --size) SIZE=$2; shift 2 ;;
  --type) TYPE=$2; shift 2 ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
B=$ROOT/build BIN=${APIR_DEPS_BIN:-$ROOT/.deps/bin}
[ -x "$BIN/llama-server" ] || { echo "no $BIN/llama-server"; exit 1; }
command -v python3 >/dev/null || { echo "no python3"; exit 1; }
work=$(mktemp -d)
hp="" sp=""
trap '[ -n "$sp" ] && kill $sp 2>/dev/null; [ -n "$hp" ] && { kill $hp 2>/dev/null; wait $hp 2>/dev/null; }; [ -n "${APIR_KEEP:-}" ] && cp -r "$work" "$APIR_KEEP"; rm -rf "$work"' EXIT

if [ -z "$MODEL" ]; then
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BIN/../build/CMakeCache.txt")
  MODEL=$work/model.gguf
  "$B/apir-gguf-gen" -o "$MODEL" --size "$SIZE" --type "$TYPE" \
    --vocab-from "$src/models/ggml-vocab-llama-spm.gguf" | sed 's/^/model: /' || exit 1
fi

sock=$work/h.sock
"$B/apir-host" --listen "unix:$sock" --backend "$BACKEND" --threads "$THREADS" \
  --log-level "${APIR_HOST_LOG:-info}" >"$work/host.log" 2>&1 &
hp=$!
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done
[ -S "$sock" ] || { echo "apir-host did not start"; cat "$work/host.log"; exit 1; }

common=(-m "$MODEL" -np "$NP" -c "$CTX" -t "$THREADS" -tb "$THREADS" --host 127.0.0.1)
if [ "$BACKEND" = CPU ]; then
  native_env=(CUDA_VISIBLE_DEVICES=) native_dev=(-ngl 0)
else
  native_env=() native_dev=(-dev "${BACKEND}0" -ngl 99)
fi
apir_env=(CUDA_VISIBLE_DEVICES= GGML_BACKEND_PATH="$B/libggml-apir.so" APIR_HOST="unix:$sock")
apir_dev=(-dev APIR0 -ngl 99)

cat >"$work/client.py" <<'EOF'
import json, sys, threading, time, urllib.request, zlib
port, requests, npar, npred = (int(a) for a in sys.argv[1:5])
url = "http://127.0.0.1:%d" % port
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def post(i, n, out):
    body = json.dumps({"prompt": "The meaning of life is (request %d)" % i, "n_predict": n,
                       "temperature": 0, "top_k": 1, "seed": 1, "cache_prompt": False,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    try:
        out[i] = json.loads(opener.open(req, timeout=600).read())
    except Exception as e:
        out[i] = {"error": str(e)}
def wave(count, n):
    out = [None] * count
    th = [threading.Thread(target=post, args=(i, n, out)) for i in range(count)]
    t0 = time.perf_counter()
    for t in th: t.start()
    for t in th: t.join()
    return out, time.perf_counter() - t0
wave(npar, 8)                                   # warm-up, untimed
out, wall = wave(requests, npred)
bad = [r for r in out if "timings" not in r]
if bad:
    print("FAILED %d requests: %s" % (len(bad), bad[0])); sys.exit(1)
gen = sum(r["timings"]["predicted_n"] for r in out)
prompt = sum(r["timings"]["prompt_n"] for r in out)
step = sum(r["timings"]["predicted_ms"] for r in out) / gen
texts = "|".join(r["content"] for r in out)
print("%.3f %d %d %.1f %.2f %08x" % (wall, gen, prompt, gen / wall, step, zlib.crc32(texts.encode())))
EOF

# serve NAME ENV... -- ARGS...: one server, the warm-up and the timed wave; prints one row
serve() {
  local name=$1; shift
  local envs=() port=$((20000 + RANDOM % 20000))
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" "$BIN/llama-server" "${common[@]}" --port "$port" "$@" >"$work/$name.log" 2>&1 &
  sp=$!
  local up=0
  for _ in $(seq 1 1200); do
    python3 -c "import urllib.request as u,sys; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:$port/health', timeout=1)" \
      2>/dev/null && { up=1; break; }
    kill -0 $sp 2>/dev/null || break
    sleep 0.1
  done
  if [ $up = 0 ]; then echo "FAIL: llama-server ($name) did not come up"; tail -15 "$work/$name.log"; kill $sp 2>/dev/null; sp=""; return 1; fi
  local row
  row=$(python3 "$work/client.py" "$port" "$REQUESTS" "$NP" "$NPRED") || { echo "$row"; tail -5 "$work/$name.log"; }
  kill $sp; wait $sp 2>/dev/null; sp=""
  case $row in FAILED*|"") return 1 ;; esac
  printf '%-8s %s\n' "$name" "$row" | awk '{printf "%-8s %8.2f %6d %6d %10.1f %12.2f %10s\n", $1, $2, $3, $4, $5, $6, $7}' | tee -a "$work/rows"
}

echo "llama-server: backend $BACKEND, $REQUESTS concurrent requests x $NPRED tokens (greedy, ignore_eos), -np $NP -c $CTX -t $THREADS"
printf '%-8s %8s %6s %6s %10s %12s %10s\n' run wall_s gen prompt gen_tok/s ms/tok/slot texts
for r in $(seq 1 "$ROUNDS"); do
  serve native "${native_env[@]}" -- "${native_dev[@]}" || exit 1
  serve apir "${apir_env[@]}" -- "${apir_dev[@]}" || { tail -5 "$work/host.log"; exit 1; }
done
awk '$1=="native"{n+=$5;k++} $1=="apir"{a+=$5}
     END{printf "apir/native throughput (means of %d rounds): %.3f (native %.1f, apir %.1f tok/s)\n", k, a/n, n/k, a/k}' "$work/rows"
awk '$1=="native"{n[++i]=$7} $1=="apir"{a[++j]=$7} END{s=0; for (x=1;x<=i;x++) s+=(n[x]==a[x]); printf "same generated text as native: %d/%d rounds\n", s, i}' "$work/rows"
# The host's view of the last server (its session profile, printed when the guest leaves).
kill $hp; wait $hp 2>/dev/null; hp=""
grep -q 'profile: BACKEND_GRAPH' "$work/host.log" || echo "WARNING: the host computed no graph (APIR0 not used?)"
echo "host, last session (top commands):"
last=$(grep -o 'guest#[0-9]*(' "$work/host.log" | tail -1)
grep -F "$last" "$work/host.log" | grep profile | sed 's/^apir host: info: /  /' | head -8
