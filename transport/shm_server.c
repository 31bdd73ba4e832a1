/*
 * apir-host's transport: accepts guests on a Unix socket and runs one worker
 * thread per guest.  See shm_proto.h for the wire rules.
 *
 * Threads: the main thread polls the listening socket and every guest socket
 * for hang-up only (it never reads a guest socket after the hello); each
 * worker owns its guest's session and socket reads.  A client is freed by
 * whichever of the two lets go last (a reference count), so a guest that dies
 * mid-graph is freed when the graph returns, and the main loop never blocks
 * on a worker.
 */
#include "shm_server.h"

#include "apir_codec.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "session.h"
#include "shm_proto.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif

struct shm_client {
    struct apir_shm_server *srv;
    int fd;
    int pid;
    atomic_int refs;
    atomic_bool dead;
    struct apir_shm_ctrl *ctrl;
    struct apir_session *session;
    struct shm_client *next;
};

struct apir_shm_server {
    struct apir_host *host;
    int listen_fd;                /* -1: serving one inherited connection */
    int stop_pipe[2];
    char path[108];
    struct shm_client *clients;
    atomic_uint n_clients;
    uint64_t next_id;
    /* Process isolation: each guest is served by a fresh worker process
     * (this program re-executed with --serve-fd), so a guest that makes a
     * backend abort takes down only its own worker. */
    char **worker_argv;
    pid_t *children;
    uint32_t n_children;
    int child_pipe[2];
    /* Refused connections linger until the guest has read why: closing a
     * socket with its hello unread would reset the connection and lose the
     * answer.  Bounded; the oldest goes first. */
    int lingering[16];
    uint32_t n_lingering;
};

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

static void unmap_release(void *ptr, size_t size, void *user)
{
    (void)user;
    munmap(ptr, size);
}

static void client_put(struct shm_client *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->session)
        APIR_INFO("host", "%s: disconnected after %llu commands (%llu graphs, %llu of them kept and recomputed, %llu refused); "
                  "freeing %u buffers", c->session->name, (unsigned long long)c->session->n_commands,
                  (unsigned long long)c->session->n_graphs, (unsigned long long)c->session->n_recomputes,
                  (unsigned long long)c->session->n_refused, c->session->n_buffers);
    if (c->session)
        apir_session_log_profile(c->session);
    apir_session_free(c->session);
    if (c->ctrl)
        munmap(c->ctrl, sizeof(*c->ctrl));
    close(c->fd);
    atomic_fetch_sub(&c->srv->n_clients, 1);
    free(c);
}

/* The descriptor a blob command's guest sent just before it, or -1: then
 * the connection is out of step and is hung up on. */
static int recv_blob_fd(struct shm_client *c, const char *cmd)
{
    int fd = -1, n_fds = 0;
    uint8_t tag = 0;
    if (apir_recv_fds(c->fd, &tag, 1, &fd, 1, &n_fds, 2000) != 1 || n_fds != 1 || tag != APIR_SHM_FD_MSG) {
        if (n_fds)
            close(fd);
        APIR_WARN("host", "%s: %s without its file descriptor", c->session->name, cmd);
        atomic_store(&c->dead, true);
        return -1;
    }
    return fd;
}

/* Transport commands: blobs arrive in order with the backend commands. */
static uint32_t blob_create(struct shm_client *c, struct apir_decoder *req)
{
    uint32_t res_id = apir_decode_u32(req);
    uint64_t size = apir_decode_u64(req);
    if (req->fatal)
        return 1;
    int fd = recv_blob_fd(c, "SHM_BLOB_CREATE");
    if (fd < 0)
        return 1;
    const char *why = "size out of range";
    void *p = size && size <= SIZE_MAX ? apir_memfd_map_checked(fd, (size_t)size, &why) : NULL;
    close(fd);
    if (!p) {
        APIR_WARN("host", "%s: blob %u refused: %s", c->session->name, res_id, why);
        return 1;
    }
    if (res_id < APIR_SHM_FIRST_RES_ID ||
        !apir_session_blob_add(c->session, res_id, p, (size_t)size, unmap_release, NULL)) {
        munmap(p, (size_t)size);
        return 1;
    }
    return 0;
}

