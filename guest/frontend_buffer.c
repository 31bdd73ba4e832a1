/*
 * Buffer type and buffers of an APIR device: every operation is a command;
 * tensor data travels through the connection's data area in chunks.
 */
#include "frontend.h"
#include "calls.h"
#include "download.h"
#include "weight_cache_guest.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "wait.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static const char *buft_get_name(ggml_backend_buffer_type_t buft)
{
    return ((struct apir_buft_ctx *)buft->context)->name;
}

static size_t buft_get_alignment(ggml_backend_buffer_type_t buft)
{
    return ((struct apir_buft_ctx *)buft->context)->alignment;
}

static size_t buft_get_max_size(ggml_backend_buffer_type_t buft)
{
    return ((struct apir_buft_ctx *)buft->context)->max_size;
}

static struct apir_device *buft_device(ggml_backend_buffer_type_t buft)
{
    return buft->device->context;
}

/*
 * Host buffer types whose get_alloc_size the pinned ggml defines simply
 * enough for the guest to answer alloc-size questions itself instead of
 * asking per tensor shape (a decode step whose shapes grow asked about each
 * new one).  An allowlist by name; any other buffer type is asked.
 *   "CPU"            leaves get_alloc_size unset: ggml_nbytes.
 *   "CUDA<n>"        ggml_backend_cuda_buffer_type_get_alloc_size: ggml_nbytes,
 *                    except a FLASH_ATTN_EXT result (its own scratch) and
 *                    quantized tensors (rows padded): those are asked.
 */
enum apir_alloc_rule apir_buft_alloc_rule(const char *remote_name)
{
    if (!strcmp(remote_name, "CPU"))
        return APIR_ALLOC_NBYTES;
    if (!strncmp(remote_name, "CUDA", 4) && remote_name[4]) {
        const char *p = remote_name + 4;
        while (*p >= '0' && *p <= '9')
            p++;
        if (!*p)
            return APIR_ALLOC_CUDA;
    }
    return APIR_ALLOC_ASK;
}

static bool alloc_size_is_nbytes(enum apir_alloc_rule rule, const struct ggml_tensor *tensor)
{
    switch (rule) {
    case APIR_ALLOC_NBYTES:
        return true;
    case APIR_ALLOC_CUDA:
        return tensor->op != GGML_OP_FLASH_ATTN_EXT && !ggml_is_quantized(tensor->type);
    default:
        return false;
    }
}

static size_t buft_get_alloc_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor *tensor)
{
    if (alloc_size_is_nbytes(((struct apir_buft_ctx *)buft->context)->alloc_rule, tensor))
        return ggml_nbytes(tensor);
    uint64_t size;
    if (apir_op_query(buft_device(buft), APIR_Q_ALLOC_SIZE, tensor, &size) && size >= ggml_nbytes(tensor))
        return (size_t)size;
    return ggml_nbytes(tensor);
}

static bool buft_is_host(ggml_backend_buffer_type_t buft)
{
    (void)buft;
    return false;
}

/* ---- buffers ---- */

/* False, logged, when the buffer lived on a host that is gone (made before
 * a reconnection): nothing of it is asked of the new host. */
static bool live_or_log(const struct apir_buffer_ctx *bc, const char *what, const struct ggml_tensor *t)
{
    if (apir_buffer_live(bc))
        return true;
    APIR_ERROR("guest", "%s: %s of '%s' failed: its buffer was on a host that is gone", bc->device->name, what,
               t ? t->name : "");
    return false;
}

/* A buffer made on a connection since replaced is not freed on the new host
 * (it never knew it); its blob goes with the old connection, an unmap. */
static void buffer_free(ggml_backend_buffer_t buffer)
{
    struct apir_buffer_ctx *bc = buffer->context;
    struct apir_remote *r = &bc->device->remote;
    pthread_mutex_lock(&r->lock);
    if (bc->conn) {  /* else a stand-in: nothing anywhere */
        if (bc->conn == r->conn) {
            apir_inputs_flush_locked(bc->device);
            apir_call_BUFFER_FREE_BUFFER_locked(r, bc->handle);
            apir_graph_delta_forget(bc->device);  /* the host lets its graphs go with a buffer */
        }
        if (bc->mapped) {
            struct apir_transport *t = bc->conn->t;
            t->ops->blob_destroy(t, bc->res_id, bc->file_backed ? NULL : bc->mapped, bc->mapped_size);
        }
        apir_conn_put_locked(r, bc->conn);
    }
    pthread_mutex_unlock(&r->lock);
    free(bc);
}

