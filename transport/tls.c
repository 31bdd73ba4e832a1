#include "tls.h"

#include "apir_log.h"
#include "reader.h"
#include "sender.h"
#include "wait.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

/* TLS 1.3 only, and only PSK with an ephemeral key exchange (forward
 * secrecy): nothing older or weaker is negotiable.  With certificates, the
 * certificate "key exchanges" too: in TLS 1.3 they only allow certificate
 * authentication (the exchange itself is always ephemeral). */
#define PRIORITY "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:+DHE-PSK"
#define PRIORITY_CERT PRIORITY ":+ECDHE-RSA:+ECDHE-ECDSA"
/*
 * The record cipher: guest and host offer the same order, so whichever
 * side's preference GnuTLS follows, it is this one.  NORMAL's order is AES-256-GCM, CHACHA20-POLY1305,
 * AES-128-GCM, and a TLS 1.3 external PSK is bound to SHA-256, which rules
 * out AES-256-GCM (a SHA-384 suite): with pre-shared keys NORMAL gave
 * ChaCha20, 0.4 GB/s a core on the machines here against AES-128-GCM's 4.8
 * (`gnutls-cli --benchmark-ciphers`) - loopback TLS moved 0.33 GB/s and
 * llama-bench tg ran at 0.68 of plain TCP on an H200.  So where the CPU has
 * AES and carry-less multiply instructions, AES-128-GCM first; elsewhere
 * ChaCha20 first (it is the faster one in software).
 */
#define CIPHERS_AES_FIRST ":-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305"
#define CIPHERS_CHACHA_FIRST ":-CIPHER-ALL:+CHACHA20-POLY1305:+AES-128-GCM:+AES-256-GCM"
#define MAX_KEYS 1024
#define MAX_IDENTITY 128
#define MAX_DN 256      /* a certificate subject in log lines; longer ones are cut */
#define MAX_NAME 256    /* the host name a guest checks the host's certificate for */
#define MIN_KEY_BYTES 16
#define MAX_KEY_BYTES 64

/*
 * GnuTLS is loaded when a key or certificate is first loaded (dlopen), not linked: the
 * guest library needs nothing beyond the C library unless a program uses a
 * tls: endpoint, and a host worker loads it before its sandbox forbids
 * opening files.  The entry points used, by name: */
#define GNUTLS_FUNCTIONS(X)                                                                                   \
    X(int, gnutls_init, (gnutls_session_t *, unsigned))                                                        \
    X(void, gnutls_deinit, (gnutls_session_t))                                                                 \
    X(int, gnutls_bye, (gnutls_session_t, gnutls_close_request_t))                                            \
    X(int, gnutls_handshake, (gnutls_session_t))                                                               \
    X(int, gnutls_error_is_fatal, (int))                                                                       \
    X(const char *, gnutls_strerror, (int))                                                                    \
    X(gnutls_alert_description_t, gnutls_alert_get, (gnutls_session_t))                                       \
    X(const char *, gnutls_alert_get_name, (gnutls_alert_description_t))                                       \
    X(int, gnutls_priority_set_direct, (gnutls_session_t, const char *, const char **))                        \
    X(int, gnutls_credentials_set, (gnutls_session_t, gnutls_credentials_type_t, void *))                      \
    X(int, gnutls_psk_allocate_client_credentials, (gnutls_psk_client_credentials_t *))                        \
    X(void, gnutls_psk_free_client_credentials, (gnutls_psk_client_credentials_t))                             \
    X(int, gnutls_psk_set_client_credentials,                                                                  \
      (gnutls_psk_client_credentials_t, const char *, const gnutls_datum_t *, gnutls_psk_key_flags))           \
    X(int, gnutls_psk_allocate_server_credentials, (gnutls_psk_server_credentials_t *))                        \
    X(void, gnutls_psk_free_server_credentials, (gnutls_psk_server_credentials_t))                             \
    X(void, gnutls_psk_set_server_credentials_function,                                                        \
      (gnutls_psk_server_credentials_t, gnutls_psk_server_credentials_function *))                             \
    X(const char *, gnutls_psk_server_get_username, (gnutls_session_t))                                        \
    X(void, gnutls_session_set_ptr, (gnutls_session_t, void *))                                                \
    X(void *, gnutls_session_get_ptr, (gnutls_session_t))                                                      \
    X(void, gnutls_transport_set_ptr, (gnutls_session_t, gnutls_transport_ptr_t))                              \
    X(void, gnutls_transport_set_vec_push_function, (gnutls_session_t, gnutls_vec_push_func))                  \
    X(void, gnutls_transport_set_pull_function, (gnutls_session_t, gnutls_pull_func))                          \
    X(void, gnutls_transport_set_pull_timeout_function, (gnutls_session_t, gnutls_pull_timeout_func))          \
    X(void, gnutls_transport_set_errno, (gnutls_session_t, int))                                               \
    X(ssize_t, gnutls_record_recv_packet, (gnutls_session_t, gnutls_packet_t *))                               \
    X(void, gnutls_packet_get, (gnutls_packet_t, gnutls_datum_t *, unsigned char *))                           \
    X(void, gnutls_packet_deinit, (gnutls_packet_t))                                                           \
    X(ssize_t, gnutls_record_send, (gnutls_session_t, const void *, size_t))                                   \
    X(size_t, gnutls_record_check_pending, (gnutls_session_t))                                                 \
    X(int, gnutls_record_get_direction, (gnutls_session_t))                                                    \
    X(gnutls_credentials_type_t, gnutls_auth_get_type, (gnutls_session_t))                                    \
    X(int, gnutls_certificate_allocate_credentials, (gnutls_certificate_credentials_t *))                      \
    X(void, gnutls_certificate_free_credentials, (gnutls_certificate_credentials_t))                           \
    X(int, gnutls_certificate_set_x509_key_file,                                                               \
      (gnutls_certificate_credentials_t, const char *, const char *, gnutls_x509_crt_fmt_t))                   \
    X(int, gnutls_certificate_set_x509_trust_file,                                                             \
      (gnutls_certificate_credentials_t, const char *, gnutls_x509_crt_fmt_t))                                 \
    X(void, gnutls_certificate_server_set_request, (gnutls_session_t, gnutls_certificate_request_t))           \
    X(void, gnutls_certificate_send_x509_rdn_sequence, (gnutls_session_t, int))                                \
    X(void, gnutls_session_set_verify_cert2, (gnutls_session_t, gnutls_typed_vdata_st *, unsigned, unsigned))  \
    X(unsigned, gnutls_session_get_verify_cert_status, (gnutls_session_t))                                     \
    X(const gnutls_datum_t *, gnutls_certificate_get_peers, (gnutls_session_t, unsigned *))                    \
    X(int, gnutls_x509_crt_init, (gnutls_x509_crt_t *))                                                        \
    X(void, gnutls_x509_crt_deinit, (gnutls_x509_crt_t))                                                       \
    X(int, gnutls_x509_crt_import, (gnutls_x509_crt_t, const gnutls_datum_t *, gnutls_x509_crt_fmt_t))         \
    X(int, gnutls_x509_crt_get_dn3, (gnutls_x509_crt_t, gnutls_datum_t *, unsigned))                          \
    X(int, gnutls_alert_send_appropriate, (gnutls_session_t, int))                                             \
    X(gnutls_cipher_algorithm_t, gnutls_cipher_get, (gnutls_session_t))                                       \
    X(const char *, gnutls_cipher_get_name, (gnutls_cipher_algorithm_t))

