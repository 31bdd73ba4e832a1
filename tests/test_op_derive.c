/*
 * Node checks by derivation (host/check/op_derive.c, host/check/op_shapes.c): nodes
 * built by ggml's constructors are accepted, and every kind of hostile node
 * the red team sent (issue 12) is refused - in-process for the unit cases,
 * through a session's graph compute for the end-to-end ones, where the
 * result region must come back untouched.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "host.h"
#include "import.h"
#include "op_shapes.h"
#include "dispatcher.h"
#include "test_records.h"
#include "test_op_checks.h"
#include "test_util.h"
#include "test_session.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct ggml_context *ctx;

static void fresh_ctx(void)
{
    if (ctx)
        ggml_free(ctx);
    struct ggml_init_params p = { .mem_size = 16 << 20, .mem_buffer = NULL, .no_alloc = true };
    ctx = ggml_init(p);
}

static struct ggml_tensor *f32(int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    return ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n0, n1, n2, n3);
}

static struct ggml_tensor *i32(int64_t n0, int64_t n1)
{
    return ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n0, n1);
}

static struct ggml_tensor *as_param(struct ggml_tensor *t)
{
    ggml_set_param(t);
    return t;
}

/* Fresh contiguous strides for t's type and shape. */
static void relayout(struct ggml_tensor *t, enum ggml_type type)
{
    t->type = type;
    t->nb[0] = ggml_type_size(type);
    t->nb[1] = ggml_row_size(type, t->ne[0]);
    for (int i = 2; i < GGML_MAX_DIMS; i++)
        t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
}

