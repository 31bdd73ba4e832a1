/*
 * fuzz_shm_frame: the host side of the shm transport's framing.
 *
 * client_shm.c keeps its hello check (apir_client_shm_accept), its command
 * framing (serve_one) and its blob handling (blob_create) behind a
 * listening socket.  So this target runs the real server in a
 * thread of this process (apir_server_new/run on a private socket) and
 * plays a hostile guest against it, one connection per input:
 *   - a hello whose bytes and file descriptors come from the input (good,
 *     unsealed or short memfds, pipes, too few or too many fds);
 *   - if accepted, commands written into the control blob with true or lying
 *     lengths, fd messages with right or wrong tags, SHM_BLOB_CREATE with
 *     lying sizes, SHM_BLOB_FILE (refused: this server has no worker
 *     processes), replies aimed at any res_id.
 * Oracles: the host accepts a hello or a blob only when its fds are sealed
 * memfds at least as large as announced (else a guest could truncate them
 * and the host would fault); every command is answered or the guest is hung
 * up on, within a deadline.
 *
 * Before that, apir_recv_fds is driven directly on a socketpair with
 * arbitrary bytes and up to 8 fds: it must never return a truncated message
 * or more fds than asked, and must leave no received fd open behind it.
 *
 * Input format: fuzz_format.h.
 */
#include "fdpass.h"
#include "fuzz_host.h"
#include "shm_proto.h"
#include "server.h"
#include "wait.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define REPLY_DEADLINE_NS (20ull * 1000 * 1000 * 1000)
#define MAX_BLOB_SIZE     (4u << 20)

static struct apir_server *srv;
static pthread_t srv_thread;
static char sock_dir[64];
static char sock_path[108];

static void *server_main(void *arg)
{
    (void)arg;
    apir_server_run(srv);
    return NULL;
}

static void server_shutdown(void)
{
    apir_server_stop(srv);
    pthread_join(srv_thread, NULL);
    apir_server_free(srv);
    rmdir(sock_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_host_init();
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/apir-fuzz-XXXXXX");
    if (!mkdtemp(sock_dir))
        abort();
    snprintf(sock_path, sizeof(sock_path), "%s/host.sock", sock_dir);
    char err[256];
    srv = apir_server_new(&fz_host, sock_path, err, sizeof(err));
    if (!srv) {
        fprintf(stderr, "fuzz_shm_frame: %s\n", err);
        abort();
    }
    if (pthread_create(&srv_thread, NULL, server_main, NULL) != 0)
        abort();
    atexit(server_shutdown);
    return 0;
}

/* ---- fds a guest may send ---------------------------------------------------- */

enum fd_kind { FD_GOOD = 0, FD_UNSEALED = 1, FD_SHORT = 2, FD_PIPE = 3 };

/* An fd of the given kind announced as `size` bytes; map and map_size
 * receive our mapping of it (NULL for a pipe). */
static int make_fd(enum fd_kind kind, size_t size, const char *name, void **map, size_t *map_size)
{
    *map = NULL;
    *map_size = 0;
    if (kind == FD_PIPE) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0)
            return -1;
        close(p[1]);
        return p[0];
    }
    size_t real = kind == FD_SHORT ? size / 2 : size;
    if (real == 0)
        real = 4;  /* memfds of size 0 cannot be mapped; still shorter than announced */
    if (kind == FD_SHORT && real >= size)
        real = 0;  /* size 1..4: make it empty, which is shorter */
    int fd;
    if (kind == FD_GOOD || kind == FD_SHORT) {
        if (real == 0) {
            fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
            if (fd >= 0)
                fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
            return fd;
        }
        fd = apir_memfd_create(name, real, map);
    } else {
        /* Unsealed: the guest could shrink it under the host's mapping. */
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd >= 0 && ftruncate(fd, (off_t)real) == 0) {
            void *p = mmap(NULL, real, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            *map = p == MAP_FAILED ? NULL : p;
        }
    }
    if (fd >= 0 && *map)
        *map_size = real;
    return fd;
}

/* ---- apir_recv_fds on a socketpair --------------------------------------------- */

