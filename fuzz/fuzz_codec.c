/*
 * fuzz_codec: arbitrary bytes through every decoder the host and guest use.
 *
 * The input is decoded with the request and the reply signature of every
 * row of apir_command_table, letter by letter with the codec's primitives
 * (what virgl's own walk does), and with the item decoders directly.
 * libFuzzer hands us an exact-size heap copy, so ASan reports any read past
 * the end.  Oracles:
 *   - a successful decode consumed exactly the bytes its items occupy, and
 *     re-encoding the values gives a message of that size that decodes to
 *     the same values;
 *   - decoded strings are NUL-terminated within their cap, lists within
 *     their max and inside the input;
 *   - after a failure every later item is zero;
 *   - the typed messages of apir_messages.h agree with the letters: each
 *     reply's apir_decode_reply_<NAME> gives the same verdict, the same
 *     values and consumes the same bytes as the walk, and the typed
 *     encoders (apir_encode_request_<NAME>, apir_encode_reply_<NAME>) write
 *     the walk's re-encoding byte for byte.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_messages.h"
#include "apir_proto.h"
#include "fuzz_common.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 8
#define LIST_MAX  APIR_MAX_LIST_TENSORS  /* what the host and the typed decoders pass */

struct item {
    uint32_t u;
    uint64_t q;
    bool b;
    uint8_t c;
    char s[APIR_MAX_STRING];
    struct apir_tensor_rec t;
    struct apir_tensor_list list;
    struct apir_digest d;
};

static struct item items[MAX_ITEMS], again[MAX_ITEMS];

/* ---- the letter walk --------------------------------------------------------- */

static void decode_item(struct apir_decoder *dec, char letter, struct item *it, size_t cap)
{
    switch (letter) {
    case 'u': case 'e': case 'r': case 'i': it->u = apir_decode_u32(dec); break;
    case 'b': it->b = apir_decode_bool(dec); break;
    case 'c': it->c = apir_decode_u8(dec); break;
    case 'q': case 'h': it->q = apir_decode_u64(dec); break;
    case 's': apir_decode_string(dec, it->s, cap); break;
    case 't': apir_decode_tensor(dec, &it->t); break;
    case 'L': apir_decode_tensor_list(dec, &it->list, LIST_MAX); break;
    case 'd': apir_decode_digest(dec, &it->d); break;
    default: apir_decoder_set_fatal(dec); break;
    }
}

/* Records of list item p, copied out of the input (they are in place). */
static struct apir_tensor_rec list_copies[MAX_ITEMS][LIST_MAX];

static const struct apir_tensor_rec *copy_list(const struct item *it, size_t p)
{
    for (uint32_t i = 0; i < it->list.count; i++)
        apir_tensor_list_get(&it->list, i, &list_copies[p][i]);
    return list_copies[p];
}

static void encode_item(struct apir_encoder *enc, char letter, const struct item *it, size_t p)
{
    switch (letter) {
    case 'u': case 'e': case 'r': case 'i': apir_encode_u32(enc, it->u); break;
    case 'b': apir_encode_bool(enc, it->b); break;
    case 'c': apir_encode_u8(enc, it->c); break;
    case 'q': case 'h': apir_encode_u64(enc, it->q); break;
    case 's': apir_encode_string(enc, it->s); break;
    case 't': apir_encode_tensor(enc, &it->t); break;
    case 'L': apir_encode_tensor_list(enc, it->list.count, copy_list(it, p)); break;
    case 'd': apir_encode_digest(enc, &it->d); break;
    default: enc->fatal = true; break;
    }
}

/* ---- the typed messages, per command (fuzz_common.h) ------------------------------ */

/* Item p of the walk as the typed encoders take it. */
static inline uint32_t fz_in_u32(const struct item *it, size_t p) { return it[p].u; }
static inline int32_t fz_in_i32(const struct item *it, size_t p) { return (int32_t)it[p].u; }
static inline uint32_t fz_in_enum(const struct item *it, size_t p) { return it[p].u; }
static inline uint32_t fz_in_res(const struct item *it, size_t p) { return it[p].u; }
static inline bool fz_in_bool(const struct item *it, size_t p) { return it[p].b; }
static inline uint8_t fz_in_u8(const struct item *it, size_t p) { return it[p].c; }
static inline uint64_t fz_in_u64(const struct item *it, size_t p) { return it[p].q; }
static inline uint64_t fz_in_buffer(const struct item *it, size_t p) { return it[p].q; }
static inline uint64_t fz_in_buft(const struct item *it, size_t p) { return it[p].q; }
static inline const char *fz_in_string(const struct item *it, size_t p) { return it[p].s; }
static inline const struct apir_tensor_rec *fz_in_tensor(const struct item *it, size_t p) { return &it[p].t; }
static inline const struct apir_digest *fz_in_digest(const struct item *it, size_t p) { return &it[p].d; }
static inline struct apir_tensor_span fz_in_tensors(const struct item *it, size_t p)
{
    return (struct apir_tensor_span){ it[p].list.count, copy_list(&it[p], p) };
}
/* Rows with an inline tensor are not walked (see fuzz_signature). */
static inline struct apir_bytes fz_in_inline(const struct item *it, size_t p)
{
    (void)it;
    (void)p;
    return (struct apir_bytes){ NULL, 0 };
}

