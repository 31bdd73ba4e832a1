/*
 * The one APIR command table.
 *
 * Every backend command (the cmd_flags of a FORWARD) is one row of
 * APIR_COMMAND_LIST - its number, its name, its classes - and two item lists
 * right below, APIR_REQ_<NAME> and APIR_REP_<NAME>: the request and reply
 * items in wire order, each as F(kind, field).  Everything else is derived
 * from these, so a command cannot be half-added:
 *   - the typed encoders and decoders of each message
 *     (apir_encode_request_<NAME>, apir_decode_reply_<NAME>: apir_messages.h);
 *   - the guest's typed call stubs (apir_call_<NAME>: guest/calls.h);
 *   - the host's request structs, decoded and checked - handles resolved,
 *     tensor records imported - before the handler runs, and its dispatch
 *     array (struct apir_request_<NAME>: host/dispatch/requests.h; the handler
 *     host_cmd_<NAME> in host/dispatch/dispatch.c);
 *   - the signature strings (virgl's own walk, the fuzzers) and the names.
 *
 * Item kinds (each item is a multiple of 4 bytes on the wire; the letter is
 * the signature letter):
 *   u32 'u', i32 'i', enum 'e' (uint32), res 'r' (a shared-memory res_id),
 *   bool 'b' (4 bytes), u8 'c' (4 bytes), u64 'q' (uint64, also sizes),
 *   buffer 'h', buft 'h'   host handles (uint64, opaque to the guest) of a
 *                          buffer or a buffer type: the host resolves them
 *   string 's'             uint64 length incl. NUL, bytes, zero padding to 4
 *   tensor 't'             a serialized tensor (304 bytes) of a buffer
 *   tensors 'L'            uint32 n, n serialized tensors; the first is the
 *                          subject, the others what its src/view_src ids name
 *   digest 'd'             32 raw bytes (apir 0.4, the weight cache): a SHA-256,
 *                          from minor 5 the tree digest (apir_tree_digest.h)
 *   inline 'T'             the reference guest's raw struct ggml_tensor plus
 *                          the trailing items of APIR 0.1 section 3
 *                          (accepted, never followed)
 *
 * Classes (bits; how the command relates to device work in flight, which
 * both sides need: host/dispatch/graph_exec.c and guest/remote.c read them here):
 *   APIR_QUERY         touches no tensor memory: answered while a graph the
 *                      session launched is still on the device
 *   APIR_ON_STREAM     goes on the device's stream in order (uploads,
 *                      graphs): also runs beside a graph in flight
 *   APIR_WAITS_DEVICE  waits for the device's work (graphs, synchronize):
 *                      the guest spins through it, not sleeps at once
 *   APIR_REPORTS       a deferred graph's failure is reported by it (what
 *                      waits for results: reads, synchronize, graphs)
 *   APIR_LEAVES_BUSY   the device may still run after its reply (keyed
 *                      graphs, computed after they are answered)
 *   APIR_POSTED        its reply carries nothing the guest needs at once
 *                      (ggml's call returns nothing: uploads, clears): a
 *                      stream transport sends it without waiting and checks
 *                      the reply later (transport/stream_proto.h)
 * Anything neither a query nor on the stream waits for the device first.
 *
 * Numbers 0..22 are APIR 0.1 and never change.  Each row says the minor that
 * introduced it (since): a guest sends a command only after the handshake
 * answered that minor or more, and a host refuses it below (apir_minor_speaks).
 * docs/PROTOCOL.md describes the wire format; scripts/check_docs.sh checks
 * its command table against this one.
 */
#ifndef APIR_COMMANDS_H
#define APIR_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>

#define APIR_QUERY        (1u << 0)
#define APIR_ON_STREAM    (1u << 1)
#define APIR_WAITS_DEVICE (1u << 2)
#define APIR_REPORTS      (1u << 3)
#define APIR_LEAVES_BUSY  (1u << 4)
#define APIR_POSTED       (1u << 5)

/* What a graph command is: on the stream, waited for, reporting. */
#define APIR_GRAPH (APIR_ON_STREAM | APIR_WAITS_DEVICE | APIR_REPORTS)

