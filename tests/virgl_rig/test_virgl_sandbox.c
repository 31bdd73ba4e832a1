/*
 * A virtio-gpu context's worker holds against code running in it (issue 24
 * item 4).  This process plays the hypervisor: it loads libapir-virgl.so
 * and serves two contexts, each by a worker (apir-host-virgl-hooks, the
 * test build of apir-host with tests/virgl_rig/virgl_attack.c).  The first
 * is a victim with a blob and a buffer; the second's worker runs "attacker
 * code" after its sandbox is on - every way out of tests/worker_attack.c
 * with this process as the daemon, then this process's memory (a canary),
 * the victim's blob (by descriptor, by mapping, by process_vm_writev), a
 * signal, exec and ptrace - and every one must fail: each final call ends
 * the attacker's worker, no descriptor of ours reached it, and afterwards
 * the canary, the victim's blob and the victim's context are as they were.
 *
 * usage: test_virgl_sandbox LIBAPIR_VIRGL HOOKS_WORKER GGML_CPU_LIB
 */
#include "apir_proto.h"
#include "test_records.h"
#include "test_util.h"
#include "virgl_lib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


static init_fn lib_init;
static dispatch_fn lib_dispatch;
static deinit_fn lib_deinit;
static const char *cpu_lib, *hooks_worker;
static char attack_dir[64];

#define VICTIM 1
#define ATTACKER 2
#define BLOB_RES 10
#define BLOB_SIZE (1u << 16)

/* What the attacker must not read. */
static volatile char canary[64] = "apir-virgl-canary: the hypervisor's own memory";
static uint8_t *victim_blob;
static int blob_fd;

static const char *get_config(uint32_t ctx, const char *key)
{
    if (!strcmp(key, "ggml.library.path"))
        return cpu_lib;
    if (!strcmp(key, "apir.worker.path"))
        return hooks_worker;
    if (!strcmp(key, "apir.n_threads"))
        return "1";
    if (!strcmp(key, "apir.callbacks.get_shmem_size"))
        return "1";
    return NULL;
}

static void *get_shmem_ptr(uint32_t ctx, uint32_t res)
{
    return ctx == VICTIM && res == BLOB_RES ? victim_blob : NULL;
}

static size_t get_shmem_size(uint32_t ctx, uint32_t res)
{
    return ctx == VICTIM && res == BLOB_RES ? BLOB_SIZE : 0;
}

static struct callbacks cbs = { get_config, get_shmem_ptr, get_shmem_size };

static uint8_t reply_buf[16384], request_buf[8192];
static bool reply_ok;

APIR_COMMAND_LIST(VIRGL_X_CALL)
#undef VIRGL_X_CALL

/* The one worker of ours that is not the attacker's: the victim's. */
static pid_t only_child(void)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(path, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

/* The text of the report file whose name starts with prefix, removed. */
static bool take_report(const char *prefix, char *text, size_t len)
{
    DIR *d = opendir(attack_dir);
    struct dirent *e;
    bool found = false;
    text[0] = '\0';
    while (d && !found && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[sizeof(attack_dir) + 260];
        snprintf(path, sizeof(path), "%s/%s", attack_dir, e->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, text, len - 1) : -1;
        text[n > 0 ? n : 0] = '\0';
        if (fd >= 0)
            close(fd);
        unlink(path);
        found = true;
    }
    if (d)
        closedir(d);
    return found;
}

/* The value reported for name; false: not reported. */
static bool reported(const char *text, const char *name, int *v)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const size_t n = strlen(name);
        if (!strncmp(p, name, n) && p[n] == ' ') {
            *v = atoi(p + n + 1);
            return true;
        }
    }
    return false;
}

/* The facts and the calls a worker may make (sandbox.c) among
 * worker_attack.c's lines; every other line is an attempt that must fail. */
static bool may_succeed(const char *name, size_t n)
{
    static const char *const ok[] = { "uid", "gid", "pid", "caps", "daemon_proc", "fcntl_getfl", "fcntl_setfl_plain",
                                      "tgkill_self" };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (strlen(ok[i]) == n && !strncmp(name, ok[i], n))
            return true;
    return false;
}

