/*
 * The guest side of the stream transport (tcp:, vsock:; stream_proto.h).
 *
 * Blobs are this process's memory; the host keeps its own copy.  A command
 * is one write: the frame, its segment list, the command bytes and the
 * payloads staged for it, gathered from where they lie (sendmsg with an
 * iovec: the program's tensor data is not copied here).  Replies are read
 * through a buffered reader; a download's bytes go straight into the
 * program's memory.
 *
 * Posted commands (APIR_POSTED: uploads, clears) do not wait: their replies
 * are read before the next command that waits, or once MAX_POSTED are
 * outstanding - replies are a few bytes, so that many always fit the
 * socket's buffers and neither side can block the other.  A posted
 * command that failed is logged when its reply is read; ggml's calls for
 * them return nothing, so there is no one else to tell.
 */
#include "apir_log.h"
#include "apir_proto.h"
#include "cpus.h"
#include "fdpass.h"
#include "lanes.h"
#include "net.h"
#include "stream_proto.h"
#include "tls.h"
#include "transport.h"
#include "wait.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_POSTED     256u
#define CONNECT_MS     10000
/* The hello answer waits for a worker process to start its backend. */
#define HELLO_MS       30000
/* A payload split over lanes: at least this big (APIR_STREAM_LANE_MIN_KB).
 * Bulk data is (a model's weights, a large download).  A token's 513 KB of
 * logits (a 128256-word vocabulary) is not over plain TCP: on an H200 its
 * read-back over 3 lanes took 63-68 us against 101-107 on one connection,
 * yet 8B Q4_0 tg ran at 0.974-0.990 of the rate without lanes in five
 * interleaved A/Bs (a lane sleeps through the compute and is woken for its
 * part; spinning there instead did no better), so the token path stays on
 * one connection.  Over TLS each record is sealed and opened on one core a
 * side, which costs the logits ~300 us on one connection: there the wake-up
 * is worth it (8B tg +1.8 % and +2.9 %, the token's read-back 67-121 us
 * shorter; docs/MEASUREMENTS.md), and the smaller default lets them cross. */
#define LANE_MIN_DEFAULT_BYTES     (1024u * 1024u)
#define LANE_MIN_DEFAULT_TLS_BYTES (256u * 1024u)
/* Lanes asked for by default where the guest may use 4 CPUs or more: with
 * the first connection, a payload in 4 parts. */
#define LANES_DEFAULT  3u

struct staged {
    uint32_t res_id;
    uint64_t offset;
    void *ptr;
    size_t size;
};

struct stream_transport {
    struct apir_transport base;
    int fd;
    struct apir_tls *tls;      /* tls: endpoints; NULL for tcp:, vsock: */
    struct apir_tls_keys *tls_keys;  /* tls: its key or certificates, for its lanes' handshakes */
    char tls_name[96];         /* tls: the name the host's certificate must carry */
    bool profile;              /* APIR_PROFILE=1: the session's records counted */
    struct apir_net_reader rd;
    uint8_t cmd[APIR_MAX_COMMAND_SIZE];
    uint8_t reply[APIR_REPLY_BLOB_SIZE];
    struct apir_encoder enc;
    struct staged in[APIR_STREAM_MAX_SEGMENTS], out[APIR_STREAM_MAX_SEGMENTS];
    uint32_t n_in, n_out;
    uint32_t posted;           /* replies not read yet */
    uint32_t posted_head;      /* the oldest's slot in posted_ok */
    uint32_t posted_ok[MAX_POSTED];  /* what each one returns on success */
    uint32_t next_res_id;
    uint64_t spin_ns;          /* a reply's default spin (APIR_SPIN_US) */
    struct apir_net_addr addr; /* where it connected: its lanes connect there too */
    struct apir_lanes *lanes;  /* its lanes (lanes.h), NULL: none (yet) */
    uint32_t n_lanes;
    uint32_t lanes_granted;    /* granted, not joined yet (ask_lanes); 0 after join_lanes */
    uint8_t lane_ticket[APIR_STREAM_TICKET_BYTES];
    uint64_t lane_min;         /* payloads of this many bytes or more go over them */
    uint64_t lane_payloads, lane_bytes;  /* payloads split over them; the bytes that went on them */
};

