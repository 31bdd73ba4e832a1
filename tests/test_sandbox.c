/*
 * The worker sandbox against code running inside a worker (issue 24, item
 * 3): attacker code in a worker of apir-host-hooks (worker_attack.c) tries
 * each way out - signals by fcntl/ioctl (F_SETOWN, F_SETSIG, O_ASYNC,
 * FIOASYNC...), its socket passed out with SCM_RIGHTS, kill/tgkill/pidfd of
 * other processes, ptrace, process_vm_readv, /proc of others, files,
 * sockets, fork/clone/exec, other uids and capabilities - and every one
 * must fail; the daemon, a sibling worker and another process of the
 * daemon's user live on, and a later guest in the attacker's slot is
 * served by a worker of another uid.  From outside, each worker must show
 * its filters, no capability, its own namespaces and its limits.  One
 * daemon setting per run:
 *   root     the daemon as root: PID, IPC and mount namespaces, uids from the
 *            pool; attackers ending in exec, ptrace and process_vm_readv, and
 *            one with --sandbox-allow ioctl,openat (a GPU's argument rules)
 *   user     a normal user's daemon, no capability (the quick start, apir
 *            run): a user namespace, the user's uid kept
 *   capuser  a non-root daemon with CAP_SETUID and CAP_SETGID only (the
 *            systemd unit): a user namespace, uids from the pool
 *   nons     the capuser daemon where the kernel refuses new namespaces (a
 *            container's seccomp profile, made here; AppArmor's user
 *            namespace rule): none, said in the log; uids from the pool
 * usage: test_sandbox APIR-HOST-HOOKS MODE.  Needs root (to be the other
 * users); exits 77 (skipped) otherwise.
 */
#include "calls.h"
#include "remote.h"
#include "test_host.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKER_UID_BASE 0x7A000000u
#define USER_UID 54329  /* the daemon's user in the user and capuser cases */

static const char *hooks_bin, *mode;
static char dir[64], lib_dir[96], attack_dir[96], sock_path[128], endpoint[140], log_path[96];
static pid_t daemon_pid = -1, other_pid = -1;

/* Every attempt worker_attack.c makes that must fail. */
static const char *const must_fail[] = {
    "fcntl_setfl_async", "fcntl_setown", "fcntl_setown_pgrp", "fcntl_setown_ex", "fcntl_setsig", "fcntl_setlease",
    "fcntl_notify", "fcntl_setsig_high_bits", "ioctl_fioasync", "ioctl_fioasync_high_bits", "ioctl_fiosetown",
    "ioctl_siocspgrp", "ioctl_tiocsti", "sendmsg_scm_rights", "sendmsg_plain", "sendmmsg_scm_rights",
    "kill_sibling", "kill_daemon", "kill_other", "kill_all", "kill_daemon_group", "tgkill_daemon", "tkill_daemon",
    "sigqueue_daemon", "pidfd_open_daemon", "open_sibling_mem", "open_daemon_mem", "open_daemon_environ",
    "open_other_mem", "open_etc_shadow", "open_tmp_for_writing", "socket_inet", "socket_unix", "socketpair", "fork",
    "clone_process", "unshare_user", "mount_tmpfs", "setuid_root", "setresuid_other", "setgroups", "capset",
    "prctl_dumpable", "bpf", "perf_event_open", "io_uring_setup", "userfaultfd", "keyctl",
};

/* ---- the daemon and the other process ---------------------------------- */

static bool mode_is(const char *m)
{
    return !strcmp(mode, m);
}

/* As the daemon's user of this mode (the user and capuser cases): uid and
 * gid USER_UID, no groups; with caps, CAP_SETUID and CAP_SETGID kept as
 * systemd's AmbientCapabilities= gives them.  In a fresh child only. */
static void become_user(bool caps)
{
    if (setgroups(0, NULL) != 0 || setresgid(USER_UID, USER_UID, USER_UID) != 0 ||
        (caps && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) || setresuid(USER_UID, USER_UID, USER_UID) != 0)
        _exit(120);
    if (!caps)
        return;
    struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct d[2] = { { 0 } };
    const unsigned set = (1u << CAP_SETUID) | (1u << CAP_SETGID);
    d[0].effective = d[0].permitted = d[0].inheritable = set;
    if (syscall(SYS_capset, &h, d) != 0 || prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SETUID, 0, 0) != 0 ||
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SETGID, 0, 0) != 0)
        _exit(121);
}

