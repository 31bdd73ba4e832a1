/*
 * apir-host's server: the listener and its poll loop, the connections that
 * wait for their hello or linger after a refusal, and the server's life
 * (listen, adopt, run, stop).  It accepts guests on a Unix socket and hands
 * each to a client served on a thread (client.c, client_shm.c) or to a
 * worker process (workers.c), once admission (admission.c) lets it in.  The
 * stream endpoints (tcp:, tls:, vsock:; stream.c) share this loop, its
 * admission, limits, workers and stats: only their framing is their own.
 *
 * Threads: the main thread polls the listening socket and every guest socket
 * for hang-up only (it never reads a guest socket after the hello); each
 * worker owns its guest's session and socket reads.  A client is freed by
 * whichever of the two lets go last (a reference count), so a guest that dies
 * mid-graph is freed when the graph returns, and the main loop never blocks
 * on a worker.
 *
 * Denial of service: the accept loop never waits for a guest, and what a
 * connection costs is charged to its own tenant only (admission, below;
 * server_impl.h): a local peer's container - its cgroup, read at accept
 * from the kernel's word (SO_PEERCRED), with its uid - or its uid, or a
 * stream peer's address.  Before its hello a connection takes a place among
 * the pending (polled with the rest, closed at its deadline) within its
 * tenant's connection count and connect bucket, nothing else: no worker, no
 * thread, no session.  Once its hello is in - and for tcp: its token
 * checked - its tenant's spawn bucket pays for the worker process (which
 * reads and checks the hello) or the session.  So a peer that connects and
 * hangs up in a loop, or holds silent connections, exhausts only its own
 * buckets and counts.  A worker process whose guest hangs up in the middle
 * of a command, or whose command runs past the time budget, ends itself: a
 * kernel cannot be interrupted otherwise.  In one process the CPU backend's abort callback stops a graph
 * between nodes instead.  A guest's log lines come out of its session's
 * budget (apir_log.h); a tenant's, before it is a guest, out of its own.
 *
 * The socket: bound here with the mode and group asked for (0660 by
 * default), or passed by a service manager (socket activation,
 * host/server/service.c), which then owns the file.  Guests are named in the log
 * by what the kernel says of them (SO_PEERCRED: pid, uid, gid), not by the
 * pid their hello claims.
 *
 * What the host does (apir stat, apir ps, the metrics file: host_stats.h,
 * control.h): whoever serves a guest - its thread here, or its worker
 * process - publishes the session's counters into a stats page after each
 * command (memory stores only); this loop reads the pages when the control
 * socket asks or the metrics file is due (its poll timeout), and adds a
 * departed guest's counters to the totals when it lets go of it.
 */
#include "server.h"
#include "server_impl.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "service.h"
#include "dispatcher.h"
#include "net.h"
#include "shm_proto.h"
#include "tls.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif


void apir_server_status_changed(struct apir_server *srv)
{
    if (srv->listen_fd < 0 || !apir_service_notify_enabled())
        return;
    unsigned n = srv->worker_argv ? srv->n_children : 0;
    for (const struct apir_client *c = srv->clients; c; c = c->next)
        n++;
    apir_service_status("serving %u guest%s on unix:%s", n, n == 1 ? "" : "s", srv->path);
}


uint64_t apir_server_next_id(struct apir_server *srv)
{
    return srv->listen_fd < 0 && !srv->n_net ? srv->next_id : ++srv->next_id;
}


/* A refused connection: kept open until the guest has read why. */
void apir_server_linger_close(struct apir_server *srv, int fd)
{
    shutdown(fd, SHUT_WR);
    if (srv->n_lingering == sizeof(srv->lingering) / sizeof(srv->lingering[0])) {
        close(srv->lingering[0]);
        memmove(srv->lingering, srv->lingering + 1, (srv->n_lingering - 1) * sizeof(int));
        srv->n_lingering--;
    }
    srv->lingering[srv->n_lingering++] = fd;
}

/* A lingering socket spoke or hung up: drain it (closing any fds it sent);
 * close it once the guest has gone. */
