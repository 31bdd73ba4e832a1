#!/usr/bin/env bash
# A real VM for the virtgpu path (issue 15): QEMU 11 + virglrenderer (APIR
# merge request) on the host, a Debian kernel with the real virtio_gpu driver
# in the guest, and our guest library talking to build/libapir-virgl.so
# through it.  docs/VM.md says what works and what does not.
#
#   scripts/vm.sh [STAGE...]     stages: root virgl guest boot (default: all four)
#
# Everything is cached under ~/.cache/apir/vm-<key>/ (never in the checkout):
#   root/         a Debian trixie root (debootstrap) with QEMU, Mesa, Xvfb and
#                 the build tools for virglrenderer; QEMU runs chrooted in it
#   root/opt/virgl-<key>  virglrenderer MR 1590 (-Dapir=true -Dvenus=true) with
#                 scripts/patches/virglrenderer-*.patch, built inside the root against
#                 trixie's libraries; one folder per key (sources, options, patches), so
#                 that two trees' runs sharing the cache never replace each other's
#   guest/        vmlinuz + initramfs (busybox, modules, our guest binaries)
#   runs/<time>-<pid>/  console.log, qemu.log, virgl-apir.log, run.sh (the QEMU command)
#
# Environment:
#   APIR_BUILD      apir build to take binaries from (default <repo>/build; read only,
#                   copied at image-build / boot time)
#   APIR_VM_ACCEL   kvm | tcg | auto (default auto: kvm if it works)
#   APIR_VM_DISPLAY egl-headless (default; rendernode /dev/null: Mesa falls back to llvmpipe) |
#                   sdl (under Xvfb, started in the root)
#   APIR_VM_TCG_THREAD  single | multi: TCG's vCPU threading (default: QEMU's, multi)
#   APIR_VM_QEMU_SUITE  Debian suite QEMU comes from (default trixie-backports; trixie: 10.0)
#   APIR_VM_MEM     guest RAM in MiB (default 3072)
#   APIR_VM_TIMEOUT seconds before the VM is killed (default 3600; TCG is slow)
#   APIR_VM_CHECKS  comma-separated guest checks (default: ping,info,greedy,bench,backend_ops),
#                   or a named set: quick (what CTest vm_quick runs), full (every check)
#   APIR_VM_OPS     test-backend-ops op list (default ADD,MUL_MAT)
#   APIR_VM_BIG_MODEL  apir-gguf-gen options of a second model for the greedy_big check
#                   (e.g. "--layers 4 --embd 2048 --ff 5632 --heads 16 --kv-heads 4 --vocab 32000 --type q4_0")
#   APIR_VM_VIRGL_PATCHES  0: virglrenderer as merge request 1590 has it (its render worker
#                   then closes a blob's memfd, and libapir-virgl.so needs
#                   CAP_CHECKPOINT_RESTORE to reach the blob: docs/VM.md); default: patched
#   APIR_VM_QEMU_CAPS  none (default): QEMU and virglrenderer's processes run with no
#                   capabilities at all (an empty bounding set: an unprivileged VMM, as
#                   libvirt runs one), though as uid 0 inside the root; all: root's
#   APIR_VM_SHELL=1 the serial console is this terminal (and still logged), and after the
#                   checks the guest gives a shell instead of powering off (exit: power off)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${APIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/apir}
APIR_BUILD=$(cd "${APIR_BUILD:-$REPO/build}" && pwd)
DEPS_BIN=$(cd "$REPO/.deps/bin" && pwd -P)
DEPS_LIB=$(cd "$REPO/.deps/install/lib" && pwd -P)
SUITE=trixie
MIRROR=http://deb.debian.org/debian
VIRGL_TARBALL=${APIR_VIRGL_TARBALL:-$REPO/../shared/third_party/virglrenderer-mr1590-c62e4b08.tar.gz}
NICE="nice -n 10"

# The root's key: what debootstrap makes.  Later stages keep their own stamps
# (package list, virglrenderer options, guest inputs) inside it.
KEY=$(printf '%s minbase %s v1' "$SUITE" "$MIRROR" | sha256sum | cut -c1-12)
VM="$CACHE/vm-$KEY"
ROOT="$VM/root"
GUEST="$VM/guest"

# Packages of the root: QEMU and its OpenGL/GUI modules, Mesa (llvmpipe), Xvfb,
# the libraries libapir-virgl.so needs, kmod for depmod, and what building
# virglrenderer needs.
ROOT_PKGS="qemu-system-x86 qemu-system-modules-opengl qemu-system-gui xvfb xauth libgl1-mesa-dri libegl-mesa0 libegl1
 libgles2 libgbm1 libgnutls30t64 libgomp1 libstdc++6 kmod xz-utils zstd procps
 meson ninja-build gcc g++ pkg-config libepoxy-dev libdrm-dev libvulkan-dev python3-yaml libgbm-dev libx11-dev"
# QEMU itself from trixie-backports (11.1 as of 2026-12): trixie's 10.0.13
# aborts under TCG in iotlb_to_section (QEMU's system/physmem) while guests create and
# drop contexts with blobs - with random words that virglrenderer refuses as
# much as with our hostile guest, in one TCG thread as in several - and
# 11.1.3 ran the same hostile, churn and garbage checks through (docs/VM.md,
# "Faults and interop").  APIR_VM_QEMU_SUITE=trixie keeps 10.0.
QEMU_SUITE=${APIR_VM_QEMU_SUITE:-trixie-backports}
QEMU_PKGS="qemu-system-x86 qemu-system-modules-opengl qemu-system-gui"
VIRGL_OPTS="-Dapir=true -Dvenus=true -Dplatforms=egl,glx -Dbuildtype=release -Dlibdir=lib"
# Our patches to that tree (a fix to send upstream, not product code): the render worker kept
# the number of a blob's memfd after closing it (docs/VM.md).
VIRGL_PATCHES=()
if [ "${APIR_VM_VIRGL_PATCHES:-1}" != 0 ]; then
  for p in "$REPO"/scripts/patches/virglrenderer-*.patch; do [ -f "$p" ] && VIRGL_PATCHES+=("$p"); done
fi
# Without them there is nothing to run: exit 77, which CTest counts as skipped (as the whisper.cpp
# tests are without their sources).
[ -f "$VIRGL_TARBALL" ] || { echo "scripts/vm.sh: skipped: no virglrenderer sources at $VIRGL_TARBALL" \
  "(../shared/third_party beside the checkout, or APIR_VIRGL_TARBALL)" >&2; exit 77; }
VIRGL_KEY=$( { sha256sum <"$VIRGL_TARBALL" | cut -c1-16; echo "$VIRGL_OPTS"
               for p in ${VIRGL_PATCHES[@]+"${VIRGL_PATCHES[@]}"}; do sha256sum <"$p"; done; } | sha256sum | cut -c1-12)
