#include "op_operands.h"

#include "ggml-impl.h"
#include "ggml.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- type sets, from the pinned CPU backend's tables -------------------- */

/* Types whose CPU type traits (ggml-cpu.c type_traits_cpu) have a vec_dot:
 * MUL_MAT/MUL_MAT_ID call it on src0 rows, FLASH_ATTN_EXT on K rows.
 * Not I8..I64 (NULL: a call to address 0), Q8_1, Q8_K (NULL), F64. */
static bool has_cpu_vec_dot(enum ggml_type type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0: case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4:
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ2_S:
    case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
    case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0:
        return true;
    default:
        return false;
    }
}

/* Types whose CPU type traits have a from_float: SET_ROWS converts each
 * f32 row with the destination's (IQ2_XXS/XS, IQ3_*, IQ2_S, IQ1_* and
 * I8/I16/I64 have none: a call to address 0). */
static bool has_cpu_from_float(enum ggml_type type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_I32:
    case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0: case GGML_TYPE_Q8_1: case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4:
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_Q8_K: case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0:
        return true;
    default:
        return false;
    }
}

static bool is_f32_or_f16(enum ggml_type type) { return type == GGML_TYPE_F32 || type == GGML_TYPE_F16; }

/* CPY between two types (ggml_compute_forward_dup; the same type is a
 * byte copy): float types to float types and F32 to I32 element by
 * element; I32 to F32; a float source into any other type through that
 * type's from_float, row by row (dup_to_q: a contiguous result, a dense
 * source row, whole blocks per row); a quantized source only into F32
 * (dup_from_q: an f32 result dense in its rows, whole blocks per row unless
 * the result is contiguous).  Every other pair reaches GGML_ABORT. */
static const char *cpy_types_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0];
    const enum ggml_type from = a->type, to = t->type;
    const bool from_float = from == GGML_TYPE_F32 || from == GGML_TYPE_F16 || from == GGML_TYPE_BF16;
    const bool to_float = to == GGML_TYPE_F32 || to == GGML_TYPE_F16 || to == GGML_TYPE_BF16;
    if (from == to)
        return NULL;
    if (from_float && (to_float || (from == GGML_TYPE_F32 && to == GGML_TYPE_I32)))
        return NULL;
    if (from == GGML_TYPE_I32)
        return to == GGML_TYPE_F32 ? NULL : "CPY from I32 into a type other than F32";
    if (from_float) {
        if (!has_cpu_from_float(to))
            return "CPY into a type without a CPU conversion";
        if (!ggml_is_contiguous(t) || a->nb[0] != ggml_type_size(from) || a->ne[0] % ggml_blck_size(to) != 0)
            return "CPY into a block type needs a contiguous result and whole blocks per dense source row";
        return NULL;
    }
    if (ggml_is_quantized(from) && to == GGML_TYPE_F32) {
        if (t->nb[0] != ggml_type_size(to) || (t->ne[0] % ggml_blck_size(from) != 0 && !ggml_is_contiguous(t)))
            return "CPY from a block type needs a result dense in its rows";
        return ggml_get_type_traits(from)->to_float ? NULL : "CPY from a type without a conversion";
    }
    return "CPY between these types has no CPU kernel";
}

/* ---- the CPU kernels' type dispatch ------------------------------------- */

/* What each op's CPU entry point (ggml-cpu/ops.cpp ggml_compute_forward_*)
 * switches on (src0's type, or dst->src[0]'s), and which source types have
 * a case there: every other type reaches its `default: GGML_ABORT`.  Read off the pinned ops.cpp, one line
 * per entry point; ops whose entry point has no such switch are not listed
 * (their types are the constructor's, or a rule below checks them). */
enum src0_rule { ANY_TYPE, F32_ONLY, F32_F16, F32_F16_BF16, REPEAT_TYPES, SET_TYPES, GET_ROWS_TYPES, REL_POS_TYPES };