static void linger_service(struct apir_server *srv, uint32_t i, short revents)
{
    int fd = srv->lingering[i];
    if (!(revents & (POLLHUP | POLLERR | POLLNVAL))) {
        char buf[256];
        int fds[4], n_fds;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        while (poll(&p, 1, 0) > 0 && (p.revents & POLLIN) && apir_recv_fds(fd, buf, sizeof(buf), fds, 4, &n_fds, 0) > 0)
            for (int k = 0; k < n_fds; k++)
                close(fds[k]);
        if (!(p.revents & (POLLHUP | POLLERR)))
            return;
    }
    close(fd);
    srv->lingering[i] = srv->lingering[--srv->n_lingering];
}


/* A new connection waits for its hello among the polled (either isolation). */
void apir_server_add_pending(struct apir_server *srv, int fd, const struct ucred *peer, uint64_t tenant,
                             bool stream, bool tls)
{
    if (srv->n_pending == APIR_MAX_PENDING) {
        const char *why = "too many connections waiting for their hello";
        if (stream) {
            char name[64];
            apir_net_peer_name(fd, name, sizeof(name));
            apir_stream_refuse(srv, fd, name, tls, why);
        } else {
            apir_server_refuse(srv, fd, why);
            apir_server_linger_close(srv, fd);
        }
        return;
    }
    uint64_t deadline = apir_now_ns() + (uint64_t)srv->host->cfg.limits.handshake_timeout_ms * 1000000ull;
    srv->pending[srv->n_pending++] = (struct pending_conn){ .fd = fd, .peer = *peer, .tenant = tenant,
                                                            .deadline_ns = deadline, .stream = stream, .tls = tls };
}

/*
 * A Unix socket guest that spoke: its hello is in (or it hung up).  With
 * workers, the daemon only looks (a byte peeked: nothing is read, no
 * descriptor taken) and hands the connection on; the worker reads and
 * checks the hello.  So a connection that says nothing, or hangs up, never
 * costs a worker.
 */
static void pending_spoke(struct apir_server *srv, const struct pending_conn *p)
{
    if (!srv->worker_argv) {
        apir_client_shm_accept(srv, p->fd, &p->peer, srv->tenant_now, 0);
        return;
    }
    char b;
    const ssize_t n = recv(p->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
        APIR_DEBUG("host", "connection (%s) closed before its hello", srv->tenant_now->name);
        close(p->fd);
        return;
    }
    const char *why = apir_admit_guest(srv, srv->tenant_now);
    if (why) {
        apir_server_refuse(srv, p->fd, why);
        apir_server_linger_close(srv, p->fd);
        return;
    }
    const uint32_t before = srv->n_children;
    apir_workers_spawn(srv, p->fd, &p->peer, NULL, false);
    apir_tenant_spawned(srv, p->tenant, before);
}

/* A pending connection spoke (its hello, read without waiting) or timed out. */
static void pending_service(struct apir_server *srv, uint32_t i, short revents, uint64_t now)
{
    struct pending_conn p = srv->pending[i];
    if (!revents && now < p.deadline_ns)
        return;
    apir_tenant_enter(srv, p.tenant, NULL);
    if (p.stream) {
        if (apir_stream_pending(srv, &srv->pending[i], revents, now))
            srv->pending[i] = srv->pending[--srv->n_pending];
        apir_tenant_leave(srv);
        return;
    }
    srv->pending[i] = srv->pending[--srv->n_pending];
    if (revents) {
        pending_spoke(srv, &p);
    } else {
        char who[160];
        apir_peer_describe(&p.peer, true, who, sizeof(who));
        APIR_WARN("host", "connection (%s) sent no hello in %u ms: closed", who, srv->host->cfg.limits.handshake_timeout_ms);
        close(p.fd);
    }
    apir_tenant_leave(srv);
}

/* A new connection on the listening socket: nothing is spent on it but a
 * place among the pending, and only within its tenant's share. */
static void accept_new(struct apir_server *srv)
{
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ucred peer;
    apir_peer_cred(fd, &peer);
    if (peer.uid == (uid_t)-1) {
        apir_server_refuse(srv, fd, "peer credentials unknown");
        apir_server_linger_close(srv, fd);
        return;
    }
    char name[96];
    const uint64_t key = apir_tenant_local_key(srv, fd, &peer, name, sizeof(name));
    struct apir_tenant *t = apir_tenant_enter(srv, key, name);
    const char *why = apir_admit_connection(srv, t);
    if (why) {
        apir_server_refuse(srv, fd, why);
        apir_server_linger_close(srv, fd);
    } else {
        apir_server_add_pending(srv, fd, &peer, key, false, false);
    }
    apir_tenant_leave(srv);
}

