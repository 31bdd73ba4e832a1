/*
 * A socket read ahead by a thread of its own, while its owner reads a large
 * payload (the mirror of sender.h, for a tls: guest).
 *
 * What for: a tls: guest opens a reply's records on one thread, and for each
 * 16 KiB record it also read the record's bytes out of the socket (the
 * kernel's copy) and then copied the opened bytes to their place: three
 * passes over the data, one after the other (its profile line, tls.h: of
 * ~10.7 us a record on a 2-vCPU machine, 3.8 in socket reads).  While a
 * payload is read (armed), this thread does the socket reads into a ring,
 * and the owner only opens records and copies them out: the kernel's copy
 * of record k + 1 overlaps the opening of record k.
 *
 * One consumer (the owner) and this thread: a ring of fixed size made at
 * start.  Unarmed, the thread reads nothing and the owner reads the socket
 * itself, after the ring is empty: bytes are taken in the order the socket
 * gave them.  Armed, the owner takes bytes only from the ring.  The thread
 * spins briefly when the socket or the ring runs out, then sleeps (poll, a
 * futex); the owner likewise when the ring is empty.  What ends the stream
 * (the peer's close, an error) is kept and given to the owner after the
 * ring's last byte.  Threads may be many here (a guest), so the thread
 * sleeps between payloads and costs nothing while the owner waits for a
 * reply.
 */
#ifndef APIR_READER_H
#define APIR_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct apir_reader;

/* Starts the thread for fd (a connected, non-blocking stream socket the
 * caller keeps, and closes after apir_reader_stop).  NULL, with errno, when
 * the ring, the thread or its wake-up descriptor cannot be had. */
struct apir_reader *apir_reader_start(int fd, size_t ring_bytes);

/* The owner: the thread reads the socket from now on (arm), or stops
 * reading it; disarm returns once the thread is done with any read in
 * progress, so the ring holds everything it read. */
void apir_reader_arm(struct apir_reader *r);
void apir_reader_disarm(struct apir_reader *r);
bool apir_reader_armed(const struct apir_reader *r);

/* Bytes in the ring, or the stream's end waiting behind them. */
bool apir_reader_pending(struct apir_reader *r);

/* Up to len bytes from the ring.  Empty: 0 when the thread met the
 * stream's end (the peer closed), -1 with its errno when it met an error,
 * else -1 with EAGAIN (armed: apir_reader_wait; unarmed: the owner reads
 * the socket itself). */
ssize_t apir_reader_take(struct apir_reader *r, void *buf, size_t len);

/* Armed: waits until the ring has bytes or the end is known, at most until
 * deadline_ns (apir_now_ns; 0: no limit).  False (ETIMEDOUT) if not. */
bool apir_reader_wait(struct apir_reader *r, uint64_t deadline_ns);

/* Ends the thread and frees.  NULL: nothing. */
void apir_reader_stop(struct apir_reader *r);

#endif
