/*
 * Unit tests of the per-session handle table (host/core/handles.c).
 *
 * The table is what stands between a guest's 64-bit numbers and host
 * objects, so the tests are about refusals: a wrong kind, a freed or reused
 * slot, another session's handle, 0, forged values, and a full table must
 * all fail, while live handles keep resolving to their own objects through
 * long alloc/free churn.
 */
#include "handles.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>

static int objs[64];

static void test_new_get_free(void)
{
    struct apir_handle_table t;
    CHECK(apir_handles_init(&t, 8));
    uint64_t a = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[0], 11);
    uint64_t b = apir_handle_new(&t, APIR_HANDLE_BUFT, &objs[1], 22);
    CHECK(a != 0 && b != 0 && a != b);
    CHECK(t.used == 2);

    struct apir_handle_slot *sa = apir_handle_get(&t, a, APIR_HANDLE_BUFFER);
    struct apir_handle_slot *sb = apir_handle_get(&t, b, APIR_HANDLE_BUFT);
    CHECK(sa && sa->object == &objs[0] && sa->aux == 11);
    CHECK(sb && sb->object == &objs[1] && sb->aux == 22);
    CHECK(sa != sb);
    CHECK(apir_handle_slot_index(&t, sa) != apir_handle_slot_index(&t, sb));
    CHECK(apir_handle_slot_index(&t, sa) < t.capacity);

    apir_handle_free(&t, a);
    CHECK(t.used == 1);
    CHECK(apir_handle_get(&t, a, APIR_HANDLE_BUFFER) == NULL);
    /* Freeing one leaves the other alone. */
    sb = apir_handle_get(&t, b, APIR_HANDLE_BUFT);
    CHECK(sb && sb->object == &objs[1]);
    /* Double free is a no-op. */
    apir_handle_free(&t, a);
    CHECK(t.used == 1);
    apir_handle_free(&t, b);
    CHECK(t.used == 0);
    CHECK(apir_handle_get(&t, b, APIR_HANDLE_BUFT) == NULL);
    apir_handles_destroy(&t);
}

static void test_wrong_kind(void)
{
    struct apir_handle_table t;
    apir_handles_init(&t, 8);
    uint64_t buf = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[0], 0);
    uint64_t buft = apir_handle_new(&t, APIR_HANDLE_BUFT, &objs[1], 0);
    CHECK(apir_handle_get(&t, buf, APIR_HANDLE_BUFT) == NULL);
    CHECK(apir_handle_get(&t, buft, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t, buf, APIR_HANDLE_NONE) == NULL);
    CHECK(apir_handle_get(&t, buft, APIR_HANDLE_NONE) == NULL);
    /* The kind lives in the handle's top byte: rewriting it to the other
     * kind must not turn a buffer type into a buffer (the slot says which). */
    uint64_t forged = (buft & ~(0xffull << 56)) | ((uint64_t)APIR_HANDLE_BUFFER << 56);
    CHECK(apir_handle_get(&t, forged, APIR_HANDLE_BUFFER) == NULL);
    forged = (buf & ~(0xffull << 56)) | ((uint64_t)APIR_HANDLE_BUFT << 56);
    CHECK(apir_handle_get(&t, forged, APIR_HANDLE_BUFT) == NULL);
    /* Freeing through a forged kind frees nothing. */
    apir_handle_free(&t, forged);
    CHECK(t.used == 2);
    CHECK(apir_handle_get(&t, buf, APIR_HANDLE_BUFFER) != NULL);
    apir_handles_destroy(&t);
}

static void test_stale_after_reuse(void)
{
    /* Limit 1: the freed slot is necessarily the one reused. */
    struct apir_handle_table t;
    apir_handles_init(&t, 1);
    uint64_t h1 = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[0], 0);
    CHECK(h1 != 0);
    struct apir_handle_slot *s1 = apir_handle_get(&t, h1, APIR_HANDLE_BUFFER);
    uint32_t idx = s1 ? apir_handle_slot_index(&t, s1) : UINT32_MAX;
    apir_handle_free(&t, h1);
    uint64_t h2 = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[1], 0);
    CHECK(h2 != 0 && h2 != h1);
    struct apir_handle_slot *s2 = apir_handle_get(&t, h2, APIR_HANDLE_BUFFER);
    CHECK(s2 && s2->object == &objs[1]);
    CHECK(s2 && apir_handle_slot_index(&t, s2) == idx);
    /* The stale handle names the same slot but must not reach its new
     * object, nor free it. */
    CHECK(apir_handle_get(&t, h1, APIR_HANDLE_BUFFER) == NULL);
    apir_handle_free(&t, h1);
    CHECK(t.used == 1);
    CHECK(apir_handle_get(&t, h2, APIR_HANDLE_BUFFER) != NULL);

    /* The same slot reused by the other kind. */
    apir_handle_free(&t, h2);
    uint64_t h3 = apir_handle_new(&t, APIR_HANDLE_BUFT, &objs[2], 0);
    CHECK(h3 != 0);
    CHECK(apir_handle_get(&t, h2, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t, h2, APIR_HANDLE_BUFT) == NULL);
    CHECK(apir_handle_get(&t, h3, APIR_HANDLE_BUFT) != NULL);
    apir_handles_destroy(&t);
}

