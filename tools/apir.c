/*
 * apir: the command-line client.
 *
 *   apir ping [ENDPOINTS] [-n N] [-i US]   handshake, versions, null-call round trip p50/p99
 *   apir info [ENDPOINTS]          devices, memory, buffer types, alignment
 *        ENDPOINTS: one endpoint, or a comma-separated list as APIR_HOST
 *        takes (guest/endpoint_list.h): each host in turn, info numbering
 *        the devices APIR0.. as a program would see them.
 *   apir stat [ENDPOINT] [--json]  what a running host does (its control socket, PATH.ctl)
 *   apir ps [ENDPOINT] [--json]    the guests it serves, one line each
 *   apir run [options] [--] CMD [ARGS...]
 *        starts an apir-host on a private socket (unless -H or APIR_HOST names
 *        one), runs CMD with libggml-apir.so injected (GGML_BACKEND_PATH,
 *        APIR_HOST), then stops the host and removes its socket folder.
 *   apir cdi [-H unix:PATH]        a CDI spec (JSON) giving containers the socket and libggml-apir.so
 *
 * Every subcommand parses its options with getopt_long (--opt VALUE,
 * --opt=VALUE, the short letters llama.cpp users know) and has --help; a new
 * subcommand is a function and a row in commands[].
 */
#include "apir_build.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "calls.h"
#include "endpoint_list.h"
#include "transport.h"
#include "net.h"
#include "wait.h"

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Exit statuses (the help texts and the README list them). */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,          /* the host cannot be reached, or a call failed */
    EXIT_USAGE = 2,         /* bad command line */
    EXIT_RUN_FAILED = 125,  /* apir run itself failed (as env(1) and timeout(1) do) */
    EXIT_CANNOT_EXEC = 126, /* apir run: CMD cannot be executed */
    EXIT_NOT_FOUND = 127,   /* apir run: CMD not found */
};

static const char exit_status_text[] =
    "exit status: 0 success; 1 the host (one of the hosts listed) cannot be reached or a call failed; 2 bad command line\n";

/* A decimal number from min to max, or a message and false. */
static bool num_arg(const char *cmd, const char *opt, const char *v, long long min, long long max, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long n = 0;
    if (v && ((*v >= '0' && *v <= '9') || (*v == '-' && min < 0)))
        n = strtoll(v, &end, 10);
    if (!end || *end || errno || n < min || n > max) {
        fprintf(stderr, "apir %s: %s: '%s' is not a number from %lld to %lld\n", cmd, opt, v ? v : "", min, max);
        return false;
    }
    *out = n;
    return true;
}

/* The endpoints the guest library knows (transport.c): unix:PATH, an
 * absolute path, virtgpu[:NODE], tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT.  Anything
 * else is refused here, before a connection is tried, and named. */
static bool endpoint_ok(const char *cmd, const char *e, const char *from)
{
    if (!e || !*e)
        return true;
    if ((!strncmp(e, "unix:", 5) && e[5]) || e[0] == '/')
        return true;
    if (!strncmp(e, "virtgpu", 7) && (e[7] == '\0' || (e[7] == ':' && e[8])))
        return true;
    char err[160];
    struct apir_net_addr addr;
    if (apir_net_is_stream(e)) {
        const bool parsed = apir_net_parse(e, &addr, err, sizeof(err));
        if (parsed && addr.port != 0)
            return true;
        if (parsed)
            fprintf(stderr, "apir %s: %s: port 0 is for listening; give the host's port\n", cmd, e);
        else
            fprintf(stderr, "apir %s: %s\n", cmd, err);
        return false;
    }
    fprintf(stderr, "apir %s: unknown endpoint '%s'%s: use unix:PATH, /PATH, tcp:HOST:PORT, tls:HOST:PORT, "
            "vsock:CID:PORT or virtgpu[:NODE]\n", cmd, e, from);
    return false;
}

/* The endpoint a command connects to: the one given, else $APIR_HOST, else
 * NULL (the default socket). */
/* The one positional argument a client subcommand takes after its options:
 * an endpoint, unless -H gave one already.  False (and a message) on more. */
static bool positional_endpoint(int argc, char **argv, const char **given)
{
    if (optind >= argc)
        return true;
    if (*given || optind + 1 < argc) {
        fprintf(stderr, "apir %s: one endpoint at most (try apir %s --help)\n", argv[0], argv[0]);
        return false;
    }
    *given = argv[optind];
    return true;
}

