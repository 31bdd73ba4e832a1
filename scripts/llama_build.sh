# Sourced by scripts/setup.sh and scripts/guest-for.sh: how a llama.cpp tree is
# fetched and configured.  One place, so that the pinned build and the builds for
# other trees use the same options (a test comparing them compares ggml versions,
# not build settings).  Expects ROOT and CACHE set, and step/done_step/die defined.

# GGML_NATIVE=ON cannot be combined with GGML_BACKEND_DL=ON on x86, so the CPU
# features are named explicitly from what this processor has.
llama_cpu_opts() {
  local opts="-DGGML_NATIVE=OFF" flags f
  if [ "$(uname -m)" = x86_64 ]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    has() { case " $flags " in *" $1 "*) return 0;; esac; return 1; }
    for f in avx avx2 fma f16c bmi2; do
      has "$f" && opts="$opts -DGGML_$(echo $f | tr a-z A-Z)=ON" || opts="$opts -DGGML_$(echo $f | tr a-z A-Z)=OFF"
    done
    if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
      opts="$opts -DGGML_AVX512=ON"
      has avx512_vnni && opts="$opts -DGGML_AVX512_VNNI=ON"
      has avx512_bf16 && opts="$opts -DGGML_AVX512_BF16=ON"
      has avx512vbmi && opts="$opts -DGGML_AVX512_VBMI=ON"
    fi
  fi
  printf '%s' "$opts"
}

# The cmake options of every llama.cpp build (the pinned one's cache key hashes
# this exact string: change it and every machine rebuilds the pinned tree).
llama_opts() {
  local extra_opts=""
  [ "${APIR_CUDA:-0}" = 1 ] && extra_opts="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90a-real}"
  printf '%s' "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_RPC=ON \
 $(llama_cpu_opts) $extra_opts -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
 -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON \
 -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON"
}

# llama_fetch_bundle NPM_SPEC|BUNDLE_FILE OUT_BUNDLE: the llama.cpp git bundle
# that node-llama-cpp ships (llama/gitRelease.bundle of `npm pack NPM_SPEC`), or
# a bundle file given directly, copied to OUT_BUNDLE.
llama_fetch_bundle() {
  local spec=$1 out=$2 tmp
  if [ -f "$spec" ]; then
    cp "$spec" "$out"
    return 0
  fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null) || { rm -rf "$tmp"; die "npm pack $spec failed"; }
  tar -C "$tmp" -xzf "$tmp"/node-llama-cpp-*.tgz package/llama/gitRelease.bundle \
    || { rm -rf "$tmp"; die "the npm package $spec has no llama/gitRelease.bundle"; }
  mv "$tmp/package/llama/gitRelease.bundle" "$out"
  rm -rf "$tmp"
}

# llama_clone BUNDLE COMMIT|"" DEST: a checkout of COMMIT (the bundle's HEAD when
# empty) in DEST, verified; marked with .apir-verified so that later runs trust it.
llama_clone() {
  local bundle=$1 commit=$2 dest=$3 got
  rm -rf "$dest"
  git clone -q "$bundle" "$dest" 2>/dev/null || die "cannot clone the bundle $bundle"
  if [ -n "$commit" ]; then
    git -C "$dest" -c advice.detachedHead=false checkout -q "$commit" 2>/dev/null \
      || die "the bundle does not contain commit $commit"
    got=$(git -C "$dest" rev-parse HEAD)
    [ "$got" = "$commit" ] || die "bundle HEAD is $got, expected $commit"
  fi
  touch "$dest/.apir-verified"
}

# llama_install SRC BUILD DEST: ggml's and llama's headers, libraries and CMake
# packages into DEST/install, the programs (and the libraries next to them, where
# ggml's loader looks for backends) into DEST/bin.
llama_install() {
  local src=$1 build=$2 dest=$3
  cmake --install "$build/ggml" >/dev/null 2>&1 || die "ggml install failed"
  cmake --install "$build/src" >/dev/null 2>&1 || true
  mkdir -p "$dest/install/include" "$dest/install/lib" "$dest/bin"
  cp "$src/include/llama.h" "$dest/install/include/"
  llama_private_headers "$src" "$dest"
  cp -a "$build/bin/"lib*.so* "$dest/install/lib/" 2>/dev/null || true
  # Tools run from their bin/ (backends are looked up next to the executable).
  cp -a "$build/bin/"* "$dest/bin/"
}

# Headers a backend library needs beyond ggml's public ones: the backend
# interface, and ggml-impl.h for struct ggml_cgraph (its uid tells a reused
# graph).  Cheap, so done on every run.
llama_private_headers() {
  local src=$1 dest=$2
  mkdir -p "$dest/install/include"
  cp "$src/ggml/src/ggml-backend-impl.h" "$src/ggml/src/ggml-impl.h" "$dest/install/include/"
}

# ---- whisper.cpp against a llama.cpp tree's ggml ----------------------------
# The pinned tree's (scripts/setup.sh, .whisper) and other trees' (scripts/guest-for.sh
# --whisper) are built here alike, so that they differ by their ggml alone.
WHISPER_COMMIT=233fe1fc
WHISPER_TARBALL=${APIR_WHISPER_TARBALL:-$ROOT/../shared/third_party/whisper.cpp-$WHISPER_COMMIT.tar.gz}
WHISPER_OPTS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DWHISPER_USE_SYSTEM_GGML=ON -DWHISPER_SDL2=OFF \
 -DWHISPER_CURL=OFF -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_SERVER=OFF -DWHISPER_BUILD_EXAMPLES=ON"
WHISPER_TARGETS="whisper-cli whisper-bench"

# whisper_build GGML DEST: whisper.cpp from WHISPER_TARBALL against the ggml that
# GGML holds (a tree's cache folder: install/ its headers, libraries and CMake
# packages, bin/ its CPU backend), into DEST:
#   bin/    whisper-cli, whisper-bench, libwhisper (an $ORIGIN rpath, then GGML's
#           libraries) and GGML's CPU backend linked in (ggml's loader looks for
#           backends next to the program)
#   share/  the test inputs: the tensor-less model (apir-whisper-gen adds random
#           weights) and samples/jfk.wav
whisper_build() {
  local ggml=$1 dest=$2 src=$2/whisper.cpp lib
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/share"
  tar -C "$dest" -xzf "$WHISPER_TARBALL" || die "cannot unpack $WHISPER_TARBALL"
  cmake -S "$src" -B "$dest/build" -G Ninja $WHISPER_OPTS -DCMAKE_PREFIX_PATH="$ggml/install" \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH="\$ORIGIN;$ggml/install/lib" \
    >"$dest/configure.log" 2>&1 || { tail -30 "$dest/configure.log" >&2; die "whisper.cpp configure failed (log: $dest/configure.log)"; }
  cmake --build "$dest/build" -j "$JOBS" --target $WHISPER_TARGETS >"$dest/build.log" 2>&1 \
    || { tail -30 "$dest/build.log" >&2; die "whisper.cpp build failed (log: $dest/build.log)"; }
  for t in $WHISPER_TARGETS; do cp -a "$dest/build/bin/$t" "$dest/bin/"; done
  find "$dest/build" -name 'libwhisper.so*' -exec cp -a {} "$dest/bin/" \;
  for lib in "$ggml/bin/"libggml-cpu*.so; do ln -sfn "$lib" "$dest/bin/"; done
  cp "$src/models/for-tests-ggml-tiny.bin" "$src/samples/jfk.wav" "$dest/share/"
}
