/*
 * A socket read ahead by a thread of its own (transport/reader.h), over a
 * socketpair:
 *  - 1 MiB written by a peer in pieces of every size, taken by the owner in
 *    pieces of other sizes, armed and disarmed in turns (the owner reading
 *    the socket itself while disarmed, once the ring is empty), through a
 *    ring smaller than most pieces: every byte once, in order;
 *  - disarmed with the ring not empty, the ring's bytes still come first;
 *  - the peer's close comes after the last byte (0), and again after it;
 *  - an armed wait with nothing to read times out when asked to, and a
 *    stop ends a thread asleep on the socket at once.
 */
#include "reader.h"
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
#define RING 4099u  /* not a power of two, smaller than most pieces */

static uint8_t pattern(uint32_t i) { return (uint8_t)(i * 2654435761u >> 13); }

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(1);
    }
}

struct writer {
    int fd;
    bool ok;
};

/* The peer: TOTAL bytes in pieces of every size, then its close. */
static void *write_all(void *arg)
{
    struct writer *w = arg;
    uint8_t *src = malloc(TOTAL);
    for (uint32_t i = 0; i < TOTAL; i++)
        src[i] = pattern(i);
    uint32_t at = 0, size = 1;
    w->ok = true;
    while (at < TOTAL && w->ok) {
        uint32_t n = size < TOTAL - at ? size : TOTAL - at;
        ssize_t r = send(w->fd, src + at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
            at += (uint32_t)r;
            size = size % (5 * RING) + 1013;
        } else if (r < 0 && errno == EAGAIN) {
            struct pollfd p = { .fd = w->fd, .events = POLLOUT };
            w->ok = poll(&p, 1, 5000) == 1;
        } else {
            w->ok = false;
        }
    }
    shutdown(w->fd, SHUT_WR);
    free(src);
    return NULL;
}

/* The owner's read: from the ring while it has bytes or the thread reads
 * (armed), else from the socket - as transport/tls.c's pull. */
static ssize_t owner_read(struct apir_reader *r, int fd, uint8_t *buf, size_t len)
{
    for (;;) {
        ssize_t n;
        if (apir_reader_armed(r) || apir_reader_pending(r))
            n = apir_reader_take(r, buf, len);
        else
            n = recv(fd, buf, len, MSG_DONTWAIT);
        if (n >= 0 || errno != EAGAIN)
            return n;
        if (apir_reader_armed(r)) {
            if (!apir_reader_wait(r, apir_now_ns() + 5000000000ull))
                return -1;
        } else {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            if (poll(&p, 1, 5000) != 1)
                return -1;
        }
    }
}

static void whole_and_in_order(void)
{
    int sv[2];
    pair(sv);
    struct apir_reader *r = apir_reader_start(sv[1], RING);
    CHECK(r != NULL);
    struct writer w = { .fd = sv[0] };
    pthread_t th;
    pthread_create(&th, NULL, write_all, &w);
    uint8_t *buf = malloc(4 * RING);  /* the largest read: 3 * RING + 330 */
    uint32_t got = 0, size = 1, turns = 0, own_bytes = 0;
    bool in_order = true, ended = false;
    while (!ended) {
        /* Arm for a few reads, then disarm for a few: the switch lands at
         * every point of the ring and of the peer's pieces. */
        if (turns++ % 7 < 4)
            apir_reader_arm(r);
        else
            apir_reader_disarm(r);
        const bool own = !apir_reader_armed(r) && !apir_reader_pending(r);
        ssize_t n = owner_read(r, sv[1], buf, size);
        if (n <= 0) {
            ended = n == 0;
            if (n < 0)
                fprintf(stderr, "read failed: %s\n", strerror(errno));
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            in_order &= buf[i] == pattern(got + (uint32_t)i);
        got += (uint32_t)n;
        own_bytes += own ? (uint32_t)n : 0;
        size = size % (3 * RING) + 331;
    }
    pthread_join(th, NULL);
    printf("in order: %u of %u bytes, in order %d, ended %d, %u read by the owner itself\n", got, TOTAL, in_order,
           ended, own_bytes);
    CHECK(w.ok);
    CHECK(got == TOTAL && in_order && ended);
    CHECK(own_bytes > 0 && own_bytes < TOTAL);
    /* The end stays (met by the owner or by the thread): armed, the thread
     * meets it again, and the owner gets nothing more and no error. */
    apir_reader_arm(r);
    CHECK(apir_reader_wait(r, apir_now_ns() + 5000000000ull));
    CHECK(apir_reader_pending(r));
    CHECK(apir_reader_take(r, buf, 16) == 0);
    apir_reader_stop(r);
    close(sv[0]);
    close(sv[1]);
    free(buf);
}

/* Disarmed with bytes in the ring: they come before the socket's. */
static void ring_first(void)
{
    int sv[2];
    pair(sv);
    struct apir_reader *r = apir_reader_start(sv[1], RING);
    apir_reader_arm(r);
    CHECK(send(sv[0], "abcdef", 6, 0) == 6);
    /* All six in the ring: one read takes what the socket holds. */
    CHECK(apir_reader_wait(r, apir_now_ns() + 5000000000ull));
    apir_reader_disarm(r);
    CHECK(send(sv[0], "ghi", 3, 0) == 3);
    char buf[16] = { 0 };
    size_t got = 0;
    while (got < 9) {
        ssize_t n = owner_read(r, sv[1], (uint8_t *)buf + got, 2);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    printf("ring first: \"%s\"\n", buf);
    CHECK(got == 9 && memcmp(buf, "abcdefghi", 9) == 0);
    apir_reader_stop(r);
    close(sv[0]);
    close(sv[1]);
}

static void wait_and_stop(void)
{
    int sv[2];
    pair(sv);
    struct apir_reader *r = apir_reader_start(sv[1], RING);
    apir_reader_arm(r);
    const uint64_t t0 = apir_now_ns();
    errno = 0;
    CHECK(!apir_reader_wait(r, t0 + 100000000ull) && errno == ETIMEDOUT);
    const double waited_ms = (apir_now_ns() - t0) / 1e6;
    printf("armed wait with nothing sent: %.0f ms\n", waited_ms);
    CHECK(waited_ms >= 90 && waited_ms < 3000);
    /* The thread sleeps on the socket by now: a stop wakes it. */
    const uint64_t t1 = apir_now_ns();
    apir_reader_stop(r);
    const double stop_ms = (apir_now_ns() - t1) / 1e6;
    printf("stop: %.1f ms\n", stop_ms);
    CHECK(stop_ms < 1000);
    close(sv[0]);
    close(sv[1]);
}

TEST_MAIN("reader", TEST(whole_and_in_order), TEST(ring_first), TEST(wait_and_stop))
