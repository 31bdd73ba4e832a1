#include "op_shapes.h"

#include "ggml.h"

#include <stdbool.h>

static bool same_shape(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

static bool is_empty(const struct ggml_tensor *t)
{
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (t->ne[i] == 0)
            return true;
    return false;
}

/* a can be repeated (broadcast) to fill b. */
static bool can_repeat(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    if (is_empty(a))
        return is_empty(b);
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (b->ne[i] % a->ne[i] != 0)
            return false;
    return true;
}

static bool ne_is(const struct ggml_tensor *t, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    return t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == n2 && t->ne[3] == n3;
}

/* f32 results are written row by row with unit stride. */
static bool f32_rows(const struct ggml_tensor *t)
{
    return t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float);
}

/* Element count, or -1 when it does not fit 63 bits (strides of 0 let a
 * tensor that small in memory claim that many elements). */
/* Laid out as ggml_new_tensor lays out a fresh result. */
static bool contiguous(const struct ggml_tensor *t)
{
    size_t nb = ggml_type_size(t->type);
    if ((size_t)t->nb[0] != nb)
        return false;
    nb = ggml_row_size(t->type, t->ne[0]);
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        if ((size_t)t->nb[i] != nb)
            return false;
        nb *= (size_t)t->ne[i];
    }
    return true;
}

static int64_t nelements(const struct ggml_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < GGML_MAX_DIMS; i++)
        if (__builtin_mul_overflow(n, t->ne[i], &n))
            return -1;
    return n;
}

/* Same element count, both countable. */
static bool same_count(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    int64_t na = nelements(a);
    return na >= 0 && na == nelements(b);
}

/* The sources an op cannot do without: those ggml's constructors always set
 * (optional ones - masks, sinks, frequency factors - are not counted). */
static int required_srcs(enum ggml_op op)
{
    switch (op) {
    case GGML_OP_NONE: case GGML_OP_ARANGE:
    case GGML_OP_RESHAPE: case GGML_OP_VIEW: case GGML_OP_PERMUTE: case GGML_OP_TRANSPOSE:
        return 0;
    case GGML_OP_ADD: case GGML_OP_ADD1: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
    case GGML_OP_MUL_MAT: case GGML_OP_OUT_PROD: case GGML_OP_CPY: case GGML_OP_SET: case GGML_OP_ACC:
    case GGML_OP_GET_ROWS: case GGML_OP_GET_ROWS_BACK: case GGML_OP_SET_ROWS: case GGML_OP_CONCAT:
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: case GGML_OP_COUNT_EQUAL: case GGML_OP_SSM_CONV:
    case GGML_OP_SOFT_MAX_BACK: case GGML_OP_SILU_BACK: case GGML_OP_RMS_NORM_BACK:
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_IM2COL: case GGML_OP_IM2COL_BACK: case GGML_OP_IM2COL_3D:
    case GGML_OP_CONV_2D: case GGML_OP_CONV_2D_DW: case GGML_OP_CONV_3D: case GGML_OP_CONV_TRANSPOSE_1D:
    case GGML_OP_CONV_TRANSPOSE_2D: case GGML_OP_POOL_2D_BACK: case GGML_OP_SOLVE_TRI: case GGML_OP_DSV4_HC_PRE:
        return 2;
    case GGML_OP_MUL_MAT_ID: case GGML_OP_ADD_ID: case GGML_OP_FLASH_ATTN_EXT: case GGML_OP_CROSS_ENTROPY_LOSS_BACK:
    case GGML_OP_ADD_REL_POS: case GGML_OP_FLASH_ATTN_BACK: case GGML_OP_OPT_STEP_SGD: case GGML_OP_DSV4_HC_COMB:
    case GGML_OP_LIGHTNING_INDEXER:
        return 3;
    case GGML_OP_DSV4_HC_POST:
        return 4;
    case GGML_OP_GATED_LINEAR_ATTN: case GGML_OP_OPT_STEP_ADAMW:
        return 5;
    case GGML_OP_RWKV_WKV6: case GGML_OP_GATED_DELTA_NET:
        return 6;
    case GGML_OP_SSM_SCAN: case GGML_OP_RWKV_WKV7:
        return 7;
    default:
        return 1;
    }
}

