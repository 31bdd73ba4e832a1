/*
 * Odd and hostile input for the rig's two halves, which must answer with
 * errors and keep serving: the shim (run this under LD_PRELOAD) gets bad
 * ioctl arguments, the rig gets malformed messages on its socket and
 * malformed commands through EXECBUFFER, and the host library behind it
 * gets FORWARDs it must refuse.  At the end a well-formed session must still
 * work on the same rig.
 *
 * usage: LD_PRELOAD=libapir-virgl-shim.so APIR_RIG_SOCKET=SOCK rig_abuse SOCK
 */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <drm.h>
#include <xf86drm.h>

#include "rig_proto.h"

static const char *sock_path;

struct getparam { uint64_t param, value; };
struct get_caps { uint32_t id, ver; uint64_t addr; uint32_t size, pad; };
struct set_param { uint64_t param, value; };
struct ctx_init { uint32_t n, pad; uint64_t params; };
struct create_blob { uint32_t mem, flags, bo, res; uint64_t size; uint32_t pad, cmd_size; uint64_t cmd, blob_id; };
struct map { uint64_t offset; uint32_t handle, pad; };
struct execbuf { uint32_t flags, size; uint64_t command, bo_handles; uint32_t num_bo, fence_fd, ring_idx, pad; };

#define IO_GETPARAM   DRM_IOWR(DRM_COMMAND_BASE + 0x03, struct getparam)
#define IO_GET_CAPS   DRM_IOWR(DRM_COMMAND_BASE + 0x09, struct get_caps)
#define IO_CTX_INIT   DRM_IOWR(DRM_COMMAND_BASE + 0x0b, struct ctx_init)
#define IO_BLOB       DRM_IOWR(DRM_COMMAND_BASE + 0x0a, struct create_blob)
#define IO_MAP        DRM_IOWR(DRM_COMMAND_BASE + 0x01, struct map)
#define IO_EXEC       DRM_IOWR(DRM_COMMAND_BASE + 0x02, struct execbuf)

static const char *node(void)
{
    const char *n = getenv("APIR_RIG_NODE");
    return n && *n ? n : "/dev/dri/renderD128";
}

static int fails_with(int rc, int e)
{
    return rc == -1 && errno == e;
}

static int init_ctx(int fd, uint32_t capset)
{
    struct set_param p[3] = { { 1, capset }, { 2, 1 }, { 3, 0 } };
    struct ctx_init ci = { 3, 0, (uint64_t)(uintptr_t)p };
    return ioctl(fd, IO_CTX_INIT, &ci);
}

static uint8_t *new_blob(int fd, uint64_t size, uint32_t *res)
{
    struct create_blob cb = { .mem = 2, .flags = 1, .size = size };
    if (ioctl(fd, IO_BLOB, &cb) != 0)
        return NULL;
    struct map m = { .handle = cb.bo };
    if (ioctl(fd, IO_MAP, &m) != 0)
        return NULL;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)m.offset);
    *res = cb.res;
    return p == MAP_FAILED ? NULL : p;
}

