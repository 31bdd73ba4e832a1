/*
 * Blob lifetimes (issue 24, class 3) against a real apir-host, on both
 * transports that have blobs (unix: shared memfds; tcp: the host's copies)
 * and in one isolation mode per run.  A buffer wrapping a blob
 * (DEVICE_BUFFER_FROM_PTR) holds the blob itself, not its res_id:
 *
 *   - destroy, recreate, free: the blob's destroy is taken, a new blob under
 *     the same res_id is refused while the old one is still wrapped (the
 *     host's log says why), the buffer still reads the old memory - the
 *     guest's own later writes into it included (shm: the mapping is live,
 *     not freed and reused) - and a buffer made and freed on another blob
 *     unmaps nothing; once the buffer is freed, the res_id is taken again;
 *   - free, then destroy: the res_id is free at once;
 *   - a destroyed blob cannot be named by a command any more;
 *   - a guest that leaves with a destroyed blob still wrapped: the host
 *     frees both and goes on;
 *   - two guests: A's destroyed-but-wrapped blob stays A's while B maps
 *     blobs of its own (with one process for all guests, an early unmap
 *     would let B's mapping land where A's buffer points): A reads its own
 *     bytes, never B's.
 *
 * usage: test_blob_lifetime PATH/TO/apir-host process|thread
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "calls.h"
#include "fdpass.h"
#include "ggml.h"
#include "remote.h"
#include "shm_proto.h"
#include "stream_proto.h"
#include "test_host.h"
#include "test_util.h"
#include "transport.h"
#include "wait.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOB_SIZE (256u << 10)

static const char *host_bin;
static const char *isolation = "process";
static char dir[64], sock_path[100], log_path[120];
static char unix_ep[160], tcp_ep[64];
static pid_t host_pid = -1;

static bool start_host(void)
{
    unlink(sock_path);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return false;
    close(fd);
    const char *argv[] = { host_bin, "--listen", unix_ep, "--listen", "tcp:127.0.0.1:0", "--threads", "1",
                           "--log-level", "info", "--isolation", isolation,
                           !strcmp(isolation, "thread") ? "--insecure-shared-process" : NULL, NULL };
    host_pid = host_spawn(argv, log_path);
    uint64_t t0 = apir_now_ns();
    while (ms_since(t0) < 20000 && !tcp_ep[0]) {
        char *t = text_read(log_path);
        const char *p = strstr(t, "serving tcp:127.0.0.1:");
        if (p)
            snprintf(tcp_ep, sizeof(tcp_ep), "tcp:127.0.0.1:%d", atoi(p + strlen("serving tcp:127.0.0.1:")));
        free(t);
        if (!tcp_ep[0])
            usleep(10000);
    }
    return tcp_ep[0] && wait_for_path(sock_path, 5000);
}

static bool host_alive(void)
{
    return host_pid > 0 && waitpid(host_pid, NULL, WNOHANG) == 0;
}

/* ---- a guest's blobs, by res_id of its choosing ----------------------------- */

/* The shm transport's socket (the layout shm_client.c starts with). */
struct shm_transport_head {
    struct apir_transport base;
    int sock;
};

/* A blob of the test's: the guest's side of it (shm: the shared mapping;
 * stream: the guest's copy, sent with the commands that need it). */
struct blob {
    uint32_t res_id;
    uint8_t *mem;
    bool shared;
};

/* A transport command (blob create/destroy): the host's answer (0: done),
 * -1 if the transport failed. */
static int transport_cmd(struct apir_remote *r, int32_t type, uint32_t res_id, bool with_size, uint64_t size)
{
    pthread_mutex_lock(&r->lock);
    struct apir_encoder *e = r->t->ops->begin(r->t);
    apir_encode_u32(e, res_id);
    if (with_size)
        apir_encode_u64(e, size);
    uint32_t ret = 0;
    struct apir_decoder reply;
    int rc = r->t->ops->submit(r->t, type, 0, &(struct apir_submit_opts){ .timeout_ns = 5000000000ull }, &ret, &reply);
    pthread_mutex_unlock(&r->lock);
    return rc != 0 ? -1 : (int)ret;
}

/* Blob res_id of BLOB_SIZE bytes filled with fill: the host's answer to its
 * SHM_BLOB_CREATE (0: taken); b is set up either way (blob_free). */
