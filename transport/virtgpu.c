/*
 * The guest side of the "virtgpu" transport: APIR over a virtio-gpu render
 * node, for guests in a VM whose hypervisor runs virglrenderer with its API
 * remoting component (APIR 0.1 section 2).
 *
 *   APIR_HOST=virtgpu                    first render node whose driver is virtio_gpu
 *   APIR_HOST=virtgpu:/dev/dri/renderD129
 *   APIR_VIRTGPU_CAPSET=apir|venus|N     capset (default apir = 10; venus = 4
 *                                        adds 331 to every command type)
 *   APIR_SPIN_US, APIR_VIRTGPU_SLEEP_MAX_US  reply wait (see wait_reply)
 *
 * One connection is one DRM file description and one virtio-gpu context on
 * it, so the host library sees one ctx_id (one isolated session) per guest
 * device connection.  Memory the two sides share is blob resources the host
 * allocates (HOST3D, mappable), which the guest maps through DRM_VIRTGPU_MAP;
 * the host names them by res_id.  A command is an EXECBUFFER on ring 0; the
 * kernel returns as soon as it queued it and there is no completion event
 * (POLL_RINGS_MASK 0), so the reply is found by watching the reply word.
 *
 * virglrenderer answers HANDSHAKE and LOADLIBRARY itself; only FORWARD
 * reaches the host library.  That shapes two things here:
 *  - our guest core (remote.c) sends HANDSHAKE but knows nothing of
 *    LOADLIBRARY, so this transport sends LOADLIBRARY right after the first
 *    successful HANDSHAKE, in the reference guest's order;
 *  - the HANDSHAKE answer is virglrenderer's compile-time version, which
 *    says nothing about which commands the host *library* knows (the pinned
 *    reference calls its 23-command set "0.2").  So after loading the library
 *    the transport asks it directly: a FORWARD of HOST_GET_VERSION (apir
 *    0.3), which answers the library's own major and minor.  A library
 *    older than that command answers "invalid index"; then a FORWARD of
 *    DEVICE_SELECT(0), an apir 0.2 command that is harmless (device 0 is the
 *    default), tells an apir 0.2 library (it runs it) from the reference
 *    (invalid index again).  The minor handed to the guest core is
 *    min(its own minor, the library's): 3 for ours today, 2 for an apir
 *    library without the version query, 1 for the reference; the guest sends
 *    commands beyond 0.1 only when it is more than 1.  An apir library
 *    (host/virgl/virgl.c) never sees the handshake and runs every command up to
 *    APIR_VERSION_MINOR.  docs/PROTOCOL.md section 9 has the whole path.
 *
 * Every failure returns an error to the caller; nothing here aborts.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "transport.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <sys/ioctl.h>

#include <drm.h>
#include <virtgpu_drm.h>

/*
 * Kernel ABI newer than Debian's libdrm copy of virtgpu_drm.h (2.4.114 stops
 * before blob resources and context init).  These are the stable uAPI of
 * Linux >= 5.16, under our own names so that a newer system header cannot
 * clash with them.  EXECBUFFER is declared with its full current size: the
 * DRM core copies what the kernel knows and ignores (zero) the rest, so the
 * same binary works on kernels from 5.16 on.
 */
#define VGPU_PARAM_RESOURCE_BLOB        3
#define VGPU_PARAM_HOST_VISIBLE         4
#define VGPU_PARAM_CONTEXT_INIT         6
#define VGPU_PARAM_SUPPORTED_CAPSET_IDS 7

#define VGPU_EXECBUF_RING_IDX           0x04u
#define VGPU_BLOB_MEM_HOST3D            0x0002u
#define VGPU_BLOB_FLAG_USE_MAPPABLE     0x0001u
#define VGPU_CONTEXT_PARAM_CAPSET_ID    0x0001u
#define VGPU_CONTEXT_PARAM_NUM_RINGS    0x0002u
#define VGPU_CONTEXT_PARAM_POLL_RINGS_MASK 0x0003u

