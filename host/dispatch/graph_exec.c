/*
 * Graph execution (the contract is in graph_exec.h): the graph commands'
 * handlers, keyed graphs kept for recomputes, deferral and settling.
 */
#include "graph_exec.h"
#include "dispatcher.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-impl.h"
#include "handlers.h"
#include "import.h"
#include "op_policy.h"
#include "upload_mirror.h"
#include "weight_copies.h"
#include "wait.h"

#include <stdlib.h>

/* A graph kept by key (apir 0.2 BACKEND_GRAPH_COMPUTE_KEYED): a reused
 * graph is recomputed by key, without being sent, decoded and checked
 * again.  Each slot owns its tensors' context.  Buffer memory going
 * anywhere in the session (s->buffers_epoch) invalidates every slot (its
 * tensors could point into it). */
struct apir_graph_slot {
    uint64_t key;            /* 0: empty */
    uint64_t epoch;          /* s->buffers_epoch when imported */
    uint64_t last_use;
    uint64_t launched_at_settles;  /* s->settles when last launched: done once it grew */
    uint32_t device;
    struct ggml_cgraph *graph;
    struct apir_import_scratch scratch;
};

struct apir_graphs {
    struct apir_graph_slot slots[APIR_GRAPH_CACHE_SLOTS];
    uint64_t clock;                        /* the last last_use given */
    /* Keyed graphs computed after their reply (s->defer_graphs): */
    struct apir_graph_slot *deferred;      /* accepted, not yet computed */
    uint32_t deferred_cmd;                 /* the command that accepted it (for the profile) */
    const char *deferred_error;            /* a deferred graph failed: told at the next wait */
    struct ggml_context *anchor_ctx;       /* apir_graph_anchor (graph_exec.h) */
    struct ggml_tensor *anchor;
};

struct apir_graphs *apir_graphs_new(void)
{
    struct apir_graphs *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    struct ggml_init_params anchor_params = { .mem_size = ggml_tensor_overhead(), .no_alloc = true };
    g->anchor_ctx = ggml_init(anchor_params);
    g->anchor = g->anchor_ctx ? ggml_new_tensor_1d(g->anchor_ctx, GGML_TYPE_F32, 1) : NULL;
    if (g->anchor)
        ggml_set_name(g->anchor, "apir_graph_anchor");
    return g;
}

void apir_graphs_free(struct apir_graphs *g)
{
    if (!g)
        return;
    for (int i = 0; i < APIR_GRAPH_CACHE_SLOTS; i++)
        apir_import_scratch_free(&g->slots[i].scratch);
    if (g->anchor_ctx)
        ggml_free(g->anchor_ctx);
    free(g);
}

struct ggml_tensor *apir_graph_anchor(const struct apir_session *s)
{
    return s->graphs->anchor;
}

/* The operands the graph's nodes update in place beside their results
 * (apir_node_written_srcs): host copies of their bytes go stale when it
 * runs - weight copies (at import, before any is used), upload mirrors
 * (after each run).  Their own results are forgotten by data/.  Returns
 * how many nodes write such operands. */
static uint32_t forget_written_operands(struct apir_session *s, struct ggml_cgraph *graph, bool weights, bool mirror)
{
    uint32_t writers = 0;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        const struct ggml_tensor *also[APIR_WRITTEN_SRCS_MAX];
        const int n = apir_node_written_srcs(ggml_graph_node(graph, i), also);
        writers += n > 0;
        for (int k = 0; k < n; k++) {
            if (!also[k]->data)
                continue;
            if (weights)
                apir_weights_forget_range(s, also[k]->data, ggml_nbytes(also[k]));
            if (mirror)
                apir_mirror_forget_range(s, also[k]->buffer, also[k]->data, ggml_nbytes(also[k]));
        }
    }
    return writers;
}

struct ggml_cgraph *apir_graph_build(struct apir_session *s, struct apir_import_scratch *sc,
                                     struct apir_graph_blob *in, const char **why)
{
    struct ggml_cgraph *graph = apir_import_graph(s, sc, in, apir_graph_anchor(s), why);
    if (graph) {
        sc->n_writing_operands = forget_written_operands(s, graph, true, false);
        apir_weights_apply(s, graph);
    }
    return graph;
}

