/*
 * The virgl host-library ABI of libapir-virgl.so, driven the way
 * virglrenderer drives it (dlopen, then apir_backend_initialize /
 * _dispatcher / _deinit with callbacks), without any guest:
 *
 *   - initialize's return codes, one per failure it can report;
 *   - several ctx_ids at once are isolated (handles, blobs), also while two
 *     threads run commands on two contexts;
 *   - malformed command streams and hostile ranges are refused, and the
 *     context keeps working afterwards;
 *   - blob bounds, with the hypervisor's get_shmem_size and without it;
 *   - an unknown ctx_id is answered, never followed;
 *   - deinit frees what the context held (its buffers' memory comes back).
 *
 * usage: test_virgl_abi LIBAPIR_VIRGL FAKE_BACKEND_LIB GGML_CPU_LIB
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "ggml.h"
#include "test_records.h"
#include "test_util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct callbacks {
    const char *(*get_config)(uint32_t ctx_id, const char *key);
    void *(*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
    size_t (*get_shmem_size)(uint32_t ctx_id, uint32_t res_id);
};
typedef uint32_t (*init_fn)(uint32_t, struct callbacks *);
typedef uint32_t (*dispatch_fn)(uint32_t, struct callbacks *, uint32_t, char *, const char *, char *, const char *, char **);
typedef void (*deinit_fn)(uint32_t);

static init_fn lib_init;
static dispatch_fn lib_dispatch;
static deinit_fn lib_deinit;
static const char *fake_lib, *cpu_lib;

/* ---- a tiny hypervisor: per-context configuration and blobs ---------------- */

#define MAX_CTX 16
#define MAX_BLOBS 8
struct blob {
    uint32_t res_id;
    uint8_t *ptr;
    size_t size;
};
static struct {
    const char *path, *reg, *device, *size_ext;
    struct blob blobs[MAX_BLOBS];
} hv[MAX_CTX];

static const char *get_config(uint32_t ctx, const char *key)
{
    if (ctx >= MAX_CTX)
        return NULL;
    if (strcmp(key, "ggml.library.path") == 0)
        return hv[ctx].path;
    if (strcmp(key, "ggml.library.reg") == 0)
        return hv[ctx].reg;
    if (strcmp(key, "apir.device") == 0)
        return hv[ctx].device;
    if (strcmp(key, "apir.n_threads") == 0)
        return "2";
    if (strcmp(key, "apir.callbacks.get_shmem_size") == 0)
        return hv[ctx].size_ext;
    return NULL;
}

static struct blob *blob_of(uint32_t ctx, uint32_t res)
{
    if (ctx >= MAX_CTX)
        return NULL;
    for (int i = 0; i < MAX_BLOBS; i++)
        if (hv[ctx].blobs[i].res_id == res && hv[ctx].blobs[i].ptr)
            return &hv[ctx].blobs[i];
    return NULL;
}

static void *get_shmem_ptr(uint32_t ctx, uint32_t res)
{
    struct blob *b = blob_of(ctx, res);
    return b ? b->ptr : NULL;
}

static size_t get_shmem_size(uint32_t ctx, uint32_t res)
{
    struct blob *b = blob_of(ctx, res);
    return b ? b->size : 0;
}

static struct callbacks cbs = { get_config, get_shmem_ptr, get_shmem_size };

/* A blob as virglrenderer makes one: its own shared mapping. */
static uint8_t *add_blob(uint32_t ctx, uint32_t res, size_t size)
{
    for (int i = 0; i < MAX_BLOBS; i++) {
        if (!hv[ctx].blobs[i].ptr) {
            void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED)
                return NULL;
            hv[ctx].blobs[i] = (struct blob){ res, p, size };
            return p;
        }
    }
    return NULL;
}

/* ---- commands ---------------------------------------------------------------- */

static uint8_t reply_buf[16384], request_buf[8192];
/* Whether the last typed call's reply decoded whole (its items were there). */
static bool reply_ok;