static struct apir_encoder *stream_begin(struct apir_transport *t)
{
    struct stream_transport *s = (struct stream_transport *)t;
    apir_encoder_init(&s->enc, s->cmd, sizeof(s->cmd));
    apir_encode_reserve(&s->enc, APIR_CMD_HEADER_SIZE);
    return &s->enc;
}

static int stream_stage(struct stream_transport *s, bool in, uint32_t res_id, uint64_t offset, void *ptr, size_t size)
{
    struct staged *list = in ? s->in : s->out;
    uint32_t *n = in ? &s->n_in : &s->n_out;
    if (s->n_in + s->n_out >= APIR_STREAM_MAX_SEGMENTS) {
        APIR_ERROR("guest", "more than %u data ranges for one command", APIR_STREAM_MAX_SEGMENTS);
        return -1;
    }
    list[(*n)++] = (struct staged){ res_id, offset, ptr, size };
    return 0;
}

static int stream_stage_in(struct apir_transport *t, uint32_t res_id, uint64_t offset, const void *src, size_t size)
{
    return stream_stage((struct stream_transport *)t, true, res_id, offset, (void *)src, size);
}

static int stream_stage_out(struct apir_transport *t, uint32_t res_id, uint64_t offset, void *dst, size_t size)
{
    return stream_stage((struct stream_transport *)t, false, res_id, offset, dst, size);
}

static void stream_unstage(struct apir_transport *t)
{
    struct stream_transport *s = (struct stream_transport *)t;
    s->n_in = s->n_out = 0;
}

static void join_lanes(struct stream_transport *s);

static void broken(struct stream_transport *s, const char *what)
{
    if (!s->base.broken)
        APIR_ERROR("guest", "host at %s: %s: %s", s->base.endpoint, what,
                   errno == EPIPE ? "it closed the connection" : strerror(errno));
    s->base.broken = true;
}

/*
 * Reads one reply.  outs: where its out ranges go (NULL for a posted one,
 * which has none).  timeout_ms < 0: none (a graph may compute for long; a
 * dead host or link is noticed by the socket: apir_net_tune).
 */
static int read_reply(struct stream_transport *s, const struct staged *outs, uint32_t n_out, size_t first_here,
                      int timeout_ms, uint32_t *ret, uint32_t *reply_len)
{
    struct apir_stream_reply h;
    if (apir_net_read(&s->rd, &h, sizeof(h), timeout_ms, NULL) != 0) {
        broken(s, "no reply");
        return -1;
    }
    uint64_t want = 0;
    for (uint32_t i = 0; i < n_out; i++)
        want += outs[i].size;
    if (h.magic != APIR_STREAM_REPLY_MAGIC || h.reply_len > sizeof(s->reply) - 4 || h.n_out != n_out ||
        h.out_bytes != want) {
        errno = EPROTO;
        broken(s, "malformed reply");
        return -1;
    }
    if (apir_net_read(&s->rd, s->reply + 4, h.reply_len, timeout_ms, NULL) != 0) {
        broken(s, "reply cut short");
        return -1;
    }
    /* first_here: what of the first out range comes on this connection (the
     * rest on lanes); SIZE_MAX: all of it. */
    for (uint32_t i = 0; i < n_out; i++)
        if (apir_net_read(&s->rd, outs[i].ptr, i == 0 && first_here < outs[i].size ? first_here : outs[i].size,
                          timeout_ms, NULL) != 0) {
            broken(s, "download cut short");
            return -1;
        }
    *ret = h.ret;
    *reply_len = h.reply_len;
    return 0;
}