/* Open fds of this process that are memfds called `name`. */
static int count_named_fds(const char *name)
{
    char want[64];
    snprintf(want, sizeof(want), "/memfd:%s", name);
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[64], target[128];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        n += strncmp(target, want, strlen(want)) == 0;
    }
    closedir(d);
    return n;
}

static void fuzz_recv_fds(const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    int n_send = data[0] % 9;
    size_t buf_len = (size_t)data[1] * 4;
    int max_fds = data[2] % 5;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return;

    /* Raw sendmsg: apir_send_fds stops at 4 fds, a hostile peer does not. */
    int fds[8];
    for (int i = 0; i < n_send; i++) {
        fds[i] = memfd_create("fz-recv", MFD_CLOEXEC);
        if (fds[i] < 0)
            abort();
    }
    union {
        char buf[CMSG_SPACE(sizeof(int) * 8)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = { .iov_base = (void *)data, .iov_len = size };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (n_send) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_send);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_send);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_send);
    }
    ssize_t sent = sendmsg(sv[0], &msg, MSG_NOSIGNAL);
    for (int i = 0; i < n_send; i++)
        close(fds[i]);

    uint8_t *buf = malloc(buf_len ? buf_len : 1);
    int got[4] = { -1, -1, -1, -1 }, n_got = -1;
    ssize_t r = sent < 0 ? -1 : apir_recv_fds(sv[1], buf, buf_len, got, max_fds, &n_got, 0);
    FZ_ASSERT(n_got >= 0 && n_got <= max_fds, "recv_fds: %d fds for max %d", n_got, max_fds);
    if (r >= 0) {
        FZ_ASSERT((size_t)r == size && size <= buf_len, "recv_fds returned %zd of a %zu-byte message (buffer %zu)", r,
                  size, buf_len);
        FZ_ASSERT(n_got <= n_send, "recv_fds: %d fds, %d sent", n_got, n_send);
        for (int i = 0; i < n_got; i++)
            FZ_ASSERT(fcntl(got[i], F_GETFD) >= 0, "recv_fds returned a closed fd");
    } else if (sent >= 0) {
        FZ_ASSERT(n_got == 0, "recv_fds failed but returned %d fds", n_got);
        /* Refusals: a message longer than the buffer (MSG_TRUNC), or more
         * fds than its control buffer holds (4, fdpass.c; MSG_CTRUNC). */
        FZ_ASSERT(size > buf_len || n_send > 4, "recv_fds refused a %zu-byte message with %d fds (buffer %zu, max %d)",
                  size, n_send, buf_len, max_fds);
    }
    for (int i = 0; i < n_got; i++)
        close(got[i]);
    free(buf);
    close(sv[0]);
    close(sv[1]);
    /* Every fd it received and did not return must be closed. */
    FZ_ASSERT(count_named_fds("fz-recv") == 0, "recv_fds leaked a received fd (sent %d, max %d, buffer %zu, msg %zu)",
              n_send, max_fds, buf_len, size);
}

/* ---- a guest against the real server -------------------------------------------- */

struct blob_map {
    uint32_t res_id;
    void *ptr;
    size_t size;
};

/* An fd message on the socket that the host has not consumed yet. */
struct fd_msg {
    enum fd_kind kind;
    bool wrong_tag;
    bool has_fd;
    size_t real;           /* bytes in the memfd (0 for a pipe) */
    int map;               /* index in guest.maps, -1 if not mapped */
};

#define UNFILED UINT32_MAX  /* a mapping the host holds under no res_id */

#define MAX_PENDING (FZ_SHM_MAX_CMDS + 1)

struct guest {
    int sock;
    struct apir_shm_ctrl *ctrl;
    struct blob_map maps[2 * FZ_SHM_MAX_CMDS + 2];
    int n_maps;
    struct fd_msg pending[MAX_PENDING];  /* FIFO: the host reads them in order */
    int pending_head, pending_tail;
};

/* Keeps a mapping for unmapping at the end; returns its index or -1. */
static int guest_add_map(struct guest *g, uint32_t res_id, void *ptr, size_t size)
{
    if (!ptr)
        return -1;
    if (g->n_maps >= (int)(sizeof(g->maps) / sizeof(g->maps[0]))) {
        munmap(ptr, size);
        return -1;
    }
    g->maps[g->n_maps] = (struct blob_map){ res_id, ptr, size };
    return g->n_maps++;
}

