/*
 * Stream sockets for the stream transport (stream_proto.h): endpoint
 * strings, connecting and listening with the options a remoting link wants,
 * and reads and writes with deadlines.  Used by the guest (stream_client.c)
 * and the host (host/server/stream.c).
 */
#ifndef APIR_NET_H
#define APIR_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum apir_net_kind { APIR_NET_TCP, APIR_NET_VSOCK };

struct apir_tls;

struct apir_net_addr {
    enum apir_net_kind kind;
    bool tls;               /* tls:HOST:PORT - TCP with TLS 1.3 (transport/tls.h) */
    char host[96];          /* tcp: a name or an address (IPv6 without its brackets) */
    uint32_t cid;           /* vsock */
    uint16_t port;
};

/* True when endpoint names a stream endpoint: "tcp:HOST:PORT",
 * "tcp:[V6ADDR]:PORT", "tls:" with the same forms, or "vsock:CID:PORT".  False with err set otherwise
 * (a malformed one; other schemes are not ours: see apir_net_is_stream). */
bool apir_net_parse(const char *endpoint, struct apir_net_addr *a, char *err, size_t err_len);
bool apir_net_is_stream(const char *endpoint);

/* A connected, tuned socket, or -1 with err set (the endpoint named). */
int apir_net_connect(const struct apir_net_addr *a, int timeout_ms, char *err, size_t err_len);

/* A listening socket; *loopback_only tells whether every address it
 * accepts on is a loopback one (the host's rule for unauthenticated
 * listeners).  -1 with err set. */
int apir_net_listen(const struct apir_net_addr *a, bool *loopback_only, char *err, size_t err_len);

/* The port a listening socket got (port 0 asks the kernel for one). */
uint16_t apir_net_local_port(int fd);

/* TCP_NODELAY (a command is one write; nothing to coalesce), keepalive and
 * a user timeout: a peer that vanished without a word (a cut link, a
 * powered-off machine) is noticed within about 20 s, not hours. */
void apir_net_tune(int fd);

/* "ADDR:PORT" ("[V6]:PORT", "vsock:CID:PORT") of the peer, for log lines. */
void apir_net_peer_name(int fd, char *buf, size_t len);

/*
 * A buffered reader: small items (headers, replies) come out of one
 * recv each, large payloads are read straight into their destination.
 * timeout_ms bounds each wait for more bytes (a stalled peer), not the
 * whole transfer (a large one on a slow link); < 0: no limit.  Returns 0, or -1 with errno (ETIMEDOUT,
 * ECONNRESET, and EPIPE for a peer that closed; *eof_clean is set when it
 * closed between items, i.e. before the first byte of this read).
 */
struct apir_net_reader {
    int fd;
    struct apir_tls *tls;   /* NULL: the socket itself; set after init for TLS */
    uint64_t spin_ns;       /* how long a wait spins before sleeping (net.c); 0 after init */
    uint8_t *buf;
    size_t cap, head, tail;
};
bool apir_net_reader_init(struct apir_net_reader *r, int fd, size_t cap);
void apir_net_reader_free(struct apir_net_reader *r);
int apir_net_read(struct apir_net_reader *r, void *dst, size_t n, int timeout_ms, bool *eof_clean);
/* Waits until something is there to read (or the peer closed); false on
 * timeout (timeout_ms < 0: none) or error. */
bool apir_net_wait_readable(struct apir_net_reader *r, int timeout_ms);

/* Writes all of iov (changed as it goes), each wait for room bounded by
 * timeout_ms; 0, or -1 with errno. */
int apir_net_write(int fd, struct iovec *iov, int n_iov, int timeout_ms);
/* The same through TLS when tls is not NULL. */
int apir_net_send(int fd, struct apir_tls *tls, struct iovec *iov, int n_iov, int timeout_ms);

#endif
