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
#include "shm_server_impl.h"

#include "apir_log.h"
#include "sandbox.h"
#include "wait.h"
#include "weight_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
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

/* ---- how a worker starts: its namespaces and uid (sandbox.h) ---------------- */

enum worker_ns {
    NS_NONE,        /* the daemon's own */
    NS_USER,        /* a user namespace of its own, which gives it the rest */
    NS_PRIVILEGED,  /* PID, IPC and mount namespaces (the daemon holds CAP_SYS_ADMIN) */
};

static struct {
    bool on;                  /* apir_workers_sandbox was called, the sandbox is on */
    enum worker_ns ns;
    bool own_proc;            /* its /proc shows its PID namespace only */
    uint32_t uid_base;
    uint32_t uid_count;       /* the pool; 0: workers keep the daemon's uid */
    uint32_t uid_next;        /* where the search for a free uid goes on */
    uint8_t *uid_held;        /* a bit per uid of the pool: held by a live worker */
    uint32_t *slot_uid;       /* per worker slot: the index of its worker's uid */
    uint32_t max_clients;
    uid_t daemon_uid;
    gid_t daemon_gid;
} spawn;

#define NO_UID UINT32_MAX

static int ns_flags(enum worker_ns ns)
{
    const int rest = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS;
    return ns == NS_USER ? CLONE_NEWUSER | rest : ns == NS_PRIVILEGED ? rest : 0;
}

static bool cap_effective(int cap)
{
    struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
    return syscall(SYS_capget, &h, d) == 0 && (d[cap / 32].effective & (1u << (cap % 32)));
}

/* Whether ids first .. first + count - 1 all exist in this process's user
 * namespace (path: /proc/self/uid_map or gid_map). */
static bool ids_mapped(const char *path, uint32_t first, uint32_t count)
{
    FILE *f = fopen(path, "re");
    unsigned long long inner, outer, n;
    bool ok = false;
    while (f && !ok && fscanf(f, "%llu %llu %llu", &inner, &outer, &n) == 3)
        ok = first >= inner && (unsigned long long)first + count <= inner + n;
    if (f)
        fclose(f);
    return ok;
}

static bool write_proc_file(pid_t pid, const char *name, const char *text)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    const size_t len = strlen(text);
    const bool ok = fd >= 0 && write(fd, text, len) == (ssize_t)len;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* A worker's user namespace: its root is the daemon's uid and gid (it loads
 * its backend with the daemon's rights, then switches to `uid`, which the
 * switch from root clears every capability with); a daemon that may not
 * map other ids maps its own, as themselves (the worker then holds no
 * capability at all after its exec). */
static bool write_id_maps(pid_t pid, uint32_t uid)
{
    char map[64];
    if (spawn.uid_count) {
        snprintf(map, sizeof(map), "0 %u 1\n%u %u 1\n", (unsigned)spawn.daemon_uid, uid, uid);
        if (!write_proc_file(pid, "uid_map", map))
            return false;
        snprintf(map, sizeof(map), "0 %u 1\n%u %u 1\n", (unsigned)spawn.daemon_gid, uid, uid);
        return write_proc_file(pid, "gid_map", map);
    }
    snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)spawn.daemon_uid, (unsigned)spawn.daemon_uid);
    if (!write_proc_file(pid, "setgroups", "deny") || !write_proc_file(pid, "uid_map", map))
        return false;
    snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)spawn.daemon_gid, (unsigned)spawn.daemon_gid);
    return write_proc_file(pid, "gid_map", map);
}

/* In the new child, before its exec: mounts that never reach the daemon's
 * namespace, and a /proc of its PID namespace.  Whether that /proc is
 * there.  Raw system calls, from here to the exec: after clone only this
 * thread exists, and a sanitizer's wrappers may wait for locks another
 * thread of the daemon held. */
