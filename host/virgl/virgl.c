/*
 * libapir-virgl.so: the apir host as a virglrenderer API-remoting library
 * (APIR 0.1 section 6).  virglrenderer loads it in the hypervisor process
 * (or in its render server's per-context worker) and calls three entry
 * points, per virtio-gpu context (ctx_id):
 *
 *   apir_backend_initialize(ctx_id, cbs)  on the guest's LOADLIBRARY
 *   apir_backend_dispatcher(ctx_id, cbs, cmd, request, reply...)  per FORWARD
 *   apir_backend_deinit(ctx_id)           when the context is destroyed
 *
 * Nothing of a guest's is computed in this process.  Each context is served
 * by a worker process of its own (worker_link.h): apir-host in its worker
 * mode, executed afresh - no memory of the hypervisor's, none of another
 * VM's, is in it - and sandboxed exactly as the daemon's workers are
 * (host/server/sandbox.c: its own PID, IPC, mount and, where needed, user
 * namespaces; a uid of its own when this process may give one; no new
 * privileges, not dumpable, limits, seccomp with argument filters).  The
 * worker loads the ggml backend library, holds the context's session
 * (handles, buffers, streams) and runs every check and kernel; a guest that
 * takes control of it through a kernel bug reaches that worker and the
 * blobs of its own context, nothing else.  What stays here: reading the
 * configuration, finding each blob's file and passing its descriptor, and
 * copying commands and replies through shared memory (bounded both ways).
 * A worker that dies fails its context's calls; the hypervisor and the
 * other contexts go on.
 *
 * Configuration (virglrenderer's get_config, per context):
 *   ggml.library.path  the ggml *backend* library to serve, e.g.
 *                      /usr/lib/ggml/libggml-cuda.so or .../libggml-cpu.so,
 *                      loaded by the worker (ggml_backend_load, so ggml's
 *                      own score and API-version checks apply); every one of
 *                      its devices is offered to the guest.  It must be
 *                      built from the same ggml as apir-host.
 *   ggml.library.reg   its registration function; default ggml_backend_init
 *                      (what every GGML_BACKEND_DL library exports).  Another
 *                      name (e.g. ggml_backend_cuda_reg of a non-DL build) is
 *                      called directly and its API version checked.
 *   apir.n_threads     (apir) CPU backend threads; default the worker's.
 *   apir.device        (apir) serve only this device index of the library.
 *   apir.callbacks.get_shmem_size  (apir) "1" when cbs points at the larger
 *                      struct apir_virgl_callbacks below (blob sizes known).
 *   apir.worker.path   (apir) the apir-host executable the workers run;
 *                      default $APIR_VIRGL_WORKER, else apir-host beside this
 *                      library as installed (LIBDIR/../bin) or built (the
 *                      build folder).
 *   apir.worker.timeout_ms  (apir) how long a command may go unanswered
 *                      before its worker is ended (default 120000, twice the
 *                      worker's own graph budget; 0: no limit).
 * A worker gets the APIR_*, GGML_* and GPU runtime variables of this
 * process's environment, nothing else of it (worker_link.c, env_passed).
 *
 * initialize's return codes (the reference's, which virglrenderer offsets by
 * 6 once more before the guest sees them):
 *   3 ggml.library.path missing, 4 it cannot be opened, 5 its registration
 *   symbol is missing; 6 + code otherwise: 0 success, 5 bad callbacks, no
 *   memory, or the worker could not be started (logged with the reason),
 *   6 registration failed (NULL, wrong API version), 7 this ctx_id is
 *   already initialized, 8 no usable device.
 *
 * Why the worker's session speaks APIR_VERSION_MINOR: virglrenderer answers
 * HANDSHAKE itself and never tells the library what it negotiated.  Our
 * guest transport asks the library's version (HOST_GET_VERSION,
 * transport/virtgpu.c) and sends only the commands it has; a reference
 * guest never sends commands beyond 0.1.  Accepting them costs nothing:
 * each runs the same checks as in the daemon.
 *
 * Shared memory: see bind_blobs.  DEVICE_BUFFER_FROM_PTR (a buffer that wraps
 * a guest blob) is not offered over virgl, and DEVICE_GET_PROPS says so.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_log.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "blob_fd.h"
#include "shm_proto.h"
#include "worker_link.h"

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
#define CFG_WORKER_PATH  "apir.worker.path"
#define CFG_WORKER_TIMEOUT "apir.worker.timeout_ms"
#define APIR_CFG_SHMEM_SIZE "apir.callbacks.get_shmem_size"
#define ENV_WORKER       "APIR_VIRGL_WORKER"
#define WORKER_TIMEOUT_MS_DEFAULT 120000

/* Contexts are the hypervisor's to create; this bounds our table. */
#define MAX_CONTEXTS 1024
/* Blobs one command can name (the table's largest is one). */
#define MAX_CMD_BLOBS 4
/* Blobs a context's worker holds at once (see bind_blobs). */
#define MAX_CTX_BLOBS 64

