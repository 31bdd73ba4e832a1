/*
 * The weight cache (apir 0.4, host/data/weight_cache.h): BUFFER_SET_TENSOR_HASH
 * and BUFFER_CACHE_TENSOR through apir_session_forward, in-process, on the
 * real CPU backend, as tests/test_dispatch.c drives the other handlers; the
 * directory's rules (exact size, hashed on read, only bytes the host hashed
 * itself are stored, LRU bound, a directory others can write refused); and
 * the daemon's service, which process isolation uses, over a real
 * socketpair.  The tree digest (apir 0.5, apir_tree_digest.h) against a
 * reference built here from plain SHA-256 calls, on 1 and several threads;
 * a 0.4 session's plain SHA-256 kept apart from it; entries hashed once per
 * process while their file is unchanged.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "host.h"
#include "dispatcher.h"
#include "test_records.h"
#include "test_session.h"
#include "test_util.h"
#include "weight_cache.h"
#include "apir_tree_digest.h"

#include <fcntl.h>
#include <gnutls/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DATA_RES 10u
#define DATA_SIZE (1u << 20)
#define N_FLOATS 16384u           /* a 64 KiB weight */
#define W_BYTES (N_FLOATS * 4u)

static struct apir_host host;
static uint8_t data_blob[DATA_SIZE] __attribute__((aligned(64)));
static char dir[64];
static struct apir_wcache *cache;
static struct apir_wcache_link *local_link;
/* The protocol minor of the sessions the helpers make: 4 names weights by
 * plain SHA-256, 5 by the tree digest. */
static uint32_t session_minor = APIR_VERSION_MINOR;

static struct apir_session *new_session(void)
{
    struct apir_session *s = apir_session_new(&host, "wc");
    s->minor = session_minor;
    apir_session_blob_add(s, DATA_RES, data_blob, DATA_SIZE, NULL, NULL);
    return s;
}

/* W_BYTES of a pattern numbered seed. */
static void fill(uint8_t *p, uint32_t seed)
{
    for (uint32_t i = 0; i < W_BYTES; i++)
        p[i] = (uint8_t)(i * 7u + seed * 13u + (i >> 9));
}

/* The digest of weight `seed`, of the kind the helpers' sessions use. */
static struct apir_digest hash_of(uint32_t seed)
{
    static uint8_t tmp[W_BYTES];
    fill(tmp, seed);
    struct apir_digest d;
    CHECK(apir_wcache_digest(apir_wcache_kind_of(session_minor), tmp, W_BYTES, 2, &d));
    return d;
}

static void entry_path_in(const char *d, uint32_t kind, const struct apir_digest *h, char *path, size_t len)
{
    char hex[65];
    apir_digest_hex(h, hex);
    snprintf(path, len, "%s/%s%s", d, kind == APIR_DIGEST_TREE ? "t-" : "", hex);
}

static void entry_path(const struct apir_digest *h, char *path, size_t len)
{
    entry_path_in(dir, apir_wcache_kind_of(session_minor), h, path, len);
}

static bool entry_exists(const struct apir_digest *h, off_t *size, mode_t *mode)
{
    char path[160];
    entry_path(h, path, sizeof(path));
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    if (size)
        *size = st.st_size;
    if (mode)
        *mode = st.st_mode & 07777;
    return true;
}

/* A session uploads weight `seed` the plain way and asks the host to keep
 * it under `claimed`; returns the answer. */
static uint32_t upload_and_keep(uint32_t seed, const struct apir_digest *claimed)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    fill(data_blob, seed);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, W_BYTES) == APIR_HANDLER_OK);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, buf, &t, claimed, &answer) == APIR_HANDLER_OK);
    apir_session_free(s);
    return answer;
}

/* A fresh session asks for weight (h, size) and, on a hit, reads it back
 * into data_blob; returns the answer. */