FZ_DEFINE_TYPED_ENCODE(typed_encode, struct item)

/* A typed reply item against item p of the walk. */
struct typed_cmp {
    const struct item *walk;
    bool same;
};
#define SAME(cmp, cond) ((cmp)->same = (cmp)->same && (cond))
/* One per kind, used or not: no reply holds a res, a u8 or a tensor today. */
#define SEEN_FN static inline __attribute__((unused)) void
SEEN_FN fz_seen_u32(struct typed_cmp *c, size_t p, const uint32_t *o) { SAME(c, *o == c->walk[p].u); }
SEEN_FN fz_seen_i32(struct typed_cmp *c, size_t p, const int32_t *o) { SAME(c, *o == (int32_t)c->walk[p].u); }
SEEN_FN fz_seen_enum(struct typed_cmp *c, size_t p, const uint32_t *o) { SAME(c, *o == c->walk[p].u); }
SEEN_FN fz_seen_res(struct typed_cmp *c, size_t p, const uint32_t *o) { SAME(c, *o == c->walk[p].u); }
SEEN_FN fz_seen_bool(struct typed_cmp *c, size_t p, const bool *o) { SAME(c, *o == c->walk[p].b); }
SEEN_FN fz_seen_u8(struct typed_cmp *c, size_t p, const uint8_t *o) { SAME(c, *o == c->walk[p].c); }
SEEN_FN fz_seen_u64(struct typed_cmp *c, size_t p, const uint64_t *o) { SAME(c, *o == c->walk[p].q); }
SEEN_FN fz_seen_buffer(struct typed_cmp *c, size_t p, const uint64_t *o) { SAME(c, *o == c->walk[p].q); }
SEEN_FN fz_seen_buft(struct typed_cmp *c, size_t p, const uint64_t *o) { SAME(c, *o == c->walk[p].q); }
SEEN_FN fz_seen_string(struct typed_cmp *c, size_t p, const struct apir_string *o)
{
    SAME(c, strcmp(o->s, c->walk[p].s) == 0);
}
SEEN_FN fz_seen_tensor(struct typed_cmp *c, size_t p, const struct apir_tensor_rec *o)
{
    SAME(c, memcmp(o, &c->walk[p].t, sizeof(*o)) == 0);
}
SEEN_FN fz_seen_digest(struct typed_cmp *c, size_t p, const struct apir_digest *o)
{
    SAME(c, memcmp(o, &c->walk[p].d, sizeof(*o)) == 0);
}
SEEN_FN fz_seen_tensors(struct typed_cmp *c, size_t p, const struct apir_tensor_list *o)
{
    SAME(c, o->count == c->walk[p].list.count && o->records == c->walk[p].list.records);
}

FZ_DEFINE_TYPED_DECODE_REPLY(typed_decode_reply, struct typed_cmp)

/* Decodes the input as cmd's reply with its typed decoder: the verdict, the
 * bytes consumed and the values must be the walk's. */
static void check_typed_reply(const char *name, uint32_t cmd, const uint8_t *data, size_t size, bool fatal,
                              size_t used)
{
    struct apir_decoder dec;
    apir_decoder_init(&dec, data, size);
    struct typed_cmp cmp = { items, true };
    bool ok = typed_decode_reply(&cmp, cmd, &dec);
    FZ_ASSERT(ok == !fatal && ok == !dec.fatal, "%s: typed reply decoder says %d, the walk %d", name, ok, !fatal);
    FZ_ASSERT(apir_decoder_used(&dec) == used, "%s: typed reply decoder consumed %zu bytes, the walk %zu", name,
              apir_decoder_used(&dec), used);
    FZ_ASSERT(cmp.same, "%s: typed reply decoder and the walk decode different values", name);
}

/* ---- oracles --------------------------------------------------------------- */

static size_t item_size(char letter, const struct item *it)
{
    switch (letter) {
    case 's': return 8 + apir_pad4(strlen(it->s) + 1);
    case 't': return APIR_TENSOR_REC_SIZE;
    case 'L': return 4 + (size_t)it->list.count * APIR_TENSOR_REC_SIZE;
    case 'd': return APIR_DIGEST_SIZE;
    case 'q': case 'h': return 8;
    default: return 4;
    }
}

