/*
 * libapir-virgl.so: the apir host as a virglrenderer API-remoting library
 * (APIR 0.1 section 6).  virglrenderer loads it in the hypervisor process and
 * calls three entry points, per virtio-gpu context (ctx_id):
 *
 *   apir_backend_initialize(ctx_id, cbs)  on the guest's LOADLIBRARY
 *   apir_backend_dispatcher(ctx_id, cbs, cmd, request, reply...)  per FORWARD
 *   apir_backend_deinit(ctx_id)           when the context is destroyed
 *
 * Each context gets its own struct apir_session (host/core/session.h): its own
 * handle table, buffers, backend streams and scratch, exactly as a guest of
 * the apir-host daemon does.  So several VMs (or several guest processes,
 * or one process's several devices) are isolated from each other, and every
 * guarantee of the dispatcher holds here too: the guest sees handles, not
 * pointers; tensors, graphs and shared-memory ranges are bounds-checked; ops
 * the device does not support are refused before they reach the backend.
 *
 * Configuration (virglrenderer's get_config, per context):
 *   ggml.library.path  the ggml *backend* library to serve, e.g.
 *                      /usr/lib/ggml/libggml-cuda.so or .../libggml-cpu.so.
 *                      It is loaded once per process (ggml_backend_load, so
 *                      ggml's own score and API-version checks apply) and
 *                      every one of its devices is offered to the guest.  It
 *                      must be built from the same ggml as this library.
 *   ggml.library.reg   its registration function; default ggml_backend_init
 *                      (what every GGML_BACKEND_DL library exports).  Another
 *                      name (e.g. ggml_backend_cuda_reg of a non-DL build) is
 *                      called directly and its API version checked.
 *   apir.n_threads     (apir) CPU backend threads; default ggml's.
 *   apir.device        (apir) serve only this device index of the library.
 *   apir.callbacks.get_shmem_size  (apir) "1" when cbs points at the larger
 *                      struct apir_virgl_callbacks below (blob sizes known).
 *
 * initialize's return codes (the reference's, which virglrenderer offsets by
 * 6 once more before the guest sees them):
 *   3 ggml.library.path missing, 4 it cannot be opened, 5 its registration
 *   symbol is missing; 6 + code otherwise: 0 success, 5 bad callbacks or no
 *   memory, 6 registration failed (NULL, wrong API version, score 0),
 *   7 this ctx_id is already initialized, 8 no usable device, 9 the first
 *   backend stream could not be started.
 *
 * Why the session's protocol minor is APIR_VERSION_MINOR: virglrenderer
 * answers HANDSHAKE itself and never tells the library what it negotiated.
 * Our guest transport asks the library's version (HOST_GET_VERSION,
 * transport/virtgpu.c) and sends only the commands it has; a reference
 * guest never sends commands beyond 0.1.  Accepting them costs nothing:
 * each runs the same checks as in the daemon.
 *
 * Shared memory: see bind_blobs.  DEVICE_BUFFER_FROM_PTR (a buffer that wraps
 * a guest blob) is not offered over virgl, and DEVICE_GET_PROPS says so.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "host.h"
#include "dispatcher.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define APIR_VIRGL_EXPORT __attribute__((visibility("default")))

/* The ABI virglrenderer passes (section 6). */
struct virgl_apir_callbacks {
    const char *(*get_config)(uint32_t ctx_id, const char *key);
    void *(*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
};

/*
 * apir extension: a hypervisor that can tell a blob's size passes this
 * larger struct and answers get_config(ctx_id, APIR_CFG_SHMEM_SIZE) = "1".
 * get_shmem_size returns the size of blob res_id of context ctx_id (the
 * bytes from get_shmem_ptr's address on), or 0 if it has none.
 */
struct apir_virgl_callbacks {
    struct virgl_apir_callbacks base;
    size_t (*get_shmem_size)(uint32_t ctx_id, uint32_t res_id);
};

#define CFG_LIBRARY_PATH "ggml.library.path"
#define CFG_LIBRARY_REG  "ggml.library.reg"
#define CFG_N_THREADS    "apir.n_threads"
#define CFG_DEVICE       "apir.device"
#define APIR_CFG_SHMEM_SIZE "apir.callbacks.get_shmem_size"
#define DEFAULT_REG      "ggml_backend_init"

/* Contexts are the hypervisor's to create; this bounds our table. */
#define MAX_CONTEXTS 1024
/* Blobs one command can name (the table's largest is one). */
#define MAX_CMD_BLOBS 4
/* Sizes of blobs learned from the process's mappings (see mapping_bound). */
#define BOUND_CACHE 16

APIR_VIRGL_EXPORT uint32_t apir_backend_initialize(uint32_t ctx_id, struct virgl_apir_callbacks *cbs);
APIR_VIRGL_EXPORT uint32_t apir_backend_dispatcher(uint32_t ctx_id, struct virgl_apir_callbacks *cbs, uint32_t cmd,
                                                   char *req_cur, const char *req_end, char *reply_cur,
                                                   const char *reply_end, char **reply_cur_after);
APIR_VIRGL_EXPORT void apir_backend_deinit(uint32_t ctx_id);

/* ---- ggml backend libraries ------------------------------------------------ */

/*
 * One entry per (path, registration symbol) ever loaded in this process.
 * Entries are never unloaded: a VM that restarts gets its backend back
 * without re-initializing a GPU runtime, and a backend library that started
 * threads or registered handlers (OpenMP, CUDA) is never pulled out from
 * under them.  The handle we keep also pins the library while ggml's own
 * registry holds another.
 */
struct ggml_lib {
    char *path;
    char *reg_sym;
    void *handle;
    ggml_backend_reg_t reg;
    struct ggml_lib *next;
};

static pthread_mutex_t libs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ggml_lib *libs;

/* Returns 0 with *reg set, or an initialize return code. */
static uint32_t ggml_lib_load(const char *path, const char *sym, ggml_backend_reg_t *reg)
{
    pthread_mutex_lock(&libs_lock);
    for (struct ggml_lib *l = libs; l; l = l->next) {
        if (strcmp(l->path, path) == 0 && strcmp(l->reg_sym, sym) == 0) {
            *reg = l->reg;
            pthread_mutex_unlock(&libs_lock);
            return 0;
        }
    }
    uint32_t code = 0;
    ggml_backend_reg_t r = NULL;
    /* Our own dlopen first, to tell "cannot open" from "no symbol". */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *fn = handle ? dlsym(handle, sym) : NULL;
    if (!handle) {
        APIR_ERROR("virgl", "cannot open the ggml backend library %s: %s", path, dlerror());
        code = APIR_LOAD_CANNOT_OPEN;
    } else if (!fn) {
        APIR_ERROR("virgl", "%s has no registration function %s", path, sym);
        code = APIR_LOAD_SYMBOL_MISSING;
    } else if (strcmp(sym, DEFAULT_REG) == 0) {
        r = ggml_backend_load(path);  /* score check, API version, ggml's registry */
    } else {
        ggml_backend_reg_t (*reg_fn)(void) = (ggml_backend_reg_t(*)(void))fn;
        r = reg_fn();
        if (r && r->api_version != GGML_BACKEND_API_VERSION) {
            APIR_ERROR("virgl", "%s: backend API version %d, this library needs %d", path, r->api_version,
                       GGML_BACKEND_API_VERSION);
            r = NULL;
        }
    }
    if (!code && !r) {
        APIR_ERROR("virgl", "%s: %s() registered no backend", path, sym);
        code = APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_REG_FAILED;
    }
    struct ggml_lib *l = code ? NULL : calloc(1, sizeof(*l));
    if (!code && (!l || !(l->path = strdup(path)) || !(l->reg_sym = strdup(sym)))) {
        if (l) {
            free(l->path);
            free(l);
        }
        code = APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    if (code) {
        if (handle)
            dlclose(handle);
        pthread_mutex_unlock(&libs_lock);
        return code;
    }
    l->handle = handle;
    l->reg = r;
    l->next = libs;
    libs = l;
    pthread_mutex_unlock(&libs_lock);
    APIR_INFO("virgl", "loaded %s: backend %s, %zu device(s)", path, ggml_backend_reg_name(r), ggml_backend_reg_dev_count(r));
    *reg = r;
    return 0;
}

/* ---- contexts ------------------------------------------------------------------ */

struct blob_bound {
    uint32_t res_id;
    const void *ptr;
    size_t size;
    uint64_t used;           /* LRU tick; 0: empty */
};

struct vctx {
    uint32_t ctx_id;
    atomic_uint refs;        /* the table's + one per dispatch in flight */
    pthread_mutex_t lock;    /* one command at a time per context */
    struct apir_host host;   /* this context's devices, limits and threads */
    struct apir_session *session;
    const struct virgl_apir_callbacks *cbs;
    bool has_size_cb;
    bool warned_no_size;
    struct blob_bound bounds[BOUND_CACHE];
    uint64_t tick;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vctx *table[MAX_CONTEXTS];
static uint32_t n_table;

static void ctx_free(struct vctx *c)
{
    struct apir_session *s = c->session;
    if (s)
        APIR_INFO("virgl", "ctx %u: closed after %llu commands (%llu graphs, %llu refused); freeing %u buffers",
                  c->ctx_id, (unsigned long long)s->stats.n_commands, (unsigned long long)s->stats.n_graphs,
                  (unsigned long long)s->stats.n_refused, s->n_buffers);
    apir_session_free(s);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static struct vctx *ctx_get(uint32_t ctx_id)
{
    struct vctx *c = NULL;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < n_table; i++) {
        if (table[i]->ctx_id == ctx_id) {
            c = table[i];
            atomic_fetch_add(&c->refs, 1);
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return c;
}

static void ctx_put(struct vctx *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        ctx_free(c);
}

/* Inserts c unless its ctx_id is taken; returns an initialize code. */
static uint32_t ctx_insert(struct vctx *c)
{
    uint32_t code = 0;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < n_table && !code; i++)
        if (table[i]->ctx_id == c->ctx_id)
            code = APIR_LOAD_HOST_BASE + APIR_INIT_ALREADY_INITIALIZED;
    if (!code && n_table == MAX_CONTEXTS)
        code = APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    if (!code)
        table[n_table++] = c;
    pthread_mutex_unlock(&table_lock);
    return code;
}

static struct vctx *ctx_remove(uint32_t ctx_id)
{
    struct vctx *c = NULL;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < n_table; i++) {
        if (table[i]->ctx_id == ctx_id) {
            c = table[i];
            table[i] = table[--n_table];
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return c;
}

static bool ctx_known(uint32_t ctx_id)
{
    struct vctx *c = ctx_get(ctx_id);
    if (c)
        ctx_put(c);
    return c != NULL;
}

/* A small non-negative integer from the configuration, or dflt. */
static long config_int(const struct virgl_apir_callbacks *cbs, uint32_t ctx_id, const char *key, long dflt, long max)
{
    const char *s = cbs->get_config(ctx_id, key);
    if (!s || !*s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > max) {
        APIR_WARN("virgl", "ctx %u: configuration %s=%s ignored (0..%ld)", ctx_id, key, s, max);
        return dflt;
    }
    return v;
}

/* Our own frontend (a loop) and ggml-rpc (someone else's remote) are never
 * served, as in the daemon. */
static bool reg_is_servable(ggml_backend_reg_t reg)
{
    const char *name = ggml_backend_reg_name(reg);
    return strcmp(name, "APIR") != 0 && strcmp(name, "RPC") != 0 && ggml_backend_reg_dev_count(reg) > 0;
}

static uint32_t setup_host(struct vctx *c, const struct virgl_apir_callbacks *cbs, ggml_backend_reg_t reg)
{
    struct apir_host *h = &c->host;
    memset(h, 0, sizeof(*h));
    apir_host_config_default(&h->cfg);
    h->cfg.device = (int)config_int(cbs, c->ctx_id, CFG_DEVICE, -1, APIR_HOST_MAX_DEVICES - 1);
    h->cfg.n_threads = (int)config_int(cbs, c->ctx_id, CFG_N_THREADS, h->cfg.n_threads, 1024);
    h->reg = reg;
    if (!reg_is_servable(reg)) {
        APIR_ERROR("virgl", "ctx %u: backend %s cannot be served (no device, or a remoting backend)", c->ctx_id,
                   ggml_backend_reg_name(reg));
        return APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE;
    }
    size_t n = ggml_backend_reg_dev_count(reg);
    if (h->cfg.device >= 0) {
        if ((size_t)h->cfg.device >= n) {
            APIR_ERROR("virgl", "ctx %u: %s=%d but %s has %zu device(s)", c->ctx_id, CFG_DEVICE, h->cfg.device,
                       ggml_backend_reg_name(reg), n);
            return APIR_LOAD_HOST_BASE + APIR_INIT_NO_DEVICE;
        }
        h->devices[h->n_devices++] = ggml_backend_reg_dev_get(reg, (size_t)h->cfg.device);
    } else {
        for (size_t i = 0; i < n && i < APIR_HOST_MAX_DEVICES; i++)
            h->devices[h->n_devices++] = ggml_backend_reg_dev_get(reg, i);
    }
    return 0;
}

APIR_VIRGL_EXPORT uint32_t apir_backend_initialize(uint32_t ctx_id, struct virgl_apir_callbacks *cbs)
{
    if (!cbs || !cbs->get_config || !cbs->get_shmem_ptr) {
        APIR_ERROR("virgl", "ctx %u: initialize without callbacks", ctx_id);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    /* Checked early for a clear answer; ctx_insert settles races. */
    if (ctx_known(ctx_id)) {
        APIR_WARN("virgl", "ctx %u: already initialized", ctx_id);
        return APIR_LOAD_HOST_BASE + APIR_INIT_ALREADY_INITIALIZED;
    }
    /* The configuration strings are the hypervisor's: copy them. */
    const char *path = cbs->get_config(ctx_id, CFG_LIBRARY_PATH);
    const char *sym = cbs->get_config(ctx_id, CFG_LIBRARY_REG);
    if (!path || !*path || strlen(path) >= PATH_MAX) {
        APIR_ERROR("virgl", "ctx %u: no usable %s in the configuration", ctx_id, CFG_LIBRARY_PATH);
        return APIR_LOAD_CONFIG_MISSING;
    }
    char path_copy[PATH_MAX], sym_copy[128];
    snprintf(path_copy, sizeof(path_copy), "%s", path);
    if (!sym || !*sym)
        sym = DEFAULT_REG;
    if (strlen(sym) >= sizeof(sym_copy)) {
        APIR_ERROR("virgl", "ctx %u: %s too long", ctx_id, CFG_LIBRARY_REG);
        return APIR_LOAD_CONFIG_MISSING;
    }
    snprintf(sym_copy, sizeof(sym_copy), "%s", sym);

    ggml_backend_reg_t reg = NULL;
    uint32_t code = ggml_lib_load(path_copy, sym_copy, &reg);
    if (code)
        return code;

    struct vctx *c = calloc(1, sizeof(*c));
    if (!c)
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    c->ctx_id = ctx_id;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    c->cbs = cbs;
    const char *ext = cbs->get_config(ctx_id, APIR_CFG_SHMEM_SIZE);
    c->has_size_cb = ext && strcmp(ext, "1") == 0 && ((const struct apir_virgl_callbacks *)cbs)->get_shmem_size;
    code = setup_host(c, cbs, reg);
    if (!code) {
        char name[48];
        snprintf(name, sizeof(name), "virgl-ctx%u", ctx_id);
        c->session = apir_session_new(&c->host, name);
        if (!c->session)
            code = APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    if (!code) {
        c->session->minor = APIR_VERSION_MINOR;  /* see the top of the file */
        if (!apir_session_backend(c->session, 0))
            code = APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_INIT_FAILED;
    }
    if (!code)
        code = ctx_insert(c);
    if (code) {
        ctx_free(c);
        return code;
    }
    APIR_INFO("virgl", "ctx %u: serving %u device(s) of %s; blob sizes %s", ctx_id, c->host.n_devices,
              ggml_backend_reg_name(reg), c->has_size_cb ? "from the hypervisor" : "from the process's mappings");
    return APIR_LOAD_HOST_BASE + APIR_INIT_SUCCESS;
}

APIR_VIRGL_EXPORT void apir_backend_deinit(uint32_t ctx_id)
{
    struct vctx *c = ctx_remove(ctx_id);
    if (!c) {
        APIR_INFO("virgl", "ctx %u: deinit of an unknown context", ctx_id);
        return;
    }
    /* Freed now, or by the dispatch still running on it when it returns. */
    ctx_put(c);
}

/*
 * virglrenderer dlcloses this library when its last context is gone (it
 * calls deinit for each first).  Free what would otherwise be unreachable
 * then: a context the hypervisor forgot, and the library table.  The ggml
 * backend libraries themselves stay loaded (see struct ggml_lib).
 */
__attribute__((destructor)) static void virgl_unload(void)
{
    pthread_mutex_lock(&table_lock);
    while (n_table) {
        struct vctx *c = table[--n_table];
        APIR_WARN("virgl", "ctx %u: still open when the library is unloaded", c->ctx_id);
        ctx_put(c);
    }
    pthread_mutex_unlock(&table_lock);
    pthread_mutex_lock(&libs_lock);
    while (libs) {
        struct ggml_lib *l = libs;
        libs = l->next;
        free(l->path);
        free(l->reg_sym);
        free(l);
    }
    pthread_mutex_unlock(&libs_lock);
}

/* ---- shared memory ---------------------------------------------------------------- */

/*
 * The length of the shared read-write mapping that holds p, counted from p;
 * 0 if p is in no such mapping.  Read from /proc/self/maps.
 *
 * virglrenderer maps each blob resource on its own (one memfd, one mmap), and
 * the kernel never merges mappings of different files, so the mapping's end
 * is the blob's end.  The result is cached per (res_id, address) by the
 * caller: the file costs tens of microseconds to read in a big VMM.
 */
static size_t mapping_bound(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    uintptr_t a = (uintptr_t)p;
    size_t bound = 0;
    char line[512];
    bool at_line_start = true;
    while (fgets(line, sizeof(line), f)) {
        bool complete = strchr(line, '\n') != NULL;
        if (at_line_start) {
            unsigned long start, end;
            char perms[8];
            if (sscanf(line, "%lx-%lx %7s", &start, &end, perms) == 3) {
                if (start > a)
                    break;
                if (a < end) {
                    if (strlen(perms) >= 4 && perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's')
                        bound = end - a;
                    break;
                }
            }
        }
        at_line_start = complete;
    }
    fclose(f);
    return bound;
}

static size_t cached_bound(struct vctx *c, uint32_t res_id, const void *ptr)
{
    struct blob_bound *victim = &c->bounds[0];
    c->tick++;
    for (int i = 0; i < BOUND_CACHE; i++) {
        struct blob_bound *b = &c->bounds[i];
        if (b->used && b->res_id == res_id && b->ptr == ptr) {
            b->used = c->tick;
            return b->size;
        }
        if (b->used < victim->used)
            victim = b;
    }
    size_t size = mapping_bound(ptr);
    if (size)
        *victim = (struct blob_bound){ .res_id = res_id, .ptr = ptr, .size = size, .used = c->tick };
    return size;
}

/* The res_ids a request names, found by walking its signature.  Stops at
 * an inline tensor ('T', variable layout): no res_id follows one in the
 * command table.  A short or odd request yields what was found so far; the
 * handler then meets the same bytes and refuses them. */
static uint32_t request_res_ids(uint32_t cmd, const char *req, size_t len, uint32_t *ids)
{
    if (cmd >= APIR_CMD_COUNT || !apir_command_table[cmd].name)
        return 0;
    struct apir_decoder d;
    apir_decoder_init(&d, req, len);
    uint32_t n = 0;
    for (const char *sig = apir_command_table[cmd].request; *sig && !d.fatal; sig++) {
        switch (*sig) {
        case 'u': case 'e': case 'i': case 'b': case 'c':
            apir_decode_u32(&d);
            break;
        case 'r': {
            uint32_t id = apir_decode_u32(&d);
            if (!d.fatal && n < MAX_CMD_BLOBS)
                ids[n++] = id;
            break;
        }
        case 'q': case 'h':
            apir_decode_u64(&d);
            break;
        case 's': {
            uint64_t l = apir_decode_u64(&d);
            if (l > APIR_MAX_STRING)
                return n;
            apir_decode_inplace(&d, (size_t)l);
            break;
        }
        case 't':
            apir_decode_inplace(&d, APIR_TENSOR_REC_SIZE);
            break;
        case 'd':
            apir_decode_inplace(&d, APIR_DIGEST_SIZE);
            break;
        case 'L': {
            uint32_t k = apir_decode_u32(&d);
            if (k > 64)
                return n;
            apir_decode_inplace(&d, (size_t)k * APIR_TENSOR_REC_SIZE);
            break;
        }
        default:
            return n;
        }
    }
    return n;
}

/*
 * Makes the blobs a command names known to the session, with their sizes,
 * for this one command (unbind_blobs drops them after it).
 *
 * virglrenderer's get_shmem_ptr gives an address and no size.  Trusting the
 * guest's idea of a blob's size would let it make the host read or write
 * past the blob, in the hypervisor's own memory.  So the size comes from:
 *  1. the hypervisor, when it offers get_shmem_size (the apir extension);
 *  2. otherwise, the host mapping that holds the blob (mapping_bound): the
 *     range is then at worst a different part of the same shared memory
 *     object, never unrelated hypervisor memory.  Residual risk: a hypervisor
 *     that sub-allocates many blobs inside one shared mapping (virglrenderer
 *     does not) would let a guest reach its neighbours' blobs; and a cached
 *     bound is reused only for the same res_id at the same address, so a
 *     resource id recycled at the very same address with a smaller mapping
 *     before the next lookup would keep the old, larger bound.
 *  3. neither: the blob is refused (so is the command).
 * The bound is re-established on every command: the guest can destroy a
 * blob and reuse its res_id at any time.
 */
static bool bind_blobs(struct vctx *c, const uint32_t *ids, uint32_t n, uint32_t *added, uint32_t *n_added)
{
    *n_added = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (apir_session_blob_find(c->session, id))
            continue;  /* named twice */
        void *p = c->cbs->get_shmem_ptr(c->ctx_id, id);
        if (!p) {
            APIR_WARN("virgl", "ctx %u: blob %u is not a shared-memory resource of this context", c->ctx_id, id);
            return false;
        }
        size_t size;
        if (c->has_size_cb) {
            size = ((const struct apir_virgl_callbacks *)c->cbs)->get_shmem_size(c->ctx_id, id);
        } else {
            size = cached_bound(c, id, p);
            if (!size && !c->warned_no_size) {
                c->warned_no_size = true;
                APIR_ERROR("virgl", "ctx %u: the size of blob %u cannot be established (not in a shared mapping, "
                           "or /proc unreadable); commands naming it are refused", c->ctx_id, id);
            }
        }
        if (!size || !apir_session_blob_add(c->session, id, p, size, NULL, NULL))
            return false;
        added[(*n_added)++] = id;
    }
    return true;
}

static void unbind_blobs(struct vctx *c, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        apir_session_blob_remove(c->session, ids[i]);
}

APIR_VIRGL_EXPORT uint32_t apir_backend_dispatcher(uint32_t ctx_id, struct virgl_apir_callbacks *cbs, uint32_t cmd,
                                                   char *req_cur, const char *req_end, char *reply_cur,
                                                   const char *reply_end, char **reply_cur_after)
{
    if (reply_cur_after)
        *reply_cur_after = reply_cur;
    if (!reply_cur_after || !reply_cur || !reply_end || reply_end < reply_cur || (!req_cur) != (!req_end) ||
        (req_cur && req_end < req_cur)) {
        APIR_WARN("virgl", "ctx %u: dispatcher called with invalid request or reply ranges", ctx_id);
        return APIR_HANDLER_BAD_REQUEST;
    }
    struct vctx *c = ctx_get(ctx_id);
    if (!c) {
        /* virglrenderer keeps forwarding after a failed initialize. */
        APIR_WARN("virgl", "ctx %u: command %s for a context that is not initialized", ctx_id, apir_command_name(cmd));
        return APIR_HANDLER_FAILED;
    }
    pthread_mutex_lock(&c->lock);
    /* What this command makes us log is the guest's doing (its share: apir_log.h). */
    struct apir_log_budget *log_before = apir_log_budget_enter(&c->session->log);
    if (cbs && cbs->get_shmem_ptr)
        c->cbs = cbs;
    size_t req_len = req_cur ? (size_t)(req_end - req_cur) : 0;
    uint32_t result = APIR_HANDLER_BAD_REQUEST;
    uint32_t ids[MAX_CMD_BLOBS], bound[MAX_CMD_BLOBS], n_bound = 0;
    if (cmd == APIR_CMD_DEVICE_BUFFER_FROM_PTR) {
        /* A buffer wrapping a blob would outlive it: the hypervisor frees
         * blob memory when the guest drops the resource, without asking. */
        APIR_WARN("virgl", "ctx %u: DEVICE_BUFFER_FROM_PTR refused: blob lifetimes are the hypervisor's", ctx_id);
        c->session->stats.n_refused++;
    } else if (cmd == APIR_CMD_DEVICE_GET_PROPS) {
        /* So none is offered: the reference guest allocates every buffer
         * with DEVICE_BUFFER_FROM_PTR when the host says it could.  Host
         * buffers and events are host-local anyway.  The fifth item is the
         * pinned reference's mmap_support. */
        struct apir_encoder reply;
        apir_encoder_init(&reply, reply_cur, (size_t)(reply_end - reply_cur));
        const struct apir_reply_DEVICE_GET_PROPS props = { 0 };
        apir_encode_reply_DEVICE_GET_PROPS(&reply, &props);
        result = reply.fatal ? APIR_HANDLER_REPLY_FULL : APIR_HANDLER_OK;
        *reply_cur_after = reply_cur + apir_encoder_used(&reply);
    } else if (!bind_blobs(c, ids, request_res_ids(cmd, req_cur, req_len, ids), bound, &n_bound)) {
        c->session->stats.n_refused++;
    } else {
        struct apir_decoder req;
        struct apir_encoder reply;
        apir_decoder_init(&req, req_cur, req_len);
        apir_encoder_init(&reply, reply_cur, (size_t)(reply_end - reply_cur));
        result = apir_session_forward(c->session, cmd, &req, &reply);
        *reply_cur_after = reply_cur + apir_encoder_used(&reply);
    }
    unbind_blobs(c, bound, n_bound);
    apir_log_budget_leave(log_before);
    pthread_mutex_unlock(&c->lock);
    ctx_put(c);
    return result;
}
