#include "op_fusion.h"

#include "ggml-impl.h"

#include <stdint.h>

/* The node the padding repeats: op NONE, no sources - no matcher's chain
 * starts or goes on with it. */
static struct ggml_tensor fusion_end = { .op = GGML_OP_NONE };

static bool reads(const struct ggml_tensor *node, const struct ggml_tensor *t)
{
    for (int k = 0; k < GGML_MAX_SRC; k++)
        if (node->src[k] == t)
            return true;
    return false;
}

/* A count no chain matches: ggml_can_fuse wants 1 for an inner node,
 * ggml_can_fuse_subgraph its uses inside the chain (at most a few). */
static void no_fuse(struct ggml_cgraph *g, struct ggml_tensor *node)
{
    struct ggml_hash_set *set = &g->visited_hash_set;
    size_t pos = ggml_hash_insert(set, node);
    if (pos == GGML_HASHSET_ALREADY_EXISTS)
        pos = ggml_hash_find(set, node);
    if (pos == GGML_HASHSET_FULL)
        return;  /* cannot be: the set holds twice the graph's size */
    g->use_counts[pos] = INT32_MAX;
}

static int32_t use_count(const struct ggml_cgraph *g, const struct ggml_tensor *node)
{
    const size_t pos = ggml_hash_find(&g->visited_hash_set, node);
    if (pos == GGML_HASHSET_FULL || !ggml_bitset_get(g->visited_hash_set.used, pos))
        return 0;
    return g->use_counts[pos];
}

static bool is_op(const struct ggml_cgraph *g, int i, enum ggml_op op)
{
    return i < g->n_nodes && g->nodes[i]->op == op;
}

static bool dense_f32(const struct ggml_tensor *t)
{
    return t && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t);
}

/*
 * ROPE, VIEW, SET_ROWS (rope.cu with set_rows): the kernel writes rope row
 * (head h, token t) at set_rows->data + (h * ne0 + i0 + idx[t] * nb1/size)
 * elements, reading idx[t] as a dense int64 array for t < rope->ne[2], in a
 * 32-bit offset - and never looks at the VIEW's shape or offset, or at the
 * index tensor's strides.  Taken: the VIEW is the whole contiguous ROPE as
 * [heads * ne0, tokens] (so the policy's check of the indices, over the
 * VIEW's rows by the index tensor's strides, is of the entries the kernel
 * reads), a contiguous index tensor, rows of set_rows dense and at least
 * a row apart (a row stride of 0 makes the kernel write the ROPE's own
 * layout there), every row's offset inside 32 bits, and the cache's
 * address and row stride in pairs of elements: rope_norm stores a rotated
 * pair as one float2 / half2 (fuzz_op's chain mode on an H100: a cache
 * at byte 36, a misaligned store, a CUDA error).
 */
static bool rope_set_rows_ok(const struct ggml_tensor *rope, const struct ggml_tensor *view,
                             const struct ggml_tensor *sr)
{
    const struct ggml_tensor *idx = sr->src[1];
    const size_t ts = ggml_type_size(sr->type);
    return view->src[0] == rope && view->view_src == rope && view->view_offs == 0 && sr->src[0] == view && idx &&
           ggml_is_contiguous(rope) && rope->ne[3] == 1 && view->ne[0] == rope->ne[0] * rope->ne[1] &&
           view->ne[1] == rope->ne[2] && view->ne[2] == 1 && view->ne[3] == 1 && ggml_is_contiguous(idx) &&
           ts > 0 && sr->nb[0] == ts && sr->nb[1] >= (size_t)sr->ne[0] * ts &&
           (uintptr_t)sr->data % (2 * ts) == 0 && sr->nb[1] % (2 * ts) == 0 &&
           (uint64_t)(sr->nb[1] / ts) * (uint64_t)sr->ne[1] <= INT32_MAX;
}

/*
 * RMS_NORM or a unary op, then a MUL of it (norm.cu, unary.cu fused
 * kernels; RMS_NORM, MUL, ADD too): the kernel writes the last node's
 * result as a dense array and reads the MUL's other operand's rows from
 * nb[1] on with consecutive elements (unary.cu asserts nb[0]).  The dense
 * write stays in the MUL's checked bytes (op_shapes.c: an extent covers
 * its dense size), but lands elsewhere than the MUL's strides say unless
 * the result is contiguous.
 */
