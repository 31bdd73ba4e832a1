#include "op_policy.h"
#include "op_fusion.h"
#include "upload_mirror.h"
#include "wait.h"

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend.h"

#include <stdlib.h>
#include <string.h>

/*
 * How a kernel reads an index tensor: elements of `type` at
 *     data + i0*nb[0] + i1*nb[1] + i2*nb[2] + i3*nb[3],   ik in [0, n[k]),
 * each of which must lie in [0, limit).  The walk is the kernel's own (the
 * CPU kernels of the pinned ggml: ggml-cpu/ops.cpp, and ggml-cpu.c for
 * MUL_MAT_ID): some read by the index tensor's strides over a range that
 * ANOTHER tensor's shape gives, some read a dense array whatever the
 * strides.  For a graph made by ggml's constructors those walks are the
 * index tensor's own elements; for a hostile one they are not, and it is
 * the kernel's walk that touches memory, so that is what is checked.
 */
struct index_read {
    int64_t n[GGML_MAX_DIMS];
    uint64_t nb[GGML_MAX_DIMS];
    enum ggml_type type;            /* what the kernel reads: I32 or I64 */
    int64_t limit;                  /* values must be in [0, limit) */
    bool distinct;                  /* and differ along dimension 0 (MUL_MAT_ID: below) */
};

/* A distinct index input of a graph: one (tensor, read) pair (every layer's
 * SET_ROWS shares the same k_idxs, read the same way). */
struct index_use {
    struct ggml_tensor *idx;        /* the guest's tensor */
    struct ggml_tensor *shadow;     /* host-private copy the ops read, or NULL */
    struct index_read read;
    int first, last;                /* first and last node that read it */
    bool late;                      /* an earlier node writes its memory */
};

/* The session's policy state (s->policy): reused from graph to graph. */
struct apir_policy {
    uint8_t *scratch;               /* index values copied out of device memory */
    size_t scratch_size;
    int64_t *row;                   /* one row's values, sorted (check_values) */
    int64_t row_cap;
    struct index_use *uses;         /* the graph being checked's */
    int n_uses, uses_cap;
};

struct apir_policy *apir_policy_new(void)
{
    return calloc(1, sizeof(struct apir_policy));
}

void apir_policy_free(struct apir_policy *p)
{
    if (!p)
        return;
    free(p->scratch);
    free(p->row);
    free(p->uses);
    free(p);
}

static void read_strided(struct index_read *rd, const struct ggml_tensor *idx, int64_t n0, int64_t n1, int64_t n2,
                         int64_t n3)
{
    const int64_t n[GGML_MAX_DIMS] = { n0, n1, n2, n3 };
    for (int k = 0; k < GGML_MAX_DIMS; k++) {
        rd->n[k] = n[k];
        rd->nb[k] = idx->nb[k];
    }
}

