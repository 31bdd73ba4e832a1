/*
 * Strides ggml could have built (issue 24, class 1; issue 29's fuzz_op-61).
 *
 * Import makes the stride of every size-1 dimension of a contiguous
 * tensor canonical (host/check/import.c), and every operand whose addresses a
 * CPU kernel forms from another operand's counts or strides must agree
 * with it (host/check/op_operands.c: a table op -> rule; an op without a rule is
 * refused).  Here:
 *  - the table is enumerated: every op has a rule but the ones refused
 *    outright, and a node of an op without one is refused;
 *  - import's canonical strides, for leaves and views;
 *  - the attacks of the hostile-guests report replayed through a session's
 *    graph compute on the real CPU backend.  Every tensor lies in a buffer
 *    of its own (DEVICE_BUFFER_FROM_PTR over a mapping with a PROT_NONE page
 *    on each side, the tensor flush with its end), computed in a child
 *    process: an access past an operand's end faults (a finding, as a
 *    kernel's abort or a compute that does not end are), and every byte
 *    that changed must lie in what the node may write.  Each attack is
 *    either refused with nothing written, or computed on canonical strides
 *    (with the result the guest's ggml would give, where checked).
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "host.h"
#include "import.h"
#include "op_derive.h"
#include "op_operands.h"
#include "op_shapes.h"
#include "dispatcher.h"
#include "test_records.h"
#include "test_op_checks.h"
#include "test_util.h"
#include "test_session.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define REGION_SIZE (64u * 1024u)
#define N_REGIONS 12
#define MSG_RES 3u
#define REGION_RES0 10u
#define MSG_SIZE (256u * 1024u)
#define MAX_T 32
#define HUGE_STRIDE 0x40000000u  /* 1 GiB: the report's D, on a size-1 dimension */
#define CHILD_SECONDS 10

static struct apir_host host;
static bool host_ok;
static uint8_t *regions[N_REGIONS];  /* [PROT_NONE page][REGION_SIZE][PROT_NONE page] */
static uint8_t msg_blob[MSG_SIZE] __attribute__((aligned(4096)));
static uint8_t snapshot[N_REGIONS][REGION_SIZE];

static struct ggml_context *ctx;

static void fresh_ctx(void)
{
    if (ctx)
        ggml_free(ctx);
    struct ggml_init_params p = { .mem_size = 4 << 20, .mem_buffer = NULL, .no_alloc = true };
    ctx = ggml_init(p);
}

static struct ggml_tensor *f32(int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    return ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n0, n1, n2, n3);
}

static void run_setup(void)
{
    host_ok = test_host_init_cpu(&host);
    CHECK(host_ok);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int r = 0; r < N_REGIONS; r++) {
        uint8_t *p = mmap(NULL, REGION_SIZE + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        if (p == MAP_FAILED)
            abort();
        CHECK(mprotect(p, page, PROT_NONE) == 0 && mprotect(p + page + REGION_SIZE, page, PROT_NONE) == 0);
        regions[r] = p + page;
    }
}

/* ---- the rule table -------------------------------------------------------- */

static bool refused_outright(int op)
{
    /* FLASH_ATTN_BACK: its constructor always aborts; the custom ops carry
     * host function pointers (import.c refuses them by op) */
    return op == GGML_OP_FLASH_ATTN_BACK || op == GGML_OP_MAP_CUSTOM1 || op == GGML_OP_MAP_CUSTOM2 ||
           op == GGML_OP_MAP_CUSTOM3 || op == GGML_OP_CUSTOM;
}

static void test_rule_table(void)
{
    int with_rule = 0;
    for (int op = 0; op < GGML_OP_COUNT; op++) {
        const char *rule = apir_op_operand_rule(op);
        if (refused_outright(op)) {
            CHECK_MSG(rule == NULL, "%s has a rule", ggml_op_name((enum ggml_op)op));
            continue;
        }
        CHECK_MSG(rule != NULL && strlen(rule) > 20, "%s has no operand rule", ggml_op_name((enum ggml_op)op));
        with_rule += rule != NULL;
    }
    CHECK(apir_op_operand_rule(-1) == NULL && apir_op_operand_rule(GGML_OP_COUNT) == NULL);
    printf("strides: %d of %d ops have an operand rule\n", with_rule, GGML_OP_COUNT);
    /* the default is refusal: a node of an op without a rule */
    fresh_ctx();
    struct ggml_tensor *x = f32(16, 4, 1, 1);
    struct ggml_tensor *t = f32(16, 4, 1, 1);
    t->op = GGML_OP_FLASH_ATTN_BACK;
    t->src[0] = t->src[1] = t->src[2] = t->src[3] = x;
    const char *why = apir_op_operands_error(t, false);
    CHECK_MSG(why && strstr(why, "without an operand rule"), "got %s", why ? why : "(accepted)");
    /* and every rule the issue names is one the table states */
    CHECK(strstr(apir_op_operand_rule(GGML_OP_OPT_STEP_ADAMW), "m and v") != NULL);
    CHECK(strstr(apir_op_operand_rule(GGML_OP_GET_ROWS_BACK), "as many rows as indices") != NULL);
    CHECK(strstr(apir_op_operand_rule(GGML_OP_SSM_SCAN), "nb[3]") != NULL);
    CHECK(strstr(apir_op_operand_rule(GGML_OP_CLAMP), "j * nb[1]") != NULL);
}