VIRGL_PREFIX=/opt/virgl-$VIRGL_KEY
QEMU_CAPS=${APIR_VM_QEMU_CAPS:-none}
case "$QEMU_CAPS" in none|all) ;; *) echo "APIR_VM_QEMU_CAPS=$QEMU_CAPS: none or all" >&2; exit 2 ;; esac

t_stage=0
log() { printf '[vm %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
stage() { t_stage=$(date +%s); log "== $*"; }
stage_done() { log "   done in $(( $(date +%s) - t_stage ))s"; }
die() { log "error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot)"

# Runs a command chrooted in the root, in a private mount namespace (the
# mounts vanish with it; nothing is mounted on this machine's tree).
# IN_ROOT_BIND=DIR: DIR (outside the root) appears at /mnt inside.
in_root() {
  unshare -m --propagation private -- bash -c '
    set -e; R=$1; shift
    [ -z "${IN_ROOT_BIND:-}" ] || mount --bind "$IN_ROOT_BIND" "$R/mnt"
    mount -t proc proc "$R/proc"
    mount -t sysfs sys "$R/sys"
    mount --rbind /dev "$R/dev"
    mount -t tmpfs -o size=4g tmp "$R/tmp"
    exec chroot "$R" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"' _ "$ROOT" "$@"
}

# ---- stage root -------------------------------------------------------------
stage_root() {
  mkdir -p "$VM"
  if [ ! -f "$VM/stamp-debootstrap" ]; then
    command -v debootstrap >/dev/null || die "debootstrap missing (apt-get install debootstrap)"
    stage "debootstrap $SUITE (minbase) into $ROOT"
    rm -rf "$VM/root.tmp"
    $NICE debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$VM/root.tmp" "$MIRROR" \
      >"$VM/debootstrap.log" 2>&1 || { tail -20 "$VM/debootstrap.log"; die "debootstrap failed (log: $VM/debootstrap.log)"; }
    rm -rf "$ROOT"; mv "$VM/root.tmp" "$ROOT"
    touch "$VM/stamp-debootstrap"
    stage_done
  elif [ ! -d "$ROOT" ] && [ -d "$VM/root.tmp" ]; then
    mv "$VM/root.tmp" "$ROOT"
  fi
  local pkey; pkey=$(echo $ROOT_PKGS | sha256sum | cut -c1-12)
  if [ "$(cat "$VM/stamp-pkgs" 2>/dev/null)" != "$pkey" ]; then
    stage "apt-get install in the root: $(echo $ROOT_PKGS | wc -w) packages"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    # No daemons start inside the chroot.
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"; chmod +x "$ROOT/usr/sbin/policy-rc.d"
    in_root sh -c "DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
      DEBIAN_FRONTEND=noninteractive nice -n 10 apt-get install -y -q --no-install-recommends $(echo $ROOT_PKGS)" \
      >"$VM/apt.log" 2>&1 || { tail -20 "$VM/apt.log"; die "apt-get in the root failed (log: $VM/apt.log)"; }
    in_root apt-get clean
    echo "$pkey" >"$VM/stamp-pkgs"
    stage_done
  fi
  local qkey; qkey=$(echo "$QEMU_SUITE $QEMU_PKGS" | sha256sum | cut -c1-12)
  if [ "$QEMU_SUITE" != "$SUITE" ] && [ "$(cat "$VM/stamp-qemu" 2>/dev/null)" != "$qkey" ]; then
    stage "QEMU from $QEMU_SUITE in the root"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    echo "deb $MIRROR $QEMU_SUITE main" >"$ROOT/etc/apt/sources.list.d/$QEMU_SUITE.list"
    in_root sh -c "DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
      DEBIAN_FRONTEND=noninteractive nice -n 10 apt-get install -y -q --no-install-recommends -t $QEMU_SUITE $QEMU_PKGS" \
      >"$VM/apt-qemu.log" 2>&1 || { tail -20 "$VM/apt-qemu.log"; die "QEMU from $QEMU_SUITE failed (log: $VM/apt-qemu.log)"; }
    in_root apt-get clean
    echo "$qkey" >"$VM/stamp-qemu"
    stage_done
  fi
  log "root: $(in_root dpkg-query -W -f='${Package} ${Version}\n' qemu-system-x86 libgl1-mesa-dri xvfb | tr '\n' ' ')"
}

# ---- stage virgl ------------------------------------------------------------
stage_virgl() {
  if [ -f "$ROOT$VIRGL_PREFIX/stamp" ]; then
    log "virglrenderer present ($VIRGL_PREFIX in the root, ${#VIRGL_PATCHES[@]} patch(es))"; return 0
  fi
  stage "building virglrenderer (MR 1590, ${#VIRGL_PATCHES[@]} patch(es)) inside the root: $VIRGL_OPTS"
  local src=/opt/virgl-src-$VIRGL_KEY-$$
  rm -rf "$ROOT$src" "$ROOT$VIRGL_PREFIX"
  mkdir -p "$ROOT$src"
  tar -C "$ROOT$src" -xzf "$VIRGL_TARBALL" --strip-components=1
  for p in ${VIRGL_PATCHES[@]+"${VIRGL_PATCHES[@]}"}; do
    (cd "$ROOT$src" && git apply -p1 "$p") || die "$p does not apply to $VIRGL_TARBALL"
  done
  in_root sh -c "cd $src && meson setup build $VIRGL_OPTS -Dprefix=$VIRGL_PREFIX && nice -n 10 ninja -C build -j2 && ninja -C build install" \
    >"$VM/virgl-build.log" 2>&1 || { tail -30 "$VM/virgl-build.log"; die "virglrenderer build failed (log: $VM/virgl-build.log)"; }
  rm -rf "$ROOT$src"
  touch "$ROOT$VIRGL_PREFIX/stamp"
  stage_done
}

# ---- stage ref (only when asked) ---------------------------------------------
# The reference implementation of the pinned llama.cpp (ggml/src/ggml-virtgpu):
# its guest library libggml-virtgpu.so and its host library
# libggml-virtgpu-backend.so, for the interop checks (docs/INTEROP.md).  Built
# from a copy of the pinned source's ggml/ (never the checkout) into
# $CACHE/ref-virgl-<commit>-<key>/, keyed by the commit, the options and what is
# changed in the copy, and linked as .deps/ref-virgl (where
# tests/virgl_rig/run_interop.sh looks).  Changes to the copy, none to the code:
# the download of venus_hw.h at build time is removed (an empty file instead:
# nothing in it is used) and <drm/virtgpu_drm.h> comes from the trixie root
# (Linux 6.12's uAPI; Debian 12's predates the syncobj fields the guest names);
# ggml/ is configured on its own, which wants a ggml.pc.in (an empty one).
REF_OPTS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU=OFF
 -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_VIRTGPU=ON -DGGML_VIRTGPU_BACKEND=ON"
REF_TARGETS="ggml-virtgpu ggml-virtgpu-backend"
REF_EDITS="v1 no-venus_hw-download empty-venus_hw-header trixie-virtgpu_drm-header empty-ggml-pc-in"
ref_dir() {
  local pin; pin=$(cut -d' ' -f1 "$REPO/.deps/stamp" 2>/dev/null) || true
  [ -n "$pin" ] || { echo ""; return; }
  local key; key=$(printf '%s %s %s %s' "$pin" "$REF_OPTS" "$REF_TARGETS" "$REF_EDITS" | sha256sum | cut -c1-12)
  echo "$CACHE/ref-virgl-${pin:0:7}-$key"
}
ref_present() { local d; d=$(ref_dir); [ -n "$d" ] && [ -f "$d/stamp" ] && [ -f "$d/libggml-virtgpu.so" ] && [ -f "$d/libggml-virtgpu-backend.so" ]; }
# The checks that need the reference guest library in the image, or its host library in a boot.
REF_GUEST_CHECKS="interop_ref_guest interop_ref_guest_ops"
REF_HOST_CHECKS="interop_ref_host interop_ref_host_ops"
in_list() { case ",$2," in *",$1,"*) return 0;; esac; return 1; }
want_ref_guest() { local c; for c in $REF_GUEST_CHECKS $REF_HOST_CHECKS; do in_list "$c" "$(vm_checks)" && return 0; done; return 1; }
# Named sets: quick (CTest vm_quick: issue 15's items 2-4 in ~5 min under TCG) and full (also
# test-backend-ops on APIR_VM_OPS and the reference guest's op run: 20+ min under TCG).
VM_CHECKS_QUICK="ping,info,greedy,bench,backend_ops_counts,concurrent,capset10,interop_ref_guest,kill_midgraph,hostile,churn,blob_churn,garbage_typed,garbage_untyped,interop_ref_host"
VM_CHECKS_FULL="$VM_CHECKS_QUICK,backend_ops,interop_ref_guest_ops,interop_ref_host_ops"
vm_checks() {
  case ${APIR_VM_CHECKS:-ping,info,greedy,bench,backend_ops} in
    quick) echo "$VM_CHECKS_QUICK";;
    full) echo "$VM_CHECKS_FULL";;
    *) echo "${APIR_VM_CHECKS:-ping,info,greedy,bench,backend_ops}";;
  esac
}
# Builds the reference libraries if the checks want them and they are missing
# (about 1 minute on 2 cores), unless APIR_VM_REF=0; a failure is no error
# here: REF_MISSING says why, and the interop checks say SKIP with it.
REF_MISSING=""
maybe_build_ref() {
  ref_present && { stage_ref; return 0; }
  if [ "${APIR_VM_REF:-auto}" = 0 ]; then
    REF_MISSING="reference libraries not built (APIR_VM_REF=0; scripts/vm.sh ref builds them, ~1 min)"; return 0
  fi
  if ! (stage_ref) >"$VM/ref-stage.log" 2>&1; then
    cat "$VM/ref-stage.log"
    REF_MISSING="building the reference libraries failed: $(grep -a 'error' "$VM/ref-stage.log" | tail -n 1)"
    log "$REF_MISSING"
  else
    cat "$VM/ref-stage.log"
  fi
}

