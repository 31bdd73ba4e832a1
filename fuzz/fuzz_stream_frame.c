/*
 * fuzz_stream_frame: the host side of the stream transport's framing
 * (transport/stream_proto.h, host/server/stream.c).
 *
 * Like fuzz_shm_frame, this runs the real server in threads of this process
 * and plays a hostile guest against it, one TCP connection per input.  Two
 * servers (apir_server_new on private Unix sockets, then
 * apir_server_listen_stream on tcp:127.0.0.1:0): one without a token,
 * one with FZ_STREAM_TOKEN.  The ports the kernel chose are found by
 * looking for the listening loopback sockets that appeared in this process
 * (the server does not export them).
 *
 * Per input: a hello (valid fields with bytes from the input, raw bytes,
 * right, missing or wrong tokens, a lane's join with a ticket no session
 * has, sent whole, in two pieces or cut short),
 * then frames: true or lying headers, segments in and out of the blobs
 * this guest created, commands (handshake, blob create/destroy, FORWARDs
 * with the input's items and the known-handle rewrite of fuzz_format.h,
 * raw bytes), payloads cut short or followed by garbage, pipelined frames.
 * Input format: fuzz_format.h.
 *
 * Oracles:
 *   - the hello is accepted exactly when magic, version and token are right;
 *     a refusal is a hello reply with the stream magic and a non-zero status;
 *   - a frame whose header is malformed, or one of whose ranges lies outside
 *     every blob this guest ever had, gets no reply: the host hangs up;
 *   - a well-formed frame whose ranges lie inside live blobs gets its reply,
 *     in order: right magic, n_out as asked, out_bytes the sum of the out
 *     ranges, reply items within the reply page; a FORWARD's OK reply is what
 *     the guest's typed decoder reads (fz_check_reply); blob commands are
 *     accepted only for ids and sizes the transport allows;
 *   - what a frame uploads into a range comes back from it unchanged (echo);
 *   - a frame cut short (the guest shuts its side) gets no reply, and the
 *     host closes; a guest that ends between frames is closed on;
 *   - nothing waits longer than IO_DEADLINE_MS (the host neither answers nor
 *     hangs up: abort), and every FZ_ALIVE_EVERY inputs both servers still
 *     serve a fresh, valid guest.
 * The host's FRAME_IDLE_MS is 30 s: every cut-short frame is ended by
 * shutting our side, never by waiting.
 *
 * Graph computes (the table's APIR_GRAPH class) are not sent: a
 * backend assert on an odd in-bounds node ends the process that computes,
 * which is this one here (apir-host contains it in a worker process;
 * fuzz_dispatch and fuzz_graph fuzz graphs with that containment).  They
 * travel as an unknown command number instead.
 */
#include "fuzz_host.h"
#include "server.h"
#include "stream_proto.h"
#include "wait.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define IO_DEADLINE_MS   10000
#define PAYLOAD_CAP      (4u << 20)   /* in payload bytes per frame we send; more: cut short */
#define OUT_CAP          (8u << 20)   /* out bytes per reply we read; more: hang up */
#define DRAIN_CAP        (32u << 20)  /* bytes read after a session went astray */
#define MAX_DEFERRED     4
#define MAX_SEGS         16           /* materialized, header may say more */
#define MAX_FRAMES       48           /* per session */
#define MODEL_BLOBS      (MAX_FRAMES + 1)  /* every id a session creates fits */
#define FZ_ALIVE_EVERY   32

static const char fz_token[] = FZ_STREAM_TOKEN;
static bool verbose;

struct server {
    struct apir_server *srv;
    pthread_t thread;
    char dir[64];
    char path[108];
    uint16_t port;
    bool has_token;
};
static struct server servers[2];

static void *server_main(void *arg)
{
    apir_server_run(((struct server *)arg)->srv);
    return NULL;
}

/* Ports of this process's listening IPv4 loopback TCP sockets. */
static int listening_ports(uint16_t *ports, int max)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        abort();
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        int fd = atoi(e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            continue;
        int acc = 0;
        socklen_t len = sizeof(acc);
        struct sockaddr_in a;
        socklen_t alen = sizeof(a);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || !acc ||
            getsockname(fd, (struct sockaddr *)&a, &alen) != 0 || a.sin_family != AF_INET ||
            a.sin_addr.s_addr != htonl(INADDR_LOOPBACK))
            continue;
        ports[n++] = ntohs(a.sin_port);
    }
    closedir(d);
    return n;
}

static void server_start(struct server *s, bool token)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/apir-fuzz-XXXXXX");
    if (!mkdtemp(s->dir))
        abort();
    snprintf(s->path, sizeof(s->path), "%s/host.sock", s->dir);
    char err[256];
    /* Lanes granted and joins looked up, whatever this machine's CPUs. */
    fz_host.cfg.max_lanes = APIR_STREAM_MAX_LANES;
    s->srv = apir_server_new(&fz_host, s->path, err, sizeof(err));
    if (!s->srv || (token && !apir_server_set_token(s->srv, fz_token, err, sizeof(err)))) {
        fprintf(stderr, "fuzz_stream_frame: %s\n", err);
        abort();
    }
    s->has_token = token;
    uint16_t before[16], after[16];
    int n_before = listening_ports(before, 16);
    if (!apir_server_listen_stream(s->srv, "tcp:127.0.0.1:0", err, sizeof(err))) {
        fprintf(stderr, "fuzz_stream_frame: %s\n", err);
        abort();
    }
    int n_after = listening_ports(after, 16);
    for (int i = 0; i < n_after && !s->port; i++) {
        bool old = false;
        for (int k = 0; k < n_before; k++)
            old |= before[k] == after[i];
        if (!old)
            s->port = after[i];
    }
    if (!s->port) {
        fprintf(stderr, "fuzz_stream_frame: cannot find the server's port\n");
        abort();
    }
    if (pthread_create(&s->thread, NULL, server_main, s) != 0)
        abort();
}