/*  X(number, NAME,                           since, classes)
 *  since: the protocol minor that introduced the command; a guest sends it,
 *  and a host accepts it, only on a session at that minor or above
 *  (apir_command_since, apir_minor_speaks: the one place both sides check). */
#define APIR_COMMAND_LIST(X)                                                   \
    X( 0, DEVICE_GET_DEVICE_COUNT,         1, APIR_QUERY)                      \
    X( 1, DEVICE_GET_COUNT,                1, APIR_QUERY)                      \
    X( 2, DEVICE_GET_NAME,                 1, APIR_QUERY)                      \
    X( 3, DEVICE_GET_DESCRIPTION,          1, APIR_QUERY)                      \
    X( 4, DEVICE_GET_TYPE,                 1, APIR_QUERY)                      \
    X( 5, DEVICE_GET_MEMORY,               1, APIR_QUERY)                      \
    X( 6, DEVICE_SUPPORTS_OP,              1, APIR_QUERY)                      \
    X( 7, DEVICE_GET_BUFFER_TYPE,          1, APIR_QUERY)                      \
    X( 8, DEVICE_GET_PROPS,                1, APIR_QUERY)                      \
    X( 9, DEVICE_BUFFER_FROM_PTR,          1, 0)                               \
    X(10, BUFFER_TYPE_GET_NAME,            1, APIR_QUERY)                      \
    X(11, BUFFER_TYPE_GET_ALIGNMENT,       1, APIR_QUERY)                      \
    X(12, BUFFER_TYPE_GET_MAX_SIZE,        1, APIR_QUERY)                      \
    X(13, BUFFER_TYPE_IS_HOST,             1, APIR_QUERY)                      \
    X(14, BUFFER_TYPE_ALLOC_BUFFER,        1, 0)                               \
    X(15, BUFFER_TYPE_GET_ALLOC_SIZE,      1, APIR_QUERY)                      \
    X(16, BUFFER_GET_BASE,                 1, APIR_QUERY)                      \
    X(17, BUFFER_SET_TENSOR,               1, APIR_ON_STREAM | APIR_POSTED)    \
    X(18, BUFFER_GET_TENSOR,               1, APIR_REPORTS)                    \
    X(19, BUFFER_CPY_TENSOR,               1, 0)                               \
    X(20, BUFFER_CLEAR,                    1, APIR_POSTED)                     \
    X(21, BUFFER_FREE_BUFFER,              1, 0)                               \
    X(22, BACKEND_GRAPH_COMPUTE,           1, APIR_GRAPH)                      \
    /* apir 0.2 extensions */                                                  \
    X(23, DEVICE_SELECT,                   2, 0)                               \
    X(24, DEVICE_SUPPORTS_OP_L,            2, APIR_QUERY)                      \
    X(25, BUFFER_TYPE_GET_ALLOC_SIZE_L,    2, APIR_QUERY)                      \
    X(26, BUFFER_MEMSET_TENSOR,            2, APIR_POSTED)                     \
    X(27, BACKEND_SYNCHRONIZE,             2, APIR_WAITS_DEVICE | APIR_REPORTS) \
    X(28, DEVICE_OFFLOAD_OP_L,             2, APIR_QUERY)                      \
    X(29, BUFFER_SET_TENSOR_AT,            2, APIR_ON_STREAM)                  \
    X(30, BUFFER_GET_TENSOR_AT,            2, APIR_REPORTS)                    \
    X(31, BACKEND_GRAPH_COMPUTE_AT,        2, APIR_GRAPH)                      \
    X(32, BUFFER_INIT_TENSOR,              2, 0)                               \
    X(33, BACKEND_GRAPH_COMPUTE_KEYED,     2, APIR_GRAPH | APIR_LEAVES_BUSY)   \
    X(34, BACKEND_GRAPH_RECOMPUTE,         2, APIR_GRAPH | APIR_LEAVES_BUSY)   \
    /* apir 0.3 extensions (weight copies: host/data/weight_copies.h; version) */   \
    X(35, BUFFER_NOTE_WEIGHT,              3, 0)                               \
    X(36, BUFFER_WRITTEN,                  3, APIR_POSTED)                     \
    X(37, HOST_GET_VERSION,                3, APIR_QUERY)                      \
    /* apir 0.4 extensions (the weight cache: host/data/weight_cache.h) */          \
    X(38, BUFFER_SET_TENSOR_HASH,          4, 0)                               \
    X(39, BUFFER_CACHE_TENSOR,             4, 0)                               \
    /* apir 0.6 extension (a download the guest copies out as it lands) */     \
    X(40, BUFFER_GET_TENSOR_CHUNKED,       6, APIR_REPORTS)                    \
    /* apir 0.7 extension (the guest's ggml: computed by the same tables) */   \
    X(41, HOST_CHECK_GGML,                 7, APIR_QUERY)                      \
    /* apir 0.8 extensions (a decode step in two round trips) */               \
    X(42, DEVICE_ASK_OPS,                  8, APIR_QUERY)                      \
    X(43, BACKEND_GRAPH_COMPUTE_INPUTS,    8, APIR_GRAPH | APIR_LEAVES_BUSY)  \
    /* apir 0.9 extension (a graph sent as its changes) */                     \
    X(44, BACKEND_GRAPH_COMPUTE_DELTA,     9, APIR_GRAPH | APIR_LEAVES_BUSY)

