/*
 * The worker sandbox, the worker's side (sandbox.h; how the daemon starts
 * a worker - its namespaces and uid - is workers.c): the render-server
 * model of virglrenderer and browsers' GPU processes.  The daemon only
 * accepts connections and starts workers: it never parses a guest's bytes
 * (server.c accept_new: SO_PEERCRED, then a worker).  Each worker
 * starts in PID, IPC and mount namespaces of its own (a /proc showing only
 * itself) where the kernel allows them, loads its backend with the
 * daemon's rights - the backend libraries, a GPU's device nodes and the TLS
 * keys may be readable by the daemon alone - and then, before the hello,
 * enters this sandbox for good.  It is written for a worker that runs the
 * guest's code (a kernel bug gave it control): nothing outside its own
 * guest may be reachable from there.
 *
 *   1. a uid and gid of its own, from the daemon's pool (workers.c): no
 *      other live worker has it, and a later guest in the same slot gets
 *      another; no supplementary groups, no capability left anywhere (all
 *      threads: the switch from root, or from root of its user namespace,
 *      clears them).  It cannot signal, ptrace or open /proc/PID/mem of
 *      anything else.  A daemon that cannot give uids (a normal user's)
 *      leaves its own: such workers are kept apart by their namespaces and
 *      the rest, and hold no capability from their start;
 *   2. PR_SET_DUMPABLE 0 (no ptrace or /proc/PID/mem, even by its own uid)
 *      and PR_SET_NO_NEW_PRIVS (no setuid binary could give anything back);
 *   3. resource limits: no core files (guest data), a bounded descriptor
 *      table, and - where its uid or user namespace is its own, since
 *      RLIMIT_NPROC counts a uid's tasks - a bounded number of threads.
 *      RLIMIT_FSIZE stays: stderr may be a log file, and nothing else can
 *      be written;
 *   4. two seccomp filters.  The first, an allowlist of what serving a
 *      guest needs - socket reads and plain sends, memory, futexes,
 *      threads, time - measured with `strace -f` on workers running the
 *      e2e, stream and llama tests.  A call an attacker could turn outward
 *      is allowed only with the arguments the worker uses: fcntl with the
 *      commands it uses, F_SETFL never with O_ASYNC (no F_SETOWN, F_SETSIG,
 *      F_SETLEASE, F_NOTIFY: the kernel would signal on the worker's
 *      behalf, after it is gone too); sendto without an address; tgkill to
 *      itself; clone for threads; prctl for thread names.  No sendmsg or
 *      sendmmsg at all: their control data, where SCM_RIGHTS would pass a
 *      descriptor out, is memory a filter cannot read - the worker's
 *      transports send with send() and only ever receive descriptors.
 *      Anything else fails with EPERM (a library probing an optional
 *      feature gets an error, not a dead worker; ggml's abort path tries
 *      to fork a debugger); what only an attacker asks for - exec, ptrace,
 *      another process's memory - kills the worker (SIGSYS).  The second
 *      filter refuses what an allowed call must not do with some arguments
 *      (the ioctls that make the kernel signal, or type into a terminal),
 *      which an allowlist cannot say.  Nothing is opened after the sandbox
 *      is on: the CPU backend opens nothing at compute time (measured), so
 *      open/openat are refused outright, and a new process is impossible
 *      (clone only with CLONE_THREAD; clone3 answers ENOSYS so glibc falls
 *      back to clone, whose flags a filter can see).
 *
 * A GPU backend needs more at run time (driver ioctls, page locking for its
 * copy engines, lazily opened driver files): a separate set, added only when
 * the host serves a GPU device.  `--sandbox-log` names every refused
 * syscall in the worker's log (a SIGSYS handler: the kernel's own seccomp
 * log is out of reach inside containers), still refusing it, and
 * `--sandbox-allow a,b` lets an operator allow what a driver still needs
 * without a rebuild - the way the GPU set was measured on the H200.  A call
 * with argument rules gets its rules there too, and a call that would undo
 * the sandbox (sendmsg, kill, setuid...) cannot be allowed.
 */
#include "sandbox.h"

#include "apir_log.h"
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sockios.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Descriptors a worker may hold: its socket, stdio, a GPU driver's nodes;
 * blob descriptors are closed once mapped. */
