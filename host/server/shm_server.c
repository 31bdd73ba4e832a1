/*
 * apir-host's server for the same-host transport: accepts guests on a Unix
 * socket and serves each on a thread here, or in a worker process
 * (workers.c).  transport/shm_proto.h has the wire rules.  The stream
 * endpoints (tcp:, tls:, vsock:; stream_server.c) share this loop, its
 * admission, limits, workers and stats: only their framing is their own.
 *
 * Threads: the main thread polls the listening socket and every guest socket
 * for hang-up only (it never reads a guest socket after the hello); each
 * worker owns its guest's session and socket reads.  A client is freed by
 * whichever of the two lets go last (a reference count), so a guest that dies
 * mid-graph is freed when the graph returns, and the main loop never blocks
 * on a worker.
 *
 * Denial of service: the accept loop never waits for a guest, and what a
 * connection costs is charged to its own tenant only (admission, below;
 * shm_server_impl.h): a local peer's container - its cgroup, read at accept
 * from the kernel's word (SO_PEERCRED), with its uid - or its uid, or a
 * stream peer's address.  Before its hello a connection takes a place among
 * the pending (polled with the rest, closed at its deadline) within its
 * tenant's connection count and connect bucket, nothing else: no worker, no
 * thread, no session.  Once its hello is in - and for tcp: its token
 * checked - its tenant's spawn bucket pays for the worker process (which
 * reads and checks the hello) or the session.  So a peer that connects and
 * hangs up in a loop, or holds silent connections, exhausts only its own
 * buckets and counts.  A worker process whose guest hangs up in the middle
 * of a command, or whose command runs past the time budget, ends itself: a
 * kernel cannot be interrupted otherwise.  In one process the CPU backend's abort callback stops a graph
 * between nodes instead.  A guest's log lines come out of its session's
 * budget (apir_log.h); a tenant's, before it is a guest, out of its own.
 *
 * The socket: bound here with the mode and group asked for (0660 by
 * default), or passed by a service manager (socket activation,
 * host/server/service.c), which then owns the file.  Guests are named in the log
 * by what the kernel says of them (SO_PEERCRED: pid, uid, gid), not by the
 * pid their hello claims.
 *
 * What the host does (apir stat, apir ps, the metrics file: host_stats.h,
 * control.h): whoever serves a guest - its thread here, or its worker
 * process - publishes the session's counters into a stats page after each
 * command (memory stores only); this loop reads the pages when the control
 * socket asks or the metrics file is due (its poll timeout), and adds a
 * departed guest's counters to the totals when it lets go of it.
 */
#include "shm_server.h"
#include "shm_server_impl.h"

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

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif


static void unmap_release(void *ptr, size_t size, void *user)
{
    (void)user;
    munmap(ptr, size);
}

void apir_client_put(struct shm_client *c)
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
    apir_session_free(c->session);
    if (c->stats_owned)
        free(c->stats);
    if (c->ctrl)
        munmap(c->ctrl, sizeof(*c->ctrl));
    apir_tls_free(c->tls);
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

/*
 * A blob's memory must be the guest's, not ours: the host maps blobs
 * populated (MAP_POPULATE), so the pages of a sparse memfd - a sealed 1 GiB
 * file never written - would be allocated by, and charged to, the host at
 * no cost to the guest.  The guest commits its blobs before sending them
 * (shm_client.c populates them), so a blob with holes is refused.  What a
 * guest punches out later is faulted back in by the host at most up to its
 * blob quota (max_blob_bytes).
 */
static bool guest_committed(int fd, uint64_t size, const char **why)
{
    const uint64_t page = apir_page_size();
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *why = "cannot stat blob";
        return false;
    }
    uint64_t need = size > UINT64_MAX - page ? UINT64_MAX : (size + page - 1) / page * page;
    if ((uint64_t)st.st_blocks * 512u < need) {
        *why = "blob memory not committed by the guest (sparse memfd)";
        return false;
    }
    return true;
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
    void *p = NULL;
    if (size && size <= SIZE_MAX && guest_committed(fd, size, &why))
        p = apir_memfd_map_checked(fd, (size_t)size, &why);
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
    const uint64_t page = apir_page_size();
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