/* Where a tensor's bytes are in a zero-copy buffer's mapping. */
static uint8_t *mapped_at(const struct apir_buffer_ctx *bc, const struct ggml_tensor *t, size_t offset)
{
    return bc->mapped + ((uintptr_t)t->data - (uintptr_t)bc->base) + offset;
}

static void *buffer_get_base(ggml_backend_buffer_t buffer)
{
    return (void *)(uintptr_t)((struct apir_buffer_ctx *)buffer->context)->base;
}

static void after_write(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, size_t offset, size_t size,
                        bool set);

static enum ggml_status init_remote(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor)
{
    struct apir_buffer_ctx *bc = buffer->context;
    /* Only quantized weights may need their padding initialized (CUDA does). */
    if (tensor->view_src || !ggml_is_quantized(tensor->type) ||
        ggml_backend_buffer_get_usage(buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE ||
        !apir_minor_speaks(bc->device->remote.minor, APIR_CMD_BUFFER_INIT_TENSOR))
        return GGML_STATUS_SUCCESS;
    if (!live_or_log(bc, "init_tensor", tensor))
        return GGML_STATUS_FAILED;
    struct apir_tensor_rec rec;
    if (!apir_tensor_to_rec(tensor, &rec, true))
        return GGML_STATUS_FAILED;
    uint32_t status = GGML_STATUS_FAILED;
    apir_inputs_flush(bc->device);
    if (apir_call_BUFFER_INIT_TENSOR(&bc->device->remote, bc->handle, &rec, &status) != APIR_HANDLER_OK)
        return GGML_STATUS_FAILED;
    return (enum ggml_status)status;
}

static enum ggml_status buffer_init_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor)
{
    struct apir_buffer_ctx *bc = buffer->context;
    enum ggml_status st = init_remote(buffer, tensor);
    /* A weight in a buffer made from the program's memory is complete now
     * (llama.cpp places it in its mapped model file): as if just written. */
    if (st == GGML_STATUS_SUCCESS && bc->prefilled && !tensor->view_src)
        after_write(buffer, tensor, 0, ggml_nbytes(tensor), true);
    return st;
}

/* The bytes one upload takes in the inputs section (its wire form). */
static size_t input_bytes(size_t size)
{
    return 8 + APIR_TENSOR_REC_SIZE + 8 + 8 + apir_pad4(size);
}