static void test_constructors_accepted(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(64, 8, 4, 1), *w = f32(64, 32, 1, 1), *v = f32(64, 1, 1, 1);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4);
    ACCEPTED(ggml_add(ctx, x, v));
    ACCEPTED(ggml_add_inplace(ctx, x, v));
    ACCEPTED(ggml_mul(ctx, x, x));
    ACCEPTED(ggml_sub(ctx, x, v));
    ACCEPTED(ggml_div(ctx, x, v));
    ACCEPTED(ggml_mul_mat(ctx, w, x));
    struct ggml_tensor *mm = ggml_mul_mat(ctx, w, x);
    ggml_mul_mat_set_prec(mm, GGML_PREC_F32);
    ACCEPTED(mm);
    ACCEPTED(ggml_get_rows(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5)));
    ACCEPTED(ggml_set_rows(ctx, w, f32(64, 3, 1, 1), ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 3)));
    ACCEPTED(ggml_rms_norm(ctx, x, 1e-6f));
    ACCEPTED(ggml_norm(ctx, x, 1e-5f));
    ACCEPTED(ggml_scale(ctx, x, 0.125f));
    ACCEPTED(ggml_scale_bias_inplace(ctx, x, 2.0f, 1.0f));
    struct ggml_tensor *kq = f32(32, 8, 4, 1);
    struct ggml_tensor *sm = ggml_soft_max_ext(ctx, kq, f32(32, 8, 1, 1), 0.5f, 0.0f);
    ggml_soft_max_add_sinks(sm, f32(4, 1, 1, 1));
    ACCEPTED(sm);
    ACCEPTED(ggml_rope_ext(ctx, x, pos, NULL, 64, GGML_ROPE_TYPE_NEOX, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f));
    int sections[4] = { 16, 8, 8, 0 };
    ACCEPTED(ggml_rope_multi(ctx, x, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 16), NULL, 64, sections,
                             GGML_ROPE_TYPE_MROPE, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f));
    struct ggml_tensor *q = f32(64, 8, 4, 1), *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 32, 2, 1);
    struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, q, k, k, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 32, 8, 1, 1),
                                                 0.125f, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(fa, GGML_PREC_F32);
    ggml_flash_attn_ext_add_sinks(fa, f32(4, 1, 1, 1));
    ACCEPTED(fa);
    ACCEPTED(ggml_swiglu(ctx, x));
    ACCEPTED(ggml_geglu_split(ctx, x, x));
    ACCEPTED(ggml_swiglu_oai(ctx, x, x, 1.702f, 7.0f));
    ACCEPTED(ggml_silu(ctx, x));
    ACCEPTED(ggml_gelu_inplace(ctx, x));
    ACCEPTED(ggml_cpy(ctx, x, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 8, 4, 1)));
    ACCEPTED(ggml_cpy(ctx, f32(8, 64, 1, 1), ggml_transpose(ctx, f32(64, 8, 1, 1))));
    ACCEPTED(ggml_cast(ctx, x, GGML_TYPE_F16));
    ACCEPTED(ggml_cont(ctx, ggml_transpose(ctx, w)));
    ACCEPTED(ggml_concat(ctx, x, x, 2));
    ACCEPTED(ggml_pad_ext(ctx, x, 1, 2, 0, 3, 0, 0, 0, 0));
    ACCEPTED(ggml_timestep_embedding(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 3), 16, 10000));
    ACCEPTED(ggml_argsort(ctx, x, GGML_SORT_ORDER_DESC));
    ACCEPTED(ggml_top_k(ctx, x, 4));
    ACCEPTED(ggml_sum_rows(ctx, x));
    ACCEPTED(ggml_mean(ctx, x));
    ACCEPTED(ggml_sum(ctx, x));
    ACCEPTED(ggml_argmax(ctx, w));
    ACCEPTED(ggml_clamp(ctx, x, -1.0f, 1.0f));
    ACCEPTED(ggml_leaky_relu(ctx, x, 0.1f, false));
    ACCEPTED(ggml_diag_mask_inf(ctx, kq, 3));
    ACCEPTED(ggml_acc(ctx, w, f32(8, 2, 1, 1), w->nb[1], w->nb[2], w->nb[3], 16));
    ACCEPTED(ggml_set_1d(ctx, w, f32(8, 1, 1, 1), 64));
    ACCEPTED(ggml_repeat(ctx, v, x));
    ACCEPTED(ggml_repeat_back(ctx, x, v));
    ACCEPTED(ggml_im2col(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 3, 3, 4, 8), f32(16, 16, 4, 1), 1, 1, 1, 1, 1, 1,
                         true, GGML_TYPE_F16));
    ACCEPTED(ggml_pool_2d(ctx, f32(16, 16, 4, 1), GGML_OP_POOL_AVG, 2, 2, 2, 2, 0.0f, 0.0f));
    ACCEPTED(ggml_interpolate(ctx, f32(8, 8, 4, 1), 16, 16, 4, 1, GGML_SCALE_MODE_BILINEAR));
    ACCEPTED(ggml_ssm_conv(ctx, f32(7, 16, 2, 1), f32(4, 16, 1, 1)));
    ACCEPTED(ggml_win_part(ctx, f32(8, 10, 10, 1), 4));
    ACCEPTED(ggml_get_rel_pos(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 8, 7), 4, 4));  /* f16/bf16 kernels only */
    ACCEPTED(ggml_arange(ctx, 0.0f, 10.0f, 1.0f));
    ACCEPTED(ggml_fill(ctx, x, 3.0f));
    ACCEPTED(ggml_tri(ctx, f32(8, 8, 2, 1), GGML_TRI_TYPE_LOWER));
    ACCEPTED(ggml_cumsum(ctx, x));
    ACCEPTED(ggml_group_norm(ctx, f32(8, 8, 16, 1), 4, 1e-6f));
    ACCEPTED(ggml_conv_transpose_1d(ctx, f32(3, 4, 2, 1), f32(10, 2, 1, 1), 2, 0, 1));
    ACCEPTED(ggml_pad_reflect_1d(ctx, x, 2, 3));
    ACCEPTED(ggml_roll(ctx, x, 3, -2, 1, 0));
    ACCEPTED(ggml_mul_mat_id(ctx, f32(64, 16, 4, 1), f32(64, 2, 3, 1), i32(2, 3)));
    ACCEPTED(ggml_add_id(ctx, f32(16, 2, 3, 1), f32(16, 4, 1, 1), i32(2, 3)));
    ACCEPTED(ggml_out_prod(ctx, f32(8, 4, 1, 1), f32(6, 4, 1, 1)));
    /* ops test-backend-ops does not exercise (SAM, training) */
    ACCEPTED(ggml_win_unpart(ctx, f32(8, 4, 4, 9), 10, 10, 4));
    ACCEPTED(ggml_add_rel_pos(ctx, f32(16, 16, 2, 1), f32(4, 4, 4, 2), f32(4, 4, 4, 2)));
    ACCEPTED(ggml_diag_mask_zero_inplace(ctx, kq, 2));
    ACCEPTED(ggml_pool_2d_back(ctx, f32(8, 8, 4, 1), f32(16, 16, 4, 1), GGML_OP_POOL_MAX, 2, 2, 2, 2, 0.0f, 0.0f));
    int64_t col_ne[4] = { 16, 16, 4, 1 };
    /* the gradient of im2col(kernel [3,3,4,8], image [16,16,4,1]): [4*3*3, OW, OH, N] */
    ACCEPTED(ggml_im2col_back(ctx, f32(36, 16, 16, 1), f32(3, 3, 4, 8), col_ne, 1, 1, 1, 1, 1, 1, true));
    ACCEPTED(ggml_opt_step_sgd(ctx, as_param(w), f32(64, 32, 1, 1), f32(2, 1, 1, 1)));
}

/* Views and leaves run no kernel; import checks their bounds. */
static void test_views_pass(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(64, 8, 4, 1);
    ACCEPTED(x);
    ACCEPTED(ggml_transpose(ctx, x));
    ACCEPTED(ggml_reshape_2d(ctx, x, 128, 16));
    ACCEPTED(ggml_view_2d(ctx, x, 16, 8, x->nb[1], 64));
    ACCEPTED(ggml_permute(ctx, x, 1, 0, 2, 3));
}

