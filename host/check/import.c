#include "import.h"
#include "op_derive.h"
#include "op_device.h"
#include "op_fusion.h"
#include "op_shapes.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-impl.h"

#include <stdlib.h>
#include <string.h>

/* The record mirrors ggml's limits; if ggml changes them the wire format
 * would silently stop describing its tensors. */
_Static_assert(GGML_MAX_DIMS == APIR_TENSOR_MAX_DIMS, "ggml dims");
_Static_assert(GGML_MAX_SRC == APIR_TENSOR_MAX_SRC, "ggml srcs");
_Static_assert(GGML_MAX_OP_PARAMS == APIR_TENSOR_MAX_OP_PARAMS * 4, "ggml op params");
_Static_assert(GGML_MAX_NAME == APIR_TENSOR_MAX_NAME, "ggml name");

/* The check layer's convention (docs/ARCHITECTURE.md): the reason a record
 * is refused, for the caller's log line and reply; what is built is NULL. */
static void *refuse(const char **why, const char *reason)
{
    *why = reason;
    return NULL;
}

#define KNOWN_FLAGS (GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT | GGML_TENSOR_FLAG_PARAM | \
                     GGML_TENSOR_FLAG_LOSS | GGML_TENSOR_FLAG_COMPUTE)

/* Ops whose op_params carry host function pointers: a guest could make the
 * host call anything (ggml-rpc #25289).  Never accepted. */
static bool op_is_refused(uint32_t op)
{
    switch (op) {
    case GGML_OP_MAP_CUSTOM1:
    case GGML_OP_MAP_CUSTOM2:
    case GGML_OP_MAP_CUSTOM3:
    case GGML_OP_CUSTOM:
        return true;
    default:
        return false;
    }
}

/* ggml_nbytes of the record's shape, with every step overflow-checked.
 * Returns false when the shape is inconsistent or does not fit 64 bits. */
static bool record_nbytes(const struct apir_tensor_rec *rec, uint64_t *out)
{
    const uint64_t blck = (uint64_t)ggml_blck_size((enum ggml_type)rec->type);
    const uint64_t tsize = (uint64_t)ggml_type_size((enum ggml_type)rec->type);
    for (int i = 0; i < APIR_TENSOR_MAX_DIMS; i++) {
        if (rec->ne[i] == 0) {
            *out = 0;
            return true;
        }
    }
    uint64_t nbytes;
    if (blck == 1) {
        nbytes = tsize;
        for (int i = 0; i < APIR_TENSOR_MAX_DIMS; i++) {
            uint64_t term;
            if (__builtin_mul_overflow((uint64_t)(rec->ne[i] - 1), (uint64_t)rec->nb[i], &term) ||
                __builtin_add_overflow(nbytes, term, &nbytes))
                return false;
        }
    } else {
        /* Quantized rows are whole blocks laid out contiguously. */
        if (rec->ne[0] % blck != 0 || rec->nb[0] != tsize)
            return false;
        if (__builtin_mul_overflow((uint64_t)(rec->ne[0] / blck), tsize, &nbytes))
            return false;
        for (int i = 1; i < APIR_TENSOR_MAX_DIMS; i++) {
            uint64_t term;
            if (__builtin_mul_overflow((uint64_t)(rec->ne[i] - 1), (uint64_t)rec->nb[i], &term) ||
                __builtin_add_overflow(nbytes, term, &nbytes))
                return false;
        }
    }
    *out = nbytes;
    return true;
}

/* Checks that need no other record.  *buf is the record's buffer or NULL. */
static const char *check_record(struct apir_session *s, const struct apir_tensor_rec *rec, bool need_buffer,
                                struct apir_host_buffer **buf)
{
    *buf = NULL;
    if (rec->type >= GGML_TYPE_COUNT || ggml_blck_size((enum ggml_type)rec->type) <= 0 ||
        ggml_type_size((enum ggml_type)rec->type) == 0)
        return "tensor type out of range";
    if (rec->op >= GGML_OP_COUNT)
        return "tensor op out of range";
    if (op_is_refused(rec->op))
        return "custom ops (host function pointers) are refused";
    if ((uint32_t)rec->flags & ~(uint32_t)KNOWN_FLAGS)
        return "unknown tensor flags";
    uint64_t nbytes;
    if (!record_nbytes(rec, &nbytes))
        return "tensor shape or strides inconsistent (ne/nb/block size)";
    if (rec->buffer == 0) {
        if (need_buffer)
            return "tensor without a buffer";
        return NULL;
    }
    struct apir_handle_slot *slot = apir_handle_get(&s->handles, rec->buffer, APIR_HANDLE_BUFFER);
    if (!slot)
        return "tensor names an unknown buffer handle";
    struct apir_host_buffer *hb = slot->object;
    uint64_t end;
    /* A tensor without elements touches no byte: ggml places an empty view
     * anywhere past its (empty) source, even past the buffer's end, and
     * make_tensor pins such a tensor inside its buffer. */
    if (nbytes != 0 && (__builtin_add_overflow(rec->data, nbytes, &end) || end > hb->size))
        return "tensor data outside its buffer";
    *buf = hb;
    return NULL;
}

