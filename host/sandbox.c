/*
 * The worker sandbox (see sandbox.h): the render-server model of
 * virglrenderer and browsers' GPU processes.  The daemon (root when started
 * as root) only accepts connections and starts workers: it never parses a
 * guest's bytes (shm_server.c accept_new: SO_PEERCRED, then a worker).  Each
 * worker loads its backend privileged - the backend libraries live in root's cache
 * and a GPU opens its device nodes at init - and then, before the hello,
 * enters this sandbox for good:
 *
 *   1. its own uid and gid (uid_base + worker slot), no supplementary
 *      groups: workers cannot signal, ptrace or open /proc/PID/mem of each
 *      other or of the daemon, and every root capability is gone.  GPU
 *      device nodes were opened before, so no render/video group is kept.
 *      A daemon not started as root keeps its uid in workers: they are then
 *      separated by the rest only (not dumpable, seccomp);
 *   2. PR_SET_DUMPABLE 0 (no ptrace or /proc/PID/mem, even by its own uid)
 *      and PR_SET_NO_NEW_PRIVS (no setuid binary could give anything back);
 *   3. resource limits: no core files (guest data), a bounded descriptor
 *      table.  RLIMIT_FSIZE stays: stderr may be a log file, and seccomp
 *      refuses every new file anyway; RLIMIT_NPROC adds nothing to seccomp's
 *      threads-only clone;
 *   4. a seccomp allowlist of what serving a guest needs - socket messages,
 *      memory, futexes, threads, time - measured with `strace -f -c` on
 *      workers running the e2e and llama tests.  Anything else fails with
 *      EPERM (a library probing an optional feature gets an error, not a
 *      dead worker; ggml's abort path tries to fork a debugger); what only
 *      an attacker asks for - exec, ptrace, another process's memory - kills
 *      the worker (SIGSYS).  Nothing is opened after the
 *      sandbox is on: the CPU backend opens nothing at compute time
 *      (measured), so open/openat are refused outright, and a new process
 *      is impossible (clone only with CLONE_THREAD; clone3 answers ENOSYS so
 *      glibc falls back to clone, whose flags a filter can see).
 *
 * A GPU backend needs more at run time (driver ioctls, page locking for its
 * copy engines, lazily opened driver files): a separate set, added only when
 * the host serves a GPU device.  `--sandbox-log` names every refused
 * syscall in the worker's log (a SIGSYS handler: the kernel's own seccomp
 * log is out of reach inside containers), still refusing it, and
 * `--sandbox-allow a,b` lets an operator allow what a driver still needs
 * without a rebuild - the way the GPU set was measured on the H200.
 */
#include "sandbox.h"

#include "apir_log.h"
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

/* Descriptors a worker may hold: its socket, stdio, a GPU driver's nodes;
 * blob descriptors are closed once mapped. */
#define WORKER_MAX_FDS 256

/* Every backend: what a worker serving a guest does. */
static const char *const base_syscalls[] = {
    /* the guest's socket (hello, blob descriptors, hang-up) and logging */
    "read", "write", "writev", "recvmsg", "sendmsg", "recvfrom", "sendto", "poll", "ppoll", "shutdown", "close",
    "getsockopt",
    /* blobs: seals and sizes of descriptors received; model-file blobs */
    "fstat", "newfstatat", "fcntl", "lseek",
    /* memory */
    "mmap", "munmap", "mremap", "mprotect", "madvise", "brk",
    /* threads (clone is filtered below) and their synchronisation */
    "futex", "set_robust_list", "rseq", "sched_yield", "sched_getaffinity", "exit", "exit_group",
    "getpid", "gettid", "getppid", "rt_sigprocmask", "rt_sigaction", "rt_sigreturn", "sigaltstack", "restart_syscall",
    /* time */
    "clock_gettime", "clock_getres", "gettimeofday", "clock_nanosleep", "nanosleep",
    /* handle salts; the transport's wake-up pipes; log lines */
    "getrandom", "pipe2", "getuid", "geteuid", "getgid", "getegid",
    /* the CPU backend's free-memory query (sysinfo) */
    "sysinfo",
    /* the weight cache (weight_cache.h): a tensor to store goes to the
     * daemon in a memfd of the worker's own */
    "memfd_create",
};