static void servers_shutdown(void)
{
    for (int i = 0; i < 2; i++) {
        apir_server_stop(servers[i].srv);
        pthread_join(servers[i].thread, NULL);
        apir_server_free(servers[i].srv);
        rmdir(servers[i].dir);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    fz_host_init();
    server_start(&servers[0], false);
    server_start(&servers[1], true);
    atexit(servers_shutdown);
    return 0;
}

/* ---- sockets with deadlines ---------------------------------------------------- */

static void wait_fd(int fd, short events, const char *what)
{
    struct pollfd p = { .fd = fd, .events = events };
    int r;
    do
        r = poll(&p, 1, IO_DEADLINE_MS);
    while (r < 0 && errno == EINTR);
    FZ_ASSERT(r != 0, "the host did nothing for %d ms (%s)", IO_DEADLINE_MS, what);
}

static int guest_connect(const struct server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FZ_ASSERT(fd >= 0, "socket: errno %d", errno);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(s->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int r = connect(fd, (struct sockaddr *)&a, sizeof(a));
    if (r != 0 && errno == EINTR) {
        /* libFuzzer's timer interrupted it: the connection goes on. */
        wait_fd(fd, POLLOUT, "a connection");
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0 ? 0 : -1;
        errno = soerr;
    }
    FZ_ASSERT(r == 0, "the server on port %u refuses connections (errno %d)", s->port, errno);
    return fd;
}

/* All n bytes, or false once the host has closed. */
static bool send_all(int fd, const void *p, size_t n, const char *what)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            wait_fd(fd, POLLOUT, what);
        } else if (!(w < 0 && errno == EINTR)) {
            return false;
        }
    }
    return true;
}

/* n zero bytes after prefix (up to n of them). */
static bool send_payload(int fd, const uint8_t *prefix, size_t prefix_len, size_t n)
{
    static const uint8_t zeros[64 * 1024];
    size_t k = prefix_len < n ? prefix_len : n;
    if (!send_all(fd, prefix, k, "an upload"))
        return false;
    for (n -= k; n;) {
        size_t c = n < sizeof(zeros) ? n : sizeof(zeros);
        if (!send_all(fd, zeros, c, "an upload"))
            return false;
        n -= c;
    }
    return true;
}

/* Reads up to n bytes (dst NULL: discards them); returns how many came
 * before the host closed. */
static size_t recv_upto(int fd, void *dst, size_t n, const char *what)
{
    static uint8_t sink[64 * 1024];
    size_t done = 0;
    while (done < n) {
        size_t want = n - done;
        void *to = dst ? (uint8_t *)dst + done : sink;
        if (!dst && want > sizeof(sink))
            want = sizeof(sink);
        ssize_t r = recv(fd, to, want, MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            wait_fd(fd, POLLIN, what);
        } else if (!(r < 0 && errno == EINTR)) {
            break;  /* 0: closed; ECONNRESET: closed with our bytes unread */
        }
    }
    return done;
}

/* Ends our side and reads what comes until the host closes; returns the
 * bytes that came (at most DRAIN_CAP are read: then we close ours). */
static size_t shut_and_drain(int fd, const char *what)
{
    shutdown(fd, SHUT_WR);
    size_t total = 0;
    for (;;) {
        size_t got = recv_upto(fd, NULL, 64 * 1024, what);
        total += got;
        if (got < 64 * 1024 || total >= DRAIN_CAP)
            return total;
    }
}

/* ---- the guest's model of its session --------------------------------------------- */

struct mblob {
    uint32_t res_id;
    uint64_t size;
    uint64_t max_size;  /* the largest it ever was */
    bool live;          /* created and not destroyed, as far as we know */
};

struct pending_reply {
    uint32_t cmd_type, fwd_cmd;
    uint16_t n_out;
    uint64_t out_bytes;
    uint32_t create_id;
    uint64_t create_size;
};

struct session {
    int fd;
    const struct server *srv;
    bool clean;              /* every frame so far answered as the model says */
    bool open;               /* the host has not hung up */
    struct mblob blobs[MODEL_BLOBS];
    int n_blobs;
    struct fz_known known;
    struct pending_reply deferred[MAX_DEFERRED];
    int n_deferred;
    unsigned frames;
};

static struct mblob *model_find(struct session *s, uint32_t res_id)
{
    for (int i = 0; i < s->n_blobs; i++)
        if (s->blobs[i].res_id == res_id)
            return &s->blobs[i];
    return NULL;
}

enum seg_class { SEG_VALID, SEG_UNKNOWN, SEG_INVALID };

static enum seg_class classify(struct session *s, const struct apir_stream_segment *g)
{
    uint64_t end;
    if (g->reserved != 0 || __builtin_add_overflow(g->offset, g->size, &end))
        return SEG_INVALID;
    struct mblob *b = model_find(s, g->res_id);
    if (!b || end > b->max_size)
        return SEG_INVALID;  /* no blob of that id was ever this large */
    if (!s->clean)
        return SEG_UNKNOWN;
    return b->live && end <= b->size ? SEG_VALID : SEG_UNKNOWN;
}

