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

/* ---- types each kernel handles ------------------------------------------ */

static const char *types_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    switch (t->op) {
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
    case GGML_OP_ADD:
        /* add_q_f32 (quantized src0, ggml_add_cast's any result type)
         * requantizes each row with the result type's from_float, or, where
         * that is NULL, memcpys ne0 * nb0 bytes of f32 (a block per element
         * for a quantized result: past its row) */
        return !ggml_is_quantized(a->type) || has_cpu_from_float(t->type) ? NULL
                                                                          : "ADD of a quantized source into a type without a CPU conversion";
    case GGML_OP_ADD1:
        /* add1_f32 / add1_q_f32 read the scalar as a float; add1_f16_f16
         * and add1_bf16_bf16 as src0's own type */
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
    case GGML_OP_RWKV_WKV6: case GGML_OP_GATED_LINEAR_ATTN: case GGML_OP_RWKV_WKV7:
        /* the kernels (switched on src0 only) read every operand as f32 */
        for (int i = 0; i < GGML_MAX_SRC && t->src[i]; i++)
            if (t->src[i]->type != GGML_TYPE_F32)
                return "recurrent op needs f32 operands";
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
        why = recurrent_error(t);
    if (!why && t->op == GGML_OP_GATED_DELTA_NET)
        why = gated_delta_net_error(t);
    if (!why && !query)
        why = overlap_error(t);
    return why;
}
