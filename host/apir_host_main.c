/*
 * apir-host: serves a real ggml backend to guests over the shm transport.
 *
 * What runs as root (when started as root): the daemon - it binds the
 * socket, accepts connections, reads each peer's uid (SO_PEERCRED), paces
 * them and forks and re-executes itself as a worker per guest; it never
 * parses a byte a guest sends (a refused connection is only drained).  A
 * worker loads the backend as root (the backend libraries and a GPU's device
 * nodes need it), then enters the sandbox (sandbox.c) - its own uid,
 * seccomp - before the guest's hello.
 * With --isolation thread this process serves every guest itself, without
 * a sandbox: for trusted guests only.
 */
#include "apir_log.h"
#include "host.h"
#include "sandbox.h"
#include "shm_server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef APIR_TEST_HOOKS
/* tests/worker_attack.c, linked into the test build apir-host-hooks only:
 * "attacker code" run inside a sandboxed worker (tests/test_hostile.c). */
void apir_test_attack_prepare(void);
void apir_test_attack_run(void);
#endif

static struct apir_shm_server *g_server;  /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    if (g_server)
        apir_shm_server_stop(g_server);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: apir-host [options]\n"
            "  --listen unix:PATH     socket to serve (default $XDG_RUNTIME_DIR/apir/host.sock, else /run/apir/host.sock)\n"
            "  --backend NAME         ggml backend (CPU, CUDA, Vulkan...; default: first GPU, else CPU)\n"
            "  --device N             serve only device N of the backend (default: all)\n"
            "  --threads N            CPU backend threads\n"
            "  --backend-dir DIR      where ggml's backend libraries are (default: %s)\n"
            "  --list-devices         list the backends and devices found, then exit\n"
            "  --log-level LEVEL      error|warn|info|debug (default info)\n"
            "  --isolation MODE       process: each guest in its own sandboxed worker process (default);\n"
            "                         thread: all guests in this process, unsandboxed - TRUSTED GUESTS ONLY\n"
            "                         (a guest that crashes or compromises it reaches every other guest)\n"
            "worker sandbox (process isolation):\n"
            "  --worker-uid-base N    as root, worker k runs as uid/gid N+k (default %u)\n"
            "  --no-sandbox           workers keep the daemon's uid and every syscall (debugging only)\n"
            "  --sandbox-log          name each refused syscall in the worker's log (still refused)\n"
            "  --sandbox-allow LIST   also allow these syscalls (comma-separated names), e.g. for a GPU driver\n"
            "limits per guest (over a limit the call fails; other guests go on):\n"
            "  --max-clients N        concurrent guests (64)\n"
            "  --max-buffers N        live buffers (4096)\n"
            "  --max-alloc-mib N      MiB in live buffers (unlimited)\n"
            "  --max-graph-nodes N    nodes per graph (65536)\n"
            "  --max-graph-tensors N  tensors per graph (262144)\n"
            "  --max-blobs N          shared-memory blobs (1024)\n"
            "  --max-blob-mib N       MiB of shared memory mapped (half the RAM, at most 65536)\n"
            "denial of service:\n"
            "  --max-clients-per-uid N  concurrent connections of one peer uid, root's too (16; 0: no limit)\n"
            "  --spawn-rate N         new connections per second, all peers (20; 0: no limit)\n"
            "  --spawn-burst N        ... at once (40)\n"
            "  --handshake-timeout-ms N  a connection's hello must come by then (5000)\n"
            "  --graph-timeout-ms N   one command's time; a worker over it is ended (60000; 0: none)\n",
            APIR_GGML_BIN, APIR_SANDBOX_UID_BASE_DEFAULT);
}

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

