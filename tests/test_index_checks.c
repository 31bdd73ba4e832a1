/*
 * Index checks as the kernels read them (host/dispatch/op_policy.c): graphs built
 * with ggml's own constructors in a no-alloc context, laid out in one host
 * buffer, sent through apir_session_forward and computed on the real CPU
 * backend.  Hostile variants change the constructed tensors before they are
 * sent.  Every refusal is paired with the same graph made legitimate, which
 * is accepted: the refusal is about the index values or the walk, not the
 * graph's form.  After a refusal the whole buffer is compared with its
 * snapshot: nothing of the refused graph may have run.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-impl.h"
#include "graph_exec.h"
#include "host.h"
#include "dispatcher.h"
#include "test_records.h"
#include "test_util.h"
#include "test_session.h"

#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define DATA_RES 10u
#define DATA_SIZE (1u << 20)
#define BUF_SIZE (1u << 16)
#define STAGE 0             /* blob offset where uploads and downloads are staged */
#define GRAPH_AT (1u << 19) /* blob offset of graph messages */
#define MAX_T 128

static struct apir_host host;
static uint8_t data_blob[DATA_SIZE] __attribute__((aligned(4096)));

static struct apir_session *new_session(void)
{
    return test_session_with_blob(&host, DATA_RES, data_blob, DATA_SIZE);
}

/*
 * A graph under construction: ggml tensors (no memory) and where each lies
 * in the session's buffer.  A tensor's record id is its index + 1; a view
 * lies view_offs into its source.
 */
struct layout {
    struct ggml_context *ctx;
    struct ggml_tensor *t[MAX_T];
    uint64_t off[MAX_T];
    int n;
    uint64_t next;   /* bump allocator */
    uint64_t buf;    /* buffer handle */
    struct apir_session *s;
    const struct ggml_tensor *not_computed;  /* a node sent without GGML_TENSOR_FLAG_COMPUTE */
    uint64_t key;    /* not 0: sent keyed, with use counts */
};

static void layout_init(struct layout *l, struct apir_session *s, uint64_t buf)
{
    struct ggml_init_params p = { .mem_size = 1 << 20, .mem_buffer = NULL, .no_alloc = true };
    memset(l, 0, sizeof(*l));
    l->ctx = ggml_init(p);
    l->s = s;
    l->buf = buf;
    l->next = 256;  /* the first bytes are a guard */
}

static void layout_free(struct layout *l)
{
    ggml_free(l->ctx);
}

static int find(const struct layout *l, const struct ggml_tensor *t)
{
    for (int i = 0; i < l->n; i++)
        if (l->t[i] == t)
            return i;
    return -1;
}

/* Places t (and its sources and view source) in the buffer, once. */
static int place(struct layout *l, struct ggml_tensor *t)
{
    int i = find(l, t);
    if (i >= 0)
        return i;
    for (int k = 0; k < GGML_MAX_SRC; k++)
        if (t->src[k])
            place(l, t->src[k]);
    uint64_t off;
    if (t->view_src) {
        off = l->off[place(l, t->view_src)] + t->view_offs;
    } else {
        off = l->next;
        l->next = (l->next + ggml_nbytes(t) + 63) & ~63ull;
    }
    if (l->n == MAX_T)
        abort();
    l->t[l->n] = t;
    l->off[l->n] = off;
    return l->n++;
}

/* Puts t at a chosen offset (before anything places it). */
static void place_at(struct layout *l, struct ggml_tensor *t, uint64_t off)
{
    l->t[l->n] = t;
    l->off[l->n++] = off;
}

static struct apir_tensor_rec rec_of(struct layout *l, struct ggml_tensor *t)
{
    int i = place(l, t);
    struct apir_tensor_rec r;
    memset(&r, 0, sizeof(r));
    r.id = (uint64_t)i + 1;
    r.type = t->type;
    r.buffer = l->buf;
    for (int k = 0; k < 4; k++) {
        r.ne[k] = (uint32_t)t->ne[k];
        r.nb[k] = (uint32_t)t->nb[k];
    }
    r.op = t->op;
    memcpy(r.op_params, t->op_params, sizeof(r.op_params));
    r.flags = t->op == GGML_OP_NONE || t == l->not_computed ? 0 : GGML_TENSOR_FLAG_COMPUTE;
    r.flags |= t->flags & GGML_TENSOR_FLAG_PARAM;
    for (int k = 0; k < APIR_TENSOR_MAX_SRC && k < GGML_MAX_SRC; k++)
        r.src[k] = t->src[k] ? (uint64_t)place(l, t->src[k]) + 1 : 0;
    r.view_src = t->view_src ? (uint64_t)place(l, t->view_src) + 1 : 0;
    r.view_offs = t->view_src ? t->view_offs : 0;
    r.data = l->off[i];
    return r;
}

