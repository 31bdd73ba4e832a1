/*
 * The weight cache (apir 0.4, opt-in: apir-host --weight-cache DIR): weights
 * kept on the host by content hash, so that a guest loading a model the host
 * has seen sends each large weight's SHA-256 instead of its bytes
 * (BUFFER_SET_TENSOR_HASH), like ggml-rpc's `rpc-server -c`, but safe
 * against hostile guests:
 *
 *   - an entry is only ever written by the host from bytes it hashed itself:
 *     after a miss the guest uploads the weight as usual and sends
 *     BUFFER_CACHE_TENSOR; the host reads the tensor back, hashes it and
 *     keeps it only when that hash is the one the guest named.  A guest
 *     cannot make the cache hold bytes under a hash they do not have.
 *   - an entry is never trusted when read: it must be a regular file of
 *     exactly the size asked, and the directory's owner hashes it before it
 *     hands out its descriptor (a truncated, foreign or corrupted file is a
 *     miss, and the guest's next CACHE_TENSOR replaces it).  An entry this
 *     process hashed (stored or checked) is not hashed again while its file
 *     keeps the identity it had then (device, inode, size, modification and
 *     change times): what that trusts is in docs/SECURITY.md.
 *   - the digest (apir_tree_digest.h): from apir 0.5 the tree digest, whose
 *     4 MiB leaves a few threads hash at once (APIR_HASH_THREADS, default
 *     min(cores, 8)), on both sides; a 0.4 guest names weights by plain
 *     SHA-256 (serial).  The kind is in the entry's name ("t-" before the
 *     hex for the tree), so digests of different kinds are never compared:
 *     an old guest keeps working with its own entries.
 *   - a store is checked (size, a sparse source, room) when asked and then
 *     hashed and written by the cache's store thread while the session goes
 *     on (the guest's next upload overlaps it), at most
 *     APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB (512) waiting: memory stays
 *     bounded, and past it the caller waits.  The answer "kept" then means
 *     "will be, if the bytes hash to that name".
 *   - files are named by the hex hash, written to a temporary name (0600)
 *     and renamed; the directory must be the host's own (0700, not writable
 *     by others).  --weight-cache-max-gib bounds it: the least recently
 *     used entries (a hit refreshes an entry's time) are evicted to make
 *     room; an entry larger than the bound is refused.
 *
 * Who touches the directory: with --isolation thread every session uses it
 * directly (a link of kind "local").  A sandboxed worker cannot open files
 * (host/server/sandbox.c), so with process isolation the daemon owns the cache and
 * serves it from a thread of its own (never the accept loop): each worker
 * gets, at spawn, one end of a socketpair (--weight-cache-fd), asks "have
 * you HASH of SIZE bytes?" and receives the entry's read-only descriptor
 * (the daemon hashed it), and to store sends a memfd holding the tensor's
 * bytes, which the daemon hashes again while it copies them into the file.
 * Workers never hash: the hashing threads are the daemon's.  The daemon parses only
 * fixed-size requests from workers (struct in weight_cache.c).
 *
 * Privacy: a hit tells a guest that some guest uploaded those bytes
 * (docs/SECURITY.md).  Operators serving mutually distrusting tenants leave
 * the cache off or run one host (one directory) per tenant.
 */
#ifndef APIR_WEIGHT_CACHE_H
#define APIR_WEIGHT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apir_codec.h"

struct apir_session;
struct apir_host_buffer;
struct ggml_tensor;

/* SHA-256 through GnuTLS.  False when GnuTLS fails. */
bool apir_sha256(const void *data, size_t size, struct apir_digest *out);

/* What a digest is (never compared across kinds). */
enum apir_digest_kind {
    APIR_DIGEST_SHA256 = 0,     /* plain SHA-256: apir 0.4 guests */
    APIR_DIGEST_TREE = 1,       /* the tree digest (apir_tree_digest.h): 0.5 */
};
/* The kind a session of that protocol minor names weights by. */
uint32_t apir_wcache_kind_of(uint32_t minor);
/* The digest of kind of size bytes at data, the tree's leaves on up to
 * `threads` threads.  False when hashing fails or kind is unknown. */
bool apir_wcache_digest(uint32_t kind, const void *data, uint64_t size, unsigned threads, struct apir_digest *out);
/* 64 lowercase hex digits and a NUL. */
void apir_digest_hex(const struct apir_digest *d, char hex[65]);

/* ---- the directory (the daemon, or a thread-mode host) -------------------- */

struct apir_wcache;

struct apir_wcache_counters {
    uint64_t entries, bytes;          /* what the directory holds now */
    uint64_t lookups, hits;           /* lookups answered with a descriptor */
    uint64_t checked;                 /* lookups that hashed the entry (not remembered as hashed) */
    uint64_t stored, refused;         /* stores kept / refused (wrong hash, too large, I/O) */
    uint64_t evicted;                 /* entries removed to make room */
};

