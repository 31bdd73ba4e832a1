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
 *   - each context is served by a worker process of its own (the
 *     hypervisor's memory does not grow with a guest's buffers); a worker
 *     that dies fails its context's calls, the others go on; deinit ends
 *     the worker;
 *   - blobs reach a worker only as their memfd: anonymous shared memory and
 *     heap are refused; a res_id reused at the same address with another
 *     file is followed to the new file.
 *
 * usage: test_virgl_abi LIBAPIR_VIRGL FAKE_BACKEND_LIB GGML_CPU_LIB
 */
#include "apir_proto.h"
#include "ggml.h"
#include "test_records.h"
#include "test_util.h"
#include "virgl_lib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


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
    int fd;                  /* the memfd behind it, kept open as virglrenderer does */
};
static struct {
    const char *path, *reg, *device, *size_ext, *worker;
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
    if (strcmp(key, "apir.worker.path") == 0)
        return hv[ctx].worker;
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

/* A memfd of size bytes mapped at fixed (NULL: anywhere), as virglrenderer
 * makes a blob (src/apir/apir-resource.c: a memfd that allows sealing,
 * mapped whole and kept open). */
static uint8_t *memfd_blob(size_t size, void *fixed, int *fd)
{
    *fd = memfd_create("apir-shmem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (*fd >= 0 && ftruncate(*fd, (off_t)size) == 0)
        p = mmap(fixed, size, PROT_READ | PROT_WRITE, MAP_SHARED | (fixed ? MAP_FIXED : 0), *fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

static uint8_t *add_blob(uint32_t ctx, uint32_t res, size_t size)
{
    for (int i = 0; i < MAX_BLOBS; i++) {
        if (!hv[ctx].blobs[i].ptr) {
            int fd;
            uint8_t *p = memfd_blob(size, NULL, &fd);
            if (p)
                hv[ctx].blobs[i] = (struct blob){ res, p, size, fd };
            return p;
        }
    }
    return NULL;
}

/* The worker processes of this process (its children), at most max. */
static int children(pid_t *out, int max)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[300];
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
        int pid;
        while (f && n < max && fscanf(f, "%d", &pid) == 1)
            out[n++] = pid;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* The worker that initialize(ctx) starts: the child that was not there. */
static pid_t worker_of(uint32_t ctx, uint32_t *code)
{
    pid_t before[64], after[64];
    const int nb = children(before, 64);
    *code = lib_init(ctx, &cbs);
    const int na = children(after, 64);
    for (int i = 0; i < na; i++) {
        bool old = false;
        for (int j = 0; j < nb; j++)
            old = old || after[i] == before[j];
        if (!old)
            return after[i];
    }
    return 0;
}

static long rss_kib_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ---- commands ---------------------------------------------------------------- */

static uint8_t reply_buf[16384], request_buf[8192];
/* Whether the last typed call's reply decoded whole (its items were there). */
static bool reply_ok;

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
    /* No worker program: refused, never served in this process. */
    hv[1].worker = "/nonexistent/apir-host";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED);
    hv[1].worker = "relative/apir-host";
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED);
    hv[1].worker = "/bin/false";  /* starts, but is no worker */
    CHECK(lib_init(1, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED);
    hv[1].worker = NULL;

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
    hv[4].blobs[1] = (struct blob){ 41, heap_blob, sizeof(heap_blob), -1 };
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 41, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    /* Anonymous shared memory has no descriptor to give: never a blob. */
    uint8_t *anon = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    hv[4].blobs[1] = (struct blob){ 41, anon, 16384, -1 };
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 41, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    hv[4].blobs[1] = (struct blob){ 0 };
    munmap(anon, 16384);
    /* A memfd whose descriptor was closed once mapped - what virglrenderer's
     * render worker does after sending a blob's memfd to the hypervisor -
     * is found through /proc/self/map_files where the kernel lets this
     * process open it (CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), refused
     * otherwise; the data reaches it either way it is served. */
    int closed_fd;
    uint8_t *closed = memfd_blob(16384, NULL, &closed_fd);
    CHECK(closed != NULL);
    char mf[80];
    snprintf(mf, sizeof(mf), "/proc/self/map_files/%lx-%lx", (unsigned long)(uintptr_t)closed,
             (unsigned long)(uintptr_t)closed + 16384);
    const int probe = open(mf, O_RDWR | O_CLOEXEC);
    const bool map_files = probe >= 0;
    if (probe >= 0)
        close(probe);
    close(closed_fd);
    hv[4].blobs[1] = (struct blob){ 42, closed, 16384, -1 };
    for (int i = 0; i < 16384; i++)
        closed[i] = (uint8_t)(i * 3);
    CHECK(call_BUFFER_SET_TENSOR(4, h, &t, 42, 0, 16384) == (map_files ? APIR_HANDLER_OK : APIR_HANDLER_BAD_REQUEST));
    memset(closed, 0, 16384);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 42, 0, 16384) == (map_files ? APIR_HANDLER_OK : APIR_HANDLER_BAD_REQUEST));
    CHECK(!map_files || (closed[7] == 21 && closed[16383] == (uint8_t)(16383 * 3)));
    printf("  a blob whose descriptor is closed: %s\n", map_files ? "served through /proc/self/map_files" : "refused");
    hv[4].blobs[1] = (struct blob){ 0 };
    munmap(closed, 16384);
    /* A blob that moved (res_id reused): the new mapping's bound applies. */
    int moved_fd;
    uint8_t *moved = memfd_blob(8192, NULL, &moved_fd);
    struct blob old = hv[4].blobs[0];
    hv[4].blobs[0] = (struct blob){ 40, moved, 8192, moved_fd };
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 16384) == APIR_HANDLER_BAD_REQUEST);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 8192) == APIR_HANDLER_OK);
    /* The res_id reused at the very same address, another file behind it:
     * the data goes to the new file, not to the worker's old copy. */
    for (int i = 0; i < 8192; i++)
        moved[i] = (uint8_t)(i * 7);
    CHECK(call_BUFFER_SET_TENSOR(4, h, &t, 40, 0, 8192) == APIR_HANDLER_OK);
    int again_fd;
    CHECK(memfd_blob(8192, moved, &again_fd) == moved);
    CHECK(moved[5] == 0);
    CHECK(call_BUFFER_GET_TENSOR(4, h, &t, 40, 0, 8192) == APIR_HANDLER_OK);
    CHECK(moved[5] == 35 && moved[8191] == (uint8_t)(8191 * 7));
    close(moved_fd);
    close(again_fd);
    munmap(moved, 8192);
    hv[4].blobs[0] = old;
    lib_deinit(4);
}