/* Raw bytes at an offset of the buffer (an I8 record over them). */
static void put_bytes(struct layout *l, uint64_t off, const void *p, size_t n)
{
    struct apir_tensor_rec t = f32_rec(999, l->buf, off, 1);
    t.type = GGML_TYPE_I8;
    t.ne[0] = (uint32_t)n;
    t.nb[0] = 1;
    t.nb[1] = t.nb[2] = t.nb[3] = (uint32_t)n;
    memcpy(data_blob + STAGE, p, n);
    CHECK(fwd_BUFFER_SET_TENSOR(l->s, l->buf, &t, DATA_RES, STAGE, n) == APIR_HANDLER_OK);
}

static void get_bytes(struct layout *l, uint64_t off, void *p, size_t n)
{
    struct apir_tensor_rec t = f32_rec(999, l->buf, off, 1);
    t.type = GGML_TYPE_I8;
    t.ne[0] = (uint32_t)n;
    t.nb[0] = 1;
    t.nb[1] = t.nb[2] = t.nb[3] = (uint32_t)n;
    CHECK(fwd_BUFFER_GET_TENSOR(l->s, l->buf, &t, DATA_RES, STAGE, n) == APIR_HANDLER_OK);
    memcpy(p, data_blob + STAGE, n);
}

static void put(struct layout *l, struct ggml_tensor *t, const void *p)
{
    put_bytes(l, l->off[place(l, t)], p, ggml_nbytes(t));
}

static void get(struct layout *l, struct ggml_tensor *t, void *p)
{
    get_bytes(l, l->off[place(l, t)], p, ggml_nbytes(t));
}

/* Sends nodes (in this order) with every tensor they reach; returns the
 * handler result, *status the graph's. */
static uint32_t run(struct layout *l, struct ggml_tensor **nodes, int n_nodes, uint32_t *status)
{
    for (int i = 0; i < n_nodes; i++)
        place(l, nodes[i]);
    CHECK(l->next <= BUF_SIZE);
    static struct apir_tensor_rec recs[MAX_T];
    for (int i = 0; i < l->n; i++)
        recs[i] = rec_of(l, l->t[i]);
    uint64_t ids[MAX_T];
    for (int i = 0; i < n_nodes; i++)
        ids[i] = (uint64_t)find(l, nodes[i]) + 1;
    struct apir_encoder e;
    apir_encoder_init(&e, data_blob + GRAPH_AT, DATA_SIZE - GRAPH_AT);
    apir_encode_u32(&e, (uint32_t)n_nodes);
    for (int i = 0; i < n_nodes; i++)
        apir_encode_u64(&e, ids[i]);
    apir_encode_tensor_list(&e, (uint32_t)l->n, recs);
    *status = 99;
    if (!l->key)
        return fwd_BACKEND_GRAPH_COMPUTE_AT(l->s, DATA_RES, GRAPH_AT, apir_encoder_used(&e), status);
    /* keyed, with the use counts a guest sends (each src slot that names
     * the node): what lets a backend fuse a chain */
    apir_encode_u32(&e, APIR_GRAPH_USE_COUNTS_TAG);
    for (int i = 0; i < n_nodes; i++) {
        uint32_t uses = 0;
        for (int j = 0; j < n_nodes; j++)
            for (int k = 0; k < GGML_MAX_SRC; k++)
                uses += nodes[j]->src[k] == nodes[i];
        apir_encode_u32(&e, uses);
    }
    return fwd_BACKEND_GRAPH_COMPUTE_KEYED(l->s, DATA_RES, GRAPH_AT, apir_encoder_used(&e), l->key, status);
}

static bool accepted(struct layout *l, struct ggml_tensor **nodes, int n_nodes)
{
    uint32_t status;
    uint32_t res = run(l, nodes, n_nodes, &status);
    return res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS;
}

/* Refused, and the buffer is byte for byte what it was before, but for
 * [may_off, may_off + may_len): what nodes computed before the refusing
 * split wrote. */
static bool refused_untouched_but(struct layout *l, struct ggml_tensor **nodes, int n_nodes, uint64_t may_off,
                                  uint64_t may_len)
{
    static uint8_t before[BUF_SIZE], after[BUF_SIZE];
    get_bytes(l, 0, before, BUF_SIZE);
    uint32_t status;
    uint32_t res = run(l, nodes, n_nodes, &status);
    get_bytes(l, 0, after, BUF_SIZE);
    memcpy(after + may_off, before + may_off, may_len);
    return res == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED && memcmp(before, after, BUF_SIZE) == 0;
}

static bool refused_untouched(struct layout *l, struct ggml_tensor **nodes, int n_nodes)
{
    return refused_untouched_but(l, nodes, n_nodes, 0, 0);
}

/*
 * Accepted on the CPU; on another backend (APIR_TEST_BACKEND) accepted, or
 * refused with the buffer untouched: a graph the CPU computes may hold a
 * node that device does not take (CUDA's SSM_SCAN has other state sizes;
 * the CUDA rules refuse GET_ROWS_BACK's indices with gaps, which its kernel
 * reads densely).  The security checks are the refusals either way.
 */
