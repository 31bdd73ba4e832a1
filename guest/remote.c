#include "remote.h"
#include "calls.h"
#include "bulk_copy.h"
#include "download.h"
#include "notice.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "wait.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HANDSHAKE_TIMEOUT_NS (2ull * 1000 * 1000 * 1000)

size_t apir_remote_data_default(void)
{
    const char *s = getenv("APIR_DATA_MB");
    if (s && *s) {
        long mb = strtol(s, NULL, 10);
        if (mb >= 1 && mb <= 4096)
            return (size_t)mb << 20;
    }
    return APIR_DATA_BLOB_SIZE;
}

/* Commands that touch no device memory an upload waiting for the graph
 * writes (queries, new buffers, waits), the uploads themselves when they go
 * plain, and the graph that carries them. */
static bool apir_command_passes_inputs(enum apir_command cmd)
{
    switch (cmd) {
    case APIR_CMD_BUFFER_SET_TENSOR:
    case APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS:
    case APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER:
    case APIR_CMD_DEVICE_BUFFER_FROM_PTR:
    case APIR_CMD_BACKEND_SYNCHRONIZE:
        return true;
    default:
        return (apir_command_classes(cmd) & APIR_QUERY) != 0;
    }
}

struct apir_encoder *apir_remote_begin_locked(struct apir_remote *r, enum apir_command cmd)
{
    if (!apir_minor_speaks(r->minor, cmd)) {
        /* Not sent: what was staged for it must not ride on the next one. */
        if (r->t->ops->unstage)
            r->t->ops->unstage(r->t);
        return NULL;
    }
    if (r->inputs_waiting && !apir_command_passes_inputs(cmd))
        APIR_ERROR("guest", "%s sent before %u upload(s) waiting for a graph: a missing flush (a bug)",
                   apir_command_name(cmd), r->inputs_waiting);
    r->enc = r->t->ops->begin(r->t);
    return r->enc;
}

/*
 * What a failed command's code means, for the guest's log line.  From 0.3
 * an APIR_HANDLER_LIMIT reply says which quota (apir_remote_submit_locked);
 * from an older host it is named from the command: a buffer command is over
 * the guest's buffer count or bytes.
 */
static const char *handler_result_text(enum apir_command cmd, uint32_t result)
{
    switch (result) {
    case APIR_HANDLER_FAILED:
        return "the operation failed";
    case APIR_HANDLER_BAD_REQUEST:
        return "malformed or out-of-bounds request, or a graph node the host would not build";
    case APIR_HANDLER_BAD_HANDLE:
        return "unknown, stale or foreign handle";
    case APIR_HANDLER_LIMIT:
        return strstr(apir_command_name(cmd), "BUFFER")
                   ? "a per-client limit was hit (buffers or bytes quota: apir-host --max-buffers, --max-alloc-mib; "
                     "the host's log names it)"
                   : "a per-client limit was hit (a quota of apir-host's --max-* options; the host's log names it)";
    case APIR_HANDLER_REPLY_FULL:
        return "the reply does not fit the reply area";
    case APIR_HANDLER_INVALID_INDEX:
        return "command unknown to the host or above the negotiated protocol";
    case APIR_HANDLER_STALE:
        return "the host no longer keeps that graph";
    default:
        return "unknown result";
    }
}

/* Whether [offset, offset + size) lies in the data area; logs when not. */
static bool data_range_fits(const struct apir_remote *r, uint64_t offset, size_t size)
{
    if (offset > r->data_size || size > r->data_size - offset) {
        APIR_ERROR("guest", "%zu bytes at %llu do not fit the %zu-byte data area", size, (unsigned long long)offset,
                   r->data_size);
        return false;
    }
    return true;
}

uint64_t apir_remote_spin_ns(const struct apir_remote *r, uint32_t classes)
{
    /* Commands that wait for the device spin through its work; so do those
     * after a graph the host answered before computing it and leaves
     * running (APIR_LEAVES_BUSY).  Where the host computes a graph on the
     * cores this thread would spin on (graph_sleeps), the graph's own wait
     * only glances before it sleeps. */
    if ((classes & APIR_GRAPH) == APIR_GRAPH && r->graph_sleeps)
        return APIR_SPIN_GLANCE_NS;
    if ((classes & APIR_WAITS_DEVICE) || r->host_computing)
        return r->graph_spin_ns;
    return 0;
}

