/*
 * The file behind a blob: virglrenderer's callbacks give a blob only as an
 * address (get_shmem_ptr), while a worker can be given memory only as a
 * descriptor.  virglrenderer's APIR blobs are memfds it maps whole
 * (src/apir/apir-resource.c, "apir-shmem") and keeps open, so the mapping
 * names the file (device and inode) and one of this process's descriptors
 * is that file.  A blob that is not so - anonymous shared memory, a part of
 * a larger mapping, a file no descriptor holds - cannot be shared, and is
 * refused: it is never reached some other way.
 */
#ifndef APIR_VIRGL_BLOB_FD_H
#define APIR_VIRGL_BLOB_FD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct apir_mapping {
    uintptr_t start, end;    /* the mapping [start, end) */
    uint64_t offset;         /* of start in its file */
    dev_t dev;
    ino_t ino;               /* 0: anonymous */
    bool shared_rw;          /* MAP_SHARED, readable and writable */
};

/* The mapping holding p, read from the kernel (PROCMAP_QUERY where it has
 * it, Linux 6.11, ~1 us; else /proc/self/maps); false: p is in none. */
bool apir_virgl_mapping_at(const void *p, struct apir_mapping *m);

/*
 * A descriptor of the file m maps (opened anew: O_RDWR, close-on-exec),
 * found among this process's descriptors; sealed against shrinking (so the
 * hypervisor's own mapping can never fault) and growing, and its first
 * size bytes allocated (a worker refuses sparse blobs: their pages would be
 * its to pay for).  -1 with *why.
 */
int apir_virgl_mapping_fd(const struct apir_mapping *m, uint64_t size, const char **why);

#endif