static bool accepted_where_supported(struct layout *l, struct ggml_tensor **nodes, int n_nodes)
{
    const char *backend = getenv("APIR_TEST_BACKEND");
    if (!backend || !*backend || strcmp(backend, "CPU") == 0)
        return accepted(l, nodes, n_nodes);
    static uint8_t before[BUF_SIZE], after[BUF_SIZE];
    get_bytes(l, 0, before, BUF_SIZE);
    uint32_t status;
    uint32_t res = run(l, nodes, n_nodes, &status);
    if (res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS)
        return true;
    get_bytes(l, 0, after, BUF_SIZE);
    fprintf(stderr, "index_checks: %s refused a graph the CPU takes (%s)\n", backend, ggml_op_desc(nodes[n_nodes - 1]));
    return res == APIR_HANDLER_BAD_REQUEST && status == GGML_STATUS_ABORTED && memcmp(before, after, BUF_SIZE) == 0;
}

static void fill_f32(struct layout *l, struct ggml_tensor *t, float scale)
{
    static float v[4096];
    int64_t n = ggml_nelements(t);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * (float)((i * 7) % 13) - 3.0f;
    put(l, t, v);
}

static void fill_i32(struct layout *l, struct ggml_tensor *t, const int32_t *v)
{
    put(l, t, v);
}

/* Experts and shapes of the MoE tests: E experts of M x K, T tokens, top U. */
enum { MOE_E = 4, MOE_K = 8, MOE_M = 4, MOE_T = 3, MOE_U = 2 };

/* out[m, j, t] = sum_k as[k, m, ids[j, t]] * b[k, 0, t] */
static bool moe_result_ok(const float *as, const float *b, const int32_t *ids, const float *out)
{
    for (int t = 0; t < MOE_T; t++)
        for (int j = 0; j < MOE_U; j++) {
            int e = ids[t * MOE_U + j];
            if (e < 0 || e >= MOE_E)
                return false;
            for (int m = 0; m < MOE_M; m++) {
                float want = 0;
                for (int k = 0; k < MOE_K; k++)
                    want += as[(e * MOE_M + m) * MOE_K + k] * b[t * MOE_K + k];
                if (fabsf(out[(t * MOE_U + j) * MOE_M + m] - want) > 1e-3f * (1 + fabsf(want)))
                    return false;
            }
        }
    return true;
}

/* The ids are the top U of each token's logits (in any order). */
static bool top_ok(const float *logits, const int32_t *ids)
{
    for (int t = 0; t < MOE_T; t++)
        for (int j = 0; j < MOE_U; j++) {
            int e = ids[t * MOE_U + j];
            int larger = 0;
            for (int x = 0; x < MOE_E; x++)
                larger += logits[t * MOE_E + x] > logits[t * MOE_E + e];
            if (larger >= MOE_U)
                return false;
        }
    return true;
}

/*
 * MoE routing as llama.cpp builds it (ggml_argsort_top_k: ARGSORT and a
 * view of its first columns; or TOP_K) feeding MUL_MAT_ID: accepted in one
 * piece (the sort covers every index read: no split) and correct.
 *
 * Variants 2 and 3: the same with the sort sent without
 * GGML_TENSOR_FLAG_COMPUTE.  Backends skip such a node (ggml leaves the
 * flag off the nodes of a branch ggml_build_forward_select did not pick),
 * and the flags are the guest's: the sort writes nothing, its memory holds
 * the guest's poison, so the ids are checked, and refused (before, the CPU
 * host's MUL_MAT_ID read expert 2^29: a segfault).
 */