#define WORKER_MAX_FDS 256
/* Tasks (threads) a worker may have beyond one per CPU thread of ggml's:
 * its serving and wake-up threads, a tls: guest's sender thread
 * (transport/sender.h), a GPU driver's own. */
#define WORKER_SPARE_TASKS 64

/* Every backend: what a worker serving a guest does.  fcntl, sendto,
 * tgkill, clone and prctl are allowed with argument rules (load_filters). */
static const char *const base_syscalls[] = {
    /* the guest's socket (hello, blob descriptors in, hang-up; a stream
     * peer's address) and logging */
    "read", "write", "writev", "recvmsg", "recvfrom", "poll", "ppoll", "shutdown", "close", "getsockopt", "getpeername",
    /* blobs: sizes of descriptors received; model-file blobs */
    "fstat", "newfstatat", "lseek",
    /* memory */
    "mmap", "munmap", "mremap", "mprotect", "madvise", "brk",
    /* threads and their synchronisation */
    "futex", "set_robust_list", "rseq", "sched_yield", "sched_getaffinity", "exit", "exit_group",
    "getpid", "gettid", "getppid", "rt_sigprocmask", "rt_sigaction", "rt_sigreturn", "sigaltstack", "restart_syscall",
    /* time */
    "clock_gettime", "clock_getres", "gettimeofday", "clock_nanosleep", "nanosleep",
    /* handle salts; the transport's wake-up pipes; log lines */
    "getrandom", "pipe2", "getuid", "geteuid", "getgid", "getegid",
    /* the CPU backend's free-memory query (sysinfo) */
    "sysinfo",
};

/* A GPU backend's driver at run time.  Measured on an H200 (CUDA 13, driver
 * 580; `bench/h200.sh sandbox`): with this set, llama-bench and
 * test-backend-ops through APIR0 ran with --sandbox-log naming one refusal,
 * an openat creating a file, which the driver does without (left refused);
 * tg/pp the same as with --no-sandbox.  fcntl, ioctl, openat and prlimit64
 * are added with their argument rules (filtered_syscalls): measured again
 * with those and the workers' namespaces, the same one refusal, with the
 * daemon as root and as a user with CAP_SETUID/CAP_SETGID or none. */
static const char *const gpu_syscalls[] = {
    "mlock", "munlock", "mincore", "getdents64", "readlink", "pread64", "pwrite64", "statfs", "fstatfs",
    "eventfd2", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "uname",
    "sched_setaffinity", "sched_getparam", "sched_getscheduler", "sched_get_priority_min", "sched_get_priority_max",
    "get_mempolicy", "membarrier", "dup", "dup3", "access", "faccessat", "faccessat2",
};
static const char *const gpu_filtered[] = { "fcntl", "ioctl", "openat", "prlimit64" };

/* Only an attacker asks for these: end the worker at once.  (A new process
 * is refused with EPERM instead: ggml's abort path forks a debugger for its
 * backtrace, and should still end in its own SIGABRT.) */
static const char *const fatal_syscalls[] = {
    "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
};

/* What --sandbox-allow cannot add, besides the fatal ones: each would undo
 * a rule above - descriptors passed out, signals to others, another uid or
 * capability, other namespaces, a new process. */
static const char *const never_syscalls[] = {
    "sendmsg", "sendmmsg", "kill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setfsuid", "setfsgid", "setgroups", "capset", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "fork", "vfork", "seccomp",
};

/* fcntl commands the worker uses (measured, see above): descriptor flags,
 * the blob seals it checks, and status flags - F_SETFL without O_ASYNC.
 * A GPU driver may also duplicate descriptors and seal its own memfds.
 * Never F_SETOWN(_EX), F_SETSIG, F_SETLEASE, F_NOTIFY (signals), nor file
 * locks (another process's files). */
static const int fcntl_commands[] = { F_GETFD, F_SETFD, F_GETFL, F_GET_SEALS };
static const int gpu_fcntl_commands[] = { F_DUPFD, F_DUPFD_CLOEXEC, F_ADD_SEALS };

/* ioctls refused where ioctl is allowed (a GPU driver's): asynchronous I/O
 * signals and their owner (what F_SETOWN/O_ASYNC do by fcntl), and typing
 * into, or taking over, a terminal the worker's stdio may be. */
