#include "upload_mirror.h"
#include "pin.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "wait.h"

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

/*
 * Two halves of host memory that copies are queued from, on one stream:
 * when the uploads move on from one half to the other, an event (ggml's
 * backend events) is recorded behind the copies of the half left; a half
 * is written again only once its event has passed, which by then it
 * normally has (a graph or more ago).  Waiting for the whole stream
 * instead would wait for the graph in flight: the device would idle
 * through the host's next steps.  A device without events: that wait.
 */
struct apir_marks {
    ggml_backend_t backend;                /* the events' stream (NULL: none made) */
    ggml_backend_t no_events;              /* a stream whose device makes none */
    ggml_backend_event_t done[2];
    bool recorded[2];                      /* done[h] is behind half h's copies */
    bool queued[2];                        /* copies queued from half h, not known done */
};

static void marks_free(struct apir_marks *mk)
{
    for (int h = 0; h < 2; h++) {
        if (mk->done[h])
            ggml_backend_event_free(mk->done[h]);
        mk->done[h] = NULL;
        mk->recorded[h] = false;
    }
    mk->backend = NULL;
}

/* Events on be's stream, made once per stream; false: its device makes none. */
static bool marks_ready(struct apir_session *s, struct apir_marks *mk, ggml_backend_t be)
{
    if (mk->backend == be)
        return true;
    if (mk->no_events == be)
        return false;
    /* Only with nothing queued elsewhere (the callers' check): the events
     * of another device's stream go. */
    marks_free(mk);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    mk->done[0] = dev ? ggml_backend_event_new(dev) : NULL;
    mk->done[1] = dev ? ggml_backend_event_new(dev) : NULL;
    if (!mk->done[0] || !mk->done[1]) {
        marks_free(mk);
        mk->no_events = be;
        APIR_INFO("host", "%s: the device makes no events: host copies of uploads are reused after the whole stream",
                  s->name);
        return false;
    }
    mk->backend = be;
    return true;
}

/* The uploads move from half `from` to the other on be's stream: an event
 * behind the copies left (unless one is there already: marks_copied), then
 * the other half's copies known done (its event, or the whole stream). */
static void marks_turn(struct apir_session *s, struct apir_marks *mk, int from, ggml_backend_t be)
{
    const int to = from ^ 1;
    const bool events = marks_ready(s, mk, be);
    if (events && mk->queued[from] && !mk->recorded[from]) {
        ggml_backend_event_record(mk->done[from], be);
        mk->recorded[from] = true;
    }
    if (mk->queued[to]) {
        if (events && mk->recorded[to]) {
            const uint64_t t0 = apir_now_ns();
            ggml_backend_event_synchronize(mk->done[to]);
            s->stats.upload_wait_ns += apir_now_ns() - t0;
            s->stats.n_upload_waits++;
        } else {
            apir_session_settle(s);  /* clears every mark */
        }
    }
    mk->queued[to] = false;
    mk->recorded[to] = false;
}

/*
 * A copy from half h was just queued on be's stream (events ready): its
 * event is recorded right behind it.  Recorded only at the turn instead, it
 * would also be behind every graph launched since, and the next turn back
 * would wait for those.  The stage turns at every upload that does not fit
 * (a batch's embeddings fill a half, its mask takes the other), so there
 * the turn came right after the next batch's launch: the second upload of
 * each batch waited for the batch in flight, and the next launch came only
 * after it (an 8B prompt on an H200: 63 staged uploads took 295 ms of a
 * 550 ms run, 4.7 ms each).  The mirror's turns are 16 uploads apart, so
 * it records at the turn and spares its small uploads an event each.
 */
static void marks_copied(struct apir_marks *mk, int h, ggml_backend_t be)
{
    ggml_backend_event_record(mk->done[h], be);
    mk->recorded[h] = true;
    mk->queued[h] = true;
}

/* Copies queued from either half, not known done. */
static bool marks_queued(const struct apir_marks *mk)
{
    return mk->queued[0] || mk->queued[1];
}

/* The stream is drained: nothing is queued from either half. */
static void marks_drained(struct apir_marks *mk)
{
    for (int h = 0; h < 2; h++)
        mk->queued[h] = mk->recorded[h] = false;
}

/*
 * The stage: larger uploads (a prompt batch's embeddings and mask, 6 MiB a
 * batch on a 1B model) that arrive while a graph runs.  Uploaded from
 * shared memory they would wait for that graph (the guest may write the
 * shared bytes again once answered), and the device would idle through
 * the copy, the next round trips and the next graph's import.  Copied here
 * they are queued on the graph's stream at once, from two halves (marks).
 */
struct apir_stage_half {
    uint8_t *mem;
    size_t cap, used;
    bool page_locked;
};

/*
 * A half's memory outgrown while a graph runs: freed at the next settle.
 * Giving page-locked memory back (cudaHostUnregister) waits for the whole
 * device: an 8B prompt batch's upload that outgrew its half waited 44 ms
 * for the graph in flight (an H100's guest timeline), and the device then
 * idled through the new half's page-locking, the copy and the next graph's
 * trip.  Copies from a half are known done before it is regrown (a half is
 * regrown empty: a fresh one, or one turned to), so only that return waits.
 */
