/*
 * Host-side helpers for the fuzz targets that drive a real session: one
 * process-wide struct apir_host on the CPU backend with lowered limits,
 * sessions with known handles, the handle rewrite of fuzz_format.h, and the
 * oracles the targets check after the host said yes.
 *
 * Everything here is static inline: each target is one translation unit and
 * uses a different subset.
 */
#ifndef APIR_FUZZ_HOST_H
#define APIR_FUZZ_HOST_H

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_log.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "fuzz_common.h"
#include "fuzz_format.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "graph_exec.h"
#include "host.h"
#include "dispatcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static struct apir_host fz_host;

/*
 * The fuzz targets' getrandom (it takes the place of libc's and the
 * sanitizer's for the whole process): a fixed stream.  The host salts its
 * handles with it (host/core/handles.c); with random salts the paths an unknown
 * handle takes through the lookup, and so libFuzzer's coverage, would
 * differ from run to run, and a fixed seed and run count (fuzz/run.sh
 * --gate) would not give the same run on every machine.  Inputs name
 * handles by number (fuzz_format.h), so nothing else depends on them.
 */
ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    (void)flags;
    static uint64_t x = 0x9e3779b97f4a7c15ull;
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
    return (ssize_t)len;
}

static inline void fz_ggml_log_quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    /* a device's errors (CUDA's "CUDA error: ..." before its abort) name a finding */
    if (level == GGML_LOG_LEVEL_ERROR && (getenv("FUZZ_VERBOSE") || getenv("FUZZ_BACKEND")))
        fputs(text, stderr);
}

/* The backend the targets' host runs: FUZZ_BACKEND (fuzz_op's device path,
 * e.g. CUDA), else the CPU. */
static inline const char *fz_backend_name(void)
{
    const char *b = getenv("FUZZ_BACKEND");
    return b && *b ? b : "CPU";
}

/*
 * The CPU backend (or fz_backend_name's), one thread, limits low enough that one input cannot make
 * the host allocate or loop for long: buffers total at most 64 MiB, graphs
 * at most 4096 nodes and 16384 tensors.  Logging off unless FUZZ_VERBOSE:
 * every refusal logs a line, and the fuzzer makes millions of them.
 */
static inline void fz_host_init(void)
{
    if (getenv("FUZZ_VERBOSE")) {
        apir_log_set_level(APIR_LOG_DEBUG);
    } else {
        apir_log_set_level(APIR_LOG_ERROR);
        ggml_log_set(fz_ggml_log_quiet, NULL);
    }
    struct apir_host_config cfg = {
        .backend_name = fz_backend_name(),
        .device = -1,
        .n_threads = 1,
        .backend_dir = APIR_GGML_BIN,
        .import_memo = true,
    };
    apir_limits_default(&cfg.limits);
    cfg.limits.max_buffers = 32;
    cfg.limits.max_alloc_bytes = 64ull << 20;
    cfg.limits.max_graph_nodes = 4096;
    cfg.limits.max_graph_tensors = 16384;
    cfg.limits.max_blobs = 16;
    cfg.limits.max_blob_bytes = 256ull << 20;
    cfg.limits.max_clients = 4096;
    cfg.limits.spawn_per_s = 0;          /* a connection per input: no pacing */
    cfg.limits.connect_per_s = 0;
    cfg.limits.max_clients_per_tenant = 0;
    char err[256];
    if (!apir_host_init(&fz_host, &cfg, err, sizeof(err))) {
        fprintf(stderr, "fuzz: host init failed: %s\n", err);
        abort();
    }
}

/* The LLVMFuzzerInitialize of a target whose only setup is the host. */
#define FZ_INITIALIZE_HOST_ONLY()                                  \
    int LLVMFuzzerInitialize(int *argc, char ***argv)              \
    {                                                              \
        (void)argc;                                                \
        (void)argv;                                                \
        fz_host_init();                                            \
        return 0;                                                  \
    }

