#include "handles.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* handle = ((kind << 56) | (generation24 << 32) | slot) ^ salt, where the salt
 * has a zero top byte, so a valid handle is never 0. */
#define GEN_MASK 0xffffffu

bool apir_handles_init(struct apir_handle_table *t, uint32_t limit)
{
    memset(t, 0, sizeof(*t));
    t->limit = limit ? limit : 1;
    uint64_t salt = 0;
    if (getrandom(&salt, sizeof(salt), GRND_NONBLOCK) != (ssize_t)sizeof(salt)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        salt = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)t;
    }
    t->salt = salt & 0x00ffffffffffffffull;
    return true;
}

void apir_handles_destroy(struct apir_handle_table *t)
{
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

uint64_t apir_handle_new(struct apir_handle_table *t, enum apir_handle_kind kind, void *object, uint64_t aux)
{
    if (t->used >= t->limit)
        return 0;
    if (t->used == t->capacity) {
        uint32_t cap = t->capacity ? t->capacity * 2 : 16;
        if (cap > t->limit)
            cap = t->limit;
        struct apir_handle_slot *s = realloc(t->slots, (size_t)cap * sizeof(*s));
        if (!s)
            return 0;
        memset(s + t->capacity, 0, (size_t)(cap - t->capacity) * sizeof(*s));
        t->slots = s;
        t->free_hint = t->capacity;
        t->capacity = cap;
    }
    uint32_t i = t->free_hint;
    for (uint32_t n = 0; n < t->capacity; n++, i = (i + 1) % t->capacity) {
        if (t->slots[i].kind == APIR_HANDLE_NONE)
            break;
    }
    struct apir_handle_slot *slot = &t->slots[i];
    slot->kind = (uint8_t)kind;
    slot->object = object;
    slot->aux = aux;
    t->used++;
    t->free_hint = (i + 1) % t->capacity;
    uint64_t raw = ((uint64_t)kind << 56) | ((uint64_t)(slot->generation & GEN_MASK) << 32) | i;
    return raw ^ t->salt;
}

struct apir_handle_slot *apir_handle_get(const struct apir_handle_table *t, uint64_t handle, enum apir_handle_kind kind)
{
    uint64_t raw = handle ^ t->salt;
    uint32_t index = (uint32_t)raw;
    uint32_t gen = (uint32_t)(raw >> 32) & GEN_MASK;
    if ((raw >> 56) != (uint64_t)kind || kind == APIR_HANDLE_NONE || index >= t->capacity)
        return NULL;
    struct apir_handle_slot *slot = &t->slots[index];
    if (slot->kind != kind || (slot->generation & GEN_MASK) != gen)
        return NULL;
    return slot;
}

uint32_t apir_handle_slot_index(const struct apir_handle_table *t, const struct apir_handle_slot *slot)
{
    return (uint32_t)(slot - t->slots);
}

void apir_handle_free(struct apir_handle_table *t, uint64_t handle)
{
    uint64_t raw = handle ^ t->salt;
    struct apir_handle_slot *slot = apir_handle_get(t, handle, (enum apir_handle_kind)(raw >> 56));
    if (!slot)
        return;
    slot->kind = APIR_HANDLE_NONE;
    slot->object = NULL;
    slot->aux = 0;
    slot->generation++;
    t->used--;
}
