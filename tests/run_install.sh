#!/usr/bin/env bash
# apir installed into a prefix and run from there (issue 18, item 1):
#   tests/run_install.sh BUILD_DIR SOURCE_DIR DEPS_BIN        (ctest: install)
#
# 1. cmake --install BUILD_DIR --prefix T/a, then the prefix is moved to T/b:
#    what runs below must not depend on where it was installed.
# 2. Every installed ELF file: each RUNPATH entry $ORIGIN-relative, none
#    naming the build tree, the checkout or the pinned ggml build (DEPS_BIN).
# 3. In a mount namespace where the checkout, the build tree and the pinned
#    ggml build are empty folders (unshare -m, as root; without it the same
#    checks run, and the libraries each process mapped still prove where they
#    came from), with a bare environment:
#    - the installed apir-host: --version, --list-devices with the backends
#      found beside it (PREFIX/lib/apir), then serving a socket;
#    - the installed apir: info and ping against it; every libggml the host
#      mapped is the prefix's;
#    - a ggml program (test-backend-ops, copied out of DEPS_BIN, on the
#      installed ggml) through the INSTALLED libggml-apir.so, under the
#      installed apir run (which starts the installed apir-host);
#    - the host stops on SIGTERM with status 0, no worker killed by a signal,
#      and apir run leaves no socket folder.
set -uo pipefail

if [ "${1:-}" = --inner ]; then
  # ---- inside: only the prefix and system files are used ----
  P=$2 T=$3
  cd "$T" || exit 1
  fail=0
  bad() { echo "FAIL: $*"; fail=1; }
  "$P/bin/apir-host" --version >"$T/version.txt" 2>&1 || bad "apir-host --version: $(cat "$T/version.txt")"
  grep -q "^apir-host [0-9]" "$T/version.txt" || bad "apir-host --version printed: $(cat "$T/version.txt")"
  "$P/bin/apir" --version >/dev/null 2>&1 || bad "apir --version"
  "$P/bin/apir-host" --list-devices >"$T/list.txt" 2>"$T/list.err" || bad "apir-host --list-devices: $(cat "$T/list.err")"
  grep -q "^backend directory: $P/lib/apir (installed" "$T/list.txt" || bad "backends not found beside the program: $(head -1 "$T/list.txt")"
  grep -q "device 0: CPU" "$T/list.txt" || bad "no CPU device listed"

  "$P/bin/apir-host" --listen "unix:$T/h.sock" --log-level info >"$T/host.log" 2>&1 &
  hp=$!
  for _ in $(seq 1 500); do [ -S "$T/h.sock" ] && break; kill -0 $hp 2>/dev/null || break; sleep 0.01; done
  [ -S "$T/h.sock" ] || bad "the installed apir-host did not start: $(tail -5 "$T/host.log")"
  "$P/bin/apir" info "unix:$T/h.sock" >"$T/info.txt" 2>&1 || bad "apir info: $(cat "$T/info.txt")"
  grep -q "device 0: CPU" "$T/info.txt" || bad "apir info printed: $(cat "$T/info.txt")"
  "$P/bin/apir" ping -n 100 "unix:$T/h.sock" >"$T/ping.txt" 2>&1 || bad "apir ping: $(cat "$T/ping.txt")"
  # The libraries the host process mapped: ggml's from the prefix only.
  grep -o '/[^ ]*libggml[^ ]*' "/proc/$hp/maps" | sort -u >"$T/host-maps.txt"
  grep -q "^$P/lib/apir/libggml-cpu" "$T/host-maps.txt" || bad "the host mapped no libggml-cpu from the prefix"
  grep -v "^$P/" "$T/host-maps.txt" | while read -r lib; do echo "FAIL: the host mapped $lib"; done | grep . && fail=1
  echo "install: the host mapped $(wc -l <"$T/host-maps.txt") ggml libraries, all from the prefix"

  # A ggml program through the installed libggml-apir.so, under the
  # installed apir run: the guest's ggml is the installed one too (its CPU
  # backend, for the comparison, from the current folder).
  if [ -n "${APIR_SANITIZE:-}" ]; then
    echo "install: note: a sanitized build ($APIR_SANITIZE): no uninstrumented ggml program can load its libggml-apir.so"
  elif [ -x "$T/guest/test-backend-ops" ]; then
    mkdir -p "$T/tmp"
    (cd "$P/lib/apir" && TMPDIR="$T/tmp" LD_LIBRARY_PATH="$P/lib/apir" \
      "$P/bin/apir" run -- "$T/guest/test-backend-ops" -b APIR0 -o MUL_MAT -p "type_a=f32,type_b=f32,m=16,n=1,k=256") \
      >"$T/tbo.log" 2>&1 || bad "test-backend-ops under apir run: $(tail -5 "$T/tbo.log")"
    grep -Eq "Backend APIR0: .*OK" "$T/tbo.log" || bad "test-backend-ops: APIR0 not OK: $(tail -5 "$T/tbo.log")"
    grep -q "loaded APIR backend from $P/" "$T/tbo.log" || bad "libggml-apir.so not the prefix's: $(grep 'APIR backend' "$T/tbo.log")"
    grep -q "died of signal" "$T/tbo.log" && bad "apir run: a worker died of a signal"
    [ -z "$(ls -A "$T/tmp")" ] || bad "apir run left $(ls -A "$T/tmp")"
    echo "install: test-backend-ops through the installed libggml-apir.so: $(grep -c 'OK' "$T/tbo.log") OK lines"
  else
    echo "install: note: no test-backend-ops to run (DEPS_BIN has none)"
  fi

  # Other builds find the guest library: pkg-config and the CMake package.
  if [ -n "${APIR_SANITIZE:-}" ]; then
    echo "install: note: a sanitized build: the tiny programs that link libggml-apir.so are not built"
  else
    mkdir -p "$T/tiny"
    cat >"$T/tiny/tiny.c" <<'TINY'
