/*
 * apir-host: serves a real ggml backend to guests over the shm transport.
 *
 * What runs with the daemon's rights (root, or a user with CAP_SETUID and
 * CAP_SETGID: dist/systemd): the daemon - it binds the socket, accepts
 * connections, reads each peer's uid (SO_PEERCRED), paces them and starts
 * a worker per guest, this program re-executed in namespaces of its own
 * (workers.c); it never parses a byte a guest sends (a refused connection
 * is only drained).  A worker loads the backend with the daemon's rights
 * (the backend libraries and a GPU's device nodes may need them), then
 * enters the sandbox (sandbox.c) - its own uid, seccomp - before the
 * guest's hello.
 * With --isolation thread this process serves every guest itself, without
 * a sandbox: for trusted guests only, and only with
 * --insecure-shared-process said too.
 *
 * The command line (getopt_long): every option in host_options below, with
 * --opt VALUE and --opt=VALUE; the short letters are those rpc-server users
 * know (-H -p -d -t -c) where they fit.  A new option is a row there: its
 * help, its parsing and its place in the man page come from that row.
 *
 * Signals (the daemon): SIGTERM and SIGINT stop it - workers ended, socket
 * files removed; SIGHUP (a closed terminal, logrotate) reopens the log file
 * or is ignored, on a thread of its own that may log (sighup_thread).
 */
#include "apir_build.h"
#include "apir_log.h"
#include "control.h"
#include "fdpass.h"
#include "host.h"
#include "host_stats.h"
#include "sandbox.h"
#include "server.h"
#include "net.h"
#include "stream_proto.h"
#include "tls.h"
#include "weight_cache.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef APIR_VIRGL_WORKER
#include "backend_lib.h"
#endif

#ifdef APIR_TEST_HOOKS
/* tests/worker_attack.c, linked into the test build apir-host-hooks only:
 * "attacker code" run inside a sandboxed worker (tests/test_hostile.c). */
void apir_test_attack_prepare(void);
void apir_test_attack_run(int guest_fd);
#endif

/* Exit statuses (usage() and the README list them). */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static struct apir_server *g_server;  /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    if (g_server)
        apir_server_stop(g_server);
}

/*
 * SIGHUP, blocked in every thread from main's start, is taken here: the log
 * file reopened (logrotate moved it), else the signal ignored - a daemon
 * whose terminal closed goes on serving.  Either is logged.
 */
static void *sighup_thread(void *arg)
{
    (void)arg;
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    for (;;) {
        int sig = 0;
        if (sigwait(&hup, &sig) != 0)
            continue;
        char err[300];
        const int r = apir_log_reopen(err, sizeof(err));
        if (r > 0)
            APIR_INFO("host", "SIGHUP: log file %s reopened", apir_log_file_path());
        else if (r == 0)
            APIR_INFO("host", "SIGHUP ignored: no log file to reopen (SIGTERM or SIGINT stops the host)");
        else
            APIR_WARN("host", "SIGHUP: cannot reopen the log file: %s; lines still go to the old one", err);
    }
    return NULL;
}

/* A fatal error after the command line was taken: a log line like any
 * other (the journal files it as an error), and the exit status. */
__attribute__((format(printf, 1, 2))) static int fatal(const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    APIR_ERROR("host", "%s", msg);
    return EXIT_FAIL;
}

/* A worker asked to stop (the daemon's shutdown, or ^C reaching the whole
 * process group) ends quietly: its end is expected, not a crash to report. */
static void on_worker_stop(int sig)
{
    (void)sig;
    _exit(0);
}

struct args {
    struct apir_host_config cfg;
    struct apir_sandbox_config sandbox;
    char path[108];
    struct apir_server_listen_options listen;  /* the socket file's mode and group */
    bool list, isolate, version, help;
    bool help_generic;           /* --help-generic: --help without this machine's values */
    bool insecure_shared_process;  /* --insecure-shared-process: --isolation thread may start */
    const char *backend_dir;     /* --backend-dir, else NULL */
    const char *log_file;        /* --log-file, else NULL ($APIR_LOG_FILE) */
    int serve_fd, stats_fd;
    int serve_stream_fd;         /* a worker serving a stream guest (--serve-stream-fd) */
    const char *peer_name;       /* its address (--peer-name), for log lines */
    char streams[APIR_MAX_NET_LISTENERS][128];  /* --listen tcp:/vsock: */
    unsigned n_streams;
    const char *token_file;
    const char *tls_psk_file;    /* --tls-psk-file: IDENTITY:HEXKEY lines */
    const char *tls_cert, *tls_key, *tls_client_ca;  /* --tls-cert, --tls-key, --tls-client-ca (PEM) */
    bool stream_tls;             /* a worker: handshake first (--stream-tls) */
    int lane_fd;                 /* a worker: the daemon's socket passing its guest's lanes (--lane-fd), or -1 */
    int weight_cache_fd;         /* a worker's line to the daemon's weight cache (weight_cache.h), or -1 */
    int log_fd;                  /* a worker: the pipe to put on its stderr (--log-fd), or -1 */
    unsigned long long worker_slot, client_id;
    const char *backend_library, *backend_reg;  /* a libapir-virgl.so context's worker (backend_lib.h) */
    long long worker_uid;        /* a worker: the uid the daemon gave it (--worker-uid), or -1 */
    struct ucred peer;           /* a worker: its guest as the daemon saw it (--peer-cred PID:UID:GID) */
    bool peer_given;
    /* the control socket (control.h): NULL path and !control_none: beside
     * the guest socket */
    char control_path[108];
    bool control_none;
    const char *control_group, *metrics_file;
    const char *metrics_listen;  /* --metrics-listen: HTTP /metrics (metrics_http.c) */
    unsigned metrics_interval_s;
};

/*
 * The options: one table (host_options below) from which --help, getopt_long's
 * array and the man page apir-host(8) (scripts/help2man.sh, from --help) are
 * made.  A row is an option - its long name, short letter, value, help, and
 * where its value goes (a field of struct args) or the function that takes
 * it - or, without a name, a heading of --help.  A row without help is
 * internal: how the daemon starts a worker (workers.c), or an old name.
 * Help text may name values known only when it is printed: {socket},
 * {threads}, {bin_to_ggml}, {uid_base}, {metrics_interval}; a line with
 * {backend_here} is left out of the man page (it names this machine's).
 */
struct host_option;
typedef bool (*option_fn)(struct args *a, const struct host_option *o, const char *v);

enum option_store {
    STORE_FN,      /* fn takes the value */
    STORE_TRUE,    /* a bool set */
    STORE_FALSE,   /* a bool cleared */
    STORE_STRING,  /* a const char * */
    STORE_PATH,    /* a const char *, not empty */
    STORE_NUMBER,  /* a decimal number from min to max, times 2^shift, into a 4- or 8-byte field */
};

struct host_option {
    const char *name;    /* long name; NULL: a heading of --help */
    char letter;         /* short option, 0: none */
    const char *value;   /* the value's name in --help ("N", "FILE"); NULL: takes no value */
    const char *help;    /* '\n' between lines; NULL: internal, not shown */
    enum option_store store;
    size_t offset, size; /* the field of struct args */
    unsigned long long min, max;
    unsigned shift;
    option_fn fn;
};