static enum src0_rule src0_rule_of(const struct ggml_tensor *t)
{
    switch (t->op) {
    case GGML_OP_ADD_ID: case GGML_OP_ACC: case GGML_OP_CUMSUM: case GGML_OP_SUM_ROWS: case GGML_OP_MEAN:
    case GGML_OP_ARGMAX: case GGML_OP_REPEAT_BACK: case GGML_OP_TRI: case GGML_OP_NORM: case GGML_OP_RMS_NORM:
    case GGML_OP_RMS_NORM_BACK: case GGML_OP_GROUP_NORM: case GGML_OP_L2_NORM: case GGML_OP_SCALE: case GGML_OP_DIAG:
    case GGML_OP_DIAG_MASK_INF: case GGML_OP_DIAG_MASK_ZERO: case GGML_OP_SOFT_MAX: case GGML_OP_SOFT_MAX_BACK:
    case GGML_OP_UPSCALE: case GGML_OP_PAD: case GGML_OP_ROLL: case GGML_OP_TIMESTEP_EMBEDDING: case GGML_OP_ARGSORT:
    case GGML_OP_TOP_K: case GGML_OP_WIN_PART: case GGML_OP_WIN_UNPART: case GGML_OP_ADD_REL_POS:
    case GGML_OP_RWKV_WKV6: case GGML_OP_GATED_LINEAR_ATTN: case GGML_OP_GATED_DELTA_NET: case GGML_OP_RWKV_WKV7:
    case GGML_OP_DSV4_HC_COMB: case GGML_OP_DSV4_HC_PRE: case GGML_OP_DSV4_HC_POST:
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_CROSS_ENTROPY_LOSS_BACK: case GGML_OP_OPT_STEP_ADAMW:
    case GGML_OP_OPT_STEP_SGD: case GGML_OP_SSM_CONV: case GGML_OP_SSM_SCAN:
        return F32_ONLY;
    case GGML_OP_FILL: case GGML_OP_LEAKY_RELU: case GGML_OP_SILU_BACK: case GGML_OP_GET_ROWS_BACK: case GGML_OP_CLAMP:
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: case GGML_OP_CONV_TRANSPOSE_1D: case GGML_OP_CONV_TRANSPOSE_2D:
    case GGML_OP_SET_ROWS:
        return F32_F16;
    case GGML_OP_SUM: case GGML_OP_COL2IM_1D:
        return F32_F16_BF16;
    case GGML_OP_REPEAT:
        return REPEAT_TYPES;
    case GGML_OP_SET:
        return SET_TYPES;
    case GGML_OP_GET_ROWS:
        return GET_ROWS_TYPES;
    case GGML_OP_GET_REL_POS:
        return REL_POS_TYPES;
    case GGML_OP_UNARY:
        /* ops.cpp's own GELU*, SILU (f32, f16); the rest are unary-ops.cpp
         * (f32, f16, bf16: the result has the source's type) */
        switch (ggml_get_unary_op(t)) {
        case GGML_UNARY_OP_GELU: case GGML_UNARY_OP_GELU_ERF: case GGML_UNARY_OP_GELU_QUICK: case GGML_UNARY_OP_SILU:
            return F32_F16;
        default:
            return F32_F16_BF16;
        }
    case GGML_OP_GLU:
        return ggml_get_glu_op(t) == GGML_GLU_OP_SWIGLU_OAI ? F32_ONLY : F32_F16;
    case GGML_OP_SQR: case GGML_OP_SQRT: case GGML_OP_LOG: case GGML_OP_SIN: case GGML_OP_COS:
        return F32_F16_BF16;  /* unary-ops.cpp */
    default:
        return ANY_TYPE;
    }
}

