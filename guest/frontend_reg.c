/*
 * The APIR backend registry: the entry point ggml loads from
 * GGML_BACKEND_PATH.  At first use it connects to the hosts named by
 * APIR_HOST (default: the daemon's default socket; a comma-separated list
 * names several: guest/endpoint_list.h) and exposes one device per remote
 * device, numbered APIR0.. across the hosts in list order (the first host's
 * devices first).  A host that cannot be reached is named in a warning and
 * left out; if none can be, the program gets no device and goes on with its
 * other backends.
 */
#include "frontend.h"
#include "calls.h"
#include "endpoint_list.h"
#include "notice.h"

#include "apir_log.h"
#include "apir_proto.h"

#include "ggml-impl.h"  /* ggml_log_internal, ggml_log_callback_default */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registry is one per process by ggml's design; its devices are not
 * statics but heap objects it points to. */
struct apir_reg_ctx {
    pthread_once_t once;
    uint32_t n_devices;
    struct apir_device *devices[APIR_MAX_DEVICES];
    struct apir_endpoint_list hosts;  /* APIR_HOST, split */
    uint32_t n_hosts_reached;         /* hosts that gave at least one device */
};

static struct apir_reg_ctx reg_ctx = { .once = PTHREAD_ONCE_INIT };
static struct ggml_backend_reg apir_reg;

static const char *reg_get_name(ggml_backend_reg_t reg)
{
    (void)reg;
    return APIR_REG_NAME;
}

static size_t reg_get_device_count(ggml_backend_reg_t reg)
{
    return ((struct apir_reg_ctx *)reg->context)->n_devices;
}

static ggml_backend_dev_t reg_get_device(ggml_backend_reg_t reg, size_t index)
{
    struct apir_reg_ctx *c = reg->context;
    return index < c->n_devices ? &c->devices[index]->dev : NULL;
}

static void *reg_get_proc_address(ggml_backend_reg_t reg, const char *name)
{
    (void)reg;
    (void)name;
    return NULL;
}

static const struct ggml_backend_reg_i apir_reg_iface = {
    .get_name = reg_get_name,
    .get_device_count = reg_get_device_count,
    .get_device = reg_get_device,
    .get_proc_address = reg_get_proc_address,
};

static void print_profiles(void)
{
    for (uint32_t i = 0; i < reg_ctx.n_devices; i++) {
        struct apir_device *d = reg_ctx.devices[i];
        apir_remote_print_profile(&d->remote, d->name);
        apir_remote_write_trace(&d->remote, d->name);
        if (d->remote.profile && d->serialize_count)
            fprintf(stderr, "apir profile %s: graph serialization %8llu graphs %10.2f ms %8.2f us each\n", d->name,
                    (unsigned long long)d->serialize_count, d->serialize_ns / 1e6,
                    d->serialize_ns / 1e3 / (double)d->serialize_count);
        if (d->remote.profile && d->delta.sent)
            fprintf(stderr, "apir profile %s: graph deltas        %8llu sent, %llu answered stale\n", d->name,
                    (unsigned long long)d->delta.sent, (unsigned long long)d->delta.stale);
    }
}

/*
 * apir's log lines go through ggml's logger: a program that captures ggml's
 * log (ggml_log_set, llama_log_set: llama-server, ollama-style apps) gets
 * ours with it; ggml's default logger writes them to stderr as before.
 * APIR_LOG_LEVEL still filters first; APIR_LOG_FILE, if set, still wins.
 */
static void log_to_ggml(enum apir_log_level level, const char *line)
{
    static const enum ggml_log_level levels[] = {
        [APIR_LOG_ERROR] = GGML_LOG_LEVEL_ERROR,
        [APIR_LOG_WARN] = GGML_LOG_LEVEL_WARN,
        [APIR_LOG_INFO] = GGML_LOG_LEVEL_INFO,
        [APIR_LOG_DEBUG] = GGML_LOG_LEVEL_DEBUG,
    };
    ggml_log_internal(levels[level], "%s", line);
}

/* ggml's own logger writes to stderr; a program's callback may drop lines
 * (llama-bench's does, llama-server's below -v): then notices go to stderr
 * themselves (notice.h). */
static bool ggml_log_reaches_user(void)
{
#if APIR_GGML_HAS_LOG_GET
    ggml_log_callback cb = NULL;
    void *user = NULL;
    ggml_log_get(&cb, &user);
    return cb == NULL || cb == ggml_log_callback_default;
#else
    /* A ggml that cannot say which logger it has: notices go to stderr. */
    return false;
#endif
}

static void warn_endpoint_problem(void *arg, const char *msg)
{
    (void)arg;
    APIR_WARN("guest", "%s", msg);
}

/* A host left out of a list: named, and the others go on.  The only host:
 * the warning a single endpoint has always had ("no APIR device: ..."). */
static void host_left_out(const struct apir_reg_ctx *c, uint32_t host_no, const char *why)
{
    char what[1024];
    if (c->hosts.n == 1)
        snprintf(what, sizeof(what), "no APIR device: %s", why);
    else
        snprintf(what, sizeof(what), "APIR_HOST: host %u of %u (%s) left out: %s", host_no + 1, c->hosts.n,
                 c->hosts.endpoint[host_no][0] ? c->hosts.endpoint[host_no] : "the default socket", why);
    APIR_WARN("guest", "%s", what);
    /* Only where the user asked for a host: a program that merely finds
     * libggml-apir.so in its backend folder says nothing more. */
    if (getenv("APIR_HOST"))
        apir_notice(APIR_NOTICE_NO_DEVICE, what, "check APIR_HOST and that apir-host runs there (apir ping)");
}