static struct gnutls_api {
    pthread_once_t once;
    bool ok;
    char why[160];
#define X(ret, name, args) ret(*name) args;
    GNUTLS_FUNCTIONS(X)
#undef X
    gnutls_alloc_function *malloc_fn;  /* gnutls_malloc: what a key handed to GnuTLS must come from */
    gnutls_free_function *free_fn;     /* gnutls_free: what frees what GnuTLS hands out */
} gt = { .once = PTHREAD_ONCE_INIT };

static void gnutls_load(void)
{
    void *lib = dlopen("libgnutls.so.30", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(gt.why, sizeof(gt.why), "TLS needs GnuTLS (libgnutls.so.30; Debian package libgnutls30): %s",
                 dlerror());
        return;
    }
    bool ok = true;
#define X(ret, name, args) ok = ok && (*(void **)&gt.name = dlsym(lib, #name)) != NULL;
    GNUTLS_FUNCTIONS(X)
#undef X
    gt.malloc_fn = dlsym(lib, "gnutls_malloc");
    gt.free_fn = dlsym(lib, "gnutls_free");
    if (!ok || !gt.malloc_fn || !gt.free_fn) {
        snprintf(gt.why, sizeof(gt.why), "libgnutls.so.30 lacks an entry point apir uses (GnuTLS 3.6 or newer needed)");
        return;
    }
    gt.ok = true;
}

static bool gnutls_ready(char *err, size_t err_len)
{
    pthread_once(&gt.once, gnutls_load);
    if (!gt.ok)
        snprintf(err, err_len, "%s", gt.why);
    return gt.ok;
}

struct tls_key {
    char identity[MAX_IDENTITY];
    uint8_t key[MAX_KEY_BYTES];
    unsigned key_len;
};

struct apir_tls_keys {
    struct tls_key *keys;     /* pre-shared keys; n may be 0 with certificates */
    size_t n;
    /* Certificates: this side's chain and key (own_cert) and the CAs the
     * peer's certificate must chain to (peer_ca); NULL: keys only.  Shared
     * by every session of the set (read-only once loaded). */
    gnutls_certificate_credentials_t cert;
    bool own_cert, peer_ca;
    char ca_file[256];         /* for messages: where the trusted CAs came from */
};

