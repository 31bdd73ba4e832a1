/*
 * The stream transport (tcp:; transport/stream_proto.h) against a real
 * apir-host on the CPU backend, one isolation mode per run:
 *
 *   - commands through the stream: tensor I/O of random data chunked across
 *     frames (a 1 MiB data area: APIR_DATA_MB=1) at unaligned offsets, a
 *     graph, posted uploads read back by a get;
 *   - endpoints: malformed, unreachable, IPv6 loopback; --max-clients;
 *   - the token: right, wrong, missing; a non-loopback listener refused
 *     without one;
 *   - hostile hellos and frames on raw TCP: each connection is closed, the
 *     host and its other guests go on; a frame cut short is hung up on after
 *     the host's idle limit (30 s, process mode only, overlapped with the
 *     rest); a slow but steady upload is not a command past its budget;
 *   - the host killed (mid-graph, between calls): the guest's call fails in
 *     bounded time and its log names the host; a guest killed: the host
 *     frees its session;
 *   - ggml-rpc advisory replays through TCP, refused one by one;
 *   - lanes: granted, joined, refused (a wrong ticket, one too many), a
 *     payload split over them both ways, the guest library over them.
 *
 * Measured numbers are printed as "figure: ..." lines.
 *
 * usage: test_stream PATH/TO/apir-host process|thread
 */
#include "apir_commands.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "calls.h"
#include "ggml.h"
#include "net.h"
#include "remote.h"
#include "shm_proto.h"
#include "stream_proto.h"
#include "test_host.h"
#include "test_util.h"
#include "tls.h"
#include "transport.h"
#include "wait.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN "s3cret-stream-token"
#define HANDSHAKE_MS 1500          /* --handshake-timeout-ms of the hosts here */
#define FRAME_IDLE_S 30            /* the host's limit for a frame left half sent */

static const char *host_bin;
static const char *isolation = "process";
static char dir[64];

struct host {
    pid_t pid;
    uint16_t port;
    char endpoint[64];  /* tcp:127.0.0.1:PORT */
    char log[128];
    char sock[128];
    int exit_status;    /* when it exited while starting: its status */
};
static struct host main_host, tok_host;

/* ---- small helpers -------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rng() >> 24);
}

/* A file's whole text (malloc'ed, "" when absent). */
static int log_count(const struct host *h, const char *needle)
{
    char *t = text_read(h->log);
    int n = text_count(t, needle);
    free(t);
    return n;
}

/* Waits until the host's log holds needle at least n times. */
static bool wait_log(const struct host *h, const char *needle, int n, int timeout_ms)
{
    uint64_t t0 = apir_now_ns();
    while (log_count(h, needle) < n) {
        if (ms_since(t0) > timeout_ms)
            return false;
        usleep(20000);
    }
    return true;
}

/* ---- the guest's log (apir_log's sink) ------------------------------------ */

static pthread_mutex_t glog_lock = PTHREAD_MUTEX_INITIALIZER;
static char glog[1 << 16];
static size_t glog_len;

static void glog_sink(enum apir_log_level level, const char *line)
{
    (void)level;
    pthread_mutex_lock(&glog_lock);
    size_t n = strlen(line);
    if (glog_len + n + 1 > sizeof(glog))
        glog_len = 0;
    if (n + 1 <= sizeof(glog)) {
        memcpy(glog + glog_len, line, n + 1);
        glog_len += n;
    }
    pthread_mutex_unlock(&glog_lock);
    fputs(line, stderr);
}

static void glog_clear(void)
{
    pthread_mutex_lock(&glog_lock);
    glog_len = 0;
    glog[0] = '\0';
    pthread_mutex_unlock(&glog_lock);
}

static bool glog_has(const char *needle)
{
    pthread_mutex_lock(&glog_lock);
    bool yes = strstr(glog, needle) != NULL;
    pthread_mutex_unlock(&glog_lock);
    return yes;
}

/* ---- hosts ---------------------------------------------------------------- */

/* Starts apir-host with a Unix socket, the stream listener tcp_listen and
 * extra (NULL-terminated); its log goes to DIR/NAME.log.  With expect_port
 * the port it chose is read from its log ("serving tcp:ADDR:PORT"). */
static bool start_host(struct host *h, const char *name, const char *tcp_listen, const char *const *extra)
{
    snprintf(h->log, sizeof(h->log), "%s/%s.log", dir, name);
    snprintf(h->sock, sizeof(h->sock), "%s/%s.sock", dir, name);
    unlink(h->sock);
    int fd = open(h->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return false;
    close(fd);
    char unix_ep[160];
    snprintf(unix_ep, sizeof(unix_ep), "unix:%s", h->sock);
    const char *argv[40];
    int n = 0;
    char hs[16];
    snprintf(hs, sizeof(hs), "%d", HANDSHAKE_MS);
    const char *base[] = { host_bin, "--listen", unix_ep, "--listen", tcp_listen, "--threads", "1", "--log-level",
                           "info", "--isolation", isolation, "--max-clients", "8", "--handshake-timeout-ms", hs,
                           /* no rate limit: this test connects often, on a loaded machine */
                           "--spawn-rate", "0" };
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++)
        argv[n++] = base[i];
    for (int i = 0; extra && extra[i] && n < 38; i++)
        argv[n++] = extra[i];
    if (!strcmp(isolation, "thread"))
        argv[n++] = "--insecure-shared-process";
    argv[n] = NULL;
    h->pid = host_spawn(argv, h->log);
    h->port = 0;
    h->exit_status = -1;
    uint64_t t0 = apir_now_ns();
    while (ms_since(t0) < 20000) {
        char *t = text_read(h->log);
        const char *p = strstr(t, "serving tcp:");
        if (!p)
            p = strstr(t, "serving tls:");
        if (p) {
            const char *sp = strchr(p + 12, ' ');
            const char *colon = sp ? sp : p + strlen(p);
            while (colon > p && *colon != ':')
                colon--;
            h->port = (uint16_t)atoi(colon + 1);
        }
        free(t);
        if (h->port)
            break;
        int status;
        if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
            h->pid = -1;
            h->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        usleep(10000);
    }
    snprintf(h->endpoint, sizeof(h->endpoint), "tcp:127.0.0.1:%u", (unsigned)h->port);
    if (!h->port && h->exit_status != 1) {  /* 1: refused at start, which a case may expect */
        char *t = text_read(h->log);
        fprintf(stderr, "host %s did not start; its log:\n%s\n", name, t);
        free(t);
    }
    return h->port != 0;
}

/* Signals the host and reaps it: its exit status (128 + signal if killed). */
static int stop_host(struct host *h, int sig)
{
    const int rc = host_reap(h->pid, sig);
    h->pid = -1;
    return rc;
}

/* ---- guests --------------------------------------------------------------- */

static bool open_main(struct apir_remote *r)
{
    return guest_open(r, main_host.endpoint, NULL, 0);
}

/* Tensor I/O through the data area a chunk at a time, as the guest library
 * does (guest/frontend_buffer.c): on a stream each chunk is one frame, the
 * bytes sent from data or read into it.  The first failing result, or OK;
 * *frames counts the commands. */