static uint32_t ask(const struct apir_digest *h, uint64_t size, uint64_t *hits)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 0, size, h, &answer) == APIR_HANDLER_OK);
    memset(data_blob, 0, W_BYTES);
    if (answer == APIR_WCACHE_DONE)
        CHECK(fwd_BUFFER_GET_TENSOR(s, buf, &t, DATA_RES, 0, W_BYTES) == APIR_HANDLER_OK);
    if (hits)
        *hits = s->stats.wcache_hits;
    apir_session_free(s);
    return answer;
}

static void setup(void)
{
    CHECK(test_host_init_cpu(&host));
    snprintf(dir, sizeof(dir), "/tmp/apir-wcache-test-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    char err[256] = "";
    /* Stores written before they are answered, so that each check sees
     * them at once; test_store_thread has the thread. */
    setenv("APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB", "0", 1);
    cache = apir_wcache_open(dir, 0, err, sizeof(err));
    CHECK_MSG(cache != NULL, "open: %s", err);
    local_link = apir_wcache_link_local(cache);
    host.weight_cache = local_link;
}

static void test_sha256(void)
{
    /* FIPS 180-2's "abc". */
    static const uint8_t abc[32] = { 0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                     0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                     0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad };
    struct apir_digest d;
    CHECK(apir_sha256("abc", 3, &d) && memcmp(d.b, abc, 32) == 0);
    char hex[65];
    apir_digest_hex(&d, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
}

/* A host without a cache says so to both commands, whatever they name. */
static void test_no_cache(void)
{
    host.weight_cache = NULL;
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    struct apir_digest h = hash_of(1);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 0, W_BYTES, &h, &answer) == APIR_HANDLER_OK &&
          answer == APIR_WCACHE_NONE);
    answer = 99;
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, buf, &t, &h, &answer) == APIR_HANDLER_OK && answer == APIR_WCACHE_NONE);
    /* A 0.3 session cannot send them at all (the guest checks the minor). */
    s->minor = 3;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 0, W_BYTES, &h, &answer) == APIR_HANDLER_INVALID_INDEX);
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, buf, &t, &h, &answer) == APIR_HANDLER_INVALID_INDEX);
    apir_session_free(s);
    host.weight_cache = local_link;
}

/* Miss, upload and keep, then a hit in another session with the bytes. */
static void test_miss_keep_hit(void)
{
    struct apir_digest h = hash_of(2);
    uint64_t hits = 9;
    CHECK(ask(&h, W_BYTES, &hits) == APIR_WCACHE_MISS && hits == 0);
    CHECK(!entry_exists(&h, NULL, NULL));
    CHECK(upload_and_keep(2, &h) == APIR_WCACHE_DONE);
    off_t size = 0;
    mode_t mode = 0;
    CHECK(entry_exists(&h, &size, &mode) && size == W_BYTES && mode == 0600);
    CHECK(ask(&h, W_BYTES, &hits) == APIR_WCACHE_DONE && hits == 1);
    static uint8_t want[W_BYTES];
    fill(want, 2);
    CHECK(memcmp(data_blob, want, W_BYTES) == 0);
    /* Keeping it again is no error, and writes nothing new. */
    CHECK(upload_and_keep(2, &h) == APIR_WCACHE_DONE);
    struct apir_wcache_counters n;
    apir_wcache_counters(cache, &n);
    CHECK(n.stored == 1 && n.entries >= 1);
}

/* A guest claiming a hash its bytes do not have stores nothing: no
 * poisoning.  The real hash of the same bytes is not stored either. */
static void test_wrong_hash_not_stored(void)
{
    struct apir_digest claimed = hash_of(4), real = hash_of(3);
    struct apir_wcache_counters before, after;
    apir_wcache_counters(cache, &before);
    CHECK(upload_and_keep(3, &claimed) == APIR_WCACHE_MISS);
    CHECK(!entry_exists(&claimed, NULL, NULL) && !entry_exists(&real, NULL, NULL));
    CHECK(ask(&claimed, W_BYTES, NULL) == APIR_WCACHE_MISS);
    apir_wcache_counters(cache, &after);
    CHECK(after.refused == before.refused + 1 && after.stored == before.stored);
    /* No temporary file is left behind. */
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "ls -A %s | grep -q '^\\.tmp-'", dir);
    CHECK(system(cmd) != 0);
}

