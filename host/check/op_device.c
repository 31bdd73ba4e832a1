#include "op_device.h"

#include "ggml.h"
#include "ggml-impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum apir_kernel_family apir_kernel_family_of(ggml_backend_dev_t dev)
{
    /* Tests only: a CPU host that applies the CUDA rules, so that the CUDA
     * findings replay where there is no GPU (tests/run_fuzz_dev.sh). */
    const char *forced = getenv("APIR_TEST_KERNEL_RULES");
    if (forced && !strcmp(forced, "cuda"))
        return APIR_KERNELS_CUDA;
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : NULL;
    const char *name = reg ? ggml_backend_reg_name(reg) : NULL;
    if (name && (!strcmp(name, "CUDA") || !strcmp(name, "ROCm") || !strcmp(name, "MUSA")))
        return APIR_KERNELS_CUDA;
    return APIR_KERNELS_OTHER;
}

static bool contiguous(const struct ggml_tensor *t)
{
    return t && ggml_is_contiguous(t);
}

static bool f32_or_f16(enum ggml_type t)
{
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16;
}

/* Every stride a whole number of elements (binbcast.cu asserts it of each
 * operand: it indexes typed pointers). */
static bool whole_elements(const struct ggml_tensor *t)
{
    const size_t size = ggml_type_size(t->type);
    for (int k = 0; k < GGML_MAX_DIMS; k++)
        if (size == 0 || t->nb[k] % size != 0)
            return false;
    return true;
}

/* t's address, and the strides of its dimensions from `first` on that
 * have more than one element, multiples of unit bytes (0: never). */
static bool placed_in_units(const struct ggml_tensor *t, size_t unit, int first)
{
    if (unit == 0 || (uintptr_t)t->data % unit != 0)
        return false;
    for (int k = first; k < GGML_MAX_DIMS; k++)
        if (t->ne[k] > 1 && t->nb[k] % unit != 0)
            return false;
    return true;
}

/* A kernel that moves pairs of elements (float2, half2) from element 0 of
 * each row: the address and the row-and-up strides in pairs. */
static bool pairs_aligned(const struct ggml_tensor *t)
{
    return placed_in_units(t, 2 * ggml_type_size(t->type), 1);
}

/* An op parameter read as a float. */
static float param_f32(const struct ggml_tensor *t, int i)
{
    float v;
    memcpy(&v, (const char *)t->op_params + (size_t)i * sizeof(float), sizeof(v));
    return v;
}

/*
 * bin_bcast (binbcast.cu ggml_cuda_op_bin_bcast): the type triples it has
 * kernels for (any other aborts: ADD1 takes any type through it), and
 * strides in whole elements.  REPEAT comes through with (dst, src, dst).
 */
static const char *bin_bcast_error(const struct ggml_tensor *a, const struct ggml_tensor *b,
                                   const struct ggml_tensor *dst)
{
    if (!a || !b)
        return NULL;
    const enum ggml_type ta = a->type, tb = b->type, td = dst->type;
    /* ggml_cuda_op_bin_bcast reads src1 as float in each case but
     * F16, F16, F16 - whatever its type (an F16 src1 is read as floats: past
     * its bytes where its strides pass the kernel's asserts) */
    const bool typed = (ta == GGML_TYPE_F32 && tb == GGML_TYPE_F32 && td == GGML_TYPE_F32) ||
                       (ta == GGML_TYPE_F16 && f32_or_f16(tb) && td == GGML_TYPE_F16) ||
                       (ta == GGML_TYPE_F16 && tb == GGML_TYPE_F32 && td == GGML_TYPE_F32);
    if (!typed)
        return "CUDA's broadcast kernels have no function for these types";
    if (!whole_elements(a) || !whole_elements(b) || !whole_elements(dst))
        return "CUDA's broadcast kernels take strides of whole elements";
    return NULL;
}