struct vgpu_execbuffer {
    uint32_t flags;
    uint32_t size;
    uint64_t command;
    uint64_t bo_handles;
    uint32_t num_bo_handles;
    int32_t fence_fd;
    uint32_t ring_idx;
    uint32_t syncobj_stride;
    uint32_t num_in_syncobjs;
    uint32_t num_out_syncobjs;
    uint64_t in_syncobjs;
    uint64_t out_syncobjs;
};
_Static_assert(sizeof(struct vgpu_execbuffer) == 64, "execbuffer uAPI layout");

struct vgpu_create_blob {
    uint32_t blob_mem;
    uint32_t blob_flags;
    uint32_t bo_handle;
    uint32_t res_handle;
    uint64_t size;
    uint32_t pad;
    uint32_t cmd_size;
    uint64_t cmd;
    uint64_t blob_id;
};
_Static_assert(sizeof(struct vgpu_create_blob) == 48, "create_blob uAPI layout");

struct vgpu_context_set_param {
    uint64_t param;
    uint64_t value;
};

struct vgpu_context_init {
    uint32_t num_params;
    uint32_t pad;
    uint64_t ctx_set_params;
};

#define VGPU_IOCTL_EXECBUFFER  DRM_IOWR(DRM_COMMAND_BASE + 0x02, struct vgpu_execbuffer)
#define VGPU_IOCTL_CREATE_BLOB DRM_IOWR(DRM_COMMAND_BASE + 0x0a, struct vgpu_create_blob)
#define VGPU_IOCTL_CONTEXT_INIT DRM_IOWR(DRM_COMMAND_BASE + 0x0b, struct vgpu_context_init)

/* The APIR capset's data (24 bytes). */
struct vgpu_capset_apir {
    uint32_t apir_version;
    uint32_t supports_blob_resources;
    uint32_t reserved[4];
};

#define LOADLIBRARY_TIMEOUT_NS (60ull * 1000 * 1000 * 1000)
/* While asleep on a reply, look at the device this often.  A real
 * virtio-gpu node never reports a hang-up (the host dies with the VM); the
 * test rig's does when the simulated hypervisor dies, and then we fail
 * instead of waiting forever. */
#define DEVICE_CHECK_NS (50ull * 1000 * 1000)
/* Backoff sleeps start here and double up to APIR_VIRTGPU_SLEEP_MAX_US. */
#define SLEEP_MIN_NS 1000ull
#define SLEEP_MAX_US_DEFAULT 50u

struct vgpu_blob {
    uint32_t res_id;
    uint32_t bo_handle;
    uint8_t *ptr;
    size_t size;
};

struct vgpu_transport {
    struct apir_transport base;
    int fd;
    uint32_t capset_id;
    uint32_t type_offset;          /* 331 on the Venus capset, else 0 */
    struct vgpu_blob reply;
    struct vgpu_blob *blobs;       /* blobs handed out by blob_create */
    uint32_t n_blobs, blobs_cap;
    bool library_loaded;
    uint8_t handshake_reply[8];    /* major, minor as handed to the caller */
    uint64_t spin_ns;
    uint64_t sleep_max_ns;
    struct apir_encoder enc;
    uint8_t cmd[APIR_MAX_COMMAND_SIZE];
};

static int vgpu_ioctl(int fd, unsigned long request, void *arg)
{
    /* Restarted on EINTR/EAGAIN, as libdrm's drmIoctl does (a signal or a
     * busy device); this file needs nothing else of libdrm. */
    int r;
    do
        r = ioctl(fd, request, arg);
    while (r == -1 && (errno == EINTR || errno == EAGAIN));
    return r;
}

static size_t round_blob(size_t size)
{
    if (size == 0 || size > SIZE_MAX - (APIR_BLOB_ALIGN - 1))
        return 0;
    return (size + APIR_BLOB_ALIGN - 1) & ~(size_t)(APIR_BLOB_ALIGN - 1);
}

static void gem_close(int fd, uint32_t handle)
{
    struct drm_gem_close c = { .handle = handle };
    vgpu_ioctl(fd, DRM_IOCTL_GEM_CLOSE, &c);
}