static bool is_graph_cmd(uint32_t cmd)
{
    return (apir_command_classes(cmd) & APIR_GRAPH) == APIR_GRAPH;  /* the table's graph commands */
}

/* ---- one frame ------------------------------------------------------------------ */

struct frame {
    struct apir_stream_frame f;
    struct apir_stream_segment seg[MAX_SEGS];
    uint32_t n_seg;              /* materialized: f.n_in + f.n_out unless lying */
    uint8_t cmd[APIR_MAX_COMMAND_SIZE];
    uint32_t cmd_bytes;          /* what we send */
    const uint8_t *fill;         /* payload prefix */
    size_t fill_len;
    bool lie;                    /* header fields not what the rest says */
    bool defer;
    size_t extra;                /* garbage bytes after it */
    const uint8_t *extra_bytes;
    bool cut;
    size_t cut_at;
    /* Echo: the out range is the in range; check the bytes. */
    const uint8_t *echo;
    size_t echo_len;
};

static bool header_valid(const struct apir_stream_frame *f)
{
    return f->magic == APIR_STREAM_FRAME_MAGIC && f->cmd_len >= APIR_CMD_HEADER_SIZE &&
           f->cmd_len <= APIR_MAX_COMMAND_SIZE && (uint32_t)f->n_in + f->n_out <= APIR_STREAM_MAX_SEGMENTS &&
           f->lanes == 0;
}

static void command_header(uint8_t *p, int32_t type, int32_t flags, uint32_t reply_res)
{
    memcpy(p, &type, 4);
    memcpy(p + 4, &flags, 4);
    memcpy(p + 8, &reply_res, 4);
}

static void session_end(struct session *s)
{
    s->open = false;
}

/* Reads one reply as pending expects; false when the host hung up (or we
 * had to: too large a download). */
static bool read_reply(struct session *s, const struct pending_reply *pr, bool must, const struct frame *fr)
{
    struct apir_stream_reply rh;
    size_t got = recv_upto(s->fd, &rh, sizeof(rh), "a reply");
    if (got == 0) {
        FZ_ASSERT(!must, "the host hung up on a well-formed frame (command type %u, cmd %u, frame %u) whose ranges "
                  "lie in live blobs", pr->cmd_type, pr->fwd_cmd, s->frames);
        return false;
    }
    FZ_ASSERT(got == sizeof(rh), "a reply header cut short (%zu bytes)", got);
    FZ_ASSERT(rh.magic == APIR_STREAM_REPLY_MAGIC, "reply magic %08x", rh.magic);
    FZ_ASSERT(rh.n_out == pr->n_out, "reply n_out %u for %u asked", rh.n_out, pr->n_out);
    FZ_ASSERT(rh.out_bytes == pr->out_bytes, "reply out_bytes %llu, the out ranges hold %llu",
              (unsigned long long)rh.out_bytes, (unsigned long long)pr->out_bytes);
    FZ_ASSERT(rh.reply_len <= APIR_REPLY_BLOB_SIZE - 4, "reply of %u item bytes", rh.reply_len);
    if (verbose)
        fprintf(stderr, "fuzz_stream_frame: reply: type %u cmd %u -> ret %u, %u item bytes, %u out (%llu bytes)\n",
                pr->cmd_type, pr->fwd_cmd, rh.ret, rh.reply_len, rh.n_out, (unsigned long long)rh.out_bytes);
    static uint8_t items[APIR_REPLY_BLOB_SIZE];
    got = recv_upto(s->fd, items, rh.reply_len, "reply items");
    FZ_ASSERT(got == rh.reply_len, "reply items cut short (%zu of %u)", got, rh.reply_len);

    switch (pr->cmd_type) {
    case APIR_CMD_TYPE_FORWARD:
        FZ_ASSERT(rh.ret >= APIR_FORWARD_BASE && rh.ret <= APIR_FORWARD_BASE + APIR_HANDLER_STALE,
                  "FORWARD %u returned %u", pr->fwd_cmd, rh.ret);
        if (pr->fwd_cmd >= APIR_CMD_COUNT)
            FZ_ASSERT(rh.ret == APIR_FORWARD_BASE + APIR_HANDLER_INVALID_INDEX, "unknown command %u gave %u",
                      pr->fwd_cmd, rh.ret);
        if (rh.ret == APIR_FORWARD_BASE + APIR_HANDLER_OK)
            fz_check_reply(pr->fwd_cmd, items, rh.reply_len, &s->known);
        break;
    case APIR_CMD_TYPE_HANDSHAKE:
        FZ_ASSERT(rh.ret == 0 || rh.ret == APIR_HANDSHAKE_MAGIC, "handshake returned %u", rh.ret);
        break;
    case APIR_CMD_TYPE_SHM_BLOB_CREATE:
        if (rh.ret == 0) {
            FZ_ASSERT(pr->create_id >= APIR_STREAM_FIRST_RES_ID && pr->create_size > 0 &&
                      pr->create_size <= fz_host.cfg.limits.max_blob_bytes,
                      "blob %u of %llu bytes accepted", pr->create_id, (unsigned long long)pr->create_size);
            struct mblob *b = model_find(s, pr->create_id);
            FZ_ASSERT(!b || !b->live || !s->clean, "blob %u created twice", pr->create_id);
            if (!b && s->n_blobs < MODEL_BLOBS)
                b = &s->blobs[s->n_blobs++];
            if (b) {
                b->res_id = pr->create_id;
                b->size = pr->create_size;
                if (pr->create_size > b->max_size)
                    b->max_size = pr->create_size;
                b->live = true;
            } else {
                s->clean = false;  /* the model lost track */
            }
        }
        break;
    case APIR_CMD_TYPE_SHM_BLOB_DESTROY: {
        struct mblob *b = model_find(s, pr->create_id);
        if (rh.ret == 0) {
            FZ_ASSERT(b || !s->clean, "destroy of blob %u, which was never created, succeeded", pr->create_id);
            if (b)
                b->live = false;
        }
        break;
    }
    case APIR_CMD_TYPE_LOADLIBRARY:
        break;
    case APIR_CMD_TYPE_STREAM_LANES: {
        /* Granted: at most the limit, with a ticket; else refused. */
        uint32_t granted = 0;
        if (rh.reply_len >= 4)
            memcpy(&granted, items, 4);
        FZ_ASSERT(rh.ret == 1 || (rh.ret == 0 && rh.reply_len == 4 + APIR_STREAM_TICKET_BYTES && granted >= 1 &&
                                  granted <= APIR_STREAM_MAX_LANES),
                  "lanes: returned %u with %u reply bytes (%u granted)", rh.ret, rh.reply_len, granted);
        break;
    }
    default:
        FZ_ASSERT(rh.ret == APIR_FORWARD_NO_DISPATCH, "command type %u returned %u", pr->cmd_type, rh.ret);
        break;
    }

    if (rh.out_bytes > OUT_CAP)
        return false;  /* not worth reading: hang up */
    if (fr && fr->echo) {
        static uint8_t back[64 * 1024];
        FZ_ASSERT(fr->echo_len <= sizeof(back) && rh.out_bytes == fr->echo_len, "echo size");
        got = recv_upto(s->fd, back, fr->echo_len, "a download");
        FZ_ASSERT(got == fr->echo_len, "download cut short (%zu of %zu)", got, fr->echo_len);
        FZ_ASSERT(memcmp(back, fr->echo, fr->echo_len) == 0, "a range uploaded and downloaded in one frame came "
                  "back changed (%zu bytes)", fr->echo_len);
    } else {
        got = recv_upto(s->fd, NULL, (size_t)rh.out_bytes, "a download");
        FZ_ASSERT(got == rh.out_bytes, "download cut short (%zu of %llu)", got, (unsigned long long)rh.out_bytes);
    }
    return true;
}

