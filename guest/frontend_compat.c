/*
 * Is the program's ggml the one this library was built for?
 *
 * ggml has no stable backend ABI: its backend interfaces (ggml_backend_i,
 * ggml_backend_buffer_i, ...) gain and lose members between releases while
 * GGML_BACKEND_API_VERSION stays 2, so ggml's loader accepts a backend built
 * for another tree and then calls through misaligned function tables.  Our
 * tensors' op and type numbers are the built-for ggml's too.  So before the
 * registry offers any device, the program's ggml (the libggml-base.so loaded
 * in this process, whose functions we call) is compared with what this
 * library was built against: its version and commit, and what can be
 * observed of its layout without trusting it - the sizes ggml reports for a
 * tensor and a graph, its type table, which of the interface's optional
 * functions it exports.  Any difference: no device, and the user is told
 * which ggml this library is for and how to build one for theirs.
 */
#include "frontend.h"
#include "calls.h"

#include "ggml-impl.h"   /* ggml_log_internal, ggml_log_callback_default: checked like the others */

#include "apir_log.h"
#include "apir_proto.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "0.9.4-dirty" and "0.9.4" are the same release: the suffix says the tree
 * had local changes, which the other checks then catch if they matter. */
static size_t version_len(const char *v)
{
    const char *dash = strchr(v, '-');
    return dash ? (size_t)(dash - v) : strlen(v);
}

/* ggml_commit() is `git rev-parse --short` (7 or more digits) or "unknown"
 * for a tree built outside git; equal when one is a prefix of the other. */
static bool commit_known(const char *c)
{
    return c && strlen(c) >= 7 && strcmp(c, "unknown") != 0;
}

static bool commits_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    return strncmp(a, b, la < lb ? la : lb) == 0;
}

/* The digest cmake/GgmlFeatures.cmake's probe computes over the built-for
 * ggml's type names (FNV-1a, each name with its NUL); NULL-safe. */
static uint64_t type_digest(void)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < APIR_GGML_TYPE_COUNT; i++) {
        const char *s = ggml_type_name((enum ggml_type)i);
        if (!s)
            s = "";
        do {
            h = (h ^ (unsigned char)*s) * 1099511628211ull;
        } while (*s++);
    }
    return h;
}

/* Does the library that defines ggml_version (the program's libggml-base)
 * export `name`?  Looked up there, not globally: a program may have loaded
 * ggml with RTLD_LOCAL (a binding's addon). */
static int ggml_exports(const char *name)
{
    Dl_info info;
    if (!dladdr((void *)ggml_version, &info) || !info.dli_fname)
        return -1;
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return -1;
    int found = dlsym(h, name) != NULL;
    dlclose(h);
    return found;
}

/* Says what differs first; always false. */
static bool differs(char *why, size_t n, const char *program_ggml, const char *first)
{
    snprintf(why, n,
             "libggml-apir.so was built for ggml %s (llama.cpp %s); this program's ggml is %s, and %s: no APIR device",
             APIR_GGML_BUILT_VERSION, APIR_GGML_BUILT_COMMIT, program_ggml, first);
    return false;
}

