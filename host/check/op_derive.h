/*
 * Is a node exactly what ggml itself would have built?
 *
 * The node's sources (host tensors import made) and the constructor
 * arguments its op_params hold are passed to ggml's own constructor for its
 * op (ggml_add, ggml_pad_ext, ggml_rope_ext, ...) in a scratch no_alloc
 * context; the result must equal the node in op, type, ne, nb (the
 * size-1 strides of a contiguous result made canonical first, as import
 * made the node's: apir_canonical_unit_strides), all op_params bytes, every src pointer,
 * view_src and view_offs.  Whatever shape, type
 * and layout rules a kernel relies on because the constructor made them
 * true therefore hold for the node.  Names and flags are not compared.
 *
 * An allowlist by construction: an op without a derivation here is refused.
 * A constructor's GGML_ASSERT does not abort the process: ggml's abort
 * callback (installed once) jumps back when the asserting thread is inside
 * a derivation, and the node is refused with the assert's text.  On any
 * other thread the previous callback (or ggml's message) runs as before.
 *
 * The caller (op_shapes.c) has already checked what a constructor would not
 * survive: sources it dereferences are present, divisors are non-zero,
 * every tensor's extent covers its dense size (so sizes cannot overflow).
 */
#ifndef APIR_OP_DERIVE_H
#define APIR_OP_DERIVE_H

#include "ggml.h"

#include <stdbool.h>

/* Ops that run no kernel: the node is a view of its source, which import
 * already bounds-checked against its buffer. */
bool apir_op_is_view(int op);

/* If ggml_is_contiguous(t) - which looks at no stride of a dimension of
 * size 1 - gives each such dimension the stride ggml_new_tensor gives it:
 * nb[0] the element (block) size, nb[1] the size of ne[0] elements, nb[i]
 * nb[i-1] * ne[i-1] above.  An index into a size-1 dimension is always 0,
 * so no element moves; what changes is that a contiguous tensor then has
 * every stride canonical (import.c says why that matters).  Tensors that
 * are not contiguous keep their strides: there ggml itself gives size-1
 * dimensions other strides (a permuted view keeps its source's) and looks
 * at them (conv_2d_dw's channels-last kernel asserts nb[0] >= nb[2] of a
 * one-channel-plane kernel).  False when a stride would not fit a size_t. */
bool apir_canonical_unit_strides(struct ggml_tensor *t);

/* NULL if rebuilding t with ggml's constructor gives t back, else why not
 * (text valid until this thread's next call).  query: t is the subject of a
 * supports_op / alloc-size question, which the guest sends without
 * view_src/view_offs (they do not decide the answer and would defeat its
 * cache) and with its sources as op-less copies; view identity is then not
 * compared, and an inplace variant is tried as well.  Nothing is computed
 * on such an answer: a graph's node is checked in full.  In a query an
 * optimizer step's parameter (src[0], the host's own copy) gets its PARAM
 * flag set, which its constructor asserts and a query does not carry. */
const char *apir_op_derive_error(const struct ggml_tensor *t, bool query);

#endif
