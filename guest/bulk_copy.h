/*
 * Large copies between the program's memory and the data area, spread over
 * a few threads.
 *
 * A tensor read back from a GPU host through shared memory costs the host's
 * DMA into the (page-locked) data area plus this side's copy out of it, one
 * after the other; the DMA runs at PCIe speed, the copy at one core's memcpy
 * speed, which is below what the CUDA driver reaches natively into pageable
 * memory (H200 machine: memcpy 8.7-9.1 GB/s, native download 10.5-10.8
 * GB/s, apir 6.3 GB/s).  Several cores copying disjoint parts move the bytes
 * at memory bandwidth instead.
 *
 * The threads are made once per process, on the first large copy, and
 * sleep between copies; a copy below APIR_BULK_MIN bytes, or one made while
 * another thread's bulk copy runs, is a plain memcpy.  APIR_COPY_THREADS
 * sets how many threads copy (the caller included; 1: never spread);
 * default: a quarter of the cores, at most 4, so a small machine (where
 * the host computes on the same cores) copies as before.
 */
#ifndef APIR_BULK_COPY_H
#define APIR_BULK_COPY_H

#include <stddef.h>

/* Below this a copy is not worth a wake-up of other threads (~50 us). */
#define APIR_BULK_MIN ((size_t)4 << 20)

/* memcpy(dst, src, n), non-overlapping; always completes (spread over the
 * pool's threads when it is large and they are free). */
void apir_bulk_copy(void *dst, const void *src, size_t n);

#endif