/* Merge request 1590's render worker keeps the number of a blob's memfd
 * after closing it, and closes that number when the blob is destroyed
 * (scripts/patches/ fixes that tree).  A context started in between gets
 * the lowest free numbers for its worker link; the stray close must not
 * take the link: the library keeps its descriptors above the low numbers. */
static void test_stray_close(void)
{
    int blob_fd;
    uint8_t *blob = memfd_blob(16384, NULL, &blob_fd);
    CHECK(blob != NULL);
    close(blob_fd);  /* sent to the hypervisor and closed; the number kept */
    CHECK(OK(init_cpu(8, true)));
    int32_t count = 0;
    CHECK(call_DEVICE_GET_COUNT(8, &count) == APIR_HANDLER_OK && count >= 1);
    close(blob_fd);  /* the blob destroyed: its old number closed again */
    CHECK(call_DEVICE_GET_COUNT(8, &count) == APIR_HANDLER_OK && reply_ok && count >= 1);
    uint8_t *b = add_blob(8, 80, 4096);
    const uint64_t h = alloc_buffer(8, 4096);
    CHECK(b && h);
    struct apir_tensor_rec t = f32_rec(1, h, 0, 1024);
    memset(b, 0x5a, 4096);
    CHECK(call_BUFFER_SET_TENSOR(8, h, &t, 80, 0, 4096) == APIR_HANDLER_OK);
    memset(b, 0, 4096);
    CHECK(call_BUFFER_GET_TENSOR(8, h, &t, 80, 0, 4096) == APIR_HANDLER_OK && b[0] == 0x5a && b[4095] == 0x5a);
    lib_deinit(8);
    munmap(blob, 16384);
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
    hv[5].path = cpu_lib;
    hv[5].size_ext = "1";
    uint32_t code;
    const pid_t worker = worker_of(5, &code);
    CHECK(OK(code) && worker > 0);
    long before = rss_kib_of(getpid()), worker_before = rss_kib_of(worker);
    uint64_t h = alloc_buffer(5, 256ull << 20), base = 0;
    CHECK(h != 0);
    CHECK(call_BUFFER_CLEAR(5, h, 1) == APIR_HANDLER_OK);  /* touch every page */
    /* The guest's buffers are the worker's memory, not the hypervisor's. */
    long during = rss_kib_of(getpid()), worker_during = rss_kib_of(worker);
    CHECK_MSG(worker_during - worker_before > 200 * 1024, "worker RSS %ld -> %ld KiB", worker_before, worker_during);
    CHECK_MSG(during - before < 16 * 1024, "hypervisor RSS %ld -> %ld KiB", before, during);
    lib_deinit(5);
    /* Its worker has ended (and was reaped). */
    CHECK(kill(worker, 0) != 0);
    /* The context and its handles are gone; the ctx_id can start afresh. */
    CHECK(call_BUFFER_GET_BASE(5, h, &base) == APIR_HANDLER_FAILED);
    CHECK(OK(init_cpu(5, true)));
    CHECK(call_BUFFER_GET_BASE(5, h, &base) == APIR_HANDLER_BAD_HANDLE);
    lib_deinit(5);
    lib_deinit(2);
    lib_deinit(3);
}

/* A worker that dies takes its context's calls with it; the others go on,
 * and the ctx_id can start afresh. */
static void test_worker_dies(void)
{
    hv[6].path = cpu_lib;
    hv[6].size_ext = "1";
    uint32_t code;
    const pid_t worker = worker_of(6, &code);
    CHECK(OK(code) && worker > 0);
    CHECK(OK(init_cpu(7, true)));
    int32_t count = 0;
    CHECK(call_DEVICE_GET_COUNT(6, &count) == APIR_HANDLER_OK);
    CHECK(kill(worker, SIGKILL) == 0);
    CHECK(call_DEVICE_GET_COUNT(6, &count) == APIR_HANDLER_FAILED);
    CHECK(call_DEVICE_GET_COUNT(6, &count) == APIR_HANDLER_FAILED);
    CHECK(call_DEVICE_GET_COUNT(7, &count) == APIR_HANDLER_OK && count >= 1);
    lib_deinit(6);
    CHECK(OK(init_cpu(6, true)));
    CHECK(call_DEVICE_GET_COUNT(6, &count) == APIR_HANDLER_OK && count >= 1);
    lib_deinit(6);
    lib_deinit(7);
}

static const struct test_case cases[] = {
    TEST(test_init_codes),
    TEST(test_worker_dies),
    TEST(test_isolation),
    TEST(test_concurrent_contexts),
    TEST(test_malformed),
    TEST(test_bounds_without_size_callback),
    TEST(test_stray_close),
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
