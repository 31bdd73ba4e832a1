/*
 * A socket written by a thread of its own (transport/sender.h), over a
 * socketpair:
 *  - bytes written in pieces of every size, through a ring smaller than
 *    most of them (it wraps, the writer waits for room), arrive whole and
 *    in order;
 *  - small writes while the ring is empty (replies) are sent by the writer
 *    itself, not queued; larger ones, and small ones behind queued bytes,
 *    go through the ring, and everything still arrives in order;
 *  - after a flush every byte is in the kernel: the reader gets them all
 *    without another write;
 *  - a peer that closed fails the writes that follow (EPIPE);
 *  - a peer that reads nothing fails them after the timeout (ETIMEDOUT),
 *    and a stop with bytes still queued for it returns within its second.
 */
#include "sender.h"
#include "test_util.h"
#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOTAL (1u << 20)
#define RING 4099u  /* not a power of two, smaller than most writes */

static uint8_t pattern(uint32_t i) { return (uint8_t)(i * 2654435761u >> 13); }

struct reader {
    int fd;
    uint32_t want;
    _Atomic uint32_t got;
    bool in_order;
};

static void *read_all(void *arg)
{
    struct reader *r = arg;
    uint8_t buf[8192];
    r->in_order = true;
    while (r->got < r->want) {
        struct pollfd p = { .fd = r->fd, .events = POLLIN };
        if (poll(&p, 1, 5000) != 1)
            break;
        ssize_t n = recv(r->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN)
                continue;
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            r->in_order &= buf[i] == pattern(r->got + (uint32_t)i);
        r->got += (uint32_t)n;
    }
    return NULL;
}

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(1);
    }
}

/* A sender on one end of a socketpair, a reader on the other expecting
 * `want` bytes of the pattern, and those bytes to send. */
struct transfer {
    int sv[2];
    uint8_t *src;
    struct apir_sender *s;
    struct reader r;
    pthread_t th;
};

static void transfer_begin(struct transfer *t, uint32_t want)
{
    pair(t->sv);
    t->src = malloc(want);
    for (uint32_t i = 0; i < want; i++)
        t->src[i] = pattern(i);
    t->s = apir_sender_start(t->sv[0], RING, 5000);
    CHECK(t->s != NULL);
    t->r = (struct reader){ .fd = t->sv[1], .want = want };
    pthread_create(&t->th, NULL, read_all, &t->r);
}

static void transfer_end(struct transfer *t)
{
    apir_sender_stop(t->s);
    close(t->sv[0]);
    close(t->sv[1]);
    free(t->src);
}

/* Every size from 1 byte to ~3 ring lengths, as two pieces a write. */
static void whole_and_in_order(void)
{
    struct transfer t;
    transfer_begin(&t, TOTAL);
    struct apir_sender *s = t.s;
    uint8_t *src = t.src;
    uint32_t at = 0, size = 1;
    bool ok = true;
    while (at < TOTAL) {
        uint32_t n = size < TOTAL - at ? size : TOTAL - at, first = n / 3;
        struct iovec iov[2] = { { src + at, first }, { src + at + first, n - first } };
        ok &= apir_sender_write(s, iov, 2) == (ssize_t)n;
        at += n;
        size = size % (3 * RING) + 977;
    }
    CHECK(ok);
    CHECK(apir_sender_flush(s, 5000));
    pthread_join(t.th, NULL);
    printf("in order: %u of %u bytes read, in order %d\n", t.r.got, TOTAL, t.r.in_order);
    CHECK(t.r.got == TOTAL && t.r.in_order);
    transfer_end(&t);
}

/* 200 replies of 100 bytes (header and body), then a download of 64 KiB,
 * then 50 replies more, read as they come. */
