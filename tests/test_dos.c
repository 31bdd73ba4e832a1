/*
 * Denial of service and the host's log (issue 24, class 4) against a real
 * apir-host, one case per run:
 *
 *   hangup_uid     a local peer of another uid connects and hangs up in a
 *                  loop while 60 honest guests connect, one every 100 ms:
 *                  how many are admitted (all: its buckets are its own)
 *   hangup_tcp     the same from an unauthenticated TCP peer (another
 *                  address; the host has a token), honest guests over TCP
 *   silent_tenant  a peer of the guests' own uid in another cgroup (another
 *                  container) keeps 64 silent connections open; then the
 *                  same with --tenant-by uid, where the guests share its
 *                  tenant: what that setting costs them
 *   many_guests    64 guests at once: as 64 tenants with the default limits,
 *                  as one tenant with the documented setting
 *   memory_quota   the default per-guest quota refuses a buffer of 60 % of
 *                  the machine's memory (CPU host: half of it), saying which
 *                  option; --max-alloc-mib 0 lifts it
 *   log_rate_process, log_rate_thread
 *                  a guest sends 10000 refused commands: the host logs a
 *                  bounded number of them and says how many it suppressed,
 *                  which add up to 10000; its own lines still come
 *   log_escape     a process name and a TLS key identity with a newline and
 *                  escape codes reach the log escaped: no forged line, no
 *                  escape byte
 * Each prints its figures ("figure: ...").  Cases that need root (another
 * uid, a cgroup of their own) say "skip" and pass without it.
 *
 * usage: test_dos APIR-HOST CASE
 */
#include "apir_commands.h"
#include "apir_log.h"
#include "apir_proto.h"
#include "calls.h"
#include "ggml.h"
#include "remote.h"
#include "shm_proto.h"
#include "test_host.h"
#include "test_util.h"
#include "transport.h"
#include "wait.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_UID 54321
#define TOKEN "dos-test-token"
#define HONEST 60
#define HONEST_EVERY_MS 100

static const char *host_bin;
static char dir[64], sock_path[100], log_path[120], unix_ep[160], stream_ep[80];
static pid_t host_pid = -1;

/* Lines of the host's log that name `who` (an attacker's uid or address). */
static long log_lines_of(const char *who)
{
    char *t = text_read(log_path);
    long n = 0;
    for (char *line = t, *eol; *line; line = eol + 1) {
        eol = strchr(line, '\n');
        if (!eol)
            break;
        *eol = '\0';
        n += strstr(line, who) != NULL;
    }
    free(t);
    return n;
}

/* Starts apir-host on the Unix socket, the stream listener `stream` (NULL:
 * none) and extra options; its log (level info) to log_path. */
