/*
 * libggml-apir.so internals: the ggml backend objects of the frontend.
 *
 * Per-device state lives in struct apir_device (the ggml device's context):
 * its connection, cached properties, its buffer type, its op caches and its
 * graph serialization scratch.  Nothing per-device is static.
 */
#ifndef APIR_FRONTEND_H
#define APIR_FRONTEND_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "endpoint_list.h"  /* APIR_MAX_DEVICES */
#include "remote.h"
#include "apir_ggml_features.h"  /* what the built-for ggml has: cmake/GgmlFeatures.cmake */

/*
 * Every ggml function this library calls, each imported weak.  ggml's loader
 * opens backends with RTLD_NOW: one function the program's ggml lacks (an
 * older tree without ggml_log_get) would fail the load before our check runs,
 * with a linker message instead of ours.  Weak, a missing one is a NULL
 * address that apir_ggml_check (frontend_compat.c) names.  A ggml call not in
 * this list is a strong import: the guest_ggml_imports test fails on it.
 */
#define APIR_GGML_IMPORTS(X)                                                              \
    X(ggml_version) X(ggml_commit) X(ggml_tensor_overhead) X(ggml_graph_overhead_custom)  \
    X(ggml_type_name) X(ggml_op_name) X(ggml_unary_op_name) X(ggml_glu_op_name)           \
    X(ggml_nbytes) X(ggml_is_quantized) X(ggml_op_desc)                                   \
    X(ggml_graph_n_nodes) X(ggml_graph_node) X(ggml_log_internal)                         \
    X(ggml_log_callback_default) X(ggml_backend_buffer_init) X(ggml_backend_buffer_name)  \
    X(ggml_backend_buffer_is_host) X(ggml_backend_buffer_get_usage)                       \
    X(ggml_backend_buft_alloc_buffer) X(ggml_backend_cpu_buffer_type)                     \
    X(ggml_abort) /* GGML_ASSERT in ggml's inline helpers, kept in an unoptimized build */ \
    APIR_GGML_IMPORTS_LOG_GET(X)
#if APIR_GGML_HAS_LOG_GET
#define APIR_GGML_IMPORTS_LOG_GET(X) X(ggml_log_get)
#else
#define APIR_GGML_IMPORTS_LOG_GET(X)
#endif
#define APIR_PRAGMA_(x) _Pragma(#x)
#define APIR_X_WEAK(f) APIR_PRAGMA_(weak f)
APIR_GGML_IMPORTS(APIR_X_WEAK)
#undef APIR_X_WEAK

#define APIR_REG_NAME "APIR"

/* Answers the host gave for an op signature (supports_op, offload_op,
 * alloc size), kept so ggml's scheduler can ask per node and per graph
 * without a round trip.  Keyed by a 128-bit hash of the question's
 * normalized records (apir_op_records: only what decides the answer, so a
 * view's moving offset is no new question); sets of APIR_OP_CACHE_WAYS
 * entries, the least recently used one replaced, so that two questions a
 * graph asks every step cannot keep evicting each other.  Fixed size: no
 * allocation once the device is set up. */
#define APIR_OP_CACHE_SETS 2048
#define APIR_OP_CACHE_WAYS 4
struct apir_op_cache_entry {
    uint64_t h1, h2;    /* 0,0: empty */
    uint64_t value;
    uint64_t last_use;
};

/*
 * Questions that come in series (apir 0.8): a cache growing by a row each
 * decode step makes each step's question about an attention node new - the
 * same op, types and parameters, one dimension a row longer.  Per family of
 * questions (the key without shapes and strides) the last one asked is
 * kept, and the step from the one before (the difference of every shape and
 * stride); when a new question is the same step further, the guest asks the
 * host about it and the APIR_ASK_SERIES - 1 that would follow at that step,
 * in one round trip, and caches every answer under its own full key.  A
 * series that does not continue only leaves unused entries: every cached
 * answer is the host's answer to exactly that key.  (A step seen once is
 * not a series: a program trying shapes, as test-backend-ops does, asks
 * one question at a time.)
 */
#define APIR_OP_SERIES 8
#define APIR_ASK_SERIES 32
struct apir_op_series {
    uint64_t h1, h2;    /* family; 0,0: empty */
    uint64_t last_use;
    uint32_t n;         /* records of the last question */
    bool has_step;
    struct apir_tensor_rec recs[1 + GGML_MAX_SRC];
    int64_t step[1 + GGML_MAX_SRC][2][GGML_MAX_DIMS];  /* per record: ne, nb */
};

/*
 * Small uploads waiting for the graph that reads them (apir 0.8): the
 * inputs section of BACKEND_GRAPH_COMPUTE_INPUTS, encoded as they come
 * (u32 count, then per upload its buffer handle, record, offset, size and
 * bytes).  Any other command that may touch device memory sends them first
 * as plain uploads (apir_inputs_flush_locked).  Fixed size, allocated once.
 */
