/*
 * One guest's state on the host: its handles, its buffers, its shared-memory
 * blobs, its backend streams and its scratch space.  A session is driven by
 * one thread at a time (the transport's worker); nothing in it is shared with
 * another session, so one guest cannot name, read or free another's objects.
 *
 * The session itself is the core every module shares (host, handles,
 * devices and their streams, blobs, buffer counters, the request scratch);
 * each module that works for it keeps its own state behind one pointer,
 * made and freed by that module: upload_mirror.c, weight_copies.c,
 * op_policy.c, graph_exec.c.
 */
#ifndef APIR_SESSION_H
#define APIR_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_log.h"
#include "handles.h"
#include "host.h"

struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;

/*
 * A shared-memory region the guest named by res_id: an object of its own,
 * at a fixed address until it is unmapped, held by references.  The
 * session's table holds one while the guest has not destroyed it; a buffer
 * wrapping it (BUFFER_FROM_PTR) holds one for its whole life, and so may a
 * command that must recognise it afterwards (the shm reply blob).  Destroyed
 * by the guest it is "closing": no command can name it any more, but it
 * stays mapped - and its res_id stays taken - until the last reference
 * goes.  So a buffer never outlives its memory, and a res_id is never
 * reused while anything still holds its old blob (issue 24: pins counted by
 * res_id let a new blob's buffer unmap the old one under a live buffer).
 */
struct apir_blob {
    uint32_t res_id;
    uint32_t refs;          /* the table's (until destroyed), the buffers', commands' */
    uint8_t *ptr;
    size_t size;            /* SIZE_MAX: unknown (virgl's callback gives none) */
    bool page_locked;       /* for the GPU's copy engines (pin.c) */
    bool closing;           /* destroyed by the guest, unmapped when the last reference goes */
    void (*release)(void *ptr, size_t size, void *user);
    void *release_user;
};

/* A backend buffer the guest owns, reached through a BUFFER handle. */
struct apir_host_buffer {
    uint64_t handle;        /* its BUFFER handle */
    ggml_backend_buffer_t buffer;
    uint8_t *base;          /* the real base: never sent to the guest */
    uint64_t size;
    uint64_t opaque_base;   /* what BUFFER_GET_BASE answers */
    uint32_t device;
    uint32_t pinned_blob;   /* res_id wrapped by BUFFER_FROM_PTR, 0 if none */
    struct apir_blob *blob; /* ... the blob itself, referenced while the buffer lives */
};

/* Host-private copies per imported graph (op_policy.c): an index tensor in
 * guest-shared memory, and an ARGSORT's source and result there - three a
 * layer for MoE routing on a CPU host with zero-copy buffers (DeepSeek's 61
 * layers: 183). */
#define APIR_MAX_SHADOWS 256

/* Reusable scratch for tensor import (import.h): grows, never shrinks, so
 * the token path does not allocate once warmed up.  Every import names the
 * scratch it goes into: a request's tensors the session's own
 * (apir_session.scratch), a keyed graph its cache slot's (graph_exec.c). */
struct apir_import_scratch {
    struct ggml_context *ctx;
    void *ctx_mem;
    size_t ctx_size;
    uint64_t *keys;          /* open-addressed id -> index map */
    uint32_t *vals;
    uint32_t map_cap;
    struct ggml_tensor **tensors;
    /* Per tensor, its APIR_TENSOR_MAX_SRC srcs then its view_src: the ids its
     * record names (import.c pass 1), then, once resolved (pass 2), the
     * index + 1 of each in the list (0: none). */
    uint64_t *refs;
    uint8_t *state;         /* DFS colours for the cycle check */
    uint32_t *stack;
    uint32_t tensors_cap;
    struct ggml_cgraph *segment_graph;  /* op_policy.c: computing in parts */
    int segment_graph_size;
    /* op_policy.c: host-private copies of index tensors in guest-shared memory */
    struct apir_shadow {
        struct ggml_tensor *orig, *shadow;
        void *mem;
    } shadows[APIR_MAX_SHADOWS];
    uint32_t n_shadows;
    /* graph_exec.c: the graph's nodes that update operands in place beside
     * their results (op_policy.h apir_node_written_srcs), counted at import
     * so that a run of a graph with none looks no further */
    uint32_t n_writing_operands;
    uint8_t *same;          /* per record: byte for byte the memo's (import.c) */
    /* A graph's tensors (import.c), tensors_cap of them: outside the
     * context, so that one the memo made is copied in whole. */
    struct ggml_tensor *store;
};