int main(int argc, char **argv)
{
    struct apir_host_config cfg;
    apir_host_config_default(&cfg);
    cfg.backend_dir = APIR_GGML_BIN;
    char path[108];
    apir_shm_default_path(path, sizeof(path));
    bool list = false, isolate = true;
    int serve_fd = -1;
    unsigned long long worker_slot = 0;
    struct apir_sandbox_config sandbox;
    apir_sandbox_config_default(&sandbox);
    unsigned long long client_id = 0;
    apir_log_set_level(APIR_LOG_INFO);
    if (getenv("APIR_LOG_LEVEL")) {
        enum apir_log_level l;
        if (apir_log_level_from_string(getenv("APIR_LOG_LEVEL"), &l) == 0)
            apir_log_set_level(l);
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long n = 0;
#define NEED_NUM() do { if (parse_u64(v, &n)) { fprintf(stderr, "apir-host: %s needs a number\n", a); return 2; } i++; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--listen") && v) {
            const char *p = strncmp(v, "unix:", 5) == 0 ? v + 5 : v;
            if (strlen(p) >= sizeof(path)) {
                fprintf(stderr, "apir-host: socket path too long\n");
                return 2;
            }
            snprintf(path, sizeof(path), "%s", p);
            i++;
        } else if (!strcmp(a, "--backend") && v) {
            cfg.backend_name = v;
            i++;
        } else if (!strcmp(a, "--device")) {
            NEED_NUM();
            cfg.device = (int)n;
        } else if (!strcmp(a, "--threads")) {
            NEED_NUM();
            cfg.n_threads = (int)n;
        } else if (!strcmp(a, "--backend-dir") && v) {
            cfg.backend_dir = v;
            i++;
        } else if (!strcmp(a, "--isolation") && v) {
            if (strcmp(v, "process") && strcmp(v, "thread")) {
                fprintf(stderr, "apir-host: --isolation process|thread\n");
                return 2;
            }
            isolate = !strcmp(v, "process");
            i++;
        } else if (!strcmp(a, "--serve-fd")) {
            NEED_NUM();
            serve_fd = (int)n;
        } else if (!strcmp(a, "--client-id")) {
            NEED_NUM();
            client_id = n;
        } else if (!strcmp(a, "--worker-slot")) {
            NEED_NUM();
            worker_slot = n;
        } else if (!strcmp(a, "--worker-uid-base")) {
            NEED_NUM();
            if (n == 0 || n >= 0xFFFFFFFFull) {
                fprintf(stderr, "apir-host: --worker-uid-base out of range\n");
                return 2;
            }
            sandbox.uid_base = (uint32_t)n;
        } else if (!strcmp(a, "--no-sandbox")) {
            sandbox.enabled = false;
        } else if (!strcmp(a, "--sandbox-log")) {
            sandbox.log_only = true;
        } else if (!strcmp(a, "--sandbox-allow") && v) {
            sandbox.extra_allow = v;
            i++;
        } else if (!strcmp(a, "--max-clients-per-uid")) {
            NEED_NUM();
            cfg.limits.max_clients_per_uid = (uint32_t)n;
        } else if (!strcmp(a, "--spawn-rate")) {
            NEED_NUM();
            cfg.limits.spawn_per_s = (uint32_t)n;
        } else if (!strcmp(a, "--spawn-burst")) {
            NEED_NUM();
            cfg.limits.spawn_burst = (uint32_t)n;
        } else if (!strcmp(a, "--handshake-timeout-ms")) {
            NEED_NUM();
            cfg.limits.handshake_timeout_ms = (uint32_t)(n > 600000 ? 600000 : n);
        } else if (!strcmp(a, "--graph-timeout-ms")) {
            NEED_NUM();
            cfg.limits.graph_timeout_ms = (uint32_t)(n > 0xFFFFFFFFull ? 0xFFFFFFFFull : n);
        } else if (!strcmp(a, "--list-devices")) {
            list = true;
        } else if (!strcmp(a, "--log-level") && v) {
            enum apir_log_level l;
            if (apir_log_level_from_string(v, &l) != 0) {
                fprintf(stderr, "apir-host: unknown log level %s\n", v);
                return 2;
            }
            apir_log_set_level(l);
            i++;
        } else if (!strcmp(a, "--max-clients")) {
            NEED_NUM();
            cfg.limits.max_clients = (uint32_t)n;
        } else if (!strcmp(a, "--max-buffers")) {
            NEED_NUM();
            cfg.limits.max_buffers = (uint32_t)n;
        } else if (!strcmp(a, "--max-alloc-mib")) {
            NEED_NUM();
            cfg.limits.max_alloc_bytes = (uint64_t)n << 20;
        } else if (!strcmp(a, "--max-graph-nodes")) {
            NEED_NUM();
            cfg.limits.max_graph_nodes = (uint32_t)n;
        } else if (!strcmp(a, "--max-graph-tensors")) {
            NEED_NUM();
            cfg.limits.max_graph_tensors = (uint32_t)n;
        } else if (!strcmp(a, "--max-blobs")) {
            NEED_NUM();
            cfg.limits.max_blobs = (uint32_t)n;
        } else if (!strcmp(a, "--max-blob-mib")) {
            NEED_NUM();
            cfg.limits.max_blob_bytes = (uint64_t)n << 20;
        } else {
            fprintf(stderr, "apir-host: unknown or incomplete option %s\n", a);
            usage(stderr);
            return 2;
        }
#undef NEED_NUM
    }
    if (list) {
        apir_host_print_devices(cfg.backend_dir, stdout);
        return 0;
    }
    char err[256];
    struct apir_host host;
    signal(SIGPIPE, SIG_IGN);
    if (serve_fd >= 0) {
        /* A worker process: one guest, then exit. */
        if (!apir_host_init(&host, &cfg, err, sizeof(err))) {
            fprintf(stderr, "apir-host worker: %s\n", err);
            return 1;
        }
        apir_sandbox_prepare(&host);
#ifdef APIR_TEST_HOOKS
        apir_test_attack_prepare();
#endif
        if (worker_slot >= cfg.limits.max_clients ||
            !apir_sandbox_enter(&sandbox, &host, (uint32_t)worker_slot, err, sizeof(err))) {
            fprintf(stderr, "apir-host worker: sandbox: %s\n", worker_slot >= cfg.limits.max_clients ? "bad slot" : err);
            return 1;
        }
#ifdef APIR_TEST_HOOKS
        apir_test_attack_run();
#endif
        int rc = apir_shm_serve_fd(&host, serve_fd, client_id) == 0 ? 0 : 1;
        /* Ends without exit-time handlers: what they may do is no longer
         * allowed here (LeakSanitizer's exit check clones a tracer and
         * ptraces; a backend's destructors may open files).  The guest's
         * session was freed above; the kernel takes the rest. */
        fflush(NULL);
        _exit(rc);
    }
    if (isolate) {
        /* The daemon itself never touches a backend: workers do.  Only
         * check that the chosen backend exists. */
        if (!apir_host_init(&host, &cfg, err, sizeof(err))) {
            fprintf(stderr, "apir-host: %s\n", err);
            return 1;
        }
    } else if (!apir_host_init(&host, &cfg, err, sizeof(err))) {
        fprintf(stderr, "apir-host: %s\n", err);
        return 1;
    }
    if (!isolate)
        APIR_WARN("host", "--isolation thread: every guest is served in this one unsandboxed process; "
                  "use it for trusted guests only");
    else if (!sandbox.enabled)
        APIR_WARN("host", "--no-sandbox: workers run with the daemon's privileges and every syscall (debugging only)");
    g_server = apir_shm_server_new(&host, path, err, sizeof(err));
    if (!g_server) {
        fprintf(stderr, "apir-host: %s\n", err);
        return 1;
    }
    if (isolate && !apir_shm_server_isolate(g_server, argv)) {
        fprintf(stderr, "apir-host: cannot set up worker processes\n");
        return 1;
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    APIR_INFO("host", "serving %s (%u device(s)) on unix:%s, %s per guest", ggml_backend_reg_name(host.reg), host.n_devices,
              path, isolate ? "one process" : "one thread");
    int rc = apir_shm_server_run(g_server);
    APIR_INFO("host", "shutting down");
    apir_shm_server_free(g_server);
    g_server = NULL;
    return rc == 0 ? 0 : 1;
}
