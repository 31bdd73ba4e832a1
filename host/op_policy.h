/*
 * What the host checks about an op beyond its tensors' shapes and bounds:
 * parameters that steer memory access (op_params offsets, enum values used as
 * indices) and the index VALUES of ops that gather or scatter rows.
 *
 * The per-op policy (also in README's security section):
 *   GET_ROWS, GET_ROWS_BACK, SET_ROWS, MUL_MAT_ID, ADD_ID, SSM_SCAN
 *       index values are validated against the dimension they index, right
 *       before the op reads them: up front when no earlier node of the graph
 *       writes their memory, otherwise the graph is computed in segments and
 *       validated at the split.  An index tensor in guest-shared memory
 *       (DEVICE_BUFFER_FROM_PTR), which the guest could change after the
 *       check, is copied to host-private memory first; the op reads the copy.
 *   SET, ACC  the destination view (op_params: strides, offset) must lie
 *       inside the destination.
 *   CONCAT    the dimension must be 0..3.
 *   UNARY, GLU  the sub-op must be a known one.
 *   MAP_CUSTOM*, CUSTOM  refused (host function pointers; import.c).
 *   every other op: memory access is bounded by its tensors' ne/nb, which
 *       import.c checked against their buffers.
 */
#ifndef APIR_OP_POLICY_H
#define APIR_OP_POLICY_H

#include "session.h"

/* Checks and computes a graph imported into s->import_sc.  On a refusal returns GGML_STATUS_ABORTED
 * and sets *why; nothing of the refused part runs. */
enum ggml_status apir_policy_compute(struct apir_session *s, ggml_backend_t backend, struct ggml_cgraph *graph,
                                     const char **why);

#endif