/* The handles a session's inputs can name by number (fuzz_format.h). */
struct fz_known {
    uint64_t h[FZ_MAX_KNOWN];
    uint32_t n;
};

static inline void fz_known_add(struct fz_known *k, uint64_t h)
{
    if (!h || k->n >= FZ_MAX_KNOWN)
        return;
    for (uint32_t i = 0; i < k->n; i++)
        if (k->h[i] == h)
            return;
    k->h[k->n++] = h;
}

static inline uint64_t fz_map_handle(const struct fz_known *k, uint64_t v)
{
    return v >= 1 && v <= k->n ? k->h[v - 1] : v;
}

/* Rewrites the uint64 at p (unaligned) if it is a handle number. */
static inline void fz_patch_u64(uint8_t *p, const struct fz_known *k)
{
    uint64_t v;
    memcpy(&v, p, 8);
    v = fz_map_handle(k, v);
    memcpy(p, &v, 8);
}

/*
 * Known finding 1 (fuzz/findings, see the fuzzing report): a tensor whose op
 * lacks sources the op needs is accepted, and ggml then dereferences the
 * missing source (CPU supports_op, ggml_graph_plan): the host crashes.
 * With FUZZ_SKIP_KNOWN set in the environment, the harnesses skip what
 * would hit it, so that a run can look past it; by default nothing is
 * skipped.  The counts below are lower bounds taken from ggml's op
 * constructors; an op not listed needs src[0].
 */
static int fz_skip_known = -1;

static inline bool fz_skipping_known(void)
{
    if (fz_skip_known < 0)
        fz_skip_known = getenv("FUZZ_SKIP_KNOWN") != NULL;
    return fz_skip_known != 0;
}

static inline int fz_min_srcs(uint32_t op)
{
    switch (op) {
    case GGML_OP_NONE: case GGML_OP_RESHAPE: case GGML_OP_VIEW: case GGML_OP_PERMUTE: case GGML_OP_TRANSPOSE:
    case GGML_OP_ARANGE:
        return 0;
    case GGML_OP_ADD: case GGML_OP_ADD1: case GGML_OP_ACC: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
    case GGML_OP_COUNT_EQUAL: case GGML_OP_CONCAT: case GGML_OP_SILU_BACK: case GGML_OP_RMS_NORM_BACK:
    case GGML_OP_MUL_MAT: case GGML_OP_OUT_PROD: case GGML_OP_SET: case GGML_OP_CPY: case GGML_OP_GET_ROWS:
    case GGML_OP_GET_ROWS_BACK: case GGML_OP_SET_ROWS: case GGML_OP_SOFT_MAX_BACK: case GGML_OP_ROPE:
    case GGML_OP_ROPE_BACK: case GGML_OP_CONV_TRANSPOSE_1D: case GGML_OP_IM2COL: case GGML_OP_IM2COL_BACK:
    case GGML_OP_IM2COL_3D: case GGML_OP_COL2IM_1D: case GGML_OP_CONV_2D: case GGML_OP_CONV_3D:
    case GGML_OP_CONV_2D_DW: case GGML_OP_CONV_TRANSPOSE_2D: case GGML_OP_POOL_2D_BACK: case GGML_OP_SSM_CONV:
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_SOLVE_TRI:
        return 2;
    case GGML_OP_ADD_ID: case GGML_OP_MUL_MAT_ID: case GGML_OP_FLASH_ATTN_EXT: case GGML_OP_ADD_REL_POS:
    case GGML_OP_CROSS_ENTROPY_LOSS_BACK: case GGML_OP_OPT_STEP_SGD:
        return 3;
    case GGML_OP_FLASH_ATTN_BACK:
        return 4;
    case GGML_OP_GATED_LINEAR_ATTN: case GGML_OP_OPT_STEP_ADAMW:
        return 5;
    case GGML_OP_RWKV_WKV6:
        return 6;
    case GGML_OP_SSM_SCAN: case GGML_OP_RWKV_WKV7:
        return 7;
    default:
        return 1;
    }
}

