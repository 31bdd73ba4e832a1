/*
 * The ggml device of one remote device.
 */
#include "frontend.h"
#include "calls.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml-impl.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct apir_device *dev_ctx(ggml_backend_dev_t dev) { return dev->context; }

static const char *dev_get_name(ggml_backend_dev_t dev) { return dev_ctx(dev)->name; }
static const char *dev_get_description(ggml_backend_dev_t dev) { return dev_ctx(dev)->description; }

static void dev_get_memory(ggml_backend_dev_t dev, size_t *free_mem, size_t *total)
{
    uint64_t f = 0, t = 0;
    apir_call_DEVICE_GET_MEMORY(&dev_ctx(dev)->remote, &f, &t);
    *free_mem = (size_t)f;
    *total = (size_t)t;
}

static enum ggml_backend_dev_type dev_get_type(ggml_backend_dev_t dev) { return dev_ctx(dev)->type; }

static void dev_get_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props)
{
    props->name = dev_get_name(dev);
    props->description = dev_get_description(dev);
    props->type = dev_get_type(dev);
    props->device_id = NULL;
    dev_get_memory(dev, &props->memory_free, &props->memory_total);
    /* Graph compute is asynchronous (a keyed graph is answered before the
     * host computes it) and events are kept in the guest (below): with
     * both, llama.cpp pipelines a prompt's batches across several devices. */
    props->caps.async = dev_ctx(dev)->events;
    props->caps.host_buffer = dev_ctx(dev)->has_host_buft;
    /* Zero copy only: the host then computes in host memory anyway (a CPU,
     * an integrated GPU), so weights in the program's own file mapping are
     * where they should be (apir_buffer_from_host_ptr). */
    props->caps.buffer_from_host_ptr = dev_ctx(dev)->zero_copy;
    props->caps.events = dev_ctx(dev)->events;
    /* llama.cpp reads the model file instead of mapping it for a device
     * without this: a copy more per weight (a 2 GB model loaded in 2.5 s
     * against 0.27 s natively on the H200).  Our set_tensor copies from any
     * guest memory, a file mapping included. */
#if APIR_GGML_HAS_CAPS_MMAP
    props->caps.mmap_support = true;
#endif
}

static ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char *params)
{
    (void)params;
    return apir_backend_new(dev_ctx(dev));
}

static ggml_backend_buffer_type_t dev_get_buffer_type(ggml_backend_dev_t dev) { return &dev_ctx(dev)->buft; }

static ggml_backend_buffer_type_t dev_get_host_buffer_type(ggml_backend_dev_t dev)
{
    return dev_ctx(dev)->has_host_buft ? &dev_ctx(dev)->host_buft : NULL;
}

/*
 * Two 64-bit hashes of n words, different functions of them (a false cache
 * hit would need both to collide), each over two lanes, even and odd words, so that the
 * multiplications of neighbouring words overlap instead of waiting on each
 * other; the lanes and the count are mixed at the end.
 */
static void hash_words(const uint64_t *w, size_t n, uint64_t seed, uint64_t *h1, uint64_t *h2)
{
    uint64_t a0 = 0xcbf29ce484222325ull ^ seed, a1 = 0x9e3779b97f4a7c15ull;
    uint64_t c0 = 0x84222325cbf29ce4ull + seed, c1 = 0xc2b2ae3d27d4eb4full;
#define MIX(a, c, x)                               \
    do {                                           \
        a = (a ^ (x)) * 0x100000001b3ull;          \
        a ^= a >> 29;                              \
        c = (c + (x)) * 0xff51afd7ed558ccdull;     \
        c ^= c >> 32;                              \
    } while (0)
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        MIX(a0, c0, w[i]);
        MIX(a1, c1, w[i + 1]);
    }
    if (i < n)
        MIX(a0, c0, w[i]);
    MIX(a0, c0, (uint64_t)n);
    MIX(a0, c0, a1);
    MIX(a0, c0, c1);