static int tensor_io(struct apir_remote *r, bool set, uint64_t buf, const struct apir_tensor_rec *t, uint64_t offset,
                     void *data, size_t size, int *frames)
{
    pthread_mutex_lock(&r->lock);
    size_t done = 0;
    int rc = APIR_HANDLER_OK;
    while (done < size && rc == APIR_HANDLER_OK) {
        size_t chunk = size - done < r->data_size ? size - done : r->data_size;
        uint8_t *at = (uint8_t *)data + done;
        rc = -1;
        const struct apir_call_opts get = { .get_dst = at, .get_size = chunk };
        if (!set)
            rc = apir_call_BUFFER_GET_TENSOR_opts_locked(r, &get, buf, t, r->data_res_id, offset + done, chunk);
        else if (apir_remote_put_data_locked(r, 0, at, chunk))
            rc = apir_call_BUFFER_SET_TENSOR_locked(r, buf, t, r->data_res_id, offset + done, chunk);
        if (frames)
            (*frames)++;
        done += chunk;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* A graph of the bytes enc holds, through the data area (the bytes travel
 * with the command); unkeyed when key is 0. */
static int graph_compute(struct apir_remote *r, const void *bytes, size_t size, uint64_t key, uint32_t *status)
{
    pthread_mutex_lock(&r->lock);
    int rc = -1;
    if (apir_remote_put_data_locked(r, 0, bytes, size))
        rc = key ? apir_call_BACKEND_GRAPH_COMPUTE_KEYED_locked(r, r->data_res_id, 0, size, key, status)
                 : apir_call_BACKEND_GRAPH_COMPUTE_locked(r, r->data_res_id, size, status);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* A FORWARD that waits for its reply even when the command is posted (the
 * stubs of posted commands answer OK at once on a stream): the host's
 * result, or -1. */
static int forward_waited(struct apir_remote *r, enum apir_command cmd, void (*encode)(struct apir_encoder *, void *),
                          void *arg)
{
    pthread_mutex_lock(&r->lock);
    struct apir_encoder *e = r->t->ops->begin(r->t);
    encode(e, arg);
    uint32_t ret = 0;
    struct apir_decoder reply;
    int rc = r->t->ops->submit(r->t, APIR_CMD_TYPE_FORWARD, (int32_t)cmd,
                               &(struct apir_submit_opts){ .timeout_ns = 5000000000ull }, &ret, &reply);
    pthread_mutex_unlock(&r->lock);
    return rc != 0 || ret < APIR_FORWARD_BASE ? -1 : (int)(ret - APIR_FORWARD_BASE);
}

struct set_args {
    uint64_t buf;
    struct apir_tensor_rec t;
    uint32_t blob;
    uint64_t offset, size;
};

static void encode_set(struct apir_encoder *e, void *arg)
{
    struct set_args *a = arg;
    apir_encode_request_BUFFER_SET_TENSOR(e, a->buf, &a->t, a->blob, a->offset, a->size);
}

/* ---- raw TCP -------------------------------------------------------------- */

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        b += k;
        n -= (size_t)k;
    }
    return true;
}

/* Reads n bytes within timeout_ms. */
static bool read_full(int fd, void *p, size_t n, int timeout_ms)
{
    uint8_t *b = p;
    uint64_t t0 = apir_now_ns();
    while (n) {
        int left = timeout_ms - (int)ms_since(t0);
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (left <= 0 || poll(&pf, 1, left) <= 0)
            return false;
        ssize_t k = recv(fd, b, n, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (k <= 0)
            return false;
        b += k;
        n -= (size_t)k;
    }
    return true;
}

/* Waits until the peer closed (EOF or a reset), discarding what it sends:
 * the milliseconds it took, or -1 when it stayed open for timeout_ms. */
static double wait_closed(int fd, int timeout_ms)
{
    uint64_t t0 = apir_now_ns();
    char buf[4096];
    for (;;) {
        int left = timeout_ms - (int)ms_since(t0);
        if (left <= 0)
            return -1;
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        int rc = poll(&pf, 1, left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return -1;
        ssize_t k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            return ms_since(t0);
    }
}

static struct apir_stream_hello good_hello(const char *token)
{
    struct apir_stream_hello h;
    memset(&h, 0, sizeof(h));
    h.magic = APIR_STREAM_MAGIC;
    h.version = APIR_STREAM_VERSION;
    h.pid = (int32_t)getpid();
    if (token) {
        h.token_len = (uint32_t)strlen(token);  /* may say more than fits: a hostile hello */
        memcpy(h.token, token, h.token_len < sizeof(h.token) ? h.token_len : sizeof(h.token));
    }
    return h;
}

/* The host's answer to a hello: true when one came (*r filled). */
static bool hello_reply(int fd, struct apir_stream_hello_reply *r)
{
    memset(r, 0, sizeof(*r));
    bool ok = read_full(fd, r, sizeof(*r), 10000);
    r->message[sizeof(r->message) - 1] = '\0';
    return ok && r->magic == APIR_STREAM_MAGIC;
}

/* Command bytes: the 12-byte header and items. */
static size_t cmd_bytes(uint8_t *out, size_t cap, int32_t type, int32_t flags, const void *items, size_t items_len)
{
    struct apir_encoder e;
    apir_encoder_init(&e, out, cap);
    struct apir_cmd_header h = { type, flags, APIR_STREAM_REPLY_RES_ID };
    apir_encode_header(&e, &h);
    if (items_len)
        apir_encode_bytes(&e, items, items_len);
    return apir_encoder_used(&e);
}

/* Sends a frame: header, segments, command bytes, payload. */
static bool send_frame(int fd, struct apir_stream_frame f, const struct apir_stream_segment *seg, uint32_t n_seg,
                       const void *cmd, size_t cmd_len, const void *payload, size_t payload_len)
{
    static uint8_t buf[256 * 1024];
    size_t n = 0;
    memcpy(buf, &f, sizeof(f));
    n += sizeof(f);
    if (n_seg)  /* seg and cmd may be NULL when empty */
        memcpy(buf + n, seg, n_seg * sizeof(*seg));
    n += n_seg * sizeof(*seg);
    if (cmd_len)
        memcpy(buf + n, cmd, cmd_len);
    n += cmd_len;
    if (payload_len)
        memcpy(buf + n, payload, payload_len);
    n += payload_len;
    return send_all(fd, buf, n);
}

static struct apir_stream_frame frame(uint32_t cmd_len, uint16_t n_in, uint16_t n_out)
{
    return (struct apir_stream_frame){ .magic = APIR_STREAM_FRAME_MAGIC, .cmd_len = cmd_len, .n_in = n_in,
                                       .n_out = n_out };
}

/* A reply: its ret (reply items into items, up to cap), out bytes skipped. */
static bool read_reply(int fd, uint32_t *ret, void *items, size_t cap)
{
    struct apir_stream_reply h;
    if (!read_full(fd, &h, sizeof(h), 10000) || h.magic != APIR_STREAM_REPLY_MAGIC || h.reply_len > 65536)
        return false;
    static uint8_t tmp[65536];
    if (!read_full(fd, tmp, h.reply_len, 10000))
        return false;
    if (items && cap)
        memcpy(items, tmp, h.reply_len < cap ? h.reply_len : cap);
    for (uint64_t left = h.out_bytes; left;) {
        size_t k = left < sizeof(tmp) ? (size_t)left : sizeof(tmp);
        if (!read_full(fd, tmp, k, 10000))
            return false;
        left -= k;
    }
    *ret = h.ret;
    return true;
}

#define RAW_BLOB_ID   APIR_STREAM_FIRST_RES_ID
#define RAW_BLOB_SIZE (64u * 1024u)

/*
 * A raw connection in good standing: hello accepted, HANDSHAKE answered
 * (0.x, the magic), blob RAW_BLOB_ID of RAW_BLOB_SIZE created, a FORWARD
 * (device count) answered.  The positive control for what the hostile cases
 * then break.  -1 (with CHECKs failed) otherwise.
 */
static int raw_session(uint16_t port, const char *token)
{
    int fd = raw_connect(port);
    CHECK(fd >= 0);
    if (fd < 0)
        return -1;
    struct apir_stream_hello h = good_hello(token);
    struct apir_stream_hello_reply hr;
    bool ok = send_all(fd, &h, sizeof(h)) && hello_reply(fd, &hr) && hr.status == 0;
    CHECK_MSG(ok, "hello: status %d: %s", hr.status, hr.message);
    uint8_t cmd[64], items[64] = { 0 };
    uint32_t ret = 0, ver[2] = { APIR_VERSION_MAJOR, APIR_VERSION_MINOR };
    size_t n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_HANDSHAKE, 0, ver, sizeof(ver));
    ok = ok && send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, cmd, n, NULL, 0) && read_reply(fd, &ret, items, sizeof(items));
    uint32_t minor = 0;
    memcpy(&minor, items + 4, 4);
    CHECK_MSG(ok && ret == APIR_HANDSHAKE_MAGIC && minor == APIR_VERSION_MINOR, "handshake: ret %x minor %u", ret, minor);
    uint8_t blob_items[12];
    uint32_t id = RAW_BLOB_ID;
    uint64_t size = RAW_BLOB_SIZE;
    memcpy(blob_items, &id, 4);
    memcpy(blob_items + 4, &size, 8);
    n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, blob_items, sizeof(blob_items));
    ok = ok && send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, cmd, n, NULL, 0) && read_reply(fd, &ret, items, sizeof(items));
    CHECK_MSG(ok && ret == 0, "blob create: %u", ret);
    n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_DEVICE_COUNT, NULL, 0);
    int32_t count = 0;
    ok = ok && send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, cmd, n, NULL, 0) && read_reply(fd, &ret, items, sizeof(items));
    memcpy(&count, items, 4);
    CHECK_MSG(ok && ret == APIR_FORWARD_BASE + APIR_HANDLER_OK && count == 1, "device count: ret %u count %d", ret,
              count);
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A FORWARD on a raw connection: the encoded request items, no data
 * ranges; its result (-1: no reply), the reply items into reply (decoded by
 * the caller). */
static int raw_forward(int fd, enum apir_command cmd, const uint8_t *items, size_t items_len, uint8_t *reply,
                       size_t reply_cap)
{
    uint8_t c[1024];
    size_t n = cmd_bytes(c, sizeof(c), APIR_CMD_TYPE_FORWARD, (int32_t)cmd, items, items_len);
    uint32_t ret = 0;
    if (!send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, c, n, NULL, 0) || !read_reply(fd, &ret, reply, reply_cap))
        return -1;
    return ret < APIR_FORWARD_BASE ? -1 : (int)(ret - APIR_FORWARD_BASE);
}

/* A guest of the main host still served: a fresh connection and a command. */
static bool main_serves(void)
{
    char err[256] = "";
    const bool ok = guest_served(main_host.endpoint, err, sizeof(err));
    if (!ok)
        fprintf(stderr, "main host: not served: %s\n", err[0] ? err : "its answer was wrong");
    return ok;
}

/* ---- the cases ------------------------------------------------------------ */

static void run_start(void)
{
    CHECK(start_host(&main_host, "main", "tcp:127.0.0.1:0", NULL));
    CHECK(log_count(&main_host, "(this machine only)") == 1);
}

/* A frame cut in the middle of its payload, the socket left open: the host
 * hangs up after FRAME_IDLE_S.  Begun here, checked at the end of the run
 * (the rest runs meanwhile); process mode only, to keep the thread run short. */
static int cut_fd = -1;
static uint64_t cut_t0;

static void test_cut_frame_begin(void)
{
    if (strcmp(isolation, "process") != 0)
        return;
    cut_fd = raw_session(main_host.port, NULL);
    if (cut_fd < 0)
        return;
    uint8_t cmd[64], payload[500];
    memset(payload, 0x5a, sizeof(payload));
    size_t n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_DEVICE_COUNT, NULL, 0);
    struct apir_stream_segment seg = { .res_id = RAW_BLOB_ID, .offset = 0, .size = 1000 };
    CHECK(send_frame(cut_fd, frame((uint32_t)n, 1, 0), &seg, 1, cmd, n, payload, sizeof(payload)));
    cut_t0 = apir_now_ns();
}

static void test_cut_frame_end(void)
{
    if (cut_fd < 0)
        return;
    const double waited = ms_since(cut_t0);
    const double more = wait_closed(cut_fd, (int)((FRAME_IDLE_S + 15) * 1000 - waited));
    const double at = more < 0 ? -1 : waited + more;
    printf("figure: a frame cut in its payload, the socket left open: hung up on after %.1f s (limit %d s)\n",
           at / 1000, FRAME_IDLE_S);
    CHECK_MSG(at >= (FRAME_IDLE_S - 2) * 1000.0 && at < (FRAME_IDLE_S + 15) * 1000.0, "closed after %.1f s", at / 1000);
    CHECK(wait_log(&main_host, "upload cut short", 1, 2000));
    close(cut_fd);
    cut_fd = -1;
    CHECK(main_serves());
}

/* 1. Handshake, device, buffers, and tensor I/O of random data at sizes
 * below and above the 1 MiB data area, at unaligned offsets. */
