/*
 * Does a node hold together as the op it claims to be?
 *
 * Backend kernels trust that a node was made by ggml's op constructors: that
 * its sources exist and that their shapes fit each other and the result
 * (MUL_MAT reads src1 rows with src0's row length; ADD broadcasts src1 over
 * src0).  A guest can send any combination, and a kernel then reads past an
 * operand - host memory after the guest's buffer - or hits one of ggml's
 * asserts and aborts.  So, before supports_op and before compute, each node
 * is checked for its op's required sources and for the shape rules its
 * constructor asserts.  Ops without a rule here still need their first
 * source; their kernels must stay within what their own tensors' extents
 * (checked against the buffers) allow - the residual risk README's security
 * section names, which process isolation confines to the guest's own worker.
 */
#ifndef APIR_OP_SHAPES_H
#define APIR_OP_SHAPES_H

struct ggml_tensor;

/* NULL if the node is acceptable, else why not. */
const char *apir_op_shape_error(const struct ggml_tensor *t);

#endif
