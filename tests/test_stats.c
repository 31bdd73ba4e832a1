/*
 * What a running host does (issue 18, item 5): apir stat/ps against a real
 * apir-host, checked against what test guests did.
 *
 *   test_stats APIR_HOST APIR PROCESS|THREAD
 *
 * A guest (this process) allocates buffers of known sizes, shares a blob,
 * computes plain and keyed graphs, recomputes, and has one command refused;
 * a second guest stays idle.  Then:
 *   - `apir stat --json` is parsed (a small JSON parser below) and each
 *     guest's numbers must be exactly what it did: peer pid/uid/gid and
 *     process name, buffers and bytes, blobs, graphs, recomputes, commands
 *     (counted as a difference over a known sequence), refused commands,
 *     quota use against the host's --max-* options; host-wide totals and
 *     the per-device split agree with the guests;
 *   - the metrics file (--metrics-file) is parsed: every sample has its
 *     HELP and TYPE, names and labels are well formed, and the values agree
 *     with the JSON;
 *   - `apir stat` and `apir ps` print the guests; a guest that leaves keeps
 *     its counters in the totals (which never go down);
 *   - the control socket is mode 0600 and the daemon's; a guest connection
 *     asking its socket for the stats gets a refused hello, nothing else;
 *     as root: another uid cannot connect, and is refused by the daemon even
 *     when the file's mode is opened by hand, as is a process in another
 *     mount namespace (a container given the folder);
 *   - --control-group, --control none, `apir stat`'s exit statuses, and the
 *     control socket and metrics file gone when the host stops.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "calls.h"
#include "ggml.h"
#include "remote.h"
#include "shm_proto.h"
#include "test_host.h"
#include "test_util.h"
#include "transport.h"
#include "wait.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *host_bin, *apir_bin, *isolation;
static char dir[64], sock[80], ctl[96], prom[96], endpoint[96];
static pid_t host_pid;

/* ---- a small JSON parser (the document's syntax is checked too) ---------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype t;
    double num;
    unsigned long long u;   /* a non-negative integer number */
    bool is_uint;
    char *str;
    size_t n;
    char **keys;            /* J_OBJ */
    struct jval *items;     /* J_ARR, J_OBJ */
};

struct jparser {
    const char *p;
    bool bad;
};

static void jfree(struct jval *v)
{
    for (size_t i = 0; i < v->n; i++) {
        if (v->keys)
            free(v->keys[i]);
        jfree(&v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v->str);
}

static void jws(struct jparser *j)
{
    while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')
        j->p++;
}

static char *jstring(struct jparser *j)
{
    if (*j->p != '"') {
        j->bad = true;
        return NULL;
    }
    j->p++;
    size_t cap = 16, len = 0;
    char *s = malloc(cap);
    while (s && *j->p && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) {
            j->bad = true;
            break;
        }
        if (c == '\\') {
            c = *j->p++;
            if (c == 'u') {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    if (!isxdigit((unsigned char)*j->p)) {
                        j->bad = true;
                        break;
                    }
                    char h = *j->p++;
                    v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : tolower((unsigned char)h) - 'a' + 10);
                }
                c = v < 0x80 ? (char)v : '?';
            } else if (c == 'n') {
                c = '\n';
            } else if (c == 't') {
                c = '\t';
            } else if (c != '"' && c != '\\' && c != '/') {
                j->bad = true;
                break;
            }
        }
        if (len + 2 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
        }
        s[len++] = c;
    }
    if (!s || *j->p != '"') {
        j->bad = true;
        free(s);
        return NULL;
    }
    j->p++;
    s[len] = '\0';
    return s;
}