APIR_VIRGL_EXPORT uint32_t apir_backend_initialize(uint32_t ctx_id, struct virgl_apir_callbacks *cbs);
APIR_VIRGL_EXPORT uint32_t apir_backend_dispatcher(uint32_t ctx_id, struct virgl_apir_callbacks *cbs, uint32_t cmd,
                                                   char *req_cur, const char *req_end, char *reply_cur,
                                                   const char *reply_end, char **reply_cur_after);
APIR_VIRGL_EXPORT void apir_backend_deinit(uint32_t ctx_id);

/* ---- contexts ------------------------------------------------------------------ */

/* A blob the worker holds: the hypervisor's res_id, where and what it was
 * when given (a res_id may be destroyed and reused at any time), and the
 * worker's own id for it. */
struct worker_blob {
    uint32_t res_id;
    uint32_t worker_id;      /* 0: an empty entry */
    const void *ptr;
    uint64_t size;
    dev_t dev;
    ino_t ino;
    uint64_t used;           /* LRU tick */
};

struct vctx {
    uint32_t ctx_id;
    atomic_uint refs;        /* the table's + one per dispatch in flight */
    pthread_mutex_t lock;    /* one command at a time per context */
    struct apir_worker_link *link;
    const struct virgl_apir_callbacks *cbs;
    bool has_size_cb;
    struct worker_blob blobs[MAX_CTX_BLOBS];
    uint32_t next_worker_id;
    uint64_t tick;
    uint64_t n_commands, n_refused;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vctx *table[MAX_CONTEXTS];
static uint32_t n_table;

static void ctx_free(struct vctx *c)
{
    if (c->link)
        APIR_INFO("virgl", "ctx %u: closed after %llu commands (%llu refused here or by its worker)", c->ctx_id,
                  (unsigned long long)c->n_commands, (unsigned long long)c->n_refused);
    apir_worker_link_close(c->link);
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

/* A non-negative integer from the configuration, or dflt. */
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

/* A configuration string copied into buf (the hypervisor's strings are its
 * own); false: too long. */
static bool config_copy(const char *s, char *buf, size_t len)
{
    if (strlen(s) >= len)
        return false;
    memcpy(buf, s, strlen(s) + 1);
    return true;
}

static bool executable(const char *path)
{
    return path[0] == '/' && access(path, X_OK) == 0;
}

/* The worker program: the configuration's, the environment's, else
 * apir-host beside this library - LIBDIR/../bin/apir-host as installed,
 * the build folder's own when run from there.  false with buf "" or the
 * path that is not an executable. */
static bool worker_program(const struct virgl_apir_callbacks *cbs, uint32_t ctx_id, char *buf, size_t len)
{
    const char *given = cbs->get_config(ctx_id, CFG_WORKER_PATH);
    if (!given || !*given)
        given = getenv(ENV_WORKER);
    if (given && *given) {
        if (!config_copy(given, buf, len))
            buf[0] = '\0';
        return buf[0] && executable(buf);
    }
    Dl_info info;
    char dir[PATH_MAX];
    buf[0] = '\0';
    if (!dladdr((void *)apir_backend_initialize, &info) || !info.dli_fname || !realpath(info.dli_fname, dir))
        return false;
    dirname(dir);
    if (snprintf(buf, len, "%s/../bin/apir-host", dir) < (int)len && executable(buf))
        return true;
    return snprintf(buf, len, "%s/apir-host", dir) < (int)len && executable(buf);
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
    const char *path = cbs->get_config(ctx_id, CFG_LIBRARY_PATH);
    const char *sym = cbs->get_config(ctx_id, CFG_LIBRARY_REG);
    char path_copy[PATH_MAX], sym_copy[128], program[PATH_MAX];
    if (!path || !*path || !config_copy(path, path_copy, sizeof(path_copy))) {
        APIR_ERROR("virgl", "ctx %u: no usable %s in the configuration", ctx_id, CFG_LIBRARY_PATH);
        return APIR_LOAD_CONFIG_MISSING;
    }
    if (!sym || !*sym)
        sym = "ggml_backend_init";
    if (!config_copy(sym, sym_copy, sizeof(sym_copy))) {
        APIR_ERROR("virgl", "ctx %u: %s too long", ctx_id, CFG_LIBRARY_REG);
        return APIR_LOAD_CONFIG_MISSING;
    }
    if (!worker_program(cbs, ctx_id, program, sizeof(program))) {
        APIR_ERROR("virgl", "ctx %u: no worker program: %s%s (set %s or $%s to apir-host's path)", ctx_id,
                   program[0] ? program : "apir-host is not beside this library",
                   program[0] ? " is not an executable (absolute path)" : "", CFG_WORKER_PATH, ENV_WORKER);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    struct vctx *c = calloc(1, sizeof(*c));
    if (!c)
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    c->ctx_id = ctx_id;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    c->cbs = cbs;
    c->next_worker_id = APIR_SHM_FIRST_RES_ID;
    const char *ext = cbs->get_config(ctx_id, APIR_CFG_SHMEM_SIZE);
    c->has_size_cb = ext && strcmp(ext, "1") == 0 && ((const struct apir_virgl_callbacks *)cbs)->get_shmem_size;
    const struct apir_worker_spec spec = {
        .program = program, .library = path_copy, .reg = sym_copy, .ctx_id = ctx_id,
        .device = (int)config_int(cbs, ctx_id, CFG_DEVICE, -1, 15),
        .n_threads = (int)config_int(cbs, ctx_id, CFG_N_THREADS, -1, 1024),
        .timeout_ms = (uint32_t)config_int(cbs, ctx_id, CFG_WORKER_TIMEOUT, WORKER_TIMEOUT_MS_DEFAULT, 86400000),
    };
    uint32_t code = apir_worker_link_open(&spec, &c->link);
    if (!code)
        code = ctx_insert(c);
    if (code) {
        ctx_free(c);
        return code;
    }
    APIR_INFO("virgl", "ctx %u: serving %s; blob sizes %s", ctx_id, path_copy,
              c->has_size_cb ? "from the hypervisor" : "from the process's mappings");
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
 * calls deinit for each first).  A context the hypervisor forgot is closed
 * then: its worker ends.
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
}

/* ---- shared memory ---------------------------------------------------------------- */

/*
 * The res_id items of a request, found by walking its signature: their
 * byte offsets in the request.  -1: the walk did not reach the end of the
 * signature (a short or odd request: refused here, as the worker's decoder
 * would refuse it).  Stops at an inline tensor ('T', variable layout): no
 * res_id follows one in the command table.
 */
static int request_res_ids(uint32_t cmd, const char *req, size_t len, size_t *at)
{
    if (cmd >= APIR_CMD_COUNT || !apir_command_table[cmd].name)
        return 0;  /* the worker answers an unknown command */
    struct apir_decoder d;
    apir_decoder_init(&d, req, len);
    int n = 0;
    for (const char *sig = apir_command_table[cmd].request; *sig && !d.fatal; sig++) {
        switch (*sig) {
        case 'u': case 'e': case 'i': case 'b': case 'c':
            apir_decode_u32(&d);
            break;
        case 'r': {
            const size_t off = (size_t)(d.cur - d.start);
            apir_decode_u32(&d);
            if (n == MAX_CMD_BLOBS)
                return -1;
            at[n++] = off;
            break;
        }
        case 'q': case 'h':
            apir_decode_u64(&d);
            break;
        case 's': {
            uint64_t l = apir_decode_u64(&d);
            if (l > APIR_MAX_STRING)
                return -1;
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
                return -1;
            apir_decode_inplace(&d, (size_t)k * APIR_TENSOR_REC_SIZE);
            break;
        }
        case 'T':
            return d.fatal ? -1 : n;
        default:
            return -1;
        }
    }
    return d.fatal ? -1 : n;
}

static void blob_drop(struct vctx *c, struct worker_blob *b)
{
    apir_worker_link_blob_remove(c->link, b->worker_id);
    b->worker_id = 0;
}

/* Whether the worker's copy of b is still what the hypervisor has at b's
 * address: the same file there. */
static bool blob_current(const struct worker_blob *b, const void *ptr, const struct apir_mapping *m, uint64_t size)
{
    return b->ptr == ptr && b->dev == m->dev && b->ino == m->ino && b->size == size;
}

/* An entry for a new blob: a free one, else one whose blob the hypervisor
 * no longer has (dropped), else the least recently used (dropped). */
static struct worker_blob *blob_slot(struct vctx *c)
{
    struct worker_blob *lru = &c->blobs[0];
    for (int i = 0; i < MAX_CTX_BLOBS; i++) {
        struct worker_blob *b = &c->blobs[i];
        struct apir_mapping m;
        if (!b->worker_id)
            return b;
        if (!apir_virgl_mapping_at(b->ptr, &m) || m.dev != b->dev || m.ino != b->ino) {
            blob_drop(c, b);
            return b;
        }
        if (b->used < lru->used)
            lru = b;
    }
    blob_drop(c, lru);
    return lru;
}

/*
 * The worker's id for blob res_id, given to the worker now if it does not
 * hold it yet; 0: refused (logged).
 *
 * virglrenderer's get_shmem_ptr gives an address and no size.  The blob is
 * the shared mapping that address starts (apir_virgl_mapping_at), its size
 * the hypervisor's (get_shmem_size, the apir extension) or else the
 * mapping's, never more than the mapping: the worker maps that file, from
 * its start, that many bytes - nothing of the hypervisor's but the blob.
 * The worker keeps it across commands (a blob given per command would cost
 * a descriptor and a mapping each time); every command checks that the
 * address still holds the same file, since the guest can destroy a blob
 * and reuse its res_id at any time, and a stale entry is replaced.
 */
static uint32_t blob_bind(struct vctx *c, uint32_t res_id)
{
    void *p = c->cbs->get_shmem_ptr(c->ctx_id, res_id);
    struct apir_mapping m;
    const char *why = NULL;
    uint64_t size = 0;
    if (!p)
        why = "not a shared-memory resource of this context";
    else if (!apir_virgl_mapping_at(p, &m) || (uintptr_t)p != m.start || m.offset != 0)
        why = "not the start of a mapping of its own";
    else {
        size = m.end - m.start;
        if (c->has_size_cb) {
            const uint64_t s = ((const struct apir_virgl_callbacks *)c->cbs)->get_shmem_size(c->ctx_id, res_id);
            size = s < size ? s : size;
        }
        if (!size)
            why = "of size 0";
    }
    struct worker_blob *b = NULL;
    for (int i = 0; !why && i < MAX_CTX_BLOBS && !b; i++)
        if (c->blobs[i].worker_id && c->blobs[i].res_id == res_id)
            b = &c->blobs[i];
    if (b && blob_current(b, p, &m, size)) {
        b->used = ++c->tick;
        return b->worker_id;
    }
    if (b)
        blob_drop(c, b);
    const int fd = why ? -1 : apir_virgl_mapping_fd(&m, size, &why);
    if (fd >= 0) {
        b = b ? b : blob_slot(c);
        const uint32_t id = c->next_worker_id++;
        if (c->next_worker_id < APIR_SHM_FIRST_RES_ID)
            c->next_worker_id = APIR_SHM_FIRST_RES_ID;
        if (apir_worker_link_blob_add(c->link, fd, id, size))
            *b = (struct worker_blob){ .res_id = res_id, .worker_id = id, .ptr = p, .size = size, .dev = m.dev,
                                       .ino = m.ino, .used = ++c->tick };
        else
            why = "refused by the worker";
        close(fd);
    }
    if (why) {
        APIR_WARN("virgl", "ctx %u: blob %u refused: %s", c->ctx_id, res_id, why);
        return 0;
    }
    return b->worker_id;
}

/* Copies the request into the worker's command area with each res_id item
 * replaced by the worker's id for that blob; false: refused.  The blobs
 * first: giving one uses the command area too. */
static bool request_to_worker(struct vctx *c, uint32_t cmd, const char *req, size_t len)
{
    size_t at[MAX_CMD_BLOBS];
    uint32_t ids[MAX_CMD_BLOBS];
    const int n = request_res_ids(cmd, req, len, at);
    if (n < 0 || len > APIR_MAX_COMMAND_SIZE - APIR_CMD_HEADER_SIZE) {
        APIR_WARN("virgl", "ctx %u: %s: malformed or too long request (%zu bytes)", c->ctx_id, apir_command_name(cmd),
                  len);
        return false;
    }
    for (int i = 0; i < n; i++) {
        uint32_t res_id;
        memcpy(&res_id, req + at[i], sizeof(res_id));
        if (!(ids[i] = blob_bind(c, res_id)))
            return false;
    }
    uint8_t *dst = apir_worker_link_begin(c->link, len);
    if (!dst)
        return false;
    if (len)
        memcpy(dst, req, len);
    for (int i = 0; i < n; i++) {
        /* Wire order, as the decoder reads it. */
        struct apir_encoder patch;
        apir_encoder_init(&patch, dst + at[i], sizeof(ids[i]));
        apir_encode_u32(&patch, ids[i]);
    }
    return true;
}

/* ---- commands ---------------------------------------------------------------------- */

/* One command through the context's worker: its reply items copied into
 * [reply_cur, reply_end), bounded by both. */
static uint32_t forward(struct vctx *c, uint32_t cmd, const char *req, size_t len, char *reply_cur,
                        const char *reply_end, char **reply_cur_after)
{
    if (!request_to_worker(c, cmd, req, len))
        return APIR_HANDLER_BAD_REQUEST;
    uint32_t ret;
    if (!apir_worker_link_submit(c->link, APIR_CMD_TYPE_FORWARD, (int32_t)cmd, &ret))
        return APIR_HANDLER_FAILED;
    if (ret < APIR_FORWARD_BASE)
        return APIR_HANDLER_FAILED;
    size_t n;
    const uint8_t *items = apir_worker_link_reply(c->link, &n);
    const size_t cap = (size_t)(reply_end - reply_cur);
    memcpy(reply_cur, items, n < cap ? n : cap);
    *reply_cur_after = reply_cur + (n < cap ? n : cap);
    return n > cap ? APIR_HANDLER_REPLY_FULL : ret - APIR_FORWARD_BASE;
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
    if (cbs && cbs->get_shmem_ptr)
        c->cbs = cbs;
    const size_t req_len = req_cur ? (size_t)(req_end - req_cur) : 0;
    uint32_t result;
    if (cmd == APIR_CMD_DEVICE_BUFFER_FROM_PTR) {
        /* A buffer wrapping a blob would outlive it: the hypervisor frees
         * blob memory when the guest drops the resource, without asking. */
        APIR_WARN("virgl", "ctx %u: DEVICE_BUFFER_FROM_PTR refused: blob lifetimes are the hypervisor's", ctx_id);
        result = APIR_HANDLER_BAD_REQUEST;
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
    } else {
        result = forward(c, cmd, req_cur, req_len, reply_cur, reply_end, reply_cur_after);
    }
    c->n_commands++;
    if (result != APIR_HANDLER_OK)
        c->n_refused++;
    pthread_mutex_unlock(&c->lock);
    ctx_put(c);
    return result;
}