static void flush_deferred(struct session *s)
{
    for (int i = 0; i < s->n_deferred && s->open; i++)
        if (!read_reply(s, &s->deferred[i], true, NULL))
            session_end(s);
    s->n_deferred = 0;
}

/* Sends fr and checks what comes back. */
static void play_frame(struct session *s, struct frame *fr)
{
    s->frames++;
    struct apir_stream_frame *f = &fr->f;
    bool hdr_ok = header_valid(f);
    bool lying_len = f->cmd_len != fr->cmd_bytes;
    if (!fr->lie)
        FZ_ASSERT(!lying_len, "harness: cmd_len");

    /* What the host must do with it. */
    enum seg_class worst = SEG_VALID;
    uint64_t in_bytes = 0, out_bytes = 0;
    uint32_t n_seg = (uint32_t)f->n_in + f->n_out;
    bool seg_consistent = n_seg == fr->n_seg;
    for (uint32_t i = 0; i < fr->n_seg; i++) {
        enum seg_class c = classify(s, &fr->seg[i]);
        if (c > worst)
            worst = c;
        uint64_t *sum = i < f->n_in ? &in_bytes : &out_bytes;
        if (__builtin_add_overflow(*sum, fr->seg[i].size, sum))
            *sum = UINT64_MAX;
    }
    int32_t type = 0, flags = 0;
    uint32_t item0 = 0;
    uint64_t item1 = 0;
    if (fr->cmd_bytes >= 12) {
        memcpy(&type, fr->cmd, 4);
        memcpy(&flags, fr->cmd + 4, 4);
    }
    if (fr->cmd_bytes >= 16)
        memcpy(&item0, fr->cmd + 12, 4);
    if (fr->cmd_bytes >= 24)
        memcpy(&item1, fr->cmd + 16, 8);
    bool in_fits = in_bytes <= PAYLOAD_CAP;
    /* Aligned: the host reads exactly what we send as this frame. */
    bool aligned = hdr_ok && !lying_len && seg_consistent;
    bool must_hang_up = !hdr_ok || (aligned && worst == SEG_INVALID);
    bool destroys = type == APIR_CMD_TYPE_SHM_BLOB_DESTROY && f->n_out;
    bool must_reply = aligned && worst == SEG_VALID && s->clean && !destroys && in_fits && !fr->cut;
    /* Pipelined: a small upload-only frame, its reply read later. */
    bool deferrable = must_reply && !fr->extra && fr->defer && f->n_out == 0 && in_bytes <= 64 * 1024;
    if (!deferrable || s->n_deferred == MAX_DEFERRED)
        flush_deferred(s);
    if (!s->open)
        return;

    if (verbose)
        fprintf(stderr, "fuzz_stream_frame: frame %u: type %d/%d, cmd_len %u (%u sent), %u+%u ranges (%u sent), "
                "worst %d, must %s, in %llu out %llu%s%s%s\n", s->frames, type, flags, f->cmd_len, fr->cmd_bytes,
                f->n_in, f->n_out, fr->n_seg, (int)worst, must_reply ? "reply" : must_hang_up ? "hang up" : "-",
                (unsigned long long)in_bytes, (unsigned long long)out_bytes, deferrable ? " deferred" : "",
                fr->cut ? " cut" : "", fr->extra ? " +garbage" : "");
    /* The bytes: header, segments, command, payloads, garbage. */
    static uint8_t head[sizeof(struct apir_stream_frame) + MAX_SEGS * sizeof(struct apir_stream_segment) +
                        APIR_MAX_COMMAND_SIZE];
    size_t hl = 0;
    memcpy(head, f, sizeof(*f));
    hl += sizeof(*f);
    memcpy(head + hl, fr->seg, fr->n_seg * sizeof(fr->seg[0]));
    hl += fr->n_seg * sizeof(fr->seg[0]);
    memcpy(head + hl, fr->cmd, fr->cmd_bytes);
    hl += fr->cmd_bytes;
    size_t total = hl + (in_fits ? (size_t)in_bytes : PAYLOAD_CAP);
    size_t stop = fr->cut ? fr->cut_at % (total ? total : 1) : total;
    if (!in_fits && !fr->cut) {
        fr->cut = true;  /* a payload we will not send whole */
        stop = total;
    }
    bool alive = send_all(s->fd, head, stop < hl ? stop : hl, "a frame");
    size_t sent = stop < hl ? stop : hl;
    for (uint32_t i = 0; alive && i < fr->n_seg && i < f->n_in && sent < stop; i++) {
        size_t n = fr->seg[i].size < stop - sent ? (size_t)fr->seg[i].size : stop - sent;
        alive = send_payload(s->fd, fr->fill, fr->fill_len, n);
        sent += n;
    }
    if (alive && fr->extra && !fr->cut)
        alive = send_all(s->fd, fr->extra_bytes, fr->extra, "garbage");

    if (fr->cut || must_hang_up || !aligned) {
        /* Cut short, malformed or misaligned: nothing we can predict
         * frame by frame; the host must end it (we shut our side). */
        size_t back = shut_and_drain(s->fd, "a frame cut short or malformed");
        if (must_hang_up || (fr->cut && aligned))
            FZ_ASSERT(back == 0, "the host sent %zu bytes in answer to a %s frame (type %d, %u ranges, cmd_len %u, "
                      "%zu of %zu bytes sent)", back, !hdr_ok ? "malformed" : worst == SEG_INVALID ? "out-of-blob"
                      : "cut-short", type, n_seg, f->cmd_len, sent, total);
        session_end(s);
        return;
    }
    struct pending_reply pr = { .cmd_type = (uint32_t)type, .fwd_cmd = (uint32_t)flags, .n_out = f->n_out,
                                .out_bytes = out_bytes, .create_id = item0, .create_size = item1 };
    if (deferrable && alive) {
        s->deferred[s->n_deferred++] = pr;
        return;
    }
    if (!read_reply(s, &pr, must_reply, fr)) {
        session_end(s);
        return;
    }
    if (!must_reply)
        s->clean = false;
    if (fr->extra) {
        shut_and_drain(s->fd, "garbage after a frame");
        session_end(s);
    }
}