static void jvalue(struct jparser *j, struct jval *v, int depth)
{
    memset(v, 0, sizeof(*v));
    jws(j);
    if (depth > 32) {
        j->bad = true;
        return;
    }
    if (*j->p == '{' || *j->p == '[') {
        const bool obj = *j->p == '{';
        const char close = obj ? '}' : ']';
        v->t = obj ? J_OBJ : J_ARR;
        j->p++;
        jws(j);
        if (*j->p == close) {
            j->p++;
            return;
        }
        for (;;) {
            struct jval *items = realloc(v->items, (v->n + 1) * sizeof(*items));
            char **keys = obj ? realloc(v->keys, (v->n + 1) * sizeof(*keys)) : NULL;
            if (!items || (obj && !keys)) {
                free(items ? items : NULL);
                j->bad = true;
                return;
            }
            v->items = items;
            if (obj)
                v->keys = keys;
            char *key = NULL;
            if (obj) {
                jws(j);
                key = jstring(j);
                jws(j);
                if (!key || *j->p != ':') {
                    free(key);
                    j->bad = true;
                    return;
                }
                j->p++;
                v->keys[v->n] = key;
            }
            jvalue(j, &v->items[v->n], depth + 1);
            v->n++;
            if (j->bad)
                return;
            jws(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p == close) {
                j->p++;
                return;
            }
            j->bad = true;
            return;
        }
    }
    if (*j->p == '"') {
        v->t = J_STR;
        v->str = jstring(j);
        return;
    }
    if (!strncmp(j->p, "null", 4)) {
        v->t = J_NULL;
        j->p += 4;
        return;
    }
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "false", 5)) {
        v->t = J_BOOL;
        v->num = j->p[0] == 't';
        j->p += j->p[0] == 't' ? 4 : 5;
        return;
    }
    if (*j->p == '-' || isdigit((unsigned char)*j->p)) {
        char *end;
        v->t = J_NUM;
        v->num = strtod(j->p, &end);
        const char *q = j->p;
        while (isdigit((unsigned char)*q))
            q++;
        if (q == end && *j->p != '-') {
            v->is_uint = true;
            v->u = strtoull(j->p, NULL, 10);
        }
        j->p = end;
        return;
    }
    j->bad = true;
}

/* NULL (and a message) when text is not one JSON value. */
static struct jval *jparse(const char *text)
{
    struct jparser j = { .p = text };
    struct jval *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    jvalue(&j, v, 0);
    jws(&j);
    if (j.bad || *j.p) {
        fprintf(stderr, "not JSON, near: %.60s\n", j.p);
        jfree(v);
        free(v);
        return NULL;
    }
    return v;
}

static void jdrop(struct jval *v)
{
    if (v) {
        jfree(v);
        free(v);
    }
}

/* v["a"]["b"]... by a dotted path; NULL if absent. */
static const struct jval *jget(const struct jval *v, const char *path)
{
    char key[64];
    while (v && *path) {
        size_t k = strcspn(path, ".");
        snprintf(key, sizeof(key), "%.*s", (int)k, path);
        path += k + (path[k] == '.');
        const struct jval *next = NULL;
        for (size_t i = 0; v->t == J_OBJ && i < v->n && !next; i++)
            if (!strcmp(v->keys[i], key))
                next = &v->items[i];
        v = next;
    }
    return v;
}

/* An unsigned number at path, or ~0 (and a failed check) when absent. */
#define JU(v, path) ju(v, path, __LINE__)
static unsigned long long ju(const struct jval *v, const char *path, int line)
{
    const struct jval *x = jget(v, path);
    if (!x || x->t != J_NUM || !x->is_uint) {
        test_failed++;
        fprintf(stderr, "%s:%d: no unsigned number at %s\n", __FILE__, line, path);
        return ~0ull;
    }
    return x->u;
}

static const char *js(const struct jval *v, const char *path)
{
    const struct jval *x = jget(v, path);
    return x && x->t == J_STR ? x->str : "";
}

/* The guest with this id in the document's "guests", or NULL. */
static const struct jval *guest_of(const struct jval *doc, unsigned long long id)
{
    const struct jval *gs = jget(doc, "guests");
    for (size_t i = 0; gs && gs->t == J_ARR && i < gs->n; i++) {
        const struct jval *g = jget(&gs->items[i], "id");
        if (g && g->is_uint && g->u == id)
            return &gs->items[i];
    }
    return NULL;
}

/* ---- running things ---------------------------------------------------------- */

