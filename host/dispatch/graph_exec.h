/*
 * Graph execution: the one place that decides when a session's graphs run
 * and what waits for them.  The contract, written once:
 *
 *   accept    A graph command is decoded and checked (import.c,
 *             op_policy.c).  An APIR 0.1 graph (COMPUTE, COMPUTE_AT) is
 *             computed and waited for before its reply.  A keyed graph
 *             (COMPUTE_KEYED, RECOMPUTE: APIR_LEAVES_BUSY) is kept under its
 *             key and answered as soon as it is accepted (on a CPU, see
 *             run).
 *   run       A keyed graph accepted by the last command runs right after
 *             that command's reply is sent (a transport that sets
 *             s->defer_graphs calls apir_session_run_deferred), or first
 *             thing in the next command - so the guest prepares its next
 *             batch while the device works, as with a local GPU's
 *             asynchronous compute.  It is launched and not waited for: in
 *             flight.  On a device that computes synchronously (a CPU)
 *             it runs before the reply, unless the transport's guest may
 *             be on another machine (s->defer_sync_graphs, session.h).
 *   settle    Queries (APIR_QUERY) and work on the same stream
 *             (APIR_ON_STREAM: uploads, further graphs) run beside a graph in
 *             flight; every other command waits for it first
 *             (apir_session_settle), so nothing sees or touches memory a
 *             graph is using.  Commands stay strictly ordered.
 *   report    What fails while a deferred graph runs (an index refused
 *             mid-graph, a backend error) is reported once, by the next
 *             command that waits for results (APIR_REPORTS: a read, a
 *             synchronize, a graph), which then fails; the graph is not
 *             kept, so a recompute must send it again.
 *
 * The classes are columns of the command table (protocol/apir_commands.h);
 * the guest reads the same ones (guest/remote.c).
 */
#ifndef APIR_GRAPH_EXEC_H
#define APIR_GRAPH_EXEC_H

#include "import.h"
#include "session.h"

/* How many keyed graphs a session keeps (the least recently used goes). */
#define APIR_GRAPH_CACHE_SLOTS 4

/* The session's graph state (s->graphs): kept graphs, the deferred one,
 * the one in flight, the anchor.  NULL when memory cannot be had. */
struct apir_graphs *apir_graphs_new(void);
/* Nothing may be in flight (apir_session_settle). */
void apir_graphs_free(struct apir_graphs *g);

/* Before command cmd: runs a deferred graph, settles unless cmd runs beside
 * the device, and returns APIR_HANDLER_BAD_REQUEST if cmd must report a
 * deferred failure (else APIR_HANDLER_OK). */
uint32_t apir_graph_before_command(struct apir_session *s, uint32_t cmd);

/*
 * Node 0 of every graph the session computes (apir_graph_build puts it
 * there), or NULL if it could not be made: an op-less tensor every backend
 * skips.  CUDA keys its graph capture state by node 0's address.  A
 * program's own graphs all start at one address (llama.cpp builds each in
 * the same context), so a new graph - each prompt batch, whose KV length
 * grows - finds the state changed and runs directly, and only a graph
 * repeated unchanged (a token's) is captured and replayed.  Ours live in
 * per-slot contexts: without the anchor a batch met its own slot's state
 * from the previous run unchanged and was captured (~8 ms on the H200) to
 * be replayed at most once.
 */
struct ggml_tensor *apir_graph_anchor(const struct apir_session *s);

/* The graph a command computes: blob imported and checked (apir_import_graph,
 * import.h) behind the session's anchor, with the weight copies the session
 * keeps put in place of their weights (weight_copies.h).  NULL, with *why
 * pointed at the reason, if the blob is refused. */
struct ggml_cgraph *apir_graph_build(struct apir_session *s, struct apir_import_scratch *sc,
                                     struct apir_graph_blob *in, const char **why);

/* A keyed graph (key, not 0) at [offset, offset + size) of blob res_id,
 * for command cmd (BACKEND_GRAPH_COMPUTE_INPUTS, _DELTA): whole (base 0), as
 * BACKEND_GRAPH_COMPUTE_KEYED accepts it, or a delta against the graph of
 * key base (apir 0.9), APIR_HANDLER_STALE when the host no longer keeps
 * base (the guest then sends it whole); an apir_handler_result, the graph's
 * status in *status_out. */
uint32_t apir_graph_compute_keyed(struct apir_session *s, uint32_t cmd, uint32_t res_id, uint64_t offset,
                                  uint64_t size, uint64_t key, uint64_t base, uint32_t *status_out);

/* For tests: the graph kept under key (NULL: none); whether a keyed graph
 * was accepted and not yet run (deferred); whether one was launched and not
 * waited for (in flight). */
struct ggml_cgraph *apir_graph_kept(const struct apir_session *s, uint64_t key);
bool apir_graph_deferred(const struct apir_session *s);
bool apir_graph_in_flight(const struct apir_session *s);

#endif