stage_ref() {
  local d pin src; d=$(ref_dir)
  [ -n "$d" ] || die "no .deps/stamp: run scripts/setup.sh first"
  pin=$(cut -d' ' -f1 "$REPO/.deps/stamp"); src="$CACHE/src-${pin:0:7}"
  if ref_present; then
    log "reference virtgpu libraries present ($d)"
  else
    [ -f "$src/.apir-verified" ] || die "no verified llama.cpp source at $src (scripts/setup.sh)"
    [ -f "$ROOT/usr/include/drm/virtgpu_drm.h" ] || die "the trixie root has no drm/virtgpu_drm.h (stage root first)"
    stage "building the reference virtgpu libraries of llama.cpp ${pin:0:7} ($REF_TARGETS) into $d"
    rm -rf "$d"; mkdir -p "$d/src" "$d/inc/drm"
    tar -C "$src" -cf - ggml | tar -C "$d/src" -xf -
    local vg="$d/src/ggml/src/ggml-virtgpu"
    # The ExternalProject_Add(venus_hw_header ...) block and its dependency go.
    sed -i -e '/^ExternalProject_Add(/,/^)/d' -e '/add_dependencies(ggml-virtgpu venus_hw_header)/d' "$vg/CMakeLists.txt"
    grep -q 'venus_hw_header' "$vg/CMakeLists.txt" && die "could not remove the venus_hw.h download from $vg/CMakeLists.txt"
    : >"$vg/include/venus_hw.h"
    # ggml/ configured on its own wants ggml.pc.in (llama.cpp's copy of ggml has none; unused here)
    [ -f "$d/src/ggml/ggml.pc.in" ] || : >"$d/src/ggml/ggml.pc.in"
    cp "$ROOT/usr/include/drm/virtgpu_drm.h" "$d/inc/drm/"
    # shellcheck disable=SC2086
    cmake -S "$d/src/ggml" -B "$d/build" -G Ninja $REF_OPTS "-DCMAKE_CXX_FLAGS=-I$d/inc" >"$d/configure.log" 2>&1 \
      || { tail -30 "$d/configure.log"; die "reference configure failed (log: $d/configure.log)"; }
    # shellcheck disable=SC2086
    $NICE cmake --build "$d/build" -j "${JOBS:-$(nproc)}" --target $REF_TARGETS >"$d/build.log" 2>&1 \
      || { tail -30 "$d/build.log"; die "reference build failed (log: $d/build.log)"; }
    cp "$d/build/bin/libggml-virtgpu.so" "$d/build/bin/libggml-virtgpu-backend.so" "$d/"
    echo "$pin $REF_OPTS $REF_TARGETS $REF_EDITS" >"$d/stamp"
    stage_done
  fi
  # .deps/ref-virgl: where run_interop.sh (APIR_DEPS_BIN/../ref-virgl) looks.
  local deps; deps=$(cd "$REPO/.deps" && pwd -P)
  if [ -L "$deps/ref-virgl" ] || [ ! -e "$deps/ref-virgl" ]; then ln -sfn "$d" "$deps/ref-virgl"; fi
}

# ---- stage guest --------------------------------------------------------------
# Kernel modules the guest loads (with their dependencies, from modules.dep).
GUEST_MODULES="virtio_gpu"

kernel_version() { ls "$GUEST/kernel/usr/lib/modules" 2>/dev/null | head -1; }

