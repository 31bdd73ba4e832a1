/*
 * A socket written by a thread of its own (transport/sender.h), over a
 * socketpair:
 *  - bytes written in pieces of every size, through a ring smaller than
 *    most of them (it wraps, the writer waits for room), arrive whole and
 *    in order;
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
#include <pthread.h>
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
    uint32_t want, got;
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

/* Every size from 1 byte to ~3 ring lengths, as two pieces a write. */
static void whole_and_in_order(void)
{
    int sv[2];
    pair(sv);
    uint8_t *src = malloc(TOTAL);
    for (uint32_t i = 0; i < TOTAL; i++)
        src[i] = pattern(i);
    struct apir_sender *s = apir_sender_start(sv[0], RING, 5000);
    CHECK(s != NULL);
    struct reader r = { .fd = sv[1], .want = TOTAL };
    pthread_t th;
    pthread_create(&th, NULL, read_all, &r);
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
    pthread_join(th, NULL);
    printf("in order: %u of %u bytes read, in order %d\n", r.got, TOTAL, r.in_order);
    CHECK(r.got == TOTAL && r.in_order);
    apir_sender_stop(s);
    close(sv[0]);
    close(sv[1]);
    free(src);
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

TEST_MAIN("sender", TEST(whole_and_in_order), TEST(peer_closed), TEST(peer_silent))
