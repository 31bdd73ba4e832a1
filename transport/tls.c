#include "tls.h"

#include "wait.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* TLS 1.3 only, and only PSK with an ephemeral key exchange (forward
 * secrecy): nothing older or weaker is negotiable. */
#define PRIORITY "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:+DHE-PSK"
#define MAX_KEYS 1024
#define MAX_IDENTITY 128
#define MIN_KEY_BYTES 16
#define MAX_KEY_BYTES 64

/*
 * GnuTLS is loaded when a key is first loaded (dlopen), not linked: the
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
    X(void, gnutls_transport_set_errno, (gnutls_session_t, int))                                               \
    X(ssize_t, gnutls_record_recv, (gnutls_session_t, void *, size_t))                                         \
    X(ssize_t, gnutls_record_send, (gnutls_session_t, const void *, size_t))                                   \
    X(size_t, gnutls_record_check_pending, (gnutls_session_t))                                                 \
    X(int, gnutls_record_get_direction, (gnutls_session_t))

static struct gnutls_api {
    pthread_once_t once;
    bool ok;
    char why[160];
#define X(ret, name, args) ret(*name) args;
    GNUTLS_FUNCTIONS(X)
#undef X
    gnutls_alloc_function *malloc_fn;  /* gnutls_malloc: what a key handed to GnuTLS must come from */
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
    if (!ok || !gt.malloc_fn) {
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
    struct tls_key *keys;
    size_t n;
};

struct apir_tls {
    gnutls_session_t session;
    gnutls_psk_client_credentials_t client_cred;
    gnutls_psk_server_credentials_t server_cred;
    const struct apir_tls_keys *keys;   /* the server's, while handshaking */
    int fd;
    char identity[MAX_IDENTITY];
    int identity_known;       /* server: -1 none asked, 0 unknown, 1 one of ours */
};

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
    free(k);
}

