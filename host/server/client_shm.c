/*
 * The shm framing of a client (transport/shm_proto.h): commands read from
 * the command area of its control blob, answered through its reply blob
 * and reply word, with the guest woken by futex when it sleeps.  The
 * serving thread (of the daemon, or the worker process's) owns the guest's
 * session and socket reads after the hello.
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

/* The descriptor a blob command's guest sent just before it, or -1: then
 * the connection is out of step and is hung up on. */
static int recv_blob_fd(struct apir_client *c, const char *cmd)
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
static uint32_t blob_create(struct apir_client *c, struct apir_decoder *req)
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
        !apir_session_blob_add(c->session, res_id, p, (size_t)size, apir_client_unmap_release, NULL)) {
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
static uint32_t blob_file(struct apir_client *c, struct apir_decoder *req)
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

static uint32_t blob_destroy(struct apir_client *c, struct apir_decoder *req)
{
    uint32_t res_id = apir_decode_u32(req);
    if (req->fatal || res_id < APIR_SHM_FIRST_RES_ID)
        return 1;
    return apir_session_blob_remove(c->session, res_id) ? 0 : 1;
}

/* Runs one command from the command area; false: hang up on this guest. */
static bool serve_one(struct apir_client *c)
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
    atomic_store_explicit(&ctrl->reply_len, (uint32_t)apir_encoder_used(&reply), memory_order_relaxed);
    atomic_store(reply_word, ret + 1);
    if (atomic_load(&ctrl->guest_waiting))
        apir_futex_wake(reply_word);
    /* A keyed graph accepted by this command is computed now, while the
     * guest goes on; the next command is read after it. */
    apir_session_run_deferred(c->session);
    return !atomic_load(&c->dead);
}

static void *client_shm_main(void *arg)
{
    struct apir_client *c = arg;
    struct apir_shm_ctrl *ctrl = c->ctrl;
    /* Long on a GPU host, brief on a CPU host (wait.h: apir_host_spin_us). */
    const uint64_t spin_ns = (uint64_t)apir_host_spin_us(c->srv->host->device_memory) * 1000;
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
/* Reads the hello (waiting at most timeout_ms) and starts serving the guest,
 * or refuses it; fd is the client's or closed either way.  tenant: the
 * daemon's admission (a guest's session is its spawn), NULL in a worker. */
void apir_client_shm_accept(struct apir_server *srv, int fd, const struct ucred *peer, struct apir_tenant *tenant,
                          int timeout_ms)
{
    struct apir_shm_hello hello;
    int fds[2], n_fds = 0;
    ssize_t n = apir_recv_fds(fd, &hello, sizeof(hello), fds, 2, &n_fds, timeout_ms);
    struct apir_client *c = NULL;
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
                                        apir_client_unmap_release, NULL))
            why = "out of memory";
        else if (c)
            reply = NULL;  /* owned by the session now */
    }
    if (why) {
        if (srv->listen_fd >= 0)
            srv->refused_connections++;
        apir_peer_refuse(fd, why, srv->listen_fd >= 0);
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
    if (!apir_client_serve(c, fd, client_shm_main))
        return;
    if (hello.pid != peer->pid)
        APIR_INFO("host", "%s connected: %s; says pid %d", name, who, (int)hello.pid);
    else
        APIR_INFO("host", "%s connected: %s", name, who);
}