/* ---- items: F(kind, field), in wire order ------------------------------- */

#define APIR_REQ_DEVICE_GET_DEVICE_COUNT(F)
#define APIR_REP_DEVICE_GET_DEVICE_COUNT(F)     F(i32, count)
#define APIR_REQ_DEVICE_GET_COUNT(F)
#define APIR_REP_DEVICE_GET_COUNT(F)            F(i32, count)
#define APIR_REQ_DEVICE_GET_NAME(F)
#define APIR_REP_DEVICE_GET_NAME(F)             F(string, name)
#define APIR_REQ_DEVICE_GET_DESCRIPTION(F)
#define APIR_REP_DEVICE_GET_DESCRIPTION(F)      F(string, description)
#define APIR_REQ_DEVICE_GET_TYPE(F)
#define APIR_REP_DEVICE_GET_TYPE(F)             F(enum, type)
#define APIR_REQ_DEVICE_GET_MEMORY(F)
#define APIR_REP_DEVICE_GET_MEMORY(F)           F(u64, free_bytes) F(u64, total_bytes)
#define APIR_REQ_DEVICE_SUPPORTS_OP(F)          F(inline, op)
#define APIR_REP_DEVICE_SUPPORTS_OP(F)          F(bool, supported)
#define APIR_REQ_DEVICE_GET_BUFFER_TYPE(F)
#define APIR_REP_DEVICE_GET_BUFFER_TYPE(F)      F(buft, buffer_type)
/* Host buffers and events stay host-local; the fifth item is the pinned
 * reference's (the spec's table has four, its guest reads five). */
#define APIR_REQ_DEVICE_GET_PROPS(F)
#define APIR_REP_DEVICE_GET_PROPS(F)            F(bool, async) F(bool, host_buffer) F(bool, buffer_from_host_ptr) \
                                                F(bool, events) F(bool, mmap_support)
