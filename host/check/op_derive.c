#include "op_derive.h"

#include "ggml.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

bool apir_op_is_view(int op)
{
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

bool apir_canonical_unit_strides(struct ggml_tensor *t)
{
    if (!ggml_is_contiguous(t))
        return true;
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] != 1)
            continue;
        if (i == 0) {
            /* a block type's row is whole blocks: one element is a block only
             * when the block is one element (import checked that) */
            t->nb[0] = ggml_type_size(t->type);
        } else {
            /* ggml_new_tensor: nb[1] = nb[0] * (ne[0] / block size) */
            const uint64_t n = (uint64_t)t->ne[i - 1] / (i == 1 ? (uint64_t)ggml_blck_size(t->type) : 1);
            uint64_t stride;
            if (__builtin_mul_overflow((uint64_t)t->nb[i - 1], n, &stride) || stride > SIZE_MAX)
                return false;
            t->nb[i] = (size_t)stride;
        }
    }
    return true;
}

/* ---- the abort trap ---------------------------------------------------- */

/* Set only while this thread runs a constructor. */
static _Thread_local jmp_buf *derive_trap;
static _Thread_local char reason[256];
static ggml_abort_callback_t previous_abort;

static void trap_abort(const char *message)
{
    jmp_buf *trap = derive_trap;
    if (trap) {
        derive_trap = NULL;
        snprintf(reason, sizeof(reason), "ggml rejects this node: %s", message);
        longjmp(*trap, 1);
    }
    /* Not ours: behave as if we were not there (ggml then aborts). */
    if (previous_abort)
        previous_abort(message);
    else
        fprintf(stderr, "%s\n", message);
}

/* ---- the scratch context ----------------------------------------------- */

/* A constructor makes its result and at most a few helpers (views, shape
 * templates); the context is reset before every node, so this bounds the
 * memory for any graph. */
#define ARENA_TENSORS 16

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static pthread_key_t arena_key;
static bool arena_key_ok, setup_done;
static _Thread_local struct ggml_context *arena;

static void free_arena(void *ctx) { ggml_free(ctx); }

static void setup(void)
{
    previous_abort = ggml_set_abort_callback(trap_abort);
    arena_key_ok = pthread_key_create(&arena_key, free_arena) == 0;
    setup_done = true;
}

/* libapir-virgl.so can be unloaded while ggml and threads that checked
 * graphs live on: neither ggml's abort callback nor a thread-exit destructor
 * may point into it then.  (Contexts of threads still alive are left.) */
__attribute__((destructor)) static void teardown(void)
{
    if (!setup_done)
        return;
    ggml_abort_callback_t current = ggml_set_abort_callback(previous_abort);
    if (current != trap_abort)
        ggml_set_abort_callback(current);  /* someone installed theirs after ours */
    if (arena_key_ok)
        pthread_key_delete(arena_key);
}

static struct ggml_context *scratch(void)
{
    if (!arena && arena_key_ok) {
        struct ggml_init_params p = { .mem_size = ARENA_TENSORS * ggml_tensor_overhead(), .mem_buffer = NULL,
                                      .no_alloc = true };
        arena = ggml_init(p);
        if (arena && pthread_setspecific(arena_key, arena) != 0) {
            ggml_free(arena);
            arena = NULL;
        }
    } else if (arena) {
        ggml_reset(arena);
    }
    return arena;
}

/* ---- decoding constructor arguments ------------------------------------ */

static int32_t pi(const struct ggml_tensor *t, int i) { return t->op_params[i]; }

static float pf(const struct ggml_tensor *t, int i)
{
    float f;
    memcpy(&f, &t->op_params[i], sizeof(f));
    return f;
}

/* A tensor of t's shape and type, for constructors that take their result's
 * shape from a tensor they do not link (REPEAT_BACK, GET_ROWS_BACK). */
static struct ggml_tensor *shape_of(struct ggml_context *ctx, const struct ggml_tensor *t)
{
    return ggml_new_tensor(ctx, t->type, GGML_MAX_DIMS, t->ne);
}

/* ADD1's constructors are deprecated in ggml.h but still make ADD1 nodes
 * (test-backend-ops builds them). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static struct ggml_tensor *add1(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b, bool inplace)
{
    return inplace ? ggml_add1_inplace(ctx, a, b) : ggml_add1(ctx, a, b);
}
#pragma GCC diagnostic pop

/* ---- the derivations --------------------------------------------------- */

