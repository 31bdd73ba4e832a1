/*
 * A download sent while the device is still copying it (stream transports).
 *
 * Over a stream the host copies a tensor out of device memory into its
 * copy of the guest's blob, then writes those bytes into the socket.  One
 * after the other, the device copy is dead time on the token path (a token
 * of a 128256-word vocabulary reads back 513 KB of logits).  Here the copy
 * is queued in pieces on the device's stream, an event after each, and the
 * transport writes each piece as soon as its event has passed: the device
 * copies piece k + 1 while the kernel takes piece k.  On the H200 that
 * read-back over loopback TCP took 137 us in pieces, 148 with the copy
 * first (docs/MEASUREMENTS.md).
 *
 * Only where it is safe and pays: a transport that asked for it
 * (apir_download_pieces_enable), a device with events and its own memory
 * (the CPU backend has neither: its copies stay plain), a tensor in the
 * device's own buffer type (ggml-cuda asserts that of an asynchronous
 * copy), at least two pieces' worth.  Every piece is waited for before the
 * frame ends (apir_download_pieces_finish), whatever happened to the reply,
 * so no copy outlives the command that asked for it (apir_session_free
 * finishes any a transport left, before memory goes).
 */
#ifndef APIR_DOWNLOAD_PIECES_H
#define APIR_DOWNLOAD_PIECES_H

#include "session.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Pieces of one download, at most; a larger download has larger pieces. */
#define APIR_DOWNLOAD_PIECES_MAX 8u

struct apir_download_pieces {
    /* What the transport asked for: the smallest piece in bytes, 0 = off. */
    size_t min_piece;
    /* One event per piece, made on first use for the device they were made
     * on, kept for the session (no allocation on the token path). */
    ggml_backend_event_t events[APIR_DOWNLOAD_PIECES_MAX];
    ggml_backend_dev_t events_dev;
    bool events_missing;        /* the device has none: never again */
    /* The download in flight: [base, base + size) of host memory, pieces of
     * `piece` bytes (the last one shorter); the first `landed` known done. */
    const uint8_t *base;
    size_t size, piece;
    uint32_t n, landed;
};

/* The session's pieces (s->pieces); NULL when memory cannot be had. */
struct apir_download_pieces *apir_download_pieces_new(void);
/* Waits for what is in flight, frees the events. */
void apir_download_pieces_free(struct apir_download_pieces *p);

/* A stream transport: downloads of at least 2 * min_piece bytes go in
 * pieces (APIR_HOST_SEND_PIECE_KB; 0: never). */
void apir_download_pieces_enable(struct apir_session *s, size_t min_piece);

/* Queues the copy of [offset, offset + size) of t into dst in pieces.
 * False: not done (not enabled, not such a device or tensor, too small,
 * a download already in flight): the caller copies the plain way. */
bool apir_download_pieces_start(struct apir_session *s, const struct ggml_tensor *t, uint8_t *dst, uint64_t offset,
                                uint64_t size);

/* For a transport sending [from, end): the end of the bytes from `from`
 * that may be sent now (the device is done with them), at most end.
 * Returns `from` itself when the piece holding it has not landed yet:
 * apir_download_pieces_wait, then ask again. */
const uint8_t *apir_download_pieces_ready(const struct apir_download_pieces *p, const uint8_t *from,
                                          const uint8_t *end);
/* Waits until the piece holding `at` (and every one before it) has landed. */
void apir_download_pieces_wait(struct apir_download_pieces *p, const uint8_t *at);
/* Sends a reply: the n_head pieces of head (its header and items), then
 * each of the n_out download ranges, through send (0, or -1 with errno).
 * A range the device is still copying into goes out as its pieces land:
 * what is ready is sent before each wait, so the device copies the next
 * piece while the kernel takes this one.  Without a download in flight,
 * one send of everything.  Returns what send returned last. */
int apir_download_pieces_send(struct apir_download_pieces *p, const struct iovec *head, int n_head,
                              const struct iovec *outs, int n_out, int (*send)(void *ctx, struct iovec *iov, int n),
                              void *ctx);
/* Waits for every piece and forgets the download (a no-op without one). */
void apir_download_pieces_finish(struct apir_download_pieces *p);

#endif
