#include "op_operands.h"

#include "ggml-impl.h"
#include "ggml.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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

/* The type a CPU vec_dot takes its second operand in (type_traits_cpu
 * .vec_dot_type) for the types has_cpu_vec_dot accepts: MUL_MAT_ID uses a
 * src1 of that type as it is, and converts any other from f32 (asserting
 * that it is f32). */
static enum ggml_type cpu_vec_dot_type(enum ggml_type type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        return type;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1:
        return GGML_TYPE_Q8_1;
    case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0:
    case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4: case GGML_TYPE_IQ4_NL:
        return GGML_TYPE_Q8_0;
    default:  /* the K, IQ (but IQ4_NL) and TQ types */
        return GGML_TYPE_Q8_K;
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
        /* repeat_f16 (f16, bf16, i16) and repeat_f32 (f32, i32); its i64
         * case is commented out: GGML_ABORT */
        return is_f32_or_f16(type) || type == GGML_TYPE_BF16 || type == GGML_TYPE_I16 || type == GGML_TYPE_I32;
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
        if (!has_cpu_vec_dot(a->type))
            return "MUL_MAT weights of a type without a CPU vec_dot";
        /* mul_mat_id converts a src1 not of the vec_dot type from f32,
         * asserting that it is (fuzz_op-63); the CPU backend's supports_op
         * says the same for MUL_MAT, not for MUL_MAT_ID */
        return b->type == GGML_TYPE_F32 || b->type == cpu_vec_dot_type(a->type) ? NULL
                                                                                 : "MUL_MAT src1 neither f32 nor the weights' vec_dot type";
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

/* ---- layouts --------------------------------------------------------- */

/* Rows dense: nb[0] is the element (block) size.  Many kernels step
 * through a row as a plain array and assert so; the constructors make
 * results dense, but a node's sources (and an in-place node's result, a
 * view of its source) can be any view. */
static bool rows_dense(const struct ggml_tensor *t) { return t->nb[0] == ggml_type_size(t->type); }

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

/* ---- operand agreement: what each kernel's address arithmetic assumes --- */

/*
 * Read off the pinned ggml-cpu entry points (ops.cpp, binary-ops.cpp,
 * unary-ops.cpp, ggml-cpu.c for MUL_MAT/MUL_MAT_ID), one entry per op:
 * where a kernel forms an operand's addresses from another operand's
 * counts or strides, or walks a tensor in a way its strides do not state
 * (rows at j * nb[1] over ggml_nrows, arrays of ne[0] from a row start),
 * the entry requires the layout that makes those addresses the operand's
 * own elements.  What the constructor already ties (shapes, types, its
 * asserts) is only named; other files' rules are named where they are
 * (op_shapes.c: parameters and extents; op_policy.c: index values).  A
 * contiguous tensor's size-1 strides are canonical by now (import.c), so
 * "contiguous" means every stride canonical; ggml_is_contiguous_1
 * (ROWS_BY_NB1) counts the stride of a size-1 dimension 1 itself.
 *
 * The table is the allowlist: an op without an entry is refused
 * (FLASH_ATTN_BACK, the custom ops, an op added to ggml later).
 */

/* A node's operands as the table names them: its sources, then itself. */
enum { S0, S1, S2, S3, S4, S5, S6, DST, N_OPERANDS };

static const char *const operand_names[N_OPERANDS] = { "src0", "src1", "src2", "src3", "src4", "src5", "src6", "result" };

enum layout_check {
    END = 0,          /* (a zeroed slot ends an entry's list) */
    ROWS_DENSE,       /* nb[0] is the element (block) size: rows are arrays */
    ROWS_WIDE,        /* nb[0] at least the element size: ne[0] elements read as an
                       * array from any row start stay inside the tensor */
    PLANE_WIDE,       /* the same for [ne1][ne0] read as one array from a plane start */
    ROWS_BY_NB1,      /* row j of ggml_nrows lies at j * nb[1] (ggml_is_contiguous_1,
                       * rows dense) */
    ROWS_PACKED,      /* rows dense and back to back: nb[1] is ne[0] elements */
    CONTIGUOUS,       /* ggml_is_contiguous: with canonical size-1 strides, every
                       * stride canonical */
    CONTIGUOUS_DENSE, /* that, and nb[0] the element size (asserted by some kernels) */
    CONTIGUOUS_1,     /* ggml_is_contiguous_1 */
    CONTIGUOUS_ROWS,  /* ggml_is_contiguous_rows */
    SAME_STRIDES,     /* b is addressed with a's strides: the same nb (size-1 dims aside) */
    NOT_PERMUTED,     /* nb[0] <= nb[1] <= nb[2] <= nb[3] (asserted) */
};

static const char *const check_failures[] = {
    [ROWS_DENSE] = "rows not dense",
    [ROWS_WIDE] = "rows narrower than their elements",
    [PLANE_WIDE] = "planes narrower than their rows",
    [ROWS_BY_NB1] = "rows not at j * nb[1]",
    [ROWS_PACKED] = "rows not back to back",
    [CONTIGUOUS] = "not contiguous",
    [CONTIGUOUS_DENSE] = "not contiguous",
    [CONTIGUOUS_1] = "not contiguous in its rows",
    [CONTIGUOUS_ROWS] = "rows not dense",
    [SAME_STRIDES] = "not laid out as",
    [NOT_PERMUTED] = "permuted",
};

struct agreement {
    uint8_t check, a, b;  /* b: SAME_STRIDES' second operand */
};

#define MAX_AGREEMENTS 8

struct operand_rule {
    const char *kernel;  /* the kernel's accesses the rule is about */
    struct agreement checks[MAX_AGREEMENTS];
    const char *(*more)(const struct ggml_tensor *t);  /* what the checks cannot say */
};

static bool rows_wide(const struct ggml_tensor *t)
{
    return t->ne[0] <= 1 || t->nb[0] >= ggml_type_size(t->type);
}

static bool holds(enum layout_check check, const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    switch (check) {
    case ROWS_DENSE: return rows_dense(a);
    case ROWS_WIDE: return rows_wide(a);
    case PLANE_WIDE: return rows_wide(a) && (a->ne[1] <= 1 || a->nb[1] >= ggml_row_size(a->type, a->ne[0]));
    case ROWS_BY_NB1: return rows_dense(a) && ggml_is_contiguous_1(a);
    case ROWS_PACKED: return rows_dense(a) && a->nb[1] == ggml_row_size(a->type, a->ne[0]);
    case CONTIGUOUS: return ggml_is_contiguous(a);
    case CONTIGUOUS_DENSE: return ggml_is_contiguous(a) && rows_dense(a);
    case CONTIGUOUS_1: return ggml_is_contiguous_1(a);
    case CONTIGUOUS_ROWS: return ggml_is_contiguous_rows(a);
    case SAME_STRIDES:
        /* where an index can be other than 0 (the shapes are the constructor's) */
        for (int i = 0; b && i < GGML_MAX_DIMS; i++)
            if ((a->ne[i] > 1 || b->ne[i] > 1) && a->nb[i] != b->nb[i])
                return false;
        return true;
    case NOT_PERMUTED: return a->nb[0] <= a->nb[1] && a->nb[1] <= a->nb[2] && a->nb[2] <= a->nb[3];
    case END: break;
    }
    return false;
}

/* add_q_f32 (src0 of a block type): f32 src1 rows read as arrays, and it
 * asserts a result that is not permuted */
static const char *add_more(const struct ggml_tensor *t)
{
    if (!ggml_is_quantized(t->src[0]->type))
        return NULL;
    if (!rows_dense(t->src[1]))
        return "ADD of a block type: src1 rows not dense";
    return holds(NOT_PERMUTED, t, NULL) ? NULL : "ADD of a block type: result permuted";
}

/* add1_q_f32 asserts a result that is not permuted (it places batch i3 at
 * i3 * nb[0], inside the result only while nb[0] <= nb[3]) */
static const char *add1_more(const struct ggml_tensor *t)
{
    if (!ggml_is_quantized(t->src[0]->type) || holds(NOT_PERMUTED, t, NULL))
        return NULL;
    return "ADD1 of a block type: result permuted";
}

/* concat_any (types other than f32/i32, f16/bf16/i16, i8) copies whole
 * rows as arrays and asserts ggml_is_contiguous_rows of both sources */
static const char *concat_more(const struct ggml_tensor *t)
{
    switch (t->src[0]->type) {
    case GGML_TYPE_F32: case GGML_TYPE_I32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_I16:
    case GGML_TYPE_I8:
        return NULL;  /* element by element, each by its own strides */
    default:
        return ggml_is_contiguous_rows(t->src[0]) && ggml_is_contiguous_rows(t->src[1]) ? NULL
                                                                                      : "CONCAT rows not dense";
    }
}

/* With the Hadamard hint, mul_mat runs fwht_f32 instead: each src1 row of
 * ne10 floats (a power of two, asserted) is transformed in place in the
 * result's row at the same indices - ne10 floats written where the result
 * has ne0 = src0's ne1. */
static const char *mul_mat_more(const struct ggml_tensor *t)
{
    const struct ggml_tensor *b = t->src[1];
    if (t->op_params[1] != GGML_HINT_SRC0_IS_HADAMARD)
        return NULL;  /* any other value: the plain product */
    if (b->type != GGML_TYPE_F32 || t->type != GGML_TYPE_F32)
        return "MUL_MAT Hadamard transform of a type other than f32";
    if (t->ne[0] != b->ne[0] || (b->ne[0] & (b->ne[0] - 1)) != 0)
        return "MUL_MAT Hadamard transform: rows not a power of two as long as the result's";
    return NULL;
}

/* get_rows_back reads src0 row i at i * nb[1] for every index i <
 * nelements(src1): src0 (a matrix, constructor) needs that many rows */
static const char *get_rows_back_more(const struct ggml_tensor *t)
{
    return ggml_nelements(t->src[1]) <= t->src[0]->ne[1] ? NULL : "GET_ROWS_BACK with more indices than source rows";
}

/* im2col_f32/_f16 read an image plane [IH][IW] (2-D) or a row [IW] (1-D)
 * as one array from (n, c), and keep those two strides in ints */
static const char *im2col_more(const struct ggml_tensor *t)
{
    const struct ggml_tensor *b = t->src[1];
    const bool is_2D = t->op_params[6] == 1;
    if (is_2D && !holds(PLANE_WIDE, b, NULL))
        return "IM2COL image planes narrower than their rows";
    const int n_dim = is_2D ? 3 : 2, c_dim = is_2D ? 2 : 1;
    if ((b->ne[n_dim] > 1 && b->nb[n_dim] > INT_MAX) || (b->ne[c_dim] > 1 && b->nb[c_dim] > INT_MAX))
        return "IM2COL image strides beyond an int";
    return NULL;
}

/* ssm_scan_f32 takes B and C's group g = h / (heads / groups) and asserts
 * heads % groups == 0 */
static const char *ssm_scan_more(const struct ggml_tensor *t)
{
    const int64_t heads = t->src[1]->ne[1], groups = t->src[4]->ne[1];
    return groups > 0 && heads % groups == 0 ? NULL : "SSM_SCAN groups do not divide the heads";
}

/* upscale_f32 finds the source of result index i at i / sf, sf = (float)ne
 * / ne_src, unclamped for planes and batches in every mode and for every
 * dimension in NEAREST mode; on dimensions of millions the float rounding
 * of the last index can reach ne_src, one past the source.  Computed as
 * the kernel does (and as a reciprocal multiply, should a compiler make
 * it one). */
static bool scaled_index_inside(int64_t ne, int64_t ne_src, float sf)
{
    if (ne <= 0)
        return true;
    if (ne_src <= 0)
        return false;  /* every mode reads index 0 of the empty source */
    const float last = (float)(ne - 1);
    return (int64_t)(last / sf) < ne_src && (int64_t)(last * (1.0f / sf)) < ne_src;
}

static const char *upscale_more(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0];
    const int32_t flags = t->op_params[0];
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (i < 2 && (flags & 0xFF) != GGML_SCALE_MODE_NEAREST && a->ne[i] > 0)
            continue;  /* clamped to the source's dimension */
        float sf = (float)t->ne[i] / (float)a->ne[i];
        if (i < 2 && (flags & GGML_SCALE_FLAG_ALIGN_CORNERS) && t->ne[i] > 1 && a->ne[i] > 1)
            sf = (float)(t->ne[i] - 1) / (float)(a->ne[i] - 1);
        if (!scaled_index_inside(t->ne[i], a->ne[i], sf))
            return "UPSCALE source index past the source";
    }
    return NULL;
}

