/*
 * Stats pages and the documents made of them (host_stats.h says why and who
 * writes what).  The seqlock: the writer makes seq odd, stores the counters
 * (relaxed), makes seq even again (release); a reader takes seq (acquire),
 * loads the counters (relaxed), fences (acquire) and takes seq again - equal
 * and even, the copy is whole.  The writer never waits; a reader tries a
 * bounded number of times.
 */
#include "host_stats.h"

#include "apir_build.h"
#include "handles.h"
#include "session.h"

#include "wait.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define STATS_READ_TRIES 1000

/* From a short command (a supports_op query answers in tens of us) to a
 * graph past any sane budget. */
const uint64_t apir_latency_bounds_ns[APIR_LATENCY_BUCKETS] = {
    50000ull,     100000ull,    250000ull,    500000ull,     1000000ull,    2500000ull,    5000000ull,  10000000ull,
    25000000ull,  50000000ull,  100000000ull, 250000000ull,  500000000ull,  1000000000ull, 2500000000ull, 10000000000ull,
};

void apir_stats_page_init(struct apir_stats_page *p)
{
    /* p is zeroed memory (a fresh memfd page, calloc). */
    p->magic = APIR_STATS_PAGE_MAGIC;
    p->version = APIR_STATS_PAGE_VERSION;
    p->size = (uint32_t)sizeof(*p);
}

bool apir_stats_page_valid(const struct apir_stats_page *p)
{
    return p && p->magic == APIR_STATS_PAGE_MAGIC && p->version == APIR_STATS_PAGE_VERSION && p->size == sizeof(*p);
}

static void write_begin(struct apir_stats_page *p)
{
    uint32_t seq = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, seq | 1u, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static void write_end(struct apir_stats_page *p)
{
    uint32_t seq = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, (seq | 1u) + 1u, memory_order_release);
}

#define PUT(field, v) atomic_store_explicit(&p->field, (uint64_t)(v), memory_order_relaxed)
#define GET(field) atomic_load_explicit(&p->field, memory_order_relaxed)

/* One observation into a page's histogram (under the seqlock). */
static void observe(_Atomic uint64_t *h, uint64_t ns, uint64_t times)
{
    uint32_t i = 0;
    while (i < APIR_LATENCY_BUCKETS && ns > apir_latency_bounds_ns[i])
        i++;
    atomic_store_explicit(&h[0], atomic_load_explicit(&h[0], memory_order_relaxed) + times, memory_order_relaxed);
    atomic_store_explicit(&h[1], atomic_load_explicit(&h[1], memory_order_relaxed) + ns * times, memory_order_relaxed);
    if (i < APIR_LATENCY_BUCKETS)  /* over the last bound: +Inf, which is the count */
        atomic_store_explicit(&h[2 + i], atomic_load_explicit(&h[2 + i], memory_order_relaxed) + times,
                              memory_order_relaxed);
}

static void read_hist(_Atomic uint64_t *h, struct apir_latency_hist *out)
{
    out->count = atomic_load_explicit(&h[0], memory_order_relaxed);
    out->sum_ns = atomic_load_explicit(&h[1], memory_order_relaxed);
    for (uint32_t i = 0; i < APIR_LATENCY_BUCKETS; i++)
        out->bucket[i] = atomic_load_explicit(&h[2 + i], memory_order_relaxed);
}

static void add_hist(struct apir_latency_hist *to, const struct apir_latency_hist *h)
{
    to->count += h->count;
    to->sum_ns += h->sum_ns;
    for (uint32_t i = 0; i < APIR_LATENCY_BUCKETS; i++)
        to->bucket[i] += h->bucket[i];
}

void apir_stats_publish(struct apir_stats_page *p, const struct apir_session *s, enum apir_guest_state state,
                        uint64_t last_command_ns, int32_t says_pid)
{
    if (!p || !s)
        return;
    /* Only this side writes the page: its own last values say what changed. */
    const uint64_t graphs_before = GET(graphs), compute_ns_before = GET(compute_ns);
    const uint64_t ended_ns = last_command_ns ? apir_now_ns() : 0;
    const bool buffers_changed = GET(buffers) != s->n_buffers || GET(bytes) != s->bytes_allocated;
    uint64_t dev_buffers[APIR_HOST_MAX_DEVICES] = { 0 }, dev_bytes[APIR_HOST_MAX_DEVICES] = { 0 };
    if (buffers_changed) {
        /* Allocations and frees only: not once per token. */
        for (uint32_t i = 0; i < s->handles.capacity; i++) {
            const struct apir_handle_slot *slot = &s->handles.slots[i];
            if (slot->kind != APIR_HANDLE_BUFFER || !slot->object)
                continue;
            const struct apir_host_buffer *hb = slot->object;
            if (hb->device < APIR_HOST_MAX_DEVICES) {
                dev_buffers[hb->device]++;
                dev_bytes[hb->device] += hb->size;
            }
        }
    }
    write_begin(p);
    PUT(state, state);
    PUT(says_pid, (uint32_t)says_pid);
    PUT(minor, s->minor);
    PUT(device, s->device);
    if (last_command_ns)
        PUT(last_command_ns, last_command_ns);
    PUT(buffers, s->n_buffers);
    PUT(bytes, s->bytes_allocated);
    PUT(blobs, s->n_blobs);
    PUT(blob_bytes, s->blob_bytes);
    PUT(commands, s->stats.n_commands);
    PUT(refused, s->stats.n_refused);
    PUT(graphs, s->stats.n_graphs);
    PUT(recomputes, s->stats.n_recomputes);
    PUT(compute_ns, s->stats.compute_ns);
    /* Graphs run on the device current when they were sent; the command
     * just served cannot have switched it and computed. */
    if (s->stats.n_graphs != graphs_before && s->device < APIR_HOST_MAX_DEVICES)
        PUT(dev_graphs[s->device], GET(dev_graphs[s->device]) + (s->stats.n_graphs - graphs_before));
    if (ended_ns > last_command_ns)
        observe(p->command_latency, ended_ns - last_command_ns, 1);
    /* One command computes one graph; were there more, each counts their mean. */
    if (s->stats.n_graphs > graphs_before && s->stats.compute_ns >= compute_ns_before) {
        const uint64_t n = s->stats.n_graphs - graphs_before;
        observe(p->graph_latency, (s->stats.compute_ns - compute_ns_before) / n, n);
    }
    if (buffers_changed) {
        for (uint32_t d = 0; d < APIR_HOST_MAX_DEVICES; d++) {
            PUT(dev_buffers[d], dev_buffers[d]);
            PUT(dev_bytes[d], dev_bytes[d]);
        }
    }
    write_end(p);
}

