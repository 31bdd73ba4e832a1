/*
 * Host dispatch: the handlers of every command except the graph ones
 * (graph_exec.c), and the entry point that runs a command.
 *
 * The dispatch array is derived from the command table: per row, decode
 * the request into its checked struct (requests.h), call host_cmd_<NAME>,
 * encode the reply struct (apir_messages.h).  Handlers call ggml's public
 * backend API and check only what ties items together.
 */
#include "apir_log.h"
#include "apir_proto.h"
#include "buffers.h"
#include "download_pieces.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "graph_exec.h"
#include "handlers.h"
#include "import.h"
#include "op_device.h"
#include "upload_mirror.h"
#include "weight_cache.h"
#include "weight_copies.h"
#include "dispatcher.h"
#include "wait.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t apir_refuse(struct apir_session *s, uint32_t cmd, const char *why)
{
    APIR_WARN("host", "%s: %s refused: %s", s->name, apir_command_name(cmd), why);
    return APIR_HANDLER_BAD_REQUEST;
}

static ggml_backend_dev_t cur_dev(struct apir_session *s) { return s->host->devices[s->device]; }

/* ---- device --------------------------------------------------------------- */

APIR_HANDLER(DEVICE_GET_DEVICE_COUNT)
{
    (void)req;
    rep->count = (int32_t)s->host->n_devices;
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_COUNT)
{
    (void)req;
    rep->count = (int32_t)s->host->n_devices;
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_NAME)
{
    (void)req;
    rep->name = ggml_backend_dev_name(cur_dev(s));
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_DESCRIPTION)
{
    (void)req;
    rep->description = ggml_backend_dev_description(cur_dev(s));
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_TYPE)
{
    (void)req;
    rep->type = (uint32_t)ggml_backend_dev_type(cur_dev(s));
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_MEMORY)
{
    (void)req;
    size_t free_mem = 0, total = 0;
    ggml_backend_dev_memory(cur_dev(s), &free_mem, &total);
    rep->free_bytes = free_mem;
    rep->total_bytes = total;
    return APIR_HANDLER_OK;
}

/* The device's own answer and what its kernels assume besides (op_device.c) */
static bool supports(struct apir_session *s, const struct ggml_tensor *t)
{
    return t && apir_device_supports_op(cur_dev(s), t);
}

APIR_HANDLER(DEVICE_SUPPORTS_OP)
{
    rep->supported = supports(s, req->op);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_BUFFER_TYPE)
{
    (void)req;
    rep->buffer_type = s->buft_handles[s->device];
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_GET_PROPS)
{
    (void)req;
    struct ggml_backend_dev_props props;
    ggml_backend_dev_get_props(cur_dev(s), &props);
    /* Host buffers and events are host-local: not offered to the guest. */
    rep->buffer_from_host_ptr = props.caps.buffer_from_host_ptr;
    rep->mmap_support = props.caps.mmap_support;
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_BUFFER_FROM_PTR)
{
    struct apir_blob *blob = apir_session_blob_find(s, req->blob);
    if (!blob || blob->size == SIZE_MAX || req->size == 0 || req->size > blob->size || req->size >= APIR_MAX_BUFFER_SIZE)
        return apir_refuse(s, APIR_CMD_DEVICE_BUFFER_FROM_PTR, "blob unknown or smaller than the buffer");
    /* Backends assert their buffers' alignment (the CPU's: 32 bytes); a
     * file blob starts where the guest says in its first page. */
    ggml_backend_dev_t dev = cur_dev(s);
    size_t align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(dev));
    if (align && (uintptr_t)blob->ptr % align != 0)
        return apir_refuse(s, APIR_CMD_DEVICE_BUFFER_FROM_PTR, "blob not aligned for the device's buffers");
    /* ggml calls the device's function unchecked, and CUDA's is NULL: a
     * guest asking a CUDA host for a buffer over its blob crashed the worker
     * (test_index_checks under APIR_TEST_BACKEND=CUDA). */
    if (!dev->iface.buffer_from_host_ptr)
        return apir_refuse(s, APIR_CMD_DEVICE_BUFFER_FROM_PTR, "the device takes no buffers over host memory");
    if (!apir_buffer_quota_ok(s, req->size))
        return APIR_HANDLER_LIMIT;
    ggml_backend_buffer_t buf =
        ggml_backend_dev_buffer_from_host_ptr(dev, blob->ptr, (size_t)req->size, (size_t)req->max_tensor_size);
    uint64_t handle = buf ? apir_buffer_register(s, buf, s->device, blob) : 0;
    if (!handle)
        return APIR_HANDLER_FAILED;
    rep->buffer = handle;
    rep->buffer_type = s->buft_handles[s->device];
    return APIR_HANDLER_OK;
}

