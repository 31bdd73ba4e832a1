/*
 * apir-virgl-rig: the simulated hypervisor.  Plays the host side of
 * virtio-gpu and virglrenderer's API-remoting component for guest processes
 * that run with libapir-virgl-shim.so (see rig_proto.h for the picture).
 *
 *   apir-virgl-rig --listen SOCK --host-lib LIB [--ggml-lib PATH] [--ggml-reg SYM]
 *                  [--threads N] [--host-minor N] [--no-shmem-size] [--max-blob-mb N] [-v]
 *
 * What virglrenderer does, and so what the rig does, per context:
 *  - blob resources: host memory (a sealed memfd per blob, mapped here), named
 *    by res_id, attached to the context that created it;
 *  - HANDSHAKE: answered here with our own version (--host-minor, default 2,
 *    the constant the pinned reference and virglrenderer share); the host
 *    library never sees it;
 *  - LOADLIBRARY: dlopen the host library (--host-lib, or the environment
 *    variable virglrenderer reads, VIRGL_APIR_BACKEND_LIBRARY), look up
 *    apir_backend_initialize/_dispatcher, call initialize(ctx_id, cbs); a
 *    non-zero return r other than 6 is sent as 6 + r, as virglrenderer does;
 *    the dispatcher stays installed even then, as in virglrenderer;
 *  - FORWARD: dispatcher(ctx_id, cbs, cmd_flags, request after the header,
 *    reply blob from byte 4), then BASE + its result;
 *  - the reply word (byte 0 of the reply blob) = return value + 1, stored
 *    with release ordering;
 *  - context destruction (the guest closed its node): apir_backend_deinit,
 *    dlclose, blobs freed.
 * get_config answers ggml.library.path / ggml.library.reg from the options
 * or from APIR_LLAMA_CPP_GGML_LIBRARY_PATH / _REG (virglrenderer's fallback
 * during its transition), apir.n_threads from --threads, and offers the apir
 * get_shmem_size extension unless --no-shmem-size.
 *
 * Each connection has its own thread, so several contexts run their
 * commands concurrently, as they can in a VMM.  Input from the guest side is
 * checked (sizes, ids, limits); a malformed message drops that connection.
 */