/*
 * One case per op, by the constructor the node's contents select:
 * - inplace variants when the node is a view (of its first source);
 * - ADD with a result type other than src0's: ggml_add_cast;
 * - CPY naming itself as src1: ggml_cast, else ggml_cpy into src1;
 * - ROPE(_BACK) with an M-RoPE mode: ggml_rope_multi(_back), else _ext;
 * - SOFT_MAX / FLASH_ATTN_EXT: the _ext constructor with the node's mask,
 *   then the sinks setter with src[2] / src[4] (NULL leaves none);
 * - GLU with src1: the split form, else the fused one (swapped from params);
 * - optional setters (MUL_MAT prec/hint, FLASH_ATTN_EXT prec/n_kv_max, ROPE
 *   offset) are applied only when the node's param is not 0;
 * - constructors that take the result's shape as arguments (REPEAT, CONT,
 *   UPSCALE, TOP_K, IM2COL_BACK, GET_REL_POS, WIN_UNPART) get the node's.
 * Float params go back in bit for bit; the final op_params comparison
 * catches any argument the decoding could not reproduce.
 */
static struct ggml_tensor *derive(struct ggml_context *ctx, const struct ggml_tensor *t, bool inplace)
{
    struct ggml_tensor *const *s = t->src;
    struct ggml_tensor *a = s[0], *b = s[1], *c = s[2];
    struct ggml_tensor *r;

