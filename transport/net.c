#include "net.h"

#include "tls.h"
#include "wait.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/vm_sockets.h>
#define HAVE_VSOCK 1
#endif

bool apir_net_is_stream(const char *endpoint)
{
    return endpoint && (strncmp(endpoint, "tcp:", 4) == 0 || strncmp(endpoint, "tls:", 4) == 0 ||
                        strncmp(endpoint, "vsock:", 6) == 0);
}

static bool parse_port(const char *s, uint16_t *port)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > 65535 || *s == '-' || *s == '+')
        return false;
    *port = (uint16_t)v;
    return true;
}

bool apir_net_parse(const char *endpoint, struct apir_net_addr *a, char *err, size_t err_len)
{
    memset(a, 0, sizeof(*a));
    if (strncmp(endpoint, "vsock:", 6) == 0) {
        const char *p = endpoint + 6, *colon = strchr(p, ':');
        char *end = NULL;
        errno = 0;
        unsigned long cid = colon && colon > p ? strtoul(p, &end, 10) : 0;
        if (!colon || colon == p || end != colon || errno || cid > UINT32_MAX || !parse_port(colon + 1, &a->port)) {
            snprintf(err, err_len, "bad endpoint '%s': use vsock:CID:PORT", endpoint);
            return false;
        }
        a->kind = APIR_NET_VSOCK;
        a->cid = (uint32_t)cid;
        return true;
    }
    const bool tls = strncmp(endpoint, "tls:", 4) == 0;
    if (strncmp(endpoint, "tcp:", 4) != 0 && !tls) {
        snprintf(err, err_len, "'%s' is not a tcp:, tls: or vsock: endpoint", endpoint);
        return false;
    }
    const char *p = endpoint + 4, *port;
    size_t host_len;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close || close[1] != ':') {
            snprintf(err, err_len, "bad endpoint '%s': use tcp:[IPV6]:PORT (or tls:)", endpoint);
            return false;
        }
        host_len = (size_t)(close - p - 1);
        p++;
        port = close + 2;
    } else {
        const char *colon = strrchr(p, ':');
        if (!colon || memchr(p, ':', (size_t)(colon - p))) {
            snprintf(err, err_len, "bad endpoint '%s': use tcp:HOST:PORT or tls:HOST:PORT (IPv6 in brackets)",
                     endpoint);
            return false;
        }
        host_len = (size_t)(colon - p);
        port = colon + 1;
    }
    if (host_len == 0 || host_len >= sizeof(a->host) || !parse_port(port, &a->port)) {
        snprintf(err, err_len, "bad endpoint '%s': use tcp:HOST:PORT or tls:HOST:PORT, a port from 1 to 65535 "
                 "(0: any, to listen)", endpoint);
        return false;
    }
    memcpy(a->host, p, host_len);
    a->host[host_len] = '\0';
    a->kind = APIR_NET_TCP;
    a->tls = tls;
    return true;
}

void apir_net_tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = 5, interval = 3, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    unsigned user_timeout_ms = 20000;  /* data sent and never acknowledged */
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

/* connect() with a deadline. */
static int connect_within(int fd, const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, sa, len);
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        rc = poll(&p, 1, timeout_ms);
        if (rc == 0) {
            errno = ETIMEDOUT;
            rc = -1;
        } else if (rc > 0) {
            int soerr = 0;
            socklen_t l = sizeof(soerr);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l);
            errno = soerr;
            rc = soerr ? -1 : 0;
        }
    }
    fcntl(fd, F_SETFL, flags);
    return rc;
}

/* A vsock socket listening on, or connected to, a's CID and port; -1 with
 * err set. */