/*
 * Typed calls, one per command of the table:
 *
 *   uint32_t call_<NAME>(ctx, <request items>, <pointers for the reply items>)
 *
 * encodes the request (apir_encode_request_<NAME>), dispatches it, and
 * decodes the reply (apir_decode_reply_<NAME>) whatever the result: the
 * outputs are zero when the handler answered nothing.  reply_ok says
 * whether the reply held its items.  Not for the worker threads (one
 * request and reply buffer).
 */
#define VIRGL_X_CALL(num, NAME, since, classes)                                                                 \
    static inline uint32_t call_##NAME(uint32_t ctx APIR_REQ_##NAME(APIR_ITEM_PARAM_IN)                         \
                                           APIR_REP_##NAME(APIR_ITEM_PARAM_OUT))                                \
    {                                                                                                           \
        struct apir_encoder enc;                                                                                \
        apir_encoder_init(&enc, request_buf, sizeof(request_buf));                                              \
        apir_encode_request_##NAME(&enc APIR_REQ_##NAME(APIR_ITEM_ARG));                                        \
        char *after = NULL;                                                                                     \
        uint32_t r = lib_dispatch(ctx, &cbs, APIR_CMD_##NAME, (char *)request_buf,                              \
                                  (const char *)request_buf + apir_encoder_used(&enc), (char *)reply_buf,       \
                                  (const char *)reply_buf + sizeof(reply_buf), &after);                         \
        struct apir_decoder reply;                                                                              \
        apir_decoder_init(&reply, reply_buf, after ? (size_t)(after - (char *)reply_buf) : 0);                  \
        reply_ok = apir_decode_reply_##NAME(&reply APIR_REP_##NAME(APIR_ITEM_ARG));                             \
        return r;                                                                                               \
    }
APIR_COMMAND_LIST(VIRGL_X_CALL)
#undef VIRGL_X_CALL

static uint32_t call_raw(uint32_t ctx, uint32_t cmd, const void *req, size_t len, size_t reply_cap, char **after)
{
    return lib_dispatch(ctx, &cbs, cmd, (char *)req, (const char *)req + len, (char *)reply_buf,
                        (const char *)reply_buf + reply_cap, after);
}

static uint32_t init_cpu(uint32_t ctx, bool size_ext)
{
    hv[ctx].path = cpu_lib;
    hv[ctx].reg = NULL;
    hv[ctx].device = NULL;
    hv[ctx].size_ext = size_ext ? "1" : NULL;
    return lib_init(ctx, &cbs);
}

static uint64_t alloc_buffer(uint32_t ctx, uint64_t size)
{
    uint64_t buft = 0, buf = 0;
    call_DEVICE_GET_BUFFER_TYPE(ctx, &buft);
    if (call_BUFFER_TYPE_ALLOC_BUFFER(ctx, buft, size, &buf) != APIR_HANDLER_OK)
        return 0;
    return buf;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ---- tests ---------------------------------------------------------------------- */

#define OK(x) ((x) == APIR_LOAD_HOST_BASE + APIR_INIT_SUCCESS)

static void test_init_codes(void)
{
    CHECK(lib_init(1, NULL) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED);
    struct callbacks half = { get_config, NULL, NULL };
    CHECK(lib_init(1, &half) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED);

    hv[1].path = NULL;
    CHECK(lib_init(1, &cbs) == APIR_LOAD_CONFIG_MISSING);
    hv[1].path = "/nonexistent/libggml-none.so";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_CANNOT_OPEN);
    hv[1].path = fake_lib;
    hv[1].reg = "no_such_registration_function";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_SYMBOL_MISSING);
    hv[1].reg = NULL;  /* ggml_backend_init: a backend without devices */
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE);
    hv[1].reg = "fake_reg_null";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_REG_FAILED);
    hv[1].reg = "fake_reg_old_api";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_REG_FAILED);
    hv[1].reg = "fake_reg_apir";  /* would serve our own frontend: a loop */
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE);

    hv[1].path = cpu_lib;
    hv[1].reg = NULL;
    hv[1].device = "7";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE);
    hv[1].device = NULL;

    /* None of the failures left a context behind. */
    int32_t count = 0;
    CHECK(call_DEVICE_GET_COUNT(1, &count) == APIR_HANDLER_FAILED);

    CHECK(OK(init_cpu(1, true)));
    CHECK(init_cpu(1, true) == APIR_LOAD_HOST_BASE + APIR_INIT_ALREADY_INITIALIZED);
    CHECK(call_DEVICE_GET_COUNT(1, &count) == APIR_HANDLER_OK);
    CHECK(reply_ok && count >= 1);
    lib_deinit(1);
    CHECK(call_DEVICE_GET_COUNT(1, &count) == APIR_HANDLER_FAILED);
    CHECK(OK(init_cpu(1, true)));  /* the same ctx_id again, fresh */
    lib_deinit(1);
}