static const unsigned long refused_ioctls[] = { FIOASYNC, FIOSETOWN, SIOCSPGRP, TIOCSTI, TIOCLINUX };

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

/* ---- the filters ----------------------------------------------------------- */

struct filters {
    scmp_filter_ctx allow;   /* the allowlist: default refuse */
    scmp_filter_ctx refuse;  /* argument refusals for allowed calls: default allow */
    uint32_t deny;           /* the refusal's action */
};

/* A rule; false with a message.  The same rule twice (the GPU set and
 * --sandbox-allow) is no error. */
static bool rule(scmp_filter_ctx ctx, uint32_t action, int nr, const char *name, unsigned n_args,
                 const struct scmp_arg_cmp *args, char *err, size_t err_len)
{
    int rc = seccomp_rule_add_array(ctx, action, nr, n_args, args);
    if (rc != 0 && rc != -EEXIST) {
        snprintf(err, err_len, "seccomp rule for %s: %s", name, strerror(-rc));
        return false;
    }
    return true;
}

#define ARGS(...) (const struct scmp_arg_cmp[]){ __VA_ARGS__ }
#define N_ARGS(...) (unsigned)(sizeof((const struct scmp_arg_cmp[]){ __VA_ARGS__ }) / sizeof(struct scmp_arg_cmp))
#define RULE(f, action, sys, ...) \
    rule(f, action, SCMP_SYS(sys), #sys, N_ARGS(__VA_ARGS__), ARGS(__VA_ARGS__), err, err_len)
#define RULE0(f, action, sys) rule(f, action, SCMP_SYS(sys), #sys, 0, NULL, err, err_len)

static bool allow_fcntl_commands(struct filters *f, const int *cmds, size_t n, char *err, size_t err_len)
{
    for (size_t i = 0; i < n; i++)
        if (!RULE(f->allow, SCMP_ACT_ALLOW, fcntl, SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)cmds[i])))
            return false;
    return true;
}

static bool allow_fcntl(struct filters *f, char *err, size_t err_len)
{
    /* The kernel reads F_SETFL's flags as an unsigned int: the low word
     * is all there is to test. */
    return allow_fcntl_commands(f, fcntl_commands, sizeof(fcntl_commands) / sizeof(fcntl_commands[0]), err, err_len) &&
           RULE(f->allow, SCMP_ACT_ALLOW, fcntl, SCMP_A1(SCMP_CMP_EQ, F_SETFL), SCMP_A2(SCMP_CMP_MASKED_EQ, O_ASYNC, 0));
}

static bool allow_gpu_fcntl(struct filters *f, char *err, size_t err_len)
{
    return allow_fcntl_commands(f, gpu_fcntl_commands, sizeof(gpu_fcntl_commands) / sizeof(gpu_fcntl_commands[0]), err,
                                err_len);
}

/* ioctl: a GPU driver's commands are its own, so all but refused_ioctls -
 * compared on the low 32 bits, which is all the kernel reads of them. */
static bool allow_ioctl(struct filters *f, char *err, size_t err_len)
{
    for (size_t i = 0; i < sizeof(refused_ioctls) / sizeof(refused_ioctls[0]); i++)
        if (!RULE(f->refuse, f->deny, ioctl, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, refused_ioctls[i])))
            return false;
    return RULE0(f->allow, SCMP_ACT_ALLOW, ioctl);
}

/* A GPU driver opens files lazily: existing ones only, none created or
 * truncated (the worker's uid bounds which). */
static bool allow_openat(struct filters *f, char *err, size_t err_len)
{
    return RULE(f->allow, SCMP_ACT_ALLOW, openat, SCMP_A2(SCMP_CMP_MASKED_EQ, O_CREAT | O_TRUNC | O_TMPFILE, 0));
}

/* Its own limits only (pid 0). */
static bool allow_prlimit64(struct filters *f, char *err, size_t err_len)
{
    return RULE(f->allow, SCMP_ACT_ALLOW, prlimit64, SCMP_A0(SCMP_CMP_EQ, 0));
}

/* The calls allowed with argument rules, by name (the GPU set, --sandbox-allow). */
static const struct {
    const char *name;
    bool (*allow)(struct filters *f, char *err, size_t err_len);
} filtered_syscalls[] = {
    { "fcntl", allow_gpu_fcntl }, { "ioctl", allow_ioctl }, { "openat", allow_openat }, { "prlimit64", allow_prlimit64 },
};

