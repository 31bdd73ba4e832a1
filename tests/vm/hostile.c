/*
 * apir-vm-hostile: a hostile guest program inside the VM.  It opens the real
 * virtio_gpu render node and, through the real driver, sends what a
 * well-behaved guest library never sends: bad ioctl arguments, contexts on
 * odd capsets, blobs of odd sizes, EXECBUFFERs with bad flags, rings, bo
 * handles and lengths, and APIR commands (Venus capset, types offset by 331,
 * as the guests use with VIRGL_ROUTE_VENUS_TO_APIR=1) that are malformed:
 * unknown types, truncated headers, unknown reply resources, FORWARD before
 * LOADLIBRARY, unknown and truncated FORWARDs, garbage payloads, sizes past
 * the blobs, a freed data blob named again, megabytes of garbage.
 * virglrenderer and the host library must answer with errors (or give up on
 * that one context) and keep serving: QEMU, the render server and every
 * other context go on.  The last step checks that a fresh context still
 * works end to end (handshake, load, a forwarded query).
 *
 * Each step prints "ok" or "FAIL" with what it saw; the last line is
 * "hostile: N passed, M failed (K contexts, J commands)"; exit 0 when none
 * failed.  Steps whose outcome the real stack leaves open (a context
 * virglrenderer marks fatal answers nothing more) count as ok with either
 * outcome, and say which one they saw.
 *
 * usage: apir-vm-hostile [RENDER_NODE] [ROUNDS] [BIG_MIB]
 *        (defaults /dev/dri/renderD128, 200 contexts of garbage, a 1 MiB command)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The virtio-gpu uAPI (Linux >= 6.5), written out: the build machine's
 * headers may predate it. */
#define DRM_IOCTL_BASE 'd'
#define DRM_COMMAND_BASE 0x40
#define VIOWR(nr, type) _IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + (nr), type)
struct vg_getparam { uint64_t param, value; };
struct vg_get_caps { uint32_t id, ver; uint64_t addr; uint32_t size, pad; };
struct vg_set_param { uint64_t param, value; };
struct vg_ctx_init { uint32_t n, pad; uint64_t params; };
struct vg_create_blob { uint32_t mem, flags, bo, res; uint64_t size; uint32_t pad, cmd_size; uint64_t cmd, blob_id; };
struct vg_map { uint64_t offset; uint32_t handle, pad; };
struct vg_execbuf {
    uint32_t flags, size;
    uint64_t command, bo_handles;
    uint32_t num_bo;
    int32_t fence_fd;
    uint32_t ring_idx, syncobj_stride, num_in, num_out;
    uint64_t in_syncobjs, out_syncobjs;
};
struct vg_gem_close { uint32_t handle, pad; };
_Static_assert(sizeof(struct vg_execbuf) == 64, "execbuffer layout");
_Static_assert(sizeof(struct vg_create_blob) == 48, "create_blob layout");
#define IO_MAP      VIOWR(0x01, struct vg_map)
#define IO_EXEC     VIOWR(0x02, struct vg_execbuf)
#define IO_GETPARAM VIOWR(0x03, struct vg_getparam)
#define IO_GET_CAPS VIOWR(0x09, struct vg_get_caps)
#define IO_BLOB     VIOWR(0x0a, struct vg_create_blob)
#define IO_CTX_INIT VIOWR(0x0b, struct vg_ctx_init)
#define IO_GEM_CLOSE _IOW(DRM_IOCTL_BASE, 0x09, struct vg_gem_close)

#define CAPSET_VENUS 4u
#define VENUS_OFFSET 331u
enum { T_HANDSHAKE = 0, T_LOADLIBRARY = 1, T_FORWARD = 2 };
#define R_NONE 0u                  /* no reply came */
#define R(v) (1u + (uint32_t)(v))  /* the reply word virglrenderer writes: 1 + code */
#define HANDSHAKE_MAGIC 0xab1e
#define FWD(code) R(4u + (code))   /* FORWARD: APIR_FORWARD_BASE_INDEX (4) + the library's code */