struct apir_tls {
    gnutls_session_t session;
    gnutls_psk_client_credentials_t client_cred;
    gnutls_psk_server_credentials_t server_cred;
    const struct apir_tls_keys *keys;   /* the server's, while handshaking */
    int fd;
    char identity[APIR_LOG_ESCAPED_SIZE(MAX_IDENTITY)];  /* the one a guest named, escaped for log lines */
    int identity_known;       /* server: -1 none asked, 0 unknown, 1 one of ours */
    /* What the peer's certificate is checked for (GnuTLS keeps pointers to
     * them for the session's life): the host name and the key purpose. */
    gnutls_typed_vdata_st verify[2];
    char server_name[MAX_NAME];
    char peer[MAX_DN + 32];   /* who the peer proved to be, for log lines */
    char alert[96];           /* a fatal alert the peer sent after the handshake, in words; "" if none */
    /* Bytes read from the socket ahead of what GnuTLS asked for (pull): it
     * asks for a record's 5-byte header, then its body, a recv each - two
     * syscalls per 16 KiB record, 64 for a token's 513 KiB of logits.  One
     * recv takes what the socket holds (up to four records); pull and
     * pull_timeout serve from here first, and
     * apir_tls_pending counts it (poll does not see it). */
    uint8_t *rbuf;
    size_t rhead, rtail;
    /* The record being read (apir_tls_recv): GnuTLS's decrypted packet,
     * copied from in place into the caller's buffer (gnutls_record_recv
     * would copy it once more), and how much of it was taken. */
    gnutls_packet_t packet;
    gnutls_datum_t packet_data;
    size_t packet_off;
    /* apir_tls_send_from_thread: the sealed records go into its ring and
     * its thread sends them, while this one seals the next (sender.h). */
    struct apir_sender *sender;
    /* apir_tls_read_from_thread: while a payload is read (apir_tls_bulk),
     * its thread reads the socket into a ring and pull takes from there. */
    struct apir_reader *reader;
    bool counting;                /* apir_tls_count_on */
    struct apir_tls_counts counts;
};

#define READ_AHEAD (64u * 1024u)

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "IDENTITY:HEXKEY" into k; false with err. */
static bool parse_line(const char *line, struct tls_key *k, char *err, size_t err_len)
{
    const char *colon = strrchr(line, ':');
    size_t id_len = colon ? (size_t)(colon - line) : 0;
    if (!colon || id_len == 0 || id_len >= MAX_IDENTITY) {
        snprintf(err, err_len, "not IDENTITY:HEXKEY (an identity of 1 to %d bytes)", MAX_IDENTITY - 1);
        return false;
    }
    for (size_t i = 0; i < id_len; i++)
        if (!isprint((unsigned char)line[i])) {
            snprintf(err, err_len, "the identity has unprintable bytes");
            return false;
        }
    const char *hex = colon + 1;
    size_t hex_len = strcspn(hex, " \t\r\n");
    if (hex_len % 2 || hex_len / 2 < MIN_KEY_BYTES || hex_len / 2 > MAX_KEY_BYTES) {
        snprintf(err, err_len, "the key must be %d to %d bytes in hex (it has %zu hex digits)", MIN_KEY_BYTES,
                 MAX_KEY_BYTES, hex_len);
        return false;
    }
    for (size_t i = 0; i < hex_len / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            snprintf(err, err_len, "the key is not hex");
            return false;
        }
        k->key[i] = (uint8_t)(hi * 16 + lo);
    }
    k->key_len = (unsigned)(hex_len / 2);
    memcpy(k->identity, line, id_len);
    k->identity[id_len] = '\0';
    return true;
}

void apir_tls_keys_free(struct apir_tls_keys *k)
{
    if (!k)
        return;
    if (k->keys)
        explicit_bzero(k->keys, k->n * sizeof(*k->keys));
    free(k->keys);
    if (k->cert)
        gt.gnutls_certificate_free_credentials(k->cert);
    free(k);
}

size_t apir_tls_keys_count(const struct apir_tls_keys *k)
{
    return k ? k->n : 0;
}

bool apir_tls_keys_has_cert(const struct apir_tls_keys *k)
{
    return k && k->own_cert;
}

bool apir_tls_keys_has_ca(const struct apir_tls_keys *k)
{
    return k && k->peer_ca;
}

struct apir_tls_keys *apir_tls_keys_add_certs(struct apir_tls_keys *k, const char *cert_file, const char *key_file,
                                              const char *ca_file, char *err, size_t err_len)
{
    const bool cert = cert_file && *cert_file, key = key_file && *key_file, ca = ca_file && *ca_file;
    if (cert != key || (!cert && !ca)) {
        snprintf(err, err_len, "TLS certificates: %s", cert != key ? "a certificate and its key go together (give both)"
                                                                  : "no certificate and no CA file named");
        apir_tls_keys_free(k);
        return NULL;
    }
    if (!gnutls_ready(err, err_len)) {
        apir_tls_keys_free(k);
        return NULL;
    }
    if (!k && !(k = calloc(1, sizeof(*k)))) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    int rc = k->cert ? 0 : gt.gnutls_certificate_allocate_credentials(&k->cert);
    if (rc == 0 && cert) {
        /* The chain (the certificate first, then any intermediates) and the
         * key; GnuTLS checks that they match. */
        rc = gt.gnutls_certificate_set_x509_key_file(k->cert, cert_file, key_file, GNUTLS_X509_FMT_PEM);
        if (rc != 0)
            snprintf(err, err_len, "TLS certificate %s with key %s: %s", cert_file, key_file, gt.gnutls_strerror(rc));
        else
            k->own_cert = true;
    } else if (rc != 0) {
        snprintf(err, err_len, "TLS certificates: %s", gt.gnutls_strerror(rc));
    }
    if (rc == 0 && ca) {
        rc = gt.gnutls_certificate_set_x509_trust_file(k->cert, ca_file, GNUTLS_X509_FMT_PEM);
        if (rc <= 0)
            snprintf(err, err_len, "TLS CA file %s: %s", ca_file,
                     rc == 0 ? "no PEM certificate in it" : gt.gnutls_strerror(rc));
        rc = rc > 0 ? 0 : -1;
        if (rc == 0) {
            k->peer_ca = true;
            snprintf(k->ca_file, sizeof(k->ca_file), "%s", ca_file);
        }
    }
    if (rc != 0) {
        apir_tls_keys_free(k);
        return NULL;
    }
    return k;
}

