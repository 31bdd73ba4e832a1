/* The weight cache's tree digest: protocol/apir_tree_digest.h. */
#include "apir_tree_digest.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

unsigned apir_hash_threads(void)
{
    const char *v = getenv("APIR_HASH_THREADS");
    char *end = NULL;
    unsigned long n = v && *v ? strtoul(v, &end, 10) : 0;
    if (v && *v && end && !*end && n >= 1 && n <= APIR_HASH_THREADS_LIMIT)
        return (unsigned)n;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1u : cores > (long)APIR_HASH_THREADS_MAX ? APIR_HASH_THREADS_MAX : (unsigned)cores;
}

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One digest's work, shared by its threads: leaves are taken in order from
 * `next`, each read from mem or src_fd (pread: a descriptor's offset is left
 * alone, and threads do not share one), hashed, and, with dst_fd, written
 * there at its offset: exactly the bytes hashed. */
struct tree_job {
    apir_sha256_parts_fn sha;
    const uint8_t *mem;
    int src_fd, dst_fd;
    uint64_t size, leaves;
    uint8_t (*digest)[32];
    _Atomic uint64_t next;
    _Atomic bool failed;
};

bool apir_tree_io(int fd, uint8_t *p, size_t n, uint64_t off, bool write)
{
    while (n) {
        ssize_t r = write ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;  /* a short source is a failure, not zeros */
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return true;
}

static void *tree_worker(void *arg)
{
    struct tree_job *j = arg;
    uint8_t *buf = j->mem ? NULL : malloc(APIR_TREE_LEAF);
    if (!j->mem && !buf)
        atomic_store(&j->failed, true);
    while (!atomic_load(&j->failed)) {
        uint64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->leaves)
            break;
        const uint64_t off = i * APIR_TREE_LEAF;
        const size_t len = j->size - off < APIR_TREE_LEAF ? (size_t)(j->size - off) : APIR_TREE_LEAF;
        const uint8_t *p = j->mem ? j->mem + off : buf;
        uint8_t hdr[17] = { 0x00 };
        le64(hdr + 1, i);
        le64(hdr + 9, len);
        const void *parts[2] = { hdr, p };
        const size_t lens[2] = { sizeof(hdr), len };
        if ((!j->mem && !apir_tree_io(j->src_fd, buf, len, off, false)) || !j->sha(parts, lens, 2, j->digest[i]) ||
            (j->dst_fd >= 0 && !apir_tree_io(j->dst_fd, (uint8_t *)p, len, off, true)))
            atomic_store(&j->failed, true);
    }
    free(buf);
    return NULL;
}

bool apir_tree_digest(apir_sha256_parts_fn sha, const void *mem, int src_fd, int dst_fd, uint64_t size, unsigned threads,
                      uint8_t out[32])
{
    const uint64_t leaves = size / APIR_TREE_LEAF + (size % APIR_TREE_LEAF != 0);
    if (leaves > SIZE_MAX / 32)
        return false;
    struct tree_job j = { .sha = sha, .mem = mem, .src_fd = src_fd, .dst_fd = dst_fd, .size = size, .leaves = leaves };
    j.digest = malloc(leaves ? (size_t)leaves * 32 : 1);
    if (!j.digest)
        return false;
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, false);
    if (threads > APIR_HASH_THREADS_LIMIT)
        threads = APIR_HASH_THREADS_LIMIT;
    if ((uint64_t)threads > leaves)
        threads = leaves ? (unsigned)leaves : 1u;
    pthread_t tid[APIR_HASH_THREADS_LIMIT];
    unsigned started = 0;
    for (; started + 1 < threads; started++)
        if (pthread_create(&tid[started], NULL, tree_worker, &j) != 0)
            break;  /* fewer threads: slower, not wrong */
    tree_worker(&j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    bool ok = !atomic_load(&j.failed);
    if (ok) {
        uint8_t hdr[17] = { 0x01 };
        le64(hdr + 1, size);
        le64(hdr + 9, APIR_TREE_LEAF);
        const void *parts[2] = { hdr, j.digest };
        const size_t lens[2] = { sizeof(hdr), (size_t)leaves * 32 };
        ok = sha(parts, lens, 2, out);
    }
    free(j.digest);
    return ok;
}
