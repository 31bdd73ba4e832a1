/*
 * The file behind a blob (blob_fd.h).
 */
#include "blob_fd.h"

#include "fdpass.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* PROCMAP_QUERY (Linux 6.11, linux/fs.h), spelled out for older headers. */
struct procmap_query_v1 {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
};
#define PROCMAP_QUERY_V1 _IOWR('f', 17, struct procmap_query_v1)
#define PROCMAP_VMA_READABLE 0x01
#define PROCMAP_VMA_WRITABLE 0x02
#define PROCMAP_VMA_SHARED   0x08

/* /proc/self/maps, kept open for PROCMAP_QUERY; -1: the kernel lacks it. */
static int maps_fd = -1;
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static bool query(int fd, uintptr_t a, struct apir_mapping *m, int *err)
{
    struct procmap_query_v1 q = { .size = sizeof(q), .query_addr = a };
    if (ioctl(fd, PROCMAP_QUERY_V1, &q) != 0) {
        *err = errno;
        return false;
    }
    *m = (struct apir_mapping){
        .start = (uintptr_t)q.vma_start, .end = (uintptr_t)q.vma_end, .offset = q.vma_offset,
        .dev = makedev(q.dev_major, q.dev_minor), .ino = (ino_t)q.inode,
        .shared_rw = (q.vma_flags & (PROCMAP_VMA_READABLE | PROCMAP_VMA_WRITABLE | PROCMAP_VMA_SHARED)) ==
                     (PROCMAP_VMA_READABLE | PROCMAP_VMA_WRITABLE | PROCMAP_VMA_SHARED),
    };
    return true;
}

static void maps_open(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    struct apir_mapping m;
    int err = 0;
    /* Probed on a mapping that exists: this function's own. */
    if (fd >= 0 && !query(fd, (uintptr_t)&maps_open, &m, &err) && (err == ENOTTY || err == EINVAL)) {
        close(fd);
        fd = -1;
    }
    maps_fd = fd;
}

/* The slow way: the mapping's line in /proc/self/maps. */
static bool mapping_from_file(uintptr_t a, struct apir_mapping *m)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return false;
    char line[512];
    bool found = false, at_line_start = true;
    while (!found && fgets(line, sizeof(line), f)) {
        const bool complete = strchr(line, '\n') != NULL;
        unsigned long start, end, ino;
        unsigned long long offset;
        unsigned maj, min;
        char perms[8];
        if (at_line_start && sscanf(line, "%lx-%lx %7s %llx %x:%x %lu", &start, &end, perms, &offset, &maj, &min,
                                    &ino) == 7) {
            if (start > a)
                break;
            if (a < end) {
                *m = (struct apir_mapping){ .start = start, .end = end, .offset = offset, .dev = makedev(maj, min),
                                            .ino = (ino_t)ino,
                                            .shared_rw = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's' };
                found = true;
            }
        }
        at_line_start = complete;
    }
    fclose(f);
    return found;
}

bool apir_virgl_mapping_at(const void *p, struct apir_mapping *m)
{
    pthread_once(&maps_once, maps_open);
    int err;
    if (maps_fd >= 0)
        return query(maps_fd, (uintptr_t)p, m, &err);
    return mapping_from_file((uintptr_t)p, m);
}

static bool same_file(const struct stat *st, const struct apir_mapping *m)
{
    return S_ISREG(st->st_mode) && st->st_dev == m->dev && st->st_ino == m->ino;
}

/* This process's descriptor of m's file, opened anew: its own open file
 * description, so nothing the worker does with it (its offset) touches the
 * hypervisor's. */
static int reopen_from_fds(const struct apir_mapping *m)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        char *endp;
        const long n = strtol(e->d_name, &endp, 10);
        struct stat st;
        if (*endp || endp == e->d_name || n == dirfd(d) || fstat((int)n, &st) != 0 || !same_file(&st, m))
            continue;
        char path[48];
        snprintf(path, sizeof(path), "/proc/self/fd/%ld", n);
        const int fd = open(path, O_RDWR | O_CLOEXEC);
        /* The descriptor may have been closed and its number reused since. */
        if (fd >= 0 && (fstat(fd, &st) != 0 || !same_file(&st, m)))
            close(fd);
        else
            found = fd;
    }
    closedir(d);
    return found;
}

/*
 * The mapping's own file, opened through /proc/self/map_files: what is left
 * when no descriptor holds it any more - virglrenderer's render worker
 * sends a blob's memfd to the hypervisor and closes its own, keeping only
 * the mapping.  The kernel lets a process open its map_files only with
 * CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE (Linux 5.9) in the initial user
 * namespace; -1 without.
 */
static int reopen_from_mapping(const struct apir_mapping *m)
{
    char path[80];
    snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)m->start, (unsigned long)m->end);
    const int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !same_file(&st, m))) {
        close(fd);
        return -1;
    }
    return fd;
}

int apir_virgl_mapping_fd(const struct apir_mapping *m, uint64_t size, const char **why)
{
    if (!m->shared_rw || !m->ino) {
        *why = "not a shared, writable mapping of a file";
        return -1;
    }
    int fd = reopen_from_fds(m);
    if (fd < 0)
        fd = reopen_from_mapping(m);
    if (fd < 0) {
        *why = "no descriptor of this process holds its file, and /proc/self/map_files cannot open it (the "
               "hypervisor needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN for that: docs/SECURITY.md)";
        return -1;
    }
    const int want = F_SEAL_SHRINK | F_SEAL_GROW;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals >= 0 && (seals & want) != want && !(seals & F_SEAL_SEAL))
        fcntl(fd, F_ADD_SEALS, want & ~seals);
    seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        *why = "its file cannot be sealed against shrinking (not a memfd, or sealed otherwise)";
    } else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size) {
        *why = "its file is smaller than the blob";
    } else if ((uint64_t)st.st_blocks * 512u < apir_page_round_up((size_t)size) && fallocate(fd, 0, 0, (off_t)size) != 0) {
        *why = "its memory cannot be allocated";
    } else {
        return fd;
    }
    close(fd);
    return -1;
}