/* A file blob maps whole pages; the blob starts skip bytes in. */
static void file_unmap_release(void *ptr, size_t size, void *user)
{
    size_t skip = (size_t)(uintptr_t)user;
    munmap((uint8_t *)ptr - skip, size + skip);
}

/*
 * A range of a file the guest has mapped - a model, which llama.cpp maps and
 * hands its device as host memory - mapped here too, so weights reach the
 * backend without a copy (the page cache is shared).  Private and writable:
 * nothing the host does reaches the file.  A regular file cannot be sealed
 * like a memfd: if the guest shrank it, touching the lost pages would kill
 * this process (SIGBUS).  So only a worker process serving one guest takes
 * file blobs; it alone would go, as on any backend abort.
 */
static uint32_t blob_file(struct shm_client *c, struct apir_decoder *req)
{
    uint32_t res_id = apir_decode_u32(req);
    uint64_t offset = apir_decode_u64(req), size = apir_decode_u64(req), skip = apir_decode_u64(req);
    if (req->fatal)
        return 1;
    int fd = recv_blob_fd(c, "SHM_BLOB_FILE");
    if (fd < 0)
        return 1;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    struct stat st;
    const char *why = NULL;
    uint64_t end;
    if (c->srv->listen_fd >= 0)
        why = "file blobs need a worker process per guest (process isolation)";
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "not a regular file";
    else if (offset % page != 0 || skip >= page || size <= skip || size > SIZE_MAX ||
             __builtin_add_overflow(offset, size, &end) || end > (uint64_t)st.st_size || offset > (uint64_t)INT64_MAX)
        why = "range outside the file or misaligned";
    else if (res_id < APIR_SHM_FIRST_RES_ID)
        why = "reserved blob id";
    void *p = MAP_FAILED;
    if (!why) {
        p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)offset);
        if (p == MAP_FAILED)
            why = "cannot map the file";
        /* Page tables filled for reading at once (a fault per page costs
         * ~6 us on a VM).  Not MAP_POPULATE: on a private writable mapping
         * it write-faults every page, i.e. copies the whole file. */
        else if (madvise(p, (size_t)size, MADV_POPULATE_READ) != 0)
            APIR_DEBUG("host", "%s: MADV_POPULATE_READ: %s", c->session->name, strerror(errno));
    }
    close(fd);
    if (why) {
        APIR_WARN("host", "%s: file blob %u refused: %s", c->session->name, res_id, why);
        return 1;
    }
    if (!apir_session_blob_add(c->session, res_id, (uint8_t *)p + skip, (size_t)(size - skip), file_unmap_release,
                               (void *)(uintptr_t)skip)) {
        munmap(p, (size_t)size);
        return 1;
    }
    APIR_INFO("host", "%s: blob %u: %.1f MiB of a file the guest mapped, shared without a copy", c->session->name, res_id,
              (size - skip) / 1048576.0);
    return 0;
}

static uint32_t blob_destroy(struct shm_client *c, struct apir_decoder *req)
{
    uint32_t res_id = apir_decode_u32(req);
    if (req->fatal || res_id < APIR_SHM_FIRST_RES_ID)
        return 1;
    return apir_session_blob_remove(c->session, res_id) ? 0 : 1;
}