/* ---- canonical strides at import -------------------------------------------- */

static void test_import_canonical(void)
{
    if (!host_ok)
        return;
    struct apir_session *s = apir_session_new(&host, "strides");
    s->minor = APIR_VERSION_MINOR;
    uint64_t buf = alloc_buffer(s, 1 << 16);
    const char *why = NULL;
    struct apir_import_scratch sc;
    memset(&sc, 0, sizeof(sc));
    CHECK(apir_import_begin(&sc, 8, 0, &why));

    /* the report's tensor: [8, 1, 2, 1], nb[1] = 1 GiB */
    struct apir_tensor_rec r = f32_rec(1, buf, 64, 8);
    r.ne[2] = 2;
    r.nb[1] = HUGE_STRIDE;
    r.nb[2] = 32;
    r.nb[3] = 0xffffffffu;
    struct ggml_tensor *t = apir_import_tensor(s, &sc, &r, true, NULL, &why);
    CHECK(t != NULL);
    if (t) {
        CHECK(t->nb[0] == 4 && t->nb[1] == 32 && t->nb[2] == 32 && t->nb[3] == 64);
        CHECK(ggml_nbytes(t) == 64 && ggml_is_contiguous(t));
    }
    /* a transposed [4, 1] (dimension 0 of size 1 with the row stride) */
    r = f32_rec(2, buf, 0, 1);
    r.ne[1] = 4;
    r.nb[0] = 16;
    r.nb[1] = 4;
    r.nb[2] = r.nb[3] = 7;
    t = apir_import_tensor(s, &sc, &r, true, NULL, &why);
    CHECK(t && t->nb[0] == 4 && t->nb[1] == 4 && t->nb[2] == 16 && t->nb[3] == 16 && ggml_is_contiguous(t));
    /* a tensor that is not contiguous keeps its strides (ggml gives
     * permuted views other size-1 strides, and looks at them) */
    r = f32_rec(3, buf, 0, 8);
    r.ne[1] = 3;
    r.nb[1] = 100;
    r.nb[2] = 7;
    r.nb[3] = HUGE_STRIDE;
    t = apir_import_tensor(s, &sc, &r, true, NULL, &why);
    CHECK(t && t->nb[1] == 100 && t->nb[2] == 7 && t->nb[3] == HUGE_STRIDE);
    /* a block type: nb[1] is the row of ne[0] / block elements */
    r = f32_rec(4, buf, 0, 64);
    r.type = GGML_TYPE_Q8_0;
    r.nb[0] = 34;
    r.nb[1] = 5;
    t = apir_import_tensor(s, &sc, &r, true, NULL, &why);
    CHECK(t && t->nb[1] == 68);

    /* a view (and an in-place node, a view too) in a list: canonical as well */
    struct apir_tensor_rec list[2] = { f32_rec(1, buf, 0, 8), f32_rec(2, buf, 0, 8) };
    list[0].ne[2] = 2;
    list[0].nb[2] = 32;
    list[0].nb[3] = 64;
    list[1] = list[0];
    list[1].id = 2;
    list[1].nb[1] = HUGE_STRIDE;
    list[1].nb[3] = 3;
    list[1].op = GGML_OP_VIEW;
    list[1].view_src = 1;
    CHECK(apir_import_begin(&sc, 2, 0, &why));
    struct ggml_tensor **ts = apir_import_list(s, &sc, 2, (const uint8_t *)list, true, &why);
    CHECK_MSG(ts != NULL, "%s", why);
    if (ts)
        CHECK(ts[1]->nb[1] == 32 && ts[1]->nb[3] == 64 && ggml_are_same_shape(ts[0], ts[1]) && ggml_are_same_stride(ts[0], ts[1]));
    apir_import_scratch_free(&sc);
    apir_session_free(s);

    /* the function itself: only a contiguous tensor's size-1 dimensions
     * change; a channels-last kernel as test-backend-ops makes it for
     * CONV_2D_DW ([3, 3, 1, 9] permuted from a contiguous [9, 1, 3, 3])
     * keeps nb[2] = 36, which the CPU kernel asserts is <= nb[0] */
    fresh_ctx();
    struct ggml_tensor *c = f32(3, 1, 5, 1);
    c->nb[1] = 9;
    c->nb[3] = 11;
    CHECK(apir_canonical_unit_strides(c));
    CHECK(c->nb[0] == 4 && c->nb[1] == 12 && c->nb[2] == 12 && c->nb[3] == 60);
    struct ggml_tensor *k = ggml_permute(ctx, ggml_cont(ctx, ggml_permute(ctx, f32(3, 3, 1, 9), 2, 3, 1, 0)), 3, 2, 0, 1);
    const size_t knb[4] = { k->nb[0], k->nb[1], k->nb[2], k->nb[3] };
    CHECK(knb[2] == 36 && knb[0] >= knb[2]);
    CHECK(apir_canonical_unit_strides(k));
    CHECK(memcmp(knb, k->nb, sizeof(knb)) == 0);
}