static bool src0_type_allowed(enum src0_rule rule, enum ggml_type type)
{
    switch (rule) {
    case ANY_TYPE: return true;
    case F32_ONLY: return type == GGML_TYPE_F32;
    case F32_F16: return is_f32_or_f16(type);
    case F32_F16_BF16: return is_f32_or_f16(type) || type == GGML_TYPE_BF16;
    case REPEAT_TYPES:
        return is_f32_or_f16(type) || type == GGML_TYPE_BF16 || type == GGML_TYPE_I16 || type == GGML_TYPE_I32 ||
               type == GGML_TYPE_I64;
    case SET_TYPES: return type == GGML_TYPE_F32 || type == GGML_TYPE_I32;
    case GET_ROWS_TYPES:
        /* get_rows_q for every block type with a to_float, f16, bf16, f32
         * and i32 rows */
        return is_f32_or_f16(type) || type == GGML_TYPE_BF16 || type == GGML_TYPE_I32 ||
               (ggml_is_quantized(type) && type != GGML_TYPE_Q8_K && ggml_get_type_traits(type)->to_float);
    case REL_POS_TYPES: return type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    }
    return false;
}

/* binary-ops.cpp (ADD of float sources, SUB, MUL, DIV): the type triples
 * (src0, src1, dst) it has a case for; any other aborts */
static bool binary_types_ok(enum ggml_type a, enum ggml_type b, enum ggml_type d)
{
    if (a == b && b == d)
        return is_f32_or_f16(a) || a == GGML_TYPE_BF16;
    return (a == GGML_TYPE_BF16 || a == GGML_TYPE_F16) && b == GGML_TYPE_F32 && (d == a || d == GGML_TYPE_F32);
}

/* ---- types each kernel handles ------------------------------------------ */