static void test_commands(void)
{
    struct apir_remote r;
    if (!open_main(&r)) {
        CHECK(false);
        return;
    }
    CHECK(r.minor == APIR_VERSION_MINOR);
    CHECK(!r.t->blobs_shared);
    CHECK_MSG(r.data_size == (1u << 20), "data area %zu bytes (APIR_DATA_MB=1)", r.data_size);
    int32_t n = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    CHECK(apir_call_DEVICE_GET_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    struct apir_string name;
    CHECK(apir_call_DEVICE_GET_NAME(&r, &name) == APIR_HANDLER_OK && !strcmp(name.s, "CPU"));

    enum { SIZE = 8 << 20 };
    uint64_t buf = guest_alloc(&r, SIZE);
    CHECK(buf != 0);
    uint8_t *shadow = calloc(1, SIZE), *data = malloc(SIZE), *back = malloc(SIZE);
    if (!buf || !shadow || !data || !back) {
        free(shadow), free(data), free(back);
        apir_remote_close(&r);
        return;
    }
    CHECK(apir_call_BUFFER_CLEAR(&r, buf, 0u) == APIR_HANDLER_OK);
    const struct apir_tensor_rec t = rec_f32(1, buf, 0, SIZE / 4);
    static const struct { size_t size; uint64_t offset; } io[] = {
        { 1, 0 }, { 3, 1 }, { 4000, 4093 }, { 65537, 12345 }, { 1u << 20, 2u << 20 }, { (1u << 20) + 3, 7 },
        { (7u << 19) + 5, 333 }, { 5u << 20, (3u << 20) - 1 },
    };
    double big_ms = 0;
    for (size_t i = 0; i < sizeof(io) / sizeof(io[0]); i++) {
        fill_random(data, io[i].size);
        memcpy(shadow + io[i].offset, data, io[i].size);
        int frames_set = 0, frames_get = 0;
        uint64_t t0 = apir_now_ns();
        CHECK(tensor_io(&r, true, buf, &t, io[i].offset, data, io[i].size, &frames_set) == APIR_HANDLER_OK);
        memset(back, 0xcd, io[i].size);
        CHECK(tensor_io(&r, false, buf, &t, io[i].offset, back, io[i].size, &frames_get) == APIR_HANDLER_OK);
        if (io[i].size == 5u << 20)
            big_ms = ms_since(t0);
        CHECK_MSG(memcmp(back, data, io[i].size) == 0, "%zu bytes at %llu", io[i].size,
                  (unsigned long long)io[i].offset);
        CHECK(frames_set == (int)((io[i].size + (1u << 20) - 1) >> 20) && frames_get == frames_set);
    }
    printf("figure: 5 MiB set + get through tcp in 1 MiB frames: %.1f ms (%.0f MiB/s each way)\n", big_ms,
           big_ms > 0 ? 10.0 / (big_ms / 1000) : 0.0);
    /* the blob-offset variants, unaligned on both sides: the bytes at 5 of
     * the data area into the tensor at 77; back out at 7 of it */
    fill_random(data, 1000);
    memcpy(shadow + 77, data, 1000);
    pthread_mutex_lock(&r.lock);
    CHECK(apir_remote_put_data_locked(&r, 5, data, 1000));
    CHECK(apir_call_BUFFER_SET_TENSOR_AT_locked(&r, buf, &t, r.data_res_id, 5, 77, 1000) == APIR_HANDLER_OK);
    /* a read-back past the data area fails its call before it is sent, and
     * the bytes staged for that call do not ride on the next one: the
     * tensor at 77 gets the host's bytes at 5 again (data), not these */
    uint8_t dropped[1000];
    fill_random(dropped, sizeof(dropped));
    CHECK(apir_remote_put_data_locked(&r, 5, dropped, sizeof(dropped)));
    const struct apir_call_opts get_past_end = { .get_dst = back, .get_offset = r.data_size - 999, .get_size = 1000 };
    CHECK(apir_call_BUFFER_GET_TENSOR_AT_opts_locked(&r, &get_past_end, buf, &t, r.data_res_id, 7, 77, 1000) == -1);
    CHECK(apir_call_BUFFER_SET_TENSOR_AT_locked(&r, buf, &t, r.data_res_id, 5, 77, 1000) == APIR_HANDLER_OK);
    memset(back, 0, 1000);
    const struct apir_call_opts get_at_7 = { .get_dst = back, .get_offset = 7, .get_size = 1000 };
    CHECK(apir_call_BUFFER_GET_TENSOR_AT_opts_locked(&r, &get_at_7, buf, &t, r.data_res_id, 7, 77, 1000) ==
          APIR_HANDLER_OK);
    pthread_mutex_unlock(&r.lock);
    CHECK(memcmp(back, data, 1000) == 0);
    /* the whole buffer: every write landed where it was aimed, nothing else moved */
    memset(back, 0xcd, SIZE);
    CHECK(tensor_io(&r, false, buf, &t, 0, back, SIZE, NULL) == APIR_HANDLER_OK);
    CHECK(memcmp(back, shadow, SIZE) == 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, buf) == APIR_HANDLER_OK);
    free(shadow);
    free(data);
    free(back);
    apir_remote_close(&r);
}

