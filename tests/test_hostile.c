/*
 * Hostile guests against a real apir-host (issue 12, items 3-5): denial of
 * service bounded, and a compromised worker contained by its sandbox.
 *
 * usage: test_hostile APIR-HOST APIR-HOST-HOOKS CASE
 *   silent_process silent_thread  64+ silent connections, then a real guest
 *   rate                           the spawn rate limit (per tenant)
 *   per_uid                        the per-tenant connection limit
 *   sparse_blob                    a sealed, sparse 1 GiB memfd blob
 *   leave_process leave_thread     the guest leaves in the middle of compute
 *   graph_budget                   a graph past --graph-timeout-ms
 *   compromised                    attacker code inside a sandboxed worker
 * Each prints its figures ("figure: ...").  Cases that need root (another
 * uid, the privilege drop) are skipped, with a message, when not root.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "calls.h"
#include "fdpass.h"
#include "ggml.h"
#include "remote.h"
#include "shm_proto.h"
#include "test_host.h"
#include "test_util.h"
#include "transport.h"
#include "wait.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_UID 54321  /* the silent peer's uid in the cross-uid cases */
#define WORKER_UID_BASE 0x7A000000u

static const char *host_bin, *hooks_bin;
static char sock_dir[48];
static char sock_path[100];
static char endpoint[160];
static pid_t host_pid = -1;

/* ---- the host process ---- */