static const char *types_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    if (a && !src0_type_allowed(src0_rule_of(t), a->type))  /* ARANGE has no source */
        return "source type without a CPU kernel for this op";
    switch (t->op) {
    case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
        return binary_types_ok(a->type, b->type, t->type) ? NULL : "binary op types without a CPU kernel";
    case GGML_OP_MUL_MAT: case GGML_OP_MUL_MAT_ID:
        /* ggml_compute_forward_mul_mat calls type_traits_cpu[src0]->vec_dot
         * per row pair */
        return has_cpu_vec_dot(a->type) ? NULL : "MUL_MAT weights of a type without a CPU vec_dot";
    case GGML_OP_OUT_PROD:
        /* ggml_compute_forward_out_prod: f32, f16 (with f32 src1) and the
         * quantized types it dequantizes */
        return (has_cpu_vec_dot(a->type) && a->type != GGML_TYPE_BF16) && b->type == GGML_TYPE_F32
                   ? NULL : "OUT_PROD operand types";
    case GGML_OP_SET_ROWS:
        /* set_rows_impl: f32/f16 rows (src0) converted by the destination
         * type's from_float */
        return has_cpu_from_float(t->type) && is_f32_or_f16(a->type) ? NULL : "SET_ROWS types without a CPU conversion";
    case GGML_OP_FLASH_ATTN_EXT: {
        /* one_chunk: kq_vec_dot = type_traits_cpu[K]->vec_dot (called
         * unchecked), v_to_float = to_float of V, Q converted with the
         * from_float of K's vec_dot_type */
        const struct ggml_tensor *v = t->src[2];
        const ggml_to_float_t v_to_float = ggml_get_type_traits(v->type)->to_float;
        if (!has_cpu_vec_dot(b->type) || !(v->type == GGML_TYPE_F32 || v_to_float) || a->type != GGML_TYPE_F32)
            return "FLASH_ATTN_EXT Q/K/V types";
        if (t->src[3] && t->src[3]->type != GGML_TYPE_F16 && t->src[3]->type != GGML_TYPE_F32)
            return "FLASH_ATTN_EXT mask type";
        return NULL;
    }
    case GGML_OP_CPY:
        return cpy_types_error(t);
    /* the other operands' types the kernels assert (ops.cpp) */
    case GGML_OP_ADD_ID:  /* add_id_f32: f32 rows, i32 ids */
        return b->type == GGML_TYPE_F32 && t->src[2]->type == GGML_TYPE_I32 && t->type == GGML_TYPE_F32 ? NULL
                                                                                                     : "ADD_ID types";
    case GGML_OP_GLU:  /* every GLU kernel: the gate of the source's type */
        return !b || b->type == a->type ? NULL : "GLU gate of another type";
    case GGML_OP_IM2COL_BACK:
        return is_f32_or_f16(b->type) && t->type == GGML_TYPE_F32 ? NULL : "IM2COL_BACK types";
    case GGML_OP_PAD_REFLECT_1D:
        return t->type == GGML_TYPE_F32 ? NULL : "PAD_REFLECT_1D result type";
    case GGML_OP_SOLVE_TRI:
        return a->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 ? NULL
                                                                                               : "SOLVE_TRI types";
    case GGML_OP_ACC: case GGML_OP_RMS_NORM_BACK: case GGML_OP_SSM_CONV:
        /* acc_f32 asserts nb10 == sizeof(float), rms_norm_back_f32 and
         * ssm_conv_f32 src1's nb[0]: an f32 second operand */
        return b->type == GGML_TYPE_F32 ? NULL : "op needs an f32 second operand";
    case GGML_OP_SET:
        /* set_f32 / set_i32 assert nb10 == the size of src0's element */
        return b->type == a->type ? NULL : "SET of another type than its destination";
    case GGML_OP_SSM_SCAN:
        /* ssm_scan_f32: src0..5 f32 rows, src6 i32 ids */
        for (int i = 0; i < 6; i++)
            if (t->src[i]->type != GGML_TYPE_F32)
                return "SSM_SCAN operands not f32";
        return t->src[6]->type == GGML_TYPE_I32 ? NULL : "SSM_SCAN ids not i32";
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_CROSS_ENTROPY_LOSS_BACK:
    case GGML_OP_OPT_STEP_ADAMW: case GGML_OP_OPT_STEP_SGD:
    case GGML_OP_DSV4_HC_COMB: case GGML_OP_DSV4_HC_PRE: case GGML_OP_DSV4_HC_POST:
    case GGML_OP_RWKV_WKV6: case GGML_OP_GATED_LINEAR_ATTN: case GGML_OP_RWKV_WKV7:
        /* f32 kernels over every operand (the recurrent ones switch on
         * src0 only and read the rest as f32) */
        for (int i = 0; i < GGML_MAX_SRC && t->src[i]; i++)
            if (t->src[i]->type != GGML_TYPE_F32)
                return "op needs f32 operands";
        return t->type == GGML_TYPE_F32 ? NULL : "op needs an f32 result";
    case GGML_OP_LIGHTNING_INDEXER: {
        /* q, weights f32, mask f16, keys f32 or of a type with to_float */
        const struct ggml_tensor *w = t->src[2], *m = t->src[3];
        if (a->type != GGML_TYPE_F32 || w->type != GGML_TYPE_F32 || m->type != GGML_TYPE_F16 || t->type != GGML_TYPE_F32)
            return "LIGHTNING_INDEXER types";
        return b->type == GGML_TYPE_F32 || ggml_get_type_traits(b->type)->to_float ? NULL : "LIGHTNING_INDEXER key type";
    }
    case GGML_OP_COUNT_EQUAL:
        /* count_equal_i32 compares two i32 tensors (ggml_count_equal ties
         * only their shapes) */
        return a->type == GGML_TYPE_I32 && b->type == GGML_TYPE_I32 ? NULL : "COUNT_EQUAL needs i32 operands";
    case GGML_OP_IM2COL:
        /* im2col_f16 takes an f16 or f32 input, im2col_f32 an f32 one; any
         * other result type reaches GGML_ABORT */
        if (t->type == GGML_TYPE_F16)
            return is_f32_or_f16(b->type) ? NULL : "IM2COL input type";
        return t->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 ? NULL : "IM2COL result or input type";
    case GGML_OP_IM2COL_3D:
        /* im2col_3d_f16 / _f32 both read an f32 input */
        return (t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32) && b->type == GGML_TYPE_F32 ? NULL
                                                                                                 : "IM2COL_3D result or input type";
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK:
        /* rope_flt: i32 positions, f32 frequency factors */
        return b->type == GGML_TYPE_I32 && (!t->src[2] || t->src[2]->type == GGML_TYPE_F32) ? NULL : "ROPE positions or factors type";
    case GGML_OP_ADD:
        /* float sources: binary-ops.cpp, as SUB; otherwise ggml_compute_forward_add
         * has a case for block types only */
        if (a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16)
            return binary_types_ok(a->type, b->type, t->type) ? NULL : "binary op types without a CPU kernel";
        if (!ggml_is_quantized(a->type) || a->type == GGML_TYPE_Q8_1 || a->type == GGML_TYPE_Q8_K)
            return "ADD source type without a CPU kernel";
        if (b->type != GGML_TYPE_F32)  /* add_q_f32 adds f32 rows */
            return "ADD of a block type needs an f32 addend";
        if (!ggml_are_same_shape(a, b) || !ggml_are_same_shape(a, t))  /* add_q_f32 does not broadcast */
            return "ADD of a block type needs an addend of its shape";
        /* add_q_f32 (quantized src0, ggml_add_cast's any result type)
         * requantizes each row with the result type's from_float, or, where
         * that is NULL, memcpys ne0 * nb0 bytes of f32 (a block per element
         * for a quantized result: past its row) */
        return !ggml_is_quantized(a->type) || has_cpu_from_float(t->type) ? NULL
                                                                          : "ADD of a quantized source into a type without a CPU conversion";
    case GGML_OP_ADD1:
        /* add1_f32 / add1_q_f32 read the scalar as a float; add1_f16_f16
         * and add1_bf16_bf16 as src0's own type; ggml_compute_forward_add1
         * has cases for float and block sources (not Q8_K) only */
        if (!(is_f32_or_f16(a->type) || a->type == GGML_TYPE_BF16 || (ggml_is_quantized(a->type) && a->type != GGML_TYPE_Q8_K)))
            return "ADD1 source type without a CPU kernel";
        if (b->type == GGML_TYPE_F32 || (b->type == a->type && (a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16)))
            return NULL;
        return "ADD1 scalar type";
    case GGML_OP_POOL_1D: case GGML_OP_POOL_2D:
        /* pool_1d_sk_p0 / pool_2d read f32 or else f16 elements and
         * write f32 (pool_2d: f32 or f16) results */
        if (!is_f32_or_f16(a->type))
            return "POOL source type";
        /* they step through the source by rows (1D) or planes (2D) until
         * ggml_nbytes(src), elements at the type's size, writing one result
         * row/plane per step: gaps would make more steps than result rows */
        return ggml_is_contiguous(a) ? NULL : "POOL source not contiguous";
    case GGML_OP_CONV_2D: case GGML_OP_CONV_3D:
        /* conv_2d_impl / conv_3d_impl: a kernel of f32 or f16 (asserted),
         * the input read and the result written as f32 */
        return is_f32_or_f16(a->type) && b->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 ? NULL
                                                                                            : "convolution types";
    case GGML_OP_CONV_TRANSPOSE_1D: case GGML_OP_CONV_TRANSPOSE_2D:
        /* the kernels assert an f32 or f16 kernel, an f32 input and an f32
         * result: refused here rather than aborting the host */
        return is_f32_or_f16(a->type) && b->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 ? NULL
                                                                                            : "transposed convolution types";
    default:
        return NULL;
    }
}

