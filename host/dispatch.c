/*
 * Host dispatch: one handler per row of the command table.
 *
 * Each handler decodes its request with the table's signature, checks every
 * handle and range, calls ggml's public backend API, and encodes its reply
 * with the table's reply signature.  The dispatch array and the handler
 * prototypes are generated from APIR_COMMAND_LIST, so a command without a
 * handler does not compile.
 */
#include "apir_commands.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "import.h"
#include "inline_tensor.h"
#include "op_policy.h"
#include "upload_mirror.h"
#include "weight_copies.h"
#include "session.h"
#include "wait.h"

#include <stdlib.h>
#include <string.h>

typedef uint32_t (*apir_handler_fn)(struct apir_session *s, struct apir_decoder *req, struct apir_encoder *reply);

#define HANDLER(name) static uint32_t host_cmd_##name(struct apir_session *s, struct apir_decoder *req, struct apir_encoder *reply)
#define DECODE(name, ...) apir_demarshal(req, apir_command_table[APIR_CMD_##name].request, __VA_ARGS__)
#define ENCODE(name, ...) apir_marshal(reply, apir_command_table[APIR_CMD_##name].reply, __VA_ARGS__)

/* Prototypes for every row: a missing handler is a link error. */
#define APIR_X_PROTO(num, name, req, rep) HANDLER(name);
APIR_COMMAND_LIST(APIR_X_PROTO)
#undef APIR_X_PROTO

static const apir_handler_fn handlers[APIR_CMD_COUNT] = {
#define APIR_X_DISPATCH(num, name, req, rep) [num] = host_cmd_##name,
    APIR_COMMAND_LIST(APIR_X_DISPATCH)
#undef APIR_X_DISPATCH
};

/* Where the opaque base addresses of buffers live: slot i at (i+1) << 40,
 * so buffers up to 1 TiB never overlap and no host address leaks. */
#define OPAQUE_BASE_SHIFT 40
#define MAX_BUFFER_SIZE (1ull << OPAQUE_BASE_SHIFT)

static uint32_t bad(struct apir_session *s, const char *cmd, const char *why)
{
    APIR_WARN("host", "%s: %s refused: %s", s->name, cmd, why);
    return APIR_HANDLER_BAD_REQUEST;
}

static ggml_backend_dev_t cur_dev(struct apir_session *s) { return s->host->devices[s->device]; }

static struct apir_host_buffer *buffer_of(struct apir_session *s, uint64_t handle)
{
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFFER);
    return slot ? slot->object : NULL;
}

static ggml_backend_buffer_type_t buft_of(struct apir_session *s, uint64_t handle)
{
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFT);
    return slot ? slot->object : NULL;
}

/* ---- device --------------------------------------------------------------- */

HANDLER(DEVICE_GET_DEVICE_COUNT)
{
    (void)req;
    ENCODE(DEVICE_GET_DEVICE_COUNT, (int32_t)s->host->n_devices);
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_COUNT)
{
    (void)req;
    ENCODE(DEVICE_GET_COUNT, (int32_t)s->host->n_devices);
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_NAME)
{
    (void)req;
    ENCODE(DEVICE_GET_NAME, ggml_backend_dev_name(cur_dev(s)));
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_DESCRIPTION)
{
    (void)req;
    ENCODE(DEVICE_GET_DESCRIPTION, ggml_backend_dev_description(cur_dev(s)));
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_TYPE)
{
    (void)req;
    ENCODE(DEVICE_GET_TYPE, (uint32_t)ggml_backend_dev_type(cur_dev(s)));
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_MEMORY)
{
    (void)req;
    size_t free_mem = 0, total = 0;
    ggml_backend_dev_memory(cur_dev(s), &free_mem, &total);
    ENCODE(DEVICE_GET_MEMORY, (uint64_t)free_mem, (uint64_t)total);
    return APIR_HANDLER_OK;
}

static bool supports(struct apir_session *s, const struct ggml_tensor *t)
{
    return t && ggml_backend_dev_supports_op(cur_dev(s), t);
}

HANDLER(DEVICE_SUPPORTS_OP)
{
    struct ggml_tensor *t = apir_import_inline(s, req);
    if (req->fatal)
        return bad(s, "DEVICE_SUPPORTS_OP", "malformed inline tensor");
    ENCODE(DEVICE_SUPPORTS_OP, (int)supports(s, t));
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_BUFFER_TYPE)
{
    (void)req;
    ENCODE(DEVICE_GET_BUFFER_TYPE, s->buft_handles[s->device]);
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_GET_PROPS)
{
    (void)req;
    struct ggml_backend_dev_props props;
    ggml_backend_dev_get_props(cur_dev(s), &props);
    /* Host buffers and events are host-local: not offered to the guest.
     * The fifth item (mmap_support) is the pinned reference's: the spec's
     * table has four, its guest reads five. */
    ENCODE(DEVICE_GET_PROPS, 0, 0, (int)props.caps.buffer_from_host_ptr, 0, (int)props.caps.mmap_support);
    return APIR_HANDLER_OK;
}