static void ignore_problem(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

static void print_problem(void *arg, const char *msg)
{
    fprintf(stderr, "apir %s: %s\n", (const char *)arg, msg);
}

/* An endpoint, or for ping, info and run a comma-separated list of them (as
 * APIR_HOST may be: guest/endpoint_list.h), each one checked.  What the
 * list's parser leaves out (empty items, too long...) is said when the
 * list is used, as the guest library says it. */
static bool endpoints_ok(const char *cmd, const char *e, const char *from)
{
    if (!e || !strchr(e, ','))
        return endpoint_ok(cmd, e, from);
    if (strcmp(cmd, "ping") != 0 && strcmp(cmd, "info") != 0 && strcmp(cmd, "run") != 0) {
        fprintf(stderr, "apir %s: '%s'%s is a list: give one endpoint (ping, info and run take lists)\n", cmd, e, from);
        return false;
    }
    struct apir_endpoint_list list;
    apir_endpoint_list_parse(e, &list, ignore_problem, NULL);
    if (!list.n) {
        fprintf(stderr, "apir %s: '%s'%s names no endpoint\n", cmd, e, from);
        return false;
    }
    for (uint32_t i = 0; i < list.n; i++)
        if (!endpoint_ok(cmd, list.endpoint[i], from))
            return false;
    return true;
}

static bool pick_endpoint(const char *cmd, const char *given, const char **out)
{
    const char *env = getenv("APIR_HOST");
    if (given) {
        if (!endpoints_ok(cmd, given, ""))
            return false;
        *out = given;
    } else {
        if (!endpoints_ok(cmd, env, " (from APIR_HOST)"))
            return false;
        *out = env && *env ? env : NULL;
    }
    return true;
}

/* Unknown options and missing values, in one voice for every subcommand. */
static int bad_option(const char *cmd, int c, char **argv)
{
    const char *arg = argv[optind - 1];
    if (c == ':')
        fprintf(stderr, "apir %s: %s needs a value (try apir %s --help)\n", cmd, arg, cmd);
    else if (optopt && optopt < 256 && strncmp(arg, "--", 2) != 0)
        fprintf(stderr, "apir %s: unknown option -%c (try apir %s --help)\n", cmd, optopt, cmd);
    else
        fprintf(stderr, "apir %s: unknown or ambiguous option %s (try apir %s --help)\n", cmd, arg, cmd);
    return EXIT_USAGE;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* interval_us: a pause before each timed call, so that both sides have
 * gone to sleep as they do between a program's graphs (what a token's first
 * command meets), instead of back-to-back calls that find them spinning. */
static int ping_one(const char *endpoint, int n, long long interval_us)
{
    struct apir_remote r;
    char err[256];
    uint64_t t0 = apir_now_ns();
    if (!apir_remote_open(&r, endpoint, 0, err, sizeof(err))) {
        fprintf(stderr, "apir ping: %s\n", err);
        return 1;
    }
    uint64_t t1 = apir_now_ns();
    printf("connected to %s: APIR %u.%u (guest %u.%u), connect+handshake %.1f us\n", r.t->endpoint, APIR_VERSION_MAJOR,
           r.minor, APIR_VERSION_MAJOR, APIR_VERSION_MINOR, (double)(t1 - t0) / 1e3);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)n);
    if (!lat)
        return 1;
    int32_t count;
    for (int i = 0; i < 1000 && i < n; i++)  /* warm-up */
        apir_call_DEVICE_GET_COUNT(&r, &count);
    for (int i = 0; i < n; i++) {
        if (interval_us) {
            struct timespec ts = { (time_t)(interval_us / 1000000), (long)(interval_us % 1000000) * 1000 };
            nanosleep(&ts, NULL);
        }
        uint64_t a = apir_now_ns();
        if (apir_call_DEVICE_GET_COUNT(&r, &count) != APIR_HANDLER_OK) {
            fprintf(stderr, "apir ping: call %d failed\n", i);
            free(lat);
            apir_remote_close(&r);
            return 1;
        }
        lat[i] = apir_now_ns() - a;
    }
    qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
    printf("null call (DEVICE_GET_COUNT) x %d%s: p50 %.2f us, p99 %.2f us, max %.2f us\n", n,
           interval_us ? ", each after a pause" : "", (double)lat[n / 2] / 1e3, (double)lat[(size_t)n * 99 / 100] / 1e3,
           (double)lat[n - 1] / 1e3);
    free(lat);
    apir_remote_close(&r);
    return 0;
}

static const char *type_name(uint32_t t)
{
    switch (t) {
    case 0: return "CPU";
    case 1: return "GPU";
    case 2: return "IGPU";
    case 3: return "ACCEL";
    default: return "?";
    }
}

/* One host's devices; *next: the APIR number its first device gets in a
 * program with the same APIR_HOST (frontend_reg.c), advanced past them. */
static int info_one(const char *endpoint, uint32_t *next)
{
    struct apir_remote r;
    char err[256];
    if (!apir_remote_open(&r, endpoint, 0, err, sizeof(err))) {
        fprintf(stderr, "apir info: %s\n", err);
        return 1;
    }
    int32_t count = 0;
    apir_call_DEVICE_GET_DEVICE_COUNT(&r, &count);
    uint32_t lib_major = 0, lib_minor = 0;
    if (apir_minor_speaks(r.minor, APIR_CMD_HOST_GET_VERSION) && apir_call_HOST_GET_VERSION(&r, &lib_major, &lib_minor) == APIR_HANDLER_OK)
        printf("host %s: APIR 0.%u (host library %u.%u), %d device(s)\n", r.t->endpoint, r.minor, lib_major, lib_minor,
               count);
    else
        printf("host %s: APIR 0.%u, %d device(s)\n", r.t->endpoint, r.minor, count);
    const uint32_t n_devices = count > 0 ? (uint32_t)count : 0;
    for (uint32_t i = 0; i < n_devices; i++) {
        if (i > 0 && apir_call_DEVICE_SELECT(&r, i) != APIR_HANDLER_OK)
            break;
        struct apir_string name = { "" }, desc = { "" }, buft_name = { "" };
        uint32_t type = 0;
        uint64_t free_mem = 0, total = 0, buft = 0, align = 0, max_size = 0;
        bool async = false, host_buf = false, from_ptr = false, events = false, mmap_ok = false;
        apir_call_DEVICE_GET_NAME(&r, &name);
        apir_call_DEVICE_GET_DESCRIPTION(&r, &desc);
        apir_call_DEVICE_GET_TYPE(&r, &type);
        apir_call_DEVICE_GET_MEMORY(&r, &free_mem, &total);
        apir_call_DEVICE_GET_PROPS(&r, &async, &host_buf, &from_ptr, &events, &mmap_ok);
        apir_call_DEVICE_GET_BUFFER_TYPE(&r, &buft);
        apir_call_BUFFER_TYPE_GET_NAME(&r, buft, &buft_name);
        apir_call_BUFFER_TYPE_GET_ALIGNMENT(&r, buft, &align);
        apir_call_BUFFER_TYPE_GET_MAX_SIZE(&r, buft, &max_size);
        if (*next < APIR_MAX_DEVICES)
            printf("device %u: %s - %s [%s], APIR%u\n", i, name.s, desc.s, type_name(type), (*next)++);
        else
            printf("device %u: %s - %s [%s], not offered (%d APIR devices at most)\n", i, name.s, desc.s,
                   type_name(type), APIR_MAX_DEVICES);
        printf("  memory: %llu MiB free of %llu MiB\n", (unsigned long long)(free_mem >> 20),
               (unsigned long long)(total >> 20));
        printf("  buffer type: %s, alignment %llu, max size %llu MiB\n", buft_name.s, (unsigned long long)align,
               (unsigned long long)(max_size >> 20));
        printf("  props: buffer_from_host_ptr %s\n", from_ptr ? "yes" : "no");
    }
    apir_remote_close(&r);
    return 0;
}