bool apir_inputs_defer_locked(struct apir_buffer_ctx *bc, const struct ggml_tensor *tensor, const void *data,
                              size_t offset, size_t size)
{
    struct apir_device *d = bc->device;
    struct apir_remote *r = &d->remote;
    struct apir_inputs *in = &d->inputs;
    /* Weights go once and whole (weight notes and the cache want them
     * seen); what a graph reads each step is small and in compute buffers. */
    if (d->inputs_off || size == 0 || size > APIR_INPUT_MAX || !apir_minor_speaks(r->minor, APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS) ||
        ggml_backend_buffer_get_usage(tensor->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS || apir_remote_gone_locked(r))
        return false;
    struct apir_tensor_rec rec;
    if (!apir_tensor_to_rec(tensor, &rec, true))
        return false;
    if (!in->buf && !(in->buf = malloc(APIR_INPUTS_SIZE)))
        return false;
    if (in->used && in->used + input_bytes(size) > APIR_INPUTS_SIZE)
        apir_inputs_flush_locked(d);
    if (!in->used)
        in->used = 4;  /* the count, written when sent */
    struct apir_encoder enc;
    apir_encoder_init(&enc, in->buf + in->used, APIR_INPUTS_SIZE - in->used);
    apir_encode_u64(&enc, bc->handle);
    apir_encode_tensor(&enc, &rec);
    apir_encode_u64(&enc, offset);
    apir_encode_u64(&enc, size);
    apir_encode_bytes(&enc, data, size);
    if (enc.fatal)
        return false;  /* cannot happen: fits by the test above */
    in->used += apir_encoder_used(&enc);
    in->count++;
    r->inputs_waiting = in->count;
    return true;
}

void apir_inputs_flush_locked(struct apir_device *d)
{
    struct apir_remote *r = &d->remote;
    struct apir_inputs *in = &d->inputs;
    if (!in->count)
        return;
    const uint32_t n = in->count;
    in->count = 0;
    r->inputs_waiting = 0;
    struct apir_decoder dec;
    apir_decoder_init(&dec, in->buf + 4, in->used - 4);
    in->used = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct apir_tensor_rec rec;
        const uint64_t handle = apir_decode_u64(&dec);
        apir_decode_tensor(&dec, &rec);
        const uint64_t offset = apir_decode_u64(&dec), size = apir_decode_u64(&dec);
        const void *bytes = apir_decode_inplace(&dec, (size_t)size);
        if (dec.fatal || !apir_remote_put_data_locked(r, 0, bytes, (size_t)size) ||
            apir_call_BUFFER_SET_TENSOR_locked(r, handle, &rec, r->data_res_id, offset, size) != APIR_HANDLER_OK)
            APIR_ERROR("guest", "%s: set_tensor of tensor '%s' failed", d->name, rec.name);
    }
}

void apir_inputs_flush(struct apir_device *d)
{
    struct apir_remote *r = &d->remote;
    pthread_mutex_lock(&r->lock);
    apir_inputs_flush_locked(d);
    pthread_mutex_unlock(&r->lock);
}

/* Copies in chunks of the data area: SET or GET, data guest-side. */
static void tensor_io_untraced(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, bool set, void *data,
                               size_t offset, size_t size)
{
    struct apir_buffer_ctx *bc = buffer->context;
    struct apir_remote *r = &bc->device->remote;
    if (set && bc->file_backed) {
        APIR_ERROR("guest", "set_tensor of '%s': the buffer is a read-only file mapping", tensor->name);
        return;
    }
    if (bc->mapped) {
        /* The buffer is shared memory: a plain copy, as the CPU backend does. */
        apir_remote_wait_idle(r);
        if (set)
            memcpy(mapped_at(bc, tensor, offset), data, size);
        else
            memcpy(data, mapped_at(bc, tensor, offset), size);
        return;
    }
    if (!live_or_log(bc, set ? "set_tensor" : "get_tensor", tensor)) {
        if (!set)
            memset(data, 0, size);
        return;
    }
    struct apir_tensor_rec rec;
    if (!apir_tensor_to_rec(tensor, &rec, true))
        return;
    uint32_t blob_id;
    uint64_t blob_offset;
    if (bc->device->has_host_buft && apir_host_blob_find(bc->device, data, size, &blob_id, &blob_offset)) {
        /* data is in one of our host buffers: the host copies between it
         * and the device directly. */
        apir_inputs_flush(bc->device);
        int rc = set ? apir_call_BUFFER_SET_TENSOR_AT(r, bc->handle, &rec, blob_id, blob_offset, offset, size)
                     : apir_call_BUFFER_GET_TENSOR_AT(r, bc->handle, &rec, blob_id, blob_offset, offset, size);
        if (rc != APIR_HANDLER_OK) {
            APIR_ERROR("guest", "%s of tensor '%s' failed", set ? "set_tensor" : "get_tensor", tensor->name);
            if (!set)
                memset(data, 0, size);
        }
        return;
    }
    /* Through the data area, a chunk at a time: copied there and out on
     * shared memory, sent and received in the stream from data itself on a
     * stream transport (apir_remote_put_data_locked).  Downloads:
     * download.c, which overlaps the two copies where it can. */
    pthread_mutex_lock(&r->lock);
    if (set && apir_inputs_defer_locked(bc, tensor, data, offset, size)) {
        pthread_mutex_unlock(&r->lock);
        return;
    }
    apir_inputs_flush_locked(bc->device);
    if (!set) {
        if (apir_download_locked(r, bc->handle, &rec, offset, data, size) != APIR_HANDLER_OK)
            APIR_ERROR("guest", "get_tensor of tensor '%s' failed", tensor->name);
        pthread_mutex_unlock(&r->lock);
        return;
    }
    size_t done = 0;
    while (done < size) {
        size_t chunk = size - done < r->data_size ? size - done : r->data_size;
        const uint8_t *at = (const uint8_t *)data + done;
        int rc = -1;
        if (apir_remote_put_data_locked(r, 0, at, chunk))
            rc = apir_call_BUFFER_SET_TENSOR_locked(r, bc->handle, &rec, r->data_res_id, offset + done, chunk);
        if (rc != APIR_HANDLER_OK) {
            APIR_ERROR("guest", "set_tensor of tensor '%s' failed", tensor->name);
            break;
        }
        done += chunk;
    }
    pthread_mutex_unlock(&r->lock);
}