#undef MIX
    *h1 = a0;
    *h2 = c0 | 1;  /* never 0: (0,0) marks an empty entry */
}

static bool cache_lookup(struct apir_device *d, uint64_t h1, uint64_t h2, uint64_t *value)
{
    struct apir_op_cache_entry *set = d->cache[h1 % APIR_OP_CACHE_SETS];
    bool hit = false;
    pthread_mutex_lock(&d->cache_lock);
    for (int w = 0; w < APIR_OP_CACHE_WAYS; w++) {
        if (set[w].h1 == h1 && set[w].h2 == h2) {
            set[w].last_use = ++d->cache_clock;
            *value = set[w].value;
            hit = true;
            break;
        }
    }
    pthread_mutex_unlock(&d->cache_lock);
    return hit;
}

static void cache_store(struct apir_device *d, uint64_t h1, uint64_t h2, uint64_t value)
{
    struct apir_op_cache_entry *set = d->cache[h1 % APIR_OP_CACHE_SETS];
    pthread_mutex_lock(&d->cache_lock);
    int victim = 0;
    for (int w = 1; w < APIR_OP_CACHE_WAYS; w++)
        if (set[w].last_use < set[victim].last_use)
            victim = w;
    set[victim] = (struct apir_op_cache_entry){ .h1 = h1, .h2 = h2, .value = value, .last_use = ++d->cache_clock };
    pthread_mutex_unlock(&d->cache_lock);
}

/*
 * The key of a question: its kind and the words of its records that one
 * question's may differ from another's.  apir_op_records and
 * apir_alloc_size_record leave the rest zero in every record (placement,
 * view and name; a source's op, parameters and sources), so the key skips
 * them: 7 words of a source's 38, 25 of the op's own.  Hashing them all was
 * most of what the guest spent on a graph's plan where ggml's scheduler asks
 * a question per node and pass (a whisper.cpp decode step: docs/MEASUREMENTS.md).
 * test_op_cache asks questions that differ in each word kept.
 */
#define REC_AT(field) offsetof(struct apir_tensor_rec, field)
_Static_assert(REC_AT(buffer) % 8 == 0 && REC_AT(ne) % 8 == 0 && REC_AT(op) % 8 == 0 && REC_AT(view_src) % 8 == 0,
               "question_key takes whole words");
#define KEY_OP_WORDS ((REC_AT(buffer) - REC_AT(id) + REC_AT(view_src) - REC_AT(ne)) / 8)
#define KEY_SRC_WORDS ((REC_AT(buffer) - REC_AT(id) + REC_AT(op) - REC_AT(ne)) / 8 + 1)

/* Appends the words [from, to) of rec to w. */
static size_t take_words(uint64_t *w, size_t n, const struct apir_tensor_rec *rec, size_t from, size_t to)
{
    memcpy(w + n, (const uint8_t *)rec + from, to - from);
    return n + (to - from) / 8;
}

static void question_key(const struct apir_tensor_rec *recs, uint32_t n, enum apir_op_query kind, uint64_t *h1,
                         uint64_t *h2)
{
    uint64_t w[KEY_OP_WORDS + GGML_MAX_SRC * KEY_SRC_WORDS];
    size_t k = 0;
    for (uint32_t i = 0; i < n && i <= GGML_MAX_SRC; i++) {
        k = take_words(w, k, &recs[i], REC_AT(id), REC_AT(buffer));  /* id (a source's slot), type */
        if (i == 0) {
            /* shape, strides, op, parameters, flags, sources */
            k = take_words(w, k, &recs[i], REC_AT(ne), REC_AT(view_src));
        } else {
            k = take_words(w, k, &recs[i], REC_AT(ne), REC_AT(op));  /* shape, strides */
            const size_t flags_word = REC_AT(flags) & ~(size_t)7;
            k = take_words(w, k, &recs[i], flags_word, flags_word + 8);  /* flags */
        }
    }
    hash_words(w, k, (uint64_t)kind, h1, h2);
}

