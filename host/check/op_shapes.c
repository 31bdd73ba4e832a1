#include "op_shapes.h"
#include "op_derive.h"
#include "op_operands.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* ---- every tensor: its extent covers its elements ------------------------ */

/* row_size(type, ne0) * ne1 * ne2 * ne3, overflow-checked; false when it
 * does not fit 64 bits. */
static bool dense_size(const struct ggml_tensor *t, uint64_t *out)
{
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] == 0) {
            *out = 0;
            return true;
        }
    }
    uint64_t n = (uint64_t)ggml_row_size(t->type, t->ne[0]);
    for (int i = 1; i < GGML_MAX_DIMS; i++)
        if (__builtin_mul_overflow(n, (uint64_t)t->ne[i], &n))
            return false;
    *out = n;
    return true;
}

/* Kernels that read or write densely, ignoring nb, stay inside what import
 * bounds-checked (ggml_nbytes from the buffer's start); and every size a
 * constructor computes from these shapes fits in 64 bits. */
static bool extent_covers_dense(const struct ggml_tensor *t)
{
    uint64_t dense;
    return dense_size(t, &dense) && (uint64_t)ggml_nbytes(t) >= dense;
}

/* ---- what a constructor needs before it can be called --------------------- */

/* The sources an op cannot do without: those ggml's constructors always set
 * and dereference (optional ones - masks, sinks, frequency factors, GLU's
 * second half - are not counted). */
