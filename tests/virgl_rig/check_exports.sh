#!/usr/bin/env bash
# A library we ship must export exactly its entry points and nothing else:
# libapir-virgl.so is dlopened into the hypervisor and libggml-apir.so into
# any ggml program, where another global symbol could interpose on (or be
# interposed by) the program's own.
# usage: check_exports.sh LIB [SYMBOL...]   (default: the virgl ABI's three)
set -uo pipefail
lib=$1
shift
[ $# -gt 0 ] || set -- apir_backend_initialize apir_backend_dispatcher apir_backend_deinit
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sort | tr '\n' ' ')
want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
echo "exports of $(basename "$lib"): $got"
if [ "$got" != "$want" ]; then
  echo "FAIL: expected exactly: $want"
  exit 1
fi
echo "1 passed, 0 failed"