/* ---- layouts the CPU kernels assert ------------------------------------ */

/* Rows dense: nb[0] is the element (block) size.  Many kernels step
 * through a row as a plain array and assert so; the constructors make
 * results dense, but a node's sources (and an in-place node's result, a
 * view of its source) can be any view. */
static bool rows_dense(const struct ggml_tensor *t) { return t->nb[0] == ggml_type_size(t->type); }

/* The asserts of the pinned ggml-cpu kernels on their operands' layout
 * (GGML_ASSERT(nb00 == sizeof(...)), ggml_is_contiguous*(), per entry
 * point; ops.cpp, binary-ops.cpp apply_binary_op, unary-ops.cpp
 * apply_unary_op*): refused here, so a guest's node never reaches them. */
/* ggml_is_contiguous says nothing of nb[0] where ne[0] is one element;
 * a kernel asserting both needs both. */
static bool contiguous_dense(const struct ggml_tensor *t) { return ggml_is_contiguous(t) && rows_dense(t); }

static const char *layout_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    switch (t->op) {
    case GGML_OP_ADD: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
        /* apply_binary_op: nb0, nb00; add_q_f32: nb00, nb10 */
        if (!rows_dense(a) || !rows_dense(t) || (t->op == GGML_OP_ADD && ggml_is_quantized(a->type) && !rows_dense(b)))
            return "binary op rows not dense";
        return NULL;
    case GGML_OP_ADD_ID:
        return rows_dense(a) && rows_dense(b) && rows_dense(t) ? NULL : "ADD_ID rows not dense";
    case GGML_OP_ARGSORT: case GGML_OP_TOP_K:
        /* argsort_f32 / top_k_f32 find row i of the source at i * nb01 alone,
         * for every row of all dimensions: rows one stride apart throughout
         * (a gapped dim 2 or 3 would send them past the source; fuzz_op-60) */
        return rows_dense(a) && rows_dense(t) && ggml_is_contiguous_1(a) ? NULL : "sort source rows not one stride apart";
    case GGML_OP_ADD1: case GGML_OP_CLAMP: case GGML_OP_CUMSUM: case GGML_OP_SUM_ROWS: case GGML_OP_OUT_PROD:
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: case GGML_OP_LIGHTNING_INDEXER:
        return rows_dense(a) && rows_dense(t) ? NULL : "rows not dense";
    case GGML_OP_REPEAT: case GGML_OP_REPEAT_BACK: case GGML_OP_RMS_NORM: case GGML_OP_GROUP_NORM: case GGML_OP_DIAG:
    case GGML_OP_TIMESTEP_EMBEDDING: case GGML_OP_OPT_STEP_ADAMW: case GGML_OP_OPT_STEP_SGD:
        return rows_dense(a) ? NULL : "source rows not dense";
    case GGML_OP_RMS_NORM_BACK: case GGML_OP_CONV_TRANSPOSE_1D: case GGML_OP_CONV_TRANSPOSE_2D: case GGML_OP_SSM_CONV:
    case GGML_OP_CROSS_ENTROPY_LOSS:
        return rows_dense(a) && rows_dense(b) ? NULL : "source rows not dense";
    case GGML_OP_IM2COL: case GGML_OP_IM2COL_3D:
        return rows_dense(b) ? NULL : "IM2COL input rows not dense";
    case GGML_OP_SSM_SCAN:
        for (int i = 0; i < 7; i++)
            if (!rows_dense(t->src[i]))
                return "SSM_SCAN operand rows not dense";
        return NULL;
    case GGML_OP_ACC: case GGML_OP_SET:
        return ggml_is_contiguous(t) && ggml_is_contiguous(a) && rows_dense(b) ? NULL : "ACC/SET operands not contiguous";
    case GGML_OP_SCALE:
        return ggml_is_contiguous(t) && ggml_is_contiguous(a) ? NULL : "operand not contiguous";
    case GGML_OP_DIAG_MASK_INF: case GGML_OP_DIAG_MASK_ZERO:
        /* diag_mask_f32 asserts both contiguous and nb[0] of both */
        return contiguous_dense(t) && contiguous_dense(a) ? NULL : "operand not contiguous";
    case GGML_OP_GET_ROWS_BACK:
        return ggml_is_contiguous(t) && rows_dense(a) ? NULL : "GET_ROWS_BACK operands not contiguous";
    case GGML_OP_SOFT_MAX_BACK:
        return ggml_is_contiguous(t) && ggml_is_contiguous(a) && ggml_is_contiguous(b) ? NULL
                                                                                      : "SOFT_MAX_BACK operands not contiguous";
    case GGML_OP_TRI: case GGML_OP_CONV_2D: case GGML_OP_CONV_3D:
        return ggml_is_contiguous(a) ? NULL : "source not contiguous";
    case GGML_OP_COL2IM_1D:
        return ggml_is_contiguous(a) && ggml_is_contiguous(t) ? NULL : "COL2IM_1D operands not contiguous";
    case GGML_OP_CROSS_ENTROPY_LOSS_BACK:
        for (int i = 0; i < 3; i++)
            if (!ggml_is_contiguous(t->src[i]))
                return "CROSS_ENTROPY_LOSS_BACK operand not contiguous";
        return ggml_is_contiguous(t) ? NULL : "CROSS_ENTROPY_LOSS_BACK result not contiguous";
    case GGML_OP_GATED_DELTA_NET:
        for (int i = 0; i < 3; i++)
            if (!ggml_is_contiguous_rows(t->src[i]))
                return "GATED_DELTA_NET q/k/v rows not dense";
        for (int i = 3; i < 6; i++)
            if (!ggml_is_contiguous(t->src[i]))
                return "GATED_DELTA_NET gate/beta/state not contiguous";
        return NULL;
    case GGML_OP_GLU:
        /* every GLU kernel asserts ggml_is_contiguous_1 of its operands */
        if (!ggml_is_contiguous_1(a) || !ggml_is_contiguous_1(t) || (b && !ggml_is_contiguous_1(b)))
            return "GLU operands not contiguous in their rows";
        return NULL;
    case GGML_OP_UNARY: case GGML_OP_SQR: case GGML_OP_SQRT: case GGML_OP_LOG: case GGML_OP_SIN: case GGML_OP_COS:
        /* unary-ops.cpp: apply_unary_op asserts dense rows (nb0, nb00), and
         * apply_unary_op_functor (XIELU) ggml_is_contiguous_1 as well */
        if (!rows_dense(a) || !rows_dense(t))
            return "unary op rows not dense";
        if (t->op == GGML_OP_UNARY && ggml_get_unary_op(t) == GGML_UNARY_OP_XIELU &&
            (!ggml_is_contiguous_1(a) || !ggml_is_contiguous_1(t)))
            return "unary op operands not contiguous in their rows";
        return NULL;
    default:
        return NULL;
    }
}

