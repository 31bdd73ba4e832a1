/*
 * Host handler tests: every command of the table through
 * apir_session_forward, in-process, on the real CPU backend, plus the
 * malformed and hostile requests each handler must refuse.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-backend-impl.h" /* device and buffer functions a test takes away */
#include "ggml-impl.h"
#include "graph_exec.h"
#include "host.h"
#include "import.h"
#include "op_device.h"
#include "op_fusion.h"
#include "buffers.h"
#include "dispatcher.h"
#include "test_records.h"
#include "test_session.h"
#include "test_util.h"
#include "weight_copies.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DATA_RES 10u
#define DATA_SIZE (1u << 20)

static struct apir_host host;
static uint8_t data_blob[DATA_SIZE] __attribute__((aligned(64)));

static struct apir_session *new_session(void)
{
    return test_session_with_blob(&host, DATA_RES, data_blob, DATA_SIZE);
}

/* A tensor list of the n records at recs. */
static struct apir_tensor_span span(uint32_t n, const struct apir_tensor_rec *recs)
{
    return (struct apir_tensor_span){ n, recs };
}

/* A handshake request (major, minor); the answer in *major, *minor. */
static uint32_t handshake(struct apir_session *s, uint32_t want_major, uint32_t want_minor, uint32_t *major,
                          uint32_t *minor)
{
    uint8_t buf[64], out[64];
    struct apir_encoder e, o;
    struct apir_decoder d;
    apir_encoder_init(&e, buf, sizeof(buf));
    apir_encode_u32(&e, want_major);
    apir_encode_u32(&e, want_minor);
    apir_decoder_init(&d, buf, apir_encoder_used(&e));
    apir_encoder_init(&o, out, sizeof(out));
    uint32_t res = apir_session_handshake(s, &d, &o);
    apir_decoder_init(&d, out, apir_encoder_used(&o));
    *major = apir_decode_u32(&d);
    *minor = apir_decode_u32(&d);
    return res;
}

static void test_handshake(void)
{
    struct apir_session *s = apir_session_new(&host, "hs");
    uint32_t major = 9, minor = 9;
    CHECK(handshake(s, 0, 2, &major, &minor) == APIR_HANDSHAKE_MAGIC);
    CHECK(major == 0 && minor == 2);

    /* A 0.1 guest is answered 0.1 and cannot send 0.2 commands. */
    CHECK(handshake(s, 0, 1, &major, &minor) == APIR_HANDSHAKE_MAGIC);
    CHECK(minor == 1);
    CHECK(fwd_DEVICE_SELECT(s, 0) == APIR_HANDLER_INVALID_INDEX);

    /* Another major is refused; a truncated handshake too. */
    CHECK(handshake(s, 1, 0, &major, &minor) == 0);
    uint8_t buf[64], out[64];
    struct apir_encoder e, o;
    struct apir_decoder d;
    apir_encoder_init(&e, buf, sizeof(buf));
    apir_encode_u32(&e, 0);
    apir_encode_u32(&e, 2);
    apir_decoder_init(&d, buf, 4);
    apir_encoder_init(&o, out, sizeof(out));
    CHECK(apir_session_handshake(s, &d, &o) == 0);
    apir_session_free(s);
}

static void test_device_commands(void)
{
    struct apir_session *s = new_session();
    struct apir_decoder r;
    int32_t count = 0;
    CHECK(fwd_DEVICE_GET_DEVICE_COUNT(s, &count) == APIR_HANDLER_OK && count == 1);
    count = 0;
    CHECK(fwd_DEVICE_GET_COUNT(s, &count) == APIR_HANDLER_OK && count == 1);
    static struct apir_string name;
    CHECK(fwd_DEVICE_GET_NAME(s, &name) == APIR_HANDLER_OK && strcmp(name.s, "CPU") == 0);
    name.s[0] = '\0';
    CHECK(fwd_DEVICE_GET_DESCRIPTION(s, &name) == APIR_HANDLER_OK && name.s[0]);
    uint32_t type = 99;
    CHECK(fwd_DEVICE_GET_TYPE(s, &type) == APIR_HANDLER_OK && type == GGML_BACKEND_DEVICE_TYPE_CPU);
    uint64_t free_mem = 0, total = 0;
    CHECK(fwd_DEVICE_GET_MEMORY(s, &free_mem, &total) == APIR_HANDLER_OK && total > 0 && free_mem <= total);
    bool a = true, hb = true, fp = false, ev = true, mm = false;
    CHECK(fwd_raw(s, APIR_CMD_DEVICE_GET_PROPS, "", 0, &r) == APIR_HANDLER_OK);
    CHECK(apir_decode_reply_DEVICE_GET_PROPS(&r, &a, &hb, &fp, &ev, &mm) && !a && !hb && fp && !ev && mm);
    CHECK(apir_decoder_left(&r) == 0);  /* five items, as the pinned reference reads */
    CHECK(fwd_DEVICE_SELECT(s, 0) == APIR_HANDLER_OK);
    CHECK(fwd_DEVICE_SELECT(s, 1) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BACKEND_SYNCHRONIZE(s) == APIR_HANDLER_OK);
    apir_session_free(s);
}

static void test_buffer_type_commands(void)
{
    struct apir_session *s = new_session();
    uint64_t buft = 0, v = 0;
    static struct apir_string name;
    bool is_host = true;
    CHECK(fwd_DEVICE_GET_BUFFER_TYPE(s, &buft) == APIR_HANDLER_OK && buft != 0);
    CHECK(fwd_BUFFER_TYPE_GET_NAME(s, buft, &name) == APIR_HANDLER_OK && strcmp(name.s, "CPU") == 0);
    CHECK(fwd_BUFFER_TYPE_GET_ALIGNMENT(s, buft, &v) == APIR_HANDLER_OK && v >= 1 && (v & (v - 1)) == 0);
    v = 0;
    CHECK(fwd_BUFFER_TYPE_GET_MAX_SIZE(s, buft, &v) == APIR_HANDLER_OK && v > (1u << 30));
    CHECK(fwd_BUFFER_TYPE_IS_HOST(s, buft, &is_host) == APIR_HANDLER_OK && !is_host);
    /* A buffer type handle that is not one. */
    CHECK(fwd_BUFFER_TYPE_GET_NAME(s, buft ^ 1, &name) == APIR_HANDLER_BAD_HANDLE);
    CHECK(fwd_BUFFER_TYPE_GET_NAME(s, 0, &name) == APIR_HANDLER_BAD_HANDLE);

    struct apir_tensor_rec t = f32_rec(1, 0, 0, 100);
    v = 0;
    CHECK(fwd_BUFFER_TYPE_GET_ALLOC_SIZE_L(s, buft, span(1, &t), &v) == APIR_HANDLER_OK && v >= 400);
    apir_session_free(s);
}

static void test_buffer_data_commands(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    CHECK(buf != 0);
    uint64_t base = 0;
    CHECK(fwd_BUFFER_GET_BASE(s, buf, &base) == APIR_HANDLER_OK && base != 0 && (base & 0xfff) == 0);

    /* set then get through the blob, at two blob offsets */
    struct apir_tensor_rec t = f32_rec(1, buf, 256, 1024);
    float *in = (float *)data_blob;
    for (int i = 0; i < 1024; i++)
        in[i] = (float)i * 0.5f;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4096) == APIR_HANDLER_OK);
    CHECK(fwd_BUFFER_GET_TENSOR_AT(s, buf, &t, DATA_RES, 65536, 0, 4096) ==
          APIR_HANDLER_OK);
    CHECK(memcmp(data_blob, data_blob + 65536, 4096) == 0);
    /* partial get with an offset inside the tensor */
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, DATA_RES, 8, 8) == APIR_HANDLER_OK);
    CHECK(((float *)data_blob)[0] == 1.0f && ((float *)data_blob)[1] == 1.5f);

    /* memset, then cpy into a second tensor, then read back */
    CHECK(fwd_BUFFER_MEMSET_TENSOR(s, buf, &t, 0x3f, 0, 16) == APIR_HANDLER_OK);
    struct apir_tensor_rec t2 = f32_rec(2, buf, 8192, 1024);
    bool ok = false;
    CHECK(fwd_BUFFER_CPY_TENSOR(s, buf, &t, &t2, &ok) == APIR_HANDLER_OK && ok);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t2, DATA_RES, 0, 4096) == APIR_HANDLER_OK);
    CHECK(data_blob[0] == 0x3f && data_blob[15] == 0x3f && ((float *)data_blob)[4] == 2.0f);

    /* clear */
    CHECK(fwd_BUFFER_CLEAR(s, buf, 0) == APIR_HANDLER_OK);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t2, DATA_RES, 0, 16) == APIR_HANDLER_OK);
    CHECK(data_blob[0] == 0 && data_blob[15] == 0);

    /* init_tensor answers a status */
    uint32_t st = 99;
    CHECK(fwd_BUFFER_INIT_TENSOR(s, buf, &t, &st) == APIR_HANDLER_OK && st == GGML_STATUS_SUCCESS);

    /* free; the handle is stale afterwards */
    CHECK(fwd_BUFFER_FREE_BUFFER(s, buf) == APIR_HANDLER_OK);
    base = 99;
    CHECK(fwd_BUFFER_GET_BASE(s, buf, &base) == APIR_HANDLER_BAD_HANDLE && base == 0);
    CHECK(fwd_BUFFER_FREE_BUFFER(s, buf) == APIR_HANDLER_BAD_HANDLE);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_HANDLE);
    CHECK(s->n_buffers == 0 && s->bytes_allocated == 0);
    apir_session_free(s);
}

static void test_buffer_from_ptr(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = 0, buft = 0;
    CHECK(fwd_DEVICE_BUFFER_FROM_PTR(s, DATA_RES, 65536, 65536, &buf, &buft) == APIR_HANDLER_OK && buf && buft);
    /* the buffer is the blob: a set lands in the blob itself */
    struct apir_tensor_rec t = f32_rec(1, buf, 0, 4);
    memset(data_blob + 131072, 0x11, 16);
    CHECK(fwd_BUFFER_SET_TENSOR_AT(s, buf, &t, DATA_RES, 131072, 0, 16) ==
          APIR_HANDLER_OK);
    CHECK(data_blob[0] == 0x11 && data_blob[15] == 0x11);
    /* bigger than the blob, or an unknown blob: refused */
    uint64_t buf2 = 0, buft2 = 0;
    CHECK(fwd_DEVICE_BUFFER_FROM_PTR(s, DATA_RES, DATA_SIZE + 4096, 0, &buf2, &buft2) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_DEVICE_BUFFER_FROM_PTR(s, 77, 4096, 0, &buf2, &buft2) == APIR_HANDLER_BAD_REQUEST);
    /* a device without the function (CUDA's is NULL, and ggml calls it
     * unchecked: the worker crashed): refused */
    ggml_backend_dev_t dev = host.devices[s->device];
    ggml_backend_buffer_t (*from_ptr)(ggml_backend_dev_t, void *, size_t, size_t) = dev->iface.buffer_from_host_ptr;
    dev->iface.buffer_from_host_ptr = NULL;
    CHECK(fwd_DEVICE_BUFFER_FROM_PTR(s, DATA_RES, 4096, 0, &buf2, &buft2) == APIR_HANDLER_BAD_REQUEST);
    dev->iface.buffer_from_host_ptr = from_ptr;
    /* a buffer without memset_tensor (ggml asserts one): refused, not aborted */
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, buf, APIR_HANDLE_BUFFER);
    CHECK(slot != NULL);
    if (slot) {
        ggml_backend_buffer_t gb = ((struct apir_host_buffer *)slot->object)->buffer;
        void (*memset_tensor)(ggml_backend_buffer_t, struct ggml_tensor *, uint8_t, size_t, size_t) =
            gb->iface.memset_tensor;
        gb->iface.memset_tensor = NULL;
        CHECK(fwd_BUFFER_MEMSET_TENSOR(s, buf, &t, 0, 0, 16) == APIR_HANDLER_BAD_REQUEST);
        gb->iface.memset_tensor = memset_tensor;
        CHECK(fwd_BUFFER_MEMSET_TENSOR(s, buf, &t, 0, 0, 16) == APIR_HANDLER_OK && data_blob[0] == 0);
    }
    /* a pinned blob outlives its removal until the buffer goes */
    CHECK(apir_session_blob_remove(s, DATA_RES));
    CHECK(apir_session_blob_find(s, DATA_RES) == NULL);
    CHECK(fwd_BUFFER_FREE_BUFFER(s, buf) == APIR_HANDLER_OK);
    CHECK(s->n_blobs == 0);
    apir_session_free(s);
}