static bool start_host_with(const char *bin, const char *const *extra)
{
    unlink(sock_path);
    const char *argv[48];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = endpoint;
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "--log-level";
    argv[n++] = getenv("HOSTILE_HOST_LOG") ? getenv("HOSTILE_HOST_LOG") : "error";
    for (int i = 0; extra && extra[i] && n < 46; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    host_pid = host_spawn(argv, NULL);
    if (!wait_for_path(sock_path, 5000))
        return false;
    chmod(sock_path, 0777);  /* other uids may connect (the cross-uid cases) */
    return true;
}

static bool start_host(const char *const *extra)
{
    return start_host_with(host_bin, extra);
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

/* The daemon's worker processes (its children). */
static int host_workers(int *pids, int max)
{
    return proc_children(host_pid, pids, max);
}

/* ---- guests ---- */

static bool open_guest(struct apir_remote *r, char *err, size_t err_len)
{
    return apir_remote_open(r, endpoint, 0, err, err_len);
}

/* A connection that never says hello. */
static int silent_connect(void)
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

/* The host's refusal on a connection, if it sent one within wait_ms ("" if
 * none). */
static void refusal_of(int fd, int wait_ms, char *out, size_t out_len)
{
    out[0] = '\0';
    struct pollfd p = { .fd = fd, .events = POLLIN };
    struct apir_shm_hello_reply r;
    if (poll(&p, 1, wait_ms) == 1 && recv(fd, &r, sizeof(r), MSG_DONTWAIT) == (ssize_t)sizeof(r) && r.status != 0) {
        r.message[sizeof(r.message) - 1] = '\0';
        snprintf(out, out_len, "%s", r.message);
    }
}

/* Time (ms) until a real guest is served: connected and answered. */
static double time_to_serve(int limit_ms, char *err, size_t err_len)
{
    uint64_t t0 = apir_now_ns();
    while (ms_since(t0) < limit_ms) {
        if (guest_served(endpoint, err, err_len))
            return ms_since(t0);
        usleep(20000);
    }
    return -1;
}

/* A child of another uid holding `count` silent connections until told to
 * go (a byte on *release); its pid, or -1. */
static pid_t silent_peer(uid_t uid, int count, int *release)
{
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        if (uid != 0 && (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0))
            _exit(2);
        int opened = 0;
        for (int i = 0; i < count; i++)
            opened += silent_connect() >= 0;
        if (write(ready[1], &opened, sizeof(opened)) != sizeof(opened))
            _exit(3);
        char b;
        if (read(go[0], &b, 1) < 0)
            _exit(4);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    int opened = 0;
    if (read(ready[0], &opened, sizeof(opened)) != sizeof(opened) || opened != count) {
        fprintf(stderr, "silent peer opened %d of %d connections\n", opened, count);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(ready[0]);
        close(go[1]);
        return -1;
    }
    close(ready[0]);
    *release = go[1];
    return pid;
}

static void release_peer(pid_t pid, int release)
{
    char b = 1;
    if (write(release, &b, 1) != 1)
        kill(pid, SIGKILL);
    close(release);
    waitpid(pid, NULL, 0);
}

/* ---- cases ---- */

/*
 * 64 silent connections, then a real guest.  From another uid (another
 * tenant): the per-tenant limit leaves the real guest's tenant untouched,
 * it is served at once, and no worker is started for a connection that
 * never spoke.  From the guest's own uid and cgroup (its own tenant): served
 * once the silent ones miss their handshake deadline.  The accept loop
 * never waits for a hello.
 */
static void silent_case(const char *isolation)
{
    bool thread = !strcmp(isolation, "thread");
    const char *args[] = { "--isolation", isolation, "--handshake-timeout-ms", "1000",
                           thread ? "--insecure-shared-process" : NULL, NULL };
    CHECK(start_host(args));
    char err[256] = "";
    if (geteuid() == 0) {
        int release = -1;
        pid_t peer = silent_peer(OTHER_UID, 64, &release);
        CHECK(peer > 0);
        usleep(100000);
        int pids[256];
        int workers = host_workers(pids, 256);
        double ms = time_to_serve(5000, err, sizeof(err));
        printf("figure: %s: 64 silent connections from uid %d (%d worker processes for them): a new guest of uid 0 "
               "served in %.1f ms\n", isolation, OTHER_UID, workers, ms);
        CHECK_MSG(ms >= 0 && ms < 500, "served in %.1f ms (%s)", ms, err);
        if (!thread)
            CHECK_MSG(workers == 0, "%d workers for silent connections", workers);
        if (peer > 0)
            release_peer(peer, release);
    } else {
        printf("skip: the cross-uid part needs root\n");
    }
    usleep(200000);
    /* The same uid: 64 silent connections, then the real guest. */
    int fds[64];
    for (int i = 0; i < 64; i++)
        fds[i] = silent_connect();
    double ms = time_to_serve(5000, err, sizeof(err));
    printf("figure: %s: 64 silent connections from the guest's own uid: served in %.1f ms (handshake deadline 1000 ms)\n",
           isolation, ms);
    CHECK_MSG(ms >= 0 && ms < 2500, "served in %.1f ms (%s)", ms, err);
    for (int i = 0; i < 64; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    CHECK(host_alive());
    stop_host();
}

static void test_silent_process(void) { silent_case("process"); }

static void test_silent_thread(void)
{
    silent_case("thread");
    /* No per-tenant limit: 64 silent connections of the guest's own tenant
     * wait in the pending set, the accept loop serves the guest at once. */
    const char *args[] = { "--isolation", "thread", "--insecure-shared-process", "--max-clients-per-tenant", "0", NULL };
    CHECK(start_host(args));
    int fds[64];
    for (int i = 0; i < 64; i++)
        fds[i] = silent_connect();
    char err[256] = "";
    double ms = time_to_serve(5000, err, sizeof(err));
    printf("figure: thread, no per-tenant limit: 64 silent connections, a new guest served in %.1f ms\n", ms);
    CHECK_MSG(ms >= 0 && ms < 500, "served in %.1f ms (%s)", ms, err);
    for (int i = 0; i < 64; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    stop_host();
}

/* 60 connections at once that each say something (a one-byte "hello":
 * the spawn bucket pays for a worker, or a session, once a connection
 * spoke) against 5/s, burst 10: about 10 are taken, the rest refused by the
 * rate; the taken ones' bogus hellos are refused by their workers. */
static void test_rate(void)
{
    const char *args[] = { "--spawn-rate", "5", "--spawn-burst", "10", "--max-clients-per-tenant", "0",
                           "--handshake-timeout-ms", "3000", NULL };
    CHECK(start_host(args));
    enum { N = 60 };
    int fds[N];
    uint64_t t0 = apir_now_ns();
    for (int i = 0; i < N; i++) {
        fds[i] = silent_connect();
        if (fds[i] >= 0 && send(fds[i], "x", 1, 0) != 1)
            CHECK_MSG(false, "send");
    }
    int refused = 0;
    char why[128];
    for (int i = 0; i < N; i++) {
        refusal_of(fds[i], i == 0 ? 300 : 50, why, sizeof(why));
        if (strstr(why, "too many new guests"))
            refused++;
    }
    double secs = (double)(apir_now_ns() - t0) / 1e9;
    const int taken = N - refused;
    printf("figure: %d connections that spoke, in %.2f s at --spawn-rate 5 --spawn-burst 10: %d taken, %d refused by "
           "the rate\n", N, secs, taken, refused);
    CHECK_MSG(taken <= 10 + (int)(5 * secs) + 1, "%d taken", taken);
    CHECK(refused >= N - 10 - (int)(5 * secs) - 1);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    /* the bucket refills: a guest is served again within a second */
    char err[256] = "";
    double ms = time_to_serve(3000, err, sizeof(err));
    CHECK_MSG(ms >= 0 && ms < 1500, "served in %.1f ms (%s)", ms, err);
    stop_host();
}

/* --max-clients-per-tenant 3: a fourth guest of the tenant (the same uid
 * and cgroup) is refused, saying why. */
static void test_per_uid(void)
{
    const char *args[] = { "--max-clients-per-tenant", "3", NULL };
    CHECK(start_host(args));
    struct apir_remote r[4];
    char err[256] = "";
    int opened = 0;
    for (int i = 0; i < 3; i++)
        opened += open_guest(&r[opened], err, sizeof(err));
    CHECK(opened == 3);
    CHECK(!open_guest(&r[3], err, sizeof(err)));
    CHECK_MSG(strstr(err, "too many connections from this tenant") != NULL, "error: %s", err);
    if (opened)
        apir_remote_close(&r[--opened]);
    double ms = time_to_serve(2000, err, sizeof(err));
    CHECK_MSG(ms >= 0 && ms < 1500, "a freed place taken in %.1f ms (%s)", ms, err);
    while (opened)
        apir_remote_close(&r[--opened]);
    stop_host();
}

/* The transport's socket (the layout shm_client.c starts with). */
struct shm_transport_head {
    struct apir_transport base;
    int sock;
};

/* Sends fd as blob res_id of `size` bytes: the host's answer (0: taken). */
static int send_blob(struct apir_remote *r, int fd, uint32_t res_id, uint64_t size)
{
    struct shm_transport_head *h = (struct shm_transport_head *)r->t;
    uint8_t tag = APIR_SHM_FD_MSG;
    if (apir_send_fds(h->sock, &tag, 1, &fd, 1) != 1)
        return -1;
    struct apir_encoder *e = r->t->ops->begin(r->t);
    apir_encode_u32(e, res_id);
    apir_encode_u64(e, size);
    uint32_t ret = 0;
    struct apir_decoder reply;
    const struct apir_submit_opts waited = { .timeout_ns = 2000000000ull };
    if (r->t->ops->submit(r->t, APIR_CMD_TYPE_SHM_BLOB_CREATE, 0, &waited, &ret, &reply) != 0)
        return -1;
    return (int)ret;
}

/* A sealed memfd of `size` bytes, sparse or written. */
static int make_memfd(uint64_t size, bool commit)
{
    int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        return -1;
    if (commit) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED)
            return -1;
        memset(p, 1, size);
        munmap(p, size);
    }
    return fd;
}

static void test_sparse_blob(void)
{
    CHECK(start_host(NULL));
    struct apir_remote r;
    char err[256] = "";
    if (!open_guest(&r, err, sizeof(err))) {
        CHECK_MSG(false, "connect: %s", err);
        stop_host();
        return;
    }
    long before = proc_tree_rss_kib(host_pid);
    int fd = make_memfd(1ull << 30, false);
    CHECK(fd >= 0);
    int rc = send_blob(&r, fd, 1000, 1ull << 30);
    close(fd);
    usleep(100000);
    long after = proc_tree_rss_kib(host_pid);
    printf("figure: sparse sealed 1 GiB memfd blob: %s; host RSS %ld -> %ld KiB (+%ld MiB)\n",
           rc == 0 ? "taken" : "refused", before, after, (after - before) / 1024);
    CHECK_MSG(rc != 0, "a sparse blob was taken");
    CHECK_MSG(after - before < 64 * 1024, "host RSS grew %ld KiB", after - before);
    /* A blob the guest committed itself is taken, and the link still works. */
    fd = make_memfd(16u << 20, true);
    CHECK(fd >= 0 && send_blob(&r, fd, 1001, 16u << 20) == 0);
    close(fd);
    int32_t n = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&r, &n) == APIR_HANDLER_OK && n == 1);
    apir_remote_close(&r);
    stop_host();
}