    switch (t->op) {
    case GGML_OP_DUP: return inplace ? ggml_dup_inplace(ctx, a) : ggml_dup(ctx, a);
    case GGML_OP_ADD:
        if (t->type != a->type)
            return ggml_add_cast(ctx, a, b, t->type);
        return inplace ? ggml_add_inplace(ctx, a, b) : ggml_add(ctx, a, b);
    case GGML_OP_ADD_ID: return ggml_add_id(ctx, a, b, c);
    case GGML_OP_ADD1: return add1(ctx, a, b, inplace);
    case GGML_OP_ACC: {
        size_t nb1 = (size_t)pi(t, 0), nb2 = (size_t)pi(t, 1), nb3 = (size_t)pi(t, 2), off = (size_t)pi(t, 3);
        return inplace ? ggml_acc_inplace(ctx, a, b, nb1, nb2, nb3, off) : ggml_acc(ctx, a, b, nb1, nb2, nb3, off);
    }
    case GGML_OP_SUB: return inplace ? ggml_sub_inplace(ctx, a, b) : ggml_sub(ctx, a, b);
    case GGML_OP_MUL: return inplace ? ggml_mul_inplace(ctx, a, b) : ggml_mul(ctx, a, b);
    case GGML_OP_DIV: return inplace ? ggml_div_inplace(ctx, a, b) : ggml_div(ctx, a, b);
    case GGML_OP_SQR: return inplace ? ggml_sqr_inplace(ctx, a) : ggml_sqr(ctx, a);
    case GGML_OP_SQRT: return inplace ? ggml_sqrt_inplace(ctx, a) : ggml_sqrt(ctx, a);
    case GGML_OP_LOG: return inplace ? ggml_log_inplace(ctx, a) : ggml_log(ctx, a);
    case GGML_OP_SIN: return inplace ? ggml_sin_inplace(ctx, a) : ggml_sin(ctx, a);
    case GGML_OP_COS: return inplace ? ggml_cos_inplace(ctx, a) : ggml_cos(ctx, a);
    case GGML_OP_SUM: return ggml_sum(ctx, a);
    case GGML_OP_SUM_ROWS: return ggml_sum_rows(ctx, a);
    case GGML_OP_CUMSUM: return ggml_cumsum(ctx, a);
    case GGML_OP_MEAN: return ggml_mean(ctx, a);
    case GGML_OP_ARGMAX: return ggml_argmax(ctx, a);
    case GGML_OP_COUNT_EQUAL: return ggml_count_equal(ctx, a, b);
    case GGML_OP_REPEAT: return ggml_repeat_4d(ctx, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    case GGML_OP_REPEAT_BACK: return ggml_repeat_back(ctx, a, shape_of(ctx, t));
    case GGML_OP_CONCAT: return ggml_concat(ctx, a, b, pi(t, 0));
    case GGML_OP_SILU_BACK: return ggml_silu_back(ctx, a, b);
    case GGML_OP_NORM: return inplace ? ggml_norm_inplace(ctx, a, pf(t, 0)) : ggml_norm(ctx, a, pf(t, 0));
    case GGML_OP_RMS_NORM: return inplace ? ggml_rms_norm_inplace(ctx, a, pf(t, 0)) : ggml_rms_norm(ctx, a, pf(t, 0));
    case GGML_OP_RMS_NORM_BACK: return ggml_rms_norm_back(ctx, a, b, pf(t, 0));
    case GGML_OP_GROUP_NORM:
        return inplace ? ggml_group_norm_inplace(ctx, a, pi(t, 0), pf(t, 1)) : ggml_group_norm(ctx, a, pi(t, 0), pf(t, 1));
    case GGML_OP_L2_NORM: return inplace ? ggml_l2_norm_inplace(ctx, a, pf(t, 0)) : ggml_l2_norm(ctx, a, pf(t, 0));
    case GGML_OP_MUL_MAT:
        r = ggml_mul_mat(ctx, a, b);
        if (pi(t, 0))
            ggml_mul_mat_set_prec(r, (enum ggml_prec)pi(t, 0));
        if (pi(t, 1))
            ggml_mul_mat_set_hint(r, (enum ggml_op_hint)pi(t, 1));
        return r;
    case GGML_OP_MUL_MAT_ID: return ggml_mul_mat_id(ctx, a, b, c);
    case GGML_OP_OUT_PROD: return ggml_out_prod(ctx, a, b);
    case GGML_OP_SCALE:
        return inplace ? ggml_scale_bias_inplace(ctx, a, pf(t, 0), pf(t, 1)) : ggml_scale_bias(ctx, a, pf(t, 0), pf(t, 1));
    case GGML_OP_SET: {
        size_t nb1 = (size_t)pi(t, 0), nb2 = (size_t)pi(t, 1), nb3 = (size_t)pi(t, 2), off = (size_t)pi(t, 3);
        return inplace ? ggml_set_inplace(ctx, a, b, nb1, nb2, nb3, off) : ggml_set(ctx, a, b, nb1, nb2, nb3, off);
    }
    case GGML_OP_CPY:
        return b == t ? ggml_cast(ctx, a, t->type) : ggml_cpy(ctx, a, b);
    case GGML_OP_CONT: return ggml_cont_4d(ctx, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    case GGML_OP_GET_ROWS: return ggml_get_rows(ctx, a, b);
    case GGML_OP_GET_ROWS_BACK: return ggml_get_rows_back(ctx, a, b, shape_of(ctx, t));
    case GGML_OP_SET_ROWS: return ggml_set_rows(ctx, c, a, b);
    case GGML_OP_DIAG: return ggml_diag(ctx, a);
    case GGML_OP_DIAG_MASK_INF:
        return inplace ? ggml_diag_mask_inf_inplace(ctx, a, pi(t, 0)) : ggml_diag_mask_inf(ctx, a, pi(t, 0));
    case GGML_OP_DIAG_MASK_ZERO:
        return inplace ? ggml_diag_mask_zero_inplace(ctx, a, pi(t, 0)) : ggml_diag_mask_zero(ctx, a, pi(t, 0));
    case GGML_OP_SOFT_MAX:
        r = inplace ? ggml_soft_max_ext_inplace(ctx, a, b, pf(t, 0), pf(t, 1)) : ggml_soft_max_ext(ctx, a, b, pf(t, 0), pf(t, 1));
        ggml_soft_max_add_sinks(r, c);
        return r;
    case GGML_OP_SOFT_MAX_BACK:
        return inplace ? ggml_soft_max_ext_back_inplace(ctx, a, b, pf(t, 0), pf(t, 1))
                       : ggml_soft_max_ext_back(ctx, a, b, pf(t, 0), pf(t, 1));
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: {
        const int n_dims = pi(t, 1), mode = pi(t, 2), n_ctx_orig = pi(t, 4);
        const float fb = pf(t, 5), fs = pf(t, 6), ef = pf(t, 7), af = pf(t, 8), bf = pf(t, 9), bs = pf(t, 10);
        int sections[GGML_MROPE_SECTIONS] = { pi(t, 11), pi(t, 12), pi(t, 13), pi(t, 14) };
        if (t->op == GGML_OP_ROPE_BACK)
            r = (mode & GGML_ROPE_TYPE_MROPE)
                    ? ggml_rope_multi_back(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, fb, fs, ef, af, bf, bs)
                    : ggml_rope_ext_back(ctx, a, b, c, n_dims, mode, n_ctx_orig, fb, fs, ef, af, bf, bs);
        else if (mode & GGML_ROPE_TYPE_MROPE)
            r = inplace ? ggml_rope_multi_inplace(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, fb, fs, ef, af, bf, bs)
                        : ggml_rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, fb, fs, ef, af, bf, bs);
        else
            r = inplace ? ggml_rope_ext_inplace(ctx, a, b, c, n_dims, mode, n_ctx_orig, fb, fs, ef, af, bf, bs)
                        : ggml_rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, fb, fs, ef, af, bf, bs);
        if (pi(t, 15))
            ggml_rope_set_offset(r, pi(t, 15));
        return r;
    }
    case GGML_OP_CLAMP:
        return inplace ? ggml_clamp_inplace(ctx, a, pf(t, 0), pf(t, 1)) : ggml_clamp(ctx, a, pf(t, 0), pf(t, 1));
    case GGML_OP_CONV_TRANSPOSE_1D: return ggml_conv_transpose_1d(ctx, a, b, pi(t, 0), pi(t, 1), pi(t, 2));
    case GGML_OP_IM2COL:
        return ggml_im2col(ctx, a, b, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6) != 0, t->type);
    case GGML_OP_IM2COL_BACK: {
        int64_t ne[GGML_MAX_DIMS] = { t->ne[0], t->ne[1], t->ne[2], t->ne[3] };
        return ggml_im2col_back(ctx, a, b, ne, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6) != 0);
    }
    case GGML_OP_IM2COL_3D:
        return ggml_im2col_3d(ctx, a, b, pi(t, 9), pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6),
                              pi(t, 7), pi(t, 8), t->type);
    case GGML_OP_COL2IM_1D: return ggml_col2im_1d(ctx, a, pi(t, 0), pi(t, 1), pi(t, 2));
    case GGML_OP_CONV_2D:
        return ggml_conv_2d_direct(ctx, a, b, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5));
    case GGML_OP_CONV_3D:
        return ggml_conv_3d_direct(ctx, a, b, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6),
                                   pi(t, 7), pi(t, 8), pi(t, 9), pi(t, 10), pi(t, 11));
    case GGML_OP_CONV_2D_DW:
        return ggml_conv_2d_dw_direct(ctx, a, b, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5));
    case GGML_OP_CONV_TRANSPOSE_2D: return ggml_conv_transpose_2d_p0(ctx, a, b, pi(t, 0));
    case GGML_OP_POOL_1D: return ggml_pool_1d(ctx, a, (enum ggml_op_pool)pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3));
    case GGML_OP_POOL_2D:
        return ggml_pool_2d(ctx, a, (enum ggml_op_pool)pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4),
                            (float)pi(t, 5), (float)pi(t, 6));
    case GGML_OP_POOL_2D_BACK:
        return ggml_pool_2d_back(ctx, a, b, (enum ggml_op_pool)pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4),
                                 (float)pi(t, 5), (float)pi(t, 6));
    case GGML_OP_UPSCALE: return ggml_interpolate(ctx, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3], (uint32_t)pi(t, 0));
    case GGML_OP_PAD:
        if (pi(t, 8))
            return ggml_pad_ext_circular(ctx, a, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6), pi(t, 7));
        return ggml_pad_ext(ctx, a, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3), pi(t, 4), pi(t, 5), pi(t, 6), pi(t, 7));
    case GGML_OP_PAD_REFLECT_1D: return ggml_pad_reflect_1d(ctx, a, pi(t, 0), pi(t, 1));
    case GGML_OP_ROLL: return ggml_roll(ctx, a, pi(t, 0), pi(t, 1), pi(t, 2), pi(t, 3));
    case GGML_OP_ARANGE: return ggml_arange(ctx, pf(t, 0), pf(t, 1), pf(t, 2));
    case GGML_OP_TIMESTEP_EMBEDDING: return ggml_timestep_embedding(ctx, a, pi(t, 0), pi(t, 1));
    case GGML_OP_ARGSORT: return ggml_argsort(ctx, a, (enum ggml_sort_order)pi(t, 0));
    case GGML_OP_TOP_K: return ggml_top_k(ctx, a, (int)t->ne[0]);
    case GGML_OP_LEAKY_RELU: return ggml_leaky_relu(ctx, a, pf(t, 0), inplace);
    case GGML_OP_TRI: return ggml_tri(ctx, a, (enum ggml_tri_type)pi(t, 0));
    case GGML_OP_FILL: return inplace ? ggml_fill_inplace(ctx, a, pf(t, 0)) : ggml_fill(ctx, a, pf(t, 0));
    case GGML_OP_FLASH_ATTN_EXT:
        r = ggml_flash_attn_ext(ctx, a, b, c, s[3], pf(t, 0), pf(t, 1), pf(t, 2));
        if (pi(t, 3))
            ggml_flash_attn_ext_set_prec(r, (enum ggml_prec)pi(t, 3));
        if (pi(t, 4))
            ggml_flash_attn_ext_set_n_kv_max(r, pi(t, 4));
        ggml_flash_attn_ext_add_sinks(r, s[4]);
        return r;
    case GGML_OP_SSM_CONV: return ggml_ssm_conv(ctx, a, b);
    case GGML_OP_SSM_SCAN: return ggml_ssm_scan(ctx, a, b, c, s[3], s[4], s[5], s[6], pi(t, 0));
    case GGML_OP_WIN_PART: return ggml_win_part(ctx, a, pi(t, 2));
    case GGML_OP_WIN_UNPART: return ggml_win_unpart(ctx, a, (int)t->ne[1], (int)t->ne[2], pi(t, 0));
    case GGML_OP_GET_REL_POS: return ggml_get_rel_pos(ctx, a, (int)t->ne[2], (int)t->ne[1]);
    case GGML_OP_ADD_REL_POS: return inplace ? ggml_add_rel_pos_inplace(ctx, a, b, c) : ggml_add_rel_pos(ctx, a, b, c);
    case GGML_OP_RWKV_WKV6: return ggml_rwkv_wkv6(ctx, a, b, c, s[3], s[4], s[5]);
    case GGML_OP_GATED_LINEAR_ATTN: return ggml_gated_linear_attn(ctx, a, b, c, s[3], s[4], pf(t, 0));
    case GGML_OP_RWKV_WKV7: return ggml_rwkv_wkv7(ctx, a, b, c, s[3], s[4], s[5], s[6]);
    case GGML_OP_SOLVE_TRI: return ggml_solve_tri(ctx, a, b, true, true, false);
    case GGML_OP_GATED_DELTA_NET: return ggml_gated_delta_net(ctx, a, b, c, s[3], s[4], s[5], pi(t, 0));
    case GGML_OP_LIGHTNING_INDEXER: return ggml_lightning_indexer(ctx, a, b, c, s[3]);
    case GGML_OP_DSV4_HC_COMB: return ggml_dsv4_hc_comb(ctx, a, b, c, pf(t, 0), pi(t, 1));
    case GGML_OP_DSV4_HC_PRE: return ggml_dsv4_hc_pre(ctx, a, b);
    case GGML_OP_DSV4_HC_POST: return ggml_dsv4_hc_post(ctx, a, b, c, s[3]);
    case GGML_OP_UNARY: {
        const enum ggml_unary_op op = (enum ggml_unary_op)pi(t, 0);
        if (op == GGML_UNARY_OP_XIELU) {
            /* Its params are functions of its arguments (softplus): any
             * float values are constructible, so they are taken as sent. */
            r = ggml_xielu(ctx, a, 0.0f, 0.0f, 0.0f, 0.0f);
            memcpy(&r->op_params[1], &t->op_params[1], 4 * sizeof(int32_t));
            return r;
        }
        return inplace ? ggml_unary_inplace(ctx, a, op) : ggml_unary(ctx, a, op);
    }
    case GGML_OP_GLU: {
        const enum ggml_glu_op op = (enum ggml_glu_op)pi(t, 0);
        if (op == GGML_GLU_OP_SWIGLU_OAI)
            return ggml_swiglu_oai(ctx, a, b, pf(t, 2), pf(t, 3));
        if (op == GGML_GLU_OP_SWIGLU_CLAMP)
            return ggml_swiglu_clamp(ctx, a, b, pf(t, 3));
        return b ? ggml_glu_split(ctx, a, b, op) : ggml_glu(ctx, a, op, pi(t, 1) != 0);
    }
    case GGML_OP_CROSS_ENTROPY_LOSS: return ggml_cross_entropy_loss(ctx, a, b);
    case GGML_OP_CROSS_ENTROPY_LOSS_BACK: return ggml_cross_entropy_loss_back(ctx, a, b, c);
    case GGML_OP_OPT_STEP_ADAMW: return ggml_opt_step_adamw(ctx, a, b, c, s[3], s[4]);
    case GGML_OP_OPT_STEP_SGD: return ggml_opt_step_sgd(ctx, a, b, c);
    default:
        /* FLASH_ATTN_BACK (its constructor always aborts), custom ops
         * (host function pointers), and any op added to ggml later. */
        return NULL;
    }
}

