#!/usr/bin/env bash
# A ggml program in a podman container, served by an apir-host outside it
# (issue 18, item 3):
#   tests/run_container.sh BUILD_DIR SOURCE_DIR DEPS_BIN CASE    (ctest: container_CASE)
#
# CASE says how apir reaches the container:
#   rootfs  the recipe without an image: the installed prefix's lib/ is
#           bind-mounted read-only at /opt/apir/lib, GGML_BACKEND_PATH and
#           APIR_HOST are set with -e; podman run --rootfs;
#   image   dist/container/Containerfile, built (podman build) on an image
#           imported (podman import) from the same root filesystem: the
#           library copied in, the environment from the image's ENV;
#   cdi     the spec `apir cdi` prints, installed in /var/run/cdi under a name
#           of this run's own (removed at the end): podman run --device
#           apir.dev/host=NAME mounts the socket and the library and sets the
#           environment.
#
# 1. cmake --install BUILD_DIR into a temporary prefix; that prefix's apir-host
#    serves unix:T/run/host.sock (mode 0660, group 4322, as the systemd unit
#    makes it with group apir: the container's user, uid 4321 gid 4321, may
#    connect through its supplementary group 4322 (--group-add), not as root).
# 2. The container's root filesystem is built here, from this machine's files
#    (no registry): the guest program (tests/apir-llama-greedy), its
#    llama.cpp/ggml libraries in /app, the system libraries ldd names for it,
#    for /bin/sh and for libggml-apir.so (glibc only).  No apir in it.
# 3. Every case runs the container as uid 4321 gid 4321 (+4322), every capability
#    dropped, no-new-privileges, podman's default seccomp profile, a read-only
#    root, --network=none and --ipc=none (no /dev/shm at all: the shared memory
#    is memfd blobs passed over the socket, the doorbells futexes in them); the
#    socket's folder bind-mounted at /run/apir, the model read-only at /models.
#    Its sh waits on a fifo until the test has read the container's pid as
#    the host sees it (podman inspect), then execs the guest as the
#    container's pid 1.
# 4. Checks: the greedy decode inside the container (device APIR0) gives the
#    tokens and logits (tol 1e-3) of the same program run natively on the CPU
#    backend outside; the host log names the guest by the pid the host sees,
#    its uid 4321, and "says pid 1"; the host computed the graphs; the model
#    file reached the host without a copy (its fd crossed the container
#    boundary); no worker died of a signal.  rootfs also runs the guest
#    without --group-add: "Permission denied", no APIR device.
#
# Where podman cannot run containers the test says why and exits 77 (ctest
# SKIP_RETURN_CODE): podman missing, not root (the test runs rootful podman),
# or every combination of the settings below failed (each one's error shown).
# podman's own state goes to the temporary folder (--root/--runroot/--tmpdir,
# storage driver vfs): nothing is left in /var/lib/containers.
#
# Settings tried, in order, until a trivial container runs (the first that
# works is used and printed):
#   - the OCI runtime: podman's default (crun on Debian 12), then runc - crun
#     1.8 refuses cgroup v1 "hybrid" hosts (a controller on the v2 hierarchy);
#   - --ulimit nofile=H:H --ulimit nproc=N:N at most the hard limits podman
#     runs under: podman asks for 1048576 open files, which needs
#     CAP_SYS_RESOURCE above the hard limit (in a container, such as a CI
#     runner, root may lack it);
#   - --cgroups=disabled (crun only).
set -uo pipefail
BUILD=$(cd "$1" && pwd -P) SRC=$(cd "$2" && pwd -P) DEPS_BIN=$(cd "$3" && pwd -P) CASE=${4:-rootfs}
skip() { echo "SKIP: $*"; exit 77; }
fail=0
bad() { echo "FAIL: $*"; fail=1; }
case $CASE in rootfs|image|cdi) ;; *) echo "usage: $0 BUILD_DIR SOURCE_DIR DEPS_BIN rootfs|image|cdi"; exit 2;; esac

[ -n "${APIR_SANITIZE:-}" ] && skip "a sanitized build ($APIR_SANITIZE): no uninstrumented ggml program can load its libggml-apir.so"
command -v podman >/dev/null 2>&1 || skip "podman is not installed (apt-get install podman runc)"
[ "$(id -u)" = 0 ] || skip "not root: this test runs rootful podman (its container user is still uid 4321)"
greedy=$BUILD/tests/apir-llama-greedy
[ -x "$greedy" ] || { echo "FAIL: no $greedy"; exit 1; }