int apir_remote_submit_locked(struct apir_remote *r, enum apir_command cmd, const struct apir_call_opts *opts,
                              struct apir_decoder *reply)
{
    static const struct apir_call_opts nothing_more;
    if (!opts)
        opts = &nothing_more;
    const char *name = apir_command_name(cmd);
    uint32_t classes = apir_command_classes(cmd);
    bool sendable = r->enc && !r->enc->fatal;
    if (!sendable)
        APIR_ERROR("guest", "%s: request does not fit", name);
    else if (opts->get_dst)
        sendable = data_range_fits(r, opts->get_offset, opts->get_size) &&
                   (!r->t->ops->stage_out ||
                    r->t->ops->stage_out(r->t, r->data_res_id, opts->get_offset, opts->get_dst, opts->get_size) == 0);
    if (!sendable) {
        /* Not sent: what was staged for it must not ride on the next one. */
        if (r->t->ops->unstage)
            r->t->ops->unstage(r->t);
        return -1;
    }
    const struct apir_submit_opts sub_opts = {
        .spin_ns = apir_remote_spin_ns(r, classes),
        .posted = (classes & APIR_POSTED) != 0,
        .wait_work = opts->wait_work,
    };
    uint32_t ret;
    uint64_t t0 = r->profile || r->trace ? apir_now_ns() : 0;
    int sub = r->t->ops->submit(r->t, APIR_CMD_TYPE_FORWARD, (int32_t)cmd, &sub_opts, &ret, reply);
    if (sub != 0 && r->t->broken && !r->gone_logged) {
        /* Said once per connection; each caller reports its own failure. */
        r->gone_logged = true;
        APIR_ERROR("guest", "the host at %s is gone: calls fail; new allocations try to reach it again", r->t->endpoint);
        char what[256];
        snprintf(what, sizeof(what), "the APIR host at %s is gone (it died or hung up): %s failed", r->t->endpoint, name);
        apir_notice(APIR_NOTICE_HOST_GONE, what,
                    "the host's log says why (journalctl -u apir-host, or its stderr); restart the program once the host is back");
    }
    /* Such a graph stays on the device until a command that is neither a
     * query nor another graph or upload (apir_command_runs_beside_device). */
    if (sub == 0 && (classes & APIR_LEAVES_BUSY)) {
        r->graphs_launched++;
        /* Computed before its reply: done, nothing to wait for after it. */
        if (r->graph_done_at_reply)
            r->graphs_done = r->graphs_launched;
        r->host_computing = !r->graph_done_at_reply;
    } else if (sub == 0 && !apir_command_runs_beside_device(cmd)) {
        /* The host settled before it ran this: every graph before it is done. */
        r->host_computing = false;
        r->graphs_done = r->graphs_launched;
    }
    if (r->profile || r->trace) {
        const uint64_t t1 = apir_now_ns();
        r->cmd_ns[cmd] += t1 - t0;
        r->cmd_count[cmd]++;
        apir_remote_trace(r, name, t0, t1, opts->get_size);
    }
    if (sub != 0)
        return -1;
    if (ret < APIR_FORWARD_BASE) {
        APIR_ERROR("guest", "%s: transport error %u", name, ret);
        return -1;
    }
    uint32_t result = ret - APIR_FORWARD_BASE;
    if (result == APIR_HANDLER_LIMIT && apir_minor_has(r->minor, APIR_FEATURE_LIMIT_REASON) && apir_decode_u32(reply) == APIR_LIMIT_REASON_TAG) {
        /* 0.3: the host says which quota, and this guest's own use. */
        struct apir_string why;
        apir_get_string(reply, &why);
        if (!reply->fatal) {
            APIR_WARN("guest", "%s failed on the host (code %u): a per-client limit was hit: %s", name, result, why.s);
            char what[600];
            snprintf(what, sizeof(what), "the APIR host refused %s: a per-guest limit was hit: %.400s", name, why.s);
            apir_notice(APIR_NOTICE_LIMIT, what,
                        "use less (a smaller model or context), or ask the host's operator to raise that limit (apir-host --help, \"limits\")");
            return (int)result;
        }
    }
    if (result != APIR_HANDLER_OK) {
        APIR_WARN("guest", "%s failed on the host (code %u): %s", name, result, handler_result_text(cmd, result));
        char what[400];
        snprintf(what, sizeof(what), "the APIR host refused %s (code %u): %s", name, result, handler_result_text(cmd, result));
        apir_notice(result == APIR_HANDLER_LIMIT ? APIR_NOTICE_LIMIT : APIR_NOTICE_REFUSED, what,
                    "APIR_LOG_LEVEL=info APIR_LOG_FILE=/tmp/apir.log shows every step; the host's log says why it refused");
        return (int)result;
    }
    if (opts->get_dst && !r->t->ops->stage_out) {
        /* Shared memory: the host left the bytes in the data area. */
        uint64_t c0 = r->profile ? apir_now_ns() : 0;
        apir_bulk_copy(opts->get_dst, r->data + opts->get_offset, opts->get_size);
        if (r->profile) {
            r->copy_ns += apir_now_ns() - c0;
            r->copy_bytes += opts->get_size;
        }
    }
    return APIR_HANDLER_OK;
}