/* ---- comparing --------------------------------------------------------- */

static const char *differ(const struct ggml_tensor *t, const char *field)
{
    snprintf(reason, sizeof(reason), "%s node differs from what ggml builds: %s", ggml_op_desc(t), field);
    return reason;
}

static const char *compare(const struct ggml_tensor *t, const struct ggml_tensor *r, bool query)
{
    if (r->op != t->op)
        return differ(t, "op");
    if (r->type != t->type)
        return differ(t, "type");
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (r->ne[i] != t->ne[i])
            return differ(t, "ne");
    /* An empty result has no element for its strides to place (the CPU
     * backend skips such nodes), and ggml gives it degenerate ones.  Strides
     * are compared as import makes them (a contiguous tensor's size-1
     * strides canonical, import.c): import made the node's so, while a
     * constructor may leave its result's as a source had them, or set them
     * (and tests hand over ggml's own). */
    if (!ggml_is_empty(t) && memcmp(r->nb, t->nb, sizeof(t->nb)) != 0) {
        struct ggml_tensor rc = *r, tc = *t;
        if (!apir_canonical_unit_strides(&rc) || !apir_canonical_unit_strides(&tc) ||
            memcmp(rc.nb, tc.nb, sizeof(tc.nb)) != 0)
            return differ(t, "nb");
    }
    if (memcmp(r->op_params, t->op_params, sizeof(t->op_params)) != 0)
        return differ(t, "op_params");
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        /* ggml_cast makes its CPY node its own destination (src[1]). */
        const bool both_self = r->src[i] == r && t->src[i] == t;
        if (r->src[i] != t->src[i] && !both_self)
            return differ(t, "src");
    }
    if (!query && (r->view_src != t->view_src || r->view_offs != t->view_offs))
        return differ(t, "view_src/view_offs");
    return NULL;
}

