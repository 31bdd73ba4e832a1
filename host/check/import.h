/*
 * Turning guest tensor records into host ggml tensors, after validation.
 *
 * Everything the host computes on comes through here: a record is checked
 * field by field (type, op, shape, strides, buffer handle, bounds), only then
 * is a tensor made, in the scratch context the caller names, with pointer
 * fields the host fills in itself and the strides of its size-1 dimensions
 * made canonical (import.c says why).  Lists and graphs also check that
 * every src/view id resolves inside the message and that the references
 * form no cycle.
 */
#ifndef APIR_IMPORT_H
#define APIR_IMPORT_H

#include "session.h"

/* Every function imports into the scratch sc it is given (session.h):
 * tensors made there are good until sc's next apir_import_begin.  On a
 * refusal each returns NULL (false) and points *why at the reason, a static
 * string for the caller's log line and reply (the check layer's convention,
 * docs/ARCHITECTURE.md). */

/* Resets sc's context for up to n_tensors tensors and a graph of n_nodes
 * nodes (0: none).  False if memory cannot be had. */
bool apir_import_begin(struct apir_import_scratch *sc, uint32_t n_tensors, uint32_t n_nodes, const char **why);

/* One tensor without srcs (set/get/cpy/memset).  need_buffer: the record
 * must name a live buffer of this session and lie inside it.  On success the
 * tensor's buffer slot is stored in *buf if buf is non-NULL. */
struct ggml_tensor *apir_import_tensor(struct apir_session *s, struct apir_import_scratch *sc,
                                       const struct apir_tensor_rec *rec, bool need_buffer, struct apir_host_buffer **buf,
                                       const char **why);

/* A list of n records (in place in shared memory: each is read once) whose
 * src/view_src ids refer to each other.  Returns the tensors in order, or
 * NULL.  need_buffer as above, applied to every record; it also marks a
 * graph, where every tensor is checked against its op (op_shapes.h), while
 * in a query list (supports_op, alloc size) only the first, the subject:
 * rebuilt by ggml's own constructor and compared, an allowlist of ops. */
struct ggml_tensor **apir_import_list(struct apir_session *s, struct apir_import_scratch *sc, uint32_t n,
                                      const uint8_t *records, bool need_buffer, const char **why);

/* A graph command's blob, as apir_import_graph reads it. */
struct apir_graph_blob {
    const uint8_t *bytes;   /* in the guest's memory: each byte is read once */
    uint64_t size;
    uint64_t key;           /* the guest's name for the graph (0: an APIR 0.1 graph) */
    uint64_t base;          /* 0: a whole graph; else (0.9) a delta against the graph of key base */
    bool use_counts;        /* 0.2 keyed graphs: the blob may end with the nodes' use counts */
    bool stale;             /* out: a delta refused because the host no longer keeps its base */
};

/* A graph blob of APIR 0.1: uint32 n_nodes, n_nodes ids, uint32 n_tensors,
 * records; begins sc itself.  Every tensor must live in one of the
 * session's buffers.  A tensor whose record, and whose operands' and views'
 * records, are those of the session's last graph (its import memo) keeps
 * that graph's op and supports_op answers (import.c says why that is
 * sound); every other check runs on every record.  The graph starts with anchor (the caller's: see
 * apir_graph_anchor, graph_exec.h), then the nodes.  use_counts (0.2 keyed
 * graphs): the blob may go on with the nodes' use counts
 * (APIR_GRAPH_USE_COUNTS_TAG); nothing else may follow.
 * A delta (base set, BACKEND_GRAPH_COMPUTE_DELTA): where the records would
 * be, uint32 n_changed, their n_changed uint32 indices (strictly
 * increasing) and their records; every other record is the memo's at its
 * index.  The memo must hold the graph of key base (else in->stale).  The
 * delta is written over the memo's copy and the graph imported from there:
 * what is checked is the whole graph, as if sent whole.  Only checks and
 * builds: what runs the graph (host/dispatch) may still change where its
 * tensors live (weight copies). */
struct ggml_cgraph *apir_import_graph(struct apir_session *s, struct apir_import_scratch *sc,
                                      struct apir_graph_blob *in, struct ggml_tensor *anchor, const char **why);

/* Frees what sc holds (it is left empty, ready for another begin). */
void apir_import_scratch_free(struct apir_import_scratch *sc);

/* Frees the session's import memo (session.h). */
void apir_import_memo_free(struct apir_import_memo *memo);

#endif