/* Writes a graph blob: n_nodes, node ids, n_tensors, records. */
static size_t graph_blob(uint8_t *dst, size_t cap, const uint64_t *nodes, uint32_t n_nodes, const struct apir_tensor_rec *t,
                         uint32_t n)
{
    struct apir_encoder e;
    apir_encoder_init(&e, dst, cap);
    apir_encode_u32(&e, n_nodes);
    for (uint32_t i = 0; i < n_nodes; i++)
        apir_encode_u64(&e, nodes[i]);
    apir_encode_tensor_list(&e, n, t);
    return apir_encoder_used(&e);
}

/* A whole graph blob through the import (no key: an APIR 0.1 graph). */
static struct ggml_cgraph *build_whole(struct apir_session *s, const uint8_t *blob, size_t size, const char **why)
{
    struct apir_graph_blob in = { .bytes = blob, .size = size };
    return apir_graph_build(s, &s->scratch, &in, why);
}

/* Writes a delta graph blob (0.9): n_nodes, node ids, n_tensors, then the
 * n_changed indices and the records t[index[k]] at them. */
static size_t delta_blob(uint8_t *dst, size_t cap, const uint64_t *nodes, uint32_t n_nodes, uint32_t n_tensors,
                         const uint32_t *index, uint32_t n_changed, const struct apir_tensor_rec *t)
{
    struct apir_encoder e;
    apir_encoder_init(&e, dst, cap);
    apir_encode_u32(&e, n_nodes);
    for (uint32_t i = 0; i < n_nodes; i++)
        apir_encode_u64(&e, nodes[i]);
    apir_encode_u32(&e, n_tensors);
    apir_encode_u32(&e, n_changed);
    for (uint32_t k = 0; k < n_changed; k++)
        apir_encode_u32(&e, index[k]);
    for (uint32_t k = 0; k < n_changed; k++)
        apir_encode_tensor(&e, &t[index[k]]);
    return apir_encoder_used(&e);
}

/* Makes t the ADD node a + b. */
static void add_node(struct apir_tensor_rec *t, uint64_t a, uint64_t b)
{
    t->op = GGML_OP_ADD;
    t->src[0] = a;
    t->src[1] = b;
    t->flags = GGML_TENSOR_FLAG_COMPUTE;
}

static uint32_t compute(struct apir_session *s, size_t size, uint32_t *status)
{
    *status = 99;
    return fwd_BACKEND_GRAPH_COMPUTE(s, DATA_RES, size, status);
}

static void test_graph_compute(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3] = { f32_rec(11, buf, 0, 64), f32_rec(12, buf, 256, 64), f32_rec(13, buf, 512, 64) };
    add_node(&t[2], 11, 12);
    float *f = (float *)data_blob;
    for (int i = 0; i < 64; i++)
        f[i] = (float)i;
    fwd_BUFFER_SET_TENSOR(s, buf, &t[0], DATA_RES, 0, 256);
    for (int i = 0; i < 64; i++)
        f[i] = 100.0f;
    fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 256);

    uint64_t node = 13;
    size_t size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    uint32_t status;
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 256);
    CHECK(f[0] == 100.0f && f[63] == 163.0f);

    /* the same graph at a blob offset */
    size = graph_blob(data_blob + 4096, DATA_SIZE - 4096, &node, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_AT(s, DATA_RES, 4096, size, &status) == APIR_HANDLER_OK);

    /* cyclic references */
    struct apir_tensor_rec c[3] = { t[0], t[1], t[2] };
    c[0].src[0] = 13;
    c[0].op = GGML_OP_ADD;
    c[0].src[1] = 12;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED);

    /* a node that is its own src (ggml_cast: CPY into itself as src[1]) is
     * no cycle */
    memcpy(c, t, sizeof(c));
    c[2].op = GGML_OP_CPY;
    c[2].src[0] = 11;
    c[2].src[1] = 13;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 256);
    CHECK(f[0] == 0.0f && f[63] == 63.0f);

    /* a src id not in the message */
    memcpy(c, t, sizeof(c));
    c[2].src[1] = 999;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a node id not in the message */
    uint64_t bad_node = 14;
    size = graph_blob(data_blob, DATA_SIZE, &bad_node, 1, t, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a tensor whose buffer is 0 (CVE-2026-34159 in ggml-rpc) */
    memcpy(c, t, sizeof(c));
    c[1].buffer = 0;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a node outside its buffer */
    memcpy(c, t, sizeof(c));
    c[2].data = (1 << 16) - 128;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* huge counts: node count beyond the limit, tensor count beyond the blob */
    uint8_t *p = data_blob;
    uint32_t huge = 0xffffffffu;
    memcpy(p, &huge, 4);
    CHECK(compute(s, 64, &status) == APIR_HANDLER_BAD_REQUEST);
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    uint32_t many = 1000;
    memcpy(data_blob + 4 + 8, &many, 4);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);
    /* graph size beyond the blob */
    CHECK(compute(s, DATA_SIZE + 1, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a custom op carrying a function pointer (ggml-rpc #25289) */
    memcpy(c, t, sizeof(c));
    c[2].op = GGML_OP_MAP_CUSTOM1;
    memset(c[2].op_params, 0x41, sizeof(c[2].op_params));
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* duplicate ids */
    memcpy(c, t, sizeof(c));
    c[1].id = 11;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a view whose data is not view_src + view_offs */
    memcpy(c, t, sizeof(c));
    c[1].view_src = 11;
    c[1].view_offs = 0;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);
    apir_session_free(s);
}

/*
 * The import memo (import.h): a graph like the last one keeps its op checks
 * only where a node's record and its operands' records are unchanged.  A
 * consumer whose own record stayed but whose source changed is checked
 * again (here refused: ADD cannot broadcast a 64-element operand into a
 * 32-element one); a refused graph leaves no memo; a freed buffer (its
 * handle could name another) ends it.
 */
static void test_graph_checks_kept(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16), other = alloc_buffer(s, 4096);
    struct apir_tensor_rec t[3] = { f32_rec(11, buf, 0, 64), f32_rec(12, buf, 256, 64), f32_rec(13, buf, 512, 64) };
    add_node(&t[2], 11, 12);
    uint64_t node = 13;
    uint32_t status;
    size_t size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 0);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 3);

    /* the first operand shrinks, the ADD's record is the same: refused */
    struct apir_tensor_rec c[3] = { t[0], t[1], t[2] };
    c[0] = f32_rec(11, buf, 0, 32);
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);
    CHECK(s->stats.checks_kept == 4);  /* the unchanged leaf 12 only */

    /* after a refusal nothing is kept; then the graph is the memo again */
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 4);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 7);

    /* a node whose view source changed is checked again: 13 as an in-place
     * ADD (a view of 11) kept, then 11 moved so the view no longer matches */
    memcpy(c, t, sizeof(c));
    c[2].view_src = 11;
    c[2].data = 0;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 9);  /* the leaves 11 and 12 */
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == 12);
    c[0].data = 1024;
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a buffer freed in between: the handles may name others, nothing kept */
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK);
    const uint64_t before = s->stats.checks_kept;
    CHECK(fwd_BUFFER_FREE_BUFFER(s, other) == APIR_HANDLER_OK);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(s->stats.checks_kept == before);
    apir_session_free(s);
}

static uint32_t compute_delta(struct apir_session *s, size_t size, uint64_t key, uint64_t base, uint32_t *status)
{
    *status = 99;
    return fwd_BACKEND_GRAPH_COMPUTE_DELTA(s, DATA_RES, 0, 0, 0, size, key, base, status);
}

/* A graph sent as its changes (0.9): applied to the last graph the host
 * imported, checked as the whole graph it makes, STALE when that graph is
 * gone (another since, a refusal, a buffer freed). */
static void test_graph_delta(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16), other = alloc_buffer(s, 4096);
    struct apir_tensor_rec t[4] = { f32_rec(11, buf, 0, 64), f32_rec(12, buf, 256, 64), f32_rec(13, buf, 512, 64),
                                    f32_rec(14, buf, 768, 64) };
    add_node(&t[2], 11, 12);
    uint64_t node = 13;
    uint32_t status;
    size_t size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 100, &status) == APIR_HANDLER_OK &&
          status == GGML_STATUS_SUCCESS);
    const uint64_t kept0 = s->stats.checks_kept;

    /* the node becomes a MUL: one record sent, the leaves' checks kept */
    t[2].op = GGML_OP_MUL;
    uint32_t idx[4] = { 2 };
    size = delta_blob(data_blob, DATA_SIZE, &node, 1, 3, idx, 1, t);
    CHECK(compute_delta(s, size, 101, 100, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    struct ggml_cgraph *g = apir_graph_kept(s, 101);
    CHECK(g && ggml_graph_n_nodes(g) == 2 && ggml_graph_node(g, 1)->op == GGML_OP_MUL &&
          ggml_graph_node(g, 1)->src[1]->ne[0] == 64);
    CHECK(s->stats.checks_kept == kept0 + 2);

    /* the base must be the last graph imported */
    CHECK(compute_delta(s, size, 102, 100, &status) == APIR_HANDLER_STALE);
    CHECK(compute_delta(s, size, 102, 0, &status) == APIR_HANDLER_BAD_REQUEST);
    CHECK(compute_delta(s, size, 0, 101, &status) == APIR_HANDLER_BAD_REQUEST);

    /* a source shrinks, the consumer's record stays: checked again, refused;
     * after a refusal the base is gone */
    struct apir_tensor_rec c[4];
    memcpy(c, t, sizeof(c));
    c[0] = f32_rec(11, buf, 0, 32);
    idx[0] = 0;
    size = delta_blob(data_blob, DATA_SIZE, &node, 1, 3, idx, 1, c);
    CHECK(compute_delta(s, size, 102, 101, &status) == APIR_HANDLER_BAD_REQUEST);
    size = delta_blob(data_blob, DATA_SIZE, &node, 1, 3, idx, 0, t);
    CHECK(compute_delta(s, size, 103, 101, &status) == APIR_HANDLER_STALE);

    /* malformed deltas: indices repeated, falling, out of range, a new
     * record left out, counts past the blob */
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 110, &status) == APIR_HANDLER_OK);
    const struct {
        uint32_t n_tensors, n_changed, index[3];
    } bad[] = {
        { 3, 2, { 1, 1 } }, { 3, 2, { 2, 1 } }, { 3, 1, { 3 } }, { 4, 1, { 2 } }, { 4, 2, { 0, 2 } }, { 2, 3, { 0, 1, 2 } },
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        uint32_t in[3];
        memcpy(in, bad[k].index, sizeof(in));
        size = delta_blob(data_blob, DATA_SIZE, &node, 1, bad[k].n_tensors, in, 0, t);
        struct apir_encoder e;
        apir_encoder_init(&e, data_blob + size - 4, DATA_SIZE - size + 4);
        apir_encode_u32(&e, bad[k].n_changed);
        for (uint32_t i = 0; i < bad[k].n_changed; i++)
            apir_encode_u32(&e, in[i]);
        for (uint32_t i = 0; i < bad[k].n_changed; i++)
            apir_encode_tensor(&e, &t[in[i] < 4 ? in[i] : 0]);
        size += apir_encoder_used(&e) - 4;
        CHECK_MSG(compute_delta(s, size, 111, 110, &status) == APIR_HANDLER_BAD_REQUEST, "bad delta %zu accepted", k);
        size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
        CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 110, &status) == APIR_HANDLER_OK);
    }
    size = delta_blob(data_blob, DATA_SIZE, &node, 1, 3, idx, 1, t);
    CHECK(compute_delta(s, size - 8, 111, 110, &status) == APIR_HANDLER_BAD_REQUEST);
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 110, &status) == APIR_HANDLER_OK);

    /* the graph grows by a node: the new record goes along */
    t[3].op = GGML_OP_ADD;
    t[3].src[0] = 13;
    t[3].src[1] = 11;
    uint64_t nodes[2] = { 13, 14 };
    idx[0] = 3;
    size = delta_blob(data_blob, DATA_SIZE, nodes, 2, 4, idx, 1, t);
    CHECK(compute_delta(s, size, 112, 110, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    g = apir_graph_kept(s, 112);
    CHECK(g && ggml_graph_n_nodes(g) == 3 && ggml_graph_node(g, 2)->src[0] == ggml_graph_node(g, 1));

    /* shrunk, then grown again without the record: the memo's memory still
     * holds it, but it is no record of the base */
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 114, &status) == APIR_HANDLER_OK);
    size = delta_blob(data_blob, DATA_SIZE, nodes, 2, 4, idx, 0, t);
    CHECK(compute_delta(s, size, 115, 114, &status) == APIR_HANDLER_BAD_REQUEST);
    size = graph_blob(data_blob, DATA_SIZE, nodes, 2, t, 4);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, 112, &status) == APIR_HANDLER_OK);

    /* a buffer freed in between: the handles may name others, the base is gone */
    size = delta_blob(data_blob, DATA_SIZE, nodes, 2, 4, idx, 0, t);
    CHECK(fwd_BUFFER_FREE_BUFFER(s, other) == APIR_HANDLER_OK);
    CHECK(compute_delta(s, size, 113, 112, &status) == APIR_HANDLER_STALE);
    apir_session_free(s);
}