/* Our view of the blob the host holds as res_id (only blobs it accepted are
 * filed), or NULL. */
static struct blob_map *guest_find_map(struct guest *g, uint32_t res_id)
{
    if (res_id == UNFILED)
        return NULL;
    for (int i = 0; i < g->n_maps; i++)
        if (g->maps[i].res_id == res_id)
            return &g->maps[i];
    return NULL;
}

static void guest_file_map(struct guest *g, int index, uint32_t res_id)
{
    struct blob_map *old = guest_find_map(g, res_id);
    if (old)
        old->res_id = UNFILED;  /* destroyed earlier and created again */
    if (index >= 0)
        g->maps[index].res_id = res_id;
}

static bool host_hung_up(int sock)
{
    struct pollfd p = { .fd = sock, .events = POLLIN | POLLRDHUP };
    return poll(&p, 1, 0) > 0 && p.revents;
}

/* Sends (tag, fd) on the socket, as a guest does before SHM_BLOB_CREATE. */
static bool send_fd_msg(struct guest *g, enum fd_kind kind, bool wrong_tag, size_t size)
{
    if (g->pending_tail - g->pending_head >= MAX_PENDING)
        return false;
    void *map;
    size_t map_size;
    int fd = make_fd(kind, size, "fz-blob", &map, &map_size);
    uint8_t tag = wrong_tag ? (uint8_t)~APIR_SHM_FD_MSG : APIR_SHM_FD_MSG;
    ssize_t r = apir_send_fds(g->sock, &tag, 1, &fd, fd >= 0 ? 1 : 0);
    if (fd >= 0)
        close(fd);
    if (r != 1) {
        if (map)
            munmap(map, map_size);
        return false;
    }
    int index = guest_add_map(g, UNFILED, map, map_size);
    g->pending[g->pending_tail++ % MAX_PENDING] = (struct fd_msg){ kind, wrong_tag, fd >= 0, map_size, index };
    return true;
}

/* Rings the doorbell for cmd_len bytes already in the command area and waits
 * for the reply word of the blob the header names.  false: hung up on. */
static bool submit(struct guest *g, uint32_t cmd_len, uint32_t *ret)
{
    struct apir_shm_ctrl *ctrl = g->ctrl;
    uint32_t reply_res_id;
    memcpy(&reply_res_id, ctrl->cmd + 8, 4);  /* what the host will read */
    struct blob_map *m = guest_find_map(g, reply_res_id);
    _Atomic uint32_t *word = m && m->size >= 8 ? (_Atomic uint32_t *)m->ptr : NULL;
    if (word)
        atomic_store(word, 0);
    atomic_store(&ctrl->guest_waiting, 1);
    atomic_store_explicit(&ctrl->cmd_len, cmd_len, memory_order_release);
    atomic_fetch_add_explicit(&ctrl->cmd_seq, 1, memory_order_release);
    if (atomic_load(&ctrl->host_waiting))
        apir_futex_wake(&ctrl->cmd_seq);
    uint64_t deadline = apir_now_ns() + REPLY_DEADLINE_NS;
    for (;;) {
        uint32_t v = word ? atomic_load_explicit(word, memory_order_acquire) : 0;
        if (v) {
            *ret = v - 1;
            return true;
        }
        if (host_hung_up(g->sock))
            return false;
        FZ_ASSERT(apir_now_ns() < deadline, "host neither answered nor hung up (cmd_len %u, reply blob %u)", cmd_len,
                  reply_res_id);
        if (word)
            apir_futex_wait(word, 0, 1000000);
        else
            usleep(1000);
    }
}

/*
 * A SHM_BLOB_FILE in the command area (apir 0.3): like SHM_BLOB_CREATE the
 * host reads the oldest fd message once the request decoded.  This server
 * serves its guests in threads of one process, so it must refuse every file
 * blob (a guest shrinking its file would fault the whole host).
 */
static bool blob_file(struct guest *g, uint32_t cmd_len)
{
    bool reads_fd = cmd_len >= APIR_CMD_HEADER_SIZE + 28 && cmd_len <= APIR_SHM_CMD_AREA;
    if (reads_fd && g->pending_head == g->pending_tail && !send_fd_msg(g, FD_GOOD, false, 4096))
        return false;
    if (reads_fd)
        g->pending_head++;
    uint32_t ret;
    if (!submit(g, cmd_len, &ret))
        return false;
    FZ_ASSERT(ret != 0, "a file blob was accepted by a server without process isolation");
    return true;
}

