#include "weight_copies.h"

#include "buffers.h"

#include "apir_log.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-impl.h"

#include <stdlib.h>
#include <string.h>

/* One weight, repacked.  Kept in apir_weights.copies sorted by orig; the
 * ranges [orig, orig + len) never overlap (a new copy drops what it
 * overlaps). */
struct apir_weight_copy {
    const uint8_t *orig;          /* the guest's bytes, in its buffer */
    size_t len;
    ggml_backend_buffer_t orig_buf;
    ggml_backend_buffer_t buf;    /* an extra buffer type's, this copy alone */
    size_t bytes;                 /* buf's size, charged to the session */
    struct ggml_tensor tensor;    /* graphs point here: the address is stable */
};

struct apir_weights {
    struct apir_weight_copy **copies;
    uint32_t n, cap;
    uint64_t made, bytes_made;    /* copies made in the session, for the profile */
};

struct apir_weights *apir_weights_new(void)
{
    return calloc(1, sizeof(struct apir_weights));
}

/* The copies left go without charging the session: it is ending. */
void apir_weights_free(struct apir_weights *w)
{
    if (!w)
        return;
    for (uint32_t i = 0; i < w->n; i++) {
        ggml_backend_buffer_free(w->copies[i]->buf);
        free(w->copies[i]);
    }
    free(w->copies);
    free(w);
}

uint32_t apir_weights_count(const struct apir_session *s)
{
    return s->weights->n;
}

void apir_weights_log_profile(const struct apir_session *s)
{
    const struct apir_weights *w = s->weights;
    if (w->made)
        APIR_INFO("host", "%s: profile: %llu weight copies kept in the device's own layout (%.1f MiB)", s->name,
                  (unsigned long long)w->made, w->bytes_made / 1048576.0);
}

static bool copies_enabled(const struct apir_session *s)
{
    return s->host->cfg.weight_copies;
}

/*
 * Natively llama.cpp puts weights in extra buffer types only for the CPU: a
 * GPU's are listed after its default buffer type and never chosen.  Doing
 * the same keeps a remote device's placement what it would be at home.
 */