/* What a container runtime's seccomp profile does without CAP_SYS_ADMIN
 * granted: no new namespaces (the nons case). */
static void refuse_namespaces(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    const int flags[] = { CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWNS };
    bool ok = ctx != NULL;
    for (size_t i = 0; ok && i < sizeof(flags) / sizeof(flags[0]); i++)
        ok = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, (scmp_datum_t)flags[i], (scmp_datum_t)flags[i])) == 0;
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 0) == 0 &&
         seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) == 0 && seccomp_load(ctx) == 0;
    if (!ok)
        _exit(122);
}

static uid_t daemon_uid(void)
{
    return mode_is("root") ? 0 : USER_UID;
}

static bool start_daemon(const char *const *extra)
{
    unlink(sock_path);
    FILE *empty = fopen(log_path, "w");
    if (empty)
        fclose(empty);
    const char *argv[24];
    int n = 0;
    argv[n++] = hooks_bin;
    argv[n++] = "--listen";
    argv[n++] = endpoint;
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    argv[n++] = "--backend-dir";
    argv[n++] = lib_dir;
    argv[n++] = "--control";
    argv[n++] = "none";
    for (int i = 0; extra && extra[i] && n < 23; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    daemon_pid = fork();
    if (daemon_pid == 0) {
        int lf = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
            close(lf);
        }
        if (mode_is("nons"))
            refuse_namespaces();
        if (daemon_uid() != 0)
            become_user(!mode_is("user"));
        prctl(PR_SET_PDEATHSIG, SIGKILL);  /* after the uid switch, which clears it */
        setenv("LD_LIBRARY_PATH", lib_dir, 1);
        setenv("APIR_TEST_ATTACK_DIR", attack_dir, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return daemon_pid > 0 && wait_for_path(sock_path, 10000);
}

static int stop_daemon(void)
{
    int rc = host_reap(daemon_pid, SIGTERM);
    daemon_pid = -1;
    return rc;
}

static bool alive(pid_t pid)
{
    return pid > 0 && waitpid(pid, NULL, WNOHANG) == 0;
}

/* Another process of the daemon's user, which nothing in a worker may
 * reach (the user case: the same uid as the daemon). */
static void start_other(void)
{
    other_pid = fork();
    if (other_pid == 0) {
        if (daemon_uid() != 0)
            become_user(false);
        /* Gone with the test, whatever ends it; nothing of its output held. */
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
}

static bool log_has(const char *text)
{
    FILE *f = fopen(log_path, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void show_log(void)
{
    FILE *f = fopen(log_path, "r");
    char line[1024];
    fprintf(stderr, "--- the daemon's log:\n");
    while (f && fgets(line, sizeof(line), f))
        fputs(line, stderr);
    if (f)
        fclose(f);
}

/* ---- a worker, from outside --------------------------------------------- */

/* A /proc/PID/status line's text after the field name, or "". */
static void status_text(int pid, const char *field, char *out, size_t len)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, strlen(field)))
            snprintf(out, len, "%s", line + strlen(field));
    if (f)
        fclose(f);
}

static unsigned long long status_hex(int pid, const char *field)
{
    char text[64];
    status_text(pid, field, text, sizeof(text));
    return text[0] ? strtoull(text, NULL, 16) : ~0ull;
}

/* How many pids NSpid lists: 2 when the worker has a PID namespace of its own. */
static int nspid_levels(int pid)
{
    char text[128];
    status_text(pid, "NSpid:", text, sizeof(text));
    int n = 0;
    for (char *p = strtok(text, " \t\n"); p; p = strtok(NULL, " \t\n"))
        n++;
    return n;
}

static bool same_ns(int a, int b, const char *ns)
{
    char pa[64], pb[64], la[64] = "", lb[64] = "";
    snprintf(pa, sizeof(pa), "/proc/%d/ns/%s", a, ns);
    snprintf(pb, sizeof(pb), "/proc/%d/ns/%s", b, ns);
    return readlink(pa, la, sizeof(la) - 1) > 0 && readlink(pb, lb, sizeof(lb) - 1) > 0 && !strcmp(la, lb);
}

/* A soft limit from /proc/PID/limits ("Max open files"...), -1 unlimited,
 * -2 not found. */
static long long limit_of(int pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/limits", pid);
    FILE *f = fopen(path, "r");
    long long v = -2;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, name, strlen(name))) {
            const char *p = line + strlen(name);
            while (*p == ' ')
                p++;
            v = !strncmp(p, "unlimited", 9) ? -1 : atoll(p);
        }
    if (f)
        fclose(f);
    return v;
}

