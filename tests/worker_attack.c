/*
 * "Attacker code" for the compromised-worker tests (test_hostile.c,
 * test_sandbox.c), linked only into apir-host-hooks, the test build of
 * apir-host (APIR_TEST_HOOKS): the shipped apir-host has no such code.  It
 * stands for a guest that took control of its worker through a kernel bug:
 * it runs inside the worker after the sandbox is on and tries each way out
 * such a guest would (issue 24: signals by fcntl, descriptors passed out,
 * kill, ptrace, /proc, files, sockets, new processes, other uids).
 *
 * Armed only when $APIR_TEST_ATTACK_DIR holds a file "target":
 *   SIBLING DAEMON [OTHER [FINAL]]
 * the pids (as the daemon sees them) of a sibling worker, of the daemon and
 * of another process of the daemon's user (0: none), and the call that
 * ends the attack: exec (the default), ptrace, vm_read or none (the worker
 * then serves its guest).  The file is removed once read: the next worker
 * is not armed.  The results go, one line each, to DIR/report.PID (opened
 * before the sandbox, as a compromised worker could never do after; PID is
 * the worker's own, 1 in its PID namespace): "NAME 0" when an attempt
 * succeeded, "NAME ERRNO" when it failed; "uid", "gid", "pid", "caps" (any
 * capability held: 1; -ERRNO when it may not ask) and "daemon_proc" (stat of /proc/DAEMON: ENOENT when
 * the worker's /proc is its own) are facts, not attempts.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sockios.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

void apir_test_attack_prepare(void);
void apir_test_attack_run(int guest_fd);

static int report_fd = -1;
static int sibling_pid, daemon_pid, other_pid;
static char final_call[16] = "exec";

void apir_test_attack_prepare(void)
{
    const char *dir = getenv("APIR_TEST_ATTACK_DIR");
    if (!dir)
        return;
    char path[512];
    snprintf(path, sizeof(path), "%s/target", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    int ok = fscanf(f, "%d %d %d %15s", &sibling_pid, &daemon_pid, &other_pid, final_call);
    fclose(f);
    unlink(path);
    if (ok < 2)
        return;
    snprintf(path, sizeof(path), "%s/report.%d", dir, (int)getpid());
    report_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);  /* inherited by a successful exec */
}

static void report(const char *name, int result)
{
    char line[128];
    int n = snprintf(line, sizeof(line), "%s %d\n", name, result);
    if (write(report_fd, line, (size_t)n) != n)
        _exit(3);
}

/* 0 on success, else errno. */
static int attempt(long rc)
{
    return rc < 0 ? errno : 0;
}

static void try_open(const char *name, const char *path, int flags)
{
    int fd = open(path, flags, 0644);
    report(name, attempt(fd));
    if (fd >= 0) {
        close(fd);
        if (flags & O_CREAT)
            unlink(path);
    }
}

/* The guest's own socket handed out: what SCM_RIGHTS would do. */
static void try_pass_fd(int sock)
{
    char byte = 0;
    struct iovec iov = { &byte, 1 };
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &sock, sizeof(int));
    report("sendmsg_scm_rights", attempt(sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL)));
    struct msghdr plain = { .msg_iov = &iov, .msg_iovlen = 0 };
    report("sendmsg_plain", attempt(sendmsg(sock, &plain, MSG_DONTWAIT | MSG_NOSIGNAL)));
    struct mmsghdr mm = { .msg_hdr = m };
    report("sendmmsg_scm_rights", attempt(sendmmsg(sock, &mm, 1, MSG_DONTWAIT | MSG_NOSIGNAL)));
}

/* Signals the kernel would send later on the worker's behalf: the owner
 * and signal of asynchronous I/O on the guest's socket, by fcntl or ioctl. */
static void try_async_signals(int sock)
{
    int flags = fcntl(sock, F_GETFL);
    report("fcntl_getfl", attempt(flags));
    report("fcntl_setfl_plain", attempt(fcntl(sock, F_SETFL, flags)));
    report("fcntl_setfl_async", attempt(fcntl(sock, F_SETFL, flags | O_ASYNC)));
    report("fcntl_setown", attempt(fcntl(sock, F_SETOWN, daemon_pid)));
    report("fcntl_setown_pgrp", attempt(fcntl(sock, F_SETOWN, -daemon_pid)));
    struct f_owner_ex owner = { F_OWNER_PID, daemon_pid };
    report("fcntl_setown_ex", attempt(fcntl(sock, F_SETOWN_EX, &owner)));
    report("fcntl_setsig", attempt(fcntl(sock, F_SETSIG, SIGKILL)));
    report("fcntl_setlease", attempt(fcntl(sock, F_SETLEASE, F_WRLCK)));
    report("fcntl_notify", attempt(fcntl(sock, F_NOTIFY, DN_MODIFY)));
    /* The same commands with bits above the 32 the kernel reads. */
    report("fcntl_setsig_high_bits", attempt(syscall(SYS_fcntl, sock, 0x100000000ul | F_SETSIG, SIGKILL)));
    int on = 1, who = daemon_pid;
    report("ioctl_fioasync", attempt(ioctl(sock, FIOASYNC, &on)));
    report("ioctl_fioasync_high_bits", attempt(syscall(SYS_ioctl, sock, 0x100000000ul | FIOASYNC, &on)));
    report("ioctl_fiosetown", attempt(ioctl(sock, FIOSETOWN, &who)));
    report("ioctl_siocspgrp", attempt(ioctl(sock, SIOCSPGRP, &who)));
    char c = 'x';
    report("ioctl_tiocsti", attempt(ioctl(STDERR_FILENO, TIOCSTI, &c)));
    int pending = 0;
    report("ioctl_fionread", attempt(ioctl(sock, FIONREAD, &pending)));
}