static void test_pad_small_source(void)
{
    fresh_ctx();
    struct ggml_tensor *one = f32(1, 1, 1, 1);
    /* The red team's node: PAD of one float claiming 1024. */
    struct ggml_tensor *t = f32(1024, 1, 1, 1);
    t->op = GGML_OP_PAD;
    t->src[0] = one;
    REFUSED(t, "PAD node differs from what ggml builds: ne");
    /* The same result with the padding it would take: accepted. */
    struct ggml_tensor *ok = ggml_pad_ext(ctx, one, 0, 1023, 0, 0, 0, 0, 0, 0);
    ACCEPTED(ok);
    ok->op_params[1] = 1022;
    REFUSED(ok, "PAD node differs");
}

static void test_result_strides(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(16, 4, 1, 1);
    struct ggml_tensor *t = ggml_add(ctx, x, x);
    t->nb[1] = 0;  /* rows on top of each other: the extent is one row */
    REFUSED(t, "extent smaller than its elements");
    t = ggml_add(ctx, x, x);
    t->nb[1] = 2 * t->nb[1];  /* extent covers it, but a dense kernel writes densely */
    t->nb[2] = t->nb[3] = t->nb[1] * 4;
    REFUSED(t, "ADD node differs from what ggml builds: nb");
    /* A source smaller than its elements. */
    struct ggml_tensor *s = f32(16, 4, 1, 1);
    t = ggml_scale(ctx, s, 2.0f);
    s->nb[1] = 4;
    REFUSED(t, "source extent smaller");
}

/* Float kernels write 4 bytes per element whatever the result's type. */
static void test_i8_results(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(16, 4, 2, 1), *w = f32(16, 8, 2, 1);
    struct ggml_tensor *nodes[] = {
        ggml_get_rows(ctx, w, i32(3, 2)),  ggml_scale(ctx, x, 2.0f), ggml_silu(ctx, x), ggml_soft_max(ctx, x),
        ggml_rms_norm(ctx, x, 1e-6f),      ggml_concat(ctx, x, x, 1), ggml_swiglu(ctx, x), ggml_sum(ctx, x),
        ggml_fill(ctx, x, 1.0f),           ggml_interpolate(ctx, x, 32, 8, 2, 1, GGML_SCALE_MODE_NEAREST),
    };
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
        ACCEPTED(nodes[i]);
        relayout(nodes[i], GGML_TYPE_I8);
        REFUSED(nodes[i], "differs from what ggml builds: type");
    }
}

static void test_timestep_param(void)
{
    fresh_ctx();
    struct ggml_tensor *ts = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 2);
    struct ggml_tensor *t = ggml_timestep_embedding(ctx, ts, 16, 10000);
    t->op_params[0] = 4096;
    REFUSED(t, "TIMESTEP_EMBEDDING node differs from what ggml builds: ne");
}

/* GGML_ASSERT in a constructor: refused, and the process goes on. */
static void test_constructor_asserts(void)
{
    fresh_ctx();
    struct ggml_tensor *a = f32(16, 8, 1, 1), *b = f32(15, 4, 1, 1);
    struct ggml_tensor *t = f32(8, 4, 1, 1);
    t->op = GGML_OP_MUL_MAT;
    t->src[0] = a;
    t->src[1] = b;
    REFUSED(t, "ggml rejects this node");
    REFUSED(t, "ggml_can_mul_mat");
    struct ggml_tensor *cat = f32(16, 12, 1, 1);
    cat->op = GGML_OP_CONCAT;
    cat->op_params[0] = 1;
    cat->src[0] = a;
    cat->src[1] = f32(17, 4, 1, 1);
    REFUSED(cat, "ggml rejects this node");
    /* still working after the jumps */
    ACCEPTED(ggml_mul_mat(ctx, a, f32(16, 4, 1, 1)));
    /* a constructor dividing by zero is never reached */
    struct ggml_tensor *col = f32(8, 8, 1, 1);
    col->op = GGML_OP_IM2COL;
    col->src[0] = a;
    col->src[1] = b;
    REFUSED(col, "IM2COL stride");
}

static void test_not_derivable(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(16, 4, 1, 1);
    struct ggml_tensor *t = f32(16, 4, 1, 1);
    t->op = GGML_OP_MAP_CUSTOM1;
    t->src[0] = x;
    REFUSED(t, "op MAP_CUSTOM1 not derivable");
    t->op = GGML_OP_FLASH_ATTN_BACK;
    t->src[1] = t->src[2] = t->src[3] = x;
    REFUSED(t, "not derivable");
    /* a src the constructor does not set */
    struct ggml_tensor *s = ggml_silu(ctx, x);
    s->src[3] = x;
    REFUSED(s, "differs from what ggml builds: src");
    /* an inplace result that is a view of something else */
    struct ggml_tensor *ip = ggml_add_inplace(ctx, x, x);
    ip->view_src = t;
    REFUSED(ip, "view_src");
    /* enum params out of range never reach a name table */
    struct ggml_tensor *u = ggml_silu(ctx, x);
    u->op_params[0] = GGML_UNARY_OP_COUNT;
    REFUSED(u, "unary op out of range");
}