/* A session asks for weight `seed` under h, whose entry holds other bytes:
 * a miss that marks it; the session uploads and keeps it, which replaces
 * the entry. */
static void read_wrong_then_repair(uint32_t seed, const struct apir_digest *h)
{
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 0, W_BYTES, h, &answer) == APIR_HANDLER_OK &&
          answer == APIR_WCACHE_MISS);
    CHECK(s->wcache_bad_set && !memcmp(&s->wcache_bad, h, sizeof(*h)));
    fill(data_blob, seed);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, W_BYTES) == APIR_HANDLER_OK);
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, buf, &t, h, &answer) == APIR_HANDLER_OK && answer == APIR_WCACHE_DONE);
    apir_session_free(s);
}

/* Entries are never trusted: truncated, or the right size with other
 * bytes, is a miss; the guest's next keep replaces the bad entry. */
static void test_bad_entries(void)
{
    struct apir_digest h = hash_of(5);
    CHECK(upload_and_keep(5, &h) == APIR_WCACHE_DONE);
    char path[160];
    entry_path(&h, path, sizeof(path));
    CHECK(truncate(path, W_BYTES - 1) == 0);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_MISS);

    /* Same size, one byte changed. */
    CHECK(truncate(path, W_BYTES) == 0);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    static uint8_t bytes[W_BYTES];
    fill(bytes, 5);
    bytes[W_BYTES / 2] ^= 0x40;
    CHECK(pwrite(fd, bytes, W_BYTES, 0) == (ssize_t)W_BYTES);
    close(fd);
    read_wrong_then_repair(5, &h);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    fill(bytes, 5);
    CHECK(memcmp(data_blob, bytes, W_BYTES) == 0);

    /* A foreign file under an entry's name (not a regular file): a miss. */
    struct apir_digest h9 = hash_of(9);
    entry_path(&h9, path, sizeof(path));
    CHECK(mkdir(path, 0700) == 0);
    CHECK(ask(&h9, W_BYTES, NULL) == APIR_WCACHE_MISS);
    rmdir(path);
}

/* The size asked must be the entry's; ranges are checked like SET_TENSOR's. */
static void test_sizes_and_ranges(void)
{
    struct apir_digest h = hash_of(2);  /* kept by test_miss_keep_hit */
    CHECK(ask(&h, W_BYTES / 2, NULL) == APIR_WCACHE_MISS);
    CHECK(ask(&h, 0, NULL) == APIR_WCACHE_MISS);
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES), other = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 4, W_BYTES, &h, &answer) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, UINT64_MAX, 8, &h, &answer) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, other, &t, 0, W_BYTES, &h, &answer) == APIR_HANDLER_BAD_REQUEST);
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, other, &t, &h, &answer) == APIR_HANDLER_BAD_REQUEST);
    uint64_t gone = alloc_buffer(s, W_BYTES);
    CHECK(fwd_BUFFER_FREE_BUFFER(s, gone) == APIR_HANDLER_OK);
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, gone, &t, 0, W_BYTES, &h, &answer) == APIR_HANDLER_BAD_HANDLE);
    /* A truncated request is malformed. */
    struct apir_encoder enc;
    uint8_t req[1024];
    apir_encoder_init(&enc, req, sizeof(req));
    apir_encode_request_BUFFER_SET_TENSOR_HASH(&enc, buf, &t, 0, W_BYTES, &h);
    struct apir_decoder rep;
    CHECK(fwd_raw(s, APIR_CMD_BUFFER_SET_TENSOR_HASH, req, apir_encoder_used(&enc) - 4, &rep) ==
          APIR_HANDLER_BAD_REQUEST);
    apir_session_free(s);
}

/* --weight-cache-max-gib: least recently used entries go; an entry larger
 * than the bound is refused. */