static bool copy_pair_has_kernel(enum ggml_type from, enum ggml_type to)
{
    const bool float_from = from == GGML_TYPE_F32 || from == GGML_TYPE_F16 || from == GGML_TYPE_BF16;
    const bool float_to = to == GGML_TYPE_F32 || to == GGML_TYPE_F16 || to == GGML_TYPE_BF16;
    if (float_from && float_to)
        return true;
    switch (to) {
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_I32:
        if (from == GGML_TYPE_F32)
            return true;
        break;
    default:
        break;
    }
    switch (from) {
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
        return to == GGML_TYPE_F32;
    case GGML_TYPE_I32:
        return to == GGML_TYPE_F32 || to == GGML_TYPE_I32;
    default:
        return false;
    }
}

/*
 * ggml_cuda_cpy(a, b) (cpy.cu), which CPY, DUP, CONT and SET use: a pair of
 * contiguous tensors of one type is a memcpy; any other pair needs a kernel
 * for its types (else an abort).  And a same-type source that looks like
 * a transposed matrix (nb[1] one element, ne[3] 1, nb[2] a whole matrix)
 * takes the tiled transposing kernel, which reads the source and writes
 * the destination as dense arrays whatever their strides: only a source
 * that is a transposed dense matrix and a contiguous destination give the
 * bytes the strides say (a strided destination was written past its
 * extent: fuzz_op on an H100).
 */
static const char *cuda_copy_error(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    if (a->type == b->type && contiguous(a) && contiguous(b))
        return NULL;
    if (!copy_pair_has_kernel(a->type, b->type))
        return "CUDA's copy has no kernel for these types unless both are contiguous";
    const size_t es = ggml_type_size(a->type);
    const bool transposing = a->type == b->type && ggml_blck_size(a->type) == 1 && a->nb[1] == es && a->ne[3] == 1 &&
                             a->nb[2] == (size_t)(a->ne[0] * a->ne[1]) * es;
    if (transposing && (!contiguous(b) || a->nb[0] != (size_t)a->ne[1] * es))
        return "CUDA's transposing copy writes a dense destination from a dense transposed source";
    return NULL;
}

/*
 * cuBLAS refuses a leading dimension below the rows it spans (lda >= max(1,
 * k) and the like) before it touches memory, and ggml-cuda's CUBLAS_CHECK
 * turns the refusal into an abort of the worker.  ggml-cuda hands cuBLAS
 * nb[1] / element size as the leading dimension, and nothing bounds the
 * nb[1] of a size-1 dimension 1 of a tensor that is not contiguous (import.c
 * canonicalises the contiguous ones only): a MUL_MAT of 1x1 matrices whose
 * src1 rows were one byte apart gave ldb 0 (fuzz_op on an H100,
 * fuzz/findings/cuda/fuzz_op-cuda-09.bin).  ggml's own views of a size-1
 * dimension carry a real row stride, at least a row.
 */
static bool leading_dim_ok(size_t nb, int64_t rows, size_t unit)
{
    return nb / unit >= (size_t)(rows > 1 ? rows : 1);
}

/* MUL_MAT's cuBLAS path (ggml_cuda_mul_mat_cublas_impl, and the other
 * paths that fall back to it): src0 transposed with lda nb01 / type size in
 * blocks (lda >= ne00), src1 with ldb nb11 / type size (ldb >= ne10).  Asked
 * whichever path the shapes would take: which one is ggml-cuda's choice. */
