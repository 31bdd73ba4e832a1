/*
 * apir: the command-line client.
 *
 *   apir ping [ENDPOINT] [-n N]    handshake, versions, null-call round trip p50/p99
 *   apir info [ENDPOINT]           devices, memory, buffer types, alignment
 *   apir run [--backend B] [--threads N] [--host-arg ARG]... -- CMD [ARGS...]
 *        starts an apir-host on a private socket (unless APIR_HOST is set),
 *        runs CMD with libggml-apir.so injected (GGML_BACKEND_PATH, APIR_HOST),
 *        then stops the host.
 */
#include "apir_log.h"
#include "apir_proto.h"
#include "calls.h"
#include "transport.h"
#include "wait.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmd_ping(const char *endpoint, int n)
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
    printf("null call (DEVICE_GET_COUNT) x %d: p50 %.2f us, p99 %.2f us, max %.2f us\n", n, (double)lat[n / 2] / 1e3,
           (double)lat[(size_t)n * 99 / 100] / 1e3, (double)lat[n - 1] / 1e3);
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

static int cmd_info(const char *endpoint)
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
    if (r.minor >= 3 && apir_call_HOST_GET_VERSION(&r, &lib_major, &lib_minor) == APIR_HANDLER_OK)
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
        printf("device %u: %s - %s [%s]\n", i, name.s, desc.s, type_name(type));
        printf("  memory: %llu MiB free of %llu MiB\n", (unsigned long long)(free_mem >> 20),
               (unsigned long long)(total >> 20));
        printf("  buffer type: %s, alignment %llu, max size %llu MiB\n", buft_name.s, (unsigned long long)align,
               (unsigned long long)(max_size >> 20));
        printf("  props: buffer_from_host_ptr %s\n", from_ptr ? "yes" : "no");
    }
    apir_remote_close(&r);
    return 0;
}

/* Finds a file next to this executable or in ../lib. */
static bool find_beside_exe(const char *name, char *out, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return false;
    exe[n] = '\0';
    char *dir = dirname(exe);
    const char *cands[] = { "%s/%s", "%s/../lib/%s", "%s/../bin/%s" };
    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        snprintf(out, len, cands[i], dir, name);
        if (access(out, F_OK) == 0)
            return true;
    }
    return false;
}

static volatile sig_atomic_t child_pid;

static void forward_signal(int sig)
{
    if (child_pid > 0)
        kill(child_pid, sig);
}

static int cmd_run(int argc, char **argv)
{
    const char *host_args[32];
    int n_host_args = 0;
    int i = 0;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (i + 1 < argc && (!strcmp(argv[i], "--backend") || !strcmp(argv[i], "--threads")) && n_host_args < 28) {
            host_args[n_host_args++] = argv[i];
            host_args[n_host_args++] = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--host-arg") && n_host_args < 30) {
            host_args[n_host_args++] = argv[++i];
        } else {
            fprintf(stderr, "apir run: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "usage: apir run [--backend B] [--threads N] [--host-arg ARG]... -- CMD [ARGS...]\n");
        return 2;
    }
    char frontend[PATH_MAX], host_bin[PATH_MAX];
    if (!find_beside_exe("libggml-apir.so", frontend, sizeof(frontend))) {
        fprintf(stderr, "apir run: libggml-apir.so not found beside %s\n", argv[0]);
        return 1;
    }
    pid_t host_pid = 0;
    char endpoint[PATH_MAX + 8];
    char dir[] = "/tmp/apir-run-XXXXXX";
    const char *given = getenv("APIR_HOST");
    if (given && *given) {
        snprintf(endpoint, sizeof(endpoint), "%s", given);
    } else {
        if (!find_beside_exe("apir-host", host_bin, sizeof(host_bin)) || !mkdtemp(dir)) {
            fprintf(stderr, "apir run: apir-host not found beside apir\n");
            return 1;
        }
        snprintf(endpoint, sizeof(endpoint), "unix:%s/host.sock", dir);
        host_pid = fork();
        if (host_pid == 0) {
            const char *args[40] = { host_bin, "--listen", endpoint, "--log-level", "warn" };
            int k = 5;
            for (int j = 0; j < n_host_args; j++)
                args[k++] = host_args[j];
            args[k] = NULL;
            execv(host_bin, (char *const *)args);
            _exit(127);
        }
        /* Wait (bounded) for the socket to appear. */
        char sock[PATH_MAX];
        snprintf(sock, sizeof(sock), "%s/host.sock", dir);
        struct stat st;
        for (int t = 0; t < 500 && stat(sock, &st) != 0; t++) {
            int status;
            if (waitpid(host_pid, &status, WNOHANG) == host_pid) {
                fprintf(stderr, "apir run: apir-host exited during start\n");
                return 1;
            }
            usleep(10000);
        }
        fprintf(stderr, "apir run: started apir-host (pid %d) on %s\n", (int)host_pid, endpoint);
    }
    setenv("GGML_BACKEND_PATH", frontend, 1);
    setenv("APIR_HOST", endpoint, 1);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[i], argv + i);
        fprintf(stderr, "apir run: cannot run %s: %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    signal(SIGINT, forward_signal);
    signal(SIGTERM, forward_signal);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (host_pid > 0) {
        kill(host_pid, SIGTERM);
        waitpid(host_pid, NULL, 0);
        rmdir(dir);
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void usage(FILE *out)
{
    fprintf(out, "usage:\n"
                 "  apir ping [ENDPOINT] [-n N]   round trip to a host (default endpoint: $APIR_HOST or the default socket)\n"
                 "  apir info [ENDPOINT]          the host's devices\n"
                 "  apir run [--backend B] [--threads N] [--host-arg ARG]... -- CMD [ARGS...]\n"
                 "                                run a ggml program on an APIR device\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *endpoint = getenv("APIR_HOST");
    int n = 10000;
    if (!strcmp(argv[1], "run"))
        return cmd_run(argc - 2, argv + 2);
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else
            endpoint = argv[i];
    }
    if (n < 1)
        n = 1;
    if (!strcmp(argv[1], "ping"))
        return cmd_ping(endpoint, n);
    if (!strcmp(argv[1], "info"))
        return cmd_info(endpoint);
    usage(stderr);
    return 2;
}