/* Registers a new buffer under a handle; frees it on failure. */
static uint64_t buffer_register(struct apir_session *s, ggml_backend_buffer_t buf, uint32_t device, uint32_t pinned_blob)
{
    struct apir_host_buffer *hb = calloc(1, sizeof(*hb));
    uint64_t handle = hb ? apir_handle_new(&s->handles, APIR_HANDLE_BUFFER, hb, 0) : 0;
    if (!handle) {
        free(hb);
        ggml_backend_buffer_free(buf);
        return 0;
    }
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFFER);
    hb->buffer = buf;
    hb->base = ggml_backend_buffer_get_base(buf);
    hb->size = ggml_backend_buffer_get_size(buf);
    hb->device = device;
    hb->pinned_blob = pinned_blob;
    hb->opaque_base = ((uint64_t)apir_handle_slot_index(&s->handles, slot) + 1) << OPAQUE_BASE_SHIFT;
    s->n_buffers++;
    s->bytes_allocated += hb->size;
    return handle;
}

static bool buffer_quota_ok(struct apir_session *s, uint64_t size)
{
    const struct apir_limits *lim = &s->host->cfg.limits;
    if (s->n_buffers >= lim->max_buffers || size > lim->max_alloc_bytes - s->bytes_allocated) {
        APIR_WARN("host", "%s: buffer quota reached (%u buffers, %llu bytes, asking %llu)", s->name, s->n_buffers,
                  (unsigned long long)s->bytes_allocated, (unsigned long long)size);
        return false;
    }
    return true;
}

HANDLER(DEVICE_BUFFER_FROM_PTR)
{
    uint32_t res_id;
    uint64_t size, max_tensor_size;
    if (!DECODE(DEVICE_BUFFER_FROM_PTR, &res_id, &size, &max_tensor_size))
        return bad(s, "DEVICE_BUFFER_FROM_PTR", "malformed request");
    struct apir_blob *blob = apir_session_blob_find(s, res_id);
    if (!blob || blob->size == SIZE_MAX || size == 0 || size > blob->size || size >= MAX_BUFFER_SIZE)
        return bad(s, "DEVICE_BUFFER_FROM_PTR", "blob unknown or smaller than the buffer");
    /* Backends assert their buffers' alignment (the CPU's: 32 bytes); a
     * file blob starts where the guest says in its first page. */
    size_t align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(cur_dev(s)));
    if (align && (uintptr_t)blob->ptr % align != 0)
        return bad(s, "DEVICE_BUFFER_FROM_PTR", "blob not aligned for the device's buffers");
    if (!buffer_quota_ok(s, size))
        return APIR_HANDLER_LIMIT;
    ggml_backend_buffer_t buf = ggml_backend_dev_buffer_from_host_ptr(cur_dev(s), blob->ptr, (size_t)size, (size_t)max_tensor_size);
    uint64_t handle = buf ? buffer_register(s, buf, s->device, res_id) : 0;
    if (!handle)
        return APIR_HANDLER_FAILED;
    blob->pins++;
    ENCODE(DEVICE_BUFFER_FROM_PTR, handle, s->buft_handles[s->device]);
    return APIR_HANDLER_OK;
}

/* ---- buffer types ----------------------------------------------------------- */