bool apir_stats_read(const struct apir_stats_page *cp, struct apir_guest_counters *out)
{
    memset(out, 0, sizeof(*out));
    if (!apir_stats_page_valid(cp))
        return false;
    /* Atomic loads want a non-const object; nothing is written here. */
    struct apir_stats_page *p = (struct apir_stats_page *)cp;
    for (int attempt = 0; attempt < STATS_READ_TRIES; attempt++) {
        uint32_t seq = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (seq & 1u)
            continue;
#define APIR_X_READ(name) out->name = GET(name);
        APIR_GUEST_COUNTERS(APIR_X_READ)
#undef APIR_X_READ
        for (uint32_t d = 0; d < APIR_HOST_MAX_DEVICES; d++) {
            out->dev_buffers[d] = GET(dev_buffers[d]);
            out->dev_bytes[d] = GET(dev_bytes[d]);
            out->dev_graphs[d] = GET(dev_graphs[d]);
        }
        read_hist(p->command_latency, &out->command_latency);
        read_hist(p->graph_latency, &out->graph_latency);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) == seq)
            return true;
    }
    return false;
}

void apir_stats_retire(struct apir_guest_counters *retired, const struct apir_guest_counters *c)
{
    retired->commands += c->commands;
    retired->refused += c->refused;
    retired->graphs += c->graphs;
    retired->recomputes += c->recomputes;
    retired->compute_ns += c->compute_ns;
    for (uint32_t d = 0; d < APIR_HOST_MAX_DEVICES; d++)
        retired->dev_graphs[d] += c->dev_graphs[d];
    add_hist(&retired->command_latency, &c->command_latency);
    add_hist(&retired->graph_latency, &c->graph_latency);
}

/* ---- documents ------------------------------------------------------------- */

struct strbuf {
    char *s;
    size_t len, cap;
    bool failed;
};

__attribute__((format(printf, 2, 3))) static void put(struct strbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* A JSON string (quotes included). */
static void put_json_str(struct strbuf *b, const char *s)
{
    put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            put(b, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            put(b, "\\u%04x", *p);
        else
            put(b, "%c", *p);
    }
    put(b, "\"");
}

/* A Prometheus label value (quotes included). */
static void put_label(struct strbuf *b, const char *s)
{
    put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            put(b, "\\%c", *p);
        else if (*p == '\n')
            put(b, "\\n");
        else if (*p < 0x20 || *p == 0x7f)
            put(b, "?");
        else
            put(b, "%c", *p);
    }
    put(b, "\"");
}

static const char *state_name(uint64_t state)
{
    switch (state) {
    case APIR_GUEST_STARTING: return "starting";
    case APIR_GUEST_SERVING: return "serving";
    default: return "unknown";
    }
}

static const char *dev_type_name(ggml_backend_dev_t dev)
{
    switch (ggml_backend_dev_type(dev)) {
    case GGML_BACKEND_DEVICE_TYPE_CPU: return "CPU";
    case GGML_BACKEND_DEVICE_TYPE_GPU: return "GPU";
    case GGML_BACKEND_DEVICE_TYPE_IGPU: return "IGPU";
    case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "ACCEL";
    default: return "?";
    }
}