#include <stdio.h>
void *ggml_backend_init(void);
int ggml_backend_score(void);
int main(void) { void *reg = ggml_backend_init(); printf("reg %s score %d\n", reg ? "ok" : "null", ggml_backend_score()); return reg ? 0 : 1; }
TINY
    bp=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --variable=backend_path apir-guest 2>&1)
    [ "$(readlink -f "$bp")" = "$(readlink -f "$P/lib/libggml-apir.so")" ] || bad "pkg-config backend_path: $bp"
    # shellcheck disable=SC2046
    cc -o "$T/tiny/pc" "$T/tiny/tiny.c" $(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs apir-guest) \
      -Wl,-rpath,"$P/lib" >"$T/tiny/pc.log" 2>&1 || bad "a program built with pkg-config's flags: $(tail -3 "$T/tiny/pc.log")"
    [ -x "$T/tiny/pc" ] && { APIR_HOST="unix:$T/none.sock" "$T/tiny/pc" 2>/dev/null | grep -q "^reg ok" || bad "the pkg-config program did not run"; }
    cat >"$T/tiny/CMakeLists.txt" <<'TINY'
cmake_minimum_required(VERSION 3.16)
project(tiny C)
find_package(apir-guest @VERSION@ REQUIRED)
add_executable(tiny tiny.c)
target_link_libraries(tiny PRIVATE apir::ggml-apir)
file(WRITE "${CMAKE_BINARY_DIR}/backend_path.txt" "${APIR_GUEST_BACKEND_PATH}")
TINY
    # the version apir-host says it is: the package must answer to it
    sed -i "s/@VERSION@/$(grep -oE '^apir-host [0-9]+\.[0-9]+' "$T/version.txt" | cut -d' ' -f2)/" "$T/tiny/CMakeLists.txt"
    (cmake -S "$T/tiny" -B "$T/tiny/b" -DCMAKE_PREFIX_PATH="$P" && cmake --build "$T/tiny/b") >"$T/tiny/cmake.log" 2>&1 \
      || bad "a CMake project with find_package(apir-guest): $(tail -5 "$T/tiny/cmake.log")"
    [ -x "$T/tiny/b/tiny" ] && { APIR_HOST="unix:$T/none.sock" "$T/tiny/b/tiny" 2>/dev/null | grep -q "^reg ok" || bad "the CMake program did not run"; }
    grep -q "^$P/lib/libggml-apir.so$" "$T/tiny/b/backend_path.txt" 2>/dev/null || bad "APIR_GUEST_BACKEND_PATH: $(cat "$T/tiny/b/backend_path.txt" 2>&1)"
    echo "install: pkg-config and find_package(apir-guest) build programs that load the installed libggml-apir.so"
  fi

  # bash completion, as bash-completion would load it for apir-host and apir
  comp=$(PATH="$P/bin:$PATH" bash -c '. "$1/share/bash-completion/completions/apir-host"
    COMP_WORDS=(apir-host --li); COMP_CWORD=1; _apir_host; echo "${COMPREPLY[*]}"
    COMP_WORDS=(apir ru); COMP_CWORD=1; _apir; echo "${COMPREPLY[*]}"
    COMP_WORDS=(apir ping --co); COMP_CWORD=2; _apir; echo "${COMPREPLY[*]}"' _ "$P" 2>&1)
  echo "$comp" | grep -q -- "--listen" || bad "completion of apir-host --li: $comp"
  echo "$comp" | grep -qx "run" || bad "completion of apir ru: $comp"
  echo "$comp" | grep -q -- "--count" || bad "completion of apir ping --co: $comp"

  kill -TERM $hp; wait $hp; rc=$?
  [ "$rc" = 0 ] || bad "the installed apir-host exited $rc on SIGTERM"
  grep -q "backends from $P/lib/apir" "$T/host.log" || bad "host log: $(grep 'backends from' "$T/host.log")"
  grep -q "died of signal" "$T/host.log" && bad "host log: a worker died of a signal"
  [ "$fail" = 0 ] || { echo "--- host log"; tail -20 "$T/host.log"; }
  exit $fail
fi

BUILD=$(cd "$1" && pwd -P) SRC=$(cd "$2" && pwd -P) DEPS_BIN=$3
DEPS=$(cd "$DEPS_BIN/.." && pwd -P)
T=$(mktemp -d /tmp/apir-install-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

cmake --install "$BUILD" --prefix "$T/a" >"$T/install.log" 2>&1 || { cat "$T/install.log"; echo "FAIL: cmake --install"; exit 1; }
mv "$T/a" "$T/b"
P=$T/b
for f in bin/apir-host bin/apir bin/apir-gguf-gen bin/apir-whisper-gen lib/libggml-apir.so \
         lib/pkgconfig/apir-guest.pc lib/cmake/apir-guest/apir-guest-config.cmake \
         share/bash-completion/completions/apir share/bash-completion/completions/apir-host \
         lib/apir/libggml.so.0 lib/apir/libggml-base.so.0; do
  [ -e "$P/$f" ] || bad "not installed: $f"
done
ls "$P"/lib/apir/libggml-cpu*.so >/dev/null 2>&1 || bad "no CPU backend library installed in lib/apir"
[ ! -e "$BUILD/libapir-virgl.so" ] || [ -e "$P/lib/libapir-virgl.so" ] || bad "not installed: lib/libapir-virgl.so"

# The guest library needs nothing beyond glibc and the program's own ggml: a
# container image or a VM adds no system package for it.
needed=$(readelf -d "$P/lib/libggml-apir.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
for lib in $needed; do
  case $lib in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*|libggml-base.so*|libggml.so*) ;;
    libasan.so.*|libubsan.so.*|libtsan.so.*) ;;  # a sanitizer build's runtime
    *) bad "lib/libggml-apir.so needs $lib (only glibc and ggml expected)";;
  esac