/* Runs argv, returns its exit status; *out gets its stdout (malloc'ed). */
static int run(char **out, const char *const *argv)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while (buf && (n = read(p[0], buf + len, cap - 1 - len)) > 0) {
        len += (size_t)n;
        if (len + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    close(p[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (buf)
        buf[len] = '\0';
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

#define RUN(out, ...) run(out, (const char *const[]){ __VA_ARGS__, NULL })

/* `apir stat --json ENDPOINT`, parsed. */
static struct jval *stat_json(void)
{
    char *out = NULL;
    int rc = RUN(&out, apir_bin, "stat", "--json", endpoint);
    struct jval *v = rc == 0 && out ? jparse(out) : NULL;
    if (!v)
        fprintf(stderr, "apir stat --json: status %d, output: %.200s\n", rc, out ? out : "");
    free(out);
    return v;
}

/* Guest id's number at path once two looks 100 ms apart agree (a command
 * just answered may not be counted yet). */
static unsigned long long settled(unsigned long long id, const char *path)
{
    unsigned long long last = ~0ull;
    for (int i = 0; i < 50; i++) {
        struct jval *v = stat_json();
        const struct jval *g = v ? guest_of(v, id) : NULL;
        const struct jval *x = g ? jget(g, path) : NULL;
        unsigned long long now = x && x->is_uint ? x->u : ~0ull - 1;
        jdrop(v);
        if (now == last)
            return now;
        last = now;
        usleep(100000);
    }
    return last;
}

/* Polls apir stat until guest id's number at path is want (the worker
 * publishes after it has answered: a moment later). */
static struct jval *stat_until(unsigned long long id, const char *path, unsigned long long want)
{
    struct jval *v = NULL;
    for (int i = 0; i < 100; i++) {
        jdrop(v);
        v = stat_json();
        const struct jval *g = v ? guest_of(v, id) : NULL;
        const struct jval *x = g ? jget(g, path) : NULL;
        if (x && x->is_uint && x->u == want)
            return v;
        usleep(50000);
    }
    return v;
}

static void start_host(const char *extra1, const char *extra2)
{
    unlink(sock);
    const char *argv[] = { host_bin, "--listen", endpoint, "--threads", "1", "--log-level", "error", "--isolation",
                           isolation, "--metrics-file", prom, "--metrics-interval", "1", "--max-buffers", "100",
                           "--max-alloc-mib", "64", "--max-blobs", "50", "--max-blob-mib", "512", "--max-clients", "8",
                           extra1, extra2, NULL, NULL };
    /* Thread mode starts only with this; in the first empty slot. */
    if (!strcmp(isolation, "thread"))
        argv[sizeof(argv) / sizeof(argv[0]) - (extra1 ? 2 : 4)] = "--insecure-shared-process";
    host_pid = host_spawn(argv, NULL);
    /* The daemon binds the guest socket first and its control socket after:
     * with the default control path, wait for both. */
    CHECK(wait_for_path(sock, 5000));
    if (!extra1)
        wait_for_path(ctl, 5000);
}

static void stop_host(void)
{
    const int rc = host_reap(host_pid, SIGTERM);
    CHECK_MSG(rc == 0, "host exit status %d", rc);
}

static bool open_remote(struct apir_remote *r)
{
    return guest_open(r, endpoint, NULL, 0);
}

/* ---- the metrics file -------------------------------------------------------- */

struct sample {
    char name[96], labels[256];
    double value;
};

/* Parses the exposition text: false (with a message) on a malformed line
 * or a sample without its HELP and TYPE. */
static bool parse_metrics(const char *text, struct sample *out, size_t max, size_t *n_out)
{
    size_t n = 0;
    char typed[256][96];
    size_t n_typed = 0;
    bool ok = true;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof(buf), "%.*s", (int)(len < sizeof(buf) - 1 ? len : sizeof(buf) - 1), line);
        line += len + (end != NULL);
        if (!buf[0])
            continue;
        char name[96];
        if (!strncmp(buf, "# TYPE ", 7)) {
            char type[32];
            if (sscanf(buf + 7, "%95s %31s", name, type) != 2 ||
                (strcmp(type, "gauge") && strcmp(type, "counter") && strcmp(type, "histogram"))) {
                fprintf(stderr, "metrics: bad TYPE line: %s\n", buf);
                ok = false;
            } else if (n_typed < 256) {
                snprintf(typed[n_typed++], sizeof(typed[0]), "%s", name);
            }
            continue;
        }
        if (buf[0] == '#') {
            if (strncmp(buf, "# HELP ", 7) != 0) {
                fprintf(stderr, "metrics: bad comment: %s\n", buf);
                ok = false;
            }
            continue;
        }
        /* name{labels} value */
        size_t k = 0;
        while (isalnum((unsigned char)buf[k]) || buf[k] == '_' || buf[k] == ':')
            k++;
        if (k == 0 || k >= sizeof(name) || isdigit((unsigned char)buf[0])) {
            fprintf(stderr, "metrics: bad name: %s\n", buf);
            ok = false;
            continue;
        }
        memcpy(name, buf, k);
        name[k] = '\0';
        const char *p = buf + k;
        char labels[256] = "";
        if (*p == '{') {
            /* label="value" pairs, values with \\ \" \n escapes */
            const char *q = p + 1;
            bool good = true;
            while (good && *q != '}') {
                const char *l = q;
                while (isalnum((unsigned char)*q) || *q == '_')
                    q++;
                good = q > l && q[0] == '=' && q[1] == '"';
                q += 2;
                while (good && *q && *q != '"')
                    q += *q == '\\' ? 2 : 1;
                good = good && *q == '"';
                q++;
                if (good && *q == ',')
                    q++;
            }
            if (!good) {
                fprintf(stderr, "metrics: bad labels: %s\n", buf);
                ok = false;
                continue;
            }
            snprintf(labels, sizeof(labels), "%.*s", (int)(q - p - 1), p + 1);
            p = q + 1;
        }
        char *vend;
        if (*p != ' ') {
            fprintf(stderr, "metrics: no value: %s\n", buf);
            ok = false;
            continue;
        }
        double value = strtod(p + 1, &vend);
        if (vend == p + 1 || *vend) {
            fprintf(stderr, "metrics: bad value: %s\n", buf);
            ok = false;
            continue;
        }
        bool has_type = false;
        for (size_t t = 0; t < n_typed && !has_type; t++) {
            /* a histogram's samples: NAME_bucket, NAME_sum, NAME_count */
            const size_t tl = strlen(typed[t]);
            has_type = !strcmp(typed[t], name) ||
                       (!strncmp(typed[t], name, tl) && (!strcmp(name + tl, "_bucket") || !strcmp(name + tl, "_sum") ||
                                                         !strcmp(name + tl, "_count")));
        }
        if (!has_type) {
            fprintf(stderr, "metrics: %s has no TYPE line before it\n", name);
            ok = false;
        }
        if (n < max) {
            snprintf(out[n].name, sizeof(out[n].name), "%s", name);
            snprintf(out[n].labels, sizeof(out[n].labels), "%s", labels);
            out[n].value = value;
            n++;
        }
    }
    *n_out = n;
    return ok;
}

/* The value of name whose labels contain label (NULL: any); -1 if none. */
static double metric(const struct sample *s, size_t n, const char *name, const char *label)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s[i].name, name) && (!label || strstr(s[i].labels, label)))
            return s[i].value;
    return -1.0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf && fread(buf, 1, (1 << 20) - 1, f) == 0) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* ---- the test ---------------------------------------------------------------- */