/* ---- layout rules in-process (the nodes are only checked) ------------------- */

static void test_rules_in_process(void)
{
    fresh_ctx();
    /* rows read as arrays from their starts: at least as wide as their
     * elements (a permuted source is; half-stride rows are not) */
    struct ggml_tensor *narrow = f32(16, 4, 1, 1);
    narrow->nb[0] = 2;
    narrow->nb[1] = 128;
    narrow->nb[2] = narrow->nb[3] = 512;
    REFUSED(ggml_sum(ctx, narrow), "rows narrower");
    REFUSED(ggml_mean(ctx, narrow), "rows narrower");
    REFUSED(ggml_argmax(ctx, narrow), "rows narrower");
    REFUSED(ggml_get_rows(ctx, narrow, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2)), "rows narrower");
    ACCEPTED(ggml_sum(ctx, ggml_transpose(ctx, f32(33, 256, 1, 1))));
    ACCEPTED(ggml_sum(ctx, f32(16, 4, 1, 1)));
    /* CLAMP / LEAKY_RELU / CROSS_ENTROPY_LOSS walk rows at j * nb[1] */
    struct ggml_tensor *gapped = f32(8, 2, 2, 1);
    gapped->nb[1] = 1024;
    gapped->nb[2] = 32;
    gapped->nb[3] = 64;
    REFUSED(ggml_clamp(ctx, gapped, -1.0f, 1.0f), "rows not at j * nb[1]");
    REFUSED(ggml_leaky_relu(ctx, gapped, 0.1f, true), "rows not at j * nb[1]");
    REFUSED(ggml_cross_entropy_loss(ctx, gapped, f32(8, 2, 2, 1)), "rows not at j * nb[1]");
    ACCEPTED(ggml_clamp(ctx, f32(8, 2, 2, 1), -1.0f, 1.0f));
    ACCEPTED(ggml_clamp(ctx, ggml_view_2d(ctx, f32(8, 4, 1, 1), 4, 4, 32, 0), -1.0f, 1.0f));  /* 2-D: any row stride */
    /* a REPEAT of I64 has no CPU kernel (GGML_ABORT) */
    REFUSED(ggml_repeat(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 4), f32(4, 2, 1, 1)), "source type");
    ACCEPTED(ggml_repeat(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4), ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 4, 2)));
    /* CONCAT of a type concat_any copies by rows: rows dense */
    struct ggml_tensor *i64 = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 4, 2);
    i64->nb[0] = 16;
    i64->nb[1] = i64->nb[2] = i64->nb[3] = 64;
    REFUSED(ggml_concat(ctx, i64, ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 4, 2), 1), "CONCAT rows not dense");
    ACCEPTED(ggml_concat(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 4, 2), ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 4, 2), 1));
    /* ROPE vision: n_dims half the row (the kernel asserts it; more reads past it) */
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 16);
    int vision[4] = { 4, 4, 0, 0 };
    REFUSED(ggml_rope_multi(ctx, f32(8, 2, 4, 1), pos, NULL, 8, vision, GGML_ROPE_TYPE_VISION, 4096, 1e4f, 1, 0, 1, 32, 1),
            "ROPE vision");
    ACCEPTED(ggml_rope_multi(ctx, f32(8, 2, 4, 1), pos, NULL, 4, vision, GGML_ROPE_TYPE_VISION, 4096, 1e4f, 1, 0, 1, 32, 1));
    /* CONV_3D channel counts of the wrong sign (their products pass the
     * constructor; the kernel divides by a patch's size) */
    REFUSED(ggml_conv_3d_direct(ctx, f32(1, 1, 1, 2), f32(4, 4, 4, 2), 1, 1, 1, 0, 0, 0, 1, 1, 1, -1, -2, -2), "channels");
    ACCEPTED(ggml_conv_3d_direct(ctx, f32(1, 1, 1, 2), f32(4, 4, 4, 2), 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 2, 2));
    /* UPSCALE: the float index of the last element rounds to the source's
     * length (16800176 / 2 in float); an empty source with a result */
    REFUSED(ggml_interpolate(ctx, f32(2, 1, 1, 1), 16800176, 1, 1, 1, GGML_SCALE_MODE_NEAREST), "UPSCALE source index");
    ACCEPTED(ggml_interpolate(ctx, f32(2, 1, 1, 1), 16800176, 1, 1, 1, GGML_SCALE_MODE_BILINEAR));  /* clamped */
    ACCEPTED(ggml_interpolate(ctx, f32(2, 3, 1, 1), 64, 12, 1, 1, GGML_SCALE_MODE_NEAREST));
    REFUSED(ggml_interpolate(ctx, f32(2, 3, 0, 1), 4, 6, 2, 1, GGML_SCALE_MODE_BILINEAR), "UPSCALE source index");
    /* MUL_MAT with the Hadamard hint writes src1's row length into result
     * rows of src0's row count */
    struct ggml_tensor *h = ggml_mul_mat(ctx, f32(64, 1, 1, 1), f32(64, 2, 1, 1));
    ggml_mul_mat_set_hint(h, GGML_HINT_SRC0_IS_HADAMARD);
    REFUSED(h, "Hadamard");
    h = ggml_mul_mat(ctx, f32(64, 64, 1, 1), f32(64, 2, 1, 1));
    ggml_mul_mat_set_hint(h, GGML_HINT_SRC0_IS_HADAMARD);
    ACCEPTED(h);
    h = ggml_mul_mat(ctx, f32(48, 48, 1, 1), f32(48, 2, 1, 1));  /* not a power of two: asserted */
    ggml_mul_mat_set_hint(h, GGML_HINT_SRC0_IS_HADAMARD);
    REFUSED(h, "Hadamard");
    /* MUL_MAT_ID converts a src1 that is not the weights' vec_dot type from
     * f32, asserting it is (fuzz_op-63) */
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 1);
    REFUSED(ggml_mul_mat_id(ctx, f32(32, 4, 2, 1), ggml_new_tensor_3d(ctx, GGML_TYPE_I16, 32, 1, 1), ids),
            "neither f32 nor");
    ACCEPTED(ggml_mul_mat_id(ctx, f32(32, 4, 2, 1), f32(32, 1, 1, 1), ids));
    ACCEPTED(ggml_mul_mat_id(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 32, 4, 2),
                             ggml_new_tensor_3d(ctx, GGML_TYPE_Q8_0, 32, 1, 1), ids));
    REFUSED(ggml_mul_mat_id(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 32, 4, 2),
                            ggml_new_tensor_3d(ctx, GGML_TYPE_F16, 32, 1, 1), ids), "neither f32 nor");
    /* the constructor's own channels-last result strides compare as import
     * makes a node's (batch and channel dimensions of size 1) */
    struct ggml_tensor *cwhn = ggml_permute(ctx, f32(1, 6, 5, 1), 2, 0, 1, 3);  /* [6, 5, 1 channel, 1] */
    ACCEPTED(ggml_conv_2d_dw_direct(ctx, f32(3, 3, 1, 1), cwhn, 1, 1, 1, 1, 1, 1));
}