static int vsock_open(const struct apir_net_addr *a, bool listening, int timeout_ms, char *err, size_t err_len)
{
#ifdef HAVE_VSOCK
    int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_vm vm = { .svm_family = AF_VSOCK, .svm_cid = a->cid, .svm_port = a->port };
    const bool ok = fd >= 0 && (listening ? bind(fd, (struct sockaddr *)&vm, sizeof(vm)) == 0 && listen(fd, 64) == 0
                                          : connect_within(fd, (struct sockaddr *)&vm, sizeof(vm), timeout_ms) == 0);
    if (!ok) {
        snprintf(err, err_len, "cannot %s vsock:%u:%u: %s", listening ? "listen on" : "connect to", a->cid,
                 (unsigned)a->port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
#else
    (void)a;
    (void)listening;
    (void)timeout_ms;
    snprintf(err, err_len, "vsock is not available on this system");
    return -1;
#endif
}

int apir_net_connect(const struct apir_net_addr *a, int timeout_ms, char *err, size_t err_len)
{
    if (a->port == 0) {
        snprintf(err, err_len, "port 0: a guest needs the host's port (a listener's port 0 is chosen at start)");
        return -1;
    }
    if (a->kind == APIR_NET_VSOCK)
        return vsock_open(a, false, timeout_ms, err, err_len);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)a->port);
    int gai = getaddrinfo(a->host, port, &hints, &res);
    if (gai != 0) {
        snprintf(err, err_len, "cannot resolve %s: %s", a->host, gai_strerror(gai));
        return -1;
    }
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (connect_within(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms) != 0) {
            last = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_len, "cannot connect to %s:%s:%u: %s", a->tls ? "tls" : "tcp", a->host, (unsigned)a->port,
                 strerror(last));
        return -1;
    }
    apir_net_tune(fd);
    return fd;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(x))
            return true;
        /* ::ffff:127.x.y.z */
        return IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127;
    }
    return false;
}

int apir_net_listen(const struct apir_net_addr *a, bool *loopback_only, char *err, size_t err_len)
{
    *loopback_only = false;
    if (a->kind == APIR_NET_VSOCK) {
        *loopback_only = a->cid == 1;  /* VMADDR_CID_LOCAL: this machine only */
        return vsock_open(a, true, -1, err, err_len);
    }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)a->port);
    int gai = getaddrinfo(a->host, port, &hints, &res);
    if (gai != 0 || !res) {
        snprintf(err, err_len, "cannot resolve %s: %s", a->host, gai ? gai_strerror(gai) : "no address");
        return -1;
    }
    /* The first address: a name that resolves to several is ambiguous for a
     * listener; say the address itself to listen on more than one. */
    struct addrinfo *ai = res;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        snprintf(err, err_len, "cannot listen on %s:%s:%u: %s", a->tls ? "tls" : "tcp", a->host, (unsigned)a->port,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    *loopback_only = is_loopback(ai->ai_addr);
    freeaddrinfo(res);
    return fd;
}

uint16_t apir_net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
#ifdef HAVE_VSOCK
    if (ss.ss_family == AF_VSOCK)
        return (uint16_t)((struct sockaddr_vm *)&ss)->svm_port;
#endif
    return 0;
}

void apir_net_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char addr[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(buf, len, "(peer unknown)");
        return;
    }
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, addr, sizeof(addr));
        snprintf(buf, len, "%s:%u", addr, (unsigned)ntohs(s4->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, addr, sizeof(addr));
        snprintf(buf, len, "[%s]:%u", addr, (unsigned)ntohs(s6->sin6_port));
#ifdef HAVE_VSOCK
    } else if (ss.ss_family == AF_VSOCK) {
        const struct sockaddr_vm *vm = (const struct sockaddr_vm *)&ss;
        snprintf(buf, len, "vsock:%u:%u", vm->svm_cid, vm->svm_port);
#endif
    } else {
        snprintf(buf, len, "(family %d)", (int)ss.ss_family);
    }
}

/* ---- reads and writes with deadlines ----------------------------------- */

/* Milliseconds left before deadline_ns (0: none): -1 for no deadline. */
static int left_ms(uint64_t deadline_ns)
{
    if (!deadline_ns)
        return -1;
    uint64_t now = apir_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
}

static uint64_t deadline_after(int timeout_ms)
{
    return timeout_ms < 0 ? 0 : apir_now_ns() + (uint64_t)timeout_ms * 1000000ull + 1;
}

static bool wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        struct pollfd p = { .fd = fd, .events = events };
        int rc = poll(&p, 1, left_ms(deadline_ns));
        if (rc > 0)
            return true;
        if (rc == 0) {
            errno = ETIMEDOUT;
            return false;
        }
        if (errno != EINTR)
            return false;
    }
}

bool apir_net_reader_init(struct apir_net_reader *r, int fd, size_t cap)
{
    r->fd = fd;
    r->tls = NULL;
    r->spin_ns = 0;
    r->head = r->tail = 0;
    r->cap = cap;
    r->buf = malloc(cap);
    return r->buf != NULL;
}

void apir_net_reader_free(struct apir_net_reader *r)
{
    free(r->buf);
    r->buf = NULL;
}

/*
 * Before sleeping in poll, a reader spins (yielding) for up to its spin_ns:
 * a sleep and wake-up costs ~40 us per direction on these machines, which
 * on a loopback or fast link is most of a round trip.  Bounded, like the
 * shm transport's spin; 0 sleeps at once.
 */