/* The family of a question: its key without the shapes and strides. */
static void family_key(const struct apir_tensor_rec *recs, uint32_t n, enum apir_op_query kind, uint64_t *h1,
                       uint64_t *h2)
{
    struct apir_tensor_rec f[1 + GGML_MAX_SRC];
    memcpy(f, recs, n * sizeof(recs[0]));
    for (uint32_t i = 0; i < n; i++) {
        memset(f[i].ne, 0, sizeof(f[i].ne));
        memset(f[i].nb, 0, sizeof(f[i].nb));
    }
    question_key(f, n, kind, h1, h2);
}

/*
 * How many questions of the series to ask with recs (1: none follows), from
 * the family's last question and step (struct apir_op_series); step: the
 * difference of every shape and stride from the last question.  *last:
 * where the last question asked goes (series_asked).  Lock held.
 */
static uint32_t series_next(struct apir_device *d, const struct apir_tensor_rec *recs, uint32_t n,
                            enum apir_op_query kind, int64_t step[][2][GGML_MAX_DIMS], struct apir_op_series **last)
{
    uint64_t f1, f2;
    family_key(recs, n, kind, &f1, &f2);
    pthread_mutex_lock(&d->cache_lock);
    struct apir_op_series *e = NULL, *victim = &d->series[0];
    for (int i = 0; i < APIR_OP_SERIES && !e; i++) {
        if (d->series[i].h1 == f1 && d->series[i].h2 == f2)
            e = &d->series[i];
        else if (d->series[i].last_use < victim->last_use)
            victim = &d->series[i];
    }
    bool moves = false, again = false;
    if (e && e->n == n) {
        again = e->has_step;
        for (uint32_t i = 0; i < n; i++)
            for (int k = 0; k < GGML_MAX_DIMS; k++) {
                step[i][0][k] = (int64_t)recs[i].ne[k] - (int64_t)e->recs[i].ne[k];
                step[i][1][k] = (int64_t)recs[i].nb[k] - (int64_t)e->recs[i].nb[k];
                moves = moves || step[i][0][k] || step[i][1][k];
                again = again && step[i][0][k] == e->step[i][0][k] && step[i][1][k] == e->step[i][1][k];
            }
    }
    if (!e) {
        e = victim;
        memset(e, 0, sizeof(*e));
        e->h1 = f1;
        e->h2 = f2;
    }
    e->n = n;
    memcpy(e->recs, recs, n * sizeof(recs[0]));
    e->has_step = moves;
    if (moves)
        memcpy(e->step, step, n * sizeof(e->step[0]));
    e->last_use = ++d->cache_clock;
    pthread_mutex_unlock(&d->cache_lock);
    *last = e;
    if (moves && again)
        return APIR_ASK_SERIES;
    memset(step, 0, n * sizeof(step[0]));  /* one question: itself */
    return 1;
}

/* The family's last question is the last one of the series asked: a step
 * past it continues the series (entries change only under the remote's
 * lock, which the caller held throughout). */
static void series_asked(struct apir_device *d, struct apir_op_series *e, const struct apir_tensor_rec *recs, uint32_t n)
{
    pthread_mutex_lock(&d->cache_lock);
    memcpy(e->recs, recs, n * sizeof(recs[0]));
    pthread_mutex_unlock(&d->cache_lock);
}