/* Every host of the list (one endpoint is a list of one), in order; 1 when
 * any cannot be reached or fails, after the others are done. */
static int for_each_host(const char *cmd, const char *spec, int n, long long interval_us)
{
    struct apir_endpoint_list list;
    apir_endpoint_list_parse(spec, &list, print_problem, (void *)cmd);
    const bool ping = !strcmp(cmd, "ping");
    uint32_t next = 0;
    int rc = list.n ? 0 : 1;
    for (uint32_t i = 0; i < list.n; i++) {
        const char *e = list.endpoint[i][0] ? list.endpoint[i] : NULL;
        if (list.n > 1 && i > 0)
            printf("\n");
        if ((ping ? ping_one(e, n, interval_us) : info_one(e, &next)) != 0)
            rc = 1;
    }
    return rc;
}


/* ---- apir ping / apir info ------------------------------------------------ */

static void ping_usage(FILE *out)
{
    fprintf(out, "usage: apir ping [options] [ENDPOINT[,ENDPOINT...]]\n"
                 "Connects to a host, prints the protocol versions and the round trip of a null call.\n"
                 "  ENDPOINT, -H, --host ENDPOINT  unix:PATH, /PATH, tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT or\n"
                 "                          virtgpu[:NODE]; a comma-separated list\n"
                 "                          (as APIR_HOST takes) pings each host in turn\n"
                 "                          (default: $APIR_HOST, else $XDG_RUNTIME_DIR/apir/host.sock or /run/apir/host.sock)\n"
                 "  -n, --count N           null calls to time (default 10000; 1 to 10000000)\n"
                 "  -i, --interval-us US    pause US microseconds before each (default 0; up to 1000000): the round\n"
                 "                          trip of a connection gone idle, as a program's first call after a compute\n"
                 "  -h, --help              this help\n"
                 "%s",
            exit_status_text);
}

static void info_usage(FILE *out)
{
    fprintf(out, "usage: apir info [options] [ENDPOINT[,ENDPOINT...]]\n"
                 "Prints the host's version and its devices: memory, buffer type, alignment, and the name\n"
                 "(APIR0...) a program with the same APIR_HOST gives each.\n"
                 "  ENDPOINT, -H, --host ENDPOINT  unix:PATH, /PATH, tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT or\n"
                 "                          virtgpu[:NODE]; a comma-separated list\n"
                 "                          (as APIR_HOST takes) shows each host in turn, numbering devices across them\n"
                 "                          (default: $APIR_HOST, else $XDG_RUNTIME_DIR/apir/host.sock or /run/apir/host.sock)\n"
                 "  -h, --help              this help\n"
                 "%s",
            exit_status_text);
}

/* ping and info: options, then at most one ENDPOINT. */
static int cmd_ping_info(int argc, char **argv)
{
    const bool ping = !strcmp(argv[0], "ping");
    static const struct option ping_opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { "count", required_argument, NULL, 'n' },
        { "interval-us", required_argument, NULL, 'i' },
        { NULL, 0, NULL, 0 },
    };
    static const struct option info_opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { NULL, 0, NULL, 0 },
    };
    const char *given = NULL;
    long long n = 10000, interval_us = 0;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ping ? ":hH:n:i:" : ":hH:", ping ? ping_opts : info_opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            (ping ? ping_usage : info_usage)(stdout);
            return EXIT_OK;
        case 'H':
            given = optarg;
            break;
        case 'n':
            if (!num_arg(argv[0], "--count", optarg, 1, 10000000, &n))
                return EXIT_USAGE;
            break;
        case 'i':
            if (!num_arg(argv[0], "--interval-us", optarg, 0, 1000000, &interval_us))
                return EXIT_USAGE;
            break;
        default:
            return bad_option(argv[0], c, argv);
        }
    }
    if (!positional_endpoint(argc, argv, &given))
        return EXIT_USAGE;
    const char *endpoint;
    if (!pick_endpoint(argv[0], given, &endpoint))
        return EXIT_USAGE;
    return for_each_host(argv[0], endpoint, (int)n, interval_us);
}

/* ---- apir run ---------------------------------------------------------------- */

/* Finds a file beside this executable, or where it is installed relative
 * to it (CMakeLists.txt's install layout). */
static bool find_beside_exe(const char *name, char *out, size_t len)
{
    char exe[PATH_MAX];
    if (!realpath("/proc/self/exe", exe))
        return false;
    char *dir = dirname(exe);
    const char *rel[] = { ".", APIR_BIN_TO_LIB, "../lib", "../bin" };
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        if (snprintf(out, len, "%s/%s/%s", dir, rel[i], name) >= (int)len)
            continue;
        if (access(out, F_OK) == 0)
            return true;
    }
    return false;
}

static volatile sig_atomic_t child_pid, got_signal;

static void on_run_signal(int sig)
{
    got_signal = sig;
    if (child_pid > 0)
        kill(child_pid, sig);
}

