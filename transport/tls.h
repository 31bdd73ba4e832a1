/*
 * TLS 1.3 for the stream transport ("tls:HOST:PORT"), through GnuTLS: the
 * link between a guest and a host on another machine, encrypted (always an
 * ephemeral (EC)DHE exchange: forward secrecy) and authenticated in one of
 * two ways:
 *
 *  - a pre-shared key (PSK), mutual: no certificate authority to run; the
 *    operator gives each guest (or group of guests) an identity and a key,
 *    the host a file of them, and the host's logs name the identity.  Key
 *    files hold lines "IDENTITY:HEXKEY" (GnuTLS psktool's format; the key
 *    16 to 64 bytes); '#' starts a comment.  A guest uses the first line of
 *    its file.
 *  - X.509 certificates: the host presents its certificate, which a guest
 *    checks against its CA file and the host's name; with a client CA the
 *    host asks every guest for a certificate chaining to it (the logs name
 *    its subject).  Without a client CA any guest gets in: the host allows
 *    that on a loopback address only (host/server/stream.c).
 *
 * A host may have both (each guest uses either); a guest uses its key if it
 * has one, else certificates.  Everything is read when loaded (a host
 * worker loads before its sandbox forbids opening files): a handshake
 * opens no file.
 *
 * Sockets are non-blocking underneath: every call returns rather than wait
 * (the caller polls with its own deadline, transport/net.c).
 */
#ifndef APIR_TLS_H
#define APIR_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct apir_tls;
struct apir_tls_keys;   /* one side's credentials: pre-shared keys and/or certificates */

/* The keys of a file (host: all lines; guest: the first).  NULL with err,
 * also when GnuTLS cannot be loaded (it is loaded here, at the first key or
 * certificate: before a worker's sandbox). */
struct apir_tls_keys *apir_tls_keys_load(const char *path, bool first_only, char *err, size_t err_len);
/* A guest's key from a string "IDENTITY:HEXKEY" (APIR_TLS_PSK). */
struct apir_tls_keys *apir_tls_keys_parse(const char *line, char *err, size_t err_len);
void apir_tls_keys_free(struct apir_tls_keys *k);
size_t apir_tls_keys_count(const struct apir_tls_keys *k);  /* pre-shared keys */

/* Certificates (PEM files) added to k, or to a new set if k is NULL: this
 * side's chain (its certificate first, then intermediates) and private key,
 * both or neither, and/or ca_file, the CAs the peer's certificate must
 * chain to.  NULL (k freed) with err on failure: a file unreadable, a key
 * that does not match, a CA file without a certificate. */
struct apir_tls_keys *apir_tls_keys_add_certs(struct apir_tls_keys *k, const char *cert_file, const char *key_file,
                                              const char *ca_file, char *err, size_t err_len);
bool apir_tls_keys_has_cert(const struct apir_tls_keys *k);  /* a chain and key to present */
bool apir_tls_keys_has_ca(const struct apir_tls_keys *k);    /* CAs to check the peer's certificate */

/* Handshakes on connected socket fd, waiting at most timeout_ms for the
 * peer at each step.  NULL with err set (a wrong key or certificate, a peer
 * speaking something else, a timeout).  The session does not own fd.  A
 * guest with certificates checks the host's for server_name (a DNS name or
 * an IP address); a guest with a key ignores it. */
struct apir_tls *apir_tls_client(int fd, const struct apir_tls_keys *keys, const char *server_name, int timeout_ms,
                                 char *err, size_t err_len);
struct apir_tls *apir_tls_server(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len);

/* Who the peer proved to be, for log lines: key "IDENTITY", certificate
 * "SUBJECT DN", or no client certificate (a host without a client CA). */
const char *apir_tls_identity(const struct apir_tls *t);
/* The record cipher the handshake settled on (its GnuTLS name). */
const char *apir_tls_cipher(const struct apir_tls *t);

