#include "lanes.h"

#include "net.h"
#include "stream_proto.h"
#include "tls.h"
#include "wait.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long a lane looks for its next job before it sleeps: the jobs of one
 * frame are posted together; between frames (a token's 3 ms) it sleeps. */
#define LANE_IDLE_SPIN_NS 50000ull
/* A lane's reader: receives go straight into their destination; this
 * holds only what one recv brings beyond a job's end. */
#define LANE_READER_BYTES (16u * 1024u)

struct lane {
    struct apir_lanes *set;
    int fd;
    struct apir_tls *tls;           /* a tls: session's lane: its own TLS session; NULL: plain */
    pthread_t thread;
    struct apir_net_reader rd;
    /* Bumped by each post (and by the stop); the lane sleeps on it. */
    _Atomic uint32_t job_word;
    _Atomic bool sleeping;
    /* The job, written by the owner before it bumps job_word. */
    bool send, gated;
    uint8_t *p;
    size_t n;
    uint64_t spin_ns;
};

struct apir_lanes {
    int timeout_ms;
    pthread_mutex_t add_lock;       /* adders, one at a time */
    _Atomic uint32_t n;             /* lanes started; lanes[0, n) are the owner's */
    struct lane lanes[APIR_STREAM_MAX_LANES];
    /* Jobs posted and not ended; done_word is bumped as each ends. */
    _Atomic uint32_t pending, done_word;
    _Atomic bool owner_sleeping;
    /* The gate: sends stop before ready (an address), bumped on each move. */
    bool gate_on;
    _Atomic uintptr_t ready;
    _Atomic uint32_t ready_word, ready_sleepers;
    _Atomic int error;              /* the first failure's errno; 0 */
    _Atomic bool stopping;
};

struct apir_lanes *apir_lanes_new(int timeout_ms)
{
    struct apir_lanes *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->timeout_ms = timeout_ms;
    pthread_mutex_init(&l->add_lock, NULL);
    return l;
}

uint32_t apir_lanes_count(const struct apir_lanes *l)
{
    return l ? atomic_load_explicit(&((struct apir_lanes *)l)->n, memory_order_acquire) : 0;
}

void apir_lanes_break(struct apir_lanes *l, int err)
{
    int none = 0;
    if (!atomic_compare_exchange_strong(&l->error, &none, err ? err : EPIPE))
        return;
    /* Lanes in a job stop at their next socket call; gated ones look at
     * the error when woken. */
    const uint32_t n = apir_lanes_count(l);
    for (uint32_t i = 0; i < n; i++)
        shutdown(l->lanes[i].fd, SHUT_RDWR);
    atomic_fetch_add(&l->ready_word, 1);
    apir_futex_wake_all(&l->ready_word);
    atomic_fetch_add(&l->done_word, 1);
    apir_futex_wake(&l->done_word);
}

/* A gated send's wait for the owner to move the gate past at; false when
 * the set broke meanwhile. */
static bool wait_ready(struct lane *ln, uintptr_t at)
{
    struct apir_lanes *l = ln->set;
    for (;;) {
        const uint32_t word = atomic_load(&l->ready_word);
        if (atomic_load(&l->error))
            return false;
        if (atomic_load(&l->ready) > at)
            return true;
        if (apir_spin_while_equal(&l->ready_word, word, ln->spin_ns) != word)
            continue;
        /* Dekker with the owner: it bumps ready_word, then reads this. */
        atomic_fetch_add(&l->ready_sleepers, 1);
        if (atomic_load(&l->ready_word) == word)
            apir_futex_wait(&l->ready_word, word, 0);
        atomic_fetch_sub(&l->ready_sleepers, 1);
    }
}

static int run_job(struct lane *ln)
{
    struct apir_lanes *l = ln->set;
    if (!ln->send) {
        ln->rd.spin_ns = ln->spin_ns;
        return apir_net_read(&ln->rd, ln->p, ln->n, l->timeout_ms, NULL);
    }
    uint8_t *at = ln->p, *const end = ln->p + ln->n;
    while (at < end) {
        uint8_t *upto = end;
        if (ln->gated) {
            if (!wait_ready(ln, (uintptr_t)at)) {
                errno = atomic_load(&l->error);
                return -1;
            }
            const uintptr_t r = atomic_load(&l->ready);
            if (r < (uintptr_t)end)
                upto = (uint8_t *)r;
        }
        struct iovec iov = { at, (size_t)(upto - at) };
        if (apir_net_send(ln->fd, ln->tls, &iov, 1, l->timeout_ms) != 0)
            return -1;
        at = upto;
    }
    return 0;
}

static void *lane_main(void *arg)
{
    struct lane *ln = arg;
    struct apir_lanes *l = ln->set;
    uint32_t seen = 0;
    for (;;) {
        const uint32_t word = atomic_load(&ln->job_word);
        if (word == seen) {
            if (apir_spin_while_equal(&ln->job_word, seen, LANE_IDLE_SPIN_NS) != seen)
                continue;
            /* Dekker with the owner: it bumps job_word, then reads this. */
            atomic_store(&ln->sleeping, true);
            if (atomic_load(&ln->job_word) == seen)
                apir_futex_wait(&ln->job_word, seen, 0);
            atomic_store(&ln->sleeping, false);
            continue;
        }
        seen = word;
        if (atomic_load(&l->stopping))
            break;
        if (!atomic_load(&l->error) && run_job(ln) != 0)
            apir_lanes_break(l, errno);
        if (atomic_fetch_sub(&l->pending, 1) == 1) {
            atomic_fetch_add(&l->done_word, 1);
            if (atomic_load(&l->owner_sleeping))
                apir_futex_wake(&l->done_word);
        }
    }
    return NULL;
}

bool apir_lanes_add(struct apir_lanes *l, int fd, struct apir_tls *tls)
{
    pthread_mutex_lock(&l->add_lock);
    const uint32_t i = atomic_load(&l->n);
    struct lane *ln = &l->lanes[i < APIR_STREAM_MAX_LANES ? i : 0];
    int err = 0;
    if (i >= APIR_STREAM_MAX_LANES || atomic_load(&l->stopping)) {
        err = ENOSPC;
    } else {
        memset(ln, 0, sizeof(*ln));
        ln->set = l;
        ln->fd = fd;
        ln->tls = tls;
        if (!apir_net_reader_init(&ln->rd, fd, LANE_READER_BYTES)) {
            err = ENOMEM;
        } else {
            ln->rd.tls = tls;
            /* The thread takes no signals: the process's own threads do. */
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old);
            err = pthread_create(&ln->thread, NULL, lane_main, ln);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            if (err)
                apir_net_reader_free(&ln->rd);
        }
    }
    if (!err)
        atomic_store_explicit(&l->n, i + 1, memory_order_release);
    pthread_mutex_unlock(&l->add_lock);
    if (err) {
        apir_tls_free(tls);
        close(fd);
        errno = err;
        return false;
    }
    return true;
}

