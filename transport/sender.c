#include "sender.h"

#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* How long the thread keeps looking for more bytes before it sleeps: the
 * next record of a download is sealed within a few microseconds; between
 * replies the thread sleeps. */
#define SENDER_SPIN_NS 50000ull
/* What apir_sender_stop still waits for a peer that reads nothing. */
#define STOP_DRAIN_MS 1000
/* A write of at most this many bytes goes straight into the socket from the
 * writer's thread when the ring is empty.  A command's reply is one short
 * record; queued, it waited for this thread to wake (it sleeps between
 * replies), a futex wake-up on the reply's path each time, where the
 * writer's own send() of a few hundred bytes costs a microsecond or two.  A
 * download's 16 KiB records still go through the ring: sealing the next
 * while this thread sends the last is what the thread is for. */
#define DIRECT_MAX 4096

struct apir_sender {
    int fd;
    int timeout_ms;
    uint8_t *ring;
    size_t cap;
    /* Bytes ever written (the writer's) and ever sent (the thread's): the
     * ring holds [tail, head), at head % cap onwards. */
    _Atomic uint64_t head, tail;
    /* Bumped after head (the thread sleeps on it) and after tail (the
     * writer sleeps on it for room or for a flush). */
    _Atomic uint32_t head_word, tail_word;
    _Atomic bool thread_sleeping, writer_waiting, stopping;
    _Atomic int error;          /* errno of the failure that ended sending; 0 */
    _Atomic uint64_t direct_bytes;  /* sent by the writer itself (DIRECT_MAX) */
    pthread_t thread;
};

static void fail(struct apir_sender *s, int err)
{
    atomic_store(&s->error, err ? err : EPIPE);
    atomic_fetch_add(&s->tail_word, 1);
    apir_futex_wake(&s->tail_word);
}

/* Waits until fd takes more, or the time runs out (false).  While stopping,
 * at most until stop_deadline. */
static bool wait_room(struct apir_sender *s, uint64_t *stop_deadline)
{
    const uint64_t deadline = apir_now_ns() + (uint64_t)s->timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = apir_now_ns(), until = deadline;
        if (atomic_load(&s->stopping)) {
            if (!*stop_deadline)
                *stop_deadline = now + STOP_DRAIN_MS * 1000000ull;
            if (*stop_deadline < until)
                until = *stop_deadline;
        }
        if (now >= until)
            return false;
        /* In slices: a stop that comes meanwhile shortens the wait. */
        uint64_t left_ms = (until - now) / 1000000ull + 1;
        struct pollfd p = { .fd = s->fd, .events = POLLOUT };
        int rc = poll(&p, 1, left_ms < 100 ? (int)left_ms : 100);
        if (rc > 0)
            return true;
        if (rc < 0 && errno != EINTR)
            return false;
    }
}

static void *sender_main(void *arg)
{
    struct apir_sender *s = arg;
    uint64_t stop_deadline = 0;
    for (;;) {
        const uint64_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
        const uint32_t word = atomic_load(&s->head_word);
        const uint64_t head = atomic_load(&s->head);
        if (head == tail) {
            if (atomic_load(&s->stopping))
                break;
            if (apir_spin_while_equal(&s->head_word, word, SENDER_SPIN_NS) != word)
                continue;
            /* Dekker with the writer: it stores head, then reads this flag. */
            atomic_store(&s->thread_sleeping, true);
            if (atomic_load(&s->head) == tail && !atomic_load(&s->stopping))
                apir_futex_wait(&s->head_word, word, 0);
            atomic_store(&s->thread_sleeping, false);
            continue;
        }
        const size_t at = (size_t)(tail % s->cap);
        size_t len = (size_t)(head - tail);
        if (len > s->cap - at)
            len = s->cap - at;
        ssize_t sent = send(s->fd, s->ring + at, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent > 0) {
            atomic_store(&s->tail, tail + (uint64_t)sent);
            atomic_fetch_add(&s->tail_word, 1);
            if (atomic_load(&s->writer_waiting))
                apir_futex_wake(&s->tail_word);
        } else if (sent < 0 && errno == EINTR) {
            continue;
        } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_room(s, &stop_deadline)) {
                fail(s, ETIMEDOUT);
                break;
            }
        } else {
            fail(s, sent == 0 ? EPIPE : errno);
            break;
        }
    }
    return NULL;
}

struct apir_sender *apir_sender_start(int fd, size_t ring_bytes, int timeout_ms)
{
    struct apir_sender *s = calloc(1, sizeof(*s));
    if (!s || !(s->ring = malloc(ring_bytes))) {
        free(s);
        errno = ENOMEM;
        return NULL;
    }
    s->fd = fd;
    s->cap = ring_bytes;
    s->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    int rc = pthread_create(&s->thread, NULL, sender_main, s);
    if (rc != 0) {
        free(s->ring);
        free(s);
        errno = rc;
        return NULL;
    }
    return s;
}