/* The replies of posted commands, read and checked. */
static int drain_posted(struct stream_transport *s, uint32_t keep)
{
    while (s->posted > keep) {
        uint32_t ret, len;
        if (read_reply(s, NULL, 0, SIZE_MAX, -1, &ret, &len) != 0)
            return -1;
        const uint32_t ok = s->posted_ok[s->posted_head];
        s->posted_head = (s->posted_head + 1) % MAX_POSTED;
        s->posted--;
        if (ret != ok)
            APIR_ERROR("guest", "host at %s: an earlier upload or clear failed there (code %u; the host's log says why)",
                       s->base.endpoint, ret >= APIR_FORWARD_BASE ? ret - APIR_FORWARD_BASE : ret);
    }
    return 0;
}

static int stream_submit(struct apir_transport *t, int32_t cmd_type, int32_t cmd_flags,
                         const struct apir_submit_opts *opts, uint32_t *ret, struct apir_decoder *reply)
{
    struct stream_transport *s = (struct stream_transport *)t;
    opts = apir_submit_opts_or_defaults(opts);
    const uint32_t n_in = s->n_in, n_out = s->n_out;
    s->n_in = s->n_out = 0;
    if (t->broken)
        return -1;
    if (s->enc.fatal) {
        APIR_ERROR("guest", "command does not fit the %u-byte command area", APIR_MAX_COMMAND_SIZE);
        return -1;
    }
    struct apir_encoder hdr_enc;
    apir_encoder_init(&hdr_enc, s->cmd, APIR_CMD_HEADER_SIZE);
    struct apir_cmd_header hdr = { cmd_type, cmd_flags, APIR_STREAM_REPLY_RES_ID };
    apir_encode_header(&hdr_enc, &hdr);

    struct {
        struct apir_stream_frame f;
        struct apir_stream_segment seg[APIR_STREAM_MAX_SEGMENTS];
    } head;
    const uint32_t cmd_len = (uint32_t)apir_encoder_used(&s->enc);
    head.f = (struct apir_stream_frame){ .magic = APIR_STREAM_FRAME_MAGIC, .cmd_len = cmd_len,
                                         .n_in = (uint16_t)n_in, .n_out = (uint16_t)n_out };
    struct iovec iov[2 + APIR_STREAM_MAX_SEGMENTS];
    int n_iov = 0;
    for (uint32_t i = 0; i < n_in; i++)
        head.seg[i] = (struct apir_stream_segment){ .res_id = s->in[i].res_id, .offset = s->in[i].offset,
                                                    .size = s->in[i].size };
    for (uint32_t i = 0; i < n_out; i++)
        head.seg[n_in + i] = (struct apir_stream_segment){ .res_id = s->out[i].res_id, .offset = s->out[i].offset,
                                                           .size = s->out[i].size };
    iov[n_iov++] = (struct iovec){ &head, sizeof(head.f) + (n_in + n_out) * sizeof(head.seg[0]) };
    iov[n_iov++] = (struct iovec){ s->cmd, cmd_len };
    for (uint32_t i = 0; i < n_in; i++)
        iov[n_iov++] = (struct iovec){ s->in[i].ptr, s->in[i].size };
    /* The reply's spin: the short one, or a graph's longer one (below). */
    const uint64_t spin_ns = opts->spin_ns ? opts->spin_ns : s->spin_ns;
    /* One large payload: split over the lanes (stream_proto.h), each lane
     * given its part before the frame leaves.  A lane spins only the short
     * spin, then sleeps in poll until its bytes come: a download may wait
     * for a long graph, through which a lane's spin would hold a core. */
    const bool lane_down_size = n_out == 1 && s->out[0].size >= s->lane_min;
    const bool lane_up_size = n_in == 1 && n_out == 0 && s->in[0].size >= s->lane_min;
    if (s->lanes_granted && (lane_down_size || lane_up_size))
        join_lanes(s);
    const bool lane_down = s->n_lanes && lane_down_size;
    const bool lane_up = s->n_lanes && lane_up_size;
    size_t first_here = SIZE_MAX;
    if (lane_down || lane_up) {
        const struct staged *one = lane_down ? &s->out[0] : &s->in[0];
        head.f.lanes = s->n_lanes;
        first_here = apir_lanes_post_parts(s->lanes, lane_up, one->ptr, one->size, s->n_lanes, s->spin_ns);
        s->lane_payloads++;
        s->lane_bytes += one->size - first_here;
        if (lane_up)
            iov[n_iov - 1].iov_len = first_here;
    }
    const int sent = apir_net_send(s->fd, s->tls, iov, n_iov, -1);
    /* An upload's lanes are done before the call returns: the program may
     * reuse its memory then. */
    if (sent == 0 && lane_up && apir_lanes_wait(s->lanes, spin_ns) != 0) {
        broken(s, "cannot send on a lane");
        return -1;
    }
    if (sent != 0) {
        if (lane_down || lane_up)
            apir_lanes_abandon(s->lanes, errno);
        broken(s, "cannot send");
        return -1;
    }
    if (opts->posted) {
        s->posted_ok[(s->posted_head + s->posted) % MAX_POSTED] =
            cmd_type == APIR_CMD_TYPE_FORWARD ? APIR_FORWARD_BASE + APIR_HANDLER_OK : 0;
        s->posted++;
        *ret = APIR_FORWARD_BASE + APIR_HANDLER_OK;
        apir_decoder_init(reply, s->reply + 4, 0);
        return drain_posted(s, MAX_POSTED - 1);
    }
    if (drain_posted(s, 0) != 0) {
        if (lane_down)
            apir_lanes_abandon(s->lanes, EPIPE);
        return -1;
    }
    int timeout_ms = opts->timeout_ns ? (int)(opts->timeout_ns / 1000000ull) : -1;
    /* A reply: the short spin, then sleep; a graph on a device with its own
     * memory the caller's longer spin (opts->spin_ns, as on shared memory: a
     * wake-up from sleep at each token costs more than the spin's idle core;
     * 1B F16 tg over loopback TCP on an H200 was 0.89 of native without).
     * The caller leaves it 0 for a CPU host, which over loopback computes on
     * the cores a long spin would take (tg32 0.94 of native with it, 0.99
     * without, 2 cores). */
    s->rd.spin_ns = spin_ns;
    uint32_t len;
    if (read_reply(s, s->out, n_out, first_here, timeout_ms, ret, &len) != 0) {
        if (lane_down)
            apir_lanes_abandon(s->lanes, EPIPE);
        return -1;
    }
    if (lane_down && apir_lanes_wait(s->lanes, spin_ns) != 0) {
        broken(s, "download cut short on a lane");
        return -1;
    }
    apir_decoder_init(reply, s->reply + 4, len);
    return 0;
}

