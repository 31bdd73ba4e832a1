/*
 * Guest-side serialization of tensors and graphs into APIR records.
 */
#include "frontend.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml-impl.h"

#include <stdlib.h>
#include <string.h>

static uint64_t tensor_id(const struct ggml_tensor *t) { return (uint64_t)(uintptr_t)t; }

/* A zeroed record with t's type, shape and strides; false (logged) where a
 * dimension or stride is beyond 32 bits. */
static bool rec_start(const struct ggml_tensor *t, struct apir_tensor_rec *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->type = (uint32_t)t->type;
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] < 0 || (uint64_t)t->ne[i] > UINT32_MAX || t->nb[i] > UINT32_MAX) {
            APIR_WARN("guest", "tensor '%s' has a dimension or stride beyond 32 bits: not sendable", t->name);
            return false;
        }
        rec->ne[i] = (uint32_t)t->ne[i];
        rec->nb[i] = (uint32_t)t->nb[i];
    }
    return true;
}

bool apir_tensor_to_rec(const struct ggml_tensor *t, struct apir_tensor_rec *rec, bool placement)
{
    if (!rec_start(t, rec))
        return false;
    rec->id = tensor_id(t);
    rec->op = (uint32_t)t->op;
    memcpy(rec->op_params, t->op_params, sizeof(rec->op_params));
    rec->flags = t->flags;
    for (int i = 0; i < GGML_MAX_SRC; i++)
        rec->src[i] = t->src[i] ? tensor_id(t->src[i]) : 0;
    rec->view_src = t->view_src ? tensor_id(t->view_src) : 0;
    rec->view_offs = t->view_offs;
    memcpy(rec->name, t->name, sizeof(rec->name));
    rec->name[sizeof(rec->name) - 1] = '\0';
    ggml_backend_buffer_t buf = t->buffer;
    if (placement && buf && t->data) {
        if (!apir_buffer_is_ours(buf)) {
            APIR_WARN("guest", "tensor '%s' is in buffer %s, not an APIR buffer", t->name, ggml_backend_buffer_name(buf));
            return false;
        }
        const struct apir_buffer_ctx *bc = buf->context;
        if (!apir_buffer_live(bc)) {
            APIR_ERROR("guest", "tensor '%s' was on a host that is gone (its buffer went with it)", t->name);
            return false;
        }
        rec->buffer = bc->handle;
        rec->data = (uint64_t)((uintptr_t)t->data - (uintptr_t)bc->base);
    }
    return true;
}

/*
 * A tensor as a question's record: only what decides the answer is sent,
 * and so keys the cache (frontend_device.c): the op, its parameters, and
 * the type, shape, strides and flags of it and of its sources (an
 * optimizer step takes only a parameter).  Placement and names do not
 * decide it (leaving them out also keeps the guest's addresses private);
 * nor does how the sources were made: a source goes as an op-less tensor.
 * A view's parameter is its offset, which moves every token in a graph
 * that views a growing cache (whisper's positional embeddings): left out,
 * the same question is the same key from one step to the next.  Every
 * other word stays zero (the cache's key skips them).  False as rec_start.
 */
static bool question_rec(const struct ggml_tensor *t, struct apir_tensor_rec *rec, bool source)
{
    if (!rec_start(t, rec))
        return false;
    rec->flags = t->flags;
    if (!source) {
        rec->op = (uint32_t)t->op;
        if (t->op != GGML_OP_VIEW)
            memcpy(rec->op_params, t->op_params, sizeof(rec->op_params));
    }
    return true;
}

uint32_t apir_op_records(const struct ggml_tensor *op, struct apir_tensor_rec *recs)
{
    uint32_t n = 0;
    if (!question_rec(op, &recs[n], false))
        return 0;
    recs[n].id = 1;
    n++;
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (!op->src[i])
            continue;
        if (!question_rec(op->src[i], &recs[n], true))
            return 0;
        recs[n].id = 2 + (uint64_t)i;  /* a source's id is its slot */
        recs[0].src[i] = recs[n].id;
        n++;
    }
    return n;
}

uint32_t apir_alloc_size_record(const struct ggml_tensor *t, struct apir_tensor_rec *recs)
{
    /* ggml-cuda sizes a FLASH_ATTN_EXT result by the op and its K and V (its
     * f16 copies of them live after the result): those go along. */
    if (t->op == GGML_OP_FLASH_ATTN_EXT)
        return apir_op_records(t, recs);
    /* Any other size follows from the type and shape alone. */
    if (!question_rec(t, &recs[0], true))
        return 0;
    recs[0].id = 1;
    recs[0].flags = 0;
    return 1;
}