/* The slot keeping the graph of key, or NULL (key 0 names none). */
static struct apir_graph_slot *slot_find(struct apir_graphs *graphs, uint64_t key)
{
    for (int i = 0; i < APIR_GRAPH_CACHE_SLOTS && key; i++)
        if (graphs->slots[i].key == key)
            return &graphs->slots[i];
    return NULL;
}

struct ggml_cgraph *apir_graph_kept(const struct apir_session *s, uint64_t key)
{
    struct apir_graph_slot *slot = slot_find(s->graphs, key);
    return slot ? slot->graph : NULL;
}

bool apir_graph_deferred(const struct apir_session *s)
{
    return s->graphs->deferred != NULL;
}

bool apir_graph_in_flight(const struct apir_session *s)
{
    return s->graph_in_flight != NULL;
}

/* Where a keyed graph goes: its own slot, an empty one, or the least
 * recently used. */
static struct apir_graph_slot *graph_slot_for(struct apir_graphs *graphs, uint64_t key)
{
    struct apir_graph_slot *best = &graphs->slots[0];
    for (int i = 0; i < APIR_GRAPH_CACHE_SLOTS; i++) {
        struct apir_graph_slot *g = &graphs->slots[i];
        if (g->key == key)
            return g;
        if (g->key == 0 || (best->key != 0 && g->last_use < best->last_use))
            best = g;
    }
    return best;
}

/*
 * Checks (op_policy.c) and computes a graph imported into sc.  in_flight:
 * launched, not waited for (the device goes on while the host answers
 * queries: on the H200 each new prompt batch's supports_op questions
 * waited ~6 ms behind the previous batch before).
 */
static enum ggml_status run_graph(struct apir_session *s, struct apir_import_scratch *sc, uint32_t cmd,
                                  ggml_backend_t backend, struct ggml_cgraph *graph, bool in_flight, uint32_t *result)
{
    const char *why = NULL;
    uint64_t t0 = apir_now_ns(), segments0 = s->stats.n_segments, idle_ns = 0;
    if (s->device_idle_since_ns) {
        idle_ns = t0 - s->device_idle_since_ns;
        s->device_idle_since_ns = 0;
        s->stats.idle_before_launch_ns += idle_ns;
        s->stats.n_idle_gaps++;
    }
    enum ggml_status status = apir_policy_compute(s, sc, backend, graph, &why);
    s->graph_in_flight = backend;
    if (!in_flight || status != GGML_STATUS_SUCCESS)
        apir_session_settle(s);
    uint64_t dt = apir_now_ns() - t0;
    s->stats.compute_ns += dt;
    APIR_DEBUG("host", "%s: %s: %d nodes in %llu piece(s), %.1f us%s, device idle %.1f us before", s->name,
               apir_command_name(cmd), ggml_graph_n_nodes(graph),
               (unsigned long long)(s->stats.n_segments - segments0), dt / 1e3, in_flight ? " (launch)" : "",
               idle_ns / 1e3);
    apir_mirror_forget_written(s, graph);
    if (sc->n_writing_operands)
        forget_written_operands(s, graph, false, true);
    s->stats.n_graphs++;
    if (why)
        *result = apir_refuse(s, cmd, why);
    return status;
}

/* run_graph for a kept graph: the slot remembers when it was launched. */
static enum ggml_status run_slot(struct apir_session *s, struct apir_graph_slot *slot, uint32_t cmd,
                                 ggml_backend_t backend, uint32_t *result)
{
    slot->launched_at_settles = s->settles;
    return run_graph(s, &slot->scratch, cmd, backend, slot->graph, true, result);
}

/* Whether a kept graph may still be on the device: launched, and no wait
 * for the device since (a wait drains the stream it ran on). */
static bool slot_may_run(const struct apir_session *s, const struct apir_graph_slot *slot)
{
    return s->graph_in_flight && slot->launched_at_settles == s->settles;
}

/* Whether a keyed graph accepted now on the session's device (its backend
 * started) is computed after its reply (session.h: defer_graphs,
 * defer_sync_graphs). */
static bool defers_graph(const struct apir_session *s)
{
    return s->defer_graphs && (s->defer_sync_graphs || !s->computes_sync[s->device]);
}

