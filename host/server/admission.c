/*
 * Admission: who a connection is and what it may cost (server_impl.h says
 * how tenants are kept).  A tenant is a local peer's container - its
 * cgroup, read at accept from the kernel's word (SO_PEERCRED), with its
 * uid - or its uid, or a stream peer's address.  Before its hello a
 * connection takes a place among the pending within its tenant's connection
 * count and connect bucket, nothing else; once its hello is in, its
 * tenant's spawn bucket pays for the worker process or the session.  So a
 * peer that connects and hangs up in a loop, or holds silent connections,
 * exhausts only its own buckets and counts.  Refusals reach the peer as a
 * message it can read, and the log with who was refused (by what the
 * kernel says of it, never by what its hello claims).
 */
#include "server.h"
#include "server_impl.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
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

/* The peer's process name as this host sees it: chosen by the guest (a
 * hint, never an identity), so escaped (apir_log_escape).  Not in a
 * sandboxed worker: it may open nothing. */
void apir_peer_comm(pid_t pid, char *buf, size_t len)
{
    buf[0] = '\0';
    char path[40];
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0)
        return;
    char raw[32];
    ssize_t n = read(fd, raw, sizeof(raw) - 1);
    close(fd);
    if (n <= 0)
        return;
    if (raw[n - 1] == '\n')  /* the kernel's, not the name's */
        n--;
    apir_log_escape(raw, (size_t)n, buf, len);
}

void apir_peer_describe(const struct ucred *peer, bool with_comm, char *buf, size_t len)
{
    if (peer->uid == (uid_t)-1) {
        snprintf(buf, len, "peer credentials unknown");
        return;
    }
    char comm[APIR_LOG_ESCAPED_SIZE(16)] = "";
    if (with_comm)
        apir_peer_comm(peer->pid, comm, sizeof(comm));
    snprintf(buf, len, "pid %d, uid %u, gid %u%s%s%s", (int)peer->pid, (unsigned)peer->uid, (unsigned)peer->gid,
             comm[0] ? ", comm \"" : "", comm, comm[0] ? "\"" : "");
}

/* Sends why and logs it with who was refused. */
void apir_peer_refuse(int fd, const char *message, bool with_comm)
{
    struct apir_shm_hello_reply r = { .magic = APIR_SHM_MAGIC, .status = 1 };
    snprintf(r.message, sizeof(r.message), "%s", message);
    apir_send_fds(fd, &r, sizeof(r), NULL, 0);
    struct ucred peer;
    char who[160];
    apir_peer_cred(fd, &peer);
    apir_peer_describe(&peer, with_comm, who, sizeof(who));
    APIR_WARN("host", "guest refused (%s): %s", who, message);
}

/* In the daemon (or the one process of --isolation thread). */
void apir_server_refuse(struct apir_server *srv, int fd, const char *message)
{
    srv->refused_connections++;
    apir_peer_refuse(fd, message, true);
}

/* ---- admission ------------------------------------------------------------ */

/* Key tags: what kind of identity a tenant key names (its top byte). */
enum { TENANT_UID = 1, TENANT_CGROUP = 2 };
#define TENANT_KEY(tag, value) (((uint64_t)(tag) << 56) | ((value) & 0x00FFFFFFFFFFFFFFull))

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  /* Linux 6.5 */
#endif

static uint64_t fnv1a64(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/*
 * The peer's cgroup membership, /proc/PID/cgroup as the kernel writes it
 * (every hierarchy, v1 and v2): read at accept, so that the process that
 * connected is (almost always) still there.  Where the kernel gives a
 * pidfd of the peer (SO_PEERPIDFD), that process must still be alive after
 * the read - then PID was not reused by another process meanwhile; without
 * one, a peer that exits and whose pid is reused within microseconds could
 * be charged to another process's cgroup.  False (the caller falls back to
 * the uid) when it cannot be read.
 */
static bool peer_cgroup(int fd, pid_t pid, char *text, size_t len, size_t *n_out)
{
    if (pid <= 0)
        return false;
    int pidfd = -1;
    socklen_t pl = sizeof(pidfd);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &pl) != 0)
        pidfd = -1;
    char path[40];
    snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
    int cfd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = cfd >= 0 ? read(cfd, text, len - 1) : -1;
    if (cfd >= 0)
        close(cfd);
    bool ok = n > 0;
