/*
 * The upload mirror (host/data/upload_mirror.c) with a fake device buffer whose
 * memory the host "cannot read" (is_host false): uploads are kept, found,
 * and forgotten whenever something else may write their range.
 */
#include "ggml-backend-impl.h"
#include "ggml.h"
#include "host.h"
#include "dispatcher.h"
#include "test_util.h"
#include "upload_mirror.h"

#include <stdlib.h>
#include <string.h>

static uint8_t device_mem[1 << 16];
static int uploads;

static void *fake_get_base(ggml_backend_buffer_t b) { (void)b; return device_mem; }
static void fake_set(ggml_backend_buffer_t b, struct ggml_tensor *t, const void *data, size_t off, size_t size)
{
    (void)b;
    memcpy((uint8_t *)t->data + off, data, size);
    uploads++;
}
static const char *fake_name(ggml_backend_buffer_type_t bt) { (void)bt; return "FAKE_DEVICE"; }
static bool fake_is_host(ggml_backend_buffer_type_t bt) { (void)bt; return false; }

static struct ggml_backend_buffer_type fake_buft = {
    .iface = { .get_name = fake_name, .is_host = fake_is_host },
};

static void test_mirror(void)
{
    struct apir_host host;
    memset(&host, 0, sizeof(host));
    apir_host_config_default(&host.cfg);
    struct apir_session *s = apir_session_new(&host, "mirror");
    struct ggml_backend_buffer_i iface = { .get_base = fake_get_base, .set_tensor = fake_set };
    ggml_backend_buffer_t buf = ggml_backend_buffer_init(&fake_buft, iface, NULL, sizeof(device_mem));
    CHECK(!ggml_backend_buffer_is_host(buf));

    struct ggml_init_params p = { .mem_size = 8 * ggml_tensor_overhead() + ggml_graph_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8);
    idx->buffer = buf;
    idx->data = device_mem + 1024;
    int32_t vals[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    CHECK(uploads == 1 && memcmp(device_mem + 1024, vals, sizeof(vals)) == 0);
    const uint8_t *kept = apir_mirror_find(s, buf, idx->data, sizeof(vals));
    CHECK(kept && memcmp(kept, vals, sizeof(vals)) == 0);
    /* the kept copy is private: changing the source afterwards changes nothing */
    vals[0] = 999;
    CHECK(kept && ((const int32_t *)kept)[0] == 1);
    /* a sub-range is found, a range beyond it is not */
    CHECK(apir_mirror_find(s, buf, device_mem + 1028, 8) != NULL);
    CHECK(apir_mirror_find(s, buf, device_mem + 1020, 8) == NULL);
    CHECK(apir_mirror_find(s, buf, device_mem + 1024, 64) == NULL);

    /* another write into the range forgets it */
    apir_mirror_forget_range(s, buf, device_mem + 1030, 1);
    CHECK(apir_mirror_find(s, buf, idx->data, 4) == NULL);

    /* a graph writing into the buffer forgets its copies */
    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    struct ggml_tensor *out = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    out->buffer = buf;
    out->data = device_mem + 4096;
    out->op = GGML_OP_ADD;
    struct ggml_cgraph *g = ggml_new_graph(ctx);
    ggml_graph_add_node(g, out);
    apir_mirror_forget_written(s, g);
    CHECK(apir_mirror_find(s, buf, idx->data, 4) == NULL);

    /* freeing the buffer forgets them too; big uploads are not kept */
    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    apir_mirror_forget_buffer(s, buf);
    CHECK(apir_mirror_find(s, buf, idx->data, 4) == NULL);
    static uint8_t big[APIR_MIRROR_MAX_BYTES + 4];
    struct ggml_tensor *large = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, sizeof(big));
    large->buffer = buf;
    large->data = device_mem;
    CHECK(!apir_mirror_upload(s, large, big, 0, sizeof(big)));

    /* entries are bounded: many uploads keep at most APIR_MIRROR_ENTRIES */
    for (int i = 0; i < 100; i++) {
        idx->data = device_mem + 8192 + 64 * i;
        apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals));
    }
    int found = 0;
    for (int i = 0; i < 100; i++)
        found += apir_mirror_find(s, buf, device_mem + 8192 + 64 * i, 4) != NULL;
    CHECK(found == APIR_MIRROR_ENTRIES);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    apir_session_free(s);
}