/* A graph blob at [offset, offset+size) of blob res_id; key 0: an APIR 0.1
 * graph, computed before the reply, imported into the session's scratch;
 * a keyed graph goes into its cache slot's.  base: 0, or the key of the
 * graph the blob is a delta against (0.9: APIR_HANDLER_STALE when the host
 * no longer keeps it). */
static uint32_t graph_compute(struct apir_session *s, uint32_t cmd, uint32_t res_id, uint64_t offset, uint64_t size,
                              uint64_t key, uint64_t base, uint32_t *status_out)
{
    struct apir_graphs *graphs = s->graphs;
    enum ggml_status status = GGML_STATUS_ABORTED;
    uint32_t result = APIR_HANDLER_OK;
    ggml_backend_t backend = apir_session_backend(s, s->device);
    const uint8_t *blob = apir_session_blob_range(s, res_id, offset, size);
    struct apir_graph_slot *slot = key ? graph_slot_for(graphs, key) : NULL;
    struct apir_import_scratch *sc = slot ? &slot->scratch : &s->scratch;
    if (slot) {
        /* Its tensors may be those of a graph still on the device (a long
         * prompt's batches, APIR_GRAPH_CACHE_SLOTS of them launched without
         * a wait between). */
        if (slot->key && slot_may_run(s, slot))
            apir_session_settle(s);
        slot->key = 0;  /* until this import succeeds */
    }
    if (!backend) {
        status = GGML_STATUS_FAILED;
    } else if (!blob) {
        result = apir_refuse(s, cmd, "graph range outside its blob");
    } else {
        uint64_t t0 = apir_now_ns(), kept0 = s->stats.checks_kept;
        const char *why = NULL;
        struct apir_graph_blob in = { .bytes = blob, .size = size, .key = key, .base = base, .use_counts = key != 0 };
        struct ggml_cgraph *graph = apir_graph_build(s, sc, &in, &why);
        uint64_t import_ns = apir_now_ns() - t0;
        s->stats.import_ns += import_ns;
        /* Per graph, beside the compute line below: what decoding and
         * checking a graph sent anew costs (bench/whisper_compare.sh), and
         * how many tensors' op checks the last graph answered (import.h). */
        APIR_DEBUG("host", "%s: %s: imported %d nodes in %.1f us (%llu op checks kept)", s->name,
                   apir_command_name(cmd), graph ? ggml_graph_n_nodes(graph) : 0, import_ns / 1e3,
                   (unsigned long long)(s->stats.checks_kept - kept0));
        if (graph) {
            /* ggml's reuse marker, a promise that no node changed since the
             * last graph of that uid: the CUDA backend then skips its
             * per-node checks and replays the graph it captured, whose
             * kernels hold that graph's shapes and addresses (Hexagon keeps
             * one the same way).  The key is the guest's word - the same key
             * may come back with other tensors, after their buffers went -
             * so only the host gives uids: a new one at every import, never
             * repeated in this process, kept while the slot's recomputes run
             * these very tensors (a buffer gone makes the slot stale). */
            if (slot) {
                graph->uid = ggml_graph_next_uid();
                slot->epoch = s->buffers_epoch;
                slot->last_use = ++graphs->clock;
                slot->device = s->device;
                slot->graph = graph;
                slot->key = key;
            }
            if (slot && defers_graph(s)) {
                graphs->deferred = slot;
                graphs->deferred_cmd = cmd;
                status = GGML_STATUS_SUCCESS;
            } else if (slot) {
                status = run_slot(s, slot, cmd, backend, &result);
            } else {
                status = run_graph(s, sc, cmd, backend, graph, false, &result);
            }
        } else if (in.stale) {
            /* Not the guest's fault: it sends the whole graph. */
            APIR_DEBUG("host", "%s: %s: %s", s->name, apir_command_name(cmd), why);
            result = APIR_HANDLER_STALE;
        } else {
            result = apir_refuse(s, cmd, why);
        }
    }
    *status_out = (uint32_t)status;
    return result;
}

APIR_HANDLER(BACKEND_GRAPH_COMPUTE)
{
    return graph_compute(s, APIR_CMD_BACKEND_GRAPH_COMPUTE, req->blob, 0, req->size, 0, 0, &rep->status);
}