static int required_srcs(enum ggml_op op)
{
    switch (op) {
    case GGML_OP_NONE: case GGML_OP_ARANGE:
    case GGML_OP_RESHAPE: case GGML_OP_VIEW: case GGML_OP_PERMUTE: case GGML_OP_TRANSPOSE:
        return 0;
    case GGML_OP_ADD: case GGML_OP_ADD1: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV:
    case GGML_OP_MUL_MAT: case GGML_OP_OUT_PROD: case GGML_OP_CPY: case GGML_OP_SET: case GGML_OP_ACC:
    case GGML_OP_GET_ROWS: case GGML_OP_GET_ROWS_BACK: case GGML_OP_CONCAT:
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: case GGML_OP_COUNT_EQUAL: case GGML_OP_SSM_CONV:
    case GGML_OP_SOFT_MAX_BACK: case GGML_OP_SILU_BACK: case GGML_OP_RMS_NORM_BACK:
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_IM2COL: case GGML_OP_IM2COL_BACK: case GGML_OP_IM2COL_3D:
    case GGML_OP_CONV_2D: case GGML_OP_CONV_2D_DW: case GGML_OP_CONV_3D: case GGML_OP_CONV_TRANSPOSE_1D:
    case GGML_OP_CONV_TRANSPOSE_2D: case GGML_OP_POOL_2D_BACK: case GGML_OP_SOLVE_TRI: case GGML_OP_DSV4_HC_PRE:
        return 2;
    case GGML_OP_MUL_MAT_ID: case GGML_OP_ADD_ID: case GGML_OP_FLASH_ATTN_EXT: case GGML_OP_CROSS_ENTROPY_LOSS_BACK:
    case GGML_OP_ADD_REL_POS: case GGML_OP_FLASH_ATTN_BACK: case GGML_OP_OPT_STEP_SGD: case GGML_OP_DSV4_HC_COMB:
    case GGML_OP_SET_ROWS:
        return 3;
    case GGML_OP_DSV4_HC_POST: case GGML_OP_LIGHTNING_INDEXER:
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

static bool dims_nonzero(const struct ggml_tensor *t, int from)
{
    for (int i = from; i < GGML_MAX_DIMS; i++)
        if (t->ne[i] == 0)
            return false;
    return true;
}

static bool all_positive(const struct ggml_tensor *t, int first, int count)
{
    for (int i = first; i < first + count; i++)
        if (t->op_params[i] <= 0)
            return false;
    return true;
}

/* Constructors (and a few kernels) divide by some source dimensions and
 * params (a SIGFPE is no assert and cannot be trapped), index name tables by
 * enum params, and convert float params to integers: those inputs are
 * checked first. */
static const char *constructor_inputs_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    switch (t->op) {
    case GGML_OP_MUL_MAT: case GGML_OP_OUT_PROD:
        return dims_nonzero(a, 2) ? NULL : "operand with an empty batch dimension";
    case GGML_OP_MUL_MAT_ID:
        return b->ne[1] != 0 ? NULL : "MUL_MAT_ID with no rows per expert";
    case GGML_OP_FLASH_ATTN_EXT:
        return dims_nonzero(b, 2) && (!t->src[3] || dims_nonzero(t->src[3], 2)) ? NULL : "FLASH_ATTN_EXT empty K or mask";
    case GGML_OP_SOFT_MAX:
        return !b || dims_nonzero(b, 2) ? NULL : "SOFT_MAX empty mask";
    case GGML_OP_SET_ROWS:
        return dims_nonzero(b, 1) ? NULL : "SET_ROWS empty indices";
    case GGML_OP_LIGHTNING_INDEXER:
        return t->src[3]->ne[3] != 0 ? NULL : "LIGHTNING_INDEXER empty mask";
    case GGML_OP_IM2COL:
        return all_positive(t, 0, 1) && (t->op_params[6] == 0 || all_positive(t, 1, 1)) ? NULL : "IM2COL stride";
    case GGML_OP_IM2COL_3D:
        return all_positive(t, 0, 3) && all_positive(t, 9, 1) ? NULL : "IM2COL_3D stride or channels";
    case GGML_OP_CONV_2D: case GGML_OP_CONV_2D_DW:
        return all_positive(t, 0, 2) ? NULL : "convolution stride";
    case GGML_OP_CONV_3D:
        /* conv_3d_impl divides the work buffer by a patch's size, made of
         * the channel counts c and oc (params 9 and 11; n, 10, counts the
         * patches): zero or negative ones (whose products the constructor
         * accepts) divide by zero or assert */
        return all_positive(t, 0, 3) && all_positive(t, 9, 3) ? NULL : "convolution stride or channels";
    case GGML_OP_POOL_1D:
        if (t->op_params[0] != GGML_OP_POOL_MAX && t->op_params[0] != GGML_OP_POOL_AVG)
            return "pool op";
        return all_positive(t, 1, 2) ? NULL : "pool kernel or stride";
    case GGML_OP_POOL_2D: case GGML_OP_POOL_2D_BACK:
        if (t->op_params[0] != GGML_OP_POOL_MAX && t->op_params[0] != GGML_OP_POOL_AVG)
            return "pool op";
        return all_positive(t, 1, 4) ? NULL : "pool kernel or stride";
    case GGML_OP_WIN_PART:
        return all_positive(t, 2, 1) ? NULL : "WIN_PART window";
    case GGML_OP_WIN_UNPART:
        return all_positive(t, 0, 1) ? NULL : "WIN_UNPART window";
    case GGML_OP_ROLL:
        for (int i = 0; i < 4; i++)
            if (t->op_params[i] == INT32_MIN)
                return "ROLL shift";
        return NULL;
    case GGML_OP_ARANGE: {
        /* ggml_arange converts ceil((stop - start) / step) to an integer. */
        float start, stop, step;
        memcpy(&start, &t->op_params[0], 4);
        memcpy(&stop, &t->op_params[1], 4);
        memcpy(&step, &t->op_params[2], 4);
        const float n = ceilf((stop - start) / step);
        return isfinite(start) && isfinite(stop) && step > 0 && n >= 0 && n <= (float)(1ull << 40) ? NULL : "ARANGE range";
    }
    case GGML_OP_UNARY:
        return t->op_params[0] >= 0 && t->op_params[0] < GGML_UNARY_OP_COUNT ? NULL : "unary op out of range";
    case GGML_OP_GLU:
        return t->op_params[0] >= 0 && t->op_params[0] < GGML_GLU_OP_COUNT ? NULL : "GLU op out of range";
    case GGML_OP_IM2COL_BACK:  /* its kernel divides by the strides */
        return all_positive(t, 0, 1) && (t->op_params[6] == 0 || all_positive(t, 1, 1)) ? NULL : "IM2COL_BACK stride";
    case GGML_OP_GROUP_NORM:  /* its kernel divides by the group count */
        return all_positive(t, 0, 1) ? NULL : "GROUP_NORM group count";
    default:
        return NULL;
    }
}

/* ---- what kernels rely on that no constructor checks -------------------- */

/* ACC and SET write src1 into a view of dst made of params nb1..3 and
 * offset (int32, meant as sizes); the kernels assert only where the last
 * element starts: all of it must lie inside dst. */
static bool acc_view_fits(const struct ggml_tensor *t)
{
    const struct ggml_tensor *b = t->src[1];
    for (int i = 0; i < 4; i++)
        if (t->op_params[i] < 0)
            return false;
    uint64_t end = (uint64_t)t->op_params[3] + ggml_type_size(t->type);
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        const uint64_t stride = i == 0 ? ggml_type_size(t->type) : (uint64_t)t->op_params[i - 1];
        uint64_t term;
        if (b->ne[i] > 0 && (__builtin_mul_overflow((uint64_t)(b->ne[i] - 1), stride, &term) ||
                             __builtin_add_overflow(end, term, &end)))
            return false;
    }
    return end <= ggml_nbytes(t);
}