/* 1. c = a + b computed by the host, unkeyed, keyed and recomputed. */
static void test_graph(void)
{
    struct apir_remote r;
    if (!open_main(&r)) {
        CHECK(false);
        return;
    }
    uint64_t buf = guest_alloc(&r, 4096);
    CHECK(buf != 0);
    const struct apir_tensor_rec ta = rec_f32(1, buf, 0, 16), tb = rec_f32(2, buf, 64, 16), tc = rec_f32(3, buf, 128, 16);
    float a[16], b[16], c[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (float)i + 0.5f;
        b[i] = 100.0f * (float)i;
    }
    CHECK(tensor_io(&r, true, buf, &ta, 0, a, sizeof(a), NULL) == APIR_HANDLER_OK);
    CHECK(tensor_io(&r, true, buf, &tb, 0, b, sizeof(b), NULL) == APIR_HANDLER_OK);
    uint8_t g[4096];
    size_t gsize = add_graph(g, sizeof(g), buf);
    uint32_t status = 99;
    CHECK(gsize && graph_compute(&r, g, gsize, 0, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    memset(c, 0, sizeof(c));
    CHECK(tensor_io(&r, false, buf, &tc, 0, c, sizeof(c), NULL) == APIR_HANDLER_OK);
    bool right = true;
    for (int i = 0; i < 16; i++)
        right = right && c[i] == a[i] + b[i];
    CHECK_MSG(right, "c[1] = %g, want %g", (double)c[1], (double)(a[1] + b[1]));
    /* keyed: answered before it is computed; the get after it waits */
    for (int i = 0; i < 16; i++)
        a[i] = -2.0f * (float)i;
    CHECK(tensor_io(&r, true, buf, &ta, 0, a, sizeof(a), NULL) == APIR_HANDLER_OK);
    status = 99;
    CHECK(graph_compute(&r, g, gsize, 0x5eed, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(tensor_io(&r, false, buf, &tc, 0, c, sizeof(c), NULL) == APIR_HANDLER_OK);
    right = true;
    for (int i = 0; i < 16; i++)
        right = right && c[i] == a[i] + b[i];
    CHECK_MSG(right, "keyed: c[1] = %g, want %g", (double)c[1], (double)(a[1] + b[1]));
    /* recomputed by key, with new b uploaded right after it (posted) */
    CHECK(apir_call_BACKEND_GRAPH_RECOMPUTE(&r, 0x5eed, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    for (int i = 0; i < 16; i++)
        b[i] = 7.0f;
    CHECK(tensor_io(&r, true, buf, &tb, 0, b, sizeof(b), NULL) == APIR_HANDLER_OK);
    CHECK(apir_call_BACKEND_GRAPH_RECOMPUTE(&r, 0x5eed, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    CHECK(tensor_io(&r, false, buf, &tc, 0, c, sizeof(c), NULL) == APIR_HANDLER_OK);
    right = true;
    for (int i = 0; i < 16; i++)
        right = right && c[i] == a[i] + 7.0f;
    CHECK_MSG(right, "recomputed: c[1] = %g, want %g", (double)c[1], (double)(a[1] + 7.0f));
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, buf) == APIR_HANDLER_OK);
    apir_remote_close(&r);
}

/* 1. Posted uploads (their replies read later, more of them than the guest
 * keeps outstanding) followed by one get: every one landed, in order.  A
 * posted upload the host refuses is reported when its reply is read, and
 * the connection stays in step. */
static void test_posted(void)
{
    enum { N = 700, POSTED_MAX = 256 };
    struct apir_remote r;
    if (!open_main(&r)) {
        CHECK(false);
        return;
    }
    uint64_t buf = guest_alloc(&r, 4 * N);
    CHECK(buf != 0);
    const struct apir_tensor_rec t = rec_f32(1, buf, 0, N);
    uint32_t v[N], back[N];
    uint64_t t0 = apir_now_ns();
    for (int i = 0; i < N; i++) {
        v[i] = (uint32_t)i * 2654435761u;
        CHECK(tensor_io(&r, true, buf, &t, 4 * (uint64_t)i, &v[i], 4, NULL) == APIR_HANDLER_OK);
    }
    /* the same word again: the later upload wins */
    v[3] = 0xfeedfaceu;
    CHECK(tensor_io(&r, true, buf, &t, 12, &v[3], 4, NULL) == APIR_HANDLER_OK);
    const double posted_ms = ms_since(t0);
    memset(back, 0, sizeof(back));
    CHECK(tensor_io(&r, false, buf, &t, 0, back, sizeof(back), NULL) == APIR_HANDLER_OK);
    CHECK(memcmp(back, v, sizeof(v)) == 0);
    t0 = apir_now_ns();
    enum { RT = 200 };
    for (int i = 0; i < RT; i++)
        CHECK(tensor_io(&r, false, buf, &t, 0, back, 4, NULL) == APIR_HANDLER_OK);
    const double rt_ms = ms_since(t0);
    printf("figure: %d posted 4-byte uploads (%d outstanding at most): %.1f us each; a 4-byte get (round trip): "
           "%.1f us\n", N + 1, POSTED_MAX, posted_ms * 1000 / (N + 1), rt_ms * 1000 / RT);
    /* a refused posted upload: OK here (posted), its failure logged when its
     * reply is read, the next commands unaffected */
    glog_clear();
    const struct apir_tensor_rec outside = rec_f32(1, buf, 4 * N - 8, 16);
    uint32_t x = 0x11223344u;
    CHECK(tensor_io(&r, true, buf, &outside, 0, &x, 4, NULL) == APIR_HANDLER_OK);
    CHECK(tensor_io(&r, true, buf, &t, 8, &x, 4, NULL) == APIR_HANDLER_OK);
    uint32_t got = 0;
    CHECK(tensor_io(&r, false, buf, &t, 8, &got, 4, NULL) == APIR_HANDLER_OK && got == x);
    CHECK(glog_has("an earlier upload or clear failed"));
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, buf) == APIR_HANDLER_OK);
    apir_remote_close(&r);
}

/* 6. ggml-rpc advisory replays through TCP, each refused, the host and the
 * guests going on. */
static void test_advisories(void)
{
    struct apir_remote a, b;
    if (!open_main(&a) || !open_main(&b)) {
        CHECK(false);
        return;
    }
    uint64_t buf = guest_alloc(&a, 4096), buf2 = guest_alloc(&a, 4096), buf_b = guest_alloc(&b, 4096);
    CHECK(buf && buf2 && buf_b && buf_b != buf);
    struct apir_tensor_rec t = rec_f32(1, buf, 0, 256);
    /* write-what-where through set_tensor (CVE-2024-42479): one byte past */
    struct set_args s = { buf, rec_f32(1, buf, 4096 - 1020, 256), a.data_res_id, 0, 4 };
    CHECK(forward_waited(&a, APIR_CMD_BUFFER_SET_TENSOR, encode_set, &s) == APIR_HANDLER_BAD_REQUEST);
    s.t.data = UINT64_MAX - 100;  /* offset + nbytes overflows */
    CHECK(forward_waited(&a, APIR_CMD_BUFFER_SET_TENSOR, encode_set, &s) == APIR_HANDLER_BAD_REQUEST);
    /* a type out of range (CVE-2024-42477) */
    s.t = rec_f32(1, buf, 0, 256);
    s.t.type = GGML_TYPE_COUNT + 5;
    CHECK(forward_waited(&a, APIR_CMD_BUFFER_SET_TENSOR, encode_set, &s) == APIR_HANDLER_BAD_REQUEST);
    /* arbitrary read through get_tensor (GHSA-5vm9-p64x-gqw9) */
    CHECK(apir_call_BUFFER_GET_TENSOR(&a, buf, &t, a.data_res_id, 1000, 100) == APIR_HANDLER_BAD_REQUEST);
    CHECK(apir_call_BUFFER_GET_TENSOR(&a, buf, &t, a.data_res_id, UINT64_MAX, 2) == APIR_HANDLER_BAD_REQUEST);
    CHECK(apir_call_BUFFER_GET_TENSOR(&a, buf, &t, 4242u, 0, 16) == APIR_HANDLER_BAD_REQUEST);
    /* copy_tensor into a destination smaller than the source (ggml#1103) */
    struct apir_tensor_rec src = rec_f32(1, buf, 0, 512), dst = rec_f32(2, buf2, 4096 - 64, 16);
    bool copied = true;
    CHECK(apir_call_BUFFER_CPY_TENSOR(&a, buf2, &src, &dst, &copied) == APIR_HANDLER_BAD_REQUEST);
    /* a graph naming a tensor id it does not carry (graph_compute's
     * unchecked ids) */
    uint8_t g[4096];
    size_t gsize = add_graph_src(g, sizeof(g), buf, 99);
    uint32_t status = 0;
    CHECK(graph_compute(&a, g, gsize, 0, &status) == APIR_HANDLER_BAD_REQUEST);
    /* a graph key never sent */
    CHECK(apir_call_BACKEND_GRAPH_RECOMPUTE(&a, 0xdead, &status) == APIR_HANDLER_STALE);
    /* another guest's buffer handle */
    uint64_t base = 0;
    CHECK(apir_call_BUFFER_GET_BASE(&b, buf, &base) == APIR_HANDLER_BAD_HANDLE);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&b, buf) == APIR_HANDLER_BAD_HANDLE);
    CHECK(apir_call_BUFFER_GET_TENSOR(&b, buf, &t, b.data_res_id, 0, 64) == APIR_HANDLER_BAD_HANDLE);
    s = (struct set_args){ buf, rec_f32(1, buf, 0, 16), b.data_res_id, 0, 4 };
    CHECK(forward_waited(&b, APIR_CMD_BUFFER_SET_TENSOR, encode_set, &s) == APIR_HANDLER_BAD_HANDLE);
    /* both go on: a's buffer still its own and whole, b's works */
    CHECK(apir_call_BUFFER_GET_BASE(&a, buf, &base) == APIR_HANDLER_OK && base != 0);
    status = 99;
    gsize = add_graph(g, sizeof(g), buf);
    CHECK(graph_compute(&a, g, gsize, 0, &status) == APIR_HANDLER_OK && status == GGML_STATUS_SUCCESS);
    uint32_t w = 0xabcdef01u, got = 0;
    const struct apir_tensor_rec tb = rec_f32(1, buf_b, 0, 16);
    CHECK(tensor_io(&b, true, buf_b, &tb, 4, &w, 4, NULL) == APIR_HANDLER_OK);
    CHECK(tensor_io(&b, false, buf_b, &tb, 4, &got, 4, NULL) == APIR_HANDLER_OK && got == w);
    apir_remote_close(&a);
    apir_remote_close(&b);
    CHECK(main_serves());
}

/* 4. Hellos that are not a stream guest's, on raw TCP: refused with a
 * message where there is a hello to refuse, closed in any case; a slow but
 * whole hello is served. */
static void test_hostile_hellos(void)
{
    struct apir_remote keeper;
    bool keeper_ok = open_main(&keeper);
    CHECK(keeper_ok);
    struct {
        const char *what, *message;
        struct apir_stream_hello h;
    } refused[] = {
        { "random bytes", "not an apir stream hello", good_hello(NULL) },
        { "another version", "unsupported stream transport version", good_hello(NULL) },
        { "a 65-byte token", "malformed hello", good_hello(NULL) },
    };
    fill_random((uint8_t *)&refused[0].h, sizeof(refused[0].h));
    refused[0].h.magic = 0x01020304u;
    refused[1].h.version = APIR_STREAM_VERSION + 1;
    refused[2].h.token_len = APIR_STREAM_TOKEN_MAX + 1;
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        int fd = raw_connect(main_host.port);
        struct apir_stream_hello_reply hr;
        CHECK(fd >= 0 && send_all(fd, &refused[i].h, sizeof(refused[i].h)));
        CHECK_MSG(hello_reply(fd, &hr) && hr.status != 0 && strstr(hr.message, refused[i].message), "%s: %d %s",
                  refused[i].what, hr.status, hr.message);
        CHECK_MSG(wait_closed(fd, 5000) >= 0, "%s: left open", refused[i].what);
        close(fd);
    }
    /* a Unix socket guest's hello (32 bytes, another magic): never a whole
     * stream hello, closed at the handshake deadline */
    int fd = raw_connect(main_host.port);
    struct apir_shm_hello sh = { .magic = APIR_SHM_MAGIC, .version = 1, .ctrl_size = 4096, .reply_size = 4096,
                                 .pid = (int32_t)getpid() };
    CHECK(fd >= 0 && send_all(fd, &sh, sizeof(sh)));
    double ms = wait_closed(fd, HANDSHAKE_MS + 5000);
    CHECK_MSG(ms >= 0, "a unix-style hello: left open");
    close(fd);
    /* half a hello, then nothing: closed after --handshake-timeout-ms */
    fd = raw_connect(main_host.port);
    struct apir_stream_hello h = good_hello(NULL);
    CHECK(fd >= 0 && send_all(fd, &h, 40));
    ms = wait_closed(fd, HANDSHAKE_MS + 5000);
    printf("figure: half a hello, then silence: closed after %.0f ms (--handshake-timeout-ms %d)\n", ms, HANDSHAKE_MS);
    CHECK_MSG(ms >= HANDSHAKE_MS - 300 && ms < HANDSHAKE_MS + 5000, "closed after %.0f ms", ms);
    close(fd);
    /* connected and gone at once */
    fd = raw_connect(main_host.port);
    CHECK(fd >= 0);
    close(fd);
    /* a hello one piece at a time, all of it within the deadline: served */
    fd = raw_connect(main_host.port);
    uint64_t t0 = apir_now_ns();
    bool sent = fd >= 0;
    for (size_t off = 0; sent && off < sizeof(h); off += 5) {
        sent = send_all(fd, (uint8_t *)&h + off, 5);
        usleep(25000);
    }
    struct apir_stream_hello_reply hr;
    CHECK(sent && hello_reply(fd, &hr) && hr.status == 0);
    printf("figure: a hello sent 5 bytes at a time over %.0f ms: accepted\n", ms_since(t0));
    uint8_t cmd[64], items[64] = { 0 };
    uint32_t ret = 0, ver[2] = { APIR_VERSION_MAJOR, APIR_VERSION_MINOR };
    size_t n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_HANDSHAKE, 0, ver, sizeof(ver));
    CHECK(send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, cmd, n, NULL, 0) && read_reply(fd, &ret, items, sizeof(items)) &&
          ret == APIR_HANDSHAKE_MAGIC);
    close(fd);
    int32_t count = 0;
    CHECK(keeper_ok && apir_call_DEVICE_GET_DEVICE_COUNT(&keeper, &count) == APIR_HANDLER_OK && count == 1);
    if (keeper_ok)
        apir_remote_close(&keeper);
    CHECK(main_serves());
}

/* 4. Malformed frames after a good hello and good commands: each connection
 * is closed at once; a guest beside them and new guests are served. */
static void test_hostile_frames(void)
{
    struct apir_remote keeper;
    bool keeper_ok = open_main(&keeper);
    CHECK(keeper_ok);
    uint8_t fwd[64];
    const uint32_t fwd_len = (uint32_t)cmd_bytes(fwd, sizeof(fwd), APIR_CMD_TYPE_FORWARD,
                                                 APIR_CMD_DEVICE_GET_DEVICE_COUNT, NULL, 0);
    const struct apir_stream_segment in_blob = { .res_id = RAW_BLOB_ID, .offset = 0, .size = 64 };
    struct bad {
        const char *what;
        struct apir_stream_frame f;
        struct apir_stream_segment seg[APIR_STREAM_MAX_SEGMENTS + 1];
        uint32_t n_seg;      /* segments sent */
        bool cmd;            /* the command bytes sent too */
    } cases[] = {
        { "bad frame magic", frame(fwd_len, 0, 0), { { 0 } }, 0, true },
        { "cmd_len 0", frame(0, 0, 0), { { 0 } }, 0, false },
        { "cmd_len 11 (less than a header)", frame(11, 0, 0), { { 0 } }, 0, false },
        { "cmd_len 64 KiB + 4", frame(APIR_MAX_COMMAND_SIZE + 4, 0, 0), { { 0 } }, 0, false },
        { "9 segments in", frame(fwd_len, 9, 0), { { 0 } }, 0, false },
        { "4 in + 5 out", frame(fwd_len, 4, 5), { { 0 } }, 0, false },
        { "65535 + 65535 segments", frame(fwd_len, 0xffff, 0xffff), { { 0 } }, 0, false },
        { "frame split over lanes it has not", frame(fwd_len, 0, 0), { { 0 } }, 0, true },
        { "segment reserved field set", frame(fwd_len, 1, 0), { in_blob }, 1, true },
        { "a 4 GB segment", frame(fwd_len, 1, 0), { { RAW_BLOB_ID, 0, 0, 4ull << 30 } }, 1, true },
        { "a segment across the blob's end", frame(fwd_len, 1, 0), { { RAW_BLOB_ID, 0, RAW_BLOB_SIZE - 100, 200 } }, 1, true },
        { "a segment whose end wraps", frame(fwd_len, 1, 0), { { RAW_BLOB_ID, 0, UINT64_MAX - 10, 100 } }, 1, true },
        { "a segment in no blob", frame(fwd_len, 1, 0), { { 99, 0, 0, 64 } }, 1, true },
        { "a segment in the reply blob's id", frame(fwd_len, 1, 0), { { APIR_STREAM_REPLY_RES_ID, 0, 0, 64 } }, 1, true },
        { "an out segment in no blob", frame(fwd_len, 1, 1), { in_blob, { 7, 0, 0, 64 } }, 2, true },
    };
    cases[0].f.magic = 0xdeadbeefu;
    cases[7].f.lanes = 1;
    cases[8].seg[0].reserved = 1;
    double worst = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = raw_session(main_host.port, NULL);
        if (fd < 0)
            continue;
        /* what follows is all sent: the host must not wait for payloads it refused */
        uint8_t payload[256] = { 0 };
        size_t payload_len = 0;
        for (uint32_t k = 0; k < cases[i].n_seg && k < cases[i].f.n_in; k++)
            payload_len += cases[i].seg[k].size <= 64 ? (size_t)cases[i].seg[k].size : 0;
        CHECK_MSG(send_frame(fd, cases[i].f, cases[i].seg, cases[i].n_seg, fwd, cases[i].cmd ? fwd_len : 0, payload,
                             payload_len),
                  "%s: not sent", cases[i].what);
        double ms = wait_closed(fd, 5000);
        CHECK_MSG(ms >= 0, "%s: the connection stayed open", cases[i].what);
        if (ms > worst)
            worst = ms;
        close(fd);
    }
    printf("figure: %zu malformed frames: each connection closed within %.1f ms\n", sizeof(cases) / sizeof(cases[0]),
           worst);
    CHECK(wait_log(&main_host, "malformed frame", 6, 3000));
    CHECK(wait_log(&main_host, "outside its blob", 6, 3000));
    int32_t count = 0;
    CHECK(keeper_ok && apir_call_DEVICE_GET_DEVICE_COUNT(&keeper, &count) == APIR_HANDLER_OK && count == 1);
    if (keeper_ok)
        apir_remote_close(&keeper);
    CHECK(main_serves());
}

