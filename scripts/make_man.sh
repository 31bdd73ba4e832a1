#!/bin/sh
# apir(1), apir-host(8) and apir-gguf-gen(1), from the programs' --help
# (scripts/help2man.sh): run by the build (CMakeLists.txt, target man).
#   scripts/make_man.sh OUTDIR VERSION APIR-HOST APIR APIR-GGUF-GEN
set -eu
out=$1 version=$2 host=$3 apir=$4 gen=$5
here=$(dirname "$0")
mkdir -p "$out"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/apir-man-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# --help-generic: apir-host's help without this machine's values (its
# backend folder, its core count).
"$host" --help-generic >"$tmp/apir-host"
"$apir" --help >"$tmp/apir"
subs=
for cmd in ping info run stat ps cdi; do
  "$apir" "$cmd" --help >"$tmp/apir-$cmd"
  subs="$subs $tmp/apir-$cmd"
done
"$gen" --help >"$tmp/apir-gguf-gen"
# shellcheck disable=SC2086
sh "$here/help2man.sh" apir-host 8 "$version" "serve a ggml backend to ggml programs on this machine, in VMs and over the network" \
  "apir(1), apir-gguf-gen(1), systemd.exec(5)" "$tmp/apir-host" >"$out/apir-host.8"
# shellcheck disable=SC2086
sh "$here/help2man.sh" apir 1 "$version" "talk to apir hosts: ping, info, run, stat, ps, cdi" \
  "apir-host(8), apir-gguf-gen(1)" "$tmp/apir" $subs >"$out/apir.1"
sh "$here/help2man.sh" apir-gguf-gen 1 "$version" "write a GGUF model of random weights" \
  "apir(1), apir-host(8)" "$tmp/apir-gguf-gen" >"$out/apir-gguf-gen.1"
