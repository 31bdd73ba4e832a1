/*
 * libapir-virgl-shim.so: the virtio-gpu kernel driver, as far as an APIR
 * guest sees it, for a guest process that has no VM around it.
 *
 * Loaded with LD_PRELOAD into the guest program.  It takes over open() of
 * one fake render node path (APIR_RIG_NODE, default /dev/dri/renderD128):
 * such an open connects to the rig (APIR_RIG_SOCKET) and returns the socket
 * as the "DRM fd".  ioctl() and mmap() on that fd are then answered the way
 * the virtio-gpu driver answers them (DRM_IOCTL_VERSION, GETPARAM, GET_CAPS,
 * CONTEXT_INIT, RESOURCE_CREATE_BLOB, MAP, GEM_CLOSE, EXECBUFFER), with the
 * rig playing the host; every other fd goes to the real libc.  drmGetDevices2
 * is answered too (one virtio-gpu PCI device), for guests that enumerate
 * devices with libdrm, as the reference guest does.
 *
 * The guest code on top runs unmodified: transport/virtgpu.c (raw ioctls),
 * or the reference's virtgpu.cpp through libdrm's drmGetVersion and drmIoctl.
 *
 * Like the kernel, the shim copies ioctl arguments in and out with checks:
 * a bad pointer gives EFAULT (process_vm_readv/writev), an unknown ioctl
 * EINVAL, a bad size ENOTTY; nothing a caller passes makes it crash.
 */
#include "rig_proto.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <drm.h>
#include <xf86drm.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

/* virtio-gpu uAPI (Linux >= 5.16; Debian's libdrm header predates it). */
#define VGPU_MAP          0x01
#define VGPU_EXECBUFFER   0x02
#define VGPU_GETPARAM     0x03
#define VGPU_GET_CAPS     0x09
#define VGPU_CREATE_BLOB  0x0a
#define VGPU_CONTEXT_INIT 0x0b

#define EXECBUF_FENCE_FD_IN  0x01u
#define EXECBUF_FENCE_FD_OUT 0x02u
#define EXECBUF_RING_IDX     0x04u

struct vgpu_map { uint64_t offset; uint32_t handle; uint32_t pad; };
struct vgpu_execbuffer_v1 {  /* before ring_idx: 32 bytes */
    uint32_t flags, size;
    uint64_t command, bo_handles;
    uint32_t num_bo_handles;
    int32_t fence_fd;
};
struct vgpu_execbuffer_v2 {  /* with ring_idx: 40 bytes and up */
    struct vgpu_execbuffer_v1 v1;
    uint32_t ring_idx, pad;
};
struct vgpu_getparam { uint64_t param, value; };
struct vgpu_get_caps { uint32_t cap_set_id, cap_set_ver; uint64_t addr; uint32_t size, pad; };
struct vgpu_create_blob {
    uint32_t blob_mem, blob_flags, bo_handle, res_handle;
    uint64_t size;
    uint32_t pad, cmd_size;
    uint64_t cmd, blob_id;
};
struct vgpu_set_param { uint64_t param, value; };
struct vgpu_context_init { uint32_t num_params, pad; uint64_t ctx_set_params; };

_Static_assert(sizeof(struct vgpu_execbuffer_v1) == 32, "execbuffer v1");
_Static_assert(sizeof(struct vgpu_create_blob) == 48, "create_blob");

/* ---- the real libc ---------------------------------------------------------- */

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*openat2_fn)(int, const char *, int);
typedef int (*close_fn)(int);
typedef int (*ioctl_fn)(int, unsigned long, ...);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static struct {
    open_fn open, open64;
    openat_fn openat, openat64;
    open2_fn open_2, open64_2;
    openat2_fn openat_2, openat64_2;
    close_fn close;
    ioctl_fn ioctl;
    mmap_fn mmap, mmap64;
} real;

static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void *next_sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void resolve_real(void)
{
    real.open = (open_fn)next_sym("open");
    real.open64 = (open_fn)next_sym("open64");
    real.openat = (openat_fn)next_sym("openat");
    real.openat64 = (openat_fn)next_sym("openat64");
    real.open_2 = (open2_fn)next_sym("__open_2");
    real.open64_2 = (open2_fn)next_sym("__open64_2");
    real.openat_2 = (openat2_fn)next_sym("__openat_2");
    real.openat64_2 = (openat2_fn)next_sym("__openat64_2");
    real.close = (close_fn)next_sym("close");
    real.ioctl = (ioctl_fn)next_sym("ioctl");
    real.mmap = (mmap_fn)next_sym("mmap");
    real.mmap64 = (mmap_fn)next_sym("mmap64");
}

