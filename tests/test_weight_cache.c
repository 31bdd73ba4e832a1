/*
 * The weight cache (apir 0.4, host/weight_cache.h): BUFFER_SET_TENSOR_HASH
 * and BUFFER_CACHE_TENSOR through apir_session_forward, in-process, on the
 * real CPU backend, as tests/test_dispatch.c drives the other handlers; the
 * directory's rules (exact size, hashed on read, only bytes the host hashed
 * itself are stored, LRU bound, a directory others can write refused); and
 * the daemon's service, which process isolation uses, over a real
 * socketpair.
 */
#include "apir_commands.h"
#include "apir_proto.h"
#include "host.h"
#include "session.h"
#include "test_records.h"
#include "test_session.h"
#include "test_util.h"
#include "weight_cache.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

static struct apir_session *new_session(void)
{
    struct apir_session *s = apir_session_new(&host, "wc");
    s->minor = APIR_VERSION_MINOR;
    apir_session_blob_add(s, DATA_RES, data_blob, DATA_SIZE, NULL, NULL);
    return s;
}

/* W_BYTES of a pattern numbered seed. */
static void fill(uint8_t *p, uint32_t seed)
{
    for (uint32_t i = 0; i < W_BYTES; i++)
        p[i] = (uint8_t)(i * 7u + seed * 13u + (i >> 9));
}

static struct apir_digest hash_of(uint32_t seed)
{
    static uint8_t tmp[W_BYTES];
    fill(tmp, seed);
    struct apir_digest d;
    CHECK(apir_sha256(tmp, W_BYTES, &d));
    return d;
}

static void entry_path(const struct apir_digest *h, char *path, size_t len)
{
    char hex[65];
    apir_digest_hex(h, hex);
    snprintf(path, len, "%s/%s", dir, hex);
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
    /* The session that read it wrong replaces it with its upload. */
    struct apir_session *s = new_session();
    uint64_t buf = alloc_buffer(s, W_BYTES);
    struct apir_tensor_rec t = f32_rec(1, buf, 0, N_FLOATS);
    uint32_t answer = 99;
    CHECK(fwd_BUFFER_SET_TENSOR_HASH(s, buf, &t, 0, W_BYTES, &h, &answer) == APIR_HANDLER_OK &&
          answer == APIR_WCACHE_MISS);
    CHECK(s->wcache_bad_set && !memcmp(&s->wcache_bad, &h, sizeof(h)));
    fill(data_blob, 5);
    CHECK(fwd_BUFFER_SET_TENSOR(s, buf, &t, DATA_RES, 0, W_BYTES) == APIR_HANDLER_OK);
    CHECK(fwd_BUFFER_CACHE_TENSOR(s, buf, &t, &h, &answer) == APIR_HANDLER_OK && answer == APIR_WCACHE_DONE);
    apir_session_free(s);
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
    CHECK(apir_wcache_store_fd(tiny, &h23, W_BYTES, fd, false) == APIR_WCACHE_TOO_LARGE);
    close(fd);
    /* A sparse source (a worker can seek and write one byte) is refused
     * before a byte is read: the hash would be of zeros it never held. */
    fd = memfd_create("sparse", 0);
    CHECK(lseek(fd, W_BYTES - 1, SEEK_SET) == W_BYTES - 1 && write(fd, "", 1) == 1);
    static const uint8_t zeros[W_BYTES];
    struct apir_digest hz;
    CHECK(apir_sha256(zeros, W_BYTES, &hz));
    CHECK(apir_wcache_store_fd(c, &hz, W_BYTES, fd, false) == APIR_WCACHE_FAILED);
    char hex[65], zpath[160];
    apir_digest_hex(&hz, hex);
    snprintf(zpath, sizeof(zpath), "%s/%s", d2, hex);
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
    CHECK(apir_wcache_link_store(hostile, &h32, W_BYTES, pp[0], false) == APIR_WCACHE_FAILED);
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

static void cleanup(void)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN("weight_cache",
          TEST(setup),
          TEST(test_sha256),
          TEST(test_no_cache),
          TEST(test_miss_keep_hit),
          TEST(test_wrong_hash_not_stored),
          TEST(test_bad_entries),
          TEST(test_sizes_and_ranges),
          TEST(test_bound),
          TEST(test_directory_rules),
          TEST(test_service),
          TEST(cleanup))