static const char *cuda_mul_mat_error(const struct ggml_tensor *s0, const struct ggml_tensor *s1,
                                      const struct ggml_tensor *n)
{
    /*
     * mmvf.cu (ggml_cuda_should_use_mmvf: a float src0 of even rows, its
     * strides in pairs) loads src0 and src1 in pairs of elements (float2,
     * half2) and asserts src1's strides in pairs; it checks src0's strides,
     * not the pointers (chain-cuda-00: a src1 at byte 12, a misaligned
     * float2, a CUDA error).  MUL_MAT_ID takes it fused with its bias.
     * Asked of every float product of even rows, whichever path ggml-cuda
     * then takes (ggml's own operands are in pairs).
     */
    const struct ggml_tensor *y = s1 ? s1 : n->src[1];
    if (s0 && y && !ggml_is_quantized(s0->type) && s0->ne[0] % 2 == 0 && s0->nb[0] == ggml_type_size(s0->type)) {
        const size_t x2 = 2 * ggml_type_size(s0->type), y2 = 2 * ggml_type_size(y->type);
        bool pairs = (uintptr_t)s0->data % x2 == 0 && (uintptr_t)y->data % y2 == 0;
        for (int k = 1; k < GGML_MAX_DIMS; k++)
            pairs = pairs && y->nb[k] % y2 == 0;
        if (!pairs)
            return "CUDA's MUL_MAT takes float operands aligned to pairs of elements";
    }
    if (s0 && ggml_blck_size(s0->type) > 0 &&
        !leading_dim_ok(s0->nb[1], s0->ne[0] / ggml_blck_size(s0->type), ggml_type_size(s0->type)))
        return "CUDA's MUL_MAT hands cuBLAS src0 rows at least a row apart";
    if (s1 && !leading_dim_ok(s1->nb[1], s1->ne[0] / ggml_blck_size(s1->type), ggml_type_size(s1->type)))
        return "CUDA's MUL_MAT hands cuBLAS src1 rows at least a row apart";
    return NULL;
}

/* SET: set.cu asserts contiguous operands, then copies src0 into the result
 * (unless in place) and src1 into the view the parameters give. */
static const char *cuda_set_error(const struct ggml_tensor *n)
{
    const struct ggml_tensor *s0 = n->src[0], *s1 = n->src[1];
    if (!s0 || !s1)
        return NULL;
    if (!contiguous(n) || !contiguous(s0) || !contiguous(s1))
        return "CUDA's SET takes contiguous operands";
    const int32_t *p = (const int32_t *)n->op_params;
    const char *why = p[4] ? NULL : cuda_copy_error(s0, n);
    if (why)
        return why;
    struct ggml_tensor view = *n;
    for (int k = 0; k < GGML_MAX_DIMS; k++)
        view.ne[k] = s1->ne[k];
    view.nb[0] = ggml_element_size(n);
    view.nb[1] = (size_t)(uint32_t)p[0];
    view.nb[2] = (size_t)(uint32_t)p[1];
    view.nb[3] = (size_t)(uint32_t)p[2];
    return cuda_copy_error(s1, &view);
}

/*
 * Flash attention (fattn*.cu) loads Q, K, V and the mask 16 bytes at a time
 * from each row's start, and converts a quantized K or V to F16 from its
 * address on.  ggml-cuda's own test of the strides (nb % 16) only picks a
 * kernel; the one it falls back to loads the same way.  On an H100
 * (bench/h200.sh faprobe: tests/probe_layouts.c against the CPU's
 * result), an operand at 2, 4 or 8 bytes off 16 was a "misaligned address"
 * (K and V in every kernel, Q and the mask in one of them; a Q8_0 K or V at
 * a whole block, 34 bytes, too), and F16/F32 rows 2, 4 or 8 bytes off a
 * multiple of 16 apart a misaligned address or, for 16 tokens, wrong
 * results; 16-byte moves of either computed right.  ggml's attention
 * graphs (llama.cpp's and whisper.cpp's caches, heads of 40 to 576
 * elements) are 16-byte placed: every operand's address, and a float
 * operand's strides of its dimensions of more than one element.  The
 * mask's rows are left as they are (their length is the cache's, which
 * ggml does not pad to 16 bytes).
 */