void apir_lanes_post(struct apir_lanes *l, uint32_t i, bool send, void *p, size_t n, uint64_t spin_ns)
{
    struct lane *ln = &l->lanes[i];
    ln->send = send;
    ln->gated = send && l->gate_on;
    ln->p = p;
    ln->n = n;
    ln->spin_ns = spin_ns;
    atomic_fetch_add(&l->pending, 1);
    atomic_fetch_add(&ln->job_word, 1);
    if (atomic_load(&ln->sleeping))
        apir_futex_wake(&ln->job_word);
}

size_t apir_lanes_post_parts(struct apir_lanes *l, bool send, uint8_t *p, uint64_t total, uint32_t lanes,
                             uint64_t spin_ns)
{
    uint64_t off, len;
    for (uint32_t k = 1; k <= lanes; k++) {
        apir_stream_lane_part(total, lanes, k, &off, &len);
        apir_lanes_post(l, k - 1, send, p + off, (size_t)len, spin_ns);
    }
    apir_stream_lane_part(total, lanes, 0, &off, &len);
    return (size_t)len;
}

void apir_lanes_gate(struct apir_lanes *l, const uint8_t *ready_end)
{
    l->gate_on = ready_end != NULL;
    atomic_store(&l->ready, (uintptr_t)ready_end);
}

void apir_lanes_ready(struct apir_lanes *l, const uint8_t *ready_end)
{
    atomic_store(&l->ready, (uintptr_t)ready_end);
    atomic_fetch_add(&l->ready_word, 1);
    if (atomic_load(&l->ready_sleepers))
        apir_futex_wake_all(&l->ready_word);
}

int apir_lanes_wait(struct apir_lanes *l, uint64_t spin_ns)
{
    for (;;) {
        const uint32_t word = atomic_load(&l->done_word);
        if (atomic_load(&l->pending) == 0)
            break;
        if (apir_spin_while_equal(&l->done_word, word, spin_ns) != word)
            continue;
        atomic_store(&l->owner_sleeping, true);
        if (atomic_load(&l->pending) != 0 && atomic_load(&l->done_word) == word)
            apir_futex_wait(&l->done_word, word, 0);
        atomic_store(&l->owner_sleeping, false);
    }
    l->gate_on = false;
    const int err = atomic_load(&l->error);
    if (err) {
        errno = err;
        return -1;
    }
    return 0;
}

void apir_lanes_abandon(struct apir_lanes *l, int err)
{
    apir_lanes_break(l, err);
    (void)apir_lanes_wait(l, 0);
}

void apir_lanes_free(struct apir_lanes *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->add_lock);
    atomic_store(&l->stopping, true);
    pthread_mutex_unlock(&l->add_lock);
    apir_lanes_break(l, ECANCELED);
    const uint32_t n = apir_lanes_count(l);
    for (uint32_t i = 0; i < n; i++) {
        struct lane *ln = &l->lanes[i];
        atomic_fetch_add(&ln->job_word, 1);
        apir_futex_wake(&ln->job_word);
        pthread_join(ln->thread, NULL);
        apir_net_reader_free(&ln->rd);
        apir_tls_free(ln->tls);
        close(ln->fd);
    }
    pthread_mutex_destroy(&l->add_lock);
    free(l);
}
