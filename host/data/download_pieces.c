/*
 * Downloads sent while the device still copies them (download_pieces.h).
 */
#include "download_pieces.h"

#include "apir_log.h"
#include "ggml-backend.h"

#include <stdlib.h>

struct apir_download_pieces *apir_download_pieces_new(void)
{
    return calloc(1, sizeof(struct apir_download_pieces));
}

void apir_download_pieces_free(struct apir_download_pieces *p)
{
    if (!p)
        return;
    apir_download_pieces_finish(p);
    for (uint32_t i = 0; i < APIR_DOWNLOAD_PIECES_MAX; i++)
        if (p->events[i])
            ggml_backend_event_free(p->events[i]);
    free(p);
}

void apir_download_pieces_enable(struct apir_session *s, size_t min_piece)
{
    if (s->pieces)
        s->pieces->min_piece = min_piece;
}

/* The session's events for dev, made on first use.  False: the device has
 * none (or not enough could be made), said once. */
static bool events_for(struct apir_download_pieces *p, ggml_backend_dev_t dev)
{
    if (p->events_missing)
        return false;
    if (p->events_dev == dev)
        return true;
    /* Another device than the events were made for: made again for this one
     * (a session works on one device at a time; nothing is in flight here). */
    for (uint32_t i = 0; i < APIR_DOWNLOAD_PIECES_MAX; i++) {
        if (p->events[i])
            ggml_backend_event_free(p->events[i]);
        p->events[i] = NULL;
    }
    p->events_dev = NULL;
    for (uint32_t i = 0; i < APIR_DOWNLOAD_PIECES_MAX; i++) {
        p->events[i] = ggml_backend_event_new(dev);
        if (!p->events[i]) {
            APIR_DEBUG("host", "%s has no events: its downloads are sent after the whole copy",
                       ggml_backend_dev_name(dev));
            p->events_missing = true;
            return false;
        }
    }
    p->events_dev = dev;
    return true;
}

/* The buffer a copy of t reads: a view's own buffer is its source's (what
 * ggml-cuda checks before an asynchronous copy). */
static ggml_backend_buffer_t storage_of(const struct ggml_tensor *t)
{
    return t->view_src ? t->view_src->buffer : t->buffer;
}

bool apir_download_pieces_start(struct apir_session *s, const struct ggml_tensor *t, uint8_t *dst, uint64_t offset,
                                uint64_t size)
{
    struct apir_download_pieces *p = s->pieces;
    if (!p || !p->min_piece || p->n || size < 2 * (uint64_t)p->min_piece)
        return false;
    ggml_backend_t be = s->backends[s->device];
    if (!be || !s->backend_async[s->device] || !t->buffer || !storage_of(t) ||
        ggml_backend_buffer_is_host(t->buffer))
        return false;
    ggml_backend_buffer_type_t own = ggml_backend_get_default_buffer_type(be);
    if (ggml_backend_buffer_get_type(t->buffer) != own || ggml_backend_buffer_get_type(storage_of(t)) != own)
        return false;
    if (!events_for(p, ggml_backend_get_device(be)))
        return false;
    /* Pieces of at least min_piece, at most APIR_DOWNLOAD_PIECES_MAX of them. */
    size_t piece = p->min_piece;
    if ((size + piece - 1) / piece > APIR_DOWNLOAD_PIECES_MAX)
        piece = (size_t)((size + APIR_DOWNLOAD_PIECES_MAX - 1) / APIR_DOWNLOAD_PIECES_MAX);
    /* Whatever the stream still runs (a graph, queued uploads) is ahead of
     * these copies on it: ordered, not waited for here. */
    uint32_t n = 0;
    for (uint64_t done = 0; done < size; done += piece, n++) {
        const size_t len = size - done < piece ? (size_t)(size - done) : piece;
        ggml_backend_tensor_get_async(be, t, dst + done, (size_t)(offset + done), len);
        ggml_backend_event_record(p->events[n], be);
    }
    p->base = dst;
    p->size = (size_t)size;
    p->piece = piece;
    p->n = n;
    p->landed = 0;
    return true;
}

const uint8_t *apir_download_pieces_ready(const struct apir_download_pieces *p, const uint8_t *from,
                                          const uint8_t *end)
{
    if (!p || !p->n || from >= end)
        return end;
    const uint8_t *lo = p->base, *hi = p->base + p->size;
    if (from < lo)
        return end < lo ? end : lo;           /* before the download: sendable up to it */
    if (from >= hi)
        return end;                           /* after it */
    const size_t landed_bytes = (size_t)p->landed * p->piece;
    const uint8_t *ready = landed_bytes >= p->size ? hi : lo + landed_bytes;
    if (from >= ready)
        return from;                          /* its piece is still being copied */
    return end < ready ? end : ready;
}

void apir_download_pieces_wait(struct apir_download_pieces *p, const uint8_t *at)
{
    if (!p || !p->n || at < p->base || at >= p->base + p->size)
        return;
    const uint32_t k = (uint32_t)((size_t)(at - p->base) / p->piece);
    /* One stream: the events pass in order, so waiting for piece k's means
     * every piece before it is done too. */
    if (k >= p->landed) {
        if (p->events[k])
            ggml_backend_event_synchronize(p->events[k]);
        p->landed = k + 1;
    }
}

int apir_download_pieces_send(struct apir_download_pieces *p, const struct iovec *head, int n_head,
                              const struct iovec *outs, int n_out, int (*send)(void *ctx, struct iovec *iov, int n),
                              void *ctx)
{
    /* Each send takes what is ready so far; a full list goes out first. */
    struct iovec iov[16];
    int n_iov = 0;
    for (int i = 0; i < n_head; i++) {
        if (n_iov == (int)(sizeof(iov) / sizeof(iov[0]))) {
            if (send(ctx, iov, n_iov) != 0)
                return -1;
            n_iov = 0;
        }
        iov[n_iov++] = head[i];
    }
    for (int i = 0; i < n_out; i++) {
        const uint8_t *at = outs[i].iov_base, *end = at + outs[i].iov_len;
        while (at < end) {
            const uint8_t *ready = apir_download_pieces_ready(p, at, end);
            if (ready == at || n_iov == (int)(sizeof(iov) / sizeof(iov[0]))) {
                if (n_iov && send(ctx, iov, n_iov) != 0)
                    return -1;
                n_iov = 0;
                if (ready == at)
                    apir_download_pieces_wait(p, at);
                continue;
            }
            iov[n_iov++] = (struct iovec){ (void *)at, (size_t)(ready - at) };
            at = ready;
        }
    }
    return n_iov ? send(ctx, iov, n_iov) : 0;
}

void apir_download_pieces_finish(struct apir_download_pieces *p)
{
    if (!p || !p->n)
        return;
    if (p->landed < p->n && p->events[p->n - 1])
        ggml_backend_event_synchronize(p->events[p->n - 1]);
    p->n = 0;
    p->landed = 0;
    p->base = NULL;
    p->size = 0;
}
