/*
 * "Attacker code" for the compromised-worker test (test_hostile.c), linked
 * only into apir-host-hooks, the test build of apir-host (APIR_TEST_HOOKS):
 * the shipped apir-host has no such code.  It stands for a guest that took
 * control of its worker through a kernel bug: it runs inside the worker
 * after the sandbox is on and tries what such a guest would.
 *
 * Armed only when $APIR_TEST_ATTACK_DIR holds a file "target" with the pids
 * of a sibling worker and of the daemon.  The results go, one line each, to
 * DIR/report.PID (opened before the sandbox, as a compromised worker could
 * never do after): "NAME 0" when an attempt succeeded, "NAME ERRNO" when it
 * failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void apir_test_attack_prepare(void);
void apir_test_attack_run(void);

static int report_fd = -1;
static int sibling_pid, daemon_pid;

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
    int ok = fscanf(f, "%d %d", &sibling_pid, &daemon_pid);
    fclose(f);
    if (ok != 2)
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
static int attempt(int rc)
{
    return rc < 0 ? errno : 0;
}

void apir_test_attack_run(void)
{
    if (report_fd < 0)
        return;
    char path[128];
    report("uid", (int)getuid());
    snprintf(path, sizeof(path), "/proc/%d/mem", sibling_pid);
    int fd = open(path, O_RDONLY);
    report("open_sibling_mem", attempt(fd));
    if (fd >= 0)
        close(fd);
    snprintf(path, sizeof(path), "/proc/%d/environ", daemon_pid);
    fd = open(path, O_RDONLY);
    report("open_daemon_environ", attempt(fd));
    if (fd >= 0)
        close(fd);
    snprintf(path, sizeof(path), "/tmp/apir-attack-%d", (int)getpid());
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    report("open_tmp_for_writing", attempt(fd));
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }
    report("kill_sibling", attempt(kill(sibling_pid, SIGKILL)));
    report("kill_daemon", attempt(kill(daemon_pid, SIGKILL)));
    report("setuid_root", attempt(setuid(0)));
    report("socket_inet", attempt(socket(AF_INET, SOCK_STREAM, 0)));
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    report("fork", attempt(child));
    /* Last: the sandbox ends the process here (SIGSYS); a shell that ran
     * would write "exec_ran 0" through the inherited report descriptor. */
    report("exec_attempt", 0);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "echo exec_ran 0 >&%d", report_fd);
    char *const argv[] = { "sh", "-c", cmd, NULL };
    execv("/bin/sh", argv);
    report("exec_returned", errno);
}
