/*
 * What a device's kernels assume of a node beyond what ggml's constructors,
 * the operand rules (op_operands.c) and the device's own supports_op say.
 *
 * The other checks are the CPU kernels' (fuzz_op computes on the CPU
 * backend).  ggml-cuda's kernels assume more: contiguous operands its
 * supports_op does not ask for, parameter ranges, strides that are whole
 * elements, type pairs its copy has kernels for - an assert there ends
 * the guest's worker - and its transposing copy writes its destination
 * densely whatever the destination's strides, past a strided one's
 * extent.  Found by fuzz_op's device path on an H100 (apir-fuzz-op-dev,
 * bench/h200.sh fuzzdev).  Each rule names the kernel and the assumption
 * it keeps; a node that breaks one is one the device does not support (the
 * guest's scheduler then runs it elsewhere, as ggml would natively had the
 * device said no), and a graph holding it is refused.
 */
#ifndef APIR_OP_DEVICE_H
#define APIR_OP_DEVICE_H

#include "ggml-backend.h"

#include <stdbool.h>

/* Whose kernels a device runs: the rules below are per family. */
enum apir_kernel_family {
    APIR_KERNELS_OTHER = 0,  /* the CPU's and the rest: the other checks are theirs */
    APIR_KERNELS_CUDA,       /* ggml-cuda (also built for ROCm and MUSA) */
};

enum apir_kernel_family apir_kernel_family_of(ggml_backend_dev_t dev);

/* NULL when node's kernel on that family takes it, else why not (a
 * static string). */
const char *apir_op_device_error(enum apir_kernel_family family, const struct ggml_tensor *node);

/* The device's supports_op and the rules above: what the host answers a
 * guest's question with, and asks of every node it computes. */
bool apir_device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *node);

#endif