static void test_moe_after_sort(void)
{
    static const int32_t poison[MOE_E * MOE_T] = { 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29,
                                                   1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29 };
    for (int variant = 0; variant < 4; variant++) {
        const bool argsort = variant % 2 == 0, skipped = variant >= 2;
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *logits = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_E, MOE_T);
        struct ggml_tensor *as = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, MOE_M, MOE_E);
        struct ggml_tensor *b = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, 1, MOE_T);
        struct ggml_tensor *ids = argsort ? ggml_argsort_top_k(l.ctx, logits, MOE_U) : ggml_top_k(l.ctx, logits, MOE_U);
        struct ggml_tensor *sorter = argsort ? ids->view_src : ids;
        struct ggml_tensor *out = ggml_mul_mat_id(l.ctx, as, b, ids);
        struct ggml_tensor *ids_copy = ggml_cont(l.ctx, ids);
        fill_f32(&l, logits, 0.37f);
        fill_f32(&l, as, 0.25f);
        fill_f32(&l, b, 0.5f);
        struct ggml_tensor *nodes[4];
        int n = 0;
        if (argsort)
            nodes[n++] = sorter;
        nodes[n++] = ids;
        nodes[n++] = out;
        nodes[n++] = ids_copy;
        if (skipped) {
            l.not_computed = sorter;
            put_bytes(&l, l.off[place(&l, sorter)], poison, ggml_nbytes(sorter));
            CHECK_MSG(refused_untouched(&l, nodes, n), "variant %d accepted or wrote", variant);
            layout_free(&l);
            apir_session_free(s);
            continue;
        }
        uint64_t segments = s->stats.n_segments;
        CHECK(accepted(&l, nodes, n));
        CHECK_MSG(s->stats.n_segments == segments + 1, "variant %d: %llu pieces", variant,
                  (unsigned long long)(s->stats.n_segments - segments));
        static float h_logits[MOE_E * MOE_T], h_as[MOE_K * MOE_M * MOE_E], h_b[MOE_K * MOE_T],
            h_out[MOE_M * MOE_U * MOE_T];
        int32_t h_ids[MOE_U * MOE_T];
        get(&l, logits, h_logits);
        get(&l, as, h_as);
        get(&l, b, h_b);
        get(&l, out, h_out);
        get(&l, ids_copy, h_ids);
        CHECK_MSG(top_ok(h_logits, h_ids), "variant %d: not the top experts", variant);
        CHECK_MSG(moe_result_ok(h_as, h_b, h_ids, h_out), "variant %d: wrong result", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/*
 * MUL_MAT_ID whose ids lie over memory ARGSORT never writes (issue 12: an
 * expert index of 2^29 reached the unchecked path): refused, nothing
 * written.  Three layouts: the ids one row past the sort's result; ids read
 * by a MUL_MAT_ID before the sort writes them; and a sort result with gaps
 * between its rows.
 */
static void test_moe_ids_not_covered(void)
{
    const int32_t poison[2 * MOE_U * MOE_T] = { 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29,
                                                1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29, 1 << 29 };
    for (int variant = 0; variant < 3; variant++) {
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *logits = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_U, MOE_T);
        struct ggml_tensor *as = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, MOE_M, MOE_E);
        struct ggml_tensor *b = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, 1, MOE_T);
        struct ggml_tensor *sorted = ggml_argsort(l.ctx, logits, GGML_SORT_ORDER_DESC);  /* [U, T] */
        struct ggml_tensor *ids = ggml_new_tensor_2d(l.ctx, GGML_TYPE_I32, MOE_U, MOE_T);
        struct ggml_tensor *out = ggml_mul_mat_id(l.ctx, as, b, ids);
        struct ggml_tensor *out2 = ggml_mul_mat_id(l.ctx, as, b, ids);
        place(&l, sorted);
        uint64_t at = l.off[find(&l, sorted)];
        /* room after the sort's result for the poison */
        l.next += 256;
        if (variant == 0)
            place_at(&l, ids, at + (uint64_t)MOE_U * 4);  /* one row on: its last row is past the sort */
        else
            place_at(&l, ids, at);
        if (variant == 2) {
            /* rows of the sort's result 16 bytes apart, 8 bytes each: the
             * gaps are never written; the ids (dense) read them */
            sorted->nb[1] = 16;
            sorted->nb[2] = sorted->nb[3] = 16 * MOE_T;
        }
        fill_f32(&l, logits, 0.37f);
        fill_f32(&l, as, 0.25f);
        fill_f32(&l, b, 0.5f);
        put_bytes(&l, at, poison, sizeof(poison));
        struct ggml_tensor *nodes[3] = { sorted, out, out2 };
        if (variant == 1) {
            nodes[0] = out;  /* the first read comes before the sort */
            nodes[1] = sorted;
        }
        /* the sort itself may have run before the refusing split */
        CHECK_MSG(refused_untouched_but(&l, nodes, 3, at, 16 * MOE_T), "variant %d accepted or wrote", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/*
 * A node that writes more than its own bytes: OPT_STEP_ADAMW's result is a
 * view of the weight, but its kernel also writes the moments m and v (its
 * srcs 2 and 3).  ids laid over v, zeros (in range) when the graph starts,
 * hold v's new values when the MUL_MAT_ID reads them - v = g^2 with beta2
 * 0, 1.0f, expert 0x3f800000 - so they are checked after the step, and
 * refused (before, only a node's own bytes counted as written: the ids were
 * checked at the start and the CPU host's MUL_MAT_ID read outside its
 * buffers).  What may change: the step's weight, m and v.
 *
 * And a token's experts must differ (op_policy.c index_read_of: ggml-cuda's
 * MUL_MAT_ID asserts it): the same graph with ids {0, 1} a token but one
 * token's {2, 2} is refused before anything runs.
 */
static void test_ids_over_adamw_moments(void)
{
    struct apir_session *s = new_session();
    struct layout l;
    layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
    struct ggml_tensor *w = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_U, MOE_T);
    ggml_set_param(w);
    struct ggml_tensor *g = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_U, MOE_T);
    struct ggml_tensor *m = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_U, MOE_T);
    struct ggml_tensor *v = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, MOE_U, MOE_T);
    struct ggml_tensor *hp = ggml_new_tensor_1d(l.ctx, GGML_TYPE_F32, 7);
    struct ggml_tensor *step = ggml_opt_step_adamw(l.ctx, w, g, m, v, hp);
    place(&l, step);
    const uint64_t w_at = l.off[find(&l, w)], v_at = l.off[find(&l, v)];
    struct ggml_tensor *ids = ggml_new_tensor_2d(l.ctx, GGML_TYPE_I32, MOE_U, MOE_T);
    place_at(&l, ids, v_at);
    struct ggml_tensor *as = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, MOE_M, MOE_E);
    struct ggml_tensor *b = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, 1, MOE_T);
    struct ggml_tensor *out = ggml_mul_mat_id(l.ctx, as, b, ids);
    static const float ones[MOE_U * MOE_T] = { 1, 1, 1, 1, 1, 1 }, zeros[MOE_U * MOE_T];
    /* alpha, beta1, beta2, eps, wd, beta1h, beta2h */
    static const float params[7] = { 0, 0, 0, 1, 0, 1, 1 };
    put(&l, w, zeros);
    put(&l, g, ones);
    put(&l, m, zeros);
    put(&l, v, zeros);
    put(&l, hp, params);
    fill_f32(&l, as, 0.25f);
    fill_f32(&l, b, 0.5f);
    struct ggml_tensor *nodes[2] = { step, out };
    CHECK(refused_untouched_but(&l, nodes, 2, w_at, v_at + ggml_nbytes(v) - w_at));
    /* refused after the step: the ids were checked as the step left them
     * (checked before it, their zeros would have been refused with v
     * unwritten - experts repeat) */
    float after[MOE_U * MOE_T];
    get(&l, v, after);
    CHECK(after[0] == 1.0f);
    layout_free(&l);
    apir_session_free(s);

    /* repeated experts, ids in memory no node writes */
    s = new_session();
    layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
    as = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, MOE_M, MOE_E);
    b = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, MOE_K, 1, MOE_T);
    ids = ggml_new_tensor_2d(l.ctx, GGML_TYPE_I32, MOE_U, MOE_T);
    out = ggml_mul_mat_id(l.ctx, as, b, ids);
    fill_f32(&l, as, 0.25f);
    fill_f32(&l, b, 0.5f);
    const int32_t distinct[MOE_U * MOE_T] = { 0, 1, 3, 2, 1, 3 }, repeated[MOE_U * MOE_T] = { 0, 1, 2, 2, 1, 3 };
    fill_i32(&l, ids, distinct);
    struct ggml_tensor *mm[1] = { out };
    CHECK(accepted(&l, mm, 1));
    fill_i32(&l, ids, repeated);
    CHECK(refused_untouched(&l, mm, 1));
    layout_free(&l);
    apir_session_free(s);
}