/* count elements of elem_size bytes, one after the other from data. */
static void read_dense(struct index_read *rd, int64_t count, size_t elem_size)
{
    for (int k = 0; k < GGML_MAX_DIMS; k++) {
        rd->n[k] = 1;
        rd->nb[k] = 0;
    }
    rd->n[0] = count;
    rd->nb[0] = elem_size;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/*
 * The index input of a node (which src slot) and how its kernel reads it,
 * if its op has one.  Every op whose kernel uses int values as addresses is
 * here.  ROPE's positions are values in trigonometry (a wrong one is a wrong
 * angle, not an access; the kernel reads them as a dense array of as many
 * elements as the constructor gives the tensor, which op_shapes.c keeps
 * inside its extent); COUNT_EQUAL's are compared; ARGSORT/TOP_K/ARGMAX
 * write indices; no other CPU kernel reads an int tensor's values.
 * *why is set when the node cannot be read safely at all.
 */
static bool index_read_of(const struct ggml_tensor *n, int *slot, struct index_read *rd, const char **why)
{
    const struct ggml_tensor *s0 = n->src[0], *s1 = n->src[1];
    *why = NULL;
    rd->type = GGML_TYPE_I32;  /* all but SET_ROWS cast the data to int32_t */
    rd->distinct = false;
    switch (n->op) {
    case GGML_OP_GET_ROWS: {
        /* get_rows_*: i over nelements(src1), split by ne10 and ne11: the
         * third index runs to ne12*ne13, by nb12. */
        int64_t n2;
        *slot = 1;
        if (!s0 || !s1 || __builtin_mul_overflow(s1->ne[2], s1->ne[3], &n2))
            break;
        read_strided(rd, s1, s1->ne[0], s1->ne[1], n2, 1);
        rd->nb[3] = 0;
        rd->limit = s0->ne[1];
        return true;
    }
    case GGML_OP_GET_ROWS_BACK:
        /* ((int32_t *) src1->data)[i], i < nelements(src1): dense. */
        *slot = 1;
        if (!s1)
            break;
        read_dense(rd, ggml_nelements(s1), sizeof(int32_t));
        rd->limit = n->ne[1];
        return true;
    case GGML_OP_SET_ROWS:
        /* set_rows_impl: i < ne01 along nb10, i02 % ne11 along nb11,
         * i03 % ne12 along nb12; idx_t is src1's type. */
        *slot = 1;
        if (!s0 || !s1)
            break;
        if (s1->ne[1] <= 0 || s1->ne[2] <= 0) {
            *why = "SET_ROWS index tensor with an empty broadcast dimension";
            return true;
        }
        read_strided(rd, s1, s0->ne[1], min64(s1->ne[1], s0->ne[2]), min64(s1->ne[2], s0->ne[3]), 1);
        rd->type = s1->type;
        rd->limit = n->ne[1];
        return true;
    case GGML_OP_MUL_MAT_ID:
        /* mul_mat_id grouping: iid1 < ids->ne[1], id < ids->ne[0], by ids' strides.
         * A token's experts differ: ggml-cuda's grouping (ggml_cuda_mul_mat_id)
         * takes one row of a token per expert and asserts it found them all
         * (a worker abort, seen on an H100); a router's top-k never repeats. */
        *slot = 2;
        if (!s0 || !n->src[2])
            break;
        read_strided(rd, n->src[2], n->src[2]->ne[0], n->src[2]->ne[1], 1, 1);
        rd->limit = s0->ne[2];
        rd->distinct = true;
        return true;
    case GGML_OP_ADD_ID:
        /* add_id_f32: i1 < ne1, i2 < ne2 of the RESULT, along nb20, nb21. */
        *slot = 2;
        if (!s1 || !n->src[2])
            break;
        read_strided(rd, n->src[2], n->ne[1], n->ne[2], 1, 1);
        rd->limit = s1->ne[1];
        return true;
    case GGML_OP_SSM_SCAN:
        /* ssm_scan_f32: ids[i3], i3 < ns = src1->ne[3]: dense. */
        *slot = 6;
        if (!s0 || !s1)
            break;
        read_dense(rd, s1->ne[3], sizeof(int32_t));
        rd->limit = s0->ne[3];
        return true;
    default:
        return false;
    }
    *why = "index op without its inputs";
    return true;
}

/*
 * Where the kernel's walk ends, past the index tensor's data: the largest
 * offset it reads plus one element.  False when it overflows.  *count: how
 * many elements the walk reads.  A walk of nothing (a zero count) reads no
 * memory: *end is 0.
 */
static bool read_extent(const struct index_read *rd, uint64_t *end, uint64_t *count)
{
    *end = 0;
    *count = 1;
    for (int k = 0; k < GGML_MAX_DIMS; k++) {
        if (rd->n[k] <= 0) {
            *count = 0;
            return true;
        }
        uint64_t term;
        if (__builtin_mul_overflow((uint64_t)(rd->n[k] - 1), rd->nb[k], &term) ||
            __builtin_add_overflow(*end, term, end) || __builtin_mul_overflow(*count, (uint64_t)rd->n[k], count))
            return false;
    }
    return !__builtin_add_overflow(*end, (uint64_t)ggml_type_size(rd->type), end);
}

/*
 * What must hold before the values are read at all: the kernel reads the
 * type the tensor has (ggml's constructors allow I32, and I64 for SET_ROWS),
 * inside the index tensor's bytes (import.c checked those against the
 * buffer; a shadow copy is exactly that long), and no more elements than
 * those bytes hold (elements at distinct places: it also bounds the
 * validation loop by the buffer's size, not by a guest's ne).
 */
static const char *read_fits(const struct ggml_tensor *idx, const struct index_read *rd)
{
    if (idx->type != rd->type || (rd->type != GGML_TYPE_I32 && rd->type != GGML_TYPE_I64))
        return "index tensor of a type its op does not read";
    uint64_t end, count;
    if (!read_extent(rd, &end, &count))
        return "index read overflows";
    if (count == 0)
        return NULL;
    uint64_t nbytes = ggml_nbytes(idx);
    if (end > nbytes)
        return "op reads indices outside its index tensor";
    if (count > nbytes / ggml_type_size(rd->type))
        return "op reads more indices than its index tensor holds";
    return NULL;
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

int apir_node_written_srcs(const struct ggml_tensor *node, const struct ggml_tensor *out[APIR_WRITTEN_SRCS_MAX])
{
    int n = 0;
    if (node->op == GGML_OP_OPT_STEP_ADAMW) {
        for (int k = 2; k <= 3; k++)
            if (node->src[k])
                out[n++] = node->src[k];
    }
    return n;
}

/* Whether running node w writes any byte of t: its own bytes, or an
 * operand it updates in place (apir_node_written_srcs). */
static bool node_writes(const struct ggml_tensor *w, const struct ggml_tensor *t)
{
    if (ggml_op_is_empty(w->op))
        return false;
    if (ranges_overlap(w, t))
        return true;
    const struct ggml_tensor *also[APIR_WRITTEN_SRCS_MAX];
    const int n = apir_node_written_srcs(w, also);
    for (int k = 0; k < n; k++)
        if (ranges_overlap(also[k], t))
            return true;
    return false;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Checks the values of the kernel's walk over base (read_fits held); a
 * distinct read's rows are sorted in pol->row to find a repeat. */
static const char *check_values(struct apir_policy *pol, const uint8_t *base, const struct index_read *rd)
{
    if (rd->distinct && rd->n[0] > pol->row_cap) {
        int64_t *p = realloc(pol->row, (size_t)rd->n[0] * sizeof(*p));
        if (!p)
            return "out of memory for index validation";
        pol->row = p;
        pol->row_cap = rd->n[0];
    }
    for (int64_t i3 = 0; i3 < rd->n[3]; i3++)
        for (int64_t i2 = 0; i2 < rd->n[2]; i2++)
            for (int64_t i1 = 0; i1 < rd->n[1]; i1++) {
                const uint8_t *row = base + i1 * rd->nb[1] + i2 * rd->nb[2] + i3 * rd->nb[3];
                for (int64_t i0 = 0; i0 < rd->n[0]; i0++) {
                    int64_t v;
                    if (rd->type == GGML_TYPE_I32) {
                        int32_t x;
                        memcpy(&x, row + i0 * rd->nb[0], 4);
                        v = x;
                    } else {
                        memcpy(&v, row + i0 * rd->nb[0], 8);
                    }
                    if (v < 0 || v >= rd->limit)
                        return "index value out of range";
                    if (rd->distinct)
                        pol->row[i0] = v;
                }
                if (!rd->distinct || rd->n[0] < 2)
                    continue;
                qsort(pol->row, (size_t)rd->n[0], sizeof(*pol->row), cmp_i64);
                for (int64_t i0 = 1; i0 < rd->n[0]; i0++)
                    if (pol->row[i0] == pol->row[i0 - 1])
                        return "an expert repeated in one token's MUL_MAT_ID ids";
            }
    return NULL;
}

/* Takes the values the op will read: for a shadowed index, copies the
 * guest's memory into the private copy first, so what is checked is what
 * is used.  Then checks the kernel's walk against [0, limit). */
static const char *take_and_check(struct apir_session *s, const struct index_use *u)
{
    const struct ggml_tensor *t = u->shadow ? u->shadow : u->idx;
    if (!u->idx->buffer || !u->idx->data)
        return "index tensor without memory";
    size_t nbytes = ggml_nbytes(t);
    /* A walk over no index (a prompt batch that outputs no row: GET_ROWS
     * of 0 ids): nothing to read, nothing to wait for. */
    if (u->read.n[0] == 0 || u->read.n[1] == 0 || u->read.n[2] == 0 || u->read.n[3] == 0)
        return NULL;
    const uint8_t *base = t->data;
    const uint8_t *kept = NULL;
    if (!u->shadow && !ggml_backend_buffer_is_host(t->buffer) && !u->late)
        kept = apir_mirror_find(s, t->buffer, t->data, nbytes);
    /* Every other read of index memory waits for the device first: a graph
     * left in flight (graph_exec.c run_graph) may still be writing it, and
     * queued uploads are on another stream than the read. */
    if (!kept)
        apir_session_settle(s);
    if (u->shadow)
        memcpy(u->shadow->data, u->idx->data, nbytes);
    if (kept) {
        base = kept;  /* the host copy of what the guest uploaded there */
    } else if (!u->shadow && !ggml_backend_buffer_is_host(t->buffer)) {
        struct apir_policy *pol = s->policy;
        if (nbytes > pol->scratch_size) {
            void *p = realloc(pol->scratch, nbytes);
            if (!p)
                return "out of memory for index validation";
            pol->scratch = p;
            pol->scratch_size = nbytes;
        }
        ggml_backend_tensor_get((struct ggml_tensor *)t, pol->scratch, 0, nbytes);
        base = pol->scratch;
    }
    return check_values(s->policy, base, &u->read);
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

static enum ggml_status compute_segment(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                        struct ggml_cgraph *graph, int i0, int i1);

/* cfg.op_profile: every node as a graph of its own, waited for and timed. */
static enum ggml_status compute_profiled(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                         struct ggml_cgraph *graph, int i0, int i1)
{
    for (int i = i0; i < i1; i++) {
        const struct ggml_tensor *node = ggml_graph_node(graph, i);
        uint64_t t0 = apir_now_ns();
        enum ggml_status st = compute_segment(s, sc, backend, graph, i, i + 1);
        ggml_backend_synchronize(backend);
        if (st != GGML_STATUS_SUCCESS)
            return st;
        if (!ggml_op_is_empty(node->op) && (unsigned)node->op < GGML_OP_COUNT) {
            s->stats.op_ns[node->op] += apir_now_ns() - t0;
            s->stats.op_count[node->op]++;
        }
    }
    return GGML_STATUS_SUCCESS;
}

/* Computes nodes [i0, i1) as one graph. */
static enum ggml_status compute_range(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                      struct ggml_cgraph *graph, int i0, int i1)
{
    if (s->host->cfg.op_profile)
        return compute_profiled(s, sc, backend, graph, i0, i1);
    return compute_segment(s, sc, backend, graph, i0, i1);
}

static enum ggml_status compute_segment(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                        struct ggml_cgraph *graph, int i0, int i1)
{
    s->stats.n_segments++;
    /* Launched, not waited for: a piece followed by another is synchronized
     * by the caller; the last one is left in flight (run_graph decides). */
    if (i0 == 0 && i1 == ggml_graph_n_nodes(graph))
        return ggml_backend_graph_compute_async(backend, graph);
    /* One segment graph per imported graph, in the context that holds it
     * (the import reserved room for it). */
    if (!sc->segment_graph) {
        sc->segment_graph = ggml_new_graph_custom(sc->ctx, apir_fusion_graph_size(ggml_graph_n_nodes(graph)), false);
        if (!sc->segment_graph)
            return GGML_STATUS_ALLOC_FAILED;
        sc->segment_graph_size = ggml_graph_n_nodes(graph);
    }
    ggml_graph_clear(sc->segment_graph);
    for (int i = i0; i < i1; i++)
        ggml_graph_add_node(sc->segment_graph, ggml_graph_node(graph, i));
    /* a segment fuses nothing (its counts are not the graph's): op_fusion.h */
    apir_fusion_seal(sc->segment_graph, false);
    return ggml_backend_graph_compute_async(backend, sc->segment_graph);
}

/*
 * Index values a sort wrote need no check when the sort provably wrote
 * every element the consumer reads, with values below the consumer's limit.
 * The CPU kernels write int32 row i < nrows(src0) at data + i*nb1, elements
 * 0..ne0-1: ARGSORT a permutation of 0..ne0-1, TOP_K ne0 (<= src ne0) of
 * 0..src ne0-1.  With a contiguous result and as many rows as its source,
 * that is every element of the result.  The consumer's walk must then land
 * on those elements: int32 reads at multiples of 4 from the sort's data,
 * inside its bytes.  An index tensor laid over memory the sort does not
 * write (past its end, or a non-contiguous result's gaps) is not covered.
 * Nor is a sort the backend does not run: backends skip a node without
 * GGML_TENSOR_FLAG_COMPUTE (a flag of the guest's record), which then
 * writes nothing and leaves the guest's own bytes there.  (A sort that
 * runs but that a backend fuses with its consumers writes only what the
 * fused chain's outputs need; import.c's use counts keep any other reader
 * of it from being fused away.)
 */
static bool sort_covers(const struct ggml_tensor *sorter, const struct index_use *u)
{
    const struct ggml_tensor *src = sorter->src[0];
    if ((sorter->op != GGML_OP_ARGSORT && sorter->op != GGML_OP_TOP_K) || !src || sorter->type != GGML_TYPE_I32 ||
        !(sorter->flags & GGML_TENSOR_FLAG_COMPUTE) || !ggml_is_contiguous(sorter) ||
        ggml_nrows(src) != ggml_nrows(sorter))
        return false;
    if (sorter->op == GGML_OP_TOP_K && sorter->ne[0] > src->ne[0])
        return false;  /* the kernel would copy indices it never computed */
    int64_t bound = sorter->op == GGML_OP_ARGSORT ? sorter->ne[0] : src->ne[0];
    if (bound > u->read.limit || u->read.type != GGML_TYPE_I32 || u->idx->buffer != sorter->buffer)
        return false;
    uint64_t end, count;
    if (!read_extent(&u->read, &end, &count))
        return false;
    if (count == 0)
        return true;
    const uint8_t *w0 = sorter->data, *base = u->idx->data;
    if (!w0 || !base || base < w0)
        return false;
    uint64_t off = (uint64_t)(base - w0);
    if (off % sizeof(int32_t))
        return false;
    for (int k = 0; k < GGML_MAX_DIMS; k++)
        if (u->read.n[k] > 1 && u->read.nb[k] % sizeof(int32_t))
            return false;
    return end <= ggml_nbytes(sorter) && off <= ggml_nbytes(sorter) - end;
}

/* Whether the only node before the last read that writes the index memory
 * is a sort that runs before the first read and covers it (sort_covers):
 * then no split is needed (MoE routing would otherwise split every layer). */
static bool written_by_sort_only(struct ggml_cgraph *graph, const struct index_use *u)
{
    const struct ggml_tensor *sorter = NULL;
    int sorter_at = -1;
    for (int j = 0; j < u->last; j++) {
        const struct ggml_tensor *w = ggml_graph_node(graph, j);
        if (!node_writes(w, u->idx))
            continue;
        if (sorter)
            return false;
        sorter = w;
        sorter_at = j;
    }
    return sorter && sorter_at < u->first && sort_covers(sorter, u);
}

static bool same_read(const struct index_read *a, const struct index_read *b)
{
    if (a->type != b->type || a->limit != b->limit || a->distinct != b->distinct)
        return false;
    for (int k = 0; k < GGML_MAX_DIMS; k++)
        if (a->n[k] != b->n[k] || a->nb[k] != b->nb[k])
            return false;
    return true;
}

static struct index_use *find_use(struct apir_policy *pol, const struct ggml_tensor *idx, const struct index_read *rd)
{
    for (int u = 0; u < pol->n_uses; u++)
        if (pol->uses[u].idx == idx && same_read(&pol->uses[u].read, rd))
            return &pol->uses[u];
    return NULL;
}

static struct index_use *add_use(struct apir_policy *pol)
{
    if (pol->n_uses == pol->uses_cap) {
        int cap = pol->uses_cap ? 2 * pol->uses_cap : 16;
        void *p = realloc(pol->uses, (size_t)cap * sizeof(*pol->uses));
        if (!p)
            return NULL;
        pol->uses = p;
        pol->uses_cap = cap;
    }
    struct index_use *u = &pol->uses[pol->n_uses++];
    memset(u, 0, sizeof(*u));
    return u;
}

/*
 * ARGSORT on the CPU sorts row indices in its result with std::sort,
 * comparing its source's values.  An order that changes while it sorts -
 * values or indices the guest rewrites in its shared memory meanwhile -
 * makes libstdc++'s unguarded insertion step walk off the row: reads and
 * writes outside the tensors (a comparator that answers at random does it
 * within a few sorts).  So where either tensor is guest-shared memory (a
 * CPU host's zero-copy buffers) the sort runs on host-private copies, in a
 * segment of its own: its source copied in right before, its result copied
 * out right after.  The other kernels do not index by values they read
 * twice (TOP_K sorts a private array with partial_sort, bounded by its
 * heap); index inputs have their shadows (note_use).
 */
static bool sorts_in_private(struct apir_session *s, const struct ggml_tensor *node)
{
    const struct ggml_tensor *src = node->src[0];
    if (node->op != GGML_OP_ARGSORT || !src || !node->data || !src->data || !ggml_nbytes(node) ||
        ggml_backend_dev_type(s->host->devices[s->device]) != GGML_BACKEND_DEVICE_TYPE_CPU)
        return false;
    return buffer_is_guest_shared(s, node->buffer) || buffer_is_guest_shared(s, src->buffer);
}

/* The private copies a sort runs on (sorts_in_private), made once per
 * imported graph; false when memory cannot be had. */
static bool private_sort_ready(struct apir_import_scratch *sc, struct ggml_tensor *node)
{
    return (shadow_of(sc, node->src[0]) || make_shadow(sc, node->src[0])) && (shadow_of(sc, node) || make_shadow(sc, node));
}

/* Runs node i (sorts_in_private, private_sort_ready) alone, on its copies. */
static enum ggml_status sort_in_private(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                        struct ggml_cgraph *graph, int i)
{
    struct ggml_tensor *node = ggml_graph_node(graph, i), *src = node->src[0];
    struct ggml_tensor *src_copy = shadow_of(sc, src), *result = shadow_of(sc, node);
    if (!src_copy || !result)
        return GGML_STATUS_FAILED;
    apir_session_settle(s);
    ggml_backend_synchronize(backend);  /* the segment before, which may write the source */
    memcpy(src_copy->data, src->data, ggml_nbytes(src));
    void *data = node->data;
    node->src[0] = src_copy;
    node->data = result->data;
    enum ggml_status st = compute_range(s, sc, backend, graph, i, i + 1);
    ggml_backend_synchronize(backend);
    node->src[0] = src;
    node->data = data;
    if (st == GGML_STATUS_SUCCESS)
        memcpy(data, result->data, ggml_nbytes(node));
    s->stats.private_sorts++;
    return st;
}

/* The use of node i's index input: found or added, its read checked
 * against the tensor, a shadow made for guest-shared memory (in sc, the
 * graph's own scratch). */
static const char *note_use(struct apir_session *s, struct apir_import_scratch *sc, struct ggml_tensor *node, int i,
                            int slot, const struct index_read *rd)
{
    struct ggml_tensor *idx = node->src[slot] ? orig_of(sc, node->src[slot]) : NULL;
    if (!idx)
        return "index op without its index input";
    /* The kernel would overwrite indices it has yet to read with values
     * nobody checked. */
    if (ranges_overlap(node, idx))
        return "index op writes over its own indices";
    struct index_use *u = find_use(s->policy, idx, rd);
    if (!u) {
        const char *why = read_fits(idx, rd);
        if (why)
            return why;
        if (!(u = add_use(s->policy)))
            return "out of memory for index validation";
        u->idx = idx;
        u->read = *rd;
        u->first = i;
        u->shadow = shadow_of(sc, idx);
        if (!u->shadow && buffer_is_guest_shared(s, idx->buffer)) {
            if (!ggml_backend_buffer_is_host(idx->buffer) || !(u->shadow = make_shadow(sc, idx)))
                return "index tensor in guest-shared memory cannot be copied";
        }
    }
    u->last = i;
    if (u->shadow)
        node->src[slot] = u->shadow;  /* the op reads the checked copy */
    return NULL;
}

enum ggml_status apir_policy_compute(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                     struct ggml_cgraph *graph, const char **why)
{
    struct apir_policy *pol = s->policy;
    const int n = ggml_graph_n_nodes(graph);
    pol->n_uses = 0;
    *why = NULL;

    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        if ((*why = check_params(node)))
            return GGML_STATUS_ABORTED;
        if (sorts_in_private(s, node) && !private_sort_ready(sc, node)) {
            *why = "out of memory for a sort's private copies";
            return GGML_STATUS_ABORTED;
        }
        int slot;
        struct index_read rd;
        if (!index_read_of(node, &slot, &rd, why))
            continue;
        if (*why || (*why = note_use(s, sc, node, i, slot, &rd)))
            return GGML_STATUS_ABORTED;
    }

    /* Which index inputs does a node before their last use write (aliasing
     * included)?  Those are checked right before each use; the others once,
     * now. */
    struct index_use *uses = pol->uses;
    for (int u = 0; u < pol->n_uses; u++) {
        for (int j = 0; j < uses[u].last && !uses[u].late; j++) {
            uses[u].late = node_writes(ggml_graph_node(graph, j), uses[u].idx);
        }
        /* A covering sort's output is in range (sort_covers), but a shadow
         * must still be refreshed at the use. */
        if (uses[u].late && !uses[u].shadow && written_by_sort_only(graph, &uses[u]))
            uses[u].late = false;
        else if (!uses[u].late && (*why = take_and_check(s, &uses[u])))
            return GGML_STATUS_ABORTED;
    }

    int start = 0;
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *node = ggml_graph_node(graph, i);
        if (sorts_in_private(s, node)) {
            enum ggml_status st = i > start ? compute_range(s, sc, backend, graph, start, i) : GGML_STATUS_SUCCESS;
            if (st == GGML_STATUS_SUCCESS)
                st = sort_in_private(s, sc, backend, graph, i);
            if (st != GGML_STATUS_SUCCESS)
                return st;
            start = i + 1;
            continue;
        }
        int slot;
        struct index_read rd;
        const char *unused;
        if (!index_read_of(node, &slot, &rd, &unused))
            continue;
        struct index_use *u = find_use(pol, orig_of(sc, node->src[slot]), &rd);
        if (!u) {
            *why = "index input changed while computing";  /* cannot happen: noted above */
            return GGML_STATUS_ABORTED;
        }
        if (!u->late)
            continue;
        if (i > start) {
            enum ggml_status st = compute_range(s, sc, backend, graph, start, i);
            if (st != GGML_STATUS_SUCCESS)
                return st;
            ggml_backend_synchronize(backend);
            start = i;
        }
        if ((*why = take_and_check(s, u)))
            return GGML_STATUS_ABORTED;
    }
    return compute_range(s, sc, backend, graph, start, n);
}
