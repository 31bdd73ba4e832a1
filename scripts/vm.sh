#!/usr/bin/env bash
# A real VM for the virtgpu path (issue 15): QEMU 10 + virglrenderer (APIR
# merge request) on the host, a Debian kernel with the real virtio_gpu driver
# in the guest, and our guest library talking to build/libapir-virgl.so
# through it.  docs/VM.md says what works and what does not.
#
#   scripts/vm.sh [STAGE...]     stages: root virgl guest boot (default: all four)
#
# Everything is cached under ~/.cache/apir/vm-<key>/ (never in the checkout):
#   root/         a Debian trixie root (debootstrap) with QEMU, Mesa, Xvfb and
#                 the build tools for virglrenderer; QEMU runs chrooted in it
#   root/opt/virgl  virglrenderer MR 1590 (-Dapir=true -Dvenus=true), built
#                 inside the root against trixie's libraries
#   guest/        vmlinuz + initramfs (busybox, modules, our guest binaries)
#   runs/<time>-<pid>/  console.log, qemu.log, virgl-apir.log, run.sh (the QEMU command)
#
# Environment:
#   APIR_BUILD      apir build to take binaries from (default <repo>/build; read only,
#                   copied at image-build / boot time)
#   APIR_VM_ACCEL   kvm | tcg | auto (default auto: kvm if it works)
#   APIR_VM_DISPLAY egl-headless (default; rendernode /dev/null: Mesa falls back to llvmpipe) |
#                   sdl (under Xvfb, started in the root)
#   APIR_VM_MEM     guest RAM in MiB (default 3072)
#   APIR_VM_TIMEOUT seconds before the VM is killed (default 3600; TCG is slow)
#   APIR_VM_CHECKS  comma-separated guest checks (default: ping,info,greedy,bench,backend_ops)
#   APIR_VM_OPS     test-backend-ops op list (default ADD,MUL_MAT)
#   APIR_VM_BIG_MODEL  apir-gguf-gen options of a second model for the greedy_big check
#                   (e.g. "--layers 4 --embd 2048 --ff 5632 --heads 16 --kv-heads 4 --vocab 32000 --type q4_0")
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
VIRGL_OPTS="-Dapir=true -Dvenus=true -Dplatforms=egl,glx -Dbuildtype=release -Dprefix=/opt/virgl -Dlibdir=lib"

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
  log "root: $(in_root dpkg-query -W -f='${Package} ${Version}\n' qemu-system-x86 libgl1-mesa-dri xvfb | tr '\n' ' ')"
}