static void small_writes_direct(void)
{
    const uint32_t n_small = 200, small = 100, big = 64 * 1024, n_after = 50;
    const uint32_t total = (n_small + n_after) * small + big;
    struct transfer t;
    transfer_begin(&t, total);
    struct apir_sender *s = t.s;
    uint8_t *src = t.src;
    uint32_t at = 0;
    bool ok = true;
    for (uint32_t i = 0; i < n_small; i++, at += small) {
        struct iovec iov[2] = { { src + at, 16 }, { src + at + 16, small - 16 } };
        ok &= apir_sender_write(s, iov, 2) == (ssize_t)small;
        /* Read before the next, as a guest reads a reply before it asks
         * again: the socket always has room. */
        const uint64_t until = apir_now_ns() + 5000000000ull;
        while (atomic_load(&t.r.got) < at + small && apir_now_ns() < until)
            sched_yield();
    }
    const uint64_t direct_before_big = apir_sender_direct_bytes(s);
    struct iovec one = { src + at, big };
    ok &= apir_sender_write(s, &one, 1) == (ssize_t)big;
    at += big;
    const uint64_t direct_after_big = apir_sender_direct_bytes(s);
    for (uint32_t i = 0; i < n_after; i++, at += small) {
        struct iovec iov = { src + at, small };
        ok &= apir_sender_write(s, &iov, 1) == (ssize_t)small;
    }
    CHECK(ok);
    CHECK(apir_sender_flush(s, 5000));
    pthread_join(t.th, NULL);
    printf("direct: %llu bytes of the %u small writes' %u, %llu of the big one's; read %u of %u, in order %d\n",
           (unsigned long long)direct_before_big, n_small, n_small * small,
           (unsigned long long)(direct_after_big - direct_before_big), t.r.got, total, t.r.in_order);
    CHECK(direct_before_big == (uint64_t)n_small * small);
    CHECK(direct_after_big == direct_before_big);
    CHECK(t.r.got == total && t.r.in_order);
    transfer_end(&t);
}

static void peer_closed(void)
{
    int sv[2];
    pair(sv);
    struct apir_sender *s = apir_sender_start(sv[0], RING, 5000);
    close(sv[1]);
    uint8_t chunk[1024] = { 0 };
    struct iovec iov = { chunk, sizeof(chunk) };
    ssize_t r = 0;
    for (int i = 0; i < 1000 && r >= 0; i++)
        r = apir_sender_write(s, &iov, 1);
    printf("peer closed: write %zd, errno %d (%s)\n", r, errno, strerror(errno));
    CHECK(r < 0 && errno == EPIPE);
    CHECK(!apir_sender_flush(s, 100));
    apir_sender_stop(s);
    close(sv[0]);
}

static void peer_silent(void)
{
    int sv[2];
    pair(sv);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    struct apir_sender *s = apir_sender_start(sv[0], RING, 200);
    uint8_t chunk[1024] = { 0 };
    struct iovec iov = { chunk, sizeof(chunk) };
    const uint64_t t0 = apir_now_ns();
    ssize_t r = 0;
    for (int i = 0; i < 100000 && r >= 0; i++)
        r = apir_sender_write(s, &iov, 1);
    const double failed_ms = (apir_now_ns() - t0) / 1e6;
    printf("peer silent: write %zd, errno %d (%s) after %.0f ms\n", r, errno, strerror(errno), failed_ms);
    CHECK(r < 0 && errno == ETIMEDOUT);
    CHECK(failed_ms >= 150 && failed_ms < 3000);
    apir_sender_stop(s);

    /* Stopped with bytes queued for a peer that reads nothing: bounded. */
    s = apir_sender_start(sv[0], RING, 60000);
    iov.iov_len = 512;
    CHECK(apir_sender_write(s, &iov, 1) == 512);
    const uint64_t t1 = apir_now_ns();
    apir_sender_stop(s);
    const double stop_ms = (apir_now_ns() - t1) / 1e6;
    printf("stop with bytes queued: %.0f ms\n", stop_ms);
    CHECK(stop_ms < 3000);
    close(sv[0]);
    close(sv[1]);
}

TEST_MAIN("sender", TEST(whole_and_in_order), TEST(small_writes_direct), TEST(peer_closed), TEST(peer_silent))