/* A host blob of size bytes (already rounded), mapped into this process. */
static int blob_new(struct vgpu_transport *v, size_t size, struct vgpu_blob *out)
{
    struct vgpu_create_blob cb = {
        .blob_mem = VGPU_BLOB_MEM_HOST3D,
        .blob_flags = VGPU_BLOB_FLAG_USE_MAPPABLE,
        .size = size,
        .blob_id = 0,
    };
    if (vgpu_ioctl(v->fd, VGPU_IOCTL_CREATE_BLOB, &cb) != 0) {
        APIR_ERROR("guest", "virtgpu: cannot create a %zu-byte blob resource: %s", size, strerror(errno));
        return -1;
    }
    struct drm_virtgpu_map map = { .handle = cb.bo_handle };
    void *p = MAP_FAILED;
    if (vgpu_ioctl(v->fd, DRM_IOCTL_VIRTGPU_MAP, &map) == 0)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, (off_t)map.offset);
    if (p == MAP_FAILED) {
        APIR_ERROR("guest", "virtgpu: cannot map blob resource %u: %s", cb.res_handle, strerror(errno));
        gem_close(v->fd, cb.bo_handle);
        return -1;
    }
    *out = (struct vgpu_blob){ .res_id = cb.res_handle, .bo_handle = cb.bo_handle, .ptr = p, .size = size };
    return 0;
}

static void blob_free(struct vgpu_transport *v, struct vgpu_blob *b)
{
    if (b->ptr)
        munmap(b->ptr, b->size);
    if (b->bo_handle)
        gem_close(v->fd, b->bo_handle);
    memset(b, 0, sizeof(*b));
}

/* True once the device reports a hang-up (only the test rig's can). */
static bool device_gone(const struct vgpu_transport *v)
{
    struct pollfd p = { .fd = v->fd, .events = 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/*
 * Waits for the reply word (byte 0 of the reply blob) to become non-zero.
 *
 * Who could wake us: nobody.  The host writes the word into memory that is
 * mapped into the guest; it cannot signal a guest futex, and with
 * POLL_RINGS_MASK 0 no fence event arrives either (a futex on such a
 * mapping would not even work: host-visible blobs are PFN mappings, which
 * futexes reject).  So the only tools are spinning and sleeping:
 *
 *  1. spin for APIR_SPIN_US (default 100 us): most commands (queries, small
 *     tensor transfers) complete inside that, at memory-latency cost;
 *  2. then sleep with exponential backoff, 1 us doubling up to
 *     APIR_VIRTGPU_SLEEP_MAX_US (default 50 us), so a long graph costs
 *     almost no guest CPU and is noticed at most one sleep late.  The
 *     reference sleeps a fixed 15 us between polls from the start, which
 *     makes every short command pay a timer wake-up (~60 us with the
 *     default 50 us timer slack) and every long one ~66k wake-ups a second.
 */
static int wait_reply(struct vgpu_transport *v, uint64_t timeout_ns, const char *what, uint32_t *value)
{
    _Atomic uint32_t *word = (_Atomic uint32_t *)(void *)v->reply.ptr;
    uint32_t w = apir_spin_while_equal(word, 0, v->spin_ns);
    if (w) {
        *value = w;
        return 0;
    }
    uint64_t start = apir_now_ns(), last_check = start, sleep_ns = SLEEP_MIN_NS;
    for (;;) {
        struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)sleep_ns };
        nanosleep(&ts, NULL);
        w = atomic_load_explicit(word, memory_order_acquire);
        if (w)
            break;
        if (sleep_ns < v->sleep_max_ns)
            sleep_ns = sleep_ns * 2 < v->sleep_max_ns ? sleep_ns * 2 : v->sleep_max_ns;
        uint64_t now = apir_now_ns();
        if (timeout_ns && now - start > timeout_ns) {
            APIR_ERROR("guest", "virtgpu: no answer to %s within %llu ms", what,
                       (unsigned long long)(timeout_ns / 1000000));
            return -1;
        }
        if (now - last_check > DEVICE_CHECK_NS) {
            last_check = now;
            if (device_gone(v)) {
                APIR_ERROR("guest", "virtgpu: the device at %s went away during %s", v->base.endpoint, what);
                return -1;
            }
        }
    }
    *value = w;
    return 0;
}