done

# Every RUNPATH: $ORIGIN-relative; nothing names the checkout or the pinned build.
n_elf=0
while IFS= read -r f; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  n_elf=$((n_elf + 1))
  paths=$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')
  IFS=: read -ra entries <<<"$paths"
  for e in "${entries[@]}"; do
    case $e in
      '$ORIGIN'|'$ORIGIN/'*) ;;
      *) bad "${f#$P/}: RUNPATH entry '$e' is not \$ORIGIN-relative";;
    esac
  done
  for d in "$SRC" "$BUILD" "$DEPS"; do
    case $paths in *"$d"*) bad "${f#$P/}: RUNPATH names $d";; esac
  done
done < <(find "$P" -type f)
echo "install: $n_elf ELF files installed, every RUNPATH \$ORIGIN-relative"
# ldd in a bare environment: ggml resolves inside the prefix.
env -i PATH=/usr/bin:/bin ldd "$P/bin/apir-host" >"$T/ldd.txt" 2>&1
grep -Eq "libggml-base.so.0 => $P/(bin/\.\./)?lib/apir/" "$T/ldd.txt" || bad "ldd apir-host: $(grep ggml "$T/ldd.txt")"
grep -E "not found|$SRC|$DEPS" "$T/ldd.txt" && bad "ldd apir-host names the checkout or misses a library"

mkdir -p "$T/guest"
[ -x "$DEPS_BIN/test-backend-ops" ] && cp "$DEPS_BIN/test-backend-ops" "$T/guest/"
cp "$0" "$T/run_install.sh"
# A bare environment (the sanitizers' settings excepted).
inner=(env -i PATH=/usr/bin:/bin HOME="$T" APIR_SANITIZE="${APIR_SANITIZE:-}" ASAN_OPTIONS="${ASAN_OPTIONS:-}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-}" bash "$T/run_install.sh" --inner "$P" "$T")
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  # The checkout, the build tree and the pinned build: empty from inside.
  hide="mount -t tmpfs apir-hidden '$SRC' && mount -t tmpfs apir-hidden '$DEPS'"
  case $BUILD in "$SRC"/*) ;; *) hide="$hide && mount -t tmpfs apir-hidden '$BUILD'";; esac
  echo "install: running from $P with $SRC, $DEPS hidden (unshare -m)"
  (cd "$T" && unshare -m bash -c "$hide && exec \"\$@\"" hide "${inner[@]}") || fail=1
else
  echo "install: note: cannot hide the checkout (needs root and unshare -m): the mapped libraries are checked instead"
  (cd "$T" && "${inner[@]}") || fail=1
fi
[ "$fail" = 0 ] && echo "install: OK"
exit $fail
