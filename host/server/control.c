/*
 * The control socket and the metrics file (control.h says what and why).
 */
#include "control.h"
#include "service.h"

#include "apir_log.h"
#include "wait.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* A connection - to the control socket, or to the metrics listener (http):
 * reads its request, writes the answer, then (its write side shut) waits
 * for the client to hang up before closing: closing a socket with bytes
 * unread resets the connection, and the client would lose the answer. */
struct ctl_conn {
    int fd;                 /* -1: free */
    bool http;              /* GET /metrics (metrics_http.h); else a control request line */
    uint64_t deadline_ns;
    char req[APIR_METRICS_HTTP_MAX_REQUEST];
    size_t req_len;
    char *out;              /* the answer being written; NULL: still reading */
    size_t out_len, out_off;
    bool draining;          /* answered: waiting for the client's end */
};

struct apir_control {
    int listen_fd;          /* -1: no control socket */
    char path[108];
    bool has_group;
    gid_t gid;
    /* the control socket's, then the metrics listener's */
    struct ctl_conn conns[APIR_CONTROL_MAX_CONNS + APIR_METRICS_HTTP_MAX_CONNS];
    uint32_t n_conns;
    char *metrics_path, *metrics_tmp;
    uint64_t metrics_interval_ns, next_metrics_ns;
    bool metrics_failing;   /* the last write failed (logged once) */
    struct apir_metrics_http *http;  /* --metrics-listen; NULL: none */
};

#define N_CONNS (APIR_CONTROL_MAX_CONNS + APIR_METRICS_HTTP_MAX_CONNS)

/* Bound under a temporary name, given its mode and group, renamed once
 * listening (as the guest socket: server.c). */
static bool bind_control(struct apir_control *ctl, const char *path, char *err, size_t err_len)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX }, tmp = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "control socket path too long: %s", path);
        return false;
    }
    strcpy(addr.sun_path, path);
    snprintf(ctl->path, sizeof(ctl->path), "%s", path);
    /* A live socket there - another host's control socket, or a socket of
     * another kind (EPROTOTYPE: a guest socket) - is never replaced. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0 && (connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0 || errno == EPROTOTYPE)) {
        close(probe);
        snprintf(err, err_len, "something already answers at %s (another apir-host?): not a control socket to replace",
                 path);
        return false;
    }
    if (probe >= 0)
        close(probe);
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        snprintf(err, err_len, "%s exists and is not a socket (--control)", path);
        return false;
    }
    unlink(path);
    int n = snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d", path, (int)getpid());
    const bool renamed = n > 0 && (size_t)n < sizeof(tmp.sun_path);
    const struct sockaddr_un *at = renamed ? &tmp : &addr;
    if (renamed)
        unlink(tmp.sun_path);
    ctl->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ctl->listen_fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return false;
    }
    const mode_t mode = ctl->has_group ? 0660 : 0600;
    if (bind(ctl->listen_fd, (const struct sockaddr *)at, sizeof(*at)) != 0) {
        snprintf(err, err_len, "cannot bind the control socket %s: %s", path, strerror(errno));
        goto fail;
    }
    if (chmod(at->sun_path, mode) != 0 || (ctl->has_group && chown(at->sun_path, (uid_t)-1, ctl->gid) != 0)) {
        snprintf(err, err_len, "cannot give the control socket %s mode %04o%s: %s", path, (unsigned)mode,
                 ctl->has_group ? " and its group" : "", strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    if (listen(ctl->listen_fd, APIR_CONTROL_MAX_CONNS) != 0 || (renamed && rename(tmp.sun_path, path) != 0)) {
        snprintf(err, err_len, "cannot listen on the control socket %s: %s", path, strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    return true;
fail:
    close(ctl->listen_fd);
    ctl->listen_fd = -1;
    return false;
}

/* The metrics file's folder must exist and be writable: said at start, not
 * at the first write. */