/*
 * ARGSORT in guest-shared memory (a CPU host's zero-copy buffers): the
 * guest may rewrite the values and the result while the host sorts, and
 * std::sort with an order that changes under it walks off the row
 * (op_policy.c sorts_in_private).  The sort runs on private copies: right
 * when left alone, and a thread rewriting both tensors all through 300
 * computes does not take the host outside them (before: a segfault within
 * a few computes).
 */
enum { SORT_N = 512, SORT_ROWS = 4, SHARED_RES = 11 };
static uint8_t shared_mem[BUF_SIZE] __attribute__((aligned(4096)));
static atomic_int flipping;
static float *flip_values;
static int32_t *flip_result;

static void *flipper(void *arg)
{
    (void)arg;
    uint32_t x = 1;
    while (atomic_load_explicit(&flipping, memory_order_relaxed)) {
        for (int i = 0; i < SORT_N * SORT_ROWS; i++) {
            x = x * 1103515245u + 12345u;
            ((volatile float *)flip_values)[i] = (float)(x >> 16);
            ((volatile int32_t *)flip_result)[i] = (int32_t)x;
        }
    }
    return NULL;
}

static void test_sort_in_shared_memory(void)
{
    struct apir_session *s = new_session();
    apir_session_blob_add(s, SHARED_RES, shared_mem, BUF_SIZE, NULL, NULL);
    uint64_t buf = 0, buft = 0;
    if (fwd_DEVICE_BUFFER_FROM_PTR(s, SHARED_RES, BUF_SIZE, 0, &buf, &buft) != APIR_HANDLER_OK) {
        /* a device without buffers over host memory (CUDA): nothing shared to sort in */
        const char *backend = getenv("APIR_TEST_BACKEND");
        CHECK_MSG(backend && strcmp(backend, "CPU") != 0, "the CPU host refused a buffer over host memory");
        fprintf(stderr, "index_checks: %s takes no buffers over host memory: no shared sort to test\n", backend);
        apir_session_free(s);
        return;
    }
    struct layout l;
    layout_init(&l, s, buf);
    struct ggml_tensor *values = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, SORT_N, SORT_ROWS);
    struct ggml_tensor *sorted = ggml_argsort(l.ctx, values, GGML_SORT_ORDER_DESC);
    static float v[SORT_N * SORT_ROWS];
    for (int i = 0; i < SORT_N * SORT_ROWS; i++)
        v[i] = (float)((i * 7919) % (SORT_N * SORT_ROWS));
    put(&l, values, v);
    struct ggml_tensor *nodes[1] = { sorted };
    const uint64_t sorts = s->stats.private_sorts;
    CHECK(accepted(&l, nodes, 1));
    CHECK(s->stats.private_sorts == sorts + 1);
    static int32_t r[SORT_N * SORT_ROWS];
    get(&l, sorted, r);
    bool ok = true;
    for (int row = 0; row < SORT_ROWS; row++)
        for (int j = 0; j < SORT_N; j++) {
            const int32_t a = r[row * SORT_N + j];
            ok &= a >= 0 && a < SORT_N;
            if (ok && j > 0)
                ok &= v[row * SORT_N + r[row * SORT_N + j - 1]] >= v[row * SORT_N + a];
        }
    CHECK_MSG(ok, "not sorted");
    flip_values = (float *)(shared_mem + l.off[find(&l, values)]);
    flip_result = (int32_t *)(shared_mem + l.off[find(&l, sorted)]);
    atomic_store(&flipping, 1);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flipper, NULL) == 0);
    for (int k = 0; k < 300; k++) {
        uint32_t status;
        run(&l, nodes, 1, &status);
    }
    atomic_store(&flipping, 0);
    pthread_join(th, NULL);
    CHECK(s->stats.private_sorts == sorts + 301);
    layout_free(&l);

    /* MoE routing's sorts, one a layer, each with its two copies: 40 of
     * them (80 copies, past the 64 shadows a graph once had) */
    layout_init(&l, s, buf);
    struct ggml_tensor *many[40];
    for (int k = 0; k < 40; k++) {
        struct ggml_tensor *x = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 8, 2);
        many[k] = ggml_argsort(l.ctx, x, GGML_SORT_ORDER_ASC);
        const float xs[16] = { 7, 6, 5, 4, 3, 2, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7 };
        put(&l, x, xs);
    }
    const uint64_t before = s->stats.private_sorts;
    CHECK(accepted(&l, many, 40));
    CHECK(s->stats.private_sorts == before + 40);
    int32_t last[16];
    get(&l, many[39], last);
    CHECK(last[0] == 7 && last[7] == 0 && last[8] == 0 && last[15] == 7);
    layout_free(&l);
    apir_session_free(s);
}

