/*
 * The weight cache's tree digest (apir 0.5; docs/PROTOCOL.md section 4):
 * what BUFFER_SET_TENSOR_HASH and BUFFER_CACHE_TENSOR name a weight by when
 * both sides speak 0.5 (a 0.4 peer keeps plain SHA-256).  Plain SHA-256 is
 * one serial chain: an 8B model's 4 GB took seconds on each side, more than
 * sending the bytes over loopback.  The tree's leaves are independent, so a
 * few threads hash them at once:
 *
 *   leaf i = SHA-256(0x00 || le64(i) || le64(len_i) || bytes of leaf i)
 *   root   = SHA-256(0x01 || le64(size) || le64(APIR_TREE_LEAF) || leaf 0 || ... || leaf n-1)
 *
 * Leaves are APIR_TREE_LEAF bytes, the last one shorter (n = 0 for no
 * bytes); the index and length bind each leaf to its place, the size and
 * leaf length bind the root to the shape, and the first byte tells a leaf's
 * input from the root's.  Header-only because the guest and the host each
 * reach SHA-256 their own way (the guest loads GnuTLS with dlopen, the host
 * links it): each passes its own apir_sha256_parts_fn.
 */
#ifndef APIR_TREE_DIGEST_H
#define APIR_TREE_DIGEST_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define APIR_TREE_LEAF (4u << 20)
/* More threads than this buys nothing: memory bandwidth and the device's
 * upload are the limit past it, and the process shares its cores. */
#define APIR_HASH_THREADS_MAX 8u

/* SHA-256 over n parts, in order, into out; false when it fails. */
typedef bool (*apir_sha256_parts_fn)(const void *const *parts, const size_t *lens, int n, uint8_t out[32]);

/* Hashing threads: APIR_HASH_THREADS (1..64) or min(online cores, 8). */
static inline unsigned apir_hash_threads(void)
{
    const char *v = getenv("APIR_HASH_THREADS");
    char *end = NULL;
    unsigned long n = v && *v ? strtoul(v, &end, 10) : 0;
    if (v && *v && end && !*end && n >= 1 && n <= 64)
        return (unsigned)n;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1u : cores > (long)APIR_HASH_THREADS_MAX ? APIR_HASH_THREADS_MAX : (unsigned)cores;
}

static inline void apir_tree_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One digest's work, shared by its threads: leaves are taken in order from
 * `next`, each read from mem or src_fd (pread: a descriptor's offset is left
 * alone, and threads do not share one), hashed, and, with dst_fd, written
 * there at its offset: exactly the bytes hashed. */
struct apir_tree_job {
    apir_sha256_parts_fn sha;
    const uint8_t *mem;
    int src_fd, dst_fd;
    uint64_t size, leaves;
    uint8_t (*digest)[32];
    _Atomic uint64_t next;
    _Atomic bool failed;
};

static inline bool apir_tree_io(int fd, uint8_t *p, size_t n, uint64_t off, bool write)
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

static inline void *apir_tree_worker(void *arg)
{
    struct apir_tree_job *j = arg;
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
        apir_tree_le64(hdr + 1, i);
        apir_tree_le64(hdr + 9, len);
        const void *parts[2] = { hdr, p };
        const size_t lens[2] = { sizeof(hdr), len };
        if ((!j->mem && !apir_tree_io(j->src_fd, buf, len, off, false)) || !j->sha(parts, lens, 2, j->digest[i]) ||
            (j->dst_fd >= 0 && !apir_tree_io(j->dst_fd, (uint8_t *)p, len, off, true)))
            atomic_store(&j->failed, true);
    }
    free(buf);
    return NULL;
}

/* The tree digest of size bytes at mem, or (mem NULL) of src_fd's first
 * size bytes, copied to dst_fd when it is not -1; with up to `threads`
 * threads, the caller's one of them (one leaf: no thread is started).
 * Memory: the leaf digests (32 bytes a leaf) and, from a descriptor, one
 * leaf's buffer a thread.  False on I/O failure, a short source, no memory. */
static inline bool apir_tree_digest(apir_sha256_parts_fn sha, const void *mem, int src_fd, int dst_fd, uint64_t size,
                                    unsigned threads, uint8_t out[32])
{
    const uint64_t leaves = size / APIR_TREE_LEAF + (size % APIR_TREE_LEAF != 0);
    if (leaves > SIZE_MAX / 32)
        return false;
    struct apir_tree_job j = { .sha = sha, .mem = mem, .src_fd = src_fd, .dst_fd = dst_fd, .size = size, .leaves = leaves };
    j.digest = malloc(leaves ? (size_t)leaves * 32 : 1);
    if (!j.digest)
        return false;
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, false);
    if (threads > APIR_HASH_THREADS_MAX * 8)
        threads = APIR_HASH_THREADS_MAX * 8;
    if ((uint64_t)threads > leaves)
        threads = leaves ? (unsigned)leaves : 1u;
    pthread_t tid[APIR_HASH_THREADS_MAX * 8];
    unsigned started = 0;
    for (; started + 1 < threads; started++)
        if (pthread_create(&tid[started], NULL, apir_tree_worker, &j) != 0)
            break;  /* fewer threads: slower, not wrong */
    apir_tree_worker(&j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    bool ok = !atomic_load(&j.failed);
    if (ok) {
        uint8_t hdr[17] = { 0x01 };
        apir_tree_le64(hdr + 1, size);
        apir_tree_le64(hdr + 9, APIR_TREE_LEAF);
        const void *parts[2] = { hdr, j.digest };
        const size_t lens[2] = { sizeof(hdr), (size_t)leaves * 32 };
        ok = sha(parts, lens, 2, out);
    }
    free(j.digest);
    return ok;
}

#endif