/* A supports_op subject comes without view_src/view_offs and with op-less
 * copies of its sources: view identity is not compared there, and an
 * inplace variant is recognised by its layout. */
static void test_query_subjects(void)
{
    fresh_ctx();
    struct ggml_tensor *dst = ggml_transpose(ctx, f32(64, 8, 1, 1));
    struct ggml_tensor *cp = ggml_cpy(ctx, f32(8, 64, 1, 1), dst);
    cp->view_src = NULL;
    cp->view_offs = 0;
    CHECK(apir_op_shape_error(cp, true) == NULL);
    CHECK(apir_op_shape_error(cp, false) != NULL);
    struct ggml_tensor *x = ggml_transpose(ctx, f32(16, 8, 1, 1));
    struct ggml_tensor *ip = ggml_scale_inplace(ctx, ggml_cont(ctx, x), 2.0f);
    ip->view_src = NULL;
    CHECK(apir_op_shape_error(ip, true) == NULL);
    ip->nb[1] = 4;  /* neither variant's layout */
    CHECK(apir_op_shape_error(ip, true) != NULL);
    /* the guest strips flags: an optimizer step's parameter has none */
    struct ggml_tensor *p = as_param(f32(8, 4, 1, 1));
    struct ggml_tensor *sgd = ggml_opt_step_sgd(ctx, p, f32(8, 4, 1, 1), f32(2, 1, 1, 1));
    sgd->view_src = NULL;
    p->flags = 0;
    CHECK(apir_op_shape_error(sgd, true) == NULL);
    p->flags = 0;
    sgd->view_src = p;
    CHECK(apir_op_shape_error(sgd, false) != NULL);  /* a graph's must be a PARAM */
}