stage_kernel() {
  if [ -f "$GUEST/stamp-kernel" ]; then log "guest kernel present ($(kernel_version))"; return 0; fi
  stage "guest kernel: linux-image-amd64 of $SUITE"
  rm -rf "$GUEST/kernel" "$GUEST/debs"; mkdir -p "$GUEST/kernel" "$GUEST/debs" "$ROOT/tmp"
  local pkg
  pkg=$(in_root apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 in the root"
  in_root sh -c "mkdir -p /var/cache/apir-debs && cd /var/cache/apir-debs && apt-get download $pkg" >"$GUEST/kernel-dl.log" 2>&1 \
    || { cat "$GUEST/kernel-dl.log"; die "cannot download $pkg"; }
  mv "$ROOT/var/cache/apir-debs/"*.deb "$GUEST/debs/"
  dpkg-deb -x "$GUEST/debs/"*.deb "$GUEST/kernel"
  rm -rf "$GUEST/debs"   # 108 MB, extracted
  echo "$pkg" >"$GUEST/stamp-kernel"
  stage_done
}

copy_with_libs() {  # copy_with_libs DEST_ROOT FILE... : files to DEST/bin or lib, their libs to DEST/lib
  local dest=$1; shift
  local f
  for f in "$@"; do
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | while read -r l; do
      [ -e "$dest/lib/$(basename "$l")" ] || [ -e "$dest/apir/lib/$(basename "$l")" ] || cp -L "$l" "$dest/lib/"
    done
  done
}

# The guest's own CPU backend: the pinned build names this machine's CPU
# features, AVX-512 where it has them, which TCG's "max" CPU lacks (it has
# AVX2, FMA, F16C, BMI2): that library's ggml_backend_score is then 0 in the
# VM and llama.cpp there finds no CPU device.  The guest gets a CPU backend
# of the same source for what TCG emulates, built into the VM cache once
# (~1 min on 2 cores), keyed by the pin and these options.
GUEST_CPU_OPTS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_SSE42=ON
 -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_BUILD_TESTS=OFF
 -DGGML_BUILD_EXAMPLES=OFF"
guest_cpu_backend() {
  local pin src key d
  pin=$(cut -d' ' -f1 "$REPO/.deps/stamp"); src="$CACHE/src-${pin:0:7}"
  key=$(printf '%s %s' "$pin" "$GUEST_CPU_OPTS" | sha256sum | cut -c1-12)
  d="$VM/guest-cpu-${pin:0:7}-$key"
  if [ ! -f "$d/stamp" ]; then
    [ -f "$src/.apir-verified" ] || die "no verified llama.cpp source at $src (scripts/setup.sh)"
    stage "building the guest's CPU backend (AVX2 without AVX-512, for TCG) into $d" >&2
    rm -rf "$d"; mkdir -p "$d"
    # shellcheck disable=SC2086
    cmake -S "$src" -B "$d/build" -G Ninja $GUEST_CPU_OPTS >"$d/configure.log" 2>&1 \
      || { tail -20 "$d/configure.log" >&2; die "guest CPU backend configure failed (log: $d/configure.log)"; }
    $NICE cmake --build "$d/build" -j "${JOBS:-$(nproc)}" --target ggml-cpu >"$d/build.log" 2>&1 \
      || { tail -20 "$d/build.log" >&2; die "guest CPU backend build failed (log: $d/build.log)"; }
    cp -L "$d/build/bin/libggml-cpu.so" "$d/"
    echo "$pin $GUEST_CPU_OPTS" >"$d/stamp"
    stage_done >&2
  fi
  echo "$d/libggml-cpu.so"
}

stage_guest() {
  local f
  for f in apir libggml-apir.so apir-gguf-gen; do
    [ -x "$APIR_BUILD/$f" ] || [ -f "$APIR_BUILD/$f" ] || die "$APIR_BUILD/$f missing (build apir, or point APIR_BUILD at a build)"
  done
  stage_kernel
  local kver; kver=$(kernel_version)
  # The initramfs key: kernel, our binaries, the tools, init, the checks.
  local guest_cpu; guest_cpu=$(guest_cpu_backend)
  local inputs=("$APIR_BUILD/apir" "$APIR_BUILD/libggml-apir.so" "$APIR_BUILD/apir-gguf-gen" "$DEPS_BIN/test-backend-ops"
                "$DEPS_BIN/llama-bench" "$guest_cpu" "$REPO/tests/vm/init" "$REPO/tests/vm/checks.sh")
  [ -x "$APIR_BUILD/tests/apir-llama-greedy" ] && inputs+=("$APIR_BUILD/tests/apir-llama-greedy")
  [ -x "$APIR_BUILD/interop_ref" ] && inputs+=("$APIR_BUILD/interop_ref")
  inputs+=("$REPO"/tests/vm/*.c)
  # The reference guest library (stage ref), when the checks want it.
  want_ref_guest && maybe_build_ref
  local refg="none: ${REF_MISSING:-}"
  ref_present && refg=$(sha256sum "$(ref_dir)/libggml-virtgpu.so" | cut -c1-64)
  local gkey; gkey=$( { echo "$kver $GUEST_MODULES ${APIR_VM_BIG_MODEL:-} $refg"; sha256sum "${inputs[@]}" | cut -c1-64; } | sha256sum | cut -c1-12)
  if [ "$(cat "$GUEST/stamp-initramfs" 2>/dev/null)" = "$gkey" ] && [ -f "$GUEST/initramfs.cpio.gz" ]; then
    log "guest initramfs present (key $gkey)"; return 0
  fi
  stage "guest initramfs (kernel $kver, modules: $GUEST_MODULES)"
  local ir="$GUEST/initramfs"
  rm -rf "$ir"; mkdir -p "$ir"/{bin,sbin,lib,lib64,dev,proc,sys,tmp,etc,apir/bin,apir/lib,apir/data,root}
  cp "$GUEST/kernel/boot/vmlinuz-$kver" "$GUEST/vmlinuz"
  # busybox (Debian 12's static one) with its applets as links.
  cp /bin/busybox "$ir/bin/busybox"
  for a in $(/bin/busybox --list); do [ -e "$ir/bin/$a" ] || ln -s busybox "$ir/bin/$a"; done
  # Modules: the closure of GUEST_MODULES in modules.dep, decompressed.
  # (trixie is usr-merged: the modules are under usr/lib; depmod -b wants lib/)
  local md="$GUEST/kernel/usr/lib/modules/$kver"
  [ -e "$GUEST/kernel/lib" ] || ln -s usr/lib "$GUEST/kernel/lib"
  # depmod: the root's (kmod), on the tree bound at /mnt
  [ -f "$md/modules.dep" ] || IN_ROOT_BIND="$GUEST/kernel" in_root depmod -b /mnt "$kver"
  [ -n "$kver" ] || die "no kernel modules under $GUEST/kernel/usr/lib/modules"
  local want="" m todo="$GUEST_MODULES"
  while [ -n "$todo" ]; do
    set -- $todo; m=$1; shift; todo="$*"
    local line; line=$(grep -E "/${m//_/[_-]}\.ko(\.[a-z]+)?:" "$md/modules.dep" || true)
    [ -n "$line" ] || { log "   module $m: built in (not in modules.dep)"; continue; }
    local path=${line%%:*}
    case " $want " in *" $path "*) continue;; esac
    want="$want $path"
    for d in ${line#*:}; do todo="$todo $(basename "${d%%.ko*}")"; done
  done
  for p in $want; do
    mkdir -p "$ir/lib/modules/$kver/$(dirname "$p")"
    case "$p" in
      *.xz) xz -dc "$md/$p" >"$ir/lib/modules/$kver/${p%.xz}";;
      *.zst) zstd -qdc "$md/$p" >"$ir/lib/modules/$kver/${p%.zst}";;
      *.gz) gzip -dc "$md/$p" >"$ir/lib/modules/$kver/${p%.gz}";;
      *) cp "$md/$p" "$ir/lib/modules/$kver/$p";;
    esac
  done
  cp "$md/modules.builtin" "$md/modules.builtin.modinfo" "$md/modules.order" "$ir/lib/modules/$kver/" 2>/dev/null || true
  IN_ROOT_BIND="$ir" in_root depmod -b /mnt "$kver"
  log "   modules: $(echo $want | wc -w) ($(for p in $want; do basename "${p%%.ko*}"; done | tr '\n' ' '))"
  # Our binaries and the pinned tools, with every library they need.
  cp "$APIR_BUILD/apir" "$APIR_BUILD/apir-gguf-gen" "$ir/apir/bin/"
  cp "$APIR_BUILD/libggml-apir.so" "$ir/apir/bin/"
  cp -P "$DEPS_BIN"/test-backend-ops "$DEPS_BIN"/llama-bench "$ir/apir/bin/"
  [ -x "$APIR_BUILD/tests/apir-llama-greedy" ] && cp "$APIR_BUILD/tests/apir-llama-greedy" "$ir/apir/bin/"
  cp "$guest_cpu" "$ir/apir/bin/libggml-cpu.so"
  [ -x "$APIR_BUILD/interop_ref" ] && cp "$APIR_BUILD/interop_ref" "$ir/apir/bin/"
  # The VM checks' own helpers (tests/vm/*.c), built here against the pinned ggml.
  local tools="$GUEST/tools" cc_opts="-std=c11 -O2 -Wall -Wextra -Werror -I$DEPS_LIB/../include"
  rm -rf "$tools"; mkdir -p "$tools"
  # shellcheck disable=SC2086
  { cc $cc_opts -o "$tools/apir-vm-devinfo" "$REPO/tests/vm/devinfo.c" -L"$DEPS_LIB" -lggml -lggml-base \
    && cc $cc_opts -o "$tools/apir-vm-hostile" "$REPO/tests/vm/hostile.c" \
    && cc $cc_opts -shared -fPIC -o "$tools/libapir-vm-devtype.so" "$REPO/tests/vm/devtype_gpu.c" -ldl; } \
    || die "building the VM helpers of tests/vm failed"
  cp "$tools/apir-vm-devinfo" "$tools/apir-vm-hostile" "$ir/apir/bin/"
  cp "$tools/libapir-vm-devtype.so" "$ir/apir/lib/"
  # The reference guest library, outside /apir/bin: ggml_backend_load_all() loads any
  # libggml-virtgpu.so next to the program, which would put it in every check.
  mkdir -p "$ir/apir/ref"
  if ref_present; then
    cp "$(ref_dir)/libggml-virtgpu.so" "$ir/apir/ref/"
  else
    echo "${REF_MISSING:-the reference libraries are not built (scripts/vm.sh ref)}" >"$ir/apir/ref/MISSING"
  fi
  # The ggml/llama libraries, next to the tools (their RUNPATH is $ORIGIN/../lib or absolute).
  cp -a "$DEPS_BIN"/lib*.so* "$ir/apir/lib/" 2>/dev/null || true
  rm -f "$ir/apir/lib/"libggml-cpu*.so
  local bins=("$ir"/apir/bin/*)
  LD_LIBRARY_PATH="$DEPS_LIB:$DEPS_BIN" copy_with_libs "$ir" "${bins[@]}" "$ir"/apir/lib/*.so* "$ir"/apir/ref/*.so
  # The dynamic loader at the path the binaries name.
  cp -L /lib64/ld-linux-x86-64.so.2 "$ir/lib64/"
  # A small model, and the tokens the host's CPU decodes from it (the reference).
  "$APIR_BUILD/apir-gguf-gen" -o "$ir/apir/data/model.gguf" --size tiny >/dev/null
  if [ -x "$APIR_BUILD/tests/apir-llama-greedy" ]; then
    "$APIR_BUILD/tests/apir-llama-greedy" -m "$ir/apir/data/model.gguf" -d CPU -n 24 -t 2 \
      --dump-logits "$ir/apir/data/native.bin" >"$ir/apir/data/native.out" 2>"$GUEST/native.err" \
      || { cat "$GUEST/native.err"; die "the native greedy decode failed"; }
    log "   native tokens: $(grep tokens: "$ir/apir/data/native.out")"
    # APIR_VM_BIG_MODEL="apir-gguf-gen options": a second model for the greedy_big check
    # (bigger tensors than the data blob: weight uploads that grow it).
    if [ -n "${APIR_VM_BIG_MODEL:-}" ]; then
      "$APIR_BUILD/apir-gguf-gen" -o "$ir/apir/data/big.gguf" $APIR_VM_BIG_MODEL >/dev/null
      "$APIR_BUILD/tests/apir-llama-greedy" -m "$ir/apir/data/big.gguf" -d CPU -n 16 -t 2 \
        --dump-logits "$ir/apir/data/big-native.bin" >"$ir/apir/data/big-native.out" 2>"$GUEST/native.err" \
        || { cat "$GUEST/native.err"; die "the native greedy decode of the big model failed"; }
      log "   big model ($APIR_VM_BIG_MODEL): $(du -h "$ir/apir/data/big.gguf" | cut -f1), native $(grep tokens: "$ir/apir/data/big-native.out")"
    fi
  fi
  cp "$REPO/tests/vm/init" "$ir/init"; chmod +x "$ir/init"
  cp "$REPO/tests/vm/checks.sh" "$ir/apir/checks.sh"; chmod +x "$ir/apir/checks.sh"
  (cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$GUEST/initramfs.cpio.gz.tmp"
  mv "$GUEST/initramfs.cpio.gz.tmp" "$GUEST/initramfs.cpio.gz"
  echo "$gkey" >"$GUEST/stamp-initramfs"
  log "   initramfs: $(du -h "$GUEST/initramfs.cpio.gz" | cut -f1) compressed, $(du -sh "$ir" | cut -f1) unpacked"
  stage_done
}

# ---- stage boot ----------------------------------------------------------------
# ---- the host side's view (fault checks) ------------------------------------------
# host_watch CONSOLE OUT: while QEMU runs, samples this machine's processes every
# 0.25 s: QEMU, the render server, and its workers (one per guest context,
# named virgl-<ctx>-<name> by server/render_context.c), each with its RSS and
# the CPU it used since the last sample.  It writes a line "S <time> ..." when
# the set of processes changes, every 5 s, and at every "APIR-VM mark" line
# the guest prints on its console ("M <time> <mark>" before it).
host_watch() {
  set +e
  local con=$1 out=$2 pat=$3 seen=0 prev="" last_t=0 q=""
  declare -A ticks
  : >"$out"
  kids() { cat /proc/"$1"/task/*/children 2>/dev/null; }
  while :; do
    local now snap="" pids="" p comm f cpu d procs
    now=$(date -u +%H:%M:%S.%3N)
    # QEMU (found once by its console file), its children (the render server)
    # and theirs (the workers): a few /proc reads, no ps, so samples stay ~0.25 s apart
    [ -n "$q" ] && [ -d /proc/$q ] || q=$(pgrep -n -f "qemu-system-x86_64.*$pat" 2>/dev/null)
    # every descendant (the pid found may be the timeout(1) around QEMU: one level more)
    procs=""
    if [ -n "$q" ]; then
      local level="$q" next
      while [ -n "$level" ]; do
        procs="$procs $level"; next=""
        for p in $level; do next="$next $(kids "$p")"; done
        level=$(echo $next)
      done
    fi
    for p in $procs; do
      { read -r -a f <"/proc/$p/stat"; } 2>/dev/null || continue
      comm=${f[1]//[()]/}
      cpu=$(( f[13] + f[14] ))
      d=$(( cpu - ${ticks[$p]:-$cpu} )); ticks[$p]=$cpu
      snap="$snap $p:$comm:rss=$(( f[23] * 4 / 1024 ))MiB:cpu+${d}t"
      pids="$pids $p:$comm"
    done
    local n marks=""
    n=$(wc -l <"$con" 2>/dev/null || echo 0)
    if [ "$n" -gt "$seen" ]; then
      marks=$(sed -n "$((seen + 1)),${n}p" "$con" | grep -a '^APIR-VM mark ' | cut -c14- || true)
      seen=$n
    fi
    if [ -n "$marks" ]; then
      while read -r m; do echo "M $now $m"; done <<<"$marks" >>"$out"
    fi
    if [ -n "$marks" ] || [ "$pids" != "$prev" ] || [ $(( SECONDS - last_t )) -ge 5 ]; then
      echo "S $now$snap" >>"$out"; prev=$pids; last_t=$SECONDS
    fi
    sleep 0.25
  done
}

# snap_after MARK LOG: the first snapshot line after the mark line
snap_after() { awk -v m="$1" '$1 == "M" && index($0, m) { f = 1; next } f && $1 == "S" { print; exit }' "$2"; }
# pids of a snapshot whose name matches a pattern
snap_pids() { tr ' ' '\n' <<<"$1" | awk -F: -v re="$2" '$2 ~ re { print $1 }'; }

# host_verdict CHECK RUN QEMU_RC: what the host side saw of a fault check;
# prints "CHECK <check>_host PASS|FAIL (...)" and returns its status.
host_verdict() {
  local c=$1 run=$2 qrc=$3 w="$2/host-watch.log" ok=1 why=""
  local server_re='^virgl_render' worker_re='^virgl-[0-9]+-'
  case $c in
    kill_midgraph)
      local s_kill s_after victims v server0 server1 gone=0 still=""
      s_kill=$(snap_after "kill_midgraph before-kill" "$w"); s_after=$(snap_after "kill_midgraph after-kill" "$w")
      [ -n "$s_kill" ] && [ -n "$s_after" ] || { ok=0; why="no host snapshot at the guest's marks (the kill did not happen?)"; }
      victims=$(snap_pids "$s_kill" "$worker_re")
      [ -n "$victims" ] || { ok=0; why="$why; no render worker at the kill"; }
      for v in $victims; do
        if snap_pids "$s_after" "$worker_re" | grep -qx "$v"; then still="$still $v"; else gone=$((gone + 1)); fi
      done
      [ -z "$still" ] || { ok=0; why="$why; worker(s)$still still there 3 s after the kill"; }
      # the render server after the kill (the "done" mark can come as the guest
      # powers off, when QEMU is already taking the server down)
      server0=$(snap_pids "$s_kill" "$server_re" | head -1); server1=$(snap_pids "$s_after" "$server_re" | head -1)
      [ -n "$server0" ] && [ "$server0" = "$server1" ] || { ok=0; why="$why; render server pid $server0 -> $server1"; }
      local vinfo; vinfo=$(tr ' ' '\n' <<<"$s_kill" | grep -E ":virgl-[0-9]+-" | tr '\n' ' ')
      local t0 t1; t0=$(awk '$1 == "M" && /kill_midgraph killed/ { print $2; exit }' "$w")
      t1=$(awk '$1 == "M" && /kill_midgraph after-kill/ { print $2; exit }' "$w")
      why="${why#; }"
      log "   2 s before the kill: worker(s) ${vinfo:-none} (cpu+Nt: CPU ticks of 10 ms since the previous sample); killed at $t0, $gone of them gone by $t1; render server pid $server0 -> $server1"
      # The host library's own lines in that window (UTC stamps in qemu.log)
      local tb; tb=$(awk '$1 == "M" && /kill_midgraph before-kill/ { print $2; exit }' "$w")
      local closed; closed=$(awk -v a="${tb%.*}" -v b="${t1%.*}" 'match($0, /T[0-9:]+\./) { t = substr($0, RSTART + 1, 8); if (t >= a && t <= b) print }' "$run/qemu.log" | grep -a 'closed after' || true)
      log "   host library between the marks: ${closed:-no clean-up line (the render server SIGKILLed the worker before apir_backend_deinit ran)}"
      ;;
    hostile)
      local s0 s1 server0 server1 nw
      s0=$(snap_after "hostile start" "$w"); s1=$(snap_after "hostile end" "$w")
      server0=$(snap_pids "$s0" "$server_re" | head -1); server1=$(snap_pids "$s1" "$server_re" | head -1)
      [ -n "$server0" ] && [ "$server0" = "$server1" ] || { ok=0; why="render server pid $server0 -> $server1"; }
      nw=$(awk '$1 == "M" && /hostile start/ { f = 1 } $1 == "M" && /hostile end/ { f = 0 } f && $1 == "S"' "$w" \
           | tr ' ' '\n' | grep -E ":virgl-[0-9]+-" | cut -d: -f1 | sort -u | wc -l)
      [ "$qrc" = 0 ] || { ok=0; why="$why; QEMU exit status $qrc"; }
      grep -a -q 'APIR-VM poweroff' "$run/console.log" || { ok=0; why="$why; the guest did not power off"; }
      why="${why#; }"
      log "   hostile: render server pid $server0 -> $server1; $nw render workers (contexts) seen during it; QEMU exit $qrc;" \
          "host log: $(grep -a -c 'ERROR' "$run/virgl-apir.log" 2>/dev/null || true) virglrenderer APIR errors," \
          "$(grep -a -c -E 'apir virgl: (warn|error)' "$run/qemu.log" || true) libapir-virgl warnings/errors," \
          "$(grep -a -c -i -E 'segfault|sigsegv|assert|abort' "$run/qemu.log" || true) crash lines"
      ;;
  esac
  if [ $ok = 1 ]; then log "   CHECK ${c}_host PASS"; else log "   CHECK ${c}_host FAIL ($why)"; fi
  [ $ok = 1 ]
}