struct apir_tls_keys *apir_tls_keys_parse(const char *line, char *err, size_t err_len)
{
    if (!gnutls_ready(err, err_len))
        return NULL;
    struct apir_tls_keys *k = calloc(1, sizeof(*k));
    if (k)
        k->keys = calloc(1, sizeof(*k->keys));
    if (!k || !k->keys) {
        free(k);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    char why[120];
    if (!parse_line(line, &k->keys[0], why, sizeof(why))) {
        snprintf(err, err_len, "TLS key: %s", why);
        apir_tls_keys_free(k);
        return NULL;
    }
    k->n = 1;
    return k;
}

struct apir_tls_keys *apir_tls_keys_load(const char *path, bool first_only, char *err, size_t err_len)
{
    if (!gnutls_ready(err, err_len))
        return NULL;
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, err_len, "TLS key file %s: %s", path, strerror(errno));
        return NULL;
    }
    struct apir_tls_keys *k = calloc(1, sizeof(*k));
    if (k)
        k->keys = calloc(first_only ? 1 : MAX_KEYS, sizeof(*k->keys));
    if (!k || !k->keys) {
        free(k);
        fclose(f);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    char line[512], why[120];
    unsigned line_no = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof(line), f)) {
        line_no++;
        const char *p = line + strspn(line, " \t");
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0')
            continue;
        if (k->n == (first_only ? 1u : MAX_KEYS)) {
            if (first_only)
                break;
            snprintf(err, err_len, "TLS key file %s: more than %d keys", path, MAX_KEYS);
            ok = false;
        } else if (!parse_line(p, &k->keys[k->n], why, sizeof(why))) {
            snprintf(err, err_len, "TLS key file %s, line %u: %s", path, line_no, why);
            ok = false;
        } else {
            k->n++;
        }
    }
    explicit_bzero(line, sizeof(line));
    fclose(f);
    if (ok && k->n == 0) {
        snprintf(err, err_len, "TLS key file %s holds no IDENTITY:HEXKEY line", path);
        ok = false;
    }
    if (!ok) {
        apir_tls_keys_free(k);
        return NULL;
    }
    return k;
}

/* ---- the session over a non-blocking socket ------------------------------ */

static bool cpu_has_aes_gcm(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* The detection runs from a constructor that a library loaded later
     * (dlopen) may not have had run for it yet: run it. */
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
#elif defined(__aarch64__)
    const unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_AES) && (hw & HWCAP_PMULL);
#else
    return false;
#endif
}

static const char *priority_of(bool certs)
{
    if (cpu_has_aes_gcm())
        return certs ? PRIORITY_CERT CIPHERS_AES_FIRST : PRIORITY CIPHERS_AES_FIRST;
    return certs ? PRIORITY_CERT CIPHERS_CHACHA_FIRST : PRIORITY CIPHERS_CHACHA_FIRST;
}

/* Through the sender's ring where the session has one, else piece by piece
 * with send() (apir_send_now: a host worker may not call sendmsg).  What
 * went, if any did; else -1.  giovec_t is struct iovec where there is one
 * (GnuTLS's header). */
static ssize_t push_out(struct apir_tls *t, const giovec_t *iov, int n)
{
    const struct iovec *v = (const struct iovec *)iov;
    ssize_t r = t->sender ? apir_sender_write(t->sender, v, n) : apir_send_now(t->fd, v, n);
    if (r < 0)
        gt.gnutls_transport_set_errno(t->session, errno);
    return r;
}

/* GnuTLS's push: push_out, timed when counting. */
static ssize_t push_vec(gnutls_transport_ptr_t ptr, const giovec_t *iov, int n)
{
    struct apir_tls *t = ptr;
    if (!t->counting)
        return push_out(t, iov, n);
    const uint64_t t0 = apir_now_ns();
    ssize_t r = push_out(t, iov, n);
    t->counts.writes++;
    t->counts.write_ns += apir_now_ns() - t0;
    return r;
}

/* Refills the empty read-ahead: from the reader's ring while it holds
 * bytes or reads for us (apir_tls_read_from_thread), else from the socket. */
static ssize_t refill(struct apir_tls *t)
{
    if (t->reader && (apir_reader_armed(t->reader) || apir_reader_pending(t->reader))) {
        const ssize_t r = apir_reader_take(t->reader, t->rbuf, READ_AHEAD);
        if (t->counting)
            t->counts.thread_bytes += r > 0 ? (uint64_t)r : 0;
        return r;
    }
    return recv(t->fd, t->rbuf, READ_AHEAD, MSG_DONTWAIT);
}

static ssize_t pull(gnutls_transport_ptr_t ptr, void *buf, size_t len)
{
    struct apir_tls *t = ptr;
    if (t->rtail == t->rhead) {
        /* Empty: refilled with what the socket (or the read thread's ring)
         * has; EAGAIN only when there is nothing either: a caller then waits
         * for the socket, or within a payload for the ring (apir_tls_bulk_wait). */
        t->rhead = t->rtail = 0;
        const uint64_t t0 = t->counting ? apir_now_ns() : 0;
        ssize_t r = refill(t);
        if (t->counting) {
            t->counts.reads++;
            t->counts.read_ns += apir_now_ns() - t0;
            t->counts.read_bytes += r > 0 ? (uint64_t)r : 0;
        }
        if (r <= 0) {
            if (r < 0)
                gt.gnutls_transport_set_errno(t->session, errno);
            return r;
        }
        t->rtail = (size_t)r;
    }
    const size_t n = t->rtail - t->rhead < len ? t->rtail - t->rhead : len;
    memcpy(buf, t->rbuf + t->rhead, n);
    t->rhead += n;
    return (ssize_t)n;
}