/* Submits cmd and waits up to 2 s for the reply word; returns it (0: none). */
static uint32_t submit(int fd, uint8_t *reply, const void *cmd, uint32_t len)
{
    _Atomic uint32_t *w = (_Atomic uint32_t *)(void *)reply;
    atomic_store(w, 0);
    struct execbuf eb = { .flags = 4, .size = len, .command = (uint64_t)(uintptr_t)cmd };
    if (ioctl(fd, IO_EXEC, &eb) != 0)
        return 0;
    for (int i = 0; i < 2000; i++) {
        uint32_t v = atomic_load(w);
        if (v)
            return v;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void test_shim_ioctls(void)
{
    int fd = open(node(), O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    drmVersionPtr v = drmGetVersion(fd);
    CHECK(v && strcmp(v->name, "virtio_gpu") == 0);
    if (v)
        drmFreeVersion(v);
    CHECK(fails_with(ioctl(fd, IO_GETPARAM, NULL), EFAULT));
    CHECK(fails_with(ioctl(fd, IO_GETPARAM, (void *)16), EFAULT));
    struct getparam gp = { 99, 0 };
    CHECK(fails_with(ioctl(fd, IO_GETPARAM, &gp), EINVAL));
    gp = (struct getparam){ 7, 0 };  /* value points nowhere */
    CHECK(fails_with(ioctl(fd, IO_GETPARAM, &gp), EFAULT));
    CHECK(fails_with(ioctl(fd, _IOWR('d', 0x40 + 0x30, int), &gp), EINVAL));          /* unknown driver ioctl */
    CHECK(fails_with(ioctl(fd, _IOWR('d', 0x40 + 0x03, uint64_t), &gp), ENOTTY));     /* wrong size */
    CHECK(fails_with(ioctl(fd, _IOWR('x', 0x03, struct getparam), &gp), ENOTTY));     /* not DRM */
    uint8_t caps[24];
    struct get_caps gc = { 7, 0, (uint64_t)(uintptr_t)caps, sizeof(caps), 0 };
    CHECK(fails_with(ioctl(fd, IO_GET_CAPS, &gc), EINVAL));    /* no capset 7 */
    gc.id = RIG_CAPSET_APIR;
    gc.addr = 8;
    CHECK(fails_with(ioctl(fd, IO_GET_CAPS, &gc), EFAULT));

    /* Nothing before a context. */
    struct create_blob cb = { .mem = 2, .flags = 1, .size = 16384 };
    CHECK(fails_with(ioctl(fd, IO_BLOB, &cb), EINVAL));
    struct execbuf eb = { .flags = 4, .size = 12, .command = (uint64_t)(uintptr_t)caps };
    CHECK(fails_with(ioctl(fd, IO_EXEC, &eb), EINVAL));

    /* Bad context parameters. */
    struct set_param bad[2] = { { 1, 10 }, { 1, 10 } };
    struct ctx_init ci = { 2, 0, (uint64_t)(uintptr_t)bad };
    CHECK(fails_with(ioctl(fd, IO_CTX_INIT, &ci), EINVAL));  /* a parameter twice */
    ci = (struct ctx_init){ 1000, 0, (uint64_t)(uintptr_t)bad };
    CHECK(fails_with(ioctl(fd, IO_CTX_INIT, &ci), EINVAL));
    ci = (struct ctx_init){ 1, 0, 24 };
    CHECK(fails_with(ioctl(fd, IO_CTX_INIT, &ci), EFAULT));
    struct set_param two_rings[2] = { { 1, 10 }, { 2, 2 } };
    ci = (struct ctx_init){ 2, 0, (uint64_t)(uintptr_t)two_rings };
    CHECK(ioctl(fd, IO_CTX_INIT, &ci) == -1);                 /* the rig takes one ring */
    CHECK(init_ctx(fd, RIG_CAPSET_APIR) == 0);
    CHECK(fails_with(init_ctx(fd, RIG_CAPSET_APIR), EEXIST));

    /* Blobs: odd sizes and flags, unknown handles, bad offsets. */
    cb = (struct create_blob){ .mem = 2, .flags = 1, .size = 100 };
    CHECK(fails_with(ioctl(fd, IO_BLOB, &cb), EINVAL));
    cb = (struct create_blob){ .mem = 9, .flags = 1, .size = 16384 };
    CHECK(fails_with(ioctl(fd, IO_BLOB, &cb), EINVAL));
    cb = (struct create_blob){ .mem = 2, .flags = 1, .size = 1ull << 50 };
    CHECK(ioctl(fd, IO_BLOB, &cb) == -1);
    cb = (struct create_blob){ .mem = 1, .flags = 1, .size = 16384 };  /* guest memory: not simulated */
    CHECK(ioctl(fd, IO_BLOB, &cb) == -1);
    struct map m = { .handle = 12345 };
    CHECK(fails_with(ioctl(fd, IO_MAP, &m), ENOENT));
    CHECK(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 12345ll << 32) == MAP_FAILED);
    struct drm_gem_close gcl = { .handle = 777 };
    CHECK(fails_with(ioctl(fd, DRM_IOCTL_GEM_CLOSE, &gcl), EINVAL));
    uint32_t res;
    uint8_t *blob = new_blob(fd, 16384, &res);
    CHECK(blob != NULL);
    CHECK(mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, fd, 1ll << 32) == MAP_FAILED);  /* longer than the blob */

    /* EXECBUFFER: bad flags, ring, size, pointer. */
    eb = (struct execbuf){ .flags = 4, .size = 12, .ring_idx = 3, .command = (uint64_t)(uintptr_t)caps };
    CHECK(fails_with(ioctl(fd, IO_EXEC, &eb), EINVAL));
    eb = (struct execbuf){ .flags = 0x80, .size = 12, .command = (uint64_t)(uintptr_t)caps };
    CHECK(fails_with(ioctl(fd, IO_EXEC, &eb), EINVAL));
    eb = (struct execbuf){ .flags = 4, .size = RIG_MAX_COMMAND + 1, .command = (uint64_t)(uintptr_t)caps };
    CHECK(fails_with(ioctl(fd, IO_EXEC, &eb), EINVAL));
    eb = (struct execbuf){ .flags = 4, .size = 64, .command = 64 };
    CHECK(fails_with(ioctl(fd, IO_EXEC, &eb), EFAULT));

    /* Commands the rig must refuse without dying: too short, unknown type,
     * no such reply blob (no answer possible), FORWARD before LOADLIBRARY,
     * truncated handshake. */
    uint32_t cmd[64];
    memset(cmd, 0, sizeof(cmd));
    CHECK(submit(fd, blob, cmd, 4) == 0);
    cmd[0] = 77; cmd[2] = res;
    CHECK(submit(fd, blob, cmd, 12) == 1 + 1);
    cmd[0] = 2; cmd[1] = 0; cmd[2] = res + 1000;
    CHECK(submit(fd, blob, cmd, 12) == 0);
    cmd[2] = res;
    CHECK(submit(fd, blob, cmd, 12) == 1 + 1);                 /* NO_DISPATCH */
    cmd[0] = 0;
    CHECK(submit(fd, blob, cmd, 14) == 1 + 0xab1e);            /* truncated handshake: still answered */
    cmd[0] = 1;
    uint32_t load = submit(fd, blob, cmd, 12);
    CHECK(load == 1);                                          /* LOADLIBRARY: success */
    CHECK(submit(fd, blob, cmd, 12) == 1 + 2);                 /* ALREADY_LOADED */
    /* FORWARDs the host library must refuse: unknown, truncated, garbage. */
    cmd[0] = 2;
    cmd[1] = 9999;
    CHECK(submit(fd, blob, cmd, 12) == 1 + 4 + 6);             /* BASE + INVALID_INDEX */
    cmd[1] = 17;                                               /* BUFFER_SET_TENSOR */
    CHECK(submit(fd, blob, cmd, 20) == 1 + 4 + 2);             /* BASE + BAD_REQUEST */
    memset(cmd + 3, 0xff, sizeof(cmd) - 12);
    CHECK(submit(fd, blob, cmd, sizeof(cmd)) == 1 + 4 + 2);
    cmd[1] = 22;                                               /* GRAPH_COMPUTE on the reply blob itself */
    cmd[3] = res; cmd[4] = 1 << 20; cmd[5] = 0;
    CHECK(submit(fd, blob, cmd, 24) == 1 + 4 + 2);
    cmd[1] = 9;                                                /* BUFFER_FROM_PTR: not over virgl */
    cmd[3] = res; cmd[4] = 4096; cmd[5] = 0; cmd[6] = 4096; cmd[7] = 0;
    CHECK(submit(fd, blob, cmd, 32) == 1 + 4 + 2);
    cmd[1] = 0;                                                /* and the context still works */
    CHECK(submit(fd, blob, cmd, 12) == 1 + 4 + 0);
    close(fd);
}

/* Raw messages straight to the rig's socket. */
static int raw_connect(void)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(s);
        return -1;
    }
    return s;
}