/*
 * Strides of size-1 dimensions.  A record's strides are the guest's, and
 * nothing bounds the stride of a dimension of size 1: its index is always
 * 0, so the extent (record_nbytes: (ne - 1) * nb per dimension) never
 * counts it, and ggml_is_contiguous skips such dimensions.  Kernels use
 * those strides all the same: having checked contiguity, many walk the
 * tensor flat - ggml_nrows rows at j * nb[1] (SOFT_MAX_BACK, SCALE,
 * CROSS_ENTROPY_LOSS_BACK, POOL_1D), planes at k * nb[2] (DIAG_MASK_*,
 * POOL_2D), sequence i's state at i * nb[3] (SSM_SCAN, whose states are
 * one [d_state, dim, heads, 1] tensor when there is one slot) - so a
 * "contiguous" [nc, 1, 2, 1] with nb[1] = 1 GiB has its second row a GiB
 * away.  So a contiguous tensor's size-1 strides are set to what
 * ggml_new_tensor gives them (apir_canonical_unit_strides), for leaves,
 * views and nodes alike, before anything else looks at the tensor:
 *  - no element moves (the index there is 0), the extent stays what was
 *    checked, and nothing a graph ggml built computes changes: the host's
 *    tensor is the guest's, element for element;
 *  - "contiguous" then means every stride canonical, so a flat walk of the
 *    tensor's rows, planes or sequences lands exactly on them;
 *  - a node's strides are its constructor's (op_derive.c compares them,
 *    canonicalised the same way): a fresh result's are ggml_new_tensor's,
 *    an in-place result's are its source's (ggml_view_tensor).
 * A tensor that is not contiguous keeps its strides: ggml gives the size-1
 * dimensions of permuted views other strides, and looks at them
 * (op_derive.h).  The kernels that walk such tensors flat are held by their
 * operand rules (op_operands.c): rows at j * nb[1] need
 * ggml_is_contiguous_1 with dense rows (ROWS_BY_NB1: CLAMP, LEAKY_RELU,
 * SILU_BACK, CROSS_ENTROPY_LOSS, ARGSORT/TOP_K; GLU asserts it), a
 * predicate that counts the stride of a size-1 dimension 1 (dimension 2
 * must follow it), so row j at j * nb[1] is row j whatever that stride
 * is; rows read back to back (SSM_CONV) need nb[1] exactly.
 */

/* Makes the ggml tensor of a checked record, in sc's context or, into not
 * NULL, there (a graph's: sc->store); srcs are filled in later.  What
 * ggml_new_tensor would set and the record does not is zero. */
static struct ggml_tensor *make_tensor(struct apir_import_scratch *sc, const struct apir_tensor_rec *rec,
                                       struct apir_host_buffer *hb, struct ggml_tensor *into)
{
    struct ggml_tensor *t = into;
    if (t) {
        memset(t, 0, sizeof(*t));
        t->type = (enum ggml_type)rec->type;
    } else {
        int64_t ne[4] = { rec->ne[0], rec->ne[1], rec->ne[2], rec->ne[3] };
        t = ggml_new_tensor(sc->ctx, (enum ggml_type)rec->type, 4, ne);
        if (!t)
            return NULL;
    }
    for (int i = 0; i < 4; i++) {
        t->ne[i] = rec->ne[i];
        t->nb[i] = rec->nb[i];
    }
    t->op = (enum ggml_op)rec->op;
    memcpy(t->op_params, rec->op_params, sizeof(t->op_params));
    t->flags = rec->flags;
    memcpy(t->name, rec->name, sizeof(t->name));
    t->name[sizeof(t->name) - 1] = '\0';
    if (hb) {
        t->buffer = hb->buffer;
        /* An empty tensor's address is clamped to the buffer: nothing is
         * read or written there, and no pointer leaves the buffer.  A
         * zero-byte buffer has no base (ggml gives NULL): its tensors, all
         * empty, keep a NULL address (no arithmetic on NULL). */
        t->data = hb->base ? hb->base + (rec->data < hb->size ? rec->data : hb->size) : NULL;
    }
    return t;
}