static void test_isolation(void)
{
    CHECK(OK(init_cpu(2, true)));
    CHECK(OK(init_cpu(3, true)));
    uint8_t *b2 = add_blob(2, 20, 1 << 16);
    uint8_t *b3 = add_blob(3, 30, 1 << 16);
    uint64_t h2 = alloc_buffer(2, 4096), h3 = alloc_buffer(3, 4096);
    CHECK(h2 && h3);

    /* A handle is only good in its own context. */
    uint64_t base = 0;
    CHECK(call_BUFFER_GET_BASE(3, h2, &base) == APIR_HANDLER_BAD_HANDLE);
    CHECK(call_BUFFER_FREE_BUFFER(3, h2) == APIR_HANDLER_BAD_HANDLE);
    CHECK(call_BUFFER_GET_BASE(2, h2, &base) == APIR_HANDLER_OK && reply_ok);

    /* Data: ctx 2 writes through its blob and reads back. */
    struct apir_tensor_rec t2 = f32_rec(1, h2, 0, 256);
    for (int i = 0; i < 1024; i++)
        b2[i] = (uint8_t)i;
    CHECK(call_BUFFER_SET_TENSOR(2, h2, &t2, 20, 0, 1024) == APIR_HANDLER_OK);
    memset(b2, 0, 1024);
    CHECK(call_BUFFER_GET_TENSOR(2, h2, &t2, 20, 0, 1024) == APIR_HANDLER_OK);
    bool same = true;
    for (int i = 0; i < 1024; i++)
        same = same && b2[i] == (uint8_t)i;
    CHECK(same);

    /* ctx 3 can name neither ctx 2's buffer (a foreign handle) nor its blob. */
    struct apir_tensor_rec t3 = f32_rec(1, h3, 0, 256);
    struct apir_tensor_rec t2_in_3 = f32_rec(1, h2, 0, 256);
    CHECK(call_BUFFER_GET_TENSOR(3, h2, &t2_in_3, 30, 0, 1024) == APIR_HANDLER_BAD_HANDLE);
    CHECK(call_BUFFER_GET_TENSOR(3, h3, &t3, 20, 0, 1024) == APIR_HANDLER_BAD_REQUEST);
    memset(b3, 0xee, 1024);
    CHECK(call_BUFFER_GET_TENSOR(3, h3, &t3, 30, 0, 1024) == APIR_HANDLER_OK);
    CHECK(b3[0] != 1 || b3[1] != 2);  /* ctx 3's buffer is not ctx 2's */
    (void)b3;
}

/* Two threads, two contexts, many commands at once. */
struct worker {
    uint32_t ctx, res;
    uint8_t *blob;
    uint64_t buf;
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct apir_tensor_rec t = f32_rec(1, w->buf, 0, 1024);
    uint8_t req[8192], rep[256];
    for (int it = 0; it < 300; it++) {
        memset(w->blob, (int)(w->ctx + (uint32_t)it), 4096);
        struct apir_encoder e;
        apir_encoder_init(&e, req, sizeof(req));
        apir_encode_request_BUFFER_SET_TENSOR(&e, w->buf, &t, w->res, 0, 4096);
        char *after;
        if (lib_dispatch(w->ctx, &cbs, APIR_CMD_BUFFER_SET_TENSOR, (char *)req, (char *)req + apir_encoder_used(&e),
                         (char *)rep, (char *)rep + sizeof(rep), &after) != APIR_HANDLER_OK)
            w->failures++;
        memset(w->blob, 0, 4096);
        apir_encoder_init(&e, req, sizeof(req));
        apir_encode_request_BUFFER_GET_TENSOR(&e, w->buf, &t, w->res, 0, 4096);
        if (lib_dispatch(w->ctx, &cbs, APIR_CMD_BUFFER_GET_TENSOR, (char *)req, (char *)req + apir_encoder_used(&e),
                         (char *)rep, (char *)rep + sizeof(rep), &after) != APIR_HANDLER_OK)
            w->failures++;
        for (int i = 0; i < 4096; i++)
            if (w->blob[i] != (uint8_t)(w->ctx + (uint32_t)it)) {
                w->failures++;
                break;
            }
    }
    return NULL;
}