APIR_HANDLER(BACKEND_GRAPH_COMPUTE_AT)
{
    return graph_compute(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_AT, req->blob, req->blob_offset, req->size, 0, 0,
                         &rep->status);
}

APIR_HANDLER(BACKEND_GRAPH_COMPUTE_KEYED)
{
    if (req->key == 0)
        return apir_refuse(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, "key 0");
    return graph_compute(s, APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED, req->blob, req->blob_offset, req->size, req->key, 0,
                         &rep->status);
}

uint32_t apir_graph_compute_keyed(struct apir_session *s, uint32_t cmd, uint32_t res_id, uint64_t offset,
                                  uint64_t size, uint64_t key, uint64_t base, uint32_t *status_out)
{
    return graph_compute(s, cmd, res_id, offset, size, key, base, status_out);
}

/* The token path: a graph the guest sent before, computed again.  Index
 * values are checked again (they change per call); the records cannot. */
APIR_HANDLER(BACKEND_GRAPH_RECOMPUTE)
{
    struct apir_graphs *graphs = s->graphs;
    if (req->key == 0)
        return apir_refuse(s, APIR_CMD_BACKEND_GRAPH_RECOMPUTE, "key 0");
    struct apir_graph_slot *slot = slot_find(graphs, req->key);
    ggml_backend_t backend = apir_session_backend(s, s->device);
    if (!slot || slot->epoch != s->buffers_epoch || slot->device != s->device || !backend) {
        rep->status = GGML_STATUS_ABORTED;
        return APIR_HANDLER_STALE;
    }
    slot->last_use = ++graphs->clock;
    s->stats.n_recomputes++;
    if (defers_graph(s)) {
        graphs->deferred = slot;
        graphs->deferred_cmd = APIR_CMD_BACKEND_GRAPH_RECOMPUTE;
        rep->status = GGML_STATUS_SUCCESS;
        return APIR_HANDLER_OK;
    }
    uint32_t result = APIR_HANDLER_OK;
    rep->status = (uint32_t)run_slot(s, slot, APIR_CMD_BACKEND_GRAPH_RECOMPUTE, backend, &result);
    return result;
}

APIR_HANDLER(BACKEND_SYNCHRONIZE)
{
    (void)req;
    (void)rep;
    /* apir_graph_before_command has settled (it is not a query) and told a
     * deferred failure; this waits for the stream itself. */
    ggml_backend_t backend = apir_session_backend(s, s->device);
    if (!backend)
        return APIR_HANDLER_FAILED;
    ggml_backend_synchronize(backend);
    return APIR_HANDLER_OK;
}

void apir_session_run_deferred(struct apir_session *s)
{
    struct apir_graphs *graphs = s->graphs;
    struct apir_graph_slot *slot = graphs->deferred;
    if (!slot)
        return;
    graphs->deferred = NULL;
    uint64_t t0 = apir_now_ns();
    ggml_backend_t backend = apir_session_backend(s, slot->device);
    uint32_t result = APIR_HANDLER_OK;
    enum ggml_status status = backend ? run_slot(s, slot, graphs->deferred_cmd, backend, &result) : GGML_STATUS_FAILED;
    s->stats.cmd_ns[graphs->deferred_cmd] += apir_now_ns() - t0;
    if (result != APIR_HANDLER_OK || status != GGML_STATUS_SUCCESS) {
        graphs->deferred_error =
            status == GGML_STATUS_ABORTED ? "a graph was refused while computing" : "a graph failed";
        slot->key = 0;  /* not kept: a recompute must send it again */
    }
}

uint32_t apir_graph_before_command(struct apir_session *s, uint32_t cmd)
{
    struct apir_graphs *graphs = s->graphs;
    apir_session_run_deferred(s);
    if (!apir_command_runs_beside_device(cmd))
        apir_session_settle(s);
    if (graphs->deferred_error && (apir_command_classes(cmd) & APIR_REPORTS)) {
        APIR_WARN("host", "%s: %s fails: %s before it", s->name, apir_command_name(cmd), graphs->deferred_error);
        graphs->deferred_error = NULL;
        return APIR_HANDLER_BAD_REQUEST;
    }
    return APIR_HANDLER_OK;
}
