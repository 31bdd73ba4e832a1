/*
 * fuzz_codec: arbitrary bytes through every decoder the host and guest use.
 *
 * The input is decoded with the request and the reply signature of every
 * row of apir_command_table (letter by letter, which is what apir_demarshal
 * does), and with the item decoders directly.  libFuzzer hands us an
 * exact-size heap copy, so ASan reports any read past the end.  Oracles:
 *   - a successful decode consumed exactly the bytes its items occupy, and
 *     re-encoding the values gives a message of that size that decodes to
 *     the same values;
 *   - decoded strings are NUL-terminated within their cap, lists within
 *     their max and inside the input;
 *   - after a failure every later item is zero.
 */
#include "apir_codec.h"
#include "apir_commands.h"
#include "apir_proto.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_OR_DIE(cond, ...)                                                        \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "FUZZ ORACLE: %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#define MAX_ITEMS 8
#define LIST_MAX  (2 * (APIR_TENSOR_MAX_SRC + 1))  /* what the host passes */

struct item {
    uint32_t u;
    uint64_t q;
    bool b;
    uint8_t c;
    char s[APIR_MAX_STRING];
    struct apir_tensor_rec t;
    struct apir_tensor_list list;
};

static struct item items[MAX_ITEMS], again[MAX_ITEMS];

static void decode_item(struct apir_decoder *dec, char letter, struct item *it, size_t cap)
{
    const char sig[2] = { letter, '\0' };
    switch (letter) {
    case 'u': case 'e': case 'r': apir_demarshal(dec, sig, &it->u); break;
    case 'i': apir_demarshal(dec, sig, (int32_t *)&it->u); break;
    case 'b': apir_demarshal(dec, sig, &it->b); break;
    case 'c': apir_demarshal(dec, sig, &it->c); break;
    case 'q': case 'h': apir_demarshal(dec, sig, &it->q); break;
    case 's': apir_demarshal(dec, sig, it->s, cap); break;
    case 't': apir_demarshal(dec, sig, &it->t); break;
    case 'L': apir_demarshal(dec, sig, &it->list, (uint32_t)LIST_MAX); break;
    default: dec->fatal = true; break;
    }
}

static void encode_item(struct apir_encoder *enc, char letter, const struct item *it)
{
    const char sig[2] = { letter, '\0' };
    switch (letter) {
    case 'u': case 'e': case 'r': apir_marshal(enc, sig, it->u); break;
    case 'i': apir_marshal(enc, sig, (int32_t)it->u); break;
    case 'b': apir_marshal(enc, sig, (int)it->b); break;
    case 'c': apir_marshal(enc, sig, (unsigned)it->c); break;
    case 'q': case 'h': apir_marshal(enc, sig, it->q); break;
    case 's': apir_marshal(enc, sig, (const char *)it->s); break;
    case 't': apir_marshal(enc, sig, &it->t); break;
    case 'L': {
        /* Records are in place in the input: re-encode from copies. */
        static struct apir_tensor_rec recs[LIST_MAX];
        for (uint32_t i = 0; i < it->list.count; i++)
            apir_tensor_list_get(&it->list, i, &recs[i]);
        apir_marshal(enc, sig, it->list.count, (const struct apir_tensor_rec *)recs);
        break;
    }
    default: enc->fatal = true; break;
    }
}