/*
 * A SHM_BLOB_CREATE in the command area: the host decodes res_id and size,
 * then (only if that decoded) reads the oldest fd message.  Sends a good fd
 * message first when none is pending, so the host never waits 2 s for one.
 * Oracle: accepted only for a sealed memfd, right tag, holding the size.
 */
static bool blob_create(struct guest *g, uint32_t cmd_len)
{
    uint32_t res_id;
    uint64_t announced;
    memcpy(&res_id, g->ctrl->cmd + 12, 4);
    memcpy(&announced, g->ctrl->cmd + 16, 8);
    bool reads_fd = cmd_len >= 24 && cmd_len <= APIR_SHM_CMD_AREA;
    if (reads_fd && g->pending_head == g->pending_tail) {
        size_t real = announced > MAX_BLOB_SIZE ? MAX_BLOB_SIZE : announced ? (size_t)announced : 4096;
        if (!send_fd_msg(g, FD_GOOD, false, real))
            return false;
    }
    struct fd_msg used = { .map = -1 };
    if (reads_fd)
        used = g->pending[g->pending_head++ % MAX_PENDING];
    uint32_t ret;
    if (!submit(g, cmd_len, &ret))
        return false;
    if (reads_fd && ret == 0) {
        /* A "short" memfd is sealed too: fine if it holds what this
         * command announces (checked next). */
        FZ_ASSERT((used.kind == FD_GOOD || used.kind == FD_SHORT) && used.has_fd && !used.wrong_tag,
                  "blob %u accepted with fd kind %d, fd sent %d, wrong tag %d", res_id, (int)used.kind,
                  (int)used.has_fd, (int)used.wrong_tag);
        FZ_ASSERT(announced > 0 && announced <= used.real, "blob %u of %llu bytes accepted from a %zu-byte memfd",
                  res_id, (unsigned long long)announced, used.real);
        guest_file_map(g, used.map, res_id);
    }
    return true;
}

