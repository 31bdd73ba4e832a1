/*
 * A virtio-gpu context's worker (worker_link.h): started, spoken to, ended.
 */
#include "worker_link.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "sandbox.h"
#include "shm_proto.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* While asleep on an answer, look at the socket this often: a worker that
 * died cannot wake us, but its socket hangs up. */
#define WORKER_CHECK_NS (50ull * 1000 * 1000)
/* Its hello: the worker loads its backend first (a GPU runtime: seconds). */
#define HELLO_TIMEOUT_MS 60000
/* At close: how long a worker may take to end on its own after the hang-up
 * before it is killed (it frees its session; a command in progress is cut
 * short by the worker itself after 250 ms: apir_worker_watch). */
#define CLOSE_GRACE_MS 300

struct apir_worker_link {
    uint32_t ctx_id;
    pid_t pid;
    int pidfd;                /* -1: none (Linux < 5.3) */
    int sock;
    int64_t uid;              /* from the pool, or -1 */
    struct apir_shm_ctrl *ctrl;
    uint8_t *reply;
    uint64_t spin_ns, timeout_ns;
    size_t cmd_len;
    bool dead;
};

/*
 * How long the hypervisor's thread spins for an answer before it sleeps:
 * APIR_VIRGL_SPIN_US, default 2.  Far shorter than a guest's (APIR_SPIN_US):
 * the guest already spins for this answer in its VM, and the worker needs a
 * core to compute it - measured through the rig on 2 overloaded cores, null
 * call p50 20-22 us spinning 10 or 100 us, 7-8 us spinning 2 us or none.  A
 * worker that answers within the spin costs no wake-up.
 */
static uint32_t link_spin_us(void)
{
    const char *s = getenv("APIR_VIRGL_SPIN_US");
    char *end;
    const long v = s && *s ? strtol(s, &end, 10) : -1;
    return v >= 0 && v <= 100000 && !*end ? (uint32_t)v : 2;
}

/* ---- starting ----------------------------------------------------------------- */

/* The sandbox every worker of this process starts in (sandbox.h): decided
 * once, by trying, and logged. */
static pthread_once_t sandbox_once = PTHREAD_ONCE_INIT;

static void sandbox_decide(void)
{
    /* Contexts are the hypervisor's: the uid pool is sized for many. */
    const struct apir_sandbox_config cfg = { .enabled = true, .uid_base = APIR_SANDBOX_UID_BASE_DEFAULT };
    char err[200];
    if (!apir_workers_sandbox(&cfg, 1024, err, sizeof(err)))
        APIR_WARN("virgl", "context workers keep this process's uid: %s", err);
}

/* What of this process's environment a worker gets: ours and ggml's
 * settings, and what a GPU runtime reads; nothing else (a hypervisor's
 * environment may hold what other VMs must keep). */
static bool env_passed(const char *e)
{
    static const char *const prefixes[] = {
        "APIR_", "GGML_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "HSA_", "VK_", "MESA_", "LD_LIBRARY_PATH=", "PATH=",
        "HOME=", "TMPDIR=",
    };
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        if (!strncmp(e, prefixes[i], strlen(prefixes[i])))
            return true;
    return false;
}

static char **worker_env(void)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **env = calloc(n + 1, sizeof(*env));
    if (!env)
        return NULL;
    size_t k = 0;
    for (char **e = environ; e && *e; e++)
        if (env_passed(*e))
            env[k++] = *e;
    return env;
}

/* The exit status of a worker that ended (blocking: it is ending), or -1
 * when it cannot be had (a hypervisor that ignores SIGCHLD, or reaps every
 * child itself). */
static int reap(struct apir_worker_link *l)
{
    int status;
    pid_t r;
    while ((r = waitpid(l->pid, &status, 0)) < 0 && errno == EINTR)
        ;
    l->pid = 0;
    return r > 0 ? status : -1;
}

/* SIGKILL through the pidfd (never a recycled pid), else only while the
 * worker is our unreaped child. */
static void kill_worker(struct apir_worker_link *l)
{
    if (l->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, l->pidfd, SIGKILL, NULL, 0);
        return;
    }
    int status;
    if (l->pid > 0 && waitpid(l->pid, &status, WNOHANG) == 0)
        kill(l->pid, SIGKILL);
}

/*
 * The descriptors a link keeps (its socket, its pidfd), moved above the low
 * numbers.  Merge request 1590's virglrenderer keeps the number of a blob's
 * memfd after its render worker closed it, and closes that number when the
 * blob is destroyed: whatever reused it goes - the kernel hands out the
 * lowest free number, so a link's socket opened after a blob was created is
 * a likely victim (scripts/patches/ fixes that tree; an unpatched one stays
 * in use).  Half the descriptor limit, at most 512: well above what the
 * hypervisor's process holds open, and below the limit.  On failure the
 * descriptor stays where it is.
 */
