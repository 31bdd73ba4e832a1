/*
 * "Attacker code" in a virtio-gpu context's worker (test_virgl_sandbox.c),
 * linked only into apir-host-virgl-hooks, a test build of apir-host: the
 * attempts of tests/worker_attack.c (signals, descriptors passed out, kill,
 * /proc, files, sockets, processes, ids) with the hypervisor as the
 * "daemon", then what a guest would try against the hypervisor's memory
 * and another context's blob.
 *
 * Armed like worker_attack.c (its "target" file, final call "none"), plus
 * $APIR_TEST_ATTACK_DIR/virgl-target: "VMM_PID CANARY_ADDR BLOB_FD BLOB_ADDR
 * BLOB_END FINAL", the hypervisor's pid, the address of a canary in its
 * memory, the descriptor and mapping of another context's blob there, and
 * the call that ends the attack: vm_read (of the canary), vm_write (of the
 * blob), exec or ptrace - each must end the worker.  Results go to
 * DIR/virgl-report.PID: "NAME 0" when an attempt succeeded, "NAME ERRNO"
 * when it failed; "extra_fds" (descriptors the worker holds beyond stdio,
 * its socket and the two reports) and "stdin_devnull" are facts.
 */
#define apir_test_attack_prepare base_attack_prepare
#define apir_test_attack_run base_attack_run
#include "../worker_attack.c"
#undef apir_test_attack_prepare
#undef apir_test_attack_run

#include <sys/sysmacros.h>

void apir_test_attack_prepare(void);
void apir_test_attack_run(int guest_fd);

static int vreport_fd = -1;
static int vmm_pid, blob_fd;
static unsigned long canary_addr, blob_addr, blob_end;
static char vfinal[16] = "vm_read";

void apir_test_attack_prepare(void)
{
    base_attack_prepare();
    const char *dir = getenv("APIR_TEST_ATTACK_DIR");
    if (!dir)
        return;
    char path[512];
    snprintf(path, sizeof(path), "%s/virgl-target", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    int ok = fscanf(f, "%d %lx %d %lx %lx %15s", &vmm_pid, &canary_addr, &blob_fd, &blob_addr, &blob_end, vfinal);
    fclose(f);
    unlink(path);
    if (ok != 6)
        return;
    snprintf(path, sizeof(path), "%s/virgl-report.%d", dir, (int)getpid());
    vreport_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
}

static void vreport(const char *name, int result)
{
    char line[128];
    int n = snprintf(line, sizeof(line), "%s %d\n", name, result);
    if (write(vreport_fd, line, (size_t)n) != n)
        _exit(3);
}

void apir_test_attack_run(int guest_fd)
{
    base_attack_run(guest_fd);
    if (vreport_fd < 0)
        return;
    char path[128];
    /* The hypervisor's memory, the canary's page, by /proc. */
    snprintf(path, sizeof(path), "/proc/%d/mem", vmm_pid);
    int fd = open(path, O_RDONLY);
    char buf[16];
    vreport("vmm_mem_read", fd < 0 ? errno : attempt(pread(fd, buf, sizeof(buf), (off_t)canary_addr)));
    /* Another context's blob: its descriptor and its mapping there. */
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", vmm_pid, blob_fd);
    vreport("vmm_blob_fd_open", attempt(open(path, O_RDWR)));
    snprintf(path, sizeof(path), "/proc/%d/map_files/%lx-%lx", vmm_pid, blob_addr, blob_end);
    vreport("vmm_blob_map_open", attempt(open(path, O_RDWR)));
    vreport("vmm_kill", attempt(kill(vmm_pid, SIGKILL)));
    /* Descriptors inherited from the hypervisor: none but ours. */
    int extra = 0;
    for (int i = 3; i < 1024; i++)
        if (i != guest_fd && i != report_fd && i != vreport_fd && fcntl(i, F_GETFD) >= 0)
            extra++;
    vreport("extra_fds", extra);
    struct stat st;
    vreport("stdin_devnull", fstat(0, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3));
    /* Last: a call the sandbox ends the worker at. */
    char name[32];
    snprintf(name, sizeof(name), "%s_attempt", vfinal);
    vreport(name, 0);
    snprintf(name, sizeof(name), "%s_returned", vfinal);
    struct iovec local = { buf, sizeof(buf) }, canary = { (void *)canary_addr, sizeof(buf) },
                 blob = { (void *)blob_addr, sizeof(buf) };
    if (!strcmp(vfinal, "vm_write")) {
        memset(buf, 0x66, sizeof(buf));
        vreport(name, attempt(syscall(SYS_process_vm_writev, vmm_pid, &local, 1, &blob, 1, 0)));
    } else if (!strcmp(vfinal, "exec")) {
        char *const argv[] = { "sh", "-c", "true", NULL };
        execv("/bin/sh", argv);
        vreport(name, errno);
    } else if (!strcmp(vfinal, "ptrace")) {
        vreport(name, attempt(syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, vmm_pid, 0, 0)));
    } else {
        vreport(name, attempt(syscall(SYS_process_vm_readv, vmm_pid, &local, 1, &canary, 1, 0)));
    }
}
