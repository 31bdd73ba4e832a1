/*
 * The guest side of the shm transport (see shm_proto.h).
 */
#include "apir_log.h"
#include "apir_proto.h"
#include "fdpass.h"
#include "shm_proto.h"
#include "transport.h"
#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* While asleep on a reply, look at the socket this often: a host that died
 * cannot wake us, but its socket hangs up. */
#define HOST_CHECK_NS (50ull * 1000 * 1000)

struct shm_transport {
    struct apir_transport base;
    int sock;
    struct apir_shm_ctrl *ctrl;
    uint8_t *reply;
    size_t reply_size;
    uint32_t next_res_id;
    uint64_t spin_ns;
    struct apir_encoder enc;
};

static struct apir_encoder *shm_begin(struct apir_transport *t)
{
    struct shm_transport *s = (struct shm_transport *)t;
    apir_encoder_init(&s->enc, s->ctrl->cmd, APIR_SHM_CMD_AREA);
    apir_encode_reserve(&s->enc, APIR_CMD_HEADER_SIZE);
    return &s->enc;
}

static bool host_hung_up(struct shm_transport *s)
{
    struct pollfd p = { .fd = s->sock, .events = 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static int shm_submit(struct apir_transport *t, int32_t cmd_type, int32_t cmd_flags,
                      const struct apir_submit_opts *opts, uint32_t *ret, struct apir_decoder *reply)
{
    struct shm_transport *s = (struct shm_transport *)t;
    opts = apir_submit_opts_or_defaults(opts);
    if (t->broken)
        return -1;
    if (s->enc.fatal) {
        APIR_ERROR("guest", "command does not fit the %u-byte command area", APIR_SHM_CMD_AREA);
        return -1;
    }
    struct apir_encoder hdr_enc;
    apir_encoder_init(&hdr_enc, s->ctrl->cmd, APIR_CMD_HEADER_SIZE);
    struct apir_cmd_header hdr = { cmd_type, cmd_flags, APIR_SHM_REPLY_RES_ID };
    apir_encode_header(&hdr_enc, &hdr);

    _Atomic uint32_t *word = (_Atomic uint32_t *)s->reply;
    atomic_store_explicit(word, 0, memory_order_relaxed);
    atomic_store_explicit(&s->ctrl->cmd_len, (uint32_t)apir_encoder_used(&s->enc), memory_order_relaxed);
    atomic_fetch_add(&s->ctrl->cmd_seq, 1);  /* seq_cst: publishes the command */
    if (atomic_load(&s->ctrl->host_waiting))
        apir_futex_wake(&s->ctrl->cmd_seq);

    struct apir_wait_work *work = opts->wait_work;
    while (work && atomic_load_explicit(word, memory_order_acquire) == 0 && work->run(work, word)) {
        if (host_hung_up(s)) {
            APIR_ERROR("guest", "host at %s hung up", t->endpoint);
            t->broken = true;
            return -1;
        }
    }
    uint32_t v = apir_spin_while_equal(word, 0, opts->spin_ns ? opts->spin_ns : s->spin_ns);
    uint64_t start = 0;
    while (v == 0) {
        if (!start)
            start = apir_now_ns();
        atomic_store(&s->ctrl->guest_waiting, 1);
        if (atomic_load(word) == 0)
            apir_futex_wait(word, 0, HOST_CHECK_NS);
        atomic_store(&s->ctrl->guest_waiting, 0);
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v)
            break;
        if (host_hung_up(s)) {
            APIR_ERROR("guest", "host at %s hung up", t->endpoint);
            t->broken = true;
            return -1;
        }
        if (opts->timeout_ns && apir_now_ns() - start > opts->timeout_ns) {
            APIR_ERROR("guest", "host at %s did not answer in %llu ms", t->endpoint,
                       (unsigned long long)(opts->timeout_ns / 1000000));
            t->broken = true;
            return -1;
        }
    }
    *ret = v - 1;
    apir_decoder_init(reply, s->reply + 4, s->reply_size - 4);
    return 0;
}

static int shm_blob_create(struct apir_transport *t, size_t size, uint32_t *res_id, void **ptr)
{
    struct shm_transport *s = (struct shm_transport *)t;
    size = apir_page_round_up(size);
    int fd = apir_memfd_create("apir-blob", size, ptr);
    if (fd < 0) {
        APIR_ERROR("guest", "cannot create a %zu-byte shared blob: %s", size, strerror(errno));
        return -1;
    }
    uint8_t tag = APIR_SHM_FD_MSG;
    ssize_t n = apir_send_fds(s->sock, &tag, 1, &fd, 1);
    close(fd);
    if (n != 1) {
        APIR_ERROR("guest", "host at %s hung up", t->endpoint);
        munmap(*ptr, size);
        t->broken = true;
        return -1;
    }
    uint32_t id = s->next_res_id++;
    struct apir_encoder *enc = shm_begin(t);
    apir_encode_u32(enc, id);
    apir_encode_u64(enc, size);
    uint32_t ret;
    struct apir_decoder dec;
    if (shm_submit(t, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, NULL, &ret, &dec) != 0 || ret != 0) {
        APIR_ERROR("guest", "host refused a %zu-byte blob", size);
        munmap(*ptr, size);
        return -1;
    }
    *res_id = id;
    return 0;
}

static void shm_blob_destroy(struct apir_transport *t, uint32_t res_id, void *ptr, size_t size)
{
    size = apir_page_round_up(size);
    struct apir_encoder *enc = shm_begin(t);
    apir_encode_u32(enc, res_id);
    uint32_t ret;
    struct apir_decoder dec;
    shm_submit(t, APIR_CMD_TYPE_SHM_BLOB_DESTROY, 0, NULL, &ret, &dec);
    if (ptr)
        munmap(ptr, size);
}

static int shm_blob_share_file(struct apir_transport *t, int fd, uint64_t offset, uint64_t size, uint64_t skip,
                               uint32_t *res_id)
{
    struct shm_transport *s = (struct shm_transport *)t;
    uint8_t tag = APIR_SHM_FD_MSG;
    if (apir_send_fds(s->sock, &tag, 1, &fd, 1) != 1) {
        APIR_ERROR("guest", "host at %s hung up", t->endpoint);
        t->broken = true;
        return -1;
    }
    uint32_t id = s->next_res_id++;
    struct apir_encoder *enc = shm_begin(t);
    apir_encode_u32(enc, id);
    apir_encode_u64(enc, offset);
    apir_encode_u64(enc, size);
    apir_encode_u64(enc, skip);
    uint32_t ret;
    struct apir_decoder dec;
    if (shm_submit(t, APIR_CMD_TYPE_SHM_BLOB_FILE, 0, NULL, &ret, &dec) != 0 || ret != 0)
        return -1;
    *res_id = id;
    return 0;
}

static void shm_close(struct apir_transport *t)
{
    struct shm_transport *s = (struct shm_transport *)t;
    close(s->sock);
    munmap(s->ctrl, APIR_SHM_CTRL_SIZE);
    munmap(s->reply, s->reply_size);
    free(s);
}

static const struct apir_transport_ops shm_ops = {
    .begin = shm_begin,
    .submit = shm_submit,
    .blob_create = shm_blob_create,
    .blob_destroy = shm_blob_destroy,
    .blob_share_file = shm_blob_share_file,
    .close = shm_close,
};

struct apir_transport *apir_shm_connect(const char *path, char *err, size_t err_len)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, err_len, "socket path too long");
        return NULL;
    }
    strcpy(addr.sun_path, path);
    struct shm_transport *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s->sock < 0 || connect(s->sock, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        if (errno == EPROTOTYPE)
            /* A stream socket: not apir-host's unix: endpoint (a seqpacket
             * socket), perhaps another program's socket at that path. */
            snprintf(err, err_len, "cannot connect to %s: it is not an apir-host socket (a stream socket, where "
                     "apir-host listens with a seqpacket one)", path);
        else
            snprintf(err, err_len, "cannot connect to %s: %s", path, strerror(errno));
        goto fail;
    }
    void *ctrl = NULL, *reply = NULL;
    int fds[2];
    fds[0] = apir_memfd_create("apir-ctrl", APIR_SHM_CTRL_SIZE, &ctrl);
    fds[1] = fds[0] >= 0 ? apir_memfd_create("apir-reply", APIR_REPLY_BLOB_SIZE, &reply) : -1;
    if (fds[1] < 0) {
        snprintf(err, err_len, "cannot create shared memory: %s", strerror(errno));
        if (fds[0] >= 0) {
            close(fds[0]);
            munmap(ctrl, APIR_SHM_CTRL_SIZE);
        }
        goto fail;
    }
    s->ctrl = ctrl;
    s->reply = reply;
    s->reply_size = APIR_REPLY_BLOB_SIZE;
    struct apir_shm_hello hello = {
        .magic = APIR_SHM_MAGIC, .version = APIR_SHM_VERSION, .ctrl_size = APIR_SHM_CTRL_SIZE,
        .reply_size = APIR_REPLY_BLOB_SIZE, .pid = (int32_t)getpid(),
    };
    ssize_t n = apir_send_fds(s->sock, &hello, sizeof(hello), fds, 2);
    close(fds[0]);
    close(fds[1]);
    struct apir_shm_hello_reply r;
    int n_fds;
    /* Read the answer even if the send failed: a host that refuses (too
     * many clients) answers and closes without reading our hello.  The
     * timeout covers a worker process starting its backend. */
    (void)n;
    ssize_t got = apir_recv_fds(s->sock, &r, sizeof(r), NULL, 0, &n_fds, 30000);
    if (got <= 0) {
        snprintf(err, err_len, "no hello from the host at %s (%s)", path,
                 got == 0 ? "it closed the connection" : "it hung up or did not answer within 30 s");
        goto fail_mapped;
    }
    if (got != (ssize_t)sizeof(r) || r.magic != APIR_SHM_MAGIC) {
        /* Bytes came, but not an apir hello: say so, not "no hello". */
        snprintf(err, err_len, "%s answered with something else than an apir hello (%zd bytes, magic %08x): not an "
                 "apir-host socket, or a different apir version", path, got, got >= 4 ? r.magic : 0u);
        goto fail_mapped;
    }
    if (r.status != 0) {
        r.message[sizeof(r.message) - 1] = '\0';
        snprintf(err, err_len, "host at %s refused: %s", path, r.message);
        goto fail_mapped;
    }
    s->base.ops = &shm_ops;
    s->base.blobs_shared = true;
    s->base.runs_wait_work = true;
    snprintf(s->base.endpoint, sizeof(s->base.endpoint), "unix:%s", path);
    s->next_res_id = APIR_SHM_FIRST_RES_ID;
    s->spin_ns = (uint64_t)apir_spin_us() * 1000;
    return &s->base;
fail_mapped:
    munmap(s->ctrl, APIR_SHM_CTRL_SIZE);
    munmap(s->reply, APIR_REPLY_BLOB_SIZE);
fail:
    if (s->sock >= 0)
        close(s->sock);
    free(s);
    return NULL;
}
