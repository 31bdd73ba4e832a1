/*
 * APIR wire constants shared by guest and host.
 *
 * The numbers here are fixed by the APIR 0.1 protocol (../shared/APIR-0.1.md;
 * docs/PROTOCOL.md in our words): command types, return codes, the reply
 * word.  What apir adds (the 0.2 and 0.3 extensions, transport-private
 * command types, limits) is marked as such.  Every value that comes from a peer is checked against these limits
 * before it is used.
 */
#ifndef APIR_PROTO_H
#define APIR_PROTO_H

#include <stdatomic.h>
#include <stdint.h>

#define APIR_VERSION_MAJOR 0
/* 0.1 is the reference protocol; 0.2 adds the extension commands 23..34,
 * 0.3 the weight copies (35, 36) and the version query (37), 0.4 the
 * weight cache (38, 39), 0.5 no command but the weight cache's tree digest
 * (APIR_WCACHE_TREE_MINOR), 0.6 the chunked download (40), 0.7 the ggml
 * check (41), 0.8 several questions in one round trip (42) and a graph with
 * its small uploads (43), 0.9 a graph sent as its changes (44).  A host
 * answers min(guest minor, its minor), so a 0.1 guest sees 0.1. */
#define APIR_VERSION_MINOR 9
#define APIR_VERSION_MINOR_REFERENCE 1

#define APIR_HANDSHAKE_MAGIC 0xab1eu

/* Command header: cmd_type, cmd_flags, reply_res_id (12 bytes). */
#define APIR_CMD_HEADER_SIZE 12u

enum apir_cmd_type {
    APIR_CMD_TYPE_HANDSHAKE   = 0,
    APIR_CMD_TYPE_LOADLIBRARY = 1,
    APIR_CMD_TYPE_FORWARD     = 2,
    /* apir's same-host transport: blob management travels in the same ordered
     * command stream as the backend commands (never part of APIR 0.1). */
    APIR_CMD_TYPE_SHM_BLOB_CREATE  = 100,
    APIR_CMD_TYPE_SHM_BLOB_DESTROY = 101,
    /* A range of a file the guest has mapped (a model), shared without a
     * copy: the host maps the same file (apir 0.3, host/server/client_shm.c). */
    APIR_CMD_TYPE_SHM_BLOB_FILE    = 102,
    /* A stream session's lanes: extra connections for large payloads
     * (transport/stream_proto.h; stream transports only). */
    APIR_CMD_TYPE_STREAM_LANES     = 103,
};

/* Offset added to every command type on the Venus capset (id 4). */
#define APIR_VENUS_CMD_OFFSET 331u
#define APIR_CAPSET_ID        10u
#define APIR_CAPSET_ID_VENUS  4u

/* FORWARD return values: transport codes below APIR_FORWARD_BASE, then
 * APIR_FORWARD_BASE + the handler's result. */
enum apir_forward_code {
    APIR_FORWARD_SUCCESS       = 0,
    APIR_FORWARD_NO_DISPATCH   = 1,
    APIR_FORWARD_TIMEOUT       = 2,
    APIR_FORWARD_STREAM_SYNC   = 3,
    APIR_FORWARD_BASE          = 4,
};

/* Handler results (added to APIR_FORWARD_BASE). */
enum apir_handler_result {
    APIR_HANDLER_OK            = 0,
    APIR_HANDLER_FAILED        = 1, /* decoded, but the operation failed  */
    APIR_HANDLER_BAD_REQUEST   = 2, /* malformed or out-of-bounds request */
    APIR_HANDLER_BAD_HANDLE    = 3, /* unknown, stale or foreign handle   */
    APIR_HANDLER_LIMIT         = 4, /* a per-client limit was hit         */
    APIR_HANDLER_REPLY_FULL    = 5, /* reply does not fit the reply blob  */
    APIR_HANDLER_INVALID_INDEX = 6, /* unknown command number (0.1)       */
    APIR_HANDLER_STALE         = 7, /* RECOMPUTE of a graph not kept: send it */
};

/* BUFFER_NOTE_WEIGHT's answer (apir 0.3, host/data/weight_copies.h). */
enum apir_weight_note {
    APIR_WEIGHT_NOT_KEPT = 0,   /* no copy of this one (no layout takes it) */
    APIR_WEIGHT_KEPT     = 1,   /* a copy is kept and used */
    APIR_WEIGHT_NEVER    = 2,   /* the host keeps no copies: do not ask again */
};

/* BUFFER_SET_TENSOR_HASH's and BUFFER_CACHE_TENSOR's answer (apir 0.4,
 * host/data/weight_cache.h). */