/*
 * Sends the command in v->cmd (len bytes, header included) and waits.  The
 * header is written here.  On success *ret is the return value and *reply
 * decodes the reply items.
 */
static int call(struct vgpu_transport *v, int32_t cmd_type, int32_t cmd_flags, size_t len, uint64_t timeout_ns,
                const char *what, uint32_t *ret, struct apir_decoder *reply)
{
    struct apir_encoder hdr_enc;
    apir_encoder_init(&hdr_enc, v->cmd, APIR_CMD_HEADER_SIZE);
    struct apir_cmd_header hdr = { cmd_type + (int32_t)v->type_offset, cmd_flags, v->reply.res_id };
    apir_encode_header(&hdr_enc, &hdr);

    /* Zero the word before the command can be seen; the ioctl is a system
     * call, and the kernel's virtqueue kick orders it before the host runs. */
    _Atomic uint32_t *word = (_Atomic uint32_t *)(void *)v->reply.ptr;
    atomic_store_explicit(word, 0, memory_order_seq_cst);

    struct vgpu_execbuffer eb = {
        .flags = VGPU_EXECBUF_RING_IDX,
        .size = (uint32_t)len,
        .command = (uint64_t)(uintptr_t)v->cmd,
        .ring_idx = 0,
    };
    if (vgpu_ioctl(v->fd, VGPU_IOCTL_EXECBUFFER, &eb) != 0) {
        APIR_ERROR("guest", "virtgpu: EXECBUFFER of %s failed: %s", what, strerror(errno));
        v->base.broken = true;
        return -1;
    }
    uint32_t w;
    if (wait_reply(v, timeout_ns, what, &w) != 0) {
        /* A late reply would land in the page we reuse: stop using it. */
        v->base.broken = true;
        return -1;
    }
    *ret = w - 1;
    apir_decoder_init(reply, v->reply.ptr + 4, v->reply.size - 4);
    return 0;
}

/* What a LOADLIBRARY code means (section 2; virglrenderer adds 6 to
 * whatever the host library's initialize returned, so library codes appear
 * here offset twice). */
static const char *load_error(uint32_t code)
{
    static const char *const hv[] = {
        [1] = "the hypervisor could not set up API remoting",
        [3] = "the hypervisor has no host library configured",
        [4] = "the hypervisor cannot open the host library",
        [5] = "the host library lacks the apir_backend_* entry points",
    };
    static const char *const lib[] = {
        [3] = "the host library has no ggml.library.path configured",
        [4] = "the host library cannot open the ggml backend library",
        [5] = "the ggml backend library lacks its registration function",
    };
    static const char *const init[] = {
        [1] = "cannot open the backend library", [2] = "cannot open the ggml library",
        [3] = "backend symbols missing",         [4] = "ggml symbols missing",
        [5] = "backend failed",                  [6] = "backend registration failed",
        [7] = "already initialized",             [8] = "no device",
        [9] = "backend initialization failed",
    };
    if (code < APIR_LOAD_HOST_BASE)
        return code < sizeof(hv) / sizeof(hv[0]) && hv[code] ? hv[code] : "unknown hypervisor error";
    uint32_t l = code - APIR_LOAD_HOST_BASE;
    if (l < APIR_LOAD_HOST_BASE)
        return l < sizeof(lib) / sizeof(lib[0]) && lib[l] ? lib[l] : "unknown host library error";
    uint32_t i = l - APIR_LOAD_HOST_BASE;
    return i < sizeof(init) / sizeof(init[0]) && init[i] ? init[i] : "unknown backend initialization error";
}

static int load_library(struct vgpu_transport *v)
{
    uint32_t ret;
    struct apir_decoder reply;
    if (call(v, APIR_CMD_TYPE_LOADLIBRARY, 0, APIR_CMD_HEADER_SIZE, LOADLIBRARY_TIMEOUT_NS, "LOADLIBRARY", &ret, &reply) != 0)
        return -1;
    if (ret != APIR_LOAD_SUCCESS && ret != APIR_LOAD_ALREADY_LOADED) {
        APIR_ERROR("guest", "virtgpu: the host could not load its library (code %u): %s", ret, load_error(ret));
        return -1;
    }
    v->library_loaded = true;
    return 0;
}