/* ---- input -> frames ----------------------------------------------------------- */

static uint64_t blob_size_of(struct session *s, uint32_t res_id)
{
    struct mblob *b = model_find(s, res_id);
    return b ? b->size : 0;
}

static void read_segment(struct fz_reader *r, struct session *s, struct apir_stream_segment *g)
{
    uint8_t sel = (uint8_t)fz_read_le(r, 1);
    memset(g, 0, sizeof(*g));
    if (sel & 0x80) {
        g->res_id = (uint32_t)fz_read_le(r, 4);
        g->reserved = (uint32_t)fz_read_le(r, 4);
        g->offset = fz_read_le(r, 8);
        g->size = fz_read_le(r, 8);
        return;
    }
    unsigned idx = sel & 7;
    g->res_id = idx < 6 ? APIR_STREAM_FIRST_RES_ID + idx : idx == 6 ? APIR_STREAM_REPLY_RES_ID : 0;
    uint64_t off = fz_read_le(r, 2), size = fz_read_le(r, 2);
    uint64_t bsize = blob_size_of(s, g->res_id);
    if (sel & 0x20)
        size *= 64;
    g->offset = (sel & 0x40) && off <= bsize ? bsize - off : off;
    if (sel & 0x10)
        size = g->offset <= bsize ? bsize - g->offset : 0;
    g->size = size;
}