/* ---- recurrent kernels: operand extents they derive --------------------- */

/* RWKV_WKV6 / GATED_LINEAR_ATTN / RWKV_WKV7 kernels take T and HEADS from
 * src1 (ne2, ne1), C from the result (ne0 = S*H), n_seqs from the state's
 * ne1, and read, per token t < T, C floats of every per-token operand at
 * t*C; WKV6's time_faaaa (src3) at h*head_size + i < C; the state of
 * sequence t / (T / n_seqs).  The constructors tie the per-token operands
 * to k (not WKV7's r, src0, nor WKV6's time_faaaa) and the state's size. */
static const char *recurrent_error(const struct ggml_tensor *t)
{
    int state_i, n_per_token;
    int per_token[6];
    switch (t->op) {
    case GGML_OP_RWKV_WKV6:  /* k v r tf td state */
        state_i = 5, n_per_token = 4;
        per_token[0] = 0, per_token[1] = 1, per_token[2] = 2, per_token[3] = 4;
        break;
    case GGML_OP_GATED_LINEAR_ATTN:  /* k v q g state */
        state_i = 4, n_per_token = 4;
        per_token[0] = 0, per_token[1] = 1, per_token[2] = 2, per_token[3] = 3;
        break;
    case GGML_OP_RWKV_WKV7:  /* r w k v a b state */
        state_i = 6, n_per_token = 6;
        for (int i = 0; i < 6; i++)
            per_token[i] = i;
        break;
    default:
        return NULL;
    }
    const int64_t T = t->src[1]->ne[2], HEADS = t->src[1]->ne[1], C = t->ne[0];
    const int64_t n_seqs = t->src[state_i]->ne[1];
    /* head_size = C / HEADS and the sequence length T / n_seqs are
     * divisors; t / (T / n_seqs) must stay below n_seqs */
    if (HEADS <= 0 || C % HEADS != 0 || n_seqs <= 0 || T % n_seqs != 0 || (T > 0 && T < n_seqs))
        return "recurrent op heads or sequences";
    for (int i = 0; i < n_per_token; i++)
        if (ggml_nelements(t->src[per_token[i]]) < T * C)
            return "recurrent op operand smaller than its tokens";
    if (t->op == GGML_OP_RWKV_WKV6 && ggml_nelements(t->src[3]) < C)
        return "RWKV_WKV6 time_faaaa smaller than its channels";
    /* WKV7's SIMD path sums a[] * state over head_size in whole
     * GGML_F32_STEP blocks with no tail (64 floats on AVX-512, the widest):
     * a head size not a multiple of it reads past a and the state */
    if (t->op == GGML_OP_RWKV_WKV7 && (C / HEADS) % 64 != 0)
        return "RWKV_WKV7 head size not a multiple of 64";
    return NULL;
}