#ifdef SYS_pidfd_send_signal
    if (ok && pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0 && errno != EPERM)
        ok = false;  /* gone: the pid may name another process now */
#endif
    if (pidfd >= 0)
        close(pidfd);
    if (!ok)
        return false;
    text[n] = '\0';
    *n_out = (size_t)n;
    return true;
}

/* What to call a cgroup membership in log lines: the v2 path, else the
 * first v1 hierarchy placed below its root, else "/". */
static void cgroup_name(const char *text, char *out, size_t len)
{
    const char *pick = NULL;
    size_t pick_len = 0;
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        const size_t n = eol ? (size_t)(eol - line) : strlen(line);
        const char *path = memchr(line, ':', n);
        path = path ? memchr(path + 1, ':', n - (size_t)(path + 1 - line)) : NULL;
        if (path) {
            path++;
            const size_t plen = n - (size_t)(path - line);
            const bool root = plen == 1 && path[0] == '/';
            if (!strncmp(line, "0::", 3) && !root) {
                pick = path;
                pick_len = plen;
                break;
            }
            if (!root && !pick) {
                pick = line;  /* "N:controller:path" */
                pick_len = n;
            }
        }
        line += n + (eol ? 1 : 0);
    }
    if (!pick) {
        snprintf(out, len, "/");
        return;
    }
    /* The cgroup's name may be the guest's choosing (a delegated subtree). */
    apir_log_escape(pick, pick_len, out, len);
}

/* A local peer's tenant: its uid and, --tenant-by cgroup, its cgroups. */
uint64_t apir_tenant_local_key(const struct apir_server *srv, int fd, const struct ucred *peer, char *name,
                                 size_t len)
{
    char text[4096];
    size_t n = 0;
    if (srv->host->cfg.tenant_by == APIR_TENANT_BY_CGROUP && peer_cgroup(fd, peer->pid, text, sizeof(text), &n)) {
        char cg[72];
        cgroup_name(text, cg, sizeof(cg));
        snprintf(name, len, "uid %u, cgroup %s", (unsigned)peer->uid, cg);
        /* The uid too: processes of two users in one cgroup (no containers,
         * a host without systemd) stay apart, as with --tenant-by uid. */
        uint64_t h = fnv1a64(&peer->uid, sizeof(peer->uid), 0xcbf29ce484222325ull);
        return TENANT_KEY(TENANT_CGROUP, fnv1a64(text, n, h));
    }
    snprintf(name, len, "uid %u", (unsigned)peer->uid);
    return TENANT_KEY(TENANT_UID, (uint64_t)peer->uid);
}

static void tenant_refill(const struct apir_limits *l, struct apir_tenant *t, uint64_t now)
{
    const double dt = (double)(now - t->refill_ns) * 1e-9;
    const double connect_max = l->connect_burst ? l->connect_burst : 1, spawn_max = l->spawn_burst ? l->spawn_burst : 1;
    t->connect_tokens += dt * l->connect_per_s;
    t->spawn_tokens += dt * l->spawn_per_s;
    if (t->connect_tokens > connect_max)
        t->connect_tokens = connect_max;
    if (t->spawn_tokens > spawn_max)
        t->spawn_tokens = spawn_max;
    t->refill_ns = now;
}

