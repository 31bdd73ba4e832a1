/*
 * One guest's client (server_impl.h), whichever framing serves it (shm:
 * client_shm.c, stream: stream.c) and wherever (a thread of the daemon, or a
 * worker process): its lifetime, the transport's own commands (blobs by
 * descriptor or by file), and handing every other command to its session.
 * A client is freed by whichever of its server and its serving thread lets
 * go last (a reference count), so a guest that dies mid-graph is freed when
 * the graph returns.
 */
#include "server.h"
#include "server_impl.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "lanes.h"
#include "service.h"
#include "dispatcher.h"
#include "net.h"
#include "shm_proto.h"
#include "tls.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void apir_client_unmap_release(void *ptr, size_t size, void *user)
{
    (void)user;
    munmap(ptr, size);
}

void apir_client_put(struct apir_client *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->session)
        APIR_INFO("host", "%s: disconnected after %llu commands (%llu graphs, %llu of them kept and recomputed, %llu refused); "
                  "freeing %u buffers", c->session->name, (unsigned long long)c->session->stats.n_commands,
                  (unsigned long long)c->session->stats.n_graphs, (unsigned long long)c->session->stats.n_recomputes,
                  (unsigned long long)c->session->stats.n_refused, c->session->n_buffers);
    if (c->session)
        apir_session_log_profile(c->session);
    /* Its lanes first: none reads a blob the session frees. */
    apir_lanes_free(c->lanes);
    apir_session_free(c->session);
    if (c->stats_owned)
        free(c->stats);
    if (c->ctrl)
        munmap(c->ctrl, sizeof(*c->ctrl));
    explicit_bzero(c->lane_ticket, sizeof(c->lane_ticket));
    apir_tls_free(c->tls);
    close(c->fd);
    atomic_fetch_sub(&c->srv->n_clients, 1);
    free(c);
}

uint32_t apir_client_run_command(struct apir_client *c, const struct apir_cmd_header *hdr, struct apir_decoder *req,
                                 struct apir_encoder *reply, bool *handled)
{
    *handled = true;
    switch (hdr->cmd_type) {
    case APIR_CMD_TYPE_HANDSHAKE:
        return apir_session_handshake(c->session, req, reply);
    case APIR_CMD_TYPE_LOADLIBRARY:
        return APIR_LOAD_SUCCESS;  /* the daemon loaded its backend at start */
    case APIR_CMD_TYPE_FORWARD:
        return APIR_FORWARD_BASE + apir_session_forward(c->session, (uint32_t)hdr->cmd_flags, req, reply);
    default:
        *handled = false;
        return 0;
    }
}

/*
 * Ends a graph early (ggml's CPU backend asks between nodes): its guest has
 * gone, or the command has run past its time budget.
 */
static bool compute_should_stop(void *data)
{
    struct apir_client *c = data;
    if (atomic_load_explicit(&c->dead, memory_order_relaxed))
        return true;
    const uint64_t budget_ns = (uint64_t)c->srv->host->cfg.limits.graph_timeout_ms * 1000000ull;
    uint64_t since = atomic_load_explicit(&c->busy_since_ns, memory_order_relaxed);
    return budget_ns && since && apir_now_ns() - since > budget_ns;
}

/* Backends that take an abort callback (the CPU backend) get theirs now. */
static void set_abort_callbacks(struct apir_client *c)
{
    typedef void (*set_abort_fn)(ggml_backend_t, ggml_abort_callback, void *);
    struct apir_host *host = c->srv->host;
    for (uint32_t d = 0; d < host->n_devices; d++) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(host->devices[d]);
        set_abort_fn set_abort = (set_abort_fn)ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_abort_callback");
        ggml_backend_t be = set_abort ? apir_session_backend(c->session, d) : NULL;
        if (be)
            set_abort(be, compute_should_stop, c);
    }
}

struct apir_client *apir_client_new(struct apir_server *srv, const char *name, const struct ucred *peer,
                                   int32_t reported_pid, const char **why)
{
    struct apir_client *c = calloc(1, sizeof(*c));
    if (c)
        c->session = apir_session_new(srv->host, name);
    if (!c || !c->session) {
        free(c);
        *why = "out of memory";
        return NULL;
    }
    /* the transport computes accepted keyed graphs after the reply */
    c->session->defer_graphs = srv->host->cfg.defer_graphs;
    /* Counters for apir stat: the worker's shared page, else our own. */
    c->stats = srv->worker_stats;
    if (!c->stats) {
        c->stats = calloc(1, sizeof(*c->stats));
        c->stats_owned = c->stats != NULL;
        if (!c->stats) {
            apir_session_free(c->session);
            free(c);
            *why = "out of memory";
            return NULL;
        }
        apir_stats_page_init(c->stats);
    }
    c->srv = srv;
    c->fd = -1;
    c->peer = *peer;
    c->reported_pid = reported_pid;
    c->connected_ns = apir_now_ns();
    return c;
}

bool apir_client_serve(struct apir_client *c, int fd, void *(*fn)(void *))
{
    struct apir_server *srv = c->srv;
    c->fd = fd;
    apir_stats_publish(c->stats, c->session, APIR_GUEST_SERVING, 0, c->reported_pid);
    set_abort_callbacks(c);
    atomic_init(&c->refs, 2);  /* the main loop's and the serving thread's */
    atomic_fetch_add(&srv->n_clients, 1);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, fn, c) != 0) {
        pthread_attr_destroy(&attr);
        atomic_store(&c->refs, 1);
        apir_client_put(c);
        return false;
    }
    pthread_attr_destroy(&attr);
    c->next = srv->clients;
    srv->clients = c;
    apir_server_status_changed(srv);
    return true;
}