static uint32_t ptr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static bool scratch_reserve(struct apir_graph_scratch *g, uint32_t n)
{
    if (n > g->list_cap) {
        uint32_t cap = g->list_cap ? g->list_cap : 1024;
        while (cap < n)
            cap *= 2;
        const struct ggml_tensor **l = realloc(g->list, cap * sizeof(*l));
        if (!l)
            return false;
        g->list = l;
        g->list_cap = cap;
    }
    /* The set is empty between graphs (set_clear): zeroed here only when
     * new, not per graph - its size follows the largest graph ever sent (a
     * 193-node whisper step paid a 64 KiB memset for its ~290 tensors). */
    if (2 * n > g->set_cap) {
        uint32_t cap = g->set_cap ? g->set_cap : 2048;
        while (cap < 2 * n)
            cap *= 2;
        free(g->set);
        g->set = calloc(cap, sizeof(*g->set));
        if (!g->set) {
            g->set_cap = 0;
            return false;
        }
        g->set_cap = cap;
    }
    return true;
}

/*
 * Empties the set of the n tensors list[0..n) added to it, latest first:
 * with linear probing a tensor's probe path holds only tensors added before
 * it, so each is still found where it was put when its turn comes.
 */
static void set_clear(struct apir_graph_scratch *g, uint32_t n)
{
    const uint32_t mask = g->set_cap - 1;
    for (uint32_t k = n; k-- > 0;) {
        for (uint32_t i = ptr_hash(g->list[k]) & mask;; i = (i + 1) & mask) {
            if (g->set[i] == g->list[k]) {
                g->set[i] = NULL;
                break;
            }
            if (!g->set[i])
                break;  /* not there: cannot happen (added above) */
        }
    }
}

/* Adds t if new; returns false when the scratch is full. */
static bool visit_add(struct apir_graph_scratch *g, uint32_t *n, const struct ggml_tensor *t)
{
    uint32_t mask = g->set_cap - 1;
    for (uint32_t i = ptr_hash(t) & mask;; i = (i + 1) & mask) {
        if (g->set[i] == t)
            return true;
        if (!g->set[i]) {
            if (*n >= g->list_cap || 2 * (*n + 1) > g->set_cap)
                return false;
            g->set[i] = t;
            g->list[(*n)++] = t;
            return true;
        }
    }
}

/* The node's uses in the guest's whole graph: a split is a view that shares
 * the whole graph's hash set and counts (ggml_graph_view). */
static uint32_t node_use_count(const struct ggml_cgraph *graph, int i)
{
#if APIR_GGML_HAS_NODE_USE_COUNT
    if (graph->visited_hash_set.size == 0 || !graph->use_counts)
        return 0;
    int32_t n = ggml_node_get_use_count(graph, i);
    return n > 0 ? (uint32_t)n : 0;
#else
    /* A ggml without the count's accessor also has no graph uids, so no
     * keyed graphs, the only ones that carry counts. */
    (void)graph;
    (void)i;
    return 0;
#endif
}

/* Is the buffer another device's: not ours, or an APIR buffer of another
 * APIR device (another connection, perhaps another host: its handles mean
 * nothing on this device's connection)? */
static bool buffer_elsewhere(const struct apir_device *d, ggml_backend_buffer_t buf)
{
    return buf != NULL &&
           (!apir_buffer_is_ours(buf) || ((const struct apir_buffer_ctx *)buf->context)->device != d);
}

/*
 * A node no backend computes (a view, reshape, permute, transpose or an
 * op-less tensor) whose memory is not in one of this device's buffers.
 * ggml's scheduler cuts a graph into splits by the nodes that compute and
 * leaves such no-ops in whichever split their position falls: a recurrent
 * or encoder-decoder model's graph puts views of tensors in the CPU's
 * buffers among a device's nodes, though no node of that device reads them
 * (a node that did would read a copy the scheduler made); so may a model
 * split across two APIR devices.  They are left out of the graph sent; a
 * node that computes with one still pulls it in as a source, and its record
 * is refused as before.
 */
static bool node_is_foreign_noop(const struct apir_device *d, const struct ggml_tensor *t)
{
    if (!ggml_op_is_empty(t->op))
        return false;
    return buffer_elsewhere(d, t->view_src ? t->view_src->buffer : t->buffer);
}

/* apir_graph_serialize, with the tensors it put in the set counted in *added
 * (the caller empties the set, whichever way this returns). */