/* True if the rig hung up on us (what it does to a malformed peer). */
static bool hung_up(int s)
{
    char b[64];
    struct timeval tv = { 2, 0 };
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return recv(s, b, sizeof(b), 0) == 0;
}

static void test_rig_messages(void)
{
    uint8_t junk[300];
    memset(junk, 0x41, sizeof(junk));
    int s = raw_connect();
    CHECK(s >= 0 && send(s, junk, 3, 0) == 3 && hung_up(s));  /* shorter than a header */
    close(s);
    s = raw_connect();
    struct rig_msg m = { .type = 99 };
    CHECK(s >= 0 && send(s, &m, sizeof(m), 0) == (ssize_t)sizeof(m) && hung_up(s));
    close(s);
    s = raw_connect();
    memcpy(junk, &(struct rig_msg){ .type = RIG_GET_CAPS }, sizeof(m));  /* with a payload it must not have */
    CHECK(s >= 0 && send(s, junk, sizeof(junk), 0) == (ssize_t)sizeof(junk) && hung_up(s));
    close(s);
    /* A descriptor the rig did not ask for is closed, the request served. */
    s = raw_connect();
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    m = (struct rig_msg){ .type = RIG_GET_CAPS, .a = RIG_CAPSET_APIR };
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof(cbuf));
    struct iovec iov = { &m, sizeof(m) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pipefd[0], sizeof(int));
    CHECK(sendmsg(s, &mh, 0) == (ssize_t)sizeof(m));
    struct rig_reply r;
    CHECK(recv(s, &r, sizeof(r), 0) == (ssize_t)sizeof(r) && r.status == 0 && r.data_size == 24);
    /* Blobs and commands without a context; destroying what is not there. */
    m = (struct rig_msg){ .type = RIG_CREATE_BLOB, .a = 2, .b = 1, .q = 16384 };
    CHECK(send(s, &m, sizeof(m), 0) == (ssize_t)sizeof(m));
    CHECK(recv(s, &r, sizeof(r), 0) == (ssize_t)sizeof(r) && r.status == -EINVAL);
    m = (struct rig_msg){ .type = RIG_DESTROY_BLOB, .a = 424242 };
    CHECK(send(s, &m, sizeof(m), 0) == (ssize_t)sizeof(m));
    CHECK(recv(s, &r, sizeof(r), 0) == (ssize_t)sizeof(r) && r.status == -EINVAL);
    m = (struct rig_msg){ .type = RIG_EXEC };
    CHECK(send(s, &m, sizeof(m), 0) == (ssize_t)sizeof(m));   /* dropped, no reply */
    m = (struct rig_msg){ .type = RIG_CONTEXT_INIT, .a = RIG_CAPSET_VENUS, .b = 1 };
    CHECK(send(s, &m, sizeof(m), 0) == (ssize_t)sizeof(m));
    CHECK(recv(s, &r, sizeof(r), 0) == (ssize_t)sizeof(r) && r.status == 0);
    close(s);
    close(pipefd[0]);
    close(pipefd[1]);
}

