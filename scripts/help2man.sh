#!/bin/sh
# A man page from a program's --help (and its subcommands' --help), at build
# time: the help is the one description of the options (apir-host's is made
# from its option table), so the page cannot drift from it.
#   scripts/help2man.sh NAME SECTION VERSION SUMMARY SEE_ALSO HELP [SUBHELP...] > NAME.SECTION
# HELP and SUBHELP are files holding --help output.  The layout this reads
# (the apir programs' help follows it):
#   usage: ...              the synopsis (indented lines after it starting '[' too)
#   a line at column 0      description (before the first option), else a paragraph
#   a line ending with ':'  at column 0: a heading (.SS); "exit status: ..." and
#                           "signals: ..." start sections of their own
#   "  -x, --long VALUE  help"  an item: what comes before two spaces is its tag
#   deeper indented lines   the item's help going on (a line "word  text" starts a new line)
#   other indented lines    examples, kept as they are
# A SUBHELP (a subcommand's help) becomes a subsection of COMMANDS.
set -eu
name=$1 section=$2 version=$3 summary=$4 see_also=$5
shift 5
upper=$(printf '%s' "$name" | tr 'a-z' 'A-Z')
cat <<HEAD
.\" Made by scripts/help2man.sh from $name --help: edit the help, not this.
.TH $upper $section "" "apir $version" "apir"
.nh
.ad l
.SH NAME
$name \\- $summary
HEAD
first=1
for help in "$@"; do
  awk -v sub_help="$((1 - first))" -v summary="$summary" '
    function esc(s) {
      gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s)
      if (s ~ /^[.\x27]/) s = "\\&" s
      return s
    }
    # An item tag: options bold, VALUES italic.
    function tag(s,   n, i, t, out, w, sep) {
      n = split(s, t, " ")
      out = ""
      for (i = 1; i <= n; i++) {
        w = t[i]; sep = ""
        if (w ~ /,$/) { sep = ","; w = substr(w, 1, length(w) - 1) }
        if (w ~ /^-/) w = "\\fB" esc(w) "\\fR"
        else if (w ~ /^[A-Z\[][A-Z0-9_|:.,=\[\]]*$/) w = "\\fI" esc(w) "\\fR"
        else w = esc(w)
        out = out (i > 1 ? " " : "") w sep
      }
      return out
    }
    function end_example() { if (in_ex) { print ".fi"; in_ex = 0 } }
    # OPTIONS starts; a DESCRIPTION left empty says the summary.
    function options() { if (!desc) print summary "."; print ".SH OPTIONS"; opts = 1 }
    function indent(s) { match(s, /^ */); return RLENGTH }
    NR == 1 && /^usage: / {
      syn = substr($0, 8)
      if (sub_help) { print ".SS \"" esc(syn) "\""; } else { print ".SH SYNOPSIS"; print ".nf"; print esc(syn) }
      in_syn = 1
      next
    }
    in_syn && /^ +\[/ { if (!sub_help) print esc(substr($0, indent($0) + 1)); else print ".br\n" esc($0); next }
    in_syn { in_syn = 0; if (!sub_help) { print ".fi"; print ".SH DESCRIPTION" } else print ".PP" }
    /^exit status: / {
      end_example()
      if (sub_help) { print ".PP"; print "Exit status: " esc(substr($0, 14)) }
      else { print ".SH \"EXIT STATUS\""; print esc(substr($0, 14)) }
      item = 0; next
    }
    /^signals: / {
      end_example(); print (sub_help ? ".PP\nSignals: " : ".SH SIGNALS\n") esc(substr($0, 10)); item = 0; next
    }
    /^[^ ].*:$/ {
      end_example()
      h = substr($0, 1, length($0) - 1)
      if (!opts && !sub_help) options()
      print (sub_help ? ".TP\n.B " : ".SS \"") esc(h) (sub_help ? "" : "\"")
      if (sub_help) print ""
      item = 0; next
    }
    /^[^ ]/ { end_example(); print (item || opts ? ".PP\n" : "") esc($0); item = 0; desc = 1; next }
    /^ *$/ { next }
    indent($0) >= 9 {
      end_example()
      s = substr($0, indent($0) + 1)
      if (s ~ /^[^ ]+  +[^ ]/ || s ~ /^[^ ]+, [^ ]+  +[^ ]/) print ".br"
      print esc(s)
      next
    }
    {
      s = substr($0, indent($0) + 1)
      p = index(s, "  ")
      if (p == 0) {
        if (!in_ex) { print ".IP\n.nf"; in_ex = 1 }
        print esc(s); next
      }
      end_example()
      if (!opts && !sub_help) options()
      t = substr(s, 1, p - 1); d = substr(s, p); sub(/^ +/, "", d)
      print ".TP"; print tag(t); print esc(d); item = 1
    }
    END { end_example(); if (in_syn && !sub_help) print ".fi" }
  ' "$help"
  if [ "$first" = 1 ] && [ $# -gt 1 ]; then
    echo ".SH COMMANDS"
  fi
  first=0
done
cat <<TAIL
.SH "SEE ALSO"
$see_also
.PP
README.md and docs/DEPLOY.md of apir (installed under share/doc/apir when packaged).
TAIL