static bool own_uids(void)
{
    return !mode_is("user");
}

static bool own_namespaces(void)
{
    return !mode_is("nons");
}

static void check_worker(int pid, const char *who)
{
    const long uid = proc_status_field(pid, "Uid:");
    if (own_uids())
        CHECK_MSG(uid >= (long)WORKER_UID_BASE, "%s: uid %ld, not one of the pool's", who, uid);
    else
        CHECK_MSG(uid == USER_UID, "%s: uid %ld, not the daemon's %d", who, uid, USER_UID);
    CHECK_MSG(proc_status_field(pid, "Seccomp:") == 2 && proc_status_field(pid, "Seccomp_filters:") >= 2,
              "%s: seccomp %ld, %ld filters", who, proc_status_field(pid, "Seccomp:"),
              proc_status_field(pid, "Seccomp_filters:"));
    CHECK_MSG(proc_status_field(pid, "NoNewPrivs:") == 1, "%s: no_new_privs off", who);
    const char *caps[] = { "CapInh:", "CapPrm:", "CapEff:", "CapAmb:" };
    for (size_t i = 0; i < 4; i++)
        CHECK_MSG(status_hex(pid, caps[i]) == 0, "%s: %s %llx", who, caps[i], status_hex(pid, caps[i]));
    CHECK_MSG(nspid_levels(pid) == (own_namespaces() ? 2 : 1), "%s: %d pid levels", who, nspid_levels(pid));
    const char *nss[] = { "pid", "ipc", "mnt" };
    for (size_t i = 0; i < 3; i++)
        CHECK_MSG(same_ns(pid, daemon_pid, nss[i]) == !own_namespaces(), "%s: %s namespace %s the daemon's", who,
                  nss[i], own_namespaces() ? "is" : "is not");
    CHECK_MSG(same_ns(pid, daemon_pid, "user") == !(mode_is("user") || mode_is("capuser")), "%s: user namespace", who);
    CHECK_MSG(limit_of(pid, "Max open files") == 256, "%s: %lld descriptors", who, limit_of(pid, "Max open files"));
    CHECK_MSG(limit_of(pid, "Max core file size") == 0, "%s: core files", who);
    CHECK_MSG(limit_of(pid, "Max processes") > 0, "%s: tasks unbounded", who);
}

/* ---- guests and attacks ---------------------------------------------------- */

static int workers(int *pids, int max)
{
    return proc_children(daemon_pid, pids, max);
}

/* Waits up to ms for the daemon to have n workers. */
static bool wait_workers(int n, int ms)
{
    int pids[8];
    for (int waited = 0; waited < ms; waited += 10) {
        if (workers(pids, 8) == n)
            return true;
        usleep(10000);
    }
    return false;
}

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

static void clear_attack_dir(void)
{
    char path[sizeof(attack_dir) + 260];
    DIR *d = opendir(attack_dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", attack_dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
}

/* The report files' text (there is one per attacker). */
static int read_report(char *report, size_t len)
{
    int n_rep = 0;
    DIR *d = opendir(attack_dir);
    struct dirent *e;
    report[0] = '\0';
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "report.", 7) != 0)
            continue;
        char path[sizeof(attack_dir) + 260];
        snprintf(path, sizeof(path), "%s/%s", attack_dir, e->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, report, len - 1) : -1;
        report[n > 0 ? n : 0] = '\0';
        n_rep++;
        if (fd >= 0)
            close(fd);
    }
    if (d)
        closedir(d);
    return n_rep;
}

static bool open_guest(struct apir_remote *r)
{
    char err[256];
    return apir_remote_open(r, endpoint, 0, err, sizeof(err));
}

static bool guest_works(struct apir_remote *r)
{
    int32_t n = 0;
    return apir_call_DEVICE_GET_DEVICE_COUNT(r, &n) == APIR_HANDLER_OK && n == 1;
}

/*
 * One attacker beside the victim: its worker runs every attempt and ends
 * with `final` (exec, ptrace, vm_read: the sandbox must end it; none: it
 * serves on).  allowed: the run has --sandbox-allow ioctl,openat.
 */