/* GATED_DELTA_NET (gated_delta_net_one_chunk): per head iv1 < H and
 * sequence iv3 < n_seqs (from v), q/k rows of S_v floats at
 * (iv3 / (nev3/neq3), t, iv1 % neq1), g and beta at (iv3, t, iv1).  The
 * constructor ties only v, the state and the rows of g and beta. */
static const char *gated_delta_net_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *v = t->src[2];
    const int64_t S_v = v->ne[0], H = v->ne[1], T = v->ne[2], n_seqs = v->ne[3];
    for (int i = 0; i < 2; i++) {
        const struct ggml_tensor *qk = t->src[i];
        /* neq1 and neq3 divide; the ratio nev3/neq3 divides too */
        if (qk->ne[0] != S_v || qk->ne[2] != T || qk->ne[1] <= 0 || qk->ne[3] <= 0 || n_seqs % qk->ne[3] != 0)
            return "GATED_DELTA_NET q/k shape";
    }
    for (int i = 3; i < 5; i++) {
        const struct ggml_tensor *gb = t->src[i];
        if (gb->ne[1] < H || gb->ne[2] < T || gb->ne[3] < n_seqs)
            return "GATED_DELTA_NET gate/beta shape";
    }
    return NULL;
}

/* ---- a result over its sources ------------------------------------------ */