#define BUFT_HANDLER_PREAMBLE(name)                                  \
    uint64_t h;                                                      \
    if (!DECODE(name, &h))                                           \
        return bad(s, #name, "malformed request");                   \
    ggml_backend_buffer_type_t buft = buft_of(s, h);                 \
    if (!buft)                                                       \
        return APIR_HANDLER_BAD_HANDLE;

HANDLER(BUFFER_TYPE_GET_NAME)
{
    BUFT_HANDLER_PREAMBLE(BUFFER_TYPE_GET_NAME)
    ENCODE(BUFFER_TYPE_GET_NAME, ggml_backend_buft_name(buft));
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_GET_ALIGNMENT)
{
    BUFT_HANDLER_PREAMBLE(BUFFER_TYPE_GET_ALIGNMENT)
    ENCODE(BUFFER_TYPE_GET_ALIGNMENT, (uint64_t)ggml_backend_buft_get_alignment(buft));
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_GET_MAX_SIZE)
{
    BUFT_HANDLER_PREAMBLE(BUFFER_TYPE_GET_MAX_SIZE)
    uint64_t max = ggml_backend_buft_get_max_size(buft);
    ENCODE(BUFFER_TYPE_GET_MAX_SIZE, max < MAX_BUFFER_SIZE ? max : MAX_BUFFER_SIZE - 1);
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_IS_HOST)
{
    BUFT_HANDLER_PREAMBLE(BUFFER_TYPE_IS_HOST)
    (void)buft;
    ENCODE(BUFFER_TYPE_IS_HOST, 0);  /* host memory is never the guest's */
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_ALLOC_BUFFER)
{
    uint64_t h, size;
    if (!DECODE(BUFFER_TYPE_ALLOC_BUFFER, &h, &size))
        return bad(s, "BUFFER_TYPE_ALLOC_BUFFER", "malformed request");
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, h, APIR_HANDLE_BUFT);
    if (!slot)
        return APIR_HANDLER_BAD_HANDLE;
    uint64_t handle = 0;
    if (size >= MAX_BUFFER_SIZE) {
        APIR_WARN("host", "%s: buffer of %llu bytes refused (max %llu)", s->name, (unsigned long long)size,
                  (unsigned long long)MAX_BUFFER_SIZE);
    } else if (buffer_quota_ok(s, size)) {
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(slot->object, (size_t)size);
        if (buf)
            handle = buffer_register(s, buf, (uint32_t)slot->aux, 0);
        else
            APIR_WARN("host", "%s: allocating %llu bytes failed", s->name, (unsigned long long)size);
    }
    ENCODE(BUFFER_TYPE_ALLOC_BUFFER, handle);  /* 0 = failure, as in 0.1 */
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_GET_ALLOC_SIZE)
{
    uint64_t h = apir_decode_u64(req);
    ggml_backend_buffer_type_t buft = buft_of(s, h);
    struct ggml_tensor *t = apir_import_inline(s, req);
    if (req->fatal || !t)
        return bad(s, "BUFFER_TYPE_GET_ALLOC_SIZE", "malformed or refused tensor");
    if (!buft)
        return APIR_HANDLER_BAD_HANDLE;
    ENCODE(BUFFER_TYPE_GET_ALLOC_SIZE, (uint64_t)ggml_backend_buft_get_alloc_size(buft, t));
    return APIR_HANDLER_OK;
}

/* ---- buffers ------------------------------------------------------------------ */

HANDLER(BUFFER_GET_BASE)
{
    uint64_t h;
    if (!DECODE(BUFFER_GET_BASE, &h))
        return bad(s, "BUFFER_GET_BASE", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb)
        return APIR_HANDLER_BAD_HANDLE;
    ENCODE(BUFFER_GET_BASE, hb->opaque_base);
    return APIR_HANDLER_OK;
}

/* [data, data+len) of buf is about to change: the host's copies of those
 * bytes - upload mirrors (upload_mirror.c), weight copies
 * (weight_copies.c) - are old.  len SIZE_MAX: the whole buffer. */
static void forget_copies(struct apir_session *s, struct apir_host_buffer *hb, const void *data, size_t len)
{
    if (len == SIZE_MAX) {
        apir_mirror_forget_buffer(s, hb->buffer);
        apir_weights_forget_buffer(s, hb->buffer);
    } else {
        apir_mirror_forget_range(s, hb->buffer, data, len);
        apir_weights_forget_range(s, data, len);
    }
}

/* A tensor of a data command: it must lie in the buffer the command names,
 * and [offset, offset+size) must lie inside the tensor. */
static struct ggml_tensor *data_tensor(struct apir_session *s, const char *cmd, uint64_t h,
                                       const struct apir_tensor_rec *rec, uint64_t offset, uint64_t size)
{
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb || rec->buffer != h) {
        bad(s, cmd, "buffer handle unknown or not the tensor's buffer");
        return NULL;
    }
    if (!apir_import_begin(s, 1, 0))
        return NULL;
    struct ggml_tensor *t = apir_import_tensor(s, rec, true, NULL);
    if (!t) {
        bad(s, cmd, apir_import_error());
        return NULL;
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, size, &end) || end > ggml_nbytes(t)) {
        bad(s, cmd, "offset/size outside the tensor");
        return NULL;
    }
    return t;
}

static uint32_t tensor_io(struct apir_session *s, const char *cmd, bool set, uint64_t h, const struct apir_tensor_rec *rec,
                          uint32_t res_id, uint64_t blob_offset, uint64_t offset, uint64_t size)
{
    struct ggml_tensor *t = data_tensor(s, cmd, h, rec, offset, size);
    if (!t)
        return APIR_HANDLER_BAD_REQUEST;
    if (size == 0)
        return APIR_HANDLER_OK;
    uint8_t *data = apir_session_blob_range(s, res_id, blob_offset, size);
    if (!data)
        return bad(s, cmd, "shared-memory range outside its blob");
    if (set) {
        forget_copies(s, buffer_of(s, h), (uint8_t *)t->data + offset, (size_t)size);
        if (!apir_mirror_upload(s, t, data, offset, size)) {
            apir_session_settle(s);
            ggml_backend_tensor_set(t, data, (size_t)offset, (size_t)size);
        }
    } else
        ggml_backend_tensor_get(t, data, (size_t)offset, (size_t)size);
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_SET_TENSOR)
{
    (void)reply;
    uint64_t h, offset, size;
    uint32_t res_id;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_SET_TENSOR, &h, &rec, &res_id, &offset, &size))
        return bad(s, "BUFFER_SET_TENSOR", "malformed request");
    return tensor_io(s, "BUFFER_SET_TENSOR", true, h, &rec, res_id, 0, offset, size);
}

