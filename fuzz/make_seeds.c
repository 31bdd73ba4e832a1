/*
 * make_seeds: writes valid seed inputs for every fuzz target.
 *
 *   make_seeds DIR   ->  one NAME.bin file per seed in DIR/fuzz_codec,
 *                        DIR/fuzz_dispatch, DIR/fuzz_graph, DIR/fuzz_inline,
 *                        DIR/fuzz_shm_frame, DIR/fuzz_stream_frame and DIR/fuzz_op
 *
 * Seeds matter here because most of the host's code sits behind checks a
 * random input never passes (valid tensor records, graphs whose ids
 * resolve, the shm hello).  Formats: fuzz_format.h; handles are written as
 * the small numbers the harnesses rewrite.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "fuzz_common.h"
#include "fuzz_format.h"
#include "ggml.h"
#include "shm_proto.h"
#include "stream_proto.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *out_dir;
static unsigned n_written;

static void write_seed(const char *target, const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", out_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s.bin", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    n_written++;
}

static void write_writer(const char *target, const char *name, const struct fz_writer *w)
{
    if (w->len > w->cap) {
        fprintf(stderr, "make_seeds: %s/%s does not fit (%zu bytes)\n", target, name, w->len);
        exit(1);
    }
    write_seed(target, name, w->buf, w->len);
}

/* ---- building blocks ----------------------------------------------------------- */

/* A contiguous F32 tensor record of ne0 x ne1 in buffer handle number buf. */
static struct apir_tensor_rec rec_f32(uint64_t id, uint32_t ne0, uint32_t ne1, uint64_t buf, uint64_t data,
                                      enum ggml_op op)
{
    struct apir_tensor_rec r;
    memset(&r, 0, sizeof(r));
    r.id = id;
    r.type = GGML_TYPE_F32;
    r.buffer = buf;
    r.ne[0] = ne0;
    r.ne[1] = ne1;
    r.ne[2] = 1;
    r.ne[3] = 1;
    r.nb[0] = 4;
    r.nb[1] = 4 * ne0;
    r.nb[2] = 4 * ne0 * ne1;
    r.nb[3] = r.nb[2];
    r.op = (uint32_t)op;
    /* ggml's CPU backend computes only nodes marked so (ggml_build_forward
     * marks them on the guest). */
    if (op != GGML_OP_NONE)
        r.flags = GGML_TENSOR_FLAG_COMPUTE;
    r.data = data;
    snprintf(r.name, sizeof(r.name), "t%llu", (unsigned long long)id);
    return r;
}

/* The APIR 0.1 graph blob. */
static size_t graph_blob(uint8_t *out, size_t cap, const uint64_t *nodes, uint32_t n_nodes,
                         const struct apir_tensor_rec *recs, uint32_t n)
{
    struct apir_encoder enc;
    apir_encoder_init(&enc, out, cap);
    apir_encode_u32(&enc, n_nodes);
    for (uint32_t i = 0; i < n_nodes; i++)
        apir_encode_u64(&enc, nodes[i]);
    apir_encode_u32(&enc, n);
    for (uint32_t i = 0; i < n; i++)
        apir_encode_tensor(&enc, &recs[i]);
    if (enc.fatal) {
        fprintf(stderr, "make_seeds: graph too big\n");
        exit(1);
    }
    return apir_encoder_used(&enc);
}

/* c = a + b, 16 floats each, in buffer A at 0, 64, 128. */
static size_t graph_add(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[3] = {
        rec_f32(1, 16, 1, FZ_H_BUF_A, 0, GGML_OP_NONE),
        rec_f32(2, 16, 1, FZ_H_BUF_A, 64, GGML_OP_NONE),
        rec_f32(3, 16, 1, FZ_H_BUF_A, 128, GGML_OP_ADD),
    };
    t[2].src[0] = 1;
    t[2].src[1] = 2;
    uint64_t nodes[1] = { 3 };
    return graph_blob(out, cap, nodes, 1, t, 3);
}

/* d = mul_mat(a 4x4, b 4x2), then e = d * d; a in buffer B. */
static size_t graph_mul_mat(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[4] = {
        rec_f32(10, 4, 4, FZ_H_BUF_B, 0, GGML_OP_NONE),
        rec_f32(11, 4, 2, FZ_H_BUF_A, 0, GGML_OP_NONE),
        rec_f32(12, 4, 2, FZ_H_BUF_A, 256, GGML_OP_MUL_MAT),
        rec_f32(13, 4, 2, FZ_H_BUF_A, 512, GGML_OP_MUL),
    };
    t[2].src[0] = 10;
    t[2].src[1] = 11;
    t[3].src[0] = 12;
    t[3].src[1] = 12;
    uint64_t nodes[2] = { 12, 13 };
    return graph_blob(out, cap, nodes, 2, t, 4);
}

/* A Q4_0 weight w (256 x 16, buffer B) times x: what a CPU host keeps a
 * repacked copy of once noted (host/data/weight_copies.h). */
static struct apir_tensor_rec rec_q4_0_weight(void)
{
    struct apir_tensor_rec w = rec_f32(30, 256, 16, FZ_H_BUF_B, 0, GGML_OP_NONE);
    w.type = GGML_TYPE_Q4_0;
    w.nb[0] = 18;
    w.nb[1] = 18 * 8;
    w.nb[2] = w.nb[3] = 18 * 8 * 16;
    return w;
}

static size_t graph_weight(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[3] = {
        rec_q4_0_weight(),
        rec_f32(31, 256, 1, FZ_H_BUF_A, 0, GGML_OP_NONE),
        rec_f32(32, 16, 1, FZ_H_BUF_A, 1024, GGML_OP_MUL_MAT),
    };
    t[2].src[0] = 30;
    t[2].src[1] = 31;
    uint64_t nodes[1] = { 32 };
    return graph_blob(out, cap, nodes, 1, t, 3);
}

/* v = view of the second half of a; c = cpy(v, dst). */
static size_t graph_view_cpy(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[4] = {
        rec_f32(20, 16, 1, FZ_H_BUF_A, 1024, GGML_OP_NONE),
        rec_f32(21, 8, 1, FZ_H_BUF_A, 1024 + 32, GGML_OP_VIEW),
        rec_f32(22, 8, 1, FZ_H_BUF_A, 2048, GGML_OP_NONE),
        rec_f32(23, 8, 1, FZ_H_BUF_A, 2048, GGML_OP_CPY),
    };
    t[1].view_src = 20;
    t[1].view_offs = 32;
    t[1].src[0] = 20;
    t[3].view_src = 22;
    t[3].src[0] = 21;
    t[3].src[1] = 22;
    uint64_t nodes[2] = { 21, 23 };
    return graph_blob(out, cap, nodes, 2, t, 4);
}