/* Kernel rules no constructor checks. */
static void test_param_rules(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(64, 8, 4, 1);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4);
    struct ggml_tensor *r = ggml_rope_ext(ctx, x, pos, NULL, 66, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    REFUSED(r, "ROPE dimensions");
    r = ggml_rope_ext(ctx, x, pos, NULL, 32, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    ggml_rope_set_offset(r, 40);
    REFUSED(r, "ROPE offset");
    /* a mode the kernel has no case for (it aborts) */
    REFUSED(ggml_rope_ext(ctx, x, pos, NULL, 32, 4, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE mode unknown");
    REFUSED(ggml_rope_ext(ctx, x, pos, NULL, 32, 16, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE mode unknown");
    int zero_sections[4] = { 0, 0, 0, 0 };  /* the M-RoPE kernel takes i % their sum */
    REFUSED(ggml_rope_multi(ctx, x, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 16), NULL, 64, zero_sections,
                            GGML_ROPE_TYPE_MROPE, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE sections");
    struct ggml_tensor *w = f32(16, 8, 1, 1);
    REFUSED(ggml_acc(ctx, w, f32(8, 2, 1, 1), w->nb[1], w->nb[2], w->nb[3], 4 * 16 * 7 + 36), "ACC/SET view");
}

/* op_operands.c: types without kernel functions, results over their
 * sources, recurrent kernels' operand extents (fuzz_op findings). */
static void test_operand_rules(void)
{
    fresh_ctx();
    /* SET_ROWS into I8: no from_float (fuzz_op-13) */
    struct ggml_tensor *dst8 = ggml_new_tensor_2d(ctx, GGML_TYPE_I8, 64, 8);
    REFUSED(ggml_set_rows(ctx, dst8, f32(64, 3, 1, 1), ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 3)), "SET_ROWS types");
    /* MUL_MAT with I32 weights: no vec_dot (fuzz_op-15) */
    REFUSED(ggml_mul_mat(ctx, i32(16, 4), f32(16, 2, 1, 1)), "MUL_MAT weights");
    /* CONV_2D typed by an F16 input: the kernel writes f32 (fuzz_op-16) */
    REFUSED(ggml_conv_2d_direct(ctx, f32(3, 3, 4, 8), ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 16, 16, 4, 1), 1, 1, 0, 0,
                                1, 1), "convolution types");
    ACCEPTED(ggml_conv_2d_direct(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 3, 3, 4, 8), f32(16, 16, 4, 1), 1, 1, 0,
                                 0, 1, 1));
    /* FLASH_ATTN_EXT with I32 K: NULL vec_dot (fuzz_op-17) */
    struct ggml_tensor *ki = ggml_new_tensor_4d(ctx, GGML_TYPE_I32, 64, 32, 2, 1);
    REFUSED(ggml_flash_attn_ext(ctx, f32(64, 8, 4, 1), ki, f32(64, 32, 2, 1), NULL, 0.125f, 0.0f, 0.0f),
            "FLASH_ATTN_EXT Q/K/V types");
    /* ADD of a quantized source cast to IQ2_XXS: no from_float */
    struct ggml_tensor *q40 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 256, 2);
    REFUSED(ggml_add_cast(ctx, q40, f32(256, 2, 1, 1), GGML_TYPE_IQ2_XXS), "ADD of a quantized source");
    ACCEPTED(ggml_add_cast(ctx, q40, f32(256, 2, 1, 1), GGML_TYPE_F32));
    /* ADD1 with an I16 scalar read as a float (fuzz_op-19) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    REFUSED(ggml_add1(ctx, f32(4, 1, 1, 1), ggml_new_tensor_1d(ctx, GGML_TYPE_I16, 1)), "ADD1 scalar type");
    ACCEPTED(ggml_add1(ctx, f32(4, 1, 1, 1), f32(1, 1, 1, 1)));
#pragma GCC diagnostic pop
    /* POOL_1D / POOL_2D of I8 / Q8_0 read as floats (fuzz_op-20, -23) */
    REFUSED(ggml_pool_2d(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_I8, 16, 16, 4, 1), GGML_OP_POOL_AVG, 2, 2, 2, 2, 0, 0),
            "POOL source type");
    REFUSED(ggml_pool_1d(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 4), GGML_OP_POOL_MAX, 2, 2, 0),
            "POOL source type");
    ACCEPTED(ggml_pool_1d(ctx, f32(64, 4, 1, 1), GGML_OP_POOL_MAX, 2, 2, 0));
    /* a gapped source: the kernels step by planes to ggml_nbytes and
     * write a plane per step, past the result */
    struct ggml_tensor *gapped = f32(16, 5, 5, 8);
    gapped->nb[0] = 8;
    gapped->nb[1] = 8 * 16;
    gapped->nb[2] = gapped->nb[1] * 5;
    gapped->nb[3] = gapped->nb[2] * 5;
    REFUSED(ggml_pool_2d(ctx, gapped, GGML_OP_POOL_AVG, 4, 5, 1, 1, 0, 0), "POOL source not contiguous");

    /* CPY between types the CPU's dup has no kernel for (GGML_ABORT): I32
     * into F16, Q4_0 into F16, I16 into F32; into a block type from a
     * source whose rows are not whole blocks or not dense */
    REFUSED(ggml_cpy(ctx, i32(16, 2), ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 16, 2)), "CPY from I32");
    ACCEPTED(ggml_cpy(ctx, i32(16, 2), f32(16, 2, 1, 1)));
    REFUSED(ggml_cpy(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 2), ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 64, 2)),
            "CPY between these types");
    ACCEPTED(ggml_cpy(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 2), f32(64, 2, 1, 1)));
    REFUSED(ggml_cpy(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I16, 16, 2), f32(16, 2, 1, 1)), "CPY between these types");
    ACCEPTED(ggml_cpy(ctx, f32(64, 2, 1, 1), ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 2)));
    REFUSED(ggml_cpy(ctx, f32(16, 8, 1, 1), ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 128, 1)), "whole blocks");
    REFUSED(ggml_cpy(ctx, f32(256, 1, 1, 1), ggml_new_tensor_2d(ctx, GGML_TYPE_IQ2_XXS, 256, 1)),
            "without a CPU conversion");
    /* IM2COL into I32, or an F32 result from an F16 input (GGML_ABORT /
     * the kernel's assert) */
    REFUSED(ggml_im2col(ctx, f32(3, 3, 2, 4), f32(8, 8, 2, 1), 1, 1, 0, 0, 1, 1, true, GGML_TYPE_I32), "IM2COL result");
    REFUSED(ggml_im2col(ctx, f32(3, 3, 2, 4), ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 8, 8, 2, 1), 1, 1, 0, 0, 1, 1, true,
                        GGML_TYPE_F32), "IM2COL result or input type");
    ACCEPTED(ggml_im2col(ctx, f32(3, 3, 2, 4), ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 8, 8, 2, 1), 1, 1, 0, 0, 1, 1, true,
                         GGML_TYPE_F16));
    ACCEPTED(ggml_im2col(ctx, f32(3, 3, 2, 4), f32(8, 8, 2, 1), 1, 1, 0, 0, 1, 1, true, GGML_TYPE_F32));
    /* FLASH_ATTN_EXT: K rows not dense (the kernel asserts nbk0), a
     * precision the kernel does not know */
    {
        struct ggml_tensor *fq = f32(64, 8, 4, 1), *fk = f32(64, 32, 2, 1), *fv = f32(64, 32, 2, 1);
        ACCEPTED(ggml_flash_attn_ext(ctx, fq, fk, fv, NULL, 0.125f, 0.0f, 0.0f));
        struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, fq, fk, fv, NULL, 0.125f, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(fa, (enum ggml_prec)7);
        REFUSED(fa, "FLASH_ATTN_EXT precision");
        struct ggml_tensor *sparse_k = f32(64, 32, 2, 1);
        sparse_k->nb[0] = 8;
        sparse_k->nb[1] = 8 * 64;
        sparse_k->nb[2] = sparse_k->nb[1] * 32;
        sparse_k->nb[3] = sparse_k->nb[2] * 2;
        REFUSED(ggml_flash_attn_ext(ctx, fq, sparse_k, fv, NULL, 0.125f, 0.0f, 0.0f), "rows not dense");
    }

    /* overlap: ARGSORT whose result lies over its source (fuzz_op-7), a
     * CPY between overlapping ranges (fuzz_op-8); exactly in place passes */
    static float mem[1024];
    struct ggml_tensor *x = f32(16, 4, 1, 1);
    x->data = mem;
    struct ggml_tensor *as = ggml_argsort(ctx, x, GGML_SORT_ORDER_ASC);
    as->data = mem + 8;
    REFUSED(as, "overlaps a source");
    as->data = mem + 64;
    ACCEPTED(as);
    struct ggml_tensor *y = f32(16, 4, 1, 1);
    y->data = mem + 28;
    struct ggml_tensor *cp = ggml_cpy(ctx, x, y);
    cp->data = y->data;
    REFUSED(cp, "overlaps a source");
    y->data = cp->data = mem + 64;
    ACCEPTED(cp);
    struct ggml_tensor *ip = ggml_add_inplace(ctx, x, x);
    ip->data = x->data;
    ACCEPTED(ip);
    struct ggml_tensor *reuse = ggml_add(ctx, x, x);  /* ggml-alloc places it in its parent's memory */
    reuse->data = x->data;
    ACCEPTED(reuse);
    reuse->data = mem + 4;
    REFUSED(reuse, "overlaps a source");

    /* recurrent ops: operands the constructors do not tie (fuzz_op-6,
     * -10, -11, -12) */
    struct ggml_tensor *k = f32(64, 2, 4, 1), *st = f32(64 * 64 * 2, 2, 1, 1);
    ACCEPTED(ggml_rwkv_wkv6(ctx, k, k, k, f32(64, 2, 1, 1), k, st));
    REFUSED(ggml_rwkv_wkv6(ctx, k, k, k, f32(1, 1, 1, 1), k, st), "time_faaaa");
    REFUSED(ggml_rwkv_wkv6(ctx, k, k, k, f32(64, 2, 1, 1), k, f32(64 * 64 * 2, 8, 1, 1)), "sequences");
    ACCEPTED(ggml_gated_linear_attn(ctx, k, k, k, k, st, 0.5f));
    REFUSED(ggml_gated_linear_attn(ctx, k, k, k, k, f32(64 * 64 * 2, 3, 1, 1), 0.5f), "sequences");
    ACCEPTED(ggml_rwkv_wkv7(ctx, k, k, k, k, k, k, st));
    REFUSED(ggml_rwkv_wkv7(ctx, f32(1, 1, 1, 1), k, k, k, k, k, st), "smaller than its tokens");
    struct ggml_tensor *k1 = f32(1, 1, 1, 1);
    REFUSED(ggml_rwkv_wkv7(ctx, k1, k1, k1, k1, k1, k1, k1), "head size");
    struct ggml_tensor *q = f32(16, 2, 3, 1), *v = f32(16, 4, 3, 1), *g = f32(1, 4, 3, 1), *s0 = f32(16, 16, 4, 1);
    ACCEPTED(ggml_gated_delta_net(ctx, q, q, v, g, g, s0, 1));
    REFUSED(ggml_gated_delta_net(ctx, f32(16, 2, 1, 1), q, v, g, g, s0, 1), "q/k shape");
    REFUSED(ggml_gated_delta_net(ctx, q, q, v, f32(1, 1, 1, 1), g, s0, 1), "gate/beta shape");
}