static const char *node = "/dev/dri/renderD128";
static uint32_t big_mib = 1;
static int echo_fd = -1;
/* test_garbage_contexts: 0 mixed, 1 APIR types and the context's reply blob
 * only (the default), 2 random words only (APIR_VM_HOSTILE_ONLY=garbage_typed|garbage_untyped):
 * mode 2 aborts QEMU 10.0.13 under TCG (docs/VM.md), so the full run uses 1 */
static int garbage_mode = 1;
static int passed, failed, contexts, commands;

#include <stdarg.h>
/* One line: "ok  ", "FAIL" or "note" (an outcome reported, not judged: what
 * virglrenderer or the kernel chooses, where either answer is safe). */
static void report(const char *tag, const char *what, const char *fmt, va_list ap)
{
    char buf[256] = "";
    vsnprintf(buf, sizeof(buf), fmt, ap);
    printf("%s %s%s%s\n", tag, what, buf[0] ? ": " : "", buf);
    fflush(stdout);
    /* APIR_VM_ECHO_FD=N: each line on that descriptor too (the VM's console,
     * so that what ran last is known even if the VM dies) */
    if (echo_fd >= 0)
        dprintf(echo_fd, "APIR-VM hostile| %s %s%s%s\n", tag, what, buf[0] ? ": " : "", buf);
}

static void result(bool ok, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(bool ok, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(ok ? "ok  " : "FAIL", what, fmt, ap);
    va_end(ap);
    if (ok)
        passed++;
    else
        failed++;
}

static void note(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report("note", what, fmt, ap);
    va_end(ap);
}

static int fails_with(int rc, int e) { return rc == -1 && errno == e; }
/* cond is evaluated first, then errno read (not both as arguments of one call) */
#define EXPECT(cond, what)              \
    do {                                \
        bool ok_ = (cond);              \
        int e_ = errno;                 \
        result(ok_, what, "errno %d", e_); \
    } while (0)

static int open_node(void)
{
    int fd = open(node, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        printf("cannot open %s: %s\n", node, strerror(errno));
        exit(1);
    }
    return fd;
}

static int ctx_init(int fd, uint32_t capset, uint32_t rings)
{
    struct vg_set_param p[2] = { { 1, capset }, { 2, rings } };
    struct vg_ctx_init ci = { 2, 0, (uint64_t)(uintptr_t)p };
    int r = ioctl(fd, IO_CTX_INIT, &ci);
    if (r == 0)
        contexts++;
    return r;
}

struct blob { uint32_t bo, res; uint8_t *p; uint64_t size; };

static bool new_blob(int fd, uint64_t size, struct blob *b)
{
    struct vg_create_blob cb = { .mem = 2 /* HOST3D */, .flags = 1 /* MAPPABLE */, .size = size };
    if (ioctl(fd, IO_BLOB, &cb) != 0)
        return false;
    struct vg_map m = { .handle = cb.bo };
    if (ioctl(fd, IO_MAP, &m) != 0)
        return false;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)m.offset);
    if (p == MAP_FAILED)
        return false;
    *b = (struct blob){ cb.bo, cb.res, p, size };
    return true;
}

static void free_blob(int fd, struct blob *b)
{
    munmap(b->p, b->size);
    struct vg_gem_close c = { b->bo, 0 };
    ioctl(fd, IO_GEM_CLOSE, &c);
}

static int exec_raw(int fd, const void *cmd, uint32_t len)
{
    struct vg_execbuf eb = { .size = len, .command = (uint64_t)(uintptr_t)cmd, .fence_fd = -1 };
    commands++;
    return ioctl(fd, IO_EXEC, &eb);
}

/* Submits cmd and waits up to ms for the reply word of the blob; returns it
 * (R_NONE: no reply). */