/* Runs one command from the command area; false: hang up on this guest. */
static bool serve_one(struct shm_client *c)
{
    struct apir_shm_ctrl *ctrl = c->ctrl;
    uint32_t len = atomic_load_explicit(&ctrl->cmd_len, memory_order_acquire);
    if (len < APIR_CMD_HEADER_SIZE || len > APIR_SHM_CMD_AREA) {
        APIR_WARN("host", "%s: command length %u out of range", c->session->name, len);
        return false;
    }
    struct apir_decoder req;
    apir_decoder_init(&req, ctrl->cmd, len);
    struct apir_cmd_header hdr;
    apir_decode_header(&req, &hdr);

    struct apir_blob *rb = apir_session_blob_find(c->session, hdr.reply_res_id);
    if (!rb || rb->size < 8 || rb->size == SIZE_MAX) {
        APIR_WARN("host", "%s: reply blob %u unknown", c->session->name, hdr.reply_res_id);
        return false;
    }
    _Atomic uint32_t *reply_word = (_Atomic uint32_t *)rb->ptr;
    struct apir_encoder reply;
    apir_encoder_init(&reply, rb->ptr + 4, rb->size - 4);

    uint32_t ret;
    switch (hdr.cmd_type) {
    case APIR_CMD_TYPE_HANDSHAKE:
        ret = apir_session_handshake(c->session, &req, &reply);
        break;
    case APIR_CMD_TYPE_LOADLIBRARY:
        ret = APIR_LOAD_SUCCESS;  /* the daemon loaded its backend at start */
        break;
    case APIR_CMD_TYPE_FORWARD:
        ret = APIR_FORWARD_BASE + apir_session_forward(c->session, (uint32_t)hdr.cmd_flags, &req, &reply);
        break;
    case APIR_CMD_TYPE_SHM_BLOB_CREATE:
        ret = blob_create(c, &req);
        break;
    case APIR_CMD_TYPE_SHM_BLOB_DESTROY:
        ret = blob_destroy(c, &req);
        break;
    case APIR_CMD_TYPE_SHM_BLOB_FILE:
        ret = blob_file(c, &req);
        break;
    default:
        APIR_WARN("host", "%s: unknown command type %d", c->session->name, hdr.cmd_type);
        ret = APIR_FORWARD_NO_DISPATCH;
        break;
    }
    /* The reply blob may have been destroyed by this very command. */
    if (apir_session_blob_find(c->session, hdr.reply_res_id) != rb)
        return false;
    atomic_store(reply_word, ret + 1);
    if (atomic_load(&ctrl->guest_waiting))
        apir_futex_wake(reply_word);
    /* A keyed graph accepted by this command is computed now, while the
     * guest goes on; the next command is read after it. */
    apir_session_run_deferred(c->session);
    return !atomic_load(&c->dead);
}

static void *client_worker(void *arg)
{
    struct shm_client *c = arg;
    struct apir_shm_ctrl *ctrl = c->ctrl;
    const uint64_t spin_ns = (uint64_t)apir_host_spin_us() * 1000;
    /* A fresh control blob starts at 0; the guest may ring before we run. */
    uint32_t seen = 0;

    while (!atomic_load(&c->dead)) {
        uint32_t seq = apir_spin_while_equal(&ctrl->cmd_seq, seen, spin_ns);
        if (seq == seen) {
            /* Idle: sleep until the guest rings or the main thread sees it hang up. */
            atomic_store(&ctrl->host_waiting, 1);
            if (atomic_load(&ctrl->cmd_seq) == seen && !atomic_load(&c->dead))
                apir_futex_wait(&ctrl->cmd_seq, seen, 0);
            atomic_store(&ctrl->host_waiting, 0);
            continue;
        }
        seen = seq;
        if (!serve_one(c))
            break;
    }
    /* Make the main loop notice (it polls for hang-up), then let go. */
    shutdown(c->fd, SHUT_RDWR);
    client_put(c);
    return NULL;
}

static void refuse(int fd, const char *message)
{
    struct apir_shm_hello_reply r = { .magic = APIR_SHM_MAGIC, .status = 1 };
    snprintf(r.message, sizeof(r.message), "%s", message);
    apir_send_fds(fd, &r, sizeof(r), NULL, 0);
    APIR_WARN("host", "guest refused: %s", message);
}

