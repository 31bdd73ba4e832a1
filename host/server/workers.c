/*
 * Worker processes (apir-host's process isolation): each guest is served by
 * a fresh process - this program re-executed with --serve-fd - in a slot,
 * so a guest that makes a backend abort, or that a kernel cannot stop,
 * takes down only its worker.
 * The daemon starts, counts, reaps and, at its end, stops them; a worker
 * watches its own guest and command clock.
 *
 * Each worker gets a stats page (host_stats.h): one sealed memfd page of
 * its own, made here at spawn and passed as --stats-fd, which it maps before
 * its sandbox and updates after each command; the daemon keeps its own
 * mapping to read it (apir stat) and, once the worker is reaped, adds its
 * last counters to the totals.  One memfd per worker: a worker cannot reach
 * another's page.
 *
 * How a worker starts (sandbox.h, apir_workers_sandbox): in PID, IPC and
 * mount namespaces of its own where the kernel allows them, so that even a
 * worker running a guest's code sees and can signal no other process, and
 * with a uid no other live worker has.  The worker's own side of its
 * sandbox - the uid switch, limits, seccomp - is sandbox.c.
 */
#include "server_impl.h"

#include "apir_log.h"
#include "sandbox.h"
#include "wait.h"
#include "weight_cache.h"
#include "worker_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The daemon's SIGCHLD handler writes here to wake its main loop. */
static int sigchld_fd = -1;

static void on_sigchld(int sig)
{
    (void)sig;
    char b = 1;
    if (sigchld_fd >= 0) {
        ssize_t r = write(sigchld_fd, &b, 1);
        (void)r;
    }
}

/* A worker's stats page: a memfd of one page, sealed at that size (the
 * worker can neither shrink it under the daemon's mapping nor grow it),
 * mapped here with its header written.  -1 (and no page) if it cannot be
 * made: the worker then serves without one. */
static int stats_page_new(struct apir_stats_page **page)
{
    *page = NULL;
    int fd = memfd_create("apir-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, APIR_STATS_PAGE_SIZE) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, APIR_STATS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return -1;
    }
    *page = p;
    apir_stats_page_init(*page);
    return fd;
}

static void stats_page_free(struct apir_stats_page *page)
{
    if (page)
        munmap(page, APIR_STATS_PAGE_SIZE);
}

/* Process isolation: hand the connection to a new worker process in a free
 * slot, with a uid of the pool (sandbox.h). */