/* ---- the attacks, computed ------------------------------------------------ */

struct rig {
    struct apir_session *s;
    uint64_t buf[N_REGIONS];
    struct ggml_tensor *t[MAX_T];
    int region[MAX_T];
    uint64_t off[MAX_T];
    int n, n_regions;
};

static bool rig_init(struct rig *r)
{
    memset(r, 0, sizeof(*r));
    if (!host_ok)
        return false;
    fresh_ctx();
    r->s = apir_session_new(&host, "strides");
    r->s->minor = APIR_VERSION_MINOR;
    bool ok = apir_session_blob_add(r->s, MSG_RES, msg_blob, MSG_SIZE, NULL, NULL);
    for (int i = 0; i < N_REGIONS && ok; i++) {
        ok = apir_session_blob_add(r->s, REGION_RES0 + (uint32_t)i, regions[i], REGION_SIZE, NULL, NULL);
        uint64_t buft = 0;
        ok = ok && fwd_DEVICE_BUFFER_FROM_PTR(r->s, REGION_RES0 + (uint32_t)i, REGION_SIZE, REGION_SIZE, &r->buf[i],
                                              &buft) == APIR_HANDLER_OK;
    }
    CHECK(ok);
    /* every byte of every region: small floats */
    uint32_t x = 0x9e3779b9u;
    for (int i = 0; i < N_REGIONS; i++)
        for (uint32_t k = 0; k < REGION_SIZE; k += 4) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            float f = (float)(int32_t)(x % 2000u - 1000) / 512.0f;
            memcpy(regions[i] + k, &f, 4);
        }
    return ok;
}

static void rig_free(struct rig *r)
{
    if (r->s)
        apir_session_free(r->s);
}

static int find(const struct rig *r, const struct ggml_tensor *t)
{
    for (int i = 0; i < r->n; i++)
        if (r->t[i] == t)
            return i;
    return -1;
}

/* Places t and what it reaches: a tensor that is no view in a region of
 * its own, flush with the region's end (the guard page follows). */