/* The command bytes of a frame. */
static void read_command(struct fz_reader *r, struct session *s, struct frame *fr)
{
    uint8_t ck = (uint8_t)fz_read_le(r, 1);
    size_t len;
    const uint8_t *items;
    switch (ck & 3) {
    case 0: {  /* FORWARD: u8 cmd, u16 len, items (handle numbers rewritten) */
        uint32_t cmd = (uint32_t)fz_read_le(r, 1);
        len = (size_t)fz_read_le(r, 2);
        items = fz_take(r, len, &len);
        memcpy(fr->cmd + 12, items, len);
        bool known_hit = false;
        if (cmd < APIR_CMD_COUNT)
            fz_patch_request(fr->cmd + 12, len, apir_command_table[cmd].request, &s->known, &known_hit);
        if (is_graph_cmd(cmd) || (known_hit && fz_skipping_known()))
            cmd += 0x100;  /* unknown: refused */
        /* Known finding I (fuzz/findings): a buffer of 0 bytes has no base,
         * and importing a tensor into it computes NULL + 0 (UBSan). */
        if (cmd == APIR_CMD_BUFFER_TYPE_ALLOC_BUFFER && len >= 16 && fz_skipping_known()) {
            uint64_t size;
            memcpy(&size, fr->cmd + 12 + 8, 8);
            if (size == 0)
                memcpy(fr->cmd + 12 + 8, &(uint64_t){ 1 }, 8);
        }
        command_header(fr->cmd, APIR_CMD_TYPE_FORWARD, (int32_t)cmd, APIR_STREAM_REPLY_RES_ID);
        fr->cmd_bytes = (uint32_t)(12 + len);
        break;
    }
    case 1: {  /* the transport's own: handshake, load, blob commands, others */
        static const int32_t types[8] = { APIR_CMD_TYPE_HANDSHAKE, APIR_CMD_TYPE_LOADLIBRARY,
                                          APIR_CMD_TYPE_SHM_BLOB_CREATE, APIR_CMD_TYPE_SHM_BLOB_DESTROY,
                                          APIR_CMD_TYPE_SHM_BLOB_FILE, APIR_CMD_TYPE_STREAM_LANES, 3, -1 };
        len = (size_t)fz_read_le(r, 2);
        items = fz_take(r, len, &len);
        memcpy(fr->cmd + 12, items, len);
        command_header(fr->cmd, types[(ck >> 2) & 7], 0, APIR_STREAM_REPLY_RES_ID);
        fr->cmd_bytes = (uint32_t)(12 + len);
        break;
    }
    default:  /* raw bytes, header included (a short one is malformed) */
        len = (size_t)fz_read_le(r, 2);
        items = fz_take(r, len, &len);
        memcpy(fr->cmd, items, len);
        fr->cmd_bytes = (uint32_t)len;
        break;
    }
}

static struct frame fr_buf;

static void frame_reset(struct frame *fr)
{
    memset(&fr->f, 0, sizeof(fr->f));
    memset(fr->seg, 0, sizeof(fr->seg));
    fr->n_seg = 0;
    fr->cmd_bytes = 0;
    fr->fill = NULL;
    fr->fill_len = 0;
    fr->lie = fr->defer = fr->cut = false;
    fr->extra = 0;
    fr->extra_bytes = NULL;
    fr->cut_at = 0;
    fr->echo = NULL;
    fr->echo_len = 0;
}

static void finish_header(struct frame *fr, uint16_t n_in, uint16_t n_out)
{
    fr->f.magic = APIR_STREAM_FRAME_MAGIC;
    fr->f.cmd_len = fr->cmd_bytes;
    fr->f.n_in = n_in;
    fr->f.n_out = n_out;
    fr->f.lanes = 0;
}

/* A structured frame: K bit 3 lies in the header, bit 4 defers its reply,
 * bit 5 adds garbage, bit 6 cuts it short. */
static void structured_frame(struct fz_reader *r, struct session *s, uint8_t k)
{
    struct frame *fr = &fr_buf;
    frame_reset(fr);
    uint8_t lie = (k & 0x08) ? (uint8_t)fz_read_le(r, 1) : 0;
    uint8_t nseg = (uint8_t)fz_read_le(r, 1);
    uint16_t n_in = nseg & 7, n_out = (nseg >> 3) & 7;
    fr->n_seg = (uint32_t)n_in + n_out;
    for (uint32_t i = 0; i < fr->n_seg; i++)
        read_segment(r, s, &fr->seg[i]);
    read_command(r, s, fr);
    fr->fill = fz_take(r, (size_t)fz_read_le(r, 1), &fr->fill_len);
    finish_header(fr, n_in, n_out);
    if (lie) {
        fr->lie = true;
        if (lie & 1)
            fr->f.magic = (uint32_t)fz_read_le(r, 4);
        if (lie & 2)
            fr->f.lanes = (uint32_t)fz_read_le(r, 4);
        if (lie & 4)
            fr->f.cmd_len = (uint32_t)fz_read_le(r, 4);
        if (lie & 8) {
            fr->f.n_in = (uint16_t)fz_read_le(r, 2);
            fr->f.n_out = (uint16_t)fz_read_le(r, 2);
        }
    }
    fr->defer = (k & 0x10) != 0;
    if (k & 0x20)
        fr->extra_bytes = fz_take(r, (size_t)fz_read_le(r, 1) + 1, &fr->extra);
    if (k & 0x40) {
        fr->cut = true;
        fr->cut_at = (size_t)fz_read_le(r, 2);
    }
    play_frame(s, fr);
}

/* A well-formed frame of one transport command with fixed items. */
static void simple_frame(struct session *s, int32_t type, int32_t flags, const void *items, size_t len)
{
    struct frame *fr = &fr_buf;
    frame_reset(fr);
    command_header(fr->cmd, type, flags, APIR_STREAM_REPLY_RES_ID);
    memcpy(fr->cmd + 12, items, len);
    fr->cmd_bytes = (uint32_t)(12 + len);
    finish_header(fr, 0, 0);
    play_frame(s, fr);
}

static uint32_t small_res_id(uint8_t b)
{
    return (b & 0x80) ? (uint32_t)(b & 0x7f) : APIR_STREAM_FIRST_RES_ID + (b & 7);
}