T=$(mktemp -d /tmp/apir-container-XXXXXX)
chmod 755 "$T"
PM=(podman --root "$T/pm/root" --runroot "$T/pm/run" --tmpdir "$T/pm/tmp" --storage-driver vfs
    --cgroup-manager cgroupfs --events-backend none)
hp= cdi_spec= cdi_dir_made=
cleanup() {
  "${PM[@]}" rm -a -f -t 0 >/dev/null 2>&1
  [ -n "$hp" ] && kill "$hp" 2>/dev/null && wait "$hp" 2>/dev/null
  [ -n "$cdi_spec" ] && rm -f "$cdi_spec"
  [ -n "$cdi_dir_made" ] && rmdir /var/run/cdi 2>/dev/null
  # podman may leave its storage mounted; unmount before removing
  grep -o " $T/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
t0=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100)); }

# ---- 1. the installed prefix ----
cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1 || { cat "$T/install.log"; echo "FAIL: cmake --install"; exit 1; }
P=$T/prefix
UID_C=4321 GID=4321 SOCK_GID=4322   # the container user; the socket's group (as apir's service makes it: group apir)
mkdir -p "$T/run" "$T/models" "$T/out" "$T/gate"
chmod 755 "$T/run" "$T/models"
chown "$UID_C:$GID" "$T/out"
mkfifo -m 666 "$T/gate/go"
"$BUILD/apir-gguf-gen" -o "$T/models/model.gguf" --size tiny >/dev/null || { echo "FAIL: apir-gguf-gen"; exit 1; }
chmod 644 "$T/models/model.gguf"

# ---- 2. the container's root filesystem ----
R=$T/rootfs
mkdir -p "$R/app" "$R/bin" "$R/opt/apir/lib" "$R/run/apir" "$R/models" "$R/out" "$R/gate" "$R/tmp" \
         "$R/etc" "$R/proc" "$R/sys" "$R/dev"
cp "$greedy" "$R/app/"
cp -L "$DEPS_BIN/libggml-cpu.so" "$R/app/"     # found by ggml_backend_load_all() beside the program
cp -L /bin/sh "$R/bin/sh"
copy_deps() {   # the libraries ldd names: the system's at their own path, ggml's and llama's in /app
  local f
  for f in "$@"; do
    ldd "$f" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p'
  done | sort -u | while read -r lib; do
    case $lib in
      /lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*) mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib";;
      *) [ -e "$R/app/$(basename "$lib")" ] || cp -L "$lib" "$R/app/";;
    esac
  done
}
# libggml-apir.so needs only glibc (ldd finds what the program itself needs)
copy_deps "$greedy" "$R/app/libggml-cpu.so" /bin/sh "$P/lib/libggml-apir.so"
echo "container: root filesystem of $(du -sh "$R" | cut -f1) ($(find "$R" -type f | wc -l) files), $(elapsed)"

# ---- 3. podman: find the settings that run a container here ----
hard_nofile=$(ulimit -Hn)
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
hard_nproc=$(ulimit -Hu)
[ "$hard_nproc" = unlimited ] || [ "$hard_nproc" -gt 32768 ] && hard_nproc=32768   # podman's own default
default_rt=$("${PM[@]}" info --format "{{.Host.OCIRuntime.Name}}" 2>/dev/null)
runtimes=(default)
for rt in runc crun; do
  [ "$rt" != "$default_rt" ] && command -v $rt >/dev/null 2>&1 && runtimes+=($rt)
done
GO=() OPTS=() tried="" found=0
for rt in "${runtimes[@]}"; do
  for ul in "" "--ulimit nofile=$hard_nofile:$hard_nofile --ulimit nproc=$hard_nproc:$hard_nproc"; do
    for cg in "" "--cgroups=disabled"; do
      [ -n "$cg" ] && [ "$rt" = runc ] && continue   # runc cannot run without cgroups
      go=() o=()
      [ "$rt" != default ] && go=(--runtime "$rt")
      # shellcheck disable=SC2206
      o=($ul $cg)
      # (--rootfs is a flag: the first argument after the options is the root filesystem)
      if out=$("${PM[@]}" "${go[@]}" run --rm --network=none "${o[@]}" --rootfs "$R" /bin/sh -c 'exit 0' 2>&1); then
        GO=("${go[@]}") OPTS=("${o[@]}") found=1; break 3
      fi
      tried="$tried
  [runtime $rt$( [ $rt = default ] && echo " ($default_rt)")${ul:+ $ul}${cg:+ $cg}] $(echo "$out" | tail -1)"
    done
  done