/* Question j of a series: recs moved j steps; false past what a record holds. */
static bool series_member(const struct apir_tensor_rec *recs, uint32_t n, int64_t step[][2][GGML_MAX_DIMS], uint32_t j,
                          struct apir_tensor_rec *out)
{
    memcpy(out, recs, n * sizeof(recs[0]));
    for (uint32_t i = 0; i < n; i++)
        for (int k = 0; k < GGML_MAX_DIMS; k++) {
            const int64_t ne = (int64_t)recs[i].ne[k] + (int64_t)j * step[i][0][k];
            const int64_t nb = (int64_t)recs[i].nb[k] + (int64_t)j * step[i][1][k];
            if (ne < 0 || ne > UINT32_MAX || nb < 0 || nb > UINT32_MAX)  /* empty tensors (ne 0) are questions too */
                return false;
            out[i].ne[k] = (uint32_t)ne;
            out[i].nb[k] = (uint32_t)nb;
        }
    return true;
}

/*
 * Asks the question recs (n records) together with the ones its series
 * would ask next (DEVICE_ASK_OPS, apir 0.8), caching every answer under its
 * own key; *value: recs' answer.  Lock held; an apir_handler_result.
 */
static int ask_series_locked(struct apir_device *d, enum apir_op_query kind, struct apir_tensor_rec *recs, uint32_t n,
                             uint64_t *value)
{
    struct apir_remote *r = &d->remote;
    int64_t step[1 + GGML_MAX_SRC][2][GGML_MAX_DIMS] = { { { 0 } } };
    struct apir_op_series *family = NULL;
    const uint32_t want = d->series_off ? 1 : series_next(d, recs, n, kind, step, &family);
    const size_t per = (size_t)n * APIR_TENSOR_REC_SIZE;
    if (!apir_remote_data_reserve(r, 8 + want * per))
        return -1;
    struct apir_encoder enc;
    apir_encoder_init(&enc, r->data, r->data_size);
    apir_encode_u32(&enc, 0);  /* the count, once known */
    apir_encode_u32(&enc, n);
    uint32_t asked = 0;
    while (asked < want) {
        struct apir_tensor_rec *q = apir_encode_reserve(&enc, per);
        if (!q || !series_member(recs, n, step, asked, q))
            break;
        asked++;
    }
    if (!asked || enc.fatal)  /* asked 0: the question itself is always a member (j = 0) */
        return -1;
    memcpy(r->data, &asked, sizeof(asked));
    const size_t size = 8 + asked * per;
    uint64_t answers[APIR_ASK_SERIES];
    uint32_t answered = 0;
    if (!apir_remote_put_data_locked(r, 0, r->data, size))
        return -1;
    const struct apir_call_opts get_answers = { .get_dst = answers, .get_size = asked * sizeof(answers[0]) };
    int rc = apir_call_DEVICE_ASK_OPS_opts_locked(r, &get_answers, (uint32_t)kind, d->buft_ctx.handle, r->data_res_id,
                                                  size, &answered);
    if (rc != APIR_HANDLER_OK)
        return rc;
    if (answered != asked)
        return APIR_HANDLER_BAD_REQUEST;
    struct apir_tensor_rec member[1 + GGML_MAX_SRC];
    for (uint32_t j = 0; j < asked; j++) {
        series_member(recs, n, step, j, member);
        /* A refused alloc-size question (0) is not an answer: asked again. */
        if (kind == APIR_Q_ALLOC_SIZE && answers[j] == 0)
            continue;
        uint64_t h1, h2;
        question_key(member, n, kind, &h1, &h2);
        cache_store(d, h1, h2, answers[j]);
    }
    if (family)
        series_asked(d, family, member, n);
    *value = answers[0];
    return kind == APIR_Q_ALLOC_SIZE && answers[0] == 0 ? APIR_HANDLER_FAILED : APIR_HANDLER_OK;
}

/* What a device whose host is gone answers: it keeps running what it ran
 * (a tensor already in its buffers must still have a backend that takes
 * it, or ggml's scheduler aborts), and the compute then fails with an
 * error.  Never cached: a host reached again answers for itself. */