#define FIELD(f) .offset = offsetof(struct args, f), .size = sizeof(((struct args *)0)->f)
#define HEADING(text) { .help = (text) }
#define FLAG(n, l, f, h) { .name = (n), .letter = (l), .help = (h), .store = STORE_TRUE, FIELD(f) }
#define UNFLAG(n, f, h) { .name = (n), .help = (h), .store = STORE_FALSE, FIELD(f) }
#define STRING(n, l, v, f, h) { .name = (n), .letter = (l), .value = (v), .help = (h), .store = STORE_STRING, FIELD(f) }
#define PATH(n, v, f, h) { .name = (n), .value = (v), .help = (h), .store = STORE_PATH, FIELD(f) }
#define NUMBER(n, l, f, lo, hi, h) \
    { .name = (n), .letter = (l), .value = "N", .help = (h), .store = STORE_NUMBER, FIELD(f), .min = (lo), .max = (hi) }
#define SCALED(n, f, lo, hi, sh, h) \
    { .name = (n), .value = "N", .help = (h), .store = STORE_NUMBER, FIELD(f), .min = (lo), .max = (hi), .shift = (sh) }
#define CALL(n, l, v, fn_, h) { .name = (n), .letter = (l), .value = (v), .help = (h), .store = STORE_FN, .fn = (fn_) }

static bool opt_help_generic(struct args *a, const struct host_option *o, const char *v);
static bool opt_listen(struct args *a, const struct host_option *o, const char *v);
static bool opt_port(struct args *a, const struct host_option *o, const char *v);
static bool opt_device(struct args *a, const struct host_option *o, const char *v);
static bool opt_cache(struct args *a, const struct host_option *o, const char *v);
static bool opt_log_level(struct args *a, const struct host_option *o, const char *v);
static bool opt_log_file(struct args *a, const struct host_option *o, const char *v);
static bool opt_isolation(struct args *a, const struct host_option *o, const char *v);
static bool opt_max_alloc_mib(struct args *a, const struct host_option *o, const char *v);
static bool opt_tenant_by(struct args *a, const struct host_option *o, const char *v);
static bool opt_socket_mode(struct args *a, const struct host_option *o, const char *v);
static bool opt_control(struct args *a, const struct host_option *o, const char *v);
static bool opt_weight_cache(struct args *a, const struct host_option *o, const char *v);
static bool opt_peer_cred(struct args *a, const struct host_option *o, const char *v);