static void drop_client(struct apir_server *srv, struct apir_client *c)
{
    struct apir_client **pp = &srv->clients;
    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    /* Its counters join the totals as it leaves the list (what a command
     * still running adds afterwards is not counted). */
    struct apir_guest_counters last;
    apir_stats_read(c->stats, &last);
    apir_stats_retire(&srv->retired, &last);
    atomic_store(&c->dead, true);
    shutdown(c->fd, SHUT_RDWR);            /* unblocks a worker in recvmsg */
    if (c->ctrl)
        apir_futex_wake(&c->ctrl->cmd_seq); /* and one asleep on the doorbell */
    apir_client_put(c);
    apir_server_status_changed(srv);
}

void apir_server_listen_options_default(struct apir_server_listen_options *opts)
{
    opts->mode = APIR_SHM_SOCKET_MODE_DEFAULT;
    opts->group = NULL;
    const char *m = getenv("APIR_SOCKET_MODE");
    if (m && *m && apir_server_parse_socket_mode(m, &opts->mode) != 0) {
        APIR_WARN("host", "APIR_SOCKET_MODE=%s is not an octal mode (0 to 0777): using %04o", m,
                  APIR_SHM_SOCKET_MODE_DEFAULT);
        opts->mode = APIR_SHM_SOCKET_MODE_DEFAULT;
    }
    const char *g = getenv("APIR_SOCKET_GROUP");
    if (g && *g)
        opts->group = g;
}

int apir_server_parse_socket_mode(const char *s, unsigned *mode)
{
    unsigned v = 0;
    if (!s || !*s || strlen(s) > 4)
        return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '7')
            return -1;
        v = v * 8 + (unsigned)(*p - '0');
    }
    if (v > 0777)
        return -1;
    *mode = v;
    return 0;
}

const char *apir_server_path(const struct apir_server *srv)
{
    return srv->path;
}

bool apir_server_control(struct apir_server *srv, const struct apir_control_config *cfg, char *err,
                             size_t err_len)
{
    if (srv->control || srv->listen_fd < 0) {
        snprintf(err, err_len, "the control channel is the daemon's, set once");
        return false;
    }
    srv->control = apir_control_new(cfg, err, err_len);
    return srv->control != NULL;
}

/* The guests served on threads here, as rows of a view. */
static uint32_t thread_rows(struct apir_server *srv, struct apir_guest_row *rows, uint32_t max)
{
    uint32_t n = 0;
    for (const struct apir_client *c = srv->clients; c && n < max; c = c->next, n++) {
        struct apir_guest_row *r = &rows[n];
        *r = (struct apir_guest_row){ .id = c->id, .pid = c->peer.pid, .uid = c->peer.uid, .gid = c->peer.gid,
                                      .slot = -1, .connected_ns = c->connected_ns };
        snprintf(r->comm, sizeof(r->comm), "%s", c->comm);
        r->readable = apir_stats_read(c->stats, &r->c);
    }
    return n;
}

/* Renders the document the control socket or the metrics file asks for:
 * a view of the host made now (apir_control_render_fn). */
static char *render_view(void *user, enum apir_stats_format format, size_t *len)
{
    struct apir_server *srv = user;
    uint32_t max = 0;
    for (const struct apir_client *c = srv->clients; c; c = c->next)
        max++;
    if (srv->worker_argv)
        max += srv->n_children;
    const char *streams[APIR_MAX_NET_LISTENERS];
    for (uint32_t i = 0; i < srv->n_net; i++)
        streams[i] = srv->net[i].endpoint;
    struct apir_host_view v = {
        .host = srv->host,
        .socket_path = srv->path,
        .streams = streams,
        .n_streams = srv->n_net,
        .isolated = srv->worker_argv != NULL,
        .pid = (int32_t)getpid(),
        .now_ns = apir_now_ns(),
        .start_ns = srv->start_ns,
        .start_unix_ms = srv->start_unix_ms,
        .accepted = srv->next_id,
        .refused_connections = srv->refused_connections,
        .retired = srv->retired,
        .guests = calloc(max ? max : 1, sizeof(struct apir_guest_row)),
    };
    if (!v.guests)
        return NULL;
    v.n_guests = srv->worker_argv ? apir_workers_rows(srv, v.guests, max) : thread_rows(srv, v.guests, max);
    char *doc = apir_stats_render(&v, format, len);
    free(v.guests);
    return doc;
}