/* apply_unary_op_functor (XIELU) asserts ggml_is_contiguous_1 */
static const char *unary_more(const struct ggml_tensor *t)
{
    if (ggml_get_unary_op(t) != GGML_UNARY_OP_XIELU)
        return NULL;
    return ggml_is_contiguous_1(t->src[0]) && ggml_is_contiguous_1(t) ? NULL
                                                                       : "unary op operands not contiguous in their rows";
}

#define CHECK1(c, a) { c, a, 0 }
#define NO_CHECKS { { END, 0, 0 } }
#define SAME(a, b) { SAME_STRIDES, a, b }

#define NO_KERNEL "no kernel: a leaf or a view, placed inside its buffer or source by import"
#define UNARY_OPS_CPP "apply_unary_op (unary-ops.cpp): src0 and the result (one shape) by the same row indices, rows as arrays (asserted)"
#define DUP "dup: every operand indexed within its own ne by its own nb (the result's counters run over its own dims), or copied densely when contiguous; types: cpy_types_error"
#define BINARY "apply_binary_op (binary-ops.cpp): src0 and the result (one shape) by the row's indices, src1 by them modulo its ne (ggml_can_repeat); rows as arrays (asserted)"
#define ACC_SET "acc_f32 / set_*: src0 copied over the result (both contiguous, asserted), src1 rows as arrays written into a view of params strides and offset (op_shapes.c acc_view_fits)"
#define DIAG_MASK "diag_mask_f32: the result's planes k < ne2 * ne3 at k * nb[2] (both contiguous with dense rows, asserted; canonical size-1 strides make those its planes)"
#define ROPE_ "rope_flt: src0 and the result (one shape) by the same indices, rows as arrays (asserted); positions read as an array (a vector that long, constructor); factors and params: op_shapes.c"
#define SORT "argsort_f32 / top_k_f32: source row i at i * nb[1] for every i < nrows (fuzz_op-60), the result's likewise (fresh)"
#define RECURRENT "rwkv_wkv6 / gla / rwkv_wkv7: every operand read densely, by element counts derived from src1, the result and the state (recurrent_error)"