/* ---- a long graph ---- */

/* The long graph (test_host.h), computed: returns only if the host
 * answers. */
static uint32_t run_long_graph(struct apir_remote *r)
{
    uint64_t buf = guest_alloc(r, MM_BYTES);
    if (!buf)
        return 0xffffffffu;
    apir_call_BUFFER_CLEAR(r, buf, 0);
    const size_t size = mul_mat_graph(r->data, r->data_size, buf);
    uint32_t status = 0xffffffffu;
    int rc = apir_call_BACKEND_GRAPH_COMPUTE(r, r->data_res_id, size, &status);
    return rc == APIR_HANDLER_OK && status != GGML_STATUS_SUCCESS ? 0x10000u + status : (uint32_t)rc;
}

/* CPU seconds the host's processes have used (daemon and workers). */
static double host_cpu_s(void)
{
    int pids[256];
    int n = host_workers(pids, 256);
    double ticks = 0;
    for (int i = -1; i < n && i < 256; i++) {
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%d/stat", i < 0 ? (int)host_pid : pids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *p = strrchr(buf, ')');
        unsigned long ut = 0, st = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            ticks += (double)(ut + st);
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

/* The guest is killed 1.5 s into the long graph: how long does the host go
 * on computing?  The host's CPU time is watched until it stops growing. */
static void leave_case(const char *isolation)
{
    const char *args[] = { "--isolation", isolation, "--graph-timeout-ms", "0",
                           !strcmp(isolation, "thread") ? "--insecure-shared-process" : NULL, NULL };
    CHECK(start_host(args));
    pid_t guest = fork();
    if (guest == 0) {
        struct apir_remote r;
        char err[256];
        if (!open_guest(&r, err, sizeof(err)))
            _exit(1);
        run_long_graph(&r);
        _exit(0);
    }
    usleep(1500000);
    int pids[8];
    int workers = host_workers(pids, 8);
    double cpu0 = host_cpu_s();
    kill(guest, SIGKILL);
    waitpid(guest, NULL, 0);
    uint64_t t0 = apir_now_ns();
    double last = cpu0, busy_until = 0, worker_gone = -1;
    /* until 1 s passes without compute (the host's CPU time, a worker's
     * included while it lives) */
    for (double t = 0; t < 90; t = (double)(apir_now_ns() - t0) / 1e9) {
        usleep(50000);
        double cpu = host_cpu_s();
        if (cpu - last > 0.01)
            busy_until = (double)(apir_now_ns() - t0) / 1e9;
        last = cpu;
        if (workers > 0 && worker_gone < 0 && proc_status_field(pids[0], "PPid:") != host_pid)
            worker_gone = (double)(apir_now_ns() - t0) / 1e9;
        if (t - busy_until > 1.0 && (workers == 0 || worker_gone >= 0))
            break;
    }
    workers = host_workers(pids, 8);
    printf("figure: %s: the host computed %.2f s more after its guest was killed mid-graph (worker gone after %.2f s); "
           "%d worker(s) left\n", isolation, busy_until, worker_gone, workers);
    CHECK_MSG(busy_until < 3.0, "computed %.2f s after the guest left", busy_until);
    if (!strcmp(isolation, "process"))
        CHECK(workers == 0);
    /* the host serves on */
    char err[256] = "";
    double ms = time_to_serve(2000, err, sizeof(err));
    CHECK_MSG(ms >= 0, "not served after: %s", err);
    stop_host();
}

static void test_leave_process(void) { leave_case("process"); }
static void test_leave_thread(void) { leave_case("thread"); }

/* --graph-timeout-ms 1500: the long graph ends within a bound (the worker
 * is ended: the guest sees its host gone), and the next guest is served. */
static void test_graph_budget(void)
{
    const char *args[] = { "--graph-timeout-ms", "1500", NULL };
    CHECK(start_host(args));
    struct apir_remote r;
    char err[256] = "";
    CHECK(open_guest(&r, err, sizeof(err)));
    uint64_t t0 = apir_now_ns();
    uint32_t rc = run_long_graph(&r);
    double secs = (double)(apir_now_ns() - t0) / 1e9;
    printf("figure: a graph of %d x 34 GFLOP MUL_MATs under --graph-timeout-ms 1500: ended after %.2f s (result %d)\n", MM_NODES,
           secs, (int)rc);
    CHECK(rc != APIR_HANDLER_OK);
    CHECK_MSG(secs < 4.0, "ended after %.2f s", secs);
    apir_remote_close(&r);
    double ms = time_to_serve(2000, err, sizeof(err));
    CHECK_MSG(ms >= 0, "not served after: %s", err);
    stop_host();
}

/* ---- a compromised worker ---- */

static bool report_has(const char *report, const char *name, int *value)
{
    char key[64];
    snprintf(key, sizeof(key), "%s ", name);
    for (const char *p = report; (p = strstr(p, key)); p++)
        if (p == report || p[-1] == '\n') {
            *value = atoi(p + strlen(key));
            return true;
        }
    return false;
}

static void clear_dir(const char *dir)
{
    char path[384];
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
}

/*
 * A victim guest connects; then an attacker whose worker runs the attack
 * (worker_attack.c) with the victim's worker and the daemon as targets.
 * Returns the attack report in report; extra: more host options.
 */
/* Reads the attack's report files (report.PID) in dir into report (the
 * last one read); returns how many there are. */
static int read_reports(const char *dir, char *report, size_t report_len)
{
    int n_rep = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "report.", 7) != 0)
            continue;
        char path[384];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, report, report_len - 1) : -1;
        report[n > 0 ? n : 0] = '\0';
        n_rep++;
        if (fd >= 0)
            close(fd);
    }
    if (d)
        closedir(d);
    return n_rep;
}