/* present[i]: whether src i is set. */
static inline bool fz_hits_known(uint32_t op, const bool *present)
{
    if (op >= GGML_OP_COUNT)
        return false;
    int need = fz_min_srcs(op);
    for (int i = 0; i < need && i < GGML_MAX_SRC; i++)
        if (!present[i])
            return true;
    return false;
}

/* Known finding 3: import.c computes view_src->data + view_offs as a
 * pointer before comparing, so a huge view_offs overflows it (UBSan). */
static inline bool fz_record_hits_known(const uint8_t *rec)
{
    uint32_t op;
    uint64_t src[APIR_TENSOR_MAX_SRC], view_src, view_offs;
    bool present[APIR_TENSOR_MAX_SRC];
    memcpy(&view_src, rec + offsetof(struct apir_tensor_rec, view_src), 8);
    memcpy(&view_offs, rec + offsetof(struct apir_tensor_rec, view_offs), 8);
    if (view_src && view_offs >= (1ull << 47))
        return true;
    memcpy(&op, rec + offsetof(struct apir_tensor_rec, op), 4);
    memcpy(src, rec + offsetof(struct apir_tensor_rec, src), sizeof(src));
    for (int i = 0; i < APIR_TENSOR_MAX_SRC; i++)
        present[i] = src[i] != 0;
    return fz_hits_known(op, present);
}

/* Rewrites a record's buffer handle number; notes a known-finding hit. */
static inline void fz_patch_record(uint8_t *rec, const struct fz_known *k, bool *known_hit)
{
    fz_patch_u64(rec + offsetof(struct apir_tensor_rec, buffer), k);
    if (known_hit && fz_record_hits_known(rec))
        *known_hit = true;
}

/* The handle that follows an inline tensor whose raw `buffer` is set.  The
 * host reads srcs up to the first NULL, so those are the op's sources. */
static inline void fz_patch_inline(uint8_t *p, size_t len, const struct fz_known *k, bool *known_hit)
{
    if (len < sizeof(struct ggml_tensor))
        return;
    struct ggml_tensor raw;
    memcpy(&raw, p, sizeof(raw));
    if (known_hit) {
        bool present[GGML_MAX_SRC];
        bool before = true;
        for (int i = 0; i < GGML_MAX_SRC; i++)
            present[i] = before = before && raw.src[i] != NULL;
        if (fz_hits_known((uint32_t)raw.op, present))
            *known_hit = true;
    }
    if (raw.buffer && len >= sizeof(struct ggml_tensor) + 8)
        fz_patch_u64(p + sizeof(struct ggml_tensor), k);
}

/* Walks a request by its signature and rewrites handle numbers in place.
 * Stops where the bytes end; the host decodes the result independently. */
static inline void fz_patch_request(uint8_t *req, size_t len, const char *sig, const struct fz_known *k,
                                    bool *known_hit)
{
    size_t off = 0;
    for (const char *c = sig; *c && off <= len; c++) {
        switch (*c) {
        case 'u': case 'i': case 'e': case 'r': case 'b': case 'c':
            off += 4;
            break;
        case 'q':
            off += 8;
            break;
        case 'd':
            off += APIR_DIGEST_SIZE;
            break;
        case 'h':
            if (len - off >= 8)
                fz_patch_u64(req + off, k);
            off += 8;
            break;
        case 's': {
            uint64_t n = 0;
            if (len - off < 8)
                return;
            memcpy(&n, req + off, 8);
            if (n > len)
                return;
            off += 8 + (size_t)((n + 3) & ~3ull);
            break;
        }
        case 't':
            if (len - off >= APIR_TENSOR_REC_SIZE)
                fz_patch_record(req + off, k, NULL);  /* data commands: no op runs */
            off += APIR_TENSOR_REC_SIZE;
            break;
        case 'L': {
            uint32_t n = 0;
            if (len - off < 4)
                return;
            memcpy(&n, req + off, 4);
            off += 4;
            for (uint32_t i = 0; i < n && off <= len && len - off >= APIR_TENSOR_REC_SIZE; i++) {
                fz_patch_record(req + off, k, i == 0 ? known_hit : NULL);  /* the subject */
                off += APIR_TENSOR_REC_SIZE;
            }
            break;
        }
        case 'T':
            fz_patch_inline(req + off, len - off, k, known_hit);
            return;  /* variable length: always last */
        default:
            return;
        }
    }
}