static bool metrics_setup(struct apir_control *ctl, const char *path, unsigned interval_s, char *err, size_t err_len)
{
    struct stat st;
    if (!*path || path[strlen(path) - 1] == '/') {
        snprintf(err, err_len, "--metrics-file %s: not a file name", path);
        return false;
    }
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "--metrics-file %s: exists and is not a regular file", path);
        return false;
    }
    char *dir = strdup(path);
    if (!dir)
        return false;
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
    const char *why = NULL;
    if (stat(d, &st) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(st.st_mode))
        why = "not a folder";
    else if (access(d, W_OK | X_OK) != 0)
        why = strerror(errno);
    const bool ok = !why;
    if (!ok)
        snprintf(err, err_len, "--metrics-file %s: cannot write in %s: %s", path, d, why);
    free(dir);
    if (!ok)
        return false;
    ctl->metrics_path = strdup(path);
    if (!ctl->metrics_path || asprintf(&ctl->metrics_tmp, "%s.tmp", path) < 0) {
        ctl->metrics_tmp = NULL;
        snprintf(err, err_len, "out of memory");
        return false;
    }
    ctl->metrics_interval_ns = (uint64_t)(interval_s ? interval_s : APIR_METRICS_INTERVAL_DEFAULT_S) * 1000000000ull;
    ctl->next_metrics_ns = 0;  /* at once */
    return true;
}

struct apir_control *apir_control_new(const struct apir_control_config *cfg, char *err, size_t err_len)
{
    struct apir_control *ctl = calloc(1, sizeof(*ctl));
    if (!ctl) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    ctl->listen_fd = -1;
    for (uint32_t i = 0; i < N_CONNS; i++)
        ctl->conns[i].fd = -1;
    if (cfg->group && *cfg->group) {
        if (!apir_service_resolve_group(cfg->group, "--control-group", &ctl->gid, err, err_len))
            goto fail;
        ctl->has_group = true;
    }
    if (cfg->metrics_file && !metrics_setup(ctl, cfg->metrics_file, cfg->metrics_interval_s, err, err_len))
        goto fail;
    if (cfg->path && !bind_control(ctl, cfg->path, err, err_len))
        goto fail;
    if (cfg->metrics_listen &&
        !(ctl->http = apir_metrics_http_new(cfg->metrics_listen, ctl->has_group ? &ctl->gid : NULL, err, err_len)))
        goto fail;
    if (ctl->listen_fd >= 0)
        APIR_INFO("host", "control socket unix:%s (mode %s%s): apir stat, apir ps", ctl->path,
                  ctl->has_group ? "0660, group " : "0600", ctl->has_group ? cfg->group : "");
    if (ctl->metrics_path)
        APIR_INFO("host", "metrics: %s, every %llu s", ctl->metrics_path,
                  (unsigned long long)(ctl->metrics_interval_ns / 1000000000ull));
    if (ctl->http)
        APIR_INFO("host", "metrics over HTTP: GET /metrics at %s", apir_metrics_http_where(ctl->http));
    return ctl;
fail:
    apir_control_free(ctl);
    return NULL;
}

static void conn_close(struct apir_control *ctl, uint32_t i)
{
    struct ctl_conn *c = &ctl->conns[i];
    close(c->fd);
    free(c->out);
    *c = (struct ctl_conn){ .fd = -1 };
    ctl->n_conns--;
}

void apir_control_free(struct apir_control *ctl)
{
    if (!ctl)
        return;
    for (uint32_t i = 0; i < N_CONNS; i++)
        if (ctl->conns[i].fd >= 0)
            conn_close(ctl, i);
    if (ctl->listen_fd >= 0) {
        close(ctl->listen_fd);
        unlink(ctl->path);
    }
    apir_metrics_http_free(ctl->http);
    /* A stopped host has no metrics: node_exporter then reports none,
     * rather than the last guests forever. */
    if (ctl->metrics_path && ctl->next_metrics_ns)
        unlink(ctl->metrics_path);
    free(ctl->metrics_path);
    free(ctl->metrics_tmp);
    free(ctl);
}

