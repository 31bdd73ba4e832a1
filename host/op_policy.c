#include "op_policy.h"
#include "upload_mirror.h"
#include "wait.h"

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend.h"

#include <stdlib.h>
#include <string.h>

/* A distinct index input of a graph: one (tensor, limit) pair (every layer's
 * SET_ROWS shares the same k_idxs). */
struct index_use {
    struct ggml_tensor *idx;        /* the guest's tensor */
    struct ggml_tensor *shadow;     /* host-private copy the ops read, or NULL */
    int64_t limit;                  /* values must be in [0, limit) */
    int last;                       /* last node that reads it */
    bool late;                      /* an earlier node writes its memory */
};

/* The index input of a node (which src slot), if its op has one. */
static bool index_input(const struct ggml_tensor *n, int *slot, int64_t *limit)
{
    switch (n->op) {
    case GGML_OP_GET_ROWS:
        *slot = 1;
        *limit = n->src[0] ? n->src[0]->ne[1] : 0;
        return true;
    case GGML_OP_GET_ROWS_BACK:
    case GGML_OP_SET_ROWS:
        *slot = 1;
        *limit = n->ne[1];
        return true;
    case GGML_OP_MUL_MAT_ID:
        *slot = 2;
        *limit = n->src[0] ? n->src[0]->ne[2] : 0;
        return true;
    case GGML_OP_ADD_ID:
        *slot = 2;
        *limit = n->src[1] ? n->src[1]->ne[1] : 0;
        return true;
    case GGML_OP_SSM_SCAN:
        *slot = 6;
        *limit = n->src[0] ? n->src[0]->ne[3] : 0;
        return true;
    default:
        return false;
    }
}

/* The view [offset, offset + extent of src1 with strides nb1..3) inside dst. */
static bool set_view_fits(const struct ggml_tensor *n)
{
    const struct ggml_tensor *src1 = n->src[1];
    if (!src1 || !n->src[0])
        return false;
    const int32_t *p = n->op_params;
    if (p[0] < 0 || p[1] < 0 || p[2] < 0 || p[3] < 0)
        return false;
    uint64_t end = (uint64_t)p[3] + ggml_row_size(src1->type, src1->ne[0]);
    const uint64_t nb[3] = { (uint64_t)p[0], (uint64_t)p[1], (uint64_t)p[2] };
    for (int i = 1; i < 4; i++) {
        uint64_t term;
        if (src1->ne[i] <= 0)
            return true;  /* empty */
        if (__builtin_mul_overflow((uint64_t)(src1->ne[i] - 1), nb[i - 1], &term) || __builtin_add_overflow(end, term, &end))
            return false;
    }
    return end <= ggml_nbytes(n) && end <= ggml_nbytes(n->src[0]);
}

static const char *check_params(const struct ggml_tensor *n)
{
    switch (n->op) {
    case GGML_OP_SET:
    case GGML_OP_ACC:
        return set_view_fits(n) ? NULL : "SET/ACC view outside its destination";
    case GGML_OP_CONCAT:
        return (n->op_params[0] >= 0 && n->op_params[0] < GGML_MAX_DIMS) ? NULL : "CONCAT dimension out of range";
    case GGML_OP_UNARY:
        return (n->op_params[0] >= 0 && n->op_params[0] < GGML_UNARY_OP_COUNT) ? NULL : "unknown unary op";
    case GGML_OP_GLU:
        return (n->op_params[0] >= 0 && n->op_params[0] < GGML_GLU_OP_COUNT) ? NULL : "unknown GLU op";
    default:
        return NULL;
    }
}

static bool ranges_overlap(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    if (a->buffer != b->buffer || !a->data || !b->data)
        return false;
    const uint8_t *a0 = a->data, *b0 = b->data;
    return a0 < b0 + ggml_nbytes(b) && b0 < a0 + ggml_nbytes(a);
}