static void attack(pid_t victim_pid, struct apir_remote *victim, const char *final, bool allowed)
{
    char path[160], report[4096];
    clear_attack_dir();
    snprintf(path, sizeof(path), "%s/target", attack_dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fprintf(f, "%d %d %d %s\n", (int)victim_pid, (int)daemon_pid, (int)other_pid, final);
    fclose(f);
    const bool fatal = strcmp(final, "none") != 0;
    struct apir_remote attacker;
    bool served = open_guest(&attacker);
    CHECK_MSG(served == !fatal, "attacker (%s): %s", final, served ? "served" : "not served");
    char last[40];
    snprintf(last, sizeof(last), fatal ? "%s_attempt" : "keyctl", final);
    int v = 0;
    for (int i = 0; i < 400 && !report_has(report, last, &v); i++) {
        usleep(10000);
        read_report(report, sizeof(report));
    }
    usleep(300000);  /* a shell, or a call that returned, has written by now */
    CHECK(read_report(report, sizeof(report)) == 1);
    printf("attack report (%s%s):\n%s", final, allowed ? ", --sandbox-allow ioctl,openat" : "", report);
    for (size_t i = 0; i < sizeof(must_fail) / sizeof(must_fail[0]); i++) {
        const bool present = report_has(report, must_fail[i], &v);
        CHECK_MSG(present && v != 0, "%s (final %s): %s", must_fail[i], final, present ? "succeeded" : "not reported");
    }
    /* What the worker may do, so that the refusals above are the filters'
     * arguments, not calls refused outright. */
    const char *must_work[] = { "fcntl_getfl", "fcntl_setfl_plain", "tgkill_self" };
    for (size_t i = 0; i < 3; i++)
        CHECK_MSG(report_has(report, must_work[i], &v) && v == 0, "%s failed (%d)", must_work[i], v);
    CHECK_MSG(report_has(report, "ioctl_fionread", &v) && (v == 0) == allowed, "ioctl FIONREAD: %d", v);
    CHECK_MSG(report_has(report, "open_proc_self_status", &v) && (v == 0) == allowed, "open /proc/self: %d", v);
    /* Its /proc shows no other process. */
    CHECK_MSG(report_has(report, "daemon_proc", &v) && (v == ENOENT) == own_namespaces(), "stat /proc/DAEMON: %d", v);
    /* Its uid as it sees it: the same number outside (workers.c maps
     * each id as itself). */
    int uid = 0, victim_uid = (int)proc_status_field(victim_pid, "Uid:");
    CHECK(report_has(report, "uid", &uid));
    if (own_uids())
        CHECK_MSG(uid != victim_uid && (unsigned)uid >= WORKER_UID_BASE, "attacker uid %d, victim %d", uid, victim_uid);
    else
        CHECK_MSG(uid == USER_UID, "attacker uid %d", uid);
    if (fatal) {
        snprintf(last, sizeof(last), "%s_returned", final);
        CHECK_MSG(!report_has(report, last, &v), "%s returned (%d) instead of ending the worker", final, v);
        CHECK_MSG(!report_has(report, "exec_ran", &v), "the shell ran");
        CHECK_MSG(wait_workers(1, 3000), "the attacker's worker did not end");
        CHECK_MSG(log_has("died of signal 31"), "no worker ended by SIGSYS in the log");
    } else if (served) {
        CHECK(guest_works(&attacker));
        apir_remote_close(&attacker);
        CHECK_MSG(wait_workers(1, 3000), "the attacker's worker did not end");
    }
    /* Nothing else was reached. */
    CHECK_MSG(alive(daemon_pid), "the daemon died");
    CHECK_MSG(alive(other_pid), "the other process died");
    CHECK_MSG(kill(victim_pid, 0) == 0 && proc_status_field(victim_pid, "PPid:") == daemon_pid, "the victim died");
    CHECK_MSG(guest_works(victim), "the victim is not served");
    /* A later guest in the attacker's slot (the lowest free one): another
     * uid, served, and still alive a while later. */
    struct apir_remote later;
    CHECK(open_guest(&later));
    int pids[8], n = workers(pids, 8), later_pid = 0;
    for (int i = 0; i < n && i < 8; i++)
        if (pids[i] != victim_pid)
            later_pid = pids[i];
    CHECK(n == 2 && later_pid > 0);
    if (own_uids() && later_pid > 0) {
        const long later_uid = proc_status_field(later_pid, "Uid:");
        CHECK_MSG(later_uid != victim_uid && later_uid != uid && later_uid >= (long)WORKER_UID_BASE,
                  "later guest's uid %ld (attacker %d, victim %d)", later_uid, uid, victim_uid);
    }
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(guest_works(&later), "the later guest is not served");
        usleep(150000);
    }
    CHECK(later_pid > 0 && kill(later_pid, 0) == 0);
    apir_remote_close(&later);
    CHECK(wait_workers(1, 3000));
    CHECK(alive(daemon_pid));
}