# stage_boot HOST CHECKS: one boot; HOST is ours (libapir-virgl.so) or ref (the
# reference libggml-virtgpu-backend.so: what virglrenderer dlopens is
# VIRGL_APIR_BACKEND_LIBRARY, read by each render worker from the environment
# QEMU was started with, so one host library per boot).  Adds to BOOT_PASS,
# BOOT_FAIL, BOOT_SKIP and BOOT_RUNS.
BOOT_PASS=0 BOOT_FAIL=0 BOOT_SKIP=0 BOOT_RUNS=""
stage_boot() {
  local host=$1 checks=$2
  local stamp; stamp=$(date -u +%Y%m%d-%H%M%S)-$$
  [ "$host" = ours ] || stamp="$stamp-$host"
  local run="$VM/runs/$stamp"
  mkdir -p "$run"
  ln -sfn "$run" "$VM/runs/latest"
  [ -f "$APIR_BUILD/libapir-virgl.so" ] || die "$APIR_BUILD/libapir-virgl.so missing: configure with -DAPIR_VIRGL=ON \
(e.g. cmake -S $REPO -B $REPO/build-hE -G Ninja -DAPIR_VIRGL=ON && cmake --build $REPO/build-hE), then APIR_BUILD=$REPO/build-hE"
  # What the host side loads, copied now (build/ is rebuilt by others).
  local hl="$ROOT/opt/apir-runs/$stamp/host"
  mkdir -p "$hl"
  local hostlib=libapir-virgl.so
  if [ "$host" = ref ]; then
    hostlib=libggml-virtgpu-backend.so
    cp "$(ref_dir)/$hostlib" "$hl/"
  else
    cp "$APIR_BUILD/libapir-virgl.so" "$hl/"
    # Its contexts' workers: apir-host beside it, where the library looks
    # (LIBDIR/../bin/apir-host); it finds the ggml libraries below through
    # LD_LIBRARY_PATH (run.sh), which the workers keep.
    mkdir -p "$(dirname "$hl")/bin"
    cp "$APIR_BUILD/apir-host" "$(dirname "$hl")/bin/"
  fi
  cp -a "$DEPS_LIB"/libggml*.so* "$hl/"
  cp -L "$DEPS_BIN"/libggml-cpu*.so "$hl/"
  # The run folder inside the root (one per boot: two boots may run at once).
  local rr="/opt/apir-runs/$stamp"
  mkdir -p "$ROOT$rr"
  cp "$GUEST/vmlinuz" "$GUEST/initramfs.cpio.gz" "$ROOT$rr/"

  local accel=${APIR_VM_ACCEL:-auto}
  [ -n "${ACCEL_PROBED:-}" ] && accel=$ACCEL_PROBED
  if [ "$accel" = auto ]; then
    # KVM here opens and creates VMs, but whether a guest runs is another
    # matter (docs/VM.md): boot the guest kernel into init's probe mode, which
    # prints a line and powers off at once.
    local prc=0
    in_root timeout 20 qemu-system-x86_64 -accel kvm -cpu host,-arch-capabilities -machine q35 -m 512 -display none \
      -nodefaults -no-reboot -kernel $rr/vmlinuz -initrd $rr/initramfs.cpio.gz \
      -append "console=ttyS0 panic=-1 loglevel=1 apir.probe=1" -serial stdio -monitor none >"$run/kvm-probe.log" 2>&1 || prc=$?
    if grep -q 'APIR-VM probe ok' "$run/kvm-probe.log"; then accel=kvm; else accel=tcg; fi
    log "kvm probe (exit $prc): $(grep -a -m3 -E 'error|failure|probe ok|warning' "$run/kvm-probe.log" | tr '\n' ' ')"
    log "accelerator: $accel"
    ACCEL_PROBED=$accel
  fi
  # APIR_VM_TCG_THREAD=single|multi: TCG's threading (QEMU's default with
  # -smp 2 is multi: one host thread per vCPU)
  local accel_opt=$accel
  [ "$accel" = tcg ] && [ -n "${APIR_VM_TCG_THREAD:-}" ] && accel_opt="tcg,thread=$APIR_VM_TCG_THREAD"
  local cpu=max
  # -cpu host aborts here: "failed to set MSR 0x10a" (IA32_ARCH_CAPABILITIES, refused by this machine's KVM)
  [ "$accel" = kvm ] && cpu=host,-arch-capabilities
  local display=${APIR_VM_DISPLAY:-egl-headless}
  local dispopt
  case "$display" in
    sdl) dispopt="-display sdl,gl=on";;
    # egl-headless wants a DRM render node and this machine has none; given
    # any file (/dev/null), Mesa's GBM cannot name a driver and falls back
    # to software (llvmpipe), which is all we need.  No X server then.
    egl-headless) dispopt="-display egl-headless,rendernode=${APIR_VM_RENDERNODE:-/dev/null}";;
    # (gtk,gl=on: "OpenGL is not supported by display backend 'gtk'" in this build)
    *) die "APIR_VM_DISPLAY=$display: egl-headless or sdl";;
  esac
  local mem=${APIR_VM_MEM:-3072}
  local append="console=ttyS0 panic=-1 loglevel=4 apir.checks=$checks"
  append="$append apir.ops=${APIR_VM_OPS:-ADD,MUL_MAT} apir.ops_ref=${APIR_VM_REF_OPS:-ADD}"
  [ "${APIR_VM_SHELL:-0}" = 1 ] && append="$append apir.shell=1"
  local xd=$(( 100 + $$ % 800 ))   # the X display: one per boot
  local serial="-serial file:$rr/console.log"
  # An unprivileged VMM: no capability in QEMU or in what it starts (virglrenderer's render
  # server and workers, our workers): root's uid inside the root, but the bounding set empty.
  local caps_drop=""
  [ "$QEMU_CAPS" = none ] && caps_drop="setpriv --bounding-set=-all --inh-caps=-all"
  [ "${APIR_VM_SHELL:-0}" = 1 ] && serial="-chardev stdio,id=con,signal=off,logfile=$rr/console.log -serial chardev:con"
  cat >"$ROOT$rr/run.sh" <<EOF