/* Unary and reduction ops over one input. */
static size_t graph_unary(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[4] = {
        rec_f32(30, 8, 2, FZ_H_BUF_A, 0, GGML_OP_NONE),
        rec_f32(31, 8, 2, FZ_H_BUF_A, 64, GGML_OP_SCALE),
        rec_f32(32, 8, 2, FZ_H_BUF_A, 128, GGML_OP_SOFT_MAX),
        rec_f32(33, 1, 2, FZ_H_BUF_A, 256, GGML_OP_SUM_ROWS),
    };
    float scale = 0.5f;
    memcpy(&t[1].op_params[0], &scale, 4);
    t[1].src[0] = 30;
    t[2].src[0] = 31;
    float one = 1.0f;
    memcpy(&t[2].op_params[0], &one, 4);
    t[3].src[0] = 32;
    uint64_t nodes[3] = { 31, 32, 33 };
    return graph_blob(out, cap, nodes, 3, t, 4);
}

/* r = get_rows(a 4x8, idx i32[3]): an op whose index values the host's
 * op policy validates before computing. */
static size_t graph_get_rows(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[3] = {
        rec_f32(40, 4, 8, FZ_H_BUF_A, 0, GGML_OP_NONE),
        rec_f32(41, 3, 1, FZ_H_BUF_A, 256, GGML_OP_NONE),
        rec_f32(42, 4, 3, FZ_H_BUF_A, 512, GGML_OP_GET_ROWS),
    };
    t[1].type = GGML_TYPE_I32;
    t[2].src[0] = 40;
    t[2].src[1] = 41;
    uint64_t nodes[1] = { 42 };
    return graph_blob(out, cap, nodes, 1, t, 3);
}

/* set_rows(a 4x8, b 4x3, idx i32[3]): the result is a view of a; srcs are
 * b, idx, a (ggml's order). */
static size_t graph_set_rows(uint8_t *out, size_t cap)
{
    struct apir_tensor_rec t[4] = {
        rec_f32(50, 4, 8, FZ_H_BUF_A, 1024, GGML_OP_NONE),
        rec_f32(51, 4, 3, FZ_H_BUF_A, 1280, GGML_OP_NONE),
        rec_f32(52, 3, 1, FZ_H_BUF_A, 1536, GGML_OP_NONE),
        rec_f32(53, 4, 8, FZ_H_BUF_A, 1024, GGML_OP_SET_ROWS),
    };
    t[2].type = GGML_TYPE_I32;
    t[3].view_src = 50;
    t[3].src[0] = 51;
    t[3].src[1] = 52;
    t[3].src[2] = 50;
    uint64_t nodes[1] = { 53 };
    return graph_blob(out, cap, nodes, 1, t, 4);
}

/* The raw struct ggml_tensor a reference guest sends (pointers are its own
 * and never followed; only NULL or not matters). */
static void raw_tensor(struct ggml_tensor *t, enum ggml_op op, uint32_t ne0)
{
    memset(t, 0, sizeof(*t));
    t->type = GGML_TYPE_F32;
    t->op = op;
    t->ne[0] = ne0;
    t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->nb[0] = 4;
    t->nb[1] = t->nb[2] = t->nb[3] = 4 * (size_t)ne0;
    snprintf(t->name, sizeof(t->name), "inline");
}

static void inline_tensor(struct fz_writer *w, enum ggml_op op, int n_src, bool buffer, bool view)
{
    struct ggml_tensor t;
    raw_tensor(&t, op, 16);
    if (buffer)
        t.buffer = (struct ggml_backend_buffer *)(uintptr_t)0x7f0000001000ull;
    if (view)
        t.view_src = (struct ggml_tensor *)(uintptr_t)0x7f0000002000ull;
    for (int i = 0; i < n_src; i++)
        t.src[i] = (struct ggml_tensor *)(uintptr_t)(0x7f0000003000ull + 0x100ull * (unsigned)i);
    fz_put(w, &t, sizeof(t));
    if (buffer)
        fz_put_le(w, FZ_H_BUF_A, 8);
    if (view) {
        struct ggml_tensor v;
        raw_tensor(&v, GGML_OP_NONE, 32);
        fz_put(w, &v, sizeof(v));
    }
    for (int i = 0; i < n_src; i++) {
        struct ggml_tensor s;
        raw_tensor(&s, GGML_OP_NONE, 16);
        fz_put(w, &s, sizeof(s));
    }
}

/* ---- fuzz_codec: a valid request and reply of every command ---------------------- */

/* The sample items: by kind, some by position p in the message. */
struct codec_sample {
    struct apir_tensor_rec recs[3];   /* an ADD of the other two */
    uint8_t inline_bytes[4096];
    size_t inline_len;
};

static inline uint32_t fz_in_u32(const struct codec_sample *c, size_t p) { (void)c; return (uint32_t)(p + 3); }
static inline uint32_t fz_in_enum(const struct codec_sample *c, size_t p) { (void)c; return (uint32_t)(p + 3); }
static inline uint32_t fz_in_res(const struct codec_sample *c, size_t p) { (void)c; return (uint32_t)(p + 3); }
static inline int32_t fz_in_i32(const struct codec_sample *c, size_t p) { (void)c; (void)p; return 1; }
static inline bool fz_in_bool(const struct codec_sample *c, size_t p) { (void)c; (void)p; return true; }
static inline uint8_t fz_in_u8(const struct codec_sample *c, size_t p) { (void)c; (void)p; return 0x5a; }
static inline uint64_t fz_in_u64(const struct codec_sample *c, size_t p) { (void)c; return p == 0 ? FZ_H_BUF_A : 64; }
static inline uint64_t fz_in_buffer(const struct codec_sample *c, size_t p) { return fz_in_u64(c, p); }
static inline uint64_t fz_in_buft(const struct codec_sample *c, size_t p) { return fz_in_u64(c, p); }
static inline const char *fz_in_string(const struct codec_sample *c, size_t p) { (void)c; (void)p; return "CPU"; }
static inline const struct apir_tensor_rec *fz_in_tensor(const struct codec_sample *c, size_t p)
{
    (void)p;
    return &c->recs[0];
}
static inline const struct apir_digest *fz_in_digest(const struct codec_sample *c, size_t p)
{
    (void)c;
    (void)p;
    static const struct apir_digest d = { { 0xd1, 0x9e, 0x57, 0x32 } };
    return &d;
}
static inline struct apir_tensor_span fz_in_tensors(const struct codec_sample *c, size_t p)
{
    (void)p;
    return (struct apir_tensor_span){ 3, c->recs };
}
static inline struct apir_bytes fz_in_inline(const struct codec_sample *c, size_t p)
{
    (void)p;
    return (struct apir_bytes){ c->inline_bytes, c->inline_len };
}