static int blob_new(struct apir_remote *r, uint32_t res_id, uint8_t fill, struct blob *b)
{
    b->res_id = res_id;
    b->shared = r->t->blobs_shared;
    if (!b->shared) {
        b->mem = malloc(BLOB_SIZE);
        memset(b->mem, fill, BLOB_SIZE);
        int rc = transport_cmd(r, APIR_CMD_TYPE_SHM_BLOB_CREATE, res_id, true, BLOB_SIZE);
        if (rc != 0)
            return rc;
        /* The bytes travel with the next command. */
        pthread_mutex_lock(&r->lock);
        int staged = r->t->ops->stage_in(r->t, res_id, 0, b->mem, BLOB_SIZE);
        int32_t n = 0;
        int got = staged == 0 ? apir_call_DEVICE_GET_DEVICE_COUNT_locked(r, &n) : -1;
        pthread_mutex_unlock(&r->lock);
        return got == APIR_HANDLER_OK ? 0 : -1;
    }
    int fd = memfd_create("blob-lifetime", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    b->mem = MAP_FAILED;
    if (fd < 0 || ftruncate(fd, BLOB_SIZE) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 ||
        (b->mem = mmap(NULL, BLOB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)) == MAP_FAILED) {
        b->mem = NULL;
        if (fd >= 0)
            close(fd);
        return -1;
    }
    memset(b->mem, fill, BLOB_SIZE);
    struct shm_transport_head *h = (struct shm_transport_head *)r->t;
    uint8_t tag = APIR_SHM_FD_MSG;
    pthread_mutex_lock(&r->lock);
    const bool sent = apir_send_fds(h->sock, &tag, 1, &fd, 1) == 1;
    pthread_mutex_unlock(&r->lock);
    close(fd);
    return sent ? transport_cmd(r, APIR_CMD_TYPE_SHM_BLOB_CREATE, res_id, true, BLOB_SIZE) : -1;
}

static int blob_destroy(struct apir_remote *r, uint32_t res_id)
{
    return transport_cmd(r, APIR_CMD_TYPE_SHM_BLOB_DESTROY, res_id, false, 0);
}

/* The guest's side only (the host's was destroyed, or the guest left). */
static void blob_free(struct blob *b)
{
    if (b->mem && b->shared)
        munmap(b->mem, BLOB_SIZE);
    else
        free(b->mem);
    b->mem = NULL;
}

/* A buffer wrapping all of blob res_id; 0 when refused. */
static uint64_t from_ptr(struct apir_remote *r, uint32_t res_id)
{
    uint64_t buf = 0, buft = 0;
    if (apir_call_DEVICE_BUFFER_FROM_PTR(r, res_id, BLOB_SIZE, BLOB_SIZE, &buf, &buft) != APIR_HANDLER_OK)
        return 0;
    return buf;
}

/* How many of the first `size` bytes of buffer buf (read by the host,
 * through the data area) are `want`; -1 if the read failed. */
static long buffer_count(struct apir_remote *r, uint64_t buf, size_t size, uint8_t want)
{
    uint8_t *out = malloc(size);
    struct apir_tensor_rec t = rec_f32(1, buf, 0, (uint32_t)(size / 4));
    pthread_mutex_lock(&r->lock);
    int rc = -1;
    const struct apir_call_opts get = { .get_dst = out, .get_size = size };
    if (size <= r->data_size)
        rc = apir_call_BUFFER_GET_TENSOR_opts_locked(r, &get, buf, &t, r->data_res_id, 0, size);
    pthread_mutex_unlock(&r->lock);
    long n = -1;
    if (rc == APIR_HANDLER_OK) {
        n = 0;
        for (size_t i = 0; i < size; i++)
            n += out[i] == want;
    }
    free(out);
    return n;
}

static const size_t READ_SIZE = 64u << 10;  /* within the data area on every transport */

static bool open_guest(struct apir_remote *r, const char *ep)
{
    return guest_open(r, ep, NULL, 0);
}

/* ---- cases, each on one endpoint --------------------------------------------- */

/* Destroy, recreate (refused), free; then the res_id is free again. */
static void destroy_recreate_free(const char *ep)
{
    struct apir_remote r;
    if (!open_guest(&r, ep)) {
        CHECK_MSG(false, "open %s", ep);
        return;
    }
    const char *tr = r.t->blobs_shared ? "shm" : "stream";
    const uint32_t R = 0x4000, R2 = 0x4001;
    struct blob x, y, z, w;
    CHECK(blob_new(&r, R, 0xA1, &x) == 0);
    const uint64_t b = from_ptr(&r, R);
    CHECK(b != 0);
    CHECK(buffer_count(&r, b, READ_SIZE, 0xA1) == (long)READ_SIZE);
    const int refusals_before = file_count(log_path, "still wrapped by 1 buffer");
    CHECK_MSG(blob_destroy(&r, R) == 0, "%s: the destroy of a wrapped blob is taken", tr);
    /* The res_id is not free while the old blob lives on. */
    const bool recreated = blob_new(&r, R, 0xB2, &y) == 0;
    CHECK_MSG(!recreated, "%s: a new blob under a res_id still held was taken", tr);
    blob_free(&y);
    usleep(50000);
    CHECK_MSG(file_count(log_path, "still wrapped by 1 buffer") == refusals_before + 1, "%s: the refusal is not in the log", tr);
    /* A command naming the destroyed blob is refused.  (Round 3's attack
     * went on: a buffer on the new blob under R, freed, unmapped the old
     * blob under the live buffer b.) */
    const uint64_t bn = from_ptr(&r, R);
    CHECK_MSG(bn == 0, "%s: a buffer made on a destroyed blob's res_id", tr);
    if (bn)
        apir_call_BUFFER_FREE_BUFFER(&r, bn);
    /* The buffer reads the old memory ... */
    CHECK_MSG(buffer_count(&r, b, READ_SIZE, 0xA1) == (long)READ_SIZE, "%s: the buffer lost its blob's bytes", tr);
    /* ... which is still the guest's live mapping (shm): not a copy, not
     * memory handed back and reused. */
    if (x.shared) {
        memset(x.mem, 0xC3, READ_SIZE);
        CHECK_MSG(buffer_count(&r, b, READ_SIZE, 0xC3) == (long)READ_SIZE, "shm: the buffer no longer sees the blob");
    }
    /* A buffer made and freed on another blob unmaps nothing of the first. */
    CHECK(blob_new(&r, R2, 0xD4, &z) == 0);
    const uint64_t b2 = from_ptr(&r, R2);
    CHECK(b2 != 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b2) == APIR_HANDLER_OK);
    CHECK(blob_destroy(&r, R2) == 0);
    blob_free(&z);
    const uint8_t now = x.shared ? 0xC3 : 0xA1;
    const long own = buffer_count(&r, b, READ_SIZE, now);
    CHECK_MSG(own == (long)READ_SIZE, "%s: another blob's buffer took this one's memory", tr);
    /* The buffer goes, and with it the old blob: the res_id is free. */
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b) == APIR_HANDLER_OK);
    CHECK_MSG(blob_new(&r, R, 0xE5, &w) == 0, "%s: the res_id stays taken after its last buffer went", tr);
    const uint64_t b3 = from_ptr(&r, R);
    CHECK(b3 != 0 && buffer_count(&r, b3, READ_SIZE, 0xE5) == (long)READ_SIZE);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b3) == APIR_HANDLER_OK);
    CHECK(blob_destroy(&r, R) == 0);
    blob_free(&w);
    blob_free(&x);
    int32_t n = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    apir_remote_close(&r);
    printf("figure: %s (%s): destroy, recreate (%s), free: the wrapped blob's buffer read %ld of %zu bytes its own "
           "(-1: the read failed)\n", tr, isolation, recreated ? "taken" : "refused", own, READ_SIZE);
}