#define APIR_STAGE_RETIRED 4

struct apir_stage {
    struct apir_stage_half half[2];
    uint32_t cur;                          /* the half that fills */
    /* The largest upload staged: each half is grown to it at its next use,
     * so that after a prompt's first batches neither grows again (a half
     * sized to a mask and then given a batch's embeddings grew then). */
    size_t max_need;
    struct apir_stage_half retired[APIR_STAGE_RETIRED];
    uint32_t n_retired;
    struct apir_marks marks;
};

struct apir_mirror {
    /* Two halves of APIR_MIRROR_ENTRIES / 2 entries (marks), taken in turn. */
    struct apir_mirror_entry entries[APIR_MIRROR_ENTRIES];
    uint32_t next;                         /* the entry the next upload takes */
    struct apir_marks marks;
    /* The stream every queued copy is on (the mirror's and the stage's):
     * one stream's are tracked at a time. */
    ggml_backend_t uploads_backend;
    uint32_t uploads_in_flight;            /* the mirror's queued since the last drain (its marks say which are not done) */
    struct apir_stage stage;
};

_Static_assert(APIR_MIRROR_ENTRIES % 2 == 0, "the mirror's entries are two halves");

/* Copies queued from the mirror or the stage, not known done: what the
 * marks say (the count above only grows between drains). */
static bool queued_anywhere(const struct apir_mirror *m)
{
    return marks_queued(&m->marks) || marks_queued(&m->stage.marks);
}

/* Copies queued on another stream than be's and not known done: an upload
 * for be is not queued beside them. */
static bool queued_elsewhere(const struct apir_mirror *m, ggml_backend_t be)
{
    return queued_anywhere(m) && m->uploads_backend != be;
}

static void stage_half_free(struct apir_stage_half *h)
{
    if (h->page_locked)
        apir_unpin(h->mem);
    free(h->mem);
    h->mem = NULL;
    h->cap = h->used = 0;
    h->page_locked = false;
}

/* A half's memory, outgrown while the device runs: kept until the next
 * settle (struct apir_stage's comment), or freed now when no room is left. */
static void stage_half_retire(struct apir_stage *st, struct apir_stage_half *h)
{
    if (!h->mem)
        return;
    if (st->n_retired == APIR_STAGE_RETIRED) {
        stage_half_free(h);
        return;
    }
    st->retired[st->n_retired++] = *h;
    *h = (struct apir_stage_half){ 0 };
}

static void stage_free_retired(struct apir_stage *st)
{
    for (uint32_t i = 0; i < st->n_retired; i++)
        stage_half_free(&st->retired[i]);
    st->n_retired = 0;
}

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
    marks_free(&m->marks);
    marks_free(&m->stage.marks);
    stage_half_free(&m->stage.half[0]);
    stage_half_free(&m->stage.half[1]);
    stage_free_retired(&m->stage);
    free(m);
}

uint32_t apir_mirror_uploads_in_flight(const struct apir_session *s)
{
    return s->mirror->uploads_in_flight + (marks_queued(&s->mirror->stage.marks) ? 1u : 0u);
}

uint32_t apir_mirror_stage_retired(const struct apir_session *s)
{
    return s->mirror->stage.n_retired;
}

void apir_mirror_wait_uploads(struct apir_session *s, ggml_backend_t synced)
{
    struct apir_mirror *m = s->mirror;
    /* The device is idle for this session here (the caller synchronized
     * the graph's stream, the uploads' below): returning memory costs no
     * wait for a graph now. */
    stage_free_retired(&m->stage);
    if (!queued_anywhere(m)) {
        m->uploads_in_flight = 0;
        return;
    }
    /* Those on the synchronized stream were queued before what it ran. */
    if (m->uploads_backend != synced)
        ggml_backend_synchronize(m->uploads_backend);
    m->uploads_in_flight = 0;
    marks_drained(&m->marks);
    marks_drained(&m->stage.marks);
    m->stage.half[0].used = m->stage.half[1].used = 0;
}