/* The last graph the session imported, as import.c checked it: a new graph
 * is mostly the last one again (a whisper.cpp decode step: 261 of its 287
 * records, only the attention's shapes grow), and a node whose record and
 * whose operands' records are the memo's passes the same checks.  Owned by
 * import.c; graph blobs of more than APIR_IMPORT_MEMO_MAX tensors are not
 * kept. */
#define APIR_IMPORT_MEMO_MAX 8192u
struct apir_import_memo {
    uint8_t *records;       /* n records as imported (the host's copy, never the guest's memory) */
    uint8_t *supported;     /* per record: a node the device said it supports */
    struct ggml_tensor *made; /* per record: its tensor as checked and made, before its links (import.c) */
    uint32_t n, cap;
    uint64_t epoch;         /* s->buffers_epoch then: a buffer gone since, and the handles may name others */
    uint32_t device;        /* s->device then */
    uint64_t key;           /* the graph's key (0: an APIR 0.1 graph): what a 0.9 delta names as its base */
    bool valid;             /* the import of those records succeeded */
};

/* Where the host's time went, for the profile lines at exit
 * (apir_session_log_profile).  Plain counters: each is added to by the
 * module that does the work. */
struct apir_session_stats {
    uint64_t cmd_ns[APIR_CMD_COUNT], cmd_count[APIR_CMD_COUNT];  /* per command (dispatch.c) */
    uint64_t import_ns, compute_ns;        /* of graph commands: decoding+checks, checks+compute */
    uint64_t checks_kept;                  /* tensors whose op checks the import memo answered (import.c) */
    uint64_t n_commands, n_graphs, n_refused, n_recomputes;  /* for the log line at exit */
    uint64_t n_segments;                   /* graph pieces computed (more than graphs: index splits) */
    uint64_t private_sorts;                /* ARGSORTs run on host-private copies (op_policy.c) */
    uint64_t op_ns[GGML_OP_COUNT], op_count[GGML_OP_COUNT];  /* with cfg.op_profile (op_policy.c) */
    /* the weight cache (weight_cache.c): weights filled from it, asked for
     * and not there, kept after an upload */
    uint64_t wcache_hits, wcache_hit_bytes, wcache_misses, wcache_kept;
    /* The device and the host thread (upload_mirror.c, graph_exec.c): time
     * waited for a graph in flight, and from such a wait's end (the device
     * known idle) to the next launch - what the device idled because of
     * the host's serial steps, or the guest's. */
    uint64_t settle_wait_ns, idle_before_launch_ns, n_idle_gaps;
    /* An upload's wait for an earlier upload's copies, to reuse their host
     * memory (upload_mirror.c: a half's event). */
    uint64_t upload_wait_ns, n_upload_waits;
};

/* The modules' own state: each is created and freed by its module
 * (apir_session_new, apir_session_free: host/dispatch/dispatcher.h) and read
 * only through its header. */
struct apir_mirror;     /* upload_mirror.c: host copies of uploads */
struct apir_download_pieces;  /* download_pieces.c: stream downloads sent as they land */
struct apir_weights;    /* weight_copies.c: weights in the device's own layouts */
struct apir_policy;     /* op_policy.c: index validation's scratch */
struct apir_graphs;     /* graph_exec.c: kept graphs, deferral, what is in flight */

struct apir_session {
    struct apir_host *host;
    char name[48];                         /* for log lines */
    uint32_t minor;                        /* negotiated protocol minor */
    struct apir_handle_table handles;
    uint64_t buft_handles[APIR_HOST_MAX_DEVICES];
    uint32_t device;                       /* current device (DEVICE_SELECT) */
    ggml_backend_t backends[APIR_HOST_MAX_DEVICES];
    bool backend_async[APIR_HOST_MAX_DEVICES];  /* the device copies asynchronously (props caps.async) */
    bool computes_sync[APIR_HOST_MAX_DEVICES];  /* its graph_compute returns when done (caps.async false) */

    /* Every blob still mapped, closing ones included (they keep their
     * res_id and count against the quota until unmapped). */
    struct apir_blob **blobs;
    uint32_t n_blobs, blobs_cap;
    uint64_t blob_bytes;