/* Empty views, as MoE graphs build them (ffn_moe_up-1: 192x1x0x1 at offset
 * 768 of a 384x1x0x1 source): no element, so no byte is touched, wherever
 * the view starts - past its empty source, even past the buffer's end, as
 * ggml places them.  A view with data is held to its source as before. */
static void test_empty_views(void)
{
    struct apir_session *s = new_session();
    const uint64_t size = 1 << 16;
    uint64_t buf = alloc_buffer(s, size), other = alloc_buffer(s, size);
    uint64_t places[2] = { 4096, size };  /* inside, and at the very end */
    for (int k = 0; k < 2; k++) {
        struct apir_tensor_rec t[3];
        t[0] = f32_rec(21, buf, places[k], 384);
        t[0].ne[2] = 0;
        t[1] = t[0];
        t[1].id = 22;
        t[1].ne[0] = 192;
        t[1].op = GGML_OP_VIEW;
        t[1].src[0] = 21;
        t[1].view_src = 21;
        t[1].view_offs = 768;
        t[1].data = places[k] + 768;
        t[2] = f32_rec(23, buf, 8192, 192);
        t[2].ne[2] = 0;
        add_node(&t[2], 22, 22);
        uint64_t node = 23;
        uint32_t status;
        size_t gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
        CHECK_MSG(compute(s, gsize, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS,
                  "empty view at %llu refused", (unsigned long long)places[k]);
        /* still one buffer: an empty view of a source elsewhere is refused */
        struct apir_tensor_rec c[3] = { t[0], t[1], t[2] };
        c[1].buffer = other;
        gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, c, 3);
        CHECK(compute(s, gsize, &status) == APIR_HANDLER_BAD_REQUEST);
    }
    /* with elements, a view must start inside its source, at view_offs */
    struct apir_tensor_rec v[3];
    v[0] = f32_rec(31, buf, 4096, 384);
    v[1] = f32_rec(32, buf, 4096 + 768, 192);
    v[1].op = GGML_OP_VIEW;
    v[1].src[0] = 31;
    v[1].view_src = 31;
    v[1].view_offs = 768;
    v[2] = f32_rec(33, buf, 8192, 192);
    v[2].op = GGML_OP_ADD;
    v[2].src[0] = 32;
    v[2].src[1] = 32;
    uint64_t node = 33;
    uint32_t status;
    size_t gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, v, 3);
    CHECK(compute(s, gsize, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    v[1].data = 4096 + 772;  /* not view_src + view_offs */
    gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, v, 3);
    CHECK(compute(s, gsize, &status) == APIR_HANDLER_BAD_REQUEST);
    v[1].data = 4096 + 4096;  /* past its source */
    v[1].view_offs = 4096;
    gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, v, 3);
    CHECK(compute(s, gsize, &status) == APIR_HANDLER_BAD_REQUEST);
    /* a tensor with elements past the buffer's end */
    v[1] = f32_rec(32, buf, size - 256, 192);
    gsize = graph_blob(data_blob, DATA_SIZE, &node, 1, v, 3);
    CHECK(compute(s, gsize, &status) == APIR_HANDLER_BAD_REQUEST);
    apir_session_free(s);
}

/* Keyed graphs (0.2) may carry the nodes' use counts, which go into the
 * host graph's hash set (where ggml's fusion reads them); a malformed
 * section refuses the graph. */
static void test_graph_use_counts(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[4] = { f32_rec(11, buf, 0, 64), f32_rec(12, buf, 256, 64), f32_rec(13, buf, 512, 64),
                                    f32_rec(14, buf, 768, 64) };
    add_node(&t[2], 11, 12);
    t[3].op = GGML_OP_MUL;
    t[3].src[0] = 13;
    t[3].src[1] = 12;
    t[3].flags = GGML_TENSOR_FLAG_COMPUTE;
    uint64_t nodes[2] = { 13, 14 };
    const uint32_t counts[2] = { 1, 0 };
    struct {
        uint32_t tag, n, extra;  /* n: how many counts; extra: bytes after */
        uint32_t want;
    } cases[] = {
        { APIR_GRAPH_USE_COUNTS_TAG, 2, 0, APIR_HANDLER_OK },
        { 0x12345678u, 2, 0, APIR_HANDLER_BAD_REQUEST },               /* another tag */
        { APIR_GRAPH_USE_COUNTS_TAG, 1, 0, APIR_HANDLER_BAD_REQUEST }, /* short */
        { APIR_GRAPH_USE_COUNTS_TAG, 2, 4, APIR_HANDLER_BAD_REQUEST }, /* bytes after */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t size = graph_blob(data_blob, DATA_SIZE, nodes, 2, t, 4);
        struct apir_encoder e;
        apir_encoder_init(&e, data_blob + size, DATA_SIZE - size);
        apir_encode_u32(&e, cases[k].tag);
        for (uint32_t i = 0; i < cases[k].n; i++)
            apir_encode_u32(&e, counts[i]);
        for (uint32_t i = 0; i < cases[k].extra; i += 4)
            apir_encode_u32(&e, 0);
        size += apir_encoder_used(&e);
        uint64_t key = 100 + k;
        uint32_t status = 99;
        uint32_t res = fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, size, key, &status);
        CHECK(res == cases[k].want);
        if (res != APIR_HANDLER_OK)
            continue;
        CHECK(status == GGML_STATUS_SUCCESS);
        struct ggml_cgraph *g = apir_graph_kept(s, key);
        CHECK(g && ggml_graph_n_nodes(g) == 3 && ggml_graph_node(g, 0) == apir_graph_anchor(s));
        if (g) {
            CHECK(ggml_node_get_use_count(g, 1) == 1);
            /* read by nothing: a count no chain matches (op_fusion.h) */
            CHECK(ggml_node_get_use_count(g, 2) == INT32_MAX);
        }
    }
    /* a count below this graph's own uses is raised to them (a backend
     * would fuse the node away from a reader); one above is kept */
    const uint32_t low[2] = { 0, 5 };
    size_t lsize = graph_blob(data_blob, DATA_SIZE, nodes, 2, t, 4);
    struct apir_encoder le;
    apir_encoder_init(&le, data_blob + lsize, DATA_SIZE - lsize);
    apir_encode_u32(&le, APIR_GRAPH_USE_COUNTS_TAG);
    apir_encode_u32(&le, low[0]);
    apir_encode_u32(&le, low[1]);
    lsize += apir_encoder_used(&le);
    uint32_t lstatus = 99;
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 0, lsize, 120, &lstatus) == APIR_HANDLER_OK &&
          lstatus == GGML_STATUS_SUCCESS);
    struct ggml_cgraph *lg = apir_graph_kept(s, 120);
    CHECK(lg && ggml_node_get_use_count(lg, 1) == 1 && ggml_node_get_use_count(lg, 2) == 5);
    /* an unkeyed (0.1) graph never reads the section: trailing bytes ignored */
    size_t size = graph_blob(data_blob, DATA_SIZE, nodes, 2, t, 4);
    memset(data_blob + size, 0xee, 8);
    uint32_t status = 99;
    CHECK(compute(s, size + 8, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    apir_session_free(s);
}

/* A chunked download (apir 0.6): the same bytes as GET_TENSOR_AT, the
 * pieces counted in the blob, and every range the guest names checked. */
static void test_chunked_download(void)
{
    struct apir_session *s = new_session();
    const uint32_t n = 98304;  /* 384 KiB of floats */
    uint64_t buf = alloc_buffer(s, 4 * n + 4096);
    struct apir_tensor_rec t = f32_rec(1, buf, 4096, n);
    for (uint32_t i = 0; i < 4 * n; i++)
        data_blob[i] = (uint8_t)(i * 131u + (i >> 9));
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4 * n) == APIR_HANDLER_OK);
    static uint8_t want[4 * 98304];
    memcpy(want, data_blob, sizeof(want));
    struct apir_chunk_progress *p = (struct apir_chunk_progress *)data_blob;

    /* odd offset and size, 4 pieces (3 whole, one short); a sleeping flag
     * only makes the host wake nobody */
    memset(data_blob, 0xee, DATA_SIZE);
    atomic_store(&p->pieces_done, 0);
    atomic_store(&p->guest_sleeping, 1);
    const uint64_t off = 4099, size = 3 * 65536 + 12345;
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, off, size, 65536, 0) == APIR_HANDLER_OK);
    CHECK(memcmp(data_blob + 8192, want + off, size) == 0);
    CHECK(data_blob[8191] == 0xee && data_blob[8192 + size] == 0xee);  /* nothing outside the range */
    CHECK(atomic_load(&p->pieces_done) == 4 && atomic_load(&p->guest_sleeping) == 1);
    /* one piece larger than the range; the words right after the range */
    atomic_store(&p->guest_sleeping, 0);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 4096, 0, 4 * n, 1u << 30, 4096 + 4 * n) ==
          APIR_HANDLER_OK);
    CHECK(memcmp(data_blob + 4096, want, 4 * n) == 0);
    CHECK(atomic_load((_Atomic uint32_t *)(data_blob + 4096 + 4 * n)) == 1);
    /* nothing to copy: OK, no piece */
    atomic_store(&p->pieces_done, 0);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 0, 65536, 0) == APIR_HANDLER_OK);
    CHECK(atomic_load(&p->pieces_done) == 0);

    /* refused: pieces below the minimum, the words inside the range, off
     * their alignment or outside the blob, the range outside the blob or
     * the tensor, another buffer's tensor, an unknown blob */
    const uint32_t bad = APIR_HANDLER_BAD_REQUEST;
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, APIR_CHUNK_MIN - 1, 0) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, 8192 + 65536 - 4) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, 8188) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, 2) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, DATA_SIZE - 4) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, UINT64_MAX - 3) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, DATA_SIZE - 65535, 0, 65536, 65536, 0) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, UINT64_MAX - 100, 0, 65536, 65536, 0) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 4, 4 * n, 65536, 0) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, UINT64_MAX, 2, 65536, 0) == bad);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, 4242u, 8192, 0, 65536, 65536, 0) == bad);
    uint64_t buf2 = alloc_buffer(s, 4096);
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf2, &t, DATA_RES, 8192, 0, 65536, 65536, 0) == bad);
    CHECK(atomic_load(&p->pieces_done) == 0);  /* a refusal writes nothing */
    /* 0.6 commands need 0.6 */
    s->minor = 5;
    CHECK(fwd_BUFFER_GET_TENSOR_CHUNKED(s, buf, &t, DATA_RES, 8192, 0, 65536, 65536, 0) == APIR_HANDLER_INVALID_INDEX);
    apir_session_free(s);
}

static void test_tensor_checks(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 4096);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, 256);
    /* inside: ok; one byte too far: refused (write-what-where, CVE-2024-42479) */
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 1024) == APIR_HANDLER_OK);
    t.data = 4096 - 1020;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    t.data = UINT64_MAX - 100;  /* offset + nbytes overflows */
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    /* arbitrary read through get_tensor (GHSA-5vm9-p64x-gqw9): offset+size past the tensor */
    t.data = 0;
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, DATA_RES, 1000, 100) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, DATA_RES, UINT64_MAX, 2) == APIR_HANDLER_BAD_REQUEST);
    /* blob range outside the blob */
    CHECK(fwd_BUFFER_GET_TENSOR_AT(s, buf, &t, DATA_RES, DATA_SIZE - 8, 0, 16) ==
          APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, 4242u, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    /* type out of range (CVE-2024-42477) */
    t.type = GGML_TYPE_COUNT + 5;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    /* a removed type (block size 0) */
    t.type = 4;  /* GGML_TYPE_Q4_2, removed */
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    /* ne[0] not a multiple of the block size (#25288) */
    t = f32_rec(1, buf, 0, 33);
    t.type = GGML_TYPE_Q4_0;
    t.nb[0] = (uint32_t)ggml_type_size(GGML_TYPE_Q4_0);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    /* tensor in another buffer than the command names */
    uint64_t buf2 = alloc_buffer(s, 4096);
    t = f32_rec(1, buf2, 0, 16);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    /* cpy with a destination larger copy than it holds (ggml#1103) */
    struct apir_tensor_rec src = f32_rec(1, buf, 0, 512), dst = f32_rec(2, buf2, 4096 - 64, 16);
    bool copied = true;
    CHECK(fwd_BUFFER_CPY_TENSOR(s, buf2, &src, &dst, &copied) == APIR_HANDLER_BAD_REQUEST && !copied);
    /* strides whose products overflow 64 bits */
    t = f32_rec(1, buf, 0, 16);
    t.ne[1] = t.ne[2] = t.ne[3] = 0xffffffffu;
    t.nb[1] = t.nb[2] = t.nb[3] = 0xffffffffu;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, 4) == APIR_HANDLER_BAD_REQUEST);
    apir_session_free(s);
}