struct apir_tenant *apir_tenant_enter(struct apir_server *srv, uint64_t key, const char *name)
{
    const struct apir_limits *l = &srv->host->cfg.limits;
    const uint64_t now = apir_now_ns();
    struct apir_tenant *t = NULL;
    if (!srv->tenants)
        srv->tenants = calloc(APIR_MAX_TENANTS, sizeof(*srv->tenants));
    if (!srv->tenants) {
        /* No table: one shared entry on the stack's behalf - admission
         * then only counts connections (no buckets). */
        static _Thread_local struct apir_tenant none;
        none = (struct apir_tenant){ .key = key, .connect_tokens = 1e9, .spawn_tokens = 1e9, .refill_ns = now };
        srv->tenant_now = &none;
        srv->log_before = apir_log_budget_enter(NULL);
        return &none;
    }
    for (uint32_t i = 0; i < srv->n_tenants && !t; i++)
        if (srv->tenants[i].key == key)
            t = &srv->tenants[i];
    if (!t) {
        if (srv->n_tenants < APIR_MAX_TENANTS) {
            t = &srv->tenants[srv->n_tenants++];
        } else {
            /* Full: the least recently seen makes room.  Its counts live in
             * the connection lists, not here; it only gets full buckets
             * when it comes back. */
            t = &srv->tenants[0];
            for (uint32_t i = 1; i < srv->n_tenants; i++)
                if (srv->tenants[i].seen_ns < t->seen_ns)
                    t = &srv->tenants[i];
        }
        *t = (struct apir_tenant){ .key = key, .connect_tokens = l->connect_burst ? l->connect_burst : 1,
                                   .spawn_tokens = l->spawn_burst ? l->spawn_burst : 1, .refill_ns = now };
        if (name)
            snprintf(t->name, sizeof(t->name), "%s", name);
        else
            snprintf(t->name, sizeof(t->name), "tenant %016llx", (unsigned long long)key);
        char who[sizeof(t->name) + 16];
        snprintf(who, sizeof(who), "connections of %s", t->name);
        apir_log_budget_init(&t->log, who, l->guest_log_per_s, l->guest_log_burst);
    }
    t->seen_ns = now;
    tenant_refill(l, t, now);
    srv->tenant_now = t;
    srv->log_before = apir_log_budget_enter(&t->log);
    return t;
}

void apir_tenant_leave(struct apir_server *srv)
{
    apir_log_budget_leave(srv->log_before);
    srv->log_before = NULL;
    srv->tenant_now = NULL;
}

/* Connections of one tenant: waiting for their hello, and served (workers,
 * or clients on threads here). */
static uint32_t tenant_connections(const struct apir_server *srv, uint64_t key)
{
    uint32_t n = 0;
    if (srv->worker_argv)
        for (uint32_t i = 0; i < srv->host->cfg.limits.max_clients; i++)
            n += srv->children[i].pid != 0 && srv->children[i].tenant == key;
    for (const struct apir_client *c = srv->clients; c; c = c->next)
        n += c->tenant == key;
    for (uint32_t i = 0; i < srv->n_pending; i++)
        n += srv->pending[i].tenant == key;
    return n;
}

const char *apir_admit_connection(struct apir_server *srv, struct apir_tenant *t)
{
    const struct apir_limits *l = &srv->host->cfg.limits;
    if (l->max_clients_per_tenant && tenant_connections(srv, t->key) >= l->max_clients_per_tenant) {
        snprintf(srv->admission_why, sizeof(srv->admission_why),
                 "too many connections from this tenant (%s: %u; --max-clients-per-tenant)", t->name,
                 l->max_clients_per_tenant);
        return srv->admission_why;
    }
    if (l->connect_per_s) {
        if (t->connect_tokens < 1.0) {
            snprintf(srv->admission_why, sizeof(srv->admission_why),
                     "too many new connections from this source (%s); retry later (--connect-rate)", t->name);
            return srv->admission_why;
        }
        t->connect_tokens -= 1.0;
    }
    return NULL;
}

const char *apir_admit_guest(struct apir_server *srv, struct apir_tenant *t)
{
    const struct apir_limits *l = &srv->host->cfg.limits;
    if (!t || !l->spawn_per_s)
        return NULL;
    if (t->spawn_tokens < 1.0) {
        snprintf(srv->admission_why, sizeof(srv->admission_why),
                 "too many new guests from this tenant (%s); retry later (--spawn-rate)", t->name);
        return srv->admission_why;
    }
    t->spawn_tokens -= 1.0;
    return NULL;
}

void apir_tenant_spawned(struct apir_server *srv, uint64_t tenant, uint32_t children_before)
{
    if (!srv->children || srv->n_children <= children_before)
        return;  /* no worker was started */
    for (uint32_t i = 0; i < srv->host->cfg.limits.max_clients; i++)
        if (srv->children[i].pid != 0 && srv->children[i].client_id == srv->next_id)
            srv->children[i].tenant = tenant;
}