static uint32_t submit(int fd, struct blob *reply, const void *cmd, uint32_t len, int ms)
{
    _Atomic uint32_t *w = (_Atomic uint32_t *)(void *)reply->p;
    atomic_store(w, 0);
    if (exec_raw(fd, cmd, len) != 0)
        return R_NONE;
    for (int i = 0; i < ms; i++) {
        uint32_t v = atomic_load(w);
        if (v)
            return v;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return atomic_load(w);
}

/* A Venus-capset context with a 16 KiB reply blob. */
static int session(struct blob *reply)
{
    int fd = open_node();
    if (ctx_init(fd, CAPSET_VENUS, 1) != 0 || !new_blob(fd, 16384, reply)) {
        printf("cannot make a Venus context with a reply blob: %s\n", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static uint32_t hdr(uint32_t *c, uint32_t type, uint32_t flags, uint32_t res)
{
    c[0] = type + VENUS_OFFSET;
    c[1] = flags;
    c[2] = res;
    return 12;
}

/* Handshake + load on a fresh context: 1 if both answered as expected. */
static bool handshake_and_load(int fd, struct blob *rb)
{
    uint32_t c[8];
    hdr(c, T_HANDSHAKE, 0, rb->res);
    c[3] = 0;
    c[4] = 1;
    if (submit(fd, rb, c, 20, 5000) != R(HANDSHAKE_MAGIC))
        return false;
    hdr(c, T_LOADLIBRARY, 0, rb->res);
    return submit(fd, rb, c, 12, 60000) == R(0);
}

static void test_ioctls(void)
{
    int fd = open_node();
    struct vg_getparam gp = { 99, 0 };
    EXPECT(fails_with(ioctl(fd, IO_GETPARAM, &gp), EINVAL), "GETPARAM unknown param 99");
    uint64_t v = 0;
    gp = (struct vg_getparam){ 7 /* SUPPORTED_CAPSET_IDs */, (uint64_t)(uintptr_t)&v };
    bool got = ioctl(fd, IO_GETPARAM, &gp) == 0;
    result(got, "GETPARAM capset mask", "0x%llx", (unsigned long long)v);
    gp = (struct vg_getparam){ 7, 16 };
    EXPECT(fails_with(ioctl(fd, IO_GETPARAM, &gp), EFAULT), "GETPARAM value pointer 16");
    uint8_t caps[64];
    struct vg_get_caps gc = { 77, 0, (uint64_t)(uintptr_t)caps, sizeof(caps), 0 };
    EXPECT(ioctl(fd, IO_GET_CAPS, &gc) == -1, "GET_CAPS capset 77");
    gc = (struct vg_get_caps){ CAPSET_VENUS, 0, 8, sizeof(caps), 0 };
    EXPECT(ioctl(fd, IO_GET_CAPS, &gc) == -1, "GET_CAPS Venus to address 8");

    /* Contexts: unknown capset, too many rings, a parameter twice, bad pointer. */
    struct vg_set_param p[2] = { { 1, 77 }, { 2, 1 } };
    struct vg_ctx_init ci = { 2, 0, (uint64_t)(uintptr_t)p };
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT capset 77");
    p[0].value = 10;
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT capset 10 (not offered by QEMU 10)");
    p[0].value = CAPSET_VENUS;
    p[1].value = 1000;
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT 1000 rings");
    struct vg_set_param twice[2] = { { 1, CAPSET_VENUS }, { 1, CAPSET_VENUS } };
    ci = (struct vg_ctx_init){ 2, 0, (uint64_t)(uintptr_t)twice };
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT capset given twice");
    ci = (struct vg_ctx_init){ 1, 0, 24 };
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT parameters at address 24");
    ci = (struct vg_ctx_init){ 100000, 0, (uint64_t)(uintptr_t)p };
    EXPECT(ioctl(fd, IO_CTX_INIT, &ci) == -1, "CONTEXT_INIT 100000 parameters");
    /* Linux 6.12 keeps what a refused CONTEXT_INIT parsed before its bad
     * parameter (the capset of the 1000-ring attempt): a good one on the same
     * file may then be refused too.  Reported, not judged; a fresh file. */
    int r0 = ctx_init(fd, CAPSET_VENUS, 1);
    int e0 = r0 ? errno : 0;
    note("CONTEXT_INIT Venus on the same file after the refusals", "%s (errno %d)",
           r0 == 0 ? "accepted" : "refused", e0);
    close(fd);
    fd = open_node();
    EXPECT(ctx_init(fd, CAPSET_VENUS, 1) == 0, "CONTEXT_INIT Venus on a fresh file");
    EXPECT(fails_with(ctx_init(fd, CAPSET_VENUS, 1), EEXIST), "CONTEXT_INIT twice");

    /* Blobs: zero, unaligned, huge, unknown memory type, guest memory, bad flags. */
    struct vg_create_blob cb = { .mem = 2, .flags = 1, .size = 0 };
    EXPECT(ioctl(fd, IO_BLOB, &cb) == -1, "CREATE_BLOB size 0");
    cb = (struct vg_create_blob){ .mem = 2, .flags = 1, .size = 100 };
    int r = ioctl(fd, IO_BLOB, &cb);
    int e = r ? errno : 0;
    note("CREATE_BLOB size 100 (unaligned)", "%s (errno %d)", r == 0 ? "accepted" : "refused", e);
    cb = (struct vg_create_blob){ .mem = 2, .flags = 1, .size = 1ull << 40 };
    EXPECT(ioctl(fd, IO_BLOB, &cb) == -1, "CREATE_BLOB 1 TiB");
    cb = (struct vg_create_blob){ .mem = 2, .flags = 1, .size = 2ull << 30 };
    r = ioctl(fd, IO_BLOB, &cb);
    e = r ? errno : 0;
    struct vg_map m = { .handle = cb.bo };
    int mr = r == 0 ? ioctl(fd, IO_MAP, &m) : -1;
    note("CREATE_BLOB 2 GiB (the host window is 1 GiB)", "create %s (errno %d), map %s",
           r == 0 ? "accepted" : "refused", e, mr == 0 ? "accepted" : "refused");
    cb = (struct vg_create_blob){ .mem = 9, .flags = 1, .size = 16384 };
    EXPECT(ioctl(fd, IO_BLOB, &cb) == -1, "CREATE_BLOB memory type 9");
    cb = (struct vg_create_blob){ .mem = 2, .flags = 0xf0, .size = 16384 };
    EXPECT(ioctl(fd, IO_BLOB, &cb) == -1, "CREATE_BLOB flags 0xf0");
    m = (struct vg_map){ .handle = 123456 };
    EXPECT(ioctl(fd, IO_MAP, &m) == -1, "MAP unknown handle");
    struct vg_gem_close gcl = { 424242, 0 };
    EXPECT(ioctl(fd, IO_GEM_CLOSE, &gcl) == -1, "GEM_CLOSE unknown handle");

    /* EXECBUFFER: bad flags, ring, pointer, bo handles. */
    uint32_t cmd[4] = { 0 };
    struct vg_execbuf eb = { .flags = 0x80, .size = 12, .command = (uint64_t)(uintptr_t)cmd, .fence_fd = -1 };
    EXPECT(ioctl(fd, IO_EXEC, &eb) == -1, "EXECBUFFER flags 0x80");
    eb = (struct vg_execbuf){ .flags = 4, .ring_idx = 7, .size = 12, .command = (uint64_t)(uintptr_t)cmd,
                              .fence_fd = -1 };
    EXPECT(ioctl(fd, IO_EXEC, &eb) == -1, "EXECBUFFER ring 7 of 1");
    eb = (struct vg_execbuf){ .size = 64, .command = 64, .fence_fd = -1 };
    EXPECT(ioctl(fd, IO_EXEC, &eb) == -1, "EXECBUFFER command at address 64");
    uint32_t bos[2] = { 98765, 98766 };
    eb = (struct vg_execbuf){ .size = 12, .command = (uint64_t)(uintptr_t)cmd, .bo_handles = (uint64_t)(uintptr_t)bos,
                              .num_bo = 2, .fence_fd = -1 };
    EXPECT(ioctl(fd, IO_EXEC, &eb) == -1, "EXECBUFFER unknown bo handles");
    eb = (struct vg_execbuf){ .flags = 1 /* FENCE_FD_IN */, .size = 12, .command = (uint64_t)(uintptr_t)cmd,
                              .fence_fd = 999 };
    EXPECT(ioctl(fd, IO_EXEC, &eb) == -1, "EXECBUFFER in-fence fd 999");
    close(fd);
}

static void test_commands(void)
{
    struct blob rb, db;
    int fd = session(&rb);
    if (fd < 0) {
        result(false, "a Venus context with a reply blob", "%s", strerror(errno));
        return;
    }
    bool made = new_blob(fd, 1 << 20, &db);
    result(made, "a 1 MiB data blob", "res %u", made ? db.res : 0);
    uint32_t c[64];
    memset(c, 0, sizeof(c));
    hdr(c, T_HANDSHAKE, 0, rb.res);
    uint32_t w = submit(fd, &rb, c, 12, 5000);   /* no version words: decoded as failures, still answered */
    result(w == R(HANDSHAKE_MAGIC), "HANDSHAKE without versions", "reply 0x%x", w);
    hdr(c, T_FORWARD, 0, rb.res);
    w = submit(fd, &rb, c, 12, 5000);
    result(w == R(1), "FORWARD before LOADLIBRARY (NO_DISPATCH_FN)", "reply 0x%x", w);
    hdr(c, T_LOADLIBRARY, 0, rb.res);
    w = submit(fd, &rb, c, 12, 60000);
    result(w == R(0), "LOADLIBRARY", "reply 0x%x", w);
    w = submit(fd, &rb, c, 12, 5000);
    result(w == R(2), "LOADLIBRARY again (ALREADY_LOADED)", "reply 0x%x", w);
    hdr(c, T_FORWARD, 9999, rb.res);
    w = submit(fd, &rb, c, 12, 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD command 9999", "reply 0x%x", w);
    hdr(c, T_FORWARD, 0x80000000u, rb.res);
    w = submit(fd, &rb, c, 12, 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD command 0x80000000", "reply 0x%x", w);
    hdr(c, T_FORWARD, 17 /* BUFFER_SET_TENSOR */, rb.res);
    w = submit(fd, &rb, c, 20, 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD SET_TENSOR truncated", "reply 0x%x", w);
    memset(c + 3, 0xff, sizeof(c) - 12);
    w = submit(fd, &rb, c, sizeof(c), 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD SET_TENSOR of 0xff bytes", "reply 0x%x", w);
    /* GRAPH_COMPUTE: the graph in the reply blob, 1 MiB long (the blob is 16 KiB). */
    hdr(c, T_FORWARD, 22, rb.res);
    c[3] = rb.res; c[4] = 1u << 20; c[5] = 0;
    w = submit(fd, &rb, c, 24, 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD GRAPH_COMPUTE past the end of a blob", "reply 0x%x", w);
    /* GRAPH_COMPUTE of garbage in the data blob. */
    for (size_t i = 0; i < db.size; i++)
        db.p[i] = (uint8_t)(i * 2654435761u >> 13);
    c[3] = db.res; c[4] = (uint32_t)db.size; c[5] = 0;
    w = submit(fd, &rb, c, 24, 10000);
    result(w != R_NONE && w != FWD(0), "FORWARD GRAPH_COMPUTE of 1 MiB of garbage", "reply 0x%x", w);
    /* The same with a plausible head: 3 nodes, ids past every tensor. */
    uint32_t *g = (uint32_t *)(void *)db.p;
    g[0] = 3; g[1] = 0xffffffffu; g[2] = 7; g[3] = 0; g[4] = 0x7fffffff;
    w = submit(fd, &rb, c, 24, 10000);
    result(w != R_NONE && w != FWD(0), "FORWARD GRAPH_COMPUTE with node ids past the tensors", "reply 0x%x", w);
    /* BUFFER_FROM_PTR (not offered over virgl), on the reply blob. */
    hdr(c, T_FORWARD, 9, rb.res);
    c[3] = rb.res; c[4] = 4096; c[5] = 0; c[6] = 4096; c[7] = 0;
    w = submit(fd, &rb, c, 32, 5000);
    result(w != R_NONE && w != FWD(0), "FORWARD BUFFER_FROM_PTR", "reply 0x%x", w);
    /* ALLOC_BUFFER of 2^62 bytes on buffer type handle 1, and on a made-up one. */
    hdr(c, T_FORWARD, 14, rb.res);
    uint64_t big = 1ull << 62, h = 1;
    memcpy(c + 3, &h, 8);
    memcpy(c + 5, &big, 8);
    w = submit(fd, &rb, c, 28, 10000);
    result(w != R_NONE && w != FWD(0), "FORWARD ALLOC_BUFFER 2^62 bytes", "reply 0x%x", w);
    /* Still a working context: DEVICE_GET_COUNT (0). */
    hdr(c, T_FORWARD, 0, rb.res);
    w = submit(fd, &rb, c, 12, 5000);
    result(w == FWD(0), "the same context still answers DEVICE_GET_COUNT", "reply 0x%x", w);
    /* A freed data blob named again: virglrenderer finds no resource and
     * marks the context fatal; nothing else may happen. */
    uint32_t gone = db.res;
    free_blob(fd, &db);
    hdr(c, T_FORWARD, 22, rb.res);
    c[3] = gone; c[4] = 4096; c[5] = 0;
    w = submit(fd, &rb, c, 24, 3000);
    result(w != FWD(0), "FORWARD GRAPH_COMPUTE on a freed blob", "reply 0x%x (%s)", w,
           w == R_NONE ? "no reply: context fatal" : "refused");
    free_blob(fd, &rb);
    close(fd);
}

/* Every command index 0..40 with random payloads of random lengths, on a
 * context of its own: a payload that names an unknown resource makes
 * virglrenderer mark the context fatal (its rule: get_shmem_ptr on an unknown
 * res_id), after which nothing is answered; the step says where. */
static void test_random_forwards(void)
{
    struct blob rb;
    int fd = session(&rb);
    if (fd < 0 || !handshake_and_load(fd, &rb)) {
        result(false, "random FORWARDs: a loaded context", "%s", "handshake or load failed");
        if (fd >= 0)
            close(fd);
        return;
    }
    unsigned seed = 12345;
    int answered = 0, sent = 0, refused = 0, succeeded = 0;
    uint32_t fatal_at = 0xffffffffu;
    uint8_t *junk = malloc(8192);
    for (int round = 0; round < 3 && fatal_at == 0xffffffffu; round++) {
        for (uint32_t idx = 0; idx <= 40; idx++) {
            for (int i = 0; i < 8192; i++)
                junk[i] = (uint8_t)(rand_r(&seed) >> 7);
            uint32_t len = 12 + 4 * (uint32_t)(rand_r(&seed) % 512);
            hdr((uint32_t *)(void *)junk, T_FORWARD, idx, rb.res);
            sent++;
            uint32_t w = submit(fd, &rb, junk, len, 3000);
            if (w == R_NONE) {
                fatal_at = idx;
                break;
            }
            answered++;
            if (w == FWD(0))
                succeeded++;
            else
                refused++;
        }
    }
    free(junk);
    if (fatal_at == 0xffffffffu)
        note("FORWARD commands 0..40 x3 with random payloads", "%d/%d answered (%d refused, %d ran)", answered,
               sent, refused, succeeded);
    else
        note("FORWARD commands 0..40 x3 with random payloads",
               "%d answered (%d refused, %d ran), then command %u left the context fatal", answered, refused, succeeded,
               fatal_at);
    free_blob(fd, &rb);
    close(fd);
}

/* Commands that leave their context fatal in virglrenderer: one context each. */
static void test_fatal_contexts(void)
{
    struct blob rb;
    uint32_t c[16] = { 0 };
    static const struct { const char *what; uint32_t type, len, res_delta; } cases[] = {
        { "unknown command type 77+331", 77 + VENUS_OFFSET, 12, 0 },
        { "unknown command type 0xffffffff", 0xffffffffu, 12, 0 },
        { "command of 4 bytes (type only)", T_HANDSHAKE + VENUS_OFFSET, 4, 0 },
        { "command of 8 bytes (no reply resource)", T_HANDSHAKE + VENUS_OFFSET, 8, 0 },
        { "HANDSHAKE naming reply resource +1000", T_HANDSHAKE + VENUS_OFFSET, 20, 1000 },
        { "HANDSHAKE naming reply resource 0", T_HANDSHAKE + VENUS_OFFSET, 20, 0xffffffffu },
        { "type 0 without the Venus offset", 0, 20, 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = session(&rb);
        if (fd < 0) {
            result(false, cases[i].what, "no context");
            continue;
        }
        c[0] = cases[i].type;
        c[1] = 0;
        c[2] = cases[i].res_delta == 0xffffffffu ? 0 : rb.res + cases[i].res_delta;
        uint32_t w = submit(fd, &rb, c, cases[i].len, 2000);
        /* Afterwards, a good HANDSHAKE on the same context: answered unless fatal. */
        hdr(c, T_HANDSHAKE, 0, rb.res);
        c[3] = 0; c[4] = 1;
        uint32_t w2 = submit(fd, &rb, c, 20, 2000);
        note(cases[i].what, "reply 0x%x, then a good HANDSHAKE: %s", w,
               w2 == R(HANDSHAKE_MAGIC) ? "answered" : "no answer (context fatal)");
        free_blob(fd, &rb);
        close(fd);
    }
    /* Odd lengths and sizes straight to EXECBUFFER. */
    int fd = session(&rb);
    if (fd < 0)
        return;
    static const uint32_t lens[] = { 0, 1, 3, 13, 4096 + 2 };
    uint8_t *big = calloc(1, (size_t)big_mib << 20);
    if (!big)
        return;
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        hdr((uint32_t *)(void *)big, T_HANDSHAKE, 0, rb.res);
        int r = exec_raw(fd, big, lens[i]);
        int e = r ? errno : 0;
        note("EXECBUFFER of odd length", "%u bytes: %s (errno %d)", lens[i], r == 0 ? "accepted" : "refused", e);
    }
    /* big_mib MiB of FORWARD garbage (default 1).  16 MiB wedges the VM's
     * virtio-gpu: the kernel queues one descriptor per page, QEMU stops the
     * device ("virtio: too many write descriptors in indirect table") and
     * every context of the guest waits forever (docs/VM.md). */
    uint32_t blen = big_mib << 20;
    for (size_t i = 0; i < blen; i++)
        big[i] = (uint8_t)(i * 40503u >> 9);
    hdr((uint32_t *)(void *)big, T_FORWARD, 22, rb.res);
    int r = exec_raw(fd, big, blen);
    int e = r ? errno : 0;
    uint32_t hc[8];
    hdr(hc, T_HANDSHAKE, 0, rb.res);
    hc[3] = 0; hc[4] = 1;
    uint32_t w = submit(fd, &rb, hc, 20, 3000);
    note("EXECBUFFER of FORWARD garbage", "%u MiB: %s (errno %d); then a HANDSHAKE: %s", big_mib,
           r == 0 ? "accepted" : "refused", e, w == R(HANDSHAKE_MAGIC) ? "answered" : "no answer");
    free(big);
    free_blob(fd, &rb);
    close(fd);
    /* A context closed with a command in flight, and a program that leaves
     * without closing anything is the kill_midgraph check's part. */
    fd = session(&rb);
    if (fd >= 0) {
        if (handshake_and_load(fd, &rb)) {
            hdr(c, T_FORWARD, 0, rb.res);
            exec_raw(fd, c, 12);
        }
        free_blob(fd, &rb);
        close(fd);
        note("a context closed with a command in flight", "%s", "closed");
    }
}

/* Many short-lived contexts, each with its reply blob mapped: with
 * commands of random garbage (test_garbage_contexts), or none at all
 * (blob churn: a well-formed, if fast, guest). */
static void churn_contexts(int rounds, bool with_commands)
{
    unsigned seed = 777;
    int made = 0;
    uint32_t junk[256];
    for (int r = 0; r < rounds; r++) {
        struct blob rb;
        int fd = session(&rb);
        if (fd < 0)
            continue;
        made++;
        if (echo_fd >= 0 && r % 25 == 0)
            dprintf(echo_fd, "APIR-VM hostile| %s context %d\n", with_commands ? "garbage" : "blob churn", r);
        for (int k = 0; with_commands && k < 4; k++) {
            for (int i = 0; i < 256; i++)
                junk[i] = (uint32_t)rand_r(&seed) * 2654435761u;
            if (garbage_mode == 1 || (garbage_mode == 0 && rand_r(&seed) % 2))
                junk[0] = VENUS_OFFSET + (uint32_t)(rand_r(&seed) % 4);
            if (garbage_mode == 1 || (garbage_mode == 0 && rand_r(&seed) % 2))
                junk[2] = rb.res;
            exec_raw(fd, junk, 4 * (uint32_t)(rand_r(&seed) % 257));
        }
        free_blob(fd, &rb);
        close(fd);
    }
    result(made == rounds,
           with_commands ? "short-lived contexts of random commands" : "contexts with a mapped blob made and dropped",
           "%d/%d contexts made", made, rounds);
}

static void test_garbage_contexts(int rounds) { churn_contexts(rounds, true); }

int main(int argc, char **argv)
{
    if (argc > 1)
        node = argv[1];
    int rounds = argc > 2 ? atoi(argv[2]) : 200;
    if (argc > 3 && atoi(argv[3]) >= 1 && atoi(argv[3]) <= 64)
        big_mib = (uint32_t)atoi(argv[3]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("APIR_VM_ECHO_FD"))
        echo_fd = atoi(getenv("APIR_VM_ECHO_FD"));
    /* APIR_VM_HOSTILE_ONLY=blobchurn: only contexts made and dropped at once,
     * each with a mapped 16 KiB blob and no command at all (a well-formed,
     * if fast, guest): tells a QEMU fault from blob churn apart from one
     * caused by what the commands say. */
    const char *only = getenv("APIR_VM_HOSTILE_ONLY");
    if (only && strcmp(only, "blobchurn") == 0) {
        churn_contexts(rounds, false);
        printf("hostile: %d passed, %d failed (%d contexts, %d commands)\n", passed, failed, contexts, commands);
        return failed ? 1 : 0;
    }
    if (only && (strcmp(only, "garbage_typed") == 0 || strcmp(only, "garbage_untyped") == 0)) {
        garbage_mode = strcmp(only, "garbage_typed") == 0 ? 1 : 2;
        test_garbage_contexts(rounds);
        printf("hostile: %d passed, %d failed (%d contexts, %d commands)\n", passed, failed, contexts, commands);
        return failed ? 1 : 0;
    }
    test_ioctls();
    test_commands();
    test_random_forwards();
    test_fatal_contexts();
    test_garbage_contexts(rounds);
    /* The end: a fresh context works end to end. */
    struct blob rb;
    int fd = session(&rb);
    bool ok = fd >= 0 && handshake_and_load(fd, &rb);
    uint32_t w = 0;
    if (ok) {
        uint32_t c[4];
        hdr(c, T_FORWARD, 0, rb.res);
        w = submit(fd, &rb, c, 12, 5000);
    }
    result(ok && w == FWD(0), "a fresh context afterwards: handshake, load, DEVICE_GET_COUNT", "reply 0x%x", w);
    if (fd >= 0) {
        free_blob(fd, &rb);
        close(fd);
    }
    printf("hostile: %d passed, %d failed (%d contexts, %d commands)\n", passed, failed, contexts, commands);
    return failed ? 1 : 0;
}