/* Rewrites the buffer fields of a graph blob's records. */
static inline void fz_patch_graph(uint8_t *g, size_t len, const struct fz_known *k, bool *known_hit)
{
    uint32_t n_nodes, n_tensors;
    if (len < 4)
        return;
    memcpy(&n_nodes, g, 4);
    if ((uint64_t)n_nodes * 8 > len - 4 || len - 4 - (size_t)n_nodes * 8 < 4)
        return;
    size_t off = 4 + (size_t)n_nodes * 8;
    memcpy(&n_tensors, g + off, 4);
    off += 4;
    for (uint32_t i = 0; i < n_tensors && len - off >= APIR_TENSOR_REC_SIZE; i++) {
        fz_patch_record(g + off, k, known_hit);
        off += APIR_TENSOR_REC_SIZE;
    }
}

/* Runs one command with a request built here (setup, not fuzzed input). */
static inline uint32_t fz_forward(struct apir_session *s, uint32_t cmd, const void *req, size_t req_len, void *reply,
                                  size_t reply_len, size_t *reply_used)
{
    struct apir_decoder dec;
    struct apir_encoder enc;
    apir_decoder_init(&dec, req, req_len);
    apir_encoder_init(&enc, reply, reply_len);
    uint32_t r = apir_session_forward(s, cmd, &dec, &enc);
    if (reply_used)
        *reply_used = apir_encoder_used(&enc);
    return r;
}

/* A session that speaks 0.2 (so every command is reachable), with its
 * buffer type as known handle 1. */
static inline struct apir_session *fz_session_new(struct fz_known *k)
{
    struct apir_session *s = apir_session_new(&fz_host, "fuzz");
    if (!s)
        abort();
    uint8_t req[8], rep[8];
    struct apir_encoder enc;
    apir_encoder_init(&enc, req, sizeof(req));
    apir_encode_u32(&enc, APIR_VERSION_MAJOR);
    apir_encode_u32(&enc, APIR_VERSION_MINOR);
    struct apir_decoder dec;
    apir_decoder_init(&dec, req, sizeof(req));
    apir_encoder_init(&enc, rep, sizeof(rep));
    if (apir_session_handshake(s, &dec, &enc) != APIR_HANDSHAKE_MAGIC)
        abort();
    k->n = 0;
    fz_known_add(k, s->buft_handles[0]);
    return s;
}

/* BUFFER_TYPE_ALLOC_BUFFER through the dispatcher; the handle becomes the
 * next known handle. */
static inline uint64_t fz_alloc_buffer(struct apir_session *s, uint64_t size, struct fz_known *k)
{
    uint8_t req[16], rep[8];
    struct apir_encoder enc;
    apir_encoder_init(&enc, req, sizeof(req));
    apir_encode_request_BUFFER_TYPE_ALLOC_BUFFER(&enc, s->buft_handles[0], size);
    size_t used = 0;
    if (fz_forward(s, APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER, req, apir_encoder_used(&enc), rep, sizeof(rep), &used) !=
        APIR_HANDLER_OK)
        abort();
    uint64_t h = 0;
    struct apir_decoder dec;
    apir_decoder_init(&dec, rep, used);
    if (!apir_decode_reply_BUFFER_TYPE_ALLOC_BUFFER(&dec, &h) || apir_decoder_left(&dec) != 0 || !h)
        abort();
    fz_known_add(k, h);
    return h;
}

/* The session buffer a ggml buffer belongs to, or NULL. */
static inline const struct apir_host_buffer *fz_find_buffer(const struct apir_session *s, ggml_backend_buffer_t b)
{
    for (uint32_t i = 0; i < s->handles.capacity; i++) {
        const struct apir_handle_slot *slot = &s->handles.slots[i];
        if (slot->kind == APIR_HANDLE_BUFFER && ((const struct apir_host_buffer *)slot->object)->buffer == b)
            return slot->object;
    }
    return NULL;
}