static void test_other_table(void)
{
    /* Two sessions: same slot, kind and generation, different salts. */
    struct apir_handle_table t1, t2;
    apir_handles_init(&t1, 8);
    apir_handles_init(&t2, 8);
    uint64_t h1 = apir_handle_new(&t1, APIR_HANDLE_BUFFER, &objs[0], 0);
    uint64_t h2 = apir_handle_new(&t2, APIR_HANDLE_BUFFER, &objs[1], 0);
    CHECK(h1 != h2);  /* fails only if the 56-bit salts collide */
    CHECK(apir_handle_get(&t1, h2, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t2, h1, APIR_HANDLE_BUFFER) == NULL);
    apir_handle_free(&t1, h2);
    CHECK(t1.used == 1 && apir_handle_get(&t1, h1, APIR_HANDLE_BUFFER) != NULL);
    /* Fill both: no handle of one ever resolves in the other. */
    uint64_t a[8], b[8];
    int na = 1, nb = 1;
    a[0] = h1;
    b[0] = h2;
    while (na < 8 && (a[na] = apir_handle_new(&t1, APIR_HANDLE_BUFFER, &objs[na], 0)) != 0)
        na++;
    while (nb < 8 && (b[nb] = apir_handle_new(&t2, APIR_HANDLE_BUFFER, &objs[nb], 0)) != 0)
        nb++;
    CHECK(na == 8 && nb == 8);
    int crossed = 0;
    for (int i = 0; i < na; i++)
        crossed += apir_handle_get(&t2, a[i], APIR_HANDLE_BUFFER) != NULL;
    for (int i = 0; i < nb; i++)
        crossed += apir_handle_get(&t1, b[i], APIR_HANDLE_BUFFER) != NULL;
    CHECK(crossed == 0);
    apir_handles_destroy(&t1);
    apir_handles_destroy(&t2);
}

static void test_zero_never_valid(void)
{
    struct apir_handle_table t;
    apir_handles_init(&t, 64);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_BUFT) == NULL);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_NONE) == NULL);
    int zero_handles = 0;
    for (int i = 0; i < 64; i++)
        zero_handles += apir_handle_new(&t, i % 2 ? APIR_HANDLE_BUFFER : APIR_HANDLE_BUFT, &objs[i], 0) == 0;
    CHECK(zero_handles == 0);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_BUFT) == NULL);
    CHECK(apir_handle_get(&t, 0, APIR_HANDLE_NONE) == NULL);
    apir_handle_free(&t, 0);
    CHECK(t.used == 64);
    /* Values a guest might try: all-ones, the bare salt, raw slot numbers. */
    CHECK(apir_handle_get(&t, UINT64_MAX, APIR_HANDLE_BUFFER) == NULL);
    CHECK(apir_handle_get(&t, t.salt, APIR_HANDLE_BUFFER) == NULL);
    for (uint64_t i = 0; i < 64; i++) {
        CHECK(apir_handle_get(&t, i, APIR_HANDLE_BUFFER) == NULL);
        CHECK(apir_handle_get(&t, ((uint64_t)APIR_HANDLE_BUFFER << 56) | i, APIR_HANDLE_BUFFER) == NULL ||
              t.salt == 0);
    }
    apir_handles_destroy(&t);
}

static void test_limit(void)
{
    struct apir_handle_table t;
    apir_handles_init(&t, 5);
    uint64_t h[6];
    for (int i = 0; i < 5; i++) {
        h[i] = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[i], 0);
        CHECK(h[i] != 0);
    }
    CHECK(t.used == 5 && t.capacity <= 5);
    /* Full: 0, and the table is unchanged. */
    CHECK(apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[5], 0) == 0);
    CHECK(apir_handle_new(&t, APIR_HANDLE_BUFT, &objs[5], 0) == 0);
    CHECK(t.used == 5);
    for (int i = 0; i < 5; i++) {
        struct apir_handle_slot *s = apir_handle_get(&t, h[i], APIR_HANDLE_BUFFER);
        CHECK(s && s->object == &objs[i]);
    }
    /* Room again after a free. */
    apir_handle_free(&t, h[2]);
    h[5] = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[5], 0);
    CHECK(h[5] != 0);
    CHECK(apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[5], 0) == 0);
    apir_handles_destroy(&t);

    /* A limit of 0 is taken as 1 (handles.c): one handle, then full. */
    apir_handles_init(&t, 0);
    CHECK(apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[0], 0) != 0);
    CHECK(apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[1], 0) == 0);
    apir_handles_destroy(&t);
}