static const struct host_option host_options[] = {
    FLAG("help", 'h', help, "this help, then exit"),
    FLAG("version", 0, version, "apir's version, the APIR protocol version and the ggml it was built against"),
    CALL("help-generic", 0, NULL, opt_help_generic, NULL),  /* --help without this machine's values: the man page */
    CALL("listen", 'l', "ENDPOINT", opt_listen,
         "where guests connect; repeatable (one unix: socket, up to 4 streams):\n"
         "unix:PATH  this machine, shared memory (default {socket},\n"
         "           served even when only streams are named)\n"
         "tcp:HOST:PORT, tcp:[V6]:PORT  other machines: data in the stream; an\n"
         "           address other machines reach needs a token\n"
         "tls:HOST:PORT  the same over TLS 1.3, guests authenticated by key\n"
         "           or certificate\n"
         "vsock:CID:PORT  VMs without virtio-gpu (Firecracker, Kata...)"),
    CALL("host", 'H', "ENDPOINT", opt_listen, "the same (rpc-server's -H)"),
    CALL("port", 'p', "N", opt_port, "refused: say --listen tcp:HOST:PORT"),
    STRING("tls-psk-file", 0, "FILE", tls_psk_file,
           "tls: guests' keys, lines IDENTITY:HEXKEY (16-64 bytes; psktool's format);\n"
           "a guest gives its own line (APIR_TLS_PSK_FILE); logs name the identity"),
    STRING("tls-cert", 0, "FILE", tls_cert,
           "tls: the host's certificate chain (PEM; guests check it with\n"
           "APIR_TLS_CA_FILE), with --tls-key"),
    STRING("tls-key", 0, "FILE", tls_key, "tls: the private key of --tls-cert (PEM)"),
    STRING("tls-client-ca", 0, "FILE", tls_client_ca,
           "tls: CA certificates (PEM) guests' certificates must chain to; logs name\n"
           "the subject.  Without it any guest gets in: loopback addresses only.\n"
           "Keys and certificates may be given together (a guest uses either)"),
    STRING("token-file", 0, "FILE", token_file,
           "tcp: guests must present this token (first line, 1-64 bytes; the\n"
           "guest's APIR_TOKEN_FILE or APIR_TOKEN); it travels in clear: trusted\n"
           "networks only (tls: encrypts)"),
    CALL("socket-mode", 0, "MODE", opt_socket_mode,
         "permissions of the socket file (octal; default 0660: owner and group\n"
         "may connect); not used when systemd passes the socket (SocketMode=)"),
    STRING("socket-group", 0, "GROUP", listen.group,
           "group of the socket file (name or gid; default: the daemon's group);\n"
           "not used when systemd passes the socket (SocketGroup=)"),
    STRING("backend", 'b', "NAME", cfg.backend_name,
           "ggml backend (CPU, CUDA, Vulkan...; default: the first GPU's, else CPU)"),
    CALL("device", 'd', "N|NAME", opt_device,
         "serve only device N of the backend, or the device named NAME\n"
         "(CUDA0, CPU...: --list-devices; default: every device of the backend)"),
    NUMBER("threads", 't', cfg.n_threads, 0, 1024,
           "CPU backend threads (default {threads}: the cores this process may use,\n"
           "within its cgroup's CPU quota; 0: the backend's own default)"),
    CALL("cache", 'c', NULL, opt_cache,
         "accepted for rpc-server's -c and ignored: the host maps a guest's model\n"
         "file directly, there is nothing to cache"),
    STRING("backend-dir", 0, "DIR", backend_dir,
           "where ggml's backend libraries are (default: $APIR_BACKEND_DIR, else\n"
           "{bin_to_ggml} from this program's folder, as installed)\n"
           "here: {backend_here}"),
    FLAG("list-devices", 0, list, "list the backends and devices found, then exit"),
    CALL("log-level", 0, "LEVEL", opt_log_level, "error|warn|info|debug (default info, or $APIR_LOG_LEVEL)"),
    CALL("log-file", 0, "FILE", opt_log_file,
         "append the log to FILE (or $APIR_LOG_FILE) instead of stderr; SIGHUP\n"
         "reopens it (logrotate), workers' lines included"),
    CALL("isolation", 0, "MODE", opt_isolation,
         "process: each guest in its own sandboxed worker process (default);\n"
         "thread: all guests in this process, unsandboxed - TRUSTED GUESTS ONLY\n"
         "(a guest that crashes or compromises it reaches every other guest, and\n"
         "the daemon's rights): refused without --insecure-shared-process"),
    FLAG("insecure-shared-process", 0, insecure_shared_process,
         "let --isolation thread start (never for untrusted guests)"),
    HEADING("worker sandbox (process isolation):"),
    NUMBER("worker-uid-base", 0, sandbox.uid_base, 1, 0xFFFFFFFEull,
           "each worker runs as a uid/gid of its own from N up, none shared by two\n"
           "live workers (default {uid_base}; root, or CAP_SETUID and CAP_SETGID)"),
    UNFLAG("no-sandbox", sandbox.enabled, "workers keep the daemon's uid and every syscall (debugging only)"),
    FLAG("sandbox-log", 0, sandbox.log_only, "name each refused syscall in the worker's log (still refused)"),
    STRING("sandbox-allow", 0, "LIST", sandbox.extra_allow,
           "also allow these syscalls (comma-separated names), e.g. for a GPU driver;\n"
           "not those that would undo the sandbox (sendmsg, kill, setuid...)"),
    HEADING("limits per guest (over a limit the call fails; other guests go on):"),
    NUMBER("max-clients", 0, cfg.limits.max_clients, 1, 65536, "concurrent guests (64)"),
    NUMBER("max-buffers", 0, cfg.limits.max_buffers, 0, UINT32_MAX, "live buffers (4096)"),
    CALL("max-alloc-mib", 0, "N", opt_max_alloc_mib,
         "MiB in live buffers (default: half the devices' memory, at least\n"
         "1024; 0: no limit)"),
    NUMBER("max-graph-nodes", 0, cfg.limits.max_graph_nodes, 0, UINT32_MAX, "nodes per graph (65536)"),
    NUMBER("max-graph-tensors", 0, cfg.limits.max_graph_tensors, 0, UINT32_MAX, "tensors per graph (262144)"),
    NUMBER("max-blobs", 0, cfg.limits.max_blobs, 0, UINT32_MAX, "shared-memory blobs (1024)"),
    SCALED("max-blob-mib", cfg.limits.max_blob_bytes, 0, UINT64_MAX >> 20, 20,
           "MiB of shared memory mapped (half the RAM, at most 65536)"),
    HEADING("denial of service:"),
    CALL("tenant-by", 0, "cgroup|uid", opt_tenant_by,
         "what tells local guests apart: cgroup (default): their container\n"
         "(cgroup and uid, read at connect; the uid when unreadable); uid: their\n"
         "uid.  A stream guest's tenant is its address (an IPv6 /64).  Every limit\n"
         "below is per tenant: one tenant's connections cost no other tenant"),
    NUMBER("max-clients-per-tenant", 0, cfg.limits.max_clients_per_tenant, 0, UINT32_MAX,
           "connections of one tenant, waiting or served, root's too (16; 0: no\n"
           "limit; 64 guests of one tenant: 64, with --spawn-burst 64)"),
    NUMBER("max-clients-per-uid", 0, cfg.limits.max_clients_per_tenant, 0, UINT32_MAX, NULL),  /* the old name */
    NUMBER("connect-rate", 0, cfg.limits.connect_per_s, 0, UINT32_MAX,
           "new connections per second of one tenant, before their hello (50;\n"
           "0: no limit)"),
    NUMBER("connect-burst", 0, cfg.limits.connect_burst, 0, UINT32_MAX, "... and at once (100)"),
    NUMBER("spawn-rate", 0, cfg.limits.spawn_per_s, 0, UINT32_MAX,
           "guests started per second of one tenant, once their hello is in (20;\n"
           "0: no limit)"),
    NUMBER("spawn-burst", 0, cfg.limits.spawn_burst, 0, UINT32_MAX, "... and at once (40)"),
    NUMBER("handshake-timeout-ms", 0, cfg.limits.handshake_timeout_ms, 0, 600000,
           "a connection's hello must come by then (5000; at most 600000)"),
    NUMBER("graph-timeout-ms", 0, cfg.limits.graph_timeout_ms, 0, UINT32_MAX,
           "one command's time; a worker over it is ended (60000; 0: none)"),
    NUMBER("guest-log-rate", 0, cfg.limits.guest_log_per_s, 0, UINT32_MAX,
           "log lines a guest's commands (and its worker's stderr) may cause a\n"
           "second (10; 0: no limit), then one \"N log lines suppressed\" line"),
    NUMBER("guest-log-burst", 0, cfg.limits.guest_log_burst, 0, UINT32_MAX, "... and at once (100)"),
    HEADING("what the host does (apir stat, apir ps, Prometheus):"),
    CALL("control", 0, "unix:PATH", opt_control,
         "control socket (default: the socket's path + \".ctl\"; none: no control\n"
         "socket); mode 0600: only root and the host's user may read it"),
    STRING("control-group", 0, "GROUP", control_group, "... mode 0660 and this group: its members may read it too"),
    PATH("metrics-file", "PATH", metrics_file,
         "write Prometheus metrics there (node_exporter's textfile collector),\n"
         "atomically, every --metrics-interval seconds; removed at exit"),
    NUMBER("metrics-interval", 0, metrics_interval_s, 1, 86400,
           "seconds between two metrics files (default {metrics_interval}; 1 to 86400)"),
    PATH("metrics-listen", "ADDR", metrics_listen,
         "serve GET /metrics over HTTP (Prometheus' scrape) at ADDR: HOST:PORT on\n"
         "a loopback address (127.0.0.1:9464, [::1]:9464) or unix:PATH (mode\n"
         "0660 with --control-group, else 0600); off by default"),
    HEADING("weight cache (off by default; docs/SECURITY.md: a hit tells a guest that some guest sent those bytes):"),
    CALL("weight-cache", 0, "DIR", opt_weight_cache,
         "keep guests' weights by SHA-256 in DIR (created 0700; or\n"
         "$APIR_HOST_WEIGHT_CACHE): a guest reloading a model the host has seen\n"
         "sends hashes, not bytes; the host stores only bytes it hashed itself"),
    SCALED("weight-cache-max-gib", cfg.weight_cache_max_bytes, 0, 1ull << 30, 30,
           "bound DIR to N GiB, evicting the least recently used entries\n"
           "(default 64, or $APIR_HOST_WEIGHT_CACHE_MAX_GIB; 0: no bound)"),
    HEADING("signals: SIGTERM and SIGINT stop the host (its workers, then its socket files); SIGHUP\n"
            "         reopens --log-file (or $APIR_LOG_FILE), else is ignored; either is logged"),
    HEADING("exit status: 0 stopped by SIGTERM or SIGINT, or --help, --version, --list-devices done;\n"
            "             1 cannot serve (no backend or device, bad backend directory, socket in use...);\n"
            "             2 bad command line or log setting (APIR_LOG_LEVEL, APIR_LOG_TIMESTAMPS, APIR_LOG_FILE)"),
    /* internal: how the daemon starts a worker (workers.c) */
    NUMBER("serve-fd", 0, serve_fd, 0, INT_MAX, NULL),
    NUMBER("serve-stream-fd", 0, serve_stream_fd, 0, INT_MAX, NULL),
    STRING("peer-name", 0, "NAME", peer_name, NULL),
    FLAG("stream-tls", 0, stream_tls, NULL),
    NUMBER("lane-fd", 0, lane_fd, 0, INT_MAX, NULL),
    NUMBER("client-id", 0, client_id, 0, UINT64_MAX, NULL),
    NUMBER("worker-slot", 0, worker_slot, 0, UINT32_MAX, NULL),
    NUMBER("worker-uid", 0, worker_uid, 1, 0xFFFFFFFEull, NULL),
    CALL("peer-cred", 0, "PID:UID:GID", opt_peer_cred, NULL),
    NUMBER("stats-fd", 0, stats_fd, 0, INT_MAX, NULL),
    NUMBER("weight-cache-fd", 0, weight_cache_fd, 0, INT_MAX, NULL),
    NUMBER("log-fd", 0, log_fd, 0, INT_MAX, NULL),  /* its stderr: a pipe the daemon reads (worker_log.h) */
    /* internal: how libapir-virgl.so starts a context's worker (host/virgl/worker_link.c) */
    STRING("backend-library", 0, "PATH", backend_library, NULL),
    STRING("backend-reg", 0, "SYM", backend_reg, NULL),
};
#define N_HOST_OPTIONS (sizeof(host_options) / sizeof(host_options[0]))