/*
 * GET_ROWS_BACK reads its indices as a dense int32 array whatever their
 * strides (issue 12: an unchecked index wrote 48 rows past the result).
 * Indices every other int32 (a legal view for ggml_get_rows_back): the
 * dense read takes the odd ones too.
 */
static void test_get_rows_back_dense(void)
{
    for (int variant = 0; variant < 3; variant++) {
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *grad = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 4, 4);
        struct ggml_tensor *all = ggml_new_tensor_1d(l.ctx, GGML_TYPE_I32, 8);
        struct ggml_tensor *idx = ggml_view_1d(l.ctx, all, 4, 0);
        idx->nb[0] = 8;  /* every other element */
        idx->nb[1] = idx->nb[2] = idx->nb[3] = 32;
        struct ggml_tensor *shape = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 4, 6);
        struct ggml_tensor *out = ggml_get_rows_back(l.ctx, grad, idx, shape);
        /* even elements (the view's) in range; odd ones 48 rows out, or in range */
        int32_t v[8] = { 0, 54, 1, 54, 2, 54, 3, 54 };
        if (variant == 1)
            for (int i = 1; i < 8; i += 2)
                v[i] = 5;
        if (variant == 2)
            idx->nb[0] = 0;  /* the dense read would leave the tensor's 4 bytes */
        fill_f32(&l, grad, 1.0f);
        fill_i32(&l, all, v);
        struct ggml_tensor *nodes[2] = { idx, out };
        if (variant == 1)
            CHECK(accepted_where_supported(&l, nodes, 2));
        else
            CHECK_MSG(refused_untouched(&l, nodes, 2), "variant %d accepted or wrote", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/*
 * SSM_SCAN reads ids[i3] for i3 < x->ne[3] as a dense array, each indexing
 * the states' ne[3]: in range accepted; a value = ne[3] refused; ids
 * shorter than the sequences (the kernel reads past them) refused.
 */
static void test_ssm_scan_ids(void)
{
    enum { D_STATE = 16, HEAD_DIM = 2, N_HEAD = 2, N_TOK = 1, N_SEQ = 2, N_RS = 2 };
    for (int variant = 0; variant < 3; variant++) {
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *st = ggml_new_tensor_4d(l.ctx, GGML_TYPE_F32, D_STATE, HEAD_DIM, N_HEAD, N_RS);
        struct ggml_tensor *x = ggml_new_tensor_4d(l.ctx, GGML_TYPE_F32, HEAD_DIM, N_HEAD, N_TOK, N_SEQ);
        struct ggml_tensor *dt = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, N_HEAD, N_TOK, N_SEQ);
        struct ggml_tensor *A = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 1, N_HEAD);
        struct ggml_tensor *B = ggml_new_tensor_4d(l.ctx, GGML_TYPE_F32, D_STATE, 1, N_TOK, N_SEQ);
        struct ggml_tensor *C = ggml_new_tensor_4d(l.ctx, GGML_TYPE_F32, D_STATE, 1, N_TOK, N_SEQ);
        struct ggml_tensor *ids = ggml_new_tensor_1d(l.ctx, GGML_TYPE_I32, N_SEQ);
        struct ggml_tensor *out = ggml_ssm_scan(l.ctx, st, x, dt, A, B, C, ids, 1);
        int32_t v[N_SEQ] = { 1, variant == 1 ? N_RS : 0 };
        if (variant == 2) {
            v[1] = 1 << 29;  /* right after a one-element ids */
            ids->ne[0] = 1;
            ids->nb[1] = ids->nb[2] = ids->nb[3] = 4;
        }
        struct ggml_tensor *leaves[6] = { st, x, dt, A, B, C };
        for (int i = 0; i < 6; i++)
            fill_f32(&l, leaves[i], 0.1f);
        place(&l, out);
        put_bytes(&l, l.off[find(&l, ids)], v, sizeof(v));
        struct ggml_tensor *nodes[1] = { out };
        if (variant == 0)
            CHECK(accepted_where_supported(&l, nodes, 1));
        else
            CHECK_MSG(refused_untouched(&l, nodes, 1), "variant %d accepted or wrote", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/* GET_ROWS and SET_ROWS (I32 and I64): the last row accepted, an index equal
 * to the row count refused. */
static void test_rows_at_the_edge(void)
{
    for (int variant = 0; variant < 6; variant++) {
        int op = variant / 2, bad = variant % 2;
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *rows = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 4, 8);
        enum ggml_type itype = op == 2 ? GGML_TYPE_I64 : GGML_TYPE_I32;
        struct ggml_tensor *idx = ggml_new_tensor_1d(l.ctx, itype, 2);
        struct ggml_tensor *out;
        if (op == 0) {
            out = ggml_get_rows(l.ctx, rows, idx);
        } else {
            struct ggml_tensor *src = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 4, 2);
            fill_f32(&l, src, 1.0f);
            out = ggml_set_rows(l.ctx, rows, src, idx);
        }
        fill_f32(&l, rows, 1.0f);
        int64_t last = bad ? 8 : 7;
        if (itype == GGML_TYPE_I64) {
            int64_t v[2] = { 0, last };
            put(&l, idx, v);
        } else {
            int32_t v[2] = { 0, (int32_t)last };
            put(&l, idx, v);
        }
        struct ggml_tensor *nodes[1] = { out };
        if (bad)
            CHECK_MSG(refused_untouched(&l, nodes, 1), "op %d: index = ne accepted or wrote", op);
        else
            CHECK_MSG(accepted(&l, nodes, 1), "op %d: last row refused", op);
        layout_free(&l);
        apir_session_free(s);
    }
}