static int place(struct rig *r, struct ggml_tensor *t)
{
    int i = find(r, t);
    if (i >= 0)
        return i;
    for (int k = 0; k < GGML_MAX_SRC; k++)
        if (t->src[k] && t->src[k] != t)
            place(r, t->src[k]);
    if (t->view_src)
        place(r, t->view_src);
    if (r->n == MAX_T)
        abort();
    i = r->n++;
    r->t[i] = t;
    if (t->view_src) {
        int v = find(r, t->view_src);
        r->region[i] = r->region[v];
        r->off[i] = r->off[v] + t->view_offs;
    } else {
        if (r->n_regions == N_REGIONS || ggml_nbytes(t) > REGION_SIZE)
            abort();
        r->region[i] = r->n_regions++;
        r->off[i] = REGION_SIZE - ggml_nbytes(t);
    }
    return i;
}

static uint8_t *data_of(struct rig *r, struct ggml_tensor *t)
{
    int i = place(r, t);
    return regions[r->region[i]] + r->off[i];
}

static float *elem(struct rig *r, struct ggml_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (float *)(data_of(r, t) + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
}

static struct apir_tensor_rec rec_of(struct rig *r, int i)
{
    const struct ggml_tensor *t = r->t[i];
    struct apir_tensor_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.id = (uint64_t)i + 1;
    rec.type = t->type;
    rec.buffer = r->buf[r->region[i]];
    for (int k = 0; k < 4; k++) {
        rec.ne[k] = (uint32_t)t->ne[k];
        rec.nb[k] = (uint32_t)t->nb[k];
    }
    rec.op = t->op;
    memcpy(rec.op_params, t->op_params, sizeof(rec.op_params));
    rec.flags = t->flags | (t->op != GGML_OP_NONE ? GGML_TENSOR_FLAG_COMPUTE : 0);
    for (int k = 0; k < APIR_TENSOR_MAX_SRC && k < GGML_MAX_SRC; k++)
        rec.src[k] = t->src[k] ? (uint64_t)find(r, t->src[k]) + 1 : 0;
    rec.view_src = t->view_src ? (uint64_t)find(r, t->view_src) + 1 : 0;
    rec.view_offs = t->view_src ? t->view_offs : 0;
    rec.data = r->off[i];
    return rec;
}

static bool send_graph(struct rig *r, struct ggml_tensor *const *nodes, int n_nodes)
{
    static struct apir_tensor_rec recs[MAX_T];
    for (int i = 0; i < r->n; i++)
        recs[i] = rec_of(r, i);
    struct apir_encoder e;
    apir_encoder_init(&e, msg_blob, MSG_SIZE);
    apir_encode_u32(&e, (uint32_t)n_nodes);
    for (int i = 0; i < n_nodes; i++)
        apir_encode_u64(&e, (uint64_t)find(r, nodes[i]) + 1);
    apir_encode_tensor_list(&e, (uint32_t)r->n, recs);
    uint32_t status = 99;
    uint32_t res = fwd_BACKEND_GRAPH_COMPUTE_AT(r->s, MSG_RES, 0, apir_encoder_used(&e), &status);
    return res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS;
}

enum outcome { RAN = 10, REFUSED_CLEAN = 11, STRAY_WRITE = 20, WRONG_RESULT = 21 };

/* Checks the results the child computed (regions as they are now, the
 * inputs as they were: snapshot). */
typedef bool (*verify_fn)(struct rig *r);

static const float *before(struct rig *r, struct ggml_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    int i = place(r, t);
    return (const float *)(snapshot[r->region[i]] + r->off[i] + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] +
                           i3 * t->nb[3]);
}

/*
 * Computes nodes in a child; writable: the tensors whose bytes the nodes
 * may change.  Returns an outcome, or minus the signal that ended the child
 * (a fault: an access outside the regions' operands; SIGABRT: a kernel's
 * assert; SIGALRM: a compute that did not end).
 */
static int compute_in_child(struct rig *r, struct ggml_tensor *const *nodes, int n_nodes,
                            struct ggml_tensor *const *writable, int n_writable, verify_fn verify)
{
    for (int i = 0; i < n_nodes; i++)
        place(r, nodes[i]);
    for (int i = 0; i < r->n_regions; i++)
        memcpy(snapshot[i], regions[i], REGION_SIZE);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(CHILD_SECONDS);
        bool ran = send_graph(r, nodes, n_nodes);
        static uint8_t allow[N_REGIONS][REGION_SIZE];
        memset(allow, 0, sizeof(allow));
        for (int w = 0; ran && w < n_writable; w++) {
            int i = find(r, writable[w]);
            memset(allow[r->region[i]] + r->off[i], 1, ggml_nbytes(writable[w]));
        }
        for (int g = 0; g < r->n_regions; g++)
            for (uint32_t k = 0; k < REGION_SIZE; k++)
                if (regions[g][k] != snapshot[g][k] && !allow[g][k]) {
                    fprintf(stderr, "strides: byte %u of region %d changed (%s)\n", k, g, ran ? "ran" : "refused");
                    _exit(STRAY_WRITE);
                }
        if (ran && verify && !verify(r))
            _exit(WRONG_RESULT);
        _exit(ran ? RAN : REFUSED_CLEAN);
    }
    int status = 0;
    pid_t w;
    do
        w = pid > 0 ? waitpid(pid, &status, 0) : -1;
    while (w < 0 && errno == EINTR);
    if (w != pid)
        return -1000;
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return WEXITSTATUS(status);
}