/* Free, then destroy: the res_id is free at once; destroying twice fails. */
static void free_then_destroy(const char *ep)
{
    struct apir_remote r;
    if (!open_guest(&r, ep)) {
        CHECK_MSG(false, "open %s", ep);
        return;
    }
    const uint32_t R = 0x4100;
    struct blob x, y;
    CHECK(blob_new(&r, R, 0x11, &x) == 0);
    const uint64_t b = from_ptr(&r, R);
    CHECK(b != 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b) == APIR_HANDLER_OK);
    CHECK(blob_destroy(&r, R) == 0);
    CHECK(blob_destroy(&r, R) != 0);
    CHECK(blob_new(&r, R, 0x22, &y) == 0);
    const uint64_t b2 = from_ptr(&r, R);
    CHECK(b2 != 0 && buffer_count(&r, b2, READ_SIZE, 0x22) == (long)READ_SIZE);
    /* Two buffers on one blob: destroyed, it lives until both are gone. */
    const uint64_t b3 = from_ptr(&r, R);
    CHECK(b3 != 0);
    CHECK(blob_destroy(&r, R) == 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b2) == APIR_HANDLER_OK);
    CHECK(buffer_count(&r, b3, READ_SIZE, 0x22) == (long)READ_SIZE);
    struct blob z;
    CHECK_MSG(blob_new(&r, R, 0x33, &z) != 0, "a res_id taken while a second buffer still held its blob");
    blob_free(&z);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, b3) == APIR_HANDLER_OK);
    CHECK(blob_new(&r, R, 0x44, &z) == 0);
    blob_free(&z);
    blob_free(&x);
    blob_free(&y);
    apir_remote_close(&r);
}

/* A guest leaves with a destroyed blob still wrapped, and one not destroyed:
 * the host frees them and serves the next guest. */