static const char *cuda_flash_attn_error(const struct ggml_tensor *n)
{
    /*
     * A logit softcap is compiled into the attention kernels only for heads
     * of 128, 256 and 512 elements (fattn-mma-f16.cuh and fattn-tile.cuh;
     * the vector kernel, which ggml-cuda picks for heads of up to 256, for
     * 128 and 256): any other head size with a softcap launches a kernel
     * built without code, which traps - a CUDA error that ends the worker's
     * context (an H100, `bench/h200.sh fuzzdev`: heads of 40 with a softcap
     * of 30).  ggml-cuda's supports_op does not ask.  Models that cap their
     * logits (Gemma 2, Grok) have heads of 128 or 256.
     */
    const struct ggml_tensor *k = n->src[1], *v = n->src[2];
    if (param_f32(n, 2) != 0.0f && k && v &&
        !(k->ne[0] == v->ne[0] && (k->ne[0] == 128 || k->ne[0] == 256 || k->ne[0] == 512)))
        return "CUDA's flash attention caps logits only for heads of 128, 256 or 512";
    for (int i = 0; i < 4; i++) {
        const struct ggml_tensor *t = n->src[i];
        if (!t)
            continue;
        const int first = i == 3 || ggml_is_quantized(t->type) ? GGML_MAX_DIMS : 1;
        if (!placed_in_units(t, 16, first))
            return "CUDA's flash attention takes Q, K, V and the mask at 16-byte addresses "
                   "and float rows 16 bytes apart";
    }
    return NULL;
}

/* C / H of a linear-attention kernel (gla.cu, wkv.cu): a head size it has
 * a kernel for. */
static bool head_size_ok(const struct ggml_tensor *n, const struct ggml_tensor *s0, int64_t small, int64_t large)
{
    const int64_t c = n->ne[0], h = s0 ? s0->ne[1] : 0;
    return h > 0 && c % h == 0 && (c / h == small || c / h == large);
}

static bool is_f32(const struct ggml_tensor *t)
{
    return t && t->type == GGML_TYPE_F32;
}

/*
 * One rule per op.  Each is a fuzz finding (its input in fuzz/findings/cuda)
 * or what a kernel's entry point asserts unconditionally and ggml-cuda's
 * supports_op does not ask for, read off the pinned tree's ggml-cuda
 * sources (an entry assert holds for every node of the op).  NULL when
 * the node is one the kernel takes.
 */