FZ_DEFINE_TYPED_ENCODE(encode_sample, struct codec_sample)

static void seeds_codec(void)
{
    static uint8_t buf[8192];
    static struct codec_sample sample;
    sample.recs[0] = rec_f32(1, 16, 1, FZ_H_BUF_A, 0, GGML_OP_ADD);
    sample.recs[1] = rec_f32(2, 16, 1, FZ_H_BUF_A, 64, GGML_OP_NONE);
    sample.recs[2] = rec_f32(3, 16, 1, FZ_H_BUF_A, 128, GGML_OP_NONE);
    sample.recs[0].src[0] = 2;
    sample.recs[0].src[1] = 3;
    struct fz_writer iw = { sample.inline_bytes, sizeof(sample.inline_bytes), 0 };
    inline_tensor(&iw, GGML_OP_ADD, 2, true, false);
    if (iw.len > iw.cap)
        exit(1);
    sample.inline_len = iw.len;

    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        const struct apir_command_info *c = &apir_command_table[cmd];
        if (!c->name)
            continue;
        for (int dir = 0; dir < 2; dir++) {
            struct apir_encoder enc;
            apir_encoder_init(&enc, buf, sizeof(buf));
            if (dir == 0) {
                /* Requests as the transports carry them: with the header. */
                struct apir_cmd_header hdr = { APIR_CMD_TYPE_FORWARD, (int32_t)cmd, APIR_SHM_REPLY_RES_ID };
                apir_encode_header(&enc, &hdr);
            }
            encode_sample(&sample, cmd, dir == 1, &enc);
            if (enc.fatal)
                continue;
            char name[96];
            snprintf(name, sizeof(name), "%02u-%s-%s", cmd, c->name, dir == 0 ? "request" : "reply");
            write_seed("fuzz_codec", name, buf, apir_encoder_used(&enc));
        }
    }
}

/* ---- fuzz_dispatch: sessions ---------------------------------------------------- */

static void put_cmd(struct fz_writer *w, uint8_t op, const struct apir_encoder *req)
{
    fz_put_le(w, op, 1);
    fz_put_le(w, apir_encoder_used(req), 2);
    fz_put(w, req->start, apir_encoder_used(req));
}