static void accept_client(struct apir_shm_server *srv, int fd)
{
    struct apir_shm_hello hello;
    int fds[2], n_fds = 0;
    ssize_t n = apir_recv_fds(fd, &hello, sizeof(hello), fds, 2, &n_fds, 2000);
    struct shm_client *c = NULL;
    void *ctrl = NULL, *reply = NULL;
    const char *why = NULL;

    if (n != (ssize_t)sizeof(hello) || n_fds != 2 || hello.magic != APIR_SHM_MAGIC) {
        why = "malformed hello";
    } else if (hello.version != APIR_SHM_VERSION) {
        why = "unsupported shm transport version";
    } else if (atomic_load(&srv->n_clients) >= srv->host->cfg.limits.max_clients) {
        why = "too many clients";
    } else if (hello.ctrl_size != APIR_SHM_CTRL_SIZE || hello.reply_size < 8 || hello.reply_size > (1u << 20)) {
        why = "bad blob sizes";
    } else if (!(ctrl = apir_memfd_map_checked(fds[0], APIR_SHM_CTRL_SIZE, &why))) {
    } else if (!(reply = apir_memfd_map_checked(fds[1], (size_t)hello.reply_size, &why))) {
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    if (!why) {
        c = calloc(1, sizeof(*c));
        char name[48];
        snprintf(name, sizeof(name), "guest#%llu(pid %d)", (unsigned long long)(srv->listen_fd < 0 ? srv->next_id : ++srv->next_id),
                 hello.pid);
        if (c)
            c->session = apir_session_new(srv->host, name);
        if (c && c->session) {
            /* serve_one computes accepted keyed graphs after the reply */
            const char *defer = getenv("APIR_HOST_DEFER");
            c->session->defer_graphs = !(defer && !strcmp(defer, "0"));
        }
        if (!c || !c->session ||
            !apir_session_blob_add(c->session, APIR_SHM_REPLY_RES_ID, reply, (size_t)hello.reply_size, unmap_release, NULL))
            why = "out of memory";
        else
            reply = NULL;  /* owned by the session now */
    }
    if (why) {
        refuse(fd, why);
        if (ctrl)
            munmap(ctrl, APIR_SHM_CTRL_SIZE);
        if (reply)
            munmap(reply, (size_t)hello.reply_size);
        if (c) {
            apir_session_free(c->session);
            free(c);
        }
        close(fd);
        return;
    }
    c->srv = srv;
    c->fd = fd;
    c->pid = hello.pid;
    c->ctrl = ctrl;
    atomic_init(&c->refs, 2);  /* the main loop's and the worker's */
    atomic_fetch_add(&srv->n_clients, 1);

    struct apir_shm_hello_reply r = { .magic = APIR_SHM_MAGIC, .status = 0 };
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (apir_send_fds(fd, &r, sizeof(r), NULL, 0) != (ssize_t)sizeof(r) || pthread_create(&th, &attr, client_worker, c) != 0) {
        pthread_attr_destroy(&attr);
        atomic_store(&c->refs, 1);
        client_put(c);
        return;
    }
    pthread_attr_destroy(&attr);
    c->next = srv->clients;
    srv->clients = c;
    APIR_INFO("host", "%s connected", c->session->name);
}

/* Process isolation: hand the connection to a new worker process. */
static void linger_close(struct apir_shm_server *srv, int fd)
{
    shutdown(fd, SHUT_WR);
    if (srv->n_lingering == sizeof(srv->lingering) / sizeof(srv->lingering[0])) {
        close(srv->lingering[0]);
        memmove(srv->lingering, srv->lingering + 1, (srv->n_lingering - 1) * sizeof(int));
        srv->n_lingering--;
    }
    srv->lingering[srv->n_lingering++] = fd;
}

/* A lingering socket spoke or hung up: drain it (closing any fds it sent);
 * close it once the guest has gone. */
static void linger_service(struct apir_shm_server *srv, uint32_t i, short revents)
{
    int fd = srv->lingering[i];
    if (!(revents & (POLLHUP | POLLERR | POLLNVAL))) {
        char buf[256];
        int fds[4], n_fds;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        while (poll(&p, 1, 0) > 0 && (p.revents & POLLIN) && apir_recv_fds(fd, buf, sizeof(buf), fds, 4, &n_fds, 0) > 0)
            for (int k = 0; k < n_fds; k++)
                close(fds[k]);
        if (!(p.revents & (POLLHUP | POLLERR)))
            return;
    }
    close(fd);
    srv->lingering[i] = srv->lingering[--srv->n_lingering];
}

static void spawn_worker(struct apir_shm_server *srv, int fd)
{
    if (srv->n_children >= srv->host->cfg.limits.max_clients) {
        refuse(fd, "too many clients");
        linger_close(srv, fd);
        return;
    }
    uint64_t id = ++srv->next_id;
    char fd_arg[16], id_arg[24];
    snprintf(fd_arg, sizeof(fd_arg), "%d", fd);
    snprintf(id_arg, sizeof(id_arg), "%llu", (unsigned long long)id);
    int argc = 0;
    while (srv->worker_argv[argc])
        argc++;
    char **argv = calloc((size_t)argc + 5, sizeof(char *));
    if (!argv) {
        refuse(fd, "out of memory");
        close(fd);
        return;
    }
    for (int i = 0; i < argc; i++)
        argv[i] = srv->worker_argv[i];
    argv[argc++] = "--serve-fd";
    argv[argc++] = fd_arg;
    argv[argc++] = "--client-id";
    argv[argc++] = id_arg;
    pid_t pid = fork();
    if (pid == 0) {
        /* Workers go with the daemon: a killed host is a dead host. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        fcntl(fd, F_SETFD, 0);  /* the worker inherits this one fd */
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    free(argv);
    close(fd);
    if (pid < 0) {
        APIR_ERROR("host", "cannot start a worker process: %s", strerror(errno));
        return;
    }
    srv->children[srv->n_children++] = pid;
    APIR_INFO("host", "guest#%llu: worker process %d", (unsigned long long)id, (int)pid);
}

static void reap_children(struct apir_shm_server *srv)
{
    char buf[64];
    while (read(srv->child_pipe[0], buf, sizeof(buf)) > 0)
        ;
    pid_t pid;
    int status;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (uint32_t i = 0; i < srv->n_children; i++) {
            if (srv->children[i] != pid)
                continue;
            srv->children[i] = srv->children[--srv->n_children];
            if (WIFSIGNALED(status))
                APIR_WARN("host", "worker process %d died of signal %d; its guest is disconnected, others go on",
                          (int)pid, WTERMSIG(status));
            break;
        }
    }
}

static void drop_client(struct apir_shm_server *srv, struct shm_client *c)
{
    struct shm_client **pp = &srv->clients;
    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    atomic_store(&c->dead, true);
    shutdown(c->fd, SHUT_RDWR);            /* unblocks a worker in recvmsg */
    apir_futex_wake(&c->ctrl->cmd_seq);     /* and one asleep on the doorbell */
    client_put(c);
}

struct apir_shm_server *apir_shm_server_new(struct apir_host *host, const char *path, char *err, size_t err_len)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "socket path too long: %s", path);
        return NULL;
    }
    /* Create the socket's directory (e.g. $XDG_RUNTIME_DIR/apir), private. */
    char dir[sizeof(addr.sun_path)];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "cannot create %s: %s", dir, strerror(errno));
            return NULL;
        }
    }
    struct apir_shm_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    srv->host = host;
    srv->stop_pipe[0] = srv->stop_pipe[1] = -1;
    srv->child_pipe[0] = srv->child_pipe[1] = -1;
    snprintf(srv->path, sizeof(srv->path), "%s", path);
    srv->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    strcpy(addr.sun_path, path);
    if (srv->listen_fd < 0 || pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
        pipe2(srv->child_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        goto fail;
    }
    /* A socket file left by a host that died: replace it, unless a live host
     * still answers there. */
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
        close(probe);
        snprintf(err, err_len, "another apir-host is serving %s", path);
        goto fail;
    }
    if (probe >= 0)
        close(probe);
    unlink(path);
    if (bind(srv->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(srv->listen_fd, 64) != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, strerror(errno));
        goto fail;
    }
    return srv;
