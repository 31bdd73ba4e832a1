#include "fdpass.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FDS 4

ssize_t apir_send_fds(int sock, const void *buf, size_t len, const int *fds, int n_fds)
{
    if (n_fds < 0 || n_fds > MAX_FDS)
        return -1;
    /* Without descriptors, send(): a host worker may not call sendmsg at
     * all (host/server/sandbox.c: a filter cannot see what its control data
     * passes). */
    if (n_fds == 0) {
        ssize_t r;
        do
            r = send(sock, buf, len, MSG_NOSIGNAL);
        while (r < 0 && errno == EINTR);
        return r;
    }
    struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (n_fds) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    }
    ssize_t r;
    do
        r = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r;
}

ssize_t apir_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *n_fds, int timeout_ms)
{
    *n_fds = 0;
    struct pollfd p = { .fd = sock, .events = POLLIN };
    int pr;
    do
        pr = poll(&p, 1, timeout_ms);
    while (pr < 0 && errno == EINTR);
    if (pr <= 0 || !(p.revents & POLLIN))
        return -1;
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
    ssize_t r;
    do
        r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int got[MAX_FDS * 2];
        if (n > (int)(sizeof(got) / sizeof(got[0])))
            n = (int)(sizeof(got) / sizeof(got[0]));
        memcpy(got, CMSG_DATA(c), sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++) {
            if (*n_fds < max_fds)
                fds[(*n_fds)++] = got[i];
            else
                close(got[i]);
        }
    }
    if (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) {
        for (int i = 0; i < *n_fds; i++)
            close(fds[i]);
        *n_fds = 0;
        return -1;
    }
    return r;
}

size_t apir_page_size(void)
{
    static _Atomic size_t page;
    size_t p = atomic_load_explicit(&page, memory_order_relaxed);
    if (!p) {
        long v = sysconf(_SC_PAGESIZE);
        p = v > 0 ? (size_t)v : 4096;
        atomic_store_explicit(&page, p, memory_order_relaxed);
    }
    return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14; older headers lack it */
#endif

/*
 * Is this machine's free memory handed back to a hypervisor (a virtio
 * balloon with free page reporting, VIRTIO_BALLOON_F_REPORTING, feature bit
 * 5)?  The kernel reports free blocks of a huge page or more, so a huge page
 * taken a few seconds after memory was freed is memory the hypervisor must
 * back again: on the 2-vCPU VM, a 128 MiB blob committed in huge pages took
 * 294 ms that way against 90-111 in 4 KiB pages (and 6 ms from memory not
 * reported).  Read once.
 */
bool apir_free_memory_reported(void)
{
    static _Atomic int reported = -1;
    int r = atomic_load_explicit(&reported, memory_order_relaxed);
    if (r >= 0)
        return r;
    r = 0;
    static const char drv[] = "/sys/bus/virtio/drivers/virtio_balloon";
    DIR *d = opendir(drv);
    struct dirent *e;
    while (d && !r && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "virtio", 6) != 0)
            continue;
        char path[sizeof(drv) + 2 * sizeof(e->d_name)], bits[64] = "";
        snprintf(path, sizeof(path), "%s/%s/features", drv, e->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            r = fgets(bits, sizeof(bits), f) && strlen(bits) > 5 && bits[5] == '1';
            fclose(f);
        }
    }
    if (d)
        closedir(d);
    atomic_store_explicit(&reported, r, memory_order_relaxed);
    return r;
}

bool apir_huge_pages_wanted(const char *env_name)
{
    const char *e = getenv(env_name);
    if (e && !strcmp(e, "0"))
        return false;
    if (e && !strcmp(e, "1"))
        return true;
    return !apir_free_memory_reported();
}

/*
 * A blob mapped with every page committed, up front: on a VM demand paging
 * costs ~6 us per 4 KiB page (a 593 MB model copied into a fresh blob took
 * 2.4 s faulting page by page, 0.16 s populating + 1.1 s copying), and a
 * host refuses a blob with holes (client_shm.c).  Committing 4 KiB pages of
 * shared memory is itself about half of a program's load through apir when
 * its weights are read into buffers (whisper.cpp, docs/MEASUREMENTS.md).
 * Where the kernel gives shared memory huge pages on request
 * (transparent_hugepage/shmem_enabled "advise"; "always" gives them unasked),
 * the mapping asks for them before it is populated: 128 MiB committed in 6 ms
 * instead of 85 on the 2-vCPU VM.  A kernel that gives none (the default,
 * "never") ignores the request.  Not asked for by default where free memory
 * goes back to a hypervisor (apir_free_memory_reported); APIR_HUGEPAGES=0
 * or 1 decides.
 * MADV_POPULATE_WRITE commits what MAP_POPULATE would, after the request;
 * where it is unknown (a kernel before 5.14) or filtered out, the blob is
 * mapped again with MAP_POPULATE.  NULL (errno set) when the memory is not
 * there (ENOMEM, EFAULT: MAP_POPULATE would have left holes silently).
 */
static void *map_populated(int fd, size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (apir_huge_pages_wanted("APIR_HUGEPAGES"))
        (void)madvise(p, size, MADV_HUGEPAGE);
    if (madvise(p, size, MADV_POPULATE_WRITE) == 0)
        return p;
    const int err = errno;
    munmap(p, size);
    if (err != EINVAL && err != ENOSYS && err != EPERM) {  /* the memory is not there */
        errno = err;
        return NULL;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int apir_memfd_create(const char *name, size_t size, void **map)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    void *p = map_populated(fd, size);
    if (!p) {
        close(fd);
        return -1;
    }
    *map = p;
    return fd;
}

void *apir_memfd_map_checked(int fd, size_t size, const char **why)
{
    /* Without F_SEAL_SHRINK the guest could truncate the file under our
     * mapping and every host access would fault (SIGBUS). */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        *why = "blob is not a memfd sealed against shrinking";
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)size || size == 0) {
        *why = "blob is smaller than announced";
        return NULL;
    }
    /* The guest populated it: this only fills our page tables, at once
     * (37 ms for 600 MB) instead of fault by fault (0.87 s). */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        *why = "cannot map blob";
        return NULL;
    }
    return p;
}