static bool scratch_grow_tensors(struct apir_import_scratch *sc, uint32_t n)
{
    if (n <= sc->tensors_cap)
        return true;
    uint32_t cap = sc->tensors_cap ? sc->tensors_cap : 256;
    while (cap < n)
        cap *= 2;
    void *a = realloc(sc->tensors, (size_t)cap * sizeof(*sc->tensors));
    if (a) sc->tensors = a;
    void *b = realloc(sc->refs, (size_t)cap * (APIR_TENSOR_MAX_SRC + 1) * sizeof(*sc->refs));
    if (b) sc->refs = b;
    void *c = realloc(sc->state, (size_t)cap);
    if (c) sc->state = c;
    void *d = realloc(sc->stack, (size_t)cap * sizeof(*sc->stack));
    if (d) sc->stack = d;
    void *e = realloc(sc->same, (size_t)cap);
    if (e) sc->same = e;
    void *f = realloc(sc->store, (size_t)cap * sizeof(*sc->store));
    if (f) sc->store = f;
    if (!a || !b || !c || !d || !e || !f)
        return false;
    sc->tensors_cap = cap;
    /* The map stays under half full. */
    uint32_t map_cap = cap * 2;
    free(sc->keys);
    free(sc->vals);
    sc->keys = malloc((size_t)map_cap * sizeof(*sc->keys));
    sc->vals = malloc((size_t)map_cap * sizeof(*sc->vals));
    if (!sc->keys || !sc->vals) {
        sc->tensors_cap = 0;
        return false;
    }
    sc->map_cap = map_cap;
    return true;
}

void apir_import_scratch_free(struct apir_import_scratch *sc)
{
    for (uint32_t i = 0; i < sc->n_shadows; i++)
        free(sc->shadows[i].mem);
    if (sc->ctx)
        ggml_free(sc->ctx);
    free(sc->ctx_mem);
    free(sc->keys);
    free(sc->vals);
    free(sc->tensors);
    free(sc->refs);
    free(sc->state);
    free(sc->stack);
    free(sc->same);
    free(sc->store);
    memset(sc, 0, sizeof(*sc));
}

void apir_import_memo_free(struct apir_import_memo *memo)
{
    free(memo->records);
    free(memo->supported);
    free(memo->made);
    memset(memo, 0, sizeof(*memo));
}

/* Room for n records in the memo; false (the memo then unused) if memory
 * cannot be had. */
static bool memo_reserve(struct apir_import_memo *memo, uint32_t n)
{
    if (n <= memo->cap)
        return true;
    uint8_t *r = realloc(memo->records, (size_t)n * APIR_TENSOR_REC_SIZE);
    if (r)
        memo->records = r;
    uint8_t *f = realloc(memo->supported, n);
    if (f)
        memo->supported = f;
    struct ggml_tensor *m = realloc(memo->made, (size_t)n * sizeof(*memo->made));
    if (m)
        memo->made = m;
    if (!r || !f || !m)
        return false;
    memo->cap = n;
    return true;
}

bool apir_import_begin(struct apir_import_scratch *sc, uint32_t n_tensors, uint32_t n_nodes, const char **why)
{
    size_t need = ((size_t)n_tensors + APIR_MAX_SHADOWS) * ggml_tensor_overhead() + 1024;
    /* The graph, and one more for computing it in segments (op_policy.c);
     * ggml aborts when a context runs out, so reserve, never guess. */
    if (n_nodes)
        need += 2 * ggml_graph_overhead_custom(apir_fusion_graph_size(n_nodes), false);
    if (!scratch_grow_tensors(sc, n_tensors ? n_tensors : 1))
        return refuse(why, "out of memory for the tensor map");
    sc->segment_graph = NULL;
    sc->segment_graph_size = 0;
    for (uint32_t i = 0; i < sc->n_shadows; i++)
        free(sc->shadows[i].mem);
    sc->n_shadows = 0;
    if (sc->ctx && need <= sc->ctx_size) {
        ggml_reset(sc->ctx);
        return true;
    }
    if (sc->ctx)
        ggml_free(sc->ctx);
    free(sc->ctx_mem);
    size_t size = sc->ctx_size ? sc->ctx_size : 64 * 1024;
    while (size < need)
        size *= 2;
    sc->ctx_mem = malloc(size);
    struct ggml_init_params params = { .mem_size = size, .mem_buffer = sc->ctx_mem, .no_alloc = true };
    sc->ctx = sc->ctx_mem ? ggml_init(params) : NULL;
    if (!sc->ctx) {
        free(sc->ctx_mem);
        sc->ctx_mem = NULL;
        sc->ctx_size = 0;
        return refuse(why, "out of memory for the scratch context");
    }
    sc->ctx_size = size;
    return true;
}