/* As recv/send with MSG_DONTWAIT: bytes moved; 0 from recv when the peer
 * closed; -1 with errno (EAGAIN: try again after poll; EPROTO: a TLS
 * error, the connection is done). */
ssize_t apir_tls_recv(struct apir_tls *t, void *buf, size_t len);
ssize_t apir_tls_send(struct apir_tls *t, const void *buf, size_t len);
/* The fatal alert that ended a recv with EPROTO, in GnuTLS's words (a host
 * refusing a guest's certificate, which TLS 1.3 does after the guest's
 * handshake is done); "" if none came. */
const char *apir_tls_alert(const struct apir_tls *t);
/* From now on the sealed records are sent by a thread of their own
 * (sender.h: a ring of ring_bytes; a socket that takes nothing for
 * timeout_ms fails the session's sends) while the caller seals the next.
 * False (errno) if the thread cannot be had: sends stay on the caller's
 * thread. */
bool apir_tls_send_from_thread(struct apir_tls *t, size_t ring_bytes, int timeout_ms);
/* From now on a thread of the session's own reads the socket ahead while
 * a payload is read (reader.h: a ring of ring_bytes), so that the kernel's
 * copy of the next record overlaps the opening of this one.  False (errno)
 * if the thread cannot be had: reads stay on the caller's thread. */
bool apir_tls_read_from_thread(struct apir_tls *t, size_t ring_bytes);
/* A payload's read begins (on) or ends (off): with a read thread, it reads
 * the socket between the two; without one, nothing. */
void apir_tls_bulk(struct apir_tls *t, bool on);
/* Within a payload, with a read thread: waits until it has read bytes (or
 * met the end), at most until deadline_ns (apir_now_ns; 0: no limit): 1 if
 * so, -1 with ETIMEDOUT if not.  0 at once without one, or outside a
 * payload: the caller waits for the socket itself. */
int apir_tls_bulk_wait(struct apir_tls *t, uint64_t deadline_ns);
/* Waits until what was sent has been handed to the kernel (at once without
 * a sender thread); false after timeout_ms or a failure. */
bool apir_tls_flush(struct apir_tls *t, int timeout_ms);
/* Bytes waiting inside the session, decrypted or read ahead of GnuTLS
 * (poll would not see them). */
bool apir_tls_pending(struct apir_tls *t);
/* What a session's records cost, for profiles: counted once
 * apir_tls_count_on was called (two clock reads per record and per socket
 * read or write: a few percent of a record's cost), zero before.  A record
 * is opened in GnuTLS, which reads the socket through the session's
 * read-ahead, and then copied out: open_ns - read_ns + copy_ns is the
 * receiving side's crypto and copies, read_ns its kernel's (with a read
 * thread, mostly taking the bytes it read from its ring). */
struct apir_tls_counts {
    uint64_t opened, opened_bytes, open_ns;  /* records opened: the time in GnuTLS, its socket reads included */
    uint64_t reads, read_bytes, read_ns;     /* of which socket reads (recv, under GnuTLS's pull) */
    uint64_t thread_bytes;                   /* of read_bytes, those taken from a read thread's ring */
    uint64_t copy_ns;                        /* opened bytes copied out to the caller */
    uint64_t sends, sent_bytes, send_ns;     /* records sealed (a send seals one): the time in GnuTLS, writes included */
    uint64_t writes, write_ns;               /* of which handing records to the socket or the sender ring */
};
void apir_tls_count_on(struct apir_tls *t);
void apir_tls_get_counts(const struct apir_tls *t, struct apir_tls_counts *out);
/* The counts in words, for a profile line: per record opened and sealed. */
void apir_tls_describe_counts(const struct apir_tls *t, char *out, size_t len);
/* What an EAGAIN waits for: true to write, false to read. */
bool apir_tls_wants_write(struct apir_tls *t);
void apir_tls_free(struct apir_tls *t);

#endif