/* One FORWARD of the request already in enc, for the version questions
 * (see the top of the file); the handler result, or -1 when the library did
 * not answer. */
static int forward_bare(struct vgpu_transport *v, uint32_t cmd, const struct apir_encoder *enc, const char *what,
                        struct apir_decoder *reply)
{
    uint32_t ret;
    if (call(v, APIR_CMD_TYPE_FORWARD, (int32_t)cmd, apir_encoder_used(enc), LOADLIBRARY_TIMEOUT_NS, what, &ret, reply) != 0)
        return -1;
    return ret >= APIR_FORWARD_BASE ? (int)(ret - APIR_FORWARD_BASE) : -1;
}

/* The host library's protocol minor.  See the top of the file. */
static uint32_t library_minor(struct vgpu_transport *v)
{
    struct apir_encoder enc;
    struct apir_decoder reply;
    apir_encoder_init(&enc, v->cmd, sizeof(v->cmd));
    apir_encode_reserve(&enc, APIR_CMD_HEADER_SIZE);
    uint32_t major = 0, minor = 1;
    int rc = forward_bare(v, APIR_CMD_HOST_GET_VERSION, &enc, "the version query", &reply);
    if (rc == APIR_HANDLER_OK && apir_decode_reply_HOST_GET_VERSION(&reply, &major, &minor) && major == APIR_VERSION_MAJOR &&
        minor >= APIR_VERSION_MINOR_REFERENCE) {
        APIR_INFO("guest", "virtgpu: the host library speaks APIR %u.%u", major, minor);
        return minor;
    }
    if (v->base.broken)
        return 1;
    /* Older: an apir 0.2 library runs DEVICE_SELECT, the reference does not. */
    apir_encoder_init(&enc, v->cmd, sizeof(v->cmd));
    apir_encode_reserve(&enc, APIR_CMD_HEADER_SIZE);
    apir_encode_request_DEVICE_SELECT(&enc, 0);
    rc = forward_bare(v, APIR_CMD_DEVICE_SELECT, &enc, "the protocol probe", &reply);
    minor = rc == APIR_HANDLER_OK ? apir_command_since(APIR_CMD_DEVICE_SELECT) : APIR_VERSION_MINOR_REFERENCE;
    APIR_INFO("guest", "virtgpu: the host library has no version query; it %s apir 0.2 commands",
              rc == APIR_HANDLER_OK ? "runs" : "does not run");
    return minor;
}

/*
 * HANDSHAKE, then (once per connection) LOADLIBRARY and the version query.
 * The caller gets the handshake's return value and a reply of two items
 * (major, minor) whose minor is the library's, not virglrenderer's.
 */
static int handshake(struct vgpu_transport *v, size_t len, uint64_t timeout_ns, uint32_t *ret, struct apir_decoder *reply)
{
    /* The guest's own version, from the request it wrote. */
    struct apir_decoder req;
    apir_decoder_init(&req, v->cmd + APIR_CMD_HEADER_SIZE, len - APIR_CMD_HEADER_SIZE);
    apir_decode_u32(&req);
    uint32_t guest_minor = apir_decode_u32(&req);

    if (call(v, APIR_CMD_TYPE_HANDSHAKE, 0, len, timeout_ns, "HANDSHAKE", ret, reply) != 0)
        return -1;
    uint32_t major = apir_decode_u32(reply);
    uint32_t minor = apir_decode_u32(reply);
    if (*ret != APIR_HANDSHAKE_MAGIC || reply->fatal || major != APIR_VERSION_MAJOR) {
        /* Not ours to judge: the caller reports the mismatch. */
        apir_decoder_init(reply, v->reply.ptr + 4, v->reply.size - 4);
        return 0;
    }
    APIR_INFO("guest", "virtgpu: hypervisor speaks APIR %u.%u", major, minor);
    if (!v->library_loaded && load_library(v) != 0) {
        v->base.broken = true;
        return -1;
    }
    if (guest_minor > APIR_VERSION_MINOR_REFERENCE) {
        uint32_t lib = library_minor(v);
        minor = guest_minor < lib ? guest_minor : lib;
    } else {
        minor = guest_minor;
    }
    if (v->base.broken)
        return -1;  /* the query got no answer */
    struct apir_encoder out;
    apir_encoder_init(&out, v->handshake_reply, sizeof(v->handshake_reply));
    apir_encode_u32(&out, major);
    apir_encode_u32(&out, minor);
    *ret = APIR_HANDSHAKE_MAGIC;
    apir_decoder_init(reply, v->handshake_reply, sizeof(v->handshake_reply));
    return 0;
}