/* What --help says for the values only known now; generic: the man page's
 * words instead of this machine's. */
struct help_values {
    bool generic;
    const char *socket, *backend_dir, *backend_dir_source;
};

static void put_help_text(FILE *out, const char *text, const struct help_values *hv)
{
    for (const char *p = text; *p;) {
        const char *open = strchr(p, '{'), *close = open ? strchr(open, '}') : NULL;
        if (!close) {
            fputs(p, out);
            return;
        }
        fwrite(p, 1, (size_t)(open - p), out);
        const size_t len = (size_t)(close - open - 1);
        const char *key = open + 1;
#define KEY(k) (len == sizeof(k) - 1 && !strncmp(key, k, len))
        if (KEY("socket"))
            fputs(hv->generic ? "$XDG_RUNTIME_DIR/apir/host.sock, else /run/apir/host.sock" : hv->socket, out);
        else if (KEY("threads"))
            hv->generic ? (void)fputs("N", out) : (void)fprintf(out, "%d", apir_host_default_threads());
        else if (KEY("bin_to_ggml"))
            fputs(APIR_BIN_TO_GGML, out);
        else if (KEY("uid_base"))
            fprintf(out, "%u", APIR_SANDBOX_UID_BASE_DEFAULT);
        else if (KEY("metrics_interval"))
            fprintf(out, "%d", APIR_METRICS_INTERVAL_DEFAULT_S);
        else if (KEY("backend_here"))
            fprintf(out, "%s (%s)", hv->backend_dir ? hv->backend_dir : "none found", hv->backend_dir_source);
        else
            fwrite(open, 1, len + 2, out);
#undef KEY
        p = close + 1;
    }
}

/* The column where an option's help starts. */
#define HELP_COLUMN 27

static void usage(FILE *out, const struct help_values *hv)
{
    fputs("usage: apir-host [options]\n"
          "Serves a ggml backend (CPU, CUDA, Vulkan...) to ggml programs that load libggml-apir.so.\n"
          "Options take their value as --opt VALUE or --opt=VALUE.\n",
          out);
    for (size_t i = 0; i < N_HOST_OPTIONS; i++) {
        const struct host_option *o = &host_options[i];
        if (!o->help)
            continue;
        if (!o->name) {
            put_help_text(out, o->help, hv);
            fputc('\n', out);
            continue;
        }
        int col = o->letter ? fprintf(out, "  -%c, --%s", o->letter, o->name) : fprintf(out, "      --%s", o->name);
        if (o->value)
            col += fprintf(out, " %s", o->value);
        /* At least two spaces before the help: what scripts/help2man.sh splits at. */
        fprintf(out, "%*s", col + 2 <= HELP_COLUMN ? HELP_COLUMN - col : 2, "");
        for (const char *line = o->help; *line;) {
            const size_t n = strcspn(line, "\n");
            char buf[256];
            snprintf(buf, sizeof(buf), "%.*s", (int)n, line);
            if (!(hv->generic && strstr(buf, "{backend_here}"))) {
                if (line != o->help)
                    fprintf(out, "%*s", HELP_COLUMN, "");
                put_help_text(out, buf, hv);
                fputc('\n', out);
            }
            line += n + (line[n] == '\n');
        }
    }
}

static const struct host_option *option_by_id(int id)
{
    return id >= 256 && (size_t)(id - 256) < N_HOST_OPTIONS ? &host_options[id - 256] : NULL;
}

/* A decimal number from min to max, or a message and false. */
static bool num_arg(const char *name, const char *v, unsigned long long min, unsigned long long max,
                    unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long n = 0;
    if (v && *v >= '0' && *v <= '9')
        n = strtoull(v, &end, 10);
    if (!end || *end || errno || n < min || n > max) {
        fprintf(stderr, "apir-host: --%s: '%s' is not a number from %llu to %llu\n", name, v ? v : "", min, max);
        return false;
    }
    *out = n;
    return true;
}

static const char no_tcp[] = "endpoints are unix:PATH (this machine), tcp:HOST:PORT or vsock:CID:PORT (other "
                             "machines and VMs; --listen only) and, for VM guests, virtgpu (served by "
                             "libapir-virgl.so)";

/* --listen/-H: unix:PATH, or a path with a '/'.  Anything else - tcp:...,
 * host:port, a bare host name - is refused, never bound as a file name. */
static bool parse_listen(const char *opt, const char *v, char *path, size_t len)
{
    const size_t scheme = strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
    const char *p = v;
    if (!strncmp(v, "unix:", 5)) {
        p = v + 5;
    } else if (!strncmp(v, "virtgpu", 7) && (v[7] == '\0' || v[7] == ':')) {
        fprintf(stderr, "apir-host: %s %s: a VM guest's host is libapir-virgl.so in the hypervisor, not apir-host\n", opt, v);
        return false;
    } else if (scheme > 0 && v[scheme] == ':') {
        fprintf(stderr, "apir-host: %s %s: not a unix: endpoint; %s\n", opt, v, no_tcp);
        return false;
    } else if (!strchr(v, '/')) {
        fprintf(stderr, "apir-host: %s %s: not a socket path (unix:PATH, or ./%s in this folder); %s\n", opt, v, v, no_tcp);
        return false;
    }
    if (!*p) {
        fprintf(stderr, "apir-host: %s %s: no socket path\n", opt, v);
        return false;
    }
    if (strlen(p) >= len) {
        fprintf(stderr, "apir-host: %s %s: socket path too long (at most %zu bytes)\n", opt, v, len - 1);
        return false;
    }
    snprintf(path, len, "%s", p);
    return true;
}

/* ---- the options' functions (a message and false: a bad command line) ---- */

static bool opt_help_generic(struct args *a, const struct host_option *o, const char *v)
{
    a->help = a->help_generic = true;
    return true;
}