uint32_t apir_client_run_command(struct shm_client *c, const struct apir_cmd_header *hdr, struct apir_decoder *req,
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
    /* Held for the command, which may destroy it: its memory stays mapped
     * until the reply word is written (or not) below. */
    apir_session_blob_hold(rb);
    _Atomic uint32_t *reply_word = (_Atomic uint32_t *)rb->ptr;
    struct apir_encoder reply;
    apir_encoder_init(&reply, rb->ptr + 4, rb->size - 4);

    bool handled;
    uint32_t ret = apir_client_run_command(c, &hdr, &req, &reply, &handled);
    if (!handled) switch (hdr.cmd_type) {
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
    const bool reply_gone = rb->closing;
    apir_session_blob_put(c->session, rb);
    if (reply_gone) {
        APIR_WARN("host", "%s: the command destroyed its own reply blob %u: hanging up", c->session->name,
                  hdr.reply_res_id);
        return false;
    }
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
    /* What this thread logs from now on is the guest's doing. */
    apir_log_budget_enter(&c->session->log);

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
        const uint64_t began = apir_now_ns();
        atomic_store_explicit(&c->busy_since_ns, began, memory_order_relaxed);
        bool go_on = serve_one(c);
        atomic_store_explicit(&c->busy_since_ns, 0, memory_order_relaxed);
        /* For apir stat: stores into the stats page, nothing more. */
        apir_stats_publish(c->stats, c->session, APIR_GUEST_SERVING, began, c->reported_pid);
        if (!go_on)
            break;
    }
    apir_log_budget_flush(&c->session->log);
    apir_log_budget_leave(NULL);
    /* Make the main loop notice (it polls for hang-up), then let go. */
    shutdown(c->fd, SHUT_RDWR);
    apir_client_put(c);
    return NULL;
}

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
static void refuse_peer(int fd, const char *message, bool with_comm)
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
void apir_server_refuse(struct apir_shm_server *srv, int fd, const char *message)
{
    srv->refused_connections++;
    refuse_peer(fd, message, true);
}

void apir_server_status_changed(struct apir_shm_server *srv)
{
    if (srv->listen_fd < 0 || !apir_service_notify_enabled())
        return;
    unsigned n = srv->worker_argv ? srv->n_children : 0;
    for (const struct shm_client *c = srv->clients; c; c = c->next)
        n++;
    apir_service_status("serving %u guest%s on unix:%s", n, n == 1 ? "" : "s", srv->path);
}

/*
 * Ends a graph early (ggml's CPU backend asks between nodes): its guest has
 * gone, or the command has run past its time budget.
 */
static bool compute_should_stop(void *data)
{
    struct shm_client *c = data;
    if (atomic_load_explicit(&c->dead, memory_order_relaxed))
        return true;
    const uint64_t budget_ns = (uint64_t)c->srv->host->cfg.limits.graph_timeout_ms * 1000000ull;
    uint64_t since = atomic_load_explicit(&c->busy_since_ns, memory_order_relaxed);
    return budget_ns && since && apir_now_ns() - since > budget_ns;
}

/* Backends that take an abort callback (the CPU backend) get theirs now. */
static void set_abort_callbacks(struct shm_client *c)
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

uint64_t apir_server_next_id(struct apir_shm_server *srv)
{
    return srv->listen_fd < 0 && !srv->n_net ? srv->next_id : ++srv->next_id;
}