void apir_session_settle(struct apir_session *s)
{
    ggml_backend_t synced = s->graph_in_flight;
    if (synced) {
        uint64_t t0 = apir_now_ns();
        ggml_backend_synchronize(synced);
        s->graph_in_flight = NULL;
        s->settles++;
        s->device_idle_since_ns = apir_now_ns();
        s->stats.settle_wait_ns += s->device_idle_since_ns - t0;
        APIR_DEBUG("host", "%s: %s waited %.1f us for the device", s->name, apir_command_name(s->cmd),
                   (s->device_idle_since_ns - t0) / 1e3);
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

/* The half that takes `need` more bytes, or NULL (too big for a half, a
 * device without events).  May wait for the other half's copies. */
static struct apir_stage_half *stage_half_for(struct apir_session *s, ggml_backend_t be, size_t need)
{
    struct apir_stage *st = &s->mirror->stage;
    const size_t half_max = s->host->cfg.stage_bytes / 2;
    /* Without events a full half would wait for the graph in flight: the
     * plain upload does that already, without the copy. */
    if (need > half_max || !marks_ready(s, &st->marks, be))
        return NULL;
    struct apir_stage_half *h = &st->half[st->cur];
    if (h->used && h->used + need > h->cap) {
        marks_turn(s, &st->marks, (int)st->cur, be);
        st->cur ^= 1u;
        h = &st->half[st->cur];
        h->used = 0;
    }
    if (need > st->max_need)
        st->max_need = need;
    /*
     * An empty half is drained (fresh, turned to, or settled): grown there
     * to the largest upload staged so far, in 4 MiB steps, and only then;
     * its old memory is retired, not given back (struct apir_stage).  Growing
     * each half to a whole batch's uploads instead (a half entered again a
     * batch later; more regrowths, each a new page-locked allocation) made
     * 1B F16 pp2048 on an H200 0.933 and 0.939 of without the stage (two
     * calls), against 0.994-1.047 sized to the upload (four).
     */
    size_t want = (st->max_need + (4u << 20) - 1) & ~(size_t)((4u << 20) - 1);
    if (want > half_max)
        want = half_max;
    if (h->used == 0 && h->cap < want) {  /* want >= need: a half in use always has room (above) */
        stage_half_retire(st, h);
        void *p = NULL;
        if (posix_memalign(&p, 4096, want) != 0)
            return NULL;
        h->mem = p;
        h->cap = want;
        h->page_locked = s->host->pin_shared && apir_pin(p, want);
    }
    return h;
}

/* A larger upload while the device is busy: copied into the stage and
 * queued behind the graph in flight; false: the caller waits for it. */
static bool stage_upload(struct apir_session *s, struct ggml_tensor *t, const uint8_t *src, uint64_t offset,
                         uint64_t size)
{
    struct apir_mirror *m = s->mirror;
    ggml_backend_t be = s->backends[s->device];
    /* Only where it helps: a GPU busy with this session's graph, an
     * upload into the memory that graph's stream reaches. */
    if (!be || !s->host->device_memory || !s->backend_async[s->device] || s->graph_in_flight != be ||
        queued_elsewhere(m, be) || ggml_backend_buffer_get_type(t->buffer) != ggml_backend_get_default_buffer_type(be))
        return false;
    const size_t need = ((size_t)size + 255) & ~(size_t)255;
    struct apir_stage_half *h = stage_half_for(s, be, need);
    if (!h)
        return false;
    apir_mirror_forget_range(s, t->buffer, (uint8_t *)t->data + offset, (size_t)size);
    memcpy(h->mem + h->used, src, (size_t)size);
    ggml_backend_tensor_set_async(be, t, h->mem + h->used, (size_t)offset, (size_t)size);
    h->used += need;
    m->uploads_backend = be;
    marks_copied(&m->stage.marks, (int)m->stage.cur, be);
    return true;
}

bool apir_mirror_upload(struct apir_session *s, struct ggml_tensor *t, const uint8_t *src, uint64_t offset, uint64_t size)
{
    if (ggml_backend_buffer_is_host(t->buffer))
        return false;
    if (size > APIR_MIRROR_MAX_BYTES)
        return stage_upload(s, t, src, offset, size);
    struct apir_mirror *m = s->mirror;
    uint8_t *dst = (uint8_t *)t->data + offset;
    apir_mirror_forget_range(s, t->buffer, dst, (size_t)size);
    ggml_backend_t be = s->backends[s->device];
    const uint32_t half_len = APIR_MIRROR_ENTRIES / 2, i = m->next;
    /* Into the other half: its copies may still be queued (marks). */
    if (i % half_len == 0 && marks_queued(&m->marks))
        marks_turn(s, &m->marks, (int)(i / half_len) ^ 1, m->uploads_backend);
    struct apir_mirror_entry *e = &m->entries[i];
    m->next = (i + 1) % APIR_MIRROR_ENTRIES;
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
    if (be && s->backend_async[s->device] &&
        ggml_backend_buffer_get_type(t->buffer) == ggml_backend_get_default_buffer_type(be) &&
        !queued_elsewhere(m, be)) {
        /*
         * Queued on the stream the graphs run on, without waiting: a
         * token's inputs are half a dozen small uploads, each a stream
         * synchronization otherwise (~10 us on the H200).  The source is
         * our own copy (page-locked on a GPU host), untouched until the
         * copy is known done (its half's mark, or apir_session_settle);
         * anything else that may reach the memory settles first
         * (apir_session_forward), a graph on this stream is ordered after it.
         */
        ggml_backend_tensor_set_async(be, t, e->mem, (size_t)offset, (size_t)size);
        m->uploads_backend = be;
        m->uploads_in_flight++;
        m->marks.queued[i / half_len] = true;
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