/* The Venus capset: every command type is offset by 331. */
static void test_venus_offsets(void)
{
    int fd = open(node(), O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0 && init_ctx(fd, RIG_CAPSET_VENUS) == 0);
    uint32_t res;
    uint8_t *blob = new_blob(fd, 16384, &res);
    CHECK(blob != NULL);
    uint32_t cmd[5] = { 0, 0, res, 0, 2 };
    CHECK(submit(fd, blob, cmd, 20) == 1 + 1);                  /* HANDSHAKE unoffset: unknown there */
    cmd[0] = 331;
    CHECK(submit(fd, blob, cmd, 20) == 1 + 0xab1e);
    cmd[0] = 332;
    CHECK(submit(fd, blob, cmd, 12) == 1);
    cmd[0] = 333;
    CHECK(submit(fd, blob, cmd, 12) == 1 + 4);                  /* FORWARD DEVICE_GET_DEVICE_COUNT */
    close(fd);
}

static const struct test_case cases[] = {
    TEST(test_shim_ioctls),
    TEST(test_rig_messages),
    TEST(test_venus_offsets),
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: rig_abuse RIG_SOCKET (under the shim)\n");
        return 2;
    }
    sock_path = argv[1];
    return test_run("rig_abuse", cases, (int)(sizeof(cases) / sizeof(cases[0])));
}