static void test_bound(void)
{
    char d2[64];
    snprintf(d2, sizeof(d2), "/tmp/apir-wcache-bound-XXXXXX");
    CHECK(mkdtemp(d2) != NULL);
    char err[256];
    struct apir_wcache *c = apir_wcache_open(d2, 2 * W_BYTES + W_BYTES / 2, err, sizeof(err));
    CHECK(c != NULL);
    struct apir_wcache_link *l = apir_wcache_link_local(c);
    host.weight_cache = l;
    struct apir_digest a = hash_of(20), b = hash_of(21), cc = hash_of(22);
    CHECK(upload_and_keep(20, &a) == APIR_WCACHE_DONE);
    usleep(30000);  /* file times are coarse */
    CHECK(upload_and_keep(21, &b) == APIR_WCACHE_DONE);
    usleep(30000);
    CHECK(ask(&a, W_BYTES, NULL) == APIR_WCACHE_DONE);  /* a used: b is now the oldest */
    usleep(30000);
    CHECK(upload_and_keep(22, &cc) == APIR_WCACHE_DONE);
    CHECK(ask(&a, W_BYTES, NULL) == APIR_WCACHE_DONE);
    CHECK(ask(&cc, W_BYTES, NULL) == APIR_WCACHE_DONE);
    CHECK(ask(&b, W_BYTES, NULL) == APIR_WCACHE_MISS);
    struct apir_wcache_counters n;
    apir_wcache_counters(c, &n);
    CHECK(n.evicted == 1 && n.entries == 2 && n.bytes == 2 * W_BYTES);
    /* Too large for the bound at all. */
    struct apir_wcache *tiny = apir_wcache_open(d2, W_BYTES / 2, err, sizeof(err));
    CHECK(tiny != NULL);
    int fd = memfd_create("t", 0);
    static uint8_t bytes[W_BYTES];
    fill(bytes, 23);
    CHECK(write(fd, bytes, W_BYTES) == (ssize_t)W_BYTES);
    struct apir_digest h23 = hash_of(23);
    CHECK(apir_wcache_store_fd(tiny, APIR_DIGEST_TREE, &h23, W_BYTES, fd, false) == APIR_WCACHE_TOO_LARGE);
    close(fd);
    /* A sparse source (a worker can seek and write one byte) is refused
     * before a byte is read: the hash would be of zeros it never held. */
    fd = memfd_create("sparse", 0);
    CHECK(lseek(fd, W_BYTES - 1, SEEK_SET) == W_BYTES - 1 && write(fd, "", 1) == 1);
    static const uint8_t zeros[W_BYTES];
    struct apir_digest hz;
    CHECK(apir_wcache_digest(APIR_DIGEST_TREE, zeros, W_BYTES, 1, &hz));
    CHECK(apir_wcache_store_fd(c, APIR_DIGEST_TREE, &hz, W_BYTES, fd, false) == APIR_WCACHE_FAILED);
    char zpath[160];
    entry_path_in(d2, APIR_DIGEST_TREE, &hz, zpath, sizeof(zpath));
    CHECK(access(zpath, F_OK) != 0);
    close(fd);
    apir_wcache_close(tiny);
    host.weight_cache = local_link;
    apir_wcache_link_free(l);
    apir_wcache_close(c);
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d2);
    CHECK(system(cmd) == 0);
}

/* A directory someone else may write is refused. */
static void test_directory_rules(void)
{
    char d3[64];
    snprintf(d3, sizeof(d3), "/tmp/apir-wcache-open-XXXXXX");
    CHECK(mkdtemp(d3) != NULL);
    CHECK(chmod(d3, 0777) == 0);
    char err[256] = "";
    CHECK(apir_wcache_open(d3, 0, err, sizeof(err)) == NULL && strstr(err, "writable") != NULL);
    CHECK(chmod(d3, 0700) == 0);
    /* A stale temporary file is removed when the cache opens. */
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s/.tmp-1-1", d3);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    struct apir_wcache *c = apir_wcache_open(d3, 0, err, sizeof(err));
    CHECK(c != NULL && access(tmp, F_OK) != 0);
    apir_wcache_close(c);
    /* A new directory is made 0700. */
    char sub[96];
    snprintf(sub, sizeof(sub), "%s/sub", d3);
    c = apir_wcache_open(sub, 0, err, sizeof(err));
    struct stat st;
    CHECK(c != NULL && stat(sub, &st) == 0 && (st.st_mode & 07777) == 0700);
    apir_wcache_close(c);
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d3);
    CHECK(system(cmd) == 0);
}