static int stream_blob_create(struct apir_transport *t, size_t size, uint32_t *res_id, void **ptr)
{
    struct stream_transport *s = (struct stream_transport *)t;
    size = apir_page_round_up(size);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        APIR_ERROR("guest", "cannot allocate a %zu-byte blob: %s", size, strerror(errno));
        return -1;
    }
    uint32_t id = s->next_res_id++;
    struct apir_encoder *enc = stream_begin(t);
    apir_encode_u32(enc, id);
    apir_encode_u64(enc, size);
    uint32_t ret;
    struct apir_decoder dec;
    if (stream_submit(t, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, NULL, &ret, &dec) != 0 || ret != 0) {
        APIR_ERROR("guest", "host at %s refused a %zu-byte blob", t->endpoint, size);
        munmap(p, size);
        return -1;
    }
    *res_id = id;
    *ptr = p;
    return 0;
}

static void stream_blob_destroy(struct apir_transport *t, uint32_t res_id, void *ptr, size_t size)
{
    size = apir_page_round_up(size);
    struct apir_encoder *enc = stream_begin(t);
    apir_encode_u32(enc, res_id);
    uint32_t ret;
    struct apir_decoder dec;
    stream_submit(t, APIR_CMD_TYPE_SHM_BLOB_DESTROY, 0, &(struct apir_submit_opts){ .posted = true }, &ret, &dec);
    if (ptr)
        munmap(ptr, size);
}