static void write_file(const char *name, const char *text)
{
    char path[sizeof(attack_dir) + 32];
    snprintf(path, sizeof(path), "%s/%s", attack_dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The victim's data: its buffer holds the pattern; read back through its
 * victim_blob, it is still there. */
static bool victim_works(uint64_t buf)
{
    struct apir_tensor_rec t = f32_rec(1, buf, 0, BLOB_SIZE / 4);
    memset(victim_blob, 0, 4096);
    if (call_BUFFER_GET_TENSOR(VICTIM, buf, &t, BLOB_RES, 0, 4096) != APIR_HANDLER_OK)
        return false;
    for (int i = 0; i < 4096; i++)
        if (victim_blob[i] != (uint8_t)(i * 13))
            return false;
    return true;
}

static void attack(const char *final, uint64_t victim_buf, pid_t victim_worker)
{
    char target[256];
    snprintf(target, sizeof(target), "%d %d 0 none\n", (int)victim_worker, (int)getpid());
    write_file("target", target);
    snprintf(target, sizeof(target), "%d %lx %d %lx %lx %s\n", (int)getpid(), (unsigned long)(uintptr_t)canary,
             blob_fd, (unsigned long)(uintptr_t)victim_blob, (unsigned long)(uintptr_t)victim_blob + BLOB_SIZE, final);
    write_file("virgl-target", target);
    /* The attacker's worker never says hello: its final call ends it. */
    CHECK_MSG(lib_init(ATTACKER, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_BACKEND_FAILED, "final %s", final);
    static char base[16384], virgl[2048];
    CHECK_MSG(take_report("report.", base, sizeof(base)), "final %s: no report", final);
    CHECK_MSG(take_report("virgl-report.", virgl, sizeof(virgl)), "final %s: no virgl report", final);
    printf("attack (final %s):\n%s%s", final, base, virgl);
    int attempts = 0, v;
    for (const char *p = base; *p; p = strchr(p, '\n') + 1) {
        const size_t n = strcspn(p, " ");
        if (!may_succeed(p, n)) {
            attempts++;
            CHECK_MSG(atoi(p + n + 1) != 0, "final %s: %.*s succeeded", final, (int)n, p);
        }
        if (!strchr(p, '\n'))
            break;
    }
    CHECK_MSG(attempts >= 40, "final %s: %d attempts reported", final, attempts);
    /* No capability (0), or not even allowed to ask (-EPERM). */
    CHECK(reported(base, "caps", &v) && v <= 0);
    const char *must_fail[] = { "vmm_mem_read", "vmm_blob_fd_open", "vmm_blob_map_open", "vmm_kill" };
    for (size_t i = 0; i < sizeof(must_fail) / sizeof(must_fail[0]); i++)
        CHECK_MSG(reported(virgl, must_fail[i], &v) && v != 0, "final %s: %s", final, must_fail[i]);
    CHECK_MSG(reported(virgl, "extra_fds", &v) && v == 0, "final %s: %d descriptors of ours", final, v);
    CHECK(reported(virgl, "stdin_devnull", &v) && v == 1);
    char name[48];
    snprintf(name, sizeof(name), "%s_attempt", final);
    CHECK_MSG(reported(virgl, name, &v) && v == 0, "final %s: not reached", final);
    snprintf(name, sizeof(name), "%s_returned", final);
    CHECK_MSG(!reported(virgl, name, &v), "final %s: returned %d (the sandbox should have ended the worker)", final,
              v);
    /* Nothing of ours changed; the victim's context goes on. */
    CHECK(!strcmp((const char *)canary, "apir-virgl-canary: the hypervisor's own memory"));
    CHECK_MSG(victim_works(victim_buf), "final %s: the victim's context", final);
    lib_deinit(ATTACKER);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: test_virgl_sandbox LIBAPIR_VIRGL HOOKS_WORKER GGML_CPU_LIB\n");
        return 2;
    }
    hooks_worker = argv[2];
    cpu_lib = argv[3];
    snprintf(attack_dir, sizeof(attack_dir), "/tmp/apir-virgl-attack-XXXXXX");
    if (!mkdtemp(attack_dir) || chmod(attack_dir, 0777) != 0)
        return 1;
    setenv("APIR_TEST_ATTACK_DIR", attack_dir, 1);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    lib_init = lib ? (init_fn)dlsym(lib, "apir_backend_initialize") : NULL;
    lib_dispatch = lib ? (dispatch_fn)dlsym(lib, "apir_backend_dispatcher") : NULL;
    lib_deinit = lib ? (deinit_fn)dlsym(lib, "apir_backend_deinit") : NULL;
    if (!lib_init || !lib_dispatch || !lib_deinit) {
        fprintf(stderr, "cannot use %s: %s\n", argv[1], dlerror());
        return 1;
    }
    blob_fd = memfd_create("apir-shmem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    victim_blob = blob_fd >= 0 && ftruncate(blob_fd, BLOB_SIZE) == 0
               ? mmap(NULL, BLOB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, blob_fd, 0)
               : MAP_FAILED;
    if (victim_blob == MAP_FAILED)
        return 1;
    CHECK(lib_init(VICTIM, &cbs) == APIR_LOAD_HOST_BASE + APIR_INIT_SUCCESS);
    const pid_t victim_worker = only_child();
    CHECK(victim_worker > 0);
    uint64_t buft = 0, buf = 0;
    CHECK(call_DEVICE_GET_BUFFER_TYPE(VICTIM, &buft) == APIR_HANDLER_OK);
    CHECK(call_BUFFER_TYPE_ALLOC_BUFFER(VICTIM, buft, BLOB_SIZE, &buf) == APIR_HANDLER_OK && buf);
    for (int i = 0; i < 4096; i++)
        victim_blob[i] = (uint8_t)(i * 13);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, BLOB_SIZE / 4);
    CHECK(call_BUFFER_SET_TENSOR(VICTIM, buf, &t, BLOB_RES, 0, 4096) == APIR_HANDLER_OK);
    CHECK(victim_works(buf));
    const char *finals[] = { "vm_read", "vm_write", "exec", "ptrace" };
    for (size_t i = 0; i < sizeof(finals) / sizeof(finals[0]); i++)
        attack(finals[i], buf, victim_worker);
    lib_deinit(VICTIM);
    rmdir(attack_dir);
    printf("virgl_sandbox: %d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}