/* Whether bytes can be pulled within ms: the read-ahead first, then the
 * socket (GnuTLS's own would poll its transport pointer as an fd). */
static int pull_timeout(gnutls_transport_ptr_t ptr, unsigned int ms)
{
    struct apir_tls *t = ptr;
    if (t->rtail > t->rhead || (t->reader && apir_reader_pending(t->reader)))
        return 1;
    if (t->reader && apir_reader_armed(t->reader)) {
        const uint64_t deadline = ms == GNUTLS_INDEFINITE_TIMEOUT ? 0 : apir_now_ns() + (uint64_t)ms * 1000000ull + 1;
        return apir_reader_wait(t->reader, deadline) ? 1 : 0;
    }
    struct pollfd p = { .fd = t->fd, .events = POLLIN };
    int rc = poll(&p, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int)ms);
    if (rc < 0)
        gt.gnutls_transport_set_errno(t->session, errno);
    return rc;
}

/* The server's key for the identity a guest names; unknown identities fail
 * the handshake. */
static int server_key(gnutls_session_t session, const char *identity, gnutls_datum_t *key)
{
    struct apir_tls *t = gt.gnutls_session_get_ptr(session);
    if (t) {
        /* The guest's bytes, any it likes (issue 24: a forged log line). */
        apir_log_escape(identity, MAX_IDENTITY, t->identity, sizeof(t->identity));
        t->identity_known = 0;
    }
    for (size_t i = 0; t && t->keys && i < t->keys->n; i++) {
        const struct tls_key *k = &t->keys->keys[i];
        if (strcmp(k->identity, identity) != 0)
            continue;
        key->data = (*gt.malloc_fn)(k->key_len);
        if (!key->data)
            return -1;
        memcpy(key->data, k->key, k->key_len);
        key->size = k->key_len;
        t->identity_known = 1;
        return 0;
    }
    return -1;
}