#!/bin/sh
# Runs inside the root: Xvfb (for sdl), then QEMU; written by scripts/vm.sh.
cd $rr
export VIRGL_ROUTE_VENUS_TO_APIR=1
export VIRGL_APIR_BACKEND_LIBRARY=$rr/host/$hostlib
export APIR_LLAMA_CPP_GGML_LIBRARY_PATH=$rr/host/libggml-cpu.so
export APIR_LLAMA_CPP_GGML_LIBRARY_REG=ggml_backend_cpu_reg
export VIRGL_APIR_LOG_TO_FILE=$rr/virgl-apir.log
export RENDER_SERVER_EXEC_PATH=$VIRGL_PREFIX/libexec/virgl_render_server
export LD_LIBRARY_PATH=$VIRGL_PREFIX/lib:$rr/host
export APIR_LOG_LEVEL=\${APIR_LOG_LEVEL:-info}
export XDG_RUNTIME_DIR=/tmp
if [ "$display" != egl-headless ]; then
  Xvfb :$xd -screen 0 1280x800x24 -nolisten tcp >$rr/xvfb.log 2>&1 &
  xpid=\$!
  export DISPLAY=:$xd
  for i in \$(seq 1 50); do [ -e /tmp/.X11-unix/X$xd ] && break; sleep 0.1; done
