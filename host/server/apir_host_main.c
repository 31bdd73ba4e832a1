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
 * The command line (getopt_long): every option in long_opts below, with
 * --opt VALUE and --opt=VALUE; the short letters are those rpc-server users
 * know (-H -p -d -t -c) where they fit.  A new option is a row in long_opts,
 * a line in usage() and a case in parse_args().
 */
#include "apir_build.h"
#include "apir_log.h"
#include "control.h"
#include "host.h"
#include "host_stats.h"
#include "sandbox.h"
#include "shm_server.h"
#include "net.h"
#include "stream_proto.h"
#include "tls.h"
#include "weight_cache.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef APIR_TEST_HOOKS
/* tests/worker_attack.c, linked into the test build apir-host-hooks only:
 * "attacker code" run inside a sandboxed worker (tests/test_hostile.c). */
void apir_test_attack_prepare(void);
void apir_test_attack_run(int guest_fd);
#endif

/* Exit statuses (usage() and the README list them). */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static struct apir_shm_server *g_server;  /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    if (g_server)
        apir_shm_server_stop(g_server);
}

/* A worker asked to stop (the daemon's shutdown, or ^C reaching the whole
 * process group) ends quietly: its end is expected, not a crash to report. */
static void on_worker_stop(int sig)
{
    (void)sig;
    _exit(0);
}

/* Long-only options have ids above the character range. */
enum {
    OPT_VERSION = 256,
    OPT_BACKEND_DIR,
    OPT_LIST_DEVICES,
    OPT_LOG_LEVEL,
    OPT_ISOLATION,
    OPT_INSECURE_SHARED_PROCESS,
    OPT_WORKER_UID_BASE,
    OPT_NO_SANDBOX,
    OPT_SANDBOX_LOG,
    OPT_SANDBOX_ALLOW,
    OPT_MAX_CLIENTS,
    OPT_MAX_BUFFERS,
    OPT_MAX_ALLOC_MIB,
    OPT_MAX_GRAPH_NODES,
    OPT_MAX_GRAPH_TENSORS,
    OPT_MAX_BLOBS,
    OPT_MAX_BLOB_MIB,
    OPT_MAX_CLIENTS_PER_UID,
    OPT_MAX_CLIENTS_PER_TENANT,
    OPT_TENANT_BY,
    OPT_CONNECT_RATE,
    OPT_CONNECT_BURST,
    OPT_SPAWN_RATE,
    OPT_SPAWN_BURST,
    OPT_GUEST_LOG_RATE,
    OPT_GUEST_LOG_BURST,
    OPT_HANDSHAKE_TIMEOUT_MS,
    OPT_GRAPH_TIMEOUT_MS,
    OPT_SOCKET_MODE,
    OPT_SOCKET_GROUP,
    OPT_CONTROL,
    OPT_CONTROL_GROUP,
    OPT_METRICS_FILE,
    OPT_METRICS_INTERVAL,
    OPT_WEIGHT_CACHE,
    OPT_TOKEN_FILE,
    OPT_TLS_PSK_FILE,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_CLIENT_CA,
    OPT_WEIGHT_CACHE_MAX_GIB,
    /* internal: how the daemon starts a worker (workers.c) */
    OPT_SERVE_FD,
    OPT_SERVE_STREAM_FD,
    OPT_PEER_NAME,
    OPT_STREAM_TLS,
    OPT_CLIENT_ID,
    OPT_WORKER_SLOT,
    OPT_WORKER_UID,
    OPT_PEER_CRED,
    OPT_STATS_FD,
    OPT_WEIGHT_CACHE_FD,
};

/* Leading colon: a missing value is reported as such (case ':'). */
static const char short_opts[] = ":hH:l:p:b:d:t:c";