/*
 * The peer sees the filesystem this daemon sees: it is in the same mount
 * namespace.  A guest in a container that was given the socket's whole
 * folder (a bind mount, a CDI spec) can reach the control socket's file, and
 * may well be root there: it is still refused.  A namespace the daemon
 * cannot read (another user's process, /proc hidden) counts as another:
 * members of --control-group with their own uid get in only when the
 * daemon runs as root (as the systemd unit does), which may read theirs.
 */
static bool same_mount_namespace(pid_t pid)
{
    char path[40], mine[64], theirs[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)pid);
    ssize_t a = readlink("/proc/self/ns/mnt", mine, sizeof(mine));
    ssize_t b = pid > 0 ? readlink(path, theirs, sizeof(theirs)) : -1;
    return a > 0 && a == b && memcmp(mine, theirs, (size_t)a) == 0;
}

/* Root, the daemon's own uid, or a member of the control group; from this
 * machine's own mount namespace. */
static bool peer_allowed(const struct apir_control *ctl, int fd, struct ucred *peer, const char **why)
{
    *why = "not root, the host's user or a member of --control-group";
    if (!apir_peer_cred(fd, peer))
        return false;
    if (!same_mount_namespace(peer->pid)) {
        *why = "in another mount namespace (a container?)";
        return false;
    }
    if (peer->uid == 0 || peer->uid == geteuid())
        return true;
    if (!ctl->has_group)
        return false;
    if (peer->gid == ctl->gid)
        return true;
    gid_t groups[256];
    socklen_t glen = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) != 0)
        return false;
    for (size_t k = 0; k < glen / sizeof(gid_t); k++)
        if (groups[k] == ctl->gid)
            return true;
    return false;
}

/* The answer, from then on written as the socket takes it. */
static void conn_answer(struct ctl_conn *c, char *doc, size_t len)
{
    c->out = doc;
    c->out_len = len;
    c->out_off = 0;
}

static void conn_answer_text(struct ctl_conn *c, const char *text)
{
    char *s = strdup(text);
    if (s)
        conn_answer(c, s, strlen(s));
}

/* New connections on the control socket, or on the metrics listener (http:
 * no peer check - its address or file mode is the check). */
static void accept_conns(struct apir_control *ctl, int listen_fd, bool http)
{
    const uint32_t first = http ? APIR_CONTROL_MAX_CONNS : 0;
    const uint32_t end = http ? N_CONNS : APIR_CONTROL_MAX_CONNS;
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        struct ucred peer = { 0 };
        const char *why = NULL;
        const bool allowed = http || peer_allowed(ctl, fd, &peer, &why);
        if (!allowed)
            APIR_WARN("host", "control connection refused (pid %d, uid %u, gid %u): %s", (int)peer.pid,
                      (unsigned)peer.uid, (unsigned)peer.gid, why);
        uint32_t i = first;
        while (i < end && ctl->conns[i].fd >= 0)
            i++;
        if (i == end) {
            /* No room: a best-effort answer, then closed. */
            const char *text = http ? "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                                      "Connection: close\r\n\r\n"
                               : allowed ? "error: busy; retry\n" : "error: not allowed\n";
            ssize_t w = send(fd, text, strlen(text), MSG_NOSIGNAL);
            (void)w;
            close(fd);
            continue;
        }
        /* A refused peer gets its answer at once and one second to read it. */
        const uint64_t ms = allowed ? APIR_CONTROL_DEADLINE_MS : 1000;
        ctl->conns[i] = (struct ctl_conn){ .fd = fd, .http = http, .deadline_ns = apir_now_ns() + ms * 1000000ull };
        ctl->n_conns++;
        if (!allowed)
            conn_answer_text(&ctl->conns[i], "error: not allowed\n");
        APIR_DEBUG("host", "%s connection (pid %d, uid %u)", http ? "metrics" : "control", (int)peer.pid,
                   (unsigned)peer.uid);
    }
}