static bool spin_until(int fd, short events, uint64_t spin_ns)
{
    if (!spin_ns)
        return false;
    const uint64_t end = apir_now_ns() + spin_ns;
    do {
        struct pollfd p = { .fd = fd, .events = events };
        if (poll(&p, 1, 0) > 0)
            return true;
        sched_yield();
    } while (apir_now_ns() < end);
    return false;
}

static bool spin_readable(int fd, uint64_t spin_ns)
{
    return spin_until(fd, POLLIN, spin_ns);
}

/*
 * A writer whose socket buffer is full spins too, before sleeping for room:
 * a reply larger than the send buffer (a token's logits, 513 KB for a
 * 128256-word vocabulary) fills it several times over while the peer,
 * spinning on its side, drains it within microseconds; sleeping for each
 * refill cost ~40 us a time (a 513 KB read-back over loopback: 426 us with
 * the sleeps, write of the same size 63 us).  Same bound as the reader's.
 */
static bool spin_writable(int fd)
{
    return spin_until(fd, POLLOUT, (uint64_t)apir_spin_us() * 1000);
}

bool apir_net_wait_readable(struct apir_net_reader *r, int timeout_ms)
{
    if (r->tail > r->head || (r->tls && apir_tls_pending(r->tls)) || spin_readable(r->fd, r->spin_ns))
        return true;
    return wait_fd(r->fd, POLLIN, deadline_after(timeout_ms));
}

/* One recv into dst, waiting at most timeout_ms (< 0: no limit) for
 * bytes, spinning spin_ns first: how many were read, or -1 (errno; EPIPE
 * for a closed peer).  The spin is a budget for the call, not one spin:
 * through TLS the socket turns readable with part of a record, which
 * GnuTLS holds back until the rest is in - a sleep after the first such
 * wake-up cost a token's logits over loopback TLS one wake-up a record. */