static void run_attack(const char *dir, const char *const *extra, char *report, size_t report_len)
{
    report[0] = '\0';
    clear_dir(dir);
    setenv("APIR_TEST_ATTACK_DIR", dir, 1);
    CHECK(start_host_with(hooks_bin, extra));
    unsetenv("APIR_TEST_ATTACK_DIR");
    struct apir_remote victim;
    char err[256] = "";
    if (!open_guest(&victim, err, sizeof(err))) {
        CHECK_MSG(false, "victim: %s", err);
        stop_host();
        return;
    }
    int pids[8];
    CHECK(host_workers(pids, 8) == 1);
    int victim_pid = pids[0];
    /* Its worker is sandboxed: own uid, seccomp filter, no new privileges. */
    CHECK_MSG(proc_status_field(victim_pid, "Uid:") == (long)WORKER_UID_BASE, "victim uid %ld",
              proc_status_field(victim_pid, "Uid:"));
    CHECK(proc_status_field(victim_pid, "Seccomp:") == 2);
    CHECK(proc_status_field(victim_pid, "NoNewPrivs:") == 1);
    char path[384];
    snprintf(path, sizeof(path), "%s/target", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f, "%d %d\n", victim_pid, (int)host_pid);
        fclose(f);
    }
    /* The attacker's worker attacks before the hello; enforcing, it dies
     * at the exec attempt and the connection fails. */
    struct apir_remote attacker;
    if (open_guest(&attacker, err, sizeof(err)))
        apir_remote_close(&attacker);
    for (int i = 0; i < 200 && !strstr(report, "exec_attempt"); i++) {
        usleep(20000);
        read_reports(dir, report, report_len);
    }
    usleep(300000);  /* a shell, had it run, has written by now */
    CHECK(read_reports(dir, report, report_len) == 1);
    int v = 0;
    CHECK(report_has(report, "uid", &v) && (unsigned)v > WORKER_UID_BASE);
    /* The daemon and the victim live on. */
    CHECK(host_alive());
    int32_t n = 0;
    CHECK(apir_call_DEVICE_GET_DEVICE_COUNT(&victim, &n) == APIR_HANDLER_OK && n == 1);
    CHECK(proc_status_field(victim_pid, "PPid:") == host_pid);
    apir_remote_close(&victim);
    stop_host();
    clear_dir(dir);
}

