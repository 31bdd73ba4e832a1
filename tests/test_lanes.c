/*
 * A session's lanes (transport/lanes.h) over socketpairs, and the wire's
 * split (apir_stream_lane_part, transport/stream_proto.h):
 *  - the split: parts in order, whole pages but the last, covering the
 *    payload exactly, for payloads of every kind of size and 1-4 lanes;
 *  - 3 lanes sending and 3 receiving 1 MiB each at once, three rounds:
 *    every byte where it belongs;
 *  - one payload split by apir_lanes_post_parts on both sides, part 0
 *    moved by the owner: whole again, for a token's logits over 3 lanes
 *    and a payload too small to fill them all over 2 of 3, and a receive
 *    abandoned with its sender gone returns at once, failing what follows;
 *  - a gated send: nothing leaves before the gate moves, then exactly what
 *    lies before it, then the rest;
 *  - a lane whose peer closes, and a break from another thread, fail the
 *    wait (and every later one) in bounded time;
 *  - a fifth lane is refused; a set with lanes asleep frees at once.
 */
#include "lanes.h"
#include "stream_proto.h"
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

#define PART (1u << 20)

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(1);
    }
}

static void split(void)
{
    static const uint64_t totals[] = { 0, 1, 4095, 4096, 4097, 65536, 513u * 1024u + 7, 3u << 20, (1ull << 30) + 5 };
    for (size_t t = 0; t < sizeof(totals) / sizeof(totals[0]); t++)
        for (uint32_t lanes = 1; lanes <= APIR_STREAM_MAX_LANES; lanes++) {
            uint64_t at = 0;
            for (uint32_t i = 0; i <= lanes; i++) {
                uint64_t off, len;
                apir_stream_lane_part(totals[t], lanes, i, &off, &len);
                CHECK_MSG(off == at, "total %llu, %u lanes: part %u at %llu, expected %llu",
                          (unsigned long long)totals[t], lanes, i, (unsigned long long)off, (unsigned long long)at);
                CHECK_MSG(off % 4096 == 0 || off == totals[t], "part %u at %llu", i, (unsigned long long)off);
                at = off + len;
            }
            CHECK_MSG(at == totals[t], "total %llu, %u lanes: parts end at %llu", (unsigned long long)totals[t], lanes,
                      (unsigned long long)at);
        }
    /* A token's logits over 3 lanes: four parts, none empty. */
    uint64_t off, len;
    apir_stream_lane_part(513u * 1024u, 3, 3, &off, &len);
    CHECK(len > 0 && len <= 132u * 1024u);
}

/* Two sets of 3 lanes, lane k of one connected to lane k of the other. */
static void three_lanes(struct apir_lanes **tx, struct apir_lanes **rx)
{
    *tx = apir_lanes_new(5000);
    *rx = apir_lanes_new(5000);
    for (int i = 0; i < 3; i++) {
        int sv[2];
        pair(sv);
        CHECK(apir_lanes_add(*tx, sv[0], NULL) && apir_lanes_add(*rx, sv[1], NULL));
    }
}

static void both_ways(void)
{
    struct apir_lanes *tx, *rx;
    three_lanes(&tx, &rx);
    CHECK(apir_lanes_count(tx) == 3 && apir_lanes_count(rx) == 3);
    uint8_t *src = malloc(3 * PART), *dst = malloc(3 * PART);
    for (int round = 0; round < 3; round++) {
        for (uint32_t i = 0; i < 3 * PART; i++)
            src[i] = (uint8_t)(i * 2654435761u >> (13 + round));
        memset(dst, 0xcd, 3 * PART);
        /* Receivers first, as a guest posts them before its frame leaves. */
        for (uint32_t k = 0; k < 3; k++)
            apir_lanes_post(rx, k, false, dst + k * PART, PART, 20000);
        for (uint32_t k = 0; k < 3; k++)
            apir_lanes_post(tx, k, true, src + k * PART, PART, 20000);
        CHECK(apir_lanes_wait(tx, 20000) == 0);
        CHECK(apir_lanes_wait(rx, 20000) == 0);
        CHECK_MSG(memcmp(src, dst, 3 * PART) == 0, "round %d: the bytes differ", round);
    }
    free(src);
    free(dst);
    apir_lanes_free(tx);
    apir_lanes_free(rx);
}

