/*
 * TLS 1.3 for the stream transport ("tls:HOST:PORT"), through GnuTLS: the
 * link between a guest and a host on another machine, encrypted and
 * mutually authenticated by a pre-shared key (PSK, with an ephemeral
 * (EC)DHE exchange for forward secrecy).  No certificate authority to run:
 * the operator gives each guest (or group of guests) an identity and a
 * key, the host a file of them, and the host's logs name the identity.
 *
 * Key files hold lines "IDENTITY:HEXKEY" (GnuTLS psktool's format; the key
 * 16 to 64 bytes); '#' starts a comment.  A guest uses the first line of
 * its file.
 *
 * Sockets are non-blocking underneath: every call returns rather than wait
 * (the caller polls with its own deadline, transport/net.c).
 */
#ifndef APIR_TLS_H
#define APIR_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct apir_tls;
struct apir_tls_keys;

/* The keys of a file (host: all lines; guest: the first).  NULL with err,
 * also when GnuTLS cannot be loaded (it is loaded here, at the first key:
 * before a worker's sandbox). */
struct apir_tls_keys *apir_tls_keys_load(const char *path, bool first_only, char *err, size_t err_len);
/* A guest's key from a string "IDENTITY:HEXKEY" (APIR_TLS_PSK). */
struct apir_tls_keys *apir_tls_keys_parse(const char *line, char *err, size_t err_len);
void apir_tls_keys_free(struct apir_tls_keys *k);
size_t apir_tls_keys_count(const struct apir_tls_keys *k);

/* Handshakes on connected socket fd, waiting at most timeout_ms for the
 * peer at each step.  NULL with err set (a wrong key, a peer speaking
 * something else, a timeout).  The session does not own fd. */
struct apir_tls *apir_tls_client(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len);
struct apir_tls *apir_tls_server(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len);

/* The identity the peer authenticated with (server side), for log lines. */
const char *apir_tls_identity(const struct apir_tls *t);

/* As recv/send with MSG_DONTWAIT: bytes moved; 0 from recv when the peer
 * closed; -1 with errno (EAGAIN: try again after poll; EPROTO: a TLS
 * error, the connection is done). */
ssize_t apir_tls_recv(struct apir_tls *t, void *buf, size_t len);
ssize_t apir_tls_send(struct apir_tls *t, const void *buf, size_t len);
/* Decrypted bytes waiting inside the session (poll would not see them). */
bool apir_tls_pending(struct apir_tls *t);
/* What an EAGAIN waits for: true to write, false to read. */
bool apir_tls_wants_write(struct apir_tls *t);
void apir_tls_free(struct apir_tls *t);

#endif
