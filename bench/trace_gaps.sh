#!/usr/bin/env bash
# Where a guest waited on itself: reads a guest timeline (APIR_TRACE=FILE, one
# line per span: "DEVICE start_us duration_us gap_us what bytes", in start
# order) and prints each gap of MIN_US or more between spans - time in which
# the guest sent nothing and waited for nothing, so the program's own work
# (llama.cpp's bookkeeping, graph building, the CPU backend's part of a
# split) - with the spans just before and after it; then the gaps in all.
#
#   bash bench/trace_gaps.sh FILE [MIN_US (500)] [CONTEXT (3)]
#
# A program with several APIR devices writes a section for each (its own
# header and times): give this one device's lines (grep '^APIR0 ').
# Spans named in parentheses are the guest's own steps (the scheduler's
# graph_compute call as a whole, a graph's serialization, a set_tensor or
# get_tensor call); the others are commands, their round trip included.
set -euo pipefail
file=${1:?usage: trace_gaps.sh FILE [MIN_US] [CONTEXT]}
min=${2:-500}
ctx=${3:-3}
awk -v min="$min" -v ctx="$ctx" '
  NF == 6 {
    n++; line[n] = sprintf("  %12.1f us  %9.1f us  %-32s %s", $2, $3, $5, ($6 > 0 ? $6 " B" : ""))
    gap[n] = $4 + 0; end = $2 + $3; if (end > last) last = end
    total += ($4 > 0 ? $4 : 0)
  }
  END {
    shown = 0
    for (i = 2; i <= n; i++) {
      if (gap[i] < min) continue
      big++; bigsum += gap[i]
      if (shown >= 40) continue
      shown++
      printf "gap %.1f us before span %d:\n", gap[i], i
      for (j = (i - ctx > 1 ? i - ctx : 1); j < i; j++) print line[j]
      printf "  %12s ... %.1f us of the guest on its own ...\n", "", gap[i]
      print line[i]
    }
    printf "%d spans over %.1f ms; %.1f ms between spans in all; %d gaps of %d us or more: %.1f ms\n",
           n, last / 1e3, total / 1e3, big, min, bigsum / 1e3
  }' "$file"
