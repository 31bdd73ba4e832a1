/*
 * What the host checks about an op beyond its tensors' shapes and bounds:
 * parameters that steer memory access (op_params offsets, enum values used as
 * indices) and the index VALUES of ops that gather or scatter rows.
 *
 * The per-op policy (also in docs/SECURITY.md):
 *   GET_ROWS, GET_ROWS_BACK, SET_ROWS, MUL_MAT_ID, ADD_ID, SSM_SCAN
 *       index values are validated against the dimension they index, over
 *       exactly the elements the (CPU) kernel reads, walked as it walks
 *       them: GET_ROWS by src1's strides over ne10 x ne11 x ne12*ne13;
 *       SET_ROWS by src1's strides over src0's ne01 (and the broadcast
 *       ne11, ne12); MUL_MAT_ID by ids' strides over ne0 x ne1 (a token's
 *       ids distinct: ggml-cuda asserts it); ADD_ID by
 *       ids' strides over the result's ne1 x ne2; GET_ROWS_BACK as a dense
 *       int32 array of nelements(src1); SSM_SCAN as a dense int32 array of
 *       src1->ne[3].  The walk must stay inside the index tensor's bytes,
 *       hold no more elements than they do, read the tensor's own type
 *       (I32; SET_ROWS also I64), and the op must not write over its own
 *       indices.  Values are checked right before the op reads them: up
 *       front when no earlier node of the graph writes their memory,
 *       otherwise the graph is computed in segments and validated at the
 *       split.  The one writer needing no split is an ARGSORT/TOP_K that
 *       runs before the first read and provably wrote every element read
 *       (op_policy.c sort_covers).  An index tensor in guest-shared memory
 *       (DEVICE_BUFFER_FROM_PTR), which the guest could change after the
 *       check, is copied to host-private memory first; the op reads the copy.
 *   SET, ACC  the destination view (op_params: strides, offset) must lie
 *       inside the destination.
 *   CONCAT    the dimension must be 0..3.
 *   UNARY, GLU  the sub-op must be a known one.
 *   MAP_CUSTOM*, CUSTOM  refused (host function pointers; import.c).
 *   every other op: memory access is bounded by its tensors' ne/nb, which
 *       import.c checked against their buffers, as far as the kernel's
 *       address arithmetic follows them: op_operands.c's rule table
 *       requires the layouts and agreement it assumes.
 */
#ifndef APIR_OP_POLICY_H
#define APIR_OP_POLICY_H

#include "session.h"

/* The session's policy state (s->policy); NULL when memory cannot be had. */
struct apir_policy *apir_policy_new(void);
void apir_policy_free(struct apir_policy *p);

/*
 * The tensors a node's kernel writes besides its own bytes, into out (room
 * for APIR_WRITTEN_SRCS_MAX); their count.  A node's result is what ggml
 * says it writes, and for nearly every op it is all its kernel writes (an
 * in-place op's result is a view of what it updates); OPT_STEP_ADAMW also
 * updates its moments m and v (srcs 2 and 3) in place.  Whatever reasons
 * about which memory a graph writes (index checks, the upload mirror,
 * weight copies) asks here too.
 */
#define APIR_WRITTEN_SRCS_MAX 2
int apir_node_written_srcs(const struct ggml_tensor *node, const struct ggml_tensor *out[APIR_WRITTEN_SRCS_MAX]);

/* Checks and computes a graph imported into sc (where its shadows and
 * segment graph go too).  On a refusal returns GGML_STATUS_ABORTED and sets
 * *why; nothing of the refused part runs. */
enum ggml_status apir_policy_compute(struct apir_session *s, struct apir_import_scratch *sc, ggml_backend_t backend,
                                     struct ggml_cgraph *graph, const char **why);

#endif