static void need_real(void)
{
    pthread_once(&real_once, resolve_real);
}

/* ---- fake devices ------------------------------------------------------------ */

struct shim_bo {
    uint32_t handle;
    uint32_t res_id;
    int memfd;
    uint64_t size;
};

struct shim_dev {
    int fd;                      /* the rig socket, handed out as the DRM fd */
    pthread_mutex_t lock;        /* one request/reply at a time */
    bool ctx_init;
    uint32_t num_rings;
    struct shim_bo *bos;
    uint32_t n_bos, bos_cap;
    uint32_t next_handle;
    struct shim_dev *next;
};

static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_dev *devs;

static const char *node_path(void)
{
    const char *p = getenv("APIR_RIG_NODE");
    return p && *p ? p : "/dev/dri/renderD128";
}

static struct shim_dev *dev_of(int fd)
{
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&devs_lock);
    struct shim_dev *d = devs;
    while (d && d->fd != fd)
        d = d->next;
    pthread_mutex_unlock(&devs_lock);
    return d;
}

static int set_errno(int e)
{
    errno = e;
    return -1;
}

/* Copies between the caller's memory and ours, EFAULT instead of a crash. */
static bool copy_in(void *dst, uint64_t src, size_t n)
{
    if (n == 0)
        return true;
    struct iovec local = { dst, n }, remote = { (void *)(uintptr_t)src, n };
    return src && process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

static bool copy_out(uint64_t dst, const void *src, size_t n)
{
    if (n == 0)
        return true;
    struct iovec local = { (void *)src, n }, remote = { (void *)(uintptr_t)dst, n };
    return dst && process_vm_writev(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

/* One request to the rig and its reply (with an fd for RIG_CREATE_BLOB). */
static int rig_request(struct shim_dev *d, const struct rig_msg *m, struct rig_reply *r, int *fd_out)
{
    if (fd_out)
        *fd_out = -1;
    if (send(d->fd, m, sizeof(*m), MSG_NOSIGNAL) != (ssize_t)sizeof(*m))
        return -ENODEV;
    /* The rig answers after any command it is still running: wait long. */
    struct pollfd p = { .fd = d->fd, .events = POLLIN };
    if (poll(&p, 1, 600 * 1000) != 1)
        return -ETIMEDOUT;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = { r, sizeof(*r) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
    ssize_t n = recvmsg(d->fd, &mh, MSG_CMSG_CLOEXEC);
    int got_fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&got_fd, CMSG_DATA(c), sizeof(int));
    }
    if (n != (ssize_t)sizeof(*r) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if (got_fd >= 0)
            real.close(got_fd);
        return -ENODEV;
    }
    if (fd_out)
        *fd_out = got_fd;
    else if (got_fd >= 0)
        real.close(got_fd);
    return r->status;
}

static struct shim_bo *bo_of(struct shim_dev *d, uint32_t handle)
{
    for (uint32_t i = 0; i < d->n_bos; i++)
        if (d->bos[i].handle == handle)
            return &d->bos[i];
    return NULL;
}

/* ---- ioctls --------------------------------------------------------------------- */

static void put_string(char *dst_user, __kernel_size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (dst_user && *len)
        copy_out((uint64_t)(uintptr_t)dst_user, s, n < *len ? n : *len);
    *len = n;
}

static int do_version(void *arg)
{
    struct drm_version v;
    if (!copy_in(&v, (uint64_t)(uintptr_t)arg, sizeof(v)))
        return -EFAULT;
    v.version_major = 0;
    v.version_minor = 1;
    v.version_patchlevel = 0;
    put_string(v.name, &v.name_len, "virtio_gpu");
    put_string(v.date, &v.date_len, "0");
    put_string(v.desc, &v.desc_len, "virtio GPU (apir virgl rig)");
    return copy_out((uint64_t)(uintptr_t)arg, &v, sizeof(v)) ? 0 : -EFAULT;
}

static int do_getparam(void *arg)
{
    struct vgpu_getparam gp;
    if (!copy_in(&gp, (uint64_t)(uintptr_t)arg, sizeof(gp)))
        return -EFAULT;
    int value;
    switch (gp.param) {
    case 1: value = 1; break;  /* 3D_FEATURES */
    case 2: value = 1; break;  /* CAPSET_QUERY_FIX */
    case 3: value = 1; break;  /* RESOURCE_BLOB */
    case 4: value = 1; break;  /* HOST_VISIBLE */
    case 5: value = 0; break;  /* CROSS_DEVICE */
    case 6: value = 1; break;  /* CONTEXT_INIT */
    case 7: value = (int)((1u << RIG_CAPSET_VENUS) | (1u << RIG_CAPSET_APIR)); break;
    default: return -EINVAL;
    }
    /* The kernel writes an int, not the whole u64. */
    return copy_out(gp.value, &value, sizeof(value)) ? 0 : -EFAULT;
}

static int do_get_caps(struct shim_dev *d, void *arg)
{
    struct vgpu_get_caps gc;
    if (!copy_in(&gc, (uint64_t)(uintptr_t)arg, sizeof(gc)))
        return -EFAULT;
    struct rig_msg m = { .type = RIG_GET_CAPS, .a = gc.cap_set_id, .b = gc.cap_set_ver };
    struct rig_reply r;
    int rc = rig_request(d, &m, &r, NULL);
    if (rc)
        return rc;
    size_t n = r.data_size < sizeof(r.data) ? r.data_size : sizeof(r.data);
    if (gc.size < n)
        n = gc.size;
    return copy_out(gc.addr, r.data, n) ? 0 : -EFAULT;
}

static int do_context_init(struct shim_dev *d, void *arg)
{
    struct vgpu_context_init ci;
    if (!copy_in(&ci, (uint64_t)(uintptr_t)arg, sizeof(ci)))
        return -EFAULT;
    if (d->ctx_init)
        return -EEXIST;
    if (ci.num_params == 0 || ci.num_params > 8 || ci.pad)
        return -EINVAL;
    struct vgpu_set_param p[8];
    if (!copy_in(p, ci.ctx_set_params, ci.num_params * sizeof(p[0])))
        return -EFAULT;
    uint64_t capset = 0, rings = 0, mask = 0;
    uint32_t seen = 0;
    for (uint32_t i = 0; i < ci.num_params; i++) {
        if (p[i].param < 1 || p[i].param > 4 || (seen & (1u << p[i].param)))
            return -EINVAL;
        seen |= 1u << p[i].param;
        if (p[i].param == 1)
            capset = p[i].value;
        else if (p[i].param == 2)
            rings = p[i].value;
        else if (p[i].param == 3)
            mask = p[i].value;
    }
    if (!capset || capset > 63 || rings > 64 || (rings < 64 && (mask >> rings)))
        return -EINVAL;
    struct rig_msg m = { .type = RIG_CONTEXT_INIT, .a = (uint32_t)capset, .b = (uint32_t)rings, .c = (uint32_t)mask };
    struct rig_reply r;
    int rc = rig_request(d, &m, &r, NULL);
    if (rc)
        return rc;
    d->ctx_init = true;
    d->num_rings = (uint32_t)rings;
    return 0;
}

static int do_create_blob(struct shim_dev *d, void *arg)
{
    struct vgpu_create_blob cb;
    if (!copy_in(&cb, (uint64_t)(uintptr_t)arg, sizeof(cb)))
        return -EFAULT;
    if (!d->ctx_init || cb.blob_mem < 1 || cb.blob_mem > 3 || (cb.blob_flags & ~7u) || !cb.size ||
        (cb.size & 4095) || cb.pad || cb.cmd_size)
        return -EINVAL;
    if (d->n_bos == d->bos_cap) {
        uint32_t cap = d->bos_cap ? d->bos_cap * 2 : 16;
        if (cap > 65536)
            return -ENOSPC;
        struct shim_bo *b = realloc(d->bos, cap * sizeof(*b));
        if (!b)
            return -ENOMEM;
        d->bos = b;
        d->bos_cap = cap;
    }
    struct rig_msg m = { .type = RIG_CREATE_BLOB, .a = cb.blob_mem, .b = cb.blob_flags, .q = cb.size, .q2 = cb.blob_id };
    struct rig_reply r;
    int fd;
    int rc = rig_request(d, &m, &r, &fd);
    if (rc)
        return rc;
    if (fd < 0 || r.a == 0)
        return -ENODEV;
    uint32_t handle = ++d->next_handle;
    d->bos[d->n_bos++] = (struct shim_bo){ .handle = handle, .res_id = r.a, .memfd = fd, .size = cb.size };
    cb.bo_handle = handle;
    cb.res_handle = r.a;
    return copy_out((uint64_t)(uintptr_t)arg, &cb, sizeof(cb)) ? 0 : -EFAULT;
}

/* mmap offsets: the handle in the high half, like the kernel's fake offsets. */
#define MAP_OFFSET(handle) ((uint64_t)(handle) << 32)

static int do_map(struct shim_dev *d, void *arg)
{
    struct vgpu_map m;
    if (!copy_in(&m, (uint64_t)(uintptr_t)arg, sizeof(m)))
        return -EFAULT;
    if (!bo_of(d, m.handle))
        return -ENOENT;
    m.offset = MAP_OFFSET(m.handle);
    return copy_out((uint64_t)(uintptr_t)arg, &m, sizeof(m)) ? 0 : -EFAULT;
}

static int do_gem_close(struct shim_dev *d, void *arg)
{
    struct drm_gem_close gc;
    if (!copy_in(&gc, (uint64_t)(uintptr_t)arg, sizeof(gc)))
        return -EFAULT;
    struct shim_bo *b = bo_of(d, gc.handle);
    if (!b)
        return -EINVAL;
    struct rig_msg m = { .type = RIG_DESTROY_BLOB, .a = b->res_id };
    struct rig_reply r;
    rig_request(d, &m, &r, NULL);
    /* Mappings the guest still has keep the memory, as with the kernel. */
    real.close(b->memfd);
    *b = d->bos[--d->n_bos];
    return 0;
}

static int do_execbuffer(struct shim_dev *d, void *arg, size_t arg_size)
{
    struct vgpu_execbuffer_v2 eb;
    memset(&eb, 0, sizeof(eb));
    size_t n = arg_size < sizeof(eb) ? arg_size : sizeof(eb);
    if (!copy_in(&eb, (uint64_t)(uintptr_t)arg, n))
        return -EFAULT;
    uint32_t flags = eb.v1.flags;
    if (flags & ~(EXECBUF_FENCE_FD_IN | EXECBUF_FENCE_FD_OUT | EXECBUF_RING_IDX))
        return -EINVAL;
    if (flags & (EXECBUF_FENCE_FD_IN | EXECBUF_FENCE_FD_OUT))
        return -EOPNOTSUPP;  /* fences are not simulated; APIR guests use none */
    if (!d->ctx_init)
        return -EINVAL;
    if ((flags & EXECBUF_RING_IDX) && (arg_size < sizeof(struct vgpu_execbuffer_v2) || eb.ring_idx >= d->num_rings))
        return -EINVAL;
    if (eb.v1.size == 0 || eb.v1.size > RIG_MAX_COMMAND)
        return -EINVAL;
    size_t total = sizeof(struct rig_msg) + eb.v1.size;
    uint8_t *buf = malloc(total);
    if (!buf)
        return -ENOMEM;
    struct rig_msg m = { .type = RIG_EXEC, .a = eb.ring_idx };
    memcpy(buf, &m, sizeof(m));
    if (!copy_in(buf + sizeof(m), eb.v1.command, eb.v1.size)) {
        free(buf);
        return -EFAULT;
    }
    /* Queued, not run: the reply comes through shared memory. */
    ssize_t s = send(d->fd, buf, total, MSG_NOSIGNAL);
    free(buf);
    return s == (ssize_t)total ? 0 : -ENODEV;
}

static int dev_ioctl(struct shim_dev *d, unsigned long request, void *arg)
{
    if (_IOC_TYPE(request) != DRM_IOCTL_BASE)
        return -ENOTTY;
    unsigned nr = _IOC_NR(request);
    size_t size = _IOC_SIZE(request);
    int rc;
    pthread_mutex_lock(&d->lock);
    if (nr == _IOC_NR(DRM_IOCTL_VERSION))
        rc = size == sizeof(struct drm_version) ? do_version(arg) : -ENOTTY;
    else if (nr == _IOC_NR(DRM_IOCTL_GEM_CLOSE))
        rc = size == sizeof(struct drm_gem_close) ? do_gem_close(d, arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_GETPARAM)
        rc = size == sizeof(struct vgpu_getparam) ? do_getparam(arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_GET_CAPS)
        rc = size == sizeof(struct vgpu_get_caps) ? do_get_caps(d, arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_CONTEXT_INIT)
        rc = size == sizeof(struct vgpu_context_init) ? do_context_init(d, arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_CREATE_BLOB)
        rc = size == sizeof(struct vgpu_create_blob) ? do_create_blob(d, arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_MAP)
        rc = size == sizeof(struct vgpu_map) ? do_map(d, arg) : -ENOTTY;
    else if (nr == DRM_COMMAND_BASE + VGPU_EXECBUFFER)
        rc = size >= sizeof(struct vgpu_execbuffer_v1) && size <= 256 ? do_execbuffer(d, arg, size) : -ENOTTY;
    else
        rc = -EINVAL;
    pthread_mutex_unlock(&d->lock);
    return rc;
}

/* ---- interposed libc ---------------------------------------------------------------- */

static int open_fake(int flags)
{
    const char *sock = getenv("APIR_RIG_SOCKET");
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (!sock || !*sock || strlen(sock) >= sizeof(addr.sun_path))
        return set_errno(ENOENT);  /* no rig: as if there were no device */
    strcpy(addr.sun_path, sock);
    struct shim_dev *d = calloc(1, sizeof(*d));
    if (!d)
        return set_errno(ENOMEM);
    d->fd = socket(AF_UNIX, SOCK_SEQPACKET | ((flags & O_CLOEXEC) ? SOCK_CLOEXEC : 0), 0);
    if (d->fd < 0 || connect(d->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        int e = errno;
        if (d->fd >= 0)
            real.close(d->fd);
        free(d);
        return set_errno(e == ENOENT || e == ECONNREFUSED ? ENODEV : e);
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_lock(&devs_lock);
    d->next = devs;
    devs = d;
    pthread_mutex_unlock(&devs_lock);
    return d->fd;
}

static bool is_node(const char *path)
{
    return path && strcmp(path, node_path()) == 0;
}

static bool is_node_at(int dirfd, const char *path)
{
    return path && (path[0] == '/' || dirfd == AT_FDCWD) && is_node(path);
}

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

SHIM_EXPORT int open(const char *path, int flags, ...);
SHIM_EXPORT int open(const char *path, int flags, ...)
{
    need_real();
    if (is_node(path))
        return open_fake(flags);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return real.open(path, flags, mode);
}

SHIM_EXPORT int open64(const char *path, int flags, ...);
SHIM_EXPORT int open64(const char *path, int flags, ...)
{
    need_real();
    if (is_node(path))
        return open_fake(flags);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return (real.open64 ? real.open64 : real.open)(path, flags, mode);
}

SHIM_EXPORT int openat(int dirfd, const char *path, int flags, ...);
SHIM_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    need_real();
    if (is_node_at(dirfd, path))
        return open_fake(flags);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return real.openat(dirfd, path, flags, mode);
}

SHIM_EXPORT int openat64(int dirfd, const char *path, int flags, ...);
SHIM_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    need_real();
    if (is_node_at(dirfd, path))
        return open_fake(flags);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return (real.openat64 ? real.openat64 : real.openat)(dirfd, path, flags, mode);
}

/* The _FORTIFY_SOURCE entry points. */
SHIM_EXPORT int __open_2(const char *path, int flags);
SHIM_EXPORT int __open_2(const char *path, int flags)
{
    need_real();
    return is_node(path) ? open_fake(flags) : real.open_2(path, flags);
}

SHIM_EXPORT int __open64_2(const char *path, int flags);
SHIM_EXPORT int __open64_2(const char *path, int flags)
{
    need_real();
    return is_node(path) ? open_fake(flags) : real.open64_2(path, flags);
}

SHIM_EXPORT int __openat_2(int dirfd, const char *path, int flags);
SHIM_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
    need_real();
    return is_node_at(dirfd, path) ? open_fake(flags) : real.openat_2(dirfd, path, flags);
}

SHIM_EXPORT int __openat64_2(int dirfd, const char *path, int flags);
SHIM_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
    need_real();
    return is_node_at(dirfd, path) ? open_fake(flags) : real.openat64_2(dirfd, path, flags);
}