/*
 * ADD_ID reads ids over the RESULT's ne1 x ne2: ids with fewer columns than
 * that are refused (the kernel would read past them); and an op whose
 * result lies over its own indices is refused (it would overwrite indices
 * it has yet to read).
 */
static void test_add_id_and_self_overwrite(void)
{
    for (int variant = 0; variant < 3; variant++) {
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        struct ggml_tensor *nodes[1];
        if (variant < 2) {
            struct ggml_tensor *a = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, 4, 2, 3);
            struct ggml_tensor *bias = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 4, 5);
            struct ggml_tensor *ids = ggml_new_tensor_2d(l.ctx, GGML_TYPE_I32, 2, 3);
            nodes[0] = ggml_add_id(l.ctx, a, bias, ids);
            /* variant 1: the element the kernel reads past the ids is poison */
            int32_t v[8] = { 0, 1, 2, 3, 4, variant == 1 ? 1 << 29 : 0, 1 << 29, 1 << 29 };
            fill_f32(&l, a, 1.0f);
            fill_f32(&l, bias, 1.0f);
            place(&l, nodes[0]);
            put_bytes(&l, l.off[find(&l, ids)], v, sizeof(v));
            if (variant == 1)
                ids->ne[0] = 1;  /* 1 x 3: the kernel reads 2 x 3, past the tensor's end */
        } else {
            struct ggml_tensor *rows = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, 1, 8);
            struct ggml_tensor *idx = ggml_new_tensor_1d(l.ctx, GGML_TYPE_I32, 4);
            nodes[0] = ggml_get_rows(l.ctx, rows, idx);
            fill_f32(&l, rows, 1.0f);
            place(&l, rows);
            place(&l, idx);
            place_at(&l, nodes[0], l.off[find(&l, idx)]);  /* the result over the indices */
            int32_t v[4] = { 0, 1, 2, 3 };
            put(&l, idx, v);
        }
        if (variant == 0)
            CHECK(accepted(&l, nodes, 1));
        else
            CHECK_MSG(refused_untouched(&l, nodes, 1), "variant %d accepted or wrote", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/*
 * A chain a backend fuses (host/check/op_fusion.c), sent keyed with its use
 * counts, as llama.cpp's graphs are: ROPE, VIEW, SET_ROWS, which the CPU
 * computes node by node and ggml-cuda fuses - and its fused kernel reads an
 * index per token of the ROPE, whatever the VIEW says: with a VIEW of the
 * first token only, the bytes after its one index name the row the second
 * token is written to (unchecked: here 12, inside the cache; any row, or
 * any address, for a hostile guest).  Whatever the backend, only what the
 * graph says may change: rows 3 (and 5 with both tokens) and the ROPE's
 * result.  On the CPU this holds either way; under APIR_TEST_BACKEND=CUDA
 * (bench/h200.sh check) it is the fusion rules that hold it.
 */
static void test_fused_chains(void)
{
    for (int variant = 0; variant < 2; variant++) {
        struct apir_session *s = new_session();
        struct layout l;
        layout_init(&l, s, alloc_buffer(s, BUF_SIZE));
        l.key = 500 + (uint64_t)variant;
        /* ROPE of 4 heads x 2 tokens into a 16-row cache; variant 1 stores
         * the first token only, its index 3 followed by 12 */
        const int n_dims = 16, tokens = variant == 0 ? 2 : 1;
        struct ggml_tensor *x = ggml_new_tensor_3d(l.ctx, GGML_TYPE_F32, n_dims, 4, 2);
        struct ggml_tensor *pos = ggml_new_tensor_1d(l.ctx, GGML_TYPE_I32, 2);
        struct ggml_tensor *kv = ggml_new_tensor_2d(l.ctx, GGML_TYPE_F32, n_dims * 4, 16);
        struct ggml_tensor *rope =
            ggml_rope_ext(l.ctx, x, pos, NULL, n_dims, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        struct ggml_tensor *v = ggml_view_2d(l.ctx, rope, n_dims * 4, tokens, rope->nb[2], 0);
        struct ggml_tensor *idx = ggml_new_tensor_1d(l.ctx, GGML_TYPE_I64, tokens);
        struct ggml_tensor *nodes[3] = { rope, v, ggml_set_rows(l.ctx, kv, v, idx) };
        fill_f32(&l, x, 1.0f);
        fill_f32(&l, kv, 0.5f);
        const int32_t p[2] = { 7, 8 };
        put(&l, pos, p);
        place(&l, nodes[2]);
        /* 16 bytes: with one token, the second lies in the padding after
         * the tensor (place() aligns to 64) */
        const int64_t rows[2] = { 3, variant == 0 ? 5 : 12 };
        put_bytes(&l, l.off[find(&l, idx)], rows, sizeof(rows));
        static uint8_t before[BUF_SIZE], after[BUF_SIZE];
        get_bytes(&l, 0, before, BUF_SIZE);
        CHECK_MSG(accepted(&l, nodes, 3), "rope chain %d refused", variant);
        /* the kept graph (the anchor, then the nodes): the ROPE's count is
         * its one use where the chain fuses, one no chain matches where not */
        struct ggml_cgraph *g = apir_graph_kept(s, l.key);
        CHECK(g && ggml_graph_n_nodes(g) == 4 && ggml_graph_node(g, 1)->op == GGML_OP_ROPE);
        if (g)
            CHECK(ggml_node_get_use_count(g, 1) == (variant == 0 ? 1 : INT32_MAX));
        get_bytes(&l, 0, after, BUF_SIZE);
        /* what the graph writes: the ROPE's result, row 3 (and 5) */
        const uint64_t kv_off = l.off[find(&l, kv)], row = (uint64_t)n_dims * 4 * 4;
        const uint64_t rope_off = l.off[find(&l, rope)];
        memcpy(after + rope_off, before + rope_off, ggml_nbytes(rope));
        memcpy(after + kv_off + 3 * row, before + kv_off + 3 * row, row);
        if (variant == 0)
            memcpy(after + kv_off + 5 * row, before + kv_off + 5 * row, row);
        CHECK_MSG(memcmp(before, after, BUF_SIZE) == 0, "chain %d wrote outside what its graph says", variant);
        layout_free(&l);
        apir_session_free(s);
    }
}

/* The CPU here; on a GPU machine APIR_TEST_BACKEND=CUDA (device memory:
 * indices checked from the upload mirror or read back). */
static void setup(void)
{
    if (!test_host_init_env(&host))
        exit(1);
}

static void run_setup(void) { setup(); CHECK(host.n_devices == 1); }

TEST_MAIN("index_checks",
          TEST(run_setup),
          TEST(test_moe_after_sort),
          TEST(test_moe_ids_not_covered),
          TEST(test_ids_over_adamw_moments),
          TEST(test_sort_in_shared_memory),
          TEST(test_get_rows_back_dense),
          TEST(test_ssm_scan_ids),
          TEST(test_rows_at_the_edge),
          TEST(test_add_id_and_self_overwrite),
          TEST(test_fused_chains))