/* apir_import_tensor, made into `into` (NULL: sc's context). */
static struct ggml_tensor *import_tensor(struct apir_session *s, struct apir_import_scratch *sc,
                                         const struct apir_tensor_rec *rec, bool need_buffer,
                                         struct apir_host_buffer **buf, struct ggml_tensor *into, const char **why)
{
    struct apir_host_buffer *hb;
    const char *reason = check_record(s, rec, need_buffer, &hb);
    if (reason)
        return refuse(why, reason);
    struct ggml_tensor *t = make_tensor(sc, rec, hb, into);
    if (!t)
        return refuse(why, "scratch context full");
    if (!apir_canonical_unit_strides(t))
        return refuse(why, "tensor strides overflow");
    if (buf)
        *buf = hb;
    return t;
}

struct ggml_tensor *apir_import_tensor(struct apir_session *s, struct apir_import_scratch *sc,
                                       const struct apir_tensor_rec *rec, bool need_buffer, struct apir_host_buffer **buf,
                                       const char **why)
{
    return import_tensor(s, sc, rec, need_buffer, buf, NULL, why);
}

static uint64_t hash_id(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return id;
}

/* id -> index; ids are unique and non-zero. */
static bool map_put(struct apir_import_scratch *sc, uint64_t id, uint32_t index)
{
    uint32_t mask = sc->map_cap - 1;  /* map_cap is a power of two */
    for (uint32_t i = (uint32_t)hash_id(id) & mask;; i = (i + 1) & mask) {
        if (sc->keys[i] == 0) {
            sc->keys[i] = id;
            sc->vals[i] = index;
            return true;
        }
        if (sc->keys[i] == id)
            return false;
    }
}

static bool map_get(const struct apir_import_scratch *sc, uint64_t id, uint32_t *index)
{
    uint32_t mask = sc->map_cap - 1;
    for (uint32_t i = (uint32_t)hash_id(id) & mask;; i = (i + 1) & mask) {
        if (sc->keys[i] == 0)
            return false;
        if (sc->keys[i] == id) {
            *index = sc->vals[i];
            return true;
        }
    }
}

/* Depth-first walk over src/view_src edges (the refs as pass 2 resolved
 * them) with an explicit stack (a guest can make chains as long as the
 * tensor limit): a grey node reached again is a cycle. */
static bool refs_are_acyclic(struct apir_import_scratch *sc, uint32_t n)
{
    enum { WHITE = 0, GREY = 1, BLACK = 2 };
    const uint32_t per = APIR_TENSOR_MAX_SRC + 1;
    memset(sc->state, WHITE, n);
    for (uint32_t root = 0; root < n; root++) {
        if (sc->state[root] != WHITE)
            continue;
        uint32_t top = 0;
        sc->stack[top++] = root;
        sc->state[root] = GREY;
        while (top) {
            uint32_t v = sc->stack[top - 1];
            bool pushed = false;
            for (uint32_t k = 0; k < per; k++) {
                const uint64_t ref = sc->refs[(size_t)v * per + k];
                const uint32_t w = (uint32_t)(ref - 1);
                /* A tensor naming itself is no cycle: ggml_cast makes its
                 * CPY node its own src[1] (the destination). */
                if (!ref || w == v)
                    continue;
                if (sc->state[w] == GREY)
                    return false;
                if (sc->state[w] == WHITE) {
                    sc->state[w] = GREY;
                    sc->stack[top++] = w;  /* each node is pushed once: top <= n */
                    pushed = true;
                    break;
                }
            }
            if (!pushed) {
                sc->state[v] = BLACK;
                top--;
            }
        }
    }
    return true;
}

/* sc->same's bits, per record. */
#define REC_SAME      1u  /* byte for byte the memo's record at this index */
#define REC_COVERED   2u  /* ... and so are its operands' and views' (memo_covers) */
#define REC_SUPPORTED 4u  /* a node of this graph the device supports */

/*
 * Whether tensor i's op checks may be the memo's answer.  What
 * apir_op_shape_error and supports_op look at is the tensor's own fields,
 * its srcs' and its view_src's (a constructor reads its operands' shapes,
 * strides, data and their view_src: an in-place result is a view of its
 * operand's source), and the buffers they name.  Each of those tensors is
 * made from its record alone (make_tensor), the same bytes at the same
 * index name the same ids, and an unchanged buffers_epoch means every
 * handle names the buffer it named then; so when all those records are
 * the memo's, the checks would give the memo's graph's answers, which
 * were all "yes" (a memo is kept only after a whole import succeeded).
 * A node whose record did not change but one of whose operands did is
 * checked again (a source grown to a shape its consumer cannot take).
 */
