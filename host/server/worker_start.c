/*
 * Starting a worker process (sandbox.h): the part of process isolation that
 * knows nothing of the server, so that libapir-virgl.so starts its
 * contexts' workers with it too, without the dispatcher.
 *
 * A worker starts in PID, IPC and mount namespaces of its own where the
 * kernel allows them (apir_workers_sandbox finds out once), so that even a
 * worker running a guest's code sees and can signal no other process; with
 * a uid of the pool that no other live worker has, when its starter may
 * give uids; and as a fresh process image (exec), so nothing of its
 * starter's memory is in it.  The worker's own side of its sandbox - the
 * uid switch, limits, seccomp - is sandbox.c.
 */
#include "sandbox.h"

#include "apir_log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

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
    uid_t daemon_uid;
    gid_t daemon_gid;
} spawn;

/* The pool is shared by the threads that start workers (libapir-virgl.so
 * starts one per virtio-gpu context, from the hypervisor's threads). */
static pthread_mutex_t uid_lock = PTHREAD_MUTEX_INITIALIZER;

/* The pool's bitmap lives as long as the code that uses it: the daemon's
 * whole life, or libapir-virgl.so's until the hypervisor unloads it. */
__attribute__((destructor)) static void uid_pool_free(void)
{
    free(spawn.uid_held);
    spawn.uid_held = NULL;
    spawn.uid_count = 0;
}

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
    spawn.daemon_uid = geteuid();
    spawn.daemon_gid = getegid();
    /* Other uids for workers: CAP_SETUID and CAP_SETGID, and the pool's ids
     * in this user namespace (a rootless container maps few). */
    const bool may_set_ids = cap_effective(CAP_SETUID) && cap_effective(CAP_SETGID) &&
                             ids_mapped("/proc/self/uid_map", spawn.uid_base, (uint32_t)count) &&
                             ids_mapped("/proc/self/gid_map", spawn.uid_base, (uint32_t)count);
    spawn.uid_held = calloc((size_t)(count + 7) / 8, 1);
    if (!spawn.uid_held) {
        snprintf(err, err_len, "out of memory");
        return false;
    }
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

int64_t apir_worker_uid_take(void)
{
    if (!spawn.on || !spawn.uid_count)
        return -1;
    pthread_mutex_lock(&uid_lock);
    const uint32_t i = uid_take();
    pthread_mutex_unlock(&uid_lock);
    return i == NO_UID ? -1 : (int64_t)spawn.uid_base + i;
}

void apir_worker_uid_release(int64_t uid)
{
    if (uid < (int64_t)spawn.uid_base || uid >= (int64_t)spawn.uid_base + spawn.uid_count)
        return;
    pthread_mutex_lock(&uid_lock);
    uid_give_back((uint32_t)(uid - spawn.uid_base));
    pthread_mutex_unlock(&uid_lock);
}

/* In the new child, before its exec (raw system calls: child_own_proc says
 * why): every descriptor but stdio and w->keep closes at the exec, so the
 * worker inherits nothing its starter holds - another guest's socket, a
 * hypervisor's files of other VMs. */
static void child_keep_only(const struct apir_worker_exec *w)
{
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1u << 2)
#endif
    if (syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
        /* Before Linux 5.11: one by one, up to the descriptor limit. */
        struct rlimit lim = { 0, 0 };
        syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &lim);
        const long top = lim.rlim_cur > (1u << 20) ? (1l << 20) : (long)lim.rlim_cur;
        for (long fd = 3; fd < top; fd++)
            syscall(SYS_fcntl, (int)fd, F_SETFD, FD_CLOEXEC);
    }
    if (w->stdin_fd >= 0)
        syscall(SYS_dup3, w->stdin_fd, 0, 0);
    for (unsigned i = 0; i < w->n_keep; i++)
        syscall(SYS_fcntl, w->keep[i], F_SETFD, 0);
}

pid_t apir_worker_exec(const struct apir_worker_exec *w)
{
    bool own_proc;
    const uint32_t uid = w->uid >= 0 ? (uint32_t)w->uid : spawn.uid_base;
    pid_t pid = fork_worker(uid, &own_proc);
    if (pid == 0) {
        /* Workers go with their starter (the thread that started them):
         * a killed host is a dead host. */
        syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        child_keep_only(w);
        syscall(SYS_execve, w->program ? w->program : "/proc/self/exe", w->argv, w->envp ? w->envp : environ);
        syscall(SYS_exit_group, 127);
    }
    return pid;
}