HANDLER(BUFFER_GET_TENSOR)
{
    (void)reply;
    uint64_t h, offset, size;
    uint32_t res_id;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_GET_TENSOR, &h, &rec, &res_id, &offset, &size))
        return bad(s, "BUFFER_GET_TENSOR", "malformed request");
    return tensor_io(s, "BUFFER_GET_TENSOR", false, h, &rec, res_id, 0, offset, size);
}

HANDLER(BUFFER_SET_TENSOR_AT)
{
    (void)reply;
    uint64_t h, blob_offset, offset, size;
    uint32_t res_id;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_SET_TENSOR_AT, &h, &rec, &res_id, &blob_offset, &offset, &size))
        return bad(s, "BUFFER_SET_TENSOR_AT", "malformed request");
    return tensor_io(s, "BUFFER_SET_TENSOR_AT", true, h, &rec, res_id, blob_offset, offset, size);
}

HANDLER(BUFFER_GET_TENSOR_AT)
{
    (void)reply;
    uint64_t h, blob_offset, offset, size;
    uint32_t res_id;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_GET_TENSOR_AT, &h, &rec, &res_id, &blob_offset, &offset, &size))
        return bad(s, "BUFFER_GET_TENSOR_AT", "malformed request");
    return tensor_io(s, "BUFFER_GET_TENSOR_AT", false, h, &rec, res_id, blob_offset, offset, size);
}

HANDLER(BUFFER_MEMSET_TENSOR)
{
    (void)reply;
    uint64_t h, offset, size;
    uint8_t value;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_MEMSET_TENSOR, &h, &rec, &value, &offset, &size))
        return bad(s, "BUFFER_MEMSET_TENSOR", "malformed request");
    struct ggml_tensor *t = data_tensor(s, "BUFFER_MEMSET_TENSOR", h, &rec, offset, size);
    if (!t)
        return APIR_HANDLER_BAD_REQUEST;
    if (size) {
        forget_copies(s, buffer_of(s, h), (uint8_t *)t->data + offset, (size_t)size);
        ggml_backend_tensor_memset(t, value, (size_t)offset, (size_t)size);
    }
    return APIR_HANDLER_OK;
}

static bool same_layout(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    if (a->type != b->type)
        return false;
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i])
            return false;
    return true;
}

HANDLER(BUFFER_CPY_TENSOR)
{
    uint64_t h;
    struct apir_tensor_rec src_rec, dst_rec;
    if (!DECODE(BUFFER_CPY_TENSOR, &h, &src_rec, &dst_rec))
        return bad(s, "BUFFER_CPY_TENSOR", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb || dst_rec.buffer != h)
        return bad(s, "BUFFER_CPY_TENSOR", "destination buffer unknown or not the named buffer");
    if (!apir_import_begin(s, 2, 0))
        return APIR_HANDLER_FAILED;
    struct ggml_tensor *src = apir_import_tensor(s, &src_rec, true, NULL);
    struct ggml_tensor *dst = src ? apir_import_tensor(s, &dst_rec, true, NULL) : NULL;
    if (!src || !dst)
        return bad(s, "BUFFER_CPY_TENSOR", apir_import_error());
    /* Backends copy ggml_nbytes(src) into dst (ggml#1103): the layouts must
     * match, as ggml itself asserts (an assert would abort the host). */
    if (!same_layout(src, dst))
        return bad(s, "BUFFER_CPY_TENSOR", "source and destination layouts differ");
    forget_copies(s, hb, dst->data, ggml_nbytes(dst));
    bool ok = ggml_backend_buffer_copy_tensor(src, dst);
    ENCODE(BUFFER_CPY_TENSOR, (int)ok);
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_CLEAR)
{
    (void)reply;
    uint64_t h;
    uint8_t value;
    if (!DECODE(BUFFER_CLEAR, &h, &value))
        return bad(s, "BUFFER_CLEAR", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb)
        return APIR_HANDLER_BAD_HANDLE;
    forget_copies(s, hb, NULL, SIZE_MAX);
    ggml_backend_buffer_clear(hb->buffer, value);
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_FREE_BUFFER)
{
    (void)reply;
    uint64_t h;
    if (!DECODE(BUFFER_FREE_BUFFER, &h))
        return bad(s, "BUFFER_FREE_BUFFER", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb)
        return APIR_HANDLER_BAD_HANDLE;
    forget_copies(s, hb, NULL, SIZE_MAX);
    ggml_backend_buffer_free(hb->buffer);
    if (hb->pinned_blob)
        apir_session_blob_unpin(s, hb->pinned_blob);
    s->n_buffers--;
    s->bytes_allocated -= hb->size;
    s->buffers_epoch++;  /* kept graphs may point into it */
    apir_handle_free(&s->handles, h);
    free(hb);
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_INIT_TENSOR)
{
    uint64_t h;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_INIT_TENSOR, &h, &rec))
        return bad(s, "BUFFER_INIT_TENSOR", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb || rec.buffer != h)
        return bad(s, "BUFFER_INIT_TENSOR", "buffer handle unknown or not the tensor's buffer");
    if (!apir_import_begin(s, 1, 0))
        return APIR_HANDLER_FAILED;
    struct ggml_tensor *t = apir_import_tensor(s, &rec, true, NULL);
    if (!t)
        return bad(s, "BUFFER_INIT_TENSOR", apir_import_error());
    /* init_tensor may clear the padding up to the allocation size. */
    size_t alloc = ggml_backend_buft_get_alloc_size(ggml_backend_buffer_get_type(hb->buffer), t);
    uint64_t end;
    if (__builtin_add_overflow(rec.data, (uint64_t)alloc, &end) || end > hb->size)
        return bad(s, "BUFFER_INIT_TENSOR", "tensor allocation outside its buffer");
    forget_copies(s, hb, t->data, alloc);
    enum ggml_status st = ggml_backend_buffer_init_tensor(hb->buffer, t);
    ENCODE(BUFFER_INIT_TENSOR, (uint32_t)st);
    return APIR_HANDLER_OK;
}