static bool memo_covers(const struct apir_import_scratch *sc, uint32_t i)
{
    const uint32_t per = APIR_TENSOR_MAX_SRC + 1;
    if (!(sc->same[i] & REC_SAME))
        return false;
    for (uint32_t k = 0; k < per; k++) {
        const uint64_t ref = sc->refs[(size_t)i * per + k];
        if (!ref)
            continue;
        const uint32_t j = (uint32_t)(ref - 1);
        if (!(sc->same[j] & REC_SAME))
            return false;
        const uint64_t view = sc->refs[(size_t)j * per + APIR_TENSOR_MAX_SRC];
        if (view && !(sc->same[view - 1] & REC_SAME))
            return false;
    }
    return true;
}

/* How import_records uses the session's import memo. */
enum memo_use {
    MEMO_NONE,     /* not at all */
    MEMO_COMPARE,  /* its first old_n records are the last graph's (0: none
                    * usable): each record read is compared with the one at
                    * its index and left there */
    MEMO_SOURCE,   /* the records are the memo's own (a delta applied to it:
                    * apply_delta set sc->same) */
};

/* apir_import_list, with the memo for a graph's records (memo NULL when
 * MEMO_NONE). */
static struct ggml_tensor **import_records(struct apir_session *s, struct apir_import_scratch *sc, uint32_t n,
                                           const uint8_t *records, bool need_buffer, struct apir_import_memo *memo,
                                           enum memo_use use, uint32_t old_n, const char **why)
{
    const uint32_t per = APIR_TENSOR_MAX_SRC + 1;
    if (n == 0 || n > sc->tensors_cap)
        return refuse(why, "tensor count out of range");
    memset(sc->keys, 0, (size_t)sc->map_cap * sizeof(*sc->keys));

    /* Pass 1: read each record once, check it, make its tensor.  The memo
     * is compared with that one read (the host's copy): the guest may
     * change its shared memory at any time. */
    struct apir_tensor_rec copy;
    _Static_assert(sizeof(copy) == APIR_TENSOR_REC_SIZE, "record size");
    _Static_assert(APIR_TENSOR_REC_SIZE % _Alignof(struct apir_tensor_rec) == 0, "records in an array");
    for (uint32_t i = 0; i < n; i++) {
        /* The memo's records are the host's own memory (malloc'd, so
         * aligned): read in place.  The guest's are copied once. */
        const struct apir_tensor_rec *r = (const struct apir_tensor_rec *)(records + (size_t)i * APIR_TENSOR_REC_SIZE);
        if (use != MEMO_SOURCE) {
            memcpy(&copy, r, sizeof(copy));
            r = &copy;
        }
        if (use == MEMO_COMPARE) {
            uint8_t *kept = memo->records + (size_t)i * APIR_TENSOR_REC_SIZE;
            sc->same[i] = 0;
            if (i < old_n && memcmp(kept, r, sizeof(*r)) == 0)
                sc->same[i] = REC_SAME;
            else
                memcpy(kept, r, sizeof(*r));
        } else if (use == MEMO_NONE) {
            sc->same[i] = 0;
        }
        if (r->id == 0)
            return refuse(why, "tensor id 0");
        if (!map_put(sc, r->id, i))
            return refuse(why, "duplicate tensor id");
        struct ggml_tensor *t = &sc->store[i];
        if (use != MEMO_NONE && (sc->same[i] & REC_SAME)) {
            /* The memo's record at i is these bytes, and no buffer went
             * since (old_n is 0 otherwise): its checks and make would
             * give the tensor they gave then. */
            *t = memo->made[i];
        } else {
            if (!import_tensor(s, sc, r, need_buffer, NULL, t, why))
                return NULL;
            /* view_offs is kept with the tensor; checked against view_src below. */
            t->view_offs = (size_t)r->view_offs;
            if (use != MEMO_NONE)
                memo->made[i] = *t;
        }
        sc->tensors[i] = t;
        memcpy(&sc->refs[(size_t)i * per], r->src, sizeof(r->src));
        sc->refs[(size_t)i * per + APIR_TENSOR_MAX_SRC] = r->view_src;
    }