/* A tls: session's read ring (APIR_TLS_READ_THREAD): half a token's
 * logits; the records are opened as it fills. */
#define TLS_READ_RING (256u * 1024u)

/* Its lanes: how many, what went over them; tls: what the session's
 * records cost (counted with APIR_PROFILE=1). */
static bool stream_describe_profile(struct apir_transport *t, char *out, size_t len)
{
    struct stream_transport *s = (struct stream_transport *)t;
    const bool tls = s->tls && s->profile;
    if (!s->n_lanes && !tls)
        return false;
    char lanes[128] = "", counts[512] = "";
    if (s->n_lanes)
        snprintf(lanes, sizeof(lanes), "lanes: %u, %llu payloads split over them, %.1f MiB on them%s", s->n_lanes,
                 (unsigned long long)s->lane_payloads, s->lane_bytes / 1048576.0, tls ? "; " : "");
    if (tls)
        apir_tls_describe_counts(s->tls, counts, sizeof(counts));
    snprintf(out, len, "%s%s%s", lanes, tls ? "tls: " : "", counts);
    return true;
}

static void stream_close(struct apir_transport *t)
{
    struct stream_transport *s = (struct stream_transport *)t;
    apir_lanes_free(s->lanes);
    explicit_bzero(s->lane_ticket, sizeof(s->lane_ticket));
    apir_tls_keys_free(s->tls_keys);
    apir_tls_free(s->tls);
    close(s->fd);
    apir_net_reader_free(&s->rd);
    free(s);
}

static const struct apir_transport_ops stream_ops = {
    .begin = stream_begin,
    .submit = stream_submit,
    .describe_profile = stream_describe_profile,
    .blob_create = stream_blob_create,
    .blob_destroy = stream_blob_destroy,
    .blob_share_file = NULL,  /* no file is shared across machines */
    .stage_in = stream_stage_in,
    .stage_out = stream_stage_out,
    .unstage = stream_unstage,
    .close = stream_close,
};

/* The token a guest presents: APIR_TOKEN_FILE's first line, else
 * APIR_TOKEN.  0 bytes: none.  -1: unreadable or too long. */
static int guest_token(uint8_t *out, char *err, size_t err_len)
{
    const char *file = getenv("APIR_TOKEN_FILE");
    char buf[APIR_STREAM_TOKEN_MAX + 2] = "";
    if (file && *file) {
        FILE *f = fopen(file, "re");
        if (!f || !fgets(buf, sizeof(buf), f)) {
            snprintf(err, err_len, "APIR_TOKEN_FILE %s: %s", file, f ? "empty" : strerror(errno));
            if (f)
                fclose(f);
            return -1;
        }
        fclose(f);
    } else if (getenv("APIR_TOKEN")) {
        snprintf(buf, sizeof(buf), "%s", getenv("APIR_TOKEN"));
    }
    buf[strcspn(buf, "\r\n")] = '\0';
    size_t n = strlen(buf);
    if (n > APIR_STREAM_TOKEN_MAX) {
        snprintf(err, err_len, "the token is longer than %u bytes", APIR_STREAM_TOKEN_MAX);
        return -1;
    }
    memcpy(out, buf, n);
    return (int)n;
}

static const char *env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A tls: guest's credentials: a key - APIR_TLS_PSK_FILE's first
 * IDENTITY:HEXKEY line, else APIR_TLS_PSK - or else certificates: the CAs
 * the host's certificate must chain to (APIR_TLS_CA_FILE; required: a host
 * not checked could be anyone) and the guest's own certificate and key
 * (APIR_TLS_CERT_FILE, APIR_TLS_KEY_FILE) for a host that asks for one. */