static bool opt_listen(struct args *a, const struct host_option *o, const char *v)
{
    if (!apir_net_is_stream(v))
        return parse_listen("--listen", v, a->path, sizeof(a->path));
    struct apir_net_addr na;
    char nerr[160];
    if (!apir_net_parse(v, &na, nerr, sizeof(nerr))) {
        fprintf(stderr, "apir-host: --listen: %s\n", nerr);
        return false;
    }
    if (a->n_streams == APIR_MAX_NET_LISTENERS || strlen(v) >= sizeof(a->streams[0])) {
        fprintf(stderr, "apir-host: --listen %s: at most %u stream endpoints of up to %zu bytes\n", v,
                APIR_MAX_NET_LISTENERS, sizeof(a->streams[0]) - 1);
        return false;
    }
    snprintf(a->streams[a->n_streams++], sizeof(a->streams[0]), "%s", v);
    return true;
}

static bool opt_port(struct args *a, const struct host_option *o, const char *v)
{
    fprintf(stderr, "apir-host: --port %s: say --listen tcp:HOST:PORT (an address other machines reach "
            "needs --token-file)\n", v);
    return false;
}

static bool opt_device(struct args *a, const struct host_option *o, const char *v)
{
    unsigned long long n;
    if (*v >= '0' && *v <= '9') {
        if (!num_arg(o->name, v, 0, APIR_HOST_MAX_DEVICES - 1, &n))
            return false;
        a->cfg.device = (int)n;
        a->cfg.device_name = NULL;
    } else if (*v && !strchr(v, ',')) {
        a->cfg.device_name = v;
        a->cfg.device = -1;
    } else {
        fprintf(stderr, "apir-host: --device %s: give one device, by number or name (one host serves "
                        "one device or all devices of one backend)\n", v);
        return false;
    }
    return true;
}

static bool opt_cache(struct args *a, const struct host_option *o, const char *v)
{
    fprintf(stderr, "apir-host: --cache ignored: the host maps a guest's model file directly, "
                    "there is nothing to cache\n");
    return true;
}

static bool opt_log_level(struct args *a, const struct host_option *o, const char *v)
{
    enum apir_log_level l;
    if (apir_log_level_from_string(v, &l) != 0) {
        fprintf(stderr, "apir-host: --log-level %s: use error, warn, info or debug\n", v);
        return false;
    }
    apir_log_set_level(l);
    return true;
}

static bool opt_log_file(struct args *a, const struct host_option *o, const char *v)
{
    if (!*v) {
        fprintf(stderr, "apir-host: --log-file needs a file name\n");
        return false;
    }
    a->log_file = v;
    return true;
}

static bool opt_isolation(struct args *a, const struct host_option *o, const char *v)
{
    if (strcmp(v, "process") && strcmp(v, "thread")) {
        fprintf(stderr, "apir-host: --isolation %s: use process or thread\n", v);
        return false;
    }
    a->isolate = !strcmp(v, "process");
    return true;
}

static bool opt_max_alloc_mib(struct args *a, const struct host_option *o, const char *v)
{
    unsigned long long n;
    if (!num_arg(o->name, v, 0, (UINT64_MAX >> 20) - 1, &n))
        return false;
    a->cfg.limits.max_alloc_bytes = n ? (uint64_t)n << 20 : UINT64_MAX;
    return true;
}

static bool opt_tenant_by(struct args *a, const struct host_option *o, const char *v)
{
    if (!strcmp(v, "cgroup")) {
        a->cfg.tenant_by = APIR_TENANT_BY_CGROUP;
    } else if (!strcmp(v, "uid")) {
        a->cfg.tenant_by = APIR_TENANT_BY_UID;
    } else {
        fprintf(stderr, "apir-host: --tenant-by wants cgroup or uid, not '%s'\n", v);
        return false;
    }
    return true;
}

static bool opt_socket_mode(struct args *a, const struct host_option *o, const char *v)
{
    if (apir_server_parse_socket_mode(v, &a->listen.mode) != 0) {
        fprintf(stderr, "apir-host: --socket-mode wants an octal mode from 0 to 0777, not '%s'\n", v);
        return false;
    }
    return true;
}

static bool opt_control(struct args *a, const struct host_option *o, const char *v)
{
    a->control_none = !strcmp(v, "none");
    a->control_path[0] = '\0';
    return a->control_none || parse_listen("--control", v, a->control_path, sizeof(a->control_path));
}

static bool opt_weight_cache(struct args *a, const struct host_option *o, const char *v)
{
    a->cfg.weight_cache_dir = *v ? v : NULL;
    return true;
}

static bool opt_peer_cred(struct args *a, const struct host_option *o, const char *v)
{
    int pid = 0;
    unsigned uid = 0, gid = 0, used = 0;
    if (sscanf(v, "%d:%u:%u%n", &pid, &uid, &gid, &used) != 3 || v[used]) {
        fprintf(stderr, "apir-host: --peer-cred %s: not PID:UID:GID\n", v);
        return false;
    }
    a->peer = (struct ucred){ .pid = pid, .uid = uid, .gid = gid };
    a->peer_given = true;
    return true;
}

/* A row's value into its field. */
static bool apply_option(struct args *a, const struct host_option *o, const char *v)
{
    char *field = (char *)a + o->offset;
    unsigned long long n;
    switch (o->store) {
    case STORE_FN:
        return o->fn(a, o, v);
    case STORE_TRUE:
    case STORE_FALSE:
        *(bool *)field = o->store == STORE_TRUE;
        return true;
    case STORE_PATH:
        if (!*v) {
            fprintf(stderr, "apir-host: --%s needs a %s\n", o->name, o->value);
            return false;
        }
        /* fall through */
    case STORE_STRING:
        *(const char **)field = v;
        return true;
    case STORE_NUMBER:
        if (!num_arg(o->name, v, o->min, o->max, &n))
            return false;
        n <<= o->shift;
        if (o->size == sizeof(uint32_t)) {
            const uint32_t n32 = (uint32_t)n;
            memcpy(field, &n32, sizeof(n32));
        } else {
            memcpy(field, &n, sizeof(n));
        }
        return true;
    }
    return false;
}

/* EXIT_OK to go on; else the exit status (a message was printed). */
static int parse_args(struct args *a, int argc, char **argv)
{
    /* getopt_long's array and short options, from the table: an option's
     * id is 256 + its row. */
    static struct option long_opts[N_HOST_OPTIONS + 1];
    char short_opts[2 + 2 * N_HOST_OPTIONS] = ":";  /* leading colon: a missing value is reported as such */
    size_t n_long = 0, n_short = 1;
    for (size_t i = 0; i < N_HOST_OPTIONS; i++) {
        const struct host_option *o = &host_options[i];
        if (!o->name)
            continue;
        long_opts[n_long++] = (struct option){ o->name, o->value ? required_argument : no_argument, NULL, 256 + (int)i };
        if (o->letter) {
            short_opts[n_short++] = o->letter;
            if (o->value)
                short_opts[n_short++] = ':';
        }
    }
    short_opts[n_short] = '\0';
    long_opts[n_long] = (struct option){ 0 };
    int c;
    opterr = 0;  /* our own messages, with the option's name */
    while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        const struct host_option *o = option_by_id(c);
        for (size_t i = 0; !o && c > 0 && c < 256 && i < N_HOST_OPTIONS; i++)
            if (host_options[i].name && host_options[i].letter == c)
                o = &host_options[i];
        if (o) {
            if (!apply_option(a, o, optarg))
                return EXIT_USAGE;
            continue;
        }
        if (c == ':') {
            fprintf(stderr, "apir-host: %s needs a value (try --help)\n", argv[optind - 1]);
            return EXIT_USAGE;
        }
        if (optopt && optopt < 256 && strncmp(argv[optind - 1], "--", 2) != 0)
            fprintf(stderr, "apir-host: unknown option -%c (try --help)\n", optopt);
        else
            fprintf(stderr, "apir-host: unknown or ambiguous option %s (try --help)\n", argv[optind - 1]);
        return EXIT_USAGE;
    }
    /* Workers re-run this command line with options appended: nothing may
     * end the options early. */
    if (optind < argc || (optind > 1 && !strcmp(argv[optind - 1], "--"))) {
        fprintf(stderr, "apir-host: unexpected argument '%s' (options only; try --help)\n",
                optind < argc ? argv[optind] : "--");
        return EXIT_USAGE;
    }
    return EXIT_OK;
}