static struct apir_encoder *vgpu_begin(struct apir_transport *t)
{
    struct vgpu_transport *v = (struct vgpu_transport *)t;
    apir_encoder_init(&v->enc, v->cmd, sizeof(v->cmd));
    apir_encode_reserve(&v->enc, APIR_CMD_HEADER_SIZE);
    return &v->enc;
}

static int vgpu_submit(struct apir_transport *t, int32_t cmd_type, int32_t cmd_flags,
                       const struct apir_submit_opts *opts, uint32_t *ret, struct apir_decoder *reply)
{
    struct vgpu_transport *v = (struct vgpu_transport *)t;
    /* Of the options only the timeout is used: every reply is waited for
     * with wait_reply's own spin, and posting and wait work are optional
     * (transport.h). */
    const uint64_t timeout_ns = apir_submit_opts_or_defaults(opts)->timeout_ns;
    if (t->broken)
        return -1;
    if (v->enc.fatal) {
        APIR_ERROR("guest", "virtgpu: command does not fit the %zu-byte command buffer", sizeof(v->cmd));
        return -1;
    }
    size_t len = apir_encoder_used(&v->enc);
    if (cmd_type == APIR_CMD_TYPE_HANDSHAKE)
        return handshake(v, len, timeout_ns, ret, reply);
    if (cmd_type == APIR_CMD_TYPE_FORWARD && !v->library_loaded) {
        APIR_ERROR("guest", "virtgpu: FORWARD before a successful HANDSHAKE");
        return -1;
    }
    return call(v, cmd_type, cmd_flags, len, timeout_ns, cmd_type == APIR_CMD_TYPE_FORWARD ?
                apir_command_name((uint32_t)cmd_flags) : "command", ret, reply);
}

static int vgpu_blob_create(struct apir_transport *t, size_t size, uint32_t *res_id, void **ptr)
{
    struct vgpu_transport *v = (struct vgpu_transport *)t;
    size_t rounded = round_blob(size);
    if (!rounded) {
        APIR_ERROR("guest", "virtgpu: blob size %zu out of range", size);
        return -1;
    }
    if (v->n_blobs == v->blobs_cap) {
        uint32_t cap = v->blobs_cap ? v->blobs_cap * 2 : 8;
        struct vgpu_blob *b = realloc(v->blobs, cap * sizeof(*b));
        if (!b)
            return -1;
        v->blobs = b;
        v->blobs_cap = cap;
    }
    struct vgpu_blob b;
    if (blob_new(v, rounded, &b) != 0)
        return -1;
    v->blobs[v->n_blobs++] = b;
    *res_id = b.res_id;
    *ptr = b.ptr;
    return 0;
}

static void vgpu_blob_destroy(struct apir_transport *t, uint32_t res_id, void *ptr, size_t size)
{
    struct vgpu_transport *v = (struct vgpu_transport *)t;
    for (uint32_t i = 0; i < v->n_blobs; i++) {
        if (v->blobs[i].res_id == res_id && v->blobs[i].ptr == ptr) {
            blob_free(v, &v->blobs[i]);
            v->blobs[i] = v->blobs[--v->n_blobs];
            return;
        }
    }
    APIR_WARN("guest", "virtgpu: destroying unknown blob %u (%zu bytes)", res_id, size);
}

