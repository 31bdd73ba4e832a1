#!/usr/bin/env bash
# The host's folders are layers (docs/ARCHITECTURE.md, "The host's layers"):
#
#   core      devices, handles, sessions and their blobs
#   check     what a guest may describe (records, nodes, operand rules)
#   data      buffers and the copies made of them (mirrors, pins, weight copies, cache)
#   dispatch  commands, requests, graph execution, op placement
#   server    apir-host: listener, admission, workers, sandbox, service, control, stats
#   virgl     libapir-virgl.so
#
# A file may include headers of its own folder and of the folders its layer
# lists below, never the other way: so a change in the server cannot reach
# the checks through a back door, and the checks can be read (and fuzzed)
# with nothing above them.  This script fails on any #include "..." of a
# host header from a folder its layer may not use; CTest runs it
# (layers_point_one_way).
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A may=(
  [core]="core"
  [check]="check core"
  [data]="data core"
  [dispatch]="dispatch check data core"
  [server]="server dispatch check data core"
  [virgl]="virgl server dispatch check data core"
)

# header name -> folder
declare -A home=()
for h in host/*/*.h; do
  home[$(basename "$h")]=$(basename "$(dirname "$h")")
done

bad=0
for f in host/*/*.[ch]; do
  layer=$(basename "$(dirname "$f")")
  allowed=${may[$layer]:-}
  if [ -z "$allowed" ]; then
    echo "check_layers: $f: folder host/$layer is not a known layer (add it to scripts/check_layers.sh)"; bad=1; continue
  fi
  while read -r inc; do
    to=${home[$inc]:-}
    [ -n "$to" ] || continue               # not a host header (protocol/, transport/, ggml)
    case " $allowed " in *" $to "*) ;; *)
      echo "check_layers: $f includes $inc from host/$to: host/$layer may use only: $allowed"; bad=1;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done
[ $bad = 0 ] && echo "check_layers: every host/ include points down the layers"
exit $bad
