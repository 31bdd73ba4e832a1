/*
 * apir-host's stream endpoints (tcp:HOST:PORT, vsock:CID:PORT): guests on
 * other machines, or in VMs without virtio-gpu.  transport/stream_proto.h
 * has the wire rules; the accept loop, limits, workers and stats are the
 * Unix socket's (server.c, admission.c, workers.c), so a stream guest is served,
 * counted, sandboxed and shown exactly like a local one.
 *
 * Who may connect: a listener on a loopback address (or vsock's local CID)
 * is reachable from this machine only, like the Unix socket; one that
 * other machines reach is refused at start without authentication.  A
 * tls: listener's guests prove a pre-shared key, or present a certificate
 * from the client CA, in the TLS handshake (transport/tls.c), run where the
 * guest is served (tls_welcome); a host certificate without a client CA
 * authenticates the host only, so it too is refused where other machines
 * reach it.  A tcp:
 * listener's guests present a token in their hello (compared in constant
 * time); it travels in clear: it keeps strangers on a trusted network out,
 * it does not protect a link an attacker can read (README says so).
 *
 * tcp: and vsock: - the daemon reads the hello itself (non-blocking, under
 * the handshake deadline, a fixed 80 bytes) and checks the token before
 * anything is spent: an unauthenticated peer never gets a worker process or
 * a thread.  Only then is the connection served, by a worker process (the
 * daemon passes it with --serve-stream-fd) or a thread here.  tls: - the
 * handshake runs in the sandboxed worker (or thread) at once, so that a
 * TLS library fault is contained; its address's buckets and connection
 * count (admission.c) and the handshake deadline bound what an
 * unauthenticated peer costs, and it costs no other address anything.
 *
 * Serving: one frame at a time, in order.  The frame's "in" ranges are
 * read straight into the session's blobs (bounds-checked first: a range
 * outside a live blob hangs up on the guest), the command runs through the
 * same dispatch as on every transport, and the reply goes back with the
 * "out" ranges read from the blobs.  A guest that stops in the middle of a
 * frame, or stops reading its replies, is hung up on after FRAME_IDLE_MS
 * without progress; between frames it may idle (a dead peer is noticed by
 * TCP keepalive: transport/net.c).
 */
#include "server_impl.h"
#include "download_pieces.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "lanes.h"
#include "net.h"
#include "stream_proto.h"
#include "tls.h"
#include "wait.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* The longest a guest may leave a frame half sent or a reply unread. */
#define FRAME_IDLE_MS 30000
/* A tls: guest's send ring (transport/sender.h): 16 sealed records, half a
 * token's logits of a 128256-word vocabulary. */
#define TLS_SEND_RING (256u * 1024u)

bool apir_server_set_token(struct apir_server *srv, const char *token, char *err, size_t err_len)
{
    size_t n = token ? strlen(token) : 0;
    if (n == 0 || n > APIR_STREAM_TOKEN_MAX) {
        snprintf(err, err_len, "the token must be 1 to %u bytes (it is %zu)", APIR_STREAM_TOKEN_MAX, n);
        return false;
    }
    memcpy(srv->token, token, n);
    srv->token_len = (uint32_t)n;
    return true;
}

bool apir_server_set_tls_keys(struct apir_server *srv, struct apir_tls_keys *keys)
{
    apir_tls_keys_free(srv->tls_keys);
    srv->tls_keys = keys;
    return keys != NULL;
}

bool apir_server_listen_stream(struct apir_server *srv, const char *endpoint, char *err, size_t err_len)
{
    if (srv->n_net == APIR_MAX_NET_LISTENERS) {
        snprintf(err, err_len, "more than %u stream endpoints", APIR_MAX_NET_LISTENERS);
        return false;
    }
    struct apir_net_addr addr;
    if (!apir_net_parse(endpoint, &addr, err, err_len))
        return false;
    if (addr.tls && !apir_tls_keys_count(srv->tls_keys) && !apir_tls_keys_has_cert(srv->tls_keys)) {
        snprintf(err, err_len, "%s: a tls: listener needs the guests' keys (--tls-psk-file) or a certificate "
                 "(--tls-cert, --tls-key, --tls-client-ca)", endpoint);
        return false;
    }
    /* With a certificate and no client CA, a guest without a key or a
     * certificate gets in. */
    const bool anyone = addr.tls ? apir_tls_keys_has_cert(srv->tls_keys) && !apir_tls_keys_has_ca(srv->tls_keys)
                                 : !srv->token_len;
    bool loopback_only = false;
    int fd = apir_net_listen(&addr, &loopback_only, err, err_len);
    if (fd < 0)
        return false;
    if (!loopback_only && anyone) {
        close(fd);
        snprintf(err, err_len,
                 addr.tls ? "%s is reachable from other machines: refused without authentication of the guests (give "
                            "--tls-client-ca, the CA of their certificates, or keys: --tls-psk-file)"
                          : "%s is reachable from other machines: refused without authentication (serve "
                            "tls:HOST:PORT with --tls-psk-file or certificates, or on a trusted network give a token: "
                            "--token-file)", endpoint);
        return false;
    }
    struct net_listener *l = &srv->net[srv->n_net++];
    l->fd = fd;
    l->loopback_only = loopback_only;
    l->tls = addr.tls;
    if (addr.port == 0 && addr.kind == APIR_NET_TCP)  /* the kernel chose: say which (tests read it) */
        snprintf(l->endpoint, sizeof(l->endpoint), strchr(addr.host, ':') ? "%s:[%s]:%u" : "%s:%s:%u",
                 addr.tls ? "tls" : "tcp", addr.host, (unsigned)apir_net_local_port(fd));
    else
        snprintf(l->endpoint, sizeof(l->endpoint), "%s", endpoint);
    endpoint = l->endpoint;
    if (!loopback_only && !addr.tls)
        APIR_WARN("host", "%s: guests must present the token, which travels in clear: serve it on a trusted network "
                  "only (tls:HOST:PORT encrypts)", endpoint);
    const bool psk = apir_tls_keys_count(srv->tls_keys) > 0, certs = apir_tls_keys_has_cert(srv->tls_keys);
    const char *how = !addr.tls                    ? (loopback_only ? "this machine only" : "token required")
                      : psk && certs && !anyone    ? "TLS 1.3, pre-shared keys or client certificates"
                      : certs && !anyone           ? "TLS 1.3, client certificates"
                      : certs                      ? "TLS 1.3, host certificate, guests not authenticated: this machine only"
                                                   : "TLS 1.3, pre-shared keys";
    APIR_INFO("host", "serving %s (%s)", endpoint, how);
    return true;
}