/* A device whose backend copies asynchronously (as CUDA): small uploads are
 * queued on its stream and waited for only before an entry is reused or
 * when the session settles. */
static int async_sets, syncs;
static void fake_set_async(ggml_backend_t be, struct ggml_tensor *t, const void *data, size_t off, size_t size)
{
    (void)be;
    memcpy((uint8_t *)t->data + off, data, size);
    async_sets++;
}
static void fake_synchronize(ggml_backend_t be) { (void)be; syncs++; }
static void fake_backend_free(ggml_backend_t be) { (void)be; }
static ggml_backend_buffer_type_t fake_dev_buft(ggml_backend_dev_t dev) { (void)dev; return &fake_buft; }

static void test_async_uploads(void)
{
    struct apir_host host;
    memset(&host, 0, sizeof(host));
    apir_host_config_default(&host.cfg);
    struct apir_session *s = apir_session_new(&host, "async");
    struct ggml_backend_device dev = { .iface = { .get_buffer_type = fake_dev_buft } };
    struct ggml_backend backend = {
        .iface = { .free = fake_backend_free, .set_tensor_async = fake_set_async, .synchronize = fake_synchronize },
        .device = &dev,
    };
    s->backends[0] = &backend;
    s->backend_async[0] = true;
    s->device = 0;
    struct ggml_backend_buffer_i iface = { .get_base = fake_get_base, .set_tensor = fake_set };
    ggml_backend_buffer_t buf = ggml_backend_buffer_init(&fake_buft, iface, NULL, sizeof(device_mem));
    struct ggml_init_params p = { .mem_size = 4 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8);
    idx->buffer = buf;
    int32_t vals[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    uploads = async_sets = syncs = 0;
    for (int i = 0; i < APIR_MIRROR_ENTRIES; i++) {
        idx->data = device_mem + 64 * i;
        vals[0] = i;
        CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    }
    CHECK(async_sets == APIR_MIRROR_ENTRIES && uploads == 0 && syncs == 0);
    CHECK(apir_mirror_uploads_in_flight(s) == APIR_MIRROR_ENTRIES);
    CHECK(((int32_t *)device_mem)[0] == 0 && ((int32_t *)(device_mem + 64 * 5))[0] == 5);
    /* one more would reuse an entry still in flight: wait first */
    idx->data = device_mem + 4096;
    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    CHECK(syncs == 1 && apir_mirror_uploads_in_flight(s) == 1);
    apir_session_settle(s);
    CHECK(syncs == 2 && apir_mirror_uploads_in_flight(s) == 0);
    apir_session_settle(s);  /* nothing in flight: no wait */
    CHECK(syncs == 2);
    /* a buffer of another type than the stream's: a plain, settled upload */
    static struct ggml_backend_buffer_type other_buft = { .iface = { .get_name = fake_name, .is_host = fake_is_host } };
    ggml_backend_buffer_t other = ggml_backend_buffer_init(&other_buft, iface, NULL, sizeof(device_mem));
    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    idx->buffer = other;
    CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
    CHECK(uploads == 1 && syncs == 3 && apir_mirror_uploads_in_flight(s) == 0);
    ggml_backend_buffer_free(other);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    apir_session_free(s);
}

/*
 * The stage (larger uploads while a graph runs): a fake stream whose copies
 * happen only when it is synchronized or an event behind them is waited
 * for, as a GPU's may; the guest's bytes change right after each upload
 * (the next batch written there), and what arrives must be what was sent.
 */
#define STAGE_DEV_BYTES (16u << 20)
static uint8_t *stage_dev;
struct queued_copy {
    uint8_t *dst;
    const uint8_t *src;
    size_t size;
    bool graph;  /* a graph launched on the stream (no copy) */
};
static struct queued_copy queue[128];
static int queued, records, event_waits;
static int event_mark[2];  /* per fake event: the queue length when recorded */
static int newest_graph = -1;  /* the queue index of the graph in flight */
static int graph_waits;        /* event waits that had to run the graph in flight */

/* Runs the stream up to `upto`; true if that ran the graph in flight. */
static bool run_queue(int upto)
{
    bool ran_newest = false;
    for (int i = 0; i < upto && i < queued; i++) {
        if (queue[i].graph) {
            ran_newest |= i == newest_graph;
            queue[i].graph = false;
        } else if (queue[i].dst) {
            memcpy(queue[i].dst, queue[i].src, queue[i].size);
            queue[i].dst = NULL;
        }
    }
    return ran_newest;
}
static void queue_graph(void)
{
    if (queued < 128) {
        newest_graph = queued;
        queue[queued++] = (struct queued_copy){ .graph = true };
    }
}
static void queue_set_async(ggml_backend_t be, struct ggml_tensor *t, const void *data, size_t off, size_t size)
{
    (void)be;
    if (queued < 128)
        queue[queued++] = (struct queued_copy){ .dst = (uint8_t *)t->data + off, .src = data, .size = size };
}
static void queue_synchronize(ggml_backend_t be) { (void)be; (void)run_queue(queued); syncs++; }
static ggml_backend_event_t fake_event_new(ggml_backend_dev_t dev)
{
    static int n;
    ggml_backend_event_t e = calloc(1, sizeof(*e));
    e->device = dev;
    e->context = &event_mark[n++ % 2];
    return e;
}
static void fake_event_free(ggml_backend_dev_t dev, ggml_backend_event_t e) { (void)dev; free(e); }
static void fake_event_record(ggml_backend_t be, ggml_backend_event_t e)
{
    (void)be;
    *(int *)e->context = queued;
    records++;
}
static void fake_event_sync(ggml_backend_dev_t dev, ggml_backend_event_t e)
{
    (void)dev;
    graph_waits += run_queue(*(int *)e->context);
    event_waits++;
}
static void *stage_get_base(ggml_backend_buffer_t b) { (void)b; return stage_dev; }

static void test_stage(void)
{
    struct apir_host host;
    memset(&host, 0, sizeof(host));
    apir_host_config_default(&host.cfg);
    host.cfg.stage_bytes = 2u << 20;  /* halves of 1 MiB */
    host.device_memory = true;
    struct apir_session *s = apir_session_new(&host, "stage");
    struct ggml_backend_device dev = { .iface = { .get_buffer_type = fake_dev_buft, .event_new = fake_event_new,
                                                  .event_free = fake_event_free,
                                                  .event_synchronize = fake_event_sync } };
    struct ggml_backend backend = {
        .iface = { .free = fake_backend_free, .set_tensor_async = queue_set_async, .synchronize = queue_synchronize,
                   .event_record = fake_event_record },
        .device = &dev,
    };
    s->backends[0] = &backend;
    s->backend_async[0] = true;
    s->device = 0;
    stage_dev = calloc(1, STAGE_DEV_BYTES);
    struct ggml_backend_buffer_i iface = { .get_base = stage_get_base, .set_tensor = fake_set };
    ggml_backend_buffer_t buf = ggml_backend_buffer_init(&fake_buft, iface, NULL, STAGE_DEV_BYTES);
    struct ggml_init_params p = { .mem_size = 8 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    const size_t piece = 300u << 10;  /* three fit a half */
    struct ggml_tensor *t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)piece);
    t->buffer = buf;
    static uint8_t guest[700u << 10];
    uploads = syncs = queued = records = event_waits = 0;

    /* Nothing in flight: not staged (a plain upload is cheaper). */
    t->data = stage_dev;
    CHECK(!apir_mirror_upload(s, t, guest, 0, piece));
    s->graph_in_flight = &backend;  /* a graph launched on the stream */
    for (int i = 0; i < 7; i++) {
        t->data = stage_dev + i * piece;
        memset(guest, 'a' + i, piece);
        CHECK(apir_mirror_upload(s, t, guest, 0, piece));
        memset(guest, 'z', piece);  /* the guest writes the next batch there */
    }
    /* 7 uploads: half 0 took 3, half 1 the next 3, the 7th waited for half
     * 0's copies (its event, recorded behind each), not for the stream. */
    CHECK(queued == 7 && uploads == 0 && syncs == 0);
    CHECK(records == 7 && event_waits == 1);
    CHECK(stage_dev[0] == 'a' && stage_dev[2 * piece + piece - 1] == 'c');  /* half 0's, done */
    CHECK(stage_dev[3 * piece] == 0);                                       /* half 1's, queued */
    CHECK(apir_mirror_uploads_in_flight(s) > 0);
    apir_session_settle(s);
    CHECK(syncs == 1 && apir_mirror_uploads_in_flight(s) == 0 && s->graph_in_flight == NULL);
    int right = 0;
    for (int i = 0; i < 7; i++)
        right += stage_dev[i * piece] == 'a' + i && stage_dev[i * piece + piece - 1] == 'a' + i;
    CHECK(right == 7);
    /* Small uploads while graphs run: the mirror's two halves of entries
     * take turns the same way, without waiting for the stream. */
    s->graph_in_flight = &backend;
    records = event_waits = 0;
    struct ggml_tensor *idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8);
    idx->buffer = buf;
    int32_t vals[8];
    for (int i = 0; i < APIR_MIRROR_ENTRIES + 4; i++) {
        idx->data = stage_dev + 4096 + 64 * i;
        for (int k = 0; k < 8; k++)
            vals[k] = 1000 * i + k;
        CHECK(apir_mirror_upload(s, idx, (const uint8_t *)vals, 0, sizeof(vals)));
        memset(vals, 0xff, sizeof(vals));
    }
    /* Into the second half (the first's end recorded), back into the first
     * (the second's recorded, the first's waited for). */
    CHECK(syncs == 1 && records == 2 && event_waits == 1);
    apir_session_settle(s);
    right = 0;
    for (int i = 0; i < APIR_MIRROR_ENTRIES + 4; i++)
        right += ((int32_t *)(stage_dev + 4096 + 64 * i))[7] == 1000 * i + 7;
    CHECK(syncs == 2 && right == APIR_MIRROR_ENTRIES + 4);
    /* Prompt batches: each an upload that fills most of a half (the
     * embeddings) and one that does not fit beside it (the mask), then the
     * batch's graph.  Every upload turns the stage, and none may wait for
     * the graph in flight: a half's event is behind its copies, not behind
     * the graphs launched after them (an H200's 8B prompt waited ~25 ms a
     * batch when it was recorded at the turn). */
    apir_session_settle(s);
    queued = 0;
    graph_waits = event_waits = 0;
    const uint64_t profiled0 = s->stats.n_upload_waits;
    s->graph_in_flight = &backend;
    queue_graph();
    const size_t embd = 700u << 10, mask = 500u << 10;
    struct ggml_tensor *in = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)embd);
    in->buffer = buf;
    for (int b = 0; b < 6; b++) {
        in->data = stage_dev + (size_t)b * (embd + mask);
        memset(guest, 'A' + b, embd);
        CHECK(apir_mirror_upload(s, in, guest, 0, embd));
        in->data = stage_dev + (size_t)b * (embd + mask) + embd;
        memset(guest, 'a' + b, mask);
        CHECK(apir_mirror_upload(s, in, guest, 0, mask));
        memset(guest, 'z', embd);
        queue_graph();
    }
    CHECK_MSG(graph_waits == 0, "%d uploads waited for the graph in flight", graph_waits);
    CHECK(event_waits >= 10 && syncs == 2);
    CHECK(s->stats.n_upload_waits - profiled0 == (uint64_t)event_waits);  /* the host's profile line */
    apir_session_settle(s);
    right = 0;
    for (int b = 0; b < 6; b++) {
        const uint8_t *at = stage_dev + (size_t)b * (embd + mask);
        right += at[0] == 'A' + b && at[embd - 1] == 'A' + b && at[embd] == 'a' + b && at[embd + mask - 1] == 'a' + b;
    }
    CHECK(right == 6);
    /* Bigger than a half: the caller waits and uploads the plain way. */
    s->graph_in_flight = &backend;
    struct ggml_tensor *large = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)(1u << 20) + 1);
    large->buffer = buf;
    large->data = stage_dev;
    static uint8_t big[(1u << 20) + 1];
    CHECK(!apir_mirror_upload(s, large, big, 0, sizeof(big)));
    /* A device that makes no events: never staged. */
    apir_session_settle(s);
    struct ggml_backend_device plain_dev = { .iface = { .get_buffer_type = fake_dev_buft } };
    struct ggml_backend plain = backend;
    plain.device = &plain_dev;
    s->backends[0] = &plain;
    s->graph_in_flight = &plain;
    CHECK(!apir_mirror_upload(s, t, guest, 0, piece));
    CHECK(!apir_mirror_upload(s, t, guest, 0, piece));
    /* Its own device again: staged. */
    s->backends[0] = &backend;
    s->graph_in_flight = &backend;
    CHECK(apir_mirror_upload(s, t, guest, 0, piece));
    apir_session_settle(s);
    /* Halves grown while graphs run: each to the largest upload staged, so
     * that the half a mask sized is not regrown when a later prompt gives
     * it the embeddings (a prompt's first batch is not staged, so which
     * half takes what flips from prompt to prompt); the memory outgrown is
     * kept until the settle (giving page-locked memory back waits for the
     * whole device: an 8B batch's upload that regrew its half waited 44 ms
     * for the graph in flight on an H100). */
    apir_session_settle(s);
    host.cfg.stage_bytes = 32u << 20;
    CHECK(apir_mirror_stage_retired(s) == 0);
    static uint8_t embd_src[8u << 20], mask_src[1u << 20];
    struct ggml_tensor *e8 = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)sizeof(embd_src));
    struct ggml_tensor *m1 = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)sizeof(mask_src));
    e8->buffer = m1->buffer = buf;
    e8->data = stage_dev;
    m1->data = stage_dev + sizeof(embd_src);
    uint32_t retired[2] = { 0, 0 };
    for (int prompt = 0; prompt < 2; prompt++) {
        queued = 0;
        s->graph_in_flight = &backend;
        queue_graph();  /* the prompt's first batch, uploaded before it the plain way */
        for (int b = 0; b < 3; b++) {
            memset(embd_src, 'E' + b, sizeof(embd_src));
            CHECK(apir_mirror_upload(s, e8, embd_src, 0, sizeof(embd_src)));
            memset(mask_src, 'm' + b, sizeof(mask_src));
            CHECK(apir_mirror_upload(s, m1, mask_src, 0, sizeof(mask_src)));
            memset(mask_src, 'z', sizeof(mask_src));
            memset(embd_src, 'z', sizeof(embd_src));
            queue_graph();
        }
        retired[prompt] = apir_mirror_stage_retired(s);
        apir_session_settle(s);
        CHECK(apir_mirror_stage_retired(s) == 0);
        CHECK(stage_dev[0] == 'E' + 2 && stage_dev[sizeof(embd_src) - 1] == 'E' + 2);
        CHECK(stage_dev[sizeof(embd_src)] == 'm' + 2 && stage_dev[sizeof(embd_src) + sizeof(mask_src) - 1] == 'm' + 2);
    }
    /* The first prompt grew both halves (from the 1 MiB above to 8), the
     * second neither. */
    CHECK_MSG(retired[0] == 2 && retired[1] == 0, "halves regrown: %u in the first prompt, %u in the second",
              retired[0], retired[1]);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    apir_session_free(s);
    free(stage_dev);
}

TEST_MAIN("mirror", TEST(test_mirror), TEST(test_async_uploads), TEST(test_stage))