static bool item_is_zero(char letter, const struct item *it)
{
    switch (letter) {
    case 'u': case 'e': case 'r': case 'i': return it->u == 0;
    case 'b': return !it->b;
    case 'c': return it->c == 0;
    case 'q': case 'h': return it->q == 0;
    case 's': return it->s[0] == '\0';
    case 't': {
        static const struct apir_tensor_rec zero;
        return memcmp(&it->t, &zero, sizeof(zero)) == 0;
    }
    case 'L': return it->list.count == 0 && it->list.records == NULL;
    case 'd': {
        static const struct apir_digest zero;
        return memcmp(&it->d, &zero, sizeof(zero)) == 0;
    }
    }
    return true;
}

static bool item_equal(char letter, const struct item *a, const struct item *b)
{
    switch (letter) {
    case 'u': case 'e': case 'r': case 'i': return a->u == b->u;
    case 'b': return a->b == b->b;
    case 'c': return a->c == b->c;
    case 'q': case 'h': return a->q == b->q;
    case 's': return strcmp(a->s, b->s) == 0;
    case 't': return memcmp(&a->t, &b->t, sizeof(a->t)) == 0;
    case 'd': return memcmp(&a->d, &b->d, sizeof(a->d)) == 0;
    case 'L':
        if (a->list.count != b->list.count)
            return false;
        for (uint32_t i = 0; i < a->list.count; i++) {
            struct apir_tensor_rec ra, rb;
            apir_tensor_list_get(&a->list, i, &ra);
            apir_tensor_list_get(&b->list, i, &rb);
            if (memcmp(&ra, &rb, sizeof(ra)) != 0)
                return false;
        }
        return true;
    }
    return true;
}