#define APIR_INPUT_MAX (64u << 10)       /* one upload at most: whisper's mask, token, positions */
#define APIR_INPUTS_SIZE (256u << 10)    /* all waiting at most */
struct apir_inputs {
    uint8_t *buf;        /* APIR_INPUTS_SIZE bytes, or NULL until the first */
    size_t used;         /* bytes encoded, the count's 4 included (0: none) */
    uint32_t count;
};

/* Reusable scratch for serializing graphs: grows, never shrinks. */
struct apir_graph_scratch {
    const struct ggml_tensor **list;  /* tensors in record order */
    uint32_t list_cap;
    const struct ggml_tensor **set;   /* open-addressed pointer set */
    uint32_t set_cap;
};

/* How a host buffer type sizes a tensor (its get_alloc_size), where the
 * pinned ggml's rule is known: the guest then answers without asking. */
enum apir_alloc_rule {
    APIR_ALLOC_ASK,        /* unknown: ask the host, per shape */
    APIR_ALLOC_NBYTES,     /* ggml_nbytes (ggml's default) */
    APIR_ALLOC_CUDA,       /* ggml-cuda: ggml_nbytes, but FLASH_ATTN_EXT and
                            * quantized rows have their own sizes (asked) */
};

struct apir_buft_ctx {
    uint64_t handle;
    size_t alignment;
    size_t max_size;
    enum apir_alloc_rule alloc_rule;  /* how the host's buffer type sizes a tensor, where known */
    char name[64];
};

/* frontend_buffer.c: the rule a host buffer type, known by its name, sizes
 * tensors by. */
enum apir_alloc_rule apir_buft_alloc_rule(const char *remote_name);

/* Host buffers (frontend_host_buffer.c): shared blobs, found by address. */
#define APIR_MAX_HOST_BLOBS 64
struct apir_host_blob {
    uint8_t *ptr;
    size_t size;
    uint32_t res_id;
    uint32_t generation;  /* the connection that knows res_id */
};

/* Graph uids the host keeps (BACKEND_GRAPH_COMPUTE_KEYED), as many as its
 * slots; a miss only costs sending the graph again. */
#define APIR_KEPT_GRAPHS 4

/*
 * A graph sent as its changes (apir 0.9, guest/graph_delta.c).  A decode
 * step's graph is new each step (its attention grows), yet most of its
 * records are the last step's; the host keeps the last graph it imported
 * (its import memo), so only the records that differ need to travel.  The
 * whole blob is serialized into the guest's own memory (whole), compared
 * with the last one the host accepted (base), and only the delta is
 * written to the data area.  Lock held (remote.lock) throughout.
 */
struct apir_graph_delta {
    uint8_t *whole, *base;    /* this graph's whole blob; the last one the host accepted */
    size_t whole_cap, base_cap, base_size;
    uint64_t base_key;        /* the key the host keeps base under; 0: none */
    /* While a graph is serialized to_whole: the base's records it is
     * compared with as each record is written (NULL: no base), and the
     * indices of those that differ. */
    const uint8_t *cmp;
    uint32_t cmp_n;
    uint32_t *changed, n_changed, changed_cap;
    uint32_t stale_run;       /* deltas answered STALE in a row */
    bool off;                 /* APIR_GRAPH_DELTA=0, or the host let every base go */
    uint64_t sent, stale;     /* deltas sent, and of those answered STALE (APIR_PROFILE) */
};

struct apir_device {
    struct apir_remote remote;        /* remote.device: the device's index on its host (DEVICE_SELECT) */
    uint32_t global_index;            /* its number in the program: APIR<global_index>, across all hosts */
    uint32_t host_no;                 /* which APIR_HOST endpoint it is on (0: the first listed) */
    char name[16];                    /* APIR0, APIR1 ... */
    char description[256];            /* the host's description, its endpoint, its index there */
    enum ggml_backend_dev_type type;
    bool zero_copy;                   /* buffers are shared blobs the host wraps */
    struct ggml_backend_device dev;
    struct ggml_backend_buffer_type buft;
    struct apir_buft_ctx buft_ctx;
    bool has_host_buft;               /* offered as the device's host buffer type */
    bool weight_notes_off;            /* the host keeps no weight copies: stop noting */
    bool weight_cache_off;            /* the host has no weight cache: stop hashing (weight_cache.c) */
    bool events;                      /* caps.async and caps.events offered (APIR_EVENTS, on by default) */
    struct ggml_backend_buffer_type host_buft;
    char host_buft_name[24];
    pthread_mutex_t host_blobs_lock;
    struct apir_host_blob host_blobs[APIR_MAX_HOST_BLOBS];
    uint32_t n_host_blobs;
    pthread_mutex_t cache_lock;
    struct apir_op_cache_entry cache[APIR_OP_CACHE_SETS][APIR_OP_CACHE_WAYS];
    uint64_t cache_clock;
    struct apir_op_series series[APIR_OP_SERIES];  /* under cache_lock */
    struct apir_inputs inputs;        /* under remote.lock */
    bool inputs_off;                  /* APIR_GRAPH_INPUTS=0: every upload goes at once */
    bool series_off;                  /* APIR_ASK_SERIES=0: questions asked one at a time */
    struct apir_graph_scratch graph;
    struct apir_graph_delta delta;    /* under remote.lock */
    uint64_t kept_uids[APIR_KEPT_GRAPHS];
    uint32_t kept_next;
    uint64_t serialize_ns, serialize_count;   /* APIR_PROFILE */
    uint32_t generation;              /* connection the handles above belong to (lock held) */
    uint32_t ggml_refused_generation; /* a connection whose host refused our ggml (said once) */
};

