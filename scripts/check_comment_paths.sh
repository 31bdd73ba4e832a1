#!/usr/bin/env bash
# Every file of this tree that a comment or a document names must exist.
#
#   scripts/check_comment_paths.sh [ROOT]      (ctest: comment_paths)
#
# Scanned: the tree's *.c and *.h (comments only: string literals and code
# are left out, #include lines are the compiler's to check), *.sh,
# CMakeLists.txt, *.cmake (whole lines) and *.md (whole text); build*/ and
# dot-folders (.deps, .whisper, ...) are not part of the tree.
#
# What counts as a reference, to keep other projects' names out:
#   - a path that starts with one of our top-level folders (host/dispatch/dispatch.c,
#     docs/INTEROP.md, tests/virgl_rig/), as its own word: ggml/src/host/x
#     or $ROOT/scripts/x is not one.  It is checked when it ends in '/' (a
#     folder) or in an extension that some file of the tree has; .cpp, .so,
#     .log and the like are never ours, so llama.cpp's tests/*.cpp and build
#     outputs are left alone;
#   - a bare file name ending in .c, .h, .sh or .md (remote.c): it must be
#     the name of some file of the tree.  Names of ggml, gguf, llama.cpp and
#     whisper.cpp files (ggml-backend.h, llama.h, ...) and the short list of
#     other projects' names in EXTERNAL below are not ours and not checked.
#     Several names joined by '/' (serialize.c/import.c) are each checked.
# Paths outside the tree (../shared/..., /usr/...) are not checked.
#
# Prints each missing reference as FILE:LINE: NAME and exits 1; 0 when
# every reference resolves.  CHECK_COMMENT_PATHS_VERBOSE=1 also lists the
# references found present.
set -euo pipefail

ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"

# Names of other projects that our comments and documents mention on
# purpose: virglrenderer's and the reference virtgpu backend's files, system
# headers, the documents of ../shared (outside this tree), and the source a
# test writes on the fly (tests/run_install.sh: tiny.c).
EXTERNAL="
api_remoting.h apir-protocol.h venus_hw.h vkr_cs.h connection.c
virtgpu_drm.h xf86drm.h drm.h
APIR-0.1.md MEASURED.md
stdio.h tiny.c
"

# The tree: tracked files plus new ones not yet committed (not ignored ones),
# that exist; without git, every file outside build*/ and dot-folders.
tree_list() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files --cached --others --exclude-standard
    else
        find . -type f ! -path './build*' ! -path './.*' | sed 's#^\./##'
    fi | grep -vE '^(build[^/]*|\.[^/]*)/' | while IFS= read -r f; do
        [ -f "$f" ] && printf '%s\n' "$f"
    done
}

tree=$(mktemp)
trap 'rm -f "$tree"' EXIT
tree_list | LC_ALL=C sort -u >"$tree"

scanned=$(grep -E '(\.(c|h|sh|cmake|md)$|(^|/)CMakeLists\.txt$)' "$tree" || true)
if [ -z "$scanned" ]; then
    echo "check_comment_paths: no files to scan under $ROOT" >&2
    exit 1
fi

# shellcheck disable=SC2086
printf '%s\n' $scanned | LC_ALL=C awk -v tree="$tree" -v external="$EXTERNAL" -v verbose="${CHECK_COMMENT_PATHS_VERBOSE:-0}" '
BEGIN {
    n_ext = split(external, ext_list, /[ \t\n]+/)
    for (i = 1; i <= n_ext; i++)
        if (ext_list[i] != "")
            is_external[ext_list[i]] = 1
    while ((getline f < tree) > 0) {
        known[f] = 1
        n = split(f, part, "/")
        base[part[n]] = 1
        if (match(part[n], /\.[A-Za-z0-9]+$/))
            tree_ext[substr(part[n], RSTART + 1)] = 1
        d = ""
        for (i = 1; i < n; i++) {
            d = d (i > 1 ? "/" : "") part[i]
            known_dir[d] = 1
            if (i == 1)
                top[d] = 1
        }
    }
    close(tree)
    missing = 0
    checked = 0
}