/* ---- buffer types ----------------------------------------------------------- */

APIR_HANDLER(BUFFER_TYPE_GET_NAME)
{
    rep->name = ggml_backend_buft_name(req->buffer_type.buft);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_GET_ALIGNMENT)
{
    rep->alignment = ggml_backend_buft_get_alignment(req->buffer_type.buft);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_GET_MAX_SIZE)
{
    uint64_t max = ggml_backend_buft_get_max_size(req->buffer_type.buft);
    rep->max_size = max < APIR_MAX_BUFFER_SIZE ? max : APIR_MAX_BUFFER_SIZE - 1;
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_IS_HOST)
{
    (void)s;
    (void)req;
    rep->is_host = false;  /* host memory is never the guest's */
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_ALLOC_BUFFER)
{
    uint64_t handle = 0;
    if (req->size >= APIR_MAX_BUFFER_SIZE) {
        APIR_WARN("host", "%s: buffer of %llu bytes refused (max %llu)", s->name, (unsigned long long)req->size,
                  (unsigned long long)APIR_MAX_BUFFER_SIZE);
    } else if (apir_buffer_quota_ok(s, req->size)) {
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(req->buffer_type.buft, (size_t)req->size);
        if (buf)
            handle = apir_buffer_register(s, buf, req->buffer_type.device, 0);
        else
            APIR_WARN("host", "%s: allocating %llu bytes failed", s->name, (unsigned long long)req->size);
    }
    /* 0.1 answers a refusal with handle 0; from 0.3 a quota is a LIMIT,
     * whose reply says which. */
    if (!handle && s->limit_why[0] && apir_minor_has(s->minor, APIR_FEATURE_LIMIT_REASON))
        return APIR_HANDLER_LIMIT;
    rep->buffer = handle;  /* 0 = failure, as in 0.1 */
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_GET_ALLOC_SIZE)
{
    if (!req->tensor)
        return apir_refuse(s, APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE, "refused tensor");
    rep->size = ggml_backend_buft_get_alloc_size(req->buffer_type.buft, req->tensor);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_TYPE_GET_ALLOC_SIZE_L)
{
    if (!req->tensor)
        return apir_refuse(s, APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE_L, "its tensor was refused (why: at debug level)");
    rep->size = ggml_backend_buft_get_alloc_size(req->buffer_type.buft, req->tensor);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_SUPPORTS_OP_L)
{
    rep->supported = supports(s, req->op);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_OFFLOAD_OP_L)
{
    rep->offload = req->op && ggml_backend_dev_offload_op(cur_dev(s), req->op);
    return APIR_HANDLER_OK;
}

/*
 * Several questions of one kind (apir 0.8): each answered as its _L command
 * would be, so that a guest caching the answers holds exactly the host's.
 * The records are read once, in place, and imported one question at a time
 * into the session's scratch; the answers are written over the questions'
 * start only after the last one was read.
 */
APIR_HANDLER(DEVICE_ASK_OPS)
{
    const uint32_t cmd = APIR_CMD_DEVICE_ASK_OPS;
    if (req->question < APIR_ASK_SUPPORTS_OP || req->question > APIR_ASK_ALLOC_SIZE)
        return apir_refuse(s, cmd, "unknown question");
    uint8_t *blob = apir_session_blob_range(s, req->blob, 0, req->size);
    if (!blob)
        return apir_refuse(s, cmd, "questions outside their blob");
    struct apir_decoder dec;
    apir_decoder_init(&dec, blob, (size_t)req->size);
    const uint32_t n = apir_decode_u32(&dec), m = apir_decode_u32(&dec);
    if (dec.fatal || n == 0 || n > APIR_ASK_OPS_MAX || m == 0 || m > APIR_ASK_OPS_MAX_RECORDS)
        return apir_refuse(s, cmd, "question or record count out of range");
    uint64_t answers[APIR_ASK_OPS_MAX];
    for (uint32_t q = 0; q < n; q++) {
        const uint8_t *records = apir_decode_inplace(&dec, (size_t)m * APIR_TENSOR_REC_SIZE);
        if (dec.fatal)
            return apir_refuse(s, cmd, "fewer records than questions need");
        const char *why = NULL;
        struct ggml_tensor **tensors = NULL;
        if (apir_import_begin(&s->scratch, m, 0, &why))
            tensors = apir_import_list(s, &s->scratch, m, records, false, &why);
        const struct ggml_tensor *t = tensors ? tensors[0] : NULL;
        if (!t)
            APIR_DEBUG("host", "%s: %s: question %u refused: %s", s->name, apir_command_name(cmd), q, why);
        switch (req->question) {
        case APIR_ASK_SUPPORTS_OP:
            answers[q] = supports(s, t);
            break;
        case APIR_ASK_OFFLOAD_OP:
            answers[q] = t && ggml_backend_dev_offload_op(cur_dev(s), t);
            break;
        default:
            answers[q] = t ? ggml_backend_buft_get_alloc_size(req->buffer_type.buft, t) : 0;
            break;
        }
    }
    /* n answers fit where the n * m records were read (8 <= 304 bytes each). */
    memcpy(blob, answers, (size_t)n * sizeof(answers[0]));
    rep->answered = n;
    return APIR_HANDLER_OK;
}

