#!/usr/bin/env bash
# The guest library for a program's own ggml.
#
#   scripts/guest-for.sh SOURCE
#     SOURCE: node-llama-cpp@X.Y.Z   the llama.cpp tree that npm package ships
#                                    (llama/gitRelease.bundle of `npm pack`)
#             FILE.bundle            a git bundle of a llama.cpp tree (its HEAD)
#             DIR                    a llama.cpp checkout (its git HEAD names it)
#
# Builds, for that tree, its llama.cpp programs (libllama, libggml*, the CPU
# backend, test-backend-ops, llama-bench) and a libggml-apir.so compiled against
# that tree's ggml headers, into a cache keyed by the tree's commit:
#     ~/.cache/apir/guest-<commit7>-<key>/
#        bin/       the tree's programs and libraries (its CPU backend next to them)
#        install/   its ggml and llama headers, libraries, CMake packages
#        lib/libggml-apir.so   the guest library for programs of this ggml
#        bin/apir-llama-greedy the greedy-decode check (tests/llama_greedy.c) on this tree
# A program of that ggml then loads the guest library as usual, e.g.
#     GGML_BACKEND_PATH=~/.cache/apir/guest-.../lib/libggml-apir.so llama-cli ...
# The tree is built once (~10-18 min on 2 cores); later runs only rebuild the
# guest library when apir's sources changed (seconds).
#
#   scripts/guest-for.sh --cached SOURCE   never fetch or build the tree: exit 3 when
#                                          it is not in the cache (tests use this)
#   scripts/guest-for.sh --whisper SOURCE  also whisper.cpp (../shared/third_party, as
#                                          scripts/setup.sh builds it) against that tree's ggml:
#     ~/.cache/apir/whisper-<whisper commit>-<commit7>-<key>/  (bin/whisper-cli, share/)
#   GUEST_DIR=... and GUEST_LIB=... (and WHISPER_DIR=...) are printed last on stdout
#   (the rest goes to stderr).
#   JOBS (default: nproc), APIR_CACHE (default ~/.cache/apir) as for scripts/setup.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${APIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/apir}
JOBS=${JOBS:-$(nproc)}

step_start=0
step() { step_start=$(date +%s); printf 'guest-for: %s ...\n' "$1" >&2; }
done_step() { printf 'guest-for:   done in %ss\n' "$(( $(date +%s) - step_start ))" >&2; }
die() { printf 'guest-for: error: %s\n' "$*" >&2; exit 1; }
. "$ROOT/scripts/llama_build.sh"

cached_only=0 with_whisper=0
while [ $# -gt 1 ]; do
  case $1 in
    --cached) cached_only=1 ;;
    --whisper) with_whisper=1 ;;
    *) break ;;
  esac
  shift
done
[ $# = 1 ] && [ "${1#--}" = "$1" ] || { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SPEC=$1

# ---- Which tree: its commit, and where its sources are ---------------------------
# An npm spec is remembered with its commit, so that --cached needs no registry
# (a bundle file is read again: its path may hold another bundle later).
SPECS="$CACHE/guest-sources"
spec_name() { printf '%s' "$1" | tr -c 'A-Za-z0-9@._-' '_'; }
bundle=""
if [ -d "$SPEC" ]; then
  SRC=$(cd "$SPEC" && pwd)
  [ -f "$SRC/ggml/include/ggml.h" ] || die "$SRC is not a llama.cpp tree (no ggml/include/ggml.h)"
  COMMIT=$(git -C "$SRC" rev-parse HEAD 2>/dev/null) || die "$SRC is not a git checkout: its commit names its cache"
  if [ -n "$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    echo "guest-for: warning: $SRC has uncommitted changes; the cache is keyed by $COMMIT alone" >&2
  fi
else
  remembered="$SPECS/$(spec_name "$SPEC")"
  if [ ! -f "$SPEC" ] && [ -f "$remembered" ]; then
    COMMIT=$(cat "$remembered")
  elif [ "$cached_only" = 1 ] && [ ! -f "$SPEC" ]; then
    echo "guest-for: $SPEC was never built here (scripts/guest-for.sh $SPEC builds it)" >&2
    exit 3
  else
    case $SPEC in
      *@*) step "fetching $SPEC (npm pack) and its llama.cpp bundle" ;;
      *) [ -f "$SPEC" ] || die "$SPEC: neither a directory, a bundle file nor node-llama-cpp@VERSION"
         step "reading the bundle $SPEC" ;;
    esac
    tmpdir=$(mktemp -d)
    trap 'rm -rf "$tmpdir"' EXIT
    bundle="$tmpdir/gitRelease.bundle"
    llama_fetch_bundle "$SPEC" "$bundle"
    COMMIT=$(git bundle list-heads "$bundle" 2>/dev/null | awk '$2 == "HEAD" { print $1 }')
    [ -n "$COMMIT" ] || COMMIT=$(git bundle list-heads "$bundle" 2>/dev/null | awk 'NR == 1 { print $1 }')
    [ -n "$COMMIT" ] || die "$SPEC: not a git bundle with a HEAD"
    done_step
  fi
  SRC="$CACHE/src-${COMMIT:0:7}"
fi

OPTS=$(llama_opts)
TARGETS="ggml ggml-cpu llama test-backend-ops llama-bench"
key=$(printf '%s %s %s guest' "$COMMIT" "$OPTS" "$TARGETS" | sha256sum | cut -c1-16)
GUEST="$CACHE/guest-${COMMIT:0:7}-$key"
STAMP="$GUEST/stamp"