static struct apir_tls_keys *guest_tls_keys(char *err, size_t err_len)
{
    const char *file = env_set("APIR_TLS_PSK_FILE"), *line = env_set("APIR_TLS_PSK");
    const char *ca = env_set("APIR_TLS_CA_FILE"), *cert = env_set("APIR_TLS_CERT_FILE"),
               *key = env_set("APIR_TLS_KEY_FILE");
    if ((file || line) && (ca || cert || key))
        APIR_WARN("guest", "both a TLS key (APIR_TLS_PSK%s) and certificates (APIR_TLS_CA_FILE...) are set: using "
                  "the key", file ? "_FILE" : "");
    if (file)
        return apir_tls_keys_load(file, true, err, err_len);
    if (line)
        return apir_tls_keys_parse(line, err, err_len);
    if (!ca) {
        snprintf(err, err_len, "a tls: host needs a key - set APIR_TLS_PSK_FILE (a file whose first line is "
                 "IDENTITY:HEXKEY) or APIR_TLS_PSK - or certificates: APIR_TLS_CA_FILE (the CA of the host's "
                 "certificate) and, if the host asks for one, APIR_TLS_CERT_FILE and APIR_TLS_KEY_FILE");
        return NULL;
    }
    if (!cert != !key) {
        snprintf(err, err_len, "APIR_TLS_CERT_FILE and APIR_TLS_KEY_FILE go together: set both or neither");
        return NULL;
    }
    return apir_tls_keys_add_certs(NULL, cert, key, ca, err, err_len);
}

/* Lanes asked for: APIR_STREAM_LANES (0 to APIR_STREAM_MAX_LANES), else
 * LANES_DEFAULT where this process may use 4 CPUs or more (each lane's
 * copies want a core of their own), else none. */
static uint32_t lanes_wanted(void)
{
    const char *v = getenv("APIR_STREAM_LANES");
    if (v && *v) {
        char *end;
        unsigned long n = strtoul(v, &end, 10);
        if (*end || n > APIR_STREAM_MAX_LANES) {
            APIR_WARN("guest", "APIR_STREAM_LANES=%s: not 0 to %u; none used", v, APIR_STREAM_MAX_LANES);
            return 0;
        }
        return (uint32_t)n;
    }
    return apir_usable_cpus() >= 4 ? LANES_DEFAULT : 0;
}

/* APIR_STREAM_LANE_MIN_KB (4 KiB to 1 GiB), else the default for a plain
 * or a TLS session. */
static uint64_t lane_min_bytes(bool tls)
{
    const uint64_t dflt = tls ? LANE_MIN_DEFAULT_TLS_BYTES : LANE_MIN_DEFAULT_BYTES;
    const char *v = getenv("APIR_STREAM_LANE_MIN_KB");
    if (v && *v) {
        char *end;
        unsigned long kb = strtoul(v, &end, 10);
        if (!*end && kb >= 4 && kb <= (1ul << 20))
            return (uint64_t)kb * 1024u;
        APIR_WARN("guest", "APIR_STREAM_LANE_MIN_KB=%s: not 4 to %lu; %llu used", v, 1ul << 20,
                  (unsigned long long)(dflt / 1024u));
    }
    return dflt;
}

/* Asks the host for lanes (stream_proto.h) and keeps its grant and ticket;
 * they are joined when the first payload that would go over them comes
 * (join_lanes): a session that never moves one - `apir ping`, a small
 * model's tokens - opens no connection more.  Without lanes (an older
 * host, one that has none) the session goes on with its one connection. */
static void ask_lanes(struct stream_transport *s)
{
    const uint32_t want = lanes_wanted();
    if (!want)
        return;
    struct apir_encoder *enc = stream_begin(&s->base);
    apir_encode_u32(enc, want);
    uint32_t ret, granted;
    struct apir_decoder dec;
    if (stream_submit(&s->base, APIR_CMD_TYPE_STREAM_LANES, 0, NULL, &ret, &dec) != 0 || ret != 0) {
        APIR_DEBUG("guest", "host at %s has no lanes: one connection", s->base.endpoint);
        return;
    }
    granted = apir_decode_u32(&dec);
    apir_decode_bytes(&dec, s->lane_ticket, sizeof(s->lane_ticket));
    if (dec.fatal || !granted || granted > APIR_STREAM_MAX_LANES) {
        APIR_WARN("guest", "host at %s: a malformed answer about lanes: one connection", s->base.endpoint);
        return;
    }
    s->lanes_granted = granted;
    s->lane_min = lane_min_bytes(s->tls != NULL);
}