/* The guest wrote a weight whole (weight_copies.h).  The answer is advice:
 * the guest's results are the same whatever the host keeps. */
HANDLER(BUFFER_NOTE_WEIGHT)
{
    uint64_t h;
    struct apir_tensor_rec rec;
    if (!DECODE(BUFFER_NOTE_WEIGHT, &h, &rec))
        return bad(s, "BUFFER_NOTE_WEIGHT", "malformed request");
    if (!apir_weights_offered(s)) {
        ENCODE(BUFFER_NOTE_WEIGHT, (uint32_t)APIR_WEIGHT_NEVER);
        return APIR_HANDLER_OK;
    }
    struct ggml_tensor *t = data_tensor(s, "BUFFER_NOTE_WEIGHT", h, &rec, 0, 0);
    if (!t)
        return APIR_HANDLER_BAD_REQUEST;
    ENCODE(BUFFER_NOTE_WEIGHT, (uint32_t)apir_weights_note(s, buffer_of(s, h), t));
    return APIR_HANDLER_OK;
}

/* The guest wrote [offset, offset+size) of a buffer in shared memory itself:
 * copies of those bytes are old. */
HANDLER(BUFFER_WRITTEN)
{
    (void)reply;
    uint64_t h, offset, size, end;
    if (!DECODE(BUFFER_WRITTEN, &h, &offset, &size))
        return bad(s, "BUFFER_WRITTEN", "malformed request");
    struct apir_host_buffer *hb = buffer_of(s, h);
    if (!hb)
        return APIR_HANDLER_BAD_HANDLE;
    if (__builtin_add_overflow(offset, size, &end) || end > hb->size)
        return bad(s, "BUFFER_WRITTEN", "range outside the buffer");
    if (size)
        forget_copies(s, hb, hb->base + offset, (size_t)size);
    return APIR_HANDLER_OK;
}

/* ---- backend ---------------------------------------------------------------- */

/* Where a keyed graph goes: its own slot, an empty one, or the least
 * recently used. */
static struct apir_graph_slot *graph_slot_for(struct apir_session *s, uint64_t key)
{
    struct apir_graph_slot *best = &s->graph_cache[0];
    for (int i = 0; i < APIR_GRAPH_CACHE_SLOTS; i++) {
        struct apir_graph_slot *g = &s->graph_cache[i];
        if (g->key == key)
            return g;
        if (g->key == 0 || (best->key != 0 && g->last_use < best->last_use))
            best = g;
    }
    return best;
}

/*
 * Checks (op_policy.c) and computes an imported graph; the scratch it lives
 * in is s->import_sc for the duration.
 *
 * A keyed graph (in_flight) is left running on the device: the host goes on
 * to the next command at once, and answers queries - the supports_op and
 * alloc-size questions a guest's scheduler asks about every new graph -
 * while the device works, instead of after (on the H200 each new prompt
 * batch's questions waited ~6 ms behind the previous batch).  Anything that
 * is not such a query or another graph or upload on the same stream waits
 * for it first (apir_command_runs_beside_device).  Only our guests send
 * keyed graphs, and they know; a graph of APIR 0.1 is waited for before its
 * reply.
 */