/* One command record: the request by its typed encoder. */
#define REQ(cmd, ...)                                                                  \
    do {                                                                               \
        apir_encoder_init(&enc, rbuf, sizeof(rbuf));                                   \
        apir_encode_request_##cmd(&enc, __VA_ARGS__);                                  \
        put_cmd(&w, APIR_CMD_##cmd, &enc);                                             \
    } while (0)
#define REQ0(cmd)                                                                      \
    do {                                                                               \
        apir_encoder_init(&enc, rbuf, sizeof(rbuf));                                   \
        apir_encode_request_##cmd(&enc);                                               \
        put_cmd(&w, APIR_CMD_##cmd, &enc);                                             \
    } while (0)

static void seeds_dispatch(void)
{
    static uint8_t sbuf[64 * 1024], rbuf[8192], graph[8192];
    struct fz_writer w;
    struct apir_encoder enc;
    struct apir_tensor_rec a = rec_f32(1, 16, 1, FZ_H_BUF_A, 0, GGML_OP_NONE);
    struct apir_tensor_rec b = rec_f32(2, 16, 1, FZ_H_BUF_A, 64, GGML_OP_NONE);
    struct apir_tensor_rec c = rec_f32(3, 16, 1, FZ_H_BUF_A, 128, GGML_OP_ADD);
    c.src[0] = 1;
    c.src[1] = 2;
    struct apir_tensor_rec list_recs[3] = { c, a, b };
    const struct apir_tensor_span list = { 3, list_recs };

    /* Device queries, all of 0.1 that needs no tensor. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    fz_put_le(&w, 0, 2);
    REQ0(DEVICE_GET_DEVICE_COUNT);
    REQ0(DEVICE_GET_COUNT);
    REQ0(DEVICE_GET_NAME);
    REQ0(DEVICE_GET_DESCRIPTION);
    REQ0(DEVICE_GET_TYPE);
    REQ0(DEVICE_GET_MEMORY);
    REQ0(DEVICE_GET_BUFFER_TYPE);
    REQ0(DEVICE_GET_PROPS);
    REQ(BUFFER_TYPE_GET_NAME, (uint64_t)FZ_H_BUFT);
    REQ(BUFFER_TYPE_GET_ALIGNMENT, (uint64_t)FZ_H_BUFT);
    REQ(BUFFER_TYPE_GET_MAX_SIZE, (uint64_t)FZ_H_BUFT);
    REQ(BUFFER_TYPE_IS_HOST, (uint64_t)FZ_H_BUFT);
    REQ(BUFFER_GET_BASE, (uint64_t)FZ_H_BUF_A);
    write_writer("fuzz_dispatch", "device-queries", &w);

    /* A token's worth of work: upload, compute c = a + b, download. */
    size_t glen = graph_add(graph, sizeof(graph));
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    fz_put_le(&w, glen, 2);
    fz_put(&w, graph, glen);
    REQ(BUFFER_SET_TENSOR, (uint64_t)FZ_H_BUF_A, &a, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)64);
    REQ(BUFFER_SET_TENSOR, (uint64_t)FZ_H_BUF_A, &b, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)64);
    REQ(BACKEND_GRAPH_COMPUTE, FZ_BLOB_RES_ID, (uint64_t)glen);
    REQ(BUFFER_GET_TENSOR, (uint64_t)FZ_H_BUF_A, &c, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)64);
    REQ(BUFFER_CPY_TENSOR, (uint64_t)FZ_H_BUF_A, &a, &b);
    REQ(BUFFER_CLEAR, (uint64_t)FZ_H_BUF_A, 0u);
    write_writer("fuzz_dispatch", "set-compute-get", &w);

    /* More graphs, each on its own. */
    size_t (*const graphs[])(uint8_t *, size_t) = { graph_mul_mat, graph_view_cpy, graph_unary, graph_get_rows,
                                                    graph_set_rows };
    for (size_t i = 0; i < sizeof(graphs) / sizeof(graphs[0]); i++) {
        glen = graphs[i](graph, sizeof(graph));
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        fz_put_le(&w, glen, 2);
        fz_put(&w, graph, glen);
        /* mul_mat reads buffer B: allocate it (handle 3) first; zeros
         * make every index of get/set_rows valid. */
        REQ(BUFFER_TYPE_ALLOC_BUFFER, (uint64_t)FZ_H_BUFT, (uint64_t)FZ_BUF_B_SIZE);
        REQ(BUFFER_CLEAR, (uint64_t)FZ_H_BUF_A, 0u);
        REQ(BACKEND_GRAPH_COMPUTE, FZ_BLOB_RES_ID, (uint64_t)glen);
        REQ(BACKEND_GRAPH_COMPUTE_AT, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)glen);
        char name[32];
        snprintf(name, sizeof(name), "graph-%zu", i);
        write_writer("fuzz_dispatch", name, &w);
    }

    /* Buffers: allocate, use, free; wrap the blob; stale use after free. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    fz_put_le(&w, 0, 2);
    REQ(BUFFER_TYPE_ALLOC_BUFFER, (uint64_t)FZ_H_BUFT, (uint64_t)4096);
    REQ(BUFFER_GET_BASE, (uint64_t)3);
    REQ(DEVICE_BUFFER_FROM_PTR, FZ_BLOB_RES_ID, (uint64_t)65536, (uint64_t)65536);
    REQ(BUFFER_GET_BASE, (uint64_t)4);
    REQ(BUFFER_CLEAR, (uint64_t)4, 0x11u);
    REQ(BUFFER_FREE_BUFFER, (uint64_t)3);
    REQ(BUFFER_GET_BASE, (uint64_t)3);
    REQ(BUFFER_FREE_BUFFER, (uint64_t)4);
    REQ(BUFFER_FREE_BUFFER, (uint64_t)FZ_H_BUF_A);
    REQ(BUFFER_CLEAR, (uint64_t)FZ_H_BUF_A, 0u);
    write_writer("fuzz_dispatch", "buffers", &w);

    /* apir 0.2: tensor lists, memset, init, offsets. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    glen = graph_add(graph, sizeof(graph));
    fz_put_le(&w, glen, 2);
    fz_put(&w, graph, glen);
    REQ(DEVICE_SELECT, 0u);
    REQ(DEVICE_SUPPORTS_OP_L, list);
    REQ(DEVICE_OFFLOAD_OP_L, list);
    REQ(BUFFER_TYPE_GET_ALLOC_SIZE_L, (uint64_t)FZ_H_BUFT, list);
    REQ(BUFFER_MEMSET_TENSOR, (uint64_t)FZ_H_BUF_A, &a, 0x3fu, (uint64_t)0, (uint64_t)64);
    REQ(BUFFER_INIT_TENSOR, (uint64_t)FZ_H_BUF_A, &b);
    REQ(BUFFER_SET_TENSOR_AT, (uint64_t)FZ_H_BUF_A, &a, FZ_BLOB_RES_ID, (uint64_t)4096, (uint64_t)0, (uint64_t)64);
    REQ(BUFFER_GET_TENSOR_AT, (uint64_t)FZ_H_BUF_A, &c, FZ_BLOB_RES_ID, (uint64_t)8192, (uint64_t)16, (uint64_t)32);
    REQ0(BACKEND_SYNCHRONIZE);
    REQ(BACKEND_GRAPH_COMPUTE_AT, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)glen);
    REQ0(BACKEND_SYNCHRONIZE);
    write_writer("fuzz_dispatch", "extensions", &w);

    /* apir 0.3: a weight noted, computed with, written, noted, freed. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    glen = graph_weight(graph, sizeof(graph));
    fz_put_le(&w, glen, 2);
    fz_put(&w, graph, glen);
    {
        struct apir_tensor_rec wq = rec_q4_0_weight();
        REQ(BUFFER_TYPE_ALLOC_BUFFER, (uint64_t)FZ_H_BUFT, (uint64_t)FZ_BUF_B_SIZE);
        REQ(BUFFER_SET_TENSOR, (uint64_t)FZ_H_BUF_B, &wq, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)(18 * 8 * 16));
        REQ(BUFFER_NOTE_WEIGHT, (uint64_t)FZ_H_BUF_B, &wq);
        REQ(BACKEND_GRAPH_COMPUTE, FZ_BLOB_RES_ID, (uint64_t)glen);
        REQ(BUFFER_WRITTEN, (uint64_t)FZ_H_BUF_B, (uint64_t)18, (uint64_t)18);
        REQ(BUFFER_NOTE_WEIGHT, (uint64_t)FZ_H_BUF_B, &wq);
        REQ(BACKEND_GRAPH_COMPUTE_KEYED, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)glen, (uint64_t)7);
        REQ(BUFFER_MEMSET_TENSOR, (uint64_t)FZ_H_BUF_B, &wq, 0x3fu, (uint64_t)0, (uint64_t)64);
        REQ(BACKEND_GRAPH_RECOMPUTE, (uint64_t)7);
        REQ(BUFFER_NOTE_WEIGHT, (uint64_t)FZ_H_BUF_B, &wq);
        REQ(BUFFER_FREE_BUFFER, (uint64_t)FZ_H_BUF_B);
        REQ(BACKEND_GRAPH_RECOMPUTE, (uint64_t)7);
    }
    write_writer("fuzz_dispatch", "weights", &w);

    /* apir 0.6: a download in pieces, its progress words before and after
     * the range, then inside it (refused). */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    fz_put_le(&w, 0, 2);
    REQ(BUFFER_SET_TENSOR, (uint64_t)FZ_H_BUF_A, &a, FZ_BLOB_RES_ID, (uint64_t)0, (uint64_t)64);
    REQ(BUFFER_GET_TENSOR_CHUNKED, (uint64_t)FZ_H_BUF_A, &c, FZ_BLOB_RES_ID, (uint64_t)8192, (uint64_t)16,
        (uint64_t)32, (uint64_t)APIR_CHUNK_MIN, (uint64_t)0);
    REQ(BUFFER_GET_TENSOR_CHUNKED, (uint64_t)FZ_H_BUF_A, &a, FZ_BLOB_RES_ID, (uint64_t)4096, (uint64_t)0,
        (uint64_t)64, (uint64_t)APIR_CHUNK_MIN, (uint64_t)(4096 + 64));
    REQ(BUFFER_GET_TENSOR_CHUNKED, (uint64_t)FZ_H_BUF_A, &a, FZ_BLOB_RES_ID, (uint64_t)4096, (uint64_t)0,
        (uint64_t)64, (uint64_t)APIR_CHUNK_MIN, (uint64_t)4100);
    write_writer("fuzz_dispatch", "chunked-download", &w);

    /* 0.1 inline tensors, and a handshake back to 0.1. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    fz_put_le(&w, 0, 2);
    {
        static uint8_t ibuf[8192];
        struct fz_writer iw = { ibuf, sizeof(ibuf), 0 };
        inline_tensor(&iw, GGML_OP_ADD, 2, true, false);
        fz_put_le(&w, APIR_CMD_DEVICE_SUPPORTS_OP, 1);
        fz_put_le(&w, iw.len, 2);
        fz_put(&w, ibuf, iw.len);
        iw.len = 0;
        fz_put_le(&iw, FZ_H_BUFT, 8);
        inline_tensor(&iw, GGML_OP_NONE, 0, false, true);
        fz_put_le(&w, APIR_CMD_BUFFER_TYPE_GET_ALLOC_SIZE, 1);
        fz_put_le(&w, iw.len, 2);
        fz_put(&w, ibuf, iw.len);
    }
    apir_encoder_init(&enc, rbuf, sizeof(rbuf));
    apir_encode_u32(&enc, 0);
    apir_encode_u32(&enc, 1);
    put_cmd(&w, FZ_OP_HANDSHAKE, &enc);
    REQ(DEVICE_SELECT, 0u);  /* refused at 0.1 */
    REQ0(DEVICE_GET_NAME);
    put_cmd(&w, FZ_OP_SMALL_REPLY | APIR_CMD_DEVICE_GET_DESCRIPTION, &enc);
    write_writer("fuzz_dispatch", "inline-and-0.1", &w);
}