static void run_guest(struct fz_reader *r)
{
    uint8_t plan = (uint8_t)fz_read_le(r, 1);
    size_t got;
    const uint8_t *hb = fz_take(r, FZ_SHM_HELLO_SIZE, &got);
    struct apir_shm_hello hello;
    _Static_assert(sizeof(hello) == FZ_SHM_HELLO_SIZE, "hello size");
    memset(&hello, 0, sizeof(hello));
    memcpy(&hello, hb, got);
    if (!(plan & 0x40))
        hello.magic = APIR_SHM_MAGIC;
    int n_fds = plan & 3;
    enum fd_kind ctrl_kind = (enum fd_kind)((plan >> 2) & 3);
    enum fd_kind reply_kind = (enum fd_kind)((plan >> 4) & 3);

    static struct guest g;
    memset(&g, 0, sizeof(g));
    g.sock = -1;
    void *ctrl_map, *reply_map;
    size_t ctrl_size, reply_size;
    size_t reply_real = hello.reply_size < 8 ? 8 : hello.reply_size > FZ_SHM_MAX_REPLY ? FZ_SHM_MAX_REPLY
                                                                                        : (size_t)hello.reply_size;
    int fds[3];
    fds[0] = make_fd(ctrl_kind, APIR_SHM_CTRL_SIZE, "fz-ctrl", &ctrl_map, &ctrl_size);
    fds[1] = make_fd(reply_kind, reply_real, "fz-reply", &reply_map, &reply_size);
    fds[2] = memfd_create("fz-extra", MFD_CLOEXEC);

    g.sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_path);
    bool accepted = false;
    if (g.sock >= 0 && connect(g.sock, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        apir_send_fds(g.sock, &hello, sizeof(hello), fds, n_fds) == (ssize_t)sizeof(hello)) {
        struct apir_shm_hello_reply rep;
        int n_rep_fds = 0;
        ssize_t n = apir_recv_fds(g.sock, &rep, sizeof(rep), NULL, 0, &n_rep_fds, 10000);
        accepted = n == (ssize_t)sizeof(rep) && rep.magic == APIR_SHM_MAGIC && rep.status == 0;
    }
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);

    /* What the host may accept: fds it can map safely, sizes as announced. */
    bool valid = n_fds >= 2 && hello.magic == APIR_SHM_MAGIC && hello.version == APIR_SHM_VERSION &&
                 hello.ctrl_size == APIR_SHM_CTRL_SIZE && hello.reply_size >= 8 && hello.reply_size <= (1u << 20);
    bool safe_fds = ctrl_kind == FD_GOOD && reply_kind == FD_GOOD && hello.reply_size <= reply_size;
    FZ_ASSERT(!accepted || (valid && safe_fds), "hello accepted: fds %d, ctrl fd kind %d, reply fd kind %d, "
              "magic %#x, version %u, ctrl_size %llu, reply_size %llu (memfd %zu)", n_fds, (int)ctrl_kind,
              (int)reply_kind, hello.magic, hello.version, (unsigned long long)hello.ctrl_size,
              (unsigned long long)hello.reply_size, reply_size);

    /* The control blob is no session blob: never filed (its first word is
     * the doorbell, not a reply word). */
    g.ctrl = ctrl_map;
    guest_add_map(&g, UNFILED, ctrl_map, ctrl_size);
    guest_add_map(&g, APIR_SHM_REPLY_RES_ID, reply_map, reply_size);

    for (int n = 0; accepted && g.ctrl && n < FZ_SHM_MAX_CMDS && r->left >= 3; n++) {
        uint8_t kind = (uint8_t)fz_read_le(r, 1);
        size_t len = (size_t)fz_read_le(r, 2);
        const uint8_t *bytes = fz_take(r, len, &len);
        enum fd_kind fk = (enum fd_kind)((kind >> 2) & 3);
        bool wrong_tag = (kind & 0x10) != 0;
        uint32_t ret = 0;
        bool alive = true;

        switch (kind & 3) {
        case 0:
        case 1: {
            /* Raw command bytes; the area keeps what earlier commands left
             * past them, as a real one does. */
            uint32_t cmd_len = (uint32_t)len;
            memcpy(g.ctrl->cmd, bytes, len);
            if ((kind & 3) == 1)
                cmd_len = (uint32_t)fz_read_le(r, 4);
            int32_t type;
            memcpy(&type, g.ctrl->cmd, 4);
            bool framed = cmd_len >= APIR_CMD_HEADER_SIZE && cmd_len <= APIR_SHM_CMD_AREA;
            if (framed && type == APIR_CMD_TYPE_SHM_BLOB_CREATE)
                alive = blob_create(&g, cmd_len);
            else if (framed && type == APIR_CMD_TYPE_SHM_BLOB_FILE)
                alive = blob_file(&g, cmd_len);
            else
                alive = submit(&g, cmd_len, &ret);
            break;
        }
        case 2:
            alive = send_fd_msg(&g, fk, wrong_tag, (size_t)(len + 1) * 64);
            break;
        case 3: {
            struct fz_reader br = { bytes, len };
            uint32_t res_id = (uint32_t)fz_read_le(&br, 4);
            if (res_id == UNFILED)
                res_id--;  /* UNFILED is this harness's marker, not a name the host may hold */
            uint64_t announced = fz_read_le(&br, 8);
            size_t real = announced > MAX_BLOB_SIZE ? MAX_BLOB_SIZE : announced ? (size_t)announced : 4096;
            alive = send_fd_msg(&g, fk, wrong_tag, real);
            if (!alive)
                break;
            struct apir_encoder enc;
            apir_encoder_init(&enc, g.ctrl->cmd, 24);
            struct apir_cmd_header hdr = { APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, APIR_SHM_REPLY_RES_ID };
            apir_encode_header(&enc, &hdr);
            apir_encode_u32(&enc, res_id);
            apir_encode_u64(&enc, announced);
            alive = blob_create(&g, 24);
            break;
        }
        }
        if (!alive)
            break;
    }
    if (g.sock >= 0)
        close(g.sock);
    for (int i = 0; i < g.n_maps; i++)
        munmap(g.maps[i].ptr, g.maps[i].size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_recv_fds(data, size);
    struct fz_reader r = { data, size };
    run_guest(&r);
    return 0;
}