static void run_usage(FILE *out)
{
    fprintf(out,
            "usage: apir run [options] [--] CMD [ARGS...]\n"
            "Runs a ggml program on an APIR device: starts apir-host (beside apir) on a private socket,\n"
            "runs CMD with GGML_BACKEND_PATH=libggml-apir.so and APIR_HOST set, then stops the host\n"
            "and removes its socket folder ($TMPDIR or /tmp, apir-run-XXXXXX).\n"
            "Options before CMD (those after it are CMD's):\n"
            "  -H, --host ENDPOINTS    use this running host instead of starting one (also $APIR_HOST); a\n"
            "                          comma-separated list, as APIR_HOST takes, uses several\n"
            "  -b, --backend NAME      the started host's backend (CPU, CUDA...; default: first GPU, else CPU)\n"
            "  -d, --device N|NAME     ... only this device of it\n"
            "  -t, --threads N         ... CPU threads (default: the cores this process may use)\n"
            "      --backend-dir DIR   ... where ggml's backend libraries are\n"
            "      --log-level LEVEL   ... log level (error|warn|info|debug; default warn)\n"
            "      --host-arg ARG      ... one more apir-host argument (repeat as needed)\n"
            "  -h, --help              this help\n"
            "exit status: CMD's own status (128+N when signal N ended it); 125 apir run itself failed\n"
            "             (bad command line, the host did not start); 126 CMD cannot be executed;\n"
            "             127 CMD not found\n");
}

/* The started host's socket folder, removed however the run ends. */
static void remove_run_dir(const char *dir)
{
    char sock[PATH_MAX];
    snprintf(sock, sizeof(sock), "%s/host.sock", dir);
    unlink(sock);
    snprintf(sock, sizeof(sock), "%s/host.sock.ctl", dir);  /* its control socket (a host that died) */
    unlink(sock);
    if (rmdir(dir) != 0 && errno != ENOENT)
        fprintf(stderr, "apir run: cannot remove %s: %s\n", dir, strerror(errno));
}

/* SIGTERM, then (bounded) wait; SIGKILL if it will not go.  Returns the
 * host's wait status, or -1 when it had to be killed. */
static int stop_host(pid_t pid)
{
    int status = 0;
    kill(pid, SIGTERM);
    for (int t = 0; t < 1000; t++) {  /* 10 s */
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return status;
        usleep(10000);
    }
    fprintf(stderr, "apir run: apir-host (pid %d) did not stop in 10 s: killed\n", (int)pid);
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return -1;
}

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "signal %d", WTERMSIG(status));
    else
        snprintf(buf, len, "status 0x%x", (unsigned)status);
}

/* Whether execvp() would find an executable NAME (as it searches PATH). */
static bool command_found(const char *name)
{
    if (!*name)
        return false;
    struct stat st;
    if (strchr(name, '/'))
        return stat(name, &st) == 0 && S_ISREG(st.st_mode) && access(name, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/bin:/usr/bin";
    char buf[PATH_MAX];
    for (const char *p = path; ; ) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* An empty entry is the current folder, as execvp() reads it. */
        int n = len ? snprintf(buf, sizeof(buf), "%.*s/%s", (int)len, p, name) : snprintf(buf, sizeof(buf), "%s", name);
        if (n > 0 && (size_t)n < sizeof(buf) && stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0)
            return true;
        if (!end)
            return false;
        p = end + 1;
    }
}