bool apir_remote_put_data_locked(struct apir_remote *r, uint64_t offset, const void *src, size_t size)
{
    if (!data_range_fits(r, offset, size))
        return false;
    if (r->t->ops->stage_in)
        return r->t->ops->stage_in(r->t, r->data_res_id, offset, src, size) == 0;
    if (r->data + offset != src) {
        uint64_t c0 = r->profile ? apir_now_ns() : 0;
        apir_bulk_copy(r->data + offset, src, size);
        if (r->profile) {
            r->copy_ns += apir_now_ns() - c0;
            r->copy_bytes += size;
        }
    }
    return true;
}

int apir_remote_reply_checked(struct apir_remote *r, enum apir_command cmd, bool reply_ok)
{
    (void)r;
    if (!reply_ok) {
        APIR_ERROR("guest", "%s: malformed reply", apir_command_name(cmd));
        return APIR_HANDLER_BAD_REQUEST;
    }
    return APIR_HANDLER_OK;
}

void apir_remote_wait_idle(struct apir_remote *r)
{
    pthread_mutex_lock(&r->lock);
    if (r->host_computing)
        apir_call_BACKEND_SYNCHRONIZE_locked(r);
    pthread_mutex_unlock(&r->lock);
}

uint64_t apir_remote_graphs_launched(struct apir_remote *r)
{
    pthread_mutex_lock(&r->lock);
    uint64_t n = r->graphs_launched;
    pthread_mutex_unlock(&r->lock);
    return n;
}

void apir_remote_wait_graphs(struct apir_remote *r, uint64_t launched)
{
    pthread_mutex_lock(&r->lock);
    /* A failed synchronize (a host gone, a graph that failed) leaves the
     * count as it was: the next command reports the failure. */
    if (r->graphs_done < launched && r->host_computing)
        apir_call_BACKEND_SYNCHRONIZE_locked(r);
    pthread_mutex_unlock(&r->lock);
}

bool apir_remote_data_reserve(struct apir_remote *r, size_t size)
{
    if (size <= r->data_size)
        return true;
    size_t want = r->data_size ? r->data_size : apir_remote_data_default();
    while (want < size)
        want *= 2;
    uint32_t res_id;
    void *ptr;
    if (r->t->ops->blob_create(r->t, want, &res_id, &ptr) != 0)
        return false;
    if (r->data)
        r->t->ops->blob_destroy(r->t, r->data_res_id, r->data, r->data_size);
    r->data = ptr;
    r->data_size = want;
    r->data_res_id = res_id;
    return true;
}

/* Opens a transport to r->endpoint, handshakes, selects r->device and
 * shares a data area: r->t, r->conn, r->minor and the data area are set on
 * success.  Nothing else of r is touched (the lock is held, or r is not yet
 * shared). */