/* ---- fuzz_graph, fuzz_inline ----------------------------------------------------- */

static void seeds_graph(void)
{
    static uint8_t graph[8192];
    size_t (*const graphs[])(uint8_t *, size_t) = { graph_add,   graph_mul_mat,  graph_view_cpy,
                                                    graph_unary, graph_get_rows, graph_set_rows };
    for (size_t i = 0; i < sizeof(graphs) / sizeof(graphs[0]); i++) {
        size_t len = graphs[i](graph, sizeof(graph));
        char name[32];
        snprintf(name, sizeof(name), "graph-%zu", i);
        write_seed("fuzz_graph", name, graph, len);
    }
}

static void seeds_inline(void)
{
    static uint8_t buf[8192];
    static const struct { enum ggml_op op; int n_src; bool buffer, view; const char *name; } cases[] = {
        { GGML_OP_ADD, 2, true, false, "add-buffer" },
        { GGML_OP_MUL_MAT, 2, false, false, "mul-mat" },
        { GGML_OP_NONE, 0, false, false, "none" },
        { GGML_OP_VIEW, 1, true, true, "view" },
        { GGML_OP_SOFT_MAX, 1, false, false, "soft-max" },
        { GGML_OP_ROPE, 3, false, false, "rope" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fz_writer w = { buf, sizeof(buf), 0 };
        inline_tensor(&w, cases[i].op, cases[i].n_src, cases[i].buffer, cases[i].view);
        write_writer("fuzz_inline", cases[i].name, &w);
    }
}

/* ---- fuzz_shm_frame -------------------------------------------------------------- */

static void shm_hello(struct fz_writer *w, uint8_t plan)
{
    struct apir_shm_hello h = {
        .magic = APIR_SHM_MAGIC,
        .version = APIR_SHM_VERSION,
        .ctrl_size = APIR_SHM_CTRL_SIZE,
        .reply_size = APIR_REPLY_BLOB_SIZE,
        .pid = 1,
    };
    fz_put_le(w, plan, 1);
    fz_put(w, &h, sizeof(h));
}

/* A command record: the header, then the items put in by the caller. */
static struct apir_encoder *shm_begin(int32_t type, int32_t flags, uint32_t reply)
{
    static uint8_t buf[4096];
    static struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    struct apir_cmd_header hdr = { type, flags, reply };
    apir_encode_header(&enc, &hdr);
    return &enc;
}

static void shm_end(struct fz_writer *w, const struct apir_encoder *enc)
{
    fz_put_le(w, 0, 1);
    fz_put_le(w, apir_encoder_used(enc), 2);
    fz_put(w, enc->start, apir_encoder_used(enc));
}

/* A command of the transport's own (handshake, blobs: apir_proto.h) or a
 * FORWARD without items: layout 'u' puts a uint32, 'q' a uint64, of vals in
 * order. */
#define U64S(...) ((const uint64_t[]){ __VA_ARGS__ })
static void shm_cmd(struct fz_writer *w, int32_t type, int32_t flags, uint32_t reply, const char *layout,
                    const uint64_t *vals)
{
    struct apir_encoder *enc = shm_begin(type, flags, reply);
    for (size_t i = 0; layout[i]; i++) {
        if (layout[i] == 'u')
            apir_encode_u32(enc, (uint32_t)vals[i]);
        else
            apir_encode_u64(enc, vals[i]);
    }
    shm_end(w, enc);
}

static void shm_blob(struct fz_writer *w, uint8_t fd_kind_bits, uint32_t res_id, uint64_t size)
{
    fz_put_le(w, 3u | fd_kind_bits, 1);
    fz_put_le(w, 12, 2);
    fz_put_le(w, res_id, 4);
    fz_put_le(w, size, 8);
}

static void seeds_shm(void)
{
    static uint8_t sbuf[16384];
    const uint32_t R = APIR_SHM_REPLY_RES_ID;
    struct fz_writer w;

    /* A well-behaved guest: handshake, queries, a data blob, its reuse as
     * a reply blob, destroy. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    shm_hello(&w, 0x02);
    shm_cmd(&w, APIR_CMD_TYPE_HANDSHAKE, 0, R, "uu", U64S(0, 2));
    shm_cmd(&w, APIR_CMD_TYPE_LOADLIBRARY, 0, R, "", NULL);
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_NAME, R, "", NULL);
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_BUFFER_TYPE, R, "", NULL);
    shm_blob(&w, 0, APIR_SHM_FIRST_RES_ID, 65536);
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_MEMORY, APIR_SHM_FIRST_RES_ID, "", NULL);
    struct apir_encoder *enc = shm_begin(APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_BUFFER_FROM_PTR, R);
    apir_encode_request_DEVICE_BUFFER_FROM_PTR(enc, APIR_SHM_FIRST_RES_ID, 65536, 65536);
    shm_end(&w, enc);
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_DESTROY, 0, R, "u", U64S(APIR_SHM_FIRST_RES_ID));
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, 99, R, "", NULL);
    write_writer("fuzz_shm_frame", "session", &w);

    /* Blob creation variants: lying size, unsealed, short, pipe, wrong tag,
     * an fd message ahead of a raw SHM_BLOB_CREATE. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    shm_hello(&w, 0x02);
    shm_blob(&w, 0, 4, 4096);
    shm_blob(&w, 1 << 2, 5, 4096);
    shm_blob(&w, 2 << 2, 6, 8192);
    shm_blob(&w, 3 << 2, 7, 4096);
    fz_put_le(&w, 2, 1);      /* a good fd message of 64 bytes... */
    fz_put_le(&w, 0, 2);
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, R, "uq", U64S(9, 64));  /* ...consumed here */
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, R, "uq", U64S(10, 1ull << 40));
    shm_blob(&w, 0x10, 8, 4096);  /* a wrong tag: the host hangs up, so last */
    write_writer("fuzz_shm_frame", "blobs", &w);

    /* apir 0.3 file blobs: with an fd message ahead, without one, and lying
     * ranges; this server runs its guests in threads and refuses them all. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    shm_hello(&w, 0x02);
    shm_cmd(&w, APIR_CMD_TYPE_HANDSHAKE, 0, R, "uu", U64S(0, 3));
    fz_put_le(&w, 2, 1);
    fz_put_le(&w, 0, 2);
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_FILE, 0, R, "uqqq", U64S(11, 0, 64, 0));
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_FILE, 0, R, "uqqq", U64S(12, 4096, 1ull << 40, 64));
    shm_cmd(&w, APIR_CMD_TYPE_SHM_BLOB_FILE, 0, R, "uq", U64S(13, 1));
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_NAME, R, "", NULL);
    write_writer("fuzz_shm_frame", "file-blobs", &w);

    /* Framing: a lying cmd_len, a short header, an unknown reply blob. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    shm_hello(&w, 0x02);
    shm_cmd(&w, APIR_CMD_TYPE_HANDSHAKE, 0, R, "uu", U64S(0, 1));
    fz_put_le(&w, 1, 1);
    fz_put_le(&w, 12, 2);
    fz_put_le(&w, APIR_CMD_TYPE_FORWARD, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, R, 4);
    fz_put_le(&w, 4000, 4);   /* cmd_len says 4000 */
    shm_cmd(&w, APIR_CMD_TYPE_FORWARD, 0, 77, "", NULL);
    write_writer("fuzz_shm_frame", "framing", &w);

    /* Hellos the host must refuse. */
    static const uint8_t bad_plans[] = { 0x00, 0x01, 0x03, 0x06, 0x0a, 0x0e, 0x12, 0x22, 0x32, 0x42 };
    for (size_t i = 0; i < sizeof(bad_plans); i++) {
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        shm_hello(&w, bad_plans[i]);
        shm_cmd(&w, APIR_CMD_TYPE_HANDSHAKE, 0, R, "uu", U64S(0, 2));
        char name[32];
        snprintf(name, sizeof(name), "hello-%02x", bad_plans[i]);
        write_writer("fuzz_shm_frame", name, &w);
    }
}

