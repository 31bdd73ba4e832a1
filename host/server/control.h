/*
 * apir-host's control channel and metrics file: what a running host does,
 * for its operator (host_stats.h makes the documents).
 *
 *  - The control socket (--control unix:PATH; default the guest socket's path
 *    with ".ctl" appended): a Unix stream socket of its own, never the guests'
 *    socket.  Mode 0600 - the daemon's user and root - or 0660 in the group
 *    --control-group names.  Every peer is checked again by SO_PEERCRED (root,
 *    the daemon's uid, or a member of that group, in the daemon's own mount
 *    namespace), so a file mode loosened by hand lets nobody else in, nor
 *    does a container - root in it or not - given the socket's folder.  A
 *    client writes one line - "json", "text", "ps" or "metrics" - and reads
 *    the document until the host closes.
 *  - The metrics file (--metrics-file PATH): the Prometheus text exposition
 *    format, for node_exporter's textfile collector, rewritten every
 *    --metrics-interval seconds through a temporary file and a rename (a
 *    reader never sees half a file), removed when the host stops.
 *  - The metrics listener (--metrics-listen ADDR, metrics_http.h): the same
 *    document for Prometheus' scrape, GET /metrics over HTTP, on a loopback
 *    address or a Unix socket.
 *
 * Both are served by the daemon's poll loop (server.c): the sockets are
 * non-blocking, at most APIR_CONTROL_MAX_CONNS clients at once, each closed
 * after APIR_CONTROL_DEADLINE_MS; the metrics deadline is the loop's poll
 * timeout.  No thread, nothing on a guest's path.
 */
#ifndef APIR_CONTROL_H
#define APIR_CONTROL_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host_stats.h"
#include "metrics_http.h"

#define APIR_CONTROL_MAX_CONNS   8
/* the control socket and the metrics listener, and their connections */
#define APIR_CONTROL_MAX_POLL    (2 + APIR_CONTROL_MAX_CONNS + APIR_METRICS_HTTP_MAX_CONNS)
#define APIR_CONTROL_DEADLINE_MS 5000
#define APIR_METRICS_INTERVAL_DEFAULT_S 10

struct apir_control_config {
    const char *path;           /* the control socket; NULL: none */
    const char *group;          /* its group (mode 0660); NULL: owner only (0600) */
    const char *metrics_file;   /* NULL: none */
    unsigned metrics_interval_s;
    const char *metrics_listen; /* HTTP /metrics: HOST:PORT (loopback) or unix:PATH; NULL: none */
};

struct apir_control;

/* The document asked for, malloc'ed (NULL: out of memory). */
typedef char *(*apir_control_render_fn)(void *user, enum apir_stats_format format, size_t *len);

/* Binds the control socket and the metrics listener and checks the metrics
 * file's folder; NULL with a message in err. */
struct apir_control *apir_control_new(const struct apir_control_config *cfg, char *err, size_t err_len);
/* Closes every connection, removes the socket files and the metrics file. */
void apir_control_free(struct apir_control *ctl);

/* The poll loop: fills at most APIR_CONTROL_MAX_POLL entries (returns how
 * many), then hands them back after poll. */
size_t apir_control_poll_fill(struct apir_control *ctl, struct pollfd *pfds);
void apir_control_poll_done(struct apir_control *ctl, const struct pollfd *pfds, size_t n, apir_control_render_fn render,
                            void *user);
/* Milliseconds until the control channel needs the loop again (the next
 * metrics file, a client's deadline); -1: not before an event. */
int apir_control_timeout_ms(const struct apir_control *ctl);

#endif