static void test_malformed(void)
{
    struct apir_session *s = new_session();
    struct apir_decoder r;
    CHECK(fwd_raw(s, 999, "", 0, &r) == APIR_HANDLER_INVALID_INDEX);
    CHECK(fwd_raw(s, APIR_CMD_COUNT, "", 0, &r) == APIR_HANDLER_INVALID_INDEX);
    /* every command that takes items, with none */
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        if (!apir_command_table[cmd].request[0])
            continue;
        uint32_t res = fwd_raw(s, cmd, "", 0, &r);
        CHECK_MSG(res == APIR_HANDLER_BAD_REQUEST || res == APIR_HANDLER_BAD_HANDLE, "%s -> %u", apir_command_name(cmd), res);
    }
    /* a bool item whose byte is not 0/1 in a request is still only a bool:
     * list counts out of range */
    uint8_t raw[16] = { 0 };
    uint32_t n = 1000;
    memcpy(raw, &n, 4);
    CHECK(fwd_raw(s, APIR_CMD_DEVICE_SUPPORTS_OP_L, raw, sizeof(raw), &r) == APIR_HANDLER_BAD_REQUEST);
    /* a reply that does not fit: a tiny reply window */
    uint8_t out[4];
    struct apir_encoder o;
    apir_encoder_init(&o, out, sizeof(out));
    struct apir_decoder d;
    apir_decoder_init(&d, "", 0);
    CHECK(apir_session_forward(s, APIR_CMD_DEVICE_GET_DESCRIPTION, &d, &o) == APIR_HANDLER_REPLY_FULL);
    apir_session_free(s);
}

/*
 * ggml-cuda's transposing copy (cpy.cu) reads a source that looks like a
 * transposed matrix and writes its destination densely, whatever the
 * destination's strides: the CUDA rules take a transposed dense matrix into
 * a contiguous result, and refuse it into a strided view (written past its
 * extent on an H100: fuzz/findings/cuda, cuda-21).
 */
static void test_cuda_transposing_copy(void)
{
    struct ggml_init_params p = { .mem_size = 16 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8);
    struct ggml_tensor *at = ggml_transpose(ctx, a);  /* ne [8, 4], nb [16, 4] */
    struct ggml_tensor *big = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 4);
    struct ggml_tensor *strided = ggml_view_2d(ctx, big, 8, 4, big->nb[1], 0);
    struct ggml_tensor *dense = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4);
    struct ggml_tensor *into_strided = ggml_cpy(ctx, at, strided), *into_dense = ggml_cpy(ctx, at, dense);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, into_strided) != NULL);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, into_dense) == NULL);
    CHECK(apir_op_device_error(APIR_KERNELS_OTHER, into_strided) == NULL);
    /* a transposed-looking source (nb[1] one element, nb[2] a dense matrix)
     * whose columns are 8 elements apart, not 4: the kernel would read the
     * first 32 floats, not the ones the strides name */
    struct ggml_tensor *gt = ggml_view_2d(ctx, big, 8, 4, 4, 0);
    gt->nb[0] = 32;
    gt->nb[1] = 4;
    gt->nb[2] = gt->nb[3] = 8 * 4 * 4;
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, ggml_cpy(ctx, gt, dense)) != NULL);
    /* the same types and layouts as ggml_cont of a transpose: taken */
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, ggml_cont(ctx, at)) == NULL);
    ggml_free(ctx);
}

/* The CUDA entry rules: what ggml-cuda's kernels assert for every node of
 * their op, against nodes llama.cpp makes (taken) and ones it could (not). */
static void test_cuda_entry_rules(void)
{
    struct ggml_init_params p = { .mem_size = 32 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 4);
    struct ggml_tensor *h = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 4);
    struct ggml_tensor *taken[] = { ggml_rms_norm(ctx, x, 1e-5f), ggml_scale(ctx, x, 0.5f), ggml_soft_max(ctx, x),
                                    ggml_silu(ctx, h), ggml_swiglu(ctx, x), ggml_clamp(ctx, h, -1.0f, 1.0f) };
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, taken[i]) == NULL, "%s: %s", ggml_op_desc(taken[i]),
                  apir_op_device_error(APIR_KERNELS_CUDA, taken[i]));
    struct ggml_tensor *bf = ggml_new_tensor_2d(ctx, GGML_TYPE_BF16, 64, 4);
    struct ggml_tensor *refused[] = { ggml_scale(ctx, h, 0.5f), ggml_rms_norm(ctx, h, 1e-5f), ggml_silu(ctx, bf),
                                      ggml_swiglu_oai(ctx, h, h, 1.0f, 7.0f), ggml_rms_norm(ctx, x, -1.0f),
                                      /* binbcast.cu reads an F16 src1 as floats */
                                      ggml_add(ctx, x, h) };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, refused[i]) != NULL, "%s taken", ggml_op_desc(refused[i]));
        CHECK(apir_op_device_error(APIR_KERNELS_OTHER, refused[i]) == NULL);
    }
    ggml_free(ctx);
}

/* cuBLAS's leading dimensions (cuda-09): ggml-cuda hands cuBLAS nb[1] /
 * element size, which cuBLAS refuses below a row (ggml-cuda then aborts).
 * ggml's own graphs - a permuted q of one token, a transposed src1 of
 * OUT_PROD - keep a real row stride in their size-1 dimensions; a guest's
 * record of a view that is not contiguous can carry any. */
static void test_cuda_leading_dims(void)
{
    struct ggml_init_params p = { .mem_size = 32 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, 64, 32, 4);
    struct ggml_tensor *q = ggml_permute(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 4, 1), 0, 2, 1, 3);
    struct ggml_tensor *kq = ggml_mul_mat(ctx, k, q);
    CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, kq) == NULL, "%s", apir_op_device_error(APIR_KERNELS_CUDA, kq));
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 8);
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 12);
    struct ggml_tensor *op = ggml_out_prod(ctx, a, ggml_transpose(ctx, b));
    CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, op) == NULL, "%s", apir_op_device_error(APIR_KERNELS_CUDA, op));
    /* the finding's shape: src1 1x1 matrices in batches, rows 1 byte apart */
    struct ggml_tensor *s0 = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 1, 5, 5);
    struct ggml_tensor *s1 = ggml_view_4d(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 185), 1, 1, 5, 5, 1, 68, 116, 0);
    struct ggml_tensor *mm = ggml_mul_mat(ctx, s0, s1);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, mm) != NULL);
    CHECK(apir_op_device_error(APIR_KERNELS_OTHER, mm) == NULL);
    s1->nb[1] = 4;  /* a row apart: taken */
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, mm) == NULL);
    s0->nb[1] = 0;  /* src0's lda 0 */
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, mm) != NULL);
    /* OUT_PROD: src0's lda below ne00, then src1's ldb (transposed or not) */
    a->nb[1] = 32;
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, op) != NULL);
    a->nb[1] = 64;
    op->src[1]->nb[0] = 16;  /* the transposed src1's ldb, 4 floats < ne11 8 */
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, op) != NULL);
    ggml_free(ctx);
}

/* The CUDA rules of the H100 fuzz runs of 2026-12-06 (cuda-25..29,
 * chain-cuda-00..08): llama.cpp's shapes taken, each finding's shape
 * refused under the CUDA rules and taken under the CPU's. */
static void expect_cuda_only_refusal(struct ggml_tensor *t, const char *what)
{
    CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, t) != NULL, "%s taken", what);
    CHECK_MSG(apir_op_device_error(APIR_KERNELS_OTHER, t) == NULL, "%s refused on the CPU", what);
}

/* Flash attention's 16-byte loads (op_device.c, the H100 probe of
 * tests/probe_layouts.c): llama.cpp's attention of one token and of 16
 * (a cache of 256 cells, 8 heads over 2 KV heads of 128, F16 and Q8_0)
 * taken; each operand moved 2, 4 or 8 bytes, or its rows, refused under
 * the CUDA rules; a move of 16 bytes taken. */
static void test_cuda_flash_attn_layouts(struct ggml_context *ctx)
{
    for (int kvq = 0; kvq < 2; kvq++)
        for (int tokens = 1; tokens <= 16; tokens += 15) {
            const enum ggml_type kv = kvq ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
            struct ggml_tensor *q =
                ggml_permute(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 128, 8, tokens), 0, 2, 1, 3);
            struct ggml_tensor *k = ggml_new_tensor_3d(ctx, kv, 128, 256, 2);
            struct ggml_tensor *v = ggml_new_tensor_3d(ctx, kv, 128, 256, 2);
            struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, tokens);
            struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, 0.0f, 0.0f);
            CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, fa) == NULL, "%s",
                      apir_op_device_error(APIR_KERNELS_CUDA, fa));
            struct ggml_tensor *operands[] = { q, k, v, mask };
            for (int i = 0; i < 4; i++) {
                struct ggml_tensor *t = operands[i];
                for (uintptr_t off = 2; off <= 16; off *= 2) {
                    t->data = (void *)(4096 + off);
                    if (off < 16)
                        expect_cuda_only_refusal(fa, "flash attention of an operand off 16 bytes");
                    else
                        CHECK(apir_op_device_error(APIR_KERNELS_CUDA, fa) == NULL);
                }
                t->data = NULL;
                if (i == 3 || ggml_is_quantized(t->type))
                    continue;
                /* rows 4 bytes off a multiple of 16 apart (and what follows) */
                const size_t nb[4] = { t->nb[0], t->nb[1], t->nb[2], t->nb[3] };
                for (int d = 1; d < 4; d++)
                    t->nb[d] += 4;
                expect_cuda_only_refusal(fa, "flash attention of float rows off 16 bytes apart");
                memcpy(t->nb, nb, sizeof(nb));
            }
        }
}

/* Flash attention with a logit softcap (cuda-30): ggml-cuda builds its
 * softcap kernels for heads of 128, 256 and 512 only; Gemma 2's (256, a cap
 * of 50) and Grok's (128, 30) taken, heads of 40 and 64 with a cap refused
 * under the CUDA rules, and every head size taken without one. */
static void test_cuda_flash_attn_softcap(void)
{
    struct ggml_init_params p = { .mem_size = 80 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    const int64_t heads[] = { 40, 64, 80, 128, 192, 256, 512 };
    for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
        const int64_t d = heads[h];
        struct ggml_tensor *q = ggml_permute(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, 8, 1), 0, 2, 1, 3);
        struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, 256, 8);
        struct ggml_tensor *v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, 256, 8);
        struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, 1);
        struct ggml_tensor *plain = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, 0.0f, 0.0f);
        CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, plain) == NULL, "head %lld without a cap: %s",
                  (long long)d, apir_op_device_error(APIR_KERNELS_CUDA, plain));
        struct ggml_tensor *capped = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, 0.0f, d == 256 ? 50.0f : 30.0f);
        if (d == 128 || d == 256 || d == 512)
            CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, capped) == NULL, "head %lld with a cap: %s",
                      (long long)d, apir_op_device_error(APIR_KERNELS_CUDA, capped));
        else
            expect_cuda_only_refusal(capped, "flash attention with a softcap, heads of another size");
    }
    ggml_free(ctx);
}