/* ---- fuzz_stream_frame ------------------------------------------------------------ */

/* plan: fuzz_format.h; valid hello fields (the harness puts the token). */
static void st_hello(struct fz_writer *w, uint8_t plan)
{
    fz_put_le(w, plan, 1);
    fz_put_le(w, 1, 2);  /* pid */
}

/* A frame's start: K, nseg (n_in | n_out << 3). */
static void st_begin(struct fz_writer *w, uint8_t k, unsigned n_in, unsigned n_out)
{
    fz_put_le(w, k, 1);
    fz_put_le(w, n_in | n_out << 3, 1);
}

/* A segment into blob FIRST_RES_ID + idx. */
static void st_seg(struct fz_writer *w, uint8_t sel, uint16_t off, uint16_t size)
{
    fz_put_le(w, sel, 1);
    fz_put_le(w, off, 2);
    fz_put_le(w, size, 2);
}

/* FORWARD cmd with the encoder's items, then n prefix bytes of the upload. */
static void st_forward(struct fz_writer *w, uint32_t cmd, const struct apir_encoder *items, uint8_t n_fill)
{
    fz_put_le(w, 0, 1);
    fz_put_le(w, cmd, 1);
    size_t len = items ? apir_encoder_used(items) : 0;
    fz_put_le(w, len, 2);
    if (len)
        fz_put(w, items->start, len);
    fz_put_le(w, n_fill, 1);
    for (unsigned i = 0; i < n_fill; i++)
        fz_put_le(w, 0x40 + i, 1);
}

static void st_handshake(struct fz_writer *w, uint8_t minor)
{
    fz_put_le(w, 7, 1);
    fz_put_le(w, minor, 1);
}

static void st_create(struct fz_writer *w, uint8_t id, uint32_t size)
{
    fz_put_le(w, 4, 1);
    fz_put_le(w, id, 1);
    fz_put_le(w, size, 4);
}

static void st_echo(struct fz_writer *w, uint8_t id, uint16_t off, uint16_t size, uint8_t n_fill)
{
    fz_put_le(w, 6, 1);
    fz_put_le(w, id, 1);
    fz_put_le(w, off, 2);
    fz_put_le(w, size, 2);
    fz_put_le(w, n_fill, 1);
    for (unsigned i = 0; i < n_fill; i++)
        fz_put_le(w, 0x80 + i, 1);
}

/* A guest that sets up a buffer and a blob (handles: buffer type 1, buffer 2). */
static void st_setup(struct fz_writer *w)
{
    static uint8_t ibuf[256];
    struct apir_encoder enc;
    st_handshake(w, APIR_VERSION_MINOR);
    st_begin(w, 0, 0, 0);
    st_forward(w, APIR_CMD_DEVICE_GET_BUFFER_TYPE, NULL, 0);
    st_begin(w, 0, 0, 0);
    apir_encoder_init(&enc, ibuf, sizeof(ibuf));
    apir_encode_request_BUFFER_TYPE_ALLOC_BUFFER(&enc, (uint64_t)FZ_H_BUFT, (uint64_t)FZ_BUF_A_SIZE);
    st_forward(w, APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER, &enc, 0);
    st_create(w, 0, 65536);
}