/* A daemon started with extra options; a victim; the attacks; its end. */
static void run(const char *const *extra, const char *const *finals, bool allowed)
{
    CHECK_MSG(start_daemon(extra), "the daemon did not start");
    if (!alive(daemon_pid)) {
        show_log();
        return;
    }
    /* How it starts workers (workers.c), as this mode must give. */
    if (mode_is("nons"))
        CHECK(log_has("workers: no PID or IPC namespaces of their own"));
    else
        CHECK(log_has(mode_is("root") ? "workers: PID, IPC and mount namespaces of their own (a /proc"
                                      : "workers: user, PID, IPC and mount namespaces of their own (a /proc"));
    CHECK(log_has(own_uids() ? "a uid and gid each from 2046820352-" : "the daemon's uid 54329"));
    struct apir_remote victim;
    const bool served = open_guest(&victim);
    CHECK_MSG(served, "the victim was not served");
    if (!served) {
        stop_daemon();
        show_log();
        return;
    }
    int pids[8];
    CHECK(workers(pids, 8) == 1);
    const pid_t victim_pid = pids[0];
    check_worker(victim_pid, "victim");
    for (int i = 0; finals[i]; i++)
        attack(victim_pid, &victim, finals[i], allowed);
    apir_remote_close(&victim);
    CHECK_MSG(stop_daemon() == 0, "the daemon did not end cleanly");
    if (test_failed)
        show_log();
}

static void test_sandbox(void)
{
    const char *finals_root[] = { "exec", "ptrace", "vm_read", NULL };
    const char *finals_one[] = { "exec", NULL };
    const char *finals_none[] = { "none", NULL };
    const char *allow[] = { "--sandbox-allow", "ioctl,openat", NULL };
    start_other();
    if (mode_is("root")) {
        run(NULL, finals_root, false);
        run(allow, finals_none, true);
    } else if (mode_is("user")) {
        run(NULL, finals_one, false);
        run(allow, finals_none, true);
    } else {
        run(NULL, finals_one, false);
    }
    CHECK(alive(other_pid));
    kill(other_pid, SIGKILL);
    waitpid(other_pid, NULL, 0);
}

/* The daemon's libraries where its user can read them (the build tree's
 * ggml is under root's home). */
static bool copy_libs(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cp -L %s/libggml.so.0 %s/libggml-base.so.0 %s/libggml-cpu*.so %s/ && chmod -R a+rX %s",
             APIR_GGML_BIN, APIR_GGML_BIN, APIR_GGML_BIN, lib_dir, lib_dir);
    return system(cmd) == 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_sandbox APIR-HOST-HOOKS root|user|capuser|nons\n");
        return 2;
    }
    hooks_bin = argv[1];
    mode = argv[2];
    if (!mode_is("root") && !mode_is("user") && !mode_is("capuser") && !mode_is("nons")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    if (geteuid() != 0) {
        printf("skip: the sandbox cases need root (to run the daemon as other users)\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof(dir), "/tmp/apir-sandbox-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(lib_dir, sizeof(lib_dir), "%s/lib", dir);
    snprintf(attack_dir, sizeof(attack_dir), "%s/attack", dir);
    snprintf(sock_path, sizeof(sock_path), "%s/h.sock", dir);
    snprintf(endpoint, sizeof(endpoint), "unix:%s", sock_path);
    snprintf(log_path, sizeof(log_path), "%s/host.log", dir);
    /* The daemon's user writes its socket and the attacker its report. */
    bool ok = chmod(dir, 0777) == 0 && mkdir(lib_dir, 0755) == 0 && mkdir(attack_dir, 0777) == 0 &&
              chmod(attack_dir, 0777) == 0 && copy_libs();
    int rc = 1;
    if (ok) {
        static const struct test_case cases[] = { TEST(test_sandbox) };
        rc = test_run(mode, cases, 1);
    }
    if (daemon_pid > 0)
        stop_daemon();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}