static void test_cuda_kernel_layouts(void)
{
    struct ggml_init_params p = { .mem_size = 96 * ggml_tensor_overhead(), .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    /* an MoE layer of one token: 8 experts of 64 x 256 (Q4_0), 2 a token */
    struct ggml_tensor *experts = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 256, 64, 8);
    struct ggml_tensor *cur = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 256, 1, 1);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 1);
    struct ggml_tensor *mmid = ggml_mul_mat_id(ctx, experts, cur, ids);
    struct ggml_tensor *bias = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 8);
    struct ggml_tensor *addid = ggml_add_id(ctx, mmid, bias, ids);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, 64);
    struct ggml_tensor *mm = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1));
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 4);
    struct ggml_tensor *taken[] = { mmid, addid, mm, ggml_norm(ctx, x, 1e-5f), ggml_l2_norm(ctx, x, 1e-5f),
                                    ggml_cont(ctx, ggml_transpose(ctx, x)) };
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, taken[i]) == NULL, "%s: %s", ggml_op_desc(taken[i]),
                  apir_op_device_error(APIR_KERNELS_CUDA, taken[i]));
    /* norms of a source whose row of one float has a stride (cuda-25, -26) */
    struct ggml_tensor *col = ggml_view_2d(ctx, x, 1, 4, 4 * 64, 0);
    col->nb[0] = 1u << 28;
    expect_cuda_only_refusal(ggml_l2_norm(ctx, col, 1e-5f), "L2_NORM of a strided row");
    /* MUL_MAT_ID of a Q8_0 src1 (cuda-27) */
    struct ggml_tensor *q8 = ggml_new_tensor_3d(ctx, GGML_TYPE_Q8_0, 256, 1, 1);
    expect_cuda_only_refusal(ggml_mul_mat_id(ctx, experts, q8, ids), "MUL_MAT_ID of a Q8_0 src1");
    /* ids with gaps (chain-cuda-01, -02, -04) */
    struct ggml_tensor *gapped = ggml_view_2d(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8), 2, 1, 32, 0);
    gapped->nb[0] = 16;
    expect_cuda_only_refusal(ggml_mul_mat_id(ctx, experts, cur, gapped), "MUL_MAT_ID of ids with gaps");
    expect_cuda_only_refusal(ggml_add_id(ctx, mmid, bias, gapped), "ADD_ID of ids with gaps");
    /* one token's experts of 3 rows (chain-cuda-05): mmvq's blocks pass them */
    struct ggml_tensor *thin = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 256, 3, 8);
    expect_cuda_only_refusal(ggml_mul_mat_id(ctx, thin, cur, ids), "MUL_MAT_ID of 3 rows an expert");
    struct ggml_tensor *one = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 1);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, ggml_mul_mat_id(ctx, thin, cur, one)) == NULL);
    /* a MUL_MAT result with gaps between its columns: mmvq bounds rows by
     * the column stride (import.c makes a size-1 dimension's stride
     * canonical in a contiguous tensor) */
    struct ggml_tensor *mm2 = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 2));
    mm2->nb[1] = 4096;
    mm2->nb[2] = mm2->nb[3] = 8192;
    expect_cuda_only_refusal(mm2, "MUL_MAT into a strided result");
    /* GATED_DELTA_NET of heads of 1 (cuda-29) */
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
    struct ggml_tensor *g = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
    struct ggml_tensor *beta = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
    struct ggml_tensor *state = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 1, 2, 1);
    expect_cuda_only_refusal(ggml_gated_delta_net(ctx, q, q, q, g, beta, state, 1), "GATED_DELTA_NET of heads of 1");
    /* elements off their size: a copy whose source planes are a byte apart
     * (cuda-28), a view at byte 2 of floats; a MUL_MAT src1 at byte 12,
     * float2 loads at 4 (chain-cuda-00) */
    struct ggml_tensor *planes = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, 16, 16);
    planes->nb[1] = 1024;
    planes->nb[2] = 1;
    expect_cuda_only_refusal(ggml_cont(ctx, planes), "a copy of planes a byte apart");
    struct ggml_tensor *shifted = ggml_view_1d(ctx, x, 8, 0);
    shifted->data = (void *)(uintptr_t)4098;
    expect_cuda_only_refusal(ggml_scale(ctx, shifted, 2.0f), "a SCALE of floats at byte 2");
    struct ggml_tensor *y = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1);
    struct ggml_tensor *mm3 = ggml_mul_mat(ctx, w, y);
    y->data = (void *)(uintptr_t)4108;
    expect_cuda_only_refusal(mm3, "MUL_MAT of an F16 matrix, src1 at byte 12");
    y->data = (void *)(uintptr_t)4104;
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, mm3) == NULL);
    /* rope_norm's pair stores: a ROPE result at byte 4 of a pair of floats */
    struct ggml_tensor *rope = ggml_rope(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 2, 3),
                                         ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 3), 64, 0);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, rope) == NULL);
    rope->data = (void *)(uintptr_t)4100;
    expect_cuda_only_refusal(rope, "a ROPE result at byte 4");
    /* quantized blocks at their own alignment (chain-cuda-07, -08): a Q4_0
     * matrix viewed at an odd byte (mmvq reads its blocks in 2-byte halves),
     * taken at a whole block (18 bytes: 2-aligned); MXFP4's 17-byte blocks
     * at any byte; a Q4_K matrix (144-byte blocks) at 8 bytes off 16 */
    struct ggml_tensor *qw = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 256, 64);
    struct ggml_tensor *qmm = ggml_mul_mat(ctx, qw, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1));
    qw->data = (void *)(uintptr_t)(4096 + 873);
    expect_cuda_only_refusal(qmm, "MUL_MAT of a Q4_0 matrix at an odd byte");
    qw->data = (void *)(uintptr_t)(4096 + 18);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, qmm) == NULL);
    qw->nb[1] = 143;  /* rows an odd number of bytes apart */
    expect_cuda_only_refusal(qmm, "MUL_MAT of Q4_0 rows 143 bytes apart");
    struct ggml_tensor *mx = ggml_new_tensor_2d(ctx, GGML_TYPE_MXFP4, 256, 64);
    struct ggml_tensor *mxmm = ggml_mul_mat(ctx, mx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1));
    mx->data = (void *)(uintptr_t)(4096 + 17);
    CHECK_MSG(apir_op_device_error(APIR_KERNELS_CUDA, mxmm) == NULL, "%s",
              apir_op_device_error(APIR_KERNELS_CUDA, mxmm));
    struct ggml_tensor *qk = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_K, 256, 64);
    struct ggml_tensor *qkmm = ggml_mul_mat(ctx, qk, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1));
    qk->data = (void *)(uintptr_t)(4096 + 144);
    CHECK(apir_op_device_error(APIR_KERNELS_CUDA, qkmm) == NULL);
    qk->data = (void *)(uintptr_t)(4096 + 8);
    expect_cuda_only_refusal(qkmm, "MUL_MAT of a Q4_K matrix at byte 8");
    test_cuda_flash_attn_layouts(ctx);
    ggml_free(ctx);
    test_cuda_flash_attn_softcap();
}

/* A graph of out's nodes as ggml builds it, its use counts ggml's, made
 * with the capacity the host gives its graphs (op_fusion.h). */
static struct ggml_cgraph *fusion_graph(struct ggml_context *ctx, struct ggml_tensor *out)
{
    struct ggml_cgraph *g = ggml_new_graph_custom(ctx, apir_fusion_graph_size(64), false);
    ggml_build_forward_expand(g, out);
    return g;
}

/* Where a chain of k nodes that ends the graph starts: t's index, or -1
 * when t is not there. */
static int chain_at(const struct ggml_cgraph *g, const struct ggml_tensor *t, int k)
{
    return g->n_nodes >= k && g->nodes[g->n_nodes - k] == t ? g->n_nodes - k : -1;
}

/* ggml-cuda's test of a ROPE, VIEW, SET_ROWS chain (ggml-cuda.cu). */
static bool rope_chain_fuses(struct ggml_cgraph *g, struct ggml_tensor *rope)
{
    const int i = chain_at(g, rope, 3);
    const enum ggml_op ops[] = { GGML_OP_ROPE, GGML_OP_VIEW, GGML_OP_SET_ROWS };
    const int out = i + 2;
    return i >= 0 && ggml_can_fuse_subgraph(g, i, 3, ops, &out, 1);
}

/*
 * The fusions a backend may make of a graph's chains (op_fusion.c): ggml's
 * own checks take these hostile chains (the first assertion of each case:
 * the test can fail), the seal keeps them node by node, and the chains
 * ggml's graphs are made of still fuse.
 */
static void test_fusion_seal(void)
{
    struct ggml_init_params p = { .mem_size = 128 * ggml_tensor_overhead() + 12 * ggml_graph_overhead_custom(80, false),
                                  .no_alloc = true };
    struct ggml_context *ctx = ggml_init(p);
    const int n_dims = 64;
    /* ROPE of 4 heads x 2 tokens stored in a cache by SET_ROWS, as llama.cpp does */
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_dims, 4, 2);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2);
    struct ggml_tensor *kv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_dims * 4, 16);
    struct ggml_tensor *rope = ggml_rope_ext(ctx, x, pos, NULL, n_dims, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    struct ggml_tensor *v = ggml_view_2d(ctx, rope, n_dims * 4, 2, rope->nb[2], 0);
    struct ggml_tensor *idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 2);
    struct ggml_cgraph *g = fusion_graph(ctx, ggml_set_rows(ctx, kv, v, idx));
    apir_fusion_seal(g, true);
    CHECK(rope_chain_fuses(g, rope));
    CHECK(g->nodes[g->n_nodes]->op == GGML_OP_NONE && g->nodes[g->size - 1]->op == GGML_OP_NONE);
    /* the same chain in a graph without the guest's counts: not fused */
    g = fusion_graph(ctx, ggml_set_rows(ctx, kv, v, idx));
    apir_fusion_seal(g, false);
    CHECK(!rope_chain_fuses(g, rope));
    /* a VIEW of the first token only, one index: the kernel reads an index
     * per token of the ROPE, the second past the index tensor, unchecked */
    struct ggml_tensor *v1 = ggml_view_2d(ctx, rope, n_dims * 4, 1, rope->nb[2], 0);
    struct ggml_tensor *idx1 = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 1);
    g = fusion_graph(ctx, ggml_set_rows(ctx, kv, v1, idx1));
    CHECK(rope_chain_fuses(g, rope));
    apir_fusion_seal(g, true);
    CHECK(!rope_chain_fuses(g, rope));
    /* a cache at byte 36 (4 mod 8): the kernel stores pairs of floats as
     * one float2, a misaligned store (the H100 chain run) */
    struct ggml_tensor *sr = ggml_set_rows(ctx, kv, v, idx);
    sr->data = (void *)(uintptr_t)4132;
    g = fusion_graph(ctx, sr);
    CHECK(rope_chain_fuses(g, rope));
    apir_fusion_seal(g, true);
    CHECK(!rope_chain_fuses(g, rope));

    /* RMS_NORM then MUL: by its weights (fused), and in place over rows
     * that overlap (the kernel writes 64 x 100 floats densely) */
    struct ggml_tensor *h = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 100);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64);
    struct ggml_tensor *norm = ggml_rms_norm(ctx, h, 1e-5f);
    const enum ggml_op norm_mul[] = { GGML_OP_RMS_NORM, GGML_OP_MUL };
    g = fusion_graph(ctx, ggml_mul(ctx, norm, w));
    apir_fusion_seal(g, true);
    CHECK(ggml_can_fuse(g, chain_at(g, norm, 2), norm_mul, 2));
    struct ggml_tensor *o = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 100);
    struct ggml_tensor *overlap = ggml_view_2d(ctx, o, 64, 100, 4, 0);
    g = fusion_graph(ctx, ggml_mul_inplace(ctx, overlap, norm));
    const int in = chain_at(g, norm, 2);
    CHECK(in >= 0 && ggml_can_fuse(g, in, norm_mul, 2));
    apir_fusion_seal(g, true);
    CHECK(!ggml_can_fuse(g, in, norm_mul, 2));

    /* MUL_MAT and its bias: a bias of the result's shape fuses; one that
     * repeats a row through a zero stride is read past its bytes */
    struct ggml_tensor *wm = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 16);
    struct ggml_tensor *xm = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 32, 1, 4);
    struct ggml_tensor *mm = ggml_mul_mat(ctx, wm, xm);
    const enum ggml_op mm_add[] = { GGML_OP_MUL_MAT, GGML_OP_ADD };
    g = fusion_graph(ctx, ggml_add(ctx, mm, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 16, 1, 4)));
    apir_fusion_seal(g, true);
    CHECK(ggml_can_fuse(g, chain_at(g, mm, 2), mm_add, 2));
    struct ggml_tensor *row = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64);  /* ggml_view_3d asks room for a dense view */
    /* (the bias first: ggml lists the VIEW node before the product) */
    g = fusion_graph(ctx, ggml_add(ctx, ggml_view_3d(ctx, row, 16, 1, 4, 64, 0, 0), mm));
    CHECK(ggml_can_fuse(g, chain_at(g, mm, 2), mm_add, 2));
    apir_fusion_seal(g, true);
    CHECK(!ggml_can_fuse(g, chain_at(g, mm, 2), mm_add, 2));
    /* a bias node whose result has gaps between its columns: the fused
     * kernel writes that node's result and bounds its rows by its strides */
    struct ggml_tensor *gapped = ggml_add(ctx, mm, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 16, 1, 4));
    gapped->nb[2] = 256;
    gapped->nb[3] = 1024;
    g = fusion_graph(ctx, gapped);
    CHECK(ggml_can_fuse(g, chain_at(g, mm, 2), mm_add, 2));
    apir_fusion_seal(g, true);
    CHECK(!ggml_can_fuse(g, chain_at(g, mm, 2), mm_add, 2));

    /* an expert product and its bias per expert, as gpt-oss has them: fused */
    struct ggml_tensor *ex = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 64, 16, 4);
    struct ggml_tensor *eids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 1);
    struct ggml_tensor *emm = ggml_mul_mat_id(ctx, ex, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 1, 1), eids);
    const enum ggml_op mmid_add_id[] = { GGML_OP_MUL_MAT_ID, GGML_OP_ADD_ID };
    g = fusion_graph(ctx, ggml_add_id(ctx, emm, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 4), eids));
    apir_fusion_seal(g, true);
    CHECK(ggml_can_fuse(g, chain_at(g, emm, 2), mmid_add_id, 2));

    /* a router's top-k: its gating op keeps a count no chain matches */
    struct ggml_tensor *probs = ggml_soft_max(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4));
    g = fusion_graph(ctx, ggml_argsort(ctx, probs, GGML_SORT_ORDER_DESC));
    apir_fusion_seal(g, true);
    const int ip = chain_at(g, probs, 2);
    CHECK(ip >= 0 && ggml_node_get_use_count(g, ip) == INT32_MAX);
    ggml_free(ctx);
}