/* A GPU backend's driver at run time.  Measured on an H200 (CUDA 13, driver
 * 580; `bench/h200.sh sandbox`): with this set, llama-bench and
 * test-backend-ops through APIR0 ran with --sandbox-log naming one refusal,
 * an openat creating a file, which the driver does without (left refused);
 * tg/pp the same as with --no-sandbox.  openat is added apart: existing
 * files only (load_filter). */
static const char *const gpu_syscalls[] = {
    "ioctl", "mlock", "munlock", "mincore", "getdents64", "readlink", "pread64", "pwrite64", "statfs", "fstatfs",
    "eventfd2", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "uname", "prlimit64",
    "sched_setaffinity", "sched_getparam", "sched_getscheduler", "sched_get_priority_min", "sched_get_priority_max",
    "get_mempolicy", "membarrier", "dup", "dup3", "access", "faccessat", "faccessat2",
};

/* Only an attacker asks for these: end the worker at once.  (A new process
 * is refused with EPERM instead: ggml's abort path forks a debugger for its
 * backtrace, and should still end in its own SIGABRT.) */
static const char *const fatal_syscalls[] = {
    "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
};

void apir_sandbox_config_default(struct apir_sandbox_config *cfg)
{
    cfg->enabled = true;
    cfg->log_only = false;
    cfg->extra_allow = NULL;
    cfg->uid_base = APIR_SANDBOX_UID_BASE_DEFAULT;
}

/* ---- --sandbox-log: refusals named in the worker's log ------------------ */

/* Names by syscall number, resolved before the filter is on (libseccomp
 * allocates; the signal handler only reads). */
#define NAMED_SYSCALLS 512
static const char *syscall_name[NAMED_SYSCALLS];

static size_t put_text(char *dst, size_t at, size_t cap, const char *text)
{
    while (*text && at < cap)
        dst[at++] = *text++;
    return at;
}

/* SIGSYS from SCMP_ACT_TRAP: log the call (async-signal-safe: write only)
 * and make it return -EPERM, as the enforcing filter would. */
static void on_refused_syscall(int sig, siginfo_t *si, void *ucontext)
{
    (void)sig;
    char line[128];
    char num[12];
    int nr = si->si_syscall;
    size_t n = 0, k = sizeof(num);
    unsigned v = nr < 0 ? 0u : (unsigned)nr;
    do {
        num[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k);
    n = put_text(line, n, sizeof(line), "apir sandbox: refused syscall ");
    n = put_text(line, n, sizeof(line), nr >= 0 && nr < NAMED_SYSCALLS && syscall_name[nr] ? syscall_name[nr] : "?");
    n = put_text(line, n, sizeof(line), " (");
    while (k < sizeof(num) && n < sizeof(line))
        line[n++] = num[k++];
    n = put_text(line, n, sizeof(line), ")\n");
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    ucontext_t *uc = ucontext;
#if defined(__x86_64__)
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
    uc->uc_mcontext.regs[0] = (unsigned long long)-EPERM;
#else
    (void)uc;
#endif
}

static bool trap_supported(void)
{
#if defined(__x86_64__) || defined(__aarch64__)
    return true;
#else
    return false;
#endif
}

static void install_refusal_logger(void)
{
    for (int nr = 0; nr < NAMED_SYSCALLS; nr++)
        syscall_name[nr] = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_refused_syscall;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSYS, &sa, NULL);
}