/* Process isolation: a worker's session reaches the daemon's cache through
 * the service (a thread here, as in the daemon) over a socketpair. */
static void test_service(void)
{
    CHECK(apir_wcache_service_connect() == -1);  /* no service yet */
    char err[256];
    CHECK(apir_wcache_service_start(cache, err, sizeof(err)));
    int fd = apir_wcache_service_connect();
    CHECK(fd >= 0);
    struct apir_wcache_link *remote = apir_wcache_link_remote(fd);
    host.weight_cache = remote;
    struct apir_digest h = hash_of(30), wrong = hash_of(31);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_MISS);
    CHECK(upload_and_keep(30, &wrong) == APIR_WCACHE_MISS);
    CHECK(!entry_exists(&wrong, NULL, NULL));
    CHECK(upload_and_keep(30, &h) == APIR_WCACHE_DONE);
    CHECK(entry_exists(&h, NULL, NULL));
    uint64_t hits = 0;
    CHECK(ask(&h, W_BYTES, &hits) == APIR_WCACHE_DONE && hits == 1);
    static uint8_t want[W_BYTES];
    fill(want, 30);
    CHECK(memcmp(data_blob, want, W_BYTES) == 0);
    CHECK(ask(&h, W_BYTES - 4, NULL) == APIR_WCACHE_MISS);
    /* A hostile worker: what is not a request of ours is answered -1 (the
     * descriptors it carried closed), and the service goes on. */
    int hfd = apir_wcache_service_connect();
    CHECK(hfd >= 0);
    struct {
        uint32_t seq;
        int32_t result;
    } rp;
    CHECK(send(hfd, "hello", 5, 0) == 5);
    CHECK(recv(hfd, &rp, sizeof(rp), 0) == (ssize_t)sizeof(rp) && rp.result == -1);
    struct {
        uint32_t op, seq;
        uint64_t size;
        struct apir_digest hash;
    } rq = { 2, 7, W_BYTES, h };  /* a store without its memfd */
    CHECK(send(hfd, &rq, sizeof(rq), 0) == (ssize_t)sizeof(rq));
    CHECK(recv(hfd, &rp, sizeof(rp), 0) == (ssize_t)sizeof(rp) && rp.seq == 7 && rp.result == -1);
    rq.op = 99;
    rq.seq = 8;
    CHECK(send(hfd, &rq, sizeof(rq), 0) == (ssize_t)sizeof(rq));
    CHECK(recv(hfd, &rp, sizeof(rp), 0) == (ssize_t)sizeof(rp) && rp.seq == 8 && rp.result == -1);
    /* A store whose "memfd" is a pipe: refused, nothing written. */
    int pp[2];
    CHECK(pipe(pp) == 0);
    struct apir_digest h32 = hash_of(32);
    struct apir_wcache_link *hostile = apir_wcache_link_remote(hfd);
    CHECK(apir_wcache_link_store(hostile, APIR_DIGEST_TREE, &h32, W_BYTES, pp[0], false) == APIR_WCACHE_FAILED);
    CHECK(!entry_exists(&h32, NULL, NULL));
    close(pp[0]);
    close(pp[1]);
    apir_wcache_link_free(hostile);

    /* A second worker, and one that goes away: the service goes on. */
    int fd2 = apir_wcache_service_connect();
    CHECK(fd2 >= 0);
    close(fd2);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    host.weight_cache = local_link;
    apir_wcache_link_free(remote);
}

/* ---- the tree digest and the digest kinds (apir 0.5) ------------------------------ */

/* The tree digest as apir_tree_digest.h defines it, built here from one
 * gnutls_hash_fast call per leaf and one for the root, each over a buffer
 * laid out by hand: not the code under test. */