static enum ggml_status run_graph(struct apir_session *s, const char *cmd, ggml_backend_t backend,
                                  struct ggml_cgraph *graph, bool in_flight, uint32_t *result)
{
    const char *why = NULL;
    uint64_t t0 = apir_now_ns(), segments0 = s->n_segments;
    enum ggml_status status = apir_policy_compute(s, backend, graph, &why);
    s->compute_in_flight = backend;
    if (!in_flight || status != GGML_STATUS_SUCCESS)
        apir_session_settle(s);
    uint64_t dt = apir_now_ns() - t0;
    s->compute_ns += dt;
    APIR_DEBUG("host", "%s: %s: %d nodes in %llu piece(s), %.1f us%s", s->name, cmd, ggml_graph_n_nodes(graph),
               (unsigned long long)(s->n_segments - segments0), dt / 1e3, in_flight ? " (launch)" : "");
    apir_mirror_forget_written(s, graph);
    s->n_graphs++;
    if (why)
        *result = bad(s, cmd, why);
    return status;
}

static uint32_t graph_compute(struct apir_session *s, const char *cmd, uint32_t res_id, uint64_t offset, uint64_t size,
                              uint64_t key, struct apir_encoder *reply)
{
    enum ggml_status status = GGML_STATUS_ABORTED;
    uint32_t result = APIR_HANDLER_OK;
    ggml_backend_t backend = apir_session_backend(s, s->device);
    const uint8_t *blob = apir_session_blob_range(s, res_id, offset, size);
    struct apir_graph_slot *slot = key ? graph_slot_for(s, key) : NULL;
    if (slot) {
        /* Its tensors may be those of the graph still in flight. */
        if (slot->key)
            apir_session_settle(s);
        slot->key = 0;  /* until this import succeeds */
        s->import_sc = &slot->scratch;
    }
    if (!backend) {
        status = GGML_STATUS_FAILED;
    } else if (!blob) {
        result = bad(s, cmd, "graph range outside its blob");
    } else {
        uint64_t t0 = apir_now_ns();
        struct ggml_cgraph *graph = apir_import_graph(s, blob, size, key != 0);
        s->import_ns += apir_now_ns() - t0;
        if (graph) {
            /* ggml's own reuse marker: backends (CUDA graphs) skip their
             * per-node change checks when it matches the last graph's. */
            graph->uid = key;
            if (slot)
                *slot = (struct apir_graph_slot){ .key = key, .epoch = s->buffers_epoch, .last_use = ++s->graph_clock,
                                                  .device = s->device, .graph = graph, .scratch = slot->scratch };
            if (slot && s->defer_graphs) {
                s->deferred = slot;
                s->deferred_cmd = APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED;
                status = GGML_STATUS_SUCCESS;
            } else {
                status = run_graph(s, cmd, backend, graph, slot != NULL, &result);
            }
        } else {
            result = bad(s, cmd, apir_import_error());
        }
    }
    s->import_sc = &s->scratch;
    apir_encode_u32(reply, (uint32_t)status);
    return result;
}

HANDLER(BACKEND_GRAPH_COMPUTE)
{
    uint32_t res_id;
    uint64_t size;
    if (!DECODE(BACKEND_GRAPH_COMPUTE, &res_id, &size))
        return bad(s, "BACKEND_GRAPH_COMPUTE", "malformed request");
    return graph_compute(s, "BACKEND_GRAPH_COMPUTE", res_id, 0, size, 0, reply);
}

HANDLER(BACKEND_GRAPH_COMPUTE_AT)
{
    uint32_t res_id;
    uint64_t offset, size;
    if (!DECODE(BACKEND_GRAPH_COMPUTE_AT, &res_id, &offset, &size))
        return bad(s, "BACKEND_GRAPH_COMPUTE_AT", "malformed request");
    return graph_compute(s, "BACKEND_GRAPH_COMPUTE_AT", res_id, offset, size, 0, reply);
}

HANDLER(BACKEND_GRAPH_COMPUTE_KEYED)
{
    uint32_t res_id;
    uint64_t offset, size, key;
    if (!DECODE(BACKEND_GRAPH_COMPUTE_KEYED, &res_id, &offset, &size, &key) || key == 0)
        return bad(s, "BACKEND_GRAPH_COMPUTE_KEYED", "malformed request");
    return graph_compute(s, "BACKEND_GRAPH_COMPUTE_KEYED", res_id, offset, size, key, reply);
}

/* The token path: a graph the guest sent before, computed again.  Index
 * values are checked again (they change per call); the records cannot. */