/* The constructor call, under the trap; separate so no local of the caller
 * lives across setjmp. */
static const char *derive_trapped(struct ggml_context *ctx, const struct ggml_tensor *t, bool inplace, bool query)
{
    jmp_buf trap;
    if (setjmp(trap) != 0)
        return reason;
    derive_trap = &trap;
    struct ggml_tensor *r = derive(ctx, t, inplace);
    derive_trap = NULL;
    if (!r) {
        snprintf(reason, sizeof(reason), "op %s not derivable", ggml_op_desc(t));
        return reason;
    }
    return compare(t, r, query);
}

const char *apir_op_derive_error(const struct ggml_tensor *t, bool query)
{
    pthread_once(&setup_once, setup);
    struct ggml_context *ctx = scratch();
    if (!ctx)
        return "no scratch context for checking the node";
    /* A query's tensors come without flags, and the optimizer steps'
     * constructors assert their parameter's PARAM flag: on the host's own
     * copy of the subject's source, which serves this answer alone, it is
     * taken as set. */
    if (query && (t->op == GGML_OP_OPT_STEP_ADAMW || t->op == GGML_OP_OPT_STEP_SGD))
        t->src[0]->flags |= GGML_TENSOR_FLAG_PARAM;
    /* In a graph a node is an inplace variant exactly when it is a view.  A
     * query does not say (no view_src): either variant will do. */
    const char *why = derive_trapped(ctx, t, t->view_src != NULL, query);
    if (why && query) {
        ggml_reset(ctx);
        if (!derive_trapped(ctx, t, true, query))
            return NULL;
    }
    return why;
}