/* total bytes over the first `lanes` of 3 lanes a side, as a frame's one
 * payload goes: part 0 copied by the owner, the rest by the lanes. */
static void one_payload(struct apir_lanes *tx, struct apir_lanes *rx, uint64_t total, uint32_t lanes)
{
    uint8_t *src = malloc(total), *dst = malloc(total);
    for (uint64_t i = 0; i < total; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 11);
    memset(dst, 0xcd, total);
    const size_t here_rx = apir_lanes_post_parts(rx, false, dst, total, lanes, 20000);
    const size_t here_tx = apir_lanes_post_parts(tx, true, src, total, lanes, 20000);
    uint64_t off0, len0;
    apir_stream_lane_part(total, lanes, 0, &off0, &len0);
    CHECK_MSG(here_rx == len0 && here_tx == len0 && off0 == 0, "%llu bytes over %u lanes: part 0 %zu/%zu, expected %llu",
              (unsigned long long)total, lanes, here_rx, here_tx, (unsigned long long)len0);
    memcpy(dst, src, here_tx);
    CHECK(apir_lanes_wait(tx, 20000) == 0);
    CHECK(apir_lanes_wait(rx, 20000) == 0);
    CHECK_MSG(memcmp(src, dst, total) == 0, "%llu bytes over %u lanes came back changed", (unsigned long long)total, lanes);
    free(src);
    free(dst);
}

static void post_parts(void)
{
    struct apir_lanes *tx, *rx;
    three_lanes(&tx, &rx);
    one_payload(tx, rx, 513u * 1024u + 7, 3);
    one_payload(tx, rx, 5000, 2);  /* part 2 empty; lane 2 not posted */
    one_payload(tx, rx, 3u << 20, 3);
    /* A receive whose sender never comes: abandoned, it ends at once (its
     * socket shut down), and the set fails from then. */
    uint8_t buf[8192];
    (void)apir_lanes_post_parts(rx, false, buf, sizeof(buf), 1, 0);
    const uint64_t t0 = apir_now_ns();
    apir_lanes_abandon(rx, EPIPE);
    const double ms = (apir_now_ns() - t0) / 1e6;
    CHECK_MSG(ms < 1000, "an abandoned receive took %.0f ms to end", ms);
    errno = 0;
    CHECK(apir_lanes_wait(rx, 0) == -1 && errno == EPIPE);
    apir_lanes_free(tx);
    apir_lanes_free(rx);
}

