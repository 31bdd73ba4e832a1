#include "upload_mirror.h"
#include "pin.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <stdlib.h>
#include <string.h>

struct apir_mirror_entry {
    ggml_backend_buffer_t buf;   /* NULL: unused */
    const uint8_t *start;        /* device range [start, start + len) */
    size_t len;
    uint8_t *mem;
    size_t cap;
    bool page_locked;            /* mem, for the device copy (pin.c) */
};

struct apir_mirror {
    struct apir_mirror_entry entries[APIR_MIRROR_ENTRIES];
    uint32_t next;                         /* the entry the next upload takes */
    /* Small uploads queued on a backend stream from page-locked entry
     * memory, not yet known complete. */
    ggml_backend_t uploads_backend;
    uint32_t uploads_in_flight;
};

struct apir_mirror *apir_mirror_new(void)
{
    return calloc(1, sizeof(struct apir_mirror));
}

void apir_mirror_free(struct apir_mirror *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < APIR_MIRROR_ENTRIES; i++) {
        if (m->entries[i].page_locked)
            apir_unpin(m->entries[i].mem);
        free(m->entries[i].mem);
    }
    free(m);
}

uint32_t apir_mirror_uploads_in_flight(const struct apir_session *s)
{
    return s->mirror->uploads_in_flight;
}

void apir_mirror_wait_uploads(struct apir_session *s, ggml_backend_t synced)
{
    struct apir_mirror *m = s->mirror;
    if (!m->uploads_in_flight)
        return;
    /* Those on the synchronized stream were queued before what it ran. */
    if (m->uploads_backend != synced)
        ggml_backend_synchronize(m->uploads_backend);
    m->uploads_in_flight = 0;
}

void apir_session_settle(struct apir_session *s)
{
    ggml_backend_t synced = s->graph_in_flight;
    if (synced) {
        ggml_backend_synchronize(synced);
        s->graph_in_flight = NULL;
    }
    apir_mirror_wait_uploads(s, synced);
}

static bool overlaps(const struct apir_mirror_entry *e, ggml_backend_buffer_t buf, const uint8_t *p, size_t len)
{
    return e->buf == buf && e->start < p + len && p < e->start + e->len;
}

void apir_mirror_forget_range(struct apir_session *s, ggml_backend_buffer_t buf, const void *data, size_t len)
{
    struct apir_mirror_entry *entries = s->mirror->entries;
    for (uint32_t i = 0; i < APIR_MIRROR_ENTRIES; i++)
        if (entries[i].buf && overlaps(&entries[i], buf, data, len ? len : 1))
            entries[i].buf = NULL;
}

void apir_mirror_forget_buffer(struct apir_session *s, ggml_backend_buffer_t buf)
{
    struct apir_mirror_entry *entries = s->mirror->entries;
    for (uint32_t i = 0; i < APIR_MIRROR_ENTRIES; i++)
        if (entries[i].buf == buf)
            entries[i].buf = NULL;
}

bool apir_mirror_upload(struct apir_session *s, struct ggml_tensor *t, const uint8_t *src, uint64_t offset, uint64_t size)
{
    if (size > APIR_MIRROR_MAX_BYTES || ggml_backend_buffer_is_host(t->buffer))
        return false;
    struct apir_mirror *m = s->mirror;
    uint8_t *dst = (uint8_t *)t->data + offset;
    apir_mirror_forget_range(s, t->buffer, dst, (size_t)size);
    /* Every entry may have a copy in flight: wait before reusing one. */
    if (m->uploads_in_flight >= APIR_MIRROR_ENTRIES)
        apir_session_settle(s);
    struct apir_mirror_entry *e = &m->entries[m->next];
    m->next = (m->next + 1) % APIR_MIRROR_ENTRIES;
    if (e->cap < size) {
        void *p = malloc(APIR_MIRROR_MAX_BYTES);
        if (!p) {
            e->buf = NULL;
            return false;
        }
        /* Page-locked, the device copy below is a direct DMA (pin.c). */
        e->page_locked = s->host->pin_shared && apir_pin(p, APIR_MIRROR_MAX_BYTES);
        e->mem = p;
        e->cap = APIR_MIRROR_MAX_BYTES;
    }
    /* One read of the shared bytes; the device gets exactly the copy. */
    memcpy(e->mem, src, (size_t)size);
    ggml_backend_t be = s->backends[s->device];
    if (be && s->backend_async[s->device] &&
        ggml_backend_buffer_get_type(t->buffer) == ggml_backend_get_default_buffer_type(be) &&
        (!m->uploads_in_flight || m->uploads_backend == be)) {
        /*
         * Queued on the stream the graphs run on, without waiting: a
         * token's inputs are half a dozen small uploads, each a stream
         * synchronization otherwise (~10 us on the H200).  The source is
         * our own copy (page-locked on a GPU host), untouched until the copy is known done
         * (apir_session_settle); anything else that may reach the memory
         * settles first (apir_session_forward), a graph on this stream is
         * ordered after it.
         */
        ggml_backend_tensor_set_async(be, t, e->mem, (size_t)offset, (size_t)size);
        m->uploads_backend = be;
        m->uploads_in_flight++;
    } else {
        apir_session_settle(s);
        ggml_backend_tensor_set(t, e->mem, (size_t)offset, (size_t)size);
    }
    e->buf = t->buffer;
    e->start = dst;
    e->len = (size_t)size;
    return true;
}

const uint8_t *apir_mirror_find(struct apir_session *s, ggml_backend_buffer_t buf, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (uint32_t i = 0; i < APIR_MIRROR_ENTRIES; i++) {
        const struct apir_mirror_entry *e = &s->mirror->entries[i];
        if (e->buf == buf && p >= e->start && p + len <= e->start + e->len)
            return e->mem + (p - e->start);
    }
    return NULL;
}

void apir_mirror_forget_written(struct apir_session *s, struct ggml_cgraph *graph)
{
    bool any = false;
    for (uint32_t i = 0; i < APIR_MIRROR_ENTRIES && !any; i++)
        any = s->mirror->entries[i].buf != NULL;
    if (!any)
        return;
    ggml_backend_buffer_t last = NULL;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        const struct ggml_tensor *n = ggml_graph_node(graph, i);
        if (n->buffer && n->buffer != last) {
            last = n->buffer;
            apir_mirror_forget_buffer(s, last);
        }
    }
}