#include "rig_proto.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The host library ABI (APIR 0.1 section 6), plus the apir extension. */
struct rig_callbacks {
    const char *(*get_config)(uint32_t ctx_id, const char *key);
    void *(*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
    size_t (*get_shmem_size)(uint32_t ctx_id, uint32_t res_id);
};
typedef uint32_t (*init_fn)(uint32_t ctx_id, struct rig_callbacks *cbs);
typedef uint32_t (*dispatch_fn)(uint32_t ctx_id, struct rig_callbacks *cbs, uint32_t cmd, char *req_cur,
                                const char *req_end, char *reply_cur, const char *reply_end, char **reply_cur_after);
typedef void (*deinit_fn)(uint32_t ctx_id);

#define CMD_HANDSHAKE   0
#define CMD_LOADLIBRARY 1
#define CMD_FORWARD     2
#define VENUS_OFFSET    331
#define HANDSHAKE_MAGIC 0xab1eu
#define FORWARD_NO_DISPATCH 1u
#define FORWARD_BASE    4u
#define LOAD_ALREADY    2u
#define LOAD_NO_CONFIG  3u
#define LOAD_CANNOT_OPEN 4u
#define LOAD_NO_SYMBOL  5u
#define LOAD_INIT_BASE  6u

#define MAX_CONTEXTS 256
#define MAX_BLOBS_PER_CTX 4096

static struct {
    const char *listen;
    const char *host_lib;
    const char *ggml_lib;
    const char *ggml_reg;
    char threads[16];
    uint32_t host_minor;
    bool shmem_size;
    uint64_t max_blob;
    uint64_t max_ctx_bytes;
    bool verbose;
} opt = { .host_minor = 2, .shmem_size = true, .max_blob = 4ull << 30, .max_ctx_bytes = 32ull << 30 };

static void logf_(bool verbose_only, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(bool verbose_only, const char *fmt, ...)
{
    if (verbose_only && !opt.verbose)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rig: %s\n", line);
}
#define LOG(...)   logf_(false, __VA_ARGS__)
#define DEBUG(...) logf_(true, __VA_ARGS__)

/* ---- contexts and blob resources ------------------------------------------------ */

struct rig_res {
    uint32_t res_id;
    int fd;
    uint8_t *ptr;
    size_t size;
};

struct rig_ctx {
    uint32_t ctx_id;             /* 0 until CONTEXT_INIT */
    int sock;
    uint32_t capset;
    uint32_t type_offset;
    pthread_mutex_t res_lock;    /* the callbacks read the table from the dispatcher */
    struct rig_res *res;
    uint32_t n_res, res_cap;
    uint64_t res_bytes;
    void *lib;
    dispatch_fn dispatch;
    uint64_t n_exec;
    pthread_t thread;
    atomic_bool done;
    struct rig_ctx *next;
};

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rig_ctx *contexts;      /* every connection, live or finished */
static uint32_t n_live;
static atomic_uint next_ctx_id = 1;
static atomic_uint next_res_id = 1;

/* Looked up by ctx_id for the host library's callbacks. */
static struct rig_ctx *ctx_by_id(uint32_t ctx_id)
{
    struct rig_ctx *c = contexts;
    while (c && (c->ctx_id != ctx_id || ctx_id == 0 || atomic_load(&c->done)))
        c = c->next;
    return c;
}

static struct rig_res *res_find(struct rig_ctx *c, uint32_t res_id)
{
    for (uint32_t i = 0; i < c->n_res; i++)
        if (c->res[i].res_id == res_id)
            return &c->res[i];
    return NULL;
}

/* ---- the callbacks the host library gets ------------------------------------------- */

static const char *cb_get_config(uint32_t ctx_id, const char *key)
{
    (void)ctx_id;
    if (!key)
        return NULL;
    if (strcmp(key, "ggml.library.path") == 0)
        return opt.ggml_lib;
    if (strcmp(key, "ggml.library.reg") == 0)
        return opt.ggml_reg;
    if (strcmp(key, "apir.n_threads") == 0)
        return opt.threads[0] ? opt.threads : NULL;
    if (strcmp(key, "apir.callbacks.get_shmem_size") == 0)
        return opt.shmem_size ? "1" : NULL;
    return NULL;
}

static void *cb_get_shmem_ptr(uint32_t ctx_id, uint32_t res_id)
{
    void *p = NULL;
    pthread_mutex_lock(&ctx_lock);
    struct rig_ctx *c = ctx_by_id(ctx_id);
    if (c) {
        pthread_mutex_lock(&c->res_lock);
        struct rig_res *r = res_find(c, res_id);
        p = r ? r->ptr : NULL;
        pthread_mutex_unlock(&c->res_lock);
    }
    pthread_mutex_unlock(&ctx_lock);
    if (!p)
        DEBUG("ctx %u: get_shmem_ptr(%u): no such resource", ctx_id, res_id);
    return p;
}

static size_t cb_get_shmem_size(uint32_t ctx_id, uint32_t res_id)
{
    size_t s = 0;
    pthread_mutex_lock(&ctx_lock);
    struct rig_ctx *c = ctx_by_id(ctx_id);
    if (c) {
        pthread_mutex_lock(&c->res_lock);
        struct rig_res *r = res_find(c, res_id);
        s = r ? r->size : 0;
        pthread_mutex_unlock(&c->res_lock);
    }
    pthread_mutex_unlock(&ctx_lock);
    return s;
}

static struct rig_callbacks callbacks = {
    .get_config = cb_get_config,
    .get_shmem_ptr = cb_get_shmem_ptr,
    .get_shmem_size = cb_get_shmem_size,
};

/* ---- requests ---------------------------------------------------------------------------- */

static bool send_reply(struct rig_ctx *c, const struct rig_reply *r, int fd)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = { (void *)r, sizeof(*r) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(cbuf, 0, sizeof(cbuf));
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    return sendmsg(c->sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(*r);
}

static bool do_get_caps(struct rig_ctx *c, const struct rig_msg *m)
{
    struct rig_reply r = { 0 };
    if ((m->a != RIG_CAPSET_APIR && m->a != RIG_CAPSET_VENUS) || m->b != 0) {
        r.status = -EINVAL;
    } else {
        /* APIR capset: apir_version, supports_blob_resources, reserved[4].
         * The Venus capset's real layout differs; its second word is non-zero
         * there too, which is all the reference guest checks. */
        uint32_t caps[6] = { 1, 1, 0, 0, 0, 0 };
        memcpy(r.data, caps, sizeof(caps));
        r.data_size = sizeof(caps);
    }
    return send_reply(c, &r, -1);
}

static bool do_context_init(struct rig_ctx *c, const struct rig_msg *m)
{
    struct rig_reply r = { 0 };
    if (c->ctx_id || (m->a != RIG_CAPSET_APIR && m->a != RIG_CAPSET_VENUS) || m->b != 1 || m->c != 0) {
        /* APIR contexts have exactly one ring and no fence polling. */
        r.status = c->ctx_id ? -EEXIST : -EINVAL;
    } else {
        c->capset = m->a;
        c->type_offset = m->a == RIG_CAPSET_VENUS ? VENUS_OFFSET : 0;
        pthread_mutex_lock(&ctx_lock);
        c->ctx_id = atomic_fetch_add(&next_ctx_id, 1);
        pthread_mutex_unlock(&ctx_lock);
        DEBUG("ctx %u: created on capset %u", c->ctx_id, c->capset);
    }
    return send_reply(c, &r, -1);
}

static bool do_create_blob(struct rig_ctx *c, const struct rig_msg *m)
{
    struct rig_reply r = { 0 };
    uint64_t size = m->q;
    if (!c->ctx_id || m->a != 2 /* HOST3D */ || !(m->b & 1) /* MAPPABLE */ || m->q2 != 0 || size == 0 ||
        size > opt.max_blob || (size & 4095)) {
        r.status = -EINVAL;
        return send_reply(c, &r, -1);
    }
    if (c->n_res >= MAX_BLOBS_PER_CTX || size > opt.max_ctx_bytes - c->res_bytes) {
        r.status = -ENOSPC;
        return send_reply(c, &r, -1);
    }
    /* Host memory the guest gets to map: sealed, so the guest cannot shrink
     * it under the host's mapping (a SIGBUS in the hypervisor). */
    int fd = memfd_create("apir-rig-blob", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        r.status = -ENOMEM;
        if (fd >= 0)
            close(fd);
        return send_reply(c, &r, -1);
    }
    if (c->n_res == c->res_cap) {
        uint32_t cap = c->res_cap ? c->res_cap * 2 : 16;
        struct rig_res *nr = realloc(c->res, cap * sizeof(*nr));
        if (!nr) {
            munmap(p, (size_t)size);
            close(fd);
            r.status = -ENOMEM;
            return send_reply(c, &r, -1);
        }
        pthread_mutex_lock(&c->res_lock);
        c->res = nr;
        c->res_cap = cap;
        pthread_mutex_unlock(&c->res_lock);
    }
    uint32_t id = atomic_fetch_add(&next_res_id, 1);
    pthread_mutex_lock(&c->res_lock);
    c->res[c->n_res++] = (struct rig_res){ .res_id = id, .fd = fd, .ptr = p, .size = (size_t)size };
    c->res_bytes += size;
    pthread_mutex_unlock(&c->res_lock);
    r.a = id;
    DEBUG("ctx %u: blob %u of %llu bytes", c->ctx_id, id, (unsigned long long)size);
    return send_reply(c, &r, fd);
}

static void res_drop(struct rig_ctx *c, uint32_t index)
{
    struct rig_res *r = &c->res[index];
    munmap(r->ptr, r->size);
    close(r->fd);
    c->res_bytes -= r->size;
    c->res[index] = c->res[--c->n_res];
}

static bool do_destroy_blob(struct rig_ctx *c, const struct rig_msg *m)
{
    struct rig_reply r = { .status = -EINVAL };
    pthread_mutex_lock(&c->res_lock);
    for (uint32_t i = 0; i < c->n_res; i++) {
        if (c->res[i].res_id == m->a) {
            res_drop(c, i);
            r.status = 0;
            break;
        }
    }
    pthread_mutex_unlock(&c->res_lock);
    return send_reply(c, &r, -1);
}

/* ---- commands (virglrenderer's APIR component) ---------------------------------------- */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t load_library(struct rig_ctx *c)
{
    if (c->lib)
        return LOAD_ALREADY;
    if (!opt.host_lib)
        return LOAD_NO_CONFIG;
    void *lib = dlopen(opt.host_lib, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        LOG("ctx %u: cannot open %s: %s", c->ctx_id, opt.host_lib, dlerror());
        return LOAD_CANNOT_OPEN;
    }
    init_fn init = (init_fn)dlsym(lib, "apir_backend_initialize");
    dispatch_fn dispatch = (dispatch_fn)dlsym(lib, "apir_backend_dispatcher");
    if (!init || !dispatch) {
        LOG("ctx %u: %s lacks apir_backend_initialize/_dispatcher", c->ctx_id, opt.host_lib);
        dlclose(lib);
        return LOAD_NO_SYMBOL;
    }
    c->lib = lib;
    c->dispatch = dispatch;
    uint32_t r = init(c->ctx_id, &callbacks);
    if (r && r != LOAD_INIT_BASE) {
        LOG("ctx %u: the host library's initialize returned %u", c->ctx_id, r);
        return LOAD_INIT_BASE + r;
    }
    DEBUG("ctx %u: host library loaded", c->ctx_id);
    return 0;
}

static void do_exec(struct rig_ctx *c, uint8_t *cmd, size_t len)
{
    c->n_exec++;
    if (!c->ctx_id || len < 12) {
        LOG("ctx %u: command of %zu bytes dropped (no context or no header)", c->ctx_id, len);
        return;
    }
    int32_t type = (int32_t)rd32(cmd);
    uint32_t flags = rd32(cmd + 4), reply_id = rd32(cmd + 8);
    /* The reply blob stays put while we run: only this thread destroys blobs. */
    pthread_mutex_lock(&c->res_lock);
    struct rig_res *rr = res_find(c, reply_id);
    uint8_t *reply = rr ? rr->ptr : NULL;
    size_t reply_size = rr ? rr->size : 0;
    pthread_mutex_unlock(&c->res_lock);
    if (!reply || reply_size < 12) {
        LOG("ctx %u: command type %d names no usable reply blob (%u)", c->ctx_id, type, reply_id);
        return;
    }
    uint32_t ret;
    type -= (int32_t)c->type_offset;
    if (type == CMD_HANDSHAKE) {
        uint32_t gmaj = len >= 16 ? rd32(cmd + 12) : 0, gmin = len >= 20 ? rd32(cmd + 16) : 0;
        wr32(reply + 4, 0);
        wr32(reply + 8, opt.host_minor);
        DEBUG("ctx %u: handshake: guest %u.%u, host 0.%u", c->ctx_id, gmaj, gmin, opt.host_minor);
        ret = HANDSHAKE_MAGIC;
    } else if (type == CMD_LOADLIBRARY) {
        ret = load_library(c);
    } else if (type == CMD_FORWARD) {
        if (!c->dispatch) {
            ret = FORWARD_NO_DISPATCH;
        } else {
            char *after = NULL;
            char *out = (char *)reply + 4, *out_end = (char *)reply + reply_size;
            uint32_t r = c->dispatch(c->ctx_id, &callbacks, flags, (char *)cmd + 12, (const char *)cmd + len, out,
                                     out_end, &after);
            if (after < out || after > out_end) {
                LOG("ctx %u: the dispatcher's reply end is outside the reply blob", c->ctx_id);
                ret = FORWARD_NO_DISPATCH;
            } else {
                ret = FORWARD_BASE + r;
            }
        }
    } else {
        LOG("ctx %u: unknown command type %d", c->ctx_id, type + (int32_t)c->type_offset);
        ret = FORWARD_NO_DISPATCH;
    }
    atomic_store_explicit((_Atomic uint32_t *)(void *)reply, ret + 1, memory_order_release);
}

/* ---- connections ------------------------------------------------------------------------- */

static void ctx_destroy(struct rig_ctx *c)
{
    if (c->lib) {
        deinit_fn deinit = (deinit_fn)dlsym(c->lib, "apir_backend_deinit");
        if (deinit)
            deinit(c->ctx_id);
        dlclose(c->lib);
        c->lib = NULL;
    }
    pthread_mutex_lock(&c->res_lock);
    while (c->n_res)
        res_drop(c, 0);
    free(c->res);
    c->res = NULL;
    pthread_mutex_unlock(&c->res_lock);
    DEBUG("ctx %u: destroyed after %llu commands", c->ctx_id, (unsigned long long)c->n_exec);
}

static void *conn_thread(void *arg)
{
    struct rig_ctx *c = arg;
    size_t cap = sizeof(struct rig_msg) + RIG_MAX_COMMAND;
    uint8_t *buf = malloc(cap);
    while (buf) {
        char cbuf[CMSG_SPACE(8 * sizeof(int))];
        struct iovec iov = { buf, cap };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        ssize_t n = recvmsg(c->sock, &mh, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            break;  /* hang-up: the guest closed its node */
        /* The guest side never sends descriptors: close any. */
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                    close(fd);
                }
            }
        }
        if ((mh.msg_flags & MSG_TRUNC) || (size_t)n < sizeof(struct rig_msg)) {
            LOG("ctx %u: malformed message (%zd bytes); dropping the connection", c->ctx_id, n);
            break;
        }
        struct rig_msg m;
        memcpy(&m, buf, sizeof(m));
        size_t payload = (size_t)n - sizeof(m);
        bool ok;
        if (m.type == RIG_EXEC) {
            do_exec(c, buf + sizeof(m), payload);
            ok = true;
        } else if (payload) {
            ok = false;
        } else if (m.type == RIG_GET_CAPS) {
            ok = do_get_caps(c, &m);
        } else if (m.type == RIG_CONTEXT_INIT) {
            ok = do_context_init(c, &m);
        } else if (m.type == RIG_CREATE_BLOB) {
            ok = do_create_blob(c, &m);
        } else if (m.type == RIG_DESTROY_BLOB) {
            ok = do_destroy_blob(c, &m);
        } else {
            ok = false;
        }
        if (!ok) {
            LOG("ctx %u: bad request type %u; dropping the connection", c->ctx_id, m.type);
            break;
        }
    }
    free(buf);
    ctx_destroy(c);
    shutdown(c->sock, SHUT_RDWR);
    atomic_store(&c->done, true);
    return NULL;
}

static void reap(bool all)
{
    pthread_mutex_lock(&ctx_lock);
    struct rig_ctx **pp = &contexts;
    while (*pp) {
        struct rig_ctx *c = *pp;
        if (all)
            shutdown(c->sock, SHUT_RDWR);
        if (all || atomic_load(&c->done)) {
            *pp = c->next;
            pthread_mutex_unlock(&ctx_lock);
            pthread_join(c->thread, NULL);
            close(c->sock);
            pthread_mutex_destroy(&c->res_lock);
            free(c);
            pthread_mutex_lock(&ctx_lock);
            n_live--;
            pp = &contexts;
            continue;
        }
        pp = &c->next;
    }
    pthread_mutex_unlock(&ctx_lock);
}

static void accept_one(int lfd)
{
    int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
        return;
    pthread_mutex_lock(&ctx_lock);
    bool full = n_live >= MAX_CONTEXTS;
    pthread_mutex_unlock(&ctx_lock);
    struct rig_ctx *c = full ? NULL : calloc(1, sizeof(*c));
    if (!c) {
        LOG("refusing a connection (%s)", full ? "too many contexts" : "out of memory");
        close(s);
        return;
    }
    c->sock = s;
    pthread_mutex_init(&c->res_lock, NULL);
    pthread_mutex_lock(&ctx_lock);
    if (pthread_create(&c->thread, NULL, conn_thread, c) != 0) {
        pthread_mutex_unlock(&ctx_lock);
        close(s);
        free(c);
        return;
    }
    c->next = contexts;
    contexts = c;
    n_live++;
    pthread_mutex_unlock(&ctx_lock);
}

static int stop_pipe[2];

static void on_signal(int sig)
{
    (void)sig;
    char b = 1;
    ssize_t r = write(stop_pipe[1], &b, 1);
    (void)r;
}

static int usage(void)
{
    fprintf(stderr, "usage: apir-virgl-rig --listen SOCK --host-lib LIB [--ggml-lib PATH] [--ggml-reg SYM] [--threads N]\n"
                    "                      [--host-minor N] [--no-shmem-size] [--max-blob-mb N] [-v]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opt.host_lib = getenv("VIRGL_APIR_BACKEND_LIBRARY");
    opt.ggml_lib = getenv("APIR_LLAMA_CPP_GGML_LIBRARY_PATH");
    opt.ggml_reg = getenv("APIR_LLAMA_CPP_GGML_LIBRARY_REG");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--listen") == 0 && v) {
            opt.listen = v;
            i++;
        } else if (strcmp(a, "--host-lib") == 0 && v) {
            opt.host_lib = v;
            i++;
        } else if (strcmp(a, "--ggml-lib") == 0 && v) {
            opt.ggml_lib = v;
            i++;
        } else if (strcmp(a, "--ggml-reg") == 0 && v) {
            opt.ggml_reg = v;
            i++;
        } else if (strcmp(a, "--threads") == 0 && v) {
            snprintf(opt.threads, sizeof(opt.threads), "%s", v);
            i++;
        } else if (strcmp(a, "--host-minor") == 0 && v) {
            opt.host_minor = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--max-blob-mb") == 0 && v) {
            opt.max_blob = strtoull(v, NULL, 10) << 20;
            i++;
        } else if (strcmp(a, "--no-shmem-size") == 0) {
            opt.shmem_size = false;
        } else if (strcmp(a, "-v") == 0) {
            opt.verbose = true;
        } else {
            return usage();
        }
    }
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (!opt.listen || strlen(opt.listen) >= sizeof(addr.sun_path))
        return usage();
    strcpy(addr.sun_path, opt.listen);
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    unlink(opt.listen);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(lfd, 64) != 0) {
        LOG("cannot listen on %s: %s", opt.listen, strerror(errno));
        return 1;
    }
    if (pipe2(stop_pipe, O_CLOEXEC) != 0)
        return 1;
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    DEBUG("listening on %s (host library %s, ggml library %s)", opt.listen, opt.host_lib ? opt.host_lib : "-",
          opt.ggml_lib ? opt.ggml_lib : "-");
    for (;;) {
        struct pollfd p[2] = { { .fd = lfd, .events = POLLIN }, { .fd = stop_pipe[0], .events = POLLIN } };
        int r = poll(p, 2, 1000);
        if (r < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (p[0].revents & POLLIN)
            accept_one(lfd);
        reap(false);
    }
    reap(true);
    close(lfd);
    unlink(opt.listen);
    DEBUG("stopped");
    return 0;
}