static void try_signals(void)
{
    report("kill_sibling", attempt(kill(sibling_pid, SIGKILL)));
    report("kill_daemon", attempt(kill(daemon_pid, SIGKILL)));
    if (other_pid > 0)
        report("kill_other", attempt(kill(other_pid, SIGKILL)));
    /* Signal 0: permission only (everything this worker could reach). */
    report("kill_all", attempt(kill(-1, 0)));
    report("kill_daemon_group", attempt(kill(-daemon_pid, 0)));
    report("tgkill_daemon", attempt(syscall(SYS_tgkill, daemon_pid, daemon_pid, SIGKILL)));
    report("tkill_daemon", attempt(syscall(SYS_tkill, daemon_pid, SIGKILL)));
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_code = SI_QUEUE;
    report("sigqueue_daemon", attempt(syscall(SYS_rt_sigqueueinfo, daemon_pid, SIGKILL, &si)));
    report("pidfd_open_daemon", attempt(syscall(SYS_pidfd_open, daemon_pid, 0)));
    report("tgkill_self", attempt(syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), 0)));
}

static void try_files(void)
{
    char path[128];
    snprintf(path, sizeof(path), "/proc/%d/mem", sibling_pid);
    try_open("open_sibling_mem", path, O_RDONLY);
    snprintf(path, sizeof(path), "/proc/%d/mem", daemon_pid);
    try_open("open_daemon_mem", path, O_RDWR);
    snprintf(path, sizeof(path), "/proc/%d/environ", daemon_pid);
    try_open("open_daemon_environ", path, O_RDONLY);
    if (other_pid > 0) {
        snprintf(path, sizeof(path), "/proc/%d/mem", other_pid);
        try_open("open_other_mem", path, O_RDWR);
    }
    try_open("open_etc_shadow", "/etc/shadow", O_RDONLY);
    snprintf(path, sizeof(path), "/tmp/apir-attack-%d", (int)getpid());
    try_open("open_tmp_for_writing", path, O_WRONLY | O_CREAT | O_TRUNC);
    try_open("open_proc_self_status", "/proc/self/status", O_RDONLY);
    struct stat st;
    snprintf(path, sizeof(path), "/proc/%d", daemon_pid);
    report("daemon_proc", attempt(stat(path, &st)));
}

static void try_processes_and_ids(void)
{
    report("socket_inet", attempt(socket(AF_INET, SOCK_STREAM, 0)));
    report("socket_unix", attempt(socket(AF_UNIX, SOCK_STREAM, 0)));
    int sv[2];
    report("socketpair", attempt(socketpair(AF_UNIX, SOCK_STREAM, 0, sv)));
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    report("fork", attempt(child));
    child = (pid_t)syscall(SYS_clone, (unsigned long)SIGCHLD, 0, 0, 0, 0);
    if (child == 0)
        _exit(0);
    report("clone_process", attempt(child));
    report("unshare_user", attempt(unshare(CLONE_NEWUSER)));
    report("mount_tmpfs", attempt(mount("none", "/tmp", "tmpfs", 0, NULL)));
    report("setuid_root", attempt(setuid(0)));
    report("setresuid_other", attempt(syscall(SYS_setresuid, getuid() - 1, getuid() - 1, getuid() - 1)));
    report("setgroups", attempt(syscall(SYS_setgroups, 0, NULL)));
    struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct d[2];
    memset(d, 0xff, sizeof(d));
    report("capset", attempt(syscall(SYS_capset, &h, d)));
    report("prctl_dumpable", attempt(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)));
    report("bpf", attempt(syscall(SYS_bpf, 0, NULL, 0)));
    report("perf_event_open", attempt(syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0)));
    report("io_uring_setup", attempt(syscall(SYS_io_uring_setup, 1, NULL)));
    report("userfaultfd", attempt(syscall(SYS_userfaultfd, 0)));
    report("keyctl", attempt(syscall(SYS_keyctl, 0, 0, 0, 0, 0)));
}

void apir_test_attack_run(int guest_fd)
{
    if (report_fd < 0)
        return;
    report("uid", (int)getuid());
    report("gid", (int)getgid());
    report("pid", (int)getpid());
    struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct d[2] = { { 0 } };
    if (syscall(SYS_capget, &h, d) != 0)
        report("caps", -errno);  /* refused: /proc/PID/status says it */
    else
        report("caps", d[0].effective || d[0].permitted || d[1].effective || d[1].permitted);
    try_async_signals(guest_fd);
    try_pass_fd(guest_fd);
    try_signals();
    try_files();
    try_processes_and_ids();
    /* Last: the sandbox ends the process here (SIGSYS); a call that
     * returned says so, and a shell that ran would write "exec_ran 0"
     * through the inherited report descriptor. */
    if (!strcmp(final_call, "none"))
        return;
    char name[32];
    snprintf(name, sizeof(name), "%s_attempt", final_call);
    report(name, 0);
    snprintf(name, sizeof(name), "%s_returned", final_call);
    if (!strcmp(final_call, "ptrace")) {
        report(name, attempt(syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, daemon_pid, 0, 0)));
    } else if (!strcmp(final_call, "vm_read")) {
        char buf[16];
        struct iovec local = { buf, sizeof(buf) }, remote = { (void *)0x400000, sizeof(buf) };
        report(name, attempt(syscall(SYS_process_vm_readv, daemon_pid, &local, 1, &remote, 1, 0)));
    } else {
        char cmd[64];
        snprintf(cmd, sizeof(cmd), "echo exec_ran 0 >&%d", report_fd);
        char *const argv[] = { "sh", "-c", cmd, NULL };
        execv("/bin/sh", argv);
        report(name, errno);
    }
}