/* Takes the values the op will read: for a shadowed index, copies the
 * guest's memory into the private copy first, so what is checked is what
 * is used.  Then checks each value against [0, limit). */
static const char *take_and_check(struct apir_session *s, const struct index_use *u)
{
    const struct ggml_tensor *t = u->shadow ? u->shadow : u->idx;
    if (t->type != GGML_TYPE_I32 && t->type != GGML_TYPE_I64)
        return "index tensor is not I32/I64";
    if (!u->idx->buffer || !u->idx->data)
        return "index tensor without memory";
    size_t nbytes = ggml_nbytes(t);
    const uint8_t *base = t->data;
    const uint8_t *kept = NULL;
    if (!u->shadow && !ggml_backend_buffer_is_host(t->buffer) && !u->late)
        kept = apir_mirror_find(s, t->buffer, t->data, nbytes);
    /* Every other read of index memory waits for the device first: a graph
     * left in flight (dispatch.c run_graph) may still be writing it, and
     * queued uploads are on another stream than the read. */
    if (!kept)
        apir_session_settle(s);
    if (u->shadow)
        memcpy(u->shadow->data, u->idx->data, nbytes);
    if (kept) {
        base = kept;  /* the host copy of what the guest uploaded there */
    } else if (!u->shadow && !ggml_backend_buffer_is_host(t->buffer)) {
        if (nbytes > s->policy_scratch_size) {
            void *p = realloc(s->policy_scratch, nbytes);
            if (!p)
                return "out of memory for index validation";
            s->policy_scratch = p;
            s->policy_scratch_size = nbytes;
        }
        ggml_backend_tensor_get((struct ggml_tensor *)t, s->policy_scratch, 0, nbytes);
        base = s->policy_scratch;
    }
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const uint8_t *row = base + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    int64_t v;
                    if (t->type == GGML_TYPE_I32) {
                        int32_t x;
                        memcpy(&x, row + i0 * t->nb[0], 4);
                        v = x;
                    } else {
                        memcpy(&v, row + i0 * t->nb[0], 8);
                    }
                    if (v < 0 || v >= u->limit)
                        return "index value out of range";
                }
            }
    return NULL;
}

static bool buffer_is_guest_shared(struct apir_session *s, ggml_backend_buffer_t buf)
{
    for (uint32_t i = 0; i < s->handles.capacity; i++) {
        struct apir_handle_slot *slot = &s->handles.slots[i];
        if (slot->kind == APIR_HANDLE_BUFFER && ((struct apir_host_buffer *)slot->object)->buffer == buf)
            return ((struct apir_host_buffer *)slot->object)->pinned_blob != 0;
    }
    return true;  /* unknown: treat as the worst case */
}

/*
 * An index tensor in guest-shared memory (DEVICE_BUFFER_FROM_PTR) could be
 * changed by the guest between the check and the op.  The op reads a
 * host-private copy instead: a shadow tensor, same shape and strides, whose
 * data is filled from the guest's memory right before each check.  Shadows
 * belong to the imported graph's scratch, so a kept graph keeps them.
 */
static struct ggml_tensor *shadow_of(struct apir_import_scratch *sc, const struct ggml_tensor *idx)
{
    for (uint32_t i = 0; i < sc->n_shadows; i++)
        if (sc->shadows[i].orig == idx || sc->shadows[i].shadow == idx)
            return sc->shadows[i].shadow;
    return NULL;
}

static struct ggml_tensor *orig_of(struct apir_import_scratch *sc, struct ggml_tensor *t)
{
    for (uint32_t i = 0; i < sc->n_shadows; i++)
        if (sc->shadows[i].shadow == t)
            return sc->shadows[i].orig;
    return t;
}