/* A server with its wake-up pipes and no socket yet. */
static struct apir_server *server_alloc(struct apir_host *host, char *err, size_t err_len)
{
    struct apir_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    srv->host = host;
    srv->start_ns = apir_now_ns();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    srv->start_unix_ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000;
    srv->listen_fd = -1;
    srv->lane_in_fd = -1;
    srv->stop_pipe[0] = srv->stop_pipe[1] = -1;
    srv->child_pipe[0] = srv->child_pipe[1] = -1;
    if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(srv->child_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, err_len, "pipe: %s", strerror(errno));
        if (srv->stop_pipe[0] >= 0) {
            close(srv->stop_pipe[0]);
            close(srv->stop_pipe[1]);
        }
        free(srv);
        return NULL;
    }
    return srv;
}

/* Undoes server_alloc and closes the listening socket (its file is the
 * caller's business). */
static void server_discard(struct apir_server *srv)
{
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    close(srv->stop_pipe[0]);
    close(srv->stop_pipe[1]);
    close(srv->child_pipe[0]);
    close(srv->child_pipe[1]);
    free(srv);
}

static int sock_int(int fd, int opt)
{
    int v = -1;
    socklen_t len = sizeof(v);
    return getsockopt(fd, SOL_SOCKET, opt, &v, &len) == 0 ? v : -1;
}

struct apir_server *apir_server_adopt(struct apir_host *host, int fd, char *err, size_t err_len)
{
    struct sockaddr_un addr = { 0 };
    socklen_t alen = sizeof(addr);
    if (sock_int(fd, SO_DOMAIN) != AF_UNIX || sock_int(fd, SO_TYPE) != SOCK_SEQPACKET) {
        snprintf(err, err_len, "fd %d is not an AF_UNIX SOCK_SEQPACKET socket (ListenSequentialPacket= in the socket unit)", fd);
        close(fd);
        return NULL;
    }
    if (sock_int(fd, SO_ACCEPTCONN) != 1) {
        snprintf(err, err_len, "fd %d is not a listening socket (Accept=no in the socket unit)", fd);
        close(fd);
        return NULL;
    }
    struct apir_server *srv = server_alloc(host, err, err_len);
    if (!srv) {
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);  /* workers must not hold the listening socket */
    srv->listen_fd = fd;
    srv->activated = true;
    const size_t off = offsetof(struct sockaddr_un, sun_path);
    if (getsockname(fd, (struct sockaddr *)&addr, &alen) != 0 || alen <= off)
        snprintf(srv->path, sizeof(srv->path), "(unnamed socket, fd %d)", fd);
    else if (addr.sun_path[0] == '\0')  /* abstract namespace */
        snprintf(srv->path, sizeof(srv->path), "@%.*s", (int)(alen - off - 1), addr.sun_path + 1);
    else
        snprintf(srv->path, sizeof(srv->path), "%.*s", (int)strnlen(addr.sun_path, alen - off), addr.sun_path);
    return srv;
}

/*
 * The socket's directory (e.g. $XDG_RUNTIME_DIR/apir, /run/apir), created if
 * missing: the owner's, searchable by the group and others only as far as
 * the socket's mode lets them connect, and in the socket's group.
 */
static bool make_socket_dir(const char *dir, unsigned mode, bool has_group, gid_t gid, char *err, size_t err_len)
{
    const mode_t dmode = 0700 | ((mode & 0060) ? 0010 : 0) | ((mode & 0006) ? 0001 : 0);
    if (mkdir(dir, dmode) == 0) {
        if (chmod(dir, dmode) != 0 || (has_group && chown(dir, (uid_t)-1, gid) != 0)) {
            snprintf(err, err_len, "cannot set the mode or group of %s: %s", dir, strerror(errno));
            return false;
        }
        return true;
    }
    if (errno != EEXIST) {
        snprintf(err, err_len, "cannot create %s: %s", dir, strerror(errno));
        return false;
    }
    struct stat st;
    if (has_group && stat(dir, &st) == 0 && (mode & 0060) && !(st.st_mode & 0011))
        APIR_WARN("host", "%s is mode %04o: members of the socket's group cannot reach the socket in it",
                  dir, (unsigned)(st.st_mode & 07777));
    return true;
}