/*
 * A slow link: a graph whose bytes take longer to arrive than
 * --graph-timeout-ms (each piece well within the host's idle limit) is
 * served and computed; the budget is the compute's, not the upload's.
 */
static void test_slow_upload(void)
{
    struct host h;
    const char *extra[] = { "--graph-timeout-ms", "1500", NULL };
    if (!start_host(&h, "slow", "tcp:127.0.0.1:0", extra)) {
        CHECK(false);
        return;
    }
    int fd = raw_session(h.port, NULL);
    if (fd < 0) {
        stop_host(&h, SIGKILL);
        return;
    }
    uint8_t items[64], reply[64] = { 0 };
    struct apir_encoder e;
    struct apir_decoder d;
    uint64_t buft = 0, buf = 0;
    CHECK(raw_forward(fd, APIR_CMD_DEVICE_GET_BUFFER_TYPE, NULL, 0, reply, sizeof(reply)) == APIR_HANDLER_OK);
    apir_decoder_init(&d, reply, sizeof(reply));
    CHECK(apir_decode_reply_DEVICE_GET_BUFFER_TYPE(&d, &buft) && buft);
    apir_encoder_init(&e, items, sizeof(items));
    apir_encode_request_BUFFER_TYPE_ALLOC_BUFFER(&e, buft, 4096);
    CHECK(raw_forward(fd, APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER, items, apir_encoder_used(&e), reply, sizeof(reply)) ==
          APIR_HANDLER_OK);
    apir_decoder_init(&d, reply, sizeof(reply));
    CHECK(apir_decode_reply_BUFFER_TYPE_ALLOC_BUFFER(&d, &buf) && buf);
    uint8_t g[4096];
    const size_t gsize = add_graph(g, sizeof(g), buf);
    apir_encoder_init(&e, items, sizeof(items));
    apir_encode_request_BACKEND_GRAPH_COMPUTE(&e, RAW_BLOB_ID, gsize);
    uint8_t c[256];
    const size_t n = cmd_bytes(c, sizeof(c), APIR_CMD_TYPE_FORWARD, APIR_CMD_BACKEND_GRAPH_COMPUTE, items,
                               apir_encoder_used(&e));
    const struct apir_stream_segment seg = { .res_id = RAW_BLOB_ID, .offset = 0, .size = gsize };
    bool ok = send_frame(fd, frame((uint32_t)n, 1, 0), &seg, 1, c, n, NULL, 0);
    const uint64_t t0 = apir_now_ns();
    enum { PIECES = 10 };
    for (size_t i = 0; ok && i < PIECES; i++) {
        const size_t from = gsize * i / PIECES, to = gsize * (i + 1) / PIECES;
        usleep(250000);
        ok = send_all(fd, g + from, to - from);
    }
    uint32_t ret = 0;
    memset(reply, 0, sizeof(reply));
    ok = ok && read_reply(fd, &ret, reply, sizeof(reply));
    uint32_t status = 99;
    apir_decoder_init(&d, reply, sizeof(reply));
    bool decoded = apir_decode_reply_BACKEND_GRAPH_COMPUTE(&d, &status);
    printf("figure: a graph's %zu bytes sent over %.1f s (--graph-timeout-ms 1500): %s, status %u\n", gsize,
           ms_since(t0) / 1000, ok ? "answered" : "hung up on", status);
    CHECK_MSG(ok && ret == APIR_FORWARD_BASE + APIR_HANDLER_OK && decoded && status == GGML_STATUS_SUCCESS,
              "(transport bug: the upload's time counted against --graph-timeout-ms) %s, ret %u, status %u",
              ok ? "answered" : "hung up on", ret, status);
    close(fd);
    CHECK(stop_host(&h, SIGTERM) == 0);
}

/* ---- lanes ------------------------------------------------------------------ */

/* A join (stream_proto.h) on a new connection: its fd (the host's answer
 * in *hr), or -1 when no answer came. */
static int join_lane(const uint8_t *ticket, int32_t lane, struct apir_stream_hello_reply *hr)
{
    int fd = raw_connect(main_host.port);
    if (fd < 0)
        return -1;
    struct apir_stream_hello h = { .magic = APIR_STREAM_JOIN_MAGIC, .version = APIR_STREAM_VERSION, .pid = lane,
                                   .token_len = APIR_STREAM_TICKET_BYTES };
    memcpy(h.token, ticket, APIR_STREAM_TICKET_BYTES);
    if (!send_all(fd, &h, sizeof(h)) || !hello_reply(fd, hr)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A guest of endpoint with `lanes` lanes and the default threshold sets
 * and gets a token's logits (513 KiB, a 128256-word vocabulary) through
 * the guest library: the payloads its profile says went over lanes, or
 * -1 when it could not. */
static long long logits_split(const char *endpoint, const char *lanes)
{
    setenv("APIR_STREAM_LANES", lanes, 1);
    struct apir_remote r;
    const bool opened = guest_open(&r, endpoint, NULL, 0);
    setenv("APIR_STREAM_LANES", "0", 1);
    if (!opened)
        return -1;
    enum { LOGITS = 128256 * 4 };
    long long split = -1;
    const uint64_t buf = guest_alloc(&r, LOGITS);
    uint8_t *data = malloc(LOGITS), *back = malloc(LOGITS);
    if (buf && data && back) {
        const struct apir_tensor_rec t = rec_f32(1, buf, 0, LOGITS / 4);
        fill_random(data, LOGITS);
        char line[256] = "";
        unsigned n = 0;
        if (tensor_io(&r, true, buf, &t, 0, data, LOGITS, NULL) == APIR_HANDLER_OK &&
            tensor_io(&r, false, buf, &t, 0, back, LOGITS, NULL) == APIR_HANDLER_OK && !memcmp(data, back, LOGITS)) {
            /* No "lanes:" line: none went over lanes. */
            split = 0;
            if (r.t->ops->describe_profile && r.t->ops->describe_profile(r.t, line, sizeof(line)))
                (void)sscanf(line, "lanes: %u, %lld payloads", &n, &split);
        }
    }
    free(data);
    free(back);
    apir_remote_close(&r);
    return split;
}

/* 7. Lanes on raw TCP: granted with a ticket; a join with a wrong ticket
 * or beyond the lanes granted is refused; an upload and a download split
 * over two lanes arrive whole; a frame over more lanes than joined is hung
 * up on.  Then the guest library with lanes: none joined before a payload
 * needs them; random tensor I/O comes back whole, and its profile says the
 * payloads went over the lanes.  A host
 * without lanes (APIR_HOST_LANES=0) answers 1 and its guests go on with
 * one connection. */
static void test_lanes(void)
{
    int fd = raw_session(main_host.port, NULL);
    if (fd < 0)
        return;
    uint8_t cmd[64], items[64] = { 0 };
    uint32_t ret = 99, want = 2, granted = 0;
    size_t n = cmd_bytes(cmd, sizeof(cmd), APIR_CMD_TYPE_STREAM_LANES, 0, &want, sizeof(want));
    CHECK(send_frame(fd, frame((uint32_t)n, 0, 0), NULL, 0, cmd, n, NULL, 0) && read_reply(fd, &ret, items, sizeof(items)));
    memcpy(&granted, items, 4);
    CHECK_MSG(ret == 0 && granted == 2, "lanes: ret %u, %u granted", ret, granted);
    uint8_t ticket[APIR_STREAM_TICKET_BYTES], wrong[APIR_STREAM_TICKET_BYTES];
    memcpy(ticket, items + 4, sizeof(ticket));
    memcpy(wrong, ticket, sizeof(wrong));
    wrong[7] ^= 1;
    struct apir_stream_hello_reply hr;
    int bad = join_lane(wrong, 1, &hr);
    CHECK_MSG(bad >= 0 && hr.status != 0 && strstr(hr.message, "no session has this ticket"), "wrong ticket: %d %s",
              hr.status, hr.message);
    if (bad >= 0)
        close(bad);
    int lane[2];
    for (int k = 0; k < 2; k++) {
        lane[k] = join_lane(ticket, k + 1, &hr);
        CHECK_MSG(lane[k] >= 0 && hr.status == 0, "lane %d: %d %s", k + 1, hr.status, hr.message);
    }
    bad = join_lane(ticket, 3, &hr);
    CHECK_MSG(bad >= 0 && hr.status != 0 && strstr(hr.message, "more lanes than granted"), "lane 3: %d %s", hr.status,
              hr.message);
    if (bad >= 0)
        close(bad);
    if (lane[0] < 0 || lane[1] < 0) {
        close(fd);
        return;
    }
    /* The upload: the whole blob, in 3 parts (its frame's command is one
     * the host does not serve: the bytes land before it runs). */
    static uint8_t data[RAW_BLOB_SIZE], back[RAW_BLOB_SIZE];
    fill_random(data, sizeof(data));
    const struct apir_stream_segment seg = { .res_id = RAW_BLOB_ID, .offset = 0, .size = RAW_BLOB_SIZE };
    n = cmd_bytes(cmd, sizeof(cmd), 3, 0, NULL, 0);
    uint64_t off[3], len[3];
    for (uint32_t k = 0; k < 3; k++)
        apir_stream_lane_part(RAW_BLOB_SIZE, 2, k, &off[k], &len[k]);
    CHECK(len[0] && len[1] && len[2] && off[2] + len[2] == RAW_BLOB_SIZE);
    struct apir_stream_frame f = frame((uint32_t)n, 1, 0);
    f.lanes = 2;
    CHECK(send_frame(fd, f, &seg, 1, cmd, n, data, (size_t)len[0]) && send_all(lane[0], data + off[1], (size_t)len[1]) &&
          send_all(lane[1], data + off[2], (size_t)len[2]));
    CHECK(read_reply(fd, &ret, NULL, 0) && ret == APIR_FORWARD_NO_DISPATCH);
    /* The download: part 0 after the reply, parts 1 and 2 on the lanes. */
    f = frame((uint32_t)n, 0, 1);
    f.lanes = 2;
    struct apir_stream_reply rh = { 0 };
    memset(back, 0xcd, sizeof(back));
    CHECK(send_frame(fd, f, &seg, 1, cmd, n, NULL, 0) && read_full(fd, &rh, sizeof(rh), 10000) &&
          rh.magic == APIR_STREAM_REPLY_MAGIC && rh.out_bytes == RAW_BLOB_SIZE && rh.reply_len <= sizeof(items) &&
          read_full(fd, items, rh.reply_len, 10000) && read_full(fd, back, (size_t)len[0], 10000) &&
          read_full(lane[0], back + off[1], (size_t)len[1], 10000) && read_full(lane[1], back + off[2], (size_t)len[2], 10000));
    CHECK_MSG(memcmp(back, data, sizeof(data)) == 0, "the bytes over lanes came back changed");
    /* More lanes than joined: hung up on. */
    f.lanes = 3;
    CHECK(send_frame(fd, f, &seg, 1, cmd, n, NULL, 0));
    CHECK(wait_closed(fd, 10000) >= 0);
    close(fd);
    close(lane[0]);
    close(lane[1]);
    CHECK(wait_log(&main_host, "frame (magic", 1, 5000));

    /* The guest library with 2 lanes: 5 MiB set and got in 1 MiB frames,
     * each over the lanes (payloads of 256 KiB or more). */
    setenv("APIR_STREAM_LANES", "2", 1);
    setenv("APIR_STREAM_LANE_MIN_KB", "256", 1);
    struct apir_remote r;
    const bool opened = open_main(&r);
    setenv("APIR_STREAM_LANES", "0", 1);
    unsetenv("APIR_STREAM_LANE_MIN_KB");
    CHECK(opened);
    if (!opened)
        return;
    enum { SIZE = 5 << 20 };
    uint64_t buf = guest_alloc(&r, SIZE);
    /* Asked for at connect, joined only when a payload needs them. */
    int32_t n_dev = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n_dev) == APIR_HANDLER_OK && n_dev == 1);
    usleep(100000);
    CHECK_MSG(log_count(&main_host, "lane 1 joined") == 1, "lanes joined before a payload needed them");
    uint8_t *big = malloc(SIZE), *big_back = malloc(SIZE);
    if (buf && big && big_back) {
        const struct apir_tensor_rec t = rec_f32(1, buf, 0, SIZE / 4);
        fill_random(big, SIZE);
        memset(big_back, 0xcd, SIZE);
        CHECK(tensor_io(&r, true, buf, &t, 3, big, SIZE - 3, NULL) == APIR_HANDLER_OK);
        CHECK(tensor_io(&r, false, buf, &t, 3, big_back, SIZE - 3, NULL) == APIR_HANDLER_OK);
        CHECK_MSG(memcmp(big, big_back, SIZE - 3) == 0, "5 MiB over lanes came back changed");
        char line[256] = "";
        unsigned lanes_n = 0;
        unsigned long long split = 0;
        CHECK(r.t->ops->describe_profile && r.t->ops->describe_profile(r.t, line, sizeof(line)));
        CHECK_MSG(sscanf(line, "lanes: %u, %llu payloads", &lanes_n, &split) == 2 && lanes_n == 2 && split >= 10,
                  "profile: %s", line);
        printf("figure: the guest's lanes: %s\n", line);
    } else {
        CHECK(false);
    }
    free(big);
    free(big_back);
    apir_remote_close(&r);
    CHECK(wait_log(&main_host, "lane 2 joined", 2, 5000));
    /* By default a token's logits stay on one plain connection (the lanes'
     * wake-ups cost what they save: stream_client.c). */
    const long long logits = logits_split(main_host.endpoint, "2");
    CHECK_MSG(logits == 0, "513 KiB of logits over plain TCP: %lld payloads split over lanes", logits);

    /* A host without lanes. */
    struct host plain;
    setenv("APIR_HOST_LANES", "0", 1);
    const bool started = start_host(&plain, "nolanes", "tcp:127.0.0.1:0", NULL);
    setenv("APIR_HOST_LANES", "4", 1);
    CHECK(started);
    if (!started)
        return;
    setenv("APIR_STREAM_LANES", "2", 1);
    char err[256] = "";
    CHECK_MSG(guest_served(plain.endpoint, err, sizeof(err)), "%s", err);
    setenv("APIR_STREAM_LANES", "0", 1);
    CHECK(log_count(&plain, "joined") == 0);
    stop_host(&plain, SIGTERM);
}