static void vgpu_close(struct apir_transport *t)
{
    struct vgpu_transport *v = (struct vgpu_transport *)t;
    for (uint32_t i = 0; i < v->n_blobs; i++)
        blob_free(v, &v->blobs[i]);
    free(v->blobs);
    blob_free(v, &v->reply);
    /* Closing the node destroys the context: the host library's
     * apir_backend_deinit frees everything this connection held. */
    close(v->fd);
    free(v);
}

static const struct apir_transport_ops vgpu_ops = {
    .begin = vgpu_begin,
    .submit = vgpu_submit,
    .blob_create = vgpu_blob_create,
    .blob_destroy = vgpu_blob_destroy,
    .close = vgpu_close,
};

/* Opens path if its DRM driver is virtio_gpu 0.x; -2 if there is no such
 * file, -1 otherwise (why in err). */
static int open_node(const char *path, char *err, size_t err_len)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, err_len, "cannot open %s: %s", path, strerror(e));
        return e == ENOENT ? -2 : -1;
    }
    /* DRM_IOCTL_VERSION with room for the driver name only. */
    char name[32] = "";
    struct drm_version ver = { .name = name, .name_len = sizeof(name) - 1 };
    bool ok = vgpu_ioctl(fd, DRM_IOCTL_VERSION, &ver) == 0 && strcmp(name, "virtio_gpu") == 0 && ver.version_major == 0;
    if (!ok)
        snprintf(err, err_len, "%s is not a virtio-gpu node (driver %s)", path, name[0] ? name : "unknown");
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool getparam(int fd, uint64_t param, uint64_t *value)
{
    /* The kernel writes only the low 32 bits. */
    uint64_t v = 0;
    struct drm_virtgpu_getparam gp = { .param = param, .value = (uint64_t)(uintptr_t)&v };
    if (vgpu_ioctl(fd, DRM_IOCTL_VIRTGPU_GETPARAM, &gp) != 0)
        return false;
    *value = v;
    return true;
}

static bool parse_capset(uint32_t *id, uint32_t *offset, char *err, size_t err_len)
{
    const char *s = getenv("APIR_VIRTGPU_CAPSET");
    *id = APIR_CAPSET_ID;
    *offset = 0;
    if (!s || !*s || strcmp(s, "apir") == 0)
        return true;
    if (strcmp(s, "venus") == 0) {
        *id = APIR_CAPSET_ID_VENUS;
    } else {
        char *end;
        unsigned long n = strtoul(s, &end, 10);
        if (*end || n == 0 || n > 63) {
            snprintf(err, err_len, "APIR_VIRTGPU_CAPSET=%s: use apir, venus or a capset number", s);
            return false;
        }
        *id = (uint32_t)n;
    }
    if (*id == APIR_CAPSET_ID_VENUS)
        *offset = APIR_VENUS_CMD_OFFSET;
    return true;
}