struct apir_server *apir_server_listen(struct apir_host *host, const char *path,
                                               const struct apir_server_listen_options *opts, char *err, size_t err_len)
{
    /* Socket activation first: systemd's socket unit has bound and set
     * the socket up (SocketMode=, SocketGroup=). */
    int passed = apir_service_listen_fd(err, err_len);
    if (passed == -2)
        return NULL;
    if (passed >= 0) {
        struct apir_server *srv = apir_server_adopt(host, passed, err, err_len);
        if (srv)
            APIR_INFO("host", "socket activation: serving the socket the service manager passed (unix:%s)%s%s", srv->path,
                      path && strcmp(path, srv->path) != 0 ? "; not binding " : "",
                      path && strcmp(path, srv->path) != 0 ? path : "");
        return srv;
    }
    struct apir_server_listen_options defaults;
    if (!opts) {
        apir_server_listen_options_default(&defaults);
        opts = &defaults;
    }
    if (opts->mode > 0777) {
        snprintf(err, err_len, "socket mode %o out of range (0 to 0777)", opts->mode);
        return NULL;
    }
    gid_t gid = (gid_t)-1;
    const bool has_group = opts->group && *opts->group;
    if (has_group && !apir_service_resolve_group(opts->group, "--socket-group", &gid, err, err_len))
        return NULL;

    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "socket path too long: %s", path);
        return NULL;
    }
    char dir[sizeof(addr.sun_path)];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (!make_socket_dir(dir, opts->mode, has_group, gid, err, err_len))
            return NULL;
    }
    struct apir_server *srv = server_alloc(host, err, err_len);
    if (!srv)
        return NULL;
    snprintf(srv->path, sizeof(srv->path), "%s", path);
    srv->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    strcpy(addr.sun_path, path);
    if (srv->listen_fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        goto fail;
    }
    /* A socket file left by a host that died: replace it, unless a live host
     * still answers there. */
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
        close(probe);
        snprintf(err, err_len, "another apir-host is serving %s", path);
        goto fail;
    }
    if (probe >= 0)
        close(probe);
    unlink(path);
    /* Bound under a temporary name, given its mode and group, and renamed
     * once listening: a client that sees the socket file can connect
     * (between bind and listen it would be refused), and never sees it with
     * the umask's mode. */
    struct sockaddr_un tmp = { .sun_family = AF_UNIX };
    int n = snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d", path, (int)getpid());
    const bool renamed = n > 0 && (size_t)n < sizeof(tmp.sun_path);
    const struct sockaddr_un *at = renamed ? &tmp : &addr;
    if (renamed)
        unlink(tmp.sun_path);
    if (bind(srv->listen_fd, (const struct sockaddr *)at, sizeof(*at)) != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, strerror(errno));
        goto fail;
    }
    if (chmod(at->sun_path, (mode_t)opts->mode) != 0 || (has_group && chown(at->sun_path, (uid_t)-1, gid) != 0)) {
        snprintf(err, err_len, "cannot give %s mode %04o%s%s: %s", path, opts->mode, has_group ? " and group " : "",
                 has_group ? opts->group : "", strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    if (listen(srv->listen_fd, 64) != 0 || (renamed && rename(tmp.sun_path, path) != 0)) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    APIR_DEBUG("host", "socket %s: mode %04o, group %s", path, opts->mode, has_group ? opts->group : "(the daemon's)");
    return srv;
fail:
    server_discard(srv);
    return NULL;
}

struct apir_server *apir_server_new(struct apir_host *host, const char *path, char *err, size_t err_len)
{
    return apir_server_listen(host, path, NULL, err, err_len);
}

/* A worker process's server: one connection (fd), no listening socket; it
 * ends with its guest. */
static struct apir_server *worker_server(struct apir_host *host, int fd, uint64_t client_id,
                                             struct apir_stats_page *stats)
{
    char err[64];
    struct apir_server *srv = server_alloc(host, err, sizeof(err));
    if (!srv)
        return NULL;
    srv->next_id = client_id;
    srv->worker_stats = apir_stats_page_valid(stats) ? stats : NULL;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return srv;
}

static int worker_serve(struct apir_server *srv)
{
    int rc = srv->clients ? apir_server_run(srv) : -1;
    apir_server_free(srv);
    return rc;
}

int apir_server_serve_shm_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                      const struct ucred *peer)
{
    struct apir_server *srv = worker_server(host, fd, client_id, stats);
    if (!srv)
        return -1;
    struct ucred own;
    if (!peer)
        apir_peer_cred(fd, &own);
    apir_client_shm_accept(srv, fd, peer ? peer : &own, NULL, (int)host->cfg.limits.handshake_timeout_ms);
    return worker_serve(srv);
}

