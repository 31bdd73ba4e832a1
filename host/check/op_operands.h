/*
 * Operand types, layouts, agreement and overlap (issue 12, issue 24,
 * fuzz_op findings).
 *
 * ggml's constructors leave some things to the backend: which types a
 * kernel has functions for (the CPU backend's supports_op says yes to
 * types whose from_float / vec_dot / to_float is NULL, or that a kernel
 * reads as floats), the layouts a kernel's address arithmetic assumes
 * (rows at j * nb[1], arrays from a row start, one operand addressed with
 * another's strides or counts), whether a result may lie over its
 * sources, and the extents of operands a recurrent kernel derives from
 * other operands.  The layout and agreement rules are one table, op ->
 * rule, each entry naming the kernel accesses it protects; an op without
 * an entry is refused.
 */
#ifndef APIR_OP_OPERANDS_H
#define APIR_OP_OPERANDS_H

struct ggml_tensor;

#include <stdbool.h>

/* NULL if t's operand types, layouts, placement and the operand extents
 * the kernels derive are ones the kernels handle, else why not (text valid
 * until this thread's next call).  Called by apir_op_shape_error for
 * nodes (not views/leaves) whose sources are present.  query: t is a
 * supports_op / alloc-size subject, which comes without view_src and is
 * never computed: its placement is not checked (nor any tensor's without
 * data). */
const char *apir_op_operands_error(const struct ggml_tensor *t, bool query);

/* The operand rule of op (op_operands.c's table): which of the CPU
 * kernel's accesses it is about.  NULL for an op without one: nodes of
 * such an op are refused. */
const char *apir_op_operand_rule(int op);

#endif