struct shm_client *apir_client_new(struct apir_shm_server *srv, const char *name, const struct ucred *peer,
                                   int32_t reported_pid, const char **why)
{
    struct shm_client *c = calloc(1, sizeof(*c));
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

bool apir_client_serve(struct shm_client *c, int fd, void *(*fn)(void *))
{
    struct apir_shm_server *srv = c->srv;
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

/* Reads the hello (waiting at most timeout_ms) and starts serving the guest,
 * or refuses it; fd is the client's or closed either way.  tenant: the
 * daemon's admission (a guest's session is its spawn), NULL in a worker. */
static void accept_client(struct apir_shm_server *srv, int fd, const struct ucred *peer, struct apir_tenant *tenant,
                          int timeout_ms)
{
    struct apir_shm_hello hello;
    int fds[2], n_fds = 0;
    ssize_t n = apir_recv_fds(fd, &hello, sizeof(hello), fds, 2, &n_fds, timeout_ms);
    struct shm_client *c = NULL;
    void *ctrl = NULL, *reply = NULL;
    const char *why = NULL;

    if (n != (ssize_t)sizeof(hello) || n_fds != 2 || hello.magic != APIR_SHM_MAGIC) {
        why = "malformed hello";
    } else if (hello.version != APIR_SHM_VERSION) {
        why = "unsupported shm transport version";
    } else if (atomic_load(&srv->n_clients) >= srv->host->cfg.limits.max_clients) {
        why = "too many clients";
    } else if ((why = apir_admit_guest(srv, tenant)) != NULL) {
    } else if (hello.ctrl_size != APIR_SHM_CTRL_SIZE || hello.reply_size < 8 || hello.reply_size > (1u << 20)) {
        why = "bad blob sizes";
    } else if (!(ctrl = apir_memfd_map_checked(fds[0], APIR_SHM_CTRL_SIZE, &why))) {
    } else if (!(reply = apir_memfd_map_checked(fds[1], (size_t)hello.reply_size, &why))) {
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    unsigned long long id = 0;
    if (!why) {
        /* Named by the pid the kernel gives (SO_PEERCRED, in this host's
         * pid namespace): the hello's is the guest's own word, and in a
         * container usually 1. */
        char name[48];
        id = apir_server_next_id(srv);
        if (peer->pid > 0)
            snprintf(name, sizeof(name), "guest#%llu(pid %d)", id, (int)peer->pid);
        else
            snprintf(name, sizeof(name), "guest#%llu(says pid %d)", id, (int)hello.pid);
        c = apir_client_new(srv, name, peer, hello.pid, &why);
        if (c && !apir_session_blob_add(c->session, APIR_SHM_REPLY_RES_ID, reply, (size_t)hello.reply_size,
                                        unmap_release, NULL))
            why = "out of memory";
        else if (c)
            reply = NULL;  /* owned by the session now */
    }
    if (why) {
        if (srv->listen_fd >= 0)
            srv->refused_connections++;
        refuse_peer(fd, why, srv->listen_fd >= 0);
        if (ctrl)
            munmap(ctrl, APIR_SHM_CTRL_SIZE);
        if (reply)
            munmap(reply, (size_t)hello.reply_size);
        if (c) {
            apir_session_free(c->session);
            if (c->stats_owned)
                free(c->stats);
            free(c);
        }
        close(fd);
        return;
    }
    c->ctrl = ctrl;
    c->id = id;
    c->tenant = tenant ? tenant->key : 0;
    if (srv->listen_fd >= 0)
        apir_peer_comm(peer->pid, c->comm, sizeof(c->comm));
    struct apir_shm_hello_reply r = { .magic = APIR_SHM_MAGIC, .status = 0 };
    if (apir_send_fds(fd, &r, sizeof(r), NULL, 0) != (ssize_t)sizeof(r)) {
        c->fd = fd;
        atomic_init(&c->refs, 1);
        atomic_fetch_add(&srv->n_clients, 1);
        apir_client_put(c);
        return;
    }
    const char *name = c->session->name;
    char who[160];
    apir_peer_describe(peer, srv->listen_fd >= 0, who, sizeof(who));
    if (!apir_client_serve(c, fd, client_worker))
        return;
    if (hello.pid != peer->pid)
        APIR_INFO("host", "%s connected: %s; says pid %d", name, who, (int)hello.pid);
    else
        APIR_INFO("host", "%s connected: %s", name, who);
}

/* A refused connection: kept open until the guest has read why. */
void apir_server_linger_close(struct apir_shm_server *srv, int fd)
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
static uint64_t tenant_local_key(const struct apir_shm_server *srv, int fd, const struct ucred *peer, char *name,
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

struct apir_tenant *apir_tenant_enter(struct apir_shm_server *srv, uint64_t key, const char *name)
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

void apir_tenant_leave(struct apir_shm_server *srv)
{
    apir_log_budget_leave(srv->log_before);
    srv->log_before = NULL;
    srv->tenant_now = NULL;
}

/* Connections of one tenant: waiting for their hello, and served (workers,
 * or clients on threads here). */
static uint32_t tenant_connections(const struct apir_shm_server *srv, uint64_t key)
{
    uint32_t n = 0;
    if (srv->worker_argv)
        for (uint32_t i = 0; i < srv->host->cfg.limits.max_clients; i++)
            n += srv->children[i].pid != 0 && srv->children[i].tenant == key;
    for (const struct shm_client *c = srv->clients; c; c = c->next)
        n += c->tenant == key;
    for (uint32_t i = 0; i < srv->n_pending; i++)
        n += srv->pending[i].tenant == key;
    return n;
}

const char *apir_admit_connection(struct apir_shm_server *srv, struct apir_tenant *t)
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

const char *apir_admit_guest(struct apir_shm_server *srv, struct apir_tenant *t)
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

void apir_tenant_spawned(struct apir_shm_server *srv, uint64_t tenant, uint32_t children_before)
{
    if (!srv->children || srv->n_children <= children_before)
        return;  /* no worker was started */
    for (uint32_t i = 0; i < srv->host->cfg.limits.max_clients; i++)
        if (srv->children[i].pid != 0 && srv->children[i].client_id == srv->next_id)
            srv->children[i].tenant = tenant;
}

/* A new connection waits for its hello among the polled (either isolation). */
void apir_server_add_pending(struct apir_shm_server *srv, int fd, const struct ucred *peer, uint64_t tenant,
                             bool stream)
{
    if (srv->n_pending == APIR_MAX_PENDING) {
        const char *why = "too many connections waiting for their hello";
        if (stream) {
            char name[64];
            apir_net_peer_name(fd, name, sizeof(name));
            apir_stream_refuse(srv, fd, name, false, why);
        } else {
            apir_server_refuse(srv, fd, why);
            apir_server_linger_close(srv, fd);
        }
        return;
    }
    uint64_t deadline = apir_now_ns() + (uint64_t)srv->host->cfg.limits.handshake_timeout_ms * 1000000ull;
    srv->pending[srv->n_pending++] = (struct pending_conn){ .fd = fd, .peer = *peer, .tenant = tenant,
                                                            .deadline_ns = deadline, .stream = stream };
}

/*
 * A Unix socket guest that spoke: its hello is in (or it hung up).  With
 * workers, the daemon only looks (a byte peeked: nothing is read, no
 * descriptor taken) and hands the connection on; the worker reads and
 * checks the hello.  So a connection that says nothing, or hangs up, never
 * costs a worker.
 */
static void pending_spoke(struct apir_shm_server *srv, const struct pending_conn *p)
{
    if (!srv->worker_argv) {
        accept_client(srv, p->fd, &p->peer, srv->tenant_now, 0);
        return;
    }
    char b;
    const ssize_t n = recv(p->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
        APIR_DEBUG("host", "connection (%s) closed before its hello", srv->tenant_now->name);
        close(p->fd);
        return;
    }
    const char *why = apir_admit_guest(srv, srv->tenant_now);
    if (why) {
        apir_server_refuse(srv, p->fd, why);
        apir_server_linger_close(srv, p->fd);
        return;
    }
    const uint32_t before = srv->n_children;
    apir_workers_spawn(srv, p->fd, &p->peer, NULL, false);
    apir_tenant_spawned(srv, p->tenant, before);
}

/* A pending connection spoke (its hello, read without waiting) or timed out. */
static void pending_service(struct apir_shm_server *srv, uint32_t i, short revents, uint64_t now)
{
    struct pending_conn p = srv->pending[i];
    if (!revents && now < p.deadline_ns)
        return;
    apir_tenant_enter(srv, p.tenant, NULL);
    if (p.stream) {
        if (apir_stream_pending(srv, &srv->pending[i], revents, now))
            srv->pending[i] = srv->pending[--srv->n_pending];
        apir_tenant_leave(srv);
        return;
    }
    srv->pending[i] = srv->pending[--srv->n_pending];
    if (revents) {
        pending_spoke(srv, &p);
    } else {
        char who[160];
        apir_peer_describe(&p.peer, true, who, sizeof(who));
        APIR_WARN("host", "connection (%s) sent no hello in %u ms: closed", who, srv->host->cfg.limits.handshake_timeout_ms);
        close(p.fd);
    }
    apir_tenant_leave(srv);
}

/* A new connection on the listening socket: nothing is spent on it but a
 * place among the pending, and only within its tenant's share. */
static void accept_new(struct apir_shm_server *srv)
{
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ucred peer;
    apir_peer_cred(fd, &peer);
    if (peer.uid == (uid_t)-1) {
        apir_server_refuse(srv, fd, "peer credentials unknown");
        apir_server_linger_close(srv, fd);
        return;
    }
    char name[96];
    const uint64_t key = tenant_local_key(srv, fd, &peer, name, sizeof(name));
    struct apir_tenant *t = apir_tenant_enter(srv, key, name);
    const char *why = apir_admit_connection(srv, t);
    if (why) {
        apir_server_refuse(srv, fd, why);
        apir_server_linger_close(srv, fd);
    } else {
        apir_server_add_pending(srv, fd, &peer, key, false);
    }
    apir_tenant_leave(srv);
}

static void drop_client(struct apir_shm_server *srv, struct shm_client *c)
{
    struct shm_client **pp = &srv->clients;
    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    /* Its counters join the totals as it leaves the list (what a command
     * still running adds afterwards is not counted). */
    struct apir_guest_counters last;
    apir_stats_read(c->stats, &last);
    apir_stats_retire(&srv->retired, &last);
    atomic_store(&c->dead, true);
    shutdown(c->fd, SHUT_RDWR);            /* unblocks a worker in recvmsg */
    if (c->ctrl)
        apir_futex_wake(&c->ctrl->cmd_seq); /* and one asleep on the doorbell */
    apir_client_put(c);
    apir_server_status_changed(srv);
}

void apir_shm_listen_options_default(struct apir_shm_listen_options *opts)
{
    opts->mode = APIR_SHM_SOCKET_MODE_DEFAULT;
    opts->group = NULL;
    const char *m = getenv("APIR_SOCKET_MODE");
    if (m && *m && apir_shm_parse_socket_mode(m, &opts->mode) != 0) {
        APIR_WARN("host", "APIR_SOCKET_MODE=%s is not an octal mode (0 to 0777): using %04o", m,
                  APIR_SHM_SOCKET_MODE_DEFAULT);
        opts->mode = APIR_SHM_SOCKET_MODE_DEFAULT;
    }
    const char *g = getenv("APIR_SOCKET_GROUP");
    if (g && *g)
        opts->group = g;
}

int apir_shm_parse_socket_mode(const char *s, unsigned *mode)
{
    unsigned v = 0;
    if (!s || !*s || strlen(s) > 4)
        return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '7')
            return -1;
        v = v * 8 + (unsigned)(*p - '0');
    }
    if (v > 0777)
        return -1;
    *mode = v;
    return 0;
}

const char *apir_shm_server_path(const struct apir_shm_server *srv)
{
    return srv->path;
}

bool apir_shm_server_control(struct apir_shm_server *srv, const struct apir_control_config *cfg, char *err,
                             size_t err_len)
{
    if (srv->control || srv->listen_fd < 0) {
        snprintf(err, err_len, "the control channel is the daemon's, set once");
        return false;
    }
    srv->control = apir_control_new(cfg, err, err_len);
    return srv->control != NULL;
}

/* The guests served on threads here, as rows of a view. */
static uint32_t thread_rows(struct apir_shm_server *srv, struct apir_guest_row *rows, uint32_t max)
{
    uint32_t n = 0;
    for (const struct shm_client *c = srv->clients; c && n < max; c = c->next, n++) {
        struct apir_guest_row *r = &rows[n];
        *r = (struct apir_guest_row){ .id = c->id, .pid = c->peer.pid, .uid = c->peer.uid, .gid = c->peer.gid,
                                      .slot = -1, .connected_ns = c->connected_ns };
        snprintf(r->comm, sizeof(r->comm), "%s", c->comm);
        r->readable = apir_stats_read(c->stats, &r->c);
    }
    return n;
}

/* Renders the document the control socket or the metrics file asks for:
 * a view of the host made now (apir_control_render_fn). */
static char *render_view(void *user, enum apir_stats_format format, size_t *len)
{
    struct apir_shm_server *srv = user;
    uint32_t max = 0;
    for (const struct shm_client *c = srv->clients; c; c = c->next)
        max++;
    if (srv->worker_argv)
        max += srv->n_children;
    const char *streams[APIR_MAX_NET_LISTENERS];
    for (uint32_t i = 0; i < srv->n_net; i++)
        streams[i] = srv->net[i].endpoint;
    struct apir_host_view v = {
        .host = srv->host,
        .socket_path = srv->path,
        .streams = streams,
        .n_streams = srv->n_net,
        .isolated = srv->worker_argv != NULL,
        .pid = (int32_t)getpid(),
        .now_ns = apir_now_ns(),
        .start_ns = srv->start_ns,
        .start_unix_ms = srv->start_unix_ms,
        .accepted = srv->next_id,
        .refused_connections = srv->refused_connections,
        .retired = srv->retired,
        .guests = calloc(max ? max : 1, sizeof(struct apir_guest_row)),
    };
    if (!v.guests)
        return NULL;
    v.n_guests = srv->worker_argv ? apir_workers_rows(srv, v.guests, max) : thread_rows(srv, v.guests, max);
    char *doc = apir_stats_render(&v, format, len);
    free(v.guests);
    return doc;
}

/* A server with its wake-up pipes and no socket yet. */
static struct apir_shm_server *server_alloc(struct apir_host *host, char *err, size_t err_len)
{
    struct apir_shm_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    srv->host = host;
    srv->start_ns = apir_now_ns();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    srv->start_unix_ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000;
    srv->listen_fd = -1;
    srv->stop_pipe[0] = srv->stop_pipe[1] = -1;
    srv->child_pipe[0] = srv->child_pipe[1] = -1;
    if (pipe2(srv->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(srv->child_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, err_len, "pipe: %s", strerror(errno));
        if (srv->stop_pipe[0] >= 0) {
            close(srv->stop_pipe[0]);
            close(srv->stop_pipe[1]);
        }
        free(srv);
        return NULL;
    }
    return srv;
}

/* Undoes server_alloc and closes the listening socket (its file is the
 * caller's business). */
static void server_discard(struct apir_shm_server *srv)
{
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    close(srv->stop_pipe[0]);
    close(srv->stop_pipe[1]);
    close(srv->child_pipe[0]);
    close(srv->child_pipe[1]);
    free(srv);
}

static int sock_int(int fd, int opt)
{
    int v = -1;
    socklen_t len = sizeof(v);
    return getsockopt(fd, SOL_SOCKET, opt, &v, &len) == 0 ? v : -1;
}

struct apir_shm_server *apir_shm_server_adopt(struct apir_host *host, int fd, char *err, size_t err_len)
{
    struct sockaddr_un addr = { 0 };
    socklen_t alen = sizeof(addr);
    if (sock_int(fd, SO_DOMAIN) != AF_UNIX || sock_int(fd, SO_TYPE) != SOCK_SEQPACKET) {
        snprintf(err, err_len, "fd %d is not an AF_UNIX SOCK_SEQPACKET socket (ListenSequentialPacket= in the socket unit)", fd);
        close(fd);
        return NULL;
    }
    if (sock_int(fd, SO_ACCEPTCONN) != 1) {
        snprintf(err, err_len, "fd %d is not a listening socket (Accept=no in the socket unit)", fd);
        close(fd);
        return NULL;
    }
    struct apir_shm_server *srv = server_alloc(host, err, err_len);
    if (!srv) {
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);  /* workers must not hold the listening socket */
    srv->listen_fd = fd;
    srv->activated = true;
    const size_t off = offsetof(struct sockaddr_un, sun_path);
    if (getsockname(fd, (struct sockaddr *)&addr, &alen) != 0 || alen <= off)
        snprintf(srv->path, sizeof(srv->path), "(unnamed socket, fd %d)", fd);
    else if (addr.sun_path[0] == '\0')  /* abstract namespace */
        snprintf(srv->path, sizeof(srv->path), "@%.*s", (int)(alen - off - 1), addr.sun_path + 1);
    else
        snprintf(srv->path, sizeof(srv->path), "%.*s", (int)strnlen(addr.sun_path, alen - off), addr.sun_path);
    return srv;
}

/*
 * The socket's directory (e.g. $XDG_RUNTIME_DIR/apir, /run/apir), created if
 * missing: the owner's, searchable by the group and others only as far as
 * the socket's mode lets them connect, and in the socket's group.
 */
static bool make_socket_dir(const char *dir, unsigned mode, bool has_group, gid_t gid, char *err, size_t err_len)
{
    const mode_t dmode = 0700 | ((mode & 0060) ? 0010 : 0) | ((mode & 0006) ? 0001 : 0);
    if (mkdir(dir, dmode) == 0) {
        if (chmod(dir, dmode) != 0 || (has_group && chown(dir, (uid_t)-1, gid) != 0)) {
            snprintf(err, err_len, "cannot set the mode or group of %s: %s", dir, strerror(errno));
            return false;
        }
        return true;
    }
    if (errno != EEXIST) {
        snprintf(err, err_len, "cannot create %s: %s", dir, strerror(errno));
        return false;
    }
    struct stat st;
    if (has_group && stat(dir, &st) == 0 && (mode & 0060) && !(st.st_mode & 0011))
        APIR_WARN("host", "%s is mode %04o: members of the socket's group cannot reach the socket in it",
                  dir, (unsigned)(st.st_mode & 07777));
    return true;
}

struct apir_shm_server *apir_shm_server_listen(struct apir_host *host, const char *path,
                                               const struct apir_shm_listen_options *opts, char *err, size_t err_len)
{
    /* Socket activation first: systemd's socket unit has bound and set
     * the socket up (SocketMode=, SocketGroup=). */
    int passed = apir_service_listen_fd(err, err_len);
    if (passed == -2)
        return NULL;
    if (passed >= 0) {
        struct apir_shm_server *srv = apir_shm_server_adopt(host, passed, err, err_len);
        if (srv)
            APIR_INFO("host", "socket activation: serving the socket the service manager passed (unix:%s)%s%s", srv->path,
                      path && strcmp(path, srv->path) != 0 ? "; not binding " : "",
                      path && strcmp(path, srv->path) != 0 ? path : "");
        return srv;
    }
    struct apir_shm_listen_options defaults;
    if (!opts) {
        apir_shm_listen_options_default(&defaults);
        opts = &defaults;
    }
    if (opts->mode > 0777) {
        snprintf(err, err_len, "socket mode %o out of range (0 to 0777)", opts->mode);
        return NULL;
    }
    gid_t gid = (gid_t)-1;
    const bool has_group = opts->group && *opts->group;
    if (has_group && !apir_service_resolve_group(opts->group, "--socket-group", &gid, err, err_len))
        return NULL;

    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "socket path too long: %s", path);
        return NULL;
    }
    char dir[sizeof(addr.sun_path)];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (!make_socket_dir(dir, opts->mode, has_group, gid, err, err_len))
            return NULL;
    }
    struct apir_shm_server *srv = server_alloc(host, err, err_len);
    if (!srv)
        return NULL;
    snprintf(srv->path, sizeof(srv->path), "%s", path);
    srv->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    strcpy(addr.sun_path, path);
    if (srv->listen_fd < 0) {
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
    /* Bound under a temporary name, given its mode and group, and renamed
     * once listening: a client that sees the socket file can connect
     * (between bind and listen it would be refused), and never sees it with
     * the umask's mode. */
    struct sockaddr_un tmp = { .sun_family = AF_UNIX };
    int n = snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d", path, (int)getpid());
    const bool renamed = n > 0 && (size_t)n < sizeof(tmp.sun_path);
    const struct sockaddr_un *at = renamed ? &tmp : &addr;
    if (renamed)
        unlink(tmp.sun_path);
    if (bind(srv->listen_fd, (const struct sockaddr *)at, sizeof(*at)) != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, strerror(errno));
        goto fail;
    }
    if (chmod(at->sun_path, (mode_t)opts->mode) != 0 || (has_group && chown(at->sun_path, (uid_t)-1, gid) != 0)) {
        snprintf(err, err_len, "cannot give %s mode %04o%s%s: %s", path, opts->mode, has_group ? " and group " : "",
                 has_group ? opts->group : "", strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    if (listen(srv->listen_fd, 64) != 0 || (renamed && rename(tmp.sun_path, path) != 0)) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, strerror(errno));
        unlink(at->sun_path);
        goto fail;
    }
    APIR_DEBUG("host", "socket %s: mode %04o, group %s", path, opts->mode, has_group ? opts->group : "(the daemon's)");
    return srv;
fail:
    server_discard(srv);
    return NULL;
}