void apir_workers_spawn(struct apir_server *srv, int fd, const struct ucred *peer, const char *stream_peer,
                        bool stream_tls)
{
    uint32_t slot = 0;
    const uint32_t n_slots = srv->host->cfg.limits.max_clients;
    while (slot < n_slots && srv->children[slot].pid != 0)
        slot++;
    if (slot == n_slots) {
        if (stream_peer) {
            apir_stream_refuse(srv, fd, stream_peer, stream_tls, "too many clients");
        } else {
            apir_server_refuse(srv, fd, "too many clients");
            apir_server_linger_close(srv, fd);
        }
        return;
    }
    uint64_t id = ++srv->next_id;
    struct apir_stats_page *page;
    const int stats_fd = stats_page_new(&page);
    if (stats_fd < 0)
        APIR_WARN("host", "guest#%llu: no stats page (%s): apir stat will show it without counters",
                  (unsigned long long)id, strerror(errno));
    char fd_arg[16], id_arg[24], slot_arg[16], stats_arg[16];
    snprintf(fd_arg, sizeof(fd_arg), "%d", fd);
    snprintf(id_arg, sizeof(id_arg), "%llu", (unsigned long long)id);
    snprintf(slot_arg, sizeof(slot_arg), "%u", slot);
    snprintf(stats_arg, sizeof(stats_arg), "%d", stats_fd);
    int argc = 0;
    while (srv->worker_argv[argc])
        argc++;
    /* Weight cache (weight_cache.h): the worker's socket to the daemon's cache, -1 if none. */
    const int cache_fd = apir_wcache_service_connect();
    char cache_arg[16];
    snprintf(cache_arg, sizeof(cache_arg), "%d", cache_fd);
    /* + 2: --weight-cache-fd N; + 1: --stream-tls; + 2: --worker-uid N; + 2: --peer-cred C; + 2: --log-fd N;
     * + 2: --lane-fd N */
    char **argv = calloc((size_t)argc + 24, sizeof(char *));
    if (!argv) {
        if (stream_peer) {
            apir_stream_refuse(srv, fd, stream_peer, stream_tls, "out of memory");
        } else {
            apir_server_refuse(srv, fd, "out of memory");
            close(fd);
        }
        if (stats_fd >= 0)
            close(stats_fd);
        if (cache_fd >= 0)  /* weight cache */
            close(cache_fd);
        stats_page_free(page);
        return;
    }
    for (int i = 0; i < argc; i++)
        argv[i] = srv->worker_argv[i];
    argv[argc++] = stream_peer ? "--serve-stream-fd" : "--serve-fd";
    argv[argc++] = fd_arg;
    if (stream_peer) {
        argv[argc++] = "--peer-name";
        argv[argc++] = (char *)stream_peer;
    }
    if (stream_tls)
        argv[argc++] = "--stream-tls";
    argv[argc++] = "--client-id";
    argv[argc++] = id_arg;
    argv[argc++] = "--worker-slot";
    argv[argc++] = slot_arg;
    if (stats_fd >= 0) {
        argv[argc++] = "--stats-fd";
        argv[argc++] = stats_arg;
    }
    if (cache_fd >= 0) {  /* weight cache */
        argv[argc++] = "--weight-cache-fd";
        argv[argc++] = cache_arg;
    }
    /* Its guest as seen here: the worker's namespaces may hide its pid and uid. */
    char cred_arg[48];
    snprintf(cred_arg, sizeof(cred_arg), "%d:%u:%u", (int)peer->pid, (unsigned)peer->uid, (unsigned)peer->gid);
    if (!stream_peer) {
        argv[argc++] = "--peer-cred";
        argv[argc++] = cred_arg;
    }
    /* A stream guest's lanes (stream_proto.h): the joins this daemon
     * takes for it are passed on a socket of its own, whose first message
     * is the ticket they must present.  This daemon only writes to it: a
     * worker running a guest's code can tell it nothing. */
    int lane_pair[2] = { -1, -1 };
    uint8_t ticket[APIR_STREAM_TICKET_BYTES];
    if (stream_peer && srv->host->cfg.max_lanes > 0) {
        if (getrandom(ticket, sizeof(ticket), 0) != (ssize_t)sizeof(ticket) ||
            socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, lane_pair) != 0 ||
            send(lane_pair[0], ticket, sizeof(ticket), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(ticket) ||
            shutdown(lane_pair[0], SHUT_RD) != 0 || fcntl(lane_pair[0], F_SETFL, O_NONBLOCK) != 0) {
            APIR_WARN("host", "guest#%llu: no lanes (%s)", (unsigned long long)id, strerror(errno));
            if (lane_pair[0] >= 0) {
                close(lane_pair[0]);
                close(lane_pair[1]);
            }
            lane_pair[0] = lane_pair[1] = -1;
        }
    }
    char lane_arg[16];
    snprintf(lane_arg, sizeof(lane_arg), "%d", lane_pair[1]);
    if (lane_pair[1] >= 0) {
        argv[argc++] = "--lane-fd";
        argv[argc++] = lane_arg;
    }
    /* Its stderr, read by this daemon (worker_log.h); -1: this daemon's stderr. */
    const int log_fd = apir_worker_log_open(id, srv->host->cfg.limits.guest_log_per_s,
                                            srv->host->cfg.limits.guest_log_burst);
    char log_arg[16];
    snprintf(log_arg, sizeof(log_arg), "%d", log_fd);
    if (log_fd >= 0) {
        argv[argc++] = "--log-fd";
        argv[argc++] = log_arg;
    }
    const int64_t uid = apir_worker_uid_take();
    char uid_arg[16];
    snprintf(uid_arg, sizeof(uid_arg), "%lld", (long long)uid);
    if (uid >= 0) {
        argv[argc++] = "--worker-uid";
        argv[argc++] = uid_arg;
    }
    /* The worker inherits these descriptors only. */
    int keep[5], n_keep = 0;
    keep[n_keep++] = fd;
    if (stats_fd >= 0)
        keep[n_keep++] = stats_fd;
    if (cache_fd >= 0)  /* weight cache */
        keep[n_keep++] = cache_fd;
    if (log_fd >= 0)
        keep[n_keep++] = log_fd;
    if (lane_pair[1] >= 0)
        keep[n_keep++] = lane_pair[1];
    const struct apir_worker_exec exec = { .argv = argv, .keep = keep, .n_keep = (unsigned)n_keep, .stdin_fd = -1,
                                           .uid = uid };
    pid_t pid = apir_worker_exec(&exec);
    free(argv);
    close(fd);
    if (stats_fd >= 0)
        close(stats_fd);  /* the mapping stays */
    if (cache_fd >= 0)  /* weight cache: the worker's end */
        close(cache_fd);
    if (log_fd >= 0)  /* its stderr: the worker's end */
        close(log_fd);
    if (lane_pair[1] >= 0)  /* lanes: the worker's end */
        close(lane_pair[1]);
    if (pid < 0) {
        APIR_ERROR("host", "cannot start a worker process: %s", strerror(errno));
        stats_page_free(page);
        apir_worker_uid_release(uid);
        if (lane_pair[0] >= 0)
            close(lane_pair[0]);
        explicit_bzero(ticket, sizeof(ticket));
        return;
    }
    srv->children[slot] = (struct worker_slot){ .pid = pid, .client_id = id, .peer = *peer,
                                                .started_ns = apir_now_ns(), .stats = page, .uid = uid,
                                                .lane_sock = lane_pair[0] };
    memcpy(srv->children[slot].lane_ticket, ticket, sizeof(ticket));
    explicit_bzero(ticket, sizeof(ticket));
    if (stream_peer)  /* no process to name: its address instead (cut to fit) */
        snprintf(srv->children[slot].comm, sizeof(srv->children[slot].comm), "%s", stream_peer);
    else
        apir_peer_comm(peer->pid, srv->children[slot].comm, sizeof(srv->children[slot].comm));
    srv->n_children++;
    /* The guest's name in the worker's own lines: guest#N(pid P). */
    char who[128];
    if (stream_peer)
        snprintf(who, sizeof(who), "%s", stream_peer);
    else
        apir_peer_describe(peer, true, who, sizeof(who));
    APIR_INFO("host", "guest#%llu (%s): worker process %d, slot %u", (unsigned long long)id, who, (int)pid, slot);
    apir_server_status_changed(srv);
}

