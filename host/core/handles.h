/*
 * Per-session handle table.
 *
 * The guest never sees a host pointer.  It gets a 64-bit handle that encodes
 * (kind, generation, slot) XORed with a per-session salt; the host turns it
 * back into an object only through this table.  A handle of the wrong kind,
 * an out-of-range slot, a freed slot (generation mismatch) or another
 * session's handle (different salt and table) all fail the lookup.
 */
#ifndef APIR_HANDLES_H
#define APIR_HANDLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum apir_handle_kind {
    APIR_HANDLE_NONE   = 0,
    APIR_HANDLE_BUFT   = 1,
    APIR_HANDLE_BUFFER = 2,
};

struct apir_handle_slot {
    uint32_t generation;   /* bumped on free: stale handles stop matching */
    uint8_t  kind;         /* APIR_HANDLE_NONE when free */
    void    *object;
    uint64_t aux;          /* kind-specific (device index of a buffer type) */
};

struct apir_handle_table {
    struct apir_handle_slot *slots;
    uint32_t capacity;     /* slots allocated */
    uint32_t limit;        /* most slots this table may ever hold */
    uint32_t used;
    uint32_t free_hint;
    uint64_t salt;
};

bool apir_handles_init(struct apir_handle_table *t, uint32_t limit);
void apir_handles_destroy(struct apir_handle_table *t);

/* Returns the new handle, or 0 when the table is full. */
uint64_t apir_handle_new(struct apir_handle_table *t, enum apir_handle_kind kind, void *object, uint64_t aux);
/* The slot of a live handle of that kind, or NULL. */
struct apir_handle_slot *apir_handle_get(const struct apir_handle_table *t, uint64_t handle, enum apir_handle_kind kind);
/* Slot index of a live handle (for opaque base addresses). */
uint32_t apir_handle_slot_index(const struct apir_handle_table *t, const struct apir_handle_slot *slot);
void apir_handle_free(struct apir_handle_table *t, uint64_t handle);

#endif
