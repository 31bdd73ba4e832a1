/*
 * The ggml backend (stream) of an APIR device.
 */
#include "frontend.h"
#include "calls.h"

#include "apir_log.h"
#include "apir_proto.h"
#include "wait.h"

#include <stdlib.h>

/* struct ggml_cgraph: its uid marks a graph ggml's scheduler reuses as is. */
#include "ggml-impl.h"

static ggml_guid_t apir_guid(void)
{
    static ggml_guid guid = { 0x61, 0x70, 0x69, 0x72, 0x2d, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x72, 0x65, 0x6d, 0x6f, 0x74, 0x65 };
    return &guid;
}

static const char *backend_get_name(ggml_backend_t backend)
{
    return ((struct apir_device *)backend->context)->name;
}

static void backend_free(ggml_backend_t backend)
{
    free(backend);
}

static void backend_synchronize(ggml_backend_t backend)
{
    /*
     * Need not wait.  A keyed graph may still run on the host after its
     * reply (APIR_LEAVES_BUSY), but nothing of the program can see that:
     * every command that touches tensor memory waits for it on the host
     * (host/dispatch/graph_exec.c), and the guest's own reads and writes of shared
     * buffers wait first (apir_remote_wait_idle in frontend_buffer.c).  A
     * graph that fails meanwhile is reported by the next read or graph.
     */
    (void)backend;
}

static void backend_event_record(ggml_backend_t backend, ggml_backend_event_t event)
{
    apir_event_record(event, backend->context);
}

static void backend_event_wait(ggml_backend_t backend, ggml_backend_event_t event)
{
    /* On the event's own device the host keeps the order: nothing to wait
     * for.  Another device's host session cannot be told to wait for it,
     * so the program waits here, before it sends this backend more work. */
    struct apir_device *d = apir_event_device(event);
    if (d && d != backend->context)
        apir_event_synchronize(event);
}

static bool uid_is_kept(struct apir_device *d, uint64_t uid)
{
    for (int i = 0; i < APIR_KEPT_GRAPHS; i++)
        if (d->kept_uids[i] == uid)
            return true;
    return false;
}

static void uid_forget(struct apir_device *d, uint64_t uid)
{
    for (int i = 0; i < APIR_KEPT_GRAPHS; i++)
        if (d->kept_uids[i] == uid)
            d->kept_uids[i] = 0;
}

/*
 * A keyed graph with the uploads waiting for it (apir 0.8): one round trip
 * for the step's inputs and its graph.  The graph is at [0, graph_size) of
 * the data area (graph_size 0: the one the host keeps under uid), the
 * uploads after it.  Lock held; an apir_handler_result, or -1 when the
 * uploads did not fit beside the graph (nothing sent: the caller flushes
 * them and sends the graph again).
 */
static int compute_with_inputs_locked(struct apir_device *d, uint64_t uid, size_t graph_size, uint64_t base,
                                      uint32_t *status)
{
    struct apir_remote *r = &d->remote;
    struct apir_inputs *in = &d->inputs;
    const size_t at = (graph_size + 7) & ~(size_t)7;
    if (at + in->used > r->data_size)
        return -1;  /* reserving more would lose the graph already written */
    memcpy(in->buf, &in->count, sizeof(in->count));
    const size_t inputs_size = in->used;
    in->count = 0;
    in->used = 0;
    r->inputs_waiting = 0;
    /* A range that cannot be staged (logged) drops the uploads with the graph. */
    if (!apir_remote_put_data_locked(r, at, in->buf, inputs_size) ||
        (graph_size && !apir_remote_put_data_locked(r, 0, r->data, graph_size)))
        return -1;
    if (base)
        return apir_call_BACKEND_GRAPH_COMPUTE_DELTA_locked(r, r->data_res_id, at, inputs_size, 0, graph_size, uid,
                                                            base, status);
    return apir_call_BACKEND_GRAPH_COMPUTE_INPUTS_locked(r, r->data_res_id, at, inputs_size, 0, graph_size, uid,
                                                         status);
}

/*
 * A keyed graph the host does not keep, serialized (size bytes) into the
 * data area or, to_whole, into d->delta.whole: as a delta against the last
 * graph the host accepted when it has it (apir 0.9), with the uploads
 * waiting for it when they fit; else whole.  Lock held; an
 * apir_handler_result or -1 (nothing sent, logged).
 */