/* --sandbox-allow: an operator's additions, by name; unknown names refused. */
static bool add_extra_rules(scmp_filter_ctx ctx, const char *list, char *err, size_t err_len)
{
    if (!list || !*list)
        return true;
    char name[64];
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(name)) {
            snprintf(err, err_len, "--sandbox-allow: bad syscall name in '%s'", list);
            return false;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        int nr = seccomp_syscall_resolve_name(name);
        if (nr == __NR_SCMP_ERROR || seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) != 0) {
            snprintf(err, err_len, "--sandbox-allow: unknown syscall '%s'", name);
            return false;
        }
        APIR_INFO("sandbox", "also allowed (--sandbox-allow): %s", name);
        p += len;
        if (*p == ',')
            p++;
    }
    return true;
}

static bool host_serves_gpu(const struct apir_host *host)
{
    for (uint32_t i = 0; i < host->n_devices; i++)
        if (ggml_backend_dev_type(host->devices[i]) != GGML_BACKEND_DEVICE_TYPE_CPU)
            return true;
    return false;
}

void apir_sandbox_prepare(struct apir_host *host)
{
    if (!host_serves_gpu(host))
        return;  /* the CPU backend opens nothing to start a stream */
    for (uint32_t i = 0; i < host->n_devices; i++) {
        ggml_backend_t be = ggml_backend_dev_init(host->devices[i], NULL);
        if (be)
            ggml_backend_free(be);
    }
}

/* Step 1: a distinct unprivileged uid and gid, verified. */
static bool drop_privileges(uint32_t uid_base, uint32_t slot, char *err, size_t err_len)
{
    if (geteuid() != 0) {
        APIR_DEBUG("sandbox", "not root: the worker keeps uid %u (workers of one uid are kept apart by the rest)",
                   (unsigned)geteuid());
        return true;
    }
    uint64_t id64 = (uint64_t)uid_base + slot;
    if (uid_base == 0 || id64 >= 0xFFFFFFFFull) {
        snprintf(err, err_len, "worker uid %llu out of range (--worker-uid-base)", (unsigned long long)id64);
        return false;
    }
    uid_t uid = (uid_t)id64;
    gid_t gid = (gid_t)id64;
    /* The parent-death signal is cleared when the effective uid changes. */
    pid_t parent = getppid();
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        snprintf(err, err_len, "cannot drop privileges to uid %u: %s", (unsigned)uid, strerror(errno));
        return false;
    }
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (setuid(0) == 0 || setgid(0) == 0 || getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0 || r != uid ||
        e != uid || s != uid || rg != gid || eg != gid || sg != gid || getgroups(0, NULL) != 0) {
        snprintf(err, err_len, "privileges not dropped as asked");
        return false;
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
        snprintf(err, err_len, "the daemon is gone");
        return false;
    }
    return true;
}

/* Steps 2 and 3. */
static bool restrict_process(char *err, size_t err_len)
{
    struct rlimit no_core = { 0, 0 };
    struct rlimit fds = { WORKER_MAX_FDS, WORKER_MAX_FDS };
    struct rlimit cur;
    if (getrlimit(RLIMIT_NOFILE, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && cur.rlim_max < fds.rlim_max)
        fds = cur;
    if (prctl(PR_SET_DUMPABLE, 0) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        setrlimit(RLIMIT_CORE, &no_core) != 0 || setrlimit(RLIMIT_NOFILE, &fds) != 0) {
        snprintf(err, err_len, "cannot restrict the worker: %s", strerror(errno));
        return false;
    }
    return true;
}

static bool add_rules(scmp_filter_ctx ctx, uint32_t action, const char *const *names, size_t n, char *err, size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR)
            continue;  /* not a syscall on this architecture */
        int rc = seccomp_rule_add(ctx, action, nr, 0);
        if (rc != 0) {
            snprintf(err, err_len, "seccomp rule for %s: %s", names[i], strerror(-rc));
            return false;
        }
    }
    return true;
}