static int cmd_run(int argc, char **argv)
{
    enum { RUN_BACKEND_DIR = 256, RUN_LOG_LEVEL, RUN_HOST_ARG };
    static const struct option opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { "backend", required_argument, NULL, 'b' },
        { "device", required_argument, NULL, 'd' },
        { "threads", required_argument, NULL, 't' },
        { "backend-dir", required_argument, NULL, RUN_BACKEND_DIR },
        { "log-level", required_argument, NULL, RUN_LOG_LEVEL },
        { "host-arg", required_argument, NULL, RUN_HOST_ARG },
        { NULL, 0, NULL, 0 },
    };
    /* apir-host's argv: its path, --listen, the endpoint, --log-level, the
     * level, then at most one entry per argument given here. */
    const char **host_args = calloc((size_t)argc + 8, sizeof(char *));
    char *owned[8] = { NULL };  /* "--opt=value" strings made here */
    int n_owned = 0, n_host_args = 5;
    const char *given = NULL, *log_level = "warn";
    int c, rc = EXIT_RUN_FAILED;
    if (!host_args) {
        fprintf(stderr, "apir run: out of memory\n");
        return EXIT_RUN_FAILED;
    }
    opterr = 0;
    /* '+': options end at CMD, whose own options are its. */
    while ((c = getopt_long(argc, argv, "+:hH:b:d:t:", opts, NULL)) != -1) {
        const char *prefix = NULL;
        long long n;
        switch (c) {
        case 'h':
            run_usage(stdout);
            rc = EXIT_OK;
            goto out;
        case 'H':
            given = optarg;
            break;
        case 'b':
            prefix = "--backend=";
            break;
        case 'd':
            prefix = "--device=";
            break;
        case 't':
            if (!num_arg("run", "--threads", optarg, 0, 1024, &n))
                goto out;
            prefix = "--threads=";
            break;
        case RUN_BACKEND_DIR:
            prefix = "--backend-dir=";
            break;
        case RUN_LOG_LEVEL: {
            enum apir_log_level l;
            if (apir_log_level_from_string(optarg, &l) != 0) {
                fprintf(stderr, "apir run: --log-level %s: use error, warn, info or debug\n", optarg);
                goto out;
            }
            log_level = optarg;
            break;
        }
        case RUN_HOST_ARG:
            host_args[n_host_args++] = optarg;
            break;
        default:
            bad_option("run", c, argv);
            goto out;
        }
        if (prefix) {
            char *s = NULL;
            if (n_owned == (int)(sizeof(owned) / sizeof(owned[0])) || asprintf(&s, "%s%s", prefix, optarg) < 0) {
                fprintf(stderr, "apir run: too many host options\n");
                goto out;
            }
            owned[n_owned++] = s;
            host_args[n_host_args++] = s;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "apir run: no command to run (try apir run --help)\n");
        goto out;
    }
    char **cmd = argv + optind;
    if (!command_found(cmd[0])) {
        /* Before a host is started for nothing. */
        fprintf(stderr, "apir run: cannot run %s: %s (no host started)\n", cmd[0],
                strchr(cmd[0], '/') ? "no such program, or not an executable file" : "command not found in PATH");
        rc = strchr(cmd[0], '/') && access(cmd[0], F_OK) == 0 ? EXIT_CANNOT_EXEC : EXIT_NOT_FOUND;
        goto out;
    }
    const char *endpoint_given = NULL;
    if (!pick_endpoint("run", given, &endpoint_given))
        goto out;
    if (endpoint_given && n_host_args > 5)
        fprintf(stderr, "apir run: a running host is used (%s): the host options given are ignored\n", endpoint_given);

    char frontend[PATH_MAX], host_bin[PATH_MAX];
    if (!find_beside_exe("libggml-apir.so", frontend, sizeof(frontend))) {
        fprintf(stderr, "apir run: libggml-apir.so not found beside apir (or in %s from it)\n", APIR_BIN_TO_LIB);
        goto out;
    }
    struct sigaction sa = { .sa_handler = on_run_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    pid_t host_pid = 0;
    char endpoint[PATH_MAX + 8];
    /* The socket folder: in $TMPDIR, else /tmp (also when $TMPDIR would
     * make the socket path longer than a sockaddr_un holds). */
    char dir[128];
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) + sizeof("/apir-run-XXXXXX/host.sock") > 108)
        tmp = "/tmp";
    snprintf(dir, sizeof(dir), "%s/apir-run-XXXXXX", tmp);
    bool made_dir = false;
    if (endpoint_given) {
        snprintf(endpoint, sizeof(endpoint), "%s", endpoint_given);
    } else {
        if (!find_beside_exe("apir-host", host_bin, sizeof(host_bin))) {
            fprintf(stderr, "apir run: apir-host not found beside apir\n");
            goto out;
        }
        if (!mkdtemp(dir)) {
            fprintf(stderr, "apir run: cannot create a socket folder in %s: %s\n", tmp, strerror(errno));
            goto out;
        }
        made_dir = true;
        snprintf(endpoint, sizeof(endpoint), "unix:%s/host.sock", dir);
        host_args[0] = host_bin;
        host_args[1] = "--listen";
        host_args[2] = endpoint;
        host_args[3] = "--log-level";
        host_args[4] = log_level;
        host_args[n_host_args] = NULL;
        host_pid = fork();
        if (host_pid < 0) {
            fprintf(stderr, "apir run: fork: %s\n", strerror(errno));
            goto out_dir;
        }
        if (host_pid == 0) {
            execv(host_bin, (char *const *)host_args);
            fprintf(stderr, "apir run: cannot run %s: %s\n", host_bin, strerror(errno));
            _exit(EXIT_RUN_FAILED);
        }
        /* Wait (bounded) for the socket to appear. */
        char sock[PATH_MAX];
        snprintf(sock, sizeof(sock), "%s/host.sock", dir);
        struct stat st;
        int t = 0;
        for (; t < 1000 && stat(sock, &st) != 0 && !got_signal; t++) {  /* 10 s */
            int status;
            if (waitpid(host_pid, &status, WNOHANG) == host_pid) {
                char how[64];
                describe_status(status, how, sizeof(how));
                fprintf(stderr, "apir run: apir-host did not start (%s)\n", how);
                host_pid = 0;
                goto out_dir;
            }
            usleep(10000);
        }
        if (got_signal) {
            rc = 128 + got_signal;
            goto out_host;
        }
        if (t == 1000) {
            fprintf(stderr, "apir run: apir-host did not open %s in 10 s\n", sock);
            goto out_host;
        }
        fprintf(stderr, "apir run: started apir-host (pid %d) on %s\n", (int)host_pid, endpoint);
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "apir run: fork: %s\n", strerror(errno));
        goto out_host;
    }
    if (pid == 0) {
        setenv("GGML_BACKEND_PATH", frontend, 1);
        setenv("APIR_HOST", endpoint, 1);
        execvp(cmd[0], cmd);
        int e = errno;
        fprintf(stderr, "apir run: cannot run %s: %s\n", cmd[0], strerror(e));
        _exit(e == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC);
    }
    child_pid = pid;
    if (got_signal)  /* came before child_pid was set: pass it on */
        kill(pid, got_signal);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    child_pid = 0;
    rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
out_host:
    if (host_pid > 0) {
        int hs = stop_host(host_pid);
        if (hs != -1 && !(WIFEXITED(hs) && WEXITSTATUS(hs) == 0)) {
            char how[64];
            describe_status(hs, how, sizeof(how));
            fprintf(stderr, "apir run: apir-host ended with %s\n", how);
        }
    }
out_dir:
    if (made_dir)
        remove_run_dir(dir);
out:
    for (int i = 0; i < n_owned; i++)
        free(owned[i]);
    free(host_args);
    return rc;
}

/* ---- apir cdi ------------------------------------------------------------------- */

/* A CDI spec (https://github.com/cncf-tags/container-device-interface):
 * `podman run --device apir.dev/host=default` (or docker, containerd, CRI-O
 * with CDI) then bind-mounts the host's socket folder and the guest library
 * and sets GGML_BACKEND_PATH and APIR_HOST in the container. */
#define CDI_KIND "apir.dev/host"
#define CDI_SOCKET_DIR "/run/apir"                          /* in the container */
#define CDI_LIBRARY "/opt/apir/lib/libggml-apir.so"         /* in the container */