static int send_keyed_locked(struct apir_device *d, struct ggml_cgraph *cgraph, uint64_t uid, size_t size,
                             bool to_whole, uint32_t *status)
{
    struct apir_remote *r = &d->remote;
    int rc = -1;
    bool as_delta = false;
    uint64_t t0 = r->profile ? apir_now_ns() : 0;
    const size_t dsize = to_whole ? apir_graph_delta_build(d, size) : 0;
    if (r->profile)
        d->serialize_ns += apir_now_ns() - t0;  /* the delta is the rest of its serialization */
    if (dsize) {
        const uint64_t base = d->delta.base_key;
        if (d->inputs.count)
            rc = compute_with_inputs_locked(d, uid, dsize, base, status);
        else if (apir_remote_put_data_locked(r, 0, r->data, dsize))
            rc = apir_call_BACKEND_GRAPH_COMPUTE_DELTA_locked(r, r->data_res_id, 0, 0, 0, dsize, uid, base, status);
        as_delta = rc == APIR_HANDLER_OK;
        if (rc == APIR_HANDLER_STALE) {
            /* Its uploads are done: the graph goes whole, alone. */
            apir_graph_delta_stale(d);
            rc = -1;
        } else if (rc == -1 && d->inputs.count) {
            apir_inputs_flush_locked(d);  /* they did not fit beside it: sent first */
        }
    }
    if (rc == -1 && (!to_whole || apir_graph_delta_whole_to_data(d, size))) {
        if (d->inputs.count)
            rc = compute_with_inputs_locked(d, uid, size, 0, status);
        if (rc == -1 && d->inputs.count) {
            /* The uploads did not fit beside the graph: they go first,
             * through the data area, and the graph is written there again. */
            apir_inputs_flush_locked(d);
            uint32_t n_sent;
            size = to_whole ? (apir_graph_delta_whole_to_data(d, size) ? size : 0)
                            : apir_graph_serialize(d, cgraph, true, false, &n_sent);
        }
        if (rc == -1 && size && apir_remote_put_data_locked(r, 0, r->data, size))
            rc = apir_call_BACKEND_GRAPH_COMPUTE_KEYED_locked(r, r->data_res_id, 0, size, uid, status);
    }
    apir_graph_delta_done(d, uid, to_whole, size, as_delta, rc);
    return rc;
}

/*
 * A graph whose uid the host keeps is recomputed by uid: nothing is
 * serialized, sent or decoded again (the token path).  ggml's scheduler gives
 * a graph a new uid whenever it splits it anew, so an equal uid means the
 * same nodes, tensors and placements; only tensor contents change, and those
 * the host re-checks where they matter (index values).
 */