static void tree_reference(const uint8_t *data, uint64_t size, uint8_t out[32])
{
    const uint64_t leaf = 4u << 20, n = (size + leaf - 1) / leaf;
    uint8_t *in = malloc(17 + leaf), *root = malloc(17 + 32 * n);
    CHECK(in && root);
    if (!in || !root)
        return;
    root[0] = 1;
    for (int b = 0; b < 8; b++) {
        root[1 + b] = (uint8_t)(size >> (8 * b));
        root[9 + b] = (uint8_t)(leaf >> (8 * b));
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t len = size - i * leaf < leaf ? size - i * leaf : leaf;
        in[0] = 0;
        for (int b = 0; b < 8; b++) {
            in[1 + b] = (uint8_t)(i >> (8 * b));
            in[9 + b] = (uint8_t)(len >> (8 * b));
        }
        memcpy(in + 17, data + i * leaf, len);
        CHECK(gnutls_hash_fast(GNUTLS_DIG_SHA256, in, 17 + len, root + 17 + 32 * i) == 0);
    }
    CHECK(gnutls_hash_fast(GNUTLS_DIG_SHA256, root, 17 + 32 * n, out) == 0);
    free(in);
    free(root);
}

static bool test_sha_parts(const void *const *parts, const size_t *lens, int n, uint8_t out[32])
{
    gnutls_hash_hd_t hh;
    if (gnutls_hash_init(&hh, GNUTLS_DIG_SHA256) != 0)
        return false;
    for (int i = 0; i < n; i++)
        gnutls_hash(hh, parts[i], lens[i]);
    gnutls_hash_deinit(hh, out);
    return true;
}

/* Boundary sizes around the 4 MiB leaf, 1 and several threads, from
 * memory and from a descriptor (with its copy): all the reference. */
static void test_tree_digest(void)
{
    const uint64_t leaf = APIR_TREE_LEAF;
    CHECK(leaf == (4u << 20));
    const uint64_t sizes[] = { 0, 1, leaf - 1, leaf, leaf + 1, 3 * leaf + 12345 };
    const uint64_t max = 3 * leaf + 12345;
    uint8_t *data = malloc(max), *back = malloc(max);
    CHECK(data && back);
    if (!data || !back)
        return;
    for (uint64_t i = 0; i < max; i++)
        data[i] = (uint8_t)(i * 131u + (i >> 13));
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        const uint64_t n = sizes[k];
        uint8_t want[32];
        tree_reference(data, n, want);
        const unsigned threads[] = { 1, 2, 3, 8 };
        for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
            struct apir_digest d;
            CHECK_MSG(apir_wcache_digest(APIR_DIGEST_TREE, data, n, threads[t], &d) && !memcmp(d.b, want, 32),
                      "tree digest of %llu bytes on %u threads", (unsigned long long)n, threads[t]);
        }
        /* From a descriptor, copied to another: the same digest, the same bytes. */
        int src = memfd_create("src", 0), dst = memfd_create("dst", 0);
        CHECK(src >= 0 && dst >= 0 && write(src, data, n) == (ssize_t)n);
        uint8_t got[32];
        CHECK(apir_tree_digest(test_sha_parts, NULL, src, dst, n, 3, got) && !memcmp(got, want, 32));
        CHECK(pread(dst, back, n, 0) == (ssize_t)n && !memcmp(back, data, n));
        /* A source shorter than asked fails: its missing bytes are not zeros. */
        CHECK(!apir_tree_digest(test_sha_parts, NULL, src, -1, n + 1, 3, got));
        close(src);
        close(dst);
        /* Plain SHA-256 of the same bytes is another value. */
        struct apir_digest plain;
        CHECK(apir_wcache_digest(APIR_DIGEST_SHA256, data, n, 1, &plain) && memcmp(plain.b, want, 32) != 0);
    }
    /* One byte changed anywhere changes the root. */
    uint8_t a[32], b[32];
    tree_reference(data, max, a);
    data[2 * leaf + 7] ^= 1;
    struct apir_digest d;
    CHECK(apir_wcache_digest(APIR_DIGEST_TREE, data, max, 4, &d) && memcmp(d.b, a, 32) != 0);
    tree_reference(data, max, b);
    CHECK(!memcmp(d.b, b, 32));
    CHECK(!apir_wcache_digest(7, data, 16, 1, &d));  /* no such kind */
    CHECK(apir_wcache_kind_of(4) == APIR_DIGEST_SHA256 && apir_wcache_kind_of(5) == APIR_DIGEST_TREE);
    free(data);
    free(back);
}

