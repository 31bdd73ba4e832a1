/*
 * Operand types, overlap, and recurrent kernels' operand extents
 * (issue 12, fuzz_op findings).
 *
 * ggml's constructors leave some things to the backend: which types a
 * kernel has functions for (the CPU backend's supports_op says yes to
 * types whose from_float / vec_dot / to_float is NULL, or that a kernel
 * reads as floats), whether a result may lie over its sources, and the
 * extents of operands a recurrent kernel derives from other operands.
 * Each rule in op_operands.c names the kernel access it protects.
 */
#ifndef APIR_OP_OPERANDS_H
#define APIR_OP_OPERANDS_H

struct ggml_tensor;

#include <stdbool.h>

/* NULL if t's operand types, placement and (for recurrent ops) extents are
 * ones the kernels handle, else why not.  Called by apir_op_shape_error for
 * nodes (not views/leaves) whose sources are present.  query: t is a
 * supports_op / alloc-size subject, which comes without view_src and is
 * never computed: its placement is not checked (nor any tensor's without
 * data). */
const char *apir_op_operands_error(const struct ggml_tensor *t, bool query);

#endif