/* An HTTP request: read while it comes; once its head is whole (or too
 * long), the answer. */
static void conn_read_http(struct ctl_conn *c, bool eof, apir_control_render_fn render, void *user)
{
    bool with_body = false;
    int status = apir_metrics_http_status(c->req, c->req_len, &with_body);
    if (!status && !eof)
        return;
    size_t len = 0;
    char *out = apir_metrics_http_answer(status ? status : 400, with_body, render, user, &len);
    if (out)
        conn_answer(c, out, len);
}

/* Reads the request line; once whole, makes the answer. */
static void conn_read(struct ctl_conn *c, apir_control_render_fn render, void *user)
{
    bool eof = false;
    /* A control request is one short line; an HTTP head up to the buffer. */
    const size_t cap = c->http ? sizeof(c->req) - 1 : 32;
    for (;;) {
        ssize_t n = read(c->fd, c->req + c->req_len, cap - c->req_len);
        if (n > 0) {
            c->req_len += (size_t)n;
            if (c->req_len == cap || (!c->http && memchr(c->req, '\n', c->req_len)))
                break;
            continue;
        }
        if (n == 0)
            eof = true;
        else if (errno == EINTR)
            continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            eof = true;
        break;
    }
    c->req[c->req_len] = '\0';
    if (c->http) {
        conn_read_http(c, eof, render, user);
        return;
    }
    if (!eof && !memchr(c->req, '\n', c->req_len) && c->req_len < cap)
        return;  /* more to come */
    c->req[strcspn(c->req, "\r\n")] = '\0';
    static const struct { const char *word; enum apir_stats_format format; } requests[] = {
        { "json", APIR_STATS_JSON },
        { "text", APIR_STATS_TEXT },
        { "ps", APIR_STATS_PS },
        { "metrics", APIR_STATS_PROMETHEUS },
    };
    for (size_t k = 0; k < sizeof(requests) / sizeof(requests[0]); k++) {
        if (strcmp(c->req, requests[k].word) != 0)
            continue;
        size_t len = 0;
        char *doc = render(user, requests[k].format, &len);
        if (doc)
            conn_answer(c, doc, len);
        else
            conn_answer_text(c, "error: out of memory\n");
        return;
    }
    if (!strncmp(c->req, "GET ", 4))
        conn_answer_text(c, "error: this is apir-host's control socket, not HTTP: apir-host --metrics-listen ADDR "
                            "answers GET /metrics\n");
    else
        conn_answer_text(c, "error: unknown request (one line: json, text, ps or metrics)\n");
}

/* Writes what the socket takes; true when done. */
static bool conn_write(struct ctl_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;  /* an error ends it */
    }
    return true;
}