static bool answer_without_host(enum apir_op_query kind, uint64_t *value)
{
    switch (kind) {
    case APIR_Q_SUPPORTS:
        *value = 1;
        return true;
    case APIR_Q_OFFLOAD:
        *value = 0;
        return true;
    default:
        return false;  /* alloc size: the caller's ggml_nbytes */
    }
}

bool apir_op_query(struct apir_device *d, enum apir_op_query kind, const struct ggml_tensor *op, uint64_t *value)
{
    struct apir_tensor_rec recs[1 + GGML_MAX_SRC];
    uint32_t n = kind == APIR_Q_ALLOC_SIZE ? apir_alloc_size_record(op, recs) : apir_op_records(op, recs);
    if (!n)
        return false;
    uint64_t h1, h2;
    /* The question is part of the key. */
    question_key(recs, n, kind, &h1, &h2);
    if (cache_lookup(d, h1, h2, value))
        return true;
    APIR_DEBUG("guest", "%s: asking the host (question %d): %s '%s' %dx%dx%dx%d", d->name, (int)kind, ggml_op_desc(op),
               op->name, (int)op->ne[0], (int)op->ne[1], (int)op->ne[2], (int)op->ne[3]);

    int rc;
    bool b = false;
    uint64_t v = 0;
    struct apir_remote *r = &d->remote;
    if (!apir_minor_speaks(r->minor, APIR_CMD_DEVICE_SUPPORTS_OP_L))
        return false;  /* 0.1 has only the raw inline format: we do not send our memory */
    pthread_mutex_lock(&r->lock);
    if (apir_remote_gone_locked(r)) {
        pthread_mutex_unlock(&r->lock);
        return answer_without_host(kind, value);
    }
    if (apir_minor_speaks(r->minor, APIR_CMD_DEVICE_ASK_OPS)) {
        rc = ask_series_locked(d, kind, recs, n, value);
        const bool gone = rc != APIR_HANDLER_OK && apir_remote_gone_locked(r);
        pthread_mutex_unlock(&r->lock);
        if (gone)
            return answer_without_host(kind, value);
        return rc == APIR_HANDLER_OK;
    }
    const struct apir_tensor_span span = { n, recs };
    switch (kind) {
    case APIR_Q_SUPPORTS:
        rc = apir_call_DEVICE_SUPPORTS_OP_L_locked(r, span, &b);
        v = b;
        break;
    case APIR_Q_OFFLOAD:
        rc = apir_call_DEVICE_OFFLOAD_OP_L_locked(r, span, &b);
        v = b;
        break;
    case APIR_Q_ALLOC_SIZE:
        rc = apir_call_BUFFER_TYPE_GET_ALLOC_SIZE_L_locked(r, d->buft_ctx.handle, span, &v);
        break;
    default:
        rc = -1;
        break;
    }
    const bool gone = rc != APIR_HANDLER_OK && apir_remote_gone_locked(r);
    pthread_mutex_unlock(&r->lock);
    if (gone)
        return answer_without_host(kind, value);
    if (rc != APIR_HANDLER_OK)
        return false;
    cache_store(d, h1, h2, v);
    *value = v;
    return true;
}

/* A new connection is a new host session: the buffer type's handle is asked
 * again, and the answers of the old host are forgotten. */