SHIM_EXPORT int close(int fd);
SHIM_EXPORT int close(int fd)
{
    need_real();
    struct shim_dev *d = NULL;
    pthread_mutex_lock(&devs_lock);
    for (struct shim_dev **pp = &devs; *pp; pp = &(*pp)->next) {
        if ((*pp)->fd == fd) {
            d = *pp;
            *pp = d->next;
            break;
        }
    }
    pthread_mutex_unlock(&devs_lock);
    if (d) {
        /* Closing the node ends the context; the rig frees its side. */
        for (uint32_t i = 0; i < d->n_bos; i++)
            real.close(d->bos[i].memfd);
        free(d->bos);
        pthread_mutex_destroy(&d->lock);
        free(d);
    }
    return real.close(fd);
}

SHIM_EXPORT int ioctl(int fd, unsigned long request, ...);
SHIM_EXPORT int ioctl(int fd, unsigned long request, ...)
{
    need_real();
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    struct shim_dev *d = dev_of(fd);
    if (!d)
        return real.ioctl(fd, request, arg);
    int rc = dev_ioctl(d, request, arg);
    return rc < 0 ? set_errno(-rc) : 0;
}

static void *map_fake(struct shim_dev *d, void *addr, size_t len, int prot, int flags, off_t offset)
{
    pthread_mutex_lock(&d->lock);
    struct shim_bo *b = NULL;
    if (offset >= 0 && ((uint64_t)offset & 0xffffffffu) == 0)
        b = bo_of(d, (uint32_t)((uint64_t)offset >> 32));
    int memfd = -1;
    if (b && len && len <= b->size)
        memfd = b->memfd;
    pthread_mutex_unlock(&d->lock);
    if (memfd < 0) {
        errno = EINVAL;
        return MAP_FAILED;
    }
    return real.mmap(addr, len, prot, (flags & ~MAP_PRIVATE) | MAP_SHARED, memfd, 0);
}