/* The channels-last (CWHN) order in which CONV_2D_DW makes its result from
 * a channels-last input: the kernel then also assumes the filter's order. */
static bool conv_2d_dw_layout_ok(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    if ((a->type != GGML_TYPE_F32 && a->type != GGML_TYPE_F16) || b->type != GGML_TYPE_F32)
        return false;
    return ggml_is_contiguous(b) || (ggml_is_contiguous_channels(b) && a->nb[0] >= a->nb[2] && a->nb[1] >= a->nb[0]);
}

/* ---- operand extents kernels derive from other tensors' shapes ---------- */

static bool mul3(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out) && !__builtin_mul_overflow(*out, c, out);
}

/* ggml_rope_cache_init and ggml_mrope_cache_init read freq_factors[i0/2]
 * for every even i0 < ne0, ceil(ne0/2) floats from src2's data, while the
 * constructor asks for n_dims/2 of them only - and test-backend-ops and
 * llama.cpp (partial rotary) pass n_dims/2 with n_dims < ne0, the tail
 * being read from whatever follows in the buffer.  So what the kernel
 * reads must lie inside the factors' extent or at least inside their own
 * buffer.  A supports_op subject without a buffer reads nothing. */
static bool rope_freq_factors_readable(const struct ggml_tensor *t)
{
    const struct ggml_tensor *c = t->src[2];
    const uint64_t need = sizeof(float) * (((uint64_t)t->ne[0] + 1) / 2);
    if (t->ne[0] <= 0 || (uint64_t)ggml_nbytes(c) >= need)
        return true;
    if (!c->buffer)
        return !c->data;
    const uintptr_t base = (uintptr_t)ggml_backend_buffer_get_base(c->buffer);
    const uint64_t size = ggml_backend_buffer_get_size(c->buffer);
    const uintptr_t data = (uintptr_t)c->data;
    return data >= base && data - base <= size && need <= size - (data - base);
}

/* ggml_compute_forward_count_equal_i32 splits row number ir into
 * i03 = ir/(ne02*ne01), i02 = (ir - i03*ne03)/ne01,
 * i01 = ir - i03*ne03 - i02*ne02: those are the row's indices for every ir
 * exactly when ne03 is 1 or ne02*ne01, and ne02 is 1 or ne01; otherwise
 * it reads rows past both operands (same shape by construction). */
static bool count_equal_rows_ok(const struct ggml_tensor *a)
{
    const int64_t n1 = a->ne[1], n2 = a->ne[2], n3 = a->ne[3];
    int64_t n12;
    if (__builtin_mul_overflow(n1, n2, &n12))
        return false;
    return (n3 == 1 || n3 == n12) && (n2 == 1 || n2 == n1);
}

/* ggml_compute_forward_im2col_back_f32 takes N, IC (and IH, IW) from the
 * result, KW, KH from src1's ne0/ne1 (src1 is not read), OW, OH from src0's
 * ne1/ne2, and reads src0 as dense f32 [N][OH][OW][IC*KH*KW]: src0 must be
 * the im2col result of that shape.  It keeps the result's batch and channel
 * strides in ints. */
static bool im2col_back_fits(const struct ggml_tensor *t)
{
    const struct ggml_tensor *g = t->src[0], *k = t->src[1];
    const bool is_2D = t->op_params[6] == 1;
    const int64_t N = t->ne[is_2D ? 3 : 2], IC = t->ne[is_2D ? 2 : 1];
    int64_t ickk;
    if (!mul3(IC, is_2D ? k->ne[1] : 1, k->ne[0], &ickk))
        return false;
    if (g->type != GGML_TYPE_F32 || g->ne[0] != ickk || g->ne[is_2D ? 3 : 2] != N)
        return false;
    return (N <= 1 || t->nb[is_2D ? 3 : 2] <= INT_MAX) && (IC <= 1 || t->nb[is_2D ? 2 : 1] <= INT_MAX);
}