done
[ "$found" = 1 ] || skip "podman $(podman --version | awk '{print $3}') cannot run a container here; tried:$tried"
[ -n "$tried" ] && echo "container: these settings failed:$tried"
PM+=("${GO[@]}")
used=$(echo "${GO[*]} ${OPTS[*]}" | xargs)
echo "container: podman $(podman --version | awk '{print $3}') runs containers here with ${used:-its defaults} ($(elapsed))"

# ---- 4. the case's way in ----
RUN_ARGS=()        # what the case adds to podman run
TARGET=(--rootfs "$R")
case $CASE in
  rootfs)
    RUN_ARGS=(-v "$P/lib:/opt/apir/lib:ro"
              -e GGML_BACKEND_PATH=/opt/apir/lib/libggml-apir.so -e APIR_HOST=unix:/run/apir/host.sock)
    ;;
  image)
    tar -C "$R" -cf "$T/rootfs.tar" . || { echo "FAIL: tar"; exit 1; }
    "${PM[@]}" import "$T/rootfs.tar" localhost/apir-test-app >"$T/import.log" 2>&1 ||
      { cat "$T/import.log"; echo "FAIL: podman import"; exit 1; }
    # The base has every library the program needs (copied above): nothing to apt-get.
    bopts=()   # podman build takes run's --ulimit, not --cgroups
    for o in "${OPTS[@]}"; do [ "$o" = --cgroups=disabled ] || bopts+=("$o"); done
    "${PM[@]}" build "${bopts[@]}" -f "$SRC/dist/container/Containerfile" \
      --build-arg BASE=localhost/apir-test-app --build-arg APT_PACKAGES= \
      -t localhost/apir-test-guest "$P" >"$T/build.log" 2>&1 || { cat "$T/build.log"; echo "FAIL: podman build"; exit 1; }
    echo "container: built dist/container/Containerfile on the imported root filesystem ($(elapsed))"
    TARGET=(localhost/apir-test-guest)
    ;;
  cdi)
    "$P/bin/apir" cdi --help >/dev/null 2>&1 || { echo "FAIL: apir cdi --help"; exit 1; }
    for a in "-H tcp:localhost:50052" "-H virtgpu" "-H unix:/tmp/h.sock" "--name a/b" "extra"; do
      # shellcheck disable=SC2086
      "$P/bin/apir" cdi $a >/dev/null 2>&1; r=$?
      [ $r = 2 ] || bad "apir cdi $a: exit $r, not 2"
    done
    "$P/bin/apir" cdi --library /nonexistent >/dev/null 2>&1; r=$?
    [ $r = 1 ] || bad "apir cdi --library /nonexistent: exit $r, not 1"
    name=test-${T##*-}
    "$P/bin/apir" cdi --name "$name" -H "unix:$T/run/host.sock" >"$T/apir.json" 2>"$T/cdi.err" ||
      { cat "$T/cdi.err"; echo "FAIL: apir cdi"; exit 1; }
    [ -d /var/run/cdi ] || { mkdir -p /var/run/cdi && cdi_dir_made=1; }
    cdi_spec=/var/run/cdi/apir-$name.json
    cp "$T/apir.json" "$cdi_spec"
    RUN_ARGS=(--device "apir.dev/host=$name")
    ;;
esac

# ---- 5. native run, the host, the container run ----
"$greedy" -m "$T/models/model.gguf" -d CPU -n 24 -t 2 --dump-logits "$T/cpu.bin" >"$T/cpu.out" 2>"$T/cpu.err" \
  || { cat "$T/cpu.err"; echo "FAIL: the native run"; exit 1; }
"$P/bin/apir-host" --listen "unix:$T/run/host.sock" --socket-mode 0660 --socket-group "$SOCK_GID" \
  --threads 2 --log-level info >"$T/host.log" 2>&1 &
hp=$!
for _ in $(seq 1 500); do [ -S "$T/run/host.sock" ] && break; kill -0 "$hp" 2>/dev/null || break; sleep 0.01; done
[ -S "$T/run/host.sock" ] || { cat "$T/host.log"; echo "FAIL: the installed apir-host did not start"; exit 1; }
echo "container: host socket $(stat -c '%A %u:%g' "$T/run/host.sock")"

inner='read -r _ </gate/go
if [ -e /dev/shm ]; then echo "container: /dev/shm present"; else echo "container: no /dev/shm"; fi
echo "container: GGML_BACKEND_PATH=$GGML_BACKEND_PATH APIR_HOST=$APIR_HOST"
exec /app/apir-llama-greedy -m /models/model.gguf -d APIR0 -n 24 -t 2 --dump-logits /out/apir.bin'
cid=$("${PM[@]}" run -d "${OPTS[@]}" --read-only \
  --user "$UID_C:$GID" --group-add "$SOCK_GID" --cap-drop=all --security-opt no-new-privileges \
  --network=none --ipc=none \
  -v "$T/models:/models:ro" -v "$T/out:/out" -v "$T/gate:/gate" -e LD_LIBRARY_PATH=/app \
  "${RUN_ARGS[@]}" $( [ "$CASE" != cdi ] && echo "-v $T/run:/run/apir:ro") \
  "${TARGET[@]}" /bin/sh -c "$inner" 2>"$T/podman.err") || { cat "$T/podman.err"; echo "FAIL: podman run"; exit 1; }
cpid=$("${PM[@]}" inspect --format '{{.State.Pid}}' "$cid")
nspid=$(sed -n 's/^NSpid:[[:space:]]*//p' "/proc/$cpid/status" 2>/dev/null | tr -s '\t ' ' ')
echo "container: its process is pid $cpid here, NSpid: $nspid"
case "$nspid" in "$cpid 1") ;; *) bad "the container's process is not pid 1 of its own pid namespace (NSpid: $nspid)";; esac
# (bounded: a container that died before opening the fifo would block the writer)
timeout 60 bash -c "echo go >'$T/gate/go'" || bad "the container never opened its gate"
rc=$(timeout 120 "${PM[@]}" wait "$cid") || bad "podman wait: the guest did not end in 120 s"
"${PM[@]}" logs "$cid" >"$T/apir.out" 2>&1
[ "$rc" = 0 ] || { cat "$T/apir.out"; bad "the guest in the container exited $rc"; }
grep -q "container: no /dev/shm" "$T/apir.out" || bad "the container had a /dev/shm"
if [ "$CASE" = rootfs ]; then
  # The socket's group is what lets the container's user in: without
  # --group-add the same guest finds no APIR device, and the library says why.
  "${PM[@]}" run --rm "${OPTS[@]}" --read-only --user "$UID_C:$GID" --cap-drop=all --network=none --ipc=none \
    -v "$T/run:/run/apir:ro" -e LD_LIBRARY_PATH=/app "${RUN_ARGS[@]}" \
    --rootfs "$R" /app/apir-llama-greedy --list-devices >"$T/nogroup.out" 2>&1
  if grep -q APIR0 "$T/nogroup.out" || ! grep -q "cannot connect.*Permission denied" "$T/nogroup.out"; then
    bad "a container user outside the socket's group: $(cat "$T/nogroup.out")"
  else
    echo "container: without the socket's group: $(grep -m1 "Permission denied" "$T/nogroup.out")"
  fi