static const struct option long_opts[] = {
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, OPT_VERSION },
    { "listen", required_argument, NULL, 'l' },
    { "host", required_argument, NULL, 'H' },
    { "port", required_argument, NULL, 'p' },
    { "backend", required_argument, NULL, 'b' },
    { "device", required_argument, NULL, 'd' },
    { "threads", required_argument, NULL, 't' },
    { "cache", no_argument, NULL, 'c' },
    { "backend-dir", required_argument, NULL, OPT_BACKEND_DIR },
    { "list-devices", no_argument, NULL, OPT_LIST_DEVICES },
    { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
    { "isolation", required_argument, NULL, OPT_ISOLATION },
    { "insecure-shared-process", no_argument, NULL, OPT_INSECURE_SHARED_PROCESS },
    { "worker-uid-base", required_argument, NULL, OPT_WORKER_UID_BASE },
    { "no-sandbox", no_argument, NULL, OPT_NO_SANDBOX },
    { "sandbox-log", no_argument, NULL, OPT_SANDBOX_LOG },
    { "sandbox-allow", required_argument, NULL, OPT_SANDBOX_ALLOW },
    { "max-clients", required_argument, NULL, OPT_MAX_CLIENTS },
    { "max-buffers", required_argument, NULL, OPT_MAX_BUFFERS },
    { "max-alloc-mib", required_argument, NULL, OPT_MAX_ALLOC_MIB },
    { "max-graph-nodes", required_argument, NULL, OPT_MAX_GRAPH_NODES },
    { "max-graph-tensors", required_argument, NULL, OPT_MAX_GRAPH_TENSORS },
    { "max-blobs", required_argument, NULL, OPT_MAX_BLOBS },
    { "max-blob-mib", required_argument, NULL, OPT_MAX_BLOB_MIB },
    { "max-clients-per-uid", required_argument, NULL, OPT_MAX_CLIENTS_PER_UID },  /* the old name: per tenant */
    { "max-clients-per-tenant", required_argument, NULL, OPT_MAX_CLIENTS_PER_TENANT },
    { "tenant-by", required_argument, NULL, OPT_TENANT_BY },
    { "connect-rate", required_argument, NULL, OPT_CONNECT_RATE },
    { "connect-burst", required_argument, NULL, OPT_CONNECT_BURST },
    { "spawn-rate", required_argument, NULL, OPT_SPAWN_RATE },
    { "spawn-burst", required_argument, NULL, OPT_SPAWN_BURST },
    { "guest-log-rate", required_argument, NULL, OPT_GUEST_LOG_RATE },
    { "guest-log-burst", required_argument, NULL, OPT_GUEST_LOG_BURST },
    { "handshake-timeout-ms", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT_MS },
    { "graph-timeout-ms", required_argument, NULL, OPT_GRAPH_TIMEOUT_MS },
    { "socket-mode", required_argument, NULL, OPT_SOCKET_MODE },
    { "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
    { "control", required_argument, NULL, OPT_CONTROL },
    { "control-group", required_argument, NULL, OPT_CONTROL_GROUP },
    { "metrics-file", required_argument, NULL, OPT_METRICS_FILE },
    { "metrics-interval", required_argument, NULL, OPT_METRICS_INTERVAL },
    { "weight-cache", required_argument, NULL, OPT_WEIGHT_CACHE },
    { "weight-cache-max-gib", required_argument, NULL, OPT_WEIGHT_CACHE_MAX_GIB },
    { "serve-fd", required_argument, NULL, OPT_SERVE_FD },
    { "serve-stream-fd", required_argument, NULL, OPT_SERVE_STREAM_FD },
    { "peer-name", required_argument, NULL, OPT_PEER_NAME },
    { "token-file", required_argument, NULL, OPT_TOKEN_FILE },
    { "tls-psk-file", required_argument, NULL, OPT_TLS_PSK_FILE },
    { "tls-cert", required_argument, NULL, OPT_TLS_CERT },
    { "tls-key", required_argument, NULL, OPT_TLS_KEY },
    { "tls-client-ca", required_argument, NULL, OPT_TLS_CLIENT_CA },
    { "stream-tls", no_argument, NULL, OPT_STREAM_TLS },
    { "client-id", required_argument, NULL, OPT_CLIENT_ID },
    { "worker-slot", required_argument, NULL, OPT_WORKER_SLOT },
    { "worker-uid", required_argument, NULL, OPT_WORKER_UID },
    { "peer-cred", required_argument, NULL, OPT_PEER_CRED },
    { "stats-fd", required_argument, NULL, OPT_STATS_FD },
    { "weight-cache-fd", required_argument, NULL, OPT_WEIGHT_CACHE_FD },
    { NULL, 0, NULL, 0 },
};

static void usage(FILE *out, const char *default_socket, const char *backend_dir, const char *backend_dir_source)
{
    fprintf(out,
            "usage: apir-host [options]\n"
            "Serves a ggml backend (CPU, CUDA, Vulkan...) to ggml programs that load libggml-apir.so.\n"
            "Options take their value as --opt VALUE or --opt=VALUE.\n"
            "  -h, --help               this help, then exit\n"
            "      --version            apir's version, the APIR protocol version and the ggml it was built against\n"
            "  -l, --listen ENDPOINT    where guests connect; repeatable (one unix: socket, up to 4 streams):\n"
            "                           unix:PATH  this machine, shared memory (default %s,\n"
            "                                      served even when only streams are named)\n"
            "                           tcp:HOST:PORT, tcp:[V6]:PORT  other machines: data in the stream; an\n"
            "                                      address other machines reach needs a token\n"
            "                           vsock:CID:PORT  VMs without virtio-gpu (Firecracker, Kata...)\n"
            "  -H, --host ENDPOINT      the same (rpc-server's -H)\n"
            "  -p, --port N             refused: say --listen tcp:HOST:PORT\n"
            "                           tls:HOST:PORT  the same over TLS 1.3, guests authenticated by key\n"
            "                                      or certificate\n"
            "      --tls-psk-file FILE  tls: guests' keys, lines IDENTITY:HEXKEY (16-64 bytes; psktool's format);\n"
            "                           a guest gives its own line (APIR_TLS_PSK_FILE); logs name the identity\n"
            "      --tls-cert FILE      tls: the host's certificate chain (PEM; guests check it with\n"
            "                           APIR_TLS_CA_FILE), with --tls-key FILE, its private key (PEM)\n"
            "      --tls-client-ca FILE tls: CA certificates (PEM) guests' certificates must chain to; logs name\n"
            "                           the subject.  Without it any guest gets in: loopback addresses only.\n"
            "                           Keys and certificates may be given together (a guest uses either)\n"
            "      --token-file FILE    tcp: guests must present this token (first line, 1-64 bytes; the\n"
            "                           guest's APIR_TOKEN_FILE or APIR_TOKEN); it travels in clear: trusted\n"
            "                           networks only (tls: encrypts)\n"
            "      --socket-mode MODE   permissions of the socket file (octal; default 0660: owner and group\n"
            "                           may connect); not used when systemd passes the socket (SocketMode=)\n"
            "      --socket-group GROUP group of the socket file (name or gid; default: the daemon's group);\n"
            "                           not used when systemd passes the socket (SocketGroup=)\n"
            "  -b, --backend NAME       ggml backend (CPU, CUDA, Vulkan...; default: the first GPU's, else CPU)\n"
            "  -d, --device N|NAME      serve only device N of the backend, or the device named NAME\n"
            "                           (CUDA0, CPU...: --list-devices; default: every device of the backend)\n"
            "  -t, --threads N          CPU backend threads (default %d: the cores this process may use,\n"
            "                           within its cgroup's CPU quota; 0: the backend's own default)\n"
            "  -c, --cache              accepted for rpc-server's -c and ignored: the host maps a guest's model\n"
            "                           file directly, there is nothing to cache\n"
            "      --backend-dir DIR    where ggml's backend libraries are (default: $APIR_BACKEND_DIR, else\n"
            "                           %s from this program's folder, as installed)\n"
            "                           here: %s (%s)\n"
            "      --list-devices       list the backends and devices found, then exit\n"
            "      --log-level LEVEL    error|warn|info|debug (default info, or $APIR_LOG_LEVEL)\n"
            "      --isolation MODE     process: each guest in its own sandboxed worker process (default);\n"
            "                           thread: all guests in this process, unsandboxed - TRUSTED GUESTS ONLY\n"
            "                           (a guest that crashes or compromises it reaches every other guest, and\n"
            "                           the daemon's rights): refused without --insecure-shared-process\n"
            "      --insecure-shared-process  let --isolation thread start (never for untrusted guests)\n"
            "worker sandbox (process isolation):\n"
            "      --worker-uid-base N  each worker runs as a uid/gid of its own from N up, none shared by two\n"
            "                           live workers (default %u; root, or CAP_SETUID and CAP_SETGID)\n"
            "      --no-sandbox         workers keep the daemon's uid and every syscall (debugging only)\n"
            "      --sandbox-log        name each refused syscall in the worker's log (still refused)\n"
            "      --sandbox-allow LIST also allow these syscalls (comma-separated names), e.g. for a GPU driver;\n"
            "                           not those that would undo the sandbox (sendmsg, kill, setuid...)\n"
            "limits per guest (over a limit the call fails; other guests go on):\n"
            "      --max-clients N      concurrent guests (64)\n"
            "      --max-buffers N      live buffers (4096)\n"
            "      --max-alloc-mib N    MiB in live buffers (default: half the devices' memory, at least\n"
            "                           1024; 0: no limit)\n"
            "      --max-graph-nodes N  nodes per graph (65536)\n"
            "      --max-graph-tensors N  tensors per graph (262144)\n"
            "      --max-blobs N        shared-memory blobs (1024)\n"
            "      --max-blob-mib N     MiB of shared memory mapped (half the RAM, at most 65536)\n"
            "denial of service:\n"
            "      --tenant-by cgroup|uid  what tells local guests apart: cgroup (default): their container\n"
            "                           (cgroup and uid, read at connect; the uid when unreadable); uid: their\n"
            "                           uid.  A stream guest's tenant is its address (an IPv6 /64).  Every limit\n"
            "                           below is per tenant: one tenant's connections cost no other tenant\n"
            "      --max-clients-per-tenant N  connections of one tenant, waiting or served, root's too (16; 0: no\n"
            "                           limit; 64 guests of one tenant: 64, with --spawn-burst 64)\n"
            "      --connect-rate N     new connections per second of one tenant, before their hello (50;\n"
            "                           0: no limit), --connect-burst N at once (100)\n"
            "      --spawn-rate N       guests started per second of one tenant, once their hello is in (20;\n"
            "                           0: no limit), --spawn-burst N at once (40)\n"
            "      --handshake-timeout-ms N  a connection's hello must come by then (5000; at most 600000)\n"
            "      --graph-timeout-ms N one command's time; a worker over it is ended (60000; 0: none)\n"
            "      --guest-log-rate N   log lines a guest's commands may cause a second (10; 0: no limit), then\n"
            "                           one \"N log lines suppressed\" line; --guest-log-burst N at once (100)\n"
            "what the host does (apir stat, apir ps):\n"
            "      --control unix:PATH  control socket (default: the socket's path + \".ctl\"; none: no control\n"
            "                           socket); mode 0600: only root and the host's user may read it\n"
            "      --control-group GROUP  ... mode 0660 and this group: its members may read it too\n"
            "      --metrics-file PATH  write Prometheus metrics there (node_exporter's textfile collector),\n"
            "                           atomically, every --metrics-interval seconds; removed at exit\n"
            "      --metrics-interval S seconds between two metrics files (default %d; 1 to 86400)\n"
            "weight cache (off by default; docs/SECURITY.md: a hit tells a guest that some guest sent those bytes):\n"
            "      --weight-cache DIR   keep guests' weights by SHA-256 in DIR (created 0700; or\n"
            "                           $APIR_HOST_WEIGHT_CACHE): a guest reloading a model the host has seen\n"
            "                           sends hashes, not bytes; the host stores only bytes it hashed itself\n"
            "      --weight-cache-max-gib N  bound DIR to N GiB, evicting the least recently used entries\n"
            "                           (default 64, or $APIR_HOST_WEIGHT_CACHE_MAX_GIB; 0: no bound)\n"
            "exit status: 0 stopped by SIGTERM or SIGINT, or --help, --version, --list-devices done;\n"
            "             1 cannot serve (no backend or device, bad backend directory, socket in use...);\n"
            "             2 bad command line\n",
            default_socket, apir_host_default_threads(), APIR_BIN_TO_GGML, backend_dir ? backend_dir : "none found",
            backend_dir_source, APIR_SANDBOX_UID_BASE_DEFAULT, APIR_METRICS_INTERVAL_DEFAULT_S);
}

static const char *opt_name(int id)
{
    for (const struct option *o = long_opts; o->name; o++)
        if (o->val == id)
            return o->name;
    return "?";
}

/* A decimal number from min to max, or a message and false. */
static bool num_arg(int id, const char *v, unsigned long long min, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long n = 0;
    if (v && *v >= '0' && *v <= '9')
        n = strtoull(v, &end, 10);
    if (!end || *end || errno || n < min || n > max) {
        fprintf(stderr, "apir-host: --%s: '%s' is not a number from %llu to %llu\n", opt_name(id), v ? v : "", min, max);
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

struct args {
    struct apir_host_config cfg;
    struct apir_sandbox_config sandbox;
    char path[108];
    struct apir_shm_listen_options listen;  /* the socket file's mode and group */
    bool list, isolate, version, help;
    bool insecure_shared_process;  /* --insecure-shared-process: --isolation thread may start */
    const char *backend_dir;     /* --backend-dir, else NULL */
    int serve_fd, stats_fd;
    int serve_stream_fd;         /* a worker serving a stream guest (--serve-stream-fd) */
    const char *peer_name;       /* its address (--peer-name), for log lines */
    char streams[APIR_MAX_NET_LISTENERS][128];  /* --listen tcp:/vsock: */
    unsigned n_streams;
    const char *token_file;
    const char *tls_psk_file;    /* --tls-psk-file: IDENTITY:HEXKEY lines */
    const char *tls_cert, *tls_key, *tls_client_ca;  /* --tls-cert, --tls-key, --tls-client-ca (PEM) */
    bool stream_tls;             /* a worker: handshake first (--stream-tls) */
    int weight_cache_fd;         /* a worker's line to the daemon's weight cache (weight_cache.h), or -1 */
    unsigned long long worker_slot, client_id;
    long long worker_uid;        /* a worker: the uid the daemon gave it (--worker-uid), or -1 */
    struct ucred peer;           /* a worker: its guest as the daemon saw it (--peer-cred PID:UID:GID) */
    bool peer_given;
    /* the control socket (control.h): NULL path and !control_none: beside
     * the guest socket */
    char control_path[108];
    bool control_none;
    const char *control_group, *metrics_file;
    unsigned metrics_interval_s;
};

/* EXIT_OK to go on; else the exit status (a message was printed). */
static int parse_args(struct args *a, int argc, char **argv)
{
    int c;
    opterr = 0;  /* our own messages, with the option's name */
    while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        unsigned long long n = 0;
#define NUM(lo, hi) do { if (!num_arg(c, optarg, (lo), (hi), &n)) return EXIT_USAGE; } while (0)
        switch (c) {
        case 'h':
            a->help = true;
            break;
        case OPT_VERSION:
            a->version = true;
            break;
        case 'l':
        case 'H':
            if (apir_net_is_stream(optarg)) {
                struct apir_net_addr na;
                char nerr[160];
                if (!apir_net_parse(optarg, &na, nerr, sizeof(nerr))) {
                    fprintf(stderr, "apir-host: --listen: %s\n", nerr);
                    return EXIT_USAGE;
                }
                if (a->n_streams == APIR_MAX_NET_LISTENERS || strlen(optarg) >= sizeof(a->streams[0])) {
                    fprintf(stderr, "apir-host: --listen %s: at most %u stream endpoints of up to %zu bytes\n", optarg,
                            APIR_MAX_NET_LISTENERS, sizeof(a->streams[0]) - 1);
                    return EXIT_USAGE;
                }
                snprintf(a->streams[a->n_streams++], sizeof(a->streams[0]), "%s", optarg);
            } else if (!parse_listen("--listen", optarg, a->path, sizeof(a->path))) {
                return EXIT_USAGE;
            }
            break;
        case 'p':
            fprintf(stderr, "apir-host: --port %s: say --listen tcp:HOST:PORT (an address other machines reach "
                    "needs --token-file)\n", optarg);
            return EXIT_USAGE;
        case OPT_TOKEN_FILE:
            a->token_file = optarg;
            break;
        case OPT_TLS_PSK_FILE:
            a->tls_psk_file = optarg;
            break;
        case OPT_TLS_CERT:
        case OPT_TLS_KEY:
        case OPT_TLS_CLIENT_CA:  /* checked together, when loaded (load_tls) */
            *(c == OPT_TLS_CERT ? &a->tls_cert : c == OPT_TLS_KEY ? &a->tls_key : &a->tls_client_ca) = optarg;
            break;
        case OPT_STREAM_TLS:
            a->stream_tls = true;
            break;
        case OPT_SERVE_STREAM_FD:
            NUM(0, INT_MAX);
            a->serve_stream_fd = (int)n;
            break;
        case OPT_PEER_NAME:
            a->peer_name = optarg;
            break;
        case 'b':
            a->cfg.backend_name = optarg;
            break;
        case 'd':
            if (*optarg >= '0' && *optarg <= '9') {
                NUM(0, APIR_HOST_MAX_DEVICES - 1);
                a->cfg.device = (int)n;
                a->cfg.device_name = NULL;
            } else if (*optarg && !strchr(optarg, ',')) {
                a->cfg.device_name = optarg;
                a->cfg.device = -1;
            } else {
                fprintf(stderr, "apir-host: --device %s: give one device, by number or name (one host serves "
                                "one device or all devices of one backend)\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 't':
            NUM(0, 1024);
            a->cfg.n_threads = (int)n;
            break;
        case 'c':
            fprintf(stderr, "apir-host: --cache ignored: the host maps a guest's model file directly, "
                            "there is nothing to cache\n");
            break;
        case OPT_BACKEND_DIR:
            a->backend_dir = optarg;
            break;
        case OPT_LIST_DEVICES:
            a->list = true;
            break;
        case OPT_LOG_LEVEL: {
            enum apir_log_level l;
            if (apir_log_level_from_string(optarg, &l) != 0) {
                fprintf(stderr, "apir-host: --log-level %s: use error, warn, info or debug\n", optarg);
                return EXIT_USAGE;
            }
            apir_log_set_level(l);
            break;
        }
        case OPT_ISOLATION:
            if (strcmp(optarg, "process") && strcmp(optarg, "thread")) {
                fprintf(stderr, "apir-host: --isolation %s: use process or thread\n", optarg);
                return EXIT_USAGE;
            }
            a->isolate = !strcmp(optarg, "process");
            break;
        case OPT_INSECURE_SHARED_PROCESS:
            a->insecure_shared_process = true;
            break;
        case OPT_WORKER_UID_BASE:
            NUM(1, 0xFFFFFFFEull);
            a->sandbox.uid_base = (uint32_t)n;
            break;
        case OPT_NO_SANDBOX:
            a->sandbox.enabled = false;
            break;
        case OPT_SANDBOX_LOG:
            a->sandbox.log_only = true;
            break;
        case OPT_SANDBOX_ALLOW:
            a->sandbox.extra_allow = optarg;
            break;
        case OPT_MAX_CLIENTS:
            NUM(1, 65536);
            a->cfg.limits.max_clients = (uint32_t)n;
            break;
        case OPT_MAX_BUFFERS:
            NUM(0, UINT32_MAX);
            a->cfg.limits.max_buffers = (uint32_t)n;
            break;
        case OPT_MAX_ALLOC_MIB:
            NUM(0, (UINT64_MAX >> 20) - 1);
            a->cfg.limits.max_alloc_bytes = n ? (uint64_t)n << 20 : UINT64_MAX;
            break;
        case OPT_MAX_GRAPH_NODES:
            NUM(0, UINT32_MAX);
            a->cfg.limits.max_graph_nodes = (uint32_t)n;
            break;
        case OPT_MAX_GRAPH_TENSORS:
            NUM(0, UINT32_MAX);
            a->cfg.limits.max_graph_tensors = (uint32_t)n;
            break;
        case OPT_MAX_BLOBS:
            NUM(0, UINT32_MAX);
            a->cfg.limits.max_blobs = (uint32_t)n;
            break;
        case OPT_MAX_BLOB_MIB:
            NUM(0, UINT64_MAX >> 20);
            a->cfg.limits.max_blob_bytes = (uint64_t)n << 20;
            break;
        case OPT_MAX_CLIENTS_PER_UID:
        case OPT_MAX_CLIENTS_PER_TENANT:
            NUM(0, UINT32_MAX);
            a->cfg.limits.max_clients_per_tenant = (uint32_t)n;
            break;
        case OPT_TENANT_BY:
            if (!strcmp(optarg, "cgroup")) {
                a->cfg.tenant_by = APIR_TENANT_BY_CGROUP;
            } else if (!strcmp(optarg, "uid")) {
                a->cfg.tenant_by = APIR_TENANT_BY_UID;
            } else {
                fprintf(stderr, "apir-host: --tenant-by wants cgroup or uid, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_CONNECT_RATE:
            NUM(0, UINT32_MAX);
            a->cfg.limits.connect_per_s = (uint32_t)n;
            break;
        case OPT_CONNECT_BURST:
            NUM(0, UINT32_MAX);
            a->cfg.limits.connect_burst = (uint32_t)n;
            break;
        case OPT_GUEST_LOG_RATE:
            NUM(0, UINT32_MAX);
            a->cfg.limits.guest_log_per_s = (uint32_t)n;
            break;
        case OPT_GUEST_LOG_BURST:
            NUM(0, UINT32_MAX);
            a->cfg.limits.guest_log_burst = (uint32_t)n;
            break;
        case OPT_SPAWN_RATE:
            NUM(0, UINT32_MAX);
            a->cfg.limits.spawn_per_s = (uint32_t)n;
            break;
        case OPT_SPAWN_BURST:
            NUM(0, UINT32_MAX);
            a->cfg.limits.spawn_burst = (uint32_t)n;
            break;
        case OPT_HANDSHAKE_TIMEOUT_MS:
            NUM(0, 600000);
            a->cfg.limits.handshake_timeout_ms = (uint32_t)n;
            break;
        case OPT_GRAPH_TIMEOUT_MS:
            NUM(0, UINT32_MAX);
            a->cfg.limits.graph_timeout_ms = (uint32_t)n;
            break;
        case OPT_SOCKET_MODE:
            if (apir_shm_parse_socket_mode(optarg, &a->listen.mode) != 0) {
                fprintf(stderr, "apir-host: --socket-mode wants an octal mode from 0 to 0777, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_SOCKET_GROUP:
            a->listen.group = optarg;
            break;
        case OPT_CONTROL:
            a->control_none = !strcmp(optarg, "none");
            a->control_path[0] = '\0';
            if (!a->control_none && !parse_listen("--control", optarg, a->control_path, sizeof(a->control_path)))
                return EXIT_USAGE;
            break;
        case OPT_CONTROL_GROUP:
            a->control_group = optarg;
            break;
        case OPT_METRICS_FILE:
            if (!*optarg) {
                fprintf(stderr, "apir-host: --metrics-file needs a file name\n");
                return EXIT_USAGE;
            }
            a->metrics_file = optarg;
            break;
        case OPT_METRICS_INTERVAL:
            NUM(1, 86400);
            a->metrics_interval_s = (unsigned)n;
            break;
        case OPT_SERVE_FD:
            NUM(0, INT_MAX);
            a->serve_fd = (int)n;
            break;
        case OPT_CLIENT_ID:
            NUM(0, UINT64_MAX);
            a->client_id = n;
            break;
        case OPT_WORKER_SLOT:
            NUM(0, UINT32_MAX);
            a->worker_slot = n;
            break;
        case OPT_WORKER_UID:
            NUM(1, 0xFFFFFFFEull);
            a->worker_uid = (long long)n;
            break;
        case OPT_PEER_CRED: {
            int pid = 0;
            unsigned uid = 0, gid = 0, used = 0;
            if (sscanf(optarg, "%d:%u:%u%n", &pid, &uid, &gid, &used) != 3 || optarg[used]) {
                fprintf(stderr, "apir-host: --peer-cred %s: not PID:UID:GID\n", optarg);
                return EXIT_USAGE;
            }
            a->peer = (struct ucred){ .pid = pid, .uid = uid, .gid = gid };
            a->peer_given = true;
            break;
        }
        case OPT_STATS_FD:
            NUM(0, INT_MAX);
            a->stats_fd = (int)n;
            break;
        case OPT_WEIGHT_CACHE:
            a->cfg.weight_cache_dir = *optarg ? optarg : NULL;
            break;
        case OPT_WEIGHT_CACHE_MAX_GIB:
            NUM(0, 1ull << 30);
            a->cfg.weight_cache_max_bytes = n << 30;
            break;
        case OPT_WEIGHT_CACHE_FD:
            NUM(0, INT_MAX);
            a->weight_cache_fd = (int)n;
            break;
        case ':':
            fprintf(stderr, "apir-host: %s needs a value (try --help)\n", argv[optind - 1]);
            return EXIT_USAGE;
        default:
            if (optopt && optopt < 256 && strncmp(argv[optind - 1], "--", 2) != 0)
                fprintf(stderr, "apir-host: unknown option -%c (try --help)\n", optopt);
            else
                fprintf(stderr, "apir-host: unknown or ambiguous option %s (try --help)\n", argv[optind - 1]);
            return EXIT_USAGE;
        }
#undef NUM
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
 * The control socket (default: beside the guest socket, PATH.ctl) and the
 * metrics file.  An explicit --control that cannot be bound stops the host;
 * the default one only warns (the host serves guests without it).
 */
static bool setup_control(const struct args *a, struct apir_shm_server *srv)
{
    char path[sizeof(a->control_path) + 8] = "";
    const bool explicit_path = a->control_path[0] != '\0';
    const char *sock = apir_shm_server_path(srv);
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
    };
    if (!cc.path && !cc.metrics_file)
        return true;
    char err[300];
    if (apir_shm_server_control(srv, &cc, err, sizeof(err)))
        return true;
    /* A metrics file asked for, or a control socket named, must work. */
    if (explicit_path || !cc.path || !strncmp(err, "--metrics-file", 14)) {
        fprintf(stderr, "apir-host: %s\n", err);
        return false;
    }
    APIR_WARN("host", "no control socket (apir stat, apir ps): %s", err);
    cc.path = NULL;
    if (!cc.metrics_file || apir_shm_server_control(srv, &cc, err, sizeof(err)))
        return true;
    fprintf(stderr, "apir-host: %s\n", err);
    return false;
}

/* The token file's first line (1-64 bytes).  A file others may read is
 * said in the log: the token is the only key to the stream listeners. */
static bool read_token_file(const char *path, char *token, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "apir-host: --token-file %s: %s\n", path, strerror(errno));
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
        fprintf(stderr, "apir-host: --token-file %s: the first line must hold the token, 1 to %u bytes\n", path,
                APIR_STREAM_TOKEN_MAX);
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
static bool setup_streams(const struct args *a, struct apir_shm_server *srv)
{
    char err[256], token[APIR_STREAM_TOKEN_MAX + 1];
    const char *file = a->token_file ? a->token_file : getenv("APIR_HOST_TOKEN_FILE");
    if (file && *file) {
        bool ok = read_token_file(file, token, sizeof(token)) && apir_shm_server_set_token(srv, token, err, sizeof(err));
        explicit_bzero(token, sizeof(token));
        if (!ok)
            return false;
    }
    struct apir_tls_keys *keys;
    if (!load_tls(a, &keys, err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s\n", err);
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
        apir_shm_server_set_tls_keys(srv, keys);
    for (unsigned i = 0; i < a->n_streams; i++)
        if (!apir_shm_server_listen_stream(srv, a->streams[i], err, sizeof(err))) {
            fprintf(stderr, "apir-host: %s\n", err);
            return false;
        }
    return true;
}

int main(int argc, char **argv)
{
    static struct args a;
    apir_host_config_default(&a.cfg);
    apir_sandbox_config_default(&a.sandbox);
    a.isolate = true;
    a.serve_fd = -1;
    a.serve_stream_fd = -1;
    a.stats_fd = -1;
    a.weight_cache_fd = -1;
    a.worker_uid = -1;
    a.metrics_interval_s = APIR_METRICS_INTERVAL_DEFAULT_S;
    apir_shm_listen_options_default(&a.listen);  /* the environment's; options override */
    apir_shm_default_path(a.path, sizeof(a.path));
    char default_socket[sizeof(a.path) + 8];
    snprintf(default_socket, sizeof(default_socket), "unix:%s", a.path);
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
        usage(stdout, default_socket, backend_dir, dir_source);
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
    struct apir_host_config cfg = a.cfg;
    cfg.backend_dir = backend_dir;
    char err[256];
    if (!apir_host_check_backend_dir(backend_dir, err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s (from %s)\n", err, dir_source);
        return EXIT_FAIL;
    }
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
        if (!apir_sandbox_worker_start(&a.sandbox, a.worker_uid, err, sizeof(err))) {
            fprintf(stderr, "apir-host worker: sandbox: %s\n", err);
            return EXIT_FAIL;
        }
        if (!apir_host_init(&host, &cfg, err, sizeof(err))) {
            fprintf(stderr, "apir-host worker: %s\n", err);
            return EXIT_FAIL;
        }
        /* The stats page the daemon made for this worker: mapped now,
         * before the sandbox; its descriptor is not kept. */
        struct apir_stats_page *stats = map_stats_page(a.stats_fd);
        /* A tls: guest's keys and certificates, read while files can
         * still be opened. */
        struct apir_tls_keys *tls_keys = NULL;
        if (a.serve_stream_fd >= 0 && a.stream_tls) {
            const bool loaded = load_tls(&a, &tls_keys, err, sizeof(err));
            if (!loaded || !tls_keys) {
                fprintf(stderr, "apir-host worker: %s\n", loaded ? "--stream-tls without TLS keys or certificates" : err);
                return EXIT_FAIL;
            }
        }
        /* The weight cache is the daemon's: this worker asks it over its
         * socket (weight_cache.h), never opens the directory. */
        host.weight_cache = apir_wcache_link_remote(a.weight_cache_fd);
#ifdef APIR_TEST_HOOKS
        apir_test_attack_prepare();
#endif
        if (a.worker_slot >= cfg.limits.max_clients ||
            !apir_sandbox_enter(&a.sandbox, &host, a.worker_uid, err, sizeof(err))) {
            fprintf(stderr, "apir-host worker: sandbox: %s\n", a.worker_slot >= cfg.limits.max_clients ? "bad slot" : err);
            return EXIT_FAIL;
        }
#ifdef APIR_TEST_HOOKS
        apir_test_attack_run(a.serve_fd >= 0 ? a.serve_fd : a.serve_stream_fd);
#endif
        const struct ucred *peer = a.peer_given ? &a.peer : NULL;
        int wrc = (a.serve_fd >= 0 ? apir_shm_serve_fd(&host, a.serve_fd, a.client_id, stats, peer)
                                   : apir_stream_serve_fd(&host, a.serve_stream_fd, a.client_id, stats, a.peer_name,
                                                          tls_keys)) == 0
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
    if (!apir_host_init(&host, &cfg, err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s\n", err);
        return EXIT_FAIL;
    }
    APIR_INFO("host", "backends from %s (%s)", backend_dir ? backend_dir : "ggml's search path", dir_source);
    if (cfg.n_threads > 0 && ggml_backend_reg_get_proc_address(host.reg, "ggml_backend_set_n_threads"))
        APIR_INFO("host", "%d CPU thread(s) per guest%s", cfg.n_threads,
                  cfg.n_threads == apir_host_default_threads() ? " (the cores this process may use)" : "");
    if (!a.isolate)
        APIR_WARN("host", "--isolation thread --insecure-shared-process: every guest is served in this one "
                  "unsandboxed process; use it for trusted guests only");
    if (a.isolate && !apir_workers_sandbox(&a.sandbox, host.cfg.limits.max_clients, err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s\n", err);
        return EXIT_FAIL;
    }
    /* The weight cache: sessions use it directly in thread mode; with
     * workers, this process serves it to them from a thread of its own. */
    if (cfg.weight_cache_dir) {
        struct apir_wcache *wc = apir_wcache_open(cfg.weight_cache_dir, cfg.weight_cache_max_bytes, err, sizeof(err));
        if (!wc || (a.isolate && !apir_wcache_service_start(wc, err, sizeof(err)))) {
            fprintf(stderr, "apir-host: %s\n", err);
            return EXIT_FAIL;
        }
        if (!a.isolate)
            host.weight_cache = apir_wcache_link_local(wc);
        APIR_INFO("host", "weight cache in %s: a guest can tell whether another guest sent the same weights "
                  "(docs/SECURITY.md)", cfg.weight_cache_dir);
    }
    if (a.isolate && !a.sandbox.enabled)
        APIR_WARN("host", "--no-sandbox: workers run with the daemon's privileges and every syscall (debugging only)");
    g_server = apir_shm_server_listen(&host, a.path, &a.listen, err, sizeof(err));
    if (!g_server) {
        fprintf(stderr, "apir-host: %s\n", err);
        return EXIT_FAIL;
    }
    if (a.isolate && !apir_shm_server_isolate(g_server, argv)) {
        fprintf(stderr, "apir-host: cannot set up worker processes\n");
        return EXIT_FAIL;
    }
    if (!setup_streams(&a, g_server)) {
        apir_shm_server_free(g_server);
        return EXIT_FAIL;
    }
    if (!setup_control(&a, g_server)) {
        apir_shm_server_free(g_server);
        return EXIT_FAIL;
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    APIR_INFO("host", "serving %s (%u device(s)) on unix:%s, %s per guest", ggml_backend_reg_name(host.reg), host.n_devices,
              apir_shm_server_path(g_server), a.isolate ? "one process" : "one thread");
    rc = apir_shm_server_run(g_server);
    APIR_INFO("host", "shutting down");
    apir_shm_server_free(g_server);
    g_server = NULL;
    return rc == 0 ? EXIT_OK : EXIT_FAIL;
}