/* fuzz_op findings 1-5, 9, 14, 18, 21, 22: operand extents the kernels
 * derive from other tensors' shapes or params (op_shapes.c). */
static void test_kernel_extents(void)
{
    fresh_ctx();
    struct ggml_tensor *x = f32(64, 8, 4, 1);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4);
    /* fuzz_op-1: n_dims = 0, the pass-through loop never advances */
    REFUSED(ggml_rope_ext(ctx, x, pos, NULL, 0, 0, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE dimensions");
    REFUSED(ggml_rope_ext_back(ctx, x, pos, NULL, 0, 2, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE dimensions");
    /* an odd row: the pass-through loop copies one past it; vision mode
     * has no such loop */
    REFUSED(ggml_rope_ext(ctx, f32(5, 2, 4, 1), pos, NULL, 4, 0, 4096, 1e4f, 1, 0, 1, 32, 1), "ROPE odd row length");
    int vision[4] = { 2, 2, 0, 0 };
    ACCEPTED(ggml_rope_multi(ctx, f32(9, 2, 4, 1), ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 16), NULL, 4, vision,
                             GGML_ROPE_TYPE_VISION, 4096, 1e4f, 1, 0, 1, 32, 1));
    /* fuzz_op-4: freq factors are read for all ne0/2 pairs, the
     * constructor (and test-backend-ops) give n_dims/2: the tail must be
     * inside their buffer */
    static float mem[64];
    ggml_backend_buffer_t buf = ggml_backend_cpu_buffer_from_ptr(mem, sizeof(mem));
    struct ggml_tensor *ff = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
    struct ggml_tensor *r = ggml_rope_ext(ctx, x, pos, ff, 32, 2, 4096, 1e4f, 1, 0, 1, 32, 1);
    ACCEPTED(r);  /* no buffer: a supports_op subject reads nothing */
    ff->buffer = buf;
    ff->data = mem;  /* 32 floats from here are the buffer's */
    ACCEPTED(r);
    ff->data = mem + 48;  /* the buffer's last 16 floats */
    REFUSED(r, "ROPE frequency factors");
    ggml_backend_buffer_free(buf);
    /* fuzz_op-2: COUNT_EQUAL's row split is right only for these shapes */
    REFUSED(ggml_count_equal(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_I32, 8, 4, 2, 1),
                             ggml_new_tensor_4d(ctx, GGML_TYPE_I32, 8, 4, 2, 1)), "COUNT_EQUAL rows");
    ACCEPTED(ggml_count_equal(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_I32, 8, 2, 2, 4),
                              ggml_new_tensor_4d(ctx, GGML_TYPE_I32, 8, 2, 2, 4)));
    ACCEPTED(ggml_count_equal(ctx, i32(500, 1), i32(500, 1)));
    /* fuzz_op-3: a gradient smaller than the result's im2col shape */
    int64_t col_ne[4] = { 16, 16, 4, 1 };
    REFUSED(ggml_im2col_back(ctx, f32(4, 16, 16, 1), f32(3, 3, 4, 8), col_ne, 1, 1, 1, 1, 1, 1, true), "IM2COL_BACK gradient");
    /* fuzz_op-5: fewer gradient planes than the result's; a forward input
     * not of the result's type */
    REFUSED(ggml_pool_2d_back(ctx, f32(8, 8, 1, 1), f32(16, 16, 4, 1), GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0), "POOL_2D_BACK operands");
    REFUSED(ggml_pool_2d_back(ctx, f32(8, 8, 4, 1), ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 16, 16, 4, 1), GGML_OP_POOL_AVG,
                              2, 2, 2, 2, 0, 0), "POOL_2D_BACK operands");
    /* fuzz_op-9: a source that is not the result's windows */
    REFUSED(ggml_win_unpart(ctx, f32(1, 1, 1, 1), 1, 15, 15), "WIN_UNPART source");
    REFUSED(ggml_win_unpart(ctx, f32(8, 4, 4, 4), 10, 10, 4), "WIN_UNPART source");
    /* fuzz_op-14: SILU_BACK operands of different shapes or row layouts */
    REFUSED(ggml_silu_back(ctx, f32(1, 16, 1, 2), f32(3, 16, 8, 1)), "SILU_BACK operands");
    struct ggml_tensor *big = f32(16, 8, 3, 1);
    struct ggml_tensor *gapped = ggml_view_3d(ctx, big, 16, 4, 3, big->nb[1], big->nb[2], 0);  /* planes 8 rows apart */
    REFUSED(ggml_silu_back(ctx, f32(16, 4, 3, 1), gapped), "SILU_BACK operands");
    ACCEPTED(ggml_silu_back(ctx, f32(16, 4, 3, 1), ggml_view_3d(ctx, big, 16, 4, 3, big->nb[1] * 2, big->nb[1] * 8, 0)));
    /* fuzz_op-18, -21, -22: V heads that do not divide Q's, V or mask
     * smaller than K rows x Q rows */
    struct ggml_tensor *q = f32(64, 8, 2, 1), *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 32, 2, 1);
    REFUSED(ggml_flash_attn_ext(ctx, f32(64, 8, 1, 1), ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 32, 1, 1),
                                ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 32, 8, 1), NULL, 1, 0, 0), "V heads");
    REFUSED(ggml_flash_attn_ext(ctx, q, k, f32(64, 1, 2, 1), NULL, 1, 0, 0), "V has fewer rows");
    REFUSED(ggml_flash_attn_ext(ctx, q, k, k, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 16, 8, 1, 1), 1, 0, 0), "mask smaller");
    REFUSED(ggml_flash_attn_ext(ctx, q, k, k, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 32, 4, 1, 1), 1, 0, 0), "mask smaller");
    ACCEPTED(ggml_flash_attn_ext(ctx, q, k, k, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 32, 8, 1, 1), 1, 0, 0));
}