struct apir_shm_server *apir_shm_server_new(struct apir_host *host, const char *path, char *err, size_t err_len)
{
    return apir_shm_server_listen(host, path, NULL, err, err_len);
}

/* A worker process's server: one connection (fd), no listening socket; it
 * ends with its guest. */
static struct apir_shm_server *worker_server(struct apir_host *host, int fd, uint64_t client_id,
                                             struct apir_stats_page *stats)
{
    char err[64];
    struct apir_shm_server *srv = server_alloc(host, err, sizeof(err));
    if (!srv)
        return NULL;
    srv->next_id = client_id;
    srv->worker_stats = apir_stats_page_valid(stats) ? stats : NULL;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return srv;
}

static int worker_serve(struct apir_shm_server *srv)
{
    int rc = srv->clients ? apir_shm_server_run(srv) : -1;
    apir_shm_server_free(srv);
    return rc;
}

int apir_shm_serve_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                      const struct ucred *peer)
{
    struct apir_shm_server *srv = worker_server(host, fd, client_id, stats);
    if (!srv)
        return -1;
    struct ucred own;
    if (!peer)
        apir_peer_cred(fd, &own);
    accept_client(srv, fd, peer ? peer : &own, NULL, (int)host->cfg.limits.handshake_timeout_ms);
    return worker_serve(srv);
}