/* ggml_compute_forward_pool_2d_back walks the result plane by plane
 * (ne2*ne3 planes), and per plane reads the next dense ne0*ne1 floats of
 * src0 and the forward input src1 at the result's own strides, in the
 * result's type: src0 must be f32 with the result's planes, src1 of the
 * result's type (it has the result's shape by construction). */
static bool pool_2d_back_fits(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *af = t->src[1];
    return a->type == GGML_TYPE_F32 && af->type == t->type && a->ne[2] == t->ne[2] && a->ne[3] == t->ne[3];
}

/* ggml_compute_forward_win_unpart_f32 reads, for result element
 * (i0, i1, i2), src0 element i0 + (i1%w)*ne00 + (i2%w)*ne01*ne00 of window
 * (i2/w)*npx + i1/w, npx = ceil(ne1/w): src0 must be what WIN_PART made,
 * [ne0, w, w, npx*npy] (npy = ceil(ne2/w)); the window number is an int. */
static bool win_unpart_fits(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0];
    const int64_t w = t->op_params[0];  /* > 0: constructor_inputs_error */
    const int64_t npx = t->ne[1] / w + (t->ne[1] % w != 0), npy = t->ne[2] / w + (t->ne[2] % w != 0);
    int64_t np;
    if (__builtin_mul_overflow(npx, npy, &np) || np > INT_MAX)
        return false;
    return a->ne[1] == w && a->ne[2] == w && a->ne[3] == np;
}

/* Rows where a kernel that walks ggml_nrows rows by nb[1] alone finds
 * them: nb0 the element size, dims 2 and 3 packed after dim 1. */
static bool rows_by_nb1(const struct ggml_tensor *t)
{
    if (t->ne[0] > 1 && t->nb[0] != ggml_type_size(t->type))
        return false;
    uint64_t next;
    if (__builtin_mul_overflow((uint64_t)t->nb[1], (uint64_t)t->ne[1], &next))
        return false;
    for (int i = 2; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] > 1 && t->nb[i] != next)
            return false;
        if (__builtin_mul_overflow(next, (uint64_t)t->ne[i], &next))
            return false;
    }
    return true;
}

/* ggml_compute_forward_silu_back_f32/_f16 (switched on src0's type) take
 * the row length and count from src1 and walk rows of src0, src1 and the
 * result by nb[1] alone, all in src0's type: src1 must have src0's shape
 * and type, and both their rows where nb[1] puts them (the result is
 * src0's shape, contiguous, by construction). */
static bool silu_back_fits(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];
    return b->type == a->type && ggml_are_same_shape(a, b) && rows_by_nb1(a) && rows_by_nb1(b);
}

/* FLASH_ATTN_EXT (ggml_compute_forward_flash_attn_ext_f16_one_chunk and
 * _tiled): for query row (iq1, iq2, iq3) and every K row ic < nek1 it reads
 * K row (ic, iq2/(neq2/nek2), iq3) - the constructor's ggml_can_mul_mat
 * makes nek2 divide neq2 -, V row (ic, iq2/(neq2/nev2), iq3) and mask
 * element ic of row iq1 (planes taken modulo the mask's).  Nothing ties V
 * to K or Q but ne3: V's heads must divide Q's (else the ratio is 0, a
 * division by zero, or V's head index passes nev2), V must have a row for
 * every K row, the mask an element per K row and a row per query.  The
 * kernel numbers query rows with ints. */