static bool start_host(const char *stream, const char *const *extra)
{
    unlink(sock_path);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return false;
    close(fd);
    const char *argv[48];
    int n = 0;
    argv[n++] = host_bin;
    argv[n++] = "--listen";
    argv[n++] = unix_ep;
    if (stream) {
        argv[n++] = "--listen";
        argv[n++] = stream;
    }
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    for (int i = 0; extra && extra[i] && n < 46; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    host_pid = host_spawn(argv, log_path);
    stream_ep[0] = '\0';
    uint64_t t0 = apir_now_ns();
    while (stream && !stream_ep[0] && ms_since(t0) < 20000) {
        char *t = text_read(log_path);
        const char *p = strstr(t, "serving tcp:127.0.0.1:");
        if (!p)
            p = strstr(t, "serving tls:127.0.0.1:");
        if (p) {
            const int port = atoi(p + strlen("serving tcp:127.0.0.1:"));
            snprintf(stream_ep, sizeof(stream_ep), "%.3s:127.0.0.1:%d", p + strlen("serving "), port);
        }
        free(t);
        usleep(10000);
    }
    if (!wait_for_path(sock_path, 10000) || (stream && !stream_ep[0])) {
        char *t = text_read(log_path);
        fprintf(stderr, "the host did not start; its log:\n%s\n", t);
        free(t);
        return false;
    }
    chmod(sock_path, 0777);  /* the cross-uid peer connects too */
    return true;
}

static void stop_host(void)
{
    host_reap(host_pid, SIGTERM);
    host_pid = -1;
}

static bool host_alive(void)
{
    return host_pid > 0 && waitpid(host_pid, NULL, WNOHANG) == 0;
}

/* ---- guests and attackers ----------------------------------------------------- */

/* n honest guests, one every every_ms: how many were served (connected and
 * answered); the reasons of the first refusal kept in why. */
static int honest_guests(const char *ep, int n, int every_ms, char *why, size_t why_len)
{
    int served = 0;
    why[0] = '\0';
    for (int i = 0; i < n; i++) {
        const uint64_t t0 = apir_now_ns();
        char err[256] = "";
        if (guest_served(ep, err, sizeof(err)))
            served++;
        else if (!why[0])
            snprintf(why, why_len, "%s", err);
        const double left = every_ms - ms_since(t0);
        if (left > 0)
            usleep((useconds_t)(left * 1000));
    }
    return served;
}

/* A count an attacker child adds to (shared memory). */
static _Atomic long *shared_counter(void)
{
    void *p = mmap(NULL, sizeof(_Atomic long), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int unix_connect(void)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A TCP connection to the host's stream port from source address src. */
static int tcp_connect_from(const char *src)
{
    const char *colon = strrchr(stream_ep, ':');
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
    struct sockaddr_in from = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    inet_pton(AF_INET, src, &from.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* The port is chosen at connect: a bind to port 0 searches past every
     * port in TIME_WAIT, and would slow the loop to a crawl. */
    const int one = 1;
    if (fd >= 0)
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    if (fd >= 0 && (bind(fd, (struct sockaddr *)&from, sizeof(from)) != 0 ||
                    connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

enum attack { HANGUP_UNIX, HANGUP_TCP, SILENT_UNIX };

/*
 * An attacker child: as uid (0: ours), in cgroup_procs' cgroup (NULL: ours),
 * until killed.  HANGUP_*: connect and hang up, in a loop, as fast as it
 * can (TCP: eight processes); SILENT_UNIX: keep 64 connections open that never speak (one the
 * host closes or refuses is opened again).  Connections made go to *count.
 */
static pid_t attacker(enum attack kind, uid_t uid, const char *cgroup_procs, _Atomic long *count)
{
    int ready[2];
    if (pipe(ready) != 0)
        return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(ready[1]);
        char b = 0;
        const bool ok = pid > 0 && read(ready[0], &b, 1) == 1 && b == 1;
        close(ready[0]);
        if (!ok && pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        return pid;
    }
    close(ready[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (cgroup_procs) {
        FILE *f = fopen(cgroup_procs, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0)
            _exit(2);
    }
    if (uid != 0 && (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0))
        _exit(3);
    char b = 1;
    if (write(ready[1], &b, 1) != 1)
        _exit(4);
    close(ready[1]);
    if (kind == SILENT_UNIX) {
        int fds[64];
        for (int i = 0; i < 64; i++)
            fds[i] = -1;
        for (;;) {
            for (int i = 0; i < 64; i++) {
                struct pollfd p = { .fd = fds[i], .events = POLLIN };
                if (fds[i] >= 0 && poll(&p, 1, 0) == 0)
                    continue;  /* still open and silent */
                if (fds[i] >= 0)
                    close(fds[i]);
                fds[i] = unix_connect();
                (*count)++;
            }
            usleep(20000);
        }
    }
    /* A TCP connect on loopback takes ~10 ms here: eight loops at once. */
    for (int i = 0; kind == HANGUP_TCP && i < 7; i++)
        if (fork() == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            break;
        }
    for (;;) {
        int fd = kind == HANGUP_UNIX ? unix_connect() : tcp_connect_from("127.0.0.2");
        if (fd >= 0)
            close(fd);
        (*count)++;
    }
}

static void attacker_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/*
 * A cgroup of our own (another container, as far as the host can tell):
 * its cgroup.procs path in procs, or false when none can be made (no
 * writable cgroup file system: not root, or a container's read-only one).
 */
static bool make_cgroup(const char *name, char *path, size_t len, char *procs, size_t procs_len)
{
    static const char *const bases[] = { "/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/freezer",
                                         "/sys/fs/cgroup/systemd" };
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        char test[256];
        snprintf(test, sizeof(test), "%s/cgroup.procs", bases[i]);
        if (access(test, F_OK) != 0)
            continue;
        snprintf(path, len, "%s/%s", bases[i], name);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            continue;
        snprintf(procs, procs_len, "%s/cgroup.procs", path);
        if (access(procs, W_OK) == 0)
            return true;
        rmdir(path);
    }
    return false;
}

/* ---- cases ------------------------------------------------------------------- */

/* A local peer of another uid hangs up in a loop: honest guests admitted. */
static void test_hangup_uid(void)
{
    if (geteuid() != 0) {
        printf("skip: another uid needs root\n");
        return;
    }
    CHECK(start_host(NULL, NULL));
    _Atomic long *count = shared_counter();
    const pid_t a = attacker(HANGUP_UNIX, OTHER_UID, NULL, count);
    CHECK(a > 0);
    usleep(300000);
    const uint64_t t0 = apir_now_ns();
    char why[256];
    const int served = honest_guests(unix_ep, HONEST, HONEST_EVERY_MS, why, sizeof(why));
    const double secs = ms_since(t0) / 1000;
    const long attacks = *count;
    attacker_stop(a);
    const double all_secs = ms_since(t0) / 1000 + 0.3;
    usleep(100000);
    const long lines = log_lines_of("uid 54321");
    printf("figure: hang-up loop from uid %d (%ld connections in %.1f s, %.0f/s): %d of %d honest guests admitted; "
           "%ld host log lines about the attacker%s%s\n", OTHER_UID, attacks, secs, attacks / secs, served, HONEST,
           lines, why[0] ? "; first refusal: " : "", why);
    CHECK_MSG(served == HONEST, "%d of %d admitted (%s)", served, HONEST, why);
    CHECK(attacks > 100);
    /* Its refusals are logged within its tenant's share of the log. */
    CHECK_MSG(lines <= 100 + 10 * all_secs + all_secs + 2, "%ld log lines in %.1f s", lines, all_secs);
    CHECK(host_alive());
    stop_host();
}

/* An unauthenticated TCP peer (another address) hangs up in a loop. */
static void test_hangup_tcp(void)
{
    char token_file[160];
    snprintf(token_file, sizeof(token_file), "%s/token", dir);
    FILE *f = fopen(token_file, "w");
    CHECK(f && fputs(TOKEN "\n", f) >= 0 && fclose(f) == 0);
    chmod(token_file, 0600);
    const char *extra[] = { "--token-file", token_file, NULL };
    CHECK(start_host("tcp:127.0.0.1:0", extra));
    setenv("APIR_TOKEN", TOKEN, 1);
    _Atomic long *count = shared_counter();
    const pid_t a = attacker(HANGUP_TCP, 0, NULL, count);
    CHECK(a > 0);
    usleep(300000);
    const uint64_t t0 = apir_now_ns();
    char why[256];
    const int served = honest_guests(stream_ep, HONEST, HONEST_EVERY_MS, why, sizeof(why));
    const double secs = ms_since(t0) / 1000;
    const long attacks = *count;
    attacker_stop(a);
    unsetenv("APIR_TOKEN");
    const double all_secs = ms_since(t0) / 1000 + 0.3;
    usleep(100000);
    const long lines = log_lines_of("127.0.0.2");
    printf("figure: unauthenticated TCP hang-up loop from 127.0.0.2 (%ld connections in %.1f s, %.0f/s): %d of %d "
           "honest TCP guests (127.0.0.1, with the token) admitted; %ld host log lines about the attacker%s%s\n",
           attacks, secs, attacks / secs, served, HONEST, lines, why[0] ? "; first refusal: " : "", why);
    CHECK_MSG(served == HONEST, "%d of %d admitted (%s)", served, HONEST, why);
    CHECK(attacks > 100);
    CHECK_MSG(lines <= 100 + 10 * all_secs + all_secs + 2, "%ld log lines in %.1f s", lines, all_secs);
    CHECK(host_alive());
    stop_host();
}

/* 64 silent connections of the guests' own uid from another cgroup. */
static int silent_run(const char *tenant_by, const char *procs, long *attacks)
{
    const char *extra[] = { "--tenant-by", tenant_by, "--handshake-timeout-ms", "1000", NULL };
    CHECK(start_host(NULL, extra));
    _Atomic long *count = shared_counter();
    const pid_t a = attacker(SILENT_UNIX, 0, procs, count);
    CHECK(a > 0);
    usleep(300000);
    char why[256];
    const int served = honest_guests(unix_ep, HONEST, HONEST_EVERY_MS, why, sizeof(why));
    *attacks = *count;
    attacker_stop(a);
    printf("figure: --tenant-by %s: 64 silent connections of uid 0 from another cgroup (%ld connections opened): %d "
           "of %d honest guests of uid 0 admitted%s%s\n", tenant_by, *attacks, served, HONEST,
           why[0] ? "; first refusal: " : "", why);
    CHECK(host_alive());
    stop_host();
    return served;
}

static void test_silent_tenant(void)
{
    char cg[200], procs[240];
    if (geteuid() != 0 || !make_cgroup("apir-dos-tenant", cg, sizeof(cg), procs, sizeof(procs))) {
        printf("skip: no cgroup of our own can be made here (root and a writable cgroup file system)\n");
        return;
    }
    long attacks = 0;
    const int by_cgroup = silent_run("cgroup", procs, &attacks);
    CHECK_MSG(by_cgroup == HONEST, "--tenant-by cgroup: %d of %d admitted", by_cgroup, HONEST);
    CHECK(attacks >= 64);
    /* One tenant for the whole uid: the silent connections take its share
     * (--max-clients-per-tenant 16) whenever they are open. */
    const int by_uid = silent_run("uid", procs, &attacks);
    CHECK_MSG(by_uid < HONEST, "--tenant-by uid: %d of %d admitted: the attack did not reach them", by_uid, HONEST);
    rmdir(cg);
}

/*
 * n guests at once, each staying connected until all have tried, as uid
 * base + i (base 0: all ours, one tenant): how many were admitted.
 */
static int guests_at_once(int n, uid_t base)
{
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return -1;
    pid_t pids[128];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(ready[0]);
            close(go[1]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (base && (setgroups(0, NULL) != 0 || setgid(base + (uid_t)i) != 0 || setuid(base + (uid_t)i) != 0))
                _exit(2);
            struct apir_remote r;
            char err[256];
            int32_t count = 0;
            const char ok = apir_remote_open(&r, unix_ep, 0, err, sizeof(err)) &&
                            apir_call_DEVICE_GET_DEVICE_COUNT(&r, &count) == APIR_HANDLER_OK && count == 1;
            if (write(ready[1], &ok, 1) != 1)
                _exit(3);
            char b;
            if (read(go[0], &b, 1) < 0)
                _exit(4);
            if (ok)
                apir_remote_close(&r);
            _exit(0);
        }
    }
    close(ready[1]);
    close(go[0]);
    int admitted = 0;
    for (int i = 0; i < n; i++) {
        char ok = 0;
        if (read(ready[0], &ok, 1) == 1)
            admitted += ok;
    }
    close(go[1]);  /* all go */
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            waitpid(pids[i], NULL, 0);
    close(ready[0]);
    return admitted;
}

/*
 * 64 guests at once (issue 26 item 4): as 64 tenants, with the default
 * limits; as one tenant, with the documented setting (and, for the figure,
 * with the defaults: its share).
 */
static void test_many_guests(void)
{
    if (geteuid() != 0) {
        printf("skip: 64 tenants (uids) need root\n");
        return;
    }
    CHECK(start_host(NULL, NULL));
    const int tenants = guests_at_once(64, 60000);
    printf("figure: 64 guests at once as 64 tenants (uids), default limits: %d admitted\n", tenants);
    CHECK_MSG(tenants == 64, "%d of 64 admitted", tenants);
    usleep(500000);  /* their workers end */
    const int shared = guests_at_once(64, 0);
    printf("figure: 64 guests at once of one tenant, default limits: %d admitted (--max-clients-per-tenant 16)\n",
           shared);
    CHECK(shared <= 16);
    stop_host();
    const char *setting[] = { "--max-clients-per-tenant", "64", "--spawn-burst", "64", NULL };
    CHECK(start_host(NULL, setting));
    const int one = guests_at_once(64, 0);
    printf("figure: 64 guests at once of one tenant, --max-clients-per-tenant 64 --spawn-burst 64: %d admitted\n", one);
    CHECK_MSG(one == 64, "%d of 64 admitted", one);
    stop_host();
}

/* Captures the guest library's log lines (the limit's reason). */
static pthread_mutex_t glog_lock = PTHREAD_MUTEX_INITIALIZER;
static char glog[16384];
static size_t glog_len;

static void glog_sink(enum apir_log_level level, const char *line)
{
    (void)level;
    pthread_mutex_lock(&glog_lock);
    size_t n = strlen(line);
    if (glog_len + n < sizeof(glog)) {
        memcpy(glog + glog_len, line, n + 1);
        glog_len += n;
    }
    pthread_mutex_unlock(&glog_lock);
}

/* A buffer of `bytes`: the call's result and the handle (0 if none). */
static int alloc_result(struct apir_remote *r, uint64_t bytes, uint64_t *buf)
{
    uint64_t buft = 0;
    *buf = 0;
    apir_call_DEVICE_GET_BUFFER_TYPE(r, &buft);
    return apir_call_BUFFER_TYPE_ALLOC_BUFFER(r, buft, bytes, buf);
}

static void test_memory_quota(void)
{
    const uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t big = ram / 10 * 6 >> 20 << 20;  /* 60 %: above the default's half */
    apir_log_set_sink(glog_sink);
    apir_log_set_level(APIR_LOG_WARN);
    CHECK(start_host(NULL, NULL));
    struct apir_remote r;
    uint64_t buf = 0;
    CHECK(guest_open(&r, unix_ep, NULL, 0));
    const int rc = alloc_result(&r, big, &buf);
    CHECK_MSG(rc == APIR_HANDLER_LIMIT && buf == 0, "a buffer of %llu MiB: result %d", (unsigned long long)(big >> 20),
              rc);
    pthread_mutex_lock(&glog_lock);
    const char *why = strstr(glog, "buffer quota reached");
    char shown[300] = "";
    if (why)
        snprintf(shown, sizeof(shown), "%.*s", (int)strcspn(why, "\n"), why);
    pthread_mutex_unlock(&glog_lock);
    printf("figure: default memory quota on a CPU host of %llu MiB: a %llu MiB buffer refused (result %d): \"%s\"\n",
           (unsigned long long)(ram >> 20), (unsigned long long)(big >> 20), rc, shown);
    CHECK_MSG(strstr(shown, "--max-alloc-mib") && strstr(shown, "the default"), "the guest was told: %s", shown);
    /* Within the quota: served. */
    CHECK(alloc_result(&r, 64u << 20, &buf) == APIR_HANDLER_OK && buf != 0);
    CHECK(apir_call_BUFFER_FREE_BUFFER(&r, buf) == APIR_HANDLER_OK);
    apir_remote_close(&r);
    stop_host();
    /* --max-alloc-mib 0: no quota; the same buffer is the backend's to
     * give (untouched memory: the CPU backend only reserves it). */
    const char *none[] = { "--max-alloc-mib", "0", NULL };
    CHECK(start_host(NULL, none));
    CHECK(guest_open(&r, unix_ep, NULL, 0));
    const int rc0 = alloc_result(&r, big, &buf);
    printf("figure: --max-alloc-mib 0: the %llu MiB buffer: result %d\n", (unsigned long long)(big >> 20), rc0);
    CHECK_MSG(rc0 != APIR_HANDLER_LIMIT, "refused by a quota with --max-alloc-mib 0");
    if (buf)
        apir_call_BUFFER_FREE_BUFFER(&r, buf);
    apir_remote_close(&r);
    stop_host();
    apir_log_set_sink(NULL);
}

/* Sums the N of every "N log line(s) suppressed" in text. */
static long suppressed_sum(const char *text, long *summaries)
{
    long sum = 0;
    *summaries = 0;
    for (const char *p = text; (p = strstr(p, " log line")); p++) {
        const char *q = p;
        while (q > text && q[-1] >= '0' && q[-1] <= '9')
            q--;
        if (q < p && strstr(p, "suppressed") && strstr(p, "suppressed") < strchr(p, '\n')) {
            sum += atol(q);
            (*summaries)++;
        }
    }
    return sum;
}

static void log_rate_case(const char *isolation)
{
    enum { N = 10000 };
    const char *extra[] = { "--isolation", isolation,
                            !strcmp(isolation, "thread") ? "--insecure-shared-process" : NULL, NULL };
    apir_log_set_level(APIR_LOG_ERROR);
    CHECK(start_host(NULL, extra));
    struct apir_remote r;
    CHECK(guest_open(&r, unix_ep, NULL, 0));
    const uint64_t t0 = apir_now_ns();
    int refused = 0;
    for (int i = 0; i < N; i++) {
        uint64_t base = 0;
        refused += apir_call_BUFFER_GET_BASE(&r, 0xdead0000beefull + (uint64_t)i, &base) == APIR_HANDLER_BAD_HANDLE;
    }
    const double secs = ms_since(t0) / 1000;
    apir_remote_close(&r);
    usleep(300000);  /* the summary at the session's end */
    char *t = text_read(log_path);
    const long logged = text_count(t, "BUFFER_GET_BASE refused");
    long summaries = 0;
    const long suppressed = suppressed_sum(t, &summaries);
    const bool own_line = strstr(t, "disconnected after") != NULL;
    printf("figure: %s: %d refused commands in %.2f s: %ld logged, %ld suppressed (in %ld summary lines); the host's "
           "own disconnect line %s\n", isolation, refused, secs, logged, suppressed, summaries,
           own_line ? "logged" : "MISSING");
    CHECK(refused == N);
    CHECK_MSG(logged <= 100 + (long)(10 * (secs + 1)) + 1, "%ld lines logged", logged);
    CHECK_MSG(logged + suppressed == N, "%ld logged + %ld suppressed != %d", logged, suppressed, N);
    CHECK(summaries >= 1);
    CHECK(own_line);
    free(t);
    stop_host();
}

static void test_log_rate_process(void) { log_rate_case("process"); }
static void test_log_rate_thread(void) { log_rate_case("thread"); }

/* The host's log holds no escape byte and no line that starts with what a
 * guest tried to forge. */
static void check_log_clean(const char *forged, const char *what)
{
    char *t = text_read(log_path);
    CHECK_MSG(strchr(t, '\x1b') == NULL, "%s: an escape byte reached the log", what);
    char at_start[128];
    snprintf(at_start, sizeof(at_start), "\n%s", forged);
    CHECK_MSG(strstr(t, at_start) == NULL && strncmp(t, forged, strlen(forged)) != 0, "%s: a forged line in the log",
              what);
    free(t);
}

static void test_log_escape(void)
{
    /* A process name: the host reads it from /proc at accept. */
    CHECK(start_host(NULL, NULL));
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_NAME, "x\nguest#9 \x1b[2J");
        char err[256];
        _exit(guest_served(unix_ep, err, sizeof(err)) ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    usleep(200000);
    char *t = text_read(log_path);
    const char *at = strstr(t, "x\\x0aguest#9 \\x1b[2J");
    char shown[400] = "";
    if (at) {
        const char *bol = at;
        while (bol > t && bol[-1] != '\n')
            bol--;
        snprintf(shown, sizeof(shown), "%.*s", (int)strcspn(bol, "\n"), bol);
    }
    printf("figure: a process named \"x\\nguest#9 \\e[2J\": %s\n", shown[0] ? shown : "(not in the log)");
    CHECK_MSG(at != NULL, "the escaped name is not in the log");
    free(t);
    check_log_clean("guest#9 ", "process name");
    stop_host();

    /* A TLS key identity, sent by gnutls-cli (gnutls-bin). */
    char keys[160];
    snprintf(keys, sizeof(keys), "%s/keys", dir);
    FILE *f = fopen(keys, "w");
    CHECK(f && fputs("alice:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", f) >= 0 &&
          fclose(f) == 0);
    chmod(keys, 0600);
    const char *extra[] = { "--tls-psk-file", keys, "--handshake-timeout-ms", "2000", NULL };
    CHECK(start_host("tls:127.0.0.1:0", extra));
    if (access("/usr/bin/gnutls-cli", X_OK) != 0) {
        printf("skip: no gnutls-cli (Debian's gnutls-bin) to send a key identity\n");
        stop_host();
        return;
    }
    const char *colon = strrchr(stream_ep, ':');
    char port[16];
    snprintf(port, sizeof(port), "--port=%s", colon + 1);
    const char *forged = "guest#99(pid 1): TLS 1.3, key \"tenantA\"";
    char identity[160];
    snprintf(identity, sizeof(identity), "--pskusername=mallory\n%s\x1b[8m", forged);
    pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        alarm(10);
        execl("/usr/bin/gnutls-cli", "gnutls-cli", "--priority=NORMAL:-VERS-ALL:+VERS-TLS1.3:+PSK:+ECDHE-PSK:+DHE-PSK",
              identity, "--pskkey=000102030405060708090a0b0c0d0e0f", port, "127.0.0.1", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    usleep(300000);
    t = text_read(log_path);
    at = strstr(t, "mallory\\x0aguest#99");
    shown[0] = '\0';
    if (at) {
        const char *bol = at;
        while (bol > t && bol[-1] != '\n')
            bol--;
        snprintf(shown, sizeof(shown), "%.*s", (int)strcspn(bol, "\n"), bol);
    }
    printf("figure: a TLS key identity \"mallory\\n%s\\e[8m\": %s\n", forged, shown[0] ? shown : "(not in the log)");
    CHECK_MSG(at != NULL, "the escaped identity is not in the log");
    free(t);
    check_log_clean(forged, "TLS identity");
    check_log_clean("guest#99", "TLS identity");
    stop_host();
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_dos APIR-HOST CASE\n");
        return 2;
    }
    host_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof(dir), "/tmp/apir-dos-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    chmod(dir, 0755);  /* the cross-uid peer reaches the socket */
    snprintf(sock_path, sizeof(sock_path), "%s/h.sock", dir);
    snprintf(log_path, sizeof(log_path), "%s/host.log", dir);
    snprintf(unix_ep, sizeof(unix_ep), "unix:%s", sock_path);
    static const struct test_case cases[] = {
        TEST(test_hangup_uid),       TEST(test_hangup_tcp),      TEST(test_silent_tenant), TEST(test_many_guests),
        TEST(test_memory_quota),     TEST(test_log_rate_process), TEST(test_log_rate_thread), TEST(test_log_escape),
    };
    const struct test_case *pick = NULL;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (!strcmp(cases[i].name + 5, argv[2]))
            pick = &cases[i];
    if (!pick) {
        fprintf(stderr, "unknown case %s\n", argv[2]);
        return 2;
    }
    int rc = test_run("dos", pick, 1);
    if (host_pid > 0)
        stop_host();
    if (rc && getenv("DOS_SHOW_LOG")) {
        char *t = text_read(log_path);
        fputs(t, stderr);
        free(t);
    }
    char path[200];
    const char *files[] = { "host.log", "token", "keys" };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    unlink(sock_path);
    rmdir(dir);
    return rc;
}