/* Another thread's (or no derivation's) abort still aborts. */
static void test_abort_elsewhere(void)
{
    check(f32(1, 1, 1, 1)); /* callback installed */
    struct ggml_tensor *t = ggml_silu(ctx, f32(4, 1, 1, 1));
    ACCEPTED(t);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ACCEPTED(t);
        ggml_abort(__FILE__, __LINE__, "outside a derivation");
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* Checking cost per node, on a 1000-node transformer-like chain. */
static void test_cost(void)
{
    fresh_ctx();
    enum { N = 1000 };
    static struct ggml_tensor *nodes[N];
    struct ggml_tensor *w = f32(256, 256, 1, 1), *cur = f32(256, 32, 1, 1);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 32);
    for (int i = 0; i < N; i++) {
        switch (i % 5) {
        case 0: cur = ggml_rms_norm(ctx, cur, 1e-6f); break;
        case 1: cur = ggml_mul_mat(ctx, w, cur); break;
        case 2: cur = ggml_rope_ext(ctx, ggml_reshape_3d(ctx, cur, 64, 4, 32), pos, NULL, 64, 2, 4096, 1e4f, 1, 0, 1, 32, 1);
                break;
        case 3: cur = ggml_cont_2d(ctx, cur, 256, 32); break;
        default: cur = ggml_add(ctx, cur, cur); break;
        }
        nodes[i] = cur;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int refused = 0;
    for (int i = 0; i < N; i++)
        refused += check(nodes[i]) != NULL;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(refused == 0);
    double us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    printf("op_derive: %d nodes checked in %.0f us (%.2f us/node)\n", N, us, us / N);
}

/* ---- end to end: a session refuses the graph, the result is untouched --- */

#define DATA_RES 10u
#define DATA_SIZE (1u << 20)
static struct apir_host host;
static uint8_t data_blob[DATA_SIZE] __attribute__((aligned(64)));

static uint32_t compute(struct apir_session *s, uint64_t node, const struct apir_tensor_rec *t, uint32_t n)
{
    struct apir_encoder e;
    apir_encoder_init(&e, data_blob, DATA_SIZE);
    apir_encode_u32(&e, 1);
    apir_encode_u64(&e, node);
    apir_encode_tensor_list(&e, n, t);
    uint32_t status = 99;
    uint32_t res = fwd_BACKEND_GRAPH_COMPUTE(s, DATA_RES, apir_encoder_used(&e), &status);
    return res == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS ? APIR_HANDLER_OK : res ? res : 1000 + status;
}

/* The result region after a compute, as the guest would read it back. */
static bool region_is(struct apir_session *s, uint64_t buf, const struct apir_tensor_rec *t, uint8_t byte, size_t n)
{
    if (fwd_BUFFER_GET_TENSOR(s, buf, t, DATA_RES, 0, n) != APIR_HANDLER_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        if (data_blob[i] != byte)
            return false;
    return true;
}

static void test_session_refuses(void)
{
    if (!test_host_init_cpu(&host)) {
        CHECK(0);
        return;
    }
    struct apir_session *s = apir_session_new(&host, "derive");
    s->minor = APIR_VERSION_MINOR;
    apir_session_blob_add(s, DATA_RES, data_blob, DATA_SIZE, NULL, NULL);
    uint64_t buf = alloc_buffer(s, 1 << 16);
    /* the result region holds a sentinel */
    struct apir_tensor_rec t[2] = { f32_rec(1, buf, 0, 1), f32_rec(2, buf, 4096, 1024) };
    memset(data_blob, 0x5a, 4096);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 4096) == APIR_HANDLER_OK);

    /* PAD: one float in, 1024 out, no padding params */
    t[1].op = GGML_OP_PAD;
    t[1].src[0] = 1;
    t[1].flags = GGML_TENSOR_FLAG_COMPUTE;
    CHECK(compute(s, 2, t, 2) != APIR_HANDLER_OK);
    CHECK(region_is(s, buf, &t[1], 0x5a, 4096));

    /* the same with the padding ggml would record: computed */
    t[1].op_params[1] = 1023;
    CHECK(compute(s, 2, t, 2) == APIR_HANDLER_OK);
    CHECK(!region_is(s, buf, &t[1], 0x5a, 4096));

    /* an I8 result of SCALE at the buffer's end (a float kernel would write
     * 4 bytes per element past it) */
    memset(data_blob, 0x5a, 4096);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t[1], DATA_RES, 0, 4096) == APIR_HANDLER_OK);
    struct apir_tensor_rec sc[2] = { f32_rec(1, buf, 0, 1024), f32_rec(2, buf, (1 << 16) - 1024, 1024) };
    sc[1].type = GGML_TYPE_I8;
    sc[1].nb[0] = 1;
    sc[1].nb[1] = sc[1].nb[2] = sc[1].nb[3] = 1024;
    sc[1].op = GGML_OP_SCALE;
    float one = 1.0f;
    memcpy(&sc[1].op_params[0], &one, 4);
    sc[1].src[0] = 1;
    sc[1].flags = GGML_TENSOR_FLAG_COMPUTE;
    CHECK(compute(s, 2, sc, 2) != APIR_HANDLER_OK);
    apir_session_free(s);
}

TEST_MAIN("op_derive",
          TEST(test_constructors_accepted),
          TEST(test_views_pass),
          TEST(test_pad_small_source),
          TEST(test_result_strides),
          TEST(test_i8_results),
          TEST(test_timestep_param),
          TEST(test_constructor_asserts),
          TEST(test_not_derivable),
          TEST(test_query_subjects),
          TEST(test_param_rules),
          TEST(test_kernel_extents),
          TEST(test_operand_rules),
          TEST(test_abort_elsewhere),
          TEST(test_cost),
          TEST(test_session_refuses))