/* The devices of one host, numbered after those already there. */
static void connect_host(struct apir_reg_ctx *c, uint32_t host_no)
{
    const char *endpoint = c->hosts.endpoint[host_no];
    char err[256], why[320];
    if (c->n_devices == APIR_MAX_DEVICES) {
        snprintf(why, sizeof(why), "%d APIR devices already (the most a program gets)", APIR_MAX_DEVICES);
        host_left_out(c, host_no, why);
        return;
    }
    struct apir_device *first = calloc(1, sizeof(*first));
    if (!first)
        return;
    if (!apir_remote_open(&first->remote, endpoint, 0, err, sizeof(err))) {
        host_left_out(c, host_no, err);
        free(first);
        return;
    }
    /* Before any tensor: our op and type numbers must mean the same there. */
    char ggml_why[768];
    if (!apir_ggml_host_agrees(&first->remote, ggml_why, sizeof(ggml_why))) {
        host_left_out(c, host_no, ggml_why);
        apir_remote_close(&first->remote);
        free(first);
        return;
    }
    int32_t count = 0;
    if (apir_call_DEVICE_GET_DEVICE_COUNT(&first->remote, &count) != APIR_HANDLER_OK || count <= 0) {
        snprintf(why, sizeof(why), "the host at %.127s reports none", first->remote.t->endpoint);
        host_left_out(c, host_no, why);
        apir_remote_close(&first->remote);
        free(first);
        return;
    }
    const uint32_t room = APIR_MAX_DEVICES - c->n_devices;
    if ((uint32_t)count > room) {
        APIR_WARN("guest", "the host at %s has %d devices: only %u more fit in a program (%d at most): the rest are left out",
                  first->remote.t->endpoint, count, room, APIR_MAX_DEVICES);
        count = (int32_t)room;
    }
    const uint32_t base = c->n_devices;
    first->global_index = base;
    first->host_no = host_no;
    c->devices[c->n_devices++] = first;
    apir_device_setup(first, &apir_reg);
    for (int32_t i = 1; i < count; i++) {
        struct apir_device *d = calloc(1, sizeof(*d));
        if (!d || !apir_remote_open(&d->remote, endpoint, (uint32_t)i, err, sizeof(err))) {
            APIR_WARN("guest", "remote device %d of %s unavailable: %s", i, first->remote.t->endpoint,
                      d ? err : "out of memory");
            free(d);
            break;
        }
        d->global_index = c->n_devices;
        d->host_no = host_no;
        c->devices[c->n_devices++] = d;
        apir_device_setup(d, &apir_reg);
    }
    c->n_hosts_reached++;
    if (c->hosts.n > 1)
        APIR_INFO("guest", "APIR%u..APIR%u: host %u of %u, %s", base, c->n_devices - 1, host_no + 1, c->hosts.n,
                  first->remote.t->endpoint);
}

static void connect_devices(void)
{
    struct apir_reg_ctx *c = &reg_ctx;
    apir_endpoint_list_parse(getenv("APIR_HOST"), &c->hosts, warn_endpoint_problem, NULL);
    for (uint32_t h = 0; h < c->hosts.n; h++)
        connect_host(c, h);
    if (!c->n_devices) {
        if (c->hosts.n > 1)
            APIR_WARN("guest", "no APIR device: none of the %u hosts in APIR_HOST could be used", c->hosts.n);
        return;
    }
    if (c->hosts.n == 1)
        APIR_INFO("guest", "%u APIR device(s) via %s", c->n_devices, c->devices[0]->remote.t->endpoint);
    else
        APIR_INFO("guest", "%u APIR device(s) on %u of the %u hosts in APIR_HOST", c->n_devices, c->n_hosts_reached,
                  c->hosts.n);
    if (c->devices[0]->remote.profile || apir_remote_tracing(&c->devices[0]->remote))
        atexit(print_profiles);
}

/* Another ggml than ours (frontend_compat.c): a registry without devices,
 * so that the program goes on with its other backends.  Said on stderr
 * through apir's own logger, not ggml's, whose functions are then not ours
 * to call, and as a notice (once, even where the program silences logs). */
static void check_ggml(void)
{
    char why[1024];
    if (apir_ggml_check(why, sizeof(why))) {
        apir_log_set_sink(log_to_ggml);
        apir_notice_set_log_visible(ggml_log_reaches_user);
        connect_devices();
        return;
    }
    apir_notice(APIR_NOTICE_NO_DEVICE, why, APIR_GGML_HOW_TO_BUILD);
}

static ggml_backend_reg_t apir_backend_reg(void)
{
    apir_reg.api_version = GGML_BACKEND_API_VERSION;
    apir_reg.iface = apir_reg_iface;
    apir_reg.context = &reg_ctx;
    pthread_once(&reg_ctx.once, check_ggml);
    return &apir_reg;
}

GGML_BACKEND_API ggml_backend_reg_t ggml_backend_init(void);
GGML_BACKEND_API int ggml_backend_score(void);

ggml_backend_reg_t ggml_backend_init(void) { return apir_backend_reg(); }

/* Reachability is only known once connected; ggml asks this first. */
int ggml_backend_score(void) { return 1; }