#define APIR_REQ_DEVICE_BUFFER_FROM_PTR(F)      F(res, blob) F(u64, size) F(u64, max_tensor_size)
#define APIR_REP_DEVICE_BUFFER_FROM_PTR(F)      F(buffer, buffer) F(buft, buffer_type)
#define APIR_REQ_BUFFER_TYPE_GET_NAME(F)        F(buft, buffer_type)
#define APIR_REP_BUFFER_TYPE_GET_NAME(F)        F(string, name)
#define APIR_REQ_BUFFER_TYPE_GET_ALIGNMENT(F)   F(buft, buffer_type)
#define APIR_REP_BUFFER_TYPE_GET_ALIGNMENT(F)   F(u64, alignment)
#define APIR_REQ_BUFFER_TYPE_GET_MAX_SIZE(F)    F(buft, buffer_type)
#define APIR_REP_BUFFER_TYPE_GET_MAX_SIZE(F)    F(u64, max_size)
#define APIR_REQ_BUFFER_TYPE_IS_HOST(F)         F(buft, buffer_type)
#define APIR_REP_BUFFER_TYPE_IS_HOST(F)         F(bool, is_host)
/* A buffer handle of 0 answers a failed allocation, as in 0.1. */
#define APIR_REQ_BUFFER_TYPE_ALLOC_BUFFER(F)    F(buft, buffer_type) F(u64, size)
#define APIR_REP_BUFFER_TYPE_ALLOC_BUFFER(F)    F(buffer, buffer)
#define APIR_REQ_BUFFER_TYPE_GET_ALLOC_SIZE(F)  F(buft, buffer_type) F(inline, tensor)
#define APIR_REP_BUFFER_TYPE_GET_ALLOC_SIZE(F)  F(u64, size)
#define APIR_REQ_BUFFER_GET_BASE(F)             F(buffer, buffer)
#define APIR_REP_BUFFER_GET_BASE(F)             F(u64, base)
/* offset and size within the tensor; the bytes at the start of the blob. */
#define APIR_REQ_BUFFER_SET_TENSOR(F)           F(buffer, buffer) F(tensor, tensor) F(res, blob) F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_SET_TENSOR(F)
#define APIR_REQ_BUFFER_GET_TENSOR(F)           F(buffer, buffer) F(tensor, tensor) F(res, blob) F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_GET_TENSOR(F)
#define APIR_REQ_BUFFER_CPY_TENSOR(F)           F(buffer, buffer) F(tensor, src) F(tensor, dst)
#define APIR_REP_BUFFER_CPY_TENSOR(F)           F(bool, copied)
#define APIR_REQ_BUFFER_CLEAR(F)                F(buffer, buffer) F(u8, value)
#define APIR_REP_BUFFER_CLEAR(F)
#define APIR_REQ_BUFFER_FREE_BUFFER(F)          F(buffer, buffer)
#define APIR_REP_BUFFER_FREE_BUFFER(F)
/* The graph blob (guest/serialize.c, host/check/import.c) at the start of blob. */
#define APIR_REQ_BACKEND_GRAPH_COMPUTE(F)       F(res, blob) F(u64, size)
#define APIR_REP_BACKEND_GRAPH_COMPUTE(F)       F(enum, status)
#define APIR_REQ_DEVICE_SELECT(F)               F(u32, device)
#define APIR_REP_DEVICE_SELECT(F)
#define APIR_REQ_DEVICE_SUPPORTS_OP_L(F)        F(tensors, op)
#define APIR_REP_DEVICE_SUPPORTS_OP_L(F)        F(bool, supported)
#define APIR_REQ_BUFFER_TYPE_GET_ALLOC_SIZE_L(F) F(buft, buffer_type) F(tensors, tensor)
#define APIR_REP_BUFFER_TYPE_GET_ALLOC_SIZE_L(F) F(u64, size)
#define APIR_REQ_BUFFER_MEMSET_TENSOR(F)        F(buffer, buffer) F(tensor, tensor) F(u8, value) F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_MEMSET_TENSOR(F)
#define APIR_REQ_BACKEND_SYNCHRONIZE(F)
#define APIR_REP_BACKEND_SYNCHRONIZE(F)
#define APIR_REQ_DEVICE_OFFLOAD_OP_L(F)         F(tensors, op)
#define APIR_REP_DEVICE_OFFLOAD_OP_L(F)         F(bool, offload)
/* The bytes at blob_offset of the blob (one of the guest's host buffers). */
#define APIR_REQ_BUFFER_SET_TENSOR_AT(F)        F(buffer, buffer) F(tensor, tensor) F(res, blob) F(u64, blob_offset) \
                                                F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_SET_TENSOR_AT(F)
#define APIR_REQ_BUFFER_GET_TENSOR_AT(F)        F(buffer, buffer) F(tensor, tensor) F(res, blob) F(u64, blob_offset) \
                                                F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_GET_TENSOR_AT(F)