int apir_server_serve_stream_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                         const char *peer_name, struct apir_tls_keys *tls_keys, int lane_fd)
{
    struct apir_server *srv = worker_server(host, fd, client_id, stats);
    if (!srv) {
        apir_tls_keys_free(tls_keys);
        if (lane_fd >= 0)
            close(lane_fd);
        return -1;
    }
    srv->tls_keys = tls_keys;
    /* Its lanes: the daemon wrote the ticket first (workers.c). */
    if (lane_fd >= 0) {
        fcntl(lane_fd, F_SETFD, FD_CLOEXEC);
        if (recv(lane_fd, srv->lane_ticket, sizeof(srv->lane_ticket), MSG_DONTWAIT) == (ssize_t)sizeof(srv->lane_ticket)) {
            srv->lane_in_fd = lane_fd;
        } else {
            APIR_WARN("host", "worker: no lane ticket from the daemon: its guest gets no lanes");
            close(lane_fd);
        }
    }
    apir_stream_start_client(srv, fd, peer_name && *peer_name ? peer_name : "stream peer", 0, tls_keys != NULL);
    return worker_serve(srv);
}

void apir_server_stop(struct apir_server *srv)
{
    char b = 1;
    ssize_t r = write(srv->stop_pipe[1], &b, 1);
    (void)r;
}

/* How long the main loop may sleep: until the next handshake deadline, or
 * the next look at a worker's command clock. */
static int poll_timeout_ms(const struct apir_server *srv)
{
    const struct apir_limits *l = &srv->host->cfg.limits;
    if (srv->listen_fd < 0)
        return l->graph_timeout_ms ? (int)(l->graph_timeout_ms < 1000 ? l->graph_timeout_ms : 1000) : -1;
    if (!srv->n_pending)
        return -1;
    uint64_t next = UINT64_MAX, now = apir_now_ns();
    for (uint32_t i = 0; i < srv->n_pending; i++)
        if (srv->pending[i].deadline_ns < next)
            next = srv->pending[i].deadline_ns;
    return next <= now ? 0 : (int)((next - now) / 1000000ull + 1);
}

