/*
 * GET /metrics over HTTP (metrics_http.h says what and why).
 */
#include "metrics_http.h"

#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct apir_metrics_http {
    int listen_fd;
    char unix_path[108];    /* a Unix socket's file, removed at the end; "" for TCP */
    char where[160];
};

const char *apir_metrics_http_where(const struct apir_metrics_http *h)
{
    return h ? h->where : NULL;
}

int apir_metrics_http_fd(const struct apir_metrics_http *h)
{
    return h ? h->listen_fd : -1;
}

static int listen_unix(struct apir_metrics_http *h, const char *path, const gid_t *group, char *err, size_t err_len)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (!*path || strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "--metrics-listen unix:%s: %s", path, *path ? "path too long" : "no path");
        return -1;
    }
    strcpy(addr.sun_path, path);
    struct stat st;
    if (lstat(path, &st) == 0) {
        /* A stale socket of ours is replaced; anything live or not a socket is not. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const bool live = probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0;
        if (probe >= 0)
            close(probe);
        if (!S_ISSOCK(st.st_mode) || live) {
            snprintf(err, err_len, "--metrics-listen unix:%s: %s", path,
                     live ? "something already answers there" : "exists and is not a socket");
            return -1;
        }
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, err_len, "--metrics-listen: socket: %s", strerror(errno));
        return -1;
    }
    /* Bound with no permission for anyone, then opened to its readers. */
    const mode_t old = umask(0777);
    const int bound = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    umask(old);
    const mode_t mode = group ? 0660 : 0600;
    if (bound != 0 || chmod(path, mode) != 0 || (group && chown(path, (uid_t)-1, *group) != 0) || listen(fd, 16) != 0) {
        snprintf(err, err_len, "--metrics-listen unix:%s: %s", path, strerror(errno));
        if (bound == 0)
            unlink(path);
        close(fd);
        return -1;
    }
    snprintf(h->unix_path, sizeof(h->unix_path), "%s", path);
    snprintf(h->where, sizeof(h->where), "unix:%s (mode %04o)", path, (unsigned)mode);
    return fd;
}

static int listen_tcp(struct apir_metrics_http *h, const char *addr, char *err, size_t err_len)
{
    char endpoint[160];
    snprintf(endpoint, sizeof(endpoint), "%s%s", strncmp(addr, "tcp:", 4) ? "tcp:" : "", addr);
    struct apir_net_addr na;
    char why[160];
    if (!apir_net_parse(endpoint, &na, why, sizeof(why)) || na.kind != APIR_NET_TCP || na.tls) {
        snprintf(err, err_len, "--metrics-listen %s: not HOST:PORT or unix:PATH (%s)", addr, why);
        return -1;
    }
    bool loopback = false;
    int fd = apir_net_listen(&na, &loopback, why, sizeof(why));
    if (fd < 0) {
        snprintf(err, err_len, "--metrics-listen %s: %s", addr, why);
        return -1;
    }
    if (!loopback) {
        /* Metrics name guests by uid and pid: the machine's users only.
         * A scraper elsewhere goes through a proxy or node_exporter. */
        snprintf(err, err_len, "--metrics-listen %s: not a loopback address; serve the metrics on 127.0.0.1, [::1] "
                 "or unix:PATH (a local proxy, or node_exporter with --metrics-file, takes them further)", addr);
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const bool v6 = strchr(na.host, ':') != NULL;
    snprintf(h->where, sizeof(h->where), "http://%s%s%s:%u/metrics", v6 ? "[" : "", na.host, v6 ? "]" : "",
             (unsigned)apir_net_local_port(fd));
    return fd;
}

struct apir_metrics_http *apir_metrics_http_new(const char *addr, const gid_t *group, char *err, size_t err_len)
{
    struct apir_metrics_http *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    h->listen_fd = !strncmp(addr, "unix:", 5) ? listen_unix(h, addr + 5, group, err, err_len)
                                              : listen_tcp(h, addr, err, err_len);
    if (h->listen_fd < 0) {
        free(h);
        return NULL;
    }
    return h;
}

void apir_metrics_http_free(struct apir_metrics_http *h)
{
    if (!h)
        return;
    close(h->listen_fd);
    if (h->unix_path[0])
        unlink(h->unix_path);
    free(h);
}

int apir_metrics_http_status(const char *req, size_t len, bool *with_body)
{
    *with_body = false;
    /* The head ends with an empty line; only its first line is read. */
    const char *end = NULL;
    for (size_t i = 0; i + 1 < len && !end; i++)
        if (req[i] == '\n' && (req[i + 1] == '\n' || (req[i + 1] == '\r' && i + 2 < len && req[i + 2] == '\n')))
            end = req + i;
    if (!end)  /* the buffer holds APIR_METRICS_HTTP_MAX_REQUEST - 1 bytes and a NUL */
        return len >= APIR_METRICS_HTTP_MAX_REQUEST - 1 ? 431 : 0;
    const char *nl = memchr(req, '\n', len);
    size_t line = (size_t)(nl - req);
    if (line && req[line - 1] == '\r')
        line--;
    /* METHOD SP TARGET SP HTTP/1.x, nothing else on the line. */
    char method[8], target[256], version[16];
    const char *sp1 = memchr(req, ' ', line), *sp2 = sp1 ? memchr(sp1 + 1, ' ', line - (size_t)(sp1 + 1 - req)) : NULL;
    if (!sp1 || !sp2 || (size_t)(sp1 - req) >= sizeof(method) || (size_t)(sp2 - sp1 - 1) >= sizeof(target) ||
        line - (size_t)(sp2 + 1 - req) >= sizeof(version))
        return 400;
    snprintf(method, sizeof(method), "%.*s", (int)(sp1 - req), req);
    snprintf(target, sizeof(target), "%.*s", (int)(sp2 - sp1 - 1), sp1 + 1);
    snprintf(version, sizeof(version), "%.*s", (int)(line - (size_t)(sp2 + 1 - req)), sp2 + 1);
    if (strcmp(version, "HTTP/1.0") && strcmp(version, "HTTP/1.1"))
        return 400;
    const bool get = !strcmp(method, "GET"), head = !strcmp(method, "HEAD");
    if (!get && !head)
        return 405;
    target[strcspn(target, "?")] = '\0';  /* Prometheus may add parameters; none is used */
    if (strcmp(target, "/metrics"))
        return 404;
    *with_body = get;
    return 200;
}

static const char *status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

char *apir_metrics_http_answer(int status, bool with_body, apir_metrics_render_fn render, void *user, size_t *len)
{
    size_t doc_len = 0;
    char *doc = NULL;
    if (status == 200) {
        doc = render(user, APIR_STATS_PROMETHEUS_PUBLIC, &doc_len);
        if (!doc)
            status = 503;
    }
    char body[128] = "";
    if (status != 200) {
        snprintf(body, sizeof(body), "%d %s (this socket answers GET /metrics)\n", status, status_text(status));
        doc_len = strlen(body);
    }
    char head[300];
    const int n = snprintf(head, sizeof(head),
                           "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                           "%sConnection: close\r\n\r\n",
                           status, status_text(status),
                           status == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8",
                           doc_len, status == 405 ? "Allow: GET, HEAD\r\n" : "");
    const size_t body_len = status == 200 && !with_body ? 0 : doc_len;
    char *out = malloc((size_t)n + body_len);
    if (out) {
        memcpy(out, head, (size_t)n);
        memcpy(out + n, status == 200 ? doc : body, body_len);
        *len = (size_t)n + body_len;
    }
    free(doc);
    return out;
}