void apir_workers_reap(struct apir_server *srv)
{
    char buf[64];
    while (read(srv->child_pipe[0], buf, sizeof(buf)) > 0)
        ;
    pid_t pid;
    int status;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (uint32_t i = 0; i < srv->host->cfg.limits.max_clients; i++) {
            if (srv->children[i].pid != pid)
                continue;
            srv->children[i].pid = 0;
            srv->n_children--;
            apir_worker_uid_release(srv->children[i].uid);  /* no live worker has it now */
            /* Its last counters join the totals; the page goes. */
            struct apir_guest_counters last;
            apir_stats_read(srv->children[i].stats, &last);
            apir_stats_retire(&srv->retired, &last);
            stats_page_free(srv->children[i].stats);
            srv->children[i].stats = NULL;
            if (srv->children[i].lane_sock >= 0)
                close(srv->children[i].lane_sock);
            srv->children[i].lane_sock = -1;
            explicit_bzero(srv->children[i].lane_ticket, sizeof(srv->children[i].lane_ticket));
            /* The first process of its PID namespace ends an abort with
             * abort's status (sandbox.c). */
            const int sig = WIFSIGNALED(status) ? WTERMSIG(status)
                            : WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGABRT ? SIGABRT : 0;
            if (sig)
                APIR_WARN("host", "worker process %d (guest#%llu, pid %d, uid %u) died of signal %d; its guest is "
                          "disconnected, others go on", (int)pid, (unsigned long long)srv->children[i].client_id,
                          (int)srv->children[i].peer.pid, (unsigned)srv->children[i].peer.uid, sig);
            apir_server_status_changed(srv);
            break;
        }
    }
}