static void seeds_stream(void)
{
    static uint8_t sbuf[16384], ibuf[1024];
    struct fz_writer w;
    struct apir_encoder enc;
    struct apir_tensor_rec a = rec_f32(1, 16, 1, FZ_H_BUF_A, 0, GGML_OP_NONE);

    /* A well-behaved guest: set and get through the blob, echo, queries,
     * destroy, handshake again; on both servers. */
    for (int srv = 0; srv < 2; srv++) {
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        st_hello(&w, (uint8_t)srv);
        st_setup(&w);
        st_begin(&w, 0, 1, 0);
        st_seg(&w, 0, 0, 64);
        apir_encoder_init(&enc, ibuf, sizeof(ibuf));
        apir_encode_request_BUFFER_SET_TENSOR(&enc, (uint64_t)FZ_H_BUF_A, &a, APIR_STREAM_FIRST_RES_ID, (uint64_t)0,
                                              (uint64_t)64);
        st_forward(&w, APIR_CMD_BUFFER_SET_TENSOR, &enc, 16);
        st_begin(&w, 0, 0, 1);
        st_seg(&w, 0, 8192, 32);
        apir_encoder_init(&enc, ibuf, sizeof(ibuf));
        apir_encode_request_BUFFER_GET_TENSOR_AT(&enc, (uint64_t)FZ_H_BUF_A, &a, APIR_STREAM_FIRST_RES_ID,
                                                 (uint64_t)8192, (uint64_t)16, (uint64_t)32);
        st_forward(&w, APIR_CMD_BUFFER_GET_TENSOR_AT, &enc, 0);
        st_echo(&w, 0, 100, 300, 8);
        st_begin(&w, 0, 0, 0);
        st_forward(&w, APIR_CMD_DEVICE_GET_NAME, NULL, 0);
        st_begin(&w, 0, 0, 0);
        st_forward(&w, APIR_CMD_HOST_GET_VERSION, NULL, 0);
        fz_put_le(&w, 5, 1);  /* destroy blob 3 */
        fz_put_le(&w, 0, 1);
        st_handshake(&w, 1);
        write_writer("fuzz_stream_frame", srv ? "session-token" : "session", &w);
    }

    /* Pipelined uploads, then their replies. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_setup(&w);
    st_create(&w, 1, 4096);
    for (int i = 0; i < 3; i++) {
        st_begin(&w, 0x10, 2, 0);
        st_seg(&w, 0, (uint16_t)(i * 64), 64);
        st_seg(&w, 1, 0, 16);
        apir_encoder_init(&enc, ibuf, sizeof(ibuf));
        apir_encode_request_BUFFER_SET_TENSOR(&enc, (uint64_t)FZ_H_BUF_A, &a, APIR_STREAM_FIRST_RES_ID,
                                              (uint64_t)0, (uint64_t)64);
        st_forward(&w, APIR_CMD_BUFFER_SET_TENSOR, &enc, 4);
    }
    st_begin(&w, 0, 0, 2);
    st_seg(&w, 0, 0, 64);
    st_seg(&w, 0x41, 16, 16);  /* the last 16 bytes of blob 4 */
    st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 0);
    write_writer("fuzz_stream_frame", "pipelined", &w);

    /* Frames the host must hang up on, or cut short, one per seed. */
    static const struct {
        const char *name;
        uint8_t k, lie;
        uint32_t value;
    } bad[] = {
        { "bad-magic", 0x08, 1, 0x12345678 },
        { "bad-reserved", 0x08, 2, 1 },
        { "cmd-len-long", 0x08, 4, 65537 },
        { "cmd-len-lies", 0x08, 4, 40 },
        { "segments-lie", 0x08, 8, 9 },
        { "cut", 0x40, 0, 30 },
        { "garbage-after", 0x20, 0, 16 },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        st_hello(&w, 0);
        st_setup(&w);
        fz_put_le(&w, bad[i].k, 1);
        if (bad[i].lie)
            fz_put_le(&w, bad[i].lie, 1);
        fz_put_le(&w, 1 | 1 << 3, 1);
        st_seg(&w, 0, 0, 128);
        st_seg(&w, 0, 64, 64);
        st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 4);
        if (bad[i].lie == 8) {
            fz_put_le(&w, bad[i].value, 2);
            fz_put_le(&w, 0, 2);
        } else if (bad[i].lie) {
            fz_put_le(&w, bad[i].value, 4);
        } else if (bad[i].k == 0x20) {
            fz_put_le(&w, bad[i].value, 1);
            for (uint32_t b = 0; b <= bad[i].value; b++)
                fz_put_le(&w, b, 1);
        } else {
            fz_put_le(&w, bad[i].value, 2);
        }
        write_writer("fuzz_stream_frame", bad[i].name, &w);
    }

    /* Ranges outside the blob, segments into unknown blobs, too many. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_setup(&w);
    st_begin(&w, 0, 1, 0);
    st_seg(&w, 0x40, 16, 32);  /* 16 bytes before the end, 32 long */
    st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 0);
    write_writer("fuzz_stream_frame", "out-of-blob", &w);
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_setup(&w);
    st_begin(&w, 0, 0, 1);
    st_seg(&w, 6, 0, 8);  /* the reply id: not a blob here */
    st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 0);
    write_writer("fuzz_stream_frame", "reply-id-range", &w);
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_setup(&w);
    st_begin(&w, 0, 5, 5);
    for (int i = 0; i < 10; i++)
        st_seg(&w, 0, 0, 8);
    st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 0);
    write_writer("fuzz_stream_frame", "too-many-segments", &w);

    /* A command that destroys the blob its own download reads. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_setup(&w);
    st_begin(&w, 0, 0, 1);
    st_seg(&w, 0, 0, 64);
    fz_put_le(&w, 1 | 3 << 2, 1);   /* BLOB_DESTROY 3 */
    fz_put_le(&w, 4, 2);
    fz_put_le(&w, APIR_STREAM_FIRST_RES_ID, 4);
    fz_put_le(&w, 0, 1);
    write_writer("fuzz_stream_frame", "destroy-download", &w);

    /* A 16 MiB blob: a download the harness stops reading, an upload it
     * stops sending (both past its caps). */
    for (int up = 0; up < 2; up++) {
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        st_hello(&w, 0);
        st_handshake(&w, APIR_VERSION_MINOR);
        st_create(&w, 0, 16u << 20);
        st_begin(&w, 0, up ? 1 : 0, up ? 0 : 1);
        st_seg(&w, 0x10, 0, 0);  /* the whole blob */
        st_forward(&w, APIR_CMD_DEVICE_GET_COUNT, NULL, 0);
        write_writer("fuzz_stream_frame", up ? "big-upload" : "big-download", &w);
    }

    /* Blob commands with odd ids and sizes, the transport's other types. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    st_handshake(&w, APIR_VERSION_MINOR);
    st_create(&w, 0x80 | 2, 4096);   /* the reply id */
    st_create(&w, 0x80 | 0, 4096);
    st_create(&w, 0, 0);
    fz_put_le(&w, 4 | 0x80, 1);      /* 4 GiB << 16: past the quota */
    fz_put_le(&w, 1, 1);
    fz_put_le(&w, 0xffffffffu, 4);
    st_create(&w, 2, 1u << 20);
    st_create(&w, 2, 4096);          /* twice */
    fz_put_le(&w, 5, 1);
    fz_put_le(&w, 7, 1);             /* never created */
    st_begin(&w, 0, 0, 0);           /* LOADLIBRARY, BLOB_FILE, unknown types */
    fz_put_le(&w, 1 | 1 << 2, 1);
    fz_put_le(&w, 0, 2);
    fz_put_le(&w, 0, 1);
    st_begin(&w, 0, 0, 0);
    fz_put_le(&w, 1 | 4 << 2, 1);
    fz_put_le(&w, 12, 2);
    fz_put_le(&w, 5, 4);
    fz_put_le(&w, 4096, 8);
    fz_put_le(&w, 0, 1);
    st_begin(&w, 0, 0, 0);
    fz_put_le(&w, 1 | 6 << 2, 1);
    fz_put_le(&w, 0, 2);
    fz_put_le(&w, 0, 1);
    st_begin(&w, 0, 0, 0);
    st_forward(&w, 99, NULL, 0);
    write_writer("fuzz_stream_frame", "blob-commands", &w);

    /* Raw bytes after the hello. */
    w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
    st_hello(&w, 0);
    fz_put_le(&w, 3, 1);
    fz_put_le(&w, 16 + 20, 2);
    fz_put_le(&w, APIR_STREAM_FRAME_MAGIC, 4);
    fz_put_le(&w, 20, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, APIR_CMD_TYPE_HANDSHAKE, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, 0, 4);
    fz_put_le(&w, 2, 4);
    write_writer("fuzz_stream_frame", "raw", &w);

    /* Hellos: wrong, missing and near-miss tokens, raw, split, cut, bad
     * magic or version, a frame sent before the hello's answer. */
    static const uint8_t plans[] = { 0x01 | 2 << 3, 0x01 | 1 << 3, 0x01 | 3 << 3, 0x04, 0x20, 0x21, 0x06 | 0x20,
                                     0x02, 0x03, 0x40, 0x41 | 1 << 3 };
    for (size_t i = 0; i < sizeof(plans); i++) {
        w = (struct fz_writer){ sbuf, sizeof(sbuf), 0 };
        uint8_t plan = plans[i];
        unsigned mode = (plan >> 1) & 3, tok = (plan >> 3) & 3;
        fz_put_le(&w, plan, 1);
        if (mode == 2) {
            struct apir_stream_hello h = { .magic = APIR_STREAM_MAGIC, .version = APIR_STREAM_VERSION, .pid = 1 };
            fz_put(&w, &h, sizeof(h));
        } else {
            fz_put_le(&w, 1, 2);
            if (mode == 1) {
                fz_put_le(&w, APIR_STREAM_MAGIC, 4);
                fz_put_le(&w, 2, 4);
            }
            if (tok == 2) {
                fz_put_le(&w, sizeof(FZ_STREAM_TOKEN) - 2, 1);
                fz_put(&w, FZ_STREAM_TOKEN, sizeof(FZ_STREAM_TOKEN) - 1);
                for (size_t b = sizeof(FZ_STREAM_TOKEN) - 1; b < APIR_STREAM_TOKEN_MAX; b++)
                    fz_put_le(&w, 0, 1);
            } else if (tok == 3) {
                fz_put_le(&w, 5, 1);
                fz_put_le(&w, 1, 1);
            }
        }
        if (plan & 0x20)
            fz_put_le(&w, 41, 1);
        st_handshake(&w, APIR_VERSION_MINOR);
        char name[32];
        snprintf(name, sizeof(name), "hello-%02x", plan);
        write_writer("fuzz_stream_frame", name, &w);
    }
}