/* A write this side made in a shared-memory buffer the host keeps weight
 * copies of: [offset, offset+size) of the buffer, reported so they go. */
static void report_written(struct apir_buffer_ctx *bc, uint64_t offset, uint64_t size)
{
    if (bc->mapped && bc->has_weight_copies && apir_minor_speaks(bc->device->remote.minor, APIR_CMD_BUFFER_WRITTEN) && apir_buffer_live(bc))
        apir_call_BUFFER_WRITTEN(&bc->device->remote, bc->handle, offset, size);
}

/*
 * Weight copies (apir 0.3, host/data/weight_copies.h): once a weight is written
 * whole, the host may keep it in its device's own layout (a CPU's repacked
 * matrices) and compute with that.  Other writes into a buffer it keeps
 * copies of must reach it: the host sees its own writes, not the ones this
 * side makes in a shared-memory buffer, which are reported.
 */
static void after_write(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, size_t offset, size_t size,
                        bool set)
{
    struct apir_buffer_ctx *bc = buffer->context;
    struct apir_device *d = bc->device;
    struct apir_remote *r = &d->remote;
    if (!apir_minor_speaks(r->minor, APIR_CMD_BUFFER_NOTE_WEIGHT) || size == 0 || !apir_buffer_live(bc))
        return;
    if (set && !d->weight_notes_off && offset == 0 && size == ggml_nbytes(tensor) && !tensor->view_src &&
        ggml_backend_buffer_get_usage(buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
        struct apir_tensor_rec rec;
        uint32_t kept = APIR_WEIGHT_NOT_KEPT;
        if (!apir_tensor_to_rec(tensor, &rec, true))
            return;
        apir_inputs_flush(d);
        if (apir_call_BUFFER_NOTE_WEIGHT(r, bc->handle, &rec, &kept) != APIR_HANDLER_OK ||
            kept == APIR_WEIGHT_NEVER) {
            APIR_DEBUG("guest", "%s: the host keeps no weight copies", d->name);
            d->weight_notes_off = true;
        } else if (kept == APIR_WEIGHT_KEPT) {
            bc->has_weight_copies = true;
        }
        return;  /* the note replaces what the host kept of these bytes */
    }
    report_written(bc, (uint64_t)((uintptr_t)tensor->data - bc->base + offset), (uint64_t)size);
}

/* tensor_io_untraced, a span of APIR_TRACE's timeline when it is on. */
static void tensor_io(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, bool set, void *data, size_t offset,
                      size_t size)
{
    struct apir_remote *r = &((struct apir_buffer_ctx *)buffer->context)->device->remote;
    if (!apir_remote_tracing(r)) {
        tensor_io_untraced(buffer, tensor, set, data, offset, size);
        return;
    }
    const uint64_t t0 = apir_now_ns();
    tensor_io_untraced(buffer, tensor, set, data, offset, size);
    pthread_mutex_lock(&r->lock);
    apir_remote_trace(r, set ? "(set_tensor)" : "(get_tensor)", t0, apir_now_ns(), size);
    pthread_mutex_unlock(&r->lock);
}

static void buffer_set_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data, size_t offset,
                              size_t size)
{
    /* Weight cache (apir 0.4, guest/weight_cache.c): a weight the host holds
     * is sent as its hash; after a miss, uploaded, then offered to keep. */
    struct apir_weight_cache_pending wc;
    if (apir_weight_cache_set(buffer, tensor, data, offset, size, &wc)) {
        after_write(buffer, tensor, offset, size, true);
        return;
    }
    tensor_io(buffer, tensor, true, (void *)data, offset, size);
    apir_weight_cache_uploaded(buffer, tensor, &wc);
    after_write(buffer, tensor, offset, size, true);
}