fail:
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    if (srv->stop_pipe[0] >= 0) {
        close(srv->stop_pipe[0]);
        close(srv->stop_pipe[1]);
    }
    if (srv->child_pipe[0] >= 0) {
        close(srv->child_pipe[0]);
        close(srv->child_pipe[1]);
    }
    free(srv);
    return NULL;
}

bool apir_shm_server_isolate(struct apir_shm_server *srv, char **worker_argv)
{
    srv->children = calloc(srv->host->cfg.limits.max_clients ? srv->host->cfg.limits.max_clients : 1, sizeof(pid_t));
    if (!srv->children)
        return false;
    srv->worker_argv = worker_argv;
    sigchld_fd = srv->child_pipe[1];
    struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP };
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGCHLD, &sa, NULL) == 0;
}

int apir_shm_serve_fd(struct apir_host *host, int fd, uint64_t client_id)
{
    struct apir_shm_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return -1;
    srv->host = host;
    srv->listen_fd = -1;
    srv->next_id = client_id;
    if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(srv->child_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        free(srv);
        return -1;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    accept_client(srv, fd);
    int rc = srv->clients ? apir_shm_server_run(srv) : -1;
    apir_shm_server_free(srv);
    return rc;
}

void apir_shm_server_stop(struct apir_shm_server *srv)
{
    char b = 1;
    ssize_t r = write(srv->stop_pipe[1], &b, 1);
    (void)r;
}

int apir_shm_server_run(struct apir_shm_server *srv)
{
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    for (;;) {
        /* A worker process serving one guest ends with it. */
        if (srv->listen_fd < 0 && !srv->clients) {
            free(pfds);
            return 0;
        }
        size_t n = 3 + srv->n_lingering;
        for (struct shm_client *c = srv->clients; c; c = c->next)
            n++;
        if (n > pcap) {
            struct pollfd *p = realloc(pfds, n * 2 * sizeof(*p));
            if (!p) {
                free(pfds);
                return -1;
            }
            pfds = p;
            pcap = n * 2;
        }
        pfds[0] = (struct pollfd){ .fd = srv->listen_fd, .events = POLLIN };
        pfds[1] = (struct pollfd){ .fd = srv->stop_pipe[0], .events = POLLIN };
        pfds[2] = (struct pollfd){ .fd = srv->child_pipe[0], .events = POLLIN };
        size_t i = 3;
        for (struct shm_client *c = srv->clients; c; c = c->next)
            pfds[i++] = (struct pollfd){ .fd = c->fd, .events = 0 };  /* hang-up only */
        const size_t linger_at = i;
        const uint32_t n_linger = srv->n_lingering;
        for (uint32_t k = 0; k < n_linger; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->lingering[k], .events = POLLIN };
        int r = poll(pfds, n, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            free(pfds);
            return -1;
        }
        if (pfds[1].revents) {
            free(pfds);
            return 0;
        }
        if (pfds[2].revents & POLLIN)
            reap_children(srv);
        for (uint32_t k = n_linger; k-- > 0;)
            if (pfds[linger_at + k].revents)
                linger_service(srv, k, pfds[linger_at + k].revents);
        /* Collect hung-up clients first: the list changes as we drop. */
        i = 3;
        struct shm_client *c = srv->clients;
        while (c) {
            struct shm_client *next = c->next;
            if (pfds[i++].revents & (POLLHUP | POLLERR | POLLNVAL))
                drop_client(srv, c);
            c = next;
        }
        if (pfds[0].revents & POLLIN) {
            int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                if (srv->worker_argv)
                    spawn_worker(srv, fd);
                else
                    accept_client(srv, fd);
            }
        }
    }
}

void apir_shm_server_free(struct apir_shm_server *srv)
{
    if (!srv)
        return;
    while (srv->clients)
        drop_client(srv, srv->clients);
    for (uint32_t i = 0; i < srv->n_children; i++)
        kill(srv->children[i], SIGTERM);
    for (int i = 0; i < 500 && srv->n_children > 0; i++) {
        reap_children(srv);
        if (srv->n_children)
            usleep(10000);
    }
    for (uint32_t i = 0; i < srv->n_children; i++)
        kill(srv->children[i], SIGKILL);
    free(srv->children);
    for (uint32_t i = 0; i < srv->n_lingering; i++)
        close(srv->lingering[i]);
    /* Workers free their guests when their current command returns; give
     * them a bounded time (this is shutdown, not a hot path). */
    for (int i = 0; i < 500 && atomic_load(&srv->n_clients) > 0; i++)
        usleep(10000);
    if (srv->listen_fd >= 0) {
        close(srv->listen_fd);
        unlink(srv->path);
    }
    close(srv->stop_pipe[0]);
    close(srv->stop_pipe[1]);
    close(srv->child_pipe[0]);
    close(srv->child_pipe[1]);
    free(srv);
}