/* Step 4. */
static bool load_filter(const struct apir_sandbox_config *cfg, bool gpu, char *err, size_t err_len)
{
    /* Log mode: refusals trap into on_refused_syscall, which names them
     * and fails them with EPERM (the kernel's SCMP_ACT_LOG where no trap
     * handler can set the return value). */
    const bool trap = cfg->log_only && trap_supported();
    if (trap)
        install_refusal_logger();
    const uint32_t deny = trap ? SCMP_ACT_TRAP : cfg->log_only ? SCMP_ACT_LOG : SCMP_ACT_ERRNO(EPERM);
    const uint32_t fatal = trap ? SCMP_ACT_TRAP : cfg->log_only ? SCMP_ACT_LOG : SCMP_ACT_KILL_PROCESS;
    scmp_filter_ctx ctx = seccomp_init(deny);
    if (!ctx) {
        snprintf(err, err_len, "seccomp_init failed");
        return false;
    }
    bool ok = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1) == 0 &&
              add_rules(ctx, SCMP_ACT_ALLOW, base_syscalls, sizeof(base_syscalls) / sizeof(base_syscalls[0]), err,
                        err_len) &&
              (!gpu || add_rules(ctx, SCMP_ACT_ALLOW, gpu_syscalls, sizeof(gpu_syscalls) / sizeof(gpu_syscalls[0]), err,
                                 err_len)) &&
              (cfg->log_only || add_rules(ctx, fatal, fatal_syscalls, sizeof(fatal_syscalls) / sizeof(fatal_syscalls[0]),
                                          err, err_len)) &&
              add_extra_rules(ctx, cfg->extra_allow, err, err_len);
    /* Threads only: a clone without CLONE_THREAD would be a new process
     * (refused by the default action, as fork and vfork are).  In log mode
     * the fatal rules are the default action, which libseccomp refuses to
     * repeat. */
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                                SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD)) == 0;
    /* clone3's flags are in memory a filter cannot read: glibc falls back. */
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) == 0;
    /* Thread names only (pthread_setname_np): no other prctl - it could
     * make the worker dumpable again. */
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1, SCMP_A0(SCMP_CMP_EQ, PR_SET_NAME)) == 0;
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1, SCMP_A0(SCMP_CMP_EQ, PR_GET_NAME)) == 0;
    /* A GPU driver opens files lazily: existing ones only, none created or
     * truncated (the worker's uid bounds which). */
    ok = ok && (!gpu || seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1,
                                         SCMP_A2(SCMP_CMP_MASKED_EQ, O_CREAT | O_TRUNC | O_TMPFILE, 0)) == 0);
    /* Signals to this process only (abort() raises one). */
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1, SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)getpid())) == 0;
    if (ok && !err[0]) {
        int rc = seccomp_load(ctx);
        if (rc != 0) {
            snprintf(err, err_len, "seccomp_load: %s", strerror(-rc));
            ok = false;
        }
    } else if (!err[0]) {
        snprintf(err, err_len, "cannot build the seccomp filter");
    }
    seccomp_release(ctx);
    return ok && !err[0];
}

bool apir_sandbox_enter(const struct apir_sandbox_config *cfg, const struct apir_host *host, uint32_t slot, char *err,
                        size_t err_len)
{
    err[0] = '\0';
    if (!cfg->enabled) {
        APIR_WARN("sandbox", "--no-sandbox: this worker runs as uid %u WITHOUT privilege drop or syscall filter; "
                  "a guest that compromises it owns the host", (unsigned)geteuid());
        return true;
    }
    const bool gpu = host_serves_gpu(host);
    if (!drop_privileges(cfg->uid_base, slot, err, err_len) || !restrict_process(err, err_len) ||
        !load_filter(cfg, gpu, err, err_len))
        return false;
    APIR_DEBUG("sandbox", "worker slot %u: uid %u, seccomp %s%s", slot, (unsigned)geteuid(),
               gpu ? "base+GPU set" : "base set", cfg->log_only ? " (log only)" : "");
    return true;
}