fi
echo "qemu: \$(date -u +%s.%N)" >$rr/times
# What QEMU and its children may do: the capability sets it starts with.
$caps_drop grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status >$rr/caps
set -x
timeout ${APIR_VM_TIMEOUT:-3600} $caps_drop qemu-system-x86_64 -accel $accel_opt -cpu $cpu -smp 2 -m $mem -machine q35 \\
  -nodefaults -no-user-config -no-reboot -vga none \\
  -device virtio-gpu-gl-pci,blob=true,hostmem=1G,venus=true \\
  $dispopt \\
  -kernel vmlinuz -initrd initramfs.cpio.gz -append "$append" \\
  $serial -monitor none
rc=\$?
set +x
echo "end: \$(date -u +%s.%N)" >>$rr/times
[ -n "\${xpid:-}" ] && kill \$xpid
exit \$rc
EOF
  chmod +x "$ROOT$rr/run.sh"
  stage "booting the guest ($accel, display $display, ${mem} MiB, host library $hostlib); console: $run/console.log"
  local rc=0
  : >"$ROOT$rr/console.log"
  host_watch "$ROOT$rr/console.log" "$run/host-watch.log" "$rr/console.log" &
  local wpid=$!
  if [ "${APIR_VM_SHELL:-0}" = 1 ]; then
    in_root $rr/run.sh 2>"$run/qemu.log" || rc=$?
  else
    in_root $rr/run.sh >"$run/qemu.log" 2>&1 || rc=$?
  fi
  sleep 0.5; kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null || true
  rm -rf "$ROOT$rr/host" "$ROOT$rr/vmlinuz" "$ROOT$rr/initramfs.cpio.gz"
  cp -a "$ROOT$rr/." "$run/" 2>/dev/null && rm -rf "$ROOT$rr"
  stage_done
  log "qemu exit status $rc; its capabilities ($QEMU_CAPS): $(tr -s '\t\n' '  ' <"$run/caps" 2>/dev/null)"
  log "qemu.log:"
  sed 's/^/   | /' "$run/qemu.log" | tail -40
  [ -f "$run/console.log" ] || die "no console output"
  log "guest results (from $run/console.log):"
  grep -a -E '^(APIR-VM|CHECK) ' "$run/console.log" | sed 's/^/   /' || true
  local pass fail skip c
  pass=$(grep -a -c '^CHECK .* PASS' "$run/console.log" || true)
  fail=$(grep -a -c '^CHECK .* FAIL' "$run/console.log" || true)
  skip=$(grep -a -c '^CHECK .* SKIP' "$run/console.log" || true)
  # A check that never reported (the VM died or timed out in it) fails.
  for c in $(echo "$checks" | tr ',' ' '); do
    grep -a -q "^CHECK $c " "$run/console.log" || { log "   CHECK $c FAIL (no result: the VM stopped during it)"; fail=$((fail + 1)); }
  done
  # What the host side saw of the fault checks (host-watch.log).
  for c in kill_midgraph hostile; do
    in_list "$c" "$checks" || continue
    if host_verdict "$c" "$run" "$rc"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
  done
  grep -a -q 'APIR-VM poweroff' "$run/console.log" || log "   the guest did not power off (qemu exit $rc)"
  local t0 t1
  t0=$(sed -n 's/^qemu: //p' "$run/times" 2>/dev/null); t1=$(sed -n 's/^end: //p' "$run/times" 2>/dev/null)
  [ -n "$t0" ] && [ -n "$t1" ] && log "   QEMU ran $(awk "BEGIN{printf \"%.1f\", $t1-$t0}")s"
  log "boot summary: $pass passed, $fail failed, $skip skipped (run folder $run)"
  BOOT_PASS=$((BOOT_PASS + pass)) BOOT_FAIL=$((BOOT_FAIL + fail)) BOOT_SKIP=$((BOOT_SKIP + skip))
  BOOT_RUNS="$BOOT_RUNS $run"
}