/* ---- lanes over TLS --------------------------------------------------------- */

/* A raw TLS connection to host h as the key "ID:HEX": the socket, its
 * session in *tls; -1 when the handshake failed. */
static int tls_connect(const struct host *h, const char *key, struct apir_tls **tls)
{
    *tls = NULL;
    int fd = raw_connect(h->port);
    char err[256];
    struct apir_tls_keys *k = fd >= 0 ? apir_tls_keys_parse(key, err, sizeof(err)) : NULL;
    if (k)
        *tls = apir_tls_client(fd, k, "127.0.0.1", 5000, err, sizeof(err));
    apir_tls_keys_free(k);
    if (!*tls && fd >= 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool tls_send(int fd, struct apir_tls *tls, const void *p, size_t n)
{
    struct iovec iov = { (void *)p, n };
    return apir_net_send(fd, tls, &iov, 1, 5000) == 0;
}

/* Reads n bytes through rd (one reader a connection: what it read ahead
 * stays for the next read). */
static bool tls_read(struct apir_net_reader *rd, void *p, size_t n)
{
    return apir_net_read(rd, p, n, 5000, NULL) == 0;
}

/* A command through TLS: frame, segments, command, payload; the reply's
 * header and items (out bytes left unread). */
static bool tls_command(int fd, struct apir_tls *tls, struct apir_net_reader *rd, struct apir_stream_frame f,
                        const struct apir_stream_segment *seg, int32_t type, const void *items, size_t items_len,
                        const void *payload, size_t payload_len, struct apir_stream_reply *rh, uint8_t *reply,
                        size_t reply_cap)
{
    uint8_t cmd[256];
    const size_t n = cmd_bytes(cmd, sizeof(cmd), type, 0, items, items_len);
    f.cmd_len = (uint32_t)n;
    const uint32_t n_seg = (uint32_t)f.n_in + f.n_out;
    return tls_send(fd, tls, &f, sizeof(f)) && (!n_seg || tls_send(fd, tls, seg, n_seg * sizeof(*seg))) &&
           tls_send(fd, tls, cmd, n) && (!payload_len || tls_send(fd, tls, payload, payload_len)) &&
           tls_read(rd, rh, sizeof(*rh)) && rh->magic == APIR_STREAM_REPLY_MAGIC && rh->reply_len <= reply_cap &&
           tls_read(rd, reply, rh->reply_len);
}

/* A tls: join: its clear half-ticket (route), then, over its own TLS as
 * key, the whole ticket.  The host's answer: status into *status (-1: no
 * answer came - closed); the lane's fd and session when taken. */
static int tls_join(const struct host *h, const uint8_t *route, const char *key, const uint8_t *ticket, int *status,
                    struct apir_tls **tls, struct apir_net_reader *rd)
{
    *status = -1;
    *tls = NULL;
    int fd = raw_connect(h->port);
    struct apir_stream_hello j = { .magic = APIR_STREAM_JOIN_MAGIC, .version = APIR_STREAM_VERSION, .pid = 1,
                                   .token_len = APIR_STREAM_TICKET_BYTES / 2 };
    memcpy(j.token, route, APIR_STREAM_TICKET_BYTES / 2);
    char err[256];
    struct apir_tls_keys *k = apir_tls_keys_parse(key, err, sizeof(err));
    struct apir_stream_hello_reply r;
    apir_net_reader_init(rd, fd, 4096);
    if (fd >= 0 && k && send_all(fd, &j, sizeof(j)) &&
        (*tls = apir_tls_client(fd, k, "127.0.0.1", 5000, err, sizeof(err))) &&
        tls_send(fd, *tls, ticket, APIR_STREAM_TICKET_BYTES)) {
        rd->tls = *tls;
        if (tls_read(rd, &r, sizeof(r)) && r.magic == APIR_STREAM_MAGIC)
            *status = r.status;
    }
    apir_tls_keys_free(k);
    return fd;
}

/* 8. Lanes over TLS (with workers only): granted inside the session; a join
 * whose clear route names no session is closed before any handshake; one
 * with the right route but another key's identity, or the right identity
 * but a wrong second half of the ticket, is refused in the worker; the
 * right one is taken, and a download split over it arrives whole.  With
 * threads, a tls: session has no lanes (asking gets 1). */
static void test_lanes_tls(void)
{
    char keys[160], alice[160], bob[160];
    snprintf(keys, sizeof(keys), "%s/keys", dir);
    snprintf(alice, sizeof(alice), "alice:%s", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    snprintf(bob, sizeof(bob), "bob:%s", "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100");
    FILE *f = fopen(keys, "w");
    if (f) {
        fprintf(f, "%s\n%s\n", alice, bob);
        fclose(f);
    }
    chmod(keys, 0600);
    struct host th;
    const char *extra[] = { "--tls-psk-file", keys, NULL };
    CHECK(start_host(&th, "tls", "tls:127.0.0.1:0", extra));
    if (!th.port)
        return;
    struct apir_tls *tls = NULL;
    int fd = tls_connect(&th, alice, &tls);
    CHECK(fd >= 0);
    struct apir_net_reader rd;
    apir_net_reader_init(&rd, fd, 4096);
    rd.tls = tls;
    struct apir_stream_hello h = good_hello(NULL);
    struct apir_stream_hello_reply hr;
    struct apir_stream_reply rh;
    uint8_t reply[256];
    bool ok = fd >= 0 && tls_send(fd, tls, &h, sizeof(h)) && tls_read(&rd, &hr, sizeof(hr)) && hr.status == 0;
    CHECK(ok);
    const uint32_t want = 1;
    ok = ok && tls_command(fd, tls, &rd, frame(0, 0, 0), NULL, APIR_CMD_TYPE_STREAM_LANES, &want, sizeof(want), NULL, 0, &rh,
                           reply, sizeof(reply));
    const bool threads = !strcmp(isolation, "thread");
    const bool granted = ok && rh.ret == 0 && rh.reply_len == 4 + APIR_STREAM_TICKET_BYTES;
    if (threads)
        CHECK_MSG(ok && rh.ret == 1, "a tls: session's lanes in thread mode: ret %u", rh.ret);
    else
        CHECK_MSG(granted, "lanes: ret %u, %u reply bytes", rh.ret, rh.reply_len);
    if (!threads && granted) {
        uint8_t ticket[APIR_STREAM_TICKET_BYTES], wrong[APIR_STREAM_TICKET_BYTES];
        memcpy(ticket, reply + 4, sizeof(ticket));
        int status;
        struct apir_tls *lt;
        struct apir_net_reader lrd;
        /* a route no session has: closed before the handshake */
        memcpy(wrong, ticket, sizeof(wrong));
        wrong[3] ^= 1;
        int lf = tls_join(&th, wrong, alice, ticket, &status, &lt, &lrd);
        CHECK_MSG(status == -1 && !lt, "a wrong route was answered (%d)", status);
        if (lf >= 0)
            close(lf);
        apir_tls_free(lt);
        apir_net_reader_free(&lrd);
        /* the right route, another identity */
        lf = tls_join(&th, ticket, bob, ticket, &status, &lt, &lrd);
        CHECK_MSG(status == -1, "bob's join of alice's session was answered (%d)", status);
        CHECK(wait_log(&th, "(key \"bob\") refused: not the session's ticket and identity", 1, 5000));
        if (lf >= 0)
            close(lf);
        apir_tls_free(lt);
        apir_net_reader_free(&lrd);
        /* the right route and identity, a wrong second half */
        memcpy(wrong, ticket, sizeof(wrong));
        wrong[APIR_STREAM_TICKET_BYTES - 1] ^= 1;
        lf = tls_join(&th, ticket, alice, wrong, &status, &lt, &lrd);
        CHECK_MSG(status == -1, "a wrong ticket's join was answered (%d)", status);
        CHECK(wait_log(&th, "(key \"alice\") refused: not the session's ticket and identity", 1, 5000));
        if (lf >= 0)
            close(lf);
        apir_tls_free(lt);
        apir_net_reader_free(&lrd);
        /* the right one, then a download over it */
        lf = tls_join(&th, ticket, alice, ticket, &status, &lt, &lrd);
        CHECK_MSG(status == 0, "the session's own join: %d", status);
        uint8_t items[12];
        const uint32_t id = RAW_BLOB_ID;
        const uint64_t size = RAW_BLOB_SIZE;
        memcpy(items, &id, 4);
        memcpy(items + 4, &size, 8);
        static uint8_t data[RAW_BLOB_SIZE], back[RAW_BLOB_SIZE];
        fill_random(data, sizeof(data));
        const struct apir_stream_segment seg = { .res_id = RAW_BLOB_ID, .offset = 0, .size = RAW_BLOB_SIZE };
        struct apir_stream_frame up = frame(0, 1, 0), down = frame(0, 0, 1);
        down.lanes = 1;
        uint64_t off[2], len[2];
        for (uint32_t k = 0; k < 2; k++)
            apir_stream_lane_part(RAW_BLOB_SIZE, 1, k, &off[k], &len[k]);
        ok = status == 0 &&
             tls_command(fd, tls, &rd, frame(0, 0, 0), NULL, APIR_CMD_TYPE_SHM_BLOB_CREATE, items, sizeof(items), NULL,
                         0, &rh, reply, sizeof(reply)) && rh.ret == 0 &&
             tls_command(fd, tls, &rd, up, &seg, 3, NULL, 0, data, sizeof(data), &rh, reply, sizeof(reply)) &&
             tls_command(fd, tls, &rd, down, &seg, 3, NULL, 0, NULL, 0, &rh, reply, sizeof(reply)) &&
             rh.out_bytes == RAW_BLOB_SIZE && tls_read(&rd, back, (size_t)len[0]) &&
             tls_read(&lrd, back + off[1], (size_t)len[1]);
        CHECK_MSG(ok && memcmp(back, data, sizeof(data)) == 0, "a download over a TLS lane came back changed");
        if (lf >= 0)
            close(lf);
        apir_tls_free(lt);
        apir_net_reader_free(&lrd);
    }
    apir_net_reader_free(&rd);
    apir_tls_free(tls);
    if (fd >= 0)
        close(fd);
    /* The guest library over TLS: there a token's logits go over the lanes
     * by default (sealing and opening them on one core a side is what
     * lanes save), the upload and the download both. */
    if (granted) {
        char ep[64];
        snprintf(ep, sizeof(ep), "tls:127.0.0.1:%u", (unsigned)th.port);
        setenv("APIR_TLS_PSK", alice, 1);
        const long long logits = logits_split(ep, "2");
        unsetenv("APIR_TLS_PSK");
        CHECK_MSG(logits == 2, "513 KiB of logits over TLS: %lld payloads split over lanes", logits);
    }
    stop_host(&th, SIGTERM);
}

/* Endpoints: malformed ones and unreachable ones fail promptly with the
 * endpoint named; an IPv6 loopback listener serves. */
static void test_endpoints(void)
{
    struct apir_remote r;
    char err[256];
    static const struct { const char *ep, *says; } bad[] = {
        { "tcp:127.0.0.1:0", "port 0" },         { "tcp:127.0.0.1", "bad endpoint" },
        { "tcp::5", "bad endpoint" },            { "tcp:127.0.0.1:70000", "bad endpoint" },
        { "tcp:[::1:5", "bad endpoint" },        { "tcp:a:b:5", "bad endpoint" },
        { "vsock:x:5", "bad endpoint" },         { "vsock:1:", "bad endpoint" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        CHECK_MSG(!apir_remote_open(&r, bad[i].ep, 0, err, sizeof(err)) && strstr(err, bad[i].says), "%s: %s",
                  bad[i].ep, err);
    }
    /* a port nobody listens on */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
          getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp:127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    close(fd);
    uint64_t t0 = apir_now_ns();
    err[0] = '\0';
    CHECK(!apir_remote_open(&r, ep, 0, err, sizeof(err)));
    CHECK_MSG(strstr(err, ep) && ms_since(t0) < 2000, "%s: %s after %.0f ms", ep, err, ms_since(t0));
    /* IPv6 loopback, where the machine has it */
    int s6 = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    const bool have_v6 = s6 >= 0 && bind(s6, (struct sockaddr *)&a6, sizeof(a6)) == 0;
    if (s6 >= 0)
        close(s6);
    if (!have_v6) {
        printf("no IPv6 loopback here: tcp:[::1] not tried\n");
        return;
    }
    struct host h;
    if (!start_host(&h, "v6", "tcp:[::1]:0", NULL)) {
        CHECK(false);
        return;
    }
    CHECK(log_count(&h, "serving tcp:[::1]:") == 1 && log_count(&h, "(this machine only)") == 1);
    snprintf(ep, sizeof(ep), "tcp:[::1]:%u", (unsigned)h.port);
    int32_t n = 0;
    const bool opened = guest_open(&r, ep, err, sizeof(err));
    CHECK(opened);
    if (opened) {
        CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
        uint64_t buf = guest_alloc(&r, 4096);
        const struct apir_tensor_rec t = rec_f32(1, buf, 0, 1024);
        uint8_t out[3000], in[3000];
        fill_random(out, sizeof(out));
        CHECK(buf && tensor_io(&r, true, buf, &t, 3, out, sizeof(out), NULL) == APIR_HANDLER_OK);
        CHECK(tensor_io(&r, false, buf, &t, 3, in, sizeof(in), NULL) == APIR_HANDLER_OK &&
              memcmp(in, out, sizeof(in)) == 0);
        apir_remote_close(&r);
    }
    CHECK(stop_host(&h, SIGTERM) == 0);
}

/* 3. A listener other machines reach needs a token. */
static void test_nonloopback_needs_token(void)
{
    struct host h;
    CHECK(!start_host(&h, "open", "tcp:0.0.0.0:0", NULL));
    CHECK_MSG(h.pid == -1 && h.exit_status == 1, "exit status %d", h.exit_status);
    if (h.pid > 0)
        stop_host(&h, SIGKILL);
    CHECK(log_count(&h, "refused without authentication") == 1);
}

/* 2, 3. The token: a host on 0.0.0.0 with --token-file starts; right token
 * served, wrong or missing refused with the reason in the guest's error,
 * raw junk refused; the host serves on. */
static void test_token(void)
{
    char token_file[128], guest_file[128], wrong_file[128];
    snprintf(token_file, sizeof(token_file), "%s/token", dir);
    snprintf(guest_file, sizeof(guest_file), "%s/guest-token", dir);
    snprintf(wrong_file, sizeof(wrong_file), "%s/wrong-token", dir);
    FILE *f = fopen(token_file, "w");
    CHECK(f && fprintf(f, "%s\n", TOKEN) > 0);
    if (f)
        fclose(f);
    chmod(token_file, 0600);
    f = fopen(guest_file, "w");
    CHECK(f && fprintf(f, "%s\r\nsecond line\n", TOKEN) > 0);
    if (f)
        fclose(f);
    f = fopen(wrong_file, "w");
    CHECK(f && fprintf(f, "%s-not\n", TOKEN) > 0);
    if (f)
        fclose(f);
    const char *extra[] = { "--token-file", token_file, NULL };
    if (!start_host(&tok_host, "token", "tcp:0.0.0.0:0", extra)) {
        CHECK(false);
        return;
    }
    CHECK(log_count(&tok_host, "(token required)") == 1);
    CHECK(log_count(&tok_host, "travels in clear") == 1);
    struct apir_remote r;
    char err[256];
    int32_t n = 0;
    /* right: from a file (first line, CRLF cut), and from APIR_TOKEN */
    setenv("APIR_TOKEN_FILE", guest_file, 1);
    CHECK(guest_open(&r, tok_host.endpoint, err, sizeof(err)));
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    apir_remote_close(&r);
    unsetenv("APIR_TOKEN_FILE");
    setenv("APIR_TOKEN", TOKEN, 1);
    struct apir_remote kept;  /* stays connected through the refusals */
    bool kept_ok = guest_open(&kept, tok_host.endpoint, err, sizeof(err));
    CHECK(kept_ok);
    /* wrong: longer, shorter, other */
    const char *wrong[] = { TOKEN "x", "s3cret", "S3CRET-STREAM-TOKEN" };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        setenv("APIR_TOKEN", wrong[i], 1);
        err[0] = '\0';
        CHECK(!apir_remote_open(&r, tok_host.endpoint, 0, err, sizeof(err)));
        CHECK_MSG(strstr(err, "wrong token") != NULL, "token '%s': %s", wrong[i], err);
    }
    unsetenv("APIR_TOKEN");
    setenv("APIR_TOKEN_FILE", wrong_file, 1);
    err[0] = '\0';
    CHECK(!apir_remote_open(&r, tok_host.endpoint, 0, err, sizeof(err)));
    CHECK_MSG(strstr(err, "wrong token") != NULL, "wrong token file: %s", err);
    unsetenv("APIR_TOKEN_FILE");
    /* none */
    err[0] = '\0';
    CHECK(!apir_remote_open(&r, tok_host.endpoint, 0, err, sizeof(err)));
    CHECK_MSG(strstr(err, "token is required") != NULL, "no token: %s", err);
    /* too long for a hello: refused on this side, nothing sent */
    char longer[APIR_STREAM_TOKEN_MAX + 2];
    memset(longer, 'k', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    setenv("APIR_TOKEN", longer, 1);
    err[0] = '\0';
    CHECK(!apir_remote_open(&r, tok_host.endpoint, 0, err, sizeof(err)));
    CHECK_MSG(strstr(err, "longer than") != NULL, "long token: %s", err);
    unsetenv("APIR_TOKEN");
    /* raw: a Unix guest's hello (closed), random bytes (refused), the right
     * token raw (served) */
    int fd = raw_connect(tok_host.port);
    struct apir_shm_hello sh = { .magic = APIR_SHM_MAGIC, .version = 1, .pid = (int32_t)getpid() };
    CHECK(fd >= 0 && send_all(fd, &sh, sizeof(sh)));
    CHECK(wait_closed(fd, HANDSHAKE_MS + 5000) >= 0);
    close(fd);
    fd = raw_connect(tok_host.port);
    uint8_t junk[200];
    fill_random(junk, sizeof(junk));
    junk[0] = 0;
    struct apir_stream_hello_reply hr;
    CHECK(fd >= 0 && send_all(fd, junk, sizeof(junk)));
    CHECK(hello_reply(fd, &hr) && hr.status != 0 && strstr(hr.message, "not an apir stream hello"));
    CHECK(wait_closed(fd, 5000) >= 0);
    close(fd);
    fd = raw_session(tok_host.port, TOKEN);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    /* every refusal in the host's log; the guest kept through them works, and
     * a new one is served */
    CHECK(wait_log(&tok_host, "guest refused", 6, 3000));
    CHECK(kept_ok && apir_call_DEVICE_GET_DEVICE_COUNT(&kept, &n) == APIR_HANDLER_OK && n == 1);
    if (kept_ok)
        apir_remote_close(&kept);
    setenv("APIR_TOKEN", TOKEN, 1);
    CHECK(guest_open(&r, tok_host.endpoint, err, sizeof(err)));
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    apir_remote_close(&r);
    unsetenv("APIR_TOKEN");
    CHECK(stop_host(&tok_host, SIGTERM) == 0);
}

/* More guests than --max-clients (8): the one too many is told why, in
 * its error; a slot freed is taken again. */
static void test_too_many_clients(void)
{
    struct apir_remote r[9];
    char err[256] = "";
    /* nine against --max-clients 8, once earlier cases' guests are freed */
    const int opened = guests_fill(r, 9, main_host.endpoint, err, sizeof(err));
    CHECK(opened == 8);
    /* (process mode: the worker pool's refusal must be a stream hello reply) */
    CHECK_MSG(strstr(err, "too many clients") != NULL, "opened %d, last error: %s", opened, err);
    for (int i = 0; i < opened; i++)
        apir_remote_close(&r[i]);
    bool ok = false;
    for (int i = 0; i < 100 && !ok; i++) {
        ok = main_serves();
        if (!ok)
            usleep(20000);
    }
    CHECK(ok);
}

/* 5. A guest killed while holding a buffer, then one killed in the middle
 * of an upload: the host frees each session. */
static void test_guest_killed(void)
{
    for (int mid_upload = 0; mid_upload < 2; mid_upload++) {
        /* a worker process whose guest leaves mid-command just ends */
        const int before = log_count(&main_host, "disconnected after") + log_count(&main_host, "left in the middle");
        const int freeing = log_count(&main_host, "freeing 1 buffers");
        int p[2];
        CHECK(pipe(p) == 0);
        pid_t child = fork();
        if (child == 0) {
            struct apir_remote r;
            if (!open_main(&r))
                _exit(1);
            uint64_t buf = guest_alloc(&r, 32u << 20);
            apir_call_BUFFER_CLEAR(&r, buf, 7u);
            int32_t n = 0;
            apir_call_DEVICE_GET_COUNT(&r, &n);
            char c = buf ? 'y' : 'n';
            if (write(p[1], &c, 1) != 1)
                _exit(1);
            static uint8_t data[32u << 20];
            const struct apir_tensor_rec t = rec_f32(1, buf, 0, 8u << 20);
            for (;;) {
                if (mid_upload)
                    tensor_io(&r, true, buf, &t, 0, data, sizeof(data), NULL);
                else
                    pause();
            }
        }
        char c = 0;
        CHECK(read(p[0], &c, 1) == 1 && c == 'y');
        usleep(mid_upload ? 100000 : 10000);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        uint64_t t0 = apir_now_ns();
        bool freed = false;
        while (!freed && ms_since(t0) < 5000) {
            freed = log_count(&main_host, "disconnected after") + log_count(&main_host, "left in the middle") > before;
            if (!freed)
                usleep(20000);
        }
        printf("figure: %s: a killed guest's session freed %.0f ms after its death\n",
               mid_upload ? "mid-upload" : "idle", ms_since(t0));
        CHECK_MSG(freed, "%s: no 'disconnected' in the host's log", mid_upload ? "mid-upload" : "idle");
        CHECK(log_count(&main_host, "freeing 1 buffers") == freeing + 1 || log_count(&main_host, "left in the middle"));
        close(p[0]);
        close(p[1]);
    }
    CHECK(main_serves());
}

/* The long graph (test_host.h) runs in a thread here; sent unkeyed: the
 * reply comes after the compute. */
struct long_graph {
    struct apir_remote *r;
    int rc;
    _Atomic bool sending;          /* the buffer is there; the graph goes now */
    _Atomic uint64_t returned_ns;
};

static void *run_long_graph(void *arg)
{
    struct long_graph *lg = arg;
    struct apir_remote *r = lg->r;
    uint64_t buf = guest_alloc(r, MM_BYTES);
    lg->rc = -2;
    if (buf) {
        static uint8_t g[64 * 1024];
        const size_t size = mul_mat_graph(g, sizeof(g), buf);
        uint32_t status = 0;
        lg->sending = true;
        lg->rc = graph_compute(r, g, size, 0, &status);
    }
    lg->returned_ns = apir_now_ns();
    return NULL;
}

/* 5. The host killed while a guest waits for a graph, and between calls:
 * the guest's call fails within a bound, its log names the host; a new
 * host serves. */
static void test_host_killed(void)
{
    for (int mid_graph = 1; mid_graph >= 0; mid_graph--) {
        struct apir_remote r;
        if (!open_main(&r)) {
            CHECK(false);
            return;
        }
        char ep[96];
        snprintf(ep, sizeof(ep), "host at %s", main_host.endpoint);
        glog_clear();
        struct long_graph lg = { .r = &r, .rc = 0 };
        pthread_t th;
        int32_t n = 0;
        int rc = -3;
        if (mid_graph) {
            CHECK(pthread_create(&th, NULL, run_long_graph, &lg) == 0);
            for (int i = 0; i < 1000 && !lg.sending && !lg.returned_ns; i++)
                usleep(10000);
            usleep(500000);  /* sent, computing */
        } else {
            CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK);
        }
        const bool still_waiting = !mid_graph || lg.returned_ns == 0;
        uint64_t t0 = apir_now_ns();
        CHECK(stop_host(&main_host, SIGKILL) == 128 + SIGKILL);
        if (mid_graph) {
            pthread_join(th, NULL);
            rc = lg.rc;
        } else {
            rc = apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n);
        }
        const double ms = (double)((mid_graph ? lg.returned_ns : apir_now_ns()) - t0) / 1e6;
        printf("figure: host SIGKILLed %s: the guest's call failed %.1f ms later\n",
               mid_graph ? "mid-graph" : "between calls", ms);
        CHECK_MSG(still_waiting, "the graph had returned (%d) before the kill", lg.rc);
        CHECK_MSG(rc == -1, "%s: rc %d", mid_graph ? "graph" : "call", rc);
        CHECK_MSG(ms < 5000, "failure took %.0f ms", ms);
        CHECK_MSG(glog_has(ep), "the guest's log does not name the %s", ep);
        /* and the connection stays failed, at once */
        t0 = apir_now_ns();
        CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == -1 && ms_since(t0) < 1000);
        apir_remote_close(&r);
        CHECK(start_host(&main_host, "main", "tcp:127.0.0.1:0", NULL));
        CHECK(main_serves());
    }
}

static void test_sigterm_clean(void)
{
    CHECK(stop_host(&main_host, SIGTERM) == 0);
    CHECK(log_count(&main_host, "shutting down") == 1);
    CHECK(access(main_host.sock, F_OK) != 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s APIR_HOST_BINARY [process|thread]\n", argv[0]);
        return 2;
    }
    host_bin = argv[1];
    if (argc > 2)
        isolation = argv[2];
    signal(SIGPIPE, SIG_IGN);
    /* a 1 MiB data area: transfers above it take several frames */
    setenv("APIR_DATA_MB", "1", 1);
    unsetenv("APIR_TOKEN");
    unsetenv("APIR_TOKEN_FILE");
    unsetenv("APIR_HOST_TOKEN_FILE");
    unsetenv("APIR_LOG_FILE");
    /* Lanes: the hosts take them (as on 4 CPUs or more); the guests ask
     * only in test_lanes. */
    setenv("APIR_HOST_LANES", "4", 1);
    setenv("APIR_STREAM_LANES", "0", 1);
    rng_state ^= (uint64_t)getpid() << 20 ^ apir_now_ns();
    printf("random seed %llu\n", (unsigned long long)rng_state);
    apir_log_set_sink(glog_sink);
    snprintf(dir, sizeof(dir), "/tmp/apir-stream-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    static const struct test_case cases[] = {
        TEST(run_start),
        TEST(test_cut_frame_begin),
        TEST(test_commands),
        TEST(test_graph),
        TEST(test_posted),
        TEST(test_advisories),
        TEST(test_hostile_hellos),
        TEST(test_hostile_frames),
        TEST(test_slow_upload),
        TEST(test_lanes),
        TEST(test_lanes_tls),
        TEST(test_endpoints),
        TEST(test_nonloopback_needs_token),
        TEST(test_token),
        TEST(test_guest_killed),
        TEST(test_cut_frame_end),
        TEST(test_too_many_clients),
        TEST(test_host_killed),
        TEST(test_sigterm_clean),
    };
    int rc = test_run("stream", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    if (rc == 0) {
        const char *names[] = { "main.log", "token.log", "open.log", "slow.log", "v6.log", "nolanes.log", "tls.log", "keys", "token", "guest-token", "wrong-token" };
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            char p[160];
            snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
            unlink(p);
        }
        rmdir(dir);
    } else {
        printf("the hosts' logs are in %s\n", dir);
    }
    return rc;
}
