/*
 * Page-locking shared memory for a discrete GPU's copy engines (pin.c).
 */
#ifndef APIR_PIN_H
#define APIR_PIN_H

#include <stdbool.h>
#include <stddef.h>

/* Page-locks [ptr, ptr+size) for the GPU runtime loaded in this process.
 * False when there is none or it refuses: copies then stay pageable. */
bool apir_pin(void *ptr, size_t size);
void apir_unpin(void *ptr);

#endif
