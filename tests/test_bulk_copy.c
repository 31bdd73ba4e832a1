/*
 * guest/bulk_copy.c: copies spread over threads land byte for byte where a
 * memcpy would put them - sizes around the threshold and the part
 * boundaries, unaligned ends, two callers at once (the second copies
 * alone), and a forked child (which has none of the parent's threads).
 * Run with APIR_COPY_THREADS=4 (CMake sets it) so the pool is used even on
 * a 2-core machine.
 */
#include "bulk_copy.h"
#include "test_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)24 << 20)

static uint8_t *src_buf, *dst_buf;

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

/* One copy of n bytes at offsets so and doff; true when exactly those bytes
 * changed, to the source's. */
static bool copy_ok(size_t so, size_t doff, size_t n, uint8_t guard)
{
    memset(dst_buf, guard, MAX_BYTES + 64);
    apir_bulk_copy(dst_buf + doff, src_buf + so, n);
    if (memcmp(dst_buf + doff, src_buf + so, n) != 0)
        return false;
    for (size_t i = 0; i < doff; i++)
        if (dst_buf[i] != guard)
            return false;
    for (size_t i = doff + n; i < MAX_BYTES + 64; i++)
        if (dst_buf[i] != guard)
            return false;
    return true;
}

static void test_sizes(void)
{
    const size_t sizes[] = { 0, 1, APIR_BULK_MIN - 1, APIR_BULK_MIN, APIR_BULK_MIN + 1, APIR_BULK_MIN + 4095,
                             (size_t)5 << 20, ((size_t)16 << 20) + 3, MAX_BYTES - 64 };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        CHECK_MSG(copy_ok(0, 0, sizes[i], 0xA5), "%zu bytes, aligned", sizes[i]);
        CHECK_MSG(copy_ok(7, 13, sizes[i], 0x5A), "%zu bytes, unaligned", sizes[i]);
    }
}

struct racer {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
    int rounds;
    bool ok;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    r->ok = true;
    for (int i = 0; i < r->rounds; i++) {
        memset(r->dst, 0, r->n);
        apir_bulk_copy(r->dst, r->src, r->n);
        if (memcmp(r->dst, r->src, r->n) != 0)
            r->ok = false;
    }
    return NULL;
}

static void test_two_callers(void)
{
    const size_t n = (size_t)9 << 20;
    uint8_t *other = malloc(n);
    CHECK(other != NULL);
    if (!other)
        return;
    struct racer a = { dst_buf, src_buf, n, 20, false }, b = { other, src_buf + 3, n, 20, false };
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, race, &a) == 0);
    CHECK(pthread_create(&tb, NULL, race, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.ok);
    CHECK(b.ok);
    free(other);
}

static void test_fork(void)
{
    apir_bulk_copy(dst_buf, src_buf, (size_t)8 << 20);  /* the parent's pool exists */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(copy_ok(1, 0, (size_t)10 << 20, 0x11) ? 0 : 1);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}

int main(void)
{
    src_buf = malloc(MAX_BYTES + 64);
    dst_buf = malloc(MAX_BYTES + 64);
    if (!src_buf || !dst_buf)
        return 1;
    fill(src_buf, MAX_BYTES + 64, 7);
    static const struct test_case cases[] = { TEST(test_sizes), TEST(test_two_callers), TEST(test_fork) };
    int rc = test_run("bulk_copy", cases, (int)(sizeof(cases) / sizeof(cases[0])));
    free(src_buf);
    free(dst_buf);
    return rc;
}