bool apir_ggml_check(char *why, size_t why_size)
{
    /* Every import first: nothing below may call a missing function. */
#define APIR_X_PRESENT(f)                                                                               \
    if (!(void *)&f)                                                                                     \
        return differs(why, why_size, "another one", "it has no " #f "()");
    APIR_GGML_IMPORTS(APIR_X_PRESENT)
#undef APIR_X_PRESENT

    const char *version = ggml_version();
    const char *commit = ggml_commit();
    if (!version)
        version = "";
    char program_ggml[96];
    snprintf(program_ggml, sizeof(program_ggml), "%.40s (llama.cpp %.40s)", version,
             commit_known(commit) ? commit : "commit unknown");
    char first[96];

    if (version_len(version) != version_len(APIR_GGML_BUILT_VERSION) ||
        strncmp(version, APIR_GGML_BUILT_VERSION, version_len(version)) != 0)
        return differs(why, why_size, program_ggml, "the versions differ");
    /* Same version, other commit: the interfaces change between releases. */
    if (commit_known(commit) && commit_known(APIR_GGML_BUILT_COMMIT) && !commits_equal(commit, APIR_GGML_BUILT_COMMIT))
        return differs(why, why_size, program_ggml, "the commits differ");
    if (ggml_tensor_overhead() != APIR_GGML_TENSOR_OVERHEAD) {
        snprintf(first, sizeof(first), "its tensors take %zu bytes, not %u", ggml_tensor_overhead(),
                 APIR_GGML_TENSOR_OVERHEAD);
        return differs(why, why_size, program_ggml, first);
    }
    if (ggml_graph_overhead_custom(1, false) != APIR_GGML_GRAPH_OVERHEAD_1) {
        snprintf(first, sizeof(first), "its graphs take %zu bytes, not %u", ggml_graph_overhead_custom(1, false),
                 APIR_GGML_GRAPH_OVERHEAD_1);
        return differs(why, why_size, program_ggml, first);
    }
    /* Our types named as ours (a tree built outside git says no commit).
     * ggml_type_name does not check its argument, so this reads only as far
     * as our count, which the same version has. */
    if (type_digest() != APIR_GGML_TYPE_DIGEST)
        return differs(why, why_size, program_ggml, "its tensor types are numbered or named differently");
    /* The optional 2-D copies came into the buffer interface together with
     * ggml_backend_tensor_set_2d: its presence tells which table the
     * program's scheduler calls through. */
    int exports_2d = ggml_exports("ggml_backend_tensor_set_2d");
    if (exports_2d >= 0 && exports_2d != APIR_GGML_HAS_BUFFER_2D)
        return differs(why, why_size, program_ggml,
                       exports_2d ? "its buffer interface has 2-D copies (ggml_backend_buffer_i.set_tensor_2d)"
                                  : "its buffer interface has no 2-D copies (ggml_backend_buffer_i.set_tensor_2d)");
    return true;
}

/* ---- The host's ggml (apir 0.7, HOST_CHECK_GGML) -------------------------------- */

/* The names of one of ggml's numbered tables, one a line in number order
 * (a removed type's name has commas): what the numbers in our tensor
 * records and op parameters mean.
 * Counted by the built-for headers, which apir_ggml_check has found the
 * program's ggml to match. */
static void table_text(char *out, size_t cap, int table)
{
    static const int counts[] = { GGML_OP_COUNT, GGML_UNARY_OP_COUNT, GGML_GLU_OP_COUNT, GGML_TYPE_COUNT };
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < counts[table]; i++) {
        const char *n = table == 0   ? ggml_op_name((enum ggml_op)i)
                        : table == 1 ? ggml_unary_op_name((enum ggml_unary_op)i)
                        : table == 2 ? ggml_glu_op_name((enum ggml_glu_op)i)
                                     : ggml_type_name((enum ggml_type)i);
        int w = snprintf(out + used, cap - used, "%s%s", i ? "\n" : "", n ? n : "");
        if (w < 0 || (size_t)w >= cap - used) {
            /* Never half a name: the host compares what is there. */
            out[used] = '\0';
            return;
        }
        used += (size_t)w;
    }
}

static bool host_agrees(struct apir_remote *r, bool locked, char *why, size_t why_size)
{
    if (!apir_minor_speaks(r->minor, APIR_CMD_HOST_CHECK_GGML)) {
        if (APIR_GGML_IS_PINNED)
            return true;  /* what every host before 0.7 was built with */
        snprintf(why, why_size,
                 "the host speaks APIR 0.%u, too old to say which ggml it computes with, and this library is for ggml %s "
                 "(llama.cpp %s), not the one apir pins: update apir-host",
                 r->minor, APIR_GGML_BUILT_VERSION, APIR_GGML_BUILT_COMMIT);
        return false;
    }
    /* Once per connection to a host: ~24 KiB, not on any hot path. */
    struct {
        char tables[4][APIR_MAX_STRING];
        struct apir_string reason, host_ggml;
    } *m = malloc(sizeof(*m));
    if (!m) {
        snprintf(why, why_size, "out of memory");
        return false;
    }
    for (int t = 0; t < 4; t++)
        table_text(m->tables[t], sizeof(m->tables[t]), t);
    const char *commit = ggml_commit();
    if (!commit)
        commit = "unknown";
    uint32_t verdict = APIR_GGML_REFUSED;
    int rc = locked ? apir_call_HOST_CHECK_GGML_locked(r, ggml_version(), commit, m->tables[0], m->tables[1],
                                                       m->tables[2], m->tables[3], &verdict, &m->reason, &m->host_ggml)
                    : apir_call_HOST_CHECK_GGML(r, ggml_version(), commit, m->tables[0], m->tables[1], m->tables[2],
                                                m->tables[3], &verdict, &m->reason, &m->host_ggml);
    bool ok = false;
    if (rc != APIR_HANDLER_OK)
        snprintf(why, why_size, "the host did not answer which ggml it computes with (error %d)", rc);
    else if (verdict == APIR_GGML_SAME)
        ok = true;
    else if (verdict == APIR_GGML_TABLES_EQUAL) {
        APIR_INFO("guest", "the host computes with ggml %s, this program has %s (llama.cpp %s): their op and type "
                  "tables are the same", m->host_ggml.s, ggml_version(), commit);
        ok = true;
    } else
        snprintf(why, why_size, "the host (ggml %.100s) refuses this program's ggml %s (llama.cpp %s): %.300s",
                 m->host_ggml.s, ggml_version(), commit, m->reason.s[0] ? m->reason.s : "(no reason given)");
    free(m);
    return ok;
}

bool apir_ggml_host_agrees(struct apir_remote *r, char *why, size_t why_size)
{
    return host_agrees(r, false, why, why_size);
}

bool apir_ggml_host_agrees_locked(struct apir_remote *r, char *why, size_t why_size)
{
    return host_agrees(r, true, why, why_size);
}
