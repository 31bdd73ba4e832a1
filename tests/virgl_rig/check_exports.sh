#!/usr/bin/env bash
# libapir-virgl.so must export the virgl ABI's three entry points and nothing
# else: virglrenderer dlopens it into the hypervisor, where any other global
# symbol could interpose on (or be interposed by) the VMM's own.
set -uo pipefail
lib=$1
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sort | tr '\n' ' ')
want="apir_backend_deinit apir_backend_dispatcher apir_backend_initialize "
echo "exports of $(basename "$lib"): $got"
if [ "$got" != "$want" ]; then
  echo "FAIL: expected exactly: $want"
  exit 1
fi
echo "1 passed, 0 failed"