/* In a worker: the daemon's stats page for it (--stats-fd), or NULL. */
static struct apir_stats_page *map_stats_page(int fd)
{
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)APIR_STATS_PAGE_SIZE)
        p = mmap(NULL, APIR_STATS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED || !apir_stats_page_valid(p)) {
        APIR_WARN("host", "worker: no usable stats page (fd %d): apir stat will not see this guest's counters", fd);
        if (p != MAP_FAILED)
            munmap(p, APIR_STATS_PAGE_SIZE);
        return NULL;
    }
    return p;
}

/*
 * Local guests' blobs are shared memory they commit before sending (their
 * memfds, transport/fdpass.c), in huge pages where the kernel gives shared
 * memory huge pages on request: in 4 KiB pages, committing them was half of
 * whisper.cpp's load through apir (docs/MEASUREMENTS.md).  The setting is the
 * machine's, so the operator is told once which one this host's guests get;
 * and where neither guests nor host ask by default (free memory reported to
 * a hypervisor, fdpass.h), why.
 */
static void log_shmem_pages(void)
{
    static const char knob[] = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
    char line[128] = "";
    FILE *f = fopen(knob, "r");
    if (!f)
        return;
    const bool read = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    if (!read)
        return;
    /* The one in use is in brackets: "always within_size [advise] never deny force". */
    const char *mode = strchr(line, '['), *end = mode ? strchr(mode, ']') : NULL;
    if (!end)
        return;
    mode++;
    const int len = (int)(end - mode);
    if (apir_free_memory_reported())
        APIR_INFO("host", "huge pages not asked for by default (guests' blobs, the host's buffers): this machine's "
                  "free memory goes back to its hypervisor (virtio balloon free page reporting), which makes fresh "
                  "ones slower (%s: %.*s; APIR_HUGEPAGES=1, APIR_HOST_HUGEPAGES=1 ask anyway)", knob, len, mode);
    else if (!strncmp(mode, "never", 5) || !strncmp(mode, "deny", 4))
        APIR_INFO("host", "local guests' shared memory in 4 KiB pages (%s: %.*s); 'advise' there gives their "
                  "blobs huge pages, loads up to 2x faster (README: Configuration)", knob, len, mode);
    else
        APIR_INFO("host", "local guests' shared memory in huge pages where they ask (%s: %.*s)", knob, len, mode);
}

/*
 * The control socket (default: beside the guest socket, PATH.ctl) and the
 * metrics file.  An explicit --control that cannot be bound stops the host;
 * the default one only warns (the host serves guests without it).
 */
static bool setup_control(const struct args *a, struct apir_server *srv)
{
    char path[sizeof(a->control_path) + 8] = "";
    const bool explicit_path = a->control_path[0] != '\0';
    const char *sock = apir_server_path(srv);
    if (explicit_path)
        snprintf(path, sizeof(path), "%s", a->control_path);
    else if (!a->control_none && sock[0] == '/' && strlen(sock) + 4 < 108)
        snprintf(path, sizeof(path), "%s.ctl", sock);
    else if (!a->control_none)
        APIR_INFO("host", "no control socket beside unix:%s (give one with --control unix:PATH)", sock);
    struct apir_control_config cc = {
        .path = path[0] ? path : NULL,
        .group = a->control_group,
        .metrics_file = a->metrics_file,
        .metrics_interval_s = a->metrics_interval_s,
        .metrics_listen = a->metrics_listen,
    };
    if (!cc.path && !cc.metrics_file && !cc.metrics_listen)
        return true;
    char err[300];
    if (apir_server_control(srv, &cc, err, sizeof(err)))
        return true;
    /* A metrics file or listener asked for, or a control socket named, must work. */
    if (explicit_path || !cc.path || !strncmp(err, "--metrics-", 10)) {
        fatal("%s", err);
        return false;
    }
    APIR_WARN("host", "no control socket (apir stat, apir ps): %s", err);
    cc.path = NULL;
    if ((!cc.metrics_file && !cc.metrics_listen) || apir_server_control(srv, &cc, err, sizeof(err)))
        return true;
    fatal("%s", err);
    return false;
}

/* The token file's first line (1-64 bytes).  A file others may read is
 * said in the log: the token is the only key to the stream listeners. */
static bool read_token_file(const char *path, char *token, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        fatal("--token-file %s: %s", path, strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0077))
        APIR_WARN("host", "--token-file %s is readable by others (mode %04o): chmod 600 it", path,
                  (unsigned)(st.st_mode & 07777));
    char line[APIR_STREAM_TOKEN_MAX + 2] = "";
    bool ok = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    if (!ok || !*line || strlen(line) > APIR_STREAM_TOKEN_MAX) {
        fatal("--token-file %s: the first line must hold the token, 1 to %u bytes", path, APIR_STREAM_TOKEN_MAX);
        explicit_bzero(line, sizeof(line));
        return false;
    }
    snprintf(token, len, "%s", line);
    explicit_bzero(line, sizeof(line));
    return true;
}

/* An option's value, else its environment variable's; NULL if neither. */
static const char *opt_or_env(const char *opt, const char *env)
{
    const char *v = opt ? opt : getenv(env);
    return v && *v ? v : NULL;
}

/* A file that holds a secret and that others may read: said in the log. */
static void warn_readable(const char *what, const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 0077))
        APIR_WARN("host", "%s %s is readable by others (mode %04o): chmod 600 it", what, path,
                  (unsigned)(st.st_mode & 07777));
}

/*
 * The tls: credentials: --tls-psk-file's keys and/or --tls-cert, --tls-key
 * and --tls-client-ca (or their APIR_HOST_TLS_* variables).  The daemon
 * loads them to check them (and uses them with --isolation thread); a
 * worker loads them again, before its sandbox.  False with err on a file
 * that does not load or options that do not go together; *out NULL when
 * nothing is named.
 */