/* Allows a call by name, with its argument rules if it has some; names
 * that are not syscalls here are skipped (another architecture's). */
static bool allow_named(struct filters *f, const char *name, char *err, size_t err_len)
{
    for (size_t i = 0; i < sizeof(filtered_syscalls) / sizeof(filtered_syscalls[0]); i++)
        if (!strcmp(name, filtered_syscalls[i].name))
            return filtered_syscalls[i].allow(f, err, err_len);
    int nr = seccomp_syscall_resolve_name(name);
    return nr == __NR_SCMP_ERROR || rule(f->allow, SCMP_ACT_ALLOW, nr, name, 0, NULL, err, err_len);
}

static bool allow_all(struct filters *f, const char *const *names, size_t n, char *err, size_t err_len)
{
    for (size_t i = 0; i < n; i++)
        if (!allow_named(f, names[i], err, err_len))
            return false;
    return true;
}

static bool listed(const char *name, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, names[i]))
            return true;
    return false;
}

/* --sandbox-allow: an operator's additions, by name; unknown names, and
 * those that would undo the sandbox, refused. */
static bool add_extra_rules(struct filters *f, const char *list, char *err, size_t err_len)
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
        if (listed(name, never_syscalls, sizeof(never_syscalls) / sizeof(never_syscalls[0])) ||
            listed(name, fatal_syscalls, sizeof(fatal_syscalls) / sizeof(fatal_syscalls[0]))) {
            snprintf(err, err_len, "--sandbox-allow: %s cannot be allowed (it would let a worker reach beyond its guest)",
                     name);
            return false;
        }
        if (seccomp_syscall_resolve_name(name) == __NR_SCMP_ERROR) {
            snprintf(err, err_len, "--sandbox-allow: unknown syscall '%s'", name);
            return false;
        }
        if (!allow_named(f, name, err, err_len))
            return false;
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

/* Step 4: the refusals first (default allow), as the allowlist would
 * refuse the seccomp call that loads them. */
static bool load_filters(const struct apir_sandbox_config *cfg, bool gpu, char *err, size_t err_len)
{
    /* Log mode: refusals trap into on_refused_syscall, which names them
     * and fails them with EPERM (the kernel's SCMP_ACT_LOG where no trap
     * handler can set the return value). */
    const bool trap = cfg->log_only && trap_supported();
    if (trap)
        install_refusal_logger();
    const uint32_t fatal = trap ? SCMP_ACT_TRAP : cfg->log_only ? SCMP_ACT_LOG : SCMP_ACT_KILL_PROCESS;
    struct filters f = { .deny = trap ? SCMP_ACT_TRAP : cfg->log_only ? SCMP_ACT_LOG : SCMP_ACT_ERRNO(EPERM) };
    f.allow = seccomp_init(f.deny);
    f.refuse = seccomp_init(SCMP_ACT_ALLOW);
    bool ok = f.allow && f.refuse && seccomp_attr_set(f.allow, SCMP_FLTATR_CTL_TSYNC, 1) == 0 &&
              seccomp_attr_set(f.refuse, SCMP_FLTATR_CTL_TSYNC, 1) == 0;
    if (!ok)
        snprintf(err, err_len, "seccomp_init failed");
    ok = ok && allow_all(&f, base_syscalls, sizeof(base_syscalls) / sizeof(base_syscalls[0]), err, err_len) &&
         allow_fcntl(&f, err, err_len) &&
         (!gpu || (allow_all(&f, gpu_syscalls, sizeof(gpu_syscalls) / sizeof(gpu_syscalls[0]), err, err_len) &&
                   allow_all(&f, gpu_filtered, sizeof(gpu_filtered) / sizeof(gpu_filtered[0]), err, err_len))) &&
         add_extra_rules(&f, cfg->extra_allow, err, err_len);
    /* In log mode the fatal calls are the default action, which libseccomp
     * refuses to repeat. */
    for (size_t i = 0; ok && !cfg->log_only && i < sizeof(fatal_syscalls) / sizeof(fatal_syscalls[0]); i++) {
        int nr = seccomp_syscall_resolve_name(fatal_syscalls[i]);
        ok = nr == __NR_SCMP_ERROR || rule(f.allow, fatal, nr, fatal_syscalls[i], 0, NULL, err, err_len);
    }
    /* Threads only: a clone without CLONE_THREAD would be a new process
     * (refused by the default action, as fork and vfork are). */
    ok = ok && RULE(f.allow, SCMP_ACT_ALLOW, clone, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
    /* clone3's flags are in memory a filter cannot read: glibc falls back. */
    ok = ok && RULE0(f.allow, SCMP_ACT_ERRNO(ENOSYS), clone3);
    /* Thread names only (pthread_setname_np): no other prctl - it could
     * make the worker dumpable again. */
    ok = ok && RULE(f.allow, SCMP_ACT_ALLOW, prctl, SCMP_A0(SCMP_CMP_EQ, PR_SET_NAME)) &&
         RULE(f.allow, SCMP_ACT_ALLOW, prctl, SCMP_A0(SCMP_CMP_EQ, PR_GET_NAME));
    /* Signals to this process only (abort() raises one); getpid() is the
     * worker's pid in its own PID namespace. */
    ok = ok && RULE(f.allow, SCMP_ACT_ALLOW, tgkill, SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)getpid()));
    /* send() without an address: the socket's own peer (sendto to an
     * address on a connected socket is refused by the kernel anyway). */
    ok = ok && RULE(f.allow, SCMP_ACT_ALLOW, sendto, SCMP_A4(SCMP_CMP_EQ, 0));
    int rc = 0;
    if (ok && (rc = seccomp_load(f.refuse)) == 0 && (rc = seccomp_load(f.allow)) != 0)
        APIR_ERROR("sandbox", "the argument filter is on but not the allowlist");
    if (ok && rc != 0) {
        snprintf(err, err_len, "seccomp_load: %s", strerror(-rc));
        ok = false;
    }
    if (f.allow)
        seccomp_release(f.allow);
    if (f.refuse)
        seccomp_release(f.refuse);
    return ok;
}