static void cdi_usage(FILE *out)
{
    fprintf(out,
            "usage: apir cdi [-H unix:PATH] [--library PATH] [--name NAME]\n"
            "Prints a CDI spec (JSON) that gives containers the device " CDI_KIND "=NAME:\n"
            "the socket's folder bind-mounted read-only at " CDI_SOCKET_DIR ", the guest library at\n"
            CDI_LIBRARY " (read-only), GGML_BACKEND_PATH and APIR_HOST set.\n"
            "  mkdir -p /etc/cdi && apir cdi > /etc/cdi/apir.json\n"
            "  podman run --device " CDI_KIND "=default IMAGE llama-cli -m MODEL.gguf -dev APIR0 ...\n"
            "The image needs glibc (all the guest library needs) and a ggml program\n"
            "built against the ggml apir was built against.\n"
            "  -H, --host ENDPOINT  the host's socket on this machine: unix:PATH or /PATH (default\n"
            "                       $APIR_HOST, else $XDG_RUNTIME_DIR/apir/host.sock or /run/apir/host.sock);\n"
            "                       its whole folder is mounted,\n"
            "                       so it should be a folder of its own (a restarted host's new socket\n"
            "                       is seen there)\n"
            "      --library PATH   the libggml-apir.so to mount (default: the one installed with apir)\n"
            "      --name NAME      the device's name (default \"default\")\n"
            "      --gid            give the container's user the socket's group (additionalGids: a CDI\n"
            "                       0.7 spec, podman 5 or later); without it, podman --group-add\n"
            "  -h, --help           this help\n"
            "exit status: 0 printed; 1 the library is not found; 2 bad command line\n");
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static int cmd_cdi(int argc, char **argv)
{
    static const struct option opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { "library", required_argument, NULL, 'L' },
        { "name", required_argument, NULL, 'N' },
        { "gid", no_argument, NULL, 'G' },
        { 0 },
    };
    const char *given = NULL, *library = NULL, *name = "default";
    bool add_gid = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":hH:", opts, NULL)) != -1) {
        switch (c) {
        case 'h': cdi_usage(stdout); return EXIT_OK;
        case 'H': given = optarg; break;
        case 'L': library = optarg; break;
        case 'N': name = optarg; break;
        case 'G': add_gid = true; break;
        default: return bad_option("cdi", c, argv);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "apir cdi: unexpected argument '%s' (try apir cdi --help)\n", argv[optind]);
        return EXIT_USAGE;
    }
    /* CDI device names: letters, digits, '_', '-', '.', ':', starting with a letter or digit */
    bool name_ok = (name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= '0' && name[0] <= '9');
    for (const char *p = name; *p && name_ok; p++)
        name_ok = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:", *p) != NULL;
    if (!name_ok) {
        fprintf(stderr, "apir cdi: --name '%s': a CDI device name is letters, digits, '_', '-', '.', ':'\n", name);
        return EXIT_USAGE;
    }
    const char *endpoint = NULL;
    if (!pick_endpoint("cdi", given, &endpoint))
        return EXIT_USAGE;
    char default_sock[108];
    apir_shm_default_path(default_sock, sizeof(default_sock));
    const char *sock = !endpoint ? default_sock : !strncmp(endpoint, "unix:", 5) ? endpoint + 5 : endpoint;
    if (!strncmp(sock, "virtgpu", 7) || sock[0] != '/') {
        fprintf(stderr, "apir cdi: '%s': a container reaches the host through its socket: give unix:/PATH\n", endpoint);
        return EXIT_USAGE;
    }
    char dir[PATH_MAX], base[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s", sock) >= (int)sizeof(dir) || snprintf(base, sizeof(base), "%s", sock) >= (int)sizeof(base)) {
        fprintf(stderr, "apir cdi: socket path too long\n");
        return EXIT_USAGE;
    }
    const char *sock_dir = dirname(dir), *sock_name = basename(base);
    if (!strcmp(sock_dir, "/") || !strcmp(sock_dir, "/tmp") || !strcmp(sock_dir, "/run")) {
        fprintf(stderr, "apir cdi: the socket's folder %s would be mounted whole: put the socket in a folder of its own\n", sock_dir);
        return EXIT_USAGE;
    }
    struct stat st;
    if (stat(sock, &st) != 0 || !S_ISSOCK(st.st_mode))
        fprintf(stderr, "apir cdi: note: %s is not a socket now (the host or its systemd socket must create it)\n", sock);
    /* The group that may connect: the socket's, else its folder's. */
    struct stat gst;
    bool have_gid = stat(sock, &gst) == 0 || stat(sock_dir, &gst) == 0;
    if (add_gid && !have_gid) {
        fprintf(stderr, "apir cdi: --gid: neither %s nor its folder exists: no group to give\n", sock);
        return EXIT_FAIL;
    }
    char lib[PATH_MAX];
    if (library) {
        if (!realpath(library, lib)) {
            fprintf(stderr, "apir cdi: --library %s: %s\n", library, strerror(errno));
            return EXIT_FAIL;
        }
    } else {
        char found[PATH_MAX];
        if (!find_beside_exe("libggml-apir.so", found, sizeof(found)) || !realpath(found, lib)) {
            fprintf(stderr, "apir cdi: libggml-apir.so not found beside apir (or in %s from it): give --library\n", APIR_BIN_TO_LIB);
            return EXIT_FAIL;
        }
    }
    /* 0.3.0 is what every CDI runtime reads; additionalGids needs 0.7.0. */
    printf("{\n  \"cdiVersion\": \"%s\",\n  \"kind\": \"" CDI_KIND "\",\n  \"devices\": [\n    {\n      \"name\": ",
           add_gid ? "0.7.0" : "0.3.0");
    json_str(name);
    printf(",\n      \"containerEdits\": {\n");
    if (add_gid)
        printf("        \"additionalGids\": [%u],\n", (unsigned)gst.st_gid);
    printf("        \"env\": [\n          \"GGML_BACKEND_PATH=" CDI_LIBRARY "\",\n"
           "          ");
    char host_env[PATH_MAX + 64];
    snprintf(host_env, sizeof(host_env), "APIR_HOST=unix:" CDI_SOCKET_DIR "/%s", sock_name);
    json_str(host_env);
    printf("\n        ],\n        \"mounts\": [\n          { \"hostPath\": ");
    json_str(sock_dir);
    printf(", \"containerPath\": \"" CDI_SOCKET_DIR "\",\n            \"options\": [\"bind\", \"ro\", \"nosuid\", \"nodev\", \"noexec\"] },\n"
           "          { \"hostPath\": ");
    json_str(lib);
    printf(", \"containerPath\": \"" CDI_LIBRARY "\",\n            \"options\": [\"bind\", \"ro\", \"nosuid\", \"nodev\"] }\n"
           "        ]\n      }\n    }\n  ]\n}\n");
    return EXIT_OK;
}