static enum ggml_status graph_compute(ggml_backend_t backend, struct ggml_cgraph *cgraph)
{
    struct apir_device *d = backend->context;
    struct apir_remote *r = &d->remote;
    uint32_t status = GGML_STATUS_FAILED;
#if APIR_GGML_HAS_GRAPH_UID
    const uint64_t uid = cgraph->uid;
#else
    const uint64_t uid = 0;  /* a ggml that names no reused graph: each is sent */
#endif
    const bool keyed = uid != 0 && apir_minor_speaks(r->minor, APIR_CMD_BACKEND_GRAPH_COMPUTE_KEYED);
    pthread_mutex_lock(&r->lock);
    if (apir_remote_gone_locked(r)) {
        /* The scheduler placed this graph here while the host lived; it
         * fails now, with a status the program sees (llama_decode's error). */
        APIR_ERROR("guest", "%s: a graph of %d nodes not computed: the host at %s is gone", d->name,
                   ggml_graph_n_nodes(cgraph), r->endpoint);
        pthread_mutex_unlock(&r->lock);
        return GGML_STATUS_FAILED;
    }
    /* Only a keyed graph carries the uploads waiting for it. */
    if (!keyed)
        apir_inputs_flush_locked(d);
    if (keyed && uid_is_kept(d, uid)) {
        const bool carries = d->inputs.count != 0;
        int rc = carries ? compute_with_inputs_locked(d, uid, 0, 0, &status) : -1;
        if (rc == -1 && d->inputs.count)
            apir_inputs_flush_locked(d);  /* they did not fit the data area: sent plain */
        else if (rc == -1 && carries) {
            pthread_mutex_unlock(&r->lock);  /* not sent, logged: the graph would read stale inputs */
            return GGML_STATUS_FAILED;
        }
        if (rc == -1)
            rc = apir_call_BACKEND_GRAPH_RECOMPUTE_locked(r, uid, &status);
        if (rc == APIR_HANDLER_OK) {
            pthread_mutex_unlock(&r->lock);
            return (enum ggml_status)status;
        }
        uid_forget(d, uid);
        status = GGML_STATUS_FAILED;
        if (rc != APIR_HANDLER_STALE) {
            pthread_mutex_unlock(&r->lock);
            return GGML_STATUS_FAILED;
        }
    }
    uint64_t t0 = r->profile || r->trace ? apir_now_ns() : 0;
    uint32_t n_sent = 0;
    const bool to_whole = keyed && apir_graph_delta_wanted(d);
    size_t size = apir_graph_serialize(d, cgraph, keyed, to_whole, &n_sent);
    if (r->profile || r->trace) {
        const uint64_t t1 = apir_now_ns();
        d->serialize_ns += t1 - t0;
        d->serialize_count++;
        apir_remote_trace(r, "(serialize)", t0, t1, size);
    }
    if (!size && n_sent == 0) {
        /* No node, or only no-op views of other devices' memory: nothing to compute. */
        pthread_mutex_unlock(&r->lock);
        return GGML_STATUS_SUCCESS;
    }
    int rc = -1;
    if (!size) {
        APIR_ERROR("guest", "%s: cannot serialize a graph of %d nodes", d->name, ggml_graph_n_nodes(cgraph));
    } else if (keyed) {
        rc = send_keyed_locked(d, cgraph, uid, size, to_whole, &status);
    } else if (apir_remote_put_data_locked(r, 0, r->data, size)) {
        /* The host's last graph is this one now, which no delta names. */
        apir_graph_delta_forget(d);
        rc = apir_call_BACKEND_GRAPH_COMPUTE_locked(r, r->data_res_id, size, &status);
    }
    if (rc != APIR_HANDLER_OK)
        status = GGML_STATUS_FAILED;
    else if (keyed) {
        d->kept_uids[d->kept_next] = uid;
        d->kept_next = (d->kept_next + 1) % APIR_KEPT_GRAPHS;
    }
    pthread_mutex_unlock(&r->lock);
    return (enum ggml_status)status;
}

/* The scheduler's call as a whole, for APIR_TRACE's timeline: what the guest
 * did around the commands inside it. */
static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph *cgraph)
{
    struct apir_remote *r = &((struct apir_device *)backend->context)->remote;
    if (!apir_remote_tracing(r))
        return graph_compute(backend, cgraph);
    const uint64_t t0 = apir_now_ns();
    const enum ggml_status status = graph_compute(backend, cgraph);
    pthread_mutex_lock(&r->lock);
    apir_remote_trace(r, "(graph_compute)", t0, apir_now_ns(), (uint64_t)ggml_graph_n_nodes(cgraph));
    pthread_mutex_unlock(&r->lock);
    return status;
}

static const struct ggml_backend_i apir_backend_iface = {
    .get_name = backend_get_name,
    .free = backend_free,
    .set_tensor_async = NULL,
    .get_tensor_async = NULL,
#if APIR_GGML_HAS_BACKEND_2D_ASYNC
    .set_tensor_2d_async = NULL,
    .get_tensor_2d_async = NULL,
#endif
    .cpy_tensor_async = NULL,
    .synchronize = backend_synchronize,
    .graph_plan_create = NULL,
    .graph_plan_free = NULL,
    .graph_plan_update = NULL,
    .graph_plan_compute = NULL,
    .graph_compute = backend_graph_compute,
    .event_record = backend_event_record,
    .event_wait = backend_event_wait,
    .graph_optimize = NULL,
};

ggml_backend_t apir_backend_new(struct apir_device *d)
{
    ggml_backend_t backend = calloc(1, sizeof(*backend));
    if (!backend)
        return NULL;
    backend->guid = apir_guid();
    backend->iface = apir_backend_iface;
    backend->device = &d->dev;
    backend->context = d;
    return backend;
}