static bool wait_io(struct apir_tls *t, int timeout_ms)
{
    struct pollfd p = { .fd = t->fd, .events = gt.gnutls_record_get_direction(t->session) ? POLLOUT : POLLIN };
    int rc;
    do
        rc = poll(&p, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    return rc > 0;
}

void apir_tls_free(struct apir_tls *t)
{
    if (!t)
        return;
    if (t->packet)
        gt.gnutls_packet_deinit(t->packet);
    if (t->session) {
        /* A close_notify, without waiting for the peer's. */
        gt.gnutls_bye(t->session, GNUTLS_SHUT_WR);
    }
    /* What is queued goes (briefly waited for) before the session ends. */
    apir_sender_stop(t->sender);
    apir_reader_stop(t->reader);
    if (t->session)
        gt.gnutls_deinit(t->session);
    if (t->client_cred)
        gt.gnutls_psk_free_client_credentials(t->client_cred);
    if (t->server_cred)
        gt.gnutls_psk_free_server_credentials(t->server_cred);
    free(t->rbuf);
    free(t);
}

/* The subject of the peer's certificate (the first of its chain) into
 * out, unprintable bytes replaced: a certificate's name is the peer's to
 * choose.  False if it sent none. */
static bool peer_subject(struct apir_tls *t, char *out, size_t len)
{
    unsigned n = 0;
    const gnutls_datum_t *chain = gt.gnutls_certificate_get_peers(t->session, &n);
    if (!chain || n == 0)
        return false;
    gnutls_x509_crt_t crt;
    gnutls_datum_t dn = { NULL, 0 };
    if (gt.gnutls_x509_crt_init(&crt) != 0)
        return false;
    /* RFC 4514's order (CN=...,O=...), as certtool -i shows it. */
    /* The subject is the guest's to write: escaped for log lines. */
    if (gt.gnutls_x509_crt_import(crt, &chain[0], GNUTLS_X509_FMT_DER) == 0 && gt.gnutls_x509_crt_get_dn3(crt, &dn, 0) == 0)
        apir_log_escape(dn.data ? (const char *)dn.data : "", dn.size, out, len);
    else
        snprintf(out, len, "(unreadable)");
    if (dn.data)
        (*gt.free_fn)(dn.data);
    gt.gnutls_x509_crt_deinit(crt);
    return true;
}

/* Why a certificate failed its check (GnuTLS's status bits), in words. */
static const char *cert_problem(unsigned status)
{
    static const struct { unsigned bit; const char *why; } problems[] = {
        { GNUTLS_CERT_SIGNER_NOT_FOUND, "not signed by a trusted CA" },
        { GNUTLS_CERT_SIGNER_NOT_CA, "signed by a certificate that is not a CA" },
        { GNUTLS_CERT_UNEXPECTED_OWNER, "issued for another name" },
        { GNUTLS_CERT_EXPIRED, "expired" },
        { GNUTLS_CERT_NOT_ACTIVATED, "not valid yet" },
        { GNUTLS_CERT_REVOKED, "revoked" },
        { GNUTLS_CERT_PURPOSE_MISMATCH, "not for this use (its key purpose)" },
        { GNUTLS_CERT_INSECURE_ALGORITHM, "signed with an insecure algorithm" },
        { GNUTLS_CERT_SIGNATURE_FAILURE, "its signature does not verify" },
        { GNUTLS_CERT_SIGNER_CONSTRAINTS_FAILURE, "outside its CA's constraints" },
    };
    for (size_t i = 0; i < sizeof(problems) / sizeof(problems[0]); i++)
        if (status & problems[i].bit)
            return problems[i].why;
    return "refused by the certificate check";
}

/* A failed handshake's cause, as far as this side can tell, into err. */
static void handshake_failure(struct apir_tls *t, bool server, int rc, char *err, size_t err_len)
{
    /* The alert the peer sent, if any, says more than the error code. */
    const char *alert = rc == GNUTLS_E_FATAL_ALERT_RECEIVED ? gt.gnutls_alert_get_name(gt.gnutls_alert_get(t->session))
                                                            : NULL;
    char who[1024] = "", subject[MAX_DN] = "?";
    const bool certs = t->keys && !t->keys->n;  /* a guest uses certificates only without a key */
    if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        const unsigned status = gt.gnutls_session_get_verify_cert_status(t->session);
        peer_subject(t, subject, sizeof(subject));
        if (!server && (status & GNUTLS_CERT_UNEXPECTED_OWNER))
            snprintf(who, sizeof(who), " - the host's certificate \"%s\" is not for \"%s\" (APIR_TLS_SERVER_NAME "
                     "names the host as its certificate does)", subject, t->server_name);
        else
            snprintf(who, sizeof(who), " - the %s's certificate \"%s\": %s%s%s", server ? "guest" : "host", subject,
                     cert_problem(status), status & GNUTLS_CERT_SIGNER_NOT_FOUND ? " in " : "",
                     status & GNUTLS_CERT_SIGNER_NOT_FOUND ? t->keys->ca_file : "");
    } else if (server && (rc == GNUTLS_E_NO_CERTIFICATE_FOUND || rc == GNUTLS_E_CERTIFICATE_REQUIRED)) {
        snprintf(who, sizeof(who), " - the guest presented no certificate (APIR_TLS_CERT_FILE, APIR_TLS_KEY_FILE)");
    } else if (server && t->identity_known == 0) {
        snprintf(who, sizeof(who), " - key identity \"%s\" is not one of the host's", t->identity);
    } else if (server && t->identity_known == 1) {
        snprintf(who, sizeof(who), " - identity \"%s\" with a wrong key?", t->identity);
    } else if (server && alert) {
        snprintf(who, sizeof(who), " - the guest refused%s (its error says why)",
                 t->keys->own_cert ? " (the host's certificate?)" : "");
    } else if (!server) {
        snprintf(who, sizeof(who), " (%s? the host's log says why it refused)",
                 certs ? "a certificate the host does not accept, or a host without certificates"
                       : "a key the host does not have");
    }
    snprintf(err, err_len, "TLS handshake failed: %s%s%s%s%s", gt.gnutls_strerror(rc), alert ? " (" : "",
             alert ? alert : "", alert ? ")" : "", who);
}

/* Who the peer proved to be, into t->peer, for log lines. */
static void name_peer(struct apir_tls *t, bool server)
{
    char subject[MAX_DN], id_text[APIR_LOG_ESCAPED_SIZE(MAX_IDENTITY)];
    if (gt.gnutls_auth_get_type(t->session) == GNUTLS_CRD_PSK) {
        /* One of the host's identities (printable, checked at load); escaped all the same. */
        const char *id = server ? gt.gnutls_psk_server_get_username(t->session) : t->keys->keys[0].identity;
        snprintf(t->peer, sizeof(t->peer), "key \"%s\"", apir_log_escape(id ? id : "?", MAX_IDENTITY, id_text, sizeof(id_text)));
    } else if (peer_subject(t, subject, sizeof(subject))) {
        snprintf(t->peer, sizeof(t->peer), "certificate \"%s\"", subject);
    } else {
        snprintf(t->peer, sizeof(t->peer), "no %s certificate", server ? "client" : "host");
    }
}

/* Certificate credentials on a session: the host asks for (and checks) a
 * guest's certificate when it has CAs for them; a guest checks the host's
 * against its CAs and the host's name. */
static int use_certs(struct apir_tls *t, bool server, const struct apir_tls_keys *keys)
{
    int rc = gt.gnutls_credentials_set(t->session, GNUTLS_CRD_CERTIFICATE, keys->cert);
    if (rc != 0 || (server && !keys->peer_ca))
        return rc;
    t->verify[0] = (gnutls_typed_vdata_st){ .type = GNUTLS_DT_KEY_PURPOSE_OID,
                                            .data = (void *)(server ? GNUTLS_KP_TLS_WWW_CLIENT : GNUTLS_KP_TLS_WWW_SERVER) };
    t->verify[1] = (gnutls_typed_vdata_st){ .type = GNUTLS_DT_DNS_HOSTNAME, .data = (void *)t->server_name };
    if (server) {
        gt.gnutls_certificate_server_set_request(t->session, GNUTLS_CERT_REQUIRE);
        /* No list of the CAs it trusts: a guest then sends its certificate
         * even from another CA, and the host's log says what was wrong
         * with it (instead of "no certificate"). */
        gt.gnutls_certificate_send_x509_rdn_sequence(t->session, 1);
    }
    gt.gnutls_session_set_verify_cert2(t->session, t->verify, server ? 1 : 2, 0);
    return 0;
}

