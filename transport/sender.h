/*
 * A socket written by a thread of its own.
 *
 * What for: a tls: host seals a download record by record (transport/tls.c)
 * and used to send each one before sealing the next, on one thread: on an
 * H200 a 513 KiB read-back (a token's logits) took ~438 us through TLS
 * against 128 through plain TCP, ~9.5 us a 16 KiB record, about what
 * sealing it (~3.4 us) and sending it through loopback TCP cost together
 * (docs/MEASUREMENTS.md).  With a sender, the caller copies each record
 * into a ring and goes on sealing the next while this thread hands the
 * previous ones to the kernel.
 *
 * One writer (the caller) and this thread: a ring of fixed size, made at
 * start (no allocation per write).  The thread spins briefly when the ring
 * runs empty, then sleeps on a futex; the writer sleeps likewise when the
 * ring is full.  A send that fails, or a socket that takes nothing for
 * timeout_ms, fails every write after it (errno of the failure): the
 * caller hangs up, as it would have on its own send.  Bytes leave in the
 * order they were written.  A small write while the ring is empty (a
 * command's reply) is sent by the caller itself, not queued: waking the
 * thread for it cost more than the send.  Only send(), poll() and futexes: what a
 * sandboxed host worker may call (host/server/sandbox.c).
 */
#ifndef APIR_SENDER_H
#define APIR_SENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct apir_sender;

/* Starts the thread for fd (a connected stream socket the caller keeps
 * reading, and closes after apir_sender_stop).  NULL, with errno, when the
 * ring or the thread cannot be had. */
struct apir_sender *apir_sender_start(int fd, size_t ring_bytes, int timeout_ms);

/* Queues the n pieces' bytes, waiting for room as needed.  Their total, or
 * -1 with errno when the thread has failed (nothing more goes out). */
ssize_t apir_sender_write(struct apir_sender *s, const struct iovec *iov, int n);

/* Waits until every byte written has been handed to the kernel, at most
 * timeout_ms; false if that did not happen (a failure, or the time). */
bool apir_sender_flush(struct apir_sender *s, int timeout_ms);

/* Sends as much of the n pieces as fd takes now, without waiting: send()
 * piece by piece, MSG_MORE on all but the last (not one sendmsg, which a
 * sandboxed host worker may not call).  The bytes sent, or -1 with errno
 * when nothing went (EAGAIN: the socket takes nothing now).  The writer's
 * own sends above, and a tls: session's without a sender (tls.c). */
ssize_t apir_send_now(int fd, const struct iovec *iov, int n);

/* Bytes the writer sent itself (the small writes above), for tests and
 * profiles. */
uint64_t apir_sender_direct_bytes(const struct apir_sender *s);

/* Sends what is queued (at most a second more: a peer that reads nothing
 * is not waited for), ends the thread, frees.  NULL: nothing. */
void apir_sender_stop(struct apir_sender *s);

#endif
