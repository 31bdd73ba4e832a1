#!/usr/bin/env bash
# The versions and command lists that README.md and docs/ quote match the code.
#
#   scripts/check_docs.sh [ROOT]      (ctest: docs_match_code)
#
# Checked, because each once drifted (docs said 0.3 and 0.4 while the code
# spoke 0.6):
#   - samples of `apir-host --version` / `apir stat` ("apir-host X.Y.Z",
#     "protocol: APIR 0.N", "(APIR 0.N)", "APIR 0.N" closing a ps/stat guest
#     line, "apir": "X.Y.Z" and "protocol": "0.N" in JSON) name the project
#     version (CMakeLists.txt) and the protocol minor (APIR_VERSION_MINOR);
#   - phrases that say what the guest offers or a release speaks ("offers APIR
#     0.N", "release 0.N", "0.1 to 0.N", "0.1..0.N") name the current minor;
#   - docs/PROTOCOL.md's command table (section "Backend commands") has one row per command of the one
#     command table (protocol/apir_commands.h), with its number, its name and
#     the minor that introduced it (its since column);
#   - every `apir SUBCOMMAND` in a code block of README.md or docs/ names a
#     subcommand tools/apir.c has.
# Prints each mismatch as FILE:LINE: what; exits 1 if any.
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
fail=0
bad() { echo "$*"; fail=1; }

version=$(sed -n 's/^project(apir VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
minor=$(sed -n 's/^#define APIR_VERSION_MINOR \([0-9]*\)$/\1/p' protocol/apir_proto.h)
[ -n "$version" ] && [ -n "$minor" ] || { echo "cannot read the project version or the protocol minor"; exit 1; }
docs=(README.md docs/*.md)

# 1. versions quoted in samples and in what-we-speak phrases
while IFS= read -r hit; do
  file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; text=${rest#*:}
  for v in $(grep -oE 'apir-host [0-9]+\.[0-9]+\.[0-9]+|"apir": "[0-9]+\.[0-9]+\.[0-9]+"' <<<"$text" | grep -oE '[0-9]+\.[0-9]+\.[0-9]+'); do
    [ "$v" = "$version" ] || bad "$file:$line: version $v quoted, the project is $version"
  done
  for m in $(grep -oE 'protocol: APIR 0\.[0-9]+|\(APIR 0\.[0-9]+\)|offers APIR 0\.[0-9]+|release 0\.[0-9]+|0\.1 to 0\.[0-9]+|0\.1\.\.0\.[0-9]+|"protocol": "0\.[0-9]+"|, APIR 0\.[0-9]+$' <<<"$text" | grep -oE '0\.[0-9]+' | tail -1); do
    [ "${m#0.}" = "$minor" ] || bad "$file:$line: protocol 0.${m#0.} quoted, the code speaks 0.$minor"
  done
done < <(grep -nHE 'apir-host [0-9]+\.[0-9]+\.[0-9]+|"apir": "[0-9]|protocol: APIR 0\.|\(APIR 0\.[0-9]+\)|offers APIR 0\.|release 0\.[0-9]|0\.1 to 0\.[0-9]|0\.1\.\.0\.[0-9]|"protocol": "0\.|, APIR 0\.[0-9]+$' "${docs[@]}" || true)

# 2. the command table in docs/PROTOCOL.md against protocol/apir_commands.h
# The code's rows: X( N, NAME, since, classes).
code_rows=$(sed -n 's/^ *X( *\([0-9]*\), *\([A-Z0-9_]*\), *\([0-9]*\),.*/\1 \2 \3/p' protocol/apir_commands.h)
doc_rows=$(awk -F'|' '/^## / { in_cmds = ($0 ~ /^## [0-9]+\. Backend commands/) }
  in_cmds && /^\| *[0-9]+ \| [A-Z][A-Z0-9_]+ \|/ { n = $2; name = $3; m = $(NF-1); gsub(/ /, "", n); gsub(/ /, "", name); gsub(/ /, "", m);
    print n, name, m }' docs/PROTOCOL.md)
n_code=0
while read -r n name since; do
  n_code=$((n_code + 1))
  want="$n $name $since"
  grep -qx "$want" <<<"$doc_rows" || bad "docs/PROTOCOL.md: no command row '$want' (number, name, minor) as protocol/apir_commands.h has it"
done <<<"$code_rows"
n_doc=$(grep -c . <<<"$doc_rows" || true)
[ "$n_doc" = "$n_code" ] || bad "docs/PROTOCOL.md: $n_doc command rows, protocol/apir_commands.h has $n_code commands"

# 3. apir subcommands named in code blocks
subs=$(sed -n 's/^ *{ "\([a-z]*\)", cmd_[a-z_]*, .*/\1/p' tools/apir.c | tr '\n' ' ')
[ -n "$subs" ] || { echo "cannot read apir's subcommands from tools/apir.c"; exit 1; }
for f in "${docs[@]}"; do
  awk '/^```/ { code = !code; next } code { print FILENAME ":" FNR ":" $0 }' "$f" |
    { grep -oE '^[^:]*:[0-9]+:(.*[;|&(] *|\$ |sudo |)apir [a-z]+' || true; } | while IFS= read -r hit; do
      sub=${hit##* }
      case " $subs help " in *" $sub "*) ;; *) echo "${hit%%:*}:$(cut -d: -f2 <<<"$hit"): 'apir $sub' is not an apir subcommand ($subs)";; esac
    done
done | { out=$(cat); [ -z "$out" ] || { echo "$out"; exit 1; }; } || fail=1

[ "$fail" = 0 ] && echo "docs: versions ($version, APIR 0.$minor), $n_code commands and apir's subcommands match the code"
exit $fail