static int fd_above_low_numbers(int fd)
{
    struct rlimit r;
    if (fd < 0 || getrlimit(RLIMIT_NOFILE, &r) != 0)
        return fd;
    const rlim_t floor = r.rlim_cur / 2 < 512 ? r.rlim_cur / 2 : 512;
    if (floor <= (rlim_t)fd)
        return fd;
    const int high = fcntl(fd, F_DUPFD_CLOEXEC, (int)floor);
    if (high < 0)
        return fd;
    close(fd);
    return high;
}

static void link_free(struct apir_worker_link *l)
{
    if (l->sock >= 0)
        close(l->sock);
    if (l->pid > 0) {
        /* Teardown, not the hot path: a bounded wait in 1 ms steps. */
        int status;
        pid_t r = 0;
        for (int i = 0; i < CLOSE_GRACE_MS && (r = waitpid(l->pid, &status, WNOHANG)) == 0; i++)
            nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
        if (r == 0) {
            kill_worker(l);
            reap(l);
        }
    }
    if (l->pidfd >= 0)
        close(l->pidfd);
    apir_worker_uid_release(l->uid);
    if (l->ctrl)
        munmap(l->ctrl, APIR_SHM_CTRL_SIZE);
    if (l->reply)
        munmap(l->reply, APIR_REPLY_BLOB_SIZE);
    free(l);
}

/* Starts the process; false with the reason logged. */
static bool spawn(struct apir_worker_link *l, const struct apir_worker_spec *spec, int worker_end)
{
    char fd_arg[16], id_arg[16], dev_arg[16], threads_arg[16], uid_arg[24];
    snprintf(fd_arg, sizeof(fd_arg), "%d", worker_end);
    snprintf(id_arg, sizeof(id_arg), "%u", spec->ctx_id);
    snprintf(dev_arg, sizeof(dev_arg), "%d", spec->device);
    snprintf(threads_arg, sizeof(threads_arg), "%d", spec->n_threads);
    l->uid = apir_worker_uid_take();
    snprintf(uid_arg, sizeof(uid_arg), "%lld", (long long)l->uid);
    const char *argv[24];
    int argc = 0;
    argv[argc++] = spec->program;
    argv[argc++] = "--serve-fd";
    argv[argc++] = fd_arg;
    argv[argc++] = "--backend-library";
    argv[argc++] = spec->library;
    argv[argc++] = "--backend-reg";
    argv[argc++] = spec->reg ? spec->reg : "ggml_backend_init";
    argv[argc++] = "--client-id";
    argv[argc++] = id_arg;
    argv[argc++] = "--worker-slot";
    argv[argc++] = "0";
    if (spec->device >= 0) {
        argv[argc++] = "--device";
        argv[argc++] = dev_arg;
    }
    if (spec->n_threads >= 0) {
        argv[argc++] = "--threads";
        argv[argc++] = threads_arg;
    }
    if (l->uid >= 0) {
        argv[argc++] = "--worker-uid";
        argv[argc++] = uid_arg;
    }
    argv[argc] = NULL;
    char **env = worker_env();
    /* Its standard input is nothing of ours (a hypervisor's may be a
     * console). */
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const struct apir_worker_exec w = { .program = spec->program, .argv = (char *const *)argv, .envp = env,
                                        .keep = &worker_end, .n_keep = 1, .stdin_fd = devnull, .uid = l->uid };
    l->pid = env && devnull >= 0 ? apir_worker_exec(&w) : -1;
    const int e = errno;
    free(env);
    if (devnull >= 0)
        close(devnull);
    if (l->pid < 0) {
        l->pid = 0;
        APIR_ERROR("virgl", "ctx %u: cannot start its worker %s: %s", spec->ctx_id, spec->program, strerror(e));
        return false;
    }
    l->pidfd = fd_above_low_numbers((int)syscall(SYS_pidfd_open, l->pid, 0));
    return true;
}