static void device_reconnected_locked(struct apir_device *d)
{
    struct apir_remote *r = &d->remote;
    uint64_t handle = 0;
    struct apir_string remote_name;
    if (apir_call_DEVICE_GET_BUFFER_TYPE_locked(r, &handle) == APIR_HANDLER_OK)
        d->buft_ctx.handle = handle;
    if (apir_call_BUFFER_TYPE_GET_NAME_locked(r, d->buft_ctx.handle, &remote_name) == APIR_HANDLER_OK)
        d->buft_ctx.alloc_rule = apir_buft_alloc_rule(remote_name.s);
    /* The new host's rules for new buffers (what ggml-alloc asks each time);
     * the device's type and zero copy stay what the program was told. */
    uint64_t alignment = 0, max_size = 0;
    if (apir_call_BUFFER_TYPE_GET_ALIGNMENT_locked(r, d->buft_ctx.handle, &alignment) == APIR_HANDLER_OK && alignment)
        d->buft_ctx.alignment = (size_t)alignment;
    if (apir_call_BUFFER_TYPE_GET_MAX_SIZE_locked(r, d->buft_ctx.handle, &max_size) == APIR_HANDLER_OK && max_size)
        d->buft_ctx.max_size = (size_t)max_size;
    pthread_mutex_lock(&d->cache_lock);
    memset(d->cache, 0, sizeof(d->cache));
    memset(d->series, 0, sizeof(d->series));
    pthread_mutex_unlock(&d->cache_lock);
    memset(d->kept_uids, 0, sizeof(d->kept_uids));
    /* Uploads into the old host's buffers: their memory is gone with it. */
    d->inputs.count = 0;
    d->inputs.used = 0;
    r->inputs_waiting = 0;
    d->generation = r->conn->generation;
}

bool apir_device_ready_locked(struct apir_device *d, const char *what)
{
    struct apir_remote *r = &d->remote;
    if (!apir_remote_reconnect_locked(r)) {
        APIR_ERROR("guest", "%s: %s failed: the host at %s is unreachable", d->name, what, r->endpoint);
        return false;
    }
    if (d->generation != r->conn->generation) {
        /* A restarted host may be another build: its ggml is asked again. */
        char why[768];
        if (!apir_ggml_host_agrees_locked(r, why, sizeof(why))) {
            if (d->ggml_refused_generation != r->conn->generation)
                APIR_ERROR("guest", "%s: %s failed: %s", d->name, what, why);
            d->ggml_refused_generation = r->conn->generation;
            return false;
        }
        device_reconnected_locked(d);
    }
    return true;
}

static bool dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op)
{
    /* Views, reshapes, permutes and op-less tensors compute nothing: every
     * ggml backend takes them (ggml's scheduler skips them when splitting).
     * A view that moves each step (a growing cache's) is not asked about. */
    if (ggml_op_is_empty(op->op))
        return true;
    uint64_t v = 0;
    return apir_op_query(dev_ctx(dev), APIR_Q_SUPPORTS, op, &v) && v;
}

static bool dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft)
{
    return buft == &dev_ctx(dev)->buft;
}

/*
 * ggml's scheduler asks this for ops whose weights live in the guest's own
 * memory (the token embeddings, typically): offloading them ships those
 * weights over the connection on every batch, which a local GPU does at
 * PCIe speed and we at shared-memory copy speed (measured on the H200: pp2048
 * of a 1B model at 0.50 of native with offload, because 131 MB of embeddings
 * cross per ubatch).  So by default we decline and ggml keeps such ops on the
 * guest's CPU, shipping only their (small) results.  APIR_OFFLOAD_OP=1 asks
 * the host instead.
 */
static bool dev_offload_op(ggml_backend_dev_t dev, const struct ggml_tensor *op)
{
    const char *e = getenv("APIR_OFFLOAD_OP");
    if (!e || strcmp(e, "1") != 0)
        return false;
    uint64_t v = 0;
    return apir_op_query(dev_ctx(dev), APIR_Q_OFFLOAD, op, &v) && v;
}

/*
 * Events, kept in the guest.  A device's commands run on its host strictly
 * in order, each device on a connection (a host session) of its own, so an
 * event is a point in that order: the number of graphs launched on its
 * device when it was recorded (apir_remote_graphs_launched).  It is done
 * when the host has finished those graphs; waiting for it costs a round
 * trip only while one of them may still run.  No host state, no protocol
 * command: nothing for a guest to leak or forge on the host.
 */
struct apir_event {
    struct apir_device *device;  /* where it was recorded; NULL: never (done) */
    uint64_t launched;
};