#define EXPECT(got, want, what)                                                               \
    CHECK_MSG((got) == (want), "%s: %s (got %d: %s)", what, (want) == RAN ? "should run" : "should be refused", \
              (got), (got) < 0 ? strsignal(-(got)) : (got) == STRAY_WRITE ? "a stray write" :             \
              (got) == WRONG_RESULT ? "a wrong result" : (got) == RAN ? "ran" : "refused")

/* [8, 1, 2, 1] f32 with the stride of its size-1 dimension 1 at 1 GiB */
static struct ggml_tensor *huge_row_stride(void)
{
    struct ggml_tensor *x = f32(8, 1, 2, 1);
    x->nb[1] = HUGE_STRIDE;
    return x;
}

/* [8, 2, 2, 1] f32 whose dimension-2 stride is smaller than dimension 1's
 * span: rows are not at j * nb[1] (row 3 would be at 3 KiB, the tensor is
 * 1088 bytes) */
static struct ggml_tensor *rows_not_by_nb1(void)
{
    struct ggml_tensor *x = f32(8, 2, 2, 1);
    x->nb[1] = 1024;
    x->nb[2] = 32;
    x->nb[3] = 64;
    return x;
}

static struct ggml_tensor *clamp_src, *clamp_dst;

static bool clamp_right(struct rig *r)
{
    for (int64_t i1 = 0; i1 < clamp_src->ne[1]; i1++)
        for (int64_t i2 = 0; i2 < clamp_src->ne[2]; i2++)
            for (int64_t i0 = 0; i0 < clamp_src->ne[0]; i0++) {
                const float v = *before(r, clamp_src, i0, i1, i2, 0);
                const float want = clamp_dst->op == GGML_OP_CLAMP ? fminf(fmaxf(v, -0.5f), 0.5f) : (v > 0 ? v : 0.1f * v);
                if (*elem(r, clamp_dst, i0, i1, i2, 0) != want)
                    return false;
            }
    return true;
}

/* CLAMP and LEAKY_RELU in place walk ggml_nrows rows at j * nb[1]. */
static void test_clamp_leaky_relu(void)
{
    for (int op = 0; op < 2; op++)
        for (int variant = 0; variant < 2; variant++) {
            struct rig r;
            if (!rig_init(&r))
                return;
            struct ggml_tensor *x = variant == 0 ? huge_row_stride() : rows_not_by_nb1();
            struct ggml_tensor *n = op == 0 ? ggml_clamp_inplace(ctx, x, -0.5f, 0.5f) : ggml_leaky_relu(ctx, x, 0.1f, true);
            clamp_src = x;
            clamp_dst = n;
            int got = compute_in_child(&r, &n, 1, &n, 1, clamp_right);
            EXPECT(got, variant == 0 ? RAN : REFUSED_CLEAN, ggml_op_desc(n));
            rig_free(&r);
        }
}

/* SSM_SCAN writes sequence i's state at result + x's bytes + i * src0->nb[3],
 * with one state slot (src0->ne[3] = 1) and a wild stride there. */
static void test_ssm_scan_state_stride(void)
{
    enum { D_STATE = 16, HEAD_DIM = 2, N_HEAD = 2, N_TOK = 1, N_SEQ = 2 };
    struct rig r;
    if (!rig_init(&r))
        return;
    struct ggml_tensor *st = f32(D_STATE, HEAD_DIM, N_HEAD, 1);
    st->nb[3] = HUGE_STRIDE;
    struct ggml_tensor *x = f32(HEAD_DIM, N_HEAD, N_TOK, N_SEQ);
    struct ggml_tensor *dt = f32(N_HEAD, N_TOK, N_SEQ, 1);
    struct ggml_tensor *A = f32(1, N_HEAD, 1, 1);
    struct ggml_tensor *B = f32(D_STATE, 1, N_TOK, N_SEQ), *C = f32(D_STATE, 1, N_TOK, N_SEQ);
    struct ggml_tensor *ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N_SEQ);
    struct ggml_tensor *out = ggml_ssm_scan(ctx, st, x, dt, A, B, C, ids, 1);
    memset(data_of(&r, ids), 0, N_SEQ * sizeof(int32_t));  /* both sequences from slot 0 */
    EXPECT(compute_in_child(&r, &out, 1, &out, 1, NULL), RAN, "SSM_SCAN, one state slot, nb[3] = 1 GiB");
    rig_free(&r);
}

/* GET_ROWS_BACK reads source row i for every index i, whatever the
 * source's row count. */