HANDLER(BACKEND_GRAPH_RECOMPUTE)
{
    uint64_t key;
    if (!DECODE(BACKEND_GRAPH_RECOMPUTE, &key) || key == 0)
        return bad(s, "BACKEND_GRAPH_RECOMPUTE", "malformed request");
    struct apir_graph_slot *slot = NULL;
    for (int i = 0; i < APIR_GRAPH_CACHE_SLOTS && !slot; i++)
        if (s->graph_cache[i].key == key)
            slot = &s->graph_cache[i];
    ggml_backend_t backend = apir_session_backend(s, s->device);
    if (!slot || slot->epoch != s->buffers_epoch || slot->device != s->device || !backend) {
        apir_encode_u32(reply, GGML_STATUS_ABORTED);
        return APIR_HANDLER_STALE;
    }
    slot->last_use = ++s->graph_clock;
    s->n_recomputes++;
    if (s->defer_graphs) {
        s->deferred = slot;
        s->deferred_cmd = APIR_CMD_BACKEND_GRAPH_RECOMPUTE;
        apir_encode_u32(reply, GGML_STATUS_SUCCESS);
        return APIR_HANDLER_OK;
    }
    uint32_t result = APIR_HANDLER_OK;
    s->import_sc = &slot->scratch;
    enum ggml_status status = run_graph(s, "BACKEND_GRAPH_RECOMPUTE", backend, slot->graph, true, &result);
    s->import_sc = &s->scratch;
    apir_encode_u32(reply, (uint32_t)status);
    return result;
}

/*
 * Keyed graphs (0.2) are answered once accepted (decoded, checked, kept)
 * and computed right after the reply, before the next command is read: the
 * guest prepares its next batch while the device works, as with a local
 * GPU's asynchronous graph_compute (llama.cpp overlaps a batch's CPU work
 * with the previous batch that way).  Commands stay strictly ordered, so
 * nothing can see or touch memory the graph is using.  What fails while
 * computing (an index refused mid-graph, a backend error) is reported by the
 * next command that waits for results: a get, a synchronize, a graph.
 */
void apir_session_run_deferred(struct apir_session *s)
{
    struct apir_graph_slot *slot = s->deferred;
    if (!slot)
        return;
    s->deferred = NULL;
    uint64_t t0 = apir_now_ns();
    ggml_backend_t backend = apir_session_backend(s, slot->device);
    uint32_t result = APIR_HANDLER_OK;
    s->import_sc = &slot->scratch;
    enum ggml_status status =
        backend ? run_graph(s, "deferred graph", backend, slot->graph, true, &result) : GGML_STATUS_FAILED;
    s->import_sc = &s->scratch;
    s->cmd_ns[s->deferred_cmd] += apir_now_ns() - t0;
    if (result != APIR_HANDLER_OK || status != GGML_STATUS_SUCCESS) {
        s->deferred_error = status == GGML_STATUS_ABORTED ? "a graph was refused while computing" : "a graph failed";
        slot->key = 0;  /* not kept: a recompute must send it again */
    }
}

static bool waits_for_results(uint32_t cmd)
{
    return cmd == APIR_CMD_BUFFER_GET_TENSOR || cmd == APIR_CMD_BUFFER_GET_TENSOR_AT || cmd == APIR_CMD_BACKEND_SYNCHRONIZE ||
           cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE || cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_AT ||
           cmd == APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED || cmd == APIR_CMD_BACKEND_GRAPH_RECOMPUTE;
}

HANDLER(BACKEND_SYNCHRONIZE)
{
    (void)req;
    (void)reply;
    ggml_backend_t backend = apir_session_backend(s, s->device);
    if (!backend)
        return APIR_HANDLER_FAILED;
    ggml_backend_synchronize(backend);
    return APIR_HANDLER_OK;
}

/* ---- apir 0.2 device extensions ------------------------------------------------ */

HANDLER(DEVICE_SELECT)
{
    (void)reply;
    uint32_t index;
    if (!DECODE(DEVICE_SELECT, &index))
        return bad(s, "DEVICE_SELECT", "malformed request");
    if (index >= s->host->n_devices)
        return bad(s, "DEVICE_SELECT", "no such device");
    s->device = index;
    return APIR_HANDLER_OK;
}

/* The subject tensor of a tensor list, with its srcs resolved. */
static struct ggml_tensor *list_subject(struct apir_session *s, const struct apir_tensor_list *list)
{
    if (!apir_import_begin(s, list->count, 0))
        return NULL;
    struct ggml_tensor **tensors = apir_import_list(s, list->count, list->records, false);
    return tensors ? tensors[0] : NULL;
}

/* An op and its srcs: 1 + GGML_MAX_SRC records, view sources included. */
#define MAX_LIST_TENSORS (2 * (GGML_MAX_SRC + 1))

HANDLER(DEVICE_SUPPORTS_OP_L)
{
    struct apir_tensor_list list;
    if (!DECODE(DEVICE_SUPPORTS_OP_L, &list, (uint32_t)MAX_LIST_TENSORS))
        return bad(s, "DEVICE_SUPPORTS_OP_L", "malformed request");
    struct ggml_tensor *t = list_subject(s, &list);
    if (!t)
        APIR_DEBUG("host", "%s: supports_op: refused tensor: %s", s->name, apir_import_error());
    ENCODE(DEVICE_SUPPORTS_OP_L, (int)supports(s, t));
    return APIR_HANDLER_OK;
}