int apir_stream_serve_fd(struct apir_host *host, int fd, uint64_t client_id, struct apir_stats_page *stats,
                         const char *peer_name, struct apir_tls_keys *tls_keys)
{
    struct apir_shm_server *srv = worker_server(host, fd, client_id, stats);
    if (!srv) {
        apir_tls_keys_free(tls_keys);
        return -1;
    }
    srv->tls_keys = tls_keys;
    apir_stream_start_client(srv, fd, peer_name && *peer_name ? peer_name : "stream peer", 0, tls_keys != NULL);
    return worker_serve(srv);
}

void apir_shm_server_stop(struct apir_shm_server *srv)
{
    char b = 1;
    ssize_t r = write(srv->stop_pipe[1], &b, 1);
    (void)r;
}

/* How long the main loop may sleep: until the next handshake deadline, or
 * the next look at a worker's command clock. */
static int poll_timeout_ms(const struct apir_shm_server *srv)
{
    const struct apir_limits *l = &srv->host->cfg.limits;
    if (srv->listen_fd < 0)
        return l->graph_timeout_ms ? (int)(l->graph_timeout_ms < 1000 ? l->graph_timeout_ms : 1000) : -1;
    if (!srv->n_pending)
        return -1;
    uint64_t next = UINT64_MAX, now = apir_now_ns();
    for (uint32_t i = 0; i < srv->n_pending; i++)
        if (srv->pending[i].deadline_ns < next)
            next = srv->pending[i].deadline_ns;
    return next <= now ? 0 : (int)((next - now) / 1000000ull + 1);
}

