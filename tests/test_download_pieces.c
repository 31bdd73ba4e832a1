/*
 * Downloads in pieces (host/data/download_pieces.c) against a fake device
 * that copies only when an event is waited for, as an asynchronous stream
 * would: nothing may be called ready before its piece's event has passed,
 * every byte arrives, and whatever cannot take the path (too small, host
 * memory, a foreign buffer type, a device without events) is left to the
 * plain copy.
 */
#include "ggml-backend-impl.h"
#include "ggml.h"
#include "host.h"
#include "dispatcher.h"
#include "download_pieces.h"
#include "test_util.h"

#include <string.h>

#define DEV_BYTES (4u << 20)
static uint8_t device_mem[DEV_BYTES];
static uint8_t host_mem[DEV_BYTES + 8192];

/* The fake stream: copies queued, done up to an event when it is waited for. */
struct queued { uint8_t *dst; const uint8_t *src; size_t len; };
static struct queued queue[64];
static int n_queued, n_done, n_async_gets, n_records, n_event_waits;
struct fake_event { int upto; };
static struct fake_event event_pool[64];
static int n_events;

static void run_queue(int upto)
{
    for (; n_done < upto; n_done++)
        memcpy(queue[n_done].dst, queue[n_done].src, queue[n_done].len);
}

static void fake_get_async(ggml_backend_t be, const struct ggml_tensor *t, void *data, size_t off, size_t size)
{
    (void)be;
    queue[n_queued++] = (struct queued){ data, (const uint8_t *)t->data + off, size };
    n_async_gets++;
}
static void fake_record(ggml_backend_t be, ggml_backend_event_t ev)
{
    (void)be;
    ((struct fake_event *)ev->context)->upto = n_queued;
    n_records++;
}
static ggml_backend_event_t fake_event_new(ggml_backend_dev_t dev)
{
    struct ggml_backend_event *ev = calloc(1, sizeof(*ev));
    ev->device = dev;
    ev->context = &event_pool[n_events++ % 64];
    return ev;
}
static void fake_event_free(ggml_backend_dev_t dev, ggml_backend_event_t ev) { (void)dev; free(ev); }
static void fake_event_sync(ggml_backend_dev_t dev, ggml_backend_event_t ev)
{
    (void)dev;
    run_queue(((struct fake_event *)ev->context)->upto);
    n_event_waits++;
}
static void fake_synchronize(ggml_backend_t be) { (void)be; run_queue(n_queued); }
static void fake_backend_free(ggml_backend_t be) { (void)be; }

static void *fake_get_base(ggml_backend_buffer_t b) { (void)b; return device_mem; }
static const char *fake_name(ggml_backend_buffer_type_t bt) { (void)bt; return "FAKE_DEVICE"; }
static bool fake_is_host(ggml_backend_buffer_type_t bt) { (void)bt; return false; }
static bool fake_is_host_yes(ggml_backend_buffer_type_t bt) { (void)bt; return true; }
static struct ggml_backend_buffer_type fake_buft = { .iface = { .get_name = fake_name, .is_host = fake_is_host } };
static struct ggml_backend_buffer_type other_buft = { .iface = { .get_name = fake_name, .is_host = fake_is_host } };
static struct ggml_backend_buffer_type host_buft = { .iface = { .get_name = fake_name, .is_host = fake_is_host_yes } };
static ggml_backend_buffer_type_t fake_dev_buft(ggml_backend_dev_t dev) { (void)dev; return &fake_buft; }
static const char *fake_dev_name(ggml_backend_dev_t dev) { (void)dev; return "FAKE0"; }

static void reset_queue(void)
{
    n_queued = n_done = n_async_gets = n_records = n_event_waits = 0;
}

/* The transport's way out, faked: appends what each send carries. */
struct sink { uint8_t *out; size_t len; int sends; };
static int sink_send(void *ctx, struct iovec *iov, int n)
{
    struct sink *k = ctx;
    for (int i = 0; i < n; i++) {
        memcpy(k->out + k->len, iov[i].iov_base, iov[i].iov_len);
        k->len += iov[i].iov_len;
    }
    k->sends++;
    return 0;
}