# ---- The tree's own build (once per commit) ----------------------------------------
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$COMMIT $key" ]; then
  echo "guest-for: llama.cpp ${COMMIT:0:7} present ($GUEST)" >&2
elif [ "$cached_only" = 1 ]; then
  echo "guest-for: llama.cpp ${COMMIT:0:7} is not built in $GUEST (scripts/guest-for.sh $SPEC builds it)" >&2
  exit 3
else
  if [ ! -d "$SPEC" ] && [ ! -f "$SRC/.apir-verified" ]; then
    if [ -z "$bundle" ]; then
      tmpdir=$(mktemp -d)
      trap 'rm -rf "$tmpdir"' EXIT
      bundle="$tmpdir/gitRelease.bundle"
      llama_fetch_bundle "$SPEC" "$bundle"
    fi
    llama_clone "$bundle" "$COMMIT" "$SRC"
  fi
  rm -rf "$GUEST"
  mkdir -p "$GUEST"
  t0=$(date +%s)
  step "configuring llama.cpp ${COMMIT:0:7}"
  cmake -S "$SRC" -B "$GUEST/build" -G Ninja $OPTS -DCMAKE_INSTALL_PREFIX="$GUEST/install" \
    -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' >"$GUEST/configure.log" 2>&1 \
    || { tail -30 "$GUEST/configure.log" >&2; die "configure failed (log: $GUEST/configure.log)"; }
  done_step
  step "building ggml, libllama, test-backend-ops, llama-bench of ${COMMIT:0:7} (~10-18 min on 2 cores)"
  cmake --build "$GUEST/build" -j "$JOBS" --target $TARGETS >"$GUEST/build.log" 2>&1 \
    || { tail -30 "$GUEST/build.log" >&2; die "llama.cpp build failed (log: $GUEST/build.log)"; }
  done_step
  llama_install "$SRC" "$GUEST/build" "$GUEST"
  echo "$(( $(date +%s) - t0 ))" >"$GUEST/build-seconds"
  echo "$COMMIT $key" >"$STAMP"
fi
if [ ! -d "$SPEC" ] && [ ! -f "$SPEC" ]; then
  mkdir -p "$SPECS"
  echo "$COMMIT" >"$SPECS/$(spec_name "$SPEC")"
fi

# ---- The guest library against this tree's ggml --------------------------------------
# apir's CMake project configured with this tree as its ggml (APIR_DEPS): only the
# guest library and the greedy check are built, the host keeps the pinned ggml.
# One build folder per checkout of apir, so that two checkouts never share one.
apir_build="$GUEST/apir-$(printf '%s' "$ROOT" | sha256sum | cut -c1-8)"
step "building libggml-apir.so against ggml ${COMMIT:0:7}"
cmake -S "$ROOT" -B "$apir_build" -G Ninja -DAPIR_DEPS="$GUEST" -DAPIR_VIRGL=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$apir_build.configure.log" 2>&1 \
  || { tail -30 "$apir_build.configure.log" >&2; die "apir configure failed (log: $apir_build.configure.log)"; }
cmake --build "$apir_build" -j "$JOBS" --target ggml-apir apir-llama-greedy >"$apir_build.build.log" 2>&1 \
  || { tail -30 "$apir_build.build.log" >&2; die "libggml-apir.so build failed (log: $apir_build.build.log)"; }
mkdir -p "$GUEST/lib"
# Replaced by a rename: a program running with the old copy mapped keeps it intact.
cp -f "$apir_build/libggml-apir.so" "$GUEST/lib/libggml-apir.so.new"
mv -f "$GUEST/lib/libggml-apir.so.new" "$GUEST/lib/libggml-apir.so"
cp -f "$apir_build/tests/apir-llama-greedy" "$GUEST/bin/apir-llama-greedy.new"
mv -f "$GUEST/bin/apir-llama-greedy.new" "$GUEST/bin/apir-llama-greedy"
done_step

# ---- whisper.cpp against this tree's ggml (--whisper; once per pair of commits) -------
# Keyed by both commits and the tree's key: a rebuilt tree rebuilds whisper.cpp.
if [ "$with_whisper" = 1 ]; then
  wkey=$(printf '%s %s %s %s %s' "$WHISPER_COMMIT" "$COMMIT" "$key" "$WHISPER_OPTS" "$WHISPER_TARGETS" \
    | sha256sum | cut -c1-16)
  WHISPER="$CACHE/whisper-$WHISPER_COMMIT-${COMMIT:0:7}-$wkey"
  if [ -f "$WHISPER/stamp" ] && [ "$(cat "$WHISPER/stamp")" = "$wkey" ]; then
    echo "guest-for: whisper.cpp $WHISPER_COMMIT against ggml ${COMMIT:0:7} present ($WHISPER)" >&2
  elif [ "$cached_only" = 1 ]; then
    echo "guest-for: whisper.cpp $WHISPER_COMMIT is not built against ggml ${COMMIT:0:7} (scripts/guest-for.sh --whisper $SPEC builds it)" >&2
    exit 3
  else
    [ -f "$WHISPER_TARBALL" ] || die "no $WHISPER_TARBALL (APIR_WHISPER_TARBALL names another)"
    step "building whisper.cpp $WHISPER_COMMIT against ggml ${COMMIT:0:7} (1-3 min on 2 cores)"
    whisper_build "$GUEST" "$WHISPER"
    echo "$wkey" >"$WHISPER/stamp"
    done_step
  fi
fi
echo "GUEST_DIR=$GUEST"
echo "GUEST_LIB=$GUEST/lib/libggml-apir.so"
if [ "$with_whisper" = 1 ]; then echo "WHISPER_DIR=$WHISPER"; fi