static const char *flash_attn_ext_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *m = t->src[3];
    if (v->ne[2] <= 0 || q->ne[2] % v->ne[2] != 0)
        return "FLASH_ATTN_EXT V heads do not divide Q heads";
    if (v->ne[1] < k->ne[1])
        return "FLASH_ATTN_EXT V has fewer rows than K";
    if (m && (m->ne[0] < k->ne[1] || m->ne[1] < q->ne[1]))
        return "FLASH_ATTN_EXT mask smaller than Q rows x K rows";
    int64_t rows;
    if (!mul3(q->ne[1], q->ne[2], q->ne[3], &rows) || rows > INT_MAX)
        return "FLASH_ATTN_EXT too many query rows";
    /* every path asserts Q, K and V dense in their rows (the constructor
     * does not look at source strides) */
    if (q->nb[0] != ggml_type_size(q->type) || k->nb[0] != ggml_type_size(k->type) ||
        v->nb[0] != ggml_type_size(v->type))
        return "FLASH_ATTN_EXT Q, K or V rows not dense";
    /* ggml_compute_forward_flash_attn_ext aborts on a precision other than
     * these two (ggml_flash_attn_ext_set_prec stores any value) */
    const int32_t prec = t->op_params[3];
    if (prec != GGML_PREC_DEFAULT && prec != GGML_PREC_F32)
        return "FLASH_ATTN_EXT precision";
    return NULL;
}

static const char *kernel_params_error(const struct ggml_tensor *t)
{
    const struct ggml_tensor *a = t->src[0], *b = t->src[1];

    /* Source types each kernel has a case for: op_operands.c (src0_rule_of). */

    switch (t->op) {
    case GGML_OP_MUL_MAT: case GGML_OP_MUL_MAT_ID:
        /* The kernels step through rows of both operands with unit
         * element stride. */
        return a->nb[0] == ggml_type_size(a->type) && b->nb[0] == ggml_type_size(b->type) ? NULL
                                                                                        : "MUL_MAT operand layout";
    case GGML_OP_ACC: case GGML_OP_SET:
        return acc_view_fits(t) ? NULL : "ACC/SET view outside its destination";
    case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: {
        const int n_dims = t->op_params[1], n_offs = t->op_params[15];
        /* The modes the kernel has a case for; any other aborts it. */
        switch (t->op_params[2]) {
        case GGML_ROPE_TYPE_NORMAL: case GGML_ROPE_TYPE_NEOX: case GGML_ROPE_TYPE_MROPE:
        case GGML_ROPE_TYPE_VISION: case GGML_ROPE_TYPE_IMROPE:
            break;
        default:
            return "ROPE mode unknown";
        }
        /* The pass-through loop skips the rotated channels with
         * i0 += n_dims - 2 at i0 == n_offs: with n_dims = 0 it never ends. */
        if (n_dims <= 0 || n_dims > a->ne[0] || (n_dims & 1))
            return "ROPE dimensions out of range";
        if (n_offs < 0 || (n_offs & 1) || (int64_t)n_offs + n_dims > a->ne[0])
            return "ROPE offset out of range";
        /* Outside vision mode that loop copies channel pairs i0, i0 + 1
         * for even i0 < ne0: with an odd ne0 one past each row. */
        if (t->op_params[2] != GGML_ROPE_TYPE_VISION && (t->ne[0] & 1))
            return "ROPE odd row length";
        /* Vision mode rotates pairs (i, i + n_dims) for i < ne0 / 2 and
         * asserts this: a larger n_dims would reach past the row. */
        if (t->op_params[2] == GGML_ROPE_TYPE_VISION && (n_dims != t->ne[0] / 2 || n_offs != 0))
            return "ROPE vision dimensions not half the row";
        if (t->src[2] && !rope_freq_factors_readable(t))
            return "ROPE frequency factors shorter than the rows";
        if (t->op_params[2] & GGML_ROPE_TYPE_MROPE) {
            /* The M-RoPE kernel takes dimensions modulo the sections' sum
             * and asserts it is positive and within the row. */
            int64_t sum = 0;
            for (int i = 11; i < 11 + GGML_MROPE_SECTIONS; i++) {
                if (t->op_params[i] < 0)
                    return "ROPE sections out of range";
                sum += t->op_params[i];
            }
            if (sum - t->op_params[14] <= 0 || sum > a->ne[0])
                return "ROPE sections out of range";
        }
        return NULL;
    }
    case GGML_OP_CONV_2D_DW:
        return conv_2d_dw_layout_ok(t) ? NULL : "CONV_2D_DW types or input layout";
    case GGML_OP_COUNT_EQUAL:
        return count_equal_rows_ok(a) ? NULL : "COUNT_EQUAL rows the kernel splits wrongly";
    case GGML_OP_IM2COL_BACK:
        return im2col_back_fits(t) ? NULL : "IM2COL_BACK gradient not of the result's im2col shape";
    case GGML_OP_POOL_2D_BACK:
        return pool_2d_back_fits(t) ? NULL : "POOL_2D_BACK operands not of the result's planes and type";
    case GGML_OP_WIN_UNPART:
        return win_unpart_fits(t) ? NULL : "WIN_UNPART source not the result's windows";
    case GGML_OP_SILU_BACK:
        return silu_back_fits(t) ? NULL : "SILU_BACK operands of different shapes, types or row layout";
    case GGML_OP_FLASH_ATTN_EXT:
        return flash_attn_ext_error(t);
    case GGML_OP_ARGSORT:
        return t->op_params[0] == GGML_SORT_ORDER_ASC || t->op_params[0] == GGML_SORT_ORDER_DESC ? NULL : "ARGSORT order";
    case GGML_OP_NORM: case GGML_OP_RMS_NORM: case GGML_OP_L2_NORM: {
        /* the kernels assert eps >= 0 (so not NaN); the constructors store any float */
        float eps;
        memcpy(&eps, &t->op_params[0], sizeof(eps));
        return eps >= 0.0f ? NULL : "norm epsilon negative or NaN";
    }
    case GGML_OP_DIAG_MASK_INF: case GGML_OP_DIAG_MASK_ZERO:
        return t->op_params[0] >= 0 ? NULL : "DIAG_MASK n_past negative";
    case GGML_OP_RMS_NORM_BACK:
        /* ggml_rms_norm_back ties nothing; the kernel asserts all three alike */
        return ggml_are_same_shape(a, t) && ggml_are_same_shape(a, b) ? NULL : "RMS_NORM_BACK operands of other shapes";
    case GGML_OP_SOFT_MAX_BACK:
        return ggml_are_same_shape(a, t) && ggml_are_same_shape(b, t) ? NULL : "SOFT_MAX_BACK operands of other shapes";
    case GGML_OP_TRI:
        return t->op_params[0] >= GGML_TRI_TYPE_UPPER_DIAG && t->op_params[0] <= GGML_TRI_TYPE_LOWER ? NULL : "TRI type";
    default:
        return NULL;
    }
}