static ssize_t recv_some(int fd, struct apir_tls *tls, void *dst, size_t n, int timeout_ms, uint64_t spin_ns)
{
    const uint64_t deadline_ns = deadline_after(timeout_ms);
    uint64_t spin_end = 0;
    for (;;) {
        ssize_t got = tls ? apir_tls_recv(tls, dst, n) : recv(fd, dst, n, MSG_DONTWAIT);
        if (got > 0)
            return got;
        if (got == 0) {
            errno = EPIPE;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        const bool wants_write = tls && apir_tls_wants_write(tls);
        /* Within a payload a tls: session's read thread takes the socket's
         * bytes: wait for it, not for the socket. */
        const int bulk = tls && !wants_write ? apir_tls_bulk_wait(tls, deadline_ns) : 0;
        if (bulk > 0)
            continue;
        if (bulk < 0)
            return -1;
        if (!wants_write && spin_ns) {
            const uint64_t now = apir_now_ns();
            if (!spin_end)
                spin_end = now + spin_ns;
            if (now < spin_end && spin_readable(fd, spin_end - now))
                continue;
        }
        if (!wait_fd(fd, wants_write ? POLLOUT : POLLIN, deadline_ns))
            return -1;
    }
}

/* A tls: payload at least this large is read with the session's read
 * thread (where it has one): a token's logits (513 KiB), downloads; not
 * replies of a few records, where waking the thread costs more than it
 * saves. */
#define TLS_BULK_MIN (128u * 1024u)

int apir_net_read(struct apir_net_reader *r, void *dst, size_t n, int timeout_ms, bool *eof_clean)
{
    uint8_t *out = dst;
    size_t done = 0;
    bool bulk = false;
    if (eof_clean)
        *eof_clean = false;
    while (done < n) {
        if (r->tail > r->head) {
            size_t k = r->tail - r->head < n - done ? r->tail - r->head : n - done;
            memcpy(out + done, r->buf + r->head, k);
            r->head += k;
            done += k;
            continue;
        }
        r->head = r->tail = 0;
        ssize_t got;
        if (n - done >= r->cap / 2) {
            /* A payload: straight into its destination (a large one over
             * tls: with the session's read thread, apir_tls_bulk). */
            if (r->tls && !bulk && n - done >= TLS_BULK_MIN) {
                apir_tls_bulk(r->tls, true);
                bulk = true;
            }
            got = recv_some(r->fd, r->tls, out + done, n - done, timeout_ms, r->spin_ns);
            if (got > 0)
                done += (size_t)got;
        } else {
            got = recv_some(r->fd, r->tls, r->buf, r->cap, timeout_ms, r->spin_ns);
            if (got > 0)
                r->tail = (size_t)got;
        }
        if (got < 0) {
            if (eof_clean && errno == EPIPE && done == 0)
                *eof_clean = true;
            const int err = errno;
            if (bulk)
                apir_tls_bulk(r->tls, false);
            errno = err;
            return -1;
        }
    }
    if (bulk)
        apir_tls_bulk(r->tls, false);
    return 0;
}

static int tls_write_all(int fd, struct apir_tls *tls, const uint8_t *p, size_t left, int timeout_ms)
{
    while (left) {
        ssize_t sent = apir_tls_send(tls, p, left);
        if (sent > 0) {
            p += sent;
            left -= (size_t)sent;
        } else if (sent < 0 && errno == EAGAIN) {
            const bool for_room = apir_tls_wants_write(tls);
            if (!(for_room && spin_writable(fd)) && !wait_fd(fd, for_room ? POLLOUT : POLLIN, deadline_after(timeout_ms)))
                return -1;
        } else {
            if (sent == 0)
                errno = EPIPE;
            return -1;
        }
    }
    return 0;
}

/* Through TLS: each record is sealed and sent on its own, so small pieces
 * (a frame's header, its ranges, the command; a reply's header and bytes)
 * are gathered into one record first - one seal, one send and, on the
 * other side, one record to open instead of two to four.  Payloads go
 * from where they lie (the session encrypts into its own buffers). */
#define TLS_GATHER_BYTES 4096
static int tls_write(int fd, struct apir_tls *tls, struct iovec *iov, int n_iov, int timeout_ms)
{
    uint8_t small[TLS_GATHER_BYTES];
    size_t n_small = 0;
    for (int i = 0; i < n_iov; i++) {
        const size_t len = iov[i].iov_len;
        if (len > sizeof(small) - n_small && n_small) {
            if (tls_write_all(fd, tls, small, n_small, timeout_ms) != 0)
                return -1;
            n_small = 0;
        }
        if (len <= sizeof(small) - n_small) {
            if (len)
                memcpy(small + n_small, iov[i].iov_base, len);
            n_small += len;
        } else if (tls_write_all(fd, tls, iov[i].iov_base, len, timeout_ms) != 0) {
            return -1;
        }
    }
    return n_small ? tls_write_all(fd, tls, small, n_small, timeout_ms) : 0;
}

int apir_net_send(int fd, struct apir_tls *tls, struct iovec *iov, int n_iov, int timeout_ms)
{
    return tls ? tls_write(fd, tls, iov, n_iov, timeout_ms) : apir_net_write(fd, iov, n_iov, timeout_ms);
}

/* How many of the n pieces up to the last one that holds bytes. */
static int pieces_with_bytes(const struct iovec *iov, int n)
{
    while (n > 0 && iov[n - 1].iov_len == 0)
        n--;
    return n;
}

/* At most this many bytes in several pieces are copied together and sent
 * at once (a frame's header and arguments, most replies). */
#define NET_GATHER_MAX 4096

/* With send(), not one gathering sendmsg, which a host worker may not call
 * (host/server/sandbox.c: a filter cannot see what its control data passes):
 * small messages copied into one piece, larger ones piece by piece with
 * MSG_MORE on all but the last, so they still leave in full segments. */
int apir_net_write(int fd, struct iovec *iov, int n_iov, int timeout_ms)
{
    n_iov = pieces_with_bytes(iov, n_iov);
    uint8_t gathered[NET_GATHER_MAX];
    struct iovec one;
    size_t total = 0;
    for (int i = 0; i < n_iov && total <= sizeof(gathered); i++)
        total += iov[i].iov_len;
    if (n_iov > 1 && total <= sizeof(gathered)) {
        for (int i = 0, at = 0; i < n_iov; at += (int)iov[i].iov_len, i++)
            memcpy(gathered + at, iov[i].iov_base, iov[i].iov_len);
        one = (struct iovec){ gathered, total };
        iov = &one;
        n_iov = 1;
    }
    while (n_iov > 0) {
        if (iov->iov_len == 0) {
            iov++;
            n_iov--;
            continue;
        }
        ssize_t sent = send(fd, iov->iov_base, iov->iov_len, MSG_DONTWAIT | MSG_NOSIGNAL | (n_iov > 1 ? MSG_MORE : 0));
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return -1;
            if (!spin_writable(fd) && !wait_fd(fd, POLLOUT, deadline_after(timeout_ms)))
                return -1;
            continue;
        }
        iov->iov_base = (uint8_t *)iov->iov_base + sent;
        iov->iov_len -= (size_t)sent;
    }
    return 0;
}