/* Joins the lanes granted, once: a connection each, its join answered.  A
 * lane refused or not reached ends the joining; the session uses those
 * that joined. */
static void join_lanes(struct stream_transport *s)
{
    const uint32_t granted = s->lanes_granted;
    s->lanes_granted = 0;  /* once */
    /* A tls: join's clear bytes carry half the ticket (which session); the
     * whole ticket goes inside the lane's own TLS session. */
    const uint32_t clear = s->tls ? APIR_STREAM_TICKET_BYTES / 2 : APIR_STREAM_TICKET_BYTES;
    struct apir_stream_hello join = { .magic = APIR_STREAM_JOIN_MAGIC, .version = APIR_STREAM_VERSION,
                                      .token_len = clear };
    memcpy(join.token, s->lane_ticket, clear);
    s->lanes = apir_lanes_new(-1);
    for (uint32_t k = 1; s->lanes && k <= granted; k++) {
        char err[256];
        const int fd = apir_net_connect(&s->addr, CONNECT_MS, err, sizeof(err));
        if (fd < 0) {
            APIR_WARN("guest", "lane %u: %s", k, err);
            break;
        }
        join.pid = (int32_t)k;
        struct iovec iov = { &join, sizeof(join) };
        struct apir_stream_hello_reply r = { 0 };
        struct apir_net_reader rd;
        struct apir_tls *tls = NULL;
        bool answered = false;
        char why[512] = "";
        bool sent = apir_net_write(fd, &iov, 1, HELLO_MS) == 0;
        if (sent && s->tls) {
            tls = apir_tls_client(fd, s->tls_keys, s->tls_name, HELLO_MS, why, sizeof(why));
            struct iovec whole = { s->lane_ticket, sizeof(s->lane_ticket) };
            sent = tls && apir_net_send(fd, tls, &whole, 1, HELLO_MS) == 0;
        }
        if (sent && apir_net_reader_init(&rd, fd, sizeof(r))) {
            rd.tls = tls;
            answered = apir_net_read(&rd, &r, sizeof(r), HELLO_MS, NULL) == 0;
            apir_net_reader_free(&rd);
        }
        if (!answered || r.magic != APIR_STREAM_MAGIC || r.status != 0) {
            r.message[sizeof(r.message) - 1] = '\0';
            APIR_WARN("guest", "host at %s did not take lane %u (%s)", s->base.endpoint, k,
                      answered ? r.message : why[0] ? why : strerror(errno));
            apir_tls_free(tls);
            close(fd);
            break;
        }
        if (!apir_lanes_add(s->lanes, fd, tls)) {
            APIR_WARN("guest", "lane %u: no thread (%s)", k, strerror(errno));
            break;
        }
    }
    explicit_bzero(join.token, sizeof(join.token));
    explicit_bzero(s->lane_ticket, sizeof(s->lane_ticket));
    s->n_lanes = apir_lanes_count(s->lanes);
    APIR_DEBUG("guest", "host at %s: %u lanes of %u granted", s->base.endpoint, s->n_lanes, granted);
}