static void test_supports_op(void)
{
    struct apir_session *s = new_session();
    bool yes = false;
    struct apir_tensor_rec t[3] = { f32_rec(1, 0, 0, 64), f32_rec(2, 0, 0, 64), f32_rec(3, 0, 0, 64) };
    t[0].op = GGML_OP_ADD;
    t[0].src[0] = 2;
    t[0].src[1] = 3;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, t), &yes) == APIR_HANDLER_OK && yes);
    bool offload = false;
    CHECK(fwd_DEVICE_OFFLOAD_OP_L(s, span(3, t), &offload) == APIR_HANDLER_OK);
    /* refused ops and broken tensors answer false, not an error */
    t[0].op = GGML_OP_CUSTOM;
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, t), &yes) == APIR_HANDLER_OK && !yes);
    t[0].op = GGML_OP_ADD;
    t[0].type = 1000;
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, t), &yes) == APIR_HANDLER_OK && !yes);
    /* what a device's kernels assume besides (op_device.c): the CUDA rules,
     * forced on this CPU host, say no to a SQRT of a non-contiguous source
     * (ggml-cuda's supports_op says yes and its kernel asserts), which the
     * CPU takes */
    t[0].type = GGML_TYPE_F32;
    struct apir_tensor_rec odd[3] = { f32_rec(1, 0, 0, 8), f32_rec(2, 0, 0, 8), f32_rec(3, 0, 0, 8) };
    odd[0].op = GGML_OP_SQRT;
    odd[0].src[0] = 2;
    odd[0].ne[0] = odd[1].ne[0] = 4;
    odd[0].ne[1] = odd[1].ne[1] = 2;
    odd[1].nb[1] = 32;  /* rows 32 bytes apart: not contiguous */
    odd[1].nb[2] = odd[1].nb[3] = 64;
    odd[0].nb[1] = 16;
    odd[0].nb[2] = odd[0].nb[3] = 32;
    yes = false;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(2, odd), &yes) == APIR_HANDLER_OK && yes);
    setenv("APIR_TEST_KERNEL_RULES", "cuda", 1);
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(2, odd), &yes) == APIR_HANDLER_OK && !yes);
    unsetenv("APIR_TEST_KERNEL_RULES");

    /* a depthwise convolution of a channels-last input keeps that order in
     * its result (test-backend-ops CONV_2D_DW cwhn=1); any other result
     * layout with non-adjacent elements is refused */
    struct apir_tensor_rec cv[3] = { f32_rec(1, 0, 0, 8), f32_rec(2, 0, 0, 3), f32_rec(3, 0, 0, 10) };
    const uint32_t W = 8, H = 6, C = 4;  /* result [W, H, C, 1] in CWHN order */
    cv[0].op = GGML_OP_CONV_2D_DW;
    cv[0].src[0] = 2;
    cv[0].src[1] = 3;
    cv[0].ne[1] = H;
    cv[0].ne[2] = C;
    cv[0].nb[2] = 4;
    cv[0].nb[0] = C * 4;
    cv[0].nb[1] = W * C * 4;
    cv[0].nb[3] = H * W * C * 4;
    cv[1].ne[0] = cv[1].ne[1] = 3;  /* kernel [3, 3, 1, C], channels last too */
    cv[1].ne[3] = C;
    cv[1].nb[0] = cv[1].nb[2] = C * 4;
    cv[1].nb[1] = 3 * C * 4;
    cv[1].nb[3] = 4;
    cv[2].ne[1] = H + 2;  /* input [10, H + 2, C, 1], channels last: a 3x3 kernel makes [8, H] */
    cv[2].ne[2] = C;
    cv[2].nb[2] = 4;
    cv[2].nb[0] = C * 4;
    cv[2].nb[1] = 10 * C * 4;
    cv[2].nb[3] = (H + 2) * 10 * C * 4;
    int32_t conv_params[6] = { 1, 1, 0, 0, 1, 1 };
    memcpy(cv[0].op_params, conv_params, sizeof(conv_params));
    yes = false;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, cv), &yes) == APIR_HANDLER_OK && yes);
    cv[0].nb[3] = 4;  /* not one dense block any more */
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, cv), &yes) == APIR_HANDLER_OK && !yes);
    cv[0].nb[3] = H * W * C * 4;
    struct apir_tensor_rec knl = cv[1];
    cv[1].nb[0] = 4;  /* a channels-first kernel with a channels-last input: ggml asserts */
    cv[1].nb[1] = 12;
    cv[1].nb[2] = cv[1].nb[3] = 36;
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, cv), &yes) == APIR_HANDLER_OK && !yes);
    cv[1] = knl;
    cv[0].ne[2] = C - 1;  /* fewer channels than the input: the kernel wrote past it */
    cv[0].nb[3] = H * W * (C - 1) * 4;
    yes = true;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, cv), &yes) == APIR_HANDLER_OK && !yes);

    /* APIR 0.1 inline tensor: raw struct with garbage pointers that must
     * never be followed, a bogus trailing buffer handle, and srcs. */
    struct ggml_tensor raw[3];
    memset(raw, 0, sizeof(raw));
    for (int i = 0; i < 3; i++) {
        raw[i].type = GGML_TYPE_F32;
        raw[i].ne[0] = 64; raw[i].ne[1] = raw[i].ne[2] = raw[i].ne[3] = 1;
        raw[i].nb[0] = 4; raw[i].nb[1] = raw[i].nb[2] = raw[i].nb[3] = 256;
        raw[i].data = (void *)(uintptr_t)0xdead0000;
        raw[i].extra = (void *)(uintptr_t)0xbad0;
    }
    raw[0].op = GGML_OP_ADD;
    raw[0].buffer = (void *)(uintptr_t)0x1234;
    raw[0].src[0] = (void *)(uintptr_t)0x4000;
    raw[0].src[1] = (void *)(uintptr_t)0x5000;
    uint8_t msg[4096];
    struct apir_encoder e;
    apir_encoder_init(&e, msg, sizeof(msg));
    apir_encode_bytes(&e, &raw[0], sizeof(raw[0]));
    apir_encode_u64(&e, 0x7ffc12345678ull);  /* the reference sends a stack address */
    apir_encode_bytes(&e, &raw[1], sizeof(raw[1]));
    apir_encode_bytes(&e, &raw[2], sizeof(raw[2]));
    yes = false;
    size_t len = apir_encoder_used(&e);
    CHECK(fwd_DEVICE_SUPPORTS_OP(s, (struct apir_bytes){ msg, len }, &yes) == APIR_HANDLER_OK && yes);
    /* every truncation of it is refused */
    int refused = 0;
    for (size_t cut = 0; cut < len; cut += 4)
        refused += fwd_DEVICE_SUPPORTS_OP(s, (struct apir_bytes){ msg, cut }, &yes) == APIR_HANDLER_BAD_REQUEST;
    CHECK(refused == (int)(len / 4));

    /* GET_ALLOC_SIZE with the inline format */
    uint64_t buft = 0, size = 0;
    fwd_DEVICE_GET_BUFFER_TYPE(s, &buft);
    raw[1].buffer = NULL;
    CHECK(fwd_BUFFER_TYPE_GET_ALLOC_SIZE(s, buft, (struct apir_bytes){ &raw[1], sizeof(raw[1]) }, &size) ==
              APIR_HANDLER_OK &&
          size == 256);
    apir_session_free(s);
}

/* An allocation refused by a quota: APIR_HANDLER_LIMIT, and the reply is
 * the reason tag and a string holding want. */
static bool quota_refused(struct apir_session *s, uint64_t size, const char *want)
{
    uint64_t buft = 0;
    fwd_DEVICE_GET_BUFFER_TYPE(s, &buft);
    uint8_t bytes[64];
    struct apir_encoder enc;
    apir_encoder_init(&enc, bytes, sizeof(bytes));
    apir_encode_request_BUFFER_TYPE_ALLOC_BUFFER(&enc, buft, size);
    struct apir_decoder reply;
    if (fwd_raw(s, APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER, bytes, apir_encoder_used(&enc), &reply) != APIR_HANDLER_LIMIT)
        return false;
    static struct apir_string why;
    if (apir_decode_u32(&reply) != APIR_LIMIT_REASON_TAG)
        return false;
    apir_get_string(&reply, &why);
    CHECK_MSG(!reply.fatal && strstr(why.s, want), "limit reason '%s', wanted '%s'", why.s, want);
    return !reply.fatal && strstr(why.s, want);
}

static void test_isolation_and_limits(void)
{
    struct apir_session *a = new_session(), *b = new_session();
    uint64_t buf_a = alloc_buffer(a, 4096);
    CHECK(buf_a != 0);
    /* b cannot name a's buffer, nor a's buffer type */
    uint64_t base = 0;
    static struct apir_string name;
    CHECK(fwd_BUFFER_GET_BASE(b, buf_a, &base) == APIR_HANDLER_BAD_HANDLE);
    CHECK(fwd_BUFFER_FREE_BUFFER(b, buf_a) == APIR_HANDLER_BAD_HANDLE);
    CHECK(fwd_BUFFER_TYPE_GET_NAME(b, a->buft_handles[0], &name) == APIR_HANDLER_BAD_HANDLE);
    CHECK(fwd_BUFFER_GET_BASE(a, buf_a, &base) == APIR_HANDLER_OK && base != 0);

    /* quotas: a buffer beyond max_alloc_bytes or max_buffers is a LIMIT whose
     * reply names the quota (0.3), handle 0 for an APIR 0.1 guest */
    uint64_t saved = host.cfg.limits.max_alloc_bytes;
    host.cfg.limits.max_alloc_bytes = 1 << 20;
    CHECK(quota_refused(b, 2 << 20, "--max-alloc-mib 1"));
    CHECK(alloc_buffer(b, 512 << 10) != 0);
    CHECK(quota_refused(b, 600 << 10, "(524288 bytes in 1 buffers, asking 614400): --max-alloc-mib 1"));
    b->minor = 1;
    CHECK(alloc_buffer(b, 600 << 10) == 0);
    b->minor = APIR_VERSION_MINOR;
    host.cfg.limits.max_alloc_bytes = saved;
    uint32_t saved_n = host.cfg.limits.max_buffers;
    host.cfg.limits.max_buffers = b->n_buffers;
    CHECK(quota_refused(b, 64, "buffer quota reached (1 buffers, asking 64 bytes): --max-buffers 1"));
    host.cfg.limits.max_buffers = saved_n;
    /* a buffer beyond 1 TiB is refused without trying */
    CHECK(alloc_buffer(b, 1ull << 41) == 0);
    apir_session_free(a);
    apir_session_free(b);
}

static struct apir_tensor_rec i32_rec(uint64_t id, uint64_t buffer, uint64_t offset, uint32_t n)
{
    struct apir_tensor_rec t = f32_rec(id, buffer, offset, n);
    t.type = GGML_TYPE_I32;
    return t;
}

/* src0: 8 rows of 4 floats (0..31) at 0; idx: 2 x I32 at 512; dst: GET_ROWS,
 * 2 rows at 1024.  Uploads src0. */
static void get_rows_setup(struct apir_session *s, uint64_t buf, struct apir_tensor_rec t[3])
{
    t[0] = f32_rec(21, buf, 0, 4);
    t[1] = i32_rec(22, buf, 512, 2);
    t[2] = f32_rec(23, buf, 1024, 4);
    t[0].ne[1] = 8;
    t[0].nb[2] = t[0].nb[3] = 8 * 16;
    t[2].ne[1] = 2;
    t[2].nb[2] = t[2].nb[3] = 2 * 16;
    t[2].op = GGML_OP_GET_ROWS;
    t[2].src[0] = 21;
    t[2].src[1] = 22;
    t[2].flags = GGML_TENSOR_FLAG_COMPUTE;
    float *f = (float *)data_blob;
    for (int i = 0; i < 32; i++)
        f[i] = (float)i;
    fwd_BUFFER_SET_TENSOR(s, buf, &t[0], DATA_RES, 0, 128);
}