void apir_stream_refuse(struct apir_server *srv, int fd, const char *peer_name, bool tls, const char *message)
{
    if (tls) {
        /* Before its handshake a TLS guest could not read a plain refusal. */
        srv->refused_connections++;
        APIR_WARN("host", "guest refused (%s): %s", peer_name, message);
        close(fd);
        return;
    }
    struct apir_stream_hello_reply r = { .magic = APIR_STREAM_MAGIC, .status = 1 };
    snprintf(r.message, sizeof(r.message), "%s", message);
    ssize_t n = send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
    srv->refused_connections++;
    APIR_WARN("host", "guest refused (%s): %s", peer_name, message);
    apir_server_linger_close(srv, fd);
}

/*
 * The network has no credentials: apir stat shows a stream peer under a
 * number derived from its address (admission counts it by address:
 * apir_tenant_net_key).  Distinct addresses may share a number (a 2^24
 * space).
 */
static uid_t peer_uid(int fd)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl = sizeof(ss);
    const uint8_t *b = NULL;
    size_t n = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET) {
        b = (const uint8_t *)&((struct sockaddr_in *)&ss)->sin_addr;
        n = 4;
    } else if (ss.ss_family == AF_INET6) {
        b = (const uint8_t *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
        n = 16;
    }
    uint32_t h = 2166136261u;  /* FNV-1a: spreading, not secrecy */
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 16777619u;
    return (uid_t)(APIR_NET_PEER_UID_BASE + (h & 0xFFFFFFu));
}

/*
 * A stream peer's tenant: its address.  An IPv6 peer is counted by its /64,
 * the block one site or machine gets (it may use any of its 2^64
 * addresses); an IPv4-mapped one as IPv4.
 */
enum { TENANT_V4 = 3, TENANT_V6 = 4, TENANT_VSOCK = 5, TENANT_NET_UNKNOWN = 6 };

uint64_t apir_tenant_net_key(int fd, char *name, size_t len)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(name, len, "an unknown address");
        return (uint64_t)TENANT_NET_UNKNOWN << 56;
    }
    char text[INET6_ADDRSTRLEN];
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&ss;
        const uint8_t *b = a6->sin6_addr.s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
            uint32_t v4;
            memcpy(&v4, b + 12, 4);
            inet_ntop(AF_INET, b + 12, text, sizeof(text));
            snprintf(name, len, "address %s", text);
            return ((uint64_t)TENANT_V4 << 56) | ntohl(v4);
        }
        uint64_t prefix = 0;
        for (int i = 0; i < 8; i++)
            prefix = (prefix << 8) | b[i];
        struct in6_addr net = { 0 };
        memcpy(net.s6_addr, b, 8);
        inet_ntop(AF_INET6, &net, text, sizeof(text));
        snprintf(name, len, "address block %s/64", text);
        /* 56 bits of the /64: two blocks agreeing on them share a tenant. */
        return ((uint64_t)TENANT_V6 << 56) | (prefix & 0x00FFFFFFFFFFFFFFull);
    }
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a4->sin_addr, text, sizeof(text));
        snprintf(name, len, "address %s", text);
        return ((uint64_t)TENANT_V4 << 56) | ntohl(a4->sin_addr.s_addr);
    }
    if (ss.ss_family == AF_VSOCK) {
        const struct sockaddr_vm *v = (const struct sockaddr_vm *)&ss;
        snprintf(name, len, "vsock CID %u", (unsigned)v->svm_cid);
        return ((uint64_t)TENANT_VSOCK << 56) | v->svm_cid;
    }
    snprintf(name, len, "an unknown address");
    return (uint64_t)TENANT_NET_UNKNOWN << 56;
}