static bool session_open(struct apir_remote *r, char *err, size_t err_len)
{
    struct apir_transport *t = apir_transport_open(r->endpoint[0] ? r->endpoint : NULL, err, err_len);
    if (!t)
        return false;
    struct apir_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        snprintf(err, err_len, "out of memory");
        t->ops->close(t);
        return false;
    }
    struct apir_encoder *enc = t->ops->begin(t);
    apir_encode_u32(enc, APIR_VERSION_MAJOR);
    apir_encode_u32(enc, APIR_VERSION_MINOR);
    uint32_t ret, major = 0, minor = 0;
    struct apir_decoder reply;
    if (t->ops->submit(t, APIR_CMD_TYPE_HANDSHAKE, 0, &(struct apir_submit_opts){ .timeout_ns = HANDSHAKE_TIMEOUT_NS },
                       &ret, &reply) != 0) {
        snprintf(err, err_len, "no handshake answer from %s", t->endpoint);
        goto fail;
    }
    major = apir_decode_u32(&reply);
    minor = apir_decode_u32(&reply);
    if (ret != APIR_HANDSHAKE_MAGIC || reply.fatal || major != APIR_VERSION_MAJOR) {
        snprintf(err, err_len, "protocol mismatch with %s: host speaks APIR %u.%u, guest %u.%u", t->endpoint, major,
                 minor, APIR_VERSION_MAJOR, APIR_VERSION_MINOR);
        goto fail;
    }
    if (!apir_minor_speaks(minor, APIR_CMD_DEVICE_SELECT) && r->device != 0) {
        snprintf(err, err_len, "host speaks APIR 0.%u: only device 0 is reachable", minor);
        goto fail;
    }
    struct apir_transport *old_t = r->t;
    struct apir_conn *old_conn = r->conn;
    uint32_t old_minor = r->minor;
    r->t = t;
    r->minor = minor;
    r->data = NULL;
    r->data_size = 0;
    if (apir_minor_speaks(minor, APIR_CMD_DEVICE_SELECT) && apir_call_DEVICE_SELECT_locked(r, r->device) != APIR_HANDLER_OK) {
        snprintf(err, err_len, "host refused device %u", r->device);
    } else if (!apir_remote_data_reserve(r, apir_remote_data_default())) {
        snprintf(err, err_len, "cannot share a data area with the host");
    } else {
        conn->t = t;
        conn->refs = 1;
        conn->generation = old_conn ? old_conn->generation + 1 : 1;
        r->conn = conn;
        atomic_store(&r->generation, conn->generation);
        snprintf(r->endpoint, sizeof(r->endpoint), "%s", t->endpoint);
        r->host_computing = false;
        r->graphs_done = r->graphs_launched;  /* the old connection's graphs are gone with it */
        r->gone_logged = false;
        return true;
    }
    r->t = old_t;
    r->minor = old_minor;
fail:
    t->ops->close(t);
    free(conn);
    return false;
}

bool apir_remote_open(struct apir_remote *r, const char *endpoint, uint32_t device, char *err, size_t err_len)
{
    memset(r, 0, sizeof(*r));
    if (endpoint)
        snprintf(r->endpoint, sizeof(r->endpoint), "%s", endpoint);
    r->device = device;
    const char *prof = getenv("APIR_PROFILE");
    r->profile = prof && !strcmp(prof, "1");
    const char *trace = getenv("APIR_TRACE");
    if (trace && *trace && !(r->trace = calloc(APIR_TRACE_EVENTS, sizeof(*r->trace))))
        APIR_WARN("guest", "APIR_TRACE: no memory for the trace; not tracing");
    r->graph_spin_ns = (uint64_t)apir_spin_graph_us() * 1000;
    r->get_piece = apir_download_piece_from_env();
    pthread_mutex_init(&r->lock, NULL);
    if (!session_open(r, err, err_len)) {
        pthread_mutex_destroy(&r->lock);
        free(r->trace);
        r->trace = NULL;
        return false;
    }
    return true;
}

bool apir_remote_gone_locked(const struct apir_remote *r)
{
    return r->t->broken;
}

struct apir_conn *apir_remote_conn_get_locked(struct apir_remote *r)
{
    r->conn->refs++;
    return r->conn;
}

void apir_conn_put_locked(struct apir_remote *r, struct apir_conn *c)
{
    if (--c->refs > 0)
        return;
    if (c == r->conn)
        r->conn = NULL;
    c->t->ops->close(c->t);
    free(c);
}

#define RECONNECT_INTERVAL_NS (1000ull * 1000 * 1000)