/* get_rows_setup's graph as keyed graph `key`, its rows 7 and `row` (8 is
 * out of range); the graph command's result, its status in *status. */
static uint32_t keyed_get_rows(struct apir_session *s, uint64_t buf, struct apir_tensor_rec t[3], int32_t row,
                               uint64_t key, uint32_t *status)
{
    int32_t ids[2] = { 7, row };
    memcpy(data_blob, ids, 8);
    fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 8);
    memset(data_blob + 8192, 0, 256);
    size_t size = graph_blob(data_blob + 8192, DATA_SIZE - 8192, &t[2].id, 1, t, 3);
    *status = 99;
    return fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, key, status);
}

/* With defer_graphs and defer_sync_graphs (as a stream transport runs
 * sessions; this device is a CPU) a keyed graph is answered once accepted
 * and computed before the next command; a failure while computing fails
 * the next command that waits for results. */
static void test_deferred_graphs(void)
{
    struct apir_session *s = new_session();
    s->defer_graphs = true;
    s->defer_sync_graphs = true;
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3];
    get_rows_setup(s, buf, t);
    float *f = (float *)data_blob;
    for (int k = 0; k < 2; k++) {
        uint32_t status;
        uint32_t res = keyed_get_rows(s, buf, t, k == 0 ? 1 : 8, 500 + k, &status);  /* then out of range */
        CHECK(res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);  /* accepted, */
        CHECK(apir_graph_deferred(s));                                   /* not yet computed */
        res = fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32);
        CHECK(!apir_graph_deferred(s));
        if (k == 0)
            CHECK(res == APIR_HANDLER_OK && f[0] == 28.0f && f[4] == 4.0f);
        else
            CHECK(res == APIR_HANDLER_BAD_REQUEST);  /* the refusal, told once */
    }
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32) == APIR_HANDLER_OK);
    apir_session_free(s);
}

/* With defer_graphs alone (the shm transport: the guest on this machine) a
 * CPU's keyed graph is computed before its reply, as the CPU backend
 * computes natively: nothing is left to run, and an index refused while
 * computing fails the graph command itself. */
static void test_sync_device_graphs(void)
{
    struct apir_session *s = new_session();
    s->defer_graphs = true;
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3];
    get_rows_setup(s, buf, t);
    const float *f = (const float *)data_blob;
    for (int k = 0; k < 2; k++) {
        uint32_t status;
        uint32_t res = keyed_get_rows(s, buf, t, k == 0 ? 1 : 8, 600 + k, &status);  /* then out of range */
        CHECK(!apir_graph_deferred(s));  /* computed already */
        if (k == 0) {
            CHECK(res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
            memset(data_blob, 0, 32);
            CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32) == APIR_HANDLER_OK && f[0] == 28.0f &&
                  f[4] == 4.0f);
        } else {
            CHECK(res == APIR_HANDLER_BAD_REQUEST);  /* the refusal, at once */
        }
    }
    /* Told once, by the graph: the next read does not fail for it. */
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32) == APIR_HANDLER_OK);
    apir_session_free(s);
}

/* get_rows_setup's graph (rows 7 and 1) launched as keyed graph `key` and
 * left in flight; its blob's size (at data_blob + 8192). */
static size_t get_rows_in_flight(struct apir_session *s, uint64_t buf, struct apir_tensor_rec t[3], uint64_t key)
{
    get_rows_setup(s, buf, t);
    int32_t ids[2] = { 7, 1 };
    memcpy(data_blob, ids, 8);
    fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 8);
    size_t size = graph_blob(data_blob + 8192, DATA_SIZE - 8192, &t[2].id, 1, t, 3);
    uint32_t status = 99;
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, key, &status) == APIR_HANDLER_OK &&
          status == GGML_STATUS_SUCCESS);
    return size;
}

/* A keyed graph is left in flight: queries and graphs do not wait for it,
 * anything touching memory does (apir_command_runs_beside_device). */
static void test_graph_in_flight(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3];
    size_t size = get_rows_in_flight(s, buf, t, 77);
    uint32_t status = 99;
    CHECK(apir_graph_in_flight(s));
    bool yes = false;
    uint64_t free_mem = 0, total = 0;
    CHECK(fwd_DEVICE_SUPPORTS_OP_L(s, span(3, t), &yes) == APIR_HANDLER_OK);
    CHECK(fwd_DEVICE_GET_MEMORY(s, &free_mem, &total) == APIR_HANDLER_OK);
    CHECK(apir_graph_in_flight(s));  /* queries ran beside it */
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 77, &status) == APIR_HANDLER_OK && apir_graph_in_flight(s));
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32) == APIR_HANDLER_OK);
    CHECK(!apir_graph_in_flight(s));  /* a read waited for it */
    CHECK(((float *)data_blob)[0] == 28.0f);
    /* a graph of APIR 0.1 is waited for before its reply */
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_AT(s, DATA_RES, 8192, size, &status) == APIR_HANDLER_OK);
    CHECK(!apir_graph_in_flight(s));
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 77, &status) == APIR_HANDLER_OK && apir_graph_in_flight(s));
    CHECK(fwd_BUFFER_CLEAR(s, buf, 0) == APIR_HANDLER_OK && !apir_graph_in_flight(s));
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 77, &status) == APIR_HANDLER_OK && apir_graph_in_flight(s));
    CHECK(fwd_BACKEND_SYNCHRONIZE(s) == APIR_HANDLER_OK && !apir_graph_in_flight(s));
    apir_session_free(s);
}

/* ggml's graph uid (the CUDA backend's promise that nothing changed: it
 * then replays its captured graph without looking) comes from the host,
 * never from the guest's key: a key sent again with other tensors, after a
 * buffer went, gets a new uid; recomputes keep the uid of their import. */
static void test_graph_uid(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16), other = alloc_buffer(s, 4096);
    struct apir_tensor_rec t[3];
    get_rows_in_flight(s, buf, t, 77);
    struct ggml_cgraph *g = apir_graph_kept(s, 77);
    CHECK(g && g->uid != 0 && g->uid != 77);
    const uint64_t first = g ? g->uid : 0;
    uint32_t status = 99;
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 77, &status) == APIR_HANDLER_OK && apir_graph_kept(s, 77) == g &&
          g->uid == first);
    /* the same key, after a buffer went: a new import, a new uid */
    CHECK(fwd_BUFFER_FREE_BUFFER(s, other) == APIR_HANDLER_OK);
    CHECK(fwd_BACKEND_GRAPH_RECOMPUTE(s, 77, &status) == APIR_HANDLER_STALE);
    get_rows_in_flight(s, buf, t, 77);
    g = apir_graph_kept(s, 77);
    CHECK(g && g->uid != 0 && g->uid != first);
    /* another session's graph under the same key: another uid */
    struct apir_session *s2 = new_session();
    uint64_t buf2 = alloc_buffer(s2, 1 << 16);
    get_rows_in_flight(s2, buf2, t, 77);
    struct ggml_cgraph *g2 = apir_graph_kept(s2, 77);
    CHECK(g && g2 && g2->uid != 0 && g2->uid != g->uid && g2->uid != first);
    apir_session_free(s2);
    apir_session_free(s);
}

/* A new keyed graph takes the least recently used slot: it waits for the
 * device only when that slot's graph may still run (launched since the last
 * wait), not for every new graph of a prompt's batches. */
static void test_graph_slot_reuse(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    /* An ADD: no index values to check (a check of host memory waits too). */
    struct apir_tensor_rec t[2] = { f32_rec(21, buf, 0, 4), f32_rec(23, buf, 1024, 4) };
    t[1].op = GGML_OP_ADD;
    t[1].src[0] = t[1].src[1] = 21;
    t[1].flags = GGML_TENSOR_FLAG_COMPUTE;
    const float in[4] = { 1, 2, 3, 14 };
    memcpy(data_blob, in, sizeof(in));
    fwd_BUFFER_SET_TENSOR(s, buf, &t[0], DATA_RES, 0, sizeof(in));
    size_t size = graph_blob(data_blob + 8192, DATA_SIZE - 8192, &t[1].id, 1, t, 2);
    uint32_t status = 99;
    const uint64_t settles0 = s->settles;
    for (uint64_t key = 1; key <= APIR_GRAPH_CACHE_SLOTS; key++)
        CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, key, &status) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 && apir_graph_in_flight(s));  /* empty slots: no wait */
    /* The slot of key 1, launched after the last wait: waited for. */
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, 100, &status) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 + 1 && apir_graph_in_flight(s));
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[1], DATA_RES, 0, 16) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 + 2 && !apir_graph_in_flight(s));
    /* Keys 2.. were launched before that read's wait: their slots are
     * taken without another, the graphs in flight meanwhile. */
    for (uint64_t key = 101; key < 100 + APIR_GRAPH_CACHE_SLOTS; key++) {
        CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, key, &status) == APIR_HANDLER_OK &&
              status == GGML_STATUS_SUCCESS);
        CHECK(apir_graph_kept(s, key) != NULL);
    }
    CHECK(s->settles == settles0 + 2 && apir_graph_in_flight(s));
    CHECK(apir_graph_kept(s, 100) != NULL && apir_graph_kept(s, 2) == NULL);
    /* Key 100's slot is the oldest now, launched before that wait too;
     * then key 101's, launched after it. */
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, 200, &status) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 + 2 && apir_graph_kept(s, 100) == NULL);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, 201, &status) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 + 3 && apir_graph_kept(s, 101) == NULL);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[1], DATA_RES, 0, 16) == APIR_HANDLER_OK &&
          ((float *)data_blob)[3] == 28.0f);
    apir_session_free(s);
}

/* A prompt batch that outputs no row (llama.cpp's GET_ROWS of 0 output ids)
 * has no index to read: its graph does not wait for the one in flight, while
 * one with ids in host memory does (the check reads what a graph may write). */
static void test_empty_index_no_wait(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3];
    size_t size = get_rows_in_flight(s, buf, t, 1);
    uint32_t status = 99;
    CHECK(apir_graph_in_flight(s));
    const uint64_t settles0 = s->settles;
    struct apir_tensor_rec e[3] = { t[0], i32_rec(32, buf, 2048, 0), f32_rec(33, buf, 4096, 4) };
    e[2].ne[1] = 0;
    e[2].nb[2] = e[2].nb[3] = 0;
    e[2].op = GGML_OP_GET_ROWS;
    e[2].src[0] = 21;
    e[2].src[1] = 32;
    e[2].flags = GGML_TENSOR_FLAG_COMPUTE;
    size = graph_blob(data_blob + 8192, DATA_SIZE - 8192, &e[2].id, 1, e, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, 2, &status) == APIR_HANDLER_OK &&
          status == GGML_STATUS_SUCCESS);
    CHECK(s->settles == settles0 && apir_graph_in_flight(s));
    size = graph_blob(data_blob + 8192, DATA_SIZE - 8192, &t[2].id, 1, t, 3);
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_KEYED(s, DATA_RES, 8192, size, 3, &status) == APIR_HANDLER_OK);
    CHECK(s->settles == settles0 + 1);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32) == APIR_HANDLER_OK &&
          ((float *)data_blob)[0] == 28.0f);
    apir_session_free(s);
}

/* GET_ROWS / SET_ROWS row indices (ggml-rpc #26825, #26912): validated
 * values, never a host abort or an out-of-bounds access. */
