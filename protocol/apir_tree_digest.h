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
 * input from the root's.  The guest and the host each reach SHA-256 their
 * own way (the guest loads GnuTLS with dlopen, the host links it): each
 * passes its own apir_sha256_parts_fn.
 */
#ifndef APIR_TREE_DIGEST_H
#define APIR_TREE_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APIR_TREE_LEAF (4u << 20)
/* More threads than this buys nothing by default: memory bandwidth and the
 * device's upload are the limit past it, and the process shares its cores. */
#define APIR_HASH_THREADS_MAX 8u
/* What APIR_HASH_THREADS may ask for at most. */
#define APIR_HASH_THREADS_LIMIT 64u

/* SHA-256 over n parts, in order, into out; false when it fails. */
typedef bool (*apir_sha256_parts_fn)(const void *const *parts, const size_t *lens, int n, uint8_t out[32]);

/* Hashing threads: APIR_HASH_THREADS (1..APIR_HASH_THREADS_LIMIT) or
 * min(online cores, APIR_HASH_THREADS_MAX). */
unsigned apir_hash_threads(void);

/* n bytes between p and fd at offset off (pread/pwrite: the descriptor's own
 * offset is left alone); false on an error or a short source. */
bool apir_tree_io(int fd, uint8_t *p, size_t n, uint64_t off, bool write);

/* The tree digest of size bytes at mem, or (mem NULL) of src_fd's first
 * size bytes, copied to dst_fd when it is not -1; with up to `threads`
 * threads, the caller's one of them (one leaf: no thread is started).
 * Memory: the leaf digests (32 bytes a leaf) and, from a descriptor, one
 * leaf's buffer a thread.  False on I/O failure, a short source, no memory. */
bool apir_tree_digest(apir_sha256_parts_fn sha, const void *mem, int src_fd, int dst_fd, uint64_t size,
                      unsigned threads, uint8_t out[32]);

#endif