static bool load_tls(const struct args *a, struct apir_tls_keys **out, char *err, size_t err_len)
{
    const char *psk = opt_or_env(a->tls_psk_file, "APIR_HOST_TLS_PSK_FILE");
    const char *cert = opt_or_env(a->tls_cert, "APIR_HOST_TLS_CERT_FILE");
    const char *key = opt_or_env(a->tls_key, "APIR_HOST_TLS_KEY_FILE");
    const char *ca = opt_or_env(a->tls_client_ca, "APIR_HOST_TLS_CLIENT_CA_FILE");
    *out = NULL;
    if (!cert != !key || (ca && !cert)) {
        snprintf(err, err_len, "%s", ca && !cert ? "--tls-client-ca needs the host's certificate: --tls-cert and --tls-key"
                                                 : "--tls-cert and --tls-key go together: give both");
        return false;
    }
    struct apir_tls_keys *k = psk ? apir_tls_keys_load(psk, false, err, err_len) : NULL;
    if (psk && !k)
        return false;
    if (cert && !(k = apir_tls_keys_add_certs(k, cert, key, ca, err, err_len)))
        return false;
    *out = k;
    return true;
}

/* --token-file and the stream listeners (--listen tcp:/vsock:). */
static bool setup_streams(const struct args *a, struct apir_server *srv)
{
    char err[256], token[APIR_STREAM_TOKEN_MAX + 1];
    const char *file = a->token_file ? a->token_file : getenv("APIR_HOST_TOKEN_FILE");
    if (file && *file) {
        bool ok = read_token_file(file, token, sizeof(token)) && apir_server_set_token(srv, token, err, sizeof(err));
        explicit_bzero(token, sizeof(token));
        if (!ok)
            return false;
    }
    struct apir_tls_keys *keys;
    if (!load_tls(a, &keys, err, sizeof(err))) {
        fatal("%s", err);
        return false;
    }
    const char *psk = opt_or_env(a->tls_psk_file, "APIR_HOST_TLS_PSK_FILE");
    const char *key = opt_or_env(a->tls_key, "APIR_HOST_TLS_KEY_FILE");
    if (psk) {
        warn_readable("--tls-psk-file", psk);
        APIR_INFO("host", "%zu TLS key(s) from %s", apir_tls_keys_count(keys), psk);
    }
    if (apir_tls_keys_has_cert(keys)) {
        warn_readable("--tls-key", key);
        APIR_INFO("host", "TLS certificate from %s%s%s", opt_or_env(a->tls_cert, "APIR_HOST_TLS_CERT_FILE"),
                  apir_tls_keys_has_ca(keys) ? "; guests' certificates must chain to " : "; no --tls-client-ca: guests "
                  "are not asked for a certificate", apir_tls_keys_has_ca(keys) ?
                  opt_or_env(a->tls_client_ca, "APIR_HOST_TLS_CLIENT_CA_FILE") : "");
    }
    if (keys)
        apir_server_set_tls_keys(srv, keys);
    for (unsigned i = 0; i < a->n_streams; i++)
        if (!apir_server_listen_stream(srv, a->streams[i], err, sizeof(err))) {
            /* EAFNOSUPPORT: what systemd's RestrictAddressFamilies= makes of it. */
            fatal("%s%s", err, strstr(err, strerror(EAFNOSUPPORT)) ? " (a service manager's sandbox? the systemd unit "
                  "serves this machine only: docs/DEPLOY.md, \"Guests over the network\")" : "");
            return false;
        }
    return true;
}