# ---- stage virgl ------------------------------------------------------------
stage_virgl() {
  local vkey; vkey=$(printf '%s %s' "$(sha256sum <"$VIRGL_TARBALL" | cut -c1-16)" "$VIRGL_OPTS" | sha256sum | cut -c1-12)
  if [ "$(cat "$VM/stamp-virgl" 2>/dev/null)" = "$vkey" ]; then
    log "virglrenderer present (/opt/virgl in the root, key $vkey)"; return 0
  fi
  stage "building virglrenderer (MR 1590) inside the root: $VIRGL_OPTS"
  rm -rf "$ROOT/opt/virgl-src" "$ROOT/opt/virgl"
  mkdir -p "$ROOT/opt/virgl-src"
  tar -C "$ROOT/opt/virgl-src" -xzf "$VIRGL_TARBALL" --strip-components=1
  in_root sh -c "cd /opt/virgl-src && meson setup build $VIRGL_OPTS && nice -n 10 ninja -C build -j2 && ninja -C build install" \
    >"$VM/virgl-build.log" 2>&1 || { tail -30 "$VM/virgl-build.log"; die "virglrenderer build failed (log: $VM/virgl-build.log)"; }
  echo "$vkey" >"$VM/stamp-virgl"
  stage_done
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

stage_guest() {
  local f
  for f in apir libggml-apir.so apir-gguf-gen; do
    [ -x "$APIR_BUILD/$f" ] || [ -f "$APIR_BUILD/$f" ] || die "$APIR_BUILD/$f missing (build apir, or point APIR_BUILD at a build)"
  done
  stage_kernel
  local kver; kver=$(kernel_version)
  # The initramfs key: kernel, our binaries, the tools, init, the checks.
  local inputs=("$APIR_BUILD/apir" "$APIR_BUILD/libggml-apir.so" "$APIR_BUILD/apir-gguf-gen" "$DEPS_BIN/test-backend-ops"
                "$DEPS_BIN/llama-bench" "$DEPS_BIN/libggml-cpu.so" "$REPO/tests/vm/init" "$REPO/tests/vm/checks.sh")
  [ -x "$APIR_BUILD/tests/apir-llama-greedy" ] && inputs+=("$APIR_BUILD/tests/apir-llama-greedy")
  local gkey; gkey=$( { echo "$kver $GUEST_MODULES ${APIR_VM_BIG_MODEL:-}"; sha256sum "${inputs[@]}" | cut -c1-64; } | sha256sum | cut -c1-12)
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
  cp -L "$DEPS_BIN"/libggml-cpu*.so "$ir/apir/bin/"
  # The ggml/llama libraries, next to the tools (their RUNPATH is $ORIGIN/../lib or absolute).
  cp -a "$DEPS_BIN"/lib*.so* "$ir/apir/lib/" 2>/dev/null || true
  rm -f "$ir/apir/lib/"libggml-cpu*.so
  local bins=("$ir"/apir/bin/*)
  LD_LIBRARY_PATH="$DEPS_LIB:$DEPS_BIN" copy_with_libs "$ir" "${bins[@]}" "$ir"/apir/lib/*.so*
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
stage_boot() {
  local stamp; stamp=$(date -u +%Y%m%d-%H%M%S)-$$
  local run="$VM/runs/$stamp"
  mkdir -p "$run"
  ln -sfn "$run" "$VM/runs/latest"
  [ -f "$APIR_BUILD/libapir-virgl.so" ] || die "$APIR_BUILD/libapir-virgl.so missing: configure with -DAPIR_VIRGL=ON \
(e.g. cmake -S $REPO -B $REPO/build-hE -G Ninja -DAPIR_VIRGL=ON && cmake --build $REPO/build-hE), then APIR_BUILD=$REPO/build-hE"
  # What the host side loads, copied now (build/ is rebuilt by others).
  local hl="$ROOT/opt/apir-runs/$stamp/host"
  mkdir -p "$hl"
  cp "$APIR_BUILD/libapir-virgl.so" "$hl/"
  cp -a "$DEPS_LIB"/libggml*.so* "$hl/"
  cp -L "$DEPS_BIN"/libggml-cpu*.so "$hl/"
  # The run folder inside the root (one per boot: two boots may run at once).
  local rr="/opt/apir-runs/$stamp"
  mkdir -p "$ROOT$rr"
  cp "$GUEST/vmlinuz" "$GUEST/initramfs.cpio.gz" "$ROOT$rr/"

  local accel=${APIR_VM_ACCEL:-auto}
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
  fi
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
  local append="console=ttyS0 panic=-1 loglevel=4 apir.checks=${APIR_VM_CHECKS:-ping,info,greedy,bench,backend_ops}"
  append="$append apir.ops=${APIR_VM_OPS:-ADD,MUL_MAT}"
  [ "${APIR_VM_SHELL:-0}" = 1 ] && append="$append apir.shell=1"
  local xd=$(( 100 + $$ % 800 ))   # the X display: one per boot
  local serial="-serial file:$rr/console.log"
  [ "${APIR_VM_SHELL:-0}" = 1 ] && serial="-chardev stdio,id=con,signal=off,logfile=$rr/console.log -serial chardev:con"
  cat >"$ROOT$rr/run.sh" <<EOF
#!/bin/sh
# Runs inside the root: Xvfb (for sdl), then QEMU; written by scripts/vm.sh.
cd $rr
export VIRGL_ROUTE_VENUS_TO_APIR=1
export VIRGL_APIR_BACKEND_LIBRARY=$rr/host/libapir-virgl.so
export APIR_LLAMA_CPP_GGML_LIBRARY_PATH=$rr/host/libggml-cpu.so
export APIR_LLAMA_CPP_GGML_LIBRARY_REG=ggml_backend_cpu_reg
export VIRGL_APIR_LOG_TO_FILE=$rr/virgl-apir.log
export RENDER_SERVER_EXEC_PATH=/opt/virgl/libexec/virgl_render_server
export LD_LIBRARY_PATH=/opt/virgl/lib:$rr/host
export APIR_LOG_LEVEL=\${APIR_LOG_LEVEL:-info}
export XDG_RUNTIME_DIR=/tmp
if [ "$display" != egl-headless ]; then
  Xvfb :$xd -screen 0 1280x800x24 -nolisten tcp >$rr/xvfb.log 2>&1 &
  xpid=\$!
  export DISPLAY=:$xd
  for i in \$(seq 1 50); do [ -e /tmp/.X11-unix/X$xd ] && break; sleep 0.1; done
fi
echo "qemu: \$(date -u +%s.%N)" >$rr/times
set -x
timeout ${APIR_VM_TIMEOUT:-3600} qemu-system-x86_64 -accel $accel -cpu $cpu -smp 2 -m $mem -machine q35 \\
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
  stage "booting the guest ($accel, display $display, ${mem} MiB); console: $run/console.log"
  local rc=0
  if [ "${APIR_VM_SHELL:-0}" = 1 ]; then
    in_root $rr/run.sh 2>"$run/qemu.log" || rc=$?
  else
    in_root $rr/run.sh >"$run/qemu.log" 2>&1 || rc=$?
  fi
  rm -rf "$ROOT$rr/host" "$ROOT$rr/vmlinuz" "$ROOT$rr/initramfs.cpio.gz"
  cp -a "$ROOT$rr/." "$run/" 2>/dev/null && rm -rf "$ROOT$rr"
  stage_done
  log "qemu exit status $rc; qemu.log:"
  sed 's/^/   | /' "$run/qemu.log" | tail -40
  [ -f "$run/console.log" ] || die "no console output"
  log "guest results (from $run/console.log):"
  grep -a -E '^(APIR-VM|CHECK) ' "$run/console.log" | sed 's/^/   /' || true
  local pass fail c
  pass=$(grep -a -c '^CHECK .* PASS' "$run/console.log" || true)
  fail=$(grep -a -c '^CHECK .* FAIL' "$run/console.log" || true)
  # A check that never reported (the VM died or timed out in it) fails.
  for c in $(echo "${APIR_VM_CHECKS:-ping,info,greedy,bench,backend_ops}" | tr ',' ' '); do
    grep -a -q "^CHECK $c " "$run/console.log" || { log "   CHECK $c FAIL (no result: the VM stopped during it)"; fail=$((fail + 1)); }
  done
  grep -a -q 'APIR-VM poweroff' "$run/console.log" || log "   the guest did not power off (qemu exit $rc)"
  local t0 t1
  t0=$(sed -n 's/^qemu: //p' "$run/times" 2>/dev/null); t1=$(sed -n 's/^end: //p' "$run/times" 2>/dev/null)
  [ -n "$t0" ] && [ -n "$t1" ] && log "   QEMU ran $(awk "BEGIN{printf \"%.1f\", $t1-$t0}")s"
  log "summary: $pass passed, $fail failed (run folder $run)"
  [ "$fail" = 0 ] && [ "$pass" -gt 0 ]
}

stages=${*:-root virgl guest boot}
for s in $stages; do
  case "$s" in
    root) stage_root;;
    virgl) stage_virgl;;
    guest) stage_guest;;
    boot) stage_boot;;
    *) die "unknown stage $s (root virgl guest boot)";;
  esac
done