static void buffer_get_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, void *data, size_t offset,
                              size_t size)
{
    tensor_io(buffer, tensor, false, data, offset, size);
}

static void buffer_memset_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, uint8_t value, size_t offset,
                                 size_t size)
{
    struct apir_buffer_ctx *bc = buffer->context;
    if (bc->file_backed) {
        APIR_ERROR("guest", "memset_tensor of '%s': the buffer is a read-only file mapping", tensor->name);
        return;
    }
    if (bc->mapped) {
        apir_remote_wait_idle(&bc->device->remote);
        memset(mapped_at(bc, tensor, offset), value, size);
        after_write(buffer, tensor, offset, size, false);
        return;
    }
    if (!live_or_log(bc, "memset_tensor", tensor))
        return;
    struct apir_tensor_rec rec;
    if (!apir_tensor_to_rec(tensor, &rec, true))
        return;
    if (apir_minor_speaks(bc->device->remote.minor, APIR_CMD_BUFFER_MEMSET_TENSOR)) {
        apir_inputs_flush(bc->device);
        apir_call_BUFFER_MEMSET_TENSOR(&bc->device->remote, bc->handle, &rec, value, offset, size);
        return;
    }
    /* 0.1 host: write the bytes. */
    uint8_t *tmp = malloc(size);
    if (!tmp)
        return;
    memset(tmp, value, size);
    tensor_io(buffer, tensor, true, tmp, offset, size);
    free(tmp);
}

static bool buffer_cpy_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor *src, struct ggml_tensor *dst)
{
    struct apir_buffer_ctx *bc = buffer->context;
    /* Only within one remote device; ggml falls back to get + set. */
    if (!src->buffer || !apir_buffer_is_ours(src->buffer) ||
        ((struct apir_buffer_ctx *)src->buffer->context)->device != bc->device)
        return false;
    const struct apir_buffer_ctx *sbc = src->buffer->context;
    if (bc->file_backed)
        return false;  /* read-only: ggml's fallback fails the same way a CPU mapping would */
    if (bc->mapped && sbc->mapped) {
        apir_remote_wait_idle(&bc->device->remote);
        memcpy(mapped_at(bc, dst, 0), mapped_at(sbc, src, 0), ggml_nbytes(src));
        after_write(buffer, dst, 0, ggml_nbytes(src), false);
        return true;
    }
    if (!live_or_log(bc, "cpy_tensor", dst) || !live_or_log(sbc, "cpy_tensor", src))
        return false;
    struct apir_tensor_rec src_rec, dst_rec;
    if (!apir_tensor_to_rec(src, &src_rec, true) || !apir_tensor_to_rec(dst, &dst_rec, true))
        return false;
    bool ok = false;
    apir_inputs_flush(bc->device);
    if (apir_call_BUFFER_CPY_TENSOR(&bc->device->remote, bc->handle, &src_rec, &dst_rec, &ok) != APIR_HANDLER_OK)
        return false;
    return ok;
}

static void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value)
{
    struct apir_buffer_ctx *bc = buffer->context;
    if (bc->file_backed) {
        APIR_ERROR("guest", "clear: the buffer is a read-only file mapping");
        return;
    }
    if (bc->mapped) {
        apir_remote_wait_idle(&bc->device->remote);
        memset(bc->mapped, value, buffer->size);
        report_written(bc, 0, (uint64_t)buffer->size);
        return;
    }
    if (!live_or_log(bc, "clear", NULL))
        return;
    apir_inputs_flush(bc->device);
    apir_call_BUFFER_CLEAR(&bc->device->remote, bc->handle, value);
}