/* A buffer's context: its handle and the opaque base the host gave; or, for
 * a zero-copy buffer, the shared blob that is its memory (base = mapping). */
struct apir_buffer_ctx {
    struct apir_device *device;
    struct apir_conn *conn;   /* the connection it was made on (a reference) */
    uint32_t generation;      /* conn->generation */
    uint64_t handle;
    uint64_t base;
    uint8_t *mapped;      /* zero copy: the buffer's memory, shared with the host */
    size_t mapped_size;
    uint32_t res_id;
    bool has_weight_copies; /* the host keeps copies of weights in it (apir 0.3) */
    bool prefilled;         /* from a host pointer: the bytes are there before init_tensor */
    bool file_backed;       /* mapped is the program's own file mapping: read-only, not ours */
};

/* frontend_buffer.c */
void apir_buft_setup(struct apir_device *d);
/* The device's buffer_from_host_ptr (a model file llama.cpp mapped). */
ggml_backend_buffer_t apir_buffer_from_host_ptr(ggml_backend_dev_t dev, void *ptr, size_t size, size_t max_tensor_size);
bool apir_buffer_is_ours(ggml_backend_buffer_t buffer);

/* frontend_host_buffer.c */
void apir_host_buft_setup(struct apir_device *d);
/* Is [data, data+size) inside one of the device's host buffers?  Then the
 * host can reach it as (res_id, blob_offset). */
bool apir_host_blob_find(struct apir_device *d, const void *data, size_t size, uint32_t *res_id, uint64_t *blob_offset);

/* frontend_device.c */
void apir_device_setup(struct apir_device *d, ggml_backend_reg_t reg);
/* Before making something on the host (lock held): true when the host is
 * reachable, reconnecting to a restarted host if need be (and then asking
 * again what the device's handles are); false, logged, when it is not. */
bool apir_device_ready_locked(struct apir_device *d, const char *what);

/* Was the buffer made on the connection in use?  Else it lived on a host
 * that is gone: its calls fail here, without reaching the new host. */
static inline bool apir_buffer_live(const struct apir_buffer_ctx *bc)
{
    return bc->generation == atomic_load(&bc->device->remote.generation);
}

/* frontend_device.c: events, kept in the guest.  Record: the point the
 * device's command order has reached; synchronize: wait until the host has
 * finished the graphs before it; the device it was recorded on (NULL:
 * never recorded). */
void apir_event_record(ggml_backend_event_t event, struct apir_device *d);
void apir_event_synchronize(ggml_backend_event_t event);
struct apir_device *apir_event_device(ggml_backend_event_t event);

/* frontend_backend.c */
ggml_backend_t apir_backend_new(struct apir_device *d);

/* frontend_compat.c: is the program's ggml the one this library was built
 * for (its version and commit, the sizes and tables it can be asked about,
 * the functions imported above)?  False, with the first difference, what
 * this library was built for and how to build one for the program in why. */
bool apir_ggml_check(char *why, size_t why_size);
/* Does the host compute with the ggml our tensors are numbered by (asks it:
 * HOST_CHECK_GGML)?  False, why in why: use none of its devices. */
bool apir_ggml_host_agrees(struct apir_remote *r, char *why, size_t why_size);
bool apir_ggml_host_agrees_locked(struct apir_remote *r, char *why, size_t why_size);
#define APIR_GGML_HOW_TO_BUILD                                                                          \
    "build libggml-apir.so for this program's ggml: scripts/guest-for.sh with its llama.cpp tree, a git " \
    "bundle of it, or node-llama-cpp@VERSION (README: \"Which ggml a guest may use\")"