int apir_shm_server_run(struct apir_shm_server *srv)
{
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    if (srv->listen_fd >= 0) {
        char status[160];
        snprintf(status, sizeof(status), "serving unix:%s", srv->path);
        apir_service_ready(status);
    }
    for (;;) {
        /* A worker process serving one guest ends with it. */
        if (srv->listen_fd < 0 && !srv->n_net && !srv->clients) {
            free(pfds);
            return 0;
        }
        size_t n = 3 + srv->n_net + srv->n_lingering + srv->n_pending + (srv->control ? APIR_CONTROL_MAX_POLL : 0);
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
            /* Hang-up only.  A stream guest's close (its FIN) is not
             * watched: it may close right after posting commands the host
             * still runs; its serving thread reads the end after them and
             * then shuts the socket, which is seen here. */
            pfds[i++] = (struct pollfd){ .fd = c->fd, .events = 0 };
        const size_t linger_at = i;
        const uint32_t n_linger = srv->n_lingering;
        for (uint32_t k = 0; k < n_linger; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->lingering[k], .events = POLLIN };
        const size_t pending_at = i;
        const uint32_t n_pend = srv->n_pending;
        for (uint32_t k = 0; k < n_pend; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->pending[k].fd, .events = POLLIN };
        const size_t control_at = i;
        const size_t n_control = apir_control_poll_fill(srv->control, pfds + i);
        i += n_control;
        const size_t net_at = i;
        for (uint32_t k = 0; k < srv->n_net; k++)
            pfds[i++] = (struct pollfd){ .fd = srv->net[k].fd, .events = POLLIN };
        int timeout = poll_timeout_ms(srv), control_timeout = apir_control_timeout_ms(srv->control);
        if (control_timeout >= 0 && (timeout < 0 || control_timeout < timeout))
            timeout = control_timeout;
        int r = poll(pfds, i, timeout);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            free(pfds);
            return -1;
        }
        if (pfds[1].revents) {
            if (srv->listen_fd >= 0)
                apir_service_stopping();
            free(pfds);
            return 0;
        }
        if (pfds[2].revents & POLLIN)
            apir_workers_reap(srv);
        for (uint32_t k = n_linger; k-- > 0;)
            if (pfds[linger_at + k].revents)
                linger_service(srv, k, pfds[linger_at + k].revents);
        /* Collect hung-up clients first: the list changes as we drop. */
        i = 3;
        struct shm_client *c = srv->clients;
        while (c) {
            struct shm_client *next = c->next;
            bool hung_up = pfds[i++].revents & (POLLHUP | POLLERR | POLLNVAL);
            apir_worker_watch(srv, hung_up);
            if (hung_up)
                drop_client(srv, c);
            c = next;
        }
        /* From the last: serving one moves the last into its place. */
        const uint64_t now = apir_now_ns();
        for (uint32_t k = n_pend; k-- > 0;)
            pending_service(srv, k, pfds[pending_at + k].revents, now);
        if (pfds[0].revents & POLLIN)
            accept_new(srv);
        for (uint32_t k = 0; k < srv->n_net; k++)
            if (pfds[net_at + k].revents & POLLIN)
                apir_stream_accept(srv, k);
        apir_control_poll_done(srv->control, pfds + control_at, n_control, render_view, srv);
    }
}

void apir_shm_server_free(struct apir_shm_server *srv)
{
    if (!srv)
        return;
    apir_control_free(srv->control);
    srv->control = NULL;
    while (srv->clients)
        drop_client(srv, srv->clients);
    apir_workers_stop(srv);
    for (uint32_t i = 0; i < srv->n_lingering; i++)
        close(srv->lingering[i]);
    for (uint32_t i = 0; i < srv->n_pending; i++)
        close(srv->pending[i].fd);
    /* Workers free their guests when their current command returns; give
     * them a bounded time (this is shutdown, not a hot path). */
    for (int i = 0; i < 500 && atomic_load(&srv->n_clients) > 0; i++)
        usleep(10000);
    /* A passed socket's file is its unit's: it stays, and systemd keeps
     * listening for the next start. */
    if (srv->listen_fd >= 0 && !srv->activated)
        unlink(srv->path);
    for (uint32_t i = 0; i < srv->n_net; i++)
        close(srv->net[i].fd);
    explicit_bzero(srv->token, sizeof(srv->token));
    apir_tls_keys_free(srv->tls_keys);
    free(srv->tenants);
    server_discard(srv);
}
