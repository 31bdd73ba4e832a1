/*
 * Waiting on a shared 32-bit word: spin briefly, then sleep on a futex.
 *
 * Used by both sides of the shm transport.  Works across processes (the
 * words are in MAP_SHARED memfd memory, so no FUTEX_PRIVATE_FLAG).
 */
#ifndef APIR_WAIT_H
#define APIR_WAIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Monotonic time in nanoseconds. */
uint64_t apir_now_ns(void);

/* Spin budgets in microseconds.  A sleeping side needs ~40 us to wake here
 * (MEASURED.md), so each side must spin longer than the other needs to wake
 * and answer, or both settle into sleeping on every call (measured: p50
 * 55 us with 20 us spins on both sides, 0.6 us with these defaults).
 *   guest, waiting for a reply:     APIR_SPIN_US, default 100
 *   guest, waiting for a graph:     APIR_SPIN_GRAPH_US, default 20000 (a
 *                                   CPU host's graphs: not at all, frontend_device.c)
 *   host, waiting for the next call: APIR_HOST_SPIN_US, default 2000 where
 *                                   the devices have their own memory, else
 *                                   APIR_SPIN_US's
 * (the guest's work between two tokens - sampling, building the next batch -
 * must fit in a GPU host's spin, or every token pays two wake-ups.  A CPU
 * host's compute threads take every core its guest has, so there the guest's
 * work needs the core a long spin would hold: see apir_host_spin_us.)
 * After the spin both sleep on a futex: an idle host uses no CPU. */
uint32_t apir_spin_us(void);
/* The host's spin for the next call.  device_memory: its devices compute in
 * their own memory (a GPU), and the CPU idles meanwhile.  A CPU host spins
 * briefly: a spinning thread (even one that yields) keeps its core looking
 * busy, so the scheduler leaves the guest's thread queued behind ggml's
 * spinning compute thread on the other (whisper.cpp's decode step on 2
 * vCPUs: 0.898 of its time with 50 us instead of 2 ms, 24 interleaved
 * rounds; docs/MEASUREMENTS.md).  APIR_HOST_SPIN_US, where set, wins. */
uint32_t apir_host_spin_us(bool device_memory);
uint32_t apir_spin_graph_us(void);

/* Spins until *word != old or spin_ns pass; returns the last value read. */
uint32_t apir_spin_while_equal(_Atomic uint32_t *word, uint32_t old, uint64_t spin_ns);

/* Sleeps while *word == old, at most timeout_ns (0: no limit).  Returns
 * false on timeout.  Spurious returns are possible: re-check the word. */
bool apir_futex_wait(_Atomic uint32_t *word, uint32_t old, uint64_t timeout_ns);
void apir_futex_wake(_Atomic uint32_t *word);
/* Wakes every sleeper on word (several threads wait for one event). */
void apir_futex_wake_all(_Atomic uint32_t *word);

#endif
