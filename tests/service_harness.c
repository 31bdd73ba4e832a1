/*
 * Helpers for tests/run_service.sh (apir-host as a service: host/server/service.c):
 *
 *   service_harness notify-recv PATH OUT TIMEOUT_MS
 *       a service manager's notification socket: binds a datagram socket at
 *       PATH and appends each notification to OUT (one line per VAR=VALUE,
 *       then "--"), until STOPPING=1 arrives or TIMEOUT_MS passes (exit 1).
 *   service_harness activate PATH PROGRAM [ARGS...]
 *       socket activation as systemd does it, for machines without
 *       systemd-socket-activate: binds and listens on a SOCK_SEQPACKET socket
 *       at PATH, puts it at fd 3 and execs PROGRAM with LISTEN_FDS=1 and
 *       LISTEN_PID=its pid (exec keeps the pid).
 *   service_harness ggml-log FRONTEND
 *       a program that captures ggml's log (ggml_log_set, as llama-server
 *       does): loads the frontend library and prints every line ggml's
 *       logger got as "captured: LINE" on stdout.
 */
#include "ggml-backend.h"
#include "ggml.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int bind_unix(const char *path, int type)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "service_harness: path too long: %s\n", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    unlink(path);
    int fd = socket(AF_UNIX, type, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        fprintf(stderr, "service_harness: bind %s: %s\n", path, strerror(errno));
        return -1;
    }
    return fd;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int notify_recv(const char *path, const char *out_path, long timeout_ms)
{
    int fd = bind_unix(path, SOCK_DGRAM | SOCK_CLOEXEC);
    if (fd < 0)
        return 2;
    const long long deadline = now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            fprintf(stderr, "service_harness: no STOPPING=1 within %ld ms\n", timeout_ms);
            return 1;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
        if (n < 0)
            continue;
        buf[n] = '\0';
        FILE *out = fopen(out_path, "a");
        if (!out)
            return 2;
        fprintf(out, "%s\n--\n", buf);
        fclose(out);
        if (strstr(buf, "STOPPING=1"))
            return 0;
    }
}

static int activate(const char *path, char **argv)
{
    int fd = bind_unix(path, SOCK_SEQPACKET);
    if (fd < 0 || listen(fd, 16) != 0)
        return 2;
    if (fd != 3 && (dup2(fd, 3) != 3 || close(fd) != 0))
        return 2;
    char pid[24];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("LISTEN_FDS", "1", 1);
    setenv("LISTEN_PID", pid, 1);
    execv(argv[0], argv);
    fprintf(stderr, "service_harness: exec %s: %s\n", argv[0], strerror(errno));
    return 127;
}

static void capture(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)user;
    printf("captured: %s", text);
    fflush(stdout);
}

static int ggml_log_capture(const char *frontend)
{
    ggml_log_set(capture, NULL);
    ggml_backend_reg_t reg = ggml_backend_load(frontend);
    if (!reg) {
        fprintf(stderr, "service_harness: cannot load %s\n", frontend);
        return 1;
    }
    printf("devices: %zu\n", ggml_backend_reg_dev_count(reg));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "notify-recv"))
        return notify_recv(argv[2], argv[3], strtol(argv[4], NULL, 10));
    if (argc >= 4 && !strcmp(argv[1], "activate"))
        return activate(argv[2], argv + 3);
    if (argc == 3 && !strcmp(argv[1], "ggml-log"))
        return ggml_log_capture(argv[2]);
    fprintf(stderr, "usage: service_harness notify-recv PATH OUT TIMEOUT_MS | activate PATH PROGRAM [ARGS...] | "
                    "ggml-log FRONTEND\n");
    return 2;
}