#define APIR_REQ_BACKEND_GRAPH_COMPUTE_AT(F)    F(res, blob) F(u64, blob_offset) F(u64, size)
#define APIR_REP_BACKEND_GRAPH_COMPUTE_AT(F)    F(enum, status)
#define APIR_REQ_BUFFER_INIT_TENSOR(F)          F(buffer, buffer) F(tensor, tensor)
#define APIR_REP_BUFFER_INIT_TENSOR(F)          F(enum, status)
/* key: the guest's name for the graph (never 0), for RECOMPUTE; the blob
 * may end with the use counts (APIR_GRAPH_USE_COUNTS_TAG). */
#define APIR_REQ_BACKEND_GRAPH_COMPUTE_KEYED(F) F(res, blob) F(u64, blob_offset) F(u64, size) F(u64, key)
#define APIR_REP_BACKEND_GRAPH_COMPUTE_KEYED(F) F(enum, status)
#define APIR_REQ_BACKEND_GRAPH_RECOMPUTE(F)     F(u64, key)
#define APIR_REP_BACKEND_GRAPH_RECOMPUTE(F)     F(enum, status)
/* kept: an apir_weight_note (apir_proto.h). */
#define APIR_REQ_BUFFER_NOTE_WEIGHT(F)          F(buffer, buffer) F(tensor, tensor)
#define APIR_REP_BUFFER_NOTE_WEIGHT(F)          F(u32, kept)
#define APIR_REQ_BUFFER_WRITTEN(F)              F(buffer, buffer) F(u64, offset) F(u64, size)
#define APIR_REP_BUFFER_WRITTEN(F)
/* The host library's own protocol version (not the session's): what a
 * virtio-gpu guest asks, since virglrenderer answers HANDSHAKE itself.  A
 * host older than this command answers APIR_HANDLER_INVALID_INDEX. */
#define APIR_REQ_HOST_GET_VERSION(F)
#define APIR_REP_HOST_GET_VERSION(F)            F(u32, major) F(u32, minor)
/* The weight cache (apir 0.4, host/data/weight_cache.h).  SET_TENSOR_HASH: fill
 * [offset, offset + size) of the tensor from the host's cache entry of
 * that SHA-256 and size, if it has one; answer: an apir_weight_cache_answer
 * (apir_proto.h).  CACHE_TENSOR: the guest uploaded this tensor whole after
 * a miss; the host reads it back, hashes it itself and keeps it only when
 * the hash is the one named. */
#define APIR_REQ_BUFFER_SET_TENSOR_HASH(F)      F(buffer, buffer) F(tensor, tensor) F(u64, offset) F(u64, size) \
                                                F(digest, hash)
#define APIR_REP_BUFFER_SET_TENSOR_HASH(F)      F(u32, answer)
#define APIR_REQ_BUFFER_CACHE_TENSOR(F)         F(buffer, buffer) F(tensor, tensor) F(digest, hash)
#define APIR_REP_BUFFER_CACHE_TENSOR(F)         F(u32, answer)
/* GET_TENSOR_AT in pieces of `chunk` bytes, in order: after piece k is in
 * the blob the host stores k + 1 in the struct apir_chunk_progress at
 * progress_offset of the same blob (apir_proto.h), so that the guest copies
 * the pieces out while the rest are still coming (apir 0.6). */
#define APIR_REQ_BUFFER_GET_TENSOR_CHUNKED(F)   F(buffer, buffer) F(tensor, tensor) F(res, blob) F(u64, blob_offset) \
                                                F(u64, offset) F(u64, size) F(u64, chunk) F(u64, progress_offset)
#define APIR_REP_BUFFER_GET_TENSOR_CHUNKED(F)
/* The guest's ggml: ggml_version(), ggml_commit(), and the names of its ops,
 * unary ops, GLU ops and tensor types in number order, separated by '\n'
 * (the numbers its tensor records and op parameters carry).  verdict: an
 * apir_ggml_verdict (apir_proto.h); reason: why, when refused; host_ggml:
 * the host's "VERSION (llama.cpp COMMIT)".  A guest sends it before any
 * tensor and uses no device of a host that refused it. */