/* ---- identity and limits -------------------------------------------------------- */

/* The capability sets of the calling thread (0: effective, permitted,
 * inheritable all empty), or -1. */
static int caps_held(void)
{
    struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
    if (syscall(SYS_capget, &h, d) != 0)
        return -1;
    for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
        if (d[i].effective || d[i].permitted || d[i].inheritable)
            return 1;
    return 0;
}

/* Every capability of the calling thread, ambient ones included (threads
 * made afterwards inherit the empty sets). */
static bool caps_drop(char *err, size_t err_len)
{
    struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
    memset(d, 0, sizeof(d));
    if (syscall(SYS_capset, &h, d) != 0 ||
        (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) || caps_held() != 0) {
        snprintf(err, err_len, "cannot drop the worker's capabilities: %s", strerror(errno));
        return false;
    }
    return true;
}

/* The first process of its PID namespace is spared the signals it sends
 * itself that it does not handle: abort() would then end in a fault.  It
 * ends with abort's status instead (the daemon logs it as SIGABRT). */
static void on_abort_in_own_namespace(int sig)
{
    _exit(128 + sig);
}

bool apir_sandbox_worker_start(const struct apir_sandbox_config *cfg, int64_t uid, char *err, size_t err_len)
{
    err[0] = '\0';
    if (getpid() == 1) {
        struct sigaction sa = { .sa_handler = on_abort_in_own_namespace };
        sigemptyset(&sa.sa_mask);
        sigaction(SIGABRT, &sa, NULL);
    }
    if (!cfg->enabled)
        return true;
    if (uid < 0)
        return caps_held() == 0 || caps_drop(err, err_len);
    /* It switches uid in drop_privileges, holding CAP_SETUID until then.
     * The switch clears the permitted, effective and ambient capabilities
     * of every thread, but only when it leaves uid 0 behind: a daemon not
     * root (CAP_SETUID and CAP_SETGID, no user namespace) gives its worker
     * saved uid 0 now, which gives it nothing CAP_SETUID did not.  The
     * inheritable ones (what made the daemon's ambient set) go now, before
     * any thread copies them. */
    struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
    bool ok = syscall(SYS_capget, &h, d) == 0;
    for (int i = 0; ok && i < _LINUX_CAPABILITY_U32S_3; i++)
        d[i].inheritable = 0;
    ok = ok && syscall(SYS_capset, &h, d) == 0 &&
         (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0 || errno == EINVAL) &&
         (geteuid() == 0 || setresuid((uid_t)-1, (uid_t)-1, 0) == 0);
    if (!ok)
        snprintf(err, err_len, "cannot prepare the uid switch: %s", strerror(errno));
    return ok;
}