/* A reply as stream.c sends it: a 16-byte head, then [from, end). */
static size_t send_like_the_transport(struct apir_download_pieces *p, const uint8_t *from, const uint8_t *end,
                                      uint8_t *out, int *waits_between)
{
    static const uint8_t head[16] = "reply header....";
    static uint8_t sent[DEV_BYTES + 16];
    struct sink k = { sent, 0, 0 };
    const int waits_before = n_event_waits;
    const struct iovec h = { (void *)head, sizeof(head) };
    const struct iovec range = { (void *)from, (size_t)(end - from) };
    if (apir_download_pieces_send(p, &h, 1, &range, 1, sink_send, &k) != 0 || k.len < sizeof(head) ||
        memcmp(sent, head, sizeof(head)) != 0)
        return 0;
    memcpy(out, sent + sizeof(head), k.len - sizeof(head));
    *waits_between = n_event_waits - waits_before;
    return k.len - sizeof(head);
}

/* A session whose device 0 is `backend` (copying asynchronously), and a
 * tensor over the whole fake device memory in buf. */
static struct apir_session *session_on(struct apir_host *host, struct ggml_backend *backend, const char *name)
{
    memset(host, 0, sizeof(*host));
    apir_host_config_default(&host->cfg);
    struct apir_session *s = apir_session_new(host, name);
    s->backends[0] = backend;
    s->backend_async[0] = true;
    s->device = 0;
    return s;
}

static struct ggml_tensor *device_tensor(struct ggml_context *ctx, ggml_backend_buffer_t buf)
{
    struct ggml_tensor *t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)DEV_BYTES);
    t->buffer = buf;
    t->data = device_mem;
    return t;
}

static void test_pieces(void)
{
    struct ggml_backend_device dev = { .iface = { .get_name = fake_dev_name, .get_buffer_type = fake_dev_buft,
                                                  .event_new = fake_event_new, .event_free = fake_event_free,
                                                  .event_synchronize = fake_event_sync } };
    struct ggml_backend backend = {
        .iface = { .free = fake_backend_free, .get_tensor_async = fake_get_async, .synchronize = fake_synchronize,
                   .event_record = fake_record },
        .device = &dev,
    };
    struct apir_host host;
    struct apir_session *s = session_on(&host, &backend, "pieces");
    struct ggml_backend_buffer_i iface = { .get_base = fake_get_base };
    ggml_backend_buffer_t buf = ggml_backend_buffer_init(&fake_buft, iface, NULL, sizeof(device_mem));
    struct ggml_init_params ip = { .mem_size = 4 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *t = device_tensor(ctx, buf);
    for (size_t i = 0; i < DEV_BYTES; i++)
        device_mem[i] = (uint8_t)(i * 131 + (i >> 12));
    uint8_t *dst = host_mem + 4096;

    /* Off until a transport enables it. */
    CHECK(!apir_download_pieces_start(s, t, dst, 0, 1u << 20));
    apir_download_pieces_enable(s, 128u * 1024u);
    /* Below two pieces: plain. */
    CHECK(!apir_download_pieces_start(s, t, dst, 0, 200u * 1024u));
    CHECK(n_async_gets == 0);

    /* 1 MiB from offset 4096: eight pieces of 128 KiB, nothing copied yet. */
    reset_queue();
    memset(host_mem, 0, sizeof(host_mem));
    const size_t size = 1u << 20, off = 4096;
    CHECK(apir_download_pieces_start(s, t, dst, off, size));
    CHECK(s->pieces->n != 0);  /* in flight */
    CHECK(n_async_gets == 8 && n_records == 8 && n_done == 0);
    /* A second download while one is in flight: plain. */
    CHECK(!apir_download_pieces_start(s, t, dst, 0, size));
    struct apir_download_pieces *p = s->pieces;
    CHECK(apir_download_pieces_ready(p, dst, dst + size) == dst);
    /* Bytes before and after the download are not its to hold back. */
    CHECK(apir_download_pieces_ready(p, dst - 100, dst + size) == dst);
    CHECK(apir_download_pieces_ready(p, dst - 100, dst - 50) == dst - 50);
    CHECK(apir_download_pieces_ready(p, dst + size, dst + size + 10) == dst + size + 10);
    /* Waiting for a byte of piece 2 lands pieces 0..2 (one stream, in order). */
    apir_download_pieces_wait(p, dst + 300 * 1024);
    CHECK(n_done == 3 && n_event_waits == 1);
    CHECK(apir_download_pieces_ready(p, dst, dst + size) == dst + 384 * 1024);
    CHECK(apir_download_pieces_ready(p, dst + 10, dst + 20) == dst + 20);
    CHECK(apir_download_pieces_ready(p, dst + 384 * 1024, dst + size) == dst + 384 * 1024);
    CHECK(memcmp(dst, device_mem + off, 384 * 1024) == 0);
    /* A piece already landed costs no wait. */
    apir_download_pieces_wait(p, dst + 1000);
    CHECK(n_event_waits == 1);

    /* The transport's loop sends every byte, each after its piece landed. */
    static uint8_t out[DEV_BYTES];
    int waits = 0;
    CHECK(send_like_the_transport(p, dst, dst + size, out, &waits) == size);
    CHECK(waits == 5 && n_done == 8);
    CHECK(memcmp(out, device_mem + off, size) == 0);
    apir_download_pieces_finish(p);
    CHECK(p->n == 0);  /* forgotten */
    CHECK(host_mem[4095] == 0 && dst[size] == 0);  /* nothing written outside */

    /* Larger: at most APIR_DOWNLOAD_PIECES_MAX pieces, so larger pieces (the last shorter). */
    reset_queue();
    const size_t big = 3u * 1024u * 1024u + 12345u;
    CHECK(apir_download_pieces_start(s, t, dst, 0, big));
    CHECK(n_async_gets == (int)APIR_DOWNLOAD_PIECES_MAX);
    CHECK(send_like_the_transport(p, dst, dst + big, out, &waits) == big);
    CHECK(memcmp(out, device_mem, big) == 0);
    /* finish waits for what the sender never asked for. */
    apir_download_pieces_finish(p);
    reset_queue();
    CHECK(apir_download_pieces_start(s, t, dst, 0, size));
    apir_download_pieces_finish(p);
    CHECK(n_done == 8 && memcmp(dst, device_mem, size) == 0);

    /* Not the device's own buffer type, or host memory: plain. */
    ggml_backend_buffer_t other = ggml_backend_buffer_init(&other_buft, iface, NULL, sizeof(device_mem));
    ggml_backend_buffer_t hostbuf = ggml_backend_buffer_init(&host_buft, iface, NULL, sizeof(device_mem));
    t->buffer = other;
    CHECK(!apir_download_pieces_start(s, t, dst, 0, size));
    t->buffer = hostbuf;
    CHECK(!apir_download_pieces_start(s, t, dst, 0, size));
    /* A view of a tensor in another buffer type (what ggml-cuda would assert on). */
    struct ggml_tensor *src = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 16);
    src->buffer = other;
    t->buffer = buf;
    t->view_src = src;
    CHECK(!apir_download_pieces_start(s, t, dst, 0, size));
    t->view_src = NULL;
    /* A device that copies synchronously (backend_async false): plain. */
    s->backend_async[0] = false;
    CHECK(!apir_download_pieces_start(s, t, dst, 0, size));
    s->backend_async[0] = true;
    CHECK(apir_download_pieces_start(s, t, dst, 0, size));
    apir_download_pieces_finish(p);

    ggml_backend_buffer_free(other);
    ggml_backend_buffer_free(hostbuf);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    s->backends[0] = NULL;
    apir_session_free(s);
}

