/*
 * What a running host does, seen from outside (apir stat, apir ps, the
 * metrics file): each guest's counters, and the documents made of them.
 *
 * The counters a guest's session keeps (struct apir_session and its
 * apir_session_stats) live where the session runs: in a worker process
 * (process isolation) or on a serving thread (thread isolation).  So whoever
 * serves the guest publishes them, after each command, into a stats page
 * (struct apir_stats_page, below): plain 64-bit counters under a seqlock,
 * written with relaxed atomic stores - no syscall, no lock on the hot path.
 * The daemon reads the pages when asked (control.c) and never waits on one.
 *
 * With process isolation the page is shared memory: the daemon creates one
 * sealed memfd per worker (workers.c), writes its header, and passes it at
 * spawn (--stats-fd); the worker maps it before entering its sandbox.  A
 * worker is not trusted: what its page says is only ever printed as numbers
 * (and a device index is checked before it names a device), its identity
 * (guest id, peer pid/uid/gid) comes from the daemon's own records, and a
 * page whose seqlock never settles is shown as unreadable, not waited for.
 * With thread isolation the page is ordinary memory of the daemon, written by
 * the serving thread and read by the main thread the same way.
 */
#ifndef APIR_HOST_STATS_H
#define APIR_HOST_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host.h"

struct apir_session;

#define APIR_STATS_PAGE_MAGIC   0x54535041u  /* "APST" */
/* Bumped whenever the page's layout changes (daemon and workers are one
 * binary, but a page is checked before it is believed). */
#define APIR_STATS_PAGE_VERSION 2u
#define APIR_STATS_PAGE_SIZE    4096u

/* A guest's state as its page says. */
enum apir_guest_state {
    APIR_GUEST_STARTING = 0,  /* a worker was started; no hello yet */
    APIR_GUEST_SERVING = 1,   /* hello accepted: commands are served */
};

/* Per-guest counters: one row each, in the page and in a snapshot. */
#define APIR_GUEST_COUNTERS(X)                                                              \
    X(state)           /* enum apir_guest_state */                                          \
    X(says_pid)        /* the pid the guest's hello claims (its own word) */                \
    X(minor)           /* negotiated APIR minor (0 before the handshake) */                 \
    X(device)          /* current device (DEVICE_SELECT) */                                 \
    X(last_command_ns) /* monotonic time the last command began (0: none yet) */            \
    X(buffers)         /* live buffers */                                                   \
    X(bytes)           /* bytes in live buffers, weight copies included (--max-alloc-mib) */ \
    X(blobs)           /* shared-memory blobs mapped */                                     \
    X(blob_bytes)      /* ... their bytes (--max-blob-mib) */                               \
    X(commands)        /* backend commands served */                                        \
    X(refused)         /* ... of them refused or failed */                                  \
    X(graphs)          /* graphs computed (recomputes included) */                          \
    X(recomputes)      /* keyed graphs recomputed by key */                                 \
    X(compute_ns)      /* time spent checking and computing graphs */

/*
 * Latency histograms (Prometheus histograms in the metrics): each counts
 * observations in buckets by upper bound, not cumulated here (the metrics
 * cumulate them), plus their number and sum.  The same bounds for both:
 *  - a command's time on the host, from its arrival (the serving thread
 *    woken, or its frame read) to its answer sent - the round trip less
 *    the transport both ways;
 *  - a graph's check and compute (a graph launched and not waited for
 *    counts its launch).
 */
#define APIR_LATENCY_BUCKETS 16
extern const uint64_t apir_latency_bounds_ns[APIR_LATENCY_BUCKETS];
struct apir_latency_hist {
    uint64_t count, sum_ns;
    uint64_t bucket[APIR_LATENCY_BUCKETS];  /* observations <= that bound (and above the one before) */
};

struct apir_guest_counters {
#define APIR_X_FIELD(name) uint64_t name;
    APIR_GUEST_COUNTERS(APIR_X_FIELD)
#undef APIR_X_FIELD
    uint64_t dev_buffers[APIR_HOST_MAX_DEVICES];  /* live buffers per device */
    uint64_t dev_bytes[APIR_HOST_MAX_DEVICES];    /* ... their bytes */
    uint64_t dev_graphs[APIR_HOST_MAX_DEVICES];   /* graphs computed per device */
    struct apir_latency_hist command_latency, graph_latency;
};

/* The shared page.  The daemon writes the header before the worker runs;
 * the worker writes the rest (apir_stats_publish). */
