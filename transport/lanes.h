/*
 * A stream session's lanes: extra connections beside its first one, each
 * moved by a thread of its own, so that a large payload crosses on several
 * cores at once (stream_proto.h has the wire rules).
 *
 * Why: over one TCP connection a payload costs two kernel copies, one on
 * each side, on one core each (over TLS, sealing and opening each record
 * too); a token's 513 KB of logits took 110-140 us
 * through loopback on an H200 where the device's own copy takes 54
 * (docs/MEASUREMENTS.md).  Cut in parts, one per connection, the copies
 * run side by side.
 *
 * The owner (the thread serving the session, or the guest's caller) posts
 * one job per lane - send or receive [p, p + n) - and waits for them all;
 * each lane's bytes go through its socket in order, so a lane needs no
 * header of its own.  A send may be gated: the lanes send only what lies
 * before the point the owner says is ready (a download the device still
 * copies: download_pieces.h).  A lane that fails breaks the set: every
 * later wait fails, and the owner hangs up.  Between jobs a lane spins
 * briefly, then sleeps on a futex; in a job it spins as long as the job
 * says (the reply's spin) before it sleeps in poll.
 */
#ifndef APIR_LANES_H
#define APIR_LANES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct apir_lanes;

/* An empty set; timeout_ms bounds each wait of a job for its socket (a
 * stalled peer), not a whole job.  NULL when out of memory. */
struct apir_lanes *apir_lanes_new(int timeout_ms);

/* Adds a connected stream socket as the next lane and starts its thread;
 * the socket, and tls (the lane's own TLS session over it, for a tls:
 * session; NULL: plain), are the set's from then (freed by
 * apir_lanes_free).  Any thread may add while the owner works: the owner
 * sees the lane once apir_lanes_count counts it.  False (errno; fd closed,
 * tls freed) at the limit or without a thread. */
struct apir_tls;
bool apir_lanes_add(struct apir_lanes *l, int fd, struct apir_tls *tls);
uint32_t apir_lanes_count(const struct apir_lanes *l);

/* The owner.  Lane i sends or receives [p, p + n); spin_ns: how long its
 * waits for the socket spin before they sleep. */
void apir_lanes_post(struct apir_lanes *l, uint32_t i, bool send, void *p, size_t n, uint64_t spin_ns);
/* One payload [p, p + total) split over the first `lanes` lanes as the
 * wire says (apir_stream_lane_part): part k posted to lane k - 1 for k in
 * 1..lanes.  Returns part 0's length: the part the owner moves on its own
 * connection, from p. */
size_t apir_lanes_post_parts(struct apir_lanes *l, bool send, uint8_t *p, uint64_t total, uint32_t lanes,
                             uint64_t spin_ns);
/* Gates the sends posted after this: nothing at or past ready_end goes out
 * until apir_lanes_ready moves it.  NULL: no gate (the default). */
void apir_lanes_gate(struct apir_lanes *l, const uint8_t *ready_end);
void apir_lanes_ready(struct apir_lanes *l, const uint8_t *ready_end);
/* Waits until every posted job ended, spinning spin_ns first.  0, or -1
 * with the errno of the lane that failed (then every later call fails).
 * Clears the gate. */
int apir_lanes_wait(struct apir_lanes *l, uint64_t spin_ns);
/* Fails the set: lanes in a job stop (their sockets shut down), waiters
 * return -1.  What an owner does before it gives up on a frame. */
void apir_lanes_break(struct apir_lanes *l, int err);
/* apir_lanes_break, then the wait for every lane to stop: after it no lane
 * touches a job's memory (the owner may free or reuse it). */
void apir_lanes_abandon(struct apir_lanes *l, int err);

/* Ends the threads, closes the sockets, frees.  NULL: nothing. */
void apir_lanes_free(struct apir_lanes *l);

#endif