/* serialize.c: records of tensors.  False when a tensor cannot be sent
 * (a shape beyond 32 bits; with placement, a buffer that is not ours). */
bool apir_tensor_to_rec(const struct ggml_tensor *t, struct apir_tensor_rec *rec, bool placement);
/* The op and its srcs as a tensor list, normalized (no ids of the guest's
 * memory, no buffers), for supports_op/offload_op/alloc size and the cache
 * key.  Returns the number of records (<= 1 + GGML_MAX_SRC), 0 on failure. */
uint32_t apir_op_records(const struct ggml_tensor *op, struct apir_tensor_rec *recs);
/* The records an alloc-size question needs: type, shape and strides, and
 * for a FLASH_ATTN_EXT result its op records (apir_op_records: ggml-cuda
 * sizes it by its K and V).  Returns their number (recs holds
 * 1 + GGML_MAX_SRC), 0 when the tensor cannot be sent. */
uint32_t apir_alloc_size_record(const struct ggml_tensor *t, struct apir_tensor_rec *recs);
/* Serializes a graph into the device's data area (to_whole: into
 * d->delta.whole, to be sent as a delta); returns its size, or 0:
 * on failure (*n_sent UINT32_MAX), or when no node is left to send (*n_sent
 * 0: no-op views of other devices' memory are left out, see serialize.c).  use_counts: append the
 * nodes' use counts (0.2 keyed graphs only, APIR_GRAPH_USE_COUNTS_TAG).
 * Lock held. */
size_t apir_graph_serialize(struct apir_device *d, const struct ggml_cgraph *graph, bool use_counts, bool to_whole,
                            uint32_t *n_sent);

/* graph_delta.c (struct apir_graph_delta).  Whether the next keyed graph
 * may go as a delta (then serialized to_whole). */
bool apir_graph_delta_wanted(const struct apir_device *d);
/* Room for a whole blob of size bytes and n records in gd->whole, and the
 * base's records set up to be compared with (apir_graph_delta_note). */
bool apir_graph_delta_reserve(struct apir_graph_delta *gd, size_t size, uint32_t n);
/* Record i of the graph being serialized, just written: compared with the
 * base's record i while it is at hand. */
static inline void apir_graph_delta_note(struct apir_graph_delta *gd, uint32_t i, const void *rec)
{
    if (!gd->cmp)
        return;
    if (i >= gd->cmp_n || memcmp(rec, gd->cmp + (size_t)i * APIR_TENSOR_REC_SIZE, APIR_TENSOR_REC_SIZE) != 0)
        gd->changed[gd->n_changed++] = i;
}
/* Writes the delta of d->delta.whole (size bytes) against the base into the
 * data area at 0; returns its size, or 0 when the graph goes whole (no
 * base, or most records changed). */
size_t apir_graph_delta_build(struct apir_device *d, size_t size);
/* The whole blob into the data area's memory at 0, as if serialized there
 * (a graph sent whole after all). */
bool apir_graph_delta_whole_to_data(struct apir_device *d, size_t size);
/* After the host's answer (rc) to the keyed graph key, serialized to_whole
 * (size bytes) or not, sent as_delta or whole: an accepted graph serialized
 * to_whole becomes the base. */
void apir_graph_delta_done(struct apir_device *d, uint64_t key, bool to_whole, size_t size, bool as_delta, int rc);
/* A delta answered STALE: the host let its base go. */
void apir_graph_delta_stale(struct apir_device *d);
/* The host's memo no longer holds the base (an APIR 0.1 graph, a buffer freed). */
void apir_graph_delta_forget(struct apir_device *d);

/* Cached op queries (frontend_device.c); kind: which question (the wire's
 * apir_ask_question numbers). */
enum apir_op_query { APIR_Q_SUPPORTS = APIR_ASK_SUPPORTS_OP, APIR_Q_OFFLOAD = APIR_ASK_OFFLOAD_OP,
                     APIR_Q_ALLOC_SIZE = APIR_ASK_ALLOC_SIZE };

/* frontend_buffer.c: small uploads that wait for the graph (struct
 * apir_inputs).  defer: keeps [data, data + size) for tensor's range at
 * offset in the device's inputs, false when it does not qualify (then
 * nothing was kept); lock held.  flush: sends those waiting as plain
 * uploads, before any command other than a graph that carries them (lock
 * held, or taken by apir_inputs_flush). */
bool apir_inputs_defer_locked(struct apir_buffer_ctx *bc, const struct ggml_tensor *tensor, const void *data,
                              size_t offset, size_t size);
void apir_inputs_flush_locked(struct apir_device *d);
void apir_inputs_flush(struct apir_device *d);
bool apir_op_query(struct apir_device *d, enum apir_op_query kind, const struct ggml_tensor *op, uint64_t *value);

#endif