static void session_end_with_pins(const char *ep)
{
    struct apir_remote r;
    if (!open_guest(&r, ep)) {
        CHECK_MSG(false, "open %s", ep);
        return;
    }
    struct blob x, y;
    CHECK(blob_new(&r, 0x4200, 0x55, &x) == 0);
    CHECK(blob_new(&r, 0x4201, 0x66, &y) == 0);
    CHECK(from_ptr(&r, 0x4200) != 0);
    CHECK(from_ptr(&r, 0x4201) != 0);
    CHECK(blob_destroy(&r, 0x4200) == 0);
    apir_remote_close(&r);
    blob_free(&x);
    blob_free(&y);
    usleep(200000);
    CHECK(host_alive());
    char err[256] = "";
    CHECK_MSG(guest_served(ep, err, sizeof(err)), "after a guest left with wrapped blobs: %s", err);
}

/*
 * Guest A's destroyed blob, still wrapped, while guest B maps blobs of the
 * same size: A's buffer reads A's bytes only.  (Round 3's attack freed a
 * buffer on a recreated res_id, which unmapped A's old blob; B's next blob
 * could then be mapped at that very address in a one-process host.)
 */
static void two_guests(const char *ep)
{
    struct apir_remote a, b;
    if (!open_guest(&a, ep) || !open_guest(&b, ep)) {
        CHECK_MSG(false, "open %s", ep);
        return;
    }
    const uint32_t R = 0x4300;
    struct blob x, y, bs[8];
    CHECK(blob_new(&a, R, 0x77, &x) == 0);
    const uint64_t buf = from_ptr(&a, R);
    CHECK(buf != 0);
    CHECK(blob_destroy(&a, R) == 0);
    /* The attack's next steps - a new blob under R, a buffer on it, freed -
     * each refused or harmless now. */
    CHECK(blob_new(&a, R, 0x78, &y) != 0);
    const uint64_t other = from_ptr(&a, R);
    CHECK(other == 0);
    if (other)
        apir_call_BUFFER_FREE_BUFFER(&a, other);
    blob_free(&y);
    /* B maps blobs where A's could have been. */
    for (int i = 0; i < 8; i++)
        CHECK(blob_new(&b, R + (uint32_t)i, 0xEE, &bs[i]) == 0);
    const long own = buffer_count(&a, buf, READ_SIZE, 0x77), foreign = buffer_count(&a, buf, READ_SIZE, 0xEE);
    printf("figure: %s (%s): guest A's wrapped, destroyed blob while B mapped 8 blobs: %ld of %zu bytes A's own, %ld "
           "B's\n", a.t->blobs_shared ? "shm" : "stream", isolation, own, READ_SIZE, foreign);
    CHECK(own == (long)READ_SIZE && foreign == 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&a, buf) == APIR_HANDLER_OK);
    for (int i = 0; i < 8; i++)
        blob_free(&bs[i]);
    blob_free(&x);
    blob_free(&y);
    apir_remote_close(&a);
    apir_remote_close(&b);
}

static void on_both(void (*fn)(const char *))
{
    fn(unix_ep);
    fn(tcp_ep);
}

static void test_destroy_recreate_free(void) { on_both(destroy_recreate_free); }
static void test_free_then_destroy(void) { on_both(free_then_destroy); }
static void test_session_end_with_pins(void) { on_both(session_end_with_pins); }
static void test_two_guests(void) { on_both(two_guests); }

static void test_host_survived(void)
{
    CHECK(host_alive());
    CHECK_MSG(file_count(log_path, "died of signal") == 0, "a worker process died");
    CHECK_MSG(file_count(log_path, "error:") == 0, "the host logged an error");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_blob_lifetime APIR-HOST process|thread\n");
        return 2;
    }
    host_bin = argv[1];
    isolation = argv[2];
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof(dir), "/tmp/apir-blobs-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(sock_path, sizeof(sock_path), "%s/h.sock", dir);
    snprintf(log_path, sizeof(log_path), "%s/host.log", dir);
    snprintf(unix_ep, sizeof(unix_ep), "unix:%s", sock_path);
    if (!start_host()) {
        char *t = text_read(log_path);
        fprintf(stderr, "host did not start; its log:\n%s\n", t);
        free(t);
        host_reap(host_pid, SIGKILL);
        return 1;
    }
    static const struct test_case cases[] = {
        TEST(test_destroy_recreate_free), TEST(test_free_then_destroy), TEST(test_session_end_with_pins),
        TEST(test_two_guests), TEST(test_host_survived),
    };
    int rc = test_run("blob_lifetime", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    if (rc && getenv("BLOB_LIFETIME_SHOW_LOG")) {
        char *t = text_read(log_path);
        fputs(t, stderr);
        free(t);
    }
    host_reap(host_pid, SIGTERM);
    unlink(log_path);
    unlink(sock_path);
    rmdir(dir);
    return rc;
}