static ggml_backend_event_t dev_event_new(ggml_backend_dev_t dev)
{
    ggml_backend_event_t event = calloc(1, sizeof(*event));
    struct apir_event *e = calloc(1, sizeof(*e));
    if (!event || !e) {
        APIR_ERROR("guest", "%s: no memory for an event", dev_ctx(dev)->name);
        free(event);
        free(e);
        return NULL;
    }
    event->device = dev;
    event->context = e;
    return event;
}

static void dev_event_free(ggml_backend_dev_t dev, ggml_backend_event_t event)
{
    (void)dev;
    if (!event)
        return;
    free(event->context);
    free(event);
}

void apir_event_record(ggml_backend_event_t event, struct apir_device *d)
{
    struct apir_event *e = event->context;
    e->device = d;
    e->launched = apir_remote_graphs_launched(&d->remote);
}

void apir_event_synchronize(ggml_backend_event_t event)
{
    struct apir_event *e = event->context;
    if (e->device)
        apir_remote_wait_graphs(&e->device->remote, e->launched);
}

struct apir_device *apir_event_device(ggml_backend_event_t event)
{
    return ((struct apir_event *)event->context)->device;
}

static void dev_event_synchronize(ggml_backend_dev_t dev, ggml_backend_event_t event)
{
    (void)dev;
    apir_event_synchronize(event);
}

static const struct ggml_backend_device_i apir_device_iface = {
    .get_name = dev_get_name,
    .get_description = dev_get_description,
    .get_memory = dev_get_memory,
    .get_type = dev_get_type,
    .get_props = dev_get_props,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_get_buffer_type,
    .get_host_buffer_type = dev_get_host_buffer_type,
    .buffer_from_host_ptr = apir_buffer_from_host_ptr,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .offload_op = dev_offload_op,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_synchronize = dev_event_synchronize,
};