/* Step 1: the uid and gid the daemon gave, verified; none left to return
 * to, no capability left. */
static bool drop_privileges(int64_t uid64, char *err, size_t err_len)
{
    if (uid64 < 0) {
        if (caps_held() != 0) {
            snprintf(err, err_len, "the worker still holds capabilities");
            return false;
        }
        return true;
    }
    uid_t r, e, s;
    if (getresuid(&r, &e, &s) != 0 || (e != 0 && s != 0)) {
        snprintf(err, err_len, "given uid %lld but neither root nor saved root (apir_sandbox_worker_start)",
                 (long long)uid64);
        return false;
    }
    const uid_t uid = (uid_t)uid64;
    const gid_t gid = (gid_t)uid64;
    /* The parent-death signal is cleared when the effective uid changes. */
    pid_t parent = getppid();
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        snprintf(err, err_len, "cannot drop privileges to uid %u: %s", (unsigned)uid, strerror(errno));
        return false;
    }
    gid_t rg, eg, sg;
    if (setuid(0) == 0 || setgid(0) == 0 || getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0 || r != uid ||
        e != uid || s != uid || rg != gid || eg != gid || sg != gid || getgroups(0, NULL) != 0 || caps_held() != 0) {
        snprintf(err, err_len, "privileges not dropped as asked");
        return false;
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
        snprintf(err, err_len, "the daemon is gone");
        return false;
    }
    return true;
}

/* Whether this process is in a user namespace of its own (the daemon's
 * user namespace maps every uid: "0 0 4294967295"). */
static bool own_user_namespace(void)
{
    FILE *f = fopen("/proc/self/uid_map", "re");
    unsigned long long inner = 0, outer = 0, count = 0;
    const bool whole = f && fscanf(f, "%llu %llu %llu", &inner, &outer, &count) == 3 && inner == 0 && outer == 0 &&
                       count == 4294967295ull;
    if (f)
        fclose(f);
    return f && !whole;
}

/* Steps 2 and 3. */
static bool restrict_process(const struct apir_host *host, bool own_uid, char *err, size_t err_len)
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
    /* RLIMIT_NPROC counts the tasks of the worker's uid (in its user
     * namespace, if it has one): only a uid of its own bounds its threads,
     * not the daemon's uid with all its user's processes. */
    if (own_uid || own_user_namespace()) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        rlim_t n = (rlim_t)(host->cfg.n_threads > cpus ? host->cfg.n_threads : cpus > 0 ? cpus : 1) + WORKER_SPARE_TASKS;
        struct rlimit tasks = { n, n };
        if (getrlimit(RLIMIT_NPROC, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && cur.rlim_max < n)
            tasks = cur;
        if (setrlimit(RLIMIT_NPROC, &tasks) != 0) {
            snprintf(err, err_len, "cannot limit the worker's tasks: %s", strerror(errno));
            return false;
        }
    }
    return true;
}

bool apir_sandbox_enter(const struct apir_sandbox_config *cfg, const struct apir_host *host, int64_t uid, char *err,
                        size_t err_len)
{
    err[0] = '\0';
    if (!cfg->enabled) {
        APIR_WARN("sandbox", "--no-sandbox: this worker runs as uid %u WITHOUT privilege drop or syscall filter; "
                  "a guest that compromises it owns the host", (unsigned)geteuid());
        return true;
    }
    const bool gpu = host_serves_gpu(host);
    if (!drop_privileges(uid, err, err_len) || !restrict_process(host, uid >= 0, err, err_len) ||
        !load_filters(cfg, gpu, err, err_len))
        return false;
    APIR_DEBUG("sandbox", "worker: uid %u, pid %d in its namespace, seccomp %s%s", (unsigned)geteuid(), (int)getpid(),
               gpu ? "base+GPU set" : "base set", cfg->log_only ? " (log only)" : "");
    return true;
}