void apir_stream_accept(struct apir_server *srv, uint32_t listener)
{
    int fd = accept4(srv->net[listener].fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    apir_net_tune(fd);
    char name[64], tenant_name[96];
    apir_net_peer_name(fd, name, sizeof(name));
    const uint64_t key = apir_tenant_net_key(fd, tenant_name, sizeof(tenant_name));
    struct apir_tenant *t = apir_tenant_enter(srv, key, tenant_name);
    const struct ucred peer = { .pid = 0, .uid = peer_uid(fd), .gid = (gid_t)-1 };
    const bool tls = srv->net[listener].tls;
    const char *why = apir_admit_connection(srv, t);
    if (why)
        apir_stream_refuse(srv, fd, name, tls, why);
    else
        apir_server_add_pending(srv, fd, &peer, key, true, tls);
    apir_tenant_leave(srv);
}

/* A tls: connection whose first byte came and is not a lane's join: a TLS
 * guest.  Its handshake is the hello's check; it runs where the guest is
 * served (its worker process, sandboxed, or its thread), never in this
 * loop - so the guest's spawn is paid now, before it has proved anything
 * (its connect bucket and count bound how often). */
static void tls_guest(struct apir_server *srv, struct pending_conn *p, const char *name)
{
    const char *why = apir_admit_guest(srv, srv->tenant_now);
    if (why) {
        apir_stream_refuse(srv, p->fd, name, true, why);
    } else if (srv->worker_argv) {
        const uint32_t before = srv->n_children;
        apir_workers_spawn(srv, p->fd, &p->peer, name, true);
        apir_tenant_spawned(srv, p->tenant, before);
    } else {
        apir_stream_start_client(srv, p->fd, name, p->tenant, true);
    }
}

/* Constant time in the token's length: a guest learns nothing from how
 * long a wrong token took to refuse. */
static bool token_matches(const struct apir_server *srv, const struct apir_stream_hello *h)
{
    if (!srv->token_len)
        return true;
    uint8_t diff = (uint8_t)(h->token_len != srv->token_len);
    for (uint32_t i = 0; i < APIR_STREAM_TOKEN_MAX; i++)
        diff |= (uint8_t)((i < srv->token_len ? srv->token[i] : 0) ^ (i < h->token_len ? h->token[i] : 0));
    return diff == 0;
}

static void lane_join(struct apir_server *srv, struct pending_conn *p, const struct apir_stream_hello *h,
                      const char *name);

bool apir_stream_pending(struct apir_server *srv, struct pending_conn *p, short revents, uint64_t now)
{
    char name[64];
    apir_net_peer_name(p->fd, name, sizeof(name));
    /* tls: its first byte tells: a TLS record (a guest's ClientHello: the
     * worker reads it, this loop does not) or a lane's join, whose 80
     * clear bytes come before its own handshake.  One byte peeked, none
     * taken: a connection is never left readable and unread here. */
    if (p->tls && p->hello_len == 0 && (revents & POLLIN)) {
        uint8_t first = 0;
        const ssize_t n = recv(p->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            APIR_INFO("host", "connection (%s) closed before its hello", name);
            close(p->fd);
            return true;
        }
        if (n == 1 && first != (uint8_t)(APIR_STREAM_JOIN_MAGIC & 0xff)) {
            tls_guest(srv, p, name);
            return true;
        }
        if (n != 1)
            return false;
    }
    if (revents & POLLIN) {
        ssize_t n = recv(p->fd, p->hello + p->hello_len, sizeof(p->hello) - p->hello_len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            APIR_INFO("host", "connection (%s) closed before its hello", name);
            close(p->fd);
            return true;
        }
        if (n > 0)
            p->hello_len = (uint8_t)(p->hello_len + n);
    } else if (revents) {
        close(p->fd);
        return true;
    }
    if (p->hello_len < sizeof(p->hello)) {
        if (now < p->deadline_ns)
            return false;
        APIR_WARN("host", "connection (%s) sent %s in %u ms: closed", name,
                  p->tls ? "no answer (a TLS handshake or a lane's join)" : "no hello",
                  srv->host->cfg.limits.handshake_timeout_ms);
        close(p->fd);
        return true;
    }
    struct apir_stream_hello h;
    memcpy(&h, p->hello, sizeof(h));
    explicit_bzero(p->hello, sizeof(p->hello));
    if (h.magic == APIR_STREAM_JOIN_MAGIC) {
        lane_join(srv, p, &h, name);
        explicit_bzero(&h, sizeof(h));
        return true;
    }
    if (p->tls) {  /* began as a join, is not one */
        apir_stream_refuse(srv, p->fd, name, true, "not a lane's join");
        return true;
    }
    const char *why = NULL;
    if (h.magic != APIR_STREAM_MAGIC)
        why = "not an apir stream hello";
    else if (h.version != APIR_STREAM_VERSION)
        why = "unsupported stream transport version";
    else if (h.token_len > APIR_STREAM_TOKEN_MAX)
        why = "malformed hello";
    else if (!token_matches(srv, &h))
        why = h.token_len ? "wrong token" : "a token is required (APIR_TOKEN_FILE or APIR_TOKEN on the guest)";
    else if (!srv->worker_argv && atomic_load(&srv->n_clients) >= srv->host->cfg.limits.max_clients)
        why = "too many clients";
    else
        why = apir_admit_guest(srv, srv->tenant_now);  /* authenticated: now it may cost */
    explicit_bzero(&h.token, sizeof(h.token));
    if (why) {
        apir_stream_refuse(srv, p->fd, name, false, why);
        return true;
    }
    if (srv->worker_argv) {
        const uint32_t before = srv->n_children;
        apir_workers_spawn(srv, p->fd, &p->peer, name, false);
        apir_tenant_spawned(srv, p->tenant, before);
    } else {
        apir_stream_start_client(srv, p->fd, name, p->tenant, false);
    }
    return true;
}

/* ---- serving ------------------------------------------------------------ */

/* The host's copy of a guest blob: anonymous memory, counted against the
 * session's blob quota (apir_session_blob_add); untouched pages cost
 * nothing until the guest's bytes arrive. */
static uint32_t blob_create(struct apir_client *c, struct apir_decoder *req)
{
    uint32_t res_id = apir_decode_u32(req);
    uint64_t size = apir_decode_u64(req);
    if (req->fatal || res_id < APIR_STREAM_FIRST_RES_ID || size == 0 || size > SIZE_MAX / 2)
        return 1;
    /* Over the quota: refused before anything is mapped (blob_add would
     * refuse it too, after). */
    const struct apir_limits *lim = &c->srv->host->cfg.limits;
    if (size > lim->max_blob_bytes - c->session->blob_bytes || c->session->n_blobs >= lim->max_blobs) {
        APIR_WARN("host", "%s: blob %u of %llu bytes refused: over the blob quota (--max-blobs, --max-blob-mib)",
                  c->session->name, res_id, (unsigned long long)size);
        return 1;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        APIR_WARN("host", "%s: blob %u of %llu bytes: %s", c->session->name, res_id, (unsigned long long)size,
                  strerror(errno));
        return 1;
    }
    if (!apir_session_blob_add(c->session, res_id, p, (size_t)size, apir_client_unmap_release, NULL)) {
        munmap(p, (size_t)size);
        return 1;
    }
    return 0;
}

/* apir_download_pieces_send's way out: the guest's socket. */
static int send_to_guest(void *ctx, struct iovec *iov, int n)
{
    struct apir_client *c = ctx;
    return apir_net_send(c->fd, c->tls, iov, n, FRAME_IDLE_MS);
}

/* ---- lanes (stream_proto.h, transport/lanes.h) ---------------------------- */

/* Constant time over n bytes of the ticket: a join learns nothing from how
 * long a wrong one took. */
static bool ticket_matches(const uint8_t *a, const uint8_t *b, uint32_t n)
{
    uint8_t diff = 0;
    for (uint32_t i = 0; i < n; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

/* What the daemon passes a worker with a lane's connection. */
struct lane_pass {
    uint32_t lane;
    uint32_t tls;               /* a tls: listener's join: its handshake comes next */
};

/* A plain join's ticket is the whole ticket; a tls: join's clear bytes are
 * its first half only (which session: the route), the rest comes inside
 * the lane's own TLS session (lane_tls_welcome). */
#define LANE_ROUTE_BYTES (APIR_STREAM_TICKET_BYTES / 2)

/* Makes fd the next lane of c's session and answers its join (both
 * isolations: this daemon's thread mode, a worker's intake), through tls
 * when the lane has its own session; fd and tls are taken either way.
 * Beyond the lanes its guest was granted: refused. */
static void lane_attach(struct apir_client *c, int fd, struct apir_tls *tls, uint32_t lane, const char *peer_name)
{
    struct apir_stream_hello_reply r = { .magic = APIR_STREAM_MAGIC, .status = 0 };
    struct iovec iov = { &r, sizeof(r) };
    const uint32_t have = apir_lanes_count(c->lanes);
    if (have >= atomic_load(&c->lanes_granted)) {
        APIR_WARN("host", "%s: a lane from %s beyond the %u granted: refused", c->session->name, peer_name,
                  atomic_load(&c->lanes_granted));
        r.status = -1;
        snprintf(r.message, sizeof(r.message), "more lanes than granted");
        (void)apir_net_send(fd, tls, &iov, 1, 1000);
        apir_tls_free(tls);
        close(fd);
        return;
    }
    /* Counted first, answered after: the guest uses a lane once answered,
     * and the serving thread takes a frame over lanes it counts. */
    if (!apir_lanes_add(c->lanes, fd, tls)) {
        APIR_WARN("host", "%s: a lane from %s not taken (%s)", c->session->name, peer_name, strerror(errno));
        return;
    }
    if (apir_net_send(fd, tls, &iov, 1, 1000) != 0)
        APIR_WARN("host", "%s: lane %u: cannot answer its join (%s)", c->session->name, lane, strerror(errno));
    else
        APIR_INFO("host", "%s: lane %u joined from %s (%u of %u%s)", c->session->name, lane, peer_name, have + 1,
                  atomic_load(&c->lanes_granted), tls ? ", TLS" : "");
}

/* A join, in the daemon: its ticket (a tls: join: the ticket's route)
 * names a live session of the same tenant (address); the connection goes
 * to it - its worker (over the worker's lane socket, never blocking here:
 * a worker that does not take it loses the lane) or, thread mode, its
 * client (plain joins only: a tls: session has lanes in a worker only). */
static void lane_join(struct apir_server *srv, struct pending_conn *p, const struct apir_stream_hello *h,
                      const char *name)
{
    const uint32_t ticket_len = p->tls ? LANE_ROUTE_BYTES : APIR_STREAM_TICKET_BYTES;
    const char *why = NULL;
    if (h->version != APIR_STREAM_VERSION)
        why = "unsupported stream transport version";
    else if (h->token_len != ticket_len)
        why = "malformed join";
    else if (!srv->host->cfg.max_lanes)
        why = "this host takes no lanes";
    if (!why && srv->worker_argv) {
        const uint32_t n_slots = srv->host->cfg.limits.max_clients;
        uint32_t found = UINT32_MAX;
        for (uint32_t i = 0; i < n_slots; i++) {
            const struct worker_slot *w = &srv->children[i];
            if (w->pid && w->lane_sock >= 0 && w->tenant == p->tenant &&
                ticket_matches(w->lane_ticket, h->token, ticket_len))
                found = i;
        }
        if (found != UINT32_MAX) {
            const struct lane_pass pass = { .lane = (uint32_t)h->pid, .tls = p->tls };
            if (apir_send_fds(srv->children[found].lane_sock, &pass, sizeof(pass), &p->fd, 1) == (ssize_t)sizeof(pass)) {
                APIR_DEBUG("host", "guest#%llu: lane %u from %s passed to its worker",
                           (unsigned long long)srv->children[found].client_id, pass.lane, name);
                close(p->fd);
                return;
            }
            why = "the session takes no lane now";
        }
    } else if (!why && !p->tls) {
        struct apir_client *found = NULL;
        for (struct apir_client *c = srv->clients; c; c = c->next)
            if (c->lanes && !c->tls_pending && c->tenant == p->tenant &&
                ticket_matches(c->lane_ticket, h->token, ticket_len))
                found = c;
        if (found) {
            lane_attach(found, p->fd, NULL, (uint32_t)h->pid, name);
            return;
        }
    }
    /* A tls: join expects TLS next, not a clear answer: closed. */
    apir_stream_refuse(srv, p->fd, name, p->tls, why ? why : "no session has this ticket");
}

/* A tls: lane in its session's worker: its own handshake (the same keys),
 * then the whole ticket inside it, from the same identity as the session's.
 * On this loop, under a short deadline: only a peer that had the ticket's
 * route (from this tenant's address) reaches it.  The lane's TLS session,
 * or NULL (fd untouched; why logged). */
#define LANE_TLS_HANDSHAKE_MS 2000
static struct apir_tls *lane_tls_welcome(struct apir_client *c, int fd, const char *peer_name)
{
    char err[512];
    const uint32_t limit = c->srv->host->cfg.limits.handshake_timeout_ms;
    const int timeout_ms = limit && limit < LANE_TLS_HANDSHAKE_MS ? (int)limit : LANE_TLS_HANDSHAKE_MS;
    struct apir_tls *tls = apir_tls_server(fd, c->srv->tls_keys, timeout_ms, err, sizeof(err));
    if (!tls) {
        APIR_WARN("host", "%s: a lane from %s: %s", c->session->name, peer_name, err);
        return NULL;
    }
    uint8_t ticket[APIR_STREAM_TICKET_BYTES];
    struct apir_net_reader rd;
    bool ok = apir_net_reader_init(&rd, fd, sizeof(ticket));
    if (ok) {
        rd.tls = tls;
        ok = apir_net_read(&rd, ticket, sizeof(ticket), timeout_ms, NULL) == 0;
        apir_net_reader_free(&rd);
    }
    const bool same = ok && ticket_matches(ticket, c->lane_ticket, sizeof(ticket)) &&
                      !strcmp(apir_tls_identity(tls), apir_tls_identity(c->tls));
    explicit_bzero(ticket, sizeof(ticket));
    if (!same) {
        APIR_WARN("host", "%s: a lane from %s (%s) refused: %s", c->session->name, peer_name, apir_tls_identity(tls),
                  ok ? "not the session's ticket and identity" : "no ticket");
        apir_tls_free(tls);
        return NULL;
    }
    return tls;
}

void apir_stream_lane_intake(struct apir_server *srv)
{
    struct lane_pass pass = { 0 };
    int fd = -1, n_fds = 0;
    const ssize_t n = apir_recv_fds(srv->lane_in_fd, &pass, sizeof(pass), &fd, 1, &n_fds, 0);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(srv->lane_in_fd);  /* the daemon is gone: no more lanes */
            srv->lane_in_fd = -1;
        }
        return;
    }
    if (n_fds != 1)
        return;
    char name[64];
    apir_net_peer_name(fd, name, sizeof(name));
    struct apir_client *c = srv->clients;
    /* Granted is stored after the session's own handshake (lanes_grant):
     * c->tls is read only after it. */
    if (!c || !c->lanes || n != (ssize_t)sizeof(pass) || !atomic_load(&c->lanes_granted) ||
        (pass.tls != 0) != (c->tls != NULL)) {
        APIR_WARN("host", "%s: a lane from %s it did not ask for: closed", c ? c->session->name : "worker", name);
        close(fd);
        return;
    }
    struct apir_tls *tls = NULL;
    if (pass.tls && !(tls = lane_tls_welcome(c, fd, name))) {
        close(fd);
        return;
    }
    lane_attach(c, fd, tls, pass.lane, name);
}

/* APIR_CMD_TYPE_STREAM_LANES: u32 wanted -> u32 granted, the ticket. */
static uint32_t lanes_grant(struct apir_client *c, struct apir_decoder *req, struct apir_encoder *reply)
{
    const uint32_t want = apir_decode_u32(req);
    const uint32_t max = c->srv->host->cfg.max_lanes < APIR_STREAM_MAX_LANES ? c->srv->host->cfg.max_lanes
                                                                             : APIR_STREAM_MAX_LANES;
    if (req->fatal || !c->lanes || !want || !max)
        return 1;
    /* Asked again: never fewer than before (lanes may have joined). */
    uint32_t granted = want < max ? want : max;
    if (granted < atomic_load(&c->lanes_granted))
        granted = atomic_load(&c->lanes_granted);
    atomic_store(&c->lanes_granted, granted);
    apir_encode_u32(reply, granted);
    apir_encode_bytes(reply, c->lane_ticket, sizeof(c->lane_ticket));
    return 0;
}

/* A reply whose one download is split over lanes: the head and part 0 (its
 * first `own_len` bytes) here, part k on lane k (posted after the command
 * ran, gated at the range's start); the gate moves as the device's pieces
 * land (download_pieces.h). */
static int send_reply_lanes(struct apir_client *c, const struct iovec *head, int n_head, const uint8_t *src,
                            uint64_t size, size_t own_len)
{
    struct apir_download_pieces *p = c->session->pieces;
    const uint8_t *const end = src + size, *own = src, *const own_end = src + own_len;
    const uint8_t *at = src;
    struct iovec iov[4];
    int n_iov = 0;
    for (int i = 0; i < n_head; i++)
        iov[n_iov++] = head[i];
    while (at < end || n_iov) {
        const uint8_t *ready = at < end ? apir_download_pieces_ready(p, at, end) : end;
        if (ready == at && at < end) {
            if (n_iov && send_to_guest(c, iov, n_iov) != 0)
                return -1;
            n_iov = 0;
            apir_download_pieces_wait(p, at);
            continue;
        }
        if (ready > at) {
            at = ready;
            apir_lanes_ready(c->lanes, at);
        }
        const uint8_t *upto = at < own_end ? at : own_end;
        if (upto > own) {
            iov[n_iov++] = (struct iovec){ (void *)own, (size_t)(upto - own) };
            own = upto;
        }
        if (n_iov && send_to_guest(c, iov, n_iov) != 0)
            return -1;
        n_iov = 0;
    }
    return 0;
}

struct stream_io {
    struct apir_net_reader rd;
    uint8_t cmd[APIR_MAX_COMMAND_SIZE];
    uint8_t reply[APIR_REPLY_BLOB_SIZE];
};

/* Serves one frame whose header was read; false: hang up.  *began: when
 * its command began (after its bytes were in: a slow link's upload time is
 * not the command's, which --graph-timeout-ms bounds), 0 if it never ran. */
static bool serve_frame(struct apir_client *c, struct stream_io *io, const struct apir_stream_frame *f,
                        uint64_t *began)
{
    struct apir_session *s = c->session;
    const uint32_t n_seg = (uint32_t)f->n_in + f->n_out;
    /* Lanes: at most those that joined, for a frame with one payload. */
    const uint32_t lanes = f->lanes;
    const bool lanes_ok = !lanes || (lanes <= apir_lanes_count(c->lanes) && (f->n_out == 1 || (f->n_in == 1 && !f->n_out)));
    if (f->magic != APIR_STREAM_FRAME_MAGIC || f->cmd_len < APIR_CMD_HEADER_SIZE || f->cmd_len > APIR_MAX_COMMAND_SIZE ||
        n_seg > APIR_STREAM_MAX_SEGMENTS || !lanes_ok) {
        APIR_WARN("host", "%s: malformed frame (magic %08x, %u command bytes, %u ranges, %u lanes): hanging up",
                  s->name, f->magic, f->cmd_len, n_seg, lanes);
        return false;
    }
    struct apir_stream_segment seg[APIR_STREAM_MAX_SEGMENTS];
    if (apir_net_read(&io->rd, seg, n_seg * sizeof(seg[0]), FRAME_IDLE_MS, NULL) != 0 ||
        apir_net_read(&io->rd, io->cmd, f->cmd_len, FRAME_IDLE_MS, NULL) != 0) {
        APIR_WARN("host", "%s: frame cut short (%s): hanging up", s->name, strerror(errno));
        return false;
    }
    /* Every range inside a live blob, before a byte of payload lands. */
    for (uint32_t i = 0; i < n_seg; i++)
        if (seg[i].reserved != 0 || !apir_session_blob_range(s, seg[i].res_id, seg[i].offset, seg[i].size)) {
            APIR_WARN("host", "%s: data range %u (blob %u, %llu bytes at %llu) outside its blob: hanging up", s->name, i,
                      seg[i].res_id, (unsigned long long)seg[i].size, (unsigned long long)seg[i].offset);
            return false;
        }
    for (uint32_t i = 0; i < f->n_in; i++) {
        uint8_t *dst = apir_session_blob_range(s, seg[i].res_id, seg[i].offset, seg[i].size);
        /* Split over lanes: part k lands from lane k while part 0 comes here. */
        const size_t here = lanes && !f->n_out
                                ? apir_lanes_post_parts(c->lanes, false, dst, seg[i].size, lanes, io->rd.spin_ns)
                                : (size_t)seg[i].size;
        if (apir_net_read(&io->rd, dst, here, FRAME_IDLE_MS, NULL) != 0) {
            APIR_WARN("host", "%s: upload cut short (%s): hanging up", s->name, strerror(errno));
            if (lanes && !f->n_out)
                apir_lanes_abandon(c->lanes, EPIPE);
            return false;
        }
        if (lanes && !f->n_out && apir_lanes_wait(c->lanes, io->rd.spin_ns) != 0) {
            APIR_WARN("host", "%s: upload cut short on a lane (%s): hanging up", s->name, strerror(errno));
            return false;
        }
    }
    *began = apir_now_ns();
    atomic_store_explicit(&c->busy_since_ns, *began, memory_order_relaxed);
    struct apir_decoder req;
    apir_decoder_init(&req, io->cmd, f->cmd_len);
    struct apir_cmd_header hdr;
    apir_decode_header(&req, &hdr);
    struct apir_encoder reply;
    apir_encoder_init(&reply, io->reply, sizeof(io->reply) - 4);
    bool handled;
    uint32_t ret = apir_client_run_command(c, &hdr, &req, &reply, &handled);
    if (!handled) {
        switch (hdr.cmd_type) {
        case APIR_CMD_TYPE_SHM_BLOB_CREATE:
            ret = blob_create(c, &req);
            break;
        case APIR_CMD_TYPE_SHM_BLOB_DESTROY: {
            uint32_t res_id = apir_decode_u32(&req);
            ret = !req.fatal && res_id >= APIR_STREAM_FIRST_RES_ID && apir_session_blob_remove(s, res_id) ? 0 : 1;
            break;
        }
        case APIR_CMD_TYPE_STREAM_LANES:
            ret = lanes_grant(c, &req, &reply);
            break;
        default:
            APIR_WARN("host", "%s: command type %d is not served on a stream", s->name, hdr.cmd_type);
            ret = APIR_FORWARD_NO_DISPATCH;
            break;
        }
    }
    struct apir_stream_reply rh = { .magic = APIR_STREAM_REPLY_MAGIC, .ret = ret,
                                    .reply_len = (uint32_t)apir_encoder_used(&reply), .n_out = f->n_out };
    struct iovec outs[APIR_STREAM_MAX_SEGMENTS];
    for (uint32_t i = f->n_in; i < n_seg; i++) {
        /* Looked up again: the command may have destroyed the blob. */
        uint8_t *src = apir_session_blob_range(s, seg[i].res_id, seg[i].offset, seg[i].size);
        if (!src) {
            apir_download_pieces_finish(s->pieces);
            APIR_WARN("host", "%s: the command destroyed the blob its download reads: hanging up", s->name);
            return false;
        }
        rh.out_bytes += seg[i].size;
        outs[i - f->n_in] = (struct iovec){ src, (size_t)seg[i].size };
    }
    /* The reply; a download the device still copies leaves piece by piece
     * as it lands (download_pieces.h). */
    const struct iovec head[2] = { { &rh, sizeof(rh) }, { io->reply, rh.reply_len } };
    int sent;
    if (lanes && f->n_out) {
        /* Over lanes: each lane is given its part now, after the command
         * (posted before it, the lanes spun or slept through the device's
         * work for nothing: docs/MEASUREMENTS.md), gated at the range's
         * start: what the device still copies goes as it lands.  Every lane
         * done before the frame ends: the next frame may free the blob they
         * read. */
        uint8_t *src = (uint8_t *)outs[0].iov_base;
        apir_lanes_gate(c->lanes, src);
        const size_t here = apir_lanes_post_parts(c->lanes, true, src, rh.out_bytes, lanes, io->rd.spin_ns);
        sent = send_reply_lanes(c, head, 2, src, rh.out_bytes, here);
        if (sent != 0)
            apir_lanes_abandon(c->lanes, EPIPE);
        else
            sent = apir_lanes_wait(c->lanes, io->rd.spin_ns);
    } else {
        sent = apir_download_pieces_send(s->pieces, head, 2, outs, f->n_out, send_to_guest, c);
    }
    const int send_errno = errno;
    /* Sent or not, no device copy outlives its frame. */
    apir_download_pieces_finish(s->pieces);
    if (sent != 0) {
        APIR_WARN("host", "%s: cannot send the reply (%s): hanging up", s->name, strerror(send_errno));
        return false;
    }
    /* A keyed graph accepted by this command is computed now, while the
     * guest goes on; the next frame is read after it. */
    apir_session_run_deferred(s);
    return !atomic_load(&c->dead);
}

/*
 * A tls: guest, first: the handshake (its key or certificate names it), then its hello
 * inside TLS, answered.  Under the handshake deadline, like any hello.
 */
static bool tls_welcome(struct apir_client *c, struct stream_io *io)
{
    const int timeout_ms = (int)c->srv->host->cfg.limits.handshake_timeout_ms;
    char err[1024];
    c->tls = apir_tls_server(c->fd, c->srv->tls_keys, timeout_ms, err, sizeof(err));
    if (!c->tls) {
        APIR_WARN("host", "%s: refused: %s", c->session->name, err);
        return false;
    }
    io->rd.tls = c->tls;
    /* Counted for the profile line at its end, as the session's commands. */
    if (apir_log_get_level() >= APIR_LOG_INFO)
        apir_tls_count_on(c->tls);
    struct apir_stream_hello h;
    if (apir_net_read(&io->rd, &h, sizeof(h), timeout_ms, NULL) != 0 || h.magic != APIR_STREAM_MAGIC ||
        h.version != APIR_STREAM_VERSION) {
        APIR_WARN("host", "%s: no stream hello after the TLS handshake: closed", c->session->name);
        return false;
    }
    explicit_bzero(&h, sizeof(h));
    /* Records sent by a thread of their own while this one seals the next
     * (transport/sender.h): a download's 16 KiB records were sealed and
     * sent in turn on this thread, which bounded it. */
    bool sender = c->srv->host->cfg.tls_send_thread;
    if (sender && !(sender = apir_tls_send_from_thread(c->tls, TLS_SEND_RING, FRAME_IDLE_MS)))
        APIR_WARN("host", "%s: no thread to send TLS records (%s): sent from the serving thread", c->session->name,
                  strerror(errno));
    struct apir_stream_hello_reply r = { .magic = APIR_STREAM_MAGIC, .status = 0 };
    struct iovec iov = { &r, sizeof(r) };
    if (apir_net_send(c->fd, c->tls, &iov, 1, FRAME_IDLE_MS) != 0)
        return false;
    APIR_INFO("host", "%s: TLS 1.3, %s (%s%s)", c->session->name, apir_tls_identity(c->tls), apir_tls_cipher(c->tls),
              sender ? ", records sent by a thread of their own" : "");
    return true;
}

static void *stream_client_worker(void *arg)
{
    struct apir_client *c = arg;
    struct stream_io *io = malloc(sizeof(*io));
    if (io && !apir_net_reader_init(&io->rd, c->fd, 64 * 1024)) {
        free(io);
        io = NULL;
    }
    /* The next frame: spun for, then slept for.  A host whose devices have
     * their own memory (a GPU: host->device_memory) spins as long as the shm
     * transport does (APIR_HOST_SPIN_US, 2 ms): between two tokens the
     * guest's own work often outlasts a short spin, and a wake-up from
     * sleep costs more than the spin's idle core (1B F16 tg over loopback
     * TCP on an H200: 0.89 of native with 100 us).  A CPU host spins
     * briefly (APIR_SPIN_US, 100 us: back-to-back commands): over loopback a
     * long spin takes the cores it and its guest compute on (tg32 0.95 of
     * native with 2 ms on 2 cores). */
    if (io)
        io->rd.spin_ns = (uint64_t)apir_host_spin_us(c->srv->host->device_memory) * 1000;
    /* Downloads leave in pieces as the device copies them (download_pieces.h). */
    apir_download_pieces_enable(c->session, c->srv->host->cfg.send_piece_bytes);
    /* What this thread logs from now on is the guest's doing. */
    apir_log_budget_enter(&c->session->log);
    if (io && c->tls_pending && !tls_welcome(c, io)) {
        apir_net_reader_free(&io->rd);
        free(io);
        io = NULL;
    }
    while (io && !atomic_load(&c->dead)) {
        struct apir_stream_frame f;
        bool eof_clean = false;
        /* Between frames a guest may idle as long as it likes; once a frame
         * has begun, its header too must keep coming. */
        if (!apir_net_wait_readable(&io->rd, -1) ||
            apir_net_read(&io->rd, &f, sizeof(f), FRAME_IDLE_MS, &eof_clean) != 0) {
            if (!eof_clean && !atomic_load(&c->dead))
                APIR_WARN("host", "%s: connection lost (%s)", c->session->name, strerror(errno));
            break;
        }
        uint64_t began = 0;
        bool go_on = serve_frame(c, io, &f, &began);
        atomic_store_explicit(&c->busy_since_ns, 0, memory_order_relaxed);
        if (began)
            apir_stats_publish(c->stats, c->session, APIR_GUEST_SERVING, began, c->reported_pid);
        if (!go_on)
            break;
    }
    if (io) {
        apir_net_reader_free(&io->rd);
        free(io);
    }
    apir_log_budget_flush(&c->session->log);
    apir_log_budget_leave(NULL);
    /* A last reply still in the TLS send ring goes first (briefly). */
    if (c->tls) {
        apir_tls_flush(c->tls, 1000);
        if (apir_log_get_level() >= APIR_LOG_INFO) {
            char counts[512];
            apir_tls_describe_counts(c->tls, counts, sizeof(counts));
            APIR_INFO("host", "%s: profile: tls: %s", c->session->name, counts);
        }
    }
    /* Make the main loop notice (it polls for hang-up), then let go. */
    shutdown(c->fd, SHUT_RDWR);
    apir_client_put(c);
    return NULL;
}

void apir_stream_start_client(struct apir_server *srv, int fd, const char *peer_name, uint64_t tenant, bool tls)
{
    const struct ucred peer = { .pid = 0, .uid = peer_uid(fd), .gid = (gid_t)-1 };
    const unsigned long long id = apir_server_next_id(srv);
    char name[96];
    snprintf(name, sizeof(name), "guest#%llu(%s)", id, peer_name);
    const char *why = NULL;
    struct apir_client *c = apir_client_new(srv, name, &peer, 0, &why);
    if (!c) {
        apir_stream_refuse(srv, fd, peer_name, tls, why);
        return;
    }
    c->stream = true;
    /* Its guest may be on another machine: a CPU's graphs are answered
     * before they are computed too (session.h). */
    c->session->defer_sync_graphs = true;
    c->id = id;
    c->tenant = tenant;
    /* Lanes: a worker has the ticket its daemon gave it (joins come
     * through the daemon); this daemon in thread mode makes one and takes
     * the joins itself, plain ones only (a tls: lane's handshake would
     * stall this loop).  Set before the client is served. */
    if (srv->host->cfg.max_lanes && (!tls || srv->lane_in_fd >= 0)) {
        bool ticket = false;
        if (srv->lane_in_fd >= 0) {
            memcpy(c->lane_ticket, srv->lane_ticket, sizeof(c->lane_ticket));
            ticket = true;
        } else if (!srv->worker_argv && srv->listen_fd >= 0) {
            ticket = getrandom(c->lane_ticket, sizeof(c->lane_ticket), 0) == (ssize_t)sizeof(c->lane_ticket);
        }
        if (ticket)
            c->lanes = apir_lanes_new(FRAME_IDLE_MS);
    }
    snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer_name);
    snprintf(c->comm, sizeof(c->comm), "%s", peer_name);  /* apir ps: its address (cut to fit) */
    if (tls) {
        c->tls_pending = true;
        if (apir_client_serve(c, fd, stream_client_worker))
            APIR_INFO("host", "guest#%llu: TLS connection from %s", id, peer_name);
        return;
    }
    struct apir_stream_hello_reply r = { .magic = APIR_STREAM_MAGIC, .status = 0 };
    struct iovec iov = { &r, sizeof(r) };
    if (apir_net_write(fd, &iov, 1, FRAME_IDLE_MS) != 0) {
        c->fd = fd;
        atomic_init(&c->refs, 1);
        atomic_fetch_add(&srv->n_clients, 1);
        apir_client_put(c);
        return;
    }
    if (apir_client_serve(c, fd, stream_client_worker))
        APIR_INFO("host", "guest#%llu connected: %s", id, peer_name);
}