struct apir_transport *apir_stream_connect(const char *endpoint, char *err, size_t err_len)
{
    struct apir_net_addr addr;
    if (!apir_net_parse(endpoint, &addr, err, err_len))
        return NULL;
    struct apir_stream_hello hello = { .magic = APIR_STREAM_MAGIC, .version = APIR_STREAM_VERSION,
                                       .pid = (int32_t)getpid() };
    int token_len = guest_token(hello.token, err, err_len);
    if (token_len < 0)
        return NULL;
    hello.token_len = (uint32_t)token_len;
    struct stream_transport *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->fd = apir_net_connect(&addr, CONNECT_MS, err, err_len);
    if (s->fd < 0) {
        free(s);
        return NULL;
    }
    if (!apir_net_reader_init(&s->rd, s->fd, 64 * 1024)) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    if (addr.tls) {
        char why[1024];
        /* The name the host's certificate must carry: the endpoint's, unless
         * it is reached by another (an address, a tunnel). */
        const char *name = env_set("APIR_TLS_SERVER_NAME") ? env_set("APIR_TLS_SERVER_NAME") : addr.host;
        struct apir_tls_keys *keys = guest_tls_keys(why, sizeof(why));
        s->tls = keys ? apir_tls_client(s->fd, keys, name, HELLO_MS, why, sizeof(why)) : NULL;
        /* Kept for the lanes' own handshakes (join_lanes). */
        s->tls_keys = keys;
        snprintf(s->tls_name, sizeof(s->tls_name), "%s", name);
        if (!s->tls) {
            snprintf(err, err_len, "%s: %s", endpoint, why);
            goto fail;
        }
        s->rd.tls = s->tls;
        /* A payload's socket reads on a thread of their own (tls.h), where
         * the guest may use 4 CPUs or more (the thread needs a core beside
         * the one opening records); APIR_TLS_READ_THREAD=1 always, =0 never. */
        const char *rt = getenv("APIR_TLS_READ_THREAD");
        const bool read_thread = rt && *rt ? strcmp(rt, "0") != 0 : apir_usable_cpus() >= 4;
        if (read_thread && !apir_tls_read_from_thread(s->tls, TLS_READ_RING))
            APIR_WARN("guest", "%s: no read thread (%s): TLS records read on the caller's thread", endpoint,
                      strerror(errno));
        const char *prof = getenv("APIR_PROFILE");
        s->profile = prof && !strcmp(prof, "1");
        if (s->profile)
            apir_tls_count_on(s->tls);
    }
    struct iovec iov = { &hello, sizeof(hello) };
    struct apir_stream_hello_reply r;
    /* Read the answer even if the send failed: a host that refuses answers
     * and closes. */
    (void)apir_net_send(s->fd, s->tls, &iov, 1, HELLO_MS);
    memset(&hello.token, 0, sizeof(hello.token));
    if (apir_net_read(&s->rd, &r, sizeof(r), HELLO_MS, NULL) != 0) {
        if (s->tls && errno == EPROTO && *apir_tls_alert(s->tls))
            snprintf(err, err_len, "host at %s refused: TLS alert \"%s\" (the host's log says why)", endpoint,
                     apir_tls_alert(s->tls));
        else
            snprintf(err, err_len, "no hello from the host at %s (%s)", endpoint,
                     errno == EPIPE ? "it closed the connection" : strerror(errno));
        goto fail;
    }
    if (r.magic != APIR_STREAM_MAGIC) {
        snprintf(err, err_len, "%s answered with something else than an apir stream hello (magic %08x): not an "
                 "apir-host stream endpoint?", endpoint, r.magic);
        goto fail;
    }
    if (r.status != 0) {
        r.message[sizeof(r.message) - 1] = '\0';
        snprintf(err, err_len, "host at %s refused: %s", endpoint, r.message);
        goto fail;
    }
    s->base.ops = &stream_ops;
    s->base.blobs_shared = false;
    snprintf(s->base.endpoint, sizeof(s->base.endpoint), "%s", endpoint);
    s->next_res_id = APIR_STREAM_FIRST_RES_ID;
    s->spin_ns = (uint64_t)apir_spin_us() * 1000;
    /* Lanes (a tls: session's each with a TLS session of its own). */
    s->addr = addr;
    s->lane_min = UINT64_MAX;
    ask_lanes(s);
    return &s->base;
fail:
    apir_tls_free(s->tls);
    apir_tls_keys_free(s->tls_keys);
    apir_net_reader_free(&s->rd);
    close(s->fd);
    free(s);
    return NULL;
}
