#include "reader.h"

#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long either side keeps looking before it sleeps: within a payload the
 * next bytes come within microseconds (the peer seals a record in ~4). */
#define READER_SPIN_NS 50000ull

/* end: what the thread met after the ring's last byte. */
#define END_NONE 0
#define END_CLOSED (-1)

struct apir_reader {
    int fd;
    int wake_fd;                 /* eventfd: ends the thread's poll at a stop */
    uint8_t *ring;
    size_t cap;
    /* Bytes ever read into the ring (the thread's) and ever taken (the
     * owner's): the ring holds [tail, head), at tail % cap onwards. */
    _Atomic uint64_t head, tail;
    /* Bumped after head or end (the owner sleeps on it), after tail (the
     * thread sleeps on it for room), and at arm and stop (the thread
     * sleeps on it while unarmed). */
    _Atomic uint32_t head_word, tail_word, arm_word;
    _Atomic bool armed, busy, stopping;
    _Atomic bool thread_idle, thread_wants_room, owner_waiting;
    _Atomic int end;             /* END_NONE, END_CLOSED, or an errno */
    pthread_t thread;
};

static void publish(struct apir_reader *r)
{
    atomic_fetch_add(&r->head_word, 1);
    if (atomic_load(&r->owner_waiting))
        apir_futex_wake(&r->head_word);
}

/* Armed and the socket empty: spin, then sleep until it is readable or the
 * reader stops.  The owner disarming does not wake it: it goes idle at the
 * next bytes, which are then the owner's to read. */
static void wait_socket(struct apir_reader *r)
{
    const uint64_t end = apir_now_ns() + READER_SPIN_NS;
    do {
        struct pollfd p = { .fd = r->fd, .events = POLLIN };
        if (poll(&p, 1, 0) != 0 || !atomic_load(&r->armed) || atomic_load(&r->stopping))
            return;
        sched_yield();
    } while (apir_now_ns() < end);
    struct pollfd p[2] = { { .fd = r->fd, .events = POLLIN }, { .fd = r->wake_fd, .events = POLLIN } };
    if (poll(p, 2, -1) > 0 && (p[1].revents & POLLIN)) {
        uint64_t v;
        ssize_t n = read(r->wake_fd, &v, sizeof(v));
        (void)n;
    }
}

/* The ring full: until the owner takes some (or a stop). */
static void wait_room(struct apir_reader *r, uint32_t word)
{
    if (apir_spin_while_equal(&r->tail_word, word, READER_SPIN_NS) != word)
        return;
    /* Dekker with the owner: it bumps tail_word, then reads this flag. */
    atomic_store(&r->thread_wants_room, true);
    if (atomic_load(&r->tail_word) == word)
        apir_futex_wait(&r->tail_word, word, 0);
    atomic_store(&r->thread_wants_room, false);
}

static void *reader_main(void *arg)
{
    struct apir_reader *r = arg;
    while (!atomic_load(&r->stopping)) {
        const uint32_t aw = atomic_load(&r->arm_word);
        if (!atomic_load(&r->armed) || atomic_load(&r->end) != END_NONE) {
            /* Dekker with arm: it stores armed and bumps arm_word, then
             * reads this flag. */
            atomic_store(&r->thread_idle, true);
            if (atomic_load(&r->arm_word) == aw && !atomic_load(&r->stopping))
                apir_futex_wait(&r->arm_word, aw, 0);
            atomic_store(&r->thread_idle, false);
            continue;
        }
        /* Dekker with disarm: it clears armed, then waits while busy. */
        atomic_store(&r->busy, true);
        if (!atomic_load(&r->armed)) {
            atomic_store(&r->busy, false);
            continue;
        }
        const uint32_t tw = atomic_load(&r->tail_word);
        const uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        const uint64_t room = r->cap - (head - atomic_load(&r->tail));
        if (room == 0) {
            atomic_store(&r->busy, false);
            wait_room(r, tw);
            continue;
        }
        const size_t at = (size_t)(head % r->cap);
        const size_t k = room < r->cap - at ? (size_t)room : r->cap - at;
        const ssize_t got = recv(r->fd, r->ring + at, k, MSG_DONTWAIT);
        if (got > 0) {
            atomic_store(&r->head, head + (uint64_t)got);
            publish(r);
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
            atomic_store(&r->end, got == 0 ? END_CLOSED : errno);
            publish(r);
        } else if (errno != EINTR) {
            atomic_store(&r->busy, false);
            wait_socket(r);
            continue;
        }
        atomic_store(&r->busy, false);
    }
    return NULL;
}