    /* Pass 2: resolve references; every id must name a record of this list. */
    for (uint32_t i = 0; i < n; i++) {
        struct ggml_tensor *t = sc->tensors[i];
        for (uint32_t k = 0; k < per; k++) {
            uint64_t id = sc->refs[(size_t)i * per + k];
            uint32_t j;
            if (!id)
                continue;
            if (!map_get(sc, id, &j))
                return refuse(why, "src or view_src id not in the message");
            sc->refs[(size_t)i * per + k] = (uint64_t)j + 1;  /* resolved (session.h) */
            if (k < APIR_TENSOR_MAX_SRC)
                t->src[k] = sc->tensors[j];
            else
                t->view_src = sc->tensors[j];
        }
        if (t->view_src) {
            /* A view shares its source's buffer and starts view_offs into it
             * (compared as integers: a wrapped offset is no pointer). */
            const struct ggml_tensor *v = t->view_src;
            if (v->buffer != t->buffer)
                return refuse(why, "view in another buffer than its source");
            /* A view with no elements touches no byte, wherever it starts
             * (ggml checks only views with data against their source). */
            if (t->buffer && ggml_nbytes(t) != 0 &&
                (t->view_offs > ggml_nbytes(v) || (uintptr_t)t->data - (uintptr_t)v->data != (uintptr_t)t->view_offs))
                return refuse(why, "view data does not match view_src + view_offs");
        } else if (t->view_offs != 0) {
            return refuse(why, "view_offs without view_src");
        }
    }
    /* Only now are the srcs in place: is each node what ggml's constructor
     * for its op would build from them (op_shapes.h)?  That looks at a
     * node's direct srcs only, so it is safe before the cycle check.  In a
     * graph every tensor came with its srcs; in a query list only the
     * subject did (its srcs' own srcs are left out). */
    for (uint32_t i = 0; i < (need_buffer ? n : 1); i++) {
        if (use != MEMO_NONE && memo_covers(sc, i)) {
            sc->same[i] |= REC_COVERED;
            s->stats.checks_kept++;
            continue;
        }
        const char *reason = apir_op_shape_error(sc->tensors[i], !need_buffer);
        if (reason)
            return refuse(why, reason);
    }
    if (!refs_are_acyclic(sc, n))
        return refuse(why, "cyclic src/view_src references");
    return sc->tensors;
}

struct ggml_tensor **apir_import_list(struct apir_session *s, struct apir_import_scratch *sc, uint32_t n,
                                      const uint8_t *records, bool need_buffer, const char **why)
{
    return import_records(s, sc, n, records, need_buffer, NULL, MEMO_NONE, 0, why);
}

/*
 * The use counts go where ggml keeps them (the graph's hash set): backends
 * fuse a chain of nodes into one kernel when each inner node's count is its
 * uses inside the chain (ggml_can_fuse_subgraph), and the fused kernel
 * writes only the chain's outputs.  The guest sends its counts because they
 * are its whole graph's: a node this split computes may be read by another
 * split, which this graph does not show.  But a count below the uses this
 * graph does show would let a backend leave unwritten a tensor a later node
 * here reads - for instance a sort's result (CUDA's top-k MoE fusion writes
 * only the view of its first columns) that a GET_ROWS reads whole, its
 * indices then the guest's bytes, unchecked (op_policy.c trusts a sort to
 * write what it covers).  So each count is at least this graph's own uses
 * of the node (each src slot that names it, as ggml counts them); a count
 * above that only fuses less.  A node listed twice is counted once.
 */
static bool set_use_counts(struct ggml_cgraph *graph, struct apir_decoder *dec)
{
    const int n = ggml_graph_n_nodes(graph) - 1;  /* after the anchor */
    const uint8_t *counts = apir_decode_inplace(dec, (size_t)n * 4);
    if (dec->fatal || !counts)
        return false;
    struct ggml_hash_set *set = &graph->visited_hash_set;
    for (int i = 0; i < n; i++) {
        size_t pos = ggml_hash_insert(set, ggml_graph_node(graph, i + 1));
        if (pos != GGML_HASHSET_ALREADY_EXISTS)
            graph->use_counts[pos] = 0;
    }
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *node = ggml_graph_node(graph, i + 1);
        for (int k = 0; k < GGML_MAX_SRC; k++) {
            const struct ggml_tensor *src = node->src[k];
            if (!src)
                continue;
            size_t pos = ggml_hash_find(set, src);
            /* found (a used slot is src's); an empty one: not a node */
            if (pos != GGML_HASHSET_FULL && ggml_bitset_get(set->used, pos) && graph->use_counts[pos] < INT32_MAX)
                graph->use_counts[pos]++;
        }
    }
    for (int i = 0; i < n; i++) {
        const size_t pos = ggml_hash_find(set, ggml_graph_node(graph, i + 1));
        uint32_t c;
        memcpy(&c, counts + (size_t)i * 4, 4);
        const int32_t guest = c > INT32_MAX ? INT32_MAX : (int32_t)c;
        if (guest > graph->use_counts[pos])
            graph->use_counts[pos] = guest;
    }
    return true;
}