/* Upload a range and download it in the same frame, around a command that
 * touches no blob: the bytes must come back. */
static void echo_frame(struct fz_reader *r, struct session *s)
{
    static uint8_t data[64 * 1024];
    struct frame *fr = &fr_buf;
    frame_reset(fr);
    uint32_t res_id = small_res_id((uint8_t)fz_read_le(r, 1));
    uint64_t off = fz_read_le(r, 2), len = fz_read_le(r, 2);
    size_t got;
    const uint8_t *src = fz_take(r, (size_t)fz_read_le(r, 1), &got);
    memset(data, 0, sizeof(data));
    memcpy(data, src, got < len ? got : (size_t)len);
    fr->seg[0] = (struct apir_stream_segment){ .res_id = res_id, .offset = off, .size = len };
    fr->seg[1] = fr->seg[0];
    fr->n_seg = 2;
    fr->fill = src;
    fr->fill_len = got;
    fr->echo = data;
    fr->echo_len = (size_t)len;
    command_header(fr->cmd, APIR_CMD_TYPE_FORWARD, APIR_CMD_DEVICE_GET_COUNT, APIR_STREAM_REPLY_RES_ID);
    fr->cmd_bytes = 12;
    finish_header(fr, 1, 1);
    play_frame(s, fr);
}

/* ---- a session ------------------------------------------------------------------- */

#define HANDSHAKE_FRAME_SIZE (sizeof(struct apir_stream_frame) + APIR_CMD_HEADER_SIZE + 8)

/* A well-formed HANDSHAKE frame (0.minor), as bytes. */
static void handshake_frame(uint8_t *out, uint32_t minor)
{
    const struct apir_stream_frame f = { APIR_STREAM_FRAME_MAGIC, APIR_CMD_HEADER_SIZE + 8, 0, 0, 0 };
    memcpy(out, &f, sizeof(f));
    command_header(out + sizeof(f), APIR_CMD_TYPE_HANDSHAKE, 0, APIR_STREAM_REPLY_RES_ID);
    const uint32_t v[2] = { APIR_VERSION_MAJOR, minor };
    memcpy(out + sizeof(f) + APIR_CMD_HEADER_SIZE, v, sizeof(v));
}

/* The hello; true when the host accepted it. */
static bool hello(struct fz_reader *r, struct session *s, uint8_t plan)
{
    struct apir_stream_hello h;
    memset(&h, 0, sizeof(h));
    unsigned mode = (plan >> 1) & 3, tok = (plan >> 3) & 3;
    size_t got;
    if (mode == 2) {
        const uint8_t *raw = fz_take(r, sizeof(h), &got);
        memcpy(&h, raw, got);
    } else {
        h.magic = APIR_STREAM_MAGIC;
        h.version = APIR_STREAM_VERSION;
        h.pid = (int32_t)fz_read_le(r, 2);
        if (mode == 1) {
            h.magic = (uint32_t)fz_read_le(r, 4);
            h.version = (uint32_t)fz_read_le(r, 4);
            /* A lane's join: its ticket is no live session's (never taken). */
            if ((h.pid & 3) == 3)
                h.magic = APIR_STREAM_JOIN_MAGIC;
        }
        switch (tok) {
        case 0:
        case 3:
            if (s->srv->has_token) {
                h.token_len = (uint32_t)strlen(fz_token);
                memcpy(h.token, fz_token, h.token_len);
            }
            if (tok == 3) {  /* near misses: a byte off, a length off */
                uint8_t how = (uint8_t)fz_read_le(r, 1);
                if (how & 0x80)
                    h.token_len = (uint32_t)(h.token_len + (how & 0x7f)) - 0x40;
                else
                    h.token[how % APIR_STREAM_TOKEN_MAX] ^= (uint8_t)fz_read_le(r, 1);
            }
            break;
        case 1:
            break;  /* none */
        case 2: {
            h.token_len = (uint32_t)fz_read_le(r, 1);
            const uint8_t *t = fz_take(r, APIR_STREAM_TOKEN_MAX, &got);
            memcpy(h.token, t, got);
            break;
        }
        }
    }
    bool token_ok = true;
    if (s->srv->has_token)
        token_ok = h.token_len == strlen(fz_token) && memcmp(h.token, fz_token, h.token_len) == 0;
    bool expect = h.magic == APIR_STREAM_MAGIC && h.version == APIR_STREAM_VERSION &&
                  h.token_len <= APIR_STREAM_TOKEN_MAX && token_ok;

    size_t split = sizeof(h);
    if (plan & 0x20)
        split = (size_t)fz_read_le(r, 1) % sizeof(h);
    if (!send_all(s->fd, &h, split, "the hello"))
        FZ_ASSERT(false, "the host closed during a hello's first %zu bytes", split);
    if (mode == 3) {
        /* Cut short: the host must close without a word. */
        size_t back = shut_and_drain(s->fd, "a hello cut short");
        FZ_ASSERT(back == 0 || split == sizeof(h), "the host answered a hello of %zu bytes (%zu back)", split, back);
        return false;
    }
    if (split < sizeof(h)) {
        usleep(500);
        if (!send_all(s->fd, (uint8_t *)&h + split, sizeof(h) - split, "the hello"))
            FZ_ASSERT(false, "the host closed during a hello");
    }
    /* Pipelined: a handshake frame before the hello's answer came. */
    bool early = (plan & 0x40) != 0;
    if (early) {
        uint8_t hs[HANDSHAKE_FRAME_SIZE];
        handshake_frame(hs, APIR_VERSION_MINOR);
        early = send_all(s->fd, hs, sizeof(hs), "a frame after the hello");
    }
    struct apir_stream_hello_reply rep;
    got = recv_upto(s->fd, &rep, sizeof(rep), "the hello reply");
    FZ_ASSERT(got == sizeof(rep), "hello reply of %zu bytes (magic %08x version %u token_len %u)", got, h.magic,
              h.version, h.token_len);
    FZ_ASSERT(rep.magic == APIR_STREAM_MAGIC, "hello reply magic %08x", rep.magic);
    bool accepted = rep.status == 0;
    FZ_ASSERT(accepted == expect, "hello %s (magic %08x, version %u, token_len %u, server %s a token): %.120s",
              accepted ? "accepted" : "refused", h.magic, h.version, h.token_len,
              s->srv->has_token ? "with" : "without", rep.message);
    if (!accepted) {
        size_t back = recv_upto(s->fd, NULL, 4096, "close after a refusal");
        FZ_ASSERT(back == 0, "%zu bytes after a refusal", back);
    }
    if (accepted && early) {
        const struct pending_reply pr = { .cmd_type = APIR_CMD_TYPE_HANDSHAKE };
        if (!read_reply(s, &pr, true, NULL))
            return false;
    }
    return accepted;
}