/* ---- apir stat / apir ps ------------------------------------------------------- */

/* The host's control socket (apir-host --control; host/server/control.h): the
 * endpoint given if it names one (PATH.ctl), else the control socket beside
 * the host's socket (PATH + ".ctl").  It answers one line - json, text, ps
 * or metrics - with the document, then closes. */
static bool control_path(const char *cmd, const char *control, const char *endpoint, char *out, size_t len)
{
    char sock[PATH_MAX];
    const char *e = control ? control : endpoint;
    if (e && !strncmp(e, "virtgpu", 7)) {
        fprintf(stderr, "apir %s: '%s': a VM's host is seen on the hypervisor's machine: give its unix:PATH\n", cmd, e);
        return false;
    }
    if (e && apir_net_is_stream(e)) {
        fprintf(stderr, "apir %s: '%s': a host's control socket is on its own machine: run apir %s there, with its "
                "unix:PATH\n", cmd, e, cmd);
        return false;
    }
    if (!e) {
        apir_shm_default_path(sock, sizeof(sock));
        e = sock;
    } else if (!strncmp(e, "unix:", 5)) {
        e += 5;
    }
    const size_t n = strlen(e);
    const bool is_control = control || (n > 4 && !strcmp(e + n - 4, ".ctl"));
    if (snprintf(out, len, "%s%s", e, is_control ? "" : ".ctl") >= (int)len || strlen(out) >= 108) {
        fprintf(stderr, "apir %s: control socket path too long: %s%s\n", cmd, e, is_control ? "" : ".ctl");
        return false;
    }
    return true;
}

/* Asks the control socket at path for one document and writes it to
 * stdout; EXIT_FAIL with a message when it cannot. */
static int control_ask(const char *cmd, const char *path, const char *request)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        const int e = errno;
        fprintf(stderr, "apir %s: cannot reach the host's control socket %s: %s%s\n", cmd, path, strerror(e),
                e == EACCES ? " (it is the host's user's and root's: run as one of them, or start the host with "
                              "--control-group GROUP)"
                : e == ENOENT ? " (is the host running? its control socket is its socket's path + .ctl, or what "
                                "its --control says)"
                              : "");
        if (fd >= 0)
            close(fd);
        return EXIT_FAIL;
    }
    char line[32];
    int n = snprintf(line, sizeof(line), "%s\n", request);
    /* A host that refuses this peer answers at once and hangs up: the send
     * may fail (EPIPE), the answer is still there to read. */
    const bool sent = send(fd, line, (size_t)n, MSG_NOSIGNAL) == n;
    const int send_errno = errno;
    /* The whole answer first: an error line is not a document. */
    size_t cap = 1 << 16, len = 0;
    char *doc = malloc(cap);
    int rc = EXIT_OK;
    for (;;) {
        if (!doc) {
            fprintf(stderr, "apir %s: out of memory\n", cmd);
            rc = EXIT_FAIL;
            break;
        }
        if (len + 1 == cap) {
            char *d = realloc(doc, cap * 2);
            if (!d) {
                free(doc);
                doc = NULL;
                continue;
            }
            doc = d;
            cap *= 2;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 10000) <= 0) {
            fprintf(stderr, "apir %s: the host at %s did not answer in 10 s\n", cmd, path);
            rc = EXIT_FAIL;
            break;
        }
        ssize_t r = read(fd, doc + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "apir %s: %s: %s\n", cmd, path, strerror(errno));
            rc = EXIT_FAIL;
            break;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (rc == EXIT_OK && !sent && len == 0) {
        fprintf(stderr, "apir %s: %s: %s\n", cmd, path, strerror(send_errno));
        rc = EXIT_FAIL;
    }
    if (rc == EXIT_OK) {
        doc[len] = '\0';
        if (len == 0 || !strncmp(doc, "error:", 6)) {
            const char *why = "closed without an answer\n";
            if (len) {
                why = doc + 6;
                while (*why == ' ')
                    why++;
            }
            fprintf(stderr, "apir %s: the host at %s: %s", cmd, path, why);
            rc = EXIT_FAIL;
        } else if (fwrite(doc, 1, len, stdout) != len) {
            rc = EXIT_FAIL;
        }
    }
    free(doc);
    return rc;
}

static void stat_usage(FILE *out)
{
    fprintf(out,
            "usage: apir stat [options] [ENDPOINT]\n"
            "Prints what a running host does: its devices, limits and totals, and each connected guest\n"
            "(peer pid/uid/gid, uptime, device, buffers, bytes, blobs, graphs, commands, quota use).\n"
            "It asks the host's control socket, which only root and the host's user may use (or the\n"
            "members of its --control-group); a guest's own socket never tells.\n"
            "  ENDPOINT, -H, --host ENDPOINT  the host's socket, unix:PATH or /PATH: its control socket is\n"
            "                          PATH.ctl (a path ending in .ctl is taken as the control socket)\n"
            "                          (default: $APIR_HOST, else $XDG_RUNTIME_DIR/apir/host.sock or /run/apir/host.sock)\n"
            "  -C, --control unix:PATH  the control socket itself (the host's --control)\n"
            "      --json              the JSON document (docs/DEPLOY.md describes it)\n"
            "      --prometheus        the Prometheus metrics, as --metrics-file writes them\n"
            "  -h, --help              this help\n"
            "%s",
            exit_status_text);
}