static size_t item_size(char letter, const struct item *it)
{
    switch (letter) {
    case 's': return 8 + apir_pad4(strlen(it->s) + 1);
    case 't': return APIR_TENSOR_REC_SIZE;
    case 'L': return 4 + (size_t)it->list.count * APIR_TENSOR_REC_SIZE;
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

static void fuzz_signature(const char *name, const char *sig, const uint8_t *data, size_t size, size_t cap)
{
    size_t n_items = 0;
    while (sig[n_items] && sig[n_items] != 'T' && n_items < MAX_ITEMS)
        n_items++;  /* 'T' is not decodable by signature: stop before it */

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
    /* Items after the first failure read as zero. */
    for (size_t i = failed_at + 1; i < n_items; i++)
        CHECK_OR_DIE(item_is_zero(sig[i], &items[i]), "%s '%s': item %zu not zero after a failure", name, sig, i);
    if (dec.fatal) {
        CHECK_OR_DIE(item_is_zero(sig[failed_at], &items[failed_at]), "%s '%s': failing item %zu not zero", name,
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
            CHECK_OR_DIE(memchr(it->s, '\0', cap) != NULL, "%s: string not terminated within its cap", name);
            size_t limit = cap < APIR_MAX_STRING ? cap : APIR_MAX_STRING;
            CHECK_OR_DIE(consumed[i] % 4 == 0 && consumed[i] >= canon && consumed[i] <= 8 + apir_pad4(limit),
                         "%s: string item took %zu bytes (strlen %zu, cap %zu)", name, consumed[i], strlen(it->s),
                         cap);
        } else {
            CHECK_OR_DIE(consumed[i] == canon, "%s '%s': item %zu ('%c') took %zu bytes, wire size %zu", name, sig,
                         i, sig[i], consumed[i], canon);
        }
        if (sig[i] == 'L') {
            CHECK_OR_DIE(it->list.count >= 1 && it->list.count <= LIST_MAX, "%s: list count %u", name,
                         it->list.count);
            CHECK_OR_DIE(it->list.records >= data &&
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
        encode_item(&enc, sig[i], &items[i]);
    if (enc.fatal)
        return;  /* bigger than any command: nothing to compare */
    CHECK_OR_DIE(apir_encoder_used(&enc) == expect, "%s '%s': re-encoded %zu bytes, items occupy %zu", name, sig,
                 apir_encoder_used(&enc), expect);
    apir_decoder_init(&dec, buf, apir_encoder_used(&enc));
    for (size_t i = 0; i < n_items; i++)
        decode_item(&dec, sig[i], &again[i], cap);
    CHECK_OR_DIE(!dec.fatal && apir_decoder_left(&dec) == 0, "%s '%s': re-encoded message does not decode", name,
                 sig);
    for (size_t i = 0; i < n_items; i++)
        CHECK_OR_DIE(item_equal(sig[i], &items[i], &again[i]), "%s '%s': item %zu changed in a round trip", name, sig,
                     i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Two string caps: the host's own (APIR_MAX_STRING) and a small one
     * where "longer than cap" is reachable. */
    for (uint32_t cmd = 0; cmd < APIR_CMD_COUNT; cmd++) {
        const struct apir_command_info *c = &apir_command_table[cmd];
        if (!c->name)
            continue;
        fuzz_signature(c->name, c->request, data, size, APIR_MAX_STRING);
        fuzz_signature(c->name, c->reply, data, size, APIR_MAX_STRING);
        if (strchr(c->reply, 's'))
            fuzz_signature(c->name, c->reply, data, size, 16);
    }

    /* The item decoders directly, with a cap/max taken from the input. */
    struct apir_decoder dec;
    static char str[APIR_MAX_STRING + 16];
    size_t cap = size ? (size_t)data[0] * 17 % (sizeof(str) + 1) : 0;
    apir_decoder_init(&dec, data, size);
    memset(str, 'x', sizeof(str));
    apir_decode_string(&dec, str, cap);
    if (cap)
        CHECK_OR_DIE(memchr(str, '\0', cap) != NULL, "string not terminated within cap %zu", cap);
    if (dec.fatal && cap)
        CHECK_OR_DIE(str[0] == '\0', "refused string left non-empty");

    uint32_t max = size > 1 ? data[1] : 1;
    struct apir_tensor_list list;
    apir_decoder_init(&dec, data, size);
    apir_decode_tensor_list(&dec, &list, max);
    if (!dec.fatal) {
        CHECK_OR_DIE(list.count >= 1 && list.count <= max, "list count %u, max %u", list.count, max);
        CHECK_OR_DIE(apir_decoder_used(&dec) == 4 + (size_t)list.count * APIR_TENSOR_REC_SIZE, "list size");
        struct apir_tensor_rec rec;
        for (uint32_t i = 0; i < list.count; i++)
            apir_tensor_list_get(&list, i, &rec);
    } else {
        CHECK_OR_DIE(list.count == 0 && list.records == NULL, "refused list not empty");
    }

    /* A message as the transports see it: header, then items. */
    struct apir_cmd_header hdr;
    apir_decoder_init(&dec, data, size);
    apir_decode_header(&dec, &hdr);
    if (!dec.fatal && hdr.cmd_type == APIR_CMD_TYPE_FORWARD && (uint32_t)hdr.cmd_flags < APIR_CMD_COUNT) {
        const struct apir_command_info *c = &apir_command_table[hdr.cmd_flags];
        fuzz_signature(c->name, c->request, dec.cur, apir_decoder_left(&dec), APIR_MAX_STRING);
    }
    return 0;
}