static void run_session(struct fz_reader *r)
{
    uint8_t plan = (uint8_t)fz_read_le(r, 1);
    static struct session s;
    memset(&s, 0, sizeof(s));
    s.srv = &servers[plan & 1];
    s.fd = guest_connect(s.srv);
    s.clean = true;
    s.open = hello(r, &s, plan);
    while (s.open && r->left && s.frames < MAX_FRAMES) {
        uint8_t k = (uint8_t)fz_read_le(r, 1);
        switch (k & 7) {
        case 0:
        case 1:
        case 2:
            structured_frame(r, &s, k);
            break;
        case 3: {  /* raw bytes on the wire: anything may follow */
            size_t len;
            const uint8_t *raw = fz_take(r, (size_t)fz_read_le(r, 2), &len);
            flush_deferred(&s);
            if (s.open && send_all(s.fd, raw, len, "raw bytes"))
                shut_and_drain(s.fd, "raw bytes");
            session_end(&s);
            break;
        }
        case 4: {  /* BLOB_CREATE of a small id, u32 size */
            uint8_t items[12];
            uint32_t id = small_res_id((uint8_t)fz_read_le(r, 1));
            uint64_t size = fz_read_le(r, 4);
            if (k & 0x80)
                size <<= 16;  /* past the quota */
            memcpy(items, &id, 4);
            memcpy(items + 4, &size, 8);
            simple_frame(&s, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, items, 12);
            break;
        }
        case 5: {  /* BLOB_DESTROY */
            uint32_t id = small_res_id((uint8_t)fz_read_le(r, 1));
            simple_frame(&s, APIR_CMD_TYPE_SHM_BLOB_DESTROY, 0, &id, 4);
            break;
        }
        case 6:
            echo_frame(r, &s);
            break;
        case 7: {  /* HANDSHAKE 0.minor */
            uint32_t v[2] = { APIR_VERSION_MAJOR, (uint32_t)fz_read_le(r, 1) % 8 };
            simple_frame(&s, APIR_CMD_TYPE_HANDSHAKE, 0, v, sizeof(v));
            break;
        }
        }
    }
    if (s.open) {
        flush_deferred(&s);
        if (s.open) {
            /* Between frames: the host must close when we do. */
            size_t back = shut_and_drain(s.fd, "the end of a session");
            FZ_ASSERT(back == 0, "%zu bytes from the host after the last reply", back);
        }
    }
    close(s.fd);
}

/* A fresh, valid guest: hello, handshake, answered. */
static void check_alive(struct server *srv)
{
    int fd = guest_connect(srv);
    struct apir_stream_hello h = { .magic = APIR_STREAM_MAGIC, .version = APIR_STREAM_VERSION, .pid = 1 };
    if (srv->has_token) {
        h.token_len = (uint32_t)strlen(fz_token);
        memcpy(h.token, fz_token, h.token_len);
    }
    struct apir_stream_hello_reply rep;
    FZ_ASSERT(send_all(fd, &h, sizeof(h), "alive: hello") &&
              recv_upto(fd, &rep, sizeof(rep), "alive: hello reply") == sizeof(rep) && rep.status == 0,
              "the server (port %u) no longer accepts a valid guest", srv->port);
    uint8_t fr[HANDSHAKE_FRAME_SIZE];
    handshake_frame(fr, APIR_VERSION_MINOR);
    struct apir_stream_reply rh;
    FZ_ASSERT(send_all(fd, fr, sizeof(fr), "alive: handshake") &&
              recv_upto(fd, &rh, sizeof(rh), "alive: reply") == sizeof(rh) && rh.magic == APIR_STREAM_REPLY_MAGIC &&
              rh.ret == APIR_HANDSHAKE_MAGIC,
              "the server (port %u) no longer serves a valid handshake", srv->port);
    recv_upto(fd, NULL, rh.reply_len, "alive: items");
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned n_inputs;
    if (n_inputs++ % FZ_ALIVE_EVERY == 0) {
        check_alive(&servers[0]);
        check_alive(&servers[1]);
    }
    struct fz_reader r = { data, size };
    run_session(&r);
    return 0;
}