/* Sleeps until the thread moved tail or failed (both bump tail_word), at
 * most until deadline; false if it did not. */
static bool wait_tail(struct apir_sender *s, uint32_t word, uint64_t deadline)
{
    if (apir_spin_while_equal(&s->tail_word, word, SENDER_SPIN_NS) != word)
        return true;
    /* Dekker with the thread: it bumps tail_word, then reads this flag. */
    atomic_store(&s->writer_waiting, true);
    for (uint64_t now; atomic_load(&s->tail_word) == word && (now = apir_now_ns()) < deadline;)
        apir_futex_wait(&s->tail_word, word, deadline - now);
    atomic_store(&s->writer_waiting, false);
    return atomic_load(&s->tail_word) != word;
}

ssize_t apir_send_now(int fd, const struct iovec *iov, int n)
{
    while (n > 0 && iov[n - 1].iov_len == 0)
        n--;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!iov[i].iov_len)
            continue;
        ssize_t r = send(fd, iov[i].iov_base, iov[i].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL | (i < n - 1 ? MSG_MORE : 0));
        if (r < 0 && errno == EINTR) {
            i--;
            continue;
        }
        if (r < 0) {
            if (total)
                break;
            return -1;
        }
        total += (size_t)r;
        if ((size_t)r < iov[i].iov_len)
            break;
    }
    return (ssize_t)total;
}

/* A small write sent from the caller's thread (DIRECT_MAX): how many bytes
 * went (the rest, if any, is the ring's), or -1 once the sender has failed.
 * Only while the ring is empty: every byte written before is then in the
 * kernel (the thread stores tail after its send returned, and only the
 * writer moves head), so these follow them. */
static ssize_t send_direct(struct apir_sender *s, const struct iovec *iov, int n)
{
    ssize_t r = apir_send_now(s->fd, iov, n);
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        fail(s, errno);
        return -1;
    }
    r = r < 0 ? 0 : r;
    atomic_fetch_add_explicit(&s->direct_bytes, (uint64_t)r, memory_order_relaxed);
    return r;
}

ssize_t apir_sender_write(struct apir_sender *s, const struct iovec *iov, int n)
{
    /* The thread fails first when the socket takes nothing for timeout_ms;
     * this bound is for a thread that cannot run at all. */
    const uint64_t deadline = apir_now_ns() + ((uint64_t)s->timeout_ms + 1000) * 1000000ull;
    uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    size_t total = 0, want = 0;
    for (int i = 0; i < n; i++)
        want += iov[i].iov_len;
    size_t skip = 0;  /* bytes sent directly: the ring takes the rest */
    if (want <= DIRECT_MAX && atomic_load(&s->tail) == head) {
        const int err = atomic_load(&s->error);
        if (err) {
            errno = err;
            return -1;
        }
        const ssize_t r = send_direct(s, iov, n);
        if (r < 0) {
            errno = atomic_load(&s->error);
            return -1;
        }
        skip = total = (size_t)r;
    }
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        const size_t passed = skip < left ? skip : left;
        p += passed;
        left -= passed;
        skip -= passed;
        while (left) {
            const int err = atomic_load(&s->error);
            if (err) {
                errno = err;
                return -1;
            }
            const uint32_t word = atomic_load(&s->tail_word);
            const uint64_t room = s->cap - (head - atomic_load(&s->tail));
            if (room == 0) {
                if (!wait_tail(s, word, deadline)) {
                    errno = ETIMEDOUT;
                    return -1;
                }
                continue;
            }
            const size_t at = (size_t)(head % s->cap);
            size_t k = left < room ? left : (size_t)room;
            if (k > s->cap - at)
                k = s->cap - at;
            memcpy(s->ring + at, p, k);
            head += k;
            p += k;
            left -= k;
            total += k;
            atomic_store(&s->head, head);
            atomic_fetch_add(&s->head_word, 1);
            if (atomic_load(&s->thread_sleeping))
                apir_futex_wake(&s->head_word);
        }
    }
    return (ssize_t)total;
}

bool apir_sender_flush(struct apir_sender *s, int timeout_ms)
{
    const uint64_t deadline = apir_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    const uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    for (;;) {
        const uint32_t word = atomic_load(&s->tail_word);
        if (atomic_load(&s->error))
            return false;
        if (atomic_load(&s->tail) == head)
            return true;
        if (atomic_load(&s->error) || apir_now_ns() >= deadline || !wait_tail(s, word, deadline))
            return false;
    }
}

uint64_t apir_sender_direct_bytes(const struct apir_sender *s)
{
    return atomic_load_explicit(&s->direct_bytes, memory_order_relaxed);
}

void apir_sender_stop(struct apir_sender *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    atomic_fetch_add(&s->head_word, 1);
    apir_futex_wake(&s->head_word);
    pthread_join(s->thread, NULL);
    free(s->ring);
    free(s);
}