static const char *cuda_error(const struct ggml_tensor *n)
{
    const struct ggml_tensor *s0 = n->src[0], *s1 = n->src[1], *s2 = n->src[2];
    switch (n->op) {
    case GGML_OP_SCALE: case GGML_OP_PAD: case GGML_OP_PAD_REFLECT_1D: case GGML_OP_POOL_1D: case GGML_OP_POOL_2D:
    case GGML_OP_UPSCALE: case GGML_OP_TIMESTEP_EMBEDDING: case GGML_OP_DIAG_MASK_INF: case GGML_OP_SSM_CONV:
        /* scale.cu, pad.cu, pad_reflect_1d.cu, pool1d.cu, pool2d.cu, upscale.cu, tsembd.cu,
         * diagmask.cu, ssm-conv.cu: F32 in, F32 out */
        return is_f32(s0) && is_f32(n) ? NULL : "CUDA's kernel for this op takes F32 only";
    case GGML_OP_NORM: case GGML_OP_RMS_NORM: case GGML_OP_L2_NORM: case GGML_OP_GROUP_NORM:
        /* norm.cu: F32 in and out, eps >= 0 (a NaN fails it too; GROUP_NORM's is its second parameter);
         * NORM, RMS_NORM and L2_NORM assert a row's floats adjacent, also in a row of one
         * (cuda-25, -26: an nb[0] of 2^28) */
        if (!is_f32(s0) || !is_f32(n))
            return "CUDA's kernel for this op takes F32 only";
        if (n->op != GGML_OP_GROUP_NORM && s0->nb[0] != sizeof(float))
            return "CUDA's norms take a source whose rows' floats are adjacent";
        return param_f32(n, n->op == GGML_OP_GROUP_NORM ? 1 : 0) >= 0.0f ? NULL : "CUDA's norms take eps >= 0";
    case GGML_OP_RMS_NORM_BACK:
        return param_f32(n, 0) >= 0.0f ? NULL : "CUDA's norms take eps >= 0";
    case GGML_OP_SUM_ROWS: case GGML_OP_MEAN:
        return is_f32(s0) && is_f32(n) && contiguous(s0) ? NULL
                                                          : "CUDA's SUM_ROWS and MEAN take a contiguous F32 source";
    case GGML_OP_SOFT_MAX:
        if (!is_f32(s0) || !is_f32(n) || (s1 && !f32_or_f16(s1->type)))
            return "CUDA's SOFT_MAX takes F32 and an F32 or F16 mask";
        return NULL;
    case GGML_OP_SOFT_MAX_BACK:
        return is_f32(s0) && is_f32(s1) && is_f32(n) ? NULL : "CUDA's SOFT_MAX_BACK takes F32 only";
    case GGML_OP_ACC:
        /* acc.cu */
        if (!is_f32(s0) || !is_f32(s1) || !is_f32(n) || !contiguous(s1) || n->nb[0] != sizeof(float) ||
            !ggml_is_contiguously_allocated(n))
            return "CUDA's ACC takes F32, a contiguous src1 and a contiguously allocated result";
        return NULL;
    case GGML_OP_CLAMP:
        return s0 && f32_or_f16(s0->type) && f32_or_f16(n->type) ? NULL : "CUDA's CLAMP takes F32 or F16";
    case GGML_OP_UNARY:
        /* unary.cu: every unary op's entry asserts the types (supports_op asks contiguity only) */
        return s0 && f32_or_f16(s0->type) && f32_or_f16(n->type) ? NULL : "CUDA's unary ops take F32 or F16";
    case GGML_OP_GLU:
        /* unary.cu: a contiguous result, F32 or F16 (SWIGLU_OAI: F32), a second operand in rows */
        if (!contiguous(n) || !s0 || !f32_or_f16(s0->type) || !f32_or_f16(n->type) ||
            (s1 && !ggml_is_contiguous_1(s1)))
            return "CUDA's GLU ops take F32 or F16 into a contiguous result";
        if (ggml_get_glu_op(n) == GGML_GLU_OP_SWIGLU_OAI && (!is_f32(s0) || !is_f32(n)))
            return "CUDA's SWIGLU_OAI takes F32";
        return NULL;
    case GGML_OP_LEAKY_RELU:
        return contiguous(s0) && f32_or_f16(s0->type) && s0->type == n->type
                   ? NULL
                   : "CUDA's LEAKY_RELU takes a contiguous F32 or F16 source of the result's type";
    case GGML_OP_ROPE:
        /* rope.cu, unfused: the source's type is the result's */
        if (!s0 || !f32_or_f16(s0->type) || s0->type != n->type)
            return "CUDA's ROPE takes F32 or F16, as its result";
        /* rope_norm stores each rotated pair as one float2 / half2 at an
         * even element (a misaligned store is a CUDA error: fuzz_op's chain
         * mode found it through the fused store, op_fusion.c) */
        return pairs_aligned(n) ? NULL : "CUDA's ROPE writes pairs of elements at addresses aligned to a pair";
    case GGML_OP_ADD_ID:
        /* add-id.cu: types, and each operand's first dimension dense (chain-cuda-04: ids every 32 bytes) */
        if (!is_f32(s0) || !is_f32(s1) || !s2 || s2->type != GGML_TYPE_I32)
            return "CUDA's ADD_ID takes F32 and I32 ids";
        return s0->nb[0] == sizeof(float) && s1->nb[0] == sizeof(float) && s2->nb[0] == sizeof(int32_t)
                   ? NULL
                   : "CUDA's ADD_ID takes operands whose first dimension is dense";
    case GGML_OP_CROSS_ENTROPY_LOSS: case GGML_OP_CROSS_ENTROPY_LOSS_BACK:
        for (int k = 0; k < 3; k++)
            if (n->src[k] && (!is_f32(n->src[k]) || !contiguous(n->src[k])))
                return "CUDA's cross-entropy ops take contiguous F32 operands";
        return contiguous(n) ? NULL : "CUDA's cross-entropy ops take contiguous F32 operands";
    case GGML_OP_CONV_TRANSPOSE_1D:
        return contiguous(s0) && contiguous(s1) ? NULL : "CUDA's CONV_TRANSPOSE_1D takes contiguous operands";
    case GGML_OP_CONV_2D:
        return s0 && f32_or_f16(s0->type) ? NULL : "CUDA's CONV_2D takes an F32 or F16 kernel";
    case GGML_OP_IM2COL: case GGML_OP_IM2COL_3D:
        return is_f32(s1) && f32_or_f16(n->type) ? NULL : "CUDA's IM2COL takes an F32 input";
    case GGML_OP_OPT_STEP_ADAMW:
        for (int k = 0; k < 5; k++)
            if (!contiguous(n->src[k]))
                return "CUDA's OPT_STEP_ADAMW takes contiguous operands";
        return is_f32(n->src[4]) ? NULL : "CUDA's OPT_STEP_ADAMW takes F32 parameters";
    case GGML_OP_FILL:
        return contiguous(n) ? NULL : "CUDA's FILL takes a contiguous result";
    case GGML_OP_ARANGE:
        return is_f32(n) ? NULL : "CUDA's ARANGE makes F32";
    case GGML_OP_SQR: case GGML_OP_SQRT: case GGML_OP_SIN: case GGML_OP_COS: case GGML_OP_LOG:
        /* unary.cu ggml_cuda_op_unary; supports_op says yes to any */
        if (!contiguous(s0))
            return "CUDA's SQR, SQRT, SIN, COS and LOG take a contiguous source";
        if (!f32_or_f16(s0->type) || !f32_or_f16(n->type))
            return "CUDA's SQR, SQRT, SIN, COS and LOG take F32 or F16";
        return NULL;
    case GGML_OP_ARGMAX: case GGML_OP_ARGSORT: case GGML_OP_TOP_K:
        /* argmax.cu, argsort.cu, top-k.cu */
        if (!contiguous(s0) || s0->type != GGML_TYPE_F32 || n->type != GGML_TYPE_I32)
            return "CUDA's ARGMAX, ARGSORT and TOP_K take a contiguous F32 source";
        return NULL;
    case GGML_OP_COUNT_EQUAL: case GGML_OP_GET_ROWS_BACK:
        /* count-equal.cu, getrows.cu */
        return contiguous(s0) && contiguous(s1) && contiguous(n)
                   ? NULL
                   : "CUDA's COUNT_EQUAL and GET_ROWS_BACK take contiguous operands";
    case GGML_OP_SUM:
        return s0 && s0->type == GGML_TYPE_F32 && ggml_is_contiguously_allocated(s0)
                   ? NULL
                   : "CUDA's SUM takes a contiguously allocated F32 source";
    case GGML_OP_DIAG:
        return contiguous(s0) && contiguous(n) ? NULL : "CUDA's DIAG takes contiguous operands";
    case GGML_OP_GET_ROWS:
        /* getrows.cu: elements one after the other in each row */
        if (s0 && s1 &&
            (s0->nb[0] != ggml_type_size(s0->type) || s1->nb[0] != ggml_type_size(s1->type) ||
             n->nb[0] != ggml_type_size(n->type) || s1->type != GGML_TYPE_I32))
            return "CUDA's GET_ROWS takes rows of consecutive elements and I32 indices";
        return NULL;
    case GGML_OP_OUT_PROD:
        /* out-prod.cu asserts F32 operands (supports_op asks it too), and
         * hands cuBLAS src1 as a matrix of consecutive floats */
        if (!is_f32(s0) || !is_f32(s1) || !is_f32(n))
            return "CUDA's OUT_PROD takes F32 only";
        if ((ggml_is_transposed(s1) ? s1->nb[1] : s1->nb[0]) != sizeof(float))
            return "CUDA's OUT_PROD takes src1 with consecutive floats";
        /* its cublasSgemm: src0 as is (lda nb01 >= ne00 floats), src1
         * transposed or not (ldb its nb10 >= ne11, or nb11 >= ne10) */
        if (!leading_dim_ok(s0->nb[1], s0->ne[0], sizeof(float)) ||
            !(ggml_is_transposed(s1) ? leading_dim_ok(s1->nb[0], s1->ne[1], sizeof(float))
                                     : leading_dim_ok(s1->nb[1], s1->ne[0], sizeof(float))))
            return "CUDA's OUT_PROD hands cuBLAS matrices whose rows are at least a row apart";
        return NULL;
    case GGML_OP_MUL_MAT:
        if (!contiguous(n))
            return "CUDA's MUL_MAT writes a contiguous result";
        return cuda_mul_mat_error(s0, s1, n);
    case GGML_OP_CONV_TRANSPOSE_2D:
        /* conv2d-transpose.cu: kernel src0, input src1 */
        if (!s0 || !f32_or_f16(s0->type) || !is_f32(s1) || !is_f32(n))
            return "CUDA's CONV_TRANSPOSE_2D takes an F32 or F16 kernel and F32 input";
        return contiguous(s0) && contiguous(s1) && contiguous(n) ? NULL
                                                                 : "CUDA's CONV_TRANSPOSE_2D takes contiguous operands";
    case GGML_OP_OPT_STEP_SGD:
        return contiguous(s0) && contiguous(s1) && contiguous(s2) && is_f32(s0) && is_f32(s1) && is_f32(s2)
                   ? NULL
                   : "CUDA's OPT_STEP_SGD takes contiguous F32 operands";
    case GGML_OP_ADD: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV: case GGML_OP_ADD1:
        return bin_bcast_error(s0, s1, n);
    case GGML_OP_REPEAT:
        return bin_bcast_error(n, s0, n);
    case GGML_OP_GATED_LINEAR_ATTN:
        return head_size_ok(n, s0, 64, 128) ? NULL : "CUDA's GATED_LINEAR_ATTN takes heads of 64 or 128";
    case GGML_OP_RWKV_WKV6: case GGML_OP_RWKV_WKV7:
        return head_size_ok(n, s0, 64, 128) ? NULL : "CUDA's RWKV_WKV6/7 take heads of 64 or 128";
    case GGML_OP_GATED_DELTA_NET: {
        /* gated_delta_net.cu: q and k alike, v's rows dense, g per head or per key; a kernel
         * for heads (v's ne[0]) of 16, 32, 64 and 128 only (cuda-29: 1) */
        const struct ggml_tensor *g = n->src[3], *beta = n->src[4], *state = n->src[5];
        if (!s0 || !s1 || !s2 || !g || !beta || !state)
            return NULL;
        if (s2->ne[0] != 16 && s2->ne[0] != 32 && s2->ne[0] != 64 && s2->ne[0] != 128)
            return "CUDA's GATED_DELTA_NET takes heads of 16, 32, 64 or 128";
        if (s0->ne[1] != s1->ne[1] || !ggml_is_contiguous_rows(s0) || !ggml_is_contiguous_rows(s1) ||
            !ggml_is_contiguous_rows(s2) || !ggml_are_same_stride(s0, s1) ||
            (g->ne[0] != 1 && g->ne[0] != s2->ne[0]) || !contiguous(g) || !contiguous(beta) || !contiguous(state))
            return "CUDA's GATED_DELTA_NET takes q and k alike, dense rows and contiguous g, beta and state";
        return NULL;
    }
    case GGML_OP_CPY:
        return s0 && s1 ? cuda_copy_error(s0, s1) : NULL;
    case GGML_OP_DUP: case GGML_OP_CONT:
        return s0 ? cuda_copy_error(s0, n) : NULL;
    case GGML_OP_SET:
        return cuda_set_error(n);
    case GGML_OP_FLASH_ATTN_EXT:
        return cuda_flash_attn_error(n);
    case GGML_OP_MUL_MAT_ID:
        /* ggml_cuda_mul_mat_id asserts F32 src1 and result (cuda-27: a Q8_0 src1); mmvq and
         * mmvf assert dense ids rows (chain-cuda-01, -02) */
        if (!s1 || !s2 || !is_f32(s1) || !is_f32(n) || s2->nb[0] != sizeof(int32_t))
            return "CUDA's MUL_MAT_ID takes F32 src1 and result and dense ids rows";
        /* ggml_cuda_mul_mat_id's grouping path asserts these */
        if (s1->nb[1] == 0 || s1->nb[2] % s1->nb[1] != 0 || n->nb[1] == 0 || n->nb[2] % n->nb[1] != 0)
            return "CUDA's MUL_MAT_ID takes src1 and result matrices a whole number of rows apart";
        if (!contiguous(n))
            return "CUDA's MUL_MAT_ID writes a contiguous result";
        /*
         * mmvq.cu's one-token kernel (mul_mat_vec_q, ncols_dst 1) computes
         * rows in blocks of up to 8 and keeps a block's rows below the
         * result's nb[2] / 4, not below its row count: with several experts
         * a token, rows past an expert's last were written over the next
         * expert's, and past the result after the last (chain-cuda-03,
         * -05, -06: 2, 3 and 1 rows an expert, a float past the result).
         * Row counts a multiple of 8, as every model's are.
         */
        if (ggml_is_quantized(s0->type) && n->ne[2] == 1 && n->ne[1] > 1 && n->ne[0] % 8 != 0)
            return "CUDA's MUL_MAT_ID of a quantized matrix takes rows in multiples of 8";
        /* its fallback path computes each expert's rows with MUL_MAT on
         * src0's matrix and contiguous copies of src1's rows */
        return cuda_mul_mat_error(s0, NULL, n);
    default:
        return NULL;
    }
}