#define APIR_REQ_HOST_CHECK_GGML(F)             F(string, version) F(string, commit) F(string, ops) \
                                                F(string, unary_ops) F(string, glu_ops) F(string, types)
#define APIR_REP_HOST_CHECK_GGML(F)             F(u32, verdict) F(string, reason) F(string, host_ggml)
/* Several questions of one kind in one round trip (apir 0.8): `question`
 * an apir_ask_question; [0, size) of the blob holds u32 n (1..APIR_ASK_OPS_MAX),
 * u32 m (records per question, 1..APIR_ASK_OPS_MAX_RECORDS), then n * m
 * tensor records, question q being records [q*m, (q+1)*m) as the _L
 * command of that question would carry them.  The host answers each as that
 * command would (a refused tensor: 0, "not supported" / no size) and writes
 * the n answers, u64 each, at the start of the blob; answered: n.
 * buffer_type: the buffer type an ALLOC_SIZE question is about (any of the
 * session's for the others).  The guest asks a question it expects next
 * together with the one it has (a cache growing by a row each step). */
#define APIR_REQ_DEVICE_ASK_OPS(F)              F(u32, question) F(buft, buffer_type) F(res, blob) F(u64, size)
#define APIR_REP_DEVICE_ASK_OPS(F)              F(u32, answered)
/* A keyed graph and the small uploads it reads, in one round trip (apir
 * 0.8): [inputs_offset, inputs_offset + inputs_size) of the blob holds the
 * uploads (u32 n, then per upload: u64 buffer handle, a tensor record, u64
 * offset, u64 size, the size bytes padded to 4), each done as
 * BUFFER_SET_TENSOR would, in order, before the graph; then the graph blob
 * at graph_offset (graph_size bytes, as BACKEND_GRAPH_COMPUTE_KEYED), or,
 * with graph_size 0, the graph kept under key (as BACKEND_GRAPH_RECOMPUTE,
 * answering APIR_HANDLER_STALE after the uploads when it is not kept). */
#define APIR_REQ_BACKEND_GRAPH_COMPUTE_INPUTS(F) F(res, blob) F(u64, inputs_offset) F(u64, inputs_size) \
                                                F(u64, graph_offset) F(u64, graph_size) F(u64, key)
#define APIR_REP_BACKEND_GRAPH_COMPUTE_INPUTS(F) F(enum, status)
/* As BACKEND_GRAPH_COMPUTE_INPUTS (inputs_size 0: no uploads), its graph
 * blob a delta against the graph of key base, the last graph the session
 * imported (apir 0.9): where a whole blob's records are, u32 n_changed,
 * their u32 indices (strictly increasing, below n_tensors, every index at
 * or past the base's tensor count among them) and their records.  Every
 * other record is the base's at that index.  APIR_HANDLER_STALE after the
 * uploads when the host no longer keeps the base: the guest sends the graph
 * whole (host/check/import.h). */
#define APIR_REQ_BACKEND_GRAPH_COMPUTE_DELTA(F) F(res, blob) F(u64, inputs_offset) F(u64, inputs_size) \
                                               F(u64, graph_offset) F(u64, graph_size) F(u64, key) F(u64, base)
#define APIR_REP_BACKEND_GRAPH_COMPUTE_DELTA(F) F(enum, status)

/* DEVICE_ASK_OPS: the questions, and its limits. */
enum apir_ask_question {
    APIR_ASK_SUPPORTS_OP = 1,   /* as DEVICE_SUPPORTS_OP_L: 1 or 0 */
    APIR_ASK_OFFLOAD_OP = 2,    /* as DEVICE_OFFLOAD_OP_L: 1 or 0 */
    APIR_ASK_ALLOC_SIZE = 3,    /* as BUFFER_TYPE_GET_ALLOC_SIZE_L: bytes, 0 refused */
};
#define APIR_ASK_OPS_MAX 64u
#define APIR_ASK_OPS_MAX_RECORDS 16u

enum apir_command {
#define APIR_X_ENUM(num, name, since, classes) APIR_CMD_##name = num,
    APIR_COMMAND_LIST(APIR_X_ENUM)
#undef APIR_X_ENUM
    APIR_CMD_COUNT
};