void apir_device_setup(struct apir_device *d, ggml_backend_reg_t reg)
{
    struct apir_string remote_desc = { "?" };
    uint32_t type = GGML_BACKEND_DEVICE_TYPE_GPU;
    snprintf(d->name, sizeof(d->name), "APIR%u", d->global_index);
    apir_call_DEVICE_GET_DESCRIPTION(&d->remote, &remote_desc);
    apir_call_DEVICE_GET_TYPE(&d->remote, &type);
    /* A remote CPU is still offered as an accelerator: the point is to run
     * there, not on the guest's CPU backend. */
    d->type = type == GGML_BACKEND_DEVICE_TYPE_CPU ? GGML_BACKEND_DEVICE_TYPE_GPU : (enum ggml_backend_dev_type)type;
    /* The host's number, in the host's ggml: one past the program's last
     * type (META came later than ACCEL) would mean nothing here. */
#if APIR_GGML_HAS_DEVICE_TYPE_META
    if (type > GGML_BACKEND_DEVICE_TYPE_META)
#else
    if (type > GGML_BACKEND_DEVICE_TYPE_ACCEL)
#endif
        d->type = GGML_BACKEND_DEVICE_TYPE_GPU;
    /* Which host, and which of its devices when the name does not say it
     * (a second host's first device is APIR<n> here but device 0 there). */
    int len = snprintf(d->description, sizeof(d->description), "%.100s via %.127s", remote_desc.s, d->remote.t->endpoint);
    if (d->remote.device != d->global_index && len > 0 && (size_t)len < sizeof(d->description))
        snprintf(d->description + len, sizeof(d->description) - (size_t)len, " (host device %u)", d->remote.device);
    /* Zero copy when the host can wrap our shared memory as a buffer and its
     * device computes in host memory anyway (a CPU, an integrated GPU), and
     * the transport's blobs are shared memory: tensor data then never
     * crosses the connection.  A discrete GPU wrapping host memory would
     * compute over PCIe, so it keeps its own memory.  APIR_ZERO_COPY=0 turns
     * it off. */
    bool async = false, host_buf = false, from_ptr = false, events = false, mmap_ok = false;
    const char *zc = getenv("APIR_ZERO_COPY");
    if (d->remote.t->blobs_shared && apir_minor_has(d->remote.minor, APIR_FEATURE_ZERO_COPY) && !(zc && !strcmp(zc, "0")) &&
        apir_call_DEVICE_GET_PROPS(&d->remote, &async, &host_buf, &from_ptr, &events, &mmap_ok) == APIR_HANDLER_OK)
        d->zero_copy = from_ptr && (type == GGML_BACKEND_DEVICE_TYPE_CPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU);
    /* A CPU host on this machine computes on the cores the guest would spin
     * on: spinning through its graphs (APIR_SPIN_GRAPH_US) takes time from
     * its compute threads (tg 0.83 of native against 0.97-1.0 without, 1B
     * Q4_0 on 2 cores; over loopback TCP 0.94 against 0.99).  Waits after a
     * graph then spin as briefly as any other, on every transport.  Where
     * blobs are shared the host computes such a graph before it answers
     * (host/core/session.h, defer_sync_graphs): the graph's own wait is the
     * whole compute, and even a brief spin keeps a core looking busy while
     * the host's compute threads want both (whisper.cpp's decode step on 2
     * vCPUs: 0.870 of its time when it sleeps at once, 24 interleaved
     * rounds; docs/MEASUREMENTS.md). */
    if (type == GGML_BACKEND_DEVICE_TYPE_CPU && !getenv("APIR_SPIN_GRAPH_US")) {
        d->remote.graph_spin_ns = 0;
        d->remote.graph_sleeps = d->remote.t->blobs_shared;
    }
    /* And such a graph is done when its reply comes (a host of 0.9 computes
     * a CPU device's keyed graph before its reply where blobs are shared,
     * host/dispatch/graph_exec.c defers_graph): no wait for the device
     * after it - the SYNCHRONIZE that a read of a shared buffer sent after
     * each graph was a second round trip a decode step.  Over a stream the
     * host still computes after its reply.  APIR_GRAPH_DONE_AT_REPLY=0
     * waits all the same. */
    const char *dr = getenv("APIR_GRAPH_DONE_AT_REPLY");
    d->remote.graph_done_at_reply = type == GGML_BACKEND_DEVICE_TYPE_CPU && d->remote.t->blobs_shared &&
                                    apir_minor_has(d->remote.minor, APIR_FEATURE_SYNC_GRAPHS_DONE) &&
                                    !(dr && !strcmp(dr, "0"));
    /* Async compute and events (dev_event_new): a host of 0.2 or later
     * answers a keyed graph before computing it.  APIR_EVENTS=0 leaves them
     * out, and with them llama.cpp's pipeline over several devices. */
    const char *ev = getenv("APIR_EVENTS");
    d->events = apir_minor_has(d->remote.minor, APIR_FEATURE_EVENTS) && !(ev && !strcmp(ev, "0"));
    /* A decode step in two round trips (apir 0.8): its small uploads go
     * with its graph, and questions that come in series are asked ahead.
     * Each can be turned off, to measure what it brings. */
    const char *gi = getenv("APIR_GRAPH_INPUTS"), *as = getenv("APIR_ASK_SERIES");
    d->inputs_off = gi && !strcmp(gi, "0");
    d->series_off = as && !strcmp(as, "0");
    /* A graph sent as its changes (apir 0.9, graph_delta.c); off: whole. */
    const char *gd = getenv("APIR_GRAPH_DELTA");
    d->delta.off = gd && !strcmp(gd, "0");
    pthread_mutex_init(&d->cache_lock, NULL);
    d->generation = d->remote.conn->generation;
    d->dev.iface = apir_device_iface;
    d->dev.reg = reg;
    d->dev.context = d;
    apir_buft_setup(d);
    apir_host_buft_setup(d);
}