/*
 * ggml-cuda's kernels index typed pointers: an element at an address that
 * is not a multiple of its size is a misaligned access, a CUDA error that
 * ends the worker's context (cuda-28: a DUP whose source's planes were one
 * byte apart).  ggml's allocator places tensors at the buffer type's
 * alignment, so only views of other offsets and strides get here.  Every
 * operand of a node: its address and the strides of its dimensions of more
 * than one element in whole elements.  A quantized block's fields are read
 * at their own alignment (mmvq reads Q4_0's 18-byte blocks two bytes at a
 * time: a Q4_0 matrix viewed at an odd byte was a misaligned read,
 * chain-cuda-07, -08): its address and strides in units of the largest
 * power of two that divides the block's size - what ggml's views at whole
 * blocks (rows, experts, heads) from an aligned buffer always are (2 bytes
 * for Q4_0 and Q8_0, 16 for Q4_K, 1 for MXFP4's 17-byte blocks).
 */
static bool element_aligned(const struct ggml_tensor *t)
{
    if (!t)
        return true;
    const size_t size = ggml_type_size(t->type);
    return placed_in_units(t, ggml_is_quantized(t->type) ? size & (~size + 1) : size, 0);
}

const char *apir_op_device_error(enum apir_kernel_family family, const struct ggml_tensor *node)
{
    if (family != APIR_KERNELS_CUDA || ggml_op_is_empty(node->op))
        return NULL;
    bool aligned = element_aligned(node);
    for (int i = 0; i < GGML_MAX_SRC; i++)
        aligned = aligned && element_aligned(node->src[i]);
    if (!aligned)
        return "CUDA's kernels take elements at multiples of their size";
    return cuda_error(node);
}

bool apir_device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *node)
{
    return ggml_backend_dev_supports_op(dev, node) && !apir_op_device_error(apir_kernel_family_of(dev), node);
}