static void test_concurrent_contexts(void)
{
    struct worker w[2] = { { .ctx = 2, .res = 21 }, { .ctx = 3, .res = 31 } };
    for (int i = 0; i < 2; i++) {
        w[i].blob = add_blob(w[i].ctx, w[i].res, 1 << 16);
        w[i].buf = alloc_buffer(w[i].ctx, 1 << 16);
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK(w[0].failures == 0);
    CHECK(w[1].failures == 0);
}

static void test_malformed(void)
{
    char *after = NULL;
    uint8_t junk[64];
    memset(junk, 0xa5, sizeof(junk));

    CHECK(call_raw(2, 999, junk, 0, sizeof(reply_buf), &after) == APIR_HANDLER_INVALID_INDEX);
    CHECK(after == (char *)reply_buf);
    CHECK(lib_dispatch(2, &cbs, APIR_CMD_DEVICE_GET_COUNT, (char *)junk + 8, (char *)junk, (char *)reply_buf,
                       (char *)reply_buf + 64, &after) == APIR_HANDLER_BAD_REQUEST);
    CHECK(lib_dispatch(2, &cbs, APIR_CMD_DEVICE_GET_COUNT, (char *)junk, (char *)junk, (char *)reply_buf + 8,
                       (char *)reply_buf, &after) == APIR_HANDLER_BAD_REQUEST);
    CHECK(lib_dispatch(2, &cbs, APIR_CMD_DEVICE_GET_COUNT, (char *)junk, (char *)junk, (char *)reply_buf,
                       (char *)reply_buf + 64, NULL) == APIR_HANDLER_BAD_REQUEST);
    CHECK(lib_dispatch(2, &cbs, APIR_CMD_DEVICE_GET_COUNT, NULL, NULL, (char *)reply_buf, (char *)reply_buf + 64,
                       &after) == APIR_HANDLER_OK);

    /* Truncated requests: malformed, whatever the handle they start with. */
    CHECK(call_raw(2, APIR_CMD_BUFFER_SET_TENSOR, junk, 8, sizeof(reply_buf), &after) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_raw(2, APIR_CMD_BUFFER_SET_TENSOR, junk, 4, sizeof(reply_buf), &after) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_raw(2, APIR_CMD_BACKEND_GRAPH_COMPUTE, junk, 2, sizeof(reply_buf), &after) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_raw(2, APIR_CMD_DEVICE_SUPPORTS_OP, junk, 64, sizeof(reply_buf), &after) == APIR_HANDLER_BAD_REQUEST);
    uint8_t zero_list[4] = { 0 };
    CHECK(call_raw(2, APIR_CMD_DEVICE_SUPPORTS_OP_L, zero_list, 4, sizeof(reply_buf), &after) == APIR_HANDLER_BAD_REQUEST);

    /* A reply that does not fit. */
    CHECK(call_raw(2, APIR_CMD_DEVICE_GET_NAME, junk, 0, 6, &after) == APIR_HANDLER_REPLY_FULL);

    /* Ranges outside the blob (size known through get_shmem_size). */
    uint64_t h = alloc_buffer(2, 1 << 20);
    struct apir_tensor_rec big = f32_rec(1, h, 0, 1 << 18);  /* 1 MiB tensor, 64 KiB blob */
    CHECK(call_BUFFER_SET_TENSOR(2, h, &big, 20, 0, 1 << 16) == APIR_HANDLER_OK);
    CHECK(call_BUFFER_SET_TENSOR(2, h, &big, 20, 0, 1 << 17) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BUFFER_GET_TENSOR_AT(2, h, &big, 20, (1 << 16) - 8, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BUFFER_GET_TENSOR(2, h, &big, 77, 0, 16) == APIR_HANDLER_BAD_REQUEST);

    /* Graphs: garbage, and a size beyond the blob. */
    uint8_t *g = blob_of(2, 20)->ptr;
    memset(g, 0x5a, 4096);
    uint32_t status = 0;
    CHECK(call_BACKEND_GRAPH_COMPUTE(2, 20, 4096, &status) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BACKEND_GRAPH_COMPUTE(2, 20, 1 << 17, &status) == APIR_HANDLER_BAD_REQUEST);

    /* Wrapping a blob as a buffer is not offered over virgl, nor advertised
     * (five items: the pinned reference reads mmap_support too). */
    uint64_t wrapped = 0, wrapped_type = 0;
    CHECK(call_DEVICE_BUFFER_FROM_PTR(2, 20, 4096, 4096, &wrapped, &wrapped_type) == APIR_HANDLER_BAD_REQUEST);
    bool props[5] = { 1, 1, 1, 1, 1 };
    CHECK(call_DEVICE_GET_PROPS(2, &props[0], &props[1], &props[2], &props[3], &props[4]) == APIR_HANDLER_OK);
    CHECK(reply_ok && !props[2]);

    /* A real graph still runs afterwards: c = a + b. */
    struct apir_tensor_rec t[3] = { f32_rec(11, h, 0, 64), f32_rec(12, h, 256, 64), f32_rec(13, h, 512, 64) };
    t[2].op = GGML_OP_ADD;
    t[2].src[0] = 11;
    t[2].src[1] = 12;
    t[2].flags = GGML_TENSOR_FLAG_COMPUTE;
    float *f = (float *)(void *)g;
    for (int i = 0; i < 64; i++)
        f[i] = (float)i;
    CHECK(call_BUFFER_SET_TENSOR(2, h, &t[0], 20, 0, 256) == APIR_HANDLER_OK);
    for (int i = 0; i < 64; i++)
        f[i] = 100.0f;
    CHECK(call_BUFFER_SET_TENSOR(2, h, &t[1], 20, 0, 256) == APIR_HANDLER_OK);
    struct apir_encoder e;
    apir_encoder_init(&e, g, 1 << 16);
    apir_encode_u32(&e, 1);
    apir_encode_u64(&e, 13);
    apir_encode_tensor_list(&e, 3, t);
    CHECK(call_BACKEND_GRAPH_COMPUTE(2, 20, apir_encoder_used(&e), &status) == APIR_HANDLER_OK);
    CHECK(reply_ok && status == GGML_STATUS_SUCCESS);
    CHECK(call_BUFFER_GET_TENSOR(2, h, &t[2], 20, 0, 256) == APIR_HANDLER_OK);
    CHECK(f[0] == 100.0f && f[63] == 163.0f);

    /* An unsupported op never reaches the backend. */
    t[2].op = GGML_OP_COUNT + 5;
    apir_encoder_init(&e, g, 1 << 16);
    apir_encode_u32(&e, 1);
    apir_encode_u64(&e, 13);
    apir_encode_tensor_list(&e, 3, t);
    CHECK(call_BACKEND_GRAPH_COMPUTE(2, 20, apir_encoder_used(&e), &status) == APIR_HANDLER_BAD_REQUEST);
    int32_t count = 0;
    CHECK(call_DEVICE_GET_COUNT(2, &count) == APIR_HANDLER_OK && reply_ok && count >= 1);
    /* apir 0.2 commands are accepted (the handshake never reaches us). */
    CHECK(call_DEVICE_SELECT(2, 0) == APIR_HANDLER_OK);
    CHECK(call_DEVICE_SELECT(2, 99) == APIR_HANDLER_BAD_REQUEST);
}

/* Without get_shmem_size the bound is the host mapping that holds the blob. */
static void test_bounds_without_size_callback(void)
{
    CHECK(OK(init_cpu(4, false)));
    uint8_t *b = add_blob(4, 40, 16384);
    CHECK(b != NULL);
    uint64_t h = alloc_buffer(4, 1 << 20);
    struct apir_tensor_rec t = f32_rec(1, h, 0, 1 << 18);
    CHECK(call_BUFFER_SET_TENSOR(4, h, &t, 40, 0, 16384) == APIR_HANDLER_OK);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 16384) == APIR_HANDLER_OK);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 32768) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BUFFER_GET_TENSOR_AT(4, h, &t, 40, 16000, 0, 1024) == APIR_HANDLER_BAD_REQUEST);
    /* Memory that is not a shared mapping (heap) is never a blob. */
    static uint8_t heap_blob[16384] __attribute__((aligned(4096)));
    hv[4].blobs[1] = (struct blob){ 41, heap_blob, sizeof(heap_blob) };
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 41, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    /* A blob that moved (res_id reused): the new mapping's bound applies. */
    uint8_t *moved = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct blob old = hv[4].blobs[0];
    hv[4].blobs[0].ptr = moved;
    hv[4].blobs[0].size = 8192;
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 16384) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 8192) == APIR_HANDLER_OK);
    hv[4].blobs[0] = old;
    munmap(moved, 8192);
    lib_deinit(4);
}