    /* buffers.c; weight copies are charged to bytes_allocated too */
    uint32_t n_buffers;
    uint64_t bytes_allocated;
    uint64_t buffers_epoch;                /* bumped when buffer memory a kept graph may use goes */

    /* Set by a transport that runs apir_session_run_deferred right after
     * sending each reply: keyed graphs are then computed after their reply
     * (graph_exec.h). */
    bool defer_graphs;
    /* With defer_graphs, whether a device that computes synchronously (its
     * caps.async is false: the CPU) defers too.  A stream transport sets it:
     * its guest may be on another machine, and its next request crosses the
     * link while the host computes.  On shared memory the guest is on this
     * machine: there such a graph is computed before its reply, as ggml's
     * CPU backend computes natively - an early reply woke the guest in the
     * middle of the compute, on the cores the compute runs on (whisper.cpp's
     * decode step on 2 vCPUs: 7 % slower, 16 interleaved rounds). */
    bool defer_sync_graphs;

    /* The stream a graph was launched on and not yet waited for
     * (graph_exec.c), NULL if none: apir_session_settle (upload_mirror.h)
     * waits for it before anything else may reach that memory. */
    ggml_backend_t graph_in_flight;
    /* Graphs in flight waited for so far (apir_session_settle): a kept
     * graph launched before the last wait is done (graph_exec.c). */
    uint64_t settles;
    uint64_t device_idle_since_ns;         /* the last such wait's end; 0: launched since */
    uint32_t cmd;                          /* the command being served (dispatch.c), for log lines */

    struct apir_import_scratch scratch;    /* requests' tensors (requests.c) */
    struct apir_import_memo import_memo;   /* import.c: the last graph, as checked */

    struct apir_mirror *mirror;
    struct apir_download_pieces *pieces;
    struct apir_weights *weights;
    struct apir_policy *policy;
    struct apir_graphs *graphs;

    struct apir_session_stats stats;

    /* The entry last read back wrong (weight_cache.c): a store of that hash
     * replaces it. */
    struct apir_digest wcache_bad;
    bool wcache_bad_set;

    /* Why the last APIR_HANDLER_LIMIT refused this guest: which quota, its
     * value, this guest's own use (never another's).  Sent in the reply of
     * that command (0.3: dispatch.c) and logged. */
    char limit_why[192];

    /* This guest's share of the log (apir_log.h): the transport serving it
     * enters it while it works for the guest. */
    struct apir_log_budget log;
};

/* The core's part of a session's life (the whole of it: dispatcher.h).
 * init fills a zeroed session: name, log budget, handle table with one
 * buffer type per device.  release frees what the core holds - handles,
 * blobs (unmapped), backend streams - once the buffers are gone and the
 * device settled. */
void apir_session_init(struct apir_session *s, struct apir_host *host, const char *name);
void apir_session_release(struct apir_session *s);

/* A per-guest limit refuses the command being run: logged (warn) and kept
 * for its reply (limit_why).  The caller returns APIR_HANDLER_LIMIT. */
void apir_session_refuse_limit(struct apir_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Blobs: add/remove is the transport's job; lookups check bounds.  add
 * refuses a res_id any blob still holds, a closing one included (logged,
 * saying which). */
bool apir_session_blob_add(struct apir_session *s, uint32_t res_id, void *ptr, size_t size,
                           void (*release)(void *, size_t, void *), void *user);
/* The guest destroys blob res_id: unmapped now, or when the last buffer
 * wrapping it goes.  False: no live blob res_id. */
bool apir_session_blob_remove(struct apir_session *s, uint32_t res_id);
/* [offset, offset+size) of blob res_id, or NULL (bounds are checked). */
uint8_t *apir_session_blob_range(struct apir_session *s, uint32_t res_id, uint64_t offset, uint64_t size);
/* The live blob res_id (not closing), or NULL.  The object stays where it
 * is while anything references it; without a reference of one's own, only
 * until the next blob command. */
struct apir_blob *apir_session_blob_find(struct apir_session *s, uint32_t res_id);
/* A reference to b, kept until apir_session_blob_put; the last put of a
 * closing blob unmaps it. */
struct apir_blob *apir_session_blob_hold(struct apir_blob *b);
void apir_session_blob_put(struct apir_session *s, struct apir_blob *b);

/* The session's backend stream for a device, created on first use. */
ggml_backend_t apir_session_backend(struct apir_session *s, uint32_t device);

#endif