struct apir_stats_page {
    uint32_t magic;            /* APIR_STATS_PAGE_MAGIC */
    uint32_t version;          /* APIR_STATS_PAGE_VERSION */
    uint32_t size;             /* sizeof(struct apir_stats_page) */
    _Atomic uint32_t seq;      /* seqlock: odd while a write is under way */
#define APIR_X_ATOMIC(name) _Atomic uint64_t name;
    APIR_GUEST_COUNTERS(APIR_X_ATOMIC)
#undef APIR_X_ATOMIC
    _Atomic uint64_t dev_buffers[APIR_HOST_MAX_DEVICES];
    _Atomic uint64_t dev_bytes[APIR_HOST_MAX_DEVICES];
    _Atomic uint64_t dev_graphs[APIR_HOST_MAX_DEVICES];
    /* count, sum_ns, then the buckets (struct apir_latency_hist's order) */
    _Atomic uint64_t command_latency[2 + APIR_LATENCY_BUCKETS];
    _Atomic uint64_t graph_latency[2 + APIR_LATENCY_BUCKETS];
};
_Static_assert(sizeof(struct apir_stats_page) <= APIR_STATS_PAGE_SIZE, "the stats page fits one page");

/* Zeroes the page and writes its header. */
void apir_stats_page_init(struct apir_stats_page *p);
/* A header this build wrote (magic, version, size). */
bool apir_stats_page_valid(const struct apir_stats_page *p);

/*
 * The serving side, after each command: copies the session's counters into
 * the page, and counts the command's time (since last_command_ns, when it
 * began; 0: no command) and its graphs' in the histograms.  Memory only
 * (relaxed atomic stores under the seqlock, one clock read); the per-device
 * buffer split is recounted only when the buffers changed.
 */
void apir_stats_publish(struct apir_stats_page *p, const struct apir_session *s, enum apir_guest_state state,
                        uint64_t last_command_ns, int32_t says_pid);

/* The reading side: a consistent copy, or false (after a bounded number of
 * tries, or a bad header) with whatever was read. */
bool apir_stats_read(const struct apir_stats_page *p, struct apir_guest_counters *out);

/* Adds a departed guest's counters and histograms (not its gauges:
 * buffers, blobs...) to the host's totals, which therefore never go down. */
void apir_stats_retire(struct apir_guest_counters *retired, const struct apir_guest_counters *c);

/* ---- documents ------------------------------------------------------------- */

/* One guest as the daemon sees it: identity from its own records (the
 * kernel's SO_PEERCRED at accept), counters from the guest's page. */
struct apir_guest_row {
    uint64_t id;                 /* guest#N */
    int32_t pid;                 /* SO_PEERCRED, in the host's pid namespace (0: unknown) */
    uint32_t uid, gid;
    char comm[20];               /* /proc/PID/comm at accept: the guest's choice, a hint */
    int32_t worker_pid;          /* the worker process serving it; 0 with thread isolation */
    int32_t slot;                /* its worker slot; -1 with thread isolation */
    uint64_t connected_ns;       /* monotonic */
    bool readable;               /* the page read consistently */
    struct apir_guest_counters c;
};

struct apir_host_view {
    const struct apir_host *host;  /* backend, devices, limits */
    const char *socket_path;
    const char *const *streams;    /* stream endpoints served beside it (tcp:, tls:, vsock:) */
    uint32_t n_streams;
    bool isolated;                 /* process isolation */
    int32_t pid;                   /* the daemon's */
    uint64_t now_ns, start_ns;     /* monotonic */
    int64_t start_unix_ms;         /* wall clock at start */
    uint64_t accepted;             /* guests accepted since start */
    uint64_t refused_connections;  /* connections turned away since start */
    struct apir_guest_counters retired;  /* departed guests' counters */
    uint32_t n_guests;
    struct apir_guest_row *guests;
};

enum apir_stats_format {
    APIR_STATS_TEXT,        /* apir stat */
    APIR_STATS_PS,          /* apir ps: one line per guest */
    APIR_STATS_JSON,        /* apir stat --json, apir ps --json */
    APIR_STATS_PROMETHEUS,  /* the metrics file: Prometheus text exposition format */
    APIR_STATS_PROMETHEUS_PUBLIC,  /* the same without what guests chose (process names): HTTP */
};

/* The version of the JSON document's layout ("format" in it). */
#define APIR_STATS_JSON_FORMAT 1

/* The document, NUL-terminated, malloc'ed (NULL: out of memory); *len its
 * length. */
char *apir_stats_render(const struct apir_host_view *v, enum apir_stats_format f, size_t *len);

#endif
