/*
 * Does a node hold together as the op it claims to be?
 *
 * Backend kernels trust that a node was made by ggml's op constructors: that
 * its sources exist, that their shapes and types fit each other and the
 * result, that a result they write densely is a fresh contiguous tensor of
 * the type they write.  A guest can send anything, and a kernel then reads
 * or writes past an operand - host memory after the guest's buffer - or
 * hits one of ggml's asserts and aborts.  So, before supports_op and before
 * compute, every tensor of a graph (the subject of a query) is checked:
 *
 *   1. its byte extent (ggml_nbytes, which import bounds-checked against its
 *      buffer) covers its dense size, row_size(ne0) * ne1 * ne2 * ne3: a
 *      kernel that ignores strides stays inside checked memory - the same
 *      for each of a node's sources;
 *   2. leaves and views (VIEW, RESHAPE, PERMUTE, TRANSPOSE) stop here: they
 *      run no kernel, and import checked their place in their view_src;
 *   3. the inputs a constructor cannot survive are refused first: a missing
 *      source it dereferences, a zero it divides by (SIGFPE is no assert),
 *      an enum param that indexes a name table;
 *   4. parameters kernels depend on that no constructor checks (ROPE n_dims
 *      and offset, ACC/SET views inside their destination, f32-only
 *      kernels, enum values the kernels switch on), and operand extents a
 *      kernel derives from other tensors' shapes (ROPE freq factors,
 *      COUNT_EQUAL rows, IM2COL_BACK, POOL_2D_BACK, WIN_UNPART, SILU_BACK,
 *      FLASH_ATTN_EXT V and mask);
 *   5. the node is rebuilt by ggml's own constructor and compared field by
 *      field (op_derive.h): an allowlist - an op without a derivation is
 *      refused, and so is any node ggml would not have built;
 *   6. op_operands.h: operand types, and the layouts and agreement each
 *      kernel's address arithmetic assumes - a table op -> rule, again an
 *      allowlist (an op without a rule is refused) - and overlap.
 */
#ifndef APIR_OP_SHAPES_H
#define APIR_OP_SHAPES_H

#include <stdbool.h>

struct ggml_tensor;

/* NULL if the node is acceptable, else why not (text valid until this
 * thread's next call).  query: t is the subject of a supports_op or
 * alloc-size question, not a graph's node (op_derive.h says what differs). */
const char *apir_op_shape_error(const struct ggml_tensor *t, bool query);

#endif