/* The shm hello: our control and reply blobs; the worker's answer. */
static bool hello(struct apir_worker_link *l, char *why, size_t why_len)
{
    void *ctrl = NULL, *reply = NULL;
    int fds[2];
    fds[0] = apir_memfd_create("apir-virgl-ctrl", APIR_SHM_CTRL_SIZE, &ctrl);
    fds[1] = fds[0] >= 0 ? apir_memfd_create("apir-virgl-reply", APIR_REPLY_BLOB_SIZE, &reply) : -1;
    if (fds[1] < 0) {
        snprintf(why, why_len, "cannot create shared memory: %s", strerror(errno));
        if (fds[0] >= 0) {
            close(fds[0]);
            munmap(ctrl, APIR_SHM_CTRL_SIZE);
        }
        return false;
    }
    l->ctrl = ctrl;
    l->reply = reply;
    const struct apir_shm_hello h = { .magic = APIR_SHM_MAGIC, .version = APIR_SHM_VERSION,
                                      .ctrl_size = APIR_SHM_CTRL_SIZE, .reply_size = APIR_REPLY_BLOB_SIZE,
                                      .pid = (int32_t)getpid() };
    /* A worker whose backend failed ends without reading it: its answer
     * (none) is what counts. */
    (void)apir_send_fds(l->sock, &h, sizeof(h), fds, 2);
    close(fds[0]);
    close(fds[1]);
    struct apir_shm_hello_reply r;
    int n_fds = 0;
    const ssize_t got = apir_recv_fds(l->sock, &r, sizeof(r), NULL, 0, &n_fds, HELLO_TIMEOUT_MS);
    if (got != (ssize_t)sizeof(r) || r.magic != APIR_SHM_MAGIC || r.status != 0) {
        if (got == (ssize_t)sizeof(r) && r.magic == APIR_SHM_MAGIC)
            r.message[sizeof(r.message) - 1] = '\0';
        snprintf(why, why_len, "%s", got == (ssize_t)sizeof(r) && r.magic == APIR_SHM_MAGIC ? r.message
                                     : "no hello (it ended, or did not answer within 60 s)");
        return false;
    }
    return true;
}

/* The session's protocol minor: every command this library forwards (the
 * guest's version was settled by virglrenderer, which answers HANDSHAKE
 * itself and never tells the library). */
static bool handshake(struct apir_worker_link *l)
{
    uint8_t *p = apir_worker_link_begin(l, 8);
    struct apir_encoder enc;
    apir_encoder_init(&enc, p, 8);
    apir_encode_u32(&enc, APIR_VERSION_MAJOR);
    apir_encode_u32(&enc, APIR_VERSION_MINOR);
    uint32_t ret = 0;
    return apir_worker_link_submit(l, APIR_CMD_TYPE_HANDSHAKE, 0, &ret) && ret == APIR_HANDSHAKE_MAGIC;
}

/* An initialize code for a worker that ended before its hello. */
static uint32_t ended_code(struct apir_worker_link *l, const struct apir_worker_spec *spec, const char *why)
{
    kill_worker(l);  /* if it still runs, it will not answer */
    const int status = reap(l);
    const int code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    /* Its own codes (backend_lib.h), already logged by it. */
    if (code == APIR_LOAD_CANNOT_OPEN || code == APIR_LOAD_SYMBOL_MISSING ||
        (code > APIR_LOAD_HOST_BASE && code <= APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_INIT_FAILED))
        return (uint32_t)code;
    if (status >= 0 && WIFSIGNALED(status))
        APIR_ERROR("virgl", "ctx %u: its worker %s died of signal %d before serving (%s)", spec->ctx_id, spec->program,
                   WTERMSIG(status), why);
    else
        APIR_ERROR("virgl", "ctx %u: its worker %s did not start (%s, exit status %d): see its lines above",
                   spec->ctx_id, spec->program, why, code);
    return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
}