static struct ggml_tensor *make_shadow(struct apir_import_scratch *sc, struct ggml_tensor *idx)
{
    if (sc->n_shadows == APIR_MAX_SHADOWS)
        return NULL;
    struct ggml_tensor *sh = ggml_new_tensor(sc->ctx, idx->type, GGML_MAX_DIMS, idx->ne);
    void *mem = sh ? malloc(ggml_nbytes(idx) ? ggml_nbytes(idx) : 1) : NULL;
    if (!mem)
        return NULL;
    memcpy(sh->nb, idx->nb, sizeof(sh->nb));
    sh->buffer = idx->buffer;  /* host memory, as the original's */
    sh->data = mem;
    sc->shadows[sc->n_shadows].orig = idx;
    sc->shadows[sc->n_shadows].shadow = sh;
    sc->shadows[sc->n_shadows].mem = mem;
    sc->n_shadows++;
    return sh;
}

static enum ggml_status compute_segment(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph,
                                        int i0, int i1);

/* cfg.op_profile: every node as a graph of its own, waited for and timed. */
static enum ggml_status compute_profiled(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph,
                                         int i0, int i1)
{
    for (int i = i0; i < i1; i++) {
        const struct ggml_tensor *node = ggml_graph_node(graph, i);
        uint64_t t0 = apir_now_ns();
        enum ggml_status st = compute_segment(s, backend, graph, i, i + 1);
        ggml_backend_synchronize(backend);
        if (st != GGML_STATUS_SUCCESS)
            return st;
        if (!ggml_op_is_empty(node->op) && (unsigned)node->op < GGML_OP_COUNT) {
            s->op_ns[node->op] += apir_now_ns() - t0;
            s->op_count[node->op]++;
        }
    }
    return GGML_STATUS_SUCCESS;
}

/* Computes nodes [i0, i1) as one graph. */
static enum ggml_status compute_range(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph, int i0,
                                      int i1)
{
    if (s->host->cfg.op_profile)
        return compute_profiled(s, backend, graph, i0, i1);
    return compute_segment(s, backend, graph, i0, i1);
}

static enum ggml_status compute_segment(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph,
                                        int i0, int i1)
{
    s->n_segments++;
    /* Launched, not waited for: a piece followed by another is synchronized
     * by the caller; the last one is left in flight (run_graph decides). */
    if (i0 == 0 && i1 == ggml_graph_n_nodes(graph))
        return ggml_backend_graph_compute_async(backend, graph);
    /* One segment graph per imported graph, in the context that holds it
     * (the import reserved room for it). */
    struct apir_import_scratch *sc = s->import_sc;
    if (!sc->segment_graph) {
        sc->segment_graph = ggml_new_graph_custom(sc->ctx, (size_t)ggml_graph_n_nodes(graph), false);
        if (!sc->segment_graph)
            return GGML_STATUS_ALLOC_FAILED;
        sc->segment_graph_size = ggml_graph_n_nodes(graph);
    }
    ggml_graph_clear(sc->segment_graph);
    for (int i = i0; i < i1; i++)
        ggml_graph_add_node(sc->segment_graph, ggml_graph_node(graph, i));
    return ggml_backend_graph_compute_async(backend, sc->segment_graph);
}

/* Indices computed by ARGSORT or TOP_K lie in [0, src->ne[0]) by
 * construction: when that is the only writer and it covers the index tensor,
 * no split is needed (MoE routing would otherwise split every layer). */
static bool written_by_sort_only(struct ggml_cgraph *graph, const struct index_use *u)
{
    const struct ggml_tensor *sorter = NULL;
    for (int j = 0; j < u->last; j++) {
        const struct ggml_tensor *w = ggml_graph_node(graph, j);
        if (ggml_op_is_empty(w->op) || !ranges_overlap(w, u->idx))
            continue;
        if ((w->op != GGML_OP_ARGSORT && w->op != GGML_OP_TOP_K) || sorter)
            return false;
        sorter = w;
    }
    if (!sorter || !sorter->src[0] || sorter->src[0]->ne[0] > u->limit)
        return false;
    const uint8_t *w0 = sorter->data, *i0 = u->idx->data;
    return i0 >= w0 && i0 + ggml_nbytes(u->idx) <= w0 + ggml_nbytes(sorter);
}