/* A 0.4 guest names weights by plain SHA-256: it still hits and misses
 * correctly, with entries of its own; a digest is never looked up under the
 * other kind's entry. */
static void test_old_minor(void)
{
    session_minor = 4;
    struct apir_digest sha = hash_of(40);
    session_minor = 5;
    struct apir_digest tree = hash_of(40);
    session_minor = 4;
    CHECK(ask(&sha, W_BYTES, NULL) == APIR_WCACHE_MISS);
    CHECK(upload_and_keep(40, &tree) == APIR_WCACHE_MISS);  /* its bytes' SHA-256 is not that */
    CHECK(upload_and_keep(40, &sha) == APIR_WCACHE_DONE);
    char path[160];
    entry_path_in(dir, APIR_DIGEST_SHA256, &sha, path, sizeof(path));
    CHECK(access(path, F_OK) == 0);
    entry_path_in(dir, APIR_DIGEST_TREE, &sha, path, sizeof(path));
    CHECK(access(path, F_OK) != 0);
    uint64_t hits = 0;
    CHECK(ask(&sha, W_BYTES, &hits) == APIR_WCACHE_DONE && hits == 1);
    static uint8_t want[W_BYTES];
    fill(want, 40);
    CHECK(memcmp(data_blob, want, W_BYTES) == 0);
    /* A 0.5 session: its tree digest misses (no tree entry yet), and the
     * SHA-256 value named as a tree digest is no hit either. */
    session_minor = 5;
    CHECK(ask(&tree, W_BYTES, NULL) == APIR_WCACHE_MISS);
    CHECK(ask(&sha, W_BYTES, NULL) == APIR_WCACHE_MISS);
    CHECK(upload_and_keep(40, &tree) == APIR_WCACHE_DONE);
    CHECK(ask(&tree, W_BYTES, NULL) == APIR_WCACHE_DONE && memcmp(data_blob, want, W_BYTES) == 0);
    /* And the other way: a 0.4 session naming the tree value misses. */
    session_minor = 4;
    CHECK(ask(&tree, W_BYTES, NULL) == APIR_WCACHE_MISS);
    session_minor = APIR_VERSION_MINOR;
}

/* An entry is hashed once per process while its file stays the same: a
 * stored one not at all; a cache opened anew (a new host) hashes it on its
 * first hit only.  A rewrite that changes the file's times is hashed again
 * and caught. */