static void test_index_policy(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    struct apir_tensor_rec t[3];
    get_rows_setup(s, buf, t);
    float *f = (float *)data_blob;
    int32_t ids[2] = { 7, 1 };
    memcpy(data_blob, ids, 8);
    fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 8);
    uint64_t node = 23;
    size_t size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
    uint32_t status;
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32);
    CHECK(f[0] == 28.0f && f[4] == 4.0f);

    /* out of range, and negative: refused before compute */
    int32_t bad_ids[2][2] = { { 8, 0 }, { 0, -1 } };
    for (int k = 0; k < 2; k++) {
        memcpy(data_blob, bad_ids[k], 8);
        fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 8);
        size = graph_blob(data_blob, DATA_SIZE, &node, 1, t, 3);
        CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED);
    }

    /* indices computed in the graph (CPY f32 -> i32) are checked at the split */
    struct apir_tensor_rec g[5] = { t[0], f32_rec(24, buf, 2048, 2), i32_rec(22, buf, 512, 2), t[2],
                                    i32_rec(25, buf, 512, 2) };
    g[4].op = GGML_OP_CPY;  /* a view of the index tensor, written from floats */
    g[4].src[0] = 24;
    g[4].src[1] = 22;
    g[4].view_src = 22;
    g[4].flags = GGML_TENSOR_FLAG_COMPUTE;
    float fl[2][2] = { { 3.0f, 5.0f }, { 3.0f, 50.0f } };
    uint64_t nodes[2] = { 25, 23 };
    for (int k = 0; k < 2; k++) {
        memcpy(data_blob, fl[k], 8);
        fwd_BUFFER_SET_TENSOR(s, buf, &g[1], DATA_RES, 0, 8);
        size = graph_blob(data_blob, DATA_SIZE, nodes, 2, g, 5);
        uint32_t res = compute(s, size, &status);
        if (k == 0) {
            CHECK(res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
            fwd_BUFFER_GET_TENSOR(s, buf, &g[3], DATA_RES, 0, 32);
            CHECK(f[0] == 12.0f && f[4] == 20.0f);
        } else {
            CHECK(res == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED);
        }
    }

    /* indices in guest-shared memory (a buffer over a blob): the op reads a
     * checked private copy, so later guest writes cannot bypass the check */
    static uint8_t shared_blob[65536] __attribute__((aligned(4096)));
    CHECK(apir_session_blob_add(s, 11, shared_blob, sizeof(shared_blob), NULL, NULL));
    uint64_t sbuf = 0, sbuft = 0;
    CHECK(fwd_DEVICE_BUFFER_FROM_PTR(s, 11, sizeof(shared_blob), sizeof(shared_blob), &sbuf, &sbuft) ==
          APIR_HANDLER_OK);
    struct apir_tensor_rec sh[3] = { t[0], i32_rec(42, sbuf, 64, 2), t[2] };
    sh[2].src[1] = 42;
    int32_t shared_ids[2] = { 2, 6 };
    memcpy(shared_blob + 64, shared_ids, 8);
    size = graph_blob(data_blob, DATA_SIZE, &node, 1, sh, 3);
    CHECK(compute(s, size, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 32);
    CHECK(f[0] == 8.0f && f[4] == 24.0f);
    shared_ids[1] = 9;
    memcpy(shared_blob + 64, shared_ids, 8);
    CHECK(compute(s, size, &status) == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED);

    /* SET_ROWS: dst 8 rows, 2 source rows, I64 indices */
    struct apir_tensor_rec sr[4] = { f32_rec(31, buf, 4096, 4), f32_rec(32, buf, 8192, 4), i32_rec(33, buf, 9000, 2),
                                     f32_rec(34, buf, 4096, 4) };
    sr[0].ne[1] = sr[3].ne[1] = 8;
    sr[0].nb[2] = sr[0].nb[3] = sr[3].nb[2] = sr[3].nb[3] = 128;
    sr[1].ne[1] = 2;
    sr[1].nb[2] = sr[1].nb[3] = 32;
    sr[2].type = GGML_TYPE_I64;
    sr[2].nb[0] = 8; sr[2].nb[1] = sr[2].nb[2] = sr[2].nb[3] = 16;
    sr[3].op = GGML_OP_SET_ROWS;
    sr[3].src[0] = 32;
    sr[3].src[1] = 33;
    sr[3].src[2] = 31;  /* ggml_set_rows links the destination as src[2] */
    sr[3].view_src = 31;
    sr[3].flags = GGML_TENSOR_FLAG_COMPUTE;
    int64_t rows[2][2] = { { 0, 7 }, { 0, 8 } };
    for (int k = 0; k < 2; k++) {
        memcpy(data_blob, rows[k], 16);
        fwd_BUFFER_SET_TENSOR(s, buf, &sr[2], DATA_RES, 0, 16);
        uint64_t n = 34;
        size = graph_blob(data_blob, DATA_SIZE, &n, 1, sr, 4);
        uint32_t res = compute(s, size, &status);
        CHECK(k == 0 ? (res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS)
                     : (res == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED));
    }
    apir_session_free(s);
}

/* Weight copies (host/data/weight_copies.h): a Q4_0 matrix noted whole is kept
 * in the CPU's repacked layout and MUL_MAT reads it there; every write to
 * its bytes, seen or reported, drops the copy. */
#define WQ_K 256
#define WQ_N 16
static struct apir_tensor_rec q4_0_rec(uint64_t id, uint64_t buffer, uint64_t offset)
{
    struct apir_tensor_rec t = f32_rec(id, buffer, offset, WQ_K);
    t.type = GGML_TYPE_Q4_0;
    t.ne[1] = WQ_N;
    t.nb[0] = ggml_type_size(GGML_TYPE_Q4_0);
    t.nb[1] = ggml_row_size(GGML_TYPE_Q4_0, WQ_K);
    t.nb[2] = t.nb[3] = t.nb[1] * WQ_N;
    return t;
}

static uint32_t note_weight(struct apir_session *s, uint64_t buf, const struct apir_tensor_rec *w, uint32_t *answer)
{
    *answer = 99;
    return fwd_BUFFER_NOTE_WEIGHT(s, buf, w, answer);
}

static void mul_mat(struct apir_session *s, uint64_t buf, const struct apir_tensor_rec t[3], float out[WQ_N])
{
    size_t size = graph_blob(data_blob + 65536, DATA_SIZE - 65536, &t[2].id, 1, t, 3);
    uint32_t status = 99;
    CHECK(fwd_BACKEND_GRAPH_COMPUTE_AT(s, DATA_RES, 65536, size, &status) == APIR_HANDLER_OK);
    CHECK(status == GGML_STATUS_SUCCESS);
    CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t[2], DATA_RES, 0, 4 * WQ_N) == APIR_HANDLER_OK);
    memcpy(out, data_blob, 4 * WQ_N);
}

static void test_weight_copies(void)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, 1 << 16);
    const uint64_t wbytes = ggml_row_size(GGML_TYPE_Q4_0, WQ_K) * WQ_N;
    struct apir_tensor_rec t[3] = { q4_0_rec(21, buf, 0), f32_rec(22, buf, 8192, WQ_K), f32_rec(23, buf, 12288, WQ_N) };
    t[2].op = GGML_OP_MUL_MAT;
    t[2].src[0] = 21;
    t[2].src[1] = 22;
    t[2].flags = GGML_TENSOR_FLAG_COMPUTE;
    float wf[WQ_K * WQ_N];
    for (int i = 0; i < WQ_K * WQ_N; i++)
        wf[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    ggml_quantize_chunk(GGML_TYPE_Q4_0, wf, data_blob, 0, WQ_N, WQ_K, NULL);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t[0], DATA_RES, 0, wbytes) == APIR_HANDLER_OK);
    float *x = (float *)data_blob;
    for (int i = 0; i < WQ_K; i++)
        x[i] = (float)(i % 7) - 3.0f;
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 4 * WQ_K) == APIR_HANDLER_OK);
    float plain[WQ_N], copied[WQ_N];
    mul_mat(s, buf, t, plain);

    /* noted: kept, charged to the session, used by MUL_MAT */
    uint64_t bytes0 = s->bytes_allocated, epoch0 = s->buffers_epoch;
    uint32_t answer;
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_KEPT);
    CHECK(apir_weights_count(s) == 1 && s->bytes_allocated >= bytes0 + wbytes && s->buffers_epoch > epoch0);
    const char *why = NULL;
    size_t size = graph_blob(data_blob + 65536, DATA_SIZE - 65536, &t[2].id, 1, t, 3);
    struct ggml_cgraph *g = build_whole(s, data_blob + 65536, size, &why);
    CHECK(g && ggml_graph_node(g, 1)->src[0]->buffer && !strcmp(ggml_backend_buffer_name(ggml_graph_node(g, 1)->src[0]->buffer), "CPU_REPACK"));
    mul_mat(s, buf, t, copied);
    for (int i = 0; i < WQ_N; i++)
        CHECK(fabsf(copied[i] - plain[i]) <= 1e-2f * (1.0f + fabsf(plain[i])));
    /* noting again replaces it */
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_KEPT &&
          apir_weights_count(s) == 1);

    /* a write the host sees: one block of row 0 */
    memset(data_blob, 0x11, 18);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t[0], DATA_RES, 18, 18) == APIR_HANDLER_OK);
    CHECK(apir_weights_count(s) == 0 && s->bytes_allocated == bytes0);
    g = build_whole(s, data_blob + 65536, size, &why);
    CHECK(g && ggml_graph_node(g, 1)->src[0]->buffer != NULL &&
          strcmp(ggml_backend_buffer_name(ggml_graph_node(g, 1)->src[0]->buffer), "CPU_REPACK") != 0);

    /* a write the guest reports, in range and out of it */
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_KEPT);
    CHECK(fwd_BUFFER_WRITTEN(s, buf, 1 << 16, 1) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_WRITTEN(s, buf, UINT64_MAX, 2) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_WRITTEN(s, buf, wbytes, 100) == APIR_HANDLER_OK && apir_weights_count(s) == 1);
    CHECK(fwd_BUFFER_WRITTEN(s, buf, wbytes - 1, 1) == APIR_HANDLER_OK && apir_weights_count(s) == 0);

    /* a graph writing into the weight's bytes: the copy is dropped first */
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_KEPT);
    struct apir_tensor_rec wr[2] = { f32_rec(22, buf, 8192, 64), f32_rec(24, buf, 64, 64) };
    wr[1].op = GGML_OP_ADD;
    wr[1].src[0] = wr[1].src[1] = 22;
    size_t wsize = graph_blob(data_blob + 65536, DATA_SIZE - 65536, &wr[1].id, 1, wr, 2);
    CHECK(build_whole(s, data_blob + 65536, wsize, &why) != NULL && apir_weights_count(s) == 0);

    /* memset, clear and free drop it too */
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && apir_weights_count(s) == 1);
    CHECK(fwd_BUFFER_MEMSET_TENSOR(s, buf, &t[0], 0, 0, 1) == APIR_HANDLER_OK && apir_weights_count(s) == 0);
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && apir_weights_count(s) == 1);
    CHECK(fwd_BUFFER_CLEAR(s, buf, 0) == APIR_HANDLER_OK && apir_weights_count(s) == 0);

    /* what no layout takes, and what is not the guest's to name */
    CHECK(note_weight(s, buf, &t[1], &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_NOT_KEPT);
    uint64_t other = alloc_buffer(s, 1 << 12);
    CHECK(note_weight(s, other, &t[0], &answer) == APIR_HANDLER_BAD_REQUEST);
    struct apir_tensor_rec big = q4_0_rec(25, buf, (1 << 16) - 100);
    CHECK(note_weight(s, buf, &big, &answer) == APIR_HANDLER_BAD_REQUEST && apir_weights_count(s) == 0);
    CHECK(note_weight(s, buf, &t[0], &answer) == APIR_HANDLER_OK && apir_weights_count(s) == 1);
    CHECK(fwd_BUFFER_FREE_BUFFER(s, buf) == APIR_HANDLER_OK && apir_weights_count(s) == 0);
    s->host->cfg.weight_copies = false;  /* APIR_HOST_WEIGHT_COPIES=0 */
    /* the host decodes the request before the handler: a tensor in the
     * freed buffer is refused even when copies are off */
    CHECK(note_weight(s, other, &t[0], &answer) == APIR_HANDLER_BAD_REQUEST && answer == 0);
    struct apir_tensor_rec w_other = q4_0_rec(26, other, 0);
    CHECK(note_weight(s, other, &w_other, &answer) == APIR_HANDLER_OK && answer == APIR_WEIGHT_NEVER);
    s->host->cfg.weight_copies = true;
    /* 0.3 commands need 0.3 */
    s->minor = 2;
    CHECK(note_weight(s, other, &t[0], &answer) == APIR_HANDLER_INVALID_INDEX);
    CHECK(fwd_BUFFER_WRITTEN(s, other, 0, 1) == APIR_HANDLER_INVALID_INDEX);
    apir_session_free(s);
}

static void setup(void)
{
    if (!test_host_init_cpu(&host))
        exit(1);
}

static void run_setup(void) { setup(); CHECK(host.n_devices == 1); }

TEST_MAIN("dispatch",
          TEST(run_setup),
          TEST(test_handshake),
          TEST(test_device_commands),
          TEST(test_buffer_type_commands),
          TEST(test_buffer_data_commands),
          TEST(test_buffer_from_ptr),
          TEST(test_graph_compute),
          TEST(test_graph_checks_kept),
          TEST(test_graph_delta),
          TEST(test_graph_use_counts),
          TEST(test_empty_views),
          TEST(test_deferred_graphs),
          TEST(test_sync_device_graphs),
          TEST(test_graph_in_flight), TEST(test_graph_uid), TEST(test_graph_slot_reuse), TEST(test_empty_index_no_wait),
          TEST(test_chunked_download),
          TEST(test_tensor_checks),
          TEST(test_malformed),
          TEST(test_supports_op),
          TEST(test_cuda_transposing_copy),
          TEST(test_cuda_entry_rules),
          TEST(test_cuda_leading_dims),
          TEST(test_cuda_kernel_layouts),
          TEST(test_fusion_seal),
          TEST(test_isolation_and_limits),
          TEST(test_index_policy),
          TEST(test_weight_copies))