uint32_t apir_workers_rows(struct apir_server *srv, struct apir_guest_row *rows, uint32_t max)
{
    uint32_t n = 0;
    const uint32_t n_slots = srv->children ? srv->host->cfg.limits.max_clients : 0;
    for (uint32_t i = 0; i < n_slots && n < max; i++) {
        const struct worker_slot *w = &srv->children[i];
        if (!w->pid)
            continue;
        struct apir_guest_row *r = &rows[n++];
        /* Who it is: the daemon's own records; what it did: its page. */
        *r = (struct apir_guest_row){ .id = w->client_id, .pid = w->peer.pid, .uid = w->peer.uid, .gid = w->peer.gid,
                                      .worker_pid = w->pid, .slot = (int32_t)i, .connected_ns = w->started_ns };
        snprintf(r->comm, sizeof(r->comm), "%s", w->comm);
        r->readable = apir_stats_read(w->stats, &r->c);
    }
    return n;
}

bool apir_server_isolate(struct apir_server *srv, char **worker_argv)
{
    srv->children = calloc(srv->host->cfg.limits.max_clients ? srv->host->cfg.limits.max_clients : 1,
                           sizeof(*srv->children));
    if (!srv->children)
        return false;
    srv->worker_argv = worker_argv;
    sigchld_fd = srv->child_pipe[1];
    struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP };
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGCHLD, &sa, NULL) == 0;
}

/*
 * How long a worker whose guest hung up waits for the command in progress
 * before it gives up on an orderly end.  The usual case is no command at
 * all, or one that has already answered: the guest read its reply and
 * exited while the serving thread had not yet marked itself idle (or ran
 * a graph the guest will never read).  Such a command ends within
 * microseconds to milliseconds, and then the session ends the normal way
 * (its buffers freed, its weight cache line logged).
 */
#define WORKER_HANGUP_GRACE_NS (250ull * 1000000ull)

/*
 * A worker process's guest hung up in the middle of a command, or a command
 * ran past its budget: the kernel computing cannot be stopped from outside
 * (a single node may run for minutes), so past a short grace (hang-up) or
 * the budget the process ends, now, without unwinding - the kernel reclaims
 * all of it, and nobody else is served here.
 */
void apir_worker_watch(struct apir_server *srv, bool hung_up)
{
    struct apir_client *c = srv->clients;
    if (srv->listen_fd >= 0 || !c)
        return;
    const uint64_t budget_ns = (uint64_t)srv->host->cfg.limits.graph_timeout_ms * 1000000ull;
    uint64_t since = atomic_load_explicit(&c->busy_since_ns, memory_order_relaxed);
    if (!since)
        return;
    if (hung_up) {
        /* Teardown, not the hot path: a bounded wait in 1 ms steps. */
        const uint64_t give_up = apir_now_ns() + WORKER_HANGUP_GRACE_NS;
        while (atomic_load_explicit(&c->busy_since_ns, memory_order_relaxed) && apir_now_ns() < give_up)
            nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
        if (!atomic_load_explicit(&c->busy_since_ns, memory_order_relaxed))
            return;
        APIR_WARN("host", "%s: the guest left in the middle of a command: ending its worker", c->session->name);
        _exit(0);
    }
    if (budget_ns && apir_now_ns() - since > budget_ns) {
        APIR_WARN("host", "%s: a command ran past the %u ms budget (--graph-timeout-ms): ending its worker",
                  c->session->name, srv->host->cfg.limits.graph_timeout_ms);
        _exit(1);
    }
}

void apir_workers_stop(struct apir_server *srv)
{
    const uint32_t n_slots = srv->children ? srv->host->cfg.limits.max_clients : 0;
    for (uint32_t i = 0; i < n_slots; i++)
        if (srv->children[i].pid)
            kill(srv->children[i].pid, SIGTERM);
    /* A bounded wait (this is shutdown, not a hot path). */
    for (int i = 0; i < 500 && srv->n_children > 0; i++) {
        apir_workers_reap(srv);
        if (srv->n_children)
            usleep(10000);
    }
    for (uint32_t i = 0; i < n_slots; i++) {
        if (srv->children[i].pid) {
            kill(srv->children[i].pid, SIGKILL);
            if (srv->children[i].lane_sock >= 0)
                close(srv->children[i].lane_sock);
        }
        stats_page_free(srv->children[i].stats);
    }
    free(srv->children);
    srv->children = NULL;
    /* Their stderr pipes end with them: their last lines logged. */
    if (n_slots && !apir_worker_log_drain(1000))
        APIR_WARN("host", "some worker's stderr was still open at shutdown");
}
