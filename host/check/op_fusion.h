/*
 * What a backend's fused kernels assume of a chain of nodes.
 *
 * Backends fuse a run of consecutive nodes into one kernel (ggml-cuda's
 * ggml_cuda_try_fuse: a norm and its MUL, ROPE with the SET_ROWS that
 * stores it, a router's top-k, a matrix-vector product with its bias...).
 * They decide it from the graph's use counts (ggml_can_fuse,
 * ggml_can_fuse_subgraph: an inner node's count must be its uses inside the
 * chain) and from a few checks of their own - and the fused kernel then
 * assumes more than each node does alone: ggml-cuda's ROPE+SET_ROWS reads
 * the row indices as a dense array of the ROPE's rows, whatever the index
 * tensor's strides or the VIEW's shape (a write where the guest says); the
 * top-k kernel takes its sizes from different nodes that nothing compares;
 * the norm+MUL and unary+MUL kernels write the MUL's result densely and a
 * fused matrix-vector product reads its bias with the result's strides
 * (inside the checked bytes: every tensor's extent covers its dense size,
 * op_shapes.c - kept to well-formed chains all the same).  And the top-k
 * matcher reads nodes past the graph's last one.
 *
 * Each node the host computes was checked alone (import.c and the rest);
 * this module keeps the fusions to chains that are what ggml builds:
 *  - the node list is padded with an end node (op NONE) that no matcher
 *    takes, so a matcher reading past the last node finds it;
 *  - a graph without the guest's use counts (unkeyed, or a segment of a
 *    graph computed in pieces) fuses nothing: every count is one no
 *    chain can match;
 *  - in a graph with them, a node nothing reads gets such a count too (a
 *    chain's inner node is always read by the next one; ggml's check takes
 *    0 uses inside the chain for a match with a count of 0, so a chain of
 *    unrelated nodes fused);
 *  - a chain whose first node starts a fusion the rules below do not
 *    prove safe gets such a count on that node, so it runs node by node,
 *    each node checked: nothing computes differently, it is only fused less.
 * The rules read ggml-cuda of the pinned release (ggml-cuda.cu
 * ggml_cuda_try_fuse and the kernels it calls); other backends fuse fewer
 * chains, and a count that stops a fusion costs them nothing else.
 */
#ifndef APIR_OP_FUSION_H
#define APIR_OP_FUSION_H

#include "ggml.h"

#include <stdbool.h>
#include <stdint.h>

/* Node slots past the last node that the padding fills: more than any
 * matcher reads past the node it starts at. */
#define APIR_FUSION_PAD 16

/* The node capacity a graph of n nodes is made with. */
static inline size_t apir_fusion_graph_size(size_t n_nodes)
{
    return n_nodes + APIR_FUSION_PAD;
}

/* Pads g's node list (made with apir_fusion_graph_size) and sets the use
 * counts as above.  counts_given: g's counts are the guest's, raised to
 * this graph's own uses (import.c set_use_counts); else none are kept. */
void apir_fusion_seal(struct ggml_cgraph *g, bool counts_given);

#endif
