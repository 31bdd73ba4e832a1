/*
 * apir-host's metrics over HTTP (--metrics-listen ADDR): GET /metrics
 * answered with the Prometheus text exposition format, the document the
 * control socket's "metrics" request and the metrics file hold (host_stats.c
 * renders it), less what guests chose (their process names).
 *
 * The listener is an attack surface, so it is small and bounded: loopback
 * addresses (127.0.0.0/8, ::1) or a Unix socket only (mode 0600, or 0660 in
 * --control-group's group); at most APIR_METRICS_HTTP_MAX_CONNS connections
 * at once, each closed after APIR_CONTROL_DEADLINE_MS (control.h); a request head
 * of less than APIR_METRICS_HTTP_MAX_REQUEST bytes, of which only the request
 * line is read (method GET or HEAD, path /metrics, HTTP/1.x); one answer per
 * connection (Connection: close).  Its connections are the control
 * channel's (control.c), served by the daemon's poll loop: no thread,
 * nothing on a guest's path.
 */
#ifndef APIR_METRICS_HTTP_H
#define APIR_METRICS_HTTP_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "host_stats.h"

#define APIR_METRICS_HTTP_MAX_CONNS   8
#define APIR_METRICS_HTTP_MAX_REQUEST 4096

struct apir_metrics_http;

/* The document: malloc'ed, NULL when out of memory (control.h's render). */
typedef char *(*apir_metrics_render_fn)(void *user, enum apir_stats_format format, size_t *len);

/* Listens at addr: "HOST:PORT" or "tcp:HOST:PORT" (a loopback address;
 * port 0: one the kernel picks), or "unix:PATH".  group: the Unix socket's
 * group (mode 0660), else NULL (0600).  NULL with the reason in err. */
struct apir_metrics_http *apir_metrics_http_new(const char *addr, const gid_t *group, char *err, size_t err_len);
/* Closes the listener and removes a Unix socket's file. */
void apir_metrics_http_free(struct apir_metrics_http *h);
/* The listening socket (non-blocking), for the control channel's poll. */
int apir_metrics_http_fd(const struct apir_metrics_http *h);
/* "http://127.0.0.1:9464/metrics" or "unix:PATH (mode 0600)", for the log. */
const char *apir_metrics_http_where(const struct apir_metrics_http *h);

/* The status of the answer to a request head: 0 while the head has not
 * ended (more bytes to read); *with_body: the document goes with it (GET
 * /metrics). */
int apir_metrics_http_status(const char *req, size_t len, bool *with_body);
/* The whole answer, head and body, malloc'ed (NULL: out of memory). */
char *apir_metrics_http_answer(int status, bool with_body, apir_metrics_render_fn render, void *user, size_t *len);

#endif