/*
 * The CPU backend runs an RMS_NORM and the MUL right after it that reads it
 * as one kernel (ggml-cpu.c ggml_cpu_try_fuse_ops, when the MUL's other
 * operand is f32 rows of the norm's length): it walks the norm's source and
 * writes the MUL's result with the same indices, and asserts the two have
 * one shape.  A MUL that broadcasts the norm into a larger operand would
 * abort there (a norm times its weights, as ggml graphs make it, has the
 * norm's shape), so that pair is refused.
 */
static bool fused_norm_mul_ok(const struct ggml_tensor *norm, const struct ggml_tensor *mul)
{
    if (norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || !norm->src[0] ||
        (mul->src[0] != norm && mul->src[1] != norm))
        return true;
    const struct ggml_tensor *w = mul->src[0] == norm ? mul->src[1] : mul->src[0];
    if (!w || w->type != GGML_TYPE_F32 || mul->type != GGML_TYPE_F32 || w->ne[0] != norm->ne[0] ||
        w->nb[0] != sizeof(float))
        return true;  /* not fused */
    return ggml_are_same_shape(norm->src[0], mul);
}

/*
 * A delta (0.9): the records that differ from the memo's graph, written
 * over the memo's copy.  The memo's records are the host's own memory, so
 * the graph imported from them is read once like any other; what was not
 * sent is the memo's record at its index, byte for byte (REC_SAME), and
 * what was sent is checked as new.  The indices go up strictly and below
 * n; every index past the memo's graph must be there (a record the host
 * never had cannot be "unchanged").  Returns false, *why set, if the delta
 * is malformed; the memo is then not valid (the caller cleared it).
 */
static bool apply_delta(struct apir_import_scratch *sc, struct apir_import_memo *memo, struct apir_decoder *dec,
                        uint32_t n, uint32_t old_n, const char **why)
{
    const uint32_t n_changed = apir_decode_u32(dec);
    if (dec->fatal || n_changed > n)
        return refuse(why, "graph delta: more changed records than records") != NULL;
    const uint8_t *index = apir_decode_inplace(dec, (size_t)n_changed * 4);
    const uint8_t *records = apir_decode_inplace(dec, (size_t)n_changed * APIR_TENSOR_REC_SIZE);
    if (dec->fatal || (n_changed && (!index || !records)))
        return refuse(why, "graph delta shorter than its counts") != NULL;
    const uint32_t kept = old_n < n ? old_n : n;
    memset(sc->same, REC_SAME, kept);
    memset(sc->same + kept, 0, n - kept);
    uint32_t past_kept = 0, prev = 0;
    for (uint32_t k = 0; k < n_changed; k++) {
        /* Each index is read once (prev is that read, not the guest's
         * memory again): were they not strictly increasing, a repeated
         * index could stand in for a missing one in the count below. */
        uint32_t i;
        memcpy(&i, index + (size_t)k * 4, 4);
        if (i >= n || (k > 0 && i <= prev))
            return refuse(why, "graph delta: indices not increasing or out of range") != NULL;
        prev = i;
        memcpy(memo->records + (size_t)i * APIR_TENSOR_REC_SIZE, records + (size_t)k * APIR_TENSOR_REC_SIZE,
               APIR_TENSOR_REC_SIZE);
        sc->same[i] = 0;
        past_kept += i >= kept;
    }
    /* Distinct indices in [kept, n): all of them exactly when n - kept. */
    if (past_kept != n - kept)
        return refuse(why, "graph delta leaves out a record the last graph did not have") != NULL;
    return true;
}

struct ggml_cgraph *apir_import_graph(struct apir_session *s, struct apir_import_scratch *sc,
                                      struct apir_graph_blob *in, struct ggml_tensor *anchor, const char **why)
{
    const struct apir_limits *lim = &s->host->cfg.limits;
    struct apir_decoder dec;
    in->stale = false;
    apir_decoder_init(&dec, in->bytes, (size_t)in->size);
    uint32_t n_nodes = apir_decode_u32(&dec);
    if (dec.fatal || n_nodes == 0 || n_nodes > lim->max_graph_nodes)
        return refuse(why, "graph node count out of range");
    const uint8_t *node_ids = apir_decode_inplace(&dec, (size_t)n_nodes * 8);
    uint32_t n_tensors = apir_decode_u32(&dec);
    if (dec.fatal || n_tensors == 0 || n_tensors > lim->max_graph_tensors)
        return refuse(why, "graph tensor count out of range");
    if (dec.fatal || !node_ids)
        return refuse(why, "graph blob shorter than its counts");