static void test_get_rows_back_rows(void)
{
    for (int variant = 0; variant < 2; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        struct ggml_tensor *a = f32(4, variant == 0 ? 2 : 5, 1, 1);
        struct ggml_tensor *idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5);
        struct ggml_tensor *out = ggml_get_rows_back(ctx, a, idx, f32(4, 6, 1, 1));
        const int32_t v[5] = { 0, 1, 0, 1, 0 };
        memcpy(data_of(&r, idx), v, sizeof(v));
        EXPECT(compute_in_child(&r, &out, 1, &out, 1, NULL), variant == 0 ? REFUSED_CLEAN : RAN,
               variant == 0 ? "GET_ROWS_BACK, 5 indices, 2 source rows" : "GET_ROWS_BACK, 5 indices, 5 rows");
        rig_free(&r);
    }
}

/* OPT_STEP_ADAMW addresses the gradient, m and v with the weight's
 * strides: a strided weight with small contiguous m and v. */
static void test_adamw_layouts(void)
{
    for (int variant = 0; variant < 2; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        struct ggml_tensor *w = f32(8, 4, 1, 1);
        if (variant == 0) {
            w->nb[1] = 64;  /* rows twice apart: row 3 at 192, m and v are 128 bytes */
            w->nb[2] = w->nb[3] = 256;
        }
        ggml_set_param(w);
        struct ggml_tensor *g = f32(8, 4, 1, 1), *m = f32(8, 4, 1, 1), *v = f32(8, 4, 1, 1);
        struct ggml_tensor *p = f32(7, 1, 1, 1);
        const float params[7] = { 0.001f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1.0f };
        memcpy(data_of(&r, p), params, sizeof(params));
        for (int64_t i = 0; i < 32; i++)  /* v non-negative: sqrt */
            ((float *)data_of(&r, v))[i] = 0.25f;
        struct ggml_tensor *n = ggml_opt_step_adamw(ctx, w, g, m, v, p);
        struct ggml_tensor *writable[4] = { n, w, m, v };
        EXPECT(compute_in_child(&r, &n, 1, writable, 4, NULL), variant == 0 ? REFUSED_CLEAN : RAN,
               variant == 0 ? "OPT_STEP_ADAMW, strided weight, contiguous m/v" : "OPT_STEP_ADAMW, all contiguous");
        rig_free(&r);
    }
    /* SGD: the gradient at the weight's strides */
    struct rig r;
    if (!rig_init(&r))
        return;
    struct ggml_tensor *w = f32(8, 4, 1, 1);
    w->nb[1] = 64;
    w->nb[2] = w->nb[3] = 256;
    ggml_set_param(w);
    struct ggml_tensor *n = ggml_opt_step_sgd(ctx, w, f32(8, 4, 1, 1), f32(2, 1, 1, 1));
    struct ggml_tensor *writable[2] = { n, w };
    EXPECT(compute_in_child(&r, &n, 1, writable, 2, NULL), REFUSED_CLEAN, "OPT_STEP_SGD, strided weight");
    rig_free(&r);
}

/* CROSS_ENTROPY_LOSS reads rows i < nrows at i * nb[1] of both sources. */
static void test_cross_entropy_layouts(void)
{
    for (int variant = 0; variant < 3; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        struct ggml_tensor *a = variant == 0 ? huge_row_stride() : variant == 1 ? rows_not_by_nb1() : f32(8, 2, 2, 1);
        struct ggml_tensor *b = variant == 2 ? rows_not_by_nb1() : f32(8, a->ne[1], 2, 1);
        struct ggml_tensor *n = ggml_cross_entropy_loss(ctx, a, b);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), variant == 0 ? RAN : REFUSED_CLEAN,
               variant == 0 ? "CROSS_ENTROPY_LOSS, size-1 stride 1 GiB" : "CROSS_ENTROPY_LOSS, rows not at j * nb[1]");
        rig_free(&r);
    }
}

/* SSM_CONV reads src0 rows as one array (asserting nb[1] == ne[0] * 4):
 * fuzz_op-61 had a size-1 dimension 1 with another stride. */
static void test_ssm_conv_rows(void)
{
    for (int variant = 0; variant < 3; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        const int64_t d_inner = variant == 0 ? 1 : 2;
        struct ggml_tensor *sx = f32(7, d_inner, 2, 1);
        struct ggml_tensor *c = f32(4, d_inner, 1, 1);
        if (variant == 0)
            sx->nb[1] = HUGE_STRIDE;
        if (variant == 1) {  /* rows 4 bytes apart from each other's end */
            sx->nb[1] = 32;
            sx->nb[2] = sx->nb[3] = 64;
        }
        if (variant == 2) {  /* weights' rows likewise */
            c->nb[1] = 20;
            c->nb[2] = c->nb[3] = 40;
        }
        struct ggml_tensor *n = ggml_ssm_conv(ctx, sx, c);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), variant == 0 ? RAN : REFUSED_CLEAN,
               variant == 0 ? "SSM_CONV, size-1 rows, nb[1] = 1 GiB" : "SSM_CONV, rows not back to back");
        rig_free(&r);
    }
}

/* Kernels that check contiguity, then walk flat: SOFT_MAX_BACK's rows at
 * j * nb[1], DIAG_MASK_INF's planes at k * nb[2], POOL_2D's planes by
 * nb[2] up to the source's bytes (a wild stride of a size-1 dimension is
 * no contiguity violation to ggml). */
