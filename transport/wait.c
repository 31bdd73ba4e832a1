#include "wait.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t apir_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t env_us(const char *name, uint32_t dflt)
{
    /* A value that is not a number in range is ignored (not read as 0,
     * which would turn a spin off). */
    const char *s = getenv(name);
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 100000)
            return (uint32_t)v;
    }
    return dflt;
}

uint32_t apir_spin_us(void) { return env_us("APIR_SPIN_US", 100); }
uint32_t apir_host_spin_us(bool device_memory)
{
    return env_us("APIR_HOST_SPIN_US", device_memory ? 2000 : apir_spin_us());
}
uint32_t apir_spin_graph_us(void) { return env_us("APIR_SPIN_GRAPH_US", 20000); }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/*
 * Two phases: a few microseconds of pure polling (a reply to a short command
 * arrives in well under 1 us), then polling with sched_yield() in between, so
 * that on a machine with few cores the side we wait for (the host's compute
 * threads, or the guest's) gets the core whenever it wants it, while a reply
 * is still seen within about a microsecond.
 */
#define PURE_SPIN_NS 3000ull

uint32_t apir_spin_while_equal(_Atomic uint32_t *word, uint32_t old, uint64_t spin_ns)
{
    uint32_t v = atomic_load_explicit(word, memory_order_acquire);
    if (v != old || spin_ns == 0)
        return v;
    const uint64_t start = apir_now_ns();
    const uint64_t deadline = start + spin_ns;
    const uint64_t pure_end = start + (spin_ns < PURE_SPIN_NS ? spin_ns : PURE_SPIN_NS);
    for (;;) {
        /* Read the clock only every 64 polls: it costs more than a poll. */
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            v = atomic_load_explicit(word, memory_order_acquire);
            if (v != old)
                return v;
        }
        uint64_t now = apir_now_ns();
        if (now >= deadline)
            return v;
        if (now >= pure_end) {
            sched_yield();
            v = atomic_load_explicit(word, memory_order_acquire);
            if (v != old)
                return v;
        }
    }
}

bool apir_futex_wait(_Atomic uint32_t *word, uint32_t old, uint64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, old, tsp, NULL, 0);
    if (r == -1 && errno == ETIMEDOUT)
        return false;
    return true;
}

void apir_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void apir_futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