APIR_HANDLER(DEVICE_SELECT)
{
    (void)rep;
    if (req->device >= s->host->n_devices)
        return apir_refuse(s, APIR_CMD_DEVICE_SELECT, "no such device");
    s->device = req->device;
    return APIR_HANDLER_OK;
}

/* ---- buffers ------------------------------------------------------------------ */

APIR_HANDLER(BUFFER_GET_BASE)
{
    (void)s;
    rep->base = req->buffer->opaque_base;
    return APIR_HANDLER_OK;
}

/* A tensor of a data command must lie in the buffer the command names. */
static bool in_buffer(const struct ggml_tensor *t, const struct apir_host_buffer *hb)
{
    return t->buffer == hb->buffer;
}

/* [offset, offset+size) must lie inside the tensor. */
static bool in_tensor(const struct ggml_tensor *t, uint64_t offset, uint64_t size)
{
    uint64_t end;
    return !__builtin_add_overflow(offset, size, &end) && end <= ggml_nbytes(t);
}

/* Why a data command's tensor range is refused, or NULL: the tensor in the
 * buffer the command names, the range inside the tensor. */
static const char *tensor_range_error(const struct ggml_tensor *t, const struct apir_host_buffer *hb, uint64_t offset,
                                      uint64_t size)
{
    if (!in_buffer(t, hb))
        return "the tensor is not in the named buffer";
    return in_tensor(t, offset, size) ? NULL : "offset/size outside the tensor";
}

/* The four tensor copies: SET/GET_TENSOR from the start of a blob (the data
 * area), their _AT forms from blob_offset (a guest host buffer). */
enum tensor_io_dir { TENSOR_SET, TENSOR_GET };

static uint32_t tensor_io(struct apir_session *s, uint32_t cmd, enum tensor_io_dir dir, struct apir_host_buffer *hb,
                          struct ggml_tensor *t, uint32_t blob, uint64_t blob_offset, uint64_t offset, uint64_t size)
{
    const char *why = tensor_range_error(t, hb, offset, size);
    if (why)
        return apir_refuse(s, cmd, why);
    if (size == 0)
        return APIR_HANDLER_OK;
    uint8_t *data = apir_session_blob_range(s, blob, blob_offset, size);
    if (!data)
        return apir_refuse(s, cmd, "shared-memory range outside its blob");
    if (dir == TENSOR_SET) {
        apir_buffer_forget_copies(s, hb, (uint8_t *)t->data + offset, (size_t)size);
        if (!apir_mirror_upload(s, t, data, offset, size)) {
            apir_session_settle(s);
            ggml_backend_tensor_set(t, data, (size_t)offset, (size_t)size);
        }
    } else if (!apir_download_pieces_start(s, t, data, offset, size)) {
        /* Not in pieces (a stream transport sends those as they land): the
         * whole copy, here. */
        ggml_backend_tensor_get(t, data, (size_t)offset, (size_t)size);
    }
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_SET_TENSOR)
{
    (void)rep;
    return tensor_io(s, APIR_CMD_BUFFER_SET_TENSOR, TENSOR_SET, req->buffer, req->tensor, req->blob, 0, req->offset,
                     req->size);
}