static void test_contiguous_walks(void)
{
    struct rig r;
    if (rig_init(&r)) {
        struct ggml_tensor *n = ggml_soft_max_ext_back(ctx, huge_row_stride(), huge_row_stride(), 1.0f, 0.0f);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), RAN, "SOFT_MAX_BACK, size-1 stride 1 GiB");
        rig_free(&r);
    }
    if (rig_init(&r)) {
        struct ggml_tensor *x = f32(4, 4, 1, 2);
        x->nb[2] = HUGE_STRIDE;
        struct ggml_tensor *n = ggml_diag_mask_inf_inplace(ctx, x, 1);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), RAN, "DIAG_MASK_INF, size-1 plane stride 1 GiB");
        rig_free(&r);
    }
    if (rig_init(&r)) {
        struct ggml_tensor *x = f32(4, 4, 1, 2);
        x->nb[2] = 4;  /* 32 steps of 4 bytes instead of 2 planes */
        struct ggml_tensor *n = ggml_pool_2d(ctx, x, GGML_OP_POOL_AVG, 2, 2, 2, 2, 0, 0);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), RAN, "POOL_2D, size-1 plane stride 4");
        rig_free(&r);
    }
}

/* A graph ggml builds with permuted operands whose size-1 strides are not
 * nb[i-1] * ne[i-1]: CONV_2D_DW channels-last, as test-backend-ops makes it
 * (the kernel asserts the kernel's nb[0] >= nb[2], nb[2] being the stride
 * of its one-element dimension 2): runs. */
static void test_channels_last_conv(void)
{
    struct rig r;
    if (!rig_init(&r))
        return;
    struct ggml_tensor *knl = f32(3, 3, 1, 4);  /* a contiguous [4, 1, 3, 3] permuted back */
    knl->nb[0] = 16;
    knl->nb[1] = 48;
    knl->nb[2] = 16;
    knl->nb[3] = 4;
    struct ggml_tensor *in = f32(5, 6, 4, 1);  /* a contiguous [4, 5, 6, 1] permuted back */
    in->nb[0] = 16;
    in->nb[1] = 80;
    in->nb[2] = 4;
    in->nb[3] = 480;
    struct ggml_tensor *n = ggml_conv_2d_dw_direct(ctx, knl, in, 1, 1, 1, 1, 1, 1);
    EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), RAN, "CONV_2D_DW channels-last");
    rig_free(&r);
}

/* MUL_MAT with the Hadamard hint writes ne10 floats per result row of
 * src0's row count. */
static void test_hadamard_rows(void)
{
    for (int variant = 0; variant < 2; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        struct ggml_tensor *n = ggml_mul_mat(ctx, f32(64, variant == 0 ? 1 : 64, 1, 1), f32(64, 2, 1, 1));
        ggml_mul_mat_set_hint(n, GGML_HINT_SRC0_IS_HADAMARD);
        EXPECT(compute_in_child(&r, &n, 1, &n, 1, NULL), variant == 0 ? REFUSED_CLEAN : RAN,
               variant == 0 ? "MUL_MAT Hadamard, 1 result row of 64" : "MUL_MAT Hadamard, 64 x 64");
        rig_free(&r);
    }
}

/* An RMS_NORM broadcast by the MUL right after it: the CPU backend's fused
 * kernel asserts one shape.  Refused as a graph; a norm times its weights
 * runs. */
static void test_fused_norm_mul(void)
{
    for (int variant = 0; variant < 2; variant++) {
        struct rig r;
        if (!rig_init(&r))
            return;
        struct ggml_tensor *norm = ggml_rms_norm(ctx, f32(8, 1, 1, 1), 1e-6f);
        struct ggml_tensor *mul = variant == 0 ? ggml_mul(ctx, f32(8, 4, 1, 1), norm) : ggml_mul(ctx, norm, f32(8, 1, 1, 1));
        struct ggml_tensor *nodes[2] = { norm, mul };
        EXPECT(compute_in_child(&r, nodes, 2, nodes, 2, NULL), variant == 0 ? REFUSED_CLEAN : RAN,
               variant == 0 ? "RMS_NORM then a MUL broadcasting it" : "RMS_NORM then MUL by its weights");
        rig_free(&r);
    }
}

TEST_MAIN("strides",
          TEST(run_setup),
          TEST(test_rule_table),
          TEST(test_import_canonical),
          TEST(test_rules_in_process),
          TEST(test_clamp_leaky_relu),
          TEST(test_ssm_scan_state_stride),
          TEST(test_get_rows_back_rows),
          TEST(test_adamw_layouts),
          TEST(test_cross_entropy_layouts),
          TEST(test_ssm_conv_rows),
          TEST(test_contiguous_walks),
          TEST(test_channels_last_conv),
          TEST(test_hadamard_rows),
          TEST(test_fused_norm_mul))