static ggml_backend_buffer_type_t *extra_bufts(ggml_backend_dev_t dev)
{
    if (!dev || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU)
        return NULL;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        reg ? (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
            : NULL;
    ggml_backend_buffer_type_t *list = get ? get(dev) : NULL;
    return list && *list ? list : NULL;
}

bool apir_weights_offered(struct apir_session *s)
{
    return copies_enabled(s) && extra_bufts(s->host->devices[s->device]) != NULL;
}

/* First index whose range ends after p (ends are sorted too: disjoint). */
static uint32_t first_ending_after(const struct apir_weights *w, const uint8_t *p)
{
    uint32_t lo = 0, hi = w->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct apir_weight_copy *c = w->copies[mid];
        if (c->orig + c->len <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void drop(struct apir_session *s, uint32_t i)
{
    struct apir_weights *w = s->weights;
    struct apir_weight_copy *c = w->copies[i];
    ggml_backend_buffer_free(c->buf);
    s->bytes_allocated -= c->bytes;
    free(c);
    memmove(&w->copies[i], &w->copies[i + 1], (size_t)(w->n - i - 1) * sizeof(*w->copies));
    w->n--;
    s->buffers_epoch++;  /* kept graphs may read the copy */
}

void apir_weights_forget_range(struct apir_session *s, const void *data, size_t len)
{
    struct apir_weights *w = s->weights;
    if (!w->n)
        return;
    const uint8_t *p = data;
    const uint8_t *end = p + (len ? len : 1);
    uint32_t i = first_ending_after(w, p);
    while (i < w->n && w->copies[i]->orig < end)
        drop(s, i);
}

void apir_weights_forget_buffer(struct apir_session *s, ggml_backend_buffer_t buf)
{
    struct apir_weights *w = s->weights;
    for (uint32_t i = 0; i < w->n;) {
        if (w->copies[i]->orig_buf == buf)
            drop(s, i);
        else
            i++;
    }
}

/* Whether the backend runs a MUL_MAT (2-D weight) or MUL_MAT_ID (3-D, one
 * matrix per expert) on w as placed, asked as llama.cpp asks when it picks
 * a weight's buffer type: with an F32 activation. */
static bool backend_takes(ggml_backend_dev_t dev, struct ggml_tensor *w)
{
    struct ggml_tensor x = { 0 }, ids = { 0 }, op = { 0 };
    x.type = GGML_TYPE_F32;
    x.ne[0] = w->ne[0];
    x.ne[1] = x.ne[2] = x.ne[3] = 1;
    op.type = GGML_TYPE_F32;
    op.ne[0] = w->ne[1];
    op.ne[1] = op.ne[2] = op.ne[3] = 1;
    op.src[0] = w;
    op.src[1] = &x;
    if (ggml_n_dims(w) == 3) {
        ids.type = GGML_TYPE_I32;
        ids.ne[0] = ids.ne[1] = ids.ne[2] = ids.ne[3] = 1;
        op.op = GGML_OP_MUL_MAT_ID;
        op.src[2] = &ids;
    } else {
        op.op = GGML_OP_MUL_MAT;
    }
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        x.nb[i] = i == 0 ? sizeof(float) : x.nb[i - 1] * (size_t)x.ne[i - 1];
        op.nb[i] = i == 0 ? sizeof(float) : op.nb[i - 1] * (size_t)op.ne[i - 1];
        ids.nb[i] = i == 0 ? sizeof(int32_t) : ids.nb[i - 1] * (size_t)ids.ne[i - 1];
    }
    return ggml_backend_dev_supports_op(dev, &op);
}

static bool insert(struct apir_weights *w, struct apir_weight_copy *c)
{
    if (w->n == w->cap) {
        uint32_t cap = w->cap ? w->cap * 2 : 64;
        void *p = realloc(w->copies, (size_t)cap * sizeof(*w->copies));
        if (!p)
            return false;
        w->copies = p;
        w->cap = cap;
    }
    uint32_t i = first_ending_after(w, c->orig);
    memmove(&w->copies[i + 1], &w->copies[i], (size_t)(w->n - i) * sizeof(*w->copies));
    w->copies[i] = c;
    w->n++;
    return true;
}

/* A copy of t in one extra buffer type, or NULL when that type does not
 * take it (the backend says which: a repack buffer aborts on a tensor its
 * kernels cannot use, so this is asked before any byte is written). */
static struct apir_weight_copy *copy_in(struct apir_session *s, ggml_backend_buffer_type_t buft, const struct ggml_tensor *t)
{
    struct apir_weight_copy *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    struct ggml_tensor *w = &c->tensor;
    w->type = t->type;
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        w->ne[i] = t->ne[i];
    w->nb[0] = ggml_type_size(t->type);
    w->nb[1] = ggml_row_size(t->type, t->ne[0]);
    for (int i = 2; i < GGML_MAX_DIMS; i++)
        w->nb[i] = w->nb[i - 1] * (size_t)w->ne[i - 1];
    snprintf(w->name, sizeof(w->name), "%s", t->name);
    /* Asked first with a buffer of no memory, as llama.cpp asks: most
     * weights (norms, F16 matrices) no extra type takes, and allocating
     * for them would cost a model load its time. */
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = probe;
    bool takes = probe && backend_takes(s->host->devices[s->device], w);
    w->buffer = NULL;
    if (probe)
        ggml_backend_buffer_free(probe);
    if (!takes) {
        free(c);
        return NULL;
    }
    size_t bytes = ggml_backend_buft_get_alloc_size(buft, w);
    if (bytes < ggml_nbytes(w) || bytes > apir_buffer_bytes_left(s)) {
        free(c);
        return NULL;
    }
    c->buf = ggml_backend_buft_alloc_buffer(buft, bytes);
    if (!c->buf || ggml_backend_buffer_get_size(c->buf) < bytes ||
        ggml_backend_tensor_alloc(c->buf, w, ggml_backend_buffer_get_base(c->buf)) != GGML_STATUS_SUCCESS ||
        !backend_takes(s->host->devices[s->device], w)) {
        if (c->buf)
            ggml_backend_buffer_free(c->buf);
        free(c);
        return NULL;
    }
    c->bytes = ggml_backend_buffer_get_size(c->buf);
    apir_buffer_prefer_huge_pages(&s->host->cfg, c->buf);
    return c;
}

enum apir_weight_note apir_weights_note(struct apir_session *s, struct apir_host_buffer *hb, const struct ggml_tensor *t)
{
    if (!copies_enabled(s))
        return APIR_WEIGHT_NEVER;
    ggml_backend_buffer_type_t *extras = extra_bufts(s->host->devices[hb->device]);
    if (!extras)
        return APIR_WEIGHT_NEVER;
    if (hb->device != s->device)
        return APIR_WEIGHT_NOT_KEPT;
    const size_t len = ggml_nbytes(t);
    /* Whatever happens below, a copy of these bytes made before is old. */
    apir_weights_forget_range(s, t->data, len);
    /* Only what a kernel reads as a whole matrix: contiguous, 2-D or 3-D,
     * in host memory the copy can be made from. */
    const int dims = ggml_n_dims(t);
    if (len == 0 || t->view_src || !ggml_is_contiguous(t) || (dims != 2 && dims != 3) ||
        !ggml_backend_buffer_is_host(hb->buffer))
        return APIR_WEIGHT_NOT_KEPT;
    for (ggml_backend_buffer_type_t *b = extras; *b; b++) {
        struct apir_weight_copy *c = copy_in(s, *b, t);
        if (!c)
            continue;
        c->orig = t->data;
        c->len = len;
        c->orig_buf = hb->buffer;
        if (!insert(s->weights, c)) {
            ggml_backend_buffer_free(c->buf);
            free(c);
            return APIR_WEIGHT_NOT_KEPT;
        }
        /* The backend's own set_tensor lays the bytes out (a repack). */
        ggml_backend_tensor_set(&c->tensor, t->data, 0, len);
        s->bytes_allocated += c->bytes;
        s->weights->made++;
        s->weights->bytes_made += c->bytes;
        s->buffers_epoch++;  /* graphs kept before this would not use it */
        APIR_DEBUG("host", "%s: weight '%s' (%s, %zu bytes) kept in %s", s->name, t->name, ggml_type_name(t->type), len,
                   ggml_backend_buft_name(*b));
        return APIR_WEIGHT_KEPT;
    }
    return APIR_WEIGHT_NOT_KEPT;
}

static struct apir_weight_copy *copy_of(const struct apir_weights *weights, const struct ggml_tensor *w)
{
    if (!w || w->op != GGML_OP_NONE || w->view_src || !w->data)
        return NULL;
    uint32_t i = first_ending_after(weights, w->data);
    if (i >= weights->n)
        return NULL;
    struct apir_weight_copy *c = weights->copies[i];
    if (c->orig != (const uint8_t *)w->data || c->orig_buf != w->buffer || c->tensor.type != w->type)
        return NULL;
    for (int d = 0; d < GGML_MAX_DIMS; d++)
        if (c->tensor.ne[d] != w->ne[d] || c->tensor.nb[d] != w->nb[d])
            return NULL;
    return c;
}

void apir_weights_apply(struct apir_session *s, struct ggml_cgraph *graph)
{
    if (!s->weights->n)
        return;
    const int n = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        if (!ggml_op_is_empty(node->op) && node->data)
            apir_weights_forget_range(s, node->data, ggml_nbytes(node));
    }
    ggml_backend_dev_t dev = s->host->devices[s->device];
    for (int i = 0; i < n && s->weights->n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        if (node->op != GGML_OP_MUL_MAT && node->op != GGML_OP_MUL_MAT_ID)
            continue;
        struct ggml_tensor *w = node->src[0];
        struct apir_weight_copy *c = copy_of(s->weights, w);
        if (!c)
            continue;
        node->src[0] = &c->tensor;
        if (!ggml_backend_dev_supports_op(dev, node))
            node->src[0] = w;
    }
}

bool apir_weights_consistent(const struct apir_session *s)
{
    const struct apir_weights *w = s->weights;
    for (uint32_t i = 0; i < w->n; i++) {
        const struct apir_weight_copy *c = w->copies[i];
        if (!c->buf || c->len != ggml_nbytes(&c->tensor) || c->tensor.buffer != c->buf)
            return false;
        if (i && w->copies[i - 1]->orig + w->copies[i - 1]->len > c->orig)
            return false;
    }
    return true;
}