static const struct ggml_backend_buffer_i apir_buffer_iface = {
    .free_buffer = buffer_free,
    .get_base = buffer_get_base,
    .init_tensor = buffer_init_tensor,
    .memset_tensor = buffer_memset_tensor,
    .set_tensor = buffer_set_tensor,
    .get_tensor = buffer_get_tensor,
#if APIR_GGML_HAS_BUFFER_2D
    .set_tensor_2d = NULL,
    .get_tensor_2d = NULL,
#endif
    .cpy_tensor = buffer_cpy_tensor,
    .clear = buffer_clear,
    .reset = NULL,
};

bool apir_buffer_is_ours(ggml_backend_buffer_t buffer)
{
    return buffer->iface.free_buffer == buffer_free;
}

/* The host wraps blob res_id (size bytes, mapped here at mapped) as a
 * buffer.  ours: the mapping is ours to unmap when the buffer goes (else it
 * is the program's own file mapping).  Called with r->lock held; on failure
 * the blob is destroyed. */
static struct apir_buffer_ctx *wrap_blob_locked(struct apir_device *d, uint32_t res_id, uint8_t *mapped, size_t size,
                                                bool ours)
{
    struct apir_remote *r = &d->remote;
    uint64_t handle = 0, buft_handle = 0;
    struct apir_buffer_ctx *bc = calloc(1, sizeof(*bc));
    if (!bc || apir_call_DEVICE_BUFFER_FROM_PTR_locked(r, res_id, size, size, &handle, &buft_handle) != APIR_HANDLER_OK) {
        free(bc);
        r->t->ops->blob_destroy(r->t, res_id, ours ? mapped : NULL, size);
        return NULL;
    }
    bc->device = d;
    bc->conn = apir_remote_conn_get_locked(r);
    bc->generation = bc->conn->generation;
    bc->handle = handle;
    bc->mapped = mapped;
    bc->mapped_size = size;
    bc->res_id = res_id;
    bc->base = (uint64_t)(uintptr_t)mapped;
    bc->file_backed = !ours;
    return bc;
}

/* A buffer whose memory is a shared blob the host wraps (zero copy). */
static ggml_backend_buffer_t alloc_zero_copy(ggml_backend_buffer_type_t buft, struct apir_device *d, size_t size)
{
    struct apir_remote *r = &d->remote;
    size_t blob_size = size ? size : 1;
    uint32_t res_id;
    void *ptr = NULL;
    struct apir_buffer_ctx *bc = NULL;
    pthread_mutex_lock(&r->lock);
    if (apir_device_ready_locked(d, "a shared buffer")) {  /* else logged */
        bc = r->t->ops->blob_create(r->t, blob_size, &res_id, &ptr) == 0 ? wrap_blob_locked(d, res_id, ptr, blob_size, true)
                                                                         : NULL;
        if (!bc)
            APIR_ERROR("guest", "%s: a %zu-byte shared buffer failed", d->name, size);
    }
    pthread_mutex_unlock(&r->lock);
    return bc ? ggml_backend_buffer_init(buft, apir_buffer_iface, bc, size) : NULL;
}

/* The file mapping [ptr, ptr + size) lies in, from /proc/self/maps: a new
 * descriptor of that file (device and inode checked against the mapping's)
 * and ptr's offset in it; -1 when the range is not inside one file mapping. */
static int file_of_mapping(const void *ptr, size_t size, uint64_t *file_offset)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return -1;
    char line[4096 + 256];
    int fd = -1;
    const uintptr_t p = (uintptr_t)ptr;
    while (fgets(line, sizeof(line), f)) {
        unsigned long start, end, off, inode;
        unsigned maj, min;
        char perms[8];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &start, &end, perms, &off, &maj, &min, &inode, &path_at) < 7)
            continue;
        if (p < start || p >= end)
            continue;
        if (size > end - p || inode == 0 || path_at == 0 || line[path_at] != '/')
            break;
        char *path = line + path_at;
        path[strcspn(path, "\n")] = '\0';
        int cand = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (cand >= 0 && fstat(cand, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == (ino_t)inode &&
            major(st.st_dev) == maj && minor(st.st_dev) == min) {
            fd = cand;
            *file_offset = off + (p - start);
        } else if (cand >= 0) {
            close(cand);
        }
        break;
    }
    fclose(f);
    return fd;
}