static struct index_use *find_use(struct apir_session *s, const struct ggml_tensor *idx, int64_t limit)
{
    struct index_use *uses = s->policy_uses;
    for (int u = 0; u < s->policy_n_uses; u++)
        if (uses[u].idx == idx && uses[u].limit == limit)
            return &uses[u];
    return NULL;
}

static struct index_use *add_use(struct apir_session *s)
{
    if (s->policy_n_uses == s->policy_uses_cap) {
        int cap = s->policy_uses_cap ? 2 * s->policy_uses_cap : 16;
        void *p = realloc(s->policy_uses, (size_t)cap * sizeof(struct index_use));
        if (!p)
            return NULL;
        s->policy_uses = p;
        s->policy_uses_cap = cap;
    }
    struct index_use *u = &((struct index_use *)s->policy_uses)[s->policy_n_uses++];
    memset(u, 0, sizeof(*u));
    return u;
}

enum ggml_status apir_policy_compute(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph,
                                     const char **why)
{
    struct apir_import_scratch *sc = s->import_sc;
    const int n = ggml_graph_n_nodes(graph);
    s->policy_n_uses = 0;
    *why = NULL;

    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        if ((*why = check_params(node)))
            return GGML_STATUS_ABORTED;
        int slot;
        int64_t limit;
        if (!index_input(node, &slot, &limit))
            continue;
        struct ggml_tensor *idx = node->src[slot] ? orig_of(sc, node->src[slot]) : NULL;
        if (!idx) {
            *why = "index op without its index input";
            return GGML_STATUS_ABORTED;
        }
        struct index_use *u = find_use(s, idx, limit);
        if (!u) {
            if (!(u = add_use(s))) {
                *why = "out of memory for index validation";
                return GGML_STATUS_ABORTED;
            }
            u->idx = idx;
            u->limit = limit;
            u->shadow = shadow_of(sc, idx);
            if (!u->shadow && buffer_is_guest_shared(s, idx->buffer)) {
                if (!ggml_backend_buffer_is_host(idx->buffer) || !(u->shadow = make_shadow(sc, idx))) {
                    *why = "index tensor in guest-shared memory cannot be copied";
                    return GGML_STATUS_ABORTED;
                }
            }
        }
        u->last = i;
        if (u->shadow)
            node->src[slot] = u->shadow;  /* the op reads the checked copy */
    }

    /* Which index inputs does a node before their last use write (aliasing
     * included)?  Those are checked right before each use; the others once,
     * now. */
    struct index_use *uses = s->policy_uses;
    for (int u = 0; u < s->policy_n_uses; u++) {
        for (int j = 0; j < uses[u].last && !uses[u].late; j++) {
            const struct ggml_tensor *w = ggml_graph_node(graph, j);
            uses[u].late = !ggml_op_is_empty(w->op) && ranges_overlap(w, uses[u].idx);
        }
        /* A sort's output is in range by construction, but a shadow must
         * still be refreshed at the use. */
        if (uses[u].late && !uses[u].shadow && written_by_sort_only(graph, &uses[u]))
            uses[u].late = false;
        else if (!uses[u].late && (*why = take_and_check(s, &uses[u])))
            return GGML_STATUS_ABORTED;
    }

    int start = 0;
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *node = ggml_graph_node(graph, i);
        int slot;
        int64_t limit;
        if (!index_input(node, &slot, &limit))
            continue;
        struct index_use *u = find_use(s, orig_of(sc, node->src[slot]), limit);
        if (!u->late)
            continue;
        if (i > start) {
            enum ggml_status st = compute_range(s, backend, graph, start, i);
            if (st != GGML_STATUS_SUCCESS)
                return st;
            ggml_backend_synchronize(backend);
            start = i;
        }
        if ((*why = take_and_check(s, u)))
            return GGML_STATUS_ABORTED;
    }
    return compute_range(s, backend, graph, start, n);
}