fi
grep "container: GGML_BACKEND_PATH" "$T/apir.out"
echo "native CPU:       $(grep tokens: "$T/cpu.out")"
echo "container, APIR0: $(grep tokens: "$T/apir.out")"
"$greedy" --compare "$T/cpu.bin" "$T/out/apir.bin" --tol 1e-3 || bad "the container's tokens or logits differ from the native run"

# ---- 6. the host's view ----
for _ in $(seq 1 300); do grep -q 'disconnected after' "$T/host.log" && break; sleep 0.01; done
line=$(grep -E "guest#[0-9]+\(pid $cpid\) connected: .*; says pid 1\$" "$T/host.log" | head -1)
[ -n "$line" ] || bad "the host log does not name the guest pid $cpid that says pid 1: $(grep connected "$T/host.log")"
echo "host: ${line#*host: }"
echo "$line" | grep -Eq "uid $UID_C\b" || bad "the host log does not give the guest's uid $UID_C: $line"
graphs=$(grep -o 'disconnected after [0-9]* commands ([0-9]* graphs' "$T/host.log" | grep -o '([0-9]*' | tr -d '(' | sort -n | tail -1)
echo "host: computed ${graphs:-0} graphs for the container's guest"
[ "${graphs:-0}" -ge 24 ] || bad "the host computed too few graphs"
grep -q 'shared without a copy' "$T/host.log" || bad "the model file did not reach the host as a file blob"
grep -q "died of signal" "$T/host.log" && bad "a worker died of a signal"
kill -TERM "$hp"; wait "$hp"; hrc=$?; hp=
[ "$hrc" = 0 ] || bad "apir-host exited $hrc on SIGTERM"
[ "$fail" = 0 ] || { echo "--- host log"; tail -30 "$T/host.log"; echo "--- container output"; tail -20 "$T/apir.out"; }
[ "$fail" = 0 ] && echo "container ($CASE): OK ($(elapsed))"
exit $fail