static void test_verified_once(void)
{
    struct apir_digest h = hash_of(50);
    CHECK(upload_and_keep(50, &h) == APIR_WCACHE_DONE);
    struct apir_wcache_counters a, b;
    apir_wcache_counters(cache, &a);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    apir_wcache_counters(cache, &b);
    CHECK(b.hits == a.hits + 2 && b.checked == a.checked);
    /* A new host over the same directory. */
    char err[256];
    struct apir_wcache *c2 = apir_wcache_open(dir, 0, err, sizeof(err));
    CHECK(c2 != NULL);
    struct apir_wcache_link *l2 = apir_wcache_link_local(c2);
    host.weight_cache = l2;
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    apir_wcache_counters(c2, &a);
    CHECK(a.hits == 2 && a.checked == 1);
    /* One byte changed in place, the size kept, the modification time set
     * elsewhere (as any write does, unless it lands in the same clock tick
     * as the last check: docs/SECURITY.md): hashed again, a miss. */
    char path[160];
    entry_path(&h, path, sizeof(path));
    static uint8_t bytes[W_BYTES];
    fill(bytes, 50);
    bytes[100] ^= 0x10;
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, bytes, W_BYTES, 0) == (ssize_t)W_BYTES);
    const struct timespec times[2] = { { 0, UTIME_OMIT }, { 1000000000, 0 } };
    CHECK(futimens(fd, times) == 0);
    close(fd);
    /* The session that read it wrong repairs it with its keep (the store
     * hashed it: its hits are not hashed again). */
    read_wrong_then_repair(50, &h);
    apir_wcache_counters(c2, &b);
    CHECK(b.checked == 2 && b.hits == 2);
    apir_wcache_counters(c2, &a);
    CHECK(ask(&h, W_BYTES, NULL) == APIR_WCACHE_DONE);
    apir_wcache_counters(c2, &b);
    CHECK(b.checked == a.checked && b.hits == a.hits + 1);
    fill(bytes, 50);
    CHECK(memcmp(data_blob, bytes, W_BYTES) == 0);
    host.weight_cache = local_link;
    apir_wcache_link_free(l2);
    apir_wcache_close(c2);
}

/* Stores by the store thread (the default): answered before they are
 * written, the same checks once written; a close writes what waits. */
static void test_store_thread(void)
{
    char d4[64];
    snprintf(d4, sizeof(d4), "/tmp/apir-wcache-async-XXXXXX");
    CHECK(mkdtemp(d4) != NULL);
    setenv("APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB", "1", 1);  /* 16 of these weights */
    char err[256];
    struct apir_wcache *c = apir_wcache_open(d4, 0, err, sizeof(err));
    CHECK(c != NULL);
    struct apir_wcache_link *l = apir_wcache_link_local(c);
    host.weight_cache = l;
    struct apir_digest h[40];
    for (uint32_t i = 0; i < 40; i++) {
        h[i] = hash_of(60 + i);
        CHECK(upload_and_keep(60 + i, &h[i]) == APIR_WCACHE_DONE);
    }
    struct apir_digest wrong = hash_of(200);
    CHECK(upload_and_keep(201, &wrong) == APIR_WCACHE_DONE);  /* answered before it is hashed... */
    apir_wcache_flush(c);
    struct apir_wcache_counters n;
    apir_wcache_counters(c, &n);
    CHECK(n.stored == 40 && n.refused == 1 && n.entries == 40);  /* ...and not kept */
    char path[160];
    entry_path_in(d4, APIR_DIGEST_TREE, &wrong, path, sizeof(path));
    CHECK(access(path, F_OK) != 0);
    static uint8_t want[W_BYTES];
    for (uint32_t i = 0; i < 40; i += 13) {
        CHECK(ask(&h[i], W_BYTES, NULL) == APIR_WCACHE_DONE);
        fill(want, 60 + i);
        CHECK(memcmp(data_blob, want, W_BYTES) == 0);
    }
    /* Stores still waiting at close are written. */
    struct apir_digest last = hash_of(300);
    CHECK(upload_and_keep(300, &last) == APIR_WCACHE_DONE);
    host.weight_cache = local_link;
    apir_wcache_link_free(l);
    apir_wcache_close(c);
    entry_path_in(d4, APIR_DIGEST_TREE, &last, path, sizeof(path));
    CHECK(access(path, F_OK) == 0);
    setenv("APIR_HOST_WEIGHT_CACHE_BACKLOG_MIB", "0", 1);
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d4);
    CHECK(system(cmd) == 0);
}

static void cleanup(void)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN("weight_cache",
          TEST(setup),
          TEST(test_sha256),
          TEST(test_tree_digest),
          TEST(test_no_cache),
          TEST(test_miss_keep_hit),
          TEST(test_wrong_hash_not_stored),
          TEST(test_bad_entries),
          TEST(test_sizes_and_ranges),
          TEST(test_bound),
          TEST(test_directory_rules),
          TEST(test_old_minor),
          TEST(test_verified_once),
          TEST(test_store_thread),
          TEST(test_service),
          TEST(cleanup))