static size_t serialize(struct apir_device *d, const struct ggml_cgraph *graph, bool use_counts, bool to_whole,
                        uint32_t *n_sent, uint32_t *added)
{
    struct apir_graph_scratch *g = &d->graph;
    const int n_nodes = ggml_graph_n_nodes((struct ggml_cgraph *)graph);
    /* Every tensor reachable from a node: nodes, srcs, view sources.  The
     * worst case is bounded by nodes * (1 + srcs + view); grow to it. */
    uint32_t bound = (uint32_t)n_nodes * (GGML_MAX_SRC + 2) + 16;
    if (!scratch_reserve(g, bound))
        return 0;
    uint32_t n = 0, n_listed = 0;
    for (int i = 0; i < n_nodes; i++) {
        const struct ggml_tensor *node = ggml_graph_node((struct ggml_cgraph *)graph, i);
        if (node_is_foreign_noop(d, node))
            continue;
        n_listed++;
        if (!visit_add(g, &n, node)) {
            *added = n;
            return 0;
        }
    }
    /* The distinct nodes are the first n_kept records, in graph order. */
    const uint32_t n_kept = n;
    /* Walk the list as it grows: srcs and view sources of every entry. */
    bool full = false;
    for (uint32_t k = 0; k < n && !full; k++) {
        const struct ggml_tensor *t = g->list[k];
        for (int s = 0; s < GGML_MAX_SRC && !full; s++)
            full = t->src[s] && !visit_add(g, &n, t->src[s]);
        full = full || (t->view_src && !visit_add(g, &n, t->view_src));
    }
    *added = n;
    if (full)
        return 0;
    *n_sent = n_listed;
    if (n_kept == 0)
        return 0;
    size_t size = 4 + (size_t)n_listed * 8 + 4 + (size_t)n * APIR_TENSOR_REC_SIZE;
    if (use_counts)
        size += 4 + (size_t)n_listed * 4;
    struct apir_encoder enc;
    if (to_whole) {
        if (!apir_graph_delta_reserve(&d->delta, size, n))
            return 0;
        apir_encoder_init(&enc, d->delta.whole, d->delta.whole_cap);
    } else {
        if (!apir_remote_data_reserve(&d->remote, size))
            return 0;
        apir_encoder_init(&enc, d->remote.data, d->remote.data_size);
    }
    /* The node list as the graph lists it: a node listed twice computes
     * twice, as it does natively (an in-place accumulation listed twice
     * adds twice; test-backend-ops' perf mode lists one node many times),
     * and its record goes once. */
    apir_encode_u32(&enc, n_listed);
    for (int i = 0; i < n_nodes; i++) {
        const struct ggml_tensor *node = ggml_graph_node((struct ggml_cgraph *)graph, i);
        if (!node_is_foreign_noop(d, node))
            apir_encode_u64(&enc, tensor_id(node));
    }
    apir_encode_u32(&enc, n);
    for (uint32_t k = 0; k < n; k++) {
        const struct ggml_tensor *t = g->list[k];
        if (t->data && t->buffer && apir_buffer_is_ours(t->buffer) && buffer_elsewhere(d, t->buffer)) {
            APIR_ERROR("guest", "%s: tensor '%s' is in a buffer of %s, another APIR device", d->name, t->name,
                       ((const struct apir_buffer_ctx *)t->buffer->context)->device->name);
            return 0;
        }
        struct apir_tensor_rec *rec = apir_encode_reserve(&enc, APIR_TENSOR_REC_SIZE);
        if (!rec || !apir_tensor_to_rec(t, rec, true))
            return 0;
        if (to_whole)
            apir_graph_delta_note(&d->delta, k, rec);
    }
    if (use_counts) {
        apir_encode_u32(&enc, APIR_GRAPH_USE_COUNTS_TAG);
        for (int i = 0; i < n_nodes; i++)
            if (!node_is_foreign_noop(d, ggml_graph_node((struct ggml_cgraph *)graph, i)))
                apir_encode_u32(&enc, node_use_count(graph, i));
    }
    return enc.fatal ? 0 : apir_encoder_used(&enc);
}

size_t apir_graph_serialize(struct apir_device *d, const struct ggml_cgraph *graph, bool use_counts, bool to_whole,
                            uint32_t *n_sent)
{
    *n_sent = UINT32_MAX;  /* until the nodes to send are known */
    uint32_t added = 0;
    size_t size = serialize(d, graph, use_counts, to_whole, n_sent, &added);
    set_clear(&d->graph, added);
    return size;
}