static void ps_usage(FILE *out)
{
    fprintf(out,
            "usage: apir ps [options] [ENDPOINT]\n"
            "Lists the guests a running host serves, one line each: guest id, peer pid/uid/gid and process\n"
            "name, state, uptime, device, buffers, bytes, blobs, graphs, commands, refused commands.\n"
            "It asks the host's control socket (see apir stat --help).\n"
            "  ENDPOINT, -H, --host ENDPOINT  the host's socket (its control socket is PATH.ctl)\n"
            "  -C, --control unix:PATH  the control socket itself (the host's --control)\n"
            "      --json              the whole JSON document, as apir stat --json\n"
            "  -h, --help              this help\n"
            "%s",
            exit_status_text);
}

/* stat and ps: options, then at most one ENDPOINT. */
static int cmd_stat_ps(int argc, char **argv)
{
    const bool ps = !strcmp(argv[0], "ps");
    enum { OPT_JSON = 256, OPT_PROMETHEUS };
    static const struct option stat_opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { "control", required_argument, NULL, 'C' },
        { "json", no_argument, NULL, OPT_JSON },
        { "prometheus", no_argument, NULL, OPT_PROMETHEUS },
        { NULL, 0, NULL, 0 },
    };
    static const struct option ps_opts[] = {
        { "help", no_argument, NULL, 'h' },
        { "host", required_argument, NULL, 'H' },
        { "control", required_argument, NULL, 'C' },
        { "json", no_argument, NULL, OPT_JSON },
        { NULL, 0, NULL, 0 },
    };
    const char *given = NULL, *control = NULL, *request = ps ? "ps" : "text";
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hH:C:", ps ? ps_opts : stat_opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            (ps ? ps_usage : stat_usage)(stdout);
            return EXIT_OK;
        case 'H':
            given = optarg;
            break;
        case 'C':
            if (strncmp(optarg, "unix:", 5) != 0 && optarg[0] != '/') {
                fprintf(stderr, "apir %s: --control %s: give unix:PATH or /PATH\n", argv[0], optarg);
                return EXIT_USAGE;
            }
            control = optarg;
            break;
        case OPT_JSON:
            request = "json";
            break;
        case OPT_PROMETHEUS:
            request = "metrics";
            break;
        default:
            return bad_option(argv[0], c, argv);
        }
    }
    if (!positional_endpoint(argc, argv, &given))
        return EXIT_USAGE;
    const char *endpoint = NULL;
    char path[PATH_MAX];
    if ((!control && !pick_endpoint(argv[0], given, &endpoint)) || !control_path(argv[0], control, endpoint, path, sizeof(path)))
        return EXIT_USAGE;
    return control_ask(argv[0], path, request);
}

/* ---- apir ----------------------------------------------------------------------- */

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);  /* argv[0]: the command's name */
    void (*usage)(FILE *out);
    const char *synopsis;
    const char *summary;
};

static const struct command commands[] = {
    { "ping", cmd_ping_info, ping_usage, "ping [ENDPOINTS] [-n N]", "round trip to a host (to each host listed)" },
    { "info", cmd_ping_info, info_usage, "info [ENDPOINTS]", "the host's version and devices (each host's listed)" },
    { "run", cmd_run, run_usage, "run [options] [--] CMD ...", "run a ggml program on an APIR device" },
    { "stat", cmd_stat_ps, stat_usage, "stat [ENDPOINT] [--json]", "what a running host does: devices, guests, totals" },
    { "ps", cmd_stat_ps, ps_usage, "ps [ENDPOINT] [--json]", "the guests a running host serves" },
    { "cdi", cmd_cdi, cdi_usage, "cdi [-H ENDPOINT]", "a CDI spec: containers get the socket and the library" },
};

static void usage(FILE *out)
{
    fprintf(out, "usage: apir [--version] [--help] COMMAND [options]\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  apir %-28s%s\n", commands[i].synopsis, commands[i].summary);
    fprintf(out, "  apir help COMMAND                a command's options (or: apir COMMAND --help)\n"
                 "  apir --version                   apir's version, the APIR protocol version and the ggml it was built against\n"
                 "ENDPOINT: unix:PATH, /PATH, tcp:HOST:PORT, tls:HOST:PORT, vsock:CID:PORT or virtgpu[:NODE];\n"
                 "          default $APIR_HOST, else the default socket\n"
                 "ENDPOINTS: an ENDPOINT or a comma-separated list of them, as APIR_HOST takes (ping, info, run)\n"
                 "%s"
                 "             apir run: CMD's own status; 125, 126, 127 as apir run --help says\n",
            exit_status_text);
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *a = argv[1];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(a, "--version") || !strcmp(a, "version")) {
        APIR_PRINT_VERSION(stdout, "apir");
        return EXIT_OK;
    }
    if (!strcmp(a, "help")) {
        const struct command *c = argc > 2 ? find_command(argv[2]) : NULL;
        if (argc > 2 && !c) {
            fprintf(stderr, "apir: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return EXIT_USAGE;
        }
        if (c)
            c->usage(stdout);
        else
            usage(stdout);
        return EXIT_OK;
    }
    const struct command *c = find_command(a);
    if (!c) {
        fprintf(stderr, "apir: unknown %s '%s'\n", a[0] == '-' ? "option" : "command", a);
        usage(stderr);
        return EXIT_USAGE;
    }
    return c->fn(argc - 1, argv + 1);
}