/*
 * fuzz_op: per op, inputs that build it with its constructor (mode byte
 * 0x11: constructed, no mutation) over a few shared shapes, and one raw
 * node.  The bytes after the dims steer leaves and arguments; zeros are
 * the plainest choices (contiguous F32 leaves of the shared shape).
 */
static void seeds_op(void)
{
    static const uint8_t dims[4][4] = { { 2, 2, 0, 0 }, { 4, 3, 1, 0 }, { 6, 4, 2, 1 }, { 5, 1, 3, 0 } };
    for (unsigned op = 0; op < GGML_OP_COUNT; op++)
        for (unsigned d = 0; d < 5; d++) {
            uint8_t in[24] = { (uint8_t)op, d < 4 ? 0x11 : 0x10 };
            memcpy(in + 2, dims[d % 4], 4);
            char name[32];
            snprintf(name, sizeof(name), "op%02u-%u", op, d);
            write_seed("fuzz_op", name, in, sizeof(in));
        }
}

/* ---- fuzz_text: request heads of the metrics listener, strings to escape ---------- */

static void seeds_text(void)
{
    static const char *const seeds[][2] = {
        { "get", "\x00GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAccept: */*\r\n\r\n" },
        { "head", "\x00HEAD /metrics?name[]=x HTTP/1.0\n\n" },
        { "post", "\x00POST /metrics HTTP/1.1\r\n\r\n" },
        { "partial", "\x00GET /metr" },
        { "name", "\x01guest\nguest#99 connected \"key\" \\ \x1b[31m\x7f\xff" },
        { "line", "\x02" "apir host: info: already escaped \\x0a \"q\"\t\r" },
    };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
        write_seed("fuzz_text", seeds[i][0], (const uint8_t *)seeds[i][1], 1 + strlen(seeds[i][1] + 1));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        perror(out_dir);
        return 1;
    }
    seeds_codec();
    seeds_dispatch();
    seeds_graph();
    seeds_inline();
    seeds_shm();
    seeds_stream();
    seeds_op();
    seeds_text();
    printf("make_seeds: %u seeds in %s\n", n_written, out_dir);
    return 0;
}