static bool child_own_proc(void)
{
    return syscall(SYS_mount, NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) == 0 &&
           syscall(SYS_mount, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0;
}

/*
 * fork() for a worker: the child comes back (0) in its namespaces, its user
 * namespace's ids written, ready to exec; *own_proc tells it whether it
 * got its /proc.  fork() itself takes no namespace flags: this is clone with
 * fork's semantics (a copy of this thread on its own stack).  -1 with errno.
 */
static pid_t fork_worker(uint32_t uid, bool *own_proc)
{
    *own_proc = false;
    if (!spawn.on || spawn.ns == NS_NONE)
        return fork();
    int go[2] = { -1, -1 };
    if (spawn.ns == NS_USER && pipe2(go, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = (pid_t)syscall(SYS_clone, (unsigned long)(ns_flags(spawn.ns) | SIGCHLD), NULL, NULL, NULL, NULL);
    if (pid == 0) {
        /* A user namespace: its ids first (the daemon writes them). */
        char b;
        if (go[0] >= 0 && (syscall(SYS_close, go[1]) != 0 || syscall(SYS_read, go[0], &b, 1) != 1))
            syscall(SYS_exit_group, 127);
        *own_proc = child_own_proc();
        return 0;
    }
    if (go[0] < 0)
        return pid;
    const bool ok = pid > 0 && write_id_maps(pid, uid) && write(go[1], "", 1) == 1;
    const int e = errno;
    close(go[0]);
    close(go[1]);
    if (!ok && pid > 0)  /* without its ids it ends at once (127) */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    errno = e;
    return ok ? pid : -1;
}

/* Whether workers can start as `ns`: one is made so and ends at once, with
 * whether it had a /proc of its own. */
static bool try_ns(enum worker_ns ns)
{
    spawn.ns = ns;
    bool own_proc;
    pid_t pid = fork_worker(spawn.uid_base, &own_proc);
    if (pid == 0)
        syscall(SYS_exit_group, own_proc ? 0 : 1);
    int status;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) > 1)
        return false;
    spawn.own_proc = WEXITSTATUS(status) == 0;
    return true;
}

bool apir_workers_sandbox(const struct apir_sandbox_config *cfg, uint32_t max_clients, char *err, size_t err_len)
{
    spawn.on = cfg->enabled;
    if (!spawn.on)
        return true;
    const uint64_t count = max_clients * 2ull > APIR_SANDBOX_UID_COUNT_MIN ? max_clients * 2ull
                                                                            : APIR_SANDBOX_UID_COUNT_MIN;
    if ((uint64_t)cfg->uid_base + count > 0xFFFFFFFFull) {
        snprintf(err, err_len, "--worker-uid-base %u: the %llu worker uids from there pass the largest uid",
                 cfg->uid_base, (unsigned long long)count);
        return false;
    }
    spawn.uid_base = cfg->uid_base;
    spawn.max_clients = max_clients;
    spawn.daemon_uid = geteuid();
    spawn.daemon_gid = getegid();
    /* Other uids for workers: CAP_SETUID and CAP_SETGID, and the pool's ids
     * in this user namespace (a rootless container maps few). */
    const bool may_set_ids = cap_effective(CAP_SETUID) && cap_effective(CAP_SETGID) &&
                             ids_mapped("/proc/self/uid_map", spawn.uid_base, (uint32_t)count) &&
                             ids_mapped("/proc/self/gid_map", spawn.uid_base, (uint32_t)count);
    spawn.slot_uid = malloc(max_clients * sizeof(*spawn.slot_uid));
    spawn.uid_held = calloc((size_t)(count + 7) / 8, 1);
    if (!spawn.slot_uid || !spawn.uid_held) {
        snprintf(err, err_len, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < max_clients; i++)
        spawn.slot_uid[i] = NO_UID;
    spawn.uid_count = may_set_ids ? (uint32_t)count : 0;
    bool ok = (cap_effective(CAP_SYS_ADMIN) && try_ns(NS_PRIVILEGED)) || try_ns(NS_USER);
    if (!ok && spawn.uid_count) {
        /* A user namespace that cannot map the pool's ids still gives
         * the rest. */
        spawn.uid_count = 0;
        ok = try_ns(NS_USER);
        if (!ok)
            spawn.uid_count = (uint32_t)count;
    }
    if (!ok)
        spawn.ns = NS_NONE;
    char ids[160];
    if (spawn.uid_count)
        snprintf(ids, sizeof(ids), "a uid and gid each from %u-%u, none shared by two live workers", spawn.uid_base,
                 spawn.uid_base + spawn.uid_count - 1);
    else
        snprintf(ids, sizeof(ids), "the daemon's uid %u (giving each its own needs root, or CAP_SETUID and "
                 "CAP_SETGID: docs/SECURITY.md)", (unsigned)spawn.daemon_uid);
    if (spawn.ns == NS_NONE)
        APIR_WARN("host", "workers: no PID or IPC namespaces of their own (the kernel allows neither user namespaces "
                  "nor, without CAP_SYS_ADMIN, the others here): each sees the daemon's processes; %s", ids);
    else
        APIR_INFO("host", "workers: %sPID, IPC and mount namespaces of their own%s; %s",
                  spawn.ns == NS_USER ? "user, " : "", spawn.own_proc ? " (a /proc showing only the worker)" : "", ids);
    if (spawn.ns != NS_NONE && !spawn.own_proc)
        APIR_WARN("host", "workers: no /proc of their own could be mounted: they see the daemon's /proc");
    return true;
}

/* The next uid of the pool no live worker holds: round the pool, so that a
 * uid comes back only once every other free one was given since. */
static uint32_t uid_take(void)
{
    for (uint32_t k = 0; k < spawn.uid_count; k++) {
        const uint32_t i = (spawn.uid_next + k) % spawn.uid_count;
        if (!(spawn.uid_held[i / 8] & (1u << (i % 8)))) {
            spawn.uid_held[i / 8] |= (uint8_t)(1u << (i % 8));
            spawn.uid_next = (i + 1) % spawn.uid_count;
            return i;
        }
    }
    return NO_UID;
}

static void uid_give_back(uint32_t i)
{
    if (i != NO_UID)
        spawn.uid_held[i / 8] &= (uint8_t)~(1u << (i % 8));
}

/* Process isolation: hand the connection to a new worker process in a free
 * slot, with a uid of the pool (sandbox.h). */
void apir_workers_spawn(struct apir_shm_server *srv, int fd, const struct ucred *peer, const char *stream_peer,
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
    /* + 2: --weight-cache-fd N; + 1: --stream-tls; + 2: --worker-uid N; + 2: --peer-cred C */
    char **argv = calloc((size_t)argc + 18, sizeof(char *));
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
    const uint32_t uid_index = spawn.on && spawn.uid_count ? uid_take() : NO_UID;
    char uid_arg[16];
    snprintf(uid_arg, sizeof(uid_arg), "%u", spawn.uid_base + uid_index);
    if (uid_index != NO_UID) {
        argv[argc++] = "--worker-uid";
        argv[argc++] = uid_arg;
    }
    bool own_proc;
    pid_t pid = fork_worker(spawn.uid_base + uid_index, &own_proc);
    if (pid == 0) {
        /* Raw system calls up to the exec (child_own_proc says why).
         * Workers go with the daemon: a killed host is a dead host. */
        syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        syscall(SYS_fcntl, fd, F_SETFD, 0);  /* the worker inherits these fds only */
        if (stats_fd >= 0)
            syscall(SYS_fcntl, stats_fd, F_SETFD, 0);
        if (cache_fd >= 0)  /* weight cache */
            syscall(SYS_fcntl, cache_fd, F_SETFD, 0);
        syscall(SYS_execve, "/proc/self/exe", argv, environ);
        syscall(SYS_exit_group, 127);
    }
    free(argv);
    close(fd);
    if (stats_fd >= 0)
        close(stats_fd);  /* the mapping stays */
    if (cache_fd >= 0)  /* weight cache: the worker's end */
        close(cache_fd);
    if (pid < 0) {
        APIR_ERROR("host", "cannot start a worker process: %s", strerror(errno));
        stats_page_free(page);
        uid_give_back(uid_index);
        return;
    }
    if (spawn.slot_uid && slot < spawn.max_clients)
        spawn.slot_uid[slot] = uid_index;
    srv->children[slot] = (struct worker_slot){ .pid = pid, .client_id = id, .peer = *peer,
                                                .started_ns = apir_now_ns(), .stats = page };
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

void apir_workers_reap(struct apir_shm_server *srv)
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
            if (spawn.slot_uid && i < spawn.max_clients) {
                uid_give_back(spawn.slot_uid[i]);
                spawn.slot_uid[i] = NO_UID;
            }
            /* Its last counters join the totals; the page goes. */
            struct apir_guest_counters last;
            apir_stats_read(srv->children[i].stats, &last);
            apir_stats_retire(&srv->retired, &last);
            stats_page_free(srv->children[i].stats);
            srv->children[i].stats = NULL;
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

uint32_t apir_workers_rows(struct apir_shm_server *srv, struct apir_guest_row *rows, uint32_t max)
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

bool apir_shm_server_isolate(struct apir_shm_server *srv, char **worker_argv)
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
void apir_worker_watch(struct apir_shm_server *srv, bool hung_up)
{
    struct shm_client *c = srv->clients;
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

void apir_workers_stop(struct apir_shm_server *srv)
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
        if (srv->children[i].pid)
            kill(srv->children[i].pid, SIGKILL);
        stats_page_free(srv->children[i].stats);
    }
    free(srv->children);
    srv->children = NULL;
}