/*
 * caps.buffer_from_host_ptr: llama.cpp maps the model file and hands a
 * device that can wrap host memory the mapped range instead of copying the
 * weights in.  On the same machine the host maps the same file (its
 * descriptor crosses the socket): the weights are never copied, the page
 * cache is shared.  Where that cannot be (not a file mapping, a host
 * without process isolation or older than 0.3), the range is copied into a
 * shared blob once.  Either way the tensors keep their addresses in the
 * program's mapping (the buffer's base), and their bytes are there before
 * init_tensor, which notes the weights (weight copies, apir 0.3).
 */
ggml_backend_buffer_t apir_buffer_from_host_ptr(ggml_backend_dev_t dev, void *ptr, size_t size, size_t max_tensor_size)
{
    (void)max_tensor_size;
    struct apir_device *d = dev->context;
    struct apir_remote *r = &d->remote;
    uint64_t foff = 0;
    int fd = r->t->ops->blob_share_file && apir_minor_has(r->minor, APIR_FEATURE_FILE_BLOBS) && size ? file_of_mapping(ptr, size, &foff) : -1;
    if (fd >= 0) {
        const uint64_t skip = foff % (uint64_t)sysconf(_SC_PAGESIZE);
        uint32_t res_id = 0;
        pthread_mutex_lock(&r->lock);
        struct apir_buffer_ctx *bc = apir_device_ready_locked(d, "sharing a mapped file") &&
                                             r->t->ops->blob_share_file(r->t, fd, foff - skip, size + skip, skip, &res_id) == 0
                                         ? wrap_blob_locked(d, res_id, ptr, size, false)
                                         : NULL;
        pthread_mutex_unlock(&r->lock);
        close(fd);
        if (bc) {
            bc->prefilled = true;
            APIR_INFO("guest", "%s: %.1f MiB of a mapped file shared with the host, not copied", d->name,
                      size / 1048576.0);
            return ggml_backend_buffer_init(&d->buft, apir_buffer_iface, bc, size);
        }
        APIR_DEBUG("guest", "%s: the host did not map the file: copying %zu bytes", d->name, size);
    }
    ggml_backend_buffer_t buf = alloc_zero_copy(&d->buft, d, size);
    if (!buf)
        return NULL;
    struct apir_buffer_ctx *bc = buf->context;
    memcpy(bc->mapped, ptr, size);
    bc->base = (uint64_t)(uintptr_t)ptr;
    bc->prefilled = true;
    return buf;
}

/* A buffer in the host's device memory (not zero copy); NULL on failure. */
static ggml_backend_buffer_t alloc_remote(ggml_backend_buffer_type_t buft, struct apir_device *d, size_t size)
{
    struct apir_buft_ctx *bctx = buft->context;
    struct apir_remote *r = &d->remote;
    uint64_t handle = 0, base = 0;
    struct apir_buffer_ctx *bc = NULL;
    pthread_mutex_lock(&r->lock);
    if (!apir_device_ready_locked(d, "a buffer")) {
    } else if (apir_call_BUFFER_TYPE_ALLOC_BUFFER_locked(r, bctx->handle, size, &handle) !=
                   APIR_HANDLER_OK ||
               !handle) {
        APIR_ERROR("guest", "%s: allocating a %zu-byte buffer failed on the host", d->name, size);
    } else if (apir_call_BUFFER_GET_BASE_locked(r, handle, &base) != APIR_HANDLER_OK ||
               !(bc = calloc(1, sizeof(*bc)))) {
        APIR_ERROR("guest", "%s: a %zu-byte buffer failed", d->name, size);
        apir_call_BUFFER_FREE_BUFFER_locked(r, handle);
    } else {
        bc->device = d;
        bc->conn = apir_remote_conn_get_locked(r);
        bc->generation = bc->conn->generation;
        bc->handle = handle;
        bc->base = base;
    }
    pthread_mutex_unlock(&r->lock);
    return bc ? ggml_backend_buffer_init(buft, apir_buffer_iface, bc, size) : NULL;
}