uint32_t apir_worker_link_open(const struct apir_worker_spec *spec, struct apir_worker_link **out)
{
    *out = NULL;
    pthread_once(&sandbox_once, sandbox_decide);
    struct apir_worker_link *l = calloc(1, sizeof(*l));
    if (!l)
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    l->ctx_id = spec->ctx_id;
    l->pidfd = -1;
    l->uid = -1;
    l->spin_ns = (uint64_t)link_spin_us() * 1000;
    l->timeout_ns = (uint64_t)spec->timeout_ms * 1000000ull;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        APIR_ERROR("virgl", "ctx %u: socketpair: %s", spec->ctx_id, strerror(errno));
        l->sock = -1;
        link_free(l);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    l->sock = fd_above_low_numbers(sv[0]);
    const bool started = spawn(l, spec, sv[1]);
    close(sv[1]);
    if (!started) {
        link_free(l);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    char why[160];
    if (!hello(l, why, sizeof(why))) {
        const uint32_t code = ended_code(l, spec, why);
        link_free(l);
        return code;
    }
    if (!handshake(l)) {
        APIR_ERROR("virgl", "ctx %u: its worker refused the handshake", spec->ctx_id);
        link_free(l);
        return APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED;
    }
    APIR_INFO("virgl", "ctx %u: served by worker process %d%s", spec->ctx_id, (int)l->pid,
              l->uid >= 0 ? " with a uid of its own" : "");
    *out = l;
    return 0;
}

void apir_worker_link_close(struct apir_worker_link *l)
{
    if (l)
        link_free(l);
}

/* ---- commands ----------------------------------------------------------------- */

uint8_t *apir_worker_link_begin(struct apir_worker_link *l, size_t len)
{
    if (len > APIR_SHM_CMD_AREA - APIR_CMD_HEADER_SIZE)
        return NULL;
    l->cmd_len = APIR_CMD_HEADER_SIZE + len;
    return l->ctrl->cmd + APIR_CMD_HEADER_SIZE;
}

static bool worker_hung_up(struct apir_worker_link *l)
{
    struct pollfd p = { .fd = l->sock, .events = 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static void gone(struct apir_worker_link *l, const char *why)
{
    APIR_ERROR("virgl", "ctx %u: its worker %s: the context's commands fail from now on", l->ctx_id, why);
    l->dead = true;
    kill_worker(l);
}

bool apir_worker_link_submit(struct apir_worker_link *l, int32_t cmd_type, int32_t cmd_flags, uint32_t *ret)
{
    if (l->dead)
        return false;
    struct apir_encoder hdr_enc;
    apir_encoder_init(&hdr_enc, l->ctrl->cmd, APIR_CMD_HEADER_SIZE);
    const struct apir_cmd_header hdr = { cmd_type, cmd_flags, APIR_SHM_REPLY_RES_ID };
    apir_encode_header(&hdr_enc, &hdr);
    _Atomic uint32_t *word = (_Atomic uint32_t *)l->reply;
    atomic_store_explicit(word, 0, memory_order_relaxed);
    atomic_store_explicit(&l->ctrl->cmd_len, (uint32_t)l->cmd_len, memory_order_relaxed);
    atomic_fetch_add(&l->ctrl->cmd_seq, 1);  /* seq_cst: publishes the command */
    if (atomic_load(&l->ctrl->host_waiting))
        apir_futex_wake(&l->ctrl->cmd_seq);
    /* As a guest of the daemon waits: a short spin, then the futex. */
    uint32_t v = apir_spin_while_equal(word, 0, l->spin_ns);
    const uint64_t start = v ? 0 : apir_now_ns();
    while (v == 0) {
        atomic_store(&l->ctrl->guest_waiting, 1);
        if (atomic_load(word) == 0)
            apir_futex_wait(word, 0, WORKER_CHECK_NS);
        atomic_store(&l->ctrl->guest_waiting, 0);
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v)
            break;
        if (worker_hung_up(l)) {
            gone(l, "ended");
            return false;
        }
        if (l->timeout_ns && apir_now_ns() - start > l->timeout_ns) {
            gone(l, "did not answer in time (apir.worker.timeout_ms)");
            return false;
        }
    }
    *ret = v - 1;
    return true;
}

const uint8_t *apir_worker_link_reply(struct apir_worker_link *l, size_t *len)
{
    const uint32_t n = atomic_load_explicit(&l->ctrl->reply_len, memory_order_relaxed);
    *len = n < APIR_REPLY_BLOB_SIZE - 4 ? n : APIR_REPLY_BLOB_SIZE - 4;
    return l->reply + 4;
}

bool apir_worker_link_blob_add(struct apir_worker_link *l, int fd, uint32_t id, uint64_t size)
{
    if (l->dead)
        return false;
    const uint8_t tag = APIR_SHM_FD_MSG;
    if (apir_send_fds(l->sock, &tag, 1, &fd, 1) != 1) {
        gone(l, "hung up");
        return false;
    }
    uint8_t *p = apir_worker_link_begin(l, 12);
    struct apir_encoder enc;
    apir_encoder_init(&enc, p, 12);
    apir_encode_u32(&enc, id);
    apir_encode_u64(&enc, size);
    uint32_t ret = 1;
    return apir_worker_link_submit(l, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, &ret) && ret == 0;
}

void apir_worker_link_blob_remove(struct apir_worker_link *l, uint32_t id)
{
    uint8_t *p = apir_worker_link_begin(l, 4);
    struct apir_encoder enc;
    apir_encoder_init(&enc, p, 4);
    apir_encode_u32(&enc, id);
    uint32_t ret;
    apir_worker_link_submit(l, APIR_CMD_TYPE_SHM_BLOB_DESTROY, 0, &ret);
}