# The boot stage: the checks that need the reference host library get a boot
# of their own (after the others).
stage_boots() {
  local all ours="" ref="" c
  all=$(vm_checks)
  for c in $(echo "$all" | tr ',' ' '); do
    if in_list "$c" "$(echo $REF_HOST_CHECKS | tr ' ' ',')"; then ref="$ref,$c"; else ours="$ours,$c"; fi
  done
  ours=${ours#,} ref=${ref#,}
  [ -z "$ours" ] || stage_boot ours "$ours"
  if [ -n "$ref" ]; then
    if ref_present; then
      stage_boot ref "$ref"
    else
      [ -n "$REF_MISSING" ] || { want_ref_guest && maybe_build_ref; }
      if ref_present; then stage_boot ref "$ref"; else
        for c in $(echo "$ref" | tr ',' ' '); do
          log "   CHECK $c SKIP (${REF_MISSING:-no reference host library: scripts/vm.sh ref})"; BOOT_SKIP=$((BOOT_SKIP + 1))
        done
      fi
    fi
  fi
  log "summary: $BOOT_PASS passed, $BOOT_FAIL failed, $BOOT_SKIP skipped (run folders:$BOOT_RUNS)"
  [ "$BOOT_FAIL" = 0 ] && [ "$BOOT_PASS" -gt 0 ]
}

stages=${*:-root virgl guest boot}
for s in $stages; do
  case "$s" in
    root) stage_root;;
    virgl) stage_virgl;;
    guest) stage_guest;;
    boot) stage_boots;;
    ref) stage_ref;;
    *) die "unknown stage $s (root virgl guest boot ref)";;
  esac
done