/* Bytes readable on fd within ms (all of them, up to cap). */
static size_t drain(int fd, uint8_t *buf, size_t cap, int ms)
{
    size_t got = 0;
    const uint64_t t0 = apir_now_ns();
    while (got < cap) {
        const int left = ms - (int)((apir_now_ns() - t0) / 1000000ull);
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        const ssize_t k = recv(fd, buf + got, cap - got, MSG_DONTWAIT);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    return got;
}

static void gated(void)
{
    struct apir_lanes *tx = apir_lanes_new(5000);
    int sv[2];
    pair(sv);
    CHECK(apir_lanes_add(tx, sv[0], NULL));
    enum { N = 64 * 1024 };
    static uint8_t src[N], dst[N];
    for (uint32_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    apir_lanes_gate(tx, src);
    apir_lanes_post(tx, 0, true, src, N, 1000);
    CHECK_MSG(drain(sv[1], dst, N, 50) == 0, "bytes left before the gate moved");
    apir_lanes_ready(tx, src + 4096);
    size_t got = drain(sv[1], dst, N, 200);
    CHECK_MSG(got == 4096, "%zu bytes left with the gate at 4096", got);
    apir_lanes_ready(tx, src + N);
    got += drain(sv[1], dst + got, N - got, 2000);
    CHECK(got == N && memcmp(src, dst, N) == 0);
    CHECK(apir_lanes_wait(tx, 1000) == 0);
    /* The wait cleared the gate: the next send goes at once. */
    apir_lanes_post(tx, 0, true, src, 100, 1000);
    CHECK(apir_lanes_wait(tx, 1000) == 0 && drain(sv[1], dst, N, 200) == 100);
    apir_lanes_free(tx);
    close(sv[1]);
}

struct breaker {
    struct apir_lanes *l;
};

static void *break_later(void *arg)
{
    struct breaker *b = arg;
    usleep(50000);
    apir_lanes_break(b->l, EPIPE);
    return NULL;
}

static void failures(void)
{
    /* The peer closes while a lane waits for its bytes. */
    struct apir_lanes *rx = apir_lanes_new(5000);
    int sv[2];
    pair(sv);
    CHECK(apir_lanes_add(rx, sv[1], NULL));
    static uint8_t dst[4096];
    apir_lanes_post(rx, 0, false, dst, sizeof(dst), 0);
    CHECK(send(sv[0], "abc", 3, 0) == 3);
    close(sv[0]);
    uint64_t t0 = apir_now_ns();
    CHECK(apir_lanes_wait(rx, 0) == -1);
    CHECK((apir_now_ns() - t0) / 1000000ull < 3000);
    errno = 0;
    CHECK(apir_lanes_wait(rx, 0) == -1 && errno != 0);
    apir_lanes_free(rx);

    /* A break from another thread ends a lane asleep on a silent peer. */
    rx = apir_lanes_new(-1);
    pair(sv);
    CHECK(apir_lanes_add(rx, sv[1], NULL));
    apir_lanes_post(rx, 0, false, dst, sizeof(dst), 0);
    struct breaker b = { rx };
    pthread_t th;
    pthread_create(&th, NULL, break_later, &b);
    t0 = apir_now_ns();
    errno = 0;
    CHECK(apir_lanes_wait(rx, 0) == -1 && errno == EPIPE);
    const double ms = (apir_now_ns() - t0) / 1e6;
    printf("break: the wait returned after %.1f ms\n", ms);
    CHECK(ms >= 40 && ms < 3000);
    pthread_join(th, NULL);
    apir_lanes_free(rx);
    close(sv[0]);
}

static void limits_and_free(void)
{
    struct apir_lanes *l = apir_lanes_new(1000);
    int sv[APIR_STREAM_MAX_LANES + 1][2];
    for (uint32_t i = 0; i <= APIR_STREAM_MAX_LANES; i++)
        pair(sv[i]);
    for (uint32_t i = 0; i < APIR_STREAM_MAX_LANES; i++)
        CHECK(apir_lanes_add(l, sv[i][0], NULL));
    errno = 0;
    CHECK(!apir_lanes_add(l, sv[APIR_STREAM_MAX_LANES][0], NULL) && errno == ENOSPC);
    CHECK(apir_lanes_count(l) == APIR_STREAM_MAX_LANES);
    usleep(100000);  /* the lanes are asleep by now */
    const uint64_t t0 = apir_now_ns();
    apir_lanes_free(l);
    const double ms = (apir_now_ns() - t0) / 1e6;
    printf("free with %u lanes asleep: %.1f ms\n", APIR_STREAM_MAX_LANES, ms);
    CHECK(ms < 1000);
    for (uint32_t i = 0; i <= APIR_STREAM_MAX_LANES; i++)
        close(sv[i][1]);
    apir_lanes_free(NULL);
}

TEST_MAIN("lanes", TEST(split), TEST(both_ways), TEST(post_parts), TEST(gated), TEST(failures), TEST(limits_and_free))