static void test_compromised(void)
{
    if (geteuid() != 0) {
        printf("skip: the compromised-worker case needs root (the workers' privilege drop)\n");
        return;
    }
    char dir[64];
    snprintf(dir, sizeof(dir), "%.48s/attack", sock_dir);
    CHECK(mkdir(dir, 0755) == 0);
    char report[2048];
    int v = 0;

    /* The sandbox as shipped: every attempt fails, the exec ends the worker. */
    run_attack(dir, NULL, report, sizeof(report));
    printf("attack report (sandbox on):\n%s", report);
    const char *must_fail[] = { "open_sibling_mem", "open_daemon_environ", "open_tmp_for_writing", "kill_sibling",
                                "kill_daemon", "setuid_root", "socket_inet", "fork" };
    for (size_t i = 0; i < sizeof(must_fail) / sizeof(must_fail[0]); i++) {
        bool present = report_has(report, must_fail[i], &v);
        CHECK_MSG(present && v != 0, "%s: %s", must_fail[i], present ? "succeeded" : "not reported");
    }
    CHECK(report_has(report, "exec_attempt", &v));
    CHECK_MSG(!report_has(report, "exec_ran", &v), "the shell ran");
    CHECK_MSG(!report_has(report, "exec_returned", &v), "exec returned instead of ending the worker");

    /* Seccomp only logging: the worker's own uid and non-dumpable state
     * alone still keep it from the sibling, the daemon and root. */
    const char *log_only[] = { "--sandbox-log", NULL };
    run_attack(dir, log_only, report, sizeof(report));
    printf("attack report (seccomp logging only, the uid drop alone):\n%s", report);
    const char *uid_fails[] = { "open_sibling_mem", "kill_sibling", "kill_daemon", "setuid_root" };
    for (size_t i = 0; i < sizeof(uid_fails) / sizeof(uid_fails[0]); i++) {
        bool present = report_has(report, uid_fails[i], &v);
        CHECK_MSG(present && v != 0, "%s: %s without seccomp", uid_fails[i], present ? "succeeded" : "not reported");
    }
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_hostile APIR-HOST APIR-HOST-HOOKS CASE\n");
        return 2;
    }
    host_bin = argv[1];
    hooks_bin = argv[2];
    signal(SIGPIPE, SIG_IGN);
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/apir-hostile-XXXXXX");
    if (!mkdtemp(sock_dir))
        return 1;
    chmod(sock_dir, 0755);  /* other uids reach the socket (the cross-uid cases) */
    snprintf(sock_path, sizeof(sock_path), "%s/h.sock", sock_dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock_path);
    static const struct test_case cases[] = {
        TEST(test_silent_process), TEST(test_silent_thread), TEST(test_rate), TEST(test_per_uid),
        TEST(test_sparse_blob), TEST(test_leave_process), TEST(test_leave_thread), TEST(test_graph_budget),
        TEST(test_compromised),
    };
    const struct test_case *pick = NULL;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (!strcmp(cases[i].name + 5, argv[3]))
            pick = &cases[i];
    if (!pick) {
        fprintf(stderr, "unknown case %s\n", argv[3]);
        return 2;
    }
    int rc = test_run("hostile", pick, 1);
    stop_host();
    unlink(sock_path);
    rmdir(sock_dir);
    return rc;
}