/* A kernel reading a source while writing an overlapping result reads
 * what it wrote (ARGSORT compares values it replaced with indices and
 * indexes by them) or memcpys overlapping ranges (CPY).  Allowed only
 * exactly in place: same address and layout, for a node ggml made in
 * place (a view: *_inplace, ACC/SET, CPY/SET_ROWS into their
 * destination) or an op ggml-alloc computes in its parent's memory
 * (ggml_op_can_inplace). */
static const char *overlap_error(const struct ggml_tensor *t)
{
    if (!t->data || ggml_nbytes(t) == 0)
        return NULL;
    const uintptr_t t0 = (uintptr_t)t->data, t1 = t0 + ggml_nbytes(t);
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        const struct ggml_tensor *s = t->src[i];
        if (!s || s == t || !s->data || ggml_nbytes(s) == 0)
            continue;
        const uintptr_t s0 = (uintptr_t)s->data, s1 = s0 + ggml_nbytes(s);
        if (s1 <= t0 || t1 <= s0)
            continue;
        const bool exact = s0 == t0 && ggml_are_same_layout(t, s);
        if (!(exact && (t->view_src || ggml_op_can_inplace(t->op))))
            return "result overlaps a source other than exactly in place";
    }
    return NULL;
}

const char *apir_op_operands_error(const struct ggml_tensor *t, bool query)
{
    const char *why = types_error(t);
    if (!why)
        why = layout_error(t);
    if (!why)
        why = recurrent_error(t);
    if (!why && t->op == GGML_OP_GATED_DELTA_NET)
        why = gated_delta_net_error(t);
    if (!why && !query)
        why = overlap_error(t);
    return why;
}