# The comment text of one line of C; in_block carries /* ... */ across lines.
function c_comments(line,    out, i, n, c, q, d) {
    out = ""
    n = length(line)
    i = 1
    while (i <= n) {
        c = substr(line, i, 1)
        if (in_block) {
            if (c == "*" && substr(line, i + 1, 1) == "/") {
                in_block = 0
                out = out " "
                i += 2
            } else {
                out = out c
                i++
            }
            continue
        }
        if (c == "\"" || c == "\047") {
            q = c
            i++
            while (i <= n) {
                d = substr(line, i, 1)
                if (d == "\\") { i += 2; continue }
                i++
                if (d == q)
                    break
            }
            out = out " "
            continue
        }
        if (c == "/" && substr(line, i + 1, 1) == "*") {
            in_block = 1
            out = out " "
            i += 2
            continue
        }
        if (c == "/" && substr(line, i + 1, 1) == "/")
            return out " " substr(line, i + 2)
        i++
    }
    return out
}

function is_foreign_name(name) {
    return (name in is_external) || name ~ /^(ggml|gguf|llama|whisper)/
}

function ok(file, lineno, tok) {
    if (verbose == "1")
        printf "%s:%d: %s ok\n", file, lineno, tok
}

function report(file, lineno, tok) {
    printf "%s:%d: %s does not exist\n", file, lineno, tok
    missing++
}

function check_bare(file, lineno, name) {
    if (name !~ /^[A-Za-z0-9_][A-Za-z0-9_.-]*\.(c|h|sh|md)$/)
        return
    if (is_foreign_name(name))
        return
    checked++
    if (!(name in base))
        report(file, lineno, name)
    else
        ok(file, lineno, name)
}

function check_token(file, lineno, tok,    first, rest, ext, n, k, p) {
    sub(/\.+$/, "", tok)
    while (substr(tok, 1, 2) == "./")
        tok = substr(tok, 3)
    if (tok == "")
        return
    if (index(tok, "/") == 0) {
        check_bare(file, lineno, tok)
        return
    }
    first = substr(tok, 1, index(tok, "/") - 1)
    if (first in top) {
        if (tok ~ /\/$/) {
            checked++
            if (!(substr(tok, 1, length(tok) - 1) in known_dir))
                report(file, lineno, tok)
            else
                ok(file, lineno, tok)
            return
        }
        n = split(tok, p, "/")
        if (!match(p[n], /\.[A-Za-z0-9]+$/))
            return              # prose ("guest/host") or a build output
        ext = substr(p[n], RSTART + 1)
        if (!(ext in tree_ext))
            return
        checked++
        if (!(tok in known) && !(tok in known_dir))
            report(file, lineno, tok)
        else
            ok(file, lineno, tok)
        return
    }
    # serialize.c/import.c: several bare names
    if (first ~ /\.(c|h|sh|md)$/) {
        n = split(tok, p, "/")
        for (k = 1; k <= n; k++)
            check_bare(file, lineno, p[k])
    }
}

{
    file = $0
    is_c = file ~ /\.[ch]$/
    in_block = 0
    lineno = 0
    while ((getline line < file) > 0) {
        lineno++
        if (is_c)
            text = c_comments(line)
        else
            text = line
        while (match(text, /[A-Za-z0-9_.\/-]+/)) {
            tok = substr(text, RSTART, RLENGTH)
            text = substr(text, RSTART + RLENGTH)
            if (substr(tok, 1, 1) == "/" || substr(tok, 1, 3) == "../")
                continue        # outside the tree
            check_token(file, lineno, tok)
        }
    }
    close(file)
}

END {
    if (missing) {
        printf "check_comment_paths: %d of %d references name files that do not exist\n", missing, checked
        exit 1
    }
    printf "check_comment_paths: %d references, all present\n", checked
}
'