/* Commands of the reference protocol (APIR 0.1): 0..22. */
#define APIR_CMD_COUNT_0_1 23

struct apir_command_info {
    const char *name;      /* "BUFFER_SET_TENSOR" */
    const char *request;   /* signature of the request items ("htrqq") */
    const char *reply;     /* signature of the reply items */
    uint32_t classes;      /* APIR_QUERY ... */
    uint32_t since;        /* the protocol minor that introduced it */
};

/* Indexed by command number; NULL name for a number that is not a command. */
extern const struct apir_command_info apir_command_table[APIR_CMD_COUNT];

/* The protocol minor a command needs (its since column); 0 for a number
 * that is not a command. */
static inline uint32_t apir_command_since(uint32_t cmd)
{
    return cmd < APIR_CMD_COUNT ? apir_command_table[cmd].since : 0;
}

/* Whether a session at `minor` has command `cmd`: what the guest asks before
 * sending it and the host before running it. */
static inline bool apir_minor_speaks(uint32_t minor, uint32_t cmd)
{
    return cmd < APIR_CMD_COUNT && apir_command_table[cmd].name && minor >= apir_command_table[cmd].since;
}

/*
 * What a minor brings that is not a command: behaviour both sides agree on
 * once the handshake settled the minor.  The minor is the capability set -
 * every step added commands and these together, none is optional within a
 * minor - so the handshake carries no separate bits (APIR 0.1's handshake
 * has no room for them; a future optional feature would get a query
 * command of its own).  Like the commands' since column, this table is the
 * only place a minor is compared with a number.
 *   X(NAME, since, what)
 */
#define APIR_FEATURE_LIST(X)                                                                       \
    X(ZERO_COPY,    2, "DEVICE_BUFFER_FROM_PTR over a shared blob computes in the guest's memory") \
    X(HOST_BUFFER,  2, "a pinned host buffer type in shared blobs")                                \
    X(EVENTS,       2, "keyed graphs answered before they are computed: guest events")              \
    X(LIMIT_REASON, 3, "a refusal for a limit carries its reason in the reply")                    \
    X(FILE_BLOBS,   3, "SHM_BLOB_FILE: a file the guest mapped, shared without a copy")            \
    X(SYNC_GRAPHS_DONE, 9, "over shared blobs a CPU device's keyed graph is done at its reply")

enum apir_feature {
#define APIR_X_FEATURE_ENUM(name, since, what) APIR_FEATURE_##name,
    APIR_FEATURE_LIST(APIR_X_FEATURE_ENUM)
#undef APIR_X_FEATURE_ENUM
    APIR_FEATURE_COUNT
};

/* Whether a session at `minor` has feature `f`. */
static inline bool apir_minor_has(uint32_t minor, enum apir_feature f)
{
    static const uint8_t since[APIR_FEATURE_COUNT] = {
#define APIR_X_FEATURE_SINCE(name, since, what) since,
        APIR_FEATURE_LIST(APIR_X_FEATURE_SINCE)
#undef APIR_X_FEATURE_SINCE
    };
    return (unsigned)f < APIR_FEATURE_COUNT && minor >= since[f];
}

/* Name of a command number, or "UNKNOWN" (never NULL). */
const char *apir_command_name(uint32_t cmd);

/* The classes of a command number; 0 for a number that is not a command. */
static inline uint32_t apir_command_classes(uint32_t cmd)
{
    return cmd < APIR_CMD_COUNT ? apir_command_table[cmd].classes : 0;
}

/*
 * Commands a host runs while a graph or upload it queued may still be on the
 * device: queries, which touch no tensor memory, and graphs and uploads,
 * which go on the device's stream in order (an upload that cannot waits
 * itself).  Before anything else the host waits for the device.  A guest
 * therefore counts the host as still computing across these commands and
 * synchronizes before it reads shared memory a graph may be writing.
 */
static inline bool apir_command_runs_beside_device(uint32_t cmd)
{
    return (apir_command_classes(cmd) & (APIR_QUERY | APIR_ON_STREAM)) != 0;
}

#endif