/* A device without events (the CPU backend's): never in pieces, asked once. */
static int events_asked;
static ggml_backend_event_t no_event_new(ggml_backend_dev_t dev)
{
    (void)dev;
    events_asked++;
    return NULL;
}

static void test_no_events(void)
{
    struct ggml_backend_device dev = { .iface = { .get_name = fake_dev_name, .get_buffer_type = fake_dev_buft,
                                                  .event_new = no_event_new } };
    struct ggml_backend backend = {
        .iface = { .free = fake_backend_free, .get_tensor_async = fake_get_async, .synchronize = fake_synchronize },
        .device = &dev,
    };
    struct apir_host host;
    struct apir_session *s = session_on(&host, &backend, "no-events");
    apir_download_pieces_enable(s, 64u * 1024u);
    struct ggml_backend_buffer_i iface = { .get_base = fake_get_base };
    ggml_backend_buffer_t buf = ggml_backend_buffer_init(&fake_buft, iface, NULL, sizeof(device_mem));
    struct ggml_init_params ip = { .mem_size = 2 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *t = device_tensor(ctx, buf);
    reset_queue();
    CHECK(!apir_download_pieces_start(s, t, host_mem, 0, 1u << 20));
    CHECK(!apir_download_pieces_start(s, t, host_mem, 0, 1u << 20));
    CHECK(events_asked == 1 && n_async_gets == 0);
    CHECK(apir_download_pieces_ready(s->pieces, host_mem, host_mem + 10) == host_mem + 10);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    s->backends[0] = NULL;
    apir_session_free(s);
}

TEST_MAIN("download_pieces", TEST(test_pieces), TEST(test_no_events))