APIR_HANDLER(BUFFER_GET_TENSOR)
{
    (void)rep;
    return tensor_io(s, APIR_CMD_BUFFER_GET_TENSOR, TENSOR_GET, req->buffer, req->tensor, req->blob, 0, req->offset,
                     req->size);
}

APIR_HANDLER(BUFFER_SET_TENSOR_AT)
{
    (void)rep;
    return tensor_io(s, APIR_CMD_BUFFER_SET_TENSOR_AT, TENSOR_SET, req->buffer, req->tensor, req->blob, req->blob_offset,
                     req->offset, req->size);
}

APIR_HANDLER(BUFFER_GET_TENSOR_AT)
{
    (void)rep;
    return tensor_io(s, APIR_CMD_BUFFER_GET_TENSOR_AT, TENSOR_GET, req->buffer, req->tensor, req->blob, req->blob_offset,
                     req->offset, req->size);
}

/*
 * A keyed graph with the small uploads it reads (apir 0.8): each upload is
 * a BUFFER_SET_TENSOR (same checks, same path), the graph then runs as
 * BACKEND_GRAPH_COMPUTE_KEYED or, without a graph, RECOMPUTE.  What is
 * refused stops the command: uploads before it stay done, as they would
 * have as separate commands.
 */
static uint32_t graph_inputs(struct apir_session *s, uint32_t cmd, uint32_t blob_id, uint64_t at, uint64_t size)
{
    const uint8_t *blob = size ? apir_session_blob_range(s, blob_id, at, size) : NULL;
    if (size && !blob)
        return apir_refuse(s, cmd, "uploads outside their blob");
    if (!size)
        return APIR_HANDLER_OK;
    struct apir_decoder dec;
    apir_decoder_init(&dec, blob, (size_t)size);
    const uint32_t n = apir_decode_u32(&dec);
    for (uint32_t i = 0; i < n && !dec.fatal; i++) {
        const uint64_t handle = apir_decode_u64(&dec);
        struct apir_tensor_rec rec;
        apir_decode_tensor(&dec, &rec);
        const uint64_t offset = apir_decode_u64(&dec), len = apir_decode_u64(&dec);
        if (dec.fatal || len > apir_decoder_left(&dec))
            break;
        const uint8_t *bytes = apir_decode_inplace(&dec, (size_t)len);
        struct apir_handle_slot *slot = apir_handle_get(&s->handles, handle, APIR_HANDLE_BUFFER);
        if (!slot) {
            APIR_WARN("host", "%s: %s refused: an upload names an unknown, stale or foreign buffer handle", s->name,
                      apir_command_name(cmd));
            return APIR_HANDLER_BAD_HANDLE;
        }
        const char *why = NULL;
        struct ggml_tensor *t = NULL;
        if (apir_import_begin(&s->scratch, 1, 0, &why))
            t = apir_import_tensor(s, &s->scratch, &rec, true, NULL, &why);
        if (!t)
            return apir_refuse(s, cmd, why ? why : "an upload's tensor was refused");
        uint32_t result = tensor_io(s, cmd, TENSOR_SET, slot->object, t, blob_id, at + (uint64_t)(bytes - blob), offset, len);
        if (result != APIR_HANDLER_OK)
            return result;
    }
    if (dec.fatal || apir_decoder_left(&dec) != 0)
        return apir_refuse(s, cmd, "malformed uploads");
    return APIR_HANDLER_OK;
}

/* 43 and 44: the uploads, then the graph - whole (base 0), as a delta
 * against the graph of key base, or, for 43 with graph_size 0, the one kept
 * under key. */
static uint32_t graph_with_inputs(struct apir_session *s, uint32_t cmd, uint32_t blob, uint64_t inputs_offset,
                                  uint64_t inputs_size, uint64_t graph_offset, uint64_t graph_size, uint64_t key,
                                  uint64_t base, uint32_t *status)
{
    *status = GGML_STATUS_FAILED;
    if (key == 0)
        return apir_refuse(s, cmd, "key 0");
    uint32_t result = graph_inputs(s, cmd, blob, inputs_offset, inputs_size);
    if (result != APIR_HANDLER_OK)
        return result;
    if (graph_size == 0 && base == 0) {
        const struct apir_request_BACKEND_GRAPH_RECOMPUTE again = { .key = key };
        struct apir_reply_BACKEND_GRAPH_RECOMPUTE reply;
        result = host_cmd_BACKEND_GRAPH_RECOMPUTE(s, &again, &reply);
        *status = reply.status;
        return result;
    }
    /* A whole graph is accounted as the BACKEND_GRAPH_COMPUTE_KEYED it is. */
    return apir_graph_compute_keyed(s, base ? cmd : APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, blob, graph_offset, graph_size,
                                    key, base, status);
}