static double seconds(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* Seconds between a monotonic instant and now; 0 for one not yet come. */
static double since_s(const struct apir_host_view *v, uint64_t t)
{
    return t && t < v->now_ns ? seconds(v->now_ns - t) : 0.0;
}

static void fmt_duration(char *buf, size_t len, double s)
{
    const unsigned long long t = (unsigned long long)s;
    if (s < 60)
        snprintf(buf, len, "%.1fs", s);
    else if (t < 3600)
        snprintf(buf, len, "%llum%02llus", t / 60, t % 60);
    else if (t < 86400)
        snprintf(buf, len, "%lluh%02llum", t / 3600, t / 60 % 60);
    else
        snprintf(buf, len, "%llud%02lluh", t / 86400, t / 3600 % 24);
}

static void fmt_bytes(char *buf, size_t len, uint64_t n)
{
    if (n < 1024)
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    else if (n < (1ull << 20))
        snprintf(buf, len, "%.1f KiB", (double)n / 1024.0);
    else if (n < (1ull << 30))
        snprintf(buf, len, "%.1f MiB", (double)n / 1048576.0);
    else
        snprintf(buf, len, "%.1f GiB", (double)n / 1073741824.0);
}

/* A limit of this many bytes is no limit.  APIR_ALLOC_QUOTA_AUTO is the
 * default memory quota not sized in this process (a daemon of worker
 * processes never asks a GPU for its memory: host.h): shown as a share. */
static bool unlimited(uint64_t max)
{
    return max == UINT64_MAX;
}

/* Host-wide sums over the live guests (and, for counters, the departed). */
struct totals {
    uint64_t buffers, bytes, blobs, blob_bytes, commands, refused, graphs, recomputes, compute_ns;
    struct apir_latency_hist command_latency, graph_latency;
    uint64_t dev_guests[APIR_HOST_MAX_DEVICES], dev_buffers[APIR_HOST_MAX_DEVICES], dev_bytes[APIR_HOST_MAX_DEVICES],
        dev_graphs[APIR_HOST_MAX_DEVICES];
};

static void sum(const struct apir_host_view *v, struct totals *t)
{
    memset(t, 0, sizeof(*t));
    t->commands = v->retired.commands;
    t->refused = v->retired.refused;
    t->graphs = v->retired.graphs;
    t->recomputes = v->retired.recomputes;
    t->compute_ns = v->retired.compute_ns;
    t->command_latency = v->retired.command_latency;
    t->graph_latency = v->retired.graph_latency;
    for (uint32_t d = 0; d < APIR_HOST_MAX_DEVICES; d++)
        t->dev_graphs[d] = v->retired.dev_graphs[d];
    for (uint32_t i = 0; i < v->n_guests; i++) {
        const struct apir_guest_counters *c = &v->guests[i].c;
        t->buffers += c->buffers;
        t->bytes += c->bytes;
        t->blobs += c->blobs;
        t->blob_bytes += c->blob_bytes;
        t->commands += c->commands;
        t->refused += c->refused;
        t->graphs += c->graphs;
        t->recomputes += c->recomputes;
        t->compute_ns += c->compute_ns;
        add_hist(&t->command_latency, &c->command_latency);
        add_hist(&t->graph_latency, &c->graph_latency);
        if (c->state == APIR_GUEST_SERVING && c->device < v->host->n_devices)
            t->dev_guests[c->device]++;
        for (uint32_t d = 0; d < APIR_HOST_MAX_DEVICES; d++) {
            t->dev_buffers[d] += c->dev_buffers[d];
            t->dev_bytes[d] += c->dev_bytes[d];
            t->dev_graphs[d] += c->dev_graphs[d];
        }
    }
}

static void fmt_start(const struct apir_host_view *v, char *buf, size_t len)
{
    time_t t = (time_t)(v->start_unix_ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, len, "?");
}

/* ---- text: apir stat ---- */

static void put_quota(struct strbuf *b, const char *what, uint64_t used, uint64_t max, bool as_bytes)
{
    char u[32], m[32];
    if (as_bytes) {
        fmt_bytes(u, sizeof(u), used);
        fmt_bytes(m, sizeof(m), max);
    } else {
        snprintf(u, sizeof(u), "%llu", (unsigned long long)used);
        snprintf(m, sizeof(m), "%llu", (unsigned long long)max);
    }
    if (unlimited(max))
        put(b, "%s %s (no limit)", what, u);
    else if (max == APIR_ALLOC_QUOTA_AUTO)
        put(b, "%s %s of %u/%u of the device memory", what, u, APIR_ALLOC_QUOTA_SHARE_NUM, APIR_ALLOC_QUOTA_SHARE_DEN);
    else
        put(b, "%s %s of %s (%.0f%%)", what, u, m, 100.0 * (double)used / (double)max);
}

static void render_text(struct strbuf *b, const struct apir_host_view *v)
{
    const struct apir_host *h = v->host;
    const struct apir_limits *l = &h->cfg.limits;
    struct totals t;
    sum(v, &t);
    char up[32], start[40], by[32], by2[32];
    fmt_duration(up, sizeof(up), since_s(v, v->start_ns));
    fmt_start(v, start, sizeof(start));
    put(b, "apir-host %s (APIR %s), pid %d, up %s (since %s)\n", APIR_VERSION_STRING, APIR_PROTOCOL_STRING,
        (int)v->pid, up, start);
    put(b, "serving %s on unix:%s", ggml_backend_reg_name(h->reg), v->socket_path);
    for (uint32_t i = 0; i < v->n_streams; i++)
        put(b, ", %s", v->streams[i]);
    put(b, ", %s\n", v->isolated ? "one worker process per guest" : "one thread per guest (no isolation)");
    for (uint32_t d = 0; d < h->n_devices; d++) {
        fmt_bytes(by, sizeof(by), t.dev_bytes[d]);
        put(b, "device %u: %s - %s [%s]: %llu guest%s, %llu buffer%s (%s), %llu graph%s computed\n", d,
            ggml_backend_dev_name(h->devices[d]), ggml_backend_dev_description(h->devices[d]),
            dev_type_name(h->devices[d]), (unsigned long long)t.dev_guests[d], t.dev_guests[d] == 1 ? "" : "s",
            (unsigned long long)t.dev_buffers[d], t.dev_buffers[d] == 1 ? "" : "s", by,
            (unsigned long long)t.dev_graphs[d], t.dev_graphs[d] == 1 ? "" : "s");
    }
    put(b, "limits per guest: %u buffers, ", l->max_buffers);
    if (unlimited(l->max_alloc_bytes))
        put(b, "buffer bytes unlimited, ");
    else if (l->max_alloc_bytes == APIR_ALLOC_QUOTA_AUTO)
        put(b, "%u/%u of the device memory in buffers, ", APIR_ALLOC_QUOTA_SHARE_NUM, APIR_ALLOC_QUOTA_SHARE_DEN);
    else {
        fmt_bytes(by, sizeof(by), l->max_alloc_bytes);
        put(b, "%s in buffers, ", by);
    }
    fmt_bytes(by, sizeof(by), l->max_blob_bytes);
    put(b, "%u blobs, %s in blobs; %u guests at most\n", l->max_blobs, by, l->max_clients);
    put(b, "guests: %u now, %llu accepted since start, %llu connection%s refused\n", v->n_guests,
        (unsigned long long)v->accepted, (unsigned long long)v->refused_connections,
        v->refused_connections == 1 ? "" : "s");
    fmt_bytes(by, sizeof(by), t.bytes);
    fmt_bytes(by2, sizeof(by2), t.blob_bytes);
    put(b, "all guests: %llu commands (%llu refused), %llu graphs (%llu recomputed); now %llu buffers (%s), "
        "%llu blobs (%s)\n",
        (unsigned long long)t.commands, (unsigned long long)t.refused, (unsigned long long)t.graphs,
        (unsigned long long)t.recomputes, (unsigned long long)t.buffers, by, (unsigned long long)t.blobs, by2);
    for (uint32_t i = 0; i < v->n_guests; i++) {
        const struct apir_guest_row *g = &v->guests[i];
        const struct apir_guest_counters *c = &g->c;
        char idle[32];
        fmt_duration(up, sizeof(up), since_s(v, g->connected_ns));
        fmt_duration(idle, sizeof(idle), since_s(v, c->last_command_ns ? c->last_command_ns : g->connected_ns));
        if (g->gid == (gid_t)-1)  /* a stream peer: no credentials, its address in comm */
            put(b, "\nguest#%llu: over the network from %s", (unsigned long long)g->id, g->comm[0] ? g->comm : "?");
        else
            put(b, "\nguest#%llu: pid %d, uid %u, gid %u", (unsigned long long)g->id, (int)g->pid, (unsigned)g->uid,
                (unsigned)g->gid);
        if (g->comm[0] && g->gid != (gid_t)-1)
            put(b, ", \"%s\"", g->comm);
        if (c->state == APIR_GUEST_SERVING && (int32_t)(uint32_t)c->says_pid != g->pid)
            put(b, " (says pid %d)", (int)(int32_t)(uint32_t)c->says_pid);
        if (g->worker_pid)
            put(b, "; worker %d (slot %d)", (int)g->worker_pid, (int)g->slot);
        put(b, "; %s, up %s, idle %s", state_name(c->state), up, idle);
        if (c->state == APIR_GUEST_SERVING) {
            put(b, "; device %llu", (unsigned long long)c->device);
            if (c->device < h->n_devices)
                put(b, " (%s)", ggml_backend_dev_name(h->devices[c->device]));
            put(b, ", APIR 0.%llu", (unsigned long long)c->minor);
        }
        if (!g->readable)
            put(b, "; counters unreadable");
        put(b, "\n  ");
        put_quota(b, "buffers", c->buffers, l->max_buffers, false);
        put(b, ", ");
        put_quota(b, "bytes", c->bytes, l->max_alloc_bytes, true);
        put(b, "\n  ");
        put_quota(b, "blobs", c->blobs, l->max_blobs, false);
        put(b, ", ");
        put_quota(b, "blob bytes", c->blob_bytes, l->max_blob_bytes, true);
        put(b, "\n  commands %llu (%llu refused), graphs %llu (%llu recomputed), %.3f s computing\n",
            (unsigned long long)c->commands, (unsigned long long)c->refused, (unsigned long long)c->graphs,
            (unsigned long long)c->recomputes, seconds(c->compute_ns));
    }
}

/* ---- text: apir ps ---- */

static void render_ps(struct strbuf *b, const struct apir_host_view *v)
{
    put(b, "%-7s %8s %8s %8s %-16s %-9s %-8s %3s %7s %10s %5s %10s %8s %9s %7s\n", "GUEST", "PID", "UID", "GID", "COMM",
        "STATE", "UPTIME", "DEV", "BUFFERS", "BYTES", "BLOBS", "BLOB-BYTES", "GRAPHS", "COMMANDS", "REFUSED");
    for (uint32_t i = 0; i < v->n_guests; i++) {
        const struct apir_guest_row *g = &v->guests[i];
        const struct apir_guest_counters *c = &g->c;
        char up[32], by[32], bb[32], dev[8];
        fmt_duration(up, sizeof(up), since_s(v, g->connected_ns));
        fmt_bytes(by, sizeof(by), c->bytes);
        fmt_bytes(bb, sizeof(bb), c->blob_bytes);
        if (c->state == APIR_GUEST_SERVING)
            snprintf(dev, sizeof(dev), "%llu", (unsigned long long)(c->device % 1000));
        else
            snprintf(dev, sizeof(dev), "-");
        char uid[12] = "-", gid[12] = "-";  /* a stream peer has no credentials */
        if (g->gid != (gid_t)-1) {
            snprintf(uid, sizeof(uid), "%u", (unsigned)g->uid);
            snprintf(gid, sizeof(gid), "%u", (unsigned)g->gid);
        }
        put(b, "%-7llu %8d %8s %8s %-16s %-9s %-8s %3s %7llu %10s %5llu %10s %8llu %9llu %7llu\n",
            (unsigned long long)g->id, (int)g->pid, uid, gid, g->comm[0] ? g->comm : "-",
            g->readable ? state_name(c->state) : "unreadable", up, dev, (unsigned long long)c->buffers, by,
            (unsigned long long)c->blobs, bb, (unsigned long long)c->graphs, (unsigned long long)c->commands,
            (unsigned long long)c->refused);
    }
}

/* ---- JSON ---- */

static void put_json_max(struct strbuf *b, uint64_t max)
{
    if (unlimited(max))
        put(b, "null");
    else if (max == APIR_ALLOC_QUOTA_AUTO)
        put(b, "\"auto\"");
    else
        put(b, "%llu", (unsigned long long)max);
}

static void put_json_quota(struct strbuf *b, const char *name, uint64_t used, uint64_t max, bool last)
{
    put(b, "\"%s\": {\"used\": %llu, \"max\": ", name, (unsigned long long)used);
    put_json_max(b, max);
    put(b, "}%s", last ? "" : ", ");
}

static void render_json(struct strbuf *b, const struct apir_host_view *v)
{
    const struct apir_host *h = v->host;
    const struct apir_limits *l = &h->cfg.limits;
    struct totals t;
    sum(v, &t);
    char start[40];
    fmt_start(v, start, sizeof(start));
    put(b, "{\n  \"format\": %d,\n  \"apir\": \"%s\",\n  \"protocol\": \"%s\",\n  \"pid\": %d,\n  \"socket\": ",
        APIR_STATS_JSON_FORMAT, APIR_VERSION_STRING, APIR_PROTOCOL_STRING, (int)v->pid);
    put_json_str(b, v->socket_path);
    put(b, ",\n  \"streams\": [");
    for (uint32_t i = 0; i < v->n_streams; i++) {
        put(b, i ? ", " : "");
        put_json_str(b, v->streams[i]);
    }
    put(b, "],\n  \"backend\": ");
    put_json_str(b, ggml_backend_reg_name(h->reg));
    put(b, ",\n  \"isolation\": \"%s\",\n  \"started_at\": \"%s\",\n  \"uptime_s\": %.3f,\n", v->isolated ? "process" : "thread",
        start, since_s(v, v->start_ns));
    put(b, "  \"limits\": {\"max_clients\": %u, \"max_clients_per_tenant\": %u, \"tenant_by\": \"%s\", "
        "\"max_buffers\": %u, \"max_alloc_bytes\": ", l->max_clients, l->max_clients_per_tenant,
        h->cfg.tenant_by == APIR_TENANT_BY_UID ? "uid" : "cgroup", l->max_buffers);
    put_json_max(b, l->max_alloc_bytes);
    put(b, ", \"max_blobs\": %u, \"max_blob_bytes\": ", l->max_blobs);
    put_json_max(b, l->max_blob_bytes);
    put(b, ", \"max_graph_nodes\": %u, \"max_graph_tensors\": %u, \"graph_timeout_ms\": %u},\n", l->max_graph_nodes,
        l->max_graph_tensors, l->graph_timeout_ms);
    put(b, "  \"devices\": [");
    for (uint32_t d = 0; d < h->n_devices; d++) {
        put(b, "%s\n    {\"index\": %u, \"name\": ", d ? "," : "", d);
        put_json_str(b, ggml_backend_dev_name(h->devices[d]));
        put(b, ", \"description\": ");
        put_json_str(b, ggml_backend_dev_description(h->devices[d]));
        put(b, ", \"type\": \"%s\", \"guests\": %llu, \"buffers\": %llu, \"bytes\": %llu, \"graphs\": %llu}",
            dev_type_name(h->devices[d]), (unsigned long long)t.dev_guests[d], (unsigned long long)t.dev_buffers[d],
            (unsigned long long)t.dev_bytes[d], (unsigned long long)t.dev_graphs[d]);
    }
    put(b, "\n  ],\n");
    put(b, "  \"totals\": {\"guests\": %u, \"accepted\": %llu, \"refused_connections\": %llu, \"buffers\": %llu, "
        "\"bytes\": %llu, \"blobs\": %llu, \"blob_bytes\": %llu, \"commands\": %llu, \"refused\": %llu, "
        "\"graphs\": %llu, \"recomputes\": %llu},\n",
        v->n_guests, (unsigned long long)v->accepted, (unsigned long long)v->refused_connections,
        (unsigned long long)t.buffers, (unsigned long long)t.bytes, (unsigned long long)t.blobs,
        (unsigned long long)t.blob_bytes, (unsigned long long)t.commands, (unsigned long long)t.refused,
        (unsigned long long)t.graphs, (unsigned long long)t.recomputes);
    put(b, "  \"guests\": [");
    for (uint32_t i = 0; i < v->n_guests; i++) {
        const struct apir_guest_row *g = &v->guests[i];
        const struct apir_guest_counters *c = &g->c;
        put(b, "%s\n    {\"id\": %llu, \"pid\": %d, \"uid\": %u, \"gid\": %u, \"comm\": ", i ? "," : "",
            (unsigned long long)g->id, (int)g->pid, (unsigned)g->uid, (unsigned)g->gid);
        put_json_str(b, g->comm);
        put(b, ", \"says_pid\": %d, \"worker_pid\": ", (int)(int32_t)(uint32_t)c->says_pid);
        if (g->worker_pid)
            put(b, "%d, \"slot\": %d", (int)g->worker_pid, (int)g->slot);
        else
            put(b, "null, \"slot\": null");
        put(b, ", \"state\": \"%s\", \"readable\": %s, \"uptime_s\": %.3f, \"idle_s\": %.3f, \"protocol_minor\": %llu, "
            "\"device\": %llu,\n     ",
            state_name(c->state), g->readable ? "true" : "false", since_s(v, g->connected_ns),
            since_s(v, c->last_command_ns ? c->last_command_ns : g->connected_ns), (unsigned long long)c->minor,
            (unsigned long long)c->device);
        put(b, "\"buffers\": %llu, \"bytes\": %llu, \"blobs\": %llu, \"blob_bytes\": %llu, \"commands\": %llu, "
            "\"refused\": %llu, \"graphs\": %llu, \"recomputes\": %llu, \"compute_s\": %.6f,\n     \"quota\": {",
            (unsigned long long)c->buffers, (unsigned long long)c->bytes, (unsigned long long)c->blobs,
            (unsigned long long)c->blob_bytes, (unsigned long long)c->commands, (unsigned long long)c->refused,
            (unsigned long long)c->graphs, (unsigned long long)c->recomputes, seconds(c->compute_ns));
        put_json_quota(b, "buffers", c->buffers, l->max_buffers, false);
        put_json_quota(b, "bytes", c->bytes, l->max_alloc_bytes, false);
        put_json_quota(b, "blobs", c->blobs, l->max_blobs, false);
        put_json_quota(b, "blob_bytes", c->blob_bytes, l->max_blob_bytes, true);
        put(b, "}}");
    }
    put(b, "\n  ]\n}\n");
}

/* ---- Prometheus text exposition format ---- */

static void metric_head(struct strbuf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample per guest: name{guest="N"} value. */
#define GUEST_METRIC(name, type, help, fmt, expr)                                                 \
    do {                                                                                          \
        metric_head(b, name, type, help);                                                         \
        for (uint32_t i_ = 0; i_ < v->n_guests; i_++) {                                           \
            const struct apir_guest_row *g = &v->guests[i_];                                      \
            const struct apir_guest_counters *c = &g->c;                                          \
            (void)c;                                                                              \
            put(b, "%s{guest=\"%llu\"} " fmt "\n", name, (unsigned long long)g->id, (expr));     \
        }                                                                                         \
    } while (0)

/* One sample per device: name{device="N"} value. */
#define DEVICE_METRIC(name, type, help, array)                                                    \
    do {                                                                                          \
        metric_head(b, name, type, help);                                                         \
        for (uint32_t d_ = 0; d_ < h->n_devices; d_++)                                            \
            put(b, "%s{device=\"%u\"} %llu\n", name, d_, (unsigned long long)(array)[d_]);        \
    } while (0)

static void host_metric(struct strbuf *b, const char *name, const char *type, const char *help, uint64_t value)
{
    metric_head(b, name, type, help);
    put(b, "%s %llu\n", name, (unsigned long long)value);
}

/* A histogram, cumulated as Prometheus wants: name_bucket{le=...}, _sum, _count. */
static void put_histogram(struct strbuf *b, const char *name, const char *help, const struct apir_latency_hist *h)
{
    metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t i = 0; i < APIR_LATENCY_BUCKETS; i++) {
        cum += h->bucket[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, (double)apir_latency_bounds_ns[i] / 1e9, (unsigned long long)cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    put(b, "%s_sum %.9f\n%s_count %llu\n", name, seconds(h->sum_ns), name, (unsigned long long)h->count);
}

/* The daemon's own process, as Prometheus' client libraries name it
 * (process_*), from getrusage and /proc/self: nothing a guest sends. */
static void render_process(struct strbuf *b, const struct apir_host_view *v)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        metric_head(b, "process_cpu_seconds_total", "counter", "User and system CPU time of apir-host's daemon.");
        put(b, "process_cpu_seconds_total %.6f\n", (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                                     (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
    if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
        metric_head(b, "apir_workers_cpu_seconds_total", "counter",
                    "User and system CPU time of the worker processes that have ended.");
        put(b, "apir_workers_cpu_seconds_total %.6f\n", (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                                          (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
    unsigned long long vm_pages = 0, rss_pages = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    if (f) {
        if (fscanf(f, "%llu %llu", &vm_pages, &rss_pages) == 2) {
            const long page = sysconf(_SC_PAGESIZE);
            host_metric(b, "process_resident_memory_bytes", "gauge", "Resident memory of apir-host's daemon.",
                        rss_pages * (unsigned long long)page);
            host_metric(b, "process_virtual_memory_bytes", "gauge", "Virtual memory of apir-host's daemon.",
                        vm_pages * (unsigned long long)page);
        }
        fclose(f);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        uint64_t n = 0;
        for (struct dirent *e; (e = readdir(d));)
            n += e->d_name[0] != '.';
        closedir(d);
        host_metric(b, "process_open_fds", "gauge", "Open file descriptors of apir-host's daemon.", n ? n - 1 : 0);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        host_metric(b, "process_max_fds", "gauge", "Most open file descriptors apir-host's daemon may have.",
                    (uint64_t)rl.rlim_cur);
    metric_head(b, "process_start_time_seconds", "gauge", "When apir-host's daemon started (Unix time).");
    put(b, "process_start_time_seconds %.3f\n", (double)v->start_unix_ms / 1000.0);
}

/*
 * Names: apir_X is the host's total of X, apir_guest_X one guest's (label
 * guest), apir_device_X one device's (label device), apir_limit_X a
 * per-guest limit; counters end in _total, times are in seconds.  So the
 * host's apir_buffer_bytes is the sum of apir_guest_buffer_bytes over the
 * guests, and apir_commands_total that of apir_guest_commands_total plus
 * the departed guests'.
 */
static void render_prometheus(struct strbuf *b, const struct apir_host_view *v, bool with_comm)
{
    const struct apir_host *h = v->host;
    const struct apir_limits *l = &h->cfg.limits;
    struct totals t;
    sum(v, &t);
    metric_head(b, "apir_host_info", "gauge", "apir-host's version, protocol, backend, socket and isolation (always 1).");
    put(b, "apir_host_info{version=\"%s\",protocol=\"%s\",backend=", APIR_VERSION_STRING, APIR_PROTOCOL_STRING);
    put_label(b, ggml_backend_reg_name(h->reg));
    put(b, ",socket=");
    put_label(b, v->socket_path);
    put(b, ",isolation=\"%s\",pid=\"%d\"} 1\n", v->isolated ? "process" : "thread", (int)v->pid);
    metric_head(b, "apir_host_uptime_seconds", "gauge", "Seconds since apir-host started.");
    put(b, "apir_host_uptime_seconds %.3f\n", since_s(v, v->start_ns));
    metric_head(b, "apir_host_start_time_seconds", "gauge", "When apir-host started (Unix time).");
    put(b, "apir_host_start_time_seconds %.3f\n", (double)v->start_unix_ms / 1000.0);
    host_metric(b, "apir_devices", "gauge", "Devices the host serves.", h->n_devices);
    host_metric(b, "apir_guests", "gauge", "Guests connected now.", v->n_guests);
    host_metric(b, "apir_guests_accepted_total", "counter", "Guests accepted since start.", v->accepted);
    host_metric(b, "apir_connections_refused_total", "counter",
                "Connections turned away since start (limits, malformed hellos).", v->refused_connections);
    host_metric(b, "apir_buffers", "gauge", "Live buffers of all guests.", t.buffers);
    host_metric(b, "apir_buffer_bytes", "gauge", "Bytes in live buffers of all guests.", t.bytes);
    host_metric(b, "apir_blobs", "gauge", "Shared-memory blobs of all guests.", t.blobs);
    host_metric(b, "apir_blob_bytes", "gauge", "Bytes of shared-memory blobs of all guests.", t.blob_bytes);
    host_metric(b, "apir_commands_total", "counter", "Commands served since start, all guests.", t.commands);
    host_metric(b, "apir_refused_total", "counter", "Commands refused or failed since start, all guests.", t.refused);
    host_metric(b, "apir_graphs_total", "counter", "Graphs computed since start, all guests.", t.graphs);
    host_metric(b, "apir_recomputes_total", "counter", "Kept graphs recomputed by key since start, all guests.",
                t.recomputes);
    metric_head(b, "apir_compute_seconds_total", "counter", "Time spent checking and computing graphs, all guests.");
    put(b, "apir_compute_seconds_total %.6f\n", seconds(t.compute_ns));
    put_histogram(b, "apir_command_duration_seconds",
                  "A command's time on the host, from its arrival to its answer, all guests.", &t.command_latency);
    put_histogram(b, "apir_graph_compute_duration_seconds",
                  "A graph's check and compute (its launch when not waited for), all guests.", &t.graph_latency);
    host_metric(b, "apir_limit_clients", "gauge", "Most guests at once (--max-clients).", l->max_clients);
    host_metric(b, "apir_limit_buffers", "gauge", "Live buffers per guest (--max-buffers).", l->max_buffers);
    if (!unlimited(l->max_alloc_bytes) && l->max_alloc_bytes != APIR_ALLOC_QUOTA_AUTO)
        host_metric(b, "apir_limit_buffer_bytes", "gauge", "Bytes in live buffers per guest (--max-alloc-mib).",
                    l->max_alloc_bytes);
    host_metric(b, "apir_limit_blobs", "gauge", "Shared-memory blobs per guest (--max-blobs).", l->max_blobs);
    if (!unlimited(l->max_blob_bytes))
        host_metric(b, "apir_limit_blob_bytes", "gauge", "Bytes of blobs per guest (--max-blob-mib).",
                    l->max_blob_bytes);

    metric_head(b, "apir_device_info", "gauge", "A device the host serves (always 1).");
    for (uint32_t d = 0; d < h->n_devices; d++) {
        put(b, "apir_device_info{device=\"%u\",name=", d);
        put_label(b, ggml_backend_dev_name(h->devices[d]));
        put(b, ",description=");
        put_label(b, ggml_backend_dev_description(h->devices[d]));
        put(b, ",type=\"%s\"} 1\n", dev_type_name(h->devices[d]));
    }
    DEVICE_METRIC("apir_device_guests", "gauge", "Guests whose current device this is.", t.dev_guests);
    DEVICE_METRIC("apir_device_buffers", "gauge", "Live buffers on the device, all guests.", t.dev_buffers);
    DEVICE_METRIC("apir_device_buffer_bytes", "gauge", "Bytes in live buffers on the device, all guests.", t.dev_bytes);
    DEVICE_METRIC("apir_device_graphs_total", "counter", "Graphs computed on the device since start, all guests.",
                  t.dev_graphs);

    metric_head(b, "apir_guest_info", "gauge",
                "A connected guest: its peer credentials (SO_PEERCRED), process name and worker (always 1).");
    for (uint32_t i = 0; i < v->n_guests; i++) {
        const struct apir_guest_row *g = &v->guests[i];
        put(b, "apir_guest_info{guest=\"%llu\",pid=\"%d\",uid=\"%u\",gid=\"%u\"", (unsigned long long)g->id,
            (int)g->pid, (unsigned)g->uid, (unsigned)g->gid);
        if (with_comm) {
            put(b, ",comm=");
            put_label(b, g->comm);
        }
        put(b, ",worker_pid=\"%d\",state=\"%s\"} 1\n", (int)g->worker_pid, state_name(g->c.state));
    }
    GUEST_METRIC("apir_guest_uptime_seconds", "gauge", "Seconds since the guest connected.", "%.3f",
                 since_s(v, g->connected_ns));
    GUEST_METRIC("apir_guest_idle_seconds", "gauge", "Seconds since the guest's last command began.", "%.3f",
                 since_s(v, c->last_command_ns ? c->last_command_ns : g->connected_ns));
    GUEST_METRIC("apir_guest_device", "gauge", "The guest's current device.", "%llu", (unsigned long long)c->device);
    GUEST_METRIC("apir_guest_buffers", "gauge", "The guest's live buffers.", "%llu", (unsigned long long)c->buffers);
    GUEST_METRIC("apir_guest_buffer_bytes", "gauge", "Bytes in the guest's live buffers (weight copies included).", "%llu",
                 (unsigned long long)c->bytes);
    GUEST_METRIC("apir_guest_blobs", "gauge", "The guest's shared-memory blobs.", "%llu", (unsigned long long)c->blobs);
    GUEST_METRIC("apir_guest_blob_bytes", "gauge", "Bytes of the guest's shared-memory blobs.", "%llu",
                 (unsigned long long)c->blob_bytes);
    GUEST_METRIC("apir_guest_commands_total", "counter", "Commands the guest sent.", "%llu",
                 (unsigned long long)c->commands);
    GUEST_METRIC("apir_guest_refused_total", "counter", "The guest's commands refused or failed.", "%llu",
                 (unsigned long long)c->refused);
    GUEST_METRIC("apir_guest_graphs_total", "counter", "Graphs computed for the guest.", "%llu",
                 (unsigned long long)c->graphs);
    GUEST_METRIC("apir_guest_recomputes_total", "counter", "The guest's kept graphs recomputed by key.", "%llu",
                 (unsigned long long)c->recomputes);
    GUEST_METRIC("apir_guest_compute_seconds_total", "counter", "Time spent checking and computing the guest's graphs.",
                 "%.6f", seconds(c->compute_ns));
    render_process(b, v);
}

char *apir_stats_render(const struct apir_host_view *v, enum apir_stats_format f, size_t *len)
{
    struct strbuf b = { 0 };
    switch (f) {
    case APIR_STATS_TEXT: render_text(&b, v); break;
    case APIR_STATS_PS: render_ps(&b, v); break;
    case APIR_STATS_JSON: render_json(&b, v); break;
    case APIR_STATS_PROMETHEUS: render_prometheus(&b, v, true); break;
    case APIR_STATS_PROMETHEUS_PUBLIC: render_prometheus(&b, v, false); break;
    }
    if (b.failed || !b.s) {
        free(b.s);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.s;
}