/* The channels-last (CWHN) order in which CONV_2D_DW makes its result from
 * a channels-last input (ggml_conv_2d_dw_direct): a permutation of one
 * dense block, so its extent - what import bounds-checked - is exactly the
 * block the kernel writes. */
static bool is_dense_cwhn(const struct ggml_tensor *t)
{
    const size_t ts = ggml_type_size(t->type);
    return ggml_blck_size(t->type) == 1 && (size_t)t->nb[2] == ts && (size_t)t->nb[0] == (size_t)t->ne[2] * ts &&
           t->nb[1] == (size_t)t->ne[0] * t->nb[0] && t->nb[3] == (size_t)t->ne[1] * t->nb[1];
}

/* The kernel touches [data, data + nelements * type size) whatever the
 * strides say: that block must lie inside what import bounds-checked. */
static bool extent_covers_dense(const struct ggml_tensor *t)
{
    return ggml_blck_size(t->type) == 1 && ggml_nbytes(t) >= (size_t)ggml_nelements(t) * ggml_type_size(t->type);
}

const char *apir_op_shape_error(const struct ggml_tensor *t)
{
    const int need = required_srcs(t->op);
    for (int i = 0; i < need; i++)
        if (!t->src[i])
            return "op without a source it requires";
    const struct ggml_tensor *a = t->src[0], *b = t->src[1], *c = t->src[2];

    /* A result's elements are adjacent: ggml makes results as new tensors,
     * and kernels write them with unit stride (several assert it).  Only a
     * copy may land in a transposed view of its destination; a depthwise
     * convolution keeps channels-last order. */
    if (required_srcs(t->op) > 0 && t->op != GGML_OP_CPY && t->nb[0] != ggml_type_size(t->type) &&
        !(t->op == GGML_OP_CONV_2D_DW && is_dense_cwhn(t)))
        return "result elements not adjacent";

    /* Kernels that exist for f32 sources only abort on anything else (the
     * CPU backend's supports_op does not say so; found by fuzz_dispatch). */
    switch (t->op) {
    case GGML_OP_SUM_ROWS: case GGML_OP_MEAN: case GGML_OP_ARGSORT: case GGML_OP_SOFT_MAX: case GGML_OP_RMS_NORM:
    case GGML_OP_NORM: case GGML_OP_GROUP_NORM: case GGML_OP_L2_NORM:
        if (a->type != GGML_TYPE_F32)
            return "op needs an f32 source";
        break;
    case GGML_OP_SUM:
        if (a->type != GGML_TYPE_F32 && a->type != GGML_TYPE_F16 && a->type != GGML_TYPE_BF16)
            return "SUM needs an f32/f16/bf16 source";
        break;
    default:
        break;
    }

    switch (t->op) {
    case GGML_OP_ADD: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
        return can_repeat(b, a) && same_shape(a, t) ? NULL : "binary op shapes do not broadcast";
    case GGML_OP_ADD1:
        return nelements(b) == 1 && same_shape(a, t) ? NULL : "ADD1 needs a scalar";
    case GGML_OP_ADD_ID:
        return a->ne[0] == b->ne[0] && a->ne[1] == c->ne[0] && a->ne[2] == c->ne[1] && c->type == GGML_TYPE_I32 &&
               same_shape(a, t) ? NULL : "ADD_ID shapes do not match";
    case GGML_OP_MUL_MAT:
        /* The kernels step through rows of both operands with unit element
         * stride and assert a fresh, ordered result. */
        if (a->nb[0] != ggml_type_size(a->type) || b->nb[0] != ggml_type_size(b->type) || !contiguous(t))
            return "MUL_MAT operand or result layout";
        if (a->ne[0] != b->ne[0] || a->ne[2] == 0 || a->ne[3] == 0 || b->ne[2] % a->ne[2] || b->ne[3] % a->ne[3])
            return "MUL_MAT operands do not fit";
        if (a->nb[0] > a->nb[1] && a->ne[1] > 1)
            return "MUL_MAT with a transposed first operand";
        return ne_is(t, a->ne[1], b->ne[1], b->ne[2], b->ne[3]) && f32_rows(t) ? NULL : "MUL_MAT result shape";
    case GGML_OP_MUL_MAT_ID:
        if (a->nb[0] != ggml_type_size(a->type) || b->nb[0] != ggml_type_size(b->type) || !contiguous(t))
            return "MUL_MAT_ID operand or result layout";
        if (c->type != GGML_TYPE_I32 || c->ne[2] != 1 || b->ne[3] != 1 || c->ne[1] != b->ne[2] || b->ne[1] == 0 ||
            c->ne[0] % b->ne[1] || a->ne[0] != b->ne[0] || c->ne[0] > a->ne[2])
            return "MUL_MAT_ID operands do not fit";
        return ne_is(t, a->ne[1], c->ne[0], b->ne[2], 1) && f32_rows(t) ? NULL : "MUL_MAT_ID result shape";
    case GGML_OP_CONV_2D_DW:
        /* kernel a [KW, KH, 1, C], input b [W, H, C, N], result [OW, OH, C, N]:
         * the CPU kernels index all three densely from ne (channels from b,
         * the result's channels unchecked: a short result was written past),
         * assert the rest, and take the channels-last path for a
         * channels-last input, which asserts the kernel's strides. */
        if (a->ne[2] != 1 || a->ne[3] != b->ne[2] || t->ne[2] != b->ne[2] || t->ne[3] != b->ne[3])
            return "CONV_2D_DW shapes do not fit";
        if ((a->type != GGML_TYPE_F32 && a->type != GGML_TYPE_F16) || b->type != GGML_TYPE_F32 || t->type != GGML_TYPE_F32)
            return "CONV_2D_DW types";
        if (!extent_covers_dense(a) || !extent_covers_dense(b) || !extent_covers_dense(t))
            return "CONV_2D_DW operand smaller than its elements";
        if (!ggml_is_contiguous(b) && !(ggml_is_contiguous_channels(b) && a->nb[0] >= a->nb[2] && a->nb[1] >= a->nb[0]))
            return "CONV_2D_DW input layout";
        return NULL;
    case GGML_OP_OUT_PROD:
        if (!contiguous(t))
            return "OUT_PROD result layout";
        if (a->ne[1] != b->ne[1] || a->ne[2] == 0 || a->ne[3] == 0 || b->ne[2] % a->ne[2] || b->ne[3] % a->ne[3])
            return "OUT_PROD operands do not fit";
        return ne_is(t, a->ne[0], b->ne[0], b->ne[2], b->ne[3]) && f32_rows(t) ? NULL : "OUT_PROD result shape";
    case GGML_OP_DUP: case GGML_OP_CONT:
        return same_count(a, t) ? NULL : "copy sizes differ";
    case GGML_OP_CPY:
        return same_count(a, b) && same_count(t, b) ? NULL : "copy sizes differ";
    case GGML_OP_GET_ROWS:
        if (b->type != GGML_TYPE_I32 || a->ne[2] != b->ne[1] || b->ne[3] != 1)
            return "GET_ROWS operands do not fit";
        return ne_is(t, a->ne[0], b->ne[0], b->ne[1], b->ne[2]) ? NULL : "GET_ROWS result shape";
    case GGML_OP_GET_ROWS_BACK:
        return b->type == GGML_TYPE_I32 && a->ne[2] == 1 && a->ne[3] == 1 && t->ne[0] == a->ne[0] &&
               nelements(b) >= 0 && nelements(b) <= a->ne[1] && t->ne[2] == 1 && t->ne[3] == 1 ? NULL : "GET_ROWS_BACK shapes";
    case GGML_OP_SET_ROWS:
        /* dst is the destination view a; src0 the rows b; src1 the indices c */
        if ((b->type != GGML_TYPE_I64 && b->type != GGML_TYPE_I32) || t->ne[0] != a->ne[0] || t->ne[2] != a->ne[2] ||
            t->ne[3] != a->ne[3] || a->ne[1] != b->ne[0] || b->ne[1] == 0 || b->ne[2] == 0 || a->ne[2] % b->ne[1] ||
            a->ne[3] % b->ne[2] || b->ne[3] != 1)
            return "SET_ROWS operands do not fit";
        return NULL;
    case GGML_OP_SOFT_MAX:
        if (!same_shape(a, t))
            return "SOFT_MAX result shape";
        if (b && (b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1] || b->ne[2] == 0 || b->ne[3] == 0 ||
                  a->ne[2] % b->ne[2] || a->ne[3] % b->ne[3]))
            return "SOFT_MAX mask shape";
        if (c && c->ne[0] != a->ne[2])
            return "SOFT_MAX sinks shape";
        return NULL;
    case GGML_OP_ROPE: {
        const int mode = t->op_params[2], n_dims = t->op_params[1];
        if (!same_shape(a, t) || b->type != GGML_TYPE_I32)
            return "ROPE shapes";
        if (n_dims < 0 || n_dims > a->ne[0] || (n_dims & 1))
            return "ROPE dimensions out of range";
        if (b->ne[0] < ((mode & 8) ? 4 * a->ne[2] : a->ne[2]))
            return "ROPE needs a position per row";
        if (c && (c->type != GGML_TYPE_F32 || c->ne[0] < n_dims / 2))
            return "ROPE frequency factors";
        return NULL;
    }
    case GGML_OP_CONCAT: {
        const int dim = t->op_params[0];
        if (dim < 0 || dim >= GGML_MAX_DIMS)
            return "CONCAT dimension out of range";
        for (int d = 0; d < GGML_MAX_DIMS; d++) {
            int64_t want = d == dim ? a->ne[d] + b->ne[d] : a->ne[d];
            if ((d != dim && b->ne[d] != a->ne[d]) || t->ne[d] != want)
                return "CONCAT shapes";
        }
        return NULL;
    }
    case GGML_OP_FLASH_ATTN_EXT: {
        const struct ggml_tensor *q = a, *k = b, *v = c, *mask = t->src[3], *sinks = t->src[4];
        if (k->ne[0] != q->ne[0] || k->ne[2] == 0 || q->ne[2] % k->ne[2] || q->ne[3] != k->ne[3] ||
            q->ne[3] != v->ne[3] || v->ne[1] != k->ne[1] || v->ne[2] != k->ne[2])
            return "FLASH_ATTN_EXT operands do not fit";
        if (mask && (mask->ne[0] != k->ne[1] || mask->ne[1] < q->ne[1] || mask->ne[2] == 0 || mask->ne[3] == 0 ||
                     q->ne[2] % mask->ne[2] || q->ne[3] % mask->ne[3]))
            return "FLASH_ATTN_EXT mask shape";
        if (sinks && sinks->ne[0] != q->ne[2])
            return "FLASH_ATTN_EXT sinks shape";
        return ne_is(t, v->ne[0], q->ne[2], q->ne[1], q->ne[3]) ? NULL : "FLASH_ATTN_EXT result shape";
    }
    case GGML_OP_GLU:
        if (b)
            return same_shape(a, b) && same_shape(a, t) ? NULL : "GLU shapes";
        return t->ne[0] == a->ne[0] / 2 && t->ne[1] == a->ne[1] && t->ne[2] == a->ne[2] && t->ne[3] == a->ne[3]
                   ? NULL : "GLU result shape";
    case GGML_OP_UNARY: case GGML_OP_SCALE: case GGML_OP_RMS_NORM: case GGML_OP_NORM: case GGML_OP_L2_NORM:
    case GGML_OP_SQR: case GGML_OP_SQRT: case GGML_OP_LOG: case GGML_OP_SIN: case GGML_OP_COS: case GGML_OP_CLAMP:
    case GGML_OP_LEAKY_RELU: case GGML_OP_DIAG_MASK_INF: case GGML_OP_DIAG_MASK_ZERO: case GGML_OP_CUMSUM:
    case GGML_OP_ARGSORT: case GGML_OP_GROUP_NORM:
        return same_shape(a, t) ? NULL : "result shape differs from its source";
    case GGML_OP_TOP_K:
        return t->ne[0] <= a->ne[0] && t->ne[1] == a->ne[1] && t->ne[2] == a->ne[2] && t->ne[3] == a->ne[3]
                   ? NULL : "TOP_K shapes";
    case GGML_OP_SUM_ROWS: case GGML_OP_MEAN:
        return t->ne[0] == 1 && t->ne[1] == a->ne[1] && t->ne[2] == a->ne[2] && t->ne[3] == a->ne[3]
                   ? NULL : "row reduction shape";
    case GGML_OP_REPEAT:
        return can_repeat(a, t) ? NULL : "REPEAT shapes";
    case GGML_OP_REPEAT_BACK:
        return can_repeat(t, a) ? NULL : "REPEAT_BACK shapes";
    default:
        return NULL;
    }
}