/*
 * A tensor that owns its memory lies in its buffer as its buffer type sizes
 * it (get_alloc_size), not only as ggml_nbytes: ggml-cuda reads a quantized
 * row's padding and writes a FLASH_ATTN_EXT result's f16 copies of K and V
 * after the result.  The guest sizes tensors by asking (alloc size
 * questions), so a graph of its own allocation always fits.
 */
static const char *allocation_error(const struct ggml_tensor *t)
{
    if (!t->buffer || t->view_src)
        return NULL;
    /* ggml-cuda asserts this of the quantized tensors it pads */
    if (ggml_is_quantized(t->type) && t->nb[0] != ggml_type_size(t->type))
        return "quantized tensor with a strided first dimension";
    size_t alloc = ggml_backend_buft_get_alloc_size(ggml_backend_buffer_get_type(t->buffer), t);
    if (alloc == 0)
        return NULL;
    const uint8_t *base = ggml_backend_buffer_get_base(t->buffer), *data = t->data;
    size_t size = ggml_backend_buffer_get_size(t->buffer);
    if (data < base || (size_t)(data - base) > size || alloc > size - (size_t)(data - base))
        return "tensor allocation (as its buffer type sizes it) outside its buffer";
    return NULL;
}

const char *apir_op_shape_error(const struct ggml_tensor *t, bool query)
{
    if (!extent_covers_dense(t))
        return "tensor extent smaller than its elements";
    if (t->op == GGML_OP_NONE || apir_op_is_view(t->op))
        return query ? NULL : allocation_error(t);
    const int need = required_srcs(t->op);
    for (int i = 0; i < need; i++)
        if (!t->src[i])
            return "op without a source it requires";
    for (int i = 0; i < GGML_MAX_SRC; i++)
        if (t->src[i] && !extent_covers_dense(t->src[i]))
            return "source extent smaller than its elements";
    const char *why = constructor_inputs_error(t);
    if (!why)
        why = kernel_params_error(t);
    if (!why)
        why = apir_op_derive_error(t, query);
    if (!why)
        why = apir_op_operands_error(t, query);  /* op_operands.h: types, overlap, recurrent extents */
    if (!why && !query)
        why = allocation_error(t);
    return why;
}