int main(int argc, char **argv)
{
    /* SIGHUP is sighup_thread's: blocked before any thread exists (the
     * backend's, the weight cache's), so none of them takes it. */
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hup, NULL);
    static struct args a;
    apir_host_config_default(&a.cfg);
    apir_sandbox_config_default(&a.sandbox);
    a.isolate = true;
    a.serve_fd = -1;
    a.serve_stream_fd = -1;
    a.lane_fd = -1;
    a.stats_fd = -1;
    a.weight_cache_fd = -1;
    a.log_fd = -1;
    a.worker_uid = -1;
    a.metrics_interval_s = APIR_METRICS_INTERVAL_DEFAULT_S;
    apir_server_listen_options_default(&a.listen);  /* the environment's; options override */
    apir_shm_default_path(a.path, sizeof(a.path));
    char default_socket[sizeof(a.path) + 8];
    snprintf(default_socket, sizeof(default_socket), "unix:%s", a.path);
    /* A log setting that is not one is refused like a bad option, not
     * silently replaced by a default. */
    char err[300];
    if (!apir_log_check_env(err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s\n", err);
        return EXIT_USAGE;
    }
    apir_log_set_level(APIR_LOG_INFO);
    if (getenv("APIR_LOG_LEVEL")) {
        enum apir_log_level l;
        if (apir_log_level_from_string(getenv("APIR_LOG_LEVEL"), &l) == 0)
            apir_log_set_level(l);
    }

    int rc = parse_args(&a, argc, argv);
    char dir_buf[PATH_MAX];
    const char *dir_source = "--backend-dir";
    const char *backend_dir = a.backend_dir ? a.backend_dir : apir_host_default_backend_dir(dir_buf, sizeof(dir_buf), &dir_source);
    if (rc != EXIT_OK)
        return rc;
    if (a.help) {
        const struct help_values hv = { .generic = a.help_generic, .socket = default_socket, .backend_dir = backend_dir,
                                        .backend_dir_source = dir_source };
        usage(stdout, &hv);
        return EXIT_OK;
    }
    if (a.version) {
        APIR_PRINT_VERSION(stdout, "apir-host");
        return EXIT_OK;
    }
    /* One process for every guest: what a guest that compromises it
     * reaches is every other guest and the daemon's rights. */
    if (!a.isolate && !a.insecure_shared_process && !a.list && a.serve_fd < 0 && a.serve_stream_fd < 0) {
        fprintf(stderr, "apir-host: --isolation thread serves every guest in this one process, unsandboxed: a guest "
                        "that compromises it reaches every other guest and this process's rights.  For trusted "
                        "guests only: add --insecure-shared-process to start it anyway\n");
        return EXIT_USAGE;
    }
    const bool worker = a.serve_fd >= 0 || a.serve_stream_fd >= 0;
    /* Huge pages for the host's buffers (host/data/buffers.c), decided by
     * apir_host_config_default above, before any thread and before a
     * worker's sandbox: a daemon's workers inherit the answer and do not
     * read /sys again (a worker of libapir-virgl.so, whose parent did not
     * decide, read it above). */
    if (!a.list && !getenv("APIR_HOST_HUGEPAGES"))
        setenv("APIR_HOST_HUGEPAGES", a.cfg.huge_pages ? "1" : "0", 1);
    if (worker) {
        /* The daemon reads this worker's stderr (worker_log.c) and logs
         * each line again, stamped and named by the guest it knows. */
        if (a.log_fd >= 0 && a.log_fd != STDERR_FILENO) {
            dup2(a.log_fd, STDERR_FILENO);
            close(a.log_fd);
            apir_log_set_plain_stderr();
        }
        /* The backend's load lines: the daemon said them at its start. */
        apir_log_relay_demote_info(true);
        signal(SIGHUP, SIG_IGN);
        pthread_sigmask(SIG_UNBLOCK, &hup, NULL);
    } else if (!a.list) {
        if (a.log_file && !apir_log_set_file(a.log_file, err, sizeof(err))) {
            fprintf(stderr, "apir-host: --log-file %s\n", err);
            return EXIT_USAGE;
        }
        pthread_t t;
        if (pthread_create(&t, NULL, sighup_thread, NULL) != 0)
            return fatal("cannot start the SIGHUP thread");
        pthread_detach(t);
    }
    struct apir_host_config cfg = a.cfg;
    cfg.backend_dir = backend_dir;
    if (!apir_host_check_backend_dir(backend_dir, err, sizeof(err)))
        return fatal("%s (from %s)", err, dir_source);
    if (a.list) {
        printf("backend directory: %s (%s)\n", backend_dir ? backend_dir : "none", dir_source);
        apir_host_print_devices(backend_dir, stdout);
        if (apir_host_usable_backend_count() == 0) {
            fprintf(stderr, "apir-host: no usable ggml backend found in %s\n", backend_dir ? backend_dir : "ggml's search path");
            return EXIT_FAIL;
        }
        return EXIT_OK;
    }
    struct apir_host host;
    signal(SIGPIPE, SIG_IGN);
    if (a.serve_fd >= 0 || a.serve_stream_fd >= 0) {
        /* A worker process: one guest, then exit. */
        struct sigaction stop = { .sa_handler = on_worker_stop };
        sigemptyset(&stop.sa_mask);
        sigaction(SIGTERM, &stop, NULL);
        sigaction(SIGINT, &stop, NULL);
        if (!apir_sandbox_worker_start(&a.sandbox, a.worker_uid, err, sizeof(err)))
            return fatal("worker: sandbox: %s", err);
#ifdef APIR_VIRGL_WORKER
        /* A virtio-gpu context's worker: the backend library its hypervisor
         * named; a failure ends it with initialize's code (backend_lib.h). */
        if (a.backend_library) {
            const uint32_t code = apir_virgl_backend_open(&host, &cfg, a.backend_library, a.backend_reg);
            if (code)
                return (int)code;
        } else
#endif
        if (!apir_host_init(&host, &cfg, err, sizeof(err)))
            return fatal("worker: %s", err);
        /* The stats page the daemon made for this worker: mapped now,
         * before the sandbox; its descriptor is not kept. */
        struct apir_stats_page *stats = map_stats_page(a.stats_fd);
        /* A tls: guest's keys and certificates, read while files can
         * still be opened. */
        struct apir_tls_keys *tls_keys = NULL;
        if (a.serve_stream_fd >= 0 && a.stream_tls) {
            const bool loaded = load_tls(&a, &tls_keys, err, sizeof(err));
            if (!loaded || !tls_keys)
                return fatal("worker: %s", loaded ? "--stream-tls without TLS keys or certificates" : err);
        }
        /* The weight cache is the daemon's: this worker asks it over its
         * socket (weight_cache.h), never opens the directory. */
        host.weight_cache = apir_wcache_link_remote(a.weight_cache_fd);
#ifdef APIR_TEST_HOOKS
        apir_test_attack_prepare();
#endif
        if (a.worker_slot >= cfg.limits.max_clients ||
            !apir_sandbox_enter(&a.sandbox, &host, a.worker_uid, err, sizeof(err)))
            return fatal("worker: sandbox: %s", a.worker_slot >= cfg.limits.max_clients ? "bad slot" : err);
#ifdef APIR_TEST_HOOKS
        apir_test_attack_run(a.serve_fd >= 0 ? a.serve_fd : a.serve_stream_fd);
#endif
        const struct ucred *peer = a.peer_given ? &a.peer : NULL;
        int wrc = (a.serve_fd >= 0 ? apir_server_serve_shm_fd(&host, a.serve_fd, a.client_id, stats, peer)
                                   : apir_server_serve_stream_fd(&host, a.serve_stream_fd, a.client_id, stats, a.peer_name,
                                                          tls_keys, a.lane_fd)) == 0
                      ? 0
                      : 1;
        /* Ends without exit-time handlers: what they may do is no longer
         * allowed here (LeakSanitizer's exit check clones a tracer and
         * ptraces; a backend's destructors may open files).  The guest's
         * session was freed above; the kernel takes the rest. */
        fflush(NULL);
        _exit(wrc);
    }
    /* With process isolation the daemon itself never touches a backend
     * (workers do): this only checks that the chosen backend exists. */
    if (!apir_host_init(&host, &cfg, err, sizeof(err)))
        return fatal("%s", err);
    APIR_INFO("host", "backends from %s (%s)", backend_dir ? backend_dir : "ggml's search path", dir_source);
    if (cfg.n_threads > 0 && ggml_backend_reg_get_proc_address(host.reg, "ggml_backend_set_n_threads"))
        APIR_INFO("host", "%d CPU thread(s) per guest%s", cfg.n_threads,
                  cfg.n_threads == apir_host_default_threads() ? " (the cores this process may use)" : "");
    if (!a.isolate)
        APIR_WARN("host", "--isolation thread --insecure-shared-process: every guest is served in this one "
                  "unsandboxed process; use it for trusted guests only");
    if (a.isolate && !apir_workers_sandbox(&a.sandbox, host.cfg.limits.max_clients, err, sizeof(err)))
        return fatal("%s", err);
    /* The weight cache: sessions use it directly in thread mode; with
     * workers, this process serves it to them from a thread of its own. */
    if (cfg.weight_cache_dir) {
        struct apir_wcache *wc = apir_wcache_open(cfg.weight_cache_dir, cfg.weight_cache_max_bytes, err, sizeof(err));
        if (!wc || (a.isolate && !apir_wcache_service_start(wc, err, sizeof(err))))
            return fatal("%s", err);
        if (!a.isolate)
            host.weight_cache = apir_wcache_link_local(wc);
        APIR_INFO("host", "weight cache in %s: a guest can tell whether another guest sent the same weights "
                  "(docs/SECURITY.md)", cfg.weight_cache_dir);
    }
    if (a.isolate && !a.sandbox.enabled)
        APIR_WARN("host", "--no-sandbox: workers run with the daemon's privileges and every syscall (debugging only)");
    g_server = apir_server_listen(&host, a.path, &a.listen, err, sizeof(err));
    if (!g_server)
        return fatal("%s", err);
    /* From here every way out frees the server: its socket files go. */
    if ((a.isolate && !apir_server_isolate(g_server, argv) && fatal("cannot set up worker processes")) ||
        !setup_streams(&a, g_server) || !setup_control(&a, g_server)) {
        apir_server_free(g_server);
        return EXIT_FAIL;
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    APIR_INFO("host", "serving %s (%u device(s)) on unix:%s, %s per guest", ggml_backend_reg_name(host.reg), host.n_devices,
              apir_server_path(g_server), a.isolate ? "one process" : "one thread");
    log_shmem_pages();
    rc = apir_server_run(g_server);
    APIR_INFO("host", "shutting down");
    apir_server_free(g_server);
    g_server = NULL;
    return rc == 0 ? EXIT_OK : EXIT_FAIL;
}
