/*
 * A session's whole life (dispatcher.h): the core's state (session.c)
 * plus each module's own, made and freed by its module.  The modules do not
 * refer to one another, so their order among themselves is free; they are
 * freed last: releasing a buffer drops its mirror and weight copies, and
 * nothing may be in flight on a slot's graph or from mirror memory.
 */
#include "dispatcher.h"

#include "buffers.h"
#include "download_pieces.h"
#include "graph_exec.h"
#include "import.h"
#include "op_policy.h"
#include "upload_mirror.h"
#include "weight_cache.h"
#include "weight_copies.h"

#include "apir_log.h"
#include "ggml.h"

#include <stdbool.h>
#include <stdlib.h>

static bool modules_new(struct apir_session *s)
{
    s->mirror = apir_mirror_new();
    s->pieces = apir_download_pieces_new();
    s->weights = apir_weights_new();
    s->policy = apir_policy_new();
    s->graphs = apir_graphs_new();
    return s->mirror && s->pieces && s->weights && s->policy && s->graphs;
}

static void modules_free(struct apir_session *s)
{
    apir_graphs_free(s->graphs);    /* kept graphs' contexts: their tensors name buffers, own none */
    apir_policy_free(s->policy);
    apir_weights_free(s->weights);  /* empty by now: each copy went with its buffer */
    apir_mirror_free(s->mirror);    /* uploads from its memory were waited for */
    apir_download_pieces_free(s->pieces);  /* none in flight: apir_session_free finished them first */
}

struct apir_session *apir_session_new(struct apir_host *host, const char *name)
{
    struct apir_session *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (!modules_new(s)) {
        modules_free(s);
        free(s);
        return NULL;
    }
    apir_session_init(s, host, name);
    return s;
}

void apir_session_free(struct apir_session *s)
{
    if (!s)
        return;
    /* Nothing runs on a device while memory it may use goes (a transport
     * finishes its download pieces within the frame; this is the backstop). */
    apir_download_pieces_finish(s->pieces);
    apir_session_settle(s);
    apir_wcache_log_session(s);
    /* Buffers before blobs (some wrap one: their references go with them)
     * and before the modules (a buffer takes its mirror and weight copies
     * with it); the streams once nothing is queued on them; the modules
     * last. */
    apir_buffers_release_all(s);
    apir_session_release(s);
    apir_import_scratch_free(&s->scratch);
    apir_import_memo_free(&s->import_memo);
    modules_free(s);
    apir_log_budget_flush(&s->log);
    free(s);
}
/* The entry with the most time among those not yet shown (and marks it), or
 * -1: the profile lines go from the largest down. */
static int next_largest(const uint64_t *ns, const uint64_t *count, bool *shown, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!shown[i] && count[i] && (best < 0 || ns[i] > ns[best]))
            best = i;
    if (best >= 0)
        shown[best] = true;
    return best;
}

void apir_session_log_profile(const struct apir_session *s)
{
    if (apir_log_get_level() < APIR_LOG_INFO)
        return;
    const struct apir_session_stats *st = &s->stats;
    if (s->stats.n_graphs)
        APIR_INFO("host", "%s: profile: graphs: import %.1f ms, index checks + compute %.1f ms (%llu graphs, %llu pieces)",
                  s->name, st->import_ns / 1e6, st->compute_ns / 1e6, (unsigned long long)s->stats.n_graphs,
                  (unsigned long long)s->stats.n_segments);
    /* A GPU's: a CPU computes on the host thread itself, nothing idles. */
    if (st->n_idle_gaps && s->host->device_memory)
        APIR_INFO("host", "%s: profile: device: waited for %.1f ms, then idle %.1f ms before %llu launches (%.1f us each)",
                  s->name, st->settle_wait_ns / 1e6, st->idle_before_launch_ns / 1e6,
                  (unsigned long long)st->n_idle_gaps, st->idle_before_launch_ns / 1e3 / (double)st->n_idle_gaps);
    if (st->n_upload_waits && s->host->device_memory)
        APIR_INFO("host", "%s: profile: uploads: waited %.1f ms for earlier uploads' copies (%llu times)", s->name,
                  st->upload_wait_ns / 1e6, (unsigned long long)st->n_upload_waits);
    apir_weights_log_profile(s);
    /* With cfg.op_profile each node was computed alone and waited for: where
     * the device's time goes, op by op (launch and wait costs included). */
    bool op_shown[GGML_OP_COUNT] = { false };
    for (int k = 0, o; k < 12 && s->host->cfg.op_profile && (o = next_largest(st->op_ns, st->op_count, op_shown, GGML_OP_COUNT)) >= 0; k++)
        APIR_INFO("host", "%s: profile: op %-16s %9llu nodes %10.1f ms total %8.2f us each", s->name,
                  ggml_op_name((enum ggml_op)o), (unsigned long long)st->op_count[o], st->op_ns[o] / 1e6,
                  st->op_ns[o] / 1e3 / (double)st->op_count[o]);
    /* The five commands with the most total time: the profile of a run. */
    bool shown[APIR_CMD_COUNT] = { false };
    for (int k = 0, c; k < 5 && (c = next_largest(st->cmd_ns, st->cmd_count, shown, APIR_CMD_COUNT)) >= 0; k++)
        APIR_INFO("host", "%s: profile: %-28s %8llu calls %10.1f ms total %8.2f us each", s->name,
                  apir_command_name((uint32_t)c), (unsigned long long)st->cmd_count[c], st->cmd_ns[c] / 1e6,
                  st->cmd_ns[c] / 1e3 / (double)st->cmd_count[c]);
}