static void write_metrics(struct apir_control *ctl, apir_control_render_fn render, void *user)
{
    size_t len = 0;
    char *doc = render(user, APIR_STATS_PROMETHEUS, &len);
    const char *why = NULL;
    int fd = -1, err = 0;
    if (!doc)
        why = "out of memory", err = errno;
    else if ((fd = open(ctl->metrics_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0)
        why = "cannot create the temporary file", err = errno;
    else {
        /* node_exporter (its own user) reads it, whatever the umask. */
        size_t off = 0;
        if (fchmod(fd, 0644) != 0)
            why = "cannot set its mode", err = errno;
        while (!why && off < len) {
            ssize_t n = write(fd, doc + off, len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                why = "cannot write it", err = errno;
            else
                off += (size_t)n;
        }
        if (close(fd) != 0 && !why)
            why = "cannot write it", err = errno;
        if (!why && rename(ctl->metrics_tmp, ctl->metrics_path) != 0)
            why = "cannot rename it into place", err = errno;
        if (why)
            unlink(ctl->metrics_tmp);
    }
    free(doc);
    if (why && !ctl->metrics_failing)
        APIR_WARN("host", "metrics file %s: %s: %s (tried again every interval)", ctl->metrics_path, why,
                  err ? strerror(err) : "short write");
    else if (!why && ctl->metrics_failing)
        APIR_INFO("host", "metrics file %s written again", ctl->metrics_path);
    ctl->metrics_failing = why != NULL;
}

size_t apir_control_poll_fill(struct apir_control *ctl, struct pollfd *pfds)
{
    if (!ctl)
        return 0;
    size_t n = 0;
    if (ctl->listen_fd >= 0)
        pfds[n++] = (struct pollfd){ .fd = ctl->listen_fd, .events = POLLIN };
    if (ctl->http)
        pfds[n++] = (struct pollfd){ .fd = apir_metrics_http_fd(ctl->http), .events = POLLIN };
    for (uint32_t i = 0; i < N_CONNS; i++)
        if (ctl->conns[i].fd >= 0)
            pfds[n++] = (struct pollfd){ .fd = ctl->conns[i].fd,
                                         .events = ctl->conns[i].out && !ctl->conns[i].draining ? POLLOUT : POLLIN };
    return n;
}

void apir_control_poll_done(struct apir_control *ctl, const struct pollfd *pfds, size_t n, apir_control_render_fn render,
                            void *user)
{
    if (!ctl)
        return;
    const uint64_t now = apir_now_ns();
    const int http_fd = apir_metrics_http_fd(ctl->http);
    for (size_t k = 0; k < n; k++) {
        if (pfds[k].fd == ctl->listen_fd || pfds[k].fd == http_fd) {
            if (pfds[k].revents & POLLIN)
                accept_conns(ctl, pfds[k].fd, pfds[k].fd == http_fd);
            continue;
        }
        uint32_t i = 0;
        while (i < N_CONNS && ctl->conns[i].fd != pfds[k].fd)
            i++;
        if (i == N_CONNS)
            continue;
        struct ctl_conn *c = &ctl->conns[i];
        const short rev = pfds[k].revents;
        if (c->draining) {
            /* Whatever the client still sends is dropped; its end ends it. */
            char buf[256];
            ssize_t r = rev ? read(c->fd, buf, sizeof(buf)) : -1;
            if (rev && (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)))
                conn_close(ctl, i);
            else if (now >= c->deadline_ns)
                conn_close(ctl, i);
            continue;
        }
        if (!c->out && (rev & (POLLIN | POLLHUP | POLLERR)))
            conn_read(c, render, user);
        if (c->out && conn_write(c)) {
            shutdown(c->fd, SHUT_WR);
            c->draining = true;
        } else if ((rev & (POLLERR | POLLNVAL)) || now >= c->deadline_ns) {
            conn_close(ctl, i);
        }
    }
    /* Deadlines of connections that saw no event. */
    for (uint32_t i = 0; i < N_CONNS; i++)
        if (ctl->conns[i].fd >= 0 && now >= ctl->conns[i].deadline_ns)
            conn_close(ctl, i);
    if (ctl->metrics_path && now >= ctl->next_metrics_ns) {
        write_metrics(ctl, render, user);
        /* The next one an interval from now (it may drift), never a burst to catch up. */
        ctl->next_metrics_ns = now + ctl->metrics_interval_ns;
    }
}

int apir_control_timeout_ms(const struct apir_control *ctl)
{
    if (!ctl)
        return -1;
    uint64_t next = UINT64_MAX;
    if (ctl->metrics_path)
        next = ctl->next_metrics_ns;
    for (uint32_t i = 0; i < N_CONNS; i++)
        if (ctl->conns[i].fd >= 0 && ctl->conns[i].deadline_ns < next)
            next = ctl->conns[i].deadline_ns;
    if (next == UINT64_MAX)
        return -1;
    const uint64_t now = apir_now_ns();
    if (next <= now)
        return 0;
    uint64_t ms = (next - now) / 1000000ull + 1;
    return ms > 600000 ? 600000 : (int)ms;
}
