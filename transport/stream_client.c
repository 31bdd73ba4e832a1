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
static int read_reply(struct stream_transport *s, const struct staged *outs, uint32_t n_out, int timeout_ms,
                      uint32_t *ret, uint32_t *reply_len)
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
    for (uint32_t i = 0; i < n_out; i++)
        if (apir_net_read(&s->rd, outs[i].ptr, outs[i].size, timeout_ms, NULL) != 0) {
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
        if (read_reply(s, NULL, 0, -1, &ret, &len) != 0)
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
    if (apir_net_send(s->fd, s->tls, iov, n_iov, -1) != 0) {
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
    if (drain_posted(s, 0) != 0)
        return -1;
    int timeout_ms = opts->timeout_ns ? (int)(opts->timeout_ns / 1000000ull) : -1;
    /* A reply: the short spin, then sleep; a graph on a device with its own
     * memory the caller's longer spin (opts->spin_ns, as on shared memory: a
     * wake-up from sleep at each token costs more than the spin's idle core;
     * 1B F16 tg over loopback TCP on an H200 was 0.89 of native without).
     * The caller leaves it 0 for a CPU host, which over loopback computes on
     * the cores a long spin would take (tg32 0.94 of native with it, 0.99
     * without, 2 cores). */
    s->rd.spin_ns = opts->spin_ns ? opts->spin_ns : s->spin_ns;
    uint32_t len;
    if (read_reply(s, s->out, n_out, timeout_ms, ret, &len) != 0)
        return -1;
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

/* tls: what the session's records cost (counted with APIR_PROFILE=1). */
static bool stream_describe_profile(struct apir_transport *t, char *out, size_t len)
{
    struct stream_transport *s = (struct stream_transport *)t;
    if (!s->tls || !s->profile)
        return false;
    char counts[512];
    apir_tls_describe_counts(s->tls, counts, sizeof(counts));
    snprintf(out, len, "tls: %s", counts);
    return true;
}

static void stream_close(struct apir_transport *t)
{
    struct stream_transport *s = (struct stream_transport *)t;
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
        apir_tls_keys_free(keys);
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
    return &s->base;
fail:
    apir_tls_free(s->tls);
    apir_net_reader_free(&s->rd);
    close(s->fd);
    free(s);
    return NULL;
}