enum { N_BUFFERS = 3, N_PLAIN_GRAPHS = 4, N_RECOMPUTES = 2 };
static const uint64_t buffer_size[N_BUFFERS] = { 1u << 20, 2u << 20, 3u << 20 };

static struct apir_remote a, b;
static unsigned long long id_a, id_b;
static uint64_t bufs[N_BUFFERS];
static uint32_t blob_res;
static void *blob_ptr;

/* This process's guests, found in the document by their connection order. */
static void find_guests(const struct jval *doc)
{
    const struct jval *gs = jget(doc, "guests");
    id_a = id_b = 0;
    for (size_t i = 0; gs && gs->t == J_ARR && i < gs->n; i++) {
        unsigned long long id = JU(&gs->items[i], "id");
        if (!id_a || id < id_a) {
            id_b = id_a;
            id_a = id;
        } else {
            id_b = id;
        }
    }
}

static void test_control_socket_mode(void)
{
    struct stat st;
    CHECK(lstat(ctl, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK_MSG((st.st_mode & 07777) == 0600, "control socket mode %04o", (unsigned)(st.st_mode & 07777));
    CHECK(st.st_uid == geteuid());
}

static void test_guests_and_numbers(void)
{
    CHECK(open_remote(&a));
    CHECK(open_remote(&b));
    struct jval *doc = stat_json();
    CHECK(doc != NULL);
    if (!doc)
        return;
    find_guests(doc);
    CHECK(id_a && id_b && id_a != id_b);
    CHECK(JU(doc, "totals.guests") == 2);
    CHECK(JU(doc, "format") == 1);
    CHECK(!strcmp(js(doc, "isolation"), isolation));
    CHECK(!strcmp(js(doc, "socket"), sock));
    CHECK(JU(doc, "limits.max_buffers") == 100 && JU(doc, "limits.max_alloc_bytes") == 64ull << 20 &&
          JU(doc, "limits.max_blobs") == 50 && JU(doc, "limits.max_blob_bytes") == 512ull << 20);
    const struct jval *g = guest_of(doc, id_a);
    CHECK(g != NULL);
    unsigned long long commands0 = settled(id_a, "commands"), blobs0 = g ? JU(g, "blobs") : 0,
                       blob_bytes0 = g ? JU(g, "blob_bytes") : 0;
    if (g) {
        /* Who it is: the kernel's word (SO_PEERCRED), and /proc's name. */
        CHECK(JU(g, "pid") == (unsigned long long)getpid());
        CHECK(JU(g, "uid") == getuid() && JU(g, "gid") == getgid());
        CHECK(JU(g, "says_pid") == (unsigned long long)getpid());
        CHECK_MSG(!strcmp(js(g, "comm"), "test_stats"), "comm %s", js(g, "comm"));
        CHECK(!strcmp(js(g, "state"), "serving"));
        CHECK(JU(g, "buffers") == 0 && JU(g, "graphs") == 0 && JU(g, "device") == 0);
        CHECK(JU(g, "protocol_minor") == APIR_VERSION_MINOR);
        const struct jval *w = jget(g, "worker_pid");
        CHECK(!strcmp(isolation, "process") ? w && w->t == J_NUM && w->u > 0 : w && w->t == J_NULL);
    }
    jdrop(doc);

    /* What guest a does, command by command (each a FORWARD the host counts). */
    unsigned long long sent = 0;
    uint64_t buft = 0;
    CHECK(apir_call_DEVICE_GET_BUFFER_TYPE(&a, &buft) == APIR_HANDLER_OK);
    sent++;
    for (int i = 0; i < N_BUFFERS; i++) {
        CHECK(apir_call_BUFFER_TYPE_ALLOC_BUFFER(&a, buft, buffer_size[i], &bufs[i]) == APIR_HANDLER_OK && bufs[i]);
        sent++;
    }
    CHECK(apir_call_BUFFER_CLEAR(&a, bufs[0], 0u) == APIR_HANDLER_OK);
    sent++;
    uint32_t status = 0;
    for (int i = 0; i < N_PLAIN_GRAPHS; i++) {
        size_t size = add_graph(a.data, a.data_size, bufs[0]);
        CHECK(apir_call_BACKEND_GRAPH_COMPUTE(&a, a.data_res_id, size, &status) == APIR_HANDLER_OK &&
              status == GGML_STATUS_SUCCESS);
        sent++;
    }
    size_t size = add_graph(a.data, a.data_size, bufs[0]);
    CHECK(apir_call_BACKEND_GRAPH_COMPUTE_KEYED(&a, a.data_res_id, 0, size, 0x4242, &status) == APIR_HANDLER_OK &&
          status == GGML_STATUS_SUCCESS);
    sent++;
    for (int i = 0; i < N_RECOMPUTES; i++) {
        CHECK(apir_call_BACKEND_GRAPH_RECOMPUTE(&a, 0x4242, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
        sent++;
    }
    /* one refused: a handle that is not a buffer */
    CHECK(apir_call_BUFFER_CLEAR(&a, 0x1234567, 0u) == APIR_HANDLER_BAD_HANDLE);
    sent++;
    /* a shared-memory blob of 1 MiB (a transport command, not a FORWARD) */
    CHECK(a.t->ops->blob_create(a.t, 1u << 20, &blob_res, &blob_ptr) == 0);
    int32_t n_dev = 0;
    CHECK(apir_call_DEVICE_GET_COUNT(&a, &n_dev) == APIR_HANDLER_OK);  /* after the blob: published */
    sent++;

    doc = stat_until(id_a, "commands", commands0 + sent);
    g = doc ? guest_of(doc, id_a) : NULL;
    CHECK(g != NULL);
    if (g) {
        const uint64_t bytes = buffer_size[0] + buffer_size[1] + buffer_size[2];
        CHECK_MSG(JU(g, "commands") == commands0 + sent, "commands %llu, expected %llu + %llu", JU(g, "commands"),
                  commands0, sent);
        CHECK(JU(g, "buffers") == N_BUFFERS);
        CHECK_MSG(JU(g, "bytes") == bytes, "bytes %llu", JU(g, "bytes"));
        CHECK(JU(g, "graphs") == N_PLAIN_GRAPHS + 1 + N_RECOMPUTES);
        CHECK(JU(g, "recomputes") == N_RECOMPUTES);
        CHECK(JU(g, "refused") == 1);
        CHECK(JU(g, "blobs") == blobs0 + 1 && JU(g, "blob_bytes") == blob_bytes0 + (1u << 20));
        CHECK(JU(g, "quota.buffers.used") == N_BUFFERS && JU(g, "quota.buffers.max") == 100);
        CHECK(JU(g, "quota.bytes.used") == bytes && JU(g, "quota.bytes.max") == 64ull << 20);
        CHECK(JU(g, "quota.blobs.used") == blobs0 + 1 && JU(g, "quota.blobs.max") == 50);
        CHECK(JU(g, "quota.blob_bytes.max") == 512ull << 20);
        /* the idle guest is its own */
        const struct jval *gb = guest_of(doc, id_b);
        CHECK(gb && JU(gb, "buffers") == 0 && JU(gb, "graphs") == 0 && JU(gb, "refused") == 0);
        /* host-wide: the sums; the device: all of it (one device) */
        CHECK(JU(doc, "totals.buffers") == N_BUFFERS && JU(doc, "totals.bytes") == bytes);
        CHECK(JU(doc, "totals.graphs") == N_PLAIN_GRAPHS + 1 + N_RECOMPUTES);
        CHECK(JU(doc, "totals.recomputes") == N_RECOMPUTES && JU(doc, "totals.refused") == 1);
        CHECK(gb && JU(doc, "totals.commands") == JU(g, "commands") + JU(gb, "commands"));
        const struct jval *devs = jget(doc, "devices");
        CHECK(devs && devs->t == J_ARR && devs->n == 1);
        if (devs && devs->n == 1) {
            CHECK(JU(&devs->items[0], "guests") == 2 && JU(&devs->items[0], "buffers") == N_BUFFERS);
            CHECK(JU(&devs->items[0], "bytes") == bytes);
            CHECK(JU(&devs->items[0], "graphs") == N_PLAIN_GRAPHS + 1 + N_RECOMPUTES);
            CHECK(!strcmp(js(&devs->items[0], "name"), "CPU"));
        }
    }
    jdrop(doc);
}

static void test_metrics_file(void)
{
    /* The guests are idle: the JSON now, then a metrics file (rewritten
     * every second) written since their last command. */
    struct jval *doc = stat_json();
    const struct jval *g = doc ? guest_of(doc, id_a) : NULL;
    CHECK(g != NULL);
    if (!g) {
        jdrop(doc);
        return;
    }
    static struct sample s[512];
    size_t n = 0;
    bool parsed = false;
    char want[64];
    snprintf(want, sizeof(want), "guest=\"%llu\"", id_a);
    for (int i = 0; i < 60; i++) {
        char *text = read_file(prom);
        parsed = text && parse_metrics(text, s, 512, &n);
        free(text);
        if (parsed && metric(s, n, "apir_guest_commands_total", want) == (double)JU(g, "commands"))
            break;
        usleep(100000);
    }
    CHECK(parsed);
    struct stat st;
    CHECK(stat(prom, &st) == 0 && (st.st_mode & 0777) == 0644);
    CHECK(metric(s, n, "apir_guests", NULL) == (double)JU(doc, "totals.guests"));
    CHECK(metric(s, n, "apir_devices", NULL) == 1);
    CHECK(metric(s, n, "apir_guest_buffers", want) == (double)JU(g, "buffers"));
    CHECK(metric(s, n, "apir_guest_buffer_bytes", want) == (double)JU(g, "bytes"));
    CHECK(metric(s, n, "apir_guest_blobs", want) == (double)JU(g, "blobs"));
    CHECK(metric(s, n, "apir_guest_blob_bytes", want) == (double)JU(g, "blob_bytes"));
    CHECK(metric(s, n, "apir_guest_graphs_total", want) == (double)JU(g, "graphs"));
    CHECK(metric(s, n, "apir_guest_recomputes_total", want) == (double)JU(g, "recomputes"));
    CHECK(metric(s, n, "apir_guest_commands_total", want) == (double)JU(g, "commands"));
    CHECK(metric(s, n, "apir_guest_refused_total", want) == (double)JU(g, "refused"));
    CHECK(metric(s, n, "apir_buffers", NULL) == (double)JU(doc, "totals.buffers"));
    CHECK(metric(s, n, "apir_graphs_total", NULL) == (double)JU(doc, "totals.graphs"));
    CHECK(metric(s, n, "apir_device_buffer_bytes", "device=\"0\"") == (double)JU(doc, "totals.bytes"));
    CHECK(metric(s, n, "apir_limit_buffers", NULL) == 100);
    CHECK(metric(s, n, "apir_limit_buffer_bytes", NULL) == (double)(64ull << 20));
    CHECK(metric(s, n, "apir_host_uptime_seconds", NULL) > 0);
    char info[160];
    snprintf(info, sizeof(info), "pid=\"%d\",uid=\"%u\",gid=\"%u\",comm=\"test_stats\"", (int)getpid(),
             (unsigned)getuid(), (unsigned)getgid());
    CHECK_MSG(metric(s, n, "apir_guest_info", info) == 1, "no apir_guest_info with %s", info);
    char host_info[80];
    snprintf(host_info, sizeof(host_info), "isolation=\"%s\"", isolation);
    CHECK(metric(s, n, "apir_host_info", host_info) == 1);
    jdrop(doc);
}

static void test_text_and_ps(void)
{
    char *out = NULL, id[40];
    CHECK(RUN(&out, apir_bin, "stat", endpoint) == 0 && out);
    snprintf(id, sizeof(id), "guest#%llu: pid %d", id_a, (int)getpid());
    CHECK_MSG(out && strstr(out, id) && strstr(out, "buffers 3 of 100") && strstr(out, "graphs 7 (2 recomputed)"),
              "apir stat:\n%s", out ? out : "");
    free(out);
    out = NULL;
    CHECK(RUN(&out, apir_bin, "ps", endpoint) == 0 && out);
    snprintf(id, sizeof(id), "\n%llu ", id_a);
    CHECK_MSG(out && !strncmp(out, "GUEST", 5) && strstr(out, id) && strstr(out, "test_stats"), "apir ps:\n%s",
              out ? out : "");
    free(out);
    /* the control socket named directly */
    char ctl_ep[160];
    snprintf(ctl_ep, sizeof(ctl_ep), "unix:%s", ctl);
    CHECK(RUN(NULL, apir_bin, "ps", ctl_ep) == 0);
    CHECK(RUN(NULL, apir_bin, "stat", "--control", ctl_ep, "--prometheus") == 0);
    /* exit statuses */
    CHECK(RUN(NULL, apir_bin, "stat", "unix:/nonexistent/h.sock") == 1);
    CHECK(RUN(NULL, apir_bin, "stat", "--bogus") == 2);
    CHECK(RUN(NULL, apir_bin, "stat", "tcp:1.2.3.4:5") == 2);
    CHECK(RUN(NULL, apir_bin, "ps", endpoint, endpoint) == 2);
    CHECK(RUN(NULL, apir_bin, "stat", "--help") == 0);
    CHECK(RUN(NULL, apir_bin, "ps", "--help") == 0);
}

/* The guests' socket answers the shm hello and nothing else: asked for the
 * stats, it refuses the hello. */
static void test_guest_socket_tells_nothing(void)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    const char *asks[] = { "json\n", "text\n", "metrics\n" };
    CHECK(send(fd, asks[0], strlen(asks[0]), MSG_NOSIGNAL) > 0);
    struct apir_shm_hello_reply r;
    memset(&r, 0, sizeof(r));
    struct timeval tv = { .tv_sec = 10 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n = recv(fd, &r, sizeof(r), 0);
    CHECK_MSG(n == (ssize_t)sizeof(r) && r.magic == APIR_SHM_MAGIC && r.status != 0, "recv %zd, status %d", n,
              (int)r.status);
    r.message[sizeof(r.message) - 1] = '\0';
    CHECK(!strstr(r.message, "{") && !strstr(r.message, "guest"));
    char more[256];
    CHECK(recv(fd, more, sizeof(more), 0) <= 0);  /* then nothing but the hang-up */
    close(fd);
    /* and the control socket is not a guest socket either */
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", ctl);
    CHECK(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0);
    close(fd);
}

/* In a child: connect to the control socket, ask, and exit with 0 (refused
 * to connect: EACCES), 1 (the daemon said "error: not allowed"), 2 (a
 * document came: the failure), 3 (something else). */
static int probe_control(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", ctl);
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
        return errno == EACCES ? 0 : 3;
    /* A refused peer is answered at once and hung up on: its request may
     * meet a closed socket (EPIPE), the answer is there to read anyway. */
    ssize_t w = write(fd, "json\n", 5);
    (void)w;
    char buf[64] = "";
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n > 0 && !strncmp(buf, "error: not allowed", 18))
        return 1;
    return n > 0 && buf[0] == '{' ? 2 : 3;
}

static int in_child(int (*prepare)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        if (prepare() != 0)
            _exit(4);
        _exit(probe_control());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int become_nobody(void)
{
    return setgroups(0, NULL) == 0 && setgid(65534) == 0 && setuid(65534) == 0 ? 0 : -1;
}

static int enter_mount_namespace(void)
{
    return unshare(CLONE_NEWNS) == 0 ? 0 : -1;
}

static void test_who_may_see(void)
{
    if (geteuid() != 0) {
        printf("  (not root: other uids and namespaces not tried)\n");
        return;
    }
    /* another uid: the file's mode keeps it out (the folder opened for it) */
    CHECK(chmod(dir, 0711) == 0);
    CHECK_MSG(in_child(become_nobody) == 0, "another uid reached the control socket");
    /* ... and with the mode opened by hand, the daemon refuses it */
    CHECK(chmod(ctl, 0666) == 0);
    CHECK_MSG(in_child(become_nobody) == 1, "another uid was not refused by the daemon");
    CHECK(chmod(ctl, 0600) == 0);
    CHECK(chmod(dir, 0700) == 0);
    /* root in another mount namespace (a container given the folder) */
    int rc = in_child(enter_mount_namespace);
    if (rc == 4)
        printf("  (no mount namespace here: that case not tried)\n");
    else
        CHECK_MSG(rc == 1, "a process in another mount namespace got %d", rc);
}

/* Guests that leave: the totals keep their counters. */
static void test_departed_guests(void)
{
    struct jval *before = stat_json();
    unsigned long long commands = before ? JU(before, "totals.commands") : 0;
    unsigned long long graphs = before ? JU(before, "totals.graphs") : 0;
    jdrop(before);
    for (int i = 0; i < N_BUFFERS; i++)
        CHECK(apir_call_BUFFER_FREE_BUFFER(&a, bufs[i]) == APIR_HANDLER_OK);
    a.t->ops->blob_destroy(a.t, blob_res, blob_ptr, 1u << 20);
    apir_remote_close(&a);
    apir_remote_close(&b);
    struct jval *doc = NULL;
    for (int i = 0; i < 100; i++) {
        jdrop(doc);
        doc = stat_json();
        if (doc && JU(doc, "totals.guests") == 0)
            break;
        usleep(50000);
    }
    CHECK(doc && JU(doc, "totals.guests") == 0);
    if (doc) {
        CHECK_MSG(JU(doc, "totals.commands") >= commands + N_BUFFERS, "commands %llu after %llu",
                  JU(doc, "totals.commands"), commands);
        CHECK(JU(doc, "totals.graphs") == graphs);
        CHECK(JU(doc, "totals.buffers") == 0 && JU(doc, "totals.bytes") == 0 && JU(doc, "totals.blobs") == 0);
        CHECK(JU(doc, "totals.accepted") >= 2);
        const struct jval *devs = jget(doc, "devices");
        CHECK(devs && devs->n == 1 && JU(&devs->items[0], "graphs") == graphs && JU(&devs->items[0], "guests") == 0);
    }
    jdrop(doc);
}

static void test_stop_removes(void)
{
    stop_host();
    CHECK(access(ctl, F_OK) != 0);
    CHECK(access(prom, F_OK) != 0);
    CHECK(access(sock, F_OK) != 0);
}

/* --control-group: mode 0660 in that group; --control none: no socket. */
static void test_control_options(void)
{
    char ctl2[160], group[32];
    snprintf(ctl2, sizeof(ctl2), "--control=unix:%s/other.ctl", dir);
    snprintf(group, sizeof(group), "--control-group=%u", (unsigned)getgid());
    start_host(ctl2, group);
    char path[140];
    snprintf(path, sizeof(path), "%s/other.ctl", dir);
    struct stat st;
    wait_for_path(path, 1000);
    CHECK(lstat(path, &st) == 0 && (st.st_mode & 07777) == 0660 && st.st_gid == getgid());
    CHECK(access(ctl, F_OK) != 0);  /* not also beside the socket */
    char ep[160];
    snprintf(ep, sizeof(ep), "unix:%s", path);
    CHECK(RUN(NULL, apir_bin, "stat", "-C", ep) == 0);
    CHECK(RUN(NULL, apir_bin, "stat", endpoint) == 1);  /* nothing at PATH.ctl */
    stop_host();
    CHECK(access(path, F_OK) != 0);
    start_host("--control", "none");
    usleep(200000);
    CHECK(access(ctl, F_OK) != 0);
    stop_host();
    /* a metrics file in a folder that is not there: the host does not start */
    char bad[160];
    snprintf(bad, sizeof(bad), "--metrics-file=%s/no/such/folder/m.prom", dir);
    CHECK(RUN(NULL, host_bin, "--listen", endpoint, "--log-level", "error", bad) == 1);
    CHECK(RUN(NULL, host_bin, "--listen", endpoint, "--metrics-interval", "0") == 2);
    CHECK(RUN(NULL, host_bin, "--listen", endpoint, "--control", "tcp:1.2.3.4:5") == 2);
}

static void run_start(void)
{
    start_host(NULL, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s APIR_HOST APIR process|thread\n", argv[0]);
        return 2;
    }
    host_bin = argv[1];
    apir_bin = argv[2];
    isolation = argv[3];
    signal(SIGPIPE, SIG_IGN);
    unsetenv("APIR_HOST");
    snprintf(dir, sizeof(dir), "/tmp/apir-stats-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(sock, sizeof(sock), "%s/h.sock", dir);
    snprintf(ctl, sizeof(ctl), "%s.ctl", sock);
    snprintf(prom, sizeof(prom), "%s/apir.prom", dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock);
    static const struct test_case cases[] = {
        TEST(run_start),
        TEST(test_control_socket_mode),
        TEST(test_guests_and_numbers),
        TEST(test_metrics_file),
        TEST(test_text_and_ps),
        TEST(test_guest_socket_tells_nothing),
        TEST(test_who_may_see),
        TEST(test_departed_guests),
        TEST(test_stop_removes),
        TEST(test_control_options),
    };
    int rc = test_run("stats", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    rmdir(dir);
    return rc;
}