static struct apir_tls *handshake(int fd, bool server, const struct apir_tls_keys *keys, const char *server_name,
                                  int timeout_ms, char *err, size_t err_len)
{
    if (!gnutls_ready(err, err_len))
        return NULL;
    struct apir_tls *t = calloc(1, sizeof(*t));
    if (!t || !(t->rbuf = malloc(READ_AHEAD))) {
        free(t);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    t->fd = fd;
    t->identity_known = -1;
    t->keys = keys;
    snprintf(t->server_name, sizeof(t->server_name), "%s", server_name ? server_name : "");
    /* A host offers each way it has (a guest may use either); a guest one:
     * its key if it has one, else certificates. */
    const bool psk = keys->n > 0, certs = keys->cert && (server || !psk);
    int rc = gt.gnutls_init(&t->session, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NONBLOCK);
    if (rc == 0 && server && psk) {
        rc = gt.gnutls_psk_allocate_server_credentials(&t->server_cred);
        if (rc == 0) {
            gt.gnutls_psk_set_server_credentials_function(t->server_cred, server_key);
            rc = gt.gnutls_credentials_set(t->session, GNUTLS_CRD_PSK, t->server_cred);
        }
    } else if (rc == 0 && psk) {
        rc = gt.gnutls_psk_allocate_client_credentials(&t->client_cred);
        const gnutls_datum_t key = { (unsigned char *)keys->keys[0].key, keys->keys[0].key_len };
        if (rc == 0)
            rc = gt.gnutls_psk_set_client_credentials(t->client_cred, keys->keys[0].identity, &key, GNUTLS_PSK_KEY_RAW);
        if (rc == 0)
            rc = gt.gnutls_credentials_set(t->session, GNUTLS_CRD_PSK, t->client_cred);
    }
    /* The verification data is set after the priorities: GnuTLS asks so. */
    if (rc == 0)
        rc = gt.gnutls_priority_set_direct(t->session, priority_of(certs), NULL);
    if (rc == 0 && certs)
        rc = use_certs(t, server, keys);
    if (rc != 0) {
        snprintf(err, err_len, "TLS setup: %s", gt.gnutls_strerror(rc));
        apir_tls_free(t);
        return NULL;
    }
    gt.gnutls_session_set_ptr(t->session, t);
    gt.gnutls_transport_set_ptr(t->session, t);
    gt.gnutls_transport_set_vec_push_function(t->session, push_vec);
    gt.gnutls_transport_set_pull_function(t->session, pull);
    gt.gnutls_transport_set_pull_timeout_function(t->session, pull_timeout);
    do {
        rc = gt.gnutls_handshake(t->session);
        if ((rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) && !wait_io(t, timeout_ms)) {
            snprintf(err, err_len, "TLS handshake: no answer in %d ms", timeout_ms);
            apir_tls_free(t);
            return NULL;
        }
    } while (rc < 0 && !gt.gnutls_error_is_fatal(rc));
    if (rc < 0) {
        handshake_failure(t, server, rc, err, err_len);
        /* Tell the peer too (best effort): a guest refused only after its
         * side of the handshake was done learns it from this alert. */
        if (rc != GNUTLS_E_FATAL_ALERT_RECEIVED)
            gt.gnutls_alert_send_appropriate(t->session, rc);
        apir_tls_free(t);
        return NULL;
    }
    name_peer(t, server);
    t->keys = NULL;
    return t;
}

struct apir_tls *apir_tls_client(int fd, const struct apir_tls_keys *keys, const char *server_name, int timeout_ms,
                                 char *err, size_t err_len)
{
    if (!keys || (!keys->n && !keys->peer_ca)) {
        snprintf(err, err_len, "no TLS key, and no CA to check the host's certificate with");
        return NULL;
    }
    if (!keys->n && (!server_name || !*server_name || strlen(server_name) >= MAX_NAME)) {
        snprintf(err, err_len, "the host's name (to check its certificate for) must be 1 to %d bytes", MAX_NAME - 1);
        return NULL;
    }
    return handshake(fd, false, keys, server_name, timeout_ms, err, err_len);
}

struct apir_tls *apir_tls_server(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len)
{
    if (!keys || (!keys->n && !keys->own_cert)) {
        snprintf(err, err_len, "no TLS keys and no certificate to serve with");
        return NULL;
    }
    return handshake(fd, true, keys, NULL, timeout_ms, err, err_len);
}

const char *apir_tls_identity(const struct apir_tls *t)
{
    return t->peer;
}

const char *apir_tls_cipher(const struct apir_tls *t)
{
    const char *name = gt.gnutls_cipher_get_name(gt.gnutls_cipher_get(t->session));
    return name ? name : "?";
}

static ssize_t map_result(ssize_t rc)
{
    if (rc >= 0)
        return rc;
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
        errno = EAGAIN;
        return -1;
    }
    if (rc == GNUTLS_E_PREMATURE_TERMINATION)
        return 0;  /* closed without a close_notify: the end all the same */
    errno = EPROTO;
    return -1;
}