struct apir_reader *apir_reader_start(int fd, size_t ring_bytes)
{
    struct apir_reader *r = calloc(1, sizeof(*r));
    if (!r || !(r->ring = malloc(ring_bytes))) {
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    r->fd = fd;
    r->cap = ring_bytes;
    r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = r->wake_fd < 0 ? errno : pthread_create(&r->thread, NULL, reader_main, r);
    if (rc != 0) {
        if (r->wake_fd >= 0)
            close(r->wake_fd);
        free(r->ring);
        free(r);
        errno = rc;
        return NULL;
    }
    return r;
}

void apir_reader_arm(struct apir_reader *r)
{
    if (atomic_load(&r->armed))
        return;
    atomic_store(&r->armed, true);
    atomic_fetch_add(&r->arm_word, 1);
    if (atomic_load(&r->thread_idle))
        apir_futex_wake(&r->arm_word);
}

void apir_reader_disarm(struct apir_reader *r)
{
    if (!atomic_load(&r->armed))
        return;
    atomic_store(&r->armed, false);
    /* A recv in progress ends within its syscall (non-blocking). */
    while (atomic_load(&r->busy))
        sched_yield();
}

bool apir_reader_armed(const struct apir_reader *r)
{
    return atomic_load(&r->armed);
}

bool apir_reader_pending(struct apir_reader *r)
{
    return atomic_load(&r->end) != END_NONE || atomic_load(&r->head) != atomic_load_explicit(&r->tail, memory_order_relaxed);
}

ssize_t apir_reader_take(struct apir_reader *r, void *buf, size_t len)
{
    /* end before head: the thread sets end after its last head, so an end
     * seen here comes with every byte before it. */
    const int end = atomic_load(&r->end);
    const uint64_t head = atomic_load(&r->head), tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (head == tail) {
        if (end == END_CLOSED)
            return 0;
        errno = end != END_NONE ? end : EAGAIN;
        return -1;
    }
    const size_t at = (size_t)(tail % r->cap);
    size_t n = head - tail < len ? (size_t)(head - tail) : len;
    if (n > r->cap - at)
        n = r->cap - at;
    memcpy(buf, r->ring + at, n);
    atomic_store(&r->tail, tail + n);
    atomic_fetch_add(&r->tail_word, 1);
    if (atomic_load(&r->thread_wants_room))
        apir_futex_wake(&r->tail_word);
    return (ssize_t)n;
}

bool apir_reader_wait(struct apir_reader *r, uint64_t deadline_ns)
{
    for (;;) {
        const uint32_t word = atomic_load(&r->head_word);
        if (apir_reader_pending(r) || !atomic_load(&r->armed))
            return true;
        if (apir_spin_while_equal(&r->head_word, word, READER_SPIN_NS) != word)
            continue;
        const uint64_t now = apir_now_ns();
        if (deadline_ns && now >= deadline_ns) {
            errno = ETIMEDOUT;
            return false;
        }
        /* Dekker with the thread: it bumps head_word, then reads this flag. */
        atomic_store(&r->owner_waiting, true);
        if (atomic_load(&r->head_word) == word)
            apir_futex_wait(&r->head_word, word, deadline_ns ? deadline_ns - now : 0);
        atomic_store(&r->owner_waiting, false);
    }
}

void apir_reader_stop(struct apir_reader *r)
{
    if (!r)
        return;
    atomic_store(&r->stopping, true);
    atomic_fetch_add(&r->arm_word, 1);
    apir_futex_wake(&r->arm_word);
    atomic_fetch_add(&r->tail_word, 1);
    apir_futex_wake(&r->tail_word);
    const uint64_t one = 1;
    ssize_t n = write(r->wake_fd, &one, sizeof(one));
    (void)n;
    pthread_join(r->thread, NULL);
    close(r->wake_fd);
    free(r->ring);
    free(r);
}