/* Opens (creating it 0700 if missing) the cache directory; max_bytes 0: no
 * bound.  NULL with a reason in err. */
struct apir_wcache *apir_wcache_open(const char *dir, uint64_t max_bytes, char *err, size_t err_len);
void apir_wcache_close(struct apir_wcache *c);
void apir_wcache_counters(struct apir_wcache *c, struct apir_wcache_counters *out);
/* Waits until no store is queued or being written. */
void apir_wcache_flush(struct apir_wcache *c);

/* A read-only descriptor of the entry for (kind, hash, size), at offset 0,
 * whose bytes hash to h (hashed here unless this process did so while the
 * file was as it is now), or -1: none, not a regular file of exactly size
 * bytes, or (*bad set) bytes that hash otherwise. */
int apir_wcache_lookup(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, bool *bad);

enum apir_wcache_store {
    APIR_WCACHE_STORED = 0,     /* written */
    APIR_WCACHE_PRESENT = 1,    /* an entry of that hash and size is there already */
    APIR_WCACHE_MISMATCH = 2,   /* the bytes do not have that hash: nothing written */
    APIR_WCACHE_TOO_LARGE = 3,  /* larger than --weight-cache-max-gib */
    APIR_WCACHE_FAILED = 4,     /* I/O, a short source, no memory */
    APIR_WCACHE_QUEUED = 5,     /* checked, and queued for the store thread, which hashes and writes it */
};
/* Stores the first size bytes of src_fd (read with pread: the caller's
 * file offset is left alone) under h, hashing exactly the bytes it writes.
 * replace: write even when an entry of that size is there (it read back
 * wrong).  The hashing and writing are done by the cache's store thread
 * while the caller goes on (APIR_WCACHE_QUEUED; it holds its own
 * descriptor of src_fd), at most APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB
 * (default 512) waiting: past it the caller waits.  With 0, or no thread,
 * it is written before the return.  Returns an apir_wcache_store. */
int apir_wcache_store_fd(struct apir_wcache *c, uint32_t kind, const struct apir_digest *h, uint64_t size, int src_fd,
                         bool replace);

/* ---- how a session reaches a cache ----------------------------------------- */

struct apir_wcache_link;

/* The cache itself (thread isolation, tests). */
struct apir_wcache_link *apir_wcache_link_local(struct apir_wcache *c);
/* The daemon's cache through a worker's socket (--weight-cache-fd). */
struct apir_wcache_link *apir_wcache_link_remote(int fd);
void apir_wcache_link_free(struct apir_wcache_link *l);
int apir_wcache_link_lookup(struct apir_wcache_link *l, uint32_t kind, const struct apir_digest *h, uint64_t size,
                            bool *bad);
/* A store (apir_wcache_keep): the caller writes the bytes into the memfd
 * stage gives - this process's (local), or the daemon's (remote: a worker
 * never passes a descriptor out, sandbox.c) - then store stores them:
 * stage_fd itself (local), the daemon's descriptor of it (remote).  stage
 * returns -1 when there is none. */
int apir_wcache_link_stage(struct apir_wcache_link *l);
int apir_wcache_link_store(struct apir_wcache_link *l, uint32_t kind, const struct apir_digest *h, uint64_t size,
                           int stage_fd, bool replace);

/* ---- the daemon's service (process isolation) ------------------------------- */

/* Starts the thread that serves c to workers.  False with a reason. */
bool apir_wcache_service_start(struct apir_wcache *c, char *err, size_t err_len);
/* A new worker's end of a socketpair to the service (close-on-exec set),
 * or -1 when no service runs (or it cannot take one more): the worker then
 * runs without a cache.  Never blocks. */
int apir_wcache_service_connect(void);

/* ---- the handlers' side (dispatch.c) ----------------------------------------- */

/* BUFFER_SET_TENSOR_HASH once its items are checked: fills [offset,
 * offset + size) of t from the cache entry (h, size) of the session's
 * digest kind (its minor), which the lookup hashed.  Returns an
 * apir_weight_cache_answer. */
uint32_t apir_wcache_fill(struct apir_session *s, struct apir_host_buffer *hb, struct ggml_tensor *t, uint64_t offset,
                          uint64_t size, const struct apir_digest *h);
/* BUFFER_CACHE_TENSOR: reads t back and stores it under h if it hashes to
 * h (the session's digest kind).  Returns an apir_weight_cache_answer. */
uint32_t apir_wcache_keep(struct apir_session *s, struct ggml_tensor *t, const struct apir_digest *h);
/* The session's line at its end (info), when it used the cache. */
void apir_wcache_log_session(const struct apir_session *s);

#endif