static bool norm_mul_ok(const struct ggml_cgraph *g, int i)
{
    const struct ggml_tensor *head = g->nodes[i], *mul = g->nodes[i + 1];
    if (!reads(mul, head) || !ggml_is_contiguous(mul))
        return false;
    const struct ggml_tensor *other = mul->src[0] == head ? mul->src[1] : mul->src[0];
    if (!other || other->nb[0] != ggml_type_size(other->type))
        return false;
    if (is_op(g, i + 2, GGML_OP_ADD) && (!reads(g->nodes[i + 2], mul) || !ggml_is_contiguous(g->nodes[i + 2])))
        return false;
    return true;
}

/*
 * A matrix product with its bias (mmvf.cu, mmvq.cu: MUL_MAT + ADD,
 * MUL_MAT_ID (+ scale MUL) + ADD_ID, and the GLU forms with two of them):
 * the kernel writes the bias node's result with that node's strides, and
 * bounds a block's rows by them, not by the row count; it reads the bias
 * with the same strides, asserts it F32, and ADD_ID's bias one row per
 * expert.  Taken: every ADD in the next four nodes with F32 contiguous
 * operands and result; an ADD_ID's rows from the node before it and a
 * bias row per expert of the head's weights.
 */
static bool bias_ok(const struct ggml_cgraph *g, int i)
{
    const struct ggml_tensor *head = g->nodes[i];
    for (int j = i + 1; j <= i + 4 && j < g->n_nodes; j++) {
        const struct ggml_tensor *n = g->nodes[j];
        if (n->op == GGML_OP_ADD) {
            if (!dense_f32(n) || !dense_f32(n->src[0]) || !dense_f32(n->src[1]))
                return false;
        } else if (n->op == GGML_OP_ADD_ID) {
            /* its rows from the node just before (the product or its
             * scale): ggml-cuda's matcher asserts that of a bias node */
            const bool from_chain = n->src[0] == g->nodes[j - 1];
            if (!from_chain || !dense_f32(n) || !dense_f32(n->src[0]) || !dense_f32(n->src[1]) ||
                head->op != GGML_OP_MUL_MAT_ID ||
                !head->src[0] || n->src[1]->ne[1] != head->src[0]->ne[2])
                return false;
        }
    }
    return true;
}

void apir_fusion_seal(struct ggml_cgraph *g, bool counts_given)
{
    for (int i = g->n_nodes; i < g->size; i++)
        g->nodes[i] = &fusion_end;
    for (int i = 0; i < g->n_nodes; i++) {
        struct ggml_tensor *node = g->nodes[i];
        if (!counts_given || use_count(g, node) == 0)
            no_fuse(g, node);
    }
    if (!counts_given)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        struct ggml_tensor *node = g->nodes[i];
        bool ok = true;
        switch (node->op) {
        case GGML_OP_ROPE:
            if (is_op(g, i + 1, GGML_OP_VIEW) && is_op(g, i + 2, GGML_OP_SET_ROWS))
                ok = rope_set_rows_ok(node, g->nodes[i + 1], g->nodes[i + 2]);
            break;
        case GGML_OP_RMS_NORM:
            if (is_op(g, i + 1, GGML_OP_MUL)) {
                ok = norm_mul_ok(g, i);
                if (ok && is_op(g, i + 2, GGML_OP_ROPE) && is_op(g, i + 3, GGML_OP_VIEW) &&
                    is_op(g, i + 4, GGML_OP_SET_ROWS))
                    ok = g->nodes[i + 2]->src[0] == g->nodes[i + 1] &&
                         rope_set_rows_ok(g->nodes[i + 2], g->nodes[i + 3], g->nodes[i + 4]);
            }
            break;
        case GGML_OP_MUL_MAT: case GGML_OP_MUL_MAT_ID:
            ok = bias_ok(g, i);
            break;
        default:
            break;
        }
        if (ok && node->op == GGML_OP_UNARY && is_op(g, i + 1, GGML_OP_MUL))
            ok = norm_mul_ok(g, i);
        /*
         * A router's top-k (topk-moe.cu): the gating op (SOFT_MAX, a unary
         * op, or an ARGSORT first for the delayed softmax) and an ARGSORT
         * within the next four nodes.  The kernel takes its row and expert
         * counts from nodes nothing compares (the logits' rows, the weights'
         * ne[1], the final RESHAPE), writes the ids and weights with them,
         * and reads a bias for every expert; and it writes only part of the
         * ARGSORT's result, which op_policy.c takes as written whole.  Not
         * fused, until a rule proves a chain's shapes agree.
         */
        if (ok && (node->op == GGML_OP_SOFT_MAX || node->op == GGML_OP_UNARY || node->op == GGML_OP_ARGSORT))
            for (int j = i; j <= i + 4 && j < g->n_nodes; j++)
                ok &= g->nodes[j]->op != GGML_OP_ARGSORT;
        if (!ok)
            no_fuse(g, node);
    }
}