HANDLER(DEVICE_OFFLOAD_OP_L)
{
    struct apir_tensor_list list;
    if (!DECODE(DEVICE_OFFLOAD_OP_L, &list, (uint32_t)MAX_LIST_TENSORS))
        return bad(s, "DEVICE_OFFLOAD_OP_L", "malformed request");
    struct ggml_tensor *t = list_subject(s, &list);
    ENCODE(DEVICE_OFFLOAD_OP_L, (int)(t && ggml_backend_dev_offload_op(cur_dev(s), t)));
    return APIR_HANDLER_OK;
}

HANDLER(BUFFER_TYPE_GET_ALLOC_SIZE_L)
{
    uint64_t h;
    struct apir_tensor_list list;
    if (!DECODE(BUFFER_TYPE_GET_ALLOC_SIZE_L, &h, &list, (uint32_t)MAX_LIST_TENSORS))
        return bad(s, "BUFFER_TYPE_GET_ALLOC_SIZE_L", "malformed request");
    ggml_backend_buffer_type_t buft = buft_of(s, h);
    if (!buft)
        return APIR_HANDLER_BAD_HANDLE;
    struct ggml_tensor *t = list_subject(s, &list);
    if (!t)
        return bad(s, "BUFFER_TYPE_GET_ALLOC_SIZE_L", apir_import_error());
    ENCODE(BUFFER_TYPE_GET_ALLOC_SIZE_L, (uint64_t)ggml_backend_buft_get_alloc_size(buft, t));
    return APIR_HANDLER_OK;
}

/* ---- entry points ------------------------------------------------------------- */

uint32_t apir_session_forward(struct apir_session *s, uint32_t cmd, struct apir_decoder *req, struct apir_encoder *reply)
{
    if (cmd >= APIR_CMD_COUNT || !handlers[cmd]) {
        APIR_WARN("host", "%s: unknown command %u", s->name, cmd);
        return APIR_HANDLER_INVALID_INDEX;
    }
    if (s->minor < apir_command_minor(cmd)) {
        APIR_WARN("host", "%s: %s needs protocol 0.%u (negotiated 0.%u)", s->name, apir_command_name(cmd),
                  apir_command_minor(cmd), s->minor);
        return APIR_HANDLER_INVALID_INDEX;
    }
    apir_session_run_deferred(s);
    /* Queued uploads (upload_mirror.c) and a graph in flight (run_graph)
     * are ordered only with what runs on their stream: graphs, and further
     * uploads, which see to it themselves; queries touch no tensor memory.
     * Everything else waits for them. */
    if (!apir_command_runs_beside_device(cmd))
        apir_session_settle(s);
    if (s->deferred_error && waits_for_results(cmd)) {
        APIR_WARN("host", "%s: %s fails: %s before it", s->name, apir_command_name(cmd), s->deferred_error);
        s->deferred_error = NULL;
        s->n_refused++;
        return APIR_HANDLER_BAD_REQUEST;
    }
    uint64_t t0 = apir_now_ns();
    uint32_t result = handlers[cmd](s, req, reply);
    s->cmd_ns[cmd] += apir_now_ns() - t0;
    s->cmd_count[cmd]++;
    s->n_commands++;
    if (result != APIR_HANDLER_OK)
        s->n_refused++;
    if (result == APIR_HANDLER_OK && reply->fatal) {
        APIR_WARN("host", "%s: %s: reply does not fit the reply blob", s->name, apir_command_name(cmd));
        return APIR_HANDLER_REPLY_FULL;
    }
    return result;
}

uint32_t apir_session_handshake(struct apir_session *s, struct apir_decoder *req, struct apir_encoder *reply)
{
    uint32_t major = apir_decode_u32(req);
    uint32_t minor = apir_decode_u32(req);
    if (req->fatal) {
        APIR_WARN("host", "%s: malformed handshake", s->name);
        return 0;
    }
    s->minor = minor < APIR_VERSION_MINOR ? minor : APIR_VERSION_MINOR;
    apir_encode_u32(reply, APIR_VERSION_MAJOR);
    apir_encode_u32(reply, s->minor);
    if (major != APIR_VERSION_MAJOR) {
        APIR_WARN("host", "%s: guest speaks APIR %u.%u, host %u.%u", s->name, major, minor, APIR_VERSION_MAJOR,
                  APIR_VERSION_MINOR);
        return 0;
    }
    APIR_INFO("host", "%s: handshake: guest 0.%u, using 0.%u", s->name, minor, s->minor);
    return APIR_HANDSHAKE_MAGIC;
}
