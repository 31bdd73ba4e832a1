/*
 * The copy pool of bulk_copy.h.  One process-wide pool (not per device: the
 * cores it uses are the process's), one bulk copy at a time: a second
 * caller does not queue behind the first but copies alone, so no caller
 * waits for another's copy.
 */
#include "bulk_copy.h"

#include "apir_log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HELPERS 7
#define PART_ALIGN 4096  /* parts start on page boundaries of the source range */

struct part {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
};

static struct {
    pthread_once_t once;
    pid_t pid;                 /* the process that made the threads (a fork's child has none) */
    unsigned n_helpers;        /* threads besides the caller */
    pthread_mutex_t busy;      /* held by the caller of the copy in progress */
    pthread_mutex_t m;         /* guards what follows */
    pthread_cond_t go, done;
    uint64_t job;              /* bumped per copy; a helper copies once per job */
    unsigned pending;          /* helper parts not finished */
    struct part parts[MAX_HELPERS];
} pool = { .once = PTHREAD_ONCE_INIT, .busy = PTHREAD_MUTEX_INITIALIZER, .m = PTHREAD_MUTEX_INITIALIZER,
           .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER };

static void *helper_main(void *arg)
{
    const unsigned index = (unsigned)(uintptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.m);
    for (;;) {
        while (pool.job == seen)
            pthread_cond_wait(&pool.go, &pool.m);
        seen = pool.job;
        struct part p = pool.parts[index];
        pthread_mutex_unlock(&pool.m);
        if (p.n)
            memcpy(p.dst, p.src, p.n);
        pthread_mutex_lock(&pool.m);
        if (--pool.pending == 0)
            pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static unsigned threads_wanted(void)
{
    const char *v = getenv("APIR_COPY_THREADS");
    if (v && *v) {
        char *end = NULL;
        unsigned long n = strtoul(v, &end, 10);
        if (end && !*end && n >= 1)
            return n > MAX_HELPERS + 1 ? MAX_HELPERS + 1 : (unsigned)n;
        APIR_WARN("guest", "APIR_COPY_THREADS=%s is not a count of threads (1 or more): ignored", v);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cores / 4;
    return n < 1 ? 1 : n > 4 ? 4 : (unsigned)n;
}

static void pool_start(void)
{
    pool.pid = getpid();
    const unsigned want = threads_wanted() - 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (unsigned i = 0; i < want; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, helper_main, (void *)(uintptr_t)i) != 0) {
            APIR_WARN("guest", "copy threads: only %u of %u started", i, want);
            break;
        }
        pool.n_helpers = i + 1;
    }
    pthread_attr_destroy(&attr);
}

void apir_bulk_copy(void *dst, const void *src, size_t n)
{
    if (n < APIR_BULK_MIN) {
        memcpy(dst, src, n);
        return;
    }
    pthread_once(&pool.once, pool_start);
    if (pool.n_helpers == 0 || pool.pid != getpid() || pthread_mutex_trylock(&pool.busy) != 0) {
        memcpy(dst, src, n);
        return;
    }
    /* Equal parts, page-aligned; the caller takes the last (and the rest). */
    const unsigned copiers = pool.n_helpers + 1;
    size_t part = (n / copiers) & ~(size_t)(PART_ALIGN - 1);
    uint8_t *d = dst;
    const uint8_t *s = src;
    pthread_mutex_lock(&pool.m);
    for (unsigned i = 0; i < pool.n_helpers; i++)
        pool.parts[i] = (struct part){ d + (size_t)i * part, s + (size_t)i * part, part };
    pool.pending = pool.n_helpers;
    pool.job++;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.m);
    const size_t mine = (size_t)pool.n_helpers * part;
    memcpy(d + mine, s + mine, n - mine);
    pthread_mutex_lock(&pool.m);
    while (pool.pending)
        pthread_cond_wait(&pool.done, &pool.m);
    pthread_mutex_unlock(&pool.m);
    pthread_mutex_unlock(&pool.busy);
}