/* xorshift64: deterministic churn. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void test_churn(void)
{
    enum { LIMIT = 40, ROUNDS = 200000, DEAD_KEEP = 256 };
    struct apir_handle_table t;
    apir_handles_init(&t, LIMIT);
    uint64_t live[LIMIT];
    int live_obj[LIMIT];
    uint32_t n_live = 0;
    uint64_t dead[DEAD_KEEP] = { 0 };
    uint32_t n_dead = 0;
    unsigned bad_live = 0, bad_dead = 0, bad_new = 0, full_refused = 0;

    for (int r = 0; r < ROUNDS; r++) {
        bool do_alloc = n_live == 0 || (n_live < LIMIT + 2 && (rnd() & 1));
        if (do_alloc) {
            int o = (int)(rnd() % 64);
            uint64_t h = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[o], (uint64_t)r);
            if (n_live == LIMIT) {
                full_refused += h == 0;
                if (h != 0)
                    bad_new++;
                continue;
            }
            if (h == 0) {
                bad_new++;
                continue;
            }
            live[n_live] = h;
            live_obj[n_live] = o;
            n_live++;
        } else {
            uint32_t k = (uint32_t)(rnd() % n_live);
            apir_handle_free(&t, live[k]);
            dead[n_dead++ % DEAD_KEEP] = live[k];
            live[k] = live[n_live - 1];
            live_obj[k] = live_obj[n_live - 1];
            n_live--;
        }
        if (t.used != n_live)
            bad_new++;
        /* Every so often: every live handle resolves to its object, every
         * recently freed one resolves to nothing. */
        if (r % 97 == 0) {
            for (uint32_t i = 0; i < n_live; i++) {
                struct apir_handle_slot *s = apir_handle_get(&t, live[i], APIR_HANDLE_BUFFER);
                if (!s || s->object != &objs[live_obj[i]])
                    bad_live++;
            }
            for (uint32_t i = 0; i < DEAD_KEEP && i < n_dead; i++)
                if (apir_handle_get(&t, dead[i], APIR_HANDLE_BUFFER))
                    bad_dead++;
        }
    }
    CHECK(bad_live == 0);
    CHECK(bad_dead == 0);
    CHECK(bad_new == 0);
    CHECK(full_refused > 0);
    CHECK(t.capacity <= LIMIT);

    /* Random 64-bit values against a populated table: none resolves. */
    unsigned forged_ok = 0;
    for (int i = 0; i < 1000000; i++) {
        uint64_t v = rnd();
        forged_ok += apir_handle_get(&t, v, APIR_HANDLE_BUFFER) != NULL;
        forged_ok += apir_handle_get(&t, v, APIR_HANDLE_BUFT) != NULL;
    }
    CHECK(forged_ok == 0);
    apir_handles_destroy(&t);
}

/*
 * The generation is 24 bits: a stale handle stays invalid for 2^24 - 1
 * reuses of its slot.  (At 2^24 it would match again; that is the guest
 * confusing its own, same-session objects, never another session's.)
 */
static void test_generation_span(void)
{
    struct apir_handle_table t;
    apir_handles_init(&t, 1);
    uint64_t first = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[0], 0);
    apir_handle_free(&t, first);
    unsigned resurrected = 0;
    for (uint32_t i = 1; i < (1u << 24); i++) {
        uint64_t h = apir_handle_new(&t, APIR_HANDLE_BUFFER, &objs[1], 0);
        if (h == 0 || h == first || apir_handle_get(&t, first, APIR_HANDLE_BUFFER))
            resurrected++;
        apir_handle_free(&t, h);
    }
    CHECK(resurrected == 0);
    apir_handles_destroy(&t);
}

TEST_MAIN("handles",
          TEST(test_new_get_free),
          TEST(test_wrong_kind),
          TEST(test_stale_after_reuse),
          TEST(test_other_table),
          TEST(test_zero_never_valid),
          TEST(test_limit),
          TEST(test_churn),
          TEST(test_generation_span))