ssize_t apir_tls_recv(struct apir_tls *t, void *buf, size_t len)
{
    if (!t->packet) {
        const uint64_t t0 = t->counting ? apir_now_ns() : 0;
        ssize_t rc = gt.gnutls_record_recv_packet(t->session, &t->packet);
        if (t->counting && rc > 0) {
            t->counts.opened++;
            t->counts.opened_bytes += (uint64_t)rc;
            t->counts.open_ns += apir_now_ns() - t0;
        }
        if (rc <= 0) {
            /* 0: the peer's close_notify; < 0: as recv's.  No packet either way. */
            t->packet = NULL;
            if (rc == GNUTLS_E_FATAL_ALERT_RECEIVED)
                snprintf(t->alert, sizeof(t->alert), "%s", gt.gnutls_alert_get_name(gt.gnutls_alert_get(t->session)));
            return map_result(rc);
        }
        gt.gnutls_packet_get(t->packet, &t->packet_data, NULL);
        t->packet_off = 0;
    }
    const size_t left = t->packet_data.size - t->packet_off;
    const size_t n = left < len ? left : len;
    const uint64_t t0 = t->counting ? apir_now_ns() : 0;
    memcpy(buf, t->packet_data.data + t->packet_off, n);
    if (t->counting)
        t->counts.copy_ns += apir_now_ns() - t0;
    t->packet_off += n;
    if (t->packet_off == t->packet_data.size) {
        gt.gnutls_packet_deinit(t->packet);
        t->packet = NULL;
    }
    return (ssize_t)n;
}

const char *apir_tls_alert(const struct apir_tls *t)
{
    return t->alert;
}

ssize_t apir_tls_send(struct apir_tls *t, const void *buf, size_t len)
{
    if (!t->counting)
        return map_result(gt.gnutls_record_send(t->session, buf, len));
    const uint64_t t0 = apir_now_ns();
    ssize_t rc = gt.gnutls_record_send(t->session, buf, len);
    t->counts.send_ns += apir_now_ns() - t0;
    if (rc > 0) {
        t->counts.sends++;
        t->counts.sent_bytes += (uint64_t)rc;
    }
    return map_result(rc);
}

void apir_tls_count_on(struct apir_tls *t)
{
    t->counting = true;
}

void apir_tls_get_counts(const struct apir_tls *t, struct apir_tls_counts *out)
{
    *out = t->counts;
}

void apir_tls_describe_counts(const struct apir_tls *t, char *out, size_t len)
{
    const struct apir_tls_counts *c = &t->counts;
    const double opened = c->opened ? (double)c->opened : 1.0, sends = c->sends ? (double)c->sends : 1.0;
    snprintf(out, len,
             "opened %llu records (%.1f MiB): %.2f us each in GnuTLS, of which %.2f in %llu socket reads (%.1f MiB, "
             "%.1f of them by the read thread), then %.2f copying out; sealed %llu records (%.1f MiB): %.2f us each in "
             "GnuTLS, of which %.2f in %llu writes",
             (unsigned long long)c->opened, c->opened_bytes / 1048576.0, c->open_ns / 1e3 / opened,
             c->read_ns / 1e3 / opened, (unsigned long long)c->reads, c->read_bytes / 1048576.0,
             c->thread_bytes / 1048576.0, c->copy_ns / 1e3 / opened,
             (unsigned long long)c->sends, c->sent_bytes / 1048576.0, c->send_ns / 1e3 / sends, c->write_ns / 1e3 / sends,
             (unsigned long long)c->writes);
    /* With a sender thread: how much the sealing thread sent itself (small
     * writes while the ring was empty: replies, sender.h). */
    const size_t used = strlen(out);
    if (t->sender && used < len)
        snprintf(out + used, len - used, " (%.3f MiB sent directly, the rest by the sender thread)",
                 apir_sender_direct_bytes(t->sender) / 1048576.0);
}

bool apir_tls_send_from_thread(struct apir_tls *t, size_t ring_bytes, int timeout_ms)
{
    if (!t->sender)
        t->sender = apir_sender_start(t->fd, ring_bytes, timeout_ms);
    return t->sender != NULL;
}

bool apir_tls_read_from_thread(struct apir_tls *t, size_t ring_bytes)
{
    if (!t->reader)
        t->reader = apir_reader_start(t->fd, ring_bytes);
    return t->reader != NULL;
}

void apir_tls_bulk(struct apir_tls *t, bool on)
{
    if (!t->reader)
        return;
    if (on)
        apir_reader_arm(t->reader);
    else
        apir_reader_disarm(t->reader);
}

int apir_tls_bulk_wait(struct apir_tls *t, uint64_t deadline_ns)
{
    if (!t->reader || !apir_reader_armed(t->reader))
        return 0;
    return apir_reader_wait(t->reader, deadline_ns) ? 1 : -1;
}

bool apir_tls_flush(struct apir_tls *t, int timeout_ms)
{
    return !t->sender || apir_sender_flush(t->sender, timeout_ms);
}

bool apir_tls_pending(struct apir_tls *t)
{
    return t->packet || t->rtail > t->rhead || (t->reader && apir_reader_pending(t->reader)) ||
           gt.gnutls_record_check_pending(t->session) > 0;
}

bool apir_tls_wants_write(struct apir_tls *t)
{
    return gt.gnutls_record_get_direction(t->session) == 1;
}