APIR_HANDLER(BACKEND_GRAPH_COMPUTE_INPUTS)
{
    return graph_with_inputs(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_INPUTS, req->blob, req->inputs_offset, req->inputs_size,
                             req->graph_offset, req->graph_size, req->key, 0, &rep->status);
}

/* A keyed graph sent as its changes against the last graph the host
 * imported (apir 0.9; the format: apir_import_graph, import.h).  The
 * uploads stay done when the base is gone (APIR_HANDLER_STALE): the guest
 * sends the graph whole. */
APIR_HANDLER(BACKEND_GRAPH_COMPUTE_DELTA)
{
    if (req->base == 0) {
        rep->status = GGML_STATUS_FAILED;
        return apir_refuse(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, "base 0");
    }
    return graph_with_inputs(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_DELTA, req->blob, req->inputs_offset, req->inputs_size,
                             req->graph_offset, req->graph_size, req->key, req->base, &rep->status);
}

/*
 * GET_TENSOR_AT in pieces (apir 0.6; the contract is struct
 * apir_chunk_progress, apir_proto.h).  A GPU's copy into the data area and
 * the guest's copy out of it used to run one after the other; publishing
 * each finished piece lets the guest copy piece k while the device copies
 * piece k + 1.  The host only writes the counter and never waits for the
 * guest, so a guest that stops reading costs it nothing.
 */
APIR_HANDLER(BUFFER_GET_TENSOR_CHUNKED)
{
    (void)rep;
    const uint32_t cmd = APIR_CMD_BUFFER_GET_TENSOR_CHUNKED;
    struct ggml_tensor *t = req->tensor;
    const char *why = tensor_range_error(t, req->buffer, req->offset, req->size);
    if (why)
        return apir_refuse(s, cmd, why);
    if (req->chunk < APIR_CHUNK_MIN)
        return apir_refuse(s, cmd, "pieces smaller than APIR_CHUNK_MIN");
    const uint64_t words_size = sizeof(struct apir_chunk_progress);
    uint8_t *words = apir_session_blob_range(s, req->blob, req->progress_offset, words_size);
    uint8_t *data = req->size ? apir_session_blob_range(s, req->blob, req->blob_offset, req->size) : NULL;
    if (!words || (req->size && !data))
        return apir_refuse(s, cmd, "shared-memory range outside its blob");
    if ((uintptr_t)words % _Alignof(struct apir_chunk_progress) != 0)
        return apir_refuse(s, cmd, "progress words not aligned");
    /* Both ranges are inside the blob, so neither end overflows. */
    if (req->size && req->progress_offset < req->blob_offset + req->size &&
        req->blob_offset < req->progress_offset + words_size)
        return apir_refuse(s, cmd, "progress words inside the range");
    struct apir_chunk_progress *progress = (struct apir_chunk_progress *)words;
    /* At most size / APIR_CHUNK_MIN + 1 pieces: a tensor is below
     * APIR_MAX_BUFFER_SIZE, so the count fits its 32 bits. */
    uint32_t pieces = 0;
    for (uint64_t done = 0; done < req->size;) {
        const uint64_t n = req->size - done < req->chunk ? req->size - done : req->chunk;
        ggml_backend_tensor_get(t, data + done, (size_t)(req->offset + done), (size_t)n);
        done += n;
        /* seq_cst pairs with the guest's store of guest_sleeping before its
         * last look at the counter: one of the two sides sees the other. */
        atomic_store(&progress->pieces_done, ++pieces);
        if (atomic_load(&progress->guest_sleeping))
            apir_futex_wake(&progress->pieces_done);
    }
    return APIR_HANDLER_OK;
}
_Static_assert(APIR_MAX_BUFFER_SIZE / APIR_CHUNK_MIN < UINT32_MAX, "piece counts fit 32 bits");