/*
 * Oracle: a tensor the host accepted either has no buffer, or lies wholly
 * inside a live buffer of this session (ggml_nbytes is what the backends
 * will touch).  need_buffer: graph tensors must have one.
 */
static inline void fz_check_tensor(const struct apir_session *s, const struct ggml_tensor *t, int need_buffer)
{
    if (!t)
        return;
    if (!t->buffer) {
        FZ_ASSERT(!need_buffer, "tensor '%s' without a buffer was accepted", t->name);
        FZ_ASSERT(t->data == NULL, "tensor '%s' has data but no buffer", t->name);
        return;
    }
    const struct apir_host_buffer *hb = fz_find_buffer(s, t->buffer);
    FZ_ASSERT(hb != NULL, "tensor '%s' names a buffer this session does not own", t->name);
    size_t nbytes = ggml_nbytes(t);
    const uint8_t *d = t->data;
    if (nbytes == 0)
        return;
    FZ_ASSERT(d >= hb->base && (uint64_t)(d - hb->base) <= hb->size && nbytes <= hb->size - (uint64_t)(d - hb->base),
              "tensor '%s' [%p, +%zu) outside its buffer [%p, +%llu)", t->name, (const void *)d, nbytes,
              (const void *)hb->base, (unsigned long long)hb->size);
}

/* Oracle over an accepted graph: every node and every tensor it reads. */
static inline void fz_check_graph(const struct apir_session *s, struct ggml_cgraph *g)
{
    int n = ggml_graph_n_nodes(g);
    FZ_ASSERT(n >= 2 && ggml_graph_node(g, 0) == apir_graph_anchor(s),
              "graph does not start with the session's anchor");
    for (int i = 1; i < n; i++) {  /* the anchor has no memory, and no op */
        const struct ggml_tensor *t = ggml_graph_node(g, i);
        fz_check_tensor(s, t, 1);
        for (int k = 0; k < GGML_MAX_SRC; k++)
            fz_check_tensor(s, t->src[k], 1);
        fz_check_tensor(s, t->view_src, 1);
    }
}

/*
 * Oracle: an OK reply is exactly what its typed decoder
 * (apir_decode_reply_<NAME>, the guest's) reads, nothing left over; its
 * handles (buffer and buffer type items) then become known handles.
 */
#define fz_seen_u32(k, p, v)
#define fz_seen_i32(k, p, v)
#define fz_seen_enum(k, p, v)
#define fz_seen_res(k, p, v)
#define fz_seen_bool(k, p, v)
#define fz_seen_u8(k, p, v)
#define fz_seen_u64(k, p, v)
#define fz_seen_buffer(k, p, v) fz_known_add(k, *(v))
#define fz_seen_buft(k, p, v) fz_known_add(k, *(v))
#define fz_seen_string(k, p, v)
#define fz_seen_tensor(k, p, v)
#define fz_seen_tensors(k, p, v)
#define fz_seen_digest(k, p, v)
FZ_DEFINE_TYPED_DECODE_REPLY(fz_decode_reply, struct fz_known)

static inline void fz_check_reply(uint32_t cmd, const uint8_t *rep, size_t used, struct fz_known *k)
{
    struct apir_decoder dec;
    apir_decoder_init(&dec, rep, used);
    struct fz_known handles = { .n = 0 };
    bool ok = fz_decode_reply(&handles, cmd, &dec) && apir_decoder_left(&dec) == 0;
    FZ_ASSERT(ok, "%s: OK reply of %zu bytes does not match '%s'", apir_command_name(cmd), used,
              cmd < APIR_CMD_COUNT ? apir_command_table[cmd].reply : "?");
    for (uint32_t i = 0; i < handles.n; i++)
        fz_known_add(k, handles.h[i]);
}

#endif
