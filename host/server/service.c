/*
 * systemd's socket activation and readiness notification, implemented from
 * their documented protocols (see service.h for why not libsystemd).
 *
 * Socket activation: the manager binds the socket (apir-host.socket:
 * ListenSequentialPacket=, SocketMode=, SocketGroup=) and starts the service
 * with it as fd 3, LISTEN_FDS=1 and LISTEN_PID set to the service's pid: the
 * pid check keeps a child that inherited the environment from taking an fd
 * that is not its.  Notification: NOTIFY_SOCKET is the path of a datagram
 * socket (or "@name" in the abstract namespace); each datagram is lines of
 * VAR=VALUE (READY=1, STOPPING=1, STATUS=...).
 */
#include "service.h"

#include "apir_log.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static pthread_once_t service_once = PTHREAD_ONCE_INIT;
static long listen_pid = -1;            /* LISTEN_PID, -1: unset or unreadable */
static long listen_fds = 0;             /* LISTEN_FDS */
static bool listen_taken;
static char notify_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];

static long env_long(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 0 ? -1 : v;
}

static void service_setup(void)
{
    listen_pid = env_long("LISTEN_PID");
    listen_fds = env_long("LISTEN_FDS");
    const char *ns = getenv("NOTIFY_SOCKET");
    if (ns && (ns[0] == '/' || ns[0] == '@') && strlen(ns) < sizeof(notify_path))
        snprintf(notify_path, sizeof(notify_path), "%s", ns);
    else if (ns && *ns)
        APIR_WARN("host", "NOTIFY_SOCKET=%s: not a Unix socket path; no readiness notification", ns);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    unsetenv("NOTIFY_SOCKET");
}

void apir_service_init(void)
{
    pthread_once(&service_once, service_setup);
}

int apir_service_listen_fd(char *err, size_t err_len)
{
    apir_service_init();
    if (listen_taken || listen_pid < 0 || listen_fds <= 0)
        return -1;
    if (listen_pid != (long)getpid()) {
        APIR_DEBUG("host", "LISTEN_PID %ld is not this process (%d): no socket activation", listen_pid, (int)getpid());
        return -1;
    }
    listen_taken = true;
    if (listen_fds != 1) {
        snprintf(err, err_len, "socket activation passed %ld sockets; apir-host serves one (one ListenSequentialPacket=)",
                 listen_fds);
        return -2;
    }
    const int fd = APIR_SERVICE_LISTEN_FDS_START;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
        snprintf(err, err_len, "socket activation: fd %d: %s", fd, strerror(errno));
        return -2;
    }
    return fd;
}

bool apir_service_notify_enabled(void)
{
    apir_service_init();
    return notify_path[0] != '\0';
}

bool apir_service_notify(const char *state)
{
    apir_service_init();
    if (!notify_path[0] || !state)
        return false;
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    size_t len = strlen(notify_path);
    memcpy(addr.sun_path, notify_path, len);
    if (addr.sun_path[0] == '@')
        addr.sun_path[0] = '\0';  /* abstract namespace: no terminating NUL counted */
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (notify_path[0] == '@' ? 0 : 1));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr, alen);
    int saved = errno;
    close(fd);
    if (n != (ssize_t)strlen(state)) {
        APIR_WARN("host", "service notification to %s failed: %s", notify_path, n < 0 ? strerror(saved) : "short send");
        return false;
    }
    return true;
}

void apir_service_ready(const char *status)
{
    if (!apir_service_notify_enabled())
        return;
    char msg[512];
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", status ? status : "serving");
    if (apir_service_notify(msg))
        APIR_DEBUG("host", "told the service manager: ready");
}

void apir_service_stopping(void)
{
    if (apir_service_notify_enabled())
        apir_service_notify("STOPPING=1\nSTATUS=shutting down");
}

void apir_service_status(const char *fmt, ...)
{
    if (!apir_service_notify_enabled())
        return;
    char msg[512] = "STATUS=";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + 7, sizeof(msg) - 7, fmt, ap);
    va_end(ap);
    apir_service_notify(msg);
}

bool apir_service_resolve_group(const char *group, const char *option, gid_t *gid, char *err, size_t err_len)
{
    if (isdigit((unsigned char)group[0])) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(group, &end, 10);
        if (!errno && !*end && v < 0xFFFFFFFFul) {
            *gid = (gid_t)v;
            return true;
        }
    }
    struct group gr, *res = NULL;
    char buf[4096];
    if (getgrnam_r(group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
        snprintf(err, err_len, "unknown group %s (%s)", group, option);
        return false;
    }
    *gid = res->gr_gid;
    return true;
}

bool apir_peer_cred(int fd, struct ucred *out)
{
    socklen_t len = sizeof(*out);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &len) != 0 || len != sizeof(*out)) {
        *out = (struct ucred){ .pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1 };
        return false;
    }
    return true;
}