/* The input as cmd's request or reply (sig), strings decoded into cap. */
static void fuzz_signature(const char *name, uint32_t cmd, bool reply, const char *sig, const uint8_t *data,
                           size_t size, size_t cap)
{
    size_t n_items = 0;
    while (sig[n_items] && sig[n_items] != 'T' && n_items < MAX_ITEMS)
        n_items++;  /* 'T' is not decodable by signature: stop before it */
    /* Whether the walk covers the whole message (the typed side does). */
    bool whole = sig[n_items] == '\0';

    struct apir_decoder dec;
    apir_decoder_init(&dec, data, size);
    size_t failed_at = n_items;
    size_t consumed[MAX_ITEMS];
    for (size_t i = 0; i < n_items; i++) {
        memset(&items[i], 0xee, sizeof(items[i]));
        size_t before = apir_decoder_used(&dec);
        decode_item(&dec, sig[i], &items[i], cap);
        consumed[i] = apir_decoder_used(&dec) - before;
        if (dec.fatal && failed_at == n_items)
            failed_at = i;
    }
    if (reply && whole && cap == APIR_MAX_STRING)
        check_typed_reply(name, cmd, data, size, dec.fatal, apir_decoder_used(&dec));
    /* Items after the first failure read as zero. */
    for (size_t i = failed_at + 1; i < n_items; i++)
        FZ_ASSERT(item_is_zero(sig[i], &items[i]), "%s '%s': item %zu not zero after a failure", name, sig, i);
    if (dec.fatal) {
        FZ_ASSERT(item_is_zero(sig[failed_at], &items[failed_at]), "%s '%s': failing item %zu not zero", name,
                  sig, failed_at);
        return;
    }

    /* Each item took its wire size: fixed, or for a string 8 + its padded
     * length (the string may hold NULs before the last byte, which ends
     * it early on the host: still at least strlen + 1), for a list its
     * records. */
    size_t expect = 0;
    for (size_t i = 0; i < n_items; i++) {
        const struct item *it = &items[i];
        size_t canon = item_size(sig[i], it);
        if (sig[i] == 's') {
            FZ_ASSERT(memchr(it->s, '\0', cap) != NULL, "%s: string not terminated within its cap", name);
            size_t limit = cap < APIR_MAX_STRING ? cap : APIR_MAX_STRING;
            FZ_ASSERT(consumed[i] % 4 == 0 && consumed[i] >= canon && consumed[i] <= 8 + apir_pad4(limit),
                      "%s: string item took %zu bytes (strlen %zu, cap %zu)", name, consumed[i], strlen(it->s),
                      cap);
        } else {
            FZ_ASSERT(consumed[i] == canon, "%s '%s': item %zu ('%c') took %zu bytes, wire size %zu", name, sig,
                      i, sig[i], consumed[i], canon);
        }
        if (sig[i] == 'L') {
            FZ_ASSERT(it->list.count >= 1 && it->list.count <= LIST_MAX, "%s: list count %u", name,
                      it->list.count);
            FZ_ASSERT(it->list.records >= data &&
                          (size_t)(it->list.records - data) + (size_t)it->list.count * APIR_TENSOR_REC_SIZE <= size,
                      "%s: list records outside the input", name);
        }
        expect += canon;
    }

    /* Re-encode and decode again: same size, same values. */
    static uint8_t buf[APIR_MAX_COMMAND_SIZE];
    struct apir_encoder enc;
    apir_encoder_init(&enc, buf, sizeof(buf));
    for (size_t i = 0; i < n_items; i++)
        encode_item(&enc, sig[i], &items[i], i);
    if (enc.fatal)
        return;  /* bigger than any command: nothing to compare */
    FZ_ASSERT(apir_encoder_used(&enc) == expect, "%s '%s': re-encoded %zu bytes, items occupy %zu", name, sig,
              apir_encoder_used(&enc), expect);
    if (whole) {
        static uint8_t typed_buf[APIR_MAX_COMMAND_SIZE];
        struct apir_encoder typed_enc;
        apir_encoder_init(&typed_enc, typed_buf, sizeof(typed_buf));
        typed_encode(items, cmd, reply, &typed_enc);
        FZ_ASSERT(!typed_enc.fatal && apir_encoder_used(&typed_enc) == expect && memcmp(typed_buf, buf, expect) == 0,
                  "%s: the typed %s encoder does not write what '%s' says", name, reply ? "reply" : "request", sig);
    }
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    for (size_t i = 0; i < n_items; i++)
        decode_item(&dec, sig[i], &again[i], cap);
    FZ_ASSERT(!dec.fatal && apir_decoder_left(&dec) == 0, "%s '%s': re-encoded message does not decode", name,
              sig);
    for (size_t i = 0; i < n_items; i++)
        FZ_ASSERT(item_equal(sig[i], &items[i], &again[i]), "%s '%s': item %zu changed in a round trip", name, sig,
                  i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Two string caps: the host's own (APIR_MAX_STRING) and a small one
     * where "longer than cap" is reachable. */
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        const struct apir_command_info *c = &apir_command_table[cmd];
        if (!c->name)
            continue;
        fuzz_signature(c->name, cmd, false, c->request, data, size, APIR_MAX_STRING);
        fuzz_signature(c->name, cmd, true, c->reply, data, size, APIR_MAX_STRING);
        if (strchr(c->reply, 's'))
            fuzz_signature(c->name, cmd, true, c->reply, data, size, 16);
    }

    /* The item decoders directly, with a cap/max taken from the input. */
    struct apir_decoder dec;
    static char str[APIR_MAX_STRING + 16];
    size_t cap = size ? (size_t)data[0] * 17 % (sizeof(str) + 1) : 0;
    apir_decoder_init(&dec, data, size);
    memset(str, 'x', sizeof(str));
    apir_decode_string(&dec, str, cap);
    if (cap)
        FZ_ASSERT(memchr(str, '\0', cap) != NULL, "string not terminated within cap %zu", cap);
    if (dec.fatal && cap)
        FZ_ASSERT(str[0] == '\0', "refused string left non-empty");

    uint32_t max = size > 1 ? data[1] : 1;
    struct apir_tensor_list list;
    apir_decoder_init(&dec, data, size);
    apir_decode_tensor_list(&dec, &list, max);
    if (!dec.fatal) {
        FZ_ASSERT(list.count >= 1 && list.count <= max, "list count %u, max %u", list.count, max);
        FZ_ASSERT(apir_decoder_used(&dec) == 4 + (size_t)list.count * APIR_TENSOR_REC_SIZE, "list size");
        struct apir_tensor_rec rec;
        for (uint32_t i = 0; i < list.count; i++)
            apir_tensor_list_get(&list, i, &rec);
    } else {
        FZ_ASSERT(list.count == 0 && list.records == NULL, "refused list not empty");
    }

    /* A message as the transports see it: header, then items. */
    struct apir_cmd_header hdr;
    apir_decoder_init(&dec, data, size);
    apir_decode_header(&dec, &hdr);
    if (!dec.fatal && hdr.cmd_type == APIR_CMD_TYPE_FORWARD && (uint32_t)hdr.cmd_flags < APIR_CMD_COUNT) {
        const struct apir_command_info *c = &apir_command_table[hdr.cmd_flags];
        fuzz_signature(c->name, (uint32_t)hdr.cmd_flags, false, c->request, dec.cur, apir_decoder_left(&dec),
                       APIR_MAX_STRING);
    }
    return 0;
}
