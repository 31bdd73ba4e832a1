/*
 * The worker sandbox: what a guest's worker process may still do once it
 * has loaded its backend and before it decodes the guest's first byte.
 * Defence in depth for whatever gets past the decoders and op checks: a
 * worker running a guest's code must reach nothing outside its own guest -
 * not another worker, not the daemon, no file, no signal, no other uid.
 * See sandbox.c for the rules and why.
 */
#ifndef APIR_SANDBOX_H
#define APIR_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct apir_host;

/* Worker uids: uid_base .. uid_base + count - 1, one per live worker. */
#define APIR_SANDBOX_UID_BASE_DEFAULT 0x7A000000u
/* The pool's least size (apir_workers_sandbox). */
#define APIR_SANDBOX_UID_COUNT_MIN 65536u

struct apir_sandbox_config {
    bool enabled;        /* false: --no-sandbox (debugging only; logged loudly) */
    bool log_only;       /* --sandbox-log: each refused syscall is named in the worker's log */
    const char *extra_allow;  /* --sandbox-allow: comma-separated syscall names allowed besides the lists */
    uint32_t uid_base;   /* --worker-uid-base */
};

void apir_sandbox_config_default(struct apir_sandbox_config *cfg);

/* ---- the daemon (workers.c) --------------------------------------------- */

/*
 * How this daemon will start its workers, decided once before the first
 * (by trying it) and logged: in PID, IPC and mount namespaces of their own
 * (a /proc showing only the worker) where the kernel allows them - through
 * a user namespace when the daemon lacks CAP_SYS_ADMIN - else, said in the
 * log, without; and with a uid each from the pool uid_base .. uid_base +
 * max(APIR_SANDBOX_UID_COUNT_MIN, 2 * max_clients) - 1 when this process
 * may give uids (root, or CAP_SETUID and CAP_SETGID with those ids mapped),
 * else with the daemon's.  A uid is held by one live worker and comes back
 * only after the rest of the pool was taken since.  false with a message:
 * the pool does not fit below the largest uid.  Without this call (or with
 * --no-sandbox) workers are plain forks of the daemon.
 */
bool apir_workers_sandbox(const struct apir_sandbox_config *cfg, uint32_t max_clients, char *err, size_t err_len);

/* A uid of the pool for a worker about to start (no other live worker has
 * it), or -1 when workers keep their starter's uid; given back once the
 * worker has ended.  Thread-safe. */
int64_t apir_worker_uid_take(void);
void apir_worker_uid_release(int64_t uid);

/* A worker to start: a fresh process image, so nothing of its starter's
 * memory is in it (apir-host's worker mode, --serve-fd). */
struct apir_worker_exec {
    const char *program;     /* the executable; NULL: this program (/proc/self/exe) */
    char *const *argv;
    char *const *envp;       /* NULL: this process's environment */
    const int *keep;         /* the descriptors it inherits besides 0-2 (every other one closes) */
    unsigned n_keep;
    int stdin_fd;            /* its standard input, or -1: this process's */
    int64_t uid;             /* from apir_worker_uid_take (its --worker-uid), or -1 */
};

/*
 * Starts a worker in the namespaces apir_workers_sandbox chose (a plain
 * fork without that call, or with the sandbox off), killed when the
 * calling thread ends (PR_SET_PDEATHSIG).  Its pid, or -1 with errno; the
 * caller reaps it.  The worker enters its sandbox itself (sandbox_enter).
 */
pid_t apir_worker_exec(const struct apir_worker_exec *w);

/* ---- the worker ------------------------------------------------------- */

/*
 * At the worker's start, before its backend makes threads: a worker that
 * will not switch uid (uid < 0) drops every capability it inherited (a
 * daemon's ambient CAP_SETUID), so no thread it makes later holds one; one
 * that will, and is not root, takes saved uid 0 (so the switch clears the
 * capabilities of every thread).  The first process of its PID namespace
 * also makes abort() end it with abort's status (the kernel spares such a
 * process the signals it sends itself).
 */
bool apir_sandbox_worker_start(const struct apir_sandbox_config *cfg, int64_t uid, char *err, size_t err_len);

/*
 * Enters the sandbox: the uid/gid `uid` (>= 0, given by the daemon) and no
 * supplementary groups, no capability left, no new privileges, not
 * dumpable, resource limits, and the seccomp filters (plus the GPU set when
 * the host serves a GPU).  All threads of the process are covered.  false
 * with a message in err: the worker must not serve its guest.
 */
bool apir_sandbox_enter(const struct apir_sandbox_config *cfg, const struct apir_host *host, int64_t uid, char *err,
                        size_t err_len);

#endif
