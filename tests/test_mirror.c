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

TEST_MAIN("mirror", TEST(test_mirror), TEST(test_async_uploads))