size_t apir_tls_keys_count(const struct apir_tls_keys *k)
{
    return k ? k->n : 0;
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

static ssize_t push_vec(gnutls_transport_ptr_t ptr, const giovec_t *iov, int n)
{
    struct apir_tls *t = ptr;
    struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
    ssize_t r = sendmsg(t->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0)
        gt.gnutls_transport_set_errno(t->session, errno);
    return r;
}

static ssize_t pull(gnutls_transport_ptr_t ptr, void *buf, size_t len)
{
    struct apir_tls *t = ptr;
    ssize_t r = recv(t->fd, buf, len, MSG_DONTWAIT);
    if (r < 0)
        gt.gnutls_transport_set_errno(t->session, errno);
    return r;
}

/* The server's key for the identity a guest names; unknown identities fail
 * the handshake. */
static int server_key(gnutls_session_t session, const char *identity, gnutls_datum_t *key)
{
    struct apir_tls *t = gt.gnutls_session_get_ptr(session);
    if (t) {
        snprintf(t->identity, sizeof(t->identity), "%s", identity);
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
    if (t->session) {
        /* A close_notify, without waiting for the peer's. */
        gt.gnutls_bye(t->session, GNUTLS_SHUT_WR);
        gt.gnutls_deinit(t->session);
    }
    if (t->client_cred)
        gt.gnutls_psk_free_client_credentials(t->client_cred);
    if (t->server_cred)
        gt.gnutls_psk_free_server_credentials(t->server_cred);
    free(t);
}

static struct apir_tls *handshake(int fd, bool server, const struct apir_tls_keys *keys, int timeout_ms, char *err,
                                  size_t err_len)
{
    if (!gnutls_ready(err, err_len))
        return NULL;
    struct apir_tls *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    t->fd = fd;
    t->identity_known = -1;
    int rc = gt.gnutls_init(&t->session, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NONBLOCK);
    if (rc == 0 && server) {
        t->keys = keys;
        rc = gt.gnutls_psk_allocate_server_credentials(&t->server_cred);
        if (rc == 0) {
            gt.gnutls_psk_set_server_credentials_function(t->server_cred, server_key);
            rc = gt.gnutls_credentials_set(t->session, GNUTLS_CRD_PSK, t->server_cred);
        }
    } else if (rc == 0) {
        rc = gt.gnutls_psk_allocate_client_credentials(&t->client_cred);
        const gnutls_datum_t key = { (unsigned char *)keys->keys[0].key, keys->keys[0].key_len };
        if (rc == 0)
            rc = gt.gnutls_psk_set_client_credentials(t->client_cred, keys->keys[0].identity, &key, GNUTLS_PSK_KEY_RAW);
        if (rc == 0)
            rc = gt.gnutls_credentials_set(t->session, GNUTLS_CRD_PSK, t->client_cred);
    }
    if (rc == 0)
        rc = gt.gnutls_priority_set_direct(t->session, PRIORITY, NULL);
    if (rc != 0) {
        snprintf(err, err_len, "TLS setup: %s", gt.gnutls_strerror(rc));
        apir_tls_free(t);
        return NULL;
    }
    gt.gnutls_session_set_ptr(t->session, t);
    gt.gnutls_transport_set_ptr(t->session, t);
    gt.gnutls_transport_set_vec_push_function(t->session, push_vec);
    gt.gnutls_transport_set_pull_function(t->session, pull);
    do {
        rc = gt.gnutls_handshake(t->session);
        if ((rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) && !wait_io(t, timeout_ms)) {
            snprintf(err, err_len, "TLS handshake: no answer in %d ms", timeout_ms);
            apir_tls_free(t);
            return NULL;
        }
    } while (rc < 0 && !gt.gnutls_error_is_fatal(rc));
    if (rc < 0) {
        /* The alert the peer sent, if any, says more than the error code. */
        const char *alert = rc == GNUTLS_E_FATAL_ALERT_RECEIVED
                                ? gt.gnutls_alert_get_name(gt.gnutls_alert_get(t->session))
                                : NULL;
        char who[MAX_IDENTITY + 64] = "";
        if (server && t->identity_known == 0)
            snprintf(who, sizeof(who), " - key identity \"%s\" is not one of the host's", t->identity);
        else if (server && t->identity_known == 1)
            snprintf(who, sizeof(who), " - identity \"%s\" with a wrong key?", t->identity);
        snprintf(err, err_len, "TLS handshake failed: %s%s%s%s%s", gt.gnutls_strerror(rc), alert ? " (" : "",
                 alert ? alert : "", alert ? ")" : "",
                 server ? who : " (a key the host does not have? the host's log says why it refused)");
        apir_tls_free(t);
        return NULL;
    }
    t->keys = NULL;
    if (server) {
        const char *id = gt.gnutls_psk_server_get_username(t->session);
        snprintf(t->identity, sizeof(t->identity), "%s", id ? id : "?");
    } else {
        snprintf(t->identity, sizeof(t->identity), "%s", keys->keys[0].identity);
    }
    return t;
}

struct apir_tls *apir_tls_client(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len)
{
    if (!keys || !keys->n) {
        snprintf(err, err_len, "no TLS key");
        return NULL;
    }
    return handshake(fd, false, keys, timeout_ms, err, err_len);
}

struct apir_tls *apir_tls_server(int fd, const struct apir_tls_keys *keys, int timeout_ms, char *err, size_t err_len)
{
    return handshake(fd, true, keys, timeout_ms, err, err_len);
}

const char *apir_tls_identity(const struct apir_tls *t)
{
    return t->identity;
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
    return map_result(gt.gnutls_record_recv(t->session, buf, len));
}

ssize_t apir_tls_send(struct apir_tls *t, const void *buf, size_t len)
{
    return map_result(gt.gnutls_record_send(t->session, buf, len));
}

bool apir_tls_pending(struct apir_tls *t)
{
    return gt.gnutls_record_check_pending(t->session) > 0;
}

bool apir_tls_wants_write(struct apir_tls *t)
{
    return gt.gnutls_record_get_direction(t->session) == 1;
}