enum apir_weight_cache_answer {
    APIR_WCACHE_MISS     = 0,   /* SET: not filled, upload the bytes; CACHE: not kept */
    APIR_WCACHE_DONE     = 1,   /* SET: the range holds the cached bytes; CACHE: kept */
    APIR_WCACHE_NONE     = 2,   /* the host has no weight cache: do not ask again */
};

/* The weight cache's content hash (the 'digest' item): SHA-256 at minor 4;
 * from this minor the tree digest of apir_tree_digest.h, which both sides
 * hash on several threads. */
#define APIR_DIGEST_SIZE 32u
#define APIR_WCACHE_TREE_MINOR 5u

/* LOADLIBRARY: 0 success; 1..5 hypervisor codes; 6 + host library code. */
enum apir_load_code {
    APIR_LOAD_SUCCESS             = 0,
    APIR_LOAD_HYPERCALL_INIT      = 1,
    APIR_LOAD_ALREADY_LOADED      = 2,
    APIR_LOAD_CONFIG_MISSING      = 3,
    APIR_LOAD_CANNOT_OPEN         = 4,
    APIR_LOAD_SYMBOL_MISSING      = 5,
    APIR_LOAD_HOST_BASE           = 6,
};
enum apir_host_init_code {
    APIR_INIT_SUCCESS                 = 0,
    APIR_INIT_CANNOT_OPEN_BACKEND     = 1,
    APIR_INIT_CANNOT_OPEN_GGML        = 2,
    APIR_INIT_MISSING_BACKEND_SYMBOLS = 3,
    APIR_INIT_MISSING_GGML_SYMBOLS    = 4,
    APIR_INIT_BACKEND_FAILED          = 5,
    APIR_INIT_BACKEND_REG_FAILED      = 6,
    APIR_INIT_ALREADY_INITIALIZED     = 7,
    APIR_INIT_NO_DEVICE               = 8,
    APIR_INIT_BACKEND_INIT_FAILED     = 9,
};

/* HOST_CHECK_GGML's verdict (apir 0.7): whether the host computes the
 * guest's tensors with the ggml whose numbers they carry. */
enum apir_ggml_verdict {
    APIR_GGML_SAME          = 0,  /* the same ggml commit */
    APIR_GGML_TABLES_EQUAL  = 1,  /* another commit, every op and type the guest
                                   * has numbered and named as the host's */
    APIR_GGML_REFUSED       = 2,  /* tables differ: no device (the reason says where) */
};

/* Blob sizes of the reference guest (section 2). */
#define APIR_REPLY_BLOB_SIZE   (16u * 1024u)
#define APIR_DATA_BLOB_SIZE    0x1830000u
#define APIR_BLOB_ALIGN        (16u * 1024u)

/* apir 0.2, BACKEND_GRAPH_COMPUTE_KEYED only: the graph blob may end with
 * this tag and one u32 per node, the node's use count in the guest's whole
 * graph (ggml's cgraph use_counts).  Backends fuse a node into its consumer
 * only when it has exactly one use; a split graph alone cannot tell uses in
 * later splits, so the guest says.  Without the section nothing is fused. */
#define APIR_GRAPH_USE_COUNTS_TAG 0x544e4355u /* "UCNT" */

/* apir 0.3: the reply of a command refused with APIR_HANDLER_LIMIT is this
 * tag and one string, which quota refused it, its value and the guest's own
 * use (never another guest's).  The tag tells it from a reply area's old
 * bytes where an older host wrote nothing. */
#define APIR_LIMIT_REASON_TAG 0x54494d4cu /* "LMIT" */

/* apir 0.6, BUFFER_GET_TENSOR_CHUNKED: the 8 bytes at progress_offset of
 * the blob, in memory both sides map.  The host copies the range in pieces
 * and, after piece k is complete in the blob, stores k + 1 in
 * pieces_done (release; the guest zeroes it before it sends), then wakes
 * the futex on pieces_done if guest_sleeping is non-zero.  The guest reads
 * pieces_done only as far as the pieces it asked for: the reply, not the
 * counter, says the whole range is there.  The host never waits for the
 * guest, and reads nothing here but whether to wake it.  A piece is at
 * least APIR_CHUNK_MIN bytes, so a guest cannot make the host loop over
 * tiny copies. */
struct apir_chunk_progress {
    _Atomic uint32_t pieces_done;
    _Atomic uint32_t guest_sleeping;
};
#define APIR_CHUNK_MIN (64u * 1024u)

/* Hard limits on what a peer may ask for.  They bound every allocation and
 * loop the host makes on a guest's behalf; the host can lower them. */
#define APIR_MAX_STRING        4096u          /* names, descriptions      */
#define APIR_MAX_GRAPH_NODES   (1u << 18)
#define APIR_MAX_GRAPH_TENSORS (1u << 19)
#define APIR_MAX_COMMAND_SIZE  (64u * 1024u)  /* one command's bytes      */

#endif