/*
 * What an allocation gives when the host is gone (it died and is not back):
 * a buffer with no memory behind it, whose every use fails and is logged,
 * and whose graphs fail with an error status.  ggml's scheduler does not
 * survive a NULL compute buffer (ggml_backend_sched_alloc_graph ignores the
 * failed reserve and faults in ggml_gallocr_alloc_graph, as whisper.cpp
 * did), while a failed graph is an error a program reports and survives
 * (llama-server answers that request with an error).  A host that answers
 * and refuses (over its quota, out of device memory) gets NULL, as a native
 * backend out of memory gives.
 */
static ggml_backend_buffer_t alloc_stand_in(ggml_backend_buffer_type_t buft, struct apir_device *d, size_t size)
{
    struct apir_buffer_ctx *bc = calloc(1, sizeof(*bc));
    if (!bc)
        return NULL;
    bc->device = d;
    bc->generation = 0;  /* no connection has it: never live */
    /* An address ggml can place tensors at; nothing ever reads it. */
    bc->base = (uint64_t)((struct apir_buft_ctx *)buft->context)->alignment;
    APIR_ERROR("guest", "%s: a %zu-byte buffer stands in for one the host at %s cannot give: every use of it fails",
               d->name, size, d->remote.endpoint);
    return ggml_backend_buffer_init(buft, apir_buffer_iface, bc, size);
}

static bool host_gone(struct apir_device *d)
{
    pthread_mutex_lock(&d->remote.lock);
    const bool gone = apir_remote_gone_locked(&d->remote);
    pthread_mutex_unlock(&d->remote.lock);
    return gone;
}

static ggml_backend_buffer_t buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size)
{
    struct apir_device *d = buft_device(buft);
    ggml_backend_buffer_t buf = NULL;
    /* A host found gone by the first attempt (it died since the last call)
     * may be back already (restarted): the second attempt reconnects. */
    for (int attempt = 0; attempt < 2 && !buf; attempt++) {
        buf = d->zero_copy ? alloc_zero_copy(buft, d, size) : alloc_remote(buft, d, size);
        if (!buf && !host_gone(d))
            return NULL;
    }
    return buf ? buf : alloc_stand_in(buft, d, size);
}

static const struct ggml_backend_buffer_type_i apir_buft_iface = {
    .get_name = buft_get_name,
    .alloc_buffer = buft_alloc_buffer,
    .get_alignment = buft_get_alignment,
    .get_max_size = buft_get_max_size,
    .get_alloc_size = buft_get_alloc_size,
    .is_host = buft_is_host,
};

void apir_buft_setup(struct apir_device *d)
{
    struct apir_buft_ctx *c = &d->buft_ctx;
    struct apir_remote *r = &d->remote;
    struct apir_string remote_name = { "" };
    uint64_t alignment = 32, max_size = SIZE_MAX;
    apir_call_DEVICE_GET_BUFFER_TYPE(r, &c->handle);
    apir_call_BUFFER_TYPE_GET_NAME(r, c->handle, &remote_name);
    apir_call_BUFFER_TYPE_GET_ALIGNMENT(r, c->handle, &alignment);
    apir_call_BUFFER_TYPE_GET_MAX_SIZE(r, c->handle, &max_size);
    c->alloc_rule = apir_buft_alloc_rule(remote_name.s);
    c->alignment = alignment ? (size_t)alignment : 32;
    c->max_size = (size_t)max_size;
    /* "APIR0(CUDA0)": a long remote name is cut to what fits. */
    snprintf(c->name, sizeof(c->name), "%.15s(%.*s)", d->name, (int)(sizeof(c->name) - 18), remote_name.s);
    d->buft.iface = apir_buft_iface;
    d->buft.device = &d->dev;
    d->buft.context = c;
}