bool apir_remote_reconnect_locked(struct apir_remote *r)
{
    if (!r->t->broken)
        return true;
    uint64_t now = apir_now_ns();
    if (now < r->next_reconnect_ns)
        return false;
    r->next_reconnect_ns = now + RECONNECT_INTERVAL_NS;
    struct apir_transport *old_t = r->t;
    struct apir_conn *old_conn = r->conn;
    uint8_t *old_data = r->data;
    size_t old_data_size = r->data_size;
    uint32_t old_data_id = r->data_res_id;
    char err[256];
    if (!session_open(r, err, sizeof(err))) {
        r->data = old_data;
        r->data_size = old_data_size;
        r->data_res_id = old_data_id;
        APIR_WARN("guest", "the host at %s is still unreachable: %s", r->endpoint, err);
        return false;
    }
    /* The old data area goes with the dead connection (an unmap only). */
    old_t->ops->blob_destroy(old_t, old_data_id, old_data, old_data_size);
    apir_conn_put_locked(r, old_conn);
    APIR_WARN("guest", "reached the host at %s again (connection %u): what was on the old host is gone", r->endpoint,
              r->conn->generation);
    return true;
}

void apir_remote_close(struct apir_remote *r)
{
    if (!r->t)
        return;
    /* Closing the socket frees everything on the host; no need to unmap the
     * data area there first. */
    r->t->ops->close(r->t);
    free(r->conn);
    r->conn = NULL;
    r->t = NULL;
    pthread_mutex_destroy(&r->lock);
    free(r->trace);
    r->trace = NULL;
}

void apir_remote_print_profile(const struct apir_remote *r, const char *name)
{
    if (!r->profile)
        return;
    for (int c = 0; c < APIR_CMD_COUNT; c++)
        if (r->cmd_count[c])
            fprintf(stderr, "apir profile %s: %-28s %8llu calls %10.2f ms %8.2f us each\n", name, apir_command_name((uint32_t)c),
                    (unsigned long long)r->cmd_count[c], r->cmd_ns[c] / 1e6, r->cmd_ns[c] / 1e3 / (double)r->cmd_count[c]);
    char line[768];
    if (r->t && r->t->ops->describe_profile && r->t->ops->describe_profile(r->t, line, sizeof(line)))
        fprintf(stderr, "apir profile %s: %s\n", name, line);
    if (r->copy_bytes || r->copy_early_bytes)
        fprintf(stderr, "apir profile %s: data area copies %10.1f MiB %10.2f ms %8.2f GB/s (+%.1f MiB while the host wrote)\n",
                name, r->copy_bytes / 1048576.0, r->copy_ns / 1e6, r->copy_ns ? r->copy_bytes / (double)r->copy_ns : 0.0,
                r->copy_early_bytes / 1048576.0);
}

void apir_remote_trace(struct apir_remote *r, const char *what, uint64_t t0, uint64_t t1, uint64_t bytes)
{
    if (!r->trace)
        return;
    r->trace[r->trace_n++ % APIR_TRACE_EVENTS] = (struct apir_trace_event){ .t0 = t0, .t1 = t1, .bytes = bytes, .what = what };
}

static int trace_by_start(const void *a, const void *b)
{
    const struct apir_trace_event *x = a, *y = b;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

void apir_remote_write_trace(struct apir_remote *r, const char *name)
{
    const char *path = getenv("APIR_TRACE");
    if (!r->trace || !r->trace_n || !path)
        return;
    /* Spans are recorded when they end (a command inside a guest step
     * before the step): sorted by start here, at exit, in place. */
    const size_t n = r->trace_n < APIR_TRACE_EVENTS ? (size_t)r->trace_n : APIR_TRACE_EVENTS;
    qsort(r->trace, n, sizeof(*r->trace), trace_by_start);
    FILE *f = fopen(path, "a");
    if (!f) {
        APIR_WARN("guest", "APIR_TRACE: cannot open %s", path);
        return;
    }
    const uint64_t base = r->trace[0].t0;
    uint64_t prev_end = base;
    /* The base in CLOCK_MONOTONIC: to line the trace up with others (perf record -k mono). */
    fprintf(f, "# %s: times in us from %llu ns (CLOCK_MONOTONIC)\n", name, (unsigned long long)base);
    for (size_t i = 0; i < n; i++) {
        const struct apir_trace_event *e = &r->trace[i];
        fprintf(f, "%s %.1f %.1f %.1f %s %llu\n", name, (e->t0 - base) / 1e3, (e->t1 - e->t0) / 1e3,
                ((double)e->t0 - (double)prev_end) / 1e3, e->what, (unsigned long long)e->bytes);
        if (e->t1 > prev_end)
            prev_end = e->t1;
    }
    if (r->trace_n > n)
        fprintf(f, "%s: the first %llu events fell out of the ring\n", name, (unsigned long long)(r->trace_n - n));
    fclose(f);
}