SHIM_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset);
SHIM_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    need_real();
    struct shim_dev *d = (flags & MAP_ANONYMOUS) ? NULL : dev_of(fd);
    return d ? map_fake(d, addr, len, prot, flags, offset) : real.mmap(addr, len, prot, flags, fd, offset);
}

SHIM_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset);
SHIM_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    need_real();
    struct shim_dev *d = (flags & MAP_ANONYMOUS) ? NULL : dev_of(fd);
    if (d)
        return map_fake(d, addr, len, prot, flags, offset);
    return (real.mmap64 ? real.mmap64 : real.mmap)(addr, len, prot, flags, fd, offset);
}

/* ---- libdrm device enumeration ------------------------------------------------------ */

/*
 * One virtio-gpu PCI device with a render node only.  Allocated as one
 * block, as libdrm does, so libdrm's own drmFreeDevice could free it too.
 */
SHIM_EXPORT int drmGetDevices2(uint32_t flags, drmDevicePtr devices[], int max_devices);
SHIM_EXPORT int drmGetDevices2(uint32_t flags, drmDevicePtr devices[], int max_devices)
{
    (void)flags;
    if (!devices || max_devices <= 0)
        return 1;
    const char *path = node_path();
    size_t plen = strlen(path) + 1;
    size_t size = sizeof(drmDevice) + DRM_NODE_MAX * sizeof(char *) + sizeof(drmPciBusInfo) +
                  sizeof(drmPciDeviceInfo) + plen + 1;
    uint8_t *blk = calloc(1, size);
    if (!blk)
        return -ENOMEM;
    drmDevicePtr dev = (drmDevicePtr)(void *)blk;
    char **nodes = (char **)(void *)(blk + sizeof(drmDevice));
    drmPciBusInfoPtr bus = (drmPciBusInfoPtr)(void *)(nodes + DRM_NODE_MAX);
    drmPciDeviceInfoPtr info = (drmPciDeviceInfoPtr)(void *)(bus + 1);
    char *str = (char *)(info + 1);
    memcpy(str, path, plen);
    char *empty = str + plen;
    for (int i = 0; i < DRM_NODE_MAX; i++)
        nodes[i] = empty;
    nodes[DRM_NODE_RENDER] = str;
    dev->nodes = nodes;
    dev->available_nodes = 1 << DRM_NODE_RENDER;
    dev->bustype = DRM_BUS_PCI;
    bus->bus = 0;
    bus->dev = 2;
    dev->businfo.pci = bus;
    info->vendor_id = 0x1af4;   /* virtio */
    info->device_id = 0x1050;   /* virtio-gpu */
    dev->deviceinfo.pci = info;
    devices[0] = dev;
    return 1;
}

SHIM_EXPORT int drmGetDevices(drmDevicePtr devices[], int max_devices);
SHIM_EXPORT int drmGetDevices(drmDevicePtr devices[], int max_devices)
{
    return drmGetDevices2(0, devices, max_devices);
}

SHIM_EXPORT void drmFreeDevices(drmDevicePtr devices[], int count);
SHIM_EXPORT void drmFreeDevices(drmDevicePtr devices[], int count)
{
    if (!devices)
        return;
    for (int i = 0; i < count; i++) {
        free(devices[i]);
        devices[i] = NULL;
    }
}