APIR_HANDLER(BUFFER_MEMSET_TENSOR)
{
    (void)rep;
    const char *why = tensor_range_error(req->tensor, req->buffer, req->offset, req->size);
    if (why)
        return apir_refuse(s, APIR_CMD_BUFFER_MEMSET_TENSOR, why);
    /* ggml asserts a backend buffer has one (an abort, not an error) */
    if (!req->buffer->buffer->iface.memset_tensor)
        return apir_refuse(s, APIR_CMD_BUFFER_MEMSET_TENSOR, "the device's buffers have no memset");
    if (req->size) {
        apir_buffer_forget_copies(s, req->buffer, (uint8_t *)req->tensor->data + req->offset, (size_t)req->size);
        ggml_backend_tensor_memset(req->tensor, req->value, (size_t)req->offset, (size_t)req->size);
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

APIR_HANDLER(BUFFER_CPY_TENSOR)
{
    if (!in_buffer(req->dst, req->buffer))
        return apir_refuse(s, APIR_CMD_BUFFER_CPY_TENSOR, "the destination is not in the named buffer");
    /* Backends copy ggml_nbytes(src) into dst (ggml#1103): the layouts must
     * match, as ggml itself asserts (an assert would abort the host). */
    if (!same_layout(req->src, req->dst))
        return apir_refuse(s, APIR_CMD_BUFFER_CPY_TENSOR, "source and destination layouts differ");
    apir_buffer_forget_copies(s, req->buffer, req->dst->data, ggml_nbytes(req->dst));
    rep->copied = ggml_backend_buffer_copy_tensor(req->src, req->dst);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_CLEAR)
{
    (void)rep;
    apir_buffer_forget_copies(s, req->buffer, NULL, SIZE_MAX);
    ggml_backend_buffer_clear(req->buffer->buffer, req->value);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_FREE_BUFFER)
{
    (void)rep;
    apir_buffer_release(s, req->buffer);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_INIT_TENSOR)
{
    struct apir_host_buffer *hb = req->buffer;
    struct ggml_tensor *t = req->tensor;
    if (!in_buffer(t, hb))
        return apir_refuse(s, APIR_CMD_BUFFER_INIT_TENSOR, "the tensor is not in the named buffer");
    /* init_tensor may clear the padding up to the allocation size. */
    size_t alloc = ggml_backend_buft_get_alloc_size(ggml_backend_buffer_get_type(hb->buffer), t);
    if ((uint8_t *)t->data < hb->base || alloc > hb->size - (size_t)((uint8_t *)t->data - hb->base))
        return apir_refuse(s, APIR_CMD_BUFFER_INIT_TENSOR, "tensor allocation outside its buffer");
    apir_buffer_forget_copies(s, hb, t->data, alloc);
    rep->status = (uint32_t)ggml_backend_buffer_init_tensor(hb->buffer, t);
    return APIR_HANDLER_OK;
}

/* The guest wrote a weight whole (weight_copies.h).  The answer is advice:
 * the guest's results are the same whatever the host keeps. */
APIR_HANDLER(BUFFER_NOTE_WEIGHT)
{
    if (!apir_weights_offered(s)) {
        rep->kept = APIR_WEIGHT_NEVER;
        return APIR_HANDLER_OK;
    }
    if (!in_buffer(req->tensor, req->buffer))
        return apir_refuse(s, APIR_CMD_BUFFER_NOTE_WEIGHT, "the tensor is not in the named buffer");
    rep->kept = (uint32_t)apir_weights_note(s, req->buffer, req->tensor);
    return APIR_HANDLER_OK;
}

/* The guest wrote [offset, offset+size) of a buffer in shared memory itself:
 * copies of those bytes are old. */
APIR_HANDLER(BUFFER_WRITTEN)
{
    (void)rep;
    uint64_t end;
    struct apir_host_buffer *hb = req->buffer;
    if (__builtin_add_overflow(req->offset, req->size, &end) || end > hb->size)
        return apir_refuse(s, APIR_CMD_BUFFER_WRITTEN, "range outside the buffer");
    if (req->size)
        apir_buffer_forget_copies(s, hb, hb->base + req->offset, (size_t)req->size);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(HOST_GET_VERSION)
{
    (void)s;
    (void)req;
    rep->major = APIR_VERSION_MAJOR;
    rep->minor = APIR_VERSION_MINOR;
    return APIR_HANDLER_OK;
}

/* ---- the guest's ggml (apir 0.7) -------------------------------------------- */

/* ggml's numbered tables: a tensor record carries an op and a type number,
 * UNARY's and GLU's first op parameter a unary or GLU op number. */
enum ggml_table { TABLE_OPS, TABLE_UNARY, TABLE_GLU, TABLE_TYPES };

static int ggml_table_count(enum ggml_table t)
{
    switch (t) {
    case TABLE_OPS: return GGML_OP_COUNT;
    case TABLE_UNARY: return GGML_UNARY_OP_COUNT;
    case TABLE_GLU: return GGML_GLU_OP_COUNT;
    default: return GGML_TYPE_COUNT;
    }
}

static const char *ggml_table_name(enum ggml_table t, int i)
{
    const char *n;
    switch (t) {
    case TABLE_OPS: n = ggml_op_name((enum ggml_op)i); break;
    case TABLE_UNARY: n = ggml_unary_op_name((enum ggml_unary_op)i); break;
    case TABLE_GLU: n = ggml_glu_op_name((enum ggml_glu_op)i); break;
    default: n = ggml_type_name((enum ggml_type)i); break;
    }
    return n ? n : "";
}

/* Every number the guest's table has names what ours names there (the guest
 * may have fewer, or more: numbers past ours name nothing here, and records
 * carrying them are refused like any unknown op or type, so a scheduler's
 * supports_op puts those nodes elsewhere).  Else why. */
static bool ggml_table_agrees(enum ggml_table t, const char *guest, char *why, size_t why_size, int *guest_n)
{
    static const char *const what[] = { "op", "unary op", "GLU op", "tensor type" };
    const int ours = ggml_table_count(t);
    int i = 0;
    for (const char *p = guest; *p; i++) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (i < ours) {
            const char *name = ggml_table_name(t, i);
            if (strlen(name) != len || strncmp(name, p, len) != 0) {
                snprintf(why, why_size, "its %s %d is %.*s, the host's %s: the two ggml number their %ss differently",
                         what[t], i, (int)(len < 40 ? len : 40), p, name, what[t]);
                *guest_n = i;
                return false;
            }
        }
        p = end ? end + 1 : p + len;
    }
    *guest_n = i;
    return true;
}

/*
 * Is the guest's ggml computed right by ours?  Tensor records carry the
 * guest's op and type numbers and op parameters, so the host computes them
 * only if every number means the same here.  Renumbered tables are refused
 * whole (apir maps no numbers: an op whose parameters changed meaning keeps
 * its name, and no table tells that); another commit with the same tables
 * is computed, and both sides log it (docs: "Which ggml a guest may use").
 */
APIR_HANDLER(HOST_CHECK_GGML)
{
    static _Thread_local char reason[512], host_ggml[128];
    snprintf(host_ggml, sizeof(host_ggml), "%s (llama.cpp %s)", ggml_version(), ggml_commit());
    rep->host_ggml = host_ggml;
    reason[0] = '\0';
    rep->reason = reason;
    const char *tables[] = { req->ops.s, req->unary_ops.s, req->glu_ops.s, req->types.s };
    int guest_n[4] = { 0 };
    rep->verdict = APIR_GGML_SAME;
    if (!req->ops.s[0] || !req->types.s[0])
        snprintf(reason, sizeof(reason), "it sent no %s table", req->ops.s[0] ? "tensor type" : "op");
    for (int t = TABLE_OPS; t <= TABLE_TYPES && !reason[0]; t++)
        ggml_table_agrees((enum ggml_table)t, tables[t], reason, sizeof(reason), &guest_n[t]);
    if (reason[0]) {
        rep->verdict = APIR_GGML_REFUSED;
        APIR_WARN("host", "%s: guest ggml %.40s (llama.cpp %.40s) refused: %s (ours: %s)", s->name, req->version.s,
                  req->commit.s, reason, host_ggml);
        return APIR_HANDLER_OK;
    }
    const char *ours = ggml_commit();
    size_t lg = strlen(req->commit.s), lo = strlen(ours);
    if (lg < 7 || lo < 7 || strncmp(req->commit.s, ours, lg < lo ? lg : lo) != 0 ||
        strcmp(req->version.s, ggml_version()) != 0) {
        rep->verdict = APIR_GGML_TABLES_EQUAL;
        APIR_INFO("host", "%s: guest ggml %.40s (llama.cpp %.40s), ours %s: its %d ops, %d types named as ours, computed",
                  s->name, req->version.s, req->commit.s, host_ggml, guest_n[TABLE_OPS], guest_n[TABLE_TYPES]);
    }
    return APIR_HANDLER_OK;
}

/* The weight cache (weight_cache.h).  A host without one says so whatever
 * hash and range are named: the guest stops asking. */
APIR_HANDLER(BUFFER_SET_TENSOR_HASH)
{
    if (!s->host->weight_cache) {
        rep->answer = APIR_WCACHE_NONE;
        return APIR_HANDLER_OK;
    }
    if (!in_buffer(req->tensor, req->buffer))
        return apir_refuse(s, APIR_CMD_BUFFER_SET_TENSOR_HASH, "the tensor is not in the named buffer");
    if (!in_tensor(req->tensor, req->offset, req->size))
        return apir_refuse(s, APIR_CMD_BUFFER_SET_TENSOR_HASH, "offset/size outside the tensor");
    rep->answer = apir_wcache_fill(s, req->buffer, req->tensor, req->offset, req->size, &req->hash);
    return APIR_HANDLER_OK;
}

APIR_HANDLER(BUFFER_CACHE_TENSOR)
{
    if (!s->host->weight_cache) {
        rep->answer = APIR_WCACHE_NONE;
        return APIR_HANDLER_OK;
    }
    if (!in_buffer(req->tensor, req->buffer))
        return apir_refuse(s, APIR_CMD_BUFFER_CACHE_TENSOR, "the tensor is not in the named buffer");
    rep->answer = apir_wcache_keep(s, req->tensor, &req->hash);
    return APIR_HANDLER_OK;
}

/* ---- dispatch ------------------------------------------------------------------ */

typedef uint32_t (*apir_dispatch_fn)(struct apir_session *s, struct apir_decoder *req, struct apir_encoder *reply);

#define APIR_X_DISPATCH_FN(num, NAME, since, classes)                                                    \
    static uint32_t dispatch_##NAME(struct apir_session *s, struct apir_decoder *dec, struct apir_encoder *enc) \
    {                                                                                                    \
        struct apir_request_##NAME req;                                                                  \
        uint32_t rc = apir_request_decode_##NAME(s, dec, &req);                                          \
        if (rc != APIR_HANDLER_OK)                                                                       \
            return rc;                                                                                   \
        struct apir_reply_##NAME rep;                                                                    \
        memset(&rep, 0, sizeof(rep));                                                                    \
        rc = host_cmd_##NAME(s, &req, &rep);                                                             \
        apir_encode_reply_##NAME(enc, &rep);                                                             \
        return rc;                                                                                       \
    }
APIR_COMMAND_LIST(APIR_X_DISPATCH_FN)
#undef APIR_X_DISPATCH_FN

static const apir_dispatch_fn dispatch[APIR_CMD_COUNT] = {
#define APIR_X_DISPATCH(num, NAME, since, classes) [num] = dispatch_##NAME,
    APIR_COMMAND_LIST(APIR_X_DISPATCH)
#undef APIR_X_DISPATCH
};

/* ---- entry points ------------------------------------------------------------- */

uint32_t apir_session_forward(struct apir_session *s, uint32_t cmd, struct apir_decoder *req, struct apir_encoder *reply)
{
    if (cmd >= APIR_CMD_COUNT || !dispatch[cmd]) {
        APIR_WARN("host", "%s: unknown command %u", s->name, cmd);
        return APIR_HANDLER_INVALID_INDEX;
    }
    if (!apir_minor_speaks(s->minor, cmd)) {
        APIR_WARN("host", "%s: %s needs protocol 0.%u (negotiated 0.%u)", s->name, apir_command_name(cmd),
                  apir_command_since(cmd), s->minor);
        return APIR_HANDLER_INVALID_INDEX;
    }
    s->cmd = cmd;
    uint32_t result = apir_graph_before_command(s, cmd);
    if (result != APIR_HANDLER_OK) {
        s->stats.n_refused++;
        return result;
    }
    s->limit_why[0] = '\0';
    uint64_t t0 = apir_now_ns();
    result = dispatch[cmd](s, req, reply);
    s->stats.cmd_ns[cmd] += apir_now_ns() - t0;
    s->stats.cmd_count[cmd]++;
    s->stats.n_commands++;
    if (result != APIR_HANDLER_OK)
        s->stats.n_refused++;
    /* 0.3: a limit's reply is its reason, one string (this guest's own
     * numbers); older guests do not read a failed command's reply. */
    if (result == APIR_HANDLER_LIMIT && apir_minor_has(s->minor, APIR_FEATURE_LIMIT_REASON) && s->limit_why[0]) {
        reply->cur = reply->start;
        reply->fatal = false;
        apir_put_u32(reply, APIR_LIMIT_REASON_TAG);
        apir_put_string(reply, s->limit_why);
    }
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