int apir_server_run(struct apir_server *srv)
{
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    if (srv->listen_fd >= 0) {
        char status[160];
        snprintf(status, sizeof(status), "serving unix:%s", srv->path);
        apir_service_ready(status);
    }
    for (;;) {
        /* A worker process serving one guest ends with it. */
        if (srv->listen_fd < 0 && !srv->n_net && !srv->clients) {
            free(pfds);
            return 0;
        }
        size_t n = 4 + srv->n_net + srv->n_lingering + srv->n_pending + (srv->control ? APIR_CONTROL_MAX_POLL : 0);
        for (struct apir_client *c = srv->clients; c; c = c->next)
            n++;
        if (n > pcap) {
            struct pollfd *p = realloc(pfds, n * 2 * sizeof(*p));
            if (!p) {
                free(pfds);
                return -1;
            }
            pfds = p;
            pcap = n * 2;
        }
        pfds[0] = (struct pollfd){ .fd = srv->listen_fd, .events = POLLIN };
        pfds[1] = (struct pollfd){ .fd = srv->stop_pipe[0], .events = POLLIN };
        pfds[2] = (struct pollfd){ .fd = srv->child_pipe[0], .events = POLLIN };
        size_t i = 3;
        for (struct apir_client *c = srv->clients; c; c = c->next)
            /* Hang-up only.  A stream guest's close (its FIN) is not
             * watched: it may close right after posting commands the host
             * still runs; its serving thread reads the end after them and
             * then shuts the socket, which is seen here. */
            pfds[i++] = (struct pollfd){ .fd = c->fd, .events = 0 };
        const size_t linger_at = i;
        const uint32_t n_linger = srv->n_lingering;
        for (uint32_t k = 0; k < n_linger; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->lingering[k], .events = POLLIN };
        const size_t pending_at = i;
        const uint32_t n_pend = srv->n_pending;
        for (uint32_t k = 0; k < n_pend; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->pending[k].fd, .events = POLLIN };
        const size_t control_at = i;
        const size_t n_control = apir_control_poll_fill(srv->control, pfds + i);
        i += n_control;
        const size_t net_at = i;
        for (uint32_t k = 0; k < srv->n_net; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->net[k].fd, .events = POLLIN };
        /* A worker: its guest's lanes, passed by the daemon. */
        const size_t lane_at = i;
        pfds[i++] = (struct pollfd){ .fd = srv->lane_in_fd, .events = POLLIN };
        int timeout = poll_timeout_ms(srv), control_timeout = apir_control_timeout_ms(srv->control);
        if (control_timeout >= 0 && (timeout < 0 || control_timeout < timeout))
            timeout = control_timeout;
        int r = poll(pfds, i, timeout);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            free(pfds);
            return -1;
        }
        if (pfds[1].revents) {
            if (srv->listen_fd >= 0)
                apir_service_stopping();
            free(pfds);
            return 0;
        }
        if (pfds[2].revents & POLLIN)
            apir_workers_reap(srv);
        for (uint32_t k = n_linger; k-- > 0;)
            if (pfds[linger_at + k].revents)
                linger_service(srv, k, pfds[linger_at + k].revents);
        /* Collect hung-up clients first: the list changes as we drop. */
        i = 3;
        struct apir_client *c = srv->clients;
        while (c) {
            struct apir_client *next = c->next;
            bool hung_up = pfds[i++].revents & (POLLHUP | POLLERR | POLLNVAL);
            apir_worker_watch(srv, hung_up);
            if (hung_up)
                drop_client(srv, c);
            c = next;
        }
        /* From the last: serving one moves the last into its place. */
        const uint64_t now = apir_now_ns();
        for (uint32_t k = n_pend; k-- > 0;)
            pending_service(srv, k, pfds[pending_at + k].revents, now);
        if (pfds[0].revents & POLLIN)
            accept_new(srv);
        for (uint32_t k = 0; k < srv->n_net; k++)
            if (pfds[net_at + k].revents & POLLIN)
                apir_stream_accept(srv, k);
        if (pfds[lane_at].revents)
            apir_stream_lane_intake(srv);
        apir_control_poll_done(srv->control, pfds + control_at, n_control, render_view, srv);
    }
}

void apir_server_free(struct apir_server *srv)
{
    if (!srv)
        return;
    apir_control_free(srv->control);
    srv->control = NULL;
    while (srv->clients)
        drop_client(srv, srv->clients);
    apir_workers_stop(srv);
    for (uint32_t i = 0; i < srv->n_lingering; i++)
        close(srv->lingering[i]);
    for (uint32_t i = 0; i < srv->n_pending; i++)
        close(srv->pending[i].fd);
    /* Workers free their guests when their current command returns; give
     * them a bounded time (this is shutdown, not a hot path). */
    for (int i = 0; i < 500 && atomic_load(&srv->n_clients) > 0; i++)
        usleep(10000);
    /* A passed socket's file is its unit's: it stays, and systemd keeps
     * listening for the next start. */
    if (srv->listen_fd >= 0 && !srv->activated)
        unlink(srv->path);
    for (uint32_t i = 0; i < srv->n_net; i++)
        close(srv->net[i].fd);
    explicit_bzero(srv->token, sizeof(srv->token));
    if (srv->lane_in_fd >= 0)
        close(srv->lane_in_fd);
    apir_tls_keys_free(srv->tls_keys);
    free(srv->tenants);
    server_discard(srv);
}