/* Capability checks, the capset and the context. */
static bool init_context(struct vgpu_transport *v, char *err, size_t err_len)
{
    uint64_t blob = 0, visible = 0, ctx_init = 0, capsets = 0;
    if (!getparam(v->fd, VGPU_PARAM_CONTEXT_INIT, &ctx_init) || !ctx_init ||
        !getparam(v->fd, VGPU_PARAM_RESOURCE_BLOB, &blob) || !blob ||
        !getparam(v->fd, VGPU_PARAM_HOST_VISIBLE, &visible) || !visible) {
        snprintf(err, err_len, "virtio-gpu lacks context init, blob resources or host-visible memory "
                 "(kernel >= 5.16 and a hypervisor with blob support are needed)");
        return false;
    }
    if (getparam(v->fd, VGPU_PARAM_SUPPORTED_CAPSET_IDS, &capsets) && !(capsets & (1ull << v->capset_id))) {
        snprintf(err, err_len, "the hypervisor offers no capset %u (capset mask %#llx)%s", v->capset_id,
                 (unsigned long long)capsets,
                 v->capset_id == APIR_CAPSET_ID ? "; APIR_VIRTGPU_CAPSET=venus selects the transitional Venus capset" : "");
        return false;
    }
    struct vgpu_capset_apir caps;
    memset(&caps, 0, sizeof(caps));
    struct drm_virtgpu_get_caps gc = {
        .cap_set_id = v->capset_id, .cap_set_ver = 0, .addr = (uint64_t)(uintptr_t)&caps, .size = sizeof(caps),
    };
    if (vgpu_ioctl(v->fd, DRM_IOCTL_VIRTGPU_GET_CAPS, &gc) != 0) {
        snprintf(err, err_len, "cannot read capset %u: %s", v->capset_id, strerror(errno));
        return false;
    }
    /* The Venus capset's data is Venus's own: nothing APIR to check there. */
    if (v->capset_id == APIR_CAPSET_ID && !caps.supports_blob_resources) {
        snprintf(err, err_len, "the APIR capset says the host has no blob resources");
        return false;
    }
    struct vgpu_context_set_param params[3] = {
        { VGPU_CONTEXT_PARAM_CAPSET_ID, v->capset_id },
        { VGPU_CONTEXT_PARAM_NUM_RINGS, 1 },
        { VGPU_CONTEXT_PARAM_POLL_RINGS_MASK, 0 },  /* no fence events: we watch the reply word */
    };
    struct vgpu_context_init ci = { .num_params = 3, .ctx_set_params = (uint64_t)(uintptr_t)params };
    if (vgpu_ioctl(v->fd, VGPU_IOCTL_CONTEXT_INIT, &ci) != 0) {
        snprintf(err, err_len, "cannot create a context on capset %u: %s", v->capset_id, strerror(errno));
        return false;
    }
    return true;
}

struct apir_transport *apir_virtgpu_connect(const char *node, char *err, size_t err_len);

struct apir_transport *apir_virtgpu_connect(const char *node, char *err, size_t err_len)
{
    struct vgpu_transport *v = calloc(1, sizeof(*v));
    if (!v) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    v->fd = -1;
    if (!parse_capset(&v->capset_id, &v->type_offset, err, err_len))
        goto fail;
    char path[64];
    if (node && *node) {
        snprintf(path, sizeof(path), "%s", node);
        v->fd = open_node(path, err, err_len);
    } else {
        /* Render nodes are renderD128 .. renderD191. */
        char why[160] = "no render node found";
        for (int i = 128; i < 192 && v->fd < 0; i++) {
            snprintf(path, sizeof(path), "/dev/dri/renderD%d", i);
            char e[160];
            int fd = open_node(path, e, sizeof(e));
            if (fd == -1)
                snprintf(why, sizeof(why), "%s", e);
            v->fd = fd < 0 ? -1 : fd;
        }
        if (v->fd < 0)
            snprintf(err, err_len, "no virtio-gpu render node in /dev/dri (%s)", why);
    }
    if (v->fd < 0)
        goto fail;
    snprintf(v->base.endpoint, sizeof(v->base.endpoint), "virtgpu:%s", path);
    if (!init_context(v, err, err_len))
        goto fail;
    if (blob_new(v, APIR_REPLY_BLOB_SIZE, &v->reply) != 0) {
        snprintf(err, err_len, "cannot create the reply blob on %s", path);
        goto fail;
    }
    v->base.ops = &vgpu_ops;
    v->spin_ns = (uint64_t)apir_spin_us() * 1000;
    uint64_t max_us = SLEEP_MAX_US_DEFAULT;
    const char *s = getenv("APIR_VIRTGPU_SLEEP_MAX_US");
    if (s && *s) {
        long n = strtol(s, NULL, 10);
        if (n >= 1 && n <= 100000)
            max_us = (uint64_t)n;
    }
    v->sleep_max_ns = max_us * 1000;
    APIR_INFO("guest", "virtgpu: %s, capset %u, reply blob res %u", path, v->capset_id, v->reply.res_id);
    return &v->base;
fail:
    if (v->fd >= 0) {
        blob_free(v, &v->reply);
        close(v->fd);
    }
    free(v);
    return NULL;
}