    if (!apir_import_begin(sc, n_tensors, n_nodes + 1, why))
        return NULL;
    /* The memo holds the last graph only while it is the last graph that
     * imported whole: any refusal below leaves it unused. */
    struct apir_import_memo *memo = &s->import_memo;
    const bool held = memo->valid && memo->epoch == s->buffers_epoch && memo->device == s->device;
    const uint32_t old_n = held ? memo->n : 0;
    const bool usable = s->host->cfg.import_memo && n_tensors <= APIR_IMPORT_MEMO_MAX;
    if (in->base && (!held || !usable || memo->key != in->base)) {
        /* Not an error of the guest's: the host let that graph go (a
         * buffer freed, another graph since, memory): it sends the whole. */
        in->stale = true;
        return refuse(why, "the graph a delta names is not kept");
    }
    memo->valid = false;
    if (!usable || !memo_reserve(memo, n_tensors))
        memo = NULL;
    struct ggml_tensor **tensors;
    if (in->base) {
        if (!memo) {
            in->stale = true;
            return refuse(why, "out of memory for the graph a delta names");
        }
        if (!apply_delta(sc, memo, &dec, n_tensors, old_n, why))
            return NULL;
        tensors = import_records(s, sc, n_tensors, memo->records, true, memo, MEMO_SOURCE, old_n, why);
    } else {
        const uint8_t *records = apir_decode_inplace(&dec, (size_t)n_tensors * APIR_TENSOR_REC_SIZE);
        if (dec.fatal || !records)
            return refuse(why, "graph blob shorter than its counts");
        tensors = import_records(s, sc, n_tensors, records, true, memo, memo ? MEMO_COMPARE : MEMO_NONE, old_n, why);
    }
    if (!tensors)
        return NULL;
    struct ggml_cgraph *graph = ggml_new_graph_custom(sc->ctx, apir_fusion_graph_size(n_nodes + 1), false);
    if (!graph || !anchor)
        return refuse(why, "scratch context full");
    ggml_graph_add_node(graph, anchor);
    ggml_backend_dev_t dev = s->host->devices[s->device];
    const enum apir_kernel_family family = apir_kernel_family_of(dev);
    for (uint32_t i = 0; i < n_nodes; i++) {
        uint64_t id;
        memcpy(&id, node_ids + (size_t)i * 8, 8);
        uint32_t j;
        if (!map_get(sc, id, &j))
            return refuse(why, "graph node id not in the tensor list");
        struct ggml_tensor *node = tensors[j];
        /* Never hand a backend an op it does not support: some abort.  The
         * memo's answer stands for a node it covers (memo_covers). */
        if (!ggml_op_is_empty(node->op)) {
            const bool answered = memo && (sc->same[j] & REC_COVERED) && memo->supported[j];
            if (!answered && !ggml_backend_dev_supports_op(dev, node))
                return refuse(why, "graph has an op the host backend does not support");
            const char *kernel_why = answered ? NULL : apir_op_device_error(family, node);
            if (kernel_why)
                return refuse(why, kernel_why);
            sc->same[j] |= REC_SUPPORTED;
        }
        if (i > 0 && !fused_norm_mul_ok(ggml_graph_node(graph, -1), node))
            return refuse(why, "MUL after an RMS_NORM it broadcasts (the CPU backend's fused kernel asserts one shape)");
        ggml_graph_add_node(graph, node);
    }
    const bool counts_given = in->use_counts && apir_decoder_left(&dec) > 0;
    if (counts_given) {
        if (apir_decode_u32(&dec) != APIR_GRAPH_USE_COUNTS_TAG || !set_use_counts(graph, &dec))
            return refuse(why, "graph use-count section malformed");
        if (apir_decoder_left(&dec) != 0)
            return refuse(why, "bytes after the graph's use counts");
    }
    /* the chains a backend may fuse (op_fusion.h) */
    apir_fusion_seal(graph, counts_given);
    if (memo) {
        for (uint32_t i = 0; i < n_tensors; i++)
            memo->supported[i] = (sc->same[i] & REC_SUPPORTED) != 0;
        memo->n = n_tensors;
        memo->epoch = s->buffers_epoch;
        memo->device = s->device;
        memo->key = in->key;
        memo->valid = true;
    }
    return graph;
}