static void test_unknown_ctx(void)
{
    char *after = (char *)1;
    CHECK(call_raw(777, APIR_CMD_DEVICE_GET_COUNT, "", 0, sizeof(reply_buf), &after) == APIR_HANDLER_FAILED);
    CHECK(after == (char *)reply_buf);
    lib_deinit(777);
    lib_deinit(777);
    CHECK(call_BUFFER_FREE_BUFFER(777, 0x1234) == APIR_HANDLER_FAILED);
}

static void test_deinit_frees(void)
{
    CHECK(OK(init_cpu(5, true)));
    long before = rss_kib();
    uint64_t h = alloc_buffer(5, 256ull << 20), base = 0;
    CHECK(h != 0);
    CHECK(call_BUFFER_CLEAR(5, h, 1) == APIR_HANDLER_OK);  /* touch every page */
    long during = rss_kib();
    CHECK_MSG(during - before > 200 * 1024, "RSS %ld -> %ld KiB", before, during);
    lib_deinit(5);
    long after = rss_kib();
    CHECK_MSG(after - before < 64 * 1024, "RSS %ld -> %ld -> %ld KiB after deinit", before, during, after);
    /* The context and its handles are gone; the ctx_id can start afresh. */
    CHECK(call_BUFFER_GET_BASE(5, h, &base) == APIR_HANDLER_FAILED);
    CHECK(OK(init_cpu(5, true)));
    CHECK(call_BUFFER_GET_BASE(5, h, &base) == APIR_HANDLER_BAD_HANDLE);
    lib_deinit(5);
    lib_deinit(2);
    lib_deinit(3);
}

static const struct test_case cases[] = {
    TEST(test_init_codes),
    TEST(test_isolation),
    TEST(test_concurrent_contexts),
    TEST(test_malformed),
    TEST(test_bounds_without_size_callback),
    TEST(test_unknown_ctx),
    TEST(test_deinit_frees),
};

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: test_virgl_abi LIBAPIR_VIRGL FAKE_BACKEND_LIB GGML_CPU_LIB\n");
        return 2;
    }
    fake_lib = argv[2];
    cpu_lib = argv[3];
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot open %s: %s\n", argv[1], dlerror());
        return 1;
    }
    lib_init = (init_fn)dlsym(lib, "apir_backend_initialize");
    lib_dispatch = (dispatch_fn)dlsym(lib, "apir_backend_dispatcher");
    lib_deinit = (deinit_fn)dlsym(lib, "apir_backend_deinit");
    if (!lib_init || !lib_dispatch || !lib_deinit) {
        fprintf(stderr, "%s lacks the virgl entry points\n", argv[1]);
        return 1;
    }
    int rc = test_run("virgl_abi", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    dlclose(lib);
    return rc;
}