static const struct operand_rule operand_rules[GGML_OP_COUNT] = {
    [GGML_OP_NONE] = { NO_KERNEL, NO_CHECKS, NULL },
    [GGML_OP_RESHAPE] = { NO_KERNEL, NO_CHECKS, NULL },
    [GGML_OP_VIEW] = { NO_KERNEL, NO_CHECKS, NULL },
    [GGML_OP_PERMUTE] = { NO_KERNEL, NO_CHECKS, NULL },
    [GGML_OP_TRANSPOSE] = { NO_KERNEL, NO_CHECKS, NULL },
    [GGML_OP_DUP] = { DUP, NO_CHECKS, NULL },
    [GGML_OP_CPY] = { DUP, NO_CHECKS, NULL },
    [GGML_OP_CONT] = { DUP, NO_CHECKS, NULL },
    [GGML_OP_ADD] = { BINARY "; add_q_f32 (a block src0): src1 rows as arrays, the result not permuted (asserted)",
                      { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, add_more },
    [GGML_OP_SUB] = { BINARY, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_MUL] = { BINARY "; fused after an RMS_NORM: import.c", { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_DIV] = { BINARY, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_ADD_ID] = { "add_id_f32: src0 and result rows at the result's indices, src1 row ids[i1, i2] (op_policy.c); rows as arrays (asserted)",
                         { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, S1), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_ADD1] = { "add1_*: src0 and result rows (one shape) at the same indices, rows as arrays (asserted), the scalar read once; add1_q_f32: the result not permuted (asserted)",
                       { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, add1_more },
    [GGML_OP_ACC] = { ACC_SET, { CHECK1(CONTIGUOUS, DST), CHECK1(CONTIGUOUS, S0), CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_SET] = { ACC_SET, { CHECK1(CONTIGUOUS, DST), CHECK1(CONTIGUOUS, S0), CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_SQR] = { UNARY_OPS_CPP, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_SQRT] = { UNARY_OPS_CPP, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_LOG] = { UNARY_OPS_CPP, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_SIN] = { UNARY_OPS_CPP, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_COS] = { UNARY_OPS_CPP, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_SUM] = { "sum_*: ne00 elements read as an array from every row start (asserted only in debug builds)",
                      { CHECK1(ROWS_WIDE, S0) }, NULL },
    [GGML_OP_SUM_ROWS] = { "sum_rows_f32: rows as arrays (asserted), one sum per row at the result's own indices",
                           { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_CUMSUM] = { "cumsum_f32: src0 and the result (one shape) by the same indices, rows as arrays (asserted)",
                         { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_MEAN] = { "mean_f32: ne00 elements read as an array from every row start (asserted only in debug builds)",
                       { CHECK1(ROWS_WIDE, S0) }, NULL },
    [GGML_OP_ARGMAX] = { "argmax_f32: row i1 of the matrix src0 read as an array of ne00 (asserted only in debug builds), into the result's element i1",
                         { CHECK1(ROWS_WIDE, S0) }, NULL },
    [GGML_OP_COUNT_EQUAL] = { "count_equal_i32: both operands (one shape) by their own strides; the row split: op_shapes.c count_equal_rows_ok",
                              NO_CHECKS, NULL },
    [GGML_OP_REPEAT] = { "repeat_*: source rows copied as arrays (asserted) to result rows (fresh) at indices within the result",
                         { CHECK1(ROWS_DENSE, S0) }, NULL },
    [GGML_OP_REPEAT_BACK] = { "repeat_back_f32: source rows (asserted dense) added into result rows (fresh) at indices within it",
                              { CHECK1(ROWS_DENSE, S0) }, NULL },
    [GGML_OP_CONCAT] = { "concat_*: elements by their own indices, src1's offset by src0's extent along dim (constructor); concat_any: rows copied as arrays (asserted)",
                         NO_CHECKS, concat_more },
    [GGML_OP_SILU_BACK] = { "silu_back_*: rows j < nrows of src0, src1 and the result at j * nb[1] (shapes, types: op_shapes.c silu_back_fits)",
                            { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_BY_NB1, S1), CHECK1(ROWS_BY_NB1, DST) }, NULL },
    [GGML_OP_NORM] = { "norm_f32: src0 and the result (one shape) by their own strides, as arrays only when both rows are dense",
                       NO_CHECKS, NULL },
    [GGML_OP_RMS_NORM] = { "rms_norm_f32: src0 rows read as arrays (asserted), written as arrays into the result's at the same indices (one shape); fused with a MUL: import.c",
                           { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_RMS_NORM_BACK] = { "rms_norm_back_f32: src0 and src1 (shapes: op_shapes.c) rows as arrays (asserted) at the same indices, result rows fresh",
                                { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_GROUP_NORM] = { "group_norm_f32: src0 and result rows as arrays (asserted) at the same indices (one shape)",
                             { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_L2_NORM] = { "l2_norm_f32: src0 and the result (one shape) by their own strides, as arrays only when both rows are dense",
                          NO_CHECKS, NULL },
    [GGML_OP_MUL_MAT] = { "mul_mat: src0 rows and src1 columns as arrays (op_shapes.c), result by its own indices (fresh); fwht (the Hadamard hint) writes src1's row length into result rows",
                          NO_CHECKS, mul_mat_more },
    [GGML_OP_MUL_MAT_ID] = { "mul_mat_id: expert ids (op_policy.c) pick src0 matrices (< ne02), rows as arrays (op_shapes.c), result by its own indices (fresh)",
                             NO_CHECKS, NULL },
    [GGML_OP_OUT_PROD] = { "out_prod_*: the result zeroed densely (fresh), src0 rows as arrays (asserted) at plane i2 / (ne2 / ne02), src1 by its own strides",
                           { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_SCALE] = { "scale_f32: rows j < nrows at j * nb[1] of both (contiguous, asserted; with a bias src0's at the result's nb[1], the same strides for one shape)",
                        { CHECK1(CONTIGUOUS, S0), CHECK1(CONTIGUOUS, DST) }, NULL },
    [GGML_OP_GET_ROWS] = { "get_rows_*: src0 row ids[..] (op_policy.c) at (i01, i11, i12) by its strides, ne00 elements read as an array from there (asserted only in debug builds); result rows fresh",
                           { CHECK1(ROWS_WIDE, S0) }, NULL },
    [GGML_OP_GET_ROWS_BACK] = { "get_rows_back_*: the result zeroed densely (contiguous, asserted), src0 row i at i * nb[1] (a matrix) for every index i: as many rows as indices",
                                { CHECK1(CONTIGUOUS, DST), CHECK1(ROWS_DENSE, S0) }, get_rows_back_more },
    [GGML_OP_SET_ROWS] = { "set_rows_impl: src0 rows (i, i02, i03) into result row ids[..] (op_policy.c) at the same i02, i03 (constructor: equal ne2, ne3), rows as arrays (constructor: ggml_is_contiguous_rows of both)",
                           NO_CHECKS, NULL },
    [GGML_OP_DIAG] = { "diag_f32: src0 row and result rows (fresh) as arrays (asserted)",
                       { CHECK1(ROWS_DENSE, S0) }, NULL },
    [GGML_OP_DIAG_MASK_INF] = { DIAG_MASK, { CHECK1(CONTIGUOUS_DENSE, DST), CHECK1(CONTIGUOUS_DENSE, S0) }, NULL },
    [GGML_OP_DIAG_MASK_ZERO] = { DIAG_MASK, { CHECK1(CONTIGUOUS_DENSE, DST), CHECK1(CONTIGUOUS_DENSE, S0) }, NULL },
    [GGML_OP_SOFT_MAX] = { "soft_max_f32: src0 (contiguous, constructor) and the result by the same indices, rows as arrays; mask (contiguous, constructor) row i01 < its ne1; sinks[head] (ne0 = heads, constructor)",
                           NO_CHECKS, NULL },
    [GGML_OP_SOFT_MAX_BACK] = { "soft_max_ext_back_f32: rows j < nrows at j * nb[1] of all three (contiguous, asserted; shapes: op_shapes.c)",
                                { CHECK1(CONTIGUOUS, DST), CHECK1(CONTIGUOUS, S0), CHECK1(CONTIGUOUS, S1) }, NULL },
    [GGML_OP_ROPE] = { ROPE_, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_ROPE_BACK] = { ROPE_, { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_CLAMP] = { "clamp_*: rows j < nrows(src0) at j * nb[1] of src0 and of the result, no contiguity check",
                        { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_BY_NB1, DST) }, NULL },
    [GGML_OP_CONV_TRANSPOSE_1D] = { "conv_transpose_1d_*: kernel and src1 rows as arrays (asserted), the result zeroed and written densely (fresh)",
                                    { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_IM2COL] = { "im2col_*: an image plane [IH][IW] (2-D) or row read as one array from (n, c) by src1's strides, kept in ints; the result written densely (fresh)",
                         { CHECK1(ROWS_DENSE, S1) }, im2col_more },
    [GGML_OP_IM2COL_BACK] = { "im2col_back_f32: src0 read densely as the result's im2col, the result by its own strides in ints (op_shapes.c im2col_back_fits)",
                              NO_CHECKS, NULL },
    [GGML_OP_IM2COL_3D] = { "im2col_3d_*: src1 by its own strides ((n * IC + c) < ne13), rows dense (asserted); the result written densely (fresh)",
                            { CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_COL2IM_1D] = { "col2im_1d_impl: src0 read and the result written densely (both contiguous, asserted)",
                            { CHECK1(CONTIGUOUS, S0), CHECK1(CONTIGUOUS, DST) }, NULL },
    [GGML_OP_CONV_2D] = { "conv_2d_impl: the kernel read densely (contiguous, asserted), input and result by their own indices",
                          { CHECK1(CONTIGUOUS, S0) }, NULL },
    [GGML_OP_CONV_3D] = { "conv_3d_impl: the kernel read densely (contiguous, asserted), input and result by their own indices",
                          { CHECK1(CONTIGUOUS, S0) }, NULL },
    [GGML_OP_CONV_2D_DW] = { "conv_2d_dw_*: input, kernel and result read and written densely within their elements (layouts: op_shapes.c conv_2d_dw_layout_ok)",
                             NO_CHECKS, NULL },
    [GGML_OP_CONV_TRANSPOSE_2D] = { "conv_transpose_2d_impl: kernel planes read as one [ne01][ne00] array from (i02, i03), src1 rows as arrays (asserted), the result dense (fresh)",
                                    { CHECK1(ROWS_DENSE, S0), CHECK1(PLANE_WIDE, S0), CHECK1(ROWS_DENSE, S1) }, NULL },
    [GGML_OP_POOL_1D] = { "pool_1d_ksp: rows j < nrows at j * nb[1] of src0 (contiguous; its types: types_error) and of the result (fresh)",
                          { CHECK1(CONTIGUOUS, S0) }, NULL },
    [GGML_OP_POOL_2D] = { "pool_2d: src0 planes at k * nb[2] up to its ggml_nbytes, result planes densely, one per step (src0 contiguous: canonical size-1 strides make the steps its planes)",
                          { CHECK1(CONTIGUOUS, S0) }, NULL },
    [GGML_OP_POOL_2D_BACK] = { "pool_2d_back: result planes by its strides (fresh), src0 read densely, src1 at the result's strides (op_shapes.c pool_2d_back_fits)",
                               NO_CHECKS, NULL },
    [GGML_OP_UPSCALE] = { "upscale_f32: source indices from the result's through float scale factors (i / (ne / ne_src)), by the source's own strides",
                          NO_CHECKS, upscale_more },
    [GGML_OP_PAD] = { "pad_f32: src0 by its own strides at the result's indices less the padding (the constructor's shape), the result written densely (fresh)",
                      NO_CHECKS, NULL },
    [GGML_OP_PAD_REFLECT_1D] = { "pad_reflect_1d: src0 rows (contiguous, constructor) copied as arrays into result rows (fresh) between the paddings",
                                 NO_CHECKS, NULL },
    [GGML_OP_ROLL] = { "roll_f32: rows of both by their own strides, elements as arrays (constructor: nb[0] the element size, shifts inside the dims)",
                       NO_CHECKS, NULL },
    [GGML_OP_ARANGE] = { "arange_f32: the result's elements (fresh)", NO_CHECKS, NULL },
    [GGML_OP_TIMESTEP_EMBEDDING] = { "timestep_embedding_f32: ne00 timesteps read as an array (asserted), one result row each (fresh)",
                                     { CHECK1(ROWS_DENSE, S0) }, NULL },
    [GGML_OP_ARGSORT] = { SORT, { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_TOP_K] = { SORT, { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_LEAKY_RELU] = { "leaky_relu_*: rows i < nrows(src0) at i * nb[1] of src0 and of the result, no contiguity check (asserted only in debug builds)",
                             { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_BY_NB1, DST) }, NULL },
    [GGML_OP_TRI] = { "tri_f32: src0 (contiguous, asserted) and the result (fresh) by the same indices",
                      { CHECK1(CONTIGUOUS, S0) }, NULL },
    [GGML_OP_FILL] = { "fill_*: ne0 elements written as an array from every result row start",
                       { CHECK1(ROWS_WIDE, DST) }, NULL },
    [GGML_OP_FLASH_ATTN_EXT] = { "flash_attn_ext_*: K/V rows at Q's head / broadcast ratios, mask rows per query (contiguous, constructor): op_shapes.c flash_attn_ext_error",
                                 NO_CHECKS, NULL },
    [GGML_OP_SSM_CONV] = { "ssm_conv_f32: src0 rows and src1 rows read as one array each (row i1 at i1 * ne0: asserted for src0), src0 sequences at i3 * nb[2], i3 < its ne2 (constructor)",
                           { CHECK1(ROWS_PACKED, S0), CHECK1(ROWS_PACKED, S1) }, NULL },
    [GGML_OP_SSM_SCAN] = { "ssm_scan_f32: sequence i3's state written at the result + x's bytes + i3 * src0->nb[3] (one state apart: src0 contiguous, canonical ne[3] stride) and read at ids[i3] * nb[3] (op_policy.c); rows as arrays (asserted)",
                           { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, S1), CHECK1(ROWS_DENSE, S2), CHECK1(ROWS_DENSE, S3),
                             CHECK1(ROWS_DENSE, S4), CHECK1(ROWS_DENSE, S5), CHECK1(ROWS_DENSE, S6), CHECK1(CONTIGUOUS, S0) },
                           ssm_scan_more },
    [GGML_OP_WIN_PART] = { "win_part_f32: src0 read and the result written densely within their elements (shapes: constructor)",
                           NO_CHECKS, NULL },
    [GGML_OP_WIN_UNPART] = { "win_unpart_f32: src0 read and the result written densely within their elements (op_shapes.c win_unpart_fits)",
                             NO_CHECKS, NULL },
    [GGML_OP_GET_REL_POS] = { "get_rel_pos_f16: src0 read and the result written densely within their elements (constructor: src0 rows for every position)",
                              NO_CHECKS, NULL },
    [GGML_OP_ADD_REL_POS] = { "add_rel_pos_f32: src0 copied over the result densely, src1/src2 read densely within their elements (all contiguous, constructor)",
                              NO_CHECKS, NULL },
    [GGML_OP_RWKV_WKV6] = { RECURRENT, NO_CHECKS, recurrent_error },
    [GGML_OP_GATED_LINEAR_ATTN] = { RECURRENT, NO_CHECKS, recurrent_error },
    [GGML_OP_RWKV_WKV7] = { RECURRENT, NO_CHECKS, recurrent_error },
    [GGML_OP_SOLVE_TRI] = { "solve_tri_f32: A and B matrices read densely from their (i02, i03) starts, the result likewise (fresh)",
                            { CHECK1(CONTIGUOUS, S0), CHECK1(CONTIGUOUS, S1) }, NULL },
    [GGML_OP_GATED_DELTA_NET] = { "gated_delta_net_one_chunk: q/k rows at (iv3 / ratio, t, iv1 % ne1), g/beta at (iv3, t, iv1), state of sequence iv3 at iv3 * nb[3] (gated_delta_net_error)",
                                  { CHECK1(CONTIGUOUS_ROWS, S0), CHECK1(CONTIGUOUS_ROWS, S1), CHECK1(CONTIGUOUS_ROWS, S2),
                                    CHECK1(CONTIGUOUS, S3), CHECK1(CONTIGUOUS, S4), CHECK1(CONTIGUOUS, S5) },
                                  gated_delta_net_error },
    [GGML_OP_LIGHTNING_INDEXER] = { "lightning_indexer: q, k, weight, mask rows read as arrays (asserted) at indices the constructor ties, the result by its own",
                                    { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, S1), CHECK1(ROWS_DENSE, S2), CHECK1(ROWS_DENSE, S3),
                                      CHECK1(ROWS_DENSE, DST) }, NULL },
    [GGML_OP_DSV4_HC_COMB] = { "dsv4_hc_comb_f32: every operand by its own strides within the constructor's shapes", NO_CHECKS, NULL },
    [GGML_OP_DSV4_HC_PRE] = { "dsv4_hc_pre_f32: every operand by its own strides within the constructor's shapes", NO_CHECKS, NULL },
    [GGML_OP_DSV4_HC_POST] = { "dsv4_hc_post_f32: every operand by its own strides within the constructor's shapes", NO_CHECKS, NULL },
    [GGML_OP_UNARY] = { "ggml_compute_forward_unary: " UNARY_OPS_CPP "; XIELU also ggml_is_contiguous_1 (asserted)",
                        { CHECK1(ROWS_DENSE, S0), CHECK1(ROWS_DENSE, DST) }, unary_more },
    [GGML_OP_GLU] = { "glu kernels: rows i < nrows at i * nb[1] of src0, src1 and the result (ggml_is_contiguous_1 of each, asserted)",
                      { CHECK1(CONTIGUOUS_1, S0), CHECK1(CONTIGUOUS_1, S1), CHECK1(CONTIGUOUS_1, DST) }, NULL },
    [GGML_OP_CROSS_ENTROPY_LOSS] = { "cross_entropy_loss_f32: rows i < nrows at i * nb[1] of src0 and src1 (one shape), read as arrays (asserted)",
                                     { CHECK1(ROWS_BY_NB1, S0), CHECK1(ROWS_BY_NB1, S1) }, NULL },
    [GGML_OP_CROSS_ENTROPY_LOSS_BACK] = { "cross_entropy_loss_back_f32: rows i < nrows at i * nb[1] of src1, src2 and the result (all contiguous, asserted), src0's first element",
                                          { CHECK1(CONTIGUOUS, S0), CHECK1(CONTIGUOUS, S1), CHECK1(CONTIGUOUS, S2), CHECK1(CONTIGUOUS, DST) },
                                          NULL },
    [GGML_OP_OPT_STEP_ADAMW] = { "opt_step_adamw_f32: one offset, from the weight's strides, for the weight, its gradient, m and v (written): all four laid out alike",
                                 { CHECK1(ROWS_DENSE, S0), SAME(S0, S1), SAME(S0, S2), SAME(S0, S3) }, NULL },
    [GGML_OP_OPT_STEP_SGD] = { "opt_step_sgd_f32: one offset, from the weight's strides, for the weight and its gradient: both laid out alike",
                               { CHECK1(ROWS_DENSE, S0), SAME(S0, S1) }, NULL },
};

const char *apir_op_operand_rule(int op)
{
    return op >= 0 && op < GGML_OP_COUNT ? operand_rules[op].kernel : NULL;
}

static _Thread_local char layout_reason[160];

static const char *layout_error(const struct ggml_tensor *t)
{
    const struct operand_rule *rule = &operand_rules[t->op];
    if (!rule->kernel)
        return "op without an operand rule";
    for (int i = 0; i < MAX_AGREEMENTS && rule->checks[i].check != END; i++) {
        const struct agreement *c = &rule->checks[i];
        const struct ggml_tensor *a = c->a == DST ? t : t->src[c->a];
        const struct ggml_tensor *b = c->check == SAME_STRIDES ? t->src[c->b] : NULL;
        if (!a || holds((enum layout_check)c->check, a, b))
            continue;  /* an optional operand absent, or the rule met */
        if (c->check == SAME_STRIDES)
            snprintf(layout_reason, sizeof(layout_reason), "%s operand layout: %s %s %s", ggml_op_desc(t),
                     operand_names[c->b], check_failures[c->check], operand_names[c->a]);
        else
            snprintf(layout_reason, sizeof(layout_reason), "%s operand layout: %s %s", ggml_op_desc(t),
                     operand_names[c->a], check_failures[c->check]);
        return layout_reason;
    }
    return rule->more ? rule->more(t) : NULL;
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
        why = layout_error(t);  /* the operand rule table, recurrent extents included */
    if (!why && !query)
        why = overlap_error(t);
    return why;
}
